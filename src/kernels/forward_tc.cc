// Tensor-core forward generator (FlashAttention-2 on mma.sync, sm_80+).
//
// A CTA of num_warps warps owns block_m = 16 * num_warps query rows of one
// (batch, head); warp w owns rows 16w .. 16w+15 and computes them alone:
// S = Q K^T and O += P V with mma.sync.m16n8k16 (f32 accumulators), the
// online softmax in registers. Q/K/V reach shared memory through cp.async
// (16-byte .cg copies, zero-filled past the sequence and in the head-dim
// padding) into a stages-deep K/V ring. Layouts, pipeline and tile table: docs/kernels.md, "Forward
// on tensor cores".
#include <array>
#include <vector>

#include "kernels/codegen.h"

namespace fa {
namespace kgen {
namespace {

constexpr int kQuadLanes = 4;

class ForwardTcGen {
 public:
  explicit ForwardTcGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(tc_layout(spec)),
        b_(entry_name(spec), sizeof(ForwardParams)),
        e_(b_),
        half_(spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16) {
    W_ = spec.num_warps;
    T_ = 32 * W_;
    nS_ = spec.block_n / 8;
    kD_ = lay_.dpad / 16;
    nO_ = lay_.dvpad / 8;
    kP_ = spec.block_n / 16;
    q_in_regs_ = lay_.dpad <= 128;
  }

  std::string run() {
    b_.comment(spec_.describe());
    b_.set_min_ctas_per_sm(1);
    setup_thread();
    prologue();
    main_loop();
    finalize_and_store();
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, static_cast<uint32_t>(T_));
  }

 private:
  // How the CTA copies a rows x (pad / 8) chunk tile: chunk c = tid + k*T
  // is (row c / C, column chunk c % C). When C divides T every round is
  // round 0 moved down `step` rows (registers computed once).
  struct CopyPlan {
    int rows = 0, C = 0, valid_chunks = 0, smem_row = 0, rounds = 0, step = 0;
    uint32_t smem_off = 0;
    bool uniform = false;
    Reg row0, saddr0, goff0, colok0, step_bytes, stride;
  };

  CopyPlan plan_copy(int rows, int pad, int dim, int smem_row, uint32_t smem_off, Reg stride) {
    CopyPlan p;
    p.rows = rows;
    p.C = pad / 8;
    p.valid_chunks = dim / 8;
    p.smem_row = smem_row;
    p.smem_off = smem_off;
    p.rounds = (rows * p.C + T_ - 1) / T_;
    p.uniform = T_ % p.C == 0;
    p.stride = stride;
    if (p.uniform) {
      p.step = T_ / p.C;
      p.row0 = e_.op(Op::Div, Type::U32, tid_, imm(p.C));
      Reg col = e_.op(Op::Rem, Type::U32, tid_, imm(p.C));
      p.saddr0 = e_.op(Op::MadLo, Type::U32, p.row0, imm(smem_row), smem_);
      b_.op(Op::MadLo, Type::U32, p.saddr0, col, imm(16), p.saddr0);
      b_.op(Op::Add, Type::U32, p.saddr0, p.saddr0, imm(smem_off));
      p.goff0 = e_.op(Op::MulLo, Type::S64, e_.s64(p.row0), stride);
      Reg cb = b_.b64();
      b_.mul_wide(Type::U32, cb, col, imm(16));
      b_.op(Op::Add, Type::S64, p.goff0, p.goff0, cb);
      if (p.valid_chunks < p.C) p.colok0 = e_.setp(Cmp::Lt, Type::U32, col, imm(p.valid_chunks));
      p.step_bytes = e_.op(Op::MulLo, Type::S64, stride, imm(p.step));
    }
    return p;
  }

  // Issues the cp.async copies of tile rows 0 .. rows-1 starting at global
  // address `tile` (row r at tile + r * stride) into the buffer moved by
  // slot_imm bytes plus, when valid, slot_reg bytes; rows >= rem and padding
  // columns are zero-filled (src-size 0, source = safe, never read).
  void issue_copy(const CopyPlan &p, Reg tile, Reg rem, Reg safe, uint32_t slot_imm = 0,
                  Reg slot_reg = Reg()) {
    const int total = p.rows * p.C;
    Reg sbase;
    if (p.uniform) {
      b_.op(Op::Add, Type::S64, ga_, tile, p.goff0);
      b_.mov(Type::S32, remk_, rem);
      sbase = p.saddr0;
      if (slot_reg.valid()) {
        b_.op(Op::Add, Type::U32, sadd_, p.saddr0, slot_reg);
        sbase = sadd_;
      }
    }
    for (int k = 0; k < p.rounds; ++k) {
      Reg inrange;
      if ((k + 1) * T_ > total) {
        inrange = b_.pred();
        b_.setp(Cmp::Lt, Type::U32, inrange, e_.op(Op::Add, Type::U32, tid_, imm(k * T_)),
                imm(total));
      }
      Reg saddr, gaddr;
      int soff = 0;
      if (p.uniform) {
        if (k) {
          b_.op(Op::Add, Type::S64, ga_, ga_, p.step_bytes);
          b_.op(Op::Sub, Type::S32, remk_, remk_, imm(p.step));
        }
        b_.setp(Cmp::Lt, Type::S32, ok_, p.row0, remk_);
        if (p.colok0.valid()) b_.op(Op::And, Type::Pred, ok_, ok_, p.colok0);
        saddr = sbase;
        gaddr = ga_;
        soff = k * p.step * p.smem_row + static_cast<int>(slot_imm);
      } else {
        Reg c = e_.op(Op::Add, Type::U32, tid_, imm(k * T_));
        Reg row = e_.op(Op::Div, Type::U32, c, imm(p.C));
        Reg col = e_.op(Op::Rem, Type::U32, c, imm(p.C));
        b_.setp(Cmp::Lt, Type::S32, ok_, row, rem);
        if (p.valid_chunks < p.C) {
          Reg cok = e_.setp(Cmp::Lt, Type::U32, col, imm(p.valid_chunks));
          b_.op(Op::And, Type::Pred, ok_, ok_, cok);
        }
        saddr = e_.op(Op::MadLo, Type::U32, row, imm(p.smem_row), smem_);
        b_.op(Op::MadLo, Type::U32, saddr, col, imm(16), saddr);
        if (slot_reg.valid()) b_.op(Op::Add, Type::U32, saddr, saddr, slot_reg);
        soff = static_cast<int>(p.smem_off + slot_imm);
        gaddr = e_.op(Op::MulLo, Type::S64, e_.s64(row), p.stride);
        Reg cb = b_.b64();
        b_.mul_wide(Type::U32, cb, col, imm(16));
        b_.op(Op::Add, Type::S64, gaddr, gaddr, cb);
        b_.op(Op::Add, Type::S64, gaddr, gaddr, tile);
      }
      if (inrange.valid()) b_.op(Op::And, Type::Pred, ok_, ok_, inrange);
      b_.selp(Type::B64, src_, gaddr, safe, ok_);
      b_.selp(Type::B32, size_, imm(16), imm(0), ok_);
      if (inrange.valid()) b_.when(inrange);
      b_.cp_async_cg16(at(saddr, soff), at(src_), size_);
    }
  }

  // ---- thread indices, shared memory ----
  void setup_thread() {
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    lane_ = e_.op(Op::And, Type::B32, tid_, imm(31));
    warp_ = e_.op(Op::Shr, Type::U32, tid_, imm(5));
    quad_ = e_.op(Op::And, Type::B32, lane_, imm(kQuadLanes - 1));  // q = lane % 4
    group_ = e_.op(Op::Shr, Type::U32, lane_, imm(2));              // g = lane / 4
    smem_sym_ = b_.extern_shared("smem", 16);
    smem_ = e_.mov(Type::U32, ptx::sym(smem_sym_));
    ga_ = b_.b64();
    src_ = b_.b64();
    size_ = b_.b32();
    remk_ = b_.b32();
    sadd_ = b_.b32();
    ok_ = b_.pred();
    // ldmatrix row addresses of this lane (docs/kernels.md): l8 = lane % 8,
    // h1 = (lane / 8) % 2, h2 = lane / 16.
    Reg l8 = e_.op(Op::And, Type::B32, lane_, imm(7));
    Reg h1 = e_.op(Op::And, Type::B32, e_.op(Op::Shr, Type::U32, lane_, imm(3)), imm(1));
    Reg h2 = e_.op(Op::Shr, Type::U32, lane_, imm(4));
    // Q (A operand): row 16w + l8 + 8 h1, chunk h2.
    Reg qrow = e_.op(Op::MadLo, Type::U32, h1, imm(8), l8);
    b_.op(Op::MadLo, Type::U32, qrow, warp_, imm(16), qrow);
    q_lm_ = e_.op(Op::MadLo, Type::U32, qrow, imm(lay_.q_row), smem_);
    b_.op(Op::MadLo, Type::U32, q_lm_, h2, imm(16), q_lm_);
    b_.op(Op::Add, Type::U32, q_lm_, q_lm_, imm(lay_.q_off));
    // K (B operand, non-transposed): key l8 + 8 h2, chunk h1.
    Reg krow = e_.op(Op::MadLo, Type::U32, h2, imm(8), l8);
    k_lm_ = e_.op(Op::MadLo, Type::U32, krow, imm(lay_.k_row), smem_);
    b_.op(Op::MadLo, Type::U32, k_lm_, h1, imm(16), k_lm_);
    b_.op(Op::Add, Type::U32, k_lm_, k_lm_, imm(lay_.k_off));
    // V (B operand, .trans): key l8 + 8 h1, chunk h2.
    Reg vrow = e_.op(Op::MadLo, Type::U32, h1, imm(8), l8);
    v_lm_ = e_.op(Op::MadLo, Type::U32, vrow, imm(lay_.v_row), smem_);
    b_.op(Op::MadLo, Type::U32, v_lm_, h2, imm(16), v_lm_);
    b_.op(Op::Add, Type::U32, v_lm_, v_lm_, imm(lay_.v_off));
  }

  // ---- CTA (m-block, head, batch): bases, strides, row ranges ----
  void prologue() {
    using P = ForwardParams;
    score_scale_ = e_.param(Type::F32, offsetof(P, score_scale));
    if (spec_.softcap) softcap_log2_ = e_.param(Type::F32, offsetof(P, softcap_log2));
    Reg wl = e_.param(Type::S32, offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, offsetof(P, window_right));
    Reg hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    Reg mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    Reg h = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    Reg bz = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    Reg hkv = e_.param(Type::S32, offsetof(P, num_heads_kv));
    Reg kvh = e_.op(Op::Div, Type::S32, h, e_.op(Op::Div, Type::S32, hq, hkv));
    q_ptr_ = e_.global_param(offsetof(P, q));
    k_ptr_ = e_.global_param(offsetof(P, k));
    v_ptr_ = e_.global_param(offsetof(P, v));
    Reg o = e_.global_param(offsetof(P, o));
    Reg lse_raw = e_.param(Type::U64, offsetof(P, lse));
    has_lse_ = e_.setp(Cmp::Ne, Type::U64, lse_raw, imm(0));
    Reg lse = b_.b64();
    b_.cvta_to_global(lse, lse_raw);
    m0_ = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    const ForwardBases fb =
        forward_bases(e_, spec_, q_ptr_, k_ptr_, v_ptr_, o, lse, bz, h, kvh, hq, m0_);
    sq_ = fb.sq;
    sk_ = fb.sk;
    Reg q_bh = fb.q_bh, o_bh = fb.o_bh;
    k_bh_ = fb.k_bh;
    v_bh_ = fb.v_bh;
    lse_row0_ = fb.lse_row0;
    k_stride_ = fb.k_row;
    v_stride_ = fb.v_row;
    // Query i sees keys [i + sk - sq - wl, i + sk - sq + wr] within [0, sk).
    Reg shift = e_.op(Op::Sub, Type::S32, sk_, sq_);
    for (int r = 0; r < 2; ++r) {
      Reg i = e_.op(Op::MadLo, Type::S32, warp_, imm(16), m0_);
      b_.op(Op::Add, Type::S32, i, i, group_);
      if (r) b_.op(Op::Add, Type::S32, i, i, imm(8));
      row_i_[r] = i;
      row_ok_[r] = e_.setp(Cmp::Lt, Type::S32, i, sq_);
      Reg diag = e_.op(Op::Add, Type::S32, i, shift);
      lo_[r] = e_.op(Op::Max, Type::S32, e_.op(Op::Sub, Type::S32, diag, wl), imm(0));
      hi_[r] = e_.op(Op::Add, Type::S32, diag, wr);
      b_.op(Op::Add, Type::S32, hi_[r], hi_[r], imm(1));
      b_.op(Op::Min, Type::S32, hi_[r], hi_[r], sk_);
    }
    // The CTA's key tiles: the union of its rows' ranges (lo and hi grow
    // with the row), first tile rounded down to block_n. A tile inside
    // [lo(last row), hi(first row)) needs no mask.
    Reg last = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, m0_, imm(spec_.block_m)), sq_);
    b_.op(Op::Sub, Type::S32, last, last, imm(1));
    Reg dfirst = e_.op(Op::Add, Type::S32, m0_, shift);
    Reg dlast = e_.op(Op::Add, Type::S32, last, shift);
    n_begin_ = e_.op(Op::Max, Type::S32, e_.op(Op::Sub, Type::S32, dfirst, wl), imm(0));
    b_.op(Op::And, Type::B32, n_begin_, n_begin_, imm(-spec_.block_n));
    n_end_ = e_.op(Op::Add, Type::S32, dlast, wr);
    b_.op(Op::Add, Type::S32, n_end_, n_end_, imm(1));
    b_.op(Op::Min, Type::S32, n_end_, n_end_, sk_);
    full_lo_ = e_.op(Op::Max, Type::S32, e_.op(Op::Sub, Type::S32, dlast, wl), imm(0));
    full_hi_ = e_.op(Op::Add, Type::S32, dfirst, wr);
    b_.op(Op::Add, Type::S32, full_hi_, full_hi_, imm(1));
    b_.op(Op::Min, Type::S32, full_hi_, full_hi_, sk_);
    b_.op(Op::Sub, Type::S32, full_hi_, full_hi_, imm(spec_.block_n));
    o_bh_ = o_bh;
    o_stride_ = fb.o_row;

    q_plan_ = plan_copy(spec_.block_m, lay_.dpad, spec_.head_dim, lay_.q_row, lay_.q_off, fb.q_row);
    k_plan_ =
        plan_copy(spec_.block_n, lay_.dpad, spec_.head_dim, lay_.k_row, lay_.k_off, k_stride_);
    v_plan_ =
        plan_copy(spec_.block_n, lay_.dvpad, spec_.head_dim_v, lay_.v_row, lay_.v_off, v_stride_);
    q_tile_ = e_.index(q_bh, m0_, fb.q_row);
    q_rem_ = e_.op(Op::Sub, Type::S32, sq_, m0_);
  }

  // Global address of K or V rows from key n, and the rows left (sk - n).
  void kv_tile(Reg bh, Reg stride, Reg n, Reg *tile, Reg *rem) {
    b_.op(Op::MulLo, Type::S64, *tile, e_.s64(n), stride);
    b_.op(Op::Add, Type::S64, *tile, *tile, bh);
    b_.op(Op::Sub, Type::S32, *rem, sk_, n);
  }

  // ---- the FlashAttention-2 loop ----
  // Pipeline (docs/kernels.md, "Pipeline"): a ring of S = spec.stages K and
  // V slots; tile t (keys n_begin + t block_n) lives in slot t % S and is
  // one cp.async group (K and V together). Before computing tile t the loop
  // retires its group with wait_group S-2 (tiles t+1 .. t+S-2 stay in
  // flight), bar.sync publishes it and proves every warp done with tile
  // t-1, whose slot then receives tile t+S-1. Past n_end the group is
  // committed empty, so the counting stays uniform.
  void main_loop() {
    const int S = spec_.stages;
    s_.resize(nS_);
    for (int j = 0; j < nS_; ++j)
      for (int i = 0; i < 4; ++i) s_[j][i] = b_.f32();
    o_.resize(nO_);
    for (int j = 0; j < nO_; ++j)
      for (int i = 0; i < 4; ++i) o_[j][i] = e_.mov(Type::F32, fimm(0.0f));
    for (int r = 0; r < 2; ++r) {
      m_[r] = e_.mov(Type::F32, fimm(kNegInf));
      l_[r] = e_.mov(Type::F32, fimm(0.0f));
    }
    Reg tile = b_.b64(), rem = b_.b32();
    Reg n = e_.mov(Type::S32, n_begin_);
    Reg empty = e_.setp(Cmp::Ge, Type::S32, n, n_end_);
    ptx::Label loop = b_.label(), done = b_.label();

    b_.comment("prologue: Q tile, K/V tiles 0 .. stages-2");
    issue_copy(q_plan_, q_tile_, q_rem_, q_ptr_);
    b_.cp_async_commit();
    for (int t = 0; t + 1 < S; ++t) {
      ptx::Label skip = b_.label();
      Reg nt = e_.op(Op::Add, Type::S32, n, imm(t * spec_.block_n));
      Reg past = e_.setp(Cmp::Ge, Type::S32, nt, n_end_);
      b_.when(past).bra(skip, true);
      issue_kv(nt, t * lay_.k_slot, t * lay_.v_slot, tile, rem);
      b_.bind(skip);
      b_.cp_async_commit();
    }
    b_.cp_async_wait(S - 1);  // the Q group has landed
    b_.bar_sync();
    if (q_in_regs_) {
      qf_.resize(kD_);
      for (int ks = 0; ks < kD_; ++ks) {
        for (int i = 0; i < 4; ++i) qf_[ks][i] = b_.b32();
        b_.ldmatrix(false, qf_[ks].data(), 4, at(q_lm_, ks * 32));
      }
    } else {
      qf_.resize(1);
      for (int i = 0; i < 4; ++i) qf_[0][i] = b_.b32();
    }
    b_.when(empty).bra(done, true);
    // Slot of the tile being computed, and its ldmatrix bases.
    Reg slot = e_.mov(Type::U32, imm(0));
    Reg kl = e_.mov(Type::U32, k_lm_), vl = e_.mov(Type::U32, v_lm_);

    b_.bind(loop);
    b_.cp_async_wait(S - 2);  // tile n landed (this thread's copies) ...
    b_.bar_sync();            // ... everyone's, and every warp is done with tile n - block_n
    {
      b_.comment("K/V tile n + (stages-1) block_n into the slot of tile n - block_n");
      ptx::Label skip = b_.label();
      Reg nt = e_.op(Op::Add, Type::S32, n, imm((S - 1) * spec_.block_n));
      Reg past = e_.setp(Cmp::Ge, Type::S32, nt, n_end_);
      b_.when(past).bra(skip, true);
      // Write slot (slot + S - 1) % S = slot - 1, or S - 1 when slot = 0.
      Reg ws = e_.op(Op::Add, Type::U32, slot, imm(S - 1));
      Reg wrap = e_.setp(Cmp::Ge, Type::U32, ws, imm(S));
      b_.when(wrap).op(Op::Sub, Type::U32, ws, ws, imm(S));
      issue_kv(nt, 0, 0, tile, rem, ws);
      b_.bind(skip);
      b_.cp_async_commit();
    }
    scores(kl);
    mask(n);
    softmax();
    accumulate_pv(vl);
    // Advance the ring: slot + 1 mod S, bases moved by one slot.
    b_.op(Op::Add, Type::U32, slot, slot, imm(1));
    b_.op(Op::Add, Type::U32, kl, kl, imm(lay_.k_slot));
    b_.op(Op::Add, Type::U32, vl, vl, imm(lay_.v_slot));
    Reg wrap = e_.setp(Cmp::Ge, Type::U32, slot, imm(S));
    b_.when(wrap).mov(Type::U32, slot, imm(0));
    b_.when(wrap).mov(Type::U32, kl, k_lm_);
    b_.when(wrap).mov(Type::U32, vl, v_lm_);
    b_.op(Op::Add, Type::S32, n, n, imm(spec_.block_n));
    Reg more = e_.setp(Cmp::Lt, Type::S32, n, n_end_);
    b_.when(more).bra(loop, true);
    b_.bind(done);
  }

  // Issues K and V of the tile at key nt into ring slot (imm bytes k_imm /
  // v_imm, or register slot index ws when valid); one group, the caller commits.
  void issue_kv(Reg nt, uint32_t k_imm, uint32_t v_imm, Reg tile, Reg rem, Reg ws = Reg()) {
    Reg koff, voff;
    if (ws.valid()) {
      koff = e_.op(Op::MulLo, Type::U32, ws, imm(lay_.k_slot));
      voff = e_.op(Op::MulLo, Type::U32, ws, imm(lay_.v_slot));
    }
    kv_tile(k_bh_, k_stride_, nt, &tile, &rem);
    issue_copy(k_plan_, tile, rem, k_ptr_, k_imm, koff);
    kv_tile(v_bh_, v_stride_, nt, &tile, &rem);
    issue_copy(v_plan_, tile, rem, v_ptr_, v_imm, voff);
  }

  // S = Q K^T (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating
  // point type"): s_[j] is the C fragment of keys n + 8j .. n + 8j + 7.
  void scores(Reg kl) {
    b_.comment("S = Q K^T");
    for (int j = 0; j < nS_; ++j)
      for (int i = 0; i < 4; ++i) b_.mov(Type::F32, s_[j][i], fimm(0.0f));
    Reg kb[4];
    for (auto &r : kb) r = b_.b32();
    for (int ks = 0; ks < kD_; ++ks) {
      const Reg *a = q_in_regs_ ? qf_[ks].data() : qf_[0].data();
      if (!q_in_regs_) b_.ldmatrix(false, qf_[0].data(), 4, at(q_lm_, ks * 32));
      for (int jp = 0; jp < nS_ / 2; ++jp) {
        b_.ldmatrix(false, kb, 4, at(kl, 16 * jp * lay_.k_row + ks * 32));
        b_.mma_m16n8k16(half_, s_[2 * jp].data(), a, kb, s_[2 * jp].data());
        b_.mma_m16n8k16(half_, s_[2 * jp + 1].data(), a, kb + 2, s_[2 * jp + 1].data());
      }
    }
    // Scale to the log2 domain (softcap: softcap * tanh(s * scale / softcap)
    // * log2 e, with tanh from ex2 as in the scalar kernel).
    for (int j = 0; j < nS_; ++j) {
      for (int i = 0; i < 4; ++i) {
        Reg s = s_[j][i];
        scale_score(e_, s, score_scale_, spec_.softcap ? softcap_log2_ : Reg());
      }
    }
  }

  // Keys outside a row's [lo, hi) become -inf. Skipped (uniformly over the
  // CTA) when the tile lies inside every row's range.
  void mask(Reg n) {
    ptx::Label skip = b_.label();
    Reg inside = e_.setp(Cmp::Ge, Type::S32, n, full_lo_);
    Reg below = e_.setp(Cmp::Le, Type::S32, n, full_hi_);
    b_.op(Op::And, Type::Pred, inside, inside, below);
    b_.when(inside).bra(skip, true);
    b_.comment("mask");
    // Element (j, i) holds key n + 2q + 8j + (i & 1) of row i / 2.
    Reg kq = e_.op(Op::MadLo, Type::S32, quad_, imm(2), n);
    Reg lo[2], hi[2];
    for (int r = 0; r < 2; ++r) {
      lo[r] = e_.op(Op::Sub, Type::S32, lo_[r], kq);
      hi[r] = e_.op(Op::Sub, Type::S32, hi_[r], kq);
    }
    Reg p = b_.pred(), t = b_.pred();
    for (int j = 0; j < nS_; ++j) {
      for (int i = 0; i < 4; ++i) {
        const int c = 8 * j + (i & 1), r = i / 2;
        b_.setp(Cmp::Le, Type::S32, p, lo[r], imm(c));
        b_.setp(Cmp::Gt, Type::S32, t, hi[r], imm(c));
        b_.op(Op::And, Type::Pred, p, p, t);
        b_.selp(Type::F32, s_[j][i], s_[j][i], fimm(kNegInf), p);
      }
    }
    b_.bind(skip);
  }

  // Online softmax in the log2 domain, per row r (elements 2r, 2r+1 of each
  // fragment; the row's 4 threads form a quad, reduced with shfl.bfly 1, 2).
  // m' = max(m, max s); p = 2^(s - m'); l = l 2^(m - m') + sum p; O *= 2^(m - m').
  // A row that has seen no key keeps m = -inf and uses 0 as the offset, so
  // -inf - -inf never appears.
  void softmax() {
    b_.comment("online softmax");
    Reg t = b_.f32();
    for (int r = 0; r < 2; ++r) {
      Reg mt = e_.mov(Type::F32, m_[r]);
      for (int j = 0; j < nS_; ++j) {
        b_.op(Op::Max, Type::F32, mt, mt, s_[j][2 * r]);
        b_.op(Op::Max, Type::F32, mt, mt, s_[j][2 * r + 1]);
      }
      for (int off = 1; off <= 2; off <<= 1) {
        b_.shfl(ptx::Shfl::Bfly, t, mt, imm(off), imm(31), 0xffffffffu);
        b_.op(Op::Max, Type::F32, mt, mt, t);
      }
      Reg none = e_.setp(Cmp::Eq, Type::F32, mt, fimm(kNegInf));
      Reg off = e_.selp(Type::F32, fimm(0.0f), mt, none);
      Reg alpha = e_.op(Op::Ex2, Type::F32, e_.op(Op::Sub, Type::F32, m_[r], off));
      b_.mov(Type::F32, m_[r], mt);
      Reg sum = e_.mov(Type::F32, fimm(0.0f));
      for (int j = 0; j < nS_; ++j) {
        for (int e = 0; e < 2; ++e) {
          Reg s = s_[j][2 * r + e];
          b_.op(Op::Sub, Type::F32, s, s, off);
          b_.op(Op::Ex2, Type::F32, s, s);
          b_.op(Op::Add, Type::F32, sum, sum, s);
        }
      }
      b_.op(Op::Fma, Type::F32, l_[r], l_[r], alpha, sum);
      for (int j = 0; j < nO_; ++j) {
        b_.op(Op::Mul, Type::F32, o_[j][2 * r], o_[j][2 * r], alpha);
        b_.op(Op::Mul, Type::F32, o_[j][2 * r + 1], o_[j][2 * r + 1], alpha);
      }
    }
  }

  // O += P V. The C fragments of S tiles 2t and 2t+1 are, packed in pairs,
  // exactly the A fragment of P for keys 16t .. 16t+15: a0 = {s[2t] c0, c1}
  // (row g), a1 = {s[2t] c2, c3} (row g+8), a2/a3 the same of s[2t+1].
  void accumulate_pv(Reg vl) {
    b_.comment("O += P V");
    Reg pa[4], vb[4];
    for (auto &r : pa) r = b_.b32();
    for (auto &r : vb) r = b_.b32();
    for (int t = 0; t < kP_; ++t) {
      b_.cvt_pack(half_, pa[0], s_[2 * t][1], s_[2 * t][0]);
      b_.cvt_pack(half_, pa[1], s_[2 * t][3], s_[2 * t][2]);
      b_.cvt_pack(half_, pa[2], s_[2 * t + 1][1], s_[2 * t + 1][0]);
      b_.cvt_pack(half_, pa[3], s_[2 * t + 1][3], s_[2 * t + 1][2]);
      for (int jp = 0; jp < nO_ / 2; ++jp) {
        b_.ldmatrix(true, vb, 4, at(vl, 16 * t * lay_.v_row + jp * 32));
        b_.mma_m16n8k16(half_, o_[2 * jp].data(), pa, vb, o_[2 * jp].data());
        b_.mma_m16n8k16(half_, o_[2 * jp + 1].data(), pa, vb + 2, o_[2 * jp + 1].data());
      }
    }
  }

  // l summed over the quad; O = acc / l; LSE = (m + log2 l) ln 2; a row with
  // l = 0 (no visible key) gets O = 0 and LSE = -inf. O goes straight from
  // the C fragments to global memory (4 bytes per thread and row, 16
  // contiguous bytes per quad).
  void finalize_and_store() {
    b_.comment("finalize, store O and LSE");
    Reg t = b_.f32();
    Reg q0 = e_.setp(Cmp::Eq, Type::U32, quad_, imm(0));
    Reg hv = b_.b32();
    for (int r = 0; r < 2; ++r) {
      for (int off = 1; off <= 2; off <<= 1) {
        b_.shfl(ptx::Shfl::Bfly, t, l_[r], imm(off), imm(31), 0xffffffffu);
        b_.op(Op::Add, Type::F32, l_[r], l_[r], t);
      }
      Reg pos = e_.setp(Cmp::Gt, Type::F32, l_[r], fimm(0.0f));
      Reg inv = e_.op(Op::RcpRn, Type::F32, l_[r]);
      b_.selp(Type::F32, inv, inv, fimm(0.0f), pos);
      Reg lse = e_.op(Op::Add, Type::F32, m_[r], e_.op(Op::Lg2, Type::F32, l_[r]));
      b_.op(Op::Mul, Type::F32, lse, lse, fimm(kLn2));
      b_.selp(Type::F32, lse, lse, fimm(kNegInf), pos);
      Reg row = e_.index(o_bh_, row_i_[r], o_stride_);
      Reg addr = e_.index(row, quad_, 4);
      for (int j = 0; j < nO_; ++j) {
        if (8 * j >= spec_.head_dim_v) break;  // head-dim padding
        Reg lo = e_.op(Op::Mul, Type::F32, o_[j][2 * r], inv);
        Reg hi = e_.op(Op::Mul, Type::F32, o_[j][2 * r + 1], inv);
        b_.cvt_pack(half_, hv, hi, lo);
        b_.when(row_ok_[r]).st(Space::Global, Type::B32, at(addr, 16 * j), hv);
      }
      Reg ok = e_.op(Op::And, Type::Pred, row_ok_[r], q0);
      b_.op(Op::And, Type::Pred, ok, ok, has_lse_);
      Reg la = e_.index(lse_row0_, row_i_[r], 4);
      b_.when(ok).st(Space::Global, Type::F32, at(la), lse);
    }
  }

  const KernelSpec &spec_;
  TcLayout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;
  int W_ = 0, T_ = 0, nS_ = 0, kD_ = 0, nO_ = 0, kP_ = 0;
  bool q_in_regs_ = false;
  ptx::Symbol smem_sym_;
  Reg tid_, lane_, warp_, quad_, group_, smem_, q_lm_, k_lm_, v_lm_;
  Reg ga_, src_, size_, remk_, ok_, sadd_;
  Reg score_scale_, softcap_log2_, has_lse_;
  Reg q_ptr_, k_ptr_, v_ptr_, k_bh_, v_bh_, k_stride_, v_stride_, o_bh_, o_stride_, lse_row0_;
  Reg sq_, sk_, m0_, n_begin_, n_end_, full_lo_, full_hi_, q_tile_, q_rem_;
  Reg row_i_[2], row_ok_[2], lo_[2], hi_[2], m_[2], l_[2];
  CopyPlan q_plan_, k_plan_, v_plan_;
  std::vector<std::array<Reg, 4>> s_, o_, qf_;
};

}  // namespace

TcLayout tc_layout(const KernelSpec &spec) {
  TcLayout l;
  l.dpad = (spec.head_dim + 15) / 16 * 16;
  l.dvpad = (spec.head_dim_v + 15) / 16 * 16;
  // +16 bytes per row: 8 consecutive rows start on distinct 16-byte bank
  // groups, so every ldmatrix phase is conflict-free (docs/kernels.md).
  l.q_row = 2 * l.dpad + 16;
  l.k_row = 2 * l.dpad + 16;
  l.v_row = 2 * l.dvpad + 16;
  l.q_off = 0;
  l.k_slot = static_cast<uint32_t>(spec.block_n * l.k_row);
  l.v_slot = static_cast<uint32_t>(spec.block_n * l.v_row);
  l.k_off = static_cast<uint32_t>(spec.block_m * l.q_row);
  l.v_off = l.k_off + static_cast<uint32_t>(spec.stages) * l.k_slot;
  l.total = l.v_off + static_cast<uint32_t>(spec.stages) * l.v_slot;
  return l;
}

std::string generate_forward_tc(const KernelSpec &spec) { return ForwardTcGen(spec).run(); }

}  // namespace kgen
}  // namespace fa
