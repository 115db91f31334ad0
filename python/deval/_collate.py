# SPDX-License-Identifier: MIT
"""Whether a DataLoader's collate_fn keeps a batch's samples in the order its sampler drew them.

In a pass with keys, row k of a batch is taken to be the k-th sample the sampler drew for it.
A collate_fn that reorders (sorting by length for packed sequences, say) breaks that, and a
sharding's duplicate then drops another sample's rows. libdeval can catch it where the batch's
own data repeats exactly (same_rows: a duplicate's labels must equal its first read's), but
that check also refuses a dataset whose samples differ between reads (random augmentation in
__getitem__, a dataset made unseeded on each rank), where one process's answer is plain: the
sampler's draw is the sample, whatever its bytes. So the check is kept only where the order
cannot be vouched for: torch's own collate keeps it, and any other is tried once per loader on
a few samples of its first batch, collated forward and reversed.
"""

import sys

_PROBE = 8  # samples of the first batch the probe collates


def keeps_order(keys):
    """True when the loader of keys (a _loop.Keys, just past a batch) surely collates a
    batch's samples in the order they were drawn; False when that cannot be told (a random
    collate, one that reorders); None when this batch cannot tell and a later one may."""
    tud = sys.modules["torch.utils.data"]
    base = keys.base
    if base.collate_fn in (tud.default_collate, tud.default_convert):
        return True
    if not base._auto_collation and not keys.lists:
        return True  # each batch is one sample
    if base._auto_collation and getattr(base, "batch_size", None) == 1:
        return True
    idx = list(keys.indices or ())[:_PROBE]
    if len(idx) < 2:
        return None
    return _probe(base, idx)


def _probe(base, idx):
    """Collate idx's samples forward and reversed: a collate that keeps order gives the same
    rows reversed, in every value with a row per sample, and at least one value tells the
    two apart (else the probe shows nothing). The samples are read once, the random number
    generators put back as they were, so the loop reads what it would have read."""
    import random

    import numpy as np
    import torch
    py, npy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            if base._auto_collation:
                samples = [base.dataset[i] for i in idx]
                fwd, rev = base.collate_fn(samples), base.collate_fn(samples[::-1])
            else:  # a sampler of lists: the dataset reads each list at once
                fwd = base.collate_fn(base.dataset[idx])
                rev = base.collate_fn(base.dataset[idx[::-1]])
    except Exception:
        return False  # (a dataset or collate that cannot be read so: no vouching)
    finally:
        random.setstate(py)
        np.random.set_state(npy)
    seen = {"rows": 0, "told": 0}
    return _reversed(fwd, rev, len(idx), seen) and seen["rows"] > 0 and seen["told"] > 0


def _is_tensor(x):
    return hasattr(x, "shape") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes))


def _flip(x):
    return x.flip(0) if hasattr(x, "flip") else x[::-1]


def _equal(a, b):
    """a and b hold the same values, through tensors, arrays, mappings and sequences."""
    if _is_tensor(a) or _is_tensor(b):
        if not (_is_tensor(a) and _is_tensor(b)) or tuple(a.shape) != tuple(b.shape):
            return False
        if hasattr(a, "untyped_storage"):
            import torch
            return type(b) is type(a) and torch.equal(a, b)
        import numpy as np
        return bool(np.array_equal(a, b))
    if isinstance(a, dict) or hasattr(a, "keys"):
        return hasattr(b, "keys") and list(a.keys()) == list(b.keys()) and \
            all(_equal(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and \
            all(_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _reversed(a, b, m, seen):
    """b, the collate of m samples reversed, is a with every row per sample reversed and
    everything else equal. seen counts the values with a row per sample ("rows") and those
    where a and b differ ("told")."""
    if _is_tensor(a):
        if not _is_tensor(b) or tuple(a.shape) != tuple(b.shape):
            return False
        if len(a.shape) and a.shape[0] == m:
            seen["rows"] += 1
            seen["told"] += not _equal(a, b)
            return _equal(_flip(a), b)
        return _equal(a, b)
    if isinstance(a, dict) or (hasattr(a, "keys") and hasattr(a, "__getitem__")):
        if not hasattr(b, "keys") or list(a.keys()) != list(b.keys()):
            return False
        return all(_reversed(a[k], b[k], m, seen) for k in a.keys())
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        part = dict(seen)
        if all(_reversed(x, y, m, part) for x, y in zip(a, b)):  # the batch's fields
            seen.update(part)
            return True
        if len(a) == m and all(_equal(x, y) for x, y in zip(a[::-1], b)):  # its samples
            seen["rows"] += 1
            seen["told"] += not _equal(a, b)
            return True
        return False
    return _equal(a, b)
