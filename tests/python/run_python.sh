#!/usr/bin/env bash
# Runs a Python script of Braid's with Debian's python3 (the one with python3-torch), the
# binding from capi/python and the libbraid.so built next to it (paths in Bazel's runfiles, or
# in the source tree when run by hand from the workspace root after building //capi:braid).
#
#   tests/python/run_python.sh tests/python/binding_test.py [args...]
#
# One kernel thread per process (OMP_NUM_THREADS=1): the 2- and 4-rank runs share 2 cores.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 <script.py> [args...]" >&2
  exit 2
fi
here="$(pwd)"
lib="${here}/capi/libbraid.so"
[[ -e "${lib}" ]] || lib="${here}/bazel-bin/capi/libbraid.so"
export LIBBRAID_SO="$(readlink -f "${lib}")"
export PYTHONPATH="${here}/capi/python:${here}/tests/python${PYTHONPATH:+:${PYTHONPATH}}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec /usr/bin/python3 "$@"
