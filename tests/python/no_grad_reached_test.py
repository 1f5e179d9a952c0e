"""Reached but no gradient, under find_unused_parameters=True: a parameter the forward's
outputs reach but that receives no gradient -- its branch passes a custom autograd Function
whose backward returns None (an undefined gradient), or feeds an output the rank's loss
ignores (torch's _DDPSink sends it an undefined gradient) -- is unused on that rank, as torch
DDP's local_used_map counts it. No rank used it: .grad stays None and torch's AdamW skips it
(no weight decay, no moment update, its own step count); some rank did: the others add zeros.

Each case runs beside torch 1.13's own DistributedDataParallel(find_unused_parameters=True)
over gloo + torch.optim.AdamW in the same process (ranks are threads: Braid's `local` world
and one torch ProcessGroupGloo per thread, join_test.TorchGroups): all-reduce DDP + torch
AdamW bit for bit at 2 ranks, ZeRO-2 (reduce_scatter) + ShardedAdamW at 2 and 4 ranks, hybrid
2 x 2 + ShardedAdamW, and all-reduce at 4 ranks, to 1e-6 (Braid's AdamW kernel, and gloo's
ring sums 4 ranks in another order); ZeRO-2 also with a no_sync window, and with
static_graph=True (against torch's static_graph: the first step's map is kept). Weight decay is
large enough that stepping an unused parameter would show. (FullyShardedDataParallel refuses
a hook with an undefined gradient by name: fsdp.py.)"""

import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from join_test import TorchGroups
from torch_idioms_ddp_test import _NoGrad

STEPS = 6


class Gated(torch.nn.Module):
    """Outputs (head(h), aux(h)), h = tanh(stem(x)) + side(h0): the side branch passes
    _NoGrad (an undefined gradient for side's parameters) when `blocked`."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(5)
            self.stem = torch.nn.Linear(5, 6)
            self.side = torch.nn.Linear(6, 6)
            self.head = torch.nn.Linear(6, 2)
            self.aux = torch.nn.Linear(6, 2)
        self.blocked = True

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        s = self.side(h)
        h = h + (_NoGrad.apply(s) if self.blocked else s)
        return self.head(h), self.aux(h)


def _schedule(r, step):
    """(blocked, aux in the loss) of rank r in a step. Steps 0 and 3: every rank blocks the
    side branch and ignores aux (no rank uses either: skipped); otherwise one rank (a different
    one each step) unblocks it and another uses aux (the others add zeros)."""
    if step % 3 == 0:
        return True, False
    return r != step % 2, r == (step + 1) % 2


def _static_schedule(r, step):
    """static_graph: the same graph every step on every rank (side always blocked: no rank
    ever gets its gradient; aux always in the loss)."""
    del r, step
    return True, True


def _loss(model, net, r, step, micro=0, schedule=_schedule):
    net.blocked, use_aux = schedule(r, step + micro)
    g = torch.Generator().manual_seed(1000 * r + 10 * step + micro)
    x, y = torch.randn(4, 5, generator=g), torch.randn(4, 2, generator=g)
    out, aux = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    return loss + aux.pow(2).mean() if use_aux else loss


def _train(r, model, net, opt, window=False, schedule=_schedule):
    """Parameters after each step. window: odd steps accumulate a no_sync microbatch first
    (with the next step's routing: what it used counts as used, as torch's local_used_map)."""
    history = []
    for s in range(STEPS):
        if window and s % 2 == 1:
            with model.no_sync():
                _loss(model, net, r, s, 1, schedule).backward()
        _loss(model, net, r, s, 0, schedule).backward()
        opt.step()
        if isinstance(opt, torch.optim.AdamW):
            opt.zero_grad(set_to_none=True)
        if isinstance(model, bt.FullyShardedDataParallel):
            with model.summon_full_params():
                history.append([p.detach().clone() for p in net.parameters()])
        else:
            history.append([p.detach().clone() for p in net.parameters()])
    return history


class ReachedWithoutGradientTest(unittest.TestCase):

    def check(self, n, wrap, exact=False, window=False, static_graph=False):
        """wrap(net, group) -> (model, optimizer): Braid's run, against torch DDP + AdamW."""
        torch_groups = TorchGroups(n, "reached-%d-%s-%s" % (n, id(wrap), window))
        kept = []
        schedule = _static_schedule if static_graph else _schedule

        def body(r, g):
            net = Gated()
            model, opt = wrap(net, g)
            mine = _train(r, model, net, opt, window, schedule)
            if isinstance(opt, bt.ShardedAdamW):
                opt.close()
            model.close()
            ref_net = Gated()
            ref = torch.nn.parallel.DistributedDataParallel(
                ref_net, process_group=torch_groups.group(r),
                find_unused_parameters=not static_graph, static_graph=static_graph)
            kept.append(ref)
            ref_opt = torch.optim.AdamW(ref_net.parameters(), lr=0.01, weight_decay=0.5)
            return mine, _train(r, ref, ref_net, ref_opt, window, schedule)

        tol = dict(rtol=0, atol=0) if exact else dict(rtol=0, atol=1e-6)
        for r, (got, want) in enumerate(run_ranks(n, body)):
            for s in range(STEPS):
                for i, (a, w) in enumerate(zip(got[s], want[s])):
                    torch.testing.assert_close(
                        a, w, **tol, msg=lambda m, s=s, i=i: "rank %d step %d param %d: %s"
                        % (r, s, i, m))
        return

    def test_reference_skips_what_no_rank_used(self):
        # The anchor: in step 0 side's gradient is undefined and aux ignored on every rank.
        net = Gated()
        for r in range(2):
            _loss(net, net, r, 0).backward()
        self.assertIsNone(net.side.weight.grad)
        self.assertIsNone(net.aux.weight.grad)
        self.assertIsNotNone(net.stem.weight.grad)

    def test_allreduce_torch_adamw(self):
        def wrap(net, g):
            model = bt.DistributedDataParallel(net, g, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5,
                                               find_unused_parameters=True)
            return model, torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        self.check(2, wrap, exact=True)
        self.check(4, wrap)

    def test_zero2_sharded_adamw(self):
        def wrap(net, g):
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter",
                                               bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
                                               find_unused_parameters=True)
            return model, bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        self.check(2, wrap)
        self.check(4, wrap)

    def test_zero2_no_sync_window(self):
        def wrap(net, g):
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter",
                                               bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
                                               find_unused_parameters=True)
            return model, bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        self.check(2, wrap, window=True)

    def test_zero2_static_graph(self):
        # torch's first static iteration counts side unused (its hooks got undefined
        # gradients) and keeps that map: side is never stepped.
        def wrap(net, g):
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter",
                                               bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5,
                                               static_graph=True)
            return model, bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        self.check(2, wrap, static_graph=True)

    def test_hybrid_sharded_adamw(self):
        def wrap(net, g):
            shard, replica = g.mesh(2, 2)
            model = bt.DistributedDataParallel(net, mode="hybrid", group=shard,
                                               replica_group=replica, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5,
                                               find_unused_parameters=True)
            return model, bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        self.check(4, wrap)


if __name__ == "__main__":
    unittest.main()
