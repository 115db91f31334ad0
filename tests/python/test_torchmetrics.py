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
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
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


def running_rank(rank, world, sock, name):
    """An accuracy computed (and logged) every batch inside eval_loop, with uneven loaders: while
    a rank's loader has ended, its part of the metric's state sync is not empty."""
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    import deval
    from torch.utils.data import DataLoader, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    dtm.use(g)
    n = 13  # 7 batches of 2: rank 0 has 4, rank 1 three
    ds = TensorDataset(torch.arange(n), torch.arange(n) % 3)
    mine = [list(range(i, min(i + 2, n))) for i in range(0, n, 2)][rank::world]
    dl = DataLoader(ds, batch_sampler=mine)
    m = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=3))
    try:
        for idx, y in g.eval_loop(dl, num_samples=n, order="rank"):
            m.update((idx + 1) % 3, y)
            m.compute()
    except deval.Mismatch as e:
        return str(e)
    finally:
        dtm.use(None)
        g.leave()
    return None


def test_a_metric_synced_while_a_rank_has_ended_fails_everywhere(daemon):
    res = run_ranks(2, running_rank, daemon.socket, group_name("running"), timeout=120)
    for said in res:
        assert said and "has already ended its eval pass" in said, res
