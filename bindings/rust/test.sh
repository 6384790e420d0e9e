#!/usr/bin/env bash
# Builds and tests the Rust bindings against an installed flashattn, on the
# emulator, offline (no crates.io: the crates use std only).
#   bash bindings/rust/test.sh PREFIX
# PREFIX holds include/flashattn.h, lib/libflashattn.so and
# lib/pkgconfig/flashattn.pc. Runs from any directory. Writes only into
# bindings/rust/target/ (git-ignored; $CARGO_TARGET_DIR overrides) and a
# temporary directory (CARGO_HOME, kernel cache, test scratch).
# FA_SKIP_RUST=1 skips everything (for machines without cargo).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
if [ "${FA_SKIP_RUST:-0}" = "1" ]; then
  echo "rust bindings: skipped (FA_SKIP_RUST=1)"
  exit 0
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null 2>&1 && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
  export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "rust bindings: cargo not found (need Rust >= 1.77; set FA_SKIP_RUST=1 to skip)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-rust.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

export CARGO_HOME="$tmp/cargo-home"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
export CARGO_TERM_COLOR=never
export CARGO_NET_OFFLINE=true
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
export FLASHATTN_CACHE_DIR="$tmp/cache"
export FLASHATTN_TEST_TMP="$tmp"
export CC="${CC:-cc}"
unset FLASHATTN_LIB_DIR FLASHATTN_INCLUDE_DIR FLASHATTN_CACHE_DISABLE
# Find the library the way users do: pkg-config (fallback: the prefix directly).
if command -v pkg-config >/dev/null 2>&1; then
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
else
  export FLASHATTN_LIB_DIR="$prefix/lib" FLASHATTN_INCLUDE_DIR="$prefix/include"
fi

cargo_() { cargo "$1" --offline --locked --manifest-path "$here/Cargo.toml" "${@:2}"; }

echo "== rust: $(cargo --version), prefix $prefix"
start=$SECONDS
cargo_ test --workspace

# The FLASHATTN_LIB_DIR route of flashattn-sys's build script (own target dir).
FLASHATTN_LIB_DIR="$prefix/lib" FLASHATTN_INCLUDE_DIR="$prefix/include" PKG_CONFIG_PATH= \
  CARGO_TARGET_DIR="$tmp/target-libdir" cargo_ test -p flashattn-sys

# The shared fixture example: must print PASS.
out=$(cargo_ run -q -p flashattn --example fixture_forward -- "$repo/tests/data/minilm_l6")
echo "$out"
if ! grep -qx PASS <<<"$out"; then
  echo "rust bindings: fixture_forward did not print PASS" >&2
  exit 1
fi
# The paged-decode example: must print PASS.
out=$(cargo_ run -q -p flashattn --example paged_decode)
echo "$out"
if ! grep -qx PASS <<<"$out"; then
  echo "rust bindings: paged_decode did not print PASS" >&2
  exit 1
fi
echo "== rust bindings: OK ($((SECONDS - start)) s)"
