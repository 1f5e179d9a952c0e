"""torch's idioms around ShardedAdamW / ShardedSGD on the `local` backend (ranks are threads),
each against torch itself in this process (torch.optim.AdamW trained serially on the mean of
the ranks' losses, torch.nn.utils.clip_grad_norm_ on it) or refused with an error naming the
idiom and the fix: torch's optimizer signature (parameters, groups; the wrapper found through
them), p.grad after backward (ZeRO-2, a torch optimizer on reduce_scatter, fully sharded),
clip_grad_norm_ and the logged gradient norm, parameters written after the optimizer exists
(fine-tuning order), parameters read right after step(), and unused parameters."""

import io
import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2  # ranks
STEPS = 3
MAX_NORM = 0.2  # below every step's norm here, so the clipping changes every step


def _net(seed=5, width=8):
    with INIT_LOCK:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.Tanh(),
                                   torch.nn.Linear(width, 3))


def _data(r, step, width=6):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(4, width, generator=g), torch.randn(4, 3, generator=g)


def _loss(model, r, s):
    x, y = _data(r, s)
    return torch.nn.functional.mse_loss(model(x), y)


def _groups(net):
    return [{"params": [net[0].weight, net[2].weight], "weight_decay": 0.1},
            {"params": [net[0].bias, net[2].bias], "weight_decay": 0.0, "lr": 0.02}]


def _ddp(net, g, **kwargs):
    return bt.DistributedDataParallel(net, g, mode="reduce_scatter", bucket_cap_mb=1e-4,
                                      first_bucket_cap_mb=1e-5, **kwargs)


def _fsdp(net, g):
    return bt.FullyShardedDataParallel(net, g, units=[net[0]], bucket_cap_mb=1e-4)


def _reference(groups=False, clip=None, writes=None, steps=STEPS):
    """torch's serial run: AdamW(lr=0.01) on the mean of the ranks' losses; clip: max_norm of
    torch.nn.utils.clip_grad_norm_ before each step (its norms returned); writes(net, step)
    runs after each step. Returns (parameters, norms)."""
    net = _net()
    opt = torch.optim.AdamW(_groups(net) if groups else net.parameters(), lr=0.01)
    if writes:
        writes(net, -1)
    norms = []
    for s in range(steps):
        (sum(_loss(net, r, s) for r in range(N)) / N).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip)))
        else:
            norms.append(float(torch.norm(torch.stack([p.grad.norm() for p in
                                                       net.parameters()]))))
        opt.step()
        opt.zero_grad()
        if writes:
            writes(net, s)
    return [p.detach().clone() for p in net.parameters()], norms


def _values(net, model, opt):
    if isinstance(model, bt.FullyShardedDataParallel):
        opt.step()  # ends the step's units (a no-op otherwise)
        with model.summon_full_params():
            return [p.detach().clone() for p in net.parameters()]
    return [p.detach().clone() for p in net.parameters()]


class Case(unittest.TestCase):
    def assertClose(self, got, want, atol=1e-6):
        for i, (a, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, w, rtol=0, atol=atol, msg=lambda m: "param %d: %s" % (i, m))


class SignatureTest(Case):
    def test_parameters_and_groups_find_their_wrapper(self):
        forms = {
            "parameters": (False, lambda net, model: bt.ShardedAdamW(net.parameters(), lr=0.01)),
            "keyword": (False, lambda net, model: bt.ShardedAdamW(params=model.parameters(),
                                                                  lr=0.01)),
            "groups": (True, lambda net, model: bt.ShardedAdamW(_groups(net), lr=0.01)),
            "model": (True, lambda net, model: bt.ShardedAdamW(model, lr=0.01,
                                                               params=_groups(net))),
        }

        def body(r, g, make):
            net = _net()
            model = _ddp(net, g)
            opt = make(net, model)
            for s in range(STEPS):
                _loss(model, r, s).backward()
                opt.step()
            got = _values(net, model, opt)
            opt.close()
            model.close()
            return got

        want = {grouped: _reference(groups=grouped)[0] for grouped in (False, True)}
        for name, (grouped, make) in forms.items():
            for got in run_ranks(N, lambda r, g, m=make: body(r, g, m)):
                with self.subTest(form=name):
                    self.assertClose(got, want[grouped])

    def test_errors_name_the_argument_and_the_fix(self):
        def body(r, g):
            net = _net()
            model = _ddp(net, g)
            other = _net()
            other_model = _ddp(other, g)
            loose = torch.nn.Linear(2, 2)
            allreduce_net = _net()
            allreduce = bt.DistributedDataParallel(allreduce_net, g)
            cases = [
                (lambda: bt.ShardedAdamW(loose.parameters()), ValueError,
                 r"ShardedAdamW\(params\): param_groups\[0\]\['params'\]\[0\] \(shape \(2, 2\)\) "
                 r"is not wrapped by Braid; wrap the model first"),
                (lambda: bt.ShardedAdamW(net), TypeError, "got a Sequential module that Braid "
                 r"does not wrap; .* pass model.parameters\(\)"),
                (lambda: bt.ShardedAdamW([]), ValueError, "params is an empty list"),
                (lambda: bt.ShardedAdamW(allreduce_net.parameters()), ValueError,
                 r"ShardedAdamW steps each rank's shard of a reduce-scatter, but these parameters"
                 r" are wrapped by DistributedDataParallel\(mode='allreduce'\): wrap the model "
                 r"with DistributedDataParallel\(net, mode='reduce_scatter'\) or use "
                 r"torch.optim.AdamW with an all-reduce model"),
                (lambda: bt.ShardedSGD(allreduce_net.parameters(), lr=0.1), ValueError,
                 "or use torch.optim.SGD with an all-reduce model"),
                (lambda: bt.ShardedAdamW(list(net.parameters()) + list(other.parameters())),
                 ValueError, r"param_groups\[0\]\['params'\]\[0\] .* belongs to a "
                 r"DistributedDataParallel and param_groups\[0\]\['params'\]\[4\] .* to another "
                 r"DistributedDataParallel; .* one optimizer per model"),
                (lambda: bt.ShardedAdamW(model, params=other.parameters()), ValueError,
                 r"ShardedAdamW\(model, params=...\): params belong to another"),
                (lambda: bt.ShardedSGD(net.parameters()), TypeError, "lr is required"),
            ]
            for make, kind, message in cases:
                with self.assertRaisesRegex(kind, message):
                    make()
            opt = bt.ShardedAdamW(net.parameters())  # the failed attempts left it free
            with self.assertRaisesRegex(NotImplementedError, r"ShardedAdamW.add_param_group\("
                                        r"param_group\): parameter groups are fixed at "
                                        r"construction .* pass every group to ShardedAdamW"):
                opt.add_param_group({"params": [loose.weight]})
            opt.close()
            for m in (model, other_model, allreduce):
                m.close()
            with self.assertRaisesRegex(ValueError, "is not wrapped by Braid"):
                bt.ShardedAdamW(net.parameters())  # a closed wrapper no longer owns them

            frozen = _net()
            frozen[2].bias.requires_grad_(False)
            model = _ddp(frozen, g)
            opt = bt.ShardedAdamW(frozen.parameters(), lr=0.1)  # torch's way: frozen listed
            before = frozen[2].bias.detach().clone()
            _loss(model, r, 0).backward()
            opt.step()
            self.assertTrue(torch.equal(frozen[2].bias, before))  # never stepped, as torch
            self.assertFalse(torch.equal(frozen[2].weight, _net()[2].weight))
            opt.close()
            model.close()

        run_ranks(1, body)

    def test_unused_parameters_are_accepted_the_reducer_agrees_on_use(self):
        # find_unused_parameters=True: the reducer agrees which parameters some rank used and
        # the optimizer skips the others as torch does (results: tests/python/divergent_test.py).
        def body(r, g):
            net = _net()
            model = _ddp(net, g, find_unused_parameters=True)
            opt = bt.ShardedAdamW(net.parameters())
            opt.close()
            model.close()
            net = _net()
            model = bt.FullyShardedDataParallel(net, g, find_unused_parameters=True)
            opt = bt.ShardedAdamW(net.parameters())
            opt.close()
            model.close()

        run_ranks(1, body)


class GradTest(Case):
    def test_zero2_grads_raise_on_read_and_nothing_changes(self):
        def body(r, g, idioms):
            net = _net()
            model = _ddp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            for s in range(STEPS):
                _loss(model, r, s).backward()
                if idioms:
                    with self.assertRaisesRegex(
                            RuntimeError, r"torch.nn.utils.clip_grad_norm_ reads p.grad of "
                            r"parameter '0.weight', but ShardedAdamW / ShardedSGD reduce only "
                            r"each rank's shard .* ShardedAdamW\(..., max_grad_norm=...\) and "
                            r"opt.clip_grad_norm_\(max_norm\)"):
                        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                    with self.assertRaisesRegex(RuntimeError, r"p.grad \(torch call norm\) reads "
                                                r"p.grad of parameter '2.bias'.*opt.grad_norm"):
                        net[2].bias.grad.norm()
                    self.assertIn("not readable", repr(net[0].weight.grad))
                    self.assertEqual(net[0].weight.grad.shape, (8, 6))
                    net.zero_grad()  # torch's own zeroing is allowed (after Braid's steps)
                opt.step()
            got = _values(net, model, opt)
            opt.close()
            model.close()
            return got

        for got, plain in zip(run_ranks(N, lambda r, g: body(r, g, True)),
                              run_ranks(N, lambda r, g: body(r, g, False))):
            for a, b in zip(got, plain):
                self.assertTrue(torch.equal(a, b))

    def test_torch_optimizer_on_reduce_scatter_raises_before_changing_anything(self):
        def body(r, g):
            net = _net()
            model = _ddp(net, g)
            before = [p.detach().clone() for p in net.parameters()]
            for make, name in ((lambda ps: torch.optim.AdamW(ps, lr=0.01), "AdamW"),
                               (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "SGD")):
                opt = make(model.parameters())
                _loss(model, r, 0).backward()
                with self.assertRaisesRegex(
                        RuntimeError, r"%s.step\(\) reads p.grad of parameter '0.weight', which "
                        r"holds this rank's unreduced gradient: .* ShardedAdamW\(model."
                        r"parameters\(\)\) .* mode='allreduce'" % name):
                    opt.step()
                opt.zero_grad()
            after = [p.detach().clone() for p in net.parameters()]
            model.close()
            return before, after

        for before, after in run_ranks(N, body):
            for a, b in zip(before, after):
                self.assertTrue(torch.equal(a, b))

    def test_fully_sharded_grad_is_detectable(self):
        def body(r, g):
            net = _net()
            model = _fsdp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            _loss(model, r, 0).backward()
            self.assertIsNotNone(net[0].weight.grad)  # torch's clip would skip None silently
            with self.assertRaisesRegex(RuntimeError, r"torch.nn.utils.clip_grad_norm_ reads "
                                        r"p.grad of parameter '.*', which is fully sharded"):
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            net.zero_grad()  # a no-op, as FullyShardedDataParallel.zero_grad
            opt.zero_grad(set_to_none=True)
            with self.assertRaisesRegex(ValueError, r"clip_grad_norm_\(max_norm=1\): .* pass "
                                        r"max_grad_norm=1 to ShardedAdamW"):
                model.clip_grad_norm_(1.0)
            opt.step()
            opt.close()
            model.close()

        run_ranks(N, body)


class NormTest(Case):
    def test_clip_grad_norm_matches_torch(self):
        want, want_norms = _reference(clip=MAX_NORM)
        unclipped = _reference()[0]
        self.assertTrue(all(n > MAX_NORM for n in want_norms), want_norms)

        def body(r, g, wrapper, overlap):
            net = _net()
            model = _ddp(net, g) if wrapper == "ddp" else _fsdp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01, max_grad_norm=MAX_NORM,
                                  overlap=overlap)
            norms = []
            for s in range(STEPS):
                _loss(model, r, s).backward()
                clip = model.clip_grad_norm_ if wrapper == "fsdp" else opt.clip_grad_norm_
                norm = clip(MAX_NORM)
                self.assertEqual(norm.dtype, torch.float32)
                norms.append((float(norm), opt.grad_norm()))
                opt.step()
            with self.assertRaisesRegex(ValueError, r"clip_grad_norm_\(max_norm=1\), but this "
                                        r"optimizer clips to max_grad_norm=0.2"):
                opt.clip_grad_norm_(1.0)
            with self.assertRaisesRegex(ValueError, r"norm_type=inf\): .* pass norm_type=2.0"):
                opt.clip_grad_norm_(MAX_NORM, norm_type=float("inf"))
            with self.assertRaisesRegex(ValueError, "error_if_nonfinite=True.*skip_nonfinite="
                                        "True"):
                opt.clip_grad_norm_(MAX_NORM, error_if_nonfinite=True)
            got = _values(net, model, opt)
            opt.close()
            model.close()
            return norms, got

        for wrapper, overlap in (("ddp", True), ("ddp", False), ("fsdp", True)):
            for norms, got in run_ranks(N, lambda r, g: body(r, g, wrapper, overlap)):
                with self.subTest(wrapper=wrapper, overlap=overlap):
                    for (norm, logged), w in zip(norms, want_norms):
                        self.assertAlmostEqual(norm, w, delta=1e-6 * w)
                        self.assertEqual(norm, float(torch.tensor(logged, dtype=torch.float32)))
                    self.assertClose(got, want)
                    # The clipping moved the result by far more than the tolerance.
                    self.assertGreater(max(float((a - u).abs().max())
                                           for a, u in zip(got, unclipped)), 1e-4)

    def test_track_grad_norm_logs_every_step_and_changes_nothing(self):
        _, want_norms = _reference()

        def body(r, g, track):
            net = _net()
            model = _ddp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01, track_grad_norm=track)
            norms = []
            for s in range(STEPS):
                _loss(model, r, s).backward()
                opt.step()
                if track:
                    norms.append(opt.grad_norm())
            if not track:
                with self.assertRaisesRegex(RuntimeError, r"grad_norm\(\): the norm is not "
                                            r"computed; pass track_grad_norm=True"):
                    opt.grad_norm()
            got = _values(net, model, opt)
            opt.close()
            model.close()
            return norms, got

        for (norms, got), (_, plain) in zip(run_ranks(N, lambda r, g: body(r, g, True)),
                                            run_ranks(N, lambda r, g: body(r, g, False))):
            for norm, w in zip(norms, want_norms):
                self.assertAlmostEqual(norm, w, delta=1e-6 * w)
            for a, b in zip(got, plain):
                self.assertTrue(torch.equal(a, b))


def _fine_tuning_writes(net, step):
    """What the fine-tuning script writes: pretrained weights once the optimizer exists
    (model.load_state_dict), then after step 0 a bias through p.data and a weight through
    torch.nn.init."""
    if step == -1:
        net.load_state_dict(_net(seed=9).state_dict())
    elif step == 0:
        net[2].bias.data.fill_(0.25)
        torch.nn.init.constant_(net[0].weight[0], 0.5)


class WritesTest(Case):
    def test_fine_tuning_order_matches_torch(self):
        want, _ = _reference(writes=_fine_tuning_writes)

        def body(r, g, overlap):
            net = _net()
            model = _ddp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01, overlap=overlap)
            _fine_tuning_writes(net, -1)
            for s in range(STEPS):
                _loss(model, r, s).backward()
                opt.step()
                _fine_tuning_writes(net, s)
            got = _values(net, model, opt)
            opt.close()
            model.close()
            return got

        for overlap in (True, False):
            for got in run_ranks(N, lambda r, g: body(r, g, overlap)):
                with self.subTest(overlap=overlap):
                    self.assertClose(got, want)

    def test_write_after_the_overlapped_step_raises_and_fsdp_refuses(self):
        def body(r, g):
            net = _net()
            model = _ddp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            _loss(model, r, 0).backward()
            net[0].bias.data.fill_(1.0)
            with self.assertRaisesRegex(RuntimeError, r"step\(\): parameter '0.bias' was "
                                        r"written after the forward .* write parameters after "
                                        r"step\(\)"):
                opt.step()
            opt.close()
            model.close()
            net = _net()
            model = _fsdp(net, g)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            with self.assertRaisesRegex(RuntimeError, "is released"):
                net.load_state_dict(_net(seed=9).state_dict())
            opt.close()
            model.close()

        run_ranks(N, body)


class StepTest(Case):
    def test_parameters_read_right_after_step_are_the_stepped_ones(self):
        """A model big enough that the stepper is still busy when backward returns: whatever
        is read right after step() (the parameters, model.state_dict(), torch.save) is what
        the finished step gathers."""
        def body(r, g):
            with INIT_LOCK:
                torch.manual_seed(3)
                net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                          torch.nn.Linear(256, 256))
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter", bucket_cap_mb=0.05)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            out = []
            for s in range(STEPS):
                x = torch.randn(4, 256, generator=torch.Generator().manual_seed(10 * r + s))
                model(x).square().mean().backward()
                opt.step()
                read = [p.detach().clone() for p in net.parameters()]
                saved = io.BytesIO()
                torch.save(model.state_dict(), saved)
                opt.synchronize()
                settled = [p.detach().clone() for p in net.parameters()]
                saved.seek(0)
                out.append((read, list(torch.load(saved).values()), settled))
            opt.close()
            model.close()
            return out

        for steps in run_ranks(N, body):
            for s, (read, saved, settled) in enumerate(steps):
                for a, b, c in zip(read, saved, settled):
                    self.assertTrue(torch.equal(a, c), "step %d: read before the gather" % s)
                    self.assertTrue(torch.equal(b, c), "step %d: state_dict" % s)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
