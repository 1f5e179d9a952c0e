"""fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16 / float16) at 2 ranks as threads
of a `local` world, against torch in the same process: each step, a param_dtype copy of the
float32 master model computes every rank's loss, the ranks' gradients (cast to float32) are
averaged, and the same optimizer steps the float32 master — FSDP2's mixed precision with
reduce_dtype float32. torch optimizers over the pieces match it bit for bit (losses and master
weights), also under gradient accumulation, with the units gathered in param_dtype (FSDP2's
wire); ShardedAdamW within its usual tolerance; what cannot be cast is refused naming
param_dtype."""

import copy
import unittest

import torch

from braid import pytorch as bt
from fully_shard_test import N, OPTIMIZERS, STEPS, Net, _data
from rank_threads import run_ranks


def _mp(dtype):
    return bt.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                   output_dtype=torch.float32)


def _half_matmul():
    try:
        torch.nn.functional.linear(torch.ones(1, 1, dtype=torch.float16),
                                   torch.ones(1, 1, dtype=torch.float16))
        return True
    except RuntimeError:
        return False


def _shard(net, g, dtype):
    for b in net.blocks:
        bt.fully_shard(b, group=g, mp_policy=_mp(dtype))
    return bt.fully_shard(net, group=g, mp_policy=_mp(dtype))


def _reference(kind, dtype, micro=1):
    """The float32 master `net`; every micro-batch of every rank runs on a `dtype` copy of it
    (inputs cast, output cast back to float32); gradients cast to float32, summed over the
    micro-batches per rank, then averaged over the ranks."""
    net = Net()
    opt = OPTIMIZERS[kind](net.parameters())
    losses = []
    for s in range(STEPS):
        per_rank = []
        for r in range(N):
            low = copy.deepcopy(net).to(dtype)
            acc = None
            for m in range(micro):
                x, y = _data(r, s, m)
                loss = torch.nn.functional.mse_loss(low(x.to(dtype)).float(), y)
                losses.append(loss.detach())
                grads = torch.autograd.grad(loss, list(low.parameters()))
                grads = [g.float() for g in grads]
                acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]
            per_rank.append(acc)
        for p, *gs in zip(net.parameters(), *per_rank):
            total = gs[0]
            for g in gs[1:]:
                total = total + g
            p.grad = total / N
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()], losses


def _train(kind, dtype, micro=1):
    def body(r, g):
        net = _shard(Net(), g, dtype)
        opt = (bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.1) if kind == "sharded"
               else OPTIMIZERS[kind](net.parameters()))
        losses, seen = [], set()
        for s in range(STEPS):
            for m in range(micro):
                net.set_requires_gradient_sync(m == micro - 1)
                x, y = _data(r, s, m)
                out = net(x)
                seen.add(out.dtype)
                loss = torch.nn.functional.mse_loss(out, y)
                losses.append(loss.detach())
                loss.backward()
            opt.step()
            opt.zero_grad()
        if kind == "sharded":
            opt.synchronize()
        master_dtypes = {p.dtype for p in net.parameters()}
        with net.summon_full_params():
            full = [p.detach().clone() for p in net.parameters()]
        if kind == "sharded":
            opt.close()
        net.close()
        return full, losses, seen, master_dtypes
    return run_ranks(N, body)


class ParamDtypeTest(unittest.TestCase):
    def _check(self, kind, dtype, micro=1):
        want, want_losses = _reference("adamw" if kind == "sharded" else kind, dtype, micro)
        for r, (full, losses, seen, master) in enumerate(_train(kind, dtype, micro)):
            self.assertEqual(seen, {torch.float32})  # output_dtype
            self.assertEqual(master, {torch.float32})  # the pieces stay float32
            mine = want_losses[r * micro::N * micro]  # (step-major: rank r's first micro)
            for got, w in zip(losses[::micro], mine):
                self.assertTrue(torch.equal(got, w), (kind, dtype, got, w))
            for a, b in zip(full, want):
                self.assertEqual(a.dtype, torch.float32)
                if kind == "sharded":
                    self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-6),
                                    (a - b).abs().max())
                else:
                    self.assertTrue(torch.equal(a, b), (kind, dtype, (a - b).abs().max()))

    def test_bf16_compute_with_torch_adamw_equals_fsdp2_semantics(self):
        self._check("adamw", torch.bfloat16)

    @unittest.skipUnless(_half_matmul(), "torch has no float16 matmul on this device (CPU)")
    def test_f16_compute_with_torch_sgd(self):
        self._check("sgd", torch.float16)

    def test_bf16_with_torch_sgd(self):
        self._check("sgd", torch.bfloat16)

    def test_bf16_under_accumulation(self):
        self._check("adamw", torch.bfloat16, micro=2)

    def test_bf16_with_sharded_adamw(self):
        self._check("sharded", torch.bfloat16)

    def test_the_cast_changes_the_result(self):
        # Guards the comparison above: bf16 compute really differs from float32 compute.
        want32, _ = _reference("adamw", torch.float32)
        want16, _ = _reference("adamw", torch.bfloat16)
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(want32, want16)))

    def test_a_host_param_dtype_gathers_in_param_dtype(self):
        # FSDP2's wire: the bit-for-bit checks above ran over bf16 / f16 gathers, which this
        # shows; gather_dtype="float32" keeps float32 gathers, with the same values.
        from braid import _lib

        def body(r, g):
            wires = {}
            for gather in (None, "float32"):
                net = Net()
                for b in net.blocks:
                    bt.fully_shard(b, group=g, mp_policy=_mp(torch.bfloat16))
                bt.fully_shard(net, group=g, mp_policy=_mp(torch.bfloat16), gather_dtype=gather)
                opt = torch.optim.SGD(net.parameters(), lr=0.1)
                x, y = _data(r, 0, 0)
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
                opt.step()
                engine = net._braid_fsdp.engine
                wires[gather] = (engine.fsdp_options.get("gather_dtype", _lib.GATHER_EXACT),
                                 loss.detach())
                net.close()
            return wires
        for wires in run_ranks(N, body):
            self.assertEqual(wires[None][0], _lib.GATHER_BF16)
            self.assertEqual(wires["float32"][0], _lib.GATHER_EXACT)
            self.assertTrue(torch.equal(wires[None][1], wires["float32"][1]))

    def test_what_cannot_be_cast_is_refused(self):
        def body(r, g):
            with self.assertRaisesRegex(ValueError, "param_dtype=torch.float64"):
                bt.fully_shard(Net(), group=g, mp_policy=bt.MixedPrecisionPolicy(
                    param_dtype=torch.float64))
            net = Net()
            bt.fully_shard(net.blocks[0], group=g, mp_policy=_mp(torch.bfloat16))
            bt.fully_shard(net.blocks[1], group=g, mp_policy=_mp(torch.float16))
            bt.fully_shard(net, group=g, mp_policy=_mp(torch.bfloat16))
            with self.assertRaisesRegex(ValueError, "param_dtype / cast_forward_inputs differ"):
                net(torch.randn(2, 5))
        run_ranks(N, body)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
