"""A rank's timeline counters read back from its timeline file (scheduler/timeline.h writes
"<timeline_prefix>.rank<world rank>.json", one event a line), for Python:

    model = braid.fully_shard(net, group=g, timeline_prefix="/tmp/run")
    ... train ...
    for ts_us, name, value in model.timeline_counters():   # "host bytes", "device bytes"
        ...

Counter samples ("ph":"C") only: the "memory" row's "host bytes" / "device bytes" (every
allocation and free Braid counts, the total after it: memory_stats()'s current over time) and
the autotuner's "trial us". Timestamps are microseconds since the reducer was created. The
writer thread drains its queue every few milliseconds, so samples of the last milliseconds may
not be in the file yet (all of them are once the model is closed); samples the queue dropped
when full are counted in the file's "events_dropped", never invented here.
"""

import json


def timeline_path(prefix, world_rank):
    return "%s.rank%d.json" % (prefix, world_rank)


def read_counters(path, names=None):
    """[(ts_us, name, value)] in file order, of the counters in `names` (None: all). A file
    still being written ends in a partial line: skipped."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    for line in data.split(b"\n"):
        line = line.rstrip(b",")  # each event but the last is followed by ","
        if not line.startswith(b"{") or b'"ph":"C"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the writer's last, partial line
        name = event["name"]
        if names is None or name in names:
            out.append((float(event["ts"]), name, int(event["args"][name])))
    return out
