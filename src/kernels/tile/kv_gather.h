// The gather producer's K/V tiles (FlashAttention-3's producer for paged
// KV, and for what TMA cannot address): a group of producer threads copies
// a tile's rows with cp.async into the 128-byte-swizzled atoms of
// tile::gather_rows, each row's address from the KV layout (KvRows): one
// block_table lookup per tile when pages hold whole tiles (spec.page_tiles),
// else per row, through a row table in shared memory that page_rows fills
// (K's addresses, then V's, 8 bytes a key). The sm_90a forward (its
// producer warpgroup) and the sm_100a forward (two gather warps) share it.
#pragma once

#include "kernels/codegen.h"

namespace fa::kgen::tile {

struct KvGather {
  KvGather(Emitter &em, Reg t) : e(em), tid(t) {}
  Emitter &e;
  Reg tid;                  // the producer thread, 0 .. threads - 1 (u32)
  int threads = 128;        // 128 or 64 (tile::gather_rows)
  Reg smem;                 // the shared window's base (u32)
  uint32_t rows = 0;        // the row table's offset from smem (row_table)
  int block_n = 0;          // keys a tile
  Reg seqlen_k;             // the sequence's keys (s32)
  int bar = 1;              // the producers' named barrier (page_rows)
  bool row_table = false;   // pages looked up per row
  bool page_tiles = false;  // pages hold whole tiles (KernelSpec::page_tiles)
  int fp8 = 0;              // tile::gather_rows's fp8 conversion (0: copy bytes)
  Type half = Type::F16;

  // The row table of keys n .. n + block_n - 1 (s32 n): thread t looks up
  // key min(n + t, seqlen_k - 1)'s page (and n + t + threads ..) and leaves
  // its K and V row addresses at rows + 8 t and rows + 8 (block_n + t);
  // between two named barriers of the producer threads (before: the
  // previous tile's table was read).
  void page_rows(Reg n, const KvRows &kr, const KvRows &vr) const;
  // K's (or V's) tile of keys n .. n + block_n - 1 into atoms of atom_bytes
  // at dst (shared offset from smem, u32; made absolute in place) + base:
  // `chunks` 16-byte chunks a row, the first `data` from the row, zeros
  // past seqlen_k. half_off: the tile's part of the row table (0 for K, 8
  // block_n for V).
  void tile(Reg dst, uint32_t base, uint32_t atom_bytes, int chunks, int data, Reg n,
            const KvRows &kv, int half_off) const;
};

}  // namespace fa::kgen::tile
