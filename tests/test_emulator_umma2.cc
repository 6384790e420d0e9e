// Tests of the emulator's tcgen05 .cta_group::2 (emu/sm100.h, the CTA
// pair: ranks 2k, 2k + 1 of a cluster) through the Backend interface:
//   - tcgen05.mma.cta_group::2 element by element against an fp64
//     reference from the raw operands (fresh random data, D poisoned or
//     preloaded, a guard of 8 columns past D left as it was): M 256 and
//     128, N 64 / 128 / 256, f16, bf16, e4m3, A from shared memory and from
//     tensor memory (M = 128: duplicated in lanes 64..127), K-major and
//     MN-major A and B, both CTAs' D read back; the pair allocates with
//     tcgen05.alloc.cta_group::2, the even CTA's thread 0 issues and
//     commits with .multicast::cluster (ctaMask 3), every thread of both
//     CTAs waits on its own CTA's mbarrier (the multicast waking both);
//   - every hazard across the pair (the odd CTA's tcgen05.ld / st of D,
//     its shared write into B, the pair's dealloc, an MMA of the odd CTA's
//     thread into the same D, no commit) an error naming both PTX lines;
//   - the misuses (no pair: a cluster of 1 or 3; the pair's allocs
//     disagreeing; .cta_group::1 and ::2 in one entry; M 64; a ctaMask past
//     the cluster; the peer exited) errors naming the line;
//   - kernels/tile/umma.h's M = 256 descriptor decoded for cta_group::2;
//   - a Builder kernel with every cta_group::2 form through ptxas
//     -arch=sm_100a / sm_103a (with a CUDA toolkit) and run;
//   - the deliberate emulator bugs of emu/sm100.h for the pair, each caught.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
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

// ==================================================== the pair kernels ====

// The pair kernels' start (tests/support/umma_kernels.h, umma_prologue):
// a cluster of `cluster` CTAs (0: no cluster), warp 0 of each allocating
// 512 columns with tcgen05.alloc.cta_group::2 ("// ALLOC").
std::string pair_prologue(const char *entry, uint32_t nparams, uint32_t image_words,
                          uint32_t cluster = 2) {
  UmmaPrologue p;
  p.entry = entry;
  p.nparams = nparams;
  p.image_words = image_words;
  p.group = 2;
  p.cluster = cluster;
  return umma_prologue(p);
}

std::string pair_finish(bool dealloc) { return umma_finish(512, dealloc, 2); }

// One tcgen05.mma.cta_group::2 case: kSteps K steps into one D (the first
// with enable, the rest with 1).
struct PairCase {
  UmmaType at, bt;
  uint32_t m, n;  // the pair's M (128 / 256) and N
  bool a_tmem, a_mn, b_mn;
  uint32_t swz_a, swz_b;
  int enable;  // enable-input-d of the first step: 0 / 1
  bool pred;   // enable-input-d as a predicate (else an immediate)
  bool neg_a, neg_b;
};

constexpr uint32_t kSteps = 2;
constexpr uint32_t kACol = 448;  // A in tensor memory: columns 448 + 8 s ..

bool is_f8(UmmaType t) { return t == UmmaType::kE4M3 || t == UmmaType::kE5M2; }
// D columns per CTA: M = 128 splits N across lanes 0-63 / 64-127.
uint32_t d_cols(const PairCase &c) { return c.m == 128 ? c.n / 2 : c.n; }
// Per lane of each CTA: D's columns, 8 guard columns, A's 8 kSteps.
uint32_t row_words(const PairCase &c) { return d_cols(c) + 8 + 8 * kSteps; }

// Both CTAs (umma_mma_kernel): each lane's D and guard columns from
// column 0, A's columns from kACol; the even CTA's thread 0 issues and
// commits to both CTAs' mbarriers.
std::string pair_mma_kernel(const PairCase &c, uint32_t image_words) {
  UmmaMmaKernel k;
  k.group = 2;
  k.d_words = d_cols(c) + 8;
  k.a_col = kACol;
  k.steps = kSteps;
  k.a_tmem = c.a_tmem;
  k.f8 = is_f8(c.at);
  k.pred = c.pred;
  k.enable = c.enable;
  return umma_mma_kernel(k, image_words);
}

// The pair's operands: A (M x kt) and B (N x kt) values, and CTA h's image
// (its M / 2 rows of A, unless in tensor memory, then its N / 2 columns of B).
struct PairOperands {
  std::vector<uint32_t> av, bv;
  SmemOperand a, b;
  uint32_t image = 0;        // bytes per CTA
  std::vector<uint8_t> img;  // both CTAs' images
};

PairOperands pair_operands(const PairCase &c, std::mt19937 &rng) {
  PairOperands o;
  const uint32_t esz = is_f8(c.at) ? 1 : 2, kt = kSteps * (is_f8(c.at) ? 32 : 16);
  o.a = SmemOperand{c.m / 2, kt, esz, c.a_mn, c.swz_a, 0, 0, 0, 0};
  o.a.plan();
  const uint32_t a_bytes = c.a_tmem ? 0 : (o.a.extent() + 1023) / 1024 * 1024;
  o.b = SmemOperand{c.n / 2, kt, esz, c.b_mn, c.swz_b, a_bytes, 0, 0, 0};
  o.b.plan();
  o.image = a_bytes + (o.b.extent() + 1023) / 1024 * 1024;
  o.img.resize(2 * o.image);
  for (auto &x : o.img) x = static_cast<uint8_t>(rng());
  o.av.resize(c.m * kt);
  o.bv.resize(c.n * kt);
  for (auto &x : o.av) x = random_bits(c.at, rng);
  for (auto &x : o.bv) x = random_bits(c.bt, rng);
  for (uint32_t h = 0; h < 2; ++h) {
    uint8_t *im = o.img.data() + h * o.image;
    for (uint32_t k = 0; k < kt; ++k) {
      for (uint32_t r = 0; r < c.m / 2 && !c.a_tmem; ++r)
        std::memcpy(im + o.a.offset(r, k), &o.av[(h * c.m / 2 + r) * kt + k], esz);
      for (uint32_t j = 0; j < c.n / 2; ++j)
        std::memcpy(im + o.b.offset(j, k), &o.bv[(h * c.n / 2 + j) * kt + k], esz);
    }
  }
  return o;
}

// CTA-local D row and pair column of lane l, column j < d_cols of a CTA.
void d_position(const PairCase &c, uint32_t l, uint32_t j, uint32_t *row, uint32_t *col) {
  *row = c.m == 256 ? l : l % 64;
  *col = c.m == 256 ? j : j + (l >= 64 ? c.n / 2 : 0);
}

// Runs the case with fresh random operands; false (and a message) on the
// first element off the fp64 reference or guard cell changed.
bool pair_mma_ok(const PairCase &c, std::mt19937 &rng) {
  const bool f8 = is_f8(c.at);
  const uint32_t esz = f8 ? 1 : 2, kk = f8 ? 32 : 16, kt = kSteps * kk;
  const PairOperands o = pair_operands(c, rng);
  const uint32_t rw = row_words(c), dc = d_cols(c), dg = dc + 8, mh = c.m / 2;
  std::vector<uint32_t> init(2 * 128 * rw);
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  for (auto &x : init) x = fa::emu::f32_bits(uni(rng));
  for (uint32_t h = 0; h < 2; ++h) {
    for (uint32_t l = 0; l < 128; ++l) {
      uint32_t *w = &init[(h * 128 + l) * rw];
      if (!c.enable)
        for (uint32_t j = 0; j < dc; ++j) w[j] = 0x7fc0dead;  // must not be read
      if (!c.a_tmem) continue;
      // A's row (M = 128: lanes 64.. duplicate lanes 0..63), packed.
      const uint32_t row = h * mh + (c.m == 256 ? l : l % 64);
      std::memset(w + dg, 0, 4 * 8 * kSteps);
      for (uint32_t k = 0; k < kt; ++k)
        w[dg + k * esz / 4] |= o.av[row * kt + k] << (8 * esz * (k % (4 / esz)));
    }
  }
  const std::vector<uint64_t> descs = umma_case_descs(c, o.a, o.b, kSteps, kk);
  const std::string what = "pair M" + u(c.m) + " N" + u(c.n);
  std::vector<uint32_t> got;
  if (!umma_mma_launch(pair_mma_kernel(c, o.image / 4), 2, o.image, o.img, init, descs,
                       2 * 128 * dg, what.c_str(), &got))
    return false;
  const double sa = c.neg_a ? -1 : 1;
  for (uint32_t h = 0; h < 2; ++h) {
    for (uint32_t l = 0; l < 128; ++l) {
      for (uint32_t j = 0; j < dg; ++j) {
        const uint32_t g = got[(h * 128 + l) * dg + j], before = init[(h * 128 + l) * rw + j];
        if (j >= dc) {  // the guard past D
          if (g == before) continue;
          std::fprintf(stderr, "pair M%u N%u: CTA %u lane %u guard column %u changed\n", c.m, c.n,
                       h, l, j);
          return false;
        }
        uint32_t r, col;
        d_position(c, l, j, &r, &col);
        const uint32_t grow = h * mh + r;
        const double v = fa::emu::bits_f32(g);
        double ref;
        if (!umma_near(v, fa::emu::bits_f32(before), c.enable, &o.av[grow * kt], &o.bv[col * kt],
                       kt, c.at, c.bt, sa, c.neg_b ? -1 : 1, &ref)) {
          std::fprintf(stderr,
                       "pair M%u N%u: CTA %u lane %u column %u (D(%u, %u)) = %.9g, fp64 %.9g\n",
                       c.m, c.n, h, l, j, grow, col, v, ref);
          return false;
        }
      }
    }
  }
  return true;
}

const PairCase kPairCases[] = {
    // at, bt, m, n, a_tmem, a_mn, b_mn, swz_a, swz_b, enable, pred, neg_a, neg_b
    {UmmaType::kF16, UmmaType::kF16, 256, 128, false, false, false, 128, 128, 0, false, false,
     false},
    {UmmaType::kBF16, UmmaType::kBF16, 256, 256, false, false, true, 64, 128, 1, false, false,
     false},
    {UmmaType::kE4M3, UmmaType::kE4M3, 256, 64, false, false, false, 128, 64, 0, false, false,
     false},
    {UmmaType::kF16, UmmaType::kF16, 128, 64, false, true, true, 32, 32, 1, true, false, false},
    {UmmaType::kBF16, UmmaType::kBF16, 128, 256, true, false, false, 0, 128, 1, false, false, true},
    {UmmaType::kE4M3, UmmaType::kE5M2, 256, 128, true, false, true, 0, 0, 0, false, true, false},
    {UmmaType::kF16, UmmaType::kF16, 128, 128, false, false, false, 0, 0, 0, true, true, false},
    {UmmaType::kE4M3, UmmaType::kE4M3, 128, 64, true, false, false, 0, 64, 1, false, false, false},
};
enum { kCase256 = 0, kCase128 = 3 };

void test_pair_values(void **) {
  std::mt19937 rng(std::random_device{}());
  for (const PairCase &c : kPairCases) assert_true(pair_mma_ok(c, rng));
}

// ============================================================ hazards ====

// A pair kernel (f16 M 256 N 32, K-major, no swizzle; operands whatever
// shared memory holds) with a variant's lines spliced in: the even CTA's
// thread 0 issues the MMA (marker "MMA") and, unless the variant says
// otherwise, commits to both CTAs; then every thread of both CTAs passes
// the cluster barrier, runs `others`, and (wait) waits on its mbarrier,
// (read) loads its lanes of D.
struct PairHazard {
  const char *name;
  bool commit;
  const char *others;  // every thread of both CTAs (%p3: the odd CTA's)
  bool wait, read, dealloc;
  const char *offender;  // marker of the line the error must name (besides MMA)
  const char *why;       // a phrase of the message
};

std::string pair_hazard_kernel(const PairHazard &h) {
  std::string s = pair_prologue("k_phz", 1, 0) + "  mov.u32 %r13, " +
                  u(UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 256, 32}.bits()) +
                  ";\n  mov.b64 %rd9, " + u(UmmaSmemDesc{0, 128, 256}.bits()) +
                  ";\n  mov.b64 %rd10, " + u(UmmaSmemDesc{2048, 128, 256}.bits()) + R"(;
  add.s64 %rd9, %rd9, %rd13;
  add.s64 %rd10, %rd10, %rd13;
  @%p3 bra I;
  @%p2 bra I;
  tcgen05.mma.cta_group::2.kind::f16 [%r8], %rd9, %rd10, %r13, 0; // MMA
)";
  if (h.commit) s += umma_commit(2);
  // The cluster barrier: the odd CTA's threads go on knowing the MMA was
  // issued, not that it completed.
  s += std::string("I:\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n") + h.others;
  if (h.wait) s += kUmmaWait;
  if (h.read)
    s += "  tcgen05.ld.sync.aligned.32x32b.x8.b32 {%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}, "
         "[%r11]; // READ\n  tcgen05.wait::ld.sync.aligned;\n";
  return s + pair_finish(h.dealloc);
}

const PairHazard kPairHazards[] = {
    {"the odd CTA's tcgen05.ld of D before its wait", true,
     "  @!%p3 bra R1;\n  tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v0}, [%r11]; // OFF\n"
     "  tcgen05.wait::ld.sync.aligned;\nR1:\n",
     true, true, true, "// OFF", "whose completion no thread of this warp has observed"},
    {"the odd CTA's st.shared into its B before its wait", true,
     "  @!%p3 bra R2;\n  @%p2 bra R2;\n  st.shared.u32 [img+2048], %r1; // OFF\nR2:\n", true, true,
     true, "// OFF", "whose completion this thread has not observed"},
    {"the odd CTA's tcgen05.st into D before its wait", true,
     "  @!%p3 bra R3;\n  tcgen05.st.sync.aligned.32x32b.x1.b32 [%r11], {%r1}; // OFF\n"
     "  tcgen05.wait::st.sync.aligned;\nR3:\n",
     true, true, true, "// OFF", "whose completion no thread of this warp has observed"},
    {"an MMA of the odd CTA's thread into the same D", true,
     "  @!%p3 bra R4;\n  @%p2 bra R4;\n"
     "  tcgen05.mma.cta_group::2.kind::f16 [%r8], %rd9, %rd10, %r13, 1; // OFF\nR4:\n",
     false, false, true, "// OFF", "issued by another thread"},
    {"the pair's dealloc before any wait", true, "", false, false, true, "// DEALLOC",
     "whose completion no thread of the CTA pair has observed"},
    // (The odd CTA passes the cluster barrier once more: the even CTA
    // exits first, its never-committed MMA the error.)
    {"never committed", false,
     "  @!%p3 bra N1;\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\nN1:\n", false, false,
     false, nullptr, "never committed"},
};

// Runs a hazard kernel on a cluster of 2 (smem 4096 per CTA).
fa_status run_pair(const std::string &ptx, const char *entry, uint32_t ctas = 2) {
  DevBuf buf(1024);
  uint64_t p = buf.ptr;
  return run_ptx(ptx, entry, geom(ctas, 128, 4096), &p, sizeof p);
}

// The launch failed with a message holding `why` and "at PTX line N" for
// each marker's line N.
bool failed_naming(fa_status st, const std::string &ptx, const char *name, const char *why,
                   std::initializer_list<const char *> markers) {
  if (st == FA_SUCCESS) {
    std::fprintf(stderr, "%s: ran without an error\n", name);
    return false;
  }
  const std::string msg = fa::last_error();
  bool ok = msg.find(why) != std::string::npos;
  for (const char *m : markers)
    if (m && msg.find("PTX line " + u(static_cast<uint64_t>(line_of(ptx, m)))) == std::string::npos)
      ok = false;
  if (!ok) std::fprintf(stderr, "%s: unexpected message: %s\n", name, msg.c_str());
  return ok;
}

bool pair_hazard_caught(const PairHazard &h) {
  const std::string ptx = pair_hazard_kernel(h);
  return failed_naming(run_pair(ptx, "k_phz"), ptx, h.name, h.why, {"// MMA", h.offender});
}

void test_pair_hazards(void **) {
  for (const PairHazard &h : kPairHazards) assert_true(pair_hazard_caught(h));
  // The same kernel used correctly (commit to both, every thread waits,
  // then reads) runs.
  const PairHazard good = {"correct", true, "", true, true, true, nullptr, ""};
  const fa_status st = run_pair(pair_hazard_kernel(good), "k_phz");
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
}

// A TMA box into the odd CTA's B, issued by its thread 32 (after its wait
// on the MMA's phase, or not), into an mbarrier (count 2) whose phase the
// even CTA's thread 0 completes with a remote arrive after a cluster
// barrier (the sm_100a forward's CTA pair forwards its halves' arrivals so).
// The writes are the issuing thread's, checked when it issues: waited, it
// runs; not, the error names the MMA and the TMA. (Checked at the phase's
// completion as the completing thread's, as before, the forward's correct
// pair failed and this wrong kernel ran: the issuer had waited by then.)
std::string pair_tma_kernel(bool waits) {
  std::string others = R"(  setp.ne.u32 %p5, %r1, 32;
  add.u32 %r20, %r30, 3584;
  @%p2 bra T0;
  @!%p3 bra T0;
  mbarrier.init.shared::cta.b64 [%r20], 2;
  fence.mbarrier_init.release.cluster;
T0:
  barrier.cluster.arrive;
  barrier.cluster.wait;
  @%p5 bra T1;
  @!%p3 bra T1;
)";
  if (waits)
    others += R"(T2:
  mbarrier.try_wait.parity.shared::cta.b64 %p6, [ctl+8], 0;
  @!%p6 bra T2;
)";
  others += R"(  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r20], 64;
  add.u32 %r21, %r30, 2048;
  mov.u32 %r22, 0;
  cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%r21], [%rd1, {%r22}], [%r20]; // OFF
T1:
  barrier.cluster.arrive;
  barrier.cluster.wait;
  @%p2 bra T3;
  @%p3 bra T3;
  mapa.shared::cluster.u32 %r24, %r20, 1;
  mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r24];
T3:
)";
  const PairHazard h = {"tma", true, others.c_str(), true, true, true, "// OFF", ""};
  return pair_hazard_kernel(h);
}

// Runs it with run_with_tensor_map's tensor map (a cluster of 2).
fa_status run_pair_tma(const std::string &ptx) {
  return run_with_tensor_map(ptx, "k_phz", geom(2, 128, 4096));
}

void test_pair_tma_remote_phase(void **) {
  const fa_status st = run_pair_tma(pair_tma_kernel(true));
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  const std::string bad = pair_tma_kernel(false);
  assert_true(failed_naming(run_pair_tma(bad), bad, "TMA into B before the issuer's wait",
                            "whose completion this thread has not observed", {"// MMA", "// OFF"}));
}

// ============================================================ misuse ====

// Kernels misusing the pair, each an error naming its marked lines.
void test_pair_misuse(void **) {
  const std::string mma = "  mov.u32 %r13, " +
                          u(UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 64, 32}.bits()) +
                          ";\n  mov.b64 %rd9, " + u(UmmaSmemDesc{0, 128, 256}.bits()) +
                          ";\n  add.s64 %rd9, %rd9, %rd13;\n  @%p3 bra I;\n  @%p2 bra I;\n";
  const struct {
    const char *name;
    std::string ptx;
    uint32_t ctas;
    const char *why;
    std::initializer_list<const char *> markers;
  } cases[] = {
      {"a cluster of 1",
       pair_prologue("k_m", 1, 0, 0) + pair_finish(true),
       1,
       "needs a CTA pair, but the cluster has 1 CTA(s)",
       {"// ALLOC"}},
      {"a cluster of 3",
       pair_prologue("k_m", 1, 0, 3) + pair_finish(true),
       3,
       "the cluster has 3 CTA(s)",
       {"// ALLOC"}},
      {"the pair's allocs disagree",
       [] {
         std::string s = pair_prologue("k_m", 1, 0);
         const size_t at = s.find("], 512; // ALLOC");
         // The odd CTA's warp 0 asks for 256 columns (its own line).
         s.replace(at, std::string("], 512; // ALLOC").size(),
                   "], 512; // ALLOC\n  bra A1;\nODD:\n  tcgen05.alloc.cta_group::2.sync.aligned."
                   "shared::cta.b32 [ctl], 256; // ODD");
         s.replace(s.find("  @%p1 bra A1;\n"), std::string("  @%p1 bra A1;\n").size(),
                   "  @%p1 bra A1;\n  @%p3 bra ODD;\n");
         return s + pair_finish(true);
       }(),
       2,
       "differ from the peer CTA",
       {"// ALLOC", "// ODD"}},
      {"M 64",
       pair_prologue("k_m", 1, 0) + mma +
           "  tcgen05.mma.cta_group::2.kind::f16 [%r8], %rd9, %rd9, %r13, 0; // MMA\n"
           "I:\n" +
           pair_finish(true),
       2,
       "cta_group::2 takes M = 128 or 256",
       {"// MMA"}},
      {"a ctaMask past the cluster",
       pair_prologue("k_m", 1, 0) +
           "  @%p2 bra I;\n  mov.b16 %h1, 5;\n  tcgen05.commit.cta_group::2.mbarrier::arrive::one."
           "shared::cluster.multicast::cluster.b64 [ctl+8], %h1; // COMMIT\nI:\n" +
           pair_finish(true),
       2,
       "names CTA rank 2",
       {"// COMMIT"}},
      {"the peer exited",
       ".version 8.6\n.target sm_100a\n.address_size 64\n.visible .entry k_m(.param .align 8 .b8 "
       "prm[8]) .reqnctapercluster 2, 1, 1\n{\n  .reg .pred %p<2>;\n  .reg .b32 %r<4>;\n"
       "  .reg .b64 %rd<2>;\n  mov.u32 %r1, %cluster_ctarank;\n  setp.ne.u32 %p1, %r1, 0;\n"
       "  @%p1 bra X;\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n  mov.u32 %r2, 0;\n"
       "  mov.b64 %rd1, 0;\n  tcgen05.mma.cta_group::2.kind::f16 [%r2], %rd1, %rd1, %r2, 0; // "
       "MMA\n"
       "X:\n  ret;\n}\n",
       2,
       "the peer CTA (rank 1) has exited",
       {"// MMA"}},
  };
  for (const auto &c : cases)
    assert_true(failed_naming(run_pair(c.ptx, "k_m", c.ctas), c.ptx, c.name, c.why, c.markers));
  // .cta_group::1 and ::2 in one entry: refused at load, naming both lines.
  std::string mixed = pair_prologue("k_m", 1, 0);
  mixed += "  tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned; // MIX\n";
  mixed += pair_finish(true);
  assert_true(failed_naming(run_pair(mixed, "k_m"), mixed, "mixed", "one .cta_group",
                            {"// MIX", "// ALLOC"}));
}

// ======================================================== descriptors ====

// kernels/tile/umma.h's descriptor of a pair's MMA (M 128 / 256, N 16..256
// step 16) decodes back with cta_group 2, and not with 1 (M 256) nor
// cta_group 2's refusals (M 64, N 8).
void test_pair_descriptors(void **) {
  std::mt19937 rng(std::random_device{}());
  const UmmaType types[] = {UmmaType::kF16, UmmaType::kBF16, UmmaType::kE4M3, UmmaType::kE5M2};
  for (int i = 0; i < 1000; ++i) {
    UmmaInstrDesc d;
    const bool f8 = rng() % 2;
    d.a = types[(f8 ? 2 : 0) + rng() % 2];
    d.b = f8 ? types[2 + rng() % 2] : d.a;
    d.m = rng() % 2 ? 128 : 256;
    d.n = 16 * (1 + rng() % 16);
    d.a_mn_major = rng() % 2;
    d.b_mn_major = rng() % 2;
    fa::emu::UmmaInstr x;
    std::string why;
    assert_true(fa::emu::decode_umma_idesc(d.bits(), f8, &x, &why, 2));
    assert_int_equal(x.m, d.m);
    assert_int_equal(x.n, d.n);
    assert_int_equal(x.trans_a, d.a_mn_major);
    assert_int_equal(x.trans_b, d.b_mn_major);
    assert_int_equal(fa::emu::decode_umma_idesc(d.bits(), f8, &x, &why, 1), d.m == 128);
  }
  fa::emu::UmmaInstr x;
  std::string why;
  assert_false(fa::emu::decode_umma_idesc(
      UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 64, 32}.bits(), false, &x, &why, 2));
  assert_true(why.find("M = 64") != std::string::npos);
  assert_false(fa::emu::decode_umma_idesc(
      UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 256, 8}.bits(), false, &x, &why, 2));
  assert_true(why.find("N = 8") != std::string::npos);
}

// ==================================================== the builder ====

// Every cta_group::2 form of the builder (alloc, relinquish, mma ss / ts of
// kind::f16 and an f8f6f4 one, commit and commit_multicast, dealloc)
// through ptxas -arch=sm_100a and sm_103a (with a CUDA toolkit), and run on
// a cluster of 2: A (CTA-local row r, k) = r + k / 16 in each CTA's shared
// memory and (for ts) tensor memory, B = 1 in the even CTA's N / 2
// columns, 2 in the odd's; D (M 256, N 32) row r, column c = (16 r + 7.5)
// (1 or 2), checked by every lane of both CTAs for the ss and ts D.
void test_builder_forms_pair(void **) {
  using namespace fa::ptx;
  Builder b("k_bp", 8);
  b.set_arch_specific(true);
  b.set_cluster_dims(2, 1, 1);
  const Symbol ctl = b.shared("ctl", 8, 24);
  const Symbol img = b.shared("img", 1024, 8192);
  const Reg out = b.b64(), tid = b.b32(), warp = b.b32(), rank = b.b32(), base = b.b32(),
            bad = b.b32(), mask = b.b16(), sa = b.b32();
  const Reg p0 = b.pred(), pt = b.pred(), podd = b.pred(), pw = b.pred();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.mov(Type::U32, rank, sreg(Special::ClusterCtarank));
  b.op(Op::Shr, Type::U32, warp, tid, imm(5));
  b.setp(Cmp::Ne, Type::U32, p0, warp, imm(0));
  b.setp(Cmp::Ne, Type::U32, pt, tid, imm(0));
  b.setp(Cmp::Ne, Type::U32, podd, rank, imm(0));
  const Label l1 = b.label(), l2 = b.label(), issue = b.label(), wait = b.label(), done = b.label();
  b.when(p0).bra(l1);
  b.tcgen05_alloc(at(ctl), imm(256), 2);
  b.tcgen05_relinquish_alloc_permit(2);
  b.bind(l1);
  b.when(pt).bra(l2);
  b.mbarrier_init(at(ctl, 8), imm(1));
  b.mbarrier_init(at(ctl, 16), imm(1));
  b.fence_mbarrier_init();
  b.bind(l2);
  // A (each CTA's 128 rows) = r + k / 16, B (each CTA's 16 columns) = 1 +
  // rank (tests/support/umma_kernels.h, umma_builder_ab).
  b.mov(Type::U32, sa, sym(img));
  const Reg bval = b.b16(), fb = b.f32();
  b.cvt(Type::F32, Type::U32, Round::Rn, fb, rank);
  b.op(Op::Add, Type::F32, fb, fb, fimm(1.0f));
  b.cvt(Type::F16, Type::F32, Round::Rn, bval, fb);
  const std::vector<Reg> av = umma_builder_ab(b, tid, sa, bval);
  b.fence_proxy_async();
  // A for ts: columns 128..135 of each lane, packed f16 pairs (k even low).
  const Reg lane = b.b32(), tl = b.b32(), ta = b.b32();
  b.op(Op::Shl, Type::B32, lane, warp, imm(21));
  std::vector<Reg> pk(8);
  for (size_t j = 0; j < 8; ++j) {
    pk[j] = b.b32();
    b.cvt_pack(Type::F16, pk[j], av[2 * j + 1], av[2 * j]);
  }
  for (int pass = 0; pass < 2; ++pass) {  // the allocation's address, then A stored
    b.tcgen05_fence_before_thread_sync();
    b.barrier_cluster_arrive();
    b.barrier_cluster_wait();
    b.tcgen05_fence_after_thread_sync();
    if (pass) break;
    b.ld(Space::Shared, Type::U32, base, at(ctl));
    b.op(Op::Add, Type::U32, tl, base, lane);
    b.op(Op::Add, Type::U32, ta, tl, imm(128));
    b.tcgen05_st_32x32b(ta, pk.data(), 8);
    b.tcgen05_wait_st();
  }
  b.when(podd).bra(issue);
  b.when(pt).bra(issue);
  {
    const Reg da = b.b64(), db = b.b64(), acol = b.b32(), d1 = b.b32(), d2 = b.b32();
    umma_builder_descs(b, sa, da, db);
    b.op(Op::Add, Type::U32, acol, base, imm(128));
    b.op(Op::Add, Type::U32, d1, base, imm(32));
    b.op(Op::Add, Type::U32, d2, base, imm(64));
    const uint32_t idesc = UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 256, 32}.bits();
    const uint32_t idesc8 = UmmaInstrDesc{UmmaType::kE4M3, UmmaType::kE4M3, 256, 32}.bits();
    b.tcgen05_mma_ss(Builder::MmaKind::F16, base, da, db, imm(idesc), imm(0), 2);
    b.tcgen05_mma_ts(Builder::MmaKind::F16, d1, acol, db, imm(idesc), imm(0), 2);
    b.tcgen05_mma_ss(Builder::MmaKind::F8F6F4, d2, da, db, imm(idesc8), imm(0), 2);  // unchecked
    b.tcgen05_commit(at(ctl, 16), 2);
    b.mov(Type::B16, mask, imm(3));
    b.tcgen05_commit_multicast(at(ctl, 8), mask, 2);
  }
  b.bind(issue);
  b.bind(wait);
  b.mbarrier_try_wait_parity(pw, at(ctl, 8), imm(0));
  b.unless(pw).bra(wait);
  b.tcgen05_fence_after_thread_sync();
  {
    std::vector<Reg> v(8);
    for (Reg &x : v) x = b.b32();
    // D row r (av[0] = r) column c: (16 r + 7.5) (c < 16 ? 1 : 2).
    const Reg want = b.f32(), want2 = b.f32(), wb = b.b32(), wb2 = b.b32(), t1 = b.b32();
    b.op(Op::Mul, Type::F32, want, av[0], fimm(16.0f));
    b.op(Op::Add, Type::F32, want, want, fimm(7.5f));
    b.op(Op::Add, Type::F32, want2, want, want);
    b.mov(Type::B32, wb, want);
    b.mov(Type::B32, wb2, want2);
    b.mov(Type::U32, bad, imm(0));
    for (int d = 0; d < 2; ++d) {  // the ss D (columns 0..) and the ts D (32..)
      for (int c0 = 0; c0 < 32; c0 += 8) {
        b.op(Op::Add, Type::U32, t1, tl, imm(32 * d + c0));
        umma_builder_check8(b, t1, v, c0 < 16 ? wb : wb2, bad, 1 + d);
      }
    }
  }
  const Reg addr = b.b64(), off = b.b64(), g = b.b32();
  b.op(Op::Shl, Type::B32, g, rank, imm(7));
  b.op(Op::Add, Type::U32, g, g, tid);
  b.mul_wide(Type::U32, off, g, imm(4));
  b.op(Op::Add, Type::U64, addr, out, off);
  b.st(Space::Global, Type::U32, at(addr), bad);
  b.tcgen05_fence_before_thread_sync();
  b.barrier_cluster_arrive();
  b.barrier_cluster_wait();
  b.when(p0).bra(done);
  b.tcgen05_dealloc(base, imm(256), 2);
  b.bind(done);
  b.ret();
  umma_builder_run(umma_builder_emit(b), "k_bp", 2);
}

// ============================================ deliberate emulator bugs ====

// Each bug makes a check that passes without it fail: the values (B's
// halves swapped, the odd CTA's D rows in the even's), the multicast
// commit (the odd CTA never wakes: a deadlock), the hazards (commits
// observed at once).
void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  const std::function<bool()> values256 = [&] { return pair_mma_ok(kPairCases[kCase256], rng); };
  const std::function<bool()> values128 = [&] { return pair_mma_ok(kPairCases[kCase128], rng); };
  const std::function<bool()> hazard_ld = [] { return pair_hazard_caught(kPairHazards[0]); };
  const std::function<bool()> hazard_free = [] { return pair_hazard_caught(kPairHazards[4]); };
  const struct {
    int bug;
    const std::function<bool()> &check;
  } cases[] = {
      {fa::emu::kSm100BugPairBSwap, values256},     {fa::emu::kSm100BugPairDEven, values128},
      {fa::emu::kSm100BugMulticastSkip, values256}, {fa::emu::kSm100BugCommitEarly, hazard_ld},
      {fa::emu::kSm100BugCommitEarly, hazard_free},
  };
  for (const auto &c : cases) {
    Sm100BugScope bug(c.bug);
    assert_false(c.check());
  }
  // And with no bug every check passes again.
  for (const auto &c : cases) assert_true(c.check());
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pair_descriptors), cmocka_unit_test(test_pair_values),
      cmocka_unit_test(test_pair_hazards),     cmocka_unit_test(test_pair_tma_remote_phase),
      cmocka_unit_test(test_pair_misuse),      cmocka_unit_test(test_builder_forms_pair),
      cmocka_unit_test(test_deliberate_bugs),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<100>, emu_teardown);
}
