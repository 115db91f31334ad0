# SPDX-License-Identifier: MIT
"""One line to put an Accelerate run's gathers through deval::

    accelerator = Accelerator()
    deval.accelerate.enable(accelerator)     # or enable(trainer) for a transformers Trainer

From then on that Accelerator's gather_for_metrics (tensors, and objects with
use_gather_object or lists of non-tensors), gather, pad_across_processes and reduce run on a
deval group joined from the launcher's environment, and every loader the run iterates
(Accelerate's prepared loaders, and plain DataLoaders over torch's DistributedSampler) is an
eval pass: batch boundaries, the dataset's length and the sharding come from the loader, so
the loop needs no change. Where Accelerate is right the results are the same; where it is
not (a DistributedSampler's padding duplicates, even_batches=False with uneven ranks, several
gather_for_metrics calls per batch) they are exact: every sample once, in dataset order.

One Accelerator per process is enabled (enabling another hands the first back its own
methods); nothing is stored on the Accelerator, which still pickles and copies.
deval.accelerate.disable() undoes it.
"""

import os
import sys

import numpy as np

from . import InvalidArgument, _LoopPass, _loop, _pass, _spans_machines, join
from . import _errors, _nest

__all__ = ["enable", "disable"]

_ACTIVE = None  # the one enabled _State
_ORIG = {}  # class -> its own __iter__, while patched


_Opaque = _pass.Opaque


class _Dispatched(_Opaque):
    """A loader Accelerate dispatches from rank 0 with no len(): its gathers stay Accelerate's,
    which drops the last round's padding by the dispatcher's remainder. The same remainder says
    which rows of a rank's last batch are real, for an attached metric: the round's first
    `remainder` rows are, dealt in rank order, as many to each rank as its batch holds."""

    def __init__(self, loader, rank, world=1):
        super().__init__()
        self.loader, self.rank, self.world = loader, rank, world
        self.rounds = None  # a dispatcher's (_loop.DealtRounds), while it is iterated
        self.why = None  # a round dropped samples: why its gathers for metrics refuse

    def run(self, it):
        if not _loop.dispatched(self.loader):
            yield from super().run(it)
            return
        with _loop.DealtRounds(self.loader) as self.rounds:
            yield from super().run(it)

    def batch(self, batch):
        super().batch(batch)
        if self.rounds is not None and self.why is None:
            try:  # (every rank sees the same round: each refuses at the same gather)
                self.rounds.check(self.world)
            except ValueError as e:
                self.why = "deval.accelerate: %s" % e  # (a training loop goes on)
        self.samples = b = _loop.batch_samples(batch)
        self.real = None if b is None or self.why is not None else \
            _loop.dispatched_real(self.loader, self.rank, b)


class _Streamed(_Dispatched):
    """An iterable with no len() that Accelerate shards on every rank (IterableDatasetShard,
    dispatch_batches=False): each rank reads the whole stream, keeps its slice of each round
    of batches, and pads the last round with the stream's first samples. Nobody knows the
    count when the loop starts, but each rank has read the stream to its end by its last
    batch (DataLoaderShard reads one batch ahead to know it is the last): so each counts what
    its shard reads, and the real samples of the last round, its first ones, become the
    loader's remainder, which Accelerate's gather_for_metrics truncates by, as for a
    dispatched loader. (Each rank counts the same stream, so all set the same remainder.)"""

    def __init__(self, loader, rank, shard):
        super().__init__(loader, rank)
        self.shard = shard
        self.round = shard.batch_size if shard.split_batches else \
            shard.batch_size * shard.num_processes
        self.read = [0]  # the samples the shard read from the stream in this iteration

    def run(self, it):
        with _loop.counted(self.shard) as self.read:
            yield from super().run(it)

    def batch(self, batch):
        if getattr(self.loader, "end_of_dataloader", False):
            n = self.read[0]
            # the last round's samples: 1..round (a full round holds no padding; so does
            # the last round under drop_last, which drops the one short of a round)
            self.loader.remainder = self.round if self.shard.drop_last else \
                n - (n - 1) // self.round * self.round if n else 0
        super().batch(batch)


class _Uncounted(_Opaque):
    """A loader Accelerate shards in a way deval cannot count (skip_first_batches, say): its
    first gather_for_metrics raises why, and an attached metric it updates raises from
    compute(). (A training loader of that kind that feeds no metric runs.)"""

    def __init__(self, why):
        super().__init__()
        self.why = why


class _State:
    def __init__(self, accelerator, group):
        self.accelerator = accelerator
        self.group = group
        self.loops = []  # the hooked loaders being iterated (_LoopPass), innermost last
        self.bases = set()  # ids of the DataLoaders they read, iterated as part of them
        self.methods = {}  # name -> deval's version of the enabled Accelerator's method
        self.trainer = None  # the Trainer enabled with it, and the gather function deval
        self.trainer_gather = None  # gave it (_GatherFunction)

    def innermost(self):
        """The pass of the loader whose batches a gather_for_metrics now gathers: the one
        iterated innermost (an eval loader inside a training loop), opened by this call;
        None, or a _Dispatched loader, whose gathers stay Accelerate's."""
        if not self.loops:
            return None
        lp = self.loops[-1]
        if getattr(lp, "why", None) is not None:  # (_Uncounted; a _Dispatched that lost rows)
            raise InvalidArgument(lp.why, -1)
        if lp is not None and not isinstance(lp, _Dispatched) and not lp.opened:
            if self.group._in_pass:
                raise InvalidArgument(
                    "deval.accelerate: this loader's first gather_for_metrics came while the "
                    "loader around it has a pass open (a training loop that gathers for "
                    "metrics too): deval runs one pass at a time; gather the training loop's "
                    "metrics with accelerator.gather() or reduce(), or outside the loop", -1)
            lp.open()
        return lp


def _recursively(fn, data):
    from accelerate.utils import recursively_apply
    return recursively_apply(fn, data, error_on_other_type=True)


def _each(fn, data):
    """fn on each tensor of data, as Accelerate's recursively_apply rebuilds it, but called in
    the order that pairs the ranks' tensors by name (_nest._items(): a dict's keys sorted),
    not in each rank's own order of its keys."""
    if not _all_tensors(data):
        return _recursively(fn, data)  # (raises as Accelerate does)
    done = {}
    for _, t in _nest._leaves_at(data):
        done[id(t)] = fn(t)
    return _recursively(lambda t: done[id(t)], data)


def _all_tensors(data):
    try:
        _recursively(lambda x: x, data)
        return True
    except TypeError:
        return False


def _constants(lp, objects, data):
    """The ids of data's tensors that carry nothing per sample for a cut to lose: rows all
    one value, a number repeated (the Trainer's loss.repeat(batch_size)). Not where they are
    k per sample as the same value of this call held in the batches before, or, in the first
    batch, a whole number per sample: one sample's k labels, in a last batch of one sample,
    are all one value too."""
    before = dict(lp.rows_per_sample.get((int(objects), lp.sites.call), ()))
    out = set()
    for where, t in _nest._leaves_at(data):
        if not (hasattr(t, "ndim") and t.ndim and t.shape[0] > 1) or \
                not bool((t == t[:1]).all()):
            continue
        k = before.get(where)
        if (t.shape[0] % lp.samples if k is None else t.shape[0] != k * lp.samples):
            out.add(id(t))
    return out


def _whole_rows(g, lp, data, objects):
    """At the last batch of a dispatched or streamed loader, Accelerate's gather_for_metrics
    keeps the first `remainder` rows (or items) of what it gathered, counting each as a
    sample. A value with k rows per sample, one sample after another (generation's k
    sequences each), needs k*remainder kept; one with a number of rows that is not a whole
    multiple of the batch's samples (flattened tokens) would keep padding or lose samples
    without a word, so it is refused (_nest's rule and words), on every rank at once: one
    object gather tells each rank what any rank found (every rank is at that batch, with its
    own rows). Return: the k of each tensor, in _nest._leaves_at()'s order (of the objects,
    the one k), where some k is not 1; else None."""
    if lp.samples is None:
        return None
    ks = None
    try:  # (at every batch, since k must hold from batch to batch; told at the last)
        if not objects:
            _nest.refuse_time_major(data, lp.samples, lp.current)
        const = set() if objects else _constants(lp, objects, data)
        said = _pass.same_rows_per_sample(lp, int(objects), _nest._check_batch_rows(
            data if objects else _recursively(lambda t: None if id(t) in const else t, data),
            lp.samples, objects))
        if any(k != 1 for _, k in said):
            if objects:
                ks = [len(data) // lp.samples]
            else:
                leaves = [t for _, t in _nest._leaves_at(data)]
                ks = [1 if id(t) in const else t.shape[0] // lp.samples for t in leaves]
    except InvalidArgument as e:
        lp.why_rows = getattr(lp, "why_rows", None) or str(e)
    if not getattr(lp.loader, "end_of_dataloader", False):
        return None
    why = getattr(lp, "why_rows", None)
    said = g.gather_object([(why, ks)])
    bad = [(r, w) for r, (w, _) in enumerate(said) if w]
    if not bad:
        bad = [(r, "it holds %s rows per sample where rank 0 holds %s" % (k or 1, said[0][1] or 1))
               for r, (_, k) in enumerate(said) if k != said[0][1]]
    if bad:
        rank, words = bad[0]
        raise InvalidArgument("deval.accelerate: at the last batch, which Accelerate cuts to "
                              "its remainder, rank %d: %s" % (rank, words), -1)
    return said[0][1]


def _after_loop(g, data):
    """gather_for_metrics after a loop, of rows a rank concatenated from its batches: where
    every tensor of data, on every rank, holds k rows per sample of the batches the rank's
    loop took (_loop.TAPE: their keys and real samples, told by a sharding deval knows),
    every rank's real samples' rows, in one process's order (the keys'), the padding left
    out, as the same gathers inside the loop return them. Accelerate's own gathers every
    rank's rows, the padding's too. None (on every rank alike) where some rank's rows are
    not so."""
    tape = _loop.TAPE[0]
    said = [_loop.taped(tape, t.shape[0] if t.ndim else 0) for _, t in _nest._leaves_at(data)]
    if not all(g.gather_object([bool(said) and all(said)])):  # (one rank's rows are not its
        return None                                           # batches': none's)
    keys, real, _ = said[0]
    import torch
    order = torch.from_numpy(np.argsort(g.gather(keys[real]), kind="stable"))

    def one(t):
        k = t.shape[0] // len(keys)
        mine = t[torch.from_numpy(np.repeat(real, k)).to(t.device)]
        out = g.gather(mine.contiguous())
        at = (order[:, None] * k + torch.arange(k)).reshape(-1) if k > 1 else order
        out = out[at.to(out.device)]
        out._deval_every_rank = True  # (a metric's update after the loop takes it whole)
        return out
    return _each(one, data)


def _cut_by(accelerator, own, loader, data, ks, use_gather_object):
    """Accelerate's own gather_for_metrics of data at the last batch, keeping k*remainder
    rows of each tensor that holds k rows per sample (ks: _whole_rows())."""
    def cut(k, x, **kw):
        remainder = loader.remainder
        if remainder > 0:
            loader.remainder = remainder * k
        try:
            return own(accelerator, x, **kw)
        finally:
            loader.remainder = remainder
    if len(set(ks)) == 1:
        return cut(ks[0], data, use_gather_object=use_gather_object)
    each = iter(ks)  # (each tensor's own call, in the same order on every rank)
    return _each(lambda t: cut(next(each), t), data)


def _make_methods(st):
    g = st.group

    def gather(tensor):
        """Accelerate's gather: each tensor concatenated along dim 0 (a 0-d one as one row)."""
        return _each(g.gather, tensor)

    def gather_for_metrics(input_data, use_gather_object=False):
        lp = st.innermost()
        if lp is None and st.loops:
            # a loop deval runs no pass over (a process alone, a loader Accelerate did not
            # shard) keeps Accelerate's gather for metrics, over deval's gather: alone, it
            # cuts the last batch to the loader's remainder (a Trainer's repeated loss)
            own = _METHODS_ORIG[(_patched_class(st.accelerator), "gather_for_metrics")]
            return own(st.accelerator, input_data, use_gather_object=use_gather_object)
        if isinstance(lp, _Dispatched):  # Accelerate's own, over deval's gather
            lp.sites.enter()
            objects = use_gather_object or not _all_tensors(input_data)
            ks = _whole_rows(g, lp, input_data, objects)
            own = _METHODS_ORIG[(_patched_class(st.accelerator), "gather_for_metrics")]
            if ks is None:
                out = own(st.accelerator, input_data, use_gather_object=use_gather_object)
            else:
                out = _cut_by(st.accelerator, own, lp.loader, input_data, ks,
                              use_gather_object)
            lp.gathered.append(out)  # (a metric updated with it takes every rank's rows)
            return out
        if use_gather_object or not _all_tensors(input_data):
            if not g._in_pass:  # Accelerate's gather_object
                return g.gather_object(input_data)
            return g.gather_for_metrics(input_data, use_gather_object=True)
        if not g._in_pass:
            out = None if _loop.TAPE[0] is None or st.loops else _after_loop(g, input_data)
            return gather(input_data) if out is None else out
        return g.gather_for_metrics(input_data)

    def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
        return _each(lambda t: g.pad_across_processes(t, dim=dim, pad_index=pad_index,
                                                      pad_first=pad_first), tensor)

    def reduce(tensor, reduction="sum", scale=1.0):
        """Accelerate's reduce over torch.distributed: max, or a sum (divided by the number of
        processes for "mean"); scale only applies on TPUs there, so not here either."""
        def one(t):
            if reduction == "max":
                return g.reduce(t, "max")
            out = g.reduce(t, "sum")
            if reduction == "mean":
                out /= g.world_size
            return out
        return _each(one, tensor)

    def backward(loss, **kwargs):
        """Accelerate's own. The loop it runs in trains: an attached metric takes what it is
        given there, as without deval (the batches a training loop draws are not one
        process's, so no value of theirs is; deval.torchmetrics)."""
        if _loop.ACTIVE:
            _loop.ACTIVE[-1].trains = True
        own = _METHODS_ORIG[(_patched_class(st.accelerator), "backward")]
        return own(st.accelerator, loss, **kwargs)

    return {"gather": gather, "gather_for_metrics": gather_for_metrics,
            "pad_across_processes": pad_across_processes, "reduce": reduce,
            "backward": backward}


_METHODS = ("gather", "gather_for_metrics", "pad_across_processes", "reduce", "backward")
_METHODS_ORIG = {}  # (class, name) -> Accelerate's own function, while patched


def _patched_class(accelerator):
    """Where the methods are switched: Accelerate's Accelerator (a subclass's instances go
    through it too), or the object's own class when it is not one."""
    import accelerate
    cls = accelerate.Accelerator
    return cls if isinstance(accelerator, cls) else type(accelerator)


def _switch(cls):
    """Switch cls's methods: on the enabled Accelerator they run deval's, on any other
    Accelerate's own. Nothing is put on the instance, so it still pickles and copies."""
    import functools
    for name in _METHODS:
        if (cls, name) in _METHODS_ORIG:
            continue
        own = getattr(cls, name)
        _METHODS_ORIG[(cls, name)] = own

        def method(self, *args, _name=name, _own=own, **kwargs):
            st = _ACTIVE
            if st is None or st.accelerator is not self:
                return _own(self, *args, **kwargs)
            try:
                return st.methods[_name](*args, **kwargs)
            except _errors.Error as e:
                peer = _peer_error(e)
                if peer is None:
                    raise
                raise peer.with_traceback(e.__traceback__) from None

        functools.update_wrapper(method, own)
        setattr(cls, name, method)


def _peer_classes():
    """The classes Accelerate's own code raises where deval raises its: ranks that disagree
    (Accelerate's debug mode, operations.DistributedOperationException), and a peer or the
    transport lost (torch.distributed's DistBackendError)."""
    import torch.distributed as dist
    from accelerate.utils.operations import DistributedOperationException
    return {_errors.Mismatch: DistributedOperationException,
            _errors.PeerLost: dist.DistBackendError, _errors.DaemonLost: dist.DistBackendError,
            _errors.Timeout: dist.DistBackendError}


def _peer_class(ours):
    """deval's class ours, made a subclass of the class Accelerate raises in its place too;
    None where it has none. It is this module's (deval.accelerate.Mismatch, ...), made on
    first use in each process (through __getattr__ when a pickle names it), so it pickles."""
    theirs = _peer_classes().get(ours)
    if theirs is None:
        return None
    cls = _PEERS.get(ours)
    if cls is None:
        cls = _PEERS[ours] = type(ours.__name__, (ours, theirs), {
            "__module__": __name__, "__doc__": "%s; also Accelerate's %s" % (
                (ours.__doc__ or ours.__name__).rstrip("."), theirs.__name__)})
    return cls


_PEERS = {}  # deval's class -> _peer_class()'s


def __getattr__(name):
    ours = getattr(_errors, name, None)
    cls = _peer_class(ours) if isinstance(ours, type) else None
    if cls is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    return cls


def _peer_error(e):
    """e as an instance of its deval class and of the class Accelerate raises in its place,
    so that code catching either catches it; None where Accelerate has no class of its own."""
    cls = _peer_class(type(e))
    return cls(str(e), e.status) if cls is not None else None


def _unswitch():
    for (cls, name), own in list(_METHODS_ORIG.items()):
        setattr(cls, name, own)
        del _METHODS_ORIG[(cls, name)]


def _hooked_iter(cls):
    orig = _ORIG[cls]

    def __iter__(self):
        st = _ACTIVE
        if st is None or id(self) in st.bases:  # the DataLoader a hooked loader reads
            yield from orig(self)
            return
        try:
            params = _loop.pass_params(self, st.group.world_size)
        except (_loop.ShardedTwice, _loop.ShardedByWorkers) as e:
            # a training loop over it runs; its first gather_for_metrics refuses, on every
            # rank alike (they share the loader's settings)
            params = _Uncounted("deval.accelerate: %s" % e)
        except _loop.Uncountable:
            # an iterable with no len() sharded on every rank, read in this process (not by
            # workers: ShardedByWorkers): counted as it is read
            params = _Streamed(self, st.group.rank, self.dataset)
        except _loop.Unsized:
            # sharded, but not counted: Accelerate's own remainder
            params = _Dispatched(self, st.group.rank, st.group.world_size)
        except ValueError as e:
            params = None  # not a sharded loader (one process, say): Accelerate's behaviour
            if st.group.world_size > 1 and cls is not tud_loader():
                # sharded by Accelerate, but not in a way deval can count: Accelerate's own
                # remainder would keep the padding it cannot see either
                params = _Uncounted(
                    "deval.accelerate: %s; under deval.accelerate.enable() iterate it with "
                    "g.eval_loop(loader, num_samples=...), or prepare a loader without it" % e)
        # a pass of its own, opened by the first gather_for_metrics of this iteration; None:
        # a loader whose gathers keep Accelerate's behaviour, and hide outer loaders' passes
        lp = params if params is None or isinstance(params, _Opaque) else \
            _LoopPass(st.group, *params, self)
        base = getattr(self, "base_dataloader", None)
        st.loops.append(lp)
        if base is not None:
            st.bases.add(id(base))
        try:
            if lp is None:
                yield from orig(self)
            elif isinstance(lp, _Opaque):
                yield from lp.run(orig(self))
            else:
                yield from lp.run(lambda: orig(self))
        finally:
            _remove(st.loops, lp)
            if base is not None:
                st.bases.discard(id(base))

    __iter__.__wrapped__ = orig
    return __iter__


def tud_loader():
    return sys.modules["torch.utils.data"].DataLoader


def _remove(loops, lp):
    for i in range(len(loops) - 1, -1, -1):
        if loops[i] is lp:
            del loops[i]
            return


def _hook_loaders():
    import accelerate.data_loader as adl
    import torch.utils.data as tud

    classes = [adl.DataLoaderShard, adl.DataLoaderDispatcher]
    for cls in classes:
        if cls not in _ORIG:
            _ORIG[cls] = cls.__dict__["__iter__"]
            cls.__iter__ = _hooked_iter(cls)
    if tud.DataLoader not in _ORIG:
        orig = tud.DataLoader.__dict__["__iter__"]
        _ORIG[tud.DataLoader] = orig

        def __iter__(self):
            # a plain DataLoader over torch's DistributedSampler; the rest is untouched
            if _ACTIVE is None or id(self) in _ACTIVE.bases:
                return orig(self)
            if _loop._dist_sampler(self) is None:
                return _unhooked(orig, self)
            return _hooked_iter(tud.DataLoader)(self)

        __iter__.__wrapped__ = orig
        tud.DataLoader.__iter__ = __iter__


def _unhooked(orig, loader):
    """A loader iterated under an enabled Accelerator that is no eval pass (not sharded by
    deval's knowing): its gathers are Accelerate's, not counted in a loader around it."""
    st = _ACTIVE
    st.loops.append(None)
    try:
        yield from orig(loader)
    finally:
        _remove(st.loops, None)


def _unhook_loaders():
    for cls, orig in list(_ORIG.items()):
        cls.__iter__ = orig
        del _ORIG[cls]


class _GatherFunction:
    """A Trainer class's gather_function while deval.accelerate is enabled for one of its
    trainers (_State.trainer): what the trainer sets it to, but where that is its enabled
    Accelerator's plain gather, deval's gather_for_metrics (_State.trainer_gather).
    Seq2SeqTrainer's evaluate() and predict() set it to accelerator.gather each time, so
    that no sample is dropped; Accelerate's gather keeps the last round's padding too, and
    deval's gather_for_metrics keeps each sample once. Kept in the trainer's __dict__, as
    before, so that the trainer pickles and copies as it did."""

    def __init__(self, own):
        self.own = own  # (the class's own attribute, where it had one: given back)

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        try:
            fn = obj.__dict__["gather_function"]
        except KeyError:
            if self.own is None:
                raise AttributeError("gather_function") from None
            return self.own.__get__(obj, cls) if hasattr(self.own, "__get__") else self.own
        st = _ACTIVE
        if st is not None and obj is st.trainer and \
                getattr(fn, "__self__", None) is st.accelerator and \
                getattr(fn, "__name__", None) == "gather":
            return st.trainer_gather
        return fn

    def __set__(self, obj, value):
        obj.__dict__["gather_function"] = value

    def __delete__(self, obj):
        del obj.__dict__["gather_function"]


def _guard_gather_function(trainer):
    """Install _GatherFunction on trainer's class while enabled (_unguard(): given back)."""
    cls = type(trainer)
    if isinstance(cls.__dict__.get("gather_function"), _GatherFunction):
        return
    _GUARDED.append((cls, cls.__dict__.get("gather_function")))
    setattr(cls, "gather_function", _GatherFunction(cls.__dict__.get("gather_function")))


def _unguard():
    while _GUARDED:
        cls, own = _GUARDED.pop()
        if own is None:
            delattr(cls, "gather_function")
        else:
            setattr(cls, "gather_function", own)


_GUARDED = []  # (class, its own gather_function or None) of the classes _GatherFunction holds


def enable(obj, group=None, socket=None, timeout=None):
    """Make obj's gathers go through deval for the rest of the run; return the deval Group.

    obj is an accelerate.Accelerator, or anything holding one as .accelerator (a
    transformers Trainer: its gather function is switched too). group names the deval group
    (default: derived from the launcher's environment, the same on every rank of this job
    and on no other job); socket and timeout are deval.join's.
    """
    global _ACTIVE
    accelerator = getattr(obj, "accelerator", obj)
    if not hasattr(accelerator, "gather_for_metrics") or not hasattr(accelerator,
                                                                       "process_index"):
        raise InvalidArgument("deval.accelerate.enable: %s is not an Accelerator (nor holds "
                              "one as .accelerator)" % type(obj).__name__, -1)
    if _ACTIVE is not None:
        if _ACTIVE.accelerator is accelerator:
            return _ACTIVE.group
        disable()  # the newest Accelerator of the process takes over (the old one: its own)
    # with no group, libdeval names it after the job that torchrun (or accelerate launch,
    # mpirun, srun) started; a job torchrun runs on several machines gets a group across them,
    # through the process group the Accelerator made
    if _spans_machines() is not None:
        g = join(group, socket=socket, timeout=timeout)
    else:
        said = os.environ.get("WORLD_SIZE", "")
        if accelerator.num_processes == 1 and said.isdigit() and int(said) > 1:
            raise InvalidArgument(
                "deval.accelerate.enable: the launcher started %s processes ($WORLD_SIZE), "
                "but this Accelerator runs alone (num_processes 1): it did not set up "
                "distributed evaluation, so every rank would take part as rank 0. On CPU, make "
                "it with Accelerator(cpu=True) or set ACCELERATE_USE_CPU=true" % said, -1)
        if group is None and accelerator.num_processes == 1:
            # a process on its own (python script.py) has no launcher to name its job, and a
            # group of one shares nothing with anybody: it gets a name of its own
            group = "accelerate-solo-%d-%s" % (os.getpid(), os.urandom(4).hex())
        g = join(group, accelerator.process_index, accelerator.num_processes, socket=socket,
                 timeout=timeout)
    st = _State(accelerator, g)
    st.methods = _make_methods(st)
    _switch(_patched_class(accelerator))
    _hook_loaders()
    _ACTIVE = st
    if obj is not accelerator and hasattr(obj, "gather_function"):
        # a Trainer keeps its own reference to the gather function
        import functools
        import inspect
        fn = accelerator.gather_for_metrics
        args = getattr(obj, "args", None)
        if "use_gather_object" in inspect.signature(fn).parameters and args is not None:
            fn = functools.partial(fn, use_gather_object=getattr(
                args, "eval_use_gather_object", False))
        obj.gather_function = fn
        st.trainer, st.trainer_gather = obj, fn
        _guard_gather_function(obj)
    return g


def disable():
    """Give the enabled Accelerator its own methods back and leave the deval group."""
    global _ACTIVE
    st, _ACTIVE = _ACTIVE, None
    if st is None:
        return
    _unhook_loaders()
    _unswitch()
    _unguard()
    st.group.leave()
