"""The CUDA wiring of braid.fully_shard (braid/_fsdp_device.py) where no GPU is: Debian's torch
is CPU-only, so the streams and events themselves run in the GPU bundle
(tests/gpu/fsdp_cuda_check.py, against torch's own FSDP2). Here, at 2 ranks of a `local` world:
  - the protocol the engine follows on a device, with a recorder in place of the device side:
    every call that may launch or release a gather (unit_enter, unit_exit, summon_params) is
    preceded by order_gathers(), every gradient goes through mark_grad, local pieces' reads are
    followed by reads_done(), closing drains torch's stream (settle) before Braid frees; the recorder hands gradients over as the host path does, and the
    training is bit for bit the host run's (the hooks change nothing but the order);
  - placement (a CUDA module needs an nccl world, a CPU one a host world; named) and the
    offload policy's checks (one setting per model; CPUOffloadPolicy a no-op on the host, bit
    for bit; a backward over local pieces with offload on a device refused, named)."""

import types
import unittest

import torch

from braid import pytorch as bt
from braid._fsdp_device import DeviceUnits, device_placement
from braid._fsdp_policies import check_offload, offloads
from rank_threads import run_ranks
from fully_shard_test import Net, _data, _shard

N = 2
STEPS = 3
_GATHER_CALLS = ("unit_enter", "unit_exit", "summon_params")


class Recorder:
    """Stands in for DeviceUnits: logs each call; hands gradients over as the host path."""

    def __init__(self, reducer, log):
        self.reducer, self.log = reducer, log

    def order_gathers(self):
        self.log.append("order")

    def mark_grad(self, reducer, pid, grad):
        self.log.append("grad")
        reducer.mark_ready_grad(pid, grad)

    def reads_done(self):
        self.log.append("reads_done")

    def check_local(self):
        self.log.append("check_local")

    def settle(self):
        self.log.append("settle")


def _record_optimizer(engine, log):
    """Logs the engine's optimizer calls that launch or release gathers (on the instance)."""
    opt = engine._opt
    for name in _GATHER_CALLS:
        real = getattr(opt, name)

        def call(*args, _real=real, _name=name):
            log.append(_name)
            return _real(*args)
        setattr(opt, name, call)


def _train(r, g, kind, record):
    net = _shard(Net(), g)
    list(net.parameters())  # finalizes: the engine exists
    engine = net._braid_fsdp.engine
    log = []
    if kind == "sharded":
        opt = bt.ShardedAdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    if record:
        engine._cuda = Recorder(engine.reducer, log)
        _record_optimizer(engine, log)
    losses = []
    for s in range(STEPS):
        x, y = _data(r, s)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    if kind == "sharded":
        opt.synchronize()
    with net.summon_full_params():
        full = [p.detach().clone() for p in net.parameters()]
    if kind == "sharded":
        opt.close()
    net.close()
    return losses, full, log


class ProtocolTest(unittest.TestCase):
    def check(self, kind):
        plain = run_ranks(N, lambda r, g: _train(r, g, kind, False))
        recorded = run_ranks(N, lambda r, g: _train(r, g, kind, True))
        for (l0, f0, _), (l1, f1, log) in zip(plain, recorded):
            self.assertEqual(l0, l1)  # bit for bit: the hooks change nothing on the host
            for a, b in zip(f0, f1):
                self.assertTrue(torch.equal(a, b))
            gathers = [i for i, e in enumerate(log) if e in _GATHER_CALLS]
            self.assertGreater(len(gathers), 4 * STEPS)  # units entered and exited every step
            for i in gathers:
                self.assertEqual(log[i - 1], "order", (i, log[max(0, i - 3):i + 1]))
            n_params = len(list(Net().parameters()))
            self.assertEqual(log.count("grad"), n_params * STEPS)
            # Closing drains torch's stream before Braid frees what it read: after the last
            # gather (the full values handed back) and before the reducer goes.
            self.assertEqual(log[-1], "settle")
            self.assertIn("settle", log[gathers[-1]:-1])
        return log

    def test_sharded_optimizer_path(self):
        log = self.check("sharded")
        self.assertNotIn("reads_done", log)  # Braid steps its shards: torch reads none

    def test_local_pieces_path(self):
        log = self.check("torch")
        self.assertEqual(log.count("reads_done"), STEPS)  # after each synced backward's copies
        self.assertEqual(log.count("check_local"), STEPS)


class _Group:
    def __init__(self, device_memory):
        self.device_memory, self.name = device_memory, "g"
        self._world = types.SimpleNamespace(backend="nccl" if device_memory else "local")


class PlacementTest(unittest.TestCase):
    def test_host_module_on_host_group(self):
        named = list(torch.nn.Linear(2, 2).named_parameters())
        self.assertIsNone(device_placement(named, [_Group(False)], "X"))

    def test_host_module_on_nccl_group_is_refused_naming_it(self):
        named = list(torch.nn.Linear(2, 2).named_parameters())
        with self.assertRaisesRegex(ValueError, r"X: parameter 'weight' is a CPU tensor but "
                                                r"group 'g' is on an nccl world"):
            device_placement(named, [_Group(True)], "X")

    def test_meta_module_is_refused_naming_it(self):
        named = list(torch.nn.Linear(2, 2, device="meta").named_parameters())
        with self.assertRaisesRegex(ValueError, r"X: parameter 'weight' is on meta"):
            device_placement(named, [_Group(False)], "X")


class OffloadPolicyTest(unittest.TestCase):
    def test_policy_types(self):
        check_offload(None, "X")
        check_offload(bt.OffloadPolicy(), "X")
        check_offload(bt.CPUOffloadPolicy(pin_memory=False), "X")
        with self.assertRaisesRegex(TypeError, "X: offload_policy must be"):
            check_offload("cpu", "X")
        self.assertTrue(offloads(bt.CPUOffloadPolicy()))
        self.assertFalse(offloads(bt.OffloadPolicy()) or offloads(None))

    def test_offload_on_host_is_a_no_op_bit_for_bit(self):
        def body(r, g, offload):
            net = Net()
            for b in net.blocks:
                bt.fully_shard(b, group=g, offload_policy=offload)
            bt.fully_shard(net, group=g, offload_policy=offload)
            opt = bt.ShardedAdamW(net.parameters(), lr=0.01)
            out = []
            for s in range(STEPS):
                x, y = _data(r, s)
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
                opt.step()
                out.append(loss.item())
            opt.close()
            net.close()
            return out
        plain = run_ranks(N, lambda r, g: body(r, g, None))
        offloaded = run_ranks(N, lambda r, g: body(r, g, bt.CPUOffloadPolicy()))
        self.assertEqual(plain, offloaded)

    def test_offload_must_be_one_setting(self):
        def body(r, g):
            net = Net()
            bt.fully_shard(net.blocks[0], group=g, offload_policy=bt.CPUOffloadPolicy())
            bt.fully_shard(net, group=g)
            with self.assertRaisesRegex(ValueError, "offload_policy differs between units"):
                list(net.parameters())
        run_ranks(N, body)

    def test_offload_with_local_pieces_is_refused(self):
        side = DeviceUnits.__new__(DeviceUnits)  # no CUDA here: only the check
        side.offload = True
        with self.assertRaisesRegex(RuntimeError, "only ShardedAdamW / ShardedSGD step "
                                                  "offloaded shards"):
            side.check_local()
        side.offload = False
        side.check_local()


if __name__ == "__main__":
    unittest.main()
