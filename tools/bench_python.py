# SPDX-License-Identifier: MIT
"""The Python table of tools/dev bench: what an evaluation loop pays per batch.

1. The binding's own cost: gather_for_metrics((logits, preds, labels)) (and 1 and 8
   tensors) from Python on a one-rank group, minus the same C call (made through ctypes with
   its structures built once, less what ctypes itself costs: the same call with no tensors,
   which libdeval rejects at once): what deval's Python layer adds to each call.
2. Per batch, the way a loop calls it: W ranks (processes), each gathering the logits,
   predictions and labels of a 16-sample batch once per batch, through deval and through
   Accelerate's gather_for_metrics over gloo (when torch and accelerate are installed), in
   the same run. The figure is the slowest rank's mean time per batch.
3. Per batch of a pass over a DataLoader: by position, with the batch's keys, and with keys
   and the resume journal (each batch's results written where a restarted job finds them),
   and the journal's bytes per sample of the pass.
4. Per batch of a pass whose body updates a torchmetrics metric on each rank, plain and
   attached to deval (which cuts the sampler's padding out of each update).

Timings are medians of several repeats; the machine is shared, so the ratios are what
carry over. No figure here is a test: nothing fails on a slow run.
"""

import ctypes
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import numpy as np

import deval

BATCHES = 400
REPEATS = 5


def per_call(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def median_us(fn, n=2000):
    for _ in range(200):
        fn()
    return statistics.median(per_call(fn, n) for _ in range(REPEATS))


def binding_cost():
    torch = sys.modules.get("torch")
    rows = []
    with deval.join("pybench-%d" % os.getpid(), 0, 1, timeout=30) as g:
        logits = np.random.rand(16, 10).astype(np.float32)
        labels = np.arange(16, dtype=np.int64)
        cases = [("numpy, 1 tensor", (logits,)), ("numpy, 3 tensors", (logits, labels, labels)),
                 ("numpy, 8 tensors", tuple([logits] * 8))]
        if torch is not None:
            tl, tt = torch.from_numpy(logits), torch.from_numpy(labels)
            cases += [("torch, 3 tensors", (tl, tt, tt)),
                      ("torch, 8 in a dict", {str(i): tl for i in range(8)})]
        for name, x in cases:
            py = median_us(lambda: g.gather_for_metrics(x))
            # the floor: the C call alone, structures built once
            leaves = []
            deval._flatten(x, leaves)
            ins = (deval._Tensor * len(leaves))()
            outs = (deval._Tensor * len(leaves))()
            for leaf, t in zip(leaves, ins):
                leaf.fill(t)
            opts, h, fn = g._opts(), g._h, deval._lib.deval_gather_for_metrics
            ref = ctypes.byref(opts)
            # less what ctypes adds: the same call, rejected at once (no tensors)
            c = median_us(lambda: fn(h, len(leaves), ins, ref, outs)) - \
                median_us(lambda: fn(h, 0, ins, ref, outs))
            rows.append((name, py, c))
    print("binding cost: gather_for_metrics from Python vs the same C call, one rank")
    print("%-20s %10s %10s %12s" % ("inputs", "Python us", "C us", "binding us"))
    for name, py, c in rows:
        print("%-20s %10.1f %10.1f %12.1f" % (name, py, c, py - c))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batches(rank, use_torch):
    gen = np.random.default_rng(rank)
    out = []
    for _ in range(BATCHES):
        lo = gen.random((16, 10), dtype=np.float32)
        la = gen.integers(0, 10, 16)
        out.append((lo, lo.argmax(1), la))
    if use_torch:
        import torch
        out = [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in b) for b in out]
    return out


def per_batch_us(barrier, gather, data):
    """Each repeat's mean time per batch, the ranks lined up by barrier first."""
    times = []
    for _ in range(REPEATS):
        barrier()
        t0 = time.perf_counter()
        for b in data:
            gather(b)
        times.append((time.perf_counter() - t0) / BATCHES * 1e6)
    return times


def deval_rank(rank, world, name, use_torch, q):
    if use_torch:
        import torch  # noqa: F401 - the inputs are torch tensors
    data = batches(rank, use_torch)
    with deval.join(name, rank, world, timeout=60) as g:
        times = per_batch_us(g.barrier, g.gather_for_metrics, data)
    q.put((rank, times))


def accelerate_rank(rank, world, port, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    times = per_batch_us(dist.barrier, acc.gather_for_metrics, batches(rank, True))
    q.put((rank, times))
    dist.destroy_process_group()


def run(world, target, args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(r, world) + args + (q,)) for r in range(world)]
    for p in ps:
        p.start()
    got = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(60)
    # the slowest rank of each repeat, then the median over repeats
    per_repeat = [max(t[i] for _, t in got) for i in range(REPEATS)]
    return statistics.median(per_repeat)


def per_batch():
    try:
        import accelerate  # noqa: F401
        import torch  # noqa: F401
        have = True
    except ImportError:
        have = False
    print("\nper batch: gather_for_metrics((logits[16, 10], preds[16], labels[16])), the "
          "slowest rank's mean")
    print("%5s %14s %14s %16s %8s" % ("ranks", "deval numpy us", "deval torch us",
                                      "Accelerate us", "ratio"))
    for world in (2, 4):
        tag = "pybench-%d-%d" % (os.getpid(), world)
        dn = run(world, deval_rank, (tag + "n", False))
        dt = run(world, deval_rank, (tag + "t", True)) if have else float("nan")
        if have:
            ac = run(world, accelerate_rank, (free_port(),))
            print("%5d %14.1f %14.1f %16.1f %7.1fx" % (world, dn, dt, ac, ac / dt))
        else:
            print("%5d %14.1f %14s %16s %8s" % (world, dn, "-", "(no torch)", "-"))


def pass_loader(rank, world):
    """(samples, this rank's DataLoader) of the passes measured: BATCHES batches of 16 rows of
    logits[10], preds and labels a rank, behind torch's DistributedSampler."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    torch.set_num_threads(1)
    n = BATCHES * 16 * world
    gen = torch.Generator().manual_seed(0)
    lo = torch.rand(n, 10, generator=gen)
    ds = TensorDataset(lo, lo.argmax(1), torch.randint(0, 10, (n,), generator=gen))
    return n, DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, world, rank,
                                                                      shuffle=False))


def pass_rank(rank, world, name, how, q):
    """Per batch of a whole eval pass over a DataLoader with torch's DistributedSampler:
    "loader" iterates it alone; "positions" gathers in eval_pass (rows counted by position);
    "keys" in eval_loop (each batch's dataset indices travel with it, the result ordered by
    them on every rank)."""
    n, dl = pass_loader(rank, world)
    with deval.join(name, rank, world, timeout=60) as g:
        times = []
        for _ in range(REPEATS):
            g.barrier()
            t0 = time.perf_counter()
            if how == "loader":
                for b in dl:
                    pass
            elif how == "positions":
                with g.eval_pass(n, order="strided"):
                    for b in dl:
                        g.gather_for_metrics(b)
            else:
                for b in g.eval_loop(dl):
                    g.gather_for_metrics(b)
            times.append((time.perf_counter() - t0) / BATCHES * 1e6)
    q.put((rank, times))


def in_pass():
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    print("\nper batch of a pass over a DataLoader (DistributedSampler, 16 rows of logits[10], "
          "preds, labels), the slowest rank's mean")
    print("%5s %12s %14s %10s %22s" % ("ranks", "loader us", "positions us", "keys us",
                                        "keys - positions us"))
    for world in (2, 4):
        tag = "pybench-pass-%d-%d" % (os.getpid(), world)
        lo, po, ke = (run(world, pass_rank, (tag + how, how))
                      for how in ("loader", "positions", "keys"))
        print("%5d %12.1f %14.1f %10.1f %22.1f" % (world, lo, po, ke, ke - po))


def journal_rank(rank, world, name, q):
    """Passes with keys over the loader of pass_rank, in turn on a group that keeps the resume
    journal (joined with a resume key) and on one that does not, so that both see the same
    machine: the per-batch time of each, pass by pass."""
    _, dl = pass_loader(rank, world)
    os.environ["DEVAL_RESUME_KEY"] = name
    kept = deval.join(name + "k", rank, world, timeout=60)
    del os.environ["DEVAL_RESUME_KEY"]
    plain = deval.join(name + "p", rank, world, timeout=60)
    times = []
    for _ in range(REPEATS * 2):
        pair = []
        for g in (kept, plain):
            g.barrier()
            t0 = time.perf_counter()
            for b in g.eval_loop(dl):
                g.gather_for_metrics(b)
            pair.append((time.perf_counter() - t0) / BATCHES * 1e6)
        times.append(pair)
    kept.leave()
    plain.leave()
    q.put((rank, times))


def journal_cost():
    """What keeping the resume journal costs a pass that never fails, per batch."""
    try:
        import torch
    except ImportError:
        return
    from deval import _loop
    b = (torch.rand(16, 10), torch.randint(0, 10, (16,)), torch.randint(0, 10, (16,)))
    digest = median_us(lambda: _loop.digest(b, list(range(16))), 2000)
    print("\nper batch of the same pass, keeping the resume journal or not (passes in turn; "
          "of it, the batch's digest in Python: %.1f us)" % digest)
    print("%5s %12s %14s %12s" % ("ranks", "keys us", "journal us", "journal-keys"))
    for world in (2, 4):
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        tag = "pybench-journal-%d-%d" % (os.getpid(), world)
        ps = [ctx.Process(target=journal_rank, args=(r, world, tag, q)) for r in range(world)]
        for p in ps:
            p.start()
        got = [q.get(timeout=600) for _ in ps]
        for p in ps:
            p.join(60)
        n = len(got[0][1])
        kept = statistics.median(max(t[i][0] for _, t in got) for i in range(n))
        plain = statistics.median(max(t[i][1] for _, t in got) for i in range(n))
        diff = statistics.median(max(t[i][0] for _, t in got) - max(t[i][1] for _, t in got)
                                 for i in range(n))
        print("%5d %12.1f %14.1f %12.1f" % (world, plain, kept, diff))


def metric_rank(rank, world, name, attached, q):
    """A torchmetrics Accuracy updated on each rank per batch of a pass over a padded
    DistributedSampler, attached to deval or not (then it counts the padding)."""
    import torch
    import torchmetrics
    import deval.torchmetrics as dtm
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    torch.set_num_threads(1)
    n = BATCHES * 16 * world - 1  # (one sample of padding: the last batch is cut)
    ds = TensorDataset(torch.rand(n, 10), torch.randint(0, 10, (n,)))
    dl = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, world, rank))
    times = []
    with deval.join(name, rank, world, timeout=60) as g:
        dtm.use(g)
        m = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        if attached:
            dtm.attach(m)
        for _ in range(REPEATS):
            m.reset()
            g.barrier()
            t0 = time.perf_counter()
            for x, y in g.eval_loop(dl):
                m.update(x, y)
            times.append((time.perf_counter() - t0) / BATCHES * 1e6)
        dtm.use(None)
    q.put((rank, times))


def metric_update():
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        return
    print("\nper batch of a pass whose body only updates a torchmetrics Accuracy on each rank "
          "(16 rows), the slowest rank's mean")
    print("%5s %14s %14s %12s" % ("ranks", "plain us", "attached us", "attached-plain"))
    for world in (2,):
        tag = "pybench-metric-%d-%d" % (os.getpid(), world)
        plain, att = (run(world, metric_rank, (tag + str(a), a)) for a in (False, True))
        print("%5d %14.1f %14.1f %12.1f" % (world, plain, att, att - plain))


if __name__ == "__main__":
    try:
        import torch  # noqa: F401 - measured when installed
    except ImportError:
        pass
    binding_cost()
    per_batch()
    in_pass()
    journal_cost()
    metric_update()
