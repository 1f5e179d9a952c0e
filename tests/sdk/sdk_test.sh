#!/usr/bin/env bash
# The C SDK as a framework engineer gets it, used from a project outside the tree: capi/example.c
# (C99) and tests/sdk/sdk_example.cc (C++17) are built and run on a 2-rank local world, their
# results checked, against
#   1. the SDK installed into a scratch prefix (what `//capi:install -- --prefix=DIR` does):
#      cc/c++ with `pkg-config --cflags --libs braid`, and CMake with find_package(Braid);
#   2. the .tar.gz unpacked elsewhere (relocatable braid.pc and BraidConfig.cmake);
#   3. the Debian packages: their control fields, their files extracted (dpkg -x) into a scratch
#      root and built against there, `apt-get install --simulate` of both on this machine; and,
#      only with SDK_TEST_APT_INSTALL=1 (`--test_env=SDK_TEST_APT_INSTALL=1`, as
#      root, when nothing else would be installed with them), a real `apt-get install`, the
#      build with the system's pkg-config and CMake, then `apt-get purge`, leaving the machine
#      as it was. Without it, that step is skipped, saying why.
# Usage (tests/sdk/BUILD.bazel passes these): sdk_test.sh SDK_PY HEADER PLUGIN_HEADER LIB
#   MPI_MODULE GLOO_MODULE ARCHIVE RUNTIME_DEB DEV_DEB EXAMPLE_C SDK_EXAMPLE_CC CMAKELISTS
set -euo pipefail
abs() { readlink -f "$1"; }
sdk_py="$(abs "$1")" header="$(abs "$2")" plugin_header="$(abs "$3")" lib="$(abs "$4")"
modules=("$(abs "$5")" "$(abs "$6")")
archive="$(abs "$7")" runtime_deb="$(abs "$8")" dev_deb="$(abs "$9")"
sources=("$(abs "${10}")" "$(abs "${11}")" "$(abs "${12}")")

scratch="$(mktemp -d "${TEST_TMPDIR:-/tmp}/sdk.XXXXXX")"
trap 'rm -rf "${scratch}"' EXIT
unset PKG_CONFIG_PATH PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR CMAKE_PREFIX_PATH LD_LIBRARY_PATH
version="$(for p in MAJOR MINOR PATCH; do
  sed -n "s/^#define BRAID_VERSION_$p \([0-9]*\)$/\1/p" "${header}"; done | paste -sd.)"
abi="$(sed -n 's/^#define BRAID_ABI_VERSION \([0-9]*\)$/\1/p' "${header}")"
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH)"
echo "Braid ${version}, ABI ${abi} (libbraid.so.${abi})"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# braid.h and the parts it includes (`#include "braid_world.h"`, ...) are all in $1 (an include
# directory), as in the tree: the programs below would not compile without them, and this names
# the one missing.
check_headers() {
  local dir="$1" part
  cmp -s "${header}" "${dir}/braid.h" || fail "${dir}/braid.h differs from ${header}"
  for part in $(sed -n 's/^#include "\(braid_[a-z0-9_]*\.h\)"$/\1/p' "${header}"); do
    cmp -s "$(dirname "${header}")/${part}" "${dir}/${part}" ||
      fail "${dir}/${part} (braid.h includes it) is missing or differs from the tree's"
  done
}

# A fresh copy of the consumer project (the sources, no Braid tree around them).
consumer() {
  local dir="${scratch}/$1"
  mkdir -p "${dir}"
  cp "${sources[@]}" "${dir}/"
  echo "${dir}"
}

# Runs the two programs built in $1 and checks their results and which libbraid they loaded
# (a path under $2).
run_programs() {
  local dir="$1" libdir="$2" out
  local want loaded
  want="$(readlink -f "${libdir}/libbraid.so.${abi}")"
  for exe in "${dir}/example" "${dir}/sdk_example"; do
    loaded="$(ldd "${exe}" | sed -n "s/^\s*libbraid.so.${abi} => \(\S*\) .*/\1/p")"
    [[ -n "${loaded}" && "$(readlink -f "${loaded}")" == "${want}" ]] ||
      fail "${exe} loads libbraid.so.${abi} from '${loaded}', not ${libdir}"
  done
  out="$("${dir}/example")" || fail "example exited $?: ${out}"
  for r in 0 1; do
    grep -qx "rank ${r}: avg = \[0.5 2 3 4\]" <<<"${out}" || fail "example's rank ${r}: ${out}"
  done
  grep -qx "braid ${version}: ok" <<<"${out}" || fail "example: ${out}"
  out="$("${dir}/sdk_example")" || fail "sdk_example exited $?: ${out}"
  grep -qx "sdk_example: braid ${version} (header ${version}): ok" <<<"${out}" ||
    fail "sdk_example: ${out}"
}

# pkg-config (with the environment given as arguments) and the compilers; $1 the project dir,
# $2 the library directory programs load libbraid from (an rpath unless it is the system's).
build_with_pkg_config() {
  local dir="$1" libdir="$2" rpath=()
  shift 2
  [[ "${libdir}" == "/usr/lib/${multiarch}" ]] || rpath=("-Wl,-rpath,${libdir}")
  local flags
  flags="$(env "$@" pkg-config --cflags --libs braid)"
  [[ "$(env "$@" pkg-config --modversion braid)" == "${version}" ]] || fail "braid.pc version"
  cc -std=c99 -Wall -Wextra -Werror -pedantic "${dir}/example.c" ${flags} -pthread "${rpath[@]}" \
    -o "${dir}/example"
  c++ -std=c++17 -Wall -Wextra -Werror "${dir}/sdk_example.cc" ${flags} -pthread "${rpath[@]}" \
    -o "${dir}/sdk_example"
  run_programs "${dir}" "${libdir}"
  echo "ok: pkg-config (${flags}): example.c and sdk_example.cc built and ran"
}

# CMake's find_package(Braid); $1 the project dir, $2 the library directory, $3 the Braid_DIR
# it must find, then cmake arguments.
build_with_cmake() {
  local dir="$1" libdir="$2" want_dir="$3" log
  shift 3
  log="$(cmake -S "${dir}" -B "${dir}/build" -DBRAID_WANT_VERSION="${version}" "$@" 2>&1)" ||
    fail "cmake configure: ${log}"
  grep -q "Braid ${version} (ABI ${abi}) from ${want_dir}\$" <<<"${log}" ||
    fail "find_package(Braid) did not find ${want_dir}: ${log}"
  log="$(cmake --build "${dir}/build" 2>&1)" || fail "cmake build: ${log}"
  cp "${dir}/build/example" "${dir}/build/sdk_example" "${dir}/"
  run_programs "${dir}" "${libdir}"
  echo "ok: CMake find_package(Braid) from ${want_dir}: built and ran both"
}

echo "== 1. installed into a prefix"
prefix="${scratch}/prefix"
/usr/bin/python3 "${sdk_py}" install --prefix "${prefix}" --header "${header}" \
  --plugin-header "${plugin_header}" --lib "${lib}" --module "${modules[0]}" \
  --module "${modules[1]}" > /dev/null
[[ "$(readlink "${prefix}/lib/libbraid.so.${abi}")" == "libbraid.so.${abi}.${version#*.}" ]] ||
  fail "lib/libbraid.so.${abi} does not point at libbraid.so.${abi}.${version#*.}"
check_headers "${prefix}/include"
build_with_pkg_config "$(consumer prefix-pc)" "${prefix}/lib" \
  PKG_CONFIG_PATH="${prefix}/lib/pkgconfig"
build_with_cmake "$(consumer prefix-cmake)" "${prefix}/lib" "${prefix}/lib/cmake/Braid" \
  -DCMAKE_PREFIX_PATH="${prefix}"

echo "== 2. the archive, unpacked elsewhere"
mkdir "${scratch}/unpacked"
tar -xzf "${archive}" -C "${scratch}/unpacked"
top="${scratch}/unpacked/$(basename "${archive}" .tar.gz)"
check_headers "${top}/include"
build_with_pkg_config "$(consumer archive-pc)" "${top}/lib" PKG_CONFIG_PATH="${top}/lib/pkgconfig"
build_with_cmake "$(consumer archive-cmake)" "${top}/lib" "${top}/lib/cmake/Braid" \
  -DCMAKE_PREFIX_PATH="${top}"

echo "== 3. the Debian packages"
field() { dpkg-deb -f "$1" "$2"; }
[[ "$(field "${runtime_deb}" Package)" == "libbraid${abi}" ]] || fail "runtime package name"
depends="$(field "${runtime_deb}" Depends)"
for p in libabsl libspdlog libfmt libstdc++6 libc6; do
  grep -q "${p}" <<<"${depends}" || fail "libbraid${abi} Depends lacks ${p}: ${depends}"
done
for p in libopenmpi3 libgloo0; do
  grep -q "${p}" <<<"$(field "${runtime_deb}" Suggests)" || fail "libbraid${abi} Suggests ${p}"
done
[[ "$(field "${dev_deb}" Depends)" == "libbraid${abi} (= ${version})" ]] || fail "-dev Depends"
dpkg-deb --ctrl-tarfile "${runtime_deb}" | tar -xO ./shlibs |
  grep -qx "libbraid ${abi} libbraid${abi} (>= ${version})" || fail "shlibs file"
echo "ok: control fields (Depends: ${depends})"

root="${scratch}/debroot"
dpkg-deb -x "${runtime_deb}" "${root}"
dpkg-deb -x "${dev_deb}" "${root}"
libdir="${root}/usr/lib/${multiarch}"
for f in "libbraid.so.${abi}" libbraid.so libbraid-mpi.so libbraid-gloo.so; do
  [[ -e "${libdir}/${f}" ]] || fail "the packages hold no usr/lib/${multiarch}/${f}"
done
dpkg-deb -x "${dev_deb}" "${scratch}/devroot"
check_headers "${scratch}/devroot/usr/include"  # in libbraid-dev, not the runtime package
build_with_pkg_config "$(consumer deb-pc)" "${libdir}" PKG_CONFIG_SYSROOT_DIR="${root}" \
  PKG_CONFIG_LIBDIR="${libdir}/pkgconfig"
build_with_cmake "$(consumer deb-cmake)" "${libdir}" "${libdir}/cmake/Braid" \
  -DCMAKE_PREFIX_PATH="${root}/usr"

# What apt would do on this machine (no change made): every dependency resolves.
debs=("${runtime_deb}" "${dev_deb}")
sim="$(apt-get install --simulate --no-install-recommends "${debs[@]}" 2>&1)" ||
  fail "apt-get install --simulate: ${sim}"
installs="$(sed -n 's/^Inst \([^ ]*\) .*/\1/p' <<<"${sim}" | sort | paste -sd' ')"
grep -qw "libbraid${abi}" <<<"${installs}" || fail "apt would not install libbraid${abi}: ${sim}"
echo "ok: apt-get install --simulate resolves; it would install: ${installs}"

skip=""
if [[ "${SDK_TEST_APT_INSTALL:-0}" != 1 ]]; then
  skip="SDK_TEST_APT_INSTALL is not 1 (it changes the machine while it runs)"
elif [[ $(id -u) -ne 0 ]]; then
  skip="not root"
elif dpkg-query -W -f='${Status}' "libbraid${abi}" libbraid-dev 2> /dev/null | grep -q installed
then
  skip="libbraid${abi} or libbraid-dev is already installed"
elif [[ "${installs}" != "libbraid-dev libbraid${abi}" ]]; then
  skip="apt would also install ${installs} (purging would not restore the machine)"
fi
if [[ -n "${skip}" ]]; then
  echo "SKIPPED: the real apt-get install: ${skip}"
else
  # However the steps below end, the packages go again (a no-op after the purge below).
  trap 'set +e; apt-get purge -y -q libbraid-dev "libbraid${abi}" > /dev/null 2>&1
        rm -rf "${scratch}"' EXIT
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${debs[@]}" \
    > "${scratch}/apt.log" 2>&1 || fail "apt-get install: $(cat "${scratch}/apt.log")"
  build_with_pkg_config "$(consumer system-pc)" "/usr/lib/${multiarch}"
  build_with_cmake "$(consumer system-cmake)" "/usr/lib/${multiarch}" \
    "/usr/lib/${multiarch}/cmake/Braid"
  apt-get purge -y -q libbraid-dev "libbraid${abi}" > "${scratch}/apt.log" 2>&1 ||
    fail "apt-get purge: $(cat "${scratch}/apt.log")"
  ! dpkg-query -W -f='${Status}\n' "libbraid${abi}" libbraid-dev 2> /dev/null |
    grep -q 'ok installed' || fail "apt-get purge left a package installed"
  echo "ok: apt-get install of both, built with the system's pkg-config and CMake, purged"
fi
echo "PASS"
