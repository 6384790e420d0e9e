#!/usr/bin/env bash
# Installs what is missing, builds flashattn, and runs the main job: the
# forward and decode passes on real activations of pretrained transformers
# (tests/data/), each compared against an fp64 reference (exit 1 if outside
# tolerance), the decode also on a paged KV cache (compared with the
# contiguous one too). Uses the GPU when there is one, else the PTX emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target flashattn_cli

fa=./build/tools/flashattn
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== forward: all-MiniLM-L6-v2 layer 4, 145 tokens, 12 heads, head_dim 32 (bidirectional)"
m=tests/data/minilm_l6
$fa run --q $m/q.npy --k $m/k.npy --v $m/v.npy --dtype fp16 --backend auto \
  --out "$out/o.npy" --lse-out "$out/lse.npy" --ref $m/out.npy

echo
echo "== forward: SmolLM2-135M layer 24, 119 tokens, GQA 9/3, head_dim 64 (causal)"
s=tests/data/smollm2_135m
$fa run --q $s/q.npy --k $s/k.npy --v $s/v.npy --causal --softmax-scale 0.125 --dtype bf16 \
  --backend auto --out "$out/o2.npy" --ref $s/out.npy

echo
echo "== decode: SmolLM2-135M KV cache, 3 sequences (cache_seqlens 120, 61, 41), split-KV"
$fa decode --q $s/q_decode.npy --k-cache $s/k_cache.npy --v-cache $s/v_cache.npy \
  --cache-seqlens $s/cache_seqlens.npy --causal --softmax-scale 0.125 --num-splits 3 \
  --backend auto --out "$out/o3.npy" --ref $s/out_decode.npy

echo
echo "== decode: the same KV cache in pages of 16 tokens (shuffled block_table, unused rows NaN)"
$fa decode --q $s/q_decode.npy --k-cache $s/k_cache.npy --v-cache $s/v_cache.npy \
  --cache-seqlens $s/cache_seqlens.npy --causal --softmax-scale 0.125 --page-size 16 \
  --backend auto --out "$out/o4.npy" --ref $s/out_decode.npy
