# SPDX-License-Identifier: MIT
"""The cases of Accelerate's own test_distributed_data_loop.py that run on CPU, called from
the script shipped in its wheel: its main() first joins uneven inputs with DDP's Join, which
waits forever over gloo on CPU with or without deval. Run as accelerate_shim.py runs a script:
``torchrun --nproc-per-node 2 [accelerate_shim.py] accelerate_data_loop.py CASE...``, each
CASE one of CASES; prints one line per case done."""

import os
import runpy
import sys

import accelerate
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate

SCRIPT = os.path.join(os.path.dirname(accelerate.__file__), "test_utils", "scripts",
                      "test_distributed_data_loop.py")


def main(cases):
    t = runpy.run_path(SCRIPT)  # (its functions, without running its main())
    acc = t["create_accelerator"]()
    torch.manual_seed(acc.process_index)  # (as its main() does: each rank draws otherwise)
    ds, bs, workers = t["DummyDataset"](), t["BATCH_SIZE"], t["NUM_WORKERS"]

    def batch_sampler():
        return BatchSampler(RandomSampler(ds), batch_size=bs, drop_last=False)

    run = {
        "skip_first_batches": lambda: t["test_skip_first_batches_preserves_metric_samples"](acc),
        "shuffle_false": lambda: t["test_data_loader"](
            DataLoader(ds, shuffle=False, batch_size=bs, num_workers=workers), acc),
        "shuffle_true": lambda: t["test_data_loader"](
            DataLoader(ds, shuffle=True, batch_size=bs, num_workers=workers), acc),
        "batch_sampler": lambda: t["test_data_loader"](
            DataLoader(ds, batch_sampler=batch_sampler(), num_workers=workers), acc),
        "sampler_is_batch_sampler": lambda: t["test_data_loader"](
            DataLoader(ds, sampler=batch_sampler(), batch_size=None, collate_fn=default_collate,
                       num_workers=workers), acc),
        "stateful": lambda: t["test_stateful_dataloader"](acc),
        "stateful_save_state": lambda: t["test_stateful_dataloader_save_state"](acc),
        "pickle": lambda: t["test_pickle_accelerator"](),
    }
    for case in cases:
        run[case]()
        acc.print("data loop case done: %s" % case)
    acc.end_training()


CASES = ("skip_first_batches", "shuffle_false", "shuffle_true", "batch_sampler",
         "sampler_is_batch_sampler", "stateful", "stateful_save_state", "pickle")

if __name__ == "__main__":
    main(sys.argv[1:] or CASES)
