# SPDX-License-Identifier: MIT
"""The examples, run the way their headers say, and deval.launch's failure handling."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

PYTHON_DIR = os.path.join(ROOT, "python")


def launch(daemon, n, script, *args, timeout=120):
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket,
               PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DEVAL_RUN=str(os.getpid()) + os.path.basename(script))
    for k in ("RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "deval.launch", "-n", str(n), script] +
                          list(args), env=env, capture_output=True, text=True, timeout=timeout)


def test_accelerate_vs_deval(daemon):
    p = launch(daemon, 2, os.path.join(ROOT, "examples", "accelerate_vs_deval.py"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "50 predictions gathered for 50 samples" in p.stdout
    assert "same as one process: True" in p.stdout


def test_distributed_sampler_example(daemon):
    pytest.importorskip("torch", reason="torch is not installed")
    p = launch(daemon, 3, os.path.join(ROOT, "examples", "distributed_sampler.py"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "100 results in dataset order: True" in p.stdout


def test_accelerate_enable_example(daemon):
    """Under the real torchrun: three ranks of uneven loaders, two calls per batch."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, OMP_NUM_THREADS="1",
               PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "3",
                        os.path.join(ROOT, "examples", "accelerate_enable.py")],
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(3):
        assert "rank %d: 50 predictions for 50 samples" % r in p.stdout, p.stdout
    assert p.stdout.count("same as one process: True") == 3, p.stdout


def test_gather_c_example(daemon):
    """examples/gather.c as its comment says: for r in 0 1; do ./gather $r 2 & done; wait."""
    build = os.path.dirname(os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald")))
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket)
    p = subprocess.run("for r in 0 1; do ./example-gather $r 2 & done; wait", shell=True,
                       cwd=build, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr, p.stdout + p.stderr
    rows = [[int(v) for v in ln.split()] for ln in p.stdout.splitlines()[1:]]
    assert p.stdout.startswith("5 samples x 3 tokens:"), p.stdout
    assert [r[0] // 10 for r in rows] == [0, 1, 2, 3, 4], p.stdout  # dataset order, once each


def test_launch_reports_a_failed_rank(daemon, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, deval\n"
        "g = deval.join('launch-fail-' + os.environ['DEVAL_RUN'], timeout=30)\n"
        "g.barrier()\n"
        "if g.rank == 1:\n"
        "    os._exit(3)\n"
        "try:\n"
        "    g.barrier()\n"
        "except deval.PeerLost as e:\n"
        "    print('rank %d: PeerLost: %s' % (g.rank, e))\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n")
    p = launch(daemon, 3, str(script), timeout=60)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.count("PeerLost: rank 1") == 2, p.stdout
