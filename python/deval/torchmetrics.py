# SPDX-License-Identifier: MIT
"""torchmetrics over deval: a metric's states are gathered through a deval group instead of
torch.distributed::

    metric = torchmetrics.Accuracy(task="multiclass", num_classes=10,
                                   dist_sync_fn=deval.torchmetrics.sync)
    deval.torchmetrics.attach(metric_collection)     # or set it on every metric at once

sync(tensor) returns every rank's tensor, in rank order, whatever its shape on each rank
(list states such as AUROC's hold a different number of samples per rank; a rank with none
holds an empty placeholder, which takes the others' dtype). It uses the group given to
use(), else the one deval.accelerate.enable() joined, else deval.join()'s from the launcher. attach() also tells the metric
that it runs distributed, so it syncs without a torch.distributed process group.
"""

import numpy as np

from . import InvalidArgument

__all__ = ["sync", "attach", "use"]

_GROUP = None


def use(group):
    """Make sync() gather through group (a deval.Group); None forgets it."""
    global _GROUP
    _GROUP = group


def _group():
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    from . import accelerate
    if accelerate._ACTIVE is not None:
        return accelerate._ACTIVE.group
    # as deval.join() does: the group of the job the launcher started
    from . import join
    try:
        _GROUP = join()
    except InvalidArgument as e:
        raise InvalidArgument("deval.torchmetrics: no deval group, and none to join from the "
                              "launcher (%s); call deval.torchmetrics.use(g) or "
                              "deval.accelerate.enable(accelerator) first" % e, -1) from None
    return _GROUP


def sync(result, group=None):
    """A torchmetrics dist_sync_fn: [rank 0's result, rank 1's, ...]. group is torchmetrics'
    process group argument and is ignored: the deval group is all ranks."""
    import torch
    g = _group()
    kinds = g.gather_object([(tuple(result.shape), str(result.dtype))])
    shapes = [s for s, _ in kinds]
    # a rank with no data holds torchmetrics' empty placeholder, of the default dtype: it
    # takes the dtype of the ranks that have data
    have = [d for s, d in kinds if int(np.prod(s, dtype=np.int64))]
    if result.numel() == 0 and have and str(result.dtype) != have[0]:
        result = result.to(getattr(torch, have[0].replace("torch.", "")))
    flat = g.gather(result.detach().reshape(-1))
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    parts = torch.split(flat, sizes)
    return [p.reshape(s).to(result.device) for p, s in zip(parts, shapes)]


def attach(metric):
    """Set sync as the dist_sync_fn of metric, or of every metric in a MetricCollection (or
    any mapping or list of metrics), and mark them distributed. Returns metric."""
    import torchmetrics
    if isinstance(metric, torchmetrics.Metric):
        metrics = [metric]
    elif hasattr(metric, "values"):
        metrics = list(metric.values())
    else:
        metrics = list(metric)
    for m in metrics:
        if not isinstance(m, torchmetrics.Metric):
            raise InvalidArgument("deval.torchmetrics.attach: %s is not a torchmetrics Metric"
                                  % type(m).__name__, -1)
        m.dist_sync_fn = sync
        m.distributed_available_fn = _distributed  # (a module's function: it pickles)
    return metric


def _distributed():
    """An attached metric runs distributed, with or without torch.distributed."""
    return True
