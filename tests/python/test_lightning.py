# SPDX-License-Identifier: MIT
"""deval.lightning against Lightning itself: a Trainer on 2 and 3 CPU ranks (strategy="ddp",
the ranks started by Lightning's own launcher) with deval.lightning.enable() returns what the
same script returns on one device: validate's, test's and fit's logged values (a batch mean
logged with sync_dist, a loss, torchmetrics metrics), the rows the steps saw gathered with
self.all_gather (each sample once, in dataset order), and trainer.predict's predictions, also
with fewer samples than ranks. Plain Lightning on 3 ranks counts its sampler's padding: the
comparison tells the two apart. deval.join() with no argument joins under its launcher.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("torchmetrics")
pytest.importorskip("lightning")

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_job.py")


def run(daemon, tmp_path, devices, how, n):
    out = tmp_path / ("%d-%s-%d.json" % (devices, how, n))
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    for _ in range(2):
        p = subprocess.run([sys.executable, JOB, str(devices), how, str(n), str(out)], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=240)
        # plain Lightning over gloo, no deval in it, now and then aborts as its threads
        # end with the process: once more
        if not (how == "plain" and p.returncode == -6 and
                "terminate called without an active exception" in p.stderr):
            break
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(out.read_text()) if out.exists() else p.stdout


def same_values(got, want):
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-6), k


@pytest.mark.parametrize("devices,n,how", [(2, 10, "callback"), (3, 13, "deval")])
def test_validate_test_fit_and_predict_are_one_device_s(daemon, tmp_path, devices, n, how):
    """n=10 on 2 ranks and n=13 on 3 (batches of 4): the ranks' shares of the batches are
    uneven, so some run a padding step, in which a value logged on_step syncs, a value logged
    from on_validation_batch_end counts nowhere, a metric called (forward) on it computes,
    a metric in a plain dict takes nothing, and an all_gather in the step leaves it out. The
    callback in the Trainer's arguments does what enable() does."""
    one = run(daemon, tmp_path, 1, "plain", n)
    got = run(daemon, tmp_path, devices, how, n)
    for stage in ("validate", "test", "fit"):
        same_values(got[stage], one[stage])
    for stage in ("val_counts", "test_counts"):
        assert got[stage]["rows"] == list(range(n)) == one[stage]["rows"]
        assert got[stage]["ranks"] == list(range(devices))  # Lightning's [world] stack
        assert got[stage]["in_step"] == list(range(n))  # gathered in each step, in order
        assert got[stage]["plain_n"] == one[stage]["plain_n"] == n
    assert got["by_loader"] == one["by_loader"] == [list(range(n)), list(range(7)),
                                                    list(range(7))]
    # one list of every loader's rows, kept without the padding step, gathered after the loop
    for rows in (got["all_rows"], one["all_rows"]):  # (the second loader is shuffled)
        assert rows[:n] == list(range(n)) and rows[n + 7:] == [2000 + i for i in range(7)]
        assert sorted(rows[n:n + 7]) == [1000 + i for i in range(7)]
    assert got["counted"] == one["counted"] == n + 14  # a metric updated at epoch end
    # 2 rows per sample of the first of two loaders of 5 fit 1 per sample of both as well:
    # refused on every rank (their counts differ), where one reading was taken before
    assert one["twice"] == [10 * i + j for i in range(5) for j in range(2)]
    assert got["twice"] == "Mismatch", got["twice"]
    assert got["predict"] == one["predict"]
    assert got["predict_values"] == one["predict_values"]
    assert got["predict_few"] == one["predict_few"] == [[0, 1]]
    assert got["join"] == [devices, True]


def test_plain_lightning_counts_the_padding(daemon, tmp_path):
    """What the test above would see without deval: 12 rows for 10 samples, a mean over them,
    each rank's predictions alone."""
    one = run(daemon, tmp_path, 1, "plain", 10)
    plain = run(daemon, tmp_path, 3, "plain", 10)
    assert sorted(plain["val_counts"]["rows"]) == [0, 0, 1, 1] + list(range(2, 10))
    assert plain["validate"]["val_mse"] != pytest.approx(one["validate"]["val_mse"], rel=1e-3)
    assert sum(len(b) for b in plain["predict"]) < 10


def test_a_sampler_drawing_apart_fails_every_rank(daemon, tmp_path):
    """A sampler of one's own whose order differs by rank cannot be dealt: each rank's share
    would overlap the others'. Every rank says so at the loop's start, naming rank 1. And a
    CombinedLoader reading two loaders at once is refused on every rank."""
    said = run(daemon, tmp_path, 2, "apart", 10)
    for r in (0, 1):
        assert "rank %d: Mismatch: deval.lightning: the evaluation loader's sampler drew " \
            "other batches on rank 1 than on rank 0" % r in said, said
        assert "rank %d: InvalidArgument: deval.lightning: this evaluation loop reads 2 " \
            "loaders at once (a CombinedLoader in 'max_size' mode)" % r in said, said


def test_fabric_s_loaders_through_eval_loop(daemon, tmp_path):
    """Fabric's own launcher, 3 ranks, 13 samples: setup_dataloaders gives each rank a
    DistributedSampler's shard (15 samples in all); g = deval.lightning.enable(fabric) and
    g.eval_loop return each sample once, and a torchmetrics metric updated in the loop counts
    13 (12/13, where the 2 padding samples would make it 13/15). One device alike."""
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    job = os.path.join(os.path.dirname(JOB), "fabric_job.py")
    for devices in (3, 1):
        p = subprocess.run([sys.executable, job, str(devices), "13"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        lines = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("rank "))
        assert len(lines) == devices, p.stdout
        for r, ln in enumerate(lines):
            assert ln == "rank %d of %d: rows %s mean %.6f" % (r, devices, list(range(13)),
                                                               12 / 13), ln


def test_an_enabled_trainer_still_pickles_and_copies():
    """enable() stores nothing on the Trainer but a callback that holds nothing: the Trainer
    pickles (ddp_spawn sends it to its ranks) and the callback copies, as before."""
    import copy
    import pickle

    import lightning.pytorch as L
    import deval.lightning
    t = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False)
    assert deval.lightning.enable(t) is t
    deval.lightning.enable(t)  # again: one callback, first of them
    exact = [c for c in t.callbacks if isinstance(c, deval.lightning.Exact)]
    assert len(exact) == 1 and t.callbacks[0] is exact[0]
    back = pickle.loads(pickle.dumps(t))
    assert isinstance(back.callbacks[0], deval.lightning.Exact)
    assert isinstance(copy.deepcopy(exact[0]), deval.lightning.Exact)
    with pytest.raises(deval.lightning.InvalidArgument, match="not a Lightning Trainer"):
        deval.lightning.enable(object())
