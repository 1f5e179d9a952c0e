"""DistributedDataParallel.join() with one process per rank, under mpirun -np 2: Braid's "mpi"
world beside torch.distributed over gloo (its default process group, no stand-ins). Rank r
has 2 + 2 r batches. All-reduce mode against torch's own DDP join(), bit for bit, both divide
choices (parameters after each step, p.grad, the synced final state); ShardedAdamW in
reduce_scatter mode, both divide choices, against the serial AdamW reference of
tests/python/join_test.py."""

import sys

import torch

import braid
from braid import pytorch as bt
import join_test
import train_compare  # init_gloo


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank, size = group.rank, group.size
    assert size == 2, "run under mpirun -np 2"
    train_compare.init_gloo(group, rank, size)
    for divide in (True, False):
        kwargs = dict(divide_by_initial_world_size=divide)
        model = bt.DistributedDataParallel(join_test.Net(), group)
        hist, state, grads = join_test._sgd_loop(rank, model, kwargs)
        model.close()
        ref = torch.nn.parallel.DistributedDataParallel(join_test.Net())
        ref_hist, ref_state, ref_grads = join_test._sgd_loop(rank, ref, kwargs)
        assert len(hist) == join_test._steps(rank)
        for s, (got, want) in enumerate(zip(hist, ref_hist)):
            for i, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(a, b), "divide %s step %d parameter %d" % (divide, s, i)
        for k in state:
            assert torch.equal(state[k], ref_state[k]), "divide %s final %s" % (divide, k)
        for i, (a, b) in enumerate(zip(grads, ref_grads)):
            assert torch.equal(a, b), "divide %s p.grad %d" % (divide, i)

    for divide in (True, False):
        model = bt.DistributedDataParallel(join_test.Net(norm=False), group,
                                           mode="reduce_scatter")
        opt = bt.ShardedAdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        with model.join(divide_by_initial_world_size=divide):
            for step in range(join_test._steps(rank)):
                opt.zero_grad()
                join_test._loss(model, rank, step).backward()
                opt.step()
        want = join_test._serial_adamw(size, divide)[-1]
        for i, (p, w) in enumerate(zip(model.parameters(), want)):
            torch.testing.assert_close(p.detach(), w, rtol=1e-5, atol=1e-6,
                                       msg="ZeRO-2 divide %s final parameter %d" % (divide, i))
        opt.close()
        model.close()
    group.close()
    world.close()
    print("join_mpi rank %d: all checks passed" % rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
