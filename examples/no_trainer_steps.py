#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""An Accelerate training loop in the shape of its run_*_no_trainer scripts, evaluating every 5
optimizer steps with gather_for_metrics, switched to deval by one line.

    torchrun --nproc-per-node 2 examples/no_trainer_steps.py    (needs torch, accelerate)
    accelerate launch --multi_gpu --num_processes 2 examples/no_trainer_steps.py  (the same)
    python examples/no_trainer_steps.py                          (the same in one process)

(accelerate launch --cpu starts one process, whatever --num_processes says; --multi_gpu
starts them through torchrun, and Accelerator(cpu=True) keeps them on the CPU.)

A small network learns which of 4 clusters a point comes from. Every 5 steps it is evaluated
on 45 held-out points, 4 per batch on each rank, and rank 0 prints the accuracy, the mean
loss over the samples and the predictions in dataset order:

    step 5: accuracy 0.289 loss 1.3581 predictions 101010301011111000100011000110011110010000111
    step 10: accuracy 0.511 loss 0.9967 predictions 103023231021113033130031000213322110313300213
    step 15: accuracy 0.667 loss 0.6779 predictions 033023233323113333230033323213322120313300213

The global batch is 8 on one process or two (gradient accumulation makes up for the missing
rank), so both train on the same batches and print the same lines.
"""

import os
import sys

import deval.accelerate

try:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader, TensorDataset
except ImportError:
    print("no_trainer_steps.py needs torch and accelerate, which are not installed")
    sys.exit(0)


def points(n, seed):
    """n points around 4 centres in 8 dimensions, and which centre each is from."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def main():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=max(1, 2 // world))
    deval.accelerate.enable(accelerator)                          # the one line
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    train = DataLoader(points(240, seed=1), batch_size=4, shuffle=True,
                       generator=torch.Generator().manual_seed(0))  # one order at any size
    evals = DataLoader(points(45, seed=2), batch_size=4)
    model, optimizer, train, evals = accelerator.prepare(model, optimizer, train, evals)

    def evaluate(step):
        model.eval()
        preds, labels, losses = [], [], []
        for x, y in evals:
            with torch.no_grad():
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y, reduction="none")
            p, t, l = accelerator.gather_for_metrics((logits.argmax(-1), y, loss))
            preds.append(p)
            labels.append(t)
            losses.append(l)
        preds, labels, losses = torch.cat(preds), torch.cat(labels), torch.cat(losses)
        if accelerator.is_main_process:
            print("step %d: accuracy %.3f loss %.4f predictions %s" % (
                step, (preds == labels).float().mean(), losses.mean(),
                "".join(map(str, preds.tolist()))), flush=True)
        model.train()

    step = 0
    model.train()
    for x, y in train:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            if step % 5 == 0:
                evaluate(step)
            if step == 15:
                break
    deval.accelerate.disable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
