# SPDX-License-Identifier: MIT
"""The binding's quick paths for plain gathers (CPU torch tensors and numpy arrays, alone or
in one flat tuple, list or dict), in C (deval._speed) and through ctypes, against the
general path and against numpy itself: the same values, dtypes, kinds and structures,
copies the caller owns, and every input they do not take (non-contiguous, nested, on
another device, a namedtuple) still right. deval._speed alone, with a stand-in for
libdeval: what it sends, a malformed result, a failed call, a dict changed while the call
waits, and the memory of its results given back."""

import collections
import ctypes
import glob
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

import deval
from conftest import ROOT, group_name, run_ranks

torch = pytest.importorskip("torch")

# the C path where it is built, and the ctypes path always
PATHS = ["c", "ctypes"] if deval._speed is not None else ["ctypes"]


def use_path(g, path):
    if path == "ctypes":
        g._fast = deval._Fast()  # what a build without the extension does
    else:
        assert g._fast is deval._speed, "the C path was expected"

Pair = collections.namedtuple("Pair", "x y")


def rank_data(rank):
    rows = 2 + rank  # ragged: each rank its own number of rows
    g = np.random.default_rng(rank)
    return {
        "f32": g.random((rows, 3), dtype=np.float32),
        "i64": np.arange(rows, dtype=np.int64) + 100 * rank,
        "bool": g.random(rows) > 0.5,
        "f16": g.random((rows, 2)).astype(np.float16),
        "u8": np.full((rows, 4), rank, dtype=np.uint8),
    }


def want(world, key):
    return np.concatenate([rank_data(r)[key] for r in range(world)])


def _plain(rank, world, sock, name, path):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        assert g._fast is not None
        use_path(g, path)
        # numpy, in a tuple, a list and a dict, and alone
        out = g.gather_for_metrics(tuple(d.values()))
        assert type(out) is tuple and len(out) == len(d)
        for k, a in zip(d, out):
            assert type(a) is np.ndarray and a.dtype == d[k].dtype and a.flags.writeable
            np.testing.assert_array_equal(a, want(world, k))
        out = g.gather(list(d.values()))
        assert type(out) is list
        out = g.gather_for_metrics(d)
        assert type(out) is dict and list(out) == list(d)
        for k in d:
            np.testing.assert_array_equal(out[k], want(world, k))
        np.testing.assert_array_equal(g.gather(d["f32"]), want(world, "f32"))
        # torch: every dtype back as the same torch dtype, bfloat16 included
        t = {k: torch.from_numpy(v) for k, v in d.items()}
        t["bf16"] = torch.from_numpy(d["f32"]).to(torch.bfloat16)
        t["grad"] = torch.from_numpy(d["f32"]).clone().requires_grad_(True)
        out = g.gather_for_metrics(t)
        for k, v in out.items():
            assert isinstance(v, torch.Tensor) and v.dtype == t[k].dtype, k
            ref = torch.cat([torch.from_numpy(rank_data(r)["f32" if k in ("bf16", "grad")
                                                         else k]) for r in range(world)])
            if k == "bf16":
                ref = ref.to(torch.bfloat16)
            assert torch.equal(v, ref), k
        # a result is the caller's: later calls do not change it, writing it changes nothing
        first = g.gather(d["i64"])
        keep = first.copy()
        first[:] = -1
        again = g.gather(d["i64"] * 0)
        np.testing.assert_array_equal(g.gather(d["i64"]), keep)
        assert (again == 0).all()
    return True


@pytest.mark.parametrize("path", PATHS)
def test_plain_inputs(daemon, path):
    assert run_ranks(3, _plain, daemon.socket, group_name("fastpy"), path) == [True] * 3


def _others(rank, world, sock, name, path):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        use_path(g, path)
        # not plain: each goes the general way, with the same answers
        wide = np.asfortranarray(np.tile(d["f32"], (1, 2)))  # not C-contiguous
        np.testing.assert_array_equal(
            g.gather(wide), np.concatenate([np.tile(rank_data(r)["f32"], (1, 2))
                                            for r in range(world)]))
        tt = torch.from_numpy(np.tile(d["f32"], (1, 2)))[:, :3]  # a strided torch view
        assert not tt.is_contiguous()
        assert torch.equal(g.gather(tt), torch.from_numpy(want(world, "f32")))
        p = g.gather(Pair(d["i64"], d["u8"]))
        assert type(p) is Pair
        np.testing.assert_array_equal(p.x, want(world, "i64"))
        nested = g.gather_for_metrics({"a": (d["i64"], [d["u8"]])})
        np.testing.assert_array_equal(nested["a"][1][0], want(world, "u8"))
        ro = d["i64"].copy()
        ro.flags.writeable = False  # a read-only array is plain too
        np.testing.assert_array_equal(g.gather(ro), want(world, "i64"))
        assert g.gather(3.5).tolist() == [3.5] * world
        empty = np.zeros((0, 3), dtype=np.float32) if rank == 1 else d["f32"]
        got = g.gather(empty)
        assert got.shape == (sum(2 + r for r in range(world) if r != 1), 3)
        # torch's negative bit (z.conj().imag): the memory holds -imag; contiguous (plain)
        # where it has one element, or made so (torch._neg_view)
        def negs(a):
            return [(torch.from_numpy(a) * 1j).conj().imag,
                    (torch.from_numpy(a[:1, 0]) * 1j).conj().imag,  # (a last batch of 1)
                    torch._neg_view(torch.from_numpy(a))]
        for i, im in enumerate(negs(d["f32"])):
            assert im.is_neg() and im.is_contiguous() == (i > 0)
            ref = torch.cat([negs(rank_data(r)["f32"])[i].resolve_neg() for r in range(world)])
            assert (ref <= 0).all() and (ref < 0).any()
            assert torch.equal(g.gather_for_metrics({"im": im})["im"], ref)
            assert torch.equal(g.gather(im), ref)
        # a wrong input is named by the general path, whichever way it came in
        with pytest.raises(deval.InvalidArgument, match="dtype"):
            g.gather(np.zeros(2, dtype=np.complex64))
        with pytest.raises(deval.InvalidArgument, match="dtype"):  # (torch's own error)
            g.gather(torch.ones(2, dtype=torch.complex64).conj())
        g.barrier()
    return True


@pytest.mark.parametrize("path", PATHS)
def test_other_inputs(daemon, path):
    assert run_ranks(3, _others, daemon.socket, group_name("slowpy"), path) == [True] * 3


def _keys_by_name(rank, world, sock, name, path):
    """Each rank builds its dict in another order of its keys (from a set, whose order
    differs by process): each tensor meets the one of its name, and each rank's result keeps
    its own order. Before, the tensors met by place: rank 1's labels with rank 0's preds."""
    names = ["preds", "labels", "ids"]
    mine = names[rank % 3:] + names[:rank % 3]
    part = {"preds": np.arange(2, dtype=np.int64) + 10 * rank,
            "labels": np.arange(2, dtype=np.int64) + 100 + 10 * rank,
            "ids": np.arange(2, dtype=np.int64) + 1000 + 10 * rank}
    x = {k: part[k] for k in mine}
    want = {k: [int(v) + 10 * r for r in range(world) for v in part[k] - 10 * rank]
            for k in names}
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        use_path(g, path)
        outs = [g.gather(x), g.gather(x, copy=False), g.gather_for_metrics(x),
                g.gather({k: torch.from_numpy(v) for k, v in x.items()})]
        with g.eval_pass(2 * world):
            outs.append(g.gather_for_metrics(x))
        for out in outs:
            assert list(out) == mine, list(out)
            assert {k: np.asarray(v).tolist() for k, v in out.items()} == want, out
        total = g.reduce({k: v.astype(np.float64) for k, v in x.items()})
        assert {k: total[k].tolist() for k in names} == {
            k: [float(sum(w[j::2])) for j in range(2)] for k, w in want.items()}
    return True


@pytest.mark.parametrize("path", PATHS)
def test_a_dict_s_tensors_meet_by_name(daemon, path):
    assert run_ranks(3, _keys_by_name, daemon.socket, group_name("keys"), path) == [True] * 3


def _other_names(rank, world, sock, name, path):
    """A dict with a key of another name on rank 1 (as many tensors, alike): every rank's
    call fails with Mismatch, by the fast path or the general one (a non-contiguous tensor on
    rank 2), instead of pairing rank 1's "b" with the others' "c"."""
    x = np.arange(4, dtype=np.int64).reshape(2, 2) + 10 * rank
    y = np.ascontiguousarray(x[:, ::-1]) if rank != 2 else x[:, ::-1]
    mine = {"a": x, "b" if rank == 1 else "c": y}
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        use_path(g, path)
        for call in (lambda v: g.gather(v), lambda v: g.gather_for_metrics(v)):
            with pytest.raises(deval.Mismatch, match="names of the call"):
                call(mine)
            # names that agree, digested by _speed.c on ranks 0 and 1 and by _nest on rank 2
            same = call({"a": x, "c": y})
            assert same["a"].tolist() == [[v + 10 * r for v in row] for r in range(world)
                                          for row in ([0, 1], [2, 3])]
    return True


@pytest.mark.parametrize("path", PATHS)
def test_a_dict_s_tensors_of_other_names_fail_on_every_rank(daemon, path):
    assert run_ranks(3, _other_names, daemon.socket, group_name("names"), path) == [True] * 3


def _in_pass(rank, world, sock, name, path):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        use_path(g, path)
        n = sum(2 + r for r in range(world)) - 1  # the last sample is a duplicate
        with g.eval_pass(n):
            out = g.gather_for_metrics((torch.from_numpy(d["f32"]), d["i64"]))
            assert len(out[0]) == n and len(out[1]) == n
            assert isinstance(out[0], torch.Tensor) and type(out[1]) is np.ndarray
        with g.eval_pass(n + 1):
            # in a pass every tensor of a call is per sample: rows that differ are refused
            with pytest.raises(deval.InvalidArgument, match="rows"):
                g.gather_for_metrics((d["f32"], d["i64"][:1]))
            g.gather_for_metrics((d["f32"], d["i64"]))
    return True


@pytest.mark.parametrize("path", PATHS)
def test_in_a_pass(daemon, path):
    assert run_ranks(2, _in_pass, daemon.socket, group_name("passpy"), path) == [True] * 2


def _kinds(rank, world, sock, name, path):
    """Every dtype, 0-d and empty tensors, a Parameter, options that leave the quick path."""
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        use_path(g, path)
        for dt in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                   torch.float16, torch.bfloat16, torch.float32, torch.float64):
            x = (torch.arange(6).reshape(2, 3) + 10 * rank).to(dt)
            out = g.gather(x)
            assert out.dtype == dt and out.shape == (2 * world, 3) and out.is_contiguous()
            assert torch.equal(out, torch.cat([(torch.arange(6).reshape(2, 3) + 10 * r)
                                               .to(dt) for r in range(world)]))
            n = x.numpy() if dt != torch.bfloat16 else None
            if n is not None:
                got = g.gather(n)
                assert got.dtype == n.dtype
                np.testing.assert_array_equal(got, out.numpy())
        assert g.gather(torch.tensor(rank + 0.5)).tolist() == [r + 0.5 for r in range(world)]
        assert g.gather(np.array(rank)).tolist() == list(range(world))
        assert g.gather(torch.zeros(0, 4)).shape == (0, 4)
        assert g.gather(np.zeros((0,), np.int32)).shape == (0,)
        p = torch.nn.Parameter(torch.full((1, 2), float(rank)))
        out = g.gather_for_metrics(p)
        assert type(out) is torch.Tensor and not out.requires_grad
        assert out[:, 0].tolist() == [float(r) for r in range(world)]
        # the options the quick paths do not take, each still applied
        assert g.gather(np.array([rank]), order="strided").tolist() == list(range(world))
        ragged = np.ones((1, 1 + rank), np.int64)
        assert g.gather(ragged, pad_index=-7)[0].tolist() == [1] + [-7] * (world - 1)
        assert g.gather(ragged, pad_index=5, pad_first=True)[0, 0] == (1 if world == 1 else 5)
        assert g.gather(np.array([rank, rank]), valid_rows=1).tolist() == list(range(world))
        # a pad of -0.0 keeps its sign bit (it equals 0, the quick paths' pad)
        neg = g.gather(np.ones((1, 1 + rank), np.float32), pad_index=-0.0)
        assert world == 1 or np.signbit(neg[0, -1])
        one = g.gather(np.array([rank]), copy=False)
        assert not one.flags.writeable and one.tolist() == list(range(world))
    return True


@pytest.mark.parametrize("path", PATHS)
def test_dtypes_and_options(daemon, path):
    assert run_ranks(2, _kinds, daemon.socket, group_name("kindpy"), path) == [True] * 2


# ---- deval._speed alone, with a stand-in for libdeval ----------------------------------

speed = deval._speed
needs_speed = pytest.mark.skipif(speed is None, reason="deval._speed is not built")
GatherFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                            ctypes.POINTER(deval._Tensor), ctypes.c_void_p,
                            ctypes.POINTER(deval._Tensor))


def fake(body):
    """A deval_gather of our own: body(n, ins, outs) -> status; kept alive by the caller."""
    return GatherFn(lambda g, n, ins, opts, outs: body(n, ins, outs))


def echo(n, ins, outs):
    """Each result is its input, as a one-rank gather gives: libdeval's part, stood in."""
    for i in range(n):
        ctypes.memmove(ctypes.byref(outs[i]), ctypes.byref(ins[i]), ctypes.sizeof(deval._Tensor))
    return 0


def call(fn, x, per_sample=False):
    opts = deval._GatherOpts()
    return speed.gather(ctypes.cast(fn, ctypes.c_void_p).value, 1, x, ctypes.addressof(opts),
                        per_sample)


@needs_speed
def test_extension_describes_and_copies():
    keep = []

    def seen(n, ins, outs):
        for i in range(n):
            keep.append((ins[i].data, ins[i].dtype, ins[i].ndim, tuple(ins[i].shape)))
        return echo(n, ins, outs)

    fn = fake(seen)
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    t = torch.arange(6, dtype=torch.float64).reshape(3, 2)
    out = call(fn, {"a": a, "t": t})
    assert keep[0][:3] == (a.ctypes.data, 4, 2) and keep[0][3][:2] == (3, 4)
    assert keep[1][:3] == (t.data_ptr(), 10, 2) and keep[1][3][:2] == (3, 2)
    assert list(out) == ["a", "t"]
    assert out["a"].ctypes.data != a.ctypes.data and np.array_equal(out["a"], a)
    assert out["t"].data_ptr() != t.data_ptr() and torch.equal(out["t"], t)
    # not plain: None, and nothing sent
    keep.clear()
    for x in ([], (), {}, [a, [a]], a.T, t.T, "text", [a, 3], (a,) * 65,
              np.zeros(2, np.complex64), torch.zeros(2, dtype=torch.complex64)):
        assert call(fn, x) is None
    assert call(fn, (a, a[:2]), per_sample=True) is None
    assert call(fn, np.array(1.0), per_sample=True) is None
    assert keep == []
    # a status is returned for the binding to raise with libdeval's message
    assert call(fake(lambda n, ins, outs: -4), (a,)) == -4


@needs_speed
def test_extension_refuses_malformed_results():
    a = np.arange(4, dtype=np.float32)

    def bad(field, value):
        def body(n, ins, outs):
            echo(n, ins, outs)
            if field == "shape":
                outs[0].shape[0] = value
            else:
                setattr(outs[0], field, value)
            return 0
        return fake(body)

    for field, value in (("dtype", 6), ("ndim", 9), ("ndim", -1), ("shape", -1),
                         ("shape", 2**62), ("data", None)):
        with pytest.raises(deval.ProtocolError, match="malformed result for tensor 0") as e:
            call(bad(field, value), (a,))
        assert e.value.status == -8


@needs_speed
def test_extension_holds_what_it_was_given():
    """The GIL is released while the ranks wait: another thread may change the caller's
    dict or drop its tensors meanwhile; the results keep the keys and inputs of the call."""
    d = {"x": np.arange(3), "y": torch.ones(2)}

    def meddle(n, ins, outs):
        d.clear()
        d["z"] = 0
        return echo(n, ins, outs)

    x = np.arange(5)
    before = sys.getrefcount(x)
    out = call(fake(meddle), d)
    assert list(out) == ["x", "y"] and out["x"].tolist() == [0, 1, 2]
    assert sys.getrefcount(x) == before
    for _ in range(100):  # no reference kept, none dropped
        call(fake(meddle), (x, x))
    assert sys.getrefcount(x) == before


@needs_speed
def test_extension_results_give_their_memory_back():
    big = torch.zeros(1 << 18)  # 1 MiB
    arr = np.zeros(1 << 18, np.float32)
    fn = fake(echo)
    for _ in range(50):
        call(fn, (big, arr))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(2000):  # 4 GB of results if they were kept
        call(fn, (big, arr))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 * 1024  # KiB


def test_extension_is_used_where_built():
    """A build that made _speed beside libdeval gets it; DEVAL_PYTHON_EXTENSION=0 does not."""
    here = os.path.dirname(os.path.abspath(deval._lib.deval_path))
    if not glob.glob(os.path.join(here, "_speed.*.so")):
        pytest.skip("no _speed built beside %s" % here)
    probe = "import deval; print(deval._speed is not None)"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for value, want_ in (("1", "True"), ("0", "False")):
        env["DEVAL_PYTHON_EXTENSION"] = value
        got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert got == want_, value
