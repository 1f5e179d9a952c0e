"""braid.pytorch.fully_shard under mpirun -np 2 (Braid's "mpi" world, one process per rank)
against torch's own DistributedDataParallel (gloo) in the same process: the same model and
data, torch.optim.AdamW over the full model under DDP and over this rank's pieces under
fully_shard, with two param groups chosen by p.dim() (weight decay for matrices, another lr
and none for biases: the pieces keep their parameter's dim()), with one step of 2-micro-batch accumulation (DDP's no_sync vs
set_requires_gradient_sync(False)); the parameters after every step compared (bit for bit for
single micro-batch steps), and evaluation without an optimizer equal to the plain module."""

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import braid
from braid import pytorch as bt
import train_compare  # init_gloo


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.inp = torch.nn.Linear(5, 7)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(7, 7), torch.nn.Linear(7, 7)])
        self.out = torch.nn.Linear(7, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = torch.tanh(b(x)) + x
        return self.out(x)


def _data(rank, step, micro):
    g = torch.Generator().manual_seed(1000 * micro + 10 * rank + step)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _groups(params):
    """nanoGPT's idiom, on the wrapped model's parameters."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.5},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 0.02}]


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank = group.rank
    train_compare.init_gloo(group, rank, group.size)

    ref = TorchDDP(Net())
    ref_opt = torch.optim.AdamW(_groups(ref.parameters()), lr=0.01)
    net = Net()
    for b in net.blocks:
        bt.fully_shard(b, group=group)
    bt.fully_shard(net, group=group)
    opt = torch.optim.AdamW(_groups(net.parameters()), lr=0.01)

    x = torch.randn(3, 5)
    with torch.no_grad():
        assert torch.equal(net(x), Net()(x)), "evaluation without an optimizer differs"

    failures = []
    for step in range(5):
        micros = 2 if step == 2 else 1
        for m in range(micros):
            xb, yb = _data(rank, step, m)
            last = m == micros - 1
            net.set_requires_gradient_sync(last)
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            if last:
                torch.nn.functional.mse_loss(ref(xb), yb).backward()
            else:
                with ref.no_sync():
                    torch.nn.functional.mse_loss(ref(xb), yb).backward()
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        with net.summon_full_params():
            mine = [p.detach().clone() for p in net.parameters()]
        for (name, a), b in zip(ref.module.named_parameters(), mine):
            same = (torch.equal(a, b) if step < 2 else
                    torch.allclose(a, b, rtol=1e-6, atol=1e-7))
            if not same:
                failures.append("step %d %s: %g" % (step, name, (a - b).abs().max()))
    net.close()
    group.close()
    world.close()
    if failures:
        print("rank %d: fully_shard differs from torch DDP:\n  %s" % (rank, "\n  ".join(failures)))
        sys.exit(1)
    print("rank %d: fully_shard + torch AdamW equals torch DDP + AdamW" % rank)


if __name__ == "__main__":
    main()
