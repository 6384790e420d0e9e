// Tests of the emulator's floating-point reductions (issue 30's backward
// needs them: dQ accumulated across CTAs), element by element against
// sums that are exact in f32 (small integers and multiples of 2^-k), on
// kernels written here and through the PTX builder:
//   atom / red .add.f32 on global and shared memory (many threads of many
//   CTAs on several host threads, the same and different words; the old
//   values atom returns), atom.shared.add.u32, red.global.add.v2/.v4.f32;
//   round to nearest even and the subnormal rules (global flushes, shared
//   keeps them);
//   cp.reduce.async.bulk (a region) and cp.reduce.async.bulk.tensor (boxes
//   of 1 to 5 dimensions, partly outside the tensor, swizzled) with the bulk
//   async-groups, and every hazard and misuse an error naming its PTX lines;
//   the parser's refusals; the builder's forms through ptxas.
// docs/emulator.md, "Floating-point reductions", has the model.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "emu/tensor_map.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

const char *kSm80 = ".version 7.8\n.target sm_80\n.address_size 64\n";
const char *kSm90 = ".version 8.1\n.target sm_90\n.address_size 64\n";

float bitsf(uint32_t u) { return fa::emu::bits_f32(u); }
uint32_t fbits(float f) { return fa::emu::f32_bits(f); }

std::string at_line(const std::string &ptx, const char *marker) {
  return "at PTX line " + std::to_string(line_of(ptx, marker));
}

void expect_ok(fa_status st) {
  if (st != FA_SUCCESS) std::fprintf(stderr, "unexpected failure: %s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
}

// The group's second backend: its CTAs run on 4 host threads, so that
// updates of the same word race on the host.
fa::Backend *g_threaded = nullptr;

int setup(void **state) {
  if (emu_setup_sm<90>(state) != 0) return -1;
  setenv("FLASHATTN_EMU_THREADS", "4", 1);
  std::unique_ptr<fa::Backend> be;
  const fa_status st = fa::create_emulator_backend(90, &be);
  unsetenv("FLASHATTN_EMU_THREADS");
  if (st != FA_SUCCESS) return -1;
  g_threaded = be.release();
  return 0;
}

int teardown(void **state) {
  delete g_threaded;
  g_threaded = nullptr;
  return emu_teardown(state);
}

// While it lives, g_be (allocations and launches) is the threaded backend.
struct Threaded {
  fa::Backend *saved = g_be;
  Threaded() { g_be = g_threaded; }
  ~Threaded() { g_be = saved; }
  Threaded(const Threaded &) = delete;
  Threaded &operator=(const Threaded &) = delete;
};

struct TwoPtr {
  uint64_t a, b;
};

// ======================================================= atom / red ====

// 64 CTAs x 128 threads on 4 host threads: thread g adds v = (g % 7 + 1)
// / 4 into word 0 (red), 1.0 into word 1 (atom: the old values are 0, 1,
// .., n-1 in some order), g into word 2 + g % 64 (red.release), v into
// word 66 (atom.acq_rel: sorted by old value, each old value is the
// previous one plus its add) and 1.0 256 times into word 67. Every sum is
// exact in f32.
void test_global_adds(void **) {
  Threaded threaded;
  const std::string p = std::string(kSm80) + R"(
.visible .entry k_gadd(.param .align 8 .b8 k_gadd_param[16])
{
  .reg .pred %p<2>;
  .reg .b32 %r<16>;
  .reg .f32 %f<16>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [k_gadd_param+0];
  ld.param.u64 %rd2, [k_gadd_param+8];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.u32 %r4, %r1, %r2, %r3;
  rem.u32 %r5, %r4, 7;
  add.u32 %r5, %r5, 1;
  cvt.rn.f32.u32 %f1, %r5;
  mul.f32 %f1, %f1, 0f3E800000;
  red.global.add.f32 [%rd1], %f1;
  atom.global.relaxed.gpu.add.f32 %f2, [%rd1+4], 0f3F800000;
  and.b32 %r6, %r4, 63;
  mul.wide.u32 %rd3, %r6, 4;
  add.s64 %rd4, %rd1, %rd3;
  cvt.rn.f32.u32 %f3, %r4;
  red.release.gpu.global.add.f32 [%rd4+8], %f3;
  atom.global.acq_rel.gpu.add.f32 %f4, [%rd1+264], %f1;
  mul.wide.u32 %rd5, %r4, 8;
  add.s64 %rd6, %rd2, %rd5;
  st.global.v2.f32 [%rd6], {%f2, %f4};
  mov.u32 %r10, 0;
$L_loop:
  red.global.add.f32 [%rd1+268], 0f3F800000;
  add.u32 %r10, %r10, 1;
  setp.lt.u32 %p1, %r10, 256;
  @%p1 bra $L_loop;
}
)";
  const uint32_t ctas = 64, threads = 128, n = ctas * threads;
  DevBuf words(68 * 4), out(8 * n);
  words.put(std::vector<float>(68, 0.0f));
  TwoPtr prm = {words.ptr, out.ptr};
  expect_ok(run_ptx(p, "k_gadd", geom(ctas, threads), &prm, sizeof prm));
  const std::vector<float> w = words.get<float>(), o = out.get<float>();
  double v_sum = 0, g_sum[64] = {};
  for (uint32_t g = 0; g < n; ++g) {
    v_sum += (g % 7 + 1) / 4.0;
    g_sum[g % 64] += g;
  }
  assert_true(w[0] == v_sum);
  assert_true(w[1] == n);
  for (int j = 0; j < 64; ++j)
    if (w[2 + j] != g_sum[j]) {
      std::fprintf(stderr, "word %d: %.1f, want %.1f\n", 2 + j, w[2 + j], g_sum[j]);
      fail();
    }
  assert_true(w[66] == v_sum);
  // 256 adds of 1.0 per thread into word 67, a tight loop: the host
  // threads' updates of the same word interleave, none may be lost.
  if (w[67] != 256.0 * n) {
    std::fprintf(stderr, "word 67: %.1f, want %.1f\n", w[67], 256.0 * n);
    fail();
  }
  std::vector<float> ones(n);
  std::vector<std::pair<float, float>> olds(n);  // (old value, the add)
  for (uint32_t g = 0; g < n; ++g) {
    ones[g] = o[2 * g];
    olds[g] = {o[2 * g + 1], (g % 7 + 1) / 4.0f};
  }
  std::sort(ones.begin(), ones.end());
  for (uint32_t i = 0; i < n; ++i) assert_true(ones[i] == i);
  std::sort(olds.begin(), olds.end());
  float running = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (olds[i].first != running) {
      std::fprintf(stderr, "old value %u: %g, want %g\n", i, olds[i].first, running);
      fail();
    }
    running += olds[i].second;
  }
  assert_true(running == w[66]);
}

// Two CTAs of 256 threads on shared memory: atom.shared::cta.add.f32 (old
// values permutation-consistent), red.shared.add.f32, atom.shared.add.u32
// (old values 0, 3, .., 3 * 255), each CTA its own words.
void test_shared_adds(void **) {
  const std::string p = std::string(kSm80) + R"(
.visible .entry k_sadd(.param .align 8 .b8 k_sadd_param[8])
{
  .reg .pred %p<2>;
  .reg .b32 %r<16>;
  .reg .f32 %f<8>;
  .reg .b64 %rd<8>;
  .shared .align 16 .b8 sm[16];
  ld.param.u64 %rd1, [k_sadd_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r9, sm;
  setp.ne.u32 %p1, %r1, 0;
  mov.u32 %r3, 0;
  @!%p1 st.shared.v4.u32 [sm], {%r3, %r3, %r3, %r3};
  bar.sync 0;
  rem.u32 %r4, %r1, 5;
  add.u32 %r4, %r4, 1;
  cvt.rn.f32.u32 %f1, %r4;
  mul.f32 %f1, %f1, 0f3F000000;
  atom.shared::cta.add.f32 %f2, [sm], %f1;
  red.shared.add.f32 [%r9+4], %f1;
  atom.shared.relaxed.cta.add.u32 %r5, [%r9+8], 3;
  bar.sync 0;
  mad.lo.u32 %r6, %r2, 260, %r1;
  mul.wide.u32 %rd2, %r6, 8;
  add.s64 %rd3, %rd1, %rd2;
  mov.b32 %r7, %f2;
  st.global.v2.u32 [%rd3], {%r7, %r5};
  @%p1 bra $L_end;
  ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [sm];
  st.global.v4.u32 [%rd3+2048], {%r10, %r11, %r12, %r13};
$L_end:
  ret;
}
)";
  DevBuf out(2 * 260 * 8);
  TwoPtr prm = {out.ptr, 0};
  expect_ok(run_ptx(p, "k_sadd", geom(2, 256), &prm, 8));
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t cta = 0; cta < 2; ++cta) {
    const uint32_t *c = o.data() + 2 * 260 * cta;
    std::vector<std::pair<float, float>> olds(256);
    std::vector<uint32_t> u(256);
    double total = 0;
    for (uint32_t t = 0; t < 256; ++t) {
      olds[t] = {bitsf(c[2 * t]), (t % 5 + 1) * 0.5f};
      u[t] = c[2 * t + 1];
      total += (t % 5 + 1) * 0.5;
    }
    std::sort(olds.begin(), olds.end());
    std::sort(u.begin(), u.end());
    float running = 0;
    for (uint32_t i = 0; i < 256; ++i) {
      assert_true(olds[i].first == running);
      running += olds[i].second;
      assert_int_equal(u[i], 3 * i);
    }
    const uint32_t *fin = c + 512;  // the words after the barrier
    assert_true(bitsf(fin[0]) == total);
    assert_true(bitsf(fin[1]) == total);
    assert_int_equal(fin[2], 3 * 256);
    assert_int_equal(fin[3], 0);
  }
}

// Round to nearest even, and subnormals: atom / red .add.f32 flush
// subnormal inputs and results to zero on global memory and keep them on
// shared memory (PTX ISA "atom", "red": "Current implementation ...").
void test_rounding_subnormals(void **) {
  const std::string p = std::string(kSm80) + R"(
.visible .entry k_sub(.param .align 8 .b8 k_sub_param[16])
{
  .reg .b32 %r<16>;
  .reg .f32 %f<16>;
  .reg .b64 %rd<8>;
  .shared .align 16 .b8 sm[32];
  ld.param.u64 %rd1, [k_sub_param+0];
  ld.param.u64 %rd2, [k_sub_param+8];
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];
  ld.global.v4.f32 {%f5, %f6, %f7, %f8}, [%rd1+16];
  st.shared.v4.f32 [sm], {%f1, %f2, %f3, %f4};
  red.global.add.f32 [%rd1], %f5;
  red.global.add.f32 [%rd1+4], %f6;
  red.global.add.f32 [%rd1+8], %f7;
  atom.global.add.f32 %f9, [%rd1+12], %f8;
  red.shared.add.f32 [sm], %f5;
  red.shared.add.f32 [sm+4], %f6;
  red.shared.add.f32 [sm+8], %f7;
  atom.shared.add.f32 %f10, [sm+12], %f8;
  ld.shared.v4.f32 {%f1, %f2, %f3, %f4}, [sm];
  st.global.v4.f32 [%rd2], {%f1, %f2, %f3, %f4};
  st.global.v2.f32 [%rd2+16], {%f9, %f10};
}
)";
  // Word pairs (x, y): 1 + 2^-24 (a tie: even, 1), 1 + 3 * 2^-24 (2 ulps up
  // when rounded to even), 2^-140 + 2^-140 (subnormal inputs), 2^-126 (1 +
  // 2^-23) - 2^-126 = 2^-149 (normal inputs, subnormal result).
  const std::vector<uint32_t> in = {fbits(1.0f),     fbits(1.0f),     0x200u, 0x00800001u,
                                    fbits(0x1p-24f), fbits(0x3p-24f), 0x200u, 0x80800000u};
  DevBuf words(32), out(24);
  words.put(in);
  TwoPtr prm = {words.ptr, out.ptr};
  expect_ok(run_ptx(p, "k_sub", geom(1, 1), &prm, sizeof prm));
  const std::vector<uint32_t> g = words.get<uint32_t>(), s = out.get<uint32_t>();
  const uint32_t want_global[4] = {fbits(1.0f), fbits(1.0f + 0x1p-22f), 0u, 0u};
  const uint32_t want_shared[4] = {fbits(1.0f), fbits(1.0f + 0x1p-22f), 0x400u, 0x1u};
  for (int i = 0; i < 4; ++i) {
    if (g[i] != want_global[i] || s[i] != want_shared[i]) {
      std::fprintf(stderr, "pair %d: global 0x%08x (want 0x%08x), shared 0x%08x (want 0x%08x)\n", i,
                   g[i], want_global[i], s[i], want_shared[i]);
      fail();
    }
  }
  assert_int_equal(s[4], 0x00800001u);  // the atoms' old values
  assert_int_equal(s[5], 0x00800001u);
}

// red.global.add.v2.f32 / .v4.f32 (sm_90, PTX ISA 8.1): 16 CTAs x 64
// threads on 4 host threads; thread g adds (g, g + 1, g + 2, g + 3) / 2 into
// the four words at 16 (g % 8) and (g, -g) into the two at 8 (g % 4) of a
// second array. A vector must be aligned to its size.
void test_vector_red(void **) {
  Threaded threaded;
  const std::string p = std::string(kSm90) + R"(
.visible .entry k_vred(.param .align 8 .b8 k_vred_param[16])
{
  .reg .b32 %r<16>;
  .reg .f32 %f<16>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [k_vred_param+0];
  ld.param.u64 %rd2, [k_vred_param+8];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.u32 %r4, %r1, %r2, %r3;
  cvt.rn.f32.u32 %f1, %r4;
  mul.f32 %f1, %f1, 0f3F000000;
  add.f32 %f2, %f1, 0f3F000000;
  add.f32 %f3, %f2, 0f3F000000;
  add.f32 %f4, %f3, 0f3F000000;
  and.b32 %r5, %r4, 7;
  mul.wide.u32 %rd3, %r5, 16;
  add.s64 %rd4, %rd1, %rd3;
  red.global.add.v4.f32 [%rd4], {%f1, %f2, %f3, %f4};
  and.b32 %r6, %r4, 3;
  mul.wide.u32 %rd5, %r6, 8;
  add.s64 %rd6, %rd2, %rd5;
  neg.f32 %f5, %f1;
  red.relaxed.gpu.global.add.v2.f32 [%rd6], {%f1, %f5};
}
)";
  const uint32_t n = 16 * 64;
  DevBuf a(32 * 4), b(8 * 4);
  a.put(std::vector<float>(32, 0.5f));
  b.put(std::vector<float>(8, 0.0f));
  TwoPtr prm = {a.ptr, b.ptr};
  expect_ok(run_ptx(p, "k_vred", geom(16, 64), &prm, sizeof prm));
  const std::vector<float> ga = a.get<float>(), gb = b.get<float>();
  double wa[32], wb[8];
  for (int i = 0; i < 32; ++i) wa[i] = 0.5;
  for (int i = 0; i < 8; ++i) wb[i] = 0;
  for (uint32_t g = 0; g < n; ++g) {
    for (int k = 0; k < 4; ++k) wa[4 * (g % 8) + k] += (g + k) / 2.0;
    wb[2 * (g % 4)] += g / 2.0;
    wb[2 * (g % 4) + 1] -= g / 2.0;
  }
  for (int i = 0; i < 32; ++i) assert_true(ga[i] == wa[i]);
  for (int i = 0; i < 8; ++i) assert_true(gb[i] == wb[i]);
  // Misaligned vectors: v4 at 8 bytes, v2 at 4 bytes past an alignment.
  for (const char *form : {"v4", "v2"}) {
    const std::string vals = form[1] == '4' ? "{%f1, %f1, %f1, %f1}" : "{%f1, %f1}";
    const std::string q = std::string(kSm90) +
                          ".visible .entry k_vbad(.param .align 8 .b8 k_vbad_param[8])\n{\n"
                          "  .reg .f32 %f<4>;\n  .reg .b64 %rd<4>;\n"
                          "  ld.param.u64 %rd1, [k_vbad_param+0];\n  mov.f32 %f1, 0f3F800000;\n"
                          "  red.global.add." +
                          form + ".f32 [%rd1+" + (form[1] == '4' ? "8" : "4") + "], " + vals +
                          ";\n}\n";
    assert_int_equal(run_ptx(q, "k_vbad", geom(1, 1), &prm, 8), FA_ERROR_LAUNCH);
    expect_error("misaligned global address");
    expect_error(at_line(q, "red.global"));
  }
}

// =================================================== bulk reductions ====

struct BulkParams {
  uint64_t dst;   // the global region the CTAs add into
  uint64_t src;   // per CTA, size bytes to stage into shared memory
  uint32_t size;  // bytes
  uint32_t pad;
  uint64_t udst;  // 64 u32 words: a second reduction of .u32 (immediate size)
};

// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: 6 CTAs on 4
// host threads each stage their own f32 values in shared memory (offset
// 256), fence, and thread 0 adds them into one global region (the size
// from a register, a destination offset of 16 bytes) and the first 64
// words as .u32 (an immediate size); the region before and after is left
// alone.
void test_bulk_reduce(void **) {
  Threaded threaded;
  const std::string p = std::string(kSm90) + R"(
.visible .entry k_bulk(.param .align 8 .b8 k_bulk_param[32])
{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<16>;
  .shared .align 128 .b8 sm[4352];
  ld.param.u64 %rd1, [k_bulk_param+0];
  ld.param.u64 %rd2, [k_bulk_param+8];
  ld.param.u32 %r1, [k_bulk_param+16];
  ld.param.u64 %rd7, [k_bulk_param+24];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %ctaid.x;
  mul.wide.u32 %rd3, %r3, %r1;
  add.s64 %rd4, %rd2, %rd3;
  mov.u32 %r4, sm;
  add.u32 %r5, %r4, 256;
  mov.u32 %r6, %r2;
$L_copy:
  shl.b32 %r7, %r6, 2;
  setp.ge.u32 %p1, %r7, %r1;
  @%p1 bra $L_done;
  cvt.u64.u32 %rd5, %r7;
  add.s64 %rd6, %rd4, %rd5;
  ld.global.u32 %r8, [%rd6];
  add.u32 %r9, %r5, %r7;
  st.shared.u32 [%r9], %r8;
  add.u32 %r6, %r6, 64;
  bra $L_copy;
$L_done:
  fence.proxy.async.shared::cta;
  bar.sync 0;
  setp.ne.u32 %p2, %r2, 0;
  @%p2 bra $L_end;
  cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1+16], [%r4+256], %r1;
  cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%rd7], [%r5], 256;
  cp.async.bulk.commit_group;
  cp.async.bulk.wait_group.read 0;
$L_end:
  ret;
}
)";
  const uint32_t ctas = 6, size = 4096, words = size / 4;
  std::mt19937 rng(11);
  std::vector<float> src(ctas * words), init(words + 8);
  for (float &x : src) x = static_cast<int>(rng() % 2001 - 1000) / 8.0f;
  for (float &x : init) x = static_cast<int>(rng() % 101 - 50) / 4.0f;
  DevBuf dst(init.size() * 4), s(src.size() * 4), udst(256);
  dst.put(init);
  s.put(src);
  std::vector<uint32_t> uinit(64);
  for (uint32_t &x : uinit) x = rng();
  udst.put(uinit);
  BulkParams prm = {dst.ptr, s.ptr, size, 0, udst.ptr};
  expect_ok(run_ptx(p, "k_bulk", geom(ctas, 64), &prm, sizeof prm));
  const std::vector<float> got = dst.get<float>();
  const std::vector<uint32_t> ugot = udst.get<uint32_t>();
  for (uint32_t i = 0; i < init.size(); ++i) {
    double want = init[i];
    if (i >= 4 && i < 4 + words)
      for (uint32_t c = 0; c < ctas; ++c) want += src[c * words + i - 4];
    if (got[i] != want) {
      std::fprintf(stderr, "word %u: %g, want %g\n", i, got[i], want);
      fail();
    }
  }
  for (uint32_t i = 0; i < 64; ++i) {
    uint32_t want = uinit[i];
    for (uint32_t c = 0; c < ctas; ++c) want += fbits(src[c * words + i]);
    assert_int_equal(ugot[i], want);
  }
}

// The tensor reduce kernel's parameters: the tensor map in the parameter
// block (at 64), the coordinates, and the shared-memory image of the box
// (the layout the ISA gives the box in shared memory) to stage.
struct TensorParams {
  uint64_t image;
  uint32_t bytes;
  int32_t c[5];
  uint8_t pad[32];
  alignas(64) uint8_t map[128];
};
static_assert(offsetof(TensorParams, map) == 64, "map at 64");

// Every CTA stages the image at shared 0 (1024-aligned), fences, and
// thread 0 adds the box into the tensor at c.
std::string tensor_kernel(int dims) {
  std::string coords = "{";
  for (int d = 0; d < dims; ++d) coords += (d ? ", %c" : "%c") + std::to_string(d);
  coords += "}";
  std::string p = std::string(kSm90) + ".visible .entry k_tred(.param .align 64 .b8 k_tred_param[" +
                  std::to_string(sizeof(TensorParams)) +
                  "])\n{\n  .reg .pred %p<4>;\n  .reg .b32 %r<16>;\n  .reg .b32 %c<5>;\n"
                  "  .reg .b64 %rd<16>;\n  .extern .shared .align 1024 .b8 smem[];\n"
                  "  ld.param.u64 %rd1, [k_tred_param+0];\n"
                  "  ld.param.u32 %r1, [k_tred_param+8];\n";
  for (int d = 0; d < dims; ++d)
    p += "  ld.param.u32 %c" + std::to_string(d) + ", [k_tred_param+" + std::to_string(12 + 4 * d) +
         "];\n";
  p += R"(  mov.u64 %rd2, k_tred_param;
  cvta.param.u64 %rd2, %rd2;
  add.s64 %rd3, %rd2, 64;
  mov.u32 %r2, %tid.x;
  mov.u32 %r4, smem;
  mov.u32 %r6, %r2;
$L_copy:
  shl.b32 %r7, %r6, 2;
  setp.ge.u32 %p1, %r7, %r1;
  @%p1 bra $L_done;
  cvt.u64.u32 %rd5, %r7;
  add.s64 %rd6, %rd1, %rd5;
  ld.global.u32 %r8, [%rd6];
  add.u32 %r9, %r4, %r7;
  st.shared.u32 [%r9], %r8;
  add.u32 %r6, %r6, 64;
  bra $L_copy;
$L_done:
  fence.proxy.async.shared::cta;
  bar.sync 0;
  setp.ne.u32 %p2, %r2, 0;
  @%p2 bra $L_end;
)";
  p += "  cp.reduce.async.bulk.tensor." + std::to_string(dims) +
       "d.global.shared::cta.add.tile.bulk_group [%rd3, " + coords + "], [%r4];\n";
  p += R"(  cp.async.bulk.commit_group;
  cp.async.bulk.wait_group 0;
$L_end:
  ret;
}
)";
  return p;
}

fa::emu::TensorMap f32_map(std::vector<uint64_t> dims, std::vector<uint32_t> box,
                           fa::emu::TmaSwizzle swz) {
  fa::emu::TensorMap m;
  m.rank = static_cast<uint32_t>(dims.size());
  m.elem_bytes = 4;
  m.dtype = fa::emu::TmaDtype::F32;
  m.swizzle = swz;
  uint64_t stride = 4;
  for (uint32_t d = 0; d < m.rank; ++d) {
    m.dims[d] = dims[d];
    m.strides[d] = stride;
    m.box[d] = box[d];
    // Row pitch padded to a multiple of 16 bytes plus 16 (a gap that must
    // stay untouched), then dense.
    stride = d == 0 ? (dims[0] * 4 + 15) / 16 * 16 + 16 : stride * dims[d];
  }
  return m;
}

// cp.reduce.async.bulk.tensor.{1,2,3,5}d .add.tile on f32 tensors: 3 CTAs on
// 4 host threads add the same box (values multiples of 1/2) into a tensor
// filled with multiples of 1/4; the expected tensor, from the ISA's
// definition (box element i is tensor element c + i; elements outside the
// tensor are not written), is checked word by word over the whole
// allocation (row gaps and the guard past the end must keep their values).
// The box's shared image is built here: row-major by box, then the 128-byte
// swizzle (16-byte chunk j of 128-byte line L at chunk j ^ (L mod 8)).
void test_tensor_reduce(void **) {
  Threaded threaded;
  struct Case {
    std::vector<uint64_t> dims;
    std::vector<uint32_t> box;
    std::vector<int32_t> c;
    fa::emu::TmaSwizzle swz;
  };
  using fa::emu::TmaSwizzle;
  const Case cases[] = {
      {{37}, {16}, {29}, TmaSwizzle::None},                    // 1d, past the end
      {{37, 11}, {8, 4}, {3, 2}, TmaSwizzle::None},            // 2d, inside
      {{37, 11}, {8, 4}, {-4, -2}, TmaSwizzle::None},          // 2d, before the start
      {{37, 11}, {8, 4}, {33, 9}, TmaSwizzle::None},           // 2d, past both ends
      {{40, 9}, {32, 8}, {4, 5}, TmaSwizzle::B128},            // 2d, 128-byte swizzle
      {{12, 5, 7}, {4, 3, 4}, {10, -1, 5}, TmaSwizzle::None},  // 3d
      {{8, 3, 2, 3, 2}, {4, 2, 2, 2, 2}, {6, 2, 1, -1, 1}, TmaSwizzle::None},  // 5d
  };
  std::mt19937 rng(3);
  const uint32_t ctas = 3;
  for (const Case &k : cases) {
    fa::emu::TensorMap m = f32_map(k.dims, k.box, k.swz);
    const size_t bytes = m.strides[m.rank - 1] * m.dims[m.rank - 1], words = bytes / 4 + 16;
    std::vector<float> tensor(words);
    for (float &x : tensor) x = static_cast<int>(rng() % 41 - 20) / 4.0f;
    DevBuf t(words * 4);
    t.put(tensor);
    m.base = t.ptr;
    size_t elems = 1;
    for (uint32_t b : k.box) elems *= b;
    std::vector<float> box(elems);
    for (float &x : box) x = static_cast<int>(rng() % 61 - 30) / 2.0f;
    std::vector<double> want(tensor.begin(), tensor.end());
    for (size_t e = 0; e < elems; ++e) {
      size_t q = e, off = 0;
      bool in = true;
      for (uint32_t d = 0; d < m.rank; ++d) {
        const int64_t x = k.c[d] + static_cast<int64_t>(q % k.box[d]);
        q /= k.box[d];
        if (x < 0 || x >= static_cast<int64_t>(k.dims[d])) in = false;
        off += static_cast<size_t>(x) * m.strides[d];
      }
      if (in) want[off / 4] += ctas * static_cast<double>(box[e]);
    }
    const int bits = k.swz == TmaSwizzle::B128 ? 3 : 0;
    std::vector<float> image(elems);
    for (size_t off = 0; off < elems * 4; off += 16) {
      const size_t line = off / 128, chunk = (off % 128) / 16;
      const size_t phys = line * 128 + 16 * (chunk ^ (line % (size_t{1} << bits)));
      std::memcpy(image.data() + phys / 4, box.data() + off / 4, 16);
    }
    DevBuf img(image.size() * 4);
    img.put(image);
    TensorParams prm{};
    prm.image = img.ptr;
    prm.bytes = static_cast<uint32_t>(image.size() * 4);
    for (size_t d = 0; d < k.c.size(); ++d) prm.c[d] = k.c[d];
    fa::emu::store_tensor_map(m, prm.map);
    const std::string p = tensor_kernel(static_cast<int>(m.rank));
    expect_ok(run_ptx(p, "k_tred", geom(ctas, 64, 8192), &prm, sizeof prm));
    const std::vector<float> got = t.get<float>();
    for (size_t i = 0; i < words; ++i)
      if (got[i] != want[i]) {
        std::fprintf(stderr, "%ud box at (%d, ..): word %zu is %g, want %g\n", m.rank, k.c[0], i,
                     got[i], want[i]);
        fail();
      }
  }
}

// ============================================ hazards and misuse ====

// Thread 0 stages 64 bytes at shared 0, fences, and reduces them into
// global memory; the snippets go around the issue (marked "// issue").
std::string hazard_kernel(const std::string &before_issue, const std::string &after_issue,
                          const std::string &others = "", bool fence = true) {
  std::string p = std::string(kSm90) + R"(
.visible .entry k_haz(.param .align 8 .b8 k_haz_param[16])
{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<8>;
  .shared .align 128 .b8 sm[512];
  ld.param.u64 %rd1, [k_haz_param+0];
  ld.param.u64 %rd2, [k_haz_param+8];
  mov.u32 %r1, sm;
  mov.u32 %r2, %tid.x;
  mov.f32 %f1, 0f3F800000;
  shl.b32 %r3, %r2, 2;
  add.u32 %r4, %r1, %r3;
  st.shared.f32 [%r4], %f1; // stage
)";
  if (fence) p += "  fence.proxy.async.shared::cta;\n";
  p +=
      R"(  bar.sync 0;
  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra $L_other;
)" + before_issue +
      "  cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1], 64; // issue\n" +
      after_issue + "  bra $L_end;\n$L_other:\n" + others + "$L_end:\n  ret;\n}\n";
  return p;
}

void expect_launch_error(const std::string &ptx, uint32_t threads, const void *prm,
                         std::initializer_list<std::string> parts) {
  const fa_status st = run_ptx(ptx, "k_haz", geom(1, threads), prm, 16);
  if (st != FA_ERROR_LAUNCH)
    std::fprintf(stderr, "launch: %d\n%s", static_cast<int>(st), ptx.c_str());
  assert_int_equal(st, FA_ERROR_LAUNCH);
  for (const std::string &s : parts) expect_error(s);
}

void test_bulk_hazards(void **) {
  DevBuf dst(256), aux(64);
  dst.put(std::vector<float>(64, 0.0f));
  TwoPtr prm = {dst.ptr, aux.ptr};
  const std::string wait = "  cp.async.bulk.commit_group;\n  cp.async.bulk.wait_group.read 0;\n";
  // Overwriting the source after its wait is fine: 16 threads each staged
  // 1.0, so words 0..15 get 1.0 once.
  {
    const std::string p = hazard_kernel("", wait + "  st.shared.u32 [%r1], %r2;\n");
    expect_ok(run_ptx(p, "k_haz", geom(1, 16), &prm, sizeof prm));
    const std::vector<float> g = dst.get<float>();
    for (int i = 0; i < 64; ++i) assert_true(g[i] == (i < 16 ? 1.0f : 0.0f));
  }
  // A store into the source before the wait: both lines named.
  {
    const std::string p = hazard_kernel("", "  st.shared.u32 [%r1+16], %r2; // write\n" + wait);
    expect_launch_error(
        p, 16, &prm,
        {"st.shared.u32 " + at_line(p, "// write"), "writes shared [0x10, 0x14)",
         "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 " + at_line(p, "// issue"),
         "cp.async.bulk.wait_group"});
  }
  // Committed, but wait_group.read 1 leaves the newest group pending.
  {
    const std::string p = hazard_kernel(
        "",
        "  cp.async.bulk.commit_group;\n  cp.async.bulk.wait_group.read 1;\n"
        "  st.shared.f32 [%r1+60], %f1; // write\n  cp.async.bulk.wait_group.read 0;\n");
    expect_launch_error(p, 16, &prm, {at_line(p, "// write"), at_line(p, "// issue")});
  }
  // An older group retired by wait_group 1 while a newer one still reads
  // other bytes: writing the older one's source is fine, the newer's not.
  {
    const std::string p = hazard_kernel(
        "",
        "  cp.async.bulk.commit_group;\n"
        "  cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1+64], [%r1+128], "
        "16; // second\n"
        "  cp.async.bulk.commit_group;\n  cp.async.bulk.wait_group 1;\n"
        "  st.shared.f32 [%r1], %f1;\n  st.shared.f32 [%r1+132], %f1; // write\n" +
            wait);
    expect_launch_error(p, 16, &prm, {at_line(p, "// write"), at_line(p, "// second")});
  }
  // atom.shared and a landing cp.async into the source.
  {
    const std::string p = hazard_kernel("", "  red.shared.add.f32 [%r1+4], %f1; // write\n" + wait);
    expect_launch_error(p, 16, &prm,
                        {"red.shared.add.f32 " + at_line(p, "// write"), at_line(p, "// issue")});
    const std::string q = hazard_kernel(
        "",
        "  cp.async.ca.shared.global [%r1+32], [%rd2], 4; // write\n  cp.async.wait_all;\n" + wait);
    expect_launch_error(q, 16, &prm, {at_line(q, "// write"), at_line(q, "// issue")});
  }
  // Another thread writes the source while thread 0 has not yet waited
  // (between two barriers; thread 0 waits after the second).
  {
    const std::string p =
        hazard_kernel("", "  bar.sync 0;\n  bar.sync 0;\n" + wait,
                      "  bar.sync 0;\n  setp.eq.u32 %p2, %r2, 5;\n"
                      "  @%p2 st.shared.f32 [%r1+8], %f1; // write\n  bar.sync 0;\n");
    expect_launch_error(
        p, 16, &prm,
        {at_line(p, "// write"), "thread (5,0,0)", at_line(p, "// issue"), "thread (0,0,0)"});
  }
  // The thread exits before waiting (committed or not).
  {
    const std::string p = hazard_kernel("", "  cp.async.bulk.commit_group;\n");
    expect_launch_error(p, 16, &prm,
                        {at_line(p, "// issue"), "exited before a cp.async.bulk.wait_group"});
    const std::string q = hazard_kernel("", "  cp.async.bulk.wait_group.read 0;\n");
    expect_launch_error(q, 16, &prm, {at_line(q, "// issue"), "never committed"});
  }
  // A generic store into the source without fence.proxy.async.
  {
    const std::string p = hazard_kernel("", wait, "", false);
    expect_launch_error(p, 16, &prm,
                        {at_line(p, "// issue"), "read through the async proxy",
                         "st.shared.f32 " + at_line(p, "// stage"), "fence.proxy.async"});
  }
  // Operands.
  {
    const std::string issue =
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1], 64; // issue";
    auto with = [&](const std::string &form) {
      std::string p = hazard_kernel("  mov.u32 %r9, 20;\n", wait);
      p.replace(p.find(issue), issue.size(), form + " // issue");
      return p;
    };
    const std::string bad[][2] = {
        {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1], %r9;",
         "size 20 is not a multiple of 16"},
        {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1+8], 16;",
         "source shared address 0x8 is not 16-byte aligned"},
        {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1+4], [%r1], 16;",
         "is not 16-byte aligned"},
        {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1+240], [%r1], 32;",
         "destination ["},
        {"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1], [%r1+496], 32;",
         "runs past the block's 512 bytes of shared memory"},
    };
    for (const auto &b : bad) {
      const std::string p = with(b[0]);
      expect_launch_error(p, 16, &prm, {at_line(p, "// issue"), b[1]});
    }
  }
  // A tensor reduce needs a typed map (f32, u32 or s32).
  {
    fa::emu::TensorMap m = f32_map({16, 4}, {8, 2}, fa::emu::TmaSwizzle::None);
    DevBuf t(m.strides[1] * 4);
    m.base = t.ptr;
    m.dtype = fa::emu::TmaDtype::Untyped;
    DevBuf img(64);
    TensorParams tp{};
    tp.image = img.ptr;
    tp.bytes = 64;
    fa::emu::store_tensor_map(m, tp.map);
    const std::string p = tensor_kernel(2);
    assert_int_equal(run_ptx(p, "k_tred", geom(1, 64, 1024), &tp, sizeof tp), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "cp.reduce.async.bulk.tensor"));
    expect_error("tensor maps of type f32, u32 or s32");
  }
}

// ========================================================= the parser ====

void expect_refused(const std::string &header, const std::string &inst, const char *what,
                    bool ptxas_rejects) {
  const std::string p = header +
                        ".visible .entry k(.param .u64 k_p)\n{\n"
                        "  .reg .b32 %r<8>;\n  .reg .f32 %f<8>;\n  .reg .b64 %rd<8>;\n"
                        "  .shared .align 128 .b8 sm[256];\n"
                        "  ld.param.u64 %rd1, [k_p];\n  mov.u32 %r1, sm;\n  " +
                        inst + ";\n  ret;\n}\n";
  std::vector<uint8_t> bin;
  std::string log;
  if (g_be->compile(p, &bin, &log) != FA_ERROR_COMPILE) {
    std::fprintf(stderr, "accepted: %s\n", inst.c_str());
    fail();
  }
  expect_error("line 12: ");
  expect_error(what);
  // Where ptxas refuses the form too, it says so (not modelled forms it takes).
  const int ok = ptxas_accepts(p, header.find("sm_90") != std::string::npos ? "sm_90" : "sm_80");
  if (ok >= 0 && ok == (ptxas_rejects ? 1 : 0)) {
    std::fprintf(stderr, "ptxas %s: %s\n", ok ? "accepts" : "rejects", inst.c_str());
    fail();
  }
}

void test_refusals(void **) {
  const std::string s80 = ".version 7.0\n.target sm_80\n.address_size 64\n";
  const std::string s78 = kSm80, s90 = kSm90;
  const std::string s90v80 = ".version 8.0\n.target sm_90\n.address_size 64\n";
  const std::string bulk = "cp.reduce.async.bulk.global.shared::cta.bulk_group";
  // Forms ptxas takes but the emulator does not model.
  expect_refused(s80, "atom.global.add.f64 %rd2, [%rd1], %rd3", ".u32, .s32 and .f32", false);
  expect_refused(s80, "atom.global.inc.u32 %r2, [%rd1], %r3", "'.inc'", false);
  expect_refused(s80, "atom.add.f32 %f1, [%rd1], %f2", "needs .global or .shared", false);
  expect_refused(s90, "red.shared::cluster.add.f32 [%r1], %f2", "not modelled", false);
  expect_refused(s90, "atom.global.add.v2.f32 {%f1, %f2}, [%rd1], {%f3, %f4}",
                 "vector atom is not supported", false);
  expect_refused(s90, bulk + ".min.u32 [%rd1], [%r1], 16", "only the .add reduction", false);
  expect_refused(s90, bulk + ".add.f64 [%rd1], [%r1], 16", "only cp.reduce.async.bulk", false);
  expect_refused(s90,
                 "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.im2col_no_offs.bulk_group "
                 "[%rd1, {%r1, %r1, %r1}], [%r1]",
                 "only cp.reduce.async.bulk.tensor", false);
  // Forms ptxas refuses as well.
  expect_refused(s80, "atom.shared::cta.add.f32 %f1, [%r1], %f2", ".version 7.8", true);
  expect_refused(s80, "red.acq_rel.gpu.global.add.f32 [%rd1], %f2", "'.acq_rel'", true);
  expect_refused(s80, "red.global.add.noftz.f32 [%rd1], %f2", "'.noftz'", true);
  expect_refused(s78, "red.global.add.v2.f32 [%rd1], {%f1, %f2}", "requires .target sm_90", true);
  expect_refused(s90v80, "red.global.add.v2.f32 [%rd1], {%f1, %f2}", "requires .version 8.1", true);
  expect_refused(s90, "red.shared.add.v2.f32 [%r1], {%f1, %f2}", "red.global.add.v2.f32", true);
  expect_refused(s90, "red.global.add.v4.f32 [%rd1], {%f1, %f2}", "a vector of 4 values", true);
  expect_refused(s78, bulk + ".add.f32 [%rd1], [%r1], 16", "requires .target sm_90", true);
  expect_refused(s90, bulk + ".add.noftz.f32 [%rd1], [%r1], 16", "only cp.reduce.async.bulk", true);
  expect_refused(s90, bulk + ".add.f32 [%rd1], [%r1], 20", "multiple of 16", true);
  expect_refused(s90,
                 "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group "
                 "[%rd1, {%r1}], [%r1]",
                 "expected 2 coordinates", true);
  expect_refused(s90, "cp.async.bulk.wait_group.write 0", "wait_group{.read}", true);
  expect_refused(s90, "cp.async.bulk.wait_group %r1", "integer constant", true);
}

// ================================================== the PTX builder ====

// Each builder form, its text, ptxas (sm_80 for the scalar atom / red,
// sm_90a for the vector red and the bulk forms), and a run: red_add_v
// and cp_reduce_async_bulk_add into global memory, atom_add / red_add on
// shared memory, their results stored.
void test_builder_forms(void **) {
  using fa::ptx::at;
  using fa::ptx::Builder;
  using fa::ptx::fimm;
  using fa::ptx::imm;
  using fa::ptx::Reg;
  using fa::ptx::Space;
  using fa::ptx::Special;
  using fa::ptx::sreg;
  using fa::ptx::sym;
  using fa::ptx::Type;
  // Scalar forms (sm_80).
  {
    Builder b("k_bs", 8);
    Reg w = b.b64();
    b.ld_param(Type::U64, w, 0);
    fa::ptx::Symbol sm = b.shared("sm", 16, 16);
    Reg f = b.f32(), old = b.f32(), u = b.b32();
    b.mov(Type::F32, f, fimm(0.75f));
    b.atom_add(Space::Global, false, Type::F32, old, at(w, 0), f);
    b.red_add(Space::Global, true, Type::F32, at(w, 4), fimm(2.5f));
    b.atom_add(Space::Shared, true, Type::U32, u, at(sm, 0), imm(7));
    b.red_add(Space::Shared, false, Type::F32, at(sm, 4), f);
    const std::string ptx = b.emit(70, 80, 32);
    for (const char *s : {"\tatom.global.relaxed.gpu.add.f32 %f1, [%rd0], %f0;\n",
                          "\tred.global.release.gpu.add.f32 [%rd0+4], 0f40200000;\n",
                          "\tatom.shared.acq_rel.cta.add.u32 %r0, [sm], 7;\n",
                          "\tred.shared.relaxed.cta.add.f32 [sm+4], %f0;\n"})
      if (ptx.find(s) == std::string::npos) {
        std::fprintf(stderr, "no \"%s\" in\n%s", s, ptx.c_str());
        fail();
      }
    if (ptxas_accepts(ptx, "sm_80") == 0) {
      std::fprintf(stderr, "ptxas -arch=sm_80 rejects:\n%s", ptx.c_str());
      fail();
    }
  }
  // The sm_90 forms, assembled for sm_90a and run by 4 threads: thread t
  // adds (t, t + 1, t + 2, t + 3) into words 0..3 (red_add_v .v4) and (t +
  // 1, t + 2) into words 4, 5 (.v2); t + 1, t + 2, t + 3, t into shared
  // f32 words 0..3 (atom_add / red_add), 5 and 1 into shared u32 words 4, 5;
  // thread 0 then bulk-reduces shared words 0..3 (f32) into words 8..11 and
  // 4..7 (u32, the size in a register) into words 12..15.
  Builder b("k_bv", 8);
  b.set_arch_specific(true);
  Reg raw = b.b64(), w = b.b64();
  b.ld_param(Type::U64, raw, 0);
  b.cvta_to_global(w, raw);
  fa::ptx::Symbol sm = b.shared("sm", 128, 32);
  Reg tid = b.b32(), zero = b.b32(), smaddr = b.b32(), size = b.b32(), old = b.b32();
  Reg ft = b.f32(), f1 = b.f32(), f2 = b.f32(), f3 = b.f32(), fold = b.f32();
  Reg p0 = b.pred();
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.mov(Type::U32, zero, imm(0));
  b.mov(Type::U32, smaddr, sym(sm));
  b.cvt(Type::F32, Type::U32, fa::ptx::Round::Rn, ft, tid);
  b.op(fa::ptx::Op::Add, Type::F32, f1, ft, fimm(1.0f));
  b.op(fa::ptx::Op::Add, Type::F32, f2, ft, fimm(2.0f));
  b.op(fa::ptx::Op::Add, Type::F32, f3, ft, fimm(3.0f));
  b.red_add_v(at(w, 0), {ft, f1, f2, f3});
  b.red_add_v(at(w, 16), {f1, f2});
  b.setp(fa::ptx::Cmp::Eq, Type::U32, p0, tid, imm(0));
  b.when(p0).st_v(Space::Shared, Type::U32, at(smaddr, 0), {zero, zero, zero, zero});
  b.when(p0).st_v(Space::Shared, Type::U32, at(smaddr, 16), {zero, zero, zero, zero});
  b.bar_sync();
  b.atom_add(Space::Shared, false, Type::F32, fold, at(smaddr, 0), f1);
  b.red_add(Space::Shared, false, Type::F32, at(smaddr, 4), f2);
  b.red_add(Space::Shared, true, Type::F32, at(smaddr, 8), f3);
  b.red_add(Space::Shared, false, Type::F32, at(smaddr, 12), ft);
  b.red_add(Space::Shared, false, Type::U32, at(smaddr, 16), imm(5));
  b.atom_add(Space::Shared, false, Type::U32, old, at(smaddr, 20), imm(1));
  b.fence_proxy_async();
  b.bar_sync();
  fa::ptx::Label end = b.label();
  b.unless(p0).bra(end);
  b.mov(Type::U32, size, imm(16));
  b.cp_reduce_async_bulk_add(Type::F32, at(w, 32), at(smaddr, 0), imm(16));
  b.cp_reduce_async_bulk_add(Type::U32, at(w, 48), at(smaddr, 16), size);
  b.cp_async_bulk_commit();
  b.cp_async_bulk_wait(0, true);
  b.cp_async_bulk_wait(0, false);
  b.bind(end);
  b.exit();
  const std::string ptx = b.emit(81, 90, 32);
  for (const char *s :
       {"\tred.global.relaxed.gpu.add.v4.f32 [%rd1], {%f0, %f1, %f2, %f3};\n",
        "\tred.global.relaxed.gpu.add.v2.f32 [%rd1+16], {%f1, %f2};\n",
        "\tcp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd1+32], [%r2], 16;\n",
        "\tcp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32 [%rd1+48], [%r2+16], "
        "%r3;\n",
        "\tcp.async.bulk.commit_group;\n", "\tcp.async.bulk.wait_group.read 0;\n",
        "\tcp.async.bulk.wait_group 0;\n"})
    if (ptx.find(s) == std::string::npos) {
      std::fprintf(stderr, "no \"%s\" in\n%s", s, ptx.c_str());
      fail();
    }
  // sm_90a as emitted; the same text for plain sm_90 (none of it needs the
  // architecture-specific target).
  std::string plain = ptx;
  plain.replace(plain.find(".target sm_90a"), 14, ".target sm_90");
  if (ptxas_accepts(ptx, "sm_90a") == 0 || ptxas_accepts(plain, "sm_90") == 0) {
    std::fprintf(stderr, "ptxas rejects:\n%s", ptx.c_str());
    fail();
  }
  DevBuf words(64);
  std::vector<uint32_t> init(16, 0);
  for (int i = 12; i < 16; ++i) init[i] = 100;
  words.put(init);
  TwoPtr prm = {words.ptr, 0};
  expect_ok(run_ptx(ptx, "k_bv", geom(1, 4), &prm, 8));
  const std::vector<uint32_t> g = words.get<uint32_t>();
  const float want_f[12] = {6, 10, 14, 18, 10, 14, 0, 0, 10, 14, 18, 6};
  for (int i = 0; i < 12; ++i)
    if (bitsf(g[i]) != want_f[i]) {
      std::fprintf(stderr, "word %d: %g, want %g\n", i, bitsf(g[i]), want_f[i]);
      fail();
    }
  const uint32_t want_u[4] = {120, 104, 100, 100};
  for (int i = 0; i < 4; ++i) assert_int_equal(g[12 + i], want_u[i]);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_global_adds),         cmocka_unit_test(test_shared_adds),
      cmocka_unit_test(test_rounding_subnormals), cmocka_unit_test(test_vector_red),
      cmocka_unit_test(test_bulk_reduce),         cmocka_unit_test(test_tensor_reduce),
      cmocka_unit_test(test_bulk_hazards),        cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_builder_forms),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
