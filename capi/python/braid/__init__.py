"""Braid from Python: a ctypes binding of libbraid.so (capi/braid.h), no compiled extension.

    import braid
    with braid.World("mpi") as world:            # under mpirun; World("local", local_ranks=N)
        g = world.group()
        g.allreduce(tensor, op="avg").wait()

`braid.pytorch` wraps a torch.nn.Module (DistributedDataParallel) and offers Braid's sharded
AdamW (ShardedAdamW). The library is found through $LIBBRAID_SO, inside this package (as the
wheel installs it: `pip install braid-*.whl`), or in the source tree's bazel-bin/capi/.
"""

from ._lib import BraidError, NO_COLOR
from .core import (Group, Optimizer, Reducer, StepReport, Work, World, buffer_info,
                   default_group, default_world, dtype_code, dtype_size, nccl_unique_id)


def version():
    """The loaded library's "MAJOR.MINOR.PATCH"."""
    from . import _lib
    return _lib.load().braid_version().decode()


__all__ = ["BraidError", "NO_COLOR", "Group", "Optimizer", "Reducer", "StepReport", "Work",
           "World", "buffer_info", "default_group", "default_world", "dtype_code", "dtype_size",
           "nccl_unique_id", "version"]
