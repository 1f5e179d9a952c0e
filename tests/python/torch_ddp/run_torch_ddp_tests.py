"""torch's own DDP tests against braid.pytorch.DistributedDataParallel: runs each test of torch
1.13's torch/testing/_internal/distributed/distributed_test.py that builds a
DistributedDataParallel, under `mpirun -np 2`, first as torch ships it (to find the tests torch
passes on this machine) and then with torch's class replaced by braid_ddp_adapter's subclass of
Braid's wrapper; writes a table: test, torch's result, Braid's, and per Braid failure a class
(wrong numbers, missing API, unclear, crash, timeout) and a one-line reason (outcome.py).

    /usr/bin/python3 tests/python/torch_ddp/run_torch_ddp_tests.py \
        --report /tmp/ddp.md --json /tmp/ddp.json        # every DDP test, torch then Braid
    ... -k SyncBatchNorm                                 # tests whose name contains this
    ... --torch-json /tmp/ddp.json                       # torch's results from an earlier run
    ... --expect tests/python/torch_ddp/braid_passing.txt --only braid  # regression check

(LIBBRAID_SO and PYTHONPATH as tests/python/run_python.sh sets them; mpirun on PATH. Under
Bazel the table, the JSON and every run's mpirun output go to TEST_UNDECLARED_OUTPUTS_DIR.)
Exit status: 0, or 1 when a test listed in --expect does not pass on Braid (or torch did not
pass it), so the Bazel target fails on a regression; tests that pass without being listed are
printed, to be added.

How torch's harness drives these tests (torch 1.13; test/run_test.py and
test/distributed/test_distributed_spawn.py in torch's source tree, not in the Debian package):
  - run_test.py's test_distributed() runs test_distributed_spawn.py once per backend in
    DISTRIBUTED_TESTS_CONFIG (gloo: WORLD_SIZE = 2 if two GPUs else 3) and per init method
    (file and env), with the environment: BACKEND (gloo / nccl / mpi / ucc), WORLD_SIZE,
    TEMP_DIR (a fresh mkdtemp holding barrier/ and test_dir/), INIT_METHOD ("env://", or
    "file://<TEMP_DIR>/" for the spawn module); distributed_test.py reads BACKEND and
    INIT_METHOD at import. The mpi backend alone is launched with `mpiexec -n 3`.
  - test_distributed_spawn.py defines TestDistBackendWithSpawn(TestDistBackend,
    DistributedTest._DistTestBase) whose setUp spawns WORLD_SIZE processes per test
    (MultiProcessTestCase); each runs TestDistBackend._run: enables DDP-with-ReplicatedTensor,
    init_process_group(file:// of a per-test temp file, BACKEND, WORLD_SIZE, rank, timeout
    CUSTOM_PG_TIMEOUT or 60 s), a file barrier in TEMP_DIR/barrier, the test method, a barrier,
    destroy_process_group. A process exits with a TEST_SKIPS code to skip (e.g. 77: "Need at
    least 2 CUDA devices") and 10 on an error; the parent joins them under a 300 s timeout
    (500 s for test_DistributedDataParallel).
Here: the processes are mpirun's (ranks as processes, as the issue asks) instead of spawned
ones, one mpirun per test and implementation; BACKEND=gloo, WORLD_SIZE=2, a fresh TEMP_DIR
with barrier/, test_dir/ and init_dir/ per run, INIT_METHOD=file://TEMP_DIR/init_dir/
shared_init_file, and ddp_rank.py does what _run does (minus ReplicatedTensor: see its
docstring) inside cpu_placement.cuda_on_cpu (the GPU-decorated tests run with their GPU
placement kept on the CPU, for torch and Braid alike) and writes each rank's result. torch's runs use torch's own timeouts; Braid's
runs time out after max(--min-timeout, 4 x torch's duration of the test), so a hang costs
little. Tests selected: every test_* method of _DistTestBase (after torch's parametrization)
whose body, or a self._helper it calls (transitively), names DistributedDataParallel.
"""

import argparse
import ast
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from outcome import Outcome, classify  # noqa: E402 (after the path)

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1",
          "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
TORCH_TIMEOUT_S = 300  # torch's DEFAULT_TIMEOUT per test (distributed_test.py)
CUSTOM_TORCH_TIMEOUT_S = {"test_DistributedDataParallel": 500}


def _import_distributed_test():
    """torch's module, imported as ddp_rank.py does (its import reads BACKEND etc.)."""
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
    try:
        import expecttest  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "_shim"))
    from torch.testing._internal.distributed import distributed_test
    return distributed_test


def select_tests():
    """[(test name, method it was parametrized from)] of the tests that build a DDP."""
    dt = _import_distributed_test()
    base = dt.DistributedTest._DistTestBase
    source = textwrap.dedent(inspect.getsource(base))
    methods = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.FunctionDef):
            called = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "self"}
            methods[node.name] = (ast.get_source_segment(source, node), called)

    def builds_ddp(name, seen):
        if name in seen or name not in methods:
            return False
        seen.add(name)
        text, called = methods[name]
        return "DistributedDataParallel" in text or any(builds_ddp(c, seen) for c in called)

    selected = []
    for name in sorted(n for n in dir(base) if n.startswith("test_")):
        origin = name if name in methods else max(
            (m for m in methods if name.startswith(m + "_")), key=len, default=None)
        if origin and builds_ddp(origin, set()):
            selected.append((name, origin))
    return selected


def run_one(impl, test, timeout_s, log_dir, np=2):
    """One mpirun of one test; returns (Outcome, seconds, detail): detail is the first failing
    rank's traceback, or the end of mpirun's output when no rank recorded a failure."""
    temp_dir = tempfile.mkdtemp(prefix="torch_ddp_")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(temp_dir, sub))
    cmd = MPIRUN + ["-np", str(np), sys.executable, os.path.join(HERE, "ddp_rank.py"),
                    "--impl", impl, "--temp-dir", temp_dir, test]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.monotonic()
    timed_out = False
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end(proc)
            returncode = proc.returncode
        seconds = time.monotonic() - start
        out.seek(0)
        output = out.read()
    records = []
    for rank in range(np):
        path = os.path.join(temp_dir, "result.%d.json" % rank)
        if os.path.exists(path):
            with open(path) as f:
                records.append(json.load(f))
    shutil.rmtree(temp_dir, ignore_errors=True)
    if log_dir:
        os.makedirs(os.path.join(log_dir, impl), exist_ok=True)
        with open(os.path.join(log_dir, impl, test + ".log"), "w") as f:
            f.write(output)
    outcome = classify(records, returncode, timed_out, output, np)
    failed = sorted((r for r in records if r["status"] == "fail"),
                    key=lambda r: (r.get("time", 0), r["rank"]))
    detail = "" if outcome.status != "fail" else (
        failed[0]["traceback"][-2000:] if failed and outcome.kind != "crash"
        else output[-2000:])
    return outcome, seconds, detail


def _end(proc):
    """mpirun past its time: SIGTERM (mpirun ends its ranks), then SIGKILL to the session."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _cell(outcome):
    if outcome is None:
        return "-"
    if outcome.reason == "not run":
        return "not run"
    if outcome.status != "fail":
        return outcome.status
    return "fail: " + outcome.kind


def report(rows, path):
    """The markdown table (and per-class counts) of rows = [(test, torch, braid, secs)]."""
    lines = ["| test | torch | Braid | Braid failure: reason |", "| --- | --- | --- | --- |"]
    for test, torch_o, braid_o, _ in rows:
        reason = (braid_o.reason if braid_o is not None and braid_o.status == "fail"
                  else torch_o.reason if torch_o.status != "pass" else "")
        lines.append("| %s | %s | %s | %s |" % (test, _cell(torch_o), _cell(braid_o),
                                                reason.replace("|", "\\|")))
    passed_torch = [r for r in rows if r[1].status == "pass"]
    counts = {}
    for _, _, braid_o, _ in passed_torch:
        key = ("not run" if braid_o is None else "pass" if braid_o.status == "pass"
               else braid_o.kind)
        counts[key] = counts.get(key, 0) + 1
    not_run = sum(1 for r in rows if r[1].reason == "not run")
    summary = ("%d DDP tests selected; torch passes %d%s; of those, on Braid: %s" % (
        len(rows), len(passed_torch) - not_run,
        " (%d not run, taken as passing)" % not_run if not_run else "",
        ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    text = summary + "\n\n" + "\n".join(lines) + "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", default="", help="only tests whose name contains this")
    parser.add_argument("--tests", nargs="*", help="only these tests")
    parser.add_argument("--torch-json", help="torch's results from an earlier --json")
    parser.add_argument("--only", choices=("torch", "braid"),
                        help="run one implementation (braid: taking torch's results as passes)")
    parser.add_argument("--expect", help="file of tests (one a line, # comments) that must "
                        "pass on Braid; their list alone is run with --only braid")
    parser.add_argument("--min-timeout", type=float, default=60.0)
    parser.add_argument("--report", help="markdown table to write")
    parser.add_argument("--json", help="results to write (reusable as --torch-json)")
    parser.add_argument("--logs", help="folder for each run's mpirun output")
    args = parser.parse_args()
    outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")  # under Bazel: keep everything
    if outputs:
        args.report = args.report or os.path.join(outputs, "torch_ddp_tests.md")
        args.json = args.json or os.path.join(outputs, "torch_ddp_tests.json")
        args.logs = args.logs or os.path.join(outputs, "logs")

    expected = []
    if args.expect:
        with open(args.expect) as f:
            expected = [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]
    tests = [t for t, _ in select_tests() if args.k in t]
    unknown = sorted(set((args.tests or []) + expected) - set(tests))
    if unknown:
        sys.exit("not among the selected DDP tests: %s" % ", ".join(unknown))
    if args.tests or (args.expect and args.only == "braid"):
        tests = [t for t in tests if t in set(args.tests or expected)]

    earlier = {}
    if args.torch_json:
        with open(args.torch_json) as f:
            earlier = {r["test"]: r for r in json.load(f)}
    rows, results = [], []
    for test in tests:
        if args.only == "braid":
            torch_o, torch_s = Outcome("pass", "", "not run"), None  # taken as passing
        elif test in earlier:
            e = earlier[test]
            torch_o, torch_s = Outcome(*e["torch"]), e["torch_seconds"]
        else:
            torch_o, torch_s, _ = run_one("torch", test, CUSTOM_TORCH_TIMEOUT_S.get(
                test, TORCH_TIMEOUT_S), args.logs)
        braid_o, braid_s, detail = None, None, ""
        if torch_o.status == "pass" and args.only != "torch":
            braid_o, braid_s, detail = run_one(
                "braid", test, max(args.min_timeout, 4 * (torch_s or 0)), args.logs)
        rows.append((test, torch_o, braid_o, braid_s))
        results.append({"test": test, "torch": list(torch_o), "torch_seconds": torch_s,
                        "braid": list(braid_o) if braid_o else None,
                        "braid_seconds": braid_s, "braid_detail": detail})
        print("%-70s torch %-13s %6s braid %-20s %6s %s" % (
            test[:70], _cell(torch_o), "%.1fs" % torch_s if torch_s is not None else "",
            _cell(braid_o),
            "%.1fs" % braid_s if braid_s is not None else "",
            braid_o.reason if braid_o and braid_o.status == "fail" else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(report(rows, args.report))

    braid_pass = {t for t, _, b, _ in rows if b is not None and b.status == "pass"}
    regressed = [t for t in expected if t in tests and t not in braid_pass]
    extra = sorted(braid_pass - set(expected)) if args.expect else []
    if extra:
        print("pass on Braid but not listed in %s (add them): %s" % (args.expect,
                                                                      ", ".join(extra)))
    if regressed:
        print("FAILED: listed in %s but not passing on Braid: %s" % (args.expect,
                                                                      ", ".join(regressed)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
