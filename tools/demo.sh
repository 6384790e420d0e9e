#!/usr/bin/env bash
# Installs what is missing, builds flashattn, and runs the main job: the
# forward pass on real activations of a pretrained transformer
# (tests/data/minilm_l6), compared against an fp64 reference. Uses the GPU
# when there is one, else the PTX emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target flashattn_cli

fixture=tests/data/minilm_l6
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./build/tools/flashattn run --q "$fixture/q.npy" --k "$fixture/k.npy" --v "$fixture/v.npy" \
  --dtype fp16 --backend auto --out "$out/o.npy" --lse-out "$out/lse.npy"
