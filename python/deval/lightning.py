# SPDX-License-Identifier: MIT
"""One line to make a Lightning Trainer's evaluation count each sample once::

    trainer = Trainer(accelerator="gpu", devices=4, strategy="ddp")
    deval.lightning.enable(trainer)      # or Trainer(callbacks=[deval.lightning.Exact()])

From then on every validate, test and predict run of that Trainer, and the validation inside
fit, deals the one-process batches of each evaluation loader to the ranks in turn (batch i to
rank i mod W) instead of giving each rank a DistributedSampler's shard padded with repeated
samples. So a step sees a batch one process would see, and no sample twice:

- self.log(..., sync_dist=True) at epoch level is the one-process value: Lightning weights
  each batch by its size, and every batch is one process's;
- torchmetrics metrics on the module sync through deval (deval.torchmetrics.attach), each
  sample once;
- trainer.predict returns every prediction, in the one-process order, on every rank.

A rank whose share of the batches is one short runs one step more, on a padding batch (its
last batch's first sample), so that every rank runs as many steps and no collective of a
step waits for a rank that finished: in that step deval.real_rows() is all False, the values
it logs count nowhere at epoch level (on_step ones still sync), attached metrics take
nothing, and its prediction is not returned.

Nothing is stored on the Trainer; the callback holds no group and pickles, so ddp_spawn and
checkpoints work as before.
"""

import os
import sys
import weakref

import numpy as np

from . import InvalidArgument, _loop, _pass, _spans_machines, join

__all__ = ["enable"]  # and Exact, made when first asked for (see __getattr__)

_STATES = weakref.WeakKeyDictionary()  # an enabled Trainer -> its _State
_ORIG = {}  # (class, name) -> Lightning's own function, while patched
_EVAL = ("VALIDATING", "SANITY_CHECKING", "TESTING", "PREDICTING")  # RunningStage's names


def _pl(obj):
    """Lightning's package obj comes from: lightning.pytorch or pytorch_lightning."""
    top = type(obj).__module__.split(".")[0]
    name = "pytorch_lightning" if top == "pytorch_lightning" else "lightning.pytorch"
    import importlib
    return importlib.import_module(name), name


class _Dealt:
    """A batch sampler: the batches one process's loader yields (batches, a sized batch
    sampler), batch i to rank i mod world, then as many padding batches as this rank is short
    of the others' count (at most one): its last batch's first sample, or the first batch's,
    once, or twice where one sample is a whole batch of the others (the last one, or every
    one): so the ranks that ran a padding step hold as many rows per sample as no other
    rank, and all_gather tells their rows from a value of each rank's (_rows_plan). own is
    how many of its batches are real; steps, how many the last loop ran (Lightning's
    limit_*_batches may stop it early, alike on every rank). Each iteration first checks,
    through agree, that every rank drew the same batches: a sampler that draws apart on
    each rank would deal some samples twice and others never."""

    def __init__(self, batches, rank, world, agree):
        self.batches, self.rank, self.world, self.agree = batches, rank, world, agree
        self.total = len(batches)
        self.own = len(range(rank, self.total, world))
        self.sizes = _sizes(batches)
        self.pad = 2 if self.sizes and (self.sizes[-1] == 1 or self.sizes[0] == 1) else 1
        self.steps = 0

    def samples(self, rank):
        """(real samples, padding samples) of rank's steps in the last loop; None where the
        one-process batches' sizes are not known."""
        if self.sizes is None:
            return None
        own = len(range(rank, self.total, self.world))
        real = self.sizes[rank::self.world][:self.steps]
        return sum(real), max(0, self.steps - own) * self.pad

    def __len__(self):
        return -(-self.total // self.world)

    def __iter__(self):
        self.steps = 0
        drawn = [list(b) for b in self.batches]
        self.agree(drawn)
        mine = drawn[self.rank::self.world]
        pad = (mine or drawn)[-1 if mine else 0][:1] * self.pad if drawn else []
        for b in mine + [pad] * (len(self) - len(mine)):
            self.steps += 1
            yield b

    def number(self, k):
        """The one-process number of this rank's k-th batch; None for a padding batch."""
        return self.rank + k * self.world if k < self.own else None


def _sizes(batches):
    """The size of each batch a torch BatchSampler yields, from its settings (a shuffled
    sampler is not drawn for it); None for another batch sampler."""
    import torch.utils.data as tud
    if type(batches) is not tud.BatchSampler:
        return None
    n, b = len(batches.sampler), batches.batch_size
    return [b] * (n // b) + ([n % b] if n % b and not batches.drop_last else [])


class _State:
    """What deval keeps for one enabled Trainer (outside it, so that it pickles)."""

    def __init__(self):
        self.group = None
        self.view = None  # the _pass.Opaque of the evaluation loop running (attached metrics)
        self.padding = False  # the step running is a padding batch's
        self.dealt = []  # the _Dealt of each loader of the last evaluation loop (all_gather)
        self.seed = 0  # shared by the ranks (_seed)


def _state(trainer):
    st = _STATES.get(trainer)
    return st if st is not None and trainer.world_size > 1 else None


def _dealt(loader):
    """The _Dealt of a loader deval.lightning made, or None."""
    bs = getattr(loader, "batch_sampler", None)
    bs = getattr(bs, "_batch_sampler", bs)  # (under Lightning's predict index wrapper)
    return bs if isinstance(bs, _Dealt) else None


def _loaders(trainer, stage):
    """The evaluation loaders of the stage running, in Lightning's order."""
    name = {"predicting": "predict_dataloaders", "testing": "test_dataloaders"}.get(
        stage, "val_dataloaders")
    dls = getattr(trainer, name, None)
    if dls is None:
        return []
    if isinstance(dls, dict):
        return list(dls.values())
    return list(dls) if isinstance(dls, (list, tuple)) else [dls]


def _group_for(trainer):
    """The deval group of trainer's ranks, joined once: its name agreed through Lightning's
    own broadcast, its rank and world size Lightning's."""
    st = _STATES[trainer]
    if st.group is not None:
        return st.group
    name = "lightning-%d-%s" % (os.getpid(), os.urandom(6).hex())
    if trainer.world_size > 1:
        name = trainer.strategy.broadcast(name, src=0)
    st.seed = int(name.rsplit("-", 1)[1], 16)  # (drawn on rank 0: the same on every rank)
    if trainer.world_size > 1 and _spans_machines() is not None:
        st.group = join(name)  # across machines, through the job's process group
    else:
        st.group = join(name, trainer.global_rank, trainer.world_size)
    from . import torchmetrics
    torchmetrics.use(st.group)
    return st.group


def _seed(trainer):
    """A seed every rank of trainer shares: Lightning's global one where seed_everything set
    it, else one rank 0 drew when the group was joined."""
    said = os.environ.get("PL_GLOBAL_SEED")
    return int(said) if said and said.lstrip("-").isdigit() else _STATES[trainer].seed


def _agree(trainer, drawn):
    """Mismatch on every rank unless every rank's evaluation loader drew the same batches."""
    import hashlib
    digest = hashlib.sha1(repr(drawn).encode()).hexdigest()
    said = _group_for(trainer).gather_object([digest])
    apart = [r for r, d in enumerate(said) if d != said[0]]
    if apart:
        from . import Mismatch
        raise Mismatch(
            "deval.lightning: the evaluation loader's sampler drew other batches on rank%s %s "
            "than on rank 0: dealing them would evaluate some samples twice and others never. "
            "Give it a generator seeded alike on every rank (or seed_everything before the "
            "loaders are made)" % ("s" if len(apart) > 1 else "",
                                   ", ".join(map(str, apart))), -2)


def _prepare_dataloader(self, dataloader, shuffle, mode):
    """Lightning's DataConnector._prepare_dataloader: for an evaluation loader of an enabled
    Trainer on several ranks, the one-process batches dealt to the ranks (_Dealt) instead of a
    DistributedSampler's padded shard; anything else Lightning's own."""
    own = _ORIG[("data", "_prepare_dataloader")]
    trainer = self.trainer
    st = _state(trainer)
    import torch.utils.data as tud
    if st is None or getattr(mode, "name", None) not in _EVAL or \
            not isinstance(dataloader, tud.DataLoader) or \
            not self._requires_distributed_sampler(dataloader) or \
            dataloader.batch_sampler is None:
        return own(self, dataloader, shuffle, mode)
    pl, _ = _pl(trainer)
    data = sys.modules[pl.__name__ + ".utilities.data"]
    batches = dataloader.batch_sampler
    predicting = mode.name == "PREDICTING"
    if predicting and isinstance(batches, tud.BatchSampler) and batches.drop_last:
        # Lightning predicts every sample, whatever drop_last says
        batches = tud.BatchSampler(batches.sampler, batches.batch_size, False)
    try:
        len(batches)
    except TypeError:
        return own(self, dataloader, shuffle, mode)
    if type(batches) is tud.BatchSampler and type(batches.sampler) is tud.RandomSampler and \
            batches.sampler.generator is None:
        # a shuffled loader: one permutation for every rank, drawn from a seed they share
        # (a generator of each rank's own would deal each rank another permutation)
        import torch
        rs = batches.sampler
        shared = tud.RandomSampler(rs.data_source, rs.replacement, rs._num_samples,
                                   generator=torch.Generator().manual_seed(_seed(trainer)))
        batches = tud.BatchSampler(shared, batches.batch_size, batches.drop_last)
    dealt = _Dealt(batches, trainer.global_rank, trainer.world_size,
                   lambda drawn: _agree(trainer, drawn))
    args, kwargs = data._get_dataloader_init_args_and_kwargs(dataloader, dataloader.sampler)
    kwargs.update(sampler=None, shuffle=False, batch_size=1, drop_last=False,
                  batch_sampler=dealt)
    if predicting:  # as Lightning does: its index wrapper records each batch's indices
        overrides = sys.modules[pl.__name__ + ".overrides.distributed"]
        kwargs["batch_sampler"] = overrides._IndexBatchSamplerWrapper(dealt)
    return data._reinstantiate_wrapped_cls(dataloader, *args, **kwargs)


def _result_update(self, value, batch_size):
    """Lightning's _ResultMetric.update, for a value an enabled Trainer's evaluation step
    logs: in a padding step, a value logged on_step still syncs with the other ranks' (their
    step makes the same collective), but adds nothing to its epoch-level value."""
    own = _ORIG[("result", "update")]
    trainer = _CURRENT[0]
    st = _STATES.get(trainer) if trainer is not None else None
    if st is None or not st.padding or not self.is_tensor:
        return own(self, value, batch_size)
    kept = {k: getattr(self, k) for k in ("value", "cumulated_batch_size") if hasattr(self, k)}
    own(self, value, batch_size)
    if self.meta.on_epoch:
        for k, v in kept.items():
            setattr(self, k, v)


def _result_compute(self):
    """Lightning's _ResultMetric.compute, for an epoch mean of an enabled Trainer: the sum of
    every rank's weighted values over the sum of their samples, as one device divides them.
    (Lightning syncs both as means over the ranks: an integer division of the count, exact
    only where every rank counts as many samples, as a padded shard does and dealt batches
    do not, and a rounding of each.)"""
    own = _ORIG[("result", "compute")]
    sync = self.meta.sync
    if not self.is_tensor or not self.meta.is_mean_reduction or not sync.should or \
            not any(st.group is not None for st in _STATES.values()):
        return own(self)
    op = sync.op
    sync.op = "sum"
    try:
        return own(self)
    finally:
        sync.op = op


_CURRENT = [None]  # the Trainer whose evaluation step runs (a weak reference's target)


def _predictions_end(self):
    """Lightning's _PredictionLoop.on_run_end: what it returns, with every rank's
    predictions in the one-process order instead of this rank's."""
    out = _ORIG[("predict", "on_run_end")](self)
    trainer = self.trainer
    st = _state(trainer)
    if st is None or out is None or not self.return_predictions:
        return out
    g = _group_for(trainer)
    loaders = _loaders(trainer, "predicting")
    mine = []
    for i, preds in enumerate(self._predictions):
        dealt = _dealt(loaders[i]) if i < len(loaders) else None
        if dealt is None:
            mine.append(None)
            continue
        mine.append([(dealt.number(k), p) for k, p in enumerate(preds)
                     if dealt.number(k) is not None])
    said = g.gather_object([mine])
    for i in range(len(self._predictions)):
        if any(rank[i] is None for rank in said):
            continue
        found = sorted((n_p for rank in said for n_p in rank[i]), key=lambda n_p: n_p[0])
        self._predictions[i] = [p for _, p in found]
    return self.predictions


def _all_gather(self, tensor, group=None, sync_grads=False):
    """Lightning's ParallelStrategy.all_gather (self.all_gather in a module): Lightning's own
    where every rank's tensor has one shape ([world, ...], each rank's). Where the shapes
    differ, as the rows a rank's steps collected do when the ranks evaluated different
    numbers of samples, and every rank's tensor holds k rows per sample of its steps in the
    last evaluation loop: [1, k * samples, ...], the real samples' rows in the one-process
    order (a padding step's rows, its last, left out). Anything else: Mismatch on every
    rank, which all see the same shapes."""
    own = _ORIG[("strategy", "all_gather")]
    module = getattr(self, "lightning_module", None)
    trainer = getattr(module, "_trainer", None)
    st = _state(trainer) if trainer is not None else None
    import torch
    if st is None or group not in (None, torch.distributed.group.WORLD):
        return own(self, tensor, group, sync_grads)
    g = _group_for(trainer)
    shapes = [tuple(s) for s in g.gather_object([tuple(tensor.shape)])]
    if all(s == shapes[0] for s in shapes):
        return own(self, tensor, group, sync_grads)
    plan = _rows_plan(st, shapes)
    if isinstance(plan, str):
        from . import Mismatch
        raise Mismatch("deval.lightning: all_gather of tensors of shapes %s on ranks 0..%d: "
                       "Lightning stacks tensors of one shape, and these are not the rows of "
                       "the samples each rank evaluated in the last evaluation loop (%s)"
                       % (", ".join(map(str, shapes)), len(shapes) - 1, plan), -2)
    rows = g.gather(tensor.detach().contiguous())
    parts = torch.split(rows, [s[0] for s in shapes])
    k, d = plan
    out, at = [], [0] * d.world
    for i, size in enumerate(d.sizes[:d.steps * d.world]):
        r = i % d.world
        out.append(parts[r][at[r]:at[r] + k * size])
        at[r] += k * size
    return torch.cat(out).unsqueeze(0).to(tensor.device)


def _rows_plan(st, shapes):
    """(k, the loop's _Dealt) where every rank's tensor of shapes holds k rows per sample of
    its steps (padding's too) in the last evaluation loop; else why not."""
    if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
        return "they differ beyond their rows"
    fits, said = [], []
    for d in st.dealt:
        if d is None or d.sizes is None:
            continue
        counts = [sum(d.samples(r)) for r in range(len(shapes))]
        said.append(", ".join("%d+%d" % d.samples(r) if d.samples(r)[1] else
                              "%d" % d.samples(r)[0] for r in range(len(shapes))))
        ks = {s[0] // c if c and s[0] % c == 0 else 0 for s, c in zip(shapes, counts)}
        if len(ks) == 1 and 0 not in ks:
            fits.append((ks.pop(), d))
    if len(fits) == 1:
        return fits[0]
    if not said:
        return "no loader whose batches deval dealt"
    return "samples per rank, for each loader: " + "; ".join(said) + \
        (": more than one loader fits" if fits else "")


def _install(trainer):
    if _ORIG:
        return
    pl, _ = _pl(trainer)
    import importlib
    dc = importlib.import_module(pl.__name__ + ".trainer.connectors.data_connector")
    res = importlib.import_module(pl.__name__ + ".trainer.connectors.logger_connector.result")
    pred = importlib.import_module(pl.__name__ + ".loops.prediction_loop")
    par = importlib.import_module(pl.__name__ + ".strategies.parallel")
    for key, cls, name, fn in (
            (("data", "_prepare_dataloader"), dc._DataConnector, "_prepare_dataloader",
             _prepare_dataloader),
            (("result", "update"), res._ResultMetric, "update", _result_update),
            (("result", "compute"), res._ResultMetric, "compute", _result_compute),
            (("predict", "on_run_end"), pred._PredictionLoop, "on_run_end", _predictions_end),
            (("strategy", "all_gather"), par.ParallelStrategy, "all_gather", _all_gather)):
        _ORIG[key] = cls.__dict__[name]
        _ORIG[key + ("class",)] = cls
        fn.__wrapped__ = _ORIG[key]
        setattr(cls, name, fn)


def _callback_base():
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:  # (the older package name)
        from pytorch_lightning.callbacks import Callback
    return Callback


def _make_exact():
    Callback = _callback_base()

    class Exact(Callback):
        """The callback deval.lightning.enable() adds: Trainer(callbacks=[Exact()]) does the
        same. It holds nothing but what Lightning gives it, so it pickles."""

        def setup(self, trainer, pl_module, stage):
            _STATES.setdefault(trainer, _State())
            _install(trainer)
            if trainer.world_size > 1:
                _group_for(trainer)

        def _start(self, trainer, pl_module, stage):
            st = _state(trainer)
            if st is None:
                return
            from . import torchmetrics
            try:
                torchmetrics.attach(pl_module)  # (the metrics made since the last run too)
            except InvalidArgument:
                pass  # a module with no metric
            st.dealt = [_dealt(dl) for dl in _loaders(trainer, stage)]
            st.view = _pass.Opaque()
            _loop.LOOPS[0] += 1
            st.view.seq = _loop.LOOPS[0]
            _loop.ACTIVE.append(st.view)

        def _end(self, trainer, pl_module):
            st = _STATES.get(trainer)
            if st is None or st.view is None:
                return
            if st.view in _loop.ACTIVE:
                _loop.ACTIVE.remove(st.view)
            st.view, st.padding = None, False
            _CURRENT[0] = None

        def _batch(self, trainer, batch, batch_idx, dataloader_idx, stage):
            st = _state(trainer)
            if st is None or st.view is None:
                return
            loaders = _loaders(trainer, stage)
            dealt = _dealt(loaders[dataloader_idx]) if dataloader_idx < len(loaders) else None
            st.padding = dealt is not None and dealt.number(batch_idx) is None
            _CURRENT[0] = trainer
            view = st.view
            view.batch(batch)
            view.samples = _loop.batch_samples(batch)
            size = max(view.samples or 1, 1)
            view.real = np.full(size, not st.padding)

        def _batch_end(self, trainer):
            st = _STATES.get(trainer)
            if st is not None:
                st.padding = False

        def on_validation_start(self, trainer, pl_module):
            self._start(trainer, pl_module, "validating")

        def on_test_start(self, trainer, pl_module):
            self._start(trainer, pl_module, "testing")

        def on_predict_start(self, trainer, pl_module):
            self._start(trainer, pl_module, "predicting")

        def on_validation_end(self, trainer, pl_module):
            self._end(trainer, pl_module)

        def on_test_end(self, trainer, pl_module):
            self._end(trainer, pl_module)

        def on_predict_end(self, trainer, pl_module):
            self._end(trainer, pl_module)

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx,
                                      dataloader_idx=0):
            self._batch(trainer, batch, batch_idx, dataloader_idx, "validating")

        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self._batch(trainer, batch, batch_idx, dataloader_idx, "testing")

        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx,
                                   dataloader_idx=0):
            self._batch(trainer, batch, batch_idx, dataloader_idx, "predicting")

        def on_validation_batch_end(self, trainer, *args, **kwargs):
            self._batch_end(trainer)

        def on_test_batch_end(self, trainer, *args, **kwargs):
            self._batch_end(trainer)

        def on_predict_batch_end(self, trainer, *args, **kwargs):
            self._batch_end(trainer)

    Exact.__module__ = __name__
    Exact.__qualname__ = "Exact"
    return Exact


def __getattr__(name):
    """deval.lightning.Exact, made when first asked for (it subclasses Lightning's Callback,
    which import deval.lightning does not import)."""
    if name == "Exact":
        cls = globals()["Exact"] = _make_exact()
        return cls
    raise AttributeError("module 'deval.lightning' has no attribute %r" % name)


def _fabric_group(fabric):
    """The deval group of a launched Fabric's ranks: named by rank 0, through Fabric's own
    broadcast; every torchmetrics metric syncs through it and takes only the real samples of
    the loops deval runs."""
    name = "lightning-fabric-%d-%s" % (os.getpid(), os.urandom(6).hex())
    if fabric.world_size > 1:
        name = fabric.broadcast(name, src=0)
    if fabric.world_size > 1 and _spans_machines() is not None:
        g = join(name)
    else:
        g = join(name, fabric.global_rank, fabric.world_size)
    from . import torchmetrics
    torchmetrics.use(g)
    torchmetrics.enable()  # every metric of the process: Fabric's users make their own
    return g


def enable(trainer):
    """Make trainer's evaluation exact (see the module's doc); returns trainer. Enabling it
    again does nothing. The group is joined when the Trainer sets up (after its launcher
    started the ranks).

    Given a launched Fabric instead, returns the deval group of its ranks, and attaches every
    torchmetrics metric (deval.torchmetrics.enable()): iterate an evaluation loader from
    setup_dataloaders with g.eval_loop(loader), gather with g.gather_for_metrics, each sample
    once, and metrics updated in the loop count each sample once."""
    if hasattr(trainer, "setup_dataloaders") and hasattr(trainer, "launch") and \
            hasattr(trainer, "broadcast"):
        return _fabric_group(trainer)
    if not hasattr(trainer, "callbacks") or not hasattr(trainer, "strategy"):
        raise InvalidArgument("deval.lightning.enable: %s is not a Lightning Trainer nor a "
                              "Fabric" % type(trainer).__name__, -1)
    Exact = __getattr__("Exact")
    if not any(isinstance(c, Exact) for c in trainer.callbacks):
        trainer.callbacks.append(Exact())
    _STATES.setdefault(trainer, _State())
    _install(trainer)
    return trainer
