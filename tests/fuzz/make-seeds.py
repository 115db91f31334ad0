#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the fuzz targets' seed corpus (tests/fuzz/corpus): well-formed socket messages of
every kind a client sends, a few malformed ones, plan inputs covering gathers of every
dtype, both orders, valid_rows, keep_rows and pads, and what a spanning group's ranks read
from other machines (steps, joins, first rounds, failures; well-formed and not).
Deterministic; run it again after a change to the wire layout (common/wire.h,
libclient/span_wire.h) and commit what it writes."""

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


# ---- span-wire: what a spanning group's ranks read from other machines (libclient/span_wire.h)
PART_MAGIC, GLOBAL_MAGIC, HELLO_OP = 0x44565350, 0x44564742, 0xFFFF
REQ_HEAD, DESC = 344, 88  # offsetof(DvRequest, t), sizeof(DvTensorDesc)


def align(x, a):
    return (x + a - 1) // a * a


def request(op, tensors, seq=1, status=0, why=b""):
    # DvRequest up to its tensors: seq, op, ntensors, pad_first, pad_value, valid_rows,
    # keep_rows, order, root, reduce_op, dim, num_samples, status, site, flags, batch,
    # staged_bytes, why[256]; then each DvTensorDesc: dtype, ndim, shape[8], offset, nbytes
    head = struct.pack("<IIIIdqqiiiiqiIIIQ256s", seq, op, len(tensors), 0, 0.0, -1, -1, 0, -1,
                       0, 0, 0, status, 0, 0, 0, 0, why)
    for dtype, shape, offset, nbytes in tensors:
        head += struct.pack("<ii8qQQ", dtype, len(shape), *(list(shape) + [0] * 8)[:8], offset,
                            nbytes)
    return head


def part(rank, node, world, nodes, local_rank, local_world, req, data, magic=PART_MAGIC,
         head=None):
    # DvSpanPartHdr: magic, rank, node, world, nodes, local_rank, local_world, head, data,
    # reserved (48 bytes); the request; the input at the next 64-byte boundary
    head = len(req) if head is None else head
    h = struct.pack("<IiiiiiiIQQ", magic, rank, node, world, nodes, local_rank, local_world,
                    head, len(data), 0)
    body = h + req
    return body + bytes(align(len(body), 64) - len(body)) + data


def node_bytes(parts):
    # a node's parts: their count, then each one's length and bytes, padded to 8
    out = struct.pack("<Q", len(parts))
    for p in parts:
        out += struct.pack("<Q", len(p)) + p + bytes(align(len(p), 8) - len(p))
    return out


def global_bytes(nodes, status=0, msg=b"", stride=None, claimed=None):
    # DvSpanGlobalHdr: magic, status, nodes, reserved, stride; each node's length; node k's
    # bytes at k * stride from the first 64-byte boundary after them
    if status < 0:
        return struct.pack("<IiIIQ", GLOBAL_MAGIC, status, 0, 0, 0) + msg + b"\0"
    stride = align(max(len(n) for n in nodes), 64) if stride is None else stride
    out = struct.pack("<IiIIQ", GLOBAL_MAGIC, 0, len(nodes) if claimed is None else claimed, 0,
                      stride)
    out += b"".join(struct.pack("<Q", len(n)) for n in nodes)
    out += bytes(align(len(out), 64) - len(out))
    for n in nodes:
        out += n + bytes(stride - len(n))
    return out


def layout(world, nodes):
    return [list(range(n * world // nodes, (n + 1) * world // nodes)) for n in range(nodes)]


def step_parts(world, nodes, op=1, seq=3, rows=lambda k: k + 1):
    # a gather of float32 (2 x 3 per row) on every rank, nodes' ranks as the fuzz target lays
    # them out
    out = []
    for n, ranks in enumerate(layout(world, nodes)):
        ps = []
        for i, k in enumerate(ranks):
            data = bytes([k]) * (rows(k) * 24)
            req = request(op, [(9, (rows(k), 2, 3), 0, len(data))], seq=seq)
            ps.append(part(k, n, world, nodes, i, len(ranks), req, data))
        out.append(ps)
    return out


def hello_parts(world, nodes):
    out = []
    for n, ranks in enumerate(layout(world, nodes)):
        ps = []
        for i, k in enumerate(ranks):
            data = (b"host%d" % n).ljust(56, b"\0") + struct.pack("<Q", 1 << 30)
            req = request(HELLO_OP, [(2, (64,), 0, 64)], seq=0)
            ps.append(part(k, n, world, nodes, i, len(ranks), req, data))
        out.append(ps)
    return out


def span_wire_seed(name, mode, hello, nodes, world, x, payload):
    data = bytes([mode << 1 | hello, nodes - 1, world - nodes, x]) + payload
    write("span-wire", name, data)


def round1(node, status=0, msg=b""):
    # DvSpanRound1: status, reserved, len, then the node's first bytes (or the failure's
    # sentence); the fuzz target reads each as a 16-bit length and its bytes
    if status < 0:
        r = struct.pack("<iIQ", status, 0, 0) + msg + b"\0"
    else:
        r = struct.pack("<iIQ", 0, 0, len(node)) + node
    return struct.pack("<H", len(r)) + r


def span_wire():
    G = lambda ps: [node_bytes(p) for p in ps]
    span_wire_seed("step", 0, 0, 2, 4, 0, global_bytes(G(step_parts(4, 2))))
    span_wire_seed("step-3-nodes", 0, 0, 3, 7, 0, global_bytes(G(step_parts(7, 3))))
    span_wire_seed("step-one-node", 0, 0, 1, 1, 0, global_bytes(G(step_parts(1, 1))))
    span_wire_seed("step-empty-rows", 0, 0, 2, 2, 0,
                   global_bytes(G(step_parts(2, 2, rows=lambda k: 0))))
    span_wire_seed("hello", 0, 1, 2, 3, 0, global_bytes(G(hello_parts(3, 2))))
    span_wire_seed("hello-4-nodes", 0, 1, 4, 9, 0, global_bytes(G(hello_parts(9, 4))))
    span_wire_seed("failure", 0, 0, 2, 4, 0,
                   global_bytes([], status=-3, msg=b"node 1: rank 3 died (pid 42)"))
    span_wire_seed("failure-foreign", 0, 0, 2, 4, 0, global_bytes([], status=-99, msg=b"x"))
    good = global_bytes(G(step_parts(4, 2)))
    span_wire_seed("bad-magic", 0, 0, 2, 4, 0, b"\0" + good[1:])
    span_wire_seed("cut-short", 0, 0, 2, 4, 0, good[:len(good) // 2])
    span_wire_seed("short", 0, 0, 2, 4, 0, good[:20])
    span_wire_seed("nodes-disagree", 0, 0, 2, 4, 0,
                   global_bytes(G(step_parts(4, 2)), claimed=3))
    span_wire_seed("stride-past-end", 0, 0, 2, 4, 0,
                   global_bytes(G(step_parts(4, 2)), stride=1 << 20)[:4096])
    ps = step_parts(4, 2)
    span_wire_seed("rank-twice", 0, 0, 2, 4, 0,
                   global_bytes(G([ps[0], [ps[0][0], ps[1][1]]])))
    span_wire_seed("wrong-node", 0, 0, 2, 4, 0, global_bytes(G([ps[1], ps[0]])))
    span_wire_seed("too-few-parts", 0, 0, 2, 4, 0, global_bytes(G([ps[0][:1], ps[1]])))
    span_wire_seed("no-parts", 0, 0, 2, 4, 0, global_bytes([b"", node_bytes(ps[1])]))
    bad = part(0, 0, 4, 2, 0, 2, request(1, [(9, (1, 2, 3), 0, 24)]), bytes(24),
               head=REQ_HEAD + DESC + 4)
    span_wire_seed("bad-head", 0, 0, 2, 4, 0, global_bytes(G([[bad, ps[0][1]], ps[1]])))
    lie = part(0, 0, 4, 2, 0, 2, request(1, [(9, (1, 2, 3), 0, 24)] * 2)[:REQ_HEAD + DESC],
               bytes(24))
    span_wire_seed("ntensors-lie", 0, 0, 2, 4, 0, global_bytes(G([[lie, ps[0][1]], ps[1]])))
    hp = hello_parts(4, 2)
    span_wire_seed("hello-layout-disagrees", 0, 1, 2, 4, 0, global_bytes(G([hp[1], hp[0]])))
    span_wire_seed("hello-rank-missing", 0, 1, 2, 4, 0, global_bytes(G([hp[0], hp[1][:1]])))
    # the first rounds
    sp = G(step_parts(4, 2))
    span_wire_seed("round1", 1, 0, 2, 4, 0, round1(sp[0]) + round1(sp[1]))
    hg = G(hello_parts(3, 3))
    span_wire_seed("round1-hello", 1, 1, 3, 3, 0, b"".join(round1(n) for n in hg))
    span_wire_seed("round1-failure", 1, 0, 2, 4, 0,
                   round1(sp[0]) + round1(b"", -4, b"node 1: out of memory"))
    span_wire_seed("round1-bad-length", 1, 0, 2, 4, 0,
                   round1(sp[0]) + struct.pack("<HiIQ", 16, 0, 0, 3))
    span_wire_seed("round1-long", 1, 0, 2, 4, 0,
                   round1(sp[0]) + struct.pack("<HiIQ", 16, 0, 0, 1 << 20))
    # what well-behaved ranks encode, round-tripped
    span_wire_seed("round-trip", 2, 0, 2, 5, 0, bytes([1, 7, 2, 9, 3, 0, 5, 200, 4, 11]))
    span_wire_seed("round-trip-big", 2, 0, 3, 6, 1, bytes([3, 255, 128, 64, 2, 1, 3, 90]))
    span_wire_seed("round-trip-empty", 2, 0, 1, 1, 0, b"")
    span_wire_seed("failure-round-trip", 3, 0, 3, 4, 4, b"rank 2 (node 1) died")
    span_wire_seed("failure-round-trip-foreign", 3, 0, 2, 2, 15, b"?")


if __name__ == "__main__":
    msgs()
    plans()
    span_wire()
