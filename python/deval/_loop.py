# SPDX-License-Identifier: MIT
"""What an eval loop needs to know about a loader: how many distinct samples its shards hold
together (num_samples) and in which order a gather returns them (order), and how to make an
empty batch shaped like a real one.

Recognised: torch's DistributedSampler (strided order; drop_last honoured), and Accelerate's
prepared loaders (rank order): batch-sampler shards with even_batches on or off,
split_batches, drop_last, iterable-dataset shards and dispatched batches. Anything else
raises InvalidArgument asking for num_samples and order.
"""

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


def _length(dataset, what):
    try:
        return len(dataset)
    except TypeError:
        raise ValueError("%s has no len(), so eval_loop cannot tell how many samples the pass "
                         "has; pass num_samples=" % what) from None


def pass_params(loader, world):
    """(num_samples, order) for loader sharded over world ranks; ValueError if unknown."""
    acc = _accelerate()
    if acc is not None and isinstance(loader, acc.DataLoaderDispatcher):
        # rank 0 reads world batches (or one it splits) and deals them out in rank order
        n = _length(loader.dataset, "the dataset")
        if not getattr(loader, "_drop_last", False):
            return n, "rank"
        per = loader.batch_size if loader.split_batches else loader.batch_size * world
        return n // per * per, "rank"
    if acc is not None and isinstance(loader, acc.DataLoaderShard):
        ds = loader.dataset
        if isinstance(ds, acc.IterableDatasetShard):
            n = _length(ds.dataset, "the iterable dataset")
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
            bs = inner.batch_size
            if not inner.drop_last:
                return n, "rank"
            if shard.split_batches:
                return n // bs * bs, "rank"
            return n // bs // world * world * bs, "rank"
    ds_sampler = _dist_sampler(loader)
    if ds_sampler is not None:
        if ds_sampler.num_replicas != world:
            raise ValueError("the DistributedSampler deals to %d replicas, the group has %d "
                             "ranks" % (ds_sampler.num_replicas, world))
        if ds_sampler.drop_last:
            return ds_sampler.num_samples * world, "strided"
        return _length(ds_sampler.dataset, "the sampler's dataset"), "strided"
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
