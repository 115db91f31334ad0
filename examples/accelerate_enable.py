#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""An Accelerate evaluation loop, unchanged, with one line that puts its gathers on deval.

    torchrun --nproc-per-node 3 examples/accelerate_enable.py      (needs torch, accelerate)

The loader is prepared with even_batches=False, so the ranks hold different numbers of
batches (50 samples, batch 8: 3, 2 and 2 batches), and the loop gathers predictions and
labels in two calls per batch. Plain Accelerate's ranks would then make different
collectives; with deval every rank gets all 50 samples, in dataset order.
"""

import sys

import deval
import deval.accelerate

try:
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset
except ImportError:
    print("accelerate_enable.py needs torch and accelerate, which are not installed")
    sys.exit(0)


def main():
    torch.manual_seed(0)
    x = torch.randn(50, 4)
    y = torch.arange(50) % 3
    model = torch.nn.Linear(4, 3)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        even_batches=False))
    deval.accelerate.enable(accelerator)                          # the one line
    loader = accelerator.prepare(DataLoader(TensorDataset(x, y), batch_size=8))

    preds, labels = [], []
    model.eval()
    with torch.no_grad():
        for xb, yb in loader:                                      # the loop people write
            preds.append(accelerator.gather_for_metrics(model(xb).argmax(-1)))
            labels.append(accelerator.gather_for_metrics(yb))
    preds, labels = torch.cat(preds), torch.cat(labels)
    with torch.no_grad():
        want = model(x).argmax(-1)
    ok = torch.equal(preds, want) and torch.equal(labels, y)
    print("rank %d: %d predictions for %d samples, accuracy %.3f, same as one process: %s"
          % (accelerator.process_index, len(preds), len(x),
             float((preds == labels).float().mean()), ok))
    deval.accelerate.disable()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
