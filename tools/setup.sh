#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test flashattn.
# Idempotent: packages already present are skipped. Run as root (or with sudo).
set -euo pipefail

apt_pkgs=(cmake g++ pkg-config libsqlite3-dev libxxhash-dev libcmocka-dev libcli11-dev
          python3 python3-venv python3-numpy python3-pytest golang-go
          redis-server libhiredis-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# NVIDIA's PTX compiler library (nvidia-nvptxcompiler on PyPI: the static
# libnvptxcompiler_static.a and nvPTXCompiler.h, redistributable under the
# CUDA EULA's Attachment A), unpacked into .deps/ of this checkout for the
# optional PTX compiler plugin libflashattn_ptxc.so (src/ptxc/README.md).
# No root needed; a failed download only leaves the plugin out (the library
# then leaves PTX to the driver's JIT). FA_NVPTXCOMPILER_WHEEL=/path/to.whl
# uses a wheel already on disk; FA_SKIP_PTXC=1 skips this step.
# 13.0.88: the compiler of CUDA 13.0's ptxas (what test_ptxas checks) and of
# the oldest CUDA 13 driver's JIT. 13.5.37 wrapped parts of the sm_90a consumer
# in two more BSSY/BSYNC regions and ran the d64 forward 1-2.4% slower on an
# H200 (bench/results/2026-11-28-h200-ptx-compiler-ab.md).
ptxc_version=13.0.88
ptxc_sha256_x86_64=7579fc2d9928030ee45626694a9062e02a691594c481bf2bbd46cdd090b33fa3
ptxc_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/nvptxcompiler-$ptxc_version"
if [ "${FA_SKIP_PTXC:-0}" != "1" ] && [ ! -f "$ptxc_dir/lib/libnvptxcompiler_static.a" ]; then
  if [ "$(uname -m)" != "x86_64" ]; then
    echo "setup: the PTX compiler plugin is fetched for x86_64 only; skipped on $(uname -m)" >&2
  elif ! (
    set -e
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    if [ -n "${FA_NVPTXCOMPILER_WHEEL:-}" ]; then
      cp "$FA_NVPTXCOMPILER_WHEEL" "$tmp/"
    else
      python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" \
        --platform manylinux2014_x86_64 "nvidia-nvptxcompiler==$ptxc_version"
    fi
    whl="$(ls "$tmp"/nvidia_nvptxcompiler-"$ptxc_version"-*.whl)"
    echo "$ptxc_sha256_x86_64  $whl" | sha256sum -c --quiet -
    python3 - "$whl" "$tmp/x" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
    mkdir -p "$ptxc_dir.tmp/include" "$ptxc_dir.tmp/lib"
    cp "$tmp"/x/nvidia/cu13/include/nvPTXCompiler.h "$ptxc_dir.tmp/include/"
    cp "$tmp"/x/nvidia/cu13/lib/libnvptxcompiler_static.a "$ptxc_dir.tmp/lib/"
    cp "$tmp"/x/nvidia_nvptxcompiler-"$ptxc_version".dist-info/licenses/License.txt "$ptxc_dir.tmp/"
    echo "$ptxc_version" > "$ptxc_dir.tmp/VERSION"
    rm -rf "$ptxc_dir"
    mv "$ptxc_dir.tmp" "$ptxc_dir"
    # Other versions' directories: CMake takes the one left.
    for d in "${ptxc_dir%-*}"-*; do [ "$d" = "$ptxc_dir" ] || rm -rf "$d"; done
  ); then
    rm -rf "$ptxc_dir.tmp"
    echo "setup: could not fetch nvidia-nvptxcompiler $ptxc_version; building without the PTX compiler plugin" >&2
  fi
fi
