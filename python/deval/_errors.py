# SPDX-License-Identifier: MIT
"""The exceptions deval raises, and which one answers each libdeval status.

Every class carries the negative DEVAL_E* status it stands for (``status``), the same numbers
as include/deval.h (tests/python/test_abi.py checks them against the header); _ERRORS maps a
status back to its class, for the places that turn a failed call into an exception, and
_said() puts libdeval's words for such a failure into the binding's. Nothing here loads
libdeval or imports anything of deval's, so every other module may import it.
"""

import re


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

# libdeval names its C calls ("deval_gather_objects: ...") and the ops of the calls the ranks
# made ("rank 1 called broadcast_bytes"); a Python user made the binding's calls, named here.
# A C call the binding makes for a Python call of another name says that name.
_PY_CALLS = {
    "join": "deval.join", "join_spanning": "deval.join",
    "gather_objects_for_metrics": "Group.gather_for_metrics",
    "gather_objects": "Group.gather_object", "broadcast_bytes": "Group.broadcast_object",
    "eval_begin": "the eval pass", "eval_begin_keys": "the eval pass",
    "eval_batch": "the eval pass", "eval_batch_keys": "the eval pass",
    "eval_end": "the eval pass", "eval_abandon": "the eval pass",
    "eval_complete": "the eval pass",
}
_PY_OPS = {"gather_objects_for_metrics": "gather_for_metrics", "gather_objects": "gather_object",
           "broadcast_bytes": "broadcast_object"}
_C_CALL = re.compile(r"^deval_(\w+): ")
_C_OP = re.compile(r"\b(%s)\b" % "|".join(_PY_OPS))


def _said(msg):
    """libdeval's message msg in the binding's words: "Group.gather_object: ..." for
    "deval_gather_objects: ...", and the op of a call by the method that makes it."""
    msg = _C_CALL.sub(lambda m: "%s: " % _PY_CALLS.get(m.group(1), "Group." + m.group(1)), msg,
                      count=1)
    return _C_OP.sub(lambda m: _PY_OPS[m.group(1)], msg)
