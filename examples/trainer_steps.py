#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A transformers Trainer that evaluates every 4 training steps, its gathers on deval.

    torchrun --nproc-per-node 2 examples/trainer_steps.py    (needs torch, transformers)
    torchrun --nproc-per-node 1 examples/trainer_steps.py    (the same run in one process;
    python examples/trainer_steps.py                          or with no launcher at all)

A tiny BERT made from a config (nothing is downloaded) learns to classify 8-token sequences
into 3 classes. Every 4 steps the Trainer evaluates 37 samples, 4 per batch on each rank: the
ranks' shards are uneven, and the last batches are padded by Accelerate. compute_metrics
sees all 37 predictions in dataset order, once each, and rank 0 prints:

    step 4: accuracy 0.514 macro-F1 0.424 predictions 1221212122222222222222221212212222222
    step 8: accuracy 0.595 macro-F1 0.483 predictions 1221112111222221222222221212212221222
    step 12: accuracy 1.000 macro-F1 1.000 predictions 1021110110200110002002221212211201202

The global training batch is 8 on one process or two (gradient accumulation makes up for the
missing rank), so both train on the same batches and print the same lines.
"""

import os
import sys
import tempfile

import deval.accelerate

try:
    import numpy as np
    import torch
    from transformers import (BertConfig, BertForSequenceClassification, PrinterCallback,
                              Trainer, TrainingArguments)
except ImportError:
    print("trainer_steps.py needs torch and transformers, which are not installed")
    sys.exit(0)

CLASSES, VOCAB, LENGTH = 3, 21, 8


class Sequences(torch.utils.data.Dataset):
    """n random token sequences; the label is the class of the first token."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i, 0] * CLASSES // VOCAB}


def macro_f1(preds, labels):
    f1 = []
    for c in range(CLASSES):
        tp = np.sum((preds == c) & (labels == c))
        fp, fn = np.sum((preds == c) & (labels != c)), np.sum((preds != c) & (labels == c))
        f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1))


def main(out):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=CLASSES,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    args = TrainingArguments(
        output_dir=out, use_cpu=True, report_to="none",
        per_device_train_batch_size=4, gradient_accumulation_steps=max(1, 2 // world),
        per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=4, max_steps=12,
        learning_rate=1e-2, ddp_find_unused_parameters=False, save_strategy="no",
        logging_strategy="no", disable_tqdm=True)
    trainer = None

    def compute_metrics(p):
        preds, labels = p.predictions.argmax(-1), p.label_ids
        if trainer.is_world_process_zero():
            print("step %d: accuracy %.3f macro-F1 %.3f predictions %s" % (
                trainer.state.global_step, np.mean(preds == labels), macro_f1(preds, labels),
                "".join(map(str, preds))), flush=True)
        return {"accuracy": float(np.mean(preds == labels))}

    trainer = Trainer(model=model, args=args, train_dataset=Sequences(64, seed=1),
                      eval_dataset=Sequences(37, seed=2), compute_metrics=compute_metrics)
    trainer.remove_callback(PrinterCallback)
    deval.accelerate.enable(trainer)                              # the one line
    trainer.train()
    deval.accelerate.disable()
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="trainer-steps-") as out:  # (no checkpoints)
        sys.exit(main(out))
