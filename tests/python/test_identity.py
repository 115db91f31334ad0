# SPDX-License-Identifier: MIT
"""eval_loop over torch DataLoaders of map-style datasets: every batch's dataset indices travel
with its gathers, so what comes back is each sample once, identified, against the same loop
run in one process, whatever shifted the rows. Each loop here returned a wrong result without
an error while the pass counted rows by position: a batch peeked before the loop, a sampler
of contiguous chunks, generation's k rows per sample, a rank that left early; flattened
tokens were cut at the wrong rows."""

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset  # noqa: E402

K = 3  # generated sequences per sample


def dataset(n):
    x = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4).sin()
    return TensorDataset(torch.arange(n), x)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 5).eval()


class Contiguous(Sampler):
    """A contiguous chunk of the dataset per rank, the last one padded from the start (what
    transformers' SequentialDistributedSampler dealt)."""

    def __init__(self, n, world, rank):
        per = -(-n // world)
        idx = list(range(n)) + list(range(per * world - n))
        self.idx = idx[rank * per:(rank + 1) * per]

    def __iter__(self):
        return iter(self.idx)

    def __len__(self):
        return len(self.idx)


def loader(kind, n, world, rank, bs):
    ds = dataset(n)
    if kind.startswith("contiguous"):
        return DataLoader(ds, batch_size=bs, sampler=Contiguous(n, world, rank))
    shuffle = kind in ("shuffled", "workers")
    s = DistributedSampler(ds, world, rank, shuffle=shuffle, seed=7)
    if kind == "workers":
        return DataLoader(ds, batch_size=bs, sampler=s, num_workers=2)
    if kind == "one-by-one":
        return DataLoader(ds, batch_size=None, sampler=s)
    return DataLoader(ds, batch_size=bs, sampler=s)


def body(g, idx, x, m):
    """One batch of an evaluation with generation: logits, k sequences per sample in a call
    of their own, and k texts per sample."""
    with torch.no_grad():
        logits = m(x)
    if idx.dim() == 0:  # batch_size=None: one sample, no batch dim
        idx, logits = idx[None], logits[None]
    gen = idx.repeat_interleave(K)[:, None] * 10 + torch.arange(K).repeat(len(idx))[:, None]
    out_logits, out_idx = g.gather_for_metrics((logits, idx))
    out_gen = g.gather_for_metrics(gen)
    texts = g.gather_for_metrics(["%d/%d" % (int(i), j) for i in idx for j in range(K)])
    return out_idx, out_logits, out_gen, texts


def rank_loop(rank, world, sock, name, kind, n, bs):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    m = model()
    if kind == "workers":  # the suite's ranks are daemonic processes, which may not fork
        import multiprocessing
        multiprocessing.current_process()._config["daemon"] = False
    dl = loader(kind, n, world, rank, bs)
    if kind == "peek" and rank == 0:
        next(iter(dl))  # a look at the data first, as people do
    got = [[], [], [], []]
    # a loader it does not know: how many samples the ranks hold together (order, which the
    # error used to ask for too, is only checked)
    told = dict(num_samples=n, order="rank") if kind == "contiguous-told" else \
        dict(num_samples=n) if kind == "contiguous" else {}
    for idx, x in g.eval_loop(dl, **told):
        for acc, part in zip(got, body(g, idx, x, m)):
            acc.append(part)
    g.leave()
    idx = torch.cat(got[0])
    return (idx.tolist(), torch.cat(got[1]).numpy(), torch.cat(got[2]).squeeze(1).tolist(),
            [t for ts in got[3] for t in ts])


def single_process(n):
    ds, m = dataset(n), model()
    with torch.no_grad():
        logits = m(ds.tensors[1])
    return logits.numpy()


@pytest.mark.parametrize("kind", ["strided", "shuffled", "peek", "contiguous",
                                  "contiguous-told", "workers", "one-by-one"])
@pytest.mark.parametrize("n,bs,world", [(11, 2, 2), (11, 2, 3), (10, 3, 4)])
def test_each_sample_once_by_its_index(daemon, kind, n, bs, world):
    if kind == "workers" and world == 4:
        pytest.skip("2 workers per rank at 4 ranks: more processes than the suite needs")
    res = run_ranks(world, rank_loop, daemon.socket, group_name("ident"), kind, n, bs)
    want = single_process(n)
    for rank, (idx, logits, gen, texts) in enumerate(res):
        assert sorted(idx) == list(range(n)), "rank %d: samples %s" % (rank, idx)
        # (batches of other sizes round the matmul otherwise: a few ulps, not another sample)
        np.testing.assert_allclose(logits, want[idx], rtol=1e-5, atol=1e-6,
                                   err_msg="rank %d" % rank)
        assert gen == [i * 10 + j for i in idx for j in range(K)], "rank %d" % rank
        assert texts == ["%d/%d" % (i, j) for i in idx for j in range(K)], "rank %d" % rank
        if kind in ("strided", "peek", "one-by-one"):  # each call's samples follow the last's
            assert idx == list(range(n)), "rank %d: not in dataset order: %s" % (rank, idx)
    assert all(r[0] == res[0][0] for r in res), "ranks disagree"


def rank_flat(rank, world, sock, name, n):
    """Token predictions flattened across the batch's samples: their rows are no samples."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    dl = loader("strided", n, world, rank, 2)
    try:
        for idx, _ in g.eval_loop(dl):
            toks = torch.cat([torch.full((int(i) % 3 + 1,), int(i)) for i in idx])
            g.gather_for_metrics(toks)
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return None, None


def test_flattened_tokens_are_refused_on_every_rank(daemon):
    res = run_ranks(2, rank_flat, daemon.socket, group_name("flat"), 8)
    kinds = [k for k, _ in res]
    assert set(kinds) <= {"InvalidArgument", "Mismatch"} and None not in kinds, res
    said = " ".join(m for _, m in res)
    assert "whole number of rows per sample" in said or "rows per sample" in said, said


def rank_raises(rank, world, sock, name, n, how):
    """Rank 1's body raises in its second batch, or breaks out of the loop there; the others
    go on."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    dl = loader("strided", n, world, rank, 2)
    out = []
    try:
        for k, (idx, _) in enumerate(g.eval_loop(dl)):
            if rank == 1 and k == 1:
                if how == "break":
                    break
                raise KeyError("a bug in rank 1's body")
            out.append(g.gather_for_metrics(idx))
        if how == "break":  # the rank that broke out hears of it at its next call
            g.gather(torch.tensor([rank]))
    except KeyError as e:
        return "KeyError", str(e)
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "ok", torch.cat(out).tolist()


@pytest.mark.parametrize("world,how", [(2, "raise"), (3, "raise"), (3, "break")])
def test_a_rank_that_leaves_fails_the_others(daemon, world, how):
    res = run_ranks(world, rank_raises, daemon.socket, group_name("leave"), 12, how)
    for rank, (kind, what) in enumerate(res):
        if rank == 1 and how == "raise":
            assert kind == "KeyError", what
        else:
            assert kind == "Mismatch", (rank, kind, what)
            assert "rank 1 (pid" in what and "left the eval pass during its batch 2" in what, \
                what


def rank_break_all(rank, world, sock, name, n):
    """Every rank stops after two batches, as a quick look at a few batches does."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    out = []
    for k, (idx, _) in enumerate(g.eval_loop(loader("strided", n, world, rank, 2))):
        if k == 2:
            break
        out.append(g.gather_for_metrics(idx))
    after = g.gather(torch.tensor([rank]))
    g.leave()
    return torch.cat(out).tolist(), after.tolist()


def test_every_rank_leaving_at_one_batch_ends_the_pass(daemon):
    res = run_ranks(3, rank_break_all, daemon.socket, group_name("breakall"), 30)
    for got, after in res:
        assert got == list(range(12)) and after == [0, 1, 2]


def rank_model_output(rank, world, sock, name):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    from transformers.modeling_outputs import SequenceClassifierOutput
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    out = SequenceClassifierOutput(logits=torch.full((2, 3), float(rank)))
    got = g.gather_for_metrics(out)
    g.leave()
    return type(got).__name__, got.logits.tolist(), list(got.keys())


def test_a_model_output_comes_back_as_one(daemon):
    pytest.importorskip("transformers")
    res = run_ranks(2, rank_model_output, daemon.socket, group_name("modelout"))
    for kind, logits, keys in res:
        assert kind == "SequenceClassifierOutput" and keys == ["logits"]
        assert logits == [[0.0] * 3] * 2 + [[1.0] * 3] * 2


def test_import_deval_gives_its_adapters():
    import subprocess
    import sys
    code = ("import sys, deval; m = deval.accelerate, deval.torchmetrics; "
            "print('accelerate' in sys.modules, 'torchmetrics' in sys.modules, "
            "'torch' in sys.modules)")
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"], out.stdout


def rank_drop_last(rank, world, sock, name, n, bs):
    """A DistributedSampler behind a DataLoader that drops each rank's short last batch."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = dataset(n)
    dl = DataLoader(ds, batch_size=bs, drop_last=True,
                    sampler=DistributedSampler(ds, world, rank, shuffle=True, seed=1))
    got = [g.gather_for_metrics(idx) for idx, _ in g.eval_loop(dl)]
    g.leave()
    return torch.cat(got).tolist()


@pytest.mark.parametrize("n,bs,world", [(13, 2, 3), (20, 3, 2)])
def test_dataloader_drop_last_under_a_distributed_sampler(daemon, n, bs, world):
    res = run_ranks(world, rank_drop_last, daemon.socket, group_name("dldrop"), n, bs)
    # what the ranks' loaders keep, dealt as DistributedSampler deals
    kept = set()
    for r in range(world):
        idx = list(DistributedSampler(dataset(n), world, r, shuffle=True, seed=1))
        kept.update(idx[:len(idx) // bs * bs])
    for got in res:
        assert sorted(got) == sorted(kept), got


class RankShard(torch.utils.data.IterableDataset):
    """An iterable dataset sharded by rank but not by DataLoader worker: with 2 workers each
    rank yields its shard twice."""

    def __init__(self, n, world, rank):
        self.idx = list(range(rank, n, world))

    def __iter__(self):
        return iter(self.idx)


def rank_positional(rank, world, sock, name, n, case):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    got = []
    try:
        if case == "two-calls":  # eval_pass counts every call as the next samples
            ds = dataset(n)
            dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank,
                                                                         shuffle=False))
            with g.eval_pass(num_samples=n, order="strided"):
                for idx, x in dl:
                    got.append(g.gather_for_metrics(idx))
                    g.gather_for_metrics(x)
        else:
            import multiprocessing
            multiprocessing.current_process()._config["daemon"] = False
            dl = DataLoader(RankShard(n, world, rank), batch_size=2, num_workers=2)
            for idx in g.eval_loop(dl, num_samples=n, order="strided"):
                got.append(g.gather_for_metrics(idx))
    except deval.Mismatch as e:
        return "Mismatch", str(e)
    finally:
        g.leave()
    return "ok", torch.cat(got).tolist()


@pytest.mark.parametrize("case", ["two-calls", "iterable-workers"])
def test_rows_past_the_end_beyond_a_round_are_seen(daemon, case):
    res = run_ranks(2, rank_positional, daemon.socket, group_name("posn"), 22, case)
    for kind, what in res:
        assert kind == "Mismatch", what
        assert "more than any sampler pads" in what, what


class ByLength(torch.utils.data.Dataset):
    """Sample i is a sequence of n - i ones times i, and its label i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.ones(self.n - i) * i, i


def sort_by_length(samples):
    """A collate_fn that reorders its batch (as pack_padded_sequence(enforce_sorted) wants)."""
    samples = sorted(samples, key=lambda s: -len(s[0]))
    x = torch.nn.utils.rnn.pad_sequence([s[0] for s in samples], batch_first=True)
    return x, torch.tensor([s[1] for s in samples])


def rank_refused(rank, world, sock, name, n, case):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = dataset(n)
    if case == "in_order":  # (an iterable: its batches carry no dataset indices)
        import multiprocessing
        multiprocessing.current_process()._config["daemon"] = False
        dl = DataLoader(Stream(n), batch_size=2, num_workers=2, in_order=False)
    elif case == "replacement":
        dl = DataLoader(ds, batch_size=2,
                        sampler=torch.utils.data.RandomSampler(ds, replacement=True))
    else:
        ds = ByLength(n)
        dl = DataLoader(ds, batch_size=2, collate_fn=sort_by_length,
                        sampler=DistributedSampler(ds, world, rank, shuffle=False))
    try:
        told = dict(num_samples=n, order="rank") if case != "collate" else {}
        for x, y in g.eval_loop(dl, **told):
            g.gather_for_metrics((x.flatten(1)[:, :1], y))
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "ok", None


@pytest.mark.parametrize("case,world,says", [
    ("in_order", 2, "in_order=False"),
    ("replacement", 2, "draws with replacement"),
    # 3 ranks deal 10 samples with 2 padding duplicates that land beside other samples
    ("collate", 3, "did not keep them where the sampler drew them")])
def test_loaders_whose_rows_cannot_be_told_apart_are_refused(daemon, case, world, says):
    res = run_ranks(world, rank_refused, daemon.socket, group_name("refuse"), 10, case)
    assert all(kind != "ok" for kind, _ in res), res
    assert any(says in what for _, what in res), res


class Stream(torch.utils.data.IterableDataset):
    """Samples (i, its features) for i < n, each of a DataLoader's workers the ones its number
    is of, modulo the workers."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        w = torch.utils.data.get_worker_info()
        first, step = (0, 1) if w is None else (w.id, w.num_workers)
        x = dataset(self.n).tensors[1]
        return iter([(torch.tensor(i), x[i]) for i in range(first, self.n, step)])


class Late(torch.utils.data.Dataset):
    """dataset(n)'s samples; those of the first batch its loader draws (`late`, set by each
    worker from the sampler's first draw) are read slowly, so that a loader with two workers
    and in_order=False yields its second batch first."""

    def __init__(self, n, late):
        self.ds, self.late = dataset(n), set(late)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        if i in self.late:
            import time
            time.sleep(0.3)
        return self.ds[i]


def rank_out_of_order(rank, world, sock, name, n, kind, port):
    torch.set_num_threads(1)
    import multiprocessing
    multiprocessing.current_process()._config["daemon"] = False  # (its workers)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    if kind == "accelerate":
        # Accelerate shards a sequential loader by batches: rank r's first is round 0's r-th
        first = [rank * 2, rank * 2 + 1]
        import accelerate
        from test_accelerate_real import set_env
        set_env(rank, world, port)
        dl = accelerate.Accelerator(cpu=True).prepare(
            DataLoader(Late(n, first), batch_size=2, num_workers=2, in_order=False))
    else:
        first = list(DistributedSampler(range(n), world, rank, shuffle=True, seed=5))[:2]
        ds = Late(n, first)
        dl = DataLoader(ds, batch_size=2, num_workers=2, in_order=False,
                        sampler=DistributedSampler(ds, world, rank, shuffle=True, seed=5),
                        persistent_workers=kind == "persistent")
    runs = []
    for _ in range(2 if kind == "persistent" else 1):  # (a persistent loader's 2nd epoch too)
        seen, ids, xs = [], [], []
        for i, x in g.eval_loop(dl):
            seen.append(i.tolist())
            gi, gx = g.gather_for_metrics((i, x))
            ids.append(gi)
            xs.append(gx)
        runs.append((seen, torch.cat(ids).tolist(), torch.cat(xs).numpy()))
    g.leave()
    return first, runs


@pytest.mark.parametrize("kind", ["shuffled", "persistent", "accelerate"])
def test_batches_out_of_draw_order_keep_their_samples(daemon, kind):
    """in_order=False: batches come as the workers finish them; each keeps its draw's keys
    (the task number torch hands over with it), so every sample comes back once, with its own
    rows, and the sharding's padding (23 samples, 3 ranks) is dropped. This was refused."""
    n, world = 23, 3
    if kind == "accelerate":
        pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(world, rank_out_of_order, daemon.socket, group_name("order"), n, kind,
                    free_port())
    x = dataset(n).tensors[1].numpy()
    for first, runs in res:
        for seen, ids, xs in runs:
            assert seen[0] != first, (first, seen)  # (the loader did yield out of order)
            assert first in seen, (first, seen)
            assert sorted(ids) == list(range(n)), ids
            assert np.array_equal(xs, x[ids]), (ids, xs)  # each row its own sample's


class Reread(torch.utils.data.Dataset):
    """Sample i's features differ on every read (random augmentation: noise in [0, 1) added to
    i), and on each rank ("shifted": 100 * rank more, a dataset made unseeded per process);
    its label is i."""

    def __init__(self, n, shift=0):
        self.n, self.shift = n, shift

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.rand(2) + i + self.shift, i


def stack(samples):
    """A collate_fn of the user's own that keeps the samples' order."""
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


class FirstUniform(torch.utils.data.Dataset):
    """Samples 0..11 of one length, the rest of lengths that differ: a sorting collate keeps
    each rank's first batches in order and reorders its later ones."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = 3 if i < 12 else 1 + (i * 7) % 5
        return torch.arange(length, dtype=torch.float32) + i, i


def rank_reread(rank, world, sock, name, n, case):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = Reread(n, 100 * rank if case == "shifted" else 0)
    collate = stack if case == "own" else sort_by_length if case.startswith("sorted") else None
    if case == "sorted":
        ds = ByLength(n)
    elif case == "sorted-first-uniform":
        ds = FirstUniform(n)
    dl = DataLoader(ds, batch_size=4 if case == "sorted-first-uniform" else 2,
                    collate_fn=collate, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    got = []
    try:
        for x, y in g.eval_loop(dl):
            # the features are the batch's own data: a duplicate's differ from the first read
            got.append(g.gather_for_metrics((y, x[:, :2] if case.startswith("sorted") else x)))
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "ok", (torch.cat([y for y, _ in got]).tolist(),
                  torch.cat([x for _, x in got]).tolist())


@pytest.mark.parametrize("case", ["augmented", "shifted"])
def test_samples_that_differ_between_reads_count_by_draw(daemon, case):
    # 3 ranks deal 10 samples with 2 padding duplicates, each read a second time
    n = 10
    res = run_ranks(3, rank_reread, daemon.socket, group_name("reread"), n, case)
    for kind, what in res:
        assert kind == "ok", what
        labels, x = what[0], torch.tensor(what[1])
        assert labels == list(range(n))  # one process: each sample once, in order
        shift = torch.tensor([100 * (i % 3) if case == "shifted" else 0 for i in range(n)])
        # each row is a read of its own sample (the first), never the duplicate's neighbour
        assert torch.equal(x.floor()[:, 0].long() - shift, torch.arange(n))
        assert torch.equal(x.floor()[:, 1].long() - shift, torch.arange(n))
    assert all(r[1][1] == res[0][1][1] for r in res)  # every rank the same rows


@pytest.mark.parametrize("case,n", [("sorted", 10), ("sorted-first-uniform", 23), ("own", 10)])
def test_a_collate_of_the_user_s_own_keeps_the_duplicates_check(daemon, case, n):
    """A collate of the user's own may reorder (sorting by length, even where the first
    batches are all one length), so a batch whose padding's rows are not its draw's, read
    alone again, refuses on every rank (or, where libdeval sees it first, a duplicate whose
    own data differs from its first read); one that keeps order but reads differing values
    (own) too: deval cannot tell the two apart."""
    res = run_ranks(3, rank_reread, daemon.socket, group_name("reread"), n, case)
    assert all(kind == "Mismatch" for kind, _ in res), res
    assert all("came back twice" in what or "did not keep them where the sampler drew them"
               in what for _, what in res), res


# token ids and a label: sample 0, the padding 2 ranks add, is a prefix of sample 1 with its
# label, so a collate that sorts puts sample 1 where the padding was drawn, its first values
# the padding's own
TOKENS = [([1, 5], 0), ([1, 5, 7, 9], 0), ([1, 4, 4], 1), ([1, 8, 6], 1), ([1, 9, 9, 2, 3], 1)]


def padded(samples, left=False, order=lambda s: s):
    """A collate of one's own: ids padded with 0 to the batch's longest, on the left or the
    right, in the order order() puts the samples."""
    samples = order(samples)
    longest = max(len(t) for t, _ in samples)
    return (torch.tensor([[0] * (longest - len(t)) * left + t + [0] * (longest - len(t)) *
                          (not left) for t, _ in samples]),
            torch.tensor([y for _, y in samples]))


def rank_tokens(rank, world, sock, name, case):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    collate = {"sorted": lambda b: padded(b, order=lambda s: sorted(s, key=lambda x: len(x[0]))),
               "left": lambda b: padded(b, left=True)}[case]
    dl = DataLoader(TOKENS, batch_size=3, collate_fn=collate,
                    sampler=DistributedSampler(TOKENS, world, rank, shuffle=False))
    got = []
    try:
        for ids, y in g.eval_loop(dl):
            got.append(g.gather_for_metrics(((ids != 0).sum(1), y)))
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "ok", [torch.cat(v).tolist() for v in zip(*got)]


def test_a_sorting_collate_is_seen_where_a_longer_sample_starts_as_the_padding(daemon):
    """The padding drawn on rank 1 is sample 0, [1, 5]; the collate sorts sample 1, [1, 5, 7,
    9], with the same label, into its place. Its first values are the padding's, but past them
    it holds values, not one pad value: refused on every rank. Before, it passed as the
    padding, and sample 1 was dropped in its place (0.6 accuracy for one process's 0.4)."""
    res = run_ranks(2, rank_tokens, daemon.socket, group_name("tokens"), "sorted")
    assert all(kind == "Mismatch" for kind, _ in res), res
    assert any("did not keep them where the sampler drew them" in what for _, what in res), res


def test_a_collate_of_one_s_own_that_pads_on_the_left_is_exact(daemon):
    """The padding, read and collated alone, lies at the end of its row, past one pad value:
    its place in the batch is where it was drawn (before, it was compared at the row's start
    and the loop refused)."""
    res = run_ranks(2, rank_tokens, daemon.socket, group_name("tokens"), "left")
    want = [[len(t) for t, _ in TOKENS], [y for _, y in TOKENS]]
    assert res == [("ok", want)] * 2, res


class Twice(Sampler):
    """Each index of a DistributedSampler's share twice, the repeats in later batches (as
    test-time augmentation does)."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        idx = list(self.inner)
        return iter(idx + idx)

    def __len__(self):
        return 2 * len(self.inner)


def own(full, rows):
    """A dataset of its own holding rows of full, copied out (as a contiguous .shard() of a
    `datasets` Dataset held in memory gives): nothing says where its samples lie in full."""
    return TensorDataset(*(t[list(rows)] for t in full.tensors))


def rank_own_data(rank, world, sock, name, case):
    """Loops whose dataset indices do not name one sample across ranks."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    full = dataset(12)
    told = {}
    if case.startswith("shards"):  # each rank evaluates a slice of its own
        per = 12 // world if case == "shards" else 2  # (one batch each: no repeats to count)
        dl = DataLoader(own(full, range(rank * per, (rank + 1) * per)), batch_size=2)
        told = dict(num_samples=per * world)
    elif case in ("uneven-shards", "short-shard"):
        dl = DataLoader(own(full, range(rank * 5, rank * 6 + 5)), batch_size=2)
        # what the smaller holds (the lengths still differ), or the larger: the smaller
        # refuses alone, and the other hears it at once instead of waiting for it
        told = dict(num_samples=5 if case == "uneven-shards" else 6)
    elif case == "repeats":  # parts of one dataset, one holding a sample twice
        part = list(range(rank, 12, world)) + [10] * (rank == 0)
        dl = DataLoader(torch.utils.data.Subset(full, part), batch_size=2)
        told = dict(num_samples=12)
    else:
        dl = DataLoader(full, batch_size=2, sampler=Twice(DistributedSampler(full, world, rank)))
        told = dict(num_samples=12)
    try:
        for idx, x in g.eval_loop(dl, **told):
            g.gather_for_metrics(x[:, :1] * 2)  # a model's output: no exact rows to compare
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "ok", None


@pytest.mark.parametrize("case,says", [
    ("shards", "every rank must read the whole dataset"),
    ("shards-one-batch", "every rank must read the whole dataset"),
    ("uneven-shards", "ranks disagree on num_keys"),
    ("short-shard", "every rank must read the whole dataset"),
    ("repeats", "holds sample 10 of the dataset it was cut from twice"),
    ("twice", "a sampler repeats indices")])
def test_indices_that_do_not_name_one_sample_fail(daemon, case, says):
    res = run_ranks(2, rank_own_data, daemon.socket, group_name("owndata"), case)
    for kind, what in res:
        assert kind in ("InvalidArgument", "Mismatch") and says in what, res
    if case in ("short-shard", "repeats"):  # the rank that refuses says so; the other quotes it
        assert res[0][0] == "InvalidArgument" and res[1][0] == "Mismatch", res
        assert "rank 0: " in res[1][1], res


def rank_tqdm(rank, world, sock, name):
    """A loader behind a progress bar, as most evaluation scripts show one."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    tqdm = pytest.importorskip("tqdm")
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = dataset(7)
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    got = [g.gather_for_metrics(idx) for idx, _ in g.eval_loop(tqdm.tqdm(dl, disable=True))]
    g.leave()
    return torch.cat(got).tolist()


def test_a_loader_behind_a_progress_bar(daemon):
    for got in run_ranks(3, rank_tqdm, daemon.socket, group_name("tqdm")):
        assert got == list(range(7)), got


def rank_many_calls(rank, world, sock, name, n, calls, keys):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = dataset(n)
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    outs = [[] for _ in range(calls)]
    wide = {k: [] for k in range(keys)}
    try:
        for idx, x in g.eval_loop(dl):
            for c in range(calls):  # more calls per batch than a pass by position counts
                outs[c].append(g.gather_for_metrics(idx * 100 + c))
            # a dict of more tensors than one collective carries
            d = g.gather_for_metrics({"k%d" % k: x[:, :1] * 0 + idx[:, None] * 1000 + k
                                      for k in range(keys)})
            for k in range(keys):
                wide[k].append(d["k%d" % k][:, 0])
    finally:
        g.leave()
    return ([torch.cat(o).tolist() for o in outs],
            [torch.cat(w).long().tolist() for w in wide.values()])


def test_calls_and_tensors_past_a_collective_s_limits_are_exact(daemon):
    n, calls, keys = 11, 20, 100  # 16 counted calls per batch, 64 tensors per collective
    res = run_ranks(3, rank_many_calls, daemon.socket, group_name("many"), n, calls, keys)
    for outs, wide in res:
        for c, got in enumerate(outs):  # one process: each sample once, in dataset order
            assert got == [i * 100 + c for i in range(n)], (c, got)
        for k, got in enumerate(wide):
            assert got == [i * 1000 + k for i in range(n)], (k, got)


def pad_in_order(samples):
    """A collate_fn of the user's own that pads to the batch's longest and keeps the order."""
    x = torch.nn.utils.rnn.pad_sequence([s[0] for s in samples], batch_first=True,
                                        padding_value=-1)
    return x, torch.tensor([s[1] for s in samples])


def rank_metric_collate(rank, world, sock, name, n, case):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    import torchmetrics
    import deval.torchmetrics
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    deval.torchmetrics.use(g)
    seen = deval.torchmetrics.attach(torchmetrics.CatMetric())
    ds = ByLength(n)
    dl = DataLoader(ds, batch_size=2, collate_fn=sort_by_length if case == "sorted" else
                    pad_in_order, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    try:
        for x, y in g.eval_loop(dl):
            seen.update(x[:, 0])  # the model's view: the first value of each row
        return "ok", sorted(int(v) for v in seen.compute())
    except deval.Error as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()


@pytest.mark.parametrize("case", ["sorted", "in-order"])
def test_a_metric_under_a_reordering_collate_is_refused_not_miscounted(daemon, case):
    """3 ranks, 10 samples of lengths 10..1, 2 of them padding: a collate that sorts by
    length moves the padding's rows, so cutting the padding by place would drop a real sample
    and keep a duplicate (it did, silently): every rank refuses. A collate of one's own that
    pads and keeps the order is checked (the padding, read alone, is where it was drawn) and
    exact."""
    res = run_ranks(3, rank_metric_collate, daemon.socket, group_name("mcoll"), 10, case)
    if case == "sorted":
        assert all(kind == "Mismatch" for kind, _ in res), res
        assert any("did not keep them where the sampler drew them" in what
                   for _, what in res), res
    else:
        assert all(r == ("ok", list(range(10))) for r in res), res
