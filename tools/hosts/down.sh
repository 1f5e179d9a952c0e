#!/usr/bin/env bash
# Removes a test bed made by up.sh: its hub and host namespaces (deleting a namespace deletes
# the veth ends, bridge and qdiscs inside it) and /tmp/<prefix>-hosts. Idempotent: removing a
# bed that is not there, or half there after a failed up.sh, succeeds.
#
#   tools/hosts/down.sh [-p prefix]      # default prefix: braid
#
# Processes still running inside a host (a hung rank) keep its namespace alive after
# `ip netns del` (the name goes, the network stays until they exit): they are killed first.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/common.sh"

prefix=braid
while getopts "p:" opt; do
  case "${opt}" in p) prefix="${OPTARG}" ;; *) sed -n '2,8p' "$0" >&2; exit 2 ;; esac
done

for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  if [[ "${ns}" == "${prefix}-hub" || "${ns}" =~ ^${prefix}-h[0-9]+$ ]]; then
    mapfile -t pids < <(ip netns pids "${ns}" 2>/dev/null || true)
    if ((${#pids[@]})); then kill -9 "${pids[@]}" 2>/dev/null || true; fi
    ip netns del "${ns}" || echo "down.sh: could not delete namespace ${ns}" >&2
  fi
done
rm -rf "$(braid_hosts_dir "${prefix}")"
exit 0
