// The tile primitives of src/kernels/tile (the contract every mma.sync
// generator composes), each built into a small kernel and run on the
// emulator, checked element by element against the layouts tile.h states:
//  - ldsm_base + ldsm (roles A, B_NK, B_KN_T) + mma + pack_a: C = A B^T over
//    two m-tiles, then D = P V with P packed from C's fragments, vs fp64;
//  - CopyPlan: interior and boundary copies (tail rows zero-filled) and the
//    zeroed head-dim padding, for row chunk counts that are and are not
//    powers of two, 4 and 8 warps, and a plan sharing another's registers;
//  - the fp8 KV decode's operands (mode (a)): a warp's tile of fp8 bytes
//    (e4m3, e5m2, every code) copied by a CopyPlan into a byte_tile (its
//    padded pitch), read by byte ldmatrix .x4 / .x2 and converted in
//    registers by b_frag_fp8_nk (K, kperm order) and b_frags_fp8_kn (V,
//    even and odd columns), every f16 against the byte the layout names;
//    kperm_rows + ldsm Role::A: the kperm A fragments, bit for bit;
//    st_acc_row's columns (Natural, EvenOdd, acc_col) against the layouts,
//    unstored columns poison;
//  - rows_bf16_to_f16: a 16-row bf16 tile over 60 binades (zero rows, NaN,
//    infinities, values f16 cannot hold) rewritten as row-scaled f16 by 1, 2
//    and 4 warps, every element and every lane's 2^-k against the rule;
//  - rows_to_e4m3 (sm_89): bf16 and f16 tiles (zero rows, NaN, infinities,
//    a maximum with mantissa past 1.75) quantised to e4m3 bytes by 1 and 4
//    warps, every byte and 2^-k against the rule;
//  - mma_fp8 (sm_89): a 16 x 64 fp8 A and an 8 x 64 fp8 B tile read with
//    ldmatrix (.x4 via ldsm Role::A, .x2) into two m16n8k32 steps, all four
//    e4m3/e5m2 pairs, random codes with subnormals and the largest finite,
//    against the emulator's f32 summation model exactly and within gamma_64
//    of the exact sum;
//  - the fp8 P V (sm_89): an f32 P of 16 x 32 / 64 keys (hand-rounded
//    values: ties, zeros, 256, e4m3 subnormals, saturation) packed by
//    pack_a_fp8, an fp8 V of one and two 16-byte chunks read by ldsm
//    Role::B_KN_T8 and split by v_frags_fp8 (prmt), mma_fp8 (V e4m3 and
//    e5m2): every O element at the column tile.h gives it, exact against
//    the emulator's f32 model in the permuted key order and within gamma_64
//    of the exact sum;
//  - OnlineSoftmax: tiles of scores with masked (-inf) keys, a row that
//    never sees a key, and maxima growing by more and by less than the
//    rescale threshold, against one softmax over all tiles in fp64; its
//    fp8_form(): every p after each step against 2^((s - m) c + 8) with the
//    running maximum, at most 256 and 256 at the maximum once in e4m3, and
//    O and LSE (with and without a sink, and of an empty row) those of the
//    default form and of fp64;
//  - the key-range schedule (key_range, lean_hi, key_loop) and row_range:
//    random CTAs with and without causal masking and windows, block_n a
//    power of two and not, every visited tile and its masked/lean kind and
//    every row's range against the definitions;
//  - TileScheduler (the persistent forward's order): every work item once,
//    sections of whole KV heads sized for L2, pairs adjacent, longest
//    m-blocks first, the PTX decode equal to the host's (Schedule);
//  - WorkScheduler (varlen by work): the prefix built by a warp from
//    cu_seqlens, every real item once and no padded one, sequences in
//    order, the padded fallback above kWorkBatchMax, PTX = host;
//  - Ring (sm_90 mbarriers): a producer and a consumer warp pass tiles
//    through 2 and 3 stages, wrapping, every tile whole and in order;
//  - Swizzle128: the 128-byte swizzle's addresses against its formula, a
//    permutation of each atom row, the rows-4-apart XOR, the descriptor
//    bits; store_acc (stmatrix) of a 16 x 80 tile into it, f16 and bf16,
//    from the tile and from pack_acc's words.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "kernels/codegen.h"
#include "kernels/tile/key_range.h"
#include "kernels/tile/ring.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/scheduler.h"
#include "kernels/tile/swizzle.h"
#include "kernels/tile/tile.h"
#include "reference.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;
using fa::kgen::Emitter;
using fa::ptx::at;
using fa::ptx::Builder;
using fa::ptx::fimm;
using fa::ptx::imm;
using fa::ptx::Op;
using fa::ptx::Reg;
using fa::ptx::Space;
using fa::ptx::Type;
namespace tile = fa::kgen::tile;

constexpr int kPtrs = 8;
struct Ptrs {
  uint64_t p[kPtrs];
};

// A kernel of `threads` threads; body(e, tid, smem, pointers).
template <typename Body>
std::string kernel(int threads, Body body, int ptx_version = 70, int sm = 80) {
  Builder b("k_tile", sizeof(Ptrs));
  Emitter e(b);
  Reg g[kPtrs];
  for (int i = 0; i < kPtrs; ++i) g[i] = e.global_param(8 * i);
  Reg tid = e.mov(Type::U32, fa::ptx::sreg(fa::ptx::Special::TidX));
  Reg smem = e.mov(Type::U32, fa::ptx::sym(b.extern_shared("smem", 16)));
  body(e, tid, smem, g);
  b.exit();
  return std::move(b).emit(ptx_version, sm, static_cast<uint32_t>(threads));
}

fa_status launch(const std::string &ptx, int threads, uint32_t smem, const Ptrs &p) {
  fa_status st = run_ptx(ptx, "k_tile", geom(1, threads, smem), &p, sizeof p);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  return st;
}

uint16_t h(float v) { return fa::emu::f32_to_f16_rn(v); }
float hf(uint16_t x) { return fa::emu::f16_to_f32(x); }

// Stores an f32 accumulator tile (m-tile mi) at rows 16 mi + g + 8 (i / 2),
// columns 8 j + 2 q + (i & 1) of a row-major [.][cols] buffer: the layout
// tile.h states for AccTile.
void store_acc(Emitter &e, const tile::Lanes &ln, const tile::AccTile &t, int mi, Reg dst,
               int cols) {
  Builder &b = e.b;
  for (int j = 0; j < t.n(); ++j)
    for (int i = 0; i < 4; ++i) {
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(16 * mi + 8 * (i / 2)));
      Reg col = e.op(Op::MadLo, Type::U32, ln.q, imm(2), imm(8 * j + (i & 1)));
      Reg idx = e.op(Op::MadLo, Type::U32, row, imm(cols), col);
      b.st(Space::Global, Type::F32, at(e.index(dst, idx, 4)), t.f[j][i]);
    }
}

// ----------------------------------------------------------------- mma ---

void test_mma_fragments(void **) {
  const int M = 32, N = 32, K = 32, NV = 16;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<uint16_t> a(M * K), bt(N * K), v(N * NV), at_(K * M);
  for (auto &x : a) x = h(float(small(gen)) / 4);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) at_[k * M + m] = a[m * K + k];  // A stored [k][m] (Role::A_T)
  for (auto &x : bt) x = h(float(small(gen)) / 4);
  for (auto &x : v) x = h(float(small(gen)) / 4);
  const tile::SmemTile ta = tile::smem_tile(0, M, K), tb = tile::smem_tile(ta.bytes(), N, K),
                       tv = tile::smem_tile(tb.offset + tb.bytes(), N, NV),
                       tat = tile::smem_tile(tv.offset + tv.bytes(), K, M);
  const uint32_t smem_bytes = tat.offset + tat.bytes();
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    // Lane r copies row r of each matrix into its padded shared tile.
    auto fill = [&](const tile::SmemTile &t, Reg src) {
      Reg w = b.b32();
      Reg row = e.index(src, tid, t.cols * 2);
      Reg sa = e.op(Op::MadLo, Type::U32, tid, imm(t.pitch), smem);
      for (int c = 0; c < t.cols / 2; ++c) {
        b.ld(Space::Global, Type::U32, w, at(row, 4 * c));
        b.st(Space::Shared, Type::B32, at(sa, static_cast<int>(t.offset) + 4 * c), w);
      }
    };
    fill(ta, g[0]);
    fill(tb, g[1]);
    fill(tv, g[2]);
    fill(tat, g[5]);
    b.bar_sync();
    Reg la = tile::ldsm_base(e, ln, ta, tile::Role::A, smem, Reg());
    Reg lat = tile::ldsm_base(e, ln, tat, tile::Role::A_T, smem, Reg());
    Reg lb = tile::ldsm_base(e, ln, tb, tile::Role::B_NK, smem, Reg());
    Reg lv = tile::ldsm_base(e, ln, tv, tile::Role::B_KN_T, smem, Reg());
    tile::Frag4 fa = tile::frag4(b), fb = tile::frag4(b), pa = tile::frag4(b);
    for (int mi = 0; mi < 2; ++mi) {
      tile::AccTile c = tile::acc_tile(b, N / 8), d = tile::acc_tile(b, NV / 8);
      tile::zero(b, c);
      tile::zero(b, d);
      for (int ks = 0; ks < K / 16; ++ks) {
        tile::ldsm(b, tile::Role::A, fa, la, ta.at(16 * mi, 16 * ks));
        for (int jp = 0; jp < N / 16; ++jp) {
          tile::ldsm(b, tile::Role::B_NK, fb, lb, tb.at(16 * jp, 16 * ks));
          tile::mma(b, Type::F16, c, 2 * jp, fa, &fb[0]);
          tile::mma(b, Type::F16, c, 2 * jp + 1, fa, &fb[2]);
        }
      }
      store_acc(e, ln, c, mi, g[3], N);
      for (int t = 0; t < N / 16; ++t) {
        tile::pack_a(b, Type::F16, c, 2 * t, pa);
        tile::ldsm(b, tile::Role::B_KN_T, fb, lv, tv.at(16 * t, 0));
        tile::mma(b, Type::F16, d, 0, pa, &fb[0]);
        tile::mma(b, Type::F16, d, 1, pa, &fb[2]);
      }
      store_acc(e, ln, d, mi, g[4], NV);
      // The same C with A's fragments read from its transpose (Role::A_T):
      // stored over d's rows' second copy, g[6].
      tile::zero(b, c);
      for (int ks = 0; ks < K / 16; ++ks) {
        tile::ldsm(b, tile::Role::A_T, fa, lat, tat.at(16 * ks, 16 * mi));
        for (int jp = 0; jp < N / 16; ++jp) {
          tile::ldsm(b, tile::Role::B_NK, fb, lb, tb.at(16 * jp, 16 * ks));
          tile::mma(b, Type::F16, c, 2 * jp, fa, &fb[0]);
          tile::mma(b, Type::F16, c, 2 * jp + 1, fa, &fb[2]);
        }
      }
      store_acc(e, ln, c, mi, g[6], N);
    }
  });
  DevBuf da(a.size() * 2), db(bt.size() * 2), dv(v.size() * 2), dc(M * N * 4), dd(M * NV * 4),
      dat(at_.size() * 2), dc2(M * N * 4);
  da.put(a);
  db.put(bt);
  dv.put(v);
  dat.put(at_);
  Ptrs p = {{da.ptr, db.ptr, dv.ptr, dc.ptr, dd.ptr, dat.ptr, dc2.ptr}};
  assert_int_equal(launch(ptx, 32, smem_bytes, p), FA_SUCCESS);
  const std::vector<float> c = dc.get<float>(), d = dd.get<float>(), c2 = dc2.get<float>();
  assert_true(c2 == c);  // Role::A_T reads the same A fragments
  int bad = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double want = 0;  // exact: small multiples of 1/16 in fp32
      for (int k = 0; k < K; ++k) want += double(hf(a[m * K + k])) * hf(bt[n * K + k]);
      bad += c[m * N + n] != float(want);
    }
    for (int n = 0; n < NV; ++n) {
      double want = 0;  // P = C rounded to f16 (exact here)
      for (int k = 0; k < N; ++k) want += double(hf(h(c[m * N + k]))) * hf(v[k * NV + n]);
      bad += std::fabs(d[m * NV + n] - want) > 1e-3;
    }
  }
  assert_int_equal(bad, 0);
}

// ---------------------------------------------------------------- copies --

// Copies a rows x cols tile (row stride `stride` elements) with a CopyPlan
// into shared memory, interior or boundary (rows >= rows_left zero-filled),
// then dumps the whole padded shared tile (pitch bytes per row) to global.
void check_copy(int rows, int cols, int threads, bool boundary, int rows_left, bool share) {
  const int stride = cols + 24;
  // A second and a third tile after the first, filled through plans sharing
  // the previous plan's registers when `share` (a chain: t2's plan shares
  // t1's, which shares t0's) when three tiles fit in sm_80's shared memory.
  const tile::SmemTile t0 = tile::smem_tile(0, rows, cols);
  const tile::SmemTile t1 = tile::smem_tile(t0.bytes(), rows, cols);
  const tile::SmemTile t2 = tile::smem_tile(t1.offset + t1.bytes(), rows, cols);
  const bool three = t2.offset + t2.bytes() <= 160 * 1024;
  std::vector<tile::SmemTile> tiles = {t0, t1};
  if (three) tiles.push_back(t2);
  const uint32_t smem_bytes = tiles.back().offset + tiles.back().bytes();
  std::vector<uint16_t> src(size_t(rows) * stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(0x1000 + i % 0xe000);
  const std::string ptx = kernel(threads, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
    Builder &b = e.b;
    Reg sb = e.mov(Type::S64, imm(int64_t(stride) * 2));
    // Poison shared memory first, so every byte read back was written.
    Reg poison = e.mov(Type::B32, imm(0x7e7e7e7e));
    for (uint32_t o = 0; o < smem_bytes; o += 4u * threads) {
      Reg a = e.op(Op::MadLo, Type::U32, tid, imm(4), smem);
      Reg in = e.setp(fa::ptx::Cmp::Lt, Type::U32, e.op(Op::MadLo, Type::U32, tid, imm(4), imm(o)),
                      imm(smem_bytes));
      b.when(in).st(Space::Shared, Type::B32, at(a, static_cast<int>(o)), poison);
    }
    b.bar_sync();
    tile::CopyPlan p0(e, tid, threads, t0, smem, sb);
    tile::CopyPlan p1(e, tid, threads, t1, smem, sb, share ? &p0 : nullptr);
    tile::CopyPlan p2(e, tid, threads, t2, smem, sb, share ? &p1 : nullptr);
    std::vector<const tile::CopyPlan *> plans = {&p0, &p1};
    if (three) plans.push_back(&p2);
    for (const tile::CopyPlan *p : plans) p->zero_padding();
    for (const tile::CopyPlan *p : plans) {
      Reg tp = e.op(Op::Add, Type::S64, g[0], p->base_offset());
      if (boundary)
        p->boundary(tp, e.mov(Type::S32, imm(rows_left)), g[0]);
      else
        p->interior(tp);
    }
    b.cp_async_commit();
    b.cp_async_wait(0);
    b.bar_sync();
    Reg w = b.b32();
    for (uint32_t o = 0; o < smem_bytes; o += 4u * threads) {
      Reg off = e.op(Op::MadLo, Type::U32, tid, imm(4), imm(o));
      Reg in = e.setp(fa::ptx::Cmp::Lt, Type::U32, off, imm(smem_bytes));
      Reg sa = e.op(Op::Add, Type::U32, smem, off), ga = e.index(g[1], off, 1);
      b.when(in).ld(Space::Shared, Type::U32, w, at(sa));
      b.when(in).st(Space::Global, Type::B32, at(ga), w);
    }
  });
  DevBuf ds(src.size() * 2), dout(smem_bytes);
  ds.put(src);
  Ptrs p = {{ds.ptr, dout.ptr, 0, 0, 0, 0}};
  assert_int_equal(launch(ptx, threads, smem_bytes, p), FA_SUCCESS);
  const std::vector<uint16_t> got = dout.get<uint16_t>();
  int bad = 0;
  for (const tile::SmemTile &t : tiles) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < t.cols_pad; ++c) {
        const uint16_t g = got[(t.offset + size_t(t.at(r, c))) / 2];
        uint16_t want = 0;  // padding columns and zero-filled rows
        if (c < cols && !(boundary && r >= rows_left)) want = src[size_t(r) * stride + c];
        if (g != want) {
          if (bad < 5)
            std::fprintf(stderr, "rows %d cols %d threads %d: tile@%u (%d, %d) = %04x, want %04x\n",
                         rows, cols, threads, t.offset, r, c, g, want);
          ++bad;
        }
      }
    }
  }
  assert_int_equal(bad, 0);
}

void test_copy_plans(void **) {
  // Row chunks (cols_pad / 8): 2, 6 (with a padding chunk), 8, 10, 16, 24,
  // 32, so L (threads per row) = 2 .. 32 and J (chunks each) = 1 .. 5.
  const int cols[] = {8, 40, 64, 72, 128, 192, 256};
  for (int c : cols) {
    for (int threads : {128, 256}) {
      check_copy(64, c, threads, false, 0, c % 3 == 0);
      check_copy(64, c, threads, true, 37, c % 3 != 0);
      check_copy(128, c, threads, true, 1, true);
    }
  }
  check_copy(16, 40, 128, true, 0, false);  // every row zero-filled
}

// ------------------------------------------------------------ fp8 tiles ---

// One warp, the fp8 KV decode's operands (mode (a)): a 16 x bytes tile of
// fp8 codes (every code, NaN included) copied by a CopyPlan into a
// byte_tile at a stage offset (its padded pitch), read by byte ldmatrix
// (Role::A addressing: .x4 per 32 bytes, .x2 for a last lone 16) and
// converted in registers: non-transposed into K's B fragments
// (b_frag_fp8_nk), .trans into V's even and odd B fragments
// (b_frags_fp8_kn). Every lane's every f16 against the fp8 value of the
// byte the layout of tile.h names; the destination poisoned.
void check_fp8_frags(int bytes, bool e5m2) {
  const int rows = 16, chunks = bytes / 16;
  const tile::SmemTile t0 = tile::byte_tile(0, rows, bytes);
  assert_true(t0.pitch % 16 == 0 && t0.pitch / 16 % 2 == 1 && t0.pitch >= bytes);
  const uint32_t stage = t0.bytes();  // the tile sits in stage 1
  tile::SmemTile src = t0;
  src.offset += stage;
  std::vector<uint8_t> codes(size_t(rows) * bytes);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + 11) & 0xff);
  // Per lane: K then V, 4 b32 (2 n8 blocks x 2 registers; even[2], odd[2])
  // per 16-byte chunk.
  const int per_lane = 2 * chunks * 4;
  const std::string ptx = kernel(
      32,
      [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
        Builder &b = e.b;
        const tile::Lanes ln = tile::make_lanes(e, tid);
        Reg sb = e.mov(Type::S64, imm(bytes));
        tile::CopyPlan plan(e, tid, 32, src, smem, sb);
        plan.interior(e.op(Op::Add, Type::S64, g[0], plan.base_offset()));
        b.cp_async_commit();
        b.cp_async_wait(0);
        b.bar_warp_sync(0xffffffffu);
        Reg base = tile::ldsm_base(e, ln, t0, tile::Role::A, smem, Reg());
        Reg out = e.index(g[1], tid, 4 * per_lane);
        tile::Frag4 r = tile::frag4(b);
        Reg f[2][2] = {{b.b32(), b.b32()}, {b.b32(), b.b32()}};
        for (int trans = 0; trans < 2; ++trans)
          for (int cp = 0; 2 * cp < chunks; ++cp) {
            const int nc = std::min(2, chunks - 2 * cp);
            tile::ldsm(b, trans ? tile::Role::B_KN_T : tile::Role::A, r, base,
                       static_cast<int>(stage) + t0.at(0, 16 * cp), 2 * nc);
            for (int c = 0; c < nc; ++c) {
              if (trans) {
                tile::b_frags_fp8_kn(b, e5m2, r[2 * c], r[2 * c + 1], f[0], f[1]);
              } else {
                tile::b_frag_fp8_nk(b, e5m2, r[2 * c], f[0]);
                tile::b_frag_fp8_nk(b, e5m2, r[2 * c + 1], f[1]);
              }
              b.st_v(Space::Global, Type::B32, at(out, 16 * (trans * chunks + 2 * cp + c)),
                     {f[0][0], f[0][1], f[1][0], f[1][1]});
            }
          }
      },
      81, 89);
  DevBuf ds(codes.size()), dout(size_t(32) * per_lane * 4);
  ds.put(codes);
  Ptrs p = {{ds.ptr, dout.ptr, 0, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, stage + src.bytes(), p), FA_SUCCESS);
  const std::vector<uint16_t> got = dout.get<uint16_t>();
  int bad = 0;
  auto check = [&](const char *what, int lane, int c, int reg, int half, int row, int byte) {
    const uint8_t code = codes[size_t(row) * bytes + byte];
    const double want = fa::ref::fp8_to_double(code, e5m2);
    const size_t idx = size_t(lane) * per_lane * 2 + size_t(what[0] == 'V') * chunks * 8 +
                       size_t(c) * 8 + size_t(reg) * 2 + half;
    const double gv = fa::ref::f16_to_f32(got[idx]);
    const bool ok = std::isnan(want) ? std::isnan(gv) : gv == want;
    if (!ok && bad++ < 5)
      std::fprintf(stderr,
                   "%d bytes %s %s: lane %d chunk %d reg %d half %d = %g, want %g "
                   "(row %d byte %d code %02x)\n",
                   bytes, e5m2 ? "e5m2" : "e4m3", what, lane, c, reg, half, gv, want, row, byte,
                   code);
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int gq = lane / 4, q = lane % 4;
    for (int c = 0; c < chunks; ++c)
      for (int x = 0; x < 2; ++x)
        for (int h = 0; h < 2; ++h) {
          for (int j = 0; j < 2; ++j)  // K: n8 block j, row (key) 8j + g; kperm column
            check("K", lane, c, 2 * j + x, h, 8 * j + gq, 16 * c + 4 * q + 2 * x + h);
          for (int odd = 0; odd < 2; ++odd)  // V: key 8x + 2q + h, column 2g (+ 1)
            check("V", lane, c, 2 * odd + x, h, 8 * x + 2 * q + h, 16 * c + 2 * gq + odd);
        }
  }
  assert_int_equal(bad, 0);
}

// One warp: a 16 x cols tile of 16-bit patterns (a SmemTile at an offset)
// rewritten by kperm_rows (16 x cols / 16 chunks over 32 threads: a last
// round guarded or not), then read chunk by chunk with ldsm Role::A; every
// lane's every half against the kperm A layout of tile.h (bit for bit);
// the destination poisoned.
void check_kperm_rows(int cols) {
  const tile::SmemTile t = tile::smem_tile(48, 16, cols);
  const int chunks = t.cols_pad / 16;
  std::vector<uint16_t> v(size_t(16) * t.cols_pad);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 40503u + 7);
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    Reg w = b.b32();
    for (int r = 0; r < 16; ++r)  // lane l copies b32 l, l + 32, .. of each row
      for (int c = 0; c * 32 < t.cols_pad / 2; ++c) {
        Reg col = e.op(Op::Add, Type::U32, tid, imm(32 * c));
        Reg in = e.setp(fa::ptx::Cmp::Lt, Type::U32, col, imm(t.cols_pad / 2));
        b.when(in).ld(Space::Global, Type::U32, w, at(e.index(g[0], col, 4), 2 * r * t.cols_pad));
        Reg sa = e.op(Op::MadLo, Type::U32, col, imm(4), smem);
        b.when(in).st(Space::Shared, Type::B32, at(sa, static_cast<int>(t.offset) + r * t.pitch),
                      w);
      }
    b.bar_sync();
    tile::kperm_rows(e, tid, 32, t, smem);
    b.bar_sync();
    Reg base = tile::ldsm_base(e, ln, t, tile::Role::A, smem, Reg());
    tile::Frag4 a = tile::frag4(b);
    Reg out = e.index(g[1], tid, 16 * chunks);
    for (int c = 0; c < chunks; ++c) {
      tile::ldsm(b, tile::Role::A, a, base, t.at(0, 16 * c));
      b.st_v(Space::Global, Type::B32, at(out, 16 * c), {a[0], a[1], a[2], a[3]});
    }
  });
  DevBuf dv(v.size() * 2), dout(size_t(32) * chunks * 16);
  dv.put(v);
  Ptrs p = {{dv.ptr, dout.ptr, 0, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, t.offset + t.bytes(), p), FA_SUCCESS);
  const std::vector<uint16_t> got = dout.get<uint16_t>();
  int bad = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int c = 0; c < chunks; ++c)
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) {
          const int row = lane / 4 + 8 * (r % 2), col = 16 * c + 4 * (lane % 4) + 2 * (r / 2) + h;
          const uint16_t want = v[size_t(row) * t.cols_pad + col];
          const uint16_t gv = got[(size_t(lane) * chunks + c) * 8 + 2 * r + h];
          if (gv != want && bad++ < 5)
            std::fprintf(stderr,
                         "kperm_rows cols %d: lane %d chunk %d a%d half %d = %04x, "
                         "want %04x (row %d col %d)\n",
                         cols, lane, c, r, h, gv, want, row, col);
        }
  assert_int_equal(bad, 0);
}

// One warp: an AccTile of n fragments whose every element holds a value
// naming (lane, fragment, element), stored row half by row half by
// st_acc_row (Natural and EvenOdd) into rows of shared memory first filled
// with a poison value, copied out whole: each element at the column of the
// layout tile.h states (acc_col too), columns from `cols` on still poison.
void check_acc_cols(tile::AccCols order, int n, int cols) {
  const int width = 8 * n, pitch = 4 * width + 32;
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    Reg poison = e.mov(Type::F32, fimm(-7.0f));
    for (int o = 0; o < 16 * pitch; o += 128)  // lane l: word l of each 128 bytes
      b.st(Space::Shared, Type::F32, at(e.op(Op::MadLo, Type::U32, tid, imm(4), smem), o), poison);
    b.bar_warp_sync(0xffffffffu);
    tile::AccTile t = tile::acc_tile(b, n);
    Reg lanef = b.f32();
    b.cvt(Type::F32, Type::U32, fa::ptx::Round::Rn, lanef, tid);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < 4; ++i)  // lane * 1024 + 4j + i
        b.op(Op::Fma, Type::F32, t.f[j][i], lanef, fimm(1024.0f), fimm(float(4 * j + i)));
    for (int h = 0; h < 2; ++h) {
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * h));
      Reg ra = e.op(Op::MadLo, Type::U32, row, imm(pitch), smem);
      tile::st_acc_row(b, ln, t, order, h, ra, cols);
    }
    b.bar_warp_sync(0xffffffffu);
    Reg w = b.b32();
    for (int o = 0; o < 16 * pitch; o += 128) {
      Reg off = e.op(Op::MadLo, Type::U32, tid, imm(4), imm(o));
      b.ld(Space::Shared, Type::B32, w, at(e.op(Op::Add, Type::U32, off, smem)));
      b.st(Space::Global, Type::B32, at(e.index(g[0], off, 1)), w);
    }
  });
  DevBuf dout(size_t(16) * pitch);
  Ptrs p = {{dout.ptr, 0, 0, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, 16 * pitch, p), FA_SUCCESS);
  const std::vector<float> got = dout.get<float>();
  std::vector<float> want(got.size(), -7.0f);
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < 4; ++i) {
        const int q = lane % 4, row = lane / 4 + 8 * (i / 2);
        const int col = order == tile::AccCols::Natural
                            ? 8 * j + 2 * q + (i & 1)
                            : 16 * (j / 2) + 4 * q + 2 * (i & 1) + j % 2;
        assert_int_equal(tile::acc_col(order, j, i, q), col);
        if (col < cols) want[size_t(row) * pitch / 4 + col] = float(1024 * lane + 4 * j + i);
      }
  int bad = 0;
  for (size_t x = 0; x < got.size(); ++x)
    if (got[x] != want[x] && bad++ < 5)
      std::fprintf(stderr, "st_acc_row %s n %d cols %d: row %zu col %zu = %g, want %g\n",
                   order == tile::AccCols::Natural ? "natural" : "even/odd", n, cols,
                   x / (pitch / 4), x % (pitch / 4), double(got[x]), double(want[x]));
  assert_int_equal(bad, 0);
}

void test_fp8_frags(void **) {
  // The fp8 cvt needs sm_89: this test's own emulated device.
  std::unique_ptr<fa::Backend> be89;
  assert_int_equal(fa::create_emulator_backend(89, &be89), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = be89.get();
  // 16-byte chunks 1 .. 5 and 8 (.x2 tails; pitches bytes and bytes + 16).
  for (int bytes : {16, 32, 48, 64, 80, 128})
    for (bool e5m2 : {false, true}) check_fp8_frags(bytes, e5m2);
  g_be = sm80;
  for (int cols : {16, 48, 128}) check_kperm_rows(cols);
  const int shapes[][2] = {{2, 16}, {4, 32}, {6, 32}};  // fragments, columns stored
  for (auto order : {tile::AccCols::Natural, tile::AccCols::EvenOdd})
    for (const auto &x : shapes) check_acc_cols(order, x[0], x[1]);
}

// ------------------------------------------------------------ fp8 mma ---

// One warp: a 16 x K fp8 A tile and an 8 x K fp8 B tile ([n][k], the "col"
// operand, as K is in S = Q K^T) copied plainly into padded shared rows
// (pitch K + 16 bytes), read with the non-transposed ldmatrix (.x4 for A
// through tile::ldsm Role::A, .x2 for B) and multiplied with tile::mma_fp8
// per k32 step into one AccTile, stored in its C layout.
//
// Why ldmatrix gives the m16n8k32 fp8 fragments: ldmatrix .b16 hands lane
// (g, q) = (lane / 4, lane % 4) elements 2q, 2q + 1 of row g of each 8 x 8
// matrix, i.e. bytes 4q .. 4q + 3 of that 16-byte row, lowest byte in the
// register's lowest byte. The ISA's m16n8k32 fp8 A fragment gives register
// j of lane (g, q) the elements row g + 8 (j % 2), k = 16 (j / 2) + 4q + 0..3
// (lowest byte first): the bytes 4q .. 4q + 3 of row g of the matrix whose
// rows are A rows 8 (j % 2) .. + 7 at bytes 16 (j / 2) .. + 15, which is the
// matrix Role::A addresses for register j (row l8 + 8 h1, chunk h2: a 16 x 32
// byte block is one 16 x 16 block of 16-bit columns). B register j holds
// n = g, k = 16 j + 4q + 0..3: row g of the matrix of B rows 0..7 at bytes
// 16 j .. + 15, so .x2 with lane l (< 16) addressing row l % 8, chunk l / 8.
void check_fp8_mma(bool a5, bool b5, int variant) {
  using fa::ptx::Fp8;
  const int M = 16, N = 8, K = 64;
  const tile::SmemTile ta = tile::smem_tile(0, M, K / 2),
                       tb = tile::smem_tile(ta.bytes(), N, K / 2);
  const uint32_t smem_bytes = tb.offset + tb.bytes();
  // Random codes, no NaN and no infinity (e5m2 0x7c: inf - inf would be NaN);
  // variant 1 favours subnormals and zeros, variant 2 the largest finite.
  std::mt19937 gen(1000 * variant + 10 * a5 + b5);
  auto draw = [&](bool e5m2) {
    std::uniform_int_distribution<int> byte(0, 255), pick(0, 7);
    for (;;) {
      uint8_t c = static_cast<uint8_t>(byte(gen));
      if (variant == 1 && pick(gen) < 5) c &= e5m2 ? 0x83 : 0x87;                // exponent 0
      if (variant == 2 && pick(gen) < 2) c = (c & 0x80) | (e5m2 ? 0x7b : 0x7e);  // max
      if (std::isfinite(fa::ref::fp8_to_double(c, e5m2))) return c;
    }
  };
  std::vector<uint8_t> a(M * K), bt(N * K);
  for (auto &x : a) x = draw(a5);
  for (auto &x : bt) x = draw(b5);
  // Every run holds both signs of the largest finite and of a subnormal.
  a[0] = a5 ? 0x7b : 0x7e, a[1] = a5 ? 0xfb : 0xfe, a[2] = 0x01, a[3] = 0x81;
  bt[0] = b5 ? 0x7b : 0x7e, bt[K + 1] = b5 ? 0xfb : 0xfe, bt[2] = 0x01, bt[K + 3] = 0x81;
  const Fp8 fa8 = a5 ? Fp8::E5M2 : Fp8::E4M3, fb8 = b5 ? Fp8::E5M2 : Fp8::E4M3;
  const std::string ptx = kernel(
      32,
      [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
        Builder &b = e.b;
        const tile::Lanes ln = tile::make_lanes(e, tid);
        // Lane r < rows copies row r of a [rows][K] byte matrix into its tile.
        auto fill = [&](const tile::SmemTile &t, Reg src) {
          Reg w = b.b32();
          Reg ok = e.setp(fa::ptx::Cmp::Lt, Type::U32, tid, imm(t.rows));
          Reg row = e.index(src, tid, K);
          Reg sa = e.op(Op::MadLo, Type::U32, tid, imm(t.pitch), smem);
          for (int c = 0; c < K / 4; ++c) {
            b.when(ok).ld(Space::Global, Type::U32, w, at(row, 4 * c));
            b.when(ok).st(Space::Shared, Type::B32, at(sa, static_cast<int>(t.offset) + 4 * c), w);
          }
        };
        fill(ta, g[0]);
        fill(tb, g[1]);
        b.bar_sync();
        Reg la = tile::ldsm_base(e, ln, ta, tile::Role::A, smem, Reg());
        // B (.x2): lane l addresses row l8, chunk h1 (lanes 16..31 unused).
        Reg lb = e.op(Op::MadLo, Type::U32, ln.l8, imm(tb.pitch), smem);
        lb = e.op(Op::MadLo, Type::U32, ln.h1, imm(16), lb);
        tile::Frag4 fa = tile::frag4(b);
        Reg fb[2] = {b.b32(), b.b32()};
        tile::AccTile d = tile::acc_tile(b, 1);
        tile::zero(b, d);
        for (int ks = 0; ks < K / 32; ++ks) {
          tile::ldsm(b, tile::Role::A, fa, la, ta.at(0, 16 * ks));
          b.ldmatrix(false, fb, 2, at(lb, static_cast<int>(tb.offset) + 32 * ks));
          tile::mma_fp8(b, fa8, fb8, d, 0, fa, fb);
        }
        store_acc(e, ln, d, 0, g[2], N);
      },
      84, 89);
  DevBuf da(a.size()), db(bt.size()), dd(M * N * 4);
  da.put(a);
  db.put(bt);
  Ptrs p = {{da.ptr, db.ptr, dd.ptr, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, smem_bytes, p), FA_SUCCESS);
  const std::vector<float> d = dd.get<float>();
  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      // The emulator's model (docs/emulator.md): exact products, summed in
      // f32 in k order from C = 0, each sum rounded to nearest even; and the
      // exact sum, which a sequential f32 sum of 64 exact products is within
      // gamma_64 = 64 u / (1 - 64 u) < 65 u (u = 2^-24) of relative to the
      // sum of |products| (Higham, Accuracy and Stability, 3.1).
      // The exact sum in integers: every fp8 value times 2^16 is an integer
      // below 2^32 (the smallest subnormals are 2^-9 and 2^-16), so each
      // product times 2^32 is one below 2^64 and 64 of them fit in 128 bits.
      __extension__ typedef __int128 i128;
      float model = 0;
      i128 sum = 0;
      double mag = 0;
      for (int k = 0; k < K; ++k) {
        const double pa = fa::ref::fp8_to_double(a[m * K + k], a5);
        const double pb = fa::ref::fp8_to_double(bt[n * K + k], b5);
        volatile float prod = float(pa) * float(pb);
        model = model + prod;
        sum += i128(int64_t(std::ldexp(pa, 16))) * int64_t(std::ldexp(pb, 16));
        mag += std::fabs(pa * pb);
      }
      const double exact = std::ldexp(double(sum), -32);  // one rounding, 2^-53 relative
      const float got = d[m * N + n];
      const bool ok = got == model && std::fabs(double(got) - exact) <= 65 * 0x1p-24 * mag;
      if (!ok && bad++ < 5)
        std::fprintf(stderr,
                     "fp8 mma %s.%s variant %d: D[%d][%d] = %.9g, model %.9g, exact %.17g\n",
                     a5 ? "e5m2" : "e4m3", b5 ? "e5m2" : "e4m3", variant, m, n, double(got),
                     double(model), exact);
    }
  assert_int_equal(bad, 0);
}

void test_fp8_mma(void **) {
  // The fp8 mma needs sm_89: this test's own emulated device.
  std::unique_ptr<fa::Backend> be89;
  assert_int_equal(fa::create_emulator_backend(89, &be89), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = be89.get();
  for (int pair = 0; pair < 4; ++pair)
    for (int variant = 0; variant < 3; ++variant) check_fp8_mma(pair & 2, pair & 1, variant);
  g_be = sm80;
}

// ------------------------------------------------------------ fp8 P V ---

// The fp8 forward's O += P V (tile.h, pack_a_fp8 / Role::B_KN_T8 /
// v_frags_fp8), one warp on sm_89: an f32 tile P of 16 rows x 32 ks keys set
// from host values, rounded to e4m3 by pack_a_fp8 (k32 step s: C fragments
// 4s .. 4s + 3); V, 32 ks keys x 16 nc bytes of fp8 codes (e4m3 or e5m2) in
// a SmemTile of 8 nc 16-bit columns, read by ldsm Role::B_KN_T8 (chunk c of
// step s at t.at(32 s, 8 c)) and split by v_frags_fp8 into the B fragments
// of accumulator blocks 2c (the chunk's even columns) and 2c + 1 (its odd
// ones); mma_fp8 with A e4m3. Checked element by element against the layout
// tile.h states: element i of block 2c is row g + 8 (i / 2), column
// 16c + 4q + 2 (i & 1), of block 2c + 1 that column + 1; the value exactly
// the emulator's f32 model (products summed in the mma's k order, which
// stands for key 2q + j (j < 2) or 8 + 2q + j - 2 at k = 4q + j, plus 16 in
// the upper half) and within gamma_64 of the exact sum of P rounded to e4m3
// times V. P holds values whose e4m3 rounding is worked out here by hand
// (exact ones, ties to even, values that round up and down, zeros, 256,
// e4m3 subnormals and their ties, values past 448 that saturate), each also
// checked against reference.cc's rounding, and random values over 2^-12 ..
// 2^9 of both signs.
void check_fp8_pv(int ks, int nc, bool v5) {
  using fa::ptx::Fp8;
  const int M = 16, K = 32 * ks, NB = 16 * nc;
  const tile::SmemTile tv = tile::smem_tile(0, K, NB / 2);
  // Hand-rounded P values: {x, its e4m3 value}.
  const double s9 = std::ldexp(1.0, -9);  // e4m3's smallest subnormal
  const struct {
    float x;
    double want;
  } kRounds[] = {
      // clang-format off
      {1.0f, 1.0}, {256.0f, 256.0}, {448.0f, 448.0}, {28.0f, 28.0},       // exact
      {0.0f, 0.0}, {-0.0f, 0.0}, {1e-30f, 0.0},                           // zeros
      {1.0625f, 1.0}, {1.1875f, 1.25}, {248.0f, 256.0}, {232.0f, 224.0},  // ties to even
      {1.07f, 1.125}, {-1.05f, -1.0}, {250.0f, 256.0}, {244.0f, 240.0},   // nearest
      {3.3f, 3.25}, {-6.9f, -7.0},                                        // nearest
      {500.0f, 448.0}, {-1000.0f, -448.0},                                // saturated
      {0.015625f, 0.015625}, {0.01953125f, 0.01953125},                   // smallest normals
      {float(s9), s9}, {float(3 * s9), 3 * s9},                           // subnormals
      {float(s9 / 2), 0.0}, {float(1.5 * s9), 2 * s9},                    // subnormal ties
      {float(2.5 * s9), 2 * s9}, {float(7.5 * s9), 8 * s9},               // (7.5: to 2^-6)
      {float(0.75 * s9), s9}, {float(0.25 * s9), 0.0}, {float(-6.6 * s9), -7 * s9},
      // clang-format on
  };
  const int nr = static_cast<int>(sizeof kRounds / sizeof kRounds[0]);
  std::mt19937 gen(100 * ks + 10 * nc + v5);
  std::uniform_real_distribution<float> ex(-12.0f, 9.0f);
  std::uniform_int_distribution<int> coin(0, 1), byte(0, 255), pick(0, 7);
  std::vector<float> p(size_t(M) * K);
  std::vector<double> pr(p.size());  // P rounded to e4m3
  for (size_t i = 0; i < p.size(); ++i) {
    const int t = static_cast<int>((i * 7) % size_t(2 * nr));
    if (t < nr) {  // half the elements from the table, spread over rows and keys
      p[i] = kRounds[t].x;
      pr[i] = kRounds[t].want;
    } else {
      p[i] = (coin(gen) ? -1.0f : 1.0f) * std::exp2(ex(gen));
      pr[i] = fa::ref::fp8_to_double(fa::ref::fp8_from_double(p[i], false), false);
    }
  }
  for (const auto &r : kRounds)  // the hand rounding is cvt.rn.satfinite's
    assert_true(fa::ref::fp8_to_double(fa::ref::fp8_from_double(r.x, false), false) == r.want);
  std::vector<uint8_t> v(size_t(K) * NB);
  for (auto &x : v) {
    for (;;) {
      uint8_t c = static_cast<uint8_t>(byte(gen));
      if (pick(gen) < 2) c &= v5 ? 0x83 : 0x87;                // a subnormal or zero
      if (pick(gen) < 1) c = (c & 0x80) | (v5 ? 0x7b : 0x7e);  // the largest finite
      if (std::isfinite(fa::ref::fp8_to_double(c, v5))) {
        x = c;
        break;
      }
    }
  }
  const Fp8 fv8 = v5 ? Fp8::E5M2 : Fp8::E4M3;
  const std::string ptx = kernel(
      32,
      [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
        Builder &b = e.b;
        const tile::Lanes ln = tile::make_lanes(e, tid);
        // Lane r copies V rows r, r + 32, .. into the tile.
        Reg w = b.b32();
        for (int r0 = 0; r0 < K; r0 += 32) {
          Reg row = e.op(Op::Add, Type::U32, tid, imm(r0));
          Reg src = e.index(g[1], row, NB);
          Reg sa = e.op(Op::MadLo, Type::U32, row, imm(tv.pitch), smem);
          for (int c = 0; c < NB / 4; ++c) {
            b.ld(Space::Global, Type::U32, w, at(src, 4 * c));
            b.st(Space::Shared, Type::B32, at(sa, static_cast<int>(tv.offset) + 4 * c), w);
          }
        }
        b.bar_sync();
        // P's fragments: element (j, i) is row g + 8 (i / 2), key 8j + 2q + (i & 1).
        const tile::AccTile pt = tile::acc_tile(b, K / 8);
        for (int j = 0; j < K / 8; ++j)
          for (int i = 0; i < 4; ++i) {
            Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * (i / 2)));
            Reg key = e.op(Op::MadLo, Type::U32, ln.q, imm(2), imm(8 * j + (i & 1)));
            Reg idx = e.op(Op::MadLo, Type::U32, row, imm(K), key);
            b.ld(Space::Global, Type::F32, pt.f[j][i], at(e.index(g[0], idx, 4)));
          }
        Reg lv = tile::ldsm_base(e, ln, tv, tile::Role::B_KN_T8, smem, Reg());
        tile::Frag4 pa = tile::frag4(b), r = tile::frag4(b);
        Reg even[2] = {b.b32(), b.b32()}, odd[2] = {b.b32(), b.b32()};
        tile::AccTile o = tile::acc_tile(b, 2 * nc);
        tile::zero(b, o);
        for (int s = 0; s < ks; ++s) {
          tile::pack_a_fp8(b, pt, 4 * s, pa);
          for (int c = 0; c < nc; ++c) {
            tile::ldsm(b, tile::Role::B_KN_T8, r, lv, tv.at(32 * s, 8 * c));
            tile::v_frags_fp8(b, r, even, odd);
            tile::mma_fp8(b, Fp8::E4M3, fv8, o, 2 * c, pa, even);
            tile::mma_fp8(b, Fp8::E4M3, fv8, o, 2 * c + 1, pa, odd);
          }
        }
        store_acc(e, ln, o, 0, g[2], NB);  // AccTile's own layout; mapped below
      },
      84, 89);
  DevBuf dp(p.size() * 4), dv(v.size()), dd(size_t(M) * NB * 4);
  dp.put(p);
  dv.put(v);
  Ptrs prm = {{dp.ptr, dv.ptr, dd.ptr, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, tv.bytes(), prm), FA_SUCCESS);
  const std::vector<float> d = dd.get<float>();
  // The key at k of a k32 step (tile.h, pack_a_fp8).
  auto key_of = [](int k) {
    const int q = (k % 16) / 4, j = k % 4;
    return 16 * (k / 16) + (j < 2 ? 2 * q + j : 8 + 2 * q + j - 2);
  };
  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int raw = 0; raw < NB; ++raw) {
      // Accumulator column raw = 8 blk + 2q + x holds V column n.
      const int blk = raw / 8, q = raw % 8 / 2, x = raw % 2;
      const int n = 16 * (blk / 2) + 4 * q + 2 * x + blk % 2;
      __extension__ typedef __int128 i128;
      float model = 0;
      i128 sum = 0;
      double mag = 0;
      for (int s = 0; s < ks; ++s)
        for (int k = 0; k < 32; ++k) {
          const int key = 32 * s + key_of(k);
          const double pa = pr[size_t(m) * K + key];
          const double pb = fa::ref::fp8_to_double(v[size_t(key) * NB + n], v5);
          volatile float prod = float(pa) * float(pb);
          model = model + prod;
          sum += i128(int64_t(std::ldexp(pa, 16))) * int64_t(std::ldexp(pb, 16));
          mag += std::fabs(pa * pb);
        }
      const double exact = std::ldexp(double(sum), -32);
      const float got = d[size_t(m) * NB + raw];
      const bool ok = got == model && std::fabs(double(got) - exact) <= 65 * 0x1p-24 * mag;
      if (!ok && bad++ < 5)
        std::fprintf(stderr,
                     "fp8 P V (%d keys, %d chunks, V %s): O[%d][%d] (block %d) = %.9g, model "
                     "%.9g, exact %.17g\n",
                     K, nc, v5 ? "e5m2" : "e4m3", m, n, blk, double(got), double(model), exact);
    }
  assert_int_equal(bad, 0);
}

void test_fp8_pv(void **) {
  std::unique_ptr<fa::Backend> be89;
  assert_int_equal(fa::create_emulator_backend(89, &be89), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = be89.get();
  for (int ks = 1; ks <= 2; ++ks)
    for (int nc = 1; nc <= 2; ++nc)
      for (bool v5 : {false, true}) check_fp8_pv(ks, nc, v5);
  g_be = sm80;
}

// ------------------------------------------------- row-scaled f16 rows ---

// W warps: a 16 x cols tile copied into shared memory, rewritten by
// rows_bf16_to_f16 (e4m3 false: bf16 in place as f16) or quantised by
// rows_to_e4m3 (e4m3 true: `half` values to a byte tile after it), read back
// whole; each lane stores its two 2^-k.
void check_rows_scaled(int cols, int warps, bool e4m3, Type half) {
  const int rows = 16, threads = 32 * warps;
  const bool f16in = half == Type::F16;
  const tile::SmemTile q = tile::smem_tile(64, rows, cols);
  const tile::SmemTile q8 = tile::byte_tile(q.offset + q.bytes(), rows, cols);
  const tile::SmemTile &out = e4m3 ? q8 : q;  // what is read back
  const uint32_t smem_bytes = out.offset + out.bytes();
  std::mt19937 gen(cols * 31 + warps + (e4m3 ? 7 : 0));
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<uint16_t> in(size_t(rows) * q.pitch / 2, 0);
  for (int r = 0; r < rows; ++r) {
    // Rows of 2^-60 .. 2^50 N(0, 1) (f16: 2^-20 .. 2^10, its subnormals too).
    const int e = f16in ? (r * 7) % 12 * 3 - 20 : (r * 7) % 12 * 10 - 60;
    for (int c = 0; c < cols; ++c) {
      double x = r == 3 ? 0.0 : std::ldexp(nd(gen), e);  // row 3 all zero
      if (r == 5 && c == 1) x = std::nan("");
      if (r == 6 && c == cols - 1) x = -INFINITY;
      if (r == 7 && c == 2) x = std::ldexp(1.875, e + 2);  // mantissa past 1.75 (e4m3)
      in[size_t(q.at(r, c)) / 2] =
          f16in ? fa::ref::f32_to_f16(float(x)) : fa::ref::f32_to_bf16(float(x));
    }
  }
  auto value = [&](int r, int c) -> double {
    const uint16_t v = in[size_t(q.at(r, c)) / 2];
    return f16in ? fa::ref::f16_to_f32(v) : fa::ref::bf16_to_f32(v);
  };
  const std::string ptx = kernel(
      threads,
      [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
        Builder &b = e.b;
        Reg w = b.b32();
        for (uint32_t o = 0; o < q.bytes(); o += 4u * threads) {  // the tile in, plainly
          Reg off = e.op(Op::MadLo, Type::U32, tid, imm(4), imm(o));
          Reg ok = e.setp(fa::ptx::Cmp::Lt, Type::U32, off, imm(q.bytes()));
          Reg ga = e.index(g[0], off, 1), sa = e.op(Op::Add, Type::U32, smem, off);
          b.when(ok).ld(Space::Global, Type::B32, w, at(ga));
          b.when(ok).st(Space::Shared, Type::B32, at(sa, q.offset), w);
        }
        b.bar_sync();
        Reg lane = e.op(Op::And, Type::B32, tid, imm(31));
        Reg warp = e.op(Op::Shr, Type::U32, tid, imm(5));
        const tile::Lanes ln = tile::make_lanes(e, lane);
        const std::array<Reg, 2> un =
            e4m3 ? tile::rows_to_e4m3(e, ln, warp, warps, half, q, q8, smem)
                 : tile::rows_bf16_to_f16(e, ln, warp, warps, q, smem);
        for (uint32_t o = 0; o < out.bytes(); o += 4u * threads) {
          Reg off = e.op(Op::MadLo, Type::U32, tid, imm(4), imm(o));
          Reg ok = e.setp(fa::ptx::Cmp::Lt, Type::U32, off, imm(out.bytes()));
          Reg sa = e.op(Op::Add, Type::U32, smem, off), ga = e.index(g[1], off, 1);
          b.when(ok).ld(Space::Shared, Type::B32, w, at(sa, out.offset));
          b.when(ok).st(Space::Global, Type::B32, at(ga), w);
        }
        for (int h = 0; h < 2; ++h)
          b.st(Space::Global, Type::F32,
               at(e.index(g[2], e.op(Op::MadLo, Type::U32, tid, imm(2), imm(h)), 4)), un[h]);
      },
      e4m3 ? 84 : 70, e4m3 ? 89 : 80);
  DevBuf din(in.size() * 2), dout(out.bytes()), dun(size_t(threads) * 2 * 4);
  din.put(in);
  Ptrs p = {{din.ptr, dout.ptr, dun.ptr, 0, 0, 0}};
  assert_int_equal(launch(ptx, threads, smem_bytes, p), FA_SUCCESS);
  const std::vector<uint8_t> got = dout.get<uint8_t>();
  const std::vector<float> un = dun.get<float>();
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    double m = 0;  // the row's largest magnitude (NaN: above everything)
    bool nan = false;
    for (int c = 0; c < cols; ++c) {
      const double x = value(r, c);
      if (std::isnan(x))
        nan = true;
      else
        m = std::max(m, std::fabs(x));
    }
    // k = bias - the f32 exponent field: 141 (f16: [2^14, 2^15)) or 135
    // (e4m3: [2^8, 448], one less past a mantissa of 1.75); NaN and
    // infinity: field 255 (NaN's mantissa here is 0x400000).
    const int top = e4m3 ? 8 : 14;
    int k = 126;
    if (nan || std::isinf(m))
      k = top - 128;
    else if (m > 0)
      k = std::min(126, std::max(-126, top - std::ilogb(m) -
                                           (e4m3 && std::ldexp(m, -std::ilogb(m)) > 1.75)));
    for (int c = 0; c < cols; ++c) {
      const double x = value(r, c);
      const float y = float(std::ldexp(x, k));
      double want, gv;
      if (e4m3) {
        want = fa::ref::fp8_to_double(fa::ref::fp8_from_double(y, false), false);
        gv = fa::ref::fp8_to_double(got[size_t(r) * q8.pitch + c], false);
      } else {
        want = fa::ref::f16_to_f32(fa::ref::f32_to_f16(y));
        uint16_t v;
        std::memcpy(&v, &got[size_t(q.at(r, c))], 2);
        gv = fa::ref::f16_to_f32(v);
      }
      const bool ok = std::isnan(want) ? std::isnan(gv) : gv == want;
      if (!ok && bad++ < 5)
        std::fprintf(stderr, "cols %d warps %d e4m3 %d: (%d, %d) %g -> %g, want %g (k %d)\n", cols,
                     warps, e4m3, r, c, x, gv, want, k);
    }
    for (int t = 0; t < threads; ++t)  // lane t % 32 holds rows g, g + 8
      for (int h = 0; h < 2; ++h)
        if ((t % 32) / 4 + 8 * h == r && un[size_t(t) * 2 + h] != std::ldexp(1.0f, -k) && bad++ < 5)
          std::fprintf(stderr, "cols %d warps %d: thread %d row %d 2^-k = %g, want 2^%d\n", cols,
                       warps, t, r, double(un[size_t(t) * 2 + h]), -k);
  }
  assert_int_equal(bad, 0);
}

void test_rows_to_f16(void **) {
  // 8 .. 32 chunks per row: fewer and more than the 4 W lanes of a row.
  for (int cols : {64, 72, 128, 256})
    for (int w : {1, 2, 4}) check_rows_scaled(cols, w, false, Type::BF16);
}

// rows_to_e4m3 (sm_89): bf16 and f16 rows to e4m3 bytes, whole k32 steps.
void test_rows_to_e4m3(void **) {
  std::unique_ptr<fa::Backend> be89;
  assert_int_equal(fa::create_emulator_backend(89, &be89), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = be89.get();
  for (Type half : {Type::BF16, Type::F16})
    for (int cols : {64, 96, 256})
      for (int w : {1, 4}) check_rows_scaled(cols, w, true, half);
  g_be = sm80;
}

// Exp2Poly3 (the FMA-pipe exp2 of the sm_100a softmax, on f32x2 pairs: the
// packed add, mul and fma of the emulator too) against exp2 in
// fp64 over [-140, 127] plus -inf and the integers (relative error within
// 8e-5 where 2^x is normal; +0 below -126.5 and at -inf), and
// the three-input max.f32 (sm_100, PTX ISA 8.8) it sits next to: the
// pairwise max of PTX ("max": NaN only when every input is NaN).
void test_exp2_poly3(void **) {
  const int threads = 128, per = 64, n = threads * per;
  std::vector<float> x(n);
  std::mt19937 rng(0x5eed2);
  std::uniform_real_distribution<float> u(-140.0f, 127.0f);
  for (int i = 0; i < n; ++i) x[i] = u(rng);
  for (int k = -130; k <= 127; ++k) x[size_t(k + 130)] = float(k);  // the integers
  x[300] = -INFINITY;
  x[301] = -127.0f;
  x[302] = 0.5f;
  x[303] = -0.5f;
  std::unique_ptr<fa::Backend> be100;
  assert_int_equal(fa::create_emulator_backend(100, &be100), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = be100.get();
  std::vector<float> y, m;
  {
    DevBuf in(n * 4), out(n * 4), mx(threads * 4);  // poisoned
    in.put(x);
    const std::string ptx = kernel(
        threads,
        [&](Emitter &e, Reg tid, Reg, const Reg *g) {
          Builder &b = e.b;
          Reg v[2] = {b.f32(), b.f32()}, m = b.f32();
          b.mov(Type::F32, m, fimm(-INFINITY));
          const tile::Exp2Poly3 exp2(e);
          for (int i = 0; i < per; i += 2) {
            Reg idx = e.op(Op::MadLo, Type::U32, tid, imm(per), imm(i));
            b.ld_v(Space::Global, Type::F32, {v[0], v[1]}, at(e.index(g[0], idx, 4)));
            Reg y[2] = {b.f32(), b.f32()};
            exp2(y[0], y[1], v[0], v[1]);
            b.st_v(Space::Global, Type::F32, at(e.index(g[1], idx, 4)), {y[0], y[1]});
            b.op(Op::Max3, Type::F32, m, m, v[1], y[1]);
          }
          b.st(Space::Global, Type::F32, at(e.index(g[2], tid, 4)), m);
        },
        88, 100);
    Ptrs p{};
    p.p[0] = in.ptr;
    p.p[1] = out.ptr;
    p.p[2] = mx.ptr;
    const fa_status st = launch(ptx, threads, 0, p);
    if (st == FA_SUCCESS) {
      y = out.get<float>();
      m = mx.get<float>();
    }
  }
  g_be = sm80;
  assert_int_equal(y.size(), size_t(n));
  int bad = 0;
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const double want = std::exp2(double(x[i]));
    bool ok;
    if (x[i] < -126.5f) {
      ok = y[i] == 0.0f && !std::signbit(y[i]);
    } else if (x[i] < -126.0f) {  // j = -126: a denormal
      ok = y[i] >= 0.0f && y[i] <= 0x1p-126f;
    } else {
      const double rel = std::fabs(double(y[i]) / want - 1);
      worst = std::max(worst, rel);
      ok = rel <= 8e-5;
    }
    if (std::isinf(x[i])) ok = y[i] == 0.0f && !std::signbit(y[i]);
    if (!ok && bad++ < 5) std::fprintf(stderr, "Exp2Poly3(%a) = %a, want %a\n", x[i], y[i], want);
  }
  for (int t = 0; t < threads; ++t) {
    float want = -INFINITY;
    for (int i = 1; i < per; i += 2) {
      const size_t k = size_t(t) * per + size_t(i);
      want = std::max({want, x[k], y[k]});
    }
    if (m[size_t(t)] != want && bad++ < 5)
      std::fprintf(stderr, "thread %d: max3 chain %a, want %a\n", t, m[size_t(t)], want);
  }
  std::fprintf(stderr, "  Exp2Poly3: relative error at most %.3g over the normal range\n", worst);
  assert_int_equal(bad, 0);
}

// ------------------------------------------------------------ masking ---

// mask_row_half on a 16 x 32 tile of ones: row r keeps columns [lo_r, hi_r)
// (given per row, made relative to each lane's first column 2q as the
// kernels do) and every other element becomes -inf; checked element by
// element, including empty ranges and ranges past the tile.
void test_mask_row_half(void **) {
  const int rows = 16, cols = 32, n = cols / 8;
  const int lo[rows] = {0, 3, 8, 31, 32, -5, 7, 16, 1, 0, 9, 20, 2, 30, 5, 15};
  const int hi[rows] = {32, 4, 24, 32, 40, 3, 7, 17, 31, 0, 33, 21, 18, 31, 6, 15};
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    const tile::AccTile t = tile::acc_tile(b, n);
    for (const tile::Frag4 &f : t.f)
      for (Reg r : f) b.mov(Type::F32, r, fimm(1.0f));
    Reg p = b.pred(), q = b.pred();
    Reg kq = e.op(Op::MulLo, Type::S32, ln.q, imm(2));
    for (int h = 0; h < 2; ++h) {
      // This lane's row g + 8h: lo/hi from the tables in global memory.
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * h));
      Reg l = b.b32(), u = b.b32();
      b.ld(Space::Global, Type::S32, l, at(e.index(g[0], row, 4)));
      b.ld(Space::Global, Type::S32, u, at(e.index(g[1], row, 4)));
      b.op(Op::Sub, Type::S32, l, l, kq);
      b.op(Op::Sub, Type::S32, u, u, kq);
      tile::mask_row_half(b, t, h, l, u, p, q);
    }
    store_acc(e, ln, t, 0, g[2], cols);
  });
  DevBuf dlo(rows * 4), dhi(rows * 4), dout(rows * cols * 4);
  dlo.put(std::vector<int32_t>(lo, lo + rows));
  dhi.put(std::vector<int32_t>(hi, hi + rows));
  Ptrs pt = {{dlo.ptr, dhi.ptr, dout.ptr, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, 0, pt), FA_SUCCESS);
  const std::vector<float> got = dout.get<float>();
  int bad = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const bool keep = c >= lo[r] && c < hi[r];
      const float v = got[size_t(r) * cols + c];
      if (keep ? v != 1.0f : !(std::isinf(v) && v < 0)) {
        if (bad < 5) std::fprintf(stderr, "row %d col %d: %g (keep %d)\n", r, c, v, keep);
        ++bad;
      }
    }
  assert_int_equal(bad, 0);
}

// The key-range schedule (key_range, lean_hi, key_loop) and row_range,
// one case per thread: random CTAs (m0, seqlen_q, seqlen_k; no window,
// causal, a left window, a window both ways) for block_n a power of two and
// not. Each thread runs key_loop with a body that records (n, masked) and
// steps n down. Against the definitions, row by row: no tile when (and
// only when) no row sees a key; else the tiles visited are top, top -
// block_n, ..., n_begin, n_begin a multiple of block_n, and they cover
// every key any row sees; a tile run lean holds only keys every row sees,
// and every tile holding only such keys is run lean (masked tiles are the
// ones that need a mask); row_range of each of the first rows is exactly
// its visible keys. Half the cases are narrowed to one split of the keys
// (split_keys: split_size 1..4 tiles, some splits past seqlen_k): then
// "sees" is within the split's keys too, tiles stay inside the split, and
// masked/lean is unchanged.
void test_key_range(void **) {
  constexpr int kCases = 64, kMaxTiles = 16, kRows = 8;
  constexpr int kWords = 4 + 2 * kMaxTiles + 2 * kRows;  // per case
  constexpr int kIn = 7;                                 // m0, sq, sk, wl, wr, split, split_size
  int cases = 0, lean_tiles = 0, masked_tiles = 0, empty_ctas = 0, split_ctas = 0;
  for (const int block_n : {64, 48}) {
    const int block_m = 64;
    std::mt19937 rng(7 + block_n);
    std::vector<int32_t> in;  // kIn per case
    for (int c = 0; c < kCases; ++c) {
      const int sq = 1 + int(rng() % 300), sk = int(rng() % (block_n * kMaxTiles - block_n));
      const int m0 = block_m * int(rng() % ((sq + block_m - 1) / block_m));
      const int kind = int(rng() % 4);  // none, causal, left window, both ways
      // The resolved edges (set_masking_and_scale): "unbounded" is
      // seqlen_k - 1 / seqlen_q - 1; causal makes wr 0.
      int wl = std::max(sk - 1, 0), wr = std::max(sq - 1, 0);
      if (kind == 1) wr = 0;
      if (kind >= 2) wl = std::min(int(rng() % 100), wl), wr = kind == 2 ? 0 : int(rng() % 40);
      const int ss = c % 2 ? block_n * (1 + int(rng() % 4)) : 0;  // 0: not split
      const int split = ss ? int(rng() % ((sk + ss - 1) / ss + 1)) : 0;
      in.insert(in.end(), {m0, sq, sk, wl, wr, split, ss});
    }
    const std::string ptx = kernel(kCases, [&](Emitter &e, Reg tid, Reg, Reg *g) {
      Builder &b = e.b;
      Reg v[kIn];
      for (int i = 0; i < kIn; ++i) {
        v[i] = b.b32();
        Reg idx = e.op(Op::MadLo, Type::U32, tid, imm(kIn), imm(i));
        b.ld(Space::Global, Type::S32, v[i], at(e.index(g[0], idx, 4)));
      }
      const Reg m0 = v[0], sq = v[1], sk = v[2], wl = v[3], wr = v[4];
      Reg shift = e.op(Op::Sub, Type::S32, sk, sq);
      tile::KeyRange kr = tile::key_range(e, m0, shift, sq, sk, wl, wr, block_m, block_n);
      tile::KeyRange ks = kr;
      tile::split_keys(e, &ks, v[5], v[6], block_n);
      Reg split = e.setp(fa::ptx::Cmp::Ne, Type::S32, v[6], imm(0));
      b.selp(Type::S32, kr.n_begin, ks.n_begin, kr.n_begin, split);
      b.selp(Type::S32, kr.top, ks.top, kr.top, split);
      b.selp(Type::S32, kr.lean_lo, ks.lean_lo, kr.lean_lo, split);
      Reg ke = e.op(Op::And, Type::Pred, ks.empty, split);
      Reg ue = e.op(Op::And, Type::Pred, kr.empty, e.op(Op::Not, Type::Pred, split));
      kr.empty = e.op(Op::Or, Type::Pred, ke, ue);
      Reg hi = tile::lean_hi(e, kr.dfirst, wr, sk, block_n);
      Reg out = e.index(g[1], tid, 4 * kWords);
      b.st(Space::Global, Type::B32, at(out), e.selp(Type::S32, imm(1), imm(0), kr.empty));
      b.st(Space::Global, Type::B32, at(out, 4), kr.n_begin);
      b.st(Space::Global, Type::B32, at(out, 8), kr.top);
      Reg count = e.mov(Type::S32, imm(0));
      tile::KeyLoop loop;
      loop.n = e.mov(Type::S32, kr.top);
      loop.n_begin = kr.n_begin;
      loop.lean_lo = kr.lean_lo;
      loop.lean_hi = [hi] { return hi; };
      loop.masked = b.label();
      loop.lean = b.label();
      loop.exit = b.label();
      loop.p = b.pred();
      loop.t = b.pred();
      b.when(kr.empty).bra(loop.exit);
      tile::key_loop(b, loop, [&](bool masked) {
        Reg a = e.index(out, count, 8);
        b.st(Space::Global, Type::B32, at(a, 16), loop.n);
        b.st(Space::Global, Type::B32, at(a, 20), e.mov(Type::B32, imm(masked ? 1 : 0)));
        b.op(Op::Add, Type::S32, count, count, imm(1));
        b.op(Op::Sub, Type::S32, loop.n, loop.n, imm(block_n));
      });
      b.bind(loop.exit);
      b.st(Space::Global, Type::B32, at(out, 12), count);
      for (int r = 0; r < kRows; ++r) {
        Reg diag = e.op(Op::Add, Type::S32, e.op(Op::Add, Type::S32, m0, imm(r)), shift);
        const tile::RowRange rr = tile::row_range(e, diag, wl, wr, imm(0), sk);
        b.st(Space::Global, Type::B32, at(out, 16 + 8 * kMaxTiles + 8 * r), rr.lo);
        b.st(Space::Global, Type::B32, at(out, 20 + 8 * kMaxTiles + 8 * r), rr.hi);
      }
    });
    DevBuf din(in.size() * 4), dout(size_t(kCases) * kWords * 4);
    din.put(in);
    Ptrs pt = {{din.ptr, dout.ptr, 0, 0, 0, 0}};
    assert_int_equal(launch(ptx, kCases, 0, pt), FA_SUCCESS);
    const std::vector<int32_t> got = dout.get<int32_t>();
    for (int c = 0; c < kCases; ++c) {
      const int32_t *x = &in[size_t(kIn) * c], *o = &got[size_t(c) * kWords];
      const int m0 = x[0], sq = x[1], sk = x[2], wl = x[3], wr = x[4], ss = x[6];
      const int rows_end = std::min(m0 + block_m, sq);
      // Row i's visible keys [lo_of, hi_of); within the split [s_lo, s_hi).
      const int s_lo = ss ? x[5] * ss : 0, s_hi = ss ? s_lo + ss : sk;
      auto lo_of = [&](int i) { return std::max(i + sk - sq - wl, 0); };
      auto hi_of = [&](int i) { return std::min(i + sk - sq + wr + 1, sk); };
      auto slo_of = [&](int i) { return std::max(lo_of(i), s_lo); };
      auto shi_of = [&](int i) { return std::min(hi_of(i), s_hi); };
      bool any = false;
      for (int i = m0; i < rows_end; ++i) any = any || slo_of(i) < shi_of(i);
      split_ctas += ss != 0;
      const bool empty = o[0] != 0;
      const int n_begin = o[1], count = o[3];
      auto where = [&]() {
        std::fprintf(stderr,
                     "block_n %d case %d: m0 %d sq %d sk %d wl %d wr %d split %d of %d: empty "
                     "%d n_begin %d top %d tiles %d\n",
                     block_n, c, m0, sq, sk, wl, wr, x[5], ss, o[0], o[1], o[2], o[3]);
      };
      ++cases;
      if (empty != !any || (empty && count != 0)) where(), fail();
      if (empty) {
        ++empty_ctas;
      } else {
        if (count < 1 || count > kMaxTiles || n_begin % block_n != 0) where(), fail();
        std::vector<char> covered(size_t(sk), 0);
        for (int k = 0; k < count; ++k) {
          const int n = o[4 + 2 * k], masked = o[5 + 2 * k];
          if (n != o[2] - k * block_n) where(), fail();  // last tile first, block_n apart
          if (k == count - 1 && n != n_begin) where(), fail();
          if (n < s_lo || (ss && n + block_n > s_hi)) where(), fail();  // inside the split
          bool all = true;  // every key of the tile seen by every row
          for (int j = n; j < n + block_n; ++j) {
            for (int i = m0; i < rows_end; ++i) {
              const bool sees = j < sk && j >= lo_of(i) && j < hi_of(i);
              all = all && sees;
              if (sees && j >= s_lo && j < s_hi) covered[size_t(j)] = 1;
            }
          }
          if (masked == all) where(), fail();  // lean exactly when no mask is needed
          ++(masked ? masked_tiles : lean_tiles);
        }
        for (int i = m0; i < rows_end; ++i)
          for (int j = slo_of(i); j < shi_of(i); ++j)
            if (!covered[size_t(j)]) where(), fail();
      }
      for (int r = 0; r < kRows; ++r) {
        const int lo = o[4 + 2 * kMaxTiles + 2 * r], hi = o[5 + 2 * kMaxTiles + 2 * r];
        if (lo != lo_of(m0 + r) || hi != hi_of(m0 + r)) where(), fail();
      }
    }
  }
  std::printf("  %d CTAs (%d empty, %d split): %d lean and %d masked tiles as defined\n", cases,
              empty_ctas, split_ctas, lean_tiles, masked_tiles);
  assert_true(lean_tiles > 50 && masked_tiles > 50 && empty_ctas > 0 && split_ctas > 40);
}

// Key tiles of m-block m of a sequence of sq queries and sk keys (key_range's
// definition, block_m = block_n = 128): the schedulers' "longest first".
int64_t scheduled_key_tiles(int64_t m, int64_t sq, int64_t sk, int64_t wl, int64_t wr) {
  const int64_t shift = sk - sq, first = 128 * m;
  const int64_t last = std::min<int64_t>(first + 128, sq) - 1;
  const int64_t lo = std::max<int64_t>(first + shift - wl, 0) / 128 * 128;
  const int64_t hi = std::min<int64_t>(last + shift + wr + 1, sk);
  return hi > lo ? (hi - lo + 127) / 128 : 0;
}

// Item t's (m_block, head, batch) as three words at out + 4 + 12 t, the
// layout both schedulers' tests read back.
void store_item(Emitter &e, Reg out, Reg t, const tile::TileScheduler::Item &it) {
  Reg a = e.index(out, e.op(Op::MadLo, Type::U32, t, imm(12), imm(4)), 1);
  e.b.st(Space::Global, Type::B32, at(a), it.m_block);
  e.b.st(Space::Global, Type::B32, at(a, 4), it.head);
  e.b.st(Space::Global, Type::B32, at(a, 8), it.batch);
}

// The persistent forward's tile scheduler (TileScheduler, Schedule), one
// launch case per thread: each thread decodes every item number of its case
// in PTX. Cases: causal with seqlen_q below, equal to and above seqlen_k, a
// left window alone, windows both ways, no mask, GQA groups of 1, 2 and 4,
// one and several batches, K/V small enough for one section and large
// enough for sections of one and of three KV heads (a short last section).
// Against the statements of scheduler.h, not only the host twin: every
// (m_block, head, batch) exactly once; sections of whole KV heads whose K/V
// fit kL2Bytes (or one KV head); inside a section every pair at one m-block
// before the next m-block, pairs in order bh = batch heads + head
// (consecutive items: consecutive heads of one batch); m-blocks in order of
// their key tiles, most first, where that count is monotone in the m-block
// (causal, a left window alone); and the PTX equal to the host's decode.
void test_scheduler(void **) {
  struct Case {
    int sq, sk, h, hkv, b, wl, wr, d;
  };
  const int kUnb = -1;  // an unbounded edge, resolved below
  const Case cases[] = {
      {1000, 1000, 4, 2, 2, kUnb, 0, 128},  {300, 1000, 8, 2, 1, kUnb, 0, 64},
      {1000, 300, 3, 3, 2, kUnb, 0, 128},   {1, 5000, 6, 3, 1, kUnb, 0, 256},
      {900, 900, 4, 1, 3, 200, kUnb, 128},  {700, 800, 4, 4, 1, 100, 50, 64},
      {500, 500, 2, 1, 3, kUnb, kUnb, 128}, {640, 40000, 5, 5, 2, kUnb, 0, 64},
      {512, 100000, 8, 8, 1, kUnb, 0, 128}, {257, 65536, 12, 4, 2, kUnb, 0, 64},
      {129, 129, 1, 1, 1, kUnb, 0, 8},      {2000, 2000, 2, 2, 1, kUnb, 0, 128},
  };
  constexpr int kCases = sizeof cases / sizeof cases[0], kBlockM = 128, kMaxItems = 512;
  std::vector<int32_t> in;
  std::vector<fa::kgen::tile::Schedule> host;
  for (const Case &c : cases) {
    // The resolved edges (set_masking_and_scale).
    const int wl = c.wl < 0 ? std::max(c.sk - 1, 0) : c.wl,
              wr = c.wr < 0 ? std::max(c.sq - 1, 0) : c.wr;
    in.insert(in.end(), {c.sq, c.sk, c.h, c.hkv, c.b, wl, wr, 0});
    host.push_back(
        fa::kgen::tile::make_schedule(c.sq, c.sk, c.h, c.hkv, c.b, wl, wr, kBlockM, 2 * 2 * c.d));
    assert_true(host.back().total() <= kMaxItems);
  }
  int sections = 0, short_sections = 0;
  for (const auto &s : host) sections = std::max<int>(sections, int(s.section));
  // One module per head dim (kv_row_bytes is the kernel's); each thread runs
  // the cases of its head dim.
  for (const int d : {8, 64, 128, 256}) {
    const std::string ptx = kernel(kCases, [&](Emitter &e, Reg tid, Reg, Reg *g) {
      Builder &b = e.b;
      Reg v[8];
      for (int i = 0; i < 8; ++i) {
        v[i] = b.b32();
        Reg idx = e.op(Op::MadLo, Type::U32, tid, imm(8), imm(i));
        b.ld(Space::Global, Type::S32, v[i], at(e.index(g[0], idx, 4)));
      }
      const tile::TileScheduler sched(e, v[0], v[1], v[2], v[3], v[4], v[5], v[6], kBlockM,
                                      2 * 2 * d);
      Reg out = e.index(g[1], tid, 4 * (1 + 3 * kMaxItems));
      b.st(Space::Global, Type::B32, at(out), sched.total());
      Reg t = e.mov(Type::U32, imm(0));
      fa::ptx::Label top = b.label(), done = b.label();
      b.bind(top);
      b.when(e.setp(fa::ptx::Cmp::Ge, Type::U32, t, sched.total())).bra(done);
      const tile::TileScheduler::Item it = sched.decode(t);
      store_item(e, out, t, it);
      b.op(Op::Add, Type::U32, t, t, imm(1));
      b.bra(top);
      b.bind(done);
    });
    DevBuf din(in.size() * 4), dout(size_t(kCases) * (1 + 3 * kMaxItems) * 4);
    din.put(in);
    Ptrs pt = {{din.ptr, dout.ptr, 0, 0, 0, 0}};
    assert_int_equal(launch(ptx, kCases, 0, pt), FA_SUCCESS);
    const std::vector<int32_t> got = dout.get<int32_t>();
    for (int ci = 0; ci < kCases; ++ci) {
      const Case &c = cases[ci];
      if (c.d != d) continue;
      const fa::kgen::tile::Schedule &s = host[size_t(ci)];
      const int32_t *o = &got[size_t(ci) * (1 + 3 * kMaxItems)];
      const int wl = in[8 * ci + 5], wr = in[8 * ci + 6], g = c.h / c.hkv;
      const int64_t total = s.total(), kv_bytes = int64_t(c.sk) * 2 * 2 * c.d;
      auto where = [&](int64_t t, const char *what) {
        std::fprintf(stderr,
                     "case %d (sq %d sk %d h %d hkv %d b %d wl %d wr %d d %d) item %lld: %s\n", ci,
                     c.sq, c.sk, c.h, c.hkv, c.b, wl, wr, c.d, static_cast<long long>(t), what);
      };
      if (o[0] != total) where(-1, "total"), fail();
      auto key_tiles = [&](int64_t m) { return scheduled_key_tiles(m, c.sq, c.sk, wl, wr); };
      const bool monotone = c.wr == 0 || c.wr == kUnb;  // causal or a left window alone
      if (s.section > 1 && s.section * kv_bytes > fa::kgen::tile::kL2Bytes)
        where(-1, "section"), fail();
      const int64_t sec_items = s.section * g * s.m_blocks;
      if (total % sec_items != 0) ++short_sections;
      std::vector<char> seen(size_t(total), 0);
      for (int64_t t = 0; t < total; ++t) {
        const int64_t m = o[1 + 3 * t];
        const int h = o[2 + 3 * t], bz = o[3 + 3 * t];
        const fa::kgen::tile::WorkItem w = s.decode(t);
        if (w.m_block != m || w.head != h || w.batch != bz) where(t, "host twin differs"), fail();
        if (m < 0 || m >= s.m_blocks || h < 0 || h >= c.h || bz < 0 || bz >= c.b)
          where(t, "out of range"), fail();
        const int64_t key = (int64_t(bz) * c.h + h) * s.m_blocks + m;
        if (seen[size_t(key)]++) where(t, "twice"), fail();
        // Its section: KV heads [sec section, (sec + 1) section) of bz hkv + h / g.
        const int64_t sec = t / sec_items, kvh = int64_t(bz) * c.hkv + h / g;
        if (kvh / s.section != sec) where(t, "outside its section"), fail();
        if (t % sec_items == 0) continue;
        const int64_t pm = o[1 + 3 * (t - 1)];
        const int64_t pbh = int64_t(o[3 + 3 * (t - 1)]) * c.h + o[2 + 3 * (t - 1)];
        const int64_t bh = int64_t(bz) * c.h + h;
        if (pm == m ? bh != pbh + 1 : bh != sec * s.section * g)
          where(t, "pairs not in order"), fail();
        if (pm != m && m != (s.reverse ? pm - 1 : pm + 1))
          where(t, "m-blocks not in order"), fail();
        if (monotone && key_tiles(m) > key_tiles(pm)) where(t, "not longest first"), fail();
      }
    }
  }
  std::printf("  %d cases: each item once, in order; sections up to %d KV heads, %d short\n",
              kCases, sections, short_sections);
  assert_true(sections >= 3 && short_sections > 0);
}

// Varlen batches scheduled by work (WorkScheduler, WorkSchedule,
// build_work_prefix): one launch of a warp per case; the warp builds the
// m-block prefix from cu_seqlens_q in shared memory (batch <= the cap,
// kWorkBatchMax or a kernel's smaller one) and its 32 threads decode every
// item number. Cases: 20 sequences, half
// empty, some shorter than one m-block; 70 sequences over three scan steps
// with lengths past seqlen_q and negative ones (clamped); one long sequence
// with sections of KV heads; a left window alone; no mask; GQA 1, 2 and 4;
// 1030 sequences (above kWorkBatchMax: the padded order); a smaller cap
// (20 sequences at it: by work; 70 at 69: padded). Against the
// statements of scheduler.h: by work, every real (m_block < n_b, head,
// sequence) exactly once and nothing else; the fallback, every padded item
// once; a sequence's items contiguous, sequences in order; at one m-block
// consecutive heads; m-blocks most keys first where that count is monotone;
// and the PTX equal to the host's decode.
void test_work_scheduler(void **) {
  struct Case {
    std::vector<int64_t> lens;
    int sq, sk, h, hkv, wl, wr, d;
    int cap = tile::kWorkBatchMax;  // the kernel's bound on the batch
  };
  const int kUnb = -1;
  std::vector<Case> cases;
  std::mt19937 rng(2727);
  {
    Case c{{}, 700, 700, 4, 2, kUnb, 0, 128};  // 20 sequences, half empty
    for (int b = 0; b < 20; ++b) c.lens.push_back(b % 2 ? 0 : int64_t(rng() % 700) + (b == 4));
    c.lens[2] = 1;
    c.lens[6] = 700;
    cases.push_back(c);
    c.cap = 20;  // the batch at a kernel's smaller bound: still by work
    cases.push_back(c);
  }
  {
    Case c{{}, 300, 400, 6, 3, kUnb, 0, 64};  // 70 sequences: three scan steps, clamped lengths
    for (int b = 0; b < 70; ++b) c.lens.push_back(int64_t(rng() % 400) - 50);
    cases.push_back(c);
    c.cap = 69;  // one past the bound: the padded order
    cases.push_back(c);
  }
  cases.push_back(Case{{0, 2000, 0}, 2000, 100000, 8, 8, kUnb, 0, 128});     // sections of KV heads
  cases.push_back(Case{{300, 0, 900, 129}, 900, 900, 4, 1, 200, kUnb, 64});  // left window alone
  cases.push_back(Case{{128, 5, 256}, 256, 256, 2, 2, kUnb, kUnb, 128});     // no mask
  {
    Case c{std::vector<int64_t>(1030, 0), 200, 200, 2, 1, kUnb, 0, 64};  // above the bound
    for (int b = 0; b < 1030; b += 97) c.lens[size_t(b)] = 1 + b % 200;
    cases.push_back(c);
  }
  int fallbacks = 0, sections = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case &c = cases[ci];
    const int batch = static_cast<int>(c.lens.size());
    const int wl = c.wl < 0 ? std::max(c.sk - 1, 0) : c.wl,
              wr = c.wr < 0 ? std::max(c.sq - 1, 0) : c.wr;
    const tile::WorkSchedule s =
        tile::make_work_schedule(c.lens, c.sq, c.sk, c.h, c.hkv, wl, wr, 128, 2 * 2 * c.d, c.cap);
    const int64_t total = s.total();
    // cu_seqlens from the lengths (packed rows); the clamp is the kernel's.
    std::vector<int32_t> cu(1, 0), in = {c.sq, c.sk, c.h, c.hkv, batch, wl, wr, 0};
    for (int64_t len : c.lens) cu.push_back(cu.back() + static_cast<int32_t>(len));
    const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
      Builder &b = e.b;
      Reg v[7];
      for (int i = 0; i < 7; ++i) {
        v[i] = b.b32();
        b.ld(Space::Global, Type::S32, v[i], at(g[1], 4 * i));
      }
      fa::ptx::Label built = b.label();
      b.when(e.setp(fa::ptx::Cmp::Gt, Type::S32, v[4], imm(c.cap))).bra(built);
      tile::build_work_prefix(e, smem, g[0], v[0], v[4], tid, 128, c.cap);
      b.bind(built);
      b.bar_sync();
      const tile::WorkScheduler sched(e, smem, v[0], v[1], v[2], v[3], v[4], v[5], v[6], 128,
                                      2 * 2 * c.d, c.cap);
      Reg zero = e.mov(Type::U32, imm(0));
      b.when(e.setp(fa::ptx::Cmp::Eq, Type::U32, tid, zero))
          .st(Space::Global, Type::B32, at(g[2]), sched.total());
      Reg t = e.mov(Type::U32, tid);
      fa::ptx::Label top = b.label(), done = b.label();
      b.bind(top);
      b.when(e.setp(fa::ptx::Cmp::Ge, Type::U32, t, sched.total())).bra(done);
      const tile::TileScheduler::Item it = sched.decode(t);
      store_item(e, g[2], t, it);
      b.op(Op::Add, Type::U32, t, t, imm(32));
      b.bra(top);
      b.bind(done);
    });
    DevBuf dcu(cu.size() * 4), din(in.size() * 4), dout(size_t(4 + 12 * total));
    dcu.put(cu);
    din.put(in);
    Ptrs pt = {{dcu.ptr, din.ptr, dout.ptr, 0, 0, 0}};
    assert_int_equal(launch(ptx, 32, tile::kWorkPrefixBytes, pt), FA_SUCCESS);
    const std::vector<int32_t> got = dout.get<int32_t>();
    auto where = [&](int64_t t, const char *what) {
      std::fprintf(stderr, "work case %zu (batch %d sq %d sk %d h %d hkv %d) item %lld: %s\n", ci,
                   batch, c.sq, c.sk, c.h, c.hkv, static_cast<long long>(t), what);
    };
    if (got[0] != total) where(-1, "total"), fail();
    const int64_t padded = (c.sq + 127) / 128;
    // The m-blocks each sequence must run: its own, or the padded count.
    std::vector<int64_t> want(c.lens.size());
    int64_t expect = 0;
    for (size_t b = 0; b < c.lens.size(); ++b) {
      const int64_t len = std::min<int64_t>(std::max<int64_t>(c.lens[b], 0), c.sq);
      want[b] = batch <= c.cap ? (len + 127) / 128 : padded;
      expect += want[b] * c.h;
    }
    if (total != expect) where(-1, "not the real item count"), fail();
    fallbacks += batch > c.cap;
    sections = std::max<int>(sections, int(s.section < c.hkv));
    auto key_tiles = [&](int64_t m, int64_t sqb) {
      return scheduled_key_tiles(m, sqb, c.sk, wl, wr);
    };
    const bool monotone = c.wr == 0 || c.wr == kUnb;
    std::vector<std::vector<char>> seen(c.lens.size());
    for (size_t b = 0; b < c.lens.size(); ++b) seen[b].assign(size_t(want[b] * c.h), 0);
    for (int64_t t = 0; t < total; ++t) {
      const int64_t m = got[size_t(1 + 3 * t)];
      const int h = got[size_t(2 + 3 * t)], bz = got[size_t(3 + 3 * t)];
      const fa::kgen::tile::WorkItem w = s.decode(t);
      if (w.m_block != m || w.head != h || w.batch != bz) where(t, "host twin differs"), fail();
      if (bz < 0 || bz >= batch || h < 0 || h >= c.h || m < 0 || m >= want[size_t(bz)])
        where(t, "not a real item"), fail();
      if (seen[size_t(bz)][size_t(m * c.h + h)]++) where(t, "twice"), fail();
      if (t == 0) continue;
      const int64_t pm = got[size_t(1 + 3 * (t - 1))];
      const int ph = got[size_t(2 + 3 * (t - 1))], pb = got[size_t(3 + 3 * (t - 1))];
      if (pb > bz) where(t, "sequences out of order"), fail();
      if (pb != bz) continue;
      // Sections of s.section KV heads (whole KV heads), one after the other.
      const int64_t sec_heads = s.section * (c.h / c.hkv), sec = h / sec_heads;
      if (sec < ph / sec_heads) where(t, "sections out of order"), fail();
      if (sec != ph / sec_heads) continue;
      if (pm == m && h != ph + 1) where(t, "heads not adjacent"), fail();
      const int64_t sqb = std::min<int64_t>(std::max<int64_t>(c.lens[size_t(bz)], 0), c.sq);
      if (monotone && batch <= c.cap && key_tiles(m, sqb) > key_tiles(pm, sqb))
        where(t, "not longest first"), fail();
    }
  }
  std::printf(
      "  %zu varlen cases: each real item once, in order; %d above the bound, %d with "
      "sections\n",
      cases.size(), fallbacks, sections);
  assert_true(fallbacks == 2 && sections == 1);
}

// Ring (sm_90 mbarriers): a producer warp and a consumer warp pass 9
// tiles through 2 and 3 stages (the ring wraps, flipping parities). The
// producer waits for a stage to be free (Slot, free_parity), writes 32
// words and arrives on "full"; the consumer waits on "full" with its
// Cursor, copies the words out, arrives on "empty" and advances. Every tile
// must arrive whole and in order; a wrong stage or parity deadlocks (the
// emulator reports it) or reads another tile's words.
void test_ring(void **) {
  constexpr int kTiles = 9;
  // An sm_90 emulator for this test (mbarriers): g_be, restored after.
  std::unique_ptr<fa::Backend> sm90;
  assert_int_equal(fa::create_emulator_backend(90, &sm90), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = sm90.get();
  for (const int stages : {2, 3}) {
    const uint32_t full = 0, empty = 8 * stages, data = 16 * stages;
    const std::string ptx = kernel(
        64,
        [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
          Builder &b = e.b;
          const tile::Ring ring(e, smem, stages);
          Reg lane = e.op(Op::And, Type::B32, tid, imm(31));
          Reg t0 = e.setp(fa::ptx::Cmp::Eq, Type::U32, tid, imm(0));
          for (int st = 0; st < stages; ++st) {
            b.when(t0).mbarrier_init(at(smem, full + 8 * st), imm(32));
            b.when(t0).mbarrier_init(at(smem, empty + 8 * st), imm(32));
          }
          b.bar_sync();
          Reg it = e.mov(Type::U32, imm(0));
          fa::ptx::Label consumer = b.label(), loop_p = b.label(), loop_c = b.label(),
                         done = b.label();
          b.when(e.setp(fa::ptx::Cmp::Ge, Type::U32, tid, imm(32))).bra(consumer);
          b.bind(loop_p);
          {
            const tile::Ring::Slot slot = ring.slot(it);
            Reg bars = ring.bars(slot.stage);
            ring.wait(bars, static_cast<int>(empty), ring.free_parity(slot.parity));
            Reg v = e.op(Op::MadLo, Type::U32, it, imm(100), lane);
            Reg a = e.op(Op::MadLo, Type::U32, slot.stage, imm(128), smem);
            a = e.op(Op::MadLo, Type::U32, lane, imm(4), a);
            b.st(Space::Shared, Type::B32, at(a, data), v);
            b.mbarrier_arrive(at(bars, full));
            b.op(Op::Add, Type::U32, it, it, imm(1));
            b.when(e.setp(fa::ptx::Cmp::Lt, Type::U32, it, imm(kTiles))).bra(loop_p);
            b.bra(done);
          }
          b.bind(consumer);
          const tile::Ring::Cursor cur = ring.begin();
          b.bind(loop_c);
          {
            Reg bars = ring.bars(cur.stage);
            ring.wait(bars, static_cast<int>(full), cur.parity);
            Reg a = e.op(Op::MadLo, Type::U32, cur.stage, imm(128), smem);
            a = e.op(Op::MadLo, Type::U32, lane, imm(4), a);
            Reg v = b.b32();
            b.ld(Space::Shared, Type::B32, v, at(a, data));
            Reg idx = e.op(Op::MadLo, Type::U32, it, imm(32), lane);
            b.st(Space::Global, Type::B32, at(e.index(g[0], idx, 4)), v);
            b.mbarrier_arrive(at(bars, empty));
            ring.advance(cur);
            b.op(Op::Add, Type::U32, it, it, imm(1));
            b.when(e.setp(fa::ptx::Cmp::Lt, Type::U32, it, imm(kTiles))).bra(loop_c);
          }
          b.bind(done);
        },
        80, 90);
    DevBuf out(kTiles * 32 * 4);
    Ptrs pt = {{out.ptr, 0, 0, 0, 0, 0}};
    const fa_status st = launch(ptx, 64, data + 128 * stages, pt);
    if (st != FA_SUCCESS) g_be = sm80;
    assert_int_equal(st, FA_SUCCESS);
    const std::vector<uint32_t> got = out.get<uint32_t>();
    for (int i = 0; i < kTiles; ++i)
      for (int l = 0; l < 32; ++l)
        if (got[size_t(i) * 32 + l] != uint32_t(100 * i + l)) {
          std::fprintf(stderr, "stages %d tile %d lane %d: %u\n", stages, i, l,
                       got[size_t(i) * 32 + l]);
          g_be = sm80;
          fail();
        }
  }
  g_be = sm80;
}

// Swizzle128: addr() and slot_bytes() in a kernel, for 16 rows x 24 chunks
// (three atoms), against offset() and against the layout's statement:
// within a row the 8 chunks of an atom are a permutation of its 8 slots;
// chunk c ^ k is at the address XOR flip(k), and row r + k (r % 8 & k = 0)
// at the address XOR flip(k) plus k rows.
void test_swizzle128(void **) {
  constexpr int kRowsN = 16, kChunks = 24;
  const tile::Swizzle128 sw{2048};
  const std::string ptx = kernel(kRowsN * kChunks, [&](Emitter &e, Reg tid, Reg, Reg *g) {
    Reg row = e.op(Op::Div, Type::U32, tid, imm(kChunks));
    Reg chunk = e.op(Op::Rem, Type::U32, tid, imm(kChunks));
    Reg base = e.mov(Type::U32, imm(4096));
    Reg a = sw.addr(e, base, row, chunk);
    e.b.st(Space::Global, Type::B32, at(e.index(g[0], tid, 4)), a);
    Reg slot = tile::Swizzle128::slot_bytes(e, e.op(Op::And, Type::B32, chunk, imm(7)),
                                            e.op(Op::And, Type::B32, row, imm(7)));
    e.b.st(Space::Global, Type::B32, at(e.index(g[1], tid, 4)), slot);
  });
  DevBuf out(kRowsN * kChunks * 4), slots(kRowsN * kChunks * 4);
  Ptrs pt = {{out.ptr, slots.ptr, 0, 0, 0, 0}};
  assert_int_equal(launch(ptx, kRowsN * kChunks, 0, pt), FA_SUCCESS);
  const std::vector<uint32_t> got = out.get<uint32_t>(), got_slot = slots.get<uint32_t>();
  for (uint32_t r = 0; r < kRowsN; ++r) {
    uint32_t seen[3] = {0, 0, 0};
    for (uint32_t c = 0; c < kChunks; ++c) {
      const uint32_t a = got[r * kChunks + c];
      assert_int_equal(a, 4096 + sw.offset(r, c));
      const uint32_t in_row = a - 4096 - c / 8 * 2048 - r * 128;
      assert_true(in_row < 128 && in_row % 16 == 0);
      assert_int_equal(got_slot[r * kChunks + c], in_row);
      seen[c / 8] |= 1u << (in_row / 16);
      for (uint32_t k = 1; k < 8; ++k) {
        const uint32_t ck = (c & ~7u) | ((c % 8) ^ k);
        assert_int_equal(sw.offset(r, ck), sw.offset(r, c) ^ tile::Swizzle128::flip(k));
        if ((r % 8 & k) == 0 && r + k < kRowsN)
          assert_int_equal(sw.offset(r + k, c),
                           (sw.offset(r, c) ^ tile::Swizzle128::flip(k)) + 128 * k);
      }
    }
    for (uint32_t m : seen) assert_int_equal(m, 0xffu);
  }
  // Its wgmma descriptor bits (PTX ISA "Matrix Descriptor Format"): LBO
  // >> 4 in bits 16-29, SBO = 1024 >> 4 in bits 32-45, swizzle mode 1
  // (128 bytes) in bits 62-63, nothing else.
  const uint64_t d = tile::Swizzle128::desc_bits(8192);
  assert_int_equal((d >> 16) & 0x3fff, 8192 >> 4);
  assert_int_equal((d >> 32) & 0x3fff, 1024 >> 4);
  assert_int_equal(d >> 62, 1);
  assert_int_equal(d & ~((uint64_t(0x3fff) << 16) | (uint64_t(0x3fff) << 32) | (uint64_t(3) << 62)),
                   0);
}

// gather_rows (the sm_90a gather producers' row copy), 128 threads: rows
// first .. first + rows - 1 of a [40][chunks x 8] 16-bit source (element
// (j, x) = 1 + 3 j + 7 x mod 2^16) into Swizzle128 atoms; rows at or past
// `limit` and chunks at or past `data` must be zeros, every other element at
// its (row, chunk) offset. Row widths of 8, 24, 48 and 72 chunks: 16, 4, 2
// and 1 rows a pass (R = 2 and 1: each pass of a period of 8 rows its own
// flip of the swizzle, as the MLA decode's 576-wide rows need), loops and
// fully unrolled passes, one width with data < chunks. The destination is
// poisoned first.
void test_gather_rows(void **) {
  struct Case {
    int chunks, data, rows, first, limit, threads = 128;
  };
  // 128 threads (the sm_90a producer warpgroup) and 64 (the sm_100a
  // forward's two gather warps: 16 chunks of 128 rows as its d128 tiles).
  const Case cases[] = {{8, 8, 32, 2, 30},         {24, 24, 16, 0, 40},    {48, 48, 24, 5, 20},
                        {72, 72, 24, 1, 18},       {72, 64, 8, 3, 40},     {48, 40, 6, 0, 40},
                        {16, 16, 128, 3, 100, 64}, {8, 8, 32, 2, 30, 64},  {32, 24, 20, 1, 18, 64},
                        {1, 1, 12, 0, 8, 64},      {24, 24, 40, 4, 40, 64}};
  for (const Case &c : cases) {
    const int cols = 8 * c.chunks, src_rows = std::max(40, c.limit);
    const uint32_t atom = static_cast<uint32_t>(c.rows) * 128;
    const uint32_t bytes = (c.chunks + 7) / 8 * atom;
    const std::string ptx = kernel(128, [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
      Builder &b = e.b;
      for (uint32_t w = 0; w < bytes / 4; w += 128) {  // poison
        Reg a = e.op(Op::MadLo, Type::U32, e.op(Op::Add, Type::U32, tid, imm(w)), imm(4), smem);
        b.st(Space::Shared, Type::B32, at(a), e.mov(Type::B32, imm(0x7e007e00)));
      }
      b.bar_sync();
      fa::ptx::Label skip = b.label();
      if (c.threads < 128)
        b.when(e.setp(fa::ptx::Cmp::Ge, Type::U32, tid, imm(c.threads))).bra(skip);
      tile::gather_rows(
          e, tid, smem, 0, atom, c.rows, c.chunks, c.data, e.mov(Type::S32, imm(c.first)),
          e.mov(Type::S32, imm(c.limit)), [&](Reg j) { return e.index(g[0], j, 2 * cols); }, 0,
          Type::F16, c.threads);
      b.cp_async_commit();
      b.cp_async_wait(0);
      b.bind(skip);
      b.bar_sync();
      for (uint32_t w = 0; w < bytes / 4; w += 128) {
        Reg idx = e.op(Op::Add, Type::U32, tid, imm(w));
        Reg x = b.b32();
        b.ld(Space::Shared, Type::B32, x, at(e.op(Op::MadLo, Type::U32, idx, imm(4), smem)));
        b.st(Space::Global, Type::B32, at(e.index(g[1], idx, 4)), x);
      }
    });
    std::vector<uint16_t> src(size_t(src_rows) * cols);
    for (int j = 0; j < src_rows; ++j)
      for (int x = 0; x < cols; ++x) src[size_t(j) * cols + x] = uint16_t(1 + 3 * j + 7 * x);
    DevBuf in(src.size() * 2), out(bytes);
    in.put(src);
    Ptrs pt = {{in.ptr, out.ptr, 0, 0, 0, 0}};
    assert_int_equal(launch(ptx, 128, bytes, pt), FA_SUCCESS);
    const std::vector<uint16_t> got = out.get<uint16_t>();
    const tile::Swizzle128 sw{atom};
    int bad = 0;
    for (int r = 0; r < c.rows; ++r)
      for (int x = 0; x < cols; ++x) {
        const int j = c.first + r;
        const uint16_t want = j < c.limit && x / 8 < c.data ? src[size_t(j) * cols + x] : 0;
        const uint16_t v = got[(sw.offset(r, x / 8) + 2 * (x % 8)) / 2];
        if (v != want && bad++ < 5)
          std::fprintf(stderr, "chunks %d rows %d threads %d: row %d col %d: %u, want %u\n",
                       c.chunks, c.rows, c.threads, r, x, v, want);
      }
    assert_int_equal(bad, 0);
  }
}

// store_acc (sm_90 stmatrix): a warp's 16 x 80 accumulator tile (10
// fragments: two atoms of the layout) with a distinct exact value per
// element (f16: 64 r + c; bf16: (128 + c) 2^r), stored at rows 16..31 of a
// Swizzle128 layout; every element must be at its (row, chunk) offset.
// And 9 fragments: the .x2 store of a last odd one. Each also through
// pack_acc's words, the tile zeroed before the store.
void test_store_acc(void **) {
  std::unique_ptr<fa::Backend> sm90;
  assert_int_equal(fa::create_emulator_backend(90, &sm90), FA_SUCCESS);
  fa::Backend *const sm80 = g_be;
  g_be = sm90.get();
  constexpr int kRows = 32;
  const tile::Swizzle128 lay{kRows * tile::Swizzle128::kRowBytes};
  const uint32_t bytes = 2 * lay.atom_bytes;
  for (const int kChunksN : {10, 9})
    for (const Type half : {Type::F16, Type::BF16})
      for (const bool packed : {false, true}) {
        const int kCols = 8 * kChunksN;
        const std::string ptx = kernel(
            32,
            [&](Emitter &e, Reg tid, Reg smem, Reg *g) {
              Builder &b = e.b;
              const tile::Lanes ln = tile::make_lanes(e, tid);
              const tile::AccTile t = tile::acc_tile(b, kChunksN);
              for (int j = 0; j < kChunksN; ++j)
                for (int i = 0; i < 4; ++i) {
                  Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * (i / 2)));
                  Reg col = e.op(Op::MadLo, Type::U32, ln.q, imm(2), imm(8 * j + (i & 1)));
                  // f16: 64 r + c; bf16 (8-bit significands): (128 + c) 2^r.
                  Reg v = half == Type::F16 ? e.op(Op::MadLo, Type::U32, row, imm(64), col)
                                            : e.op(Op::Shl, Type::B32,
                                                   e.op(Op::Add, Type::U32, col, imm(128)), row);
                  b.cvt(Type::F32, Type::U32, fa::ptx::Round::Rn, t.f[j][i], v);
                }
              // packed: pack_acc's words, the tile zeroed after (not read).
              std::vector<Reg> words;
              for (int i = 0; packed && i < 2 * kChunksN; ++i) words.push_back(b.b32());
              if (packed) {
                tile::pack_acc(e, t, half, words);
                tile::zero(b, t);
              }
              tile::store_acc(e, ln, t, half, lay, smem, e.mov(Type::U32, imm(16)), 0,
                              packed ? &words : nullptr);
              b.bar_sync();
              for (uint32_t w = 0; w < bytes / 4; w += 32) {  // smem words out
                Reg idx = e.op(Op::Add, Type::U32, tid, imm(w));
                Reg x = b.b32();
                b.ld(Space::Shared, Type::B32, x,
                     at(e.op(Op::MadLo, Type::U32, idx, imm(4), smem)));
                b.st(Space::Global, Type::B32, at(e.index(g[0], idx, 4)), x);
              }
            },
            80, 90);
        DevBuf out(bytes);
        Ptrs pt = {{out.ptr, 0, 0, 0, 0, 0}};
        const fa_status st = launch(ptx, 32, bytes, pt);
        if (st != FA_SUCCESS) g_be = sm80;
        assert_int_equal(st, FA_SUCCESS);
        const std::vector<uint16_t> got = out.get<uint16_t>();
        int bad = 0;
        for (uint32_t r = 0; r < 16; ++r)
          for (uint32_t c = 0; c < uint32_t(kCols); ++c) {
            const uint32_t at_b = lay.offset(16 + r, c / 8) + 2 * (c % 8);
            const uint16_t x = got[at_b / 2];
            const float v = half == Type::F16 ? hf(x) : fa::emu::bf16_to_f32(x);
            const float want =
                half == Type::F16 ? float(64 * r + c) : std::ldexp(128.0f + c, int(r));
            if (v != want && bad++ < 5)
              std::fprintf(stderr, "%s%s row %u col %u: %g\n", half == Type::F16 ? "f16" : "bf16",
                           packed ? " packed" : "", r, c, v);
          }
        if (bad) g_be = sm80;
        assert_int_equal(bad, 0);
      }
  g_be = sm80;
}

// alibi_row_half on a 16 x 32 tile of ones (row 5 all -inf): row r's
// diagonal is at column diag_r (given per row, made relative to each lane's
// first column 2q as the kernels do, as f32), its coefficient coef_r;
// element (r, c) must become exactly 1 + coef_r |diag_r - c| (powers of two:
// exact), -inf staying -inf. Diagonals inside, left of and right of the
// tile. Then alibi_coef: the slope of (sequence 1, head 2) of a [2][3]
// table (stride 3) times -log2 e / score_scale, and without score_scale
// (softcap: log2-domain scores) times -log2 e.
void test_alibi(void **) {
  const int rows = 16, cols = 32, n = cols / 8;
  const int diag[rows] = {0, 3, 8, 31, 32, -5, 7, 16, 1, 40, 9, 20, 2, 30, 5, 15};
  std::vector<float> coef(rows);
  for (int r = 0; r < rows; ++r) coef[r] = -std::ldexp(1.0f, -(r % 5));
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    const tile::AccTile t = tile::acc_tile(b, n);
    Reg row5 = e.setp(fa::ptx::Cmp::Eq, Type::U32, ln.g, imm(5));
    for (const tile::Frag4 &f : t.f)
      for (int i = 0; i < 4; ++i)
        b.selp(Type::F32, f[i], fimm(i < 2 ? -INFINITY : 1.0f), fimm(1.0f), row5);
    Reg kq = e.op(Op::MulLo, Type::S32, ln.q, imm(2));
    Reg tmp = b.f32();
    for (int h = 0; h < 2; ++h) {
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * h));
      Reg d = b.b32(), df = b.f32(), c = b.f32();
      b.ld(Space::Global, Type::S32, d, at(e.index(g[0], row, 4)));
      b.ld(Space::Global, Type::F32, c, at(e.index(g[1], row, 4)));
      b.op(Op::Sub, Type::S32, d, d, kq);
      b.cvt(Type::F32, Type::S32, fa::ptx::Round::Rn, df, d);
      tile::alibi_row_half(b, t, h, df, c, tmp);
    }
    store_acc(e, ln, t, 0, g[2], cols);
    // alibi_coef reads {alibi_slopes, stride} at parameter offset 24
    // (pointer 3, and pointer 4's bits as the stride).
    Reg one = e.mov(Type::S32, imm(1)), two = e.mov(Type::S32, imm(2));
    Reg c1 = tile::alibi_coef(e, 24, one, two, e.mov(Type::F32, fimm(0.5f)));
    Reg c2 = tile::alibi_coef(e, 24, one, two, Reg());
    Reg t0 = e.setp(fa::ptx::Cmp::Eq, Type::U32, tid, imm(0));
    b.when(t0).st(Space::Global, Type::F32, at(g[5]), c1);
    b.when(t0).st(Space::Global, Type::F32, at(g[5], 4), c2);
  });
  DevBuf dd(rows * 4), dc(rows * 4), dout(rows * cols * 4), ds(6 * 4), dco(8);
  dd.put(std::vector<int32_t>(diag, diag + rows));
  dc.put(coef);
  ds.put(std::vector<float>{9, 9, 9, 9, 9, 0.375f});
  Ptrs pt = {{dd.ptr, dc.ptr, dout.ptr, ds.ptr, 3, dco.ptr}};
  assert_int_equal(launch(ptx, 32, 0, pt), FA_SUCCESS);
  const std::vector<float> got = dout.get<float>();
  int bad = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const float want = r == 5 ? -INFINITY : 1.0f + coef[r] * float(std::abs(diag[r] - c));
      const float v = got[size_t(r) * cols + c];
      if (v != want) {
        if (bad < 5) std::fprintf(stderr, "row %d col %d: %g, want %g\n", r, c, v, want);
        ++bad;
      }
    }
  assert_int_equal(bad, 0);
  const std::vector<float> co = dco.get<float>();
  const float log2e = 1.4426950408889634f;
  assert_true(co[0] == (0.375f * -log2e) / 0.5f);
  assert_true(co[1] == 0.375f * -log2e);
}

// ------------------------------------------------------- online softmax ---

// One warp, two m-tiles (32 rows), scores given tile by tile ([tile][32 rows]
// [bn keys], -inf for masked): OnlineSoftmax::step per tile, O += P V with V
// the identity's first bn rows (so O = sum of p over the key columns), then
// finish. Checked: O / l and LSE against fp64 over all tiles at once.
void test_online_softmax(void **) {
  const int rows = 32, bn = 16, tiles = 4;
  const float scale = 0.5f;
  std::vector<float> s(size_t(tiles) * rows * bn);
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int t = 0; t < tiles; ++t)
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < bn; ++k) {
        float x = nd(gen);
        // Row 3 grows by far more than the threshold in tile 2 (scaled:
        // 60 * 0.5 * log2 e = 43 > 8); row 7 a little each tile.
        if (r == 3 && t == 2) x += 60;
        if (r == 7) x += 2.0f * t;
        if (r == 5 || (r == 9 && t < 3) || (k + r + t) % 7 == 0) x = -INFINITY;  // masked
        s[(size_t(t) * rows + r) * bn + k] = x;
      }
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    Reg c = e.mov(Type::F32, fimm(scale * 1.4426950408889634f));
    tile::OnlineSoftmax sm(e, 2, c);
    std::vector<tile::AccTile> st, o;
    for (int mi = 0; mi < 2; ++mi) {
      st.push_back(tile::acc_tile(b, bn / 8));
      o.push_back(tile::acc_tile(b, bn / 8));
      tile::zero(b, o[mi]);
    }
    for (int t = 0; t < tiles; ++t) {
      // Load the tile's scores into the fragments (row g + 8 (i / 2) + 16 mi,
      // key 8 j + 2 q + (i & 1)).
      for (int mi = 0; mi < 2; ++mi)
        for (int j = 0; j < bn / 8; ++j)
          for (int i = 0; i < 4; ++i) {
            Reg row = e.op(Op::Add, Type::U32, ln.g, imm(16 * mi + 8 * (i / 2)));
            Reg key = e.op(Op::MadLo, Type::U32, ln.q, imm(2), imm(8 * j + (i & 1)));
            Reg idx = e.op(Op::MadLo, Type::U32, row, imm(bn), key);
            b.op(Op::Add, Type::U32, idx, idx, imm(t * rows * bn));
            b.ld(Space::Global, Type::F32, st[mi].f[j][i], at(e.index(g[0], idx, 4)));
          }
      sm.step(st, o);
      // O += P: column k of O gets p of key k (V = identity).
      for (int mi = 0; mi < 2; ++mi)
        for (int j = 0; j < bn / 8; ++j)
          for (int i = 0; i < 4; ++i)
            b.op(Op::Add, Type::F32, o[mi].f[j][i], o[mi].f[j][i], st[mi].f[j][i]);
    }
    std::vector<Reg> lse;
    sm.finish(o, &lse);
    for (int mi = 0; mi < 2; ++mi) store_acc(e, ln, o[mi], mi, g[1], bn);
    // LSE of row (mi, hh) from quad lane 0.
    Reg q0 = e.setp(fa::ptx::Cmp::Eq, Type::U32, ln.q, imm(0));
    for (int r = 0; r < 4; ++r) {
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(16 * (r / 2) + 8 * (r % 2)));
      Reg a = e.index(g[2], row, 4);
      b.when(q0).st(Space::Global, Type::F32, at(a), lse[r]);
    }
  });
  DevBuf ds(s.size() * 4), dout(rows * bn * 4), dlse(rows * 4);
  ds.put(s);
  Ptrs p = {{ds.ptr, dout.ptr, dlse.ptr, 0, 0, 0}};
  assert_int_equal(launch(ptx, 32, 0, p), FA_SUCCESS);
  const std::vector<float> o = dout.get<float>(), lse = dlse.get<float>();
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int t = 0; t < tiles; ++t)
      for (int k = 0; k < bn; ++k)
        m = std::max(m, double(s[(size_t(t) * rows + r) * bn + k]) * scale);
    double l = 0;
    std::vector<double> sum(bn, 0.0);
    for (int t = 0; t < tiles; ++t)
      for (int k = 0; k < bn; ++k) {
        const double x = double(s[(size_t(t) * rows + r) * bn + k]) * scale;
        if (std::isinf(x)) continue;
        l += std::exp(x - m);
        sum[k] += std::exp(x - m);
      }
    const double want_lse = l > 0 ? m + std::log(l) : -INFINITY;
    if (l == 0 ? !(std::isinf(lse[r]) && lse[r] < 0) : std::fabs(lse[r] - want_lse) > 1e-4) {
      std::fprintf(stderr, "row %d: lse %g, want %g\n", r, lse[r], want_lse);
      ++bad;
    }
    for (int k = 0; k < bn; ++k) {
      const double want = l > 0 ? sum[k] / l : 0.0;
      if (!(std::fabs(o[r * bn + k] - want) <= 1e-5)) {
        if (bad < 8)
          std::fprintf(stderr, "row %d key %d: %g, want %g\n", r, k, o[r * bn + k], want);
        ++bad;
      }
    }
  }
  assert_int_equal(bad, 0);
}

// OnlineSoftmax in a given form over `tiles` tiles of [32 rows][bn keys]
// scores (one warp, two m-tiles, c = scale log2 e), O += P with V the
// identity (O's column k sums key k's p over the tiles), then finish, with
// the sink (log2 domain) when sink2 is not NaN. Returns O [32][bn], LSE
// [32] and, after each step, P [tiles][32][bn].
struct SoftmaxRun {
  std::vector<float> o, lse, p;
};
SoftmaxRun run_softmax(const std::vector<float> &s, int tiles, int bn, float scale,
                       tile::SoftmaxForm form, float sink2) {
  const int rows = 32;
  const std::string ptx = kernel(32, [&](Emitter &e, Reg tid, Reg, Reg *g) {
    Builder &b = e.b;
    const tile::Lanes ln = tile::make_lanes(e, tid);
    Reg c = e.mov(Type::F32, fimm(scale * 1.4426950408889634f));
    tile::OnlineSoftmax sm(e, 2, c, form);
    std::vector<tile::AccTile> st, o;
    for (int mi = 0; mi < 2; ++mi) {
      st.push_back(tile::acc_tile(b, bn / 8));
      o.push_back(tile::acc_tile(b, bn / 8));
      tile::zero(b, o[mi]);
    }
    for (int t = 0; t < tiles; ++t) {
      std::vector<Reg> idx;  // element (mi, j, i) of the tile in [rows][bn]
      for (int mi = 0; mi < 2; ++mi)
        for (int j = 0; j < bn / 8; ++j)
          for (int i = 0; i < 4; ++i) {
            Reg row = e.op(Op::Add, Type::U32, ln.g, imm(16 * mi + 8 * (i / 2)));
            Reg key = e.op(Op::MadLo, Type::U32, ln.q, imm(2), imm(8 * j + (i & 1)));
            Reg x = e.op(Op::MadLo, Type::U32, row, imm(bn), key);
            b.op(Op::Add, Type::U32, x, x, imm(t * rows * bn));
            b.ld(Space::Global, Type::F32, st[mi].f[j][i], at(e.index(g[0], x, 4)));
            idx.push_back(x);
          }
      sm.step(st, o);
      for (int mi = 0, n = 0; mi < 2; ++mi)
        for (int j = 0; j < bn / 8; ++j)
          for (int i = 0; i < 4; ++i, ++n) {
            b.st(Space::Global, Type::F32, at(e.index(g[3], idx[size_t(n)], 4)), st[mi].f[j][i]);
            b.op(Op::Add, Type::F32, o[mi].f[j][i], o[mi].f[j][i], st[mi].f[j][i]);
          }
    }
    std::vector<Reg> lse;
    if (std::isnan(sink2))
      sm.finish(o, &lse);
    else
      sm.finish(o, &lse, e.mov(Type::F32, fimm(sink2)));
    for (int mi = 0; mi < 2; ++mi) store_acc(e, ln, o[mi], mi, g[1], bn);
    Reg q0 = e.setp(fa::ptx::Cmp::Eq, Type::U32, ln.q, imm(0));
    for (int r = 0; r < 4; ++r) {
      Reg row = e.op(Op::Add, Type::U32, ln.g, imm(16 * (r / 2) + 8 * (r % 2)));
      Reg a = e.index(g[2], row, 4);  // before when(): the guard is the next instruction's
      b.when(q0).st(Space::Global, Type::F32, at(a), lse[r]);
    }
  });
  DevBuf ds(s.size() * 4), dout(size_t(rows) * bn * 4), dlse(rows * 4), dp(s.size() * 4);
  ds.put(s);
  Ptrs p = {{ds.ptr, dout.ptr, dlse.ptr, dp.ptr, 0, 0}};
  SoftmaxRun r;
  if (launch(ptx, 32, 0, p) != FA_SUCCESS) return r;
  r.o = dout.get<float>();
  r.lse = dlse.get<float>();
  r.p = dp.get<float>();
  return r;
}

// OnlineSoftmax::fp8_form() (the fp8 forward's): after each step every p is
// 2^((s - m) c + 8) with m the row's maximum so far (O and l rescaled on
// every growth, however small: row 8 grows by 2^0.18 a tile), within f32's
// rounding of m c and of the fma (2^-14 relative here, for |m c| up to 45);
// rounded to e4m3 as pack_a_fp8 does, no p exceeds 256 and the row's
// largest score so far, when in the tile, gets exactly 256. (In f32 that p
// is 256 only within a few ulps: fl(fl(8 - fl(m c)) + s c) at s = m is not
// 8 in general; here rows 6, 11 and 13 get 255.999908, 256.000336 and
// 255.999908.)
// finish takes the offset back out: O and LSE those of the default form
// within f32 rounding (2^-20 and 2^-18 absolute) and of one softmax in
// fp64, without and with a sink (finish's overload), for rows that grow by
// less and by far more than the default form's threshold, rows with m c
// near -27 and 16, a row that never sees a key (O = 0, LSE = -inf, or the
// sink's logit with one) and a row whose keys all come in the last tile.
void test_online_softmax_fp8(void **) {
  const int rows = 32, bn = 16, tiles = 4;
  const float scale = 0.5f;
  const double c = scale * 1.4426950408889634;
  std::vector<float> s(size_t(tiles) * rows * bn);
  std::mt19937 gen(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int t = 0; t < tiles; ++t)
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < bn; ++k) {
        float x = nd(gen);
        if (r == 3 && t == 2) x += 60;  // grows by 2^43 at tile 2
        if (r == 7) x += 2.0f * t;      // by about 2^1.4 each tile
        if (r == 8) x += 0.25f * t;     // by much less than the default threshold
        if (r == 11) x -= 40;           // m c about -27
        if (r == 13) x += 20;           // m c about 16
        if (r == 5 || (r == 9 && t < 3) || (k + r + t) % 7 == 0) x = -INFINITY;  // masked
        s[(size_t(t) * rows + r) * bn + k] = x;
      }
  const float nan = std::nanf("");
  const float sink2 = 1.5f;  // the sink's logit, log2 domain
  const SoftmaxRun d0 = run_softmax(s, tiles, bn, scale, tile::SoftmaxForm(), nan);
  const SoftmaxRun f0 = run_softmax(s, tiles, bn, scale, tile::OnlineSoftmax::fp8_form(), nan);
  const SoftmaxRun d1 = run_softmax(s, tiles, bn, scale, tile::SoftmaxForm(), sink2);
  const SoftmaxRun f1 = run_softmax(s, tiles, bn, scale, tile::OnlineSoftmax::fp8_form(), sink2);
  assert_false(d0.o.empty() || f0.o.empty() || d1.o.empty() || f1.o.empty());
  int bad = 0;
  auto e4m3 = [](float x) {
    return fa::ref::fp8_to_double(fa::ref::fp8_from_double(x, false), false);
  };
  double pd = 0, od = 0, ld = 0;  // the largest deviations seen, for the log
  for (int r = 0; r < rows; ++r) {
    // p after each step against 2^((s - m) c + 8) in fp64, m the maximum so
    // far (f32's rounding of m c and of the fma: a few ulps of the exponent).
    double m = -INFINITY;
    for (int t = 0; t < tiles; ++t) {
      for (int k = 0; k < bn; ++k) m = std::max(m, double(s[(size_t(t) * rows + r) * bn + k]));
      for (int k = 0; k < bn; ++k) {
        const size_t i = (size_t(t) * rows + r) * bn + k;
        const double x = s[i], want = std::isinf(x) ? 0.0 : std::exp2((x - m) * c + 8);
        const float got = f0.p[i];
        const double dev = want > 0 ? std::fabs(got - want) / want : std::fabs(got);
        pd = std::max(pd, dev);
        const bool ok = dev <= 0x1p-14 &&
                        (std::isfinite(x) && x == m ? e4m3(got) == 256 : e4m3(got) <= 256) &&
                        f1.p[i] == got;
        if (!ok && bad++ < 8)
          std::fprintf(stderr, "row %d tile %d key %d: p %.9g, want %.9g (m c %g)\n", r, t, k,
                       double(got), want, m * c);
      }
    }
    // finish: O and LSE against the default form's and fp64's, without and
    // with the sink.
    std::vector<double> sum(bn, 0.0);
    double l = 0;
    for (int t = 0; t < tiles; ++t)
      for (int k = 0; k < bn; ++k) {
        const double x = s[(size_t(t) * rows + r) * bn + k];
        if (std::isinf(x)) continue;
        l += std::exp((x - m) * scale);
        sum[size_t(k)] += std::exp((x - m) * scale);
      }
    for (int sk = 0; sk < 2; ++sk) {
      const SoftmaxRun &f = sk ? f1 : f0, &d = sk ? d1 : d0;
      // The denominator e^M L: e^(m scale) l, plus e^sink (natural log).
      const double sink = sk ? sink2 * 0.6931471805599453 : -INFINITY;
      const double M = std::max(m * scale, sink);
      const double a = std::isinf(m) ? 0.0 : std::exp(m * scale - M);
      const double L = l * a + (sk ? std::exp(sink - M) : 0.0);
      const double want_lse = L > 0 ? M + std::log(L) : -INFINITY;
      const float lf = f.lse[size_t(r)], ldf = d.lse[size_t(r)];
      bool ok = std::isinf(want_lse) ? std::isinf(lf) && lf < 0 && std::isinf(ldf) && ldf < 0
                                     : std::fabs(lf - want_lse) <= 1e-4 &&
                                           std::fabs(double(lf) - double(ldf)) <= 0x1p-18;
      if (std::isfinite(want_lse)) ld = std::max(ld, std::fabs(double(lf) - double(ldf)));
      if (l == 0 && sk) ok = ok && lf == sink2 * float(0.6931471805599453);  // no key: the sink
      if (!ok && bad++ < 8)
        std::fprintf(stderr, "row %d sink %d: lse %.9g (default form %.9g), want %.9g\n", r, sk,
                     double(lf), double(ldf), want_lse);
      for (int k = 0; k < bn; ++k) {
        const double want = L > 0 ? sum[size_t(k)] * a / L : 0.0;
        const float g8 = f.o[size_t(r) * bn + k], g = d.o[size_t(r) * bn + k];
        od = std::max(od, std::fabs(double(g8) - g));
        const bool ok_o =
            l == 0 ? g8 == 0.0f && g == 0.0f
                   : std::fabs(g8 - want) <= 1e-5 && std::fabs(double(g8) - g) <= 0x1p-20;
        if (!ok_o && bad++ < 8)
          std::fprintf(stderr, "row %d key %d sink %d: o %.9g (default form %.9g), want %.9g\n", r,
                       k, sk, double(g8), double(g), want);
      }
    }
  }
  std::printf(
      "  fp8 form: p within %.3g (relative) of 2^((s - m) c + 8); O within %.3g and LSE %.3g of "
      "the default form\n",
      pd, od, ld);
  assert_int_equal(bad, 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mma_fragments),  cmocka_unit_test(test_copy_plans),
      cmocka_unit_test(test_fp8_frags),      cmocka_unit_test(test_rows_to_f16),
      cmocka_unit_test(test_rows_to_e4m3),   cmocka_unit_test(test_exp2_poly3),
      cmocka_unit_test(test_mask_row_half),  cmocka_unit_test(test_alibi),
      cmocka_unit_test(test_online_softmax), cmocka_unit_test(test_fp8_mma),
      cmocka_unit_test(test_fp8_pv),         cmocka_unit_test(test_online_softmax_fp8),
      cmocka_unit_test(test_key_range),      cmocka_unit_test(test_scheduler),
      cmocka_unit_test(test_work_scheduler), cmocka_unit_test(test_ring),
      cmocka_unit_test(test_swizzle128),     cmocka_unit_test(test_gather_rows),
      cmocka_unit_test(test_store_acc),
  };
  return cmocka_run_group_tests_name("tile_primitives", tests, emu_setup, emu_teardown);
}
