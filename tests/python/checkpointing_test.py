"""Activation checkpointing (torch.utils.checkpoint, use_reentrant=True and False) under
braid.pytorch at 2 (and 4) ranks as threads of a `local` world, several steps with an optimizer:

  - DistributedDataParallel (all-reduce) + torch.optim.AdamW against torch 1.13's own
    DistributedDataParallel (gloo, in the same process; static_graph=True for reentrant
    checkpointing, as torch requires) with the same checkpointing: bit for bit;
  - DistributedDataParallel(mode="reduce_scatter") + ShardedAdamW (ZeRO-2): the recomputed
    forward in the backward reads the values the forward read, so the run equals the same
    Braid run without checkpointing bit for bit, and torch DDP + AdamW to the kernels' rounding;
  - fully_shard units (each checkpointed block is a unit) with torch's AdamW over the local
    pieces: bit for bit against a serial single-process reference (the ranks' averaged loss),
    and with ShardedAdamW equal to the same run without checkpointing.

Also: gradient accumulation (a no_sync / set_requires_gradient_sync(False) micro-batch first)
equal to the same run without checkpointing; units checkpointing their own body; a ZeRO-2
recompute that reads a bucket whose gradients are complete is refused by name. Each parameter
lies in one checkpoint region. At 4 ranks: DDP against torch DDP (to gloo's order of sums),
ZeRO-2, hybrid 2 x 2 and fully_shard against the serial reference. checkpointing_mpi.py runs
DDP and ZeRO-2 under mpirun."""

import contextlib
import datetime
import unittest

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2
STEPS = 3
MODES = {"none": None, "reentrant": True, "nonreentrant": False}


class Block(torch.nn.Module):
    """inner: checkpoints its own body (inside a fully_shard unit) with use_reentrant=inner."""

    def __init__(self, d, inner=None):
        super().__init__()
        self.fc, self.proj = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)
        self.inner = inner

    def forward(self, x):
        if self.inner is None:
            return self._body(x)
        return checkpoint(self._body, x, use_reentrant=self.inner)

    def _body(self, x):
        return x + self.proj(torch.tanh(self.fc(x)))


class Net(torch.nn.Module):
    """inp, then two checkpoint regions: blocks[0], and blocks[1] with the head `out` (so no
    parameter's gradient comes before the first recompute: with use_reentrant=True the first
    gradient hook of a backward fires inside the inner backward); `reentrant` None runs them
    plainly."""

    def __init__(self, reentrant=None):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(11)
            self.inp = torch.nn.Linear(5, 6)
            self.blocks = torch.nn.ModuleList([Block(6), Block(6)])
            self.out = torch.nn.Linear(6, 3)
        self.reentrant = reentrant

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for region in (self.blocks[0], self._tail):
            h = (region(h) if self.reentrant is None else
                 checkpoint(region, h, use_reentrant=self.reentrant))
        return h

    def _tail(self, h):
        return self.out(self.blocks[1](h))


class Peek(torch.nn.Module):
    """The checkpointed region calls the head `out` under no_grad: its recompute reads `out`,
    whose gradient (from outside the region) is complete by then, so ZeRO-2 may have stepped
    it."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(12)
            self.inp, self.block, self.out = (torch.nn.Linear(5, 6), Block(6),
                                              torch.nn.Linear(6, 3))

    def forward(self, x):
        return self.out(checkpoint(self._region, torch.tanh(self.inp(x)), use_reentrant=True))

    def _region(self, h):
        with torch.no_grad():
            scale = 1 + self.out(h).mean()
        return self.block(h) * scale


def _data(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _loop(r, model, opt, net, accumulate=1):
    """STEPS steps of `accumulate` micro-batches (all but the last without gradient sync);
    returns each step's gradients (None where not readable)."""
    grads = []
    for s in range(STEPS):
        for m in range(accumulate):
            sync = m == accumulate - 1
            if hasattr(model, "set_requires_gradient_sync"):  # fully_shard's switch
                model.set_requires_gradient_sync(sync)
                window = contextlib.nullcontext()
            else:
                window = contextlib.nullcontext() if sync else model.no_sync()
            with window:
                x, y = _data(r, s * accumulate + m)
                torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() if type(p.grad) is torch.Tensor else None
                      for p in net.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


def _params(net):
    return [p.detach().clone() for p in net.parameters()]


class TorchGroups:
    """One torch ProcessGroupGloo per rank thread over a shared in-process store (kept alive
    by the main thread: see torch_idioms_ddp_test.py)."""

    def __init__(self, tag, n=N):
        self._store, self._tag, self._kept, self._n = dist.HashStore(), tag, [], n

    def group(self, r):
        pg = dist.ProcessGroupGloo(dist.PrefixStore(self._tag, self._store), r, self._n,
                                   datetime.timedelta(seconds=60))
        self._kept.append(pg)
        return pg


def _torch_ddp(reentrant, n=N):
    """torch's own DDP + AdamW with the same checkpointing: per rank (grads, params)."""
    groups = TorchGroups("torch-%s-%d" % (reentrant, n), n)

    def body(r, _):
        net = Net(reentrant)
        model = torch.nn.parallel.DistributedDataParallel(
            net, process_group=groups.group(r), static_graph=reentrant is True)
        groups._kept.append(model)
        grads = _loop(r, model, _adamw(net.parameters()), net)
        return grads, _params(net)
    return run_ranks(n, body)


def _serial(reentrant, n=N):
    """One process: the n ranks' averaged loss, torch's AdamW on the full model."""
    net = Net(reentrant)
    opt = _adamw(net.parameters())
    for s in range(STEPS):
        loss = sum(torch.nn.functional.mse_loss(net(x), y)
                   for x, y in (_data(r, s) for r in range(n))) / n
        loss.backward()
        opt.step()
        opt.zero_grad()
    return _params(net)


class CheckpointingTest(unittest.TestCase):
    def assertSame(self, got, want, what, atol=0.0):
        self.assertEqual(len(got), len(want))
        for i, (a, b) in enumerate(zip(got, want)):
            if atol == 0.0:
                self.assertTrue(torch.equal(a, b), "%s: tensor %d differs by %g" % (
                    what, i, (a - b).abs().max()))
            else:
                torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=lambda m: "%s: %d: %s" % (
                    what, i, m))

    # ---- all-reduce DDP ---------------------------------------------------------------------
    def _allreduce(self, mode, n=N, **kw):
        """Bit for bit at 2 ranks; at 4 gloo's ring adds the ranks in another order."""
        reentrant = MODES[mode]
        atol = 0.0 if n == 2 else 1e-6
        want = _torch_ddp(reentrant, n)

        def body(r, g):
            net = Net(reentrant)
            model = bt.DistributedDataParallel(net, group=g, **kw)
            grads = _loop(r, model, _adamw(net.parameters()), net)
            out = grads, _params(net)
            model.close()
            return out

        for r, ((grads, params), (want_grads, want_params)) in enumerate(
                zip(run_ranks(n, body), want)):
            for s, (a, b) in enumerate(zip(grads, want_grads)):
                self.assertSame(a, b, "%s rank %d step %d gradients" % (mode, r, s), atol)
            self.assertSame(params, want_params, "%s rank %d parameters" % (mode, r), atol)

    def test_allreduce_reentrant_equals_torch_ddp(self):
        self._allreduce("reentrant")
        # torch's own recipe: static_graph=True (no graph search, which cannot see the
        # parameters behind a reentrant checkpoint).
        self._allreduce("reentrant", static_graph=True)

    def test_allreduce_nonreentrant_equals_torch_ddp(self):
        self._allreduce("nonreentrant")
        self._allreduce("nonreentrant", static_graph=True)
        self._allreduce("nonreentrant", find_unused_parameters=True)

    # ---- ZeRO-2 -------------------------------------------------------------------------------
    def _zero2_run(self, mode, accumulate=1, n=N, hybrid=False):
        """hybrid: 2 x n/2 (shards over pairs of ranks, replicas across them)."""
        def body(r, g):
            net = Net(MODES[mode])
            groups = dict(group=g, mode="reduce_scatter")
            if hybrid:
                shard, replica = g.mesh(2, n // 2)
                groups = dict(group=shard, replica_group=replica, mode="hybrid")
            model = bt.DistributedDataParallel(net, **groups, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-4)
            opt = bt.ShardedAdamW(model, lr=0.01, weight_decay=0.1)
            _loop(r, model, opt, net, accumulate)
            out = _params(net)
            opt.close()
            model.close()
            return out
        return run_ranks(n, body)

    def _zero2(self, mode):
        plain = self._zero2_run("none")
        want = _torch_ddp(MODES[mode])
        for r, params in enumerate(self._zero2_run(mode)):
            self.assertSame(params, plain[r], "%s rank %d vs no checkpointing" % (mode, r))
            self.assertSame(params, want[r][1], "%s rank %d vs torch" % (mode, r), atol=1e-6)

    def test_zero2_reentrant(self):
        self._zero2("reentrant")

    def test_zero2_nonreentrant(self):
        self._zero2("nonreentrant")

    def test_zero2_accumulation_equals_no_checkpointing(self):
        # The recompute in a no_sync backward waits for its buckets as any forward does.
        plain = self._zero2_run("none", accumulate=2)
        for mode in ("reentrant", "nonreentrant"):
            for r, params in enumerate(self._zero2_run(mode, accumulate=2)):
                self.assertSame(params, plain[r], "%s rank %d, 2 micro-batches" % (mode, r))

    def test_zero2_recompute_reading_a_stepped_bucket_raises(self):
        def body(r, g):
            net = Peek()
            model = bt.DistributedDataParallel(net, group=g, mode="reduce_scatter",
                                               bucket_cap_mb=1e-5, first_bucket_cap_mb=1e-5)
            opt = bt.ShardedAdamW(model, lr=0.01)
            x, y = _data(r, 0)
            loss = torch.nn.functional.mse_loss(model(x), y)
            with self.assertRaisesRegex(RuntimeError, "recompute.*'out.(weight|bias)'"):
                loss.backward()
            opt.close()
            model.close()
        run_ranks(N, body)

    # ---- fully_shard units ------------------------------------------------------------------
    def _fully_shard_run(self, mode, sharded_opt, accumulate=1, inside=False, n=N):
        """inside: each unit checkpoints its own body (the unit's hooks do not run again)
        instead of the regions around the units."""
        def body(r, g):
            net = Net(None if inside else MODES[mode])
            if inside:
                for b in net.blocks:
                    b.inner = MODES[mode]
            for b in net.blocks:
                bt.fully_shard(b, group=g)
            bt.fully_shard(net, group=g)
            if sharded_opt:
                opt = bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.1)
            else:
                opt = _adamw(net.parameters())
            _loop(r, net, opt, net, accumulate)
            with net.summon_full_params():
                out = _params(net)
            if sharded_opt:
                opt.close()
            net.close()
            return out
        return run_ranks(n, body)

    def _fully_shard(self, mode):
        want = _serial(MODES[mode])
        self.assertSame(want, _serial(None), "serial %s vs no checkpointing" % mode)
        for r, params in enumerate(self._fully_shard_run(mode, False)):
            self.assertSame(params, want, "%s rank %d (torch AdamW on pieces)" % (mode, r))
        plain = self._fully_shard_run("none", True)
        for r, params in enumerate(self._fully_shard_run(mode, True)):
            self.assertSame(params, plain[r], "%s rank %d (ShardedAdamW)" % (mode, r))
            self.assertSame(params, want, "%s rank %d (ShardedAdamW) vs serial" % (mode, r),
                            atol=1e-6)

    def test_fully_shard_reentrant(self):
        self._fully_shard("reentrant")

    def test_fully_shard_nonreentrant(self):
        self._fully_shard("nonreentrant")

    def test_fully_shard_checkpoint_inside_units(self):
        want = _serial(None)
        for mode in ("reentrant", "nonreentrant"):
            for r, params in enumerate(self._fully_shard_run(mode, False, inside=True)):
                self.assertSame(params, want, "%s inside units, rank %d" % (mode, r))

    def test_fully_shard_accumulation_equals_no_checkpointing(self):
        plain = self._fully_shard_run("none", True, accumulate=2)
        for mode in ("reentrant", "nonreentrant"):
            for r, params in enumerate(self._fully_shard_run(mode, True, accumulate=2)):
                self.assertSame(params, plain[r], "%s rank %d, 2 micro-batches" % (mode, r))

    # ---- 4 ranks ------------------------------------------------------------------------------
    def test_four_ranks_allreduce_equals_torch_ddp(self):
        self._allreduce("reentrant", n=4, static_graph=True)
        self._allreduce("nonreentrant", n=4)

    def test_four_ranks_zero2_and_hybrid(self):
        # Both against the same run without checkpointing (bit for bit) and the serial
        # reference over 4 ranks (to the sums' order and the AdamW kernels' rounding).
        for hybrid in (False, True):
            plain = self._zero2_run("none", n=4, hybrid=hybrid)
            for mode in ("reentrant", "nonreentrant"):
                want = _serial(MODES[mode], 4)
                for r, params in enumerate(self._zero2_run(mode, n=4, hybrid=hybrid)):
                    what = "%s %s rank %d" % ("hybrid" if hybrid else "ZeRO-2", mode, r)
                    self.assertSame(params, plain[r], what + " vs no checkpointing")
                    self.assertSame(params, want, what + " vs serial", atol=1e-6)

    def test_four_ranks_fully_shard(self):
        for mode in ("reentrant", "nonreentrant"):
            want = _serial(MODES[mode], 4)
            for r, params in enumerate(self._fully_shard_run(mode, False, n=4)):
                self.assertSame(params, want, "%s rank %d of 4 vs serial" % (mode, r),
                                atol=1e-6)


if __name__ == "__main__":
    unittest.main()
