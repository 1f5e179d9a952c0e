"""ShardedAdamW.linked over FullyShardedDataParallel wrappers (braid/_linked.py): the tiny MoE
model of tests/python/moe_test.py with a fully sharded dense trunk (units: its two Linears)
over the whole world and fully sharded experts (one unit per expert) over their
expert-data-parallel groups, one optimizer and one global gradient norm, against moe_test's
serial reference (each rank's own loss, the trunk averaged over every rank and each expert
over the ranks holding it, one norm over all of it, one clip, torch's AdamW): 4 ranks (two
expert pairs), 2 ranks (each rank its own experts), a ZeRO-2 trunk with fully sharded
experts (the two kinds of wrappers linked), and moe_test's tensor-parallel pair fully
sharded (a replicated layer norm counted once), at 2 ranks and as tensor-parallel pairs by
data-parallel pairs at 4."""

import unittest

import torch

import braid.pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
import moe_test
from moe_test import LR, MAX_NORM, N, STEPS
from train_models import make_moe, moe_batch


def fully_sharded_moe(r, g, dense_kind="fsdp"):
    """Rank r: the trunk fully sharded over `g` (units: its two Linears; or ZeRO-2 when
    dense_kind="zero2") and its expert-parallel rank's experts fully sharded (one unit per
    expert) over a 2-rank expert-data-parallel group from g.split, under one
    ShardedAdamW.linked and one clip; (trunk parameters, expert parameters, norm per step),
    full. Also tests/python/recipes_mpi2.py and recipes_mpi4.py."""
    edp = g.split(r % 2, r, "expert_dp")
    with INIT_LOCK:  # seeds torch's global RNG: rank threads must not interleave
        trunk, experts = make_moe(r % 2)
    small = dict(bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    if dense_kind == "fsdp":
        dense = bt.FullyShardedDataParallel(trunk, g, units=[trunk.proj, trunk.router], **small)
    else:
        dense = bt.DistributedDataParallel(trunk, g, mode="reduce_scatter", **small)
    moe = bt.FullyShardedDataParallel(experts, edp, units=list(experts.experts), **small)
    opt = bt.ShardedAdamW.linked(list(trunk.parameters()) + list(experts.parameters()),
                                 lr=LR, max_grad_norm=MAX_NORM)
    assert len(opt.optimizers) == 2, len(opt.optimizers)
    norms = []
    for step in range(STEPS):
        x, t = moe_batch(r, step)
        h, gates = dense(x)
        torch.nn.functional.mse_loss(moe(h, gates), t).backward()
        norms.append(opt.clip_grad_norm_(MAX_NORM).item())
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    got_experts = moe_test.full_values(moe)
    got_trunk = moe_test.full_values(dense)
    opt.close()
    dense.close()
    moe.close()
    edp.close()
    return got_trunk, got_experts, norms


def check_fully_sharded_moe(case, results, n, first_rank=0):
    """fully_sharded_moe's results of ranks first_rank, ... of n against moe_test's serial
    reference."""
    want_trunk, want_experts, want_norms = moe_test._reference(n)
    case.assertGreater(min(want_norms), MAX_NORM)  # clipping is active every step
    for r, (trunk, experts, norms) in enumerate(results, first_rank):
        case.assertEqual(len(norms), STEPS)
        for got, want in zip(norms, want_norms):
            case.assertAlmostEqual(got, want, delta=1e-5 * want)
        for i, (a, b) in enumerate(zip(trunk, want_trunk)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg="rank %d trunk parameter %d" % (r, i))
        for i, (a, b) in enumerate(zip(experts, want_experts[r % 2])):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg="rank %d expert parameter %d" % (r, i))


class LinkedFullyShardedTest(unittest.TestCase):
    def check(self, n, dense_kind="fsdp"):
        check_fully_sharded_moe(
            self, run_ranks(n, lambda r, g: fully_sharded_moe(r, g, dense_kind)), n)

    def test_fully_sharded_trunk_and_experts_four_ranks(self):
        self.check(N)

    def test_fully_sharded_trunk_and_experts_two_ranks(self):
        self.check(2)

    def test_zero2_trunk_and_fully_sharded_experts(self):
        self.check(N, dense_kind="zero2")

    def test_tensor_parallel_pair_fully_sharded(self):
        # moe_test's tensor-parallel pair, both parts fully sharded: the replicated layer
        # norm (tp_replicated) counts once in the one norm.
        moe_test.MoETest.tensor_parallel_pair(
            self, lambda m, g: bt.FullyShardedDataParallel(m, g))

    def test_tensor_parallel_by_data_parallel_fully_sharded_four_ranks(self):
        # moe_test's tensor-parallel pairs by data-parallel pairs, each part fully sharded
        # over its data-parallel pair.
        moe_test.MoETest.tensor_parallel_by_data_parallel(
            self, lambda m, g: bt.FullyShardedDataParallel(m, g))


if __name__ == "__main__":
    unittest.main()
