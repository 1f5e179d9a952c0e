"""train_gpt.py --moe EXPERTS: the GPT with each block's MLP replaced by top-1 routed experts.

    tools/bazelw run //bench:train_gpt -- --moe 2 --expert-parallel 2 --max-grad-norm 1

Layout: --expert-parallel EP ranks hold different experts; rank r holds expert-parallel rank
r % EP's EXPERTS experts in every block (seeded by r % EP) and routes its own tokens among them:
a dense router per block picks each token's top-1 expert and scales its output by the gate
(every expert runs on every token and a mask keeps the chosen one, so every expert parameter
gets a gradient, zero where no token chose it: the gradients of sparse routing). Tokens stay
on their rank (no all-to-all: Megatron-LM's expert parallelism without the token exchange).
  dense    embeddings, attention, LayerNorms, routers, head: reduced over the world
  experts  reduced over their expert-data-parallel group, the size / EP ranks r' with
           r' % EP == r % EP
One optimizer steps both parts and clips by ONE global norm (--max-grad-norm; 0: no clip):
every dense element once plus every distinct expert once, as Megatron-LM's optimizer does.
  torch  torch DDP over the world for the dense part nested with a second torch DDP over the
         gloo expert-data-parallel group for the experts, torch.optim.AdamW; the global norm
         by hand (torch DDP has no expert groups): the experts' squares summed over the world
         and divided by the group size, then torch.nn.utils.clip_grad_norm_'s coefficient
  braid  DistributedDataParallel(mode="reduce_scatter") per part, on the world and on a
         world.split group, and one ShardedAdamW.linked(max_grad_norm=...)
The two wrappers nest: the experts' wrapper's forward calls the dense wrapper (each forward
runs once per step, as each wrapper requires); the dense forward calls the experts per block.
"""

import math
import sys

import torch
import torch.distributed as dist

from braid import pytorch as bt

import train_gpt


class Experts(torch.nn.Module):
    """One block's experts on this rank: each token to its top-1 expert, scaled by its gate."""

    def __init__(self, d, n):
        super().__init__()
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                torch.nn.Linear(4 * d, d)) for _ in range(n))

    def forward(self, h, gates):
        top, choice = gates.max(dim=-1)
        out = 0
        for e, expert in enumerate(self.experts):
            out = out + ((choice == e).to(h.dtype) * top).unsqueeze(-1) * expert(h)
        return out


class Trunk(torch.nn.Module):
    """The GPT's dense parameters (train_gpt.GPT less each block's MLP, plus a router per
    block); forward(idx, experts) runs block i's MLP as experts[i]."""

    def __init__(self, vocab, d, layers, heads, context, experts, tied):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, d)
        self.positions = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(
            train_gpt.Block(d, heads, context) for _ in range(layers))
        for block in self.blocks:  # the MLP lives in the experts
            del block.fc, block.out
        self.routers = torch.nn.ModuleList(torch.nn.Linear(d, experts) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        if tied:
            torch.nn.init.normal_(self.tokens.weight, std=0.02)
            self.head.weight = self.tokens.weight

    def forward(self, idx, experts):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block, router, moe in zip(self.blocks, self.routers, experts):
            x = block.attend(x)
            h = block.ln2(x)
            x = x + moe(h, torch.softmax(router(h), dim=-1))
        return self.head(self.ln(x))


class ExpertLayers(torch.nn.Module):
    """This rank's experts of every block; forward(idx, trunk) runs the whole model through
    `trunk` (the dense part, or its wrapper)."""

    def __init__(self, d, layers, experts):
        super().__init__()
        self.layers = torch.nn.ModuleList(Experts(d, experts) for _ in range(layers))

    def forward(self, idx, trunk):
        return trunk(idx, self.layers)


def layout(args, rank, size):
    """(expert-parallel rank, expert-data-parallel group size) of this rank."""
    ep = args.expert_parallel
    if ep < 1 or size % ep:
        sys.exit("train_gpt: --expert-parallel %d must divide the %d ranks" % (ep, size))
    return rank % ep, size // ep


def make_parts(args, vocab, ep_rank):
    """(trunk, experts): the same trunk everywhere, expert-parallel rank ep_rank's experts."""
    torch.manual_seed(args.seed)
    trunk = Trunk(vocab, args.width, args.layers, args.heads, args.context, args.moe,
                  args.tied_embeddings)
    torch.manual_seed(args.seed * 1000003 + 1 + ep_rank)
    return trunk, ExpertLayers(args.width, args.layers, args.moe)


def parameter_count(args, vocab):
    trunk, experts = make_parts(args, vocab, 0)
    return (sum(p.numel() for p in trunk.parameters()) +
            args.expert_parallel * sum(p.numel() for p in experts.parameters()))


def _global_clip(trunk, experts, edp_size, max_norm):
    """torch.nn.utils.clip_grad_norm_ over the dense gradients (the same on every rank) and
    every distinct expert's (the world's sum counts each expert edp_size times): the norm."""
    def squares(module):
        return sum(float((p.grad.double() ** 2).sum()) for p in module.parameters())
    t = torch.tensor([squares(experts)], dtype=torch.float64)
    dist.all_reduce(t)
    norm = math.sqrt(squares(trunk) + float(t) / edp_size)
    coef = min(1.0, max_norm / (norm + 1e-6))
    for p in list(trunk.parameters()) + list(experts.parameters()):
        p.grad.mul_(coef)
    return norm


def run_ddp(args, vocab, train_data, val_data, rank, size):
    ep_rank, edp_size = layout(args, rank, size)
    groups = [dist.new_group([r for r in range(size) if r % args.expert_parallel == c])
              for c in range(args.expert_parallel)]  # every rank creates every group
    trunk, experts = make_parts(args, vocab, ep_rank)
    dense = torch.nn.parallel.DistributedDataParallel(trunk)
    moe = torch.nn.parallel.DistributedDataParallel(experts, process_group=groups[ep_rank])
    params = list(trunk.parameters()) + list(experts.parameters())
    opt = torch.optim.AdamW(_param_groups(params, args.weight_decay), lr=args.lr)
    clip = None
    if args.max_grad_norm > 0:
        def clip():
            return _global_clip(trunk, experts, edp_size, args.max_grad_norm)
    model = lambda idx: moe(idx, dense)  # noqa: E731
    norms = []
    losses, lrs, per_step = train_gpt.train("torch DDP MoE", args, model, opt, train_data,
                                            rank, size, clip, norms)
    val = train_gpt.validation_loss(args, model, val_data, rank, size)
    return losses, lrs, per_step, val, norms


def run_braid(args, vocab, group, train_data, val_data, rank, size):
    ep_rank, _ = layout(args, rank, size)
    edp = group.split(ep_rank, rank, "expert_dp")
    trunk, experts = make_parts(args, vocab, ep_rank)
    params = list(trunk.parameters()) + list(experts.parameters())
    groups = _param_groups(params, args.weight_decay)
    dense = bt.DistributedDataParallel(trunk, group, mode="reduce_scatter",
                                       bucket_cap_mb=args.bucket_cap_mb)
    moe = bt.DistributedDataParallel(experts, edp, mode="reduce_scatter",
                                     bucket_cap_mb=args.bucket_cap_mb)
    opt = bt.ShardedAdamW.linked(groups, lr=args.lr, max_grad_norm=args.max_grad_norm)
    clip = None
    if args.max_grad_norm > 0:
        def clip():  # the norm of the step, clipped inside it (max_grad_norm)
            return opt.clip_grad_norm_(args.max_grad_norm)
    model = lambda idx: moe(idx, dense)  # noqa: E731
    norms = []
    losses, lrs, per_step = train_gpt.train("Braid ZeRO-2 MoE", args, model, opt, train_data,
                                            rank, size, clip, norms)
    val = train_gpt.validation_loss(args, model, val_data, rank, size)
    opt.close()
    moe.close()
    dense.close()
    edp.close()
    return losses, lrs, per_step, val, norms


def _param_groups(params, weight_decay):
    """train_gpt.param_groups over a parameter list (decay on matrices and embeddings)."""
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
