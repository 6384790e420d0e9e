#!/usr/bin/env bash
# Installs the build tree into a scratch prefix and builds the consumer in
# this folder twice: with `pkg-config --cflags --libs flashattn` and with
# CMake's find_package(flashattn). Both must run. Also checks that the
# program and the header were installed and that only fa_* symbols are exported.
# Usage: install_check.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(ls -d "$prefix"/lib*/ | head -1)
for f in include/flashattn.h bin/flashattn; do
  [ -e "$prefix/$f" ] || { echo "missing $f"; exit 1; }
done
for f in libflashattn.so libflashattn.a pkgconfig/flashattn.pc cmake/flashattn/flashattnConfig.cmake; do
  [ -e "$libdir/$f" ] || { echo "missing lib/$f"; exit 1; }
done
"$prefix/bin/flashattn" --version

leaked=$(nm -D --defined-only "$libdir/libflashattn.so" | awk '{print $3}' | grep -v '^fa_' || true)
if [ -n "$leaked" ]; then echo "exported non-fa_ symbols:"; echo "$leaked" | head; exit 1; fi
echo "exports: $(nm -D --defined-only "$libdir/libflashattn.so" | grep -c ' fa_') fa_* symbols, nothing else"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -Wall -Wextra -Werror "$here/consumer.c" $(pkg-config --cflags --libs flashattn) \
   -Wl,-rpath,"$libdir" -o "$work/consumer_pc"
"$work/consumer_pc"

cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer"
echo "1 passed, 0 failed"
