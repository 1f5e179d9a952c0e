"""Small models, data and training loops shared by the wrapper tests (binding_test,
ddp_wrapper_test, fsdp_wrapper_test): an MLP and a transformer-like stack seeded under
rank_threads.INIT_LOCK, per-rank data from per-rank generators, serial per-rank gradients, and
the torch-optimizer-on-Braid-all-reduce reference the sharded optimizers are compared with."""

import contextlib

import torch

from braid import pytorch as bt
from rank_threads import INIT_LOCK


def null_context():
    return contextlib.nullcontext()


def mlp():
    with INIT_LOCK:
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                                   torch.nn.Linear(5, 3))


def data(r, micro=0):
    g = torch.Generator().manual_seed(100 * r + micro)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def serial_grads(ranks, micros=1):
    """Per-rank gradients (summed over micro-batches) of the same model, computed serially."""
    out = []
    for r in ranks:
        m = mlp()
        for micro in range(micros):
            x, y = data(r, micro)
            torch.nn.functional.mse_loss(m(x), y).backward()
        out.append([p.grad.clone() for p in m.parameters()])
    return out


def torch_reference(group, make_optimizer, train):
    """Final parameters of mlp() trained by train(model, optimizer) with Braid's all-reduce
    and a torch optimizer: the reference the sharded optimizers are compared with."""
    ref = bt.DistributedDataParallel(mlp(), group)
    train(ref, make_optimizer(ref.parameters()))
    want = [p.detach().clone() for p in ref.parameters()]
    ref.close()
    return want


class Stack(torch.nn.Module):
    """A small transformer-like stack: embedding, two pre-norm encoder layers (LayerNorm,
    attention matmuls, feed-forward), a head; the positional table is a bare root parameter."""

    def __init__(self, d=16, vocab=20, seq=6, blocks=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=2 * d, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(blocks))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def stack(blocks=2):
    with INIT_LOCK:
        torch.manual_seed(11)
        return Stack(blocks=blocks)


def deep_mlp():
    with INIT_LOCK:
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
                                   torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, 3))


def loss_of(kind, model, r, micro):
    if kind == "mlp":
        x, y = data(r, micro)
        return torch.nn.functional.mse_loss(model(x), y)
    g = torch.Generator().manual_seed(1000 * r + micro)
    tokens = torch.randint(0, 20, (3, 6), generator=g)
    out = model(tokens)
    return torch.nn.functional.cross_entropy(out.reshape(-1, 20), ((tokens + 1) % 20).reshape(-1))


def units_of(kind, net):
    # mlp: every Linear but the last is a unit (the last is the root's); stack: the blocks.
    return [net[0], net[2], net[4]] if kind == "mlp" else list(net.blocks)


def fsdp_train(kind, model, opt, r, steps, accumulate, sync_mode="no_sync"):
    for s in range(steps):
        for micro in range(accumulate):
            with model.no_sync(sync_mode) if micro + 1 < accumulate else null_context():
                (loss_of(kind, model, r, accumulate * s + micro) / accumulate).backward()
        opt.step()
        opt.zero_grad()


def mlp_or_stack(kind):
    return deep_mlp() if kind == "mlp" else stack()
