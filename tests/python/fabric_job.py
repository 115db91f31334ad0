# SPDX-License-Identifier: MIT
"""A Fabric evaluation loop: python fabric_job.py DEVICES N. Fabric's own launcher starts the
ranks; deval.lightning.enable(fabric) gives the deval group, whose eval_loop reads the loader
setup_dataloaders made (a DistributedSampler's padded shards) and returns each sample once.
Each rank prints the rows it gathered and a torchmetrics metric's value."""

import os
import sys

import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

import lightning as Lg

import deval.lightning


def main():
    devices, n = int(sys.argv[1]), int(sys.argv[2])
    fabric = Lg.Fabric(accelerator="cpu", devices=devices,
                       strategy="ddp" if devices > 1 else "auto")
    fabric.launch()
    g = deval.lightning.enable(fabric)
    ds = TensorDataset(torch.arange(n), (torch.arange(n) * 7) % 3)
    loader = fabric.setup_dataloaders(DataLoader(ds, batch_size=4))
    metric = torchmetrics.MeanMetric()
    rows = []
    for i, y in g.eval_loop(loader):
        metric.update(y.float())
        rows += g.gather_for_metrics(i).tolist()
    line = "rank %d of %d: rows %s mean %.6f\n" % (g.rank, g.world_size, rows,
                                                  float(metric.compute()))
    os.write(1, line.encode())  # (one write: the ranks' lines never interleave)


if __name__ == "__main__":
    main()
