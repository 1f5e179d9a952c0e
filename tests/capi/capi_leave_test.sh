#!/usr/bin/env bash
# Runs capi_leave_test under mpirun -np 2. Its rank 1 leaves without MPI_Finalize, so mpirun's
# status is not the verdict: rank 0's "capi_leave_test: rank 0 passed" line is.
#
#   tests/capi/capi_leave_test.sh bazel-bin/tests/capi/capi_leave_test
set -uo pipefail
out="$(timeout --kill-after=10 120 mpirun --allow-run-as-root --oversubscribe \
  --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo -np 2 "$1" 2>&1)"
if grep -q "capi_leave_test: rank 0 passed" <<<"${out}"; then
  grep "^rank 0:" <<<"${out}"
  exit 0
fi
echo "capi_leave_test.sh: rank 0 did not pass; the output:" >&2
echo "${out}" >&2
exit 1
