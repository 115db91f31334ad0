# SPDX-License-Identifier: MIT
"""An eval pass that follows a loader's iteration (_LoopPass): Group.eval_loop's, open from the
first batch, and deval.accelerate's hooked loaders', open at the first gather_for_metrics of
an iteration. It tells libdeval where each batch begins (with the batch's dataset indices
where the loader has them), closes the pass after the last batch, and replays the batches a
rank missed; real_rows() reads which samples of the current batch are real. What a loader is
made of (its dataset, sampler, sharding) is _loop's to find out; this module is the glue
between that and a group's calls.
"""

import contextlib
import ctypes
import sys

import numpy as np

from . import _collate, _loop, _progress, _roots, _sites
from ._errors import Error, InvalidArgument, Mismatch
from ._libdeval import _ORDERS, _REDUCTIONS, _lib, _Tensor
from ._tensors import _NP_TO_DEVAL, _fill

_END = object()
_LEVELS = 4  # datasets a part was cut from that ranks compare, from the root (_same_loop)


class _LoopPass:
    """One iteration of a loader as an eval pass: eval_loop's (open from the first batch) or
    a loader deval.accelerate hooked (open at the first gather_for_metrics of the iteration,
    so that a loader iterated without one, a training loader, opens nothing). Over a
    map-style DataLoader each batch's dataset indices travel with its gathers (a pass with
    keys): results in dataset order, each sample once, whatever shifted."""

    def __init__(self, group, num_samples, order, loader=None):
        self.g = group
        self.n, self.o = group._pass_args(num_samples, order)
        base, self.num_keys = _loop.map_loader(loader) if loader is not None and \
            group.device is None else (None, None)
        draws = _loop.draws(loader, base) if base is not None else None
        if draws is not None:
            self.num_keys = draws.n  # a sample is a draw of the sampler the ranks share
        if loader is not None:
            try:
                _loop.check_loader(loader, draws is not None, base is not None)
            except ValueError as e:
                raise InvalidArgument("deval.eval_loop: %s" % e, -1) from None
        self.keys = _loop.Keys(base, getattr(loader, "skip_batches", 0), draws) \
            if base is not None else None
        # where the rows of an iterable Accelerate shards stand, to tell its padding; or
        # whether rank 0 deals them, and says at the end how many were real
        self.rows = _loop.shard_rows(loader) if loader is not None and self.keys is None \
            else None
        self.dealt_by_0 = self.keys is None and _loop.dispatched(loader)
        self.rounds = None  # its rounds (_loop.DealtRounds), while it is iterated
        self.read = None  # what its stream held so far, where it shards one (_loop.counted)
        # samples this rank's batches held so far, where the pass deals by stride: its j-th
        # is the pass's j*W + rank, padding from n on (eval_loop's, which opens at once)
        self.mine = 0 if self.o == _ORDERS["strided"] and self.keys is None and \
            self.rows is None and not self.dealt_by_0 else None
        self.dealt = 0  # samples of the iterable so far
        self.before = 0  # samples of the batches before the pass opened (no keys); None: unknown
        self.order_kept = None  # the collate keeps the draws' order (_collate); None: not told
        self.real = None  # the current batch's real samples (a bool array), when known
        self.samples = None  # how many samples the current batch holds, when known
        self.counted = None  # the same, where each of the batch's tensors says it (no keys)
        # where it is a list or tuple whose count is not sure (no keys): its length, the count
        # if it holds the samples themselves rather than fields of self.samples samples each
        self.items = None
        self.gathered = []  # what the current batch's gathers for metrics returned
        self.sites = _sites.Sites()  # where its gathers for metrics are made (_sites.py)
        self.rows_per_sample = {}  # each call's, in the batches so far (same_rows_per_sample)
        self.seq = None  # which of this process's loops it is
        self.progress = False  # eval_loop's progress argument (_progress.py)
        self.bar = None
        self.loader = loader
        # its batches are fields, each tensor one row per sample (a list of them too)
        self.fields = loader is not None and _loop.collates_fields(loader)
        self.ident = None  # which loader (_loop.loader_number())
        self.open_now = False  # eval_loop: the pass opens before the first batch
        self.opened = False
        self.batches = 0  # batches yielded so far
        self.cur = None  # the current batch's keys
        # each batch's keys and real samples, where a known sharding says both: what rows
        # concatenated from the loop's batches hold (deval.accelerate's gather after the loop)
        self.tape = []
        self.current = None  # the current batch, as the loader gave it
        self.journaled = False  # the pass keeps a resume journal (libdeval's resume.c)
        self.resumed = 0  # the pass's first batches answered from a run that stopped
        self.first = 0  # self.batches before the pass's first batch
        self.pad_now = False  # the body gets a padding sample for the current batch
        self.keeps = False  # the pass keeps the random generators' state in its journal
        self.rng_at_open = self.rng_kept = None  # their state at the open; the last kept
        self.refused = None  # the error of its own this rank left the pass with (_refuse())
        self.broken = None  # a batch's identity failed before the pass opened: its error
        # called when the loop ran out with its pass never opened, where something in it
        # must hear whether the other ranks' loops ran out too (deval.torchmetrics' syncs)
        self.at_end = None

    def open(self, batch=None):
        """Open the pass now (at the current batch, or before batch, the first), once."""
        if self.opened:
            return
        g = self.g
        # a pass this rank left failed the others (_left_pass): say so on this rank, but in
        # step with them, who open this pass now; leaving it at once fails theirs too
        left, g._left = g._left, None
        h = g._handle()
        if left is not None:
            g._addr = h.value if g._fast is not None else 0
        if g._in_pass:
            raise InvalidArgument("deval.eval_loop: an eval pass is already open on this group "
                                  "(an eval_loop inside another, inside eval_pass, or one left "
                                  "with break whose iterator is still referenced: close it with "
                                  "its .close()); a group runs one pass at a time", -1)
        before = (self.before if self.batches > 1 else 0) if self.keys is None else 0
        if before is None:
            raise InvalidArgument(
                "deval: the first gather_for_metrics of this loader's iteration came at its "
                "batch %d; its batches carry no dataset indices, and deval cannot count the "
                "samples of the batches before, which the pass must leave out: gather from its "
                "first batch on" % self.batches, -1)
        chain = self._chain()
        root = chain[-1] if chain else None
        with g._own_steps():
            shared, common = self._same_loop(
                h, 0 if root is None else _roots.root_digest(root), before,
                [_roots.root_digest(c) for c in chain[:_LEVELS]])
            if self.keys is not None:
                near = None if shared else _roots.nearest(chain, common, root)
                short = self._name_samples(root, shared, near)
                try:  # (a rank that refuses opens the pass too, then leaves it, saying why)
                    g._check(_lib.deval_eval_begin_keys(h, self.n, max(self.n, self.num_keys)))
                except Mismatch:
                    if short is None:
                        raise
                    raise short from None  # (the others' begin says the ranks' counts differ)
                self.broken = self.broken or short
                self._resume(h, batch if batch is not None else self.current)
            else:
                # the batches before this gather were whole rounds (only the last one pads),
                # as many samples on every rank (_same_loop checked): the pass is the rest
                g._check(_lib.deval_eval_begin(h, self.n - before * g.world_size, self.o))
        if left is not None:
            with contextlib.suppress(Error), g._own_steps(end=True):
                g._check(_lib.deval_eval_abandon(h))
            raise type(left)("%s. This pass fails on every rank too, so that each learns it at "
                             "the same call; the next one runs" % left, left.status)
        self.opened = True
        g._in_pass, g._keyed = True, self.keys is not None
        if self.broken is not None:
            # a batch before this gather could not be told apart: this pass cannot be exact,
            # and every rank learns why now, at the open it made with the others
            g._refuse(self.broken)
            raise self.broken
        if self.batches:
            self._declare()

    def _kept(self, n):
        """Is the loader's batch n answered from the journal of a run that stopped?"""
        return self.opened and 0 < n - self.first <= self.resumed

    def _end_body(self):
        """The body of the current batch is done. A batch answered from the journal takes
        back the random generators' state the run that stopped had here; any other keeps
        its own, when it changed, for a later run to take back (the bodies of the batches
        answered from the journal run on one sample, so they draw otherwise)."""
        if not self.keeps:
            return
        h = self.g._handle()
        if self._kept(self.batches):
            data, n = ctypes.c_void_p(), ctypes.c_size_t()
            r = _lib.deval_eval_kept_state(h, ctypes.byref(data), ctypes.byref(n))
            _rng_set(ctypes.string_at(data.value, n.value) if r > 0 else self.rng_at_open)
            return
        now = _rng_state()
        if now is None or _rng_same(now, self.rng_kept):
            return
        blob = _rng_pack(now)
        if _lib.deval_eval_batch_state(h, blob, len(blob)) <= 0:
            self.keeps = False  # (no journal, or it stopped: nothing more is kept)
        self.rng_kept = now

    def _resume(self, h, batch):
        """The batches of this pass that a run of the job that stopped already did, which
        libdeval answers from its journal: the body gets a batch of one padding sample for
        them, as in a replay."""
        note = ctypes.create_string_buffer(768)
        self.first = max(self.batches - 1, 0)
        # what the pass reads, and where the job stands: torch's generators have drawn
        # otherwise before another evaluation of the same loader (a later epoch's) or under
        # another seed
        rng = _rng_state()
        where = _loop.digest([p.numpy().tobytes() for p in rng or ()])
        k = _lib.deval_eval_resume(h, _loop.digest(batch), where, note, len(note))
        if k < 0:
            self.g._check(k)
        self.resumed = k
        self.journaled = _lib.deval_eval_journaled(h) == 1
        self.rng_at_open = self.rng_kept = _rng_state() if self.journaled else None
        self.keeps = self.rng_at_open is not None
        if note.value and self.g.rank == 0:
            print(note.value.decode(errors="replace"), file=sys.stderr, flush=True)

    def _chain(self):
        """The datasets the dataset whose indices key this pass was cut from, its own Root
        last (_roots.chain_of()), or [] where its keys are no dataset's indices (no keys, or
        the draws of a sampler the ranks share)."""
        if self.keys is None or self.keys.draws is not None:
            return []
        return _roots.chain_of(self.keys.base.dataset)

    def _name_samples(self, root, shared, near=None):
        """Which indices key the pass: the dataset's own where every rank reads it alike
        (shared: results in its order, as one process reads it), else those of the nearest
        dataset the ranks' parts were cut from (near: _roots.nearest()'s places in it and its
        size; a split of a dataset, split again by rank), else those of their root, which
        name each sample alike whichever rank reads it. Sets num_keys; returns the refusal of
        a rank whose indices cannot name the pass's samples (InvalidArgument), or None."""
        if near is not None:
            self.keys.index, self.num_keys = near
        elif root is not None and not shared:
            self.num_keys = root.size
            if root.index is not None:
                twice = _roots.repeated(root.index)
                if twice is not None:
                    return InvalidArgument(
                        "deval.eval_loop: this rank's dataset holds sample %d of the dataset it "
                        "was cut from twice (a Subset or ConcatDataset that repeats an index), "
                        "and the ranks read parts of their own, which only that dataset's "
                        "indices tell apart: one process would count both, a pass with keys "
                        "one; give each rank a part without repeats, or every rank the whole "
                        "dataset behind a DistributedSampler" % twice, -1)
                self.keys.index = root.index
        if self.n <= self.num_keys:
            return None
        return InvalidArgument(
            "deval.eval_loop: num_samples is %d, but this rank's dataset holds %d samples: its "
            "indices name the samples, so every rank must read the whole dataset, or a part of "
            "it that says where its samples lie in it (a Subset, a ConcatDataset of Subsets of "
            "it, a `datasets` shard of a dataset loaded from disk or with an indices mapping); "
            "a dataset of its own on each rank, or a contiguous shard of a `datasets` Dataset "
            "held in memory, does not (shard it with contiguous=False, or give every rank the "
            "whole dataset behind a DistributedSampler)" % (self.n, self.num_keys), -1)

    def _same_loop(self, h, dataset=0, before=0, levels=()):
        """Every rank opens the pass of the same loader: a rank that left a loop before it
        opened its pass (a break at its first batch, a shard with no batch) would otherwise
        meet the others' pass with its next loader's, and each would get the other's samples.
        One reduce per pass, before it opens; every rank raises alike. It also tells whether
        every rank reads its dataset alike (dataset, _roots.root_digest(), equal on every
        rank): True then; and checks that every rank read as many samples before the pass
        (before: a loader without indices whose first gather came after its first batch).
        Returns that, and how many of levels (the digests of the datasets the rank's was cut
        from, _roots.chain_of()'s, the root first) every rank's chain begins with."""
        a = self.ident or 0
        lv = [d for c in list(levels[:_LEVELS]) + [0] * (_LEVELS - len(levels)) for d in (c, -c)]
        v = np.array([a, -a, dataset, -dataset, before, -before] + lv, dtype=np.int64)
        t = _Tensor()
        _fill(v, _NP_TO_DEVAL[v.dtype], t)
        try:
            self.g._check(_lib.deval_reduce(h, ctypes.byref(t), _REDUCTIONS["max"]))
        except Error as e:  # the user called eval_loop, not reduce
            raise type(e)(str(e).replace(
                "Group.reduce: ", "Group.eval_loop (its reduce that checks every rank opens "
                "the pass of the same loader): ", 1), e.status) from None
        if v[0] == -v[1] and (v[4] != -v[5] or before * self.g.world_size > self.n):
            raise Mismatch(
                "deval: the first gather_for_metrics of this loader's iteration came after "
                "its first batch, and the ranks read %d to %d samples before it (of %d in "
                "all): the batches before a pass of a loader without dataset indices must be "
                "whole rounds, as many samples on every rank; gather from its first batch on"
                % (-v[5], v[4], self.n), -2)
        if v[0] == -v[1]:
            common = 0
            while common < _LEVELS and v[6 + 2 * common] and \
                    v[6 + 2 * common] == -v[7 + 2 * common]:
                common += 1
            return v[2] == -v[3], common
        raise Mismatch(
            "deval: the ranks opened the eval passes of different loaders: this rank's is "
            "loader #%d, another rank's loader #%d (numbered in the order each process first "
            "iterated them). A rank left a loop before its first gather_for_metrics (a break "
            "at its first batch, or a shard with no batch: even_batches=False), or iterated a "
            "loader the others did not, so its next loop met the others' pass. Leave every "
            "loop at the same batch on all ranks, give every rank a batch, or use "
            "Group.eval_loop, whose pass opens before the first batch"
            % (a, v[0] if v[0] != a else -v[1]), Mismatch.status)

    def _declare(self):
        h = self.g._handle()
        if self.keys is None:
            self.g._check(_lib.deval_eval_batch(h))
            return
        ks = self.cur or ()
        if self.pad_now:
            ks = ks[:1]  # (the padding sample the body gets)
        ks = self.keys.named(ks)
        arr = (ctypes.c_int64 * max(1, len(ks)))(*ks)
        self.g._check(_lib.deval_eval_batch_keys(h, len(ks), arr))
        if self.journaled:
            self.g._check(_lib.deval_eval_batch_digest(h, _loop.digest(self.current, self.cur)))

    def _batch(self, batch):
        """Take batch, the loader's next; return what the body gets: batch, or, for a batch
        the pass answers from the journal of a run that stopped, one padding sample."""
        self.real = self.items = None
        self.lost = None  # why this batch's padding cannot be told from its samples (_reordered)
        self.gathered = []
        self.sites.batch(_sites.loop_frame())
        self.current = batch
        self.pad_now = False
        if self.keys is not None and self.broken is None:
            try:
                self.cur = self.keys.next(batch)
            except ValueError as e:
                err = InvalidArgument("deval.eval_loop: %s" % e, -1)
                if self.opened or self.open_now:
                    raise err from None
                # a loader whose pass opens at its first gather_for_metrics (Accelerate's):
                # it refuses then, on every rank at once; a loop that gathers nothing (a
                # training loop) runs as it would without deval
                self.broken = err
        if self.broken is not None:  # (its identity is lost for good)
            self.cur, self.samples, self.counted = None, _loop.batch_samples(batch), None
            self.tape = None
            self.batches += 1
            return batch
        if self.keys is not None:
            self.g._batch_ids = self._own_data(batch)
            self.samples = len(self.cur)
            if self.keys.real is not None:
                self.real = np.array(self.keys.real, dtype=bool)
            if self.real is not None and not self.real.all() and not self.order_kept and \
                    not self.keys.in_place(batch, np.flatnonzero(~self.real)):
                return self._reordered(batch)
            kept = self._kept(self.batches + 1)
            if self.tape is not None and self.keys.draws is not None and self.real is not None \
                    and not kept:
                self.tape.append((np.asarray(self.cur, dtype=np.int64), self.real.copy()))
            else:
                self.tape = None
            if kept:
                # its first sample, cut from it: the dataset is not read again (which could
                # draw random numbers the run that stopped did not)
                self.batches += 1
                pad = _loop.head(batch)
                self.pad_now = pad is not batch
                self.g._batch_ids = self._own_data(pad)
                self.real = np.zeros(1 if self.pad_now else len(self.cur), dtype=bool)
                self.samples, self.counted = len(self.real), None
                self._declare()
                return pad
        else:
            self.tape = None
            if self.batches and not self.opened and self.before is not None:  # (ungathered)
                self.before = None if self.samples is None else self.before + self.samples
            self.samples = b = _loop.batch_samples(batch)
            self.counted = b if b is not None and _loop.rows_agree(batch, b, self.fields) \
                else None
            self.items = len(batch) if self.counted is None and b is not None and \
                isinstance(batch, (list, tuple)) else None
            if self.rows is not None and b is None:
                self.rows = None  # (rows it cannot count: from here on, unknown)
            elif self.rows is not None:
                n, at = self.rows
                try:  # (every rank reads the same stream: each refuses at the same batch)
                    _loop.check_stream(self.loader, self.read, n)
                except ValueError as e:
                    err = InvalidArgument("deval: %s" % e, -1)
                    if self.opened or self.open_now:
                        raise err from None
                    self.broken = err  # its first gather_for_metrics refuses; training goes on
                self.real = np.array([at(self.dealt + m) < n for m in range(b)], dtype=bool)
                self.dealt += b
            elif self.dealt_by_0 and b is not None:
                try:  # (every rank sees the same round: each refuses at the same batch)
                    self.rounds.check(self.g.world_size, self.n)
                except ValueError as e:
                    err = InvalidArgument("deval: %s" % e, -1)
                    if self.opened or self.open_now:
                        raise err from None
                    # its first gather_for_metrics refuses; a training loop goes on
                    self.broken, self.samples = err, None
                self.real = _loop.dispatched_real(self.loader, self.g.rank, b)
            elif self.mine is not None and self.counted is None:
                self.mine = None  # (samples it is not sure of: from here on, unknown)
            elif self.mine is not None:
                at = np.arange(self.mine, self.mine + b) * self.g.world_size + self.g.rank
                self.real = at < self.n
                self.mine += b
        self.batches += 1
        if self.opened:
            self._declare()
        return batch

    def _reordered(self, batch):
        """batch holds a sharding's padding, and its collate_fn did not leave the padding's
        rows where the sampler drew them (it sorts, say): which rows are the padding is told
        nowhere, so nothing may drop them (a gather for metrics, an attached metric's
        update). Raise where the pass is open; else (a hooked loader before its first
        gather_for_metrics) at its first gather, as for any batch whose identity is lost."""
        self.tape = None
        err = Mismatch(
            "deval.eval_loop: batch %d holds %d samples that the sharding repeats (padding), "
            "and its collate_fn (%s) did not keep them where the sampler drew them: a collate "
            "that reorders a batch's samples (sorting by length, say) hides which rows are "
            "the padding, which would drop another sample's rows in their place. Keep the "
            "drawn order in the collate_fn (sort inside the model), or use torch's collate"
            % (self.batches + 1, int((~self.real).sum()),
               getattr(self.keys.base.collate_fn, "__name__",
                       type(self.keys.base.collate_fn).__name__)), -2)
        self.real, self.lost = None, str(err)
        if self.opened or self.open_now:
            raise err
        self.broken = err
        self.cur, self.samples, self.counted = None, _loop.batch_samples(batch), None
        self.batches += 1
        return batch

    def _own_data(self, batch):
        """The ids of batch's own data, whose duplicates libdeval compares with their first
        read (same_rows); none where the collate surely keeps the sampler's order, for there
        a sample is its draw whatever its values (a dataset that augments at random)."""
        if self.keys is not None and self.order_kept is None and self.keys.indices:
            self.order_kept = _collate.keeps_order(self.keys)
        return () if self.order_kept else _loop.data_ids(batch)

    def run(self, make_iter):
        _loop.LOOPS[0] += 1
        self.seq = _loop.LOOPS[0]
        self.ident = _loop.loader_number(self.loader)
        _loop.TAPE[0] = None
        active = _loop.ACTIVE  # (held: a loop left open is closed when modules are gone)
        active.append(self)
        self.bar = _progress.Bar(self.g, self.progress) if self.progress else None
        ended = False
        try:
            if self.dealt_by_0:
                with _loop.DealtRounds(self.loader) as self.rounds:
                    yield from self._run(make_iter)
            elif self.rows is not None:
                with _loop.counted(self.loader.dataset) as self.read:
                    yield from self._run(make_iter)
            else:
                yield from self._run(make_iter)
            ended = True
        finally:
            # (a loop that trained: its batches are not one process's, as without deval; []
            # says that a loop ended on every rank, so that all agree on a gather after it)
            _loop.TAPE[0] = _loop.tape_of([] if getattr(self, "trains", False) else self.tape)
            if self.bar is not None:
                self.bar.close(ended)
            active.remove(self)
            if self.refused is not None and self.g._h:  # (_refuse() stopped the fast path)
                self.g._addr = self.g._h.value if self.g._fast is not None else 0

    def _run(self, make_iter):
        g = self.g
        h = g._h or g._handle()  # (a pass this rank left says so when this one opens)
        done, last, failure = False, None, None
        with self.keys if self.keys is not None else contextlib.nullcontext():
            with self.keys.drawing() if self.keys is not None else contextlib.nullcontext():
                it = make_iter()
                batch = next(it, _END)  # (a generator's loader starts its iterator here)
            if self.open_now:
                self.open(None if batch is _END else batch)
            g._pass_ended = False
            try:
                while batch is not _END:
                    body = self._batch(batch)
                    last = batch
                    yield body
                    self._end_body()
                    if self.bar is not None:
                        self.bar.update()
                    batch = next(it, _END)
                done = True
            except GeneratorExit:
                raise
            except BaseException as e:  # (the loader's or deval's own, raised here)
                failure = e
                raise
            finally:
                if self.opened:
                    g._in_pass = False
                if not done and self._kept(self.batches) and self.pad_now:
                    print("deval: rank %d left the loop in batch %d, whose results came from "
                          "the resume journal and whose body ran on the batch's first sample "
                          "alone; a body that cannot (batch norm in training mode, a state "
                          "carried from batch to batch, calls that depend on the batch's size) "
                          "cannot resume: set DEVAL_RESUME=0" % (g.rank, self.batches),
                          file=sys.stderr, flush=True)
                # a break, or an exception: the others must hear, unless a step of the pass
                # failed because a rank left it, which ended it for every rank (devald's too)
                if self.opened and not done and not g._pass_ended:
                    why = None if failure is None else ("rank %d: %s: %s" % (
                        g.rank, type(failure).__name__, failure)).encode(errors="replace")
                    try:
                        with g._own_steps(end=True):
                            g._check(_lib.deval_eval_abandon_why(g._handle(), why))
                    except Mismatch as e:  # they went on: they fail, and so will this rank
                        if failure is None:  # (a break; an error raises here already)
                            g._left_pass(e)
                    except Error:
                        pass  # the group is what failed: its next call says so
                    g._keyed = False
        if done and not self.opened and not self.batches and self.n > 0 and \
                self.loader is not None:
            # a shard with no batch (even_batches=False) of a loader the others gather: this
            # rank takes part in their pass, as a rank whose loader ran out first does (a
            # training loader's empty shard would stall its DDP anyway)
            self.open()
        if not self.opened:
            if self.at_end is not None:
                self.at_end(self)
            return
        if self.refused is not None:  # (a body that went on after this rank refused)
            g._handle()
        keyed, g._keyed = g._keyed, False
        with g._own_steps(end=True):
            g._check(_lib.deval_eval_complete(h))
        missed = _lib.deval_eval_missed(h)
        if missed <= 0:
            return
        pad = self._padding(last)
        if pad is _END:
            with g._own_steps(end=True):
                _lib.deval_eval_replay_done(h)
            raise Mismatch("deval.eval_loop: this rank's loader had no batch, so it cannot "
                           "replay the %d batches the other ranks gathered; use fewer "
                           "processes than batches (or even_batches=True)" % missed, -2)
        g._in_pass, g._keyed, g._replaying = True, keyed, True
        g._batch_ids = self._own_data(pad)
        # one sample, as surely as the loop's own batches are counted: its calls take the
        # path theirs took (k rows per sample counted by samples), whose results devald kept
        self.real, self.samples = np.zeros(1, dtype=bool), 1
        self.counted = 1 if _loop.rows_agree(pad, 1, self.fields) else None
        self.items = len(pad) if self.counted is None and isinstance(pad, (list, tuple)) \
            else None
        try:
            for _ in range(missed):
                self.batches += 1
                if self.tape is not None:  # (a replayed batch: one padding sample)
                    self.tape.append((np.full(1, -1, dtype=np.int64), np.zeros(1, dtype=bool)))
                self.gathered = []
                self.sites.batch(_sites.loop_frame())
                self._declare()
                yield pad
        except GeneratorExit:
            with g._own_steps(end=True):
                _lib.deval_eval_replay_done(h)
            raise
        finally:
            g._in_pass = g._keyed = g._replaying = False
        with g._own_steps(end=True):
            g._check(_lib.deval_eval_replay_done(h))

    def holds_gathered(self, args, kwargs):
        return holds_gathered(self.gathered, self.samples, args, kwargs)

    def real_count(self):
        """This rank's real samples of the current batch, where they are its first ones and
        each call's rows are the batch's samples (k each): a call past those the pass counts
        says it (valid_rows). None where that is not known."""
        real = self.real
        if real is None:
            return None
        n = int(real.sum())
        if not real[:n].all() or (n and self.counted is None):
            return None
        return n

    def _padding(self, last):
        """The batch the replay hands the body: one padding sample in the loader's own
        structure, read again from the dataset where its indices are known (self.cur its key),
        else cut from the rank's last batch; _END when there is none."""
        if self.keys is not None:
            if last is None:
                self.keys.indices = [0]  # no batch of its own: the dataset's first sample
            self.cur = self.cur[:1] if self.cur else [0]
            try:
                return self.keys.padding()
            except Exception:  # (a dataset that cannot be read again here)
                pass
        return _END if last is None else _loop.head(last)


class Opaque:
    """An iteration of a loader deval runs no pass over (deval.accelerate's hooked loaders,
    deval.lightning's evaluation loops), seen by attached metrics (_loop.ACTIVE): real says
    which samples of the batch are real, when it can be told; None taints a metric updated
    with the batch (deval.torchmetrics)."""

    def __init__(self):
        self.real = self.samples = self.seq = self.n = None
        self.current = None  # the current batch, as the loader gave it
        self.batches = 0
        self.gathered = []  # what this batch's gathers for metrics returned
        self.sites = _sites.Sites()  # where its gathers for metrics are made (_sites.py)
        self.rows_per_sample = {}  # each call's, in the batches so far (same_rows_per_sample)

    def batch(self, batch):
        self.batches += 1
        self.current = batch
        self.gathered = []
        self.sites.batch(_sites.loop_frame())

    def holds_gathered(self, args, kwargs):
        return holds_gathered(self.gathered, self.samples, args, kwargs)

    def run(self, it):
        _loop.LOOPS[0] += 1
        self.seq = _loop.LOOPS[0]
        _loop.TAPE[0] = None
        _loop.ACTIVE.append(self)
        try:
            for batch in it:
                self.batch(batch)
                yield batch
        finally:
            _loop.ACTIVE.remove(self)


def same_rows_per_sample(lp, objects, ks):
    """The rows per sample of each tensor (or of the objects) of the batch's gather for
    metrics under way (lp.sites.call), ks (_nest._check_batch_rows()), must be those of the
    same call in the batches of lp before: rows whose count per sample changes from batch to
    batch (tokens flattened across the batch, which a batch may hold a multiple of by chance)
    are not k per sample, and cutting the padding's k by position would keep the wrong rows.
    Return ks."""
    at = (objects, lp.sites.call)
    before = lp.rows_per_sample.setdefault(at, ks)
    if len(before) == len(ks):
        for (where, k), (_, was) in zip(ks, before):
            if k != was:
                raise InvalidArgument(
                    "deval.gather_for_metrics: %s holds %d rows per sample of this batch "
                    "and held %d in the batches before, at this call of the batch: its rows "
                    "are not a number per sample (tokens flattened across the batch?), so "
                    "which of them are the padding's cannot be told; give each sample the "
                    "same number of rows, or evaluate a map-style dataset through a "
                    "DataLoader, whose pass knows each sample's index" % (where, k, was), -1)
    return ks


def holds_gathered(gathered, samples, args, kwargs):
    """Do the values args and kwargs hold (a metric's update) come from what the gathers for
    metrics of the current batch returned (gathered: every rank's rows, not this rank's): the
    results themselves, views of them, or values with as many rows as a result and not one
    per sample of the batch (samples)? 0: no; WHOLE: yes, and every value with rows has as
    many as a result (all of them, not a part such as a slice of its own); PART: yes, else."""
    if not _holds_gathered(gathered, samples, args, kwargs):
        return 0
    rows, mine = _row_counts(gathered, args, kwargs)
    return WHOLE if all(r in rows for r in mine) else PART


WHOLE, PART = 2, 1


def as_gathered(gathered, args, kwargs):
    """Could the values args and kwargs hold be the current batch's gathered results, copied or
    computed from them row by row: does every value with rows have as many as some result (at
    least one value)? In the last round, whose padding the gathers drop, a result may have as
    many rows as this rank's batch; a metric fed gathered rows in the batch before is fed
    them here too (deval.torchmetrics)."""
    rows, mine = _row_counts(gathered, args, kwargs)
    return bool(rows) and bool(mine) and all(r in rows for r in mine)


def _row_counts(gathered, args, kwargs):
    """The row counts of the gathered results, and those of each value args and kwargs hold."""
    rows = {v.shape[0] for v in _values(gathered) if hasattr(v, "shape") and len(v.shape)}
    mine = [v.shape[0] for v in _values(list(args) + list(kwargs.values()))
            if hasattr(v, "shape") and len(v.shape)]
    return rows, mine


def _values(vs):
    """The leaves of nested lists, tuples and dicts."""
    todo = list(vs)
    while todo:
        v = todo.pop()
        if isinstance(v, (tuple, list)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
        else:
            yield v


def _holds_gathered(gathered, samples, args, kwargs):
    if not gathered:
        return False
    ids, ptrs, rows = set(), set(), set()
    todo = list(gathered)
    while todo:
        v = todo.pop()
        ids.add(id(v))
        if isinstance(v, (tuple, list)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif hasattr(v, "shape") and len(v.shape):
            rows.add(v.shape[0])
            if hasattr(v, "untyped_storage"):
                ptrs.add(v.untyped_storage().data_ptr())
    todo = list(args) + list(kwargs.values())
    while todo:
        v = todo.pop()
        if id(v) in ids:
            return True
        if isinstance(v, dict):
            todo.extend(v.values())
        elif hasattr(v, "shape") and len(v.shape):
            if hasattr(v, "untyped_storage") and v.untyped_storage().data_ptr() in ptrs:
                return True
            if v.shape[0] in rows and v.shape[0] != samples:
                return True
    return False


def real_rows():
    """Which samples of the current batch are real, a bool numpy array, one per sample: False
    for the padding a sharding adds to even out the ranks' last batches (DistributedSampler's,
    Accelerate's even_batches) and for the batches a rank replays (see eval_loop). For the
    innermost loop deval runs (eval_loop, or a loader deval.accelerate hooked); None outside
    one, or where deval cannot tell which samples are padding. A running sum or count a rank
    keeps of its own is exact when it takes only these rows; attached torchmetrics metrics
    take only these rows by themselves."""
    return _loop.ACTIVE[-1].real if _loop.ACTIVE else None


def _rng_state():
    """torch's random generators' states (the CPU's, and each GPU's once CUDA is in use), as
    a list of uint8 tensors; None without torch. (numpy's and Python's own cost ~50 us a batch
    to read: a body that draws from them is not made exact on a resume, as docs/python.md
    says.)"""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    parts = [torch.get_rng_state()]
    if torch.cuda.is_initialized():
        parts += torch.cuda.get_rng_state_all()
    return parts


def _rng_same(a, b):
    torch = sys.modules["torch"]
    return len(a) == len(b) and all(torch.equal(p, q) for p, q in zip(a, b))


def _rng_pack(parts):
    return b"".join(len(b).to_bytes(8, "little") + b
                    for b in (p.numpy().tobytes() for p in parts))


def _rng_set(blob):
    """Set torch's generators to what _rng_pack() made of them (or to a list of states); a
    blob that is not one for this process's generators is left alone."""
    torch = sys.modules.get("torch")
    if torch is None or blob is None:
        return
    parts = blob
    if isinstance(blob, bytes):
        parts, at = [], 0
        while at + 8 <= len(blob):
            n = int.from_bytes(blob[at:at + 8], "little")
            parts.append(torch.frombuffer(bytearray(blob[at + 8:at + 8 + n]), dtype=torch.uint8))
            at += 8 + n
    now = _rng_state()
    if not parts or len(parts) > len(now) or \
            any(p.numel() != q.numel() for p, q in zip(parts, now)):
        return
    torch.set_rng_state(parts[0])
    for i, p in enumerate(parts[1:]):
        torch.cuda.set_rng_state(p, i)
