"""braid.pytorch.FullyShardedDataParallel with ShardedAdamW / ShardedSGD against torch AdamW / SGD
on Braid's all-reduce, on the `local` backend (ranks are threads of this process)."""

import os
import tempfile
import unittest

import torch

import braid
from braid import pytorch as bt
import wrapper_models as wm
from rank_threads import run_ranks


class FullyShardedTest(unittest.TestCase):
    """FullyShardedDataParallel + ShardedAdamW/SGD against torch AdamW/SGD on Braid's all-reduce
    (the reference every sharded test here uses), on 2 rank threads (hybrid 2 x 2 on 4)."""

    def _reference(self, kind, g, r, steps, accumulate, sgd=False):
        ref = bt.DistributedDataParallel(wm.mlp_or_stack(kind), g)
        opt = (torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9) if sgd else
               torch.optim.AdamW(ref.parameters(), lr=0.01))
        wm.fsdp_train(kind, ref, opt, r, steps, accumulate)
        want = [p.detach().clone() for p in ref.parameters()]
        ref.close()
        return want

    def _zero2(self, kind, g, r, steps, accumulate, replica=None, sync_mode="no_sync"):
        """The same training with Braid's ZeRO-2 / HSDP (DistributedDataParallel in
        reduce_scatter / hybrid mode + ShardedAdamW): the same optimizer arithmetic, so fully
        sharded must match it bit for bit. (Against torch AdamW, elements whose gradient is
        pure rounding noise, e.g. attention's key bias, amplify ulp differences of AdamW
        itself into 1e-3 gaps: see train_compare.py.)"""
        ref = bt.DistributedDataParallel(
            wm.mlp_or_stack(kind), g, mode="hybrid" if replica else "reduce_scatter",
            replica_group=replica, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
        opt = bt.ShardedAdamW(ref, lr=0.01)
        wm.fsdp_train(kind, ref, opt, r, steps, accumulate, sync_mode)
        opt.synchronize()
        want = [p.detach().clone() for p in ref.module.parameters()]
        opt.close()
        ref.close()
        return want

    def _run(self, kind, g, r, steps, accumulate, sgd=False, replica=None, sync_mode="no_sync",
             **options):
        net = wm.mlp_or_stack(kind)
        model = bt.FullyShardedDataParallel(
            net, g, units=wm.units_of(kind, net), mode="hybrid" if replica else "reduce_scatter",
            replica_group=replica, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5, **options)
        opt = (bt.ShardedSGD(model, lr=0.1, momentum=0.9) if sgd else
               bt.ShardedAdamW(model, lr=0.01))
        wm.fsdp_train(kind, model, opt, r, steps, accumulate, sync_mode)
        opt.step()  # a second step() without a backward changes nothing
        memory = model.reducer.memory_stats()
        with model.summon_full_params():
            got = [p.detach().clone() for p in net.parameters()]
        opt.close()
        model.close()
        return got, memory

    def _compare(self, results, atol=1e-6):
        for want, got in results:
            for w, a in zip(want, got):
                torch.testing.assert_close(a, w, rtol=0, atol=atol)

    def _equal(self, results):
        for want, got in results:
            for i, (w, a) in enumerate(zip(want, got)):
                self.assertTrue(torch.equal(a, w), "parameter %d differs by up to %g" %
                                (i, float((a - w).abs().max())))

    def test_mlp_and_stack_match_torch_adamw(self):
        steps = 3

        def body(r, g):
            near, exact = [], []
            for kind in ("mlp", "stack"):
                for accumulate, reshard in ((1, True), (2, True), (1, False)):
                    got, _ = self._run(kind, g, r, steps, accumulate,
                                       reshard_after_forward=reshard)
                    exact.append((self._zero2(kind, g, r, steps, accumulate), got))
                    if kind == "mlp":  # no noise-dominated gradients: torch AdamW within 1e-6
                        near.append((self._reference(kind, g, r, steps, accumulate), got))
            return near, exact

        for near, exact in run_ranks(2, body):
            self._compare(near)
            self._equal(exact)

    def test_sgd_gradient_scale_with_accumulation(self):
        # SGD's update is proportional to the averaged gradient (AdamW's would hide a wrong
        # average or accumulation factor).
        def body(r, g):
            return [(self._reference("mlp", g, r, 3, 2, sgd=True),
                     self._run("mlp", g, r, 3, 2, sgd=True)[0])]

        for results in run_ranks(2, body):
            self._compare(results)

    def test_hybrid_2x2_reduce_scatter_only_matches_torch_adamw(self):
        def body(r, g):
            shard, replica = g.mesh(2, 2)
            want = self._zero2("stack", shard, r, 2, 2, replica=replica,
                               sync_mode="reduce_scatter_only")
            got, _ = self._run("stack", shard, r, 2, 2, replica=replica,
                               sync_mode="reduce_scatter_only")
            shard.close()
            replica.close()
            return [(want, got)]

        for results in run_ranks(4, body):
            self._equal(results)

    def test_released_parameters_summon_and_memory(self):
        n = 2

        def body(r, g):
            net = wm.stack(blocks=6)
            init = [p.detach().clone() for p in net.parameters()]
            model = bt.FullyShardedDataParallel(net, g, auto_wrap_policy={
                torch.nn.TransformerEncoderLayer}, bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
            self.assertEqual(model.unit_names, ["<root>"] + ["blocks.%d" % i for i in range(6)])
            with torch.no_grad():  # no optimizer yet: evaluation works (local pieces)
                model(torch.zeros(1, 6, dtype=torch.long))
            opt = bt.ShardedAdamW(model, lr=0.01)
            w = net.blocks[0].linear1.weight
            self.assertIsInstance(w, bt.FullyShardedParameter)
            self.assertEqual(w.shape, (32, 16))  # metadata stays readable
            for read in (lambda: w + 1, lambda: w.sum(), lambda: w.data, lambda: w.detach(),
                         lambda: print(w[0])):
                with self.assertRaisesRegex(RuntimeError, "'blocks.0.linear1.weight' is "
                                            "released"):
                    read()
            with self.assertRaisesRegex(RuntimeError, "'pos' is released"):  # the first one
                net.state_dict()
            self.assertIn("released", repr(w))
            with model.summon_full_params():
                summoned = [p.detach().clone() for p in net.parameters()]
                state = {k: v.clone() for k, v in net.state_dict().items()}
                with torch.no_grad():
                    eval_out = model(torch.arange(6).view(1, 6) % 20)
            for a, b in zip(summoned, init):
                self.assertTrue(torch.equal(a, b))
            self.assertTrue(torch.equal(state["head.weight"], init[-2]))
            with torch.no_grad():  # the same evaluation, units gathered one by one
                self.assertTrue(torch.equal(model(torch.arange(6).view(1, 6) % 20), eval_out))
            total = sum(p.numel() * 4 for p in net.parameters())
            model.reducer.reset_memory_peaks()
            for s in range(2):
                wm.loss_of("stack", model, r, s).backward()
                opt.step()
            opt.synchronize()
            m = model.reducer.memory_stats()["by_use"]
            with model.summon_full_params():
                # Full-size buffers: gathered parameters and gradient storage share one pool on
                # the host, so a buffer stays counted under the use that allocated it first.
                full = model.reducer.memory_stats()["by_use"]
                gathered_all = full["param_gather"][0] + full["grad_buckets"][0]
                trained = [p.detach().clone() for p in net.parameters()]
            opt.close()  # collective: gives the module its full parameters back
            back = [p.detach().clone() for p in net.parameters()]
            self.assertNotIsInstance(w, bt.FullyShardedParameter)
            model.close()
            return m, total, gathered_all, trained, back

        results = run_ranks(n, body)
        for m, total, gathered_all, trained, back in results:
            # Gathered parameters: at most the root, the unit running and the one prefetched
            # (plus the gatherer's pool of free buffers, which the figure includes), never the
            # whole model (7 units); after the step only the pool remains.
            self.assertGreater(m["param_gather"][1], 0, m)
            self.assertLess(m["param_gather"][1], total, m)
            self.assertLessEqual(m["param_gather"][0], m["param_gather"][1], m)
            # Pooled gradient storage holds each bucket at most once; how many are in flight
            # at once is timing (under load, all of them), so the bound is the whole model's
            # buckets (with their alignment padding), not a fraction of it.
            self.assertLess(m["grad_buckets"][1], 1.25 * total, m)
            self.assertLess(m["grad_shards"][0], total, m)  # this rank's gradient shards
            self.assertGreaterEqual(gathered_all, total)
            for a, b, c in zip(trained, back, results[0][3]):
                self.assertTrue(torch.equal(a, b))
                self.assertTrue(torch.equal(a, c))  # every rank holds the same values

    def test_unused_parameter_named_unless_allowed(self):
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

            def forward(self, x):
                return self.used(x)

        def body(r, g):
            strict = bt.FullyShardedDataParallel(TwoHeads(), g)
            opt = bt.ShardedSGD(strict, lr=1.0)
            with self.assertRaisesRegex(braid.BraidError, "unused.weight"):
                strict(torch.ones(1, 3)).sum().backward()
            opt.close()
            strict.close()
            lenient = bt.FullyShardedDataParallel(TwoHeads(), g, find_unused_parameters=True)
            opt = bt.ShardedSGD(lenient, lr=1.0)
            with lenient.summon_full_params():
                before = {n: p.detach().clone() for n, p in lenient.module.named_parameters()}
            lenient(torch.ones(1, 3)).sum().backward()
            opt.step()
            with lenient.summon_full_params():
                after = {n: p.detach().clone() for n, p in lenient.module.named_parameters()}
            opt.close()
            lenient.close()
            return before, after

        for before, after in run_ranks(2, body):
            self.assertTrue(torch.equal(before["unused.weight"], after["unused.weight"]))
            self.assertTrue(torch.equal(before["used.bias"] - 1, after["used.bias"]))

    def test_resume_is_bit_identical(self):
        path = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "fsdp")

        def body(r, g):
            got = []
            for resume in (False, True):
                net = wm.stack()
                model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks),
                                                    bucket_cap_mb=1e-3)
                opt = bt.ShardedAdamW(model, lr=0.01)
                if resume:
                    opt.load(path + str(r))
                else:
                    wm.fsdp_train("stack", model, opt, r, 2, 1)
                    opt.save(path + str(r))
                wm.fsdp_train("stack", model, opt, r, 2, 1)
                with model.summon_full_params():
                    got.append([p.detach().clone() for p in net.parameters()])
                opt.close()
                model.close()
            return got

        for straight, resumed in run_ranks(2, body):
            for a, b in zip(straight, resumed):
                self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
