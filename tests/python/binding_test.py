"""The ctypes binding and the PyTorch integration on the `local` backend (ranks are threads of
this process; ctypes releases the GIL inside every Braid call). Results are compared with serial
references computed here; bad input must raise with the right code and a message naming the
problem."""

import ctypes
import functools
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

TIMEOUT_MS = 20000


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
        with open(_header_path()) as f:
            self.header = f.read()

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


def _null():
    import contextlib
    return contextlib.nullcontext()


_INIT_LOCK = threading.Lock()  # rank threads must not interleave draws of the global RNG


def _mlp():
    with _INIT_LOCK:
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                                   torch.nn.Linear(5, 3))


def _data(r, micro=0):
    g = torch.Generator().manual_seed(100 * r + micro)
    return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)


def _serial_grads(ranks, micros=1):
    """Per-rank gradients (summed over micro-batches) of the same model, computed serially."""
    out = []
    for r in ranks:
        m = _mlp()
        for micro in range(micros):
            x, y = _data(r, micro)
            torch.nn.functional.mse_loss(m(x), y).backward()
        out.append([p.grad.clone() for p in m.parameters()])
    return out


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
        model = bt.DistributedDataParallel(_mlp(), world.group(0), mode="reduce_scatter")
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
        net = _mlp()
        world = braid.World("local", local_ranks=1, read_env=False)
        model = bt.DistributedDataParallel(net, world.group(0), mode="reduce_scatter")
        opt = bt.ShardedSGD(model, lr=0.1)
        x, y = _data(0)
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
            net = _mlp()
            model = bt.DistributedDataParallel(net, world.group(0))
            model.close()
            x, y = _data(0)
            torch.nn.functional.mse_loss(net(x), y).backward()
            want = _serial_grads([0])[0]
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


def _torch_reference(group, make_optimizer, train):
    """Final parameters of _mlp() trained by train(model, optimizer) with Braid's all-reduce
    and a torch optimizer: the reference the sharded optimizers are compared with."""
    ref = bt.DistributedDataParallel(_mlp(), group)
    train(ref, make_optimizer(ref.parameters()))
    want = [p.detach().clone() for p in ref.parameters()]
    ref.close()
    return want


class PyTorchTest(unittest.TestCase):
    def test_grads_are_bucket_views_averaged_like_ddp(self):
        n = 2
        per_rank = _serial_grads(range(n))
        want = [(a + b) / n for a, b in zip(*per_rank)]

        def body(r, g):
            model = bt.DistributedDataParallel(_mlp(), g, bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            self.assertGreater(model.reducer.num_buckets, 1)
            views = [p.grad for p in model.parameters()]  # None until a backward, as torch
            addresses = [model.reducer.grad(i)[0] for i in range(len(views))]
            x, y = _data(r)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            still = [p.grad.data_ptr() for p in model.parameters()]
            model.zero_grad()
            zeroed = all(p.grad.abs().sum() == 0 for p in model.parameters())
            model.close()
            return views, addresses, still, grads, zeroed

        for views, addresses, still, grads, zeroed in run_ranks(n, body):
            self.assertEqual(views, [None] * len(addresses))
            self.assertEqual(still, addresses)
            self.assertTrue(zeroed)
            for got, w in zip(grads, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)

    def test_bf16_parameters_reduced_in_f32(self):
        n = 3

        def model():
            return _mlp().to(torch.bfloat16)

        per_rank = []
        for r in range(n):
            m = model()
            x, y = _data(r)
            ((m(x.bfloat16()) - y.bfloat16()) ** 2).mean().backward()  # no bf16 mse_loss on CPU
            per_rank.append([p.grad.float() for p in m.parameters()])
        # Summed in f32 in rank order, divided, rounded to bf16 once.
        want = [((a + b + c) / n).bfloat16() for a, b, c in zip(*per_rank)]

        def body(r, g):
            ddp = bt.DistributedDataParallel(model(), g, reduce_dtype="float32")
            x, y = _data(r)
            ((ddp(x.bfloat16()) - y.bfloat16()) ** 2).mean().backward()
            grads = [p.grad.clone() for p in ddp.parameters()]
            ddp.close()
            return grads

        for grads in run_ranks(n, body):
            for got, w in zip(grads, want):
                self.assertEqual(got.dtype, torch.bfloat16)
                self.assertTrue(torch.equal(got, w), (got - w).abs().max())

    def test_no_sync_accumulates_locally_then_syncs(self):
        n = 2
        first = _serial_grads(range(n), micros=1)
        both = _serial_grads(range(n), micros=2)
        want = [(a + b) / n for a, b in zip(*both)]

        def body(r, g):
            model = bt.DistributedDataParallel(_mlp(), g)
            with model.no_sync():
                x, y = _data(r, 0)
                torch.nn.functional.mse_loss(model(x), y).backward()
            local = [p.grad.clone() for p in model.parameters()]
            x, y = _data(r, 1)
            torch.nn.functional.mse_loss(model(x), y).backward()
            synced = [p.grad.clone() for p in model.parameters()]
            model.close()
            return local, synced

        for r, (local, synced) in enumerate(run_ranks(n, body)):
            for got, w in zip(local, first[r]):
                self.assertTrue(torch.equal(got, w))
            for got, w in zip(synced, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-7)

    def test_unused_parameter_named_unless_allowed(self):
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

            def forward(self, x):
                return self.used(x)

        def body(r, g):
            strict = bt.DistributedDataParallel(TwoHeads(), g)
            strict(torch.ones(1, 3)).sum().backward()  # torch's moment: the next forward
            with self.assertRaisesRegex(RuntimeError, "unused.weight"):
                strict(torch.ones(1, 3))
            strict.close()
            lenient = bt.DistributedDataParallel(TwoHeads(), g, find_unused_parameters=True)
            lenient(torch.ones(1, 3)).sum().backward()
            grads = {n: None if p.grad is None else p.grad.clone()
                     for n, p in lenient.module.named_parameters()}
            lenient.close()
            return grads

        for grads in run_ranks(2, body):
            self.assertIsNone(grads["unused.weight"])  # no rank used it: None, as torch DDP
            self.assertTrue(torch.equal(grads["used.bias"], torch.ones(2)))

    def test_grad_set_to_none_or_replaced_is_rebound(self):
        want = _serial_grads([0])[0]

        def body(r, g):
            model = bt.DistributedDataParallel(_mlp(), g)
            x, y = _data(3)
            torch.nn.functional.mse_loss(model(x), y).backward()  # leaves values in the views
            params = list(model.parameters())
            for p in params:
                p.grad = None  # like zero_grad(set_to_none=True): must start from zero
            params[0].grad = torch.ones_like(params[0])  # a caller's tensor: copied in
            x, y = _data(0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            rebound = [p.grad.data_ptr() == model.reducer.grad(i)[0]
                       for i, p in enumerate(params)]
            grads = [p.grad.clone() for p in params]
            model.close()
            return rebound, grads

        [(rebound, grads)] = run_ranks(1, body)
        self.assertTrue(all(rebound))
        self.assertTrue(torch.equal(grads[0], want[0] + 1))
        for got, w in zip(grads[1:], want[1:]):
            self.assertTrue(torch.equal(got, w))

    def test_sharded_adamw_matches_torch_adamw_and_resumes(self):
        n, steps = 2, 4
        path = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "sharded")

        def train(model, opt, r, first, count):
            for s in range(first, first + count):
                x, y = _data(r, s)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            want = _torch_reference(g, lambda ps: torch.optim.AdamW(ps, lr=0.01),
                                    lambda m, o: train(m, o, r, 0, steps))
            got = []
            for resume in (False, True):
                model = bt.DistributedDataParallel(_mlp(), g, mode="reduce_scatter",
                                                   bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
                opt = bt.ShardedAdamW(model, lr=0.01)
                if resume:
                    opt.load(path + str(r))
                    train(model, opt, r, steps // 2, steps - steps // 2)
                else:
                    train(model, opt, r, 0, steps // 2)
                    opt.save(path + str(r))
                    train(model, opt, r, steps // 2, steps - steps // 2)
                opt.synchronize()
                self.assertEqual(opt.last_step().rounds, steps)
                got.append([p.detach().clone() for p in model.parameters()])
                opt.close()
                model.close()
            return want, got

        init = [p.detach() for p in _mlp().parameters()]
        for want, (straight, resumed) in run_ranks(n, body):
            self.assertTrue(any(not torch.equal(a, i) for a, i in zip(straight, init)))
            for w, a, b in zip(want, straight, resumed):
                self.assertTrue(torch.equal(a, b))
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6)


    def test_failed_backward_is_ended_and_the_next_step_works(self):
        want = _serial_grads([0])[0]

        class Failing(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net, self.fail = _mlp(), True

            def forward(self, x):
                h = self.net[1](self.net[0](x))
                if self.fail:  # raises after the last layer's gradients were marked ready
                    h.register_hook(lambda g: (_ for _ in ()).throw(ValueError("boom")))
                return self.net[2](h)

        def body(r, g, mode):
            model = bt.DistributedDataParallel(Failing(), g, mode=mode)
            opt = bt.ShardedSGD(model, lr=1.0) if mode != "allreduce" else None
            x, y = _data(0)
            with self.assertRaisesRegex(ValueError, "boom"):
                torch.nn.functional.mse_loss(model(x), y).backward()
            model.module.fail = False
            with self.assertRaisesRegex(RuntimeError, "previous backward did not finish"):
                model(x)
            before = [p.detach().clone() for p in model.parameters()]
            torch.nn.functional.mse_loss(model(x), y).backward()
            if opt is None:
                grads = [p.grad.clone() for p in model.parameters()]
            else:  # lr 1 SGD without momentum: the step is exactly -grad
                opt.synchronize()
                grads = [b - p.detach() for b, p in zip(before, model.parameters())]
                opt.close()
            model.close()
            return grads

        for mode in ("allreduce", "reduce_scatter"):
            [grads] = run_ranks(1, functools.partial(body, mode=mode))
            for got, w in zip(grads, want):
                torch.testing.assert_close(got, w, rtol=0, atol=1e-6 if mode != "allreduce" else 0)

    def test_sharded_sgd_matches_torch_sgd(self):
        # SGD's update is proportional to the gradient: a wrong average or accumulation
        # factor shows here (AdamW's normalized update would hide it).
        steps = 3

        def train(model, opt, r, accumulate):
            for s in range(steps):
                for micro in range(accumulate):
                    with model.no_sync() if micro + 1 < accumulate else _null():
                        x, y = _data(r, 2 * s + micro)
                        torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            out = []
            for accumulate in (1, 2):
                want = _torch_reference(g, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                        lambda m, o: train(m, o, r, accumulate))
                model = bt.DistributedDataParallel(_mlp(), g, mode="reduce_scatter",
                                                   bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
                opt = bt.ShardedSGD(model, lr=0.1, momentum=0.9)
                train(model, opt, r, accumulate)
                opt.synchronize()
                out.append((want, [p.detach().clone() for p in model.parameters()]))
                opt.close()
                model.close()
            return out

        for runs in run_ranks(2, body):
            for want, got in runs:
                for w, a in zip(want, got):
                    torch.testing.assert_close(a, w, rtol=0, atol=1e-6)

    def test_hybrid_reduce_scatter_only_accumulation_matches_torch_adamw(self):
        n, steps = 4, 3

        def train(model, opt, r, sync_mode):
            for s in range(steps):
                with model.no_sync(sync_mode):
                    x, y = _data(r, 2 * s)
                    torch.nn.functional.mse_loss(model(x), y).backward()
                x, y = _data(r, 2 * s + 1)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()

        def body(r, g):
            want = _torch_reference(g, lambda ps: torch.optim.AdamW(ps, lr=0.01),
                                    lambda m, o: train(m, o, r, "no_sync"))
            shard, replica = g.mesh(2, 2)
            model = bt.DistributedDataParallel(_mlp(), shard, replica_group=replica,
                                               mode="hybrid", bucket_cap_mb=1e-4,
                                               first_bucket_cap_mb=1e-5)
            opt = bt.ShardedAdamW(model, lr=0.01, overlap=False)
            train(model, opt, r, "reduce_scatter_only")
            opt.synchronize()
            got = [p.detach().clone() for p in model.parameters()]
            opt.close()
            model.close()
            shard.close()
            replica.close()
            return want, got

        for want, got in run_ranks(n, body):
            for w, a in zip(want, got):
                torch.testing.assert_close(a, w, rtol=0, atol=1e-6)



class _Stack(torch.nn.Module):
    """A small transformer-like stack: embedding, two pre-norm encoder layers (LayerNorm,
    attention matmuls, feed-forward), a head; the positional table is a bare root parameter."""

    def __init__(self, d=16, vocab=20, seq=6, blocks=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=2 * d, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(blocks))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _stack(blocks=2):
    with _INIT_LOCK:
        torch.manual_seed(11)
        return _Stack(blocks=blocks)


def _deep_mlp():
    with _INIT_LOCK:
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
                                   torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, 3))


def _loss(kind, model, r, micro):
    if kind == "mlp":
        x, y = _data(r, micro)
        return torch.nn.functional.mse_loss(model(x), y)
    g = torch.Generator().manual_seed(1000 * r + micro)
    tokens = torch.randint(0, 20, (3, 6), generator=g)
    out = model(tokens)
    return torch.nn.functional.cross_entropy(out.reshape(-1, 20), ((tokens + 1) % 20).reshape(-1))


def _units(kind, net):
    # mlp: every Linear but the last is a unit (the last is the root's); stack: the blocks.
    return [net[0], net[2], net[4]] if kind == "mlp" else list(net.blocks)


def _fsdp_train(kind, model, opt, r, steps, accumulate, sync_mode="no_sync"):
    for s in range(steps):
        for micro in range(accumulate):
            with model.no_sync(sync_mode) if micro + 1 < accumulate else _null():
                (_loss(kind, model, r, accumulate * s + micro) / accumulate).backward()
        opt.step()
        opt.zero_grad()


class FullyShardedTest(unittest.TestCase):
    """FullyShardedDataParallel + ShardedAdamW/SGD against torch AdamW/SGD on Braid's all-reduce
    (the reference every sharded test here uses), on 2 rank threads (hybrid 2 x 2 on 4)."""

    def _reference(self, kind, g, r, steps, accumulate, sgd=False):
        ref = bt.DistributedDataParallel(_mlp_or_stack(kind), g)
        opt = (torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9) if sgd else
               torch.optim.AdamW(ref.parameters(), lr=0.01))
        _fsdp_train(kind, ref, opt, r, steps, accumulate)
        want = [p.detach().clone() for p in ref.parameters()]
        ref.close()
        return want

    def _zero2(self, kind, g, r, steps, accumulate, replica=None, sync_mode="no_sync"):
        """The same training with Braid's ZeRO-2 / HSDP (DistributedDataParallel in
        reduce_scatter / hybrid mode + ShardedAdamW): the same optimizer arithmetic, so fully
        sharded must match it bit for bit. (Against torch AdamW, elements whose gradient is
        pure rounding noise, e.g. attention's key bias, amplify ulp differences of AdamW
        itself into 1e-3 gaps: see train_compare.py.)"""
        ref = bt.DistributedDataParallel(
            _mlp_or_stack(kind), g, mode="hybrid" if replica else "reduce_scatter",
            replica_group=replica, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5)
        opt = bt.ShardedAdamW(ref, lr=0.01)
        _fsdp_train(kind, ref, opt, r, steps, accumulate, sync_mode)
        opt.synchronize()
        want = [p.detach().clone() for p in ref.module.parameters()]
        opt.close()
        ref.close()
        return want

    def _run(self, kind, g, r, steps, accumulate, sgd=False, replica=None, sync_mode="no_sync",
             **options):
        net = _mlp_or_stack(kind)
        model = bt.FullyShardedDataParallel(
            net, g, units=_units(kind, net), mode="hybrid" if replica else "reduce_scatter",
            replica_group=replica, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-5, **options)
        opt = (bt.ShardedSGD(model, lr=0.1, momentum=0.9) if sgd else
               bt.ShardedAdamW(model, lr=0.01))
        _fsdp_train(kind, model, opt, r, steps, accumulate, sync_mode)
        opt.step()  # a second step() without a backward changes nothing
        memory = model.reducer.memory_stats()
        with model.summon_full_params():
            got = [p.detach().clone() for p in net.parameters()]
        opt.close()
        model.close()
        return got, memory

    def _compare(self, results, atol=1e-6):
        for want, got in results:
            for w, a in zip(want, got):
                torch.testing.assert_close(a, w, rtol=0, atol=atol)

    def _equal(self, results):
        for want, got in results:
            for i, (w, a) in enumerate(zip(want, got)):
                self.assertTrue(torch.equal(a, w), "parameter %d differs by up to %g" %
                                (i, float((a - w).abs().max())))

    def test_mlp_and_stack_match_torch_adamw(self):
        steps = 3

        def body(r, g):
            near, exact = [], []
            for kind in ("mlp", "stack"):
                for accumulate, reshard in ((1, True), (2, True), (1, False)):
                    got, _ = self._run(kind, g, r, steps, accumulate,
                                       reshard_after_forward=reshard)
                    exact.append((self._zero2(kind, g, r, steps, accumulate), got))
                    if kind == "mlp":  # no noise-dominated gradients: torch AdamW within 1e-6
                        near.append((self._reference(kind, g, r, steps, accumulate), got))
            return near, exact

        for near, exact in run_ranks(2, body):
            self._compare(near)
            self._equal(exact)

    def test_sgd_gradient_scale_with_accumulation(self):
        # SGD's update is proportional to the averaged gradient (AdamW's would hide a wrong
        # average or accumulation factor).
        def body(r, g):
            return [(self._reference("mlp", g, r, 3, 2, sgd=True),
                     self._run("mlp", g, r, 3, 2, sgd=True)[0])]

        for results in run_ranks(2, body):
            self._compare(results)

    def test_hybrid_2x2_reduce_scatter_only_matches_torch_adamw(self):
        def body(r, g):
            shard, replica = g.mesh(2, 2)
            want = self._zero2("stack", shard, r, 2, 2, replica=replica,
                               sync_mode="reduce_scatter_only")
            got, _ = self._run("stack", shard, r, 2, 2, replica=replica,
                               sync_mode="reduce_scatter_only")
            shard.close()
            replica.close()
            return [(want, got)]

        for results in run_ranks(4, body):
            self._equal(results)

    def test_released_parameters_summon_and_memory(self):
        n = 2

        def body(r, g):
            net = _stack(blocks=6)
            init = [p.detach().clone() for p in net.parameters()]
            model = bt.FullyShardedDataParallel(net, g, auto_wrap_policy={
                torch.nn.TransformerEncoderLayer}, bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
            self.assertEqual(model.unit_names, ["<root>"] + ["blocks.%d" % i for i in range(6)])
            with torch.no_grad():  # no optimizer yet: evaluation works (local pieces)
                model(torch.zeros(1, 6, dtype=torch.long))
            opt = bt.ShardedAdamW(model, lr=0.01)
            w = net.blocks[0].linear1.weight
            self.assertIsInstance(w, bt.FullyShardedParameter)
            self.assertEqual(w.shape, (32, 16))  # metadata stays readable
            for read in (lambda: w + 1, lambda: w.sum(), lambda: w.data, lambda: w.detach(),
                         lambda: print(w[0])):
                with self.assertRaisesRegex(RuntimeError, "'blocks.0.linear1.weight' is "
                                            "released"):
                    read()
            with self.assertRaisesRegex(RuntimeError, "'pos' is released"):  # the first one
                net.state_dict()
            self.assertIn("released", repr(w))
            with model.summon_full_params():
                summoned = [p.detach().clone() for p in net.parameters()]
                state = {k: v.clone() for k, v in net.state_dict().items()}
                with torch.no_grad():
                    eval_out = model(torch.arange(6).view(1, 6) % 20)
            for a, b in zip(summoned, init):
                self.assertTrue(torch.equal(a, b))
            self.assertTrue(torch.equal(state["head.weight"], init[-2]))
            with torch.no_grad():  # the same evaluation, units gathered one by one
                self.assertTrue(torch.equal(model(torch.arange(6).view(1, 6) % 20), eval_out))
            total = sum(p.numel() * 4 for p in net.parameters())
            model.reducer.reset_memory_peaks()
            for s in range(2):
                _loss("stack", model, r, s).backward()
                opt.step()
            opt.synchronize()
            m = model.reducer.memory_stats()["by_use"]
            with model.summon_full_params():
                # Full-size buffers: gathered parameters and gradient storage share one pool on
                # the host, so a buffer stays counted under the use that allocated it first.
                full = model.reducer.memory_stats()["by_use"]
                gathered_all = full["param_gather"][0] + full["grad_buckets"][0]
                trained = [p.detach().clone() for p in net.parameters()]
            opt.close()  # collective: gives the module its full parameters back
            back = [p.detach().clone() for p in net.parameters()]
            self.assertNotIsInstance(w, bt.FullyShardedParameter)
            model.close()
            return m, total, gathered_all, trained, back

        results = run_ranks(n, body)
        for m, total, gathered_all, trained, back in results:
            # Gathered parameters: at most the root, the unit running and the one prefetched
            # (plus the gatherer's pool of free buffers, which the figure includes), never the
            # whole model (7 units); after the step only the pool remains.
            self.assertGreater(m["param_gather"][1], 0, m)
            self.assertLess(m["param_gather"][1], total, m)
            self.assertLessEqual(m["param_gather"][0], m["param_gather"][1], m)
            self.assertLess(m["grad_buckets"][1], total / 2, m)  # gradient buckets bounded
            self.assertLess(m["grad_shards"][0], total, m)  # this rank's gradient shards
            self.assertGreaterEqual(gathered_all, total)
            for a, b, c in zip(trained, back, results[0][3]):
                self.assertTrue(torch.equal(a, b))
                self.assertTrue(torch.equal(a, c))  # every rank holds the same values

    def test_unused_parameter_named_unless_allowed(self):
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

            def forward(self, x):
                return self.used(x)

        def body(r, g):
            strict = bt.FullyShardedDataParallel(TwoHeads(), g)
            opt = bt.ShardedSGD(strict, lr=1.0)
            with self.assertRaisesRegex(braid.BraidError, "unused.weight"):
                strict(torch.ones(1, 3)).sum().backward()
            opt.close()
            strict.close()
            lenient = bt.FullyShardedDataParallel(TwoHeads(), g, find_unused_parameters=True)
            opt = bt.ShardedSGD(lenient, lr=1.0)
            with lenient.summon_full_params():
                before = {n: p.detach().clone() for n, p in lenient.module.named_parameters()}
            lenient(torch.ones(1, 3)).sum().backward()
            opt.step()
            with lenient.summon_full_params():
                after = {n: p.detach().clone() for n, p in lenient.module.named_parameters()}
            opt.close()
            lenient.close()
            return before, after

        for before, after in run_ranks(2, body):
            self.assertTrue(torch.equal(before["unused.weight"], after["unused.weight"]))
            self.assertTrue(torch.equal(before["used.bias"] - 1, after["used.bias"]))

    def test_resume_is_bit_identical(self):
        path = os.path.join(os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "fsdp")

        def body(r, g):
            got = []
            for resume in (False, True):
                net = _stack()
                model = bt.FullyShardedDataParallel(net, g, units=list(net.blocks),
                                                    bucket_cap_mb=1e-3)
                opt = bt.ShardedAdamW(model, lr=0.01)
                if resume:
                    opt.load(path + str(r))
                else:
                    _fsdp_train("stack", model, opt, r, 2, 1)
                    opt.save(path + str(r))
                _fsdp_train("stack", model, opt, r, 2, 1)
                with model.summon_full_params():
                    got.append([p.detach().clone() for p in net.parameters()])
                opt.close()
                model.close()
            return got

        for straight, resumed in run_ranks(2, body):
            for a, b in zip(straight, resumed):
                self.assertTrue(torch.equal(a, b))


def _mlp_or_stack(kind):
    return _deep_mlp() if kind == "mlp" else _stack()

if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
