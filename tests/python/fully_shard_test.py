"""braid.pytorch.fully_shard (FSDP2's API over Braid's fully sharded engine) at 2 ranks as
threads of a `local` world, against torch in the same process: torch optimizers (AdamW, SGD
with momentum, Adagrad) stepping this rank's pieces of the parameters equal the same optimizer
on the full model fed the ranks' averaged gradient (what torch DDP computes), bit for bit, also
under gradient accumulation (set_requires_gradient_sync) and with model.clip_grad_norm_;
evaluation without any optimizer; ShardedAdamW as the fast path; the FSDP2 methods (unshard /
reshard, prefetch lists) and the policies (what is refused names its argument); memory_stats.
fully_shard_mpi.py runs the same comparison under mpirun against torch's own DDP (gloo)."""

import os
import tempfile
import unittest

import torch

from braid import core, pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2
STEPS = 4


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + x


class Net(torch.nn.Module):
    """Odd sizes: a unit's bucket holds weight and bias, so a parameter straddles the two
    ranks' shards and a bias lies wholly in one rank's (an empty piece on the other)."""

    def __init__(self, seed=3, d=7):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(seed)
            self.inp = torch.nn.Linear(5, d)
            self.blocks = torch.nn.ModuleList([Block(d), Block(d)])
            self.out = torch.nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _data(r, step, micro=0):
    g = torch.Generator().manual_seed(1000 * micro + 100 * r + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _shard(net, g, **kw):
    for b in net.blocks:
        bt.fully_shard(b, group=g)
    return bt.fully_shard(net, group=g, **kw)


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
}


def _reference(kind, micro=1, clip=None):
    """torch on one process: the loss averaged over the ranks (DDP's averaged gradient), summed
    over the micro-batches (accumulation), the same optimizer on the full model."""
    net = Net()
    opt = OPTIMIZERS[kind](net.parameters())
    norms = []
    for s in range(STEPS):
        for m in range(micro):
            loss = sum(torch.nn.functional.mse_loss(net(x), y)
                       for x, y in (_data(r, s, m) for r in range(N))) / N
            loss.backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), clip))
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()], norms


def _train(kind, micro=1, clip=None):
    def body(r, g):
        net = _shard(Net(), g)
        opt = OPTIMIZERS[kind](net.parameters())  # before the first forward (lazy init)
        norms = []
        for s in range(STEPS):
            for m in range(micro):
                net.set_requires_gradient_sync(m == micro - 1)
                x, y = _data(r, s, m)
                torch.nn.functional.mse_loss(net(x), y).backward()
            if clip is not None:
                norms.append(net.clip_grad_norm_(clip))
            opt.step()
            opt.zero_grad()
        pieces = [p.numel() for p in net.parameters()]
        with net.summon_full_params():
            full = [p.detach().clone() for p in net.parameters()]
        net.close()
        return full, pieces, norms
    return run_ranks(N, body)


class TorchOptimizerTest(unittest.TestCase):
    def _check(self, kind, micro=1):
        want, _ = _reference(kind, micro)
        results = _train(kind, micro)
        for full, _, _ in results:
            for a, b in zip(full, want):
                if micro == 1:
                    self.assertTrue(torch.equal(a, b), (kind, (a - b).abs().max()))
                else:  # Braid sums micro-batches before averaging ranks: another order
                    self.assertTrue(torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a - b).abs().max())
        return results

    def test_adamw_pieces_equal_full_model_step(self):
        results = self._check("adamw")
        # Some parameter is empty on one rank and every element is on exactly one rank.
        self.assertIn(0, results[0][1] + results[1][1])
        sizes = [p.numel() for p in Net().parameters()]
        self.assertEqual([a + b for a, b in zip(results[0][1], results[1][1])], sizes)

    def test_sgd_momentum_and_adagrad(self):
        self._check("sgd")
        self._check("adagrad")

    def test_accumulation_without_sync(self):
        self._check("adamw", micro=3)

    def test_clip_grad_norm_is_global(self):
        want, want_norms = _reference("sgd", clip=0.05)
        for full, _, norms in _train("sgd", clip=0.05):
            for a, b in zip(norms, want_norms):
                self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=0), (a, b))
            for a, b in zip(full, want):
                self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max())

    def test_torch_clip_and_state_dict_over_pieces_raise(self):
        def body(r, g):
            net = _shard(Net(), g)
            x, y = _data(r, 0)
            torch.nn.functional.mse_loss(net(x), y).backward()
            for norm_type in (2.0, float("inf")):
                with self.assertRaisesRegex(RuntimeError, r"model\.clip_grad_norm_"):
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, norm_type)
            with self.assertRaisesRegex(RuntimeError, "summon_full_params"):
                net.state_dict()
            with net.summon_full_params():
                sd = net.state_dict()
            self.assertEqual(sd["out.weight"].shape, (3, 7))
            net.close()
        run_ranks(N, body)


class HybridTest(unittest.TestCase):
    def test_hybrid_mesh_two_replicas_of_two_shards(self):
        """4 ranks as 2 replicas x 2 shards: the pieces step on the average of all 4 ranks'
        gradients (reduce-scatter in the replica, all-reduce across: another summation order
        than the serial reference, so to rounding); step 1 accumulates 2 micro-batches with
        set_requires_all_reduce(False) on the first (reduce-scatter only)."""
        net = Net()
        opt = OPTIMIZERS["adamw"](net.parameters())
        for s in range(STEPS):
            for m in range(2 if s == 1 else 1):
                loss = sum(torch.nn.functional.mse_loss(net(x), y)
                           for x, y in (_data(r, s, m) for r in range(4))) / 4
                loss.backward()
            opt.step()
            opt.zero_grad()
        want = [p.detach().clone() for p in net.parameters()]

        def body(r, g):
            shard, replica = g.mesh(2, 2)
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, mesh=(shard, replica))
            bt.fully_shard(net, mesh=(shard, replica))
            opt = OPTIMIZERS["adamw"](net.parameters())
            for s in range(STEPS):
                for m in range(2 if s == 1 else 1):
                    net.set_requires_all_reduce(not (s == 1 and m == 0))
                    x, y = _data(r, s, m)
                    torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
                opt.zero_grad()
            with net.summon_full_params():
                full = [p.detach().clone() for p in net.parameters()]
            flat = _shard(Net(), g)
            with self.assertRaisesRegex(ValueError, "hybrid"):
                flat.set_requires_all_reduce(False)
            flat.close()
            net.close()
            shard.close()
            replica.close()
            return full
        for full in run_ranks(4, body):
            for a, b in zip(full, want):
                self.assertTrue(torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a - b).abs().max())


class EvalAndFastPathTest(unittest.TestCase):
    def test_eval_without_optimizer(self):
        x = torch.randn(6, 5)
        with torch.no_grad():
            want = Net()(x)

        def body(r, g):
            net = _shard(Net(), g).eval()
            with torch.no_grad():
                out = [net(x), net(x)]
            out.append(net(x).detach())  # grad enabled, no backward: units are released
            with torch.no_grad():
                out.append(net(x))
            net.close()
            return out
        for outs in run_ranks(N, body):
            for o in outs:
                self.assertTrue(torch.equal(o, want))

    def test_sharded_adamw_fast_path(self):
        want, _ = _reference("adamw")

        def body(r, g):
            net = _shard(Net(), g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.1)
            for s in range(STEPS):
                x, y = _data(r, s)
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
                opt.zero_grad()
            opt.synchronize()
            with net.summon_full_params():
                full = [p.detach().clone() for p in net.parameters()]
            stats = net.memory_stats()
            opt.close()
            net.close()
            return full, stats
        for full, stats in run_ranks(N, body):
            for a, b in zip(full, want):
                self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max())
            self.assertGreater(stats["by_use"]["optimizer_state"][1], 0)
            self.assertGreater(stats["host"][1], 0)


    def test_pool_limit_keeps_results_and_refuses_what_cannot_hold_a_bucket(self):
        # pool_limit_mb reaches the C++ bound (tests/pool_limit_test.cc shows it bind and
        # wait); here: the same steps as torch with it set, and its refusals by name.
        want, _ = _reference("adamw")

        def body(r, g):
            net = _shard(Net(), g, pool_limit_mb=0.004)  # a few of this model's buckets
            opt = OPTIMIZERS["adamw"](net.parameters())
            for s in range(STEPS):
                x, y = _data(r, s)
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
                opt.zero_grad()
            with net.summon_full_params():
                full = [p.detach().clone() for p in net.parameters()]
            net.close()
            with self.assertRaisesRegex(ValueError, "pool_limit_mb"):
                _shard(Net(), g, pool_limit_mb=-1)(torch.randn(2, 5))
            with self.assertRaisesRegex(core.BraidError,
                                        r"pool_limit_bytes.*this call's pool_limit_mb=1e-06"):
                _shard(Net(), g, pool_limit_mb=1e-6)(torch.randn(2, 5))  # 1 byte
            return full
        for full in run_ranks(N, body):
            for a, b in zip(full, want):
                self.assertTrue(torch.equal(a, b), (a - b).abs().max())

    def test_timeline_counters_track_memory_stats(self):
        """model.timeline_counters(): the timeline file's "host bytes" samples, one per counted
        allocation and free: mid-run none exceeds the peak so far; after close their maximum
        is memory_stats()'s host peak, exactly, on each rank's own file."""
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "tl")

            def body(r, g):
                net = _shard(Net(), g, timeline_prefix=prefix)
                opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
                for s in range(2):
                    x, y = _data(r, s)
                    torch.nn.functional.mse_loss(net(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                opt.synchronize()
                stats = net.memory_stats()
                early = net.timeline_counters()
                opt.close()
                net.close()
                return stats, early, net.timeline_counters(), g.rank
            for stats, early, final, rank in run_ranks(N, body):
                self.assertTrue(os.path.exists("%s.rank%d.json" % (prefix, rank)))
                self.assertTrue(all(v <= stats["host"][1] for _, _, v in early))
                host = [(t, v) for t, n, v in final if n == "host bytes"]
                self.assertGreater(len(host), len(early) // 2)
                self.assertEqual([t for t, _ in host], sorted(t for t, _ in host))
                self.assertEqual(max(v for _, v in host), stats["host"][1])
                self.assertFalse([n for _, n, _ in final if n not in ("host bytes",
                                                                       "device bytes")])

        def no_prefix(r, g):
            net = _shard(Net(), g)
            try:
                with self.assertRaisesRegex(ValueError, "timeline_prefix"):
                    net.timeline_counters()
            finally:
                net.close()
        run_ranks(N, no_prefix)


class EngineTest(unittest.TestCase):
    def test_engine_form_with_torch_sgd_and_zero_grad(self):
        """FullyShardedDataParallel(net, units=...) (FSDP1's form, the same engine) with a
        torch optimizer; the wrapper's zero_grad() clears the pieces' gradients (a stale one
        would be added to the next step's)."""
        want, _ = _reference("sgd")

        def body(r, g):
            net = Net()
            model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks))
            opt = OPTIMIZERS["sgd"](model.parameters())
            for s in range(STEPS):
                x, y = _data(r, s)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                model.zero_grad()
            self.assertTrue(all(p.grad is None for p in net.parameters()))
            with model.summon_full_params():
                full = [p.detach().clone() for p in net.parameters()]
            model.close()
            self.assertEqual([p.shape for p in net.parameters()],
                             [p.shape for p in Net().parameters()])
            return full
        for full in run_ranks(N, body):
            for a, b in zip(full, want):
                self.assertTrue(torch.equal(a, b), (a - b).abs().max())


class ApiTest(unittest.TestCase):
    def test_unshard_reshard_and_prefetch_lists(self):
        def body(r, g):
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, group=g)
            net.blocks[0].set_modules_to_forward_prefetch([net.blocks[1]])
            net.blocks[1].set_modules_to_backward_prefetch([net.blocks[0]])
            bt.fully_shard(net, group=g)
            self.assertIsInstance(net, bt.FSDPModule)
            self.assertEqual(type(net).__name__, "FSDPNet")
            handle = net.unshard(async_op=True)
            handle.wait()
            shapes = [tuple(p.shape) for p in net.parameters()]
            net.reshard()
            pieces = [tuple(p.shape) for p in net.parameters()]
            with self.assertRaisesRegex(ValueError, "root module"):
                net.blocks[0].unshard()
            with self.assertRaisesRegex(ValueError, "first forward"):
                net.blocks[0].set_modules_to_forward_prefetch([net.blocks[1]])
            self.assertEqual(net._braid_fsdp.engine.fsdp_options["prefetch"], 1)
            net.close()
            return shapes, pieces
        for shapes, pieces in run_ranks(N, body):
            self.assertEqual(shapes, [tuple(p.shape) for p in Net().parameters()])
            # Pieces keep the parameters' dim() ((1, .., 1, count)): groups by p.dim() hold.
            self.assertEqual([len(s) for s in pieces], [len(s) for s in shapes])
            self.assertTrue(all(s[:-1] == (1,) * (len(s) - 1) for s in pieces))

    def test_prefetch_list_that_braid_cannot_express_is_refused(self):
        def body(r, g):
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, group=g)
            net.blocks[1].set_modules_to_forward_prefetch([net.blocks[0]])
            bt.fully_shard(net, group=g)
            with self.assertRaisesRegex(ValueError, "cannot prefetch a chosen set"):
                net(torch.randn(2, 5))
        run_ranks(N, body)

    def test_policies(self):
        def body(r, g):
            net = Net()
            with self.assertRaisesRegex(ValueError, "param_dtype"):
                bt.fully_shard(net, group=g, mp_policy=bt.MixedPrecisionPolicy(
                    param_dtype=torch.float64))  # (bf16 / f16: fsdp_mixed_precision_test)
            with self.assertRaisesRegex(ValueError, "reduce_dtype"):
                bt.fully_shard(net, group=g, mp_policy=bt.MixedPrecisionPolicy(
                    reduce_dtype=torch.bfloat16))
            with self.assertRaisesRegex(ValueError, "reshard_after_forward"):
                bt.fully_shard(net, group=g, reshard_after_forward=2)
            with self.assertRaisesRegex(TypeError, "unexpected keyword"):
                bt.fully_shard(net, group=g, sync_module_states=True)
            bt.fully_shard(net, group=g, offload_policy=bt.CPUOffloadPolicy(),
                           mp_policy=bt.MixedPrecisionPolicy(param_dtype=torch.float32,
                                                             output_dtype=torch.float64))
            out = net(torch.randn(2, 5))
            self.assertEqual(out.dtype, torch.float64)
            out.sum().backward()
            with self.assertRaisesRegex(ValueError, "passed to fully_shard already"):
                bt.fully_shard(net, group=g)
            net.close()
        run_ranks(N, body)

    def test_unit_after_root_is_refused(self):
        def body(r, g):
            net = Net()
            bt.fully_shard(net.blocks[0], group=g)
            list(net.blocks[0].parameters())  # finalizes blocks[0] as a root
            with self.assertRaisesRegex(ValueError, "finalized already"):
                bt.fully_shard(net, group=g)
            net.blocks[0].close()
        run_ranks(N, body)


if __name__ == "__main__":
    unittest.main()
