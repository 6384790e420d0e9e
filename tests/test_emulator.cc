// Tests of the PTX emulator backend through the Backend interface, with
// hand-written PTX: instruction semantics (integer wrap, shifts, prmt, f16/bf16
// rounding, unordered compares, ...), memory spaces, collectives, and the
// faults it must report (out of bounds, misalignment, deadlock, divergent
// shfl.sync, runaway loops, parse errors) instead of crashing or hanging.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/ptx_ir.h"
#include "ptx/ptx.h"

// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}
// clang-format on

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

std::string ptx_line_text(int line) { return "PTX line " + std::to_string(line); }

struct OneBuf {
  uint64_t out;
};
struct TwoBuf {
  uint64_t a, b;
};
struct ThreeBuf {
  uint64_t a, b, c;
};

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ------------------------------------------------------------------ info ----

void test_info(void **) {
  const fa::DeviceInfo &in = g_be->info();
  assert_string_equal(in.name.c_str(), "flashattn PTX emulator");
  assert_int_equal(in.sm, 80);
  assert_int_equal(in.num_sms, 108);
  assert_int_equal(in.limits.smem_per_block_optin, 163 * 1024);
  assert_int_equal(in.driver_version, 0);
  assert_int_equal(g_be->kind(), FA_BACKEND_EMULATOR);
  std::unique_ptr<fa::Backend> b;
  assert_int_equal(fa::create_emulator_backend(75, &b), FA_ERROR_UNSUPPORTED);
  assert_int_equal(fa::create_emulator_backend(90, &b), FA_SUCCESS);
  assert_int_equal(b->info().limits.smem_per_block_optin, 227 * 1024);
  assert_int_equal(fa::create_emulator_backend(86, &b), FA_SUCCESS);
  assert_int_equal(b->info().limits.smem_per_block_optin, 99 * 1024);
}

// --------------------------------------------------------- integer ops ----

void test_integer_semantics(void **) {
  // One thread; x = 0x7fffffff and y = -7 come from the parameters so
  // nothing is a literal-only computation.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_int(.param .align 8 .b8 k_int_param[24])
{
  .reg .pred %p<8>;
  .reg .b16 %h<4>;
  .reg .b32 %r<64>;
  .reg .b64 %rd<32>;
  ld.param.u64 %rd1, [k_int_param+0];
  ld.param.u64 %rd2, [k_int_param+8];
  ld.param.s32 %r1, [k_int_param+16];
  ld.param.s32 %r2, [k_int_param+20];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  add.u32 %r3, %r1, 1;
  st.global.u32 [%rd1+0], %r3;
  mov.u32 %r4, 0;
  sub.u32 %r5, %r4, 1;
  st.global.u32 [%rd1+4], %r5;
  mov.u32 %r6, 65536;
  mul.lo.u32 %r7, %r6, %r6;
  st.global.u32 [%rd1+8], %r7;
  mul.hi.u32 %r7, %r5, %r5;
  st.global.u32 [%rd1+12], %r7;
  mul.hi.s32 %r7, %r2, %r1;
  st.global.u32 [%rd1+16], %r7;
  div.s32 %r7, %r2, 2;
  st.global.u32 [%rd1+20], %r7;
  rem.s32 %r7, %r2, 2;
  st.global.u32 [%rd1+24], %r7;
  div.u32 %r7, %r1, %r4;
  st.global.u32 [%rd1+28], %r7;
  rem.u32 %r7, %r1, %r4;
  st.global.u32 [%rd1+32], %r7;
  div.s32 %r7, %r3, -1;
  st.global.u32 [%rd1+36], %r7;
  mov.u32 %r8, 1;
  shl.b32 %r7, %r8, 33;
  st.global.u32 [%rd1+40], %r7;
  shl.b32 %r7, %r8, 31;
  st.global.u32 [%rd1+44], %r7;
  shr.s32 %r7, %r2, 40;
  st.global.u32 [%rd1+48], %r7;
  shr.u32 %r7, %r3, 31;
  st.global.u32 [%rd1+52], %r7;
  shr.u32 %r7, %r3, 32;
  st.global.u32 [%rd1+56], %r7;
  shr.s32 %r7, %r2, 1;
  st.global.u32 [%rd1+60], %r7;
  min.s32 %r7, %r2, 3;
  st.global.u32 [%rd1+64], %r7;
  min.u32 %r7, %r2, 3;
  st.global.u32 [%rd1+68], %r7;
  max.s32 %r7, %r2, 3;
  st.global.u32 [%rd1+72], %r7;
  max.u32 %r7, %r2, 3;
  st.global.u32 [%rd1+76], %r7;
  neg.s32 %r7, %r3;
  st.global.u32 [%rd1+80], %r7;
  abs.s32 %r7, %r2;
  st.global.u32 [%rd1+84], %r7;
  mov.b32 %r9, 0xf0f0;
  and.b32 %r7, %r9, 0xff00;
  st.global.u32 [%rd1+88], %r7;
  or.b32 %r7, %r9, 0xff00;
  st.global.u32 [%rd1+92], %r7;
  xor.b32 %r7, %r9, 0xff00;
  st.global.u32 [%rd1+96], %r7;
  not.b32 %r7, %r4;
  st.global.u32 [%rd1+100], %r7;
  mad.lo.s32 %r7, %r2, 3, 100;
  st.global.u32 [%rd1+104], %r7;
  mov.u32 %r10, 0x12345;
  cvt.u16.u32 %h1, %r10;
  cvt.u32.u16 %r7, %h1;
  st.global.u32 [%rd1+108], %r7;
  setp.lt.s32 %p1, %r2, 3;
  selp.b32 %r7, 11, 22, %p1;
  st.global.u32 [%rd1+112], %r7;
  setp.lt.u32 %p2, %r2, 3;
  selp.b32 %r7, 11, 22, %p2;
  st.global.u32 [%rd1+116], %r7;
  setp.hi.u32 %p3, %r2, 3;
  selp.b32 %r7, 11, 22, %p3;
  st.global.u32 [%rd1+120], %r7;
  rem.s32 %r7, %r3, -1;
  st.global.u32 [%rd1+124], %r7;
  div.s32 %r7, %r1, 0;
  st.global.u32 [%rd1+128], %r7;
  and.pred %p4, %p1, %p3;
  or.pred %p5, %p1, %p2;
  not.pred %p6, %p2;
  xor.pred %p7, %p5, %p6;
  selp.u32 %r7, 1, 0, %p4;
  selp.u32 %r11, 2, 0, %p5;
  add.u32 %r7, %r7, %r11;
  selp.u32 %r11, 4, 0, %p6;
  add.u32 %r7, %r7, %r11;
  selp.u32 %r11, 8, 0, %p7;
  add.u32 %r7, %r7, %r11;
  st.global.u32 [%rd1+132], %r7;

  mul.wide.s32 %rd3, %r2, 3;
  st.global.u64 [%rd2+0], %rd3;
  mov.u32 %r12, 2;
  mul.wide.u32 %rd3, %r5, %r12;
  st.global.u64 [%rd2+8], %rd3;
  cvt.s64.s32 %rd3, %r2;
  st.global.u64 [%rd2+16], %rd3;
  cvt.u64.u32 %rd3, %r2;
  st.global.u64 [%rd2+24], %rd3;
  mov.u64 %rd4, 1;
  shl.b64 %rd3, %rd4, 63;
  st.global.u64 [%rd2+32], %rd3;
  shr.s64 %rd5, %rd3, 70;
  st.global.u64 [%rd2+40], %rd5;
  shr.u64 %rd5, %rd3, 64;
  st.global.u64 [%rd2+48], %rd5;
  mov.u64 %rd6, 1000;
  mad.wide.s32 %rd5, %r2, 3, %rd6;
  st.global.u64 [%rd2+56], %rd5;
  mov.u64 %rd7, -1;
  add.s64 %rd5, %rd7, 2;
  st.global.u64 [%rd2+64], %rd5;
  mov.u64 %rd8, -21;
  div.s64 %rd5, %rd8, 4;
  st.global.u64 [%rd2+72], %rd5;
  mov.u64 %rd9, 0x100000005;
  cvt.s32.s64 %r13, %rd9;
  cvt.s64.s32 %rd5, %r13;
  st.global.u64 [%rd2+80], %rd5;
  mov.b32 %r14, 0x11111111;
  mov.b32 %r15, 0x22222222;
  mov.b64 %rd10, {%r14, %r15};
  st.global.u64 [%rd2+88], %rd10;
  mov.b64 {%r16, %r17}, %rd10;
  mov.b64 %rd11, {%r17, %r16};
  st.global.u64 [%rd2+96], %rd11;
  setp.lt.s64 %p1, %rd7, 0;
  selp.b64 %rd5, 100, 200, %p1;
  st.global.u64 [%rd2+104], %rd5;
  setp.lt.u64 %p1, %rd7, 0;
  selp.b64 %rd5, 100, 200, %p1;
  st.global.u64 [%rd2+112], %rd5;
  ret;
}
)";
  DevBuf o32(34 * 4), o64(15 * 8);
  struct {
    uint64_t a, b;
    int32_t x, y;
  } prm = {o32.ptr, o64.ptr, 0x7fffffff, -7};
  fa_status st = run_ptx(p, "k_int", geom(1, 1), &prm, sizeof prm);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  const uint32_t want32[34] = {0x80000000u, 0xffffffffu, 0u, 0xfffffffeu, 0xfffffffcu, 0xfffffffdu,
                               0xffffffffu, 0xffffffffu, 0x7fffffffu, 0x80000000u, 0u, 0x80000000u,
                               0xffffffffu, 1u, 0u, 0xfffffffcu, 0xfffffff9u, 3u, 3u, 0xfffffff9u,
                               0x80000000u, 7u, 0xf000u, 0xfff0u, 0x0ff0u, 0xffffffffu, 79u,
                               0x2345u, 11u, 22u, 11u, 0u, 0xffffffffu,
                               // p1=1 p2=0 p3=1: and=1, or=1, not p2=1, xor(1,1)=0 -> 1+2+4
                               7u};
  std::vector<uint32_t> g32 = o32.get<uint32_t>();
  for (int i = 0; i < 34; ++i) {
    if (g32[i] != want32[i])
      std::fprintf(stderr, "int result %d: 0x%08x != 0x%08x\n", i, g32[i], want32[i]);
    assert_int_equal(g32[i], want32[i]);
  }
  const uint64_t want64[15] = {static_cast<uint64_t>(-21),
                               0x1fffffffeull,
                               0xfffffffffffffff9ull,
                               0x00000000fffffff9ull,
                               0x8000000000000000ull,
                               ~0ull,
                               0,
                               979,
                               1,
                               static_cast<uint64_t>(-5),
                               5,
                               0x2222222211111111ull,
                               0x1111111122222222ull,
                               100,
                               200};
  std::vector<uint64_t> g64 = o64.get<uint64_t>();
  for (int i = 0; i < 15; ++i) {
    if (g64[i] != want64[i])
      std::fprintf(stderr, "int64 result %d: 0x%llx\n", i, (unsigned long long)g64[i]);
    assert_true(g64[i] == want64[i]);
  }
}

// ------------------------------------------------- f16 / bf16 rounding ----

// One thread per input: f16 and bf16 conversions, f16 -> f32 round trip.
void test_half_conversions(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_cvt(.param .align 8 .b8 k_cvt_param[32])
{
  .reg .b16 %h<4>;
  .reg .b32 %r<8>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [k_cvt_param+0];
  ld.param.u64 %rd2, [k_cvt_param+8];
  ld.param.u64 %rd3, [k_cvt_param+16];
  ld.param.u64 %rd4, [k_cvt_param+24];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd5, %r1, 4;
  add.s64 %rd6, %rd1, %rd5;
  ld.global.f32 %f1, [%rd6];
  mul.wide.u32 %rd7, %r1, 2;
  cvt.rn.f16.f32 %h1, %f1;
  add.s64 %rd8, %rd2, %rd7;
  st.global.b16 [%rd8], %h1;
  cvt.rn.bf16.f32 %h2, %f1;
  add.s64 %rd9, %rd3, %rd7;
  st.global.u16 [%rd9], %h2;
  cvt.f32.f16 %f2, %h1;
  add.s64 %rd10, %rd4, %rd5;
  st.global.f32 [%rd10], %f2;
}
)";
  struct Case {
    uint32_t in;
    uint16_t f16, bf16;
  };
  const Case cases[] = {
      {0x3f800000, 0x3c00, 0x3f80},  // 1
      {0xc0200000, 0xc100, 0xc020},  // -2.5
      {0x477fe000, 0x7bff, 0x4780},  // 65504 (f16 max)
      {0x477ff000, 0x7c00, 0x4780},  // 65520: tie -> even = inf
      {0x477fef00, 0x7bff, 0x4780},  // just below 65520
      {0x3f801000, 0x3c00, 0x3f80},  // 1 + 2^-11: f16 tie -> even (down)
      {0x3f803000, 0x3c02, 0x3f80},  // 1 + 3*2^-11: f16 tie -> even (up)
      {0x3f808000, 0x3c04, 0x3f80},  // 1 + 2^-8: bf16 tie -> even (down)
      {0x3f818000, 0x3c0c, 0x3f82},  // 1 + 3*2^-8: bf16 tie -> even (up)
      {0x33800000, 0x0001, 0x3380},  // 2^-24: smallest f16 subnormal
      {0x33000000, 0x0000, 0x3300},  // 2^-25: tie -> 0
      {0x33000001, 0x0001, 0x3300},  // just above 2^-25
      {0x33c00000, 0x0002, 0x33c0},  // 1.5 * 2^-24: tie -> 2
      {0xb8000000, 0x8200, 0xb800},  // -2^-15: f16 subnormal
      {0x7fc00000, 0x7fff, 0x7fff},  // NaN
      {0xff800000, 0xfc00, 0xff80},  // -inf
      {0x80000000, 0x8000, 0x8000},  // -0
      {0x7f7fffff, 0x7c00, 0x7f80},  // f32 max: both overflow
      {0x00000001, 0x0000, 0x0000},  // f32 subnormal
      {0x00018000, 0x0000, 0x0002},  // f32 subnormal, bf16 tie -> even (up)
      {0x48000000, 0x7c00, 0x4800},  // 131072
      {0x3dcccccd, 0x2e66, 0x3dcd},  // 0.1
  };
  const int n = sizeof cases / sizeof cases[0];
  DevBuf in(n * 4), h(n * 2), b(n * 2), back(n * 4);
  std::vector<uint32_t> inv;
  for (const Case &c : cases) inv.push_back(c.in);
  in.put(inv);
  struct {
    uint64_t in, h, b, back;
  } prm = {in.ptr, h.ptr, b.ptr, back.ptr};
  assert_int_equal(run_ptx(p, "k_cvt", geom(1, n), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint16_t> gh = h.get<uint16_t>(), gb = b.get<uint16_t>();
  std::vector<uint32_t> gback = back.get<uint32_t>();
  for (int i = 0; i < n; ++i) {
    if (gh[i] != cases[i].f16 || gb[i] != cases[i].bf16)
      std::fprintf(stderr, "case %d (0x%08x): f16 0x%04x bf16 0x%04x\n", i, cases[i].in, gh[i],
                   gb[i]);
    assert_int_equal(gh[i], cases[i].f16);
    assert_int_equal(gb[i], cases[i].bf16);
  }
  // f16 -> f32 is exact.
  assert_int_equal(gback[0], 0x3f800000u);
  assert_int_equal(gback[9], 0x33800000u);   // subnormal 2^-24
  assert_int_equal(gback[13], 0xb8000000u);  // -2^-15
  assert_int_equal(gback[3], 0x7f800000u);   // inf
  assert_true(std::isnan(bitsf(gback[14])));
  assert_int_equal(gback[21], 0x3dccc000u);  // 0x2e66
  assert_int_equal(gback[16], 0x80000000u);  // -0
}

// --------------------------------------------------------- f32 semantics ----

void test_float_semantics(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_f(.param .align 8 .b8 k_f_param[8])
{
  .reg .pred %p<4>;
  .reg .b16 %h<4>;
  .reg .b32 %r<16>;
  .reg .f32 %f<32>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_f_param+0];
  // fma rounds once: (1+2^-12)^2 - (1+2^-11) = 2^-24; mul+add gives 0.
  mov.f32 %f1, 0f3F800800;
  mov.f32 %f2, 0f3F800800;
  fma.rn.f32 %f3, %f1, %f2, 0fBF801000;
  st.global.f32 [%rd1+0], %f3;
  mul.rn.f32 %f4, %f1, %f2;
  add.rn.f32 %f4, %f4, 0fBF801000;
  st.global.f32 [%rd1+4], %f4;
  // subnormals: kept without .ftz, flushed (sign kept) with it.
  mov.b32 %f5, 0x80000001;
  add.f32 %f6, %f5, 0f00000000;
  st.global.f32 [%rd1+8], %f6;
  mul.ftz.f32 %f6, %f5, 0f3F800000;
  st.global.f32 [%rd1+12], %f6;
  ex2.approx.f32 %f7, 0f3F800000;
  st.global.f32 [%rd1+16], %f7;
  ex2.approx.f32 %f7, 0fFF800000;
  st.global.f32 [%rd1+20], %f7;
  ex2.approx.f32 %f7, 0fC3020000;
  st.global.f32 [%rd1+24], %f7;
  ex2.approx.ftz.f32 %f7, 0fC3020000;
  st.global.f32 [%rd1+28], %f7;
  lg2.approx.f32 %f8, 0f41000000;
  st.global.f32 [%rd1+32], %f8;
  lg2.approx.f32 %f8, 0f00000000;
  st.global.f32 [%rd1+36], %f8;
  // compares with NaN: bit k of the word is one compare.
  mov.f32 %f9, 0f7FC00000;
  mov.u32 %r1, 0;
  setp.lt.f32 %p1, %f9, 0f3F800000;
  selp.u32 %r2, 1, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.ltu.f32 %p1, %f9, 0f3F800000;
  selp.u32 %r2, 2, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.nan.f32 %p1, %f9, 0f3F800000;
  selp.u32 %r2, 4, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.num.f32 %p1, %f9, 0f3F800000;
  selp.u32 %r2, 8, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.neu.f32 %p1, %f1, %f1;
  selp.u32 %r2, 16, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.ne.f32 %p1, %f9, 0f3F800000;
  selp.u32 %r2, 32, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.equ.f32 %p1, %f9, %f9;
  selp.u32 %r2, 64, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.geu.f32 %p1, 0f3F800000, 0f40000000;
  selp.u32 %r2, 128, 0, %p1;
  or.b32 %r1, %r1, %r2;
  setp.le.f32 %p1, %f1, %f1;
  selp.u32 %r2, 256, 0, %p1;
  or.b32 %r1, %r1, %r2;
  st.global.u32 [%rd1+40], %r1;
  min.f32 %f10, %f9, 0f3F800000;
  st.global.f32 [%rd1+44], %f10;
  max.f32 %f10, 0f80000000, 0f00000000;
  st.global.f32 [%rd1+48], %f10;
  cvt.rni.s32.f32 %r3, 0f40200000;
  st.global.s32 [%rd1+52], %r3;
  cvt.rni.s32.f32 %r3, 0f40600000;
  st.global.s32 [%rd1+56], %r3;
  cvt.rni.s32.f32 %r3, 0fC0200000;
  st.global.s32 [%rd1+60], %r3;
  cvt.rzi.s32.f32 %r3, 0fC02CCCCD;
  st.global.s32 [%rd1+64], %r3;
  cvt.rzi.s32.f32 %r3, 0f4F32D05E;
  st.global.s32 [%rd1+68], %r3;
  cvt.rzi.s32.f32 %r3, %f9;
  st.global.s32 [%rd1+72], %r3;
  mov.u32 %r4, 16777217;
  cvt.rn.f32.s32 %f11, %r4;
  st.global.f32 [%rd1+76], %f11;
  mov.u32 %r4, -1;
  cvt.rn.f32.u32 %f11, %r4;
  st.global.f32 [%rd1+80], %f11;
  div.rn.f32 %f12, 0f3F800000, 0f40400000;
  st.global.f32 [%rd1+84], %f12;
  rcp.rn.f32 %f12, 0f40400000;
  st.global.f32 [%rd1+88], %f12;
  sqrt.rn.f32 %f12, 0f40000000;
  st.global.f32 [%rd1+92], %f12;
  neg.f32 %f13, 0f00000000;
  st.global.f32 [%rd1+96], %f13;
  abs.f32 %f13, 0f80000000;
  st.global.f32 [%rd1+100], %f13;
  cvt.rn.f16x2.f32 %r5, 0f3F800000, 0f40000000;
  st.global.b32 [%rd1+104], %r5;
  // bf16 -> f32 the generators' way: u16 -> u32, << 16, reinterpret.
  mov.b16 %h1, 0x3FC0;
  cvt.u32.u16 %r6, %h1;
  shl.b32 %r6, %r6, 16;
  mov.b32 %f14, %r6;
  add.f32 %f14, %f14, 0f3F800000;
  st.global.f32 [%rd1+108], %f14;
  tanh.approx.f32 %f15, 0f3F800000;
  st.global.f32 [%rd1+112], %f15;
  cvt.rmi.s32.f32 %r3, 0fC0200000;
  st.global.s32 [%rd1+116], %r3;
  lg2.approx.f32 %f8, 0fBF800000;
  st.global.f32 [%rd1+120], %f8;
  exit;
}
)";
  DevBuf o(31 * 4);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_f", geom(1, 1), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  assert_int_equal(g[0], 0x33800000u);  // 2^-24
  assert_int_equal(g[1], 0x00000000u);
  assert_int_equal(g[2], 0x80000001u);  // subnormal kept
  assert_int_equal(g[3], 0x80000000u);  // flushed, sign kept
  assert_int_equal(g[4], fbits(2.0f));
  assert_int_equal(g[5], 0u);
  assert_int_equal(g[6], 0x00080000u);  // 2^-130, subnormal
  assert_int_equal(g[7], 0u);           // flushed
  assert_int_equal(g[8], fbits(3.0f));
  assert_int_equal(g[9], 0xff800000u);  // lg2(0) = -inf
  // lt=0 ltu=1 nan=1 num=0 neu(x,x)=0 ne(NaN)=0 equ(NaN,NaN)=1 geu(1,2)=0 le(x,x)=1
  assert_int_equal(g[10], 2u | 4u | 64u | 256u);
  assert_int_equal(g[11], fbits(1.0f));               // min(NaN, 1) = 1
  assert_int_equal(g[12], 0u);                        // max(-0, +0) = +0
  assert_int_equal(static_cast<int32_t>(g[13]), 2);   // rni 2.5
  assert_int_equal(static_cast<int32_t>(g[14]), 4);   // rni 3.5
  assert_int_equal(static_cast<int32_t>(g[15]), -2);  // rni -2.5
  assert_int_equal(static_cast<int32_t>(g[16]), -2);  // rzi -2.7
  assert_int_equal(g[17], 0x7fffffffu);               // rzi 3e9 saturates
  assert_int_equal(g[18], 0u);                        // NaN -> 0
  assert_int_equal(g[19], 0x4b800000u);               // 16777217 -> 16777216
  assert_int_equal(g[20], 0x4f800000u);               // 2^32 - 1 -> 2^32
  assert_int_equal(g[21], 0x3eaaaaabu);
  assert_int_equal(g[22], 0x3eaaaaabu);
  assert_int_equal(g[23], 0x3fb504f3u);
  assert_int_equal(g[24], 0x80000000u);
  assert_int_equal(g[25], 0u);
  assert_int_equal(g[26], 0x3c004000u);  // first source in the high half
  assert_int_equal(g[27], fbits(2.5f));  // bf16 0x3fc0 = 1.5
  assert_true(std::fabs(bitsf(g[28]) - 0.7615942f) < 1e-3f);
  assert_int_equal(static_cast<int32_t>(g[29]), -3);  // rmi -2.5
  assert_true(std::isnan(bitsf(g[30])));              // lg2(-1)
}

// fma.rn.f32 on random operands (random bit patterns: subnormals, inf, NaN,
// and cancelling c = -a*b) must match the host's correctly rounded fmaf.
void test_fma_random(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_fma(.param .align 8 .b8 k_fma_param[16])
{
  .reg .b32 %r<4>;
  .reg .f32 %f<8>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_fma_param+0];
  ld.param.u64 %rd2, [k_fma_param+8];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %tid.x;
  mad.lo.s32 %r3, %r1, 256, %r2;
  mul.wide.u32 %rd3, %r3, 12;
  add.s64 %rd4, %rd1, %rd3;
  ld.global.f32 %f1, [%rd4];
  ld.global.f32 %f2, [%rd4+4];
  ld.global.f32 %f3, [%rd4+8];
  fma.rn.f32 %f4, %f1, %f2, %f3;
  mul.wide.u32 %rd5, %r3, 4;
  add.s64 %rd6, %rd2, %rd5;
  st.global.f32 [%rd6], %f4;
}
)";
  const int n = 64 * 256;
  std::vector<uint32_t> in(3 * n);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&x]() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) {
      uint32_t r = static_cast<uint32_t>(next());
      // Mostly moderate exponents (so products and sums interact), some raw bits.
      if (next() % 8) r = (r & 0x807fffffu) | ((100u + static_cast<uint32_t>(next() % 56)) << 23);
      in[3 * i + k] = r;
    }
    if (i % 4 == 0) in[3 * i + 2] = fbits(-(bitsf(in[3 * i]) * bitsf(in[3 * i + 1])));
  }
  DevBuf din(in.size() * 4), dout(n * 4);
  din.put(in);
  TwoBuf prm = {din.ptr, dout.ptr};
  assert_int_equal(run_ptx(p, "k_fma", geom(64, 256), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = dout.get<uint32_t>();
  for (int i = 0; i < n; ++i) {
    float want = std::fma(bitsf(in[3 * i]), bitsf(in[3 * i + 1]), bitsf(in[3 * i + 2]));
    if (std::isnan(want)) {
      assert_true(std::isnan(bitsf(g[i])));
    } else {
      assert_int_equal(g[i], fbits(want));
    }
  }
}

// ------------------------------------------------- loops and predicates ----

void test_loop_predicated(void **) {
  // out[tid] = sum of odd i in [0, 10*tid), via a guarded add and a
  // guarded backward branch.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_loop(.param .align 8 .b8 k_loop_param[8])
.maxntid 64, 1, 1
{
  .reg .pred %p<3>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_loop_param+0];
  mov.u32 %r1, %tid.x;
  mul.lo.s32 %r2, %r1, 10;
  mov.u32 %r3, 0;
  mov.u32 %r4, 0;
  setp.eq.s32 %p1, %r2, 0;
  @%p1 bra $L_done;
$L_top:
  and.b32 %r5, %r3, 1;
  setp.ne.s32 %p2, %r5, 0;
  @%p2 add.s32 %r4, %r4, %r3;
  add.s32 %r3, %r3, 1;
  setp.lt.s32 %p1, %r3, %r2;
  @%p1 bra.uni $L_top;
$L_done:
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r4;
}
)";
  DevBuf o(64 * 4);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_loop", geom(1, 64), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  for (uint32_t t = 0; t < 64; ++t) {
    uint32_t want = 0;
    for (uint32_t i = 1; i < 10 * t; i += 2) want += i;
    assert_int_equal(g[t], want);
  }
  // .maxntid 64 forbids 128 threads.
  assert_int_equal(run_ptx(p, "k_loop", geom(1, 128), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("maxntid");
}

// ------------------------------------------------------- global vectors ----

void test_global_vectors(void **) {
  // Each thread: v4.f32 load, scale, v4 store; v2.u32 swap; u16 and u64.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_vec(.param .align 8 .b8 k_vec_param[24])
{
  .reg .b16 %h<2>;
  .reg .b32 %r<8>;
  .reg .f32 %f<8>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [k_vec_param+0];
  ld.param.u64 %rd2, [k_vec_param+8];
  ld.param.u64 %rd3, [k_vec_param+16];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd4, %r1, 16;
  add.s64 %rd5, %rd1, %rd4;
  ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd5];
  mul.f32 %f1, %f1, 0f40000000;
  mul.f32 %f2, %f2, 0f40400000;
  add.f32 %f3, %f3, %f4;
  add.s64 %rd6, %rd2, %rd4;
  st.global.v4.f32 [%rd6], {%f4, %f3, %f2, %f1};
  ld.global.v2.u32 {%r2, %r3}, [%rd5+0];
  st.global.v2.b32 [%rd6+16384], {%r3, %r2};
  ld.global.u16 %h1, [%rd5+2];
  cvt.u32.u16 %r4, %h1;
  mul.wide.u32 %rd7, %r1, 8;
  add.s64 %rd8, %rd3, %rd7;
  ld.global.u64 %rd9, [%rd5+8];
  add.s64 %rd9, %rd9, 1;
  st.global.u64 [%rd8], %rd9;
  st.global.u32 [%rd8+2048], %r4;
}
)";
  const int n = 256;
  DevBuf in(n * 16), out(n * 16 + 16384), o64(n * 8 + 2048 + n * 4);
  std::vector<float> inv(n * 4);
  for (int i = 0; i < n * 4; ++i) inv[i] = 0.25f * static_cast<float>(i) - 7.0f;
  in.put(inv);
  ThreeBuf prm = {in.ptr, out.ptr, o64.ptr};
  assert_int_equal(run_ptx(p, "k_vec", geom(1, n), &prm, sizeof prm), FA_SUCCESS);
  std::vector<float> g = out.get<float>();
  std::vector<uint32_t> gu = out.get<uint32_t>();
  std::vector<uint8_t> graw = o64.get<uint8_t>();
  for (int t = 0; t < n; ++t) {
    const float *x = &inv[t * 4];
    assert_true(g[t * 4 + 0] == x[3]);
    assert_true(g[t * 4 + 1] == x[2] + x[3]);
    assert_true(g[t * 4 + 2] == x[1] * 3.0f);
    assert_true(g[t * 4 + 3] == x[0] * 2.0f);
    assert_int_equal(gu[4096 + t * 4 + 0], fbits(x[1]));
    assert_int_equal(gu[4096 + t * 4 + 1], fbits(x[0]));
    uint64_t v64;
    std::memcpy(&v64, &inv[t * 4 + 2], 8);
    uint64_t got64;
    std::memcpy(&got64, &graw[t * 8], 8);
    assert_true(got64 == v64 + 1);
    uint32_t hi16 = fbits(x[0]) >> 16, got16;
    std::memcpy(&got16, &graw[2048 + t * 8], 4);
    assert_int_equal(got16, hi16);
  }
}

// ------------------------------------------- shared memory and bar.sync ----

const char *kSharedKernel = R"(
.visible .entry k_smem(.param .align 8 .b8 k_smem_param[8])
{
  .reg .pred %p<2>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b8 buf[512];
  ld.param.u64 %rd1, [k_smem_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, buf;
  shl.b32 %r3, %r1, 2;
  add.s32 %r4, %r2, %r3;
  mad.lo.s32 %r5, %r1, 3, 1;
  st.shared.u32 [%r4], %r5;
  bar.sync 0;
  add.s32 %r6, %r1, 32;
  and.b32 %r6, %r6, 127;
  shl.b32 %r6, %r6, 2;
  ld.shared.u32 %r7, [buf+%r6];
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r7;
}
)";

void test_shared_bar_sync(void **) {
  // 4 warps: each thread writes smem[tid], bar.sync, reads the slot written
  // by the next warp.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_smem(.param .align 8 .b8 k_smem_param[8])
{
  .reg .pred %p<2>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b8 pad[12];
  .shared .align 16 .b8 buf[512];
  ld.param.u64 %rd1, [k_smem_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, buf;
  shl.b32 %r3, %r1, 2;
  add.s32 %r4, %r2, %r3;
  mad.lo.s32 %r5, %r1, 3, 1;
  st.shared.u32 [%r4], %r5;
  st.shared.u32 [pad+8], %r5;
  bar.sync 0;
  add.s32 %r6, %r1, 32;
  and.b32 %r6, %r6, 127;
  shl.b32 %r6, %r6, 2;
  add.s32 %r6, %r6, %r2;
  ld.shared.u32 %r7, [%r6];
  barrier.sync 0;
  st.shared.u32 [%r4], %r7;
  bar.sync 0;
  ld.shared.u32 %r8, [buf+0];
  add.s32 %r7, %r7, %r8;
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r7;
  st.global.u32 [%rd3+512], %r2;
}
)";
  DevBuf o(128 * 4 * 2);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_smem", geom(2, 128), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  // After the second phase smem[0] holds what thread 0 read: 32*3+1.
  for (uint32_t t = 0; t < 128; ++t) {
    assert_int_equal(g[t], ((t + 32) % 128) * 3 + 1 + (32 * 3 + 1));
    assert_int_equal(g[128 + t], 16u);  // buf is placed after pad[12], aligned to 16
  }
  (void)kSharedKernel;
}

// ------------------------------------------------------------- shfl.sync ----

void test_shfl(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_shfl(.param .align 8 .b8 k_shfl_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<24>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_shfl_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r20, %laneid;
  mad.lo.s32 %r2, %r1, 100, 7;
  shfl.sync.bfly.b32 %r3, %r2, 5, 31, -1;
  shfl.sync.up.b32 %r4|%p1, %r2, 3, 0, 0xffffffff;
  shfl.sync.down.b32 %r5|%p2, %r2, 4, 0x1f, -1;
  mul.lo.s32 %r10, %r20, 7;
  and.b32 %r10, %r10, 31;
  shfl.sync.idx.b32 %r6, %r2, %r10, 0x1f, -1;
  shfl.sync.idx.b32 %r7, %r2, 2, 0x181f, -1;
  bar.warp.sync -1;
  selp.u32 %r8, 1, 0, %p1;
  selp.u32 %r9, 2, 0, %p2;
  or.b32 %r8, %r8, %r9;
  mul.wide.u32 %rd2, %r1, 24;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3+0], %r3;
  st.global.u32 [%rd3+4], %r4;
  st.global.u32 [%rd3+8], %r5;
  st.global.u32 [%rd3+12], %r6;
  st.global.u32 [%rd3+16], %r7;
  st.global.u32 [%rd3+20], %r8;
}
)";
  DevBuf o(64 * 24);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_shfl", geom(1, 64), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  for (uint32_t t = 0; t < 64; ++t) {
    uint32_t lane = t % 32, w = t - lane;
    auto val = [&](uint32_t l) { return (w + l) * 100 + 7; };
    const uint32_t *r = &g[t * 6];
    assert_int_equal(r[0], val(lane ^ 5));
    assert_int_equal(r[1], lane >= 3 ? val(lane - 3) : val(lane));
    assert_int_equal(r[2], lane + 4 <= 31 ? val(lane + 4) : val(lane));
    assert_int_equal(r[3], val((lane * 7) % 32));
    assert_int_equal(r[4], val((lane & ~7u) | 2));  // 8-lane segments
    assert_int_equal(r[5], (lane >= 3 ? 1u : 0u) | (lane + 4 <= 31 ? 2u : 0u));
  }
}

// vote.sync.any/all.pred over the full warp (PTX ISA "vote.sync"): per
// warp of 64 threads, "any lane == 5" is true in warp 0 only, "all lanes <
// 40" in warp 0 only; a vote half the warp never reaches is reported.
void test_vote(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_vote(.param .align 8 .b8 k_vote_param[8])
{
  .reg .pred %p<6>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_vote_param+0];
  mov.u32 %r1, %tid.x;
  setp.eq.u32 %p1, %r1, 5;
  vote.sync.any.pred %p2, %p1, 0xffffffff;
  setp.lt.u32 %p3, %r1, 40;
  vote.sync.all.pred %p4, %p3, 0xffffffff;
  selp.u32 %r2, 1, 0, %p2;
  selp.u32 %r3, 2, 0, %p4;
  or.b32 %r2, %r2, %r3;
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r2;
}
)";
  DevBuf o(64 * 4);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_vote", geom(1, 64), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  for (uint32_t t = 0; t < 64; ++t) assert_int_equal(g[t], t < 32 ? 3u : 0u);
  std::string div = std::string(kHeader) + R"(
.visible .entry k_vote(.param .align 8 .b8 k_vote_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<4>;
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 16;
  @!%p1 bra L_done;
  vote.sync.any.pred %p2, %p1, 0xffffffff;
L_done:
  exit;
}
)";
  assert_int_equal(run_ptx(div, "k_vote", geom(1, 32), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("vote.sync.any.pred");
  expect_error("did not arrive");
}

// --------------------------------------------------------- dynamic smem ----

void test_dynamic_shared(void **) {
  // A static array and .extern dynamic memory do not overlap; the dynamic
  // size comes from the launch. Each thread writes dyn[tid] and reads
  // dyn[n-1-tid].
  std::string p = std::string(kHeader) + R"(
.extern .shared .align 16 .b8 dyn[];
.visible .entry k_dyn(.param .align 8 .b8 k_dyn_param[8])
{
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b8 stat[40];
  ld.param.u64 %rd1, [k_dyn_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, dyn;
  shl.b32 %r4, %r1, 2;
  add.s32 %r5, %r3, %r4;
  add.s32 %r6, %r1, 1000;
  st.shared.u32 [%r5], %r6;
  st.shared.u32 [stat+36], 77;
  bar.sync 0;
  sub.s32 %r7, %r2, %r1;
  sub.s32 %r7, %r7, 1;
  shl.b32 %r7, %r7, 2;
  add.s32 %r7, %r3, %r7;
  ld.shared.u32 %r8, [%r7];
  ld.shared.u32 %r9, [stat+36];
  add.s32 %r8, %r8, %r9;
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r8;
  st.global.u32 [%rd3+1024], %r3;
}
)";
  const uint32_t n = 256;
  DevBuf o(2048);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_dyn", geom(1, n, n * 4), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = o.get<uint32_t>();
  for (uint32_t t = 0; t < n; ++t) {
    assert_int_equal(g[t], (n - 1 - t) + 1000 + 77);
    assert_int_equal(g[256 + t], 48u);  // after stat[40], aligned to 16
  }
  // Too little dynamic memory: the last threads write out of bounds.
  assert_int_equal(run_ptx(p, "k_dyn", geom(1, n, n * 2), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("out-of-bounds shared address");
  expect_error(ptx_line_text(line_of(p, "st.shared.u32 [%r5]")).c_str());
}

// ------------------------------------------------------------ memcheck ----

void test_global_oob(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_oob(.param .align 8 .b8 k_oob_param[16])
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_oob_param+0];
  ld.param.u64 %rd2, [k_oob_param+8];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mad.lo.s32 %r3, %r2, 32, %r1;
  mul.wide.u32 %rd3, %r3, 4;
  add.s64 %rd4, %rd1, %rd3;
  ld.global.u32 %r4, [%rd4];
  add.s64 %rd5, %rd2, %rd3;
  st.global.u32 [%rd5], %r4;
}
)";
  // in has 100 elements: block 3 (threads 96..127) reads past its end.
  DevBuf in(100 * 4), out(128 * 4);
  TwoBuf prm = {in.ptr, out.ptr};
  assert_int_equal(run_ptx(p, "k_oob", geom(4, 32), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("ld.global.u32");
  expect_error(ptx_line_text(line_of(p, "ld.global.u32 %r4")).c_str());
  expect_error("out-of-bounds");
  expect_error("thread (4,0,0) block (3,0,0)");  // first faulting thread: 3*32+4 = 100
  expect_error("starts 0 bytes after the end of allocation 0x");
  // Within bounds (3 blocks) it works and every element is copied.
  std::vector<uint32_t> v(100);
  for (uint32_t i = 0; i < 100; ++i) v[i] = i * 7 + 1;
  in.put(v);
  assert_int_equal(run_ptx(p, "k_oob", geom(3, 32), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> g = out.get<uint32_t>();
  for (uint32_t i = 0; i < 96; ++i) assert_int_equal(g[i], i * 7 + 1);
  for (uint32_t i = 96; i < 128; ++i) assert_int_equal(g[i], 0xABABABABu);
  // A freed buffer is no longer accessible.
  uint64_t tmp;
  assert_int_equal(g_be->mem_alloc(4096, &tmp), FA_SUCCESS);
  assert_int_equal(g_be->mem_free(tmp), FA_SUCCESS);
  TwoBuf prm2 = {tmp, out.ptr};
  fa_status st = run_ptx(p, "k_oob", geom(1, 32), &prm2, sizeof prm2);
  assert_int_equal(st, FA_ERROR_LAUNCH);
}

// An entry `name` taking two u64 parameters (%rd1, %rd2), with a 16-byte
// shared buffer whose address is in %r2, running body.
std::string two_pointer_kernel(const std::string &name, const std::string &body) {
  return std::string(kHeader) + ".visible .entry " + name + "(.param .align 8 .b8 " + name +
         "_param[16])\n{\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<4>;\n"
         "  .shared .align 16 .b8 buf[16];\n  ld.param.u64 %rd1, [" +
         name + "_param+0];\n  ld.param.u64 %rd2, [" + name + "_param+8];\n  mov.u32 %r2, buf;\n" +
         body + "\n}\n";
}

// A programmatic dependent launch (LaunchGeometry::programmatic): the
// previous kernel may still run, so a thread's global access before its
// griddepcontrol.wait is an error naming the instruction (ld, st, atom,
// cp.async); after the wait, and in an ordinary launch, the same copy runs.
// griddepcontrol.launch_dependents is accepted anywhere.
void test_griddepcontrol(void **) {
  auto kernel = [](const char *before, const char *after) {
    return two_pointer_kernel("k_pdl", std::string("  griddepcontrol.launch_dependents;\n  ") +
                                           before + "\n  griddepcontrol.wait;\n  " + after +
                                           "\n  ld.global.u32 %r1, [%rd1];\n"
                                           "  st.global.u32 [%rd2], %r1;");
  };
  DevBuf in(64), out(64);
  in.put(std::vector<uint32_t>(16, 7u));
  TwoBuf prm = {in.ptr, out.ptr};
  fa::LaunchGeometry g = geom(2, 32);
  for (const char *early :
       {"ld.global.u32 %r3, [%rd1];", "st.global.u32 [%rd2], %r2;",
        "atom.global.add.u32 %r3, [%rd2], 1;", "cp.async.ca.shared.global [%r2], [%rd1], 4;"}) {
    const std::string p = kernel(early, "");
    g.programmatic = true;
    assert_int_equal(run_ptx(p, "k_pdl", g, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("before griddepcontrol.wait");
    expect_error(ptx_line_text(line_of(p, early)).c_str());
    g.programmatic = false;  // an ordinary launch: no predecessor to wait for
    assert_int_equal(run_ptx(p, "k_pdl", g, &prm, sizeof prm), FA_SUCCESS);
    const std::string q = kernel("", early);
    g.programmatic = true;
    assert_int_equal(run_ptx(q, "k_pdl", g, &prm, sizeof prm), FA_SUCCESS);
  }
  assert_int_equal(out.get<uint32_t>()[0], 7u);
}

// An address within an access's size of 2^64 (device data such as a k_ptrs
// entry can hold one) is out of bounds, also right after an access to a
// live buffer (the allocation the checker last hit): addr + size wraps to a
// small number there, which once read as inside that buffer and
// dereferenced the address.
void test_global_wrap(void **) {
  // Reads the live buffer (param 0), then 4 bytes at param 1 by `access`.
  auto kernel = [](const char *access) {
    return two_pointer_kernel("k_wrap", std::string("  ld.global.u32 %r1, [%rd1];\n  ") + access);
  };
  DevBuf in(64);
  for (const char *access :
       {"ld.global.u32 %r3, [%rd2];", "cp.async.ca.shared.global [%r2], [%rd2], 4;"}) {
    for (uint64_t bad : {~uint64_t(0) - 3, ~uint64_t(0) - 15}) {
      TwoBuf prm = {in.ptr, bad};
      assert_int_equal(run_ptx(kernel(access), "k_wrap", geom(1, 1), &prm, sizeof prm),
                       FA_ERROR_LAUNCH);
      expect_error("out-of-bounds");
    }
  }
}

void test_misaligned(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_mis(.param .align 8 .b8 k_mis_param[8])
{
  .reg .b32 %r<4>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_mis_param+0];
  ld.global.v2.f32 {%f1, %f2}, [%rd1+4];
  st.global.f32 [%rd1+8], %f1;
}
)";
  DevBuf o(64);
  OneBuf prm = {o.ptr};
  assert_int_equal(run_ptx(p, "k_mis", geom(1, 1), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("misaligned global address");
  expect_error("ld.global.v2.f32");
  expect_error(ptx_line_text(line_of(p, "ld.global.v2.f32")).c_str());
  // A misaligned shared access too.
  std::string q = std::string(kHeader) + R"(
.visible .entry k_mis2()
{
  .reg .b32 %r<4>;
  .shared .align 8 .b8 s[64];
  mov.u32 %r1, s;
  st.shared.u32 [%r1+2], %r1;
}
)";
  assert_int_equal(run_ptx(q, "k_mis2", geom(1, 1), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("misaligned shared address");
}

void test_shared_oob(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_soob()
{
  .reg .b32 %r<4>;
  .shared .align 4 .b8 s[128];
  mov.u32 %r1, %tid.x;
  shl.b32 %r2, %r1, 2;
  st.shared.u32 [s+%r2], %r1;
}
)";
  // [NAME+reg] is not PTX; check the reg form instead.
  std::string q = std::string(kHeader) + R"(
.visible .entry k_soob()
{
  .reg .b32 %r<4>;
  .shared .align 4 .b8 s[128];
  mov.u32 %r1, %tid.x;
  shl.b32 %r2, %r1, 2;
  mov.u32 %r3, s;
  add.s32 %r3, %r3, %r2;
  st.shared.u32 [%r3], %r1;
}
)";
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(g_be->compile(p, &bin, &log), FA_ERROR_COMPILE);
  assert_int_equal(run_ptx(q, "k_soob", geom(1, 32), nullptr, 0), FA_SUCCESS);
  assert_int_equal(run_ptx(q, "k_soob", geom(1, 33), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("out-of-bounds shared address 128 (4 bytes)");
  expect_error("thread (32,0,0)");
  expect_error(ptx_line_text(line_of(q, "st.shared.u32 [%r3]")).c_str());
}

// ------------------------------------------------------ deadlocks etc. ----

void test_barrier_deadlock_exit(void **) {
  // Warp 3 exits; the others wait at bar.sync forever.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_dl()
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  mov.u32 %r1, %tid.x;
  setp.ge.u32 %p1, %r1, 96;
  @%p1 exit;
  bar.sync 0;
}
)";
  assert_int_equal(run_ptx(p, "k_dl", geom(2, 128), nullptr, 0), FA_ERROR_LAUNCH);
  std::string want = "barrier deadlock at " + ptx_line_text(line_of(p, "bar.sync 0")) +
                     ": 96 of 128 threads arrived (32 exited)";
  expect_error(want.c_str());
  expect_error("block (0,0,0)");
}

void test_barrier_skip(void **) {
  // Warps 2-3 skip the first bar.sync. Barrier 0 counts arrivals, so they
  // meet warps 0-1 at the second one (as on the GPU); then warps 0-1 wait at
  // the second bar.sync while 2-3 have exited.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_skip()
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  mov.u32 %r1, %tid.x;
  setp.ge.u32 %p1, %r1, 64;
  @%p1 bra $L_skip;
  bar.sync 0;
$L_skip:
  bar.sync 0; // second
}
)";
  assert_int_equal(run_ptx(p, "k_skip", geom(1, 128), nullptr, 0), FA_ERROR_LAUNCH);
  std::string want = "barrier deadlock at " + ptx_line_text(line_of(p, "bar.sync 0; // second")) +
                     ": 64 of 128 threads arrived (64 exited)";
  expect_error(want.c_str());
}

void test_shfl_half_warp(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_half()
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  mov.u32 %r1, %tid.x;
  setp.ge.u32 %p1, %r1, 16;
  @%p1 bra $L_out;
  shfl.sync.bfly.b32 %r2, %r1, 1, 31, 0xffffffff;
$L_out:
  ret;
}
)";
  assert_int_equal(run_ptx(p, "k_half", geom(1, 32), nullptr, 0), FA_ERROR_LAUNCH);
  std::string want = "shfl.sync.bfly.b32 at " + ptx_line_text(line_of(p, "shfl.sync.bfly")) +
                     ": lanes 16-31 of membermask 0xffffffff did not arrive (lanes 16-31 exited)";
  expect_error(want.c_str());
  // With membermask 0xffff it is fine.
  std::string q = p;
  q.replace(q.find("0xffffffff"), 10, "0x0000ffff");
  assert_int_equal(run_ptx(q, "k_half", geom(1, 32), nullptr, 0), FA_SUCCESS);
  // A guarded-off shfl.sync does not arrive either.
  std::string r = std::string(kHeader) + R"(
.visible .entry k_half2()
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 30;
  @%p1 shfl.sync.idx.b32 %r2, %r1, 0, 31, -1;
  bar.sync 0;
}
)";
  assert_int_equal(run_ptx(r, "k_half2", geom(1, 32), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("lanes 30-31 of membermask 0xffffffff did not arrive (lanes 30-31 wait at PTX line");
}

void test_step_budget(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_inf()
{
  .reg .b32 %r<4>;
  mov.u32 %r1, 0;
$L_top:
  add.s32 %r1, %r1, 1;
  bra $L_top;
}
)";
  setenv("FLASHATTN_EMU_MAX_STEPS", "2000000", 1);
  auto t0 = std::chrono::steady_clock::now();
  fa_status st = run_ptx(p, "k_inf", geom(4, 64), nullptr, 0);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("FLASHATTN_EMU_MAX_STEPS");
  assert_int_equal(st, FA_ERROR_LAUNCH);
  expect_error("instruction budget of 2000000 steps exhausted");
  expect_error("FLASHATTN_EMU_MAX_STEPS");
  assert_true(s < 5.0);
}

// ---------------------------------------------------------- parse errors ----

void expect_compile_error(const std::string &ptx, int line, const char *what) {
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(g_be->compile(ptx, &bin, &log), FA_ERROR_COMPILE);
  std::string want = "line " + std::to_string(line) + ": ";
  expect_error(want.c_str());
  expect_error(what);
  std::unique_ptr<fa::Kernel> k;
  assert_int_equal(g_be->load(ptx, bin, "k", 0, &k), FA_ERROR_COMPILE);
}

void test_parse_errors(void **) {
  std::string base = std::string(kHeader) + ".visible .entry k()\n{\n  .reg .b32 %r<4>;\n";
  // Line numbers: the header is 3 lines, then .entry (4), { (5), .reg (6).
  expect_compile_error(base + "  frobnicate.u32 %r1, %r2;\n}\n", 7, "unknown instruction");
  expect_compile_error(base + "  add.u32 %r1, %r2, %r9;\n}\n", 7, "undeclared register '%r9'");
  expect_compile_error(base + "  mov.u32 %r1, 0;\n  bra $L_nowhere;\n}\n", 8,
                       "undefined label '$L_nowhere'");
  expect_compile_error(base + "  add.u32 %r1, %r2;\n}\n", 7, "expected 3 operands, got 2");
  expect_compile_error(base + "  .reg .b64 %rd<2>;\n  add.u32 %r1, %r2, %rd1;\n}\n", 8,
                       "is 64-bit, expected 32-bit");
  expect_compile_error(base + "  ld.param.u32 %r1, [nope+0];\n}\n", 7, "undefined parameter");
  expect_compile_error(base + "  mov.u32 %r1, missing_sym;\n}\n", 7, "undefined symbol");
  expect_compile_error(base + "  add.u32 %r1, %r2, 1\n}\n", 8, "expected ',' or ';'");
  expect_compile_error(std::string(kHeader) +
                           ".visible .entry k(.param .align 8 .b8 k_param[8])\n"
                           "{\n  .reg .b32 %r<2>;\n  ld.param.u32 %r1, [k_param+8];\n}\n",
                       7, "outside parameter");
  // A kernel for a newer SM is refused by an sm_80 device.
  std::string sm90 = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n}\n";
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(g_be->compile(sm90, &bin, &log), FA_ERROR_COMPILE);
  expect_error("sm_90");
  // Unknown entry name at load.
  std::string ok = base + "  ret;\n}\n";
  assert_int_equal(g_be->compile(ok, &bin, &log), FA_SUCCESS);
  std::unique_ptr<fa::Kernel> k;
  assert_int_equal(g_be->load(ok, bin, "not_there", 0, &k), FA_ERROR_COMPILE);
  expect_error("no entry 'not_there'");
}

// ---------------------------------------------------------------- prmt ----

// prmt.b32 d, a, b, c in its default mode, modelled from the PTX ISA's
// description ("prmt"), not from the emulator: the eight bytes {b, a} are
// numbered 0 (a's lowest) to 7 (b's highest); byte i of d is chosen by
// nibble i of c: its low three bits pick the source byte, its top bit
// replaces the byte by its sign bit copied into all eight bits. c's bits 16
// and up play no part.
uint32_t prmt_ref(uint32_t a, uint32_t b, uint32_t c) {
  uint8_t src[8];
  for (int j = 0; j < 4; ++j) {
    src[j] = static_cast<uint8_t>(a >> (8 * j));
    src[4 + j] = static_cast<uint8_t>(b >> (8 * j));
  }
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (c >> (4 * i)) & 0xfu;
    uint8_t byte = src[sel & 7u];
    if (sel & 8u) byte = (byte & 0x80u) ? 0xffu : 0x00u;
    d |= uint32_t(byte) << (8 * i);
  }
  return d;
}

// Every 16-bit selector (so every nibble 0..15, sign-replicating ones
// included, in every byte position, with every combination of the other
// three) on random a and b (each byte's sign bit random) and random bits
// 16..31 of c, as a register; the v_frags_fp8 selectors 0x6420 / 0x7531 as
// immediates; a destination that is also the a source.
void test_prmt(void **) {
  // The host model against the ISA's own examples of the form.
  assert_int_equal(prmt_ref(0x03020100u, 0x07060504u, 0x7531u), 0x07050301u);
  assert_int_equal(prmt_ref(0x03020100u, 0x07060504u, 0x6420u), 0x06040200u);
  assert_int_equal(prmt_ref(0x00000080u, 0, 0x0008u), 0x808080ffu);
  const std::string p = std::string(kHeader) + R"(
.visible .entry k_prmt(.param .align 8 .b8 k_prmt_param[16])
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_prmt_param+0];
  ld.param.u64 %rd2, [k_prmt_param+8];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mad.lo.u32 %r1, %r2, 256, %r1;
  mul.wide.u32 %rd3, %r1, 12;
  add.s64 %rd3, %rd1, %rd3;
  ld.global.u32 %r3, [%rd3];
  ld.global.u32 %r4, [%rd3+4];
  ld.global.u32 %r5, [%rd3+8];
  prmt.b32 %r6, %r3, %r4, %r5;
  prmt.b32 %r7, %r3, %r4, 0x6420;
  prmt.b32 %r8, %r3, %r4, 0x7531;
  mov.b32 %r9, %r3;
  prmt.b32 %r9, %r9, %r4, %r5;
  mul.wide.u32 %rd4, %r1, 16;
  add.s64 %rd4, %rd2, %rd4;
  st.global.v4.b32 [%rd4], {%r6, %r7, %r8, %r9};
}
)";
  const uint32_t n = 65536;
  std::vector<uint32_t> in(3 * size_t(n));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // splitmix64
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<uint32_t>(z ^ (z >> 31));
  };
  for (uint32_t t = 0; t < n; ++t) {
    in[3 * t] = next();
    in[3 * t + 1] = next();
    in[3 * t + 2] = (next() & 0xffff0000u) | t;
  }
  DevBuf din(in.size() * 4), dout(size_t(n) * 16);
  din.put(in);
  TwoBuf prm = {din.ptr, dout.ptr};
  assert_int_equal(run_ptx(p, "k_prmt", geom(n / 256, 256), &prm, sizeof prm), FA_SUCCESS);
  const std::vector<uint32_t> out = dout.get<uint32_t>();
  int bad = 0;
  for (uint32_t t = 0; t < n; ++t) {
    const uint32_t a = in[3 * t], b = in[3 * t + 1], c = in[3 * t + 2];
    const uint32_t want[4] = {prmt_ref(a, b, c), prmt_ref(a, b, 0x6420u), prmt_ref(a, b, 0x7531u),
                              prmt_ref(a, b, c)};
    for (int i = 0; i < 4; ++i)
      if (out[4 * size_t(t) + i] != want[i] && bad++ < 10)
        std::fprintf(stderr, "prmt #%d a %08x b %08x c %08x: %08x, want %08x\n", i, a, b, c,
                     out[4 * size_t(t) + i], want[i]);
  }
  assert_int_equal(bad, 0);
}

// prmt's other modes (.f4e, .b4e, .rc8, .ecl, .ecr, .rc16) are not
// emulated: the parser refuses them by name; a type other than .b32 too.
void test_prmt_errors(void **) {
  const std::string base =
      std::string(kHeader) + ".visible .entry k()\n{\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<2>;\n";
  for (const char *mode : {"f4e", "b4e", "rc8", "ecl", "ecr", "rc16"})
    expect_compile_error(base + "  prmt.b32." + mode + " %r1, %r2, %r3, %r0;\n}\n", 8,
                         (std::string("unsupported modifier '.") + mode + "'").c_str());
  expect_compile_error(base + "  prmt.u32 %r1, %r2, %r3, %r0;\n}\n", 8, "prmt needs .b32");
  expect_compile_error(base + "  prmt.b64 %rd1, %rd0, %rd0, %rd0;\n}\n", 8, "prmt needs .b32");
  expect_compile_error(base + "  prmt.b32 %r1, %r2, %r3;\n}\n", 8, "expected 4 operands, got 3");
  // Control: the default mode compiles.
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(g_be->compile(base + "  prmt.b32 %r1, %r2, %r3, 0x3210;\n}\n", &bin, &log),
                   FA_SUCCESS);
}

// The builder's prmt (Op::Prmt, register and immediate selectors) and
// pack_b32 (mov.b32 d, {lo, hi}: lo the low half) as they print and as the
// emulator runs them, one thread on values read from memory.
void test_prmt_pack_builder(void **) {
  using fa::ptx::at;
  using fa::ptx::Builder;
  using fa::ptx::imm;
  using fa::ptx::Op;
  using fa::ptx::Reg;
  using fa::ptx::Space;
  using fa::ptx::Type;
  Builder b("k_pb", 16);
  Reg raw = b.b64(), in = b.b64(), out = b.b64();
  b.ld_param(Type::U64, raw, 0);
  b.cvta_to_global(in, raw);
  b.ld_param(Type::U64, raw, 8);
  b.cvta_to_global(out, raw);
  Reg ra = b.b32(), rb = b.b32(), rc = b.b32(), lo = b.b16(), hi = b.b16();
  b.ld(Space::Global, Type::B32, ra, at(in, 0));
  b.ld(Space::Global, Type::B32, rb, at(in, 4));
  b.ld(Space::Global, Type::B32, rc, at(in, 8));
  b.ld(Space::Global, Type::B16, lo, at(in, 12));
  b.ld(Space::Global, Type::B16, hi, at(in, 14));
  Reg d[5] = {b.b32(), b.b32(), b.b32(), b.b32(), b.b32()};
  b.op(Op::Prmt, Type::B32, d[0], ra, rb, rc);
  b.op(Op::Prmt, Type::B32, d[1], ra, rb, imm(0x6420));
  b.op(Op::Prmt, Type::B32, d[2], ra, rb, imm(0x7531));
  b.pack_b32(d[3], lo, hi);
  b.pack_b32(d[4], hi, lo);
  for (int i = 0; i < 5; ++i) b.st(Space::Global, Type::B32, at(out, 4 * i), d[i]);
  b.exit();
  const std::string ptx = std::move(b).emit(70, 80, 1);
  auto has = [&](const char *s) {
    if (ptx.find(s) == std::string::npos) {
      std::fprintf(stderr, "no \"%s\" in\n%s", s, ptx.c_str());
      fail();
    }
  };
  // Registers in allocation order: %r0..%r2 = a, b, c, %r3.. the results.
  has("\tprmt.b32 %r3, %r0, %r1, %r2;\n");
  has("\tprmt.b32 %r4, %r0, %r1, 25632;\n");  // 0x6420
  has("\tprmt.b32 %r5, %r0, %r1, 30001;\n");  // 0x7531
  has("\tmov.b32 %r6, {%h0, %h1};\n");
  has("\tmov.b32 %r7, {%h1, %h0};\n");
  const uint32_t a = 0x8c7f01f3u, bb = 0x4a90e655u, c = 0xbeef9ac5u;
  const std::vector<uint32_t> vin = {a, bb, c, 0x1234abcdu};  // lo 0xabcd, hi 0x1234
  DevBuf din(16), dout(20);
  din.put(vin);
  TwoBuf prm = {din.ptr, dout.ptr};
  assert_int_equal(run_ptx(ptx, "k_pb", geom(1, 1), &prm, sizeof prm), FA_SUCCESS);
  const std::vector<uint32_t> got = dout.get<uint32_t>();
  assert_int_equal(got[0], prmt_ref(a, bb, c));
  assert_int_equal(got[1], prmt_ref(a, bb, 0x6420u));
  assert_int_equal(got[2], prmt_ref(a, bb, 0x7531u));
  assert_int_equal(got[3], 0x1234abcdu);
  assert_int_equal(got[4], 0xabcd1234u);
}

// ------------------------------------------------------------------ atom ----

// atom.global add / exch / cas from 64 CTAs x 128 threads on several host
// threads (a backend of its own with FLASHATTN_EMU_THREADS=4): every thread
// keeps the old value it got. Atomicity shows as exact results: the adds'
// old values are 0, 1, ..., N - 1 in some order and the words end at N and
// -3 N; exactly one cas from 0 wins and the word holds its value; the
// exchanges' old values with the final word are the initial 0 and every
// thread's value once.
void test_atom(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_atom(.param .align 8 .b8 k_atom_param[16])
{
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_atom_param+0];
  ld.param.u64 %rd2, [k_atom_param+8];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  add.u32 %r5, %r4, 1;
  atom.global.relaxed.gpu.add.u32 %r6, [%rd1], 1;
  atom.global.acq_rel.gpu.add.s32 %r7, [%rd1+4], -3;
  atom.global.cas.b32 %r8, [%rd1+8], 0, %r5;
  atom.global.exch.b32 %r9, [%rd1+12], %r5;
  mul.wide.u32 %rd3, %r4, 16;
  add.s64 %rd4, %rd2, %rd3;
  st.global.v4.u32 [%rd4], {%r6, %r7, %r8, %r9};
}
)";
  setenv("FLASHATTN_EMU_THREADS", "4", 1);
  std::unique_ptr<fa::Backend> be;
  assert_int_equal(fa::create_emulator_backend(80, &be), FA_SUCCESS);
  unsetenv("FLASHATTN_EMU_THREADS");
  fa::Backend *saved = g_be;
  g_be = be.get();
  {
    const uint32_t ctas = 64, threads = 128, n = ctas * threads;
    DevBuf words(16), out(16 * n);
    words.put(std::vector<uint32_t>{0, 0, 0, 0});
    TwoBuf prm = {words.ptr, out.ptr};
    assert_int_equal(run_ptx(p, "k_atom", geom(ctas, threads), &prm, sizeof prm), FA_SUCCESS);
    const std::vector<uint32_t> w = words.get<uint32_t>(), o = out.get<uint32_t>();
    assert_int_equal(w[0], n);
    assert_int_equal(static_cast<int32_t>(w[1]), -3 * static_cast<int32_t>(n));
    std::vector<uint32_t> adds, subs, exch;
    uint32_t cas_wins = 0;
    for (uint32_t i = 0; i < n; ++i) {
      adds.push_back(o[4 * i]);
      subs.push_back(-o[4 * i + 1] / 3);
      if (o[4 * i + 2] == 0) {
        ++cas_wins;
        assert_int_equal(w[2], i + 1);
      } else {
        assert_int_equal(o[4 * i + 2], w[2]);
      }
      exch.push_back(o[4 * i + 3]);
    }
    exch.push_back(w[3]);
    assert_int_equal(cas_wins, 1);
    std::sort(adds.begin(), adds.end());
    std::sort(subs.begin(), subs.end());
    std::sort(exch.begin(), exch.end());
    for (uint32_t i = 0; i < n; ++i) {
      assert_int_equal(adds[i], i);
      assert_int_equal(subs[i], i);
    }
    for (uint32_t i = 0; i <= n; ++i) assert_int_equal(exch[i], i);
  }
  g_be = saved;
  // Faults: misaligned, outside any allocation.
  std::string q = std::string(kHeader) + R"(
.visible .entry k_atom_bad(.param .align 8 .b8 k_atom_bad_param[8])
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_atom_bad_param+0];
  atom.global.add.u32 %r1, [%rd1], 1;
}
)";
  DevBuf buf(64);
  OneBuf bad = {buf.ptr + 2};
  assert_int_equal(run_ptx(q, "k_atom_bad", geom(1, 1), &bad, sizeof bad), FA_ERROR_LAUNCH);
  expect_error("misaligned global address");
  expect_error("atom.global.add.u32");
  expect_error(ptx_line_text(line_of(q, "atom.global")).c_str());
  bad.out = buf.ptr + 64;
  assert_int_equal(run_ptx(q, "k_atom_bad", geom(1, 1), &bad, sizeof bad), FA_ERROR_LAUNCH);
  expect_error("atom.global.add.u32");
  // What the decoder refuses.
  const std::string base =
      std::string(kHeader) + ".visible .entry k()\n{\n  .reg .b32 %r<4>;\n  .reg .b64 %rd<4>;\n";
  // (atom.shared and .add.f32: tests/test_emulator_reduce.cc.)
  expect_compile_error(base + "  atom.add.u32 %r1, [%rd1], 1;\n}\n", 8, "needs .global or .shared");
  expect_compile_error(base + "  atom.global.add.u64 %rd1, [%rd2], 1;\n}\n", 8,
                       ".u32, .s32 and .f32");
  expect_compile_error(base + "  atom.global.min.u32 %r1, [%rd1], 1;\n}\n", 8, "'.min'");
  expect_compile_error(base + "  atom.global.cas.b32 %r1, [%rd1], 1;\n}\n", 8, "operand");
}

// The builder's atom_add: its text, parsed and run by the emulator.
void test_atom_builder(void **) {
  using fa::ptx::at;
  using fa::ptx::Builder;
  using fa::ptx::imm;
  using fa::ptx::Reg;
  using fa::ptx::Space;
  using fa::ptx::Type;
  Builder b("k_ab", 8);
  Reg raw = b.b64(), w = b.b64();
  b.ld_param(Type::U64, raw, 0);
  b.cvta_to_global(w, raw);
  Reg d0 = b.b32(), d1 = b.b32();
  b.atom_add(false, Type::U32, d0, at(w, 0), imm(5));
  b.atom_add(true, Type::S32, d1, at(w, 4), d0);
  b.st(Space::Global, Type::B32, at(w, 8), d1);
  b.exit();
  const std::string ptx = std::move(b).emit(70, 80, 1);
  for (const char *s : {"\tatom.global.relaxed.gpu.add.u32 %r0, [%rd1], 5;\n",
                        "\tatom.global.acq_rel.gpu.add.s32 %r1, [%rd1+4], %r0;\n"})
    if (ptx.find(s) == std::string::npos) {
      std::fprintf(stderr, "no \"%s\" in\n%s", s, ptx.c_str());
      fail();
    }
  DevBuf words(12);
  words.put(std::vector<uint32_t>{7, 100, 0});
  OneBuf prm = {words.ptr};
  assert_int_equal(run_ptx(ptx, "k_ab", geom(1, 1), &prm, sizeof prm), FA_SUCCESS);
  const std::vector<uint32_t> got = words.get<uint32_t>();
  assert_int_equal(got[0], 12u);
  assert_int_equal(got[1], 107u);
  assert_int_equal(got[2], 100u);
}

// --------------------------------------------------------- memory API ----

void test_memory_api(void **) {
  uint64_t a = 0, b = 0;
  assert_int_equal(g_be->mem_alloc(1000, &a), FA_SUCCESS);
  assert_int_equal(a % 256, 0);
  assert_int_equal(g_be->mem_alloc(0, &b), FA_ERROR_INVALID_ARGUMENT);
  assert_int_equal(g_be->mem_free(a + 8), FA_ERROR_INVALID_ARGUMENT);
  expect_error("not the start of a live allocation");
  assert_int_equal(g_be->mem_free(0xdead0000), FA_ERROR_INVALID_ARGUMENT);
  std::vector<uint8_t> host(1001, 0x5a), back(1000, 0);
  assert_int_equal(g_be->copy_htod(a, host.data(), 1001), FA_ERROR_INVALID_ARGUMENT);
  expect_error("past the end");
  assert_int_equal(g_be->copy_htod(a + 10, host.data(), 990), FA_SUCCESS);
  assert_int_equal(g_be->memset_d8(a, 0x11, 10), FA_SUCCESS);
  assert_int_equal(g_be->copy_dtoh(back.data(), a, 1000), FA_SUCCESS);
  for (int i = 0; i < 1000; ++i) assert_int_equal(back[i], i < 10 ? 0x11 : 0x5a);
  assert_int_equal(g_be->copy_dtoh(back.data(), a + 1, 1000), FA_ERROR_INVALID_ARGUMENT);
  assert_int_equal(g_be->memset_d8(a - 1, 0, 2), FA_ERROR_INVALID_ARGUMENT);
  assert_int_equal(g_be->synchronize(nullptr), FA_SUCCESS);
  assert_int_equal(g_be->mem_free(a), FA_SUCCESS);
  assert_int_equal(g_be->mem_free(a), FA_ERROR_INVALID_ARGUMENT);  // double free
  assert_int_equal(g_be->copy_dtoh(back.data(), a, 4), FA_ERROR_INVALID_ARGUMENT);
}

// Signed 32-bit add/sub/mul.lo/mad.lo whose exact result leaves int32 is a
// fault naming the instruction; the same values as .u32 wrap silently.
void test_signed_overflow(void **) {
  struct Case {
    const char *inst;  // %r1 = x, %r2 = y from the parameters
    int32_t x, y;
    bool faults;
  };
  const Case cases[] = {
      {"add.s32 %r3, %r1, %r2", INT32_MAX, 1, true},
      {"add.s32 %r3, %r1, %r2", INT32_MIN, -1, true},
      {"add.s32 %r3, %r1, %r2", INT32_MAX, -1, false},
      {"sub.s32 %r3, %r1, %r2", INT32_MIN, 1, true},
      {"sub.s32 %r3, %r1, %r2", -1, INT32_MAX, false},  // = INT32_MIN
      {"mul.lo.s32 %r3, %r1, %r2", 65536, 32768, true},
      {"mul.lo.s32 %r3, %r1, %r2", -65536, 32768, false},
      {"mad.lo.s32 %r3, %r1, %r2, %r1", 46341, 46340, true},  // 46341*46341 > 2^31
      {"mad.lo.s32 %r3, %r1, %r2, %r2", 46340, 46340, false},
      {"add.u32 %r3, %r1, %r2", INT32_MAX, 1, false},
      {"mul.lo.u32 %r3, %r1, %r2", 65536, 65536, false},
  };
  for (const Case &c : cases) {
    std::string p = std::string(kHeader) + R"(
.visible .entry k_ovf(.param .align 8 .b8 k_ovf_param[16])
{
  .reg .b32 %r<4>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [k_ovf_param+0];
  ld.param.s32 %r1, [k_ovf_param+8];
  ld.param.s32 %r2, [k_ovf_param+12];
  )" + std::string(c.inst) +
                    R"(;
  st.global.u32 [%rd1], %r3;
}
)";
    DevBuf out(4);
    struct {
      uint64_t out;
      int32_t x, y;
    } prm = {out.ptr, c.x, c.y};
    fa_status st = run_ptx(p, "k_ovf", geom(1, 1), &prm, sizeof prm);
    if ((st != FA_SUCCESS) != c.faults)
      std::fprintf(stderr, "%s (%d, %d): status %d\n", c.inst, c.x, c.y, static_cast<int>(st));
    if (!c.faults) {
      assert_int_equal(st, FA_SUCCESS);
      continue;
    }
    assert_int_equal(st, FA_ERROR_LAUNCH);
    expect_error("signed 32-bit overflow");
    expect_error(ptx_line_text(line_of(p, c.inst)).c_str());
    assert_int_equal(out.get<uint32_t>()[0], 0xABABABABu);  // nothing stored
  }
}

// Allocations of 1 GiB and more are reserved lazily: 64 GiB costs only the
// pages touched, starts zero-filled, and every byte is in bounds.
void test_lazy_allocation(void **) {
  const size_t huge = size_t{64} << 30;
  uint64_t a = 0;
  fa_status st = g_be->mem_alloc(huge, &a);
  if (st == FA_ERROR_OUT_OF_MEMORY) {
    // Strict overcommit (vm.overcommit_memory=2) refuses the reservation.
    std::printf("  skipped: %s\n", fa::last_error());
    return;
  }
  assert_int_equal(st, FA_SUCCESS);
  assert_int_equal(a % 256, 0);
  uint8_t back[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const uint64_t far = a + huge - 8;
  assert_int_equal(g_be->copy_dtoh(back, far, 8), FA_SUCCESS);
  for (uint8_t x : back) assert_int_equal(x, 0);
  const uint8_t val[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(g_be->copy_htod(far, val, 8), FA_SUCCESS);
  assert_int_equal(g_be->copy_dtoh(back, far, 8), FA_SUCCESS);
  assert_memory_equal(back, val, 8);
  assert_int_equal(g_be->copy_htod(far + 1, val, 8), FA_ERROR_INVALID_ARGUMENT);
  expect_error("past the end");
  assert_int_equal(g_be->mem_free(a), FA_SUCCESS);
  assert_int_equal(g_be->copy_dtoh(back, far, 8), FA_ERROR_INVALID_ARGUMENT);
}

// ------------------------------------------------------- multi-block grid ----

void test_multi_block(void **) {
  // Two entries in one module; grid (3,2,2) x block (8,2,1).
  std::string p = std::string(kHeader) + R"(
.visible .entry k_other()
{
  ret;
}
.visible .entry k_grid(.param .align 8 .b8 k_grid_param[8])
{
  .reg .b32 %r<32>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_grid_param+0];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ctaid.y;
  mov.u32 %r3, %ctaid.z;
  mov.u32 %r4, %nctaid.x;
  mov.u32 %r5, %nctaid.y;
  mov.u32 %r6, %tid.x;
  mov.u32 %r7, %tid.y;
  mov.u32 %r8, %ntid.x;
  mov.u32 %r9, %ntid.y;
  mad.lo.s32 %r10, %r3, %r5, %r2;
  mad.lo.s32 %r10, %r10, %r4, %r1;
  mad.lo.s32 %r11, %r7, %r8, %r6;
  mul.lo.s32 %r12, %r8, %r9;
  mad.lo.s32 %r13, %r10, %r12, %r11;
  shl.b32 %r14, %r1, 24;
  shl.b32 %r15, %r2, 20;
  or.b32 %r14, %r14, %r15;
  shl.b32 %r15, %r3, 16;
  or.b32 %r14, %r14, %r15;
  shl.b32 %r15, %r6, 8;
  or.b32 %r14, %r14, %r15;
  shl.b32 %r15, %r7, 4;
  or.b32 %r14, %r14, %r15;
  mov.u32 %r16, %nctaid.z;
  or.b32 %r14, %r14, %r16;
  mul.wide.u32 %rd2, %r13, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r14;
}
)";
  const int total = 3 * 2 * 2 * 16;
  DevBuf o(total * 4);
  OneBuf prm = {o.ptr};
  fa::LaunchGeometry g;
  g.grid[0] = 3;
  g.grid[1] = 2;
  g.grid[2] = 2;
  g.block[0] = 8;
  g.block[1] = 2;
  assert_int_equal(run_ptx(p, "k_grid", g, &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> out = o.get<uint32_t>();
  int k = 0;
  for (uint32_t z = 0; z < 2; ++z)
    for (uint32_t y = 0; y < 2; ++y)
      for (uint32_t x = 0; x < 3; ++x)
        for (uint32_t ty = 0; ty < 2; ++ty)
          for (uint32_t tx = 0; tx < 8; ++tx)
            assert_int_equal(out[k++],
                             (x << 24) | (y << 20) | (z << 16) | (tx << 8) | (ty << 4) | 2u);
  assert_int_equal(run_ptx(p, "k_other", g, nullptr, 0), FA_SUCCESS);
  // Bad geometry is refused.
  g.block[0] = 1025;
  assert_int_equal(run_ptx(p, "k_grid", g, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("invalid block");
  // Too small a parameter buffer.
  g.block[0] = 8;
  assert_int_equal(run_ptx(p, "k_grid", g, &prm, 4), FA_ERROR_LAUNCH);
  expect_error("parameter buffer");
}

// ----------------------------------------------------------------- speed ----

void test_speed(void **) {
  // Reports instructions per second on an ALU loop (16 warps x 8 blocks).
  std::string p = std::string(kHeader) + R"(
.visible .entry k_speed(.param .align 8 .b8 k_speed_param[8])
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .f32 %f<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [k_speed_param+0];
  mov.u32 %r1, %tid.x;
  cvt.rn.f32.u32 %f1, %r1;
  mov.f32 %f2, 0f00000000;
  mov.u32 %r2, 0;
$L_top:
  fma.rn.f32 %f2, %f1, 0f3F000000, %f2;
  mul.f32 %f3, %f2, 0f3F7FF000;
  add.f32 %f2, %f3, 0f3F800000;
  add.s32 %r2, %r2, 1;
  setp.lt.s32 %p1, %r2, 2000;
  @%p1 bra $L_top;
  mov.u32 %r3, %ctaid.x;
  mad.lo.s32 %r4, %r3, 512, %r1;
  mul.wide.u32 %rd2, %r4, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.f32 [%rd3], %f2;
}
)";
  DevBuf o(8 * 512 * 4);
  OneBuf prm = {o.ptr};
  auto t0 = std::chrono::steady_clock::now();
  assert_int_equal(run_ptx(p, "k_speed", geom(8, 512), &prm, sizeof prm), FA_SUCCESS);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double insts = 8.0 * 512 * (2000 * 6 + 11);
  std::printf("emulator speed: %.0f M instructions/s (%.3f s for %.0f M)\n", insts / s / 1e6, s,
              insts / 1e6);
  std::vector<float> g = o.get<float>();
  for (int i = 0; i < 8 * 512; ++i) assert_true(std::isfinite(g[i]) && g[i] > 0.0f);
}

}  // namespace

// The op table (emu/ops.def) classifies every op by its scope, never by its
// place in the enum: exactly these ops are warpgroup collectives, exactly
// these warp collectives, and everything else that stops a thread is
// bar.sync, mbarrier.try_wait or barrier.cluster.wait. (kPrmt, appended
// after the warpgroup ops, was a "warpgroup collective" while the
// classifiers compared ordinals.)
void test_op_table(void **) {
  using fa::emu::Op;
  const Op wg[] = {Op::kWgmmaFence, Op::kWgmmaCommit, Op::kWgmmaWait, Op::kWgmma, Op::kSetmaxnreg};
  // The sm_100 state's tcgen05 data movement ops are warp collectives too;
  // its asynchronous ops (mma, commit, cp) are per-thread.
  const Op sm100[] = {Op::kTmemAlloc, Op::kTmemDealloc, Op::kTmemRelinquish,
                      Op::kTmemLd,    Op::kTmemSt,      Op::kTmemWait,
                      Op::kUmma,      Op::kUmmaCommit,  Op::kUtcCp};
  const Op warp[] = {Op::kBarWarpSync, Op::kShfl,           Op::kMma,    Op::kLdmatrix,
                     Op::kVote,        Op::kStmatrix,       Op::kElect,  Op::kTmemAlloc,
                     Op::kTmemDealloc, Op::kTmemRelinquish, Op::kTmemLd, Op::kTmemSt,
                     Op::kTmemWait};
  const Op other_stops[] = {Op::kBarSync, Op::kMbarTryWait, Op::kClusterWait};
  auto in = [](Op op, const Op *b, const Op *e) { return std::find(b, e, op) != e; };
  for (int i = 0; i < static_cast<int>(Op::kNumOps); ++i) {
    const Op op = static_cast<Op>(i);
    const bool is_wg = in(op, std::begin(wg), std::end(wg));
    const bool is_warp = in(op, std::begin(warp), std::end(warp));
    const bool stops = is_wg || is_warp || in(op, std::begin(other_stops), std::end(other_stops));
    assert_int_equal(fa::emu::is_warpgroup_collective(op), is_wg);
    assert_int_equal(fa::emu::is_warp_collective(op), is_warp);
    assert_int_equal(fa::emu::is_collective(op), stops);
  }
  assert_false(fa::emu::is_collective(Op::kPrmt));
  assert_false(fa::emu::is_warpgroup_collective(Op::kPrmt));
  // Handlers: the sm_90 state runs mbarriers, TMA, the proxy fence and the
  // warpgroup collectives, the sm_100 state tcgen05; everything else is the
  // interpreter's.
  const Op sm90[] = {Op::kMbarInit,    Op::kMbarInval,        Op::kMbarArrive,
                     Op::kMbarTryWait, Op::kBulkTensor,       Op::kFenceProxyAsync,
                     Op::kWgmmaFence,  Op::kWgmmaCommit,      Op::kWgmmaWait,
                     Op::kWgmma,       Op::kSetmaxnreg,       Op::kFenceMbarInit,
                     Op::kBulkReduce,  Op::kBulkTensorReduce, Op::kBulkCommit,
                     Op::kBulkWait};
  // The cluster state: mapa, ld / st .shared::cluster, barrier.cluster.
  const Op cluster[] = {Op::kMapa, Op::kLdCluster, Op::kStCluster, Op::kClusterArrive,
                        Op::kClusterWait};
  for (int i = 0; i < static_cast<int>(Op::kNumOps); ++i) {
    const Op op = static_cast<Op>(i);
    const bool is_sm90 = in(op, std::begin(sm90), std::end(sm90));
    assert_int_equal(fa::emu::op_handler(op) == fa::emu::OpHandler::kSm90, is_sm90);
    const bool is_sm100 = in(op, std::begin(sm100), std::end(sm100));
    assert_int_equal(fa::emu::op_handler(op) == fa::emu::OpHandler::kSm100, is_sm100);
    const bool is_cluster = in(op, std::begin(cluster), std::end(cluster));
    assert_int_equal(fa::emu::op_handler(op) == fa::emu::OpHandler::kCluster, is_cluster);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_info),
      cmocka_unit_test(test_op_table),
      cmocka_unit_test(test_integer_semantics),
      cmocka_unit_test(test_half_conversions),
      cmocka_unit_test(test_float_semantics),
      cmocka_unit_test(test_fma_random),
      cmocka_unit_test(test_loop_predicated),
      cmocka_unit_test(test_global_vectors),
      cmocka_unit_test(test_shared_bar_sync),
      cmocka_unit_test(test_shfl),
      cmocka_unit_test(test_vote),
      cmocka_unit_test(test_dynamic_shared),
      cmocka_unit_test(test_global_oob),
      cmocka_unit_test(test_griddepcontrol),
      cmocka_unit_test(test_global_wrap),
      cmocka_unit_test(test_misaligned),
      cmocka_unit_test(test_shared_oob),
      cmocka_unit_test(test_barrier_deadlock_exit),
      cmocka_unit_test(test_barrier_skip),
      cmocka_unit_test(test_shfl_half_warp),
      cmocka_unit_test(test_step_budget),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_prmt),
      cmocka_unit_test(test_prmt_errors),
      cmocka_unit_test(test_prmt_pack_builder),
      cmocka_unit_test(test_atom),
      cmocka_unit_test(test_atom_builder),
      cmocka_unit_test(test_memory_api),
      cmocka_unit_test(test_signed_overflow),
      cmocka_unit_test(test_lazy_allocation),
      cmocka_unit_test(test_multi_block),
      cmocka_unit_test(test_speed),
  };
  return cmocka_run_group_tests(tests, emu_setup, emu_teardown);
}
