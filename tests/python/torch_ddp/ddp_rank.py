"""One rank of one torch DDP test: what torch's TestDistBackend._run does in a spawned process,
here in a process of `mpirun -np N` (run_torch_ddp_tests.py starts it; see its docstring for
the harness's environment). One difference from _run: torch's DDP-with-ReplicatedTensor mode
(_set_ddp_with_replicated_tensor(True)) stays off, because it imports torch.distributed._shard,
which fails on Python 3.11 in torch 1.13 (a dataclass with a mutable default), so every torch
DDP construction would fail with it.

    mpirun ... -np 2 /usr/bin/python3 ddp_rank.py --impl braid --temp-dir DIR test_ddp_namedtuple

--impl torch runs the test on torch's DDP; --impl braid puts braid_ddp_adapter's subclass of
Braid's wrapper in the place of torch.nn.parallel.DistributedDataParallel (and of
distributed_test's own import of it); Braid's default world, made at the first wrapper after
torch's init, runs torch's backend, gloo, meeting through torch's store at MASTER_ADDR (a
wrapper of the older signature: a World("mpi") created once for the process instead). Either
way the test runs inside cpu_placement.cuda_on_cpu (torch.cuda reports one device per rank,
every GPU placement stays on the CPU; torch's class is cpu_placement's thin subclass that keeps
device_ids on the CPU too), and torch's collectives run on gloo, initialized from a file in
DIR, as torch's harness does.

Each rank writes DIR/result.<rank>.json: {"rank", "time", "status": "pass" | "fail" | "skip",
"exc_type", "message", "traceback"} as soon as the test returns or raises, before any barrier,
so a peer that hangs afterwards does not hide it. A failing rank then exits at once with status
1 (mpirun ends its peers); a passing one passes torch's closing barrier and exits 0.
"""

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
import unittest
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))


def _environment(args, world_size):
    """The variables torch's run_test.py / test_distributed_spawn.py set (BACKEND, WORLD_SIZE,
    TEMP_DIR with barrier/ and test_dir/, INIT_METHOD) and TestDistBackend.setUpClass's
    MASTER_ADDR. Must run before distributed_test is imported: it reads them at import."""
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["TEMP_DIR"] = args.temp_dir
    os.environ["INIT_METHOD"] = "file://" + os.path.join(args.temp_dir, "init_dir",
                                                         "shared_init_file")
    os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"  # as MultiProcessTestCase.run_test
    # TestDistBackend.setUpClass's (no MASTER_PORT): torch inits from the file, and Braid's
    # default world (on gloo, as torch's default group) finds rank 0's host here.
    from torch._utils_internal import TEST_MASTER_ADDR  # pylint: disable=import-outside-toplevel
    os.environ["MASTER_ADDR"] = str(TEST_MASTER_ADDR)
    try:
        import expecttest  # noqa: F401 (torch's test utilities import it)
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "_shim"))


def _write(args, rank, record):
    record["rank"] = rank
    record["time"] = time.time()  # the first rank to fail is the cause, the others follow
    path = os.path.join(args.temp_dir, "result.%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _outcome(self, test_name, skip_codes):
    """Runs the test method as MultiProcessTestCase.run_test does; returns the record."""
    try:
        getattr(self, test_name)()
        return {"status": "pass"}
    except unittest.SkipTest as e:
        return {"status": "skip", "message": str(e)}
    except SystemExit as e:  # torch's skip decorators exit with a code from TEST_SKIPS
        if e.code in skip_codes:
            return {"status": "skip", "message": skip_codes[e.code]}
        return {"status": "fail", "exc_type": "SystemExit",
                "message": "sys.exit(%r)" % (e.code,), "traceback": traceback.format_exc()}
    except BaseException as e:  # noqa: B902 (recorded, then this rank exits non-zero)
        return {"status": "fail", "exc_type": type(e).__name__, "message": str(e),
                "traceback": traceback.format_exc()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=("torch", "braid"), required=True)
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("test")
    args = parser.parse_args()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world_size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    faulthandler.enable()  # a segfault prints the Python stack to the rank's stderr
    _environment(args, world_size)

    import torch
    import torch.distributed as dist

    import cpu_placement
    with cpu_placement.cuda_on_cpu(device_count=world_size):
        return _run(args, rank, world_size, torch, dist, cpu_placement)


def _run(args, rank, world_size, torch, dist, cpu_placement):
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.distributed import distributed_test as dt

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        """test_distributed_spawn.py's class, without the spawning setUp."""

    if args.impl == "braid":
        import braid_ddp_adapter as adapter
        if not adapter.torch_signature_landed():
            adapter.process_world()  # World("mpi"), once per process; closed at exit
        ddp_class = adapter.DistributedDataParallel
    else:
        ddp_class = cpu_placement.TorchDistributedDataParallel
    torch.nn.parallel.DistributedDataParallel = ddp_class  # what the tests call
    dt.DistributedDataParallel = ddp_class                 # distributed_test's own import

    self = TestDistBackendWithSpawn(args.test)
    self.rank = rank
    self.file_name = os.path.join(args.temp_dir, "pg_init_file")
    timeout = dt.CUSTOM_PG_TIMEOUT.get(args.test, dt.default_pg_timeout)
    dist.init_process_group(init_method=self.init_method, backend=dt.BACKEND,
                            world_size=world_size, rank=rank,
                            timeout=timedelta(seconds=timeout))
    self._barrier()
    record = _outcome(self, args.test, {s.exit_code: s.message for s in TEST_SKIPS.values()})
    _write(args, rank, record)
    sys.stdout.flush()
    sys.stderr.flush()
    if record["status"] == "fail":
        sys.stderr.write("ddp_rank %d: %s\n" % (rank, record["traceback"]))
        sys.stderr.flush()
        os._exit(1)  # peers may wait in a collective forever: mpirun ends them
    self._barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
