#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A torch DistributedSampler evaluation loop with deval: results come back in dataset order.

    torchrun --nproc-per-node 3 examples/distributed_sampler.py      (needs torch)
    python -m deval.launch -n 3 examples/distributed_sampler.py      (the same)
    torchrun --nproc-per-node 1 examples/distributed_sampler.py      (the same in one process)

DistributedSampler deals 100 samples round-robin to the ranks and pads the last round with
the first samples (3 ranks: 34 each, 2 of them copies). eval_loop sees the sampler, puts every
sample back at its dataset position and drops the padding, for each gather_for_metrics call of
a batch (here two: the predictions, then the labels). Rank 0 prints:

    100 predictions, accuracy 0.33:
    22100111212202000020212210211200212222201121210102
    11102202202100210100002121212121010211001221220100
"""

import sys

import deval

try:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
except ImportError:
    print("distributed_sampler.py needs torch, which is not installed")
    sys.exit(0)


def main():
    torch.manual_seed(0)
    x, y = torch.randn(100, 4), torch.randint(0, 3, (100,))
    model = torch.nn.Linear(4, 3)
    with deval.join() as g:                     # the group from the launcher
        dataset = TensorDataset(x, y)
        sampler = DistributedSampler(dataset, g.world_size, g.rank, shuffle=False)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        preds, labels = [], []
        for xb, yb in g.eval_loop(loader):      # strided order and num_samples from the sampler
            with torch.no_grad():
                preds.append(g.gather_for_metrics(model(xb).argmax(-1)))  # a torch tensor
            labels.append(g.gather_for_metrics(yb))            # a second call of the batch
    preds, labels = torch.cat(preds), torch.cat(labels)
    assert torch.equal(labels, y)               # every label, in dataset order, once
    if g.rank == 0:
        print("%d predictions, accuracy %.2f:" % (len(preds), (preds == labels).float().mean()))
        for i in range(0, len(preds), 50):
            print("".join(map(str, preds[i:i + 50].tolist())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
