#!/usr/bin/env bash
# The wheel as a user gets it: `pip install` into a fresh virtual environment (with the system
# site packages, for torch and numpy) in a scratch directory, then, from outside the source
# tree with LIBBRAID_SO and PYTHONPATH unset, wheel_check.py: imports braid from the venv,
# trains 2 steps of DistributedDataParallel against serial torch on a 2-rank local world and
# under mpirun -np 2 (World() -> "mpi", loading libbraid-mpi.so from the venv), and names the
# library and Debian package when a backend module or its system library is missing; then the
# same local steps where Open MPI, Abseil and spdlog cannot load (a private mount namespace).
#   wheel_test.sh <braid-*.whl> <wheel_check.py>
set -euo pipefail
wheel="$(readlink -f "$1")"
check="$(readlink -f "$2")"
run_mpi="$(readlink -f tests/run_mpi.sh)"
scratch="$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")"
trap 'rm -rf "${scratch}"' EXIT

/usr/bin/python3 -m venv --system-site-packages "${scratch}/venv"
py="${scratch}/venv/bin/python"
# --no-index: offline; numpy (Requires-Dist) must come from the system site packages.
"${py}" -m pip install --no-index --disable-pip-version-check --quiet "${wheel}"
files="$("${py}" -m pip show --files braid)"
for f in braid/libbraid.so braid/libbraid-mpi.so braid/libbraid-gloo.so braid/_libs/libspdlog.so; do
  grep -q "${f}" <<<"${files}" || { echo "FAIL: pip did not install ${f}" >&2; exit 1; }
done

mkdir "${scratch}/work"
cp "${check}" "${scratch}/work/wheel_check.py"
cd "${scratch}/work"
unset LIBBRAID_SO PYTHONPATH
export OMP_NUM_THREADS=1
"${py}" wheel_check.py local
"${run_mpi}" 2 "${py}" wheel_check.py mpi

# A machine without Open MPI, Abseil or spdlog: in a private mount namespace their files read as
# empty (/dev/null bound over them), so the dynamic loader cannot use them. (Gloo and fmt stay:
# Debian's torch links them.) Needs CAP_SYS_ADMIN (root here); skipped, saying so, without it.
if unshare -m true 2> /dev/null; then
  unshare -m bash -euo pipefail -c '
    shopt -s nullglob
    for f in /usr/lib/x86_64-linux-gnu/libmpi.so.40* /usr/lib/x86_64-linux-gnu/libabsl_* \
             /usr/lib/x86_64-linux-gnu/libspdlog.so*; do
      mount --bind /dev/null "$f"
    done
    exec "$0" wheel_check.py bare' "${py}"
else
  echo "wheel_test: unshare -m is not allowed here: the check without Open MPI is skipped"
fi
