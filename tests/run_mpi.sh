#!/usr/bin/env bash
# Runs an MPI test binary as N processes on this host and fails if any rank fails.
#
#   tests/run_mpi.sh 4 bazel-bin/tests/mpi_collectives_test [gtest flags...]
#
# Shared memory only (ob1 + vader, loopback for mpirun's own control channel), oversubscribed
# so 4 ranks run on a 2-core machine. mpirun exits non-zero when any rank does; the wall-clock
# limit (MPI_TEST_LIMIT_S, default 240 s; deliberately not BRAID_-prefixed, since it is no
# Braid option) turns a hang into a failure even if the ranks' own deadlines did not.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <processes> <binary> [args...]" >&2
  exit 2
fi
np="$1"
binary="$2"
shift 2

limit="${MPI_TEST_LIMIT_S:-240}"
# Open MPI's session directory stays in the system /tmp: Bazel's TEST_TMPDIR can be too long
# for the Unix socket paths Open MPI creates in it (108 bytes).

# Under --config=asan: no leak check in MPI processes. Open MPI allocates at MPI_Init what it
# never frees and dlcloses its components before exit (the leaks cannot even be attributed);
# Braid's own code is leak-checked by the local-backend tests. Harmless without ASan.
export ASAN_OPTIONS="${ASAN_OPTIONS:+${ASAN_OPTIONS}:}detect_leaks=0"

status=0
timeout --kill-after=10 "${limit}" \
  mpirun --allow-run-as-root --oversubscribe \
    --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
    -np "${np}" "${binary}" "$@" || status=$?
if [[ ${status} -eq 124 || ${status} -eq 137 ]]; then
  echo "run_mpi.sh: ${binary} with ${np} processes did not finish within ${limit} s" >&2
elif [[ ${status} -ne 0 ]]; then
  echo "run_mpi.sh: ${binary} with ${np} processes failed (exit ${status})" >&2
fi
exit "${status}"
