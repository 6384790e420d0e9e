// Tensor-core forward generator: FlashAttention-2 (Dao, 2023) on mma.sync,
// sm_80 and up, composed from the tile primitives (kernels/tile/tile.h).
//
// A CTA of num_warps warps owns block_m = 16 m_tiles num_warps query rows
// of one (batch, head); warp w owns m_tiles 16-row m-tiles and computes them
// alone, so every K and V fragment it reads from shared memory feeds m_tiles
// mma. K/V tiles are visited from the last to the first: only the first
// visited tile can hold the seqlen_k tail, and the tiles that need a mask
// (causal diagonal, window edges, tail) sit at either end of the range. A
// masked loop handles those; the lean loop in between has no mask, no copy
// predicate and no zero-fill. One K and one V buffer: V_n loads while
// S = Q K_n^T runs, K_{n-1} while softmax and O += P V_n run (FlashAttention-2's
// overlap). Layouts, tile choice and the loop: docs/kernels.md.
// spec.persistent: a grid of SMs x min_ctas CTAs, each running that body
// once per work item (m-block, head, batch) in tile::TileScheduler's order
// (varlen: tile::WorkScheduler's), a CTA barrier between items
// (docs/kernels.md, "Persistent mma.sync forward").
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/launch.h"
#include "kernels/tile/key_range.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/scheduler.h"
#include "kernels/tile/tile.h"

namespace fa {
namespace kgen {
namespace {

using tile::AccTile;
using tile::CopyPlan;
using tile::Frag4;
using tile::Role;
using tile::SmemTile;

struct Layout {
  SmemTile q, k, v, o;
  uint32_t total = 0;
  // spec.persistent, after the tiles: the item's scalars at `sched` (u32
  // head, batch, the dynamic order's next item, first row: kSched*), then with varlen
  // the batch's m-block prefix of work_cap + 1 u32 at `prefix`
  // (tile::WorkScheduler; work_cap: what the tile leaves of the SM's shared
  // memory at its min_ctas CTAs, at most tile::kWorkBatchMax).
  uint32_t sched = 0, prefix = 0;
  int work_cap = 0;
};
constexpr int kSchedHead = 0, kSchedBatch = 4, kSchedNext = 8, kSchedM0 = 12;

Layout layout(const KernelSpec &s) {
  Layout l;
  // The fp8 forward on fp8 mma: rows of fp8 bytes, as 16-bit columns of two
  // bytes (else converted to f16 on load: 16-bit tiles).
  const int u = fp8_forward_mma(s) ? 2 : 1;
  l.q = tile::smem_tile(0, s.block_m, s.head_dim / u);
  l.k = tile::smem_tile(l.q.bytes(), s.block_n, s.head_dim / u);
  l.v = tile::smem_tile(l.k.offset + l.k.bytes(), s.block_n, dv_slice(s) / u);
  l.o = tile::smem_tile(0, s.block_m, dv_slice(s));
  l.total = std::max(l.v.offset + l.v.bytes(), l.o.bytes());
  if (!s.persistent) return l;
  l.sched = (l.total + 15) / 16 * 16;
  l.prefix = l.total = l.sched + 16;
  if (s.varlen) {
    // A CTA's share of the SM (the published limits of spec.sm; 1 KB
    // reserved per CTA, 16 bytes of static scalars), so that min_ctas CTAs
    // still fit.
    DeviceLimits lim;
    if (!published_limits(s.sm, &lim)) published_limits(80, &lim);
    const int64_t share =
        std::min<int64_t>(
            int64_t(lim.smem_per_sm) / std::max(s.min_ctas, 1) - 1024,
            lim.smem_per_block_optin > 0 ? lim.smem_per_block_optin : lim.smem_per_sm - 1024) -
        16;
    const int64_t room = (share - l.prefix) / 4 - 1;
    l.work_cap =
        static_cast<int>(std::min<int64_t>(std::max<int64_t>(room, 0), tile::kWorkBatchMax));
    l.total = l.prefix + 4 * static_cast<uint32_t>(l.work_cap + 1);
  }
  return l;
}

class ForwardTcGen {
 public:
  explicit ForwardTcGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), forward_params_size(spec)),
        e_(b_),
        // fp32: rounded to bf16; fp8 converted on load: f16 (exact)
        half_(spec.dtype == Dtype::F16 || spec.q_fp8 != KvFp8::None ? Type::F16 : Type::BF16),
        out_(spec.dtype == Dtype::F16 ? Type::F16 : Type::BF16),
        f32_(spec.dtype == Dtype::F32),
        fp8_(fp8_forward_mma(spec)),
        fp8_cvt_(spec.q_fp8 != KvFp8::None && !fp8_),
        q8_(spec.q_fp8 == KvFp8::E5M2 ? ptx::Fp8::E5M2 : ptx::Fp8::E4M3),
        kv8_(spec.kv_fp8 == KvFp8::E5M2 ? ptx::Fp8::E5M2 : ptx::Fp8::E4M3) {
    W_ = spec.num_warps;
    T_ = 32 * W_;
    MT_ = spec.m_tiles;
    nS_ = spec.block_n / 8;
    kD_ = lay_.k.cols_pad / 16;  // k16 steps, or k32 of fp8 bytes
    nO_ = fp8_ ? lay_.v.cols_pad / 4 : lay_.v.cols_pad / 8;
    kP_ = spec.block_n / (fp8_ ? 32 : 16);
  }

  std::string run() {
    b_.reserve(ptx_bytes_estimate());
    b_.comment(spec_.describe());
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=%d compute_warps=%d block_m=%d block_n=%d "
                  "rows_per_warp=%d",
                  lay_.total, T_, W_, spec_.block_m, spec_.block_n, 16 * MT_);
    b_.comment(perf);
    b_.set_min_ctas_per_sm(static_cast<uint32_t>(spec_.min_ctas));
    smem_sym_ = b_.extern_shared("smem", 16);
    cta_sym_ = b_.shared("smem_cta", 4, 4 * kCtaScalars);
    if (spec_.persistent) {
      items();
    } else {
      setup();
      prologue();
      loops();
      epilogue();
    }
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, static_cast<uint32_t>(T_));
  }

 private:
  // The module's size, over-estimated by about a quarter (so the body text
  // is allocated once): about 40 bytes per PTX line; per K/V tile body the
  // mma of S and of P V with their ldmatrix, and about 12 lines per score
  // (softcap 18); two bodies, the epilogue and the prologue.
  size_t ptx_bytes_estimate() const {
    const size_t mma = size_t(MT_) * (nS_ * kD_ + nO_ * kP_);
    const size_t scores = size_t(MT_) * 16 * spec_.block_n / 32;
    const size_t body = 3 * mma / 2 + scores * ((spec_.softcap ? 18 : 12) + (spec_.alibi ? 3 : 0));
    return 50 * (2 * body + 40 * size_t(nO_) * MT_ + 600);
  }

  // ---- thread coordinates, shared memory ----
  void setup() {
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    warp_ = e_.op(Op::Shr, Type::U32, tid_, imm(5));
    ln_ = tile::make_lanes(e_, lane);
    smem_ = e_.mov(Type::U32, ptx::sym(smem_sym_));
    wrow_ = e_.op(Op::MulLo, Type::U32, warp_, imm(16 * MT_));  // warp's first tile row
  }

  // ---- spec.persistent: the item loop ----
  // CTA c runs items c, c + nctaid.x, ... (spec.dynamic: c, then nctaid.x +
  // a ticket from the workspace's counter), each through the one-CTA
  // kernel's body (setup to epilogue: everything re-derived per item, only
  // the item number t held across items). Varlen by work: warp 0 first
  // writes the batch's m-block prefix (tile::build_work_prefix), which
  // nothing rewrites. Shared memory between items: the epilogue reads O
  // rows it staged over the Q/K/V tiles, the per-CTA scalars and the item's
  // head and batch; the next item's prologue rewrites them (zero padding,
  // Q/K cp.async, thread 0's scalars), so next_item's CTA barrier comes
  // between every thread's last read of an item and any write of the next.
  void items() {
    using P = ForwardParams;
    const bool by_work = spec_.varlen;
    b_.comment(spec_.dynamic ? "persistent, dynamic: work item ctaid.x, then from the workspace"
                             : "persistent: work items ctaid.x, ctaid.x + nctaid.x, ...");
    Reg t = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    if (by_work) {
      b_.comment("varlen by work: warp 0 writes the batch's m-block prefix");
      Reg tid = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
      Reg batch = e_.param(Type::S32, offsetof(P, batch));
      ptx::Label built = b_.label();
      Reg skip = e_.setp(Cmp::Ge, Type::U32, tid, imm(32));
      b_.op(Op::Or, Type::Pred, skip, skip, e_.setp(Cmp::Gt, Type::S32, batch, imm(lay_.work_cap)));
      b_.when(skip).bra(built);
      tile::build_work_prefix(e_, prefix(), e_.global_param(offsetof(P, cu_seqlens_q)),
                              e_.param(Type::S32, offsetof(P, seqlen_q)), batch, tid, spec_.block_m,
                              lay_.work_cap);
      b_.bind(built);
      b_.bar_sync();
    }
    ptx::Label top = b_.label(), past = b_.label();
    skip_ = b_.label();
    b_.bind(top);
    // L2 sections sized for K and V as stored (fp32: 4 bytes, fp8: 1).
    const int kv_bytes = spec_.kv_fp8 != KvFp8::None ? 1 : elem_bytes(spec_.dtype);
    item_ = tile::persistent_item(
        e_, t, past, by_work ? prefix() : Reg(), e_.param(Type::S32, offsetof(P, seqlen_q)),
        e_.param(Type::S32, offsetof(P, seqlen_k)), e_.param(Type::S32, offsetof(P, num_heads_q)),
        e_.param(Type::S32, offsetof(P, num_heads_kv)), e_.param(Type::S32, offsetof(P, batch)),
        e_.param(Type::S32, offsetof(P, window_left)),
        e_.param(Type::S32, offsetof(P, window_right)), spec_.block_m,
        (spec_.head_dim + spec_.head_dim_v) * kv_bytes, lay_.work_cap);
    setup();
    prologue();
    loops();
    epilogue();
    ptx::Label next = b_.label();
    b_.bra(next);
    b_.bind(skip_);  // an item past its sequence (varlen's padded order): no barrier passed
    // dynamic: the item's slot reads (next_item) are not all done yet.
    if (spec_.dynamic) b_.bar_sync();
    b_.bind(next);
    next_item(t);
    b_.bra(top);
    b_.bind(past);
    if (spec_.dynamic) {
      b_.comment("dynamic: the last CTA out resets the workspace");
      ptx::Label out = b_.label();
      b_.unless(
            e_.setp(Cmp::Eq, Type::U32, e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX)), imm(0)))
          .bra(out);
      tile::retire_dynamic(e_, workspace());
      b_.bind(out);
    }
  }

  // The next work item into t, after the CTA barrier between items.
  // Static: t += nctaid.x. spec.dynamic: thread 0 takes a ticket (atom.add
  // on the workspace's `next`), t = nctaid.x + ticket, and writes it to the
  // item slot before the barrier; every thread reads it after. The slot is
  // rewritten only at the end of the next item, after a barrier each
  // thread reaches after its read (the loops' first, or the skip's).
  void next_item(Reg t) {
    Reg nctaid = e_.mov(Type::U32, ptx::sreg(ptx::Special::NctaidX));
    if (!spec_.dynamic) {
      b_.bar_sync();
      b_.op(Op::Add, Type::U32, t, t, nctaid);
      return;
    }
    b_.comment("dynamic: the next work item is nctaid.x + a ticket from the workspace");
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX)), imm(0));
    Reg ws = workspace(), ticket = b_.b32();
    b_.when(t0).atom_add(false, Type::U32, ticket, at(ws, 0), imm(1));
    b_.when(t0).op(Op::Add, Type::U32, ticket, ticket, nctaid);
    b_.when(t0).st(Space::Shared, Type::U32, at(smem_sym_, lay_.sched + kSchedNext), ticket);
    b_.bar_sync();
    b_.ld(Space::Shared, Type::U32, t, at(smem_sym_, lay_.sched + kSchedNext));
  }

  // spec.dynamic: the workspace {u32 next, u32 exited} (global address).
  Reg workspace() {
    return e_.global_param(forward_tail_offset(spec_) + offsetof(ForwardTail, workspace));
  }
  // Varlen by work: the m-block prefix's shared address.
  Reg prefix() {
    return e_.op(Op::Add, Type::U32, e_.mov(Type::U32, ptx::sym(smem_sym_)), imm(lay_.prefix));
  }
  // The CTA's query head and batch after the prologue: %ctaid.y and .z, or
  // the persistent item's (written by thread 0 in the prologue, published by
  // the loops' first barrier).
  Reg head() { return item_scalar(ptx::Special::CtaidY, kSchedHead); }
  // The CTA's first row after the prologue: m0_ (ctaid.x block_m, which the
  // assembler re-derives where it runs short of registers), or the
  // persistent item's, read back (not held across the loops: the sm_80
  // d128 tile with paged rows, ALiBi and sinks spilled holding it).
  Reg cta_m0() {
    if (!spec_.persistent) return m0_;
    Reg v = b_.b32();
    b_.ld(Space::Shared, Type::S32, v, at(smem_sym_, lay_.sched + kSchedM0));
    return v;
  }
  Reg batch_index() { return item_scalar(ptx::Special::CtaidZ, kSchedBatch); }
  Reg item_scalar(ptx::Special id, int off) {
    if (!spec_.persistent) return e_.mov(Type::U32, ptx::sreg(id));
    Reg v = b_.b32();
    b_.ld(Space::Shared, Type::U32, v, at(smem_sym_, lay_.sched + off));
    return v;
  }

  // ---- CTA (m-block, head, batch): bases, row ranges, copy plans ----
  void prologue() {
    using P = ForwardParams;
    score_scale_ = e_.param(Type::F32, offsetof(P, score_scale));
    if (spec_.softcap)
      cap_ = softcap_consts(e_.param(Type::F32, offsetof(P, softcap_neg2)),
                            e_.param(Type::F32, offsetof(P, softcap_log2)));
    Reg wl = e_.param(Type::S32, offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, offsetof(P, window_right));
    Reg hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    // The CTA's rows (spec.persistent: the work item's, items()).
    Reg mblk = item_.m_block, h = item_.head, bz = item_.batch;
    if (!spec_.persistent) {
      mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
      if (spec_.dv_split > 1) b_.op(Op::Div, Type::U32, mblk, mblk, imm(spec_.dv_split));
      // spec.split_kv: the split is the outermost factor of x (forward_split_index).
      if (spec_.split_kv) b_.op(Op::Rem, Type::U32, mblk, mblk, forward_m_blocks(e_, spec_));
      h = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
      bz = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    }
    Reg hkv = e_.param(Type::S32, offsetof(P, num_heads_kv));
    Reg kvh = e_.op(Op::Div, Type::S32, h, e_.op(Op::Div, Type::S32, hq, hkv));
    if (spec_.q_fp8 != KvFp8::None)
      fp8_scale_scores(e_, spec_, bz, kvh, spec_.softcap ? cap_.neg2 : score_scale_);
    q_ptr_ = e_.global_param(offsetof(P, q));
    k_ptr_ = e_.global_param(offsetof(P, k));
    v_ptr_ = e_.global_param(offsetof(P, v));
    m0_ = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    // Varlen, persistent: an item past its sequence is skipped (items()).
    ForwardBases fb = forward_bases(e_, spec_, q_ptr_, k_ptr_, v_ptr_, bz, h, kvh, m0_,
                                    spec_.persistent && spec_.varlen ? &skip_ : nullptr);
    if (spec_.dv_split > 1) {
      // This CTA's slice of V's columns (KernelSpec::dv_split).
      fb.vr.base =
          e_.index(fb.vr.base, dv_slice_index(e_, spec_),
                   dv_slice(spec_) * (spec_.kv_fp8 != KvFp8::None ? 1 : elem_bytes(spec_.dtype)));
      fb.v_bh = fb.vr.base;
    }
    sq_ = fb.sq;
    sk_ = fb.sk;

    // Query i sees keys [i + sk - sq - wl, i + sk - sq + wr] within [0, sk).
    // This thread's rows: m-tile mi, half hh: m0 + wrow + 16 mi + g + 8 hh,
    // on diagonal diag0 + 16 mi + 8 hh (the masked path derives the ranges).
    Reg shift = e_.op(Op::Sub, Type::S32, sk_, sq_);
    if (spec_.alibi) alibi_setup(bz, h, shift);
    // The CTA's keys: the union of its rows' ranges (lo and hi grow with the
    // row), first tile rounded down to block_n. A tile inside [lo(last valid
    // row), hi(first row)) needs no mask: lean when lean_lo <= n <= lean_hi.
    keys_ = tile::key_range(e_, m0_, shift, sq_, sk_, wl, wr, spec_.block_m, spec_.block_n);
    if (spec_.split_kv) {
      Reg size =
          e_.param(Type::S32, forward_tail_offset(spec_) + offsetof(ForwardTail, split_size));
      tile::split_keys(e_, &keys_, forward_split_index(e_, spec_), size, spec_.block_n);
    }
    Reg lean_lo = keys_.lean_lo;
    // Per-CTA scalars the loops and the epilogue read back from shared
    // memory where they need them (published by the prologue's barrier), so
    // none holds a register across the loops: seqlen_q, seqlen_k, n_begin,
    // lean_lo.
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    const Reg vals[kCtaScalars] = {sq_, sk_, keys_.n_begin, lean_lo};
    for (int i = 0; i < kCtaScalars; ++i)
      b_.when(t0).st(Space::Shared, Type::B32, at(cta_sym_, 4 * i), vals[i]);
    if (spec_.persistent) {  // the item's head, batch and first row, read back after the loops
      b_.when(t0).st(Space::Shared, Type::B32, at(smem_sym_, lay_.sched + kSchedHead), h);
      b_.when(t0).st(Space::Shared, Type::B32, at(smem_sym_, lay_.sched + kSchedBatch), bz);
      b_.when(t0).st(Space::Shared, Type::B32, at(smem_sym_, lay_.sched + kSchedM0), m0_);
    }

    // fp8 converted on load: 1 e4m3, 2 e5m2 (CopyPlan's src_fp8).
    const int q8 = !fp8_cvt_ ? 0 : spec_.q_fp8 == KvFp8::E5M2 ? 2 : 1;
    const int kv8 = !fp8_cvt_ ? 0 : spec_.kv_fp8 == KvFp8::E5M2 ? 2 : 1;
    q_plan_ = CopyPlan(e_, tid_, T_, lay_.q, smem_, fb.q_row, nullptr, Reg(), f32_, q8);
    k_plan_ = CopyPlan(e_, tid_, T_, lay_.k, smem_, fb.k_row, nullptr,
                       e_.param(Type::S64, offsetof(P, k_round_bytes)), f32_, kv8);
    v_plan_ = CopyPlan(e_, tid_, T_, lay_.v, smem_, fb.v_row, &k_plan_,
                       e_.param(Type::S64, offsetof(P, v_round_bytes)), f32_, kv8);
    kr_ = fb.kr;
    vr_ = fb.vr;
    if (spec_.kv_layout != KvLayout::Contiguous) k_ptr_ = v_ptr_ = fb.kr.base;  // safe rows
    if (spec_.kv_layout == KvLayout::Paged) {
      // Tiles within a page: the tile's first row is looked up per tile
      // (tile_ptr); pages shorter than a tile: every row (CopyPlan::gather).
      if (spec_.page_tiles) kp_ = tile_ptr(kr_, k_plan_, keys_.top);
    } else {
      // Running per-thread pointers: V of the tile being computed, K of the
      // next (lower) one; both move down block_n rows per tile.
      vp_ = thread_ptr(v_plan_, fb.v_bh, keys_.top, fb.v_row);
      kp_ = thread_ptr(k_plan_, fb.k_bh, keys_.top, fb.k_row);
      k_step_ = e_.param(Type::S64, offsetof(P, k_tile_bytes));
      v_step_ = e_.param(Type::S64, offsetof(P, v_tile_bytes));
    }
    q_tp_ = thread_ptr(q_plan_, fb.q_bh, m0_, fb.q_row);

    q_lm_ = tile::ldsm_base(e_, ln_, lay_.q, Role::A, smem_, wrow_);
    k_lm_ = tile::ldsm_base(e_, ln_, lay_.k, Role::B_NK, smem_, Reg());
    v_lm_ = tile::ldsm_base(e_, ln_, lay_.v, fp8_ ? Role::B_KN_T8 : Role::B_KN_T, smem_, Reg());
  }

  // ALiBi: the CTA's coefficient (tile::alibi_coef) and each of the
  // thread's rows' distance from its diagonal to the lane's first key
  // column 2q, as f32 (the loops subtract the tile's first key).
  void alibi_setup(Reg bz, Reg h, Reg shift) {
    alibi_coef_ = tile::alibi_coef(e_, offsetof(ForwardParams, alibi_slopes), bz, h,
                                   spec_.softcap ? Reg() : score_scale_);
    Reg d0 = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
    b_.op(Op::Add, Type::S32, d0, d0, shift);
    b_.op(Op::Sub, Type::S32, d0, d0, e_.op(Op::Shl, Type::B32, ln_.q, imm(1)));
    alibi_dist_.clear();
    for (int r = 0; r < 2 * MT_; ++r) {
      Reg d = b_.f32();
      b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, d, e_.op(Op::Add, Type::S32, d0, imm(8 * r)));
      alibi_dist_.push_back(d);
    }
  }

  // The thread's lanes and its warp's first tile row, re-derived from
  // %tid.x where they are needed after the prologue, so they need not stay
  // live (in registers) across the K/V loops.
  struct Coords {
    tile::Lanes ln;
    Reg wrow;
  };
  Coords coords() {
    Coords c;
    Reg tid = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    c.ln = tile::make_lanes(e_, e_.op(Op::And, Type::B32, tid, imm(31)));
    c.wrow = e_.op(Op::MulLo, Type::U32, e_.op(Op::Shr, Type::U32, tid, imm(5)), imm(16 * MT_));
    return c;
  }

  // This sequence's seqlen_q / seqlen_k after the prologue: a parameter, or
  // with varlen a per-CTA scalar, read where it is used.
  Reg seqlen(bool keys) {
    using P = ForwardParams;
    if (!spec_.varlen && !(keys && spec_.seqused_k))
      return e_.param(Type::S32, keys ? offsetof(P, seqlen_k) : offsetof(P, seqlen_q));
    return cta_scalar(keys ? 1 : 0);
  }

  // Slot i of the per-CTA scalars (prologue): 0 seqlen_q, 1 seqlen_k,
  // 2 n_begin, 3 lean_lo.
  static constexpr int kCtaScalars = 4;
  Reg cta_scalar(int i) {
    Reg v = b_.b32();
    b_.ld(Space::Shared, Type::S32, v, at(cta_sym_, 4 * i));
    return v;
  }

  // tile::lean_hi of the first row's diagonal m0 + sk - sq, re-derived at
  // each use (the masked loop's exit) rather than held in a register across
  // the loops.
  Reg lean_hi() {
    Reg wr = e_.param(Type::S32, offsetof(ForwardParams, window_right));
    Reg sk = seqlen(true);
    Reg dfirst = e_.op(Op::Add, Type::S32, e_.op(Op::Sub, Type::S32, sk, seqlen(false)), cta_m0());
    return tile::lean_hi(e_, dfirst, wr, sk, spec_.block_n);
  }

  // base + n * stride + the plan's per-thread offset.
  Reg thread_ptr(const CopyPlan &p, Reg base, Reg n, Reg stride) {
    Reg t = e_.index(base, n, stride);
    if (p.base_offset().valid()) b_.op(Op::Add, Type::S64, t, t, p.base_offset());
    return t;
  }

  // A paged tile's per-thread pointer: key n's row (n a multiple of
  // block_n, so the tile lies in one page) + the plan's offset.
  Reg tile_ptr(const KvRows &kr, const CopyPlan &p, Reg n) {
    Reg t = kr.at(e_, n);
    if (p.base_offset().valid()) b_.op(Op::Add, Type::S64, t, t, p.base_offset());
    return t;
  }

  // Copies the K (or V) tile at key n: rows_left invalid = every row
  // present (the interior path), else rows >= rows_left zero-filled.
  void copy_kv(bool is_v, Reg n, Reg rows_left) {
    const CopyPlan &plan = is_v ? v_plan_ : k_plan_;
    const KvRows &kr = is_v ? vr_ : kr_;
    Reg safe = is_v ? v_ptr_ : k_ptr_;
    if (spec_.kv_layout == KvLayout::Paged && !spec_.page_tiles) {
      // Row r is key min(n + r, seqlen_k - 1): its page entry exists.
      Reg last = e_.op(Op::Sub, Type::S32, seqlen(true), imm(1));
      plan.gather(
          [&](Reg r) {
            Reg j = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, n, r), last);
            return kr.at(e_, j);
          },
          rows_left, safe);
      return;
    }
    Reg tp = is_v ? vp_ : kp_;
    if (spec_.kv_layout == KvLayout::Paged) {
      tp = tile_ptr(kr, plan, n);
      if (!is_v) b_.mov(Type::B64, kp_, tp);
    }
    if (rows_left.valid())
      plan.boundary(tp, rows_left, safe);
    else
      plan.interior(tp);
  }

  // ---- the K/V loops ----
  void loops() {
    s_.clear();
    o_.clear();
    for (int mi = 0; mi < MT_; ++mi) {
      s_.push_back(tile::acc_tile(b_, nS_));
      o_.push_back(tile::acc_tile(b_, nO_));
      tile::zero(b_, o_.back());
    }
    softmax_ = std::make_unique<tile::OnlineSoftmax>(
        e_, MT_, spec_.softcap ? Reg() : score_scale_,
        fp8_ ? tile::OnlineSoftmax::fp8_form() : tile::OnlineSoftmax::Form());
    done_ = b_.label();

    b_.comment("prologue: padding columns, Q tile, K of the last tile");
    q_plan_.zero_padding();
    k_plan_.zero_padding();
    v_plan_.zero_padding();
    q_plan_.boundary(q_tp_, e_.op(Op::Sub, Type::S32, sq_, m0_), q_ptr_);
    b_.cp_async_commit();
    {
      ptx::Label skip = b_.label();
      b_.when(keys_.empty).bra(skip, true);
      copy_kv(false, keys_.top, e_.op(Op::Sub, Type::S32, sk_, keys_.top));
      b_.bind(skip);
      b_.cp_async_commit();
    }
    if (spec_.kv_layout != KvLayout::Paged)
      b_.op(Op::Sub, Type::S64, kp_, kp_, k_step_);  // K of the tile after the last
    b_.cp_async_wait(1);                             // this thread's Q copies landed
    b_.bar_sync();
    if (spec_.q_in_regs) {
      qf_.assign(MT_, std::vector<Frag4>());
      for (int mi = 0; mi < MT_; ++mi)
        for (int ks = 0; ks < kD_; ++ks) {
          qf_[mi].push_back(tile::frag4(b_));
          tile::ldsm(b_, Role::A, qf_[mi][ks], q_lm_, lay_.q.at(16 * mi, 16 * ks));
        }
    } else {
      qf_.assign(MT_, std::vector<Frag4>(1));
      for (int mi = 0; mi < MT_; ++mi) qf_[mi][0] = tile::frag4(b_);
    }
    kb_ = tile::frag4(b_);
    vb_ = kb_;
    if (fp8_)
      for (int i = 0; i < 2; ++i) ve_[i] = b_.b32(), vo_[i] = b_.b32();
    for (Reg &z : zero4_) z = e_.mov(Type::F32, fimm(0.0f));
    for (int mi = 0; mi < MT_; ++mi) pa_.push_back(tile::frag4(b_));
    n_ = e_.mov(Type::S32, keys_.top);
    b_.when(keys_.empty).bra(done_, true);

    tile::KeyLoop loop;
    loop.masked = b_.label();
    loop.lean = b_.label();
    loop.p = b_.pred();
    loop.t = b_.pred();
    loop.n = n_;
    loop.n_begin = keys_.n_begin;
    loop.lean_lo = keys_.lean_lo;
    loop.lean_hi = [this] { return lean_hi(); };
    loop.exit = done_;
    loop.uniform = true;
    tile::key_loop(b_, loop, [this](bool masked) { body(masked); });
    b_.bind(done_);
  }

  // One K/V tile at key n_ (FlashAttention-2's order): K_n is in flight.
  void body(bool masked) {
    b_.cp_async_wait(0);  // K_n landed (this thread's copies) ...
    b_.bar_sync();        // ... everyone's; every warp is done with V of the last tile
    copy_kv(true, n_, masked ? e_.op(Op::Sub, Type::S32, seqlen(true), n_) : Reg());
    b_.cp_async_commit();
    scores();
    if (spec_.alibi) alibi();
    if (masked) mask();
    softmax_->step(s_, o_);
    b_.cp_async_wait(0);  // V_n landed ...
    b_.bar_sync();        // ... everyone's; every warp is done with K_n
    {
      ptx::Label skip = b_.label();
      Reg nx = e_.op(Op::Sub, Type::S32, n_, imm(spec_.block_n));
      Reg last = e_.setp(Cmp::Lt, Type::S32, nx, keys_.n_begin);
      b_.when(last).bra(skip, true);
      copy_kv(false, nx, Reg());  // never the last tile: every row present
      b_.cp_async_commit();
      b_.bind(skip);
    }
    accumulate_pv();
    b_.op(Op::Sub, Type::S32, n_, n_, imm(spec_.block_n));
    if (spec_.kv_layout != KvLayout::Paged) {
      b_.op(Op::Sub, Type::S64, kp_, kp_, k_step_);
      b_.op(Op::Sub, Type::S64, vp_, vp_, v_step_);
    }
  }

  // S = Q K_n^T (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating
  // point type"): s_[mi].f[j] holds keys n + 8j .. n + 8j + 7 of m-tile mi.
  void scores() {
    b_.comment("S = Q K^T");
    for (int ks = 0; ks < kD_; ++ks) {
      const Frag4 *c = ks == 0 ? &zero4_ : nullptr;  // the first k-step starts each sum
      if (!spec_.q_in_regs)
        for (int mi = 0; mi < MT_; ++mi)
          tile::ldsm(b_, Role::A, qf_[mi][0], q_lm_, lay_.q.at(16 * mi, 16 * ks));
      for (int jp = 0; jp < nS_ / 2; ++jp) {
        tile::ldsm(b_, Role::B_NK, kb_, k_lm_, lay_.k.at(16 * jp, 16 * ks));
        for (int mi = 0; mi < MT_; ++mi) {
          const Frag4 &a = qf_[mi][spec_.q_in_regs ? ks : 0];
          if (fp8_) {  // k32 steps of fp8 bytes
            tile::mma_fp8(b_, q8_, kv8_, s_[mi], 2 * jp, a, &kb_[0], c);
            tile::mma_fp8(b_, q8_, kv8_, s_[mi], 2 * jp + 1, a, &kb_[2], c);
            continue;
          }
          tile::mma(b_, half_, s_[mi], 2 * jp, a, &kb_[0], c);
          tile::mma(b_, half_, s_[mi], 2 * jp + 1, a, &kb_[2], c);
        }
      }
    }
    if (spec_.softcap) {
      // softcap * tanh(s * scale / softcap) * log2 e: already log2-domain.
      for (const AccTile &s : s_)
        for (const Frag4 &f : s.f)
          for (Reg x : f) scale_score(e_, x, score_scale_, cap_);
    }
  }

  // Keys outside a row's [lo, hi) = [max(diag - wl, 0), min(diag + wr + 1,
  // sk)) become -inf; element (j, i) of row r holds key n + 8j + 2q + (i & 1).
  void mask() {
    using P = ForwardParams;
    b_.comment("mask");
    Reg wl = e_.param(Type::S32, offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, offsetof(P, window_right));
    const Coords c = coords();
    Reg diag0 = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, cta_m0(), c.wrow), c.ln.g);
    Reg sk = seqlen(true);
    b_.op(Op::Add, Type::S32, diag0, diag0, e_.op(Op::Sub, Type::S32, sk, seqlen(false)));
    Reg kq = e_.op(Op::MadLo, Type::S32, c.ln.q, imm(2), n_);
    Reg p = b_.pred(), t = b_.pred();
    for (int r = 0; r < 2 * MT_; ++r) {
      Reg diag = e_.op(Op::Add, Type::S32, diag0, imm(16 * (r / 2) + 8 * (r % 2)));
      tile::mask_row(b_, s_[r / 2], r % 2, tile::row_range(e_, diag, wl, wr, imm(0), sk), kq, p, t);
    }
  }

  // ALiBi on every tile: row r's key n + 8j + 2q + x is at distance
  // dist_r - n - 8j - x from its diagonal (tile::alibi_row_half).
  void alibi() {
    b_.comment("alibi");
    Reg nf = b_.f32(), d = b_.f32(), t = b_.f32();
    b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, nf, n_);
    for (int r = 0; r < 2 * MT_; ++r) {
      b_.op(Op::Sub, Type::F32, d, alibi_dist_[r], nf);
      tile::alibi_row_half(b_, s_[r / 2], r % 2, d, alibi_coef_, t);
    }
  }

  // O += P V_n: P's A fragments are the packed S fragments (tile::pack_a).
  void accumulate_pv() {
    if (fp8_) return accumulate_pv_fp8();
    b_.comment("O += P V");
    for (int t = 0; t < kP_; ++t) {
      for (int mi = 0; mi < MT_; ++mi) tile::pack_a(b_, half_, s_[mi], 2 * t, pa_[mi]);
      for (int jp = 0; jp < nO_ / 2; ++jp) {
        tile::ldsm(b_, Role::B_KN_T, vb_, v_lm_, lay_.v.at(16 * t, 16 * jp));
        for (int mi = 0; mi < MT_; ++mi) {
          tile::mma(b_, half_, o_[mi], 2 * jp, pa_[mi], &vb_[0]);
          tile::mma(b_, half_, o_[mi], 2 * jp + 1, pa_[mi], &vb_[2]);
        }
      }
    }
  }

  // The fp8 forward's O += P V_n, per k32 step (32 keys): P rounded to e4m3
  // in the key order of tile::pack_a_fp8; per 16-byte column chunk c of V
  // one ldmatrix .trans and tile::v_frags_fp8 give the even and the odd
  // columns of the chunk: O blocks 2c and 2c + 1 (epilogue_fp8's layout).
  void accumulate_pv_fp8() {
    b_.comment("O += P V (fp8)");
    for (int t = 0; t < kP_; ++t) {
      for (int mi = 0; mi < MT_; ++mi) tile::pack_a_fp8(b_, s_[mi], 4 * t, pa_[mi]);
      for (int c = 0; c < nO_ / 2; ++c) {
        tile::ldsm(b_, Role::B_KN_T8, vb_, v_lm_, lay_.v.at(32 * t, 8 * c));
        tile::v_frags_fp8(b_, vb_, ve_, vo_);
        for (int mi = 0; mi < MT_; ++mi) {
          tile::mma_fp8(b_, ptx::Fp8::E4M3, kv8_, o_[mi], 2 * c, pa_[mi], ve_);
          tile::mma_fp8(b_, ptx::Fp8::E4M3, kv8_, o_[mi], 2 * c + 1, pa_[mi], vo_);
        }
      }
    }
  }

  // O = acc / l, staged in shared memory (offset 0, after every warp left the
  // loop) and stored with 16-byte coalesced writes; LSE by quad lane 0.
  void epilogue() {
    b_.comment("epilogue: O through shared memory, LSE");
    b_.cp_async_wait(0);
    b_.bar_sync();
    std::vector<Reg> lse;
    if (spec_.sinks)
      softmax_->finish(o_, &lse, sink_log2(e_, head()));
    else
      softmax_->finish(o_, &lse);
    const Coords cd = coords();
    if (f32_) {
      store_o_f32(cd, lse);
      return;
    }
    const tile::Lanes &ln = cd.ln;
    Reg smem = e_.mov(Type::U32, ptx::sym(smem_sym_));
    if (spec_.q_fp8 != KvFp8::None) apply_v_descale();
    if (spec_.split_kv) {  // the split's partial state: fp32 O, as store_o_f32 writes O
      store_o_f32(cd, lse);
      return;
    }
    if (fp8_) {
      stage_o_fp8(cd, smem);
    } else {
      // Stage: row wrow + 16 mi + g + 8 hh, columns 8j + 2q, 2q+1 (4 bytes).
      Reg st = e_.op(Op::Add, Type::U32, cd.wrow, ln.g);
      b_.op(Op::MadLo, Type::U32, st, st, imm(lay_.o.pitch), smem);
      b_.op(Op::MadLo, Type::U32, st, ln.q, imm(4), st);
      Reg hv = b_.b32();
      for (int mi = 0; mi < MT_; ++mi)
        for (int hh = 0; hh < 2; ++hh)
          for (int j = 0; j < nO_; ++j) {
            if (8 * j >= dv_slice(spec_)) break;  // head-dim padding
            const Frag4 &f = o_[mi].f[j];
            b_.cvt_pack(out_, hv, f[2 * hh + 1], f[2 * hh]);
            b_.st(Space::Shared, Type::B32, at(st, lay_.o.at(16 * mi + 8 * hh, 8 * j)), hv);
          }
    }
    b_.bar_warp_sync(0xffffffffu);  // the warp reads back only its own rows
    Reg h = head();
    Reg bz = batch_index();
    Reg sq = seqlen(false);
    const ForwardOut out = slice_out(forward_out(e_, spec_, bz, h, sq));
    const Reg m0 = cta_m0();
    // Chunk c = lane + 32k of the warp's 16 m_tiles rows x C 16-byte chunks.
    const int C = dv_slice(spec_) / 8, rows = 16 * MT_, total = rows * C;
    Reg v[4] = {b_.b32(), b_.b32(), b_.b32(), b_.b32()};
    for (int k = 0; k * 32 < total; ++k) {
      Reg c = e_.op(Op::Add, Type::U32, ln.lane, imm(32 * k));
      Reg row = e_.op(Op::Div, Type::U32, c, imm(C));
      Reg col = e_.op(Op::Rem, Type::U32, c, imm(C));
      Reg trow = e_.op(Op::Add, Type::U32, row, cd.wrow);
      Reg sa = e_.op(Op::MadLo, Type::U32, trow, imm(lay_.o.pitch), smem);
      b_.op(Op::MadLo, Type::U32, sa, col, imm(16), sa);
      Reg i = e_.op(Op::Add, Type::S32, trow, m0);
      Reg ok = e_.setp(Cmp::Lt, Type::S32, i, sq);
      if ((k + 1) * 32 > total) {
        Reg in = e_.setp(Cmp::Lt, Type::U32, c, imm(total));
        b_.op(Op::And, Type::Pred, ok, ok, in);
      }
      Reg ga = e_.index(e_.index(out.o_bh, i, out.o_row), col, 16);
      b_.when(ok).ld_v(Space::Shared, Type::B32, {v[0], v[1], v[2], v[3]}, at(sa));
      b_.when(ok).st_v(Space::Global, Type::B32, at(ga), {v[0], v[1], v[2], v[3]});
    }
    store_lse(cd, out, sq, lse);
  }

  // The fp8 forward: O times V's descale of (batch, KV head).
  void apply_v_descale() {
    using P = ForwardParams;
    Reg h = head();
    Reg bz = batch_index();
    Reg kvh = e_.op(Op::Div, Type::S32, h,
                    e_.op(Op::Div, Type::S32, e_.param(Type::S32, offsetof(P, num_heads_q)),
                          e_.param(Type::S32, offsetof(P, num_heads_kv))));
    Reg vd = fp8_descale(e_, spec_, offsetof(Fp8Descales, v_descale), bz, kvh);
    for (const AccTile &o : o_)
      for (const Frag4 &f : o.f)
        for (Reg x : f) b_.op(Op::Mul, Type::F32, x, x, vd);
  }

  // The fp8 mma forward's O staging: per 16-column chunk c the lane's
  // columns 16c + 4q .. + 3 of rows wrow + 16 mi + g + 8 hh (blocks 2c: even
  // columns, 2c + 1: odd; tile::v_frags_fp8) as one st.shared.v2.b32.
  void stage_o_fp8(const Coords &cd, Reg smem) {
    const tile::Lanes &ln = cd.ln;
    Reg st = e_.op(Op::Add, Type::U32, cd.wrow, ln.g);
    b_.op(Op::MadLo, Type::U32, st, st, imm(lay_.o.pitch), smem);
    b_.op(Op::MadLo, Type::U32, st, ln.q, imm(8), st);
    const int dv = dv_slice(spec_);
    Reg w[2] = {b_.b32(), b_.b32()};
    for (int c = 0; 16 * c < dv; ++c) {
      Reg ok;  // a chunk past the slice's last column: lanes up to it only
      if (16 * c + 16 > dv) ok = e_.setp(Cmp::Lt, Type::U32, ln.q, imm((dv - 16 * c) / 4));
      for (int mi = 0; mi < MT_; ++mi)
        for (int hh = 0; hh < 2; ++hh) {
          const Frag4 &ev = o_[mi].f[2 * c], &od = o_[mi].f[2 * c + 1];
          b_.cvt_pack(out_, w[0], od[2 * hh], ev[2 * hh]);
          b_.cvt_pack(out_, w[1], od[2 * hh + 1], ev[2 * hh + 1]);
          auto &s = ok.valid() ? b_.when(ok) : b_;
          s.st_v(Space::Shared, Type::B32, at(st, lay_.o.at(16 * mi + 8 * hh, 16 * c)),
                 {w[0], w[1]});
        }
    }
  }

  // fp32 O (FA_DTYPE_FP32, and spec.split_kv's partial O): no rounding and
  // no staging; each lane stores its accumulator pairs (columns 8j + 2q,
  // 2q + 1 of rows g, g + 8 of each m-tile) as st.global.v2.f32, the four
  // lanes of a quad 32 contiguous bytes; the fp8 mma's O (stage_o_fp8's
  // columns 16c + 4q .. + 3, even and odd blocks) as st.global.v4.f32, a
  // quad's 64 bytes.
  void store_o_f32(const Coords &cd, const std::vector<Reg> &lse) {
    const tile::Lanes &ln = cd.ln;
    Reg h = head();
    Reg bz = batch_index();
    Reg sq = seqlen(false);
    const ForwardOut out = slice_out(forward_out(e_, spec_, bz, h, sq));
    const Reg m0 = cta_m0();
    Reg wrel = e_.op(Op::Add, Type::S32, cd.wrow, ln.g);
    for (int mi = 0; mi < MT_; ++mi)
      for (int hh = 0; hh < 2; ++hh) {
        Reg i = e_.op(Op::Add, Type::S32, wrel, imm(16 * mi + 8 * hh));
        b_.op(Op::Add, Type::S32, i, i, m0);
        Reg ok = e_.setp(Cmp::Lt, Type::S32, i, sq);
        if (fp8_) {
          Reg ga = e_.index(e_.index(out.o_bh, i, out.o_row), ln.q, 16);
          const int dv = dv_slice(spec_);
          for (int c = 0; 16 * c < dv; ++c) {
            const Frag4 &ev = o_[mi].f[2 * c], &od = o_[mi].f[2 * c + 1];
            Reg in = ok;  // a chunk past the slice's last column: lanes up to it only
            if (16 * c + 16 > dv) {
              in = e_.setp(Cmp::Lt, Type::U32, ln.q, imm((dv - 16 * c) / 4));
              b_.op(Op::And, Type::Pred, in, in, ok);
            }
            b_.when(in).st_v(Space::Global, Type::F32, at(ga, 64 * c),
                             {ev[2 * hh], od[2 * hh], ev[2 * hh + 1], od[2 * hh + 1]});
          }
          continue;
        }
        Reg ga = e_.index(e_.index(out.o_bh, i, out.o_row), ln.q, 8);
        for (int j = 0; j < nO_; ++j) {
          if (8 * j >= dv_slice(spec_)) break;  // head-dim padding
          const Frag4 &f = o_[mi].f[j];
          b_.when(ok).st_v(Space::Global, Type::F32, at(ga, 32 * j), {f[2 * hh], f[2 * hh + 1]});
        }
      }
    store_lse(cd, out, sq, lse);
  }

  // This CTA's slice of O's columns (KernelSpec::dv_split; fp32 in the
  // partial state of spec.split_kv).
  ForwardOut slice_out(ForwardOut out) {
    const int bytes = spec_.split_kv ? 4 : elem_bytes(spec_.dtype);
    if (spec_.dv_split > 1)
      out.o_bh = e_.index(out.o_bh, dv_slice_index(e_, spec_), dv_slice(spec_) * bytes);
    return out;
  }

  // LSE of the thread's rows, by quad lane 0 (when the caller asked for it).
  void store_lse(const Coords &cd, const ForwardOut &out, Reg sq, const std::vector<Reg> &lse) {
    const tile::Lanes &ln = cd.ln;
    Reg q0 = e_.setp(Cmp::Eq, Type::U32, ln.q, imm(0));
    b_.op(Op::And, Type::Pred, q0, q0, out.has_lse);
    if (spec_.dv_split > 1)  // one writer of the LSE: slice 0
      b_.op(Op::And, Type::Pred, q0, q0,
            e_.setp(Cmp::Eq, Type::U32, dv_slice_index(e_, spec_), imm(0)));
    Reg wrel = e_.op(Op::Add, Type::S32, cd.wrow, ln.g);  // the row of r = 0 within the tile
    const Reg m0 = cta_m0();
    for (int r = 0; r < 2 * MT_; ++r) {
      Reg rt = e_.op(Op::Add, Type::S32, wrel, imm(16 * (r / 2) + 8 * (r % 2)));
      Reg ok = e_.setp(Cmp::Lt, Type::S32, e_.op(Op::Add, Type::S32, rt, m0), sq);
      b_.op(Op::And, Type::Pred, ok, ok, q0);
      Reg la = e_.index(e_.index(out.lse_row0, m0, 4), rt, 4);
      b_.when(ok).st(Space::Global, Type::F32, at(la), lse[r]);
    }
  }

  const KernelSpec &spec_;
  Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;             // the mma's 16-bit type
  Type out_;              // O's type (FA_DTYPE_FP16 / BF16; fp32 O: store_o_f32)
  bool f32_ = false;      // fp32 Q/K/V/O: converted to bf16 on load, O stored as fp32
  bool fp8_ = false;      // the fp8 forward on the fp8 mma: Q, K, V fp8 bytes, m16n8k32
  bool fp8_cvt_ = false;  // the fp8 forward converted to f16 on load (fp8_forward_mma)
  ptx::Fp8 q8_, kv8_;
  Reg ve_[2], vo_[2];  // fp8: V's B fragments of a chunk's even and odd columns
  int W_ = 0, T_ = 0, MT_ = 1, nS_ = 0, kD_ = 0, nO_ = 0, kP_ = 0;
  tile::Lanes ln_;
  ptx::Symbol smem_sym_, cta_sym_;
  Reg tid_, warp_, smem_, wrow_, q_lm_, k_lm_, v_lm_;
  Reg score_scale_;
  Softcap cap_;
  Reg q_ptr_, k_ptr_, v_ptr_;
  Reg sq_, sk_, m0_, n_;
  tile::KeyRange keys_;             // the CTA's keys (tile::key_range)
  tile::TileScheduler::Item item_;  // spec.persistent: the work item's coordinates
  ptx::Label skip_;                 // spec.persistent, varlen: to the next item
  Reg kp_, vp_, q_tp_, k_step_, v_step_;
  KvRows kr_, vr_;
  CopyPlan q_plan_, k_plan_, v_plan_;
  std::vector<AccTile> s_, o_;
  std::vector<std::vector<Frag4>> qf_;
  std::vector<Frag4> pa_;
  Frag4 kb_, vb_;  // one set of registers: K fragments, then V fragments
  Frag4 zero4_;    // f32 zeros: the C operand of S's first k-step
  std::unique_ptr<tile::OnlineSoftmax> softmax_;
  Reg alibi_coef_;               // spec.alibi: the CTA's coefficient
  std::vector<Reg> alibi_dist_;  // spec.alibi: row r's diagonal - 2q (f32)
  ptx::Label done_;
};

}  // namespace

void forward_steps(const KernelSpec &spec, ForwardParams *p) {
  p->k_tile_bytes = p->v_tile_bytes = p->k_round_bytes = p->v_round_bytes = 0;
  if (spec.kind != KernelKind::Forward || !spec.mma) return;
  const Layout l = layout(spec);
  const int threads = 32 * spec.num_warps;
  const int eb = spec.kv_fp8 != KvFp8::None ? 1 : elem_bytes(spec.dtype);  // fp8 K/V: bytes
  p->k_tile_bytes = int64_t(spec.block_n) * p->k_stride[1] * eb;
  p->v_tile_bytes = int64_t(spec.block_n) * p->v_stride[1] * eb;
  p->k_round_bytes = int64_t(CopyPlan::round_rows(threads, l.k)) * p->k_stride[1] * eb;
  p->v_round_bytes = int64_t(CopyPlan::round_rows(threads, l.v)) * p->v_stride[1] * eb;
}

TcLayout tc_layout(const KernelSpec &spec) {
  const Layout l = layout(spec);
  TcLayout t;
  t.q_off = l.q.offset;
  t.k_off = l.k.offset;
  t.v_off = l.v.offset;
  t.q_bytes = l.q.bytes();
  t.k_bytes = l.k.bytes();
  t.v_bytes = l.v.bytes();
  t.o_bytes = l.o.bytes();
  t.total = l.total;
  return t;
}

std::string generate_forward_tc(const KernelSpec &spec) { return ForwardTcGen(spec).run(); }

}  // namespace kgen

void set_forward_steps(const KernelSpec &spec, ForwardParams *p) { kgen::forward_steps(spec, p); }

}  // namespace fa
