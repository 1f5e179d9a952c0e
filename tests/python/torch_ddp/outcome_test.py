"""outcome.classify on the records and mpirun output of runs as they really end (shapes taken
from run_torch_ddp_tests.py's logs): which class wins, and that the reason names the missing
API, the crashing frame or the silent rank. Pure Python, no torch, no mpirun."""

import unittest

from outcome import classify

TRACE = ('Traceback (most recent call last):\n'
         '  File "/usr/lib/python3/dist-packages/torch/testing/_internal/distributed/'
         'distributed_test.py", line 4776, in _test_accumulate_gradients_no_sync\n'
         '    ddp_model.register_comm_hook(dist.group.WORLD, allreduce_hook)\n'
         '  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1269, in '
         '__getattr__\n')
WHERE = (" (test line 4776: ddp_model.register_comm_hook(dist.group.WORLD, "
         "allreduce_...)")


def fail(rank, exc_type, message):
    return {"rank": rank, "status": "fail", "exc_type": exc_type, "message": message,
            "traceback": TRACE}


def ok(rank):
    return {"rank": rank, "status": "pass"}


SEGFAULT = """MPI Error in NBC subrequest 0x1415af80 : 15
Fatal Python error: Segmentation fault

Current thread 0x00007fa18f9d4040 (most recent call first):
  File "/x/capi/python/braid/_lib.py", line 265 in call
  File "/x/capi/python/braid/core.py", line 404 in wait
  File "/x/distributed_test.py", line 7708 in _run_test_ddp_model_with_diff_params
"""


class ClassifyTest(unittest.TestCase):
    def test_pass_and_skip(self):
        self.assertEqual(classify([ok(1), ok(0)], 0, False, "").status, "pass")
        skip = {"status": "skip", "message": "Need at least 4 CUDA devices"}
        o = classify([dict(skip, rank=0), dict(skip, rank=1)], 0, False, "")
        self.assertEqual((o.status, o.reason), ("skip", "Need at least 4 CUDA devices"))
        o = classify([dict(skip, rank=0), ok(1)], 0, False, "")
        self.assertEqual((o.status, o.kind), ("fail", "unclear"))

    def test_missing_api_names_it(self):
        o = classify([ok(0), fail(1, "AttributeError", "'DistributedDataParallel' object has "
                                  "no attribute 'register_comm_hook'")], 1, False, "")
        self.assertEqual((o.kind, o.reason), (
            "missing API", "DistributedDataParallel.register_comm_hook" + WHERE))
        o = classify([fail(0, "AttributeError", "type object 'DistributedDataParallel' has no "
                           "attribute '_set_static_graph'")], 1, False, "")
        self.assertEqual(o.reason.split(" (")[0], "DistributedDataParallel._set_static_graph")
        o = classify([fail(0, "AdapterUnsupported",
                           "braid adapter: static_graph: static_graph=True")], 1, False, "")
        self.assertEqual(o.kind, "missing API")
        self.assertIn("torch argument static_graph", o.reason)
        o = classify([fail(0, "TypeError", "__init__() got an unexpected keyword argument "
                           "'gradient_as_bucket_view'")], 1, False, "")
        self.assertEqual((o.kind, o.reason.split(" (")[0]),
                         ("missing API", "keyword gradient_as_bucket_view"))

    def test_assertions(self):
        o = classify([fail(0, "AssertionError", "Tensor-likes are not close!\n\nMismatched "
                           "elements: 3 / 4")], 1, False, "")
        self.assertEqual((o.kind, o.reason), (
            "wrong numbers", "AssertionError: Tensor-likes are not close!" + WHERE))
        o = classify([fail(0, "AssertionError", "None mismatch: tensor([[0., 0.],\n [0., 0.]]) "
                           "is not None")], 1, False, "")
        self.assertEqual(o.kind, "wrong numbers")
        o = classify([fail(0, "AssertionError", "tensor([[0.]]) is not None")], 1, False, "")
        self.assertEqual(o.kind, "wrong numbers")
        o = classify([fail(0, "AssertionError", '"DDP expects same model across all ranks" '
                           'does not match "PEER_ERROR: braid_reducer_create"')], 1, False, "")
        self.assertEqual(o.kind, "unclear")
        o = classify([fail(0, "AssertionError", "RuntimeError not raised")], 1, False, "")
        self.assertEqual(o.kind, "unclear")
        self.assertTrue(o.reason.startswith("expected error differs"))
        o = classify([fail(0, "RuntimeError", "parameter 0: its .grad was replaced")], 1,
                     False, "")
        self.assertEqual(o.kind, "unclear")

    def test_first_failure_reported(self):
        cause = dict(fail(1, "AssertionError", "Scalars are not equal!"), time=10.0)
        echo = dict(fail(0, "RuntimeError", "Connection closed by peer"), time=10.5)
        o = classify([echo, cause], 1, False, "")
        self.assertIn("Scalars are not equal", o.reason)
        o = classify([fail(1, "RuntimeError", "second"), fail(0, "RuntimeError", "first")],
                     1, False, "")  # no times: the lowest rank
        self.assertIn("first", o.reason)

    def test_signal_beats_the_peers_errors(self):
        peer = fail(0, "RuntimeError", "Connection reset by peer")
        o = classify([peer], 1, False, SEGFAULT)
        self.assertEqual((o.kind, o.reason), (
            "crash", "Segmentation fault in call (_lib.py:265) < wait (core.py:404)"))
        o = classify([peer], 1, False, "mpirun noticed that process rank 1 with PID 0 on node "
                     "vm exited on signal 6 (Aborted).")
        self.assertEqual((o.kind, o.reason), ("crash", "signal 6 (Aborted)"))

    def test_timeout_and_silent_ranks(self):
        o = classify([ok(0)], -15, True, "")
        self.assertEqual((o.kind, o.reason), ("timeout", "no result from rank(s) [1] in time"))
        o = classify([ok(0)], 1, False, "")
        self.assertEqual(o.kind, "crash")
        self.assertIn("[1]", o.reason)
        o = classify([ok(0), ok(1)], 1, False, "")
        self.assertEqual((o.kind, o.reason),
                         ("crash", "every rank passed, then exit 1 at teardown"))


if __name__ == "__main__":
    unittest.main()
