"""What one run of one torch DDP test under mpirun came to, in one class and a one-line reason.

    outcome = classify(records, returncode=rc, timed_out=False, output=log_text)
    outcome.status   # "pass", "skip" or "fail"
    outcome.kind     # for a failure: "wrong numbers", "missing API", "unclear", "crash",
                     # "timeout"
    outcome.reason   # e.g. "DistributedDataParallel.register_comm_hook (test line 4321)"

`records` are the per-rank result files ddp_rank.py writes ({"rank", "time", "status",
"exc_type", "message", "traceback"}); a rank with no record died or was ended before its test
returned.

Precedence: a rank killed by a signal (a segfault: faulthandler's "Fatal Python error" or
mpirun's "exited on signal") is a crash whatever the other ranks recorded, since their errors
are then consequences; next the exception of the rank that failed first (its peers' errors,
e.g. gloo's "Connection closed by peer", follow from it); then the runner's timeout; then
a rank missing its record or a non-zero exit after every rank passed (a crash at teardown).

Exception classes (a heuristic; docs/torch-ddp-tests.md reviews each row by hand):
  - missing API: the adapter refused a torch argument (AdapterUnsupported), an attribute or
    method torch's DDP has is missing ("object has no attribute 'X'"), or a keyword is unknown;
  - wrong numbers: an assertion comparing values failed (assertEqual's "not equal" / "not
    close", "Mismatched elements", "!=", "None mismatch", assertIsNone, assertTrue on a
    comparison);
  - unclear: anything else: an expected error not raised or with another message, an error
    raised by Braid or torch that the test did not expect.
"""

import collections
import re

Outcome = collections.namedtuple("Outcome", "status kind reason")

_WRONG_NUMBERS = re.compile(
    r"not (equal|close)|Mismatched elements|Greatest (absolute|relative) difference|"
    r" != |are not the same|not almost equal|Scalars are not|Tensor-likes are not|"
    r"Booleans mismatch|Lists differ|Tuples differ|Dicts differ|False is not true|"
    r"True is not false|None mismatch|is not None")
_NOT_RAISED = re.compile(r"^\w+ not raised\b|^\"[^\n]*\" does not match \"")


def _first_line(text, limit=110):
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _test_line(traceback_text):
    """Where the test stood: the innermost frame in torch's distributed_test.py, with its
    source line when the traceback has it."""
    frames = re.findall(r'distributed_test\.py", line (\d+), in \w+\n( +\S[^\n]*)?',
                        traceback_text or "")
    if not frames:
        return ""
    line, code = frames[-1]
    code = code.strip()
    return " (test line %s%s)" % (line, ": " + _first_line(code, 60) if code else "")


def _missing_api(exc_type, message):
    m = re.match(r"braid adapter: (\w+)", message or "")
    if m:
        return "torch argument %s refused by the adapter: %s" % (
            m.group(1), _first_line(message.split(": ", 2)[-1], 60))
    m = re.search(r"(?:'(\w+)' object|type object '(\w+)') has no attribute '(\w+)'",
                  message or "")
    if exc_type == "AttributeError" and m:
        return "%s.%s" % (m.group(1) or m.group(2), m.group(3))
    m = re.search(r"unexpected keyword argument '(\w+)'", message or "")
    if exc_type == "TypeError" and m:
        return "keyword %s" % m.group(1)
    return None


def _from_exception(record):
    exc_type, message = record.get("exc_type", ""), record.get("message", "")
    where = _test_line(record.get("traceback"))
    api = _missing_api(exc_type, message)
    if api:
        return Outcome("fail", "missing API", api + where)
    text = "%s: %s" % (exc_type, _first_line(message))
    if exc_type == "AssertionError" and _NOT_RAISED.search(message):
        return Outcome("fail", "unclear", "expected error differs: " + text + where)
    if exc_type == "AssertionError" and _WRONG_NUMBERS.search(message):
        return Outcome("fail", "wrong numbers", text + where)
    return Outcome("fail", "unclear", text + where)


def _signal_death(output):
    m = re.search(r"Fatal Python error: (\w[\w ]*)", output or "")
    if m:  # faulthandler's stack, innermost first: name the top two frames
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+)', output[m.end():])[:2]
        at = " < ".join("%s (%s:%s)" % (fn, path.rsplit("/", 1)[-1], line)
                        for path, line, fn in frames)
        return m.group(1).strip() + (" in " + at if at else "")
    m = re.search(r"exited on signal (\d+) \((\w[\w ]*)\)", output or "")
    if m:
        return "signal %s (%s)" % (m.group(1), m.group(2))
    return None


def classify(records, returncode, timed_out, output, world_size=2):
    """Outcome of one run; records: the ranks' result dicts (any order, some may be missing)."""
    died = _signal_death(output)
    if died:
        return Outcome("fail", "crash", died)
    records = sorted(records, key=lambda r: r["rank"])
    failed = sorted((r for r in records if r["status"] == "fail"),
                    key=lambda r: (r.get("time", 0), r["rank"]))
    if failed:
        return _from_exception(failed[0])
    if timed_out:
        waiting = sorted(set(range(world_size)) - {r["rank"] for r in records})
        return Outcome("fail", "timeout", "no result from rank(s) %s in time" % waiting)
    if len(records) < world_size:
        missing = sorted(set(range(world_size)) - {r["rank"] for r in records})
        return Outcome("fail", "crash", "rank(s) %s ended without a result (exit %s)"
                       % (missing, returncode))
    if all(r["status"] == "skip" for r in records):
        return Outcome("skip", "", _first_line(records[0].get("message")))
    if any(r["status"] == "skip" for r in records):
        return Outcome("fail", "unclear", "skipped on some ranks only")
    if returncode != 0:
        return Outcome("fail", "crash", "every rank passed, then exit %s at teardown"
                       % returncode)
    return Outcome("pass", "", "")
