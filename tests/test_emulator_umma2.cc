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
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "emu/sm100.h"
#include "kernels/tile/umma.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"
#include "support/umma_operands.h"

namespace {

using namespace fa::test;
using fa::kgen::tile::UmmaInstrDesc;

struct BugScope {
  explicit BugScope(int bug) { fa::emu::g_sm100_bug = bug; }
  ~BugScope() { fa::emu::g_sm100_bug = fa::emu::kSm100BugNone; }
};

std::string u(uint64_t v) { return std::to_string(v); }

// ==================================================== the pair kernels ====

// The common start of the pair kernels: a cluster of `cluster` CTAs of 128
// threads; registers, ctl (the taddr word at ctl, the mbarrier at ctl+8),
// the image (.extern, 1024-aligned; its shared address in %r30), params 8
// bytes each into %rd1... Warp 0 of each CTA allocates 512 columns with
// tcgen05.alloc.cta_group::2 (the line marked "// ALLOC"), thread 0
// initializes the mbarrier (count 1) and fences the init for the cluster;
// with image_words, every thread copies its CTA's image (rank r's at %rd2 +
// r 4 image_words) into shared memory. Then the cluster barrier, the
// allocation's base in %r8, warp w's lane base (32 w) << 16 added in %r11,
// the image's descriptor start (%r30 >> 4) in %rd13; %r1 tid, %r2 warp, %r3
// lane, %r40 %cluster_ctarank, %p1 warp != 0, %p2 tid != 0, %p3 rank odd.
std::string pair_prologue(const char *entry, uint32_t nparams, uint32_t image_words,
                          uint32_t cluster = 2, uint32_t ncols = 512) {
  std::string s = ".version 8.6\n.target sm_100a\n.address_size 64\n.visible .entry " +
                  std::string(entry) + "(.param .align 8 .b8 prm[" + u(8 * nparams) + "])" +
                  (cluster > 1 ? " .reqnctapercluster " + u(cluster) + ", 1, 1" : "") + R"(
{
  .reg .pred %p<8>;
  .reg .b32 %r<48>;
  .reg .b32 %v<8>;
  .reg .b64 %rd<20>;
  .reg .b16 %h<4>;
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
  mov.u32 %r40, %cluster_ctarank;
  and.b32 %r41, %r40, 1;
  setp.ne.u32 %p3, %r41, 0;
  mov.u32 %r30, img;
  @%p1 bra A1;
  tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [ctl], )" +
       u(ncols) + R"(; // ALLOC
A1:
  @%p2 bra A2;
  mbarrier.init.shared::cta.b64 [ctl+8], 1;
  fence.mbarrier_init.release.cluster;
A2:
)";
  if (image_words)
    s += "  mul.wide.u32 %rd14, %r40, " + u(4 * image_words) + ";\n  add.s64 %rd2, %rd2, %rd14;\n" +
         R"(  mov.u32 %r4, %r1;
CP:
  setp.ge.u32 %p4, %r4, )" +
         u(image_words) + R"(;
  @%p4 bra CPD;
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
  barrier.cluster.arrive;
  barrier.cluster.wait;
  tcgen05.fence::after_thread_sync;
  ld.shared.u32 %r8, [ctl];
  shl.b32 %r10, %r2, 21;
  add.u32 %r11, %r8, %r10;
  cvt.u64.u32 %rd13, %r30;
  shr.u64 %rd13, %rd13, 4;
)";
  return s;
}

// Every thread waits for phase 0 of its CTA's mbarrier.
const char *kWait = R"(W:
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [ctl+8], 0;
  @!%p4 bra W;
  tcgen05.fence::after_thread_sync;
)";

// The pair's commit, multicast to both CTAs' mbarriers (the line "// COMMIT").
const char *kCommit2 =
    "  mov.b16 %h1, 3;\n"
    "  tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
    "[ctl+8], %h1; // COMMIT\n";

// The common end: the cluster barrier, warp 0 of each CTA frees the pair's
// 512 columns (the line "// DEALLOC"), exit.
std::string pair_finish(bool dealloc, uint32_t ncols = 512) {
  std::string s =
      "  tcgen05.fence::before_thread_sync;\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n"
      "  tcgen05.fence::after_thread_sync;\n  @%p1 bra DONE;\n";
  if (dealloc)
    s += "  tcgen05.dealloc.cta_group::2.sync.aligned.b32 %r8, " + u(ncols) + "; // DEALLOC\n";
  return s + "DONE:\n  ret;\n}\n";
}

// One tcgen05.mma.cta_group::2 case: kSteps K steps into one D (the first
// with enable, the rest with 1).
struct PairCase {
  UmmaType at, bt;
  uint32_t m, n;  // the pair's M (128 / 256) and N
  bool a_tmem, a_mn, b_mn;
  uint32_t swz_a, swz_b;
  int enable;  // enable-input-d of the first step: 0 / 1
  bool pred;   // enable-input-d as a predicate (else an immediate)
  bool neg_a;
};

constexpr uint32_t kSteps = 2;
constexpr uint32_t kACol = 448;  // A in tensor memory: columns 448 + 8 s ..

bool is_f8(UmmaType t) { return t == UmmaType::kE4M3 || t == UmmaType::kE5M2; }
// D columns per CTA: M = 128 splits N across lanes 0-63 / 64-127.
uint32_t d_cols(const PairCase &c) { return c.m == 128 ? c.n / 2 : c.n; }
// Per lane of each CTA: D's columns, 8 guard columns, A's 8 kSteps.
uint32_t row_words(const PairCase &c) { return d_cols(c) + 8 + 8 * kSteps; }

// Both CTAs: store each lane's `init` row (D and guard columns from column
// 0, A's columns from kACol) with tcgen05.st; the even CTA's thread 0
// issues the kSteps MMAs (idesc | enable << 32 at descs[0], A / B
// descriptors of step s at descs[1 + s] / [1 + kSteps + s]) and commits
// to both CTAs; every thread waits on its CTA's mbarrier, then each warp
// loads its lanes' D and guard columns into out (CTA r, lane l at row 128 r
// + l).
std::string pair_mma_kernel(const PairCase &c, uint32_t image_words) {
  const std::string kind = is_f8(c.at) ? "f8f6f4" : "f16";
  const uint32_t rw = row_words(c), dg = d_cols(c) + 8;
  std::string s = pair_prologue("k_pair", 4, image_words);
  auto line = [&s](const std::string &l) { s += "  " + l + ";\n"; };
  line("shl.b32 %r9, %r40, 7");
  line("add.u32 %r9, %r9, %r1");  // 128 rank + tid: the output row
  line("mul.wide.u32 %rd7, %r9, " + u(4 * rw));
  line("add.s64 %rd8, %rd3, %rd7");
  const std::string v8 = "{%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}";
  auto st8 = [&](uint32_t word, uint32_t col) {
    line("ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd8+" + u(4 * word) + "]");
    line("ld.global.v4.u32 {%v4, %v5, %v6, %v7}, [%rd8+" + u(4 * word + 16) + "]");
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.st.sync.aligned.32x32b.x8.b32 [%r12], " + v8);
    line("tcgen05.wait::st.sync.aligned");
  };
  for (uint32_t col = 0; col < dg; col += 8) st8(col, col);
  for (uint32_t st = 0; st < kSteps; ++st) st8(dg + 8 * st, kACol + 8 * st);
  line("tcgen05.fence::before_thread_sync");
  line("barrier.cluster.arrive");
  line("barrier.cluster.wait");
  line("tcgen05.fence::after_thread_sync");
  line("@%p3 bra W");
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
    line("tcgen05.mma.cta_group::2.kind::" + kind + " [%r8], " + a + ", %rd10, %r13, " + en);
  }
  s += kCommit2;
  s += kWait;
  line("mul.wide.u32 %rd11, %r9, " + u(4 * dg));
  line("add.s64 %rd12, %rd1, %rd11");
  for (uint32_t col = 0; col < dg; col += 8) {
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.ld.sync.aligned.32x32b.x8.b32 " + v8 + ", [%r12]");
    line("tcgen05.wait::ld.sync.aligned");
    line("st.global.v4.u32 [%rd12+" + u(4 * col) + "], {%v0, %v1, %v2, %v3}");
    line("st.global.v4.u32 [%rd12+" + u(4 * col + 16) + "], {%v4, %v5, %v6, %v7}");
  }
  return s + pair_finish(true);
}

// The pair's operands: A (M x kt) and B (N x kt) values, and CTA h's image
// (its M / 2 rows of A, unless in tensor memory, then its N / 2 columns of B).
struct PairOperands {
  std::vector<uint32_t> av, bv;
  SmemOperand a, b;
  uint32_t image = 0;  // bytes per CTA
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
  UmmaInstrDesc id;
  id.a = c.at;
  id.b = c.bt;
  id.m = c.m;
  id.n = c.n;
  id.a_mn_major = c.a_mn;
  id.b_mn_major = c.b_mn;
  id.neg_a = c.neg_a;
  std::vector<uint64_t> descs(1 + 2 * kSteps);
  descs[0] = id.bits() | uint64_t{static_cast<uint32_t>(c.enable)} << 32;
  for (uint32_t s = 0; s < kSteps; ++s) {
    descs[1 + s] = c.a_tmem ? 0 : o.a.desc(s * kk);
    descs[1 + kSteps + s] = o.b.desc(s * kk);
  }
  DevBuf in(o.img.size()), ini(init.size() * 4), ds(descs.size() * 8), out(2 * 128 * dg * 4);
  in.put(o.img);
  ini.put(init);
  ds.put(descs);
  struct {
    uint64_t out, in, init, descs;
  } prm = {out.ptr, in.ptr, ini.ptr, ds.ptr};
  const std::string ptx = pair_mma_kernel(c, o.image / 4);
  const fa_status st = run_ptx(ptx, "k_pair", geom(2, 128, o.image), &prm, sizeof prm);
  if (st != FA_SUCCESS) {
    std::fprintf(stderr, "pair M%u N%u: launch failed: %s\n", c.m, c.n, fa::last_error());
    return false;
  }
  const std::vector<uint32_t> got = out.get<uint32_t>();
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
        double ref = c.enable ? fa::emu::bits_f32(before) : 0.0, mag = std::fabs(ref);
        for (uint32_t k = 0; k < kt; ++k) {
          const double p =
              sa * value_of(c.at, o.av[grow * kt + k]) * value_of(c.bt, o.bv[col * kt + k]);
          ref += p;
          mag += std::fabs(p);
        }
        const double v = fa::emu::bits_f32(g);
        if (!(std::fabs(v - ref) <= 1e-5 * mag + 1e-30)) {
          std::fprintf(stderr, "pair M%u N%u: CTA %u lane %u column %u (D(%u, %u)) = %.9g, fp64 %.9g\n",
                       c.m, c.n, h, l, j, grow, col, v, ref);
          return false;
        }
      }
    }
  }
  return true;
}

const PairCase kPairCases[] = {
    // at, bt, m, n, a_tmem, a_mn, b_mn, swz_a, swz_b, enable, pred, neg_a
    {UmmaType::kF16, UmmaType::kF16, 256, 128, false, false, false, 128, 128, 0, false, false},
    {UmmaType::kBF16, UmmaType::kBF16, 256, 256, false, false, true, 64, 128, 1, false, false},
    {UmmaType::kE4M3, UmmaType::kE4M3, 256, 64, false, false, false, 128, 64, 0, false, false},
    {UmmaType::kF16, UmmaType::kF16, 128, 64, false, true, true, 32, 32, 1, true, false},
    {UmmaType::kBF16, UmmaType::kBF16, 128, 256, true, false, false, 0, 128, 1, false, false},
    {UmmaType::kE4M3, UmmaType::kE5M2, 256, 128, true, false, true, 0, 0, 0, false, true},
    {UmmaType::kF16, UmmaType::kF16, 128, 128, false, false, false, 0, 0, 0, true, true},
    {UmmaType::kE4M3, UmmaType::kE4M3, 128, 64, true, false, false, 0, 64, 1, false, false},
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
  const char *others;    // every thread of both CTAs (%p3: the odd CTA's)
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
  if (h.commit) s += kCommit2;
  // The cluster barrier: the odd CTA's threads go on knowing the MMA was
  // issued, not that it completed.
  s += std::string("I:\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n") + h.others;
  if (h.wait) s += kWait;
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
      {"a cluster of 1", pair_prologue("k_m", 1, 0, 1) + pair_finish(true), 1,
       "needs a CTA pair, but the cluster has 1 CTA(s)", {"// ALLOC"}},
      {"a cluster of 3", pair_prologue("k_m", 1, 0, 3) + pair_finish(true), 3,
       "the cluster has 3 CTA(s)", {"// ALLOC"}},
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
       2, "differ from the peer CTA", {"// ALLOC", "// ODD"}},
      {"M 64", pair_prologue("k_m", 1, 0) + mma +
                   "  tcgen05.mma.cta_group::2.kind::f16 [%r8], %rd9, %rd9, %r13, 0; // MMA\n"
                   "I:\n" + pair_finish(true),
       2, "cta_group::2 takes M = 128 or 256", {"// MMA"}},
      {"a ctaMask past the cluster",
       pair_prologue("k_m", 1, 0) +
           "  @%p2 bra I;\n  mov.b16 %h1, 5;\n  tcgen05.commit.cta_group::2.mbarrier::arrive::one."
           "shared::cluster.multicast::cluster.b64 [ctl+8], %h1; // COMMIT\nI:\n" +
           pair_finish(true),
       2, "names CTA rank 2", {"// COMMIT"}},
      {"the peer exited",
       ".version 8.6\n.target sm_100a\n.address_size 64\n.visible .entry k_m(.param .align 8 .b8 "
       "prm[8]) .reqnctapercluster 2, 1, 1\n{\n  .reg .pred %p<2>;\n  .reg .b32 %r<4>;\n"
       "  .reg .b64 %rd<2>;\n  mov.u32 %r1, %cluster_ctarank;\n  setp.ne.u32 %p1, %r1, 0;\n"
       "  @%p1 bra X;\n  barrier.cluster.arrive;\n  barrier.cluster.wait;\n  mov.u32 %r2, 0;\n"
       "  mov.b64 %rd1, 0;\n  tcgen05.mma.cta_group::2.kind::f16 [%r2], %rd1, %rd1, %r2, 0; // MMA\n"
       "X:\n  ret;\n}\n",
       2, "the peer CTA (rank 1) has exited", {"// MMA"}},
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
  assert_false(fa::emu::decode_umma_idesc(UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 64, 32}.bits(),
                                          false, &x, &why, 2));
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
            bad = b.b32(), mask = b.b16();
  const Reg p0 = b.pred(), pt = b.pred(), podd = b.pred(), pw = b.pred(), pbad = b.pred();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.mov(Type::U32, rank, sreg(Special::ClusterCtarank));
  b.op(Op::Shr, Type::U32, warp, tid, imm(5));
  b.setp(Cmp::Ne, Type::U32, p0, warp, imm(0));
  b.setp(Cmp::Ne, Type::U32, pt, tid, imm(0));
  b.setp(Cmp::Ne, Type::U32, podd, rank, imm(0));
  const Label l1 = b.label(), l2 = b.label(), issue = b.label(), wait = b.label(),
              done = b.label();
  b.when(p0).bra(l1);
  b.tcgen05_alloc(at(ctl), imm(256), 2);
  b.tcgen05_relinquish_alloc_permit(2);
  b.bind(l1);
  b.when(pt).bra(l2);
  b.mbarrier_init(at(ctl, 8), imm(1));
  b.mbarrier_init(at(ctl, 16), imm(1));
  b.fence_mbarrier_init();
  b.bind(l2);
  // A row tid at (tid / 8) 256 + (tid % 8) 16 (+ (k / 8) 128 + (k % 8) 2), B
  // (thread < 16: row tid) 4096 bytes further; B's value 1 + rank.
  const Reg r8 = b.b32(), rm = b.b32(), row = b.b32(), fr0 = b.f32(), sa = b.b32();
  b.mov(Type::U32, sa, sym(img));
  b.op(Op::Shr, Type::U32, r8, tid, imm(3));
  b.op(Op::And, Type::B32, rm, tid, imm(7));
  b.op(Op::Shl, Type::B32, r8, r8, imm(8));
  b.op(Op::Shl, Type::B32, rm, rm, imm(4));
  b.op(Op::Add, Type::U32, row, r8, rm);
  b.op(Op::Add, Type::U32, row, row, sa);
  b.cvt(Type::F32, Type::U32, Round::Rn, fr0, tid);
  const Reg bval = b.b16(), fb = b.f32();
  b.cvt(Type::F32, Type::U32, Round::Rn, fb, rank);
  b.op(Op::Add, Type::F32, fb, fb, fimm(1.0f));
  b.cvt(Type::F16, Type::F32, Round::Rn, bval, fb);
  b.setp(Cmp::Ge, Type::U32, pbad, tid, imm(16));
  std::vector<Reg> av(16);
  for (int k = 0; k < 16; ++k) {
    const int koff = (k / 8) * 128 + (k % 8) * 2;
    const Reg h = b.b16();
    av[static_cast<size_t>(k)] = b.f32();
    b.op(Op::Add, Type::F32, av[static_cast<size_t>(k)], fr0, fimm(static_cast<float>(k) / 16.0f));
    b.cvt(Type::F16, Type::F32, Round::Rn, h, av[static_cast<size_t>(k)]);
    b.st(Space::Shared, Type::B16, at(row, koff), h);
    b.unless(pbad).st(Space::Shared, Type::B16, at(row, 4096 + koff), bval);
  }
  b.fence_proxy_async();
  b.tcgen05_fence_before_thread_sync();
  b.barrier_cluster_arrive();
  b.barrier_cluster_wait();
  b.tcgen05_fence_after_thread_sync();
  b.ld(Space::Shared, Type::U32, base, at(ctl));
  // A for ts: columns 128..135 of each lane, packed f16 pairs (k even low).
  const Reg lane = b.b32(), tl = b.b32(), ta = b.b32();
  b.op(Op::Shl, Type::B32, lane, warp, imm(21));
  b.op(Op::Add, Type::U32, tl, base, lane);
  b.op(Op::Add, Type::U32, ta, tl, imm(128));
  std::vector<Reg> pk(8);
  for (int j = 0; j < 8; ++j) {
    pk[static_cast<size_t>(j)] = b.b32();
    b.cvt_pack(Type::F16, pk[static_cast<size_t>(j)], av[static_cast<size_t>(2 * j + 1)],
               av[static_cast<size_t>(2 * j)]);
  }
  b.tcgen05_st_32x32b(ta, pk.data(), 8);
  b.tcgen05_wait_st();
  b.tcgen05_fence_before_thread_sync();
  b.barrier_cluster_arrive();
  b.barrier_cluster_wait();
  b.tcgen05_fence_after_thread_sync();
  b.when(podd).bra(issue);
  b.when(pt).bra(issue);
  {
    const Reg da = b.b64(), db = b.b64(), acol = b.b32(), d1 = b.b32(), d2 = b.b32(), s64 = b.b64();
    b.cvt(Type::U64, Type::U32, Round::None, s64, sa);
    b.op(Op::Shr, Type::U64, s64, s64, imm(4));
    b.op(Op::Add, Type::U64, da, s64, imm(static_cast<int64_t>(UmmaSmemDesc{0, 128, 256}.bits())));
    b.op(Op::Add, Type::U64, db, s64,
         imm(static_cast<int64_t>(UmmaSmemDesc{4096, 128, 256}.bits())));
    b.op(Op::Add, Type::U32, acol, base, imm(128));
    b.op(Op::Add, Type::U32, d1, base, imm(32));
    b.op(Op::Add, Type::U32, d2, base, imm(64));
    const uint32_t idesc = UmmaInstrDesc{UmmaType::kF16, UmmaType::kF16, 256, 32}.bits();
    const uint32_t idesc8 = UmmaInstrDesc{UmmaType::kE4M3, UmmaType::kE4M3, 256, 32}.bits();
    b.tcgen05_mma_ss(Builder::MmaKind::F16, base, da, db, imm(idesc), imm(0), 2);
    b.tcgen05_mma_ts(Builder::MmaKind::F16, d1, acol, db, imm(idesc), imm(0), 2);
    b.tcgen05_mma_ss(Builder::MmaKind::F8F6F4, d2, da, db, imm(idesc8), imm(0), 2);
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
    std::vector<Reg> v0(8), v1(8);
    for (int j = 0; j < 8; ++j) {
      v0[static_cast<size_t>(j)] = b.b32();
      v1[static_cast<size_t>(j)] = b.b32();
    }
    const Reg want = b.f32(), want2 = b.f32(), wb = b.b32(), wb2 = b.b32(), t1 = b.b32();
    b.op(Op::Mul, Type::F32, want, fr0, fimm(16.0f));
    b.op(Op::Add, Type::F32, want, want, fimm(7.5f));
    b.op(Op::Add, Type::F32, want2, want, want);
    b.mov(Type::B32, wb, want);
    b.mov(Type::B32, wb2, want2);
    b.mov(Type::U32, bad, imm(0));
    for (int d = 0; d < 2; ++d) {  // the ss D (columns 0..) and the ts D (32..)
      for (int c0 = 0; c0 < 32; c0 += 8) {  // columns c0..c0+7: B 1 below 16, 2 from 16
        b.op(Op::Add, Type::U32, t1, tl, imm(32 * d + c0));
        b.tcgen05_ld_32x32b(v0.data(), 8, t1);
        b.tcgen05_wait_ld();
        for (int j = 0; j < 8; ++j) {
          b.setp(Cmp::Ne, Type::U32, pbad, v0[static_cast<size_t>(j)], c0 < 16 ? wb : wb2);
          b.selp(Type::U32, bad, imm(1 + d), bad, pbad);
        }
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
  for (int sm : {100, 103}) {  // sm_103a: PTX ISA 8.8
    const std::string text = b.emit(sm == 103 ? 88 : 86, sm, 128);
    const std::string arch = "sm_" + std::to_string(sm) + "a";
    if (ptxas_accepts(text, arch.c_str()) == 0) {
      std::fprintf(stderr, "ptxas -arch=%s rejects:\n%s", arch.c_str(), text.c_str());
      fail();
    }
  }
  const std::string ptx = b.emit(86, 100, 128);
  DevBuf res(2 * 128 * 4);
  uint64_t p = res.ptr;
  const fa_status st = run_ptx(ptx, "k_bp", geom(2, 128), &p, sizeof p);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n%s", fa::last_error(), ptx.c_str());
  assert_int_equal(st, FA_SUCCESS);
  for (uint32_t x : res.get<uint32_t>()) assert_int_equal(x, 0);
}

// ============================================ deliberate emulator bugs ====

void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  {
    BugScope bug(fa::emu::kSm100BugPairBSwap);
    assert_false(pair_mma_ok(kPairCases[kCase256], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugPairDEven);
    assert_false(pair_mma_ok(kPairCases[kCase128], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugMulticastSkip);  // the odd CTA never wakes
    assert_false(pair_mma_ok(kPairCases[kCase256], rng));
  }
  {
    BugScope bug(fa::emu::kSm100BugCommitEarly);
    assert_false(pair_hazard_caught(kPairHazards[0]));
    assert_false(pair_hazard_caught(kPairHazards[4]));
  }
  assert_true(pair_mma_ok(kPairCases[kCase256], rng));
  assert_true(pair_hazard_caught(kPairHazards[0]));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pair_descriptors), cmocka_unit_test(test_pair_values),
      cmocka_unit_test(test_pair_hazards),     cmocka_unit_test(test_pair_misuse),
      cmocka_unit_test(test_builder_forms_pair), cmocka_unit_test(test_deliberate_bugs),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<100>, emu_teardown);
}
