"""Construction checks of braid.pytorch's DistributedDataParallel that torch DDP makes too:
the same model on every rank (torch's _verify_param_shape_across_processes) and a module
wrapped once.

    verify_same_model(module, groups, "DistributedDataParallel")   # collective, before the
                                                                   # construction broadcast

Contract:
  - verify_same_model: every rank describes the parameters and buffers it will broadcast
    (in module.named_parameters(), then named_buffers() order: dtype, shape, requires_grad)
    and the descriptions are compared over each group, with a flag saying whether the rank
    found a difference already (hybrid: the shard group, then the replica group, which holds
    one rank of every shard group: a difference anywhere reaches every rank). Every rank raises
    the same way: ValueError naming the first differing tensor (as this rank names it), its
    shape and dtype on both ranks, and the ranks, instead of a broadcast of mismatched sizes
    (a crash in MPI_Ibcast). Costs two small all-gathers per round, at construction only.
  - check_not_wrapped: a module that is (or contains) a DistributedDataParallel / FSDP, or a
    parameter already claimed by a live braid wrapper (braid/_owners.py), is a ValueError
    naming it (torch DDP would reduce the gradients twice; Braid's second reducer would
    refuse every backward). One exception, torch's idiom of wrapping the same module again
    (`ddp = DistributedDataParallel(model)` in a loop: torch's earlier wrapper is collected):
    an earlier DistributedDataParallel over this very module, with no sharded optimizer, is
    closed with a warning and the new one takes over.
"""

import warnings

import torch

from . import _owners, core
from ._handles import _DTYPES
from .fsdp import FullyShardedParameter


def check_not_wrapped(module, named, what):
    """ValueError when `module` is already wrapped (see the module docstring); `named`: the
    (name, parameter) pairs about to be registered."""
    # Braid's wrappers derive from _owners.Wrapper: no import of the modules defining them.
    wrappers = (_owners.Wrapper, torch.nn.parallel.DistributedDataParallel)
    for sub_name, sub in module.named_modules():
        if isinstance(sub, wrappers):
            raise ValueError(
                "%s: the module %s is already a %s.%s; wrap the plain module once (e.g. "
                "DistributedDataParallel(net), not DistributedDataParallel(DistributedData"
                "Parallel(net)))" % (what, "itself" if not sub_name else repr(sub_name),
                                     type(sub).__module__, type(sub).__name__))
    for name, p in named:
        if isinstance(p, FullyShardedParameter):
            raise ValueError("%s: parameter %r is sharded by a FullyShardedDataParallel; wrap "
                             "the module once" % (what, name))
        owner = _owners.owner(p)
        if owner is not None and owner._replaceable_by(module):
            # torch's idiom `ddp = DDP(model)` again over the same module: torch's earlier
            # wrapper is collected and its hooks go with it; here it is closed, so its hooks
            # cannot reduce this module's gradients a second time.
            warnings.warn("%s: the earlier %s over this %s is closed (a module has one "
                          "wrapper at a time)" % (what, type(owner).__name__,
                                                  type(module).__name__))
            owner.close()
            continue
        if owner is not None and not owner.reducer.closed:
            raise ValueError(
                "%s: parameter %r of %s is already under another braid %s (wrapping %s); "
                "wrap each module once, or close() the other wrapper first" % (
                    what, name, type(module).__name__, type(owner).__name__,
                    type(owner.module).__name__))


def _describe(module, ignore=()):
    """(names, rows): one row per parameter and buffer not named in `ignore`: [kind, dtype
    code, requires_grad, ndim, *shape]."""
    names, rows = [], []
    tensors = ([("parameter", n, t) for n, t in module.named_parameters() if n not in ignore] +
               [("buffer", n, t) for n, t in module.named_buffers() if n not in ignore])
    for kind, name, t in tensors:
        try:
            code = core.dtype_code(t.dtype)
        except ValueError:
            code = -1
        names.append("%s %r" % (kind, name))
        rows.append([0 if kind == "parameter" else 1, code, int(t.requires_grad), t.dim()] +
                    list(t.shape))
    return names, rows


def _flatten(flag, rows):
    out = [flag, len(rows)]
    for row in rows:
        out += [len(row)] + row
    return out


def _unflatten(flat):
    flag, count, rows, at = flat[0], flat[1], [], 2
    for _ in range(count):
        n = flat[at]
        rows.append(flat[at + 1:at + 1 + n])
        at += 1 + n
    return flag, rows


def _spell(row):
    if row is None:
        return "absent"
    dtypes = {v: k for k, v in _DTYPES.items()}
    return "shape %s %s%s" % (tuple(row[4:]), dtypes.get(row[1], "(dtype %d)" % row[1]),
                              "" if row[2] or row[0] else " (requires_grad=False)")


def _device_of_group(group):
    if group.device_memory:
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _gather(group, flat):
    """Every rank's int list `flat` (lengths may differ), in group rank order."""
    device = _device_of_group(group)
    size = group.size
    mine = torch.tensor([len(flat)], dtype=torch.int64, device=device)
    lengths = torch.empty(size, dtype=torch.int64, device=device)
    if device is not None:
        torch.cuda.synchronize(device)
    group.allgather(mine, lengths).wait()
    lengths = lengths.tolist()
    width = max(lengths)
    send = torch.zeros(width, dtype=torch.int64, device=device)
    send[:len(flat)] = torch.tensor(flat, dtype=torch.int64)
    recv = torch.empty(width * size, dtype=torch.int64, device=device)
    if device is not None:
        torch.cuda.synchronize(device)
    group.allgather(send, recv).wait()
    table = recv.view(size, width).tolist()
    return [row[:n] for row, n in zip(table, lengths)]


def _compare(names, mine, my_rank, others, group, what):
    """The message for the first difference between this rank's rows and another's, or
    None."""
    for rank, rows in enumerate(others):
        if rows == mine:
            continue
        for k in range(max(len(mine), len(rows))):
            a = mine[k] if k < len(mine) else None
            b = rows[k] if k < len(rows) else None
            if a == b:
                continue
            name = names[k] if k < len(names) else "tensor %d" % k
            count = ("" if len(rows) == len(mine) else
                     " (rank %d has %d parameters and buffers, rank %d has %d)" %
                     (my_rank, len(mine), rank, len(rows)))
            return ("%s: DDP expects same model across all ranks, but %s has %s on rank %d "
                    "and %s on rank %d of group %r%s: it appears not to match (checked before "
                    "the construction broadcast, as torch DDP does)" % (
                        what, name, _spell(a), my_rank, _spell(b), rank, group.name, count))
    return None


class ModelMismatchError(RuntimeError, ValueError):
    """The ranks wrap different models: a RuntimeError as torch DDP's own check raises, and a
    ValueError (the argument, the module, is wrong)."""


def verify_same_model(module, groups, what, ignore=()):
    """Collective over `groups` (see the module docstring); `ignore`: names left out."""
    names, mine = _describe(module, ignore)
    message, failed = None, 0
    for group in groups:
        table = [_unflatten(flat) for flat in _gather(group, _flatten(failed, mine))]
        message = message or _compare(names, mine, group.rank, [rows for _, rows in table],
                                      group, what)
        failed = int(bool(message) or any(flag for flag, _ in table))
    if failed:
        raise ModelMismatchError(
            message or "%s: DDP expects same model across all ranks; another rank found ranks "
            "wrapping different models (its error names them)" % what)
