#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A Lightning module validated, tested and predicting on several devices, exactly.

    python examples/lightning_eval.py --devices 3    (needs torch, torchmetrics, lightning)
    python examples/lightning_eval.py --devices 1    (the same on one device)

Lightning's own launcher starts the other ranks (strategy="ddp" on the CPU). An untrained
linear model classifies 50 reviews into 4 topics, in batches of 8: it logs its batch accuracy
with sync_dist=True, a torchmetrics macro F1 and MeanSquaredError of the rating, and gathers
the topics it predicted with self.all_gather. Without deval, 3 devices evaluate 51 samples
(DistributedSampler repeats sample 0) and trainer.predict returns a third on each rank. With
deval.lightning.enable(trainer), rank 0 prints what one device prints:

    validate: accuracy 0.159999996 macro-F1 0.162604794 rating MSE 2.10500002 rows 50
    predict: 50 predictions, topics 1 2 3 2 0 ...
"""

import argparse
import sys

try:
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torchmetrics import F1Score, MeanSquaredError
except ImportError:
    print("lightning_eval.py needs torch, torchmetrics and lightning, which are not installed")
    sys.exit(0)

import deval.lightning


def reviews(n):
    """n reviews: features, a topic (0-3) and a rating of 1 to 5 stars in halves."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return x, torch.randint(0, 4, (n,), generator=g), torch.randint(2, 11, (n,), generator=g) / 2


class Reviews(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.topic, self.rate = torch.nn.Linear(8, 4), torch.nn.Linear(8, 1)
        self.f1 = F1Score(task="multiclass", num_classes=4, average="macro")
        self.mse = MeanSquaredError()
        self.topics = []

    def forward(self, x):
        # ratings in halves, as the labels are (their squared errors add up exactly)
        return self.topic(x).argmax(-1), (2 + 8 * self.rate(x)[:, 0].sigmoid()).round() / 2

    def validation_step(self, batch, batch_idx):
        x, y, stars = batch
        topic, rating = self(x)
        self.log("accuracy", (topic == y).float().mean(), sync_dist=True, batch_size=len(y))
        self.f1.update(topic, y)
        self.log("macro-F1", self.f1)
        self.mse.update(rating, stars)
        self.log("rating MSE", self.mse)
        self.topics.append(topic)

    def on_validation_epoch_end(self):
        self.rows = self.all_gather(torch.cat(self.topics)).reshape(-1)
        self.topics = []

    def predict_step(self, batch, batch_idx):
        return self(batch[0])[0]


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--devices", type=int, default=3)
    devices = a.parse_args().devices
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else
                        "auto", logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    deval.lightning.enable(trainer)
    model = Reviews()
    loader = DataLoader(TensorDataset(*reviews(50)), batch_size=8)
    got = trainer.validate(model, loader, verbose=False)[0]
    topics = torch.cat(trainer.predict(model, loader))
    if trainer.global_rank == 0:  # (9 digits: every bit of a float32)
        print("validate: accuracy %.9g macro-F1 %.9g rating MSE %.9g rows %d" % (
            got["accuracy"], got["macro-F1"], got["rating MSE"], len(model.rows)))
        print("predict: %d predictions, topics %s ..." % (
            len(topics), " ".join(str(int(t)) for t in topics[:5])))


if __name__ == "__main__":
    main()
