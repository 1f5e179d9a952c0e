#!/usr/bin/env bash
# Creates a multi-host test bed on this machine: N network namespaces ("hosts") joined to a
# bridge in a hub namespace by veth pairs, each link rate-limited with tbf in both directions.
#
#   tools/hosts/up.sh [-p prefix] [-n hosts] [-r rate] [-s slots]
#   tools/hosts/up.sh -p braid -n 2 -r 200mbit -s 2   # braid-hub, braid-h0, braid-h1
#
#   <prefix>-hub: bridge br0, 10.77.0.254/24 (mpirun runs here, tools/hosts/mpirun.sh)
#   <prefix>-hI:  lo up, eth0 = 10.77.0.(I+1)/24, its veth peer vI on br0 in the hub
#
# Why a hub: the host's own interfaces and routes are never touched (every link is created
# inside the bed's namespaces), and mpirun's node holds no ranks, so all N hosts are launched
# alike through tools/hosts/rsh_agent.sh. The rate (tc units: 1gbit, 200mbit, ...) limits each
# host's link in each direction (tbf on eth0 and on its hub-side peer); traffic between ranks of
# one host never crosses it (Open MPI's vader, shared memory). netem is not available, so
# there is no added latency, only a rate. HOSTS_TBF_BURST sets tbf's burst (default 256kb;
# deliberately not BRAID_-prefixed: Braid warns about unknown BRAID_ variables).
# Writes /tmp/<prefix>-hosts/hostfile ("<prefix>-hI slots=S" per host) and prints its path.
# A bed of the same prefix is torn down first; on any failure everything is removed again
# (down.sh) and the exit status is non-zero. Needs root (ip netns).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/common.sh"

prefix=braid hosts=2 rate=1gbit slots=2
while getopts "p:n:r:s:" opt; do
  case "${opt}" in
    p) prefix="${OPTARG}" ;; n) hosts="${OPTARG}" ;; r) rate="${OPTARG}" ;; s) slots="${OPTARG}" ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
  esac
done
if ! [[ "${hosts}" =~ ^[0-9]+$ ]] || ((hosts < 1 || hosts > 200)); then
  echo "up.sh: -n wants 1..200 hosts, got '${hosts}'" >&2; exit 2
fi
burst="${HOSTS_TBF_BURST:-256kb}"
hub="${prefix}-hub"
dir="$(braid_hosts_dir "${prefix}")"

"${here}/down.sh" -p "${prefix}" >/dev/null
trap '"${here}/down.sh" -p "${prefix}" >/dev/null 2>&1 || true' ERR

# limit DEV in NS: tbf on DEV's egress. latency bounds the queue (packets waiting longer drop).
limit() { ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate}" burst "${burst}" latency 200ms; }

ip netns add "${hub}"
ip -n "${hub}" link set lo up
ip -n "${hub}" link add br0 type bridge
ip -n "${hub}" addr add "${braid_hosts_hub_ip}/24" dev br0
ip -n "${hub}" link set br0 up
mkdir -p "${dir}"
: > "${dir}/hostfile"
for ((i = 0; i < hosts; ++i)); do
  h="${prefix}-h${i}"
  ip netns add "${h}"
  ip -n "${h}" link set lo up
  ip -n "${hub}" link add "v${i}" type veth peer name eth0 netns "${h}"
  ip -n "${hub}" link set "v${i}" master br0 up
  ip -n "${h}" addr add "${braid_hosts_net}.$((i + 1))/24" dev eth0
  ip -n "${h}" link set eth0 up
  limit "${h}" eth0
  limit "${hub}" "v${i}"
  echo "${h} slots=${slots}" >> "${dir}/hostfile"
done
echo "${hosts}" > "${dir}/count"
echo "${rate}" > "${dir}/rate"
echo "${dir}/hostfile"
