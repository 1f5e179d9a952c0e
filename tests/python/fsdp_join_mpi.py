"""FullyShardedDataParallel.join() with one process per rank, under mpirun -np 2 (Braid's "mpi"
world): rank r has 2 + 2 r batches; ShardedAdamW and torch's AdamW over the local pieces, both
divide choices, against the serial AdamW reference of tests/python/fsdp_join_test.py."""

import sys

import torch

import braid
import fsdp_join_test


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank, size = group.rank, group.size
    assert size == 2, "run under mpirun -np 2"
    for optimizer in ("sharded", "torch"):
        for divide in (True, False):
            model = fsdp_join_test._wrap(rank, group, size, "units")
            final, _ = fsdp_join_test._train(rank, model, divide, optimizer)
            want = fsdp_join_test.serial_adamw(size, divide)
            for i, (p, w) in enumerate(zip(final, want)):
                torch.testing.assert_close(p, w, rtol=1e-5, atol=1e-6,
                                           msg="%s divide %s final parameter %d" %
                                           (optimizer, divide, i))
    group.close()
    world.close()
    print("fsdp_join_mpi rank %d: all checks passed" % rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
