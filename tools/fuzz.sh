#!/usr/bin/env bash
# Runs one fuzz target of tests/fuzz/ under libFuzzer (clang 14, ASan + UBSan) for a while.
#
#   tools/fuzz.sh <target> [seconds=300] [extra libFuzzer flags...]
#   tools/fuzz.sh state_file 600
#   tools/fuzz.sh list                       # the targets
#
# Targets: state_file, options, plugin_abi, capi. The build uses --config=fuzz in an output
# base of its own (~/.cache/braid-fuzz/...), so it never disturbs the worktree's g++ build.
# The search starts from the checked-in seeds (tests/fuzz/corpus/<target>/, read only) and
# keeps what it finds in /tmp/braid-fuzz/<target>/corpus; crashes, leaks and timeouts are
# written to /tmp/braid-fuzz/<target>/ as crash-*/leak-*/timeout-* and reproduce with
#   <binary> /tmp/braid-fuzz/<target>/crash-...
# (or, with g++: bazel-bin/tests/fuzz/<target>_test <dir holding the file> --runs=0).
# The last lines of libFuzzer's output give the executions run (#N ... DONE) for
# docs/hardening.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
targets=(state_file options plugin_abi capi)
target="${1:-}"
if [[ -z "${target}" || "${target}" == "list" ]]; then
  printf '%s\n' "${targets[@]}"
  exit 0
fi
if [[ ! " ${targets[*]} " =~ " ${target} " ]]; then
  echo "fuzz.sh: unknown target '${target}' (one of: ${targets[*]})" >&2
  exit 2
fi
seconds="${2:-300}"
shift $(( $# >= 2 ? 2 : 1 ))

output_base="${HOME}/.cache/braid-fuzz/$(echo -n "${root}" | md5sum | cut -c1-12)"
"${root}/tools/bazelw" --output_base="${output_base}" build --config=fuzz --symlink_prefix=/ \
  "//tests/fuzz:${target}_fuzzer" >&2
bin_dir="$("${root}/tools/bazelw" --output_base="${output_base}" info --config=fuzz bazel-bin 2>/dev/null)"
binary="${bin_dir}/tests/fuzz/${target}_fuzzer"

work="/tmp/braid-fuzz/${target}"
mkdir -p "${work}/corpus"
cd "${work}"
echo "fuzz.sh: ${binary} for ${seconds} s; corpus ${work}/corpus + seeds" >&2
ASAN_OPTIONS="detect_leaks=1" \
  "${binary}" -max_total_time="${seconds}" -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 \
  "$@" "${work}/corpus" "${root}/tests/fuzz/corpus/${target}"
