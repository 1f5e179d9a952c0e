"""DistributedDataParallel.register_comm_hook (braid.comm_hooks) against torch 1.13's own
DistributedDataParallel (gloo) with the same hook, run beside it in the same process (ranks are
threads), bit for bit: torch's fp16_compress_hook and bf16_compress_hook, and Braid's own
hooks of the same arithmetic. Refusals name the hook."""

import unittest

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from braid import comm_hooks
from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from torch_idioms_ddp_test import TorchGroups

N = 2
STEPS = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(11)
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
            with torch.no_grad():  # gradients from ~1e-6 to ~1e2: f16 rounds and underflows
                self.a.weight.mul_(torch.logspace(-3, 1, 16))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _batch(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(5, 16, generator=g) * 10, torch.randn(5, 4, generator=g)


def sgd_steps(model, net, batches, lr):
    """SGD steps of `model` (wrapping `net`) with an MSE loss on each (x, y) of `batches`; each
    step's gradients."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    seen = []
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        seen.append([p.grad.clone() for p in net.parameters()])
        opt.step()
        opt.zero_grad()
    return seen


def _train(r, wrap, register, steps=STEPS):
    """SGD steps with the hook registered; each step's gradients, then the parameters."""
    net = Net()
    model = wrap(net)
    register(model)
    seen = sgd_steps(model, net, (_batch(r, step) for step in range(steps)), lr=0.01)
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return seen, [p.detach().clone() for p in net.parameters()]


def _bf16_hook_reference(process_group, bucket):
    """default_hooks.bf16_compress_hook with the all-reduce summing in f32."""
    wire = bucket.buffer().to(torch.bfloat16).div_(process_group.size()).float()
    fut = dist.all_reduce(wire, group=process_group, async_op=True).get_future()

    def decompress(fut):
        out = bucket.buffer()
        out.copy_(fut.value()[0].to(torch.bfloat16))
        return out
    return fut.then(decompress)


class CommHookTest(unittest.TestCase):
    def assert_same(self, got, want, where):
        if isinstance(want, torch.Tensor):
            self.assertTrue(torch.equal(got, want),
                            "%s: max diff %g" % (where, (got - want).abs().max()))
        else:
            self.assertEqual(len(got), len(want), where)
            for k, (g, w) in enumerate(zip(got, want)):
                self.assert_same(g, w, "%s[%d]" % (where, k))

    def against_torch(self, torch_hook, braid_hook, reference=None):
        """Braid's DDP with `torch_hook` and with `braid_hook` against torch's DDP with
        `reference` (default: torch_hook itself)."""
        reference = reference or torch_hook
        def torch_run(tag, register):
            pgs = TorchGroups("comm_hook_%s_%s" % (torch_hook.__name__, tag))
            return run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
                torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r),
                                                          bucket_cap_mb=1e-3)), register))

        ref = torch_run("hook", lambda m: m.register_comm_hook(m.process_group, reference))
        plain = torch_run("plain", lambda m: None)
        if torch_hook is not default_hooks.allreduce_hook:  # at 2 ranks: the default's result
            self.assertFalse(torch.equal(ref[0][0][0][0], plain[0][0][0][0]),
                             "the hook changes torch's gradients (else this proves nothing)")
        for hook in (torch_hook, braid_hook):
            got = run_ranks(N, lambda r, g: _train(
                r, lambda net: bt.DistributedDataParallel(net, group=g, bucket_cap_mb=1e-3),
                lambda m: m.register_comm_hook(None, hook)))
            self.assert_same(got, ref, "%r" % (hook,))

    def test_allreduce_hook_as_torch(self):
        self.against_torch(default_hooks.allreduce_hook, comm_hooks.CommHook("allreduce"))

    def test_fp16_compress_hook_as_torch(self):
        self.against_torch(default_hooks.fp16_compress_hook, comm_hooks.fp16_compress())

    def test_bf16_compress_hook_as_torch(self):
        # torch 1.13 runs bf16_compress_hook on NCCL only (gloo has no bf16 sum): the reference
        # is its arithmetic with gloo's sum carried in f32 and rounded to bf16 once, which for
        # two ranks is the bf16 sum exactly (two roundings of a two-term sum are one).
        self.against_torch(default_hooks.bf16_compress_hook, comm_hooks.bf16_compress(),
                           _bf16_hook_reference)

    def test_int8_close_to_torch_without_hook(self):
        """Braid's int8 (error feedback; its exact arithmetic: tests/comm_hook_test.cc) stays
        within a few quantization steps of torch's uncompressed gradients (a block's scale
        comes from the largest gradient in it, whichever parameter that is)."""
        pgs = TorchGroups("comm_hook_int8")
        plain = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r))),
            lambda m: None))
        got = run_ranks(N, lambda r, g: _train(
            r, lambda net: bt.DistributedDataParallel(net, group=g),
            lambda m: m.register_comm_hook(None, comm_hooks.int8(block=64))))
        top = max(float(w.abs().max()) for w in plain[0][0][0])  # step 0, rank 0
        for k, (g, w) in enumerate(zip(got[0][0][0], plain[0][0][0])):
            self.assertLessEqual(float((g - w).abs().max()), 2 * top / 127, "parameter %d" % k)
        self.assertFalse(all(torch.equal(g, w) for g, w in zip(got[0][0][0], plain[0][0][0])))

    def test_refusals_name_the_hook(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), group=g)
            try:  # (any other callable runs as a Python hook: python_hook_test.py)
                with self.assertRaisesRegex(TypeError, "must be callable"):
                    model.register_comm_hook(None, 3)
                with self.assertRaisesRegex(ValueError, "fp16_compress_hook.*model's own group"):
                    model.register_comm_hook(object(), default_hooks.fp16_compress_hook)
                with self.assertRaisesRegex(ValueError, "replica_only needs mode='hybrid'"):
                    model.register_comm_hook(None, comm_hooks.bf16_compress(replica_only=True))
                model.register_comm_hook(g, default_hooks.bf16_compress_hook)
                with self.assertRaisesRegex(RuntimeError, "can only be called once"):
                    model.register_comm_hook(None, default_hooks.bf16_compress_hook)
            finally:
                model.close()
            half = Net().to(torch.bfloat16)
            model = bt.DistributedDataParallel(half, group=g)
            try:
                with self.assertRaisesRegex(ValueError, "'a.weight' is torch.bfloat16"):
                    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            finally:
                model.close()
        run_ranks(N, body)


if __name__ == "__main__":
    unittest.main()
