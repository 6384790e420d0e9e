// Operands of the tcgen05.mma tests (tests/test_emulator_umma.cc,
// test_emulator_umma2.cc): a matrix in a shared-memory image in the PTX
// ISA's canonical layouts, written from the layouts' own terms, and random
// element values of each UMMA type with their exact values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>

#include "emu/numeric.h"
#include "kernels/tile/umma.h"

namespace fa::test {

using fa::kgen::tile::UmmaSmemDesc;
using fa::kgen::tile::UmmaSwizzle;
using fa::kgen::tile::UmmaType;

// One matrix operand (rows = M or N along MN, kt elements along K) in the
// shared-memory image, laid out as the PTX ISA's canonical layouts say
// ("tcgen05": "Major-ness supported by Strides"; "Shared Memory Matrix
// Layout"), written here from the layouts' own terms (swizzle atoms and
// core matrices), with strides chosen so that LBO and SBO differ.
struct SmemOperand {
  uint32_t rows = 0, kt = 0, esz = 2;
  bool mn_major = false;
  uint32_t swz = 0;                      // swizzle row bytes: 0 (none), 32, 64, 128
  uint32_t base = 0;                     // offset in the image, 1024-aligned
  uint32_t lbo = 0, sbo = 0, katom = 0;  // katom: K-major swizzled, next atom along K

  void plan() {
    const uint32_t t = 16 / esz;  // elements per 16 bytes
    if (!mn_major && swz) {       // atoms of 8 rows x swz bytes; LBO unused
      sbo = 8 * swz;
      lbo = 16;  // a value the hardware ignores here (and a misdecoded SBO would read)
      katom = rows / 8 * sbo;
    } else if (!mn_major) {  // core matrices 8 rows x 16 bytes
      lbo = 128;
      sbo = kt * esz / 16 * 128 + 32;
    } else if (swz) {  // atoms of swz bytes along MN x 8 K rows
      sbo = 8 * swz;
      lbo = kt / 8 * sbo;
    } else {  // core matrices t elements along MN x 8 K rows
      lbo = 128;
      sbo = kt / 8 * 128 + 32;
    }
    (void)t;
  }
  // Bytes from base the operand spans.
  uint32_t extent() const {
    uint32_t hi = 0;
    for (uint32_t mn = 0; mn < rows; ++mn)
      for (uint32_t k = 0; k < kt; ++k) hi = std::max(hi, offset(mn, k) + esz);
    return hi - base;
  }
  // The image offset of element (mn, k), swizzled (Swizzle<log2(swz/16),4,3>
  // on the 1024-aligned image: the TMA's swizzled box layout).
  uint32_t offset(uint32_t mn, uint32_t k) const {
    const uint32_t t = 16 / esz, kb = k * esz;
    uint32_t o;
    if (!mn_major && swz)
      o = kb / swz * katom + mn / 8 * sbo + mn % 8 * swz + kb % swz;
    else if (!mn_major)
      o = mn / 8 * sbo + kb / 16 * lbo + mn % 8 * 16 + kb % 16;
    else if (swz)
      o = mn / (swz / esz) * lbo + k / 8 * sbo + k % 8 * swz + mn % (swz / esz) * esz;
    else
      o = mn / t * sbo + k / 8 * lbo + k % 8 * 16 + mn % t * esz;
    o += base;
    if (swz) o ^= ((o >> 7) & (swz / 16 - 1)) << 4;
    return o;
  }
  // The descriptor of the K step starting at element k0 (start at the
  // unswizzled position of (0, k0), which row 0 leaves in place).
  uint64_t desc(uint32_t k0) const {
    UmmaSmemDesc d;
    d.start = offset(0, k0);
    d.lbo = lbo;
    d.sbo = sbo;
    d.swizzle = swz == 128  ? UmmaSwizzle::k128B
                : swz == 64 ? UmmaSwizzle::k64B
                : swz == 32 ? UmmaSwizzle::k32B
                            : UmmaSwizzle::kNone;
    return d.bits();
  }
};

// A random element's bits: f16 / bf16 in [-2, 2) on a coarse grid, fp8
// any finite code.
inline uint32_t random_bits(UmmaType t, std::mt19937 &rng) {
  switch (t) {
    case UmmaType::kF16:
      return fa::emu::f32_to_f16_rn(static_cast<float>(static_cast<int>(rng() % 512) - 256) / 128);
    case UmmaType::kBF16:
      return fa::emu::f32_to_bf16_rn(static_cast<float>(static_cast<int>(rng() % 512) - 256) / 128);
    case UmmaType::kE4M3:
      for (;;) {
        const uint32_t x = rng() & 0xff;
        if ((x & 0x7f) != 0x7f) return x;
      }
    default:
      for (;;) {
        const uint32_t x = rng() & 0xff;
        if ((x & 0x7c) != 0x7c) return x;
      }
  }
}

inline double value_of(UmmaType t, uint32_t bits) {
  switch (t) {
    case UmmaType::kF16:
      return fa::emu::f16_to_f32(static_cast<uint16_t>(bits));
    case UmmaType::kBF16:
      return fa::emu::bf16_to_f32(static_cast<uint16_t>(bits));
    case UmmaType::kE4M3:
      return fa::emu::fp8_table(false)[bits & 0xff];
    default:
      return fa::emu::fp8_table(true)[bits & 0xff];
  }
}

}  // namespace fa::test
