# SPDX-License-Identifier: MIT
"""A rank's membership of a group (Group) and its collectives: gather, gather_for_metrics,
eval_pass and eval_loop, pad_across_processes, reduce, broadcast, the object gathers and
barrier. Each call checks its arguments, builds libdeval's options, sends the plain gathers
through the fast path (_plain) and everything else through the general one (_nest's
structures of _tensors' leaves), and turns a failed status into the exception _errors names,
with devald's message. Joining is _join's, spanning machines _span's.
"""

import contextlib
import ctypes
import functools
import math
import os
import pickle

import numpy as np

from . import _loop, _pass, _progress
from ._errors import _ERRORS, Error, InvalidArgument, Mismatch, _said
from ._libdeval import _ORDERS, _REDUCTIONS, MAX_TENSORS, _Bytes, _GatherOpts, _lib, _Tensor
from ._nest import (_check_batch_rows, _check_samples, _data_mask, _flatten, _leaves_at,
                    _object_items, _rebuild, _sends_objects, names_of, refuse_time_major,
                    refuse_unsure_rows)
from ._pass import _LoopPass
from ._plain import _GATHER, _GATHER_FOR_METRICS, _fast_path
from ._tensors import _fill, _result


def _order_code(order):
    """deval_order's number for "rank" or "strided"."""
    if order not in _ORDERS:
        raise InvalidArgument("deval: order must be 'rank' or 'strided', not %r" % (order,), -1)
    return _ORDERS[order]


def _part_opts(opts, at, n):
    """opts for the n tensors from leaf at of a call sent in parts: same_rows's bits are per
    tensor of the call."""
    mask = opts.same_rows
    if not mask or (at == 0 and mask >> n == 0):
        return opts
    part = type(opts).from_buffer_copy(opts)
    part.same_rows = (mask >> at) & ((1 << n) - 1)
    return part


def _refusing(method):
    """A collective method of Group whose InvalidArgument, raised by the binding's own checks
    before the call took its step, still takes it (Group._refuse_call())."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except InvalidArgument as e:
            self._refuse_call(e)
            raise
    return call


class Group:
    """One rank's membership of a group. Not to be shared between threads.

    ``device`` is the CUDA ordinal of a device group's GPU, None for a host group.
    """

    def __init__(self, handle, name, rank, world_size, device=None):
        self._h = handle
        self._pid = os.getpid()  # (a forked child holds none of its parent's groups)
        self.device = device
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.num_processes = world_size  # Accelerate's name
        self.process_index = rank
        self.nodes, self.node = 1, 0  # the machines the group spans, and this one
        self._engine = None
        self._in_pass = False
        self._keyed = False  # the open pass carries dataset indices (eval_loop)
        self._replaying = False  # eval_loop hands the body padding, its calls kept answers
        self._pass_ended = False  # a step failed because a rank left the pass: it is over
        self._left = None  # the failure of a pass this rank left, for its next call
        self._batch_ids = ()  # in a pass with keys: what the current batch is made of
        self._sites = None  # the pass's sites, while a gather for metrics is under way
        self._fast = _fast_path() if device is None else None  # (_speed or a _Fast)
        # what the fast path is given: the handle's address (0 once left), default options
        self._addr = handle.value if self._fast is not None else 0
        self._opts_cache = {}
        self._plain = self._opts()
        self._plain_addr = ctypes.addressof(self._plain)
        self._masked = {}  # same_rows -> default options with it (_masked_addr())

    # -- plumbing

    def _handle(self):
        if not self._h:
            raise _told(InvalidArgument("deval: group %r is closed" % self.name, -1))
        if self._left is not None:  # the pass this rank left failed the others: say so here
            e, self._left = self._left, None
            self._addr = self._h.value if self._fast is not None else 0
            raise _told(e)
        lp = _loop.ACTIVE[-1] if _loop.ACTIVE else None
        if lp is not None and getattr(lp, "refused", None) is not None and lp.g is self:
            raise _told(type(lp.refused)("this rank refused its eval pass at batch %d, which "
                                         "failed it on every rank; the loop's calls fail: %s"
                                         % (lp.batches, lp.refused), lp.refused.status))
        return self._h

    def _left_pass(self, e):
        """This rank left a pass (a break, an exception) that failed the other ranks: its next
        call raises e, so that no rank goes on as if the pass had been whole."""
        e = type(e)("this rank left its last eval pass while the other ranks went on, which "
                    "failed theirs; this rank hears of it at its next call, this one: %s" % e,
                    e.status)
        self._left = e
        self._addr = 0  # (the plain gather's fast path goes through _handle() meanwhile)

    def _check(self, r):
        if r != 0:
            msg = _said(_lib.deval_errmsg(self._h).decode(errors="replace"))
            # a rank left the pass while the others went on: the pass is over on every rank
            if self._in_pass and r == Mismatch.status and _lib.deval_eval_open(self._h) == 0:
                self._pass_ended = True
            e = _told(_ERRORS.get(r, Error)(msg, r))
            if r == InvalidArgument.status:  # (a check's refusal, at its step on every rank)
                self._refuse(e)
            raise e

    def _same_structure(self, what, x, template, leaves):
        """A reduce or broadcast of a nested x makes one step per tensor: where the ranks'
        structures differ (a key one rank lacks; keys in another order go by name, as
        _nest._items() orders them), their steps would pair one rank's tensor with another's
        of another name, or with its next call. So a
        nested x (a tensor alone is not) is checked first, in one step of the binding's own:
        Mismatch on every rank, naming the ranks, where they differ."""
        if template[0] is None or self.world_size < 2:
            return
        mine = ", ".join("%s %s%s" % (where, str(leaf.torch_dtype or leaf.array.dtype).replace(
            "torch.", ""), list(leaf.array.shape)) for (where, _), leaf in zip(_leaves_at(x),
                                                                                leaves))
        mine = "%s{%s}" % (type(x).__name__, mine)
        with self._own_steps():
            said = self._objects(_lib.deval_gather_objects, [mine])
        if len(set(said)) > 1:
            other = next(r for r, s in enumerate(said) if s != said[0])
            raise Mismatch("Group.%s: the ranks' inputs differ in structure (rank 0: %s; "
                           "rank %d: %s): each tensor meets the one at the same place on "
                           "every rank" % (what, said[0][:200], other,
                                                    said[other][:200]), -2)

    def _refuse_call(self, e):
        """e, an InvalidArgument of the binding's own checks in a collective call of its
        user's, raised before the call reached libdeval: the call still takes its step, as a
        refusal (deval_refuse()), so that every rank's call there fails with e's words, and
        the ranks' next calls stay paired (a rank that skipped the step would pair its next
        call with the others' this one: a wrong result, without an error). An error libdeval
        or _handle() raised has taken its step, or takes none (_told())."""
        if getattr(e, "_told", False) or not self._h:
            return
        _told(e)
        _lib.deval_refuse(self._h, str(e).encode(errors="replace"))

    def _refuse(self, e):
        """This rank refuses the current batch of the loop pass it runs with e, an error of its
        own that the others cannot see (a check of its call or of its batch): it leaves the
        pass now, saying why, so that every other rank fails with e's words at its next call
        instead of waiting for this one; this rank's next call raises e again. Outside a loop
        pass (or in a pass already left) nothing. Until the loop ends, this rank's calls raise e
        again (_handle()): the pass they belong to is over."""
        lp = _loop.ACTIVE[-1] if _loop.ACTIVE else None
        if lp is None or getattr(lp, "g", None) is not self or not lp.opened or \
                not self._in_pass or self._pass_ended or lp.refused is not None:
            return
        lp.refused = e
        why = ("rank %d: %s" % (self.rank, e)).encode(errors="replace")
        try:
            with self._own_steps(end=True):
                _lib.deval_eval_abandon_why(self._h, why)
        finally:
            self._in_pass = self._keyed = False
            self._pass_ended = True
        self._addr = 0  # (the plain gather's fast path goes through _handle() meanwhile)

    @contextlib.contextmanager
    def _own_steps(self, end=False):
        """Steps the binding makes of its own (a pass's begin, its loader check, its end) are
        not its user's calls: uncounted, so that a failure names the user's calls by their
        count as the user made them (libdeval's calls.h). A pass's end uncounts one step: the
        others' calls that devald answered for a rank whose loader ran out first stay
        counted, as this rank replays them."""
        before = _lib.dv_calls(self._h)
        try:
            yield
        finally:
            if self._h:
                made = (_lib.dv_calls(self._h) - before) & 0xFFFFFFFF
                _lib.dv_uncount(self._h, min(made, 1) if end else made)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()
        return False

    def __del__(self):
        try:
            self.leave()
        except Exception:
            pass

    def leave(self):
        """Leave the group; the other ranks' next collectives fail with PeerLost."""
        if self._h:
            h, self._h = self._h, None
            self._addr = 0
            _lib.deval_leave(h)

    # -- gathers

    def _gather(self, fn, x, copy, opts, per_sample=False, samples=None, real=None):
        """The general path: any structure of any inputs (the plain ones, when the fast path
        did not take them). samples: a pass's batch samples, where some tensor holds k rows
        of each; each call is then led by a tensor of one row per sample. real: this rank's
        real samples of the batch, for a call past those the pass counts (_site_opts())."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves, self.device is not None)
        n = len(leaves)
        if n == 0:
            raise InvalidArgument("deval: nothing to gather", -1)
        lead = _check_samples(leaves, template, samples) if per_sample else None
        names = names_of(template)
        if names:  # (opts may be shared: a copy, named)
            opts = _GatherOpts.from_buffer_copy(opts)
            opts.names = names
        # a collective carries MAX_TENSORS tensors (a pass with keys sends its keys as one
        # more, a lead its counting tensor): more go as several calls, which gather each
        # tensor alike (in a pass each its own call of the batch, whole samples each); their
        # results are copies, since each call ends the views of the one before
        per = MAX_TENSORS - (self._keyed and fn is _lib.deval_gather_for_metrics) - \
            (lead is not None)
        results = []
        for at in range(0, n, per):
            part = leaves[at:at + per]
            if fn is _lib.deval_gather_for_metrics:
                self._name_site(False, at // per)
            o = self._site_opts(_part_opts(opts, at, len(part)), False, real)
            if lead is None:
                results += self._call(h, fn, part, copy or n > per, o)
            else:
                results += self._call(h, fn, [lead] + part, copy or n > per, o)[1:]
        return _rebuild(template, results)

    def _call(self, h, fn, leaves, copy, opts):
        n = len(leaves)
        ins = (_Tensor * n)()
        outs = (_Tensor * n)()
        for leaf, t in zip(leaves, ins):
            leaf.fill(t, self.device)
        self._check(fn(h, n, ins, ctypes.byref(opts), outs))
        return [_result(leaf, t, copy) for leaf, t in zip(leaves, outs)]

    def _name_site(self, objects, part=0):
        """Tell libdeval the site of the next call for metrics: where the user's code made
        the gather under way (_sites.py), where it is one of an eval_loop's batch."""
        if self._sites is not None:
            _lib.dv_site_next(self._h, int(objects), self._sites.site(int(objects), part))

    def _site_opts(self, opts, objects, real):
        """opts for the next call for metrics in a pass by position: where it is past the
        calls of the batch the pass counts (libdeval says), with valid_rows = real, this
        rank's real samples of the batch (None: not known, and libdeval refuses the call)."""
        if real is None or _lib.dv_site_counted(self._h, int(objects)):
            return opts
        o = type(opts).from_buffer_copy(opts)
        o.valid_rows = real
        return o

    def _opts(self, pad_value=0.0, pad_first=False, valid_rows=None, keep_rows=None,
              order="rank", root=None):
        try:  # (the sign apart: -0.0 equals 0.0, and pads with other bits)
            key = (pad_value, math.copysign(1.0, pad_value), pad_first, valid_rows, keep_rows,
                   order, root)
            o = self._opts_cache.get(key)
        except TypeError:  # an argument that is not hashable or not a number: checked below
            key, o = None, None
        if o is not None:
            return o
        o = self._make_opts(pad_value, pad_first, valid_rows, keep_rows, order, root)
        if key is not None and len(self._opts_cache) < 64:
            try:
                self._opts_cache[key] = o
            except TypeError:
                pass
        return o

    @staticmethod
    def _make_opts(pad_value=0.0, pad_first=False, valid_rows=None, keep_rows=None,
                   order="rank", root=None):
        order = _order_code(order)
        o = _GatherOpts()
        try:
            o.pad_value = float(pad_value)
            o.valid_rows = -1 if valid_rows is None else int(valid_rows)
            o.keep_rows = -1 if keep_rows is None else int(keep_rows)
            o.root = -1 if root is None else int(root)
        except (TypeError, ValueError, OverflowError) as e:  # (refused on every rank)
            raise InvalidArgument("deval: pad_index, valid_rows, keep_rows and root are "
                                  "numbers (%s)" % e, -1) from None
        o.pad_first = bool(pad_first)
        o.order = order
        return o

    @_refusing
    def gather(self, x, copy=True, pad_index=0, pad_first=False, order="rank", valid_rows=None,
               keep_rows=None, root=None):
        """Gather x from every rank: dim 0 concatenated, other ragged dims padded.

        With copy=False, numpy results are read-only views into shared memory, valid until
        the group's next collective; torch results are always copies.
        """
        if self._addr and copy:
            # (an int 0: a float -0.0 equals 0 but pads with other bits)
            if order == "rank" and type(pad_index) is int and pad_index == 0 and \
                    not pad_first and valid_rows is None and keep_rows is None and root is None:
                opts, addr = None, self._plain_addr
            else:
                opts = self._opts(pad_index, pad_first, valid_rows, keep_rows, order, root)
                addr = ctypes.addressof(opts)
            r = self._fast.gather(_GATHER, self._addr, x, addr, False)
            if r is not None:  # (None: not plain, nothing was sent)
                if type(r) is int:
                    self._check(r)
                return r
            if opts is not None:
                return self._gather(_lib.deval_gather, x, copy, opts)
        return self._gather(_lib.deval_gather, x, copy,
                            self._opts(pad_index, pad_first, valid_rows, keep_rows, order, root))

    def gather_for_metrics(self, x, copy=True, use_gather_object=False, pad_index=0,
                           pad_first=False):
        lp = _loop.ACTIVE[-1] if self._in_pass and _loop.ACTIVE else None
        if lp is not None and getattr(lp, "g", None) is self:
            lp.sites.enter()  # (its calls name their sites: _name_site())
            self._sites = lp.sites
        try:
            out = self._gather_for_metrics(x, copy, use_gather_object, pad_index, pad_first)
        except InvalidArgument as e:  # (the binding's own checks: every rank learns them)
            self._refuse_call(e)
            self._refuse(e)
            raise
        finally:
            self._sites = None
        if _loop.ACTIVE:  # (a metric updated with it takes every rank's rows as they are)
            _loop.ACTIVE[-1].gathered.append(out)
        return out

    def _gather_for_metrics(self, x, copy=True, use_gather_object=False, pad_index=0,
                            pad_first=False):
        """Gather x and, inside an eval pass, drop the samples past the dataset's end.

        Inside a pass, every tensor of one call is per sample: dim 0 is the sample dim and
        all tensors of the call have the same rows; a 0-d tensor, or rows that differ, raise
        InvalidArgument naming the tensor (on every rank: the call's step is a refusal).
        Lists of non-tensors (decoded
        text, say) go through gather_object's path, as in Accelerate;
        ``use_gather_object=True`` forces it.
        """
        keyed = self._keyed
        lp = _loop.ACTIVE[-1] if self._in_pass and _loop.ACTIVE else None
        if lp is not None and getattr(lp, "g", None) is not self:
            lp = None
        objects = _sends_objects(x, use_gather_object) if lp is not None else None
        if lp is not None and lp.samples and not objects:
            refuse_time_major(x, lp.samples, lp.current)
        if keyed:
            lp = None
        by_samples = None  # the batch's samples, where some tensor holds k rows of each
        real = lp.real_count() if lp is not None else None
        if lp is not None and lp.counted is not None and any(
                k != 1 for _, k in _pass.same_rows_per_sample(
                    lp, int(objects), _check_batch_rows(x, lp.counted, objects))):
            by_samples = lp.counted
            if self.device is not None:
                raise InvalidArgument(
                    "deval.gather_for_metrics: a device group counts a pass without dataset "
                    "indices by rows, so each tensor needs one row per sample of the batch "
                    "(reshape [batch*k, ...] to [batch, k, ...])", -1)
        elif lp is not None and lp.counted is None and getattr(lp, "items", None) is not None:
            refuse_unsure_rows(x, lp.samples, lp.items, objects)
        # in a pass with keys, the tensors that are the batch's own data: duplicates repeat
        # them (and libdeval, not this rank, checks rows per sample: k whole rows each)
        mask = _data_mask(x, self._batch_ids) if keyed and self._batch_ids else 0
        if not objects:  # (a call of objects names its own site below)
            self._name_site(False)
        if self._addr and copy and not use_gather_object and by_samples is None and (
                real is None or _lib.dv_site_counted(self._h, 0)):
            if type(pad_index) is int and pad_index == 0 and not pad_first:
                addr = self._masked_addr(mask) if mask else self._plain_addr
            else:
                opts = self._opts(pad_index, pad_first)
                if mask:
                    opts = self._make_opts(pad_index, pad_first)
                    opts.same_rows = mask
                addr = ctypes.addressof(opts)  # (opts holds it until the call returns)
            r = self._fast.gather(_GATHER_FOR_METRICS, self._addr, x, addr,
                                  self._in_pass and not keyed)
            if r is not None:  # (None: not plain, nothing was sent)
                if type(r) is int:
                    self._check(r)
                return r
        if objects is None:
            objects = _sends_objects(x, use_gather_object)
        opts = self._opts(pad_index, pad_first)
        if objects and keyed:
            mask = int(id(x) in self._batch_ids)
        if mask:
            opts = self._make_opts(pad_index, pad_first)
            opts.same_rows = mask
        if objects:
            self._name_site(True)
            opts = self._site_opts(opts, True, real)
        if objects and by_samples:  # k items a sample: one object each, flattened back
            k = len(x) // by_samples
            out = self._objects(_lib.deval_gather_objects_for_metrics,
                                [list(x[i:i + k]) for i in range(0, len(x), k)], opts)
            return [v for each in out for v in each]
        if objects:
            return self._objects(_lib.deval_gather_objects_for_metrics, _object_items(x), opts)
        # (with keys, libdeval checks rows per sample: k whole rows each)
        return self._gather(_lib.deval_gather_for_metrics, x, copy, opts,
                            per_sample=self._in_pass and not keyed, samples=by_samples,
                            real=real)

    def _masked_addr(self, mask):
        """The address of default options with same_rows = mask, kept for the group."""
        o = self._masked.get(mask)
        if o is None:
            if len(self._masked) > 64:
                self._masked.clear()
            o = self._masked[mask] = self._make_opts()
            o.same_rows = mask
        return ctypes.addressof(o)

    @staticmethod
    def _pass_args(num_samples, order):
        order = _order_code(order)
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) \
                or num_samples < 0:
            raise InvalidArgument("deval: num_samples must be an int >= 0, not %r"
                                  % (num_samples,), -1)
        return int(num_samples), order

    @contextlib.contextmanager
    def eval_pass(self, num_samples, order="rank"):
        """Inside it, gather_for_metrics returns each of num_samples samples exactly once.

        ONE gather_for_metrics call per batch (a tuple or dict of tensors is one call), ONE
        row per sample: every call's rows count as the next samples of the dataset, and the
        close catches k rows per sample ([batch*k, ...]) or a second call only once the rows
        past the end reach a round of batches. For several calls per batch use
        eval_loop(loader), which knows where batches begin. A rank whose loader runs out
        first may leave the block early (devald answers the others' gathers for it), but its
        results then lack their last batches, so it raises Mismatch: use eval_loop to have
        them replayed. (eval_loop also checks that the pass returned all num_samples
        samples; here a sampler with drop_last may legitimately return fewer.)
        """
        h = self._handle()
        n, o = self._pass_args(num_samples, order)
        with self._own_steps():
            self._check(_lib.deval_eval_begin(h, n, o))
        self._in_pass = True
        try:
            yield self
        except BaseException:
            self._in_pass = False
            with contextlib.suppress(Error), self._own_steps(end=True):  # (the group may be
                self._check(_lib.deval_eval_abandon(self._handle()))  # what failed)
            raise
        self._in_pass = False
        with self._own_steps(end=True):
            self._check(_lib.deval_eval_end(self._handle()))
        missed = _lib.deval_eval_missed(self._h)
        if missed > 0:
            with self._own_steps(end=True):
                _lib.deval_eval_replay_done(self._h)
            raise Mismatch("deval.eval_pass: this rank left the pass %d batches before the "
                           "others, so its results lack theirs; use eval_loop(loader), which "
                           "replays them, or run as many batches on every rank" % missed, -2)

    def eval_loop(self, loader, num_samples=None, order=None, progress=False):
        """Iterate over loader inside an eval pass: ``for batch in g.eval_loop(loader):``.

        The pass opens at the first batch and closes after the last. Any number of
        gather_for_metrics calls per batch are exact: each call of a batch (the first, the
        second, ...) counts its own samples, objects too. num_samples defaults to what the
        loader's shards hold together and order to its sampler's: torch's DistributedSampler
        is "strided" (drop_last honoured), Accelerate's prepared loaders are "rank"; for any
        other loader pass both (over a map-style dataset num_samples is enough: there each
        batch's dataset indices travel with its gathers, rows k per sample: where the sharding
        is known, results in the order one process reads them, each draw of the sampler once,
        else in dataset-index order, each index once).

        A rank whose loader runs out first waits at the end of its loop while devald answers
        the others' gathers for it; then the loop body runs again, once per batch it missed,
        on a batch of one padding sample in the batch's own structure (real_rows() all
        False), and each deval call in them returns what the others got there without a
        collective. So every rank ends with every sample. The body must make the same deval
        calls on every rank. real_rows() tells a batch's real samples from padding.

        progress=True draws one progress bar on rank 0 for the whole pass, every rank's
        samples (tqdm where it is installed), when stderr is a terminal; "always" draws it
        whatever stderr is, a file-like object draws it there.
        """
        if not self._h:
            self._handle()  # (closed; a pass this rank left says so when this one opens)
        wrapper, loader = loader, _loop.unwrapped(loader)  # (iterate the progress bar, if any)
        try:
            n, o = _loop.pass_params(loader, self.world_size)
        except ValueError as e:
            base, num_keys = _loop.map_loader(loader) if self.device is None else (None, None)
            if isinstance(e, _loop.Unsized) and num_samples is not None:
                order = order or e.order  # a sharding it knows, of a dataset with no len()
            # a loader it does not know: the caller's word. Over a map-style dataset each
            # batch's indices say where its samples go, so the order is not needed; how many
            # the ranks hold together is (a shard of its own on each rank reads indices that
            # collide, which only the count reveals)
            alone = _loop.alone(loader) if self.world_size == 1 else None
            if num_samples is None and alone is not None:
                num_samples = alone  # a group of one rank: what its loader holds, all of it
            if isinstance(e, (_loop.ShardedTwice, _loop.ShardedByWorkers)) or \
                    num_samples is None or (
                    base is None and order is None):
                raise InvalidArgument("deval.eval_loop: %s" % e, -1) from None
            n, o = num_samples, order or "rank"
        # a loader it knows contradicted: wrong rows, or samples lost, without a word
        if order is not None and order != o:
            raise InvalidArgument("deval.eval_loop: this loader's sampler gathers in %r order, "
                                  "not %r; leave order out" % (o, order), -1)
        if num_samples is not None and num_samples != n:
            raise InvalidArgument("deval.eval_loop: this loader's shards hold %d samples "
                                  "together, not %r; leave num_samples out" % (n, num_samples),
                                  -1)
        num_samples, order = n, o
        self._pass_args(num_samples, order)  # bad arguments raise here, not at the loop
        try:
            _progress.check(progress)
        except ValueError as e:
            raise InvalidArgument("deval.eval_loop: %s" % e, -1) from None
        return self._run_loop(lambda: iter(wrapper), num_samples, order, loader, progress)

    def _run_loop(self, make_iter, num_samples, order, loader=None, progress=False):
        """The generator behind eval_loop: a pass over the loader, open from its first batch."""
        lp = _LoopPass(self, num_samples, order, loader)
        lp.open_now = True
        lp.progress = progress
        return lp.run(make_iter)

    @_refusing
    def pad_across_processes(self, x, dim=0, pad_index=0, pad_first=False, copy=True):
        """Pad every tensor in x along dim to the largest size any rank has there."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves, self.device is not None)
        results = []
        for leaf in leaves:
            nd = leaf.ndim
            t, out = _Tensor(), _Tensor()
            leaf.fill(t, self.device)
            # (a dim outside the tensor still takes its step: libdeval fails it on every
            # rank where another rank's tensor has that dim)
            self._check(_lib.deval_pad_across_processes(h, ctypes.byref(t), int(dim),
                                                        float(pad_index), bool(pad_first),
                                                        ctypes.byref(out)))
            if dim >= nd or dim < -nd:  # Accelerate returns such a tensor as it is
                if leaf.array is None:
                    results.append(leaf.keep.clone() if leaf.kind == "torch-cuda" else leaf.keep)
                else:
                    results.append(leaf.wrap(leaf.array.copy() if copy else leaf.array))
                continue
            if self._replaying and leaf.array is not None:
                # the answer kept for this rank is its empty part; the body's padding sample
                # is padded as the others were, to go on through the body
                d = dim % nd
                a, width = leaf.array, out.shape[d]
                extra = max(0, width - a.shape[d])
                spec = [(0, 0)] * nd
                spec[d] = (extra, 0) if pad_first else (0, extra)
                results.append(leaf.wrap(np.pad(a, spec, constant_values=pad_index)))
                continue
            results.append(_result(leaf, out, copy))
        return _rebuild(template, results)

    @_refusing
    def reduce(self, x, reduction="sum", scale=1.0):
        """Element-wise reduction over ranks, in rank order; returns new tensors."""
        h = self._handle()
        if reduction not in _REDUCTIONS:
            raise InvalidArgument("deval: reduction must be one of %s, not %r"
                                  % (", ".join(_REDUCTIONS), reduction), -1)
        leaves = []
        template = _flatten(x, leaves)
        self._same_structure("reduce", x, template, leaves)
        results = []
        for leaf in leaves:
            a = leaf.array.copy()
            t = _Tensor()
            _fill(a, leaf.dtype, t)
            self._check(_lib.deval_reduce(h, ctypes.byref(t), _REDUCTIONS[reduction]))
            if scale != 1.0:
                a = a * scale
            results.append(leaf.wrap(a))
        return _rebuild(template, results)

    @_refusing
    def broadcast(self, x, from_process=0):
        """Every rank gets from_process's tensors (same dtypes and shapes on every rank)."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves)
        self._same_structure("broadcast", x, template, leaves)
        results = []
        for leaf in leaves:
            a = leaf.array.copy()
            t = _Tensor()
            _fill(a, leaf.dtype, t)
            self._check(_lib.deval_broadcast(h, ctypes.byref(t), int(from_process)))
            results.append(leaf.wrap(a))
        return _rebuild(template, results)

    # -- objects

    @_refusing
    def _objects(self, fn, items, opts=None):
        h = self._handle()
        blobs = [_pickled(o, i) for i, o in enumerate(items)]
        arr = (_Bytes * max(1, len(blobs)))()
        keep = []
        for b, slot in zip(blobs, arr):
            buf = ctypes.create_string_buffer(b, len(b))
            keep.append(buf)
            slot.data = ctypes.addressof(buf)
            slot.len = len(b)
        n = ctypes.c_size_t()
        out = ctypes.POINTER(_Bytes)()
        opts = opts if opts is not None else self._opts()
        self._check(fn(h, len(blobs), arr, ctypes.byref(opts), ctypes.byref(n),
                       ctypes.byref(out)))
        return [pickle.loads(ctypes.string_at(out[i].data, out[i].len)) for i in range(n.value)]

    def gather_object(self, items):
        """All ranks' lists, concatenated in rank order (objects are pickled). As in
        Accelerate, a tensor or array counts as the list of its rows; any other object as a
        list of one."""
        return self._objects(_lib.deval_gather_objects, _object_items(items))

    @_refusing
    def broadcast_object(self, obj, from_process=0):
        """from_process's object, on every rank."""
        h = self._handle()
        data = _pickled(obj) if self.rank == from_process else b""
        buf = ctypes.create_string_buffer(data, len(data))
        out = _Bytes()
        self._check(_lib.deval_broadcast_bytes(h, buf, len(data), int(from_process),
                                               ctypes.byref(out)))
        return pickle.loads(ctypes.string_at(out.data, out.len))

    def barrier(self):
        """Return once every rank has called it."""
        self._check(_lib.deval_barrier(self._handle()))

    wait_for_everyone = barrier  # Accelerate's name


def _told(e):
    """e, marked as an error every rank that must hear of it has heard of (libdeval's, which
    took its step on every rank) or that takes no step (a closed group's, a left pass's):
    _refuse_call() lets it be."""
    e._told = True
    return e


def _pickled(obj, i=None):
    """obj's pickle; InvalidArgument (a refusal of the call on every rank) where it has none."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise InvalidArgument("deval: %s cannot be pickled (%s: %s)" % (
            "the object" if i is None else "item %d" % i, type(e).__name__, e), -1) from e
