// Tests of the emulator's thread-block clusters (docs/emulator.md,
// "Clusters") through the Backend interface, on small hand-written sm_90a
// kernels: every cluster special register in every thread for cluster
// shapes 1x1x1, 2x1x1, 4x1x1 and 2x2x1 (and without a cluster); distributed
// shared memory element by element (each CTA reads every CTA's pattern with
// mapa + ld.shared::cluster, writes its neighbour's with st.shared::cluster);
// a remote mbarrier arrive completing a phase; multicast TMA to several
// ctaMasks; every misuse an error naming the PTX line(s); the builder's
// forms through ptxas -arch=sm_90a and sm_100a; and the deliberate emulator
// bugs of emu/cluster.h, each caught by one of these checks.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/cluster.h"
#include "emu/tensor_map.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

const char *kHopper = ".version 8.0\n.target sm_90a\n.address_size 64\n";

// Sets a deliberate emulator bug for the scope.
struct BugScope {
  explicit BugScope(int bug) { fa::emu::g_cluster_bug = bug; }
  ~BugScope() { fa::emu::g_cluster_bug = fa::emu::kClusterBugNone; }
};

struct Shape {
  uint32_t x, y, z;
  uint32_t size() const { return x * y * z; }
};

std::string u(uint64_t v) { return std::to_string(v); }

std::string directive(const Shape &c) {
  return " .reqnctapercluster " + u(c.x) + ", " + u(c.y) + ", " + u(c.z);
}

fa::LaunchGeometry geom3(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t smem = 0) {
  fa::LaunchGeometry g = geom(gx, bx, smem);
  g.grid[1] = gy;
  g.grid[2] = gz;
  return g;
}

// Launches ptx; false (and the error) when it fails.
bool launched(const std::string &ptx, const char *entry, const fa::LaunchGeometry &g,
              const void *prm, size_t n) {
  const fa_status st = run_ptx(ptx, entry, g, prm, n);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s: launch failed: %s\n", entry, fa::last_error());
  return st == FA_SUCCESS;
}

// The PTX of the block's linear index (%r6) and the thread's global index
// (%r8) for blocks of 64 threads.
const char *kGlobalThread = R"(
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ctaid.y;
  mov.u32 %r3, %ctaid.z;
  mov.u32 %r4, %nctaid.x;
  mov.u32 %r5, %nctaid.y;
  mad.lo.u32 %r6, %r3, %r5, %r2;
  mad.lo.u32 %r6, %r6, %r4, %r1;
  mov.u32 %r7, %tid.x;
  mad.lo.u32 %r8, %r6, 64, %r7;
)";

// Where block (bx, by, bz) of the grid sits in its cluster of shape c.
struct Place {
  uint32_t cc[3], cid[3], rank;
};
Place place(const Shape &c, uint32_t bx, uint32_t by, uint32_t bz) {
  Place p;
  const uint32_t b[3] = {bx, by, bz}, d[3] = {c.x, c.y, c.z};
  for (int k = 0; k < 3; ++k) {
    p.cc[k] = b[k] % d[k];
    p.cid[k] = b[k] / d[k];
  }
  p.rank = p.cc[0] + c.x * (p.cc[1] + c.y * p.cc[2]);
  return p;
}

// ================================================= special registers ====

const char *kSpecials[] = {"%cluster_ctarank",  "%cluster_nctarank", "%clusterid.x",
                           "%clusterid.y",      "%clusterid.z",      "%nclusterid.x",
                           "%nclusterid.y",     "%nclusterid.z",     "%cluster_ctaid.x",
                           "%cluster_ctaid.y",  "%cluster_ctaid.z",  "%cluster_nctaid.x",
                           "%cluster_nctaid.y", "%cluster_nctaid.z", "%ctaid.x",
                           "%ctaid.y",          "%ctaid.z"};
constexpr int kNumSpecials = 17, kWords = kNumSpecials + 1;  // + %is_explicit_cluster

// Every thread stores the cluster special registers and %is_explicit_cluster.
std::string specials_kernel(const Shape *c) {
  std::string s = std::string(kHopper) + ".visible .entry k_sr(.param .u64 out)" +
                  (c ? directive(*c) : "") +
                  "\n{\n  .reg .pred %p<2>;\n  .reg .b32 %r<24>;\n  .reg .b64 %rd<4>;\n"
                  "  ld.param.u64 %rd1, [out];" +
                  kGlobalThread + "  mul.wide.u32 %rd2, %r8, " + u(4 * kWords) +
                  ";\n  add.s64 %rd3, %rd1, %rd2;\n";
  for (int k = 0; k < kNumSpecials; ++k)
    s += "  mov.u32 %r10, " + std::string(kSpecials[k]) + ";\n  st.global.u32 [%rd3+" + u(4 * k) +
         "], %r10;\n";
  s += "  mov.pred %p1, %is_explicit_cluster;\n  selp.u32 %r10, 1, 0, %p1;\n"
       "  st.global.u32 [%rd3+" +
       u(4 * kNumSpecials) + "], %r10;\n  ret;\n}\n";
  return s;
}

// Runs the kernel over grid (4, 2, 2) x 64 threads; false on the first
// register that differs from the ISA's definition.
bool specials_ok(const Shape *c) {
  const uint32_t g[3] = {4, 2, 2};
  const Shape cs = c ? *c : Shape{1, 1, 1};
  const uint32_t nthreads = g[0] * g[1] * g[2] * 64;
  DevBuf out(nthreads * kWords * 4);
  const uint64_t prm = out.ptr;
  const std::string ptx = specials_kernel(c);
  if (ptxas_accepts(ptx, "sm_90a") == 0) {
    std::fprintf(stderr, "ptxas rejects:\n%s", ptx.c_str());
    return false;
  }
  if (!launched(ptx, "k_sr", geom3(g[0], g[1], g[2], 64), &prm, sizeof prm)) return false;
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t bz = 0; bz < g[2]; ++bz)
    for (uint32_t by = 0; by < g[1]; ++by)
      for (uint32_t bx = 0; bx < g[0]; ++bx) {
        const Place p = place(cs, bx, by, bz);
        const uint32_t d[3] = {cs.x, cs.y, cs.z}, b[3] = {bx, by, bz};
        uint32_t want[kWords] = {p.rank, cs.size()};
        for (int k = 0; k < 3; ++k) {
          want[2 + k] = p.cid[k];
          want[5 + k] = g[k] / d[k];
          want[8 + k] = p.cc[k];
          want[11 + k] = d[k];
          want[14 + k] = b[k];
        }
        want[kNumSpecials] = c ? 1 : 0;
        for (uint32_t t = 0; t < 64; ++t) {
          const size_t gt = ((bz * g[1] + by) * g[0] + bx) * 64 + t;
          for (int k = 0; k < kWords; ++k) {
            const uint32_t got = o[gt * kWords + static_cast<size_t>(k)];
            if (got != want[k]) {
              std::fprintf(stderr,
                           "cluster %ux%ux%u block (%u,%u,%u) thread %u: %s = %u, want %u\n", cs.x,
                           cs.y, cs.z, bx, by, bz, t,
                           k < kNumSpecials ? kSpecials[k] : "%is_explicit_cluster", got, want[k]);
              return false;
            }
          }
        }
      }
  return true;
}

const Shape kShapes[] = {{1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {2, 2, 1}};

void test_special_registers(void **) {
  assert_true(specials_ok(nullptr));  // no cluster: the implicit 1x1x1 one
  for (const Shape &c : kShapes) assert_true(specials_ok(&c));
}

// ======================================== distributed shared memory ====

// Word j of the pattern of CTA rank r, thread t: seed ^ (r << 16 | t << 4 | j).
uint32_t pattern(uint32_t seed, uint32_t r, uint32_t t, uint32_t j) {
  return seed ^ ((r << 16) | (t << 4) | j);
}

// Phase 1: each thread stores its pattern (v4) at sa + 16 t; cluster barrier.
// Phase 2: for every rank q, ld.shared::cluster.v4 of q's sa at 16 ((t + q) %
// 64) (mapa of the symbol, the rank an immediate), stored at out[(g n + q)
// 16]; st.shared::cluster.v2 of {~pattern word 0, t} to the next rank's sb at
// 8 t (mapa of a register, the rank a register); cluster barrier.
// Phase 3: ld.shared::cluster.b64 of the own sb at 8 t through its
// shared::cta address, stored at out2[g].
std::string dsmem_kernel(const Shape &c) {
  const uint32_t n = c.size();
  std::string s = std::string(kHopper) + ".visible .entry k_ds(.param .u64 out, .param .u32 seed)" +
                  directive(c) + R"(
{
  .reg .pred %p<2>;
  .reg .b32 %r<40>;
  .reg .b64 %rd<8>;
  .shared .align 16 .b8 sa[1024];
  .shared .align 16 .b8 sb[512];
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r20, [seed];)" +
                  kGlobalThread + R"(
  mov.u32 %r9, %cluster_ctarank;
  mov.u32 %r19, %cluster_nctarank;
  shl.b32 %r10, %r9, 16;
  shl.b32 %r11, %r7, 4;
  or.b32 %r11, %r10, %r11;
  xor.b32 %r11, %r11, %r20;
  xor.b32 %r12, %r11, 1;
  xor.b32 %r15, %r11, 2;
  xor.b32 %r16, %r11, 3;
  mov.u32 %r13, sa;
  mad.lo.u32 %r14, %r7, 16, %r13;
  st.shared.v4.u32 [%r14], {%r11, %r12, %r15, %r16};
  barrier.cluster.arrive.release.aligned;
  barrier.cluster.wait.acquire.aligned;
)";
  for (uint32_t q = 0; q < n; ++q) {
    s += "  add.u32 %r21, %r7, " + u(q) +
         ";\n  and.b32 %r21, %r21, 63;\n  shl.b32 %r21, %r21, 4;\n"
         "  mapa.shared::cluster.u32 %r22, sa, " +
         u(q) +
         ";\n  add.u32 %r22, %r22, %r21;\n"
         "  ld.shared::cluster.v4.u32 {%r24, %r25, %r26, %r27}, [%r22];\n"
         "  mad.lo.u32 %r28, %r8, " +
         u(n) + ", " + u(q) +
         ";\n  mul.wide.u32 %rd2, %r28, 16;\n  add.s64 %rd3, %rd1, %rd2;\n"
         "  st.global.v4.u32 [%rd3], {%r24, %r25, %r26, %r27};\n";
  }
  s += R"(  add.u32 %r30, %r9, 1;
  rem.u32 %r30, %r30, %r19;
  mov.u32 %r31, sb;
  mapa.shared::cluster.u32 %r32, %r31, %r30;
  mad.lo.u32 %r32, %r7, 8, %r32;
  not.b32 %r33, %r11;
  st.shared::cluster.v2.u32 [%r32], {%r33, %r7};
  barrier.cluster.arrive;
  barrier.cluster.wait;
  mad.lo.u32 %r34, %r7, 8, %r31;
  ld.shared::cluster.b64 %rd4, [%r34];
  mul.wide.u32 %rd5, %r8, 8;
  add.s64 %rd6, %rd1, %rd5;
  st.global.u64 [%rd6+)" +
       u(16 * 512 * n) + R"(], %rd4;
  ret;
}
)";
  return s;
}

// Runs the DSMEM kernel over grid (4, 2, 1) x 64 with a fresh seed; false on
// the first element that differs.
bool dsmem_ok(const Shape &c, uint32_t seed) {
  const uint32_t n = c.size(), nthreads = 8 * 64;
  DevBuf out(nthreads * n * 16 + nthreads * 8);
  struct {
    uint64_t out;
    uint32_t seed, pad;
  } prm = {out.ptr, seed, 0};
  const std::string ptx = dsmem_kernel(c);
  if (ptxas_accepts(ptx, "sm_90a") == 0) {
    std::fprintf(stderr, "ptxas rejects:\n%s", ptx.c_str());
    return false;
  }
  if (!launched(ptx, "k_ds", geom3(4, 2, 1, 64), &prm, sizeof prm)) return false;
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t by = 0; by < 2; ++by)
    for (uint32_t bx = 0; bx < 4; ++bx) {
      const uint32_t rank = place(c, bx, by, 0).rank;
      for (uint32_t t = 0; t < 64; ++t) {
        const size_t g = (by * 4 + bx) * 64 + t;
        for (uint32_t q = 0; q < n; ++q)
          for (uint32_t j = 0; j < 4; ++j) {
            const uint32_t got = o[(g * n + q) * 4 + j], want = pattern(seed, q, (t + q) % 64, j);
            if (got != want) {
              std::fprintf(stderr,
                           "cluster %ux%ux%u block (%u,%u) rank %u thread %u: word %u of rank "
                           "%u's pattern is 0x%08x, want 0x%08x\n",
                           c.x, c.y, c.z, bx, by, rank, t, j, q, got, want);
              return false;
            }
          }
        const uint32_t src = (rank + n - 1) % n;
        const size_t w = nthreads * n * 4 + 2 * g;
        if (o[w] != ~pattern(seed, src, t, 0) || o[w + 1] != t) {
          std::fprintf(stderr,
                       "cluster %ux%ux%u block (%u,%u) thread %u: the word pair rank %u stored "
                       "is {0x%08x, %u}, want {0x%08x, %u}\n",
                       c.x, c.y, c.z, bx, by, t, src, o[w], o[w + 1], ~pattern(seed, src, t, 0), t);
          return false;
        }
      }
    }
  return true;
}

void test_dsmem(void **) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape &c : kShapes) assert_true(dsmem_ok(c, static_cast<uint32_t>(rng())));
}

// =================================================== remote mbarrier ====

// Rank 0 inits an mbarrier for n - 1 arrivals; every other rank's thread 0
// stores 4 words (seed ^ rank << 8 ^ j) into rank 0's data at 16 rank, then
// arrives on rank 0's mbarrier through its shared::cluster address; rank 0
// waits for the phase and stores data[4 .. 4n) to out[16 cluster ..].
// `fence`: fence.mbarrier_init after the init; `sync`: the cluster barrier
// between the init and the remote arrivals.
std::string remote_kernel(const Shape &c, bool fence, bool sync) {
  std::string s = std::string(kHopper) + ".visible .entry k_rm(.param .u64 out, .param .u32 seed)" +
                  directive(c) + R"(
{
  .reg .pred %p<6>;
  .reg .b32 %r<40>;
  .reg .b64 %rd<8>;
  .shared .align 8 .b8 mb[8];
  .shared .align 16 .b8 data[256];
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r20, [seed];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %cluster_ctarank;
  mov.u32 %r3, %cluster_nctarank;
  mov.u32 %r4, %clusterid.x;
  setp.eq.u32 %p1, %r1, 0;
  setp.eq.u32 %p2, %r2, 0;
  and.pred %p3, %p1, %p2;
  @!%p3 bra L_init;
  sub.u32 %r5, %r3, 1;
  mbarrier.init.shared::cta.b64 [mb], %r5; // init
)";
  if (fence) s += "  fence.mbarrier_init.release.cluster;\n";
  s += "L_init:\n";
  if (sync) s += "  barrier.cluster.arrive.relaxed.aligned;\n  barrier.cluster.wait.aligned;\n";
  s += R"(  @%p2 bra L_wait;
  @!%p1 bra L_end;
  shl.b32 %r6, %r2, 8;
  xor.b32 %r6, %r6, %r20;
  xor.b32 %r7, %r6, 1;
  xor.b32 %r8, %r6, 2;
  xor.b32 %r9, %r6, 3;
  mov.u32 %r10, data;
  mapa.shared::cluster.u32 %r11, %r10, 0;
  mad.lo.u32 %r11, %r2, 16, %r11;
  st.shared::cluster.v4.u32 [%r11], {%r6, %r7, %r8, %r9};
  mov.u32 %r12, mb;
  mapa.shared::cluster.u32 %r13, %r12, 0;
  mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r13]; // remote
  bra L_end;
L_wait:
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [mb], 0;
  @!%p4 bra L_wait;
  shl.b32 %r14, %r3, 2;
  setp.lt.u32 %p5, %r1, 4;
  @%p5 bra L_end;
  setp.ge.u32 %p5, %r1, %r14;
  @%p5 bra L_end;
  mov.u32 %r15, data;
  mad.lo.u32 %r15, %r1, 4, %r15;
  ld.shared.u32 %r16, [%r15];
  mad.lo.u32 %r17, %r4, 64, %r1;
  mul.wide.u32 %rd2, %r17, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r16;
L_end:
  ret;
}
)";
  return s;
}

bool remote_ok(const Shape &c, uint32_t seed) {
  const uint32_t n = c.size(), nclusters = 8 / n;
  DevBuf out(nclusters * 64 * 4);
  struct {
    uint64_t out;
    uint32_t seed, pad;
  } prm = {out.ptr, seed, 0};
  if (!launched(remote_kernel(c, true, true), "k_rm", geom3(8, 1, 1, 64), &prm, sizeof prm))
    return false;
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t k = 0; k < nclusters; ++k)
    for (uint32_t w = 4; w < 4 * n; ++w) {
      const uint32_t want = seed ^ ((w / 4) << 8) ^ (w % 4);
      if (o[k * 64 + w] != want) {
        std::fprintf(stderr, "cluster %u: word %u of rank %u is 0x%08x, want 0x%08x\n", k, w % 4,
                     w / 4, o[k * 64 + w], want);
        return false;
      }
    }
  return true;
}

void test_remote_mbarrier(void **) {
  std::mt19937 rng(std::random_device{}());
  for (const Shape &c : {Shape{2, 1, 1}, Shape{4, 1, 1}})
    assert_true(remote_ok(c, static_cast<uint32_t>(rng())));
}

// ====================================================== multicast TMA ====

// The parameter block of the multicast kernel: the tensor map at +64.
struct McParams {
  uint64_t out;
  uint32_t mask, src;
  uint32_t unicast;  // 1 + the target's rank: the form without .multicast::cluster
  uint8_t pad[44];
  alignas(64) uint8_t map[128];
};

// The map of a u32 tensor of 8 rows of 32 at base, boxes of 4 rows (512 bytes).
fa::emu::TensorMap rows_map(uint64_t base) {
  fa::emu::TensorMap m;
  m.rank = 2;
  m.base = base;
  m.elem_bytes = 4;
  m.dims[0] = 32;
  m.dims[1] = 8;
  m.strides[0] = 4;
  m.strides[1] = 128;
  m.box[0] = 32;
  m.box[1] = 4;
  return m;
}

// Each CTA of a 4x1x1 cluster inits its mbarrier (smem + 0) and, after the
// cluster barrier, expects 512 bytes when its rank is in the mask; rank
// `src` multicasts the 512-byte box of rows 4 c .. 4 c + 3 (c = %clusterid.x)
// of a 32-column u32 tensor to smem + 1024 of the mask's CTAs. Those copy
// the box to out[512 block ..]; the others leave it as it was. With
// `unicast` set (a one-CTA mask), the copy has no .multicast::cluster: its
// destination and mbarrier are the mask's CTA's shared::cluster addresses
// from mapa.
std::string multicast_kernel() {
  return std::string(kHopper) +
         R"(.visible .entry k_mc(.param .align 64 .b8 k_mc_param[192]) .reqnctapercluster 4, 1, 1
{
  .reg .pred %p<8>;
  .reg .b16 %rs<4>;
  .reg .b32 %r<32>;
  .reg .b64 %rd<8>;
  .extern .shared .align 1024 .b8 smem[];
  ld.param.u64 %rd1, [k_mc_param+0];
  ld.param.u32 %r20, [k_mc_param+8];
  ld.param.u32 %r21, [k_mc_param+12];
  mov.u64 %rd2, k_mc_param;
  cvta.param.u64 %rd2, %rd2;
  add.s64 %rd3, %rd2, 64;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %cluster_ctarank;
  mov.u32 %r3, %clusterid.x;
  mov.u32 %r4, smem;
  add.u32 %r5, %r4, 1024;
  setp.eq.u32 %p1, %r1, 0;
  @!%p1 bra L_init;
  mbarrier.init.shared::cta.b64 [%r4], 1;
  fence.mbarrier_init.release.cluster;
L_init:
  barrier.cluster.arrive.aligned;
  barrier.cluster.wait.aligned;
  shr.u32 %r6, %r20, %r2;
  and.b32 %r6, %r6, 1;
  setp.ne.u32 %p2, %r6, 0;
  mul.lo.u32 %r7, %r6, 512;
  @!%p1 bra L_wait;
  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r4], %r7;
  setp.ne.u32 %p3, %r2, %r21;
  @%p3 bra L_wait;
  mov.b32 {%rs1, %rs2}, %r20;
  shl.b32 %r8, %r3, 2;
  mov.u32 %r9, 0;
  ld.param.u32 %r22, [k_mc_param+16];
  setp.ne.u32 %p5, %r22, 0;
  @%p5 bra L_unicast;
  cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r5], [%rd3, {%r9, %r8}], [%r4], %rs1; // multicast
  bra L_wait;
L_unicast:
  sub.u32 %r23, %r22, 1;
  mapa.shared::cluster.u32 %r24, %r5, %r23;
  mapa.shared::cluster.u32 %r25, %r4, %r23;
  cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r24], [%rd3, {%r9, %r8}], [%r25];
L_wait:
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r4], 0;
  @!%p4 bra L_wait;
  @!%p2 bra L_end;
  mad.lo.u32 %r10, %r1, 4, %r5;
  ld.shared.u32 %r11, [%r10];
  ld.shared.u32 %r12, [%r10+256];
  mov.u32 %r13, %ctaid.x;
  mad.lo.u32 %r14, %r13, 128, %r1;
  mul.wide.u32 %rd4, %r14, 4;
  add.s64 %rd5, %rd1, %rd4;
  st.global.u32 [%rd5], %r11;
  st.global.u32 [%rd5+256], %r12;
L_end:
  barrier.cluster.arrive.aligned;
  barrier.cluster.wait.aligned;
  ret;
}
)";
}

// Multicasts from rank src to mask over two clusters (grid 8); false on the
// first byte of a block that differs: the box in the mask's CTAs, the
// poison elsewhere.
bool multicast_ok(uint32_t mask, uint32_t src, std::mt19937 &rng, bool unicast = false) {
  std::vector<uint32_t> tensor(32 * 8);
  for (uint32_t &x : tensor) x = static_cast<uint32_t>(rng());
  DevBuf gt(tensor.size() * 4), out(8 * 512);
  gt.put(tensor);
  const fa::emu::TensorMap m = rows_map(gt.ptr);
  McParams prm{};
  prm.out = out.ptr;
  prm.mask = mask;
  prm.src = src;
  prm.unicast = unicast ? 1 + static_cast<uint32_t>(__builtin_ctz(mask)) : 0;
  fa::emu::store_tensor_map(m, prm.map);
  const std::string ptx = multicast_kernel();
  if (!launched(ptx, "k_mc", geom3(8, 1, 1, 64, 2048), &prm, sizeof prm)) return false;
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t b = 0; b < 8; ++b) {
    const bool in = (mask >> (b % 4)) & 1;
    for (uint32_t w = 0; w < 128; ++w) {
      const uint32_t want = in ? tensor[(b / 4) * 128 + w] : 0xABABABABu;
      if (o[b * 128 + w] != want) {
        std::fprintf(stderr, "mask 0x%x from rank %u: block %u word %u is 0x%08x, want 0x%08x\n",
                     mask, src, b, w, o[b * 128 + w], want);
        return false;
      }
    }
  }
  return true;
}

void test_multicast(void **) {
  std::mt19937 rng(std::random_device{}());
  assert_true(multicast_ok(0x3, 0, rng));
  assert_true(multicast_ok(0x1, 0, rng));
  assert_true(multicast_ok(0xf, 2, rng));
  assert_true(multicast_ok(0xa, 0, rng));  // the issuer outside the mask
  // Without .multicast::cluster, to another CTA's shared::cluster addresses.
  assert_true(multicast_ok(0x2, 0, rng, true));
  assert_true(multicast_ok(0x8, 1, rng, true));
}

// ============================================================ misuse ====

// A kernel of a 2x1x1 cluster (grid 2 x 64 threads, out at %rd1, tid %r1,
// rank %r2) around body; its error must contain each of `want` (a "@NAME"
// in them is replaced by "PTX line N" of the line with "// NAME").
struct ErrCase {
  const char *name;
  std::string body;
  std::vector<std::string> want;
  uint32_t grid = 2;
};

std::string err_kernel(const std::string &body) {
  return std::string(kHopper) +
         ".visible .entry k_err(.param .u64 out) .reqnctapercluster 2, 1, 1\n{\n"
         "  .reg .pred %p<8>;\n  .reg .b32 %r<32>;\n  .reg .b64 %rd<8>;\n"
         "  .shared .align 16 .b8 sm[256];\n  .shared .align 8 .b8 mb[8];\n"
         "  ld.param.u64 %rd1, [out];\n  mov.u32 %r1, %tid.x;\n"
         "  mov.u32 %r2, %cluster_ctarank;\n" +
         body + "  ret;\n}\n";
}

// Replaces each "@NAME" of w by "PTX line N" (N: the line with "// NAME").
std::string with_lines(const std::string &ptx, std::string w) {
  for (size_t at; (at = w.find('@')) != std::string::npos;) {
    size_t e = at + 1;
    while (e < w.size() && (std::isalnum(static_cast<unsigned char>(w[e])) || w[e] == '_')) ++e;
    const std::string marker = "// " + w.substr(at + 1, e - at - 1) + "\n";
    w.replace(at, e - at, "PTX line " + std::to_string(line_of(ptx, marker.c_str())));
  }
  return w;
}

std::vector<ErrCase> error_cases() {
  return {
      {"grid not a multiple",
       "",
       {"grid (3,1,1) is not a multiple of the cluster shape "
        "(.reqnctapercluster 2, 1, 1 of k_err)"},
       3},
      {"mapa rank",
       "  mov.u32 %r3, sm;\n  mapa.shared::cluster.u32 %r4, %r3, 2; // mapa\n",
       {"mapa.shared::cluster.u32 at @mapa: target CTA rank 2 is outside the cluster's 2 CTAs"}},
      {"remote out of bounds",
       "  mov.u32 %r3, sm;\n  mapa.shared::cluster.u32 %r4, %r3, 1;\n"
       "  ld.shared::cluster.u32 %r5, [%r4+264]; // ld\n",
       {"ld.shared::cluster.u32 at @ld: out-of-bounds shared::cluster address",
        "offset 264 of CTA rank 1, whose shared memory has 264 bytes"}},
      {"remote rank out of range",
       "  mov.u32 %r4, 0x3000000;\n  st.shared::cluster.u32 [%r4], %r1; // st\n",
       {"st.shared::cluster.u32 at @st: shared::cluster address 0x3000000 names CTA rank 2, but "
        "the cluster has 2 CTAs"}},
      {"missing wait",
       "  barrier.cluster.arrive; // first\n  barrier.cluster.arrive; // second\n",
       {"barrier.cluster.arrive at @second: the thread arrives at the cluster barrier again "
        "without a barrier.cluster.wait after its arrival at @first"}},
      {"wait without arrive",
       "  barrier.cluster.wait; // wait\n",
       {"barrier.cluster.wait at @wait: barrier.cluster.wait without a preceding "
        "barrier.cluster.arrive"}},
      {"deadlock across CTAs",
       "  setp.eq.u32 %p1, %r2, 0;\n  @!%p1 bra L_other;\n"
       "  barrier.cluster.arrive;\n  barrier.cluster.wait; // cwait\n  bra L_end;\n"
       "L_other:\n  setp.ne.u32 %p3, %r1, 0;\n  @%p3 bra L_sync;\n"
       "  mbarrier.init.shared::cta.b64 [mb], 1;\nL_sync:\n  bar.sync 0;\n"
       "L_spin:\n  mbarrier.try_wait.parity.shared::cta.b64 %p2, [mb], 0; // mwait\n"
       "  @!%p2 bra L_spin;\nL_end:\n",
       {"cluster deadlock: no CTA of cluster (0,0,0) (2 CTAs) can proceed",
        "rank 0: barrier.cluster.wait at @cwait: deadlock: 64 thread(s) of the CTA wait for "
        "phase 0 of the cluster barrier; 64 of the cluster's 128 non-exited threads arrived "
        "(the first missing: thread (0,0,0) block (1,0,0) at @mwait)",
        "rank 1: mbarrier.try_wait.parity.shared::cta.b64 at @mwait: deadlock"}},
      {"exited CTA",
       "  setp.eq.u32 %p1, %r2, 1;\n  @%p1 bra L_end;\n"
       "  barrier.cluster.arrive;\n  barrier.cluster.wait;\n  mov.u32 %r3, sm;\n"
       "  mapa.shared::cluster.u32 %r4, %r3, 1;\n"
       "  ld.shared::cluster.u32 %r5, [%r4]; // ld\nL_end:\n",
       {"ld.shared::cluster.u32 at @ld: shared::cluster address 0x2000000 is in CTA rank 1, "
        "which has exited"}},
  };
}

// Runs the case; true when the launch fails with every expected text.
bool error_case_ok(const ErrCase &c) {
  const std::string ptx = err_kernel(c.body);
  DevBuf out(4096);
  const uint64_t prm = out.ptr;
  const fa_status st = run_ptx(ptx, "k_err", geom3(c.grid, 1, 1, 64), &prm, sizeof prm);
  if (st == FA_SUCCESS) {
    std::fprintf(stderr, "%s: the launch succeeded\n", c.name);
    return false;
  }
  for (const std::string &w0 : c.want) {
    const std::string w = with_lines(ptx, w0);
    if (!std::strstr(fa::last_error(), w.c_str())) {
      std::fprintf(stderr, "%s: error \"%s\" lacks \"%s\"\n", c.name, fa::last_error(), w.c_str());
      return false;
    }
  }
  return true;
}

void test_misuse(void **) {
  for (const ErrCase &c : error_cases()) assert_true(error_case_ok(c));
  // A ctaMask naming a rank outside the cluster.
  std::mt19937 rng(1);
  assert_false(multicast_ok(0x10, 0, rng));
  expect_error("ctaMask 0x0010 names no CTA or a rank outside the cluster's 4");
  // The remote mbarrier without the fence or without the cluster barrier.
  DevBuf out(4096);
  struct {
    uint64_t out;
    uint32_t seed, pad;
  } prm = {out.ptr, 1, 0};
  for (int k = 0; k < 2; ++k) {
    const std::string ptx = remote_kernel(Shape{2, 1, 1}, k == 1, k == 0);
    assert_int_equal(run_ptx(ptx, "k_rm", geom3(2, 1, 1, 64), &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(with_lines(ptx,
                            "at @remote: the mbarrier at shared 0x0 of CTA rank 0 "
                            "(initialized at @init) is used from CTA rank 1 before"));
  }
}

void test_parse_errors(void **) {
  struct {
    std::string ptx;
    const char *why;
  } bad[] = {
      {".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry k() .reqnctapercluster "
       "2\n{\n ret;\n}\n",
       ".reqnctapercluster requires .target sm_90"},
      {err_kernel("  mapa.u32 %r3, %r1, 1;\n"), "only mapa.shared::cluster.{u32,u64}"},
      {err_kernel("  barrier.cluster.arrive.acquire;\n"), "only barrier.cluster.arrive"},
      {err_kernel("  mbarrier.try_wait.parity.shared::cluster.b64 %p1, [mb], 0;\n"),
       "only mbarrier.arrive takes a .shared::cluster mbarrier"},
      {err_kernel("  mbarrier.arrive.release.cluster.shared::cluster.b64 %rd2, [mb];\n"),
       "the destination must be _"},
  };
  for (const auto &b : bad) {
    std::vector<uint8_t> bin;
    std::string log;
    assert_int_not_equal(g_be->compile(b.ptx, &bin, &log), FA_SUCCESS);
    expect_error(b.why);
  }
}

// ============================================ deliberate emulator bugs ====
// Each bug of emu/cluster.h, switched on, makes one of the checks above fail.

void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  const Shape two = {2, 1, 1}, four = {4, 1, 1};
  {
    BugScope bug(fa::emu::kClusterBugRankOffByOne);
    assert_false(specials_ok(&two));
  }
  {
    BugScope bug(fa::emu::kClusterBugBarrierEarly);
    assert_false(dsmem_ok(four, static_cast<uint32_t>(rng())));
  }
  {
    BugScope bug(fa::emu::kClusterBugMulticastSkip);
    assert_false(multicast_ok(0xf, 2, rng));
  }
  {
    BugScope bug(fa::emu::kClusterBugDsmemLocal);
    assert_false(dsmem_ok(two, static_cast<uint32_t>(rng())));
  }
  // And with no bug every check passes again.
  assert_true(specials_ok(&two));
  assert_true(dsmem_ok(four, static_cast<uint32_t>(rng())));
  assert_true(multicast_ok(0xf, 2, rng));
}

// ======================================================= the builder ====

// Every cluster form the builder emits, in one kernel of 2x1x1 clusters
// (grid 4 x 64 threads): the special registers; thread 0 inits its CTA's
// mbarrier (2 arrivals) and fences the init; cluster barrier; each thread
// reads the other CTA's pattern (mapa of a symbol with a register rank,
// ld.shared::cluster) and stores {it, tid} into the other CTA's sb
// (st.shared::cluster.v2); thread 0 arrives with expect_tx 512 on its own
// mbarrier and remotely on the other CTA's, and rank 0 multicasts a box to
// both; everyone waits for the phase; relaxed cluster barrier; each thread
// stores what it read, its sb pair and two words of the box (20 words per
// thread: 14 special registers, %is_explicit_cluster, then those 5).
std::string builder_kernel() {
  using namespace fa::ptx;
  Builder b("k_bld", 192);
  b.set_param_align(64);
  b.set_cluster_dims(2, 1, 1);
  const Symbol sa = b.shared("sa", 16, 256), sb = b.shared("sb", 16, 512),
               mb = b.shared("mb", 8, 8), box = b.shared("box", 128, 512);
  const Reg out = b.b64(), prm = b.b64(), tmap = b.b64(), addr = b.b64(), off = b.b64();
  const Reg tid = b.b32(), rank = b.b32(), other = b.b32(), g = b.b32(), v = b.b32(), x = b.b32(),
            a = b.b32(), row = b.b32(), zero = b.b32(), w0 = b.b32(), w1 = b.b32(), p0 = b.b32(),
            p1 = b.b32();
  const Reg t0 = b.pred(), r0 = b.pred(), done = b.pred(), expl = b.pred();
  const Reg mask = b.b16();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.mov(Type::U32, rank, sreg(Special::ClusterCtarank));
  b.mov(Type::U32, g, sreg(Special::CtaidX));
  b.op(Op::MadLo, Type::U32, g, g, imm(64), tid);
  b.mul_wide(Type::U32, off, g, imm(80));
  b.op(Op::Add, Type::U64, addr, out, off);
  const Special specials[] = {
      Special::ClusterCtarank, Special::ClusterNctarank, Special::ClusteridX,
      Special::ClusteridY,     Special::ClusteridZ,      Special::NclusteridX,
      Special::NclusteridY,    Special::NclusteridZ,     Special::ClusterCtaidX,
      Special::ClusterCtaidY,  Special::ClusterCtaidZ,   Special::ClusterNctaidX,
      Special::ClusterNctaidY, Special::ClusterNctaidZ};
  int k = 0;
  for (Special sp : specials) {
    b.mov(Type::U32, x, sreg(sp));
    b.st(Space::Global, Type::U32, at(addr, 4 * k++), x);
  }
  b.is_explicit_cluster(expl);
  b.selp(Type::U32, x, imm(1), imm(0), expl);
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), x);
  // The pattern, the mbarrier and its fenced init.
  b.op(Op::MadLo, Type::U32, v, rank, imm(1000), tid);
  b.mov(Type::U32, a, sym(sa));
  b.op(Op::MadLo, Type::U32, a, tid, imm(4), a);
  b.st(Space::Shared, Type::U32, at(a), v);
  b.setp(Cmp::Eq, Type::U32, t0, tid, imm(0));
  const Label skip = b.label(), wait = b.label(), nomc = b.label();
  b.unless(t0).bra(skip);
  b.mbarrier_init(at(mb), imm(2));
  b.fence_mbarrier_init();
  b.bind(skip);
  b.barrier_cluster_arrive();
  b.barrier_cluster_wait();
  // Distributed shared memory.
  b.op(Op::Xor, Type::B32, other, rank, imm(1));
  b.mapa(a, sym(sa), other);
  b.op(Op::MadLo, Type::U32, a, tid, imm(4), a);
  b.ld(Space::Cluster, Type::U32, x, at(a));
  b.mov(Type::U32, a, sym(sb));
  b.mapa(a, a, other);
  b.op(Op::MadLo, Type::U32, a, tid, imm(8), a);
  b.st_v(Space::Cluster, Type::U32, at(a), {x, tid});
  // The mbarriers: own expect_tx, the other CTA's remote arrive, rank 0's multicast.
  b.unless(t0).bra(wait);
  b.mbarrier_arrive_expect_tx(at(mb), imm(512));
  b.mapa(a, sym(mb), other);
  b.mbarrier_arrive_cluster(at(a));
  b.setp(Cmp::Eq, Type::U32, r0, rank, imm(0));
  b.unless(r0).bra(nomc);
  b.param_address(prm);
  b.op(Op::Add, Type::U64, tmap, prm, imm(64));
  b.mov(Type::U32, row, sreg(Special::ClusteridX));
  b.op(Op::Shl, Type::B32, row, row, imm(2));
  b.mov(Type::U32, zero, imm(0));
  b.mov(Type::B16, mask, imm(3));
  const Reg coords[2] = {zero, row};
  b.mov(Type::U32, a, sym(box));
  b.cp_async_bulk_tensor_multicast(at(a), tmap, coords, 2, at(mb), mask);
  b.bind(nomc);
  b.bind(wait);
  const Label spin = b.label();
  b.bind(spin);
  b.mbarrier_try_wait_parity(done, at(mb), imm(0));
  b.unless(done).bra(spin);
  b.barrier_cluster_arrive(true);
  b.barrier_cluster_wait();
  // The results: what it read, its sb pair, two words of the box.
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), x);
  b.mov(Type::U32, a, sym(sb));
  b.op(Op::MadLo, Type::U32, a, tid, imm(8), a);
  b.ld_v(Space::Cluster, Type::U32, {p0, p1}, at(a));
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), p0);
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), p1);
  b.mov(Type::U32, a, sym(box));
  b.op(Op::MadLo, Type::U32, a, tid, imm(4), a);
  b.ld(Space::Shared, Type::U32, w0, at(a));
  b.ld(Space::Shared, Type::U32, w1, at(a, 256));
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), w0);
  b.st(Space::Global, Type::U32, at(addr, 4 * k++), w1);
  b.ret();
  assert_int_equal(b.min_sm(), 90);
  assert_int_equal(b.min_isa_version(), 80);
  return std::move(b).emit(80, 90, 64);
}

void test_builder_forms(void **) {
  std::string ptx = builder_kernel();
  assert_true(ptx.find(".reqnctapercluster 2, 1, 1") != std::string::npos);
  // sm_90a and sm_100a: the same text with the target changed.
  for (const char *arch : {"sm_90a", "sm_100a"}) {
    std::string t = ptx;
    const size_t at = t.find(".target sm_90");
    assert_true(at != std::string::npos);
    t.replace(at, std::strlen(".target sm_90"), std::string(".target ") + arch);
    if (std::strcmp(arch, "sm_100a") == 0) t.replace(t.find(".version 8.0"), 12, ".version 8.6");
    if (ptxas_accepts(t, arch) == 0) {
      std::fprintf(stderr, "ptxas -arch=%s rejects:\n%s", arch, t.c_str());
      fail();
    }
  }
  std::mt19937 rng(std::random_device{}());
  std::vector<uint32_t> tensor(32 * 8);
  for (uint32_t &x : tensor) x = static_cast<uint32_t>(rng());
  DevBuf gt(tensor.size() * 4), out(4 * 64 * 80);
  gt.put(tensor);
  const fa::emu::TensorMap m = rows_map(gt.ptr);
  McParams prm{};
  prm.out = out.ptr;
  fa::emu::store_tensor_map(m, prm.map);
  assert_true(launched(ptx, "k_bld", geom3(4, 1, 1, 64), &prm, sizeof prm));
  const std::vector<uint32_t> o = out.get<uint32_t>();
  for (uint32_t blk = 0; blk < 4; ++blk) {
    const uint32_t rank = blk % 2, other = rank ^ 1, cid = blk / 2;
    const uint32_t sp[15] = {rank, 2, cid, 0, 0, 2, 1, 1, rank, 0, 0, 2, 1, 1, 1};
    for (uint32_t t = 0; t < 64; ++t) {
      const uint32_t *r = &o[(blk * 64 + t) * 20];
      for (int k = 0; k < 15; ++k) assert_int_equal(r[k], sp[k]);
      const uint32_t want[5] = {other * 1000 + t, rank * 1000 + t, t, tensor[cid * 128 + t],
                                tensor[cid * 128 + t + 64]};
      for (int k = 0; k < 5; ++k) {
        if (r[15 + k] != want[k]) {
          std::fprintf(stderr, "block %u thread %u: word %d is 0x%08x, want 0x%08x\n", blk, t,
                       15 + k, r[15 + k], want[k]);
          fail();
        }
      }
    }
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_special_registers),
      cmocka_unit_test(test_dsmem),
      cmocka_unit_test(test_remote_mbarrier),
      cmocka_unit_test(test_multicast),
      cmocka_unit_test(test_misuse),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_deliberate_bugs),
      cmocka_unit_test(test_builder_forms),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<90>, emu_teardown);
}
