#!/usr/bin/env bash
# Checks that every C/C++ file git tracks matches .clang-format (Google style, 100 columns) and
# names each file that does not, with the command that fixes it. Run by //tools:format_test, so
# the README's test command (and .ci/run) fails on unformatted code.
# Usage: tools/format_check.sh [REPO_ROOT]   (default: the repository holding this script)
set -euo pipefail

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"
clang_format="$(command -v clang-format-14 || true)"
if [[ -z "$clang_format" ]]; then
  echo "format_check: clang-format-14 is not installed (Debian package clang-format-14;" \
       "tools/bazelw installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.c' '*.cu' '*.cuh')
else  # a source tree without .git: every C/C++ file outside Bazel's output links
  mapfile -t files < <(find . -path './bazel-*' -prune -o -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) -print |
    sed 's#^\./##' | sort)
fi

existing=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] && existing+=("$f")  # skip files deleted in the work tree, not yet in the index
done
# One clang-format process for the whole tree; its diagnostics start with FILE:LINE:COL.
out="$("$clang_format" --dry-run -Werror "${existing[@]}" 2>&1)" && rc=0 || rc=$?
mapfile -t bad < <(grep -oE '^[^ :]+:[0-9]+:[0-9]+: (error|warning)' <<<"$out" | cut -d: -f1 |
  sort -u)
if ((rc != 0 && ${#bad[@]} == 0)); then
  echo "format_check: clang-format failed (exit $rc) naming no file:" >&2
  echo "$out" | head -20 >&2
  exit 1
fi
if ((${#bad[@]})); then
  echo "format_check: ${#bad[@]} of ${#files[@]} files do not match .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: clang-format-14 -i ${bad[*]}" >&2
  exit 1
fi
echo "format_check: ${#files[@]} files match .clang-format"
