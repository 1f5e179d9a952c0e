"""Tied and reused parameters under braid.pytorch (braid/_ddp_reuse.py, scheduler/reducer_marks.h),
on the `local` backend (ranks are threads), each against torch in this process:

  - a tied parameter (GPT-2's embedding shared with its LM head: parameters() yields it once)
    under DistributedDataParallel matches torch DDP (gloo) bit for bit, with gradient views
    or not, and through a no_sync window;
  - a parameter used inside and outside a reentrant torch.utils.checkpoint region (its hook
    fires in the region's nested backward and again in the outer one) matches torch DDP with
    static_graph=True bit for bit; without static_graph it is an error naming the parameter
    and the fix, as torch's;
  - the same through a no_sync window against plain torch (torch DDP fails an internal assert
    there);
  - ZeRO-2 (mode="reduce_scatter" + ShardedAdamW) with the tied embedding matches serial torch
    AdamW on the mean of the ranks' losses;
  - at 4 ranks, DDP with both against a serial reference in the reduction's order, and
    ZeRO-2 and hybrid 2 x 2 with the tied embedding against serial torch AdamW;
  - fully_shard: a tied weight owned by one unit and borrowed by another (or the root) against
    a serial reference, bit for bit with a torch optimizer on the pieces (2 and 4 ranks).
Under mpirun -np 2 (tied_weights_mpi_np2) the script runs the tied + reentrant model in Braid
DDP on the "mpi" world against a serial single-process reference, bit for bit."""

import datetime
import os
import sys
import unittest

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2
V, D = 11, 6
STEPS = 3


class TiedLM(torch.nn.Module):
    """Embedding -> (reentrant checkpoint of tanh(mix)) -> mix(ln) -> head, the head's weight
    tied to the embedding's (GPT-2). With `reentrant`, mix is used inside the checkpointed
    region and outside it, so its AccumulateGrad hook fires twice per backward."""

    def __init__(self, reentrant=False):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(3)
            self.wte = torch.nn.Embedding(V, D)
            self.mix = torch.nn.Linear(D, D)
            self.ln = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.reentrant = reentrant

    def forward(self, idx):
        h = self.wte(idx)
        if self.reentrant:
            h = checkpoint(lambda t: torch.tanh(self.mix(t)), h, use_reentrant=True)
        return self.head(self.mix(self.ln(h)))


def _loss(model, r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    idx = torch.randint(0, V, (4, 5), generator=g)
    tgt = torch.randint(0, V, (4, 5), generator=g)
    return torch.nn.functional.cross_entropy(model(idx).reshape(-1, V), tgt.reshape(-1))


def _run_ranks(fn):
    return run_ranks(N, fn)


class TorchGroups:
    """One torch ProcessGroupGloo per rank thread over a shared HashStore; keeps what rank
    threads made alive until the main thread drops it (see torch_idioms_ddp_test.py)."""

    def __init__(self, tag):
        self._store, self._tag, self._kept = dist.HashStore(), tag, []

    def group(self, r):
        return self.keep(dist.ProcessGroupGloo(dist.PrefixStore(self._tag, self._store), r, N,
                                               datetime.timedelta(seconds=60)))

    def keep(self, obj):
        self._kept.append(obj)
        return obj


def _train(r, net, model, window=False):
    """SGD with momentum; per step the gradients after backward; then the parameters."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    seen = []
    for step in range(STEPS):
        if window and step == 1:
            with model.no_sync():
                _loss(model, r, step + 50).backward()
        _loss(model, r, step).backward()
        seen.append([p.grad.clone() for p in net.parameters()])
        opt.step()
        opt.zero_grad()
    out = seen, [p.detach().clone() for p in net.parameters()]
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return out


def _serial_adamw(reentrant, n=N):
    net = TiedLM(reentrant)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for step in range(STEPS):
        (sum(_loss(net, r, step) for r in range(n)) / n).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


class TiedWeightsTest(unittest.TestCase):
    def assert_equal(self, got, want, where):
        if isinstance(want, torch.Tensor):
            self.assertTrue(torch.equal(got, want), "%s: %s vs torch %s" % (where, got, want))
            return
        self.assertEqual(len(got), len(want), where)
        for k, (g, w) in enumerate(zip(got, want)):
            self.assert_equal(g, w, "%s[%d]" % (where, k))

    def against_torch_ddp(self, reentrant, braid_kwargs, torch_kwargs, window=False):
        pgs = TorchGroups("tied_%d" % reentrant)

        def theirs(r, g):
            net = TiedLM(reentrant)
            ddp = pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, process_group=pgs.group(r), **torch_kwargs))
            return _train(r, net, ddp, window)

        def ours(r, g):
            net = TiedLM(reentrant)
            return _train(r, net, bt.DistributedDataParallel(net, group=g, bucket_cap_mb=1e-4,
                                                             first_bucket_cap_mb=1e-5,
                                                             **braid_kwargs), window)

        want = _run_ranks(theirs)
        self.assertEqual(len(list(TiedLM().parameters())), 5)  # the tie: wte once
        self.assert_equal(_run_ranks(ours), want, "ranks")

    def test_tied_embedding_matches_torch_ddp(self):
        for view in (False, True):
            for window in (False, True):
                with self.subTest(gradient_as_bucket_view=view, no_sync=window):
                    self.against_torch_ddp(False, dict(gradient_as_bucket_view=view),
                                           dict(gradient_as_bucket_view=view), window)

    def test_hook_firing_twice_matches_torch_static_graph(self):
        for view in (False, True):
            with self.subTest(gradient_as_bucket_view=view):
                kw = dict(gradient_as_bucket_view=view, static_graph=True)
                self.against_torch_ddp(True, kw, kw)

    def test_hook_firing_twice_through_no_sync_matches_serial_torch(self):
        # torch 1.13's DDP fails an internal assert here (expect_autograd_hooks_, reducer.cpp
        # 1490): the reference is plain torch, each rank's two micro-batches accumulated in
        # p.grad, averaged over the ranks.
        want = []
        for r in range(N):
            net = TiedLM(True)
            _loss(net, r, 50).backward()
            _loss(net, r, 0).backward()
            want.append([p.grad.clone() for p in net.parameters()])
        want = [sum(ws) / N for ws in zip(*want)]
        for view in (False, True):
            with self.subTest(gradient_as_bucket_view=view):
                def body(r, g):
                    net = TiedLM(True)
                    model = bt.DistributedDataParallel(net, group=g, static_graph=True,
                                                       gradient_as_bucket_view=view,
                                                       bucket_cap_mb=1e-4,
                                                       first_bucket_cap_mb=1e-5)
                    with model.no_sync():
                        _loss(model, r, 50).backward()
                    _loss(model, r, 0).backward()
                    out = [p.grad.clone() for p in net.parameters()]
                    model.close()
                    return out
                for got in _run_ranks(body):
                    self.assert_equal(got, want, "gradients")

    def test_hook_firing_twice_without_static_graph_is_named(self):
        for late in (False, True):  # torch's _set_static_graph() after construction
            def body(r, g):
                net = TiedLM(True)
                model = bt.DistributedDataParallel(net, group=g)
                if late:
                    model._set_static_graph()
                try:
                    with self.assertRaisesRegex(
                            RuntimeError, r"'mix\.(weight|bias)'.*fired twice.*" +
                            (r"_set_static_graph\(\) after construction" if late
                             else r"static_graph=True")):
                        _loss(model, r, 0).backward()
                finally:
                    model.close()
            with self.subTest(set_static_graph=late):
                _run_ranks(body)

    def test_zero2_tied_matches_serial_adamw(self):
        want = _serial_adamw(False)

        def body(r, g):
            net = TiedLM(False)
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter", bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            for step in range(STEPS):
                _loss(model, r, step).backward()
                opt.step()
                opt.zero_grad()
            out = [p.detach().clone() for p in net.parameters()]
            opt.close()
            model.close()
            return out

        for got in _run_ranks(body):
            for i, (a, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                           msg=lambda m: "param %d: %s" % (i, m))


class FourRanksTest(unittest.TestCase):
    def test_zero2_and_hybrid_at_four_ranks_match_serial_adamw(self):
        """ShardedAdamW over reduce_scatter and hybrid 2 x 2 with the tied embedding against
        serial torch AdamW on the mean of the 4 ranks' losses. (A parameter used inside and
        outside a reentrant checkpoint is refused under ZeRO-2: its recompute would read a
        stepped value; checkpointing_test's Peek.)"""
        n = 4
        want = _serial_adamw(False, n)
        for hybrid in (False, True):
            def body(r, g, hybrid=hybrid):
                net = TiedLM(False)
                placement, mesh = dict(group=g, mode="reduce_scatter"), ()
                if hybrid:
                    mesh = g.mesh(2, 2)
                    placement = dict(group=mesh[0], replica_group=mesh[1], mode="hybrid")
                model = bt.DistributedDataParallel(net, **placement, bucket_cap_mb=1e-4,
                                                   first_bucket_cap_mb=1e-5)
                opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
                for step in range(STEPS):
                    _loss(model, r, step).backward()
                    opt.step()
                    opt.zero_grad()
                out = [p.detach().clone() for p in net.parameters()]
                opt.close()
                model.close()
                for grp in mesh:
                    grp.close()
                return out

            for r, got in enumerate(run_ranks(n, body)):
                for i, (a, w) in enumerate(zip(got, want)):
                    torch.testing.assert_close(
                        a, w, rtol=0, atol=1e-6, msg=lambda m, i=i, r=r: (
                            "hybrid %s rank %d param %d: %s" % (hybrid, r, i, m)))

    def test_tied_and_twice_fired_at_four_ranks(self):
        """DDP static_graph at 4 ranks against a serial reference in the local backend's
        reduction order: each rank's gradient, summed in rank order, averaged."""
        n = 4
        ref = TiedLM(True)
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        want = []
        for step in range(STEPS):
            per_rank = []
            for r in range(n):
                opt.zero_grad()
                _loss(ref, r, step).backward()
                per_rank.append([p.grad.clone() for p in ref.parameters()])
            want.append([sum(gs) / n for gs in zip(*per_rank)])
            for p, g in zip(ref.parameters(), want[-1]):
                p.grad = g.clone()  # (zero_grad zeroes in place)
            opt.step()

        def body(r, g):
            net = TiedLM(True)
            model = bt.DistributedDataParallel(net, g, static_graph=True, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            seen = []
            for step in range(STEPS):
                _loss(model, r, step).backward()
                seen.append([p.grad.clone() for p in net.parameters()])
                opt.step()
                opt.zero_grad()
            model.close()
            return seen

        for r, seen in enumerate(run_ranks(n, body)):
            for step, (got, w) in enumerate(zip(seen, want)):
                for i, (a, b) in enumerate(zip(got, w)):
                    self.assertTrue(torch.equal(a, b), "rank %d step %d param %d: %s" %
                                    (r, step, i, (a - b).abs().max()))


class TiedNet(torch.nn.Module):
    """GPT-2's shape for fully_shard: embedding, two blocks, LayerNorm, the head tied to the
    embedding."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(4)
            self.wte = torch.nn.Embedding(V, D)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(D, D), torch.nn.Linear(D, D)])
            self.ln = torch.nn.LayerNorm(D)
            self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        h = self.wte(idx)
        for b in self.blocks:
            h = torch.tanh(b(h)) + h
        return self.head(self.ln(h))


def _fsdp_reference(n=N):
    """torch on one process: each rank's gradient (its two uses of the tied weight summed by
    autograd, as on the rank), averaged over the ranks (the reduction's order: a sum of the
    ranks' mean losses would add the four contributions in another order), then SGD with
    momentum on the full model."""
    net = TiedNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for s in range(STEPS):
        grads = []
        for r in range(n):
            opt.zero_grad()
            _loss(net, r, s).backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for p, *gs in zip(net.parameters(), *grads):
            p.grad = sum(gs) / n
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


class FullyShardTiedTest(unittest.TestCase):
    def _train(self, units, sharded=False, n=N):
        def body(r, g):
            net = TiedNet()
            for name in units:
                for m in ([net.wte] if name == "wte" else [net.head] if name == "head"
                          else list(net.blocks)):
                    bt.fully_shard(m, group=g)
            bt.fully_shard(net, group=g)
            opt = (bt.ShardedSGD(net.parameters(), lr=0.1, momentum=0.9) if sharded
                   else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
            for s in range(STEPS):
                _loss(net, r, s).backward()
                opt.step()
                opt.zero_grad()
            with net.summon_full_params():
                full = [p.detach().clone() for p in net.parameters()]
            if sharded:
                opt.close()
            net.close()
            return full
        return run_ranks(n, body)

    def test_tied_parameter_in_one_unit_matches_serial_torch(self):
        want = _fsdp_reference()
        # wte's unit owns the tied weight; the root (head at the root) or the head's own unit
        # uses it too and gathers that unit for its forward and backward.
        for units in (("wte", "blocks"), ("wte", "blocks", "head"), ("blocks", "head", "wte")):
            with self.subTest(units=units):
                for full in self._train(units):
                    for i, (a, w) in enumerate(zip(full, want)):
                        self.assertTrue(torch.equal(a, w), "param %d: %s" % (i, (a - w).abs().max()))

    def test_tied_parameter_at_four_ranks(self):
        want = _fsdp_reference(4)
        for full in self._train(("wte", "blocks", "head"), n=4):
            for i, (a, w) in enumerate(zip(full, want)):
                self.assertTrue(torch.equal(a, w), "param %d: %s" % (i, (a - w).abs().max()))

    def test_tied_parameter_with_sharded_sgd(self):
        want = _fsdp_reference()
        for full in self._train(("wte", "blocks", "head"), sharded=True):
            for i, (a, w) in enumerate(zip(full, want)):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6,
                                           msg=lambda m: "param %d: %s" % (i, m))


def mpi_main():
    """Under mpirun -np 2: Braid DDP (static_graph, reentrant, tied) on the "mpi" world against
    a serial reference: each rank's gradient by plain torch, averaged."""
    model_net = TiedLM(True)
    model = bt.DistributedDataParallel(model_net, static_graph=True)
    r = model._groups[0].rank
    for step in range(STEPS):
        model_net.zero_grad()
        _loss(model, r, step).backward()
        got = [p.grad.clone() for p in model_net.parameters()]
        ref = TiedLM(True)
        ref.load_state_dict(model_net.state_dict())
        per_rank = []
        for k in range(N):
            ref.zero_grad()
            _loss(ref, k, step).backward()
            per_rank.append([p.grad.clone() for p in ref.parameters()])
        for i, (g, *ws) in enumerate(zip(got, *per_rank)):
            want = sum(ws) / N
            if not torch.equal(g, want):
                raise AssertionError("rank %d step %d parameter %d: %s vs %s" %
                                     (r, step, i, g, want))
        with torch.no_grad():
            for p in model_net.parameters():
                p.sub_(0.1 * p.grad)
    model.close()
    print("tied_weights mpi rank %d: OK" % r)


if __name__ == "__main__":
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        mpi_main()
        sys.exit(0)
    unittest.main()
