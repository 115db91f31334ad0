# SPDX-License-Identifier: MIT
"""The examples, run the way their headers say, and deval.launch's failure handling.

Each example for a loop people run is run under a real launcher on 2 or 3 ranks and again on
one, and must print the same: the same numbers, the same predictions in dataset order, the
same generated strings."""

import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT

PYTHON_DIR = os.path.join(ROOT, "python")
EXAMPLES = os.path.join(ROOT, "examples")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DEVAL_LAUNCH_ID", "GROUP_RANK")


def example_env(daemon):
    """What a user's shell would have: devald's socket, the binding, no launcher's variables;
    one thread per rank (2 cores), and no model hub (nothing is downloaded)."""
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in LAUNCHER_VARS:
        env.pop(k, None)
    return env


def run(cmd, daemon, timeout=120, **kw):
    """Run cmd; return its stdout, after checking that it succeeded."""
    p = subprocess.run(cmd, env=example_env(daemon), capture_output=True, text=True,
                       timeout=timeout, **kw)
    assert p.returncode == 0, "%s\n%s%s" % (cmd, p.stdout, p.stderr)
    return p.stdout


def torchrun(daemon, n, example, timeout=120):
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(n), os.path.join(EXAMPLES, example)], daemon, timeout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(daemon, n, example, timeout=120):
    """accelerate launch of n processes (--cpu would start one; the example keeps to the CPU)"""
    return run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_processes", str(n), "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                os.path.join(EXAMPLES, example)], daemon, timeout)


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
    """torchrun on 3 ranks and deval.launch on 2 print what one process prints."""
    pytest.importorskip("torch", reason="torch is not installed")
    one = torchrun(daemon, 1, "distributed_sampler.py")
    lines = one.splitlines()
    assert len(lines) == 3 and lines[0].startswith("100 predictions, accuracy "), one
    assert len(set(lines[1] + lines[2])) == 3, one  # every class: a shuffled order would show
    assert torchrun(daemon, 3, "distributed_sampler.py") == one
    p = launch(daemon, 2, os.path.join(EXAMPLES, "distributed_sampler.py"))
    assert p.returncode == 0 and p.stdout == one, p.stdout + p.stderr


def test_trainer_steps_example(daemon):
    """A transformers Trainer evaluating every 4 steps, on 2 ranks and on one."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    one = torchrun(daemon, 1, "trainer_steps.py", timeout=180)
    lines = one.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["step 4", "step 8", "step 12"], one
    preds = lines[-1].split()[-1]
    assert len(preds) == 37 and len(set(preds)) == 3, one
    assert torchrun(daemon, 2, "trainer_steps.py", timeout=180) == one


def test_no_trainer_steps_example(daemon):
    """Accelerate's no_trainer loop under accelerate launch on 2 processes, and run alone."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    one = run([sys.executable, os.path.join(EXAMPLES, "no_trainer_steps.py")], daemon)
    lines = one.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["step 5", "step 10", "step 15"], one
    preds = lines[-1].split()[-1]
    assert len(preds) == 45 and len(set(preds)) == 4, one
    assert accelerate_launch(daemon, 2, "no_trainer_steps.py") == one


def test_generate_example(daemon):
    """Beam search with 2 sequences per prompt, ids and strings, on 3 ranks and on one."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    one = torchrun(daemon, 1, "generate.py")
    lines = one.splitlines()
    assert lines[0] == "16 sequences for 8 prompts, the token ids decode to the texts: True"
    assert len(lines) == 9 and lines[1].startswith("'the cat' -> 'the cat"), one
    assert len({len(ln) for ln in lines[1:]}) > 1, one
    assert torchrun(daemon, 3, "generate.py") == one


def test_torchmetrics_example(daemon):
    """Accuracy, F1 and MSE updated on 3 ranks (one sample padded in by the sampler) equal
    one process's, to the bit."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("torchmetrics", reason="torchmetrics is not installed")
    one = torchrun(daemon, 1, "torchmetrics_eval.py")
    assert one.startswith("50 reviews: accuracy ") and one.count("\n") == 1, one
    assert torchrun(daemon, 3, "torchmetrics_eval.py") == one


def test_lightning_example(daemon):
    """Lightning's own launcher starts 3 ranks; rank 0 prints what one device prints, to the
    bit (and not what plain Lightning's 51 samples give)."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("torchmetrics", reason="torchmetrics is not installed")
    pytest.importorskip("lightning", reason="lightning is not installed")
    example = os.path.join(EXAMPLES, "lightning_eval.py")
    one = run([sys.executable, example, "--devices", "1"], daemon, timeout=180)
    assert one.startswith("validate: accuracy ") and "rows 50\npredict: 50 predictions" in one, \
        one
    assert run([sys.executable, example, "--devices", "3"], daemon, timeout=240) == one


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
    """examples/gather.c as its comment says: under deval.launch, started by hand, and alone."""
    build = os.path.dirname(os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald")))
    one = run(["./example-gather", "0", "1"], daemon, 60, cwd=build)
    rows = [[int(v) for v in ln.split()] for ln in one.splitlines()[1:]]
    assert one.startswith("5 samples x 4 tokens:"), one
    assert rows == [[10 * i + t if t < 2 + i % 3 else -100 for t in range(4)] for i in range(5)]
    for n in (2, 3):
        assert run([sys.executable, "-m", "deval.launch", "-n", str(n), "./example-gather"],
                   daemon, 60, cwd=build) == one
    p = subprocess.run("for r in 0 1; do ./example-gather $r 2 & done; wait", shell=True,
                       cwd=build, env=example_env(daemon), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and not p.stderr and p.stdout == one, p.stdout + p.stderr


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


def test_launch_names_a_missing_program():
    """deval.launch on a path that is not there says so once, not once per rank."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "deval.launch", "-n", "3", "./gather"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("./gather: no such file") == 1, p.stderr
