# SPDX-License-Identifier: MIT
"""deval-ctl, as the Python package installs it: the deval-ctl program beside this file."""

import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    prog = os.path.join(here, "deval-ctl")
    if not os.access(prog, os.X_OK):
        sys.exit("deval-ctl: not installed beside the deval package at %s" % here)
    os.execv(prog, ["deval-ctl"] + sys.argv[1:])


if __name__ == "__main__":
    main()
