"""braid.pytorch.DistributedDataParallel and the sharded optimizers (ShardedAdamW / ShardedSGD)
on the `local` backend (ranks are threads of this process), against serial references and torch's
optimizers on Braid's all-reduce."""

import functools
import os
import tempfile
import unittest

import torch

from braid import pytorch as bt
import wrapper_models as wm
from rank_threads import run_ranks


class PyTorchTest(unittest.TestCase):
    def test_grads_are_bucket_views_averaged_like_ddp(self):
        n = 2
        per_rank = wm.serial_grads(range(n))
        want = [(a + b) / n for a, b in zip(*per_rank)]

        def body(r, g):
            model = bt.DistributedDataParallel(wm.mlp(), g, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            self.assertGreater(model.reducer.num_buckets, 1)
            views = [p.grad for p in model.parameters()]  # None until a backward, as torch
            addresses = [model.reducer.grad(i)[0] for i in range(len(views))]
            x, y = wm.data(r)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            still = [p.grad.data_ptr() for p in model.parameters()]
            model.zero_grad()
            zeroed = all(p.grad.abs().sum() == 0 for p in model.parameters())
            model.close()
            return views, addresses, still, grads, zeroed

        for views, addresses, still, grads, zeroed in run_ranks(n, body):
            self.assertEqual(views, [None] * len(addresses))
            self.assertEqual(still, addresses)
            self.assertTrue(zeroed)
            for got, w in zip(grads, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)

    def test_bf16_parameters_reduced_in_f32(self):
        n = 3

        def model():
            return wm.mlp().to(torch.bfloat16)

        per_rank = []
        for r in range(n):
            m = model()
            x, y = wm.data(r)
            ((m(x.bfloat16()) - y.bfloat16()) ** 2).mean().backward()  # no bf16 mse_loss on CPU
            per_rank.append([p.grad.float() for p in m.parameters()])
        # Summed in f32 in rank order, divided, rounded to bf16 once.
        want = [((a + b + c) / n).bfloat16() for a, b, c in zip(*per_rank)]

        def body(r, g):
            ddp = bt.DistributedDataParallel(model(), g, reduce_dtype="float32")
            x, y = wm.data(r)
            ((ddp(x.bfloat16()) - y.bfloat16()) ** 2).mean().backward()
            grads = [p.grad.clone() for p in ddp.parameters()]
            ddp.close()
            return grads

        for grads in run_ranks(n, body):
            for got, w in zip(grads, want):
                self.assertEqual(got.dtype, torch.bfloat16)
                self.assertTrue(torch.equal(got, w), (got - w).abs().max())

    def test_no_sync_accumulates_locally_then_syncs(self):
        n = 2
        first = wm.serial_grads(range(n), micros=1)
        both = wm.serial_grads(range(n), micros=2)
        want = [(a + b) / n for a, b in zip(*both)]

        def body(r, g):
            model = bt.DistributedDataParallel(wm.mlp(), g)
            with model.no_sync():
                x, y = wm.data(r, 0)
                torch.nn.functional.mse_loss(model(x), y).backward()
            local = [p.grad.clone() for p in model.parameters()]
            x, y = wm.data(r, 1)
            torch.nn.functional.mse_loss(model(x), y).backward()
            synced = [p.grad.clone() for p in model.parameters()]
            model.close()
            return local, synced

        for r, (local, synced) in enumerate(run_ranks(n, body)):
            for got, w in zip(local, first[r]):
                self.assertTrue(torch.equal(got, w))
            for got, w in zip(synced, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)

    def test_unused_parameter_named_unless_allowed(self):
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

            def forward(self, x):
                return self.used(x)

        def body(r, g):
            strict = bt.DistributedDataParallel(TwoHeads(), g)
            strict(torch.ones(1, 3)).sum().backward()  # torch's moment: the next forward
            with self.assertRaisesRegex(RuntimeError, "unused.weight"):
                strict(torch.ones(1, 3))
            strict.close()
            lenient = bt.DistributedDataParallel(TwoHeads(), g, find_unused_parameters=True)
            lenient(torch.ones(1, 3)).sum().backward()
            grads = {n: None if p.grad is None else p.grad.clone()
                     for n, p in lenient.module.named_parameters()}
            lenient.close()
            return grads

        for grads in run_ranks(2, body):
            self.assertIsNone(grads["unused.weight"])  # no rank used it: None, as torch DDP
            self.assertTrue(torch.equal(grads["used.bias"], torch.ones(2)))

    def test_grad_set_to_none_or_replaced_is_rebound(self):
        want = wm.serial_grads([0])[0]

        def body(r, g):
            model = bt.DistributedDataParallel(wm.mlp(), g)
            x, y = wm.data(3)
            torch.nn.functional.mse_loss(model(x), y).backward()  # leaves values in the views
            params = list(model.parameters())
            for p in params:
                p.grad = None  # like zero_grad(set_to_none=True): must start from zero
            params[0].grad = torch.ones_like(params[0])  # a caller's tensor: copied in
            x, y = wm.data(0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            rebound = [p.grad.data_ptr() == model.reducer.grad(i)[0]
                       for i, p in enumerate(params)]
            grads = [p.grad.clone() for p in params]
            model.close()
            return rebound, grads

        [(rebound, grads)] = run_ranks(1, body)
        self.assertTrue(all(rebound))
        self.assertTrue(torch.equal(grads[0], want[0] + 1))
        for got, w in zip(grads[1:], want[1:]):
            self.assertTrue(torch.equal(got, w))

    def test_sharded_adamw_matches_torch_adamw_and_resumes(self):
        n, steps = 2, 4
        path = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "sharded")

        def train(model, opt, r, first, count):
            for s in range(first, first + count):
                x, y = wm.data(r, s)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            want = wm.torch_reference(g, lambda ps: torch.optim.AdamW(ps, lr=0.01),
                                    lambda m, o: train(m, o, r, 0, steps))
            got = []
            for resume in (False, True):
                model = bt.DistributedDataParallel(wm.mlp(), g, mode="reduce_scatter",
                                                   bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
                opt = bt.ShardedAdamW(model, lr=0.01)
                if resume:
                    opt.load(path + str(r))
                    train(model, opt, r, steps // 2, steps - steps // 2)
                else:
                    train(model, opt, r, 0, steps // 2)
                    opt.save(path + str(r))
                    train(model, opt, r, steps // 2, steps - steps // 2)
                opt.synchronize()
                self.assertEqual(opt.last_step().rounds, steps)
                got.append([p.detach().clone() for p in model.parameters()])
                opt.close()
                model.close()
            return want, got

        init = [p.detach() for p in wm.mlp().parameters()]
        for want, (straight, resumed) in run_ranks(n, body):
            self.assertTrue(any(not torch.equal(a, i) for a, i in zip(straight, init)))
            for w, a, b in zip(want, straight, resumed):
                self.assertTrue(torch.equal(a, b))
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6)


    def test_failed_backward_is_ended_and_the_next_step_works(self):
        want = wm.serial_grads([0])[0]

        class Failing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net, self.fail = wm.mlp(), True

            def forward(self, x):
                h = self.net[1](self.net[0](x))
                if self.fail:  # raises after the last layer's gradients were marked ready
                    h.register_hook(lambda g: (_ for _ in ()).throw(ValueError("boom")))
                return self.net[2](h)

        def body(r, g, mode):
            model = bt.DistributedDataParallel(Failing(), g, mode=mode)
            opt = bt.ShardedSGD(model, lr=1.0) if mode != "allreduce" else None
            x, y = wm.data(0)
            with self.assertRaisesRegex(ValueError, "boom"):
                torch.nn.functional.mse_loss(model(x), y).backward()
            model.module.fail = False
            with self.assertRaisesRegex(RuntimeError, "previous backward did not finish"):
                model(x)
            before = [p.detach().clone() for p in model.parameters()]
            torch.nn.functional.mse_loss(model(x), y).backward()
            if opt is None:
                grads = [p.grad.clone() for p in model.parameters()]
            else:  # lr 1 SGD without momentum: the step is exactly -grad
                opt.synchronize()
                grads = [b - p.detach() for b, p in zip(before, model.parameters())]
                opt.close()
            model.close()
            return grads

        for mode in ("allreduce", "reduce_scatter"):
            [grads] = run_ranks(1, functools.partial(body, mode=mode))
            for got, w in zip(grads, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-6 if mode != "allreduce" else 0)

    def test_sharded_sgd_matches_torch_sgd(self):
        # SGD's update is proportional to the gradient: a wrong average or accumulation
        # factor shows here (AdamW's normalized update would hide it).
        steps = 3

        def train(model, opt, r, accumulate):
            for s in range(steps):
                for micro in range(accumulate):
                    with model.no_sync() if micro + 1 < accumulate else wm.null_context():
                        x, y = wm.data(r, 2 * s + micro)
                        torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            out = []
            for accumulate in (1, 2):
                want = wm.torch_reference(g, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                        lambda m, o: train(m, o, r, accumulate))
                model = bt.DistributedDataParallel(wm.mlp(), g, mode="reduce_scatter",
                                                   bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
                opt = bt.ShardedSGD(model, lr=0.1, momentum=0.9)
                train(model, opt, r, accumulate)
                opt.synchronize()
                out.append((want, [p.detach().clone() for p in model.parameters()]))
                opt.close()
                model.close()
            return out

        for runs in run_ranks(2, body):
            for want, got in runs:
                for w, a in zip(want, got):
                    torch.testing.assert_close(a, w, rtol=0, atol=1e-6)

    def test_hybrid_reduce_scatter_only_accumulation_matches_torch_adamw(self):
        n, steps = 4, 3

        def train(model, opt, r, sync_mode):
            for s in range(steps):
                with model.no_sync(sync_mode):
                    x, y = wm.data(r, 2 * s)
                    torch.nn.functional.mse_loss(model(x), y).backward()
                x, y = wm.data(r, 2 * s + 1)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            want = wm.torch_reference(g, lambda ps: torch.optim.AdamW(ps, lr=0.01),
                                    lambda m, o: train(m, o, r, "no_sync"))
            shard, replica = g.mesh(2, 2)
            model = bt.DistributedDataParallel(wm.mlp(), shard, replica_group=replica,
                                               mode="hybrid", bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            opt = bt.ShardedAdamW(model, lr=0.01, overlap=False)
            train(model, opt, r, "reduce_scatter_only")
            opt.synchronize()
            got = [p.detach().clone() for p in model.parameters()]
            opt.close()
            model.close()
            shard.close()
            replica.close()
            return want, got

        for want, got in run_ranks(n, body):
            for w, a in zip(want, got):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6)



if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
