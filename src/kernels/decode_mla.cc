// sm_90a MLA decode generator: multi-head latent attention (DeepSeek-V2,
// 2024, section 2.1; DeepSeek-V3) over its latent cache on wgmma, in
// FlashMLA's class: one KV head whose rows are head_dim = 576 wide (512
// latent + 64 rope), V = the first head_dim_v = 512 columns of the same rows
// (KernelSpec::v_in_k), and the query heads of the group (x the new tokens)
// packed into wgmma's M.
//
// A CTA of three warpgroups owns 64 packed rows (row r: token r / group,
// query head kv_head group + r % group, as the mma.sync decode) of one
// (split, KV head, batch). Warpgroup 0 is a gather producer (tile::
// gather_rows, one page lookup per key row): Q once, then each K tile of
// block_n keys into a ring of `stages` buffers (full / empty mbarriers,
// tile::Ring). The two consumer warpgroups split both products, so that
// each K tile is read from shared memory by both but loaded once and no
// FLOP is done twice:
//  - S = Q K^T: warpgroup w sums over its half of head_dim (its 64-column
//    atoms, and half of an odd last atom), both over the same 64 rows and
//    block_n keys. Each writes its partial S to shared memory and adds the
//    other's: S = S_0 + S_1 in both (one f32 add, which is commutative, so
//    both hold the same bits) and both run the same online softmax
//    (tile::OnlineSoftmax), so m, l and P agree exactly without another
//    exchange.
//  - O += P V: warpgroup w owns O's columns [w dv / 2, (w + 1) dv / 2)
//    (128 f32 registers a thread at dv 512) and reads its half of V as a
//    view of the K tile (N-major descriptor), P from registers.
// FlashMLA instead alternates the K tiles between its warpgroups and trades
// the row maxima and P through shared memory; the split here keeps the
// softmax free of any cross-warpgroup dependence at the price of computing
// the exponentials twice (MUFU: block_n of them per row and tile per
// warpgroup, against 64 x block_n x (d / 2 + dv / 2) MACs).
// On sm_100a (spec.tcgen05) the same CTA, producer and partial state run
// on tcgen05.mma with S and O in tensor memory: warpgroup 1 (4 warps) is
// the softmax, warp 8 issues every MMA. The 64 rows are an M = 64 MMA,
// whose rows 16q..16q+15 sit in lanes 32q..32q+15 of warp q's quarter of
// tensor memory (PTX ISA "Data Path Layout"), so the other 16 lanes of
// each quarter hold a second M = 64 matrix at the same columns (lane field
// 16): O's two column halves [0, dv / 2) and [dv / 2, dv) share 256
// columns, and S's two halves of each key tile (keys [0, block_n / 2) and
// [block_n / 2, block_n)) share block_n / 2 columns of each of two S
// buffers. Thread t of softmax warp q so holds row 16q + t % 16's half t /
// 16 of the keys and of O: one shfl exchanges the row maximum (and l at
// the end). P goes to shared memory (the A operand of both O halves' MMAs).
// Per key tile j the MMA warp issues S(j + 1) before O += P(j) V(j), so the
// tensor core computes the next scores while the softmax runs; a K tile's
// stage is freed by the commit after its P V (V is in K).
// Like the tensor-core decode, each CTA writes its split's partial state
// (O normalised within the split, fp32, and the natural LSE) and the combine
// (fa_decode_reduce's kernel) merges the splits. Layout, pipeline and
// costs: docs/kernels.md, "MLA decode on sm_90a" and "MLA decode on sm_100a".
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/merge.h"
#include "kernels/tile/ring.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/swizzle.h"
#include "kernels/tile/tile.h"
#include "kernels/tile/umma.h"

namespace fa {
namespace kgen {
namespace {

using ptx::fimm;
using tile::AccTile;
using tile::Frag4;
using tile::Swizzle128;

constexpr int kRows = 64;  // packed rows per CTA: one wgmma M
constexpr int kAtomCols = 64;
constexpr int kAtomBytes = 128;           // one swizzled row of an atom
constexpr uint32_t kFragBytes = 32 * 16;  // one accumulator fragment of a warp: 32 lanes x v4
// setmaxnreg: 128 x 56 + 256 x 224 <= 65536 (the forward's gather split);
// converting fp8 K the producer holds each chunk's bytes, halves and f32
// pairs: 72 + 216 (the forward's fp8 split).
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
constexpr int kFp8ProducerRegs = 72, kFp8ConsumerRegs = 216;
// Named barriers: 0 the CTA's, 1 the producer's row table, 2 the partial
// scores written, 3 the partial scores read (the buffer free again).
constexpr int kProducerBar = 1, kScoresFull = 2, kScoresFree = 3;

// sm_100a: tensor memory (all 512 columns: O's halves in 0 .. dv / 2, the
// two S buffers of block_n / 2 columns after them).
constexpr uint32_t kTmemCols = 512;
// sm_100a named barriers / mbarrier arrivals: the softmax warpgroup's.
constexpr int kSoftmaxThreads = 128;

// Dynamic shared memory (tiles 1024-byte aligned: the 128-byte swizzle's
// period): Q as qa column atoms of [64 rows][128 B]; `stages` K tiles of qa
// atoms of [block_n][128 B]; the partial scores, per consumer warp and
// accumulator fragment 32 lanes x 16 bytes (each thread's four f32 of a
// fragment, so a warp's store and its partner's load are conflict-free);
// the producer's row table (a K row address per key of the tile: paged
// caches); the mbarriers q_full, k_full[s], k_empty[s]. sm_100a: P as
// [64 rows][128 B] (one swizzled atom: keys 0 .. block_n - 1) in place of
// the partial scores, and after the ring's mbarriers s_full[2], p_full,
// o_full and the tensor memory address.
struct Layout {
  int qa = 0;  // 64-column atoms of a Q / K row
  int S = 0;   // stages
  uint32_t q_atom = 0, kv_atom = 0, k = 0, k_stage = 0, x = 0, rows = 0, bars = 0, total = 0;
  uint32_t q_full() const { return bars; }
  uint32_t k_full(int s) const { return bars + 8 + 8 * static_cast<uint32_t>(s); }
  uint32_t k_empty(int s, int S) const { return k_full(S) + 8 * static_cast<uint32_t>(s); }
  uint32_t s_full(int b) const { return k_empty(S, S) + 8 * static_cast<uint32_t>(b); }
  uint32_t p_full() const { return s_full(2); }
  uint32_t o_full() const { return s_full(3); }
  uint32_t tmem() const { return s_full(4); }
};

Layout layout(const KernelSpec &s) {
  Layout l;
  l.qa = s.head_dim / kAtomCols;
  l.q_atom = kRows * Swizzle128::kRowBytes;
  l.kv_atom = static_cast<uint32_t>(s.block_n) * Swizzle128::kRowBytes;
  l.k = static_cast<uint32_t>(l.qa) * l.q_atom;
  l.k_stage = static_cast<uint32_t>(l.qa) * l.kv_atom;
  l.x = l.k + static_cast<uint32_t>(s.stages) * l.k_stage;
  l.S = s.stages;
  const uint32_t x_bytes = s.tcgen05 ? kRows * Swizzle128::kRowBytes
                                     : 2 * 4 * static_cast<uint32_t>(s.block_n / 8) * kFragBytes;
  l.rows = l.x + x_bytes;
  l.bars = l.rows + 8 * static_cast<uint32_t>(s.block_n);
  l.total = s.tcgen05 ? l.tmem() + 8 : l.bars + 8 + 16 * static_cast<uint32_t>(s.stages);
  return l;
}

class DecodeMlaGen {
 public:
  explicit DecodeMlaGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), decode_params_size(spec)),
        e_(b_),
        half_(spec.dtype == Dtype::F16 ? Type::F16 : Type::BF16),
        fp8_(spec.kv_fp8 == KvFp8::None   ? 0
             : spec.kv_fp8 == KvFp8::E5M2 ? 2
                                          : 1) {
    S_ = spec.stages;
    G_ = spec.group_size;
    nS_ = spec.block_n / 8;
    nv_ = spec.head_dim_v / 2;  // a consumer warpgroup's O columns
    kP_ = spec.block_n / 16;
    tc05_ = spec.tcgen05;
  }

  std::string run() {
    b_.comment(spec_.describe());
    if (tc05_) return run_sm100();
    // For sass-report: each of the 8 consumer warps does half of the work
    // of its 16 rows (half of d, half of dv): 8 rows' worth.
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=384 compute_warps=8 block_m=%d block_n=%d "
                  "rows_per_warp=8 d=%d dv=%d",
                  lay_.total, kRows, spec_.block_n, spec_.head_dim, spec_.head_dim_v);
    b_.comment(perf);
    const WarpgroupFrame f = warpgroup_frame(e_);
    tid_ = f.tid;
    warp_ = f.warp;
    smem_ = f.smem;
    prologue();
    return warpgroup_roles(
        e_, spec_, warp_, [this] { producer(); }, [this] { consumers(); });
  }

 private:
  using P = DecodeParams;

  // ---- every thread: the CTA's rows, keys and tiles; barriers set up ----
  void prologue() {
    split_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    Reg y = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    bz_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    sq_ = e_.param(Type::S32, offsetof(P, seqlen_q));
    rows_ = e_.op(Op::MulLo, Type::S32, sq_, imm(G_));  // packed rows (API: <= FA_MAX_SEQLEN)
    Reg nblk = e_.op(Op::Add, Type::S32, rows_, imm(kRows - 1));
    b_.op(Op::Shr, Type::S32, nblk, nblk, imm(6));
    kvh_ = e_.op(Op::Div, Type::S32, y, nblk);
    m0_ = e_.op(Op::Shl, Type::B32, e_.op(Op::Rem, Type::S32, y, nblk), imm(6));
    if (spec_.varlen) {
      // spec.direct_out with cu_seqlens_q (the forward's packed queries):
      // sequence bz's queries are rows cu[bz] .. of q and o, at most
      // seqlen_q (the grid's row blocks count those); a CTA past its rows
      // leaves before any barrier.
      Reg cuq = e_.global_param(offsetof(P, cu_seqlens_q));
      Reg a = e_.index(cuq, bz_, 4);
      q0_ = b_.b32();
      Reg q1 = b_.b32();
      b_.ld(Space::Global, Type::S32, q0_, at(a), true);
      b_.ld(Space::Global, Type::S32, q1, at(a, 4), true);
      total_q_ = b_.b32();
      b_.ld(Space::Global, Type::S32, total_q_,
            at(e_.index(cuq, e_.param(Type::S32, offsetof(P, batch)), 4)), true);
      sq_ = seq_len(e_, q0_, q1, sq_);
      rows_ = e_.op(Op::MulLo, Type::S32, sq_, imm(G_));
      b_.when(e_.setp(Cmp::Ge, Type::S32, m0_, rows_)).exit();
    }
    Reg k = e_.global_param(offsetof(P, k)), v = e_.global_param(offsetof(P, v));
    Reg ks[3], vs[3];
    for (int i = 0; i < 3; ++i) {
      ks[i] = e_.stride_bytes(offsetof(P, k_stride) + 8 * i, fp8_ ? 1 : 2);
      vs[i] = e_.stride_bytes(offsetof(P, v_stride) + 8 * i, fp8_ ? 1 : 2);
    }
    kv_rows(e_, spec_, offsetof(P, kv), k, v, ks, vs, bz_, kvh_, &kr_, &vr_);
    // cache_seqlens is device data: clamped to [0, seqlen_k_max].
    Reg seqlens = spec_.fixed_len ? Reg() : e_.global_param(offsetof(P, cache_seqlens));
    sk_ = decode_seqlen(e_, spec_, bz_, seqlens);
    b_.op(Op::Min, Type::S32, sk_, sk_, e_.param(Type::S32, offsetof(P, seqlen_k_max)));
    b_.op(Op::Max, Type::S32, sk_, sk_, imm(0));
    // The split's keys [split * split_size, min(+split_size, sk)), in 64 bits.
    Reg split_size = e_.param(Type::S32, offsetof(P, split_size));
    Reg lo64 = e_.wide_mul(split_, split_size);
    Reg hi64 = e_.op(Op::Add, Type::S64, lo64, e_.s64(split_size));
    b_.op(Op::Min, Type::S64, hi64, hi64, e_.s64(sk_));
    b_.op(Op::Min, Type::S64, lo64, lo64, e_.s64(sk_));
    slo_ = e_.s32(lo64);
    shi_ = e_.s32(hi64);
    // The CTA's keys: from its first row's first key (rounded down to a
    // whole tile from the split's first key) to its last valid row's last;
    // every role derives the same count.
    Reg last = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, m0_, imm(kRows)), rows_);
    b_.op(Op::Sub, Type::S32, last, last, imm(1));
    const tile::RowRange first = row_keys(e_.op(Op::Div, Type::S32, m0_, imm(G_)));
    const tile::RowRange end = row_keys(e_.op(Op::Div, Type::S32, last, imm(G_)));
    n0_ = e_.op(Op::Div, Type::S32, e_.op(Op::Sub, Type::S32, first.lo, slo_), imm(spec_.block_n));
    b_.op(Op::MadLo, Type::S32, n0_, n0_, imm(spec_.block_n), slo_);
    Reg span = e_.op(Op::Sub, Type::S32, end.hi, n0_);
    b_.op(Op::Max, Type::S32, span, span, imm(0));
    tiles_ = e_.op(Op::Add, Type::S32, span, imm(spec_.block_n - 1));
    b_.op(Op::Div, Type::S32, tiles_, tiles_, imm(spec_.block_n));

    b_.comment(tc05_ ? "mbarriers: full = 128 producer threads' arrivals; empty, s_full, o_full = "
                       "one tcgen05.commit; p_full = 128 softmax threads"
                     : "mbarriers: full = 128 producer threads' arrivals; empty = 256 consumers");
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    b_.when(t0).mbarrier_init(at(smem_, lay_.q_full()), imm(128));
    for (int s = 0; s < S_; ++s) {
      b_.when(t0).mbarrier_init(at(smem_, lay_.k_full(s)), imm(128));
      b_.when(t0).mbarrier_init(at(smem_, lay_.k_empty(s, S_)), imm(tc05_ ? 1 : 256));
    }
    if (!tc05_) {
      b_.fence_proxy_async();
      b_.bar_sync();
      return;
    }
    for (int i = 0; i < 2; ++i) b_.when(t0).mbarrier_init(at(smem_, lay_.s_full(i)), imm(1));
    b_.when(t0).mbarrier_init(at(smem_, lay_.p_full()), imm(kSoftmaxThreads));
    b_.when(t0).mbarrier_init(at(smem_, lay_.o_full()), imm(1));
    b_.comment("tensor memory: warp 0 allocates all 512 columns");
    ptx::Label allocated = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, warp_, imm(0))).bra(allocated);
    b_.tcgen05_alloc(at(smem_, lay_.tmem()), imm(kTmemCols));
    b_.tcgen05_relinquish_alloc_permit();
    b_.bind(allocated);
    b_.fence_proxy_async();
    b_.tcgen05_fence_before_thread_sync();
    b_.bar_sync();
    b_.tcgen05_fence_after_thread_sync();
    Reg tm = b_.b32();
    b_.ld(Space::Shared, Type::U32, tm, at(smem_, lay_.tmem()));
    tmem_ = uniform(tm);
  }

  // The keys [lo, hi) token t (s32) sees within the split: the decode's
  // bottom-right alignment (diagonal t + seqlen_k - seqlen_q) and windows.
  tile::RowRange row_keys(Reg t) {
    Reg wl = e_.param(Type::S32, offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, offsetof(P, window_right));
    Reg diag = e_.op(Op::Add, Type::S32, t, e_.op(Op::Sub, Type::S32, sk_, sq_));
    return tile::row_range(e_, diag, wl, wr, slo_, shi_);
  }

  tile::Ring ring() const { return tile::Ring(const_cast<Emitter &>(e_), smem_, S_); }

  // ---- warpgroup 0: Q, then the K tiles, by cp.async ----
  // Each thread waits for its copies of tile it (wait_group 0) and arrives
  // on its full barrier after a fence.proxy.async (cp.async writes are
  // generic-proxy writes; wgmma reads through the async proxy); Q's barrier
  // with the first tile. Not one tile later, as the forward's gather
  // producer does: a stage holds K and V, so the consumers free it only
  // after the next tile's S, and with two stages the next tile's copy would
  // wait for a stage that waits for this arrival. So one tile loads while
  // the consumers compute the other.
  void producer() {
    // (sm_100a: no setmaxnreg; the CTA's 168 registers a thread suffice)
    if (!tc05_) b_.setmaxnreg(false, fp8_ ? kFp8ProducerRegs : kProducerRegs);
    ptx::Label out = b_.label();
    b_.when(e_.setp(Cmp::Le, Type::S32, tiles_, imm(0))).bra(out);
    b_.comment("Q: the CTA's packed rows (zeros past the group's rows)");
    Reg q = e_.global_param(offsetof(P, q));
    Reg qs[3];
    for (int i = 0; i < 3; ++i) qs[i] = e_.stride_bytes(offsetof(P, q_stride) + 8 * i, 2);
    Reg q_b = spec_.varlen ? e_.index(q, q0_, qs[1]) : e_.index(q, bz_, qs[0]);
    Reg kvh_g = e_.op(Op::MulLo, Type::S32, kvh_, imm(G_));
    const int chunks = 8 * lay_.qa, data = spec_.head_dim / 8;
    tile::gather_rows(e_, tid_, smem_, 0, lay_.q_atom, kRows, chunks, data, m0_, rows_, [&](Reg r) {
      Reg t = e_.op(Op::Div, Type::S32, r, imm(G_));
      Reg qh = e_.op(Op::Add, Type::S32, kvh_g, e_.op(Op::Rem, Type::S32, r, imm(G_)));
      return e_.index(e_.index(q_b, t, qs[1]), qh, qs[2]);
    });
    b_.cp_async_commit();
    b_.comment("K tiles, first to last (zeros past seqlen_k)");
    Reg it = e_.mov(Type::U32, imm(0));
    Reg n = e_.mov(Type::S32, n0_);
    ptx::Label top = b_.label();
    b_.bind(top);
    const tile::Ring::Slot slot = ring().slot(it);
    Reg bar = ring().bars(slot.stage);
    ring().wait(bar, static_cast<int>(lay_.k_empty(0, S_)), ring().free_parity(slot.parity));
    Reg dst = e_.op(Op::MadLo, Type::U32, slot.stage, imm(lay_.k_stage), smem_);
    k_tile(dst, n, chunks, data);
    b_.cp_async_commit();
    b_.cp_async_wait(0);
    b_.fence_proxy_async();
    b_.when(e_.setp(Cmp::Eq, Type::U32, it, imm(0))).mbarrier_arrive(at(smem_, lay_.q_full()));
    b_.mbarrier_arrive(at(bar, static_cast<int>(lay_.k_full(0))));
    b_.op(Op::Add, Type::U32, it, it, imm(1));
    b_.op(Op::Add, Type::S32, n, n, imm(spec_.block_n));
    b_.when(e_.setp(Cmp::Lt, Type::S32, it, tiles_)).bra(top);
    b_.bind(out);
  }

  // K rows n .. n + block_n - 1 into the stage at dst (+ lay_.k): paged, a
  // row table of one block_table lookup per key (threads t < block_n, named
  // barrier 1 before (the previous tile's table was read) and after), else
  // KvRows::at.
  void k_tile(Reg dst, Reg n, int chunks, int data) {
    std::function<Reg(Reg)> row;
    if (kr_.paged()) {
      b_.comment("row addresses of the tile, one page lookup per row");
      b_.bar_sync(kProducerBar, 128);
      ptx::Label skip = b_.label();
      b_.when(e_.setp(Cmp::Ge, Type::U32, tid_, imm(spec_.block_n))).bra(skip);
      Reg j = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, n, tid_),
                    e_.op(Op::Sub, Type::S32, sk_, imm(1)));
      Reg slot = e_.op(Op::MadLo, Type::U32, tid_, imm(8), smem_);
      b_.st(Space::Shared, Type::U64, at(slot, lay_.rows), kr_.at(e_, j));
      b_.bind(skip);
      b_.bar_sync(kProducerBar, 128);
      row = [&](Reg j) {
        Reg slot = e_.op(Op::Sub, Type::S32, j, n);
        b_.op(Op::MadLo, Type::U32, slot, slot, imm(8), smem_);
        Reg a = b_.b64();
        b_.ld(Space::Shared, Type::U64, a, at(slot, lay_.rows));
        return a;
      };
    } else {
      row = [&](Reg j) { return kr_.at(e_, j); };
    }
    tile::gather_rows(e_, tid_, dst, lay_.k, lay_.kv_atom, spec_.block_n, chunks, data, n, sk_, row,
                      fp8_, half_);
  }

  // ---- warpgroups 1 and 2: the same 64 rows, half of d and of dv each ----
  void consumers() {
    b_.setmaxnreg(true, fp8_ ? kFp8ConsumerRegs : kConsumerRegs);
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    ln_ = tile::make_lanes(e_, lane);
    wg_ = e_.op(Op::Sub, Type::U32, e_.op(Op::Shr, Type::U32, warp_, imm(2)), imm(1));
    Reg wq = e_.op(Op::And, Type::B32, warp_, imm(3));  // the warp's rows: 16 wq ..
    wrow_ = e_.op(Op::Shl, Type::B32, wq, imm(4));
    // This thread's partial-score slots: its own warpgroup's, the other's.
    Reg xo = e_.op(Op::MadLo, Type::U32, wq, imm(nS_ * kFragBytes), smem_);
    b_.op(Op::MadLo, Type::U32, xo, lane, imm(16), xo);
    b_.op(Op::Add, Type::U32, xo, xo, imm(lay_.x));
    x_own_ = e_.op(Op::MadLo, Type::U32, wg_, imm(4 * nS_ * kFragBytes), xo);
    x_other_ = e_.op(Op::MadLo, Type::U32, e_.op(Op::Xor, Type::B32, wg_, imm(1)),
                     imm(4 * nS_ * kFragBytes), xo);
    descriptors();
    s_ = tile::acc_tile(b_, nS_);
    o_ = tile::acc_tile(b_, nv_ / 8);
    for (const Frag4 &f : s_.f)
      for (Reg r : f) s_flat_.push_back(r);
    for (const Frag4 &f : o_.f)
      for (Reg r : f) o_flat_.push_back(r);
    for (int t = 0; t < kP_; ++t) pa_.push_back(tile::frag4(b_));
    tile::zero(b_, o_);
    // fp8 K: the (batch, KV head)'s descale scales every score.
    Reg scale = e_.param(Type::F32, offsetof(P, score_scale));
    if (fp8_) b_.op(Op::Mul, Type::F32, scale, scale, descale(offsetof(P, k_descale)));
    softmax_ = std::make_unique<tile::OnlineSoftmax>(e_, 1, scale);
    // This thread's rows m0 + 16 wq + g + 8h: their keys (a padding row: none).
    for (int h = 0; h < 2; ++h) {
      Reg r = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
      if (h) b_.op(Op::Add, Type::S32, r, r, imm(8));
      const tile::RowRange k = row_keys(e_.op(Op::Div, Type::S32, r, imm(G_)));
      Reg pad = e_.setp(Cmp::Ge, Type::S32, r, rows_);
      lo_[h] = k.lo;
      hi_[h] = k.hi;
      b_.selp(Type::S32, hi_[h], imm(0), hi_[h], pad);
      b_.selp(Type::S32, lo_[h], imm(0), lo_[h], pad);
    }
    ptx::Label no_key = b_.label();
    b_.when(e_.setp(Cmp::Le, Type::S32, tiles_, imm(0))).bra(no_key);
    ring().wait(smem_, static_cast<int>(lay_.q_full()), e_.mov(Type::U32, imm(0)));
    cur_ = ring().begin();
    n_ = e_.mov(Type::S32, n0_);
    it_ = e_.mov(Type::S32, imm(0));

    b_.comment("first K tile: S, softmax, P (its P V runs with the next S)");
    Reg bar = ring().bars(cur_.stage);
    ring().wait(bar, static_cast<int>(lay_.k_full(0)), cur_.parity);
    b_.wgmma_fence();
    issue_s(cur_.stage);
    b_.wgmma_commit();
    b_.wgmma_wait(0);
    scores(true);
    softmax_->step({s_}, {o_});
    pack_p();
    next_tile();

    ptx::Label top = b_.label(), tail = b_.label();
    b_.bind(top);
    b_.when(e_.setp(Cmp::Ge, Type::S32, it_, tiles_)).bra(tail);
    body();
    b_.bra(top);
    b_.bind(tail);
    b_.comment("O += P V of the last tile");
    Reg pbar = ring().bars(cur_.prev_stage);
    b_.wgmma_fence();
    issue_pv(cur_.prev_stage);
    b_.wgmma_commit();
    b_.wgmma_wait(0);
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.k_empty(0, S_))));
    b_.bind(no_key);
    epilogue();
  }

  // Descriptors (start address >> 4 in bits 0-13; tile::Swizzle128): Q and
  // K K-major from this warpgroup's first column of the sum (its atoms
  // qa / 2 w .., and with an odd qa the 32 columns 32 w of the last atom),
  // V N-major over the K tile's columns dv / 2 w .. (LBO: the next atom).
  void descriptors() {
    const int half = lay_.qa / 2;
    Reg wg64 = b_.b64();
    b_.cvt(Type::U64, Type::U32, ptx::Round::None, wg64, wg_);
    auto moved = [&](Reg d, uint32_t bytes_per_wg, uint32_t fixed) {
      Reg r = e_.op(Op::MadLo, Type::S64, wg64, imm(bytes_per_wg >> 4), d);
      b_.op(Op::Add, Type::S64, r, r, imm(fixed >> 4));
      return r;
    };
    Reg q0 = Swizzle128::descriptor(e_, smem_, 0, Swizzle128::desc_bits(16));
    Reg k0 = Swizzle128::descriptor(e_, smem_, lay_.k, Swizzle128::desc_bits(16));
    Reg v0 = Swizzle128::descriptor(e_, smem_, lay_.k, Swizzle128::desc_bits(lay_.kv_atom));
    const uint32_t last = static_cast<uint32_t>(lay_.qa - 1);
    qa_ = moved(q0, half * lay_.q_atom, 0);
    ka_ = moved(k0, half * lay_.kv_atom, 0);
    if (lay_.qa % 2) {
      qr_ = moved(q0, 64, last * lay_.q_atom);
      kr_desc_ = moved(k0, 64, last * lay_.kv_atom);
    }
    vd_ = moved(v0, static_cast<uint32_t>(nv_ / kAtomCols) * lay_.kv_atom, 0);
  }

  // A descriptor d moved to stage s (u32): k_stage bytes further per stage.
  Reg at_stage(Reg d, Reg s) {
    Reg off = b_.b64();
    b_.mul_wide(Type::U32, off, s, imm(lay_.k_stage >> 4));
    return e_.op(Op::Add, Type::S64, d, off);
  }

  // Issues this warpgroup's part of S = Q K^T on stage s (no commit): k16
  // step i of atom a at a atom + 32 (i % 4) bytes.
  void issue_s(Reg s) {
    Reg ka = at_stage(ka_, s);
    Reg kr = lay_.qa % 2 ? at_stage(kr_desc_, s) : Reg();
    const int steps = 4 * (lay_.qa / 2) + (lay_.qa % 2 ? 2 : 0);
    for (int i = 0; i < steps; ++i) {
      const bool rope = i >= 4 * (lay_.qa / 2);
      const int a = rope ? 0 : i / 4, j = rope ? i - 4 * (lay_.qa / 2) : i % 4;
      Reg qd = e_.op(Op::Add, Type::S64, rope ? qr_ : qa_, imm((a * lay_.q_atom + 32 * j) >> 4));
      Reg kd = e_.op(Op::Add, Type::S64, rope ? kr : ka, imm((a * lay_.kv_atom + 32 * j) >> 4));
      b_.wgmma_ss(half_, spec_.block_n, s_flat_.data(), qd, kd, imm(i == 0 ? 0 : 1), false);
    }
  }

  // Issues O += P V with P in pa_ and this warpgroup's V columns in stage s
  // (no commit): keys 16 t .. at 16 rows of 128 B further in each atom.
  void issue_pv(Reg s) {
    Reg vd = at_stage(vd_, s);
    for (int t = 0; t < kP_; ++t) {
      Reg d = e_.op(Op::Add, Type::S64, vd, imm((int64_t(t) * 16 * 128) >> 4));
      b_.wgmma_rs(half_, nv_, o_flat_.data(), pa_[t].data(), d, imm(1), true);
    }
  }

  // The whole S from the two partial sums (through shared memory), then
  // the mask: keys outside a row's [lo, hi) become -inf (element (j, x) of
  // row half h holds key n + 8j + 2q + x). first: no previous tile's reads
  // to wait for.
  void scores(bool first) {
    b_.comment("S = S_0 + S_1: the two warpgroups' halves of the sum over head_dim");
    if (!first) b_.bar_sync(kScoresFree, 256);
    for (int j = 0; j < nS_; ++j)
      b_.st_v(Space::Shared, Type::F32, at(x_own_, j * static_cast<int>(kFragBytes)),
              {s_.f[j][0], s_.f[j][1], s_.f[j][2], s_.f[j][3]});
    b_.bar_sync(kScoresFull, 256);
    Reg x[4] = {b_.f32(), b_.f32(), b_.f32(), b_.f32()};
    for (int j = 0; j < nS_; ++j) {
      b_.ld_v(Space::Shared, Type::F32, {x[0], x[1], x[2], x[3]},
              at(x_other_, j * static_cast<int>(kFragBytes)));
      for (int i = 0; i < 4; ++i) b_.op(Op::Add, Type::F32, s_.f[j][i], s_.f[j][i], x[i]);
    }
    b_.comment("mask");
    Reg kq = e_.op(Op::MadLo, Type::S32, ln_.q, imm(2), n_);
    Reg p = b_.pred(), t = b_.pred();
    for (int h = 0; h < 2; ++h) {
      Reg lo = e_.op(Op::Sub, Type::S32, lo_[h], kq), hi = e_.op(Op::Sub, Type::S32, hi_[h], kq);
      tile::mask_row_half(b_, s_, h, lo, hi, p, t);
    }
  }

  // A descale of this (batch, KV head) (DecodeParams' k_ or v_descale).
  Reg descale(size_t param) {
    return load_descale(e_, param, offsetof(P, descale_stride), bz_, kvh_);
  }

  void pack_p() {
    for (int t = 0; t < kP_; ++t) tile::pack_a(b_, half_, s_, 2 * t, pa_[t]);
  }

  void next_tile() {
    ring().advance(cur_);
    b_.op(Op::Add, Type::S32, n_, n_, imm(spec_.block_n));
    b_.op(Op::Add, Type::S32, it_, it_, imm(1));
  }

  // Tile it: S_it = Q K_it^T and O += P_{it-1} V_{it-1} in flight together;
  // the exchange, mask and softmax of S_it while the P V runs; O rescaled
  // once it is done, and the previous stage freed.
  void body() {
    Reg bar = ring().bars(cur_.stage), pbar = ring().bars(cur_.prev_stage);
    ring().wait(bar, static_cast<int>(lay_.k_full(0)), cur_.parity);
    b_.wgmma_fence();
    b_.comment("S = Q K^T (this warpgroup's half of head_dim)");
    issue_s(cur_.stage);
    b_.wgmma_commit();
    b_.comment("O += P V of the previous tile");
    issue_pv(cur_.prev_stage);
    b_.wgmma_commit();
    b_.wgmma_wait(1);  // S is in; P V may still run
    scores(false);
    softmax_->step_scores({s_});
    b_.wgmma_wait(0);  // P V done: O and the previous stage are free
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.k_empty(0, S_))));
    softmax_->rescale({o_});
    pack_p();
    next_tile();
  }

  // O / l and LSE as the split's partial state (fp32, the mma.sync decode's
  // layout): row r = m0 + 16 wq + g + 8h (token r / G, head kvh G + r % G)
  // at ((split batch + b) seqlen_q + t) heads_q + head of O_partial, this
  // warpgroup's columns; the LSE (natural) by warpgroup 0's quad leaders.
  // A row with no key holds O = 0 and LSE = -inf (weight 0 in the combine).
  void epilogue() {
    b_.comment("the split's partial state: O / l (fp32) and LSE");
    std::vector<Reg> lse;
    softmax_->finish({o_}, &lse);
    if (fp8_) {
      // V's descale on O, but not on a row with no key (O = 0 whatever it is).
      Reg vd = descale(offsetof(P, v_descale)), f = b_.f32();
      for (int h = 0; h < 2; ++h) {
        b_.selp(Type::F32, f, vd, fimm(0.0f), e_.setp(Cmp::Gt, Type::F32, lse[h], fimm(kNegInf)));
        for (const Frag4 &fr : o_.f)
          for (int x = 2 * h; x < 2 * h + 2; ++x) b_.op(Op::Mul, Type::F32, fr[x], fr[x], f);
      }
    }
    const PartialOut out = partial_out();
    Reg lead = e_.setp(Cmp::Eq, Type::U32, ln_.q, imm(0));
    b_.op(Op::And, Type::Pred, lead, lead, e_.setp(Cmp::Eq, Type::U32, wg_, imm(0)));
    for (int h = 0; h < 2; ++h) {
      Reg r = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
      if (h) b_.op(Op::Add, Type::S32, r, r, imm(8));
      Reg ok = e_.setp(Cmp::Lt, Type::S32, r, rows_);
      ptx::Label skip = b_.label();
      b_.unless(ok).bra(skip);
      const PartialRow pr = partial_row(out, r);
      Reg ga = partial_o(out, pr);
      ga = e_.index(ga, wg_, nv_ * 4);
      ga = e_.index(ga, ln_.q, 8);
      for (int j = 0; j < o_.n(); ++j)
        b_.st_v(Space::Global, Type::F32, at(ga, 32 * j), {o_.f[j][2 * h], o_.f[j][2 * h + 1]});
      Reg la = partial_lse(out, pr);
      b_.when(lead).st(Space::Global, Type::F32, at(la), lse[h]);
      b_.bind(skip);
    }
  }

  // The partial state's arrays and this CTA's (split, batch) row base.
  struct PartialOut {
    Reg hq, sb, opart, lpart, kvh_g;
  };
  PartialOut partial_out() {
    PartialOut o;
    Reg batch = e_.param(Type::S32, offsetof(P, batch));
    o.hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    o.sb = e_.wide_mad(split_, batch, e_.s64(bz_));
    o.opart = e_.global_param(offsetof(P, o_partial));
    o.lpart = e_.global_param(offsetof(P, lse_partial));
    o.kvh_g = e_.op(Op::MulLo, Type::S32, kvh_, imm(G_));
    return o;
  }
  // Packed row r (s32): its token r / G and query head kvh G + r % G.
  struct PartialRow {
    Reg t, qh;
  };
  PartialRow partial_row(const PartialOut &o, Reg r) {
    return {e_.op(Op::Div, Type::S32, r, imm(G_)),
            e_.op(Op::Add, Type::S32, o.kvh_g, e_.op(Op::Rem, Type::S32, r, imm(G_)))};
  }
  // Its O_partial row: ((split batch + b) seqlen_q + t) heads_q + head, and
  // its LSE: ((split batch + b) heads_q + head) seqlen_q + t (global addresses).
  Reg partial_o(const PartialOut &o, const PartialRow &r) {
    Reg orow =
        e_.op(Op::Add, Type::S64, e_.op(Op::MulLo, Type::S64, o.sb, e_.s64(sq_)), e_.s64(r.t));
    b_.op(Op::MadLo, Type::S64, orow, orow, e_.s64(o.hq), e_.s64(r.qh));
    return e_.index64(o.opart, orow, spec_.head_dim_v * 4);
  }
  Reg partial_lse(const PartialOut &o, const PartialRow &r) {
    Reg lrow =
        e_.op(Op::Add, Type::S64, e_.op(Op::MulLo, Type::S64, o.sb, e_.s64(o.hq)), e_.s64(r.qh));
    b_.op(Op::MadLo, Type::S64, lrow, lrow, e_.s64(sq_), e_.s64(r.t));
    return e_.index64(o.lpart, lrow, 4);
  }

  // ======== sm_100a (spec.tcgen05) ========
  std::string run_sm100() {
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=384 block_m=%d block_n=%d softmax_warps=4 "
                  "correction_warps=0 mma_warps=1 load_warps=4 d=%d dv=%d",
                  lay_.total, kRows, spec_.block_n, spec_.head_dim, spec_.head_dim_v);
    b_.comment(perf);
    const WarpgroupFrame f = warpgroup_frame(e_);
    tid_ = f.tid;
    warp_ = uniform(f.warp);
    smem_ = f.smem;
    prologue();
    ptx::Label softmax = b_.label(), mma = b_.label(), done = b_.label();
    b_.when(e_.setp(Cmp::Eq, Type::U32, warp_, imm(8))).bra(mma);
    b_.when(e_.setp(Cmp::Ge, Type::U32, warp_, imm(8))).bra(done);
    b_.when(e_.setp(Cmp::Ge, Type::U32, warp_, imm(4))).bra(softmax);
    producer();
    b_.bra(done);
    b_.bind(mma);
    mma_warp();
    b_.bra(done);
    b_.bind(softmax);
    softmax_warps();
    b_.bind(done);
    b_.comment("every thread: the CTA's last barrier, then warp 0 frees tensor memory");
    b_.tcgen05_fence_before_thread_sync();
    b_.bar_sync();
    ptx::Label out = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, warp_, imm(0))).bra(out);
    b_.tcgen05_fence_after_thread_sync();
    b_.tcgen05_dealloc(tmem_, imm(kTmemCols));
    b_.bind(out);
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, 384);
  }

  // x from lane 0 (shfl.sync.idx): a value ptxas treats as warp-uniform.
  Reg uniform(Reg x) {
    Reg d = b_.b32();
    b_.shfl(ptx::Shfl::Idx, d, x, imm(0), imm(31), 0xffffffffu);
    return d;
  }

  // Tensor memory: O's halves at columns 0 .. nv_ (lane field 0 and 16),
  // S buffer b's key halves at s_col(0) + b block_n / 2.
  uint32_t s_col0() const { return static_cast<uint32_t>(nv_); }
  static constexpr uint32_t kUpper = 16u << 16;  // lane field 16: a quarter's upper 16 lanes

  // The tcgen05 shared-memory descriptor of a 128-byte-swizzled operand at
  // smem + off (K-major: lbo unused, 16; N-major: the next 64-column atom).
  Reg sdesc(uint32_t off, uint32_t lbo) {
    const tile::UmmaSmemDesc d{0, lbo, 8 * Swizzle128::kRowBytes, 0, tile::UmmaSwizzle::k128B};
    return Swizzle128::descriptor(e_, smem_, off, d.bits());
  }

  // ---- warp 8: one elected thread issues every tcgen05.mma ----
  // Per tile j: S(j + 1) = Q K_{j+1}^T into buffer (j + 1) % 2 (its reader,
  // the softmax of tile j - 1, is done: p_full(j - 1) was waited for before
  // P(j - 1) V), then O += P(j) V(j) once the softmax wrote P(j); the commit
  // after it frees K_j's stage.
  void mma_warp() {
    ptx::Label out = b_.label();
    b_.when(e_.setp(Cmp::Le, Type::S32, tiles_, imm(0))).bra(out, true);
    Reg one = b_.pred();
    b_.elect_sync(one, 0xffffffffu);
    const tile::UmmaType t = half_ == Type::BF16 ? tile::UmmaType::kBF16 : tile::UmmaType::kF16;
    const int hn = spec_.block_n / 2;
    const uint32_t s_idesc = tile::UmmaInstrDesc{t, t, kRows, static_cast<uint32_t>(hn)}.bits();
    const uint32_t o_idesc =
        tile::UmmaInstrDesc{t, t, kRows, static_cast<uint32_t>(nv_), false, true}.bits();
    Reg qd = sdesc(0, 16), kd0 = sdesc(lay_.k, 16), vd0 = sdesc(lay_.k, lay_.kv_atom);
    Reg pd = sdesc(lay_.x, 16);
    const auto kind = ptx::Builder::MmaKind::F16;
    // S(j) into buffer buf (u32) from the stage of K_j.
    auto issue_s = [&](Reg stage, Reg buf) {
      Reg kd = at_stage(kd0, stage);
      Reg d[2];
      for (int h = 0; h < 2; ++h) {
        d[h] = e_.op(Op::MadLo, Type::U32, buf, imm(hn), tmem_);
        b_.op(Op::Add, Type::U32, d[h], d[h], imm(s_col0() + (h ? kUpper : 0)));
      }
      const int steps = spec_.head_dim / 16;
      for (int kk = 0; kk < steps; ++kk) {
        const int64_t qo = (int64_t(kk / 4) * lay_.q_atom + (kk % 4) * 32) >> 4;
        Reg a = e_.op(Op::Add, Type::S64, qd, imm(qo));
        for (int h = 0; h < 2; ++h) {
          // keys h block_n / 2 ..: that many rows of 128 B further
          const int64_t ko =
              (int64_t(kk / 4) * lay_.kv_atom + h * hn * kAtomBytes + (kk % 4) * 32) >> 4;
          Reg bd = e_.op(Op::Add, Type::S64, kd, imm(ko));
          b_.when(one).tcgen05_mma_ss(kind, d[h], a, bd, imm(s_idesc), imm(kk == 0 ? 0 : 1));
        }
      }
      Reg bar = e_.op(Op::MadLo, Type::U32, buf, imm(8), smem_);
      b_.when(one).tcgen05_commit(at(bar, lay_.s_full(0)));
    };
    // O += P V(j) from the stage of K_j (acc: O holds earlier tiles), then
    // the stage freed.
    auto issue_pv = [&](Reg stage, Reg acc) {
      Reg vd = at_stage(vd0, stage);
      for (int kk = 0; kk < spec_.block_n / 16; ++kk) {
        Reg a = e_.op(Op::Add, Type::S64, pd, imm(kk * 32 >> 4));
        for (int h = 0; h < 2; ++h) {
          // O's half h: V's columns h dv / 2 .., whole atoms; keys 16 kk ..
          const int64_t vo =
              (int64_t(h) * (nv_ / kAtomCols) * lay_.kv_atom + int64_t(kk) * 16 * kAtomBytes) >> 4;
          Reg bd = e_.op(Op::Add, Type::S64, vd, imm(vo));
          Reg d = e_.op(Op::Add, Type::U32, tmem_, imm(h ? kUpper : 0));
          b_.when(one).tcgen05_mma_ss(kind, d, a, bd, imm(o_idesc),
                                      kk == 0 ? ptx::Operand(acc) : imm(1));
        }
      }
      b_.when(one).tcgen05_commit(at(smem_, lay_.o_full()));
      Reg bars = ring().bars(stage);
      b_.when(one).tcgen05_commit(at(bars, lay_.k_empty(0, S_)));
    };
    const tile::Ring r = ring();
    Reg zero = e_.mov(Type::U32, imm(0));
    r.wait(smem_, static_cast<int>(lay_.q_full()), zero);
    {
      const tile::Ring::Slot k = r.slot(zero);
      r.wait(r.bars(k.stage), static_cast<int>(lay_.k_full(0)), k.parity);
      b_.tcgen05_fence_after_thread_sync();
      issue_s(k.stage, zero);
    }
    Reg j = e_.mov(Type::U32, imm(0));
    Reg acc = b_.pred(), more = b_.pred();
    ptx::Label top = b_.label(), no_s = b_.label();
    b_.bind(top);
    b_.setp(Cmp::Gt, Type::U32, acc, j, imm(0));
    Reg j1 = e_.op(Op::Add, Type::U32, j, imm(1));
    b_.setp(Cmp::Lt, Type::S32, more, j1, tiles_);
    b_.unless(more).bra(no_s, true);
    {
      const tile::Ring::Slot k = r.slot(j1);
      r.wait(r.bars(k.stage), static_cast<int>(lay_.k_full(0)), k.parity);
      b_.tcgen05_fence_after_thread_sync();
      issue_s(k.stage, e_.op(Op::And, Type::B32, j1, imm(1)));
    }
    b_.bind(no_s);
    r.wait(smem_, static_cast<int>(lay_.p_full()), e_.op(Op::And, Type::B32, j, imm(1)));
    b_.tcgen05_fence_after_thread_sync();
    issue_pv(r.slot(j).stage, acc);
    b_.mov(Type::U32, j, j1);
    b_.when(more).bra(top, true);
    b_.bind(out);
  }

  // ---- warps 4-7: the softmax; thread t of warp q: row 16q + t % 16, its
  // keys' and O's half t / 16 ----
  void softmax_warps() {
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    Reg wq = e_.op(Op::Sub, Type::U32, warp_, imm(4));
    Reg half = e_.op(Op::Shr, Type::U32, lane, imm(4));
    Reg row = e_.op(Op::MadLo, Type::U32, wq, imm(16), e_.op(Op::And, Type::B32, lane, imm(15)));
    Reg r = e_.op(Op::Add, Type::S32, m0_, row);
    Reg pad = e_.setp(Cmp::Ge, Type::S32, r, rows_);
    const tile::RowRange k = row_keys(e_.op(Op::Div, Type::S32, r, imm(G_)));
    Reg lo = k.lo, hi = k.hi;
    b_.selp(Type::S32, hi, imm(0), hi, pad);
    b_.selp(Type::S32, lo, imm(0), lo, pad);
    // lane field 32 q (PTX ISA "Tensor Memory": warp q of a warpgroup
    // reaches lanes 32q .. 32q + 31): this thread's lane 32q + t
    Reg tl = e_.op(Op::Add, Type::U32, tmem_, e_.op(Op::Shl, Type::B32, wq, imm(21)));
    Reg scale = e_.param(Type::F32, offsetof(P, score_scale));
    if (fp8_) b_.op(Op::Mul, Type::F32, scale, scale, descale(offsetof(P, k_descale)));
    tile::RowSoftmax rs(e_, scale, tile::SoftmaxForm(), 0, 16);
    const int hn = spec_.block_n / 2;
    std::vector<Reg> s(static_cast<size_t>(hn));
    for (Reg &x : s) x = b_.f32();
    // P's row in shared memory: keys h block_n / 2 .. as 16-byte chunks
    // c = h block_n / 16 + i at slot c ^ (row % 8) (Swizzle128).
    Reg prow = e_.op(Op::MadLo, Type::U32, row, imm(Swizzle128::kRowBytes), smem_);
    b_.op(Op::Add, Type::U32, prow, prow, imm(lay_.x));
    Reg c0 = e_.op(Op::MulLo, Type::U32, half, imm(spec_.block_n / 16));
    Reg slot0 = Swizzle128::slot_bytes(e_, c0, e_.op(Op::And, Type::B32, row, imm(7)));
    Reg pa = e_.op(Op::Add, Type::U32, prow, slot0);
    ptx::Label epi = b_.label();
    Reg j = e_.mov(Type::U32, imm(0));
    Reg n = e_.mov(Type::S32, n0_);
    b_.when(e_.setp(Cmp::Le, Type::S32, tiles_, imm(0))).bra(epi);
    ptx::Label top = b_.label();
    b_.bind(top);
    {
      Reg buf = e_.op(Op::And, Type::B32, j, imm(1));
      Reg bar = e_.op(Op::MadLo, Type::U32, buf, imm(8), smem_);
      ring().wait(bar, static_cast<int>(lay_.s_full(0)),
                  e_.op(Op::And, Type::B32, e_.op(Op::Shr, Type::U32, j, imm(1)), imm(1)));
      // O += P(j - 1) V(j - 1) done: O and P's buffer are free.
      ptx::Label first = b_.label();
      b_.when(e_.setp(Cmp::Eq, Type::U32, j, imm(0))).bra(first);
      ring().wait(smem_, static_cast<int>(lay_.o_full()),
                  e_.op(Op::And, Type::B32, e_.op(Op::Sub, Type::U32, j, imm(1)), imm(1)));
      b_.bind(first);
      b_.tcgen05_fence_after_thread_sync();
      Reg ta = e_.op(Op::MadLo, Type::U32, buf, imm(hn), tl);
      b_.op(Op::Add, Type::U32, ta, ta, imm(s_col0()));
      b_.tcgen05_ld_32x32b(s.data(), hn, ta);
      b_.tcgen05_wait_ld();
      // this thread's first key: n + h block_n / 2
      Reg kq = e_.op(Op::MadLo, Type::S32, half, imm(hn), n);
      tile::mask_keys(b_, s, e_.op(Op::Sub, Type::S32, lo, kq), e_.op(Op::Sub, Type::S32, hi, kq),
                      b_.pred(), b_.pred());
      const tile::RowSoftmax::Step st = rs.step(s);
      // O *= alpha where some row of the warp moved (O holds earlier tiles).
      ptx::Label kept = b_.label();
      Reg any = b_.pred();
      Reg mv = e_.op(Op::And, Type::Pred, st.moved, e_.setp(Cmp::Gt, Type::U32, j, imm(0)));
      b_.vote(false, any, mv, 0xffffffffu);
      b_.unless(any).bra(kept, true);
      b_.comment("O *= alpha: some row of the warp moved its maximum");
      {
        std::vector<Reg> o(32);
        for (Reg &x : o) x = b_.f32();
        for (int c = 0; c < nv_; c += 32) {
          Reg oa = e_.op(Op::Add, Type::U32, tl, imm(c));
          b_.tcgen05_ld_32x32b(o.data(), 32, oa);
          b_.tcgen05_wait_ld();
          for (Reg x : o) b_.op(Op::Mul, Type::F32, x, x, st.alpha);
          b_.tcgen05_st_32x32b(oa, o.data(), 32);
          b_.tcgen05_wait_st();  // before the registers take the next chunk
        }
      }
      b_.bind(kept);
      b_.comment("P (16-bit pairs) into shared memory, the A operand of O += P V");
      for (int i = 0; i < hn / 8; ++i) {
        Reg w[4];
        for (int y = 0; y < 4; ++y) {
          w[y] = b_.b32();
          b_.cvt_pack(half_, w[y], s[static_cast<size_t>(8 * i + 2 * y + 1)],
                      s[static_cast<size_t>(8 * i + 2 * y)]);
        }
        // chunk c0 + i: slot (c0 + i) ^ (row % 8) = slot0 ^ 16 i
        Reg a =
            i ? e_.op(Op::Xor, Type::B32, pa, imm(Swizzle128::flip(static_cast<uint32_t>(i)))) : pa;
        b_.st_v(Space::Shared, Type::B32, at(a), {w[0], w[1], w[2], w[3]});
      }
      b_.fence_proxy_async();  // generic-proxy writes the MMA reads (async proxy)
      b_.tcgen05_fence_before_thread_sync();
      b_.mbarrier_arrive(at(smem_, lay_.p_full()));
      b_.op(Op::Add, Type::U32, j, j, imm(1));
      b_.op(Op::Add, Type::S32, n, n, imm(spec_.block_n));
      b_.when(e_.setp(Cmp::Lt, Type::S32, j, tiles_)).bra(top);
    }
    b_.bind(epi);
    b_.comment("the split's partial state: O / l (fp32) and LSE");
    Reg has = e_.setp(Cmp::Gt, Type::S32, tiles_, imm(0));
    ptx::Label no_wait = b_.label();
    b_.unless(has).bra(no_wait);
    ring().wait(smem_, static_cast<int>(lay_.o_full()),
                e_.op(Op::And, Type::B32, e_.op(Op::Sub, Type::U32, j, imm(1)), imm(1)));
    b_.tcgen05_fence_after_thread_sync();
    b_.bind(no_wait);
    // 1 / l and the LSE (tile::row_end: a row with no key O = 0, LSE =
    // -inf); spec.direct_out with sinks: tile::sink_row, the sink of the
    // row's head (padding rows' heads are the group's too: in bounds).
    // (The row's addresses after the LSE without sinks: the partial-state
    // kernels' instruction order.)
    PartialOut out;
    PartialRow pr;
    Reg inv, lse;
    if (spec_.sinks) {
      out = partial_out();
      pr = partial_row(out, r);
      Reg s2 = sink_log2_at(e_, pr.qh, offsetof(P, sinks));
      Reg m2 = e_.op(Op::Mul, Type::F32, rs.m, scale);  // -inf stays -inf
      const tile::SinkRow sr = tile::sink_row(e_, m2, rs.row_l(), s2, tile::sink_nan0(e_, s2));
      inv = sr.inv;
      lse = sr.lse;
    } else {
      const tile::RowEnd end = tile::row_end(e_, rs.m, scale, rs.row_l());
      inv = end.inv;
      lse = end.lse;
    }
    // fp8: V's descale on O, but not on a row with no key (O = 0 whatever
    // the descale is, +inf included).
    if (fp8_) {
      Reg f = b_.f32();
      b_.selp(Type::F32, f, descale(offsetof(P, v_descale)), fimm(0.0f),
              e_.setp(Cmp::Gt, Type::F32, lse, fimm(kNegInf)));
      b_.op(Op::Mul, Type::F32, inv, inv, f);
    }
    if (!spec_.sinks) {
      out = partial_out();
      pr = partial_row(out, r);
    }
    // Every lane loads (tcgen05.ld is .sync.aligned); a padding row stores
    // nothing. The partial state's O row is fp32; spec.direct_out's is O's
    // (16-bit pairs, 16-byte stores: check_tensor's alignment).
    const DirectOut d = spec_.direct_out ? direct_out(pr) : DirectOut();
    Reg ga = spec_.direct_out ? e_.index(d.o_row, half, nv_ * 2)
                              : e_.index(partial_o(out, pr), half, nv_ * 4);
    std::vector<Reg> o(32);
    for (Reg &x : o) x = b_.f32();
    for (int c = 0; c < nv_; c += 32) {
      b_.tcgen05_ld_32x32b(o.data(), 32, e_.op(Op::Add, Type::U32, tl, imm(c)));
      b_.tcgen05_wait_ld();
      for (Reg x : o) {
        b_.selp(Type::F32, x, x, fimm(0.0f), has);  // no tile: O never written
        b_.op(Op::Mul, Type::F32, x, x, inv);
      }
      if (spec_.direct_out) {
        for (int x = 0; x < 32; x += 8) {
          Reg w[4];
          for (int y = 0; y < 4; ++y) {
            w[y] = b_.b32();
            b_.cvt_pack(half_, w[y], o[static_cast<size_t>(x + 2 * y + 1)],
                        o[static_cast<size_t>(x + 2 * y)]);
          }
          b_.unless(pad).st_v(Space::Global, Type::B32, at(ga, 2 * (c + x)),
                              {w[0], w[1], w[2], w[3]});
        }
        continue;
      }
      for (int x = 0; x < 32; x += 4)
        b_.unless(pad).st_v(Space::Global, Type::F32, at(ga, 4 * (c + x)),
                            {o[static_cast<size_t>(x)], o[static_cast<size_t>(x + 1)],
                             o[static_cast<size_t>(x + 2)], o[static_cast<size_t>(x + 3)]});
    }
    Reg la = spec_.direct_out ? d.lse_at : partial_lse(out, pr);
    Reg lead = e_.setp(Cmp::Eq, Type::U32, half, imm(0));
    b_.op(Op::And, Type::Pred, lead, lead, e_.op(Op::Not, Type::Pred, pad));
    if (spec_.direct_out) b_.op(Op::And, Type::Pred, lead, lead, d.has_lse);
    b_.when(lead).st(Space::Global, Type::F32, at(la), lse);
  }

  // spec.direct_out: packed row pr's O row (o[b][t][qh], bytes) and LSE
  // address (lse [batch, heads_q, seqlen_q]; has_lse: lse is not 0).
  struct DirectOut {
    Reg o_row, lse_at, has_lse;
  };
  DirectOut direct_out(const PartialRow &pr) {
    DirectOut d;
    Reg os[3];
    for (int i = 0; i < 3; ++i) os[i] = e_.stride_bytes(offsetof(P, o_stride) + 8 * i, 2);
    Reg o = e_.global_param(offsetof(P, o));
    // (varlen: the sequence's first row q0 of o, and LSE [heads_q, total_q])
    Reg o_b = spec_.varlen ? e_.index(o, q0_, os[1]) : e_.index(o, bz_, os[0]);
    d.o_row = e_.index(e_.index(o_b, pr.t, os[1]), pr.qh, os[2]);
    Reg lse_raw = e_.param(Type::U64, offsetof(P, lse));
    d.has_lse = e_.setp(Cmp::Ne, Type::U64, lse_raw, imm(0));
    Reg lse = b_.b64();
    b_.cvta_to_global(lse, lse_raw);
    Reg hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    Reg lrow = spec_.varlen ? e_.op(Op::MadLo, Type::S64, e_.s64(pr.qh), e_.s64(total_q_),
                                    e_.s64(e_.op(Op::Add, Type::S32, q0_, pr.t)))
                            : e_.op(Op::MadLo, Type::S64, e_.wide_mad(bz_, hq, e_.s64(pr.qh)),
                                    e_.s64(sq_), e_.s64(pr.t));
    d.lse_at = e_.index64(lse, lrow, 4);
    return d;
  }

  const KernelSpec &spec_;
  Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;
  int fp8_ = 0;        // fp8 K/V converted by the producer: 1 e4m3, 2 e5m2 (0: 16-bit)
  bool tc05_ = false;  // sm_100a: tcgen05.mma, S and O in tensor memory
  Reg tmem_;           // sm_100a: the allocation's address
  int S_ = 2, G_ = 1, nS_ = 0, nv_ = 0, kP_ = 0;
  tile::Lanes ln_;
  Reg tid_, warp_, smem_;
  Reg split_, bz_, sq_, rows_, kvh_, m0_, sk_, slo_, shi_, n0_, tiles_;
  Reg q0_, total_q_;  // spec.varlen: the sequence's first query row, cu_seqlens_q[batch]
  KvRows kr_, vr_;
  // consumers
  Reg wg_, wrow_, x_own_, x_other_;
  Reg qa_, qr_, ka_, kr_desc_, vd_;
  Reg lo_[2], hi_[2];
  Reg n_, it_;
  tile::Ring::Cursor cur_;
  AccTile s_, o_;
  std::vector<Reg> s_flat_, o_flat_;
  std::vector<Frag4> pa_;
  std::unique_ptr<tile::OnlineSoftmax> softmax_;
};

}  // namespace

uint32_t decode_mla_smem(const KernelSpec &spec) { return layout(spec).total; }

std::string generate_decode_mla(const KernelSpec &spec) { return DecodeMlaGen(spec).run(); }

}  // namespace kgen
}  // namespace fa
