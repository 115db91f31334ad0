# SPDX-License-Identifier: MIT
"""The Python binding against a real devald and real processes: every call, every dtype,
nested structures, scalars and empty inputs, copies and views, and one exception class per
kind of failure."""

import os
import signal
import time

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks

DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
          np.float64]
try:
    import ml_dtypes
    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    ml_dtypes = None


def ragged(rank, dtype):
    """rank r: r + 1 rows of 2 + r columns, distinct values."""
    a = np.arange((rank + 1) * (2 + rank), dtype=np.float64).reshape(rank + 1, 2 + rank)
    return (a + 10 * rank).astype(dtype)  # small enough for every dtype


def expected(world, dtype, pad):
    width = 1 + world
    rows = []
    for r in range(world):
        a = ragged(r, dtype)
        p = np.full((a.shape[0], width), pad, dtype=dtype)
        p[:, : a.shape[1]] = a
        rows.append(p)
    return np.concatenate(rows)


def _gather_dtypes(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        for dt in DTYPES:
            out = g.gather(ragged(rank, dt), pad_index=7)
            want = expected(world, dt, 7)
            assert out.dtype == np.dtype(dt), (out.dtype, dt)
            assert out.shape == want.shape
            assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), dt
    return True


def test_gather_every_dtype(daemon):
    assert run_ranks(3, _gather_dtypes, daemon.socket, group_name("dtypes")) == [True] * 3


def _nested(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        # one collective: tensors in one call move together as samples, so each has a whole
        # number of rows per row of the first (here 1, and 3 for "beams")
        x = {"logits": np.ones((2, 3 + rank), np.float32) * rank,
             "ids": (np.arange(2, dtype=np.int64) + 10 * rank,
                     [np.full(2, rank, np.int32), np.full((6, 1), rank, np.int8)])}
        out = g.gather(x)
        assert set(out) == {"logits", "ids"}
        assert isinstance(out["ids"], tuple) and isinstance(out["ids"][1], list)
        assert out["logits"].shape == (2 * world, 2 + world)
        assert np.array_equal(out["ids"][0], np.concatenate(
            [np.arange(2) + 10 * r for r in range(world)]))
        assert out["ids"][1][0].tolist() == sum(([r, r] for r in range(world)), [])
        assert out["ids"][1][1].shape == (6 * world, 1)
        # Python scalars and 0-d arrays gather as one row per rank
        s, f = g.gather((np.int32(rank), 2.5))
        assert s.tolist() == list(range(world)) and f.tolist() == [2.5] * world
        assert g.gather(7).tolist() == [7] * world
        # zero rows everywhere
        empty = g.gather(np.zeros((0, 4 + rank), np.int16))
        assert empty.shape == (0, 3 + world)
        # samples move whole: a count that is no whole multiple is refused on every rank
        with pytest.raises(deval.Mismatch):
            g.gather((np.zeros(2), np.zeros(3 if rank == 0 else 4)))
    return True


def test_nested_scalars_and_empty(daemon):
    run_ranks(3, _nested, daemon.socket, group_name("nested"))


def _copy_view(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = np.arange(4, dtype=np.int32) + rank
        c = g.gather(x)
        assert c.flags.writeable
        c[0] = 99  # a copy: ours to change
        v = g.gather(x, copy=False)
        assert not v.flags.writeable
        with pytest.raises(ValueError):
            v[0] = 1
        assert np.array_equal(v, np.concatenate([np.arange(4) + r for r in range(world)]))
        # non-contiguous input is made contiguous
        nc = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
        out = g.gather(nc)
        assert np.array_equal(out[:3], nc)
    return True


def test_copy_and_view(daemon):
    run_ranks(2, _copy_view, daemon.socket, group_name("view"))


def _pass(rank, world, sock, name, order):
    n, bs = 21, 4
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        got = []
        with g.eval_pass(num_samples=n, order=order):
            if order == "rank":   # Accelerate: batches dealt round-robin, last round cycled
                nb = -(-n // bs)
                rounds = -(-nb // world)
                batches = [[(b * bs + j) % n for j in range(bs)]
                           for b in range(rank, rounds * world, world)]
            else:                 # DistributedSampler: samples dealt round-robin, head repeated
                per = -(-n // world)
                mine = [i % n for i in range(rank, per * world, world)]
                batches = [mine[i:i + bs] for i in range(0, len(mine), bs)]
            for b in batches:
                idx = np.array(b, dtype=np.int64)
                toks = np.stack([np.full(3 + rank, i, np.int32) for i in b])
                ids, t, names = g.gather_for_metrics((idx, toks)) + (
                    g.gather_for_metrics(["s%d" % i for i in b]),)
                assert t.shape[1] == 2 + world
                got.extend(zip(ids.tolist(), names))
        assert [i for i, _ in got] == list(range(n)), got
        assert [s for _, s in got] == ["s%d" % i for i in range(n)]
    return True


@pytest.mark.parametrize("order", ["rank", "strided"])
def test_eval_pass(daemon, order):
    run_ranks(3, _pass, daemon.socket, group_name("pass"), order)


def _pad(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = np.arange((rank + 1) * 3, dtype=np.int64).reshape(rank + 1, 3)
        p = g.pad_across_processes(x, dim=0, pad_index=-1)
        assert p.shape == (world, 3) and (p[rank + 1:] == -1).all()
        q = g.pad_across_processes(np.ones((2, 1 + rank), np.float32), dim=-1, pad_first=True)
        assert q.shape == (2, world) and (q[:, : world - 1 - rank] == 0).all()
        same = g.pad_across_processes(x, dim=5)
        assert np.array_equal(same, x)
        nested = g.pad_across_processes({"a": x, "b": [x]}, dim=0)
        assert nested["a"].shape == (world, 3) and nested["b"][0].shape == (world, 3)
    return True


def test_pad_across_processes(daemon):
    run_ranks(3, _pad, daemon.socket, group_name("pad"))


def _reduce(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = np.array([rank + 1, -(rank + 1)], np.float32)
        assert g.reduce(x, "sum").tolist() == [6, -6]
        assert g.reduce(x, "mean").tolist() == [2, -2]
        assert g.reduce(x, "max").tolist() == [3, -1]
        assert g.reduce(x, "min").tolist() == [1, -3]
        assert g.reduce(x, "prod").tolist() == [6, -6]
        assert x.tolist() == [rank + 1, -(rank + 1)]  # the input is left alone
        assert g.reduce(rank + 1) == 6
        assert g.reduce({"a": np.int64(2)}, "prod")["a"] == 8
        with pytest.raises(deval.InvalidArgument):
            g.reduce(np.array([1, 2], np.int32), "mean")
        with pytest.raises(deval.InvalidArgument):
            g.reduce(x, "median")
    return True


def test_reduce(daemon):
    run_ranks(3, _reduce, daemon.socket, group_name("reduce"))


def _broadcasts(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = np.full(3, rank, np.int16)
        assert g.broadcast(x, from_process=1).tolist() == [1, 1, 1]
        obj = {"config": [1, 2], "rank": rank}
        assert g.broadcast_object(obj, from_process=2) == {"config": [1, 2], "rank": 2}
        assert g.gather_object(["a%d" % rank, rank]) == sum(
            (["a%d" % r, r] for r in range(world)), [])
        assert g.gather_object("solo") == ["solo"] * world
        g.barrier()
        g.wait_for_everyone()
    return True


def test_broadcast_objects_barrier(daemon):
    run_ranks(3, _broadcasts, daemon.socket, group_name("bcast"))


def _from_env(rank, world, sock, name):
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    os.environ["DEVAL_SOCKET"] = sock
    with deval.join(name) as g:
        assert (g.rank, g.world_size) == (rank, world)
        g.barrier()
    return True


def test_join_from_environment(daemon):
    run_ranks(2, _from_env, daemon.socket, group_name("env"))


# ---- errors --------------------------------------------------------------------------------

def _bad_args(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        for bad in ("text", object(), np.zeros(3, np.complex64), np.zeros(3, np.uint32),
                    np.zeros((1,) * 9), []):
            with pytest.raises(deval.InvalidArgument):
                g.gather(bad)
        # more tensors than one collective carries go as several: no limit a user meets
        many = g.gather([np.full(1, i) for i in range(deval.MAX_TENSORS + 1)])
        assert [m.tolist() for m in many] == [[i] * world for i in range(deval.MAX_TENSORS + 1)]
        with pytest.raises(deval.InvalidArgument):
            g.broadcast(np.zeros(2), from_process=world)
        with pytest.raises(deval.InvalidArgument):
            g.gather(np.zeros(2), order="sideways")
        with pytest.raises(deval.InvalidArgument):
            with g.eval_pass(num_samples="many"):
                pass
        # nothing reached devald: the group works
        assert g.gather(np.int64(rank)).tolist() == list(range(world))
    with pytest.raises(deval.InvalidArgument):
        g.barrier()  # closed
    return True


def test_bad_arguments(daemon):
    run_ranks(2, _bad_args, daemon.socket, group_name("bad"))
    with pytest.raises(deval.InvalidArgument):
        deval.join(group_name("x"), 3, 2, socket=daemon.socket)
    with pytest.raises(deval.InvalidArgument):
        deval.join(group_name("x"), 0, 0, socket=daemon.socket)
    with pytest.raises(deval.InvalidArgument):
        deval.join(42)
    with pytest.raises(deval.InvalidArgument):
        deval.join(group_name("x"), 0, 1, socket=3)
    with pytest.raises(deval.InvalidArgument):
        deval.join(group_name("x"), 0, 1, socket=daemon.socket, timeout="soon")
    with pytest.raises(deval.DaemonLost):
        deval.join(group_name("x"), 0, 1, socket="/nonexistent/devald.sock")


def _mismatch(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = np.zeros(2, np.float32 if rank == 0 else np.float64)
        with pytest.raises(deval.Mismatch) as e:
            g.gather(x)
        assert "dtype" in str(e.value) and "rank 0" in str(e.value)
        g.barrier()
    return True


def test_mismatch(daemon):
    run_ranks(2, _mismatch, daemon.socket, group_name("mismatch"))


def _victim(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        g.barrier()
        if rank == world - 1:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(deval.PeerLost) as e:
            g.gather(np.zeros(3))
        assert time.monotonic() - t0 < 1.5
        assert "rank %d" % (world - 1) in str(e.value)
    return True


def test_peer_killed(daemon):
    run_ranks(3, _victim, daemon.socket, group_name("victim"), allow_death=(2,))


def _daemon_dies(rank, world, sock, name, pid):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        g.barrier()
        if rank == 0:
            time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
        # small steps run on the ranks: the barriers under way as devald dies may complete,
        # and within a second every rank learns it is gone
        t0 = time.monotonic()
        with pytest.raises(deval.DaemonLost):
            while time.monotonic() - t0 < 5:
                g.barrier()
        assert time.monotonic() - t0 < 1.5
    return True


def test_daemon_killed(own_daemon):
    run_ranks(2, _daemon_dies, own_daemon.socket, group_name("dkill"), own_daemon.proc.pid)
    own_daemon.proc.wait(5)


def _straggler(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=0.5) as g:
        g.barrier()
        if rank == 1:
            time.sleep(1.5)
            return True
        with pytest.raises(deval.Timeout) as e:
            g.barrier()
        assert "rank 1" in str(e.value)
        # the figure this rank joined with, and where to change it
        assert "timed out after 500 ms (" in str(e.value), str(e.value)
        assert "timeout= in deval.join()" in str(e.value), str(e.value)
    return True


def test_timeout(daemon):
    run_ranks(2, _straggler, daemon.socket, group_name("late"))


def _object_calls_differ(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        g.barrier()
        with pytest.raises(deval.Mismatch) as e:
            if rank == 0:
                g.gather_object(["a"])
            else:
                g.broadcast_object({"b": 1})
        return str(e.value)


def test_messages_name_the_calls_python_made(daemon):
    """libdeval names its C calls; the exception names the Group methods the ranks called."""
    for msg in run_ranks(2, _object_calls_differ, daemon.socket, group_name("pywords")):
        assert "rank 0 called gather_object, rank 1 called broadcast_object" in msg, msg
        assert msg.startswith(("Group.gather_object: collective #2",
                               "Group.broadcast_object: collective #2")), msg
        assert "deval_" not in msg and "_bytes" not in msg and "gather_objects" not in msg, msg


def _loop_meets_a_barrier(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        with pytest.raises(deval.Mismatch) as e:
            if rank == 0:
                for _ in g.eval_loop([np.zeros(2)], num_samples=2, order="rank"):
                    pass
            else:
                g.barrier()
        return str(e.value)


def test_eval_loop_says_its_own_reduce_is_its(daemon):
    """eval_loop's check of the loaders is a reduce the user never called: it says eval_loop."""
    msg = run_ranks(2, _loop_meets_a_barrier, daemon.socket, group_name("loopwords"))[0]
    assert msg.startswith("Group.eval_loop (its reduce that checks"), msg


def _calls_counted(rank, world, sock, name):
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        # rank 0's loader has 3 batches, rank 1's 1: rank 1 replays 2. Then one more pass.
        batches = [np.array([k], dtype=np.int64) for k in ((0, 1, 2) if rank == 0 else (3,))]
        for b in g.eval_loop(batches, num_samples=4, order="rank"):
            g.gather_for_metrics(b)
            g.gather_for_metrics(b * 2)
        with g.eval_pass(2):
            g.gather_for_metrics(np.array([rank]))
        g.gather(np.zeros(1))
        with pytest.raises(deval.Mismatch) as e:
            g.reduce(np.zeros(2 + rank))
        return str(e.value)


def test_messages_count_the_calls_the_user_made(daemon):
    """A failure names the user's call by its count: 6 gathers in the loop (4 of them replayed
    on rank 1), 1 in the pass, 1 gather, then the reduce, #9; the passes' own steps (their
    begin, the loader check, their end) are not the user's calls."""
    for msg in run_ranks(2, _calls_counted, daemon.socket, group_name("calls")):
        assert msg.startswith("Group.reduce: collective #9 (reduce): "), msg


# ---- torch ---------------------------------------------------------------------------------

def _torch_ranks(rank, world, sock, name):
    import torch
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = torch.arange(2 * (2 + rank), dtype=torch.float32).reshape(2, 2 + rank)
        out = g.gather({"x": x, "b": torch.ones(2, dtype=torch.bfloat16) * rank})
        assert isinstance(out["x"], torch.Tensor) and out["x"].shape == (2 * world, 1 + world)
        assert out["b"].dtype == torch.bfloat16
        assert out["b"].tolist() == [r for r in range(world) for _ in range(2)]
        assert torch.equal(out["x"][:2, :2], x[:, :2]) if rank == 0 else True
        assert g.reduce(torch.tensor([1.0]), "sum").item() == world
    return True


def test_torch_tensors(daemon):
    pytest.importorskip("torch", reason="torch is not installed")
    run_ranks(2, _torch_ranks, daemon.socket, group_name("torch"))


def _torch_cuda(rank, world, sock, name):
    import torch
    if not torch.cuda.is_available():  # asked here: CUDA must stay untouched in the parent
        return "no CUDA device"
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        x = torch.full((2, 1 + rank), float(rank), device="cuda")
        out = g.gather(x, pad_index=-1)
        assert out.device == x.device and out.shape == (2 * world, world)
        assert g.reduce(torch.ones(3, device="cuda"), "sum").tolist() == [world] * 3
    return True


def test_torch_cuda_tensors(daemon):
    pytest.importorskip("torch", reason="torch is not installed")
    results = run_ranks(2, _torch_cuda, daemon.socket, group_name("torchcuda"))
    if results[0] != True:  # noqa: E712
        pytest.skip(results[0])
    assert results == [True, True]


def _join_twice(rank, world, sock, name):
    """A helper joins again while the process holds its group, one rank 2 s late: the same
    group comes back; libdeval's own second join fails at once instead of waiting."""
    import ctypes
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    if rank == 1:
        time.sleep(2)
    t0 = time.monotonic()
    again = deval.join(name, rank, world, socket=sock, timeout=20)
    opts = deval._JoinOpts()
    opts.socket_path = sock.encode()
    h = ctypes.c_void_p()
    r = deval._lib.deval_join(name.encode(), rank, world, ctypes.byref(opts), ctypes.byref(h))
    said = deval._lib.deval_errmsg(None).decode()
    took = time.monotonic() - t0
    out = again.gather(np.array([rank]))
    g.leave()
    return again is g, r, said, took, out.tolist()


def test_joining_twice(daemon):
    res = run_ranks(2, _join_twice, daemon.socket, group_name("twice"), timeout=60)
    for same, r, said, took, out in res:
        assert same and out == [0, 1]
        assert r == deval.InvalidArgument.status and "already holds group" in said
        assert took < 1.0


def test_a_devald_of_another_version_is_named(tmp_path):
    """A devald that speaks another protocol (one started before an upgrade, still running)
    answers a join with its own version: the error says so, not that it hung up."""
    import socket
    import struct
    import threading
    path = str(tmp_path / "old.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(1)

    def answer():
        c, _ = srv.accept()
        c.recv(4096)
        # an old devald's DvReply: its version, DV_MSG_REPLY, a failure, its words
        c.send(struct.pack("<IIiI", 11, 6, -9, 0).ljust(600, b"\0"))
        c.close()

    t = threading.Thread(target=answer)
    t.start()
    with pytest.raises(deval.ProtocolError, match="speaks protocol version 11, this libdeval"):
        deval.join(group_name("old"), 0, 1, socket=path, timeout=5)
    t.join()
    srv.close()
