#!/usr/bin/env bash
# The C example in README.md (its first ```c block, "A C example") built the way the README says,
# from the installed SDK: the SDK goes into a scratch prefix (tools/sdk/sdk.py, what
# //capi:install runs), the example (#include <braid.h>) compiles as C99 with -Wall -Werror with
# `pkg-config --cflags --libs braid` and nothing from the tree, and averages its gradient under
# mpirun -np 2 (World("mpi") loads libbraid-mpi.so from the prefix).
#   readme_example_test.sh README.md SDK_PY HEADER PLUGIN_HEADER LIB MODULE...
set -euo pipefail
readme="$1" sdk_py="$2" header="$3" plugin_header="$4" lib="$5"
shift 5
work="${TEST_TMPDIR:-$(mktemp -d)}"
modules=()
for m in "$@"; do modules+=(--module "$m"); done
/usr/bin/python3 "${sdk_py}" install --prefix "${work}/prefix" --header "${header}" \
  --plugin-header "${plugin_header}" --lib "${lib}" "${modules[@]}" > /dev/null
export PKG_CONFIG_PATH="${work}/prefix/lib/pkgconfig"
awk '/^```c$/ {inside = 1; next} inside && /^```$/ {exit} inside' "${readme}" > "${work}/example.c"
grep -q braid_reducer_finish_backward "${work}/example.c" || { echo "no C example found" >&2; exit 1; }
gcc -std=c99 -Wall -Wextra -Werror -pedantic "${work}/example.c" \
  $(pkg-config --cflags --libs braid) -Wl,-rpath,"$(pkg-config --variable=libdir braid)" \
  -o "${work}/example"
out="$(tests/run_mpi.sh 2 "${work}/example")"
echo "${out}"
[[ "$(grep -c 'averaged grad\[0\] = 0.5$' <<<"${out}")" == 2 ]] || { echo "wrong result" >&2; exit 1; }
