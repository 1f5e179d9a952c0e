"""Ranks as threads of one process on the `local` backend, for the Python tests.

    from rank_threads import INIT_LOCK, run_ranks
    grads = run_ranks(2, lambda r, group: train(r, group))   # one result per rank

run_ranks(n, fn) calls fn(rank, group) on n threads of a fresh local world (ctypes releases the
GIL inside every Braid call) and re-raises the first rank's failure. torch's global RNG is shared
by the threads: build seeded models under INIT_LOCK (or use a per-thread torch.Generator).
"""

import threading

import braid

TIMEOUT_MS = 20000
INIT_LOCK = threading.Lock()  # rank threads must not interleave draws of the global RNG


def run_ranks(n, fn, world=None):
    """fn(rank, group) on n threads of a local world; re-raises the first failure."""
    own = world is None
    world = world or braid.World("local", local_ranks=n, timeout_ms=TIMEOUT_MS, read_env=False)
    groups = [world.group(r) for r in range(n)]
    results, errors = [None] * n, []

    def body(r):
        try:
            results[r] = fn(r, groups[r])
        except BaseException as e:  # noqa: B902 (reported below)
            errors.append((r, e))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_MS / 1000 * 3)
        assert not t.is_alive(), "a rank thread hung"
    if errors:  # the rank's own error, not what cleaning up after it may raise
        try:
            world.close() if own else None
        except braid.BraidError:
            pass
        raise errors[0][1]
    for g in groups:
        g.close()
    if own:
        world.close()
    return results
