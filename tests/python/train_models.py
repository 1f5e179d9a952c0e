"""The models, data and training loop shared by the PyTorch proof (train_compare.py) and the
per-step bench (bench/torch_step_bench.py): fixed seeds, every rank its own batches."""

import contextlib

import torch

VOCAB, SEQ = 256, 16


class TinyTransformer(torch.nn.Module):
    """Embedding + positional embedding, two pre-norm encoder layers, a vocabulary head."""

    def __init__(self, d_model=96, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, d_model)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, d_model) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model,
                                             dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(d_model, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class MoETrunk(torch.nn.Module):
    """The dense part of TinyMoE: an input projection and a top-1 router over the experts this
    rank holds."""

    def __init__(self, d_in=8, d=16, experts=2):
        super().__init__()
        self.proj = torch.nn.Linear(d_in, d)
        self.router = torch.nn.Linear(d, experts)

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        return h, torch.softmax(self.router(h), dim=-1)


class MoEExperts(torch.nn.Module):
    """One expert-parallel rank's experts: each token goes to its top-1 expert, scaled by its
    gate (every expert computes every token; the mask keeps the chosen one, so the gradients
    are those of sparse routing)."""

    def __init__(self, d=16, d_out=4, experts=2):
        super().__init__()
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.Tanh(),
                                torch.nn.Linear(2 * d, d_out)) for _ in range(experts))

    def forward(self, h, gates):
        top, choice = gates.max(dim=-1)
        out = 0
        for e, expert in enumerate(self.experts):
            out = out + ((choice == e).to(h.dtype) * top).unsqueeze(-1) * expert(h)
        return out


def make_moe(expert_rank):
    """TinyMoE's parts: the dense trunk (the same everywhere) and expert-parallel rank
    `expert_rank`'s experts (different experts per expert-parallel rank). Seeded through
    torch's global RNG: rank threads call it under binding_test._INIT_LOCK."""
    torch.manual_seed(20261127)
    trunk = MoETrunk()
    torch.manual_seed(20261127 + 1 + expert_rank)
    return trunk, MoEExperts()


def moe_batch(rank, step, tokens=8):
    g = torch.Generator().manual_seed(rank * 7919 + step * 31 + 3)
    return torch.randn(tokens, 8, generator=g), torch.randn(tokens, 4, generator=g)


def make_model(kind, width=1):
    """The same initial parameters on every rank and in every run (seeded)."""
    torch.manual_seed(20261122)
    if kind == "mlp":
        h = 512 * width
        return torch.nn.Sequential(torch.nn.Linear(128, h), torch.nn.GELU(),
                                   torch.nn.Linear(h, h), torch.nn.GELU(),
                                   torch.nn.Linear(h, 16))
    if kind == "transformer":
        return TinyTransformer(d_model=96 * width)
    raise ValueError("model %r: mlp or transformer" % (kind,))


def batch(kind, rank, step, micro, size=16):
    """Rank `rank`'s batch `micro` of step `step`: the same in every run."""
    g = torch.Generator().manual_seed(((rank * 1000003 + step) * 101 + micro) * 7 + 1)
    if kind == "mlp":  # labels from a fixed random teacher: learnable
        x = torch.randn(size, 128, generator=g)
        teacher = torch.Generator().manual_seed(7)
        y = (x @ torch.randn(128, 16, generator=teacher)).argmax(dim=1)
    else:  # predict each token's successor (mod VOCAB)
        x = torch.randint(0, VOCAB, (size // 2, SEQ), generator=g)
        y = (x + 1) % VOCAB
    return x, y


def loss_of(model, x, y):
    out = model(x)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def train(kind, model, opt, rank, steps, accumulate=1, first_step=0, on_step=None):
    """`steps` optimizer steps of `accumulate` micro-batches each (all but the last under
    model.no_sync()). Returns every micro-batch's local loss."""
    losses = []
    for step in range(first_step, first_step + steps):
        for micro in range(accumulate):
            sync = micro == accumulate - 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                x, y = batch(kind, rank, step, micro)
                loss = loss_of(model, x, y) / accumulate
                loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        if on_step is not None:
            on_step(step)
    return losses
