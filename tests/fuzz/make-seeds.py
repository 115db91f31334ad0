#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the fuzz targets' seed corpus (tests/fuzz/corpus): well-formed socket messages of
every kind a client sends, a few malformed ones, and plan inputs covering gathers of every
dtype, both orders, valid_rows, keep_rows and pads. Deterministic; run it again after a
change to the wire layout (common/wire.h) and commit what it writes."""

import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "..", "common", "wire.h")) as f:
    VERSION = int(re.search(r"#define DV_PROTO_VERSION\s+(\d+)", f.read()).group(1))
JOIN, GROW, OUTPUT, LEAVE, STATUS, GROUP, ABORT, DEV_OUTPUT, TOPO, DUMP, DIRECT, SPAN = (
    1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13)


def hdr(kind):
    return struct.pack("<II", VERSION, kind)


def join(name, rank, world, timeout=1000, device=False):
    # DvJoinReq: hdr, char group[64], int32 rank, world_size, timeout_ms, has_device,
    # uint8 device_uuid[16], char launcher[16] (120 bytes)
    body = name.encode()[:63].ljust(64, b"\0")
    body += struct.pack("<iiii", rank, world, timeout, 1 if device else 0) + bytes(16)
    body += b"torchrun".ljust(16, b"\0")
    return hdr(JOIN) + body


def span(name, node, nodes, world, ranks, listed=None):
    # DvSpanReq: hdr, DvSpanInfo: char group[64], int32 node, nodes, world, listed,
    # DvSpanNode[64] {int32 leader, nranks, char host[56]}, int16 ranks[512]
    listed = min(nodes, 64) if listed is None else listed
    body = name.encode()[:63].ljust(64, b"\0") + struct.pack("<iiii", node, nodes, world, listed)
    per = max(world // nodes, 1)
    for n in range(64):
        body += struct.pack("<ii", n * per, per) + b"host%d" % n + bytes(56 - len(b"host%d" % n))
    body += b"".join(struct.pack("<h", r) for r in ranks).ljust(1024, b"\0")
    return hdr(SPAN) + body


def write(target, name, data):
    with open(os.path.join(HERE, "corpus", target, name), "wb") as f:
        f.write(data)


def msgs():
    write("msg", "join", join("run-1", 0, 4))
    write("msg", "join-device", join("gpu-run", 3, 8, device=True))
    write("msg", "join-bad-rank", join("bad", 5, 4))
    write("msg", "join-unterminated", hdr(JOIN) + b"x" * 64 + struct.pack("<iiii", 0, 1, 0, 0)
          + bytes(16) + bytes(16))
    write("msg", "join-bad-launcher", join("ok", 0, 1)[:-16] + b"y" * 16)
    write("msg", "grow", hdr(GROW) + struct.pack("<QII", 1 << 20, 0, 0))
    write("msg", "grow-device", hdr(GROW) + struct.pack("<QII", 1 << 30, 1, 0))
    write("msg", "direct", hdr(DIRECT) + struct.pack("<QII", 1 << 24, 0, 0))
    write("msg", "direct-current", hdr(DIRECT) + struct.pack("<QII", 0, 0, 0))
    for kind, name in ((OUTPUT, "output"), (LEAVE, "leave"), (STATUS, "status"),
                       (DEV_OUTPUT, "dev-output"), (TOPO, "topo")):
        write("msg", name, hdr(kind))
    for kind, name in ((GROUP, "group"), (ABORT, "abort"), (DUMP, "dump")):
        write("msg", name, hdr(kind) + b"run-1".ljust(64, b"\0"))
    write("msg", "span", span("run-1", 1, 2, 4, [2, 3]))
    write("msg", "span-bad-node", span("run-1", 2, 2, 4, [2, 3]))
    write("msg", "span-twice", span("run-1", 0, 2, 4, [1, 1]))
    write("msg", "old-version", struct.pack("<II", 0, JOIN))
    write("msg", "short", hdr(GROW)[:6])


def plan(name, world, tensors, flags, ranks, descs, tail=b""):
    data = bytes([world - 1, tensors - 1, flags])
    for arena, valid in ranks:
        data += (arena // 8).to_bytes(3, "little")
        if flags & 8:
            data += struct.pack("<h", valid)
    for dtype, dims, offset in descs:
        data += struct.pack("<bb", dtype, len(dims))
        data += b"".join(struct.pack("<h", d) for d in (list(dims) + [1] * 4)[:4])
        data += (offset // 8).to_bytes(2, "little") + (0).to_bytes(3, "little")
    write("plan", name, data + tail)


def plans():
    MATCH = 0x20
    for dtype in range(1, 11):
        plan("gather-dtype-%d" % dtype, 2, 1, MATCH, [(1 << 16, -1)] * 2,
             [(dtype, (3, 5), 0), (dtype, (4, 2), 0)])
    plan("gather-strided", 3, 2, MATCH | 1, [(1 << 16, -1)] * 3,
         [(9, (2, 3), 0), (6, (2,), 64), (9, (3, 4), 0), (6, (3,), 64), (9, (1, 1), 0),
          (6, (1,), 64)])
    plan("gather-valid-keep", 4, 1, MATCH | 8 | 4, [(1 << 16, 2), (1 << 16, -1), (1 << 16, 0),
                                                    (1 << 16, 5)],
         [(10, (4, 2, 3), 0)] * 4, struct.pack("<h", 7))
    plan("gather-empty", 2, 1, MATCH, [(4096, -1)] * 2, [(9, (0, 7), 0), (9, (0, 3), 0)])
    plan("gather-scalar", 2, 1, MATCH, [(4096, -1)] * 2, [(5, (), 0), (5, (), 0)])
    plan("pad-dim1", 3, 1, MATCH | 0x10, [(1 << 16, -1)] * 3,
         [(9, (2, 1 + k), 0) for k in range(3)], bytes([1]))
    plan("pad-first", 2, 1, MATCH | 0x10 | 2, [(1 << 16, -1)] * 2,
         [(7, (3, 4, 2), 0), (7, (3, 1, 5), 0)], bytes([2]))
    plan("out-of-arena", 2, 1, MATCH, [(64, -1)] * 2, [(10, (100,), 0), (10, (1,), 0)])
    plan("bad-dtype", 1, 1, 0, [(4096, -1)], [(42, (1,), 0)])


if __name__ == "__main__":
    msgs()
    plans()
