# SPDX-License-Identifier: MIT
"""deval.accelerate.enable() on the loops of Accelerate's own example scripts, against the real
accelerate from PyPI: evaluation every K steps inside a training loop that stops at
max_steps, a batch peeked on one rank before the loop, the same evaluation run twice. A pass
belongs to the loader whose batches it gathers and opens at its first gather_for_metrics, so
the training loader around an evaluation opens nothing. Before that, the evaluation inside
training returned 18 rows for 10 samples, and the peek shifted every rank's rows."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import deval  # noqa: E402
import deval.accelerate  # noqa: E402
from conftest import group_name, run_ranks  # noqa: E402
from test_accelerate_real import free_port, set_env  # noqa: E402

N = 10


class Batches:
    """A batch sampler that is a list of index lists: no batch_size, no drop_last."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class Unsized(torch.utils.data.IterableDataset):
    """An iterable dataset with no len(): dispatched from rank 0 (Accelerate's default), or
    sharded on every rank (dispatch_batches=False), where deval counts it as it is read."""

    def __iter__(self):
        return iter(torch.arange(N)[:, None].unbind(0))


def loops_rank(rank, world, port, name, case, shuffle):
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches={"dispatch": True, "unsized-sharded": False,
                          "unsized-split": False}.get(case),
        split_batches=case == "unsized-split"))
    deval.accelerate.enable(acc, group=name)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # (split_batches splits the training loader's batches too)
    train = DataLoader(TensorDataset(torch.arange(80)), batch_size=6 if "split" in case else 4,
                       shuffle=True)
    if case.startswith("unsized"):
        evals = DataLoader(Unsized(), batch_size=3)
    elif case == "custom":  # a batch sampler of its own, with no batch_size
        evals = DataLoader(TensorDataset(torch.arange(N)),
                           batch_sampler=Batches([[0, 1, 2], [3, 4], [5, 6, 7, 8], [9]]))
    else:
        evals = DataLoader(TensorDataset(torch.arange(N)), batch_size=3, shuffle=shuffle)
    model, opt, train, evals = acc.prepare(model, opt, train, evals)

    def evaluate():
        got = []
        for batch in evals:
            idx = batch[0] if isinstance(batch, (list, tuple)) else batch[:, 0]
            with torch.no_grad():
                pred = model(idx.float()[:, None])
            p, i = acc.gather_for_metrics((pred, idx))
            assert len(p) == len(i)
            got.append(i)
        return torch.cat(got).tolist()

    outs = []
    try:
        if case == "steps":  # run_glue_no_trainer's shape, stopping at max_steps
            for step, (x,) in enumerate(train):
                loss = model(x.float()[:, None]).pow(2).mean()
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                if step % 2 == 1:
                    outs.append(evaluate())
                if step == 4:
                    break
        elif case == "peek":
            if rank == 0:
                next(iter(evals))  # a look at one batch, on one rank
            outs.append(evaluate())
        elif case in ("custom", "unsized", "unsized-dispatched", "dispatch",
                      "unsized-sharded", "unsized-split"):
            if case == "unsized-sharded":
                stream = evals.dataset.dataset
                left = iter(evals)
                next(left)  # a loop left at its first batch, its iterator still held
            outs.append(evaluate())
            if case == "unsized-sharded":
                assert evals.dataset.dataset is stream  # the user's own, as before
                del left
        else:
            outs += [evaluate(), evaluate()]
            # what deval attached leaves the Accelerator as capable as before
            import pickle
            twin = pickle.loads(pickle.dumps(acc))
            assert type(twin) is type(acc) and "gather_for_metrics" not in vars(twin)
    finally:
        deval.accelerate.disable()
    return outs


class Prompts(torch.utils.data.IterableDataset):
    """A streamed evaluation set that knows its length: Accelerate shards it, no indices."""

    def __len__(self):
        return N

    def __iter__(self):
        return iter(range(N))


# Loops over an iterable Accelerate shards, which deval refuses: (dataset, batch size,
# dispatch_batches, the DataLoader's num_workers, the body's gather).
class WorkerParts(torch.utils.data.IterableDataset):
    """Samples 0..n-1, each DataLoader worker yielding its part (those its number is of,
    modulo the workers), as torch's documentation splits a stream; each part ends with its
    own short batch."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        w = torch.utils.data.get_worker_info()
        first, step = (0, 1) if w is None else (w.id, w.num_workers)
        return iter([torch.tensor([i]) for i in range(first, self.n, step)])


class SizedParts(WorkerParts):
    def __len__(self):
        return self.n


def _gfm(acc, b):
    return acc.gather_for_metrics(b)


class Understated(WorkerParts):
    """A stream whose len() says fewer samples than it holds (an estimate)."""

    def __len__(self):
        return self.n - 2


REFUSED = {
    # no len(), sharded on every rank, read in a worker process: each worker reads its own
    # copy of the stream and pads its own last round, where deval cannot count it
    "unsized": (Unsized, 3, False, 1, _gfm),
    # the same with a len(): it was counted as one stream, and came back with 11 lost and 0
    # twice (13 samples, 2 ranks, 2 workers)
    "sized": (lambda: SizedParts(13), 2, False, 2, _gfm),
    # rank 0 deals it, and the workers' short batches make a round of 11 samples before the
    # last, dealt 3 to each of 3 ranks: 2 went to no one (35 rows for 37, no error)
    "dispatched": (lambda: WorkerParts(37), 4, True, 2, _gfm),
    # a len() of 5 for 7 samples: the last two were taken for padding and dropped, silently,
    # dealt from rank 0 (where Accelerate alone is right) or sharded on every rank
    "understated-dealt": (lambda: Understated(7), 2, True, 0, _gfm),
    "understated-sharded": (lambda: Understated(7), 2, False, 0, _gfm),
}


def refused_rank(rank, world, port, name, case):
    """The loader iterated as a training loop (no gather_for_metrics: it runs, as without
    deval), then with the body's gather, which refuses; (batches run, the error)."""
    dataset, batch_size, dispatch, workers, body = REFUSED[case]
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True,
                      dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    if workers:  # the suite's ranks are daemonic processes, which may not fork
        import multiprocessing
        multiprocessing.current_process()._config["daemon"] = False
    loader = acc.prepare(DataLoader(dataset(), batch_size=batch_size, num_workers=workers))
    try:
        trained = sum(1 for _ in loader)
        for batch in loader:
            body(acc, batch)
    except deval.InvalidArgument as e:
        return trained, str(e)
    finally:
        deval.accelerate.disable()
    return trained, None


@pytest.mark.parametrize("case,says", [("unsized", "num_workers=1"),
                                       ("sized", "num_workers=2"),
                                       ("dispatched", "2 went to no rank"),
                                       ("understated-dealt", "says 5 samples, but"),
                                       ("understated-sharded", "says 5 samples, but")])
def test_an_iterable_whose_rows_would_be_lost_is_refused(daemon, monkeypatch, case, says):
    """Every rank refuses at the same gather; the same loader trains without a word."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(2 if case == "sized" or case.startswith("under") else 3, refused_rank,
                    free_port(), group_name("workers"), case, timeout=120)
    assert all(t > 0 and r and says in r for t, r in res), res


def told_rank(rank, world, port, name):
    """eval_loop over a sized stream Accelerate shards, read by workers, told num_samples."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    loader = acc.prepare(DataLoader(SizedParts(13), batch_size=2, num_workers=2))
    with deval.join(name, rank, world) as g:
        try:
            g.eval_loop(loader, num_samples=13, order="rank")
        except deval.InvalidArgument as e:
            return str(e)


def test_eval_loop_refuses_a_shard_read_by_workers_whatever_it_is_told(daemon, monkeypatch):
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(2, told_rank, free_port(), group_name("told"), timeout=120)
    assert all(r and "num_workers=2" in r for r in res), res


class ByName(torch.utils.data.Dataset):
    """11 samples read by name ("k07"), not by index: sample k07 is [7]."""

    names = ["k%02d" % i for i in range(11)]

    def __len__(self):
        return len(self.names)

    def __getitem__(self, name):
        return torch.tensor([int(name[1:])])


class Names(torch.utils.data.Sampler):
    """The dataset's names, shuffled alike on every rank."""

    def __iter__(self):
        order = torch.randperm(11, generator=torch.Generator().manual_seed(5)).tolist()
        return iter([ByName.names[i] for i in order])

    def __len__(self):
        return 11


def by_name_rank(rank, world, port, name, workers):
    set_env(rank, world, port)
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    import multiprocessing
    multiprocessing.current_process()._config["daemon"] = False  # (workers of a test rank)
    try:
        loader = acc.prepare(DataLoader(ByName(), batch_size=3, sampler=Names(),
                                        num_workers=workers))
        return torch.cat([acc.gather_for_metrics(b) for b in loader]).flatten().tolist()
    finally:
        deval.accelerate.disable()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_of_names_sharded_by_accelerate(daemon, monkeypatch, workers):
    """A sampler that yields the dataset's own keys (names, not indices), sharded by
    Accelerate: its draws are known, so each sample is its draw and the pass is exact, in the
    sampler's order (it was refused for not yielding indices)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    want = [int(k[1:]) for k in Names()]
    for got in run_ranks(3, by_name_rank, free_port(), group_name("names"), workers,
                         timeout=120):
        assert got == want


def dealt_rank(rank, world, port, name, n, bs):
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    deval.accelerate.enable(acc, group=name)
    import multiprocessing
    multiprocessing.current_process()._config["daemon"] = False
    loader = acc.prepare(DataLoader(WorkerParts(n), batch_size=bs, num_workers=2))
    try:
        return torch.cat([acc.gather_for_metrics(b) for b in loader]).flatten().tolist()
    finally:
        deval.accelerate.disable()


def test_a_dispatched_iterable_whose_workers_fill_every_round_is_exact(daemon, monkeypatch):
    """Workers' short batches that leave each round before the last a multiple of the ranks
    lose nothing: 13 samples, 2 ranks, batches of 2, as one process reads them."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(2, dealt_rank, free_port(), group_name("dealt"), 13, 2, timeout=120)
    for got in res:
        assert sorted(got) == list(range(13)), got


def many_calls_rank(rank, world, port, name, dispatch):
    """20 gathers of tensors and 18 of texts in each batch of a sized iterable Accelerate
    shards on every rank or deals from rank 0 (a pass by position, which counts 16 calls per
    batch), and a metric updated with the rank's own rows: what each call returned, and the
    metric's value."""
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True,
                      dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    deval.torchmetrics.enable()
    total = torchmetrics.SumMetric()
    calls = [[] for _ in range(20)]
    texts = [[] for _ in range(18)]
    try:
        for batch in acc.prepare(DataLoader(Prompts(), batch_size=4)):
            total.update(batch.float())
            for c in range(20):
                calls[c] += acc.gather_for_metrics(batch * 100 + c).tolist()
            for c in range(18):
                texts[c] += acc.gather_for_metrics(["%d.%d" % (v, c) for v in batch.tolist()])
        return calls, texts, float(total.compute())
    finally:
        deval.torchmetrics.enable(False)
        deval.accelerate.disable()


@pytest.mark.parametrize("dispatch", [False, True])
def test_calls_past_those_a_pass_by_position_counts_are_exact(daemon, monkeypatch, dispatch):
    """The 17th call of a batch and later ones say each rank's real rows, which the loop
    knows; they used to raise InvalidArgument ("more than 16 calls"). Dealt from rank 0, the
    metric used to raise Mismatch (2 samples of padding it could not tell)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    for calls, texts, total in run_ranks(3, many_calls_rank, free_port(), group_name("many"),
                                         dispatch, timeout=120):
        assert calls == [[i * 100 + c for i in range(N)] for c in range(20)], calls
        assert texts == [["%d.%d" % (i, c) for i in range(N)] for c in range(18)], texts
        assert total == sum(range(N)), total


def late_gather_rank(rank, world, port, name, dispatch):
    """A sized iterable Accelerate shards or dispatches, 10 samples in batches of 2 over 3
    ranks (rounds of 6, the second padded with 2), whose loop gathers from its second batch
    on (its first a warm-up): what the gathers returned."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True,
                      dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    got = []
    try:
        for i, batch in enumerate(acc.prepare(DataLoader(Prompts(), batch_size=2))):
            if i:
                got += acc.gather_for_metrics(batch).tolist()
        return got
    finally:
        deval.accelerate.disable()


@pytest.mark.parametrize("dispatch", [False, True])
def test_a_first_gather_after_the_first_batch_takes_the_rest(daemon, monkeypatch, dispatch):
    """The batches before the first gather_for_metrics are whole rounds, left out of the
    pass: the rest, exactly, as Accelerate returns it. It used to raise InvalidArgument."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    for got in run_ranks(3, late_gather_rank, free_port(), group_name("late"), dispatch,
                         timeout=120):
        assert got == list(range(6, N)), got


def training_metrics_rank(rank, world, port, name):
    """torchmetrics' own pattern for a training loop: a MeanMetric of the step's loss and an
    Accuracy, updated every step, computed at the epoch's end; 37 samples in batches of 4
    over 3 ranks, so the last batch is mostly Accelerate's padding. (value, what the ranks'
    own steps give, as Accelerate counts them), for the loss and the accuracy."""
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    deval.torchmetrics.enable()
    try:
        torch.manual_seed(0)
        x, y = torch.randn(37, 5), torch.randint(0, 3, (37,))
        model = torch.nn.Linear(5, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt, train = acc.prepare(model, opt, DataLoader(TensorDataset(x, y),
                                                               batch_size=4, shuffle=True))
        loss_m = torchmetrics.MeanMetric()
        acc_m = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        losses, hits = [], []
        for xb, yb in train:
            logits = model(xb)
            loss = torch.nn.functional.cross_entropy(logits, yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            loss_m.update(loss.detach())
            acc_m.update(logits.detach(), yb)
            losses.append(loss.detach())
            hits.append(logits.argmax(1) == yb)
        every_loss = acc.gather(torch.stack(losses))
        every_hit = acc.gather(torch.cat(hits)).float()
        return ((float(loss_m.compute()), float(every_loss.mean())),
                (float(acc_m.compute()), float(every_hit.mean())))
    finally:
        deval.torchmetrics.enable(False)
        deval.accelerate.disable()


def test_metrics_of_a_training_loop_run_as_without_deval(daemon, monkeypatch):
    """A loop that calls accelerator.backward() trains: its metrics take what they are given,
    as Accelerate's loop does; the 0-d loss of a batch holding padding used to make compute()
    raise Mismatch on every rank."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    for (loss, want_loss), (accuracy, want_acc) in run_ranks(
            3, training_metrics_rank, free_port(), group_name("train"), timeout=120):
        assert loss == pytest.approx(want_loss, rel=1e-6) and accuracy == want_acc


def max_steps_rank(rank, world, port, name, keyed):
    """Evaluation stopped at max_steps with even_batches=False: ranks 0 and 1 break at step 2,
    where rank 2's shard (2 batches of 4 of 29 samples) runs out."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    deval.accelerate.enable(acc, group=name)
    data = torch.arange(29) if keyed else Counted(29)
    loader = acc.prepare(DataLoader(data, batch_size=4))
    got = []
    try:
        for step, x in enumerate(loader):
            if step == 2:
                break
            got += acc.gather_for_metrics(x).reshape(-1).tolist()
    finally:
        deval.accelerate.disable()
    return got


class Counted(torch.utils.data.IterableDataset):
    """n samples in order, with a len(): Accelerate shards it by batches."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n).unbind(0))

    def __len__(self):
        return self.n


@pytest.mark.parametrize("keyed", [True, False])
def test_a_break_at_max_steps_where_a_shard_ends_is_no_error(daemon, monkeypatch, keyed):
    """A rank whose loader ran out where the others broke on purpose gets what they get: the
    pass is checked nowhere, as when every rank breaks. It used to raise "returned 24 of 29"
    on that rank alone, while the others went on (plain Accelerate: 24 rows on two ranks,
    17 on the third)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, max_steps_rank, free_port(), group_name("maxsteps"), keyed, timeout=120)
    assert res == [list(range(24))] * 3


def some_batches_rank(rank, world, port, name, keyed, when, enable, even=True):
    """A loop that also gathers the batch's inputs for a logger in some batches only: on the
    first (before its predictions), on every other one (after them), on the second, or on
    the last (before them); every gather through one helper, as loops write it. 29 samples,
    3 ranks of 4 a batch, map-style or a sized iterable Accelerate shards."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=even))
    if enable:
        deval.accelerate.enable(acc, group=name)
    data = torch.arange(29) if keyed else Counted(29)
    loader = acc.prepare(DataLoader(data, batch_size=4))

    def gather(t):
        return acc.gather_for_metrics(t)

    got, logged = [], []
    try:
        for step, x in enumerate(loader):
            if when == "first" and step == 0 or \
                    when == "last" and acc.gradient_state.end_of_dataloader:
                logged.append(gather(x * 10).tolist())
            got += gather(x).reshape(-1).tolist()
            if when == "every other" and step % 2 == 0 or when == "second" and step == 1:
                logged.append(gather(x * 10).tolist())
    finally:
        if enable:
            deval.accelerate.disable()
    return got, logged


@pytest.mark.parametrize("when", ["first", "every other", "second", "last"])
@pytest.mark.parametrize("keyed", [True, False])
def test_a_gather_made_in_some_batches_only(daemon, monkeypatch, keyed, when):
    """Every sample once from the call made in every batch, and what plain Accelerate's
    optional call returns. Calls were told apart by their order in the batch, so the optional
    one shifted the others into its stream, and the close refused the loop on every rank
    ("call 1 of each batch returned 12 distinct samples of the pass's 29"); then, told apart
    by the line that calls the helper alone, a call of the last batch only kept the sampler's
    padding (36 predictions for 29, no error)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    want = run_ranks(3, some_batches_rank, free_port(), group_name("plain"), keyed, when,
                     False, timeout=120)
    assert want[0][0] == list(range(29))
    res = run_ranks(3, some_batches_rank, free_port(), group_name("some"), keyed, when, True,
                    timeout=120)
    assert res == want


def test_a_gather_in_some_batches_with_uneven_shards(daemon, monkeypatch):
    """even_batches=False, a gather on every other batch: rank 2, one batch short, replays
    the others' last one, where that gather is made; it counted the replayed batch as none
    and raised alone after the loop that the every-batch call lacked samples. (Plain
    Accelerate cannot run this loop: its ranks' last gathers differ in size.)"""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, some_batches_rank, free_port(), group_name("uneven"), True,
                    "every other", True, False, timeout=120)
    # 8 batches of 4 (the last of 1) dealt in turn: steps 0 and 2 hold batches 0-2, 6-7
    want = (list(range(29)), [list(range(0, 120, 10)), [240, 250, 260, 270, 280]])
    assert res == [want] * 3


# Loops whose body gathers k rows per sample, as generate(num_return_sequences=k) returns
# them, over an iterable Accelerate shards: (dataset, dispatch_batches, rows per sample).
GENERATED = {
    "sized": (Prompts, None, 2),  # a pass of deval's own, counted by the batch's samples
    "dispatched": (Unsized, True, 2),  # Accelerate's remainder cut, k rows per sample
    "sharded": (Unsized, False, 3),
    # batches that are lists of fields, [ids, labels]: a dataset of tuples, collated by
    # torch's default collate, or a map-style one dealt by rank 0
    "fields": (lambda: Fields(), None, 2),
    "dispatched map": (lambda: torch.utils.data.TensorDataset(torch.arange(N),
                                                              torch.arange(N) % 3), True, 2),
}


def repeated_rank(rank, world, port, name):
    """A stream Accelerate dispatches, 10 samples in rounds of 9: the last batch holds one
    sample on each rank, and each sample's 2 rows (its label for each of 2 generated
    sequences) are one value there."""
    set_env(rank, world, port)
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    got = []
    try:
        for x in acc.prepare(DataLoader(Unsized(), batch_size=3)):
            got += acc.gather_for_metrics(x[:, 0].repeat_interleave(2)).tolist()
    finally:
        deval.accelerate.disable()
    return got


def test_k_equal_rows_of_a_last_sample_are_k_rows(daemon, monkeypatch):
    """Rows all one value were taken for a number repeated (the Trainer's loss) and cut to
    the remainder: sample 9 came back once for twice, no error."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, repeated_rank, free_port(), group_name("eqrows"), timeout=120)
    assert res == [[i for i in range(N) for _ in range(2)]] * 3


class Fields(torch.utils.data.IterableDataset):
    """A streamed evaluation set of (id, label) samples that knows its length."""

    def __len__(self):
        return N

    def __iter__(self):
        return iter([(torch.tensor(i), torch.tensor(i % 3)) for i in range(N)])


def generated_rank(rank, world, port, name, case):
    """Each batch's rows k per sample, and its decoded texts k per sample, gathered."""
    dataset, dispatch, k = GENERATED[case]
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True,
                      dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    loader = acc.prepare(DataLoader(dataset(), batch_size=4 if case == "sized" else 3))
    rows, texts = [], []
    try:
        for batch in loader:
            ids = (batch[0] if isinstance(batch, list) else batch).reshape(-1)
            seqs = torch.stack([ids + 100 * j for j in range(k)], dim=1).reshape(-1, 1)
            rows += acc.gather_for_metrics(seqs)[:, 0].tolist()
            texts += acc.gather_for_metrics(["t%d" % v for v in seqs[:, 0].tolist()])
    finally:
        deval.accelerate.disable()
    return rows, texts


@pytest.mark.parametrize("case", sorted(GENERATED))
def test_k_rows_per_sample_of_an_iterable_shard_are_exact(daemon, monkeypatch, case):
    """The rows one process gathers, k per sample in order, on every rank. They used to be
    refused; before that, the last round was cut to the remainder by rows (half the last
    samples lost, or padding kept) without a word, as plain Accelerate still cuts it. Batches
    that are lists of fields had their rows counted as samples: refused when sharded, and
    dispatched from a map-style dataset half the samples were lost without a word."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    k = GENERATED[case][2]
    want = [i + 100 * j for i in range(N) for j in range(k)]
    for rows, texts in run_ranks(3, generated_rank, free_port(), group_name("genrows"), case,
                                 timeout=120):
        assert rows == want and texts == ["t%d" % v for v in want], (rows, texts)


@pytest.mark.parametrize("case,world,shuffle", [
    ("steps", 2, False), ("steps", 3, True), ("steps", 4, False),
    # (not shuffled: Accelerate syncs a shuffled loader's generator across ranks with
    # torch.distributed at each iteration, so its own peek on one rank would hang)
    ("peek", 3, False), ("twice", 3, True), ("custom", 3, False),
    # rank 0 reading every batch for the others (no indices on them); an iterable with no
    # len() dispatched that way keeps Accelerate's own remainder
    ("dispatch", 2, False), ("unsized-dispatched", 3, False),
    # an iterable with no len() that every rank reads and shards (dispatch_batches=False),
    # whole batches or split: counted as it is read. It used to raise InvalidArgument
    # ("no one can tell"), and plain Accelerate keeps the last round's padding
    ("unsized-sharded", 2, False), ("unsized-sharded", 3, False), ("unsized-split", 3, False)])
def test_loops_of_the_example_scripts(daemon, monkeypatch, case, world, shuffle):
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, loops_rank, free_port(), group_name("accloops"), case, shuffle,
                    timeout=120)
    for rank, outs in enumerate(res):
        assert len(outs) == (2 if case in ("steps", "twice") else 1), outs
        for got in outs:
            assert sorted(got) == list(range(N)), "rank %d: %s" % (rank, got)
            if not shuffle:
                assert got == list(range(N)), "rank %d: %s" % (rank, got)
        assert outs == res[0], "ranks disagree"
    assert os.environ.get("DEVAL_SOCKET") == daemon.socket


class Echo(torch.nn.Module):
    """A model whose logits are its input's id, with a loss to train on."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, labels=None):
        logits = torch.stack([x.float(), x.float() * self.w], 1)
        loss = ((logits[:, 1] - x.float()) ** 2).mean() + 0 * self.w.sum()
        return {"loss": loss, "logits": logits}


class Ids(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor(i), "labels": torch.tensor(i % 3)}


def trainer_rank(rank, world, port, name, tmp):
    """A transformers Trainer evaluating every 2 steps of training (eval_strategy="steps")."""
    set_env(rank, world, port)
    from transformers import Trainer, TrainingArguments
    seen = []

    def metrics(p):
        seen.append((p.predictions[:, 0].astype(int).tolist(), p.label_ids.tolist()))
        return {"n": float(len(p.predictions))}

    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4,
                             per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2,
                             max_steps=4, report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    tr = Trainer(model=Echo(), args=args, train_dataset=Ids(64), eval_dataset=Ids(N),
                 compute_metrics=metrics)
    deval.accelerate.enable(tr, group=name)
    try:
        tr.train()
    finally:
        deval.accelerate.disable()
    return seen


def test_trainer_evaluating_every_k_steps(daemon, monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, trainer_rank, free_port(), group_name("trainer"), str(tmp_path),
                    timeout=240)
    for seen in res:
        assert len(seen) == 2, seen  # steps 2 and 4
        for ids, labels in seen:
            assert ids == list(range(N)) and labels == [i % 3 for i in range(N)], (ids, labels)


class IdStream(torch.utils.data.IterableDataset):
    """Ids's samples as a stream with no len(), as transformers' own distributed Trainer tests
    stream theirs."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return (Ids(self.n)[i] for i in range(self.n))


def trainer_stream_rank(rank, world, port, name, tmp, dispatch, enable=True):
    """A Trainer over streams with no len(): train() on one (its loader gathers nothing),
    evaluating every 2 steps on another, then evaluate() and predict(); what compute_metrics
    saw and what predict() returned, each (predictions, labels)."""
    set_env(rank, world, port)
    from transformers import Trainer, TrainingArguments
    seen = []

    def metrics(p):
        seen.append((p.predictions.tolist(), p.label_ids.tolist()))
        return {"n": float(len(p.predictions))}

    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=2,
                             per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2,
                             max_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True,
                             accelerator_config={"dispatch_batches": dispatch})
    tr = Trainer(model=Echo(), args=args, train_dataset=IdStream(40),
                 eval_dataset=IdStream(N), compute_metrics=metrics)
    if enable:
        deval.accelerate.enable(tr, group=name)
    try:
        tr.train()
        tr.evaluate()
        p = tr.predict(IdStream(N))
        seen.append((p.predictions.tolist(), p.label_ids.tolist()))
    finally:
        deval.accelerate.disable()
    return seen


@pytest.mark.parametrize("world,dispatch", [(3, None), (2, False)])
def test_trainer_over_streams_with_no_length(daemon, monkeypatch, tmp_path, world, dispatch):
    """Dispatched from rank 0 (Accelerate's default for an IterableDataset) or sharded on
    every rank (dispatch_batches=False), evaluate() and predict() give what one process gives.
    Sharded, it used to raise InvalidArgument ("no one can tell") as soon as train() iterated
    its training loader."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    (tmp_path / "one").mkdir()
    [want] = run_ranks(1, trainer_stream_rank, free_port(), None, str(tmp_path / "one"),
                       dispatch, False, timeout=240)
    assert len(want) == 4 and len(want[0][0]) == N, want  # (predict() computes metrics too)
    res = run_ranks(world, trainer_stream_rank, free_port(), group_name("trainer-stream"),
                    str(tmp_path), dispatch, timeout=240)
    for seen in res:
        assert seen == want, (seen, want)


def solo_rank(rank, world):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    got = []
    for _ in range(2):  # a second enable() in the process gets a group of its own too
        acc = Accelerator(cpu=True)
        g = deval.accelerate.enable(acc)
        try:
            loader = acc.prepare(DataLoader(torch.arange(10), batch_size=3))
            got.append((g.world_size, torch.cat([acc.gather_for_metrics(b)
                                                 for b in loader]).tolist()))
        finally:
            deval.accelerate.disable()
    return got


def test_enable_in_a_process_on_its_own(daemon, monkeypatch):
    """python script.py, with no launcher to name the job: the one-line switch still runs.
    It used to raise InvalidArgument ("nothing says which job this process belongs to")."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    for k in list(os.environ):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DEVAL_LAUNCH_ID") or \
                k.startswith(("OMPI_COMM_WORLD_", "SLURM_")):
            monkeypatch.delenv(k)
    assert run_ranks(1, solo_rank) == [[(1, list(range(10)))] * 2]


class Stream(torch.utils.data.IterableDataset):
    """An iterable with no len() of n samples: x = 1..n, y alternating."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.tensor(float(i + 1)), torch.tensor(i % 2)


def metrics_rank(rank, world, port, name, n, dispatch):
    """torchmetrics updated on each rank over an iterable with no len(), dispatched from rank
    0 (the dispatcher's remainder tells its padding) or sharded on every rank (deval counts
    the stream each rank reads): each sample once."""
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    deval.torchmetrics.enable()
    try:
        mean, count = torchmetrics.MeanMetric(), torchmetrics.SumMetric()
        accuracy = torchmetrics.classification.BinaryAccuracy()
        try:
            for x, y in acc.prepare(DataLoader(Stream(n), batch_size=2)):
                mean.update(x)
                count.update(torch.ones_like(x))
                accuracy.update(torch.ones_like(y), y)
            return (count.compute().item(), mean.compute().item(), accuracy.compute().item())
        except (deval.Mismatch, deval.InvalidArgument) as e:
            return str(e)
    finally:
        deval.torchmetrics.enable(False)
        deval.accelerate.disable()


def one_process_metrics(n):
    """What metrics_rank's metrics compute in one process reading Stream(n) whole."""
    import torchmetrics
    mean, count = torchmetrics.MeanMetric(), torchmetrics.SumMetric()
    accuracy = torchmetrics.classification.BinaryAccuracy()
    for x, y in torch.utils.data.DataLoader(Stream(n), batch_size=2):
        mean.update(x)
        count.update(torch.ones_like(x))
        accuracy.update(torch.ones_like(y), y)
    return (count.compute().item(), mean.compute().item(), accuracy.compute().item())


# (the sharded cases used to raise InvalidArgument: "no one can tell" the padding)
@pytest.mark.parametrize("n,world,dispatch", [(7, 2, True), (7, 3, True), (8, 3, True),
                                              (3, 4, True), (7, 2, False), (7, 3, False),
                                              (2, 3, False)])
def test_metrics_over_an_unsized_iterable_are_exact(daemon, monkeypatch, n, world, dispatch):
    pytest.importorskip("torchmetrics")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, metrics_rank, free_port(), group_name("unsized-tm"), n, dispatch,
                    timeout=120)
    want = one_process_metrics(n)
    for r in res:
        assert not isinstance(r, str), r
        assert r[0] == want[0] and abs(r[1] - want[1]) < 1e-6 and abs(r[2] - want[2]) < 1e-6, \
            (r, want)


class Sized(torch.utils.data.IterableDataset):
    """An iterable dataset of n samples that says its len()."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(torch.arange(self.n)[:, None].unbind(0))

    def __len__(self):
        return self.n


def skipped_stream_rank(rank, world, port, name, n, dispatch):
    """skip_first_batches(loader, 2) over a sized iterable, dispatched from rank 0 or sharded
    on every rank: two rounds of batches are read and dealt to no one."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True,
                      dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    deval.accelerate.enable(acc, group=name)
    loader = acc.prepare(DataLoader(Sized(n), batch_size=3))
    got = []
    try:
        for x in acc.skip_first_batches(loader, 2):
            got += acc.gather_for_metrics(x[:, 0]).tolist()
    finally:
        deval.accelerate.disable()
    return got


@pytest.mark.parametrize("n,dispatch", [(30, True), (29, True), (29, False)])
def test_skipped_batches_of_a_sized_iterable(daemon, monkeypatch, n, dispatch):
    """The samples after the skipped rounds, once each, on every rank. Dispatched, the
    close raised "returned 12 of its 30 samples" after the loop; sharded, it kept the last
    round's padding (as plain Accelerate does) and then raised."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, skipped_stream_rank, free_port(), group_name("skipstream"), n,
                    dispatch, timeout=120)
    assert res == [list(range(18, n))] * 3


class Stream13(torch.utils.data.IterableDataset):
    """13 samples with no len()."""

    def __iter__(self):
        return iter(torch.arange(13).unbind(0))


class Map13(torch.utils.data.Dataset):
    def __len__(self):
        return 13

    def __getitem__(self, i):
        return torch.tensor(i)


def loader_metrics_rank(rank, world, port, name, kind, dispatch, split, bs, drop, skip):
    """A prepared loader of 13 samples, perhaps skip_first_batches: what gather_for_metrics
    returns, and what attached SumMetric and CatMetric updated with each rank's own rows
    hold."""
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics as dtm
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=dispatch, split_batches=split))
    deval.accelerate.enable(acc, group=name)
    if kind == "buckets":  # a batch sampler of its own (no batch_size), uneven batches
        loader = acc.prepare(DataLoader(Map13(), batch_sampler=Batches(
            [[0, 1], [2], [3, 4, 5], [6, 7], [8], [9, 10, 11], [12]])))
    else:
        ds = {"map": Map13, "stream": Stream13, "sized": lambda: Sized(13)}[kind]()
        loader = acc.prepare(DataLoader(ds, batch_size=bs, drop_last=drop))
    if skip:
        loader = acc.skip_first_batches(loader, skip)
    total = dtm.attach(torchmetrics.SumMetric())
    seen = dtm.attach(torchmetrics.CatMetric())
    got = []
    try:
        for y in loader:
            y = y.reshape(-1)
            got += acc.gather_for_metrics(y).tolist()
            total.update(y.float())
            seen.update(y)
        return got, float(total.compute()), sorted(seen.compute().reshape(-1).tolist())
    finally:
        deval.accelerate.disable()


@pytest.mark.parametrize("kind,dispatch,split,bs,drop,skip,first", [
    ("stream", False, False, 2, True, 0, 0),  # metrics held 0..5: the last round lost
    ("stream", False, False, 2, True, 1, 6),  # metrics held nothing
    ("sized", False, False, 2, False, 1, 6),  # metrics took the wrap-around padding 0..4
    ("map", True, False, 2, True, 0, 0),  # refused: "a batch sampler with no batch_size"
    ("map", True, False, 2, False, 2, 4),  # refused at the close: "9 of its 13"
    ("map", True, True, 3, False, 1, 3),  # refused at the close: "returned 12 of its 13"
    # (skips one batch of its batch sampler, [0, 1]: SkipBatchSampler) refused: "a batch
    ("buckets", True, False, None, False, 1, 2),  # sampler with no batch_size"
])
def test_metrics_of_prepared_loaders_match_their_gathers(daemon, monkeypatch, kind, dispatch,
                                                         split, bs, drop, skip, first):
    """The samples past those skip_first_batches skips, less those drop_last drops, in
    gather_for_metrics and in attached metrics alike, on every rank."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(3, loader_metrics_rank, free_port(), group_name("loadmet"), kind,
                    dispatch, split, bs, drop, skip, timeout=120)
    last = 12 if drop else 13
    want = list(range(first, last))
    assert res == [(want, float(sum(want)), [float(v) for v in want])] * 3


def skipped_metrics_rank(rank, world, port, name):
    """A metric fed by a loader Accelerate resumes with skip_first_batches: it counts the
    samples after the skipped rounds once, the padding that repeats a skipped sample not at
    all. Before: compute() raised, deval could not tell the padding."""
    set_env(rank, world, port)
    import torchmetrics
    import deval.torchmetrics
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    deval.torchmetrics.enable()
    try:
        count = torchmetrics.SumMetric()
        loader = acc.prepare(DataLoader(TensorDataset(torch.arange(N)), batch_size=3))
        for (x,) in acc.skip_first_batches(loader, 1):
            count.update(torch.ones_like(x))
        return count.compute().item()
    finally:
        deval.torchmetrics.enable(False)
        deval.accelerate.disable()


@pytest.mark.parametrize("world", [2, 3])
def test_metrics_over_skipped_batches_count_each_sample_once(daemon, monkeypatch, world):
    pytest.importorskip("torchmetrics")
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, skipped_metrics_rank, free_port(), group_name("skipped-tm"),
                    timeout=120)
    assert res == [N - world * 3] * world, res


def peer_errors_rank(rank, world, port, name):
    """Accelerate's test_op_checker loop under enable(), in debug mode: shapes that differ
    across ranks raise Accelerate's DistributedOperationException (as deval.Mismatch too, and
    it pickles); a peer that dies mid-collective raises torch.distributed's DistBackendError
    (as deval.PeerLost too). Before: deval's classes only, which code catching Accelerate's
    missed."""
    set_env(rank, world, port)
    import pickle
    from accelerate import Accelerator
    from accelerate.utils.operations import DistributedOperationException
    acc = Accelerator(cpu=True)
    deval.accelerate.enable(acc, group=name)
    acc.state.debug = True
    out = []
    one = torch.tensor([[0.0, 1, 2, 3, 4]])
    data = one if rank == 0 else torch.tensor([[[0.0, 1, 2, 3, 4, 5]]])
    for op in (lambda: acc.pad_across_processes({"tensor": data}, dim=0),
               lambda: acc.reduce({"tensor": data})):
        try:
            op()
            out.append(None)
        except DistributedOperationException as e:
            twin = pickle.loads(pickle.dumps(e))
            out.append((isinstance(e, deval.Mismatch), type(twin).__name__,
                        isinstance(twin, DistributedOperationException), str(twin) == str(e)))
    acc.state.debug = False
    if rank == 1:
        os._exit(0)  # (gone before the reduce rank 0 makes)
    try:
        acc.reduce(one)
        out.append(None)
    except torch.distributed.DistBackendError as e:
        out.append(isinstance(e, deval.PeerLost))
    deval.accelerate.disable()
    return out


def test_errors_are_accelerates_classes_too(daemon, monkeypatch):
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(2, peer_errors_rank, free_port(), group_name("peer-errors"),
                    timeout=120, allow_death=(1,))
    assert res[0] == [(True, "Mismatch", True, True)] * 2 + [True], res


def after_loop_rank(rank, world, port, name, case):
    """A loop that keeps each batch's outputs and gathers them once, after the loop, beside
    the same gathers made in the loop: 13 samples in batches of 2 (3 ranks: padding in the
    last round; with even_batches=False, a rank's replayed batch)."""
    set_env(rank, world, port)
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        even_batches=case != "uneven"))
    deval.accelerate.enable(acc, group=name)
    try:
        ds = TensorDataset(torch.arange(13))
        if case == "dist":  # a plain loader over torch's sampler, not prepared
            loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(
                ds, world, rank, shuffle=True, seed=3))
        else:
            loader = acc.prepare(DataLoader(ds, batch_size=2, shuffle=case == "shuffled"))
        ids, pairs, inside = [], [], []
        for (x,) in loader:
            ids.append(x)
            pairs.append(x.repeat_interleave(2) * 10)  # two rows per sample
            inside.append(acc.gather_for_metrics(x))
        out = acc.gather_for_metrics({"ids": torch.cat(ids), "pairs": torch.cat(pairs)})
        # metrics updated after the loop with this rank's own outputs, concatenated
        import torchmetrics
        import deval.torchmetrics as dtm
        total, seen = dtm.attach(torchmetrics.SumMetric()), dtm.attach(torchmetrics.CatMetric())
        total.update(torch.cat(pairs).float())
        seen.update(torch.cat(ids))
        return (torch.cat(inside).tolist(), out["ids"].tolist(), out["pairs"].tolist(),
                float(total.compute()), sorted(seen.compute().tolist()))
    finally:
        deval.accelerate.disable()


@pytest.mark.parametrize("case,world", [("plain", 3), ("shuffled", 3), ("uneven", 3),
                                        ("dist", 2), ("shuffled", 2)])
def test_a_gather_after_the_loop_of_its_batches_is_one_process_s(daemon, monkeypatch, case,
                                                                 world):
    """Before, the rows came back as Accelerate's own gather returns them, the padding's too:
    18 rows for 13 samples at 3 ranks, rank by rank; and metrics updated after the loop
    counted the padding (SumMetric 880 for 780, 18 values in a CatMetric)."""
    monkeypatch.setenv("DEVAL_SOCKET", daemon.socket)
    res = run_ranks(world, after_loop_rank, free_port(), group_name("after"), case,
                    timeout=120)
    inside = res[0][0]
    assert sorted(inside) == list(range(13)), inside
    for got_inside, ids, pairs, total, seen in res:
        # one process's order, as the gathers inside the loop return it
        assert got_inside == inside and ids == inside, (got_inside, ids)
        assert pairs == [10 * i for i in inside for _ in range(2)], pairs
        assert total == 20.0 * sum(range(13)) and seen == list(range(13)), (total, seen)
