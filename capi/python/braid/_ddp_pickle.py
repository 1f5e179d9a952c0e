"""Pickling braid.pytorch's DistributedDataParallel (torch.save(ddp), pickle, copy.deepcopy),
as torch 1.13 DDP's __getstate__ / __setstate__: the module and the constructor's arguments
are saved, not the reducer, hooks or groups.

    torch.save(ddp, "ddp.pt")            # ddp over the default group
    ddp = torch.load("ddp.pt")           # every rank, at the same point: a working wrapper

Contract:
  - only a wrapper over the default group (braid.core.default_group(), what the constructor
    uses without group= / process_group=, or a torch ProcessGroup spanning the whole world),
    as torch allows only its default process group; anything else is a RuntimeError saying
    what to save instead. A wrapper with a ShardedAdamW / ShardedSGD on it is refused too
    (the optimizer's hooks and views are not part of the model);
  - unpickling builds the wrapper again over the default group with the saved arguments:
    collective over the default world, as construction is (same-model check, reducer),
    without the broadcast from rank 0 (torch's unpickling does not broadcast either).
    Parameters unpickle without .grad (torch's Parameter pickling), so every p.grad is None.
"""

from ._default_world import is_default_group


def getstate(ddp):
    groups = ddp._groups
    if len(groups) > 1 or not is_default_group(groups[0]):
        raise RuntimeError(
            "pickling DistributedDataParallel (torch.save(model), pickle, copy.deepcopy) "
            "works only over the default group, as torch DDP's over the default process "
            "group: construct it without group= / process_group= / replica_group= (or with "
            "torch's default group), or save model.module or model.state_dict()")
    if ddp._stepper is not None:  # pylint: disable=protected-access
        raise RuntimeError(
            "pickling DistributedDataParallel with a ShardedAdamW / ShardedSGD on it: the "
            "optimizer's hooks and views cannot be saved with the model; save "
            "model.state_dict() and opt.state_dict() instead")
    return {"module": ddp.module, "config": dict(ddp._config)}  # pylint: disable=protected-access


def init_args(state):
    """(module, keyword arguments) that build the unpickled wrapper again (its
    __setstate__ calls the constructor with them)."""
    return state["module"], dict(state["config"], broadcast_from_rank0=False)
