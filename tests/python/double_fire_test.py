"""A parameter used both inside and outside a reentrant torch.utils.checkpoint region (its
AccumulateGrad hook fires in the region's nested backward and again in the outer one) under
ZeRO-2 and fully sharded models (braid/_ddp_reuse.py, braid/_recompute.py), on the `local`
backend (ranks are threads), each against torch in this process:

  - DistributedDataParallel(mode="reduce_scatter", static_graph=True) + ShardedAdamW matches
    torch DDP(static_graph=True) + torch AdamW to AdamW's precision at 2 ranks, mode="hybrid"
    on a 2 x 2 mesh at 4 ranks; the recompute reads the unstepped values (its bucket waits
    for the second mark); through no_sync and reduce_scatter_only windows (the latter before
    the first synced step) against serial AdamW (torch DDP asserts there); without
    static_graph the second fire is an error naming the parameter and static_graph=True;
  - fully_shard with static_graph=True (Braid's keyword: marks counted as DDP's): the reused
    parameter in the root unit (a module of the root, or a root parameter used inside
    checkpointed block units and outside them, firing three times), through a no_sync window,
    hybrid on a 2 x 2 mesh (to the rounding of its two-stage average),
    with torch SGD on the pieces bit for bit and with ShardedAdamW to AdamW's precision,
    against a serial reference; without static_graph the second fire is an error naming the
    parameter, static_graph=True and use_reentrant=False; with use_reentrant=False (one fire)
    the same model matches the serial reference bit for bit.
Under mpirun -np 2 (double_fire_mpi_np2) the script runs the ZeRO-2 case on the "mpi" world
against serial torch AdamW on the mean of the ranks' losses.
(DDP with mode="allreduce": tied_weights_test.py.)"""

import datetime
import os
import sys
import unittest

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

V, D = 11, 6
STEPS = 3


class ReusedLM(torch.nn.Module):
    """Embedding -> checkpoint(tanh(mix)) -> mix(ln) -> head: `mix` is used inside the
    checkpointed region and outside it."""

    def __init__(self, reentrant=True):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(5)
            self.wte = torch.nn.Embedding(V, D)
            self.mix = torch.nn.Linear(D, D)
            self.ln = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)
        self.reentrant = reentrant

    def forward(self, idx):
        h = checkpoint(lambda t: torch.tanh(self.mix(t)), self.wte(idx),
                       use_reentrant=self.reentrant)
        return self.head(self.mix(self.ln(h)))


def _loss(model, r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    idx = torch.randint(0, V, (4, 5), generator=g)
    tgt = torch.randint(0, V, (4, 5), generator=g)
    return torch.nn.functional.cross_entropy(model(idx).reshape(-1, V), tgt.reshape(-1))


def _torch_ddp_adamw(n):
    """torch DDP(static_graph=True) + torch AdamW over gloo groups of n rank threads: each
    rank's parameters after STEPS steps."""
    store, kept = dist.HashStore(), []

    def body(r, g):
        pg = dist.ProcessGroupGloo(dist.PrefixStore("df%d" % n, store), r, n,
                                   datetime.timedelta(seconds=60))
        net = ReusedLM()
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=pg, static_graph=True)
        kept.extend([pg, ddp])  # dropped by the main thread
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        for step in range(STEPS):
            _loss(ddp, r, step).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in net.parameters()]

    return run_ranks(n, body)


def _braid_zero2(r, g, mode, replica=None, static_graph=True, window=None, at=0):
    """window: a no_sync(window) micro-batch before step `at`'s synced one."""
    net = ReusedLM()
    model = bt.DistributedDataParallel(net, g, mode=mode, replica_group=replica,
                                       static_graph=static_graph, bucket_cap_mb=1e-4,
                                       first_bucket_cap_mb=1e-5)
    opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
    try:
        for step in range(STEPS):
            if window and step == at:
                with model.no_sync(window):
                    _loss(model, r, step + 50).backward()
            _loss(model, r, step).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in net.parameters()]
    finally:
        opt.close()
        model.close()


class Zero2DoubleFireTest(unittest.TestCase):
    def assert_close(self, got, want):
        for r, params in enumerate(got):
            for i, (a, w) in enumerate(zip(params, want[r])):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                           msg=lambda m: "rank %d param %d: %s" % (r, i, m))

    def test_reduce_scatter_matches_torch_static_graph(self):
        want = _torch_ddp_adamw(2)
        self.assert_close(run_ranks(2, lambda r, g: _braid_zero2(r, g, "reduce_scatter")), want)

    def test_hybrid_at_four_ranks_matches_torch_static_graph(self):
        want = _torch_ddp_adamw(4)

        def body(r, g):
            shard, replica = g.mesh(2, 2)
            return _braid_zero2(r, shard, "hybrid", replica)

        self.assert_close(run_ranks(4, body), want)

    def test_accumulation_matches_serial_adamw(self):
        # torch DDP fails an internal assert with a twice-fired hook in no_sync: the reference
        # is serial. reduce_scatter_only before the first synced step: the reducer counts the
        # marks in that backward (it launches), and so does the recompute check.
        cases = (("reduce_scatter", "no_sync", 1), ("reduce_scatter", "no_sync", 0),
                 ("hybrid", "reduce_scatter_only", 0), ("hybrid", "no_sync", 1))
        for mode, window, at in cases:
            with self.subTest(mode=mode, window=window, at=at):
                n = 4 if mode == "hybrid" else 2
                want = _serial(ReusedLM, n, adamw=True, window_at=at)

                def body(r, g):
                    shard, replica = g.mesh(2, 2) if mode == "hybrid" else (g, None)
                    return _braid_zero2(r, shard, mode, replica, window=window, at=at)

                self.assert_close(run_ranks(n, body), [want] * n)

    def test_without_static_graph_is_named(self):
        def body(r, g):
            # (the recompute reads 'mix' before its hook fires the second time)
            with self.assertRaisesRegex(RuntimeError, r"'mix\.(weight|bias)'.*static_graph=True"):
                _braid_zero2(r, g, "reduce_scatter", static_graph=False)

        run_ranks(2, body)


class SharedBiasNet(torch.nn.Module):
    """Embedding -> two blocks, each checkpointed (reentrant) around tanh(block(h) + shared) ->
    head(ln(h) + shared): the root's `shared` is used inside both regions and outside them, so
    its hook fires three times per backward; the blocks are units."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(6)
            self.wte = torch.nn.Embedding(V, D)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(D, D), torch.nn.Linear(D, D)])
            self.shared = torch.nn.Parameter(torch.randn(D) * 0.1)
            self.ln = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, idx):
        h = self.wte(idx)
        for b in self.blocks:
            h = checkpoint(lambda t, b=b: torch.tanh(b(t) + self.shared), h, use_reentrant=True)
        return self.head(self.ln(h) + self.shared)


def _per_rank_grads(net, n, step, window):
    """Each rank's gradient by plain torch (a no_sync micro-batch first with `window`)."""
    grads = []
    for r in range(n):
        net.zero_grad(set_to_none=True)
        if window:
            _loss(net, r, step + 50).backward()
        _loss(net, r, step).backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    return grads


def _serial(make, n, adamw=False, window_at=None):
    """The ranks' gradients averaged (in the reduction's order), then SGD with momentum or
    AdamW on the full model: the parameters after STEPS steps."""
    net = make()
    opt = (torch.optim.AdamW(net.parameters(), lr=0.01) if adamw
           else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    for step in range(STEPS):
        grads = _per_rank_grads(net, n, step, step == window_at)
        for p, *gs in zip(net.parameters(), *grads):
            p.grad = sum(gs) / n
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _braid_fully_shard(r, g, make, units, static_graph, sharded=False, window=False, mesh=None):
    net = make()
    where = dict(mesh=mesh) if mesh else dict(group=g)
    for m in units(net):
        bt.fully_shard(m, **where)
    bt.fully_shard(net, static_graph=static_graph, **where)
    opt = (bt.ShardedAdamW(net.parameters(), lr=0.01) if sharded
           else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    try:
        for step in range(STEPS):
            if window and step == 1:
                net.set_requires_gradient_sync(False)
                _loss(net, r, step + 50).backward()
                net.set_requires_gradient_sync(True)
            _loss(net, r, step).backward()
            opt.step()
            opt.zero_grad()
        with net.summon_full_params():
            return [p.detach().clone() for p in net.parameters()]
    finally:
        if sharded:
            opt.close()
        net.close()


def _no_units(net):
    return []


def _mix_unit(net):
    return [net.mix]


def _block_units(net):
    return list(net.blocks)


class FullyShardDoubleFireTest(unittest.TestCase):
    def assert_equal(self, got, want):
        for r, params in enumerate(got):
            for i, (a, w) in enumerate(zip(params, want)):
                self.assertTrue(torch.equal(a, w),
                                "rank %d param %d: %s" % (r, i, (a - w).abs().max()))

    def test_without_static_graph_is_named(self):
        for units in (_no_units, _mix_unit):
            def body(r, g):
                with self.assertRaisesRegex(RuntimeError, r"'mix\.(weight|bias)'.*fired twice"
                                            r".*static_graph=True.*use_reentrant=False"):
                    _braid_fully_shard(r, g, ReusedLM, units, False)

            with self.subTest(units=units.__name__):
                run_ranks(2, body)

    def test_static_graph_matches_serial_torch(self):
        # The reused parameter in the root unit (gathered through the backward); the blocks
        # are units entered for their recompute. Bit for bit with torch's SGD on the pieces.
        for make, units in ((ReusedLM, _no_units), (SharedBiasNet, _block_units)):
            for window in (False, True):
                with self.subTest(model=make.__name__, no_sync=window):
                    want = _serial(make, 2, window_at=1 if window else None)
                    self.assert_equal(run_ranks(2, lambda r, g: _braid_fully_shard(
                        r, g, make, units, True, window=window)), want)

    def test_static_graph_with_sharded_adamw(self):
        want = _serial(SharedBiasNet, 2, adamw=True)
        for got in run_ranks(2, lambda r, g: _braid_fully_shard(r, g, SharedBiasNet,
                                                                _block_units, True, True)):
            for i, (a, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                           msg=lambda m: "param %d: %s" % (i, m))

    def test_static_graph_hybrid_at_four_ranks(self):
        # HSDP on a 2 x 2 mesh: averaged in two stages, so to the rounding of that order.
        want = _serial(SharedBiasNet, 4)
        for got in run_ranks(4, lambda r, g: _braid_fully_shard(
                r, g, SharedBiasNet, _block_units, True, mesh=g.mesh(2, 2))):
            for i, (a, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                           msg=lambda m: "param %d: %s" % (i, m))

    def test_nonreentrant_reuse_matches_serial_torch(self):
        # (mix in the root unit: a unit entered twice in one forward is refused at the next
        # step's forward, checkpointed or not)
        want = _serial(lambda: ReusedLM(reentrant=False), 2)
        self.assert_equal(run_ranks(2, lambda r, g: _braid_fully_shard(
            r, g, lambda: ReusedLM(reentrant=False), _no_units, False)), want)


def mpi_main():
    net = ReusedLM()
    model = bt.DistributedDataParallel(net, mode="reduce_scatter", static_graph=True,
                                       bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
    opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
    r, n = model._groups[0].rank, int(os.environ["OMPI_COMM_WORLD_SIZE"])
    for step in range(STEPS):
        _loss(model, r, step).backward()
        opt.step()
        opt.zero_grad()
    got = [p.detach().clone() for p in net.parameters()]
    opt.close()
    model.close()
    ref = ReusedLM()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    for step in range(STEPS):
        (sum(_loss(ref, k, step) for k in range(n)) / n).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for i, (a, w) in enumerate(zip(got, ref.parameters())):
        torch.testing.assert_close(a, w.detach(), rtol=0, atol=1e-6,
                                   msg=lambda m: "rank %d param %d: %s" % (r, i, m))
    print("double_fire mpi rank %d: OK" % r)


if __name__ == "__main__":
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        mpi_main()
        sys.exit(0)
    unittest.main()
