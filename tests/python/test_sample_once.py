# SPDX-License-Identifier: MIT
"""A sample counts once in everything deval touches, against the real torch and torchmetrics
from PyPI: metrics updated on each rank inside eval_loop over a padded DistributedSampler
(shuffled or not, 2, 3 and 4 ranks) equal the single-process value; every way a metric syncs
goes through deval with no torch.distributed group; wrappers sync; an attached metric pickles
and stays attached; a replayed batch is one padding sample in the batch's own structure,
which a model that rejects 0 rows accepts and no metric counts.

Before: accuracy 0.125 instead of 0.142857 (the sampler's padding counted), "Default process
group has not been initialized" from sync(), each rank's own shard from wrapper metrics, and
the rank's last batch replayed again (or tensors cut to 0 rows)."""

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")

import deval  # noqa: E402
import deval.torchmetrics as dtm  # noqa: E402
from conftest import group_name, run_ranks  # noqa: E402

C = 3


def data(n):
    g = torch.Generator().manual_seed(n)
    probs = torch.rand(n, C, generator=g).softmax(1)
    target = torch.randint(0, C, (n,), generator=g)
    return probs, target


def make_metrics():
    """One metric of each family torchmetrics has, and its wrappers; name -> (metric, how its
    update is called from (probs, target, idx))."""
    tm = torchmetrics
    w = tm.wrappers
    acc = dict(task="multiclass", num_classes=C)
    return {
        "accuracy": (tm.Accuracy(**acc), lambda p, t, i: (p, t)),
        "f1": (tm.F1Score(average="macro", **acc), lambda p, t, i: (p, t)),
        "auroc": (tm.AUROC(**acc), lambda p, t, i: (p, t)),
        "mse": (tm.MeanSquaredError(), lambda p, t, i: (p[:, 0], t.float())),
        "pearson": (tm.PearsonCorrCoef(), lambda p, t, i: (p[:, 0], t.float())),
        "retrieval": (tm.retrieval.RetrievalMAP(),
                      lambda p, t, i: (p[:, 0], t == 0, i % 3)),
        "cer": (tm.text.CharErrorRate(),
                lambda p, t, i: (["ab%d" % v for v in p.argmax(1).tolist()],
                                 ["ab%d" % v for v in t.tolist()])),
        "mean": (tm.MeanMetric(), lambda p, t, i: (p[:, 0],)),
        "cat": (tm.CatMetric(), lambda p, t, i: (i.float(),)),
        "classwise": (w.ClasswiseWrapper(tm.Accuracy(average=None, **acc)),
                      lambda p, t, i: (p, t)),
        "minmax": (w.MinMaxMetric(tm.Accuracy(**acc)), lambda p, t, i: (p, t)),
        "multitask": (w.MultitaskWrapper({"a": tm.Accuracy(**acc), "m": tm.MeanSquaredError()}),
                      lambda p, t, i: ({"a": p, "m": p[:, 0]}, {"a": t, "m": t.float()})),
        "collection": (tm.MetricCollection({"acc": tm.Accuracy(**acc),
                                            "prec": tm.Precision(**acc)}),
                       lambda p, t, i: (p, t)),
    }


def value(v):
    """A computed value as plain numbers (cat's order is the ranks', so sorted)."""
    if isinstance(v, dict):
        return {k: value(x) for k, x in sorted(v.items())}
    t = torch.as_tensor(v).float()
    return sorted(t.flatten().tolist()) if t.ndim else float(t)


def single(n):
    """What one process computes over the whole dataset."""
    p, t = data(n)
    i = torch.arange(n)
    out = {}
    for name, (m, args) in make_metrics().items():
        m.update(*args(p, t, i))
        out[name] = value(m.compute())
    return out


def dist_rank(rank, world, sock, name, n, shuffle, bs):
    torch.set_num_threads(1)  # (a forked child: torch's thread pool is the parent's)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    p, t = data(n)
    ds = TensorDataset(p, t, torch.arange(n))
    dl = DataLoader(ds, batch_size=bs, sampler=DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=5))
    metrics = make_metrics()
    dtm.attach([m for m, _ in metrics.values()])
    real = 0
    for pb, tb, ib in g.eval_loop(dl):
        real += int(deval.real_rows().sum())
        for m, args in metrics.values():
            m.update(*args(pb, tb, ib))
    out = {k: value(m.compute()) for k, (m, _) in metrics.items()}
    dtm.use(None)
    g.leave()
    return out, real


@pytest.mark.parametrize("world,n,shuffle", [(2, 7, False), (3, 7, True), (4, 9, True),
                                             (4, 13, False)])
def test_metrics_updated_per_rank_over_a_padded_sampler(daemon, world, n, shuffle):
    res = run_ranks(world, dist_rank, daemon.socket, group_name("once"), n, shuffle, 2,
                    timeout=240)
    want = single(n)
    assert sum(real for _, real in res) == n
    for got, _ in res:
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], abs=1e-5), k


def paths_rank(rank, world, sock, name):
    """Every way a metric syncs, with no torch.distributed group at all."""
    torch.set_num_threads(1)
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    p, t = data(8)
    mine = slice(rank * 4, rank * 4 + 4)
    m = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=C))
    m.update(p[mine], t[mine])
    out = {"compute": float(m.compute())}
    m.sync()
    out["sync"] = float(m.tp.sum() + m.fn.sum())  # every rank's samples in the state
    m.unsync()
    m.persistent(True)  # (states go into state_dict only when asked)
    with m.sync_context():
        out["context"] = float(m.tp.sum() + m.fn.sum())
        sd = m.state_dict()
    out["state_dict"] = float(sd["tp"].sum() + sd["fn"].sum())
    step = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=C,
                                            dist_sync_on_step=True))
    out["forward"] = float(step(p[mine], t[mine]))
    cpu = dtm.attach(torchmetrics.AUROC(task="multiclass", num_classes=C,
                                        compute_on_cpu=True))
    cpu.update(p[mine], t[mine])
    out["cpu"] = float(cpu.compute())
    coll = dtm.attach(torchmetrics.MetricCollection(
        [torchmetrics.Precision(task="multiclass", num_classes=C),
         torchmetrics.Recall(task="multiclass", num_classes=C)], compute_groups=True))
    coll.update(p[mine], t[mine])
    out["groups"] = {k: float(v) for k, v in coll.compute().items()}
    tracker = dtm.attach(torchmetrics.wrappers.MetricTracker(
        torchmetrics.Accuracy(task="multiclass", num_classes=C)))
    tracker.increment()
    tracker.update(p[mine], t[mine])
    out["tracker"] = float(tracker.compute())
    boot = dtm.attach(torchmetrics.wrappers.BootStrapper(
        torchmetrics.MeanMetric(), num_bootstraps=4, sampling_strategy="multinomial"))
    boot.update(torch.full((4,), float(rank)))
    out["boot"] = float(boot.compute()["mean"])  # every rank's bootstraps averaged
    running = dtm.attach(torchmetrics.wrappers.Running(torchmetrics.SumMetric(), window=2))
    running.update(torch.tensor([1.0 + rank]))
    out["running"] = float(running.compute())
    # a checkpoint, a copy, another process: still attached
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    twin = copy.deepcopy(m)
    again = pickle.loads(pickle.dumps(m))
    out["loaded"] = [float(x.compute()) for x in (loaded, twin, again)]
    out["attached"] = all(x.dist_sync_fn is dtm.sync and isinstance(x.update, dtm._Update)
                          for x in (loaded, twin, again))
    dtm.use(None)
    g.leave()
    return out


def test_every_sync_path_goes_through_deval(daemon):
    res = run_ranks(2, paths_rank, daemon.socket, group_name("paths"), timeout=240)
    p, t = data(8)
    acc = float(torchmetrics.functional.accuracy(p, t, task="multiclass", num_classes=C))
    auroc = float(torchmetrics.functional.auroc(p, t, task="multiclass", num_classes=C))
    prec = float(torchmetrics.functional.precision(p, t, task="multiclass", num_classes=C))
    for out in res:
        assert out["compute"] == pytest.approx(acc)
        assert out["sync"] == out["context"] == out["state_dict"] == 8
        assert out["forward"] == pytest.approx(acc)
        assert out["cpu"] == pytest.approx(auroc)
        assert out["groups"]["MulticlassPrecision"] == pytest.approx(prec)
        assert out["tracker"] == pytest.approx(acc)
        assert out["boot"] == pytest.approx(0.5)
        assert out["running"] == 3.0
        assert out["loaded"] == pytest.approx([acc] * 3)
        assert out["attached"]


class RejectsEmpty(torch.nn.Module):
    """A model whose forward fails on a batch of 0 rows, as a transformer's does."""

    def forward(self, x):
        if x.shape[0] == 0:
            raise RuntimeError("cannot reshape tensor of 0 elements")
        return x.float() * 2


def raw_rank(rank, world, sock, name, collate):
    """Uneven loaders whose batches are lists of raw samples, and a model that rejects 0 rows:
    the replay hands the body one padding sample in the batch's own structure."""
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    n = 7
    ds = [(torch.tensor([float(i)]), {"label": i % 2}) for i in range(n)]
    mine = [b for j, b in enumerate([[0], [1, 2], [3], [4, 5], [6]]) if j % world == rank]
    collate = {"zip": lambda b: tuple(zip(*b)), "list": lambda b: b}[collate]
    dl = DataLoader(ds, batch_sampler=mine, collate_fn=collate)
    model = RejectsEmpty()
    m = dtm.attach(torchmetrics.SumMetric())
    got, shapes = [], []
    for batch in g.eval_loop(dl, num_samples=n):
        xs, ys = batch if isinstance(batch, tuple) else tuple(zip(*batch))
        real = deval.real_rows()  # (None: a sharding deval does not know, which may pad)
        shapes.append((len(xs), None if real is None else bool(real.any())))
        out = model(torch.stack(xs))[:, 0]
        labels = torch.tensor([y["label"] for y in ys])
        m.update(out)
        got.append(g.gather_for_metrics((out, labels)))
    rows = torch.cat([o for o, _ in got]).tolist()
    total = float(m.compute())
    dtm.use(None)
    g.leave()
    return rows, total, shapes


@pytest.mark.parametrize("collate", ["zip", "list"])
def test_replay_of_raw_samples_and_a_model_that_rejects_empty(daemon, collate):
    res = run_ranks(2, raw_rank, daemon.socket, group_name("raw"), collate, timeout=120)
    want = [2.0 * i for i in range(7)]
    for rows, total, _ in res:
        assert rows == want
        assert total == sum(want)
    # rank 1 has one batch fewer: it replays one padding sample, not a real batch
    assert res[1][2] == [(2, None), (2, None), (1, False)] and res[0][2] == [(1, None)] * 3


def unknown_rank(rank, world, sock, name, wrapped):
    """A sharding deval does not know, which pads: the metric refuses to compute (a wrapper's
    inner metric too, though the wrapper's own compute syncs nothing)."""
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    ds = TensorDataset(torch.arange(5))
    mine = [[0, 1], [2, 3]] if rank == 0 else [[4, 0], [1, 2]]  # 0, 1, 2 twice
    m = dtm.attach(torchmetrics.wrappers.MinMaxMetric(torchmetrics.SumMetric()) if wrapped
                   else torchmetrics.SumMetric())
    try:
        for (x,) in g.eval_loop(DataLoader(ds, batch_sampler=mine), num_samples=5):
            m.update(x.float())
        return float(m.compute())
    except deval.Mismatch as e:
        return str(e)
    finally:
        dtm.use(None)
        g.leave()


@pytest.mark.parametrize("wrapped", [False, True])
def test_padding_it_cannot_tell_fails_the_compute(daemon, wrapped):
    res = run_ranks(2, unknown_rank, daemon.socket, group_name("unknown"), wrapped,
                    timeout=120)
    for said in res:
        assert isinstance(said, str) and "took 8 samples" in said and "holds 5" in said, said
        assert "a batch sampler of your own" in said, said  # (what it can see into, and not)


def test_real_rows_outside_a_loop_is_none():
    assert deval.real_rows() is None


class Twice(torch.utils.data.Sampler):
    """Test-time augmentation's sampler: every index twice, the copies apart."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(list(range(self.n)) * 2)

    def __len__(self):
        return 2 * self.n


def samplers(n):
    w = torch.linspace(1, 2, n)
    return {
        "weighted": lambda: torch.utils.data.WeightedRandomSampler(
            w, 16, generator=torch.Generator().manual_seed(4)),
        "replacement": lambda: torch.utils.data.RandomSampler(
            range(n), replacement=True, num_samples=15,
            generator=torch.Generator().manual_seed(4)),
        "twice": lambda: Twice(n),
        "shuffled": lambda: torch.utils.data.RandomSampler(
            range(n), generator=torch.Generator().manual_seed(4)),
        "plain": lambda: torch.utils.data.SequentialSampler(range(n)),
    }


def accel_rank(rank, world, port, name, kind, even, sock):
    from test_accelerate_real import set_env
    set_env(rank, world, port)
    import os
    os.environ["DEVAL_SOCKET"] = sock
    import deval.accelerate
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=even))
    deval.accelerate.enable(acc, group=name)
    n = 10
    ds = TensorDataset(torch.arange(n))
    dl = acc.prepare(DataLoader(ds, batch_size=3, sampler=samplers(n)[kind]()))
    m = dtm.attach(torchmetrics.CatMetric())
    got = []
    for (idx,) in dl:
        m.update(idx.float())
        got.append(acc.gather_for_metrics(idx))
    rows = torch.cat(got).tolist()
    per_rank = sorted(m.compute().long().tolist())
    acc.wait_for_everyone()
    return rows, per_rank


@pytest.mark.parametrize("kind", ["weighted", "replacement", "twice", "shuffled", "plain"])
@pytest.mark.parametrize("world,even", [(2, True), (3, True), (3, False)])
def test_samplers_that_repeat_under_accelerate(daemon, kind, world, even):
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(world, accel_rank, free_port(), group_name("draws"), kind, even,
                    daemon.socket, timeout=240)
    want = [int(i) for i in samplers(10)[kind]()]  # one process's loop, in its order
    for rows, per_rank in res:
        assert rows == want
        assert per_rank == sorted(want)


def iterable_rank(rank, world, port, name, dispatch, sock):
    """Accelerate's iterable shards pad their last round, and so do the batches it dispatches
    from rank 0: the metric drops it (dispatched, it used to refuse to compute)."""
    from test_accelerate_real import Iterable, set_env
    set_env(rank, world, port)
    import os
    os.environ["DEVAL_SOCKET"] = sock
    import deval.accelerate
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    dl = acc.prepare(DataLoader(Iterable(10), batch_size=3))
    m = dtm.attach(torchmetrics.CatMetric())
    for x in dl:
        m.update(x.float())
    try:
        return sorted(m.compute().long().tolist())
    except deval.Mismatch as e:
        return str(e)
    finally:
        acc.wait_for_everyone()


@pytest.mark.parametrize("dispatch", [False, True])
def test_iterable_shards_per_rank(daemon, dispatch):
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(3, iterable_rank, free_port(), group_name("iter"), dispatch, daemon.socket,
                    timeout=240)
    for got in res:
        assert got == list(range(10)), got


class Model(torch.nn.Module):
    """A model that makes its metrics itself, as a LightningModule does."""

    def __init__(self):
        super().__init__()
        self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=C)
        self.per_class = torchmetrics.MetricCollection({"cls": torchmetrics.wrappers.
                                                        ClasswiseWrapper(torchmetrics.Accuracy(
                                                            task="multiclass", num_classes=C,
                                                            average=None))})


def enable_rank(rank, world, sock, name):
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    dtm.enable()  # one line, before the model makes its metrics
    model = Model()
    p, t = data(11)
    ds = TensorDataset(p, t)
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=True))
    for pb, tb in g.eval_loop(dl):
        model.acc.update(pb, tb)
        model.per_class.update(pb, tb)
    out = float(model.acc.compute()), {k: float(v) for k, v in model.per_class.compute().items()}
    dtm.enable(False)
    g.leave()
    return out


def test_enable_attaches_metrics_made_later(daemon):
    res = run_ranks(4, enable_rank, daemon.socket, group_name("enable"), timeout=240)
    p, t = data(11)
    want = Model()
    want.acc.update(p, t)
    want.per_class.update(p, t)
    w = float(want.acc.compute()), {k: float(v) for k, v in want.per_class.compute().items()}
    for acc, per_class in res:
        assert acc == pytest.approx(w[0])
        assert per_class == pytest.approx(w[1])


def probe_rank(rank, world, sock, name):
    """What a helper found, trying to break it: values with no row per sample, a row count
    that only looks per-sample, gathered rows, metrics made before enable(), a compute
    mid-loop, list states of one element per sample (7 samples, 2 ranks, batches of 2: rank
    1's last batch is one sample and the sampler's padding)."""
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    early = torchmetrics.Accuracy(task="multiclass", num_classes=C)  # made before enable()
    dtm.enable()
    p, t = data(7)
    ds = TensorDataset(p, t, torch.arange(7))
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    tm = torchmetrics
    ms = {"scalar": tm.SumMetric(), "one_row": tm.SumMetric(), "tokens": tm.SumMetric(),
          "gathered": tm.CatMetric(sync_on_compute=False), "early": early,
          "midloop": tm.Accuracy(task="multiclass", num_classes=C),
          "per_sample_list": tm.retrieval.RetrievalMRR(),
          "gathered_everywhere": tm.SumMetric(), "gathered_on_0": tm.CatMetric(),
          "cat_everywhere": tm.CatMetric(), "mixed": tm.SumMetric(),
          "part_everywhere": tm.SumMetric()}
    for pb, tb, ib in g.eval_loop(dl):
        ms["scalar"].update((pb.argmax(1) == tb).sum().item())
        ms["one_row"].update((pb.argmax(1) == tb).sum(0, keepdim=True))
        ms["tokens"].update(torch.ones(int(ib.sum()) % 5 + 1))  # a count that varies
        ms["gathered"].update(g.gather_for_metrics(ib).float())
        ms["early"].update(pb, tb)
        ms["midloop"].update(pb, tb)
        ms["midloop"].compute()  # (a progress bar's value, every batch)
        ms["per_sample_list"].update(pb[:, 0], tb == 0, indexes=ib % 2)
        every = g.gather_for_metrics(ib)
        ms["gathered_everywhere"].update(every.float())  # (a copy: its rows say where it came from)
        ms["cat_everywhere"].update(every.float())
        ms["part_everywhere"].update(every[rank::world])  # (a view: its storage is every's)
        ms["mixed"].update(every.float() if len(ms["cat_everywhere"].value) == 1 else ib.float())
        if rank == 0:
            ms["gathered_on_0"].update(every.view(-1, 1)[:, 0])
    out = {}
    for k, m in ms.items():
        try:
            v = m.compute()
            out[k] = sorted(v.tolist()) if v.ndim else round(float(v), 6)
        except deval.Mismatch as e:
            out[k] = "Mismatch" if "padding" in str(e) else str(e)
        except deval.Error as e:
            out[k] = str(e)
    dtm.enable(False)
    g.leave()
    return out


def test_what_a_helper_found(daemon):
    res = run_ranks(2, probe_rank, daemon.socket, group_name("probe"), timeout=120)
    p, t = data(7)
    acc = round(float(torchmetrics.functional.accuracy(p, t, task="multiclass",
                                                       num_classes=C)), 6)
    mrr = torchmetrics.retrieval.RetrievalMRR()
    mrr.update(p[:, 0], t == 0, indexes=torch.arange(7) % 2)
    for out in res:
        # padding in a value deval cannot cut: an error, not a count with a duplicate
        assert out["scalar"] == out["one_row"] == out["tokens"] == "Mismatch", out
        assert out["gathered"] == list(range(7))  # every rank's rows, as gathered
        assert out["early"] == out["midloop"] == acc
        assert out["per_sample_list"] == round(float(mrr.compute()), 6)
        # the same gathered rows on every rank, nothing else: each state is one process's,
        # kept unsynced (it used to raise Mismatch; torch.distributed counts each twice)
        assert out["gathered_everywhere"] == 21.0 and out["cat_everywhere"] == list(range(7))
        assert "gathered from every rank" in out["mixed"], out
        assert "gathered from every rank" in out["part_everywhere"], out
        assert out["gathered_on_0"] == list(range(7))


def short_round_rank(rank, world, sock, name):
    """Metrics fed, on every rank, values computed from the gathered rows (a copy, a softmax):
    13 samples on 3 ranks in batches of 2, so the last round gathers one real row, as many as
    each rank's last batch holds. Before, those copies read as the rank's own rows there, and
    compute() raised Mismatch ("not only with the same gathered rows")."""
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    p, t = data(13)
    ds = TensorDataset(p, t)
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=False))
    total = dtm.attach(torchmetrics.SumMetric())
    top = dtm.attach(torchmetrics.MeanMetric())
    acc = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=C))
    try:
        for pb, tb in g.eval_loop(dl):
            pg, tg = g.gather_for_metrics((pb, tb))
            total.update(tg.float())
            top.update((pg * 2).softmax(-1).max(-1).values)
            acc.update(pg.argmax(-1), tg)
        return [round(float(m.compute()), 6) for m in (total, top, acc)]
    finally:
        g.leave()


def test_copies_of_a_short_last_round_s_gathered_rows_count_once(daemon):
    res = run_ranks(3, short_round_rank, daemon.socket, group_name("short-round"), timeout=120)
    p, t = data(13)
    want = [round(float(t.float().sum()), 6),
            round(float((p * 2).softmax(-1).max(-1).values.mean()), 6),
            round(float((p.argmax(-1) == t).float().mean()), 6)]
    assert res == [want] * 3, res


def skip_rank(rank, world, port, name, sock):
    """skip_first_batches under enable(): the batches each rank skipped are not in the pass,
    and the padding that repeats one of them is no sample either. Iterated without a gather
    (a resumed training epoch) it runs as well. Before: InvalidArgument at the first
    gather_for_metrics ("cannot tell how DataLoaderShard is sharded")."""
    from test_accelerate_real import set_env
    set_env(rank, world, port)
    import os
    os.environ["DEVAL_SOCKET"] = sock
    import deval.accelerate
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    out = {}
    for shuffle in (False, True):
        torch.manual_seed(0)
        ev = acc.prepare(DataLoader(TensorDataset(torch.arange(11)), batch_size=2,
                                    shuffle=shuffle))
        for skip in (1, 2, 4):
            seen = sum(len(x) for (x,) in acc.skip_first_batches(ev, skip))
            got, mine = [], []
            for (x,) in acc.skip_first_batches(ev, skip):
                got += acc.gather_for_metrics(x).tolist()
                mine.append(x.tolist())
            # what one process reads after those batches: the rounds of every rank's batches
            # of this very iteration, in rank order, cut where the sampler ran out
            every = deval.accelerate._ACTIVE.group.gather_object([mine])
            rounds = [i for r in range(len(mine)) for b in every for i in b[r]]
            out[shuffle, skip] = seen, got, rounds[:max(0, 11 - skip * world * 2)]
    acc.wait_for_everyone()
    deval.accelerate.disable()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_skip_first_batches_under_enable(daemon, world):
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(world, skip_rank, free_port(), group_name("skip"), daemon.socket,
                    timeout=120)
    for out in res:
        for (shuffle, skip), (seen, got, want) in out.items():
            assert got == want, (shuffle, skip, got, want)
            assert seen >= len(got) // world, (shuffle, skip, seen)
    assert res[0][False, 1][1] == list(range(2 * world, 11))


def leave_rank(rank, world, sock, name):
    """Rank 1's body raises at batch 1; both ranks catch it and evaluate again; then rank 1
    stays busy outside deval. Before: rank 0 waited for its timeout, first in its loop's
    abandon (the pass a leaver failed was over already), then in the second pass's begin
    (rank 1 raised its stored failure without a call)."""
    import time
    torch.set_num_threads(1)
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    ds = TensorDataset(torch.arange(12))
    dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, world, rank, shuffle=False))

    def evaluate(boom):
        t0 = time.monotonic()
        try:
            rows = []
            for i, (x,) in enumerate(g.eval_loop(dl)):
                if boom and i == 1 and rank == 1:
                    raise RuntimeError("boom")
                rows += g.gather_for_metrics(x).tolist()
            return rows, time.monotonic() - t0
        except Exception as e:
            return type(e).__name__, time.monotonic() - t0

    out = [evaluate(True), evaluate(False), evaluate(False)]
    if rank == 1:
        time.sleep(6)  # (busy elsewhere: no deval call)
    g.leave()
    return out


def test_a_rank_that_left_hangs_no_one(daemon):
    res = run_ranks(2, leave_rank, daemon.socket, group_name("leave"), timeout=60)
    for rank, out in enumerate(res):
        assert all(took < 3 for _, took in out), out
        assert out[0][0] == ("RuntimeError" if rank else "Mismatch"), out
        assert out[1][0] == "Mismatch", out  # the stored failure, in step with the others
        assert out[2][0] == list(range(12)), out  # then a pass as any other


def test_the_replay_batch_keeps_the_batch_structure():
    """head(): one sample in the batch's own structure, for the structures loaders make."""
    from deval import _loop
    x, y = torch.arange(12).reshape(4, 3), torch.arange(4)
    fields = _loop.head([x, y])  # torch's default collate of (x, y) samples
    assert isinstance(fields, list) and len(fields) == 2
    assert fields[0].tolist() == [[0, 1, 2]] and fields[1].tolist() == [0]
    assert _loop.head({"ids": x, "label": y})["ids"].shape == (1, 3)
    samples = [("a", 1), ("b", 2), ("c", 3)]
    assert _loop.head(samples) == [("a", 1)]  # collate_fn=lambda b: b
    assert _loop.head(tuple(zip(*samples))) == (("a",), (1,))  # zip(*b)


def loops_rank(rank, world, port, name, sock, case):
    """Under enable() a pass opens at a loader's first gather_for_metrics: a rank that left
    its loop before that (case "break": at its first batch; "empty": its shard has no batch)
    met the others' pass with its next loop's, and both got the other's samples, no error.
    A break now makes every rank raise Mismatch, naming the loaders; a rank whose shard had
    no batch takes part in the others' pass and replays it, as a rank that ran out first."""
    from test_accelerate_real import set_env
    set_env(rank, world, port)
    import os
    os.environ["DEVAL_SOCKET"] = sock
    import deval.accelerate
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        even_batches=case != "empty"))
    deval.accelerate.enable(acc, group=name)
    n = 12 if case == "break" else 4  # "empty": val has 2 batches of 2 for 3 ranks
    val = acc.prepare(DataLoader(TensorDataset(torch.arange(n)), batch_size=2))
    test = acc.prepare(DataLoader(TensorDataset(100 + torch.arange(12)), batch_size=2))
    got = []
    for ld in (val, test):
        try:
            rows = []
            for i, (x,) in enumerate(ld):
                if case == "break" and ld is val and rank == 1 and i == 0:
                    break
                rows += acc.gather_for_metrics(x).tolist()
            got.append(rows)
        except deval.Mismatch as e:
            got.append(str(e))
            break
    return got


@pytest.mark.parametrize("case", ["break", "empty"])
def test_a_loop_left_before_its_pass_opened_mixes_no_loops(daemon, case):
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(3, loops_rank, free_port(), group_name("loops"), daemon.socket, case,
                    timeout=120)
    if case == "empty":  # one process's results, on every rank
        assert all(got == [list(range(4)), list(range(100, 112))] for got in res), res
        return
    for rank, got in enumerate(res):
        for rows in got:  # whatever a rank got is one loader's samples, whole, or an error
            assert isinstance(rows, str) or rows in ([], list(range(12)),
                                                     list(range(100, 112))), got
        said = [r for r in got if isinstance(r, str)]
        assert said and "different loaders" in said[0], (rank, got)


def test_enable_says_when_the_accelerator_runs_alone(monkeypatch):
    """Under torchrun on CPU an Accelerator made without cpu=True runs alone on every rank:
    enable() said that rank 0 was already joined; it now says what happened and what to do."""
    pytest.importorskip("accelerate")
    import deval.accelerate
    from accelerate import Accelerator
    for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    acc = Accelerator(cpu=True)
    assert acc.num_processes == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(deval.InvalidArgument, match="runs alone.*cpu=True"):
        deval.accelerate.enable(acc)
