#!/usr/bin/env bash
# Open MPI's remote shell for the test bed: runs a command "on" a host of tools/hosts/up.sh by
# entering its network namespace, as ssh would run it on a real machine.
#
#   mpirun --mca plm_rsh_agent /abs/path/tools/hosts/rsh_agent.sh --hostfile ... (mpirun.sh does)
#   tools/hosts/rsh_agent.sh braid-h1 hostname        # prints braid-h1
#
# Open MPI calls `<agent> [options] <host> <command words...>`, the words being one shell
# command line for the remote shell (`PATH=...; export PATH; ... /usr/bin/orted -mca ...`):
# like ssh, this joins them and runs them with sh -c. Leading options (ssh's -x and the like,
# should plm_rsh_args add any) are skipped. The environment passes through unchanged (there is
# no login), so orted and the ranks see mpirun's.
# The command also gets its own UTS namespace with the host's name as hostname: the bed's hosts
# share one /tmp, and Open MPI names its session directory and shared-memory segments after the
# hostname, so two "hosts" with the machine's one name would collide there.
set -euo pipefail
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
if [[ $# -lt 2 ]]; then
  echo "usage: $0 <host namespace> <command...>" >&2
  exit 255
fi
host="$1"
shift
if ! ip netns list | awk '{print $1}' | grep -qx -- "${host}"; then
  echo "rsh_agent.sh: no host (network namespace) '${host}'; is the bed up? (tools/hosts/up.sh)" >&2
  exit 255
fi
# unshare --uts: a private hostname for this command and its children only. The inner sh gets
# the host name as $0 and the joined command line as $1 (single quotes: expanded by that sh).
# shellcheck disable=SC2016
exec ip netns exec "${host}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "${host}" "$*"
