"""GPU placement kept on the CPU: lets torch's GPU-placed DDP tests run on a machine without a
GPU (torch 1.13 built for CPU), for torch's DDP and Braid's alike.

    with cpu_placement.cuda_on_cpu(device_count=2):
        test()          # torch.cuda says 2 devices; x.cuda(1), .to("cuda:1"),
                        # torch.randn(..., device="cuda:0") all stay on the CPU

Most of distributed_test.py's DDP tests are decorated skip_if_lt_x_gpu(2) and place models and
inputs with .cuda(rank) / device_ids=[rank], though nothing in them needs a GPU but that
placement: gloo reduces CPU tensors. This module, used by ddp_rank.py for both
implementations, so that "the tests torch passes" and Braid's results are over the same tests:
  - torch.cuda reports `device_count` devices (is_available, device_count); set_device,
    synchronize, manual_seed and the device context are no-ops; Stream / Event / stream() /
    current_stream() are inert stand-ins (CPU work is synchronous);
  - a TorchFunctionMode rewrites every CUDA device argument of every torch call to "cpu"
    (device="cuda:1" / device=1, .to("cuda:1"), .to(torch.device("cuda", 1)), .to(1)) and
    makes Tensor.cuda(...)
    a copy to the CPU (what .cuda() is for a CPU tensor: a new tensor, differentiable);
    pin_memory() returns the tensor;
  - placed_on_cpu(device_ids, output_device, module): the DDP constructor arguments a GPU
    placement would pass, kept on the CPU: None for a module whose parameters are all on the
    CPU (torch refuses device_ids for CPU modules). TorchDistributedDataParallel applies it to
    torch's own class; braid_ddp_adapter applies it to Braid's.
What stays different from a GPU: tensors report device "cpu" (a test asserting a CUDA device
fails on torch too, and is then not counted), CUDA-only kernels (SyncBatchNorm, AMP's
GradScaler) fail as on any CPU, and nothing runs asynchronously.
"""

import contextlib

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(value):
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.startswith("cuda")


def _is_index(value):
    """device=3: a CUDA device index."""
    return isinstance(value, int) and not isinstance(value, bool)


def _on_cpu(value):
    return torch.device("cpu") if isinstance(value, torch.device) else "cpu"


class _CpuPlacementMode(TorchFunctionMode):
    """Every CUDA device argument of a torch call becomes the CPU (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0].to("cpu", copy=True)
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and _is_index(args[1]):
            args = (args[0], "cpu") + tuple(args[2:])  # .to(rank): a device index
        args = tuple(_on_cpu(a) if _is_cuda(a) else a for a in args)
        kwargs = {k: _on_cpu(v) if _is_cuda(v) or (k == "device" and _is_index(v)) else v
                  for k, v in kwargs.items()}
        return func(*args, **kwargs)


class _Event:
    """torch.cuda.Event on the CPU: every operation completes at once."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


class _Stream:
    """torch.cuda.Stream on the CPU (work is synchronous, so every wait is already met)."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self):
        pass

    def query(self):
        return True


@contextlib.contextmanager
def cuda_on_cpu(device_count):
    """torch.cuda reports `device_count` devices and every placement stays on the CPU (module
    docstring), until the block exits. Enter it before importing distributed_test: some of its
    skip decorators read torch.cuda at import."""
    names = ("is_available", "device_count", "set_device", "current_device", "synchronize",
             "manual_seed", "manual_seed_all", "device", "Stream", "Event", "stream",
             "current_stream", "default_stream", "empty_cache")
    saved = {n: getattr(torch.cuda, n) for n in names}
    stand_ins = dict(
        is_available=lambda: True, device_count=lambda: device_count,
        set_device=lambda device: None, current_device=lambda: 0,
        synchronize=lambda device=None: None, manual_seed=lambda seed: None,
        manual_seed_all=lambda seed: None, device=lambda device: contextlib.nullcontext(),
        Stream=_Stream, Event=_Event, stream=lambda stream: contextlib.nullcontext(),
        current_stream=lambda device=None: _Stream(),
        default_stream=lambda device=None: _Stream(), empty_cache=lambda: None)
    for name, value in stand_ins.items():
        setattr(torch.cuda, name, value)
    try:
        with _CpuPlacementMode():
            yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


def placed_on_cpu(device_ids, output_device, module):
    """(device_ids, output_device) for DDP: None, None when every parameter of `module` is on
    the CPU (where a GPU placement was kept); unchanged otherwise."""
    if all(p.device.type == "cpu" for p in module.parameters()):
        return None, None
    return device_ids, output_device


class TorchDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch's own DDP, with the GPU placement arguments kept on the CPU (placed_on_cpu);
    everything else is torch's. Module-level, so torch.save(ddp) pickles it."""

    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        device_ids, output_device = placed_on_cpu(device_ids, output_device, module)
        super().__init__(module, device_ids, output_device, *args, **kwargs)
