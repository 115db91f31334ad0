#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A torch DistributedSampler evaluation loop with deval: results come back in dataset order.

    python -m deval.launch -n 3 examples/distributed_sampler.py    (needs torch)

DistributedSampler deals samples round-robin and pads the last round with the first samples;
eval_loop sees the sampler, puts every sample back at its dataset position and drops the
padding, for each gather_for_metrics call of a batch.
"""

import os
import sys

import deval

try:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler
except ImportError:
    print("distributed_sampler.py needs torch, which is not installed")
    sys.exit(0)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dataset = torch.arange(100, dtype=torch.int64) * 10           # sample i is 10*i
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    seen, again = [], []
    with deval.join() as g:                     # the group from python -m deval.launch
        for batch in g.eval_loop(loader):        # strided order and num_samples from the sampler
            seen.append(g.gather_for_metrics(batch * 2))        # a torch tensor comes back
            again.append(g.gather_for_metrics(batch))           # a second call of the batch
    out = torch.cat(seen)
    if rank == 0:
        ok = torch.equal(out, dataset * 2) and torch.equal(torch.cat(again), dataset)
        print("%d results in dataset order: %s" % (len(out), ok))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
