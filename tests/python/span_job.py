# SPDX-License-Identifier: MIT
"""One rank of a job that spans "nodes" (tests/python/test_span.py starts it, under torchrun or
with torchrun's variables): torch.distributed over gloo, deval.join() across the nodes.

    span_job.py compare        every result of the sequence below on the spanning group and on
                               a flat group of the same ranks at one devald ($SPAN_FLAT_SOCKET)
                               must be identical; prints "identical N"
    span_job.py accelerate     an Accelerator with deval.accelerate.enable(): its prepared
                               loaders' gather_for_metrics give the single-process result
    span_job.py fail MODE      barriers in a loop; MODE "kill" / "stop" makes rank $SPAN_VICTIM
                               kill / stop itself at the 5th; prints what each rank got
"""

import os
import pickle
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import deval  # noqa: E402


def record(out, x):
    if isinstance(x, torch.Tensor):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        out.append((str(x.dtype), x.shape, x.tobytes()))
    elif isinstance(x, dict):
        for k in sorted(x):
            out.append(k)
            record(out, x[k])
    else:
        out.append(pickle.dumps(x))


class Squares(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i), float(i) ** 0.5]), i


def body(g, batch, out):
    x, y = batch
    # ragged along dim 1, as generated sequences are
    logits = x.repeat(1, 1 + g.rank % 3) * (1 + g.rank)
    logits = g.pad_across_processes(logits, dim=1, pad_index=-1)
    record(out, g.gather_for_metrics({"logits": logits, "labels": y}))
    record(out, g.gather_for_metrics(["s%d" % int(v) for v in y]))


def sequence(g):
    from accelerate.data_loader import BatchSamplerShard
    out = []
    r, w = g.rank, g.world_size
    record(out, g.gather(np.arange(r + 2, dtype=np.float32)[None].repeat(r % 2 + 1, 0) + r))
    record(out, g.reduce(np.array([0.1 * (r + 1), 1e7, 1 / (r + 3)], dtype=np.float32)))
    record(out, g.reduce(torch.tensor([r, -r, 7]), "max"))
    # a node's parts past the engine's first round (4 KiB): the second round carries them
    record(out, g.gather(torch.arange((2000 + 97 * r) * 8, dtype=torch.float32).reshape(-1, 8)
                         / (r + 1)))
    record(out, g.broadcast(torch.arange(4) * (r + 1), from_process=w - 1))
    record(out, g.gather_object([{"rank": r, "text": "x" * r}]))
    record(out, g.broadcast_object({"from": r}, from_process=1))
    g.barrier()
    for n in (37, 19):  # DistributedSampler: strided, with the last batch's duplicates
        sampler = torch.utils.data.DistributedSampler(Squares(n), num_replicas=w, rank=r,
                                                      shuffle=False)
        loader = torch.utils.data.DataLoader(Squares(n), batch_size=3, sampler=sampler)
        for batch in g.eval_loop(loader):
            body(g, batch, out)
    for even in (True, False):  # Accelerate's sharding, even_batches on and off
        for n in (41, 23):
            ds = Squares(n)
            bs = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 4, False)
            shard = BatchSamplerShard(bs, num_processes=w, process_index=r, split_batches=False,
                                      even_batches=even)
            loader = torch.utils.data.DataLoader(ds, batch_sampler=shard)
            for batch in g.eval_loop(loader, num_samples=n, order="rank"):
                body(g, batch, out)
    # by position, more calls a batch than the pass counts and one in the last batch only
    n = 29
    per = -(-n // w)
    loader = [torch.tensor([j * w + r]) for j in range(per)]
    for step, x in enumerate(g.eval_loop(loader, num_samples=n, order="rank")):
        for k in range(18):
            record(out, g.gather_for_metrics(x * 100 + k))
        if step == per - 1:
            record(out, g.gather_for_metrics(x * 7))
    return out


def accelerate_loop():
    """The loop an Accelerate user writes, across nodes: every metric input exactly once."""
    from accelerate import Accelerator
    import deval.accelerate
    acc = Accelerator(cpu=True)
    g = deval.accelerate.enable(acc)
    assert g.nodes == 2, g.nodes
    for n, even in ((41, True), (23, True), (37, False)):
        acc.even_batches = even
        ds = Squares(n)
        loader = acc.prepare(torch.utils.data.DataLoader(ds, batch_size=4))
        preds, labels = [], []
        for x, y in loader:
            p, l = acc.gather_for_metrics((x[:, 0] * 2, y))
            preds.append(p)
            labels.append(l)
        labels = torch.cat(labels)
        assert labels.tolist() == list(range(n)), (n, even, labels.tolist())
        assert torch.cat(preds).tolist() == [2.0 * i for i in range(n)], (n, even)
    os.write(1, b"rank %d node %d/2: accelerate exact\n" % (g.rank, g.node))
    deval.accelerate.disable()


def main():
    if sys.argv[1] == "accelerate":
        return accelerate_loop()
    dist.init_process_group("gloo")
    mode = sys.argv[1]
    timeout = float(os.environ.get("SPAN_TIMEOUT", "60"))
    g = deval.join(timeout=timeout)
    say = "rank %d node %d/%d" % (g.rank, g.node, g.nodes)
    if mode == "compare":
        a = sequence(g)
        flat = deval.join("flat-" + g.name, g.rank, g.world_size, timeout=timeout,
                          socket=os.environ["SPAN_FLAT_SOCKET"])
        b = sequence(flat)
        assert len(a) == len(b), (len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert x == y, "result %d differs: %r vs %r" % (i, x, y)
        os.write(1, b"%s: identical %d\n" % (say.encode(), len(a)))
        g.leave()
        flat.leave()
        # deval's gloo groups went with the group: only the job's own is left
        left = len(dist.distributed_c10d._world.pg_map)
        assert left == 1, "%d process groups after leave" % left
        dist.destroy_process_group()
        return
    victim = int(os.environ["SPAN_VICTIM"])
    t0 = time.monotonic()
    try:
        for i in range(100000):
            if i == 5 and g.rank == victim:
                os.kill(os.getpid(), signal.SIGKILL if sys.argv[2] == "kill" else signal.SIGSTOP)
            g.gather(np.array([g.rank]))
    except deval.Error as e:
        os.write(1, ("%s: %s after %.1f s: %s\n" % (say, type(e).__name__,
                                                    time.monotonic() - t0, e)).encode())
        os._exit(0)  # torch.distributed cannot be torn down with a peer gone
    os.write(1, ("%s: no failure\n" % say).encode())
    os._exit(1)


if __name__ == "__main__":
    main()
