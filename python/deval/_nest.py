# SPDX-License-Identifier: MIT
"""The structure of a call's argument: a tensor alone, or tuples, lists, namedtuples, dicts
and other mappings (a ModelOutput) of them, nested. _flatten splits one into its leaves
(_tensors' _Leaf, in a fixed order) and a template that _rebuild fills with the results, so
that a call with many tensors is one collective and answers in the caller's structure;
_paths names a leaf's place for error messages, _check_samples checks what an eval pass needs
of a call's tensors (and _check_batch_rows what a pass without indices needs), _data_mask
marks the leaves that are a batch's own data, and _object_items says what gather_object
gathers of a value.
"""

import collections.abc

import numpy as np

from ._errors import InvalidArgument
from ._tensors import _is_torch, _Leaf


def _items(m):
    """A mapping's items in the order its values are leaves: by key where the keys are all
    strings, so that ranks whose dicts hold the same keys in another order (built from a set,
    say) pair each tensor with the one of its name; else in the mapping's own order. The one
    rule of _flatten, _leaves_at, _data_mask and _speed.c's dict_leaves()."""
    items = list(m.items())
    if len(items) > 1 and all(type(k) is str for k, _ in items):
        items.sort(key=lambda kv: kv[0])
    return items


def names_digest(paths):
    """deval_gather_opts.names of a call whose leaves lie at paths (each a list of the dict
    keys above the leaf, None for a place in a list or tuple), in the leaves' order: FNV-1a
    over each key's UTF-8 bytes and a 0 (a place: a 1), and a 2 at each leaf's end; 0 where
    no leaf is under a dict. _speed.c's dict_names() digests a flat dict alike."""
    if not any(k is not None for p in paths for k in p):
        return 0
    h = 0xcbf29ce484222325
    for p in paths:
        for b in b"".join(b"\1" if k is None else str(k).encode("utf-8", "surrogatepass") +
                          b"\0" for k in p) + b"\2":
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def names_of(template):
    """names_digest() of a call whose structure is template (_flatten's)."""
    paths = []

    def walk(t, path):
        if t[0] is None:
            paths.append(path)
        elif t[0] is dict:
            for k, v in t[1]:
                walk(v, path + [k])
        else:
            for v in t[1]:
                walk(v, path + [None])
    walk(template, [])
    return names_digest(paths)


def _flatten(x, leaves, on_device=False):
    """Split a nested structure into leaves and a template to rebuild it."""
    if isinstance(x, collections.abc.Mapping):  # a ModelOutput, say: rebuilt as its type
        items = _items(x)
        own = list(x.keys())  # (rebuilt in its own order)
        return (dict, [(k, _flatten(v, leaves, on_device)) for k, v in items],
                None if type(x) is dict else type(x),
                None if own == [k for k, _ in items] else own)
    if isinstance(x, (list, tuple)):
        return (type(x), [_flatten(v, leaves, on_device) for v in x])
    try:
        leaves.append(_Leaf(x, on_device))
    except InvalidArgument:
        raise
    except Exception as e:  # (torch's own refusal of a dtype or layout: refused on every rank)
        raise InvalidArgument("deval: a %s%s cannot be gathered (%s: %s)" % (
            type(x).__name__, " of %s" % x.dtype if hasattr(x, "dtype") else "",
            type(e).__name__, e), -1) from None
    return (None, len(leaves) - 1)


def _sends_objects(x, forced=False):
    """gather_for_metrics sends x as objects: when forced (use_gather_object), or x is a list
    holding no tensor (an empty one included: a rank with no batch left), so that every rank
    makes the same call."""
    return forced or (isinstance(x, list) and not any(
        isinstance(v, np.ndarray) or _is_torch(v) for v in x))


def time_major(v, samples, batch=None):
    """T, where v is the rows of a [T, samples, ...] value flattened, whose rows run over the
    batch's samples fastest, T rows per sample interleaved (a time-major model's tokens:
    torch's RNNs without batch_first); else 0. A view says so by its base (.reshape(-1),
    .view(-1, V), .flatten(0, 1)); a copy, by equal to a value of the batch (the loader's own,
    [samples, T, ...]) flattened time-major and not batch-first (_said_by()). A copy of none,
    or a [T, T] base, says nothing."""
    base = _flattened_from(v)
    if base is not None:
        t, b = base.shape[0], base.shape[1]
        return t if b == samples and t != samples and t > 1 else 0
    said = _said_by(v, batch, samples)
    return said[1] if said and said[0] == "time" else 0


def _flattened_from(v):
    """The value whose first two dims v's rows flatten (v a view of it: a torch tensor's
    _base, an array's base), or None."""
    base = getattr(v, "_base", None) if not isinstance(v, np.ndarray) else v.base
    if base is None or not hasattr(base, "shape") or len(base.shape) < 2 or \
            not hasattr(v, "shape") or not len(v.shape) or \
            v.shape[0] != base.shape[0] * base.shape[1]:
        return None
    return base


def sample_major(v, samples, batch=None):
    """Is v the rows of a [samples, T, ...] value flattened, T > 1: a view of it, or a copy
    equal to a value of the batch flattened so and not time-major?"""
    base = _flattened_from(v)
    if base is not None:
        return base.shape[0] == samples and base.shape[1] > 1
    said = _said_by(v, batch, samples)
    return bool(said) and said[0] == "sample"


def _said_by(v, batch, samples):
    """("time" or "sample", T) where v's rows equal a value u of batch, [samples, T, ...],
    flattened one way and not the other: u.transpose(0, 1) flattened (time-major), or u
    flattened (batch-first); or u of a row per sample, repeated T times as a whole
    (u.repeat(T): test-time augmentation's torch.cat([x, x.flip(-1)]) beside it) or each row
    T times (u.repeat_interleave(T)). The batch's own values say which sample each row is,
    where v is one of them; None where none says (v computed from the batch, or values alike
    both ways)."""
    if batch is None or not samples or not hasattr(v, "shape") or not len(v.shape) or \
            v.shape[0] <= samples or v.shape[0] % samples:
        return None
    t = v.shape[0] // samples
    want = (samples, t) + tuple(v.shape[1:])
    each = (samples,) + tuple(v.shape[1:])  # a value of one row per sample, repeated t times
    torch_v = _is_torch(v)
    if not torch_v and not isinstance(v, np.ndarray):
        return None
    said = set()
    for _, u in _leaves_at(batch):
        if _is_torch(u) != torch_v or (not torch_v and not isinstance(u, np.ndarray)) or \
                tuple(u.shape) not in (want, each):
            continue
        whole = tuple(u.shape) == want
        if torch_v:  # (in v's dtype: ids repeated, then .float())
            import torch
            u = u.to(device=v.device, dtype=v.dtype)
            if whole:
                by_sample = torch.equal(v, u.reshape(v.shape))
                by_time = torch.equal(v, u.transpose(0, 1).reshape(v.shape))
            else:  # (u.repeat_interleave(t): each sample's t rows together; u.repeat: apart)
                by_sample = torch.equal(v, u.repeat_interleave(t, dim=0))
                by_time = torch.equal(v, torch.cat([u] * t))
        elif whole:
            u = u.astype(v.dtype)
            by_sample = np.array_equal(v, u.reshape(v.shape))
            by_time = np.array_equal(v, np.swapaxes(u, 0, 1).reshape(v.shape))
        else:
            u = u.astype(v.dtype)
            by_sample = np.array_equal(v, np.repeat(u, t, axis=0))
            by_time = np.array_equal(v, np.concatenate([u] * t))
        if by_sample != by_time:
            said.add("time" if by_time else "sample")
    return (said.pop(), t) if len(said) == 1 else None


def _leaves_at(x, where="the input"):
    """(where, value) of each value in x, through mappings, lists and tuples: where names it
    as the user wrote it (['logits'], [0])."""
    top = where == "the input"
    if isinstance(x, collections.abc.Mapping):
        for k, v in _items(x):
            yield from _leaves_at(v, "%s[%r]" % ("" if top else where, k))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _leaves_at(v, "%s[%d]" % ("" if top else where, i))
    else:
        yield where, x


def refuse_time_major(x, samples, batch=None):
    """InvalidArgument where a tensor of x (nested) holds time-major rows (time_major(), batch
    the loader's current one): gathered, its samples' rows would be cut as if one sample's
    followed another's."""
    for where, v in _leaves_at(x):
        t = time_major(v, samples, batch)
        if t:
            raise InvalidArgument(
                "deval.gather_for_metrics: %s is a [%d, %d, ...] value flattened time-major "
                "(its rows run over the batch's %d samples fastest): a batch's padding is cut "
                "sample by sample, one sample's rows after another's; make it batch-first "
                "before flattening (.transpose(0, 1), or batch_first=True)"
                % (where, t, samples, samples), -1)


def _check_batch_rows(x, samples, objects):
    """A pass without dataset indices counts a gather_for_metrics call's samples by rows,
    and drops the samples past the dataset's end as padding. Where the loop knows the
    batch's samples, each tensor of the call (or the objects, when it sends objects:
    _sends_objects()) must hold a whole number k of rows per sample, sample by sample (as
    generation with num_return_sequences=k makes), or samples are lost without a word:
    anything else is refused. Return: the (where, k) of each tensor with rows (of the
    objects, one), so that a call where some k is not 1 is counted by the batch's samples
    rather than by its rows (Group._gather_for_metrics), and k is checked to hold from
    batch to batch (_pass.same_rows_per_sample())."""
    if objects:
        if not isinstance(x, list):
            return []  # (gather_object's items of one value: not per sample to count)
        leaves = [("the input", len(x), "item")]
    else:  # (a 0-d tensor or a scalar: _check_samples says what is wrong with it)
        leaves = [(where, v.shape[0], "row") for where, v in _leaves_at(x)
                  if hasattr(v, "shape") and len(v.shape)]
    ks = []
    for where, rows, what in leaves:
        if rows == samples or (samples > 0 and rows > 0 and rows % samples == 0):
            ks.append((where, rows // samples if samples else 1))
            continue
        raise InvalidArgument(
            "deval.gather_for_metrics: %s holds %d %s%s for the batch's %d samples, not a "
            "whole number per sample; this pass knows no dataset indices, so it tells the "
            "samples past the dataset's end (padding, dropped) by their rows: give each "
            "sample the same number of rows, one after another (generation's "
            "num_return_sequences=k gives k), or evaluate a map-style dataset through a "
            "DataLoader, whose pass knows each sample's index"
            % (where, rows, what, "" if rows == 1 else "s", samples), -1)
    return ks


def refuse_unsure_rows(x, samples, items, objects):
    """A pass without dataset indices whose batch is a list or tuple it is not sure of: it
    holds `samples` samples if it holds fields, `items` if it holds the samples themselves.
    A call's rows that are neither are k per sample for some k, under either reading, and
    the padding's rows cannot be told: InvalidArgument naming the value."""
    if objects:
        leaves = [("the input", len(x))] if isinstance(x, list) else []
    else:
        leaves = [(where, v.shape[0]) for where, v in _leaves_at(x)
                  if hasattr(v, "shape") and len(v.shape)]
    for where, rows in leaves:
        if rows not in (samples, items):
            raise InvalidArgument(
                "deval.gather_for_metrics: %s holds %d rows for a batch of %d items, which "
                "are either its fields, of %d samples each, or its samples: one row per "
                "sample under neither, so deval cannot tell which rows are one sample, and "
                "this pass (no dataset indices) tells the padding by them. Make the batch a "
                "dict of its fields, or a tensor, or collate it with torch's default collate; "
                "or evaluate a map-style dataset through a DataLoader"
                % (where, rows, items, samples), -1)


def _data_mask(x, ids):
    """Bit i: leaf i of x (in _flatten's order) is one of ids."""
    mask, i, todo = 0, 0, [x]
    while todo:
        v = todo.pop()
        if isinstance(v, collections.abc.Mapping):
            todo.extend(reversed([w for _, w in _items(v)]))
        elif isinstance(v, (list, tuple)):
            todo.extend(reversed(v))
        else:
            if id(v) in ids and i < 64:
                mask |= 1 << i
            i += 1
    return mask


def _paths(template, prefix=""):
    """Where each leaf of template sits in the caller's structure: "['loss']", "[1]", ..."""
    kind, body = template[0], template[1]
    if kind is None:
        return [(body, prefix or "the input")]
    if kind is dict:
        return [p for k, v in body for p in _paths(v, "%s[%r]" % (prefix, k))]
    return [p for i, v in enumerate(body) for p in _paths(v, "%s[%d]" % (prefix, i))]


def _check_samples(leaves, template, samples=None):
    """In an eval pass every tensor of a gather_for_metrics call is per sample: at least one
    dim, and the same rows as the others, so that dropping a duplicate sample drops its row
    from every tensor. Where the batch's samples are known and some tensor holds k rows per
    sample (_check_batch_rows() said so), return a zero-width tensor of one row per sample
    to lead the call: libdeval counts the samples by a call's first tensor and moves the
    others' rows k per sample."""
    rows = [None if leaf.ndim == 0 else (leaf.array.shape[0] if leaf.array is not None
                                         else leaf.shape[0]) for leaf in leaves]
    if all(r is not None for r in rows) and (samples is not None or len(set(rows)) <= 1):
        return None if samples is None else _Leaf(np.empty((samples, 0), np.uint8))
    where = dict(_paths(template))
    for i, r in enumerate(rows):
        if r is None:
            raise InvalidArgument(
                "deval.gather_for_metrics: %s is a 0-d tensor, which has no samples to drop "
                "duplicates from; gather it with gather() or reduce(), or give it one row per "
                "sample (loss.repeat(batch_size))" % where[i], -1)
    first = rows[0]
    for i, r in enumerate(rows):
        if r != first:
            raise InvalidArgument(
                "deval.gather_for_metrics: %s has %d rows but %s has %d; every tensor of one "
                "call needs one row per sample (reshape [batch*k, ...] to [batch, k, ...], or "
                "gather it in a call of its own)" % (where[i], r, where[0], first), -1)


def _rebuild(template, results):
    kind, body = template[0], template[1]
    if kind is None:
        return results[body]
    if kind is dict:
        d = {k: _rebuild(v, results) for k, v in body}
        if template[3] is not None:
            d = {k: d[k] for k in template[3]}
        cls = template[2]
        if cls is None:
            return d
        for make in (lambda: cls(**d), lambda: cls(d)):
            try:
                return make()
            except Exception:
                pass
        return d
    items = [_rebuild(v, results) for v in body]
    if kind is list:
        return items
    if kind is tuple:
        return tuple(items)
    try:
        return kind(*items)  # a namedtuple
    except TypeError:
        return kind(items)


def _object_items(x):
    """What gather_object gathers of x: a list's items, a tensor's rows, else x alone."""
    if isinstance(x, (list, tuple)) or ((isinstance(x, np.ndarray) or _is_torch(x))
                                        and x.ndim > 0):
        return list(x)
    return [x]
