#!/usr/bin/env bash
# Runs an MPI test binary across a multi-host test bed (tools/hosts/) and fails if any rank
# fails, if the ranks are not placed host by host, or if no data crossed the inter-host links.
#
#   tests/hosts/run_on_bed.sh <hosts> <ranks per host> <rate> <binary> [args...]
#   tests/hosts/run_on_bed.sh 2 2 1gbit bazel-bin/tests/mpi_reducer_test
#
# Ranks h*R .. h*R+R-1 run on host h (checked before the binary runs: the hybrid tests rely on
# it, their shard groups being consecutive world ranks). The bed gets a name of its own
# (bt<pid>) and is removed on every exit (trap), pass or fail. Where the bed cannot be made
# here (not root, no `ip`, `ip netns add`, veth or tbf refused, no `unshare`), the test prints
# why and exits 0: a skip. MPI_TEST_LIMIT_S (default 240 s) limits the binary's run.
set -euo pipefail

if [[ $# -lt 4 ]]; then
  echo "usage: $0 <hosts> <ranks per host> <rate> <binary> [args...]" >&2
  exit 2
fi
hosts="$1" per_host="$2" rate="$3" binary="$4"
shift 4
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bed="${root}/tools/hosts"
np=$((hosts * per_host))
limit="${MPI_TEST_LIMIT_S:-240}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+${ASAN_OPTIONS}:}detect_leaks=0"  # as tests/run_mpi.sh

source "${root}/tests/hosts/bed_probe.sh"
bed_probe_or_skip "${rate}"
bed_remove_stale "${bed}"

# ---- the bed, removed on any exit ----
prefix="bt$$"
trap '"${bed}/down.sh" -p "${prefix}"' EXIT
"${bed}/up.sh" -p "${prefix}" -n "${hosts}" -r "${rate}" -s "${per_host}" >/dev/null
echo "run_on_bed.sh: bed ${prefix}: ${hosts} hosts x ${per_host} ranks, links ${rate} (tbf)"

# ---- placement: rank r on host r / per_host ----
# shellcheck disable=SC2016  # single quotes: expanded by each rank's sh
placement="$(timeout 60 "${bed}/mpirun.sh" -p "${prefix}" -np "${np}" \
  sh -c 'echo "${OMPI_COMM_WORLD_RANK} $(hostname)"' | sort -n)"
expected="$(for ((r = 0; r < np; ++r)); do echo "${r} ${prefix}-h$((r / per_host))"; done)"
if [[ "${placement}" != "${expected}" ]]; then
  printf 'run_on_bed.sh: ranks not placed host by host; got:\n%s\nwanted:\n%s\n' \
    "${placement}" "${expected}" >&2
  exit 1
fi

# Bytes host h sent or received on its link: each must grow during the run (data went over TCP
# between the hosts, not some path around the bed).
link_bytes() {
  ip netns exec "${prefix}-h$1" cat /sys/class/net/eth0/statistics/tx_bytes \
    /sys/class/net/eth0/statistics/rx_bytes | paste -sd' '
}
declare -a before
for ((h = 0; h < hosts; ++h)); do before[h]="$(link_bytes "${h}")"; done

status=0
timeout --kill-after=10 "${limit}" "${bed}/mpirun.sh" -p "${prefix}" -np "${np}" \
  "${binary}" "$@" || status=$?
if [[ ${status} -eq 124 || ${status} -eq 137 ]]; then
  echo "run_on_bed.sh: ${binary} on ${np} ranks did not finish within ${limit} s" >&2
  exit "${status}"
elif [[ ${status} -ne 0 ]]; then
  echo "run_on_bed.sh: ${binary} on ${np} ranks failed (exit ${status})" >&2
  exit "${status}"
fi

min_bytes=$((64 * 1024))
for ((h = 0; h < hosts; ++h)); do
  read -r tx0 rx0 <<< "${before[h]}"
  read -r tx1 rx1 <<< "$(link_bytes "${h}")"
  echo "run_on_bed.sh: ${prefix}-h${h} link: sent $((tx1 - tx0)) B, received $((rx1 - rx0)) B"
  if ((tx1 - tx0 < min_bytes || rx1 - rx0 < min_bytes)); then
    echo "run_on_bed.sh: under ${min_bytes} B crossed ${prefix}-h${h}'s link each way: the ranks did not talk across hosts" >&2
    exit 1
  fi
done
