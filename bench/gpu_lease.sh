#!/usr/bin/env bash
# Everything a short GPU lease (15 minutes of device time, all calls
# together) should run, in one call, each stage under its own time limit so
# that a hang or a slow stage cannot eat the lease:
#
#     bash bench/run_gpu.sh --pack          # here: build-gpu/ to carry
#     bash bench/gpu_lease.sh [--only STAGES] [--scale S]   # there (carry build-gpu)
#
# Stages, in order (--only a,b,... runs a subset; --scale multiplies every
# time limit and benchmark budget):
#   backend   test_cuda_backend (the driver layer: JIT, loads, launches)
#   tests     test_gpu (numerics + every feature on the cuda backend), the
#             sm_90 forward as shipped
#   tests80   test_gpu again with FLASHATTN_FORCE_SM80_FORWARD=1 (the
#             mma.sync forward on the same GPU)
#   testsjit  test_gpu again with the PTX compiler plugin off (the driver
#             JIT-compiles every kernel's PTX)
#   tests100off  Blackwell (compute capability 10.x) only: test_gpu with
#             FLASHATTN_SM100_FORWARD=0 FLASHATTN_SM100_MLA=0 (the mma.sync
#             forward and MLA decode; the tests stage ran the sm_100a tcgen05
#             kernels, the default there)
#   mla100off  Blackwell only: the mla stage's points with FLASHATTN_SM100_MLA=0
#             (the mma.sync MLA decode; files suffixed -sm100-mla-off): with
#             mla, the pair says what the tcgen05 MLA decode buys
#   sdpa100off  Blackwell only: bench_sdpa.py with FLASHATTN_SM100_FORWARD=0,
#             bf16, head_dim 64/128/256, seqlen 1k..16k (files suffixed
#             -sm100-forward-off): with the sdpa stage's same points, the
#             pair says what the tcgen05 forward buys
#   sdpa100nopair  Blackwell only: bench_sdpa.py with FLASHATTN_SM100_CTA_PAIR=0,
#             bf16, head_dim 128, seqlen 4k..16k (files suffixed
#             -sm100-cta-pair-off): with the sdpa stage's same points, what the
#             CTA pairs (tcgen05.mma.cta_group::2) buy on the non-causal rows
#   testspersist  test_gpu with the persistent sm_90a forward (FLASHATTN_SM90_PERSISTENT=1)
#   testspdl  test_gpu with programmatic dependent launches (FLASHATTN_PDL=1:
#             the decode and combine kernels launched with cuLaunchKernelEx)
#   pytest    bindings/python/tests/test_gpu.py
#   sdpa      bench_sdpa.py, bf16, head_dim 64/128/256, seqlen 512..16k (the
#             script's whole seqlen grid: 36 configs, ~30 s on an H200)
#   bwd       bench_sdpa.py --backward --deterministic: the training backward
#             (fa_backward, default and deterministic) vs SDPA's flash and
#             cuDNN backwards, only the backward timed; bf16, head_dim 128
#             then 64, causal/not, seqlen 4k/8k/16k then 1k/2k (issue 30's
#             points first, should the budget run out; ~60 s expected);
#             on sm_90 this is the sm_90a backward (backward_wgmma.cc)
#   bwd90off  sm_90 only: the bwd stage's head_dim 128 points with
#             FLASHATTN_SM90_BACKWARD=0 (the mma.sync backward; files suffixed
#             -sm90-backward-off): with bwd, what the wgmma backward buys
#   sdpa80    bench_sdpa.py, head_dim 128, the mma.sync forward (as tests80)
#   sdpajit   bench_sdpa.py, head_dim 64/128, seqlen 1k/4k, with the PTX
#             compiler plugin off (FLASHATTN_PTX_COMPILER=off: the driver's
#             JIT instead of the plugin's cubins, the same PTX)
#   persist   bench_sdpa.py with FLASHATTN_SM90_PERSISTENT=1 (the persistent
#             sm_90a forward, off by default until measured) with its dynamic
#             scheduler: fa.forward (library 0.8) gives it the workspace the
#             Python binding owns (one zeroed 8-byte counter per stream, reused
#             by every timed call: the kernel leaves it zero), so the work
#             items are handed out by the atomic counter, not the static
#             order; head_dim 64/128, seqlen 512/1k/2k/16k, each point vs
#             cuDNN in one command; set against the sdpa stage's same points
#   persist80 bench_sdpa.py with FLASHATTN_FORCE_SM80_FORWARD=1 and
#             FLASHATTN_SM80_PERSISTENT=1: the persistent mma.sync forward (off by
#             default: persistence has been reported to cost 14-33% on
#             cp.async/mma.sync kernels), dynamic like persist (the binding's
#             workspace); head_dim 64/128, seqlen 512/1k/4k/16k
#   persist80off  the same points with FLASHATTN_FORCE_SM80_FORWARD=1 alone (the
#             one-CTA-per-item mma.sync forward): the pair says what
#             persistence buys there
#   sdpabase  bench_sdpa.py, head_dim 64/128, seqlen 1k/4k, with the library
#             in build-gpu/baseline/ (a before/after pair on one machine;
#             that version's bindings/python/flashattn in build-gpu/baseline/python/)
#   ab        bench_compiler_ab.py: the plugin's cubins against the driver's
#             JIT of the same PTX, one process, bf16 d64/128 s1k/4k
#   fp8fwd    bench_sdpa.py --fp8 (bench_fp8.py): the fp8 forward (e4m3 Q/K/V,
#             per-(batch, KV head) descales, bf16 O) against its f16 form
#             (FLASHATTN_SM90_FP8_F16=1, sm_90), flashattn bf16,
#             FlashAttention-3 fp8 (when importable) and SDPA flash on the
#             dequantised values; head_dim 128 then 64, causal/not, seqlen 1k..8k
#   coldstart bench_sdpa.py's cold-start figures (generation, JIT, caches), d128
#   decode    bench_decode.py, batch 1/64/256 x context 4k/32k, pages of 16,
#             bf16 and fp8 (e4m3) KV
#   decode16  the same with fp16 Q/O (fp8 KV converts straight to fp16 there)
#   decodebase  decode with the library in build-gpu/baseline/
#   append    bench_decode.py --append, batch 64/256 x context 4k
#   mla       bench_decode.py --mla: DeepSeek MLA decode (head_dim 576 / 512,
#             one KV head, V in K), heads 16/128 x batch 1/64/128 x context
#             4k/32k, pages of 64: flashattn V-in-K and separate V, SDPA,
#             FlashMLA when importable
#   mla90     mla with FLASHATTN_SM90_MLA=1 (the sm_90a wgmma MLA decode; files
#             suffixed -sm90-mla): with mla, the pair says what it buys
#   testsmla  test_gpu with FLASHATTN_SM90_MLA=1 (its MLA decode cases with V in
#             K on the wgmma kernel)
#   varlen    bench_varlen.py --quick: a ragged batch (lognormal lengths, median
#             600, 16k tokens), bf16, head_dim 64/128, causal/not: flashattn
#             varlen vs SDPA cuDNN on the padded batch and compiled
#             FlexAttention with a document mask (~60-90 s, most of it
#             FlexAttention's four compiles)
#   chunked   bench_varlen.py --chunked --quick: chunked prefill, 4 x 2048 new
#             tokens over 4k..32k cached keys in pages of 16, bf16 d128 GQA
#             32/8: flashattn paged and contiguous vs SDPA flash (lower-right
#             causal) and cuDNN (dense mask) (~20-30 s)
#   split     the same with 1 x 128 new tokens (32 CTAs: the split-KV forward,
#             the Python binding's workspace holding the partial states)
#   splitoff  split with FLASHATTN_FORWARD_SPLITS=0 (unsplit; files suffixed
#             -forward-splits-off): the pair says what splitting buys
#   pack      the same with 16 x 4 new tokens (4 x GQA group 4 = 16 rows: fa_launch
#             runs the GQA-packing decode kernel)
#   packoff   pack with FLASHATTN_FORWARD_GQA_PACK=0 (files suffixed -gqa-pack-off)
#   pdl       bench_decode.py, batch 1/8 x context 4k/32k, pages of 16, bf16,
#             with FLASHATTN_PDL=1 (files suffixed -pdl)
#   pdloff    the same points without it, right after (the pair says what
#             the programmatic launches buy)
#   fused     bench_decode.py, batch 1/8 x context 4k/32k, pages of 16, bf16,
#             with --fused (fa_decode's split_counters: the combine in the
#             decode kernel's last CTA of each row, one launch; files
#             suffixed -fused)
#   fusedoff  the same calls with FLASHATTN_DECODE_FUSED=0 (two launches,
#             files suffixed -fused-off), right after: the pair says what
#             fusing the combine buys
# Logs and the benchmarks' CSV/JSON/markdown go to bench/results/ and, when
# $OUT is set (the device tool), into $OUT/lease.tgz with a summary in
# $OUT/summary.txt. Prints the summary last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD
only="backend,tests,tests80,testsjit,tests100off,sdpa100off,sdpa100nopair,mla100off,testspersist,pytest,sdpa,bwd,sdpa80,sdpajit,persist,persist80,persist80off,bwd90off,sdpabase,ab,fp8fwd,coldstart,decode,decode16,decodebase,append,mla,mla90,testsmla,varlen,chunked,split,splitoff,pack,packoff,testspdl,pdl,pdloff,fused,fusedoff"
scale=1
while [ $# -gt 0 ]; do
  case $1 in
    --only) only=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    *) echo "gpu_lease.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
build=${FA_BUILD_DIR:-build-gpu}
[ -e "$build/libflashattn.so.0" ] || { echo "gpu_lease.sh: no $build/libflashattn.so.0 (carry build-gpu)" >&2; exit 2; }
export FLASHATTN_LIBRARY=$root/$build/libflashattn.so.0
# The PTX compiler plugin when packed: named explicitly, since test_gpu and
# test_cuda_backend link the static library and look next to themselves.
[ -e "$build/libflashattn_ptxc.so" ] && export FLASHATTN_PTX_COMPILER=$root/$build/libflashattn_ptxc.so
[ -d "$build/runtime-libs" ] && export LD_LIBRARY_PATH="$root/$build/runtime-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 CMOCKA_MESSAGE_OUTPUT=stdout
# The commit the build was packed from (the device's copy of .git can lag).
[ -e "$build/COMMIT" ] && export FLASHATTN_BUILD_COMMIT="$(cat "$build/COMMIT") (packed build)"
commit=${FLASHATTN_BUILD_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo '?')}
py=${PYTHON:-python3}
res=bench/results
logs=$(mktemp -d)
summary=$logs/summary.txt
mkdir -p "$res"
touch "$logs/start"
t_all=$(date +%s)

# test_gpu reads its fixtures from the absolute path it was built with.
if [ -x "$build/tests/test_gpu" ]; then
  data=$(grep -aoE '/[[:alnum:]_./-]+/tests/data' "$build/tests/test_gpu" | head -1 || true)
  if [ -n "$data" ] && [ ! -e "$data" ]; then
    mkdir -p "$(dirname "${data%/tests/data}")" && ln -s "$root" "${data%/tests/data}"
  fi
fi

{
  echo "commit $commit"
  date -u '+%F %T UTC'
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.total --format=csv 2>&1 | head -3
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
} | tee "$summary"

# stage NAME SECONDS COMMAND...: runs it under timeout, log in $logs/NAME.log.
stage() {
  local name=$1 limit=$2
  shift 2
  case ",$only," in *",$name,"*) ;; *) return 0 ;; esac
  limit=$(awk -v a="$limit" -v s="$scale" 'BEGIN { printf "%d", a * s }')
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  local line="$name: exit $rc in $(( $(date +%s) - t0 ))s"
  [ $rc -eq 124 ] && line="$line (TIMED OUT)"
  echo "$line" | tee -a "$summary"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  (FAILED|ERROR)  +\] test_|^(FAILED|ERROR) |[0-9]+ (passed|failed)|Out of tolerance|wrote ' \
    "$logs/$name.log" | sort -u | head -12 | sed 's/^/    /' | tee -a "$summary"
  [ $rc -ne 0 ] && tail -n 4 "$logs/$name.log" | cut -c1-300 | sed 's/^/    | /' | tee -a "$summary"
  snapshot
}
# What came so far into $OUT after every stage: a call cut off at its limit
# still returns the stages that finished.
snapshot() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  cp "$summary" "$OUT/summary.txt"
  tar -C / -czf "$OUT/lease.tgz" "${root#/}/$res" "${logs#/}" --exclude=cache 2>/dev/null
}
# The baseline's own Python binding when packed with it (its structs).
basepy=""
[ -d "$build/baseline/python" ] && basepy=$root/$build/baseline/python
budget() { awk -v a="$1" -v s="$scale" 'BEGIN { printf "%d", a * s }'; }

export FLASHATTN_CACHE_DIR=$logs/cache
# test_cuda_backend's mock and fake drivers are built under the build
# directory it was configured in.
bdir=$(grep -aoE '/[[:alnum:]_./-]+/build/tests' "$build/tests/test_cuda_backend" 2>/dev/null | head -1)
[ -n "$bdir" ] && mkdir -p "$bdir" 2>/dev/null
# Its GPU probes test the driver's JIT (the plugin unset) and, through
# FA_TEST_PTXC_PLUGIN, the plugin's cubins on this driver.
[ -x "$build/tests/test_cuda_backend" ] && stage backend 60 env -u FLASHATTN_PTX_COMPILER \
  FA_TEST_PTXC_PLUGIN="${FLASHATTN_PTX_COMPILER:-}" "$build/tests/test_cuda_backend"
stage tests 150 "$build/tests/test_gpu"
FLASHATTN_FORCE_SM80_FORWARD=1 stage tests80 100 "$build/tests/test_gpu"
FLASHATTN_PTX_COMPILER=off stage testsjit 150 "$build/tests/test_gpu"
# Blackwell only (compute capability 10.x: B200, GB200, B300): the
# mma.sync forward beside the default sm_100a one (tests, sdpa).
case $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) in
  10.*)
    FLASHATTN_SM100_FORWARD=0 FLASHATTN_SM100_MLA=0 stage tests100off 150 "$build/tests/test_gpu"
    FLASHATTN_SM100_FORWARD=0 stage sdpa100off 130 "$py" bench/bench_sdpa.py \
      --out-dir "$logs/sm100off" --dtypes bf16 --head-dims 64,128,256 \
      --seqlens 1024,4096,8192,16384 --no-coldstart --time-budget "$(budget 110)"
    FLASHATTN_SM100_CTA_PAIR=0 stage sdpa100nopair 80 "$py" bench/bench_sdpa.py \
      --out-dir "$logs/nopair" --dtypes bf16 --head-dims 128 --seqlens 4096,8192,16384 \
      --no-coldstart --time-budget "$(budget 70)"
    stage mla100off 120 env FLASHATTN_SM100_MLA=0 "$py" bench/bench_decode.py \
      --out-dir "$logs/mla100off" --mla --batches 1,64,128 --contexts 4096,32768 \
      --time-budget "$(budget 100)"
    ;;
esac
FLASHATTN_SM90_PERSISTENT=1 stage testspersist 100 "$build/tests/test_gpu"
PYTHONPATH=$root/bindings/python stage pytest 60 "$py" -m pytest -p no:cacheprovider -q -rs \
  bindings/python/tests/test_gpu.py
stage sdpa 130 "$py" bench/bench_sdpa.py --out-dir "$res" --dtypes ${FA_LEASE_DTYPES:-bf16} --head-dims 64,128,256 \
  --seqlens 512,1024,2048,4096,8192,16384 --no-coldstart --time-budget "$(budget 110)"
stage bwd 150 "$py" bench/bench_sdpa.py --backward --deterministic --out-dir "$res" --dtypes bf16 \
  --head-dims 128,64 --seqlens 4096,8192,16384,1024,2048 --time-budget "$(budget 120)"
case $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) in
  9.0)
    FLASHATTN_SM90_BACKWARD=0 stage bwd90off 60 "$py" bench/bench_sdpa.py --backward \
      --out-dir "$logs/bwd90off" --dtypes bf16 --head-dims 128 --seqlens 4096,16384 \
      --time-budget "$(budget 50)"
    ;;
esac
FLASHATTN_FORCE_SM80_FORWARD=1 stage sdpa80 50 "$py" bench/bench_sdpa.py --out-dir "$logs/sm80" \
  --dtypes bf16 --head-dims 128 --seqlens 4096,16384 --no-coldstart --time-budget "$(budget 40)"
FLASHATTN_PTX_COMPILER=off stage sdpajit 50 "$py" bench/bench_sdpa.py --out-dir "$logs/jit" \
  --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096 --no-coldstart --time-budget "$(budget 40)"
FLASHATTN_SM90_PERSISTENT=1 stage persist 60 "$py" bench/bench_sdpa.py --out-dir "$logs/persist" \
  --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,16384 --no-coldstart --time-budget "$(budget 50)"
FLASHATTN_FORCE_SM80_FORWARD=1 FLASHATTN_SM80_PERSISTENT=1 stage persist80 60 "$py" bench/bench_sdpa.py \
  --out-dir "$logs/persist80" --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,4096,16384 \
  --no-coldstart --time-budget "$(budget 50)"
FLASHATTN_FORCE_SM80_FORWARD=1 stage persist80off 60 "$py" bench/bench_sdpa.py \
  --out-dir "$logs/persist80off" --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,4096,16384 \
  --no-coldstart --time-budget "$(budget 50)"
if [ -e "$build/baseline/libflashattn.so.0" ]; then
  FLASHATTN_PYTHON_DIR=$basepy FLASHATTN_LIBRARY=$root/$build/baseline/libflashattn.so.0 stage sdpabase 50 "$py" \
    bench/bench_sdpa.py --out-dir "$logs/base" --dtypes bf16 --head-dims 64,128 \
    --seqlens 1024,4096 --no-coldstart --time-budget "$(budget 40)"
fi
stage ab 60 "$py" bench/bench_compiler_ab.py --out-dir "$res"
stage fp8fwd 90 "$py" bench/bench_sdpa.py --fp8 --out-dir "$res" --head-dims 128,64 \
  --seqlens 1024,2048,4096,8192 --time-budget "$(budget 75)"
stage coldstart 90 "$py" bench/bench_sdpa.py --out-dir "$logs/cold" --dtypes bf16 --head-dims 128 \
  --seqlens 4096 --time-budget "$(budget 20)"
stage decode 100 "$py" bench/bench_decode.py --out-dir "$res" --batches 1,64,256 \
  --contexts 4096,32768 --page-sizes 16 --time-budget "$(budget 85)"
stage decode16 100 "$py" bench/bench_decode.py --out-dir "$res" --dtype fp16 --batches 1,64,256 \
  --contexts 4096,32768 --page-sizes 16 --time-budget "$(budget 85)"
if [ -e "$build/baseline/libflashattn.so.0" ]; then
  FLASHATTN_PYTHON_DIR=$basepy FLASHATTN_LIBRARY=$root/$build/baseline/libflashattn.so.0 stage decodebase 100 "$py" \
    bench/bench_decode.py --out-dir "$logs/base" --batches 1,64,256 --contexts 4096,32768 \
    --page-sizes 16 --time-budget "$(budget 85)"
fi
stage append 45 "$py" bench/bench_decode.py --out-dir "$res" --append --batches 64,256 \
  --contexts 4096 --page-sizes 16 --time-budget "$(budget 35)"
stage mla 120 "$py" bench/bench_decode.py --out-dir "$res" --mla --batches 1,64,128 \
  --contexts 4096,32768 --time-budget "$(budget 100)"
stage mla90 120 env FLASHATTN_SM90_MLA=1 "$py" bench/bench_decode.py --out-dir "$logs/mla90" \
  --mla --batches 1,64,128 --contexts 4096,32768 --time-budget "$(budget 100)"
FLASHATTN_SM90_MLA=1 stage testsmla 150 "$build/tests/test_gpu"
# A config starts while budget is left and is not cut short: the limits
# leave room for the last one (a FlexAttention compile, or the 32k context).
stage varlen 150 "$py" bench/bench_varlen.py --out-dir "$res" --quick --time-budget "$(budget 100)"
stage chunked 75 "$py" bench/bench_varlen.py --chunked --out-dir "$res" --quick \
  --time-budget "$(budget 45)"
stage split 60 "$py" bench/bench_varlen.py --chunked --out-dir "$res" --quick --batch 1 \
  --new-tokens 128 --time-budget "$(budget 30)"
stage splitoff 60 env FLASHATTN_FORWARD_SPLITS=0 "$py" bench/bench_varlen.py --chunked \
  --out-dir "$logs/nosplit" --quick --batch 1 --new-tokens 128 --time-budget "$(budget 30)"
stage pack 60 "$py" bench/bench_varlen.py --chunked --out-dir "$res" --quick --batch 16 \
  --new-tokens 4 --time-budget "$(budget 30)"
stage packoff 60 env FLASHATTN_FORWARD_GQA_PACK=0 "$py" bench/bench_varlen.py --chunked \
  --out-dir "$logs/nopack" --quick --batch 16 --new-tokens 4 --time-budget "$(budget 30)"
FLASHATTN_PDL=1 stage testspdl 150 "$build/tests/test_gpu"
stage pdl 60 env FLASHATTN_PDL=1 "$py" bench/bench_decode.py --out-dir "$logs/pdl" --batches 1,8 \
  --contexts 4096,32768 --page-sizes 16 --time-budget "$(budget 45)"
stage pdloff 60 "$py" bench/bench_decode.py --out-dir "$logs/pdloff" --batches 1,8 \
  --contexts 4096,32768 --page-sizes 16 --time-budget "$(budget 45)"
stage fused 60 "$py" bench/bench_decode.py --fused --out-dir "$logs/fused" --batches 1,8 \
  --contexts 4096,32768 --page-sizes 16 --time-budget "$(budget 45)"
stage fusedoff 60 env FLASHATTN_DECODE_FUSED=0 "$py" bench/bench_decode.py --fused \
  --out-dir "$logs/fusedoff" --batches 1,8 --contexts 4096,32768 --page-sizes 16 \
  --time-budget "$(budget 45)"

echo "total $(( $(date +%s) - t_all ))s" | tee -a "$summary"
for d in sm80:force-sm80-forward sm100off:sm100-forward-off base:baseline-library cold:coldstart jit:driver-jit \
  nosplit:forward-splits-off nopack:gqa-pack-off pdl:pdl pdloff:pdl-off mla90:sm90-mla \
  mla100off:sm100-mla-off bwd90off:sm90-backward-off nopair:sm100-cta-pair-off \
  fused:fused fusedoff:fused-off \
  persist:sm90-persistent persist80:sm80-persistent persist80off:sm80-persistent-off; do
  [ -d "$logs/${d%%:*}" ] || continue
  for f in "$logs/${d%%:*}"/*; do mv "$f" "$res/$(basename "${f%.*}")-${d#*:}.${f##*.}"; done
done
# The stage logs, in a folder named by date and commit.
lease=$res/$(date -u +%F)-lease-${commit:0:12}
mkdir -p "$lease" && cp "$logs"/*.log "$summary" "$lease/" 2>/dev/null
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  tar -C "$root" -czf "$OUT/lease.tgz" "$res" 2>/dev/null
  cp "$summary" "$OUT/"
fi
# The tables, last (the device tool returns the output's tail).
for f in "$res"/*sdpa*.md "$res"/*decode*.md "$res"/*varlen*.md "$res"/*chunked-prefill*.md; do
  [ -e "$f" ] && [ "$f" -nt "$logs/start" ] && grep -E '^\|' "$f" | head -24
done
cat "$summary"
