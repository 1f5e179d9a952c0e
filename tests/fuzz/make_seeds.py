#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (run from the workspace root; the files are
checked in, this documents how they were made). Each seed follows its target's input format."""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def state_file(kind="adamw", world=2, rank=1, shard=2, replica=1, step=7, scalars=(), sections=(),
               version=1):
    body = s(kind) + struct.pack("<QiiiiqI", 0x1234ABCD, world, rank, shard, replica, step,
                                 len(scalars))
    for name, value in scalars:
        body += s(name) + struct.pack("<d", value)
    body += struct.pack("<I", len(sections))
    secs = b""
    for name, dtype, count, payload in sections:
        secs += s(name) + struct.pack("<iQQ", dtype, count, len(payload)) + payload
    total = 24 + len(body) + len(secs) + 4
    head = b"BRAIDST\0" + struct.pack("<IIQ", version, len(body), total)
    data = head + body + secs
    return data + struct.pack("<I", crc32c(data[8:]))


def write(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data)


def main():
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    adamw = state_file(
        scalars=[("groups", 1.0), ("g0/lr", 1e-3), ("g0/beta1", 0.9), ("g0/beta2", 0.999),
                 ("g0/eps", 1e-8), ("g0/weight_decay", 0.01)],
        sections=[("bucket_steps", 5, 1, struct.pack("<q", 7)),
                  ("bucket0/master", 0, 4, f32(1, -0.0, float("nan"), 3.5)),
                  ("bucket0/exp_avg", 0, 4, f32(0, 0, 0, 0)),
                  ("bucket0/exp_avg_sq", 0, 4, f32(0, 0, 0, 0))])
    write("state_file", "adamw", b"\0" + adamw)
    write("state_file", "adamw_fixup", b"\3" + adamw)
    write("state_file", "empty_sections", b"\0" + state_file(kind="sgd", sections=[]))
    write("state_file", "all_dtypes", b"\3" + state_file(sections=[
        ("a", 0, 1, f32(1)), ("b", 1, 1, struct.pack("<d", 2)), ("c", 2, 2, b"\1\2\3\4"),
        ("d", 3, 1, b"\0\x3c"), ("e", 4, 1, struct.pack("<i", -1)), ("f", 6, 3, b"xyz"),
        ("zero", 0, 0, b"")]))
    write("state_file", "newer_version", b"\0" + state_file(version=2))
    write("state_file", "not_ours", b"\0not a state file at all")

    # options: (how, name index or string, value) per pair; how & 0x10 picks a canned value.
    write("options", "declared", bytes([0, 2, 1]) + b"4" + bytes([0, 3, 3]) + b"500" +
          bytes([1, 5, 4]) + b"info")
    write("options", "canned", bytes([0x10, 2, 3, 0x11, 4, 6, 0x10, 8, 2, 0x10, 9, 1]))
    write("options", "unknown", bytes([2, 5]) + b"TYPO_" + bytes([0]) + bytes([3, 4]) + b"PATH" +
          bytes([3]) + b"/bin")
    write("options", "bad", bytes([0, 2, 2]) + b"-5" + bytes([0, 5, 4]) + b"loud")

    # plugin_abi: how (4: abi 1, exact struct size), present mask, name, then values.
    values = bytes([0, 2, 0, 0, 0, 1, 7, 0, 0, 0, 2, 0x41, 5]) + b"hello" + bytes([1, 11]) + \
        bytes([3, 3, 4]) + b"oops" + bytes([1]) + bytes([4]) + struct.pack("<Q", 0x7F)
    write("plugin_abi", "valid", bytes([4, 0x7F, 4]) + b"acme" + values)
    write("plugin_abi", "missing_entry", bytes([4, 0x3F, 4]) + b"acme")
    write("plugin_abi", "abi99", bytes([5]) + struct.pack("<i", 99) + bytes([0x7F, 4]) + b"acme")
    write("plugin_abi", "unterminated", bytes([4, 0x7F, 1]) + b"a" +
          bytes([2, 0x78, 0, 0, 9]) + bytes([2, 0x78, 255]) + b"y" * 255 + bytes([0, 9]))

    # capi: (opcode, arguments) as capi_fuzz.cc decodes them.
    world = bytes([0, 1, 4])
    group = bytes([3, 0, 1])
    write("capi", "world_group", world + group + bytes([4, 0, 1, 0, 2, 0, 24, 3, 24, 2]))
    allreduce = bytes([7, 0, 0, 1, 16, 0, 1, 1, 1, 0, 0, 12, 0, 1])
    write("capi", "collectives", world + group + allreduce + bytes([9, 0, 0, 1, 4, 0, 1, 1, 1, 1]) +
          bytes([11, 0, 0]) + bytes([12, 0, 1]) + bytes([23, 2, 0]) + bytes([23, 1, 0]))
    reducer = bytes([13, 0, 1, 2, 0, 1, 1, 40, 0, 1, 0, 1, 1, 100, 0, 1, 0, 0x11, 3, 3, 1, 1])
    marks = bytes([14, 0, 0, 1, 0, 0]) + bytes([14, 0, 0, 1, 1]) + bytes([14, 0, 1, 1, 1]) + \
        bytes([15, 0, 0, 1, 2])
    write("capi", "reducer", world + group + reducer + marks + bytes([23, 3, 0]))
    optimizer = bytes([18, 0, 0x01, 0]) + bytes([19, 0, 0, 1, 0, 0]) + marks + \
        bytes([19, 0, 0, 1, 4]) + bytes([20, 0, 0, 1, 0])
    write("capi", "optimizer", world + group + reducer + optimizer)
    # An optimizer over an f64 parameter (reduce-scatter, overlap on): refused at creation since
    # session 13; before, its stepper thread hit a BRAID_CHECK at the first reduction.
    f64_reducer = bytes([13, 0, 1, 2, 0, 1, 1, 8, 0, 1, 0, 1, 1, 1, 8, 0, 0, 0, 0x31, 3, 3, 1])
    write("capi", "optimizer_f64_param", world + group + f64_reducer + bytes([18, 0, 0x09, 0]) +
          bytes([19, 0, 0, 1, 0, 0]) + bytes([14, 0, 0, 1, 1]) + bytes([14, 0, 1, 1, 1]) +
          bytes([19, 0, 0, 1, 1]) + bytes([19, 0, 0, 1, 4]))
    write("capi", "wrong_handles", world + group + bytes([1, 201, 4, 250, 12, 0, 0, 23, 0, 201]) +
          bytes([23, 0, 0, 4, 0, 23, 1, 0]))
    # 2-rank runs (first byte 7 mod 8): both ranks decode the rest; the pool starts with each
    # rank's world group, so the sequences use it without making a world.
    two = bytes([7])
    write("capi", "two_ranks_collectives", two + allreduce + bytes([9, 0, 0, 1, 4, 0, 1, 1, 1, 1]) +
          bytes([11, 0, 0]) + bytes([12, 0, 1]) + bytes([5, 0, 1, 3]) + bytes([23, 2, 0]))
    write("capi", "two_ranks_reducer", two + reducer + marks + bytes([23, 3, 0]))
    write("capi", "two_ranks_optimizer", two + reducer + optimizer)


if __name__ == "__main__":
    main()
