"""The training recipes of issue 24 at 4 processes in ONE mpirun -np 4 launch (Braid's "mpi"
world beside torch.distributed over gloo, its default process group): each recipe against its
reference, with the models, data and loops of the local tests imported, not copied:

  - tied weights (tied_weights_test.TiedLM, the head tied to the embedding) and reentrant /
    non-reentrant checkpointing (checkpointing_test.Net) in all-reduce DDP + torch AdamW,
    ZeRO-2 and hybrid 2 x 2 + ShardedAdamW, and fully_shard units + torch AdamW on the pieces,
    against torch's own DDP + AdamW (static_graph=True with reentrant checkpoints, as torch);
  - join() (join_test: rank r has 2 + 2 r batches): all-reduce against torch's DDP join(), both
    divide choices; ZeRO-2 and hybrid + ShardedAdamW against join_test's serial AdamW;
    FullyShardedDataParallel + ShardedAdamW (fsdp_join_test's units) against fsdp_join_test's;
  - divergent control flow (divergent_test.Routed, find_unused_parameters) under hybrid and
    FullyShardedDataParallel + ShardedAdamW against torch's DDP(find_unused_parameters=True)
    + AdamW;
  - MoE expert groups (moe_test: the trunk ZeRO-2 over the world or hybrid 2 x 2, each expert
    pair over a 2-rank expert-data-parallel group, one ShardedAdamW.linked, one clip; and
    moe_fsdp_test's trunk and experts fully sharded) against moe_test's serial reference;
  - the tensor-parallel norm (moe_test.tensor_parallel_by_data_parallel: tensor-parallel pairs
    by data-parallel pairs from this world's splits, a replicated layer norm, one global norm)
    in ZeRO-2 and fully sharded, against its serial reference;
  - parameters reached without a gradient (no_grad_reached_test.Gated, find_unused_parameters)
    under ZeRO-2 and hybrid + ShardedAdamW against torch's DDP + AdamW.
Tolerance 1e-6 (1e-5 relative where the local tests use it): gloo's ring adds 4 ranks in
another order than Braid, and Braid's AdamW kernel rounds as its own. Every failure is
collected; the process exits 1 naming each."""

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import braid
from braid import pytorch as bt
import checkpointing_test
import divergent_test
import fsdp_join_test
import join_test
import moe_fsdp_test
import moe_test
import no_grad_reached_test as reached
import tied_weights_test
import train_compare  # init_gloo


def _history(model, net, opt, loss, rank, steps, gathered=False):
    """`steps` steps of loss(model, rank, step); the (full) parameters after each."""
    after = []
    for step in range(steps):
        loss(model, rank, step).backward()
        opt.step()
        opt.zero_grad()
        if gathered:
            with net.summon_full_params():
                after.append([p.detach().clone() for p in net.parameters()])
        else:
            after.append([p.detach().clone() for p in net.parameters()])
    return after


def _differences(what, got, want, atol=1e-6, rtol=0.0):
    out = []
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            if not torch.allclose(a, b, rtol=rtol, atol=atol):
                out.append("%s step %d param %d: %g" % (what, step, i, (a - b).abs().max()))
    if len(got) != len(want):
        out.append("%s: %d steps, torch %d" % (what, len(got), len(want)))
    return out


def _four_modes(group, mesh, recipe, make, loss, steps, adamw, sharded, units, static_graph):
    """`recipe` under all-reduce DDP + torch AdamW, ZeRO-2 and hybrid + ShardedAdamW, and
    fully_shard units (units(net)) + torch AdamW, each against torch DDP + AdamW."""
    rank = group.rank
    ref = make()
    want = _history(TorchDDP(ref, static_graph=static_graph), ref, adamw(ref.parameters()),
                    loss, rank, steps)
    caps = dict(bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
    fails = []
    net = make()
    ddp = bt.DistributedDataParallel(net, group=group, static_graph=static_graph, **caps)
    fails += _differences(recipe + " all-reduce",
                          _history(ddp, net, adamw(net.parameters()), loss, rank, steps), want)
    ddp.close()
    for mode, placement in (("ZeRO-2", dict(group=group, mode="reduce_scatter")),
                            ("hybrid", dict(group=mesh[0], replica_group=mesh[1],
                                            mode="hybrid"))):
        net = make()
        model = bt.DistributedDataParallel(net, **placement, **caps)
        opt = sharded(net.parameters())
        fails += _differences("%s %s" % (recipe, mode),
                              _history(model, net, opt, loss, rank, steps), want)
        opt.close()
        model.close()
    net = make()
    for unit in units(net):
        bt.fully_shard(unit, group=group)
    bt.fully_shard(net, group=group)
    fails += _differences(recipe + " fully_shard",
                          _history(net, net, adamw(net.parameters()), loss, rank, steps,
                                   gathered=True), want)
    net.close()
    return fails


def _tied(group, mesh):
    def adamw(ps):
        return torch.optim.AdamW(ps, lr=0.01)
    return _four_modes(group, mesh, "tied", lambda: tied_weights_test.TiedLM(False),
                       tied_weights_test._loss, tied_weights_test.STEPS, adamw,
                       lambda ps: bt.ShardedAdamW(ps, lr=0.01),
                       lambda net: [net.wte], static_graph=False)


def _checkpointing(group, mesh, reentrant):
    def loss(model, rank, step):
        x, y = checkpointing_test._data(rank, step)
        return torch.nn.functional.mse_loss(model(x), y)
    return _four_modes(group, mesh, "reentrant" if reentrant else "non-reentrant",
                       lambda: checkpointing_test.Net(reentrant), loss, checkpointing_test.STEPS,
                       checkpointing_test._adamw,
                       lambda ps: bt.ShardedAdamW(ps, lr=0.01, weight_decay=0.1),
                       lambda net: list(net.blocks), static_graph=reentrant)


def _join(group):
    rank, size = group.rank, group.size
    fails = []
    for divide in (True, False):
        kwargs = dict(divide_by_initial_world_size=divide)
        model = bt.DistributedDataParallel(join_test.Net(), group)
        hist, state, grads = join_test._sgd_loop(rank, model, kwargs)
        model.close()
        ref_hist, ref_state, ref_grads = join_test._sgd_loop(
            rank, TorchDDP(join_test.Net()), kwargs)
        what = "join all-reduce divide %s" % divide
        fails += _differences(what, hist, ref_hist, rtol=1e-5)
        fails += _differences(what + " final", [list(state.values()) + grads],
                              [list(ref_state.values()) + ref_grads], rtol=1e-5)
        want = join_test._serial_adamw(size, divide)
        for mode in ("reduce_scatter", "hybrid"):
            hist, final = join_test.sharded_join(rank, group, mode, divide)
            what = "join %s divide %s" % (mode, divide)
            fails += _differences(what, hist, want[:len(hist)], rtol=1e-5)  # its own steps
            fails += _differences(what + " final", [final], want[-1:], rtol=1e-5)
        model = fsdp_join_test._wrap(rank, group, size, "units")  # fully sharded + ShardedAdamW
        final, _ = fsdp_join_test._train(rank, model, divide)
        fails += _differences("join fully sharded divide %s final" % divide, [final],
                              [fsdp_join_test.serial_adamw(size, divide)], rtol=1e-5)
    return fails


def _divergent(group, mesh):
    rank = group.rank
    ref_net = divergent_test.Routed()
    ref = TorchDDP(ref_net, find_unused_parameters=True)
    ref_opt = torch.optim.AdamW(ref_net.parameters(), lr=0.01, weight_decay=0.5)
    want = []
    for s in range(divergent_test.STEPS):
        divergent_test._loss(ref, ref_net, rank, s).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append([p.detach().clone() for p in ref_net.parameters()])
    case = divergent_test.DivergentTest()
    fails = _differences("divergent hybrid", case._train(
        rank, group, lambda net, g: bt.DistributedDataParallel(
            net, mode="hybrid", group=mesh[0], replica_group=mesh[1], bucket_cap_mb=1e-4,
            first_bucket_cap_mb=1e-5, find_unused_parameters=True)), want)
    fails += _differences("divergent fully sharded", case._train(
        rank, group, lambda net, g: bt.FullyShardedDataParallel(
            net, g, units=[net.stem, net.head], bucket_cap_mb=1e-4,
            find_unused_parameters=True)), want)
    return fails


def _reached(group, mesh):
    """find_unused_parameters with parameters reached but without a gradient
    (no_grad_reached_test.Gated) under ZeRO-2 and hybrid + ShardedAdamW."""
    rank = group.rank
    ref_net = reached.Gated()
    ref = TorchDDP(ref_net, find_unused_parameters=True)
    want = reached._train(rank, ref, ref_net, torch.optim.AdamW(
        ref_net.parameters(), lr=0.01, weight_decay=0.5))
    fails = []
    for mode, placement in (("ZeRO-2", dict(group=group, mode="reduce_scatter")),
                            ("hybrid", dict(group=mesh[0], replica_group=mesh[1],
                                            mode="hybrid"))):
        net = reached.Gated()
        model = bt.DistributedDataParallel(net, **placement, bucket_cap_mb=1e-4,
                                           first_bucket_cap_mb=1e-5, find_unused_parameters=True)
        opt = bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.5)
        fails += _differences("reached without gradient " + mode,
                              reached._train(rank, model, net, opt), want)
        opt.close()
        model.close()
    return fails


def _moe(group):
    case = moe_test.MoETest()
    want_trunk, want_experts, want_norms = moe_test._reference(group.size)
    fails = []
    for hybrid in (False, True):  # the trunk ZeRO-2, or hybrid 2 x 2
        try:
            got = moe_test.dense_and_experts(case, group.rank, group, hybrid)
            moe_test.check_dense_and_experts(case, [got], want_trunk, want_experts, want_norms,
                                             first_rank=group.rank)
        except AssertionError as e:
            fails.append("MoE %s trunk: %s" % ("hybrid" if hybrid else "ZeRO-2", e))
    try:  # trunk and experts fully sharded
        moe_fsdp_test.check_fully_sharded_moe(
            case, [moe_fsdp_test.fully_sharded_moe(group.rank, group)], group.size,
            first_rank=group.rank)
    except AssertionError as e:
        fails.append("MoE fully sharded: %s" % e)
    return fails


def _tensor_parallel(group):
    """moe_test's tensor-parallel pairs by data-parallel pairs, built from this world's splits,
    in ZeRO-2 and fully sharded, against its serial reference."""
    case = moe_test.MoETest()
    want = moe_test.tensor_parallel_by_data_parallel_reference()
    fails = []
    for what, wrap in (("ZeRO-2", lambda m, g: bt.DistributedDataParallel(
            m, g, mode="reduce_scatter")), ("fully sharded", bt.FullyShardedDataParallel)):
        try:
            moe_test.check_tensor_parallel(case, [moe_test.tensor_parallel_by_data_parallel(
                group.rank, group, wrap)], *want, first_rank=group.rank)
        except AssertionError as e:
            fails.append("tensor-parallel norm %s: %s" % (what, e))
    return fails


def main():
    torch.set_num_threads(1)
    world = braid.World("mpi")
    group = world.group()
    rank, size = group.rank, group.size
    assert size == 4, "run under mpirun -np 4"
    train_compare.init_gloo(group, rank, size)
    mesh = group.mesh(2, 2)
    failures = []
    failures += _tied(group, mesh)
    for reentrant in (True, False):
        failures += _checkpointing(group, mesh, reentrant)
    failures += _join(group)
    failures += _divergent(group, mesh)
    failures += _moe(group)
    failures += _tensor_parallel(group)
    failures += _reached(group, mesh)
    for g in mesh:
        g.close()
    group.close()
    world.close()
    if failures:
        print("rank %d: %d recipe checks differ:\n  %s" % (rank, len(failures),
                                                           "\n  ".join(failures)))
        return 1
    print("recipes_mpi4 rank %d: tied weights, checkpointing (both), join (also fully sharded), "
          "divergent (hybrid, fully sharded), MoE experts (also fully sharded), the "
          "tensor-parallel norm and reached-without-gradient match their references" % rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
