# SPDX-License-Identifier: MIT
"""deval.torchmetrics against torchmetrics from PyPI: sync joins the launcher's group when none
was given, a rank with no data (torchmetrics' empty placeholder, of the default dtype) does not
break a list state's sync, and an attached metric still pickles and deep-copies. Before: an
InvalidArgument asking for a group, "ranks disagree on dtype" from AUROC, and a pickling error
on the attached metric's lambda."""

import copy
import os
import pickle
import time

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
        return str(e), time.monotonic()
    finally:
        dtm.use(None)
        g.leave()
    return None


def assert_failed_together(res, words):
    """Every rank raised Mismatch saying words, within a second of each other (a hang, or an
    error on some ranks only, fails)."""
    assert all(r is not None and words in r[0] for r in res), res
    when = [t for _, t in res]
    assert max(when) - min(when) < 1.0, when


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_metric_synced_while_a_rank_has_ended_fails_everywhere(daemon, world):
    res = run_ranks(world, running_rank, daemon.socket, group_name("running"), timeout=120)
    assert_failed_together(res, "has already ended its eval pass")


def accelerate_running_rank(rank, world, port, name, sock, even):
    """An accuracy computed every batch of a loader Accelerate prepared, deval.accelerate
    enabled, and no gather_for_metrics (so no eval pass opens): with even_batches=False and
    13 samples in batches of 2 the ranks have different numbers of batches. Then a compute
    after the loop, as a script does."""
    from test_accelerate_real import set_env
    set_env(rank, world, port)
    os.environ["DEVAL_SOCKET"] = sock
    import deval
    import deval.accelerate
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=even))
    deval.accelerate.enable(acc, group=name)
    n = 13
    ds = TensorDataset(torch.arange(n), torch.arange(n) % 3)
    dl = acc.prepare(DataLoader(ds, batch_size=2))
    m = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=3))
    try:
        for idx, y in dl:
            m.update((idx * 7 + 1) % 3, y)
            m.compute()
        value = float(m.compute())
        acc.wait_for_everyone()  # (torch.distributed's barrier: no deval call)
    except deval.Mismatch as e:
        return str(e), time.monotonic()
    finally:
        deval.accelerate.disable()
    return value


@pytest.mark.parametrize("world", [3, 4])
def test_a_metric_synced_in_an_uneven_accelerate_loop_fails_everywhere(daemon, world):
    """Before: no pass is open, so the ranks whose loader ran out paired their compute()
    after the loop with the others' compute() of a batch, then waited in torch.distributed's
    barrier while the others waited in deval: every rank hung."""
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(world, accelerate_running_rank, free_port(), group_name("uneven"),
                    daemon.socket, False, timeout=120)
    assert_failed_together(res, "of a loop whose loader ran out on rank")


def test_a_metric_synced_in_an_even_accelerate_loop_is_exact(daemon):
    """The same loop with even_batches=True (Accelerate's wrap-around padding, which deval
    drops): every rank's loop ends at the same batch, and the value after it is one
    process's."""
    pytest.importorskip("accelerate")
    from test_accelerate_real import free_port
    res = run_ranks(3, accelerate_running_rank, free_port(), group_name("even"),
                    daemon.socket, True, timeout=120)
    idx = torch.arange(13)
    want = float(torchmetrics.functional.accuracy((idx * 7 + 1) % 3, idx % 3,
                                                  task="multiclass", num_classes=3))
    assert res == [pytest.approx(want, abs=1e-7)] * 3


# ---- every kind of state torchmetrics syncs, through deval alone ---------------------------

def logsumexp0(x):
    """A dist_reduce_fx of a user's own: the ranks' states, stacked, folded."""
    return torch.logsumexp(x, dim=0)


def sorted_cat(xs):
    """A dist_reduce_fx of a user's own for a list state: every rank's elements, as one."""
    return torch.sort(torch.cat(xs)).values


class Kinds(torchmetrics.Metric):
    """A metric with a state of each kind add_state() takes, several at once: sum, cat, min,
    max, mean, None (tensor and list) and callables of the user's own (tensor and list)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        t = torch.tensor
        self.add_state("total", t(0.0), dist_reduce_fx="sum")
        self.add_state("rows", [], dist_reduce_fx="cat")
        self.add_state("low", t(float("inf")), dist_reduce_fx="min")
        self.add_state("high", t(float("-inf")), dist_reduce_fx="max")
        self.add_state("scale", t(2.0), dist_reduce_fx="mean")
        self.add_state("count", t(0), dist_reduce_fx=None)
        self.add_state("each", [], dist_reduce_fx=None)
        self.add_state("lse", t(float("-inf")), dist_reduce_fx=logsumexp0)
        self.add_state("ordered", [], dist_reduce_fx=sorted_cat)

    def update(self, x):
        self.total += x.sum()
        self.rows.append(x)
        self.low = torch.minimum(self.low, x.min())
        self.high = torch.maximum(self.high, x.max())
        self.count += len(x)
        self.each.append(x.sum(0, keepdim=True))
        self.lse = torch.logaddexp(self.lse, torch.logsumexp(x, 0))
        self.ordered.append(x)

    def compute(self):
        def cat(v):
            return v if torch.is_tensor(v) else torch.cat(v)
        return {"total": self.total, "rows": torch.sort(cat(self.rows)).values,
                "low": self.low, "high": self.high, "scale": self.scale,
                "count": self.count.sum(), "each": cat(self.each).sum(), "lse": self.lse,
                "ordered": cat(self.ordered)}


def list_batches_rank(rank, world, sock, name):
    """SumMetric updated with a rank's own rows in an eval_loop over a plain list whose
    batches are lists of per-sample [1] tensors, DistributedSampler's dealing of 10 samples
    (samples 0 and 1 again as padding), strided: the batch's count is its length, not its
    tensors' rows, so the padding taken is caught at compute()."""
    torch.set_num_threads(1)
    import deval
    g = deval.join(name, rank, world, socket=sock, timeout=20)
    dtm.use(g)
    n = 10
    slots = (list(range(n)) * 2)[:-(-n // world) * world][rank::world]
    loader = [[torch.tensor([float(v)]) for v in slots[i:i + 2]] for i in range(0, len(slots), 2)]
    m = dtm.attach(torchmetrics.SumMetric())
    try:
        for batch in g.eval_loop(loader, num_samples=n, order="strided"):
            m.update(torch.cat(batch))
        return "sum %s" % m.compute().item(), time.monotonic()
    except deval.Mismatch as e:
        return str(e), time.monotonic()
    finally:
        dtm.use(None)
        g.leave()


def test_a_list_of_samples_is_counted_by_its_length(daemon):
    """It summed 46 for 45 on every rank, no error: each batch counted as 1 sample."""
    res = run_ranks(3, list_batches_rank, daemon.socket, group_name("listbatch"), timeout=120)
    assert_failed_together(res, "took 12 samples over the ranks")


def kind_data(n=23):
    g = torch.Generator().manual_seed(7)
    p = torch.rand(n, generator=g)
    return {"p": p, "t": torch.rand(n, generator=g), "b": torch.rand(n, generator=g) > 0.5,
            "i": torch.arange(n) % 5, "c": torch.randint(0, 3, (n,), generator=g),
            "w": ["w%d x%d" % (v, v % 3) for v in torch.randint(0, 9, (n,), generator=g).tolist()]}


def kind_metrics():
    """name -> (metric, its update's arguments from kind_data()'s rows): a metric of each
    kind of state the reports named (sum; sum and cat; cat lists; retrieval with indexes;
    min, max; None; a callable of the user's own)."""
    tm, r = torchmetrics, torchmetrics.retrieval
    ret = lambda d: (d["p"], d["b"], d["i"])  # noqa: E731
    reg = lambda d: (d["p"], d["t"])  # noqa: E731
    return {
        "mse": (tm.MeanSquaredError(), reg),  # sum
        "sum": (tm.SumMetric(), lambda d: (d["p"],)),
        "mean": (tm.MeanMetric(), lambda d: (d["p"], d["t"])),  # sum, weighted
        "max": (tm.MaxMetric(), lambda d: (d["p"],)),
        "min": (tm.MinMetric(), lambda d: (d["p"],)),
        "cat": (tm.CatMetric(), lambda d: (d["p"],)),
        "r2": (tm.R2Score(), reg),
        "pearson": (tm.PearsonCorrCoef(), reg),  # None tensors
        "concordance": (tm.ConcordanceCorrCoef(), reg),
        "spearman": (tm.SpearmanCorrCoef(), reg),  # cat
        "kendall": (tm.KendallRankCorrCoef(), reg),
        "explained": (tm.ExplainedVariance(), reg),
        "psnr": (tm.image.PeakSignalNoiseRatio(data_range=1.0), reg),  # mean, sum
        "auroc": (tm.AUROC(task="binary"), lambda d: (d["p"], d["b"])),
        "confusion": (tm.ConfusionMatrix(task="multiclass", num_classes=3),
                      lambda d: (((d["c"] + d["i"]) % 3), d["c"])),
        "samplewise": (tm.StatScores(task="multiclass", num_classes=3, average=None,
                                     multidim_average="samplewise"),  # cat, per sample
                       lambda d: (((d["c"] + d["i"]) % 3)[:, None], d["c"][:, None])),
        "map": (r.RetrievalMAP(), ret),
        "mrr": (r.RetrievalMRR(), ret),
        "ndcg": (r.RetrievalNormalizedDCG(top_k=3), ret),
        "precision": (r.RetrievalPrecision(top_k=2), ret),
        "recall": (r.RetrievalRecall(top_k=2), ret),
        "hitrate": (r.RetrievalHitRate(top_k=2), ret),
        "fallout": (r.RetrievalFallOut(top_k=2), ret),
        "rprecision": (r.RetrievalRPrecision(), ret),
        "wer": (tm.text.WordErrorRate(), lambda d: (d["w"], d["w"][::-1])),
        "kinds": (Kinds(), lambda d: (d["p"],)),
        "collection": (tm.MetricCollection({"mse": tm.MeanSquaredError(),
                                            "cos": tm.CosineSimilarity(reduction="mean"),
                                            "mae": tm.MeanAbsoluteError()}, compute_groups=True),
                       lambda d: (d["p"][:, None], d["t"][:, None])),
    }


def rows_of(d, rows):
    return {k: [v[i] for i in rows] if isinstance(v, list) else v[rows] for k, v in d.items()}


def plain(v):
    """A computed value as plain numbers (what a cat state holds is in the ranks' order:
    sorted, as the Kinds metric and the tests of order elsewhere see to)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in sorted(v.items())}
    t = torch.as_tensor(v).double()
    return sorted(t.flatten().tolist()) if t.ndim else float(t)


def assert_close(got, want, what):
    """got equals want, through dicts; floats up to their rounding (the ranks' sums are
    added in another order than one process adds them)."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), what
        for k in want:
            assert_close(got[k], want[k], "%s[%s]" % (what, k))
        return
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6), what


def kinds_rank(rank, world, sock, name):
    torch.set_num_threads(1)
    import deval
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    calls = []
    for method in ("gather", "gather_object"):  # what goes through deval
        def counted(*a, _f=getattr(g, method), **kw):
            calls.append(1)
            return _f(*a, **kw)
        setattr(g, method, counted)
    dtm.use(g)
    d = kind_data()
    # uneven shares, two updates each: ranks 0 and 1 have twice rank 2's samples
    mine = [i for i in range(len(d["p"])) if [0, 0, 1, 1, 2][i % 5] == rank]
    out = {}
    try:
        for key, (m, args) in kind_metrics().items():
            dtm.attach(m)
            for part in (mine[:len(mine) // 2], mine[len(mine) // 2:]):
                m.update(*args(rows_of(d, part)))
            before = len(calls)
            out[key] = (plain(m.compute()), len(calls) - before)
    finally:
        dtm.use(None)
        g.leave()
    return out, torch.distributed.is_initialized()


def test_every_kind_of_state_syncs_through_deval_alone(daemon):
    """Before: TypeError ('NoneType' object is not callable) was reported from a sum state,
    and retrieval and cat states synced through torch.distributed. No process group exists
    here, so a sync through torch.distributed raises; each compute must call deval."""
    res = run_ranks(3, kinds_rank, daemon.socket, group_name("kinds"), timeout=240)
    d = kind_data()
    want = {}
    for key, (m, args) in kind_metrics().items():
        m.update(*args(d))
        want[key] = plain(m.compute())
    for out, initialised in res:
        assert not initialised
        for key, (got, calls) in out.items():
            assert calls > 0, key  # synced through deval
            assert_close(got, want[key], key)


def masks_rank(rank, world, sock, name):
    """MeanAveragePrecision(iou_type="segm") holds its masks as lists of tuples, which its own
    _sync_dist gathers with torch.distributed's all_gather_object. (Made here without the
    pycocotools and torchvision it computes with: only its states and their sync are used.)"""
    torch.set_num_threads(1)
    import deval
    from torchmetrics.detection import mean_ap
    mean_ap._PYCOCOTOOLS_AVAILABLE = mean_ap._TORCHVISION_AVAILABLE = True
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    m = dtm.attach(mean_ap.MeanAveragePrecision(iou_type="segm"))
    for image in range(rank + 1):  # rank r has r + 1 images
        m.detection_mask.append(((rank, image), (b"rle", rank)))
        m.groundtruth_mask.append(((rank, image),))
        m.detection_box.append(torch.full((1, 4), float(rank)))
        m.detection_labels.append(torch.tensor([image]))
    try:
        m.sync()
        return (list(m.detection_mask), list(m.groundtruth_mask),
                [b.tolist() for b in m.detection_box], [x.tolist() for x in m.detection_labels],
                torch.distributed.is_initialized())
    finally:
        dtm.use(None)
        g.leave()


def test_mean_average_precision_masks_sync_through_deval(daemon):
    """Before: "Default process group has not been initialized" from its all_gather_object
    (and, with a process group, every mask gathered twice)."""
    res = run_ranks(2, masks_rank, daemon.socket, group_name("masks"), timeout=120)
    want_masks = [((r, i), (b"rle", r)) for r in range(2) for i in range(r + 1)]
    for det, gt, boxes, labels, initialised in res:
        assert det == want_masks
        assert gt == [((r, i),) for r in range(2) for i in range(r + 1)]
        assert boxes == [[[float(r)] * 4] for r in range(2) for i in range(r + 1)]
        assert labels == [[i] for r in range(2) for i in range(r + 1)]
        assert not initialised


def forward_rank(rank, world, sock, name, batch_value):
    """A mean loss accumulated with forward() over two loaders: the first pads a sample (7
    over 2 ranks), the second does not (8)."""
    torch.set_num_threads(1)
    import deval
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    m = dtm.attach(torchmetrics.MeanMetric())
    try:
        for n in (7, 8):
            ds = TensorDataset(torch.arange(n).float())
            dl = DataLoader(ds, batch_size=2, sampler=DistributedSampler(
                ds, num_replicas=world, rank=rank, shuffle=False))
            for (x,) in g.eval_loop(dl):
                # a batch's mean (0-d: which part is padding is lost) or its rows
                m(x.mean() if batch_value else x, weight=len(x) if batch_value else 1.0)
        return float(m.compute()), time.monotonic()
    except deval.Mismatch as e:
        return str(e), time.monotonic()
    finally:
        dtm.use(None)
        g.leave()


def test_forward_keeps_what_deval_knows_of_the_state(daemon):
    """forward() resets the metric to compute the batch's value and puts its state back:
    deval's marks of the state went with the reset, so a padded batch's 0-d value in the
    first loop was forgotten by the second loop's forward(), and compute() returned a mean
    with the padding in it (the same loops in the other order raised). Values with one row
    per sample stay exact."""
    res = run_ranks(2, forward_rank, daemon.socket, group_name("fwd"), True, timeout=120)
    assert_failed_together(res, "cannot tell which of its rows are the padding's")
    res = run_ranks(2, forward_rank, daemon.socket, group_name("fwd"), False, timeout=120)
    want = float(torch.cat([torch.arange(7), torch.arange(8)]).float().mean())
    assert [v for v, _ in res] == [pytest.approx(want)] * 2


def time_major_rank(rank, world, sock, name, n, how):
    """Token accuracy of a time-major tagger ([T, batch] outputs, as torch's RNNs give
    without batch_first) over a padded sampler: its flattened tokens, a view of the [T, batch]
    predictions ("view") or a copy of them ("copies", as .cpu() of a GPU's gives), and
    targets flattened from a transpose of the batch's (a copy); or the tokens gathered."""
    torch.set_num_threads(1)
    import deval
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    g = deval.join(name, rank, world, socket=sock, timeout=30)
    dtm.use(g)
    x, y = tokens(n)
    ds = TensorDataset(x, y, y[:, 0].clone())  # (a label per sample too)
    dl = DataLoader(ds, batch_size=3, sampler=DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=False))
    m = dtm.attach(torchmetrics.Accuracy(task="multiclass", num_classes=3))
    try:
        for xb, yb, y0 in g.eval_loop(dl):
            preds = ((xb * 7 + 1) % 3).t().contiguous()  # [T, batch], as a model gives it
            if how == "gather":
                g.gather_for_metrics(preds.reshape(-1))
            if how == "tta":  # two views of each sample, one view's rows after the other's
                m.update(torch.cat([preds[0], preds[2]]), y0.repeat(2))
                continue
            flat = preds.reshape(-1).clone() if how == "copies" else preds.reshape(-1)
            m.update(flat, yb.t().reshape(-1))
        return float(m.compute())
    except deval.InvalidArgument as e:
        return str(e)
    finally:
        dtm.use(None)
        g.leave()


def tokens(n, t=4):
    gen = torch.Generator().manual_seed(n)
    return torch.randint(0, 9, (n, t), generator=gen), torch.randint(0, 3, (n, t), generator=gen)


def test_time_major_tokens_are_cut_by_sample(daemon):
    """A [T, batch] value flattened runs over the batch's samples fastest: an update cuts the
    padding's tokens where they lie (it cut them as if one sample's followed another's: a
    wrong accuracy, no error), where a view of the [T, batch] value says so, or a copy equal
    to the batch's own targets flattened from a transpose (with the predictions a copy too,
    that was the wrong accuracy still, found by a helper); gather_for_metrics, whose results
    are one sample's rows after another's, refuses it on every rank. (At n = 7 the wrong cut
    happens to score the same; at 11, 0.3409 for 0.3182.)"""
    n = 11
    x, y = tokens(n)
    want = float(((x * 7 + 1) % 3 == y).float().mean())
    for how in ("view", "copies"):
        for value in run_ranks(2, time_major_rank, daemon.socket, group_name("tmaj"), n, how,
                               timeout=120):
            assert value == pytest.approx(want), how
    # test-time augmentation: torch.cat of two views beside the labels repeated (y.repeat(2)),
    # not interleaved (it cut the second view of a real sample and kept the padding's first:
    # 0.4091 for 0.3636)
    tta = float(((x[:, [0, 2]] * 7 + 1) % 3 == y[:, :1]).float().mean())
    for value in run_ranks(2, time_major_rank, daemon.socket, group_name("tmaj"), n, "tta",
                           timeout=120):
        assert value == pytest.approx(tta)
    for refused in run_ranks(2, time_major_rank, daemon.socket, group_name("tmaj"), n,
                             "gather", timeout=120):
        assert "flattened time-major" in refused, refused
