# SPDX-License-Identifier: MIT
"""Which dataset a sample's index names: a part of a dataset (a torch Subset, a ConcatDataset
of Subsets of one dataset, a `datasets` shard) names its samples by the whole's indices, so
that ranks that each read a part of their own name each sample alike, whichever rank reads it.
root_of() is the one rule; _pass asks it when a pass with keys opens.
"""

import collections
import sys

Root = collections.namedtuple("Root", "dataset size index")
Root.__doc__ = """Where a dataset's samples lie in the dataset they were cut from (root_of()):
that dataset, how many samples it holds, and index, a numpy int64 array whose i-th entry is
its index of sample i (None where the dataset is its own root)."""


def root_of(ds, parent=None):
    """The Root of a map-style dataset: the one rule by which a part of a dataset names its
    samples by the whole's indices, so that ranks that each read a part of their own name each
    sample alike, whichever rank reads it. A torch Subset names its parent's (through nested
    Subsets; parent: the Root of its parent, where known), a ConcatDataset whose parts all
    come from one dataset that one's, and a `datasets` Dataset the rows of the Arrow table it
    reads where the dataset records which (an indices mapping, a memory-mapped table's
    slices). Anything else is its own root."""
    tud = sys.modules.get("torch.utils.data")
    try:
        if tud is not None and isinstance(ds, tud.Subset):
            return _subset_root(ds, parent)
        if tud is not None and isinstance(ds, tud.ConcatDataset):
            return _concat_root(ds)
        if _is_arrow_dataset(ds):
            return _arrow_root(ds)
    except (TypeError, ValueError, AttributeError):  # (a parent with no len(), or a `datasets`
        pass  # whose insides differ): nothing says where the part lies, so it is its own root
    return Root(ds, len(ds), None)


def chain_of(ds):
    """The datasets ds was cut from, as Roots, the root first and ds's own last: a Subset's
    parents (Subsets of Subsets: a part of a random_split's split), each naming its samples
    by the root's indices (None: the root itself). Ranks that read parts of their own name
    each sample by its place in the nearest one they share (nearest(): one process reads
    that one); a part that is no Subset names its samples by its root's."""
    tud = sys.modules.get("torch.utils.data")
    up = chain_of(ds.dataset) if tud is not None and isinstance(ds, tud.Subset) else None
    own = root_of(ds, up[-1] if up else None)  # (a parent's Root is not computed again)
    if own.index is None:
        return [own]
    if up and up[0].dataset is own.dataset:
        return up + [own]
    return [Root(own.dataset, own.size, None), own]


def nearest(chain, common, own):
    """The place of each of own's samples in chain[common - 1], the nearest dataset the ranks
    share (chain_of(); common: how many of its first entries every rank's chain holds), and
    that dataset's size; None where it is the root, or names a sample twice (own.index, the
    root's indices, then names them)."""
    import numpy as np
    if common < 2 or own.index is None:
        return None
    level = chain[common - 1]
    if level.index is None or repeated(level.index) is not None:
        return None
    place = np.full(level.size, -1, dtype=np.int64)
    place[level.index] = np.arange(len(level.index), dtype=np.int64)
    at = place[own.index]
    return None if (at < 0).any() else (at, len(level.index))


def _subset_root(ds, inner=None):
    """A Subset's sample i is its parent's sample indices[i]; inner: the parent's Root, where
    known."""
    import numpy as np
    inner = root_of(ds.dataset) if inner is None else inner
    n = inner.size if inner.index is None else len(inner.index)
    try:
        idx = np.asarray(ds.indices, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):  # (indices numpy cannot read as integers)
        return Root(ds, len(ds), None)
    if len(idx) != len(ds) or (len(idx) and (idx.min() < -n or idx.max() >= n)):
        return Root(ds, len(ds), None)  # (its reads would fail, or name no sample of it)
    idx = np.where(idx < 0, idx + n, idx)  # (a negative index reads from the end)
    return Root(inner.dataset, inner.size, idx if inner.index is None else inner.index[idx])


def _concat_root(ds):
    """A ConcatDataset's sample i is sample i - cumulative_sizes[k - 1] of its part k: where
    every part names the samples of one dataset, the ConcatDataset names that one's too."""
    import numpy as np
    parts = [root_of(d) for d in ds.datasets]
    first = parts[0].dataset
    if not all(_same_root(p.dataset, first) for p in parts):
        return Root(ds, len(ds), None)
    index = np.concatenate([np.arange(p.size, dtype=np.int64) if p.index is None else p.index
                            for p in parts])
    if len(index) != ds.cumulative_sizes[-1]:
        return Root(ds, len(ds), None)
    return Root(first, parts[0].size, index)


def _same_root(a, b):
    # (a `datasets` file is named by its path, which each dataset of it holds a copy of)
    return a is b or (isinstance(a, str) and a == b)


def _is_arrow_dataset(ds):
    """A `datasets` (Hugging Face) Dataset: rows of an Arrow table, maybe through an indices
    mapping."""
    return type(ds).__module__.split(".")[0] == "datasets" and hasattr(ds, "_data") and \
        hasattr(ds, "_indices")


# the operations a `datasets` memory-mapped table replays that keep its rows as they are
_SAME_ROWS = {"replace_schema_metadata", "add_column", "append_column", "remove_column",
              "set_column", "rename_columns", "select", "drop", "cast", "flatten",
              "combine_chunks"}


def _arrow_root(ds):
    """A `datasets` Dataset reads row _indices[i] (or row i, without an indices mapping) of
    its table, and a table that is a slice of a memory-mapped file (Dataset.shard() and
    split_dataset_by_node() of a dataset loaded from disk or the Hub) records where the slice
    begins: the file names the samples, whichever rank reads which shard. A slice of a table in
    memory (a contiguous shard of Dataset.from_dict()'s) does not record where it begins, so
    it is its own root."""
    import numpy as np
    table = ds._data
    root, size, offset = table, table.num_rows, 0
    if type(table).__name__ == "MemoryMappedTable" and hasattr(table, "replays"):
        where = _file_slice(table)
        if where is not None:
            root, size, offset = where
    if ds._indices is not None:
        index = ds._indices.column(0).to_numpy().astype(np.int64) + offset
    elif offset or size != table.num_rows:
        index = np.arange(offset, offset + table.num_rows, dtype=np.int64)
    else:
        index = None
    return Root(root, size, index)


def _file_slice(table):
    """(the file, its rows, where table's rows begin in it) for a memory-mapped table whose
    replayed operations are slices and others that keep the rows; None otherwise."""
    offset, sliced = 0, False
    for op, args, kwargs in table.replays:
        if op == "slice":
            offset += (args[0] if args else kwargs.get("offset", 0)) or 0
            sliced = True
        elif op not in _SAME_ROWS:
            return None
    if not sliced:
        return table.path, table.num_rows, 0
    try:
        size = type(table).from_file(table.path).num_rows
    except Exception:  # (a file gone since: its slices cannot be placed)
        return None
    return table.path, size, offset


def repeated(index):
    """An entry index holds twice (the smallest), or None: a part whose samples name one sample
    of its root twice."""
    import numpy as np
    if len(index) < 2:
        return None
    s = np.sort(index)
    twice = s[1:][s[1:] == s[:-1]]
    return int(twice[0]) if len(twice) else None


def root_digest(root):
    """A 62-bit digest of root's size and index: ranks whose digests agree read their dataset
    alike (the same one, the same part of one)."""
    import hashlib
    h = hashlib.blake2b(digest_size=8)
    h.update(b"%d:" % root.size)
    h.update(b"whole" if root.index is None else root.index.tobytes())
    return int.from_bytes(h.digest(), "little") >> 2
