# SPDX-License-Identifier: MIT
"""deval.accelerate against the real packages from PyPI: torch, accelerate (over gloo, its own
CPU backend), torchmetrics and transformers.

Every rank runs the same loop twice over the same prepared loader: once with Accelerate's own
gathers, once after deval.accelerate.enable(accelerator). The deval run must equal the
single-process result (every sample once, in dataset order), and equal Accelerate's wherever
Accelerate's does. Where Accelerate is not right, what it returned is recorded in the
test's output (pytest -s) and deval must still be exact. Plain Accelerate is not run where
its ranks would make different collectives (even_batches=False with uneven shards): gloo
then hangs or aborts the process group.
"""

import itertools
import os
import socket as socketlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

import deval  # noqa: E402
import deval.accelerate  # noqa: E402
from conftest import group_name, run_ranks  # noqa: E402


def free_port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_env(rank, world, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)


class Iterable(torch.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.arange(self.n))


def make_loader(kind, n, bs, drop_last, world, rank):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    if kind == "iterable":
        return DataLoader(Iterable(n), batch_size=bs, drop_last=drop_last)
    ds = TensorDataset(torch.arange(n))
    if kind == "distributed":
        s = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False,
                               drop_last=drop_last)
        return DataLoader(ds, batch_size=bs, sampler=s)
    return DataLoader(ds, batch_size=bs, drop_last=drop_last)


def the_loop(acc, loader, calls):
    """The loop people write: predictions, labels, ragged tokens padded across processes,
    and the names of the samples."""
    preds, labels, toks, names = [], [], [], []
    for batch in loader:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        p = x * 7 % 13
        lab = x % 5
        width = 1 + int((x % 3).max()) if len(x) else 1
        t = torch.stack([torch.where(torch.arange(width) <= int(i) % 3,
                                     int(i) * 10 + torch.arange(width), -1) for i in x]) \
            if len(x) else torch.zeros((0, width), dtype=torch.int64)
        t = acc.pad_across_processes(t, dim=1, pad_index=-1)
        if calls == 1:
            p, lab, t = acc.gather_for_metrics((p, lab, t))
        else:
            p = acc.gather_for_metrics(p)
            lab = acc.gather_for_metrics(lab)
            t = acc.gather_for_metrics(t)
        preds += p.tolist()
        labels += lab.tolist()
        toks += [[v for v in row if v != -1] for row in t.tolist()]
        names += acc.gather_for_metrics(["s%d" % i for i in x.tolist()])
    return preds, labels, toks, names


def truth(samples):
    return ([i * 7 % 13 for i in samples], [i % 5 for i in samples],
            [[i * 10 + k for k in range(i % 3 + 1)] for i in samples],
            ["s%d" % i for i in samples])


def n_kept(kind, n, bs, drop_last, world, split):
    """The samples Accelerate's (or torch's) drop_last keeps: what every rank should get."""
    if not drop_last:
        return n
    if kind == "distributed":
        return n // world * world
    per = bs if split else bs * world
    if kind == "iterable" or split:
        return n // per * per
    return n // bs // world * world * bs


def accelerate_is_safe(kind, n, bs, even, split, world):
    """Would plain Accelerate's ranks make the same collectives with equal sizes?"""
    if kind == "distributed" or even:
        return True
    per = bs if split else bs * world
    return n % per == 0


GRID = {"n": [13, 50], "bs": [4], "drop_last": [False, True],
        "kind": ["map", "iterable", "distributed"], "calls": [1, 2]}


def grid_rank(rank, world, port, name):
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    report = []
    # (an IterableDataset is dispatched from rank 0 by default; dispatch_batches=False
    # shards it on every rank with IterableDatasetShard instead)
    for ci, (even, split, dispatch) in enumerate([(True, False, None), (False, False, None),
                                                  (True, True, None), (False, True, None),
                                                  (True, False, False), (True, True, False)]):
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
            split_batches=split, even_batches=even, dispatch_batches=dispatch))
        for n, bs, drop_last, kind, calls in itertools.product(*GRID.values()):
            if kind == "distributed" and ci > 0:
                continue  # the loader is not prepared: Accelerate's switches do not apply
            if dispatch is False and kind != "iterable":
                continue
            if split and bs % world:
                continue
            if kind == "iterable" and not even and not split:
                continue  # IterableDatasetShard has no even_batches switch: same as even
            if kind == "iterable" and dispatch is None and \
                    n_kept(kind, n, bs, drop_last, world, split) == 0:
                continue  # Accelerate's dispatcher itself fails on a loader with no batch
            cfg = dict(n=n, bs=bs, drop_last=drop_last, kind=kind, calls=calls, even=even,
                       split=split, dispatch=dispatch, world=world)

            def loader():
                raw = make_loader(kind, n, bs, drop_last, world, rank)
                return raw if kind == "distributed" else acc.prepare(raw)

            plain = None
            if accelerate_is_safe(kind, n, bs, even, split, world):
                try:
                    plain = the_loop(acc, loader(), calls)
                except Exception as e:
                    raise AssertionError("plain Accelerate, %s: %s" % (cfg, e)) from e
            g = deval.accelerate.enable(acc, group="%s-%d-%d" % (name, ci, len(report)))
            try:
                mine = the_loop(acc, loader(), calls)
            finally:
                deval.accelerate.disable()
            report.append((cfg, plain, mine))
            assert g.name
    return report


@pytest.mark.parametrize("world", [2, 3, 4])
def test_grid_against_accelerate(daemon, world, capsys, monkeypatch):
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, grid_rank, free_port(), group_name("grid"), timeout=300)
    runs = wrong = skipped = 0
    for rank, report in enumerate(res):
        for cfg, plain, mine in report:
            skipped += plain is None
            keep = n_kept(cfg["kind"], cfg["n"], cfg["bs"], cfg["drop_last"], world,
                          cfg["split"])
            want = truth(range(keep))
            assert mine == want, "rank %d, %s: deval differs from one process" % (rank, cfg)
            runs += 1
            if plain is not None and plain != want:
                wrong += 1
                if rank == 0:
                    with capsys.disabled():
                        print("\nAccelerate wrong, deval exact: %s: Accelerate returned %d "
                              "predictions %s..., deval %d" % (
                                  cfg, len(plain[0]), plain[0][:12], len(mine[0])))
            elif plain is not None:
                assert plain == mine
    with capsys.disabled():
        print("\n%d ranks: %d runs equal to one process; plain Accelerate wrong in %d, not "
              "run in %d (uneven shards)" % (world, runs // world, wrong // world,
                                             skipped // world))
    assert runs > 0


def metrics_rank(rank, world, port, name, uneven):
    set_env(rank, world, port)
    import torchmetrics
    from accelerate import Accelerator
    import deval.torchmetrics as dtm
    acc = Accelerator(cpu=True)
    g = deval.accelerate.enable(acc, group=name)
    gen = torch.Generator().manual_seed(3)
    n = 97
    scores = torch.rand((n, 4), generator=gen)
    target = torch.randint(0, 4, (n,), generator=gen)
    reg = torch.rand(n, generator=gen)
    # uneven shards: rank r takes a contiguous slice of its own length
    cuts = np.linspace(0, n, world + 1).astype(int) if not uneven else \
        np.array([0] + sorted(np.random.default_rng(7).choice(np.arange(1, n), world - 1,
                                                                replace=False).tolist()) + [n])
    lo, hi = int(cuts[rank]), int(cuts[rank + 1])
    coll = torchmetrics.MetricCollection({
        "acc": torchmetrics.Accuracy(task="multiclass", num_classes=4),
        "f1": torchmetrics.F1Score(task="multiclass", num_classes=4, average="macro"),
        "auroc": torchmetrics.AUROC(task="multiclass", num_classes=4),
    })
    mse = torchmetrics.MeanSquaredError()
    dtm.attach(coll)
    dtm.attach(mse)
    for s in range(lo, hi, 8):
        e = min(hi, s + 8)
        coll.update(scores[s:e], target[s:e])
        mse.update(reg[s:e], target[s:e].float() / 4)
    out = {k: float(v) for k, v in coll.compute().items()}
    out["mse"] = float(mse.compute())
    deval.accelerate.disable()
    assert g.world_size == world
    return out


@pytest.mark.parametrize("world,uneven", [(2, False), (3, True), (4, True)])
def test_torchmetrics_sync(daemon, world, uneven, monkeypatch):
    torchmetrics = pytest.importorskip("torchmetrics")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, metrics_rank, free_port(), group_name("tm"), uneven, timeout=120)
    gen = torch.Generator().manual_seed(3)
    n = 97
    scores = torch.rand((n, 4), generator=gen)
    target = torch.randint(0, 4, (n,), generator=gen)
    reg = torch.rand(n, generator=gen)
    one = {
        "acc": float(torchmetrics.functional.accuracy(scores, target, task="multiclass",
                                                      num_classes=4)),
        "f1": float(torchmetrics.functional.f1_score(scores, target, task="multiclass",
                                                     num_classes=4, average="macro")),
        "auroc": float(torchmetrics.functional.auroc(scores, target, task="multiclass",
                                                     num_classes=4)),
        "mse": float(torchmetrics.functional.mean_squared_error(reg, target.float() / 4)),
    }
    for out in res:
        assert out.keys() == one.keys()
        for k in one:
            assert out[k] == pytest.approx(one[k], rel=1e-6, abs=1e-7), k


def rank_env(rank, world, port):
    """A rank's launcher environment; a process on its own (world 1) gets none."""
    if world > 1:
        set_env(rank, world, port)
    else:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
        torch.set_num_threads(1)


def trainer_rank(rank, world, port, name, n, use_deval=True):
    rank_env(rank, world, port)
    import tempfile
    import transformers
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    gen = torch.Generator().manual_seed(1)

    class DS(torch.utils.data.Dataset):
        ids = torch.randint(1, 50, (n, 12), generator=gen)
        labels = torch.randint(0, 3, (n,), generator=gen)

        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.labels[i]}

    def metrics(p):
        pred = np.argmax(p.predictions, axis=-1)
        return {"accuracy": float((pred == p.label_ids).mean()), "n": int(len(pred))}

    with tempfile.TemporaryDirectory() as out:
        # (average_tokens_across_devices, on by default, multiplies each rank's loss by the
        # number of processes, with or without deval: not what one process reports)
        args = transformers.TrainingArguments(output_dir=out, per_device_eval_batch_size=4,
                                              report_to=[], use_cpu=True,
                                              dataloader_num_workers=0,
                                              average_tokens_across_devices=False)
        trainer = transformers.Trainer(model=model, args=args, eval_dataset=DS(),
                                       compute_metrics=metrics)
        on = use_deval and (world > 1 or use_deval == "alone")
        if on:
            deval.accelerate.enable(trainer, group=name)
        res = trainer.evaluate()
        if on:
            deval.accelerate.disable()
    return {k: v for k, v in res.items() if k in ("eval_loss", "eval_accuracy", "eval_n")}


def test_trainer_evaluate(daemon, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    n = 13
    one = run_ranks(1, trainer_rank, 0, "", n, timeout=120)[0]
    # enabled on a process alone: the loss of the last batch, repeated per sample of a whole
    # batch, is cut to its samples as Accelerate cuts it (it was kept: 16 rows for 13)
    alone = run_ranks(1, trainer_rank, 0, group_name("trainer1"), n, "alone", timeout=120)[0]
    assert alone == one, (alone, one)
    two = run_ranks(2, trainer_rank, free_port(), group_name("trainer"), n, timeout=180)
    plain = run_ranks(2, trainer_rank, free_port(), "", n, False, timeout=180)
    assert one["eval_n"] == n
    assert plain[0] == plain[1]
    for r in two:
        assert r["eval_n"] == plain[0]["eval_n"]
        assert r["eval_accuracy"] == plain[0]["eval_accuracy"]
        assert r["eval_loss"] == pytest.approx(plain[0]["eval_loss"], rel=1e-6)
        assert r["eval_n"] == n
        assert r["eval_accuracy"] == one["eval_accuracy"]
        # the Trainer gathers each batch's mean loss once per sample: rank 1's last batch is
        # samples 12, 0, 1, 2 (even_batches), so sample 12's row holds that batch's mean, not
        # its own loss. Close to one process, equal to Accelerate's (above), by construction.
        assert r["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-3)


LENGTHS = [6, 3, 3, 3, 2]  # 5 samples, the last one short


def seq2seq_rank(rank, world, port, name, n, even, use_deval=True):
    """Seq2SeqTrainer.predict() with predict_with_generate on a tiny T5: the generated
    tokens and the labels of every sample, in order."""
    rank_env(rank, world, port)
    import tempfile
    import transformers
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=10, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, pad_token_id=0,
        eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0))
    model.generation_config.max_new_tokens = 4
    gen = torch.Generator().manual_seed(3)
    ids = [torch.randint(3, 10, (int(k),), generator=gen)
           for k in torch.randint(2, 6, (n,), generator=gen)]
    labels = [torch.randint(3, 10, (1 + i % 3,), generator=gen) for i in range(n)]

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": labels[i]}

    def collate(items):
        x = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in items], batch_first=True)
        y = torch.nn.utils.rnn.pad_sequence([s["labels"] for s in items], batch_first=True,
                                            padding_value=-100)
        return {"input_ids": x, "attention_mask": (x != 0).long(), "labels": y}

    with tempfile.TemporaryDirectory() as out:
        args = transformers.Seq2SeqTrainingArguments(
            output_dir=out, per_device_eval_batch_size=3, report_to=[], use_cpu=True,
            predict_with_generate=True, accelerator_config={"even_batches": even})
        trainer = transformers.Seq2SeqTrainer(model=model, args=args, data_collator=collate)
        if world > 1 and use_deval:
            deval.accelerate.enable(trainer, group=name)
        try:
            res = trainer.predict(DS())
        finally:
            if world > 1 and use_deval:
                deval.accelerate.disable()
        assert "gather_function" not in type(trainer).__dict__  # (the class given back)

    def rows(a):
        return [[int(v) for v in r if v not in (-100, 0)] for r in a]
    return rows(res.predictions), rows(res.label_ids)


# (even_batches=False: 9 samples, whole batches, rank 0 one more; a short last batch is
# refused there, since the Trainer repeats its loss batch_size times, not once a sample)
@pytest.mark.parametrize("even,n", [(True, 13), (False, 9)])
def test_seq2seq_trainer_predict_with_generate(daemon, monkeypatch, even, n):
    """Seq2SeqTrainer's predict() and evaluate() set the Trainer's gather function to the
    Accelerator's plain gather, which keeps the last round's padding (13 samples on 2 ranks
    in batches of 3 came back as 18 rows, with or without deval): enable(trainer) keeps
    deval's gather_for_metrics there, so each sample comes back once, as one process
    generates it."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    one = run_ranks(1, seq2seq_rank, free_port(), group_name("s2s1"), n, even)[0]
    for got in run_ranks(2, seq2seq_rank, free_port(), group_name("s2s"), n, even,
                         timeout=240):
        assert len(got[0]) == n and got == one


def batch_bound_rank(rank, world, port, name, even):
    """The Trainer's predict() of a model whose outputs depend on the batch (per-token values
    padded by the collate, and a mean over every position): (tokens, pooled) of each sample."""
    rank_env(rank, world, port)
    import tempfile
    import transformers

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(LENGTHS)

        def __getitem__(self, i):
            return {"input_ids": torch.arange(1, LENGTHS[i] + 1) + i}

    def collate(samples):
        ids = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples],
                                              batch_first=True)
        return {"input_ids": ids}

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(20, 2)

        def forward(self, input_ids):
            e = self.emb(input_ids)
            return {"tokens": e[..., 0], "pooled": e.mean(1)}

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, use_cpu=True, report_to=[], per_device_eval_batch_size=2,
            remove_unused_columns=False, disable_tqdm=True,
            accelerator_config={"even_batches": even})
        trainer = transformers.Trainer(model=Pooled(), args=args, data_collator=collate)
        if world > 1:
            deval.accelerate.enable(trainer, group=name)
        tokens, pooled = trainer.predict(DS()).predictions
        if world > 1:
            deval.accelerate.disable()
    return tokens.tolist(), pooled.tolist()


def test_trainer_predictions_of_a_model_bound_to_its_batch(daemon, monkeypatch):
    """With even_batches=False every batch is one process's, whole, on one rank: predictions
    that depend on the batch (the collate's padding, a mean over it) are one process's. With
    even_batches, the last sample shares its batch with sample 0, as under Accelerate alone
    (docs/python.md says so)."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    one = run_ranks(1, batch_bound_rank, 0, "", True, timeout=120)[0]
    uneven = run_ranks(2, batch_bound_rank, free_port(), group_name("bound"), False,
                       timeout=180)
    even = run_ranks(2, batch_bound_rank, free_port(), group_name("bound"), True, timeout=180)
    for tokens, pooled in uneven:
        assert tokens == one[0] and pooled == one[1], (tokens, pooled, one)
    assert even[0][1][4] != one[1][4]  # (if it ever is, the docs' paragraph is out of date)


def twice_rank(rank, world, port, name):
    set_env(rank, world, port)
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    acc = Accelerator(cpu=True)
    ds = TensorDataset(torch.arange(10))
    loader = acc.prepare(DataLoader(ds, batch_size=2, sampler=DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=False)))
    deval.accelerate.enable(acc, group=name)
    try:
        seen = [int(x) for (b,) in loader for x in b]  # a training loop gathers nothing: it runs
        assert len(seen) == 4, seen  # (a quarter of the data, and Accelerate's padding)
        with pytest.raises(deval.InvalidArgument, match="shards it twice"):
            for (b,) in loader:
                acc.gather_for_metrics(b)
    finally:
        deval.accelerate.disable()
    return True


def test_a_prepared_distributed_sampler_is_refused(daemon, monkeypatch):
    """Accelerate shards such a loader again: each rank would see a quarter of the data. A
    loop that gathers nothing over it (training) runs; its first gather_for_metrics refuses."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    assert run_ranks(2, twice_rank, free_port(), group_name("twice")) == [True, True]


def ops_rank(rank, world, port, name):
    set_env(rank, world, port)
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    # (Accelerate's gather needs equal shapes on every rank: gloo aborts the job otherwise)
    x = {"loss": torch.tensor(float(rank + 1)), "ids": torch.arange(2) + 10 * rank,
         "v": torch.full((2, 3), float(rank))}
    ragged = torch.ones((2, rank + 1), dtype=torch.int32) * rank

    def ops():
        return (acc.gather(x),
                acc.pad_across_processes(ragged, dim=1, pad_index=-1),
                acc.pad_across_processes(ragged, dim=1, pad_index=-1, pad_first=True),
                [acc.reduce(x["v"] + rank, r) for r in ("sum", "mean", "max")],
                acc.gather_for_metrics(["r%d" % rank] * (rank + 1)),
                acc.gather_for_metrics(x["ids"]),
                acc.gather_for_metrics(x["v"], use_gather_object=True))

    plain = ops()
    deval.accelerate.enable(acc, group=name)
    try:
        mine = ops()
        # where Accelerate's gloo gather aborts, deval concatenates ragged rows
        ragged_ids = acc.gather(torch.arange(rank + 1)).tolist()
    finally:
        deval.accelerate.disable()
    assert ragged_ids == [i for r in range(world) for i in range(r + 1)]
    return repr(plain), repr(mine)  # (tensors would travel back through shared memory)


def test_ops_outside_a_loader_match_accelerate(daemon, monkeypatch):
    """gather (a 0-d loss and ragged rows in one dict), pad_across_processes, reduce and
    gather_for_metrics outside a loader: deval returns what Accelerate returns."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    for plain, mine in run_ranks(3, ops_rank, free_port(), group_name("ops")):
        assert plain == mine


def squeezed_rank(rank, world, port, name):
    set_env(rank, world, port)
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    try:
        # a batch of one squeezed on the last rank: dim 1 is outside its tensor alone
        logits = torch.ones((2, 3 + rank)) if rank < world - 1 else torch.ones(3 + rank)
        try:
            acc.pad_across_processes(logits.squeeze(), dim=1)
            said = None
        except deval.Mismatch as e:
            said = str(e)
        same = acc.pad_across_processes(torch.ones(2), dim=1)  # outside on every rank
        after = acc.gather(torch.tensor([rank])).tolist()
    finally:
        deval.accelerate.disable()
    return said, same.tolist(), after


def test_a_dim_outside_one_rank_s_tensor_fails_on_every_rank(daemon, monkeypatch):
    """Accelerate returns a tensor lacking the dim as it is, on that rank alone, and the
    others' pad paired with its next call. deval's step is every rank's: each one hears the
    mismatch, and the next gather pairs as it should."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    out = run_ranks(3, squeezed_rank, free_port(), group_name("squeezed"))
    for said, same, after in out:
        assert said is not None and "ndim: rank 0 has 2, rank 2 has 1" in said, said
        assert same == [1.0, 1.0]
        assert after == [0, 1, 2]


def keys_rank(rank, world, port, name):
    set_env(rank, world, port)
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    names = ["preds", "labels", "ids"]
    mine = names[rank % 3:] + names[:rank % 3]  # (a set's order differs by process)
    try:
        out = []
        for b in acc.prepare(DataLoader(torch.arange(7), batch_size=2)):
            x = {k: b + {"preds": 0, "labels": 100, "ids": 1000}[k] for k in mine}
            out.append(acc.gather_for_metrics(x))
            assert list(out[-1]) == mine
        got = {k: torch.cat([o[k] for o in out]).tolist() for k in names}
        own = {k: torch.tensor([rank + {"preds": 0, "labels": 100, "ids": 1000}[k]])
               for k in mine}
        gathered = acc.gather(own)
        reduced = acc.reduce(own)
        padded = acc.pad_across_processes({k: v[None] for k, v in own.items()}, dim=1)
        return rank, got, {k: gathered[k].tolist() for k in names}, \
            {k: reduced[k].tolist() for k in names}, {k: padded[k].tolist() for k in names}
    finally:
        deval.accelerate.disable()


def test_a_dict_s_tensors_meet_by_name_under_enable(daemon, monkeypatch):
    """Dicts whose keys come in another order on each rank (built from a set): gather,
    reduce, pad_across_processes and gather_for_metrics pair each tensor with the one of its
    name (Accelerate pairs them by place: rank 1's labels with rank 0's preds)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    off = {"preds": 0, "labels": 100, "ids": 1000}
    for rank, got, gathered, reduced, padded in run_ranks(3, keys_rank, free_port(),
                                                          group_name("keys")):
        assert got == {k: [i + o for i in range(7)] for k, o in off.items()}
        assert gathered == {k: [r + o for r in range(3)] for k, o in off.items()}
        assert reduced == {k: [3 + 3 * o] for k, o in off.items()}
        assert padded == {k: [[rank + o]] for k, o in off.items()}


class Lengths(torch.utils.data.Dataset):
    """Sample i: a row of 6 - i values i (sample 0 the longest), label i % 2."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return torch.full((6 - i,), i), i % 2


def longest_first(samples):
    samples = sorted(samples, key=lambda s: -len(s[0]))
    ids = torch.nn.utils.rnn.pad_sequence([s[0] for s in samples], batch_first=True,
                                          padding_value=-1)
    return ids, torch.tensor([s[1] for s in samples])


def sorted_metric_rank(rank, world, port, name):
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    deval.torchmetrics.enable()
    seen = torchmetrics.CatMetric()
    try:
        for ids, _ in acc.prepare(DataLoader(Lengths(), batch_size=3, collate_fn=longest_first)):
            seen.update(ids[:, 0].float())
        with pytest.raises(deval.Mismatch, match="did not keep them where the sampler drew"):
            seen.compute()
    finally:
        deval.torchmetrics.enable(False)
        deval.accelerate.disable()
    return True


def test_a_metric_under_a_sorting_collate_refuses_at_compute(daemon, monkeypatch):
    """even_batches wraps sample 0 into rank 1's batch [3, 4, 0], which the collate sorts to
    [0, 3, 4]: the padding is no longer last, and dropping the last row counted sample 0
    twice and lost sample 4, silently. The loop has no gather_for_metrics, so the pass never
    opens; the metric refuses on every rank at compute()."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    assert run_ranks(2, sorted_metric_rank, free_port(), group_name("sortm")) == [True, True]
