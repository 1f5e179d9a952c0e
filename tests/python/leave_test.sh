#!/usr/bin/env bash
# A rank that leaves without a collective shutdown (tests/python/leave_test.py) on `mpi`
# (mpirun -np 2) or `gloo` (two processes with torchrun's variables), once raising and once
# calling sys.exit. Rank 1 exits non-zero on purpose, so the launcher's status is not the
# verdict: rank 0's "leave_test: rank 0 passed" line is.
#
#   tests/python/leave_test.sh mpi|gloo
set -uo pipefail
backend="$1"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/leave.XXXXXX")"
run=(tests/python/run_python.sh tests/python/leave_test.py "${backend}")
status=0
for how in raise exit; do
  rm -f "${tmp}/left"
  out="${tmp}/${how}.out"
  if [[ "${backend}" == mpi ]]; then
    timeout --kill-after=10 120 mpirun --allow-run-as-root --oversubscribe \
      --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
      -np 2 "${run[@]}" "${how}" "${tmp}" >"${out}" 2>&1
  else
    port="$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    pids=()
    for r in 0 1; do
      RANK=${r} WORLD_SIZE=2 LOCAL_RANK=${r} LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=${port} timeout --kill-after=10 120 "${run[@]}" "${how}" "${tmp}" \
        >"${out}.${r}" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    cat "${out}.0" "${out}.1" >"${out}"
  fi
  if grep -q "leave_test: rank 0 passed (${backend}, ${how})" "${out}"; then
    grep "^rank 0:" "${out}"
  else
    echo "leave_test.sh: ${backend}, ${how}: rank 0 did not pass; its output:" >&2
    cat "${out}" >&2
    status=1
  fi
done
exit "${status}"
