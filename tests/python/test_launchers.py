# SPDX-License-Identifier: MIT
"""No daemon to start and no group to name: deval.join() under the real launchers, with no
devald running beforehand.

Each test gets a runtime directory of its own ($XDG_RUNTIME_DIR, with $DEVAL_SOCKET unset), so
the devald that libdeval starts there is the test's alone, and is stopped afterwards.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, devalds, group_name, run_ranks

BUILD = os.path.dirname(os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald")))
PYTHON_DIR = os.path.join(ROOT, "python")


def env_for(extra=None):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def ctl(*args):
    return subprocess.run([os.path.join(BUILD, "deval-ctl")] + list(args), capture_output=True,
                          text=True, timeout=30)


SCRIPT = """
import os, deval, numpy as np
g = deval.join()
# the same group, as deval.accelerate.enable() joins it (the Accelerator's rank and size)
assert deval.join(rank=g.rank, world_size=g.world_size) is g
got = g.gather(np.array([g.rank]))
assert got.tolist() == list(range(g.world_size)), got
os.write(1, b"rank %d of %d in %s\\n" % (g.rank, g.world_size, g.name.encode()))  # one write
g.barrier()
g.leave()
"""


def torchrun(n, script, **kw):
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", str(n), script], env=env_for(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun_joins_with_no_arguments(runtime, tmp_path, n):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    assert devalds(runtime) == []
    p = torchrun(n, str(script))
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out
    names = {line.split()[-1] for line in out.splitlines() if line.startswith("rank ")}
    assert len(names) == 1 and names.pop().startswith("torchrun-"), out
    assert sum(line.startswith("rank ") for line in out.splitlines()) == n
    assert len(devalds(runtime)) == 1  # started by the first rank, shared by all


SPAWN_SCRIPT = """
import os, socket, sys, deval, numpy as np, torch.distributed as dist, torch.multiprocessing as mp

def rank(r, world):
    # the DDP tutorial's shape: the rank and world size go to torch, not to the environment
    dist.init_process_group("gloo", rank=r, world_size=world)
    g = deval.join()
    got = g.gather(np.array([g.rank]))
    assert got.tolist() == list(range(world)), got
    os.write(1, b"rank %d of %d in %s\\n" % (g.rank, g.world_size, g.name.encode()))
    g.leave()
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(rank, args=(3,), nprocs=3)
"""


def test_spawned_ranks_join_with_torch_s_rank(runtime, tmp_path):
    """Ranks mp.spawn started have no $RANK: deval.join() takes torch.distributed's."""
    pytest.importorskip("torch")
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN_SCRIPT)
    env = env_for()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("rank "))
    assert [ln.split()[1] for ln in lines] == ["0", "1", "2"], p.stdout
    assert len({ln.split()[-1] for ln in lines}) == 1 and "of 3 in torch-" in lines[0]


def test_two_torchrun_jobs_at_once_never_meet(runtime, tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("g.barrier()", "import time; time.sleep(1); g.barrier()"))
    a, b = torchrun(2, str(script)), torchrun(3, str(script))
    out_a, _ = a.communicate(timeout=180)
    out_b, _ = b.communicate(timeout=180)
    assert a.returncode == 0 and b.returncode == 0, out_a + out_b
    name_a = {ln.split()[-1] for ln in out_a.splitlines() if ln.startswith("rank ")}
    name_b = {ln.split()[-1] for ln in out_b.splitlines() if ln.startswith("rank ")}
    assert len(name_a) == 1 and len(name_b) == 1 and name_a != name_b
    assert "of 2 in" in out_a and "of 3 in" in out_b


NODES_SCRIPT = """
import os, sys, deval, numpy as np
try:
    g = deval.join(*sys.argv[1:])
except deval.NotSupported as e:
    os.write(1, b"refused: %s\\n" % str(e).encode())
    raise SystemExit(0)
got = g.gather(np.array([g.rank]))
os.write(1, b"rank %d of %d: %s\\n" % (g.rank, g.world_size, str(got.tolist()).encode()))
g.leave()
"""


def torchrun_node(script, node, port, extra=None, args=()):
    """One of two torchrun agents (--nnodes 2, one rank each), as on two machines."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                             "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr",
                             "127.0.0.1", "--master-port", str(port), script] + list(args),
                            env=env_for(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("named", [False, True])
def test_a_job_on_two_machines_is_refused_at_once(runtime, tmp_path, named):
    """torchrun --nnodes 2 without torch.distributed initialised: a group across the machines
    needs it, so deval.join() says so at once, named or not (never a wait of 300 s for ranks
    that cannot come); told that both "machines" are this one, the two ranks meet."""
    pytest.importorskip("torch")
    script = tmp_path / "nodes.py"
    script.write_text(NODES_SCRIPT)
    args = [group_name("nodes")] if named else []
    port = free_port()
    agents = [torchrun_node(str(script), k, port, args=args) for k in (0, 1)]
    outs = [p.communicate(timeout=180)[0] for p in agents]
    assert all(p.returncode == 0 for p in agents), outs
    for out in outs:
        assert "refused: deval" in out and "this job runs on more than one machine" in out, out
        assert "torchrun says 1 of its 2 ranks run on this one ($LOCAL_WORLD_SIZE)" in out, out
        assert "torch.distributed, which is not initialised" in out, out
        assert "DEVAL_ONE_MACHINE=1" in out, out
    port = free_port()
    agents = [torchrun_node(str(script), k, port, {"DEVAL_ONE_MACHINE": "1"}, args)
              for k in (0, 1)]
    outs = [p.communicate(timeout=180)[0] for p in agents]
    assert all(p.returncode == 0 for p in agents), outs
    assert "rank 0 of 2: [0, 1]" in outs[0] and "rank 1 of 2: [0, 1]" in outs[1], outs


def test_mpirun_c_program(runtime):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (apt-get install openmpi-bin)")
    exe = os.path.join(BUILD, "example-join-auto")
    p = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4",
                        "-x", "XDG_RUNTIME_DIR", "-x", "DEVAL_IDLE_EXIT", exe],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMPI_MCA_plm_rsh_agent=""))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]
    assert len(lines) == 4, p.stdout
    names = {ln.split(" in group ")[1].split(":")[0] for ln in lines}
    assert len(names) == 1 and names.pop().startswith("mpirun-"), lines
    assert {ln.split()[1] for ln in lines} == {"0", "1", "2", "3"}


def test_deval_launch_c_program(runtime):
    """examples/join_auto.c run as its comment says: python -m deval.launch -n 3 ./join_auto."""
    p = subprocess.run([sys.executable, "-m", "deval.launch", "-n", "3", "./example-join-auto"],
                       capture_output=True, text=True, timeout=120, cwd=BUILD,
                       env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]
    assert len(lines) == 3 and {ln.split()[1] for ln in lines} == {"0", "1", "2"}, p.stdout
    assert all(" in group deval.launch-" in ln for ln in lines), lines


def race_rank(rank, world, name):
    import deval
    import numpy as np
    g = deval.join(name, rank, world, timeout=30)
    out = g.gather(np.array([rank])).tolist()
    g.leave()
    return out


def test_autostart_race(runtime):
    """8 ranks that find no devald, at once, 20 times: one devald each time, every rank in."""
    for rnd in range(20):
        for pid in devalds(runtime):  # the previous round's, killed: its socket stays stale
            os.kill(pid, signal.SIGKILL)
        res = run_ranks(8, race_rank, group_name("race"), timeout=60)
        assert res == [list(range(8))] * 8, rnd
        assert len(devalds(runtime)) == 1, rnd
    with open(os.path.join(os.path.dirname(runtime), "devald.log")) as f:
        assert f.read().count("listening on") == 20


def test_idle_exit_and_reuse(runtime):
    res = run_ranks(2, race_rank, group_name("idle"))
    assert res == [[0, 1]] * 2
    first = devalds(runtime)
    assert len(first) == 1
    res = run_ranks(2, race_rank, group_name("idle"))  # right after: the same devald
    assert devalds(runtime) == first
    deadline = time.monotonic() + 10
    while devalds(runtime) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert devalds(runtime) == [], "devald did not exit when idle"
    assert not os.path.exists(runtime)


def late_rank(rank, world, name):
    import deval
    import numpy as np
    if rank == 1:
        time.sleep(1.5)  # (after devald, stopped under rank 0's join, has gone)
    with deval.join(name, rank, world, timeout=20) as g:
        return g.gather(np.array([g.rank])).tolist()


def test_a_join_that_meets_devald_exiting_starts_a_new_one(runtime):
    """A devald libdeval started may exit (idle, or stopped) as a join reaches it: the join
    then starts a new devald and joins there, instead of failing."""
    res = run_ranks(1, race_rank, group_name("first"))  # (a devald to meet)
    [old] = devalds(runtime)
    stop = threading.Timer(0.5, os.kill, (old, signal.SIGTERM))
    stop.start()
    res = run_ranks(2, late_rank, group_name("late"))
    stop.join()
    assert res == [[0, 1]] * 2
    assert len(devalds(runtime)) == 1 and devalds(runtime) != [old]
    with open(os.path.join(os.path.dirname(runtime), "devald.log")) as f:
        assert f.read().count("listening on") == 2


def test_stale_socket_is_replaced(runtime):
    run_ranks(2, race_rank, group_name("stale"))
    (pid,) = devalds(runtime)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert os.path.exists(runtime)  # left behind, answering nobody
    assert run_ranks(2, race_rank, group_name("stale")) == [[0, 1]] * 2
    assert len(devalds(runtime)) == 1 and devalds(runtime) != [pid]


def off_rank(rank, world):
    import deval
    try:
        deval.join("off", rank, world, timeout=5)
    except deval.DaemonLost as e:
        return str(e)
    return "joined"


def off_option_rank(rank, world):
    import deval
    try:
        deval.join("off", rank, world, timeout=5, autostart=False)
    except deval.DaemonLost as e:
        return str(e)
    return "joined"


def test_autostart_off_says_how_to_start_one(runtime, monkeypatch):
    monkeypatch.setenv("DEVAL_AUTOSTART", "0")
    (msg,) = run_ranks(1, off_rank)
    assert "starting one is off" in msg and "devald --socket %s" % runtime in msg
    assert devalds(runtime) == []
    monkeypatch.delenv("DEVAL_AUTOSTART")
    (msg,) = run_ranks(1, off_option_rank)  # the join option does the same
    assert "starting one is off" in msg
    assert devalds(runtime) == []


def test_a_named_socket_is_never_autostarted(runtime, monkeypatch, tmp_path):
    sock = str(tmp_path / "nobody.sock")
    monkeypatch.setenv("DEVAL_SOCKET", sock)
    (msg,) = run_ranks(1, off_rank)
    assert "cannot reach devald at %s" % sock in msg
    assert devalds(runtime) == [] and devalds(sock) == []


def test_nothing_names_the_job(runtime):
    """The error says all that a script run on its own needs: naming the group alone would
    only raise again, for $RANK."""
    import deval
    with pytest.raises(deval.InvalidArgument, match="nothing says which job") as e:
        deval.join()
    assert "give the rank and world size (0 and 1 for a process on its own)" in str(e.value)


def launch_rank_group(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.replace("g.barrier()", "import time; time.sleep(1.5); g.barrier()"))
    return script


def test_ctl_groups_shows_the_launcher(runtime, tmp_path):
    script = launch_rank_group(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "deval.launch", "-n", "2", str(script)],
                         env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    deadline = time.monotonic() + 30
    groups = []
    while time.monotonic() < deadline and not groups:
        r = ctl("--json=short", "groups")
        if r.returncode == 0:
            groups = [g for g in json.loads(r.stdout) if g["joined"] == 2]
        time.sleep(0.1)
    table = ctl("groups").stdout
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert groups and groups[0]["launcher"] == "deval.launch", groups
    assert groups[0]["name"].startswith("deval.launch-")
    assert "LAUNCHER" in table and "deval.launch" in table


INSTALLED = """
import os, sys, deval, numpy as np
assert deval.__file__.startswith(sys.argv[1]), deval.__file__   # the wheel's, not the tree's
g = deval.join()
# the same group, as deval.accelerate.enable() joins it (the Accelerator's rank and size)
assert deval.join(rank=g.rank, world_size=g.world_size) is g
got = g.gather(np.array([g.rank]))
assert got.tolist() == list(range(g.world_size)), got
os.write(1, b"rank %d of %d in %s\\n" % (g.rank, g.world_size, g.name.encode()))
import time; time.sleep(1)   # the other job is running too
g.barrier()
g.leave()
"""


def test_installed_wheel_under_torchrun(runtime, tmp_path):
    """pip wheel . builds a wheel; a fresh venv outside the source tree installs it without a
    compiler; torchrun jobs of 2 and 4 ranks whose only deval lines are import deval and
    deval.join() run at once, with no devald beforehand: the package starts its own."""
    pytest.importorskip("torch")
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                        "--disable-pip-version-check", "-w", str(dist), ROOT],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = dist.glob("deval-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    vpy = str(venv / "bin" / "python")
    p = subprocess.run([vpy, "-m", "pip", "install", "--no-deps", "-q",
                        "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # numpy and torch from the test environment, after the venv's own packages
    site = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import numpy
    with open(os.path.join(site, "zz-test-env.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(numpy.__file__)) + "\n")
    script = tmp_path / "job.py"
    script.write_text(INSTALLED)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DEVALD", "DEVAL_LIBRARY", "DEVAL_CTL")}
    env["OMP_NUM_THREADS"] = "1"
    env["DEVAL_IDLE_EXIT"] = "30"
    jobs = [subprocess.Popen([vpy, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", str(n), str(script), site],
                             cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for n in (2, 4)]
    outs = [j.communicate(timeout=300)[0] for j in jobs]
    for j, out, n in zip(jobs, outs, (2, 4)):
        assert j.returncode == 0, out
        assert sum(ln.startswith("rank ") for ln in out.splitlines()) == n, out
    names = [{ln.split()[-1] for ln in out.splitlines() if ln.startswith("rank ")}
             for out in outs]
    assert all(len(s) == 1 for s in names) and names[0] != names[1]
    (pid,) = devalds(runtime)
    assert os.readlink("/proc/%d/exe" % pid).startswith(site)  # the wheel's devald
    ctl_out = subprocess.run([str(venv / "bin" / "deval-ctl"), "status"], env=env,
                             capture_output=True, text=True, timeout=30)
    assert ctl_out.returncode == 0 and "devald pid %d" % pid in ctl_out.stdout, ctl_out


SYSTEM = "/run/deval/devald.sock"


def test_a_system_devald_wins(runtime):
    """A devald at the system's socket (systemd's, or root's) takes the joins; none starts."""
    if os.geteuid() != 0:
        pytest.skip("only root may listen at %s" % SYSTEM)
    if os.path.exists(SYSTEM):
        pytest.skip("%s exists: a system devald may be running; leave it be" % SYSTEM)
    proc = subprocess.Popen([os.path.join(BUILD, "devald"), "--socket", SYSTEM, "--log-level",
                             "warn"])
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(SYSTEM) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert run_ranks(2, race_rank, group_name("system")) == [[0, 1]] * 2
        assert devalds(runtime) == []
        status = ctl("status")  # deval-ctl finds it the same way
        assert status.returncode == 0 and "devald pid %d" % proc.pid in status.stdout
        # which binary answers, since another checkout's devald may hold the socket
        assert "devald is %s\n" % os.path.realpath(os.path.join(BUILD, "devald")) \
            in status.stdout, status.stdout
    finally:
        proc.terminate()
        proc.wait(10)
    assert not os.path.exists(SYSTEM)


def test_one_launcher_table(monkeypatch):
    """The binding asks libdeval whether the job spans machines: a single-machine torchrun
    inside a two-node Slurm allocation is one machine to both (the Python copy of the table
    said two)."""
    import deval
    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "TORCHELASTIC_", "DEVAL_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "j1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_NNODES", "2")
    assert deval._spans_machines() is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert deval._spans_machines() == "torchrun says 1 of its 2 ranks run on this one " \
        "($LOCAL_WORLD_SIZE)"
    monkeypatch.setenv("DEVAL_ONE_MACHINE", "1")
    assert deval._spans_machines() is None
