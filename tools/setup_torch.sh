#!/usr/bin/env bash
# Makes the Python environment in which bindings/python/test.sh runs the
# flashattn.torch suite (tests/test_torch.py) and the transformers
# integration suite (tests/test_transformers.py): a venv with torch,
# transformers, numpy and pytest from PyPI (PyPI's torch wheel brings its
# CUDA libraries, about 5 GB installed; the suites run on the emulator and
# need no GPU; a few minutes).
#   tools/setup_torch.sh            # -> ${XDG_CACHE_HOME:-$HOME/.cache}/flashattn-torch-venv
#   FA_TORCH_VENV=DIR tools/setup_torch.sh   # elsewhere (then FA_TORCH_PYTHON=DIR/bin/python)
# Needs python3 with the venv module (Debian: python3-venv) and network access.
set -euo pipefail
venv=${FA_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/flashattn-torch-venv}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade pip
"$venv/bin/python" -m pip install "torch>=2.4" "transformers>=5" numpy pytest
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "ready: bindings/python/test.sh PREFIX runs the torch suites with $venv/bin/python"
