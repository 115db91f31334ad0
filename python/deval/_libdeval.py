# SPDX-License-Identifier: MIT
"""libdeval through ctypes: where the library is found, how it is loaded, the C structs and
callback types of include/deval.h, and the signature of every entry point the binding calls.

The process loads one libdeval, here, at import; every other module calls it as _lib. The
structs and constants are hand-written copies of the header's (tests/python/test_abi.py
compiles a probe against the header to check them); facts libdeval exports at run time are
asked of it instead: the size of each dtype (_DTYPE_SIZES, deval_dtype_size()). Nothing here
imports anything of deval's.
"""

import ctypes
import ctypes.util
import os

MAX_DIMS = 8
MAX_TENSORS = 64


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
                ("root", ctypes.c_int32), ("same_rows", ctypes.c_uint64),
                ("names", ctypes.c_uint64)]


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
        "deval_eval_abandon_why": ([G, ctypes.c_char_p], ctypes.c_int),
        "deval_refuse": ([G, ctypes.c_char_p], ctypes.c_int),
        "deval_eval_begin_keys": ([G, ctypes.c_int64, ctypes.c_int64], ctypes.c_int),
        "deval_eval_batch_keys": ([G, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)],
                                  ctypes.c_int),
        "deval_eval_resume": ([G, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p,
                               ctypes.c_size_t], ctypes.c_int64),
        "deval_eval_batch_digest": ([G, ctypes.c_uint64], ctypes.c_int),
        "deval_eval_journaled": ([G], ctypes.c_int),
        "deval_eval_batch_state": ([G, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int),
        "deval_eval_kept_state": ([G, ctypes.POINTER(ctypes.c_void_p),
                                   ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
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
        "deval_job_node": ([ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int),
        "deval_eval_open": ([G], ctypes.c_int),
        "deval_eval_progress": ([G, ctypes.POINTER(ctypes.c_int64),
                                 ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
        "deval_dtype_size": ([ctypes.c_int], ctypes.c_size_t),
        # not the API (libdeval.sym's DEVAL_PRIVATE): the user's calls, numbered (calls.h)
        "dv_calls": ([G], ctypes.c_uint32),
        "dv_uncount": ([G, ctypes.c_uint32], None),
        "dv_site_counted": ([G, ctypes.c_int], ctypes.c_int),
        "dv_site_next": ([G, ctypes.c_int, ctypes.c_int64], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


_lib = _load()

# one element's bytes by deval dtype (index 0 and unknown codes: 0), libdeval's own table
_DTYPE_SIZES = tuple(_lib.deval_dtype_size(code) for code in range(11))

_REDUCTIONS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}
_ORDERS = {"rank": 0, "strided": 1}
