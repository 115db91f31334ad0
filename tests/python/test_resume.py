# SPDX-License-Identifier: MIT
"""A restarted job resumes its evaluation where it stopped: torchrun --max-restarts=1, a rank
(or devald) killed at batch k of n in the first run, the job finished by the restart. The
results equal an uninterrupted run's, byte for byte, on every rank, and the batches kept
before the crash get no forward pass again. A loader changed between the runs starts the
pass over, saying why.
"""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from test_launchers import BUILD, env_for

JOB = os.path.join(os.path.dirname(__file__), "resume_job.py")
N, B = 101, 4

pytest.importorskip("torch")


@pytest.fixture
def resumable(runtime, monkeypatch):
    """A private runtime directory (conftest), with no resume setting of the caller's."""
    for k in ("DEVAL_RESUME", "DEVAL_RESUME_KEY", "DEVAL_RESUME_WRITE_THROUGH"):
        monkeypatch.delenv(k, raising=False)
    # (devald may exit between two runs once idle for 2 s; a join that meets it exiting
    # fails: the default 60 s keeps it for the job's next run)
    monkeypatch.delenv("DEVAL_IDLE_EXIT", raising=False)
    yield runtime


def run(tmp_path, name, world, restarts=1, **env):
    """Run resume_job.py under torchrun; return (its output directory, its output)."""
    out = tmp_path / name
    out.mkdir()
    e = env_for({"OUT": str(out), "N": str(N), "DEVAL_CTL": os.path.join(BUILD, "deval-ctl"),
                 "DEVAL_RESUME": "1", **{k: str(v) for k, v in env.items()}})
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(world), "--max-restarts", str(restarts), JOB],
                       env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-6000:]
    return out, p.stdout


def rerun(tmp_path, name, world, between=None, **env):
    """The job run by hand twice under one $DEVAL_RESUME_KEY: the first run dies (KILL), the
    second finishes it. (Accelerate's gloo process group does not always survive torchrun's
    restarts on this machine, with or without deval: a run of its own each time does.)"""
    out = tmp_path / name
    out.mkdir()
    logs = []
    for r in (0, 1):
        e = env_for({"OUT": str(out), "N": str(N), "RUN": str(r), "DEVAL_RESUME_KEY": name,
                     **{k: str(v) for k, v in env.items()}})
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(world), JOB], env=e,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)
        assert (p.returncode != 0) == (r == 0), p.stdout[-6000:]
        logs.append(p.stdout)
        if r == 0 and between is not None:
            between()
    return out, logs[1]


def forwards(out, restart, rank):
    try:
        return os.path.getsize(out / ("fw-%d-%d" % (restart, rank)))
    except FileNotFoundError:
        return 0


def same_results(a, b, world):
    for r in range(world):
        x, y = np.load(a / ("out-%d.npz" % r)), np.load(b / ("out-%d.npz" % r))
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert x[k].shape == y[k].shape and x[k].tobytes() == y[k].tobytes(), (r, k)
    assert np.array_equal(np.sort(np.load(a / "out-0.npz")["idx"]), np.arange(N))


def batches(world):
    return -(-N // world) // B + (-(-N // world) % B > 0)


@pytest.mark.parametrize("world,kill", [(2, "1:9"), (3, "0:4")])
def test_torchrun_restart_resumes_where_it_stopped(resumable, tmp_path, world, kill):
    whole, _ = run(tmp_path, "whole", world, restarts=0)
    done, log = run(tmp_path, "resumed", world, KILL=kill)
    same_results(whole, done, world)
    k = int(kill.split(":")[1])
    n = batches(world)
    assert "resuming pass #1 of this job at batch" in log, log[-3000:]
    dead = int(kill.split(":")[0])
    for r in range(world):
        assert forwards(whole, 0, r) == n
        both = forwards(done, 0, r) + forwards(done, 1, r)
        # the killed rank ran k forwards and none of them again; the others at most the one
        # batch in flight when it died
        assert both == n if r == dead else n <= both <= n + 1, (r, both, n)
    assert forwards(done, 1, dead) == n - k
    assert not glob.glob(os.path.join(os.path.dirname(resumable), "journal", "*"))


def test_a_changed_loader_starts_the_pass_over(resumable, tmp_path):
    whole, _ = run(tmp_path, "whole", 2, restarts=0, SEED0=2)
    done, log = run(tmp_path, "changed", 2, KILL="1:6", SEED0=1, SEED1=2)
    same_results(whole, done, 2)
    assert "were of another pass" in log and "so the pass starts over" in log, log[-3000:]
    assert forwards(done, 1, 0) == forwards(done, 1, 1) == batches(2)


def test_devald_killed_and_restarted_loses_nothing_written_through(resumable, tmp_path):
    whole, _ = run(tmp_path, "whole", 2, restarts=0)
    done, log = run(tmp_path, "resumed", 2, KILL="devald:7", DEVAL_RESUME_WRITE_THROUGH=1)
    same_results(whole, done, 2)
    assert "at batch 7:" in log or "at batch 8:" in log, log[-3000:]
    assert forwards(done, 1, 0) <= batches(2) - 6


def test_resume_is_off_unless_asked(resumable, tmp_path):
    """A body may keep state of its own across batches, which a resumed pass cannot give
    back: resuming is the user's call (DEVAL_RESUME=1, or a DEVAL_RESUME_KEY)."""
    whole, _ = run(tmp_path, "whole", 2, restarts=0)
    done, log = run(tmp_path, "off", 2, KILL="1:5", DEVAL_RESUME="")
    same_results(whole, done, 2)
    assert "resuming" not in log
    assert forwards(done, 1, 0) == forwards(done, 1, 1) == batches(2)


def test_accelerate_loop_resumes(resumable, tmp_path):
    pytest.importorskip("accelerate")
    whole, _ = run(tmp_path, "whole", 2, restarts=0, MODE="accelerate")
    done, log = rerun(tmp_path, "resumed", 2, MODE="accelerate", KILL="1:8")
    same_results(whole, done, 2)
    assert "resuming pass #1" in log, log[-3000:]
    # the pass opens at the first gather_for_metrics: the first batch runs its forward again
    assert forwards(done, 1, 1) == batches(2) - 8 + 1, forwards(done, 1, 1)


def test_trainer_evaluate_resumes(resumable, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    whole, _ = run(tmp_path, "whole", 2, restarts=0, MODE="trainer")
    done, log = rerun(tmp_path, "resumed", 2, MODE="trainer", KILL="0:6")
    a = json.loads((whole / "metrics.json").read_text())
    b = json.loads((done / "metrics.json").read_text())
    assert "resuming pass #1" in log, log[-3000:]
    for k in ("eval_accuracy", "eval_n", "eval_sum", "eval_loss"):
        assert a[k] == b[k], (k, a, b)
    assert a["eval_n"] == N
    assert forwards(done, 1, 0) <= forwards(whole, 0, 0) - 6 + 1


def test_ctl_lists_and_drops_journals(resumable, tmp_path):
    """A job that dies for good leaves its journals: deval-ctl lists and drops them."""
    out, _ = run_fail(tmp_path, KILL="1:5")
    ctl = os.path.join(BUILD, "deval-ctl")
    listed = json.loads(subprocess.run([ctl, "resume", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert listed["total"] == 2, listed
    assert {j["rank"] for j in listed["journals"]} == {0, 1}
    assert all(j["batches"] >= 5 and j["world"] == 2 for j in listed["journals"]), listed
    said = subprocess.run([ctl, "resume", "drop", "all"], capture_output=True, text=True,
                          check=True).stdout
    assert "dropped 2 resume journals" in said
    listed = json.loads(subprocess.run([ctl, "resume", "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert listed["total"] == 0


def run_fail(tmp_path, **env):
    out = tmp_path / "failed"
    out.mkdir()
    e = env_for({"OUT": str(out), "N": str(N), "DEVAL_RESUME": "1",
                 **{k: str(v) for k, v in env.items()}})
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", JOB], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode != 0
    return out, p.stdout


def test_a_torn_journal_resumes_before_the_tear(resumable, tmp_path):
    """A journal's bytes are checked before they are used: a batch whose bytes changed (a
    torn write, a scribble) ends that rank's journal there, and the job resumes before it."""
    whole, _ = run(tmp_path, "whole", 2, restarts=0)
    journal = os.path.join(os.path.dirname(resumable), "journal")

    def tear():
        files = glob.glob(os.path.join(journal, "*.dvj"))
        assert len(files) == 2, files
        for f in files:
            with open(f, "r+b") as fh:
                head = fh.read(48)
                end = int.from_bytes(head[24:32], "little")
                if int.from_bytes(head[40:44], "little") == 0:  # rank 0's: a third in
                    fh.seek(256 + (end - 256) // 3)
                    byte = fh.read(1)
                    fh.seek(-1, 1)
                    fh.write(bytes([byte[0] ^ 0x5A]))

    done, log = rerun(tmp_path, "torn", 2, between=tear, KILL="1:9",
                      DEVAL_RESUME_WRITE_THROUGH=1)
    same_results(whole, done, 2)
    said = [line for line in log.splitlines() if "resuming pass #1" in line]
    assert said, log[-3000:]
    at = int(said[0].split("at batch ")[1].split(":")[0])
    assert 2 <= at <= 5, said  # the tear is a third of the way into 9 batches
    assert forwards(done, 1, 0) == batches(2) - at + 1


def quota_rank(rank, world, name, q):
    import deval
    os.environ["DEVAL_RESUME_KEY"] = name
    with deval.join(name, rank, world, socket=q, timeout=30) as g:
        got = []
        for batch in g.eval_loop(loader(rank, world)):
            got.append(g.gather_for_metrics(batch)[1].numpy())
        return np.concatenate(got).tolist()


def loader(rank, world):
    import torch
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    n = 600
    ds = torch.utils.data.TensorDataset(torch.arange(n * 512, dtype=torch.float32).reshape(n, 512),
                                        torch.arange(n))
    s = torch.utils.data.DistributedSampler(ds, world, rank, shuffle=False)
    return torch.utils.data.DataLoader(ds, batch_size=8, sampler=s)


def test_a_journal_past_the_quota_stops_and_the_pass_goes_on(tmp_path, capfd):
    from conftest import Daemon, group_name, run_ranks
    d = Daemon(["--max-user-bytes", "6M"])
    try:
        got = run_ranks(2, quota_rank, group_name("quota"), d.socket)
    finally:
        d.stop()
    assert got[0] == got[1] == list(range(600))
    err = capfd.readouterr().err
    assert "the resume journal of pass #1 stops at batch" in err, err
    assert "--max-user-bytes" in err, err



def dying_rank(rank, world, name, sock):
    import deval
    os.environ["DEVAL_RESUME_KEY"] = name
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    for i, batch in enumerate(g.eval_loop(loader(rank, world))):
        g.gather_for_metrics(batch)
        if i == 3:
            g.barrier()
            os._exit(0)  # (a crash in batch 4: 3 are whole, nothing ends the pass)


def test_idle_journals_are_dropped_after_resume_keep(tmp_path):
    from conftest import Daemon, group_name, run_ranks
    d = Daemon(["--resume-keep", "2"])
    ctl = [os.path.join(BUILD, "deval-ctl"), "-s", d.socket, "resume", "--json"]
    try:
        run_ranks(2, dying_rank, group_name("keep"), d.socket, allow_death=(0, 1))
        listed = json.loads(subprocess.run(ctl, capture_output=True, text=True).stdout)
        assert listed["total"] == 2 and listed["keep_s"] == 2, listed
        assert all(j["batches"] == 3 and not j["file"] for j in listed["journals"]), listed
        deadline = time.monotonic() + 10
        while listed["total"] and time.monotonic() < deadline:
            time.sleep(0.2)
            listed = json.loads(subprocess.run(ctl, capture_output=True, text=True).stdout)
        assert listed["total"] == 0, listed
    finally:
        d.stop()


def test_random_bodies_resume_exact(resumable, tmp_path):
    """Dropout left on and sampled tokens draw from torch's generator in every body: the
    batches answered from the journal run on one sample and draw otherwise, so the pass takes
    back the generator's state the stopped run had after each of them."""
    whole, _ = run(tmp_path, "whole", 2, restarts=0, RANDOM=1)
    again, _ = run(tmp_path, "again", 2, restarts=0, RANDOM=1)
    same_results(whole, again, 2)  # (the job is deterministic)
    done, log = run(tmp_path, "resumed", 2, KILL="1:6", RANDOM=1)
    assert "resuming pass #1" in log, log[-3000:]
    same_results(whole, done, 2)



def test_batch_digests_see_samples_of_any_kind():
    """What a batch digest reads: equal batches agree, a changed value anywhere differs, a
    dataclass's or a plain object's fields too (a collate_fn that keeps raw samples)."""
    import dataclasses
    from deval import _loop

    @dataclasses.dataclass
    class Sample:
        text: str
        label: int

    class Plain:
        def __init__(self, v):
            self.v = v

    torch = pytest.importorskip("torch")
    a = {"x": torch.arange(600.0).reshape(200, 3), "s": [Sample("a", 1)], "p": [Plain(1)]}
    same = {"x": torch.arange(600.0).reshape(200, 3), "s": [Sample("a", 1)], "p": [Plain(1)]}
    assert _loop.digest(a, [1, 2]) == _loop.digest(same, [1, 2])
    assert _loop.digest(a, [1, 2]) != _loop.digest(same, [2, 1])
    for change in (lambda b: b["s"][0].__setattr__("label", 2),
                   lambda b: b["p"][0].__setattr__("v", 2),
                   lambda b: b["x"].__setitem__((0, 0), -1.0),
                   lambda b: b["x"].__setitem__((199, 2), -1.0)):
        b = {"x": a["x"].clone(), "s": [Sample("a", 1)], "p": [Plain(1)]}
        change(b)
        assert _loop.digest(b, [1, 2]) != _loop.digest(a, [1, 2])
    loop = [1]
    loop.append(loop)
    assert _loop.digest(loop) == _loop.digest(loop)


def one_sample_fails_rank(rank, world, name, sock, die):
    import deval
    os.environ["DEVAL_RESUME_KEY"] = name
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    for i, (x, ix) in enumerate(g.eval_loop(loader(rank, world))):
        if die and i == 3:
            g.barrier()
            os._exit(0)
        if len(x) < 2:
            raise RuntimeError("this body needs two samples")  # (batch norm in training)
        g.gather_for_metrics((x, ix))
    return True


def test_a_body_that_cannot_run_on_one_sample_says_resume_is_why(tmp_path, capfd):
    from conftest import Daemon, group_name, run_ranks
    d = Daemon()
    name = group_name("onesample")
    try:
        run_ranks(2, one_sample_fails_rank, name, d.socket, True, allow_death=(0, 1))
        with pytest.raises(pytest.fail.Exception, match="needs two samples"):
            run_ranks(2, one_sample_fails_rank, name, d.socket, False)
    finally:
        d.stop()
    err = capfd.readouterr().err
    assert "whose results came from the resume journal" in err, err
    assert "set DEVAL_RESUME=0" in err, err


def test_a_job_restarted_from_a_checkpoint_never_resumes_an_older_model(resumable, tmp_path):
    """A training job that evaluates the same loader after each epoch dies in epoch 1's
    evaluation (its pass #2) and restarts from its last snapshot, taken after epoch 1's
    training: its evaluations of epochs 2 and 3 are the new process's passes #1 and #2, and
    the journal of the stopped pass #2 (epoch 1's model) must not answer epoch 3's, though
    the collectives and random draws before it are the same. Every evaluated row is checked
    against its epoch's model (48 of 101 rows were epoch 1's before the fix)."""
    done, log = run(tmp_path, "snapshot", 2, MODE="snapshot", KILL="1:106")
    assert "resuming" not in log, log[-3000:]
    for r in range(2):
        assert (done / ("stale-%d" % r)).read_text() == "0"

