#!/usr/bin/env bash
# Braid's binaries load on machines without CUDA or NCCL: the CUDA runtime is linked statically
# and NCCL is opened with dlopen at first use, so neither libbraid.so nor any binary (nor any
# shared object it loads) has a NEEDED entry for libcudart or libnccl.
# Usage: no_cuda_needed_test.sh <binary or shared library>...
set -euo pipefail
# libcudart.so* / libnccl.so* as a whole name (Bazel's solib of //backends/nccl is
# libbackends_Snccl_Slibnccl.so: not NCCL).
cuda_lib='(^|[][/[:space:]])lib(cudart|nccl)\.so'
fail=0
for f in "$@"; do
  direct="$(readelf -d "$f" | grep NEEDED | grep -E "$cuda_lib" || true)"
  if [[ -n "$direct" ]]; then
    echo "FAIL: $f needs CUDA/NCCL directly:" >&2
    echo "$direct" >&2
    fail=1
  fi
  # The whole load closure (the shared objects of a dynamically linked test included).
  closure="$(ldd "$f")"
  if grep -q 'not found' <<<"$closure"; then
    echo "FAIL: ldd cannot resolve every library of $f:" >&2
    grep 'not found' <<<"$closure" >&2
    fail=1
  fi
  loaded="$(grep -E "$cuda_lib" <<<"$closure" || true)"
  if [[ -n "$loaded" ]]; then
    echo "FAIL: loading $f loads CUDA/NCCL:" >&2
    echo "$loaded" >&2
    fail=1
  fi
  [[ "$fail" == 0 ]] && echo "checked $f: $(grep -c '=>' <<<"$closure") libraries, none of them libcudart/libnccl"
done
exit "$fail"
