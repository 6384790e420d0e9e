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
#include "support/umma_operands.h"

namespace {

using namespace fa::test;
using fa::kgen::tile::UmmaInstrDesc;
using fa::kgen::tile::UmmaSmemDesc;
using fa::kgen::tile::UmmaSwizzle;
using fa::kgen::tile::UmmaType;

struct BugScope {
  explicit BugScope(int bug) { fa::emu::g_sm100_bug = bug; }
  ~BugScope() { fa::emu::g_sm100_bug = fa::emu::kSm100BugNone; }
};

std::string u(uint64_t v) { return std::to_string(v); }

// ====================================================== the MMA kernel ====

// The common start of the test kernels (128 threads): registers, ctl (the
// taddr word at ctl, the mbarrier at ctl+8), the image (.extern, 1024-aligned:
// the swizzle patterns start there; its shared address in %r30), params
// 8 bytes each into %rd1.. . Warp 0 allocates ncols columns, thread 0
// initializes the mbarrier (count 1); with image_words, every thread copies
// the image from global (%rd2) into it and fences it for the async proxy.
// Then a barrier, the allocation's base in %r8, warp w's lane base (32 w)
// << 16 added in %r11; %r1 tid, %r2 warp, %r3 lane, %p1 warp != 0, %p2 tid
// != 0.
std::string prologue(const char *entry, uint32_t nparams, uint32_t ncols, uint32_t image_words) {
  std::string s = ".version 8.6\n.target sm_100a\n.address_size 64\n.visible .entry " +
                  std::string(entry) + "(.param .align 8 .b8 prm[" + u(8 * nparams) + R"(])
{
  .reg .pred %p<8>;
  .reg .b32 %r<40>;
  .reg .b32 %v<8>;
  .reg .b64 %rd<20>;
  .shared .align 8 .b8 ctl[16];
  .extern .shared .align 1024 .b8 img[];
)";
  for (uint32_t i = 0; i < nparams; ++i)
    s += "  ld.param.u64 %rd" + u(i + 1) + ", [prm+" + u(8 * i) + "];\n";
  s += R"(  mov.u32 %r1, %tid.x;
  shr.u32 %r2, %r1, 5;
  and.b32 %r3, %r1, 31;
  setp.ne.u32 %p1, %r2, 0;
  setp.ne.u32 %p2, %r1, 0;
  mov.u32 %r30, img;
  @%p1 bra A1;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [ctl], )" +
       u(ncols) + R"(;
A1:
  @%p2 bra A2;
  mbarrier.init.shared::cta.b64 [ctl+8], 1;
A2:
)";
  if (image_words)
    s += R"(  mov.u32 %r4, %r1;
CP:
  setp.ge.u32 %p3, %r4, )" +
         u(image_words) + R"(;
  @%p3 bra CPD;
  mul.wide.u32 %rd5, %r4, 4;
  add.s64 %rd6, %rd2, %rd5;
  ld.global.u32 %r5, [%rd6];
  shl.b32 %r6, %r4, 2;
  add.u32 %r7, %r30, %r6;
  st.shared.u32 [%r7], %r5;
  add.u32 %r4, %r4, 128;
  bra CP;
CPD:
  fence.proxy.async.shared::cta;
)";
  s += R"(  tcgen05.fence::before_thread_sync;
  bar.sync 0;
  tcgen05.fence::after_thread_sync;
  ld.shared.u32 %r8, [ctl];
  shl.b32 %r10, %r2, 21;
  add.u32 %r11, %r8, %r10;
  cvt.u64.u32 %rd13, %r30;
  shr.u64 %rd13, %rd13, 4;
)";
  return s;
}

// Every thread waits for phase 0 of the mbarrier.
const char *kWaitLoop = R"(W:
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [ctl+8], 0;
  @!%p4 bra W;
  tcgen05.fence::after_thread_sync;
)";

// The common end: a barrier, warp 0 frees the ncols columns (dealloc; the
// line marked "// DEALLOC"), exit.
std::string finish(uint32_t ncols, bool dealloc) {
  std::string s = "  tcgen05.fence::before_thread_sync;\n  bar.sync 0;\n  @%p1 bra DONE;\n";
  if (dealloc)
    s += "  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r8, " + u(ncols) + "; // DEALLOC\n";
  return s + "DONE:\n  ret;\n}\n";
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

// 128 threads. Warp 0 allocates 512 columns, thread 0 initializes the
// mbarrier; all copy the shared image from `in`, then each warp stores its
// 32 lanes of `init` (N columns of D, then 8 kSteps columns of A) with
// tcgen05.st. Thread 0 issues the kSteps MMAs (A descriptors / columns and
// B descriptors from `descs`) and commits to the mbarrier; every thread
// waits on it, then each warp loads its lanes' N columns of D into out (row
// = lane). descs (u64): [0] idesc | enable << 32, [1 + s] A of step s, [1 +
// kSteps + s] B of step s.
std::string mma_kernel(const MmaCase &c, uint32_t image_words) {
  const bool f8 = c.at == UmmaType::kE4M3 || c.at == UmmaType::kE5M2;
  const std::string kind = f8 ? "f8f6f4" : "f16";
  const uint32_t row_words = c.n + 8 * kSteps;
  std::string s = prologue("k_mma", 4, 512, image_words);
  s += "  shl.b32 %r9, %r2, 5;\n  add.u32 %r9, %r9, %r3;\n";
  s += "  mul.wide.u32 %rd7, %r9, " + u(4 * row_words) + ";\n  add.s64 %rd8, %rd3, %rd7;\n";
  auto line = [&s](const std::string &l) { s += "  " + l + ";\n"; };
  const std::string v8 = "{%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}";
  auto st8 = [&](uint32_t word, uint32_t col) {
    line("ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd8+" + u(4 * word) + "]");
    line("ld.global.v4.u32 {%v4, %v5, %v6, %v7}, [%rd8+" + u(4 * word + 16) + "]");
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.st.sync.aligned.32x32b.x8.b32 [%r12], " + v8);
    line("tcgen05.wait::st.sync.aligned");  // before %v0.. are reloaded
  };
  for (uint32_t col = 0; col < c.n; col += 8) st8(col, col);
  for (uint32_t st = 0; st < kSteps; ++st) st8(c.n + 8 * st, kACol + 8 * st);
  line("tcgen05.fence::before_thread_sync");
  line("bar.sync 0");
  line("tcgen05.fence::after_thread_sync");
  line("@%p2 bra W");
  line("ld.global.u32 %r13, [%rd4]");
  line("ld.global.u32 %r15, [%rd4+4]");
  line("setp.ne.u32 %p5, %r15, 0");
  for (uint32_t st = 0; st < kSteps; ++st) {
    line("ld.global.u64 %rd9, [%rd4+" + u(8 + 8 * st) + "]");
    line("ld.global.u64 %rd10, [%rd4+" + u(8 + 8 * kSteps + 8 * st) + "]");
    line("add.s64 %rd9, %rd9, %rd13");
    line("add.s64 %rd10, %rd10, %rd13");
    const std::string en = st ? "1" : c.pred ? "%p5" : u(static_cast<uint32_t>(c.enable));
    std::string a = "%rd9";
    if (c.a_tmem) {
      line("add.u32 %r14, %r8, " + u(kACol + 8 * st));
      a = "[%r14]";
    }
    line("tcgen05.mma.cta_group::1.kind::" + kind + " [%r8], " + a + ", %rd10, %r13, " + en);
  }
  line("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [ctl+8]");
  s += kWaitLoop;
  line("mul.wide.u32 %rd11, %r9, " + u(4 * c.n));
  line("add.s64 %rd12, %rd1, %rd11");
  for (uint32_t col = 0; col < c.n; col += 8) {
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.ld.sync.aligned.32x32b.x8.b32 " + v8 + ", [%r12]");
    line("tcgen05.wait::ld.sync.aligned");
    line("st.global.v4.u32 [%rd12+" + u(4 * col) + "], {%v0, %v1, %v2, %v3}");
    line("st.global.v4.u32 [%rd12+" + u(4 * col + 16) + "], {%v4, %v5, %v6, %v7}");
  }
  s += finish(512, true);
  return s;
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
  UmmaInstrDesc id;
  id.a = c.at;
  id.b = c.bt;
  id.m = c.m;
  id.n = c.n;
  id.a_mn_major = c.a_mn;
  id.b_mn_major = c.b_mn;
  id.neg_a = c.neg_a;
  id.neg_b = c.neg_b;
  std::vector<uint64_t> descs(1 + 2 * kSteps);
  descs[0] = id.bits() | uint64_t{static_cast<uint32_t>(c.enable)} << 32;
  for (uint32_t s = 0; s < kSteps; ++s) {
    descs[1 + s] = c.a_tmem ? 0 : a.desc(s * kk);
    descs[1 + kSteps + s] = b.desc(s * kk);
  }
  DevBuf in(image), ini(init.size() * 4), ds(descs.size() * 8), out(128 * c.n * 4);
  in.put(img);
  ini.put(init);
  ds.put(descs);
  struct {
    uint64_t out, in, init, descs;
  } prm = {out.ptr, in.ptr, ini.ptr, ds.ptr};
  const std::string ptx = mma_kernel(c, image / 4);
  const fa_status st = run_ptx(ptx, "k_mma", geom(1, 128, image), &prm, sizeof prm);
  if (st != FA_SUCCESS) {
    std::fprintf(stderr, "mma case M%u N%u: launch failed: %s\n", c.m, c.n, fa::last_error());
    return false;
  }
  const std::vector<uint32_t> o = out.get<uint32_t>();
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
      double ref = c.enable ? fa::emu::bits_f32(before) : 0.0, mag = std::fabs(ref);
      for (uint32_t k = 0; k < kt; ++k) {
        const double p = sa * value_of(c.at, av[r * kt + k]) * sb * value_of(c.bt, bv[j * kt + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = fa::emu::bits_f32(got_bits);
      if (!(std::fabs(got - ref) <= 1e-5 * mag + 1e-30)) {
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
)" + kWaitLoop + R"(  shl.b32 %r9, %r2, 5;
  add.u32 %r9, %r9, %r3;
  tcgen05.ld.sync.aligned.32x32b.x)" +
                  u(ncols) + ".b32 " + v + R"(, [%r11];
  tcgen05.wait::ld.sync.aligned;
  mul.wide.u32 %rd11, %r9, )" +
                  u(bytes) + R"(;
  add.s64 %rd12, %rd1, %rd11;
  st.global.v4.u32 [%rd12], {%v0, %v1, %v2, %v3};
)" + (wide ? "  st.global.v4.u32 [%rd12+16], {%v4, %v5, %v6, %v7};\n" : "") +
                  finish(32, true);
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
  if (h.wait) s += kWaitLoop;
  if (h.read)
    s += "  tcgen05.ld.sync.aligned.32x32b.x8.b32 {%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}, "
         "[%r11]; // READ\n  tcgen05.wait::ld.sync.aligned;\n";
  return s + finish(32, h.dealloc);
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
// Runs a hazard kernel; its parameter is a buffer holding a tensor map (of a
// 16-word tensor at +512 of the buffer, one box of all of it) at +0.
fa_status run_hazard(const std::string &ptx) {
  DevBuf buf(1024);
  fa::emu::TensorMap m;
  m.rank = 1;
  m.base = buf.ptr + 512;
  m.dims[0] = 16;
  m.strides[0] = 4;
  m.box[0] = 16;
  m.elem_bytes = 4;
  std::vector<uint8_t> bytes(128);
  fa::emu::store_tensor_map(m, bytes.data());
  buf.put(bytes);
  uint64_t p = buf.ptr;
  return run_ptx(ptx, "k_hz", geom(1, 128, 4096), &p, sizeof p);
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
  const Reg p0 = b.pred(), pt = b.pred(), pw = b.pred(), pbad = b.pred();
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
  // A (128 x 16 f16, K-major, no swizzle: core matrices 8 rows x 16 bytes,
  // LBO 128 along K, SBO 256 along M) = row index r + k / 16 at (r, k);
  // B (16 x 16, LBO 128, SBO 256) = 1.0. Each thread writes rows tid of A
  // and, thread < 16, row tid of B.
  b.mov(Type::U32, sa, sym(img));
  // Row r = tid of A at (r / 8) 256 + (r % 8) 16 (+ (k / 8) 128 + (k % 8) 2);
  // for tid < 16, row tid of B 4096 bytes further.
  const Reg r8 = b.b32(), rm = b.b32(), row = b.b32(), fr0 = b.f32();
  b.op(Op::Shr, Type::U32, r8, tid, imm(3));
  b.op(Op::And, Type::B32, rm, tid, imm(7));
  b.op(Op::Shl, Type::B32, r8, r8, imm(8));
  b.op(Op::Shl, Type::B32, rm, rm, imm(4));
  b.op(Op::Add, Type::U32, row, r8, rm);
  b.op(Op::Add, Type::U32, row, row, sa);
  b.cvt(Type::F32, Type::U32, Round::Rn, fr0, tid);
  b.setp(Cmp::Ge, Type::U32, pbad, tid, imm(16));
  const Reg one = b.b16();
  b.mov(Type::B16, one, imm(0x3c00));
  for (int k = 0; k < 16; ++k) {
    const int koff = (k / 8) * 128 + (k % 8) * 2;
    const Reg f = b.f32(), h = b.b16();
    b.op(Op::Add, Type::F32, f, fr0, fimm(static_cast<float>(k) / 16.0f));  // exact in f16
    b.cvt(Type::F16, Type::F32, Round::Rn, h, f);
    b.st(Space::Shared, Type::B16, at(row, koff), h);
    b.unless(pbad).st(Space::Shared, Type::B16, at(row, 4096 + koff), one);
  }
  b.fence_proxy_async();
  b.tcgen05_fence_before_thread_sync();
  b.bar_sync();
  b.tcgen05_fence_after_thread_sync();
  b.ld(Space::Shared, Type::U32, base, at(ctl));
  b.when(pt).bra(issue);
  {
    const Reg da = b.b64(), db = b.b64(), acol = b.b32(), d1 = b.b32();
    const UmmaSmemDesc a{0, 128, 256};
    const UmmaSmemDesc bb{4096, 128, 256};
    const Reg s32 = b.b32();
    b.mov(Type::U32, s32, sym(img));
    const Reg s64 = b.b64();
    b.cvt(Type::U64, Type::U32, Round::None, s64, s32);
    b.op(Op::Shr, Type::U64, s64, s64, imm(4));
    b.op(Op::Add, Type::U64, da, s64, imm(static_cast<int64_t>(a.bits())));
    b.op(Op::Add, Type::U64, db, s64, imm(static_cast<int64_t>(bb.bits())));
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
    std::vector<Reg> v0(8), v1(8);
    for (int j = 0; j < 8; ++j) {
      v0[static_cast<size_t>(j)] = b.b32();
      v1[static_cast<size_t>(j)] = b.b32();
    }
    b.op(Op::Shl, Type::B32, lane, warp, imm(21));
    b.op(Op::Add, Type::U32, tl, base, lane);
    b.tcgen05_ld_32x32b(v0.data(), 8, tl);
    b.op(Op::Add, Type::U32, t1, tl, imm(32));
    b.tcgen05_ld_32x32b(v1.data(), 8, t1);
    b.tcgen05_wait_ld();
    // Row r's sum over k of (r + k / 16) = 16 r + 7.5.
    const Reg want = b.f32(), fr = b.f32();
    b.cvt(Type::F32, Type::U32, Round::Rn, fr, tid);
    b.op(Op::Mul, Type::F32, want, fr, fimm(16.0f));
    b.op(Op::Add, Type::F32, want, want, fimm(7.5f));
    const Reg wb = b.b32();
    b.mov(Type::B32, wb, want);
    b.mov(Type::U32, bad, imm(0));
    for (int j = 0; j < 8; ++j) {
      b.setp(Cmp::Ne, Type::U32, pbad, v0[static_cast<size_t>(j)], wb);
      b.selp(Type::U32, bad, imm(1), bad, pbad);
      b.setp(Cmp::Ne, Type::U32, pbad, v1[static_cast<size_t>(j)], wb);
      b.selp(Type::U32, bad, imm(2), bad, pbad);
    }
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
  for (int sm : {100, 103}) {  // sm_103a: PTX ISA 8.8
    const std::string text = b.emit(sm == 103 ? 88 : 86, sm, 128);
    const std::string arch = "sm_" + std::to_string(sm) + "a";
    if (ptxas_accepts(text, arch.c_str()) == 0) {
      std::fprintf(stderr, "ptxas -arch=%s rejects:\n%s", arch.c_str(), text.c_str());
      fail();
    }
  }
  const std::string ptx = b.emit(86, 100, 128);
  DevBuf res(128 * 4);
  uint64_t p = res.ptr;
  const fa_status st = run_ptx(ptx, "k_umma", geom(1, 128), &p, sizeof p);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n%s", fa::last_error(), ptx.c_str());
  assert_int_equal(st, FA_SUCCESS);
  for (uint32_t x : res.get<uint32_t>()) assert_int_equal(x, 0);
}

// ============================================ deliberate emulator bugs ====

void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  {
    BugScope bug(fa::emu::kSm100BugSboAsLbo);
    assert_false(mma_ok(kCases[kCaseInterleave], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugNoTransB);
    assert_false(mma_ok(kCases[kCaseMnB], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugDLaneOff);
    assert_false(mma_ok(kCases[kCaseSw128], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugCommitEarly);
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
