# SPDX-License-Identifier: MIT
"""deval.torchmetrics against torchmetrics from PyPI: sync joins the launcher's group when none
was given, a rank with no data (torchmetrics' empty placeholder, of the default dtype) does not
break a list state's sync, and an attached metric still pickles and deep-copies. Before: an
InvalidArgument asking for a group, "ranks disagree on dtype" from AUROC, and a pickling error
on the attached metric's lambda."""

import copy
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")

import deval.torchmetrics as dtm  # noqa: E402
from conftest import group_name, run_ranks  # noqa: E402


def scores(n):
    g = torch.Generator().manual_seed(3)
    return torch.rand(n, 4, generator=g).softmax(1), torch.arange(n) % 4


def auroc_rank(rank, world, sock, job):
    # what torchrun sets: deval.join() names the group from it
    os.environ.update(DEVAL_SOCKET=sock, TORCHELASTIC_RUN_ID=job, RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    p, t = scores(12)
    m = dtm.attach(torchmetrics.AUROC(task="multiclass", num_classes=4))
    if rank != world - 1:  # the last rank has no data at all
        mine = range(rank, 12, world - 1)
        m.update(p[list(mine)], t[list(mine)])
    value = float(m.compute())
    blob = pickle.dumps(m)
    twin = copy.deepcopy(m)
    return value, type(pickle.loads(blob)).__name__, twin.dist_sync_fn is dtm.sync


@pytest.mark.parametrize("world", [2, 3])
def test_auroc_with_an_empty_rank_and_no_group_given(daemon, world):
    res = run_ranks(world, auroc_rank, daemon.socket, group_name("tm"), timeout=120)
    p, t = scores(12)
    want = float(torchmetrics.functional.auroc(p, t, task="multiclass", num_classes=4))
    for value, kind, attached in res:
        assert value == pytest.approx(want, abs=1e-6)
        assert kind == "MulticlassAUROC" and attached
