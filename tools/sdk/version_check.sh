#!/usr/bin/env bash
# Fails (naming both numbers) when braid.h's BRAID_VERSION_* / BRAID_ABI_VERSION differ from
# capi/version.bzl's, which name libbraid.so's soname and file; writes a one-line stamp otherwise.
#   version_check.sh <braid.h> <expected version X.Y.Z> <expected ABI major> <out>
set -euo pipefail
header="$1" want_version="$2" want_abi="$3" out="$4"
macro() {
  sed -n "s/^#define $1 \([0-9][0-9]*\)\$/\1/p" "$header"
}
version="$(macro BRAID_VERSION_MAJOR).$(macro BRAID_VERSION_MINOR).$(macro BRAID_VERSION_PATCH)"
abi="$(macro BRAID_ABI_VERSION)"
if [[ "$version" != "$want_version" || "$abi" != "$want_abi" ]]; then
  echo "version_check: $header says version $version, ABI $abi; capi/version.bzl says" \
    "version $want_version, ABI $want_abi. Change both together (the soname is" \
    "libbraid.so.<ABI>, docs/c-sdk.md)." >&2
  exit 1
fi
echo "braid $version abi $abi" > "$out"
