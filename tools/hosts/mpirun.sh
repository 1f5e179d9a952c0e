#!/usr/bin/env bash
# mpirun across the hosts of a test bed made by tools/hosts/up.sh: TCP between hosts over the
# bed's subnet, shared memory (vader) between ranks of one host.
#
#   tools/hosts/mpirun.sh [-p prefix] <mpirun arguments...>
#   tools/hosts/mpirun.sh -p braid -np 4 bazel-bin/tests/mpi_collectives_test
#
# mpirun itself runs in the hub namespace (the only place, besides the hosts, that reaches the
# subnet) and starts one orted per host through rsh_agent.sh, directly (no tree spawn). Ranks
# fill the hostfile's slots in order: with `-s 2`, ranks 0 and 1 on <prefix>-h0, 2 and 3 on
# <prefix>-h1. No binding: the hosts share this machine's cores, and binding by local rank
# would pin every host's rank 0 to the same core. The working directory and the environment
# pass through to the ranks; run it as root (ip netns exec). HOSTS_BTL replaces the transports
# (default self,vader,tcp; e.g. HOSTS_BTL=self,tcp for TCP inside a host too): mpirun refuses
# an MCA parameter given twice, so `--mca btl` cannot be passed on top.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/common.sh"

prefix=braid
if [[ "${1:-}" == "-p" ]]; then prefix="$2"; shift 2; fi
hostfile="$(braid_hosts_dir "${prefix}")/hostfile"
if [[ ! -f "${hostfile}" ]]; then
  echo "mpirun.sh: no bed '${prefix}' (${hostfile} is missing); create it with tools/hosts/up.sh -p ${prefix}" >&2
  exit 2
fi
exec ip netns exec "${prefix}-hub" mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --hostfile "${hostfile}" \
  --mca plm_rsh_agent "${here}/rsh_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
  --mca oob_tcp_if_include "${braid_hosts_subnet}" \
  --mca pml ob1 --mca btl "${HOSTS_BTL:-self,vader,tcp}" --mca btl_tcp_if_include "${braid_hosts_subnet}" \
  "$@"
