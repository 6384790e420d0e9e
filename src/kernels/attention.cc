// The scalar forward (FlashAttention-2) and decode (Flash-Decoding split)
// generators: fp32 CUDA-core kernels, run only when asked for
// (KernelPolicy::scalar_forward / scalar_decode, FLASHATTN_SCALAR_FORWARD /
// _DECODE) to compare with and debug the tensor-core kernels. Frozen: new
// features go into the tensor-core kernels only (check_fp32 and the like
// refuse them here); the emulator and the fp64 reference are the oracle.
// The helpers every generator shares live in common.cc.
//
// Both kernels share every algorithm step; they differ only in which query
// rows a CTA owns, which key range it visits, and where the results go.
// Thread mapping (docs/kernels.md): warp w owns rows_per_warp query rows;
// for S = Q K^T lane j owns key (tile_start + j) of every row of its warp; for
// O += P V lane j owns output dims j, j+32, j+64, ...
#include <functional>
#include <utility>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/merge.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/tile.h"

namespace fa {
namespace kgen {
namespace {

class AttentionGen {
 public:
  explicit AttentionGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(attention_layout(spec)),
        decode_(spec.kind == KernelKind::Decode),
        b_(entry_name(spec), decode_ ? decode_params_size(spec) : forward_params_size(spec)),
        e_(b_) {
    R_ = lay_.rows_per_warp;
    W_ = spec.num_warps;
    T_ = 32 * W_;
    nv_ = (spec.head_dim_v + 31) / 32;
  }

  std::string run() {
    setup_thread();
    if (decode_)
      decode_prologue();
    else
      forward_prologue();
    init_rows();
    key_loop();
    finalize();
    if (decode_)
      decode_store();
    else
      forward_store();
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, static_cast<uint32_t>(T_));
  }

 private:
  // Chunk c of a cooperative tile copy, precomputed once per thread.
  struct Chunk {
    Reg row;      // tile row (s32)
    Reg goff;     // byte offset of the chunk from the tile's first row
    Reg coff;     // byte offset of the chunk within its row (K/V plans)
    Reg saddr;    // shared address
    Reg inrange;  // valid pred when only part of the CTA has a chunk here
  };

  // ---- step 0: thread indices, shared memory, constants ----
  void setup_thread() {
    b_.comment(spec_.describe());
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    lane_ = e_.op(Op::And, Type::B32, tid_, imm(31));
    warp_ = e_.op(Op::Shr, Type::U32, tid_, imm(5));
    q_sm_ = b_.shared("smem_q", 16, lay_.q_bytes);
    k_sm_ = b_.shared(lay_.kv_merged ? "smem_kv" : "smem_k", 16, lay_.k_bytes);
    v_sm_ = lay_.kv_merged ? k_sm_ : b_.shared("smem_v", 16, lay_.v_bytes);
    p_sm_ = b_.shared("smem_p", 16, lay_.p_bytes);
    Reg qb = e_.mov(Type::U32, ptx::sym(q_sm_));
    q_warp_ = e_.op(Op::MadLo, Type::U32, warp_, imm(R_ * lay_.q_stride * 4), qb);
    Reg kb = e_.mov(Type::U32, ptx::sym(k_sm_));
    k_lane_ = e_.op(Op::MadLo, Type::U32, lane_, imm(lay_.k_stride * 4), kb);
    Reg vb = e_.mov(Type::U32, ptx::sym(v_sm_));
    v_lane_ = e_.op(Op::MadLo, Type::U32, lane_, imm(4), vb);
    Reg pb = e_.mov(Type::U32, ptx::sym(p_sm_));
    p_warp_ = e_.op(Op::MadLo, Type::U32, warp_, imm(R_ * 32 * 4), pb);
    p_lane_ = e_.op(Op::MadLo, Type::U32, lane_, imm(4), p_warp_);
    for (auto &r : ld_) r = b_.b32();
    for (auto &r : cv_) r = b_.f32();
    tmp32_ = b_.b32();
    h16_ = b_.b16();
    gaddr_ = b_.b64();
    ldp_ = b_.pred();
    remk_ = b_.b32();
    if (spec_.head_dim_v % 32) {
      pdim_ = e_.setp(Cmp::Lt, Type::U32, lane_, imm(spec_.head_dim_v % 32));
    }
  }

  // Loads the launch constants shared by both kinds.
  template <class P>
  void load_common(const P *) {
    score_scale_ = e_.param(Type::F32, offsetof(P, score_scale));
    if (spec_.softcap)
      cap_ = softcap_consts(e_.param(Type::F32, offsetof(P, softcap_neg2)),
                            e_.param(Type::F32, offsetof(P, softcap_log2)));
    wl_ = e_.param(Type::S32, offsetof(P, window_left));
    wr_ = e_.param(Type::S32, offsetof(P, window_right));
    hq_ = e_.param(Type::S32, offsetof(P, num_heads_q));
  }

  // ---- forward: CTA (m-block, head, batch) ----
  void forward_prologue() {
    using P = ForwardParams;
    load_common<P>(nullptr);
    Reg mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    Reg h = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    Reg bz = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    Reg hkv = e_.param(Type::S32, offsetof(P, num_heads_kv));
    Reg group = e_.op(Op::Div, Type::S32, hq_, hkv);
    Reg kvh = e_.op(Op::Div, Type::S32, h, group);
    Reg q = e_.global_param(offsetof(P, q)), k = e_.global_param(offsetof(P, k));
    Reg v = e_.global_param(offsetof(P, v));
    Reg m0 = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    const ForwardBases fb = forward_bases(e_, spec_, q, k, v, bz, h, kvh, m0);
    Reg sq = fb.sq, sk = fb.sk, q_bh = fb.q_bh, k_bh = fb.k_bh, v_bh = fb.v_bh;
    const ForwardOut fo = forward_out(e_, spec_, bz, h, sq);
    has_lse_ = fo.has_lse;
    (void)k_bh;
    (void)v_bh;
    kr_ = fb.kr;
    vr_ = fb.vr;
    k_row_bytes_ = fb.k_row;
    v_row_bytes_ = fb.v_row;
    // Query i sees keys [i + sk - sq - wl, i + sk - sq + wr] within [0, sk).
    Reg shift = e_.op(Op::Sub, Type::S32, sk, sq);
    Reg zero = e_.mov(Type::S32, imm(0));
    for (int r = 0; r < R_; ++r) {
      Reg i = e_.op(Op::MadLo, Type::S32, warp_, imm(R_), m0);
      if (r) b_.op(Op::Add, Type::S32, i, i, imm(r));
      row_i_.push_back(i);
      row_ok_.push_back(e_.setp(Cmp::Lt, Type::S32, i, sq));
      row_range(e_.op(Op::Add, Type::S32, i, shift), zero, sk);
      if (spec_.alibi) {
        if (r == 0)
          alibi_coef_.push_back(tile::alibi_coef(e_, offsetof(P, alibi_slopes), bz, h, Reg()));
        alibi_row(e_.op(Op::Add, Type::S32, i, shift));
      }
    }
    Reg last = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, m0, imm(spec_.block_m)), sq);
    b_.op(Op::Sub, Type::S32, last, last, imm(1));
    cta_range(e_.op(Op::Add, Type::S32, m0, shift), e_.op(Op::Add, Type::S32, last, shift), zero,
              sk);
    // Q rows m0 .. m0+block_m-1 (zero beyond the sequence).
    load_q([&](Reg row, Reg *addr, Reg *ok) {
      Reg i = e_.op(Op::Add, Type::S32, row, m0);
      *ok = e_.setp(Cmp::Lt, Type::S32, i, sq);
      *addr = e_.index(q_bh, i, fb.q_row);
    });
    o_bh_ = fo.o_bh;
    o_row_bytes_ = fo.o_row;
    lse_row0_ = fo.lse_row0;
  }

  // ---- decode: CTA (split, kv head * m-blocks of its group, batch) ----
  void decode_prologue() {
    using P = DecodeParams;
    load_common<P>(nullptr);
    const int g = spec_.group_size;
    Reg split = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    Reg y = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    Reg bz = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    Reg sq = e_.param(Type::S32, offsetof(P, seqlen_q));
    Reg batch = e_.param(Type::S32, offsetof(P, batch));
    Reg split_size = e_.param(Type::S32, offsetof(P, split_size));
    Reg nrows = e_.op(Op::MulLo, Type::S32, sq, imm(g));
    Reg nblk = e_.op(Op::Add, Type::S32, nrows, imm(spec_.block_m - 1));
    b_.op(Op::Div, Type::S32, nblk, nblk, imm(spec_.block_m));
    Reg kvh = e_.op(Op::Div, Type::S32, y, nblk);
    Reg mblk = e_.op(Op::Rem, Type::S32, y, nblk);
    Reg rbase = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    Reg q = e_.global_param(offsetof(P, q)), k = e_.global_param(offsetof(P, k));
    Reg v = e_.global_param(offsetof(P, v));
    Reg seqlens = spec_.fixed_len ? Reg() : e_.global_param(offsetof(P, cache_seqlens));
    Reg opart = e_.global_param(offsetof(P, o_partial));
    Reg lpart = e_.global_param(offsetof(P, lse_partial));
    Reg qs[3], ks[3], vs[3];
    for (int i = 0; i < 3; ++i) {
      qs[i] = e_.stride_bytes(offsetof(P, q_stride) + 8 * i, 2);
      ks[i] = e_.stride_bytes(offsetof(P, k_stride) + 8 * i, 2);
      vs[i] = e_.stride_bytes(offsetof(P, v_stride) + 8 * i, 2);
    }
    Reg sk = decode_seqlen(e_, spec_, bz, seqlens);
    // cache_seqlens lives on the device and cannot be validated on the host:
    // clamp it to [0, seqlen_k_max] so a bad value never reads past the cache.
    Reg sk_max = e_.param(Type::S32, offsetof(P, seqlen_k_max));
    b_.op(Op::Min, Type::S32, sk, sk, sk_max);
    b_.op(Op::Max, Type::S32, sk, sk, imm(0));
    // Keys of this split: [split*split_size, min((split+1)*split_size, sk)),
    // formed in 64 bits; split*split_size < seqlen_k_max (the runtime's plan)
    // and the clamped end fit in int32.
    Reg lo64 = e_.wide_mul(split, split_size);
    Reg hi64 = e_.op(Op::Add, Type::S64, lo64, e_.s64(split_size));
    b_.op(Op::Min, Type::S64, hi64, hi64, e_.s64(sk));
    Reg lo = e_.s32(lo64), hi = e_.s32(hi64);
    kv_rows(e_, spec_, offsetof(P, kv), k, v, ks, vs, bz, kvh, &kr_, &vr_);
    k_row_bytes_ = ks[1];
    v_row_bytes_ = vs[1];
    Reg q_b = e_.index(q, bz, qs[0]);
    Reg shift = e_.op(Op::Sub, Type::S32, sk, sq);
    Reg kvh_g = e_.op(Op::MulLo, Type::S32, kvh, imm(g));
    // Row r of the group block -> token r / g, query head kvh*g + r % g.
    auto token_head = [&](Reg r, Reg *t, Reg *qh) {
      *t = e_.op(Op::Div, Type::S32, r, imm(g));
      *qh = e_.op(Op::Add, Type::S32, kvh_g, e_.op(Op::Rem, Type::S32, r, imm(g)));
    };
    // Partial-state rows, in 64 bits (num_splits * batch * seqlen_q *
    // num_heads_q rows may pass 2^31): ((split*batch + b)*sq + t)*hq + qh
    // and ((split*batch + b)*hq + qh)*sq + t.
    Reg sb = e_.wide_mad(split, batch, e_.s64(bz));
    Reg sq64 = e_.s64(sq), hq64 = e_.s64(hq_);
    Reg sb_sq = e_.op(Op::MulLo, Type::S64, sb, sq64);
    Reg sb_hq = e_.op(Op::MulLo, Type::S64, sb, hq64);
    Reg tm_b, tm_row, last_t;
    if (spec_.tree_mask) {
      // Tree mask (DecodeParams::tree_mask): the first new token's key and
      // each row's mask row; a padding row reads the last token's (in
      // bounds; its scores are masked anyway).
      tree_sq_ = sq;
      tree_new0_ = e_.op(Op::Sub, Type::S32, sk, sq);
      tm_b = e_.index(e_.global_param(offsetof(P, tree_mask)), bz,
                      e_.param(Type::S64, offsetof(P, tree_mask_stride)));
      tm_row = e_.param(Type::S64, offsetof(P, tree_mask_stride) + 8);
      last_t = e_.op(Op::Sub, Type::S32, sq, imm(1));
    }
    for (int r = 0; r < R_; ++r) {
      Reg rg = e_.op(Op::MadLo, Type::S32, warp_, imm(R_), rbase);
      if (r) b_.op(Op::Add, Type::S32, rg, rg, imm(r));
      Reg t, qh;
      token_head(rg, &t, &qh);
      if (spec_.tree_mask)
        tree_rows_.push_back(e_.index(tm_b, e_.op(Op::Min, Type::S32, t, last_t), tm_row));
      row_ok_.push_back(e_.setp(Cmp::Lt, Type::S32, rg, nrows));
      row_range(e_.op(Op::Add, Type::S32, t, shift), lo, hi);
      if (spec_.alibi) {
        // Each packed row is its own query head (kvh g + r % g, so < hq).
        alibi_coef_.push_back(tile::alibi_coef(e_, offsetof(P, alibi_slopes), bz, qh, Reg()));
        alibi_row(e_.op(Op::Add, Type::S32, t, shift));
      }
      Reg orow = e_.op(Op::Add, Type::S64, sb_sq, e_.s64(t));
      b_.op(Op::MadLo, Type::S64, orow, orow, hq64, e_.s64(qh));
      Reg lrow = e_.op(Op::Add, Type::S64, sb_hq, e_.s64(qh));
      b_.op(Op::MadLo, Type::S64, lrow, lrow, sq64, e_.s64(t));
      row_i_.push_back(orow);
      row_lse_.push_back(lrow);
    }
    Reg t_first = e_.op(Op::Div, Type::S32, rbase, imm(g));
    Reg last =
        e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, rbase, imm(spec_.block_m)), nrows);
    b_.op(Op::Sub, Type::S32, last, last, imm(1));
    Reg t_last = e_.op(Op::Div, Type::S32, last, imm(g));
    cta_range(e_.op(Op::Add, Type::S32, t_first, shift), e_.op(Op::Add, Type::S32, t_last, shift),
              lo, hi);
    load_q([&](Reg row, Reg *addr, Reg *ok) {
      Reg rg = e_.op(Op::Add, Type::S32, row, rbase);
      *ok = e_.setp(Cmp::Lt, Type::S32, rg, nrows);
      Reg t, qh;
      token_head(rg, &t, &qh);
      *addr = e_.index(e_.index(q_b, t, qs[1]), qh, qs[2]);
    });
    o_bh_ = opart;
    lse_row0_ = lpart;
  }

  // Row visibility [lo_r, hi_r) = [max(lo, diag - wl), min(hi, diag + wr + 1)).
  void row_range(Reg diag, Reg lo, Reg hi) {
    Reg a = e_.op(Op::Max, Type::S32, lo, e_.op(Op::Sub, Type::S32, diag, wl_));
    Reg c = e_.op(Op::Add, Type::S32, diag, wr_);
    b_.op(Op::Add, Type::S32, c, c, imm(1));
    b_.op(Op::Min, Type::S32, c, c, hi);
    lo_.push_back(a);
    hi_.push_back(c);
  }

  // ALiBi: row r's diagonal as f32 (its coefficient pushed by the caller).
  void alibi_row(Reg diag) {
    Reg d = b_.f32();
    b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, d, diag);
    alibi_diag_.push_back(d);
  }

  // The CTA's key tiles: union of its rows' ranges (first row diag_first,
  // last valid row diag_last), tile start rounded down to block_n.
  void cta_range(Reg diag_first, Reg diag_last, Reg lo, Reg hi) {
    n_begin_ = e_.op(Op::Max, Type::S32, lo, e_.op(Op::Sub, Type::S32, diag_first, wl_));
    b_.op(Op::And, Type::B32, n_begin_, n_begin_, imm(-spec_.block_n));
    n_end_ = e_.op(Op::Add, Type::S32, diag_last, wr_);
    b_.op(Op::Add, Type::S32, n_end_, n_end_, imm(1));
    b_.op(Op::Min, Type::S32, n_end_, n_end_, hi);
  }

  // Two 16-bit values packed in a b32 -> two f32 (bf16: shift into the high
  // half; f16: cvt.f32.f16, PTX ISA "Data Movement and Conversion
  // Instructions: cvt").
  void unpack(Reg x, Reg lo, Reg hi) {
    if (spec_.dtype == Dtype::BF16) {
      b_.op(Op::Shl, Type::B32, tmp32_, x, imm(16));
      b_.mov(Type::B32, lo, tmp32_);
      b_.op(Op::And, Type::B32, tmp32_, x, imm(-65536));
      b_.mov(Type::B32, hi, tmp32_);
    } else {
      b_.cvt(Type::U16, Type::U32, ptx::Round::None, h16_, x);
      b_.cvt(Type::F32, Type::F16, ptx::Round::None, lo, h16_);
      b_.op(Op::Shr, Type::U32, tmp32_, x, imm(16));
      b_.cvt(Type::U16, Type::U32, ptx::Round::None, h16_, tmp32_);
      b_.cvt(Type::F32, Type::F16, ptx::Round::None, hi, h16_);
    }
  }

  // Copies 8 elements (16 bytes) at gaddr, or zeros when !ok, to shared f32.
  void copy_chunk(Reg gaddr, Reg ok, Reg saddr, Reg store_guard, int soff = 0) {
    for (Reg r : ld_) b_.mov(Type::B32, r, imm(0));
    b_.when(ok).ld_v(Space::Global, Type::U32, {ld_[0], ld_[1], ld_[2], ld_[3]}, at(gaddr), true);
    for (int k = 0; k < 4; ++k) unpack(ld_[k], cv_[2 * k], cv_[2 * k + 1]);
    if (store_guard.valid()) b_.when(store_guard);
    b_.st_v(Space::Shared, Type::F32, at(saddr, soff), {cv_[0], cv_[1], cv_[2], cv_[3]});
    if (store_guard.valid()) b_.when(store_guard);
    b_.st_v(Space::Shared, Type::F32, at(saddr, soff + 16), {cv_[4], cv_[5], cv_[6], cv_[7]});
  }

  // Chunk c = tid + k*threads of a rows x cols tile: row, column chunk and
  // shared address; inrange when the last round covers part of the CTA.
  Chunk chunk(int k, int rows, int cols, ptx::Symbol sm, int sstride) {
    const int per_row = cols / 8, total = rows * per_row;
    Chunk ch;
    Reg c = k ? e_.op(Op::Add, Type::U32, tid_, imm(k * T_)) : tid_;
    ch.row = e_.op(Op::Div, Type::U32, c, imm(per_row));
    Reg col = e_.op(Op::Rem, Type::U32, c, imm(per_row));
    if ((k + 1) * T_ > total) ch.inrange = e_.setp(Cmp::Lt, Type::U32, c, imm(total));
    Reg base = e_.mov(Type::U32, ptx::sym(sm));
    ch.saddr = e_.op(Op::MadLo, Type::U32, ch.row, imm(sstride * 4), base);
    b_.op(Op::MadLo, Type::U32, ch.saddr, col, imm(32), ch.saddr);
    ch.goff = b_.b64();
    b_.mul_wide(Type::U32, ch.goff, col, imm(16));
    return ch;
  }

  // Step 1 (once): Q tile -> shared f32. row_addr gives a row's global
  // address and whether it exists.
  void load_q(const std::function<void(Reg, Reg *, Reg *)> &row_addr) {
    b_.comment("load Q tile");
    const int rows = spec_.block_m, per_row = spec_.head_dim / 8;
    const int rounds = (rows * per_row + T_ - 1) / T_;
    for (int k = 0; k < rounds; ++k) {
      Chunk ch = chunk(k, rows, spec_.head_dim, q_sm_, lay_.q_stride);
      Reg addr, ok;
      row_addr(ch.row, &addr, &ok);
      b_.op(Op::Add, Type::S64, gaddr_, addr, ch.goff);
      if (ch.inrange.valid()) b_.op(Op::And, Type::Pred, ok, ok, ch.inrange);
      copy_chunk(gaddr_, ok, ch.saddr, ch.inrange);
    }
  }

  // The chunks of one K or V tile (block_n rows). When the CTA's threads
  // cover whole rows (threads % chunks-per-row == 0), round k is round 0
  // moved down by `step` rows: one set of registers, immediate shared
  // offsets. Otherwise every round keeps its own precomputed registers.
  struct KvPlan {
    std::vector<Chunk> chunks;  // uniform: chunks[0] only (+ inrange per round)
    std::vector<Reg> inrange;
    bool uniform = false;
    int rounds = 0, step = 0, sstride = 0;
    Reg step_bytes;
  };
  KvPlan plan_kv(int cols, ptx::Symbol sm, int sstride, Reg row_bytes) {
    const int per_row = cols / 8, total = spec_.block_n * per_row;
    KvPlan plan;
    plan.rounds = (total + T_ - 1) / T_;
    plan.uniform = T_ % per_row == 0 && plan.rounds > 1;
    plan.step = T_ / per_row;
    plan.sstride = sstride;
    for (int k = 0; k < plan.rounds; ++k) {
      if (plan.uniform && k > 0) {
        Reg ir;
        if ((k + 1) * T_ > total)
          ir =
              e_.setp(Cmp::Lt, Type::U32, e_.op(Op::Add, Type::U32, tid_, imm(k * T_)), imm(total));
        plan.inrange.push_back(ir);
        continue;
      }
      Chunk ch = chunk(k, spec_.block_n, cols, sm, sstride);
      ch.coff = e_.mov(Type::B64, ch.goff);
      Reg roff = e_.op(Op::MulLo, Type::S64, e_.s64(ch.row), row_bytes);
      b_.op(Op::Add, Type::S64, ch.goff, ch.goff, roff);
      plan.chunks.push_back(ch);
      plan.inrange.push_back(ch.inrange);
    }
    if (plan.uniform) plan.step_bytes = e_.op(Op::MulLo, Type::S64, row_bytes, imm(plan.step));
    return plan;
  }

  // Step 2 (per tile): K or V rows n .. n+block_n-1 -> shared f32; rows at
  // or past n_end are zero-filled, never read from global memory. A paged
  // cache's rows are looked up one by one (KvRows::at) at key min(n + row,
  // n + rem - 1), so the page entry read always belongs to a valid key.
  void load_kv(const KvPlan &plan, const KvRows &kr, Reg n, Reg rem) {
    if (kr.paged()) {
      Reg last = e_.op(Op::Add, Type::S32, n, rem);
      b_.op(Op::Sub, Type::S32, last, last, imm(1));
      for (int k = 0; k < plan.rounds; ++k) {
        const Chunk &ch = plan.chunks[plan.uniform ? 0 : k];
        const int dr = plan.uniform ? k * plan.step : 0;
        Reg row = dr ? e_.op(Op::Add, Type::S32, ch.row, imm(dr)) : ch.row;
        Reg j = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, n, row), last);
        b_.op(Op::Add, Type::S64, gaddr_, kr.at(e_, j), ch.coff);
        b_.setp(Cmp::Lt, Type::S32, ldp_, row, rem);
        Reg ir = plan.inrange[k];
        if (ir.valid()) b_.op(Op::And, Type::Pred, ldp_, ldp_, ir);
        copy_chunk(gaddr_, ldp_, ch.saddr, ir, dr * plan.sstride * 4);
      }
      return;
    }
    Reg base = kr.base, row_bytes = kr.row;
    Reg tile = e_.index(base, n, row_bytes);
    if (plan.uniform) {
      const Chunk &ch = plan.chunks[0];
      b_.op(Op::Add, Type::S64, gaddr_, tile, ch.goff);
      b_.mov(Type::S32, remk_, rem);
      for (int k = 0; k < plan.rounds; ++k) {
        if (k) {
          b_.op(Op::Add, Type::S64, gaddr_, gaddr_, plan.step_bytes);
          b_.op(Op::Sub, Type::S32, remk_, remk_, imm(plan.step));
        }
        b_.setp(Cmp::Lt, Type::S32, ldp_, ch.row, remk_);
        Reg ir = plan.inrange[k];
        if (ir.valid()) b_.op(Op::And, Type::Pred, ldp_, ldp_, ir);
        copy_chunk(gaddr_, ldp_, ch.saddr, ir, k * plan.step * plan.sstride * 4);
      }
      return;
    }
    for (const Chunk &ch : plan.chunks) {
      b_.op(Op::Add, Type::S64, gaddr_, tile, ch.goff);
      b_.setp(Cmp::Lt, Type::S32, ldp_, ch.row, rem);
      if (ch.inrange.valid()) b_.op(Op::And, Type::Pred, ldp_, ldp_, ch.inrange);
      copy_chunk(gaddr_, ldp_, ch.saddr, ch.inrange);
    }
  }

  // Running state of each row: max m (log2 domain), this lane's part of the
  // sum l, and the output accumulator of this lane's dims.
  void init_rows() {
    for (int r = 0; r < R_; ++r) {
      m_.push_back(e_.mov(Type::F32, fimm(kNegInf)));
      l_.push_back(e_.mov(Type::F32, fimm(0.0f)));
      s_.push_back(b_.f32());
      acc_.emplace_back();
      for (int i = 0; i < nv_; ++i) acc_[r].push_back(e_.mov(Type::F32, fimm(0.0f)));
    }
  }

  // The FlashAttention-2 outer loop over K/V tiles.
  void key_loop() {
    auto kplan = plan_kv(spec_.head_dim, k_sm_, lay_.k_stride, k_row_bytes_);
    auto vplan = plan_kv(spec_.head_dim_v, v_sm_, lay_.v_stride, v_row_bytes_);
    for (auto &r : kv4_) r = b_.f32();
    for (auto &r : q4_) r = b_.f32();
    for (int r = 0; r < R_; ++r)
      for (int j = 0; j < 4; ++j) p4_.push_back(b_.f32());
    key_ = b_.b32();
    if (spec_.alibi) {
      alibi_key_ = b_.f32();
      alibi_t_ = b_.f32();
    }
    Reg n = e_.mov(Type::S32, n_begin_);
    Reg rem = b_.b32();
    ptx::Label loop = b_.label(), done = b_.label();
    Reg empty = e_.setp(Cmp::Ge, Type::S32, n, n_end_);
    b_.when(empty).bra(done);
    b_.bind(loop);
    b_.bar_sync();  // every warp is done with the previous tile
    b_.op(Op::Sub, Type::S32, rem, n_end_, n);
    b_.comment("load K tile");
    load_kv(kplan, kr_, n, rem);
    if (!lay_.kv_merged) {
      b_.comment("load V tile");
      load_kv(vplan, vr_, n, rem);
    }
    b_.bar_sync();
    scores(n);
    online_softmax();
    if (lay_.kv_merged) {
      b_.bar_sync();  // K reads done before V overwrites the buffer
      b_.comment("load V tile");
      load_kv(vplan, vr_, n, rem);
      b_.bar_sync();
    }
    accumulate_pv();
    b_.op(Op::Add, Type::S32, n, n, imm(spec_.block_n));
    Reg more = e_.setp(Cmp::Lt, Type::S32, n, n_end_);
    b_.when(more).bra(loop);
    b_.bind(done);
  }

  // Step 3: S = Q K^T for key n + lane of every row of the warp, scaled to
  // the log2 domain, softcapped, masked to -inf outside the row's range.
  void scores(Reg n) {
    b_.comment("S = Q K^T, lane = key");
    b_.op(Op::Add, Type::S32, key_, n, lane_);
    for (int r = 0; r < R_; ++r) b_.mov(Type::F32, s_[r], fimm(0.0f));
    for (int d = 0; d < spec_.head_dim; d += 4) {
      b_.ld_v(Space::Shared, Type::F32, {kv4_[0], kv4_[1], kv4_[2], kv4_[3]}, at(k_lane_, d * 4));
      for (int r = 0; r < R_; ++r) {
        b_.ld_v(Space::Shared, Type::F32, {q4_[0], q4_[1], q4_[2], q4_[3]},
                at(q_warp_, (r * lay_.q_stride + d) * 4));
        for (int x = 0; x < 4; ++x) b_.op(Op::Fma, Type::F32, s_[r], q4_[x], kv4_[x], s_[r]);
      }
    }
    for (int r = 0; r < R_; ++r) {
      Reg s = s_[r];
      scale_score(e_, s, score_scale_, cap_);
      if (spec_.alibi) {
        // Log2-domain scores: coef = -slope log2 e (tile::alibi_coef).
        if (r == 0) b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, alibi_key_, key_);
        b_.op(Op::Sub, Type::F32, alibi_t_, alibi_diag_[r], alibi_key_);
        tile::alibi_bias(b_, s, alibi_t_, 0, alibi_coef_[alibi_coef_.size() == 1 ? 0 : r],
                         alibi_t_);
      }
      Reg ge = e_.setp(Cmp::Ge, Type::S32, key_, lo_[r]);
      Reg lt = e_.setp(Cmp::Lt, Type::S32, key_, hi_[r]);
      b_.op(Op::And, Type::Pred, ge, ge, lt);
      b_.selp(Type::F32, s, s, fimm(kNegInf), ge);
    }
    if (spec_.tree_mask) tree_mask();
  }

  // Speculative decoding (DecodeParams::tree_mask): this lane's key is new
  // token jn = key - new0; it stays only if jn is outside [0, seqlen_q) (the
  // cached prefix, or past the sequence: masked by its range already) or
  // bit jn % 32 of the row's 32-bit word jn / 32 is set (little-endian
  // words: bit jn % 8 of byte jn / 8).
  void tree_mask() {
    b_.comment("tree mask among the new tokens");
    Reg jn = e_.op(Op::Sub, Type::S32, key_, tree_new0_);
    Reg in = e_.setp(Cmp::Lt, Type::U32, jn, tree_sq_);  // 0 <= jn < seqlen_q
    Reg word = e_.op(Op::Shr, Type::S32, jn, imm(5));
    Reg bit = e_.op(Op::And, Type::B32, jn, imm(31));
    Reg w = b_.b32(), keep = b_.pred();
    for (int r = 0; r < R_; ++r) {
      Reg wa = e_.index(tree_rows_[r], word, 4);
      b_.mov(Type::B32, w, imm(-1));
      b_.when(in).ld(Space::Global, Type::U32, w, at(wa), true);
      b_.op(Op::Shr, Type::U32, w, w, bit);
      b_.op(Op::And, Type::B32, w, w, imm(1));
      b_.setp(Cmp::Ne, Type::U32, keep, w, imm(0));
      b_.selp(Type::F32, s_[r], s_[r], fimm(kNegInf), keep);
    }
  }

  // Step 4: online softmax (log2 domain). m' = max(m, max_j s_j);
  // p_j = 2^(s_j - m'); l = l 2^(m - m') + p_j (per lane); acc *= 2^(m - m').
  // A row that has seen no key keeps m = -inf; 0 replaces it as the offset
  // so no -inf - -inf NaN appears.
  void online_softmax() {
    b_.comment("online softmax");
    for (int r = 0; r < R_; ++r) {
      Reg mt = e_.mov(Type::F32, s_[r]);
      e_.warp_reduce(Op::Max, mt);
      b_.op(Op::Max, Type::F32, mt, mt, m_[r]);
      Reg none = e_.setp(Cmp::Eq, Type::F32, mt, fimm(kNegInf));
      Reg off = e_.selp(Type::F32, fimm(0.0f), mt, none);
      Reg p = e_.op(Op::Ex2, Type::F32, e_.op(Op::Sub, Type::F32, s_[r], off));
      Reg alpha = e_.op(Op::Ex2, Type::F32, e_.op(Op::Sub, Type::F32, m_[r], off));
      b_.mov(Type::F32, m_[r], mt);
      b_.op(Op::Fma, Type::F32, l_[r], l_[r], alpha, p);
      for (Reg a : acc_[r]) b_.op(Op::Mul, Type::F32, a, a, alpha);
      b_.st(Space::Shared, Type::F32, at(p_lane_, r * 128), p);
    }
    b_.bar_warp_sync(0xffffffffu);  // p of every lane visible to the warp
  }

  // Step 5: acc[d] += sum_j p_j V[j][d] for this lane's dims d = lane + 32 i.
  void accumulate_pv() {
    b_.comment("O += P V, lane = dim");
    Reg v = b_.f32();
    for (int j = 0; j < spec_.block_n; j += 4) {
      for (int r = 0; r < R_; ++r)
        b_.ld_v(Space::Shared, Type::F32,
                {p4_[4 * r], p4_[4 * r + 1], p4_[4 * r + 2], p4_[4 * r + 3]},
                at(p_warp_, (r * 32 + j) * 4));
      for (int jj = 0; jj < 4; ++jj) {
        for (int i = 0; i < nv_; ++i) {
          if (pdim_.valid() && i == nv_ - 1) b_.when(pdim_);
          b_.ld(Space::Shared, Type::F32, v, at(v_lane_, ((j + jj) * lay_.v_stride + 32 * i) * 4));
          for (int r = 0; r < R_; ++r)
            b_.op(Op::Fma, Type::F32, acc_[r][i], p4_[4 * r + jj], v, acc_[r][i]);
        }
      }
    }
  }

  // Step 6: l = sum over lanes; O = acc / l; LSE = (m + log2 l) ln 2; a row
  // with l = 0 (no visible key) gets O = 0 and LSE = -inf.
  void finalize() {
    b_.comment("finalize");
    // Forward with sinks (gpt-oss): the head's sink joins each row's
    // denominator (tile::sink_row); decode kernels never take them.
    Reg sink, nan0;
    if (spec_.sinks && !decode_) {
      sink = sink_log2(e_, e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY)));
      nan0 = tile::sink_nan0(e_, sink);
    }
    for (int r = 0; r < R_; ++r) {
      e_.warp_reduce(Op::Add, l_[r]);
      if (sink.valid()) {
        // m_ is the exponentials' offset (-inf for a row with no key).
        const tile::SinkRow sr = tile::sink_row(e_, m_[r], l_[r], sink, nan0);
        for (Reg a : acc_[r]) b_.op(Op::Mul, Type::F32, a, a, sr.inv);
        lse_.push_back(sr.lse);
        continue;
      }
      Reg pos = e_.setp(Cmp::Gt, Type::F32, l_[r], fimm(0.0f));
      Reg inv = e_.op(Op::RcpRn, Type::F32, l_[r]);
      b_.selp(Type::F32, inv, inv, fimm(0.0f), pos);
      Reg lse = e_.op(Op::Add, Type::F32, m_[r], e_.op(Op::Lg2, Type::F32, l_[r]));
      b_.op(Op::Mul, Type::F32, lse, lse, fimm(kLn2));
      b_.selp(Type::F32, lse, lse, fimm(kNegInf), pos);
      for (Reg a : acc_[r]) b_.op(Op::Mul, Type::F32, a, a, inv);
      lse_.push_back(lse);
    }
    lane0_ = e_.setp(Cmp::Eq, Type::U32, lane_, imm(0));
  }

  // Predicate for the store of dim chunk i of row r.
  Reg store_pred(int r, int i) {
    if (!(pdim_.valid() && i == nv_ - 1)) return row_ok_[r];
    return e_.op(Op::And, Type::Pred, row_ok_[r], pdim_);
  }

  // Forward: O in the input dtype, LSE fp32 (when given).
  void forward_store() {
    b_.comment("store O, LSE");
    Reg h = b_.b16();
    Type cvt_to = spec_.dtype == Dtype::BF16 ? Type::BF16 : Type::F16;
    for (int r = 0; r < R_; ++r) {
      Reg row = e_.index(o_bh_, row_i_[r], o_row_bytes_);
      Reg addr = e_.index(row, lane_, 2);
      for (int i = 0; i < nv_; ++i) {
        b_.cvt(cvt_to, Type::F32, ptx::Round::Rn, h, acc_[r][i]);
        b_.when(store_pred(r, i)).st(Space::Global, Type::B16, at(addr, 64 * i), h);
      }
      Reg ok = e_.op(Op::And, Type::Pred, row_ok_[r], lane0_);
      b_.op(Op::And, Type::Pred, ok, ok, has_lse_);
      Reg la = e_.index(lse_row0_, row_i_[r], 4);
      b_.when(ok).st(Space::Global, Type::F32, at(la), lse_[r]);
    }
  }

  // Decode: O_s fp32 and LSE_s into the partial buffers.
  void decode_store() {
    b_.comment("store O_s, LSE_s");
    for (int r = 0; r < R_; ++r) {
      Reg row = e_.index64(o_bh_, row_i_[r], spec_.head_dim_v * 4);
      Reg addr = e_.index(row, lane_, 4);
      for (int i = 0; i < nv_; ++i)
        b_.when(store_pred(r, i)).st(Space::Global, Type::F32, at(addr, 128 * i), acc_[r][i]);
      Reg ok = e_.op(Op::And, Type::Pred, row_ok_[r], lane0_);
      Reg la = e_.index64(lse_row0_, row_lse_[r], 4);
      b_.when(ok).st(Space::Global, Type::F32, at(la), lse_[r]);
    }
  }

  const KernelSpec &spec_;
  AttentionLayout lay_;
  bool decode_;
  ptx::Builder b_;
  Emitter e_;
  int R_ = 0, W_ = 0, T_ = 0, nv_ = 0;
  Reg tid_, lane_, warp_, q_warp_, k_lane_, v_lane_, p_warp_, p_lane_;
  ptx::Symbol q_sm_, k_sm_, v_sm_, p_sm_;
  Reg ld_[4], cv_[8], tmp32_, h16_, gaddr_, ldp_, remk_, pdim_;
  Reg kv4_[4], q4_[4], key_;
  std::vector<Reg> p4_;
  Reg score_scale_, wl_, wr_, hq_, has_lse_, lane0_;
  Softcap cap_;  // softcap constants (invalid without softcap)
  // spec.alibi: the coefficient (forward: one for the CTA; decode: one per
  // row, each packed row its own query head), each row's diagonal (f32),
  // the lane's key (f32) and a scratch register.
  std::vector<Reg> alibi_coef_, alibi_diag_;
  Reg alibi_key_, alibi_t_;
  Reg k_row_bytes_, v_row_bytes_, o_bh_, o_row_bytes_, lse_row0_;
  KvRows kr_, vr_;
  Reg n_begin_, n_end_;
  // row_i_: forward O/LSE row (s32); decode: 64-bit partial-state rows
  // row_i_ (O_s) and row_lse_ (LSE_s).
  std::vector<Reg> row_i_, row_lse_, row_ok_, lo_, hi_, m_, l_, s_, lse_;
  // spec.tree_mask: seqlen_q, the first new token's key, each row's mask row.
  Reg tree_sq_, tree_new0_;
  std::vector<Reg> tree_rows_;
  std::vector<std::vector<Reg>> acc_;
};

}  // namespace

AttentionLayout attention_layout(const KernelSpec &spec) {
  AttentionLayout l;
  l.rows_per_warp = spec.block_m / spec.num_warps;
  l.q_stride = spec.head_dim;
  l.k_stride = spec.head_dim + 4;
  l.v_stride = spec.head_dim_v;
  l.q_bytes = static_cast<uint32_t>(spec.block_m * l.q_stride * 4);
  l.k_bytes = static_cast<uint32_t>(spec.block_n * l.k_stride * 4);
  l.v_bytes = static_cast<uint32_t>(spec.block_n * l.v_stride * 4);
  l.p_bytes = static_cast<uint32_t>(spec.block_m * 32 * 4);
  if (l.total() > kStaticSmemLimit) {
    l.kv_merged = true;
    if (l.v_bytes > l.k_bytes) l.k_bytes = l.v_bytes;
  }
  return l;
}

std::string generate_attention(const KernelSpec &spec) { return AttentionGen(spec).run(); }

}  // namespace kgen
}  // namespace fa
