"""torch 1.13 DDP's private API on Braid's DistributedDataParallel (braid/_ddp_ignore.py,
_ddp_introspect.py, _buffer_hook.py) against torch's own DDP (gloo) in the same process
(ranks are threads), with the same model, data and calls: parameters and buffers to ignore
(shapes that differ across ranks), reducer._get_local_used_map() / _ddp_graph_static()
under control flow, and a buffer hook that all-reduces the buffers after the forward."""

import unittest

import torch
import torch.distributed as dist
from torch.nn.parallel.distributed import _BufferCommHookLocation

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from torch_idioms_ddp_test import TorchGroups

N = 2
STEPS = 4


class Net(torch.nn.Module):
    """fc2 and its buffer differ in shape across ranks (ignored); `skip` leaves fc1 unused."""

    def __init__(self, r):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(5 + r)  # different on each rank: the broadcast makes them equal
            self.fc1, self.fc2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3 + r)
            self.norm = torch.nn.BatchNorm1d(4)
        self.fc2.register_buffer("odd", torch.zeros(2 + r))

    def forward(self, x, skip=False):
        h = x if skip else self.fc1(x)
        return self.norm(h).sum() + self.fc2(x).sum() * 0.5


def _run(r, wrap, step_fn):
    net = Net(r)
    wrap.ignore(net, ["fc2.weight", "fc2.bias", "fc2.odd"])
    model = wrap(net, r)
    seen = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(10 * r + step)
        x = torch.randn(6, 4, generator=g)
        seen.append(step_fn(model, net, x, step))
        for p in net.parameters():
            p.grad = None
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return seen


class PrivateApiTest(unittest.TestCase):
    def same(self, got, want):
        for step, (g, w) in enumerate(zip(got, want)):
            for k, (a, b) in enumerate(zip(g, w)):
                self.assertTrue(torch.equal(a, b), "step %d item %d: %s vs %s" % (step, k, a, b))

    def against_torch(self, tag, step_fn, **kwargs):
        pgs = TorchGroups("private_" + tag)

        def torch_wrap(net, r):
            net.pg = pgs.group(r)  # the group the step's own collectives use
            return pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, process_group=net.pg, **kwargs))
        torch_wrap.ignore = torch.nn.parallel.DistributedDataParallel. \
            _set_params_and_buffers_to_ignore_for_model
        ref = run_ranks(N, lambda r, g: _run(r, torch_wrap, step_fn))

        hook_pgs = TorchGroups("private_%s_hook" % tag)

        def braid_wrap(net, r):
            net.pg = hook_pgs.group(r)
            return bt.DistributedDataParallel(net, group=braid_wrap.groups[r], **kwargs)
        braid_wrap.ignore = bt.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model
        braid_wrap.groups = {}

        def braid_rank(r, g):
            braid_wrap.groups[r] = g
            return _run(r, braid_wrap, step_fn)
        got = run_ranks(N, braid_rank)
        for r in range(N):
            self.same(got[r], ref[r])
        return got

    def test_ignored_parameters_and_used_map(self):
        def step(model, net, x, k):
            model(x, skip=k % 2 == 1).backward()
            used = model.reducer._get_local_used_map().clone()
            static = torch.tensor([model.reducer._ddp_graph_static()])
            return ([p.grad.clone() for p in (net.fc1.weight, net.norm.weight) if
                     p.grad is not None] + [net.fc2.weight.grad.clone(), used, static,
                                            net.norm.running_mean.clone()])
        got = self.against_torch("ignore", step, find_unused_parameters=True)
        self.assertEqual(got[0][1][-3].tolist(), [0, 0, 2, 2])  # fc1 unused at step 1
        self.assertFalse(bool(got[0][-1][-2]))  # the unused set changed: not static

    def test_buffer_hook_after_forward(self):
        def hook(pg, named):
            return [dist.all_reduce(b, group=pg, async_op=True).get_future()
                    for b in named.values()]

        def step(model, net, x, k):
            if k == 0:
                model._register_buffer_comm_hook(net.pg, hook,
                                                  _BufferCommHookLocation.POST_FORWARD)
            model(x).backward()
            return [net.norm.running_mean.clone(), net.norm.running_var.clone(),
                    net.fc1.weight.grad.clone()]
        got = self.against_torch("buffer_hook", step)
        self.assertFalse(torch.equal(got[0][1][0], got[0][0][0]), "the hook changed nothing")


if __name__ == "__main__":
    unittest.main()
