#!/usr/bin/env bash
# Tests the self-contained wheel:
#   bash bindings/python/test_wheel.sh [WHEEL]
# Without WHEEL it is built first (tools/build_wheel.sh: PyPI for the build
# backend). Then, offline (pip --no-index, only local files):
#   1. a fresh virtual environment with nothing but the wheel: the install is
#      timed, `import flashattn` must load the bundled library and import
#      neither NumPy nor torch, `import flashattn.torch` must fail naming
#      torch, and the MiniLM fixture example runs on the emulator with the
#      standard library alone (examples/fixture_forward_stdlib.py);
#   2. a virtual environment with NumPy alone (a NumPy wheel fetched into
#      build/wheel/wheelhouse beforehand, once) and the wheel: the NumPy
#      examples (fixture_forward.py, paged_decode.py);
#   3. `pip install flashattn[cubin]` from the wheels' folder, when
#      tools/build_wheel.sh built flashattn-ptxc beside it: the plugin is
#      found through its package and named to the library.
# The examples are copied out of the checkout so that nothing but the
# installed package can be imported. FLASHATTN_LIBRARY, PYTHONPATH and
# LD_LIBRARY_PATH are cleared.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset FLASHATTN_LIBRARY PYTHONPATH LD_LIBRARY_PATH PIP_FIND_LINKS

# Where CMake's find_path looks for cuda.h. Without it the wheel is built
# emulator-only, and the check that the cuda backend is compiled in is skipped.
with_cuda=0
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr /usr/local; do
  if [ -n "$d" ] && [ -f "$d/include/cuda.h" ]; then with_cuda=1; break; fi
done
if [ $# -ge 1 ]; then
  wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
else
  if [ "$with_cuda" = 0 ]; then
    echo "note: no cuda.h on this machine: building an emulator-only wheel"
    export FLASHATTN_WHEEL_ALLOW_NO_CUDA=1
  fi
  wheel=$(bash "$root/tools/build_wheel.sh" | tail -n 1)
fi
export FA_WHEEL_WITH_CUDA=$with_cuda
echo "wheel: $(basename "$wheel") ($(stat -c %s "$wheel") bytes)"

# NumPy for environment 2, fetched while online (kept for later runs).
house="$root/build/wheel/wheelhouse"
if ! compgen -G "$house/numpy-*.whl" >/dev/null; then
  mkdir -p "$house"
  "$py" -m pip download -q --only-binary=:all: --no-deps -d "$house" numpy
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export FLASHATTN_CACHE_DIR="$scratch/cache"
export PYTHONDONTWRITEBYTECODE=1
cp "$here"/examples/*.py "$scratch/"
data="$root/tests/data/minilm_l6"
cd "$scratch"

# 1. Nothing but the wheel.
"$py" -m venv "$scratch/bare"
t0=$(date +%s%N)
"$scratch/bare/bin/python" -m pip install -q --no-index "$wheel"
t1=$(date +%s%N)
echo "install into a fresh venv (pip --no-index): $(((t1 - t0) / 1000000)) ms"
"$scratch/bare/bin/python" - <<'EOF'
import os
import sys

import flashattn as fa
from flashattn import _lib

lib = fa.library_path()
assert lib == _lib.bundled_library(), (lib, _lib.bundled_library())
assert lib.startswith(sys.prefix + os.sep), (lib, sys.prefix)
print(f"bundled library: {os.path.basename(lib)} ({os.path.getsize(lib)} bytes unpacked)")
assert "numpy" not in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
try:
    import flashattn.torch  # noqa: F401
except ImportError as e:
    assert "torch" in str(e), e
else:
    raise AssertionError("flashattn.torch imported without PyTorch")
with fa.Runtime(backend="emulator") as rt:
    info = rt.info
try:  # the cuda backend is compiled in: libcuda.so.1 is looked for at run time
    fa.Runtime(backend="cuda").close()
except fa.Error as e:
    if os.environ["FA_WHEEL_WITH_CUDA"] == "1":
        assert "built without cuda.h" not in e.message, e.message
print("bare venv: flashattn %s, library %s (bundled), %s sm_%d"
      % (fa.version(), os.path.relpath(lib, sys.prefix), info.backend, info.sm))
EOF
"$scratch/bare/bin/python" fixture_forward_stdlib.py "$data"

# 2. NumPy and the wheel.
"$py" -m venv "$scratch/np"
"$scratch/np/bin/python" -m pip install -q --no-index --find-links "$house" numpy "$wheel"
"$scratch/np/bin/python" -c '
import sys, flashattn, numpy
assert "torch" not in sys.modules
extra = sorted(d.metadata["Name"] for d in __import__("importlib.metadata").metadata.distributions()
               if d.metadata["Name"] not in ("pip", "setuptools"))
print("numpy venv: %s" % ", ".join(extra))
assert extra == ["flashattn", "numpy"], extra'
"$scratch/np/bin/python" fixture_forward.py "$data"
"$scratch/np/bin/python" paged_decode.py

# 3. flashattn[cubin]: the extra resolves offline to the flashattn-ptxc wheel
# built beside the main one, and `import flashattn` names its plugin to the
# library (an emulator runtime's compiler_note says cuda runtimes would use
# it; FLASHATTN_PTX_COMPILER=off still wins).
ptxc=$(ls "$(dirname "$wheel")"/flashattn_ptxc-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$ptxc" ]; then
  "$py" -m venv "$scratch/cubin"
  "$scratch/cubin/bin/python" -m pip install -q --no-index --find-links "$(dirname "$wheel")" \
    "flashattn[cubin]"
  "$scratch/cubin/bin/python" - <<'EOF'
import os
import sys

import flashattn as fa
import flashattn_ptxc

plugin = flashattn_ptxc.plugin_path()
assert plugin and plugin.startswith(sys.prefix + os.sep), plugin
with fa.Runtime(backend="emulator") as rt:
    note = rt.cache_stats().compiler_note
assert os.environ.get("FLASHATTN_PTX_COMPILER") == plugin, os.environ.get("FLASHATTN_PTX_COMPILER")
assert "use the PTX compiler plugin " + plugin in note, note
print("cubin venv: %s (%d bytes): %s" % (os.path.relpath(plugin, sys.prefix), os.path.getsize(plugin), note))
EOF
  FLASHATTN_PTX_COMPILER=off "$scratch/cubin/bin/python" -c '
import flashattn as fa
with fa.Runtime(backend="emulator") as rt:
    note = rt.cache_stats().compiler_note
assert "turned off by FLASHATTN_PTX_COMPILER=off" in note, note'
else
  echo "no flashattn_ptxc wheel beside $(basename "$wheel"): flashattn[cubin] not tested"
fi
echo "test_wheel.sh: every check passed"
