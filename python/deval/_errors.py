# SPDX-License-Identifier: MIT
"""The exceptions deval raises, and which one answers each libdeval status.

Every class carries the negative DEVAL_E* status it stands for (``status``), the same numbers
as include/deval.h (tests/python/test_abi.py checks them against the header); _ERRORS maps a
status back to its class, for the places that turn a failed call into an exception. Nothing
here loads libdeval or imports anything of deval's, so every other module may import it.
"""


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
