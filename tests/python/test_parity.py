# SPDX-License-Identifier: MIT
"""Parity: the same distributed evaluation loop through deval and in one process gives
identical gathered arrays and identical metrics, for every way people shard evaluation.

The samplers follow their documented behaviour: Accelerate's BatchSamplerShard (whole
batches dealt round-robin, or with split_batches each batch split across processes;
even_batches completes the last round from the start; drop_last drops the incomplete tail)
and torch's DistributedSampler (samples dealt round-robin, the index list padded with its
head). With torch installed, the real DistributedSampler is used as well.
"""

import numpy as np
import pytest

import deval
from conftest import group_name, run_ranks

N_CLASSES = 7


def model(idx):
    """Deterministic 'logits' with ragged top-k candidates, for sample indices idx."""
    rng = np.random.default_rng(idx * 7919 + 1)
    return rng.normal(size=N_CLASSES).astype(np.float32)


def labels_of(idx):
    return idx % N_CLASSES


def accelerate_batches(n, bs, world, rank, even_batches=True, drop_last=False,
                       split_batches=False):
    batches = [list(range(i, min(i + bs, n))) for i in range(0, n, bs)]
    if drop_last and batches and len(batches[-1]) < bs:
        batches.pop()
    if split_batches:
        per = bs // world
        out = [b[per * rank: per * (rank + 1)] for b in batches if len(b) == bs]
        if not drop_last and batches and len(batches[-1]) < bs:
            last = batches[-1]
            if not even_batches:
                if len(last) > per * rank:
                    out.append(last[per * rank: per * (rank + 1)])
            else:
                initial = list(batches[0])
                while len(initial) < bs:
                    initial += initial
                full = last + initial
                out.append(full[per * rank: per * (rank + 1)])
        return out
    initial, to_yield, out, batch, idx = [], [], [], [], -1
    for idx, batch in enumerate(batches):
        if not drop_last and idx < world:
            initial += batch
        if idx % world == rank:
            to_yield = batch
        if idx % world == world - 1 and len(batch) == bs:
            out.append(to_yield)
            to_yield = []
    if drop_last or not initial:
        return out
    if not even_batches:
        if to_yield:
            out.append(to_yield)
        return out
    if len(to_yield) == bs:
        out.append(to_yield)
    while len(initial) < world * bs:
        initial += initial
    if len(batch) == bs:
        batch, idx = [], idx + 1
    cycle = 0
    while idx % world != 0 or batch:
        end = cycle + bs - len(batch)
        batch = batch + initial[cycle:end]
        if idx % world == rank:
            out.append(batch)
        cycle, batch, idx = end, [], idx + 1
    return out


def distributed_sampler_batches(n, bs, world, rank, drop_last=False, use_torch=False):
    if use_torch:
        import torch.utils.data as tud
        s = tud.DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False,
                                   drop_last=drop_last)
        mine = list(s)
    else:
        per = n // world if drop_last and n % world else -(-n // world)
        indices = list(range(n))
        while len(indices) < per * world:
            indices += indices[: per * world - len(indices)]
        mine = indices[rank: per * world: world]
    return [mine[i:i + bs] for i in range(0, len(mine), bs)]


def covered(n, bs, world, sampler, kw):
    """The distinct samples a single process sees through the same loaders, in order."""
    seen = set()
    for r in range(world):
        for b in (distributed_sampler_batches(n, bs, world, r, **kw) if sampler == "dist"
                  else accelerate_batches(n, bs, world, r, **kw)):
            seen.update(b)
    return sorted(seen)


def metrics(preds, labels):
    acc = float(np.mean(preds == labels))
    f1s = []
    for c in range(N_CLASSES):
        tp = np.sum((preds == c) & (labels == c))
        fp = np.sum((preds == c) & (labels != c))
        fn = np.sum((preds != c) & (labels == c))
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return acc, float(np.mean(f1s))


def _eval(rank, world, sock, name, n, bs, sampler, kw):
    batches = (distributed_sampler_batches(n, bs, world, rank, **kw) if sampler == "dist"
               else accelerate_batches(n, bs, world, rank, **kw))
    steps = max(len(distributed_sampler_batches(n, bs, world, r, **kw) if sampler == "dist"
                    else accelerate_batches(n, bs, world, r, **kw)) for r in range(world))
    order = "strided" if sampler == "dist" else "rank"
    with deval.join(name, rank, world, socket=sock, timeout=30) as g:
        got = {"idx": [], "logits": [], "preds": [], "labels": [], "topk": [], "names": []}
        with g.eval_pass(num_samples=n, order=order):
            for s in range(steps):
                b = batches[s] if s < len(batches) else []
                idx = np.array(b, dtype=np.int64)
                logits = np.stack([model(i) for i in b]) if b else np.zeros((0, N_CLASSES),
                                                                           np.float32)
                preds = logits.argmax(axis=1).astype(np.int64)
                # ragged: each sample's candidates above zero, padded per batch with -1
                cands = [np.flatnonzero(l > 0) for l in logits]
                width = max((len(c) for c in cands), default=0)
                topk = np.full((len(b), width), -1, np.int64)
                for j, c in enumerate(cands):
                    topk[j, : len(c)] = c
                out = g.gather_for_metrics({"idx": idx, "logits": logits, "preds": preds,
                                            "labels": labels_of(idx), "topk": topk},
                                           pad_index=-1)
                names = g.gather_for_metrics(["class-%d" % p for p in preds])
                for k in ("idx", "logits", "preds", "labels"):
                    got[k].append(out[k])
                got["topk"].extend([row[row >= 0].tolist() for row in out["topk"]])
                got["names"].extend(names)
        return {k: (np.concatenate(v) if k not in ("topk", "names") else v)
                for k, v in got.items()}


CASES = [
    ("accelerate", {"even_batches": True}),
    ("accelerate", {"even_batches": False}),
    ("accelerate", {"split_batches": True}),
    ("accelerate", {"split_batches": True, "even_batches": False}),
    ("accelerate", {"drop_last": True}),
    ("dist", {}),
    ("dist", {"drop_last": True}),
]


@pytest.mark.parametrize("sampler,kw", CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("n,world", [(82, 2), (99, 3), (101, 4)])
def test_parity(daemon, sampler, kw, n, world):
    bs = 12  # split_batches needs a batch size that every world size divides
    results = run_ranks(world, _eval, daemon.socket, group_name("parity"), n, bs, sampler, kw)
    want_idx = covered(n, bs, world, sampler, kw)
    logits = np.stack([model(i) for i in want_idx]).astype(np.float32)
    preds = logits.argmax(axis=1)
    labels = labels_of(np.array(want_idx))
    for got in results:  # every rank has the whole, identical result
        assert got["idx"].tolist() == want_idx
        assert np.array_equal(got["logits"], logits)
        assert np.array_equal(got["preds"], preds)
        assert got["topk"] == [np.flatnonzero(l > 0).tolist() for l in logits]
        assert got["names"] == ["class-%d" % p for p in preds]
        assert metrics(got["preds"], got["labels"]) == metrics(preds, labels)


def test_torch_distributed_sampler(daemon):
    pytest.importorskip("torch", reason="torch is not installed")
    n, bs, world = 99, 8, 3
    for drop_last in (False, True):
        kw = {"drop_last": drop_last, "use_torch": True}
        results = run_ranks(world, _eval, daemon.socket, group_name("torchds"), n, bs, "dist",
                            kw)
        want = covered(n, bs, world, "dist", kw)
        assert all(r["idx"].tolist() == want for r in results)
