// sm_100a forward generator: FlashAttention-4's structure (Zadouri, Hoehnen,
// Shah, Thakkar, Ramani, Dao, 2026; flash_attn/cute/flash_fwd_sm100.py) on
// tcgen05 and tensor memory.
//
// A CTA of 12 warps owns block_m = 256 query rows of one (batch, head), as
// two Q tiles of 128 rows (8 warps and one Q tile past head_dim_v 128, or
// where shared memory does not hold two). Tensor memory (512 columns) holds,
// per Q tile i, S_i = Q_i K^T (128 columns at 128 i; P_i, 16-bit pairs or
// e4m3 bytes, is written over its first columns) and O_i (head_dim_v
// rounded up to 16 columns from 128 q_tiles + dv16 i). With one Q tile it
// holds two S buffers (key tiles of 128, or 64 where that lets Q fit), O
// after them and, where it fits, Q (q_in_tmem), and the MMA thread issues
// S(j + 1) before O += P(j) V_j (one_tile_schedule). Roles (two Q tiles):
//   warps 0-3, 4-7  softmax of Q tile 0, 1: thread r of the warpgroup owns
//                   row r (TMEM lane r): it reads its row of S
//                   (tcgen05.ld.32x32b), masks, runs the online softmax
//                   (the maximum moves only when it grows by more than 2^8:
//                   conditional rescaling, FA4 section 3.2; exp2 on MUFU and,
//                   for a share of the elements, a degree-3 polynomial on
//                   the FMA pipe, FA4 section 3.1), writes P (tcgen05.st),
//                   rescales its row of O itself when its warp's rows moved
//                   (FA4's correction warpgroup, folded in), and at the end
//                   writes O / l and the LSE (or the split's partial state);
//   warp 8          the MMA warp: one elected lane issues every tcgen05.mma
//                   (S_i = Q_i K_j^T from shared memory; O_i += P_i V_j
//                   with P from tensor memory) and commits them to mbarriers;
//   warp 9          the load warp: one elected lane issues every TMA copy (Q
//                   once, then K_j and V_j into a ring of `stages` slots);
//   warps 10, 11    the gather variant's row copies (cp.async), else idle.
// Per K/V tile j the MMA warp runs, for i = 0, 1: O_i += P_i(j) V_j (after
// softmax i's P), then S_i(j+1) = Q_i K_{j+1}^T: the tensor core works on
// one Q tile while the other's softmax runs (FA4's ping-pong). tcgen05.mma
// of one thread run in issue order, so S_i(j+1) overwrites P_i(j) only
// after O_i += P_i(j) V_j read it.
// Barriers (mbarriers): q_full (Q's bytes, or the gather warps' arrivals),
// kv_full / kv_empty per ring slot, s_full[i] (the MMA's commit after S_i),
// p_full[i] (softmax i's 128 threads: P written, O rescaled), o_full[i]
// (the commit after O_i's MMAs).
// Layouts and descriptors: docs/kernels.md, "Forward on sm_100a".
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/launch.h"
#include "kernels/tile/key_range.h"
#include "kernels/tile/kv_gather.h"
#include "kernels/tile/merge.h"
#include "kernels/tile/ring.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/swizzle.h"
#include "kernels/tile/tile.h"
#include "kernels/tile/umma.h"

namespace fa {
namespace kgen {
namespace {

using tile::Swizzle128;

constexpr int kAtomBytes = Swizzle128::kRowBytes;  // one swizzled row: 64 16-bit values
constexpr int kAtomCols = 64;
constexpr int kTileRows = 128;  // rows of one Q tile (the MMA's M, TMEM's lanes)
constexpr int kMaxQTiles = 2;
constexpr int kGatherThreads = 64;  // spec.gather: the last two warps copy rows
constexpr uint32_t kTmemCols = 512;
// setmaxnreg: the softmax warpgroups hold a row of S (block_n f32) and its
// packed P; the last warpgroup (MMA, load or gather, idle warps) little.
// The CTA starts with 168 registers a thread (65536 / 384 rounded down to
// 8: ptxas's cap under .maxntid 384, .minnctapersm 1) and setmaxnreg only
// moves them between warpgroups: 2 x 128 x 224 + 128 x 56 = 168 x 384
// (FlashAttention-3's rule; an .inc past the pool would wait for ever).
// With one Q tile, 128 x 224 + 128 x 56 <= 168 x 256.
constexpr int kSoftmaxRegs = 224, kOtherRegs = 56;
// The exponentials on the FMA pipe (tile::Exp2Poly3): of each 16 pairs of a
// row's elements, pairs q with q % 16 < kPolyPairsPer16 (sm_100; sm_103's
// MUFU ex2 is faster: none there).
constexpr int kPolyPairsPer16 = 6;

// Dynamic shared memory (every tile 1024-byte aligned, the 128-byte swizzle's
// period): Q as qa atoms of [256 rows][128 B] (Q tile i: rows 128 i ..);
// `stages` ring slots of max(qa, va) atoms of [block_n][128 B] (K_j in one,
// V_j in the next); the mbarriers; the TMEM address (4 bytes).
struct Layout {
  int qa = 0, va = 0;
  // k_atom: a K atom's bytes (block_n rows, or the CTA pair's half);
  // v_atoms: the V atoms a CTA holds (va, or the pair's half: one).
  uint32_t q_atom = 0, kv_atom = 0, k_atom = 0, slot = 0;
  int v_atoms = 0;
  uint32_t q = 0, kv = 0, bars = 0, tmem = 0, rows = 0, total = 0;
  int stages = 0, q_tiles = 0;
  int s_bufs = 0;  // S buffers: one a Q tile, or two with one Q tile (pipelined)
  uint32_t kv_full(int s) const { return bars + 8 * static_cast<uint32_t>(s); }
  uint32_t kv_empty(int s) const { return kv_full(stages) + 8 * static_cast<uint32_t>(s); }
  uint32_t q_full() const { return kv_empty(stages); }
  uint32_t s_full(int i) const { return q_full() + 8 + 8 * static_cast<uint32_t>(i); }
  uint32_t p_full(int i) const { return s_full(s_bufs) + 8 * static_cast<uint32_t>(i); }
  uint32_t o_full(int i) const { return p_full(q_tiles) + 8 * static_cast<uint32_t>(i); }
  // Q in tensor memory (q_in_tmem): the softmax threads' 128 arrivals once
  // their rows of Q are there (the 8 bytes after the TMEM address).
  uint32_t qt_full() const { return tmem + 8; }
};

// Columns of one 128-byte atom row: 64 16-bit values, or 128 fp8 bytes (the
// fp8 forward, spec.q_fp8).
int atom_cols(const KernelSpec &s) { return s.q_fp8 != KvFp8::None ? 128 : kAtomCols; }

// Q in tensor memory: with one 16-bit Q tile, where S (block_n columns), O
// (head_dim_v rounded up to 16) and Q (16-bit pairs: 8 columns a k16 step)
// fit in the 512 columns, S = Q K^T reads Q from tensor memory (the MMA's A
// operand, as P is for O += P V) instead of shared memory: the products
// then read only K and V there (head_dim past 128: one Q tile, where Q's
// reads were a fifth of the shared-memory traffic and that bound the loop).
bool q_in_tmem(const KernelSpec &s) {
  const int dv16 = (s.head_dim_v + 15) / 16 * 16, q_cols = (s.head_dim + 15) / 16 * 8;
  return s.block_m == kTileRows && s.q_fp8 == KvFp8::None &&
         2 * s.block_n + dv16 + q_cols <= static_cast<int>(kTmemCols);
}

Layout layout(const KernelSpec &s) {
  Layout l;
  const int ac = atom_cols(s);
  l.qa = (s.head_dim + ac - 1) / ac;
  l.va = (s.head_dim_v + ac - 1) / ac;
  l.q_atom = static_cast<uint32_t>(s.block_m) * kAtomBytes;
  l.kv_atom = static_cast<uint32_t>(s.block_n) * kAtomBytes;
  l.k_atom = s.cta_pair ? l.kv_atom / 2 : l.kv_atom;
  l.v_atoms = s.cta_pair ? l.va / 2 : l.va;
  l.slot = std::max(static_cast<uint32_t>(l.qa) * l.k_atom,
                    static_cast<uint32_t>(l.v_atoms) * l.kv_atom);
  l.stages = s.stages;
  l.q_tiles = s.block_m / kTileRows;
  l.s_bufs = l.q_tiles == 1 ? 2 : l.q_tiles;
  l.q = 0;
  l.kv = static_cast<uint32_t>(l.qa) * l.q_atom;
  l.bars = l.kv + static_cast<uint32_t>(s.stages) * l.slot;
  l.tmem = l.o_full(l.q_tiles);  // (q_tiles o_full barriers)
  l.rows = l.tmem + 16;          // the gather's row table (K then V addresses, 8 B a key)
  const bool rows = s.gather && s.kv_layout == KvLayout::Paged && !s.page_tiles;
  l.total = l.rows + (rows ? 16 * static_cast<uint32_t>(s.block_n) : 0);
  return l;
}

class ForwardSm100Gen {
 public:
  explicit ForwardSm100Gen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), forward_params_size(spec)),
        e_(b_),
        half_(spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16),
        f8_(spec.q_fp8 != KvFp8::None),
        form_(f8_ ? tile::OnlineSoftmax::fp8_form() : tile::SoftmaxForm()) {
    kstep_ = f8_ ? 32 : 16;  // the MMA's K: kind::f8f6f4 or kind::f16
    kD_ = (spec.head_dim + kstep_ - 1) / kstep_;
    qt_ = lay_.q_tiles;
    threads_ = 32 * (4 * qt_ + 4);
    mma_warp_ = 4 * qt_;
    load_warp_ = mma_warp_ + 1;
    poly_ = spec.sm == 103 ? 0 : kPolyPairsPer16;
    qtm_ = q_in_tmem(spec);
    pair_ = spec.cta_pair;
    cg_ = pair_ ? 2 : 1;
  }

  std::string run() {
    b_.comment(spec_.describe());
    char perf[240];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=%d block_m=%d block_n=%d softmax_warps=%d "
                  "correction_warps=0 mma_warps=1 load_warps=1",
                  lay_.total, threads_, spec_.block_m, spec_.block_n, 4 * qt_);
    b_.comment(perf);
    b_.set_param_align(64);
    b_.set_arch_specific(true);
    b_.set_min_ctas_per_sm(1);
    if (pair_) b_.set_cluster_dims(2, 1, 1);
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    // The warp index and the TMEM address through shfl.sync from lane 0:
    // values ptxas knows to be warp-uniform, so the MMA and load warps'
    // operands sit in uniform registers (no per-lane issue loop).
    warp_ = uniform(e_.op(Op::Shr, Type::U32, tid_, imm(5)));
    smem_ = e_.mov(Type::U32, ptx::sym(b_.extern_shared("smem", 1024)));
    // Varlen: a CTA past its sequence's rows leaves before any barrier (and
    // before tensor memory is allocated): forward_bases exits it.
    if (spec_.varlen) bases(nullptr);
    prologue();
    ptx::Label softmax = b_.label(), mma = b_.label(), done = b_.label();
    b_.when(e_.setp(Cmp::Lt, Type::U32, warp_, imm(4 * qt_))).bra(softmax);
    b_.setmaxnreg(false, kOtherRegs);
    work();
    b_.when(e_.setp(Cmp::Eq, Type::U32, warp_, imm(mma_warp_))).bra(mma);
    if (spec_.gather) {  // the last two warps copy rows; the load warp idles
      b_.unless(e_.setp(Cmp::Ge, Type::U32, warp_, imm(load_warp_ + 1))).bra(done);
      gather();
    } else {
      b_.unless(e_.setp(Cmp::Eq, Type::U32, warp_, imm(load_warp_))).bra(done);
      load();
    }
    b_.bra(done);
    b_.bind(mma);
    if (pair_) {  // the odd CTA's MMA warp forwards its fulls to the even one
      ptx::Label lead = b_.label();
      b_.when(e_.setp(Cmp::Eq, Type::U32, half_cta_, imm(0))).bra(lead);
      forward_fulls();
      b_.bra(done);
      b_.bind(lead);
    }
    mma_warp();
    b_.bra(done);
    b_.bind(softmax);
    b_.setmaxnreg(true, kSoftmaxRegs);
    work();
    softmax_warps();
    b_.bind(done);
    teardown();
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, static_cast<uint32_t>(threads_));
  }

 private:
  using P = ForwardParams;

  // ---- every role, after setmaxnreg (so that nothing but the TMEM address
  // is live across it): this CTA's rows and keys ----
  void work() {
    const size_t f = offsetof(WgmmaParams, f);
    Reg wl = e_.param(Type::S32, f + offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, f + offsetof(P, window_right));
    Reg hq = e_.param(Type::S32, f + offsetof(P, num_heads_q));
    Reg hkv = e_.param(Type::S32, f + offsetof(P, num_heads_kv));
    Reg mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    // spec.split_kv: x = m-block + m-blocks x split (forward_split_index).
    if (spec_.split_kv) mblk = e_.op(Op::Rem, Type::U32, mblk, forward_m_blocks(e_, spec_));
    h_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    bz_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    kvh_ = e_.op(Op::Div, Type::S32, h_, e_.op(Op::Div, Type::S32, hq, hkv));
    m0_ = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    if (spec_.gather) {
      // The sequence's lengths (cu_seqlens, seqused_k) and row addresses.
      ptx::Label none = b_.label();  // never taken: past CTAs left before the prologue
      fb_ = bases(&none);
      b_.bind(none);
      sq_ = fb_.sq;
      sk_ = fb_.sk;
    } else {
      sq_ = e_.param(Type::S32, f + offsetof(P, seqlen_q));
      sk_ = e_.param(Type::S32, f + offsetof(P, seqlen_k));
    }
    Reg shift = e_.op(Op::Sub, Type::S32, sk_, sq_);
    if (pair_) {
      // The pair's keys: those of both its m-blocks (2p, 2p + 1), so that
      // both CTAs run the same tiles (each masks its own rows).
      half_cta_ = e_.op(Op::And, Type::B32, mblk, imm(1));
      Reg m0p = e_.op(Op::Sub, Type::S32, m0_,
                      e_.op(Op::MulLo, Type::S32, half_cta_, imm(spec_.block_m)));
      keys_ = tile::key_range(e_, m0p, shift, sq_, sk_, wl, wr, 2 * spec_.block_m, spec_.block_n);
    } else {
      keys_ = tile::key_range(e_, m0_, shift, sq_, sk_, wl, wr, spec_.block_m, spec_.block_n);
    }
    if (spec_.split_kv) {
      Reg size =
          e_.param(Type::S32, forward_tail_offset(spec_) + offsetof(ForwardTail, split_size));
      tile::split_keys(e_, &keys_, forward_split_index(e_, spec_), size, spec_.block_n);
    }
    wr_ = wr;
    wl_ = wl;
    // Tiles: top, top - block_n, ..., n_begin (none when empty).
    ntiles_ = e_.op(Op::Sub, Type::S32, keys_.top, keys_.n_begin);
    b_.op(Op::Div, Type::S32, ntiles_, ntiles_, imm(spec_.block_n));
    b_.op(Op::Add, Type::S32, ntiles_, ntiles_, imm(1));
    b_.selp(Type::S32, ntiles_, imm(0), ntiles_, keys_.empty);
  }

  // forward_bases of this CTA's (batch, head) and rows (varlen: a CTA past
  // its sequence exits, or with `past` branches there).
  ForwardBases bases(const ptx::Label *past) {
    const size_t f = offsetof(WgmmaParams, f);
    Reg hq = e_.param(Type::S32, f + offsetof(P, num_heads_q));
    Reg hkv = e_.param(Type::S32, f + offsetof(P, num_heads_kv));
    Reg h = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    Reg bz = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    Reg kvh = e_.op(Op::Div, Type::S32, h, e_.op(Op::Div, Type::S32, hq, hkv));
    Reg mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    if (spec_.split_kv) mblk = e_.op(Op::Rem, Type::U32, mblk, forward_m_blocks(e_, spec_));
    Reg m0 = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    return forward_bases(e_, spec_, e_.global_param(f + offsetof(P, q)),
                         e_.global_param(f + offsetof(P, k)), e_.global_param(f + offsetof(P, v)),
                         bz, h, kvh, m0, past);
  }

  // ---- every thread: barriers, tensor memory ----
  void prologue() {
    b_.comment(spec_.gather
                   ? "mbarriers: kv_full, q_full: the 64 gather threads; kv_empty, s_full, "
                     "o_full: one tcgen05.commit; p_full: 128 softmax threads"
                   : "mbarriers: kv_full, q_full: the load thread + bytes; kv_empty, "
                     "s_full, o_full: one tcgen05.commit; p_full: 128 softmax threads");
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    const int full = spec_.gather ? kGatherThreads : 1;
    // The CTA pair: the even CTA's kv_full and q_full take one more arrival
    // (the odd CTA's, once its half has landed: forward_fulls) and its
    // p_full both CTAs' softmax threads; kv_empty, s_full and o_full get one
    // arrival in each CTA (the even CTA's multicast commits).
    ptx::Operand nfull = imm(full), np = imm(kTileRows);
    if (pair_) {
      Reg lead = e_.setp(
          Cmp::Eq, Type::U32,
          e_.op(Op::And, Type::B32, e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX)), imm(1)),
          imm(0));
      Reg f = b_.b32(), pn = b_.b32();
      b_.selp(Type::U32, f, imm(full + 1), imm(full), lead);
      b_.selp(Type::U32, pn, imm(2 * kTileRows), imm(kTileRows), lead);
      nfull = f;
      np = pn;
    }
    for (int s = 0; s < lay_.stages; ++s) {
      b_.when(t0).mbarrier_init(at(smem_, lay_.kv_full(s)), nfull);
      b_.when(t0).mbarrier_init(at(smem_, lay_.kv_empty(s)), imm(1));
    }
    b_.when(t0).mbarrier_init(at(smem_, lay_.q_full()), nfull);
    for (int i = 0; i < qt_; ++i) {
      b_.when(t0).mbarrier_init(at(smem_, lay_.s_full(i)), imm(1));
      b_.when(t0).mbarrier_init(at(smem_, lay_.p_full(i)), np);
      b_.when(t0).mbarrier_init(at(smem_, lay_.o_full(i)), imm(1));
    }
    for (int i = qt_; i < lay_.s_bufs; ++i)  // one Q tile: the second S buffer's
      b_.when(t0).mbarrier_init(at(smem_, lay_.s_full(i)), imm(1));
    if (qtm_) b_.when(t0).mbarrier_init(at(smem_, lay_.qt_full()), imm(kTileRows));
    // (the pair: the inits visible to the other CTA after the cluster barrier)
    if (pair_) b_.when(t0).fence_mbarrier_init();
    b_.comment(pair_ ? "tensor memory: warp 0 of each CTA of the pair allocates all 512 columns"
                     : "tensor memory: warp 0 allocates all 512 columns");
    ptx::Label allocated = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, warp_, imm(0))).bra(allocated);
    b_.tcgen05_alloc(at(smem_, lay_.tmem), imm(kTmemCols), cg_);
    b_.tcgen05_relinquish_alloc_permit(cg_);
    b_.bind(allocated);
    b_.fence_proxy_async();  // the inits, visible to the copy engine
    b_.tcgen05_fence_before_thread_sync();
    cta_sync();
    b_.tcgen05_fence_after_thread_sync();
    Reg tm = b_.b32();
    b_.ld(Space::Shared, Type::U32, tm, at(smem_, lay_.tmem));
    tmem_ = uniform(tm);
  }

  // x from lane 0 (shfl.sync.idx): a value ptxas treats as warp-uniform.
  Reg uniform(Reg x) {
    Reg d = b_.b32();
    b_.shfl(ptx::Shfl::Idx, d, x, imm(0), imm(31), 0xffffffffu);
    return d;
  }

  // Every thread: the CTA's last barrier, then warp 0 frees tensor memory.
  void teardown() {
    b_.tcgen05_fence_before_thread_sync();
    cta_sync();
    ptx::Label out = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, warp_, imm(0))).bra(out);
    b_.tcgen05_fence_after_thread_sync();
    b_.tcgen05_dealloc(tmem_, imm(kTmemCols), cg_);
    b_.bind(out);
  }

  // Every thread of the CTA (bar.sync 0), or of the pair's cluster
  // (barrier.cluster.arrive + wait: release / acquire across both CTAs).
  void cta_sync() {
    if (!pair_) {
      b_.bar_sync();
      return;
    }
    b_.barrier_cluster_arrive();
    b_.barrier_cluster_wait();
  }

  tile::Ring ring() { return tile::Ring(e_, smem_, lay_.stages); }

  // A one-issuer role's start (the load, MMA and forwarding warps): the
  // whole warp leaves for `out` when the CTA has no key tile; the returned
  // predicate is the lane elect.sync picks, which issues.
  Reg issuer(const ptx::Label &out) {
    b_.when(e_.setp(Cmp::Eq, Type::S32, ntiles_, imm(0))).bra(out, true);
    Reg one = b_.pred();
    b_.elect_sync(one, 0xffffffffu);
    return one;
  }

  // ---- warp 9: one thread issues every TMA copy ----
  // The whole warp runs the loop (its waits); one elected lane issues.
  void load() {
    ptx::Label out = b_.label();
    Reg one = issuer(out);
    Reg pa = b_.b64();
    b_.param_address(pa);
    auto tmap = [&](size_t off) {
      return e_.op(Op::Add, Type::S64, pa, imm(static_cast<int64_t>(off)));
    };
    Reg tq = tmap(offsetof(WgmmaParams, tmap_q)), tk = tmap(offsetof(WgmmaParams, tmap_k)),
        tv = tmap(offsetof(WgmmaParams, tmap_v));
    b_.comment("Q: qa boxes of [256 rows][64 columns]");
    b_.when(one).mbarrier_arrive_expect_tx(at(smem_, lay_.q_full()),
                                           imm(static_cast<int64_t>(lay_.qa) * lay_.q_atom));
    for (int a = 0; a < lay_.qa; ++a) {
      Reg c[4] = {e_.mov(Type::S32, imm(atom_cols(spec_) * a)), m0_, h_, bz_};
      b_.when(one).cp_async_bulk_tensor(at(smem_, lay_.q + static_cast<uint32_t>(a) * lay_.q_atom),
                                        tq, c, 4, at(smem_, lay_.q_full()));
    }
    // The CTA pair: CTA h reads keys n + h block_n / 2 .. of K (all columns)
    // and columns 64 h .. of V (all keys): its halves of B.
    Reg k_row = pair_ ? e_.op(Op::MulLo, Type::S32, half_cta_, imm(spec_.block_n / 2)) : Reg();
    ring_items([&](int kv, Reg n, Reg stage, Reg bars, Reg) {
      const int atoms = kv ? lay_.v_atoms : lay_.qa;
      const uint32_t atom = kv ? lay_.kv_atom : lay_.k_atom;
      b_.when(one).mbarrier_arrive_expect_tx(at(bars, lay_.kv_full(0)),
                                             imm(static_cast<int64_t>(atoms) * atom));
      Reg dst = e_.op(Op::MadLo, Type::U32, stage, imm(lay_.slot), smem_);
      Reg row = pair_ && !kv ? e_.op(Op::Add, Type::S32, n, k_row) : n;
      for (int a = 0; a < atoms; ++a) {
        Reg col = e_.mov(Type::S32, imm(atom_cols(spec_) * a));
        if (pair_ && kv) b_.op(Op::MadLo, Type::S32, col, half_cta_, imm(atom_cols(spec_)), col);
        Reg c[4] = {col, row, kvh_, bz_};
        b_.when(one).cp_async_bulk_tensor(at(dst, lay_.kv + static_cast<uint32_t>(a) * atom),
                                          kv ? tv : tk, c, 4, at(bars, lay_.kv_full(0)));
      }
    });
    b_.bind(out);
  }

  // The producer's loop over the ring's items, K_j then V_j for tiles j =
  // top, top - block_n, .., n_begin (K_j at item 2j, V_j at 2j + 1): per
  // item, once its slot is free (kv_empty), body(kv: 0 K / 1 V, n: the
  // tile's first key, the slot's stage and barriers (tile::Ring), it: the
  // item's number, u32).
  void ring_items(const std::function<void(int, Reg, Reg, Reg, Reg)> &body) {
    b_.comment("K_j, V_j, last tile first, into the ring: K_j at 2j, V_j at 2j + 1");
    Reg n = e_.mov(Type::S32, keys_.top);
    Reg it = e_.mov(Type::U32, imm(0));
    ptx::Label top = b_.label();
    b_.bind(top);
    for (int kv = 0; kv < 2; ++kv) {
      const tile::Ring::Slot sl = ring().slot(it);
      Reg bars = ring().bars(sl.stage);
      ring().wait(bars, static_cast<int>(lay_.kv_empty(0)), ring().free_parity(sl.parity));
      body(kv, n, sl.stage, bars, it);
      b_.op(Op::Add, Type::U32, it, it, imm(1));
    }
    b_.op(Op::Sub, Type::S32, n, n, imm(spec_.block_n));
    b_.when(e_.setp(Cmp::Ge, Type::S32, n, keys_.n_begin)).bra(top, true);
  }

  // ---- spec.gather: the last two warps copy Q, K and V rows (cp.async,
  // tile::gather_rows / tile::KvGather: varlen, seqused_k, paged and
  // pointer-array caches, strides TMA cannot address). Ring item it's
  // copies are one cp.async group; once the next item's are in flight
  // (wait_group 1) the previous item is complete: fence.proxy.async (the
  // MMA reads shared memory through the async proxy), then each thread's
  // arrival on its full barrier (Q's for the first).
  void gather() {
    ptx::Label out = b_.label();
    Reg gid = e_.op(Op::Sub, Type::U32, tid_, imm(32 * (load_warp_ + 1)));
    tile::KvGather g(e_, gid);
    g.threads = kGatherThreads;
    g.smem = smem_;
    g.rows = lay_.rows;
    g.block_n = spec_.block_n;
    g.seqlen_k = sk_;
    g.bar = 1;
    g.row_table = spec_.kv_layout == KvLayout::Paged && !spec_.page_tiles;
    g.page_tiles = spec_.page_tiles;
    // 16-byte chunks of a row: the MMA's K steps of Q and K, V's N (dv16).
    const int eb = f8_ ? 1 : 2;
    const int qk_chunks = kD_ * kstep_ * eb / 16, qk_data = spec_.head_dim * eb / 16;
    const int v_chunks = dv16() * eb / 16, v_data = spec_.head_dim_v * eb / 16;
    b_.when(e_.setp(Cmp::Eq, Type::S32, ntiles_, imm(0))).bra(out, true);  // as the MMA warp
    b_.comment("Q rows (zeros past seqlen_q)");
    tile::gather_rows(
        e_, gid, smem_, lay_.q, lay_.q_atom, spec_.block_m, qk_chunks, qk_data, m0_, sq_,
        [&](Reg i) { return e_.index(fb_.q_bh, i, fb_.q_row); }, 0, Type::F16, kGatherThreads);
    b_.cp_async_commit();
    Reg prev = e_.mov(Type::U32, smem_);  // the previous item's barriers (its stage's)
    ring_items([&](int kv, Reg n, Reg stage, Reg bars, Reg it) {
      if (kv == 0 && g.row_table) g.page_rows(n, fb_.kr, fb_.vr);
      Reg dst = e_.op(Op::MulLo, Type::U32, stage, imm(lay_.slot));
      g.tile(dst, lay_.kv, lay_.kv_atom, kv ? v_chunks : qk_chunks, kv ? v_data : qk_data, n,
             kv ? fb_.vr : fb_.kr, kv ? 8 * spec_.block_n : 0);
      b_.cp_async_commit();
      b_.cp_async_wait(1);  // Q (the first item) or the previous item
      b_.fence_proxy_async();
      Reg first = e_.setp(Cmp::Eq, Type::U32, it, imm(0));
      b_.when(first).mbarrier_arrive(at(smem_, lay_.q_full()));
      b_.unless(first).mbarrier_arrive(at(prev, lay_.kv_full(0)));
      b_.mov(Type::U32, prev, bars);
    });
    b_.cp_async_wait(0);
    b_.fence_proxy_async();
    b_.mbarrier_arrive(at(prev, lay_.kv_full(0)));
    b_.bind(out);
  }

  // ---- spec.cta_pair, the odd CTA's warp 8: its halves of Q, K and V
  // have landed (its q_full / kv_full phases, in the ring's order) -> one
  // arrival on the even CTA's barrier of the same slot (mapa: rank 0 of the
  // cluster), which the even CTA's MMA thread waits on with its own load.
  void forward_fulls() {
    ptx::Label out = b_.label();
    Reg one = issuer(out);
    Reg peer = b_.b32();
    b_.mapa(peer, smem_, imm(0));
    const tile::Ring r = ring();
    Reg zero = e_.mov(Type::U32, imm(0));
    r.wait(smem_, static_cast<int>(lay_.q_full()), zero);
    b_.when(one).mbarrier_arrive_cluster(at(peer, lay_.q_full()));
    Reg items = e_.op(Op::Shl, Type::B32, ntiles_, imm(1));  // K_j, V_j
    Reg it = e_.mov(Type::U32, imm(0));
    ptx::Label top = b_.label();
    b_.bind(top);
    const tile::Ring::Slot sl = r.slot(it);
    r.wait(r.bars(sl.stage), static_cast<int>(lay_.kv_full(0)), sl.parity);
    Reg pb = e_.op(Op::MadLo, Type::U32, sl.stage, imm(8), peer);
    b_.when(one).mbarrier_arrive_cluster(at(pb, lay_.kv_full(0)));
    b_.op(Op::Add, Type::U32, it, it, imm(1));
    b_.when(e_.setp(Cmp::Lt, Type::U32, it, items)).bra(top, true);
    b_.bind(out);
  }

  // The MMA thread's commit of its earlier tcgen05.mma to the mbarrier at
  // a (the CTA pair: multicast to that mbarrier in both CTAs), under
  // predicate p (the elected lane's, one_, unless given).
  void commit(ptx::Addr a, Reg p = Reg()) {
    if (!p.valid()) p = one_;
    if (pair_)
      b_.when(p).tcgen05_commit_multicast(a, pair_mask_, 2);
    else
      b_.when(p).tcgen05_commit(a);
  }

  // ---- warp 8: one thread issues every tcgen05.mma ----
  // The shared-memory descriptor of a 128-byte-swizzled operand at smem +
  // off (tile::umma_smem_desc), lbo its leading byte offset.
  Reg sdesc(Reg base, uint32_t off, uint32_t lbo) {
    const tile::UmmaSmemDesc d{0, lbo, 8 * Swizzle128::kRowBytes, 0, tile::UmmaSwizzle::k128B};
    return Swizzle128::descriptor(e_, base, off, d.bits());
  }

  // The whole warp runs the loop (its waits); one elected lane issues every
  // MMA and commit (elect.sync picks the same lane while the warp is
  // converged, so one thread issues them all).
  void mma_warp() {
    ptx::Label out = b_.label();
    one_ = issuer(out);
    if (pair_) {  // both CTAs of the cluster (ranks 0 and 1)
      pair_mask_ = b_.b16();
      b_.mov(Type::B16, pair_mask_, imm(3));
    }
    // Q, K, V's types; P's: the 16-bit type, or e4m3 (the fp8 forward).
    auto type_of = [&](KvFp8 f) {
      return f == KvFp8::E4M3      ? tile::UmmaType::kE4M3
             : f == KvFp8::E5M2    ? tile::UmmaType::kE5M2
             : half_ == Type::BF16 ? tile::UmmaType::kBF16
                                   : tile::UmmaType::kF16;
    };
    const tile::UmmaType tq = type_of(spec_.q_fp8), tkv = type_of(spec_.kv_fp8);
    const tile::UmmaType tp = f8_ ? tile::UmmaType::kE4M3 : tq;
    const auto kind = f8_ ? ptx::Builder::MmaKind::F8F6F4 : ptx::Builder::MmaKind::F16;
    const uint32_t m = pair_ ? 2 * kTileRows : kTileRows;  // the pair: M = 256 across it
    const uint32_t s_idesc =
        tile::UmmaInstrDesc{tq, tkv, m, static_cast<uint32_t>(spec_.block_n)}.bits();
    // N = dv rounded up to 16 (A in tensor memory takes N % 16 = 0 at M =
    // 128): O_i's columns; V's columns past dv are the TMA box's zeros.
    const uint32_t o_idesc =
        tile::UmmaInstrDesc{tp, tkv, m, static_cast<uint32_t>(dv16()), false, true}.bits();
    // Q_i's descriptor (K-major: row r of the tile at r x 128 B; the k16
    // slice kk at atom kk / 4, + 32 (kk % 4) bytes).
    Reg qd[kMaxQTiles];
    for (int i = 0; i < qt_ && !qtm_; ++i)
      qd[i] = sdesc(smem_, lay_.q + static_cast<uint32_t>(i * kTileRows * kAtomBytes), 16);
    Reg kd0 = sdesc(smem_, lay_.kv, 16);
    // V, N-major (trans-b): head_dim_v's 64-column atoms kv_atom apart.
    Reg vd0 = sdesc(smem_, lay_.kv, lay_.kv_atom);
    Reg taddr_s[kMaxQTiles], taddr_o[kMaxQTiles];
    for (int i = 0; i < qt_; ++i) {
      taddr_s[i] = e_.op(Op::Add, Type::U32, tmem_, imm(s_col(i)));
      taddr_o[i] = e_.op(Op::Add, Type::U32, tmem_, imm(o_col(i)));
    }
    auto slot_desc = [&](Reg stage, Reg desc0) {
      Reg off = e_.op(Op::MulLo, Type::U32, stage, imm(lay_.slot >> 4));
      Reg d = b_.b64();
      b_.cvt(Type::U64, Type::U32, ptx::Round::None, d, off);
      b_.op(Op::Add, Type::S64, d, d, desc0);
      return d;
    };
    // S_i = Q_i K^T from the slot of K (kdesc) into columns d, committed to
    // the mbarrier `done`. (Q in tensor memory: the k16 step kk's 8 columns
    // at q_col() + 8 kk.)
    auto issue_s = [&](int i, Reg d, Reg kdesc, ptx::Addr done) {
      for (int kk = 0; kk < kD_; ++kk) {
        const int64_t koff = (int64_t(kk / 4) * lay_.k_atom + (kk % 4) * 32) >> 4;
        Reg bb = e_.op(Op::Add, Type::S64, kdesc, imm(koff));
        if (qtm_) {
          Reg a = e_.op(Op::Add, Type::U32, tmem_, imm(q_col() + 8 * static_cast<uint32_t>(kk)));
          b_.when(one_).tcgen05_mma_ts(kind, d, a, bb, imm(s_idesc), imm(kk == 0 ? 0 : 1), cg_);
          continue;
        }
        const int64_t qoff = (int64_t(kk / 4) * lay_.q_atom + (kk % 4) * 32) >> 4;
        Reg a = e_.op(Op::Add, Type::S64, qd[i], imm(qoff));
        b_.when(one_).tcgen05_mma_ss(kind, d, a, bb, imm(s_idesc), imm(kk == 0 ? 0 : 1), cg_);
      }
      commit(done);
    };
    // O_i += P_i V from the slot of V (vdesc), P_i at columns p; acc: O_i
    // holds earlier tiles.
    auto issue_pv = [&](int i, Reg p, Reg vdesc, Reg acc) {
      for (int kk = 0; kk < spec_.block_n / kstep_; ++kk) {
        // Keys kstep kk ..: kstep rows of 128 B further in V; P's columns 8
        // kk .. (16-bit pairs, or four e4m3 a column).
        Reg vb = e_.op(Op::Add, Type::S64, vdesc, imm((int64_t(kk) * kstep_ * kAtomBytes) >> 4));
        Reg pa = e_.op(Op::Add, Type::U32, p, imm(8 * kk));
        b_.when(one_).tcgen05_mma_ts(kind, taddr_o[i], pa, vb, imm(o_idesc),
                                     kk == 0 ? ptx::Operand(acc) : imm(1), cg_);
      }
      commit(at(smem_, lay_.o_full(i)));
    };
    const tile::Ring r = ring();
    if (qt_ == 1) {
      one_tile_schedule(issue_s, issue_pv, slot_desc, kd0, vd0, taddr_s[0]);
      b_.bind(out);
      return;
    }
    b_.comment(qtm_ ? "Q (in tensor memory), then S = Q K_0^T"
                    : "Q, then S_i = Q_i K_0^T for both tiles");
    Reg zero = e_.mov(Type::U32, imm(0));
    r.wait(smem_, static_cast<int>(qtm_ ? lay_.qt_full() : lay_.q_full()), zero);
    Reg it = e_.mov(Type::U32, imm(0));  // the ring position of the next K
    {
      const tile::Ring::Slot k = r.slot(it);
      Reg kb = r.bars(k.stage);
      r.wait(kb, static_cast<int>(lay_.kv_full(0)), k.parity);
      b_.tcgen05_fence_after_thread_sync();
      Reg kd = slot_desc(k.stage, kd0);
      for (int i = 0; i < qt_; ++i) issue_s(i, taddr_s[i], kd, at(smem_, lay_.s_full(i)));
      commit(at(kb, lay_.kv_empty(0)));
    }
    Reg j = e_.mov(Type::S32, imm(0));
    Reg acc = b_.pred();
    Reg more = b_.pred();
    Reg pph = e_.mov(Type::U32, imm(0));  // p_full's parity at tile j
    ptx::Label top = b_.label();
    b_.bind(top);
    b_.setp(Cmp::Gt, Type::S32, acc, j, imm(0));
    b_.op(Op::Add, Type::S32, j, j, imm(1));
    b_.setp(Cmp::Lt, Type::S32, more, j, ntiles_);
    b_.op(Op::Add, Type::U32, it, it, imm(1));  // V_j
    const tile::Ring::Slot v = r.slot(it);
    Reg vbars = r.bars(v.stage);
    r.wait(vbars, static_cast<int>(lay_.kv_full(0)), v.parity);
    Reg vd = slot_desc(v.stage, vd0);
    b_.op(Op::Add, Type::U32, it, it, imm(1));  // K_{j+1}
    const tile::Ring::Slot k = r.slot(it);
    Reg kbars = r.bars(k.stage);
    Reg kd = slot_desc(k.stage, kd0);
    for (int i = 0; i < qt_; ++i) {
      r.wait(smem_, static_cast<int>(lay_.p_full(i)), pph);
      b_.tcgen05_fence_after_thread_sync();
      issue_pv(i, taddr_s[i], vd, acc);
      // V_j's slot is free once its last product completes: released
      // before waiting for K_{j+1} (the gather warps make K_{j+1} full only
      // once V_{j+1}'s copies are in flight, which may need that slot).
      if (i == qt_ - 1) commit(at(vbars, lay_.kv_empty(0)));
      ptx::Label no_k = b_.label();
      b_.unless(more).bra(no_k, true);
      if (i == 0) r.wait(kbars, static_cast<int>(lay_.kv_full(0)), k.parity);
      issue_s(i, taddr_s[i], kd, at(smem_, lay_.s_full(i)));
      b_.bind(no_k);
    }
    Reg one_more = e_.op(Op::And, Type::Pred, one_, more);
    commit(at(kbars, lay_.kv_empty(0)), one_more);
    b_.op(Op::Xor, Type::B32, pph, pph, imm(1));
    b_.when(more).bra(top, true);
    b_.bind(out);
  }

  // One Q tile (no second tile to ping-pong with): two S buffers, and per
  // K/V tile j the MMA thread issues S(j + 1) = Q K_{j+1}^T into buffer (j
  // + 1) % 2 before O += P(j) V_j (P(j) over buffer j % 2), so the tensor
  // core computes the next scores while the softmax works on tile j (the
  // MLA decode's order). S(j + 2) overwrites P(j) only after O += P(j) V_j
  // read it (one thread's tcgen05.mma run in issue order). Ring items: K_j
  // at 2j, V_j at 2j + 1, consumed K_0, K_1, V_0, K_2, V_1, ...: with two
  // stages the TMA producer never waits on a slot the MMA has not freed in
  // that order (the gather warps' one-item lag needs three: sm100_min_stages).
  template <typename IssueS, typename IssuePv, typename SlotDesc>
  void one_tile_schedule(const IssueS &issue_s, const IssuePv &issue_pv, const SlotDesc &slot_desc,
                         Reg kd0, Reg vd0, Reg s0) {
    const tile::Ring r = ring();
    b_.comment("one Q tile: S(j + 1) into the other S buffer before O += P(j) V_j");
    Reg zero = e_.mov(Type::U32, imm(0));
    r.wait(smem_, static_cast<int>(qtm_ ? lay_.qt_full() : lay_.q_full()), zero);
    {
      const tile::Ring::Slot k = r.slot(zero);
      Reg kb = r.bars(k.stage);
      r.wait(kb, static_cast<int>(lay_.kv_full(0)), k.parity);
      b_.tcgen05_fence_after_thread_sync();
      issue_s(0, s0, slot_desc(k.stage, kd0), at(smem_, lay_.s_full(0)));
      b_.when(one_).tcgen05_commit(at(kb, lay_.kv_empty(0)));
    }
    Reg j = e_.mov(Type::U32, imm(0));
    Reg acc = b_.pred(), more = b_.pred();
    ptx::Label top = b_.label();
    b_.bind(top);
    b_.setp(Cmp::Gt, Type::U32, acc, j, imm(0));
    Reg jn = e_.op(Op::Add, Type::U32, j, imm(1));
    b_.setp(Cmp::Lt, Type::S32, more, jn, ntiles_);
    {
      ptx::Label no_k = b_.label();
      b_.unless(more).bra(no_k, true);
      const tile::Ring::Slot k = r.slot(e_.op(Op::Shl, Type::B32, jn, imm(1)));  // K_{j+1}
      Reg kb = r.bars(k.stage);
      r.wait(kb, static_cast<int>(lay_.kv_full(0)), k.parity);
      Reg nb = e_.op(Op::And, Type::B32, jn, imm(1));
      Reg d = e_.op(Op::MadLo, Type::U32, nb, imm(spec_.block_n), s0);
      Reg sbar = e_.op(Op::MadLo, Type::U32, nb, imm(8), smem_);
      issue_s(0, d, slot_desc(k.stage, kd0), at(sbar, lay_.s_full(0)));
      b_.when(one_).tcgen05_commit(at(kb, lay_.kv_empty(0)));
      b_.bind(no_k);
    }
    Reg vi = e_.op(Op::Add, Type::U32, e_.op(Op::Shl, Type::B32, j, imm(1)), imm(1));  // V_j
    const tile::Ring::Slot v = r.slot(vi);
    Reg vb = r.bars(v.stage);
    r.wait(vb, static_cast<int>(lay_.kv_full(0)), v.parity);
    r.wait(smem_, static_cast<int>(lay_.p_full(0)), e_.op(Op::And, Type::B32, j, imm(1)));
    b_.tcgen05_fence_after_thread_sync();
    Reg p =
        e_.op(Op::MadLo, Type::U32, e_.op(Op::And, Type::B32, j, imm(1)), imm(spec_.block_n), s0);
    issue_pv(0, p, slot_desc(v.stage, vd0), acc);
    b_.when(one_).tcgen05_commit(at(vb, lay_.kv_empty(0)));
    b_.mov(Type::U32, j, jn);
    b_.when(more).bra(top, true);
  }

  // The columns one tcgen05.ld / st .32x32b moves of `left`: a power of
  // two (the shape's .xN), at most 32.
  static int tmem_chunk(int left) {
    int n = 32;
    while (n > left) n /= 2;
    return n;
  }

  // Tensor memory columns of S buffer i (S_i; with one Q tile S(j) in
  // buffer j % 2; P over its first block_n / 2), of O_i (after the S
  // buffers), and of Q (q_in_tmem: one tile, 16-bit pairs, after O).
  uint32_t s_col(int i) const { return static_cast<uint32_t>(i * spec_.block_n); }
  uint32_t o_col(int i) const {
    return static_cast<uint32_t>(lay_.s_bufs * spec_.block_n + i * dv16());
  }
  uint32_t q_col() const { return o_col(qt_); }
  int dv16() const { return (spec_.head_dim_v + 15) / 16 * 16; }

  // ---- warps 0-7: the softmax of Q tile warp / 4, one row a thread ----
  void softmax_warps() {
    const size_t f = offsetof(WgmmaParams, f);
    Reg wi = e_.op(Op::Shr, Type::U32, warp_, imm(2));  // Q tile i
    Reg quarter = e_.op(Op::And, Type::B32, warp_, imm(3));
    Reg row = e_.op(Op::And, Type::B32, tid_, imm(127));  // TMEM lane = row of the tile
    // lane field 32 q (PTX ISA "Tensor Memory": warp q of a warpgroup
    // reaches lanes 32q .. 32q + 31)
    Reg lanes = e_.op(Op::Shl, Type::B32, quarter, imm(21));
    Reg tbase = e_.op(Op::Add, Type::U32, tmem_, lanes);
    taddr_s_ = e_.op(Op::MadLo, Type::U32, wi, imm(s_col(1) - s_col(0)), tbase);
    b_.op(Op::Add, Type::U32, taddr_s_, taddr_s_, imm(s_col(0)));
    taddr_o_ = e_.op(Op::MadLo, Type::U32, wi, imm(o_col(1) - o_col(0)), tbase);
    b_.op(Op::Add, Type::U32, taddr_o_, taddr_o_, imm(o_col(0)));
    bar_off_ = e_.op(Op::Shl, Type::B32, wi, imm(3));  // + 8 i: tile i's barrier
    Reg bars = e_.op(Op::Add, Type::U32, smem_, bar_off_);
    bars_ = bars;
    if (pair_) {
      p_remote_ = b_.b32();
      b_.mapa(p_remote_, bars, imm(0));
    }
    // This row's index and its diagonal (row + seqlen_k - seqlen_q).
    qrow_ = e_.op(Op::MadLo, Type::S32, wi, imm(kTileRows), m0_);
    b_.op(Op::Add, Type::S32, qrow_, qrow_, row);
    score_scale_ = e_.param(Type::F32, f + offsetof(P, score_scale));
    if (spec_.softcap) {
      cap_ = softcap_consts(e_.param(Type::F32, f + offsetof(P, softcap_neg2)),
                            e_.param(Type::F32, f + offsetof(P, softcap_log2)));
    }
    // The fp8 forward: the scores of bytes times Q's and K's descales.
    if (f8_) fp8_scale_scores(e_, spec_, bz_, kvh_, spec_.softcap ? cap_.neg2 : score_scale_);
    const int nb = spec_.block_n;
    s_.resize(static_cast<size_t>(nb));
    for (Reg &x : s_) x = b_.f32();
    rs_ =
        std::make_unique<tile::RowSoftmax>(e_, spec_.softcap ? Reg() : score_scale_, form_, poly_);
    if (spec_.alibi) {
      alibi_coef_ = tile::alibi_coef(e_, f + offsetof(P, alibi_slopes), bz_, h_,
                                     spec_.softcap ? Reg() : score_scale_);
      alibi_diag_ = b_.f32();  // this row's diagonal, qrow + seqlen_k - seqlen_q
      b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, alibi_diag_,
             e_.op(Op::Add, Type::S32, qrow_, e_.op(Op::Sub, Type::S32, sk_, sq_)));
    }
    sph_ = e_.mov(Type::U32, imm(0));
    j_ = e_.mov(Type::S32, imm(0));
    ptx::Label epi = b_.label();
    b_.when(e_.setp(Cmp::Eq, Type::S32, ntiles_, imm(0))).bra(epi);
    if (qtm_) q_to_tmem(row, tbase);
    tile::KeyLoop k;
    k.n = e_.mov(Type::S32, keys_.top);
    k.n_begin = keys_.n_begin;
    k.lean_lo = keys_.lean_lo;
    k.lean_hi = [this] { return tile::lean_hi(e_, keys_.dfirst, wr_, sk_, spec_.block_n); };
    k.masked = b_.label();
    k.lean = b_.label();
    k.exit = b_.label();
    k.p = b_.pred();
    k.t = b_.pred();
    n_ = k.n;
    tile::key_loop(b_, k, [&](bool masked) { softmax_tile(masked); });
    b_.bind(k.exit);
    b_.bind(epi);
    epilogue();
  }

  // q_in_tmem: this thread's row of Q, from its swizzled atoms in shared
  // memory (16-byte chunk c of the row at slot c ^ (row % 8)) to its lane
  // at q_col(), 16-bit pairs (element 2c low: the A operand's layout, as
  // P's), 32 columns at a time, every k16 step (zeros past head_dim: the
  // copies' fill); then the arrival the MMA warp waits for before S.
  void q_to_tmem(Reg row, Reg tbase) {
    b_.comment("Q: this row into tensor memory (the A operand of S = Q K^T)");
    ring().wait(smem_, static_cast<int>(lay_.q_full()), e_.mov(Type::U32, imm(0)));
    Reg rbase = e_.op(Op::MadLo, Type::U32, row, imm(kAtomBytes), smem_);
    Reg r8 = e_.op(Op::And, Type::B32, row, imm(7));
    const int chunks = 2 * kD_;  // 16-byte chunks: 8 elements, 4 columns
    std::vector<Reg> w(32);
    for (Reg &x : w) x = b_.b32();
    for (int c0 = 0; c0 < chunks; c0 += 8) {
      const int n = std::min(8, chunks - c0);
      for (int c = c0; c < c0 + n; ++c) {
        Reg slot = Swizzle128::slot_bytes(e_, e_.mov(Type::U32, imm(c % 8)), r8);
        Reg a = e_.op(Op::Add, Type::U32, rbase, slot);
        const uint32_t off = lay_.q + static_cast<uint32_t>(c / 8) * lay_.q_atom;
        const size_t x = static_cast<size_t>(4 * (c - c0));
        b_.ld_v(Space::Shared, Type::B32, {w[x], w[x + 1], w[x + 2], w[x + 3]}, at(a, off));
      }
      for (int x = 0, m = 0; x < 4 * n; x += m) {  // .xN: powers of two
        m = tmem_chunk(4 * n - x);
        Reg ta = e_.op(Op::Add, Type::U32, tbase, imm(q_col() + static_cast<uint32_t>(4 * c0 + x)));
        b_.tcgen05_st_32x32b(ta, &w[static_cast<size_t>(x)], m);
      }
      b_.tcgen05_wait_st();  // before the registers take the next chunks
    }
    b_.tcgen05_fence_before_thread_sync();
    b_.mbarrier_arrive(at(smem_, lay_.qt_full()));
  }

  // One K/V tile: S (this row) -> P, O rescaled when the maximum moved.
  void softmax_tile(bool masked) {
    const int nb = spec_.block_n;
    // One Q tile: S(j) in buffer j % 2 (its barrier's phase j / 2), O_{j-1}
    // waited for only before O is touched (below); two: S_i, this tile's.
    Reg ts = taddr_s_;
    if (qt_ == 1) {
      Reg buf = e_.op(Op::And, Type::B32, j_, imm(1));
      ring().wait(e_.op(Op::MadLo, Type::U32, buf, imm(8), smem_), static_cast<int>(lay_.s_full(0)),
                  e_.op(Op::And, Type::B32, e_.op(Op::Shr, Type::U32, j_, imm(1)), imm(1)));
      ts = e_.op(Op::MadLo, Type::U32, buf, imm(nb), taddr_s_);
    } else {
      ring().wait(bars_, static_cast<int>(lay_.s_full(0)), sph_);
      // O_i's MMAs of tile j - 1: complete already (their commit precedes
      // S_i(j)'s in the MMA thread's order), observed here every tile so
      // that o_full never runs a phase ahead of its waiters (the rescale
      // below and the epilogue rely on it).
      ptx::Label first = b_.label();
      b_.when(e_.setp(Cmp::Eq, Type::S32, j_, imm(0))).bra(first, true);
      Reg oph = e_.op(Op::Xor, Type::B32, sph_, imm(1));
      ring().wait(bars_, static_cast<int>(lay_.o_full(0)), oph);
      b_.bind(first);
    }
    b_.tcgen05_fence_after_thread_sync();
    for (int c = 0; c < nb; c += 32) {
      Reg ta = e_.op(Op::Add, Type::U32, ts, imm(c));
      b_.tcgen05_ld_32x32b(&s_[static_cast<size_t>(c)], 32, ta);
    }
    b_.tcgen05_wait_ld();
    if (spec_.softcap)
      for (Reg x : s_) scale_score(e_, x, score_scale_, cap_);
    if (spec_.alibi) {
      // ALiBi (tile::alibi_bias): key n + x is at distance diag - n - x.
      Reg nf = b_.f32(), d = b_.f32(), t = b_.f32();
      b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, nf, n_);
      b_.op(Op::Sub, Type::F32, d, alibi_diag_, nf);
      for (int x = 0; x < spec_.block_n; ++x)
        tile::alibi_bias(b_, s_[static_cast<size_t>(x)], d, x, alibi_coef_, t);
    }
    if (masked) mask();
    // The row maximum, conditional rescaling, p (tile::RowSoftmax).
    const tile::RowSoftmax::Step st = rs_->step(s_);
    Reg moved = st.moved, alpha = st.alpha;
    if (qt_ == 1) {
      // O += P(j - 1) V_{j-1} (issued after S(j)): done before O is
      // rescaled or P(j) released, observed every tile (as above).
      ptx::Label first = b_.label();
      b_.when(e_.setp(Cmp::Eq, Type::S32, j_, imm(0))).bra(first, true);
      ring().wait(bars_, static_cast<int>(lay_.o_full(0)), e_.op(Op::Xor, Type::B32, sph_, imm(1)));
      b_.bind(first);
      b_.tcgen05_fence_after_thread_sync();
    }
    // O *= alpha where some row of the warp moved (after O_i's last MMA).
    ptx::Label kept = b_.label();
    Reg any = b_.pred();
    Reg later = e_.setp(Cmp::Gt, Type::S32, j_, imm(0));
    Reg mv = e_.op(Op::And, Type::Pred, moved, later);
    b_.vote(false, any, mv, 0xffffffffu);
    b_.unless(any).bra(kept, true);
    b_.comment("O *= alpha: some row of the warp moved its maximum");
    rescale_o(alpha);
    b_.bind(kept);
    // P into S's first columns: 16-bit pairs (key 2c low), or e4m3 bytes
    // four a column (key 4c lowest; cvt.rn.satfinite).
    const int per = f8_ ? 4 : 2, cols = nb / per;
    std::vector<Reg> pk(static_cast<size_t>(cols));
    for (int x = 0; x < cols; ++x) {
      Reg &w = pk[static_cast<size_t>(x)];
      const auto sx = [&](int k) { return s_[static_cast<size_t>(per * x + k)]; };
      w = b_.b32();
      if (!f8_) {
        b_.cvt_pack(half_, w, sx(1), sx(0));
        continue;
      }
      Reg lo = b_.b16(), hi = b_.b16();
      b_.cvt_f8x2_f32(false, lo, sx(1), sx(0));
      b_.cvt_f8x2_f32(false, hi, sx(3), sx(2));
      b_.pack_b32(w, lo, hi);
    }
    for (int x = 0; x < cols; x += 32) {
      Reg ta = e_.op(Op::Add, Type::U32, ts, imm(x));
      b_.tcgen05_st_32x32b(ta, &pk[static_cast<size_t>(x)], std::min(32, cols - x));
    }
    b_.tcgen05_wait_st();
    b_.tcgen05_fence_before_thread_sync();
    if (pair_)  // the even CTA's p_full[i] (its MMA thread waits for both CTAs' P)
      b_.mbarrier_arrive_cluster(at(p_remote_, lay_.p_full(0)));
    else
      b_.mbarrier_arrive(at(bars_, lay_.p_full(0)));
    b_.op(Op::Xor, Type::B32, sph_, sph_, imm(1));
    b_.op(Op::Add, Type::S32, j_, j_, imm(1));
    b_.op(Op::Sub, Type::S32, n_, n_, imm(spec_.block_n));
  }

  // This row's keys outside its range to -inf (tile::row_range).
  void mask() {
    Reg diag = e_.op(Op::Add, Type::S32, qrow_, e_.op(Op::Sub, Type::S32, sk_, sq_));
    const tile::RowRange r = tile::row_range(e_, diag, wl_, wr_, imm(0), sk_);
    Reg lo = e_.op(Op::Sub, Type::S32, r.lo, n_);
    Reg hi = e_.op(Op::Sub, Type::S32, r.hi, n_);
    tile::mask_keys(b_, s_, lo, hi, b_.pred(), b_.pred());
  }

  // This row of O times alpha (tensor memory, 32 columns at a time).
  void rescale_o(Reg alpha) {
    std::vector<Reg> o(32);
    for (Reg &x : o) x = b_.f32();
    for (int c = 0, n = 0; c < spec_.head_dim_v; c += n) {
      n = tmem_chunk(spec_.head_dim_v - c);
      Reg ta = e_.op(Op::Add, Type::U32, taddr_o_, imm(c));
      std::vector<Reg> bits(static_cast<size_t>(n));
      for (int x = 0; x < n; ++x) bits[static_cast<size_t>(x)] = o[static_cast<size_t>(x)];
      b_.tcgen05_ld_32x32b(bits.data(), n, ta);
      b_.tcgen05_wait_ld();
      for (int x = 0; x < n; ++x)
        b_.op(Op::Mul, Type::F32, o[static_cast<size_t>(x)], o[static_cast<size_t>(x)], alpha);
      b_.tcgen05_st_32x32b(ta, bits.data(), n);
      b_.tcgen05_wait_st();  // before the registers take the next chunk
    }
  }

  // O / l and the LSE of this row, after O_i's last MMA (spec.split_kv: the
  // split's partial state, O / l in fp32 and the natural LSE; a row with
  // no key in the split O = 0 and LSE = -inf, weight 0 in the combine).
  void epilogue() {
    b_.comment("epilogue: O / l, LSE");
    Reg has = e_.setp(Cmp::Gt, Type::S32, ntiles_, imm(0));
    ptx::Label skip_wait = b_.label();
    b_.unless(has).bra(skip_wait, true);
    Reg oph = e_.op(Op::Xor, Type::B32, sph_, imm(1));
    ring().wait(bars_, static_cast<int>(lay_.o_full(0)), oph);
    b_.tcgen05_fence_after_thread_sync();
    b_.bind(skip_wait);
    // 1 / l and the LSE (tile::row_end; a row with no key: O = 0, LSE =
    // -inf), or with a sink tile::sink_row.
    Reg c = spec_.softcap ? Reg() : score_scale_;
    Reg inv, lse;
    if (spec_.sinks) {
      Reg s2 = sink_log2(e_, h_, offsetof(WgmmaParams, f));
      Reg m2 = c.valid() ? e_.op(Op::Mul, Type::F32, rs_->m, c) : rs_->m;  // -inf stays -inf
      if (form_.p_offset_log2 != 0.0f)
        m2 = e_.op(Op::Sub, Type::F32, m2, fimm(form_.p_offset_log2));
      const tile::SinkRow sr = tile::sink_row(e_, m2, rs_->l, s2, tile::sink_nan0(e_, s2));
      inv = sr.inv;
      lse = sr.lse;
    } else {
      const tile::RowEnd end = tile::row_end(e_, rs_->m, c, rs_->l, form_.p_offset_log2);
      inv = end.inv;
      lse = end.lse;
    }
    // The fp8 forward: O times V's descale (a row with no key keeps 0).
    if (f8_)
      b_.op(Op::Mul, Type::F32, inv, inv,
            fp8_descale(e_, spec_, offsetof(Fp8Descales, v_descale), bz_, kvh_));
    const ForwardOut out = forward_out(e_, spec_, bz_, h_, sq_);
    Reg ok = e_.setp(Cmp::Lt, Type::S32, qrow_, sq_);
    Reg ga = e_.index(out.o_bh, qrow_, out.o_row);
    std::vector<Reg> o(32);
    for (Reg &x : o) x = b_.f32();
    for (int c0 = 0, n = 0; c0 < spec_.head_dim_v; c0 += n) {
      n = tmem_chunk(spec_.head_dim_v - c0);
      Reg ta = e_.op(Op::Add, Type::U32, taddr_o_, imm(c0));
      std::vector<Reg> bits(o.begin(), o.begin() + n);
      b_.tcgen05_ld_32x32b(bits.data(), n, ta);
      b_.tcgen05_wait_ld();
      for (int x = 0; x < n; ++x) {
        Reg &v = o[static_cast<size_t>(x)];
        b_.selp(Type::F32, v, v, fimm(0.0f), has);  // no tile: unwritten columns
        b_.op(Op::Mul, Type::F32, v, v, inv);
      }
      if (spec_.split_kv) {  // the split's partial O, fp32 (forward_out's rows)
        for (int x = 0; x < n; x += 4)
          b_.when(ok).st_v(Space::Global, Type::F32, at(ga, 4 * (c0 + x)),
                           {o[static_cast<size_t>(x)], o[static_cast<size_t>(x + 1)],
                            o[static_cast<size_t>(x + 2)], o[static_cast<size_t>(x + 3)]});
        continue;
      }
      for (int x = 0; x < n; x += 8) {
        Reg w[4];
        for (int y = 0; y < 4; ++y) {
          w[y] = b_.b32();
          b_.cvt_pack(half_, w[y], o[static_cast<size_t>(x + 2 * y + 1)],
                      o[static_cast<size_t>(x + 2 * y)]);
        }
        b_.when(ok).st_v(Space::Global, Type::B32, at(ga, 2 * (c0 + x)), {w[0], w[1], w[2], w[3]});
      }
    }
    Reg lok = e_.op(Op::And, Type::Pred, ok, out.has_lse);
    Reg la = e_.index(out.lse_row0, qrow_, 4);
    b_.when(lok).st(Space::Global, Type::F32, at(la), lse);
  }

  const KernelSpec &spec_;
  const Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;
  bool f8_;                 // the fp8 forward (spec.q_fp8): kind::f8f6f4, P in e4m3
  tile::SoftmaxForm form_;  // fp8: OnlineSoftmax::fp8_form()
  int kstep_ = 16;          // the MMA's K
  int kD_ = 0, poly_ = 0;
  int qt_ = 0, threads_ = 0, mma_warp_ = 0, load_warp_ = 0;  // Q tiles, threads, warp roles
  bool qtm_ = false;   // q_in_tmem: S = Q K^T with Q in tensor memory
  bool pair_ = false;  // spec.cta_pair: tcgen05.mma.cta_group::2 across a cluster of two
  Reg half_cta_;       // spec.cta_pair: this CTA's half of the pair (%ctaid.x & 1, u32)
  int cg_ = 1;         // tcgen05's .cta_group: 2 for the pair
  Reg pair_mask_;      // spec.cta_pair: the multicast commits' ctaMask (b16: 3)
  Reg p_remote_;       // spec.cta_pair: this tile's barriers in the even CTA (shared::cluster)
  Reg tid_, warp_, smem_, tmem_, one_;
  Reg h_, bz_, kvh_, m0_, sq_, sk_, wl_, wr_, ntiles_;
  tile::KeyRange keys_;
  // softmax
  Reg taddr_s_, taddr_o_, bar_off_, bars_, qrow_, score_scale_, sph_, j_, n_;
  Softcap cap_;
  std::vector<Reg> s_;
  ForwardBases fb_;              // spec.gather
  Reg alibi_coef_, alibi_diag_;  // spec.alibi (tile::alibi_coef)
  std::unique_ptr<tile::RowSoftmax> rs_;
};

}  // namespace

std::string generate_forward_sm100(const KernelSpec &spec) { return ForwardSm100Gen(spec).run(); }

uint32_t sm100_smem(const KernelSpec &spec) { return layout(spec).total; }

bool sm100_q_in_tmem(const KernelSpec &spec) { return q_in_tmem(spec); }

}  // namespace kgen
}  // namespace fa
