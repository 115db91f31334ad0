# SPDX-License-Identifier: MIT
"""A group across machines. _spans_machines() asks libdeval's launcher table whether this job
runs on more than one machine; _join_spanning() then makes the group: each machine's ranks
meet in its devald, and one rank per machine (its leader) exchanges the machine's part with
the other leaders through _TorchEngine, a gloo group of the leaders in the job's own
torch.distributed, which libdeval calls back through deval_engine.
"""

import contextlib
import ctypes

from ._errors import _ERRORS, Error, NotSupported, _said
from ._group import Group
from ._libdeval import _ALLGATHER, _RELEASE, _Engine, _lib


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
    node = ctypes.create_string_buffer(256)  # libdeval's launcher table names the machine
    _lib.deval_job_node(node, len(node))
    node_id = node.value.decode(errors="replace")
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
        msg = _said(_lib.deval_errmsg(None).decode(errors="replace"))
        engine.release()  # (libdeval releases only what it joined)
        raise _ERRORS.get(r, Error)(msg, r)
    g = Group(handle, _lib.deval_group_name(handle).decode(), rank, world)
    g._engine = engine
    g.nodes, g.node = len(ids), node
    return g
