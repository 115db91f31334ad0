# SPDX-License-Identifier: MIT
"""Accelerate's own distributed test scripts, shipped in its wheel, run under torchrun with
deval.accelerate.enable() applied to every Accelerator they create (accelerate_shim.py): the
conformance suite of the one-line switch. Each must pass as it does without deval; a script
that fails without deval too (on this CPU-only machine, at this world size) is skipped,
saying so."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts")


def torchrun(world, args, env, timeout=300):
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    return subprocess.run([exe, "--nproc-per-node", str(world), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


# (test_script.py at 3 ranks and test_distributed_data_loop.py as a whole fail or hang without
# deval on CPU: the first expects at most 2 processes in one case, the second 2 GPUs; the
# second's cases that run on CPU are below)
@pytest.mark.parametrize("script,world", [("test_script.py", 2), ("test_sync.py", 2),
                                          ("test_sync.py", 3),
                                          ("external_deps/test_metrics.py", 2)])
def test_accelerate_script_under_enable(daemon, script, world):
    path = os.path.join(SCRIPTS, script)
    if not os.path.exists(path):
        pytest.skip("accelerate %s ships no %s" % (accelerate.__version__, script))
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, ACCELERATE_USE_CPU="true",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "python"), HERE]),
               OMP_NUM_THREADS="1")
    r = torchrun(world, [os.path.join(HERE, "accelerate_shim.py"), path], env)
    if r.returncode != 0:
        plain = torchrun(world, [path], env)
        if plain.returncode != 0:
            pytest.skip("%s fails at %d ranks without deval too" % (script, world))
        pytest.fail("%s at %d ranks passes without deval, fails with it:\n%s"
                    % (script, world, (r.stdout + r.stderr)[-6000:]))
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("deval shim:")]
    assert said and not said[0].startswith("deval shim: 0 "), r.stdout[-2000:]


def test_distributed_data_loop_under_enable(daemon):
    """test_distributed_data_loop.py's cases that run on CPU (accelerate_data_loop.py: its
    main() first joins uneven inputs, which needs GPUs, and it asserts 2 processes): every
    sample of the shards once through gather_for_metrics, skip_first_batches, a BatchSampler
    as sampler=, and the stateful loaders resumed from a saved state (with torchdata)."""
    import importlib.util
    import accelerate_data_loop as adl
    cases = [c for c in adl.CASES
             if not c.startswith("stateful") or importlib.util.find_spec("torchdata")]
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, ACCELERATE_USE_CPU="true",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "python"), HERE]),
               OMP_NUM_THREADS="1")
    script = os.path.join(HERE, "accelerate_data_loop.py")
    r = torchrun(2, [os.path.join(HERE, "accelerate_shim.py"), script, *cases], env)
    done = [ln.split(": ", 1)[1] for ln in r.stdout.splitlines()
            if ln.startswith("data loop case done: ")]
    if r.returncode != 0 or done != cases:
        plain = torchrun(2, [script, *cases], env)
        if plain.returncode != 0:
            pytest.skip("the data loop cases fail without deval too:\n%s"
                        % (plain.stdout + plain.stderr)[-2000:])
        pytest.fail("the data loop cases pass without deval, fail with it (done: %s):\n%s"
                    % (done, (r.stdout + r.stderr)[-6000:]))
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("deval shim:")]
    assert said and not said[0].startswith("deval shim: 0 "), r.stdout[-2000:]
