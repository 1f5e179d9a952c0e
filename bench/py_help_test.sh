#!/usr/bin/env bash
# The Python bench programs answer --help with their usage (exit 0) through the command users
# run, and refuse an unknown flag with a non-zero exit (help_test.sh does the same for the C++
# ones). Run from the runfiles root, where the wrappers find tests/python/run_python.sh.
#   py_help_test.sh
set -uo pipefail
fail=0
expect_usage() {  # command...
  local out
  if ! out="$("$@" 2>&1)"; then
    echo "FAIL: $* exited non-zero" >&2; fail=1
  elif ! grep -qi "usage" <<<"${out}"; then
    echo "FAIL: $* printed no usage" >&2; fail=1
  fi
}
expect_refusal() {  # command...
  if "$@" >/dev/null 2>&1; then
    echo "FAIL: $* accepted an unknown flag" >&2; fail=1
  fi
}
run=tests/python/run_python.sh
expect_usage bench/run_train_gpt.sh --help        # //bench:train_gpt
expect_usage bench/run_torch_step.sh --help       # //bench:torch_step
expect_usage "${run}" bench/memory_pytorch.py --help  # //bench:memory_pytorch
expect_usage "${run}" bench/hooks_torch.py --help     # torch's hooks on the slow-link bed
expect_usage "${run}" bench/plot_hook_losses.py --help
for script in bench/train_gpt.py bench/torch_step_bench.py bench/memory_pytorch.py \
    bench/hooks_torch.py bench/plot_hook_losses.py; do
  expect_refusal "${run}" "${script}" --no_such_flag_xyz
done
[[ ${fail} -eq 0 ]] && echo "py_help_test: the Python bench programs answer --help"
exit ${fail}
