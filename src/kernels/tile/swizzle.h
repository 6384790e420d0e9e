// The 128-byte swizzled shared-memory layout of the sm_90a kernels (TMA's
// CU_TENSOR_MAP_SWIZZLE_128B; wgmma's and stmatrix's 128B swizzle mode,
// PTX ISA "Shared Memory Matrix Layout"): rows of 128 bytes, eight 16-byte
// chunks, a row's chunks permuted by its index mod 8; a matrix wider than 8
// chunks is a run of such atoms, atom_bytes apart. Chunk c of row r is at
//   atom c / 8, byte 128 r + 16 ((c % 8) ^ (r % 8)).
// Copies into it (the gather producer), stores out of it (the epilogue)
// and the TMA box and wgmma descriptors all assume this one layout.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/tile.h"

namespace fa::kgen::tile {

struct Swizzle128 {
  static constexpr uint32_t kRowBytes = 128, kChunkBytes = 16;
  // The XOR that takes the address of (row, chunk) to that of (row, chunk ^
  // k), and to that of (row + k, chunk) less 128 k when row % 8 & k == 0
  // (k < 8): the slot is (chunk % 8) ^ (row % 8), so either move flips the
  // same bits of it.
  static constexpr uint32_t flip(uint32_t k) { return kChunkBytes * (k % 8); }

  uint32_t atom_bytes = 0;  // bytes from one 8-chunk atom to the next

  // The byte offset of (row, chunk) (host side: tests and layouts).
  uint32_t offset(uint32_t row, uint32_t chunk) const {
    return chunk / 8 * atom_bytes + row * kRowBytes + kChunkBytes * ((chunk % 8) ^ (row % 8));
  }
  // base + offset(row, chunk), all u32 registers (a new register).
  Reg addr(Emitter &e, Reg base, Reg row, Reg chunk) const;
  // 16 (chunk ^ row8): the byte offset in its row of the slot of `chunk`
  // (< 8) in a row with row % 8 = row8 (u32 registers; row8 invalid: 0). A
  // new register; the slots of other chunks and rows of the period follow
  // by flip().
  static Reg slot_bytes(Emitter &e, Reg chunk, Reg row8);

  // A wgmma shared-memory matrix descriptor of this layout (PTX ISA
  // "Matrix Descriptor Format") without its start address: the leading
  // dimension byte offset lbo and the stride byte offset 1024 (8 rows of
  // 128 bytes: the swizzle's period) encoded >> 4, the 128-byte swizzle
  // (mode 1 in bits 62-63), base offset 0 (every tile starts on 1024 bytes).
  static uint64_t desc_bits(uint32_t lbo) {
    constexpr uint32_t sbo = 8 * kRowBytes;
    return (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
  }
  // The descriptor of the matrix at shared address addr + off (u32): its
  // start address >> 4 in bits 0-13, or'ed with `bits` (a new b64).
  static Reg descriptor(Emitter &e, Reg addr, uint32_t off, uint64_t bits);
};

// Stores a warp's accumulator tile t (16 rows x 8 t.n() columns of f32, the
// mma C layout of tile.h) as `half` (f16 or bf16) into rows row0 .. row0 + 15
// of `lay` at base (+ off, an immediate): column 8j + c goes to chunk j of
// the row, element c. One stmatrix.x4 per two fragments (x2 for a last odd
// one): lane l addresses row l8 + 8 h1 of chunk 2i + h2 (PTX ISA
// "stmatrix": matrices 0..3 from lanes 0-7, 8-15, 16-23, 24-31; ln from
// make_lanes of this lane). base and row0 u32 registers. packed: t's
// values already packed by pack_acc (then t only gives the shape).
void store_acc(Emitter &e, const Lanes &ln, const AccTile &t, Type half, const Swizzle128 &lay,
               Reg base, Reg row0, uint32_t off, const std::vector<Reg> *packed = nullptr);

// t's values as `half` pairs into dst (b32, 2 t.n() of them; fragment j:
// dst[2j] = its row-g pair, dst[2j + 1] = its row-g+8 pair), store_acc's
// words: so an accumulator's values can be stored after the accumulator is
// reused (ptxas keeps a wgmma in flight only while no other instruction
// reads or writes any wgmma's accumulators).
void pack_acc(Emitter &e, const AccTile &t, Type half, const std::vector<Reg> &dst);

// The producer's row copy (tid 0 .. threads - 1; threads 128 or 64, at
// least chunks rounded up to a power of two): rows first .. first +
// rows - 1 of `chunks` 16-byte chunks (the first `data` from row_addr(j),
// the others and rows at or past `limit` zeros; cp.async.cg, zero-filled)
// into 128-byte-swizzled atoms of [rows][128 B] at dst + base, atom_bytes
// apart: chunk c of row r lands at atom c / 8, byte 128 r + 16 ((c % 8) ^
// (r % 8)). Each thread owns one chunk column of every (threads / T)-th
// row, T = chunks rounded up to a power of two. fp8 (1 e4m3, 2 e5m2): the rows
// hold fp8 bytes, 8 per chunk, loaded (ld.global.v2.b32, zeros where
// cp.async would zero-fill) and converted exactly to `half` (f16 or bf16:
// tile::fp8x8_to_half) into the chunk by st.shared.v4: generic
// writes like cp.async's, fenced by the same fence.proxy.async. dst u32
// (shared), first and limit s32; row_addr(j) returns row j's global
// address (u64), j clamped to limit - 1.
void gather_rows(Emitter &e, Reg tid, Reg dst, uint32_t base, uint32_t atom_bytes, int rows,
                 int chunks, int data, Reg first, Reg limit,
                 const std::function<Reg(Reg)> &row_addr, int fp8 = 0, Type half = Type::F16,
                 int threads = 128);

}  // namespace fa::kgen::tile
