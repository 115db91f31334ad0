#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A real distributed evaluation through deval: handwritten digits over 4 processes.

The launcher trains a logistic regression on scikit-learn's bundled digits (no download),
then starts one process per rank, the way torchrun would (RANK, WORLD_SIZE). Each rank takes
its share of the 997 held-out images as torch's DistributedSampler deals them (round-robin,
the list padded with its head so every rank gets as many: 3 duplicates), predicts in batches
of 16, and gathers through deval in an eval pass in dataset ("strided") order: indices,
predictions, labels, per-sample top-k candidate lists of varying length (a ragged dim) and
predicted label names as strings. Rank 0 computes accuracy and macro-F1 from the gathered
arrays and compares them, and a predictions file written in dataset order, with the same
evaluation done in one process.

    .venv/bin/python examples/digits_eval.py [--ranks 4] [--batch 16] [--out DIR]

The predictions files go to DIR, or to a temporary directory removed when the run ends.
"""

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import deval

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
N_TRAIN = 800


def load():
    from sklearn.datasets import load_digits
    d = load_digits()
    X = d.data.astype(np.float64) / 16.0
    return X[:N_TRAIN], d.target[:N_TRAIN], X[N_TRAIN:], d.target[N_TRAIN:]


def topk(probs, k=4, floor=0.02):
    """Each sample's likely labels, most likely first: a list of 1 to k labels."""
    order = np.argsort(-probs, axis=1)
    return [[int(c) for c in row[:k] if p[c] >= floor] or [int(row[0])]
            for row, p in zip(order, probs)]


def metrics(preds, labels):
    from sklearn.metrics import accuracy_score, f1_score
    return accuracy_score(labels, preds), f1_score(labels, preds, average="macro")


def line(i, label, pred, name, cands):
    return "%d\t%d\t%d\t%s\t%s\n" % (i, label, pred, name, ",".join(map(str, cands)))


def rank_main(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(args.model, "rb") as f:
        model = pickle.load(f)
    _, _, X, y = load()
    n = len(X)
    # torch's DistributedSampler, shuffle=False: pad with the head, deal round-robin
    per = -(-n // world)
    indices = (list(range(n)) * 2)[: per * world]
    mine = indices[rank::world]
    batches = [mine[i:i + args.batch] for i in range(0, len(mine), args.batch)]

    g = deval.join(timeout=60)  # the group, rank and world size from the launcher
    got = {"idx": [], "pred": [], "label": [], "topk": [], "name": []}
    local_preds, local_labels = [], []
    # a list of batches says nothing of its sharding: num_samples and order are given
    for b in g.eval_loop(batches, num_samples=n, order="strided"):
        idx = np.array(b, dtype=np.int64)
        probs = model.predict_proba(X[idx])
        preds = probs.argmax(axis=1).astype(np.int64)
        cands = topk(probs)
        width = max(len(c) for c in cands)
        tk = np.full((len(b), width), -1, dtype=np.int64)  # padded to this batch only
        for j, c in enumerate(cands):
            tk[j, : len(c)] = c
        local_preds += preds.tolist()
        local_labels += y[idx].tolist()
        out = g.gather_for_metrics((idx, preds, y[idx].astype(np.int64), tk), pad_index=-1)
        names = g.gather_for_metrics([NAMES[p] for p in preds])
        for key, v in zip(("idx", "pred", "label"), out[:3]):
            got[key] += v.tolist()
        got["topk"] += [row[row >= 0].tolist() for row in out[3]]
        got["name"] += names

    # what each rank would report alone, duplicates and all, averaged over ranks
    local = np.array(metrics(np.array(local_preds), np.array(local_labels)), dtype=np.float64)
    naive = g.reduce(local, "mean")
    evaluated = g.reduce(np.int64(len(mine)), "sum")
    if rank == 0:
        report(args, model, X, y, got, naive, evaluated)
    g.barrier()  # the status table is printed while every rank is still in the group
    g.leave()


def report(args, model, X, y, got, naive, evaluated):
    n = len(X)
    t_all = time.monotonic() - args.t0
    acc, f1 = metrics(np.array(got["pred"]), np.array(got["label"]))
    probs = model.predict_proba(X)
    ref_preds = probs.argmax(axis=1)
    ref_acc, ref_f1 = metrics(ref_preds, y)
    path_deval = os.path.join(args.out, "predictions.deval.tsv")
    path_ref = os.path.join(args.out, "predictions.single.tsv")
    with open(path_deval, "w") as f:
        for row in zip(got["idx"], got["label"], got["pred"], got["name"], got["topk"]):
            f.write(line(*row))
    with open(path_ref, "w") as f:
        for i, (label, pred, cands) in enumerate(zip(y, ref_preds, topk(probs))):
            f.write(line(i, label, pred, NAMES[pred], cands))
    with open(path_deval) as a, open(path_ref) as b:
        lines_a, lines_b = a.readlines(), b.readlines()
    same_lines = sum(1 for u, v in zip(lines_a, lines_b) if u == v)

    print("deval main job: logistic regression on scikit-learn's digits, %d ranks, batch %d"
          % (args.ranks, args.batch))
    print("  held-out images            %d (trained on %d)" % (n, N_TRAIN))
    print("  rows the ranks evaluated   %d (%d duplicates from DistributedSampler's padding)"
          % (evaluated, evaluated - n))
    print("  rows gathered by deval     %d" % len(got["idx"]))
    print("  accuracy  through deval    %.6f   in one process %.6f" % (acc, ref_acc))
    print("  macro-F1  through deval    %.6f   in one process %.6f" % (f1, ref_f1))
    print("  naive mean of per-rank     accuracy %.6f, macro-F1 %.6f (off by %+.6f, %+.6f)"
          % (naive[0], naive[1], naive[0] - ref_acc, naive[1] - ref_f1))
    print("  top-k lists of length      %s" % sorted({len(c) for c in got["topk"]}))
    print("  predictions file           %s: %d of %d lines identical to %s"
          % (path_deval, same_lines, len(lines_b), os.path.basename(path_ref)))
    print("  wall time                  %.2f s" % t_all)
    ctl = os.environ.get("DEVAL_CTL") or shutil.which("deval-ctl")
    if ctl:
        print()
        sys.stdout.flush()
        subprocess.run([ctl, "status"], check=False)
    ok = (acc, f1) == (ref_acc, ref_f1) and len(got["idx"]) == n and \
        same_lines == len(lines_b) == len(lines_a)
    print()
    print("deval == single process: %s" % ("yes, exactly" if ok else "NO"))
    sys.stdout.flush()
    if not ok:
        os._exit(1)


def launch(args):
    from sklearn.linear_model import LogisticRegression
    X, y, _, _ = load()
    model = LogisticRegression(max_iter=2000).fit(X, y)
    tmp = tempfile.mkdtemp(prefix="deval-digits-")
    args.out = args.out or tmp
    model_path = os.path.join(tmp, "model.pkl")
    with open(model_path, "wb") as f:
        pickle.dump(model, f)
    procs = []
    run = "digits-%d-%d" % (os.getpid(), time.time_ns())  # as python -m deval.launch does
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), DEVAL_LAUNCH_ID=run)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--rank", "--model", model_path,
             "--ranks", str(args.ranks), "--batch", str(args.batch), "--out", args.out,
             "--t0", repr(args.t0)], env=env))
    codes = [p.wait() for p in procs]
    shutil.rmtree(tmp)  # the model, and the predictions files unless --out kept them
    if any(codes):
        print("digits_eval: a rank failed: exit codes %s" % codes, file=sys.stderr)
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--out", help="where the predictions files go (default: a temporary dir)")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.t0 is None:
        args.t0 = time.monotonic()
    if args.rank:
        rank_main(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
