#!/usr/bin/env bash
# Tests the Python bindings against an installed flashattn prefix, then runs
# the examples:
#   bash bindings/python/test.sh PREFIX
# Uses Debian's /usr/bin/python3 with python3-numpy and python3-pytest
# (tools/setup.sh), the emulator backend and a scratch kernel cache.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || py=python3

lib="$prefix/lib/libflashattn.so.0"
[ -e "$lib" ] || lib="$prefix/lib64/libflashattn.so.0"
export FLASHATTN_LIBRARY="$lib"
export FLASHATTN_INCLUDE_DIR="$prefix/include"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export FLASHATTN_CACHE_DIR="$scratch/cache"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

cd "$here"
"$py" -m pytest -p no:cacheprovider -q -rs tests
"$py" examples/fixture_forward.py
"$py" examples/paged_decode.py
