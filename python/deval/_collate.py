# SPDX-License-Identifier: MIT
"""Whether a DataLoader's collate_fn keeps a batch's samples in the order its sampler drew them.

In a pass with keys, row k of a batch is taken to be the k-th sample the sampler drew for it.
A collate_fn that reorders (sorting by length for packed sequences, say) breaks that, and a
sharding's duplicate then drops another sample's rows. libdeval catches it where the batch's
own data repeats exactly (same_rows: a duplicate's labels must equal its first read's), but
that check also refuses a dataset whose samples differ between reads (random augmentation in
__getitem__, a dataset made unseeded on each rank), where one process's answer is plain: the
sampler's draw is the sample, whatever its bytes. So the check is dropped only where the
order is known to be kept: torch's own collate and the collators transformers ships. Any
other collate keeps the check: trying one on a few samples can vouch for a collate that
sorts by a length those samples happen to share, and a wrong vouch loses samples silently.
The answer depends on the loader's code alone, so every rank reaches the same one.
"""

import functools

# the modules whose collate functions and collator classes keep the samples' order
_ORDER_KEEPING = ("torch.utils.data._utils.collate", "transformers.data.data_collator")


def keeps_order(keys):
    """True when the loader of keys (a _loop.Keys, past its first batch) surely collates a
    batch's samples in the order they were drawn: a batch of one sample each, or a collate of
    _ORDER_KEEPING (through functools.partial and the Trainer's column-removing wrapper)."""
    base = keys.base
    if not base._auto_collation and not keys.lists:
        return True  # each batch is one sample
    fn = base.collate_fn
    for _ in range(8):  # (wrappers of wrappers, never a cycle)
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif type(fn).__name__ == "RemoveColumnsCollator" and hasattr(fn, "data_collator"):
            fn = fn.data_collator
        else:
            break
    where = fn.__module__ if hasattr(fn, "__name__") else type(fn).__module__
    return where in _ORDER_KEEPING
