"""Comm hook state in checkpoints (DistributedDataParallel.comm_hook_state_dict /
load_comm_hook_state_dict) at 2 ranks (threads of a `local` world): a run of Braid's PowerSGD
(saved inside and after its uncompressed warm-up) or int8 hook with torch SGD (momentum), saved
after step k with torch.save (model, optimizer and hook state, per rank) and resumed in a new
world, model, wrapper and optimizer loaded with torch.load, takes the steps after k bit for bit
as the uninterrupted run; without the hook state it does not. Another rank's state is refused by
name, or skipped with restart_hook=True."""

import io
import unittest

import torch

import braid
from braid import comm_hooks
from braid import pytorch as bt
from rank_threads import TIMEOUT_MS, run_ranks
from comm_hook_test import N, Net, _batch

STEPS = 6


def _hook(kind):
    if kind == "powersgd":
        return comm_hooks.powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   random_seed=3)
    return comm_hooks.int8(block=8)


def _run(kind, start, stop, ckpt=None, load_hook=True):
    """Steps [start, stop) in a new world; from `ckpt` (per-rank bytes) when given. Returns
    (per rank: the parameters after each step, the checkpoint bytes at the end)."""
    world = braid.World("local", local_ranks=N, timeout_ms=TIMEOUT_MS, read_env=False)

    def body(r, g):
        net = Net()
        model = bt.DistributedDataParallel(net, group=g, bucket_cap_mb=1e-3)
        model.register_comm_hook(None, _hook(kind))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if ckpt is not None:
            saved = torch.load(io.BytesIO(ckpt[r]))
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optim"])
            if load_hook:
                model.load_comm_hook_state_dict(saved["comm_hook"])
        seen = []
        for step in range(start, stop):
            x, y = _batch(r, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            seen.append([p.detach().clone() for p in net.parameters()])
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                    "comm_hook": model.comm_hook_state_dict()}, buf)
        model.close()
        return seen, buf.getvalue()
    try:
        return run_ranks(N, body, world)
    finally:
        world.close()


class HookCheckpointTest(unittest.TestCase):
    def _check(self, kind, k):
        whole = _run(kind, 0, STEPS)
        first = _run(kind, 0, k)
        ckpt = [b for _, b in first]
        resumed = _run(kind, k, STEPS, ckpt)
        fresh = _run(kind, k, STEPS, ckpt, load_hook=False)
        for r in range(N):
            for s in range(k, STEPS):
                for a, b in zip(resumed[r][0][s - k], whole[r][0][s]):
                    self.assertTrue(torch.equal(a, b), (kind, k, r, s, (a - b).abs().max()))
            differs = any(not torch.equal(a, b) for s in range(k, STEPS)
                          for a, b in zip(fresh[r][0][s - k], whole[r][0][s]))
            self.assertTrue(differs, "a fresh hook repeats the run: the test cannot fail")
        return ckpt

    def test_powersgd_after_warm_up(self):
        self._check("powersgd", 4)

    def test_powersgd_inside_warm_up(self):
        self._check("powersgd", 1)

    def test_int8(self):
        ckpt = self._check("int8", 3)
        # Rank 1 loading rank 0's state: refused by name, or skipped with restart_hook=True.
        world = braid.World("local", local_ranks=N, timeout_ms=TIMEOUT_MS, read_env=False)

        def body(r, g):
            model = bt.DistributedDataParallel(Net(), group=g, bucket_cap_mb=1e-3)
            model.register_comm_hook(None, _hook("int8"))
            other = torch.load(io.BytesIO(ckpt[1 - r]))["comm_hook"]
            with self.assertRaisesRegex(ValueError, "saved by rank %d of 2; this is rank %d" %
                                        (1 - r, r)):
                model.load_comm_hook_state_dict(other)
            model.load_comm_hook_state_dict(other, restart_hook=True)
            with self.assertRaisesRegex(ValueError, "state is of hook 'int8'; this model's hook "
                                        "is 'powersgd'"):
                model._comm_hook = _hook("powersgd")
                model.load_comm_hook_state_dict(other)
            model.close()
        try:
            run_ranks(N, body, world)
        finally:
            world.close()


if __name__ == "__main__":
    unittest.main()
