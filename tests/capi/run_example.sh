#!/usr/bin/env bash
# Runs capi/example.c's binary and checks its verdict line.
set -euo pipefail
out="$("$1")"
echo "$out"
grep -q ': ok$' <<<"$out"
grep -q 'rank 0: avg = \[0.5 2 3 4\]' <<<"$out"
