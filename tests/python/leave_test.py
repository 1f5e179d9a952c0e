"""A rank that leaves the job without a collective shutdown (issue 23 item 3): rank 1 raises
(or calls sys.exit) right after an all-reduce both ranks finished, before the next one; the
interpreter exits and closes its world at exit. Rank 0's pending all-reduce and its next call
must fail within 2 s of rank 1's leaving, naming rank 1 (before: rank 0 waited out its whole
deadline). Rank 1 records when it decided to leave, right before it raises (so the figures
include its interpreter's teardown; its world is closed at exit, or earlier when sys.exit
drops the frame holding it); rank 0 prints "leave_test: rank 0 passed" for leave_test.sh.

    leave_test.py BACKEND HOW TMPDIR     # BACKEND mpi | gloo, HOW raise | exit
"""

import os
import sys
import time

import numpy as np

import braid
from braid import BraidError

DEADLINE_MS = 30000  # what rank 0 would wait without the fix
LIMIT_S = 2.0


def _record_leaving(path):
    with open(path, "w") as f:
        f.write(repr(time.time()))


def _expect_failure(what, call):
    try:
        call()
    except BraidError as e:
        return e, time.time()
    raise AssertionError("%s succeeded although rank 1 left" % what)


def main():
    backend, how, tmp = sys.argv[1:4]
    world = braid.World(backend, timeout_ms=DEADLINE_MS)
    g = world.group()
    rank = g.rank
    x = np.ones(16, dtype=np.float32)
    g.allreduce(x).wait()  # both ranks are here
    assert x[0] == 2.0, x
    left_file = os.path.join(tmp, "left")
    if rank == 1:
        _record_leaving(left_file)
        if how == "exit":
            sys.exit(3)
        raise RuntimeError("rank 1's training step failed")
    pending = g.allreduce(x)  # rank 1 never issues it
    err_pending, t_pending = _expect_failure("the pending all-reduce", pending.wait)
    err_next, t_next = _expect_failure("the next all-reduce", lambda: g.allreduce(x).wait())
    for _ in range(100):
        if os.path.exists(left_file) and os.path.getsize(left_file) > 0:
            break
        time.sleep(0.05)
    left = float(open(left_file).read())
    print("rank 0: pending failed %.3f s after rank 1 left: %s" % (t_pending - left, err_pending))
    print("rank 0: next failed %.3f s after rank 1 left: %s" % (t_next - left, err_next))
    for err in (err_pending, err_next):
        assert err.code == "PEER_ERROR", err
        assert "rank 1 left the job" in err.message, err
    assert t_pending - left < LIMIT_S, t_pending - left
    assert t_next - left < LIMIT_S, t_next - left
    world.close()
    print("leave_test: rank 0 passed (%s, %s)" % (backend, how))


if __name__ == "__main__":
    main()
