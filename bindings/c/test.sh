#!/usr/bin/env bash
# Builds and runs the C consumer examples against an installed prefix:
#   bash bindings/c/test.sh PREFIX
# pkgconfig_example links with only `pkg-config --cflags --libs flashattn`;
# dlopen_example is compiled with the header alone and dlopens the library;
# paged_decode_example is docs/api.md's paged fa_decode call, checked in fp64.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fixture="$here/../../tests/data/minilm_l6"
libdir="$prefix/lib"
[ -e "$libdir/libflashattn.so.0" ] || libdir="$prefix/lib64"
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FLASHATTN_CACHE_DIR="$work/cache"
cflags=(-std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -O2)
pass=0 fail=0

run() { # name, command...
  local name=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    echo "FAILED: $name" >&2
    fail=$((fail + 1))
  fi
}

# 1. pkg-config: compile and link with exactly what flashattn.pc says.
pc_flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs flashattn)
echo "pkg-config --cflags --libs flashattn: $pc_flags"
# shellcheck disable=SC2086
run "build pkgconfig_example" "$cc" "${cflags[@]}" -I"$here" "$here/pkgconfig_example.c" \
  $pc_flags -o "$work/pkgconfig_example"
run "pkgconfig_example" env LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$work/pkgconfig_example" "$fixture"

# The paged decode of docs/api.md, linked the same way.
# shellcheck disable=SC2086
run "build paged_decode_example" "$cc" "${cflags[@]}" -I"$here" "$here/paged_decode_example.c" \
  $pc_flags -lm -o "$work/paged_decode_example"
run "paged_decode_example" env LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$work/paged_decode_example"

# 2. dlopen: the header only, no -lflashattn; the binary must not need it.
run "build dlopen_example" "$cc" "${cflags[@]}" -I"$prefix/include" -I"$here" \
  "$here/dlopen_example.c" -ldl -o "$work/dlopen_example"
no_link() { ! readelf -d "$work/dlopen_example" | grep -q 'NEEDED.*flashattn'; }
run "dlopen_example does not link flashattn" no_link
run "dlopen_example (argument)" env -u FLASHATTN_LIBRARY "$work/dlopen_example" "$fixture" \
  "$libdir/libflashattn.so.0"
run "dlopen_example (FLASHATTN_LIBRARY)" env FLASHATTN_LIBRARY="$libdir/libflashattn.so.0" \
  "$work/dlopen_example" "$fixture"

echo "== bindings/c: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
