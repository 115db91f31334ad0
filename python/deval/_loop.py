# SPDX-License-Identifier: MIT
"""What an eval loop needs to know about a loader: how many distinct samples its shards hold
together (num_samples) and in which order a gather returns them (order), and how to make an
empty batch shaped like a real one.

Recognised: torch's DistributedSampler (strided order; drop_last honoured), and Accelerate's
prepared loaders (rank order): batch-sampler shards with even_batches on or off,
split_batches, drop_last, iterable-dataset shards and dispatched batches. Anything else
raises InvalidArgument asking for num_samples and order.
"""

import collections
import contextlib
import sys


class ShardedTwice(ValueError):
    """A loader Accelerate prepared over torch's DistributedSampler: each rank sees a shard
    of a shard."""


def _accelerate():
    return sys.modules.get("accelerate.data_loader")


def _dist_sampler(loader):
    """The torch DistributedSampler a DataLoader draws from, or None."""
    tud = sys.modules.get("torch.utils.data")
    if tud is None:
        return None
    DistributedSampler = tud.distributed.DistributedSampler
    for s in (getattr(loader, "sampler", None),
              getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(s, DistributedSampler):
            return s
    return None


class Unsized(ValueError):
    """A loader whose sharding is known (.order) but whose dataset has no len()."""

    def __init__(self, msg, order):
        super().__init__(msg)
        self.order = order


class Uncountable(Unsized):
    """An unsized loader whose sharding adds samples nothing can tell from the others."""


def _length(dataset, what, order="rank"):
    try:
        return len(dataset)
    except TypeError:
        raise Unsized("%s has no len(), so eval_loop cannot tell how many samples the pass "
                      "has; pass num_samples=" % what, order) from None


def _kept_by_ranks(sampler, world, bs):
    """The distinct indices a DistributedSampler's ranks give when their DataLoader drops its
    last short batch (drop_last=True): each rank's own sampler, dealt again for every rank."""
    import copy
    kept = set()
    for r in range(world):
        twin = copy.copy(sampler)
        twin.rank = r
        idx = list(twin)
        kept.update(idx[:len(idx) // bs * bs])
    return len(kept)


def unwrapped(loader):
    """The loader a progress bar wraps (tqdm's .iterable): the one whose sampler tells."""
    while type(loader).__module__.split(".")[0] == "tqdm" and hasattr(loader, "iterable"):
        loader = loader.iterable
    return loader


def pass_params(loader, world):
    """(num_samples, order) for loader sharded over world ranks; ValueError if unknown."""
    acc = _accelerate()
    if acc is not None and isinstance(loader, acc.DataLoaderDispatcher):
        # rank 0 reads world batches (or one it splits) and deals them out in rank order
        n = _length(loader.dataset, "the dataset")
        if not getattr(loader, "_drop_last", False):
            return n, "rank"
        if loader.batch_size is None:
            raise ValueError("a dispatched loader that drops its last batch, of a batch sampler "
                             "with no batch_size: eval_loop cannot tell how many samples it "
                             "keeps; pass num_samples=")
        per = loader.batch_size if loader.split_batches else loader.batch_size * world
        return n // per * per, "rank"
    if acc is not None and isinstance(loader, acc.DataLoaderShard):
        ds = loader.dataset
        if isinstance(ds, acc.IterableDatasetShard):
            try:
                n = _length(ds.dataset, "the iterable dataset")
            except Unsized:
                raise Uncountable(
                    "Accelerate shards this iterable dataset, which has no len(), and pads "
                    "its last round of batches with samples from its start, which no one can "
                    "tell from the others (Accelerate's own gather_for_metrics keeps them): "
                    "give the dataset a __len__, or iterate the loader with "
                    "g.eval_loop(loader, num_samples=...)", "rank") from None
            if not ds.drop_last:
                return n, "rank"
            per = ds.batch_size if ds.split_batches else ds.batch_size * world
            return n // per * per, "rank"
        shard = loader.batch_sampler
        if not isinstance(shard, acc.BatchSamplerShard):
            shard = getattr(loader, "sampler", None)
        if isinstance(shard, acc.BatchSamplerShard):
            if shard.num_processes != world:
                raise ValueError("the loader is sharded over %d processes, the group has %d "
                                 "ranks" % (shard.num_processes, world))
            inner = shard.batch_sampler
            n = _length(loader.dataset, "the dataset")
            inner_sampler = getattr(inner, "sampler", None)
            if inner_sampler is not None and _dist_sampler(inner) is not None:
                raise ShardedTwice("this loader was prepared by Accelerate over a "
                                   "DistributedSampler, which shards it twice; prepare a "
                                   "loader without it, or iterate the unprepared loader")
            bs = getattr(inner, "batch_size", None)
            if not getattr(inner, "drop_last", False):
                return n, "rank"
            if bs is None:
                raise ValueError("its batch sampler drops a last batch but has no batch_size, "
                                 "so eval_loop cannot tell how many samples it keeps; pass "
                                 "num_samples=")
            if shard.split_batches:
                return n // bs * bs, "rank"
            return n // bs // world * world * bs, "rank"
    ds_sampler = _dist_sampler(loader)
    if ds_sampler is not None:
        if ds_sampler.num_replicas != world:
            raise ValueError("the DistributedSampler deals to %d replicas, the group has %d "
                             "ranks" % (ds_sampler.num_replicas, world))
        bs = getattr(loader, "batch_size", None)
        if getattr(loader, "drop_last", False) and bs:  # the DataLoader drops a short batch too
            return _kept_by_ranks(ds_sampler, world, bs), "strided"
        if ds_sampler.drop_last:
            return ds_sampler.num_samples * world, "strided"
        return _length(ds_sampler.dataset, "the sampler's dataset", "strided"), "strided"
    raise ValueError("eval_loop cannot tell how %s (sampler %s) is sharded across ranks; pass "
                     "num_samples= (the samples all ranks' loaders hold together) and order= "
                     "('rank' when each rank gets whole consecutive batches, 'strided' when "
                     "samples are dealt round-robin like DistributedSampler)"
                     % (type(loader).__name__,
                        type(getattr(loader, "sampler", None)).__name__))


def _is_data(x):
    return hasattr(x, "shape") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes))


def empty_like(batch):
    """batch with every tensor or array cut to 0 rows and every list of samples emptied."""
    if _is_data(batch):
        return batch[:0] if len(batch.shape) > 0 else batch
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")
                                   and not isinstance(batch, (list, tuple))):
        items = {k: empty_like(batch[k]) for k in batch.keys()}
        try:
            return type(batch)(items)
        except Exception:
            return items
    if isinstance(batch, (list, tuple)):
        if not any(_is_data(v) or isinstance(v, (list, tuple, dict)) for v in batch):
            return type(batch)() if type(batch) in (list, tuple) else []
        items = [empty_like(v) for v in batch]
        if type(batch) in (list, tuple):
            return type(batch)(items)
        try:
            return type(batch)(*items)  # a namedtuple
        except TypeError:
            return items
    return batch


# ---- which samples each batch holds -------------------------------------------------------

_DRAWING = {}  # id(DataLoader) -> where its next iterator notes the batches it draws
_INDEX_SAMPLER = None  # torch's DataLoader._index_sampler, while a loop may tap it
_TAPPING = 0  # the Keys open


class _Tap:
    """A DataLoader's index sampler that notes each batch of indices as an iterator draws it,
    for the loop that was starting that iterator: an iterator draws ahead of what it yields
    (workers, prefetching), but yields the batches in the order it drew them."""

    def __init__(self, sampler, loader_id):
        self.sampler = sampler
        self.loader_id = loader_id

    def __iter__(self):
        drawn = _DRAWING.get(self.loader_id)  # (an iterator starting outside a loop: None)
        for b in self.sampler:
            if drawn is not None:
                drawn.append(b)
            yield b

    def __len__(self):
        return len(self.sampler)


def _tapped_index_sampler(self):
    return _Tap(_INDEX_SAMPLER.fget(self), id(self))


def map_loader(loader):
    """The torch DataLoader over a map-style dataset that iterating loader reads (Accelerate's
    prepared loaders read their base_dataloader), with the dataset's length; (None, None)
    when its batches carry no dataset indices (an iterable dataset, another kind of loader),
    or when its batches may come out of the order they were drawn in (in_order=False)."""
    tud = sys.modules.get("torch.utils.data")
    if tud is None:
        return None, None
    acc = _accelerate()
    if acc is not None and isinstance(loader, acc.DataLoaderDispatcher):
        return None, None  # rank 0 reads every batch; the others never see the indices
    base = getattr(loader, "base_dataloader", loader)
    if type(base) is not tud.DataLoader and not isinstance(base, tud.DataLoader):
        return None, None
    ds = base.dataset
    if isinstance(ds, tud.IterableDataset) or not hasattr(ds, "__getitem__"):
        return None, None
    try:
        return base, len(ds)
    except TypeError:
        return None, None


def check_loader(loader):
    """ValueError for a loader whose batches no pass can tell apart: batches yielded out of
    the order they were drawn, or samples drawn with replacement (a pass keeps each dataset
    index once)."""
    base = getattr(loader, "base_dataloader", loader)
    if getattr(base, "num_workers", 0) > 0 and getattr(base, "in_order", True) is False:
        raise ValueError("the DataLoader yields batches out of the order its sampler drew them "
                         "(in_order=False), so which samples a batch holds cannot be told; "
                         "use in_order=True")
    seen, todo = set(), [loader, base]
    while todo:  # the samplers behind the loader: batch samplers, shards, their samplers
        s = todo.pop()
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        if getattr(s, "replacement", False) is True:
            raise ValueError("its sampler %s draws with replacement; a pass keeps each dataset "
                             "index once, so the repeats a single process counts would be "
                             "dropped: gather such an evaluation without a pass (gather())"
                             % type(s).__name__)
        for a in ("sampler", "batch_sampler"):
            todo.append(getattr(s, a, None))


class Keys:
    """The dataset indices of each batch a loop over a map-style DataLoader yields, in order:
    ``with Keys(base) as keys:``, the loader's iterator started (and its first batch drawn)
    ``with keys.drawing():``, then ``keys.next(batch)`` for each batch."""

    def __init__(self, base, skip=0):
        self.base = base
        self.skip = skip
        self.drawn = collections.deque()

    def __enter__(self):
        global _INDEX_SAMPLER, _TAPPING
        if _INDEX_SAMPLER is None:
            tud = sys.modules["torch.utils.data"]
            _INDEX_SAMPLER = tud.DataLoader.__dict__["_index_sampler"]
            tud.DataLoader._index_sampler = property(_tapped_index_sampler)
        _TAPPING += 1
        return self

    def __exit__(self, *exc):
        global _INDEX_SAMPLER, _TAPPING
        _TAPPING -= 1
        if not _TAPPING and _INDEX_SAMPLER is not None:
            sys.modules["torch.utils.data"].DataLoader._index_sampler = _INDEX_SAMPLER
            _INDEX_SAMPLER = None

    @contextlib.contextmanager
    def drawing(self):
        """The iterator the loader starts meanwhile is this loop's."""
        _DRAWING[id(self.base)] = self.drawn
        try:
            yield
        finally:
            _DRAWING.pop(id(self.base), None)

    def next(self, batch):
        """The dataset indices of batch, the loader's next; ValueError when they cannot be
        told or do not match the batch."""
        while self.skip > 0 and self.drawn:  # drawn, and dropped by the loader itself
            self.drawn.popleft()
            self.skip -= 1
        if not self.drawn:
            raise ValueError("the loader yielded a batch its sampler did not draw here (an "
                             "iterator of it started before the loop?)")
        b = self.drawn.popleft()
        if not self.base._auto_collation:
            b = [b]  # batch_size=None: each index is one batch of one sample
        try:
            keys = [i.__index__() for i in b]
        except (AttributeError, TypeError):
            raise ValueError("its sampler yields %s, not dataset indices" % type(b).__name__) \
                from None
        if len(set(keys)) != len(keys):
            raise ValueError("its sampler put a dataset index twice in one batch (%s): a pass "
                             "keeps each index once, so the repeats a single process counts "
                             "would be dropped; gather such an evaluation without a pass "
                             "(gather())" % keys)
        rows = batch_rows(batch)
        if rows is not None and self.base._auto_collation and rows != len(keys):
            raise ValueError("a batch of %d rows came from a sampler batch of %d indices; a "
                             "collate_fn that changes the number of samples hides which "
                             "sample each row is" % (rows, len(keys)))
        return keys


def data_ids(batch):
    """The ids of every tensor, array and list a batch is made of: a gather_for_metrics of one
    of them gathers the loader's own data (labels, ids), which a sample's duplicate repeats
    exactly, unlike a model's output."""
    ids, todo = set(), [batch]
    while todo:
        x = todo.pop()
        if _is_data(x):
            ids.add(id(x))
        elif isinstance(x, dict) or (hasattr(x, "keys") and hasattr(x, "__getitem__")
                                     and not isinstance(x, (list, tuple, str, bytes))):
            todo.extend(x[k] for k in x.keys())
        elif isinstance(x, (list, tuple)):
            ids.add(id(x))
            todo.extend(x)
    return ids


def batch_rows(batch):
    """How many samples a collated batch holds, where that is plain: a tensor's rows, or the
    rows of a mapping's first tensor. None otherwise (a tuple may hold fields of the batch or
    the batch's raw samples)."""
    if _is_data(batch):
        return batch.shape[0] if len(batch.shape) else None
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")
                                   and not isinstance(batch, (list, tuple))):
        for k in batch.keys():
            if _is_data(batch[k]):
                return batch_rows(batch[k])
    return None
