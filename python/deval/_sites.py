# SPDX-License-Identifier: MIT
"""The call sites of a pass's batches, told apart by where the user's code makes each gather
for metrics (libdeval's sites, libclient/sites.h). Numbered by their order in the batch, a
call made in some batches only (examples gathered for a logger on the first batch) would shift
every call after it into another call's stream; named by its place in the code, each call
keeps its own stream in every batch, and a place some batch skipped is one the pass neither
counts by position nor asks for every sample at its close. A place is the chain of calls from
the loop's body down to the gather (a helper that gathers for several callers is as many
places), each frame's code and the instruction in it (two calls on one line are two places)."""

import os
import sys

# the frames of deval's own modules, which a call passes through on its way from the user
_OWN = tuple({os.path.dirname(__file__) + os.sep,
              os.path.dirname(os.path.abspath(__file__)) + os.sep})
_DEPTH = 16  # frames of a place at most, where the loop's own is not met on the way


def _user(f):
    while f is not None and f.f_code.co_filename.startswith(_OWN):
        f = f.f_back
    return f


def loop_frame():
    """The id of the frame that asked deval's loop for the batch now starting (the user's
    for loop, outside deval), for the places of the batch's calls to stop at."""
    f = _user(sys._getframe(1))
    return None if f is None else id(f)


def _place(loop):
    """Where the user's code made the call under way: its frames outside deval, from the
    gather's caller up to the loop's frame (id loop) or _DEPTH of them."""
    f, out = _user(sys._getframe(2)), []
    while f is not None and len(out) < _DEPTH:
        if not f.f_code.co_filename.startswith(_OWN):
            out.append((f.f_code, f.f_lasti))
            if id(f) == loop:
                break
        f = f.f_back
    return tuple(out)


class Sites:
    """A pass's sites: each (kind, place, which call from that place in the batch, which part
    of the call) numbered in the order the pass first met it, apart for tensors and objects,
    as every rank meets them in the same order."""

    def __init__(self):
        self.at = {}
        self.n = [0, 0]
        self.seen = {}  # this batch: each place's calls so far
        self.call = None  # the user's call under way: (place, its call from there)
        self.loop = None  # loop_frame() of the batch

    def batch(self, loop=None):
        self.seen = {}
        self.call = None
        self.loop = loop

    def enter(self):
        """A gather for metrics of the user's starts: its place, and its count there in this
        batch (a loop over a batch's outputs is as many calls)."""
        place = _place(self.loop)
        nth = self.seen.get(place, 0)
        self.seen[place] = nth + 1
        self.call = (place, nth)
        return self.call

    def site(self, objects, part=0):
        """The site of part `part` of the call under way (a call of more tensors than one
        collective carries is several), of objects or of tensors."""
        key = (objects, self.call, part)
        s = self.at.get(key)
        if s is None:
            s = self.at[key] = self.n[objects]
            self.n[objects] += 1
        return s
