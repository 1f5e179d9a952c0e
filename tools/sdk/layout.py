"""The installed layout of Braid's C SDK, written under a prefix (tools/sdk/sdk.py uses it for
`//capi:install`, the archive and the Debian packages):

    include/braid.h                      the C API, which includes its parts beside it:
    include/braid_world.h, ...           (header_parts: the #include "braid_*.h" lines of braid.h)
    include/braid_backend_v1.h           the backend plugin ABI
    LIBDIR/libbraid.so.1.10.0            the library (soname libbraid.so.1)
    LIBDIR/libbraid.so.1 -> libbraid.so.1.10.0
    LIBDIR/libbraid.so   -> libbraid.so.1 (what -lbraid finds when linking)
    LIBDIR/libbraid-mpi.so, libbraid-gloo.so   backend modules, loaded beside the library
    LIBDIR/pkgconfig/braid.pc
    LIBDIR/cmake/Braid/BraidConfig.cmake, BraidConfigVersion.cmake   (Braid::braid)

LIBDIR is `lib` (a prefix install, the archive) or `lib/<multiarch>` (Debian). The numbers come
from braid.h; the library's soname must agree with them or nothing is written.
"""

import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


class LayoutError(Exception):
    pass


class Version:
    """braid.h's BRAID_VERSION_* and BRAID_ABI_VERSION, and the file names they give."""

    def __init__(self, header):
        text = open(header).read()

        def macro(name):
            m = re.search(r"^#define %s (\d+)$" % name, text, re.M)
            if not m:
                raise LayoutError("%s defines no %s" % (header, name))
            return m.group(1)

        self.major, self.minor, self.patch = (macro("BRAID_VERSION_" + p)
                                              for p in ("MAJOR", "MINOR", "PATCH"))
        self.abi = macro("BRAID_ABI_VERSION")
        self.version = "%s.%s.%s" % (self.major, self.minor, self.patch)
        self.soname = "libbraid.so." + self.abi
        self.realname = "%s.%s.%s" % (self.soname, self.minor, self.patch)


def header_parts(header):
    """The parts braid.h includes (`#include "braid_*.h"`), as paths beside it, in its order;
    each must exist there (the installed braid.h would not compile without it)."""
    names = re.findall(r'^#include "(braid_\w+\.h)"$', open(header).read(), re.M)
    paths = [os.path.join(os.path.dirname(header), n) for n in names]
    for path in paths:
        if not os.path.isfile(path):
            raise LayoutError("%s includes %s, which is not beside it" % (header, path))
    return paths


def soname(path):
    out = subprocess.run(["readelf", "-d", "--wide", path], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return m.group(1) if m else None


def fill(template, values):
    text = open(os.path.join(HERE, template)).read()
    for key, value in values.items():
        text = text.replace("@%s@" % key, value)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise LayoutError("%s: no value for %s" % (template, ", ".join(sorted(set(left)))))
    return text


def write(path, data, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)  # a read-only file from an earlier install, or a symlink
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def symlink(target, path):
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def install(prefix, header, plugin_header, lib, modules, libdir="lib", pc_prefix=None):
    """Writes the layout under `prefix` (created if needed); returns the relative paths written.
    pc_prefix: the .pc file's `prefix=` value; default the absolute prefix. An archive passes
    "${pcfiledir}/../.." so that it works wherever it is unpacked."""
    v = Version(header)
    if soname(lib) != v.soname:
        raise LayoutError("%s has the soname %s, but braid.h (ABI %s) says %s: a library from "
                          "another build?" % (lib, soname(lib), v.abi, v.soname))
    prefix = os.path.abspath(prefix)
    lib_dir = os.path.join(prefix, libdir)
    written = []

    def put(rel, data, mode):
        write(os.path.join(prefix, rel), data, mode)
        written.append(rel)

    put("include/braid.h", open(header, "rb").read(), 0o644)
    for part in header_parts(header):
        put("include/" + os.path.basename(part), open(part, "rb").read(), 0o644)
    put("include/braid_backend_v1.h", open(plugin_header, "rb").read(), 0o644)
    # Shared objects 0644, as Debian installs them: loaded, never executed.
    put(os.path.join(libdir, v.realname), open(lib, "rb").read(), 0o644)
    for link, target in ((v.soname, v.realname), ("libbraid.so", v.soname)):
        symlink(target, os.path.join(lib_dir, link))
        written.append(os.path.join(libdir, link))
    for module in modules:
        put(os.path.join(libdir, os.path.basename(module)), open(module, "rb").read(), 0o644)

    values = {
        "ABI": v.abi,
        "VERSION": v.version,
        "VERSION_MAJOR": v.major,
        "SONAME": v.soname,
        "REALNAME": v.realname,
        "LIBDIR": libdir,
        # From LIBDIR/pkgconfig and LIBDIR/cmake/Braid back to the prefix.
        "PREFIX": pc_prefix or prefix,
        "CMAKE_TO_PREFIX": os.path.relpath(prefix, os.path.join(lib_dir, "cmake", "Braid")),
    }
    put(os.path.join(libdir, "pkgconfig", "braid.pc"), fill("braid.pc.in", values).encode(),
        0o644)
    for name in ("BraidConfig.cmake", "BraidConfigVersion.cmake"):
        put(os.path.join(libdir, "cmake", "Braid", name), fill(name + ".in", values).encode(),
            0o644)
    return v, written


def relocatable_pc_prefix(libdir):
    """The .pc `prefix=` that finds the prefix from the .pc file's own directory."""
    up = os.path.relpath(".", os.path.join(libdir, "pkgconfig"))
    return "${pcfiledir}/" + up


