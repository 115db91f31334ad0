# SPDX-License-Identifier: MIT
"""eval_loop over ranks that each read a part of their own of one dataset: a Subset (strided,
contiguous, nested), a ConcatDataset of Subsets, a `datasets` shard. A part says where its
samples lie in the dataset it was cut from, so every sample is named by that one's index,
whichever rank reads it: each comes back once, in the dataset's order, as one process reading
the whole dataset gets it. Before, each rank's keys were its own part's indices: they
collided, and the loop raised InvalidArgument ("every rank must read the whole dataset").
Ranks that read one dataset alike (a DistributedSampler's, one Subset shared) are unchanged:
results in that dataset's own order."""

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks

torch = pytest.importorskip("torch")
from torch.utils.data import (ConcatDataset, DataLoader, DistributedSampler,  # noqa: E402
                              Sampler, Subset, TensorDataset)


def dataset(n):
    x = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4).cos()
    return TensorDataset(torch.arange(n), x)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).eval()


def order(n, seed=3):
    """A fixed shuffle of range(n): parts whose samples are not in the dataset's order."""
    return np.random.RandomState(seed).permutation(n).tolist()


def contiguous(n, world, rank):
    """Rank's block of range(n), as datasets' shard(contiguous=True) cuts it: the first
    n % world blocks one longer."""
    div, mod = divmod(n, world)
    start = div * rank + min(rank, mod)
    return range(start, start + div + (rank < mod))


class Chunk(Sampler):
    """A contiguous chunk of range(n) per rank (a sampler deval does not know)."""

    def __init__(self, n, world, rank):
        self.idx = list(contiguous(n, world, rank))

    def __iter__(self):
        return iter(self.idx)

    def __len__(self):
        return len(self.idx)


def part(kind, ds, n, world, rank):
    """This rank's loader dataset and sampler for kind, and what eval_loop is told."""
    if kind == "strided":  # the reported loop
        return Subset(ds, range(rank, n, world)), None, dict(num_samples=n, order="strided")
    if kind == "contiguous":
        return Subset(ds, contiguous(n, world, rank)), None, dict(num_samples=n)
    if kind == "nested":  # a part of a reversed whole
        rev = Subset(ds, list(range(n - 1, -1, -1)))
        return Subset(rev, range(rank, n, world)), None, dict(num_samples=n)
    if kind == "concat":  # the rank's samples in two Subsets, neither in dataset order
        mine = [i for i in order(n) if i % world == rank]
        half = len(mine) // 2
        return ConcatDataset([Subset(ds, mine[:half]), Subset(ds, mine[half:])]), None, \
            dict(num_samples=n)
    if kind == "shuffled":  # a part read in a random order
        return Subset(ds, range(rank, n, world)), "shuffle", dict(num_samples=n)
    if kind == "distributed":  # a DistributedSampler over the whole dataset: as before
        return ds, DistributedSampler(ds, world, rank, shuffle=False), {}
    raise AssertionError(kind)


def rank_parts(rank, world, sock, name, kind, n, bs):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    m = model()
    data, sampler, told = part(kind, dataset(n), n, world, rank)
    if sampler == "shuffle":
        torch.manual_seed(rank)
        dl = DataLoader(data, batch_size=bs, shuffle=True)
    else:
        dl = DataLoader(data, batch_size=bs, sampler=sampler)
    return evaluate(g, g.eval_loop(dl, **told), m, lambda b: (b[1], b[0]))


def evaluate(g, loop, m, fields):
    """Each batch's logits, dataset indices and names gathered: (indices, logits, names), or
    (the error's class name, its words); fields(batch) gives the batch's (x, idx)."""
    idx_out, logits_out, names = [], [], []
    try:
        for batch in loop:
            x, idx = fields(batch)
            with torch.no_grad():
                logits = m(x)
            out_logits, out_idx = g.gather_for_metrics((logits, idx))
            names += g.gather_for_metrics(["s%d" % i for i in idx.tolist()])
            idx_out.append(out_idx)
            logits_out.append(out_logits)
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return torch.cat(idx_out).tolist(), torch.cat(logits_out).numpy(), names


def single_process(n):
    """What one process reading the whole dataset gets: every sample, in order."""
    ds, m = dataset(n), model()
    with torch.no_grad():
        return m(ds.tensors[1]).numpy()


def check_whole(res, n, in_order):
    """Every rank got every sample once, each with its own rows (each call returns its
    samples in dataset order; where each round of batches holds consecutive samples, as a
    strided sharding's does, so does the whole loop)."""
    want = single_process(n)
    for rank, got in enumerate(res):
        assert isinstance(got[0], list), "rank %d: %s" % (rank, got)
        idx, logits, names = got
        assert sorted(idx) == list(range(n)), "rank %d: samples %s" % (rank, idx)
        if in_order:
            assert idx == list(range(n)), "rank %d: not in dataset order: %s" % (rank, idx)
        # (batches of other sizes round the matmul otherwise: a few ulps, not another sample)
        np.testing.assert_allclose(logits, want[idx], rtol=1e-5, atol=1e-6,
                                   err_msg="rank %d" % rank)
        assert names == ["s%d" % i for i in idx], "rank %d: %s" % (rank, names)
    assert all(r[0] == res[0][0] for r in res), "ranks disagree"


@pytest.mark.parametrize("kind", ["strided", "contiguous", "nested", "concat", "shuffled",
                                  "distributed"])
@pytest.mark.parametrize("n,bs,world", [(11, 2, 2), (11, 2, 3), (13, 3, 3)])
def test_parts_of_one_dataset_give_it_whole(daemon, kind, n, bs, world):
    res = run_ranks(world, rank_parts, daemon.socket, group_name("parts"), kind, n, bs)
    check_whole(res, n, kind in ("strided", "distributed"))


def rank_shared(rank, world, sock, name, n, m, bs, how):
    """Every rank reads the same Subset (a random_split's): its own order is the result's."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    sub = Subset(dataset(n), order(n)[:m])
    if how == "chunks":
        dl, told = DataLoader(sub, batch_size=bs, sampler=Chunk(m, world, rank)), \
            dict(num_samples=m)
    elif how == "parts":  # each rank a strided part of the split, not of the dataset
        dl, told = DataLoader(Subset(sub, range(rank, m, world)), batch_size=bs), \
            dict(num_samples=m, order="strided")
    else:
        dl, told = DataLoader(sub, batch_size=bs,
                              sampler=DistributedSampler(sub, world, rank, shuffle=False)), {}
    got = [g.gather_for_metrics(idx).tolist() for idx, _ in g.eval_loop(dl, **told)]
    g.leave()
    return got


@pytest.mark.parametrize("how", ["chunks", "distributed", "parts"])
@pytest.mark.parametrize("world", [2, 3])
def test_one_subset_on_every_rank_keeps_its_order(daemon, how, world):
    """A split of a dataset (a random_split's Subset) comes back in its own order, as one
    process reads it: where every rank reads it, and where each reads a part of it (its
    samples named by their place in the split, the ranks' nearest common dataset, not in the
    dataset the split was cut from: that gave each round in the dataset's order)."""
    n, m = 15, 10
    want = [int(i) for i in dataset(n).tensors[0][order(n)[:m]]]  # one process over the Subset
    place = {v: k for k, v in enumerate(want)}
    for calls in run_ranks(world, rank_shared, daemon.socket, group_name("shared"), n, m, 3,
                           how):
        got = [v for c in calls for v in c]
        assert sorted(got) == sorted(want), got
        # each call in the Subset's order (not the parent's); a strided sharding's whole loop
        assert all([place[v] for v in c] == sorted(place[v] for v in c) for c in calls), calls
        if how != "chunks":
            assert got == want, got


# ---- `datasets` shards -------------------------------------------------------------------

def hf_part(kind, path, n, world, rank):
    import datasets
    from datasets.distributed import split_dataset_by_node
    whole = datasets.load_from_disk(path) if kind.startswith("disk") else \
        datasets.Dataset.from_dict(hf_columns(n))
    if kind in ("memory-strided", "disk-strided"):
        shard = whole.shard(num_shards=world, index=rank, contiguous=False)
    elif kind in ("memory-contiguous", "disk-contiguous"):
        shard = whole.shard(num_shards=world, index=rank)
    elif kind == "disk-by-node":
        shard = split_dataset_by_node(whole, rank=rank, world_size=world)
    elif kind == "memory-shuffled":  # an indices mapping: a shuffled dataset's contiguous shard
        shard = whole.shuffle(seed=5).shard(num_shards=world, index=rank)
    else:
        raise AssertionError(kind)
    return shard.with_format("torch")


def hf_columns(n):
    return {"i": np.arange(n), "x": dataset(n).tensors[1].numpy()}


def rank_hf(rank, world, sock, name, kind, path, n, bs):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    m = model()
    dl = DataLoader(hf_part(kind, path, n, world, rank), batch_size=bs)
    return evaluate(g, g.eval_loop(dl, num_samples=n), m, lambda b: (b["x"], b["i"]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Datasets of 11 and 13 rows saved to disk: loaded back, their tables are memory-mapped,
    and record their slices."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    for n in (11, 13):
        datasets.Dataset.from_dict(hf_columns(n)).save_to_disk(str(root / str(n)))
    return root


@pytest.mark.parametrize("kind", ["memory-strided", "disk-strided", "disk-contiguous",
                                  "disk-by-node", "memory-shuffled"])
@pytest.mark.parametrize("n,bs,world", [(11, 2, 2), (13, 2, 3)])
def test_datasets_shards_give_the_dataset_whole(daemon, saved, kind, n, bs, world):
    res = run_ranks(world, rank_hf, daemon.socket, group_name("hf"), kind,
                    str(saved / str(n)), n, bs)
    check_whole(res, n, kind.endswith("strided"))


def test_a_contiguous_shard_held_in_memory_is_refused_on_every_rank(daemon, saved):
    # its table does not record where it begins: a dataset of its own on each rank
    res = run_ranks(3, rank_hf, daemon.socket, group_name("hfmem"), "memory-contiguous",
                    str(saved / "13"), 13, 2)
    for rank, (kind, what) in enumerate(res):
        assert kind in ("InvalidArgument", "Mismatch"), (rank, kind, what)
        assert "every rank must read the whole dataset" in what, (rank, what)
