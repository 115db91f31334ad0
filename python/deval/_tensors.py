# SPDX-License-Identifier: MIT
"""Values as deval tensors and back: which numpy and torch dtypes are deval's, how one input
(a numpy array, a torch tensor on the CPU or a GPU, a Python scalar, an object exposing
``__cuda_array_interface__``) is described to libdeval in a deval_tensor (_Leaf, _fill), and
how a result descriptor becomes an array, a tensor or a scalar of the input's kind again
(_view, _device_view, _result, DeviceView). One input at a time: the structures that hold
several (tuples, dicts, ...) are _nest's, the calls that move them _group's.
"""

import ctypes
import math
import sys

import numpy as np

from ._errors import InvalidArgument, NotSupported
from ._libdeval import MAX_DIMS

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

_MODULES = sys.modules


def _torch():
    return _MODULES.get("torch")


def _is_torch(v):
    torch = _torch()
    return torch is not None and isinstance(v, torch.Tensor)


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
            # (z.conj().imag's memory holds -imag; a conjugate view, z's imaginary parts)
            t = x.detach().resolve_neg().resolve_conj()
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
            t = x.detach().resolve_neg().resolve_conj().contiguous()
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
