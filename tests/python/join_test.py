"""DistributedDataParallel.join() (uneven inputs, braid/_join.py) on the `local` backend (ranks
are threads): rank r has 2 + 2 r batches, so ranks leave the loop at different steps.

  - all-reduce mode against torch 1.13's own DDP join() run beside it in the same process (one
    torch ProcessGroupGloo per rank thread over a shared HashStore), with a BatchNorm buffer,
    both divide_by_initial_world_size choices, at 2 and 4 ranks: parameters after every step,
    the joined ranks' p.grad and the final (synced) model;
  - ShardedAdamW (ZeRO-2) in reduce_scatter mode (2, 4 ranks) and hybrid mode (2 x 2) against a
    serial reference (one torch model and torch's AdamW stepping the contributing ranks'
    gradients over the initial world size, or over the contributors);
  - throw_on_early_termination raises on every rank; an exception inside the block leaves the
    join so the model can join again; enable=False is a plain loop; find_unused_parameters is
    refused by name. Fully sharded models: tests/python/fsdp_join_test.py.
tests/python/join_mpi.py runs the 2-rank comparisons with one process per rank (mpirun)."""

import datetime
import unittest

import torch
import torch.distributed as dist

import braid
from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

# torch 1.13's Join and DDP ask dist.get_rank(group) for the rank, which needs a default process
# group; ranks here are threads with a ProcessGroupGloo each, so answer from the group itself.
_get_rank = dist.get_rank


def _group_rank(group=None):
    if isinstance(group, dist.ProcessGroup):
        return group.rank()
    return _get_rank(group)


dist.get_rank = _group_rank


def _steps(r):
    return 2 + 2 * r


class Net(torch.nn.Module):
    def __init__(self, norm=True):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(7)
            self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)
            self.norm = torch.nn.BatchNorm1d(6) if norm else torch.nn.Identity()

    def forward(self, x):
        return self.b(torch.tanh(self.norm(self.a(x))))


def _batch(r, step):
    g = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)


def _loss(model, r, step):
    x, y = _batch(r, step)
    return torch.nn.functional.mse_loss(model(x), y)


class TorchGroups:
    """One torch ProcessGroupGloo per rank thread over one in-process store; kept alive until
    the test's main thread drops them (see torch_idioms_ddp_test.TorchGroups)."""

    def __init__(self, n, tag):
        self._store, self._n, self._tag, self.kept = dist.HashStore(), n, tag, []

    def group(self, r):
        pg = dist.ProcessGroupGloo(dist.PrefixStore(self._tag, self._store), r, self._n,
                                   datetime.timedelta(seconds=60))
        self.kept.append(pg)
        return pg


def _sgd_loop(r, model, join_kwargs, accumulate=False, steps=_steps):
    """SGD over rank r's batches inside model.join(); parameters after each own step, then the
    final state and p.grad. accumulate: even batches run under no_sync() (a window of two)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    with model.join(**join_kwargs):
        for step in range(steps(r)):
            if accumulate and step % 2 == 0:
                with model.no_sync():
                    _loss(model, r, step).backward()
                continue
            _loss(model, r, step).backward()
            opt.step()
            opt.zero_grad()
            history.append([p.detach().clone() for p in model.parameters()])
    state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    return history, state, grads


class JoinVsTorchDDP(unittest.TestCase):

    def check(self, n, divide, exact, accumulate=False, steps=_steps):
        torch_groups = TorchGroups(n, "join-%d-%s-%s" % (n, divide, accumulate))
        kept = []

        def body(r, g):
            kwargs = dict(divide_by_initial_world_size=divide)
            model = bt.DistributedDataParallel(Net(), g)
            mine = _sgd_loop(r, model, kwargs, accumulate, steps)
            model.close()
            ref_model = torch.nn.parallel.DistributedDataParallel(
                Net(), process_group=torch_groups.group(r))
            kept.append(ref_model)
            return mine, _sgd_loop(r, ref_model, kwargs, accumulate, steps)

        results = run_ranks(n, body)
        tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
        for r, ((hist, state, grads), (ref_hist, ref_state, ref_grads)) in enumerate(results):
            self.assertEqual(len(hist), len(ref_hist))
            self.assertGreater(len(hist), 0)
            for s, (got, want) in enumerate(zip(hist, ref_hist)):
                for i, (a, b) in enumerate(zip(got, want)):
                    torch.testing.assert_close(a, b, **tol,
                                               msg="rank %d step %d parameter %d" % (r, s, i))
            self.assertEqual(list(state), list(ref_state))
            for k in state:
                torch.testing.assert_close(state[k], ref_state[k], **tol,
                                           msg="rank %d final %s" % (r, k))
            for i, (a, b) in enumerate(zip(grads, ref_grads)):
                torch.testing.assert_close(a, b, **tol, msg="rank %d p.grad %d" % (r, i))
        # The final sync gives every rank the last joiner's state.
        last = results[-1][0][1]
        for r in range(n):
            for k, v in results[r][0][1].items():
                self.assertTrue(torch.equal(v, last[k]), "rank %d %s" % (r, k))

    def test_two_ranks_initial_world_size(self):
        self.check(2, True, exact=True)

    def test_two_ranks_contributors(self):
        self.check(2, False, exact=True)

    def test_two_ranks_no_sync_windows(self):
        self.check(2, False, exact=True, accumulate=True)

    def test_two_ranks_leaving_inside_a_no_sync_window(self):
        # Rank 0 runs out after a no_sync batch: its local sum is dropped (torch reduces zeros).
        self.check(2, True, exact=True, accumulate=True, steps=lambda r: 3 + 2 * r)

    def test_four_ranks_initial_world_size(self):
        # Four addends: gloo's order of the sum is not Braid's (rank order), bit exactness is
        # not the arithmetic's at 4 ranks (it is at 2).
        self.check(4, True, exact=False)

    def test_four_ranks_contributors(self):
        # 1/3 pre-multiplied: Braid's premul_sum and torch's mul by 1/3 may round apart.
        self.check(4, False, exact=False)


def _serial_adamw(n, divide, steps=None):
    """The reference: one model, torch's AdamW, each global step's gradient the sum of the
    ranks that have data (rank r has _steps(r) batches) over n or over their number."""
    model = Net(norm=False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    history = []
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
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def sharded_join(r, g, mode, divide, overlap=True):
    """Rank r of ShardedAdamW in `mode` ("reduce_scatter", or "hybrid" 2 x size/2) inside
    join(): (parameters after each own step, final parameters); also tests/python/recipes_mpi4.py."""
    kwargs = dict(mode=mode)
    if mode == "hybrid":
        shard, replica = g.mesh(2, g.size // 2)
        kwargs.update(group=shard, replica_group=replica)
        model = bt.DistributedDataParallel(Net(norm=False), **kwargs)
    else:
        model = bt.DistributedDataParallel(Net(norm=False), g, **kwargs)
    opt = bt.ShardedAdamW(model.parameters(), lr=0.01, weight_decay=0.1, overlap=overlap)
    history = []
    with model.join(divide_by_initial_world_size=divide):
        for step in range(_steps(r)):
            opt.zero_grad()
            _loss(model, r, step).backward()
            opt.step()
            history.append([p.detach().clone() for p in model.parameters()])
    final = [p.detach().clone() for p in model.parameters()]
    opt.close()
    model.close()
    return history, final


class JoinShardedAdamW(unittest.TestCase):

    def check(self, n, mode, divide, overlap=True):
        results = run_ranks(n, lambda r, g: sharded_join(r, g, mode, divide, overlap))
        ref = _serial_adamw(n, divide)
        for r, (hist, final) in enumerate(results):
            for s, got in enumerate(hist):
                for i, (a, b) in enumerate(zip(got, ref[s])):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                               msg="rank %d step %d parameter %d" % (r, s, i))
            for i, (a, b) in enumerate(zip(final, ref[-1])):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg="rank %d final parameter %d" % (r, i))

    def test_reduce_scatter_two_ranks(self):
        self.check(2, "reduce_scatter", True)

    def test_reduce_scatter_two_ranks_contributors(self):
        self.check(2, "reduce_scatter", False)

    def test_reduce_scatter_two_ranks_stepped_after_backward(self):
        self.check(2, "reduce_scatter", True, overlap=False)  # the joined rank's Step()

    def test_reduce_scatter_four_ranks_both_divides(self):
        for divide in (True, False):
            with self.subTest(divide_by_initial_world_size=divide):
                self.check(4, "reduce_scatter", divide)

    def test_hybrid_four_ranks(self):
        self.check(4, "hybrid", True)

    def test_hybrid_four_ranks_contributors(self):
        self.check(4, "hybrid", False)


class JoinOptions(unittest.TestCase):

    def test_throw_on_early_termination_raises_on_every_rank(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), g)
            raised = None
            try:
                with model.join(throw_on_early_termination=True):
                    for step in range(_steps(r)):
                        _loss(model, r, step).backward()
            except braid.BraidError as e:
                raised = e
            model.close()
            return raised, step

        (e0, s0), (e1, s1) = run_ranks(2, body)
        self.assertEqual(e0.code, "OUT_OF_RANGE")
        self.assertIn("Rank 0 exhausted all inputs", str(e0))  # rank 0 ran out
        self.assertEqual(e1.code, "OUT_OF_RANGE")
        self.assertIn("Detected at least one rank that exhausted inputs", str(e1))
        self.assertEqual(s1, 2)  # at its first step past rank 0's data

    def test_an_exception_leaves_the_join_and_enable_false_is_plain(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), g)
            with self.assertRaisesRegex(ValueError, "inside"):
                with model.join():
                    raise ValueError("inside")
            with model.join(enable=False):
                _loss(model, r, 0).backward()
            with model.join():  # open again after the exception
                for step in range(_steps(r)):
                    _loss(model, r, step).backward()
            model.close()
            return True

        self.assertEqual(run_ranks(2, body), [True, True])

    def test_find_unused_parameters_is_refused_by_name(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), g, find_unused_parameters=True)
            with self.assertRaisesRegex(RuntimeError, "find_unused_parameters"):
                with model.join():
                    pass
            model.close()
            return True

        run_ranks(2, body)


if __name__ == "__main__":
    unittest.main()
