# SPDX-License-Identifier: MIT
"""eval_loop's progress bar: one bar on rank 0 for the whole pass, every rank's samples, as
the ranks publish them in the group's shared memory (deval_eval_progress(): no collective).
tqdm draws it where it is installed; else a line of text redrawn in place."""

import ctypes
import sys

from ._libdeval import _lib


def _stream(progress):
    """Where to draw, or None: True draws on stderr when it is a terminal, "always" on stderr
    whatever it is, a file-like object there; False or None nowhere."""
    if progress is None or progress is False:
        return None
    if progress is True or progress == "always":
        s = sys.stderr
        if progress is True and not (hasattr(s, "isatty") and s.isatty()):
            return None
        return s
    if hasattr(progress, "write"):
        return progress
    raise ValueError("progress is %r: True (a bar on a terminal), \"always\", a file-like "
                     "object, or False" % (progress,))


def check(progress):
    """Raise ValueError on a progress argument eval_loop does not take."""
    _stream(progress)


class Bar:
    """The bar of group g's pass; draws on rank 0 alone, nothing elsewhere."""

    def __init__(self, g, progress):
        self.g, self.out, self.bar, self.last, self.total = g, None, None, -1, None
        if g.rank != 0:
            return
        self.out = _stream(progress)
        if self.out is None:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        # made now, so that its clock starts with the loop; its total comes with the pass
        self.bar = tqdm(total=None, unit="sample", desc="deval eval", file=self.out,
                        dynamic_ncols=True)

    def update(self):
        """After a batch's body: every rank's samples so far."""
        if self.out is None:
            return
        done, total = ctypes.c_int64(), ctypes.c_int64()
        r = _lib.deval_eval_progress(self.g._handle(), ctypes.byref(done), ctypes.byref(total))
        if r < 0:  # a group spanning machines keeps its pass in its ranks
            print("deval: eval_loop(progress=...): no bar in a group that spans machines",
                  file=self.out, flush=True)
            self.out = None
            return
        if r == 1:
            self._draw(done.value, total.value)

    def close(self, complete):
        """The pass is over; complete: it gathered every sample."""
        if self.out is None:
            return
        if complete and self.total is not None:
            self._draw(self.total, self.total)
        if self.bar is not None:
            self.bar.close()
        elif self.total is not None:
            self.out.write("\n")
            self.out.flush()
        self.out = None

    def _draw(self, done, total):
        if done == self.last and total == self.total:
            return
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - max(self.last, 0))
        else:
            self.out.write("\rdeval eval: %d/%d samples (%.0f%%)" % (
                done, total, 100.0 * done / total if total else 100.0))
            self.out.flush()
        self.last = done
