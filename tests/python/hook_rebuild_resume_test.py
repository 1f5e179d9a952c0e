"""Braid's PowerSGD hook state resumed across torch's bucket rebuild: braid.pytorch's
DistributedDataParallel with rebuild_bucket_order=None (torch 1.13's policy) and
braid.comm_hooks.powersgd, 2 ranks (threads of a `local` world), SGD with momentum, model,
optimizer and hook state through torch.save / torch.load. The model (powersgd_rebuild_test's)
registers a, b, c and runs c, b, a, so the rebuild moves the buckets from the registration-order
layout B to the readiness-order layout A. A run saves after the rebuild (its hook state is A's);
a fresh wrapper resumes: its first step runs in B, the rebuild then moves it to A.

- Saved inside the warm-up (start_powerSGD_iter not reached): the resumed steps equal the
  uninterrupted run bit for bit (A's records wait for A instead of failing B's first bucket).
- Saved after compression began: the first resumed step (in B) equals bit for bit a resume whose
  hook state lost its per-bucket records (step and draw counts kept): A's error feedback and Q
  are not applied to B's buckets. It cannot equal the uninterrupted run, whose step ran in A
  with that state (torch's hook, keyed by bucket index, would apply it to B's buckets). The
  steps after the rebuild differ from that resume: the records were installed in A."""

import io
import struct
import unittest

import torch

import braid
from braid import comm_hooks
from braid import pytorch as bt
from rank_threads import TIMEOUT_MS, run_ranks
from powersgd_rebuild_test import CAP, FIRST_CAP, Backwards, _batch

N = 2
STEPS = 6


def _strip_buckets(state):
    """PowerSGD's hook state bytes (scheduler/hooks/hook_state.h, version 2) without its
    per-bucket records: magic, version, name, size, rank, layout, then iter and draws."""
    at = 4 + 8
    (name_len,) = struct.unpack_from("=q", state, at)
    at += 8 + name_len + 3 * 8 + 2 * 8
    return state[:at]


def _run(start_iter, start, stop, ckpt=None, strip=False):
    """Steps [start, stop) in a new world; from `ckpt` (per-rank bytes) when given. Returns per
    rank: the parameters after each step, the checkpoint bytes at the end, and each parameter's
    bucket after the first step and at the end."""
    world = braid.World("local", local_ranks=N, timeout_ms=TIMEOUT_MS, read_env=False)

    def body(r, g):
        net = Backwards()
        model = bt.DistributedDataParallel(net, group=g, bucket_cap_mb=CAP / 2**20,
                                           first_bucket_cap_mb=FIRST_CAP / 2**20,
                                           rebuild_bucket_order=None)
        model.register_comm_hook(None, comm_hooks.powersgd(
            matrix_approximation_rank=1, start_powerSGD_iter=start_iter, random_seed=3))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if ckpt is not None:
            saved = torch.load(io.BytesIO(ckpt[r]))
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optim"])
            hook = saved["comm_hook"]
            if strip:
                hook = dict(hook, state=_strip_buckets(hook["state"]))
            model.load_comm_hook_state_dict(hook)
        seen, layouts = [], []
        buckets = lambda: [model.reducer.param_bucket(k) for k in range(len(model._params))]
        for step in range(start, stop):
            x, y = _batch(r, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            seen.append([p.detach().clone() for p in net.parameters()])
            if step == start:
                layouts.append(buckets())
        layouts.append(buckets())
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                    "comm_hook": model.comm_hook_state_dict()}, buf)
        model.close()
        return seen, buf.getvalue(), layouts
    try:
        return run_ranks(N, body, world)
    finally:
        world.close()


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


class HookRebuildResumeTest(unittest.TestCase):
    def _saved(self, start_iter, k):
        first = _run(start_iter, 0, k)
        for r in range(N):
            before, after = first[r][2]
            self.assertNotEqual(before, after, "the rebuild must move buckets: else no test")
        return first, [b for _, b, _ in first]

    def test_saved_inside_the_warm_up_resumes_bit_for_bit(self):
        start_iter, k = 4, 2  # saved after step 1 (in A), compressed from step 4
        first, ckpt = self._saved(start_iter, k)
        whole = _run(start_iter, 0, STEPS)
        resumed = _run(start_iter, k, STEPS, ckpt)
        for r in range(N):
            self.assertEqual(resumed[r][2], [first[r][2][0], first[r][2][1]])  # B, then A
            for s in range(k, STEPS):
                self.assertTrue(_same(resumed[r][0][s - k], whole[r][0][s]), (r, s))

    def test_saved_after_compression_never_misapplies(self):
        start_iter, k = 2, 4  # compressed steps 2 and 3 before the save
        _, ckpt = self._saved(start_iter, k)
        resumed = _run(start_iter, k, STEPS, ckpt)
        stripped = _run(start_iter, k, STEPS, ckpt, strip=True)
        for r in range(N):
            # In B: as without A's records.
            self.assertTrue(_same(resumed[r][0][0], stripped[r][0][0]), r)
            # In A again: the records were installed (else the runs would stay equal).
            self.assertFalse(_same(resumed[r][0][1], stripped[r][0][1]), r)


if __name__ == "__main__":
    unittest.main()
