"""Divergent control flow under Braid's sharded optimizer on the `local` backend (ranks are
threads): each rank routes its batch through different layers each step (an MoE-like router
picking experts, an early exit that skips the last block), with find_unused_parameters=True, in
ZeRO-2 (DistributedDataParallel(mode="reduce_scatter") + ShardedAdamW) and fully sharded
(FullyShardedDataParallel + ShardedAdamW), against torch's meaning in this process: torch DDP
(find_unused_parameters=True) averages each gradient over the ranks (zeros from those that did
not use the parameter) and torch.optim.AdamW skips a parameter no rank used (its .grad is None:
no weight decay, no moment update, its own step count) -- that is torch AdamW trained serially
on the mean of the ranks' losses, each rank's loss with its own routing. Weight decay is large
enough that stepping an unused parameter would show. 2 ranks, and ZeRO-2, hybrid (2 x 2) and
fully sharded at 4 ranks; all-reduce DDP with torch's AdamW at 2 and 4.

Under mpirun (tests/python/BUILD.bazel's divergent_mpi_np2 / _np4): the ZeRO-2 case, the fully
sharded case (2 processes; recipes_mpi4.py runs it at 4), and all-reduce DDP + torch AdamW, with
one process per rank, against torch's own DDP(find_unused_parameters=True) over gloo + AdamW."""

import os
import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2
STEPS = 5


class Routed(torch.nn.Module):
    """stem -> one or both experts (the router's choice) -> optional block -> head."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(3)
            self.stem = torch.nn.Linear(5, 6)
            self.experts = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(3)])
            self.block = torch.nn.Linear(6, 6)
            self.head = torch.nn.Linear(6, 2)
        self.route = (0,)
        self.early_exit = False

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        h = sum(torch.tanh(self.experts[e](h)) for e in self.route)
        if not self.early_exit:
            h = h + torch.tanh(self.block(h))
        return self.head(h)


def _routing(r, step, micro=0):
    """Rank r's experts and early exit in a step: they differ across ranks; expert 2 is used
    by rank 1 only in odd steps and by nobody in even ones; the block is skipped by every rank
    in step 3 (no rank uses it then)."""
    route = ((r + step + micro) % 2,) + ((2,) if r == 1 and step % 2 == 1 else ())
    early = step == 3 or (r == 0 and step % 2 == 0)
    return route, early


def _batch(r, step, micro=0):
    g = torch.Generator().manual_seed(1000 * r + 10 * step + micro)
    return torch.randn(4, 5, generator=g), torch.randn(4, 2, generator=g)


def _static_routing(r, step, micro=0):
    """static_graph: the same layers every step on every rank (experts 1, 2 and the block
    never used)."""
    del r, step, micro
    return (0,), True


def _loss(model, net, r, step, micro=0, routing=_routing):
    net.route, net.early_exit = routing(r, step, micro)
    x, y = _batch(r, step, micro)
    return torch.nn.functional.mse_loss(model(x), y)


def _reference(micros=1, routing=_routing, n=N):
    """torch: AdamW on the mean over n ranks of the summed micro-batch losses (parameters no
    rank reaches keep .grad None and are skipped)."""
    net = Routed()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.5)
    out = []
    for s in range(STEPS):
        sum(_loss(net, net, r, s, m, routing) for r in range(n)
            for m in range(micros)).div(n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append([p.detach().clone() for p in net.parameters()])
    return out


class DivergentTest(unittest.TestCase):
    def assertClose(self, got, want, what):
        for i, (a, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                       msg=lambda m, i=i: "%s, param %d: %s" % (what, i, m))

    def _train(self, r, g, wrap, micros=1, routing=_routing, optimizer=bt.ShardedAdamW):
        net = Routed()
        model = wrap(net, g)
        opt = optimizer(net.parameters(), lr=0.01, weight_decay=0.5)
        got = []
        for s in range(STEPS):
            for m in range(micros - 1):
                with model.no_sync():
                    _loss(model, net, r, s, m, routing).backward()
            _loss(model, net, r, s, micros - 1, routing).backward()
            opt.step()
            if optimizer is torch.optim.AdamW:
                opt.zero_grad(set_to_none=True)  # torch DDP's way: unused stay None
            if isinstance(model, bt.FullyShardedDataParallel):
                with model.summon_full_params():
                    got.append([p.detach().clone() for p in net.parameters()])
            else:
                got.append([p.detach().clone() for p in net.parameters()])
        if optimizer is not torch.optim.AdamW:
            opt.close()
        model.close()
        return got

    def _check(self, wrap, micros=1, routing=_routing, n=N, optimizer=bt.ShardedAdamW):
        want = _reference(micros, routing, n)
        results = run_ranks(n, lambda r, g: self._train(r, g, wrap, micros, routing,
                                                        optimizer))
        for r, got in enumerate(results):
            for s in range(STEPS):
                self.assertClose(got[s], want[s], "rank %d step %d" % (r, s))

    def test_reference_skips_what_no_rank_used(self):
        # The scenario's anchor: in step 0 no rank uses expert 2, in step 3 nobody the block.
        net = Routed()
        for s, skipped in ((0, net.experts[2].weight), (3, net.block.weight)):
            for r in range(N):
                _loss(net, net, r, s).backward()
            self.assertIsNone(skipped.grad, "step %d" % s)
            net.zero_grad(set_to_none=True)

    def test_zero2(self):
        self._check(lambda net, g: bt.DistributedDataParallel(
            net, g, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
            find_unused_parameters=True))

    def test_zero2_no_sync_window(self):
        self._check(lambda net, g: bt.DistributedDataParallel(
            net, g, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
            find_unused_parameters=True), micros=2)

    def test_allreduce_with_torch_adamw_two_and_four_ranks(self):
        # All-reduce DDP: a parameter no rank used keeps .grad None, so torch's AdamW skips it.
        for n in (2, 4):
            with self.subTest(ranks=n):
                self._check(lambda net, g: bt.DistributedDataParallel(
                    net, g, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
                    find_unused_parameters=True), n=n, optimizer=torch.optim.AdamW)

    def test_zero2_four_ranks(self):
        # Expert 2 is used by one rank of four in odd steps: three ranks add zeros.
        self._check(lambda net, g: bt.DistributedDataParallel(
            net, g, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
            find_unused_parameters=True), n=4)

    def test_hybrid_four_ranks(self):
        # 2 x 2: shards over ranks {0, 1} / {2, 3}, replicas over {0, 2} / {1, 3}; the ranks
        # that use expert 2 and those that skip it sit in different shard and replica groups.
        def wrap(net, g):
            shard, replica = g.mesh(2, 2)
            return bt.DistributedDataParallel(
                net, mode="hybrid", group=shard, replica_group=replica, bucket_cap_mb=1e-4,
                first_bucket_cap_mb=1e-5, find_unused_parameters=True)
        self._check(wrap, n=4)

    def test_zero2_static_graph(self):
        # static_graph: the reducer agrees once (the first step's map) and the optimizer keeps
        # skipping what that step left unused.
        self._check(lambda net, g: bt.DistributedDataParallel(
            net, g, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
            static_graph=True), routing=_static_routing)

    def test_zero2_state_dict_has_torchs_per_parameter_steps(self):
        def body(r, g):
            net = Routed()
            model = bt.DistributedDataParallel(
                net, g, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
                find_unused_parameters=True)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
            for s in range(STEPS):
                _loss(model, net, r, s).backward()
                opt.step()
            sd = opt.state_dict()
            opt.close()
            model.close()
            return sd

        net = Routed()
        opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        for s in range(STEPS):
            sum(_loss(net, net, r, s) for r in range(N)).div(N).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        want = opt.state_dict()["state"]
        for r, sd in enumerate(run_ranks(N, body)):
            for k, w in want.items():
                got = sd["state"][k]
                self.assertEqual(float(got["step"]), float(w["step"]), "rank %d param %d" % (r, k))
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(got[key], w[key], rtol=0, atol=1e-6)
        self.assertEqual({float(w["step"]) for w in want.values()}, {2.0, 4.0, 5.0})

    def test_fully_sharded(self):
        # Units every rank enters (the stem, the head): a unit some rank skips would change
        # the gathers' order across ranks (refused, as torch FSDP's all-gathers would hang);
        # the routed layers live in the root unit.
        self._check(lambda net, g: bt.FullyShardedDataParallel(
            net, g, units=[net.stem, net.head], bucket_cap_mb=1e-4,
            find_unused_parameters=True))

    def test_fully_sharded_four_ranks(self):
        self._check(lambda net, g: bt.FullyShardedDataParallel(
            net, g, units=[net.stem, net.head], bucket_cap_mb=1e-4,
            find_unused_parameters=True), n=4)


def _mpi_main():
    """One process per rank under mpirun: ZeRO-2 (and at 2 ranks fully sharded) + ShardedAdamW,
    and all-reduce DDP + torch AdamW, on the mpi backend against torch's own
    DDP(find_unused_parameters=True) over gloo + torch AdamW in this process."""
    import braid  # noqa: PLC0415 (only under mpirun)
    import train_compare  # noqa: PLC0415 (init_gloo)
    torch.set_num_threads(1)
    world = braid.World("mpi")
    g = world.group()
    r = g.rank
    train_compare.init_gloo(g, r, g.size)
    ref_net = Routed()
    ref = torch.nn.parallel.DistributedDataParallel(ref_net, find_unused_parameters=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.5)
    want = []
    for s in range(STEPS):
        _loss(ref, ref_net, r, s).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append([p.detach().clone() for p in ref_net.parameters()])
    case = DivergentTest()
    wraps = [("ZeRO-2", lambda net, grp: bt.DistributedDataParallel(
        net, grp, mode="reduce_scatter", bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
        find_unused_parameters=True))]
    if g.size == 2:  # 4 processes: tests/python/recipes_mpi4.py runs it in its launch
        wraps.append(("fully sharded", lambda net, grp: bt.FullyShardedDataParallel(
            net, grp, units=[net.stem, net.head], bucket_cap_mb=1e-4,
            find_unused_parameters=True)))  # test_fully_sharded's units
    for what, wrap in wraps:
        got = case._train(r, g, wrap)
        for s in range(STEPS):
            case.assertClose(got[s], want[s], "rank %d step %d %s vs torch DDP" % (r, s, what))
    # All-reduce DDP + torch AdamW against the same torch DDP run again: bit for bit at 2 ranks,
    # to 1e-6 at 4 (gloo's ring adds in another order); torch's AdamW skips what no rank used
    # in both (.grad stays None).
    ref_net, net = Routed(), Routed()
    ref = torch.nn.parallel.DistributedDataParallel(ref_net, find_unused_parameters=True)
    ours = bt.DistributedDataParallel(net, g, find_unused_parameters=True, bucket_cap_mb=1e-4,
                                      first_bucket_cap_mb=1e-5)
    runs = [(ref, ref_net, torch.optim.AdamW(ref_net.parameters(), lr=0.01, weight_decay=0.5)),
            (ours, net, torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.5))]
    for s in range(STEPS):
        for model, module, opt in runs:
            _loss(model, module, r, s).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for i, (a, b) in enumerate(zip(net.parameters(), ref_net.parameters())):
            assert torch.equal(a, b) or (g.size > 2 and torch.allclose(a, b, rtol=0, atol=1e-6)), (
                "rank %d step %d param %d: all-reduce DDP vs torch" % (r, s, i))
    ours.close()
    world.close()
    print("rank %d: divergent %s and all-reduce DDP match torch "
          "DDP(find_unused_parameters=True) + AdamW" % (r, ", ".join(w for w, _ in wraps)))


if __name__ == "__main__":
    if os.environ.get("OMPI_COMM_WORLD_SIZE"):
        _mpi_main()
    else:
        unittest.main()
