"""Braid's default world beside an initialized torch.distributed, under mpirun -np 2, set up as
torch's own DDP tests run (tests/python/torch_ddp/): torch over gloo from a file, WORLD_SIZE
exported alone (no RANK), the default world made after torch's:

  - without MASTER_ADDR (no TCPStore either), the default world cannot meet through torch:
    a ValueError naming MASTER_ADDR and BRAID_BACKEND on every rank, and no world is kept;
  - with it, the default world runs torch's default group's backend, gloo (not the
    launcher's mpi), and DistributedDataParallel(net) without a group gives torch's DDP's
    gradients bit for bit; torch.profiler lists the same events for both: one async
    "gloo:all_reduce" per step (one bucket), and "gloo:broadcast" from the default one-time
    bucket rebuild after the first step (torch broadcasts twice there, Braid once).
"""

import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

import braid
from braid import pytorch as bt


def _init_torch(rank, size):
    jobid = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid", "0")
    path = os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.gettempdir(),
                        "torch_default_world_%s" % jobid)
    os.environ["WORLD_SIZE"] = str(size)  # as torch's test harness: no RANK
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=size)


def _profiled_steps(wrap, rank, steps=3):
    torch.manual_seed(1)
    net = torch.nn.Linear(6, 6, bias=False)
    model = wrap(net)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        grads = []
        for step in range(steps):
            g = torch.Generator().manual_seed(10 * rank + step)
            model(torch.randn(3, 6, generator=g)).sum().backward()
            grads.append(net.weight.grad.clone())
            net.weight.grad = None
        # torch ends its last collective's range on gloo's thread, possibly after the backward
        # returned: let it land before the profiler stops (Braid's have ended by then).
        time.sleep(0.2)
    events = {}
    for e in prof.events():
        if e.name.startswith("gloo:"):
            count, is_async = events.get(e.name, (0, True))
            events[e.name] = (count + e.count, is_async and e.is_async)
    return grads, events


def main(rank, size):
    saved = os.environ.pop("MASTER_ADDR", None)
    try:
        braid.default_world()
        raise AssertionError("a default world met through torch without a master address")
    except ValueError as e:
        for needle in ("torch's default process group ('gloo')", "MASTER_ADDR",
                       "BRAID_BACKEND"):
            assert needle in str(e), str(e)
    os.environ["MASTER_ADDR"] = saved or "127.0.0.1"
    world = braid.default_world()
    assert world.backend == "gloo", world.backend

    want, tevents = _profiled_steps(torch.nn.parallel.DistributedDataParallel, rank)
    got, events = _profiled_steps(bt.DistributedDataParallel, rank)
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), "step %d: %s vs torch's %s" % (step, g, w)
    assert events["gloo:all_reduce"] == (3, True), events
    assert tevents["gloo:all_reduce"] == (3, True), tevents
    assert events["gloo:broadcast"][0] == 1, events
    assert tevents["gloo:broadcast"][0] >= 1, tevents
    assert set(events) == set(tevents), (events, tevents)
    print("torch_default_world_mpi: rank %d of %d passed" % (rank, size), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    r, n = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    _init_torch(r, n)
    try:
        main(r, n)
    except BaseException:  # noqa: B902 (the other rank must not wait in a collective)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()
    sys.exit(0)
