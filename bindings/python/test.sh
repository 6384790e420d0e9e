#!/usr/bin/env bash
# Tests the Python bindings against an installed flashattn prefix, then runs
# the examples:
#   bash bindings/python/test.sh PREFIX
# Uses Debian's /usr/bin/python3 with python3-numpy and python3-pytest
# (tools/setup.sh), the emulator backend and a scratch kernel cache; then the
# torch and transformers suites with $FA_TORCH_PYTHON, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/flashattn-torch-venv/bin/python
# (tools/setup_torch.sh makes it), else they are reported skipped.
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

# flashattn.torch and the transformers integration need a Python with torch
# and transformers: $FA_TORCH_PYTHON, else the venv tools/setup_torch.sh
# makes; without either they are skipped, and this says so.
torch_py=${FA_TORCH_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/flashattn-torch-venv/bin/python}
if [ -x "$torch_py" ] && "$torch_py" -c "import torch, transformers, numpy, pytest" 2>/dev/null; then
  echo "== flashattn.torch and transformers integration suites with $torch_py"
  start=$SECONDS
  "$torch_py" -m pytest -p no:cacheprovider -q -rs tests/test_torch.py tests/test_torch_backward.py \
    tests/test_transformers.py
  echo "torch/transformers suites: $((SECONDS - start)) s"
else
  echo "skipped: no torch/transformers (tests/test_torch.py with torch, tests/test_transformers.py):" \
       "no usable Python at $torch_py; set FA_TORCH_PYTHON or run tools/setup_torch.sh"
fi
