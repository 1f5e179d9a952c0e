#!/usr/bin/env bash
# A failure reaches every rank within 2 s on the `mpi` backend (issue 13 item 4): runs each
# scenario of mpi_abort_check (see tests/mpi_abort_check.cc) as 4 processes under mpirun and
# checks every rank's verdict line, and, for a killed rank, how soon mpirun ends the job.
#
#   tests/mpi_abort_test.sh bazel-bin/tests/mpi_abort_check
#
# mpirun's own exit status is not the verdict: after a job abort the ranks leave without
# MPI_Finalize (MPI still owns the collectives their peers never joined), which mpirun reports
# as a failure, as it would for any aborted job.
set -uo pipefail

binary="$1"
np=4
fail=0
mpirun_cmd=(timeout --kill-after=10 90 mpirun --allow-run-as-root --oversubscribe
  --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo -np "${np}")

verdicts="$(mktemp -d)"
trap 'rm -rf "${verdicts}"' EXIT
# Each scenario with the default engine and with every collective on the communication
# threads (BRAID_MPI_ENGINE=blocking: the failure has to reach a thread stuck inside MPI).
for run in deadline:auto abort_job:auto deadline:blocking abort_job:blocking; do
  scenario="${run%%:*}"
  engine="${run##*:}"
  rm -f "${verdicts}"/rank*
  out="$(ABORT_CHECK_DIR="${verdicts}" ABORT_CHECK_MPI_ENGINE="${engine}" "${mpirun_cmd[@]}" \
    -x ABORT_CHECK_DIR -x ABORT_CHECK_MPI_ENGINE "${binary}" "${scenario}" 2>&1)"
  lines="$(cat "${verdicts}"/rank* 2>/dev/null)"
  count="$(grep -c . <<<"${lines}")"
  bad="$(grep ' ok=0' <<<"${lines}")"
  echo "== ${scenario} (engine ${engine})"
  echo "${lines}"
  if [[ "${count}" -ne "${np}" || -n "${bad}" ]]; then
    echo "FAIL: ${scenario}: ${count}/${np} ranks reported, failures: ${bad:-none}" >&2
    echo "${out}" >&2
    fail=1
  fi
done

# A rank's process dies: mpirun (Open MPI's runtime) notices and kills the other ranks.
start_ms=$(date +%s%3N)
out="$("${mpirun_cmd[@]}" "${binary}" die 2>&1)"
end_ms=$(date +%s%3N)
dies_at="$(sed -n 's/^ABORT-CHECK rank=1 dies_at_ms=\([0-9]*\).*/\1/p' <<<"${out}")"
echo "== die"
if [[ -z "${dies_at}" ]]; then
  echo "FAIL: die: rank 1 never reported" >&2
  echo "${out}" >&2
  fail=1
else
  # rank 1 sleeps 50 ms between its report and SIGKILL.
  took=$((end_ms - dies_at - 50))
  echo "mpirun ended the job ${took} ms after rank 1 was killed (whole run $((end_ms - start_ms)) ms)"
  if grep -q ' ok=' <<<"${out}"; then
    echo "FAIL: die: a rank outlived its peer's death" >&2
    echo "${out}" >&2
    fail=1
  fi
  if ((took > 2000)); then
    echo "FAIL: die: the job ended ${took} ms after the death (limit 2000 ms)" >&2
    fail=1
  fi
  if ! grep -qiE 'rank 1|signal 9|killed' <<<"${out}"; then
    echo "FAIL: die: mpirun's report does not name the dead rank" >&2
    echo "${out}" >&2
    fail=1
  else
    grep -iE 'rank 1|signal 9' <<<"${out}" | head -3
  fi
fi
exit "${fail}"
