# SPDX-License-Identifier: MIT
"""deval.join(): the arguments checked and defaulted (name, rank and world size from the
launcher or $RANK / $WORLD_SIZE, the device, the timeout), a group this process already holds
handed back, and the join itself: deval_join() on one machine, _span's join when the launcher
says the job spans several.
"""

import ctypes
import os
import sys
import weakref

import numpy as np

from ._errors import _ERRORS, Error, InvalidArgument, _said
from ._group import Group
from ._libdeval import _JoinOpts, _lib
from ._span import _join_spanning, _spans_machines
from ._tensors import _torch


def _env_int(name):
    v = os.environ.get(name)
    if v is None:
        raise InvalidArgument("deval.join: no %s given and $%s is not set" % (name.lower(), name),
                              -1)
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument("deval.join: $%s is %r, not a number" % (name, v), -1) from None


def _process_group():
    """The rank and world size of torch.distributed's default group, where one is up (ranks
    that mp.spawn or Lightning's ddp_spawn started, whose launcher sets no $RANK); else
    (None, None). torch is not imported for it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, None
    return dist.get_rank(), dist.get_world_size()


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
    process (torchrun and accelerate launch, Open MPI's mpirun, Slurm's srun, Lightning's,
    python -m deval.launch): every rank of one job joins the same group and no other job
    does; the rank and world size are torch.distributed's where its default group is up
    (ranks that mp.spawn started have no $RANK). With a
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
        if rank is None and world_size is None and spans is None:
            rank, world_size = _process_group()
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
        msg = _said(_lib.deval_errmsg(None).decode(errors="replace"))
        raise _ERRORS.get(r, Error)(msg, r)
    named = group is not None
    if not named:  # what libdeval found
        group = _lib.deval_group_name(handle).decode()
        rank, world_size = _lib.deval_rank(handle), _lib.deval_world_size(handle)
    g = _HELD[key] = Group(handle, group, rank, world_size, index)
    if not named:
        # the launcher's group, whether this rank and world size came from its variables or
        # were given (deval.accelerate.enable() gives the Accelerator's): a later join() of
        # it, either way, is the same group
        for k in ((None, key[1], rank, world_size, index), (None, key[1], -1, -1, index)):
            _HELD[k] = g
    return g


_HELD = weakref.WeakValueDictionary()  # join()'s arguments -> the group they joined
