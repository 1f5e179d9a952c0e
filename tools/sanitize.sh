#!/usr/bin/env bash
# Runs the CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer, and the threaded
# multi-rank tests under ThreadSanitizer (configs in .bazelrc; docs/hardening.md has timings).
#
#   tools/sanitize.sh          # both
#   tools/sanitize.sh asan     # every test but the `gpu`-tagged ones, built with --config=asan
#   tools/sanitize.sh tsan     # the tests that run ranks as threads, --config=tsan
#   tools/sanitize.sh tsan --test_output=all    # extra arguments go to `bazel test`
#
# `gpu` tests need a device (tools/gpu/run.sh runs them there); the Python tests and the README
# example (gcc-built, under mpirun) load
# libbraid.so into an uninstrumented program and are left out of asan (the runtime must
# come first), and so are the C SDK's test (programs built by the system's cc) and packages,
# and the wheel (tools/build_wheel.py refuses to bundle the sanitizer
# runtimes); the mpirun tests are left out of tsan (Open MPI's shared-memory transport is
# uninstrumented and reports its own races). The nvcc-built objects are not instrumented.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-all}"
shift || true

run_asan() {
  echo "sanitize.sh: asan + ubsan over the CPU suite" >&2
  # The LSan suppressions need an absolute path (a relative one is taken from each test
  # binary's directory; .bazelrc cannot name the workspace in --test_env).
  time "${root}/tools/bazelw" test --config=asan --build_tag_filters=-gpu \
    --test_tag_filters=-gpu -k \
    --test_env=LSAN_OPTIONS="suppressions=${root}/tools/sanitizers/lsan.supp:print_suppressions=0" \
    "$@" -- //... -//tests/python/... -//tests/capi:readme_example_test -//capi/python:wheel \
    -//tests/sdk:sdk_test -//capi:sdk_archive -//capi:debs
}

# Tests whose ranks are threads of one process (tests/multirank.h and the C API's threads).
tsan_targets=(
  //tests:local_collectives_test //tests:local_errors_test //tests:work_test
  //tests:reducer_test //tests:reducer_errors_test //tests:reducer_alloc_test
  //tests:param_gatherer_test //tests:plugin_test //tests:timeline_test
  //tests/optim:sharded_optimizer_test //tests/optim:reshard_test
  //tests/nccl:nccl_collectives_test //tests/nccl:nccl_reducer_test
  //tests/nccl:nccl_optimizer_test //tests/capi:capi_test //tests/capi:capi_optimizer_test
  //tests:unit_scheduler_test //tests/optim:fully_sharded_test //tests/capi:capi_fsdp_test
  //tests/rendezvous:store_test //tests/rendezvous:launcher_rendezvous_test
  //tests/capi:capi_rebuild_test //tests:op_scheduler_test //tests:autotuner_test
  //tests/nccl:host_values_test
  //tests:abort_test //tests/nccl:nccl_abort_test //tests/nccl:nccl_errors_test
  //tests:plugin_abort_test //tests:gather_quant_test //tests/nccl:nccl_cast_gather_test
)

run_tsan() {
  echo "sanitize.sh: tsan over the threaded multi-rank tests" >&2
  # TSan slows the multi-rank tests 5-10x: give every test up to 30 minutes.
  time "${root}/tools/bazelw" test --config=tsan -k --test_timeout=1800 \
    --test_env=TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=${root}/tools/sanitizers/tsan.supp" \
    "$@" -- "${tsan_targets[@]}"
}

case "${mode}" in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@"; run_tsan "$@" ;;
  *) echo "usage: $0 [asan|tsan|all] [bazel test flags...]" >&2; exit 2 ;;
esac
