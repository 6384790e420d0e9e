// Tests of the emulator's sm_90a (Hopper) instructions through the Backend
// interface, element by element against the PTX ISA's tables, on small
// hand-built kernels: wgmma.mma_async (A and B from shared-memory
// descriptors in every canonical layout, A from registers) against fp64,
// its asynchronous semantics (registers in flight, wait_group), mbarrier
// phases and tx-counts, cp.async.bulk.tensor boxes (zero fill, swizzles),
// named barriers, and a producer / consumer pipeline (TMA + mbarrier +
// wgmma, 3 warpgroups) built with the PTX builder. Misuse must be an error
// naming the PTX line, never a hang.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "emu/ptx_ir.h"
#include "emu/tensor_map.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

const char *kHopper = ".version 8.0\n.target sm_90a\n.address_size 64\n";


std::string at_line(const std::string &ptx, const char *marker) {
  return "at PTX line " + std::to_string(line_of(ptx, marker));
}

float bitsf(uint32_t u) { return fa::emu::bits_f32(u); }
uint32_t fbits(float f) { return fa::emu::f32_bits(f); }

uint16_t to_half(bool bf16, float v) {
  return bf16 ? fa::emu::f32_to_bf16_rn(v) : fa::emu::f32_to_f16_rn(v);
}
float from_half(bool bf16, uint16_t h) {
  return bf16 ? fa::emu::bf16_to_f32(h) : fa::emu::f16_to_f32(h);
}

fa_status run(const std::string &ptx, const char *entry, uint32_t threads, uint32_t smem,
              const void *params, size_t size) {
  fa_status st = run_ptx(ptx, entry, geom(1, threads, smem), params, size);
  return st;
}

void expect_ok(fa_status st) {
  if (st != FA_SUCCESS) std::fprintf(stderr, "unexpected failure: %s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
}

void expect_assembles(const std::string &ptx) {
  if (ptxas_accepts(ptx, "sm_90a") == 0) {
    std::fprintf(stderr, "ptxas rejects:\n%s", ptx.c_str());
    fail();
  }
}

// ============================================ wgmma: the ISA's layouts ====
// Written here from the PTX ISA ("Shared Memory Matrix Layout: Canonical
// Layouts", "Matrix Descriptor Format", "Register Fragments"),
// independently of the emulator: CuTe layouts evaluated coordinate by
// coordinate, then CuTe's Swizzle<B, 4, 3> on the byte address.

enum class Major { K, MN };

// A CuTe mode: shape and stride of up to three sub-modes (elements).
struct Mode {
  int n;
  int64_t shape[3], stride[3];
};

// Colexicographic evaluation of coordinate x in mode md.
int64_t eval_mode(const Mode &md, int64_t x) {
  int64_t off = 0;
  for (int i = 0; i < md.n; ++i) {
    const int64_t s = md.shape[i];
    const int64_t c = i + 1 < md.n ? x % s : x;
    off += c * md.stride[i];
    x /= s;
  }
  return off;
}

// CuTe Swizzle<B, M=4, S=3> of a byte address: bits [7, 7+B) XORed into
// bits [4, 4+B).
uint32_t cute_swizzle(uint32_t addr, int b) {
  const uint32_t yyy = ((1u << b) - 1) << 7;
  return addr ^ ((addr & yyy) >> 3);
}

// swizzle width in bytes (0 = none) -> descriptor mode (Matrix Descriptor
// Format: 0 none, 1 128B, 2 64B, 3 32B) and B of Swizzle<B,4,3>.
int desc_mode(int w) { return w == 128 ? 1 : w == 64 ? 2 : w == 32 ? 3 : 0; }
int swz_b(int w) { return w == 128 ? 3 : w == 64 ? 2 : w == 32 ? 1 : 0; }

// The canonical layout table, elements of esz bytes (T = 16 / esz: 8 for
// 16-bit, 16 for fp8), one instruction's view (K = 2T: "2k" = 2 column
// repeats K-major, k = 2 MN-major). lbo/sbo in bytes. Returns the byte
// address of element (mn, k) given the matrix start address.
uint32_t canonical_addr(Major major, int w, uint32_t start, int lbo, int sbo, int mn, int k,
                        int esz = 2) {
  const int64_t T = 16 / esz, L = lbo / esz, S = sbo / esz;
  Mode mnm, km;
  if (major == Major::K) {
    if (w == 0) {  // ((8,m),(T,2k)):((1T,SBO),(1,LBO))
      mnm = {2, {8, 1 << 20, 0}, {T, S, 0}};
      km = {2, {T, 2, 0}, {1, L, 0}};
    } else {  // ((8,m),(T,2k)):((W/16 T,SBO),(1,T))
      mnm = {2, {8, 1 << 20, 0}, {w / 16 * T, S, 0}};
      km = {2, {T, 2, 0}, {1, T, 0}};
    }
  } else {
    if (w == 0) {  // ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
      mnm = {3, {T, 1, 1 << 20}, {1, T, S}};
      km = {2, {8, 2, 0}, {T, L, 0}};
    } else {  // ((T,W/16,m),(8,k)):((1,T,LBO),(W/16 T,SBO))
      mnm = {3, {T, w / 16, 1 << 20}, {1, T, L}};
      km = {2, {8, 2, 0}, {w / 16 * T, S, 0}};
    }
  }
  const int64_t elems = eval_mode(mnm, mn) + eval_mode(km, k);
  const uint32_t a = start + static_cast<uint32_t>(esz * elems);
  return w ? cute_swizzle(a, swz_b(w)) : a;
}

uint64_t make_desc(uint32_t start, int lbo, int sbo, int w) {
  return (uint64_t{start >> 4} & 0x3fff) |
         ((uint64_t{static_cast<uint32_t>(lbo) >> 4} & 0x3fff) << 16) |
         ((uint64_t{static_cast<uint32_t>(sbo) >> 4} & 0x3fff) << 32) |
         (uint64_t{static_cast<uint32_t>(desc_mode(w))} << 62);
}

// One matrix operand in shared memory: its layout choice and, per k-block of
// 16, the descriptor an instruction gets.
struct SmemOperand {
  Major major = Major::K;
  int w = 0;  // swizzle bytes
  int lbo = 0, sbo = 0;
  std::vector<uint32_t> start;  // per k-block
  std::vector<uint64_t> desc;
  uint32_t bytes = 0;  // footprint from the tile's base
};

// A dense tile of rows (MN) x 16 nk (K) at `base` (1024-aligned), laid out
// with the canonical atoms; `alt` picks the other no-swizzle LBO/SBO choice.
SmemOperand plan_operand(Major major, int w, uint32_t base, int rows, int nk, bool alt) {
  SmemOperand o;
  o.major = major;
  o.w = w;
  for (int kb = 0; kb < nk; ++kb) {
    uint32_t start = base;
    if (major == Major::K && w == 0) {
      // Core matrices (8 rows x 16 bytes): alt = K chunks outermost.
      o.lbo = alt ? rows / 8 * 128 : 128;
      o.sbo = alt ? 128 : 2 * nk * 128;
      start = base + 2 * kb * o.lbo;
      o.bytes = static_cast<uint32_t>(rows * 32 * nk);
    } else if (major == Major::K) {
      // Rows of w bytes, 8-row atoms; w / 32 k-blocks side by side in a row.
      const int kpr = w / 32;
      o.lbo = 16;  // "not used, assumed to be 1" (encoded)
      o.sbo = 8 * w;
      start = base + (kb / kpr) * (rows / 8) * o.sbo + (kb % kpr) * 32;
      o.bytes = static_cast<uint32_t>((nk + kpr - 1) / kpr * (rows / 8) * o.sbo);
    } else if (w == 0) {
      // Core matrices of 8 k-rows x 8 MN elements.
      o.sbo = 128;
      o.lbo = rows / 8 * 128;
      start = base + 2 * kb * o.lbo;
      o.bytes = static_cast<uint32_t>(rows * 32 * nk);
    } else {
      // Atoms of 8 k-rows x w bytes (w / 2 MN elements), MN-groups first.
      const int groups = (rows + w / 2 - 1) / (w / 2);
      o.lbo = 8 * w;
      o.sbo = groups * 8 * w;
      start = base + 2 * kb * o.sbo;
      o.bytes = static_cast<uint32_t>(2 * nk * o.sbo);
    }
    o.start.push_back(start);
    o.desc.push_back(make_desc(start, o.lbo, o.sbo, w));
  }
  return o;
}

// Writes M[mn][k] (rows x kk nk, row-major by mn; kk = 32 / esz elements of
// esz bytes per k-block, an fp8 byte in the low byte of its uint16_t) into
// the image per the plan; every byte written once.
void place(std::vector<uint8_t> *img, const SmemOperand &o, const std::vector<uint16_t> &m,
           int rows, int nk, std::set<uint32_t> *used, int esz = 2) {
  const int kk = 32 / esz;
  for (int kb = 0; kb < nk; ++kb)
    for (int mn = 0; mn < rows; ++mn)
      for (int k = 0; k < kk; ++k) {
        const uint32_t a = canonical_addr(o.major, o.w, o.start[kb], o.lbo, o.sbo, mn, k, esz);
        assert_true(a + esz <= img->size());
        assert_true(used->insert(a).second);  // the plan is a bijection
        const uint16_t v = m[static_cast<size_t>(mn) * kk * nk + kk * kb + k];
        if (esz == 2)
          std::memcpy(img->data() + a, &v, 2);
        else
          (*img)[a] = static_cast<uint8_t>(v);
      }
}

// D fragment position of d[i] of thread t (m64nNk16, PTX ISA figure
// "WGMMA .m64nNk16 register fragment layout for accumulator matrix D").
void d_pos(int t, int i, int *row, int *col) {
  const int w = t / 32, lane = t % 32;
  *row = 16 * w + lane / 4 + 8 * ((i / 2) % 2);
  *col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
}
// A register fragment (figure "... layout for matrix A"): element e (0..7)
// of thread t, register e / 2, low half first.
void a_pos(int t, int e, int *row, int *col) {
  const int w = t / 32, lane = t % 32;
  *row = 16 * w + lane / 4 + 8 * ((e / 2) % 2);
  *col = 2 * (lane % 4) + e % 2 + 8 * (e / 4);
}

// fp8 A register fragment (m64nNk32, the mma.m16n8k32 A fragment per warp):
// byte i (0..15; register i / 4, lowest byte first) of thread t.
void a_pos_fp8(int t, int i, int *row, int *col) {
  const int w = t / 32, lane = t % 32;
  *row = 16 * w + lane / 4 + 8 * ((i >> 2) & 1);
  *col = 4 * (lane % 4) + (i & 3) + 16 * (i >> 3);
}

// fp8 bits -> value, written from the PTX ISA "Alternate Floating-Point Data
// Formats" (e4m3: bias 7, 3 mantissa bits, S.1111.111 NaN; e5m2: bias 15, 2
// mantissa bits, exponent 31 inf/NaN), independently of the emulator.
double fp8_value(uint8_t x, bool e5m2) {
  const int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int e = (x & 0x7f) >> mb, m = x & ((1 << mb) - 1);
  if (e5m2 && e == 31) return m ? NAN : (x & 0x80 ? -INFINITY : INFINITY);
  if (!e5m2 && e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(m, 1 - bias - mb) : std::ldexp((1 << mb) + m, e - bias - mb);
  return (x & 0x80) ? -v : v;
}
bool fp8_finite(uint8_t x, bool e5m2) { return e5m2 ? (x & 0x7c) != 0x7c : (x & 0x7f) != 0x7f; }
// The fp8 bits of an exactly representable value v (searched).
uint8_t fp8_of(double v, bool e5m2) {
  for (int x = 0; x < 256; ++x)
    if (fp8_value(static_cast<uint8_t>(x), e5m2) == v && !(v == 0 && x))
      return static_cast<uint8_t>(x);
  fail_msg("%g is not an %s value", v, e5m2 ? "e5m2" : "e4m3");
  return 0;
}

struct WgCase {
  int n = 64;
  bool bf16 = false;
  bool fp8 = false;  // m64nNk32 .e4m3/.e5m2 (K-major only)
  bool a_e5m2 = false, b_e5m2 = false;
  bool rs = false;  // A from registers
  Major a_major = Major::K, b_major = Major::K;
  int wa = 128, wb = 128;  // swizzle bytes
  bool alt = false;        // the other no-swizzle LBO/SBO choice
  int nk = 1;              // k-blocks of K (16, fp8 32: wgmmas chained on D)
  int scale_d = 1;         // first wgmma: 0, 1 (immediates) or 2 (a true predicate)
  bool neg_a = false, neg_b = false;
  int esz() const { return fp8 ? 1 : 2; }   // element bytes
  int kk() const { return fp8 ? 32 : 16; }  // K per instruction
  // The PTX types: "f16.f16", "e4m3.e5m2", ...
  std::string types() const {
    if (!fp8) return bf16 ? "bf16.bf16" : "f16.f16";
    return std::string(a_e5m2 ? "e5m2" : "e4m3") + (b_e5m2 ? ".e5m2" : ".e4m3");
  }
  std::string name() const {
    char b[160];
    std::snprintf(b, sizeof b,
                  "m64n%dk%d %s %s A %s-major/%dB B %s-major/%dB%s nk %d scale-d %d%s%s", n, kk(),
                  types().c_str(), rs ? "rs" : "ss", a_major == Major::K ? "K" : "M", wa,
                  b_major == Major::K ? "K" : "N", wb, alt ? " alt" : "", nk, scale_d,
                  neg_a ? " -A" : "", neg_b ? " -B" : "");
    return b;
  }
  // Value of an A (is_a) or B element's bits.
  double value(bool is_a, uint16_t x) const {
    if (fp8) return fp8_value(static_cast<uint8_t>(x), is_a ? a_e5m2 : b_e5m2);
    return from_half(bf16, x);
  }
};

struct WgParams {
  uint64_t img, afrag, c, out;
  uint64_t desc_a[4], desc_b[4];
  uint32_t img_words, scale;
};

// One warpgroup: copies the image into shared memory, loads C (and A
// fragments), runs nk chained wgmmas, one commit, wait_group 0, stores D.
std::string wgmma_kernel(const WgCase &c) {
  const int nd = c.n / 2;
  std::string p = std::string(kHopper) + ".extern .shared .align 1024 .b8 smem[];\n" +
                  ".visible .entry k_wg(.param .align 8 .b8 k_wg_param[" +
                  std::to_string(sizeof(WgParams)) + "])\n.maxntid 128, 1, 1\n{\n";
  p += "  .reg .pred %p<4>;\n  .reg .b32 %r<32>;\n  .reg .b64 %rd<40>;\n  .reg .f32 %acc<" +
       std::to_string(nd) + ">;\n  .reg .b32 %fa<16>;\n";
  p += "  ld.param.u64 %rd1, [k_wg_param+0];\n  ld.param.u64 %rd2, [k_wg_param+8];\n"
       "  ld.param.u64 %rd3, [k_wg_param+16];\n  ld.param.u64 %rd4, [k_wg_param+24];\n";
  for (int kb = 0; kb < c.nk; ++kb) {
    p += "  ld.param.u64 %rd" + std::to_string(10 + kb) + ", [k_wg_param+" +
         std::to_string(offsetof(WgParams, desc_a) + 8 * kb) + "];\n";
    p += "  ld.param.u64 %rd" + std::to_string(20 + kb) + ", [k_wg_param+" +
         std::to_string(offsetof(WgParams, desc_b) + 8 * kb) + "];\n";
  }
  p += "  ld.param.u32 %r3, [k_wg_param+" + std::to_string(offsetof(WgParams, img_words)) +
       "];\n  ld.param.u32 %r4, [k_wg_param+" + std::to_string(offsetof(WgParams, scale)) +
       "];\n  setp.ne.u32 %p2, %r4, 0;\n";
  p += R"(  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %r1;
  mov.u32 %r9, smem;
$L_copy:
  setp.ge.u32 %p1, %r2, %r3;
  @%p1 bra $L_copied;
  mul.wide.u32 %rd30, %r2, 16;
  add.s64 %rd31, %rd1, %rd30;
  ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd31];
  mad.lo.u32 %r10, %r2, 16, %r9;
  st.shared.v4.u32 [%r10], {%r5, %r6, %r7, %r8};
  add.u32 %r2, %r2, 128;
  bra $L_copy;
$L_copied:
  bar.sync 0;
  fence.proxy.async.shared::cta;
)";
  p +=
      "  mul.wide.u32 %rd32, %r1, " + std::to_string(nd * 4) + ";\n  add.s64 %rd33, %rd3, %rd32;\n";
  for (int i = 0; i < nd; ++i)
    p += "  ld.global.f32 %acc" + std::to_string(i) + ", [%rd33+" + std::to_string(4 * i) + "];\n";
  if (c.rs) {
    p += "  mul.wide.u32 %rd34, %r1, " + std::to_string(16 * c.nk) +
         ";\n  add.s64 %rd35, %rd2, %rd34;\n";
    for (int i = 0; i < 4 * c.nk; ++i)
      p += "  ld.global.u32 %fa" + std::to_string(i) + ", [%rd35+" + std::to_string(4 * i) + "];\n";
  }
  std::string dv = "{";
  for (int i = 0; i < nd; ++i) dv += (i ? ", %acc" : "%acc") + std::to_string(i);
  dv += "}";
  p += "  wgmma.fence.sync.aligned;\n";
  const std::string sa = c.neg_a ? "-1" : "1", sb = c.neg_b ? "-1" : "1";
  for (int kb = 0; kb < c.nk; ++kb) {
    std::string scale = kb > 0 ? "1" : c.scale_d == 2 ? "%p2" : std::to_string(c.scale_d);
    p += "  wgmma.mma_async.sync.aligned.m64n" + std::to_string(c.n) + "k" +
         std::to_string(c.kk()) + ".f32." + c.types() + " " + dv + ", ";
    // fp8: no imm-trans operands (K-major only).
    const std::string ta = c.fp8 ? "" : c.a_major == Major::MN ? ", 1" : ", 0";
    const std::string tb = c.fp8 ? "" : c.b_major == Major::MN ? ", 1" : ", 0";
    if (c.rs) {
      p += "{%fa" + std::to_string(4 * kb) + ", %fa" + std::to_string(4 * kb + 1) + ", %fa" +
           std::to_string(4 * kb + 2) + ", %fa" + std::to_string(4 * kb + 3) + "}, %rd" +
           std::to_string(20 + kb) + ", " + scale + ", " + sa + ", " + sb + tb + ";\n";
    } else {
      p += "%rd" + std::to_string(10 + kb) + ", %rd" + std::to_string(20 + kb) + ", " + scale +
           ", " + sa + ", " + sb + ta + tb + ";\n";
    }
  }
  p += "  wgmma.commit_group.sync.aligned;\n  wgmma.wait_group.sync.aligned 0;\n";
  p += "  add.s64 %rd36, %rd4, %rd32;\n";
  for (int i = 0; i < nd; ++i)
    p += "  st.global.f32 [%rd36+" + std::to_string(4 * i) + "], %acc" + std::to_string(i) + ";\n";
  p += "}\n";
  return p;
}

// Runs one case with A (64 x K), B (K x N), C (64 x N), K = kk nk (fp8:
// the byte in each element's low byte); returns D.
// `edit` rewrites the kernel first; a launch expected to fail (`want`)
// returns no D (`ptx_out`: the kernel run).
std::vector<float> run_wgmma(const WgCase &c, const std::vector<uint16_t> &A,
                             const std::vector<uint16_t> &B, const std::vector<float> &C,
                             const std::function<std::string(const std::string &)> &edit = nullptr,
                             fa_status want = FA_SUCCESS, std::string *ptx_out = nullptr) {
  const int n = c.n, nd = n / 2, K = c.kk() * c.nk;
  // B as an N x K operand (row mn = column of B).
  std::vector<uint16_t> bt(static_cast<size_t>(n) * K);
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < n; ++j)
      bt[static_cast<size_t>(j) * K + k] = B[static_cast<size_t>(k) * n + j];
  const uint32_t a_base = 1024;  // keep 0..1023 unused: catches stray offsets
  SmemOperand oa;
  if (!c.rs) oa = plan_operand(c.a_major, c.wa, a_base, 64, c.nk, c.alt);
  const uint32_t b_base = c.rs ? a_base : a_base + (oa.bytes + 1023) / 1024 * 1024;
  SmemOperand ob = plan_operand(c.b_major, c.wb, b_base, n, c.nk, c.alt);
  const uint32_t img_bytes = (b_base + ob.bytes + 1023) / 1024 * 1024;
  std::vector<uint8_t> img(img_bytes, 0xEE);
  std::set<uint32_t> used;
  if (!c.rs) place(&img, oa, A, 64, c.nk, &used, c.esz());
  place(&img, ob, bt, n, c.nk, &used, c.esz());
  // A fragments per thread (rs): 4 registers per k-block (8 halves or 16
  // fp8 bytes).
  std::vector<uint32_t> afrag(128 * 4 * c.nk, 0);
  for (int t = 0; t < 128; ++t)
    for (int kb = 0; kb < c.nk; ++kb)
      for (int e = 0; e < 16 / c.esz(); ++e) {
        int row, col;
        if (c.fp8)
          a_pos_fp8(t, e, &row, &col);
        else
          a_pos(t, e, &row, &col);
        const uint32_t v = A[static_cast<size_t>(row) * K + c.kk() * kb + col];
        afrag[(t * c.nk + kb) * 4 + e * c.esz() / 4] |= v << (8 * c.esz() * (e % (4 / c.esz())));
      }
  std::vector<float> cfrag(128 * nd);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < nd; ++i) {
      int row, col;
      d_pos(t, i, &row, &col);
      cfrag[t * nd + i] = C[static_cast<size_t>(row) * n + col];
    }
  DevBuf dimg(img.size()), da(afrag.size() * 4), dc(cfrag.size() * 4), dout(cfrag.size() * 4);
  dimg.put(img);
  da.put(afrag);
  dc.put(cfrag);
  WgParams prm{};
  prm.img = dimg.ptr;
  prm.afrag = da.ptr;
  prm.c = dc.ptr;
  prm.out = dout.ptr;
  for (int kb = 0; kb < c.nk; ++kb) {
    prm.desc_a[kb] = c.rs ? 0 : oa.desc[kb];
    prm.desc_b[kb] = ob.desc[kb];
  }
  prm.img_words = img_bytes / 16;
  prm.scale = 1;
  const std::string ptx = edit ? edit(wgmma_kernel(c)) : wgmma_kernel(c);
  if (ptx_out) *ptx_out = ptx;
  fa_status st = run(ptx, "k_wg", 128, img_bytes, &prm, sizeof prm);
  if (st != want) std::fprintf(stderr, "%s: %s\n", c.name().c_str(), fa::last_error());
  assert_int_equal(st, want);
  if (want != FA_SUCCESS) return {};
  std::vector<uint32_t> words = dout.get<uint32_t>();
  std::vector<float> D(static_cast<size_t>(64) * n, NAN);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < nd; ++i) {
      assert_int_not_equal(words[t * nd + i], 0xABABABABu);
      int row, col;
      d_pos(t, i, &row, &col);
      D[static_cast<size_t>(row) * n + col] = bitsf(words[t * nd + i]);
    }
  return D;
}

// Checks a case: values k/4 with small k make every product and sum exact,
// so D must equal the fp64 reference exactly (any layout slip shows); then
// random reals: within the f32 bound of fp64, and bit-equal to the
// sequential f32 chain (k = 0, 1, ...) that mma.sync uses.
void check_wgmma(const WgCase &c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int n = c.n, K = c.kk() * c.nk;
  if (c.fp8) expect_assembles(wgmma_kernel(c));
  for (int pass = 0; pass < 2; ++pass) {
    std::uniform_int_distribution<int> small(-8, 8), byte(0, 255);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<uint16_t> A(64 * K), B(static_cast<size_t>(K) * n);
    std::vector<float> C(64 * n);
    // fp8: k/4 exactly (pass 0), then random bytes but NaN / inf (pass 1).
    auto gen = [&](bool e5m2) -> uint16_t {
      if (!c.fp8) return to_half(c.bf16, pass == 0 ? small(rng) / 4.0f : u(rng));
      if (pass == 0) return fp8_of(small(rng) / 4.0, e5m2);
      for (;;) {
        const uint8_t x = static_cast<uint8_t>(byte(rng));
        if (fp8_finite(x, e5m2)) return x;
      }
    };
    for (auto &x : A) x = gen(c.a_e5m2);
    for (auto &x : B) x = gen(c.b_e5m2);
    for (auto &x : C) x = pass == 0 ? small(rng) : u(rng) * 8;
    const std::vector<float> D = run_wgmma(c, A, B, C);
    const double sa = c.neg_a ? -1 : 1, sb = c.neg_b ? -1 : 1;
    const bool acc = c.scale_d != 0;
    for (int m = 0; m < 64; ++m)
      for (int j = 0; j < n; ++j) {
        double ref = acc ? C[m * n + j] : 0.0, mag = std::fabs(ref);
        float seq = acc ? C[m * n + j] : 0.0f;
        for (int k = 0; k < K; ++k) {
          const double pr = sa * c.value(true, A[m * K + k]) * sb *
                            c.value(false, B[static_cast<size_t>(k) * n + j]);
          ref += pr;
          mag += std::fabs(pr);
          seq = seq + static_cast<float>(pr);
        }
        const float got = D[m * n + j];
        const double tol = pass == 0 ? 0.0 : K * std::ldexp(1.0, -24) * mag + 1e-30;
        if (!(std::fabs(got - ref) <= tol) || (pass == 1 && fbits(got) != fbits(seq))) {
          std::fprintf(stderr,
                       "%s pass %d: D[%d][%d] = %.9g, fp64 %.9g (tol %.3g), f32 chain %.9g\n",
                       c.name().c_str(), pass, m, j, got, ref, tol, seq);
          fail();
        }
      }
  }
}

// 1. wgmma ss for N in {8, 64, 128, 256}, f16 and bf16, K-major A and B with
// 128B swizzle and without swizzle, B N-major (trans-b) with 128B swizzle.
void test_wgmma_ss(void **) {
  uint32_t seed = 1;
  for (int n : {8, 64, 80, 112, 128, 256})
    for (bool bf : {false, true}) {
      WgCase c;
      c.n = n;
      c.bf16 = bf;
      for (int w : {128, 0}) {
        c.wa = c.wb = w;
        c.b_major = Major::K;
        check_wgmma(c, seed++);
      }
      c.wa = 128;
      c.wb = 128;
      c.b_major = Major::MN;
      check_wgmma(c, seed++);
    }
}

// Every swizzle mode with both majors for A and B, k-blocks chained on the
// accumulators (descriptors advanced inside the swizzle atom), the other
// no-swizzle LBO/SBO choice, scale-d 0 and as a predicate, negated inputs.
void test_wgmma_layouts(void **) {
  uint32_t seed = 100;
  for (Major am : {Major::K, Major::MN})
    for (Major bm : {Major::K, Major::MN})
      for (int w : {0, 32, 64, 128}) {
        WgCase c;
        c.n = 32;
        c.a_major = am;
        c.b_major = bm;
        c.wa = c.wb = w;
        c.nk = 4;
        c.bf16 = (seed & 1) != 0;
        check_wgmma(c, seed++);
      }
  WgCase c;
  c.n = 16;
  c.wa = c.wb = 0;
  c.alt = true;
  c.nk = 2;
  check_wgmma(c, seed++);
  c.b_major = Major::MN;
  check_wgmma(c, seed++);
  c = WgCase();
  c.n = 48;
  c.scale_d = 0;
  check_wgmma(c, seed++);
  c.scale_d = 2;
  c.neg_a = true;
  check_wgmma(c, seed++);
  c.neg_a = false;
  c.neg_b = true;
  c.wa = 64;
  c.wb = 32;
  check_wgmma(c, seed++);
}

// 2. wgmma rs: A from registers in the m64nNk16 A fragment layout.
void test_wgmma_rs(void **) {
  uint32_t seed = 300;
  for (int n : {8, 64, 256})
    for (bool bf : {false, true}) {
      WgCase c;
      c.rs = true;
      c.n = n;
      c.bf16 = bf;
      c.nk = 2;
      c.b_major = n == 64 ? Major::MN : Major::K;
      check_wgmma(c, seed++);
    }
  WgCase c;
  c.rs = true;
  c.n = 24;
  c.scale_d = 0;
  c.neg_a = true;
  c.wb = 0;
  check_wgmma(c, seed++);
}

// 3. fp8 (m64nNk32 .e4m3/.e5m2, K-major only) ss: every N of the brief's
// list with all four type pairs, 128B swizzle and no swizzle; each kernel
// also assembles with ptxas.
void test_wgmma_fp8_ss(void **) {
  uint32_t seed = 500;
  for (int n : {8, 32, 64, 128, 256})
    for (int ty = 0; ty < 4; ++ty) {
      WgCase c;
      c.fp8 = true;
      c.n = n;
      c.a_e5m2 = (ty & 1) != 0;
      c.b_e5m2 = (ty & 2) != 0;
      check_wgmma(c, seed++);
      if (ty == 1 || ty == 2) {
        c.wa = c.wb = 0;
        check_wgmma(c, seed++);
      }
    }
}

// fp8 in every swizzle mode, 4 k-blocks chained (descriptors advanced by
// 32 bytes inside the swizzle atom), the other no-swizzle LBO/SBO choice,
// mixed swizzles, scale-d 0 and as a predicate, negated A and B.
void test_wgmma_fp8_layouts(void **) {
  uint32_t seed = 600;
  for (int w : {0, 32, 64, 128}) {
    WgCase c;
    c.fp8 = true;
    c.n = 32;
    c.wa = c.wb = w;
    c.nk = 4;
    c.a_e5m2 = (seed & 1) != 0;
    c.b_e5m2 = (seed & 2) != 0;
    check_wgmma(c, seed++);
  }
  WgCase c;
  c.fp8 = true;
  c.n = 16;
  c.wa = c.wb = 0;
  c.alt = true;
  c.nk = 2;
  check_wgmma(c, seed++);
  c = WgCase();
  c.fp8 = true;
  c.n = 48;
  c.scale_d = 0;
  check_wgmma(c, seed++);
  c.scale_d = 2;
  c.neg_a = true;
  c.a_e5m2 = true;
  check_wgmma(c, seed++);
  c.neg_a = false;
  c.neg_b = true;
  c.wa = 64;
  c.wb = 32;
  c.nk = 2;
  check_wgmma(c, seed++);
  c.neg_a = true;
  c.b_e5m2 = true;
  check_wgmma(c, seed++);
}

// fp8 rs: A from four registers of four bytes (the mma.m16n8k32 A fragment
// per warp).
void test_wgmma_fp8_rs(void **) {
  uint32_t seed = 700;
  for (int n : {8, 32, 64, 128, 256})
    for (int ty = 0; ty < 4; ++ty) {
      if (n >= 128 && ty % 3) continue;
      WgCase c;
      c.fp8 = true;
      c.rs = true;
      c.n = n;
      c.nk = 2;
      c.a_e5m2 = (ty & 1) != 0;
      c.b_e5m2 = (ty & 2) != 0;
      check_wgmma(c, seed++);
    }
  WgCase c;
  c.fp8 = true;
  c.rs = true;
  c.n = 24;
  c.scale_d = 0;
  c.neg_a = true;
  c.wb = 0;
  check_wgmma(c, seed++);
  c.scale_d = 2;
  c.neg_a = false;
  c.neg_b = true;
  c.wb = 32;
  c.nk = 3;
  check_wgmma(c, seed++);
}

// The fp8 A fragment, byte by byte: B = the 32 x 32 identity, so D = A.
// For each byte i (0..15), every thread holds a distinct nonzero code in
// byte i of its fragment and zeros elsewhere; D must be those codes at the
// ISA's (row, column) of (thread, i) and zero everywhere else. The same A
// from shared memory (ss) checks the descriptor path the same way.
void test_wgmma_fp8_fragment(void **) {
  auto code = [](int t) { return static_cast<uint8_t>(t < 126 ? t + 1 : 0x80 | (t - 125)); };
  for (bool rs : {true, false})
    for (int i = 0; i < 16; ++i) {
      WgCase c;
      c.fp8 = true;
      c.rs = rs;
      c.n = 32;
      c.scale_d = 0;
      std::vector<uint16_t> A(64 * 32, 0), B(32 * 32, 0);
      for (int k = 0; k < 32; ++k) B[k * 32 + k] = 0x38;  // e4m3 1.0
      std::vector<int> owner(64 * 32, -1);
      for (int t = 0; t < 128; ++t) {
        int row, col;
        a_pos_fp8(t, i, &row, &col);
        A[row * 32 + col] = code(t);
        owner[row * 32 + col] = t;
      }
      const std::vector<float> D = run_wgmma(c, A, B, std::vector<float>(64 * 32, 0.0f));
      for (int m = 0; m < 64; ++m)
        for (int j = 0; j < 32; ++j) {
          const double want = owner[m * 32 + j] < 0 ? 0.0 : fp8_value(A[m * 32 + j], false);
          if (D[m * 32 + j] != want) {
            std::fprintf(stderr, "%s byte %d: D[%d][%d] = %g, want %g (thread %d)\n",
                         rs ? "rs" : "ss", i, m, j, D[m * 32 + j], want, owner[m * 32 + j]);
            fail();
          }
        }
    }
}

// fp8 forms under the checks of the 16-bit ones: unfenced generic writes,
// descriptors that differ across the warpgroup, operands outside shared
// memory, A registers of an in-flight wgmma (rs), an accumulator shared
// with an in-flight wgmma of another shape; and the profile's bytes (1 per
// element).
void test_wgmma_fp8_checks(void **) {
  WgCase c;
  c.fp8 = true;
  c.n = 16;
  c.wa = c.wb = 0;
  c.a_e5m2 = true;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<uint16_t> A(64 * 32), B(32 * 16);
  std::vector<float> C(64 * 16, 0.0f);
  for (auto &x : A) x = fp8_of(small(rng) / 4.0, true);
  for (auto &x : B) x = fp8_of(small(rng) / 4.0, false);
  auto edit = [](const char *find, const std::string &with, bool after = false) {
    return [=](const std::string &p) {
      std::string q = p;
      const size_t at = q.find(find);
      assert_true(at != std::string::npos);
      q.insert(after ? q.find('\n', at) + 1 : at, with);
      return q;
    };
  };
  std::string ptx;
  // No fence.proxy.async after the shared stores.
  run_wgmma(
      c, A, B, C,
      [](const std::string &p) {
        std::string q = p;
        const char *fence = "  fence.proxy.async.shared::cta;\n";
        q.replace(q.find(fence), std::strlen(fence), "");
        return q;
      },
      FA_ERROR_LAUNCH, &ptx);
  expect_error("wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e4m3 " +
               at_line(ptx, "wgmma.mma_async"));
  expect_error("its generic-proxy write by st.shared.v4.u32 " + at_line(ptx, "st.shared.v4"));
  // A descriptor that depends on the thread.
  run_wgmma(c, A, B, C,
            edit("  wgmma.fence", "  cvt.u64.u32 %rd37, %r1;\n  add.s64 %rd20, %rd20, %rd37;\n"),
            FA_ERROR_LAUNCH, &ptx);
  expect_error(at_line(ptx, "wgmma.mma_async") +
               ": the matrix descriptors differ across the warpgroup");
  // B's start 64 KiB further: outside the block's shared memory.
  run_wgmma(c, A, B, C, edit("  wgmma.fence", "  add.s64 %rd20, %rd20, 4096;\n"), FA_ERROR_LAUNCH,
            &ptx);
  expect_error(at_line(ptx, "wgmma.mma_async") + ": B element (0, 0) at shared 0x");
  expect_error("lies outside the block's");
  // rs: an A register written while the wgmma is in flight.
  WgCase r = c;
  r.rs = true;
  run_wgmma(r, A, B, C, edit("  wgmma.commit_group", "  mov.b32 %fa2, 0; // clobber\n"),
            FA_ERROR_LAUNCH, &ptx);
  expect_error("mov.b32 " + at_line(ptx, "// clobber") + ": register %fa2");
  expect_error("belongs to the wgmma.mma_async " + at_line(ptx, "wgmma.mma_async"));
  // The same accumulators by an in-flight m64n16k16 f16 wgmma: another shape.
  run_wgmma(r, A, B, C,
            edit("wgmma.mma_async",
                 "  wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%acc0, %acc1, %acc2, "
                 "%acc3, %acc4, %acc5, %acc6, %acc7}, {%fa0, %fa1, %fa2, %fa3}, %rd20, 1, 1, 1, "
                 "0; // other\n",
                 true),
            FA_ERROR_LAUNCH, &ptx);
  expect_error(at_line(ptx, "// other") + ": register %acc0 is an accumulator of the wgmma");
  // Profile: m64n16k32 from dense no-swizzle tiles: A 2048 + B 512 bytes
  // (one per element), 16 + 4 lines of 128 bytes.
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  run_wgmma(c, A, B, C);
  fa::emu::LaunchProfile prof;
  assert_int_equal(g_be->last_profile(&prof), FA_SUCCESS);
  assert_int_equal(prof.total.wgmma_requests, 1);
  assert_int_equal(prof.total.wgmma_shared_bytes, 2048 + 512);
  assert_int_equal(prof.total.wgmma_shared_wavefronts, 16 + 4);
  unsetenv("FLASHATTN_EMU_PROFILE");
}

// The parser takes exactly the fp8 forms ptxas takes: m64nNk32 only, no
// imm-trans operands, imm-scale +-1; each rejection names what is
// supported, and ptxas rejects the same text.
void test_wgmma_fp8_parse(void **) {
  const std::string d8 = "{%f0, %f1, %f2, %f3}";
  const char *shapes =
      "only wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} "
      "and .m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} are supported";
  const char *trans = "fp8 wgmma has no imm-trans operands (K-major only)";
  std::string d32 = "{%f0";
  for (int i = 1; i < 32; ++i) d32 += ", %f" + std::to_string(i);
  d32 += "}";
  struct Bad {
    std::string text;
    const char *msg;
  } bad[] = {
      {"wgmma.mma_async.sync.aligned.m64n64k16.f32.e4m3.e4m3 " + d32 + ", %rd1, %rd2, 1, 1, 1;",
       shapes},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.f16.f16 " + d8 + ", %rd1, %rd2, 1, 1, 1, 0, 0;",
       shapes},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.f16.f16 " + d8 + ", %rd1, %rd2, 1, 1, 1;",
       shapes},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.f16 " + d8 + ", %rd1, %rd2, 1, 1, 1;",
       shapes},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e5m2 " + d8 + ", %rd1, %rd2, 1, 1, 1, 0, 0;",
       trans},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e5m2 " + d8 +
           ", {%r0, %r1, %r2, %r3}, %rd2, 1, 1, 1, 0;",
       trans},
      {"wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2 " + d8 + ", %rd1, %rd2, 1, 2, 1;",
       "imm-scale-a must be 1 or -1"},
  };
  auto kernel = [](const std::string &body) {
    return std::string(kHopper) +
           ".visible .entry k_bad()\n{\n  .reg .pred %p<4>;\n  .reg .b32 %r<4>;\n"
           "  .reg .f32 %f<32>;\n  .reg .b64 %rd<4>;\n  mov.b64 %rd1, 0;\n  mov.b64 %rd2, 0;\n" +
           "  mov.b32 %r0, 0;\n  mov.b32 %r1, 0;\n  mov.b32 %r2, 0;\n  mov.b32 %r3, 0;\n" +
           "  wgmma.fence.sync.aligned;\n  " + body +
           "\n  wgmma.commit_group.sync.aligned;\n  wgmma.wait_group.sync.aligned 0;\n}\n";
  };
  for (const Bad &b : bad) {
    const std::string p = kernel(b.text);
    fa_status st = run(p, "k_bad", 128, 0, nullptr, 0);
    if (st != FA_ERROR_COMPILE) std::fprintf(stderr, "accepted: %s\n", b.text.c_str());
    assert_int_equal(st, FA_ERROR_COMPILE);
    expect_error("line " + std::to_string(line_of(p, "mma_async")) + ": ");
    expect_error(b.msg);
    assert_int_not_equal(ptxas_accepts(p, "sm_90a"), 1);
  }
  // And the forms ptxas takes parse (here: not run; the operands are zero).
  for (const std::string &ok :
       {"wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e5m2 " + d8 + ", %rd1, %rd2, 1, -1, -1;",
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e4m3 " + d8 +
            ", {%r0, %r1, %r2, %r3}, %rd2, %p1, 1, -1;"}) {
    const std::string p = kernel(ok);
    assert_int_not_equal(ptxas_accepts(p, "sm_90a"), 0);
    std::string err;
    const bool parsed = fa::emu::parse_module(p, &err) != nullptr;
    if (!parsed) std::fprintf(stderr, "%s\n", err.c_str());
    assert_true(parsed);
  }
}

// The markers test: A one-hot in k (A[m][k0] = m + 1), B[k][j] = 32 k + j + 1:
// D[m][j] = (m + 1)(32 k0 + j + 1) names the (row, k, col) every element came
// from, for every k0.
void test_wgmma_markers(void **) {
  WgCase c;
  c.n = 32;
  c.bf16 = false;
  for (Major bm : {Major::K, Major::MN}) {
    c.b_major = bm;
    c.scale_d = 0;
    for (int k0 = 0; k0 < 16; ++k0) {
      std::vector<uint16_t> A(64 * 16), B(16 * 32);
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) A[m * 16 + k] = to_half(false, k == k0 ? m + 1.0f : 0.0f);
      for (int k = 0; k < 16; ++k)
        for (int j = 0; j < 32; ++j) B[k * 32 + j] = to_half(false, 32.0f * k + j + 1);
      std::vector<float> D = run_wgmma(c, A, B, std::vector<float>(64 * 32, 0.0f));
      for (int m = 0; m < 64; ++m)
        for (int j = 0; j < 32; ++j) {
          const float want = (m + 1.0f) * (32.0f * k0 + j + 1);
          if (D[m * 32 + j] != want) {
            std::fprintf(stderr, "k0 %d: D[%d][%d] = %g, want %g\n", k0, m, j, D[m * 32 + j], want);
            fail();
          }
        }
    }
  }
}

// ================================================= wgmma: async rules ====

// A small kernel: 128 threads, fills a 64x16 K-major (no swizzle) A and a
// 16x8 B with ones in shared memory, then runs `body` (wgmma text; %rdA /
// %rdB hold descriptors, %acc0..3 and %acq0..3 are two m64n8 accumulators).
std::string async_kernel(const std::string &body) {
  // A at 0: core matrices, LBO 128 (k chunk), SBO 256 (8 rows); B at 2048:
  // LBO 128, SBO 256.
  const uint64_t da = make_desc(0, 128, 256, 0), db = make_desc(2048, 128, 256, 0);
  return std::string(kHopper) + R"(
.visible .entry k_async(.param .align 8 .b8 k_async_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<16>;
  .reg .f32 %acc<4>;
  .reg .f32 %acq<4>;
  .reg .b64 %rdA, %rdB;
  .shared .align 1024 .b8 sm[4096];
  ld.param.u64 %rd1, [k_async_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, sm;
  mad.lo.u32 %r3, %r1, 32, %r2;
  mov.u32 %r4, 0x3c003c00;
  st.shared.v4.u32 [%r3], {%r4, %r4, %r4, %r4};
  st.shared.v4.u32 [%r3+16], {%r4, %r4, %r4, %r4};
  fence.proxy.async.shared::cta;
  bar.sync 0;
  mov.b64 %rdA, )" +
         std::to_string(da) + R"(;
  mov.b64 %rdB, )" +
         std::to_string(db) + R"(;
  mul.wide.u32 %rd2, %r1, 32;
  add.s64 %rd3, %rd1, %rd2;
)" + body +
         "}\n";
}

struct OneOut {
  uint64_t out;
};

void test_wgmma_async_rules(void **) {
  DevBuf out(128 * 32);
  OneOut prm{out.ptr};
  const std::string wg1 =
      "  wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%acc0, %acc1, %acc2, %acc3}, %rdA, "
      "%rdB, 0, 1, 1, 0, 0; // first\n";
  const std::string wg2 =
      "  wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%acq0, %acq1, %acq2, %acq3}, %rdA, "
      "%rdB, 0, 1, 1, 0, 0; // second\n";
  const std::string store1 = "  st.global.v4.f32 [%rd3], {%acc0, %acc1, %acc2, %acc3}; // st1\n";
  const std::string store2 = "  st.global.v4.f32 [%rd3+16], {%acq0, %acq1, %acq2, %acq3}; // st2\n";
  // Correct use: D = 16 (sixteen products 1 * 1).
  {
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n" +
                                 store1);
    expect_ok(run(p, "k_async", 128, 0, &prm, sizeof prm));
    std::vector<float> v = out.get<float>();
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 4; ++i) assert_true(v[t * 8 + i] == 16.0f);
  }
  // Reading D before the wait (committed) and before the commit: an error
  // naming the reading line and the wgmma's line.
  for (const char *between : {"  wgmma.commit_group.sync.aligned;\n", ""}) {
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 + between + store1 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("st.global.v4.f32 " + at_line(p, "// st1"));
    expect_error("register %acc0 belongs to the wgmma.mma_async " + at_line(p, "// first") +
                 ", still in flight");
  }
  // Writing one (a mov into an accumulator) is an error too.
  {
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  mov.f32 %acc2, 0f00000000; // clobber\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("mov.f32 " + at_line(p, "// clobber") + ": register %acc2");
  }
  // wait_group 1 with two groups in flight retires the older one only: its
  // D is readable (and right), the newest is still in flight.
  {
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n" + wg2 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 1;\n" +
                                 store1 + store2 + "  wgmma.wait_group.sync.aligned 0;\n");
    out.poison();
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("st.global.v4.f32 " + at_line(p, "// st2") +
                 ": register %acq0 belongs to the "
                 "wgmma.mma_async " +
                 at_line(p, "// second"));
    // Thread 0 (the one that faulted) stored the first group's result.
    std::vector<float> v = out.get<float>();
    for (int i = 0; i < 4; ++i) assert_true(v[i] == 16.0f);
    // With wait_group 0 before the second store, both are right.
    std::string q = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n" + wg2 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 1;\n" +
                                 store1 + "  wgmma.wait_group.sync.aligned 0;\n" + store2);
    out.poison();
    expect_ok(run(q, "k_async", 128, 0, &prm, sizeof prm));
    v = out.get<float>();
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 8; ++i) assert_true(v[t * 8 + i] == 16.0f);
  }
  // Chained accumulation on the same registers needs no wait in between;
  // an uncommitted wgmma is not retired by wait_group.
  {
    std::string wg1acc = wg1;
    wg1acc.replace(wg1acc.find(", 0, 1, 1"), 9, ", 1, 1, 1");
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 + wg1acc +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n" +
                                 store1);
    out.poison();
    expect_ok(run(p, "k_async", 128, 0, &prm, sizeof prm));
    std::vector<float> v = out.get<float>();
    for (int t = 0; t < 128; ++t) assert_true(v[t * 8 + 3] == 32.0f);
    std::string q = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.wait_group.sync.aligned 0;\n" + store1);
    assert_int_equal(run(q, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("st.global.v4.f32 " + at_line(q, "// st1"));
  }
  // No wgmma.fence before the first wgmma, nor after a wait_group.
  {
    std::string p = async_kernel(wg1 + "  wgmma.commit_group.sync.aligned;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "// first") +
                 ": warpgroup 0 issues wgmma.mma_async without a "
                 "wgmma.fence");
    std::string q = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n" +
                                 wg2);
    assert_int_equal(run(q, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(q, "// second") + ": warpgroup 0 issues wgmma.mma_async without");
  }
  // A wgmma still in flight when the threads exit.
  {
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 +
                                 "  wgmma.commit_group.sync.aligned;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "// first") + ": still in flight when warpgroup 0 exited");
  }
  // An accumulator of an in-flight wgmma used as the accumulator of one of
  // another shape, or as its A input.
  {
    std::string other =
        "  wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%acc0, %acc1, %acc2, %acc3, %acq0, "
        "%acq1, %acq2, %acq3}, %rdA, %rdB, 1, 1, 1, 0, 0; // other\n";
    std::string p = async_kernel("  wgmma.fence.sync.aligned;\n" + wg1 + other +
                                 "  wgmma.commit_group.sync.aligned;\n"
                                 "  wgmma.wait_group.sync.aligned 0;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "// other") +
                 ": register %acc0 is an accumulator of the "
                 "wgmma.mma_async " +
                 at_line(p, "// first"));
  }
  // Descriptors must agree across the warpgroup.
  {
    std::string p = async_kernel(
        "  setp.eq.u32 %p1, %r1, 77;\n  @%p1 add.s64 %rdB, %rdB, 8;\n"
        "  wgmma.fence.sync.aligned;\n" +
        wg1 +
        "  wgmma.commit_group.sync.aligned;\n"
        "  wgmma.wait_group.sync.aligned 0;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "// first") + ": the matrix descriptors differ across the warpgroup");
    expect_error("thread (77,0,0)");
  }
  // A descriptor reaching outside shared memory.
  {
    std::string p =
        async_kernel("  add.s64 %rdB, %rdB, 1000;\n  wgmma.fence.sync.aligned;\n" + wg1 +
                     "  wgmma.commit_group.sync.aligned;\n"
                     "  wgmma.wait_group.sync.aligned 0;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(p, "// first") +
                 ": B element (0, 0) at shared 0x4680 lies outside the "
                 "block's 4096 bytes");
  }
  // Divergence: warp 3 skips the wgmma.fence, so the warpgroup never meets.
  {
    std::string p = async_kernel(
        "  setp.ge.u32 %p1, %r1, 96;\n  @%p1 bra $L_skip;\n"
        "  wgmma.fence.sync.aligned; // fence\n$L_skip:\n  bar.sync 1, 64;\n");
    assert_int_equal(run(p, "k_async", 128, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error("wgmma.fence.sync.aligned " + at_line(p, "// fence") +
                 ": 96 of the 128 threads of warpgroup 0 arrived (0 exited, 32 wait at PTX line " +
                 std::to_string(line_of(p, "bar.sync 1, 64")) + ")");
    // A block of 96 threads has no full warpgroup.
    std::string q = async_kernel("  wgmma.fence.sync.aligned; // fence\n");
    assert_int_equal(run(q, "k_async", 96, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
    expect_error(at_line(q, "// fence") + ": warpgroup 0 has 96 threads");
  }
}

// setmaxnreg: range checked when parsed, direction at run time.
void test_setmaxnreg(void **) {
  auto kernel = [](const std::string &body) {
    return std::string(kHopper) +
           ".visible .entry k_reg()\n{\n  .reg .pred %p<2>;\n  .reg .b32 %r<4>;\n"
           "  mov.u32 %r1, %tid.x;\n  setp.lt.u32 %p1, %r1, 128;\n  @%p1 bra $L_prod;\n" +
           body + "  ret;\n$L_prod:\n  setmaxnreg.dec.sync.aligned.u32 40;\n}\n";
  };
  expect_ok(run(kernel("  setmaxnreg.inc.sync.aligned.u32 232;\n"), "k_reg", 384, 0, nullptr, 0));
  // The counts move registers within the CTA's: 40 x 128 + 232 x 256 =
  // 168 x 384 fits, 240 does not (an .inc on a GPU would wait for ever).
  std::string big = kernel("  setmaxnreg.inc.sync.aligned.u32 240; // too many\n");
  assert_int_equal(run(big, "k_reg", 384, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error(at_line(big, "// too many") +
               ": the warpgroups' setmaxnreg counts need 66560 registers, the CTA has 64512");
  std::string p = kernel(
      "  setmaxnreg.inc.sync.aligned.u32 232;\n"
      "  setmaxnreg.inc.sync.aligned.u32 200; // lower\n");
  assert_int_equal(run(p, "k_reg", 384, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error(at_line(p, "// lower") +
               ": warpgroup 1 increases its register count from 232 to "
               "200");
  for (const char *bad :
       {"setmaxnreg.inc.sync.aligned.u32 20;", "setmaxnreg.inc.sync.aligned.u32 100;",
        "setmaxnreg.inc.sync.aligned.u32 264;", "setmaxnreg.inc.u32 64;"}) {
    std::string q = kernel(std::string("  ") + bad + "\n");
    assert_int_equal(run(q, "k_reg", 384, 0, nullptr, 0), FA_ERROR_COMPILE);
    expect_error("line " + std::to_string(line_of(q, bad)) + ": setmaxnreg");
  }
  // sm_90a only.
  std::string old = kernel("  setmaxnreg.inc.sync.aligned.u32 232;\n");
  old.replace(old.find("sm_90a"), 6, "sm_90");
  assert_int_equal(run(old, "k_reg", 384, 0, nullptr, 0), FA_ERROR_COMPILE);
  expect_error("requires .target sm_90a");
}

// ============================================================ mbarrier ====

struct Outs {
  uint64_t out;
};

// Kernel text with an mbarrier `bar` at shared 0 and a word buffer at 64.
std::string mbar_kernel(const std::string &body) {
  return std::string(kHopper) + R"(
.visible .entry k_mb(.param .align 8 .b8 k_mb_param[8])
{
  .reg .pred %p<8>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  .shared .align 8 .b8 bar[64];
  .shared .align 16 .b8 buf[64];
  ld.param.u64 %rd1, [k_mb_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, bar;
  mov.u32 %r3, buf;
)" + body +
         "}\n";
}

void test_mbarrier_phases(void **) {
  DevBuf out(64);
  Outs prm{out.ptr};
  // init count 2. Thread 0: try_wait.parity 1 on the fresh barrier returns
  // True at once (out[0]); thread 32 writes 42, arrives; thread 0 arrives
  // (phase 0 completes). Thread 64 waits parity 0, then reads 42 (out[1]);
  // parity 0 again is the preceding phase: True (out[2]). Phase 1: both
  // arrive again after their own waits; thread 64 waits parity 1 (out[3]).
  std::string p = mbar_kernel(R"(
  setp.eq.u32 %p1, %r1, 0;
  @!%p1 bra $L_w;
  mbarrier.init.shared::cta.b64 [%r2], 2;
$L_w:
  bar.sync 0;
  setp.eq.u32 %p2, %r1, 32;
  setp.eq.u32 %p3, %r1, 64;
  @%p3 bra $L_waiter;
  @!%p1 bra $L_t32;
  mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r2], 1;
  selp.u32 %r5, 1, 0, %p4;
  st.global.u32 [%rd1], %r5;
  mbarrier.arrive.shared::cta.b64 _, [%r2];
  bra $L_phase1;
$L_t32:
  @!%p2 bra $L_done;
  mov.u32 %r6, 42;
  st.shared.u32 [%r3], %r6;
  mbarrier.arrive.release.cta.shared::cta.b64 _, [%r2];
$L_phase1:
  mbarrier.try_wait.parity.shared::cta.b64 %p5, [%r2], 0;
  @!%p5 bra $L_phase1;
  mbarrier.arrive.shared::cta.b64 _, [%r2];
  bra $L_done;
$L_waiter:
  mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 %p4, [%r2], 0;
  @!%p4 bra $L_waiter;
  ld.shared.u32 %r7, [%r3];
  st.global.u32 [%rd1+4], %r7;
  mbarrier.try_wait.parity.shared::cta.b64 %p5, [%r2], 0;
  selp.u32 %r8, 1, 0, %p5;
  st.global.u32 [%rd1+8], %r8;
$L_w1:
  mbarrier.try_wait.parity.shared::cta.b64 %p6, [%r2], 1, 1000;
  @!%p6 bra $L_w1;
  st.global.u32 [%rd1+12], %r8;
$L_done:
  ret;
)");
  expect_ok(run(p, "k_mb", 96, 0, &prm, sizeof prm));
  std::vector<uint32_t> v = out.get<uint32_t>();
  assert_int_equal(v[0], 1);
  assert_int_equal(v[1], 42);
  assert_int_equal(v[2], 1);
  assert_int_equal(v[3], 1);

  // A barrier that never completes: one of two arrivals. Every thread then
  // waits: an error, not a hang.
  std::string q = mbar_kernel(R"(
  setp.eq.u32 %p1, %r1, 0;
  @!%p1 bra $L_w;
  mbarrier.init.shared::cta.b64 [%r2], 2;
  mbarrier.arrive.shared::cta.b64 _, [%r2];
$L_w:
  bar.sync 0;
$L_spin:
  mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0;
  @!%p2 bra $L_spin;
)");
  assert_int_equal(run(q, "k_mb", 64, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("mbarrier.try_wait.parity.shared::cta.b64 " + at_line(q, "try_wait") +
               ": deadlock: 64 thread(s) wait on mbarriers; the first waits for phase 0 of the "
               "mbarrier at shared 0x0 (1 of 2 arrivals pending, tx-count 0)");

  // Misuse: arrive on an uninitialized barrier, init twice, parity 2, a
  // third arrival for count 2 ... each names its line.
  struct Bad {
    const char *body, *marker, *msg;
  } bads[] = {
      {"  mbarrier.arrive.shared::cta.b64 _, [%r2]; // here\n", "// here",
       "no initialized mbarrier at shared address 0x0"},
      {"  mbarrier.init.shared::cta.b64 [%r2], 1;\n  mbarrier.init.shared::cta.b64 [%r2], 1; // "
       "here\n",
       "// here", "shared 0x0 already holds a valid mbarrier"},
      {"  mbarrier.init.shared::cta.b64 [%r2], 1;\n"
       "  mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r2], 2; // here\n",
       "// here", "phaseParity 2 is not 0 or 1"},
      {"  mbarrier.init.shared::cta.b64 [%r2+4], 1; // here\n", "// here", "misaligned shared"},
      {"  mbarrier.init.shared::cta.b64 [%r2], 1;\n  mbarrier.arrive.shared::cta.b64 _, [%r2];\n"
       "  mbarrier.arrive.shared::cta.b64 _, [%r2]; // here\n",
       "// here",
       "arrive-on in phase 1 of the mbarrier at shared 0x0 before any try_wait returned True for "
       "phase 0"},
      {"  mbarrier.init.shared::cta.b64 [%r2], 1;\n"
       "  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], 64;\n"
       "  mbarrier.arrive.shared::cta.b64 _, [%r2]; // here\n",
       "// here", "1 arrival(s) on the mbarrier at shared 0x0, whose phase 0 has 0 pending"},
      {"  mbarrier.init.shared::cta.b64 [%r2], 1;\n"
       "  mbarrier.expect_tx.shared::cta.b64 [%r2], 1048576; // here\n",
       "// here", "the tx count must be in 1..2^20-1"},
  };
  for (const Bad &b : bads) {
    std::string k = mbar_kernel(std::string("  setp.eq.u32 %p7, %r1, 0;\n  @!%p7 ret;\n") + b.body);
    fa_status st = run(k, "k_mb", 32, 0, &prm, sizeof prm);
    assert_true(st == FA_ERROR_LAUNCH || st == FA_ERROR_COMPILE);
    if (st == FA_ERROR_LAUNCH)
      expect_error(at_line(k, b.marker) + ": " + b.msg);
    else
      expect_error("line " + std::to_string(line_of(k, b.marker)) + ": ");
    expect_error(b.msg);
  }
  // tx-count that never balances: expect_tx 64 bytes that no copy completes,
  // nobody waits: the block's exit reports it.
  std::string r = mbar_kernel(R"(
  setp.eq.u32 %p1, %r1, 0;
  @!%p1 ret;
  mbarrier.init.shared::cta.b64 [%r2], 1; // init
  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], 64;
)");
  assert_int_equal(run(r, "k_mb", 32, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("mbarrier at shared 0x0 (initialized " + at_line(r, "// init") +
               "): the block exited with tx-count 64 in phase 0");
}

// ================================================ cp.async.bulk.tensor ====

// Parameters of the TMA kernels: the tensor map sits in the parameter block
// (read through cvta.param); coordinates and the output pointer beside it.
struct TmaParams {
  uint64_t out;
  int32_t c[5];
  uint32_t before;   // 1: read the destination before the phase completes
  uint64_t map_ptr;  // nonzero: a tensor map in global memory instead
  uint8_t pad[16];
  alignas(64) uint8_t map[128];
};
static_assert(offsetof(TmaParams, map) == 64, "map at 64");

// One thread issues the copy (box `bytes` long) into dynamic shared memory
// at `dst`, the others wait on the mbarrier; then all copy `bytes` of shared
// memory from dst to out. With `before`, thread 0 first stores the word at
// dst as seen between the issue and the arrival that completes the phase.
std::string tma_kernel(int dims, uint32_t dst, uint32_t bytes, bool tx_first = true) {
  std::string coords = "{";
  for (int d = 0; d < dims; ++d) coords += (d ? ", %c" : "%c") + std::to_string(d);
  coords += "}";
  std::string p = std::string(kHopper) + ".visible .entry k_tma(.param .align 64 .b8 k_tma_param[" +
                  std::to_string(sizeof(TmaParams)) +
                  "])\n{\n"
                  "  .reg .pred %p<8>;\n  .reg .b32 %r<16>;\n  .reg .b32 %c<5>;\n"
                  "  .reg .b64 %rd<16>;\n  .extern .shared .align 1024 .b8 smem[];\n";
  p += "  ld.param.u64 %rd1, [k_tma_param+0];\n";
  for (int d = 0; d < dims; ++d)
    p += "  ld.param.u32 %c" + std::to_string(d) + ", [k_tma_param+" + std::to_string(8 + 4 * d) +
         "];\n";
  p += "  ld.param.u32 %r9, [k_tma_param+" + std::to_string(offsetof(TmaParams, before)) + "];\n";
  // Generic address of the parameter block; the map at +64 (or in global).
  p += "  mov.u64 %rd2, k_tma_param;\n  cvta.param.u64 %rd2, %rd2;\n  add.s64 %rd3, %rd2, 64;\n";
  p += "  ld.u64 %rd4, [%rd2+" + std::to_string(offsetof(TmaParams, map_ptr)) + "];\n";
  p += "  setp.ne.u64 %p6, %rd4, 0;\n  selp.b64 %rd3, %rd4, %rd3, %p6;\n";
  p += "  mov.u32 %r1, %tid.x;\n  mov.u32 %r2, smem;\n  add.u32 %r3, %r2, " + std::to_string(dst) +
       ";\n  setp.eq.u32 %p1, %r1, 0;\n  @!%p1 bra $L_sync;\n"
       "  mbarrier.init.shared::cta.b64 [%r2], 1;\n$L_sync:\n  bar.sync 0;\n  @!%p1 bra $L_wait;\n";
  const std::string arrive =
      "  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], " + std::to_string(bytes) + ";\n";
  if (tx_first) p += arrive;
  p += "  cp.async.bulk.tensor." + std::to_string(dims) +
       "d.shared::cluster.global.mbarrier::complete_tx::bytes [%r3], [%rd3, " + coords +
       "], [%r2]; // tma\n";
  if (!tx_first) {
    p += "  setp.ne.u32 %p2, %r9, 0;\n  @!%p2 bra $L_arrive;\n  ld.shared.u32 %r10, [%r3];\n"
         "  st.global.u32 [%rd1+" +
         std::to_string(bytes) + "], %r10;\n$L_arrive:\n" + arrive;
  }
  p += R"($L_wait:
  mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r2], 0;
  @!%p3 bra $L_wait;
  mov.u32 %r4, %r1;
$L_copy:
  setp.ge.u32 %p4, %r4, )" +
       std::to_string(bytes / 4) + R"(;
  @%p4 bra $L_end;
  mad.lo.u32 %r5, %r4, 4, %r3;
  ld.shared.u32 %r6, [%r5];
  mul.wide.u32 %rd5, %r4, 4;
  add.s64 %rd6, %rd1, %rd5;
  st.global.u32 [%rd6], %r6;
  add.u32 %r4, %r4, 64;
  bra $L_copy;
$L_end:
  ret;
}
)";
  return p;
}

// The box as the ISA defines it: element (i0..i4) of the box is tensor
// element (c + i) or zero outside the tensor; row-major by box in shared
// memory, then the swizzle: 16-byte chunk j of the 128-byte line L of the
// box at chunk j ^ (L mod 2^bits) (tables of "Swizzling Modes").
std::vector<uint8_t> expected_box(const fa::emu::TensorMap &m, const std::vector<uint8_t> &g,
                                  const int32_t *c) {
  const uint32_t eb = m.elem_bytes;
  size_t elems = 1;
  for (uint32_t d = 0; d < m.rank; ++d) elems *= m.box[d];
  std::vector<uint8_t> lin(elems * eb, 0);
  for (size_t e = 0; e < elems; ++e) {
    size_t q = e;
    bool in = true;
    uint64_t off = 0;
    for (uint32_t d = 0; d < m.rank; ++d) {
      const int64_t x = c[d] + static_cast<int64_t>(q % m.box[d]);
      q /= m.box[d];
      if (x < 0 || x >= static_cast<int64_t>(m.dims[d])) in = false;
      off += static_cast<uint64_t>(x) * (d == 0 ? eb : m.strides[d]);
    }
    if (in) std::memcpy(lin.data() + e * eb, g.data() + off, eb);
  }
  const int bits = m.swizzle == fa::emu::TmaSwizzle::B128  ? 3
                   : m.swizzle == fa::emu::TmaSwizzle::B64 ? 2
                   : m.swizzle == fa::emu::TmaSwizzle::B32 ? 1
                                                           : 0;
  std::vector<uint8_t> out(lin.size(), 0);
  for (size_t off = 0; off < lin.size(); off += 16) {
    const size_t line = off / 128, chunk = (off % 128) / 16;
    const size_t phys = line * 128 + 16 * (chunk ^ (line % (size_t{1} << bits)));
    std::memcpy(out.data() + phys, lin.data() + off, 16);
  }
  return out;
}

fa::emu::TensorMap make_map(uint64_t base, std::vector<uint64_t> dims, std::vector<uint32_t> box,
                            uint32_t eb, fa::emu::TmaSwizzle swz) {
  fa::emu::TensorMap m;
  m.rank = static_cast<uint32_t>(dims.size());
  m.base = base;
  m.elem_bytes = eb;
  m.swizzle = swz;
  uint64_t stride = eb;
  for (uint32_t d = 0; d < m.rank; ++d) {
    m.dims[d] = dims[d];
    m.strides[d] = stride;
    m.box[d] = box[d];
    // Row pitch padded to 16 bytes (a tensor-map stride rule).
    stride = d == 0 ? (dims[0] * eb + 15) / 16 * 16 : stride * dims[d];
  }
  return m;
}

size_t tensor_bytes(const fa::emu::TensorMap &m) {
  return static_cast<size_t>(m.strides[m.rank - 1] * m.dims[m.rank - 1]);
}

// Runs one copy; returns the shared bytes of the box as the kernel saw them.
std::vector<uint8_t> run_tma(const fa::emu::TensorMap &m0, const std::vector<int32_t> &c,
                             uint32_t dst, fa_status want = FA_SUCCESS,
                             std::string *ptx_out = nullptr, bool map_in_global = false) {
  fa::emu::TensorMap m = m0;
  uint32_t bytes = m.elem_bytes;
  for (uint32_t d = 0; d < m.rank; ++d) bytes *= m.box[d];
  TmaParams prm{};
  DevBuf out(bytes + 64), gmap(128);
  prm.out = out.ptr;
  for (size_t d = 0; d < c.size(); ++d) prm.c[d] = c[d];
  fa::emu::store_tensor_map(m, prm.map);
  if (map_in_global) {
    std::vector<uint8_t> mb(prm.map, prm.map + 128);
    gmap.put(mb);
    prm.map_ptr = gmap.ptr;
    std::memset(prm.map, 0, 128);
  }
  const std::string ptx = tma_kernel(static_cast<int>(m.rank), dst, bytes);
  if (ptx_out) *ptx_out = ptx;
  fa_status st = run(ptx, "k_tma", 64, dst + bytes + 1024, &prm, sizeof prm);
  if (st != want) std::fprintf(stderr, "run_tma: %s\n", fa::last_error());
  assert_int_equal(st, want);
  std::vector<uint8_t> v = out.get<uint8_t>();
  v.resize(bytes);
  return v;
}

void check_box(const char *what, const std::vector<uint8_t> &got,
               const std::vector<uint8_t> &want) {
  assert_int_equal(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      std::fprintf(stderr, "%s: shared byte %zu of the box is 0x%02x, want 0x%02x\n", what, i,
                   got[i], want[i]);
      fail();
    }
}

void test_tma_boxes(void **) {
  std::mt19937 rng(5);
  // 2D, 50 x 40 bf16 (80-byte rows padded to 96), box 32 x 16: inside,
  // negative coordinates, past the end in both dimensions.
  {
    fa::emu::TensorMap m = make_map(0, {40, 50}, {32, 16}, 2, fa::emu::TmaSwizzle::None);
    std::vector<uint8_t> g(tensor_bytes(m));
    for (auto &x : g) x = static_cast<uint8_t>(rng());
    DevBuf dg(g.size());
    dg.put(g);
    m.base = dg.ptr;
    for (std::vector<int32_t> c : {std::vector<int32_t>{4, 8}, {-8, -3}, {24, 40}, {-40, 0}}) {
      char what[64];
      std::snprintf(what, sizeof what, "2D box at (%d, %d)", c[0], c[1]);
      check_box(what, run_tma(m, c, 1024), expected_box(m, g, c.data()));
    }
    // The map may also live in global memory.
    std::vector<int32_t> c = {-8, 45};
    check_box("2D, map in global", run_tma(m, c, 1024, FA_SUCCESS, nullptr, true),
              expected_box(m, g, c.data()));
  }
  // 4D, dims 24 x 5 x 3 x 4 (f16), box 16 x 4 x 2 x 3, out of bounds in each.
  {
    fa::emu::TensorMap m = make_map(0, {24, 5, 3, 4}, {16, 4, 2, 3}, 2, fa::emu::TmaSwizzle::None);
    std::vector<uint8_t> g(tensor_bytes(m));
    for (auto &x : g) x = static_cast<uint8_t>(rng());
    DevBuf dg(g.size());
    dg.put(g);
    m.base = dg.ptr;
    for (std::vector<int32_t> c :
         {std::vector<int32_t>{0, 0, 0, 0}, {16, 3, -1, 2}, {-8, -2, 2, -1}}) {
      char what[64];
      std::snprintf(what, sizeof what, "4D box at (%d, %d, %d, %d)", c[0], c[1], c[2], c[3]);
      check_box(what, run_tma(m, c, 2048), expected_box(m, g, c.data()));
    }
  }
  // Swizzles: 128B (64 bf16 x 16 rows, out of bounds rows too), 64B, 32B;
  // 5D with 128B.
  struct Sw {
    fa::emu::TmaSwizzle s;
    uint32_t inner, dst;
  } sws[] = {{fa::emu::TmaSwizzle::B128, 64, 1024},
             {fa::emu::TmaSwizzle::B64, 32, 512},
             {fa::emu::TmaSwizzle::B32, 16, 256},
             {fa::emu::TmaSwizzle::B128, 32, 2048}};
  for (const Sw &sw : sws) {
    fa::emu::TensorMap m = make_map(0, {100, 30}, {sw.inner, 16}, 2, sw.s);
    std::vector<uint8_t> g(tensor_bytes(m));
    for (auto &x : g) x = static_cast<uint8_t>(rng());
    DevBuf dg(g.size());
    dg.put(g);
    m.base = dg.ptr;
    for (std::vector<int32_t> c : {std::vector<int32_t>{8, 2}, {-16, 20}}) {
      char what[80];
      std::snprintf(what, sizeof what, "swizzle %d box %u at (%d, %d)", static_cast<int>(sw.s),
                    sw.inner, c[0], c[1]);
      check_box(what, run_tma(m, c, sw.dst), expected_box(m, g, c.data()));
    }
  }
  // The forward kernel's K/V boxes: 64 columns x 112 rows of a 4D tensor
  // whose keys end early (rows past 19 are zeros), 128B swizzle.
  {
    fa::emu::TensorMap m =
        make_map(0, {200, 19, 2, 1}, {64, 112, 1, 1}, 2, fa::emu::TmaSwizzle::B128);
    std::vector<uint8_t> g(tensor_bytes(m));
    for (auto &x : g) x = static_cast<uint8_t>(rng());
    DevBuf dg(g.size());
    dg.put(g);
    m.base = dg.ptr;
    for (std::vector<int32_t> c : {std::vector<int32_t>{0, 0, 1, 0}, {192, 0, 0, 0}}) {
      char what[80];
      std::snprintf(what, sizeof what, "4D 64 x 112 box at (%d, %d, %d, %d)", c[0], c[1], c[2],
                    c[3]);
      check_box(what, run_tma(m, c, 1024), expected_box(m, g, c.data()));
    }
  }
  {
    fa::emu::TensorMap m =
        make_map(0, {64, 3, 2, 2, 2}, {64, 2, 2, 1, 2}, 2, fa::emu::TmaSwizzle::B128);
    std::vector<uint8_t> g(tensor_bytes(m));
    for (auto &x : g) x = static_cast<uint8_t>(rng());
    DevBuf dg(g.size());
    dg.put(g);
    m.base = dg.ptr;
    std::vector<int32_t> c = {0, 2, 1, 1, 1};
    check_box("5D swizzle 128B", run_tma(m, c, 1024), expected_box(m, g, c.data()));
  }
}

// The copy lands when the phase completes, not at issue: issued before the
// expect_tx arrival, the destination still holds the old bytes in between.
void test_tma_visibility(void **) {
  fa::emu::TensorMap m = make_map(0, {64, 8}, {64, 8}, 2, fa::emu::TmaSwizzle::None);
  std::vector<uint8_t> g(tensor_bytes(m), 0x5A);
  DevBuf dg(g.size());
  dg.put(g);
  m.base = dg.ptr;
  TmaParams prm{};
  const uint32_t bytes = 64 * 8 * 2;
  DevBuf out(bytes + 64);
  prm.out = out.ptr;
  prm.before = 1;
  fa::emu::store_tensor_map(m, prm.map);
  const std::string ptx = tma_kernel(2, 1024, bytes, /*tx_first=*/false);
  expect_ok(run(ptx, "k_tma", 64, 4096, &prm, sizeof prm));
  std::vector<uint32_t> v = out.get<uint32_t>();
  assert_int_equal(v[bytes / 4], 0xffffffffu);  // shared memory starts as 0xff bytes
  for (uint32_t i = 0; i < bytes / 4; ++i) assert_int_equal(v[i], 0x5A5A5A5Au);
}

void test_tma_faults(void **) {
  fa::emu::TensorMap m = make_map(0, {64, 32}, {64, 16}, 2, fa::emu::TmaSwizzle::B128);
  std::vector<uint8_t> g(tensor_bytes(m), 1);
  DevBuf dg(g.size());
  dg.put(g);
  m.base = dg.ptr;
  std::vector<int32_t> c = {0, 0};
  std::string ptx;
  // 128B swizzle needs the pattern's 1024-byte alignment.
  run_tma(m, c, 1024 + 128, FA_ERROR_LAUNCH, &ptx);
  expect_error(at_line(ptx, "// tma") +
               ": destination shared address 0x480 is not 1024-byte "
               "aligned");
  // Without swizzle, 128 bytes.
  fa::emu::TensorMap n = m;
  n.swizzle = fa::emu::TmaSwizzle::None;
  run_tma(n, c, 1024 + 64, FA_ERROR_LAUNCH, &ptx);
  expect_error("is not 128-byte aligned");
  expect_ok(FA_SUCCESS);
  // Inner box wider than the swizzle span; boxes over 256; bad magic.
  fa::emu::TensorMap w = make_map(m.base, {128, 32}, {128, 8}, 2, fa::emu::TmaSwizzle::B128);
  run_tma(w, c, 1024, FA_ERROR_LAUNCH, &ptx);
  expect_error(at_line(ptx, "// tma") +
               ": the box's inner dimension (256 bytes) exceeds the "
               "128-byte swizzle");
  fa::emu::TensorMap big = make_map(m.base, {64, 512}, {8, 300}, 2, fa::emu::TmaSwizzle::None);
  run_tma(big, c, 1024, FA_ERROR_LAUNCH, &ptx);
  expect_error("box[1] = 300 is outside 1..256");
  fa::emu::TensorMap bad = m;
  bad.magic = 0x12345678u;
  run_tma(bad, c, 1024, FA_ERROR_LAUNCH, &ptx);
  expect_error(at_line(ptx, "// tma") + ": no tensor map at 0x");
  expect_error("(magic 0x12345678, rank 2)");
  // A box running past shared memory (launched with exactly dst + bytes
  // + 1024 bytes, at dst 0x7c00 = 31 KB... a 2 KB box fits; 3 rows more do
  // not when the launch is made smaller): shrink by dynamic smem instead.
  TmaParams prm{};
  DevBuf out(4096);
  prm.out = out.ptr;
  fa::emu::store_tensor_map(m, prm.map);
  const std::string p = tma_kernel(2, 1024, 2048);
  assert_int_equal(run(p, "k_tma", 64, 2048, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error(at_line(p, "// tma") +
               ": the 2048-byte box at shared 0x400 runs past the block's "
               "2048 bytes of shared memory");
  // A rank mismatch between the map and the instruction.
  fa::emu::TensorMap r3 = make_map(m.base, {64, 4, 4}, {64, 2, 2}, 2, fa::emu::TmaSwizzle::None);
  fa::emu::store_tensor_map(r3, prm.map);
  assert_int_equal(run(p, "k_tma", 64, 8192, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("the tensor map has rank 3, the instruction 2");
}

// expect_tx larger than the copy: the waiters deadlock, reported.
void test_tma_tx_mismatch(void **) {
  fa::emu::TensorMap m = make_map(0, {64, 8}, {64, 8}, 2, fa::emu::TmaSwizzle::None);
  std::vector<uint8_t> g(tensor_bytes(m), 7);
  DevBuf dg(g.size());
  dg.put(g);
  m.base = dg.ptr;
  TmaParams prm{};
  DevBuf out(4096);
  prm.out = out.ptr;
  fa::emu::store_tensor_map(m, prm.map);
  std::string p = tma_kernel(2, 1024, 1024);
  p.replace(p.find("[%r2], 1024;"), 12, "[%r2], 1536;");
  assert_int_equal(run(p, "k_tma", 64, 8192, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error(
      "deadlock: 64 thread(s) wait on mbarriers; the first waits for phase 0 of the "
      "mbarrier at shared 0x0 (0 of 1 arrivals pending, tx-count 512)");
}

// ===================================================== named barriers ====

void test_named_barriers(void **) {
  DevBuf out(256 * 4);
  OneOut prm{out.ptr};
  // Warps 0-1 produce (write their tid + 1000, bar.arrive 1, 128), warps
  // 2-3 consume after bar.sync 1, 128 and then announce bar.arrive 2, 128;
  // the producers bar.sync 2, 128 before overwriting: consumers must read
  // the first values, producers the consumers' marks.
  std::string p = std::string(kHopper) + R"(
.visible .entry k_nb(.param .align 8 .b8 k_nb_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<8>;
  .shared .align 16 .b8 buf[512];
  ld.param.u64 %rd1, [k_nb_param+0];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, buf;
  setp.lt.u32 %p1, %r1, 64;
  @!%p1 bra $L_cons;
  mad.lo.u32 %r3, %r1, 4, %r2;
  add.u32 %r4, %r1, 1000;
  st.shared.u32 [%r3], %r4;
  bar.arrive 1, 128;
  bar.sync 2, 128;
  ld.shared.u32 %r5, [%r3+256];
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r5;
  st.shared.u32 [%r3], %r1;
  ret;
$L_cons:
  sub.u32 %r6, %r1, 64;
  mad.lo.u32 %r7, %r6, 4, %r2;
  barrier.cta.sync.aligned 1, 128;
  ld.shared.u32 %r8, [%r7];
  add.u32 %r9, %r8, 5000;
  st.shared.u32 [%r7+256], %r9;
  barrier.cta.arrive.aligned 2, 128;
  mul.wide.u32 %rd4, %r1, 4;
  add.s64 %rd5, %rd1, %rd4;
  st.global.u32 [%rd5], %r8;
}
)";
  expect_ok(run(p, "k_nb", 128, 0, &prm, sizeof prm));
  std::vector<uint32_t> v = out.get<uint32_t>();
  for (uint32_t t = 0; t < 64; ++t) assert_int_equal(v[t], t + 6000);
  for (uint32_t t = 64; t < 128; ++t) assert_int_equal(v[t], t - 64 + 1000);

  // Misuse: counts that differ within a phase; a second arrival before the
  // barrier completed; a count above the block; a deadlock on a named one.
  auto k = [](const std::string &body) {
    return std::string(kHopper) +
           ".visible .entry k_nb()\n{\n  .reg .pred %p<4>;\n"
           "  .reg .b32 %r<8>;\n  mov.u32 %r1, %tid.x;\n"
           "  setp.lt.u32 %p1, %r1, 64;\n" +
           body + "}\n";
  };
  std::string a = k("  @%p1 bar.arrive 3, 128;\n  @!%p1 bar.sync 3, 96; // here\n");
  assert_int_equal(run(a, "k_nb", 128, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("bar.sync " + at_line(a, "// here") +
               ": thread count 96 differs from the 128 of "
               "barrier 3's current phase");
  std::string b = k("  @%p1 bar.arrive 3, 128;\n  @%p1 bar.arrive 3, 128; // here\n");
  assert_int_equal(run(b, "k_nb", 128, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error(at_line(b, "// here") + ": the thread arrives a second time at barrier 3");
  std::string c = k("  bar.sync 4, 256; // here\n");
  assert_int_equal(run(c, "k_nb", 128, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error(at_line(c, "// here") + ": thread count 256 exceeds the block's 128 threads");
  std::string d = k("  @%p1 bar.sync 5, 128; // here\n");
  assert_int_equal(run(d, "k_nb", 128, 0, nullptr, 0), FA_ERROR_LAUNCH);
  expect_error("barrier deadlock " + at_line(d, "// here") +
               ": 64 of 128 threads arrived (64 "
               "exited)");
  for (const char *bad :
       {"bar.sync 1, 100;", "bar.arrive 1;", "bar.sync 16, 64;", "bar.red.and.pred %p1, 1, %p1;"}) {
    std::string q = k(std::string("  ") + bad + "\n");
    assert_int_equal(run(q, "k_nb", 128, 0, nullptr, 0), FA_ERROR_COMPILE);
    expect_error("line " + std::to_string(line_of(q, bad)) + ": ");
  }
}

// ================================================= generic addressing ====

void test_generic_addresses(void **) {
  // ld through the parameter block's generic address, cvta.shared and back,
  // generic loads / stores on shared and global; a store into the
  // parameter block is refused.
  struct P {
    uint64_t out;
    uint32_t x, y;
  } prm{0, 0x11223344u, 0x55667788u};
  DevBuf out(64);
  prm.out = out.ptr;
  std::string p = std::string(kHopper) + R"(
.visible .entry k_gen(.param .align 8 .b8 k_gen_param[16])
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<12>;
  .shared .align 16 .b8 buf[64];
  mov.u64 %rd1, k_gen_param;
  cvta.param.u64 %rd2, %rd1;
  ld.u64 %rd3, [%rd2];
  ld.v2.u32 {%r1, %r2}, [%rd2+8];
  mov.u32 %r3, buf;
  cvt.u64.u32 %rd4, %r3;
  cvta.shared.u64 %rd5, %rd4;
  st.u32 [%rd5+4], %r2;
  ld.shared.u32 %r4, [%r3+4];
  cvta.to.shared.u64 %rd6, %rd5;
  cvt.u32.u64 %r5, %rd6;
  ld.u32 %r6, [%rd5+4];
  st.u32 [%rd3], %r1;
  st.global.u32 [%rd3+4], %r4;
  st.u32 [%rd3+8], %r6;
  st.u32 [%rd3+12], %r5;
  st.u32 [%rd2+8], %r1; // into the parameters
}
)";
  assert_int_equal(run(p, "k_gen", 1, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("st.u32 " + at_line(p, "// into") + ": store to the kernel parameter block");
  std::vector<uint32_t> v = out.get<uint32_t>();
  assert_int_equal(v[0], 0x11223344u);
  assert_int_equal(v[1], 0x55667788u);
  assert_int_equal(v[2], 0x55667788u);
  assert_int_equal(v[3], 0u);  // buf is the first shared symbol
}

// sm_90a PTX on another SM; the instructions on an sm_80 target.
void test_targets(void **) {
  std::unique_ptr<fa::Backend> be80, be100;
  assert_int_equal(fa::create_emulator_backend(80, &be80), FA_SUCCESS);
  assert_int_equal(fa::create_emulator_backend(100, &be100), FA_SUCCESS);
  const std::string k = std::string(kHopper) + ".visible .entry k_t()\n{\n  ret;\n}\n";
  std::vector<uint8_t> bin;
  std::string log;
  assert_int_equal(be80->compile(k, &bin, &log), FA_ERROR_COMPILE);
  expect_error("PTX targets sm_90, the emulated device is sm_80");
  assert_int_equal(be100->compile(k, &bin, &log), FA_ERROR_COMPILE);
  expect_error("PTX targets sm_90a, which runs only on sm_90; the emulated device is sm_100");
  assert_int_equal(g_be->compile(k, &bin, &log), FA_SUCCESS);
  // 227 KB of shared memory per block on sm_90.
  assert_int_equal(g_be->info().limits.smem_per_block_optin, 227 * 1024);
  const std::string old =
      ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k_t()\n{\n  .reg .b32 "
      "%r<2>;\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], 0;\n}\n";
  assert_int_equal(be80->compile(old, &bin, &log), FA_ERROR_COMPILE);
  expect_error("line 7: ");
}

// ============================================== producer / consumer ====
// One CTA of 384 threads, built with the PTX builder: warpgroup 0 produces
// (thread 0 issues the TMA of a 128 x 64 bf16 A k-tile and a 64 x 64 B
// k-tile into one of two stages, 128B swizzle, with expect_tx on the stage's
// full barrier), warpgroups 1 and 2 consume (wait, 4 wgmma k-steps on their
// 64 rows of A, release the stage on its empty barrier). K = 256: four
// k-tiles, each stage used twice (parities flip). D = A B^T, 128 x 64, f32,
// compared with fp64 and with the sequential f32 chain.

using fa::ptx::at;
using fa::ptx::Builder;
using fa::ptx::imm;
using fa::ptx::Op;
using fa::ptx::Reg;
using fa::ptx::Space;
using fa::ptx::Type;

struct E2eParams {
  uint64_t out;
  uint8_t pad[56];
  alignas(64) uint8_t map_a[128];
  alignas(64) uint8_t map_b[128];
};

std::string e2e_kernel() {
  Builder b("k_fa3", sizeof(E2eParams));
  b.set_arch_specific(true);
  b.set_param_align(64);
  fa::ptx::Symbol dyn = b.extern_shared("smem", 1024);
  // Shared layout: stage s: A at 1024 + 24576 s (16 KB), B at +16384 (8 KB);
  // barriers at 0: full[s] at 8 s, empty[s] at 16 + 8 s.
  Reg sm = b.b32(), tid = b.b32(), wg = b.b32(), pm = b.b64(), out = b.b64();
  b.mov(Type::U32, sm, fa::ptx::sym(dyn));
  b.mov(Type::U32, tid, fa::ptx::sreg(fa::ptx::Special::TidX));
  b.op(Op::Shr, Type::U32, wg, tid, imm(7));
  b.param_address(pm);
  b.ld_param(Type::U64, out, 0);
  Reg p = b.pred(), q = b.pred();
  fa::ptx::Label init_done = b.label(), consumer = b.label(), done = b.label();
  b.setp(fa::ptx::Cmp::Ne, Type::U32, p, tid, imm(0));
  b.when(p).bra(init_done);
  for (int s = 0; s < 2; ++s) {
    b.mbarrier_init(at(sm, 8 * s), imm(1));         // full: the producer's expect_tx
    b.mbarrier_init(at(sm, 16 + 8 * s), imm(256));  // empty: every consumer thread
  }
  b.bind(init_done);
  b.bar_sync();
  b.setp(fa::ptx::Cmp::Ne, Type::U32, p, wg, imm(0));
  b.when(p).bra(consumer);
  // ---- producer warpgroup
  b.setmaxnreg(false, 24);
  b.setp(fa::ptx::Cmp::Ne, Type::U32, p, tid, imm(0));
  b.when(p).bra(done);
  {
    Reg ma = b.b64(), mb = b.b64(), c[2] = {b.b32(), b.b32()}, zero = b.b32();
    b.op(Op::Add, Type::U64, ma, pm, imm(64));
    b.op(Op::Add, Type::U64, mb, pm, imm(192));
    b.mov(Type::U32, zero, imm(0));
    for (int kt = 0; kt < 4; ++kt) {
      const int s = kt % 2, ph = (kt / 2) & 1;
      fa::ptx::Label spin = b.label();
      b.bind(spin);
      b.mbarrier_try_wait_parity(q, at(sm, 16 + 8 * s), imm(ph ^ 1));
      b.unless(q).bra(spin);
      b.mbarrier_arrive_expect_tx(at(sm, 8 * s), imm(16384 + 8192));
      b.mov(Type::U32, c[0], imm(64 * kt));
      b.mov(Type::U32, c[1], imm(0));
      b.cp_async_bulk_tensor(at(sm, 1024 + 24576 * s), ma, c, 2, at(sm, 8 * s));
      b.cp_async_bulk_tensor(at(sm, 1024 + 24576 * s + 16384), mb, c, 2, at(sm, 8 * s));
    }
  }
  b.bra(done);
  // ---- consumers
  b.bind(consumer);
  b.setmaxnreg(true, 240);
  std::vector<Reg> d(32);
  for (Reg &r : d) r = b.f32();
  Reg da = b.b64(), db = b.b64(), rowoff = b.b32();
  // This warpgroup's 64 rows of A: + 64 rows x 128 bytes = 8 KB.
  b.op(Op::Sub, Type::U32, rowoff, wg, imm(1));
  b.op(Op::MulLo, Type::U32, rowoff, rowoff, imm(8192));
  for (int kt = 0; kt < 4; ++kt) {
    const int s = kt % 2, ph = (kt / 2) & 1;
    fa::ptx::Label spin = b.label();
    b.bind(spin);
    b.mbarrier_try_wait_parity(q, at(sm, 8 * s), imm(ph));
    b.unless(q).bra(spin);
    // Descriptors: 128B swizzle (1 << 62), SBO 1024 (64 << 32), LBO 1 (1 << 16).
    Reg abase = b.b32(), bbase = b.b32(), t64 = b.b64();
    b.op(Op::Add, Type::U32, abase, sm, imm(1024 + 24576 * s));
    b.op(Op::Add, Type::U32, abase, abase, rowoff);
    b.op(Op::Add, Type::U32, bbase, sm, imm(1024 + 24576 * s + 16384));
    const int64_t hi = (int64_t{1} << 62) | (int64_t{64} << 32) | (int64_t{1} << 16);
    b.wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) {
      Reg a4 = b.b32(), b4 = b.b32();
      b.op(Op::Add, Type::U32, a4, abase, imm(32 * kk));
      b.op(Op::Shr, Type::U32, a4, a4, imm(4));
      b.op(Op::Add, Type::U32, b4, bbase, imm(32 * kk));
      b.op(Op::Shr, Type::U32, b4, b4, imm(4));
      b.cvt(Type::U64, Type::U32, fa::ptx::Round::None, t64, a4);
      b.op(Op::Or, Type::B64, da, t64, imm(hi));
      b.cvt(Type::U64, Type::U32, fa::ptx::Round::None, t64, b4);
      b.op(Op::Or, Type::B64, db, t64, imm(hi));
      b.wgmma_ss(Type::BF16, 64, d.data(), da, db, imm(kt == 0 && kk == 0 ? 0 : 1), false);
    }
    b.wgmma_commit();
    b.wgmma_wait(0);
    b.mbarrier_arrive(at(sm, 16 + 8 * s));
  }
  // Consumers meet on named barrier 1 (256 threads), then store D.
  b.bar_sync(1, 256);
  {
    Reg t = b.b32(), lane = b.b32(), w = b.b32(), row = b.b32(), col = b.b32(), idx = b.b32();
    Reg addr = b.b64();
    b.op(Op::Sub, Type::U32, t, tid, imm(128));
    b.op(Op::And, Type::B32, lane, t, imm(31));
    b.op(Op::Shr, Type::U32, w, t, imm(5));  // 0..7: warps of both consumers
    for (int i = 0; i < 32; ++i) {
      // row = 16 w + lane / 4 + 8 ((i / 2) % 2), col = 8 (i / 4) + 2 (lane % 4) + i % 2
      Reg g4 = b.b32(), q4 = b.b32();
      b.op(Op::Shr, Type::U32, g4, lane, imm(2));
      b.op(Op::And, Type::B32, q4, lane, imm(3));
      b.op(Op::MadLo, Type::U32, row, w, imm(16), g4);
      b.op(Op::Add, Type::U32, row, row, imm(8 * ((i / 2) % 2)));
      b.op(Op::MadLo, Type::U32, col, q4, imm(2), imm(8 * (i / 4) + i % 2));
      b.op(Op::MadLo, Type::U32, idx, row, imm(64), col);
      b.mul_wide(Type::U32, addr, idx, imm(4));
      b.op(Op::Add, Type::U64, addr, addr, out);
      b.st(Space::Global, Type::F32, at(addr), d[i]);
    }
  }
  b.bind(done);
  b.exit();
  return std::move(b).emit(80, 90, 384);
}

void test_producer_consumer(void **) {
  const int M = 128, N = 64, K = 256;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> A(M * K), Bt(N * K);  // both K contiguous
  for (auto &x : A) x = to_half(true, u(rng));
  for (auto &x : Bt) x = to_half(true, u(rng));
  DevBuf dA(A.size() * 2), dB(Bt.size() * 2), dout(M * N * 4);
  dA.put(A);
  dB.put(Bt);
  E2eParams prm{};
  prm.out = dout.ptr;
  fa::emu::TensorMap ma = make_map(dA.ptr, {K, M}, {64, 128}, 2, fa::emu::TmaSwizzle::B128);
  fa::emu::TensorMap mb = make_map(dB.ptr, {K, N}, {64, 64}, 2, fa::emu::TmaSwizzle::B128);
  fa::emu::store_tensor_map(ma, prm.map_a);
  fa::emu::store_tensor_map(mb, prm.map_b);
  const std::string ptx = e2e_kernel();
  assert_true(ptx.find(".target sm_90a") != std::string::npos);
  const uint32_t smem = 1024 + 2 * 24576;
  fa_status st = run(ptx, "k_fa3", 384, smem, &prm, sizeof prm);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  std::vector<float> D = dout.get<float>();
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      float seq = 0.0f;
      for (int k = 0; k < K; ++k) {
        const double pr =
            static_cast<double>(from_half(true, A[m * K + k])) * from_half(true, Bt[j * K + k]);
        ref += pr;
        mag += std::fabs(pr);
        seq = seq + static_cast<float>(pr);
      }
      const float got = D[m * N + j];
      if (!(std::fabs(got - ref) <= K * std::ldexp(1.0, -24) * mag) || fbits(got) != fbits(seq)) {
        std::fprintf(stderr, "D[%d][%d] = %.9g, fp64 %.9g, f32 chain %.9g\n", m, j, got, ref, seq);
        fail();
      }
    }
  // The same pipeline with a consumer releasing the stage before its
  // wgmma.wait_group: the producer's next TMA would land on operands a
  // wgmma still reads. The emulator reports it (naming the TMA's line).
  std::string bad = ptx;
  const std::string wait = "\twgmma.wait_group.sync.aligned 0;\n";
  const size_t w0 = bad.find(wait);
  const size_t arr = bad.find("\tmbarrier.arrive.shared::cta.b64", w0);
  assert_true(w0 != std::string::npos && arr != std::string::npos);
  const size_t arr_end = bad.find('\n', arr) + 1;
  const std::string arrive_line = bad.substr(arr, arr_end - arr);
  bad.erase(arr, arr_end - arr);
  bad.insert(w0, arrive_line);
  assert_int_equal(run(bad, "k_fa3", 384, smem, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("cp.async.bulk.tensor.2d");
  expect_error("which the wgmma.mma_async at PTX line");
  expect_error("still reads (no wgmma.wait_group has retired it)");
}

// Every sm_90a form the PTX builder prints parses and runs here (the ones
// the pipeline above does not use: wgmma_rs with a predicate scale-d and
// trans-b, bar_arrive, fence_proxy_async).
void test_builder_forms(void **) {
  Builder b("k_forms", 8);
  b.set_arch_specific(true);
  fa::ptx::Symbol dyn = b.extern_shared("smem", 1024);
  Reg sm = b.b32(), tid = b.b32(), db = b.b64(), pm = b.b64(), out = b.b64();
  Reg p = b.pred();
  b.mov(Type::U32, sm, fa::ptx::sym(dyn));
  b.mov(Type::U32, tid, fa::ptx::sreg(fa::ptx::Special::TidX));
  b.ld_param(Type::U64, out, 0);
  b.param_address(pm);
  fa::ptx::Label cons = b.label(), end = b.label();
  b.setp(fa::ptx::Cmp::Ge, Type::U32, p, tid, imm(128));
  b.when(p).bra(cons);
  // Warpgroup 0: ones in shared memory, then D = A B with A from registers.
  Reg one = b.b32(), addr = b.b32();
  b.mov(Type::U32, one, imm(0x3c003c00));
  b.op(Op::MadLo, Type::U32, addr, tid, imm(16), sm);
  b.st_v(Space::Shared, Type::B32, at(addr), {one, one, one, one});
  b.fence_proxy_async();
  b.bar_arrive(1, 256);  // tell warpgroup 1 the ones are there
  b.bar_sync(2, 256);    // and wait until it read them
  std::vector<Reg> d(8);
  for (Reg &r : d) r = b.f32();
  Reg a[4] = {one, one, one, one};
  b.mov(Type::U64, db, imm((int64_t{2} << 16) | (int64_t{16} << 32)));  // LBO 32, SBO 256
  Reg t = b.pred();
  b.setp(fa::ptx::Cmp::Eq, Type::U32, t, tid, tid);  // true
  b.wgmma_fence();
  b.wgmma_rs(Type::F16, 16, d.data(), a, db, imm(0), false);
  b.wgmma_rs(Type::F16, 16, d.data(), a, db, t, true);
  b.wgmma_commit();
  b.wgmma_wait(0);
  Reg o = b.b64();
  b.mul_wide(Type::U32, o, tid, imm(32));
  b.op(Op::Add, Type::U64, o, o, out);
  for (int i = 0; i < 8; ++i) b.st(Space::Global, Type::F32, at(o, 4 * i), d[i]);
  b.bra(end);
  b.bind(cons);
  b.bar_sync(1, 256);
  Reg v = b.b32(), ga = b.b64();
  b.ld(Space::Shared, Type::U32, v, at(sm, 0));
  b.bar_arrive(2, 256);
  b.mul_wide(Type::U32, ga, tid, imm(4));
  b.op(Op::Add, Type::U64, ga, ga, out);
  b.st(Space::Global, Type::U32, at(ga, 128 * 32 - 512), v);
  b.bind(end);
  b.exit();
  const std::string ptx = std::move(b).emit(80, 90, 256);
  DevBuf dout(128 * 32 + 128 * 4);
  OneOut prm{dout.ptr};
  expect_ok(run(ptx, "k_forms", 256, 4096, &prm, sizeof prm));
  std::vector<uint32_t> w = dout.get<uint32_t>();
  for (int i = 0; i < 128 * 8; ++i) assert_true(bitsf(w[i]) == 32.0f);  // 16 + 16
  for (int i = 128 * 8; i < 128 * 8 + 128; ++i) assert_int_equal(w[i], 0x3c003c00u);
}

// The builder's fp8 wgmma forms run here: e4m3 ones (0x38) in shared memory
// and in A's registers, e5m2 ones (0x3c) for B of the second: D = 32 (ss,
// scale-d 0) + 32 (rs, scale-d a true predicate) + 32 (ss).
void test_builder_fp8_forms(void **) {
  Builder b("k_f8", 8);
  b.set_arch_specific(true);
  fa::ptx::Symbol dyn = b.extern_shared("smem", 1024);
  Reg sm = b.b32(), tid = b.b32(), da = b.b64(), db = b.b64(), out = b.b64();
  b.mov(Type::U32, sm, fa::ptx::sym(dyn));
  b.mov(Type::U32, tid, fa::ptx::sreg(fa::ptx::Special::TidX));
  b.ld_param(Type::U64, out, 0);
  // Bytes 0..2047: e4m3 ones; 2048..4095: e5m2 ones.
  Reg e4 = b.b32(), e5 = b.b32(), addr = b.b32();
  b.mov(Type::U32, e4, imm(0x38383838));
  b.mov(Type::U32, e5, imm(0x3c3c3c3c));
  b.op(Op::MadLo, Type::U32, addr, tid, imm(16), sm);
  b.st_v(Space::Shared, Type::B32, at(addr), {e4, e4, e4, e4});
  b.st_v(Space::Shared, Type::B32, at(addr, 2048), {e5, e5, e5, e5});
  b.fence_proxy_async();
  b.bar_sync(0, 128);
  std::vector<Reg> d(8);
  for (Reg &r : d) r = b.f32();
  Reg a[4] = {e4, e4, e4, e4};
  // No swizzle, LBO 128, SBO 256: A (64 rows) in bytes 0..2047, B (16 rows)
  // at 0 (e4m3) or 2048 (e5m2).
  b.mov(Type::U64, da, imm((int64_t{8} << 16) | (int64_t{16} << 32)));
  b.mov(Type::U64, db, imm(128 | (int64_t{8} << 16) | (int64_t{16} << 32)));
  Reg t = b.pred();
  b.setp(fa::ptx::Cmp::Eq, Type::U32, t, tid, tid);  // true
  b.wgmma_fence();
  b.wgmma_ss_fp8(fa::ptx::Fp8::E4M3, fa::ptx::Fp8::E5M2, 16, d.data(), da, db, imm(0));
  b.wgmma_rs_fp8(fa::ptx::Fp8::E4M3, fa::ptx::Fp8::E5M2, 16, d.data(), a, db, t);
  b.wgmma_ss_fp8(fa::ptx::Fp8::E4M3, fa::ptx::Fp8::E4M3, 16, d.data(), da, da, imm(1));
  b.wgmma_commit();
  b.wgmma_wait(0);
  Reg o = b.b64();
  b.mul_wide(Type::U32, o, tid, imm(32));
  b.op(Op::Add, Type::U64, o, o, out);
  for (int i = 0; i < 8; ++i) b.st(Space::Global, Type::F32, at(o, 4 * i), d[i]);
  b.exit();
  const std::string ptx = std::move(b).emit(80, 90, 128);
  expect_assembles(ptx);
  DevBuf dout(128 * 32);
  OneOut prm{dout.ptr};
  expect_ok(run(ptx, "k_f8", 128, 4096, &prm, sizeof prm));
  std::vector<uint32_t> w = dout.get<uint32_t>();
  for (int i = 0; i < 128 * 8; ++i) assert_true(bitsf(w[i]) == 96.0f);
}

// ====================================================== stmatrix ====
// PTX ISA "stmatrix" (the ldmatrix fragment layout): lane 8j + r gives the
// address of row r of matrix j; lane l's register j holds row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (low half first); with
// .trans, column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1.

struct StmParams {
  uint64_t in, addrs, dump, back;
};

// One warp: registers from `in` (4 per lane), row offsets from `addrs`,
// stmatrix, then ldmatrix of the same rows into `back` (4 per lane, zeros
// past count), and the 2048 bytes of shared memory into `dump`.
std::string stmatrix_kernel(int count, bool trans) {
  const std::string shape = ".x" + std::to_string(count) + (trans ? ".trans" : "");
  std::string src = "{%r10", ld = "{%r20";
  for (int j = 1; j < count; ++j) {
    src += ", %r1" + std::to_string(j);
    ld += ", %r2" + std::to_string(j);
  }
  src += "}";
  ld += "}";
  return std::string(kHopper) + R"(.visible .entry k_stm(.param .align 8 .b8 k_stm_param[32])
{
  .reg .pred %p<4>;
  .reg .b32 %r<40>;
  .reg .b64 %rd<20>;
  .extern .shared .align 1024 .b8 smem[];
  ld.param.u64 %rd1, [k_stm_param+0];
  ld.param.u64 %rd2, [k_stm_param+8];
  ld.param.u64 %rd3, [k_stm_param+16];
  ld.param.u64 %rd4, [k_stm_param+24];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd5, %r1, 16;
  add.s64 %rd6, %rd1, %rd5;
  ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd6];
  mul.wide.u32 %rd7, %r1, 4;
  add.s64 %rd8, %rd2, %rd7;
  ld.global.u32 %r2, [%rd8];
  mov.u32 %r3, smem;
  add.u32 %r4, %r3, %r2;
  mov.u32 %r20, 0;
  mov.u32 %r21, 0;
  mov.u32 %r22, 0;
  mov.u32 %r23, 0;
  stmatrix.sync.aligned.m8n8)" +
         shape + ".shared.b16 [%r4], " + src + R"(; // STM
  ldmatrix.sync.aligned.m8n8)" +
         shape + ".shared.b16 " + ld + R"(, [%r4];
  add.s64 %rd9, %rd4, %rd5;
  st.global.v4.u32 [%rd9], {%r20, %r21, %r22, %r23};
  bar.sync 0;
  mov.u32 %r5, %r1;
$L_dump:
  setp.ge.u32 %p1, %r5, 512;
  @%p1 bra $L_end;
  mad.lo.u32 %r6, %r5, 4, %r3;
  ld.shared.u32 %r7, [%r6];
  mul.wide.u32 %rd10, %r5, 4;
  add.s64 %rd11, %rd3, %rd10;
  st.global.u32 [%rd11], %r7;
  add.u32 %r5, %r5, 32;
  bra $L_dump;
$L_end:
  ret;
}
)";
}

void test_stmatrix(void **) {
  std::mt19937 rng(77);
  for (int count : {1, 2, 4}) {
    for (bool trans : {false, true}) {
      // Rows at distinct, shuffled 16-byte slots of 2 KB; lanes past
      // 8 * count give misaligned addresses, which must be ignored.
      std::vector<uint32_t> slots(128);
      for (uint32_t i = 0; i < 128; ++i) slots[i] = i;
      std::shuffle(slots.begin(), slots.end(), rng);
      std::vector<uint32_t> addrs(32), in(128);
      for (int l = 0; l < 32; ++l) addrs[l] = l < 8 * count ? 16 * slots[l] : 3;
      for (auto &x : in) x = static_cast<uint32_t>(rng());
      DevBuf din(in.size() * 4), dad(128), ddump(2048), dback(512);
      din.put(in);
      dad.put(addrs);
      StmParams prm{din.ptr, dad.ptr, ddump.ptr, dback.ptr};
      expect_ok(run(stmatrix_kernel(count, trans), "k_stm", 32, 2048, &prm, sizeof prm));
      std::vector<uint16_t> dump = ddump.get<uint16_t>();
      std::vector<uint32_t> back = dback.get<uint32_t>();
      std::vector<bool> written(1024, false);
      for (int j = 0; j < count; ++j)
        for (int r = 0; r < 8; ++r)
          for (int c = 0; c < 8; ++c) {
            // The lane and half holding element (r, c) of matrix j.
            const int lane = trans ? 4 * c + r / 2 : 4 * r + c / 2;
            const int half = trans ? r % 2 : c % 2;
            const uint16_t want = static_cast<uint16_t>(in[4 * lane + j] >> (16 * half));
            const uint32_t at = addrs[8 * j + r] / 2 + c;
            written[at] = true;
            if (dump[at] != want) {
              std::fprintf(stderr, "stmatrix x%d%s: matrix %d (%d, %d) = 0x%04x, want 0x%04x\n",
                           count, trans ? ".trans" : "", j, r, c, dump[at], want);
              fail();
            }
          }
      for (int i = 0; i < 1024; ++i)
        if (!written[i]) assert_int_equal(dump[i], 0xffff);  // untouched (0xff fill)
      // ldmatrix of the same rows returns the registers.
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < 4; ++j)
          assert_int_equal(back[4 * l + j], j < count ? in[4 * l + j] : 0);
    }
  }
  // A row address not 16-byte aligned is an error naming the line.
  std::vector<uint32_t> addrs(32);
  for (int l = 0; l < 32; ++l) addrs[l] = 16 * l;
  addrs[5] = 16 * 5 + 8;
  DevBuf din(512), dad(128), ddump(2048), dback(512);
  dad.put(addrs);
  StmParams prm{din.ptr, dad.ptr, ddump.ptr, dback.ptr};
  const std::string ptx = stmatrix_kernel(4, false);
  assert_int_equal(run(ptx, "k_stm", 32, 2048, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("stmatrix.sync.aligned.m8n8.x4.shared.b16 " + at_line(ptx, "// STM"));
  expect_error("misaligned shared address 88");
  // Needs sm_90 and PTX ISA 7.8.
  std::string old = ptx;
  old.replace(old.find(".target sm_90a"), 14, ".target sm_80");
  assert_int_equal(run(old, "k_stm", 32, 2048, &prm, sizeof prm), FA_ERROR_COMPILE);
  expect_error("requires .target sm_90");
  old = ptx;
  old.replace(old.find(".version 8.0"), 12, ".version 7.7");
  assert_int_equal(run(old, "k_stm", 32, 2048, &prm, sizeof prm), FA_ERROR_COMPILE);
  expect_error("requires .version 7.8");
}

// ===================================================== elect.sync ====
// PTX ISA "elect.sync": one leader of membermask (the emulator: its lowest
// lane) gets p = true; d = the leader's lane id in every participant.

struct ElectParams {
  uint64_t out;
  uint32_t mask, pad;
};

// Two warps; lanes outside the mask (or per `skip`, a setp of %p1 on the
// lane id %r3) branch over the elect. Per thread: {d, p} (0xABABABAB, 7
// when skipped).
std::string elect_kernel(const char *dp = "%r5|%p2", const char *skip = nullptr) {
  std::string s = skip ? std::string("  ") + skip + "\n"
                       : "  shr.u32 %r4, %r1, %r3;\n  and.b32 %r4, %r4, 1;\n"
                         "  setp.eq.u32 %p1, %r4, 0;\n";
  return std::string(kHopper) + R"(.visible .entry k_el(.param .align 8 .b8 k_el_param[16])
{
  .reg .pred %p<4>;
  .reg .b32 %r<20>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [k_el_param+0];
  ld.param.u32 %r1, [k_el_param+8];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %laneid;
  mov.u32 %r5, 0xABABABAB;
  mov.u32 %r6, 7;
)" + s + R"(  @%p1 bra $L_skip;
  elect.sync )" +
         dp + R"(, %r1; // ELECT
  selp.u32 %r6, 1, 0, %p2;
$L_skip:
  mul.wide.u32 %rd2, %r2, 8;
  add.s64 %rd3, %rd1, %rd2;
  st.global.v2.u32 [%rd3], {%r5, %r6};
  ret;
}
)";
}

void test_elect_sync(void **) {
  for (uint32_t mask : {0xffffffffu, 0x00f0f0f0u, 0x80000000u, 0x00000001u, 0x0000fffeu}) {
    for (bool sink : {false, true}) {
      DevBuf dout(64 * 8);
      ElectParams prm{dout.ptr, mask, 0};
      expect_ok(run(elect_kernel(sink ? "_|%p2" : "%r5|%p2"), "k_el", 64, 0, &prm, sizeof prm));
      std::vector<uint32_t> v = dout.get<uint32_t>();
      const uint32_t leader = static_cast<uint32_t>(__builtin_ctz(mask));
      for (uint32_t t = 0; t < 64; ++t) {
        const uint32_t lane = t % 32;
        const bool in = (mask >> lane) & 1;
        assert_int_equal(v[2 * t], in && !sink ? leader : 0xABABABABu);
        assert_int_equal(v[2 * t + 1], in ? (lane == leader ? 1u : 0u) : 7u);
      }
    }
  }
  // d alone (p the sink).
  {
    DevBuf dout(64 * 8);
    ElectParams prm{dout.ptr, 0x0000ff00u, 0};
    std::string k = elect_kernel("%r5|_");
    k.replace(k.find("  selp.u32 %r6, 1, 0, %p2;\n"), 27, "");
    expect_ok(run(k, "k_el", 64, 0, &prm, sizeof prm));
    std::vector<uint32_t> v = dout.get<uint32_t>();
    for (uint32_t t = 0; t < 64; ++t)
      assert_int_equal(v[2 * t], (t % 32) / 8 == 1 ? 8u : 0xABABABABu);
  }
  // Divergence: a lane of the mask that never arrives; a lane outside the
  // mask that executes it.
  DevBuf dout(64 * 8);
  ElectParams prm{dout.ptr, 0xffffffffu, 0};
  std::string k = elect_kernel("%r5|%p2", "setp.eq.u32 %p1, %r3, 3;");
  assert_int_equal(run(k, "k_el", 64, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("elect.sync " + at_line(k, "// ELECT") + ": lanes 3 of membermask 0xffffffff");
  prm.mask = 0x0000ffffu;
  k = elect_kernel("%r5|%p2", "setp.eq.u32 %p1, %r3, 99;");
  assert_int_equal(run(k, "k_el", 64, 0, &prm, sizeof prm), FA_ERROR_LAUNCH);
  expect_error("elect.sync " + at_line(k, "// ELECT") +
               ": executing lane 16 is not in membermask 0x0000ffff");
  // Needs sm_90; d must be b32; p a predicate.
  k = elect_kernel();
  k.replace(k.find(".target sm_90a"), 14, ".target sm_80");
  assert_int_equal(run(k, "k_el", 64, 0, &prm, sizeof prm), FA_ERROR_COMPILE);
  expect_error("requires .target sm_90");
  for (const char *bad : {"%rd1|%p2", "%r5|%r6", "%r5"}) {
    k = elect_kernel(bad);
    assert_int_equal(run(k, "k_el", 64, 0, &prm, sizeof prm), FA_ERROR_COMPILE);
  }
}

// ================================================ proxy fences ====
// PTX ISA memory model, "proxies": shared memory written through the
// generic proxy (st.shared) and read through the async proxy (wgmma's
// descriptor operands) needs a fence.proxy.async by the writer in between.

void test_proxy_fence(void **) {
  WgCase c;
  c.n = 16;
  c.wa = c.wb = 0;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<uint16_t> A(64 * 16), B(16 * 16);
  std::vector<float> C(64 * 16, 0.0f);
  for (auto &x : A) x = to_half(false, small(rng) / 4.0f);
  for (auto &x : B) x = to_half(false, small(rng) / 4.0f);
  const char *fence = "  fence.proxy.async.shared::cta;\n";
  auto drop = [&](const std::string &p) {
    std::string q = p;
    q.replace(q.find(fence), std::strlen(fence), "");
    return q;
  };
  // With the writers' fence (the kernel as it is) the result is right.
  std::vector<float> ref = run_wgmma(c, A, B, C);
  // Without it: an error naming the wgmma and the store.
  std::string ptx;
  run_wgmma(c, A, B, C, drop, FA_ERROR_LAUNCH, &ptx);
  expect_error("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " +
               at_line(ptx, "wgmma.mma_async"));
  expect_error("its generic-proxy write by st.shared.v4.u32 " + at_line(ptx, "st.shared.v4"));
  expect_error("fence.proxy.async");
  // Only thread 0 fences: the other writers' bytes are still unfenced.
  auto only0 = [&](const std::string &p) {
    std::string q = p;
    q.replace(q.find(fence), std::strlen(fence),
              "  setp.eq.u32 %p3, %r1, 0;\n  @%p3 fence.proxy.async.shared::cta;\n");
    return q;
  };
  run_wgmma(c, A, B, C, only0, FA_ERROR_LAUNCH, &ptx);
  expect_error("(thread (");
  // The fence before the barrier (each writer, after its stores) is as good.
  auto before = [&](const std::string &p) {
    std::string q = drop(p);
    q.replace(q.find("  bar.sync 0;\n"), 14, "  fence.proxy.async;\n  bar.sync 0;\n");
    return q;
  };
  std::vector<float> got = run_wgmma(c, A, B, C, before);
  for (size_t i = 0; i < ref.size(); ++i) assert_true(got[i] == ref[i]);
  // Another fence form (fence.proxy.async.global) does not order shared memory.
  auto global = [&](const std::string &p) {
    std::string q = p;
    q.replace(q.find(fence), std::strlen(fence), "  fence.proxy.async.global;\n");
    return q;
  };
  run_wgmma(c, A, B, C, global, FA_ERROR_LAUNCH);
  expect_error("is read through the async proxy");
  // cp.async is a generic-proxy write too: the same copy by cp.async needs
  // the fence as well.
  auto by_cp_async = [&](const std::string &p) {
    std::string q = p;
    const char *ld = "  ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd31];\n";
    const char *st = "  st.shared.v4.u32 [%r10], {%r5, %r6, %r7, %r8};\n";
    q.replace(q.find(ld), std::strlen(ld), "");
    q.replace(q.find(st), std::strlen(st), "  cp.async.cg.shared.global [%r10], [%rd31], 16;\n");
    q.replace(q.find("$L_copied:\n"), 11, "$L_copied:\n  cp.async.wait_all;\n");
    return q;
  };
  got = run_wgmma(c, A, B, C, by_cp_async);
  for (size_t i = 0; i < ref.size(); ++i) assert_true(got[i] == ref[i]);
  run_wgmma(
      c, A, B, C, [&](const std::string &p) { return drop(by_cp_async(p)); }, FA_ERROR_LAUNCH,
      &ptx);
  expect_error("its generic-proxy write by cp.async.cg.shared.global " +
               at_line(ptx, "cp.async.cg"));
}

// ================================================ profile counters ====
// cp.async.bulk.tensor loads count as global loads (and as TMA): the box
// rows inside the tensor, 32-byte sectors; wgmma's shared operands count
// bytes and 128-byte lines.

void test_profile_tma_wgmma(void **) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  // 64 x 8 bf16 (128-byte rows); a box of 64 x 8 inside: 1024 bytes, 32 sectors.
  fa::emu::TensorMap m = make_map(0, {64, 8}, {64, 8}, 2, fa::emu::TmaSwizzle::None);
  std::vector<uint8_t> g(tensor_bytes(m), 1);
  DevBuf dg(g.size());
  dg.put(g);
  m.base = dg.ptr;
  struct Case {
    int32_t x, y;
    uint64_t bytes, sectors;
  } cases[] = {
      {0, 0, 1024, 32},
      // Columns -16..47 and rows 4..11: 48 columns (96 bytes, 3 sectors) of 4 rows.
      {-16, 4, 4 * 96, 4 * 3},
      // Columns 8..71, rows -7..0: 56 columns from byte 16 (112 bytes, 4 sectors) of 1 row.
      {8, -7, 112, 4},
  };
  for (const Case &k : cases) {
    run_tma(m, {k.x, k.y}, 1024);
    fa::emu::LaunchProfile p;
    assert_int_equal(g_be->last_profile(&p), FA_SUCCESS);
    const fa::emu::MemCounters &t = p.total;
    assert_int_equal(t.tma_requests, 1);
    assert_int_equal(t.tma_bytes, k.bytes);
    assert_int_equal(t.tma_sectors, k.sectors);
    // The kernel's other global loads are none: TMA is all of them.
    assert_int_equal(t.global_load_requests, 1);
    assert_int_equal(t.global_load_sectors, k.sectors);
    assert_int_equal(t.global_load_bytes, k.bytes);
    assert_int_equal(t.wgmma_requests, 0);
  }
  // wgmma m64n16k16 from dense no-swizzle tiles: A 2048 + B 512 bytes, 16 +
  // 4 lines of 128 bytes; the issue is one request.
  WgCase c;
  c.n = 16;
  c.wa = c.wb = 0;
  std::vector<uint16_t> A(64 * 16, 0), B(16 * 16, 0);
  std::vector<float> C(64 * 16, 0.0f);
  run_wgmma(c, A, B, C);
  fa::emu::LaunchProfile p;
  assert_int_equal(g_be->last_profile(&p), FA_SUCCESS);
  assert_int_equal(p.total.wgmma_requests, 1);
  assert_int_equal(p.total.wgmma_shared_bytes, 2048 + 512);
  assert_int_equal(p.total.wgmma_shared_wavefronts, 16 + 4);
  assert_int_equal(p.total.tma_requests, 0);
  unsetenv("FLASHATTN_EMU_PROFILE");
}

// The builder's stmatrix and elect_sync on the emulator: lane l's register
// holds halves l and l + 1 (matrix elements (l / 4, 2 (l % 4)) and the next);
// the lane elected from 0xfffffff0 (lane 4) stores its id and row 1 as read
// back, the one elected from the full warp (lane 0) its lane id.
void test_builder_stmatrix_elect(void **) {
  Builder b("k_bse", 8);
  b.set_arch_specific(true);
  fa::ptx::Symbol sm = b.shared("sm", 16, 128);
  Reg lane = b.b32(), v = b.b32(), a = b.b32(), base = b.b32(), id = b.b32(), out = b.b64();
  Reg p = b.pred(), q = b.pred();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, lane, fa::ptx::sreg(fa::ptx::Special::LaneId));
  b.op(Op::MadLo, Type::U32, v, lane, imm(0x10001), imm(0x10000));  // halves l, l + 1
  b.mov(Type::U32, base, fa::ptx::sym(sm));
  b.op(Op::MadLo, Type::U32, a, lane, imm(16), base);
  Reg r[1] = {v};
  b.stmatrix(false, r, 1, at(a));
  b.elect_sync(p, 0xffffffffu);
  fa::ptx::Label skip = b.label(), end = b.label();
  b.setp(fa::ptx::Cmp::Lt, Type::U32, q, lane, imm(4));
  b.when(q).bra(skip);
  b.elect_sync(id, q, 0xfffffff0u);
  Reg w[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  b.ld_v(Space::Shared, Type::U32, {w[0], w[1], w[2], w[3]}, at(base, 16));  // row 1
  b.when(q).st_v(Space::Global, Type::U32, at(out), {id, w[0], w[1], w[2]});
  b.bra(end);
  b.bind(skip);
  b.when(p).st(Space::Global, Type::U32, at(out, 16), lane);
  b.bind(end);
  b.exit();
  const std::string ptx = std::move(b).emit(80, 90, 32);
  DevBuf dout(32);
  OneOut prm{dout.ptr};
  expect_ok(run(ptx, "k_bse", 32, 0, &prm, sizeof prm));
  std::vector<uint32_t> g = dout.get<uint32_t>();
  assert_int_equal(g[0], 4);  // lowest lane of 0xfffffff0
  // Row 1 of the matrix: lanes 4..7 hold its columns (2t, 2t + 1) = (l, l + 1).
  assert_int_equal(g[1], 4u | 5u << 16);
  assert_int_equal(g[2], 5u | 6u << 16);
  assert_int_equal(g[3], 6u | 7u << 16);
  assert_int_equal(g[4], 0);  // lane 0 of the full mask
}

void test_parse_errors(void **) {
  const char *bad[] = {
      "wgmma.mma_async.sync.aligned.m64n12k16.f32.f16.f16 {%f0, %f1, %f2, %f3, %f4, %f5}, %rd1, "
      "%rd1, 1, 1, 1, 0, 0;",
      "wgmma.mma_async.sync.aligned.m64n8k16.f16.f16.f16 {%r0, %r1}, %rd1, %rd1, 1, 1, 1, 0, 0;",
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0, %f1, %f2, %f3}, %rd1, %rd1, 2, 1, "
      "1, "
      "0, 0;",
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0, %f1, %f2, %f3}, %rd1, %rd1, 1, 2, "
      "1, "
      "0, 0;",
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0, %f1, %f2}, %rd1, %rd1, 1, 1, 1, 0, "
      "0;",
      "wgmma.wait_group.sync.aligned %r1;",
      "mbarrier.try_wait.shared::cta.b64 %p1, [%r1], %rd1;",
      "mbarrier.test_wait.parity.shared::cta.b64 %p1, [%r1], 0;",
      "mbarrier.init.b64 [%rd1], 1;",
      "mbarrier.init.shared::cta.b64 [%r1], 0;",
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, "
      "{%r1}], [%r1];",
      "cp.async.bulk.tensor.6d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, "
      "{%r1}], [%r1];",
      "cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%rd1, {%r1}], [%r1];",
      "cvta.const.u64 %rd1, %rd1;",
      "stmatrix.sync.aligned.m8n8.x3.shared.b16 [%r1], {%r1, %r2, %r3};",
      "stmatrix.sync.aligned.m16n8.x1.trans.shared.b8 [%r1], {%r1};",
      "stmatrix.sync.aligned.m8n8.x1.shared.b16 {%r1}, [%r1];",
      "elect.sync %r1, 0xffffffff;",
      "elect.sync %rd1|%p1, %r1;",
      "elect.sync %r1|%r2, %r1;",
      "elect.any.sync %r1|%p1, %r1;",
  };
  for (const char *b : bad) {
    std::string p = std::string(kHopper) +
                    ".visible .entry k_bad()\n{\n  .reg .pred %p<4>;\n  .reg .b32 %r<4>;\n"
                    "  .reg .f32 %f<8>;\n  .reg .b64 %rd<4>;\n  " +
                    b + "\n}\n";
    fa_status st = run(p, "k_bad", 128, 0, nullptr, 0);
    if (st != FA_ERROR_COMPILE) std::fprintf(stderr, "accepted: %s\n", b);
    assert_int_equal(st, FA_ERROR_COMPILE);
    expect_error("line 10: ");
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wgmma_ss),
      cmocka_unit_test(test_wgmma_layouts),
      cmocka_unit_test(test_wgmma_rs),
      cmocka_unit_test(test_wgmma_markers),
      cmocka_unit_test(test_wgmma_fp8_ss),
      cmocka_unit_test(test_wgmma_fp8_layouts),
      cmocka_unit_test(test_wgmma_fp8_rs),
      cmocka_unit_test(test_wgmma_fp8_fragment),
      cmocka_unit_test(test_wgmma_fp8_checks),
      cmocka_unit_test(test_wgmma_fp8_parse),
      cmocka_unit_test(test_wgmma_async_rules),
      cmocka_unit_test(test_setmaxnreg),
      cmocka_unit_test(test_mbarrier_phases),
      cmocka_unit_test(test_tma_boxes),
      cmocka_unit_test(test_tma_visibility),
      cmocka_unit_test(test_tma_faults),
      cmocka_unit_test(test_tma_tx_mismatch),
      cmocka_unit_test(test_named_barriers),
      cmocka_unit_test(test_generic_addresses),
      cmocka_unit_test(test_targets),
      cmocka_unit_test(test_producer_consumer),
      cmocka_unit_test(test_builder_forms),
      cmocka_unit_test(test_builder_fp8_forms),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_stmatrix),
      cmocka_unit_test(test_elect_sync),
      cmocka_unit_test(test_proxy_fence),
      cmocka_unit_test(test_profile_tma_wgmma),
      cmocka_unit_test(test_builder_stmatrix_elect),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<90>, emu_teardown);
}
