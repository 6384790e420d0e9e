// Tests of the emulator's sm_100a tcgen05.mma / tcgen05.cp / tcgen05.commit
// (emu/sm100.h, emu/sm100_mma.cc) through the Backend interface:
//   - tcgen05.mma element by element against an fp64 reference computed
//     from the raw operands (fresh random data, D poisoned or preloaded):
//     M 64 / 128, N 8 / 64 / 128 / 256, f16, bf16, e4m3, e5m2, A from shared
//     memory and from tensor memory, K-major and MN-major A and B, every
//     swizzle (none, 32B, 64B, 128B), negation, enable-input-d 0 / 1 as an
//     immediate and as a predicate, two K steps per case (one thread's
//     successive MMAs into one D: ordered, no error), the lanes outside an
//     M = 64 D left as they were;
//   - the commit / mbarrier protocol (thread 0 issues and commits, every
//     warp waits on the mbarrier, then tcgen05.ld);
//   - tcgen05.cp .128x256b / .128x128b byte by byte;
//   - every hazard an error naming the op's PTX line and the offender's;
//   - the descriptor values of kernels/tile/umma.h decoded by the emulator
//     field by field, and a Builder kernel (tcgen05_mma_ss / _ts, commit,
//     cp) assembled by ptxas -arch=sm_100a and run;
//   - the deliberate emulator bugs of emu/sm100.h, each caught.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "emu/sm100.h"
#include "emu/tensor_map.h"
#include "kernels/tile/umma.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"
#include "support/umma_kernels.h"

namespace {

using namespace fa::test;
using fa::kgen::tile::UmmaInstrDesc;
using fa::kgen::tile::UmmaSmemDesc;
using fa::kgen::tile::UmmaSwizzle;
using fa::kgen::tile::UmmaType;

// ====================================================== the MMA kernel ====

// The kernels' start (tests/support/umma_kernels.h), cta_group::1.
std::string prologue(const char *entry, uint32_t nparams, uint32_t ncols, uint32_t image_words) {
  UmmaPrologue p;
  p.entry = entry;
  p.nparams = nparams;
  p.ncols = ncols;
  p.image_words = image_words;
  return umma_prologue(p);
}

// One tcgen05.mma case: kb K steps into one D (the first with enable, the
// rest with 1).
struct MmaCase {
  UmmaType at, bt;
  uint32_t m, n;
  bool a_tmem;
  bool a_mn, b_mn;
  uint32_t swz_a, swz_b;
  int enable;  // enable-input-d of the first step: 0 / 1
  bool pred;   // enable-input-d as a predicate (else an immediate)
  bool neg_a, neg_b;
};

constexpr uint32_t kSteps = 2;   // K steps per case
constexpr uint32_t kACol = 256;  // A in tensor memory: columns 256 + 8 s ..

// TMEM lane of row r of an M-row operand at lane 0 (PTX ISA "Data Path
// Layout": M = 64 puts rows 16q..16q+15 in lanes 32q..32q+15).
uint32_t lane_of(uint32_t m, uint32_t r) { return m == 128 ? r : r % 16 + 32 * (r / 16); }

// 128 threads (tests/support/umma_kernels.h, umma_mma_kernel): per lane
// the N columns of D, then A's 8 kSteps columns at kACol.
std::string mma_kernel(const MmaCase &c, uint32_t image_words) {
  UmmaMmaKernel k;
  k.d_words = c.n;
  k.a_col = kACol;
  k.steps = kSteps;
  k.a_tmem = c.a_tmem;
  k.f8 = c.at == UmmaType::kE4M3 || c.at == UmmaType::kE5M2;
  k.pred = c.pred;
  k.enable = c.enable;
  return umma_mma_kernel(k, image_words);
}

// Runs the case with fresh random operands; false (and a message) on the
// first element off the fp64 reference.
bool mma_ok(const MmaCase &c, std::mt19937 &rng) {
  const bool f8 = c.at == UmmaType::kE4M3 || c.at == UmmaType::kE5M2;
  const uint32_t esz = f8 ? 1 : 2, kk = f8 ? 32 : 16, kt = kSteps * kk;
  SmemOperand a{c.m, kt, esz, c.a_mn, c.swz_a, 0, 0, 0, 0};
  a.plan();
  const uint32_t a_bytes = c.a_tmem ? 0 : (a.extent() + 1023) / 1024 * 1024;
  SmemOperand b{c.n, kt, esz, c.b_mn, c.swz_b, a_bytes, 0, 0, 0};
  b.plan();
  const uint32_t image = a_bytes + (b.extent() + 1023) / 1024 * 1024;
  std::vector<uint8_t> img(image);
  for (auto &x : img) x = static_cast<uint8_t>(rng());
  // Operand values (bits), row-major [mn][k].
  std::vector<uint32_t> av(c.m * kt), bv(c.n * kt);
  for (auto &x : av) x = random_bits(c.at, rng);
  for (auto &x : bv) x = random_bits(c.bt, rng);
  auto put = [&](const SmemOperand &o, const std::vector<uint32_t> &v) {
    for (uint32_t mn = 0; mn < o.rows; ++mn)
      for (uint32_t k = 0; k < kt; ++k) std::memcpy(&img[o.offset(mn, k)], &v[mn * kt + k], esz);
  };
  if (!c.a_tmem) put(a, av);
  put(b, bv);
  // init: per lane, D's N columns (random f32, or NaN poison the MMA must
  // not read when enable is 0), then A's 8 kSteps packed columns.
  const uint32_t row_words = c.n + 8 * kSteps;
  std::vector<uint32_t> init(128 * row_words);
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  for (uint32_t l = 0; l < 128; ++l)
    for (uint32_t j = 0; j < row_words; ++j) init[l * row_words + j] = fa::emu::f32_bits(uni(rng));
  if (!c.enable)
    for (uint32_t r = 0; r < c.m; ++r)
      for (uint32_t j = 0; j < c.n; ++j) init[lane_of(c.m, r) * row_words + j] = 0x7fc0dead;
  if (c.a_tmem) {
    for (uint32_t r = 0; r < c.m; ++r) {
      uint32_t *w = &init[lane_of(c.m, r) * row_words + c.n];
      std::memset(w, 0, 4 * 8 * kSteps);
      for (uint32_t k = 0; k < kt; ++k)
        w[k * esz / 4] |= av[r * kt + k] << (8 * esz * (k % (4 / esz)));
    }
  }
  const std::vector<uint64_t> descs = umma_case_descs(c, a, b, kSteps, kk);
  const std::string what = "mma case M" + u(c.m) + " N" + u(c.n);
  std::vector<uint32_t> o;
  if (!umma_mma_launch(mma_kernel(c, image / 4), 1, image, img, init, descs, 128 * c.n,
                       what.c_str(), &o))
    return false;
  std::vector<int> row_of(128, -1);
  for (uint32_t r = 0; r < c.m; ++r) row_of[lane_of(c.m, r)] = static_cast<int>(r);
  const double sa = c.neg_a ? -1 : 1, sb = c.neg_b ? -1 : 1;
  for (uint32_t l = 0; l < 128; ++l) {
    for (uint32_t j = 0; j < c.n; ++j) {
      const uint32_t got_bits = o[l * c.n + j], before = init[l * row_words + j];
      if (row_of[l] < 0) {  // not a D row: untouched
        if (got_bits != before) {
          std::fprintf(stderr,
                       "M%u N%u: lane %u (no D row) column %u changed: 0x%08x, was 0x%08x\n", c.m,
                       c.n, l, j, got_bits, before);
          return false;
        }
        continue;
      }
      const uint32_t r = static_cast<uint32_t>(row_of[l]);
      const double got = fa::emu::bits_f32(got_bits);
      double ref;
      if (!umma_near(got, fa::emu::bits_f32(before), c.enable, &av[r * kt], &bv[j * kt], kt, c.at,
                     c.bt, sa, sb, &ref)) {
        std::fprintf(stderr, "M%u N%u %s: D(%u, %u) = %.9g, fp64 reference %.9g\n", c.m, c.n,
                     f8 ? "fp8" : "f16/bf16", r, j, got, ref);
        return false;
      }
    }
  }
  return true;
}

const MmaCase kCases[] = {
    // at, bt, m, n, a_tmem, a_mn, b_mn, swz_a, swz_b, enable, pred, neg_a, neg_b
    {UmmaType::kF16, UmmaType::kF16, 128, 64, false, false, false, 128, 128, 0, false, false,
     false},
    {UmmaType::kBF16, UmmaType::kBF16, 128, 128, false, false, true, 64, 128, 1, false, false,
     false},
    {UmmaType::kF16, UmmaType::kF16, 64, 8, false, false, false, 0, 0, 1, true, false, false},
    {UmmaType::kBF16, UmmaType::kBF16, 64, 256, false, false, true, 32, 64, 0, true, false, false},
    {UmmaType::kF16, UmmaType::kF16, 128, 256, true, false, true, 0, 0, 1, false, false, true},
    {UmmaType::kE4M3, UmmaType::kE4M3, 128, 128, false, false, false, 128, 128, 0, false, false,
     false},
    {UmmaType::kE5M2, UmmaType::kE4M3, 64, 64, false, true, true, 64, 32, 1, false, true, false},
    {UmmaType::kE4M3, UmmaType::kE5M2, 64, 8, true, false, false, 0, 64, 1, true, false, false},
    {UmmaType::kE5M2, UmmaType::kE5M2, 64, 256, false, false, true, 0, 0, 0, false, false, false},
    {UmmaType::kF16, UmmaType::kF16, 128, 128, false, true, false, 32, 32, 1, false, true, false},
};
enum { kCaseSw128 = 0, kCaseMnB = 1, kCaseInterleave = 2 };

void test_mma_values(void **) {
  std::mt19937 rng(std::random_device{}());
  for (const MmaCase &c : kCases) assert_true(mma_ok(c, rng));
}

// ==================================================== tcgen05.cp ====

// Thread 0 copies a 128-row K-major byte matrix (swizzle swz) with
// tcgen05.cp.<shape> to columns 0.. and commits; every warp waits, loads
// its lanes' columns and stores them to out (row = lane).
bool cp_ok(bool wide, uint32_t swz, std::mt19937 &rng) {
  const uint32_t ncols = wide ? 8 : 4, bytes = 4 * ncols;
  SmemOperand a{128, bytes, 1, false, swz, 0, 0, 0, 0};
  a.plan();
  const uint32_t image = (a.extent() + 1023) / 1024 * 1024;
  std::vector<uint8_t> img(image);
  for (auto &x : img) x = static_cast<uint8_t>(rng());
  const std::string shape = wide ? "128x256b" : "128x128b";
  const std::string v = wide ? "{%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}" : "{%v0, %v1, %v2, %v3}";
  std::string s = prologue("k_cp", 3, 32, image / 4) + R"(  @%p2 bra W;
  ld.global.u64 %rd9, [%rd3];
  add.s64 %rd9, %rd9, %rd13;
  tcgen05.cp.cta_group::1.)" +
                  shape + R"( [%r8], %rd9;
  tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64 [ctl+8];
)" + kUmmaWait + R"(  shl.b32 %r9, %r2, 5;
  add.u32 %r9, %r9, %r3;
  tcgen05.ld.sync.aligned.32x32b.x)" +
                  u(ncols) + ".b32 " + v + R"(, [%r11];
  tcgen05.wait::ld.sync.aligned;
  mul.wide.u32 %rd11, %r9, )" +
                  u(bytes) + R"(;
  add.s64 %rd12, %rd1, %rd11;
  st.global.v4.u32 [%rd12], {%v0, %v1, %v2, %v3};
)" + (wide ? "  st.global.v4.u32 [%rd12+16], {%v4, %v5, %v6, %v7};\n" : "") +
                  umma_finish(32, true);
  const uint64_t desc = a.desc(0);
  DevBuf in(image), ds(8), out(128 * bytes);
  in.put(img);
  ds.put(std::vector<uint64_t>{desc});
  struct {
    uint64_t out, in, desc;
  } prm = {out.ptr, in.ptr, ds.ptr};
  const fa_status st = run_ptx(s, "k_cp", geom(1, 128, image), &prm, sizeof prm);
  if (st != FA_SUCCESS) {
    std::fprintf(stderr, "cp %s: %s\n", shape.c_str(), fa::last_error());
    return false;
  }
  const std::vector<uint8_t> o = out.get<uint8_t>();
  for (uint32_t l = 0; l < 128; ++l)
    for (uint32_t k = 0; k < bytes; ++k)
      if (o[l * bytes + k] != img[a.offset(l, k)]) {
        std::fprintf(stderr, "cp %s swizzle %u: lane %u byte %u: 0x%02x, want 0x%02x\n",
                     shape.c_str(), swz, l, k, o[l * bytes + k], img[a.offset(l, k)]);
        return false;
      }
  return true;
}

void test_cp(void **) {
  std::mt19937 rng(std::random_device{}());
  for (bool wide : {true, false})
    for (uint32_t swz : {0u, 32u, 128u}) assert_true(cp_ok(wide, swz, rng));
}

// ============================================================ hazards ====

// A small f16 M128 N16 kernel (operands: zeros; K-major, no swizzle) with a
// variant's lines spliced in at its hooks. Thread 0 issues the MMA
// (marker "MMA") and, unless the variant says otherwise, commits; the
// variant decides who waits and reads.
struct Hazard {
  const char *name;
  const char *after_issue;  // thread 0, after the MMA (before the commit)
  bool commit;
  const char *others;  // every thread, after the issue block
  bool wait;           // every thread waits on the mbarrier before reading
  bool read;           // every warp tcgen05.ld's its lanes
  bool dealloc;
  const char *offender;  // marker of the line the error must name (besides MMA)
  const char *why;       // a phrase of the message
  bool a_tmem = false;   // the MMA reads A from tensor memory columns 16..23
};

std::string hazard_kernel(const Hazard &h) {
  std::string s = prologue("k_hz", 1, 32, 0) + "  mov.u32 %r13, " +
                  u(UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 128, 16}.bits()) +
                  ";\n  mov.b64 %rd9, " + u(UmmaSmemDesc{0, 128, 256}.bits()) +
                  ";\n  mov.b64 %rd10, " + u(UmmaSmemDesc{2048, 128, 256}.bits()) + R"(;
  add.s64 %rd9, %rd9, %rd13;
  add.s64 %rd10, %rd10, %rd13;
  setp.ne.u32 %p6, %r1, 32;
  add.u32 %r14, %r8, 16;
  add.u32 %r12, %r11, 16;
  @%p2 bra I;
  tcgen05.mma.cta_group::1.kind::f16 [%r8], )" +
                  (h.a_tmem ? "[%r14]" : "%rd9") + R"(, %rd10, %r13, 0; // MMA
)" + h.after_issue;
  if (h.commit) s += "  tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64 [ctl+8];\n";
  s += std::string("I:\n") + h.others;
  if (h.wait) s += kUmmaWait;
  if (h.read)
    s += "  tcgen05.ld.sync.aligned.32x32b.x8.b32 {%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}, "
         "[%r11]; // READ\n  tcgen05.wait::ld.sync.aligned;\n";
  return s + umma_finish(32, h.dealloc);
}

const Hazard kHazards[] = {
    {"ld before the wait", "", true, "", false, true, true, "// READ",
     "whose completion no thread of this warp has observed"},
    {"st.shared into B before the wait", "  st.shared.u32 [img+2048], %r1; // OFF\n", true, "",
     true, true, true, "// OFF", "whose completion this thread has not observed"},
    {"cp.async into A before the wait", "", true,
     "  @%p6 bra N1;\n  cp.async.ca.shared.global [img+16], [%rd1], 16; // OFF\n"
     "  cp.async.wait_all;\nN1:\n",
     true, true, true, "// OFF", "whose completion this thread has not observed"},
    {"mma of another thread into the same D", "", true,
     "  @%p6 bra N2;\n  tcgen05.mma.cta_group::1.kind::f16 [%r8], %rd9, %rd10, %r13, 1; // OFF\n"
     "  tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64 [ctl+8];\nN2:\n",
     false, false, true, "// OFF", "issued by another thread"},
    {"tcgen05.st into D before the wait", "", true,
     "  tcgen05.st.sync.aligned.32x32b.x1.b32 [%r11], {%r1}; // OFF\n  "
     "tcgen05.wait::st.sync.aligned;\n",
     true, true, true, "// OFF", "whose completion no thread of this warp has observed"},
    {"TMA box into B before the wait",
     "  add.u32 %r20, %r30, 3072;\n  mbarrier.init.shared::cta.b64 [%r20], 1;\n"
     "  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r20], 64;\n"
     "  add.u32 %r21, %r30, 2048;\n  mov.u32 %r22, 0;\n"
     "  cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%r21], "
     "[%rd1, {%r22}], [%r20]; // OFF\n",
     true, "", true, true, true, "// OFF", "whose completion this thread has not observed"},
    {"tcgen05.st into A (tensor memory) before the wait", "", true,
     "  tcgen05.st.sync.aligned.32x32b.x1.b32 [%r12], {%r1}; // OFF\n  "
     "tcgen05.wait::st.sync.aligned;\n",
     true, true, true, "// OFF", "read as A", true},
    {"dealloc before any wait", "", true, "", false, false, true, "// DEALLOC",
     "whose completion no thread has observed"},
    {"never committed", "", false, "", false, false, false, nullptr, "never committed"},
};

// Runs the variant; true when it fails with its message naming the MMA's
// line and the offender's.
// Runs a hazard kernel (its parameter: run_with_tensor_map's buffer).
fa_status run_hazard(const std::string &ptx) {
  return run_with_tensor_map(ptx, "k_hz", geom(1, 128, 4096));
}

bool hazard_caught(const Hazard &h) {
  const std::string ptx = hazard_kernel(h);
  const fa_status st = run_hazard(ptx);
  if (st == FA_SUCCESS) {
    std::fprintf(stderr, "%s: ran without an error\n", h.name);
    return false;
  }
  const std::string msg = fa::last_error();
  const std::string mma = "PTX line " + u(static_cast<uint64_t>(line_of(ptx, "// MMA")));
  const bool ok = msg.find(h.why) != std::string::npos && msg.find(mma) != std::string::npos &&
                  (!h.offender ||
                   msg.find("at PTX line " + u(static_cast<uint64_t>(line_of(ptx, h.offender)))) !=
                       std::string::npos);
  if (!ok) std::fprintf(stderr, "%s: unexpected message: %s\n", h.name, msg.c_str());
  return ok;
}

void test_hazards(void **) {
  for (const Hazard &h : kHazards) assert_true(hazard_caught(h));
  // The same kernel used correctly (commit, every thread waits, then
  // reads) runs.
  const Hazard good = {"correct", "", true, "", true, true, true, nullptr, ""};
  const fa_status st = run_hazard(hazard_kernel(good));
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
}

// ======================================================== descriptors ====

// Every field the kernels/tile/umma.h encoders write decodes back to itself
// in the emulator; the invalid or unmodelled values are refused.
void test_descriptors(void **) {
  std::mt19937 rng(std::random_device{}());
  const UmmaSwizzle sw[] = {UmmaSwizzle::kNone, UmmaSwizzle::k32B, UmmaSwizzle::k64B,
                            UmmaSwizzle::k128B};
  for (int i = 0; i < 2000; ++i) {
    UmmaSmemDesc d;
    d.start = (rng() % (1u << 14)) << 4;
    d.lbo = (rng() % (1u << 14)) << 4;
    d.sbo = (rng() % (1u << 14)) << 4;
    d.base_offset = rng() % 8;
    d.swizzle = sw[rng() % 4];
    fa::emu::SmemMatrix m;
    std::string why;
    assert_true(fa::emu::decode_umma_smem_desc(d.bits(), &m, &why));
    assert_int_equal(m.start, d.start);
    assert_int_equal(m.lbo, d.lbo);
    assert_int_equal(m.sbo, d.sbo);
    assert_int_equal(m.base, d.base_offset);
    assert_int_equal(m.bits ? 16u << m.bits : 0u, fa::kgen::tile::umma_swizzle_bytes(d.swizzle));
  }
  const UmmaType types[] = {UmmaType::kF16, UmmaType::kBF16, UmmaType::kE4M3, UmmaType::kE5M2};
  for (int i = 0; i < 2000; ++i) {
    UmmaInstrDesc d;
    const bool f8 = rng() % 2;
    d.a = types[(f8 ? 2 : 0) + rng() % 2];
    d.b = f8 ? types[2 + rng() % 2] : d.a;
    d.m = rng() % 2 ? 64 : 128;
    d.n = 8 * (1 + rng() % 32);
    d.a_mn_major = rng() % 2;
    d.b_mn_major = rng() % 2;
    d.neg_a = rng() % 2;
    d.neg_b = rng() % 2;
    fa::emu::UmmaInstr x;
    std::string why;
    assert_true(fa::emu::decode_umma_idesc(d.bits(), f8, &x, &why));
    assert_int_equal(x.m, d.m);
    assert_int_equal(x.n, d.n);
    assert_int_equal(x.k, d.k());
    assert_int_equal(x.esz, f8 ? 1 : 2);
    assert_int_equal(x.bf16, d.a == UmmaType::kBF16);
    assert_int_equal(x.a_e5m2, d.a == UmmaType::kE5M2);
    assert_int_equal(x.b_e5m2, d.b == UmmaType::kE5M2);
    assert_int_equal(x.trans_a, d.a_mn_major);
    assert_int_equal(x.trans_b, d.b_mn_major);
    assert_int_equal(x.neg_a, d.neg_a);
    assert_int_equal(x.neg_b, d.neg_b);
  }
  // Refused: wgmma's format (no 0b001 at 46-48), reserved bits, modes.
  const uint64_t good = UmmaSmemDesc{1024, 16, 1024, 0, UmmaSwizzle::k128B}.bits();
  const struct {
    uint64_t desc;
    const char *why;
  } bad_desc[] = {
      {good & ~(uint64_t{1} << 46), "0b001"},
      {good | uint64_t{1} << 14, "reserved"},
      {good | uint64_t{1} << 55, "bits 53-60"},
      {good | uint64_t{1} << 52, "absolute"},
      {(good & ~(uint64_t{7} << 61)) | uint64_t{3} << 61, "invalid"},
      {(good & ~(uint64_t{7} << 61)) | uint64_t{1} << 61, "32-byte atomic"},
  };
  for (const auto &b : bad_desc) {
    fa::emu::SmemMatrix m;
    std::string why;
    assert_false(fa::emu::decode_umma_smem_desc(b.desc, &m, &why));
    assert_true(why.find(b.why) != std::string::npos);
  }
  const uint32_t gi = UmmaInstrDesc{}.bits();
  const struct {
    uint32_t idesc;
    bool f8;
    const char *why;
  } bad_idesc[] = {
      {gi | 4u, false, "sparsity"},
      {gi | 1u, false, "selector"},
      {gi | 1u << 23, false, "reserved"},
      {gi & ~(3u << 4), false, "dtype F16"},
      {(gi & ~(0x1fu << 24)) | 16u << 24, false, "M = 256"},
      {gi & ~(0x3fu << 17), false, "N = 0"},
      {gi | 1u << 7, false, "atype = btype"},
      {gi | 3u << 7, true, "fp6 / fp4"},
      {gi | 1u << 30, false, ".ws"},
  };
  for (const auto &b : bad_idesc) {
    fa::emu::UmmaInstr x;
    std::string why;
    assert_false(fa::emu::decode_umma_idesc(b.idesc, b.f8, &x, &why));
    if (why.find(b.why) == std::string::npos) {
      std::fprintf(stderr, "idesc 0x%08x: \"%s\" lacks \"%s\"\n", b.idesc, why.c_str(), b.why);
      fail();
    }
  }
}

// Invalid operands at run time: errors naming the MMA's line.
void test_operand_errors(void **) {
  const struct {
    const char *name;
    uint32_t idesc;
    uint64_t desc_a;
    uint32_t d_lane;
    const char *why;
    int a_col = -1;  // A in tensor memory at this column (else from desc_a)
  } cases[] = {
      {"wgmma descriptor", UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 128, 8}.bits(),
       uint64_t{1} << 62, 0, "0b001"},
      {"M 256", (UmmaInstrDesc{}.bits() & ~(0x1fu << 24)) | 16u << 24, UmmaSmemDesc{}.bits(), 0,
       "M = 256"},
      {"D past the allocation", UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 128, 64}.bits(),
       UmmaSmemDesc{}.bits(), 0, "not inside one live allocation"},
      {"D lane 32", UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 128, 8}.bits(),
       UmmaSmemDesc{}.bits(), 32, "starts at lane 0"},
      {"A past the allocation", UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 64, 8}.bits(), 0, 0,
       "A taddr", 28},
      {"A in tensor memory transposed",
       UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 64, 8, true}.bits(), 0, 0,
       "cannot be transposed", 16},
      {"A in tensor memory, M 128, N 8",
       UmmaInstrDesc{UmmaType::kE4M3, UmmaType::kE4M3, 128, 8}.bits(), 0, 0, "multiple of 16", 16},
  };
  for (const auto &c : cases) {
    const std::string ptx =
        prologue("k_op", 1, 32, 0) + "  add.u32 %r8, %r8, " + u(uint64_t{c.d_lane} << 16) +
        ";\n  mov.u32 %r13, " + u(c.idesc) + ";\n  mov.b64 %rd9, " + u(c.desc_a) +
        ";\n  mov.b64 %rd10, " + u(UmmaSmemDesc{}.bits()) + ";\n  add.u32 %r14, %r8, " +
        u(static_cast<uint32_t>(std::max(c.a_col, 0))) + R"(;
  @%p2 bra S;
  tcgen05.mma.cta_group::1.kind::)" +
        (c.idesc == UmmaInstrDesc{UmmaType::kE4M3, UmmaType::kE4M3, 128, 8}.bits() ? "f8f6f4"
                                                                                   : "f16") +
        " [%r8], " + (c.a_col >= 0 ? "[%r14]" : "%rd9") + R"(, %rd10, %r13, 0; // MMA
S:
  ret;
}
)";
    const uint64_t prm = 0;
    const fa_status st = run_ptx(ptx, "k_op", geom(1, 32), &prm, sizeof prm);
    if (st == FA_SUCCESS) {
      std::fprintf(stderr, "%s: ran\n", c.name);
      fail();
    }
    expect_error(c.why);
    expect_error("at PTX line " + u(static_cast<uint64_t>(line_of(ptx, "// MMA"))));
  }
}

// ==================================================== the builder ====

// tcgen05_mma_ss / _ts, tcgen05_commit and tcgen05_cp through ptxas
// -arch=sm_100a and sm_103a (when a CUDA toolkit is there), and run: thread 0 copies a
// 128x16 f16 A (K-major, no swizzle) into columns 64.. with tcgen05.cp
// .128x256b, issues D0 = A B (ss: A from shared memory) and D1 = A B (ts: A
// from the copy) with B a 16x16 f16 of ones, commits; all wait, and warp w
// checks its lanes: D0 == D1 == the row sums of A.
void test_builder_forms(void **) {
  using namespace fa::ptx;
  Builder b("k_umma", 8);
  b.set_arch_specific(true);
  const Symbol ctl = b.shared("ctl", 8, 16);
  const Symbol img = b.shared("img", 1024, 8192);
  const Reg out = b.b64(), tid = b.b32(), warp = b.b32(), base = b.b32(), t1 = b.b32(),
            sa = b.b32(), bad = b.b32(), lane = b.b32(), tl = b.b32();
  const Reg p0 = b.pred(), pt = b.pred(), pw = b.pred();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.op(Op::Shr, Type::U32, warp, tid, imm(5));
  b.setp(Cmp::Ne, Type::U32, p0, warp, imm(0));
  b.setp(Cmp::Ne, Type::U32, pt, tid, imm(0));
  const Label l1 = b.label(), l2 = b.label(), issue = b.label(), wait = b.label(), done = b.label();
  b.when(p0).bra(l1);
  b.tcgen05_alloc(at(ctl), imm(128));
  b.bind(l1);
  b.when(pt).bra(l2);
  b.mbarrier_init(at(ctl, 8), imm(1));
  b.bind(l2);
  // A (128 x 16) = row index r + k / 16, B (16 x 16) = 1.0
  // (tests/support/umma_kernels.h, umma_builder_ab).
  b.mov(Type::U32, sa, sym(img));
  const Reg one = b.b16();
  b.mov(Type::B16, one, imm(0x3c00));
  const std::vector<Reg> av = umma_builder_ab(b, tid, sa, one);
  b.fence_proxy_async();
  b.tcgen05_fence_before_thread_sync();
  b.bar_sync();
  b.tcgen05_fence_after_thread_sync();
  b.ld(Space::Shared, Type::U32, base, at(ctl));
  b.when(pt).bra(issue);
  {
    const Reg da = b.b64(), db = b.b64(), acol = b.b32(), d1 = b.b32();
    umma_builder_descs(b, sa, da, db);
    b.op(Op::Add, Type::U32, acol, base, imm(64));
    b.op(Op::Add, Type::U32, d1, base, imm(32));
    b.tcgen05_cp(Builder::TmemCpShape::k128x256b, acol, da);
    const uint32_t idesc = UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 128, 16}.bits();
    b.tcgen05_mma_ss(Builder::MmaKind::F16, base, da, db, imm(idesc), imm(0));
    b.tcgen05_mma_ts(Builder::MmaKind::F16, d1, acol, db, imm(idesc), imm(0));
    b.tcgen05_commit(at(ctl, 8));
  }
  b.bind(issue);
  b.bind(wait);
  b.mbarrier_try_wait_parity(pw, at(ctl, 8), imm(0));
  b.unless(pw).bra(wait);
  b.tcgen05_fence_after_thread_sync();
  {
    std::vector<Reg> v(8);
    for (Reg &x : v) x = b.b32();
    b.op(Op::Shl, Type::B32, lane, warp, imm(21));
    b.op(Op::Add, Type::U32, tl, base, lane);
    // Row r's sum over k of (r + k / 16) = 16 r + 7.5 (av[0] is r).
    const Reg want = b.f32(), wb = b.b32();
    b.op(Op::Mul, Type::F32, want, av[0], fimm(16.0f));
    b.op(Op::Add, Type::F32, want, want, fimm(7.5f));
    b.mov(Type::B32, wb, want);
    b.mov(Type::U32, bad, imm(0));
    umma_builder_check8(b, tl, v, wb, bad, 1);
    b.op(Op::Add, Type::U32, t1, tl, imm(32));
    umma_builder_check8(b, t1, v, wb, bad, 2);
  }
  const Reg addr = b.b64(), off = b.b64();
  b.mul_wide(Type::U32, off, tid, imm(4));
  b.op(Op::Add, Type::U64, addr, out, off);
  b.st(Space::Global, Type::U32, at(addr), bad);
  b.tcgen05_fence_before_thread_sync();
  b.bar_sync();
  b.when(p0).bra(done);
  b.tcgen05_dealloc(base, imm(128));
  b.bind(done);
  b.ret();
  umma_builder_run(umma_builder_emit(b), "k_umma", 1);
}

// ============================================ deliberate emulator bugs ====

void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  {
    Sm100BugScope bug(fa::emu::kSm100BugSboAsLbo);
    assert_false(mma_ok(kCases[kCaseInterleave], rng));
  }
  {
    Sm100BugScope bug(fa::emu::kSm100BugNoTransB);
    assert_false(mma_ok(kCases[kCaseMnB], rng));
  }
  {
    Sm100BugScope bug(fa::emu::kSm100BugDLaneOff);
    assert_false(mma_ok(kCases[kCaseSw128], rng));
  }
  {
    Sm100BugScope bug(fa::emu::kSm100BugCommitEarly);
    assert_false(hazard_caught(kHazards[0]));
    assert_false(hazard_caught(kHazards[1]));
  }
  assert_true(mma_ok(kCases[kCaseSw128], rng));
  assert_true(hazard_caught(kHazards[0]));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_descriptors),
      cmocka_unit_test(test_mma_values),
      cmocka_unit_test(test_cp),
      cmocka_unit_test(test_hazards),
      cmocka_unit_test(test_operand_errors),
      cmocka_unit_test(test_builder_forms),
      cmocka_unit_test(test_deliberate_bugs),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<100>, emu_teardown);
}
