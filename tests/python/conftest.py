# SPDX-License-Identifier: MIT
"""pytest fixtures: a real devald on a private socket, and ranks as forked processes."""

import itertools
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

_names = itertools.count()


def devald_path():
    path = os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald"))
    if not os.access(path, os.X_OK):
        pytest.exit("devald not found at %s: build it first (meson) or set $DEVALD" % path, 2)
    return os.path.abspath(path)


_REAL = ("torch", "accelerate", "torchmetrics", "transformers", "torchdata", "datasets",
         "lightning", "evaluate")


def pytest_sessionstart(session):
    """Where DEVAL_WITH_TORCH=1 asks for the real packages (CI), their tests must run: a
    package that does not import stops the run instead of skipping its tests unseen."""
    if os.environ.get("DEVAL_WITH_TORCH") != "1":
        return
    # (in a process of its own: this one, which the ranks fork from, imports nothing early)
    r = subprocess.run([sys.executable, "-c", "import sys, importlib\n"
                        "for m in sys.argv[1:]: importlib.import_module(m)", *_REAL],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        pytest.exit("DEVAL_WITH_TORCH=1, but the packages it asks for do not all import, so "
                    "their tests would skip:\n%s" % r.stdout[-2000:], 2)


class Daemon:
    def __init__(self, args=(), env=None):
        self.dir = tempfile.mkdtemp(prefix="deval-py-")
        self.socket = os.path.join(self.dir, "devald.sock")
        self.proc = subprocess.Popen([devald_path(), "--socket", self.socket,
                                      "--log-level", "warn", *args],
                                     env=None if env is None else {**os.environ, **env})
        deadline = time.monotonic() + 5
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("devald did not start")
            time.sleep(0.01)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(5) == 0
            assert not os.path.exists(self.socket)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def own_daemon():
    """A devald of this test's own, for tests that kill it."""
    d = Daemon()
    yield d
    if d.proc.poll() is None:
        d.stop()
    shutil.rmtree(d.dir, ignore_errors=True)  # a killed devald leaves its socket


def _fresh_accelerate():
    """A forked rank starts with the parent's Accelerate state, a singleton: a test that made
    an Accelerator in the parent (one process) left it at one process, and every rank's
    Accelerator would take it. A rank forgets it, as a process of its own starts without."""
    st = sys.modules.get("accelerate.state")
    if st is not None:
        st.AcceleratorState._reset_state(True)
        st.GradientState._reset_state()


def _child(conn, fn, rank, world, args):
    try:
        _fresh_accelerate()
        conn.send(("ok", fn(rank, world, *args)))
    except BaseException as e:  # report everything, pytest's outcomes included
        conn.send(("error", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
    finally:
        conn.close()
        os._exit(0)


def run_ranks(world, fn, *args, timeout=60, allow_death=()):
    """Run fn(rank, world, *args) in world forked processes; return their results in rank
    order. A rank in allow_death may die without a result (None)."""
    ctx = multiprocessing.get_context("fork")
    procs = []
    for r in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child, fn, r, world, args), daemon=True)
        p.start()
        child.close()
        procs.append((p, parent))
    results, errors = [], []
    deadline = time.monotonic() + timeout
    for r, (p, conn) in enumerate(procs):
        left = max(0.0, deadline - time.monotonic())
        if conn.poll(left):
            try:
                kind, value = conn.recv()
            except EOFError:
                kind, value = "died", None
        else:
            kind, value = ("died", None) if not p.is_alive() else ("timeout", None)
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            kind = "timeout"
        if kind == "ok":
            results.append(value)
        elif kind == "died" and r in allow_death:
            results.append(None)
        else:
            errors.append("rank %d: %s %s" % (r, kind, value or ""))
            results.append(None)
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return results


def group_name(prefix):
    return "%s-%d-%d" % (prefix, os.getpid(), next(_names))


def devalds(socket):
    """pids of the devalds listening on socket."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"devald" and socket.encode() in argv:
            pids.append(int(p))
    return pids


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A private $XDG_RUNTIME_DIR; yields the socket path libdeval will use there."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.delenv("DEVAL_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    monkeypatch.setenv("DEVAL_IDLE_EXIT", "2")
    for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "DEVAL_LAUNCH_ID",
              "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    sock = str(d / "deval" / "devald.sock")
    yield sock
    for pid in devalds(sock):
        os.kill(pid, signal.SIGKILL)
