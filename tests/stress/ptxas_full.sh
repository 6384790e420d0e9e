#!/usr/bin/env bash
# Every forward kernel variant through ptxas: head dims 8..256 x f16/bf16 x
# softcap x varlen on sm_80, 86, 87, 89, 90, 100, 103, 110, 120 and 121
# (2,800 modules), with the rest of tests/test_ptxas. Fails if any forward
# module has a stack frame or spills (docs/kernels.md, "Tile choice"). Too
# long for CI (about 5 minutes on 2 cores); run it after changing a
# generator, a tile primitive or the tile choice.
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=$(nproc 2>/dev/null || echo 2)
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target test_ptxas
FA_PTXAS_FULL=1 CMOCKA_MESSAGE_OUTPUT=stdout build/tests/test_ptxas | grep -E "local memory|modules|FAILED|PASSED"
