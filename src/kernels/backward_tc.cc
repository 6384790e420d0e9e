// The backward's main kernel on mma.sync (sm_80 and up): FlashAttention-2's
// Algorithm 2 (Dao, 2023, section 3.1), composed from the tile primitives.
//
// A CTA of 4 warps owns block_n = 64 keys of one (KV head, batch); warp w
// owns keys 16w .. 16w + 15 and holds their dK and dV (f32 accumulator
// tiles) for the whole kernel. K and V are copied once. The CTA then loops
// over the group's query heads and, for each, over the query blocks of
// block_m rows that see its keys (causal and windows: only those), with
// the rows' LSE (log2 units) and D_i = rowsum(dO_i o O_i) from the
// BackwardPre kernel (BackwardParams::row_stats), all copied by cp.async.
// With spec.stages = 2 (make_spec: where the shared memory costs no CTA an
// SM) a query block's buffer is doubled (FlashAttention-2's backward
// double-buffers Q; here Q, dO and the statistics): the next block's copies
// (this head's next block, or the next head's first) are issued into the
// other buffer before this block waits for its own (cp.async.wait_group 1),
// so they overlap this block's products; with stages = 0 each block copies
// and waits. Per query block, in the
// transposed orientation (rows are keys: P^T's C fragments are the A
// fragments dV and dK need):
//   S^T = K Q^T                 (A: K rows, B: Q as [n][k])
//   P^T = 2^(S^T c - LSE_log2)   (softcap, ALiBi, masks as the forward)
//   dP^T = V dO^T               (A: V rows, B: dO as [n][k])
//   dV += P^T dO                 (A: P^T packed, B: dO as [k][n], .trans)
//   dS^T = P^T o (dP^T - D)      (times 1 - tanh^2 with softcap)
//   dK += dS^T Q                 (A: dS^T packed, B: Q as [k][n], .trans)
//   dQ_i += dS K                 (dS^T through shared memory, read as A
//                                 with ldmatrix .trans (Role::A_T); added
//                                 to the fp32 accumulators with red.add)
// Past head dim 128 (spec.dv_split = 2) the CTA of slice c computes the
// same S^T, P^T and dP^T but only columns [c d / 2, (c + 1) d / 2) of dK and
// dQ and [c dv / 2, ..) of dV: 1.4x the FLOPs of one pass, dK and dV of a
// warp still 16 keys x at most 128 columns each.
// dK (times softmax_scale) and dV are written once at the end; dQ is scaled
// and rounded by BackwardPost. P and dS are rounded to the 16-bit type for
// their products, as FlashAttention-2 does. Layout and costs:
// docs/kernels.md, "Backward on mma.sync".
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/backward_scores.h"
#include "kernels/codegen.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/tile.h"

namespace fa {
namespace kgen {
namespace {

using tile::AccTile;
using tile::CopyPlan;
using tile::Frag4;
using tile::Role;
using tile::SmemTile;

constexpr int kWarps = 4;
constexpr int kKeysPerWarp = 16;

// Dynamic shared memory: K [block_n][d], V [block_n][dv] (the CTA's keys,
// copied once); a query block's buffer: Q [block_m][d], dO [block_m][dv] and
// its rows' LSE_log2 and D (f32 [block_m] each); with stages = 2 a second
// such buffer `buf` bytes after the first (the next block's copies land
// there while this one is computed); dS^T [block_n][block_m] (16-bit, for
// dQ).
struct Layout {
  SmemTile k, v, q, dout, ds;  // q, dout: buffer 0
  uint32_t stats = 0;          // buffer 0's LSE_log2, then D
  uint32_t buf = 0;            // buffer 1 - buffer 0 (0: one buffer)
  uint32_t total = 0;
};

Layout layout(const KernelSpec &s) {
  Layout l;
  l.k = tile::smem_tile(0, s.block_n, s.head_dim);
  l.v = tile::smem_tile(l.k.offset + l.k.bytes(), s.block_n, s.head_dim_v);
  l.q = tile::smem_tile(l.v.offset + l.v.bytes(), s.block_m, s.head_dim);
  l.dout = tile::smem_tile(l.q.offset + l.q.bytes(), s.block_m, s.head_dim_v);
  l.stats = l.dout.offset + l.dout.bytes();
  const uint32_t end = l.stats + 8 * static_cast<uint32_t>(s.block_m);
  l.buf = s.stages == 2 ? end - l.q.offset : 0;
  l.ds = tile::smem_tile(end + l.buf, s.block_n, s.block_m);
  l.total = l.ds.offset + l.ds.bytes();
  return l;
}

// t moved by `by` bytes (the second buffer's tiles).
SmemTile moved(SmemTile t, uint32_t by) {
  t.offset += by;
  return t;
}

class BackwardGen {
 public:
  explicit BackwardGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), sizeof(BackwardParams)),
        e_(b_),
        half_(spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16) {
    bm_ = spec.block_m;
    two_ = lay_.buf != 0;
    nS_ = bm_ / 8;
    kD_ = lay_.k.cols_pad / 16;
    kV_ = lay_.v.cols_pad / 16;
    // This CTA's column slice of dK, dQ (dcols_) and dV (vcols_):
    // KernelSpec::dv_split (2 past head dim 128), 16-column groups kDs_, kVs_.
    split_ = spec.dv_split;
    dcols_ = spec.head_dim / split_;
    vcols_ = spec.head_dim_v / split_;
    kDs_ = (dcols_ + 15) / 16;
    kVs_ = (vcols_ + 15) / 16;
    // dQ = dS K: the block's 16-row blocks over the warps; a row block's
    // 16-column groups dealt to its warps round-robin.
    rb_ = bm_ / 16;
    wpr_ = kWarps / rb_;
    nQ_ = (kDs_ + wpr_ - 1) / wpr_;
  }

  std::string run() {
    b_.comment(spec_.describe());
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=%d compute_warps=%d block_m=%d block_n=%d "
                  "rows_per_warp=%d",
                  lay_.total, 32 * kWarps, kWarps, spec_.block_m, spec_.block_n, kKeysPerWarp);
    b_.comment(perf);
    // Two CTAs an SM (at most 255 registers a thread: ptxas otherwise caps
    // some variants at 168 and spills).
    b_.set_min_ctas_per_sm(2);
    smem_sym_ = b_.extern_shared("smem", 16);
    range_sym_ = b_.shared("query_range", 8, 8);
    setup();
    bases();
    copy_kv();
    b_.comment("dK, dV: this warp's 16 keys, in registers for the whole kernel");
    dk_ = tile::acc_tile(b_, 2 * kDs_);
    dv_ = tile::acc_tile(b_, 2 * kVs_);
    tile::zero(b_, dk_);
    tile::zero(b_, dv_);
    heads();
    epilogue();
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, 32 * kWarps);
  }

 private:
  using F = ForwardParams;
  using P = BackwardParams;

  // ---- thread coordinates ----
  void setup() {
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    warp_ = e_.op(Op::Shr, Type::U32, tid_, imm(5));
    ln_ = tile::make_lanes(e_, lane);
    smem_ = e_.mov(Type::U32, ptx::sym(smem_sym_));
  }

  // ---- the CTA's (key block, KV head, batch): lengths and query range ----
  // Pointers and strides are read from the parameters where they are used
  // (row_base, stride), so that few registers stay live across the loops.
  void bases() {
    // x = key block x dv_split + slice (the slice fastest).
    Reg x = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    slice_ = split_ > 1 ? e_.op(Op::Rem, Type::U32, x, imm(split_)) : e_.mov(Type::U32, imm(0));
    if (split_ > 1) b_.op(Op::Div, Type::U32, x, x, imm(split_));
    n0_ = e_.op(Op::MulLo, Type::S32, x, imm(spec_.block_n));
    Reg sq_max = this->sq_max();
    if (spec_.varlen) {
      // Sequence b: query rows cu_q[b] .., key rows cu_k[b] .. of "batch"
      // 0; lengths clamped to the launch's maxima (seq_len).
      auto span = [&](size_t param, Reg max_len, Reg *start) {
        Reg a = e_.index(e_.global_param(param), bz(), 4);
        Reg s0 = b_.b32(), s1 = b_.b32();
        b_.ld(Space::Global, Type::S32, s0, at(a), true);
        b_.ld(Space::Global, Type::S32, s1, at(a, 4), true);
        *start = s0;
        return seq_len(e_, s0, s1, max_len);
      };
      sq_ = span(offsetof(F, cu_seqlens_q), sq_max, &q0_);
      sk_ = span(offsetof(F, cu_seqlens_k), e_.param(Type::S32, offsetof(F, seqlen_k)), &k0_);
    }
    // A key block past its sequence has nothing to write.
    b_.when(e_.setp(Cmp::Ge, Type::S32, n0_, sk())).exit();
  }

  // The query rows that see the CTA's keys (backward_query_range).
  BackwardQueryRange query_range() {
    return backward_query_range(e_, dims(), n0_, spec_.block_n, bm_);
  }

  BackwardDims dims() {
    return {[this] { return sq(); }, [this] { return sk(); }, [this] { return wl(); },
            [this] { return wr(); }};
  }

  // Values read at their uses (parameters, special registers) rather than
  // held in registers across the loops.
  Reg hq() { return e_.param(Type::S32, offsetof(F, num_heads_q)); }
  Reg sq_max() { return e_.param(Type::S32, offsetof(F, seqlen_q)); }
  Reg wl() { return e_.param(Type::S32, offsetof(F, window_left)); }
  Reg wr() { return e_.param(Type::S32, offsetof(F, window_right)); }
  Reg score_scale() { return e_.param(Type::F32, offsetof(F, score_scale)); }
  Reg bz() { return e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ)); }
  Reg kvh() { return e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY)); }
  // This sequence's lengths: parameters, or (varlen) the registers bases() set.
  Reg sq() { return spec_.varlen ? sq_ : sq_max(); }
  Reg sk() { return spec_.varlen ? sk_ : e_.param(Type::S32, offsetof(F, seqlen_k)); }

  // A stride parameter in bytes.
  Reg stride(size_t param) { return e_.stride_bytes(param, elem_bytes(spec_.dtype)); }
  // Row 0 of (this sequence, head) of the tensor at ptr_param with strides
  // at stride_param (batch, seq, head): varlen, row `start` of "batch" 0.
  Reg row_base(size_t ptr_param, size_t stride_param, Reg start, Reg head) {
    Reg p = e_.global_param(ptr_param);
    p = spec_.varlen ? e_.index(p, start, stride(stride_param + 8))
                     : e_.index(p, bz(), stride(stride_param));
    return e_.index(p, head, stride(stride_param + 16));
  }

  // ---- K and V of the CTA's keys, once; every tile's padding zeroed ----
  void copy_kv() {
    b_.comment("K, V of the key block (rows past seqlen_k zero); padding columns zero");
    for (int i = 0; i < (two_ ? 2 : 1); ++i) {
      const uint32_t by = i * lay_.buf;  // Q's and dO's padding in each buffer
      const CopyPlan q(e_, tid_, 32 * kWarps, moved(lay_.q, by), smem_,
                       stride(offsetof(F, q_stride) + 8));
      const CopyPlan d(e_, tid_, 32 * kWarps, moved(lay_.dout, by), smem_,
                       stride(offsetof(P, dout_stride) + 8));
      q.zero_padding();
      d.zero_padding();
    }
    Reg left = e_.op(Op::Sub, Type::S32, sk(), n0_);
    for (int kv = 0; kv < 2; ++kv) {
      const size_t sp = kv ? offsetof(F, v_stride) : offsetof(F, k_stride);
      Reg row = stride(sp + 8);
      const CopyPlan plan(e_, tid_, 32 * kWarps, kv ? lay_.v : lay_.k, smem_, row);
      plan.zero_padding();
      Reg base = row_base(kv ? offsetof(F, v) : offsetof(F, k), sp, k0_, kvh());
      plan.boundary(thread_ptr(plan, base, n0_, row), left, base);
    }
    b_.cp_async_commit();
    k_lm_ = tile::ldsm_base(e_, ln_, lay_.k, Role::A, smem_,
                            e_.op(Op::MulLo, Type::U32, warp_, imm(kKeysPerWarp)));
    v_lm_ = tile::ldsm_base(e_, ln_, lay_.v, Role::A, smem_,
                            e_.op(Op::MulLo, Type::U32, warp_, imm(kKeysPerWarp)));
    q_nk_ = tile::ldsm_base(e_, ln_, lay_.q, Role::B_NK, smem_, Reg());
    do_nk_ = tile::ldsm_base(e_, ln_, lay_.dout, Role::B_NK, smem_, Reg());
    // dK, dV and dQ read their slice's columns of Q, dO and K.
    q_kn_ = tile::ldsm_base(e_, ln_, lay_.q, Role::B_KN_T, smem_, Reg());
    do_kn_ = tile::ldsm_base(e_, ln_, lay_.dout, Role::B_KN_T, smem_, Reg());
    if (split_ > 1) {
      b_.op(Op::MadLo, Type::U32, q_kn_, slice_, imm(2 * dcols_), q_kn_);
      b_.op(Op::MadLo, Type::U32, do_kn_, slice_, imm(2 * vcols_), do_kn_);
    }
    // dQ = dS K: this warp's row block and first column group.
    Reg rblk = e_.op(Op::Rem, Type::U32, warp_, imm(rb_));
    qphase_ = e_.op(Op::Div, Type::U32, warp_, imm(rb_));
    qrow_ = e_.op(Op::MulLo, Type::U32, rblk, imm(16));
    ds_at_ = tile::ldsm_base(e_, ln_, lay_.ds, Role::A_T, smem_, Reg());
    b_.op(Op::MadLo, Type::U32, ds_at_, qrow_, imm(2), ds_at_);  // column qrow of the dS^T tile
    k_kn_ = tile::ldsm_base(e_, ln_, lay_.k, Role::B_KN_T, smem_, Reg());
    b_.op(Op::MadLo, Type::U32, k_kn_, qphase_, imm(32), k_kn_);  // column group qphase
    if (split_ > 1) b_.op(Op::MadLo, Type::U32, k_kn_, slice_, imm(2 * dcols_), k_kn_);
  }

  // base + n * stride + the plan's per-thread offset.
  Reg thread_ptr(const CopyPlan &p, Reg base, Reg n, Reg stride) {
    Reg t = e_.index(base, n, stride);
    if (p.base_offset().valid()) b_.op(Op::Add, Type::S64, t, t, p.base_offset());
    return t;
  }

  // ---- the group's query heads, each over its query blocks ----
  // One loop over (head h_, block m0_): m0_ steps by block_m through the
  // query range, then on to the next head's first block. With two buffers
  // the next block's copies are issued before this block waits for its own
  // (cp.async groups: wait_group 1); with one, each block copies and waits.
  void heads() {
    s_ = tile::acc_tile(b_, nS_);
    dp_ = tile::acc_tile(b_, nS_);
    if (spec_.softcap) {
      dtanh_ = tile::acc_tile(b_, nS_);
      cap_ = softcap_consts(e_.param(Type::F32, offsetof(F, softcap_neg2)),
                            e_.param(Type::F32, offsetof(F, softcap_log2)));
      inv_cap_ = e_.op(Op::RcpRn, Type::F32, cap_.cap_log2);
    }
    det_ = e_.setp(Cmp::Ne, Type::S32, e_.param(Type::S32, offsetof(P, deterministic)), imm(0));
    det_t0_ = e_.op(Op::And, Type::Pred, det_, e_.setp(Cmp::Eq, Type::U32, tid_, imm(0)));
    for (Reg &z : zero4_) z = e_.mov(Type::F32, fimm(0.0f));
    fa_ = tile::frag4(b_);
    fb_ = tile::frag4(b_);
    // The group's query heads kvh g .. kvh g + g - 1 (the bound re-derived
    // from %ctaid.y at each test: nothing else held across the loops).
    h_ = e_.op(Op::MulLo, Type::S32, kvh(), imm(spec_.group_size));
    ptx::Label loop = b_.label(), done = b_.label();
    {
      // The range's first block and its end, published in shared memory
      // (thread 0, one barrier) and read back where used: held in registers
      // across the loops the first spilled at head dim 128, and re-deriving
      // the end costs some 20 instructions a block.
      const BackwardQueryRange r = query_range();
      Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
      b_.when(t0).st_v(Space::Shared, Type::B32, at(range_sym_), {r.begin, r.end});
      b_.bar_sync();
      b_.when(e_.setp(Cmp::Ge, Type::S32, r.begin, r.end)).bra(done);
    }
    m0_ = b_.b32();
    b_.ld(Space::Shared, Type::B32, m0_, at(range_sym_));
    if (two_) {
      // This buffer's offset from buffer 0 (0 or lay_.buf); the first block
      // into buffer 0.
      buf_ = e_.mov(Type::U32, imm(0));
      copy_block(h_, m0_, smem_);
      b_.cp_async_commit();
    }
    b_.bind(loop);
    if (two_) {
      b_.comment(
          "the next block (this head's next, or the next head's first) into the other buffer");
      Reg m = e_.op(Op::Add, Type::S32, m0_, imm(bm_)), h = e_.mov(Type::S32, h_);
      Reg wrap = e_.setp(Cmp::Ge, Type::S32, m, range_end());
      b_.when(wrap).ld(Space::Shared, Type::B32, m, at(range_sym_));
      b_.when(wrap).op(Op::Add, Type::S32, h, h, imm(1));
      ptx::Label none = b_.label();
      b_.unless(e_.setp(Cmp::Lt, Type::S32, h, h_end())).bra(none);
      Reg other = e_.op(Op::Sub, Type::U32, imm(lay_.buf), buf_);
      copy_block(h, m, e_.op(Op::Add, Type::U32, smem_, other));
      b_.bind(none);
      b_.cp_async_commit();  // empty after the last block: wait_group 1 still waits for this one
      b_.cp_async_wait(1);
    } else {
      copy_block(h_, m0_, smem_);
      b_.cp_async_commit();
      b_.cp_async_wait(0);
    }
    b_.bar_sync();
    query_block();
    // The next block: m0_ + block_m, or the next head's first.
    b_.op(Op::Add, Type::S32, m0_, m0_, imm(bm_));
    {
      Reg wrap = e_.setp(Cmp::Ge, Type::S32, m0_, range_end());
      b_.when(wrap).ld(Space::Shared, Type::B32, m0_, at(range_sym_));
      b_.when(wrap).op(Op::Add, Type::S32, h_, h_, imm(1));
    }
    if (two_) {
      // The other buffer: delta = lay_.buf - 2 buf_ (+buf or -buf).
      Reg delta = e_.op(Op::MadLo, Type::S32, buf_, imm(-2), imm(lay_.buf));
      for (Reg r : {q_nk_, do_nk_, q_kn_, do_kn_, buf_}) b_.op(Op::Add, Type::S32, r, r, delta);
    }
    b_.when(e_.setp(Cmp::Lt, Type::S32, h_, h_end())).bra(loop);
    b_.bind(done);
  }

  // The query range's end, from shared memory (heads()).
  Reg range_end() {
    Reg r = b_.b32();
    b_.ld(Space::Shared, Type::B32, r, at(range_sym_, 4));
    return r;
  }

  // One past the group's last query head.
  Reg h_end() {
    Reg h = e_.op(Op::MulLo, Type::S32, kvh(), imm(spec_.group_size));
    b_.op(Op::Add, Type::S32, h, h, imm(spec_.group_size));
    return h;
  }

  // Row 0 of (b, h) in the row statistics and dQ's accumulators:
  // (b heads_q + h) seqlen_q (s64).
  Reg row0(Reg h) {
    return e_.op(Op::MulLo, Type::S64, e_.wide_mad(bz(), hq(), e_.s64(h)), e_.s64(sq_max()));
  }

  // Query block m0 of head h into the buffer at shared address `smem`
  // (smem_, or smem_ + lay_.buf): Q and dO rows (past seqlen_q zero), and
  // the rows' LSE_log2 and D, all by cp.async (one commit group, the
  // caller's).
  void copy_block(Reg h, Reg m0, Reg smem) {
    b_.comment("query block: Q, dO, their rows' LSE (log2) and D");
    Reg left = e_.op(Op::Sub, Type::S32, sq(), m0);
    for (int t = 0; t < 2; ++t) {
      const size_t sp = t ? offsetof(P, dout_stride) : offsetof(F, q_stride);
      Reg row = stride(sp + 8);
      const CopyPlan plan(e_, tid_, 32 * kWarps, t ? lay_.dout : lay_.q, smem, row);
      Reg base = row_base(t ? offsetof(P, dout) : offsetof(F, q), sp, q0_, h);
      plan.boundary(thread_ptr(plan, base, m0, row), left, base);
    }
    {
      // Threads t < block_m: row m0 + t's LSE_log2 (BackwardParams::row_stats'
      // second half, batch heads_q seqlen_q rows further), block_m <= t <
      // 2 block_m: row m0 + t - block_m's D; both at stats + 4t. Rows past
      // seqlen_q read as 0 (zero-filled): their columns are masked, so every
      // p of them is 0 and their dS too.
      ptx::Label skip = b_.label();
      b_.when(e_.setp(Cmp::Ge, Type::U32, tid_, imm(2 * bm_))).bra(skip);
      Reg lse = e_.setp(Cmp::Lt, Type::U32, tid_, imm(bm_));
      Reg i = e_.op(Op::Add, Type::S32, m0, e_.op(Op::And, Type::B32, tid_, imm(bm_ - 1)));
      Reg in = e_.setp(Cmp::Lt, Type::S32, i, sq());
      Reg r = e_.op(Op::Add, Type::S64, row0(h), e_.s64(i));
      Reg half = e_.wide_mul(e_.param(Type::S32, offsetof(F, batch)), hq());
      b_.op(Op::MulLo, Type::S64, half, half, e_.s64(sq_max()));
      b_.when(lse).op(Op::Add, Type::S64, r, r, half);
      Reg stats = e_.global_param(offsetof(P, row_stats));
      Reg a = e_.index64(stats, r, 4);
      b_.selp(Type::B64, a, a, stats, in);
      Reg size = e_.mov(Type::B32, imm(0));
      b_.when(in).mov(Type::B32, size, imm(4));
      Reg sa = e_.op(Op::MadLo, Type::U32, tid_, imm(4), smem);
      b_.cp_async_ca(at(sa, static_cast<int>(lay_.stats)), at(a), 4, size);
      b_.bind(skip);
    }
  }

  // One query block m0_ of head h_, its buffer copied.
  void query_block() {
    scores();
    probabilities();
    grad_p();
    b_.comment("dV += P^T dO");
    accumulate(dv_, s_, do_kn_, lay_.dout, kVs_);
    grad_s();
    b_.comment("dK += dS^T Q");
    accumulate(dk_, s_, q_kn_, lay_.q, kDs_);
    store_ds();
    b_.bar_sync();
    grad_q();
    b_.bar_sync();  // this buffer, dS^T and the statistics are free for the block after next
    {
      // Deterministic: this key block's adds are done (the barrier above
      // orders every thread's before thread 0's release): the next may go.
      ptx::Label skip = b_.label();
      b_.unless(det_t0_).bra(skip);
      semaphore();  // re-derived: nothing held across the adds
      Reg old = b_.b32();
      b_.atom_add(true, Type::U32, old, at(sem_), imm(1));
      b_.bind(skip);
    }
  }

  // Deterministic mode: the query block's semaphore (sem_) and the key
  // blocks before this one that add to its dQ (before_; dq_semaphore).
  void semaphore() {
    const DqSemaphore m = dq_semaphore(
        e_, dims(), [this] { return e_.global_param(offsetof(P, dq_sem)); },
        [this] { return sq_max(); }, [this] { return bz(); }, [this] { return hq(); }, h_, m0_,
        slice_, n0_, spec_.block_n);
    sem_ = m.addr;
    before_ = m.before;
  }

  // S^T = K Q^T for this warp's keys: s_.f[j] holds queries m0 + 8j ..
  void scores() {
    b_.comment("S^T = K Q^T");
    for (int ks = 0; ks < kD_; ++ks) {
      tile::ldsm(b_, Role::A, fa_, k_lm_, lay_.k.at(0, 16 * ks));
      for (int jp = 0; jp < nS_ / 2; ++jp) {
        tile::ldsm(b_, Role::B_NK, fb_, q_nk_, lay_.q.at(16 * jp, 16 * ks));
        const Frag4 *c = ks == 0 ? &zero4_ : nullptr;
        tile::mma(b_, half_, s_, 2 * jp, fa_, &fb_[0], c);
        tile::mma(b_, half_, s_, 2 * jp + 1, fa_, &fb_[2], c);
      }
    }
  }

  // P^T in s_ (backward_probabilities).
  void probabilities() {
    b_.comment("P^T: softcap, ALiBi, masks, 2^(s c - LSE_log2)");
    backward_probabilities(e_, dims(), score_args());
  }

  // The warp's scores and their rows' statistics (backward_scores.h).
  BackwardScores score_args() {
    Reg stats = two_ ? e_.op(Op::Add, Type::U32, smem_, buf_) : smem_;  // this block's buffer
    BackwardScores x = backward_scores(
        e_, spec_, [this] { return score_scale(); }, [this] { return bz(); }, h_, warp_, n0_, m0_,
        &ln_, stats, static_cast<int>(lay_.stats), static_cast<int>(lay_.stats) + 4 * bm_);
    x.s = &s_;
    x.dtanh = &dtanh_;
    if (spec_.softcap) x.cap = cap_;
    x.inv_cap = inv_cap_;
    return x;
  }

  // dP^T = V dO^T for this warp's keys (dp_ like s_).
  void grad_p() {
    b_.comment("dP^T = V dO^T");
    for (int ks = 0; ks < kV_; ++ks) {
      tile::ldsm(b_, Role::A, fa_, v_lm_, lay_.v.at(0, 16 * ks));
      for (int jp = 0; jp < nS_ / 2; ++jp) {
        tile::ldsm(b_, Role::B_NK, fb_, do_nk_, lay_.dout.at(16 * jp, 16 * ks));
        const Frag4 *c = ks == 0 ? &zero4_ : nullptr;
        tile::mma(b_, half_, dp_, 2 * jp, fa_, &fb_[0], c);
        tile::mma(b_, half_, dp_, 2 * jp + 1, fa_, &fb_[2], c);
      }
    }
  }

  // acc += X^T-rows (x: this warp's 16 keys x the block's queries, packed to
  // A fragments 16 queries at a time) times the [query][n] tile (n16 groups
  // of 16 columns, B by ldmatrix .trans).
  void accumulate(const AccTile &acc, const AccTile &x, Reg kn, const SmemTile &t, int n16) {
    Frag4 pa = tile::frag4(b_);
    for (int kk = 0; kk < bm_ / 16; ++kk) {
      tile::pack_a(b_, half_, x, 2 * kk, pa);
      for (int jp = 0; jp < n16; ++jp) {
        tile::ldsm(b_, Role::B_KN_T, fb_, kn, t.at(16 * kk, 16 * jp));
        tile::mma(b_, half_, acc, 2 * jp, pa, &fb_[0]);
        tile::mma(b_, half_, acc, 2 * jp + 1, pa, &fb_[2]);
      }
    }
  }

  // dS^T = P^T o (dP^T - D) (times 1 - tanh^2 with softcap), in s_.
  void grad_s() {
    b_.comment("dS^T = P^T o (dP^T - D)");
    backward_grad_s(e_, score_args(), dp_, spec_.softcap);
  }

  // dS^T (16-bit) into its shared tile: rows 16w + g (+ 8), columns 8j + 2q.
  void store_ds() {
    Reg row = e_.op(Op::MadLo, Type::U32, warp_, imm(kKeysPerWarp), ln_.g);
    Reg a = e_.op(Op::MadLo, Type::U32, row, imm(lay_.ds.pitch), smem_);
    b_.op(Op::MadLo, Type::U32, a, ln_.q, imm(4), a);
    b_.op(Op::Add, Type::U32, a, a, imm(lay_.ds.offset));
    Reg w = b_.b32();
    for (int j = 0; j < nS_; ++j)
      for (int h = 0; h < 2; ++h) {
        b_.cvt_pack(half_, w, s_.f[j][2 * h + 1], s_.f[j][2 * h]);
        b_.st(Space::Shared, Type::B32, at(a, static_cast<int>(lay_.ds.at(8 * h, 8 * j))), w);
      }
  }

  // dQ of the block += dS K: this warp's 16 rows qrow .. and column groups
  // qphase + wpr i, added to the fp32 accumulators (red.global.add.f32).
  void grad_q() {
    b_.comment("dQ += dS K (red.add into the fp32 accumulators)");
    AccTile dq = tile::acc_tile(b_, 2 * nQ_);
    for (int kk = 0; kk < spec_.block_n / 16; ++kk) {
      tile::ldsm(b_, Role::A_T, fa_, ds_at_, lay_.ds.at(16 * kk, 0));
      for (int i = 0; i < nQ_; ++i) {
        // Group qphase + wpr i: past the last group only when kD % wpr != 0
        // (then the mma reads zero padding or K's next columns: discarded).
        tile::ldsm(b_, Role::B_KN_T, fb_, k_kn_, lay_.k.at(16 * kk, 16 * wpr_ * i));
        const Frag4 *c = kk == 0 ? &zero4_ : nullptr;
        tile::mma(b_, half_, dq, 2 * i, fa_, &fb_[0], c);
        tile::mma(b_, half_, dq, 2 * i + 1, fa_, &fb_[2], c);
      }
    }
    {
      // Deterministic: thread 0 waits for the key blocks before this one
      // (atom.add 0 with acquire), then the CTA.
      ptx::Label go = b_.label(), spin = b_.label(), waited = b_.label();
      b_.unless(det_).bra(go);
      semaphore();
      b_.unless(det_t0_).bra(waited);
      b_.bind(spin);
      Reg v = b_.b32();
      b_.atom_add(true, Type::U32, v, at(sem_), imm(0));
      b_.when(e_.setp(Cmp::Ne, Type::S32, v, before_)).bra(spin);
      b_.bind(waited);
      b_.bar_sync();
      b_.bind(go);
    }
    Reg row = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, qrow_), ln_.g);
    Reg col0 =
        e_.op(Op::MadLo, Type::U32, qphase_, imm(16), e_.op(Op::Shl, Type::B32, ln_.q, imm(1)));
    Reg r0 = row0(h_);
    for (int h = 0; h < 2; ++h) {
      Reg i = e_.op(Op::Add, Type::S32, row, imm(8 * h));
      Reg in = e_.setp(Cmp::Lt, Type::S32, i, sq());
      Reg r = e_.op(Op::Add, Type::S64, r0, e_.s64(i));
      Reg a = e_.index64(e_.global_param(offsetof(P, dq_accum)), r, 4 * spec_.head_dim);
      if (split_ > 1) a = e_.index(a, slice_, 4 * dcols_);
      a = e_.index(a, col0, 4);
      for (int j = 0; j < dq.n(); ++j) {
        // column 16 (qphase + wpr (j / 2)) + 8 (j % 2) + 2q + x
        const int c = 16 * wpr_ * (j / 2) + 8 * (j % 2);
        Reg ok = in;
        if (dcols_ % (16 * wpr_) != 0) {
          Reg cc = e_.op(Op::Add, Type::U32, col0, imm(c));
          ok = e_.op(Op::And, Type::Pred, in, e_.setp(Cmp::Lt, Type::U32, cc, imm(dcols_)));
        }
        for (int x = 0; x < 2; ++x)
          b_.when(ok).red_add(Space::Global, false, Type::F32, at(a, 4 * (c + x)),
                              dq.f[j][2 * h + x]);
      }
    }
  }

  // dK (times softmax_scale) and dV of this warp's keys, rounded.
  void epilogue() {
    b_.comment("dK * softmax_scale, dV: this warp's keys");
    b_.cp_async_wait(0);  // K and V's copies, when no query block ran
    Reg scale = e_.param(Type::F32, offsetof(P, softmax_scale));
    Reg key0 = e_.op(Op::MadLo, Type::S32, warp_, imm(kKeysPerWarp), n0_);
    b_.op(Op::Add, Type::S32, key0, key0, ln_.g);
    Reg col = e_.op(Op::Shl, Type::B32, ln_.q, imm(2));  // bytes of column 2q
    Reg w = b_.b32();
    auto store = [&](const AccTile &acc, Reg base, Reg row_bytes, int cols, bool scaled) {
      if (split_ > 1) base = e_.index(base, slice_, 2 * cols);  // the slice's first column
      backward_store_keys(
          e_, half_, acc, base, row_bytes, key0, col, [this] { return sk(); }, cols,
          scaled ? scale : Reg(), w);
    };
    store(dk_, row_base(offsetof(P, dk), offsetof(P, dk_stride), k0_, kvh()),
          stride(offsetof(P, dk_stride) + 8), dcols_, true);
    store(dv_, row_base(offsetof(P, dv), offsetof(P, dv_stride), k0_, kvh()),
          stride(offsetof(P, dv_stride) + 8), vcols_, false);
  }

  const KernelSpec &spec_;
  const Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;
  int bm_ = 0, nS_ = 0, kD_ = 0, kV_ = 0, rb_ = 0, wpr_ = 0, nQ_ = 0;
  int split_ = 1, dcols_ = 0, vcols_ = 0, kDs_ = 0, kVs_ = 0;
  Reg slice_;
  ptx::Symbol smem_sym_, range_sym_;
  tile::Lanes ln_;
  Reg tid_, warp_, smem_;
  Reg n0_, sq_, sk_;  // sq_, sk_: varlen only (sq(), sk())
  Reg q0_, k0_;       // varlen: the sequence's first query and key rows
  Reg k_lm_, v_lm_, q_nk_, do_nk_, q_kn_, do_kn_, ds_at_, k_kn_, qrow_, qphase_;
  AccTile dk_, dv_, s_, dp_, dtanh_;
  Softcap cap_;
  Reg inv_cap_;
  Frag4 zero4_, fa_, fb_;
  Reg h_, m0_;
  bool two_ = false;                 // stages = 2: two buffers (Layout::buf)
  Reg buf_;                          // two_: this block's buffer - buffer 0, bytes (u32)
  Reg det_, det_t0_, sem_, before_;  // deterministic mode (BackwardParams::dq_sem)
};

}  // namespace

std::string generate_backward(const KernelSpec &spec) { return BackwardGen(spec).run(); }

uint32_t backward_smem(const KernelSpec &spec) { return layout(spec).total; }

}  // namespace kgen
}  // namespace fa
