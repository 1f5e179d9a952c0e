"""Parameters and buffers a braid.pytorch.DistributedDataParallel leaves alone, as torch 1.13
DDP's _set_params_and_buffers_to_ignore_for_model:

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["fc2.weight"])
    model = DistributedDataParallel(net)   # fc2.weight: not reduced, broadcast nor checked

Contract (torch's parameters_to_ignore): names are fully qualified ("module.param"), set on
the module before it is wrapped; an ignored parameter is not registered with Braid's reducer
(no hook; its .grad is the module's own), and ignored parameters and buffers are left out of
the construction's same-model check and broadcast and of the buffer broadcasts before
forwards (so they may differ across ranks). join() refuses a model with ignored buffers by
name (its buffer broadcasts are braid/_join.py's own).
"""


def set_for_model(module, params_and_buffers_to_ignore):
    """torch's static DistributedDataParallel._set_params_and_buffers_to_ignore_for_model."""
    module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore


def ignored(module):
    """The set of names `module` was given (empty when none)."""
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", None) or ())


def named_parameters(module, ignore):
    return [(n, p) for n, p in module.named_parameters() if n not in ignore]


def named_buffers(module, ignore):
    return [(n, b) for n, b in module.named_buffers() if n not in ignore]


def refuse_join(ddp):
    names = [n for n, _ in ddp.module.named_buffers() if n in ddp._ignored]
    if names:
        raise ValueError("join(): the model ignores buffers (%s, torch's "
                         "parameters_to_ignore); Braid's join() broadcasts every buffer"
                         % ", ".join(repr(n) for n in names[:3]))
