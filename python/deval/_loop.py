# SPDX-License-Identifier: MIT
"""What an eval loop needs to know about a loader: how many distinct samples its shards hold
together (num_samples) and in which order a gather returns them (order), and how to make a
batch of one padding sample shaped like a real one.

Recognised: torch's DistributedSampler (strided order; drop_last honoured), and Accelerate's
prepared loaders (rank order): batch-sampler shards with even_batches on or off,
split_batches, drop_last, iterable-dataset shards and dispatched batches. Anything else
raises InvalidArgument asking for num_samples and order.
"""

import collections
import contextlib
import sys
import weakref

import numpy as np


class ShardedTwice(ValueError):
    """A loader Accelerate prepared over torch's DistributedSampler: each rank sees a shard
    of a shard."""


class ShardedByWorkers(ValueError):
    """A stream Accelerate shards on every rank (IterableDatasetShard) read in DataLoader
    worker processes: each worker shards and pads its own copy, where no rank can count it."""


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
    """A loader whose sharding is known (.order) but not its count: a dataset with no len(),
    or a dispatcher's batch sampler with no batch_size that skips or drops batches."""

    def __init__(self, msg, order):
        super().__init__(msg)
        self.order = order


class Uncountable(Unsized):
    """An unsized loader whose sharding adds samples a pass cannot tell from the others when
    it opens: only a rank that has read the stream to its end can (deval.accelerate)."""


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
    if type(sampler) is sys.modules["torch.utils.data"].distributed.DistributedSampler:
        # its samples are its draws (Draws): rank r deals draws r, r + world, ...
        n = sampler.total_size if sampler.drop_last else len(sampler.dataset)
        for r in range(world):
            for j in range(sampler.num_samples // bs * bs):
                p = r + j * world
                kept.add(p if p < n else (p - n) % n)
        return len(kept)
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
        # rank 0 reads world batches (or one it splits) and deals them out in rank order;
        # skip_first_batches skips batches of a map-style dataset's batch sampler (each of
        # batch_size samples), and rounds of an iterable, read and dealt to no one
        n = _length(loader.dataset, "the dataset")
        drawn, skip_drawn = skipped(getattr(loader, "batch_sampler", None))
        skip = getattr(loader, "skip_batches", 0)
        drop = getattr(loader, "_drop_last", False)
        if not drop and not skip and not skip_drawn:
            return n, "rank"
        bs = loader.batch_size or getattr(drawn, "batch_size", None)
        if not bs:  # (the dispatcher still counts its last round: deval.accelerate's)
            raise Unsized("a dispatched loader that %s, of a batch sampler with no "
                          "batch_size: eval_loop cannot tell how many samples it keeps; "
                          "pass num_samples=" % ("drops its last batch" if drop else
                                                 "skips its first batches"), "rank")
        per = bs if loader.split_batches else bs * world
        n = max(0, n - skip_drawn * bs)
        return max(0, (n // per * per if drop else n) - skip * per), "rank"
    if acc is not None and isinstance(loader, acc.DataLoaderShard):
        ds = loader.dataset
        if isinstance(ds, acc.IterableDatasetShard) and getattr(loader, "num_workers", 0) > 0:
            raise ShardedByWorkers(
                "Accelerate shards this iterable dataset on every rank, and with "
                "num_workers=%d each worker process reads the stream (its part of it, or a "
                "copy), shards it and pads its own last round of batches with samples from "
                "its own start: which rows are padding, and how many samples the stream held, "
                "no process can count, so no pass can be exact. Use num_workers=0" %
                loader.num_workers)
        if isinstance(ds, acc.IterableDatasetShard):
            try:
                n = _length(ds.dataset, "the iterable dataset")
            except Unsized:
                raise Uncountable(
                    "Accelerate shards this iterable dataset, which has no len(), and pads "
                    "its last round of batches with samples from its start, which a pass "
                    "that opens before the stream was read to its end cannot tell from the "
                    "others (Accelerate's own gather_for_metrics keeps them; "
                    "deval.accelerate.enable() counts the stream as it is read): give the "
                    "dataset a __len__, or iterate the loader with "
                    "g.eval_loop(loader, num_samples=...)", "rank") from None
            skip = getattr(loader, "skip_batches", 0)  # (rounds read and dealt to no one)
            if not ds.drop_last and not skip:
                return n, "rank"
            per = ds.batch_size if ds.split_batches else ds.batch_size * world
            return max(0, (n // per * per if ds.drop_last else n) - skip * per), "rank"
        shard, skip = skipped(loader.batch_sampler)
        if not isinstance(shard, acc.BatchSamplerShard):
            shard, skip = skipped(getattr(loader, "sampler", None))
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
            if _batch_draws(inner) is not None:  # a sampler that may draw more than the dataset
                n = len(inner.sampler)
            if skip and bs is None:
                raise ValueError("it skips its first %d batches (skip_first_batches) of a batch "
                                 "sampler with no batch_size, so eval_loop cannot tell how many "
                                 "samples they held; pass num_samples=" % skip)
            if getattr(inner, "drop_last", False):
                if bs is None:
                    raise ValueError("its batch sampler drops a last batch but has no "
                                     "batch_size, so eval_loop cannot tell how many samples it "
                                     "keeps; pass num_samples=")
                n = n // bs * bs if shard.split_batches else n // bs // world * world * bs
            # skip_first_batches: each rank skips its first batches, a round of them each
            per = bs if shard.split_batches else (bs or 0) * world
            return max(0, n - skip * per), "rank"
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
                     "('rank' when whole batches are dealt round-robin, rank r's i-th batch "
                     "being the (i*ranks + r)-th, as Accelerate deals them; 'strided' when "
                     "samples are, like DistributedSampler; a contiguous chunk of the "
                     "dataset on each rank is neither: gather it with gather())"
                     % (type(loader).__name__,
                        type(getattr(loader, "sampler", None)).__name__))


def alone(loader):
    """The samples a DataLoader read by a group of one rank holds, where its sampler says:
    all it draws, less what a torch BatchSampler's drop_last leaves out; None where unknown.
    (eval_loop's: a loader under deval.accelerate on one process keeps Accelerate's
    behaviour.)"""
    tud = sys.modules.get("torch.utils.data")
    base = inner(loader)
    if tud is None or not isinstance(base, tud.DataLoader):
        return None
    bs = base.batch_sampler
    if bs is not None and type(bs) is not tud.BatchSampler:
        return None  # (a batch sampler of one's own: its batches' sizes are its own)
    try:
        n = len(base.sampler)
    except TypeError:
        return None
    if bs is not None and bs.drop_last:
        n = n // bs.batch_size * bs.batch_size
    return n


def _is_data(x):
    return hasattr(x, "shape") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes))


def _mapping(x):
    return isinstance(x, dict) or (hasattr(x, "keys") and hasattr(x, "__getitem__")
                                   and not isinstance(x, (list, tuple, str, bytes)))


def _column(x, b):
    """x holds one entry per sample of a batch of b: rows, or a list of the samples' fields."""
    return (_is_data(x) and len(x.shape) > 0 and x.shape[0] == b) or \
        (isinstance(x, (list, tuple)) and len(x) == b)


def head(batch):
    """A batch of one sample cut from batch, in its own structure: every tensor's first
    sample (its rows / the batch's samples), every list of the batch's samples cut to its
    first. A batch of no structure it knows comes back as it is."""
    b = batch_samples(batch)
    if b is None and isinstance(batch, tuple):
        b = len(batch)  # (a tuple of the samples themselves)
    if isinstance(batch, list) and b == len(batch) and \
            not any(_is_data(v) and len(v.shape) for v in batch):
        return batch[:1]  # the samples themselves, as batch_samples() reads a list of them
    return _cut(batch, b) if b else batch


def _cut(x, b):
    if _is_data(x):
        if len(x.shape) == 0 or x.shape[0] % b:
            return x
        return x[:x.shape[0] // b]
    if _mapping(x):
        items = {k: _cut(x[k], b) for k in x.keys()}
        try:
            return type(x)(items)
        except Exception:
            return items
    if isinstance(x, (list, tuple)):
        if len(x) == b and not all(_column(v, b) for v in x):
            return x[:1]  # the batch's samples themselves
        items = [_cut(v, b) for v in x]
        if type(x) in (list, tuple):
            return type(x)(items)
        try:
            return type(x)(*items)  # a namedtuple
        except TypeError:
            return items
    return x


# ---- which samples each batch holds -------------------------------------------------------

ACTIVE = []  # the _LoopPass of each loop running, innermost last
# the last loop's samples, where a sharding deval knows says each one's key and whether it is
# real (tape_of() a _LoopPass's tape: empty where unknown), or None after a loop of another
# kind; what rows a rank concatenated from that loop's batches hold, for a gather or a
# metric's update after it
TAPE = [None]
LOOPS = [0]  # loops this process started: each one's number, which ranks agree on
_NUMBERED = weakref.WeakKeyDictionary()  # loader -> its number
_LOADERS = [0]  # loaders this process iterated (a count, whatever was collected since)


def loader_number(loader):
    """Which loader a loop iterates: its number in the order this process first iterated
    it, which every rank finds alike when every rank iterates the same loaders in the same
    order (a batch peeked on one rank from a loader the others iterate next counts once).
    How often it was iterated is not compared: a peek on one rank is an iteration the others
    do not make. None for a loader that cannot be told apart (none, or not weakly
    referable)."""
    if loader is None:
        return None
    try:
        n = _NUMBERED.get(loader)
        if n is None:
            _LOADERS[0] += 1
            n = _NUMBERED[loader] = _LOADERS[0]
    except TypeError:
        return None
    return n

_DRAWING = {}  # id(DataLoader) -> where its next iterator notes the batches it draws
_INDEX_SAMPLER = None  # torch's DataLoader._index_sampler, while a loop may tap it
_GET_DATA = None  # torch's _MultiProcessingDataLoaderIter._get_data, the same while
_TAPPING = 0  # the Keys open


class _Drawn(collections.deque):
    """The batches of indices an iterator drew, in order, not yet placed; tasks: the task
    numbers (each its draw's place among the iterator's draws) of the batches its workers
    handed over, in the order they did, not yet taken."""

    def __init__(self):
        super().__init__()
        self.tasks = collections.deque()


class _Tap:
    """A DataLoader's index sampler that notes each batch of indices as an iterator draws it,
    for the loop that was starting that iterator: an iterator draws ahead of what it yields
    (workers, prefetching), and yields the batches in the order it drew them, or, with
    in_order=False, as its workers hand them over, each with its task number: the place of
    its draw (_tapped_get_data notes it)."""

    def __init__(self, sampler, loader_id):
        self.sampler = sampler
        self.loader_id = loader_id
        self.drawn = None

    def __iter__(self):
        drawn = _DRAWING.get(self.loader_id)  # (an iterator starting outside a loop: None)
        self.drawn = drawn
        for b in self.sampler:
            if drawn is not None:
                drawn.append(b)
            yield b

    def __len__(self):
        return len(self.sampler)


def _tapped_index_sampler(self):
    return _Tap(_INDEX_SAMPLER.fget(self), id(self))


def _tapped_get_data(self):
    # torch's worker iterator: a batch its workers hand over, with its task number; with
    # in_order=False it yields the batches in the order they come (it keeps none back)
    idx, data = _GET_DATA(self)
    drawn = getattr(getattr(self, "_index_sampler", None), "drawn", None)
    if drawn is not None and getattr(self, "_in_order", True) is False and \
            isinstance(idx, int):  # (not a persistent worker's word that it starts again)
        drawn.tasks.append(idx)
    return idx, data


def inner(loader):
    """The torch DataLoader a wrapper iterates: Accelerate's prepared loaders' base_dataloader,
    Lightning Fabric's _dataloader (setup_dataloaders); loader itself otherwise."""
    base = getattr(loader, "base_dataloader", None)
    if base is None and type(loader).__name__ == "_FabricDataLoader":
        base = getattr(loader, "_dataloader", None)
    return loader if base is None else base


def map_loader(loader):
    """The torch DataLoader over a map-style dataset that iterating loader reads (Accelerate's
    prepared loaders read their base_dataloader, inner()), with the dataset's length; (None, None)
    when its batches carry no dataset indices (an iterable dataset, another kind of loader)."""
    tud = sys.modules.get("torch.utils.data")
    if tud is None:
        return None, None
    acc = _accelerate()
    if acc is not None and isinstance(loader, acc.DataLoaderDispatcher):
        return None, None  # rank 0 reads every batch; the others never see the indices
    base = inner(loader)
    if type(base) is not tud.DataLoader and not isinstance(base, tud.DataLoader):
        return None, None
    ds = base.dataset
    if isinstance(ds, tud.IterableDataset) or not hasattr(ds, "__getitem__"):
        return None, None
    try:
        return base, len(ds)
    except TypeError:
        return None, None


def skipped(index):
    """(the batch sampler, batches it skips) of an index sampler: Accelerate's
    skip_first_batches wraps a loader's in a SkipBatchSampler, which drops the first
    skip_batches batches it draws."""
    acc = _accelerate()
    if acc is not None and type(index) is getattr(acc, "SkipBatchSampler", None):
        return index.batch_sampler, index.skip_batches
    return index, 0


def _batch_draws(inner):
    """The sampler behind torch's own BatchSampler inner, when it has a length: each batch but
    the last holds inner.batch_size of its draws, in order. None otherwise."""
    tud = sys.modules["torch.utils.data"]
    if type(inner) is not tud.BatchSampler or not inner.batch_size:
        return None
    try:
        len(inner.sampler)
    except TypeError:
        return None
    return inner.sampler


class Draws:
    """Where the samples a rank's loader yields stand among the draws of the sampler all ranks
    share, the order one process would read them in: draw p < n is the sampler's own, a draw
    p >= n the sharding's padding, a repeat of draw (p - n) % wrap. at(i, j, k) is the place
    of the k-th sample of the rank's i-th batch, the j-th sample it was dealt."""

    def __init__(self, n, wrap, at, first=0):
        self.n, self.wrap, self.at, self.first = n, wrap, at, first

    def key(self, p):
        """Draw p's key: itself, or the draw a padding draw repeats; DEVAL_KEY_PAD (-1) where
        that one lies before first, among the draws the loader skipped (skip_first_batches),
        so that no sample of the pass stands for it."""
        if p < self.n:
            return p
        q = (p - self.n) % self.wrap
        return q if q >= self.first else -1


def draws(loader, base):
    """The Draws of a DataLoader base (loader's, as map_loader found it) whose sharding deval
    knows exactly: torch's DistributedSampler, Accelerate's batch sampler shards. None for
    any other; its samples are told apart by dataset index alone."""
    tud = sys.modules["torch.utils.data"]
    index, skip = skipped(base.batch_sampler if base._auto_collation else base.sampler)
    acc = _accelerate()
    if acc is not None and type(index) is acc.BatchSamplerShard:
        inner, world, r = index.batch_sampler, index.num_processes, index.process_index
        sampler = _batch_draws(inner)
        if sampler is None or getattr(loader, "skip_batches", 0):
            return None
        n, bs = len(sampler), inner.batch_size
        if n == 0:
            return None
        if index.split_batches:
            if bs % world:
                return None
            per = bs // world
            return Draws(n, min(n, bs), lambda i, j, k: (i + skip) * bs + r * per + k,
                         skip * bs)
        return Draws(n, min(n, world * bs), lambda i, j, k: ((i + skip) * world + r) * bs + k,
                     skip * world * bs)
    if skip:
        return None
    ds = index.sampler if type(index) is tud.BatchSampler else index
    if type(ds) is not tud.distributed.DistributedSampler:
        return None
    n = ds.total_size if ds.drop_last else len(ds.dataset)
    if n == 0:
        return None
    world, r = ds.num_replicas, ds.rank
    return Draws(n, n, lambda i, j, k: r + (j + k) * world)


def shard_rows(loader):
    """For an iterable dataset Accelerate shards, the place of the m-th sample a rank gets
    among the dataset's (padding past its length): (length, at(m)). None for other loaders."""
    acc = _accelerate()
    ds = getattr(loader, "dataset", None)
    if acc is None or not isinstance(loader, acc.DataLoaderShard) or \
            not isinstance(ds, acc.IterableDatasetShard):
        return None
    try:
        n = len(ds.dataset)
    except TypeError:
        return None
    world, r = ds.num_processes, ds.process_index
    total = ds.batch_size if ds.split_batches else ds.batch_size * world
    per = ds.batch_size // world if ds.split_batches else ds.batch_size
    skip = getattr(loader, "skip_batches", 0) * per  # (skip_first_batches: each rank's own)
    return n, lambda m: (m + skip) // per * total + r * per + (m + skip) % per


class Counting:
    """The stream an IterableDatasetShard reads, counting the samples each iteration of it
    yields into read[0]; every other attribute is the stream's (set_epoch, a generator)."""

    def __init__(self, inner, read):
        self._inner, self._read = inner, read

    def __iter__(self):
        self._read[0] = 0
        for x in self._inner:
            self._read[0] += 1
            yield x

    def __getattr__(self, name):
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


@contextlib.contextmanager
def counted(shard):
    """While a loop iterates a loader over shard (an IterableDatasetShard read in this
    process), [the samples its stream yielded in this iteration]. The shard reads its
    .dataset when its iterator starts, at the loader's first batch; the stream is the user's
    own again when the loop ends (an earlier loop over it left unfinished, whose iterator is
    not yet collected, leaves it to this one)."""
    inner = shard.dataset
    if isinstance(inner, Counting):
        inner = inner._inner
    read = [0]
    shard.dataset = counting = Counting(inner, read)
    try:
        yield read
    finally:
        if shard.dataset is counting:
            shard.dataset = inner


def check_stream(loader, read, n):
    """ValueError where, at the last batch of loader (over an IterableDatasetShard whose
    stream said it held n samples), the stream held more: the rest would be taken for the
    shard's padding and dropped."""
    if getattr(loader, "end_of_dataloader", False) and read[0] > n:
        raise ValueError("the dataset's len() says %d samples, but its stream held %d: the "
                         "rest would be taken for padding and dropped; give it a len() that "
                         "counts every sample, or none" % (n, read[0]))


def dispatched(loader):
    """Is loader Accelerate's DataLoaderDispatcher (rank 0 reads each round of batches and
    deals every rank a slice)?"""
    acc = _accelerate()
    return acc is not None and isinstance(loader, acc.DataLoaderDispatcher)


def tape_of(batches):
    """TAPE's (keys, real) of a loop's batches, [(keys, real) per batch] (None: unknown)."""
    if not batches:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    return np.concatenate([k for k, _ in batches]), np.concatenate([r for _, r in batches])


def taped(tape, rows):
    """(keys, real, k) where rows, a value's rows on this rank, are k per sample of the
    samples tape (TAPE's) holds, one sample's after another's; None where they are not."""
    if tape is None or not rows or not len(tape[0]) or rows % len(tape[0]):
        return None
    return tape[0], tape[1], rows // len(tape[0])


def dispatched_real(loader, rank, b):
    """Which of the b samples a DataLoaderDispatcher dealt rank in its current batch are
    real: all but in its last round, whose first `remainder` samples (the dispatcher counts
    them) are, dealt in rank order, b to each rank."""
    real = b
    if getattr(loader, "end_of_dataloader", False):
        real = max(0, min(b, int(loader.remainder) - rank * b))
    return np.arange(b) < real


def out_of_order(base):
    """Does the torch DataLoader base yield its batches as its workers finish them, out of the
    order its sampler drew them (in_order=False)?"""
    return getattr(base, "num_workers", 0) > 0 and getattr(base, "in_order", True) is False


class DealtRounds:
    """A DataLoaderDispatcher's rounds, while a loop iterates it (with): rank 0 reads a round
    of batches (or one it splits), concatenates them and deals each rank an equal share, the
    round's rows // the ranks; only the last round is padded to whole shares. A round before
    it that holds a short batch (each DataLoader worker ends its own part of an iterable with
    one) is dealt short: its last rows % ranks go to no rank, and nobody evaluates them. The
    dispatcher's slice_fn (its own again after) notes each round's rows and a rank's share;
    lost() says how many rows the current batch's round dropped."""

    def __init__(self, loader):
        self.loader = loader
        self.rows = self.share = None
        self.read = 0  # the samples of the rounds before the current one
        self.own = None

    def __enter__(self):
        loader = self.loader
        self.own = loader.__dict__.get("slice_fn")
        inner = loader.slice_fn
        find = sys.modules["accelerate.utils"].find_batch_size

        def noted(batch, data_slice, *args, **kwargs):
            try:
                self.rows, self.share = find(batch), data_slice.stop - data_slice.start
            except Exception:  # (a batch it cannot measure: nothing said)
                self.rows = self.share = None
            return inner(batch, data_slice, *args, **kwargs)

        loader.slice_fn = noted
        return self

    def __exit__(self, *exc):
        if self.own is None:
            self.loader.__dict__.pop("slice_fn", None)
        else:
            self.loader.slice_fn = self.own

    def check(self, world, n=None):
        """ValueError where the current batch's round, not the last, dropped rows; or where,
        at the last, the rounds held more than n samples (a pass's count, from a len() that
        said less than the stream holds: the rest would be taken for padding)."""
        if self.rows is None:
            return
        if getattr(self.loader, "end_of_dataloader", False):
            held = self.read + getattr(self.loader, "remainder", -1)
            if n is not None and held > n >= 0 and held > self.read:
                raise ValueError(
                    "the dataset's len() says %d samples, but the stream Accelerate's "
                    "dispatcher read held %d: the rest would be taken for padding and "
                    "dropped; give it a len() that counts every sample, or none" % (n, held))
            return
        self.read += self.rows
        lost = self.rows - world * self.share
        if lost > 0:
            workers = getattr(getattr(self.loader, "base_dataloader", None), "num_workers", 0)
            why, fix = ("each of the %d workers ends its part of the stream with a short "
                        "batch" % workers, "read it with num_workers=0, or give each "
                        "worker's part whole batches") if workers else (
                "its batches are not all one size", "make each round of batches a multiple "
                "of the ranks, or prepare the loader with dispatch_batches=False")
            raise ValueError(
                "Accelerate's dispatcher read a round of %d samples before the last and dealt "
                "%d to each of the %d ranks: %d went to no rank, and nobody evaluated them "
                "(%s); one process would have: %s"
                % (self.rows, self.share, world, lost, why, fix))


def check_loader(loader, by_draw=False, keyed=False):
    """ValueError for a loader whose batches no pass can tell apart: batches yielded out of
    the order they were drawn where they carry no dataset indices (not keyed) or the loader
    skips its first ones, or, when its samples are told apart by dataset index alone (not
    by_draw), samples drawn with replacement."""
    base = inner(loader)
    if out_of_order(base) and not keyed:
        raise ValueError("the DataLoader yields batches out of the order they were read "
                         "(in_order=False), and its dataset has no indices to tell them by: a "
                         "batch's samples are known only by their place in the stream, which "
                         "its workers no longer keep; use in_order=True")
    if out_of_order(base) and getattr(loader, "skip_batches", 0):
        raise ValueError("it skips its first %d batches (skip_first_batches) of a DataLoader "
                         "that yields them out of the order they were drawn (in_order=False): "
                         "which ones it skipped is up to its workers' speed; use "
                         "in_order=True" % loader.skip_batches)
    seen, todo = set(), [loader, base]
    while todo:  # the samplers behind the loader: batch samplers, shards, their samplers
        s = todo.pop()
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        if not by_draw and getattr(s, "replacement", False) is True:
            raise ValueError("its sampler %s draws with replacement, and deval does not know "
                             "how this loader shards it, so the repeats a single process "
                             "counts cannot be told from a sharding's padding: shard it with "
                             "a DistributedSampler or Accelerate's prepare(), or gather such "
                             "an evaluation without a pass (gather())" % type(s).__name__)
        for a in ("sampler", "batch_sampler"):
            todo.append(getattr(s, a, None))


class Keys:
    """Which samples each batch a loop over a map-style DataLoader yields holds, in order:
    ``with Keys(base) as keys:``, the loader's iterator started (and its first batch drawn)
    ``with keys.drawing():``, then ``keys.next(batch)`` for each batch. A sample's key is its
    place among the shared sampler's draws when the sharding is known (draws, a Draws), its
    dataset index otherwise (named(): the index in the dataset the ranks' parts were cut
    from, where they read parts of their own)."""

    def __init__(self, base, skip=0, draws=None):
        self.base = base
        self.skip = skip
        self.draws = draws
        self.drawn = _Drawn()
        # the draws not yet taken, in order, each with its place: (draw, lists, its batch, the
        # indices dealt before it); by task number (the draw's place) where they come out of
        # order
        self.placed = collections.OrderedDict()
        self.tasks = out_of_order(base)
        self.batch = 0  # batches drawn so far, with those the loader skipped
        self.dealt = 0  # indices drawn so far
        self.real = None  # the last batch's real samples (a bool per sample), when known
        self.indices = None  # the last batch's dataset indices
        self.lists = False  # batch_size=None over a sampler that yields lists (_collated)
        self.index = None  # the root's index of each dataset index, where keys name its (named)

    def __enter__(self):
        global _INDEX_SAMPLER, _GET_DATA, _TAPPING
        if _INDEX_SAMPLER is None:
            tud = sys.modules["torch.utils.data"]
            _INDEX_SAMPLER = tud.DataLoader.__dict__["_index_sampler"]
            tud.DataLoader._index_sampler = property(_tapped_index_sampler)
            workers = sys.modules["torch.utils.data.dataloader"]._MultiProcessingDataLoaderIter
            _GET_DATA = workers._get_data
            workers._get_data = _tapped_get_data
        _TAPPING += 1
        return self

    def __exit__(self, *exc):
        global _INDEX_SAMPLER, _GET_DATA, _TAPPING
        _TAPPING -= 1
        if not _TAPPING and _INDEX_SAMPLER is not None:
            sys.modules["torch.utils.data"].DataLoader._index_sampler = _INDEX_SAMPLER
            sys.modules["torch.utils.data.dataloader"]._MultiProcessingDataLoaderIter.\
                _get_data = _GET_DATA
            _INDEX_SAMPLER = _GET_DATA = None

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
        self._place()
        while self.skip > 0 and self.placed:  # drawn, and dropped by the loader itself
            self._take()
            self.skip -= 1
        tasks = self.drawn.tasks
        b = self._take(tasks.popleft() if tasks else -1) if self.tasks else self._take()
        if b is None:
            raise ValueError("the loader yielded a batch its sampler did not draw here: an "
                             "iterator of it started before the loop (with "
                             "persistent_workers=True, a batch taken before a loop leaves the "
                             "workers ahead of the sampler for good: make the DataLoader "
                             "again, or take no batch from it outside the loop)")
        b, i, j = b
        if self.draws is not None:  # a draw is its place: what the sampler yields is the
            keys = list(b)          # dataset's to read (a key of its own, say)
        else:
            try:
                keys = [k.__index__() for k in b]
            except (AttributeError, TypeError):
                raise ValueError("its sampler yields %s, neither dataset indices nor lists "
                                 "of them, and deval does not know how the loader shards it "
                                 "(a DistributedSampler's or Accelerate's sharding of it "
                                 "names each sample by its draw)"
                                 % type(b[0] if len(b) else b).__name__) from None
        self.indices = keys
        if self.draws is not None:
            d = self.draws
            at = [d.at(i, j, k) for k in range(len(keys))]
            self.real = [p < d.n for p in at]
            keys = [d.key(p) for p in at]
        elif len(set(keys)) != len(keys):
            raise ValueError("its sampler put a dataset index twice in one batch (%s): a pass "
                             "keeps each index once, so the repeats a single process counts "
                             "would be dropped; gather such an evaluation without a pass "
                             "(gather())" % keys)
        rows = batch_rows(batch)
        if rows is not None and self._collated() and rows != len(keys):
            raise ValueError("a batch of %d rows came from a sampler batch of %d indices; a "
                             "collate_fn that changes the number of samples hides which "
                             "sample each row is" % (rows, len(keys)))
        return keys

    def named(self, keys):
        """The keys the pass declares for keys, what next() gave: where the ranks read parts of
        one dataset (index, set by the pass), the indices of that one, which name each sample
        alike on every rank; else keys as they are."""
        if self.index is None or self.draws is not None:
            return keys
        return [int(self.index[k]) for k in keys]

    def _collated(self):
        """Each batch the sampler draws is a list of indices, collated as one batch: torch's
        batch sampler, or (batch_size=None) a sampler that yields lists itself, the fast-fetch
        pattern of a BatchSampler passed as sampler= over a dataset indexed by lists."""
        return self.base._auto_collation or self.lists

    def _place(self):
        """Number the draws not yet placed: each one's place among the draws, batch and
        indices dealt before it."""
        while self.drawn:
            b = self.drawn.popleft()
            lists = True
            if not self.base._auto_collation:
                # batch_size=None: a draw is one sample, or a whole batch's list of indices
                lists = not hasattr(b, "__index__") and hasattr(b, "__iter__") and \
                    not isinstance(b, (str, bytes))
                if not lists:
                    b = [b]
            self.placed[self.batch] = (b, lists, self.batch, self.dealt)
            self.batch += 1
            self.dealt += len(b) if hasattr(b, "__len__") else 1

    def _take(self, task=None):
        """(the draw, its batch, the indices dealt before it): the first not yet taken, or
        that of task number task; None where there is none."""
        if task is not None:
            got = self.placed.pop(task, None)
        else:
            got = self.placed.popitem(last=False)[1] if self.placed else None
        if got is None:
            return None
        b, lists, i, j = got
        if not self.base._auto_collation:
            self.lists = lists
        return b, i, j

    def padding(self):
        """A batch of one padding sample, in the loader's own structure: the last batch's first
        sample, read and collated again."""
        return self.alone(0)

    def alone(self, k):
        """The last batch's k-th drawn sample read and collated again, as a batch of its own."""
        base = self.base
        if self.lists:  # (the dataset reads a list of indices at once)
            return base.collate_fn(base.dataset[self.indices[k:k + 1]])
        sample = base.dataset[self.indices[k]]
        return base.collate_fn([sample] if base._auto_collation else sample)

    def in_place(self, batch, rows):
        """Does batch hold, at each of rows (places in the draw), the sample drawn there? Each
        is read and collated alone, and its rows compared with the batch's at that place (the
        part the two shapes share: a collate pads to the batch's longest); True where they
        agree in at least one value with a row per sample and differ in none."""
        b = len(self.indices)
        for k in rows:
            try:
                one = self.alone(k)
            except Exception:  # (a dataset that cannot be read again here)
                return False
            if not _same_row(batch, k, b, one):
                return False
        return True


_DIGEST_BYTES = 2048  # a tensor's first and last bytes a digest reads


def _sample_bytes(x):
    """x's bytes, or its first and last _DIGEST_BYTES: a host tensor's or array's; None for a
    tensor on a device (its shape and dtype say enough with the indices)."""
    import numpy as np
    if hasattr(x, "untyped_storage"):  # torch
        if x.device.type != "cpu":
            return None
        x = x.detach()
        try:
            a = x.numpy()
        except (TypeError, RuntimeError):  # (a dtype numpy lacks: bfloat16)
            a = x.contiguous().view(sys.modules["torch"].uint8).numpy()
    else:
        try:
            a = np.asarray(x)
        except Exception:
            return None
        if a.dtype == object:
            return repr(a.reshape(-1)[:64].tolist()).encode()
    try:
        mv = memoryview(np.ascontiguousarray(a) if a.size <= 512 else a).cast("B")
    except (TypeError, ValueError):  # (strided: its first and last elements)
        flat = a.reshape(-1)
        return flat[:256].tobytes() + flat[-256:].tobytes()
    n = len(mv)
    return bytes(mv) if n <= 2 * _DIGEST_BYTES else \
        bytes(mv[:_DIGEST_BYTES]) + bytes(mv[n - _DIGEST_BYTES:])


def digest(batch, keys=None):
    """A 64-bit digest of a batch: its dataset indices (keys), its structure, its tensors'
    shapes and dtypes, their first and last elements, and its other leaves (text, numbers).
    Two runs of one loader give equal digests; another dataset, order or preprocessing almost
    surely does not. Costs a few microseconds whatever the batch's size."""
    import hashlib
    h = hashlib.blake2b(digest_size=8)
    if keys is not None:
        h.update(repr(list(keys)).encode())
    todo, seen = [batch], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:  # (an object met twice, or a cycle)
            h.update(b"@")
            continue
        if not isinstance(x, (str, bytes, int, float, bool)) and x is not None:
            seen.add(id(x))
        if _is_data(x):
            h.update(repr((type(x).__name__, tuple(x.shape), str(x.dtype))).encode())
            b = _sample_bytes(x)
            if b is not None:
                h.update(b)
        elif _mapping(x):
            h.update(b"{")
            for k in x.keys():
                h.update(repr(k).encode())
                todo.append(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(b"[%d" % len(x))
            todo.extend(reversed(x))
        elif x is None or isinstance(x, (str, bytes, int, float, bool)):
            h.update(repr(x).encode())
        elif hasattr(x, "__dict__") and not callable(x):  # a sample of a class of its own
            h.update(type(x).__name__.encode() + b"(")
            for k, v in vars(x).items():
                h.update(repr(k).encode())
                todo.append(v)
        else:
            h.update(type(x).__name__.encode())
    return int.from_bytes(h.digest(), "little")


def _same_row(batch, k, b, one):
    """batch's row k (of b) against one's only row, through the structure both share: True
    where some value had a row per sample and every such value agreed."""
    import numpy as np
    seen, todo = False, [(batch, one)]
    while todo:
        x, y = todo.pop()
        if _is_data(x) and len(x.shape) and x.shape[0] == b:
            if not _is_data(y) or len(y.shape) != len(x.shape) or y.shape[0] != 1:
                return False
            if not _padded_from(np.asarray(_host(x[k])), np.asarray(_host(y[0]))):
                return False
            seen = True
        elif _mapping(x) and _mapping(y):
            if set(x.keys()) != set(y.keys()):
                return False
            todo.extend((x[key], y[key]) for key in x.keys())
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) == b and len(y) == 1 and not any(_is_data(v) for v in x):
                if x[k] != y[0]:
                    return False
                seen = True
            elif len(x) == len(y):
                todo.extend(zip(x, y))
            else:
                return False
    return seen


def _padded_from(a, c):
    """Is a, a row of a batch, the row c of its sample collated alone, padded as a collate pads
    to the batch's longest: c at a's start (or its end: padding on the left) and one value
    past it? A collate that sorts the batch puts a longer sample there, whose extra values
    differ, though its first ones may be c's."""
    import numpy as np
    if a.shape == c.shape:
        return np.array_equal(a, c)
    for left in (False, True):
        ca = tuple(slice(p - min(p, q), p) if left else slice(0, min(p, q))
                   for p, q in zip(a.shape, c.shape))
        cc = tuple(slice(q - min(p, q), q) if left else slice(0, min(p, q))
                   for p, q in zip(a.shape, c.shape))
        if not np.array_equal(a[ca], c[cc]):
            continue
        outside = np.ones(a.shape, dtype=bool)
        outside[ca] = False
        rest = a[outside]
        if not rest.size or np.array_equal(rest, np.full_like(rest, rest[0]),
                                           equal_nan=rest.dtype.kind in "fc"):
            return True
    return False


def _host(x):
    """x on the host, as numpy can read it (a torch tensor copied off its device; a dtype
    numpy lacks, bfloat16, widened)."""
    if hasattr(x, "detach"):
        x = x.detach().resolve_neg().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    return x


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


def batch_samples(batch):
    """How many samples a batch holds: its tensors' rows (a tensor, a mapping, or a list of
    fields as torch's default collate makes of tuples), the length of a list of the samples
    themselves, or of the columns a tuple(zip(*samples)) collate makes; None when it cannot
    tell."""
    b = batch_rows(batch)
    if b is not None or not isinstance(batch, (list, tuple)) or not batch:
        return b
    rows = {v.shape[0] for v in batch if _is_data(v) and len(v.shape)}
    if len(rows) == 1 and all(len(v) in rows for v in batch if isinstance(v, (list, tuple))):
        return rows.pop()  # fields: [inputs, labels, names]
    if isinstance(batch, list):
        return len(batch)  # the samples themselves (collate_fn=lambda b: b)
    inner = {len(v) if isinstance(v, (list, tuple)) else -1 for v in batch}
    # columns of the samples' fields: tuple(zip(*samples))
    return inner.pop() if len(inner) == 1 and -1 not in inner else None


def rows_agree(batch, b, fields=False):
    """The collated batch is a tensor of b rows, or a mapping whose every tensor has b rows
    and every list b items: then b surely is its samples' count. A list or tuple may be the
    batch's fields or its samples themselves (images of 3 channels, say): never sure, unless
    fields says that its loader collates fields (collates_fields()), whose every tensor,
    however nested, then holds b rows."""
    if not _mapping(batch) and not _is_data(batch) and not (
            fields and isinstance(batch, (list, tuple))):
        return False
    return _agree(batch, b, fields) is True


def _agree(v, b, fields):
    """True: v holds tensors, each of b rows (and lists of b items); False: something in it
    has other rows; None: no tensor in it (a list of b items, a scalar)."""
    if _is_data(v):
        return bool(len(v.shape)) and v.shape[0] == b
    if _mapping(v) or (fields and isinstance(v, (list, tuple)) and any(
            _is_data(x) or _mapping(x) or isinstance(x, (list, tuple)) for x in v)):
        said = [_agree(x, b, fields) for x in (v.values() if _mapping(v) else v)]
        return False if False in said else (True if True in said else None)
    if isinstance(v, (list, tuple)):
        return None if len(v) == b else False
    return None


def collates_fields(loader):
    """Does loader make its batches of fields: torch's default collate (each sample's tuple
    or dict of fields stacked field by field, every tensor with one row per sample), or
    Accelerate's dispatcher (each tensor of the batch rank 0 read, sliced alike for each
    rank)? A collate_fn of one's own may return the samples themselves."""
    acc = _accelerate()
    if acc is not None and isinstance(loader, acc.DataLoaderDispatcher):
        return True
    col = sys.modules.get("torch.utils.data._utils.collate")
    fn = getattr(loader, "collate_fn", None)
    return col is not None and fn is not None and fn in (col.default_collate,
                                                         col.default_convert)


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
