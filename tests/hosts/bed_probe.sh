# shellcheck shell=bash
# Sourced by the tests in tests/hosts/: bed_probe_or_skip RATE exits 0 with "SKIPPED: <why>"
# unless a test bed (tools/hosts/up.sh) can be made here: root, iproute2 and util-linux
# commands, and a probe namespace that accepts a veth pair, a tbf qdisc at RATE and a UTS
# namespace. The probe namespace is removed again.
bed_skip() {
  echo "SKIPPED: $* (the multi-host test bed needs root and network namespaces)"
  exit 0
}

bed_probe_or_skip() {
  local rate="$1" probe="bt$$-probe"
  [[ $(id -u) -eq 0 ]] || bed_skip "not root (uid $(id -u))"
  local c
  for c in ip tc unshare; do
    command -v "${c}" >/dev/null || bed_skip "no '${c}' command"
  done
  ip netns add "${probe}" 2>/dev/null || bed_skip "'ip netns add' failed"
  local why=""
  if ! ip -n "${probe}" link add p0 type veth peer name p1 2>/dev/null; then
    why="veth pairs refused"
  elif ! ip netns exec "${probe}" tc qdisc add dev p0 root tbf rate "${rate}" burst 256kb \
      latency 200ms 2>/dev/null; then
    why="tc tbf refused"
  elif ! ip netns exec "${probe}" unshare --uts true 2>/dev/null; then
    why="unshare --uts refused"
  fi
  ip netns del "${probe}" 2>/dev/null || true
  [[ -z "${why}" ]] || bed_skip "${why}"
}

# Beds of earlier runs killed before their trap ran (bt<pid>-*, pid gone): removed.
bed_remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^bt[0-9]+-hub$' || true); do
    pid="${ns#bt}"
    pid="${pid%-hub}"
    if ! kill -0 "${pid}" 2>/dev/null; then "$1/down.sh" -p "bt${pid}"; fi
  done
}
