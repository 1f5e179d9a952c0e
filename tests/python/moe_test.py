"""ShardedAdamW.linked (braid/_linked.py): one optimizer and one global gradient norm over a
tiny MoE model's dense trunk (DistributedDataParallel over the 4-rank world) and its experts
(over 2-rank expert-data-parallel groups from world.split: ranks r and r + 2 hold expert-parallel
rank r % 2's experts, different from the other pair's), at 4 ranks on `local` threads, against a
serial single-process reference: each rank's gradients of its own loss, the trunk's averaged
over the 4 ranks and each expert-parallel rank's experts over their 2 ranks, one global norm
over the trunk and every expert (each counted once), one clip, torch.optim.AdamW; the trunk in
ZeRO-2 or hybrid 2 x 2; and at 2 ranks, each rank its own experts. Also tensor parallelism: a
pair whose replicated layer norm (tp_replicated) counts once in the norm, and at 4 ranks
tensor-parallel pairs by data-parallel pairs."""

import contextlib
import math
import unittest

import torch

import braid.pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from train_models import make_moe, moe_batch

N, STEPS, LR, MAX_NORM = 4, 3, 0.05, 0.05


def _loss(trunk, experts, x, t):
    h, gates = trunk(x)
    return torch.nn.functional.mse_loss(experts(h, gates), t)


def _reference(n=N):
    """(trunk parameters, [experts of expert-parallel rank 0, of 1], [norm per step]) of n
    ranks: rank r holds expert-parallel rank r % 2's experts."""
    trunk, e0 = make_moe(0)
    _, e1 = make_moe(1)
    experts = [e0, e1]
    params = list(trunk.parameters()) + list(e0.parameters()) + list(e1.parameters())
    opt = torch.optim.AdamW(params, lr=LR)
    norms = []
    for step in range(STEPS):
        grads = {id(p): torch.zeros_like(p) for p in params}
        for r in range(n):
            own = list(trunk.parameters()) + list(experts[r % 2].parameters())
            x, t = moe_batch(r, step)
            for p, g in zip(own, torch.autograd.grad(_loss(trunk, experts[r % 2], x, t), own)):
                grads[id(p)] += g
        for p in trunk.parameters():
            p.grad = grads[id(p)] / n
        for e in experts:
            for p in e.parameters():
                p.grad = grads[id(p)] / (n // 2)  # the ranks holding these experts
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
        coef = min(1.0, MAX_NORM / (norm + 1e-6))
        for p in params:
            p.grad.mul_(coef)
        opt.step()
        norms.append(norm)
    return ([p.detach().clone() for p in trunk.parameters()],
            [[p.detach().clone() for p in e.parameters()] for e in experts], norms)


def dense_and_experts(case, r, g, hybrid):
    """Rank r: the trunk (ZeRO-2 over `g`, or hybrid 2 x 2) and its expert-parallel rank's
    experts (ZeRO-2 over a 2-rank expert-data-parallel group) under one ShardedAdamW.linked;
    (trunk parameters, expert parameters, norm per step). `case` asserts. Also
    tests/python/recipes_mpi4.py."""
    edp = g.split(r % 2, r, "expert_dp")
    with INIT_LOCK:  # seeds torch's global RNG: rank threads must not interleave
        trunk, experts = make_moe(r % 2)
    placement, span, mesh = dict(group=g, mode="reduce_scatter"), None, ()
    if hybrid:
        mesh = g.mesh(2, 2)
        placement = dict(group=mesh[0], replica_group=mesh[1], mode="hybrid")
        span = g
    dense = bt.DistributedDataParallel(trunk, **placement,
                                       bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    moe = bt.DistributedDataParallel(experts, edp, mode="reduce_scatter",
                                     bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    with case.assertRaisesRegex(ValueError, r"ShardedAdamW\.linked\(params\)"):
        bt.ShardedAdamW(list(trunk.parameters()) + list(experts.parameters()), lr=LR)
    opt = bt.ShardedAdamW.linked(list(trunk.parameters()) + list(experts.parameters()),
                                 lr=LR, max_grad_norm=MAX_NORM, span=span)
    case.assertEqual(len(opt.optimizers), 2)
    norms = []
    for step in range(STEPS):
        x, t = moe_batch(r, step)
        h, gates = dense(x)
        torch.nn.functional.mse_loss(moe(h, gates), t).backward()
        norms.append(opt.clip_grad_norm_(MAX_NORM).item())
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    out = ([p.detach().clone() for p in trunk.parameters()],
           [p.detach().clone() for p in experts.parameters()], norms)
    opt.close()
    dense.close()
    moe.close()
    edp.close()
    for grp in mesh:
        grp.close()
    return out


def check_dense_and_experts(case, results, want_trunk, want_experts, want_norms, first_rank=0):
    """dense_and_experts' results of ranks first_rank, first_rank + 1, ... against _reference."""
    for r, (trunk, experts, norms) in enumerate(results, first_rank):
        for got, want in zip(norms, want_norms):
            case.assertAlmostEqual(got, want, delta=1e-5 * want)
        for a, b in zip(trunk, want_trunk):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(experts, want_experts[r % 2]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def full_values(wrapper):
    """Copies of a wrapper's parameters (a fully sharded one's inside summon_full_params)."""
    summon = getattr(wrapper, "summon_full_params", None)
    with summon() if summon is not None else contextlib.nullcontext():
        return [p.detach().clone() for p in wrapper.module.parameters()]


def _tp_pair_make():
    with INIT_LOCK:
        torch.manual_seed(11)
        return torch.nn.Linear(8, 4), torch.nn.LayerNorm(4)


def _tp_pair_shared(step):  # the layer norm's data: the same on both ranks
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)


def tensor_parallel_pair(r, g, wrap):
    """Rank r of a 2-rank group g as a tensor-parallel pair: a dense layer on g and a layer
    norm identical on both ranks (same inputs), reduced over each rank's own group
    (tp_replicated: its norm counts once, on tensor-parallel rank 0). wrap(module, group): the
    wrapper (moe_fsdp_test passes fully sharded ones). (full parameters, norm per step); also
    tests/python/recipes_mpi2.py."""
    mse = torch.nn.functional.mse_loss
    solo = g.split(r, 0, "norm_dp")
    lin, ln = _tp_pair_make()
    dense, norm = wrap(lin, g), wrap(ln, solo)
    opt = bt.ShardedAdamW.linked(list(lin.parameters()) + list(ln.parameters()), lr=LR,
                                 max_grad_norm=MAX_NORM, tensor_parallel_group=g,
                                 tp_replicated=[norm])
    norms = []
    for step in range(STEPS):
        x, t = moe_batch(r, step)
        z, u = _tp_pair_shared(step)
        (mse(dense(x), t) + mse(norm(z), u)).backward()
        norms.append(opt.clip_grad_norm_(MAX_NORM).item())
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    out = full_values(dense) + full_values(norm)
    opt.close()
    dense.close()
    norm.close()
    solo.close()
    return out, norms


def tensor_parallel_pair_reference():
    """Serial: each rank's (full parameters) and the norm per step of tensor_parallel_pair."""
    mse = torch.nn.functional.mse_loss
    lin, ln = _tp_pair_make()
    params = list(lin.parameters()) + list(ln.parameters())
    opt = torch.optim.AdamW(params, lr=LR)
    want_norms = []
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in lin.parameters()]
        for r in range(2):
            x, t = moe_batch(r, step)
            loss = mse(lin(x), t)
            for acc, gr in zip(grads, torch.autograd.grad(loss, list(lin.parameters()))):
                acc += gr / 2
        z, u = _tp_pair_shared(step)
        grads += torch.autograd.grad(mse(ln(z), u), list(ln.parameters()))
        norm = math.sqrt(sum(float((gr.double() ** 2).sum()) for gr in grads))
        coef = min(1.0, MAX_NORM / (norm + 1e-6))
        for p, gr in zip(params, grads):
            p.grad = gr * coef
        opt.step()
        want_norms.append(norm)
    want = [p.detach().clone() for p in params]
    return [want, want], want_norms


def _tp_dp_make(t):
    with INIT_LOCK:
        torch.manual_seed(11)
        ln = torch.nn.LayerNorm(4)
        torch.manual_seed(20 + t)
        return torch.nn.Linear(8, 4), ln


def _tp_dp_shared(d, step):  # the layer norm's data: data-parallel rank d's
    g = torch.Generator().manual_seed(600 + 10 * d + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)


def tensor_parallel_by_data_parallel(r, g, wrap):
    """Rank r of a 4-rank group g: tensor-parallel pairs {0, 1} / {2, 3} (g.split) by
    data-parallel pairs {0, 2} / {1, 3}: tensor-parallel rank t = r % 2 holds its own shard (a
    Linear seeded by t), reduced over its data-parallel pair; a layer norm replicated across
    each tensor-parallel pair (the same inputs there: data-parallel rank d = r // 2's), reduced
    over the data-parallel pair too, tp_replicated. One norm: both shards plus the layer norm
    once. wrap(module, group): the wrapper. (full parameters, norm per step); also
    tests/python/recipes_mpi4.py."""
    mse = torch.nn.functional.mse_loss
    tp = g.split(r // 2, r, "tp")
    dp = g.split(r % 2, r, "dp")
    lin, ln = _tp_dp_make(r % 2)
    shard, norm = wrap(lin, dp), wrap(ln, dp)
    opt = bt.ShardedAdamW.linked(list(lin.parameters()) + list(ln.parameters()), lr=LR,
                                 max_grad_norm=MAX_NORM, span=g,
                                 tensor_parallel_group=tp, tp_replicated=[norm])
    norms = []
    for step in range(STEPS):
        x, t = moe_batch(r, step)
        z, u = _tp_dp_shared(r // 2, step)
        (mse(shard(x), t) + mse(norm(z), u)).backward()
        norms.append(opt.clip_grad_norm_(MAX_NORM).item())
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    out = full_values(shard) + full_values(norm)
    opt.close()
    shard.close()
    norm.close()
    tp.close()
    dp.close()
    return out, norms


def tensor_parallel_by_data_parallel_reference():
    """Serial: each of the 4 ranks' (full parameters) and the norm per step of
    tensor_parallel_by_data_parallel."""
    mse = torch.nn.functional.mse_loss
    lins = [_tp_dp_make(t)[0] for t in range(2)]
    ln = _tp_dp_make(0)[1]
    params = [p for m in lins + [ln] for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=LR)
    want_norms = []
    for step in range(STEPS):
        grads = {id(p): torch.zeros_like(p) for p in params}
        for r in range(4):  # each shard's gradient averaged over its data-parallel pair
            x, t = moe_batch(r, step)
            own = list(lins[r % 2].parameters())
            for p, gr in zip(own, torch.autograd.grad(mse(lins[r % 2](x), t), own)):
                grads[id(p)] += gr / 2
        for d in range(2):  # the layer norm's over the data-parallel ranks
            z, u = _tp_dp_shared(d, step)
            for p, gr in zip(ln.parameters(),
                             torch.autograd.grad(mse(ln(z), u), list(ln.parameters()))):
                grads[id(p)] += gr / 2
        norm = math.sqrt(sum(float((gr.double() ** 2).sum()) for gr in grads.values()))
        coef = min(1.0, MAX_NORM / (norm + 1e-6))
        for p in params:
            p.grad = grads[id(p)] * coef
        opt.step()
        want_norms.append(norm)
    want = [[p.detach().clone() for p in list(lins[r % 2].parameters()) + list(ln.parameters())]
            for r in range(4)]
    return want, want_norms


def check_tensor_parallel(case, results, want, want_norms, first_rank=0):
    """Ranks first_rank, first_rank + 1, ...'s (parameters, norms) against a reference's (each
    rank's parameters, norms); clipping must be active every step."""
    case.assertGreater(min(want_norms), MAX_NORM)
    for r, (got_params, norms) in enumerate(results, first_rank):
        case.assertEqual(len(norms), STEPS)
        for got, w in zip(norms, want_norms):
            case.assertAlmostEqual(got, w, delta=1e-5 * w)
        for i, (a, b) in enumerate(zip(got_params, want[r])):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg="rank %d parameter %d" % (r, i))


class MoETest(unittest.TestCase):
    def test_dense_and_experts_one_global_norm_match_serial_reference(self):
        self._dense_and_experts(hybrid=False)

    def test_hybrid_dense_and_experts_one_global_norm_match_serial_reference(self):
        # The dense trunk hybrid 2 x 2 (shards over {0, 1} / {2, 3}, replicas across them,
        # its norm counted on replica 0 only); span= the world, as a hybrid wrapper requires.
        self._dense_and_experts(hybrid=True)

    def test_two_ranks_each_its_own_experts(self):
        # Expert-data-parallel groups of one rank: the experts are not reduced, yet both
        # ranks' experts add to the one norm.
        self._dense_and_experts(hybrid=False, n=2)

    def _dense_and_experts(self, hybrid, n=N):
        want_trunk, want_experts, want_norms = _reference(n)
        self.assertGreater(min(want_norms), MAX_NORM)  # clipping is active every step
        results = run_ranks(n, lambda r, g: dense_and_experts(self, r, g, hybrid))
        check_dense_and_experts(self, results, want_trunk, want_experts, want_norms)

    def test_tensor_parallel_replicated_parameters_count_once(self):
        self.tensor_parallel_pair(
            lambda m, g: bt.DistributedDataParallel(m, g, mode="reduce_scatter"))

    def tensor_parallel_pair(self, wrap):
        """tensor_parallel_pair at 2 rank threads against its serial reference."""
        check_tensor_parallel(self, run_ranks(2, lambda r, g: tensor_parallel_pair(r, g, wrap)),
                              *tensor_parallel_pair_reference())

    def test_tensor_parallel_by_data_parallel_four_ranks(self):
        self.tensor_parallel_by_data_parallel(
            lambda m, g: bt.DistributedDataParallel(m, g, mode="reduce_scatter"))

    def tensor_parallel_by_data_parallel(self, wrap):
        """tensor_parallel_by_data_parallel at 4 rank threads against its serial reference."""
        check_tensor_parallel(
            self, run_ranks(4, lambda r, g: tensor_parallel_by_data_parallel(r, g, wrap)),
            *tensor_parallel_by_data_parallel_reference())


if __name__ == "__main__":
    unittest.main()
