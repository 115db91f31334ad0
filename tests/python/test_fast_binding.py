# SPDX-License-Identifier: MIT
"""The binding's quick path for plain gathers (CPU torch tensors and numpy arrays, alone or
in one flat tuple, list or dict) against the general path and against numpy itself: the
same values, dtypes, kinds and structures, copies the caller owns, and every input it does
not take (non-contiguous, nested, on another device, a namedtuple) still right."""

import collections

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks

torch = pytest.importorskip("torch")

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


def _plain(rank, world, sock, name):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
        assert g._fast is not None
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


def test_plain_inputs(daemon):
    assert run_ranks(3, _plain, daemon.socket, group_name("fastpy")) == [True] * 3


def _others(rank, world, sock, name):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
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
        # a wrong input is named by the general path, whichever way it came in
        with pytest.raises(deval.InvalidArgument, match="dtype"):
            g.gather(np.zeros(2, dtype=np.complex64))
        g.barrier()
    return True


def test_other_inputs(daemon):
    assert run_ranks(3, _others, daemon.socket, group_name("slowpy")) == [True] * 3


def _in_pass(rank, world, sock, name):
    d = rank_data(rank)
    with deval.join(name, rank, world, socket=sock, timeout=20) as g:
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


def test_in_a_pass(daemon):
    assert run_ranks(2, _in_pass, daemon.socket, group_name("passpy")) == [True] * 2
