#!/usr/bin/env bash
# Runs a binary as N plain background processes on loopback, the way torchrun would start
# them (MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, RANK, WORLD_SIZE, LOCAL_RANK), and
# fails if any rank fails or the whole run exceeds the wall-clock limit (RUN_RANKS_LIMIT_S,
# default 240 s; not BRAID_-prefixed: no Braid option).
#
#   tests/gloo/run_ranks.sh 4 bazel-bin/tests/gloo/gloo_collectives_test [args...]
#
# RUN_RANKS_LAUNCHER=srun sets SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID instead of RANK /
# WORLD_SIZE / LOCAL_RANK (MASTER_ADDR / MASTER_PORT either way, as an sbatch script exports).
# Ranks listed in RUN_RANKS_SKIP (space-separated) are not started: they never arrive
# (tests/gloo/missing_rank_test.sh uses it and inspects the logs itself).
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <processes> <binary> [args...]" >&2
  exit 2
fi
np="$1"
binary="$2"
shift 2
limit="${RUN_RANKS_LIMIT_S:-240}"
skip=" ${RUN_RANKS_SKIP:-} "
logs="${TEST_TMPDIR:-$(mktemp -d)}/run_ranks.$$"
mkdir -p "${logs}"

# A free loopback port: bound by the kernel, released for rank 0 to bind.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

pids=()
ranks=()
for ((r = 0; r < np; ++r)); do
  [[ "${skip}" == *" ${r} "* ]] && continue
  ranks+=("${r}")
  if [[ "${RUN_RANKS_LAUNCHER:-torchrun}" == srun ]]; then
    vars=(SLURM_PROCID="${r}" SLURM_NTASKS="${np}" SLURM_LOCALID="${r}")
  else
    vars=(RANK="${r}" WORLD_SIZE="${np}" LOCAL_RANK="${r}")
  fi
  env MASTER_ADDR=127.0.0.1 MASTER_PORT="${port}" "${vars[@]}" \
    timeout --kill-after=10 "${limit}" "${binary}" "$@" >"${logs}/rank${r}.log" 2>&1 &
  pids+=("$!")
done

status=0
for i in "${!pids[@]}"; do
  pid="${pids[$i]}"
  r="${ranks[$i]}"
  rc=0
  wait "${pid}" || rc=$?
  if [[ ${rc} -ne 0 ]]; then
    if [[ ${rc} -eq 124 || ${rc} -eq 137 ]]; then
      echo "run_ranks.sh: rank ${r} did not finish within ${limit} s" >&2
    else
      echo "run_ranks.sh: rank ${r} failed (exit ${rc})" >&2
    fi
    status=1
  fi
done
# Rank logs: rank 0's in full, the others' failures (mpi_gtest prints only failures on ranks
# other than 0).
for r in "${ranks[@]}"; do
  echo "===== rank ${r} (MASTER_PORT=${port}) ====="
  cat "${logs}/rank${r}.log"
done
echo "run_ranks.sh: logs in ${logs}"
exit "${status}"
