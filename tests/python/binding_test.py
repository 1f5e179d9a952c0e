"""The ctypes binding on the `local` backend (ranks are threads of this process; ctypes releases
the GIL inside every Braid call): versions and struct layouts against braid.h, collectives against
serial references, bad input raising with the right code and a message naming the problem, and
object lifetimes. The PyTorch wrappers' tests are ddp_wrapper_test.py and fsdp_wrapper_test.py."""

import ctypes
import gc
import os
import tempfile
import threading
import unittest
import weakref

import torch

import braid
from braid import _lib
from braid import pytorch as bt
import wrapper_models as wm
from rank_threads import TIMEOUT_MS, run_ranks


class VersionTest(unittest.TestCase):
    def test_version_and_abi(self):
        self.assertRegex(braid.version(), r"^\d+\.\d+\.\d+$")
        self.assertEqual(_lib.load().braid_abi_version(), _lib.ABI_VERSION)
        self.assertEqual(braid.dtype_size("bfloat16"), 2)
        self.assertEqual(braid.dtype_size(torch.float64), 8)


def _header_path():
    for path in ("capi/braid.h", os.path.join(os.path.dirname(__file__), "..", "..", "capi",
                                               "braid.h")):
        if os.path.exists(path):
            return path
    raise FileNotFoundError("capi/braid.h (a data dependency of this test)")


def _header_text(path):
    """braid.h with each part it includes beside it (`#include "braid_world.h"`, ...) in place:
    the whole API's declarations, whichever part holds them."""
    import re
    beside = os.path.dirname(path)
    return re.sub(r'^#include "(braid_\w+\.h)"$',
                  lambda m: _header_text(os.path.join(beside, m.group(1))),
                  open(path).read(), flags=re.M)


def _header_structs(text):
    """{struct name: [field names in order]} of braid.h's typedef'd structs."""
    import re
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    structs = {}
    for m in re.finditer(r"typedef struct (braid_\w+) \{(.*?)\} \w+;", text, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = re.sub(r"\[[^\]]*\]", "", decl).strip()  # "by_use[N]" -> "by_use"
            if not decl:
                continue
            # "double beta1, beta2, eps" -> three fields; the name is each declarator's last word
            first, *rest = [d.strip() for d in decl.split(",")]
            fields.append(re.findall(r"\w+", first)[-1])
            fields.extend(re.findall(r"\w+", d)[-1] for d in rest)
        structs[m.group(1)] = fields
    return structs


class HeaderLayoutTest(unittest.TestCase):
    """_lib.py mirrors braid.h: the same entry points, the same struct fields in the same order,
    and the same struct sizes as the library's braid_*_options_init writes."""

    STRUCTS = {"braid_world_options": _lib.WorldOptions,
               "braid_collective_options": _lib.CollectiveOptions,
               "braid_param": _lib.Param,
               "braid_reducer_options": _lib.ReducerOptions,
               "braid_optimizer_options": _lib.OptimizerOptions,
               "braid_optimizer_hyper": _lib.OptimizerHyper,
               "braid_memory_counter": _lib.MemoryCounter,
               "braid_memory_stats": _lib.MemoryStats,
               "braid_join_options": _lib.JoinOptions,
               "braid_comm_hook_options": _lib.CommHookOptions}

    def setUp(self):
        self.header = _header_text(_header_path())

    def test_entry_points_match_header(self):
        import re
        declared = set(re.findall(r"^BRAID_API[^(]*?\b(braid_\w+)\(", self.header, flags=re.M))
        self.assertIn("braid_nccl_unique_id", declared)
        self.assertIn("braid_work_device_event", declared)
        self.assertEqual(declared, set(_lib._SIGNATURES))

    def test_struct_fields_match_header(self):
        structs = _header_structs(self.header)
        self.assertEqual(set(structs), set(self.STRUCTS))
        for name, ctype in self.STRUCTS.items():
            self.assertEqual([f[0] for f in ctype._fields_], structs[name], name)

    def test_a_library_struct_larger_than_the_mirror_is_refused(self):
        # A braid package older than its library: init_options must refuse, not let the
        # library write its larger struct past the end of the Python one.
        class OldWorldOptions(ctypes.Structure):
            _fields_ = _lib.WorldOptions._fields_[:3]
        with self.assertRaisesRegex(RuntimeError, "braid_world_options_init.*older than"):
            _lib.init_options(OldWorldOptions, "braid_world_options_init")

    def test_struct_sizes_and_defaults_match_library(self):
        for name, ctype in self.STRUCTS.items():
            if name in ("braid_param", "braid_memory_counter", "braid_memory_stats",
                        "braid_optimizer_hyper"):
                continue  # no _init: an array element, or output structs
            opts = _lib.init_options(ctype, name + "_init")
            self.assertEqual(opts.struct_size, ctypes.sizeof(ctype), name)
        # Defaults at the binding's offsets of the appended (0.6) fields.
        world = _lib.init_options(_lib.WorldOptions, "braid_world_options_init")
        self.assertEqual((world.read_env, world.unique_id, world.unique_id_size,
                          world.world_size, world.rank, world.cuda_device,
                          world.nccl_blocking), (1, None, 0, 0, 0, -1, -1))
        red = _lib.init_options(_lib.ReducerOptions, "braid_reducer_options_init")
        self.assertEqual((red.timeout_ms, red.device), (300000, _lib.DEVICE_HOST))
        # 0.7's appended fields.
        self.assertEqual((bool(red.param_units), red.shard_gradients), (False, 0))
        opt = _lib.init_options(_lib.OptimizerOptions, "braid_optimizer_options_init")
        self.assertEqual((opt.timeout_ms, opt.fully_sharded, opt.reshard_after_forward,
                          opt.prefetch, opt.max_live_bytes, opt.offload, opt.gather_stream),
                         (300000, 0, 1, 1, 0, 0, None))
        self.assertEqual((opt.num_groups, bool(opt.param_groups)), (1, False))  # 0.8


class NcclTest(unittest.TestCase):
    """The nccl backend through the binding on a machine without a GPU (with one, the world is
    created instead): unique ids, the CUDA error, bad fields and a bad BRAID_NCCL_LIBRARY."""

    MISSING = "/nonexistent/braid-binding-test/libnccl.so.2"

    def assertBraidError(self, code, fn, *needles):
        ErrorsTest.assertBraidError(self, code, fn, *needles)

    def test_unique_id(self):
        a, b = braid.nccl_unique_id(), braid.nccl_unique_id()
        self.assertEqual(len(a), _lib.NCCL_UNIQUE_ID_BYTES)
        self.assertNotEqual(a, bytes(len(a)))
        self.assertNotEqual(a, b)

    def test_world_from_unique_id_names_the_cuda_error(self):
        uid = braid.nccl_unique_id()
        try:
            world = braid.World("nccl", unique_id=uid, world_size=1, rank=0, cuda_device=0,
                                nccl_blocking=False, read_env=False, timeout_ms=TIMEOUT_MS)
        except braid.BraidError as e:
            self.assertEqual(e.code, "FAILED_PRECONDITION", str(e))
            self.assertIn("no usable CUDA device", str(e))
            self.assertRegex(str(e), r"\(CUDA error (35|100)\)")
            return
        with world:  # a GPU machine
            self.assertEqual(world.size, 1)

    def test_bad_fields_named(self):
        uid = braid.nccl_unique_id()
        inval = "INVALID_ARGUMENT"
        self.assertBraidError(inval, lambda: braid.World(
            "nccl", unique_id=uid[:127], world_size=1, read_env=False), "unique_id_size is 127")
        self.assertBraidError(inval, lambda: braid.World(
            "nccl", unique_id=uid, world_size=2, rank=2, read_env=False),
            "rank 2 is outside [0, 2)")
        self.assertBraidError(inval, lambda: braid.World(
            "nccl", unique_id=uid, world_size=0, read_env=False), "world_size must be >= 1")
        self.assertBraidError(inval, lambda: braid.World(
            "local", unique_id=uid, world_size=1, read_env=False), "backend is 'local'")
        self.assertBraidError("FAILED_PRECONDITION", lambda: braid.World(
            "local", world_size=2, read_env=False), "explicit rendezvous says rank 0 of 2")
        self.assertBraidError(inval, lambda: braid.World(
            "nccl", unique_id=uid, world_size=1, cuda_device=-3, read_env=False), "cuda_device")

    def test_bad_library_named(self):
        os.environ["BRAID_NCCL_LIBRARY"] = self.MISSING
        try:
            self.assertBraidError("FAILED_PRECONDITION", braid.nccl_unique_id, self.MISSING)
            self.assertBraidError("FAILED_PRECONDITION", lambda: braid.World(
                "nccl", unique_id=bytes(128), world_size=1), self.MISSING, "dlopen")
        finally:
            del os.environ["BRAID_NCCL_LIBRARY"]
        self.assertEqual(len(braid.nccl_unique_id()), 128)

    def test_host_work_has_no_device_event_and_reducer_device_checked(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            g = world.group(0)
            work = g.allreduce(torch.ones(4))
            work.wait(TIMEOUT_MS)
            self.assertIsNone(work.device_event)
            work.close()
            self.assertBraidError("INVALID_ARGUMENT", lambda: braid.Reducer(
                g, [(0, 4, "float32", "w")], device=-2), "opts->device")
            self.assertBraidError("UNIMPLEMENTED", lambda: braid.Reducer(
                g, [(0, 4, "float32", "w")], device=0), "w", "cuda:0", "device buffers")
            red = braid.Reducer(g, [(0, 4, "float32", "w")], device=None)
            red.close()
            # The raw (address, count, dtype) form device memory is given in, here over host
            # memory; ready_event is passed through (host backends need none).
            data = (ctypes.c_float * 4)(1, 2, 3, 4)
            out = (ctypes.c_float * 4)()
            g.allreduce((ctypes.addressof(data), 4, "float32"),
                        (ctypes.addressof(out), 4, "float32"), op="premul_sum",
                        premul_scalar=2.0, ready_event=None).wait(TIMEOUT_MS)
            self.assertEqual(list(out), [2.0, 4.0, 6.0, 8.0])
            with self.assertRaisesRegex(ValueError, "send: a raw buffer is an"):
                g.allreduce((ctypes.addressof(data), 4))
            g.close()


class CollectivesTest(unittest.TestCase):
    def test_allreduce_ops_match_serial(self):
        n = 3
        inputs = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(n)]
        want_sum = inputs[0] + inputs[1] + inputs[2]  # the same left-to-right order

        def body(r, g):
            out = {}
            for op in ("sum", "max", "min"):
                t = inputs[r].clone()
                g.allreduce(t, op=op).wait(TIMEOUT_MS)
                out[op] = t
            return out

        for out in run_ranks(n, body):
            torch.testing.assert_close(out["sum"], want_sum, rtol=1e-6, atol=1e-6)
            self.assertTrue(torch.equal(out["max"], torch.stack(inputs).max(0).values))
            self.assertTrue(torch.equal(out["min"], torch.stack(inputs).min(0).values))

    def test_reduce_scatter_allgather_broadcast_barrier(self):
        n = 2
        send = [torch.arange(8, dtype=torch.float64) * (r + 1) for r in range(n)]

        def body(r, g):
            shard = torch.zeros(4, dtype=torch.float64)
            g.reduce_scatter(send[r], shard).wait(TIMEOUT_MS)
            full = torch.zeros(8, dtype=torch.float64)
            g.allgather(shard, full).wait(TIMEOUT_MS)
            b = torch.full((3,), float(r), dtype=torch.int64)
            g.broadcast(b, root=1).wait(TIMEOUT_MS)
            work = g.barrier()
            work.wait(TIMEOUT_MS)
            self.assertTrue(work.done())
            return shard, full, b

        for r, (shard, full, b) in enumerate(run_ranks(n, body)):
            self.assertTrue(torch.equal(shard, (send[0] + send[1])[4 * r:4 * r + 4]))
            self.assertTrue(torch.equal(full, send[0] + send[1]))
            self.assertTrue(torch.equal(b, torch.ones(3, dtype=torch.int64)))

    def test_flight_recorder_dump(self):
        import json
        n = 2
        with tempfile.TemporaryDirectory() as d:
            def body(r, g):
                t = torch.ones(8)
                g.allreduce(t, label="step0").wait(TIMEOUT_MS)
                g.allreduce(t, label="step1").wait(TIMEOUT_MS)
                path = os.path.join(d, "rank%d.jsonl" % r)
                g.flight_recorder_dump(path)
                with self.assertRaisesRegex(braid.BraidError, "BRAID_FLIGHT_RECORDER_DIR"):
                    g.flight_recorder_dump()  # no path and no directory configured
                with open(path) as f:
                    return [json.loads(line) for line in f if line.strip()]

            for r, records in enumerate(run_ranks(n, body)):
                self.assertEqual(records[0]["rank"], r)  # the header line, then the records
                mine = [x for x in records[1:] if x["label"] in ("step0", "step1")]
                self.assertEqual([x["label"] for x in mine], ["step0", "step1"])
                self.assertEqual([x["state"] for x in mine], ["completed"] * 2)
                self.assertEqual({x["bytes"] for x in mine}, {32})
                self.assertEqual({(x["group_rank"], x["group_size"]) for x in mine}, {(r, n)})
                self.assertLess(mine[0]["seq"], mine[1]["seq"])

    def test_group_split_and_mesh(self):
        def body(r, g):
            sub = g.split(r % 2, key=r)
            shard, replica = g.mesh(2, 2)
            out = (sub.size, sub.rank, shard.size, shard.rank, replica.size, replica.rank)
            for h in (sub, shard, replica):
                h.close()
            self.assertIsNone(g.split(braid.NO_COLOR))
            return out

        got = run_ranks(4, body)
        for r, (ss, sr, sh, shr, rp, rpr) in enumerate(got):
            self.assertEqual((ss, sr), (2, r // 2))
            self.assertEqual((sh, shr, rp, rpr), (2, r % 2, 2, r // 2))


class ErrorsTest(unittest.TestCase):
    def assertBraidError(self, code, fn, *needles):
        with self.assertRaises(braid.BraidError) as ctx:
            fn()
        self.assertEqual(ctx.exception.code, code, str(ctx.exception))
        for needle in needles:
            self.assertIn(needle, str(ctx.exception))

    def test_world_errors(self):
        self.assertBraidError("NOT_FOUND", lambda: braid.World("no_such_backend"),
                              "no_such_backend")
        self.assertBraidError("NOT_FOUND",
                              lambda: braid.World(plugin_path="/nonexistent/libplugin.so"),
                              "/nonexistent/libplugin.so")
        opts = _lib.WorldOptions()
        _lib.load().braid_world_options_init(ctypes.byref(opts))
        opts.struct_size = 3
        out = ctypes.c_void_p()
        self.assertBraidError("INVALID_ARGUMENT", lambda: _lib.call(
            "braid_world_create", ctypes.byref(opts), ctypes.byref(out)), "struct_size")

    def test_handles(self):
        world = braid.World("local", local_ranks=1, read_env=False)
        group = world.group(0)
        # A group handle where a world is expected; a made-up handle; a destroyed one.
        self.assertBraidError("INVALID_ARGUMENT",
                              lambda: _lib.call("braid_world_destroy", group.handle))
        self.assertBraidError("INVALID_ARGUMENT",
                              lambda: _lib.call("braid_group_destroy", ctypes.c_void_p(0x1234)))
        # Destroying the world under a live group (the children check) changes nothing.
        self.assertBraidError("FAILED_PRECONDITION",
                              lambda: _lib.call("braid_world_destroy", world.handle), "group")
        stale = ctypes.c_void_p(group.handle.value)
        group.close()
        self.assertBraidError("INVALID_ARGUMENT", lambda: _lib.call("braid_group_destroy", stale))
        with self.assertRaisesRegex(ValueError, "closed"):
            group.rank
        world.close()

    def test_bad_buffers_named(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            with world.group(0) as g:
                with self.assertRaisesRegex(ValueError, "send: tensor is not contiguous"):
                    g.allreduce(torch.zeros(4, 4).t())
                with self.assertRaisesRegex(ValueError, "int8"):
                    g.allreduce(torch.zeros(4, dtype=torch.int8))
                with self.assertRaisesRegex(ValueError, "send: read-only buffer"):
                    g.allreduce(b"abcd")
                with self.assertRaisesRegex(ValueError, "recv has 3 elements"):
                    g.allreduce(torch.zeros(4), torch.zeros(3))

    def test_reducer_misuse(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            g = world.group(0)
            red = braid.Reducer(g, [(0, 4, "float32", "w"), (1, 2, "float32", "b")])
            self.assertBraidError("FAILED_PRECONDITION", lambda: red.mark_ready(0), "w")
            red.begin_backward()
            red.mark_ready(0)
            self.assertBraidError("FAILED_PRECONDITION", lambda: red.mark_ready(0), "w")
            self.assertBraidError("NOT_FOUND", lambda: red.mark_ready(7), "7")
            self.assertBraidError("FAILED_PRECONDITION", red.finish_backward, "b")
            self.assertBraidError("INVALID_ARGUMENT", lambda: braid.Reducer(
                g, [(0, 4, "float32", "x"), (0, 4, "float32", "y")]), "0")
            self.assertBraidError("FAILED_PRECONDITION", g.close)  # the reducer uses it
            red.close()
            g.close()

    def test_wait_bucket_from_another_thread(self):
        """braid_reducer_wait_bucket (what braid.pytorch's profiler ranges end on): from a
        thread beside the backward's, it returns once the bucket's averaged result is in."""
        def body(r, g):
            red = braid.Reducer(g, [(0, 4, "float32", "w"), (1, 2, "float32", "b")],
                                bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
            self.assertEqual(red.num_buckets, 2)
            grads = [(ctypes.c_float * count).from_address(address)
                     for address, count in (red.grad(0), red.grad(1))]
            for pid, grad in enumerate(grads):
                for k in range(len(grad)):
                    grad[k] = float(r + 1 + pid)
            seen = []

            def wait(bucket):
                try:
                    red.wait_bucket(bucket, TIMEOUT_MS)
                    seen.extend(grads[1])
                except braid.BraidError as e:
                    seen.append(e)

            red.begin_backward()
            red.mark_ready(1)  # the last registered: the first bucket, launched now
            waiter = threading.Thread(target=wait, args=(red.param_bucket(1),))
            waiter.start()
            waiter.join()
            red.mark_ready(0)
            red.finish_backward()
            self.assertBraidError("OUT_OF_RANGE", lambda: red.wait_bucket(5), "bucket 5")
            red.close()
            return seen

        for seen in run_ranks(2, body):
            self.assertEqual(seen, [2.5] * 2)  # (2 + 3) / 2, before finish_backward

    def test_memory_stats(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            g = world.group(0)
            red = braid.Reducer(g, [(0, 1000, "float32", "w"), (1, 24, "float32", "b")])
            m = red.memory_stats()
            self.assertEqual(m["device"], (0, 0))
            self.assertGreaterEqual(m["by_use"]["grad_buckets"][0], 1024 * 4)
            self.assertEqual(sum(c for c, _ in m["by_use"].values()), m["host"][0])
            self.assertGreater(m["allocations"], 0)
            red.reset_memory_peaks()
            self.assertEqual(red.memory_stats()["host"][1], m["host"][0])
            red.close()
            self.assertRaisesRegex(ValueError, "Reducer is closed", red.memory_stats)
            g.close()


class LifetimeTest(unittest.TestCase):
    def test_work_keeps_its_group_and_world_closes_everything(self):
        world = braid.World("local", local_ranks=1, read_env=False)
        group = world.group(0)
        group_ref = weakref.ref(group)
        work = group.barrier()
        del group
        gc.collect()
        self.assertIsNotNone(group_ref())  # the work keeps its group alive
        work.wait(TIMEOUT_MS)
        group = group_ref()
        world.close()  # closes the work, then its group
        self.assertTrue(work.closed and group.closed)

    def test_collected_cycles_are_destroyed_by_the_world_in_order(self):
        world = braid.World("local", local_ranks=1, read_env=False)
        model = bt.DistributedDataParallel(wm.mlp(), world.group(0), mode="reduce_scatter")
        bt.ShardedAdamW(model, lr=0.1)
        del model
        gc.collect()  # the cycle collector frees the optimizer and reducer in any order
        world.close()

    def test_handle_finalized_before_its_children_is_destroyed_by_the_world(self):
        world = braid.World("local", local_ranks=1, read_env=False)
        red = braid.Reducer(world.group(0), [(0, 8, "float32", "w")], mode="reduce_scatter")
        opt = braid.Optimizer(red)
        red.__del__()  # what the cycle collector may do first: fails, the optimizer is alive
        self.assertTrue(red.closed and not opt.closed)  # the world took the raw handle
        world.close()  # the optimizer (newest), then the orphaned reducer, then the group

    def test_tensors_never_view_freed_memory(self):
        net = wm.mlp()
        world = braid.World("local", local_ranks=1, read_env=False)
        model = bt.DistributedDataParallel(net, world.group(0), mode="reduce_scatter")
        opt = bt.ShardedSGD(model, lr=0.1)
        x, y = wm.data(0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.synchronize()
        params = [p.detach().clone() for p in net.parameters()]
        grad_ptr = net[0].weight.grad.data_ptr()
        world.close()  # closes optimizer and reducer: tensors get copies first
        self.assertNotEqual(net[0].weight.grad.data_ptr(), grad_ptr)
        for p, want in zip(net.parameters(), params):
            self.assertTrue(torch.equal(p.detach(), want))
        torch.nn.functional.mse_loss(net(x), y).backward()  # a plain module again

    def test_closed_model_is_a_plain_module_again(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            net = wm.mlp()
            model = bt.DistributedDataParallel(net, world.group(0))
            model.close()
            x, y = wm.data(0)
            torch.nn.functional.mse_loss(net(x), y).backward()
            want = wm.serial_grads([0])[0]
            self.assertTrue(torch.equal(net[0].weight.grad, want[0]))

    def test_set_param_checks_count_and_dtype(self):
        with braid.World("local", local_ranks=1, read_env=False) as world:
            red = braid.Reducer(world.group(0), [(0, 8, "float32", "w")], mode="reduce_scatter")
            opt = braid.Optimizer(red)
            with self.assertRaisesRegex(ValueError, "parameter 0: 1 elements given, registered 8"):
                opt.set_param(0, torch.zeros(1))
            with self.assertRaisesRegex(ValueError, "parameter 0: values of dtype"):
                opt.set_param(0, torch.zeros(8, dtype=torch.float64))
            with self.assertRaisesRegex(KeyError, "parameter 3"):
                opt.set_param(3, torch.zeros(8))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
