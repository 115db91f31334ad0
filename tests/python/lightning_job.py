# SPDX-License-Identifier: MIT
"""A Lightning job as its users write it: python lightning_job.py DEVICES HOW N OUT.

Trainer(accelerator="cpu", devices=DEVICES, strategy="ddp") (Lightning's own launcher starts
the other ranks by running this script again); HOW is "deval" (deval.lightning.enable),
"callback" (Trainer(callbacks=[deval.lightning.Exact()])), "plain", or "apart" (deval, over a
sampler of its own that draws another order on each rank, which must fail on every rank). A fixed classifier over N samples in batches of 4 is validated, tested, fitted with
a learning rate of 0 (its validation logs), and predicts. Rank 0 writes what each returned,
as JSON, to OUT; every rank checks that its predictions are whole under deval.
"""

import json
import os
import sys

import torch
import torchmetrics
from torch.utils.data import DataLoader, Dataset

import deval
import lightning.pytorch as L

devices, how, n, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]


class Samples(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 6, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.lin = torch.nn.Linear(6, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(3, 6, generator=g))
            self.lin.bias.zero_()
        self.acc = torchmetrics.classification.MulticlassAccuracy(3, average="micro")
        self.mse = torchmetrics.MeanSquaredError()
        self.auroc = torchmetrics.classification.MulticlassAUROC(3)  # called: forward
        self.plain = {"n": torchmetrics.SumMetric()}  # a plain dict: no submodule
        self.seen, self.in_step = [], []
        self.several, self.seen_by, self.seen_all = False, {}, []
        self.twice, self.kept = False, []  # 2 rows per sample of the first of two loaders
        self.count = torchmetrics.SumMetric()

    def forward(self, x):
        return self.lin(x)

    def _eval(self, batch, prefix):
        x, y, i = batch
        logits = self(x)
        pred = logits.argmax(1)
        self.log(prefix + "acc_log", (pred == y).float().mean(), sync_dist=True,
                 batch_size=len(y))
        self.log(prefix + "loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True,
                 batch_size=len(y))
        # a collective in every step: every rank must run as many steps
        self.log(prefix + "step_rows", float(len(y)), on_step=True, on_epoch=False,
                 sync_dist=True, batch_size=len(y))
        self.acc(pred, y)
        self.log(prefix + "acc_metric", self.acc)
        self.mse.update(logits[:, 0], y.float())
        self.log(prefix + "mse", self.mse)
        self.auroc(logits.softmax(1), y)
        self.log(prefix + "auroc", self.auroc)
        self.plain["n"].update(torch.ones(len(y)))
        self.seen.append(i)
        self.in_step.append(self.all_gather(i).reshape(-1))  # a gather in every step
        return {"loss": torch.nn.functional.cross_entropy(logits, y), "n": len(y)}

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        if not (self.several or self.twice):  # logged after the step, from what it returned
            self.log("val_after", outputs["loss"], sync_dist=True, batch_size=outputs["n"])

    def _counts(self):
        # the rows the steps saw, gathered as Lightning's users do
        seen = torch.cat(self.seen) if self.seen else torch.zeros(0, dtype=torch.long)
        self.seen = []
        rows = self.all_gather(seen).reshape(-1)
        ranks = self.all_gather(torch.tensor(self.global_rank))  # a per-rank value
        in_step = torch.cat(self.in_step).tolist()
        self.in_step = []
        n_metric = float(self.plain["n"].compute())
        self.plain["n"].reset()
        return {"rows": rows.tolist(), "ranks": ranks.reshape(-1).tolist(),
                "in_step": in_step, "plain_n": n_metric}

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        if self.twice:  # (generation's 2 sequences per sample, kept for the first loader)
            real = deval.real_rows()
            if dataloader_idx == 0 and (real is None or real.any()):
                self.kept.append((batch[2].repeat_interleave(2) * 10 +
                                  torch.arange(2).repeat(len(batch[2]))).unsqueeze(1))
            return
        if self.several:  # several loaders: what each rank's steps saw of each, and of all
            self.seen_by.setdefault(dataloader_idx, []).append(batch[2])
            real = deval.real_rows()
            if real is None or real.any():  # (the docs' way to skip a padding step)
                self.seen_all.append(batch[2] + 1000 * dataloader_idx)
            return
        return self._eval(batch, "val_")

    def on_validation_epoch_end(self):
        if self.twice:  # as well 1 row per sample of both loaders: which, nothing tells
            try:
                got = self.all_gather(torch.cat(self.kept)).reshape(-1).tolist()
            except deval.Mismatch:
                got = "Mismatch"
            self.kept, self.twice_rows = [], got
            return
        if self.several:
            self.by_loader = [sorted(self.all_gather(torch.cat(v)).reshape(-1).tolist())
                              for _, v in sorted(self.seen_by.items())]
            mine = torch.cat(self.seen_all)
            self.all_rows = self.all_gather(mine).reshape(-1).tolist()  # every loader's
            self.count.update(torch.ones(len(mine)))  # a metric updated after the steps
            self.counted = float(self.count.compute())
            self.seen_by, self.seen_all = {}, []
            return
        self.val_counts = self._counts()

    def test_step(self, batch, batch_idx):
        return self._eval(batch, "test_")

    def on_test_epoch_end(self):
        self.test_counts = self._counts()

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def predict_step(self, batch, batch_idx):
        x, _, i = batch
        return {"index": i, "pred": self(x).argmax(1)}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def loader(n):
    return DataLoader(Samples(n), batch_size=4)


class MyBatches(torch.utils.data.BatchSampler):
    """A batch sampler of one's own (its sizes are not read from torch's settings)."""


class Apart(torch.utils.data.Sampler):
    """A sampler of one's own that draws from each process's global generator."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


def main():
    import deval.lightning

    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1
                        else "auto", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, max_epochs=1,
                        num_sanity_val_steps=0, inference_mode=False,
                        callbacks=[deval.lightning.Exact()] if how == "callback" else None)
    if how in ("deval", "apart"):
        deval.lightning.enable(trainer)
    model = Model()
    if how == "apart":
        torch.manual_seed(trainer.global_rank)
        try:
            trainer.validate(model, DataLoader(Samples(n), batch_size=4, sampler=Apart(n)),
                             verbose=False)
            raise AssertionError("a sampler that draws apart was dealt")
        except deval.Mismatch as e:
            # (one write: the ranks' lines never interleave)
            os.write(1, ("rank %d: Mismatch: %s\n" % (trainer.global_rank, e)).encode())
        from lightning.pytorch.utilities import CombinedLoader
        model.several = True
        try:  # two loaders read at once: refused on every rank
            trainer.validate(model, CombinedLoader({"a": loader(n), "b": loader(7)},
                                                   "max_size"), verbose=False)
            raise AssertionError("a CombinedLoader in max_size mode was dealt")
        except deval.InvalidArgument as e:
            os.write(1, ("rank %d: InvalidArgument: %s\n" % (trainer.global_rank, e)).encode())
        return
    r = {}
    r["validate"] = trainer.validate(model, loader(n), verbose=False)[0]
    r["val_counts"] = model.val_counts
    r["test"] = trainer.test(model, loader(n), verbose=False)[0]
    r["test_counts"] = model.test_counts
    trainer.fit(model, loader(n), loader(n))
    r["fit"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    # three loaders at once: one shuffled (no seed: deval draws it alike on every rank), and
    # one of as many samples through a BatchSampler of one's own
    model.several = True
    torch.manual_seed(trainer.global_rank)
    own = MyBatches(torch.utils.data.SequentialSampler(Samples(7)), 3, False)
    trainer.validate(model, [loader(n), DataLoader(Samples(7), batch_size=3, shuffle=True),
                             DataLoader(Samples(7), batch_sampler=own)], verbose=False)
    r["by_loader"] = model.by_loader
    r["all_rows"], r["counted"] = model.all_rows, model.counted
    model.several = False
    model.twice = True
    trainer.validate(model, [DataLoader(Samples(5), batch_size=2),
                             DataLoader(Samples(5), batch_size=2)], verbose=False)
    model.twice = False
    r["twice"] = model.twice_rows
    preds = trainer.predict(model, loader(n))
    r["predict"] = [[int(v) for v in p["index"]] for p in preds]
    r["predict_values"] = [[int(v) for v in p["pred"]] for p in preds]
    if how != "plain" or devices <= 2:  # (Lightning's own sampler fails a rank with none)
        few = trainer.predict(model, loader(2))  # fewer samples than ranks
        r["predict_few"] = [[int(v) for v in p["index"]] for p in few]
    if how != "plain":
        assert sum(len(b) for b in r["predict"]) == n, r["predict"]
        g = deval.join()  # under Lightning's launcher, with no argument
        assert g.rank == trainer.global_rank, (g.rank, trainer.global_rank)
        r["join"] = [g.world_size, g.name.startswith("lightning-")]
    if trainer.global_rank == 0:
        with open(out, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
