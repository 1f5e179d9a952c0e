"""The training recipes of issue 24 at 2 processes that no other np2 script runs, in ONE
mpirun -np 2 launch (Braid's "mpi" world), each against its serial single-process reference,
with the models, loops and references of the local tests imported, not copied:

  - MoE expert groups fully sharded (moe_fsdp_test.fully_sharded_moe: the trunk fully sharded
    over the world, each rank's own experts fully sharded over a 1-rank expert-data-parallel
    group from the world's split, one ShardedAdamW.linked, one clip) against moe_test's serial
    reference;
  - the tensor-parallel norm (moe_test.tensor_parallel_pair: the world as the tensor-parallel
    pair, a replicated layer norm over each rank's own split, tp_replicated, one global norm)
    in ZeRO-2 and fully sharded, against its serial reference.
Tolerances as the local tests (1e-5 relative, 1e-6 absolute). Every failure is collected; the
process exits 1 naming each."""

import sys

import torch

import braid
from braid import pytorch as bt
import moe_fsdp_test
import moe_test


def _checked(what, check):
    try:
        check()
    except AssertionError as e:
        return ["%s: %s" % (what, e)]
    return []


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank = group.rank
    assert group.size == 2, "run under mpirun -np 2"
    case = moe_test.MoETest()
    failures = _checked("MoE fully sharded", lambda: moe_fsdp_test.check_fully_sharded_moe(
        case, [moe_fsdp_test.fully_sharded_moe(rank, group)], 2, first_rank=rank))
    want = moe_test.tensor_parallel_pair_reference()
    for what, wrap in (("ZeRO-2", lambda m, g: bt.DistributedDataParallel(
            m, g, mode="reduce_scatter")), ("fully sharded", bt.FullyShardedDataParallel)):
        failures += _checked("tensor-parallel norm " + what, lambda: moe_test.check_tensor_parallel(
            case, [moe_test.tensor_parallel_pair(rank, group, wrap)], *want, first_rank=rank))
    group.close()
    world.close()
    if failures:
        print("rank %d: %d recipe checks differ:\n  %s" % (rank, len(failures),
                                                           "\n  ".join(failures)))
        return 1
    print("recipes_mpi2 rank %d: MoE fully sharded and the tensor-parallel norm (ZeRO-2, fully "
          "sharded) match their serial references" % rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
