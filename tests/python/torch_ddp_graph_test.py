"""What torch 1.13 DDP checks about the autograd graph, on braid.pytorch.DistributedDataParallel
against torch's own DDP (gloo) beside it in the same process (ranks are threads, as in
torch_idioms_ddp_test.py):

  - a parameter that gets no gradient without find_unused_parameters: backward returns, the
    next forward with grad raises torch's error (and every later one), naming the parameter;
    the backward that caused it completed (used gradients averaged as torch's
    find_unused_parameters=True averages them); forwards under no_grad still work;
  - static_graph=True (and torch's private _set_static_graph()): a graph that changes is
    refused at torch's moments with torch's wording; a static one (nested outputs too)
    trains as torch's;
  - backward(create_graph=True): torch's reduced gradients, accumulated over steps;
  - torch.profiler sees Braid's collectives as "<backend>:all_reduce" ranges, one per bucket,
    async as torch's (begun where the bucket launches, ended where its completion is seen);
    by default both rebuild their buckets once after the first synced backward (torch's
    policy: not with find_unused_parameters), a "<backend>:broadcast" range each, and a
    model without buffers broadcasts nothing else.
"""

import os
import time
import unittest
import warnings

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks
from torch_idioms_ddp_test import N, Net, TorchGroups, _batch, _grads

PRIOR = "Expected to have finished reduction in the prior iteration before starting a new one."
CHANGED = "Your training graph has changed in this iteration"


def _pair(test, body):
    """body(r, wrap) on N rank threads, once with torch's DDP and once with Braid's; wrap(net,
    **kwargs) builds the wrapper. Returns (torch's results, Braid's results)."""
    pgs = TorchGroups(test.id())
    ref = run_ranks(N, lambda r, g: body(r, lambda net, **kw: pgs.keep(
        torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r), **kw))))

    def braid_rank(r, g):
        made = []
        out = body(r, lambda net, **kw: made.append(bt.DistributedDataParallel(
            net, group=g, **kw)) or made[-1])
        for model in made:
            model.close()
        return out

    return ref, run_ranks(N, braid_rank)


def _step(model, r, step, **forward):
    x, y = _batch(r, step)
    torch.nn.functional.mse_loss(model(x, **forward), y).backward()


def _error(fn):
    """The RuntimeError fn() raises, as a string ("" when it returns)."""
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return ""


class UnusedErrorTest(unittest.TestCase):
    def test_raised_at_the_next_forward_after_a_complete_reduction(self):
        def body(r, wrap, **kw):
            net = Net()  # d never used
            model = wrap(net, **kw)
            _step(model, r, 0)  # returns, as torch's
            grads = _grads(net)
            with torch.no_grad():
                evaluated = model(_batch(r, 1)[0])  # no check without grad
            errors = [_error(lambda: _step(model, r, 1 + k)) for k in range(2)]
            return grads, evaluated, errors

        ref, got = _pair(self, body)
        pgs = TorchGroups("find_unused")
        averaged = run_ranks(N, lambda r, g: body(r, lambda net, **kw: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r), **kw)),
            find_unused_parameters=True))
        for r in range(N):
            (grads, evaluated, errors), (tgrads, tevaluated, terrors) = got[r], ref[r]
            self.assertTrue(torch.equal(evaluated, tevaluated))
            for k, (g, want) in enumerate(zip(grads, averaged[r][0])):
                # used parameters: averaged, as torch's find_unused_parameters=True; d: its
                # zero gradient reduced (every bucket completed on every rank)
                self.assertTrue(torch.equal(g, torch.zeros_like(g) if want is None else want),
                                "rank %d parameter %d" % (r, k))
            for e, te in zip(errors, terrors):  # every later forward, as torch
                for part in (PRIOR, "`find_unused_parameters=True`",
                             "`forward` function outputs participate in calculating loss",
                             "Parameter indices which did not receive grad for rank %d: " % r,
                             "TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL"):
                    self.assertIn(part, te)
                    self.assertIn(part, e)
                self.assertIn("did not receive grad for rank %d: 2 3 6 7" % r, e)
                self.assertIn("did not receive grad for rank %d: b.weight, b.bias, d.weight, "
                              "d.bias" % r, e)

    def test_no_sync_and_find_unused_raise_nothing(self):
        def body(r, wrap):
            model = wrap(Net(), find_unused_parameters=True)
            for step in range(3):
                with model.no_sync():
                    _step(model, r, step)
                _step(model, r, step + 10)
            return _grads(model.module)

        ref, got = _pair(self, body)
        for g, want in zip(got, ref):
            self.assertEqual([None if t is None else t.tolist() for t in g],
                             [None if t is None else t.tolist() for t in want])


class ControlFlow(torch.nn.Module):
    """lin2 is used when use2 (torch's ControlFlowToyModel, input-independent)."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(3)
            self.lin1, self.lin2 = torch.nn.Linear(4, 2), torch.nn.Linear(2, 2)

    def forward(self, x, use2=False):
        h = torch.relu(self.lin1(x))
        return self.lin2(h) if use2 else h


class StaticGraphTest(unittest.TestCase):
    def test_a_graph_that_changes_is_refused_as_torch(self):
        def body(r, wrap, first):
            model = wrap(ControlFlow(), static_graph=True)
            _step(model, r, 0, use2=first)
            changed = _error(lambda: _step(model, r, 1, use2=not first))
            return changed, _error(lambda: _step(model, r, 2, use2=first))

        for first in (False, True):  # unused, then used / used, then unused
            ref, got = _pair(self, lambda r, wrap: body(r, wrap, first))
            for (changed, after), (tchanged, tafter) in zip(got, ref):
                # torch raises in the backward when an unused parameter gets used, else not
                self.assertEqual(CHANGED in changed, CHANGED in tchanged, (changed, tchanged))
                self.assertEqual(CHANGED in changed, not first)
                if first:
                    self.assertEqual(changed, "")
                want = ("Expected to have finished reduction in the prior iteration before "
                        "starting a new one. This error indicates that your training graph has "
                        "changed in this iteration, e.g., one parameter is used in first "
                        "iteration, but then got unused in the second iteration. this is not "
                        "compatible with static_graph set to True.\nParameter indices which "
                        "did not receive grad for")
                self.assertIn(want, tafter)
                self.assertIn(want, after)

    def test_static_graph_and_set_static_graph_train_as_torch(self):
        def body(r, wrap, private):
            net = ControlFlow()
            model = wrap(net) if private else wrap(net, static_graph=True)
            if private:
                model._set_static_graph()  # torch's private API, before the first forward
            out = []
            for step in range(4):
                _step(model, r, step)  # lin2 never used: None, as torch
                out.append(_grads(net))
                torch.optim.SGD(net.parameters(), lr=0.1).step()
                net.zero_grad(set_to_none=step % 2 == 0)
            return out, [p.detach().clone() for p in net.parameters()]

        for private in (False, True):
            ref, got = _pair(self, lambda r, wrap: body(r, wrap, private))
            for (grads, params), (tgrads, tparams) in zip(got, ref):
                self.assertEqual(repr(grads), repr(tgrads))
                self.assertTrue(all(torch.equal(p, t) for p, t in zip(params, tparams)))

    def test_nested_outputs_under_static_graph_as_torch(self):
        """What torch's test_ddp_static_graph_nested_types means to cover (it wraps its DDP
        again by a slip, which Braid refuses by name)."""
        class Nested(torch.nn.Module):
            def __init__(self):
                super().__init__()
                with INIT_LOCK:
                    torch.manual_seed(11)
                    self.lin = torch.nn.Linear(4, 2, bias=False)

            def forward(self, x):
                return {"a": self.lin(x), "b": (self.lin(x), [self.lin(x) * 2])}

        def body(r, wrap):
            net = Nested()
            model = wrap(net, static_graph=True)
            out = []
            for step in range(3):
                y = model(_batch(r, step)[0])
                (y["a"].sum() + y["b"][0].sum() + y["b"][1][0].sum()).backward()
                out.append(net.lin.weight.grad.clone())
                net.zero_grad()
            return out

        ref, got = _pair(self, body)
        for g, t in zip(got, ref):
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(g, t)))

    def test_set_static_graph_after_training_is_refused(self):
        def body(r, wrap):
            model = wrap(Poly())
            model(torch.ones(3)).backward()
            return _error(model._set_static_graph)

        for late in sum(_pair(self, body), []):
            self.assertIn("should be called before training loop starts", late)


class Poly(torch.nn.Module):
    """One parameter (torch DDP's create_graph=True fails on models with more: an in-place
    error on a leaf, then an internal assert)."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

    def forward(self, x):
        return (self.p * x).pow(2).sum()


def _create_graph_steps(model, r, steps=3, create_graph=True):
    """Gradients after each of `steps` accumulating backwards (torch's test_ddp_create_graph)."""
    out = []
    for step in range(steps):
        x, y = _batch(r, step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if isinstance(model.module, Poly):
                loss = model(x[0, :3])
            else:
                loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward(create_graph=create_graph)
        out.append([None if p.grad is None else p.grad.detach().clone()
                    for p in model.parameters()])
    return out


class CreateGraphTest(unittest.TestCase):
    def assert_close(self, got, want, where):
        for step, (g, t) in enumerate(zip(got, want)):
            for k, (a, b) in enumerate(zip(g, t)):
                if b is None:
                    self.assertIsNone(a, "%s step %d parameter %d" % (where, step, k))
                    continue
                self.assertTrue(torch.allclose(a, b, rtol=0, atol=1e-6),
                                "%s step %d parameter %d: %s vs %s" % (where, step, k, a, b))

    def test_reduced_gradients_as_torch(self):
        for view in (False, True):
            ref, got = _pair(self, lambda r, wrap: (
                _create_graph_steps(wrap(Poly(), gradient_as_bucket_view=view), r)))
            for r in range(N):
                self.assert_close(got[r], ref[r], "view=%s rank %d" % (view, r))
                self.assertTrue(all(p.abs().sum() > 0 for p in got[r][-1]))

    def test_several_parameters_as_a_plain_backward(self):
        def body(r, g, create_graph):
            model = bt.DistributedDataParallel(Net(), group=g, find_unused_parameters=True)
            out = _create_graph_steps(model, r, create_graph=create_graph)
            model.close()
            return out

        plain = run_ranks(N, lambda r, g: body(r, g, False))
        graph = run_ranks(N, lambda r, g: body(r, g, True))
        for r in range(N):
            self.assert_close(graph[r], plain[r], "rank %d" % r)


class ProfilerTest(unittest.TestCase):
    def test_collectives_are_profiled_as_torch_names_them(self):
        def body(r, wrap):
            model = wrap(Net(), find_unused_parameters=True)
            _step(model, r, 0)  # outside the profiler: nothing recorded
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for step in range(3):
                    _step(model, r, 1 + step)
                time.sleep(0.2)  # torch's last range may end on gloo's thread after backward
            _step(model, r, 9)
            counts = {}
            for e in prof.events():
                for kind in ("all_reduce", "search_unused_parameters"):
                    if e.name.endswith(kind):
                        counts[kind] = counts.get(kind, 0) + 1
                        if kind == "all_reduce":
                            counts["name"] = e.name
            return counts

        ref, got = _pair(self, body)
        for counts, tcounts in zip(got, ref):
            # per step: the bucket (one) and the used-map agreement
            self.assertEqual(tcounts, {"all_reduce": 6, "search_unused_parameters": 3,
                                       "name": "gloo:all_reduce"})
            self.assertEqual(counts, dict(tcounts, name="local:all_reduce"))

    def test_ranges_are_async_and_the_default_rebuild_broadcasts_as_torch(self):
        def body(r, wrap, **kwargs):
            with INIT_LOCK:
                torch.manual_seed(5)
                net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                                          torch.nn.Linear(4, 2))  # no buffer
            model = wrap(net, **kwargs)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for step in range(4):
                    _step(model, r, step)
                # torch ends its last collective's range on gloo's thread, possibly after the
                # backward returned: let it land before the profiler stops (Braid's ranges
                # have all ended when the backward returns).
                time.sleep(0.2)
            counts = {"async": 0}
            for e in prof.events():
                kind = e.name.rsplit(":", 1)[-1]
                if kind in ("all_reduce", "broadcast"):
                    counts[kind] = counts.get(kind, 0) + e.count
                    # (Braid's rebuild broadcast runs inside the call: not async)
                    counts["async"] += int(e.is_async and kind == "all_reduce")
            counts["rebuilt"] = model._get_ddp_logging_data()["has_rebuilt_buckets"]
            return counts, _grads(net)

        for kwargs, want in (({}, {"all_reduce": 4, "broadcast": 1, "async": 4, "rebuilt": 1}),
                             ({"find_unused_parameters": True},
                              # a bucket and the used-map agreement per step, no rebuild
                              {"all_reduce": 8, "async": 8, "rebuilt": 0})):
            ref, got = _pair(self, lambda r, wrap: body(r, wrap, **kwargs))
            for r, ((counts, grads), (tcounts, tgrads)) in enumerate(zip(got, ref)):
                self.assertEqual(counts, want, kwargs)
                if "broadcast" in want:  # torch broadcasts the bucket sizes too
                    self.assertGreaterEqual(tcounts.pop("broadcast"), want["broadcast"])
                    tcounts["broadcast"] = want["broadcast"]
                self.assertEqual(tcounts, want, kwargs)
                for k, (g, t) in enumerate(zip(grads, tgrads)):
                    self.assertTrue(torch.equal(g, t), "rank %d gradient %d" % (r, k))


if __name__ == "__main__":
    unittest.main()
