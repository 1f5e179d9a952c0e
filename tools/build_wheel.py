#!/usr/bin/env python3
"""Writes Braid's wheel: the `braid` package, libbraid.so, the backend modules and the shared
libraries they need that a user cannot be expected to have, as one .whl file pip installs.

    bazel build //capi/python:wheel     # runs this; the wheel is in bazel-bin/capi/python/
    build_wheel.py --out braid-<version>-py3-none-linux_x86_64.whl --header capi/braid.h \\
        --lib bazel-bin/capi/libbraid.so \\
        --module bazel-bin/capi/libbraid-mpi.so=libmpi.so.40 \\
        --module bazel-bin/capi/libbraid-gloo.so=libgloo.so.0 \\
        --bundle 'libabsl_*' --bundle 'libspdlog.so.*' --bundle 'libfmt.so.*' \\
        capi/python/braid/*.py

Layout of the wheel (purelib is false: it holds ELF files for one platform):
    braid/*.py                  the package
    braid/libbraid.so           found by braid/_lib.py beside the package
    braid/libbraid-<b>.so       backend modules, found by libbraid.so beside itself
    braid/_libs/<soname>        bundled libraries (libbraid.so's RPATH is $ORIGIN/_libs)
    braid-<v>.dist-info/        METADATA, WHEEL, RECORD (sha256 of every file)

The dependency rule, checked over the whole closure of DT_NEEDED entries: every library is
either the C/C++ runtime every Linux system has (glibc, libstdc++, libgcc_s), a module's own
system library named with --module (the user installs it for that backend only), or bundled
(--bundle patterns, copied under its soname). Anything else fails the build with the library
and who needs it, so a new dependency is a decision, not a surprise on a user's machine.

Written with the standard library only (zipfile, hashlib): no setuptools, works offline. The
output is deterministic (sorted entries, fixed timestamps). The version comes from braid.h's
BRAID_VERSION_* macros; --version, when given, must agree (the Bazel target names its output).
"""

import argparse
import base64
import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import zipfile

# Present on every Linux system a CPython wheel can run on: never bundled.
SYSTEM_LIBRARIES = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1",
}
LIBRARY_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib"]
RPATH = "$ORIGIN/_libs"
TAG = "py3-none-linux_x86_64"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)

SUMMARY = "Braid: communication scheduling for data-parallel and sharded training"
DESCRIPTION = """\
Braid buckets gradients, launches reduce-scatter / all-reduce / all-gather in a rank-consistent
order overlapped with backward, and steps a sharded optimizer as each shard's gradients arrive.
`braid.pytorch` is a drop-in for torch's DistributedDataParallel / ZeroRedundancyOptimizer.

What the system must provide: glibc and libstdc++ (GCC 12 or newer); PyTorch for braid.pytorch
(pip install 'braid[torch]', or a system torch). Per backend, loaded only when a world uses it:
  mpi   Open MPI 4 (libmpi.so.40; Debian/Ubuntu: apt install libopenmpi3)
  gloo  Gloo (libgloo.so.0; Debian/Ubuntu: apt install libgloo0)
  nccl  NCCL 2.28+ and a CUDA driver (libnccl.so.2; BRAID_NCCL_LIBRARY)
Abseil, spdlog and fmt are bundled.
"""


class WheelError(Exception):
    pass


def read_version(header):
    text = open(header).read()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"#define BRAID_VERSION_%s (\d+)" % name, text)
        if not m:
            raise WheelError("%s defines no BRAID_VERSION_%s" % (header, name))
        parts.append(m.group(1))
    return ".".join(parts)


def dynamic_entries(path):
    """(needed sonames, rpath entries) of an ELF shared object, from `readelf -d`."""
    out = subprocess.run(["readelf", "-d", "--wide", path], check=True, capture_output=True,
                         text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    rpath = []
    for m in re.finditer(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out):
        rpath += m.group(1).split(":")
    return needed, rpath


def find_library(soname):
    for d in LIBRARY_DIRS:
        p = os.path.join(d, soname)
        if os.path.exists(p):
            return os.path.realpath(p)
    raise WheelError("cannot find %s to bundle (looked in %s)" % (soname, ", ".join(LIBRARY_DIRS)))


def bundle_closure(roots, bundle_patterns):
    """roots: [(path, allowed external sonames)]. Returns {soname: file} to bundle; raises
    WheelError naming a library no rule covers and the file that needs it."""
    bundled = {}
    queue = [(p, set(ext), os.path.basename(p)) for p, ext in roots]
    while queue:
        path, external, who = queue.pop()
        needed, _ = dynamic_entries(path)
        for soname in needed:
            if soname in SYSTEM_LIBRARIES or soname in external or soname in bundled:
                continue
            if not any(fnmatch.fnmatch(soname, pat) for pat in bundle_patterns):
                raise WheelError(
                    "%s needs %s, which is neither a system library, nor a module's declared "
                    "system library (--module FILE=%s), nor bundled (--bundle PATTERN)"
                    % (who, soname, soname))
            bundled[soname] = find_library(soname)
            queue.append((bundled[soname], set(), soname))
    return bundled


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def metadata(version):
    lines = [
        "Metadata-Version: 2.1",
        "Name: braid",
        "Version: " + version,
        "Summary: " + SUMMARY,
        "Requires-Python: >=3.8",
        "Requires-Dist: numpy",
        "Provides-Extra: torch",
        'Requires-Dist: torch; extra == "torch"',
        "Description-Content-Type: text/plain",
        "",
        DESCRIPTION,
    ]
    return "\n".join(lines)


def wheel_file():
    return "\n".join(["Wheel-Version: 1.0", "Generator: braid tools/build_wheel.py",
                      "Root-Is-Purelib: false", "Tag: " + TAG, ""])


def write_wheel(out, version, entries):
    """entries: {archive name: (bytes, executable)}."""
    dist_info = "braid-%s.dist-info" % version
    entries = dict(entries)
    entries[dist_info + "/METADATA"] = (metadata(version).encode(), False)
    entries[dist_info + "/WHEEL"] = (wheel_file().encode(), False)
    record_name = dist_info + "/RECORD"
    rows = ["%s,%s,%d" % (name, record_hash(data), len(data))
            for name, (data, _) in sorted(entries.items())]
    rows.append(record_name + ",,")
    entries[record_name] = (("\n".join(rows) + "\n").encode(), False)
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        # RECORD last, as the wheel spec recommends; everything else sorted.
        for name in sorted(entries, key=lambda n: (n == record_name, n)):
            data, executable = entries[name]
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, out)


def build(args):
    version = read_version(args.header)
    if args.version and args.version != version:
        raise WheelError("braid.h says version %s but the build asked for %s: update the wheel "
                         "target's version (capi/python/BUILD.bazel)" % (version, args.version))
    expected = "braid-%s-%s.whl" % (version, TAG)
    if os.path.basename(args.out) != expected:
        raise WheelError("output %s should be named %s" % (args.out, expected))

    entries = {}
    for py in args.python:
        entries["braid/" + os.path.basename(py)] = (open(py, "rb").read(), False)
    if "braid/__init__.py" not in entries:
        raise WheelError("no braid/__init__.py among the Python files")

    elves = [(args.lib, [])]
    for spec in args.module:
        path, _, externals = spec.partition("=")
        elves.append((path, [e for e in externals.split(",") if e]))
    for path, _ in elves:
        _, rpath = dynamic_entries(path)
        if RPATH not in rpath:
            raise WheelError("%s has RPATH %s, not %s: the bundled libraries would not be found"
                             % (path, rpath, RPATH))
        entries["braid/" + os.path.basename(path)] = (open(path, "rb").read(), True)
    for soname, path in sorted(bundle_closure(elves, args.bundle).items()):
        entries["braid/_libs/" + soname] = (open(path, "rb").read(), True)
    write_wheel(args.out, version, entries)
    return len(entries)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the .whl to write")
    p.add_argument("--header", required=True, help="capi/braid.h (the version)")
    p.add_argument("--version", help="the version the build expects (checked against braid.h)")
    p.add_argument("--lib", required=True, help="libbraid.so")
    p.add_argument("--module", action="append", default=[],
                   help="FILE=SONAME[,SONAME]: a backend module and the system libraries it may "
                        "need from the user's machine")
    p.add_argument("--bundle", action="append", default=[],
                   help="soname pattern of libraries to bundle (fnmatch)")
    p.add_argument("python", nargs="+", help="the package's .py files")
    args = p.parse_args(argv)
    try:
        n = build(args)
    except (WheelError, OSError, subprocess.CalledProcessError) as e:
        print("build_wheel: %s" % e, file=sys.stderr)
        return 1
    print("build_wheel: %s (%d files)" % (args.out, n + 3))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
