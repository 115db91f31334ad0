#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torchmetrics objects updated on each rank and computed through deval, each sample once.

    torchrun --nproc-per-node 3 examples/torchmetrics_eval.py    (needs torch, torchmetrics)
    torchrun --nproc-per-node 1 examples/torchmetrics_eval.py    (the same in one process)

An untrained linear model classifies 50 reviews into 4 topics and predicts each one's rating in
half stars. Each rank updates an Accuracy, a macro F1 and a MeanSquaredError with its own
batches; DistributedSampler gives 3 ranks 17 samples each, one of them a copy of sample 0.
The metrics attached to deval leave that copy out, and compute() gathers their states
through deval, so rank 0 prints the values of one process:

    50 reviews: accuracy 0.159999996 macro-F1 0.162604794 rating MSE 2.10500002
"""

import sys

import deval
import deval.torchmetrics

try:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torchmetrics import Accuracy, F1Score, MeanSquaredError, MetricCollection
except ImportError:
    print("torchmetrics_eval.py needs torch and torchmetrics, which are not installed")
    sys.exit(0)


def reviews(n):
    """n reviews: features, a topic (0-3) and a rating of 1 to 5 stars in halves."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return x, torch.randint(0, 4, (n,), generator=g), torch.randint(2, 11, (n,), generator=g) / 2


def main():
    torch.manual_seed(0)
    topic, rate = torch.nn.Linear(8, 4), torch.nn.Linear(8, 1)
    with deval.join() as g:                            # the group from the launcher
        deval.torchmetrics.use(g)
        classes = deval.torchmetrics.attach(MetricCollection({
            "accuracy": Accuracy(task="multiclass", num_classes=4),
            "macro-F1": F1Score(task="multiclass", num_classes=4, average="macro")}))
        mse = deval.torchmetrics.attach(MeanSquaredError())
        dataset = TensorDataset(*reviews(50))
        sampler = DistributedSampler(dataset, g.world_size, g.rank, shuffle=False)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        for x, y, stars in g.eval_loop(loader):        # the sampler's copy of 0 is not real
            with torch.no_grad():
                classes.update(topic(x).argmax(-1), y)
                # halves, as the ratings are: (their squared errors add up exactly, in any
                # order, so the sum over ranks is bit for bit the sum in one process)
                mse.update((2 + 8 * rate(x)[:, 0].sigmoid()).round() / 2, stars)
        values = {k: float(v) for k, v in classes.compute().items()}
        rating_mse = float(mse.compute())
    if g.rank == 0:  # (9 digits: every bit of a float32)
        print("%d reviews: accuracy %.9g macro-F1 %.9g rating MSE %.9g" % (
            len(dataset), values["accuracy"], values["macro-F1"], rating_mse))
    return 0


if __name__ == "__main__":
    sys.exit(main())
