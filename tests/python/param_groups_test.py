"""Parameter groups of different hyper-parameters on fully sharded models, at 2 ranks (4 for
hybrid) as threads of a `local` world, against torch's optimizer with the same groups on the
full model fed the ranks' averaged gradient, in the same process.

The groups are chosen the way training scripts choose them, from the wrapped model's
parameters: weight decay for matrices (p.dim() >= 2), none for biases, a third group for the
norms' weights. Regression test: a fully sharded model's parameters used to be 1-D pieces
between uses, so p.dim() put every parameter in the no-decay group and FSDP / fully_shard +
ShardedAdamW (or a torch optimizer over the pieces) silently trained with other groups than
torch (5e-3 off after 3 steps) while ZeRO-2 matched. Covers FullyShardedDataParallel and
fully_shard with ShardedAdamW / ShardedSGD, torch AdamW / SGD over the pieces, hybrid 2 x 2,
the optimizer's state_dict (torch's group layout and per-parameter state), and groups torch
allows that hold no trainable parameter or a frozen one."""

import unittest

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK, run_ranks

N = 2
STEPS = 3


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(torch.tanh(self.lin(x)) + x)


class Net(torch.nn.Module):
    """Odd sizes: parameters straddle the ranks' shards, and some lie wholly in one rank's."""

    def __init__(self):
        super().__init__()
        with INIT_LOCK:
            torch.manual_seed(5)
            self.inp = torch.nn.Linear(5, 7)
            self.blocks = torch.nn.ModuleList([Block(7), Block(7)])
            self.out = torch.nn.Linear(7, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _data(r, step):
    g = torch.Generator().manual_seed(100 * r + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def adamw_groups(named):
    """Three groups of different lr / betas / weight_decay, chosen by p.dim() and names."""
    named = list(named)
    decay = [p for _, p in named if p.dim() >= 2]
    bias = [p for n, p in named if p.dim() < 2 and n.endswith("bias")]
    norm = [p for n, p in named if p.dim() < 2 and not n.endswith("bias")]
    return [{"params": decay, "weight_decay": 0.5},
            {"params": bias, "weight_decay": 0.0, "lr": 0.02},
            {"params": norm, "weight_decay": 0.1, "lr": 0.005, "betas": (0.8, 0.99)}]


def sgd_groups(named):
    named = list(named)
    return [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.3},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0, "lr": 0.05,
             "momentum": 0.5}]


TORCH = {
    "adamw": lambda named: torch.optim.AdamW(adamw_groups(named), lr=0.01),
    "sgd": lambda named: torch.optim.SGD(sgd_groups(named), lr=0.1, momentum=0.9),
}
BRAID = {
    "adamw": lambda named: bt.ShardedAdamW(adamw_groups(named), lr=0.01),
    "sgd": lambda named: bt.ShardedSGD(sgd_groups(named), lr=0.1, momentum=0.9),
}


def _reference(kind, ranks=N):
    """torch on the full model: the loss averaged over the ranks' data (the averaged gradient
    of DDP), the same groups. Returns (parameters, the optimizer's state_dict)."""
    net = Net()
    opt = TORCH[kind](net.named_parameters())
    for s in range(STEPS):
        loss = sum(torch.nn.functional.mse_loss(net(x), y)
                   for x, y in (_data(r, s) for r in range(ranks))) / ranks
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()], opt.state_dict()


def _train(model, opt, r):
    for s in range(STEPS):
        x, y = _data(r, s)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _full(model, net):
    with model.summon_full_params():
        return [p.detach().clone() for p in net.parameters()]


class ParamGroupsTest(unittest.TestCase):
    def _close(self, got, want, atol=1e-6):
        for i, (a, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, w, rtol=0, atol=atol,
                                       msg=lambda m, i=i: "parameter %d: %s" % (i, m))

    def test_wrapped_parameters_keep_their_dim(self):
        # The idiom itself: the groups chosen from the wrapped model are torch's.
        want = [len(g["params"]) for g in adamw_groups(Net().named_parameters())]

        def body(r, g):
            net = Net()
            fsdp = bt.FullyShardedDataParallel(net, g, units=list(net.blocks))
            got = [[len(x["params"]) for x in adamw_groups(net.named_parameters())]]
            fsdp.close()
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, group=g)
            bt.fully_shard(net, group=g)
            got.append([len(x["params"]) for x in adamw_groups(net.named_parameters())])
            net.close()
            return got

        for got in run_ranks(N, body):
            self.assertEqual(got, [want, want])

    def test_fsdp_sharded_optimizers_match_torch(self):
        for kind in ("adamw", "sgd"):
            want, _ = _reference(kind)

            def body(r, g):
                net = Net()
                model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks),
                                                    bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
                opt = BRAID[kind](net.named_parameters())
                _train(model, opt, r)
                got = _full(model, net)
                opt.close()
                model.close()
                return got

            for got in run_ranks(N, body):
                self._close(got, want)

    def test_fully_shard_sharded_adamw_matches_torch(self):
        want, _ = _reference("adamw")

        def body(r, g):
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, group=g)
            bt.fully_shard(net, group=g)
            opt = BRAID["adamw"](net.named_parameters())
            _train(net, opt, r)
            got = _full(net, net)
            opt.close()
            net.close()
            return got

        for got in run_ranks(N, body):
            self._close(got, want)

    def test_torch_optimizers_over_pieces_equal_full_model_step(self):
        # Elementwise optimizers over this rank's pieces: the full-model step, bit for bit.
        for kind in ("adamw", "sgd"):
            want, _ = _reference(kind)

            def body(r, g):
                net = Net()
                for b in net.blocks:
                    bt.fully_shard(b, group=g)
                bt.fully_shard(net, group=g)
                opt = TORCH[kind](net.named_parameters())
                _train(net, opt, r)
                got = _full(net, net)
                net.close()
                return got

            for got in run_ranks(N, body):
                for i, (a, w) in enumerate(zip(got, want)):
                    self.assertTrue(torch.equal(a, w), (kind, i, float((a - w).abs().max())))

    def test_hybrid_2x2_sharded_adamw_matches_torch(self):
        want, _ = _reference("adamw", ranks=4)

        def body(r, g):
            shard, replica = g.mesh(2, 2)
            net = Net()
            model = bt.FullyShardedDataParallel(net, shard, units=list(net.blocks),
                                                mode="hybrid", replica_group=replica)
            opt = BRAID["adamw"](net.named_parameters())
            _train(model, opt, r)
            got = _full(model, net)
            opt.close()
            model.close()
            shard.close()
            replica.close()
            return got

        for got in run_ranks(4, body):
            self._close(got, want)

    def test_group_without_trainable_parameters(self):
        # torch allows a group that holds no parameter (or only frozen ones): Braid used to
        # refuse it at the first forward (set_hyper: no parameter group 3).
        want, _ = _reference("adamw")

        def body(r, g):
            net = Net()
            model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks))
            groups = adamw_groups(net.named_parameters()) + [{"params": [], "lr": 0.5}]
            opt = bt.ShardedAdamW(groups, lr=0.01)
            _train(model, opt, r)
            got = _full(model, net)
            sd = opt.state_dict()
            opt.close()
            model.close()
            return got, sd

        for got, sd in run_ranks(N, body):
            self._close(got, want)
            self.assertEqual([len(x["params"]) for x in sd["param_groups"]][-1], 0)

    def test_frozen_parameter_in_a_group(self):
        # A parameter frozen before wrapping may be listed in a group (never stepped, no
        # state, as torch's): state_dict() raised KeyError, load_state_dict() too.
        def frozen_net():
            net = Net()
            net.blocks[0].norm.weight.requires_grad_(False)
            return net

        net = frozen_net()
        opt = TORCH["adamw"](net.named_parameters())
        for s in range(STEPS):
            loss = sum(torch.nn.functional.mse_loss(net(x), y)
                       for x, y in (_data(r, s) for r in range(N))) / N
            loss.backward()
            opt.step()
            opt.zero_grad()
        want, want_sd = [p.detach().clone() for p in net.parameters()], opt.state_dict()

        def body(r, g):
            net = frozen_net()
            model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks))
            opt = BRAID["adamw"](net.named_parameters())
            _train(model, opt, r)
            got, sd = _full(model, net), opt.state_dict()
            opt.load_state_dict(want_sd)
            loaded = opt.state_dict()
            opt.close()
            model.close()
            return got, sd, loaded

        for got, sd, loaded in run_ranks(N, body):
            self._close(got, want)
            for d in (sd, loaded):
                self.assertEqual([x["params"] for x in d["param_groups"]],
                                 [x["params"] for x in want_sd["param_groups"]])
                self.assertEqual(sorted(d["state"]), sorted(want_sd["state"]))
                for i, st in want_sd["state"].items():
                    torch.testing.assert_close(d["state"][i]["exp_avg"].reshape(
                        st["exp_avg"].shape), st["exp_avg"], rtol=0, atol=1e-6)

    def test_state_dict_has_torch_groups_and_state(self):
        want, want_sd = _reference("adamw")

        def body(r, g):
            net = Net()
            model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks))
            opt = BRAID["adamw"](net.named_parameters())
            _train(model, opt, r)
            sd = opt.state_dict()
            opt.close()
            model.close()
            return sd

        for sd in run_ranks(N, body):
            self.assertEqual(len(sd["param_groups"]), len(want_sd["param_groups"]))
            for got_g, want_g in zip(sd["param_groups"], want_sd["param_groups"]):
                for key in ("params", "lr", "weight_decay", "eps"):
                    self.assertEqual(got_g[key], want_g[key], key)
                self.assertEqual(tuple(got_g["betas"]), tuple(want_g["betas"]))
            self.assertEqual(sorted(sd["state"]), sorted(want_sd["state"]))
            for i, st in want_sd["state"].items():
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(sd["state"][i][key].reshape(st[key].shape),
                                               st[key], rtol=0, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
