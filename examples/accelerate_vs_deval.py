#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The same evaluation loop with Accelerate and with deval, side by side.

    python -m deval.launch -n 2 examples/accelerate_vs_deval.py    (after pip install .)

Only the deval loop runs here; the Accelerate one is the code it replaces.
"""

import os
import sys

import numpy as np

import deval


def evaluate_with_accelerate(model, loader, accelerator):  # pragma: no cover - for reading
    """What people write today (Accelerate over NCCL or gloo)."""
    preds_all, labels_all = [], []
    for batch in loader:                        # loader = accelerator.prepare(loader)
        logits = model(batch["x"])
        logits = accelerator.pad_across_processes(logits, dim=1, pad_index=-100)
        preds, labels = accelerator.gather_for_metrics((logits.argmax(-1), batch["y"]))
        preds_all.append(preds)
        labels_all.append(labels)
    return preds_all, labels_all


def evaluate_with_deval(model, batches, group, num_samples):
    """The same loop with deval: padding, ordering and de-duplication in the gathers. (A
    prepared Accelerate or DistributedSampler loader tells eval_loop num_samples and order
    itself; this hand-made list of batches cannot.)"""
    preds_all, labels_all = [], []
    for batch in group.eval_loop(batches, num_samples=num_samples, order="rank"):
        logits = model(batch["x"])                        # ragged dims are fine as they are
        preds_all.append(group.gather_for_metrics(logits.argmax(-1)))   # two calls per batch
        labels_all.append(group.gather_for_metrics(batch["y"]))
    return np.concatenate(preds_all), np.concatenate(labels_all)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    n, bs = 50, 8
    w = np.random.default_rng(0).normal(size=(4, 3))

    def model(x):
        return x @ w

    # Accelerate's sharding: batches dealt round-robin, the last round completed from the start
    nb = -(-n // bs)
    rounds = -(-nb // world)
    data = np.random.default_rng(1).normal(size=(n, 4))
    batches = []
    for b in range(rank, rounds * world, world):
        idx = [(b * bs + j) % n for j in range(bs)]
        batches.append({"x": data[idx], "y": np.array(idx) % 3})
    with deval.join() as g:                     # the group from python -m deval.launch
        preds, labels = evaluate_with_deval(model, batches, g, n)
    if rank == 0:
        want = (data @ w).argmax(-1)
        print("%d predictions gathered for %d samples; accuracy %.3f; same as one process: %s"
              % (len(preds), n, float(np.mean(preds == labels)), bool((preds == want).all())))
        return 0 if len(preds) == n and (preds == want).all() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
