"""register_comm_hook with a Python hook of the user's (braid/_python_hook.py) against torch
1.13's own DistributedDataParallel (gloo) with the same hook, run beside it in the same
process (ranks are threads), bit for bit: gradients of every step, with a no_sync window, and
the parameters after SGD; several buckets (bucket_cap_mb=1e-3). Errors name the hook and the
bucket; what a Python hook cannot serve is refused by name."""

import threading
import unittest

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from braid import pytorch as bt
from rank_threads import run_ranks
from comm_hook_test import N, Net, _batch
from torch_idioms_ddp_test import TorchGroups

# Per step: run it inside no_sync() (gradients accumulate locally; the next synced step's
# hook gets the sum).
SCHEDULE = [False, True, False, False, True, False]


def _train(r, wrap, register):
    """SGD over SCHEDULE with the hook registered; per step the gradients, then the
    parameters."""
    net = Net()
    model = wrap(net)
    register(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    seen = []
    for step, window in enumerate(SCHEDULE):
        x, y = _batch(r, step)
        if window:
            with model.no_sync():
                torch.nn.functional.mse_loss(model(x), y).backward()
            continue
        torch.nn.functional.mse_loss(model(x), y).backward()
        seen.append([p.grad.clone() for p in net.parameters()])
        opt.step()
        opt.zero_grad()
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return seen, [p.detach().clone() for p in net.parameters()]


def allreduce_with_then_hook(process_group, bucket):
    """torch's test hook (distributed_test.py): all-reduce, then x2, then / (2 x size)."""
    fut = process_group.allreduce([bucket.buffer()]).get_future()
    return fut.then(lambda f: 2 * f.wait()[0]).then(
        lambda f: f.wait() / (2 * process_group.size()))


def fp16_per_tensor_hook(process_group, bucket):
    """Each gradient rounded to f16 and averaged over its own all-reduce (gradients(),
    set_buffer()); the result is read from the buffer set."""
    futs = [dist.all_reduce(g.to(torch.float16).div_(process_group.size()),
                            group=process_group, async_op=True).get_future()
            for g in bucket.gradients()]

    def widen(_):
        bucket.set_buffer(torch.cat([f.value()[0].float().reshape(-1) for f in futs]))
        return bucket.buffer()
    return torch.futures.collect_all(futs).then(widen)


def _same(test, got, want, where):
    if isinstance(want, torch.Tensor):
        test.assertTrue(torch.equal(got, want),
                        "%s: max diff %g" % (where, (got - want).abs().max()))
        return
    test.assertEqual(len(got), len(want), where)
    for k, (g, w) in enumerate(zip(got, want)):
        _same(test, g, w, "%s[%d]" % (where, k))


_DRAW_LOCK = threading.Lock()


def locked_powersgd(state, bucket):
    """torch's powerSGD_hook as a user's Python hook (Braid maps powerSGD_hook itself to its
    built-in PowerSGD), one rank thread at a time while it is called: its first Qs come from
    torch.manual_seed + torch.randn, global to the process that two rank threads share here
    (its collectives and callbacks run after the call, unlocked). (torch 1.13's
    batched_powerSGD_hook fails its own assertion on any compressed step: 2-D memories passed
    to _orthogonalize.)"""
    with _DRAW_LOCK:
        return powersgd.powerSGD_hook(state, bucket)


class PythonHookTest(unittest.TestCase):
    def against_torch(self, hook, tag, state=None, **kwargs):
        """Braid's DDP and torch's, each with `hook` over a torch gloo group of its own (or
        `state(group)` for the hook's state), for the hook only."""
        state = state or (lambda pg: pg)
        torch_pgs, hook_pgs, braid_pgs, plain_pgs = (
            TorchGroups("python_hook_%s_%s" % (tag, k))
            for k in ("torch", "torch_hook", "braid", "plain"))
        kwargs = kwargs or {"bucket_cap_mb": 1e-3}
        ref = run_ranks(N, lambda r, g: _train(r, lambda net: torch_pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=torch_pgs.group(r),
                                                      **kwargs)),
            # the hook's own group: torch's used-map all-reduce (find_unused_parameters) and a
            # hook's collectives issued from its callbacks would race on one group
            lambda m: m.register_comm_hook(state(hook_pgs.group(r)), hook)))
        braid_kwargs = dict(kwargs)
        braid_kwargs.setdefault("first_bucket_cap_mb", kwargs.get("bucket_cap_mb", 1.0))
        got = run_ranks(N, lambda r, g: _train(
            r, lambda net: bt.DistributedDataParallel(net, group=g, **braid_kwargs),
            lambda m: m.register_comm_hook(state(braid_pgs.group(r)), hook)))
        _same(self, got, ref, tag)
        return ref, plain_pgs

    def test_allreduce_with_then_hook_as_torch(self):
        self.against_torch(allreduce_with_then_hook, "then")

    def test_fp16_per_tensor_hook_as_torch(self):
        ref, pgs = self.against_torch(fp16_per_tensor_hook, "fp16")
        plain = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r))),
            lambda m: None))
        self.assertFalse(torch.equal(ref[0][0][0][0], plain[0][0][0][0]),
                         "the hook changes torch's gradients (else this proves nothing)")

    def test_powersgd_python_hook_as_torch(self):
        """torch's powerSGD_hook run from Python (a PowerSGDState: error feedback, warm start,
        compressed from its 2nd synced step) on one bucket: torch with find_unused_parameters
        keeps its bucket in registration order, as Braid's."""
        ref, pgs = self.against_torch(
            locked_powersgd, "powersgd",
            state=lambda pg: powersgd.PowerSGDState(process_group=pg, start_powerSGD_iter=2,
                                                    matrix_approximation_rank=1),
            find_unused_parameters=True)
        plain = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r))),
            lambda m: None))
        self.assertFalse(torch.equal(ref[0][0][-1][0], plain[0][0][-1][0]),
                         "compression changes torch's gradients (else this proves nothing)")

    def test_hook_over_braid_group(self):
        """A hook reducing with Braid's own group (its Work waited, the result in a completed
        torch Future): torch DDP's default averaging, bit for bit at 2 ranks."""
        def body(r, g):
            def braid_hook(group, bucket):
                out = bucket.buffer().div_(group.size)
                group.allreduce(out).wait()
                fut = torch.futures.Future()
                fut.set_result(out)
                return fut
            return _train(r, lambda net: bt.DistributedDataParallel(
                net, group=g, bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-3),
                          lambda m: m.register_comm_hook(g, braid_hook))
        got = run_ranks(N, body)
        pgs = TorchGroups("python_hook_braid_group")
        ref = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r),
                                                      bucket_cap_mb=1e-3)), lambda m: None))
        _same(self, got, ref, "braid group hook")

    def test_errors_name_the_hook(self):
        def step(model):
            x, y = _batch(0, 0)
            torch.nn.functional.mse_loss(model(x), y).backward()

        def body(r, g):
            cases = [
                (lambda s, b: None, "<lambda> on bucket 0 of 1 returned NoneType, not a "
                 "torch.futures.Future"),
                (_raises, "_raises on bucket 0 of 1 raised ValueError: no"),
                (_short, "_short on bucket 0 of 1 its future's value is a tensor of 1 "
                 "elements; expected a tensor of the bucket's 676 elements"),
                (_never, "_never on bucket 0 of 1 its future did not complete within 0.2 s"),
                (_fails, "_fails on bucket 0 of 1 its future failed: .*boom"),
            ]
            for hook, message in cases:
                model = bt.DistributedDataParallel(Net(), group=g, timeout_ms=200)
                try:
                    model.register_comm_hook(None, hook)
                    with self.assertRaisesRegex(RuntimeError, message + ".*local, unreduced"):
                        step(model)
                finally:
                    model.close()
            model = bt.DistributedDataParallel(Net(), group=g, mode="reduce_scatter")
            try:
                with self.assertRaisesRegex(ValueError, "_never.*mode='reduce_scatter'"):
                    model.register_comm_hook(None, _never)
            finally:
                model.close()
            model = bt.DistributedDataParallel(Net(), group=g)
            try:
                model.register_comm_hook(None, _never)
                with self.assertRaisesRegex(ValueError, "join.*Python comm hook _never"):
                    model.join()
                with self.assertRaisesRegex(RuntimeError, "can only be called once"):
                    model.register_comm_hook(None, _never)
            finally:
                model.close()
        run_ranks(N, body)


def _raises(state, bucket):
    raise ValueError("no")


def _short(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(torch.zeros(1))
    return fut


def _never(state, bucket):
    return torch.futures.Future()


def _fails(state, bucket):
    fut = torch.futures.Future()
    fut.set_exception(RuntimeError("boom"))
    return fut


if __name__ == "__main__":
    unittest.main()
