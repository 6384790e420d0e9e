// Bit-exact scalar conversions the emulator needs (PTX ISA "cvt", "Floating
// point rounding modifiers"): f32 <-> f16/bf16 with round-to-nearest-even,
// subnormal flushing for .ftz, saturating float -> int.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace fa {
namespace emu {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// .ftz: a subnormal becomes zero of the same sign.
inline float flush_subnormal(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0) return bits_f32(u & 0x80000000u);
  return f;
}

// f16 bits -> f32, exact (subnormals, inf, NaN payload kept).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // Subnormal: value = man * 2^-24, exact in f32.
    float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

// f32 -> f16 bits, round to nearest even; NaN -> 0x7fff (canonical).
inline uint16_t f32_to_f16_rn(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return 0x7fff;
  if (absu >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  int exp = static_cast<int>(absu >> 23) - 127;
  if (exp >= -14) {
    // Normal f16: keep 10 mantissa bits, round the 13 dropped ones.
    uint32_t man = absu & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // carry may bump exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal f16: value / 2^-24 rounded to an integer, nearest even.
  uint32_t man = (absu & 0x7fffffu) | 0x800000u;  // 1.m * 2^23
  int shift = -exp - 1;  // value/2^-24 = man * 2^(exp + 24 - 23) = man >> (-exp - 1)
  uint32_t h = man >> shift;
  uint32_t rest = man & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16 bits, round to nearest even; NaN -> 0x7fff (canonical).
inline uint16_t f32_to_bf16_rn(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Correctly rounded f32 fma without a libm call: the product is exact in
// double; the double sum is made round-to-odd (TwoSum error as a sticky bit),
// so the final rounding to f32 is a single correct rounding.
inline float fma_f32(float a, float b, float c) {
  double p = static_cast<double>(a) * static_cast<double>(b);
  double s = p + static_cast<double>(c);
  double bb = s - p;
  double err = (p - (s - bb)) + (static_cast<double>(c) - bb);
  // Branch-free (err != 0 is a coin flip): step an even, inexact sum one ulp
  // toward the exact value.
  uint64_t bits;
  std::memcpy(&bits, &s, 8);
  uint64_t need = static_cast<uint64_t>(err != 0) & static_cast<uint64_t>(std::fabs(s) < INFINITY) &
                  (~bits & 1);
  uint64_t dir = ((err > 0) == (s > 0)) ? 1 : ~uint64_t{0};
  bits += need * dir;
  std::memcpy(&s, &bits, 8);
  return static_cast<float>(s);
}

// fp8 (PTX ISA "Alternate Floating-Point Data Formats"): e4m3 = 1 sign, 4
// exponent (bias 7), 3 mantissa bits, no infinity, NaN S.1111.111, largest
// finite 448; e5m2 = 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE
// infinities and NaNs, largest finite 57344 (the upper byte of an f16).
struct Fp8Format {
  int man_bits, bias;
  double max_finite;
  bool ieee;  // e5m2: exponent all ones is inf/NaN
};
constexpr Fp8Format kE4M3{3, 7, 448.0, false};
constexpr Fp8Format kE5M2{2, 15, 57344.0, true};

// fp8 bits -> f32, exact.
inline float fp8_to_f32(uint8_t x, const Fp8Format &f) {
  const bool neg = (x & 0x80u) != 0;
  const int exp = (x & 0x7f) >> f.man_bits, man = x & ((1 << f.man_bits) - 1);
  const int exp_max = (1 << (7 - f.man_bits)) - 1;
  double v;
  if (f.ieee && exp == exp_max)
    v = man ? NAN : INFINITY;
  else if (!f.ieee && exp == exp_max && man == (1 << f.man_bits) - 1)
    v = NAN;
  else if (exp == 0)
    v = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  else
    v = std::ldexp(1.0 + man / static_cast<double>(1 << f.man_bits), exp - f.bias);
  return static_cast<float>(neg ? -v : v);
}

// f32 -> fp8 bits, cvt.rn.satfinite: round to nearest even; NaN -> 0x7f;
// infinities and values beyond the largest finite -> the largest finite of
// the same sign; a zero or a value that rounds to zero keeps its sign.
inline uint8_t f32_to_fp8_satfinite(float in, const Fp8Format &f) {
  if (std::isnan(in)) return 0x7f;
  const uint8_t sign = std::signbit(in) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(in));
  const int min_exp = 1 - f.bias;  // the smallest normal is 2^min_exp
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const int exp = a == 0 ? min_exp : std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, exp - f.man_bits);
  double v = std::nearbyint(a / quantum) * quantum;  // ties to even (default mode)
  if (v > f.max_finite || std::isinf(a)) v = f.max_finite;
  if (v == 0) return sign;
  std::frexp(v, &e);
  int be = e - 1 + f.bias;
  uint32_t man;
  if (be <= 0) {  // subnormal
    be = 0;
    man = static_cast<uint32_t>(std::ldexp(v, f.bias - 1 + f.man_bits));
  } else {
    man = static_cast<uint32_t>(std::ldexp(v, -(e - 1)) * (1 << f.man_bits)) - (1u << f.man_bits);
  }
  return static_cast<uint8_t>(sign | (be << f.man_bits) | man);
}

// fp8 bits -> f16 bits, exact (cvt.rn.f16x2.e4m3x2 / e5m2x2); NaN -> 0x7fff.
inline uint16_t fp8_to_f16(uint8_t x, const Fp8Format &f) {
  if (f.ieee) return static_cast<uint16_t>(x << 8);  // e5m2 is an f16's upper byte
  const float v = fp8_to_f32(x, f);
  return std::isnan(v) ? 0x7fff : f32_to_f16_rn(v);
}

// Saturating f32 -> s32 after rounding (NaN -> 0), PTX ISA cvt: float to
// integer conversions saturate.
inline int32_t f32_to_s32_sat(float r) {
  if (std::isnan(r)) return 0;
  if (r >= 2147483648.0f) return INT32_MAX;
  if (r < -2147483648.0f) return INT32_MIN;
  return static_cast<int32_t>(r);
}

inline uint32_t f32_to_u32_sat(float r) {
  if (std::isnan(r) || r <= 0.0f) return 0;
  if (r >= 4294967296.0f) return UINT32_MAX;
  return static_cast<uint32_t>(r);
}

// One f32 accumulation chain of the tensor-core emulation, shared by
// mma.sync and wgmma.mma_async so their results are comparable: every
// product a[k] * b[k * bstride] is exact in f32 (f16 and bf16 inputs), each
// sum is rounded to nearest even, for k = 0, 1, ..., kk - 1.
inline float mma_dot_f32(float d, const float *a, const float *b, int kk, int bstride) {
  for (int k = 0; k < kk; ++k) {
    volatile float p = a[k] * b[k * bstride];  // exact; kept apart from the add
    d = d + p;
  }
  return d;
}

// fp8 bits -> f32 (fp8_to_f32, exact) as a table per format, for the fp8
// tensor-core forms (mma.sync m16n8k32, wgmma m64nNk32).
inline const float *fp8_table(bool e5m2) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int x = 0; x < 256; ++x) {
      t[0][x] = fp8_to_f32(static_cast<uint8_t>(x), kE4M3);
      t[1][x] = fp8_to_f32(static_cast<uint8_t>(x), kE5M2);
    }
    return t;
  }();
  return tables[e5m2 ? 1 : 0].data();
}

}  // namespace emu
}  // namespace fa
