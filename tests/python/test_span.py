# SPDX-License-Identifier: MIT
"""Groups that span machines, on one machine: each "node" is a devald of its own on a socket of
its own, and the engine between nodes is real: Open MPI's mpirun for the C library
(libdeval-mpi), torch.distributed over gloo on 127.0.0.1 for Python. Every result must be
identical, byte for byte, to a flat group of the same ranks at one devald; every failure must
reach every rank, naming the rank or the node, and never hang."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, Daemon

BUILD = os.path.dirname(os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald")))
HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "span_job.py")


@pytest.fixture
def nodes():
    """Start devalds on demand: nodes(n) -> n node sockets and a flat one."""
    started = []

    def start(n):
        ds = [Daemon() for _ in range(n + 1)]
        started.extend(ds)
        return ds

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- C: libdeval-mpi under mpirun ------------------------------------------------------------

WRAP = """#!/bin/sh
r=$OMPI_COMM_WORLD_RANK
DEVAL_NODE=$(echo "$SPAN_LAYOUT" | cut -d, -f$((r + 1)))
eval "DEVAL_SOCKET=\\$SPAN_SOCKET_$DEVAL_NODE"
export DEVAL_NODE DEVAL_SOCKET
exec "$@"
"""


def mpirun(tmp_path, layout, daemons, *args, timeout=240):
    mpirun = shutil.which("mpirun")
    exe = os.path.join(BUILD, "tests", "span-check")
    if mpirun is None or not os.access(exe, os.X_OK):
        pytest.skip("no mpirun or no span-check (libdeval-mpi needs Open MPI's headers: "
                    "apt-get install libopenmpi-dev openmpi-bin)")
    wrap = tmp_path / "wrap.sh"
    wrap.write_text(WRAP)
    wrap.chmod(0o755)
    env = dict(os.environ, SPAN_LAYOUT=",".join(map(str, layout)),
               SPAN_FLAT_SOCKET=daemons[-1].socket, OMPI_MCA_plm_rsh_agent="")
    for k, d in enumerate(daemons[:-1]):
        env["SPAN_SOCKET_%d" % k] = d.socket
    t0 = time.monotonic()
    p = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np",
                        str(len(layout)), str(wrap), exe, *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("layout", [(0, 0, 1, 1), (0, 1, 1, 2), (0, 0, 1, 2, 2), (0, 1, 0, 1)],
                         ids=["2x2", "3x1-2", "3x2-1-2", "2x2-interleaved"])
def test_mpi_spanning_group_matches_one_machine(tmp_path, nodes, layout):
    daemons = nodes(max(layout) + 1)
    p, _ = mpirun(tmp_path, layout, daemons, "timeout-ms", "60000")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if "results identical" in ln]
    assert len(lines) == len(layout), p.stdout + p.stderr
    for rank, node in enumerate(layout):
        assert any(ln.startswith("span-check: rank %d (node %d of %d): " %
                                 (rank, node, max(layout) + 1)) for ln in lines), lines


def test_mpi_node_that_stops_answering_is_named(tmp_path, nodes):
    """Rank 3 (node 1) stops: node 0's ranks time out naming node 1, in about the timeout."""
    daemons = nodes(2)
    p, took = mpirun(tmp_path, (0, 0, 1, 1), daemons, "timeout-ms", "3000", "stop", "3", "5")
    subprocess.run(["pkill", "-KILL", "-f", "tests/span-check"], check=False)
    got = [ln for ln in p.stdout.splitlines() if ": timed out: " in ln]
    assert {ln.split(":")[1].strip() for ln in got} >= {"rank 0", "rank 1"}, p.stdout + p.stderr
    for ln in got:
        assert "no answer within 3000 ms from node 1" in ln, ln
        assert "timeout= in deval.join()" in ln, ln  # where the figure is set
    assert took < 60, took


def test_mpi_join_failure_says_why(tmp_path, nodes):
    """deval_mpi_join()'s own failures carry a message, as deval_join()'s do."""
    daemons = nodes(1)
    p, _ = mpirun(tmp_path, ("x", "x"), daemons + daemons, "timeout-ms", "10000", timeout=60)
    got = [ln for ln in p.stdout.splitlines() if ": join: " in ln]
    assert len(got) == 2, p.stdout + p.stderr
    for ln in got:
        assert "invalid argument" in ln.lower() or "EINVAL" in ln, ln
        assert "$DEVAL_NODE is 'x', not a machine's number" in ln, ln


# ---- Python: deval.join() over torch.distributed (gloo) ------------------------------------

def env_for(extra):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "DEVAL_ONE_MACHINE", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_NNODES",
              "SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(k, None)
    env.update(extra)
    return env


def spawn(layout, daemons, args, extra=None, launcher="torchrun"):
    """The ranks of layout (rank -> node) as torchrun (or srun) would start them, without
    torchrun's agents (which would stop the survivors of a failure before they report it)."""
    port, procs = free_port(), []
    for rank, node in enumerate(layout):
        local = [r for r, n in enumerate(layout) if n == node]
        said = (dict(LOCAL_RANK=str(local.index(rank)), LOCAL_WORLD_SIZE=str(len(local)),
                     GROUP_RANK=str(node)) if launcher == "torchrun" else
                dict(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID=str(rank),
                     SLURM_NTASKS=str(len(layout)), SLURM_NNODES=str(max(layout) + 1),
                     SLURM_NODEID=str(node), SLURM_LOCALID=str(local.index(rank))))
        env = env_for(dict(extra or {}, RANK=str(rank), WORLD_SIZE=str(len(layout)),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           DEVAL_SOCKET=daemons[node].socket,
                           SPAN_FLAT_SOCKET=daemons[-1].socket, **said))
        procs.append(subprocess.Popen([sys.executable, JOB, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def test_torchrun_two_nodes_match_one_machine(nodes):
    """Two real torchrun agents (--nnodes 2, 2 ranks each), each with its node's devald."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    daemons = nodes(2)
    port = free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
         "2", "--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port", str(port),
         JOB, "compare"],
        env=env_for({"DEVAL_SOCKET": daemons[k].socket, "SPAN_FLAT_SOCKET": daemons[-1].socket}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in agents]
    assert all(p.returncode == 0 for p in agents), outs
    lines = [ln for out in outs for ln in out.splitlines() if ": identical " in ln]
    assert sorted(ln.split(":")[0] for ln in lines) == [
        "rank 0 node 0/2", "rank 1 node 0/2", "rank 2 node 1/2", "rank 3 node 1/2"], outs
    assert len({ln.split()[-1] for ln in lines}) == 1, lines  # the same count on every rank


def test_accelerate_loop_across_nodes_gives_the_single_process_result(nodes):
    """deval.accelerate.enable() under a job on two "nodes": the Accelerator's own process
    group joins them; prepared loaders (even_batches on and off) lose and repeat nothing."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    daemons = nodes(2)
    procs = spawn((0, 0, 1, 1), daemons, ["accelerate"])
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for rank in range(4):
        assert "rank %d node %d/2: accelerate exact" % (rank, rank // 2) in outs[rank], outs


@pytest.mark.parametrize("layout,launcher", [((0, 1, 1, 2), "torchrun"), ((0, 1, 2), "torchrun"),
                                             ((0, 1, 1, 2), "srun")],
                         ids=["3x1-2", "3x1", "srun-3x1-2"])
def test_three_nodes_match_one_machine(nodes, layout, launcher):
    """3 nodes under torchrun's variables, and under srun's (the nodes from $SLURM_NODEID)."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    daemons = nodes(3)
    procs = spawn(layout, daemons, ["compare"], launcher=launcher)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    for rank, node in enumerate(layout):
        assert "rank %d node %d/3: identical" % (rank, node) in outs[rank], outs[rank]


def run_failure(nodes, mode, victim, timeout="20"):
    daemons = nodes(2)
    layout = (0, 0, 1, 1)
    procs = spawn(layout, daemons, ["fail", mode], {"SPAN_VICTIM": str(victim),
                                                    "SPAN_TIMEOUT": timeout})
    outs = {}
    try:
        for rank, p in enumerate(procs):
            if rank != victim:
                outs[rank] = p.communicate(timeout=120)[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_rank_killed_on_the_other_node(nodes):
    pytest.importorskip("torch")
    outs = run_failure(nodes, "kill", 3)
    for rank, out in outs.items():
        assert "PeerLost" in out and "rank 3" in out and "node 1" in out, (rank, out)


def test_leader_killed(nodes):
    """Node 1's leader (rank 2) dies: its node learns it from devald, node 0 from gloo."""
    pytest.importorskip("torch")
    outs = run_failure(nodes, "kill", 2)
    assert "PeerLost" in outs[3] and "rank 2" in outs[3] and "node 1" in outs[3], outs[3]
    for rank in (0, 1):
        assert "PeerLost" in outs[rank] and "node 1 (leader rank 2)" in outs[rank], outs[rank]


def test_node_that_stops_answering(nodes):
    pytest.importorskip("torch")
    outs = run_failure(nodes, "stop", 3, timeout="3")
    for rank in (0, 1):
        assert "Timeout" in outs[rank] and "node 1" in outs[rank], outs[rank]
    assert "Timeout" in outs[2] and "rank 3" in outs[2], outs[2]
    # node 1's group waits 15 s past the join's timeout for its leader; said as the user set it
    assert "timed out after 3000 ms (" in outs[2] and "timeout= in deval.join()" in outs[2] \
        and "and 15000 ms more that a machine's ranks give their leader" in outs[2], outs[2]


def test_devald_killed_on_one_node(nodes):
    pytest.importorskip("torch")
    daemons = nodes(2)
    procs = spawn((0, 0, 1, 1), daemons, ["fail", "none"], {"SPAN_VICTIM": "-1",
                                                             "SPAN_TIMEOUT": "20"})
    time.sleep(8)  # joined, gathering in a loop
    daemons[1].proc.send_signal(signal.SIGKILL)
    daemons[1].proc.wait()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for rank in (2, 3):
        assert "DaemonLost" in outs[rank], outs[rank]
    # node 0 hears it from node 1's leader (DaemonLost), or, when that leader's own step had
    # already moved past the engine, from gloo as the leader exits (PeerLost): node 1 either way
    for rank in (0, 1):
        assert ("DaemonLost" in outs[rank] or "PeerLost" in outs[rank]) and \
            "node 1" in outs[rank], outs[rank]


def test_ctl_shows_the_node_the_leader_and_the_other_nodes(nodes):
    """deval-ctl group NAME, asked at node 1's devald by the spanning group's name."""
    pytest.importorskip("torch")
    import json
    daemons = nodes(3)
    procs = spawn((0, 1, 1, 2), daemons, ["fail", "none"], {"SPAN_VICTIM": "-1",
                                                             "SPAN_TIMEOUT": "20"})
    ctl = os.path.join(BUILD, "deval-ctl")
    try:
        deadline, names = time.monotonic() + 60, []
        while not names and time.monotonic() < deadline:
            st = subprocess.run([ctl, "--socket", daemons[1].socket, "--json", "status"],
                                capture_output=True, text=True, timeout=30)
            names = [g["name"] for g in json.loads(st.stdout)["groups"]
                     if g["state"] == "active"] if st.returncode == 0 else []
            time.sleep(0.2)
        assert len(names) == 1 and names[0].endswith(".n1"), names
        name = names[0][:-3]
        text = subprocess.run([ctl, "--socket", daemons[1].socket, "group", name],
                              capture_output=True, text=True, timeout=30).stdout
        assert "spans 3 machines as group '%s' of 4 ranks: this is node 1" % name in text, text
        assert "led by rank 1; its ranks here are 1, 2" in text, text
        assert "node 0: host %s, 1 rank, led by rank 0" % socket.gethostname()[:55] in text, text
        assert "node 2: host %s, 1 rank, led by rank 3" % socket.gethostname()[:55] in text, text
        js = json.loads(subprocess.run([ctl, "--socket", daemons[1].socket, "--json", "group",
                                        name], capture_output=True, text=True,
                                       timeout=30).stdout)
        assert js["span"]["ranks"] == [1, 2] and js["span"]["nodes"] == 3, js["span"]
        assert [n["leader"] for n in js["span"]["node_list"]] == [0, 1, 3], js["span"]
        flat = json.loads(subprocess.run([ctl, "--socket", daemons[1].socket, "--json", "group",
                                          names[0]], capture_output=True, text=True,
                                         timeout=30).stdout)
        assert flat["span"] == js["span"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
