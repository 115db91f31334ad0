# SPDX-License-Identifier: MIT
"""torchmetrics over deval: a metric's states are gathered through a deval group instead of
torch.distributed, and a metric updated on each rank counts each sample once::

    deval.torchmetrics.attach(metric_or_collection)   # these metrics, wrappers' inner ones too
    deval.torchmetrics.enable()                        # or every metric, made now or later

An attached metric:

- syncs through deval on every path torchmetrics has (compute(), sync(), sync_context(),
  forward with dist_sync_on_step, compute_on_cpu, MetricCollection's compute groups, every
  wrapper), with or without a torch.distributed process group;
- takes only the real samples of each batch of a loop deval runs (eval_loop, or a loader
  deval.accelerate hooked): a sharding's padding and a replayed batch never reach its state
  (deval.real_rows() says which they are). Every tensor or list passed to update() with one
  row (or k rows) per sample of the batch is cut to the real samples' rows;
- raises Mismatch from compute() where it may hold a duplicate: an update() that carried
  padding in a value with no row per sample (a batch's mean loss), or a loop whose padding
  deval cannot tell that gave the metric more samples over the ranks than its loader holds;
  and from a sync inside a loop whose loader ran out first on another rank (see _where());
- pickles, torch.save()s, deep-copies and loads in another process still attached.

sync(tensor) returns every rank's tensor, in rank order, whatever its shape on each rank. It
uses the group given to use(), else the one deval.accelerate.enable() joined, else
deval.join()'s from the launcher.
"""

import collections
import functools

import numpy as np

from . import InvalidArgument, Mismatch, _loop, _nest, _pass

__all__ = ["sync", "attach", "enable", "use"]

_GROUP = None
_ALL = [False]  # enable(): every metric is attached
_DEPTH = [0]  # updates running: a wrapper's inner metric takes what the wrapper was given


def use(group):
    """Make sync() gather through group (a deval.Group); None forgets it."""
    global _GROUP
    _GROUP = group


def _group():
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    from . import accelerate
    if accelerate._ACTIVE is not None:
        return accelerate._ACTIVE.group
    # as deval.join() does: the group of the job the launcher started
    from . import join
    try:
        _GROUP = join()
    except InvalidArgument as e:
        raise InvalidArgument("deval.torchmetrics: no deval group, and none to join from the "
                              "launcher (%s); call deval.torchmetrics.use(g) or "
                              "deval.accelerate.enable(accelerator) first" % e, -1) from None
    return _GROUP


def sync(result, group=None):
    """A torchmetrics dist_sync_fn: [rank 0's result, rank 1's, ...]. group is torchmetrics'
    process group argument and is ignored: the deval group is all ranks."""
    import torch
    g = _group()
    kinds = g.gather_object([(tuple(result.shape), str(result.dtype))])
    shapes = [s for s, _ in kinds]
    # a rank with no data holds torchmetrics' empty placeholder, of the default dtype: it
    # takes the dtype of the ranks that have data
    have = [d for s, d in kinds if int(np.prod(s, dtype=np.int64))]
    if result.numel() == 0 and have and str(result.dtype) != have[0]:
        result = result.to(getattr(torch, have[0].replace("torch.", "")))
    flat = g.gather(result.detach().reshape(-1))
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    parts = torch.split(flat, sizes)
    return [p.reshape(s).to(result.device) for p, s in zip(parts, shapes)]


def _metrics(x):
    """Every torchmetrics Metric in x: a metric with the ones it wraps, a MetricCollection,
    any mapping or list of them."""
    import torch
    import torchmetrics
    if isinstance(x, torch.nn.Module):
        found = [m for m in x.modules() if isinstance(m, torchmetrics.Metric)]
        if found:
            return found
    elif hasattr(x, "values"):
        return [m for v in x.values() for m in _metrics(v)]
    elif isinstance(x, (list, tuple)):
        return [m for v in x for m in _metrics(v)]
    raise InvalidArgument("deval.torchmetrics.attach: %s is not a torchmetrics Metric"
                          % type(x).__name__, -1)


def attach(metric):
    """Attach metric (see the module's doc), every metric it wraps, or every metric of a
    MetricCollection (or any mapping or list of metrics). Returns metric."""
    _install()
    for m in _metrics(metric):
        m.dist_sync_fn = sync
        m.distributed_available_fn = _distributed  # (module functions: they pickle)
        m._deval = True
        _hook(m)
    return metric


def enable(on=True):
    """Attach every torchmetrics metric of this process, those made before and after, for code
    that makes its metrics deep inside a model; enable(False) stops it for the metrics not
    attached by attach()."""
    _install()
    _ALL[0] = bool(on)
    if on:  # the metrics made before: their update takes the real samples too
        import gc
        import torchmetrics
        for o in gc.get_objects():
            if isinstance(o, torchmetrics.Metric):
                _hook(o)


def _distributed():
    """An attached metric runs distributed, with or without torch.distributed."""
    return True


def _on(m):
    """Is m attached: by attach(), or by enable() unless its class keeps out of it (a
    framework's own states that it adapts itself: Lightning's logged values)?"""
    return m.__dict__.get("_deval", False) or (_ALL[0] and
                                               not getattr(type(m), "_deval_never", False))


# ---- what torchmetrics' Metric does, adapted ---------------------------------------------

_ORIG = {}


def _install():
    """Adapt torchmetrics' Metric, once: its update takes the real samples, its sync goes
    through deval, its reset forgets what deval saw. Only attached metrics (or all, after
    enable()) see a difference."""
    if _ORIG:
        return
    import torchmetrics
    M = torchmetrics.Metric
    _ORIG.update(init=M.__init__, setstate=M.__setstate__, sync=M.sync, reset=M.reset,
                 sync_dist=M._sync_dist, forward=M.forward)

    @functools.wraps(_ORIG["init"])
    def __init__(self, *args, **kwargs):
        _ORIG["init"](self, *args, **kwargs)
        _hook(self)

    @functools.wraps(_ORIG["setstate"])
    def __setstate__(self, state):
        _ORIG["setstate"](self, state)
        _hook(self)

    M.__init__, M.__setstate__, M.sync, M.reset = __init__, __setstate__, _sync, _reset
    M.forward = _forward
    M._sync_dist = _sync_dist
    for cls in _tuple_gatherers():
        cls._sync_dist = _whole_lists(cls._sync_dist)


def _tuple_gatherers():
    """The metrics whose own _sync_dist calls torch.distributed after Metric's: torchmetrics'
    MeanAveragePrecision (and its older twin), whose segm masks, lists of tuples, it gathers
    with all_gather_object."""
    import importlib
    found = []
    for name in ("torchmetrics.detection.mean_ap", "torchmetrics.detection._mean_ap"):
        try:
            found.append(importlib.import_module(name).MeanAveragePrecision)
        except (ImportError, AttributeError):
            pass
    return found


def _whole_lists(own):
    """A _sync_dist that is own for a metric not attached, and Metric's (_sync_dist) for an
    attached one: that gathers every list state whole through deval, the masks' too, so the
    torch.distributed gather own adds would fail with no process group, and with one gather
    the masks again."""
    @functools.wraps(own)
    def sync_dist(self, dist_sync_fn=None, process_group=None):
        if _on(self):
            return _sync_dist(self, dist_sync_fn, process_group)
        return own(self, dist_sync_fn, process_group)
    return sync_dist


def _hook(m):
    """Put _Update in front of m's update, once."""
    u = m.__dict__.get("update")
    if u is not None and not isinstance(u, _Update):
        m.update = _Update(m, u)


class _Update:
    """An attached metric's update: the real samples of the current batch of the loop deval
    runs. (It lives in the metric's update attribute, which torchmetrics leaves out of a
    pickle and makes again on load: so an attached metric pickles, and stays attached.)"""

    def __init__(self, metric, update):
        self.m, self.f = metric, update
        functools.update_wrapper(self, update)

    def __call__(self, *args, **kwargs):
        m = self.m
        # (a metric that does not sync is fed every rank's rows, gathered, or is a rank's own)
        lp = _loop.ACTIVE[-1] if _loop.ACTIVE and not _DEPTH[0] and _on(m) and \
            m.sync_on_compute else None
        if getattr(lp, "trains", False):
            lp = None  # (a training loop's: taken as it comes, as without deval)
        gathered = lp.holds_gathered(args, kwargs) if lp is not None else 0
        if not gathered and lp is not None and lp.batches > 1 and \
                (lp.seq, lp.batches - 1) in m.__dict__.get("_deval_gathered", ()) and \
                _pass.as_gathered(lp.gathered, args, kwargs):
            # (the last round's results, as short as this rank's batch: yg.float() is a copy)
            gathered = _pass.WHOLE
        if gathered:
            # every rank's rows: once, if this is the only rank taking them, or the same on
            # every rank and nothing else (checked at sync)
            for x in _within(m):
                x.__dict__.setdefault("_deval_gathered", set()).add((lp.seq, lp.batches))
        if gathered != _pass.WHOLE and not _DEPTH[0] and _on(m) and m.sync_on_compute:
            for x in _within(m):  # (rows of a rank's own, a part of the gathered ones, or
                x.__dict__["_deval_own"] = True  # outside a loop)
        if lp is not None and not gathered:
            real = lp.real
            if getattr(lp, "resumed", 0):
                _taint(m, (
                    "%s.update() at batch %d of loop #%d took this rank's own rows in a pass "
                    "that resumed where a run that stopped left it: the rows of its first %d "
                    "batches were in that run's metric, which is gone. Update the metric with "
                    "gather_for_metrics results on one rank (they hold every batch), or run "
                    "with DEVAL_RESUME=0" % (type(m).__name__, lp.batches, lp.seq, lp.resumed)))
            if getattr(lp, "lost", None):
                _taint(m, "%s.update() at batch %d of loop #%d: %s" % (
                    type(m).__name__, lp.batches, lp.seq, lp.lost))
            elif real is None:
                _count(m, lp, args, kwargs)
            elif real.all():
                _note_rows(m, lp, args, kwargs)
            else:
                if not real.any():
                    for x in _within(m):  # (what torchmetrics' update does first)
                        x._computed = None
                    return None  # all padding (a replayed batch): nothing to take
                try:
                    args, kwargs = _cut(args, kwargs, real, _rows_of(m, lp), lp.current)
                except _Uncut as e:
                    _taint(m, (
                        "%s.update() at batch %d of loop #%d got %s, for a batch of %d samples, "
                        "%d of them padding: deval cannot tell which of its rows are the "
                        "padding's. Pass update() values with one row per sample of the batch "
                        "(deval drops the padding's), or gathered results"
                        % (type(m).__name__, lp.batches, lp.seq, e, len(real),
                           len(real) - int(real.sum()))))
        elif lp is None and not _loop.ACTIVE and _loop.TAPE[0] is not None and \
                not _DEPTH[0] and _on(m) and m.sync_on_compute:
            args, kwargs = _after_loop(args, kwargs)
        _DEPTH[0] += 1
        try:
            return self.f(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1


class _Uncut(Exception):
    pass


def _after_loop(args, kwargs):
    """update()'s values after a loop, where each value with rows holds k per sample of the
    batches this rank's loop took (_loop.TAPE, a sharding deval knows: the rank's outputs,
    concatenated), cut to the real samples' rows, as the same update in the loop is; as they
    are where some value is not so, or holds every rank's rows (a gather after the loop)."""
    tape, ks, fit = _loop.TAPE[0], {}, None
    for path, v in _leaves(args, kwargs):
        try:
            r = _rows(v)
        except _Uncut:
            return args, kwargs
        if r is None:
            continue
        fit = _loop.taped(tape, r)
        if fit is None or getattr(v, "_deval_every_rank", False):
            return args, kwargs
        ks[path] = fit[2]
    if fit is None or fit[1].all():
        return args, kwargs
    try:
        return _cut(args, kwargs, fit[1], ks)
    except _Uncut:
        return args, kwargs


def _walk(v, path):
    if isinstance(v, dict):
        for k, w in v.items():
            yield from _walk(w, path + (k,))
    else:
        yield path, v


def _leaves(args, kwargs):
    """(path, value) of each value passed to update(), through dicts (a multitask update)."""
    for i, v in enumerate(args):
        yield from _walk(v, (i,))
    for k, v in kwargs.items():
        yield from _walk(v, (k,))


def _rows(v):
    """The rows of a value passed to update(): a tensor's or array's first dim, a list's
    length; None for a setting (a number, a string, None); _Uncut for a 0-d tensor."""
    if hasattr(v, "shape") and hasattr(v, "__getitem__") and not np.isscalar(v):
        if len(v.shape) == 0:
            raise _Uncut("a 0-d %s" % type(v).__name__)
        return v.shape[0]
    if isinstance(v, (list, tuple)):
        return len(v)
    return None


def _rows_of(m, lp):
    """How many rows per sample each value of m's updates had in every batch of lp so far:
    {path: k}, k -1 where it varied (flattened tokens, counts)."""
    seen = m.__dict__.get("_deval_rows")
    return seen[1] if seen is not None and seen[0] == lp.seq else {}


def _note_rows(m, lp, args, kwargs):
    """Note the rows per sample of each value of an update of a batch of real samples only
    (see _rows_of)."""
    b = lp.samples
    if not b:
        return
    seen = m.__dict__.get("_deval_rows")
    if seen is None or seen[0] != lp.seq:
        seen = m.__dict__["_deval_rows"] = (lp.seq, {})
    for path, v in _leaves(args, kwargs):
        try:
            r = _rows(v)
        except _Uncut:
            continue
        if r is not None:
            k = r // b if r % b == 0 else -1
            seen[1][path] = k if seen[1].get(path, k) == k else -1


def _cut(args, kwargs, real, history, batch=None):
    """update()'s args and kwargs with only the real samples' rows, where a value has a
    row per sample of the batch (or k rows each, as it had in every batch before); settings
    (numbers, strings, None) as they are. _Uncut naming a value it cannot cut, or when no
    value has rows. batch, the loader's, may say how a value's k rows lie (_nest)."""
    b = len(real)
    cut_any = False
    # k rows per sample lie one sample's after another's, unless a value says it is a
    # [T, batch] value flattened time-major: then every value of the call is taken so
    time = any(_nest.time_major(v, b, batch) for _, v in _leaves(args, kwargs))

    def cut(path, v):
        nonlocal cut_any
        r = _rows(v)
        if r is None:
            return v
        # k rows per sample only as in every batch before; one only where it never varied
        if r % b or history.get(path, 1 if r == b else None) != r // b:
            raise _Uncut("a %s of %d rows" % (type(v).__name__, r))
        cut_any = True
        # (time-major: sample j's rows at j, b + j, ...; a value of one row each either way)
        if time and r > b and _nest.sample_major(v, b, batch):
            raise _Uncut("a %s of %d rows, batch-first where another value of the update "
                         "is time-major" % (type(v).__name__, r))
        keep = np.tile(real, r // b) if time else np.repeat(real, r // b)
        if isinstance(v, (list, tuple)):
            kept = [w for w, k in zip(v, keep) if k]
            return type(v)(kept) if type(v) in (list, tuple) else kept
        if isinstance(v, np.ndarray):
            return v[keep]
        import torch
        return v[torch.from_numpy(keep).to(v.device)]

    def rebuild(v, path):
        if isinstance(v, dict):
            return type(v)((k, rebuild(w, path + (k,))) for k, w in v.items())
        return cut(path, v)

    args = tuple(rebuild(v, (i,)) for i, v in enumerate(args))
    kwargs = {k: rebuild(v, (k,)) for k, v in kwargs.items()}
    if not cut_any:
        raise _Uncut("no value with a row per sample")
    return args, kwargs


def _within(m):
    """m and the metrics it wraps: the ones whose sync checks what m took (a wrapper's own
    compute does not sync)."""
    import torchmetrics
    return [x for x in m.modules() if isinstance(x, torchmetrics.Metric)]


def _taint(m, why):
    for x in _within(m):
        x.__dict__["_deval_taint"] = why


# what to do where deval cannot tell a sharding's padding
_KNOWN = ("deval tells it for torch's own DistributedSampler, for Accelerate's shards of a "
          "DataLoader with a batch_size (torch's BatchSampler) over a map-style dataset, and "
          "for the batches Accelerate shards or dispatches of an iterable; a subclass or "
          "wrapper of the sampler, or a batch sampler of your own, it cannot see into. Use one "
          "of those, or update the metric with results gathered by gather_for_metrics")


def _count(m, lp, args, kwargs):
    """Note that m took the current batch of lp, a loop whose padding deval cannot tell: the
    samples it took over the ranks must not exceed the loop's (checked at sync). A batch
    that may be its samples themselves or fields of lp.samples each (lp.items) holds the
    count its update's rows say, where they say one of the two."""
    b = lp.samples
    items = getattr(lp, "items", None)
    if items is not None and items != b:
        rows = set()
        for _, v in _leaves(args, kwargs):
            try:
                rows.add(_rows(v))
            except _Uncut:
                pass
        if items in rows and b not in rows:
            b = items
    if b is None:
        _taint(m, "%s.update() at batch %d of loop #%d: deval cannot tell which samples of "
               "this loader's batches are padding, nor count them; %s" % (
                   type(m).__name__, lp.batches, lp.seq, _KNOWN))
        return
    for x in _within(m):
        seen = x.__dict__.setdefault("_deval_seen", {})
        ent = seen.setdefault(lp.seq, [lp.n, 0, 0])
        if ent[2] != lp.batches:  # (not a second update in one batch)
            ent[1] += b
            ent[2] = lp.batches


# What each rank says of a metric at its sync (_check, _ran_out): why its state is tainted
# (or None), the samples it took per loop (seen), the batches whose gathered rows it took
# (gathered), where it syncs (_where()), and whether it took rows of its own (own).
_Said = collections.namedtuple("_Said", "taint seen gathered where own")


def _check(m):
    """Mismatch on every rank when a rank's state of m may hold a duplicate sample, or when a
    rank's loop ran out while the others sync m in it. Return: whether every rank's state is
    one process's, so that m must not sync: every rank took the gathered rows of the same
    batches, and nothing else."""
    g = _group()
    said = [_Said(*s) for s in g.gather_object([_Said(
        m.__dict__.get("_deval_taint"), m.__dict__.get("_deval_seen", {}),
        m.__dict__.get("_deval_gathered", set()), _where(m), bool(m.__dict__.get("_deval_own")))])]
    _in_step(said)
    for rank, s in enumerate(said):
        if s.taint:
            raise Mismatch("deval.torchmetrics: rank %d: %s" % (rank, s.taint), -2)
    took = {}
    for rank, s in enumerate(said):
        for seq, batch in s.gathered:
            took.setdefault((seq, batch), []).append(rank)
    if len(said) > 1 and took and all(len(r) == len(said) for r in took.values()) and \
            not any(s.seen or s.own for s in said):
        return True
    for (seq, batch), ranks in sorted(took.items()):
        if len(ranks) > 1:
            raise Mismatch(
                "deval.torchmetrics: %s was updated with the rows gathered from every rank "
                "(gather_for_metrics) on ranks %s, at batch %d of loop #%d, but not only "
                "with the same gathered rows on every rank: it syncs, so those samples would "
                "count once per rank. Update it with each rank's own rows, or with the "
                "gathered rows on every rank or on one only, or make it with "
                "sync_on_compute=False" % (type(m).__name__, ranks, batch, seq), -2)
    loops = {}
    for s in said:
        for seq, (n, samples, _) in s.seen.items():
            loops.setdefault(seq, [n, 0])[1] += samples
    for seq, (n, samples) in sorted(loops.items()):
        if samples > n:
            raise Mismatch(
                "deval.torchmetrics: %s took %d samples over the ranks in loop #%d, whose loader "
                "holds %d: its sharding repeats %d samples to even out the ranks, and deval "
                "cannot tell which rows they are for this loader; %s"
                % (type(m).__name__, samples, seq, n, samples - n, _KNOWN), -2)


def _where(m):
    """Where this rank syncs m, for _in_step: the batch of the innermost loop deval runs, where
    that loop's pass has not opened (a hooked loader before its first gather_for_metrics, or
    with none), else None. Such a loop then says, when it runs out, that it did (_ran_out): a
    loop with a pass open already fails a sync a rank that ran out cannot answer (devald parks
    that rank), one without a pass would pair this rank's sync with whatever the rank that ran
    out calls next (its own compute() after the loop: a value of part of the samples; a
    torch.distributed barrier: a hang)."""
    lp = _loop.ACTIVE[-1] if _loop.ACTIVE else None
    if lp is None or not hasattr(lp, "at_end") or lp.opened:
        return None
    lp.at_end = _ran_out
    return ("sync", lp.batches, type(m).__name__)


def _ran_out(lp):
    """lp, a loop in which this rank synced a metric and whose pass never opened, ran out on
    this rank: one object gather, which meets the others' at their own loop's end, or the
    sync of a rank still in the loop, which then fails on every rank (_in_step)."""
    _in_step([_Said(*s) for s in _group().gather_object(
        [_Said(None, {}, set(), ("ended", lp.batches, None), False)])])


def _in_step(said):
    """Mismatch on every rank where some ranks' loops ran out (_ran_out) while others sync a
    metric in theirs: said is each rank's _Said at one object gather, where _where()'s or
    _ran_out()'s."""
    ended = {r: s.where for r, s in enumerate(said)
             if s.where is not None and s.where[0] == "ended"}
    if not ended or len(ended) == len(said):
        return
    syncing = [(r, s.where) for r, s in enumerate(said) if r not in ended]
    name = next((w[2] for _, w in syncing if w is not None), "a metric")
    at = sorted({w[1] for _, w in syncing if w is not None})
    raise Mismatch(
        "deval.torchmetrics: rank%s %s synced %s (compute(), sync()) at batch %s of a loop "
        "whose loader ran out on rank%s %s after batch %s: a rank whose loader ran out first "
        "(even_batches=False, or shards of their own) has left the loop and cannot answer the "
        "others' syncs, so each would pair with whatever it calls next. Sync the metric after "
        "the loop (its value then is every sample's), or give every rank as many batches"
        % ("s" if len(syncing) > 1 else "", ", ".join(str(r) for r, _ in syncing), name,
           "/".join(map(str, at)) or "?", "s" if len(ended) > 1 else "",
           ", ".join(map(str, sorted(ended))),
           "/".join(map(str, sorted({w[1] for w in ended.values()})))), -2)


def _sync(self, dist_sync_fn=None, process_group=None, should_sync=True,
          distributed_available=None):
    """Metric.sync: an attached metric's through deval, after checking that no rank's state
    holds a duplicate."""
    if not _on(self):
        return _ORIG["sync"](self, dist_sync_fn, process_group, should_sync,
                             distributed_available)
    if should_sync and not self._is_synced and _check(self):
        should_sync = False  # (every rank's state is one process's: nothing to add)
    if dist_sync_fn is None or getattr(dist_sync_fn, "__module__", "").startswith(
            "torchmetrics."):
        dist_sync_fn = sync  # (torchmetrics' own gather needs torch.distributed)
    return _ORIG["sync"](self, dist_sync_fn, process_group, should_sync, _distributed)


def _sync_dist(self, dist_sync_fn=None, process_group=None):
    """Metric._sync_dist: an attached metric's list states that are not concatenated (each
    element an update's, a sample's, an image's) gathered whole, every rank's elements in rank
    order: torchmetrics gathers them element by element, which needs as many on every rank,
    and a rank whose padding was left out holds fewer."""
    from torchmetrics.utilities.data import dim_zero_cat
    if not _on(self):
        return _ORIG["sync_dist"](self, dist_sync_fn, process_group)
    whole = [a for a, fn in self._reductions.items()
             if isinstance(getattr(self, a), list) and fn is not dim_zero_cat]
    if not whole:
        return _ORIG["sync_dist"](self, dist_sync_fn, process_group)
    saved = dict(self._reductions)
    parts = _group().gather_object([[getattr(self, a) for a in whole]])
    try:
        self._reductions = {a: fn for a, fn in saved.items() if a not in whole}
        _ORIG["sync_dist"](self, dist_sync_fn, process_group)
    finally:
        self._reductions = saved
    for i, a in enumerate(whole):
        flat = [e for rank in parts for e in rank[i]]
        fn = saved[a]
        setattr(self, a, fn(flat) if fn is not None else flat)


def _forward(self, *args, **kwargs):
    """Metric.forward: torchmetrics' own, which resets the metric to compute the batch's
    value and then puts its state back: what deval marked of that state (_reset()'s) goes
    back with it. For an attached metric in a batch that is all padding (a replayed batch, a
    padding step), the batch's own value, computed from its rows as for any batch (a metric
    of no rows may not compute: AUROC's cat states), while the metric's state is left as it
    was."""
    marks = {k: self.__dict__[k] for k in _MARKS if k in self.__dict__}
    try:
        return _forward_state(self, *args, **kwargs)
    finally:
        if marks.get("_deval_taint"):  # (the first reason a state cannot sync)
            self.__dict__["_deval_taint"] = marks["_deval_taint"]
        if marks.get("_deval_gathered"):
            self.__dict__.setdefault("_deval_gathered", set()).update(marks["_deval_gathered"])
        if marks.get("_deval_own"):
            self.__dict__["_deval_own"] = True


def _forward_state(self, *args, **kwargs):
    lp = _loop.ACTIVE[-1] if _loop.ACTIVE and not _DEPTH[0] and _on(self) else None
    real = getattr(lp, "real", None)
    if real is None or real.any():
        return _ORIG["forward"](self, *args, **kwargs)
    kept, count = self._copy_state_dict(), self._update_count
    _DEPTH[0] += 1  # (its update takes the rows: _Update passes what it is given)
    try:
        return _ORIG["forward"](self, *args, **kwargs)
    finally:
        _DEPTH[0] -= 1
        for name, value in kept.items():
            setattr(self, name, value)
        self._update_count, self._computed = count, None


# What deval marks of an attached metric's state, which a reset() drops: why it cannot sync,
# the batches whose gathered rows it took, whether it took rows of its own.
_MARKS = ("_deval_taint", "_deval_gathered", "_deval_own")


def _reset(self):
    _ORIG["reset"](self)
    for k in _MARKS:
        self.__dict__.pop(k, None)
