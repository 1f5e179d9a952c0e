"""DistributedDataParallel's torch-DDP parity options on the `local` backend (ranks are threads):
rebuild_bucket_order (torch DDP's one-time rebuild in the first synced backward's readiness
order, via braid_reducer_rebuild_buckets), autotune (bucket caps tuned over the first steps,
braid_reducer_autotune: results unchanged, views rebound, settled) and main_grad (Megatron's
f32 gradient accumulation for bf16 models), against serial torch references."""

import types
import unittest
import warnings

import torch

import braid
from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2


class Backwards(torch.nn.Module):
    """Registers a, b, c but runs c, b, a: the backward produces a's gradients first, which
    the initial plan (reverse registration) puts in the last buckets."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(3)
            self.a, self.b, self.c = (torch.nn.Linear(4, 4), torch.nn.Linear(4, 4),
                                      torch.nn.Linear(4, 4))

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.c(x)))))


def _batch(r, micro):
    g = torch.Generator().manual_seed(100 * r + micro)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)


def _loss(model, r, micro):
    x, y = _batch(r, micro)
    return torch.nn.functional.mse_loss(model(x), y)


def _ddp(g, **kwargs):
    return bt.DistributedDataParallel(Backwards(), g, bucket_cap_mb=1e-5,
                                      first_bucket_cap_mb=1e-5, **kwargs)


# The layer of each registered parameter (a.weight, a.bias, b.weight, ...).
_LAYER = [0, 0, 1, 1, 2, 2]


def _train(r, g, rebuild, steps=3):
    """SGD steps; step 1 accumulates micro-batch 10 in a no_sync window first. Returns the
    bucket of each parameter before and after, the parameters, and whether p.grad is the
    reducer's view after every step."""
    model = _ddp(g, rebuild_bucket_order=rebuild)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [model.reducer.param_bucket(i) for i in range(6)]
    bound = []
    for s in range(steps):
        if s == 1:
            with model.no_sync():
                _loss(model, r, 10).backward()
        _loss(model, r, s).backward()
        bound.append(all(p.grad.data_ptr() == model.reducer.grad(i)[0]
                         for i, p in enumerate(model.parameters())))
        opt.step()
        model.zero_grad()
    after = [model.reducer.param_bucket(i) for i in range(6)]
    params = [p.detach().clone() for p in model.parameters()]
    model.close()
    return before, after, params, bound


def _serial(steps=3):
    net = Backwards()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for s in range(steps):
        micros = [10, s] if s == 1 else [s]
        loss = sum(_loss(net, r, m) for r in range(N) for m in micros) / N
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


class RebuildTest(unittest.TestCase):
    def test_buckets_follow_the_first_backward_and_results_do_not_change(self):
        rebuilt = run_ranks(N, lambda r, g: _train(r, g, rebuild=True))
        plain = run_ranks(N, lambda r, g: _train(r, g, rebuild=False))
        want = _serial()
        for r in range(N):
            before, after, params, bound = rebuilt[r]
            self.assertEqual(before, [5, 4, 3, 2, 1, 0])
            # a's gradients come first in the backward, then b's, then c's.
            layers = [_LAYER[i] for i in sorted(range(6), key=lambda i: after[i])]
            self.assertEqual(layers, [0, 0, 1, 1, 2, 2], after)
            self.assertEqual(plain[r][1], before)  # without the option: never rebuilt
            self.assertEqual(bound, [True] * 3)    # p.grad follows the new buckets
            for i, (got, same, w) in enumerate(zip(params, plain[r][2], want)):
                self.assertTrue(torch.equal(got, same), "parameter %d" % i)
                torch.testing.assert_close(got, w, rtol=0, atol=1e-6, msg="parameter %d" % i)

    def test_default_rebuild_as_torch_and_kept_gradients_stay_readable(self):
        """rebuild_bucket_order=None (the default): torch's policy, one rebuild at the second
        forward (not with find_unused_parameters); a p.grad kept from before it keeps its
        values (the old buckets are freed: the kept tensor got its own copy first)."""
        def body(r, g, **kwargs):
            model = _ddp(g, **kwargs)
            before = [model.reducer.param_bucket(i) for i in range(6)]
            _loss(model, r, 0).backward()
            kept = [p.grad for p in model.parameters()]
            values = [k.clone() for k in kept]
            _loss(model, r, 1).backward()  # its forward rebuilds
            after = [model.reducer.param_bucket(i) for i in range(6)]
            readable = all(torch.equal(k, v) for k, v in zip(kept, values))
            rebuilt = model._get_ddp_logging_data()["has_rebuilt_buckets"]
            model.close()
            return before != after, rebuilt, readable

        self.assertEqual(run_ranks(N, body), [(True, 1, True)] * N)
        # (no rebuild: the kept p.grad is still p.grad, and the second backward accumulated)
        unused = run_ranks(N, lambda r, g: body(r, g, find_unused_parameters=True))
        self.assertEqual(unused, [(False, 0, False)] * N)

    def test_sharded_optimizer_built_first_follows_the_rebuild(self):
        """ShardedAdamW built before the first backward: the rebuild at the next forward
        carries its state (moments, step counts) over to the new buckets (braid.h 0.9); the
        parameters are a never-rebuilt run's, bit for bit."""
        def body(r, g, rebuild):
            model = _ddp(g, mode="reduce_scatter", rebuild_bucket_order=rebuild)
            opt = bt.ShardedAdamW(model, lr=0.01)
            for s in range(4):
                _loss(model, r, s).backward()
                opt.step()
            opt.synchronize()
            buckets = [model.reducer.param_bucket(i) for i in range(6)]
            params = [p.detach().clone() for p in model.parameters()]
            views = all(p.data_ptr() == opt.optimizer.param(i)[0]
                        for i, p in enumerate(model.parameters()))
            opt.close()
            model.close()
            return buckets, params, views

        rebuilt = run_ranks(N, lambda r, g: body(r, g, True))
        plain = run_ranks(N, lambda r, g: body(r, g, False))
        for (buckets, params, views), (ref_buckets, ref, _) in zip(rebuilt, plain):
            self.assertTrue(views)  # p.data follows the new gatherer
            self.assertNotEqual(buckets, ref_buckets)
            layers = [_LAYER[i] for i in sorted(range(6), key=lambda i: buckets[i])]
            self.assertEqual(layers, [0, 0, 1, 1, 2, 2], buckets)
            for i, (got, want) in enumerate(zip(params, ref)):
                self.assertTrue(torch.equal(got, want), "parameter %d" % i)

    def test_sharded_optimizer_built_after_rebuilds_first(self):
        def body(r, g):
            model = _ddp(g, mode="reduce_scatter", rebuild_bucket_order=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unreduced gradients without an optimizer
                _loss(model, r, 0).backward()
            model.zero_grad()
            opt = bt.ShardedSGD(model, lr=0.1)  # rebuilds, then lays the shards out
            buckets = [model.reducer.param_bucket(i) for i in range(6)]
            for s in range(2):
                _loss(model, r, s).backward()
                opt.step()
            opt.synchronize()
            params = [p.detach().clone() for p in model.parameters()]
            opt.close()
            model.close()
            return buckets, params

        net = Backwards()
        ref = torch.optim.SGD(net.parameters(), lr=0.1)
        for s in range(2):
            (sum(_loss(net, r, s) for r in range(N)) / N).backward()
            ref.step()
            ref.zero_grad()
        for buckets, params in run_ranks(N, body):
            layers = [_LAYER[i] for i in sorted(range(6), key=lambda i: buckets[i])]
            self.assertEqual(layers, [0, 0, 1, 1, 2, 2], buckets)
            for i, (got, w) in enumerate(zip(params, net.parameters())):
                torch.testing.assert_close(got, w.detach(), rtol=0, atol=1e-6,
                                           msg="parameter %d" % i)


class AutotuneTest(unittest.TestCase):
    STEPS = 100

    def test_tunes_settles_and_changes_no_result(self):
        def body(r, g, tune):
            # (the tuner's re-plans alone: without torch's one-time rebuild, the default)
            model = bt.DistributedDataParallel(Backwards(), g, autotune=tune,
                                               bucket_cap_mb=2e-4, first_bucket_cap_mb=1e-4,
                                               rebuild_bucket_order=False)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            plans = set()
            for s in range(self.STEPS):
                _loss(model, r, s).backward()
                opt.step()
                model.zero_grad()
                plans.add(tuple(model.reducer.param_bucket(i) for i in range(6)))
                bound = all(p.grad.data_ptr() == model.reducer.grad(i)[0]
                            for i, p in enumerate(model.parameters()))
                self.assertTrue(bound, "step %d: p.grad not rebound after a re-plan" % s)
            params = [p.detach().clone() for p in model.parameters()]
            settled = not model._autotune
            model.close()
            return params, settled, len(plans)

        tuned = run_ranks(N, lambda r, g: body(r, g, True))
        plain = run_ranks(N, lambda r, g: body(r, g, False))
        for (params, settled, plans), (ref, _, ref_plans) in zip(tuned, plain):
            self.assertTrue(settled)
            self.assertEqual(ref_plans, 1)
            self.assertGreater(plans, 1)  # the trials re-planned the buckets
            for i, (got, want) in enumerate(zip(params, ref)):
                self.assertTrue(torch.equal(got, want), "parameter %d" % i)
        self.assertEqual(tuned[0][2], tuned[1][2])

    def test_sharded_optimizer_follows_the_trials(self):
        """ShardedAdamW under the tuner's re-plans (braid.h 0.9): its state is carried over at
        every one, the parameters are an untuned run's, bit for bit."""
        def body(r, g, tune):
            model = bt.DistributedDataParallel(Backwards(), g, mode="reduce_scatter",
                                               autotune=tune, bucket_cap_mb=2e-4,
                                               first_bucket_cap_mb=1e-4)
            opt = bt.ShardedAdamW(model, lr=0.01)
            plans = set()
            for s in range(self.STEPS):
                _loss(model, r, s).backward()
                opt.step()
                plans.add(tuple(model.reducer.param_bucket(i) for i in range(6)))
            opt.synchronize()
            params = [p.detach().clone() for p in model.parameters()]
            settled = not model._autotune
            opt.close()
            model.close()
            return params, settled, len(plans)

        tuned = run_ranks(N, lambda r, g: body(r, g, True))
        plain = run_ranks(N, lambda r, g: body(r, g, False))
        for (params, settled, plans), (ref, _, _) in zip(tuned, plain):
            self.assertTrue(settled)
            self.assertGreater(plans, 1)
            for i, (got, want) in enumerate(zip(params, ref)):
                self.assertTrue(torch.equal(got, want), "parameter %d" % i)


class SchedulingTest(unittest.TestCase):
    """credit_mb / priorities (braid.h 0.9): buckets reduced in partitions, the optimizer's
    gathers first; the parameters are the unscheduled run's, bit for bit."""

    def _run(self, sharded, **sched):
        def body(r, g):
            model = bt.DistributedDataParallel(
                Backwards(), g, mode="reduce_scatter" if sharded else "allreduce",
                bucket_cap_mb=2e-4, first_bucket_cap_mb=1e-4, **sched)
            opt = (bt.ShardedAdamW(model, lr=0.01) if sharded else
                   torch.optim.AdamW(model.parameters(), lr=0.01))
            for s in range(4):
                if s == 1:
                    with model.no_sync():
                        _loss(model, r, 10).backward()
                _loss(model, r, s).backward()
                opt.step()
                if not sharded:
                    model.zero_grad()
            if sharded:
                opt.synchronize()
            params = [p.detach().clone() for p in model.parameters()]
            staged = model.reducer.memory_stats()["by_use"]["staging"][1]  # peak
            if sharded:
                opt.close()
            model.close()
            return params, staged

        return run_ranks(N, body)

    def test_partitions_and_priorities_change_no_result(self):
        credit = 16 / 2**20  # 16 bytes: every bucket of 2e-4 MiB splits into partitions
        for sharded in (False, True):
            plain = self._run(sharded)
            scheduled = self._run(sharded, credit_mb=credit, priorities=True)
            for r in range(N):
                for i, (got, want) in enumerate(zip(scheduled[r][0], plain[r][0])):
                    self.assertTrue(torch.equal(got, want),
                                    "sharded=%s rank %d parameter %d" % (sharded, r, i))
                if sharded:  # reduce-scatter partitions are packed through staging blocks
                    self.assertGreater(scheduled[r][1], plain[r][1])

    def test_bad_credit_is_refused(self):
        def body(r, g):
            with self.assertRaisesRegex(ValueError, "credit_mb -1"):
                bt.DistributedDataParallel(Backwards(), g, credit_mb=-1)

        run_ranks(1, body)


class MainGradTest(unittest.TestCase):
    MICROS = 4

    def _bf16(self):
        m = Backwards()
        m.a.float()  # one f32 layer: its p.grad stays the bucket view, main_grad the same
        m.b.to(torch.bfloat16)
        m.c.to(torch.bfloat16)
        return m

    def _loss16(self, model, r, micro):
        x, y = _batch(r, micro)
        h = torch.tanh(model.c(x.to(torch.bfloat16)))
        h = torch.tanh(model.b(h)).float()
        return torch.nn.functional.mse_loss(model.a(h), y)

    def test_half_gradients_accumulate_and_reduce_in_f32(self):
        def body(r, g):
            net = self._bf16()
            net.forward = lambda micro: self._loss16(net, r, micro)
            model = bt.DistributedDataParallel(net, g, main_grad=True, bucket_cap_mb=1e-5,
                                               first_bucket_cap_mb=1e-5)
            for micro in range(self.MICROS):
                if micro < self.MICROS - 1:
                    with model.no_sync():
                        model(micro).backward()
                else:
                    model(micro).backward()
            out = [(p.grad is None, p.main_grad.dtype, p.main_grad.clone())
                   for p in model.parameters()]
            same = [p.grad is p.main_grad or p.grad.data_ptr() == p.main_grad.data_ptr()
                    for p in model.parameters() if p.dtype == torch.float32]
            model.close()
            return out, same

        # Serial: each rank's per-micro-batch gradients in the model's dtypes; the reference
        # sums them in f32 (in micro-batch order), then averages the ranks in f32.
        per_rank_f32, per_rank_bf16 = [], []
        for r in range(N):
            net = self._bf16()
            grads = []
            for micro in range(self.MICROS):
                net.zero_grad()
                self._loss16(net, r, micro).backward()
                grads.append([p.grad.clone() for p in net.parameters()])
            f32 = [torch.zeros(p.shape) for p in net.parameters()]
            b16 = [torch.zeros_like(p) for p in net.parameters()]
            for gs in grads:
                for acc, acc16, gr in zip(f32, b16, gs):
                    acc.add_(gr)
                    acc16.add_(gr)
            per_rank_f32.append(f32)
            per_rank_bf16.append(b16)
        want = [(a + b) / N for a, b in zip(*per_rank_f32)]
        lossy = [((a + b) / N).float() for a, b in zip(*per_rank_bf16)]
        results = run_ranks(N, body)
        for out, same in results:
            self.assertEqual(same, [True, True])  # a.weight, a.bias
            for i, ((grad_none, dtype, got), w) in enumerate(zip(out, want)):
                self.assertEqual(dtype, torch.float32, "parameter %d" % i)
                self.assertEqual(grad_none, i >= 2, "parameter %d: p.grad" % i)
                self.assertTrue(torch.equal(got, w), "parameter %d: %s vs %s" % (i, got, w))
        # The option matters: bf16 accumulation of the same gradients loses bits.
        self.assertTrue(any(not torch.equal(w, l) for w, l in zip(want[2:], lossy[2:])))

    def test_sharded_optimizer_is_refused(self):
        def body(r, g):
            model = bt.DistributedDataParallel(self._bf16(), g, mode="reduce_scatter",
                                               main_grad=True)
            with self.assertRaisesRegex(ValueError, "main_grad=True"):
                bt.ShardedAdamW(model)
            model.close()

        run_ranks(N, body)


class DevicePlacementTest(unittest.TestCase):
    """Where the wrappers take parameters from (CUDA itself runs on a GPU machine only:
    tests/gpu/torch_cuda_check.py). Debian's torch is CPU-only, so "meta" tensors stand in for
    parameters that are not in host memory."""

    def test_off_host_parameters_are_refused_naming_one(self):
        world = braid.World("local", local_ranks=1, read_env=False)
        try:
            g = world.group(0)
            meta = torch.nn.Linear(4, 4, device="meta")
            with self.assertRaisesRegex(ValueError, r"parameter 'weight' is on meta"):
                bt.DistributedDataParallel(meta, g)
            mixed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, device="meta"))
            with self.assertRaisesRegex(ValueError, r"'1.weight' is on meta"):
                bt.DistributedDataParallel(mixed, g)
            with self.assertRaisesRegex(ValueError, r"FullyShardedDataParallel: parameter "
                                                    r"'weight' is on meta; Braid takes CPU or "
                                                    r"CUDA tensors"):
                bt.FullyShardedDataParallel(meta, g)
            with self.assertRaisesRegex(ValueError, r"send: a meta tensor; this object takes "
                                                    r"CPU memory"):
                g.allreduce(torch.empty(4, device="meta"))
        finally:
            world.close()

    def test_device_of_names_parameters_on_two_devices(self):
        from braid._views import _device_of
        cpu = torch.zeros(1)
        self.assertIsNone(_device_of([("a", cpu), ("b", cpu)], "X"))
        self.assertIsNone(_device_of([], "X"))
        with self.assertRaisesRegex(ValueError, r"X: parameter 'b' is on meta"):
            _device_of([("a", cpu), ("b", torch.empty(1, device="meta"))], "X")
        # Objects with a CUDA .device stand in for CUDA tensors (only .device is read).
        gpu0, gpu1 = (types.SimpleNamespace(device=torch.device("cuda", i)) for i in (0, 1))
        self.assertEqual(_device_of([("a", gpu1), ("b", gpu1)], "X"), 1)
        with self.assertRaisesRegex(ValueError, r"X: parameters on several devices \('a' on "
                                                r"cpu, 'b' on cuda:0\)"):
            _device_of([("a", cpu), ("b", gpu0), ("c", cpu)], "X")
        with self.assertRaisesRegex(ValueError, r"several devices \('a' on cuda:0, 'b' on cuda:1"):
            _device_of([("a", gpu0), ("b", gpu1)], "X")


if __name__ == "__main__":
    unittest.main()
