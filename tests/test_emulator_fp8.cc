// The emulator's fp8 conversions (PTX ISA "cvt", "Alternate Floating-Point
// Data Formats"; sm_89 with PTX 8.1, sm_90 with 7.8, as ptxas 13 accepts
// them): cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 and
// cvt.rn.f16x2.{e4m3x2,e5m2x2}, checked against a brute-force reference
// written here from the formats' definitions: every one of the 256 codes
// decoded, every representable value and every midpoint between neighbours
// (ties to even), values just off the midpoints, random f32 of every
// magnitude, and the special values (NaN, infinities, zeros, beyond the
// largest finite, f32 subnormals). The builder's printed forms too.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "ptx/ptx.h"
#include "support/emu_harness.h"

namespace {

using namespace fa::test;

// Value of fp8 code c: e4m3 (bias 7, S.1111.111 NaN, no infinity) or e5m2
// (bias 15, IEEE-style infinities and NaNs).
double decode_ref(int c, bool e5m2) {
  const double s = (c & 0x80) ? -1.0 : 1.0;
  if (!e5m2) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    return s * (e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10));
  }
  const int e = (c >> 2) & 31, m = c & 3;
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * (e == 0 ? m * std::ldexp(1.0, -16) : (4 + m) * std::ldexp(1.0, e - 17));
}

// cvt.rn.satfinite by brute force: the nearest finite code (ties: the even
// mantissa), beyond the largest finite the largest finite, NaN 0x7f, a
// result of zero keeping the input's sign.
int encode_ref(float x, bool e5m2) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const int max_code = e5m2 ? 0x7b : 0x7e;  // 57344, 448
  if (a >= decode_ref(max_code, e5m2)) return sign | max_code;
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 0x80; ++c) {
    const double v = decode_ref(c, e5m2);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - a);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return sign | best;
}

const char *kFp8Kernel = R"(.version 8.1
.target sm_89
.address_size 64
.visible .entry k_fp8(.param .align 8 .b8 k_fp8_param[40])
{
  .reg .b16 %h<4>;
  .reg .b32 %r<8>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [k_fp8_param+0];
  ld.param.u64 %rd2, [k_fp8_param+8];
  ld.param.u64 %rd3, [k_fp8_param+16];
  ld.param.u64 %rd4, [k_fp8_param+24];
  ld.param.u64 %rd5, [k_fp8_param+32];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mad.lo.u32 %r1, %r2, 128, %r1;
  mul.wide.u32 %rd6, %r1, 8;
  add.s64 %rd6, %rd1, %rd6;
  ld.global.v2.f32 {%f1, %f2}, [%rd6];
  cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f2;
  cvt.rn.satfinite.e5m2x2.f32 %h2, %f1, %f2;
  mul.wide.u32 %rd7, %r1, 2;
  add.s64 %rd8, %rd2, %rd7;
  st.global.b16 [%rd8], %h1;
  add.s64 %rd8, %rd3, %rd7;
  st.global.b16 [%rd8], %h2;
  add.s64 %rd8, %rd4, %rd7;
  ld.global.b16 %h3, [%rd8];
  cvt.rn.f16x2.e4m3x2 %r3, %h3;
  cvt.rn.f16x2.e5m2x2 %r4, %h3;
  mul.wide.u32 %rd9, %r1, 8;
  add.s64 %rd9, %rd5, %rd9;
  st.global.v2.b32 [%rd9], {%r3, %r4};
}
)";

uint16_t f16_bits_of(double v) {  // v exactly representable as a normal or subnormal f16
  const uint16_t s = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (std::isinf(a)) return s | 0x7c00;
  if (a == 0) return s;
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  if (e - 1 < -14) return s | static_cast<uint16_t>(std::ldexp(a, 24));
  return s | static_cast<uint16_t>(((e - 1 + 15) << 10) |
                                   (static_cast<int>(std::ldexp(a, 11 - e)) - 1024));
}

void test_fp8_conversions(void **) {
  // Inputs: every representable value of both formats, the midpoints
  // between neighbours and values 1/64 ulp either side, random f32 over
  // 2^-30..2^20, specials.
  std::vector<float> in;
  for (int f = 0; f < 2; ++f) {
    std::vector<double> vals;
    for (int c = 0; c < 0x80; ++c)
      if (std::isfinite(decode_ref(c, f))) vals.push_back(decode_ref(c, f));
    for (size_t i = 0; i < vals.size(); ++i) {
      for (double s : {1.0, -1.0}) {
        in.push_back(static_cast<float>(s * vals[i]));
        if (i + 1 < vals.size()) {
          const double mid = (vals[i] + vals[i + 1]) / 2, q = (vals[i + 1] - vals[i]) / 64;
          for (double d : {0.0, q, -q}) in.push_back(static_cast<float>(s * (mid + d)));
        }
      }
    }
  }
  std::mt19937 rng(2026);
  std::uniform_real_distribution<double> ex(-30, 20);
  for (int i = 0; i < 2000; ++i)
    in.push_back(static_cast<float>((i % 2 ? -1 : 1) * std::exp2(ex(rng))));
  const float specials[] = {NAN,      -NAN,       INFINITY,  -INFINITY, 0.0f,      -0.0f,
                            448.0f,   449.0f,     463.9f,    464.0f,    1e30f,     -1e30f,
                            57344.0f, 61439.0f,   61440.0f,  1e-45f,    -1e-45f,   0x1p-10f,
                            0x1p-17f, 0x1.8p-17f, -0x1p-10f, 240.0f,    -57344.5f, 3.0e38f};
  for (float s : specials) in.push_back(s);
  if (in.size() % 2) in.push_back(1.0f);
  const uint32_t pairs = static_cast<uint32_t>(in.size() / 2);
  const uint32_t threads = (pairs + 127) / 128 * 128;
  in.resize(2 * threads, 0.0f);
  // Codes to decode: (c, 255 - c) and (c, c) pairs, repeated to fill.
  std::vector<uint16_t> codes(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    const uint32_t c = t % 256, d = (t / 256) % 2 ? c : 255 - c;
    codes[t] = static_cast<uint16_t>((c << 8) | d);
  }
  DevBuf din(in.size() * 4), e4(threads * 2), e5(threads * 2), dcodes(threads * 2),
      dec(threads * 8);
  din.put(in);
  dcodes.put(codes);
  e4.poison();
  e5.poison();
  dec.poison();
  struct {
    uint64_t in, e4, e5, codes, dec;
  } prm = {din.ptr, e4.ptr, e5.ptr, dcodes.ptr, dec.ptr};
  assert_int_equal(run_ptx(kFp8Kernel, "k_fp8", geom(threads / 128, 128), &prm, sizeof prm),
                   FA_SUCCESS);
  const std::vector<uint16_t> g4 = e4.get<uint16_t>(), g5 = e5.get<uint16_t>();
  int bad = 0;
  for (uint32_t t = 0; t < pairs; ++t) {
    for (int f = 0; f < 2; ++f) {
      const uint16_t got = f ? g5[t] : g4[t];
      const uint16_t want =
          static_cast<uint16_t>((encode_ref(in[2 * t], f) << 8) | encode_ref(in[2 * t + 1], f));
      if (got != want && bad++ < 10)
        std::fprintf(stderr, "%s (%a, %a): got 0x%04x want 0x%04x\n", f ? "e5m2" : "e4m3",
                     in[2 * t], in[2 * t + 1], got, want);
    }
  }
  assert_int_equal(bad, 0);
  const std::vector<uint32_t> gd = dec.get<uint32_t>();
  for (uint32_t t = 0; t < threads; ++t) {
    for (int f = 0; f < 2; ++f) {
      const uint32_t got = gd[2 * t + f];
      for (int h = 0; h < 2; ++h) {
        const int c = (codes[t] >> (8 * h)) & 0xff;
        const uint16_t g = static_cast<uint16_t>(got >> (16 * h));
        const double v = decode_ref(c, f);
        if (std::isnan(v)) {
          if ((g & 0x7c00) != 0x7c00 || (g & 0x3ff) == 0) ++bad;  // an f16 NaN
          if (f && g != (c << 8)) ++bad;                          // e5m2: the same bits
        } else if (g != f16_bits_of(v)) {
          if (bad++ < 10)
            std::fprintf(stderr, "%s code 0x%02x: f16 0x%04x want 0x%04x\n", f ? "e5m2" : "e4m3", c,
                         g, f16_bits_of(v));
        }
      }
    }
  }
  assert_int_equal(bad, 0);
}

// Misuse: fp8 needs sm_89 and PTX 8.1 (7.8 on sm_90); .satfinite is mandatory to fp8 and
// refused elsewhere.
void test_fp8_errors(void **) {
  auto compile = [](const std::string &ptx) {
    std::vector<uint8_t> bin;
    std::string log;
    return g_be->compile(ptx, &bin, &log);
  };
  const std::string body =
      ".visible .entry k(.param .u64 p)\n{\n  .reg .b16 %h<2>;\n  .reg .b32 %r<2>;\n"
      "  .reg .f32 %f<2>;\n  mov.f32 %f1, 0f3F800000;\n  INST\n}\n";
  auto with = [&](const char *head, const char *inst) {
    std::string b = body;
    b.replace(b.find("INST"), 4, inst);
    return std::string(head) + b;
  };
  const char *ok_head = ".version 8.1\n.target sm_89\n.address_size 64\n";
  assert_int_equal(compile(with(ok_head, "cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f1;")),
                   FA_SUCCESS);
  assert_int_not_equal(compile(with(".version 7.8\n.target sm_86\n.address_size 64\n",
                                    "cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f1;")),
                       FA_SUCCESS);
  expect_error("sm_89");
  assert_int_not_equal(compile(with(".version 7.8\n.target sm_89\n.address_size 64\n",
                                    "cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f1;")),
                       FA_SUCCESS);
  expect_error("8.1");
  assert_int_not_equal(compile(with(ok_head, "cvt.rn.e4m3x2.f32 %h1, %f1, %f1;")), FA_SUCCESS);
  assert_int_not_equal(compile(with(ok_head, "cvt.rn.satfinite.f16.f32 %h1, %f1;")), FA_SUCCESS);
  expect_error("satfinite");
  assert_int_not_equal(compile(with(ok_head, "cvt.rz.satfinite.e5m2x2.f32 %h1, %f1, %f1;")),
                       FA_SUCCESS);
}

// The builder prints the forms the emulator and ptxas read.
void test_fp8_builder(void **) {
  fa::ptx::Builder b("k_fp8b", 8);
  using fa::ptx::Reg;
  Reg h = b.reg(fa::ptx::RegClass::B16), r = b.b32(), f = b.f32();
  b.mov(fa::ptx::Type::F32, f, fa::ptx::fimm(1.0f));
  b.cvt_f8x2_f32(false, h, f, f);
  b.cvt_f8x2_f32(true, h, f, f);
  b.cvt_f16x2_f8x2(false, r, h);
  b.cvt_f16x2_f8x2(true, r, h);
  b.exit();
  const std::string ptx = std::move(b).emit(81, 89, 32);
  assert_non_null(std::strstr(ptx.c_str(), "cvt.rn.satfinite.e4m3x2.f32"));
  assert_non_null(std::strstr(ptx.c_str(), "cvt.rn.satfinite.e5m2x2.f32"));
  assert_non_null(std::strstr(ptx.c_str(), "cvt.rn.f16x2.e4m3x2"));
  assert_non_null(std::strstr(ptx.c_str(), "cvt.rn.f16x2.e5m2x2"));
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(g_be->compile(ptx, &bin, &log), FA_SUCCESS);
}

// ------------------------------------------------------------ fp8 mma ---
//
// mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32 (PTX ISA
// "Warp-level matrix multiply-accumulate instructions: mma", "Matrix
// Fragments for mma.m16n8k32"; sm_89 and PTX ISA 8.4) with fragments built
// on the host from the ISA's figures, written out here independently of the
// emulator. With g = lane / 4, q = lane % 4 and byte j of a register its
// j-th element:
//   A a_i (i = 0..15, register i / 4): row g + 8 ((i / 4) % 2), col 4q + i % 4 + 16 (i / 8)
//   B b_i (i = 0..7, register i / 4): row (k) 4q + i % 4 + 16 (i / 4), col (n) g
//   C/D c_i (i = 0..3): row g + 8 (i / 2), col 2q + i % 2

// One warp per CTA; CTA c reads its lanes' fragments at [32 c + lane].
std::string mma8_kernel(bool a5, bool b5, int version = 84, int sm = 89) {
  char head[64];
  std::snprintf(head, sizeof head, ".version %d.%d\n.target sm_%d\n", version / 10, version % 10,
                sm);
  return std::string(head) + ".address_size 64\n" +
         R"(.visible .entry k_mma8(.param .align 8 .b8 k_mma8_param[32])
{
  .reg .b32 %r<12>;
  .reg .f32 %f<8>;
  .reg .b64 %rd<12>;
  ld.param.u64 %rd1, [k_mma8_param+0];
  ld.param.u64 %rd2, [k_mma8_param+8];
  ld.param.u64 %rd3, [k_mma8_param+16];
  ld.param.u64 %rd4, [k_mma8_param+24];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mad.lo.u32 %r1, %r2, 32, %r1;
  mul.wide.u32 %rd5, %r1, 16;
  add.s64 %rd6, %rd1, %rd5;
  ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd6];
  mul.wide.u32 %rd7, %r1, 8;
  add.s64 %rd8, %rd2, %rd7;
  ld.global.v2.u32 {%r8, %r9}, [%rd8];
  add.s64 %rd9, %rd3, %rd5;
  ld.global.v4.f32 {%f0, %f1, %f2, %f3}, [%rd9];
  mma.sync.aligned.m16n8k32.row.col.f32.)" +
         (a5 ? "e5m2" : "e4m3") + (b5 ? ".e5m2" : ".e4m3") +
         R"(.f32 {%f4, %f5, %f6, %f7}, {%r4, %r5, %r6, %r7}, {%r8, %r9}, {%f0, %f1, %f2, %f3};
  add.s64 %rd10, %rd4, %rd5;
  st.global.v4.f32 [%rd10], {%f4, %f5, %f6, %f7};
  ret;
}
)";
}

// One warp's operands as matrices: A[m][k] and B[k][n] fp8 codes, C[m][n].
struct Mma8Case {
  uint8_t a[16][32], b[32][8];
  float c[16][8];
};

// Runs the cases (one CTA each) and returns D[case][m][n].
std::vector<float> run_mma8(const std::vector<Mma8Case> &cases, bool a5, bool b5) {
  const size_t n = cases.size();
  std::vector<uint32_t> wa(n * 32 * 4, 0), wb(n * 32 * 2, 0);
  std::vector<float> wc(n * 32 * 4);
  for (size_t t = 0; t < n; ++t)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      const size_t l = t * 32 + lane;
      for (int i = 0; i < 16; ++i)
        wa[l * 4 + i / 4] |=
            uint32_t(cases[t].a[g + 8 * ((i / 4) % 2)][4 * q + i % 4 + 16 * (i / 8)])
            << (8 * (i % 4));
      for (int i = 0; i < 8; ++i)
        wb[l * 2 + i / 4] |= uint32_t(cases[t].b[4 * q + i % 4 + 16 * (i / 4)][g]) << (8 * (i % 4));
      for (int i = 0; i < 4; ++i) wc[l * 4 + i] = cases[t].c[g + 8 * (i / 2)][2 * q + i % 2];
    }
  DevBuf da(wa.size() * 4), db(wb.size() * 4), dc(wc.size() * 4), dd(wc.size() * 4);
  da.put(wa);
  db.put(wb);
  dc.put(wc);
  struct {
    uint64_t a, b, c, d;
  } prm = {da.ptr, db.ptr, dc.ptr, dd.ptr};
  assert_int_equal(
      run_ptx(mma8_kernel(a5, b5), "k_mma8", geom(static_cast<uint32_t>(n), 32), &prm, sizeof prm),
      FA_SUCCESS);
  const std::vector<float> wd = dd.get<float>();
  std::vector<float> d(n * 16 * 8);
  for (size_t t = 0; t < n; ++t)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, q = lane % 4;
      for (int i = 0; i < 4; ++i)
        d[(t * 16 + g + 8 * (i / 2)) * 8 + 2 * q + i % 2] = wd[(t * 32 + lane) * 4 + i];
    }
  return d;
}

// The codes of both signs whose values lie in [1/8, 8]: products of two of
// them and their sums with the C below are exact in f32.
std::vector<uint8_t> moderate_codes(bool e5m2) {
  std::vector<uint8_t> v;
  for (int c = 0; c < 256; ++c) {
    const double x = std::fabs(decode_ref(c, e5m2));
    if (x >= 0.125 && x <= 8) v.push_back(static_cast<uint8_t>(c));
  }
  return v;
}

// Each element of D as a function of the A and B indices the ISA names, so
// that no layout error can cancel out: 64 cases per type pair. Case k0 < 32:
// A is zero but for column k0 (A[m][k0] distinct over m), B full (B[k][n]
// distinct over k for each n and over n for each k); case 32 + k0: B zero but
// for row k0 (distinct over n), A full (distinct over m and over k). C[m][n]
// distinct. Then D[m][n] must be C[m][n] + A[m][k0] B[k0][n] exactly: a
// wrong row or column of A, B, C or D, or an A position paired with the
// wrong B position, lands another (distinct) value there. (A permutation of
// k applied alike to A and B leaves every product sum as it is: no test of D
// can see it; the pairing is what matters, and the figures' k order is the
// one the sums run in.)
void test_fp8_mma_layout(void **) {
  for (int pair = 0; pair < 4; ++pair) {
    const bool a5 = pair & 2, b5 = pair & 1;
    const std::vector<uint8_t> va = moderate_codes(a5), vb = moderate_codes(b5);
    assert_true(va.size() >= 48 && vb.size() >= 48);
    std::vector<Mma8Case> cases(64);
    for (int t = 0; t < 64; ++t) {
      Mma8Case &cs = cases[size_t(t)];
      const int k0 = t % 32;
      const bool a_hot = t < 32;
      for (int m = 0; m < 16; ++m)
        for (int k = 0; k < 32; ++k) {
          const uint8_t full = va[size_t(m + 3 * k) % va.size()];
          cs.a[m][k] = a_hot ? (k == k0 ? va[size_t(3 * m + k0) % va.size()] : 0) : full;
        }
      for (int k = 0; k < 32; ++k)
        for (int n = 0; n < 8; ++n) {
          const uint8_t full = vb[size_t(k + 5 * n) % vb.size()];
          cs.b[k][n] = a_hot ? full : (k == k0 ? vb[size_t(7 * n + k0) % vb.size()] : 0);
        }
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) cs.c[m][n] = float(8 * m + n + 1) / 1024;
    }
    const std::vector<float> d = run_mma8(cases, a5, b5);
    int bad = 0;
    for (int t = 0; t < 64; ++t) {
      const int k0 = t % 32;
      const Mma8Case &cs = cases[size_t(t)];
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          const double want =
              double(cs.c[m][n]) + decode_ref(cs.a[m][k0], a5) * decode_ref(cs.b[k0][n], b5);
          const float got = d[(size_t(t) * 16 + m) * 8 + n];
          if (double(got) != want && bad++ < 10)
            std::fprintf(stderr, "fp8 mma %s.%s case %d: D[%d][%d] = %.9g, want %.9g\n",
                         a5 ? "e5m2" : "e4m3", b5 ? "e5m2" : "e4m3", t, m, n, double(got), want);
        }
    }
    assert_int_equal(bad, 0);
  }
}

// Misuse: the fp8 mma needs sm_89 and PTX ISA 8.4 (ptxas 13 alike); only
// m16n8k32 with f32 C/D is implemented.
void test_fp8_mma_errors(void **) {
  auto compile = [](const std::string &ptx) {
    std::vector<uint8_t> bin;
    std::string log;
    return g_be->compile(ptx, &bin, &log);
  };
  assert_int_equal(compile(mma8_kernel(false, true)), FA_SUCCESS);
  assert_int_equal(compile(mma8_kernel(true, false, 85, 89)), FA_SUCCESS);
  assert_int_not_equal(compile(mma8_kernel(false, false, 84, 86)), FA_SUCCESS);
  expect_error("sm_89");
  assert_int_not_equal(compile(mma8_kernel(false, false, 83, 89)), FA_SUCCESS);
  expect_error("8.4");
  std::string k16 = mma8_kernel(false, false);
  k16.replace(k16.find("m16n8k32"), 8, "m16n8k16");
  assert_int_not_equal(compile(k16), FA_SUCCESS);
  std::string mixed = mma8_kernel(false, false);
  mixed.replace(mixed.find("e4m3.e4m3"), 9, "e4m3.f16");
  assert_int_not_equal(compile(mixed), FA_SUCCESS);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_conversions), cmocka_unit_test(test_fp8_errors),
      cmocka_unit_test(test_fp8_builder),     cmocka_unit_test(test_fp8_mma_layout),
      cmocka_unit_test(test_fp8_mma_errors),
  };
  return cmocka_run_group_tests_name("emulator_fp8", tests, emu_setup_sm<89>, emu_teardown);
}
