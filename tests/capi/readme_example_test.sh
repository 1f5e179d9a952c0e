#!/usr/bin/env bash
# The C example in README.md (its first ```c block, "A C example") compiles as C99 with -Wall
# -Werror against braid.h (#include <braid.h>, as from an installed SDK) and libbraid.so, and
# averages its gradient under mpirun -np 2.
#   readme_example_test.sh README.md capi/libbraid.so
set -euo pipefail
readme="$1"
lib="$(readlink -f "$2")"
work="${TEST_TMPDIR:-$(mktemp -d)}"
awk '/^```c$/ {inside = 1; next} inside && /^```$/ {exit} inside' "${readme}" > "${work}/example.c"
grep -q braid_reducer_finish_backward "${work}/example.c" || { echo "no C example found" >&2; exit 1; }
gcc -std=c99 -Wall -Wextra -Werror -pedantic -Icapi "${work}/example.c" "${lib}" \
  -Wl,-rpath,"$(dirname "${lib}")" -o "${work}/example"
out="$(tests/run_mpi.sh 2 "${work}/example")"
echo "${out}"
[[ "$(grep -c 'averaged grad\[0\] = 0.5$' <<<"${out}")" == 2 ]] || { echo "wrong result" >&2; exit 1; }
