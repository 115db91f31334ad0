# SPDX-License-Identifier: MIT
"""Run a script on N local ranks, the way torchrun does: python -m deval.launch -n 4 script.py

A Python script runs under this interpreter; any other executable (a C rank: ./join_auto) runs
as it is.

Each copy gets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE, and DEVAL_LAUNCH_ID, which
names this run's group for deval.join() with no arguments. When one rank fails, the
others get a moment to notice through deval (they fail fast with PeerLost), then are
stopped; the exit status is the first failure's.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def command(program, args):
    """The command line of one rank: a .py file (or anything not executable) under this
    Python, an executable as it is."""
    if not program.endswith(".py") and os.path.isfile(program) and os.access(program, os.X_OK):
        return [program if os.sep in program else os.path.join(os.curdir, program)] + args
    return [sys.executable, program] + args


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m deval.launch", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--nproc", type=int, default=int(os.environ.get("WORLD_SIZE", 2)),
                   help="number of ranks (default: $WORLD_SIZE or 2)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.nproc < 1:
        p.error("--nproc must be at least 1")
    if not os.path.isfile(a.script):
        p.error("%s: no such file: give a Python script or an executable (a C rank built in "
                "the tree is build/example-gather, say)" % a.script)
    procs = []
    run = "%d-%d-%s" % (os.getpid(), time.time_ns(), os.urandom(4).hex())
    for r in range(a.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.nproc),
                   LOCAL_WORLD_SIZE=str(a.nproc), DEVAL_LAUNCH_ID=run)
        procs.append(subprocess.Popen(command(a.script, a.args), env=env))
    status = 0
    failed_at = None
    while any(q.poll() is None for q in procs):
        for q in procs:
            if q.returncode not in (None, 0) and failed_at is None:
                status, failed_at = q.returncode, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 5:
            for q in procs:
                if q.poll() is None:
                    q.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    for q in procs:
        if status == 0 and q.returncode:
            status = q.returncode
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
