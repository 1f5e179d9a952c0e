"""torch DDP's device_ids / output_device for braid.pytorch's DistributedDataParallel.

    device_ids, output_device = check_devices(device_ids, output_device, device, what)
    inputs, kwargs = to_device((inputs, kwargs), device_ids[0])   # in forward, when given

Contract (torch 1.13's meaning, single-device modules, the only ones Braid wraps):
  - a CPU module: device_ids and output_device stay None (torch raises when either is set;
    as torch, an empty list and output_device=0 pass as "not set");
  - a CUDA module: device_ids is None or one device (int, "cuda:k" or torch.device), which
    must be the parameters' device; output_device defaults to it and must be it too (torch
    keeps a single-device module's outputs where the module leaves them). With device_ids
    given, forward moves the tensors among its arguments (through lists, tuples, dicts) to
    that device first, as torch does;
  - anything else is a ValueError naming the argument.
"""

import torch


def _index(value, arg, what):
    try:
        return torch._utils._get_device_index(value, optional=True)  # torch's own parser
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError("%s: %s=%r is not a CUDA device (%s)" % (what, arg, value, e)) from None


def check_devices(device_ids, output_device, device, what):
    """(device_ids, output_device) as torch DDP stores them: None, None for a CPU module (or
    a CUDA one without device_ids), else [index], index. `device`: the parameters' CUDA index
    or None (CPU)."""
    if device_ids is not None and not isinstance(device_ids, (list, tuple)):
        raise ValueError("%s: device_ids=%r: a list of one device (or None)" % (what, device_ids))
    if device_ids is not None and len(device_ids) > 1:
        raise ValueError("%s: device_ids=%r: only one device per process (device_ids can only "
                         "be None or contain a single element, as in torch DDP)" %
                         (what, device_ids))
    if device is None or not device_ids:
        if device_ids or output_device:
            raise ValueError(
                "%s: device_ids=%r, output_device=%r: these name the GPU of a CUDA module; "
                "%s, so leave both None (torch DDP requires the same)" % (
                    what, device_ids, output_device,
                    "this module's parameters are on the CPU" if device is None else
                    "without device_ids, output_device has nothing to refer to"))
        return None, None
    index = _index(device_ids[0], "device_ids[0]", what)
    if index != device:
        raise ValueError("%s: device_ids=%r, but the module's parameters are on cuda:%d; pass "
                         "device_ids=[%d] (one process per GPU)" % (what, device_ids, device,
                                                                    device))
    out = index if output_device is None else _index(output_device, "output_device", what)
    if out != device:
        raise ValueError("%s: output_device=%r: a single-device module's outputs stay on its "
                         "device, cuda:%d; pass output_device=None or %d" % (
                             what, output_device, device, device))
    return [index], out


def to_device(obj, index):
    """`obj` with every tensor in it (through lists, tuples, namedtuples, dicts) on
    cuda:`index`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(torch.device("cuda", index))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(v, index) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, index) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, index)) for k, v in obj.items())
    return obj
