"""torch profiler ranges for the collectives of braid.pytorch's DistributedDataParallel, named
as torch's process groups name theirs: "<backend>:all_reduce" (Braid's world backend: "mpi",
"gloo", "nccl", "local"; "<backend>:reduce_scatter" in reduce_scatter / hybrid mode).

    ranges = CollectiveRanges(reducer, backend, mode)
    ranges.begin()       # a backward begins; records only while a torch profiler does
    if ranges.recording: ranges.marked(pid)   # its bucket's range opens once it is full
    ranges.end()         # the backward ended: every open range closes
    with profiled("search_unused_parameters"): ...   # a range only while profiling
    call_profiled(name, fn, *args)   # fn(*args), in a range `name` (if not None) then

Contract: one range per bucket and synced backward, from the moment Braid launches the
bucket's collective (its last parameter marked ready) to the end of the backward, where
Braid has observed its completion; recorded with torch.autograd.profiler.record_function,
so torch.profiler.profile and torch.autograd.profiler.profile both list them (with their
counts; unlike torch's, they open and close on the thread running the backward, so the
profiler does not mark them async). With no profiler recording, begin() costs one check
per backward and the caller tests `recording` per parameter; nothing else runs.
"""

import contextlib

import torch


def _recording():
    return torch.autograd._profiler_enabled()  # pylint: disable=protected-access


@contextlib.contextmanager
def profiled(name):
    """record_function(name) while a profiler records, else nothing."""
    if not _recording():
        yield
        return
    with torch.autograd.profiler.record_function(name):
        yield


def call_profiled(name, fn, *args):
    """fn(*args), inside record_function(name) when `name` is given and a profiler records
    (no context manager is entered otherwise)."""
    if name is None or not _recording():
        return fn(*args)
    with torch.autograd.profiler.record_function(name):
        return fn(*args)


class CollectiveRanges:
    """The ranges of one wrapper's bucket collectives (see the module docstring)."""

    def __init__(self, reducer, backend, mode):
        self._reducer = reducer
        self.name = "%s:%s" % (backend, "all_reduce" if mode == "allreduce" else
                               "reduce_scatter")
        self.recording = False
        self._left = None    # bucket -> parameters still to be marked, while recording
        self._bucket = None  # parameter id -> bucket, while recording
        self._open = []

    def begin(self, num_params):
        self.end()
        self.recording = _recording()
        if not self.recording:
            return
        self._bucket = [self._reducer.param_bucket(pid) for pid in range(num_params)]
        self._left = {}
        for b in self._bucket:
            self._left[b] = self._left.get(b, 0) + 1

    def marked(self, pid):
        b = self._bucket[pid]
        self._left[b] -= 1
        if self._left[b] == 0:
            rf = torch.autograd.profiler.record_function(self.name)
            rf.__enter__()
            self._open.append(rf)

    def end(self):
        while self._open:
            self._open.pop().__exit__(None, None, None)
        self.recording, self._left = False, None
