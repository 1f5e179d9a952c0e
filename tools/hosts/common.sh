# shellcheck shell=bash disable=SC2034
# Shared names for the multi-host test bed (sourced by up.sh, down.sh, mpirun.sh).
#
# A bed is named by a prefix (default "braid"): namespaces <prefix>-hub and <prefix>-h0 ..
# <prefix>-h<N-1>, state (hostfile, host count) in /tmp/<prefix>-hosts/. Several beds can exist
# at once with different prefixes (tests use one per run): each bed's subnet lives only inside
# its own namespaces, so they all reuse 10.77.0.0/24 without meeting.
braid_hosts_subnet="10.77.0.0/24"
braid_hosts_hub_ip="10.77.0.254"   # the bridge's address in the hub: where mpirun listens
braid_hosts_net="10.77.0"          # host i is ${braid_hosts_net}.$((i + 1))
braid_hosts_dir() { echo "/tmp/$1-hosts"; }
