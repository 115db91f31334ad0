# SPDX-License-Identifier: MIT
"""Device groups from Python: devald --backend cuda on the GPU table's fake (two "GPUs"
whose memory is host memory), so that the binding's device path runs without a GPU: inputs
described by __cuda_array_interface__, results as DeviceView objects on the rank's GPU.
With a real GPU and torch, torch CUDA tensors go the same way and come back as tensors."""

import ctypes
import os
import subprocess

import numpy as np
import pytest

import deval
from conftest import ROOT, Daemon, group_name, run_ranks

FAKE = {"DEVAL_GPU_FAKE": "2"}


@pytest.fixture(scope="module")
def cuda_daemon():
    d = Daemon(["--backend", "cuda"], FAKE)
    yield d
    d.stop()


class FakeDeviceArray:
    """A 'device' array of the fake: its memory is this process's host memory."""

    def __init__(self, a, device):
        self.a = np.ascontiguousarray(a)
        self.device = device

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.a.shape, "typestr": self.a.dtype.str,
                "data": (self.a.ctypes.data, False), "strides": None, "version": 3}


def read(view):
    """A DeviceView's contents (the fake's device memory is mapped here)."""
    assert isinstance(view, deval.DeviceView)
    n = int(np.prod(view.shape, dtype=np.int64)) * view.dtype.itemsize
    buf = (ctypes.c_char * n).from_address(view.ptr)
    return np.frombuffer(buf, dtype=view.dtype).reshape(view.shape).copy()


def _device_rank(rank, world, sock, name):
    os.environ.update(FAKE)
    dev = rank % 2
    with deval.join(name, rank, world, socket=sock, timeout=20, device="cuda:%d" % dev) as g:
        assert g.device == dev
        for rows in (2, 3000):  # the second grows the device arenas
            x = np.arange(rows * (2 + rank), dtype=np.float32).reshape(rows, 2 + rank) + rank
            ids = np.arange(rows, dtype=np.int64) + 100000 * rank
            out = g.gather({"x": FakeDeviceArray(x, dev), "ids": FakeDeviceArray(ids, dev)},
                           pad_index=-1)
            assert out["x"].device == dev and out["ids"].device == dev
            got_x, got_ids = read(out["x"]), read(out["ids"])
            want_x, want_ids = [], []
            for r in range(world):
                a = np.full((rows, 1 + world), -1, np.float32)
                a[:, :2 + r] = np.arange(rows * (2 + r), dtype=np.float32).reshape(rows, 2 + r) + r
                want_x.append(a)
                want_ids.append(np.arange(rows, dtype=np.int64) + 100000 * r)
            assert np.array_equal(got_x, np.concatenate(want_x))
            assert np.array_equal(got_ids, np.concatenate(want_ids))
        # pad_across_processes lands on the GPU too
        p = g.pad_across_processes(FakeDeviceArray(np.ones(1 + rank, np.int32), dev),
                                   pad_index=9)
        assert read(p).tolist() == [1] * (1 + rank) + [9] * (world - 1 - rank)
        # reduce and objects go through host memory, as in a host group
        assert g.reduce(np.array([rank + 1.0]), "sum").tolist() == [world * (world + 1) / 2]
        assert g.gather_object([rank]) == list(range(world))
        # a numpy input's result is in GPU memory: without torch it cannot be read back
        import sys
        if "torch" not in sys.modules:
            with pytest.raises(deval.NotSupported, match="torch"):
                g.gather(np.zeros(2, np.float32))
        g.barrier()
    return True


def test_device_group(cuda_daemon):
    assert run_ranks(3, _device_rank, cuda_daemon.socket, group_name("pydev")) == [True] * 3


def _bad_device(rank, world, sock, name):
    os.environ.update(FAKE)
    for bad in ("cpu", "cuda:x", -1, True):
        with pytest.raises(deval.InvalidArgument):
            deval.join(name, rank, world, socket=sock, timeout=5, device=bad)
    # a host group's device tensors are not what a device group is for: devald says which
    with pytest.raises(deval.InvalidArgument, match="GPU 7|device 7"):
        deval.join(name, rank, world, socket=sock, timeout=5, device=7)
    return True


def test_bad_device(cuda_daemon):
    assert run_ranks(1, _bad_device, cuda_daemon.socket, group_name("pybaddev")) == [True]


def _has_cuda(rank, world):
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _torch_device_rank(rank, world, sock, name):
    import torch
    with deval.join(name, rank, world, socket=sock, timeout=20, device=0) as g:
        x = torch.full((2 + rank, 1 + rank), float(rank), device="cuda")
        b = torch.ones(3, dtype=torch.bfloat16, device="cuda") * rank
        out = g.gather({"x": x, "b": b}, pad_index=-1)
        assert out["x"].device == x.device and out["x"].shape == (2 * world + 1, world)
        assert out["b"].dtype == torch.bfloat16 and out["b"].device == x.device
        assert out["b"].tolist() == [float(r) for r in range(world) for _ in range(3)]
        assert out["x"][:2, 0].tolist() == [0.0, 0.0]
        cpu = g.gather(torch.arange(2) + rank)  # a CPU tensor in a device group
        assert cpu.device.type == "cpu" and cpu.tolist() == [0, 1, 1, 2][:2 * world]
    return True


def test_torch_device_group():
    pytest.importorskip("torch", reason="torch is not installed")
    if not run_ranks(1, _has_cuda)[0]:  # asked in a child: CUDA stays untouched here
        pytest.skip("no CUDA device")
    d = Daemon(["--backend", "cuda"])
    try:
        assert run_ranks(2, _torch_device_rank, d.socket, group_name("pytorchdev")) == [True] * 2
    finally:
        d.stop()


def run_test_gpu(**env):
    build = os.path.dirname(os.environ.get("DEVALD", os.path.join(ROOT, "build", "devald")))
    exe = os.path.join(build, "test-gpu")
    if not os.access(exe, os.X_OK):
        pytest.skip("test-gpu is not built")
    full = {k: v for k, v in os.environ.items() if k != "DEVALD"}
    full.update(DEVAL_GPU_CHECK_FAKE="1", DEVAL_GPU_FAKE="2", **env)
    return subprocess.run([exe], env=full, capture_output=True, text=True, timeout=120)


def test_gpu_check_fails_where_a_gpu_is_seen():
    """tools/gpu-check's test-gpu on a machine whose driver sees GPUs (the fake's two): a
    devald that exits at start, or no devald to run, fails the check instead of skipping."""
    p = run_test_gpu(DEVALD="/bin/false")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "exited at start" in p.stderr and "sees 2 GPU(s)" in p.stderr
    p = run_test_gpu()
    assert p.returncode == 1, p.stdout + p.stderr
    assert "$DEVALD is not set" in p.stderr
