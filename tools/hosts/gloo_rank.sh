#!/usr/bin/env bash
# Runs a command as one rank of a `gloo` world under tools/hosts/mpirun.sh: the environment a
# torchrun-style launch gives (RANK, WORLD_SIZE, LOCAL_RANK from Open MPI's), with Open MPI's own
# markers removed, because Braid's World() refuses gloo under an MPI launcher (it would pick mpi).
#
#   tools/hosts/mpirun.sh -p wire -np 4 -x MASTER_ADDR=10.77.0.1 -x MASTER_PORT=29612 \
#     tools/hosts/gloo_rank.sh bazel-bin/bench/hooks_hosts --backend=gloo --link=eth0
set -euo pipefail
export RANK="${OMPI_COMM_WORLD_RANK:?not started by mpirun}"
export WORLD_SIZE="${OMPI_COMM_WORLD_SIZE}"
export LOCAL_RANK="${OMPI_COMM_WORLD_LOCAL_RANK}"
for v in $(env | grep -oE '^(OMPI|PMIX|PMI|OPAL)[A-Za-z0-9_]*'); do unset "${v}"; done
exec "$@"
