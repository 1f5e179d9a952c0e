"""DistributedDataParallel(broadcast_buffers=...) on the `local` backend (ranks are threads): a
BatchNorm's running statistics at the start and end of every forward, on every rank, equal a
serial simulation of torch DDP's rule (rank 0's buffers are broadcast before each forward that
follows a synced forward with grad; not after a no_sync() or torch.no_grad() forward), bit for
bit; with broadcast_buffers=False each rank keeps its own statistics."""

import contextlib
import copy
import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

# The forwards of the run: "sync" (grad, then backward), "no_sync" (grad, backward inside
# no_sync()), "no_grad" (a forward under torch.no_grad(), BatchNorm still in train mode).
SCHEDULE = ["sync", "sync", "no_sync", "sync", "no_grad", "sync", "sync"]


def _net():
    with INIT_LOCK:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                                   torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batch(r, step):
    g = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(8, 6, generator=g) * (1 + r), torch.randn(8, 3, generator=g)


def _buffers(module):
    return [b.detach().clone() for b in module.buffers()]


def _simulate(n, broadcast):
    """Per rank, per step: (buffers at the start of the forward, buffers after it), computed
    serially with plain torch modules and torch DDP's rule."""
    net = _net()
    post = [_buffers(net)] * n
    sync_next = False  # construction broadcast rank 0's already
    out = [[] for _ in range(n)]
    for step, kind in enumerate(SCHEDULE):
        starts = [post[0] if broadcast and sync_next else post[r] for r in range(n)]
        for r in range(n):
            m = copy.deepcopy(net)
            for b, v in zip(m.buffers(), starts[r]):
                b.copy_(v)
            with torch.no_grad():
                m(_batch(r, step)[0])
            out[r].append((starts[r], _buffers(m)))
        post = [out[r][-1][1] for r in range(n)]
        sync_next = kind == "sync"
    return out


def _run(r, g, broadcast, hybrid):
    groups = g.mesh(2, 2) if hybrid else (g, None)
    net = _net()
    model = bt.DistributedDataParallel(net, groups[0], replica_group=groups[1],
                                       mode="hybrid" if hybrid else "allreduce",
                                       broadcast_buffers=broadcast)
    starts = []
    hook = net.register_forward_pre_hook(lambda m, i: starts.append(_buffers(m)))
    seen = []
    for step, kind in enumerate(SCHEDULE):
        x, y = _batch(r, step)
        if kind == "no_grad":
            with torch.no_grad():
                model(x)
        else:
            with model.no_sync() if kind == "no_sync" else contextlib.nullcontext():
                torch.nn.functional.mse_loss(model(x), y).backward()
        seen.append((starts[-1], _buffers(net)))
    hook.remove()
    model.close()
    for grp in groups:
        if grp is not None and grp is not g:
            grp.close()
    return seen


class BroadcastBuffersTest(unittest.TestCase):
    def _check(self, n, broadcast, hybrid=False):
        want = _simulate(n, broadcast)
        got = run_ranks(n, lambda r, g: _run(r, g, broadcast, hybrid))
        for r in range(n):
            for step, ((ws, we), (gs, ge)) in enumerate(zip(want[r], got[r])):
                for what, a, b in (("start", ws, gs), ("end", we, ge)):
                    for i, (x, y) in enumerate(zip(a, b)):
                        self.assertTrue(torch.equal(x, y), "rank %d step %d (%s) %s of "
                                        "buffer %d" % (r, step, SCHEDULE[step], what, i))
        return got

    def test_rank0_statistics_before_each_forward_after_a_synced_one(self):
        got = self._check(2, True)
        # The rule matters here: ranks start step 1 alike, step 3 (after no_sync) apart.
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got[0][1][0], got[1][1][0])))
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(got[0][3][0], got[1][3][0])))

    def test_off_keeps_each_ranks_statistics(self):
        got = self._check(2, False)
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(got[0][1][0], got[1][1][0])))

    def test_hybrid_2x2_broadcasts_rank0s_everywhere(self):
        self._check(4, True, hybrid=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
