# SPDX-License-Identifier: MIT
"""eval_loop: the loops people write, exact. Several gather_for_metrics calls per batch,
uneven loaders without dummy calls (the rank that runs out first replays what it missed),
the order and num_samples taken from the sampler, and the inputs that would silently
duplicate a sample raising instead. Each test here failed (wrong rows, or a hang) before
eval_loop existed."""

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks


class Batches:
    """A loader of fixed batches: a list of index lists, as a rank's loader yields them."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        for b in self.batches:
            idx = np.array(b, dtype=np.int64)
            width = 1 + int((idx % 3).max()) if len(idx) else 1
            tok = np.stack([np.where(np.arange(width) <= i % 3, i * 10 + np.arange(width), -1)
                            for i in idx]) if len(idx) else np.zeros((0, width), np.int64)
            yield {"idx": idx, "tok": tok, "names": ["s%d" % i for i in idx]}


def rank_shards(n, bs, world, rank):
    """Accelerate's even_batches=False sharding: whole batches dealt round-robin."""
    batches = [list(range(i, min(i + bs, n))) for i in range(0, n, bs)]
    return batches[rank::world]


def loop_two_calls(rank, world, sock, name, n, bs):
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    preds, labels, toks, names = [], [], [], []
    loader = Batches(rank_shards(n, bs, world, rank))
    for batch in g.eval_loop(loader, num_samples=n, order="rank"):
        p = batch["idx"] * 7 % 13
        preds.append(g.gather_for_metrics(p))                    # call 1 of the batch
        labels.append(g.gather_for_metrics(batch["idx"] % 13))   # call 2
        toks.append(g.pad_across_processes(batch["tok"], dim=1, pad_index=-1))
        names += g.gather_for_metrics(batch["names"])             # objects
    g.leave()
    P = np.concatenate(preds)
    L = np.concatenate(labels)
    return P.tolist(), L.tolist(), names, len(preds)


@pytest.mark.parametrize("n,bs,world", [(5, 2, 2), (82, 16, 3), (17, 4, 4), (9, 2, 4)])
def test_two_calls_per_batch_and_uneven_loaders(daemon, n, bs, world):
    res = run_ranks(world, loop_two_calls, daemon.socket, group_name("loop2"), n, bs)
    want_p = [i * 7 % 13 for i in range(n)]
    want_l = [i % 13 for i in range(n)]
    nb = (n + bs - 1) // bs
    for rank, (p, lab, names, calls) in enumerate(res):
        assert p == want_p, "rank %d predictions" % rank
        assert lab == want_l, "rank %d labels" % rank
        assert names == ["s%d" % i for i in range(n)], "rank %d names" % rank
        # a rank that ran out first ran the body again on empty batches
        assert calls == (nb + world - 1) // world, "rank %d iterations" % rank


def strided_loop(rank, world, sock, name, n, drop_last):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    ds = TensorDataset(torch.arange(n))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False,
                                 drop_last=drop_last)
    loader = DataLoader(ds, batch_size=3, sampler=sampler)
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    a, b = [], []
    for (x,) in g.eval_loop(loader):
        a.append(g.gather_for_metrics(x * 2))
        b.append(g.gather_for_metrics({"x": x, "sq": x * x}))
    g.leave()
    return torch.cat(a).tolist(), torch.cat([d["sq"] for d in b]).tolist()


@pytest.mark.parametrize("n,world,drop_last", [(10, 3, False), (10, 3, True), (7, 2, False),
                                               (8, 4, False)])
def test_distributed_sampler_is_strided(daemon, n, world, drop_last):
    pytest.importorskip("torch")
    res = run_ranks(world, strided_loop, daemon.socket, group_name("strided"), n, drop_last)
    keep = n // world * world if drop_last else n
    for a, sq in res:
        assert a == [2 * i for i in range(keep)]
        assert sq == [i * i for i in range(keep)]


def strided_some_batches(rank, world, sock, name, n):
    """Each rank streams its strided share of n samples (DistributedSampler's dealing,
    padded with the first samples), one a batch, through eval_loop by position: a gather in
    every batch, one in the second batch only, one in the last only."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    per = -(-n // world)
    mine = [i % n for i in range(per * world)][rank::world]
    every, second, last, real = [], None, None, 0
    loader = [np.array([i], dtype=np.int64) for i in mine]
    for step, idx in enumerate(g.eval_loop(loader, num_samples=n, order="strided")):
        real += int(deval.real_rows().sum())
        every += g.gather_for_metrics(idx).tolist()
        if step == 1:
            second = g.gather_for_metrics(idx * 10).tolist()
        if step == per - 1:
            last = g.gather_for_metrics(idx * 100).tolist()
    g.leave()
    return every, second, last, real


def test_a_strided_pass_knows_its_padding(daemon):
    """A pass by position in strided order knows which of a rank's rows are the padding (its
    j-th sample is the pass's j*W + r): real_rows() says them (it was None), and a call some
    batch skipped is cut by them (it was refused on every rank)."""
    n, world = 11, 3
    res = run_ranks(world, strided_some_batches, daemon.socket, group_name("strsome"), n)
    assert [r[:3] for r in res] == [(list(range(n)), [30, 40, 50], [900, 1000])] * world
    assert [r[3] for r in res] == [len(range(r, n, world)) for r in range(world)]


def rank_order_many_calls(rank, world, sock, name, n, extra):
    """Each rank streams its part of n samples, one a batch, through eval_loop by position in
    rank order (batch j's rows are the pass's next W, rank by rank; the last round pads): a
    gather in every batch, `extra` more from one loop of the body (the calls past the 16 the
    pass counts), one in the second batch only and one in the last only."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    per = -(-n // world)
    loader = [np.array([j * world + rank], dtype=np.int64) for j in range(per)]
    every, more, second, last = [], [[] for _ in range(extra)], None, None
    for step, idx in enumerate(g.eval_loop(loader, num_samples=n, order="rank")):
        every += g.gather_for_metrics(idx).tolist()
        for k in range(extra):
            more[k] += g.gather_for_metrics(idx * 1000 + k).tolist()
        if step == 1:
            second = g.gather_for_metrics(idx * 10).tolist()
        if step == per - 1:
            last = g.gather_for_metrics(idx * 100).tolist()
    g.leave()
    return every, more, second, last


def test_a_rank_order_pass_takes_any_calls(daemon):
    """In a pass by position in rank order no rank knows which of its rows are the padding
    until the ranks before it have said theirs; the calls the pass does not count (past its
    16 per batch, or at a site some batch skipped) start where a counted call of every batch
    before says, and are cut as it is: they were refused on every rank."""
    n, world, extra = 11, 3, 20
    res = run_ranks(world, rank_order_many_calls, daemon.socket, group_name("rankmany"), n,
                    extra)
    want_more = [[i * 1000 + k for i in range(n)] for k in range(extra)]
    assert res == [(list(range(n)), want_more, [30, 40, 50], [900, 1000])] * world



def tuple_batches(rank, world, sock, name, k):
    """A plain list of (inputs, labels) tuples, 10 samples in batches of 4 dealt in rank
    order, and a gather of k rows per sample (generation's num_return_sequences=k): the
    batch is 2 fields of 4 samples, or 2 samples, and k rows each under neither reading."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    n = 10
    batches = [np.arange(i, min(i + 4, n)) for i in range(0, n, 4)]
    got = []
    try:
        for x, y in g.eval_loop([(x, x * 10) for x in batches[rank::world]], num_samples=n,
                                order="rank"):
            got += g.gather_for_metrics(np.repeat(x, k)).tolist()
    except deval.InvalidArgument as e:
        return str(e)
    finally:
        g.leave()
    return got


@pytest.mark.parametrize("k", [1, 2])
def test_tuple_batches_whose_rows_say_no_count(daemon, k):
    """k = 2 returned samples 0..4 twice, and lost 5..9, with no error; k = 1 stays exact."""
    res = run_ranks(3, tuple_batches, daemon.socket, group_name("tuplek"), k)
    if k == 1:
        assert res == [list(range(10))] * 3
    else:
        assert all("holds 8 rows for a batch of 2 items" in r or
                   "holds 4 rows for a batch of 2 items" in r for r in res), res


def replay_k_rows(rank, world, sock, name):
    """5 batches of 4 dealt round robin over 3 ranks, a plain list (no indices): rank 2 runs
    out a batch early and replays the others' last. Generation's k = 2 rows per sample, as
    texts, as a tensor, and in a tuple with a row per sample."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    n = 20
    batches = [np.arange(i, i + 4) for i in range(0, n, 4)]
    texts, gen, pairs = [], [], []
    for x in g.eval_loop(batches[rank::world], num_samples=n, order="rank"):
        texts += g.gather_for_metrics(["s%d" % v for v in x.tolist() for _ in range(2)])
        gen += g.gather_for_metrics(np.repeat(x, 2)).tolist()
        p, q = g.gather_for_metrics((x, np.repeat(x, 2)))
        pairs.append((p.tolist(), q.tolist()))
    g.leave()
    return texts, gen, pairs


def test_a_replayed_batch_takes_k_rows_per_sample(daemon):
    """The rank that replays took its padding sample as a batch it could not count: its
    texts came back as nested lists (32 items for 40, no error), its tensor call was refused
    ("they called gather_for_metrics (call 1, 2 tensors)")."""
    res = run_ranks(3, replay_k_rows, daemon.socket, group_name("replayk"))
    twice = [v for v in range(20) for _ in range(2)]
    want = (["s%d" % v for v in twice], twice,
            [(list(range(i, i + 12)), [v for v in range(i, i + 12) for _ in range(2)])
             for i in (0, 12)])
    want[2][1] = (list(range(12, 20)), [v for v in range(12, 20) for _ in range(2)])
    assert res == [want] * 3


def samples_replay(rank, world, sock, name):
    """A plain list whose batches are lists of (x, y) samples, 2 each (as many as a sample's
    fields): 5 batches over 3 ranks, so rank 2 replays one on a padding sample."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    batches = [[(float(i), i * 10) for i in range(j, j + 2)] for j in range(0, 10, 2)]
    got = []
    for b in g.eval_loop(batches[rank::world], num_samples=10, order="rank"):
        got += g.gather_for_metrics(np.array([y for _, y in b])).tolist()
    g.leave()
    return got


def test_a_replay_pads_with_a_whole_sample(daemon):
    """The padding sample was cut field by field ((0.0,), (1.0,)), the body raised IndexError
    on the replaying rank, and the others PeerLost."""
    res = run_ranks(3, samples_replay, daemon.socket, group_name("sampreplay"))
    assert res == [[i * 10 for i in range(10)]] * 3


def bad_inputs(rank, world, sock, name):
    """Inputs a pass cannot take raise InvalidArgument on the rank that made them, and leave
    the pass on every rank (test_refusals.py): the loop's later calls raise too."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    out = []
    bad = [(r"\['loss'\] is a 0-d tensor",
            lambda b: {"loss": np.float32(0.5) + np.zeros((), np.float32), "ids": b["idx"]}),
           (r"\[1\] holds 1 row for the batch's 2",
            lambda b: (b["idx"], np.zeros((1,), np.float32)))]
    for words, make in bad:
        for batch in g.eval_loop(Batches([[0, 1], [2, 3]]), num_samples=4 * world,
                                 order="rank"):
            with pytest.raises(deval.InvalidArgument, match=words):
                g.gather_for_metrics(make(batch))
            with pytest.raises(deval.InvalidArgument, match="refused its eval pass"):
                g.gather_for_metrics(batch["idx"])
            break
    with g.eval_pass(2 * world):  # (the next pass runs)
        out.append(g.gather_for_metrics(np.arange(2)).tolist())
    # outside a pass a 0-d tensor gathers as one row per rank
    out.append(g.gather_for_metrics(np.int64(rank) + np.zeros((), np.int64)).tolist())
    g.leave()
    return out


def test_no_silent_duplicates(daemon):
    res = run_ranks(2, bad_inputs, daemon.socket, group_name("bad"))
    for out in res:
        assert out == [[0, 1, 0, 1], [0, 1]]


def unknown_loader(rank, world, sock, name):
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    try:
        with pytest.raises(deval.InvalidArgument, match="pass num_samples="):
            g.eval_loop([np.arange(3)])
    finally:
        g.leave()
    return True


def test_unknown_loader_asks_for_num_samples(daemon):
    assert run_ranks(2, unknown_loader, daemon.socket, group_name("unknown")) == [True, True]


def early_break(rank, world, sock, name):
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    first = None
    for batch in g.eval_loop(Batches([[0, 1], [4, 5]] if rank == 0 else [[2, 3], [6, 7]]),
                             num_samples=8, order="rank"):
        first = g.gather_for_metrics(batch["idx"]).tolist()
        break  # debugging a loop: one batch is enough
    again = []
    for batch in g.eval_loop(Batches([[0, 1]] if rank == 0 else [[2, 3]]), num_samples=4,
                             order="rank"):
        again.append(g.gather_for_metrics(batch["idx"]).tolist())
    g.leave()
    return first, again


def test_break_ends_the_pass(daemon):
    for first, again in run_ranks(2, early_break, daemon.socket, group_name("break")):
        assert first == [0, 1, 2, 3]
        assert again == [[0, 1, 2, 3]]


def explicit_short(rank, world, sock, name, case):
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    got = []
    try:
        if case == "too-many":  # eval_loop checks that every sample came
            for batch in g.eval_loop(Batches([[2 * rank, 2 * rank + 1]]), num_samples=5,
                                     order="rank"):
                got.append(g.gather_for_metrics(batch["idx"]))
        else:  # rank 1 leaves its pass a batch early
            with g.eval_pass(num_samples=6 if rank == 0 else 6, order="rank"):
                for b in range(2 if rank == 0 else 1):
                    got.append(g.gather_for_metrics(np.arange(2) + 2 * rank + 4 * b))
    except deval.Mismatch as e:
        return str(e)
    finally:
        g.leave()
    return [x.tolist() for x in got]


def test_explicit_pass_never_loses_silently(daemon):
    res = run_ranks(2, explicit_short, daemon.socket, group_name("short"), "too-many")
    for msg in res:
        assert "returned 4 of its 5 samples" in msg
    res = run_ranks(2, explicit_short, daemon.socket, group_name("early"), "early")
    assert res[0] == [[0, 1, 2, 3], [4, 5]]
    assert "left the pass 1 batches before the others" in res[1]


def no_batch(rank, world, sock, name):
    try:
        return loop_two_calls(rank, world, sock, name, 3, 2)
    except deval.Mismatch as e:
        return str(e)


def test_rank_without_any_batch_says_so(daemon):
    """Two batches for four ranks: ranks 2 and 3 never saw a batch, so they cannot run the
    loop body on an empty one to replay the others'; they raise rather than return less."""
    res = run_ranks(4, no_batch, daemon.socket, group_name("nobatch"))
    for rank in (0, 1):
        assert res[rank][0] == [i * 7 % 13 for i in range(3)]
    for rank in (2, 3):
        assert "had no batch, so it cannot replay the 1 batches" in res[rank]


def contradicted(rank, world, sock, name):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    ds = TensorDataset(torch.arange(10))
    loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=False))
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    try:
        with pytest.raises(deval.InvalidArgument, match="gathers in 'strided' order, not 'rank'"):
            g.eval_loop(loader, order="rank")
        with pytest.raises(deval.InvalidArgument, match="hold 10 samples together, not 12"):
            g.eval_loop(loader, num_samples=12)
        got = [g.gather_for_metrics(x).tolist() for (x,) in
               g.eval_loop(loader, num_samples=10, order="strided")]  # agreeing is fine
    finally:
        g.leave()
    return sum(got, [])


def test_a_known_loader_contradicted_is_refused(daemon):
    pytest.importorskip("torch")
    for got in run_ranks(2, contradicted, daemon.socket, group_name("contra")):
        assert got == list(range(10))



def batch_sampler_as_sampler(rank, world, sock, name):
    """The fast-fetch pattern: a BatchSampler passed as sampler= with batch_size=None, over a
    dataset read a list of indices at a time. Each list the sampler yields is a batch's
    indices. Before: InvalidArgument, "its sampler yields list, not dataset indices"."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = TensorDataset(torch.arange(10))
    sampler = BatchSampler(DistributedSampler(ds, world, rank, shuffle=False), 2, False)
    try:
        got = []
        for (x,) in g.eval_loop(DataLoader(ds, sampler=sampler, batch_size=None),
                                num_samples=10, order="strided"):
            got += g.gather_for_metrics(x).tolist()
        return got
    finally:
        g.leave()


@pytest.mark.parametrize("world", [2, 3])
def test_a_batch_sampler_as_sampler_is_exact(daemon, world):
    pytest.importorskip("torch")
    res = run_ranks(world, batch_sampler_as_sampler, daemon.socket, group_name("bsampler"))
    assert res == [list(range(10))] * world, res


PEEK = """
import deval, torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
g = deval.join()
ds = TensorDataset(torch.arange(10))
loader = DataLoader(ds, batch_size=2, num_workers=1, persistent_workers=True,
                    sampler=DistributedSampler(ds, g.world_size, g.rank, shuffle=False))
next(iter(loader))  # a look at one batch before the loop
try:
    for (x,) in g.eval_loop(loader):
        g.gather_for_metrics(x)
except deval.InvalidArgument as e:
    print("rank %d: %s" % (g.rank, e), flush=True)
"""


def test_a_peek_at_persistent_workers_says_what_to_change(daemon, tmp_path):
    """With persistent_workers=True, a batch taken before the loop leaves the workers ahead
    of the sampler: the loop refuses, and says why and what to do."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from conftest import ROOT
    script = tmp_path / "peek.py"
    script.write_text(PEEK)
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "deval.launch", "-n", "2", str(script)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.stdout.count("persistent_workers=True") == 2, p.stdout + p.stderr


def k_rows(rank, world, sock, name, how, n=12):
    """Generation's k=2 outputs per sample, [batch*2, ...], in passes without indices: n
    samples (12, or 11 where the last is padding), contiguous shards of 6, batches of 3."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    mine = list(range(rank * 6, rank * 6 + 6))
    batches = [np.array(mine[i:i + 3], dtype=np.int64) for i in (0, 3)]
    got = []
    try:
        if how == "loop":
            for b in g.eval_loop(iter(batches), num_samples=n, order="rank"):
                got.append(g.gather_for_metrics(np.repeat(b, 2)))
        elif how == "tokens":  # rows per batch a multiple of its samples, but not per sample
            for i, b in enumerate(g.eval_loop(iter(batches), num_samples=n, order="rank")):
                got.append(g.gather_for_metrics(np.repeat(b, [1, 1, 7] if i else 2)))
        else:
            with g.eval_pass(12, order="rank"):
                for b in batches:
                    got.append(g.gather_for_metrics(np.repeat(b, 2)))
    except (deval.InvalidArgument, deval.Mismatch) as e:
        return type(e).__name__, str(e)
    finally:
        g.leave()
    return "returned", np.concatenate(got).tolist()


def test_k_rows_per_sample_without_indices_never_loses_samples(daemon):
    """Each row of a pass without indices counts as a sample: 2 rows per sample kept the
    first 12 rows (samples 0-2 and 6-8 twice) and dropped the rest as padding, silently.
    eval_loop counts the batch's samples, so it returns every sample's 2 rows; it used to
    refuse the call. eval_pass, which cannot count them, fails at its close once the rows
    past the end reach a round of batches."""
    for n in (12, 11):
        for kind, rows in run_ranks(2, k_rows, daemon.socket, group_name("krows"), "loop", n):
            assert kind == "returned" and sorted(rows) == np.repeat(np.arange(n), 2).tolist(), rows
    # 6 rows for 3 samples in the first batch, 9 (1, 1 and 7) in the last: tokens flattened
    # across the batch, whose count is a multiple of the samples by chance. Cutting 3 rows
    # for the padding sample would keep the wrong ones; the batch before held 2 per sample
    for kind, msg in run_ranks(2, k_rows, daemon.socket, group_name("ktok"), "tokens", 11):
        assert kind in ("InvalidArgument", "Mismatch") and "rows per sample" in msg, (kind, msg)
    for kind, msg in run_ranks(2, k_rows, daemon.socket, group_name("krowsp"), "pass"):
        assert kind == "Mismatch" and "more than any sampler pads" in msg, (kind, msg)



def unsure_batches(rank, world, sock, name):
    """Passes without indices whose batches the rows check must not miscount: a list of 4
    images of 3 channels (the samples themselves, not fields of 3 rows), and a dict batch of 2
    samples gathered as a list of per-sample lists of tags (objects, one per sample)."""
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    mine = [list(range(k, k + 4)) for k in range(4 * rank, 8 * world, 4 * world)]
    images, tags = [], []
    try:
        for b in g.eval_loop(iter([[np.full((3, 2, 2), i) for i in ids] for ids in mine]),
                             num_samples=8 * world, order="strided"):
            images += g.gather_for_metrics(np.array([int(im[0, 0, 0]) for im in b])).tolist()
        pairs = [[2 * j + k for k in range(2)] for j in range(rank, 4 * world, world)]
        for ids in g.eval_loop(iter([{"input_ids": np.array(p)} for p in pairs]),
                               num_samples=8 * world, order="strided"):
            tags += g.gather_for_metrics([["t%d" % i] * 3 for i in ids["input_ids"]])
    finally:
        g.leave()
    return images, tags


def test_batches_the_rows_check_cannot_count_are_not_refused(daemon):
    for images, tags in run_ranks(2, unsure_batches, daemon.socket, group_name("unsure")):
        assert sorted(images) == list(range(16)), images
        assert sorted(t[0] for t in tags) == sorted("t%d" % i for i in range(16)), tags
