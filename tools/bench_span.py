# SPDX-License-Identifier: MIT
"""The spanning table of tools/dev bench: a group across two "nodes" on this machine.

Four ranks as two nodes of two (separate devalds on separate sockets, torchrun's variables,
torch.distributed over gloo on 127.0.0.1 between the node leaders), against the same ranks:
  - deval, one node: a flat group of the four ranks at one devald;
  - gloo: torch.distributed.all_gather of the same tensors, one flat gloo group of four;
  - memcpy: one copy of the result's bytes, in one process (the floor of any gather).
Cases: a per-batch gather_for_metrics((logits[16, 10], preds[16], labels[16])) as an eval
loop makes it, and a gather of one float32 tensor of 4 KiB, 256 KiB and 4 MiB per rank.
Each figure is the slowest rank's mean per call, the median of 5 repeats, all in one run;
the ratios are what carry over on a shared machine. Nothing here is a test.

    python tools/bench_span.py        (DEVALD: the devald to start; default build/devald)
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPEATS = 5
CASES = [("batch: 3 tensors, 16 rows", None, 400), ("4 KiB per rank", 4 << 10, 400),
         ("256 KiB per rank", 256 << 10, 100), ("4 MiB per rank", 4 << 20, 20)]


def child():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    import deval
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    span = deval.join(timeout=120)
    flat = deval.join("flat-" + span.name, r, w, timeout=120,
                      socket=os.environ["BENCH_FLAT_SOCKET"])
    gen = np.random.default_rng(r)
    out = {}
    for name, size, iters in CASES:
        if size is None:
            lo = torch.from_numpy(gen.random((16, 10), dtype=np.float32))
            x = (lo, lo.argmax(1), torch.from_numpy(gen.integers(0, 10, 16)))
        else:
            x = (torch.from_numpy(gen.random(size // 4, dtype=np.float32)),)
        bufs = [[torch.empty_like(t) for _ in range(w)] for t in x]

        def gloo():
            for t, b in zip(x, bufs):
                dist.all_gather(b, t)
            return [torch.cat(b) for b in bufs]

        ways = {"span": lambda: span.gather_for_metrics(x),
                "flat": lambda: flat.gather_for_metrics(x), "gloo": gloo}
        row = {}
        for way, fn in ways.items():
            assert all(np.array_equal(np.asarray(a), np.asarray(b))
                       for a, b in zip(fn(), gloo())), way  # the same data, the same result
            times = []
            for _ in range(REPEATS):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                times.append((time.perf_counter() - t0) / iters * 1e6)
            row[way] = times
        out[name] = row
    os.write(1, ("BENCH %s\n" % json.dumps(out)).encode())
    span.leave()
    flat.leave()
    dist.destroy_process_group()


def memcpy_us(size, world, iters):
    src = np.random.rand(size * world // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(iters):
            np.copyto(dst, src)
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    devald = os.environ.get("DEVALD", os.path.join(root, "build", "devald"))
    tmp = tempfile.mkdtemp(prefix="deval-span-bench-")
    socks = [os.path.join(tmp, "%s.sock" % n) for n in ("node0", "node1", "flat")]
    daemons = [subprocess.Popen([devald, "--socket", s, "--log-level", "warn"]) for s in socks]
    try:
        deadline = time.monotonic() + 10
        while not all(os.path.exists(s) for s in socks) and time.monotonic() < deadline:
            time.sleep(0.02)
        layout, port, procs = (0, 0, 1, 1), free_port(), []
        for rank, node in enumerate(layout):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2),
                       LOCAL_WORLD_SIZE="2", GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), DEVAL_SOCKET=socks[node],
                       BENCH_FLAT_SOCKET=socks[2], OMP_NUM_THREADS="1")
            env.pop("DEVAL_ONE_MACHINE", None)
            procs.append(subprocess.Popen([sys.executable, __file__, "child"], env=env,
                                          stdout=subprocess.PIPE, text=True))
        got = []
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            lines = [ln for ln in out.splitlines() if ln.startswith("BENCH ")]
            if p.returncode != 0 or not lines:
                raise SystemExit("bench_span: a rank failed:\n" + out)
            got.append(json.loads(lines[0][6:]))
    finally:
        for d in daemons:
            d.send_signal(signal.SIGTERM)
            d.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    def slowest(name, way):
        return statistics.median(max(g[name][way][i] for g in got) for i in range(REPEATS))

    print("spanning group, 2 nodes x 2 ranks on this machine (gloo between the leaders): "
          "the slowest rank's mean per call, us")
    print("%-28s %10s %10s %10s %10s %9s %9s" % ("case", "2 nodes", "1 node", "gloo", "memcpy",
                                                 "gloo/2n", "2n/1n"))
    for name, size, iters in CASES:
        s, f, g = slowest(name, "span"), slowest(name, "flat"), slowest(name, "gloo")
        m = memcpy_us(size, 4, iters) if size else float("nan")
        print("%-28s %10.1f %10.1f %10.1f %10.1f %8.2fx %8.2fx" % (name, s, f, g, m, g / s,
                                                                 s / f))


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        main()
