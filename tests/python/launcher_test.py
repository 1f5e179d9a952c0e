"""braid.World() as a rank of a torchrun-style world (tests/gloo/run_ranks.sh sets MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK): the backend follows the launcher ("gloo" without a
GPU), the world has WORLD_SIZE ranks with this process at RANK, and collectives on numpy host
buffers match the serial reference exactly."""
import os
import sys

import numpy as np

import braid


def main():
    want_size = int(os.environ["WORLD_SIZE"])
    want_rank = int(os.environ["RANK"])
    world = braid.World(timeout_ms=60000)
    if world.backend == "nccl":
        print("a GPU and NCCL are present: the rule chose nccl; host-buffer checks skipped")
        return 0
    assert world.backend == "gloo", world.backend
    assert world.size == want_size, (world.size, want_size)
    assert world.local_ranks == [want_rank], world.local_ranks
    g = world.group()
    assert g.rank == want_rank and g.size == want_size
    x = np.arange(1, 101, dtype=np.float32) * (want_rank + 1)
    g.allreduce(x).wait(60000)
    tri = want_size * (want_size + 1) / 2
    np.testing.assert_array_equal(x, np.arange(1, 101, dtype=np.float32) * tri)
    mine = np.full(4, want_rank, dtype=np.int64)
    everyone = np.zeros(4 * want_size, dtype=np.int64)
    g.allgather(mine, everyone).wait(60000)
    np.testing.assert_array_equal(everyone, np.repeat(np.arange(want_size, dtype=np.int64), 4))
    g.barrier().wait(60000)  # everyone done before rank 0's store goes away
    g.close()
    world.close()
    print("launcher_test: rank %d of %d passed on %s" % (want_rank, want_size, "gloo"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
