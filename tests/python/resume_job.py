# SPDX-License-Identifier: MIT
"""An evaluation job that test_resume.py runs under torchrun --max-restarts=1: the run with
restart count 0 dies at a batch (a rank kills itself, or kills devald), the launcher starts
the job again, and it finishes. Each rank appends one byte to fw-RESTART-RANK per forward
pass over real samples (written at once, so a killed rank's count survives) and saves what
its loop gathered.

Environment: OUT (a directory), RUN (0 or 1: which run of a job run twice by hand, with
$DEVAL_RESUME_KEY), MODE (loop, accelerate, trainer), N samples, KILL
("RANK:BATCH": that rank SIGKILLs itself before the batch's forward; "devald:BATCH": rank 0
kills devald there), SEED0 / SEED1 (the sampler's seed in the first run / the restart).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import torch

import deval

OUT = os.environ["OUT"]
MODE = os.environ.get("MODE", "loop")
N = int(os.environ.get("N", "101"))
B = 4
# which run of the job this is: torchrun's restart count, or RUN for a job run again by hand
RESTART = int(os.environ.get("RUN", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
SEED = int(os.environ.get("SEED%d" % min(RESTART, 1), "1"))
KILL = os.environ.get("KILL", "") if RESTART == 0 else ""
RANK = int(os.environ["RANK"])
fw = os.open(os.path.join(OUT, "fw-%d-%d" % (RESTART, RANK)),
             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def maybe_die(i):
    if not KILL:
        return
    who, at = KILL.split(":")
    if int(at) != i:
        return
    if who == "devald" and RANK == 0:
        ctl = os.environ["DEVAL_CTL"]
        pid = json.loads(subprocess.run([ctl, "status", "--json"], capture_output=True,
                                        text=True, check=True).stdout)["pid"]
        os.kill(pid, signal.SIGKILL)
    elif who != "devald" and int(who) == RANK:
        os.kill(os.getpid(), signal.SIGKILL)


class Model(torch.nn.Module):
    """A linear layer; with RANDOM=1 its output goes through dropout (left in training mode,
    as Monte Carlo dropout does) and a sampled token is appended (as sampled generation
    does), both drawing from torch's generator, seeded once."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.lin = torch.nn.Linear(3, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.calls = 0

    def forward(self, x, labels=None):
        maybe_die(self.calls)
        self.calls += 1
        real = deval.real_rows()
        if real is None or real.any():
            os.write(fw, b".")
        logits = self.lin(x)
        if os.environ.get("RANDOM") == "1":
            logits = self.drop(logits)
            token = torch.multinomial(torch.softmax(logits, -1), 1).float()
            logits = torch.cat([logits[:, :3], token], 1)
        if labels is None:
            return logits
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(N, 3, generator=g)
        self.y = torch.randint(0, 4, (N,), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i], "idx": i}


def save(rank, **arrays):
    np.savez(os.path.join(OUT, "out-%d.npz" % rank), **arrays)


def loop():
    g = deval.join()
    ds = Data()
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=g.world_size, rank=g.rank,
                                                  shuffle=True, seed=SEED)
    loader = torch.utils.data.DataLoader(ds, batch_size=B, sampler=sampler)
    model = Model()
    logits, idx, words = [], [], []
    for batch in g.eval_loop(loader):
        with torch.no_grad():
            out = model(batch["x"])
        lg, ix = g.gather_for_metrics((out, batch["idx"]))
        words += g.gather_for_metrics(["w%d" % int(i) for i in batch["idx"]])
        pad = g.pad_across_processes(out[:, : 1 + int(batch["idx"][0]) % 3], dim=1)
        logits.append(lg.numpy())
        idx.append(ix.numpy())
        del pad
    save(g.rank, logits=np.concatenate(logits), idx=np.concatenate(idx),
         words=np.array(words))


def accelerate():
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc)
    ds = Data()
    gen = torch.Generator().manual_seed(SEED)
    loader = acc.prepare(torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True,
                                                     generator=gen))
    model = Model()
    logits, idx = [], []
    for batch in loader:
        with torch.no_grad():
            out = model(batch["x"])
        lg, ix = acc.gather_for_metrics((out, batch["idx"]))
        logits.append(lg.numpy())
        idx.append(ix.numpy())
    save(acc.process_index, logits=np.concatenate(logits), idx=np.concatenate(idx))


def trainer():
    import transformers
    args = transformers.TrainingArguments(output_dir=os.path.join(OUT, "trainer"),
                                          per_device_eval_batch_size=B, use_cpu=True,
                                          report_to=[], seed=SEED, disable_tqdm=True)

    def metrics(p):
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean()),
                "n": float(len(p.label_ids)),
                "sum": float(np.float64(p.predictions).sum())}

    class Rows(torch.utils.data.Dataset):  # the Trainer drops columns its model lacks
        def __init__(self):
            self.d = Data()

        def __len__(self):
            return N

        def __getitem__(self, i):
            s = self.d[i]
            return {"x": s["x"], "labels": s["labels"]}

    t = transformers.Trainer(model=Model(), args=args, eval_dataset=Rows(),
                             compute_metrics=metrics)
    deval.accelerate.enable(t)
    m = t.evaluate()
    if t.args.process_index == 0:
        with open(os.path.join(OUT, "metrics.json"), "w") as f:
            json.dump(m, f)


def snapshot():
    """torchrun's fault-tolerant training pattern: a snapshot after each epoch's training,
    loaded on a restart, and an evaluation of the same loader after each epoch. Each
    evaluation's rows are checked against the model of its epoch."""
    g = deval.join()
    ds = Data()
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=g.world_size, rank=g.rank,
                                                  shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=B, sampler=sampler)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    snap, start = os.path.join(OUT, "snapshot.pt"), 0
    g.barrier()
    if os.path.exists(snap):
        s = torch.load(snap)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        start = s["epoch"]
    stale = 0
    for epoch in range(start, 4):
        for _ in range(5):  # full-batch training: no random draws, the same on every rank
            loss = torch.nn.functional.cross_entropy(model.lin(ds.x), ds.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if RANK == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "epoch": epoch + 1}, snap + ".tmp")
            os.replace(snap + ".tmp", snap)
        g.barrier()
        model.calls = 100 * epoch
        for batch in g.eval_loop(loader):
            with torch.no_grad():
                out, ix = g.gather_for_metrics((model(batch["x"]), batch["idx"]))
                # (close, not equal: a batch of 4 and one of every row may round the last
                # bit apart in the BLAS kernel; an older epoch's model is off by far more)
                near = torch.isclose(out, model.lin(ds.x[ix]), rtol=1e-5, atol=1e-6)
                stale += int((~near).any(1).sum())
    with open(os.path.join(OUT, "stale-%d" % RANK), "w") as f:
        f.write(str(stale))


{"loop": loop, "accelerate": accelerate, "trainer": trainer, "snapshot": snapshot}[MODE]()
sys.exit(0)
