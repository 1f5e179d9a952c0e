#!/usr/bin/env bash
# libbraid.so exports only braid_* symbols, exactly the functions braid.h declares, and needs
# neither libcudart nor libnccl (the runtime is static, NCCL is opened with dlopen) nor Open
# MPI nor Gloo (their backends are modules loaded on first use); each backend module exports
# only its entry point braidBackendModule_v1 (backends/module/module.lds).
# braid.h's declarations are its own and those of the parts it includes beside it
# (`#include "braid_world.h"`, ...).
# Usage: exported_symbols_test.sh <libbraid.so> <braid.h> [<libbraid-BACKEND.so>...]
set -euo pipefail
lib="$1"
header="$2"
headers=("$header")
for part in $(sed -n 's/^#include "\(braid_[a-z0-9_]*\.h\)"$/\1/p' "$header"); do
  headers+=("$(dirname "$header")/$part")
  if [[ ! -f "${headers[-1]}" ]]; then
    echo "FAIL: $header includes $part, which is not beside it" >&2
    exit 1
  fi
done

exported="$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort)"
if [[ -z "$exported" ]]; then
  echo "FAIL: $lib exports no symbols" >&2
  exit 1
fi
stray="$(grep -v '^braid_' <<<"$exported" || true)"
if [[ -n "$stray" ]]; then
  echo "FAIL: $lib exports symbols outside the C API (check capi/braid.lds):" >&2
  echo "$stray" | head -50 >&2
  exit 1
fi

declared="$(cat "${headers[@]}" | grep -o '^BRAID_API[^(]*\bbraid_[a-z0-9_]*(' |
  grep -o 'braid_[a-z0-9_]*($' | tr -d '(' | sort)"
missing="$(comm -23 <(echo "$declared") <(echo "$exported"))"
extra="$(comm -13 <(echo "$declared") <(echo "$exported"))"
if [[ -n "$missing" || -n "$extra" ]]; then
  echo "FAIL: braid.h and $lib disagree" >&2
  [[ -n "$missing" ]] && echo "declared, not exported: $missing" >&2
  [[ -n "$extra" ]] && echo "exported, not declared: $extra" >&2
  exit 1
fi
needed="$(readelf -d "$lib" | grep NEEDED)"
if grep -qE '\[lib(cudart|nccl|mpi|gloo)\.so' <<<"$needed"; then
  echo "FAIL: $lib has NEEDED entries for CUDA/NCCL/MPI/Gloo (it must load without them):" >&2
  grep -E '\[lib(cudart|nccl|mpi|gloo)\.so' <<<"$needed" >&2
  exit 1
fi
for module in "${@:3}"; do
  module_exports="$(nm -D --defined-only "$module" | awk '{print $NF}')"
  if [[ "$module_exports" != "braidBackendModule_v1" ]]; then
    echo "FAIL: $module must export exactly braidBackendModule_v1, exports:" >&2
    echo "$module_exports" | head -20 >&2
    exit 1
  fi
done
echo "PASS: $(wc -l <<<"$exported") symbols, all braid_*, matching braid.h" \
  "(${#headers[@]} files); no NEEDED" \
  "libcudart/libnccl/libmpi/libgloo; $(($# - 2)) backend modules export only their entry point"
