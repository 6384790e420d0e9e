// Tests of the emulator's tensor-core path through the Backend interface,
// with hand-written PTX: mma.sync (f16/bf16, m16n8k16/m16n8k8) against an
// fp64 reference and with per-element markers that check the fragment layout,
// ldmatrix (x1/x2/x4, .trans) against the documented fragments, cp.async
// visibility (copies land only at the wait that retires their group),
// zero-fill and the faults, an ldmatrix + mma tile fed by cp.async, and the
// divergence reports of the warp-wide (.aligned) instructions.
#include <cmath>
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
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

std::string at_line(const std::string &ptx, const char *marker) {
  return " at PTX line " + std::to_string(line_of(ptx, marker));
}

constexpr uint32_t kPoison32 = 0xABABABABu;

uint32_t fbits(float f) { return fa::emu::f32_bits(f); }
float bitsf(uint32_t u) { return fa::emu::bits_f32(u); }

// ------------------------------------------------------ mma fragments ----
// The documented per-lane layout (PTX ISA "Matrix Fragments for
// mma.m16n8k16 / mma.m16n8k8 with floating point type"), written here
// independently of the emulator: g = lane / 4, q = lane % 4.

struct MmaShape {
  bool bf16;
  int k;  // 16 or 8
  const char *name() const {
    return k == 16 ? (bf16 ? "m16n8k16 bf16" : "m16n8k16 f16")
                   : (bf16 ? "m16n8k8 bf16" : "m16n8k8 f16");
  }
};

uint16_t to_half(const MmaShape &s, float v) {
  return s.bf16 ? fa::emu::f32_to_bf16_rn(v) : fa::emu::f32_to_f16_rn(v);
}
float from_half(const MmaShape &s, uint16_t h) {
  return s.bf16 ? fa::emu::bf16_to_f32(h) : fa::emu::f16_to_f32(h);
}

// Row and column of A element i (0..7) held by lane.
void a_pos(int lane, int i, int *row, int *col) {
  int g = lane / 4, q = lane % 4;
  *row = (i == 0 || i == 1 || i == 4 || i == 5) ? g : g + 8;
  *col = q * 2 + (i % 2) + (i >= 4 ? 8 : 0);
}
// Row (k) and column of B element i (0..3).
void b_pos(int lane, int i, int *row, int *col) {
  int g = lane / 4, q = lane % 4;
  *row = q * 2 + (i % 2) + (i >= 2 ? 8 : 0);
  *col = g;
}
// Row and column of C/D element i (0..3).
void c_pos(int lane, int i, int *row, int *col) {
  int g = lane / 4, q = lane % 4;
  *row = i < 2 ? g : g + 8;
  *col = q * 2 + (i % 2);
}

// Packs half-precision A (16 x K), B (K x 8) and f32 C (16 x 8) into the
// per-lane fragment words: a[lane*4 + r], b[lane*2 + r], c[lane*4 + i].
void pack_fragments(const MmaShape &s, const std::vector<uint16_t> &A,
                    const std::vector<uint16_t> &B, const std::vector<float> &C,
                    std::vector<uint32_t> *a, std::vector<uint32_t> *b, std::vector<float> *c) {
  a->assign(32 * 4, 0);
  b->assign(32 * 2, 0);
  c->assign(32 * 4, 0.0f);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < s.k / 2; ++i) {
      int row, col;
      a_pos(lane, i, &row, &col);
      (*a)[lane * 4 + i / 2] |= static_cast<uint32_t>(A[row * s.k + col]) << (16 * (i % 2));
    }
    for (int i = 0; i < s.k / 4; ++i) {
      int row, col;
      b_pos(lane, i, &row, &col);
      (*b)[lane * 2 + i / 2] |= static_cast<uint32_t>(B[row * 8 + col]) << (16 * (i % 2));
    }
    for (int i = 0; i < 4; ++i) {
      int row, col;
      c_pos(lane, i, &row, &col);
      (*c)[lane * 4 + i] = C[row * 8 + col];
    }
  }
}

// One warp: loads its fragments, runs one mma.sync, stores D per lane.
std::string mma_kernel(const MmaShape &s) {
  std::string t = s.bf16 ? "bf16" : "f16";
  std::string shape = s.k == 16 ? "m16n8k16" : "m16n8k8";
  std::string a_load = s.k == 16 ? "  ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd6];\n"
                                 : "  ld.global.v2.u32 {%r10, %r11}, [%rd6];\n";
  std::string b_load =
      s.k == 16 ? "  ld.global.v2.u32 {%r14, %r15}, [%rd7];\n" : "  ld.global.u32 %r14, [%rd7];\n";
  std::string a_vec = s.k == 16 ? "{%r10, %r11, %r12, %r13}" : "{%r10, %r11}";
  std::string b_vec = s.k == 16 ? "{%r14, %r15}" : "{%r14}";
  return std::string(kHeader) + R"(
.visible .entry k_mma(.param .align 8 .b8 k_mma_param[32])
{
  .reg .b32 %r<20>;
  .reg .f32 %f<12>;
  .reg .b64 %rd<12>;
  ld.param.u64 %rd1, [k_mma_param+0];
  ld.param.u64 %rd2, [k_mma_param+8];
  ld.param.u64 %rd3, [k_mma_param+16];
  ld.param.u64 %rd4, [k_mma_param+24];
  mov.u32 %r1, %laneid;
  mul.wide.u32 %rd5, %r1, 16;
  add.s64 %rd6, %rd1, %rd5;
  mul.wide.u32 %rd9, %r1, 8;
  add.s64 %rd7, %rd2, %rd9;
  add.s64 %rd8, %rd3, %rd5;
  add.s64 %rd10, %rd4, %rd5;
)" + a_load +
         b_load +
         R"(  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd8];
  mma.sync.aligned.)" +
         shape + ".row.col.f32." + t + "." + t + R"(.f32 {%f5, %f6, %f7, %f8}, )" + a_vec + ", " +
         b_vec + R"(, {%f1, %f2, %f3, %f4};
  st.global.v4.f32 [%rd10], {%f5, %f6, %f7, %f8};
}
)";
}

struct MmaParams {
  uint64_t a, b, c, d;
};

// Runs one mma over A (16 x K), B (K x 8), C (16 x 8); returns D (16 x 8)
// decoded through the documented layout. Every D word is checked written.
std::vector<float> run_mma(const MmaShape &s, const std::vector<uint16_t> &A,
                           const std::vector<uint16_t> &B, const std::vector<float> &C) {
  std::vector<uint32_t> a, b;
  std::vector<float> c;
  pack_fragments(s, A, B, C, &a, &b, &c);
  DevBuf da(a.size() * 4), db(b.size() * 4), dc(c.size() * 4), dd(32 * 4 * 4);
  da.put(a);
  db.put(b);
  dc.put(c);
  MmaParams prm = {da.ptr, db.ptr, dc.ptr, dd.ptr};
  std::string ptx = mma_kernel(s);
  fa_status st = run_ptx(ptx, "k_mma", geom(1, 32), &prm, sizeof prm);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s: %s\n", s.name(), fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  std::vector<uint32_t> words = dd.get<uint32_t>();
  std::vector<float> D(16 * 8, NAN);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      assert_int_not_equal(words[lane * 4 + i], kPoison32);
      int row, col;
      c_pos(lane, i, &row, &col);
      D[row * 8 + col] = bitsf(words[lane * 4 + i]);
    }
  }
  return D;
}

const MmaShape kShapes[] = {{false, 16}, {true, 16}, {false, 8}, {true, 8}};

void test_mma_random(void **) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (const MmaShape &s : kShapes) {
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<uint16_t> A(16 * s.k), B(s.k * 8);
      std::vector<float> C(16 * 8);
      for (auto &x : A) x = to_half(s, u(rng));
      for (auto &x : B) x = to_half(s, u(rng));
      for (auto &x : C) x = u(rng) * 4.0f;
      std::vector<float> D = run_mma(s, A, B, C);
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          double ref = C[m * 8 + n], mag = std::fabs(ref);
          // The documented order: D = C, then += A[m][k] * B[k][n] for k = 0.., in f32.
          float seq = C[m * 8 + n];
          for (int k = 0; k < s.k; ++k) {
            double p =
                static_cast<double>(from_half(s, A[m * s.k + k])) * from_half(s, B[k * 8 + n]);
            ref += p;
            mag += std::fabs(p);
            seq = seq + static_cast<float>(p);
          }
          const float got = D[m * 8 + n];
          // Exact products, k sequential f32 roundings of partial sums.
          const double tol = s.k * std::ldexp(1.0, -24) * mag + 1e-30;
          if (!(std::fabs(got - ref) <= tol) || fbits(got) != fbits(seq)) {
            std::fprintf(stderr,
                         "%s rep %d D[%d][%d] = %.9g, fp64 %.9g (tol %.3g), f32 order %.9g\n",
                         s.name(), rep, m, n, got, ref, tol, seq);
            fail();
          }
        }
      }
    }
  }
}

// Layout by markers: A one-hot along k (A[m][k0] = m + 1, other k zero), B
// distinct everywhere (B[k][n] = 16n + k + 1), C[m][n] = 4096 (8m + n + 1).
// Then D[m][n] = 4096 (8m + n + 1) + (m + 1)(16n + k0 + 1) exactly, and a wrong
// mapping of any A, B or C element shows up decoded as the (row, k, col) it
// came from. The same with the roles of A and B swapped.
void test_mma_layout_markers(void **) {
  for (const MmaShape &s : kShapes) {
    for (int side = 0; side < 2; ++side) {
      for (int k0 = 0; k0 < s.k; ++k0) {
        std::vector<uint16_t> A(16 * s.k), B(s.k * 8);
        std::vector<float> C(16 * 8);
        for (int m = 0; m < 16; ++m)
          for (int k = 0; k < s.k; ++k)
            A[m * s.k + k] = to_half(
                s, side == 0 ? (k == k0 ? m + 1.0f : 0.0f) : static_cast<float>(16 * m + k + 1));
        for (int k = 0; k < s.k; ++k)
          for (int n = 0; n < 8; ++n)
            B[k * 8 + n] = to_half(
                s, side == 0 ? static_cast<float>(16 * n + k + 1) : (k == k0 ? n + 1.0f : 0.0f));
        for (int m = 0; m < 16; ++m)
          for (int n = 0; n < 8; ++n) C[m * 8 + n] = 4096.0f * (8 * m + n + 1);
        std::vector<float> D = run_mma(s, A, B, C);
        for (int m = 0; m < 16; ++m) {
          for (int n = 0; n < 8; ++n) {
            const float prod =
                side == 0 ? (m + 1.0f) * (16 * n + k0 + 1) : (16.0f * m + k0 + 1) * (n + 1);
            const float want = 4096.0f * (8 * m + n + 1) + prod;
            const float got = D[m * 8 + n];
            if (got != want) {
              const double cpart = std::floor(got / 4096.0), ppart = got - 4096.0 * cpart;
              std::fprintf(stderr,
                           "%s side %d k0 %d: D[%d][%d] = %.1f (C marker %.0f, product %.1f); "
                           "want C marker %d, product %.0f\n",
                           s.name(), side, k0, m, n, got, cpart, ppart, 8 * m + n + 1, prod);
              fail();
            }
          }
        }
      }
    }
  }
}

// cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half (PTX ISA cvt),
// which is how fragments are packed from f32 results.
void test_cvt_x2_order(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_x2(.param .align 8 .b8 k_x2_param[8])
{
  .reg .b32 %r<4>;
  .reg .f32 %f<4>;
  .reg .b64 %rd<4>;
  .reg .b16 %h<4>;
  ld.param.u64 %rd1, [k_x2_param+0];
  ld.global.f32 %f1, [%rd1+0];
  ld.global.f32 %f2, [%rd1+4];
  cvt.rn.f16x2.f32 %r1, %f1, %f2;
  st.global.u32 [%rd1+8], %r1;
  cvt.rn.bf16x2.f32 %r2, %f1, %f2;
  st.global.u32 [%rd1+12], %r2;
  mov.b32 {%h1, %h2}, %r1;
  mov.b32 %r3, {%h2, %h1};
  st.global.u32 [%rd1+16], %r3;
}
)";
  DevBuf b(20);
  b.put(std::vector<float>{1.5f, -2.25f});
  uint64_t prm = b.ptr;
  assert_int_equal(run_ptx(p, "k_x2", geom(1, 1), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> w = b.get<uint32_t>();
  assert_int_equal(w[2], (uint32_t{0x3E00} << 16) | 0xC080u);  // {1.5 high, -2.25 low}
  assert_int_equal(w[3], (uint32_t{0x3FC0} << 16) | 0xC010u);
  assert_int_equal(w[4], (uint32_t{0xC080} << 16) | 0x3E00u);
}

// ------------------------------------------------------------ ldmatrix ----

// Shared memory: 32 rows of 16 b16 elements (32 bytes), element (row, col)
// = row * 256 + col. Lane l takes its row address from addrs[l]; lanes past
// 8 * count get an odd address, which must be ignored.
std::string ldmatrix_kernel(int count, bool trans) {
  std::string regs = "{%r10";
  for (int j = 1; j < count; ++j) regs += ", %r1" + std::to_string(j);
  regs += "}";
  std::string stores;
  for (int j = 0; j < count; ++j)
    stores +=
        "  st.global.u32 [%rd6+" + std::to_string(4 * j) + "], %r1" + std::to_string(j) + ";\n";
  return std::string(kHeader) + R"(
.visible .entry k_ldm(.param .align 8 .b8 k_ldm_param[24])
{
  .reg .b32 %r<20>;
  .reg .b64 %rd<12>;
  .shared .align 16 .b8 tile[1024];
  ld.param.u64 %rd1, [k_ldm_param+0];
  ld.param.u64 %rd2, [k_ldm_param+8];
  ld.param.u64 %rd3, [k_ldm_param+16];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd4, %r1, 32;
  add.s64 %rd5, %rd1, %rd4;
  mov.u32 %r2, tile;
  shl.b32 %r3, %r1, 5;
  add.u32 %r3, %r2, %r3;
  ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd5];
  st.shared.v4.u32 [%r3], {%r4, %r5, %r6, %r7};
  ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd5+16];
  st.shared.v4.u32 [%r3+16], {%r4, %r5, %r6, %r7};
  bar.sync 0;
  mul.wide.u32 %rd4, %r1, 4;
  add.s64 %rd5, %rd2, %rd4;
  ld.global.u32 %r8, [%rd5];
  add.u32 %r8, %r8, %r2;
  ldmatrix.sync.aligned.m8n8.x)" +
         std::to_string(count) + (trans ? ".trans" : "") + ".shared.b16 " + regs + R"(, [%r8];
  mul.wide.u32 %rd4, %r1, 16;
  add.s64 %rd6, %rd3, %rd4;
)" + stores +
         "}\n";
}

struct LdmParams {
  uint64_t src, addrs, out;
};

void test_ldmatrix(void **) {
  std::vector<uint16_t> smem(32 * 16);
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 16; ++c) smem[r * 16 + c] = static_cast<uint16_t>(r * 256 + c);
  DevBuf src(smem.size() * 2), addrs(32 * 4), out(32 * 16);
  src.put(smem);
  for (int count : {1, 2, 4}) {
    for (bool trans : {false, true}) {
      // Matrix j, row r comes from a scattered place: shared row
      // (5 * (8j + r) + 3) % 32, left or right half by parity.
      std::vector<uint32_t> a(32);
      for (int l = 0; l < 32; ++l) {
        uint32_t srow = static_cast<uint32_t>((5 * l + 3) % 32);
        a[l] = l < 8 * count ? srow * 32 + 16 * (l % 2) : 0x7u + 64u * l;  // odd: must be unused
      }
      addrs.put(a);
      out.poison();
      LdmParams prm = {src.ptr, addrs.ptr, out.ptr};
      std::string ptx = ldmatrix_kernel(count, trans);
      fa_status st = run_ptx(ptx, "k_ldm", geom(1, 32), &prm, sizeof prm);
      if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
      assert_int_equal(st, FA_SUCCESS);
      std::vector<uint32_t> got = out.get<uint32_t>();
      for (int l = 0; l < 32; ++l) {
        for (int j = 0; j < 4; ++j) {
          uint32_t w = got[l * 4 + j];
          if (j >= count) {
            assert_int_equal(w, kPoison32);
            continue;
          }
          // Element (row, col) of matrix j.
          auto elem = [&](int row, int col) -> uint32_t {
            return smem[(a[8 * j + row] + 2 * col) / 2];
          };
          int g = l / 4, q = l % 4;
          uint32_t lo = trans ? elem(2 * q, g) : elem(g, 2 * q);
          uint32_t hi = trans ? elem(2 * q + 1, g) : elem(g, 2 * q + 1);
          uint32_t want = lo | (hi << 16);
          if (w != want) {
            std::fprintf(stderr, "x%d%s lane %d reg %d: got 0x%08x want 0x%08x\n", count,
                         trans ? ".trans" : "", l, j, w, want);
            fail();
          }
        }
      }
    }
  }
}

void test_ldmatrix_faults(void **) {
  std::vector<uint16_t> smem(32 * 16, 7);
  DevBuf src(smem.size() * 2), addrs(32 * 4), out(32 * 16);
  src.put(smem);
  LdmParams prm = {src.ptr, addrs.ptr, out.ptr};
  std::string ptx = ldmatrix_kernel(4, false);
  // Lane 13 misaligned (8 bytes off).
  std::vector<uint32_t> a(32);
  for (int l = 0; l < 32; ++l) a[l] = 32u * l;
  a[13] += 8;
  addrs.put(a);
  assert_int_equal(run_ptx(ptx, "k_ldm", geom(1, 32), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("ldmatrix.sync.aligned.m8n8.x4.shared.b16" + at_line(ptx, "ldmatrix") +
               ": misaligned shared address " + std::to_string(a[13] + 0));
  expect_error("thread (13,0,0)");
  // Lane 30 past the 1024-byte tile.
  a[13] -= 8;
  a[30] = 1024;
  addrs.put(a);
  assert_int_equal(run_ptx(ptx, "k_ldm", geom(1, 32), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("out-of-bounds shared address 1024 (16 bytes)");
  expect_error("thread (30,0,0)");
  // With x2 the same address of lane 30 is never used.
  std::string ptx2 = ldmatrix_kernel(2, true);
  assert_int_equal(run_ptx(ptx2, "k_ldm", geom(1, 32), &prm, sizeof prm), FA_SUCCESS);
}

// ------------------------------------------------------------ cp.async ----

// Thread t copies 16-byte chunks into shared memory that was first set to a
// sentinel, and records what ld.shared sees before and after each wait.
// out[t * 16 + slot] words.
void test_cp_async_visibility(void **) {
  std::string p = std::string(kHeader) + R"(
.visible .entry k_cpa(.param .align 8 .b8 k_cpa_param[16])
{
  .reg .b32 %r<20>;
  .reg .b64 %rd<12>;
  .shared .align 16 .b8 buf[2048];
  ld.param.u64 %rd1, [k_cpa_param+0];
  ld.param.u64 %rd2, [k_cpa_param+8];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 64;
  add.s64 %rd4, %rd1, %rd3;
  add.s64 %rd5, %rd2, %rd3;
  mov.u32 %r2, buf;
  shl.b32 %r3, %r1, 6;
  add.u32 %r3, %r2, %r3;
  mov.u32 %r4, 0x5e5e5e5e;
  st.shared.v4.u32 [%r3], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r3+16], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r3+32], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r3+48], {%r4, %r4, %r4, %r4};
  cp.async.cg.shared.global [%r3], [%rd4], 16;
  cp.async.commit_group;
  cp.async.ca.shared.global [%r3+16], [%rd4+16], 8;
  cp.async.ca.shared.global [%r3+24], [%rd4+24], 4;
  cp.async.commit_group;
  ld.shared.u32 %r5, [%r3];
  st.global.u32 [%rd5], %r5;
  ld.shared.u32 %r5, [%r3+16];
  st.global.u32 [%rd5+4], %r5;
  cp.async.wait_group 1;
  ld.shared.u32 %r5, [%r3];
  st.global.u32 [%rd5+8], %r5;
  ld.shared.u32 %r5, [%r3+16];
  st.global.u32 [%rd5+12], %r5;
  cp.async.wait_group 0;
  ld.shared.u32 %r5, [%r3+16];
  st.global.u32 [%rd5+16], %r5;
  ld.shared.u32 %r5, [%r3+24];
  st.global.u32 [%rd5+20], %r5;
  ld.shared.u32 %r5, [%r3+28];
  st.global.u32 [%rd5+24], %r5;
  cp.async.cg.shared.global [%r3+32], [%rd4+32], 16;
  ld.shared.u32 %r5, [%r3+44];
  st.global.u32 [%rd5+28], %r5;
  cp.async.wait_group 0;
  ld.shared.u32 %r5, [%r3+44];
  st.global.u32 [%rd5+32], %r5;
  cp.async.wait_all;
  ld.shared.u32 %r5, [%r3+44];
  st.global.u32 [%rd5+36], %r5;
  ld.shared.u32 %r5, [%r3+12];
  st.global.u32 [%rd5+40], %r5;
}
)";
  const int nt = 32;
  std::vector<uint32_t> g(nt * 16);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0x10000000u + static_cast<uint32_t>(i) * 7;
  DevBuf src(g.size() * 4), out(g.size() * 4);
  src.put(g);
  struct {
    uint64_t src, out;
  } prm = {src.ptr, out.ptr};
  assert_int_equal(run_ptx(p, "k_cpa", geom(1, nt), &prm, sizeof prm), FA_SUCCESS);
  std::vector<uint32_t> o = out.get<uint32_t>();
  const uint32_t sent = 0x5e5e5e5eu;
  for (int t = 0; t < nt; ++t) {
    const uint32_t *w = &o[t * 16];
    const uint32_t *s = &g[t * 16];
    assert_int_equal(w[0], sent);   // group 1 pending
    assert_int_equal(w[1], sent);   // group 2 pending
    assert_int_equal(w[2], s[0]);   // wait_group 1 retired group 1 ...
    assert_int_equal(w[3], sent);   // ... but not group 2
    assert_int_equal(w[4], s[4]);   // wait_group 0: 8-byte copy
    assert_int_equal(w[5], s[6]);   // 4-byte copy
    assert_int_equal(w[6], sent);   // bytes past the 4-byte copy untouched
    assert_int_equal(w[7], sent);   // uncommitted copy pending
    assert_int_equal(w[8], sent);   // wait_group 0 does not wait for uncommitted copies
    assert_int_equal(w[9], s[11]);  // wait_all does
    assert_int_equal(w[10], s[3]);
    for (int k = 11; k < 16; ++k) assert_int_equal(w[k], kPoison32);
  }
}

void test_cp_async_zero_fill(void **) {
  // (ignore-src needs PTX ISA 7.5)
  std::string p = std::string(".version 7.5\n.target sm_80\n.address_size 64\n") + R"(
.visible .entry k_zf(.param .align 8 .b8 k_zf_param[24])
{
  .reg .pred %p<2>;
  .reg .b32 %r<20>;
  .reg .b64 %rd<12>;
  .shared .align 16 .b8 buf[64];
  ld.param.u64 %rd1, [k_zf_param+0];
  ld.param.u64 %rd2, [k_zf_param+8];
  ld.param.u32 %r1, [k_zf_param+16];
  mov.u32 %r2, buf;
  mov.u32 %r4, 0x5e5e5e5e;
  st.shared.v4.u32 [%r2], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r2+16], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r2+32], {%r4, %r4, %r4, %r4};
  cp.async.cg.shared.global [%r2], [%rd1], 16, %r1;
  cp.async.cg.shared.global [%r2+16], [%rd1+16], 16, 0;
  setp.ne.u32 %p1, %r1, 0;
  cp.async.ca.shared.global [%r2+32], [%rd1+32], 8, %p1;
  cp.async.ca.shared.global [%r2+40], [%rd1+40], 8;
  cp.async.wait_all;
  ld.shared.v4.u32 {%r5, %r6, %r7, %r8}, [%r2];
  st.global.v4.u32 [%rd2], {%r5, %r6, %r7, %r8};
  ld.shared.v4.u32 {%r5, %r6, %r7, %r8}, [%r2+16];
  st.global.v4.u32 [%rd2+16], {%r5, %r6, %r7, %r8};
  ld.shared.v4.u32 {%r5, %r6, %r7, %r8}, [%r2+32];
  st.global.v4.u32 [%rd2+32], {%r5, %r6, %r7, %r8};
}
)";
  // The source is only 48 bytes: with src-size 0 nothing is read.
  std::vector<uint8_t> g(48);
  for (int i = 0; i < 48; ++i) g[i] = static_cast<uint8_t>(0x40 + i);
  DevBuf src(48), out(48);
  src.put(g);
  for (uint32_t n : {5u, 0u, 16u}) {
    out.poison();
    struct {
      uint64_t src, out;
      uint32_t n, pad;
    } prm = {src.ptr, out.ptr, n, 0};
    fa_status st = run_ptx(p, "k_zf", geom(1, 1), &prm, sizeof prm);
    if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
    assert_int_equal(st, FA_SUCCESS);
    std::vector<uint8_t> o = out.get<uint8_t>();
    for (uint32_t i = 0; i < 16; ++i) assert_int_equal(o[i], i < n ? g[i] : 0);
    for (int i = 16; i < 32; ++i) assert_int_equal(o[i], 0);             // src-size 0
    for (int i = 32; i < 40; ++i) assert_int_equal(o[i], n ? 0 : g[i]);  // ignore-src = (n != 0)
    for (int i = 40; i < 48; ++i) assert_int_equal(o[i], g[i]);
  }
}

void test_cp_async_faults(void **) {
  auto kernel = [](const char *line) {
    return std::string(kHeader) + R"(
.visible .entry k_cpf(.param .align 8 .b8 k_cpf_param[16])
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  .shared .align 16 .b8 buf[64];
  ld.param.u64 %rd1, [k_cpf_param+0];
  ld.param.u32 %r1, [k_cpf_param+8];
  mov.u32 %r2, buf;
  )" + std::string(line) +
           R"(
  cp.async.wait_all;
}
)";
  };
  DevBuf src(64);
  struct {
    uint64_t src;
    uint32_t n, pad;
  } prm = {src.ptr, 16, 0};
  struct Case {
    const char *line;
    std::string want;
  } cases[] = {
      {"cp.async.cg.shared.global [%r2], [%rd1+64], 16;",
       "out-of-bounds global address 0x" +
           [&] {
             char b[32];
             std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(src.ptr + 64));
             return std::string(b);
           }() +
           " (16 bytes) starts 0 bytes after the end of allocation"},
      {"cp.async.cg.shared.global [%r2], [%rd1+56], 16;", "misaligned global address"},
      {"cp.async.ca.shared.global [%r2+4], [%rd1], 8;",
       "misaligned shared address 4 (8 bytes) is not naturally aligned"},
      {"cp.async.cg.shared.global [%r2+64], [%rd1], 16;", "out-of-bounds shared address 64"},
      {"cp.async.ca.shared.global [%r2], [%rd1], 8, %r1;", "src-size 16 exceeds cp-size 8"},
  };
  for (const Case &c : cases) {
    std::string ptx = kernel(c.line);
    assert_int_equal(run_ptx(ptx, "k_cpf", geom(1, 1), &prm, sizeof prm), FA_ERROR_LAUNCH);
    std::string op(c.line, std::strchr(c.line, ' '));
    expect_error(op + at_line(ptx, "cp.async.c") + ": ");
    expect_error(c.want);
  }
  // Sources must be aligned to cp-size even when src-size is smaller.
  prm.n = 8;
  std::string mis = kernel("cp.async.cg.shared.global [%r2], [%rd1+40], 16, %r1;");
  assert_int_equal(run_ptx(mis, "k_cpf", geom(1, 1), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("misaligned global address");
  // Only src-size bytes are bounds-checked: the last 8 bytes of a 56-byte
  // allocation with cp-size 16; with src-size 16 the same copy is reported.
  DevBuf small(56);
  prm.src = small.ptr;
  std::string tail = kernel("cp.async.cg.shared.global [%r2], [%rd1+48], 16, %r1;");
  assert_int_equal(run_ptx(tail, "k_cpf", geom(1, 1), &prm, sizeof prm), FA_SUCCESS);
  prm.n = 16;
  assert_int_equal(run_ptx(tail, "k_cpf", geom(1, 1), &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("(16 bytes) runs 8 bytes past the end of allocation");
  // Parse-time checks.
  std::string bad = kernel("cp.async.cg.shared.global [%r2], [%rd1], 8;");
  assert_int_equal(run_ptx(bad, "k_cpf", geom(1, 1), &prm, sizeof prm), FA_ERROR_COMPILE);
  expect_error("cp.async.cg needs cp-size 16");
}

// ---------------------------------------------- cp.async -> ldmatrix -> mma ----

// A 16x16 (row-major) and B 16x8 (row-major, k by n) arrive in shared
// memory by cp.async; A fragments by ldmatrix.x4, B by ldmatrix.x2.trans;
// one m16n8k16 mma. With the wait removed the tile is read before the copies
// land, and the result is wrong: the pipeline bug the cp.async model exists
// to expose.
std::string tile_kernel(bool with_wait, const char *type) {
  return std::string(kHeader) + R"(
.visible .entry k_tile(.param .align 8 .b8 k_tile_param[24])
{
  .reg .pred %p<2>;
  .reg .b32 %r<32>;
  .reg .f32 %f<12>;
  .reg .b64 %rd<12>;
  .shared .align 128 .b8 smem[768];
  ld.param.u64 %rd1, [k_tile_param+0];
  ld.param.u64 %rd2, [k_tile_param+8];
  ld.param.u64 %rd3, [k_tile_param+16];
  mov.u32 %r1, %laneid;
  mov.u32 %r2, smem;
  mul.wide.u32 %rd4, %r1, 16;
  add.s64 %rd5, %rd1, %rd4;
  shl.b32 %r3, %r1, 4;
  add.u32 %r3, %r2, %r3;
  cp.async.cg.shared.global [%r3], [%rd5], 16;
  setp.lt.u32 %p1, %r1, 16;
  @%p1 cp.async.cg.shared.global [%r3+512], [%rd5+512], 16;
  cp.async.commit_group;
)" + std::string(with_wait ? "  cp.async.wait_group 0;\n" : "") +
         R"(  bar.sync 0;
  and.b32 %r4, %r1, 15;
  shl.b32 %r4, %r4, 5;
  shr.u32 %r5, %r1, 4;
  shl.b32 %r5, %r5, 4;
  add.u32 %r4, %r4, %r5;
  add.u32 %r4, %r4, %r2;
  ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r10, %r11, %r12, %r13}, [%r4];
  and.b32 %r6, %r1, 15;
  shl.b32 %r6, %r6, 4;
  add.u32 %r6, %r6, %r2;
  ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%r14, %r15}, [%r6+512];
  add.s64 %rd6, %rd2, %rd4;
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd6];
  mma.sync.aligned.m16n8k16.row.col.f32.)" +
         type + "." + type +
         R"(.f32 {%f5, %f6, %f7, %f8}, {%r10, %r11, %r12, %r13}, {%r14, %r15}, {%f1, %f2, %f3, %f4};
  add.s64 %rd7, %rd3, %rd4;
  st.global.v4.f32 [%rd7], {%f5, %f6, %f7, %f8};
}
)";
}

void test_tile_pipeline(void **) {
  // ldmatrix.x4 over row-major A gives matrices (rows 0-7, cols 0-7),
  // (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15):
  // lane l addresses row (l % 16), column block l / 16 — which is exactly
  // the a0..a7 order of the mma A fragment. ldmatrix.x2.trans over
  // row-major B (k rows) gives the col-major B fragment.
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (const MmaShape &s : {MmaShape{false, 16}, MmaShape{true, 16}}) {
    std::vector<uint16_t> AB(16 * 16 + 16 * 8);
    for (auto &x : AB) x = to_half(s, u(rng));
    std::vector<float> C(16 * 8);
    for (auto &x : C) x = u(rng);
    std::vector<uint32_t> a, b;
    std::vector<float> cfrag;
    std::vector<uint16_t> A(AB.begin(), AB.begin() + 256), B(AB.begin() + 256, AB.end());
    pack_fragments(s, A, B, C, &a, &b, &cfrag);
    DevBuf dab(AB.size() * 2), dc(cfrag.size() * 4), dd(32 * 16);
    dab.put(AB);
    dc.put(cfrag);
    struct {
      uint64_t ab, c, d;
    } prm = {dab.ptr, dc.ptr, dd.ptr};
    const char *type = s.bf16 ? "bf16" : "f16";
    for (bool with_wait : {true, false}) {
      dd.poison();
      std::string ptx = tile_kernel(with_wait, type);
      fa_status st = run_ptx(ptx, "k_tile", geom(1, 32), &prm, sizeof prm);
      if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
      assert_int_equal(st, FA_SUCCESS);
      std::vector<uint32_t> w = dd.get<uint32_t>();
      int wrong = 0;
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
          assert_int_not_equal(w[lane * 4 + i], kPoison32);
          int m, n;
          c_pos(lane, i, &m, &n);
          double ref = C[m * 8 + n], mag = std::fabs(ref);
          for (int k = 0; k < 16; ++k) {
            double p =
                static_cast<double>(from_half(s, A[m * 16 + k])) * from_half(s, B[k * 8 + n]);
            ref += p;
            mag += std::fabs(p);
          }
          float got = bitsf(w[lane * 4 + i]);
          bool ok = std::fabs(got - ref) <= 16 * std::ldexp(1.0, -24) * mag + 1e-30;
          if (with_wait && !ok) {
            std::fprintf(stderr, "%s tile D[%d][%d] = %.9g want %.9g\n", type, m, n, got, ref);
            fail();
          }
          wrong += !ok;
        }
      }
      if (!with_wait) assert_int_equal(wrong, 128);  // never-landed tiles read as 0xffff (NaN)
    }
  }
}

// ---------------------------------------------------------- divergence ----

void test_divergence(void **) {
  // Only lanes 0-15 reach the mma.
  std::string p = std::string(kHeader) + R"(
.visible .entry k_div()
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .f32 %f<12>;
  mov.u32 %r1, %tid.x;
  mov.b32 %r2, 0;
  mov.f32 %f1, 0f00000000;
  setp.ge.u32 %p1, %r1, 16;
  @%p1 bra $L_out;
  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f5, %f6, %f7, %f8}, {%r2, %r2, %r2, %r2}, {%r2, %r2}, {%f1, %f1, %f1, %f1};
$L_out:
  ret;
}
)";
  assert_int_equal(run_ptx(p, "k_div", geom(1, 32), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" + at_line(p, "mma.sync") +
               ": lanes 16-31 of membermask 0xffffffff did not arrive (lanes 16-31 exited)");
  // The two halves at two different mma instructions.
  std::string q = p;
  q.replace(q.find("$L_out:\n  ret;"), 14,
            "  ret;\n$L_out:\n  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f5, %f6, "
            "%f7, %f8}, {%r2, %r2, %r2, %r2}, {%r2, %r2}, {%f1, %f1, %f1, %f1};\n  ret;");
  assert_int_equal(run_ptx(q, "k_div", geom(1, 32), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("did not arrive (lanes 16-31 wait at PTX line");
  // The full warp passes; a 16-thread block has no lanes 16-31.
  std::string ok = p;
  ok.replace(ok.find("@%p1 bra $L_out;"), 16, "");
  assert_int_equal(run_ptx(ok, "k_div", geom(1, 32), nullptr, 0), FA_SUCCESS);
  assert_int_equal(run_ptx(ok, "k_div", geom(1, 16), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("lanes 16-31 do not exist");

  // ldmatrix with lanes 8-31 guarded off.
  std::string l = std::string(kHeader) + R"(
.visible .entry k_ldiv()
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .shared .align 16 .b8 t[128];
  mov.u32 %r1, %tid.x;
  and.b32 %r2, %r1, 7;
  shl.b32 %r2, %r2, 4;
  setp.lt.u32 %p1, %r1, 8;
  @%p1 ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%r3}, [%r2];
  bar.sync 0;
}
)";
  assert_int_equal(run_ptx(l, "k_ldiv", geom(1, 32), nullptr, 0), FA_ERROR_LAUNCH);
  expect_error(
      "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16" + at_line(l, "ldmatrix") +
      ": lanes 8-31 of membermask 0xffffffff did not arrive (lanes 8-31 wait at PTX line " +
      std::to_string(line_of(l, "bar.sync")));
  std::string l2 = l;
  l2.replace(l2.find("@%p1 "), 5, "");
  assert_int_equal(run_ptx(l2, "k_ldiv", geom(1, 64), nullptr, 0), FA_SUCCESS);
}

void test_parse_errors(void **) {
  const char *bad[] = {
      "mma.sync.aligned.m16n8k16.row.row.f32.f16.f16.f32 {%f1, %f1, %f1, %f1}, {%r1, %r1, %r1, "
      "%r1}, {%r1, %r1}, {%f1, %f1, %f1, %f1};",
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f1, %f1, %f1}, {%r1, %r1}, {%r1, "
      "%r1}, {%f1, %f1, %f1, %f1};",
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r1}, [%r1];",
      "ldmatrix.sync.aligned.m8n8.x3.shared.b16 {%r1, %r1, %r1}, [%r1];",
      "cp.async.ca.shared.global [%r1], [%rd1], 12;",
      "cp.async.wait_group %r1;",
  };
  for (const char *b : bad) {
    std::string p = std::string(kHeader) +
                    ".visible .entry k_bad()\n{\n  .reg .b32 %r<4>;\n  .reg .f32 %f<4>;\n  .reg "
                    ".b64 %rd<4>;\n  " +
                    b + "\n}\n";
    assert_int_equal(run_ptx(p, "k_bad", geom(1, 32), nullptr, 0), FA_ERROR_COMPILE);
    expect_error("line 9: ");
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mma_random),         cmocka_unit_test(test_mma_layout_markers),
      cmocka_unit_test(test_cvt_x2_order),       cmocka_unit_test(test_ldmatrix),
      cmocka_unit_test(test_ldmatrix_faults),    cmocka_unit_test(test_cp_async_visibility),
      cmocka_unit_test(test_cp_async_zero_fill), cmocka_unit_test(test_cp_async_faults),
      cmocka_unit_test(test_tile_pipeline),      cmocka_unit_test(test_divergence),
      cmocka_unit_test(test_parse_errors),
  };
  return cmocka_run_group_tests(tests, emu_setup, emu_teardown);
}
