"""Checkpoints of ShardedAdamW / ShardedSGD that move (braid/optim_state.py), on the `local`
backend (ranks are threads): state_dict() in torch's layout, loaded into another world size
(2 -> 4, 4 -> 2, a hybrid mesh) and continuing bit for bit; torch.optim.AdamW / SGD state
into Braid and back, against torch itself; bf16 master weights surviving a resume;
consolidate_state_dict; the per-rank form refused by torch; bad dicts named.

The world-size tests use a model whose arithmetic does not depend on how the batch is split:
two Linear layers side by side (no hidden activations) under a loss linear in the output, on
inputs and weights of few binary digits, so every gradient, sum and average over ranks is
exact in f32 and bf16 whatever the world size, and a run of N ranks equals one of M ranks bit
for bit. What a checkpoint carries over is then checked exactly, not within a tolerance."""

import copy
import io
import threading
import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

BATCH = 8  # global rows per step, split evenly over the ranks
STEPS, HALF = 6, 3


class _Twin(torch.nn.Module):
    """a(x) + b(2x): every weight gradient is a sum of products of the inputs and the loss
    weights (independent of the weights), so exact."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 4)
        self.b = torch.nn.Linear(6, 4, bias=False)

    def forward(self, x):
        return self.a(x) + self.b(2 * x)


def _net(seed=5, dtype=torch.float32):
    with INIT_LOCK:
        torch.manual_seed(seed)
        net = _Twin()
    return net.to(dtype)


def _batch(step, dtype=torch.float32):
    """The global batch of `step`: inputs in {-1, -.5, 0, .5, 1}, loss weights in {-1, 0, 1}."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(-2, 3, (BATCH, 6), generator=g).to(dtype) / 2
    c = torch.randint(-1, 2, (BATCH, 4), generator=g).to(dtype)
    return x, c


def _loss(model, step, rank, size, dtype=torch.float32):
    """This rank's mean over its rows: the ranks' average is the mean over the global batch."""
    x, c = _batch(step, dtype)
    rows = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
    return (model(x[rows]) * c[rows]).sum() / (BATCH // size)


def _groups(net, kind):
    if kind == "adamw":
        return [{"params": [net.a.weight, net.b.weight], "weight_decay": 0.1},
                {"params": [net.a.bias], "weight_decay": 0.0, "lr": 0.02, "betas": (0.8, 0.99)}]
    return [{"params": [net.a.weight, net.b.weight], "weight_decay": 0.01},
            {"params": [net.a.bias], "lr": 0.2, "momentum": 0.5, "nesterov": True}]


class _Stack:
    """A wrapped model and its sharded optimizer on one rank."""

    def __init__(self, kind, g, size, net, wrapper="ddp", mesh=False):
        self.net, self.g, self.size, self.rank = net, g, size, g.rank
        groups = g.mesh(2, size // 2) if mesh else (g, None)
        mode = "hybrid" if mesh else "reduce_scatter"
        if wrapper == "ddp":
            self.model = bt.DistributedDataParallel(net, groups[0], mode=mode,
                                                    replica_group=groups[1],
                                                    bucket_cap_mb=1e-4, first_bucket_cap_mb=2e-5)
        else:
            self.model = bt.FullyShardedDataParallel(net, groups[0], mode=mode,
                                                     replica_group=groups[1], units=[net.b],
                                                     bucket_cap_mb=1e-4)
        self.opt = (bt.ShardedAdamW(self.model, lr=0.01, params=_groups(net, kind))
                    if kind == "adamw" else
                    bt.ShardedSGD(self.model, lr=0.1, momentum=0.9, params=_groups(net, kind)))
        self.mesh_groups = groups if mesh else ()

    def train(self, first, count, dtype=torch.float32):
        for s in range(first, first + count):
            _loss(self.model, s, self.rank, self.size, dtype).backward()
            self.opt.step()
            self.opt.zero_grad()

    def params(self):
        self.opt.synchronize()
        if isinstance(self.model, bt.FullyShardedDataParallel):
            with self.model.summon_full_params():
                return [p.detach().clone() for p in self.net.parameters()]
        return [p.detach().clone() for p in self.net.parameters()]

    def model_state(self):
        return {k: v.clone() for k, v in zip(dict(self.net.named_parameters()), self.params())}

    def close(self):
        self.opt.close()
        self.model.close()
        for grp in self.mesh_groups:
            grp.close()


def _assert_same_state(test, a, b, what):
    """Two torch-layout state dicts hold the same state bit for bit."""
    test.assertEqual(sorted(a["state"]), sorted(b["state"]), what)
    for idx in a["state"]:
        test.assertEqual(sorted(a["state"][idx]), sorted(b["state"][idx]), what)
        for key, x in a["state"][idx].items():
            y = b["state"][idx][key]
            if x is None or y is None:
                test.assertIs(x, y, "%s: state %d %s" % (what, idx, key))
            else:
                test.assertTrue(torch.equal(x.float(), y.float()),
                                "%s: state %d %s differs" % (what, idx, key))
    strip = [{k: v for k, v in g.items() if k not in ("foreach", "capturable",
                                                       "differentiable")}
             for g in a["param_groups"]]
    test.assertEqual(strip, [{k: v for k, v in g.items() if k in strip[i]}
                             for i, g in enumerate(b["param_groups"])], what)


class WorldSizeTest(unittest.TestCase):
    """A checkpoint written by N ranks loads into M ranks and continues bit for bit."""

    def _move(self, kind, n, m, wrapper="ddp", mesh_to=False, dtype=torch.float32):
        def straight(r, g, size):
            s = _Stack(kind, g, size, _net(dtype=dtype), wrapper)
            s.train(0, STEPS, dtype)
            got = s.params()
            s.close()
            return got

        def first(r, g):
            s = _Stack(kind, g, n, _net(dtype=dtype), wrapper)
            s.train(0, HALF, dtype)
            buf = io.BytesIO()
            torch.save({"model": s.model_state(), "opt": s.opt.state_dict()}, buf)
            s.close()
            return buf.getvalue()

        def second(r, g):
            ckpt = torch.load(io.BytesIO(saved[0]))
            net = _net(seed=99, dtype=dtype)  # other weights: everything comes from the ckpt
            net.load_state_dict(ckpt["model"])
            s = _Stack(kind, g, m, net, wrapper, mesh=mesh_to)
            s.opt.load_state_dict(ckpt["opt"])
            again = s.opt.state_dict()
            s.train(HALF, STEPS - HALF, dtype)
            got = s.params()
            s.close()
            return again, got, ckpt["opt"]

        want = run_ranks(n, lambda r, g: straight(r, g, n))[0]
        other = run_ranks(m, lambda r, g: straight(r, g, m))[0]
        for a, b in zip(want, other):  # the premise: the world size does not change the bits
            self.assertTrue(torch.equal(a, b))
        saved = run_ranks(n, first)
        sd = torch.load(io.BytesIO(saved[0]))["opt"]
        for blob in saved[1:]:  # every rank returned the whole state
            _assert_same_state(self, sd, torch.load(io.BytesIO(blob))["opt"], "ranks differ")
        self.assertEqual(sd["braid"]["step"], HALF)
        for again, got, loaded in run_ranks(m, second):
            _assert_same_state(self, loaded, again, "%d -> %d: state after load" % (n, m))
            for i, (a, b) in enumerate(zip(want, got)):
                self.assertTrue(torch.equal(a, b), "%d -> %d: parameter %d differs by %g" %
                                (n, m, i, float((a.float() - b.float()).abs().max())))
        return sd

    def test_adamw_2_to_4(self):
        sd = self._move("adamw", 2, 4)
        self.assertEqual(sorted(sd["state"]), [0, 1, 2])
        self.assertEqual(sorted(sd["state"][0]), ["exp_avg", "exp_avg_sq", "step"])
        step = sd["state"][2]["step"]
        self.assertEqual((step.dtype, step.shape, float(step)), (torch.float32, (), HALF))
        self.assertEqual(sd["state"][0]["exp_avg"].shape, (4, 6))  # the parameter's shape
        self.assertEqual(sd["braid"]["master"], {})  # f32 parameters are their own masters

    def test_adamw_4_to_2(self):
        self._move("adamw", 4, 2)

    def test_sgd_2_to_4_hybrid(self):
        sd = self._move("sgd", 2, 4, mesh_to=True)
        self.assertEqual(sorted(sd["state"][1]), ["momentum_buffer"])
        self.assertEqual(sd["braid"]["steps"], [HALF] * 3)

    def test_fully_sharded_4_to_2(self):
        self._move("adamw", 4, 2, wrapper="fsdp")

    def test_bf16_master_weights_survive(self):
        sd = self._move("adamw", 2, 4, dtype=torch.bfloat16)
        self.assertEqual(sorted(sd["braid"]["master"]), [0, 1, 2])
        self.assertEqual(sd["braid"]["master"][0].dtype, torch.float32)
        # The masters carry bits the bf16 parameters do not have.
        self.assertFalse(torch.equal(sd["braid"]["master"][0],
                                     sd["braid"]["master"][0].bfloat16().float()))


class TorchInteropTest(unittest.TestCase):
    """torch.optim.AdamW / SGD -> Braid -> torch: the state crosses exactly both ways, and the
    next step is torch's (within the rounding of the two kernels, 1e-6, far below what the
    state changes)."""

    def _torch_opt(self, kind, net):
        return (torch.optim.AdamW(_groups(net, kind), lr=0.01) if kind == "adamw" else
                torch.optim.SGD(_groups(net, kind), lr=0.1, momentum=0.9))

    def _torch_steps(self, net, opt, first, count):
        for s in range(first, first + count):
            _loss(net, s, 0, 1).backward()
            opt.step()
            opt.zero_grad()

    def _round_trip(self, kind):
        ref = _net()
        ref_opt = self._torch_opt(kind, ref)
        self._torch_steps(ref, ref_opt, 0, HALF)
        torch_sd = copy.deepcopy(ref_opt.state_dict())  # torch's holds its live tensors
        weights = {k: v.detach().clone() for k, v in ref.named_parameters()}
        self._torch_steps(ref, ref_opt, HALF, 1)
        torch_next = [p.detach().clone() for p in ref.parameters()]

        def body(r, g):
            net = _net(seed=99)
            net.load_state_dict(weights)
            s = _Stack(kind, g, 2, net)
            s.opt.load_state_dict(torch_sd)
            loaded = s.opt.state_dict()
            s.train(HALF, 1)
            braid_next, braid_sd = s.params(), s.opt.state_dict()
            s.close()
            fresh = _net(seed=99)
            fresh.load_state_dict(weights)
            s = _Stack(kind, g, 2, fresh)  # the same step from an empty state
            s.train(HALF, 1)
            empty_next = s.params()
            s.close()
            return loaded, braid_next, braid_sd, empty_next

        for loaded, braid_next, braid_sd, empty_next in run_ranks(2, body):
            _assert_same_state(self, torch_sd, loaded, "torch -> Braid")
            for i, (a, b, e) in enumerate(zip(torch_next, braid_next, empty_next)):
                torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
                self.assertGreater(float((e - a).abs().max()), 1e-4, i)  # the state mattered
            # Braid -> torch: converted, never loaded empty, and it steps as Braid does.
            net = _net(seed=7)
            net.load_state_dict({k: v for k, v in zip(weights, braid_next)})
            opt = self._torch_opt(kind, net)
            opt.load_state_dict(braid_sd)
            _assert_same_state(self, braid_sd, opt.state_dict(), "Braid -> torch")
            self.assertNotIn("braid", opt.state_dict())
            self._torch_steps(net, opt, HALF + 1, 1)
            ref_net = _net(seed=7)
            ref_net.load_state_dict(dict(zip(weights, torch_next)))
            ref_copy = self._torch_opt(kind, ref_net)  # torch's own state, over ref_net
            ref_copy.load_state_dict(ref_opt.state_dict())
            self._torch_steps(ref_net, ref_copy, HALF + 1, 1)
            for a, b in zip(net.parameters(), ref_net.parameters()):
                torch.testing.assert_close(a, b, rtol=0, atol=2e-6)

    def test_adamw(self):
        self._round_trip("adamw")

    def test_sgd(self):
        self._round_trip("sgd")

    def test_never_stepped_is_empty_as_in_torch(self):
        """Before any step torch's state is {}; loading it resets a trained optimizer to a
        fresh one's state (the next step is a first step)."""
        fresh_sd = torch.optim.AdamW(_groups(_net(), "adamw"), lr=0.01).state_dict()

        def body(r, g):
            s = _Stack("adamw", g, 2, _net())
            empty = s.opt.state_dict()
            s.train(0, 2)
            weights = s.model_state()
            s.opt.load_state_dict(fresh_sd)
            s.train(2, 1)
            got = s.params()
            s.close()
            net = _net(seed=99)
            net.load_state_dict(weights)
            s = _Stack("adamw", g, 2, net)
            s.train(2, 1)
            want = s.params()
            s.close()
            return empty, got, want

        for empty, got, want in run_ranks(2, body):
            self.assertEqual(empty["state"], {})
            self.assertEqual(empty["braid"]["step"], 0)
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))

    def test_sharded_form_is_refused_by_torch_and_named_by_braid(self):
        def body(r, g):
            s = _Stack("adamw", g, 2, _net())
            s.train(0, 1)
            shard, whole = s.opt.sharded_state_dict(), s.opt.state_dict()
            with self.assertRaisesRegex(ValueError, "different number of parameter groups"):
                torch.optim.AdamW(_net().parameters()).load_state_dict(shard)
            with self.assertRaisesRegex(ValueError, r"sharded_state_dict\(\) \(one rank's "
                                        r"shard\); load it with load_sharded_state_dict\(\)"):
                s.opt.load_state_dict(shard)
            with self.assertRaisesRegex(ValueError, r"whole state_dict\(\): load it with "
                                        r"load_state_dict\(\)"):
                s.opt.load_sharded_state_dict(whole)
            before = s.params()
            s.train(1, 1)
            s.opt.load_sharded_state_dict(shard)  # the fast form still resumes
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(before, s.params())))
            s.close()

        run_ranks(2, body)


class ConsolidateTest(unittest.TestCase):
    def test_consolidate_on_one_rank(self):
        def body(r, g):
            s = _Stack("adamw", g, 2, _net())
            s.train(0, 2)
            whole = s.opt.state_dict()
            with self.assertRaisesRegex(ValueError, r"consolidate_state_dict\(to=2\): a rank in "
                                        r"\[0, 2\)"):
                s.opt.consolidate_state_dict(to=2)
            s.opt.consolidate_state_dict(to=1)
            if r == 1:
                kept = s.opt.state_dict()  # not collective: rank 0 does not take part
                _assert_same_state(self, whole, kept, "consolidated")
            else:
                with self.assertRaisesRegex(RuntimeError, r"consolidated on rank 1 "
                                            r"\(consolidate_state_dict\(to=1\)\)"):
                    s.opt.state_dict()
            barrier.wait()
            s.train(2, 1)
            after = s.opt.state_dict()  # stale on both ranks: collective again
            s.close()
            return after

        barrier = threading.Barrier(2)
        a, b = run_ranks(2, body)
        _assert_same_state(self, a, b, "after a step")
        self.assertEqual(float(a["state"][0]["step"]), 3)


class BadDictTest(unittest.TestCase):
    """Each bad dict raises ValueError naming the first mismatch on every rank (nobody waits),
    and nothing changes."""

    def test_bad_dicts_named(self):
        def torch_sd(kind="adamw", mutate=None, net=None, steps=1):
            net = net or _net()
            opt = (torch.optim.AdamW(_groups(net, "adamw"), lr=0.01) if kind == "adamw" else
                   torch.optim.SGD(_groups(net, "sgd"), lr=0.1, momentum=0.9))
            for s in range(steps):
                _loss(net, s, 0, 1).backward()
                if mutate == "no grad in step 1" and s == 1:
                    net.b.weight.grad = None
                opt.step()
                opt.zero_grad()
            return opt.state_dict()

        good = torch_sd()
        cases = [
            (torch_sd("sgd"), r"param_groups\[0\] has no 'betas', 'eps' \(not a "
             r"torch.optim.AdamW state_dict\)"),
            (dict(good, param_groups=good["param_groups"][:1]),
             r"1 param groups of sizes \[2\]; this optimizer has 2 of sizes \[2, 1\]"),
            (dict(good, param_groups=[dict(good["param_groups"][0], amsgrad=True),
                                      good["param_groups"][1]]),
             r"state_dict's param_groups\[0\]: amsgrad=True is not implemented"),
            ({"state": {0: dict(good["state"][0], max_exp_avg_sq=good["state"][0]["exp_avg"]),
                        1: good["state"][1], 2: good["state"][2]},
              "param_groups": good["param_groups"]},
             r"state_dict\['state'\]\[0\] has key 'max_exp_avg_sq': not in torch.optim.AdamW's"),
            ({"state": {0: good["state"][0], 1: dict(good["state"][1],
                                                     exp_avg=torch.zeros(6, 4)),
                        2: good["state"][2]}, "param_groups": good["param_groups"]},
             r"state_dict\['state'\]\[1\]\['exp_avg'\] has shape \(6, 4\); parameter 1 "
             r"\('b.weight', param_groups\[0\]\['params'\]\[1\]\) has shape \(4, 6\)"),
            ({"state": {0: dict(good["state"][0], step=torch.tensor(1.5)), 1: good["state"][1],
                        2: good["state"][2]}, "param_groups": good["param_groups"]},
             r"state_dict\['state'\]\[0\]\['step'\] is 1.5; a step count is a whole number"),
            (dict(good, state={7: good["state"][0]}),
             r"state_dict\['state'\] has key 7; this optimizer has parameters 0..2"),
            (torch_sd(mutate="no grad in step 1", steps=2),
             r"parameter 0 \('a.weight', .*\) and parameter 1 \('b.weight', .*\) were stepped "
             r"2 and 1 times, but they share bucket \d+ and Braid keeps one step count per "
             r"bucket"),
            ("not a dict", "a dict is needed, got str"),
        ]

        def body(r, g):
            net = _net()  # one bucket (the step-count case needs the weights together)
            model = bt.DistributedDataParallel(net, g, mode="reduce_scatter")
            opt = bt.ShardedAdamW(model, lr=0.01, params=_groups(net, "adamw"))
            _loss(model, 0, r, 2).backward()
            opt.step()
            opt.synchronize()
            before, state = [p.detach().clone() for p in net.parameters()], opt.state_dict()
            errors = []
            for sd, _ in cases:
                try:
                    opt.load_state_dict(sd)
                except ValueError as e:
                    errors.append(str(e))
            # Only this rank's dict is bad: the other rank fails too instead of waiting.
            try:
                opt.load_state_dict(cases[4][0] if r == 1 else good)
            except ValueError as e:
                errors.append(str(e))
            opt.synchronize()
            after = [p.detach().clone() for p in net.parameters()]
            _assert_same_state(self, state, opt.state_dict(), "nothing loaded")
            opt.close()
            model.close()
            return errors, before, after

        for r, (errors, before, after) in enumerate(run_ranks(2, body)):
            self.assertEqual(len(errors), len(cases) + 1, errors)
            for (_, pattern), message in zip(cases, errors):
                self.assertRegex(message, r"^ShardedAdamW.load_state_dict: ")
                self.assertRegex(message, pattern)
            if r == 1:
                self.assertRegex(errors[-1], r"\['exp_avg'\] has shape \(6, 4\)")
            else:
                self.assertRegex(errors[-1], r"Braid refused the state: .*1 other rank\(s\) "
                                 r"could not load")
            for a, b in zip(before, after):
                self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
