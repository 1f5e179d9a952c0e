"""register_comm_hook(PowerSGDState, powerSGD_hook) on Braid's DistributedDataParallel against
torch 1.13's DDP (gloo) running torch's own powerSGD_hook, in the same process (ranks are
threads). torch draws the first Q from its RNG and Braid from its own generator
(scheduler/hooks/powersgd.h), so torch's run here draws Braid's values (torch.randn replaced
inside the hook, nothing else). The bound is rounding, not bits: torch's norms, sums and bmm
reduce in another order than Braid's ascending loops, and for ranks above 2 torch
orthogonalizes with LAPACK's QR where Braid uses Gram-Schmidt (the same column span, so the
same P P^T M up to rounding). Exact arithmetic: tests/powersgd_test.cc."""

import threading
import unittest

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from braid import comm_hooks
from braid import pytorch as bt
from rank_threads import run_ranks
from comm_hook_test import N, Net
from comm_hook_test import _train as train_with_hook
from torch_idioms_ddp_test import TorchGroups

STEPS = 6
START = 2  # torch's minimum with error feedback / warm start
_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _init_value(seed, bucket, init, k):
    """PowerSGDInitValue (scheduler/hooks/powersgd.h): exact in f32."""
    key = _splitmix64(seed ^ _splitmix64(((bucket & 0xFFFFFFFF) << 32) | (init & 0xFFFFFFFF)))
    x = _splitmix64((key + k * 0x9E3779B97F4A7C15) & _M64)
    return 2.0 * ((x >> 40) / float(1 << 24)) - 1.0


_tls = threading.local()
# torch's PowerSGD futures hold the state and so the ProcessGroupGloo; a group whose last
# reference drops inside such a callback is destroyed on its own gloo thread, which joins itself
# (std::system_error "Resource deadlock avoided"). The torch groups and states live to the end.
_KEEP = []
_real_randn = torch.randn


def _keep(x):
    _KEEP.append(x)
    return x


def _braid_randn(*shape, **kw):
    """torch.randn as powerSGD_hook calls it (device="cpu", no generator): Braid's stream."""
    if getattr(_tls, "seed", None) is None or "generator" in kw:
        return _real_randn(*shape, **kw)
    n = int(np.prod(shape))
    vals = [_init_value(_tls.seed, _tls.bucket, _tls.init, _tls.k + i) for i in range(n)]
    _tls.k += n
    return torch.tensor(vals, dtype=torch.float32).view(*shape)


def braid_draws(seed):
    """torch's powerSGD_hook drawing Braid's first Q values: per fill, the hook-wide draw number
    Braid gives it (one per fill in hook call order, torch's one state.rng draw per fill), the
    bucket index and the element index. Install torch.randn = _braid_randn around the run."""
    draws = {}  # id(state) -> fills so far (one state per rank)

    def hook(st, bucket):
        fill = st.iter >= st.start_powerSGD_iter and (
            not st.warm_start or bucket.index() not in st.p_memory_dict)
        _tls.seed, _tls.bucket, _tls.k = seed, bucket.index(), 0
        _tls.init = draws.get(id(st), 0)
        if fill:
            draws[id(st)] = _tls.init + 1
        try:
            return powersgd.powerSGD_hook(st, bucket)
        finally:
            _tls.seed = None
    return hook


def _train(r, wrap, register):
    """comm_hook_test's training over this test's steps: each step's gradients."""
    return train_with_hook(r, wrap, register, steps=STEPS)[0]


class PowerSGDTest(unittest.TestCase):
    def against_torch(self, rank):
        def state(group=None):
            return powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=rank,
                                          start_powerSGD_iter=START, random_seed=5)
        seed = int(state().rng.randint(1 << 31))  # the draw Braid's mapping makes
        torch_hook = braid_draws(seed)

        pgs = _keep(TorchGroups("powersgd_r%d" % rank))
        torch.randn = _braid_randn
        try:
            ref = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
                torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r))),
                lambda m: m.register_comm_hook(_keep(state(m.process_group)), torch_hook)))
        finally:
            torch.randn = _real_randn
        pgs = _keep(TorchGroups("powersgd_plain_r%d" % rank))
        plain = run_ranks(N, lambda r, g: _train(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r))),
            lambda m: None))
        got = run_ranks(N, lambda r, g: _train(
            r, lambda net: bt.DistributedDataParallel(net, group=g),
            lambda m: m.register_comm_hook(state(), powersgd.powerSGD_hook)))
        for rk in range(N):
            for step in range(STEPS):
                for k, (g, w, p) in enumerate(zip(got[rk][step], ref[rk][step],
                                                  plain[rk][step])):
                    where = "rank %d step %d parameter %d" % (rk, step, k)
                    if step < START:  # torch's allreduce_hook: at 2 ranks the plain average
                        self.assertTrue(torch.equal(g, w), where)
                        continue
                    top = float(w.abs().max())
                    self.assertLessEqual(float((g - w).abs().max()), 1e-5 * top, where)  # seen: 1.7e-6
                # Compression changed the weights' gradients (else this proves nothing).
                if step >= START:
                    self.assertGreater(float((ref[rk][step][0] - plain[rk][step][0]).abs().max()),
                                       1e-3 * float(plain[rk][step][0].abs().max()))

    def test_rank_1_as_torch(self):
        self.against_torch(1)

    def test_rank_4_as_torch(self):  # torch: QR; Braid: Gram-Schmidt
        self.against_torch(4)

    def test_state_mapping_and_refusals(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), group=g)
            try:
                other = powersgd.PowerSGDState(process_group=object())
                with self.assertRaisesRegex(ValueError, "model's own group"):
                    model.register_comm_hook(other, powersgd.powerSGD_hook)
                model.register_comm_hook(None, comm_hooks.powersgd(2, start_powerSGD_iter=3))
                self.assertEqual(model._comm_hook.params["matrix_approximation_rank"], 2)
            finally:
                model.close()
        run_ranks(N, body)


if __name__ == "__main__":
    unittest.main()
