#!/usr/bin/env bash
# Every bench binary given as an argument answers --help and -h with its usage and exit 0, and
# refuses an unknown flag with a non-zero exit.
#   help_test.sh bench/overlap bench/memory ...
set -uo pipefail
fail=0
for bin in "$@"; do
  for flag in --help -h; do
    if ! out="$("$bin" "$flag" 2>&1)"; then
      echo "FAIL: $bin $flag exited non-zero" >&2; fail=1
    elif ! grep -qi "usage" <<<"$out"; then
      echo "FAIL: $bin $flag printed no usage" >&2; fail=1
    fi
  done
  if "$bin" --no_such_flag_xyz >/dev/null 2>&1; then
    echo "FAIL: $bin accepted --no_such_flag_xyz" >&2; fail=1
  fi
done
[[ $fail -eq 0 ]] && echo "help_test: $# bench binaries answer --help / -h"
exit $fail
