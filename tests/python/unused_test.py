"""DistributedDataParallel(find_unused_parameters=True) on the `local` backend (ranks are
threads): parameters the forward's outputs do not reach are found from the autograd graph after
forward and marked ready at the start of the backward, so the buckets after them launch before
the backward ends (checked in the reducer's timeline: a bucket of an unused parameter launches
before the first layer's gradients are marked); gradients against serial torch, with and
without a no_sync window in which the branch was used; a use outside forward is named."""

import contextlib
import json
import os
import tempfile
import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2


class Branchy(torch.nn.Module):
    """a -> (b, only when use_b) -> c; registered a, b, c, so with one parameter per bucket
    the buckets are c.bias, c.weight, b.bias, b.weight, a.bias, a.weight (0 .. 5)."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(2)
            self.a, self.b, self.c = (torch.nn.Linear(4, 4), torch.nn.Linear(4, 4),
                                      torch.nn.Linear(4, 2))
        self.use_b = False

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if self.use_b:
            h = h + self.b(h)
        return self.c(h)


def _batch(r, micro):
    g = torch.Generator().manual_seed(10 * r + micro)
    return torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)


def _serial(micros):
    """Per rank: the summed gradients of plain torch over `micros` (use_b per micro-batch),
    averaged over the ranks; None where no rank's gradient has a value (torch DDP leaves
    .grad None for a parameter no rank used)."""
    out = []
    for r in range(N):
        m = Branchy()
        for micro, use_b in enumerate(micros):
            m.use_b = use_b
            x, y = _batch(r, micro)
            torch.nn.functional.mse_loss(m(x), y).backward()
        out.append([p.grad.clone() if p.grad is not None else None for p in m.parameters()])
    return [None if all(g is None for g in gs) else
            sum(torch.zeros_like(p) if g is None else g
                for g, p in zip(gs, Branchy().parameters())) / N
            for gs in zip(*out)]


def _grads(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _assert_grads(test, got, want, atol=1e-7):
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            test.assertIsNone(g, "parameter %d: no rank used it, so torch leaves .grad None" % i)
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=atol, msg="parameter %d" % i)


def _model(g, prefix=None):
    return bt.DistributedDataParallel(Branchy(), g, find_unused_parameters=True,
                                      bucket_cap_mb=1e-5, first_bucket_cap_mb=1e-5,
                                      timeline_prefix=prefix)


class UnusedTest(unittest.TestCase):
    def test_marked_at_backward_start_so_later_buckets_launch_early(self):
        prefix = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()), "unused")

        def body(r, g):
            model = _model(g, prefix)
            self.assertEqual([model.reducer.param_bucket(i) for i in range(6)],
                             [5, 4, 3, 2, 1, 0])
            x, y = _batch(r, 0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads = _grads(model)
            model.close()  # writes the timeline
            return grads

        want = _serial([False])
        self.assertIsNone(want[2])  # b: unused everywhere
        for r, grads in enumerate(run_ranks(N, body)):
            _assert_grads(self, grads, want)
            with open("%s.rank%d.json" % (prefix, r)) as f:
                events = sorted((e for e in json.load(f)["traceEvents"]
                                 if e.get("name") in ("mark", "launch")), key=lambda e: e["ts"])
            order = [(e["name"], e["args"]["v"]) for e in events]
            # b's buckets (2, 3) launch before a's gradients (parameters 0, 1) are marked.
            self.assertLess(order.index(("launch", 3)), order.index(("mark", 1)), order)
            self.assertLess(order.index(("launch", 3)), order.index(("mark", 0)), order)

    def test_no_sync_sum_of_a_branch_unused_at_the_synced_micro_batch_is_kept(self):
        def body(r, g):
            model = _model(g)
            model.module.use_b = True
            with model.no_sync():
                x, y = _batch(r, 0)
                torch.nn.functional.mse_loss(model(x), y).backward()
            model.module.use_b = False
            x, y = _batch(r, 1)
            torch.nn.functional.mse_loss(model(x), y).backward()
            first = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()  # the next window: b unused throughout, so zero
            for micro in (2, 3):
                with model.no_sync() if micro == 2 else contextlib.nullcontext():
                    x, y = _batch(r, micro)
                    torch.nn.functional.mse_loss(model(x), y).backward()
            second = [p.grad.clone() for p in model.parameters()]
            model.close()
            return first, second

        want_first = _serial([True, False])
        # micro-batches 2 and 3 of the serial reference: recompute with the same batches.
        per_rank = []
        for r in range(N):
            m = Branchy()
            for micro in (2, 3):
                x, y = _batch(r, micro)
                torch.nn.functional.mse_loss(m(x), y).backward()
            per_rank.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                             for p in m.parameters()])
        want_second = [sum(gs) / N for gs in zip(*per_rank)]
        for first, second in run_ranks(N, body):
            for got, w in zip(first, want_first):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)
            self.assertGreater(float(first[2].abs().max()), 0)  # b's no_sync sum survived
            for got, w in zip(second, want_second):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)

    def test_a_use_outside_forward_is_named(self):
        def body(r, g):
            model = _model(g)
            x, y = _batch(r, 0)
            loss = torch.nn.functional.mse_loss(model(x), y) + model.module.b.weight.sum()
            with self.assertRaisesRegex(RuntimeError, "'b.weight' received a gradient, but "
                                        "the forward's outputs do not reach it"):
                loss.backward()
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # the next step works
            grads = _grads(model)
            model.close()
            return grads

        want = _serial([False])
        # b's gradient tensors exist since the failed backward (Braid zeroed them, and
        # zero_grad() keeps a zero tensor): unused everywhere now, they stay zero.
        want[2], want[3] = (torch.zeros_like(p) for p in Branchy().b.parameters())
        for grads in run_ranks(N, body):
            _assert_grads(self, grads, want)

    def test_with_the_sharded_optimizer(self):
        steps = 3

        def body(r, g):
            model = bt.DistributedDataParallel(Branchy(), g, mode="reduce_scatter",
                                               find_unused_parameters=True,
                                               bucket_cap_mb=1e-5, first_bucket_cap_mb=1e-5)
            # Without momentum and decay a zero gradient is exactly torch's skip (others are
            # refused: sharded_idioms_test).
            opt = bt.ShardedSGD(model, lr=0.1)
            for s in range(steps):
                x, y = _batch(r, s)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            opt.synchronize()
            got = [p.detach().clone() for p in model.parameters()]
            opt.close()
            model.close()
            return got

        net = Branchy()
        init = [p.detach().clone() for p in net.parameters()]
        ref = torch.optim.SGD(net.parameters(), lr=0.1)
        for s in range(steps):
            loss = sum(torch.nn.functional.mse_loss(net(x), y)
                       for x, y in (_batch(r, s) for r in range(N))) / N
            loss.backward()
            ref.step()
            ref.zero_grad()
        want = [p.detach() for p in net.parameters()]
        for got in run_ranks(N, body):
            for i, (a, w) in enumerate(zip(got, want)):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6, msg="parameter %d" % i)
            self.assertTrue(torch.equal(got[2], init[2]))  # b never moved


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
