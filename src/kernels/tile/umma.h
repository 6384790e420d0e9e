// The sm_100a tensor-core (UMMA: tcgen05.mma) operand descriptors as
// values, for the Blackwell kernels (forward_sm100.cc) and their tests.
//
// UmmaSmemDesc is the 64-bit shared memory descriptor of tcgen05.mma's A /
// B and of tcgen05.cp's source (PTX ISA "tcgen05": "Shared Memory
// Descriptor", Table 40): start address >> 4 in bits 0-13, leading
// dimension byte offset >> 4 in 16-29, stride dimension byte offset >> 4 in
// 32-45, the fixed 0b001 in 46-48, base offset in 49-51, leading-dimension
// stride mode 0 (relative) in 52, swizzle mode in 61-63 (0 none, 1 128-byte
// with 32-byte atom, 2 128-byte, 4 64-byte, 6 32-byte). It is NOT wgmma's
// format (no version bits there, swizzle in 62-63 numbered 1/2/3): the
// Swizzle128::desc_bits of swizzle.h are for wgmma only. The start address
// field is the same, so Swizzle128::descriptor(e, addr, off, bits()) builds
// the register value of a descriptor whose start is left 0 here.
//
// UmmaInstrDesc is the 32-bit instruction descriptor of kind::f16 and
// kind::f8f6f4 (PTX ISA "Instruction Descriptor", Table 42): dtype F32 (1)
// in bits 4-5, atype 7-9, btype 10-12 (f16 0, bf16 1; e4m3 0, e5m2 1),
// negate A / B 13 / 14, transpose (MN-major) A / B 15 / 16, N >> 3 in
// 17-22, M >> 4 in 24-28 (5 bits: M = 256 of a cta_group::2 MMA is 16);
// dense, no saturation, no .ws shift. The descriptor does not say the
// .cta_group: the instruction does, and the shapes it takes differ
// ("Matrix Shape", Table 39: cta_group::1 M 64 / 128, N 8..256 step 8;
// cta_group::2 M 128 / 256, N 16..256 step 16, 32 with A in tensor memory).
//
// The emulator decodes both (emu/sm100.h decode_umma_smem_desc,
// decode_umma_idesc); tests/test_emulator_umma.cc checks that it decodes
// every field these encoders write back to the same values.
#pragma once

#include <cstdint>

namespace fa::kgen::tile {

// Swizzle modes, by their encoding in bits 61-63.
enum class UmmaSwizzle : uint8_t { kNone = 0, k128B32BAtom = 1, k128B = 2, k64B = 4, k32B = 6 };

// Bytes of one swizzle row (the pattern repeats every 8 such rows): 0 for kNone.
constexpr uint32_t umma_swizzle_bytes(UmmaSwizzle s) {
  return s == UmmaSwizzle::k32B    ? 32
         : s == UmmaSwizzle::k64B  ? 64
         : s == UmmaSwizzle::kNone ? 0
                                   : 128;
}

struct UmmaSmemDesc {
  uint32_t start = 0;        // shared byte address, a multiple of 16, below 2^18
  uint32_t lbo = 0;          // leading dimension byte offset, a multiple of 16, below 2^18
  uint32_t sbo = 0;          // stride dimension byte offset, a multiple of 16, below 2^18
  uint32_t base_offset = 0;  // 0..7: (pattern start address >> 7) & 7; 0 on aligned tiles
  UmmaSwizzle swizzle = UmmaSwizzle::kNone;

  // The 64-bit descriptor (fields masked to their widths).
  constexpr uint64_t bits() const {
    return uint64_t{(start & 0x3ffff) >> 4} | uint64_t{(lbo & 0x3ffff) >> 4} << 16 |
           uint64_t{(sbo & 0x3ffff) >> 4} << 32 | uint64_t{1} << 46 |
           uint64_t{base_offset & 7} << 49 | uint64_t{static_cast<uint8_t>(swizzle) & 7u} << 61;
  }
};

enum class UmmaType : uint8_t { kF16, kBF16, kE4M3, kE5M2 };

struct UmmaInstrDesc {
  UmmaType a = UmmaType::kF16, b = UmmaType::kF16;  // f16 / bf16 (kind::f16, both the same)
                                                    // or e4m3 / e5m2 (kind::f8f6f4)
  uint32_t m = 128;  // 64 or 128 (cta_group::1), 128 or 256 (cta_group::2: the pair's M)
  uint32_t n = 128;  // 8..256, a multiple of 8 (cta_group::2: of 16)
  bool a_mn_major = false, b_mn_major = false;  // transpose bits: MN-major operands
  bool neg_a = false, neg_b = false;

  // kind::f8f6f4 (fp8 A and B, K = 32) rather than kind::f16 (K = 16).
  constexpr bool f8f6f4() const { return a == UmmaType::kE4M3 || a == UmmaType::kE5M2; }
  // K of one tcgen05.mma of this kind.
  constexpr uint32_t k() const { return f8f6f4() ? 32 : 16; }
  // The 32-bit descriptor (D type F32).
  constexpr uint32_t bits() const {
    auto code = [](UmmaType t) { return t == UmmaType::kBF16 || t == UmmaType::kE5M2 ? 1u : 0u; };
    return 1u << 4 | code(a) << 7 | code(b) << 10 | uint32_t{neg_a} << 13 | uint32_t{neg_b} << 14 |
           uint32_t{a_mn_major} << 15 | uint32_t{b_mn_major} << 16 | ((n >> 3) & 0x3f) << 17 |
           ((m >> 4) & 0x1f) << 24;
  }
};

}  // namespace fa::kgen::tile
