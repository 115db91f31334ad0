# SPDX-License-Identifier: MIT
"""The plain gather's fast path: CPU torch tensors and numpy arrays, C-contiguous, of deval's
dtypes, alone or in one flat tuple, list or dict, gathered with copy=True, whatever the
options. An evaluation loop makes this call once a batch on a few hundred bytes, where the
general path's per-tensor cost (about 7 us through ctypes) is more than the collective's.

One contract, gather(fn, handle, x, opts, per_sample), two implementations: deval._speed in C
(python/deval/_speed.c), and _Fast here, its copy in Python over ctypes. fn is the address of
deval_gather or deval_gather_for_metrics (_GATHER, _GATHER_FOR_METRICS), handle the group's
address, opts a deval_gather_opts's; the answer is the results in x's structure, None when x
is not plain (nothing was sent: the general path in _group takes the call and names what is
wrong with an input), or a nonzero status for the caller to raise with deval_errmsg(). A
group holds one of them (Group._fast): _speed where it is loaded, else a _Fast of its own.

Why the Python copy stays: _speed is optional. meson builds it only where Python's headers are
found (python3-dev), and DEVAL_PYTHON_EXTENSION=0 turns it off; without it, the general path
would take the plain calls, and measured on one rank it is 1.4x slower than _Fast for one to
eight numpy arrays and 2x slower for three or eight torch tensors (tools/bench_python.py's
cases), because it converts and wraps each input separately (_tensors' _Leaf) where _Fast packs
the descriptors into buffers kept for the group and copies the results out through one
memoryview. _Fast follows _speed.c's rules for what is plain; a change to one is a change to
both (tests/python/test_fast_binding.py runs its cases through each).
"""

import ctypes
import math
import os
import struct

import numpy as np

from ._errors import ProtocolError
from ._libdeval import _DTYPE_SIZES, MAX_DIMS, MAX_TENSORS, _GatherOpts, _lib, _Tensor
from ._nest import _items, names_digest
from ._tensors import _DEVAL_TO_NP_RAW, _NP_TO_DEVAL, _torch


def _load_speed():
    """deval._speed, the plain gather in C: installed in the package, or built beside the
    libdeval just loaded (a source tree's build). None without it, or with
    DEVAL_PYTHON_EXTENSION=0: the same calls then go through ctypes."""
    if os.environ.get("DEVAL_PYTHON_EXTENSION") == "0":
        return None
    try:
        from . import _speed
        return _speed
    except ImportError:
        pass
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(_lib.deval_path)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES if here else ():
        path = os.path.join(here, "_speed" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(__package__ + "._speed", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


_speed = _load_speed()
# the entry points the fast path calls, as addresses: the one libdeval of the process
_GATHER = ctypes.cast(_lib.deval_gather, ctypes.c_void_p).value
_GATHER_FOR_METRICS = ctypes.cast(_lib.deval_gather_for_metrics, ctypes.c_void_p).value

# deval_tensor as bytes: data, dtype, ndim, shape[8], device, reserved (88 bytes)
_TENSOR = struct.Struct("@Pii8qii")
assert _TENSOR.size == ctypes.sizeof(_Tensor)
_ZEROS = (0,) * 8
_TORCH_CODES = None  # torch dtype -> deval dtype, once torch is imported


def _torch_codes(torch):
    global _TORCH_CODES
    if _TORCH_CODES is None:
        codes = {torch.bfloat16: 8}
        for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.float32, torch.float64):
            codes[d] = _NP_TO_DEVAL[torch.empty(0, dtype=d).numpy().dtype]
        _TORCH_CODES = codes
        if _speed is not None:
            # (torch's own DLPack consumer: torch.from_dlpack adds a Python layer)
            _speed.configure_torch(torch.Tensor, codes, torch.from_numpy, torch.bfloat16,
                                   getattr(torch._C, "_from_dlpack", None))
    return _TORCH_CODES


if _speed is not None:
    try:
        _speed.configure(np.ndarray, np.empty, _NP_TO_DEVAL,
                         (None,) + tuple(_DEVAL_TO_NP_RAW[c] for c in range(1, 11)),
                         ProtocolError, _torch_codes, _DTYPE_SIZES)
    except TypeError:  # built from other sources than these (a build not redone): not used
        _speed = None

# deval_gather()'s C type with every pointer an address, for the addresses _Fast is given
_GATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p)
_CALLS = {}  # an entry point's address -> it, callable


class _Fast:
    """_speed.gather() in Python, for a group where the extension is not loaded. Its
    descriptors are packed into ctypes arrays kept for the group, and each result is copied
    once, from shared memory into a new tensor of the input's kind. Why it stays beside _speed:
    see this module's docstring."""

    __slots__ = ("ins", "outs", "inb", "outb", "in_addr", "out_addr")

    def __init__(self):
        self.ins = (_Tensor * MAX_TENSORS)()
        self.outs = (_Tensor * MAX_TENSORS)()
        self.inb = memoryview(self.ins).cast("B")
        self.outb = memoryview(self.outs).cast("B")
        self.in_addr = ctypes.addressof(self.ins)
        self.out_addr = ctypes.addressof(self.outs)

    def gather(self, fn, handle, x, opts, per_sample):
        """As _speed.gather(): the results in x's structure, None (not plain, nothing was
        sent) or the call's nonzero status."""
        if not fn or not handle or not opts:
            return None
        leaves, how = self.leaves(x)
        kinds = self.describe(leaves, per_sample)
        if kinds is None:
            return None
        call = _CALLS.get(fn)
        if call is None:
            call = _CALLS[fn] = _GATHER_FN(fn)
        n = len(leaves)
        if type(x) is dict:  # (the caller's options are shared: a copy, named)
            named = _GatherOpts.from_buffer_copy(_GatherOpts.from_address(opts))
            named.names = names_digest([[k] for k, _ in how])
            opts = ctypes.addressof(named)
        r = call(handle, n, self.in_addr, opts, self.out_addr)
        if r:
            return r
        res = self.results(n, kinds)
        if how is None:
            return res[0]
        if type(x) is dict:  # (how: its items, in the leaves' order)
            got = dict(zip((k for k, _ in how), res))
            return {k: got[k] for k in x}  # (in its own order)
        return how(res)

    def leaves(self, x):
        """The inputs of one call, and how to rebuild its structure."""
        if type(x) in (tuple, list):
            return list(x), type(x)
        if type(x) is dict:  # (in the leaves' order: _nest._items())
            items = _items(x)
            return [v for _, v in items], items
        return [x], None

    def describe(self, leaves, per_sample):
        """Pack each leaf's descriptor; None when one is not plain."""
        n = len(leaves)
        if n == 0 or n > MAX_TENSORS:
            return None
        torch = _torch()
        codes = _torch_codes(torch) if torch is not None else None
        rows = None
        kinds = []
        for i, v in enumerate(leaves):
            if codes is not None and isinstance(v, torch.Tensor):
                if not v.is_cpu or not v.is_contiguous() or v.dim() > MAX_DIMS or v.is_neg():
                    return None  # (a negative bit: its memory holds the values negated)
                code = codes.get(v.dtype)
                shape = tuple(v.shape)
                ptr = v.data_ptr()
                kinds.append((v.dtype, code))
            elif type(v) is np.ndarray:
                if not v.flags.c_contiguous or v.ndim > MAX_DIMS:
                    return None
                code = _NP_TO_DEVAL.get(v.dtype)
                shape = v.shape
                try:  # (cheaper than v.ctypes.data, for a writable array)
                    ptr = ctypes.addressof(ctypes.c_char.from_buffer(v)) if v.nbytes else 0
                except (TypeError, ValueError):
                    ptr = v.ctypes.data
                kinds.append((v.dtype, code))
            else:
                return None
            if code is None or (per_sample and (not shape or rows not in (None, shape[0]))):
                return None
            if per_sample:
                rows = shape[0]
            _TENSOR.pack_into(self.inb, i * _TENSOR.size, ptr if ptr else 0, code, len(shape),
                              *(shape + _ZEROS[len(shape):]), -1, 0)
        return kinds

    def results(self, n, kinds):
        """Each result copied once out of shared memory, in its input's kind."""
        torch = _torch()
        fs = []
        lo, hi = None, 0
        for i in range(n):
            f = _TENSOR.unpack_from(self.outb, i * _TENSOR.size)
            ptr, code, ndim = f[0], f[1], f[2]
            kind, want = kinds[i]
            if code != want:  # a gather keeps the dtype: the sizes below rely on it
                raise ProtocolError("deval: a malformed result (dtype %d for %d)"
                                    % (code, want), -8)
            shape = f[3:3 + ndim]
            nbytes = math.prod(shape) * _DTYPE_SIZES[code]
            fs.append((ptr, shape, nbytes))
            if nbytes and ptr:
                lo = ptr if lo is None else min(lo, ptr)
                hi = max(hi, ptr + nbytes)
        # one buffer over every result, sliced: a ctypes object per call, not per tensor
        mv = memoryview((ctypes.c_char * (hi - lo)).from_address(lo)).cast("B") if lo else None
        out = []
        for (ptr, shape, nbytes), (kind, code) in zip(fs, kinds):
            numpy = isinstance(kind, np.dtype)
            npd = kind if numpy else _DEVAL_TO_NP_RAW[code]
            if nbytes and ptr:
                a = np.frombuffer(mv[ptr - lo:ptr - lo + nbytes], dtype=npd).reshape(shape).copy()
            else:
                a = np.empty(shape, dtype=npd)
            if not numpy:
                a = torch.from_numpy(a)
                if code == 8:
                    a = a.view(torch.bfloat16)
            out.append(a)
        return out


def _fast_path():
    """What a host group's plain gathers go through: _speed, else a _Fast of the group's."""
    return _speed if _speed is not None else _Fast()
