"""torch DDP's idioms on braid.pytorch.DistributedDataParallel, each against torch 1.13's own
DistributedDataParallel (gloo) run beside it in the same process (ranks are threads: Braid's
`local` world and one torch ProcessGroupGloo per thread over a shared HashStore), bit for bit:

  - torch's signature (device_ids, output_device, process_group, check_reduction, ...) and the
    older (module, group, mode) form give torch's gradients; bad arguments are refused by
    their Python names, as torch refuses them;
  - unused parameters: .grad None where torch leaves None (unused on every rank), the
    averaged gradient where some rank used them, through set_to_none / in-place zeroing /
    accumulation / no_sync, with gradient_as_bucket_view False and True, and static_graph;
    held gradients and detach_() as torch;
  - a buffer changed after construction is rank 0's from the first forward on;
  - pickling (torch.save / torch.load, copy.deepcopy) over the default group, refused
    otherwise; a default world hosting several ranks asks for group=;
  - wrapping twice, and models that differ across ranks (also in a 2x2 hybrid mesh), are
    clean errors on every rank before any broadcast.
tests/python/torch_idioms_ddp_mpi.py covers what needs one process per rank (torch
ProcessGroups made by torch.distributed, mapped onto Braid's world)."""

import copy
import datetime
import io
import os
import subprocess
import sys
import unittest
import warnings

import torch
import torch.distributed as dist

import braid
from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2


class Net(torch.nn.Module):
    """a -> (b when use_b) -> c, plus d (never used) and a buffer added to the output."""

    def __init__(self, out=2):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(5)
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            self.c, self.d = torch.nn.Linear(4, out), torch.nn.Linear(4, 2)
        self.register_buffer("shift", torch.zeros(out))

    def forward(self, x, use_b=False):
        h = torch.tanh(self.a(x))
        if use_b:
            h = h + self.b(h)
        return self.c(h) + self.shift


def _batch(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


class TorchGroups:
    """One torch ProcessGroupGloo per rank thread over a shared in-process store. It also
    keeps the groups and the torch DDP wrappers made in rank threads alive until the test's
    main thread drops it: torch's pybind objects destroyed by two rank threads at once abort
    the process now and then ("pybind11_object_dealloc(): Tried to deallocate unregistered
    instance"), which a torch user with one rank per process never meets."""

    def __init__(self, tag):
        self._store, self._tag, self._kept = dist.HashStore(), tag, []

    def group(self, r):
        return self.keep(dist.ProcessGroupGloo(dist.PrefixStore(self._tag, self._store), r, N,
                                               datetime.timedelta(seconds=60)))

    def keep(self, obj):
        self._kept.append(obj)  # list.append is atomic under the GIL
        return obj


# Per step: which ranks use b, how the gradients are reset after the step ("none":
# zero_grad(set_to_none=True), "zero": in place, "keep": accumulate, "mine": each rank sets
# its own p.grad values), no_sync window or not. Rank 0 alone uses b at step 0 (averaged);
# no rank at steps 1-4 (.grad untouched: None after set_to_none, each rank's own values
# after "mine"); d is never used (None throughout).
SCHEDULE = [((True, False), "none", False), ((False, False), "zero", False),
            ((False, False), "keep", False), ((False, False), "none", True),
            ((True, True), "mine", False), ((False, False), "zero", False),
            ((True, True), "zero", False)]


def _train(r, wrap, schedule=SCHEDULE, detach=False):
    """SGD with momentum and weight decay (a zero gradient moves a parameter, None does
    not) over `schedule`; rank r's buffer is changed after construction. Returns per step the
    gradients, the buffer after the forward, and finally the parameters and the gradient
    tensors held since step 0."""
    net = Net()
    model = wrap(net)
    net.shift.fill_(float(r + 1))  # after construction: torch broadcasts at the first forward
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    seen, held = [], None
    for step, (use_b, reset, window) in enumerate(schedule):
        x, y = _batch(r, step)
        if window:
            with model.no_sync():
                torch.nn.functional.mse_loss(model(x, use_b=use_b[r]), y).backward()
            x, y = _batch(r, step + 50)
        torch.nn.functional.mse_loss(model(x, use_b=use_b[r]), y).backward()
        seen.append((_grads(net), net.shift.clone()))
        if held is None:
            held = [p.grad for p in net.parameters()]
        opt.step()
        if detach:
            for p in net.parameters():
                if p.grad is not None:
                    p.grad.detach_()
        if reset == "mine":
            for p in net.parameters():
                p.grad = torch.full_like(p, float(r + 1))
        elif reset != "keep":
            opt.zero_grad(set_to_none=reset == "none")
    out = (seen, [p.detach().clone() for p in net.parameters()],
           [None if g is None else g.clone() for g in held])
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return out


class Compare(unittest.TestCase):
    def assert_same(self, got, want, where):
        if want is None:
            self.assertIsNone(got, where)
        elif isinstance(want, torch.Tensor):
            self.assertIsNotNone(got, where)
            self.assertTrue(torch.equal(got, want), "%s: %s vs torch %s" % (where, got, want))
        else:
            self.assertEqual(len(got), len(want), where)
            for k, (g, w) in enumerate(zip(got, want)):
                self.assert_same(g, w, "%s[%d]" % (where, k))

    def against_torch(self, braid_kwargs, torch_kwargs, **train):
        pgs = TorchGroups("against_torch")
        ref = run_ranks(N, lambda r, g: _train(r, lambda net: (
            pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, process_group=pgs.group(r), **torch_kwargs))), **train))
        got = run_ranks(N, lambda r, g: _train(
            r, lambda net: bt.DistributedDataParallel(net, group=g, **braid_kwargs), **train))
        self.assert_same(got, ref, "ranks")
        return got


class UnusedGradTest(Compare):
    def test_unused_parameters_end_backward_as_torch_leaves_them(self):
        for view in (False, True):
            with self.subTest(gradient_as_bucket_view=view):
                kwargs = dict(find_unused_parameters=True, gradient_as_bucket_view=view)
                got = self.against_torch(kwargs, kwargs)
                seen = got[0][0]
                self.assertIsNone(seen[0][0][6])     # d.weight: no rank ever used it
                self.assertIsNotNone(seen[0][0][2])  # b.weight: rank 0 used it at step 0
                self.assertIsNone(seen[1][0][2])     # step 1: unused after set_to_none

    def test_detach_and_static_graph(self):
        kwargs = dict(find_unused_parameters=True)
        self.against_torch(kwargs, kwargs, detach=True)
        static = [((False, False), "none", False), ((False, False), "zero", False),
                  ((False, False), "none", True)]
        self.against_torch(dict(static_graph=True), dict(static_graph=True), schedule=static)


class _NoGrad(torch.autograd.Function):
    """Passes its input on; its backward returns None (an undefined gradient)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


class TwoOut(torch.nn.Module):
    """Outputs (a(x), b(x) + c(x)); c's gradient is undefined (_NoGrad)."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(7)
            self.a, self.b, self.c = (torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        return self.a(x), self.b(x) + _NoGrad.apply(self.c(x))


# Per step: which ranks' losses use output a, how the gradients are reset after the step
# (as SCHEDULE; b and c are always reached, c's gradient is always undefined).
HOOK_SCHEDULE = [((True, True), "keep"), ((False, False), "keep"), ((True, False), "none"),
                 ((False, False), "none"), ((False, True), "mine"), ((False, False), "zero"),
                 ((True, False), "keep"), ((False, False), "keep")]


def _train_outputs(r, wrap):
    """SGD with momentum and weight decay over HOOK_SCHEDULE; per step the gradients, then
    the parameters."""
    net = TwoOut()
    model = wrap(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    seen = []
    for step, (use_a, reset) in enumerate(HOOK_SCHEDULE):
        a, b = model(_batch(r, step)[0])
        (b.sum() + (a.sum() if use_a[r] else 0)).backward()
        seen.append(_grads(net))
        opt.step()
        if reset == "mine":  # each rank its own values: kept exactly where no rank uses them
            for p in net.parameters():
                p.grad = torch.full_like(p, float(r + 1))
        elif reset != "keep":
            opt.zero_grad(set_to_none=reset == "none")
    out = seen, [p.detach().clone() for p in net.parameters()]
    if isinstance(model, bt.DistributedDataParallel):
        model.close()
    return out


class UnusedByHookTest(Compare):
    """"Used" as torch's local_used_map: reached by the outputs and .grad defined at the end.
    An output the loss ignores and a custom Function returning None leave a None .grad None;
    a reached parameter with a value is averaged even where no rank's loss used it."""

    def test_outputs_the_loss_ignores_and_undefined_gradients(self):
        for view in (False, True):
            with self.subTest(gradient_as_bucket_view=view):
                kwargs = dict(find_unused_parameters=True, gradient_as_bucket_view=view)
                pgs = TorchGroups("hooks")
                ref = run_ranks(N, lambda r, g: _train_outputs(r, lambda net: pgs.keep(
                    torch.nn.parallel.DistributedDataParallel(
                        net, process_group=pgs.group(r), **kwargs))))
                got = run_ranks(N, lambda r, g: _train_outputs(
                    r, lambda net: bt.DistributedDataParallel(net, group=g, **kwargs)))
                self.assert_same(got, ref, "ranks")
                seen = got[0][0]
                self.assertIsNone(seen[0][4])       # c.weight: undefined gradients only
                self.assertIsNotNone(seen[1][0])    # a.weight: kept from step 0
                self.assertIsNone(seen[3][0])       # a: unused after set_to_none


    def test_backward_that_misses_the_module_leaves_grad_none(self):
        """functional_call with other tensors: the backward never reaches the wrapped
        module's parameters, whose .grad torch leaves None (also between forward and
        backward); a normal step after it gives torch's gradients."""
        pgs = TorchGroups("stateless")

        def body(r, wrap):
            net = TwoOut()
            model = wrap(net)
            x = _batch(r, 0)[0]
            swap = {"module.%s" % n: p.detach().clone().requires_grad_()
                    for n, p in net.named_parameters()}
            a, b = torch.nn.utils.stateless.functional_call(model, swap, (x,))
            between = _grads(net)
            b.sum().backward()
            out = [between, _grads(net), [t.grad for t in swap.values()]]
            a, b = model(x)
            (a.sum() + b.sum()).backward()
            out.append(_grads(net))
            if isinstance(model, bt.DistributedDataParallel):
                model.close()
            return out

        ref = run_ranks(N, lambda r, g: body(r, lambda net: pgs.keep(
            torch.nn.parallel.DistributedDataParallel(net, process_group=pgs.group(r)))))
        got = run_ranks(N, lambda r, g: body(
            r, lambda net: bt.DistributedDataParallel(net, group=g)))
        self.assert_same(got, ref, "ranks")
        self.assertIsNone(got[0][1][0])
        self.assertIsNotNone(got[0][3][0])


class SignatureTest(Compare):
    def test_torch_signature_variants_give_torch_gradients(self):
        pgs = TorchGroups("signature")

        def one_step(r, model, net):
            x, y = _batch(r, 0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            return _grads(net)

        def body(r, g):
            pg = pgs.group(r)
            net = Net()
            want = one_step(r, pgs.keep(torch.nn.parallel.DistributedDataParallel(
                net, None, None, 0, True, pg, 25, True)), net)
            out = []
            unused = dict(find_unused_parameters=True)  # d is never used
            for build in (lambda n: bt.DistributedDataParallel(n, g, **unused),  # older form
                          lambda n: bt.DistributedDataParallel(n, group=g, **unused),
                          lambda n: bt.DistributedDataParallel(
                              n, None, None, 0, True, g, 25, True, False, False, False),
                          lambda n: bt.DistributedDataParallel(
                              n, process_group=g, device_ids=[], find_unused_parameters=True)):
                net = Net()
                model = build(net)
                out.append(one_step(r, model, net))
                model.close()
            old = bt.DistributedDataParallel(Net(), g, "reduce_scatter")  # older 3rd argument
            mode = old._mode
            old.close()
            return want, out, mode

        for want, out, mode in run_ranks(N, body):
            self.assertEqual(mode, "reduce_scatter")
            for k, got in enumerate(out):
                self.assert_same(got, want, "variant %d" % k)

    def test_bad_arguments_are_named_as_torch_refuses_them(self):
        pgs = TorchGroups("bad")
        refused_by_torch = [dict(device_ids=[0]), dict(output_device=1),
                            dict(device_ids=[0, 1])]
        named = [(dict(device_ids=[0]), ValueError, "device_ids=\\[0\\]"),
                 (dict(output_device=1), ValueError, "output_device=1"),
                 (dict(device_ids=[0, 1]), ValueError, "only one device"),
                 (dict(bucket_cap_mb=-1), ValueError, "bucket_cap_mb=-1"),
                 (dict(first_bucket_cap_mb=0), ValueError, "first_bucket_cap_mb=0"),
                 (dict(timeout_ms=-5), ValueError, "timeout_ms=-5"),
                 (dict(mode="hybrid"), ValueError, "mode='hybrid' needs replica_group="),
                 (dict(reduce_dtype="int8"), ValueError, "reduce_dtype='int8'"),
                 (dict(timeline_prefix=3), TypeError, "timeline_prefix=3"),
                 (dict(process_group="world"), TypeError, "process_group= takes"),
                 (dict(replica_group="r", mode="hybrid"), TypeError, "replica_group= takes")]

        def body(r, g):
            pg = pgs.group(r)
            for kwargs in refused_by_torch:  # the reference: torch refuses these too
                with self.assertRaises(ValueError):
                    torch.nn.parallel.DistributedDataParallel(Net(), process_group=pg,
                                                              **kwargs)
            for kwargs, error, pattern in named:
                where = {} if "process_group" in kwargs else {"group": g}
                with self.assertRaisesRegex(error, pattern, msg=str(kwargs)):
                    bt.DistributedDataParallel(Net(), **where, **kwargs)
            with self.assertRaisesRegex(ValueError, "not both"):
                bt.DistributedDataParallel(Net(), group=g, process_group=g)
            with self.assertRaisesRegex(ValueError, "process_group=.*torch.distributed"):
                bt.DistributedDataParallel(Net(), process_group=pg)  # not init_process_group's
            frozen = Net().requires_grad_(False)
            with self.assertRaisesRegex(RuntimeError, "not needed"):  # torch's own error
                bt.DistributedDataParallel(frozen, group=g)

        run_ranks(N, body)


class WrapTest(unittest.TestCase):
    def test_a_wrapped_module_is_refused_at_construction(self):
        pgs = TorchGroups("wrap")

        def body(r, g):
            net = Net()
            inner = bt.DistributedDataParallel(net, group=g)
            with self.assertRaisesRegex(ValueError, "module itself is already a "
                                        "braid.pytorch.DistributedDataParallel"):
                bt.DistributedDataParallel(inner, group=g)
            with self.assertRaisesRegex(ValueError, "parameter '0.a.weight' of Sequential is "
                                        "already under another braid DistributedDataParallel"):
                bt.DistributedDataParallel(torch.nn.Sequential(net), group=g)
            self.assertFalse(inner.reducer.closed)
            # torch's idiom: the same module wrapped again (the earlier wrapper is dropped):
            # the earlier one is closed, so its hooks cannot reduce a second time.
            again = bt.DistributedDataParallel(net, group=g, find_unused_parameters=True)
            self.assertTrue(inner.reducer.closed)
            reference = copy.deepcopy(net)  # the broadcast weights, before any step
            x, y = _batch(r, 0)
            torch.nn.functional.mse_loss(again(x), y).backward()
            for rank in range(N):  # the average of every rank's gradient, serially
                xr, yr = _batch(rank, 0)
                torch.nn.functional.mse_loss(reference(xr), yr).backward()
            for p, q in zip(net.parameters(), reference.parameters()):
                # Reduced once, by the new wrapper (the closed one's hooks are gone).
                if q.grad is None:  # d: unused everywhere, None as torch leaves it
                    self.assertIsNone(p.grad)
                else:
                    torch.testing.assert_close(p.grad, q.grad / N)
            again.close()
            theirs = pgs.keep(torch.nn.parallel.DistributedDataParallel(
                Net(), process_group=pgs.group(r)))
            with self.assertRaisesRegex(ValueError, "torch.nn.parallel.distributed."
                                        "DistributedDataParallel"):
                bt.DistributedDataParallel(torch.nn.Sequential(theirs), group=g)

        run_ranks(N, body)


class SameModelTest(unittest.TestCase):
    def test_shapes_that_differ_are_named_on_every_rank(self):
        def body(r, g):
            with self.assertRaises(ValueError) as ctx:
                bt.DistributedDataParallel(Net(out=2 + r), group=g)
            return str(ctx.exception)

        for r, message in enumerate(run_ranks(N, body)):
            self.assertRegex(message, "parameter 'c.weight' has shape \\(%d, 4\\) float32 on "
                             "rank %d and shape \\(%d, 4\\) float32 on rank %d" %
                             (2 + r, r, 3 - r, 1 - r))

    def test_a_difference_in_one_shard_group_reaches_the_whole_mesh(self):
        world = braid.World("local", local_ranks=4, timeout_ms=20000, read_env=False)

        def body(r, g):
            shard, replica = g.mesh(2, 2)
            with self.assertRaises(ValueError) as ctx:
                bt.DistributedDataParallel(Net(out=3 if r == 3 else 2), group=shard,
                                           replica_group=replica, mode="hybrid")
            shard.close()
            replica.close()
            return str(ctx.exception)

        messages = run_ranks(4, body, world)
        world.close()
        self.assertTrue(any("'c.weight'" in m for m in messages), messages)


class DefaultGroupTest(unittest.TestCase):
    """This process's default world is local with one rank (no launcher)."""

    def test_params_to_ignore_are_left_alone(self):
        # torch's private API, as torch: not registered with the reducer (no hook, no bucket).
        # Against torch across ranks: torch_ddp_private_test.py.
        net = Net()
        bt.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["a.weight"])
        model = bt.DistributedDataParallel(net)
        try:
            self.assertEqual(model.parameters_to_ignore, ["a.weight"])
            reduced, _ = model._build_params_for_reducer()
            self.assertFalse(any(p is net.a.weight for p in reduced))
            self.assertEqual(len(reduced), len(list(net.parameters())) - 1)
        finally:
            model.close()

    def test_check_reduction_is_deprecated_as_in_torch(self):
        with self.assertWarnsRegex(UserWarning, "check_reduction"):
            bt.DistributedDataParallel(Net(), check_reduction=True,
                                       find_unused_parameters=True).close()

    def test_pickled_over_the_default_group_as_torch(self):
        net = Net()
        x, y = _batch(0, 0)
        torch.nn.functional.mse_loss(net(x), y).backward()
        want = _grads(net)
        net.zero_grad(set_to_none=True)
        model = bt.DistributedDataParallel(net, find_unused_parameters=True)
        self.assertIs(model.process_group, braid.default_group())
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        for loaded in (torch.load(buf), copy.deepcopy(model)):
            self.assertIsInstance(loaded, bt.DistributedDataParallel)
            self.assertTrue(loaded.find_unused_parameters)
            self.assertTrue(all(p.grad is None for p in loaded.parameters()))
            torch.nn.functional.mse_loss(loaded(x), y).backward()
            got = _grads(loaded.module)
            for g, w in zip(got, want):
                self.assertTrue((g is None and w is None) or torch.equal(g, w))
            loaded.close()
        model.close()

    def test_refused_over_another_group(self):
        def body(r, g):
            model = bt.DistributedDataParallel(Net(), group=g)
            with self.assertRaisesRegex(RuntimeError, "only over the default group"):
                torch.save(model, io.BytesIO())
            model.close()

        run_ranks(N, body)

    def test_a_default_world_of_several_ranks_asks_for_group(self):
        script = ("import torch, braid.pytorch as bt\n"
                  "try:\n    bt.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
                  "except ValueError as e:\n    print('refused:', e)\n")
        env = dict(os.environ, BRAID_LOCAL_RANKS="2")
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=120, check=True).stdout
        self.assertRegex(out, "refused: DistributedDataParallel: no group given, and Braid's "
                         "default world \\(backend 'local'\\) hosts ranks \\[0, 1\\].*pass group=")


if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.simplefilter("default")
    unittest.main()
