"""Python objects over Braid's C handles: World, Group, Work, Reducer, Optimizer.

Each object owns one handle and releases it in close() (also on `with` exit and, as a last
resort, at garbage collection or interpreter exit). Children keep their parents alive (a Group
its World, a Reducer its groups, an Optimizer its Reducer), and a World closes whatever is
still open under it, newest first, when it closes: so an `mpi` world always reaches
MPI_Finalize, even in a script that forgets to close.

Buffers: anything exposing its memory — a torch.Tensor (contiguous, CPU), a numpy array, a
bytearray/memoryview, a ctypes array — is accepted where braid.h takes a pointer; the object is
kept referenced by the Work until the collective completes. Device memory: on a World("nccl")
the collectives take contiguous CUDA tensors, and a device Reducer (device=...) takes them for
mark_ready_grad; a raw (address, element count, dtype) tuple works everywhere (e.g. from
Reducer.grad() or your own allocator). braid.pytorch wires CUDA modules (see its docstring).
"""

from ._lib import BraidError  # noqa: F401  (re-exported)

# The objects live in modules below this one (each imports only lower ones), so imports run
# one way: _lib <- _handles <- _world <- _default_world, _reducer, _optimizer <- core.
from ._handles import (MODES, SYNC_MODES, StepReport, buffer_info, dtype_code,  # noqa: F401
                       dtype_size)
from ._world import Group, Work, World, nccl_unique_id  # noqa: F401
from ._reducer import Reducer  # noqa: F401
from ._default_world import default_group, default_world  # noqa: F401
from ._optimizer import PHASES, Optimizer  # noqa: F401
