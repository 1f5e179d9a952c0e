"""Braid's Debian packages, built with dpkg-deb from the SDK layout (layout.py) under /usr, split
the way Debian splits a shared library (Debian Policy 8; NCCL ships libnccl2 + libnccl-dev):

    libbraid1     usr/lib/<multiarch>/libbraid.so.1.10.0, libbraid.so.1, the backend modules;
                  Depends: what dpkg-shlibdeps finds the library NEEDs (Abseil, spdlog, fmt, the
                  C/C++ runtime); Suggests: the system libraries of the modules (libopenmpi3,
                  libgloo0), needed only by a world on that backend. A shlibs file so that
                  programs packaged against it get `libbraid1 (>= 0.10.0)`, and the ldconfig
                  trigger.
    libbraid-dev  usr/include/braid.h and its parts, braid_backend_v1.h,
                  usr/lib/<multiarch>/libbraid.so, pkgconfig/braid.pc, cmake/Braid/;
                  Depends: libbraid1 (= the same version).

The package name carries the ABI major (libbraid.so.1 -> libbraid1), so a new major installs
beside the old one. The Maintainer field comes from DEBFULLNAME / DEBEMAIL (the variables
Debian's tools read) when set.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile

import layout

DEFAULT_MAINTAINER = "Braid maintainers <maintainers@braid.invalid>"
# Every file's time in the packages: the output depends on the inputs only.
FIXED_MTIME = 315532800  # 1980-01-01
DESCRIPTION = """Braid: communication scheduling for data-parallel and sharded training
 Braid buckets gradients, launches reduce-scatter / all-reduce / all-gather in a
 rank-consistent order overlapped with backward, and steps a sharded optimizer
 as each shard's gradients arrive, for frameworks that embed it through its C
 API (braid.h)."""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def multiarch():
    return run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"])


def shlibdeps(lib, modules):
    """(Depends, Suggests) of the library and the modules, from dpkg-shlibdeps: the packages
    providing what they NEED, with the versions their symbols require."""
    with tempfile.TemporaryDirectory() as work:
        # dpkg-shlibdeps reads debian/control to know the source's packages.
        os.makedirs(os.path.join(work, "debian"))
        with open(os.path.join(work, "debian", "control"), "w") as f:
            f.write("Source: braid\n\nPackage: libbraid\nArchitecture: any\n")
        out = run(["dpkg-shlibdeps", "-O", "-dDepends", "-e" + os.path.abspath(lib),
                   "-dSuggests"] + ["-e" + os.path.abspath(m) for m in modules], cwd=work)
    fields = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return fields.get("shlibs:Depends", ""), fields.get("shlibs:Suggests", "")


def md5sums(root):
    lines = []
    for d, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(d, name)
            if os.path.islink(path) or path.startswith(os.path.join(root, "DEBIAN")):
                continue
            digest = hashlib.md5(open(path, "rb").read()).hexdigest()
            lines.append("%s  %s\n" % (digest, os.path.relpath(path, root)))
    return "".join(lines)


def installed_size_kib(root):
    total = 0
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            if not os.path.islink(path) and "DEBIAN" not in os.path.relpath(path, root):
                total += os.path.getsize(path)
    return str((total + 1023) // 1024)


def build_deb(root, fields, out_dir, extra=None):
    """Writes DEBIAN/ (control, md5sums, `extra` files) into `root` and builds the .deb."""
    os.makedirs(os.path.join(root, "DEBIAN"), exist_ok=True)
    fields = dict(fields, **{"Installed-Size": installed_size_kib(root)})
    order = ["Package", "Source", "Version", "Architecture", "Multi-Arch", "Maintainer",
             "Installed-Size", "Depends", "Suggests", "Section", "Priority", "Description"]
    control = "".join("%s: %s\n" % (k, fields[k]) for k in order if fields.get(k))
    files = {"control": control, "md5sums": md5sums(root)}
    files.update(extra or {})
    for name, text in files.items():
        with open(os.path.join(root, "DEBIAN", name), "w") as f:
            f.write(text)
    for d, dirs, names in os.walk(root):
        for name in dirs + names:
            os.utime(os.path.join(d, name), (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
    out = os.path.join(out_dir, "%s_%s_%s.deb" % (fields["Package"], fields["Version"],
                                                  fields["Architecture"]))
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(FIXED_MTIME))
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, out], env=env)
    return out


def build(out_dir, header, plugin_header, lib, modules):
    """Writes libbraid<ABI>_<v>_<arch>.deb and libbraid-dev_<v>_<arch>.deb; returns their paths."""
    arch = run(["dpkg", "--print-architecture"])
    libdir = "lib/" + multiarch()
    maintainer = DEFAULT_MAINTAINER
    if os.environ.get("DEBFULLNAME") and os.environ.get("DEBEMAIL"):
        maintainer = "%s <%s>" % (os.environ["DEBFULLNAME"], os.environ["DEBEMAIL"])
    with tempfile.TemporaryDirectory() as work:
        usr = os.path.join(work, "all", "usr")
        v, written = layout.install(usr, header, plugin_header, lib, modules, libdir=libdir,
                                    pc_prefix="/usr")
        runtime = "libbraid" + v.abi
        module_names = [os.path.join(libdir, os.path.basename(m)) for m in modules]
        runtime_files = [os.path.join(libdir, n) for n in (v.realname, v.soname)] + module_names
        trees = {runtime: os.path.join(work, runtime), "libbraid-dev": os.path.join(work, "dev")}
        for rel in written:
            tree = trees[runtime] if rel in runtime_files else trees["libbraid-dev"]
            dst = os.path.join(tree, "usr", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.islink(os.path.join(usr, rel)):
                os.symlink(os.readlink(os.path.join(usr, rel)), dst)
            else:
                shutil.copy2(os.path.join(usr, rel), dst)
        depends, suggests = shlibdeps(os.path.join(usr, libdir, v.realname),
                                      [os.path.join(usr, m) for m in module_names])
        common = {"Source": "braid", "Version": v.version, "Architecture": arch,
                  "Multi-Arch": "same", "Maintainer": maintainer, "Priority": "optional"}
        short, long_text = DESCRIPTION.split("\n", 1)
        debs = [
            build_deb(trees[runtime], dict(common, **{
                "Package": runtime, "Section": "libs", "Depends": depends,
                "Suggests": suggests,
                "Description": "%s (library)\n%s\n .\n This package holds %s and its backend "
                               "modules (mpi, gloo)." % (short, long_text, v.soname),
            }), out_dir, extra={
                "shlibs": "libbraid %s %s (>= %s)\n" % (v.abi, runtime, v.version),
                "triggers": "activate-noawait ldconfig\n",
            }),
            build_deb(trees["libbraid-dev"], dict(common, **{
                "Package": "libbraid-dev", "Section": "libdevel",
                "Depends": "%s (= %s)" % (runtime, v.version),
                "Description": "%s (development files)\n%s\n .\n This package holds braid.h "
                               "and its parts, the plugin ABI header,\n braid.pc and the "
                               "CMake package (find_package(Braid))." % (short, long_text),
            }), out_dir),
        ]
    return debs
