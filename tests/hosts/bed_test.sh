#!/usr/bin/env bash
# The multi-host test bed itself (tools/hosts/): what the MPI tests on it take for granted.
#
#   tests/hosts/bed_test.sh          (as root; skips, exit 0, where namespaces cannot be made)
#
#  - up.sh makes N hosts with their addresses, tbf on both ends of each link and a hostfile;
#    running it again on the same prefix starts over (still N hosts);
#  - rsh_agent.sh runs a command line inside the named host with the host's name as hostname,
#    joining its words as ssh does, and refuses an unknown host;
#  - the rate holds: 2.5 MB between two hosts at 40 Mbit/s (5 MB/s) take >= 0.3 s, while the
#    same over loopback inside one host is faster;
#  - down.sh removes every namespace and the state directory, and succeeds again when there is
#    nothing left.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bed="${root}/tools/hosts"
source "${root}/tests/hosts/bed_probe.sh"
rate=40mbit
bed_probe_or_skip "${rate}"
command -v python3 >/dev/null || bed_skip "no python3 (the rate check's sender and receiver)"
bed_remove_stale "${bed}"

prefix="bt$$"
trap '"${bed}/down.sh" -p "${prefix}"' EXIT
fail() { echo "bed_test.sh: FAILED: $*" >&2; exit 1; }

# ---- up, twice ----
"${bed}/up.sh" -p "${prefix}" -n 3 -r "${rate}" -s 2 >/dev/null
hostfile="$("${bed}/up.sh" -p "${prefix}" -n 2 -r "${rate}" -s 2)"
[[ "$(cat "${hostfile}")" == "${prefix}-h0 slots=2"$'\n'"${prefix}-h1 slots=2" ]] ||
  fail "hostfile: $(cat "${hostfile}")"
namespaces="$(ip netns list | awk '{print $1}' | grep -E "^${prefix}-" | sort | paste -sd' ')"
[[ "${namespaces}" == "${prefix}-h0 ${prefix}-h1 ${prefix}-hub" ]] || fail "namespaces after re-up: ${namespaces}"
for i in 0 1; do
  addr="$(ip -n "${prefix}-h${i}" -4 -o addr show dev eth0 | awk '{print $4}')"
  [[ "${addr}" == "10.77.0.$((i + 1))/24" ]] || fail "h${i} eth0 address '${addr}'"
  ip -n "${prefix}-h${i}" link show lo | grep -q "UP" || fail "h${i} loopback down"
  ip netns exec "${prefix}-h${i}" tc qdisc show dev eth0 | grep -q "tbf.*rate 40Mbit" ||
    fail "h${i} eth0 has no tbf at 40Mbit"
  ip netns exec "${prefix}-hub" tc qdisc show dev "v${i}" | grep -q "tbf.*rate 40Mbit" ||
    fail "hub v${i} has no tbf at 40Mbit"
done

# ---- the agent ----
[[ "$("${bed}/rsh_agent.sh" "${prefix}-h1" hostname)" == "${prefix}-h1" ]] || fail "agent: hostname"
[[ "$("${bed}/rsh_agent.sh" -x "${prefix}-h0" 'ip -4 -o addr show dev eth0 | wc -l')" == 1 ]] ||
  fail "agent: not inside h0's namespace"
out="$("${bed}/rsh_agent.sh" "${prefix}-h0" printf '"%s|"' a '"b c"')"
[[ "${out}" == "a|b c|" ]] || fail "agent: words not joined as a shell line: '${out}'"
if "${bed}/rsh_agent.sh" "${prefix}-h7" true 2>/dev/null; then fail "agent: accepted an unknown host"; fi

# ---- the rate: seconds to send 2.5 MB from host $1 to address $2 (a receiver in host $3) ----
transfer_s() {
  local port=$((20000 + $$ % 20000))
  ip netns exec "${prefix}-h$3" python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); c, _ = s.accept()
while c.recv(1 << 16): pass' "${port}" &
  local receiver=$!
  ip netns exec "${prefix}-h$1" python3 -c '
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); break
    except OSError: time.sleep(0.05)
t = time.monotonic(); s.sendall(b"x" * 2500000); s.shutdown(socket.SHUT_WR); s.recv(1)
print("%.3f" % (time.monotonic() - t))' "$2" "${port}"
  wait "${receiver}"
}
across="$(transfer_s 0 10.77.0.2 1)"
inside="$(transfer_s 0 127.0.0.1 0)"
echo "bed_test.sh: 2.5 MB host to host at ${rate}: ${across} s; over loopback inside a host: ${inside} s"
python3 -c "import sys; a, i = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if 0.3 <= a <= 20 and i < a else 1)" \
  "${across}" "${inside}" || fail "rate not as set: ${across} s across (want 0.3..20 s), ${inside} s inside"

# ---- down, twice ----
"${bed}/down.sh" -p "${prefix}"
left="$(ip netns list | awk '{print $1}' | grep -E "^${prefix}-" || true)"
[[ -z "${left}" ]] || fail "namespaces left after down.sh: ${left}"
[[ ! -e "/tmp/${prefix}-hosts" ]] || fail "/tmp/${prefix}-hosts left after down.sh"
"${bed}/down.sh" -p "${prefix}" || fail "down.sh on nothing failed"
echo "bed_test.sh: PASSED"
