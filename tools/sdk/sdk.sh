#!/usr/bin/env bash
# `tools/bazelw run //capi:install -- --prefix=DIR`: tools/sdk/sdk.py with Debian's python3, from
# the runfiles root where the built files it is given are.
set -euo pipefail
exec /usr/bin/python3 tools/sdk/sdk.py "$@"
