#!/usr/bin/env python3
"""Braid's C SDK from a build: installed under a prefix, as a .tar.gz, or as Debian packages
(docs/c-sdk.md). The Bazel targets in capi/BUILD.bazel run it with the built files:

    tools/bazelw run //capi:install -- --prefix=$HOME/.local   # or /usr/local, /opt/braid
    tools/bazelw build //capi:sdk_archive    # bazel-bin/capi/braid-0.10.0-linux-x86_64.tar.gz
    tools/bazelw build //capi:debs           # bazel-bin/capi/libbraid{1,-dev}_0.10.0_amd64.deb

Directly: sdk.py install|archive|deb INPUTS (--prefix DIR | --out FILE.tar.gz | --out-dir DIR),
INPUTS being --header braid.h --plugin-header braid_backend_v1.h --lib libbraid.so.N
[--module libbraid-<backend>.so ...]. The layout: tools/sdk/layout.py. Standard library only.
"""

import argparse
import gzip
import os
import subprocess
import sys
import tarfile
import tempfile

import debian
import layout

ARCHIVE_MTIME = debian.FIXED_MTIME


def archive(out, args):
    """out: <top>.tar.gz holding <top>/ (the layout, lib/, a relocatable braid.pc)."""
    base = os.path.basename(out)
    if not base.endswith(".tar.gz"):
        raise layout.LayoutError("the archive's name must end in .tar.gz: %s" % out)
    top = base[:-len(".tar.gz")]
    with tempfile.TemporaryDirectory() as work:
        v, written = layout.install(os.path.join(work, top), args.header, args.plugin_header,
                                    args.lib, args.module,
                                    pc_prefix=layout.relocatable_pc_prefix("lib"))
        if v.version not in top:
            raise layout.LayoutError("%s does not name version %s (braid.h)" % (base, v.version))

        def normalize(info):
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = ARCHIVE_MTIME
            return info

        # Deterministic: sorted entries, fixed owners and times, gzip without a timestamp.
        entries = sorted({os.path.join(top, d) for rel in written
                          for d in parents(os.path.dirname(rel))} |
                         {os.path.join(top, rel) for rel in written})
        with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="") as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                tar.add(os.path.join(work, top), arcname=top, recursive=False, filter=normalize)
                for name in entries:
                    tar.add(os.path.join(work, name), arcname=name, recursive=False,
                            filter=normalize)
    return out


def parents(rel):
    """rel and every directory above it ("" excluded): "lib/cmake/Braid" -> 3 entries."""
    out = []
    while rel:
        out.append(rel)
        rel = os.path.dirname(rel)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["install", "archive", "deb"])
    p.add_argument("--prefix", help="install: where the layout goes (created if missing)")
    p.add_argument("--out", help="archive: the .tar.gz to write")
    p.add_argument("--out-dir", help="deb: where the two .deb files go")
    p.add_argument("--header", required=True)
    p.add_argument("--plugin-header", required=True)
    p.add_argument("--lib", required=True, help="libbraid.so.<ABI major> (its soname is checked)")
    p.add_argument("--module", action="append", default=[], help="a backend module")
    args = p.parse_args()
    # Under `bazel run` the working directory is the runfiles tree; paths the user typed are
    # relative to where they typed them.
    user_dir = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
    try:
        if args.command == "install":
            if not args.prefix:
                p.error("install needs --prefix=DIR")
            prefix = os.path.join(user_dir, os.path.expanduser(args.prefix))
            v, written = layout.install(prefix, args.header, args.plugin_header, args.lib,
                                        args.module)
            print("installed Braid %s (%s) into %s:" % (v.version, v.soname,
                                                         os.path.abspath(prefix)))
            for rel in written:
                print("  " + rel)
            print("build against it: PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags "
                  "--libs braid, or CMAKE_PREFIX_PATH=%s with find_package(Braid)"
                  % (os.path.abspath(prefix), os.path.abspath(prefix)))
        elif args.command == "archive":
            if not args.out:
                p.error("archive needs --out FILE.tar.gz")
            print(archive(os.path.join(user_dir, args.out), args))
        else:
            if not args.out_dir:
                p.error("deb needs --out-dir DIR")
            for deb in debian.build(os.path.join(user_dir, args.out_dir), args.header,
                                    args.plugin_header, args.lib, args.module):
                print(deb)
    except (layout.LayoutError, OSError) as e:
        print("sdk.py %s: %s" % (args.command, e), file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print("sdk.py %s: %s failed: %s" % (args.command, " ".join(e.cmd), e.stderr),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
