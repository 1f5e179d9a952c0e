"""Braid's PowerSGD hook across torch's bucket rebuild: braid.pytorch's DistributedDataParallel
with rebuild_bucket_order=None (torch 1.13's policy: one rebuild in the first synced backward's
readiness order, at the second forward) and register_comm_hook(PowerSGDState, powerSGD_hook),
against torch's DDP (gloo) with torch's own powerSGD_hook, 2 ranks (threads), same seeds and
batches. The model registers a, b, c and runs c, b, a, so the rebuild reorders the buckets
(torch: from one bucket to several; Braid: from reverse registration order to readiness order):
the hook's step count must carry across it (compression starts at start_powerSGD_iter on both
sides) and the buckets must be torch's, since the first Q is drawn per bucket.

torch's run draws Braid's first-Q values (powersgd_test.braid_draws), nothing else changes.
Bound: the uncompressed steps bit for bit (2 ranks: one addition per element on both sides);
the compressed ones within 1e-5 of the largest gradient, as powersgd_test and for its reason
(torch's norms, dot products and bmm sum in another order than Braid's loops)."""

import unittest

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from comm_hook_test import sgd_steps
from powersgd_test import _keep, _braid_randn, _real_randn, braid_draws
from torch_idioms_ddp_test import TorchGroups

N = 2
STEPS = 7
START = 3  # compressed from step 3: after the rebuild (at step 1's forward)
# Bytes: a's parameters fill the first bucket exactly, b's the second, c's the third; torch
# closes a bucket once it reaches its cap, Braid before it would pass it: at exact fits both
# give a | b | c after the rebuild (initially torch: one bucket; Braid: c.b c.w b.b | b.w a.b |
# a.w).
FIRST_CAP = (16 * 32 + 16) * 4
CAP = (32 * 24 + 32) * 4


class Backwards(torch.nn.Module):
    """Registers a, b, c and runs c, b, a: a's gradients are ready first, and every weight is
    worth compressing at rank 1 ((rows + cols) x 2 < rows x cols)."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(21)
            self.a = torch.nn.Linear(32, 16)
            self.b = torch.nn.Linear(24, 32)
            self.c = torch.nn.Linear(16, 24)

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.c(x)))))


def _batch(r, step):
    g = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)


def _train(r, model, net):
    """SGD steps; each step's gradients, then the parameters after the last step."""
    seen = sgd_steps(model, net, (_batch(r, step) for step in range(STEPS)), lr=0.05)
    return seen, [p.detach().clone() for p in net.parameters()]


def _state(group=None):
    return powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                  start_powerSGD_iter=START, random_seed=17)


class PowerSGDRebuildTest(unittest.TestCase):
    def _torch(self, seed):
        pgs = _keep(TorchGroups("powersgd_rebuild"))
        draws = braid_draws(seed)
        buckets = [{} for _ in range(N)]  # per rank: parameter index -> bucket, last step

        def body(r, g):
            net = Backwards()
            ddp = pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, process_group=pgs.group(r), bucket_cap_mb=CAP / 2**20))
            index = {id(p): k for k, p in enumerate(net.parameters())}

            def hook(st, bucket):
                for p in bucket.parameters():
                    buckets[r][index[id(p)]] = bucket.index()
                fut = draws(st, bucket)
                # torch's hook issues P's and Q's all-reduces from completion callbacks, so with
                # several buckets in flight the ranks' gloo calls can interleave differently (a
                # mismatched pair, seen here); one bucket at a time keeps them in order. Same
                # values: only when the next bucket's hook runs changes.
                fut.wait()
                return fut
            ddp.register_comm_hook(_keep(_state(ddp.process_group)), hook)
            out = _train(r, ddp, net)
            self.assertEqual(ddp._get_ddp_logging_data().get("has_rebuilt_buckets"), 1)
            return out
        first, torch.randn = dist._DEFAULT_FIRST_BUCKET_BYTES, _braid_randn
        dist._DEFAULT_FIRST_BUCKET_BYTES = FIRST_CAP  # read by torch's DDP constructor
        try:
            return run_ranks(N, body), buckets
        finally:
            torch.randn, dist._DEFAULT_FIRST_BUCKET_BYTES = _real_randn, first

    def _braid(self):
        def body(r, g):
            net = Backwards()
            ddp = bt.DistributedDataParallel(net, group=g, bucket_cap_mb=CAP / 2**20,
                                             first_bucket_cap_mb=FIRST_CAP / 2**20,
                                             rebuild_bucket_order=None)
            before = [ddp.reducer.param_bucket(k) for k in range(len(ddp._params))]
            ddp.register_comm_hook(_state(), powersgd.powerSGD_hook)
            try:
                out = _train(r, ddp, net)
                self.assertEqual(ddp._get_ddp_logging_data()["has_rebuilt_buckets"], 1)
                after = [ddp.reducer.param_bucket(k) for k in range(len(ddp._params))]
            finally:
                ddp.close()
            return out, before, after
        return run_ranks(N, body)

    def test_as_torch_across_the_rebuild(self):
        seed = int(_state().rng.randint(1 << 31))  # the draw Braid's mapping makes
        (ref, torch_buckets) = self._torch(seed)
        got = self._braid()
        pgs = _keep(TorchGroups("powersgd_rebuild_plain"))

        def uncompressed(r, g):
            net = Backwards()
            return _train(r, pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, process_group=pgs.group(r))), net)
        plain = run_ranks(N, uncompressed)
        for r in range(N):
            (grads, params), before, after = got[r]
            # The rebuild changed Braid's buckets, into torch's (several buckets).
            self.assertNotEqual(before, after, "the rebuild must move buckets: else no test")
            self.assertEqual(after, [torch_buckets[r][k] for k in range(len(after))])
            self.assertGreater(len(set(after)), 2)
            for step in range(STEPS):
                for k, (g, w, p) in enumerate(zip(grads[step], ref[r][0][step],
                                                  plain[r][0][step])):
                    where = "rank %d step %d parameter %d" % (r, step, k)
                    if step < START:  # allreduce_hook: at 2 ranks the plain average, bit for bit
                        self.assertTrue(torch.equal(g, w), where)
                        self.assertTrue(torch.equal(g, p), where)
                        continue
                    top = float(w.abs().max())
                    self.assertLessEqual(float((g - w).abs().max()), 1e-5 * top, where)
                    if g.dim() == 2:  # compressed (else this proves nothing about the count)
                        self.assertGreater(float((w - p).abs().max()), 1e-3 * top, where)
            for k, (a, b) in enumerate(zip(params, ref[r][1])):
                self.assertLessEqual(float((a - b).abs().max()), 1e-5 * float(b.abs().max()),
                                     "rank %d parameter %d after %d steps" % (r, k, STEPS))


if __name__ == "__main__":
    unittest.main()
