"""torch profiler ranges for the collectives of braid.pytorch's DistributedDataParallel, named
as torch's process groups name theirs: "<backend>:all_reduce" (Braid's world backend: "mpi",
"gloo", "nccl", "local"; "<backend>:reduce_scatter" in reduce_scatter / hybrid mode).

    ranges = CollectiveRanges(reducer, backend, mode, timeout_ms)
    ranges.begin()       # a backward begins; records only while a torch profiler does
    if ranges.recording: ranges.marked(pid)   # its bucket's range opens once it is full
    ranges.end()         # the backward ended: every range has closed
    with profiled("search_unused_parameters"): ...   # a range only while profiling
    wait_profiled(name, work)        # work.wait(), its range ended where it is seen complete

Contract: one range per bucket and synced backward, from the moment Braid launches the
bucket's collective (its last parameter marked ready, on the backward's thread) to the moment
Braid reports it complete (braid_reducer_wait_bucket), observed on a watcher thread that lives
while the backward records; so, as torch's collective ranges (begun on the calling thread,
ended on the process group's), they span two threads and the profiler marks them async. They
are torch.autograd.profiler.record_function ranges ended through a torch Future the watcher
completes (torch carries the profiler's thread state over), so torch.profiler.profile and
torch.autograd.profiler.profile both list them, with their counts. end() returns once every
range of the backward closed: the watcher's waits share one deadline, the backward's timeout
from its begin (a failed bucket ends its range too; finish_backward raises its error on the
backward's thread). With no profiler recording, begin() costs one check per backward and the
caller tests `recording` per parameter; nothing else runs, and no thread is started.
"""

import contextlib
import functools
import queue
import threading
import time

import torch

from ._lib import BraidError


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


def wait_profiled(name, work):
    """work.wait() for a braid Work just issued; while a profiler records (and `name` is
    given), in a range `name` that a watcher thread ends when it sees the work complete,
    async as torch's collective ranges."""
    if name is None or not _recording():
        return work.wait()
    watcher = _Watcher()
    rf = torch.autograd.profiler.record_function(name)
    rf.__enter__()
    watcher.watch(work.wait, rf)
    try:
        return work.wait()
    finally:
        watcher.close()


class _Watcher:
    """The thread that ends each range when the wait given with it returns (in the order
    given: Braid launches buckets in bucket order)."""

    def __init__(self):
        self._launched = queue.SimpleQueue()  # (wait, torch Future), then None
        self._closed = []                     # each range's end: a Future done once it ran
        self._thread = threading.Thread(target=self._run, name="braid-profiler-ranges",
                                        daemon=True)
        self._thread.start()

    def watch(self, wait, rf):
        """Ends `rf` (a record_function entered) once wait() returned or raised."""
        fut = torch.futures.Future()
        # torch's own way to end a range later, where a future completes (carrying over the
        # profiler's thread state): what torch's RPC profiling uses.
        closed = rf._call_end_callbacks_on_future(fut)  # pylint: disable=protected-access
        self._closed.append(closed)
        self._launched.put((wait, fut))

    def _run(self):
        while True:
            item = self._launched.get()
            if item is None:
                return
            wait, fut = item
            try:
                wait()
            except BraidError:
                pass  # it failed: the backward's thread waits for it too, and raises it
            fut.set_result(None)  # the range ends here, on this thread

    def close(self):
        self._launched.put(None)
        self._thread.join()
        for closed in self._closed:
            closed.wait()


class CollectiveRanges:
    """The ranges of one wrapper's bucket collectives (see the module docstring)."""

    def __init__(self, reducer, backend, mode, timeout_ms):
        self._reducer = reducer
        self._timeout_ms = timeout_ms
        self.backend = backend
        self.name = "%s:%s" % (backend, "all_reduce" if mode == "allreduce" else
                               "reduce_scatter")
        self.recording = False
        self._left = None    # bucket -> parameters still to be marked, while recording
        self._bucket = None  # parameter id -> bucket, while recording
        self._watcher = None
        self._deadline = None  # time.monotonic() by which every wait of a backward ends

    def begin(self, num_params):
        self.end()
        self.recording = _recording()
        if not self.recording:
            return
        # One deadline for the backward's waits (they run one after another on the watcher).
        self._deadline = time.monotonic() + self._timeout_ms / 1000.0
        self._bucket = [self._reducer.param_bucket(pid) for pid in range(num_params)]
        self._left = {}
        for b in self._bucket:
            self._left[b] = self._left.get(b, 0) + 1
        self._watcher = _Watcher()

    def marked(self, pid):
        b = self._bucket[pid]
        self._left[b] -= 1
        if self._left[b] == 0:
            rf = torch.autograd.profiler.record_function(self.name)
            rf.__enter__()
            self._watcher.watch(functools.partial(self._wait_bucket, b), rf)

    def _wait_bucket(self, b):
        left_ms = max(0, int((self._deadline - time.monotonic()) * 1000))
        self._reducer.wait_bucket(b, left_ms)

    def end(self):
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.close()
        self.recording, self._left = False, None
