#!/usr/bin/env bash
# Runs capi_leave_test (a rank returns from main without destroying its world) on two ranks:
#   mpi:  under mpirun -np 2, rank 1 leaving. It leaves without MPI_Finalize, so mpirun's status
#         is not the verdict: rank 0's "capi_leave_test: rank 0 passed" line is.
#   gloo: two processes with torchrun's variables: rank 1 leaving, then rank 0 (the store's
#         host), each checked by the other rank's "passed" line; then both ranks returning after
#         their last collective (a normal end: both exit 0, no Braid error or warning).
#
#   tests/capi/capi_leave_test.sh bazel-bin/tests/capi/capi_leave_test [mpi|gloo]
set -uo pipefail
bin="$1"
backend="${2:-mpi}"
if [[ "${backend}" == mpi ]]; then
  out="$(timeout --kill-after=10 120 mpirun --allow-run-as-root --oversubscribe \
    --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo -np 2 "${bin}" mpi 1 2>&1)"
  if grep -q "capi_leave_test: rank 0 passed" <<<"${out}"; then
    grep "^rank 0" <<<"${out}"
    exit 0
  fi
  echo "capi_leave_test.sh: rank 0 did not pass; the output:" >&2
  echo "${out}" >&2
  exit 1
fi

tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/capi_leave.XXXXXX")"
# Both ranks of one run; prints both outputs; returns rank 0's and rank 1's exit codes as "a b".
run_pair() {
  local leaver="$1" port pids=() r
  port="$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  for r in 0 1; do
    RANK=${r} WORLD_SIZE=2 LOCAL_RANK=${r} LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=${port} timeout --kill-after=10 60 "${bin}" gloo "${leaver}" \
      >"${tmp}/${leaver}.${r}" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"; echo -n "$? " >"${tmp}/${leaver}.rc"
  wait "${pids[1]}"; echo "$?" >>"${tmp}/${leaver}.rc"
}

status=0
for leaver in 1 0; do
  survivor=$((1 - leaver))
  run_pair "${leaver}"
  if grep -q "capi_leave_test: rank ${survivor} passed" "${tmp}/${leaver}.${survivor}"; then
    grep "^rank ${survivor}" "${tmp}/${leaver}.${survivor}"
  else
    echo "capi_leave_test.sh: gloo, rank ${leaver} leaving: rank ${survivor} did not pass:" >&2
    cat "${tmp}/${leaver}.${survivor}" "${tmp}/${leaver}.${leaver}" >&2
    status=1
  fi
done

start=$(date +%s.%N)
run_pair -1
end=$(date +%s.%N)
# Nothing but the two verdict lines per rank: no Braid warning, no error.
others="$(cat "${tmp}/-1.0" "${tmp}/-1.1" | grep -v "^capi_leave_test: ")"
if [[ "$(cat "${tmp}/-1.rc")" == "0 0" && -z "${others}" ]]; then
  echo "gloo, a normal end without braid_world_destroy: both ranks exit 0 in" \
    "$(awk -v a="${start}" -v b="${end}" 'BEGIN { printf "%.2f", b - a }') s"
else
  echo "capi_leave_test.sh: gloo, a normal end: exit codes $(cat "${tmp}/-1.rc"); output:" >&2
  cat "${tmp}/-1.0" "${tmp}/-1.1" >&2
  status=1
fi
exit "${status}"
