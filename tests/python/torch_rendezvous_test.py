"""braid.World()'s rendezvous through torch.distributed (braid/_torch_rendezvous.py), in one
process: failures of torch's store reach the user as the cause of Braid's error (never
swallowed by the ctypes callback), a world that cannot be placed is refused naming the Python
argument, the explicit-rendezvous keywords reach braid.h's fields, and a real single-process
torch.distributed is picked up. The two-process launch is tests/python/torch_launch_test.py."""
import datetime
import os
import socket
import unittest
from unittest import mock

import torch.distributed as dist

import braid
from braid import _lib, _torch_rendezvous

TIMEOUT_MS = 20000


class FakeStore:
    """torch's Store interface; `fail` names the method that raises."""

    def __init__(self, fail=None):
        self.fail, self.values, self.counters = fail, {}, {}

    def _maybe_fail(self, what):
        if self.fail == what:
            raise RuntimeError("Wait timeout" if what == "wait" else "Broken pipe")

    def add(self, key, n):
        self.counters[key] = self.counters.get(key, 0) + n
        return self.counters[key]

    def set(self, key, value):
        self._maybe_fail("set")
        self.values[key] = value

    def wait(self, keys, timeout):
        assert isinstance(timeout, datetime.timedelta)
        self._maybe_fail("wait")

    def get(self, key):
        return self.values[key]


class FakeDist:
    """What _torch_rendezvous reads of torch.distributed."""

    def __init__(self, rank, size, store):
        self._rank, self._size = rank, size
        self.distributed_c10d = mock.Mock(_get_default_store=lambda: store)

    def get_rank(self):
        return self._rank

    def get_world_size(self):
        return self._size


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class TorchRendezvousTest(unittest.TestCase):

    def world_with(self, fake, **kwargs):
        with mock.patch.object(_torch_rendezvous, "initialized_torch_distributed",
                               return_value=fake):
            return braid.World("gloo", timeout_ms=TIMEOUT_MS, read_env=False, **kwargs)

    def test_a_failing_lookup_is_the_cause(self):
        store = FakeStore(fail="wait")
        with self.assertRaises(braid.BraidError) as ctx:
            self.world_with(FakeDist(1, 2, store), master_addr="127.0.0.1")
        e = ctx.exception
        self.assertEqual(e.code, "TIMEOUT", str(e))
        self.assertIn("rendezvous_lookup returned BRAID_TIMEOUT for key 'braid/gloo/store'", str(e))
        self.assertIn("torch.distributed's store raised RuntimeError: Wait timeout", str(e))
        self.assertIsInstance(e.__cause__, RuntimeError)

    def test_a_failing_publish_is_the_cause(self):
        store = FakeStore(fail="set")
        with self.assertRaises(braid.BraidError) as ctx:
            self.world_with(FakeDist(0, 2, store), master_addr="127.0.0.1")
        self.assertIn("rendezvous_publish returned BRAID_INTERNAL", str(ctx.exception))
        self.assertIn("Broken pipe", str(ctx.exception))

    def test_rank_zero_publishes_its_store_under_a_key_of_its_own(self):
        # Rank 0 publishes, then waits for rank 1, who never comes: the key is there, and the
        # second world's key differs from the first's.
        store = FakeStore()
        for n in (1, 2):
            with self.assertRaises(braid.BraidError) as ctx:
                with mock.patch.object(_torch_rendezvous, "initialized_torch_distributed",
                                       return_value=FakeDist(0, 2, store)):
                    braid.World("gloo", timeout_ms=300, read_env=False, master_addr="127.0.0.1")
            self.assertIn("rank 1 of a world of 2 did not arrive", str(ctx.exception))
            address = store.values["braid/world%d/braid/gloo/store" % n]
            self.assertRegex(address.decode(), r"^127\.0\.0\.1:\d+$")
        self.assertEqual(len(store.values), 2)

    def test_unplaceable_worlds_name_the_argument(self):
        with self.assertRaises(ValueError) as ctx:
            self.world_with(FakeDist(0, 2, FakeStore()), world_size=4, rank=0)
        self.assertIn("braid.World(world_size=4, rank=0)", str(ctx.exception))
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("MASTER_ADDR", None)
            with self.assertRaises(ValueError) as ctx:
                self.world_with(FakeDist(0, 2, FakeStore()))
        self.assertIn("master_addr=", str(ctx.exception))

    def test_keywords_reach_the_fields(self):
        with self.assertRaises(braid.BraidError) as ctx:
            braid.World(store_port=70000, read_env=False)
        self.assertIn("store_port must be -1", str(ctx.exception))
        with self.assertRaises(braid.BraidError) as ctx:
            braid.World(master_addr="10.0.0.1", read_env=False)
        self.assertIn("master_addr describes an explicit rendezvous", str(ctx.exception))
        opts = _lib.init_options(_lib.WorldOptions, "braid_world_options_init")
        self.assertEqual((opts.master_addr, opts.store_port, bool(opts.rendezvous_publish),
                          bool(opts.rendezvous_lookup), opts.rendezvous_data),
                         (None, -1, False, False, None))

    def test_a_real_torch_distributed_is_picked_up(self):
        self.assertIsNone(_torch_rendezvous.initialized_torch_distributed())
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(),
                                rank=0, world_size=1)
        try:
            self.assertIs(_torch_rendezvous.initialized_torch_distributed(), dist)
            store = dist.distributed_c10d._get_default_store()
            self.assertEqual(_torch_rendezvous._tcp_host(store), "127.0.0.1")
            with braid.World("gloo", timeout_ms=TIMEOUT_MS, read_env=False) as world:
                self.assertEqual((world.backend, world.size, world.local_ranks),
                                 ("gloo", 1, [0]))
            # A named "local" world is not torch's: it is made as named.
            with braid.World("local", local_ranks=2, read_env=False) as world:
                self.assertEqual(world.size, 2)
            self.assertEqual(store.add("braid/worlds_of_rank/0", 0), 1)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main()
