# SPDX-License-Identifier: MIT
"""deval: exact, fast, hang-free distributed evaluation on one machine.

A thin ctypes binding over libdeval with an Accelerate-shaped API::

    import deval
    g = deval.join("run-42")            # rank and world size from RANK / WORLD_SIZE
    with g.eval_pass(num_samples=len(dataset), order="rank"):
        for batch in loader:
            preds, labels = g.gather_for_metrics((preds, labels))

numpy arrays, torch tensors (CPU, or CUDA through a host copy), Python scalars and nested
tuples, lists and dicts of them are accepted; one call is one collective however many
tensors are nested, and the result has the input's structure and kinds. Results are copies
unless ``copy=False`` asks for read-only views into shared memory, valid until the group's
next collective. Failures raise ``deval.Error`` subclasses carrying devald's message.

A device group (``join(..., device=N)``, devald running ``--backend cuda``) keeps CUDA
tensors on their GPUs: inputs go device to device into memory devald shares, the copy
kernel gathers them, and torch results come back as tensors on the input's device. Other
objects exposing ``__cuda_array_interface__`` are accepted too; their results are
:class:`DeviceView` objects (zero-copy, valid until the group's next collective).
"""

# The package is split by job, each module importing only those before it here (no cycles):
# _errors, the exceptions; _libdeval, loading libdeval, its structs and signatures; _tensors,
# dtypes and one value as a deval tensor and back; _nest, nested structures of them; _plain,
# the plain gather's fast path (deval._speed in C, or its copy in Python); _loop, what a loader
# is made of; _pass, eval passes that follow a loader; _group, Group and its collectives;
# _span, groups across machines; _join, join(). This file is the public surface: it re-exports
# what users, the adapters (accelerate.py, torchmetrics.py, lightning.py) and the tests reach
# for.

from . import _loop
from ._errors import (
    _ERRORS, Aborted, DaemonLost, Error, InvalidArgument, Mismatch, NotSupported, OutOfMemory,
    PeerLost, PermissionDenied, ProtocolError, SystemFailure, Timeout)
from ._libdeval import (
    _DTYPE_SIZES, _ORDERS, _REDUCTIONS, MAX_DIMS, MAX_TENSORS, _Bytes, _GatherOpts, _JoinOpts,
    _lib, _Tensor)
from ._tensors import _DEVAL_TO_NP, _NP_TO_DEVAL, DeviceView
from ._nest import _flatten
from ._plain import _Fast, _speed
from ._pass import _LoopPass, real_rows
from ._group import Group
from ._span import _spans_machines
from ._join import join

__all__ = [
    "join", "Group", "real_rows", "Error", "InvalidArgument", "Mismatch", "PeerLost", "DaemonLost",
    "Timeout", "OutOfMemory", "PermissionDenied", "ProtocolError", "Aborted", "NotSupported",
    "SystemFailure", "MAX_TENSORS", "DeviceView",
]
# what deval.accelerate, deval.torchmetrics, tools/bench_python.py and the tests reach for
# beyond __all__ (named here, so that pyflakes sees these imports used). Each module binds
# what it imports at import: monkeypatching a name here reaches none of them; patch it in the
# module that calls it (deval._join._spans_machines for join(), say).
_INTERNAL = (_loop, _ERRORS, _DTYPE_SIZES, _ORDERS, _REDUCTIONS, MAX_DIMS, _Bytes, _GatherOpts,
             _JoinOpts, _lib, _Tensor, _DEVAL_TO_NP, _NP_TO_DEVAL, _flatten, _Fast, _speed,
             _LoopPass, _spans_machines)

# the public classes say they are deval's, as before the split: in tracebacks, reprs, pickles
for _cls in (Error, InvalidArgument, Mismatch, PeerLost, DaemonLost, Timeout, OutOfMemory,
             PermissionDenied, ProtocolError, Aborted, NotSupported, SystemFailure, DeviceView,
             Group):
    _cls.__module__ = __name__
del _cls

__version__ = _lib.deval_version().decode()


def __getattr__(name):
    """deval.accelerate, deval.torchmetrics and deval.lightning without importing them (nor
    accelerate, torch, torchmetrics, lightning) at import deval."""
    if name in ("accelerate", "torchmetrics", "lightning"):
        import importlib
        return importlib.import_module("deval." + name)
    raise AttributeError("module 'deval' has no attribute %r" % name)
