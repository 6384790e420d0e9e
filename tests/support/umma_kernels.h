// The PTX kernels of the tcgen05.mma tests (tests/test_emulator_umma.cc:
// cta_group::1; test_emulator_umma2.cc: cta_group::2, the CTA pair), as
// text, and the pieces their Builder kernels share. 128 threads per CTA.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "emu/sm100.h"
#include "emu/tensor_map.h"
#include "ptx/ptx.h"
#include "support/emu_harness.h"
#include "support/umma_operands.h"

namespace fa::test {

using fa::kgen::tile::UmmaInstrDesc;

// Runs a kernel whose parameter is a buffer holding, at +0, a tensor map of
// a 16-word fp32 tensor at +512 of the buffer (one box of all of it): the
// TMA hazard kernels'.
inline fa_status run_with_tensor_map(const std::string &ptx, const char *entry,
                                     const fa::LaunchGeometry &g) {
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
  return run_ptx(ptx, entry, g, &p, sizeof p);
}

// Sets a deliberate emulator bug (emu/sm100.h) for its scope.
struct Sm100BugScope {
  explicit Sm100BugScope(int bug) { fa::emu::g_sm100_bug = bug; }
  ~Sm100BugScope() { fa::emu::g_sm100_bug = fa::emu::kSm100BugNone; }
};

inline std::string u(uint64_t v) { return std::to_string(v); }

// What umma_prologue builds.
struct UmmaPrologue {
  const char *entry = "k";
  uint32_t nparams = 1;      // u64 parameters, into %rd1..
  uint32_t ncols = 512;      // columns warp 0 allocates
  uint32_t image_words = 0;  // words of shared image copied from %rd2 (0: none)
  int group = 1;             // .cta_group of the alloc (2: the CTA pair)
  uint32_t cluster = 0;      // .reqnctapercluster cluster, 1, 1 (0: none)
};

// The common start of the test kernels: registers, ctl (the taddr word at
// ctl, the mbarrier at ctl+8), the image (.extern, 1024-aligned: the
// swizzle patterns start there; its shared address in %r30), params into
// %rd1.. . Warp 0 allocates ncols columns (the line marked "// ALLOC"),
// thread 0 initializes the mbarrier (count 1; group 2: and fences the init
// for the cluster); with image_words, every thread copies its CTA's image
// (rank r's at %rd2 + 4 r image_words) into shared memory and fences it for
// the async proxy. Then a barrier (group 2: the cluster's), the
// allocation's base in %r8, warp w's lane base (32 w) << 16 added in %r11,
// the image's descriptor start (%r30 >> 4) in %rd13; %r1 tid, %r2 warp, %r3
// lane, %r40 %cluster_ctarank, %p1 warp != 0, %p2 tid != 0, %p3 rank odd.
inline std::string umma_prologue(const UmmaPrologue &p) {
  std::string s = ".version 8.6\n.target sm_100a\n.address_size 64\n.visible .entry " +
                  std::string(p.entry) + "(.param .align 8 .b8 prm[" + u(8 * p.nparams) + "])" +
                  (p.cluster ? " .reqnctapercluster " + u(p.cluster) + ", 1, 1" : "") + R"(
{
  .reg .pred %p<8>;
  .reg .b32 %r<48>;
  .reg .b32 %v<8>;
  .reg .b64 %rd<20>;
  .reg .b16 %h<4>;
  .shared .align 8 .b8 ctl[16];
  .extern .shared .align 1024 .b8 img[];
)";
  for (uint32_t i = 0; i < p.nparams; ++i)
    s += "  ld.param.u64 %rd" + u(i + 1) + ", [prm+" + u(8 * i) + "];\n";
  const std::string g = u(static_cast<uint64_t>(p.group));
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
  tcgen05.alloc.cta_group::)" +
       g + ".sync.aligned.shared::cta.b32 [ctl], " + u(p.ncols) + R"(; // ALLOC
A1:
  @%p2 bra A2;
  mbarrier.init.shared::cta.b64 [ctl+8], 1;
)" + (p.group == 2 ? "  fence.mbarrier_init.release.cluster;\n" : "") +
       "A2:\n";
  if (p.image_words)
    s += "  mul.wide.u32 %rd14, %r40, " + u(4 * p.image_words) +
         ";\n  add.s64 %rd2, %rd2, %rd14;\n  mov.u32 %r4, %r1;\nCP:\n  setp.ge.u32 %p4, %r4, " +
         u(p.image_words) + R"(;
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
  s += "  tcgen05.fence::before_thread_sync;\n";
  s += p.group == 2 ? "  barrier.cluster.arrive;\n  barrier.cluster.wait;\n" : "  bar.sync 0;\n";
  s += R"(  tcgen05.fence::after_thread_sync;
  ld.shared.u32 %r8, [ctl];
  shl.b32 %r10, %r2, 21;
  add.u32 %r11, %r8, %r10;
  cvt.u64.u32 %rd13, %r30;
  shr.u64 %rd13, %rd13, 4;
)";
  return s;
}

// Every thread waits for phase 0 of its CTA's mbarrier.
inline const char *kUmmaWait = R"(W:
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [ctl+8], 0;
  @!%p4 bra W;
  tcgen05.fence::after_thread_sync;
)";

// The common end: a barrier (group 2: the cluster's), warp 0 frees the
// ncols columns (dealloc; the line marked "// DEALLOC"), exit.
inline std::string umma_finish(uint32_t ncols, bool dealloc, int group = 1) {
  std::string s = "  tcgen05.fence::before_thread_sync;\n";
  s += group == 2 ? "  barrier.cluster.arrive;\n  barrier.cluster.wait;\n" : "  bar.sync 0;\n";
  s += "  tcgen05.fence::after_thread_sync;\n  @%p1 bra DONE;\n";
  if (dealloc)
    s += "  tcgen05.dealloc.cta_group::" + u(static_cast<uint64_t>(group)) +
         ".sync.aligned.b32 %r8, " + u(ncols) + "; // DEALLOC\n";
  return s + "DONE:\n  ret;\n}\n";
}

// The commit of the test kernels (the line "// COMMIT"): group 1 to the
// CTA's mbarrier, group 2 multicast to both CTAs' of the pair (ctaMask 3).
inline std::string umma_commit(int group) {
  if (group == 1)
    return "  tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [ctl+8]; "
           "// COMMIT\n";
  return "  mov.b16 %h1, 3;\n  tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster."
         "multicast::cluster.b64 [ctl+8], %h1; // COMMIT\n";
}

// What umma_mma_kernel builds besides its prologue (entry "k_mma", 4
// params: out, the images, init, descs).
struct UmmaMmaKernel {
  int group = 1;
  uint32_t d_words = 0;  // columns of each lane stored from init and loaded back into out
  uint32_t a_col = 0;    // A in tensor memory: its steps' 8 columns each from here
  uint32_t steps = 2;    // K steps into one D
  bool a_tmem = false, f8 = false;
  bool pred = false;  // enable-input-d of the first step a predicate (else `enable`)
  int enable = 0;
};

// Each lane (row 128 %cluster_ctarank + tid of init, d_words + 8 steps
// words) stores its D words to columns 0.. and its A words to a_col.. with
// tcgen05.st. Thread 0 (group 2: of the even CTA) issues the steps MMAs
// (idesc | enable << 32 at descs[0], A / B descriptors of step s at
// descs[1 + s] / [1 + steps + s], each plus the image's start) and commits
// (umma_commit); every thread waits on its CTA's mbarrier, then each warp
// loads its lanes' d_words columns into out (the same row numbering).
inline std::string umma_mma_kernel(const UmmaMmaKernel &k, uint32_t image_words) {
  UmmaPrologue p;
  p.entry = "k_mma";
  p.nparams = 4;
  p.image_words = image_words;
  p.group = k.group;
  p.cluster = k.group == 2 ? 2 : 0;
  std::string s = umma_prologue(p);
  const uint32_t rw = k.d_words + 8 * k.steps;
  auto line = [&s](const std::string &l) { s += "  " + l + ";\n"; };
  line("shl.b32 %r9, %r40, 7");
  line("add.u32 %r9, %r9, %r1");
  line("mul.wide.u32 %rd7, %r9, " + u(4 * rw));
  line("add.s64 %rd8, %rd3, %rd7");
  const std::string v8 = "{%v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}";
  auto st8 = [&](uint32_t word, uint32_t col) {
    line("ld.global.v4.u32 {%v0, %v1, %v2, %v3}, [%rd8+" + u(4 * word) + "]");
    line("ld.global.v4.u32 {%v4, %v5, %v6, %v7}, [%rd8+" + u(4 * word + 16) + "]");
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.st.sync.aligned.32x32b.x8.b32 [%r12], " + v8);
    line("tcgen05.wait::st.sync.aligned");  // before %v0.. are reloaded
  };
  for (uint32_t col = 0; col < k.d_words; col += 8) st8(col, col);
  for (uint32_t st = 0; st < k.steps; ++st) st8(k.d_words + 8 * st, k.a_col + 8 * st);
  line("tcgen05.fence::before_thread_sync");
  s += k.group == 2 ? "  barrier.cluster.arrive;\n  barrier.cluster.wait;\n" : "  bar.sync 0;\n";
  line("tcgen05.fence::after_thread_sync");
  if (k.group == 2) line("@%p3 bra W");
  line("@%p2 bra W");
  line("ld.global.u32 %r13, [%rd4]");
  line("ld.global.u32 %r15, [%rd4+4]");
  line("setp.ne.u32 %p5, %r15, 0");
  for (uint32_t st = 0; st < k.steps; ++st) {
    line("ld.global.u64 %rd9, [%rd4+" + u(8 + 8 * st) + "]");
    line("ld.global.u64 %rd10, [%rd4+" + u(8 + 8 * k.steps + 8 * st) + "]");
    line("add.s64 %rd9, %rd9, %rd13");
    line("add.s64 %rd10, %rd10, %rd13");
    const std::string en = st ? "1" : k.pred ? "%p5" : u(static_cast<uint32_t>(k.enable));
    std::string a = "%rd9";
    if (k.a_tmem) {
      line("add.u32 %r14, %r8, " + u(k.a_col + 8 * st));
      a = "[%r14]";
    }
    line("tcgen05.mma.cta_group::" + u(static_cast<uint64_t>(k.group)) +
         ".kind::" + (k.f8 ? "f8f6f4" : "f16") + " [%r8], " + a + ", %rd10, %r13, " + en);
  }
  s += umma_commit(k.group);
  s += kUmmaWait;
  line("mul.wide.u32 %rd11, %r9, " + u(4 * k.d_words));
  line("add.s64 %rd12, %rd1, %rd11");
  for (uint32_t col = 0; col < k.d_words; col += 8) {
    line("add.u32 %r12, %r11, " + u(col));
    line("tcgen05.ld.sync.aligned.32x32b.x8.b32 " + v8 + ", [%r12]");
    line("tcgen05.wait::ld.sync.aligned");
    line("st.global.v4.u32 [%rd12+" + u(4 * col) + "], {%v0, %v1, %v2, %v3}");
    line("st.global.v4.u32 [%rd12+" + u(4 * col + 16) + "], {%v4, %v5, %v6, %v7}");
  }
  return s + umma_finish(512, true, k.group);
}

// The descriptors of a test case's steps MMAs (Case: at, bt, m, n, a_mn,
// b_mn, neg_a, neg_b, enable, a_tmem): [0] idesc | enable << 32, [1 + s]
// A's of step s (0 with A in tensor memory), [1 + steps + s] B's; K = kk
// per step.
template <class Case>
std::vector<uint64_t> umma_case_descs(const Case &c, const SmemOperand &a, const SmemOperand &b,
                                      uint32_t steps, uint32_t kk) {
  UmmaInstrDesc id;
  id.a = c.at;
  id.b = c.bt;
  id.m = c.m;
  id.n = c.n;
  id.a_mn_major = c.a_mn;
  id.b_mn_major = c.b_mn;
  id.neg_a = c.neg_a;
  id.neg_b = c.neg_b;
  std::vector<uint64_t> descs(1 + 2 * steps);
  descs[0] = id.bits() | uint64_t{static_cast<uint32_t>(c.enable)} << 32;
  for (uint32_t s = 0; s < steps; ++s) {
    descs[1 + s] = c.a_tmem ? 0 : a.desc(s * kk);
    descs[1 + steps + s] = b.desc(s * kk);
  }
  return descs;
}

// Runs umma_mma_kernel's text on ctas CTAs of `image` bytes of dynamic
// shared memory each (img: the CTAs' images in order; init: the lanes'
// rows; descs), its out_words words of output into *out. False (a message
// naming what) when the launch fails.
inline bool umma_mma_launch(const std::string &ptx, uint32_t ctas, uint32_t image,
                            const std::vector<uint8_t> &img, const std::vector<uint32_t> &init,
                            const std::vector<uint64_t> &descs, size_t out_words, const char *what,
                            std::vector<uint32_t> *out) {
  DevBuf in(img.size()), ini(init.size() * 4), ds(descs.size() * 8), o(out_words * 4);
  in.put(img);
  ini.put(init);
  ds.put(descs);
  struct {
    uint64_t out, in, init, descs;
  } prm = {o.ptr, in.ptr, ini.ptr, ds.ptr};
  const fa_status st = run_ptx(ptx, "k_mma", geom(ctas, 128, image), &prm, sizeof prm);
  if (st != FA_SUCCESS) {
    std::fprintf(stderr, "%s: launch failed: %s\n", what, fa::last_error());
    return false;
  }
  *out = o.get<uint32_t>();
  return true;
}

// D element (row, col) = init (when enable) + sum over k < kt of sa A(row,
// k) sb B(col, k) (av, bv: [mn][k] bits of types at, bt), in fp64: whether
// got is within 1e-5 of the terms' magnitude; *ref the reference.
inline bool umma_near(double got, double init, bool enable, const uint32_t *arow,
                      const uint32_t *bcol, uint32_t kt, UmmaType at, UmmaType bt, double sa,
                      double sb, double *ref) {
  double r = enable ? init : 0.0, mag = std::fabs(r);
  for (uint32_t k = 0; k < kt; ++k) {
    const double p = sa * value_of(at, arow[k]) * sb * value_of(bt, bcol[k]);
    r += p;
    mag += std::fabs(p);
  }
  *ref = r;
  return std::fabs(got - r) <= 1e-5 * mag + 1e-30;
}

// ---- Builder kernels (the builder-forms tests)

// Each thread writes row tid of A (128 x 16 f16, K-major, no swizzle: core
// matrices 8 rows x 16 bytes, LBO 128 along K, SBO 256 along M) = tid + k /
// 16 at shared sa (a b32 address) and, tid < 16, row tid of B (16 x 16, the
// same layout) = bval (an f16 in a b16) 4096 bytes further. Returns A's
// row as f32 registers (exact in f16).
inline std::vector<fa::ptx::Reg> umma_builder_ab(fa::ptx::Builder &b, fa::ptx::Reg tid,
                                                 fa::ptx::Reg sa, fa::ptx::Reg bval) {
  using namespace fa::ptx;
  const Reg r8 = b.b32(), rm = b.b32(), row = b.b32(), fr0 = b.f32();
  const Reg pb = b.pred();
  b.op(Op::Shr, Type::U32, r8, tid, imm(3));
  b.op(Op::And, Type::B32, rm, tid, imm(7));
  b.op(Op::Shl, Type::B32, r8, r8, imm(8));
  b.op(Op::Shl, Type::B32, rm, rm, imm(4));
  b.op(Op::Add, Type::U32, row, r8, rm);
  b.op(Op::Add, Type::U32, row, row, sa);
  b.cvt(Type::F32, Type::U32, Round::Rn, fr0, tid);
  b.setp(Cmp::Ge, Type::U32, pb, tid, imm(16));
  std::vector<Reg> av(16);
  for (size_t k = 0; k < 16; ++k) {
    const int koff = static_cast<int>((k / 8) * 128 + (k % 8) * 2);
    const Reg h = b.b16();
    av[k] = b.f32();
    b.op(Op::Add, Type::F32, av[k], fr0, fimm(static_cast<float>(k) / 16.0f));
    b.cvt(Type::F16, Type::F32, Round::Rn, h, av[k]);
    b.st(Space::Shared, Type::B16, at(row, koff), h);
    b.unless(pb).st(Space::Shared, Type::B16, at(row, 4096 + koff), bval);
  }
  return av;
}

// The descriptors of umma_builder_ab's A and B at shared sa (b32).
inline void umma_builder_descs(fa::ptx::Builder &b, fa::ptx::Reg sa, fa::ptx::Reg da,
                               fa::ptx::Reg db) {
  using namespace fa::ptx;
  const Reg s64 = b.b64();
  b.cvt(Type::U64, Type::U32, Round::None, s64, sa);
  b.op(Op::Shr, Type::U64, s64, s64, imm(4));
  b.op(Op::Add, Type::U64, da, s64, imm(static_cast<int64_t>(UmmaSmemDesc{0, 128, 256}.bits())));
  b.op(Op::Add, Type::U64, db, s64, imm(static_cast<int64_t>(UmmaSmemDesc{4096, 128, 256}.bits())));
}

// Loads 8 columns of the warp's lanes at taddr into v and sets bad = code
// where one differs from want (b32 bits).
inline void umma_builder_check8(fa::ptx::Builder &b, fa::ptx::Reg taddr,
                                const std::vector<fa::ptx::Reg> &v, fa::ptx::Reg want,
                                fa::ptx::Reg bad, int code) {
  using namespace fa::ptx;
  const Reg pb = b.pred();
  b.tcgen05_ld_32x32b(v.data(), 8, taddr);
  b.tcgen05_wait_ld();
  for (const Reg &x : v) {
    b.setp(Cmp::Ne, Type::U32, pb, x, want);
    b.selp(Type::U32, bad, imm(code), bad, pb);
  }
}

// The module text assembled by ptxas -arch=sm_100a and sm_103a (PTX ISA
// 8.6 / 8.8; skipped without a CUDA toolkit); then the sm_100a text.
inline std::string umma_builder_emit(const fa::ptx::Builder &b) {
  for (int sm : {100, 103}) {
    const std::string text = b.emit(sm == 103 ? 88 : 86, sm, 128);
    const std::string arch = "sm_" + std::to_string(sm) + "a";
    if (ptxas_accepts(text, arch.c_str()) == 0) {
      std::fprintf(stderr, "ptxas -arch=%s rejects:\n%s", arch.c_str(), text.c_str());
      fail();
    }
  }
  return b.emit(86, 100, 128);
}

// Runs the builder kernel (one u32 per thread of `ctas` CTAs into a
// buffer, 0 when the thread found its D right) and checks every word is 0.
inline void umma_builder_run(const std::string &ptx, const char *entry, uint32_t ctas) {
  DevBuf res(ctas * 128 * 4);
  uint64_t p = res.ptr;
  const fa_status st = run_ptx(ptx, entry, geom(ctas, 128), &p, sizeof p);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n%s", fa::last_error(), ptx.c_str());
  assert_int_equal(st, FA_SUCCESS);
  for (uint32_t x : res.get<uint32_t>()) assert_int_equal(x, 0);
}

}  // namespace fa::test
