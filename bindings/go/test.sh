#!/usr/bin/env bash
# Tests the Go binding against an installed flashattn:
#   bash bindings/go/test.sh PREFIX
# PREFIX holds include/flashattn.h, lib/libflashattn.so and
# lib/pkgconfig/flashattn.pc. Runs offline (standard library only) on the
# emulator backend; the Go build cache, GOPATH and kernel cache live in a
# temporary directory. Exits non-zero on any failure. FA_GO_FIXTURE overrides
# the fixture directory (default: tests/data/minilm_l6 of this repository).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
libdir="$prefix/lib"
[ -f "$libdir/pkgconfig/flashattn.pc" ] || libdir="$prefix/lib64"

if ! command -v go >/dev/null; then
  echo "go not found: install golang-go (tools/setup.sh)" >&2
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-go.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CGO_ENABLED=1
export CGO_LDFLAGS="-Wl,-rpath,$libdir${CGO_LDFLAGS:+ $CGO_LDFLAGS}"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GOCACHE="$tmp/gocache" GOPATH="$tmp/gopath" GOMODCACHE="$tmp/gopath/pkg/mod"
export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GO111MODULE=on
export FLASHATTN_BACKEND=emulator
export FLASHATTN_CACHE_DIR="$tmp/kernel-cache"

cd "$here"
echo "-- go $(go env GOVERSION), flashattn $(pkg-config --modversion flashattn) from $prefix"
go vet ./...
# The race detector also checks the concurrency test (linux amd64/arm64).
race=""
case "$(go env GOOS)/$(go env GOARCH)" in linux/amd64 | linux/arm64) race="-race" ;; esac
go test -v $race -count=1 -timeout 150s ./...

echo "-- examples/fixture_forward"
go build -o "$tmp/fixture_forward" ./examples/fixture_forward
rc=0
out=$("$tmp/fixture_forward" "${FA_GO_FIXTURE:-$repo/tests/data/minilm_l6}") || rc=$?
echo "$out"
if [ "$rc" -ne 0 ] || ! grep -qx "PASS" <<<"$out"; then
  echo "fixture_forward did not print PASS" >&2
  exit 1
fi
echo "-- examples/paged_decode"
go build -o "$tmp/paged_decode" ./examples/paged_decode
rc=0
out=$("$tmp/paged_decode") || rc=$?
echo "$out"
if [ "$rc" -ne 0 ] || ! grep -qx "PASS" <<<"$out"; then
  echo "paged_decode did not print PASS" >&2
  exit 1
fi
echo "-- go bindings: OK"
