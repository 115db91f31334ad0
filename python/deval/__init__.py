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

import collections.abc
import contextlib
import ctypes
import ctypes.util
import math
import os
import pickle
import struct
import sys
import weakref

import numpy as np

from . import _loop

__all__ = [
    "join", "Group", "real_rows", "Error", "InvalidArgument", "Mismatch", "PeerLost", "DaemonLost",
    "Timeout", "OutOfMemory", "PermissionDenied", "ProtocolError", "Aborted", "NotSupported",
    "SystemFailure", "MAX_TENSORS", "DeviceView",
]

MAX_DIMS = 8
MAX_TENSORS = 64


# ---- errors ------------------------------------------------------------------------------

class Error(Exception):
    """A deval call failed. ``status`` is the negative DEVAL_E* code."""

    status = 0

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(Error, ValueError):
    status = -1


class Mismatch(Error):
    status = -2


class PeerLost(Error):
    status = -3


class DaemonLost(Error):
    status = -4


class Timeout(Error, TimeoutError):
    status = -5


class OutOfMemory(Error, MemoryError):
    status = -6


class PermissionDenied(Error, PermissionError):
    status = -7


class ProtocolError(Error):
    status = -8


class Aborted(Error):
    status = -9


class NotSupported(Error):
    status = -10


class SystemFailure(Error, OSError):
    status = -11


_ERRORS = {c.status: c for c in (InvalidArgument, Mismatch, PeerLost, DaemonLost, Timeout,
                                 OutOfMemory, PermissionDenied, ProtocolError, Aborted,
                                 NotSupported, SystemFailure)}


# ---- the library -------------------------------------------------------------------------

class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("device", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class _Bytes(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Sized(ctypes.Structure):
    """An options struct that begins with its size, set as DEVAL_*_OPTS_INIT set it."""

    def __init__(self):
        super().__init__()
        self.size = ctypes.sizeof(self)


class _JoinOpts(_Sized):
    _fields_ = [("size", ctypes.c_uint32), ("timeout_ms", ctypes.c_int32),
                ("socket_path", ctypes.c_char_p), ("on_device", ctypes.c_int32),
                ("device", ctypes.c_int32), ("autostart", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


class _GatherOpts(_Sized):
    _fields_ = [("size", ctypes.c_uint32), ("pad_first", ctypes.c_int32),
                ("pad_value", ctypes.c_double), ("valid_rows", ctypes.c_int64),
                ("keep_rows", ctypes.c_int64), ("order", ctypes.c_int32),
                ("root", ctypes.c_int32), ("same_rows", ctypes.c_uint64)]


_ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Engine(_Sized):
    _fields_ = [("size", ctypes.c_uint32), ("nodes", ctypes.c_int32), ("node", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("ctx", ctypes.c_void_p),
                ("allgather", _ALLGATHER), ("release", _RELEASE)]


def _candidates():
    env = os.environ.get("DEVAL_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libdeval.so.0")                        # installed beside us
    import glob                                                      # a wheel keeps no links
    yield from sorted(glob.glob(os.path.join(here, "libdeval.so.0.*")))
    for build in ("build", "build-release", "build-asan"):           # a source tree's build
        yield os.path.join(here, "..", "..", build, "libdeval.so.0")
    try:                                                             # meson install's libdir
        from . import _config
        yield os.path.join(_config.LIBDIR, "libdeval.so.0")
    except ImportError:
        pass
    yield "libdeval.so.0"                             # the loader's own search, LD_LIBRARY_PATH
    found = ctypes.util.find_library("deval")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if path.startswith("/") and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.deval_path = path
            break
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    else:
        raise ImportError("deval: cannot find libdeval.so.0; build it (meson) or set "
                          "DEVAL_LIBRARY; tried: " + ", ".join(tried))
    G = ctypes.c_void_p
    T = ctypes.POINTER(_Tensor)
    sigs = {
        "deval_version": ([], ctypes.c_char_p),
        "deval_strerror": ([ctypes.c_int], ctypes.c_char_p),
        "deval_errmsg": ([G], ctypes.c_char_p),
        "deval_join": ([ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                        ctypes.POINTER(_JoinOpts), ctypes.POINTER(G)], ctypes.c_int),
        "deval_leave": ([G], ctypes.c_int),
        "deval_rank": ([G], ctypes.c_int),
        "deval_world_size": ([G], ctypes.c_int),
        "deval_group_name": ([G], ctypes.c_char_p),
        "deval_gather": ([G, ctypes.c_int, T, ctypes.POINTER(_GatherOpts), T], ctypes.c_int),
        "deval_gather_for_metrics": ([G, ctypes.c_int, T, ctypes.POINTER(_GatherOpts), T],
                                     ctypes.c_int),
        "deval_eval_begin": ([G, ctypes.c_int64, ctypes.c_int], ctypes.c_int),
        "deval_eval_end": ([G], ctypes.c_int),
        "deval_eval_batch": ([G], ctypes.c_int),
        "deval_eval_complete": ([G], ctypes.c_int),
        "deval_eval_missed": ([G], ctypes.c_int64),
        "deval_eval_replay_done": ([G], ctypes.c_int),
        "deval_eval_abandon": ([G], ctypes.c_int),
        "deval_eval_begin_keys": ([G, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
        "deval_eval_batch_keys": ([G, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)],
                                  ctypes.c_int),
        "deval_pad_across_processes": ([G, T, ctypes.c_int, ctypes.c_double, ctypes.c_bool, T],
                                       ctypes.c_int),
        "deval_gather_objects": ([G, ctypes.c_size_t, ctypes.POINTER(_Bytes),
                                  ctypes.POINTER(_GatherOpts), ctypes.POINTER(ctypes.c_size_t),
                                  ctypes.POINTER(ctypes.POINTER(_Bytes))], ctypes.c_int),
        "deval_gather_objects_for_metrics": ([G, ctypes.c_size_t, ctypes.POINTER(_Bytes),
                                              ctypes.POINTER(_GatherOpts),
                                              ctypes.POINTER(ctypes.c_size_t),
                                              ctypes.POINTER(ctypes.POINTER(_Bytes))],
                                             ctypes.c_int),
        "deval_reduce": ([G, T, ctypes.c_int], ctypes.c_int),
        "deval_broadcast": ([G, T, ctypes.c_int], ctypes.c_int),
        "deval_broadcast_bytes": ([G, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.POINTER(_Bytes)], ctypes.c_int),
        "deval_barrier": ([G], ctypes.c_int),
        "deval_join_spanning": ([ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.POINTER(_JoinOpts),
                                 ctypes.POINTER(_Engine), ctypes.POINTER(G)], ctypes.c_int),
        "deval_nodes": ([G, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "deval_job_spans": ([ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int),
        "deval_dtype_size": ([ctypes.c_int], ctypes.c_size_t),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


def __getattr__(name):
    """deval.accelerate and deval.torchmetrics without importing them (nor accelerate, torch,
    torchmetrics) at import deval."""
    if name in ("accelerate", "torchmetrics"):
        import importlib
        return importlib.import_module("deval." + name)
    raise AttributeError("module 'deval' has no attribute %r" % name)


_lib = _load()
__version__ = _lib.deval_version().decode()
# one element's bytes by deval dtype (index 0 and unknown codes: 0), libdeval's own table
_DTYPE_SIZES = tuple(_lib.deval_dtype_size(code) for code in range(11))


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
            spec = importlib.util.spec_from_file_location(__name__ + "._speed", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


_speed = _load_speed()
# the entry points the fast path calls, as addresses: the one libdeval of the process
_GATHER = ctypes.cast(_lib.deval_gather, ctypes.c_void_p).value
_GATHER_FOR_METRICS = ctypes.cast(_lib.deval_gather_for_metrics, ctypes.c_void_p).value


# ---- dtypes ------------------------------------------------------------------------------

try:  # bfloat16 for numpy, where the package that defines it is installed
    import ml_dtypes as _ml_dtypes
    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_NP_TO_DEVAL = {
    np.dtype(np.bool_): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int16): 4,
    np.dtype(np.int32): 5, np.dtype(np.int64): 6, np.dtype(np.float16): 7,
    np.dtype(np.float32): 9, np.dtype(np.float64): 10,
}
if _BF16 is not None:
    _NP_TO_DEVAL[_BF16] = 8
_DEVAL_TO_NP = {v: k for k, v in _NP_TO_DEVAL.items()}
_DEVAL_TO_NP[8] = np.dtype(np.uint16) if _BF16 is None else _BF16  # raw bits without ml_dtypes
_DEVAL_TO_NP_RAW = dict(_DEVAL_TO_NP)
_DEVAL_TO_NP_RAW[8] = np.dtype(np.int16)  # bfloat16's bits, for torch to view

# deval_tensor as bytes: data, dtype, ndim, shape[8], device, reserved (88 bytes)
_TENSOR = struct.Struct("@Pii8qii")
assert _TENSOR.size == ctypes.sizeof(_Tensor)
_MODULES = sys.modules
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
    _speed.configure(np.ndarray, np.empty, _NP_TO_DEVAL,
                     (None,) + tuple(_DEVAL_TO_NP_RAW[c] for c in range(1, 11)), ProtocolError,
                     _torch_codes, _DTYPE_SIZES)


# deval_gather()'s C type with every pointer an address, for the addresses _Fast is given
_GATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p)
_CALLS = {}  # an entry point's address -> it, callable


class _Fast:
    """_speed.gather() in Python, for a group where the extension is not loaded. Its
    descriptors are packed into ctypes arrays kept for the group, and each result is copied
    once, from shared memory into a new tensor of the input's kind. It stays beside _speed
    because the extension is optional (built only where Python's headers are found; off with
    DEVAL_PYTHON_EXTENSION=0), and the general path is 1.2x to 2x slower on these inputs."""

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
        r = call(handle, n, self.in_addr, opts, self.out_addr)
        if r:
            return r
        res = self.results(n, kinds)
        if how is None:
            return res[0]
        if type(how) is dict:
            return dict(zip(how.keys(), res))
        return how(res)

    def leaves(self, x):
        """The inputs of one call, and how to rebuild its structure."""
        if type(x) in (tuple, list):
            return list(x), type(x)
        if type(x) is dict:
            return list(x.values()), x
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
                if not v.is_cpu or not v.is_contiguous() or v.dim() > MAX_DIMS:
                    return None
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


_REDUCTIONS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}
_ORDERS = {"rank": 0, "strided": 1}


def _torch():
    return _MODULES.get("torch")


class DeviceView:
    """A result in GPU memory: shape, dtype, device and ``__cuda_array_interface__``.

    cupy, numba and torch take it without copying (``torch.as_tensor(v, device="cuda")``);
    like ``copy=False`` results it is valid until the group's next collective.
    """

    __slots__ = ("ptr", "shape", "dtype", "device", "__weakref__")

    def __init__(self, ptr, shape, dtype, device):
        self.ptr, self.shape, self.dtype, self.device = ptr, shape, dtype, device

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def __repr__(self):
        return "DeviceView(shape=%r, dtype=%s, device=%d)" % (self.shape, self.dtype,
                                                              self.device)


def _cai_dtype(cai):
    try:
        return np.dtype(cai["typestr"])
    except TypeError:
        raise InvalidArgument("deval: a device array of type %r is not supported"
                              % (cai["typestr"],), -1) from None


class _Leaf:
    """One tensor-like input, as a contiguous numpy array, and how to give results back.

    With on_device (a device group's gathers), CUDA tensors stay where they are: kind
    "cuda", described by their device pointer.
    """

    __slots__ = ("array", "dtype", "kind", "device", "torch_dtype", "ptr", "shape", "keep")

    def __init__(self, x, on_device=False):
        torch = _torch()
        self.kind = "numpy"
        self.device = None
        self.torch_dtype = None
        if on_device and self._cuda(x, torch):
            return
        if torch is not None and isinstance(x, torch.Tensor):
            self.kind = "torch"
            self.device = x.device
            self.torch_dtype = x.dtype
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()  # the host backend works on host memory; results go back
            t = t.contiguous()
            if t.dtype == torch.bfloat16:
                self.array = t.view(torch.int16).numpy().view(np.uint16)
                self.dtype = 8
                return
            a = t.numpy()
        elif isinstance(x, np.ndarray):
            a = x
        elif isinstance(x, (bool, np.bool_)):
            self.kind = "scalar"
            a = np.asarray(x, dtype=np.bool_)
        elif isinstance(x, (int, np.integer)):
            self.kind = "scalar"
            a = np.asarray(x, dtype=np.int64)
        elif isinstance(x, (float, np.floating)):
            self.kind = "scalar"
            a = np.asarray(x, dtype=np.float64)
        else:
            raise InvalidArgument("deval: cannot send a %s; pass numpy arrays, torch tensors, "
                                  "Python scalars, or tuples, lists and dicts of them"
                                  % type(x).__name__, -1)
        if a.dtype not in _NP_TO_DEVAL:
            raise InvalidArgument("deval: dtype %s is not supported (bool, uint8, int8, int16, "
                                  "int32, int64, float16, bfloat16, float32, float64)" % a.dtype,
                                  -1)
        if a.ndim > MAX_DIMS:
            raise InvalidArgument("deval: %d dims, at most %d" % (a.ndim, MAX_DIMS), -1)
        # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
        self.array = a if a.flags.c_contiguous else np.array(a, order="C")
        self.dtype = _NP_TO_DEVAL[a.dtype]

    def _cuda(self, x, torch):
        """Describe a device array in place; False if it is not one after all."""
        is_torch = torch is not None and isinstance(x, torch.Tensor)
        if is_torch:
            if x.device.type != "cuda":
                return False
            t = x.detach().contiguous()
            self.torch_dtype = t.dtype
            self.device = t.device
            if t.dtype == torch.bfloat16:
                dtype = 8
            else:
                dtype = _NP_TO_DEVAL.get(torch.empty(0, dtype=t.dtype).numpy().dtype)
            # the tensor must be written before devald's copy reads it
            torch.cuda.current_stream(t.device).synchronize()
            self.kind, self.keep, self.ptr = "torch-cuda", t, t.data_ptr()
            self.shape, index = tuple(t.shape), t.device.index
        else:
            try:
                cai = x.__cuda_array_interface__
            except AttributeError:
                return False
            shape = tuple(cai["shape"])
            dt = _cai_dtype(cai)
            strides = cai.get("strides")
            if strides is not None and tuple(strides) != tuple(
                    math.prod(shape[i + 1:]) * dt.itemsize
                    for i in range(len(shape))):
                raise InvalidArgument("deval: device arrays must be C-contiguous", -1)
            if cai.get("mask") is not None:
                raise InvalidArgument("deval: masked device arrays are not supported", -1)
            dtype = _NP_TO_DEVAL.get(dt)
            dev = getattr(x, "device", None)
            index = getattr(dev, "id", dev if isinstance(dev, int) else None)
            self.kind, self.keep, self.ptr, self.shape = "cuda", x, cai["data"][0], shape
        if dtype is None:
            raise InvalidArgument("deval: this device array's dtype is not supported", -1)
        if len(self.shape) > MAX_DIMS:
            raise InvalidArgument("deval: %d dims, at most %d" % (len(self.shape), MAX_DIMS),
                                  -1)
        self.dtype = dtype
        self.array = None
        self.device = self.device if is_torch else index
        return True

    @property
    def ndim(self):
        return len(self.shape) if self.array is None else self.array.ndim

    def fill(self, t, group_device=None):
        if self.array is not None:
            _fill(self.array, self.dtype, t)
            return
        t.data = self.ptr or None
        t.dtype = self.dtype
        t.ndim = len(self.shape)
        for d, n in enumerate(self.shape):
            t.shape[d] = n
        index = self.device.index if self.kind == "torch-cuda" else self.device
        t.device = group_device if index is None else index

    def wrap_device(self, v):
        """Give a result in GPU memory (a DeviceView) back in the input's kind."""
        if self.kind == "cuda":
            return v
        torch = _torch()
        if torch is None:
            raise NotSupported("deval: this device group's result is in GPU memory, and "
                               "reading a numpy or scalar input's result back needs torch; "
                               "pass device arrays, or use a host group", -10)
        out = torch.as_tensor(v, device="cuda:%d" % v.device).clone()
        # the copy must be done before the next collective reuses devald's memory
        torch.cuda.current_stream(out.device).synchronize()
        if self.torch_dtype == torch.bfloat16:
            out = out.view(torch.bfloat16)
        if self.kind in ("torch-cuda", "torch"):
            return out.to(self.device)
        a = out.cpu().numpy()
        if self.dtype == 8 and _BF16 is not None:
            a = a.view(_BF16)
        return a.item() if self.kind == "scalar" and a.ndim == 0 else a

    def wrap(self, a):
        """Give a result array back in the input's kind."""
        if self.kind == "torch":
            torch = _torch()
            if self.torch_dtype == torch.bfloat16:
                out = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            else:
                out = torch.from_numpy(a if a.flags.writeable else a.copy())
            return out.to(self.device) if self.device.type != "cpu" else out
        if self.kind == "scalar" and a.ndim == 0:
            return a.item()
        return a


def _fill(a, dtype, t):
    """Describe the contiguous array a to libdeval in t (a must outlive the call)."""
    t.data = a.ctypes.data if a.size else None
    t.dtype = dtype
    t.ndim = a.ndim
    t.shape[:a.ndim] = a.shape
    t.device = -1


def _view(t, copy):
    """A result descriptor as a numpy array: a read-only view, or a copy."""
    dtype = _DEVAL_TO_NP[t.dtype]
    shape = tuple(t.shape[:t.ndim])
    n = math.prod(shape) * dtype.itemsize  # (np.prod costs microseconds a call)
    if n == 0 or not t.data:
        return np.zeros(shape, dtype=dtype)
    buf = (ctypes.c_char * n).from_address(t.data)
    a = np.frombuffer(buf, dtype=dtype).reshape(shape)
    if copy:
        return a.copy()
    a.flags.writeable = False
    return a


def _device_view(t):
    """A result descriptor in GPU memory as a DeviceView."""
    dtype = _DEVAL_TO_NP[t.dtype]
    if t.dtype == 8:
        dtype = np.dtype(np.uint16)  # bfloat16's bits; torch views them back
    return DeviceView(t.data or 0, tuple(t.shape[d] for d in range(t.ndim)), dtype, t.device)


def _result(leaf, t, copy):
    return leaf.wrap_device(_device_view(t)) if t.device >= 0 else leaf.wrap(_view(t, copy))


def _flatten(x, leaves, on_device=False):
    """Split a nested structure into leaves and a template to rebuild it."""
    if isinstance(x, collections.abc.Mapping):  # a ModelOutput, say: rebuilt as its type
        return (dict, [(k, _flatten(v, leaves, on_device)) for k, v in x.items()],
                None if type(x) is dict else type(x))
    if isinstance(x, (list, tuple)):
        return (type(x), [_flatten(v, leaves, on_device) for v in x])
    leaves.append(_Leaf(x, on_device))
    return (None, len(leaves) - 1)


def _data_mask(x, ids):
    """Bit i: leaf i of x (in _flatten's order) is one of ids."""
    mask, i, todo = 0, 0, [x]
    while todo:
        v = todo.pop()
        if isinstance(v, collections.abc.Mapping):
            todo.extend(reversed(list(v.values())))
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


def _check_samples(leaves, template):
    """In an eval pass every tensor of a gather_for_metrics call is per sample: at least one
    dim, and the same rows as the others, so that dropping a duplicate sample drops its row
    from every tensor."""
    rows = [None if leaf.ndim == 0 else (leaf.array.shape[0] if leaf.array is not None
                                         else leaf.shape[0]) for leaf in leaves]
    if all(r is not None for r in rows) and len(set(rows)) <= 1:
        return
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


_END = object()


def _rebuild(template, results):
    kind, body = template[0], template[1]
    if kind is None:
        return results[body]
    if kind is dict:
        d = {k: _rebuild(v, results) for k, v in body}
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


# ---- groups ------------------------------------------------------------------------------

def _env_int(name):
    v = os.environ.get(name)
    if v is None:
        raise InvalidArgument("deval.join: no %s given and $%s is not set" % (name.lower(), name),
                              -1)
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument("deval.join: $%s is %r, not a number" % (name, v), -1) from None


def _spans_machines():
    """What the launcher says when it runs this job on more than one machine, as a phrase;
    None when it does not say so, or when $DEVAL_ONE_MACHINE=1 says every rank runs here.
    libdeval's launcher table decides (deval_job_spans), as it does for deval_join."""
    why = ctypes.create_string_buffer(256)
    return why.value.decode() if _lib.deval_job_spans(why, len(why)) == 1 else None


class _TorchEngine:
    """torch.distributed between the node leaders: a gloo group of the leaders alone, point to
    point, so that a leader that fails or does not answer in time is named."""

    def __init__(self, dist, leaders, node, timeout_s):
        from datetime import timedelta
        self.dist = dist
        self.leaders = leaders  # global rank of each node's leader, by node
        self.node = node
        # every rank of the job takes part in creating it, as torch.distributed asks
        self.pg = dist.new_group(leaders, backend="gloo",
                                 timeout=timedelta(seconds=timeout_s if timeout_s > 0 else 1e7))
        self.fn = _ALLGATHER(self.allgather)  # kept alive with the group
        self.release_fn = _RELEASE(self.release)

    def release(self, ctx=None):
        """The leaders' group goes with the deval group (deval_leave(), or a failed join)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            with contextlib.suppress(Exception):  # (torch.distributed already torn down)
                self.dist.destroy_process_group(pg)

    def allgather(self, ctx, send, recv, length, timeout_ms, why, why_len):
        import time
        from datetime import timedelta
        node = self.node
        try:
            import torch
            dist = self.dist
            # the leader's bytes and every node's place in recv, as tensors: no copies
            mine = torch.frombuffer((ctypes.c_uint8 * length).from_address(send),
                                    dtype=torch.uint8)
            works = []
            for node, r in enumerate(self.leaders):
                if node != self.node:
                    buf = torch.frombuffer((ctypes.c_uint8 * length).from_address(
                        recv + node * length), dtype=torch.uint8)
                    works.append((node, dist.irecv(buf, src=r, group=self.pg)))
            sends = [(node, dist.isend(mine, dst=r, group=self.pg))
                     for node, r in enumerate(self.leaders) if node != self.node]
            end = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
            for node, w in works + sends:
                if end is None:
                    w.wait()
                else:
                    w.wait(timedelta(seconds=max(end - time.monotonic(), 0.001)))
            if send != recv + self.node * length:
                ctypes.memmove(recv + self.node * length, send, length)
            return 0
        except BaseException as e:  # never into ctypes, which would answer 0
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            late = "timed out" in text.lower() or "timeout" in text.lower()
            msg = ("node %d (leader rank %d) did not answer within %d ms: %s" if late else
                   "node %d (leader rank %d) failed: %s") % (
                       (node, self.leaders[node], timeout_ms, text) if late else
                       (node, self.leaders[node], text))
            raw = msg.encode(errors="replace")[:max(why_len - 1, 0)]
            ctypes.memmove(why, raw + b"\0", len(raw) + 1)
            return -5 if late else -3


def _join_spanning(group, said, opts):
    """deval.join() in a job that its launcher says spans machines: each machine's ranks meet
    in its devald, and its leader (its lowest rank) swaps the node's part with the other
    leaders through torch.distributed, which must be initialised."""
    try:
        import torch.distributed as dist
        ready = dist.is_available() and dist.is_initialized()
    except ImportError:
        ready = False
    if not ready:
        raise NotSupported(
            "deval.join: this job runs on more than one machine: %s. A deval group spans "
            "machines through the job's own torch.distributed, which is not initialised: call "
            "torch.distributed.init_process_group() (or create the Accelerator) before "
            "deval.join(). Set DEVAL_ONE_MACHINE=1 if every rank does run here" % said, -10)
    rank, world = dist.get_rank(), dist.get_world_size()
    node_id = (os.environ.get("DEVAL_NODE") or os.environ.get("GROUP_RANK") or
               os.environ.get("SLURM_NODEID") or __import__("socket").gethostname())
    # deval's own gloo groups, whatever the job's backend (NCCL's would move these bytes
    # through GPUs the ranks may not have chosen yet); every rank takes part in making them
    everyone = dist.new_group(backend="gloo")
    layout = [None] * world
    try:
        dist.all_gather_object(layout, node_id, group=everyone)
    finally:
        dist.destroy_process_group(everyone)
    ids = []
    for nid in layout:  # nodes numbered by their lowest rank
        if nid not in ids:
            ids.append(nid)
    mine = [r for r, n in enumerate(layout) if n == node_id]  # local ranks in rank order
    local_rank, local = mine.index(rank), len(mine)
    leaders = [layout.index(nid) for nid in ids]
    node = ids.index(node_id)
    timeout_s = 300 if opts.timeout_ms == 0 else opts.timeout_ms / 1000
    engine = _TorchEngine(dist, leaders, node, timeout_s)
    e = _Engine()
    e.nodes, e.node, e.allgather, e.release = len(ids), node, engine.fn, engine.release_fn
    handle = ctypes.c_void_p()
    r = _lib.deval_join_spanning(None if group is None else group.encode(), rank, world,
                                 local_rank, local, ctypes.byref(opts), ctypes.byref(e),
                                 ctypes.byref(handle))
    if r != 0:
        msg = _lib.deval_errmsg(None).decode(errors="replace")
        engine.release()  # (libdeval releases only what it joined)
        raise _ERRORS.get(r, Error)(msg, r)
    g = Group(handle, _lib.deval_group_name(handle).decode(), rank, world)
    g._engine = engine
    g.nodes, g.node = len(ids), node
    return g


def _device_index(device):
    """A CUDA ordinal from an int, "cuda:N" or a torch.device; None for no device."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidArgument("deval.join: device must be a CUDA ordinal", -1)
    if isinstance(device, (int, np.integer)):
        return int(device)
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind is None and isinstance(device, str):
        kind, _, rest = device.partition(":")
        index = int(rest) if rest.isdigit() else None if not rest else -1
    if kind != "cuda" or (index is not None and index < 0):
        raise InvalidArgument("deval.join: device %r is not a CUDA device" % (device,), -1)
    if index is None:
        torch = _torch()
        index = torch.cuda.current_device() if torch is not None else 0
    return index


def join(group=None, rank=None, world_size=None, socket=None, timeout=None, device=None,
         autostart=None):
    """Join ``group`` as ``rank`` of ``world_size`` ranks; waits until every rank joined.

    With no group, the name, rank and world size come from the launcher that started the
    process (torchrun and accelerate launch, Open MPI's mpirun, Slurm's srun, python -m
    deval.launch): every rank of one job joins the same group and no other job does. With a
    group, rank and world_size default to $RANK and $WORLD_SIZE. socket defaults to
    $DEVAL_SOCKET or the default path; timeout (seconds) bounds the join and every
    collective (None: 300 s; a negative value: forever). device (an ordinal, "cuda:N" or a
    torch.device) makes this a device group: devald must run the cuda backend, every rank
    names its GPU, and gathered CUDA tensors stay on the GPUs. When no devald answers and no
    socket was named, one is started for this user unless autostart is False (default: on
    unless $DEVAL_AUTOSTART=0). When the launcher says the job spans machines (torchrun's
    $LOCAL_WORLD_SIZE below $WORLD_SIZE, mpirun's $OMPI_COMM_WORLD_LOCAL_SIZE below its size,
    srun on more than one node) and neither rank nor world_size is given, the group spans
    them: each machine's ranks (by $DEVAL_NODE, $GROUP_RANK, $SLURM_NODEID or the host name)
    meet in its devald, and one rank per machine exchanges the machine's part with the
    others through torch.distributed (a gloo group of those ranks), which must be initialised
    first (NotSupported says so otherwise); results are those of one machine.
    $DEVAL_ONE_MACHINE=1 says every rank runs here. A second join() with the same arguments
    in a process that holds the group (a helper joining again) returns that group.
    """
    if group is not None and not isinstance(group, str):
        raise InvalidArgument("deval.join: the group name must be a str", -1)
    spans = _spans_machines() if world_size is None and rank is None else None
    if group is not None:
        rank = _env_int("RANK") if rank is None else rank
        world_size = _env_int("WORLD_SIZE") if world_size is None else world_size
    else:  # libdeval reads the launcher's variables
        rank = -1 if rank is None else rank
        world_size = -1 if world_size is None else world_size
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world_size)):
        raise InvalidArgument("deval.join: rank and world_size must be ints", -1)
    if not -2**31 <= rank < 2**31 or not -2**31 <= world_size < 2**31:
        raise InvalidArgument("deval.join: rank or world_size out of range", -1)
    if socket is not None and not isinstance(socket, (str, os.PathLike)):
        raise InvalidArgument("deval.join: socket must be a path", -1)
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float))):
        raise InvalidArgument("deval.join: timeout must be a number of seconds", -1)
    index = _device_index(device)
    key = (group, os.fspath(socket) if socket else None, rank, world_size, index)
    held = _HELD.get(key)
    if held is not None and held._h and held._pid == os.getpid():
        return held  # (a helper joining again: the group this process holds)
    opts = _JoinOpts()
    opts.socket_path = os.fsencode(socket) if socket else None
    if index is not None:
        opts.on_device, opts.device = 1, index
    if autostart is not None:
        opts.autostart = 1 if autostart else -1
    if timeout is None:
        opts.timeout_ms = 0
    elif timeout < 0:
        opts.timeout_ms = -1
    else:
        opts.timeout_ms = max(1, min(int(timeout * 1000), 2**31 - 1))
    if spans is not None:
        g = _HELD[key] = _join_spanning(group, spans, opts)
        return g
    handle = ctypes.c_void_p()
    r = _lib.deval_join(None if group is None else group.encode(), rank, world_size,
                        ctypes.byref(opts), ctypes.byref(handle))
    if r != 0:
        msg = _lib.deval_errmsg(None).decode(errors="replace")
        raise _ERRORS.get(r, Error)(msg, r)
    if group is None:  # what libdeval found
        group = _lib.deval_group_name(handle).decode()
        rank, world_size = _lib.deval_rank(handle), _lib.deval_world_size(handle)
    g = _HELD[key] = Group(handle, group, rank, world_size, index)
    return g


_HELD = weakref.WeakValueDictionary()  # join()'s arguments -> the group they joined


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
        self._fast = _fast_path() if device is None else None  # (_Fast.gather's contract)
        # what the fast path is given: the handle's address (0 once left), default options
        self._addr = handle.value if self._fast is not None else 0
        self._opts_cache = {}
        self._plain = self._opts()
        self._plain_addr = ctypes.addressof(self._plain)
        self._masked = {}  # same_rows -> default options with it (_masked_addr())

    # -- plumbing

    def _handle(self):
        if not self._h:
            raise InvalidArgument("deval: group %r is closed" % self.name, -1)
        if self._left is not None:  # the pass this rank left failed the others: say so here
            e, self._left = self._left, None
            self._addr = self._h.value if self._fast is not None else 0
            raise e
        return self._h

    def _left_pass(self, e):
        """This rank left a pass (a break) that failed the other ranks: its next call raises
        e, so that no rank goes on as if the pass had been whole."""
        self._left = e
        self._addr = 0  # (the plain gather's fast path goes through _handle() meanwhile)

    def _check(self, r):
        if r != 0:
            msg = _lib.deval_errmsg(self._h).decode(errors="replace")
            if self._in_pass and r == Mismatch.status and " left the eval pass " in msg:
                self._pass_ended = True  # (dv_pass_park_msg's words: the pass is over)
            raise _ERRORS.get(r, Error)(msg, r)

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

    def _gather(self, fn, x, copy, opts, per_sample=False):
        """The general path: any structure of any inputs (the plain ones, when the fast path
        did not take them)."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves, self.device is not None)
        n = len(leaves)
        if n == 0:
            raise InvalidArgument("deval: nothing to gather", -1)
        if per_sample:
            _check_samples(leaves, template)
        if n > MAX_TENSORS:
            raise InvalidArgument("deval: %d tensors in one call, at most %d"
                                  % (n, MAX_TENSORS), -1)
        ins = (_Tensor * n)()
        outs = (_Tensor * n)()
        for leaf, t in zip(leaves, ins):
            leaf.fill(t, self.device)
        self._check(fn(h, n, ins, ctypes.byref(opts), outs))
        results = [_result(leaf, t, copy) for leaf, t in zip(leaves, outs)]
        return _rebuild(template, results)

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
        o.pad_value = float(pad_value)
        o.pad_first = bool(pad_first)
        o.valid_rows = -1 if valid_rows is None else int(valid_rows)
        o.keep_rows = -1 if keep_rows is None else int(keep_rows)
        o.order = order
        o.root = -1 if root is None else int(root)
        return o

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
        out = self._gather_for_metrics(x, copy, use_gather_object, pad_index, pad_first)
        if _loop.ACTIVE:  # (a metric updated with it takes every rank's rows as they are)
            _loop.ACTIVE[-1].gathered.append(out)
        return out

    def _gather_for_metrics(self, x, copy=True, use_gather_object=False, pad_index=0,
                            pad_first=False):
        """Gather x and, inside an eval pass, drop the samples past the dataset's end.

        Inside a pass, every tensor of one call is per sample: dim 0 is the sample dim and
        all tensors of the call have the same rows; a 0-d tensor, or rows that differ, raise
        InvalidArgument naming the tensor (nothing is sent). Lists of non-tensors (decoded
        text, say) go through gather_object's path, as in Accelerate;
        ``use_gather_object=True`` forces it.
        """
        keyed = self._keyed
        # in a pass with keys, the tensors that are the batch's own data: duplicates repeat
        # them (and libdeval, not this rank, checks rows per sample: k whole rows each)
        mask = _data_mask(x, self._batch_ids) if keyed and self._batch_ids else 0
        if self._addr and copy and not use_gather_object:
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
        # a list holding no tensor (an empty one included: a rank with no batch left) is a
        # list of objects, so that every rank makes the same call
        objects = use_gather_object or (isinstance(x, list) and not any(
            isinstance(v, np.ndarray) or _is_torch(v) for v in x))
        opts = self._opts(pad_index, pad_first)
        if objects and keyed:
            mask = int(id(x) in self._batch_ids)
        if mask:
            opts = self._make_opts(pad_index, pad_first)
            opts.same_rows = mask
        if objects:
            return self._objects(_lib.deval_gather_objects_for_metrics, _object_items(x), opts)
        # (with keys, libdeval checks rows per sample: k whole rows each)
        return self._gather(_lib.deval_gather_for_metrics, x, copy, opts,
                            per_sample=self._in_pass and not keyed)

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

        ONE gather_for_metrics call per batch (a tuple or dict of tensors is one call): every
        call's rows count as the next samples of the dataset. For several calls per batch use
        eval_loop(loader), which knows where batches begin. A rank whose loader runs out
        first may leave the block early (devald answers the others' gathers for it), but its
        results then lack their last batches, so it raises Mismatch: use eval_loop to have
        them replayed. (eval_loop also checks that the pass returned all num_samples
        samples; here a sampler with drop_last may legitimately return fewer.)
        """
        h = self._handle()
        n, o = self._pass_args(num_samples, order)
        self._check(_lib.deval_eval_begin(h, n, o))
        self._in_pass = True
        try:
            yield self
        except BaseException:
            self._in_pass = False
            with contextlib.suppress(Error):  # the group may be what failed
                self._check(_lib.deval_eval_abandon(self._handle()))
            raise
        self._in_pass = False
        self._check(_lib.deval_eval_end(self._handle()))
        missed = _lib.deval_eval_missed(self._h)
        if missed > 0:
            _lib.deval_eval_replay_done(self._h)
            raise Mismatch("deval.eval_pass: this rank left the pass %d batches before the "
                           "others, so its results lack theirs; use eval_loop(loader), which "
                           "replays them, or run as many batches on every rank" % missed, -2)

    def eval_loop(self, loader, num_samples=None, order=None):
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
            if isinstance(e, _loop.ShardedTwice) or num_samples is None or (
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
        return self._run_loop(lambda: iter(wrapper), num_samples, order, loader)

    def _run_loop(self, make_iter, num_samples, order, loader=None):
        """The generator behind eval_loop: a pass over the loader, open from its first batch."""
        lp = _LoopPass(self, num_samples, order, loader)
        lp.open_now = True
        return lp.run(make_iter)

    def pad_across_processes(self, x, dim=0, pad_index=0, pad_first=False, copy=True):
        """Pad every tensor in x along dim to the largest size any rank has there."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves, self.device is not None)
        results = []
        for leaf in leaves:
            nd = leaf.ndim
            if dim >= nd or dim < -nd:  # Accelerate returns such a tensor as it is
                if leaf.array is None:
                    results.append(leaf.keep.clone() if leaf.kind == "torch-cuda" else leaf.keep)
                else:
                    results.append(leaf.wrap(leaf.array.copy() if copy else leaf.array))
                continue
            t, out = _Tensor(), _Tensor()
            leaf.fill(t, self.device)
            self._check(_lib.deval_pad_across_processes(h, ctypes.byref(t), int(dim),
                                                        float(pad_index), bool(pad_first),
                                                        ctypes.byref(out)))
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

    def reduce(self, x, reduction="sum", scale=1.0):
        """Element-wise reduction over ranks, in rank order; returns new tensors."""
        h = self._handle()
        if reduction not in _REDUCTIONS:
            raise InvalidArgument("deval: reduction must be one of %s, not %r"
                                  % (", ".join(_REDUCTIONS), reduction), -1)
        leaves = []
        template = _flatten(x, leaves)
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

    def broadcast(self, x, from_process=0):
        """Every rank gets from_process's tensors (same dtypes and shapes on every rank)."""
        h = self._handle()
        leaves = []
        template = _flatten(x, leaves)
        results = []
        for leaf in leaves:
            a = leaf.array.copy()
            t = _Tensor()
            _fill(a, leaf.dtype, t)
            self._check(_lib.deval_broadcast(h, ctypes.byref(t), int(from_process)))
            results.append(leaf.wrap(a))
        return _rebuild(template, results)

    # -- objects

    def _objects(self, fn, items, opts=None):
        h = self._handle()
        blobs = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in items]
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

    def broadcast_object(self, obj, from_process=0):
        """from_process's object, on every rank."""
        h = self._handle()
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if \
            self.rank == from_process else b""
        buf = ctypes.create_string_buffer(data, len(data))
        out = _Bytes()
        self._check(_lib.deval_broadcast_bytes(h, buf, len(data), int(from_process),
                                               ctypes.byref(out)))
        return pickle.loads(ctypes.string_at(out.data, out.len))

    def barrier(self):
        """Return once every rank has called it."""
        self._check(_lib.deval_barrier(self._handle()))

    wait_for_everyone = barrier  # Accelerate's name


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
                _loop.check_loader(loader, draws is not None)
            except ValueError as e:
                raise InvalidArgument("deval.eval_loop: %s" % e, -1) from None
        if base is not None and self.n > self.num_keys:
            raise InvalidArgument("deval.eval_loop: num_samples is %d, but this rank's dataset "
                                  "holds %d samples: its indices name the samples, so every "
                                  "rank must read the whole dataset (a shard or Subset of its "
                                  "own on each rank makes them collide); give every rank the "
                                  "whole dataset behind a DistributedSampler"
                                  % (self.n, self.num_keys), -1)
        self.keys = _loop.Keys(base, getattr(loader, "skip_batches", 0), draws) \
            if base is not None else None
        # where the rows of an iterable Accelerate shards stand, to tell its padding
        self.rows = _loop.shard_rows(loader) if loader is not None and self.keys is None \
            else None
        self.dealt = 0  # samples of the iterable so far
        self.real = None  # the current batch's real samples (a bool array), when known
        self.samples = None  # how many samples the current batch holds, when known
        self.gathered = []  # what the current batch's gathers for metrics returned
        self.seq = None  # which of this process's loops it is
        self.open_now = False  # eval_loop: the pass opens before the first batch
        self.opened = False
        self.batches = 0  # batches yielded so far
        self.cur = None  # the current batch's keys

    def open(self):
        """Open the pass now (at the current batch), once."""
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
        if self.keys is None and self.batches > 1:
            raise InvalidArgument(
                "deval: the first gather_for_metrics of this loader's iteration came at its "
                "batch %d; its batches carry no dataset indices, so the samples of the batches "
                "before cannot be told apart from the rest: gather from its first batch on"
                % self.batches, -1)
        if self.keys is not None:
            g._check(_lib.deval_eval_begin_keys(h, self.n, self.num_keys))
        else:
            g._check(_lib.deval_eval_begin(h, self.n, self.o))
        if left is not None:
            with contextlib.suppress(Error):
                g._check(_lib.deval_eval_abandon(h))
            raise left
        self.opened = True
        g._in_pass, g._keyed = True, self.keys is not None
        if self.batches:
            self._declare()

    def _declare(self):
        h = self.g._handle()
        if self.keys is None:
            self.g._check(_lib.deval_eval_batch(h))
            return
        ks = self.cur or ()
        arr = (ctypes.c_int64 * max(1, len(ks)))(*ks)
        self.g._check(_lib.deval_eval_batch_keys(h, len(ks), arr))

    def _batch(self, batch):
        self.real = None
        self.gathered = []
        if self.keys is not None:
            try:
                self.cur = self.keys.next(batch)
            except ValueError as e:
                raise InvalidArgument("deval.eval_loop: %s" % e, -1) from None
            self.g._batch_ids = _loop.data_ids(batch)
            self.samples = len(self.cur)
            if self.keys.real is not None:
                self.real = np.array(self.keys.real, dtype=bool)
        else:
            self.samples = b = _loop.batch_samples(batch)
            if self.rows is not None and b is None:
                self.rows = None  # (rows it cannot count: from here on, unknown)
            elif self.rows is not None:
                n, at = self.rows
                self.real = np.array([at(self.dealt + m) < n for m in range(b)], dtype=bool)
                self.dealt += b
        self.batches += 1
        if self.opened:
            self._declare()

    def run(self, make_iter):
        _loop.LOOPS[0] += 1
        self.seq = _loop.LOOPS[0]
        _loop.ACTIVE.append(self)
        try:
            yield from self._run(make_iter)
        finally:
            _loop.ACTIVE.remove(self)

    def _run(self, make_iter):
        g = self.g
        h = g._h or g._handle()  # (a pass this rank left says so when this one opens)
        done, last = False, None
        with self.keys if self.keys is not None else contextlib.nullcontext():
            with self.keys.drawing() if self.keys is not None else contextlib.nullcontext():
                it = make_iter()
                batch = next(it, _END)  # (a generator's loader starts its iterator here)
            if self.open_now:
                self.open()
            g._pass_ended = False
            try:
                while batch is not _END:
                    self._batch(batch)
                    last = batch
                    yield batch
                    batch = next(it, _END)
                done = True
            finally:
                if self.opened:
                    g._in_pass = False
                # a break, or an exception: the others must hear, unless a step of the pass
                # failed because a rank left it, which ended it for every rank (devald's too)
                if self.opened and not done and not g._pass_ended:
                    try:
                        g._check(_lib.deval_eval_abandon(g._handle()))
                    except Mismatch as e:  # they went on: they fail, and so will this rank
                        g._left_pass(e)
                    except Error:
                        pass  # the group is what failed: its next call says so
                    g._keyed = False
        if not self.opened:
            return
        keyed, g._keyed = g._keyed, False
        g._check(_lib.deval_eval_complete(h))
        missed = _lib.deval_eval_missed(h)
        if missed <= 0:
            return
        pad = self._padding(last)
        if pad is _END:
            _lib.deval_eval_replay_done(h)
            raise Mismatch("deval.eval_loop: this rank's loader had no batch, so it cannot "
                           "replay the %d batches the other ranks gathered; use fewer "
                           "processes than batches (or even_batches=True)" % missed, -2)
        g._in_pass, g._keyed, g._replaying = True, keyed, True
        g._batch_ids = _loop.data_ids(pad)
        self.real, self.samples = np.zeros(1, dtype=bool), 1
        try:
            for _ in range(missed):
                self.batches += 1
                self._declare()
                yield pad
        except GeneratorExit:
            _lib.deval_eval_replay_done(h)
            raise
        finally:
            g._in_pass = g._keyed = g._replaying = False
        g._check(_lib.deval_eval_replay_done(h))

    def holds_gathered(self, args, kwargs):
        """Do the values args and kwargs hold (a metric's update) come from what a gather for
        metrics of the current batch returned (every rank's rows, not this rank's): the
        results themselves, views of them, or values with as many rows as a result and not
        one per sample of the batch?"""
        if not self.gathered:
            return False
        ids, ptrs, rows = set(), set(), set()
        todo = list(self.gathered)
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
                if v.shape[0] in rows and v.shape[0] != self.samples:
                    return True
        return False

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


def real_rows():
    """Which samples of the current batch are real, a bool numpy array, one per sample: False
    for the padding a sharding adds to even out the ranks' last batches (DistributedSampler's,
    Accelerate's even_batches) and for the batches a rank replays (see eval_loop). For the
    innermost loop deval runs (eval_loop, or a loader deval.accelerate hooked); None outside
    one, or where deval cannot tell which samples are padding. A running sum or count a rank
    keeps of its own is exact when it takes only these rows; attached torchmetrics metrics
    take only these rows by themselves."""
    return _loop.ACTIVE[-1].real if _loop.ACTIVE else None


def _order_code(order):
    """deval_order's number for "rank" or "strided"."""
    if order not in _ORDERS:
        raise InvalidArgument("deval: order must be 'rank' or 'strided', not %r" % (order,), -1)
    return _ORDERS[order]


def _object_items(x):
    """What gather_object gathers of x: a list's items, a tensor's rows, else x alone."""
    if isinstance(x, (list, tuple)) or ((isinstance(x, np.ndarray) or _is_torch(x))
                                        and x.ndim > 0):
        return list(x)
    return [x]


def _is_torch(v):
    torch = _torch()
    return torch is not None and isinstance(v, torch.Tensor)
