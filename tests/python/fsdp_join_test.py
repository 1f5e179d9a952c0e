"""FullyShardedDataParallel.join() and fully_shard's join() (uneven inputs of a fully sharded
model, braid/_fsdp_join.py) on the `local` backend (ranks are threads): rank r has 2 + 2 r
batches (join_test._steps), so ranks leave the loop at different steps and the joined ones
replay the others' steps with zero gradients.

Against a serial reference (one torch model and torch's AdamW, each global step's gradient the
sum of the ranks that have data over the initial world size or over the contributors, clipped
by torch's clip_grad_norm_ where asked): ShardedAdamW (overlap on and off, clipping) and torch's
AdamW over the local pieces at 2 and 4 ranks, both divide choices, two units with and without
reshard_after_forward, fully_shard's form, hybrid (2 x 2); tied_weights_test's tied embedding
and head (units borrowing a tied weight, ShardedSGD) at 3 ranks; a BatchNorm buffer ends as
the last joiner's on every rank; throw_on_early_termination raises on every rank. Refusals
named: find_unused_parameters, local pieces without optimizer=, a forward without grad inside
the join.
tests/python/fsdp_join_mpi.py runs the 2-rank comparison with one process per rank (mpirun)."""

import unittest

import torch

import braid
from braid import pytorch as bt
from rank_threads import run_ranks
import join_test
import tied_weights_test
from join_test import Net, _loss, _steps


def serial_adamw(n, divide, max_norm=None):
    """The reference (join_test._serial_adamw, with torch's clip_grad_norm_ when max_norm):
    final parameters."""
    model = Net(norm=False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for step in range(_steps(n - 1)):
        active = [r for r in range(n) if step < _steps(r)]
        total = [torch.zeros_like(p) for p in model.parameters()]
        for r in active:
            model.zero_grad()
            _loss(model, r, step).backward()
            for t, p in zip(total, model.parameters()):
                t.add_(p.grad)
        for t, p in zip(total, model.parameters()):
            p.grad = t / (n if divide else len(active))
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def serial_tied_sgd(n):
    """tied_weights_test's TiedNet on one process: rank r has 2 + r steps; each step the active
    ranks' gradients (autograd sums the tied weight's two uses) over n, SGD with momentum."""
    net = tied_weights_test.TiedNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(2 + n - 1):
        grads = []
        for r in range(n):
            if step < 2 + r:
                opt.zero_grad()
                tied_weights_test._loss(net, r, step).backward()
                grads.append([p.grad.clone() for p in net.parameters()])
        for p, *gs in zip(net.parameters(), *grads):
            p.grad = sum(gs) / n
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _wrap(r, g, n, how, norm=False, **kw):
    net = Net(norm=norm)
    if how == "fully_shard":
        for m in (net.a, net.b):
            bt.fully_shard(m, group=g, **kw)
        return bt.fully_shard(net, group=g, **kw)
    if how == "hybrid":
        shard, replica = g.mesh(2, n // 2)
        return bt.FullyShardedDataParallel(net, shard, units=[net.a, net.b], mode="hybrid",
                                           replica_group=replica, **kw)
    return bt.FullyShardedDataParallel(net, g, units=[net.a, net.b], **kw)


def _train(r, model, divide, optimizer="sharded", overlap=True, max_norm=None):
    """rank r's loop inside model.join(); the final full parameters."""
    if optimizer == "sharded":
        opt = bt.ShardedAdamW(model.parameters(), lr=0.01, weight_decay=0.1, overlap=overlap,
                              max_grad_norm=max_norm or 0.0)
        kwargs = {}
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        kwargs = dict(optimizer=opt, clip_grad_norm=max_norm)
    with model.join(divide_by_initial_world_size=divide, **kwargs):
        for step in range(_steps(r)):
            opt.zero_grad()
            _loss(model, r, step).backward()
            if max_norm is not None and optimizer != "sharded":
                model.clip_grad_norm_(max_norm)
            opt.step()
    with model.summon_full_params():
        final = [p.detach().clone() for p in model.parameters()]
        buffers = [b.detach().clone() for b in model.buffers()]
    if optimizer == "sharded":
        opt.close()
    model.close()
    return final, buffers


class FullyShardedJoin(unittest.TestCase):

    def check(self, n, divide, how="units", optimizer="sharded", overlap=True, max_norm=None,
              **wrap):
        def body(r, g):
            return _train(r, _wrap(r, g, n, how, **wrap), divide, optimizer, overlap, max_norm)

        results = run_ranks(n, body)
        want = serial_adamw(n, divide, max_norm)
        for r, (final, _) in enumerate(results):
            for i, (a, b) in enumerate(zip(final, want)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg="rank %d final parameter %d" % (r, i))

    def test_two_ranks_both_divides(self):
        for divide in (True, False):
            with self.subTest(divide_by_initial_world_size=divide):
                self.check(2, divide)

    def test_four_ranks_both_divides_no_reshard(self):
        for divide in (True, False):
            with self.subTest(divide_by_initial_world_size=divide):
                self.check(4, divide, reshard_after_forward=False)

    def test_stepped_after_backward_and_clipped(self):
        self.check(2, False, overlap=False)
        self.check(4, True, max_norm=0.05)

    def test_torch_optimizer_over_local_pieces(self):
        self.check(2, True, optimizer="torch")
        self.check(4, False, optimizer="torch", max_norm=0.05)

    def test_fully_shard_form(self):
        self.check(2, False, how="fully_shard")

    def test_hybrid_two_by_two_both_divides(self):
        for divide in (True, False):
            with self.subTest(divide_by_initial_world_size=divide):
                self.check(4, divide, how="hybrid")

    def test_throw_on_early_termination_raises_on_every_rank(self):
        def body(r, g):
            model = _wrap(r, g, 2, "units")
            opt = bt.ShardedAdamW(model.parameters(), lr=0.01)
            raised = None
            try:
                with model.join(throw_on_early_termination=True):
                    for step in range(_steps(r)):
                        _loss(model, r, step).backward()
                        opt.step()
            except braid.BraidError as e:
                raised = e
            opt.close()
            model.close()
            return raised, step

        (e0, _), (e1, s1) = run_ranks(2, body)
        self.assertEqual(e0.code, "OUT_OF_RANGE")
        self.assertIn("Rank 0 exhausted all inputs", str(e0))
        self.assertEqual(e1.code, "OUT_OF_RANGE")
        self.assertIn("Detected at least one rank that exhausted inputs", str(e1))
        self.assertEqual(s1, 2)  # at its first step past rank 0's data

    def test_tied_units(self):
        # tied_weights_test's GPT-2 shape (the head tied to the embedding, owned by one unit
        # and borrowed by another) under fully_shard and under FullyShardedDataParallel's
        # units; ShardedSGD with momentum; rank r runs 2 + r steps at 3 ranks.
        n = 3
        want = serial_tied_sgd(n)
        for how in ("fully_shard", "units"):
            def body(r, g):
                net = tied_weights_test.TiedNet()
                if how == "fully_shard":
                    for m in [net.wte] + list(net.blocks) + [net.head]:
                        bt.fully_shard(m, group=g)
                    model = bt.fully_shard(net, group=g)
                else:
                    model = bt.FullyShardedDataParallel(
                        net, g, units=[net.wte, net.blocks[0], net.blocks[1], net.head])
                opt = bt.ShardedSGD(model.parameters(), lr=0.1, momentum=0.9)
                with model.join():
                    for step in range(2 + r):
                        tied_weights_test._loss(model, r, step).backward()
                        opt.step()
                with model.summon_full_params():
                    full = [p.detach().clone() for p in net.parameters()]
                opt.close()
                model.close()
                return full

            for r, full in enumerate(run_ranks(n, body)):
                for i, (a, b) in enumerate(zip(full, want)):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                               msg="%s rank %d parameter %d" % (how, r, i))

    def test_buffers_end_as_the_last_joiners(self):
        def body(r, g):
            return _train(r, _wrap(r, g, 2, "units", norm=True), True)

        results = run_ranks(2, body)
        self.assertTrue(results[0][1])
        for a, b in zip(results[0][1], results[1][1]):
            self.assertTrue(torch.equal(a, b))

    def test_refusals_are_named(self):
        def body(r, g):
            model = bt.FullyShardedDataParallel(Net(norm=False), g, find_unused_parameters=True)
            with self.assertRaisesRegex(RuntimeError, "find_unused_parameters"):
                with model.join():
                    pass
            model.close()
            model = bt.FullyShardedDataParallel(Net(norm=False), g)
            with self.assertRaisesRegex(RuntimeError, "optimizer=opt"):
                with model.join():
                    pass
            opt = bt.ShardedAdamW(model.parameters(), lr=0.01)
            with self.assertRaisesRegex(RuntimeError, "without grad"):
                with model.join():
                    with torch.no_grad():
                        model(join_test._batch(r, 0)[0])
            with model.join():  # usable again after the refusal
                _loss(model, r, 0).backward()
                opt.step()
            opt.close()
            model.close()
            return True

        self.assertEqual(run_ranks(2, body), [True, True])


if __name__ == "__main__":
    unittest.main()
