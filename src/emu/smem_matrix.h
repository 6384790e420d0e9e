// Shared-memory matrix operands of the asynchronous tensor-core
// instructions (wgmma.mma_async on sm_90a, tcgen05.mma / tcgen05.cp on
// sm_100a): the canonical layouts, one address function for both. The two
// descriptor formats differ only in where they keep the fields and how
// they number the swizzle modes (PTX ISA "Matrix Descriptor Format" for
// wgmma; "tcgen05": "Shared Memory Descriptor", Table 40, for tcgen05);
// each decoder fills a SmemMatrix. Internal to the emulator.
#pragma once

#include <cstdint>

namespace fa {
namespace emu {

// A decoded descriptor: byte values (the >> 4 encodings undone).
struct SmemMatrix {
  uint32_t start = 0;  // matrix start address
  uint32_t lbo = 0;    // leading dimension byte offset
  uint32_t sbo = 0;    // stride dimension byte offset
  uint32_t base = 0;   // matrix base offset (bits 7-9 of the swizzle pattern's start)
  uint32_t bits = 0;   // swizzle: 0 none, 1 / 2 / 3: 32 / 64 / 128-byte (Swizzle<bits,4,3>)
};

// wgmma's descriptor (PTX ISA "Matrix Descriptor Format"): start 0-13, LBO
// 16-29, SBO 32-45, base offset 49-51, swizzle 62-63 (1 = 128B, 2 = 64B,
// 3 = 32B).
inline SmemMatrix wgmma_smem_matrix(uint64_t desc) {
  SmemMatrix m;
  m.start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  m.lbo = static_cast<uint32_t>((desc >> 16) & 0x3fff) << 4;
  m.sbo = static_cast<uint32_t>((desc >> 32) & 0x3fff) << 4;
  m.base = static_cast<uint32_t>((desc >> 49) & 7);
  const uint32_t mode = static_cast<uint32_t>(desc >> 62);
  m.bits = mode == 1 ? 3 : mode == 2 ? 2 : mode == 3 ? 1 : 0;
  return m;
}

// Byte address in shared memory of element (mn, k) of a matrix of esz-byte
// elements (2: f16 / bf16, 1: fp8) (PTX ISA "Shared Memory Matrix Layout"
// for wgmma, "tcgen05": "Major-ness supported by Strides" for tcgen05: the
// same canonical layouts, in elements with T = 16 / esz elements per 16
// bytes; in bytes the same for every element size). K-major (mn_major
// false): no swizzle ((8,m),(T,2k)):((1T,SBO),(1,LBO)), swizzle of W bytes
// ((8,m),(T,2k)):((W/esz,SBO),(1,T)) (LBO unused); MN-major: no swizzle
// ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), swizzled
// ((T,W/16,m),(8,k)):((1,T,LBO),(W/esz,SBO)); then Swizzle<log2(W/16),4,3>
// on the address, its row bits counted from the pattern start given by the
// base offset.
inline uint32_t smem_matrix_addr(const SmemMatrix &d, bool mn_major, uint32_t mn, uint32_t k,
                                 uint32_t esz) {
  const uint32_t w = d.bits ? 16u << d.bits : 0;  // swizzle width in bytes
  const uint32_t t = 16 / esz;                    // elements per 16-byte core-matrix row
  uint32_t off;
  if (!mn_major) {
    off = w ? (mn % 8) * w + (mn / 8) * d.sbo + k * esz
            : (mn % 8) * 16 + (mn / 8) * d.sbo + (k % t) * esz + (k / t) * d.lbo;
  } else {
    off = w ? (mn % (w / esz)) * esz + (mn / (w / esz)) * d.lbo + (k % 8) * w + (k / 8) * d.sbo
            : (mn % t) * esz + (mn / t) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
  }
  uint32_t a = d.start + off;
  if (d.bits) a ^= ((((a >> 7) - d.base) & ((1u << d.bits) - 1)) << 4);
  return a;
}

}  // namespace emu
}  // namespace fa
