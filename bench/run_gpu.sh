#!/usr/bin/env bash
# The one command a GPU session runs, from the repository root:
#     bash bench/run_gpu.sh [--bench all|sdpa|decode] [options of that benchmark]
# Builds nothing. Uses the library at $FLASHATTN_LIBRARY, else
# build-gpu/libflashattn.so.0, else build/libflashattn.so.0; runs the GPU
# tests it finds (ctest -R gpu in build/, else the build's tests/test_gpu
# directly; bindings/python/tests/test_gpu.py with python3), then the
# benchmarks: bench/bench_sdpa.py (forward) and bench/bench_decode.py
# (decode, paged KV cache). --bench all (the default) runs both with shorter
# time budgets (150 s and 120 s) so one device call stays under 10 minutes;
# the other options then go to bench_sdpa.py and $FA_DECODE_ARGS to
# bench_decode.py. --bench sdpa or decode runs one, with its own default
# budget and the other options (e.g. --bench sdpa --fp8: the fp8 forward,
# bench_fp8.py). Everything goes to bench/results/; when $OUT is set (the
# device tool), the result files of the options given are copied there too.
#
# The whole build/ is too big to carry (>64 MiB); on the development machine
#     bash bench/run_gpu.sh --pack [BUILD_DIR]      # default build
# copies what this script needs (library, PTX compiler plugin, test_gpu, test_cuda_backend, bench_generate and the
# non-system shared libraries they load, e.g. libsqlite3/libcmocka) into
# build-gpu/ (ignored by git), to carry as the single path "build-gpu".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

if [ "${1:-}" = "--pack" ]; then
  src=${2:-build}
  dst=build-gpu
  [ -e "$src/libflashattn.so.0" ] || { echo "run_gpu.sh: no $src/libflashattn.so.0" >&2; exit 2; }
  rm -rf "$dst" && mkdir -p "$dst/tests" "$dst/bench" "$dst/runtime-libs"
  cp -L "$src/libflashattn.so.0" "$dst/"
  # The PTX compiler plugin, next to the library where it looks first.
  [ -e "$src/libflashattn_ptxc.so" ] && cp -L "$src/libflashattn_ptxc.so" "$dst/"
  [ -x "$src/tests/test_gpu" ] && cp "$src/tests/test_gpu" "$dst/tests/"
  [ -x "$src/tests/test_cuda_backend" ] && cp "$src/tests/test_cuda_backend" "$dst/tests/"
  [ -x "$src/bench/bench_generate" ] && cp "$src/bench/bench_generate" "$dst/bench/"
  # Shared libraries beyond glibc/libstdc++ that the device image may lack.
  for f in "$dst/libflashattn.so.0" "$dst"/tests/* "$dst"/bench/*; do
    [ -e "$f" ] || continue
    ldd "$f" | awk '/=> \//{print $3}' | grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' || true
  done | sort -u | while read -r lib; do cp -L "$lib" "$dst/runtime-libs/"; done
  # The commit packed, for the results (the device's copy of .git can lag).
  echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (+ uncommitted changes)')" >"$dst/COMMIT"
  # Debug info is most of a RelWithDebInfo build; the carry limit is 64 MiB.
  strip --strip-debug "$dst"/libflashattn*.so* "$dst"/tests/* "$dst"/bench/* 2>/dev/null || true
  du -sh "$dst"; find "$dst" -type f | sort
  echo "carry [\"$dst\"] and run: bash bench/run_gpu.sh"
  exit 0
fi

which=all
if [ "${1:-}" = "--bench" ]; then
  which=${2:-}
  shift
  [ $# -gt 0 ] && shift
fi
case $which in
  all | sdpa | decode) ;;
  *) echo "run_gpu.sh: --bench all, sdpa or decode (got '$which')" >&2; exit 2 ;;
esac
sdpa_args=() decode_args=()
if [ "$which" = all ]; then
  sdpa_args=(--time-budget 150) decode_args=(--time-budget 120)
  read -r -a extra_decode <<<"${FA_DECODE_ARGS:-}"
  decode_args+=(${extra_decode[@]+"${extra_decode[@]}"})
  sdpa_args+=("$@")
elif [ "$which" = sdpa ]; then
  sdpa_args=("$@")
else
  decode_args=("$@")
fi

build=${FA_BUILD_DIR:-}
if [ -z "$build" ]; then
  if [ -e build-gpu/libflashattn.so.0 ]; then build=build-gpu; else build=build; fi
fi
lib=${FLASHATTN_LIBRARY:-$root/$build/libflashattn.so.0}
if [ ! -e "$lib" ]; then
  echo "run_gpu.sh: no flashattn library at $lib (set FLASHATTN_LIBRARY, or carry build-gpu/ made by --pack, or build/)" >&2
  exit 2
fi
export FLASHATTN_LIBRARY=$(readlink -f "$lib")
[ -e "$build/COMMIT" ] && export FLASHATTN_BUILD_COMMIT="$(cat "$build/COMMIT") (packed build)"
[ -d "$build/runtime-libs" ] && export LD_LIBRARY_PATH="$root/$build/runtime-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}
if missing=$(ldd "$FLASHATTN_LIBRARY" | grep "not found"); then
  echo "run_gpu.sh: $FLASHATTN_LIBRARY cannot load: $missing (pack with --pack to carry them)" >&2
  exit 2
fi

results=bench/results
mkdir -p "$results"
# The result files' names depend on the mode options (--fp8, --mla, --append,
# --dtype fp16): ask each script with the options its run gets.
base=$("$py" bench/bench_sdpa.py ${sdpa_args[@]+"${sdpa_args[@]}"} --print-base-name) ||
  base="$(date -u +%F)-unknown-gpu-sdpa"
dbase=$("$py" bench/bench_decode.py ${decode_args[@]+"${decode_args[@]}"} --print-base-name) ||
  dbase="$(date -u +%F)-unknown-gpu-decode"
if [ "$which" = decode ]; then
  tests_log="$results/$dbase-gputests.log"
else
  tests_log="$results/$base-gputests.log"
fi
bench_log="$results/$base-bench.log"
decode_log="$results/$dbase-bench.log"
summary=$(mktemp)
t0=$(date +%s)
echo "== run_gpu.sh: library $FLASHATTN_LIBRARY, benchmarks: $which, results in $results/"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>/dev/null || true

# ---- GPU tests -------------------------------------------------------------------------
tests_rc=0
: >"$tests_log"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch" "$summary"' EXIT
if [ -f "$build/CTestTestfile.cmake" ] && command -v ctest >/dev/null; then
  # The build records absolute source/build paths; if they name another
  # checkout that does not exist here, point them at this one.
  srcdir=$(sed -n 's/^# Source directory: //p' "$build/CTestTestfile.cmake")
  if [ -n "$srcdir" ] && [ ! -e "$srcdir" ] && mkdir -p "$(dirname "$srcdir")" 2>/dev/null; then
    ln -s "$root" "$srcdir" && echo "linked $srcdir -> $root" | tee -a "$tests_log"
  fi
  echo "== ctest -R gpu ($build)" | tee -a "$tests_log"
  (cd "$build" && timeout 300 ctest -R gpu --output-on-failure) >>"$tests_log" 2>&1
  rc=$?; tests_rc=$((tests_rc | rc))
  echo "ctest -R gpu: exit $rc" >>"$summary"
elif [ -x "$build/tests/test_gpu" ]; then
  # test_gpu reads fixtures from the absolute path it was built with.
  data=$(grep -aoE '/[[:alnum:]_./-]+/tests/data' "$build/tests/test_gpu" | head -1 || true)
  if [ -n "$data" ] && [ ! -e "$data" ]; then
    srcdir=${data%/tests/data}
    mkdir -p "$(dirname "$srcdir")" 2>/dev/null && ln -s "$root" "$srcdir" && echo "linked $srcdir -> $root" | tee -a "$tests_log"
  fi
  echo "== $build/tests/test_gpu" | tee -a "$tests_log"
  FLASHATTN_CACHE_DIR="$scratch/test_gpu" CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$build/tests/test_gpu" >>"$tests_log" 2>&1
  rc=$?; tests_rc=$((tests_rc | rc))
  echo "test_gpu: exit $rc" >>"$summary"
else
  echo "no ctest build and no $build/tests/test_gpu: C GPU tests not run" | tee -a "$summary"
fi
grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\]|tests passed|tests failed' "$tests_log" | head -40 >>"$summary"
echo "== pytest bindings/python/tests/test_gpu.py" | tee -a "$tests_log"
FLASHATTN_CACHE_DIR="$scratch/pytest" PYTHONPATH="$root/bindings/python" \
  timeout 300 "$py" -m pytest -p no:cacheprovider -q -rs bindings/python/tests/test_gpu.py >>"$tests_log" 2>&1
rc=$?; tests_rc=$((tests_rc | rc))
echo "pytest bindings/python/tests/test_gpu.py: exit $rc ($(tail -1 "$tests_log"))" >>"$summary"
cat "$summary"
echo "== GPU tests took $(( $(date +%s) - t0 )) s"

# ---- benchmarks --------------------------------------------------------------------------
bench_rc=0 decode_rc=0
if [ "$which" != decode ]; then
  "$py" bench/bench_sdpa.py --out-dir "$results" --tests-summary "$summary" ${sdpa_args[@]+"${sdpa_args[@]}"} 2>&1 | tee "$bench_log"
  bench_rc=${PIPESTATUS[0]}
fi
if [ "$which" != sdpa ]; then
  "$py" bench/bench_decode.py --out-dir "$results" --tests-summary "$summary" ${decode_args[@]+"${decode_args[@]}"} 2>&1 | tee "$decode_log"
  decode_rc=${PIPESTATUS[0]}
fi
echo "== run_gpu.sh: tests exit $tests_rc, bench_sdpa exit $bench_rc, bench_decode exit $decode_rc (3 = a config out of tolerance), $(( $(date +%s) - t0 )) s"

if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  for f in "$results/$base".{csv,json,png,md} "$results/$dbase".{csv,json,md} "$tests_log" \
           "$bench_log" "$decode_log"; do
    [ -e "$f" ] && cp "$f" "$OUT/"
  done
fi
[ "$bench_rc" -ne 0 ] && exit "$bench_rc"
[ "$decode_rc" -ne 0 ] && exit "$decode_rc"
[ "$tests_rc" -ne 0 ] && exit 1
exit 0
