#!/usr/bin/env bash
# Runs tools/sdk/abi.py with Debian's python3 from Bazel: the test (//tests/sdk:abi_test) and
# the list's regeneration (`tools/bazelw run //capi:abi_update`, which writes into the source
# tree at the path given, relative to the workspace root).
#   abi.sh check|write <capi/abi/libbraid.so.N.abi> <abi_layout> <libbraid.so.N> [<libbraid.so>]
set -euo pipefail
mode="$1" abi="$2" layout="$3"
shift 3
if [[ "$mode" == write ]]; then
  abi="${BUILD_WORKSPACE_DIRECTORY:?run it with tools/bazelw run //capi:abi_update}/$abi"
  mkdir -p "$(dirname "$abi")"
fi
# Both run from the runfiles root, where abi.py is (a data dependency of either).
exec /usr/bin/python3 tools/sdk/abi.py "$mode" --abi "$abi" --layout "$layout" "$@"
