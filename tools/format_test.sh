#!/usr/bin/env bash
# //tools:format_test: runs tools/format_check.sh on the source tree this runfiles tree links to.
set -euo pipefail
root="$(dirname "$(readlink -f .clang-format)")"
exec tools/format_check.sh "$root"
