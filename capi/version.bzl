"""Braid's release and ABI numbers for BUILD files (Starlark cannot read braid.h).

They must equal braid.h's BRAID_VERSION_MAJOR/MINOR/PATCH and BRAID_ABI_VERSION: the genrule
//capi:version_check compares them and fails every link of libbraid.so when they differ, so
bumping a number in braid.h without this file (or the reverse) cannot build.

BRAID_ABI_VERSION is the soname's major (libbraid.so.<ABI>): bumped only by an incompatible
change (capi/abi/ and docs/c-sdk.md say which changes are).
"""

BRAID_VERSION = "0.11.0"
BRAID_ABI_VERSION = 1

# libbraid.so.1: what programs linked against Braid record (DT_NEEDED) and the loader looks for.
BRAID_SONAME = "libbraid.so.%d" % BRAID_ABI_VERSION

# libbraid.so.1.10.0: the installed file (<ABI major>.<minor>.<patch>, libtool's shape; the
# minor and patch are the release's, like libjansson.so.4.14.0 of Jansson 2.14).
BRAID_REALNAME = "%s.%s" % (BRAID_SONAME, BRAID_VERSION.split(".", 1)[1])
