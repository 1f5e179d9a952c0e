#!/usr/bin/env bash
# A rank that never arrives: ranks 0, 1 and 3 of a world of 4 start (rank 2 does not), each
# must fail at the deadline (BRAID_TIMEOUT_MS=3000) with an error naming rank 2, and none may
# hang or succeed.
#
#   tests/gloo/missing_rank_test.sh tests/gloo/run_ranks.sh bazel-bin/tests/gloo/gloo_collectives_test
set -uo pipefail
run_ranks="$1"
binary="$2"
out="$(BRAID_TIMEOUT_MS=3000 RUN_RANKS_SKIP=2 RUN_RANKS_LIMIT_S=60 "${run_ranks}" 4 "${binary}" 2>&1)"
rc=$?
echo "${out}"
if [[ ${rc} -eq 0 ]]; then
  echo "missing_rank_test: the ranks succeeded without rank 2" >&2
  exit 1
fi
fail=0
for r in 0 1 3; do
  log="$(echo "${out}" | sed -n "/^===== rank ${r} /,/^=====/p")"
  if ! grep -q "rank 2 of a world of 4 did not arrive" <<<"${log}"; then
    echo "missing_rank_test: rank ${r}'s error does not name rank 2" >&2
    fail=1
  fi
done
if grep -q "did not finish within" <<<"${out}"; then
  echo "missing_rank_test: a rank hung past the deadline" >&2
  fail=1
fi
exit "${fail}"
