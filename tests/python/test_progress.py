# SPDX-License-Identifier: MIT
"""A pass you can watch, on real ranks: eval_loop(progress=...) draws one bar on rank 0 that
counts every rank's samples, and deval-ctl watch shows the pass's samples out of its total
while it runs (test-ctl.c checks the figures of each rank, the lag and the ended ranks)."""

import io
import json
import os
import subprocess
import sys
import time

import numpy as np

import deval
from conftest import ROOT, group_name, run_ranks

CTL = os.environ.get("DEVAL_CTL", os.path.join(ROOT, "build", "deval-ctl"))
N, BS = 30, 4  # 8 batches dealt round-robin: ranks 0 and 1 read 3 (rank 1's last holds 2)


def shards(rank, world):
    batches = [np.arange(i, min(i + BS, N)) for i in range(0, N, BS)]
    return batches[rank::world]


def watched(rank, world, sock, name, progress):
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    sys.stderr = io.StringIO()  # not a terminal
    if progress == "stderr":  # True draws only on a terminal: here, nothing
        progress = True
    bar = io.StringIO() if progress == "file" else sys.stderr
    got, seen = [], {}
    for i, idx in enumerate(g.eval_loop(shards(rank, world), num_samples=N, order="rank",
                                        progress=bar if progress == "file" else progress)):
        got.append(g.gather_for_metrics(idx * 3))
        if rank == 0 and i == 1:  # every rank's second batch is gathered
            seen["json"] = subprocess.run(
                [CTL, "--socket", sock, "--json=short", "--count=1", "watch"],
                capture_output=True, text=True, timeout=10).stdout
            seen["text"] = subprocess.run(
                [CTL, "--socket", sock, "--count=1", "watch", name],
                capture_output=True, text=True, timeout=10).stdout
        time.sleep(0.2)  # past the bar's least time between redraws
    g.leave()
    return np.concatenate(got).tolist(), bar.getvalue() if rank == 0 else "", seen


def frames(drawn):
    """The bar's states, as "done/total" strings."""
    return [f.split("|")[2].split()[0] for f in drawn.split("\r") if f.count("|") >= 2]


def test_bar_counts_every_ranks_samples(daemon):
    name = group_name("progress")
    res = run_ranks(3, watched, daemon.socket, name, "file")
    for got, _, _ in res:
        assert got == [i * 3 for i in range(N)]
    shown = frames(res[0][1])
    # after rank 0's first batch every rank's first 4 are in (rank 0's own would be 4/30)
    assert "12/30" in shown and "24/30" in shown, shown
    assert shown[-1] == "30/30", shown
    assert all(int(a.split("/")[0]) <= int(b.split("/")[0]) for a, b in zip(shown, shown[1:]))


def test_watch_shows_the_pass_while_it_runs(daemon):
    name = group_name("watched")
    res = run_ranks(3, watched, daemon.socket, name, None)
    seen = res[0][2]
    status = json.loads(seen["json"])
    mine = [g for g in status["groups"] if g["name"] == name]
    assert len(mine) == 1, seen["json"]
    p = mine[0]["pass"]
    # a pass by position is counted at each step: rank 0 is past the second
    assert p["samples"] == 24 and p["total"] == N, p
    assert p["batches_min"] >= 2 and p["batches_max"] <= 3 and p["rate"] > 0, p
    text = seen["text"]
    assert "eval pass of '%s': 24 of 30 samples (80.0%%)" % name in text, text
    assert "samples/s, ETA" in text and "BATCHES" in text, text
    assert res[0][1] == "", "nothing drawn unless asked"


def test_bar_only_where_asked(daemon):
    res = run_ranks(2, watched, daemon.socket, group_name("quiet"), "stderr")
    assert res[0][1] == "", "progress=True on a stderr that is not a terminal draws nothing"
    res = run_ranks(2, watched, daemon.socket, group_name("always"), "always")
    assert frames(res[0][1])[-1] == "30/30", res[0][1]
    assert res[1][1] == "", "rank 1 draws nothing"
