# SPDX-License-Identifier: MIT
"""Run one of Accelerate's own distributed test scripts with deval.accelerate.enable() applied
to every Accelerator it creates: ``torchrun --nproc-per-node N accelerate_shim.py SCRIPT``.
Each new Accelerator takes over from the one before (disable(), then enable()), as a script
that builds one per case needs."""

import os
import runpy
import sys

import deval
import deval.accelerate
from accelerate import Accelerator

_init = Accelerator.__init__
ENABLED = []


def __init__(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if self.num_processes > 1:
        deval.accelerate.disable()
        deval.accelerate.enable(self)
        ENABLED.append(type(self).__name__)


Accelerator.__init__ = __init__

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    deval.accelerate.disable()
    if int(os.environ.get("RANK", "0")) == 0:
        print("deval shim: %d Accelerators enabled" % len(ENABLED), flush=True)
