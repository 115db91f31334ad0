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
- every torchmetrics metric syncs through deval (deval.torchmetrics.enable()), each sample
  once;
- trainer.predict returns every prediction, in the one-process order, on every rank.

A rank whose share of the batches is one short runs one step more, on a padding batch (its
last batch's first sample), so that every rank runs as many steps and no collective of a
step waits for a rank that finished: in that step (and its batch-end hooks) deval.real_rows()
is all False, the values logged count nowhere at epoch level (on_step ones still sync),
metrics take nothing, its prediction is not returned and self.all_gather leaves its rows
out.

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
    once, or twice where a batch of one sample occurs, so that a padding batch has another
    size than the batches beside it. own is how many of its batches are real; steps, how many
    the last loop ran (Lightning's limit_*_batches may stop it early, alike on every rank);
    sizes, the size of each one-process batch of the last iteration.

    Each iteration draws every batch first and checks, through agree, that every rank drew
    the same: a sampler that draws apart on each rank would deal some samples twice and
    others never. Where they differ and fallback (a sampler of the same batches drawn from a
    seed the ranks share) is given, the ranks draw from it instead; else agree raises."""

    def __init__(self, batches, rank, world, agree, fallback=None):
        self.batches, self.rank, self.world = batches, rank, world
        self.agree, self.fallback = agree, fallback
        self.total = len(batches)
        self.own = len(range(rank, self.total, world))
        self.sizes, self.pad, self.steps = None, 1, 0

    def __len__(self):
        return -(-self.total // self.world)

    def __iter__(self):
        self.steps = 0
        drawn = [list(b) for b in self.batches]
        if not self.agree(drawn, self.fallback is not None):
            drawn = [list(b) for b in self.fallback]
            self.agree(drawn, False)
        self.sizes = [len(b) for b in drawn]
        self.pad = 2 if 1 in self.sizes else 1
        mine = drawn[self.rank::self.world]
        pad = (mine or drawn)[-1 if mine else 0][:1] * self.pad if drawn else []
        for b in mine + [pad] * (len(self) - len(mine)):
            self.steps += 1
            yield b

    def number(self, k):
        """The one-process number of this rank's k-th batch; None for a padding batch."""
        return self.rank + k * self.world if k < self.own else None

    def size(self, rank, k):
        """(the size of rank's k-th batch of the last iteration, whether it is padding)."""
        i = rank + k * self.world
        return (self.sizes[i], False) if i < len(self.sizes) else (self.pad, True)


class _State:
    """What deval keeps for one enabled Trainer (outside it, so that it pickles)."""

    def __init__(self):
        self.group = None
        self.view = None  # the _pass.Opaque of the evaluation loop running (attached metrics)
        self.padding = False  # the step running is a padding batch's
        self.dealt = []  # the _Dealt of each loader of the last evaluation loop (all_gather)
        self.step = None  # (its _Dealt, the batch's index) while an evaluation step runs
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
    """The deval group of trainer's ranks, joined once (_ranks_group); its name, drawn on
    rank 0, gives the seed the ranks share."""
    st = _STATES[trainer]
    if st.group is None:
        st.group, name = _ranks_group("lightning", trainer.strategy.broadcast,
                                      trainer.global_rank, trainer.world_size)
        st.seed = int(name.rsplit("-", 1)[1], 16)
    return st.group


def _ranks_group(kind, broadcast, rank, world):
    """(group, name): the deval group of a Lightning job's ranks, named by rank 0 and sent to
    the others through the framework's own broadcast (a Trainer's strategy's, Fabric's),
    joined with the framework's rank and world size (across machines, through the job's
    process group, where the launcher says it spans them); every attached torchmetrics metric
    syncs through it."""
    name = "%s-%d-%s" % (kind, os.getpid(), os.urandom(6).hex())
    if world > 1:
        name = broadcast(name, src=0)
    if world > 1 and _spans_machines() is not None:
        g = join(name)
    else:
        g = join(name, rank, world)
    from . import torchmetrics
    torchmetrics.use(g)
    return g, name


def _seed(trainer):
    """A seed every rank of trainer shares: Lightning's global one where seed_everything set
    it, else one rank 0 drew when the group was joined."""
    said = os.environ.get("PL_GLOBAL_SEED")
    return int(said) if said and said.lstrip("-").isdigit() else _STATES[trainer].seed


def _agree(trainer, drawn, soft):
    """Did every rank's evaluation loader draw the same batches? If not: False where soft,
    else Mismatch on every rank."""
    import hashlib
    digest = hashlib.sha1(repr(drawn).encode()).hexdigest()
    said = _group_for(trainer).gather_object([digest])
    apart = [r for r, d in enumerate(said) if d != said[0]]
    if apart and soft:
        return False
    if apart:
        from . import Mismatch
        raise Mismatch(
            "deval.lightning: the evaluation loader's sampler drew other batches on rank%s %s "
            "than on rank 0: dealing them would evaluate some samples twice and others never. "
            "Give it a generator seeded alike on every rank (or seed_everything before the "
            "loaders are made)" % ("s" if len(apart) > 1 else "",
                                   ", ".join(map(str, apart))), -2)
    return True


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
    resolve = data._dataloader_init_kwargs_resolve_sampler
    batches = dataloader.batch_sampler
    predicting = mode.name == "PREDICTING"
    if predicting:
        # one device's batches: Lightning's, which predicts every sample (drop_last=False
        # given to a batch sampler that takes it, its own class kept)
        batches = resolve(dataloader, dataloader.sampler, mode)["batch_sampler"]
        batches = getattr(batches, "_batch_sampler", batches)
    try:
        len(batches)
    except TypeError:
        return own(self, dataloader, shuffle, mode)
    dealt = _Dealt(batches, trainer.global_rank, trainer.world_size,
                   lambda drawn, soft: _agree(trainer, drawn, soft), _shared(trainer, batches))
    bs = dealt
    if predicting:  # as Lightning does: its index wrapper records each batch's indices
        overrides = sys.modules[pl.__name__ + ".overrides.distributed"]
        bs = overrides._IndexBatchSamplerWrapper(dealt)

    def dealt_kwargs(*args):
        return {"sampler": None, "shuffle": False, "batch_size": 1, "drop_last": False,
                "batch_sampler": bs}

    # Lightning's own remaking of the user's DataLoader (its class and arguments), with this
    # batch sampler where Lightning would resolve its own
    data._dataloader_init_kwargs_resolve_sampler = dealt_kwargs
    try:
        args, kwargs = data._get_dataloader_init_args_and_kwargs(dataloader, dataloader.sampler,
                                                                 mode)
    finally:
        data._dataloader_init_kwargs_resolve_sampler = resolve
    return data._reinstantiate_wrapped_cls(dataloader, *args, **kwargs)


def _shared(trainer, batches):
    """For a torch BatchSampler over a RandomSampler with no generator of its own (a shuffled
    loader): the same batches drawn from a seed the ranks share, for when the ranks' own
    draws differ (no seed_everything); None for any other batch sampler."""
    import torch.utils.data as tud
    if type(batches) is not tud.BatchSampler or type(batches.sampler) is not tud.RandomSampler \
            or batches.sampler.generator is not None:
        return None
    import torch
    rs = batches.sampler
    shared = tud.RandomSampler(rs.data_source, rs.replacement, rs._num_samples,
                               generator=torch.Generator().manual_seed(_seed(trainer)))
    return tud.BatchSampler(shared, batches.batch_size, batches.drop_last)


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
    mine = []
    for i, preds in enumerate(self._predictions):
        dealt = st.dealt[i] if i < len(st.dealt) else None  # (the loop's, from _start)
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
    """Lightning's ParallelStrategy.all_gather (self.all_gather in a module) for an enabled
    Trainer: Lightning's own ([world, ...], each rank's tensor) where every rank's has one
    shape and no rank's holds a padding batch's rows. Where every rank's tensor holds k rows
    per sample of the batches it evaluated (_plan: in a step, the step's batch; after an
    evaluation loop, the loop's), a padding batch's rows at their place or left out:
    [1, k * samples, ...], the real samples' rows in one device's order. Other shapes that
    differ: Mismatch on every rank, which all see the same shapes."""
    own = _ORIG[("strategy", "all_gather")]
    module = getattr(self, "lightning_module", None)
    trainer = getattr(module, "_trainer", None)
    st = _state(trainer) if trainer is not None else None
    import torch
    if st is None or group not in (None, torch.distributed.group.WORLD):
        return own(self, tensor, group, sync_grads)
    g = _group_for(trainer)
    shapes = [tuple(s) for s in g.gather_object([tuple(tensor.shape)])]
    same = all(s == shapes[0] for s in shapes)
    plan = _plan(st, shapes)
    if isinstance(plan, str):
        if same:
            return own(self, tensor, group, sync_grads)
        from . import Mismatch
        raise Mismatch("deval.lightning: all_gather of tensors of shapes %s on ranks 0..%d: "
                       "Lightning stacks tensors of one shape, and these are not the rows of "
                       "the samples each rank evaluated (%s)"
                       % (", ".join(map(str, shapes)), len(shapes) - 1, plan), -2)
    k, blocks = plan
    if same and not any(b[1] for rank in blocks for b in rank):
        return own(self, tensor, group, sync_grads)  # (no padding rows: Lightning's stack)
    rows = g.gather(tensor.detach().contiguous())
    found = []
    for part, rank in zip(torch.split(rows, [s[0] for s in shapes]), blocks):
        for (size, pad, key), piece in zip(rank, torch.split(part, [k * b[0] for b in rank])):
            if not pad:
                found.append((key, piece))
    found.sort(key=lambda kp: kp[0])
    return torch.cat([piece for _, piece in found]).unsqueeze(0).to(tensor.device)


def _plan(st, shapes):
    """(k, blocks) where every rank's tensor of shapes holds k rows per sample of the batches
    it evaluated, blocks[r] being (size, padding, key) for each of rank r's batches in step
    order, less the padding ones where its rows leave them out, key saying where the batch
    goes in one device's order (its loader, its one-device number): in a step, the step's
    batch; after a loop, the loop's batches, those of every loader in turn (rows collected
    from every step) or of one loader (each loader's own), where one of these readings fits
    (or several that order the rows alike). Else why not, in words."""
    if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
        return "they differ beyond their rows"
    world = len(shapes)

    def batches(d, loader, r, steps):
        out = []
        for j in steps:
            size, pad = d.size(r, j)
            out.append((size, pad, None if pad else (loader, r + j * world)))
        return out

    dealt = [(i, d) for i, d in enumerate(st.dealt) if d is not None and d.sizes is not None]
    if st.step is not None:
        d, j = st.step
        layouts = [[batches(d, 0, r, [j]) for r in range(world)]] if d.sizes is not None \
            else []
    else:
        layouts = [[batches(d, i, r, range(d.steps)) for r in range(world)] for i, d in dealt]
        if len(dealt) > 1:  # every loader's batches, in turn
            layouts.insert(0, [[b for i, d in dealt for b in batches(d, i, r, range(d.steps))]
                               for r in range(world)])
    rows = [s[0] for s in shapes]
    fits, said = [], []
    for layout in layouts:
        said.append(", ".join("%d+%d" % (sum(b[0] for b in bs if not b[1]),
                                         sum(b[0] for b in bs if b[1])) for bs in layout))
        fit = _fit(layout, rows)
        if fit is not None:
            fits.append(fit)
    # loaders alike (as many batches of the same sizes) fit alike: any of them orders the rows.
    # Readings that differ (k rows per sample of every loader's steps, or k' of one loader's)
    # are told apart by nothing in the shapes: refused, never guessed
    alike = {(k, tuple(tuple((b[0], b[1], b[2] and b[2][1]) for b in bs) for bs in blocks))
             for k, blocks in fits}
    if len(alike) == 1:
        return fits[0]
    if not layouts:
        return "no loader whose batches deval dealt"
    every = "every loader's steps, then " if len(layouts) > len(dealt) else ""
    return "samples+padding per rank, for %seach loader: " % every + "; ".join(said) + \
        (": more than one reading fits, each in another order (rows of one sample each, "
         "[samples, ...], fit fewer)" if fits else "")


def _fit(layout, rows):
    """(k, blocks) where each rank's rows are k per sample of its batches in layout (its
    padding batches' included, or all left out); None where no k fits every rank."""
    ks = set()
    for bs, n in zip(layout, rows):
        for total in (sum(b[0] for b in bs), sum(b[0] for b in bs if not b[1])):
            if total and n % total == 0 and n:
                ks.add(n // total)
    for k in sorted(ks):
        blocks = []
        for bs, n in zip(layout, rows):
            if n == k * sum(b[0] for b in bs):
                blocks.append(bs)
            elif n == k * sum(b[0] for b in bs if not b[1]):
                blocks.append([b for b in bs if not b[1]])
            else:
                break
        else:
            return k, blocks
    return None


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
    # Lightning's own logging states are torchmetrics metrics that this module adapts; they
    # stay out of deval.torchmetrics.enable() (their on_step sync must meet the others')
    res._ResultMetric._deval_never = True


def _callback_base():
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:  # (the older package name)
        from pytorch_lightning.callbacks import Callback
    return Callback


def _sequential(trainer, stage, dealt):
    """InvalidArgument, alike on every rank, for a loop over several loaders at once (a
    CombinedLoader in max_size, max_size_cycle or min_size mode) whose batches deval dealt:
    each loader's padding step falls at its own step, and a step that holds one loader's
    padding beside another's samples cannot count nowhere for the one and somewhere for the
    other (a logged value, a metric's update)."""
    if not any(d is not None for d in dealt) or len(dealt) < 2:
        return
    loop = trainer.predict_loop if stage == "predicting" else trainer._evaluation_loop
    mode = getattr(getattr(loop, "_combined_loader", None), "_mode", "sequential")
    if mode != "sequential":
        raise InvalidArgument(
            "deval.lightning: this evaluation loop reads %d loaders at once (a CombinedLoader "
            "in %r mode): deval deals each loader's batches to the ranks, and a rank short of "
            "one loader's batches runs a padding step where the others' batches are real, "
            "which no logged value or metric can take apart. Evaluate them in 'sequential' "
            "mode (a list or dict of loaders), or one at a time" % (len(dealt), mode), -1)


def _make_exact():
    Callback = _callback_base()

    class Exact(Callback):
        """The callback deval.lightning.enable() adds: Trainer(callbacks=[Exact()]) does the
        same. It holds nothing but what Lightning gives it, so it pickles."""

        def setup(self, trainer, pl_module, stage):
            _STATES.setdefault(trainer, _State())
            _install(trainer)
            # first of the callbacks: its hooks say which step is padding (and until when)
            # before any other callback's of the same hook logs from it
            cbs = trainer.callbacks
            if cbs and cbs[0] is not self and self in cbs:
                cbs.remove(self)
                cbs.insert(0, self)
            if trainer.world_size > 1:
                _group_for(trainer)
                from . import torchmetrics
                # every metric of the process: those of the module, in plain dicts too
                torchmetrics.enable()

        def _start(self, trainer, pl_module, stage):
            st = _state(trainer)
            if st is None:
                return
            st.dealt = [_dealt(dl) for dl in _loaders(trainer, stage)]
            _sequential(trainer, stage, st.dealt)
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
            st.view, st.padding, st.step = None, False, None
            _CURRENT[0] = None

        def _epoch_end(self, trainer):
            """The loop's steps are over: the epoch's hooks log, gather and update metrics
            with its samples as any code outside a loop does (real_rows() is None)."""
            st = _STATES.get(trainer)
            if st is not None:
                st.padding, st.step = False, None
                if st.view is not None and st.view in _loop.ACTIVE:
                    _loop.ACTIVE.remove(st.view)

        def _batch(self, trainer, batch, batch_idx, dataloader_idx):
            st = _state(trainer)
            if st is None or st.view is None:
                return
            dealt = st.dealt[dataloader_idx] if dataloader_idx < len(st.dealt) else None
            # (the step's hooks, to its batch-end ones, log from a padding step until the
            # next batch starts or the epoch ends)
            st.padding = dealt is not None and dealt.number(batch_idx) is None
            st.step = (dealt, batch_idx) if dealt is not None else None
            _CURRENT[0] = trainer
            view = st.view
            view.batch(batch)
            view.samples = _loop.batch_samples(batch)
            size = max(view.samples or 1, 1)
            view.real = np.full(size, not st.padding)


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
            self._batch(trainer, batch, batch_idx, dataloader_idx)

        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self._batch(trainer, batch, batch_idx, dataloader_idx)

        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx,
                                   dataloader_idx=0):
            self._batch(trainer, batch, batch_idx, dataloader_idx)

        def on_validation_epoch_end(self, trainer, pl_module):
            self._epoch_end(trainer)

        def on_test_epoch_end(self, trainer, pl_module):
            self._epoch_end(trainer)

        def on_predict_epoch_end(self, trainer, pl_module):
            self._epoch_end(trainer)

    Exact.__module__ = __name__
    Exact.__qualname__ = "Exact"
    return Exact


def __getattr__(name):
    """deval.lightning.Exact, made when first asked for (it subclasses Lightning's Callback,
    which import deval.lightning does not import)."""
    if name == "Exact":  # (enable() asks here too: made once)
        cls = globals().get("Exact")
        if cls is None:
            cls = globals()["Exact"] = _make_exact()
        return cls
    raise AttributeError("module 'deval.lightning' has no attribute %r" % name)


def _fabric_group(fabric):
    """The deval group of a launched Fabric's ranks (_ranks_group); every torchmetrics metric
    syncs through it and takes only the real samples of the loops deval runs."""
    g, _ = _ranks_group("lightning-fabric", fabric.broadcast, fabric.global_rank,
                        fabric.world_size)
    from . import torchmetrics
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
        trainer.callbacks.insert(0, Exact())
    _STATES.setdefault(trainer, _State())
    _install(trainer)
    return trainer
