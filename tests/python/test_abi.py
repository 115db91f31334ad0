# SPDX-License-Identifier: MIT
"""The binding's hand-written copies of include/deval.h against the header itself: a probe
compiled from the header prints every struct's size and field offsets, the status codes,
dtype numbers, orders and reduce ops, and each must match what python/deval declares. A
change of the header that the binding misses fails here, not in a user's process."""

import ctypes
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import deval
from conftest import ROOT

STRUCTS = {
    "deval_tensor": (deval._Tensor, ["data", "dtype", "ndim", "shape", "device", "reserved"]),
    "deval_bytes": (deval._Bytes, ["data", "len"]),
    "deval_join_opts": (deval._JoinOpts, ["size", "timeout_ms", "socket_path", "on_device",
                                          "device", "autostart", "reserved"]),
    "deval_gather_opts": (deval._GatherOpts, ["size", "pad_first", "pad_value", "valid_rows",
                                              "keep_rows", "order", "root", "same_rows",
                                              "names"]),
}
CONSTANTS = ["DEVAL_EINVAL", "DEVAL_EMISMATCH", "DEVAL_EPEER", "DEVAL_EDAEMON",
             "DEVAL_ETIMEDOUT", "DEVAL_ENOMEM", "DEVAL_EPERM", "DEVAL_EPROTO", "DEVAL_EABORTED",
             "DEVAL_ENOTSUP", "DEVAL_ESYS", "DEVAL_BOOL", "DEVAL_U8", "DEVAL_I8", "DEVAL_I16",
             "DEVAL_I32", "DEVAL_I64", "DEVAL_F16", "DEVAL_BF16", "DEVAL_F32", "DEVAL_F64",
             "DEVAL_MAX_DIMS", "DEVAL_MAX_TENSORS", "DEVAL_ORDER_RANK", "DEVAL_ORDER_STRIDED",
             "DEVAL_SUM", "DEVAL_MEAN", "DEVAL_MAX", "DEVAL_MIN", "DEVAL_PROD"]


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the probe")
    d = tmp_path_factory.mktemp("abi")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "deval.h"',
             "int main(void) {", 'printf("{");']
    for name, (_, fields) in STRUCTS.items():
        lines.append('printf("\\"%s\\": {\\"sizeof\\": %%zu", sizeof(%s));' % (name, name))
        for f in fields:
            lines.append('printf(", \\"%s\\": %%zu", offsetof(%s, %s));' % (f, name, f))
        lines.append('printf("}, ");')
    for c in CONSTANTS:
        lines.append('printf("\\"%s\\": %%d, ", (int)(%s));' % (c, c))
    lines += ['printf("\\"end\\": 0}\\n");', "return 0;", "}"]
    src = d / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = d / "probe"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"),
                    str(src), "-o", str(exe)], check=True)
    return json.loads(subprocess.run([str(exe)], capture_output=True, text=True,
                                     check=True).stdout)


@pytest.mark.parametrize("name", list(STRUCTS))
def test_struct_layouts(header, name):
    cls, fields = STRUCTS[name]
    assert ctypes.sizeof(cls) == header[name]["sizeof"], name
    declared = [f[0] for f in cls._fields_]
    assert declared == fields, "%s: the binding declares %s" % (name, declared)
    for f in fields:
        assert getattr(cls, f).offset == header[name][f], "%s.%s" % (name, f)


def test_status_codes(header):
    for cls in deval._ERRORS.values():
        c_name = {
            "InvalidArgument": "DEVAL_EINVAL", "Mismatch": "DEVAL_EMISMATCH",
            "PeerLost": "DEVAL_EPEER", "DaemonLost": "DEVAL_EDAEMON", "Timeout": "DEVAL_ETIMEDOUT",
            "OutOfMemory": "DEVAL_ENOMEM", "PermissionDenied": "DEVAL_EPERM",
            "ProtocolError": "DEVAL_EPROTO", "Aborted": "DEVAL_EABORTED",
            "NotSupported": "DEVAL_ENOTSUP", "SystemFailure": "DEVAL_ESYS"}[cls.__name__]
        assert cls.status == header[c_name], cls.__name__


def test_dtypes_orders_and_reductions(header):
    want = {np.dtype(np.bool_): "DEVAL_BOOL", np.dtype(np.uint8): "DEVAL_U8",
            np.dtype(np.int8): "DEVAL_I8", np.dtype(np.int16): "DEVAL_I16",
            np.dtype(np.int32): "DEVAL_I32", np.dtype(np.int64): "DEVAL_I64",
            np.dtype(np.float16): "DEVAL_F16", np.dtype(np.float32): "DEVAL_F32",
            np.dtype(np.float64): "DEVAL_F64"}
    for dt, c_name in want.items():
        assert deval._NP_TO_DEVAL[dt] == header[c_name], dt
    assert deval._DEVAL_TO_NP[header["DEVAL_BF16"]].itemsize == 2
    assert deval.MAX_DIMS == header["DEVAL_MAX_DIMS"]
    assert deval.MAX_TENSORS == header["DEVAL_MAX_TENSORS"]
    assert deval._ORDERS == {"rank": header["DEVAL_ORDER_RANK"],
                             "strided": header["DEVAL_ORDER_STRIDED"]}
    assert deval._REDUCTIONS == {"sum": header["DEVAL_SUM"], "mean": header["DEVAL_MEAN"],
                                 "max": header["DEVAL_MAX"], "min": header["DEVAL_MIN"],
                                 "prod": header["DEVAL_PROD"]}


def test_dtype_sizes_are_libdeval_s():
    """The binding asks libdeval for each dtype's size (deval_dtype_size()) instead of keeping
    a table of its own; its numpy dtypes must have those sizes."""
    sizes = deval._DTYPE_SIZES
    assert sizes[0] == 0 and len(sizes) == 11
    for code, dt in deval._DEVAL_TO_NP.items():
        assert dt.itemsize == sizes[code], dt
