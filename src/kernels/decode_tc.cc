// Tensor-core decode generator: Flash-Decoding (Dao, Haziza, Massa, Sizov,
// 2023) on mma.sync, sm_80 and up, composed from the tile primitives
// (kernels/tile/tile.h).
//
// A CTA owns one (split, KV head, m-block, batch). Its 16 rows are (token,
// query head) pairs of the KV head's GQA group packed into the mma M
// dimension: packed row r is token r / group_size and query head
// kv_head * group_size + r % group_size, so one K/V tile read serves every
// query head of the group and every new token (speculative decoding). The
// split's keys are cut into warp tiles of 16 keys dealt round-robin to the
// warps; each warp streams its own tiles through a private ring of `stages`
// K/V buffers (16-byte cp.async, at least two tiles in flight with three
// stages), keeps its own online-softmax state, and meets the other warps
// only after the loop: no CTA barrier in the loop. The warps' states are then
// merged in shared memory (fa_decode_reduce's combine) and the CTA writes its
// split's partial state: O normalised within the split (fp32) and LSE.
// With an fp8 KV cache (spec.kv_fp8) the ring holds the fp8 bytes as they
// are in global memory (half the bytes of a 16-bit tile, so half the global
// traffic, still 16-byte cp.async on every layout), and the mma reads them
// from there: a byte ldmatrix, then a cvt to f16 in registers (mode (a):
// tile::b_frag_fp8_nk for K, whose k order Q's columns follow in shared
// memory once per CTA (tile::kperm_rows); tile::b_frags_fp8_kn for V,
// whose even and odd columns land in neighbouring n8 tiles: O is in
// tile::AccCols::EvenOdd order until the merge stores it). The K descale
// is folded into the score scale, the V descale into the final 1 / l.
// Mode (b) (spec.kv_fp8_mma, sm_89 and sm_120/121, off by default): Q is
// quantised once per CTA to e4m3 per packed row (tile::rows_to_e4m3, a
// power of two per row, undone on the scores), S = Q K^T runs on the fp8
// mma (m16n8k32) straight on the ring's K bytes, P is rounded to e4m3
// (the fp8 forward's softmax form and key order) and O += P V runs on the
// fp8 mma too, each k32 step over the warp tile's 16 keys with keys 16..31
// zero in both operands.
// Layouts, tile choice and the loop: docs/kernels.md.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/merge.h"
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

constexpr int kRows = 16;      // packed rows per CTA: one m16 tile
constexpr int kWarpKeys = 16;  // keys per warp tile

// Dynamic shared memory: Q [16][d] at 0; then per warp `stages` stages of
// K [16][d] and V [16][dv] (stage s of warp w at kv_base + w warp_bytes +
// s stage_bytes). After the loop the merge area reuses it from 0: per warp
// O [16][dv] f32 (rows padded: conflict-free stores) and LSE [16] f32.
// fp8 KV: k and v are byte tiles (tile::byte_tile), which the mma reads
// directly; mode (b) adds Q's e4m3 bytes [16][d] (q8) between Q and the
// rings.
struct Layout {
  SmemTile q, k, v;  // k, v: offsets within a stage
  SmemTile q8;       // spec.kv_fp8_mma: Q's e4m3 bytes (after q)
  uint32_t kv_base = 0, stage_bytes = 0, warp_bytes = 0;
  uint32_t merge_pitch = 0;             // bytes per row of a warp's merge O
  uint32_t merge_o = 0, merge_lse = 0;  // per-warp bytes of each merge part
  uint32_t total = 0;
};

Layout layout(const KernelSpec &s) {
  Layout l;
  const bool fp8 = s.kv_fp8 != KvFp8::None;
  l.q = tile::smem_tile(0, kRows, s.head_dim);
  l.k = fp8 ? tile::byte_tile(0, kWarpKeys, s.head_dim) : tile::smem_tile(0, kWarpKeys, s.head_dim);
  l.v = fp8 ? tile::byte_tile(l.k.bytes(), kWarpKeys, dv_slice(s))
            : tile::smem_tile(l.k.bytes(), kWarpKeys, dv_slice(s));
  l.kv_base = (l.q.bytes() + 127) / 128 * 128;
  if (s.kv_fp8_mma) {  // mode (b): Q's e4m3 bytes, then the rings
    l.q8 = tile::byte_tile(l.kv_base, kRows, s.head_dim);
    l.kv_base = (l.q8.offset + l.q8.bytes() + 127) / 128 * 128;
  }
  // spec.v_in_k: no V tile; V is a view of the K tile's first columns
  // (its pitch; the CTA's slice chooses the columns at run time).
  l.stage_bytes = l.k.bytes() + (s.v_in_k ? 0 : l.v.bytes());
  l.warp_bytes = static_cast<uint32_t>(s.stages) * l.stage_bytes;
  if (s.v_in_k) {
    l.v.offset = l.k.offset;
    l.v.pitch = l.k.pitch;
  }
  // +32 bytes: the 4 rows of a half-warp's 8-byte stores start 8 banks
  // apart (conflict-free; +16 would overlap them by half). fp8 (O in
  // AccCols::EvenOdd order, 16-byte stores): the 2 rows of a quarter-warp
  // start 16 banks apart (dv_slice is a multiple of 16: +64 or +0).
  const uint32_t o_bytes = static_cast<uint32_t>(dv_slice(s)) * 4;
  l.merge_pitch = fp8 ? o_bytes + (o_bytes % 128 == 64 ? 0 : 64) : o_bytes + 32;
  l.merge_o = kRows * l.merge_pitch;
  l.merge_lse = kRows * 4;
  const uint32_t kv = l.kv_base + static_cast<uint32_t>(s.num_warps) * l.warp_bytes;
  const uint32_t merge = static_cast<uint32_t>(s.num_warps) * (l.merge_o + l.merge_lse);
  l.total = std::max(kv, merge);
  return l;
}

class DecodeTcGen {
 public:
  explicit DecodeTcGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), decode_params_size(spec)),
        e_(b_),
        half_(spec.dtype == Dtype::F16 ? Type::F16 : Type::BF16),  // fp32: rounded to bf16
        // An fp8 cache converts to f16 in one cvt per two values, to bf16
        // only through f32: with bf16 Q the mma runs in f16 on a row-scaled
        // f16 copy of Q (tile::rows_bf16_to_f16) and f16 P.
        mma_(spec.kv_fp8 != KvFp8::None ? Type::F16 : half_),
        fp8_(spec.kv_fp8 != KvFp8::None),
        f32_(spec.dtype == Dtype::F32),
        e5m2_(spec.kv_fp8 == KvFp8::E5M2),
        f8mma_(spec.kv_fp8_mma),
        kv8_(e5m2_ ? ptx::Fp8::E5M2 : ptx::Fp8::E4M3) {
    W_ = spec.num_warps;
    S_ = spec.stages;
    G_ = spec.group_size;
    kD_ = f8mma_ ? spec.head_dim / 32 : (spec.head_dim + 15) / 16;  // k16 steps, or k32 of bytes
    nO_ = (dv_slice(spec) + 15) / 16 * 2;
    ocols_ = fp8_ ? tile::AccCols::EvenOdd : tile::AccCols::Natural;
  }

  std::string run() {
    b_.comment(spec_.describe());
    // block_n for sass-report: the keys the CTA consumes per iteration of
    // the loop, which is unrolled by the stage count (S tiles per warp).
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=%d compute_warps=%d block_m=%d block_n=%d "
                  "rows_per_warp=%d",
                  lay_.total, 32 * W_, W_, kRows, kWarpKeys * W_ * S_, kRows);
    b_.comment(perf);
    b_.set_min_ctas_per_sm(static_cast<uint32_t>(spec_.min_ctas));
    setup();
    prologue();
    loop();
    // spec.pdl: the combine (a programmatic dependent launch) may be
    // scheduled now; its griddepcontrol.wait still waits for this grid.
    if (spec_.pdl) b_.griddepcontrol_launch_dependents();
    merge_and_store();
    if (spec_.fused_combine) fused_combine();
    b_.exit();
    return std::move(b_).emit(ptx_isa_version(spec_), spec_.sm, static_cast<uint32_t>(32 * W_));
  }

 private:
  using P = DecodeParams;

  void setup() {
    tid_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
    lane_ = e_.op(Op::And, Type::B32, tid_, imm(31));
    warp_ = e_.op(Op::Shr, Type::U32, tid_, imm(5));
    ln_ = tile::make_lanes(e_, lane_);
    smem_sym_ = b_.extern_shared("smem", 16);
    smem_ = e_.mov(Type::U32, ptx::sym(smem_sym_));
    // This warp's K/V ring.
    wsmem_ = e_.op(Op::MadLo, Type::U32, warp_, imm(lay_.warp_bytes), smem_);
    b_.op(Op::Add, Type::U32, wsmem_, wsmem_, imm(lay_.kv_base));
  }

  // ---- CTA (split, KV head x m-block, batch): rows, key range, plans ----
  void prologue() {
    score_scale_ = e_.param(Type::F32, offsetof(P, score_scale));
    if (spec_.softcap)
      cap_ = softcap_consts(e_.param(Type::F32, offsetof(P, softcap_neg2)),
                            e_.param(Type::F32, offsetof(P, softcap_log2)));
    Reg split = this_split();
    Reg y = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    bz_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
    sq_ = e_.param(Type::S32, offsetof(P, seqlen_q));
    sq_out_ = sq_;  // the partial states' rows per sequence
    Reg split_size = e_.param(Type::S32, offsetof(P, split_size));
    rows_ = e_.op(Op::MulLo, Type::S32, sq_, imm(G_));  // packed rows (API: <= FA_MAX_SEQLEN)
    Reg nblk = e_.op(Op::Add, Type::S32, rows_, imm(kRows - 1));
    b_.op(Op::Shr, Type::S32, nblk, nblk, imm(4));
    kvh_ = e_.op(Op::Div, Type::S32, y, nblk);
    m0_ = e_.op(Op::Shl, Type::B32, e_.op(Op::Rem, Type::S32, y, nblk), imm(4));
    Reg q = e_.global_param(offsetof(P, q)), k = e_.global_param(offsetof(P, k));
    Reg v = e_.global_param(offsetof(P, v));
    Reg qs[3], ks[3], vs[3];
    const int kv_bytes = fp8_ ? 1 : elem_bytes(spec_.dtype);
    for (int i = 0; i < 3; ++i) {
      qs[i] = e_.stride_bytes(offsetof(P, q_stride) + 8 * i, elem_bytes(spec_.dtype));
      ks[i] = e_.stride_bytes(offsetof(P, k_stride) + 8 * i, kv_bytes);
      vs[i] = e_.stride_bytes(offsetof(P, v_stride) + 8 * i, kv_bytes);
    }
    // spec.pdl: a programmatic dependent launch. Q, the cache and its
    // tables may be the previous kernel's output: global memory only after
    // that kernel has completed (all above is parameters and indices).
    if (spec_.pdl) b_.griddepcontrol_wait();
    Reg q_b;  // sequence bz's first query row
    if (spec_.varlen) {
      // Its queries: rows cu[b] .. of q, at most seqlen_q (the grid's m-blocks
      // count those); a CTA past them has nothing to do (the combine skips
      // those rows).
      Reg cuq = e_.global_param(offsetof(P, cu_seqlens_q));
      Reg q0 = b_.b32(), q1 = b_.b32();
      Reg a = e_.index(cuq, bz_, 4);
      b_.ld(Space::Global, Type::S32, q0, at(a), true);
      b_.ld(Space::Global, Type::S32, q1, at(a, 4), true);
      sq_ = seq_len(e_, q0, q1, sq_out_);
      rows_ = e_.op(Op::MulLo, Type::S32, sq_, imm(G_));
      b_.when(e_.setp(Cmp::Ge, Type::S32, m0_, rows_)).exit();
      q_b = e_.index(q, q0, qs[1]);
    }
    if (fp8_) {
      // K's descale of (batch, KV head) scales every score of the CTA (with
      // softcap the scale lives in its -2 log2(e) score_scale constant).
      Reg kd = descale(offsetof(P, k_descale));
      Reg &sc = spec_.softcap ? cap_.neg2 : score_scale_;
      b_.op(Op::Mul, Type::F32, sc, sc, kd);
    }
    kv_rows(e_, spec_, offsetof(P, kv), k, v, ks, vs, bz_, kvh_, &kr_, &vr_);
    // cache_seqlens is device data: clamped to [0, seqlen_k_max].
    Reg seqlens = spec_.fixed_len ? Reg() : e_.global_param(offsetof(P, cache_seqlens));
    sk_ = decode_seqlen(e_, spec_, bz_, seqlens);
    Reg sk_max = e_.param(Type::S32, offsetof(P, seqlen_k_max));
    if (spec_.append_kv) {
      // KV append: cache_seqlens is the length before it, clamped to
      // [0, seqlen_k_max - seqlen_new] (the API keeps that >= 0).
      sn_ = e_.param(Type::S32, offsetof(P, seqlen_new));
      b_.op(Op::Sub, Type::S32, sk_max, sk_max, sn_);
    }
    b_.op(Op::Min, Type::S32, sk_, sk_, sk_max);
    b_.op(Op::Max, Type::S32, sk_, sk_, imm(0));
    if (spec_.append_kv) {
      sk_old_ = e_.mov(Type::S32, sk_);
      b_.op(Op::Add, Type::S32, sk_, sk_, sn_);
    }
    // The split's keys [split*split_size, min(+split_size, sk)), in 64 bits.
    Reg lo64 = e_.wide_mul(split, split_size);
    Reg hi64 = e_.op(Op::Add, Type::S64, lo64, e_.s64(split_size));
    b_.op(Op::Min, Type::S64, hi64, hi64, e_.s64(sk_));
    b_.op(Op::Min, Type::S64, lo64, lo64, e_.s64(sk_));
    Reg slo = e_.s32(lo64), shi = e_.s32(hi64);

    // Row visibility: token t sees keys [t + sk - sq - wl, t + sk - sq + wr]
    // within the split. This thread's rows m0 + g + 8h.
    Reg wl = e_.param(Type::S32, offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, offsetof(P, window_right));
    Reg shift = e_.op(Op::Sub, Type::S32, sk_, sq_);
    auto range = [&](Reg t, Reg *lo, Reg *hi) {
      const tile::RowRange r =
          tile::row_range(e_, e_.op(Op::Add, Type::S32, t, shift), wl, wr, slo, shi);
      *lo = r.lo;
      *hi = r.hi;
    };
    if (spec_.tree_mask) {
      // Tree mask: the first new token's key, and the mask row (bytes) of
      // each of this thread's two rows (a padding row reads the last token's
      // row: in bounds, and its scores are masked anyway).
      new0_ = shift;
      Reg tm = e_.global_param(offsetof(P, tree_mask));
      Reg tm_b = e_.index(tm, bz_, e_.param(Type::S64, offsetof(P, tree_mask_stride)));
      Reg row_bytes = e_.param(Type::S64, offsetof(P, tree_mask_stride) + 8);
      Reg last_t = e_.op(Op::Sub, Type::S32, sq_, imm(1));
      for (int h = 0; h < 2; ++h) {
        Reg r = e_.op(Op::Add, Type::S32, m0_, ln_.g);
        if (h) b_.op(Op::Add, Type::S32, r, r, imm(8));
        Reg t = e_.op(Op::Min, Type::S32, e_.op(Op::Div, Type::S32, r, imm(G_)), last_t);
        mrow_[h] = e_.index(tm_b, t, row_bytes);
      }
    }
    for (int h = 0; h < 2; ++h) {
      Reg r = e_.op(Op::Add, Type::S32, m0_, ln_.g);
      if (h) b_.op(Op::Add, Type::S32, r, r, imm(8));
      Reg t = e_.op(Op::Div, Type::S32, r, imm(G_));
      range(t, &lo_[h], &hi_[h]);
      if (spec_.alibi) {
        // ALiBi: packed row r is query head kvh G + r % G (its own slope),
        // token t on diagonal t + sk - sq; its distance to the lane's first
        // key column 2q, as f32 (the body subtracts the tile's first key).
        Reg qh = e_.op(Op::MadLo, Type::S32, kvh_, imm(G_), e_.op(Op::Rem, Type::S32, r, imm(G_)));
        alibi_coef_[h] = tile::alibi_coef(e_, offsetof(P, alibi_slopes), bz_, qh,
                                          spec_.softcap ? Reg() : score_scale_);
        Reg d = e_.op(Op::Add, Type::S32, t, shift);
        b_.op(Op::Sub, Type::S32, d, d, e_.op(Op::Shl, Type::B32, ln_.q, imm(1)));
        alibi_dist_[h] = b_.f32();
        b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, alibi_dist_[h], d);
      }
      // A padding row (r >= rows) sees nothing.
      Reg pad = e_.setp(Cmp::Ge, Type::S32, r, rows_);
      b_.selp(Type::S32, hi_[h], imm(0), hi_[h], pad);
      b_.selp(Type::S32, lo_[h], imm(0), lo_[h], pad);
    }
    // The CTA's keys: the union of its rows' ranges (first row's lo, last
    // valid row's hi), from a 16-aligned start; tiles dealt to the warps.
    Reg last = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, m0_, imm(kRows)), rows_);
    b_.op(Op::Sub, Type::S32, last, last, imm(1));
    Reg lo_f, hi_f, lo_l, hi_l;
    range(e_.op(Op::Div, Type::S32, m0_, imm(G_)), &lo_f, &hi_f);
    range(e_.op(Op::Div, Type::S32, last, imm(G_)), &lo_l, &hi_l);
    n0_ = e_.op(Op::And, Type::B32, lo_f, imm(-kWarpKeys));
    Reg span = e_.op(Op::Sub, Type::S32, hi_l, n0_);
    b_.op(Op::Max, Type::S32, span, span, imm(0));
    if (spec_.append_kv) {
      // No key of this split for any row (an empty split: lo_f = hi_l = sk,
      // and n0 rounded down lands in the previous split): no tile. Without
      // the append such a tile only reads valid keys, all masked; with it,
      // they may be new rows another CTA is writing right now, and 0 * a
      // half-written (or stale NaN) V row is NaN.
      b_.selp(Type::S32, span, imm(0), span, e_.setp(Cmp::Le, Type::S32, hi_l, lo_f));
    }
    Reg tiles = e_.op(Op::Add, Type::S32, span, imm(kWarpKeys - 1));
    b_.op(Op::Shr, Type::S32, tiles, tiles, imm(4));
    // This warp's tiles: warp, warp + W, ...: count = ceil((tiles - warp) / W).
    my_tiles_ = e_.op(Op::Sub, Type::S32, tiles, warp_);
    b_.op(Op::Add, Type::S32, my_tiles_, my_tiles_, imm(W_ - 1));
    b_.op(Op::Max, Type::S32, my_tiles_, my_tiles_, imm(0));
    b_.op(Op::Div, Type::S32, my_tiles_, my_tiles_, imm(W_));

    // Q rows: packed row r of this CTA -> (token, head) address; rows past
    // the group are zero (their scores are masked anyway).
    if (!spec_.varlen) q_b = e_.index(q, bz_, qs[0]);
    Reg kvh_g = e_.op(Op::MulLo, Type::S32, kvh_, imm(G_));
    const int C = lay_.q.cols / 8, total = kRows * C, T = 32 * W_;
    for (int i = 0; i * T < total; ++i) {
      Reg c = e_.op(Op::Add, Type::U32, tid_, imm(i * T));
      Reg row = e_.op(Op::Div, Type::U32, c, imm(C));
      Reg col = e_.op(Op::Rem, Type::U32, c, imm(C));
      Reg r = e_.op(Op::Add, Type::S32, row, m0_);
      Reg ok = e_.setp(Cmp::Lt, Type::S32, r, rows_);
      Reg t = e_.op(Op::Div, Type::S32, r, imm(G_));
      Reg qh = e_.op(Op::Add, Type::S32, kvh_g, e_.op(Op::Rem, Type::S32, r, imm(G_)));
      if (f32_) {
        Reg sa = e_.op(Op::MadLo, Type::U32, row, imm(lay_.q.pitch), smem_);
        b_.op(Op::MadLo, Type::U32, sa, col, imm(16), sa);
        Reg in = (i + 1) * T > total ? e_.setp(Cmp::Lt, Type::U32, c, imm(total)) : Reg();
        if (in.valid()) b_.op(Op::And, Type::Pred, ok, ok, in);
        f32_q_chunk(e_.index(e_.index(e_.index(q_b, t, qs[1]), qh, qs[2]), col, 32), ok, in, sa);
        continue;
      }
      Reg ga = e_.index(e_.index(e_.index(q_b, t, qs[1]), qh, qs[2]), col, 16);
      b_.selp(Type::B64, ga, ga, q, ok);
      Reg size = e_.selp(Type::B32, imm(16), imm(0), ok);
      Reg sa = e_.op(Op::MadLo, Type::U32, row, imm(lay_.q.pitch), smem_);
      b_.op(Op::MadLo, Type::U32, sa, col, imm(16), sa);
      if (spec_.rotary) {
        // RoPE on the way in: a plain load, rotated, stored (padding rows: 0).
        rotated_q_chunk(i * T < total - T ? Reg() : e_.setp(Cmp::Lt, Type::U32, c, imm(total)), ok,
                        t, e_.index(e_.index(q_b, t, qs[1]), qh, qs[2]), col, sa);
        continue;
      }
      if ((i + 1) * T > total) b_.when(e_.setp(Cmp::Lt, Type::U32, c, imm(total)));
      b_.cp_async_cg16(at(sa), at(ga), size);
    }
    b_.cp_async_commit();
    // Q's padding columns (a CTA-wide plan only for that).
    CopyPlan(e_, tid_, T, lay_.q, smem_, qs[1]).zero_padding();

    // Each warp's copy plans, one per stage (registers shared with stage 0).
    k_plans_.reserve(S_);
    v_plans_.reserve(S_);
    for (int s = 0; s < S_; ++s) {
      SmemTile kt = lay_.k, vt = lay_.v;
      kt.offset += s * lay_.stage_bytes;
      vt.offset += s * lay_.stage_bytes;
      k_plans_.emplace_back(e_, lane_, 32, kt, wsmem_, kr_.row, s ? &k_plans_[0] : nullptr, Reg(),
                            f32_);
      if (!spec_.v_in_k)  // else V is read from the K tile
        v_plans_.emplace_back(e_, lane_, 32, vt, wsmem_, vr_.row,
                              s ? &v_plans_[0] : (vt.cols == kt.cols ? &k_plans_[0] : nullptr),
                              Reg(), f32_);
      k_plans_.back().zero_padding();
      if (!spec_.v_in_k) v_plans_.back().zero_padding();
    }
    if (spec_.append_kv) append(slo, shi);
    if (spec_.dv_split > 1)  // this CTA's slice of V's columns (after the append's whole rows)
      vr_.base = e_.index(vr_.base, dv_slice_index(e_, spec_),
                          dv_slice(spec_) * (fp8_ ? 1 : elem_bytes(spec_.dtype)));
    // fp8: the byte tiles' blocks are 16 rows x 16 bytes, which Role::A
    // addresses (non-transposed for K, .trans for V).
    // Mode (b) (spec.kv_fp8_mma): K's byte blocks are the k32 B fragments
    // of two n8 blocks (B_NK addressing), V is read .trans by key rows.
    k_lm_ = tile::ldsm_base(e_, ln_, lay_.k, fp8_ && !f8mma_ ? Role::A : Role::B_NK, wsmem_, Reg());
    v_lm_ = tile::ldsm_base(e_, ln_, lay_.v,
                            f8mma_ ? Role::B_KN_T8
                            : fp8_ ? Role::A
                                   : Role::B_KN_T,
                            wsmem_, Reg());
    if (spec_.v_in_k && spec_.dv_split > 1)  // this CTA's columns of the K tile
      b_.op(Op::MadLo, Type::U32, v_lm_, dv_slice_index(e_, spec_),
            imm((fp8_ ? 1 : 2) * dv_slice(spec_)), v_lm_);
    q_lm_ = tile::ldsm_base(e_, ln_, qa_tile(), Role::A, smem_, Reg());
  }

  // The tile the mma reads Q's A fragments from: mode (b)'s e4m3 bytes (an
  // m16 x k32 block per k step), else the 16-bit Q.
  const SmemTile &qa_tile() const { return f8mma_ ? lay_.q8 : lay_.q; }

  // fp32 Q (FA_DTYPE_FP32): one chunk of 8 values at global ga (32 bytes,
  // two ld.global.v4.f32 when ok, else zeros) rounded to bf16 into shared sa
  // (when `in`: the chunk exists).
  void f32_q_chunk(Reg ga, Reg ok, Reg in, Reg sa) {
    Reg x[8], w[4];
    for (Reg &r : x) r = e_.mov(Type::F32, fimm(0.0f));
    for (int h = 0; h < 2; ++h)
      b_.when(ok).ld_v(Space::Global, Type::F32,
                       {x[4 * h], x[4 * h + 1], x[4 * h + 2], x[4 * h + 3]}, at(ga, 16 * h));
    for (int i = 0; i < 4; ++i) {
      w[i] = b_.b32();
      b_.cvt_pack(Type::BF16, w[i], x[2 * i + 1], x[2 * i]);
    }
    if (in.valid()) b_.when(in);
    b_.st_v(Space::Shared, Type::B32, at(sa), {w[0], w[1], w[2], w[3]});
  }

  // The rotary table and this sequence's positions (spec.rotary).
  void rope_setup() {
    if (rope_.cos.valid()) return;
    rope_.cos = e_.global_param(offsetof(P, rotary_cos));
    rope_.sin = e_.global_param(offsetof(P, rotary_sin));
    rope_.rotary_dim = e_.param(Type::S32, offsetof(P, rotary_dim));
    rope_.last_row = e_.op(Op::Sub, Type::S32, e_.param(Type::S32, offsetof(P, seqlen_ro)), imm(1));
    rope_.interleaved = spec_.rotary == 2;
    rope_.half_table = spec_.rotary_half_table;
    rope_.half = half_;
    pos_ = e_.global_param(offsetof(P, rotary_positions));
    pos_b_ = e_.index(pos_, bz_, e_.stride_bytes(offsetof(P, rotary_positions_stride), 4));
  }

  // Position of new token (or query) t: rotary_positions[b][t] when given,
  // else cache_seqlens + t (a query of a non-causal, unwindowed decode:
  // cache_seqlens, FlashAttention's rule).
  Reg position(Reg t, bool query) {
    Reg p = e_.op(Op::Add, Type::S32, sk_old_, t);
    if (query) {
      Reg causal =
          e_.setp(Cmp::Ne, Type::S32, e_.param(Type::S32, offsetof(P, rotary_pos_causal)), imm(0));
      b_.selp(Type::S32, p, p, sk_old_, causal);
    }
    ptx::Label none = b_.label();
    b_.when(e_.setp(Cmp::Eq, Type::U64, pos_, imm(0))).bra(none);
    b_.ld(Space::Global, Type::S32, p, at(e_.index(pos_b_, t, 4)), true);
    b_.bind(none);
    return p;
  }

  // Q chunk col of token t (row address qrow) rotated into shared memory at
  // sa; a padding row (!ok) stores zeros; guard: the chunk exists.
  void rotated_q_chunk(Reg guard, Reg ok, Reg t, Reg qrow, Reg col, Reg sa) {
    rope_setup();
    ptx::Label skip = b_.label();
    if (guard.valid()) b_.unless(guard).bra(skip);
    std::array<Reg, 4> x;
    for (Reg &r : x) r = e_.mov(Type::B32, imm(0));
    ptx::Label store = b_.label();
    b_.unless(ok).bra(store);
    b_.ld_v(Space::Global, Type::U32, {x[0], x[1], x[2], x[3]}, at(e_.index(qrow, col, 16)), true);
    tile::rope_chunk(e_, rope_, qrow, e_.op(Op::Shl, Type::B32, col, imm(3)), position(t, true), x);
    b_.bind(store);
    b_.st_v(Space::Shared, Type::B32, at(sa), {x[0], x[1], x[2], x[3]});
    b_.bind(skip);
  }

  // KV append (DecodeParams::k_new): the new tokens whose keys fall in
  // this split, [max(lo, sk_old), hi), copied (K rotated when spec.rotary)
  // into the cache rows the loop then reads, 16 bytes per thread and step;
  // every CTA of the KV head writes the same bytes (FlashAttention's
  // kvcache kernel does the same). A CTA barrier orders the stores before
  // the loop's cp.async reads of them. An fp8 cache: each 16-byte chunk
  // (K after its RoPE, rounded to 16 bits as without fp8) is quantised
  // with the (batch, KV head)'s descale into 8 bytes (st.global.v2.b32 at
  // byte 8 col of the row).
  void append(Reg lo, Reg hi) {
    b_.comment("KV append (and RoPE of the new keys)");
    if (spec_.rotary) rope_setup();
    Reg first = e_.op(Op::Max, Type::S32, lo, sk_old_);
    Reg count = e_.op(Op::Max, Type::S32, e_.op(Op::Sub, Type::S32, hi, first), imm(0));
    for (int kv = 0; kv < 2; ++kv) {
      const size_t src = kv ? offsetof(P, v_new) : offsetof(P, k_new);
      const size_t st = kv ? offsetof(P, v_new_stride) : offsetof(P, k_new_stride);
      const KvRows &rows = kv ? vr_ : kr_;
      const int C = (kv ? spec_.head_dim_v : spec_.head_dim) / 8;
      Reg ds = fp8_ ? descale(kv ? offsetof(P, v_descale) : offsetof(P, k_descale)) : Reg();
      Reg base = e_.global_param(src);
      base = e_.index(base, bz_, e_.stride_bytes(st, 2));
      base = e_.index(base, kvh_, e_.stride_bytes(st + 16, 2));
      Reg tok = e_.stride_bytes(st + 8, 2);
      // Chunk idx = (token - first) C + column, in 64 bits (count C may
      // pass 2^31 under the documented limits).
      Reg total = e_.op(Op::MulLo, Type::S64, e_.s64(count), e_.s64(e_.mov(Type::S32, imm(C))));
      Reg idx = e_.s64(tid_);
      ptx::Label top = b_.label(), done = b_.label();
      b_.bind(top);
      b_.when(e_.setp(Cmp::Ge, Type::S64, idx, total)).bra(done);
      Reg j = e_.op(Op::Add, Type::S32, first,
                    e_.s32(e_.op(Op::Div, Type::S64, idx, e_.s64(e_.mov(Type::S32, imm(C))))));
      Reg col = e_.s32(e_.op(Op::Rem, Type::S64, idx, e_.s64(e_.mov(Type::S32, imm(C)))));
      Reg t = e_.op(Op::Sub, Type::S32, j, sk_old_);
      Reg row = e_.index(base, t, tok);
      std::array<Reg, 4> x;
      for (Reg &r : x) r = b_.b32();
      b_.ld_v(Space::Global, Type::U32, {x[0], x[1], x[2], x[3]}, at(e_.index(row, col, 16)), true);
      if (!kv && spec_.rotary)
        tile::rope_chunk(e_, rope_, row, e_.op(Op::Shl, Type::B32, col, imm(3)), position(t, false),
                         x);
      if (fp8_) {
        const std::array<Reg, 2> q8 =
            tile::quantise_fp8_chunk(e_, half_, x, ds, spec_.kv_fp8 == KvFp8::E5M2);
        b_.st_v(Space::Global, Type::B32, at(e_.index(rows.at(e_, j), col, 8)), {q8[0], q8[1]});
      } else {
        b_.st_v(Space::Global, Type::B32, at(e_.index(rows.at(e_, j), col, 16)),
                {x[0], x[1], x[2], x[3]});
      }
      b_.op(Op::Add, Type::S64, idx, idx, imm(32 * W_));
      b_.bra(top);
      b_.bind(done);
    }
    b_.bar_sync();
  }

  // The split of this CTA: %ctaid.x, over dv_split when O is in slices.
  Reg this_split() {
    Reg x = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    if (spec_.dv_split > 1) b_.op(Op::Div, Type::U32, x, x, imm(spec_.dv_split));
    return x;
  }

  // The fp32 descale of (batch, KV head) at the pointer parameter `param`
  // (DecodeParams::k_descale / v_descale), or 1 when it is 0.
  Reg descale(size_t param) {
    return load_descale(e_, param, offsetof(P, descale_stride), bz_, kvh_);
  }

  // Warp tile i of this warp starts at key n0 + (warp + i W) 16.
  Reg tile_key(Reg i) {
    Reg t = e_.op(Op::MadLo, Type::S32, i, imm(W_), warp_);
    return e_.op(Op::MadLo, Type::S32, t, imm(kWarpKeys), n0_);
  }

  // Copies K and V of the warp tile at key n into stage s; keys past the
  // sequence are zero-filled, never read.
  void copy_tile(int s, Reg n) {
    Reg left = e_.op(Op::Sub, Type::S32, sk_, n);
    for (int kv = 0; kv < (spec_.v_in_k ? 1 : 2); ++kv) {
      const CopyPlan &plan = kv ? v_plans_[s] : k_plans_[s];
      const KvRows &kr = kv ? vr_ : kr_;
      if (kr.paged() && !spec_.page_tiles) {
        Reg lastk = e_.op(Op::Sub, Type::S32, sk_, imm(1));
        plan.gather(
            [&](Reg r) {
              Reg j = e_.op(Op::Min, Type::S32, e_.op(Op::Add, Type::S32, n, r), lastk);
              return kr.at(e_, j);
            },
            left, kr.base);
        continue;
      }
      // One page holds the whole tile (page_size % 16 == 0), or no pages.
      Reg tp = kr.at(e_, n);
      if (plan.base_offset().valid()) b_.op(Op::Add, Type::S64, tp, tp, plan.base_offset());
      plan.boundary(tp, left, kr.base);
    }
  }

  void loop() {
    s_ = tile::acc_tile(b_, 2);
    o_ = tile::acc_tile(b_, nO_);
    tile::zero(b_, o_);
    // Mode (b): P in e4m3, the fp8 forward's softmax form (p up to 2^8).
    softmax_ = std::make_unique<tile::OnlineSoftmax>(
        e_, 1, spec_.softcap ? Reg() : score_scale_,
        f8mma_ ? tile::OnlineSoftmax::fp8_form() : tile::OnlineSoftmax::Form());
    for (Reg &z : zero4_) z = e_.mov(Type::F32, fimm(0.0f));
    kb_ = tile::frag4(b_);
    pa_ = tile::frag4(b_);
    if (f8mma_) {
      // A k32 step over the 16 keys of a warp tile: P's keys 16..31 (a2,
      // a3) and V's B registers of those keys are zeros, set once (never
      // garbage: 0 x NaN is NaN).
      b_.mov(Type::B32, pa_[2], imm(0));
      b_.mov(Type::B32, pa_[3], imm(0));
      for (auto &f : kf_) f[0] = b_.b32(), f[1] = e_.mov(Type::B32, imm(0));
    } else if (fp8_) {
      for (auto &f : kf_) f[0] = b_.b32(), f[1] = b_.b32();
    }

    b_.comment("prologue: the first stages - 1 tiles of this warp in flight");
    i_ = e_.mov(Type::S32, imm(0));
    for (int s = 0; s + 1 < S_; ++s) {
      ptx::Label skip = b_.label();
      Reg none = e_.setp(Cmp::Le, Type::S32, my_tiles_, imm(s));
      b_.when(none).bra(skip);
      copy_tile(s, tile_key(e_.mov(Type::S32, imm(s))));
      b_.bind(skip);
      b_.cp_async_commit();  // one group per stage, empty or not
    }
    // Q landed (every thread's copies), then each warp's A fragments.
    b_.cp_async_wait(S_ - 1);
    b_.bar_sync();
    if (f8mma_)  // Q's rows quantised to e4m3, each by its power of two
      q_unscale_ = tile::rows_to_e4m3(e_, ln_, warp_, W_, half_, lay_.q, lay_.q8, smem_);
    else if (mma_ != half_)
      q_unscale_ = tile::rows_bf16_to_f16(e_, ln_, warp_, W_, lay_.q, smem_);
    if (fp8_ && !f8mma_) {  // Q's columns in the kperm order of K's fragments (tile::b_frag_fp8_nk)
      tile::kperm_rows(e_, tid_, 32 * W_, lay_.q, smem_);
      b_.bar_sync();
    }
    if (spec_.q_in_regs) {
      for (int ks = 0; ks < kD_; ++ks) {
        qf_.push_back(tile::frag4(b_));
        tile::ldsm(b_, Role::A, qf_.back(), q_lm_, qa_tile().at(0, 16 * ks));
      }
    } else {
      qf_.push_back(tile::frag4(b_));
    }

    // The ring, unrolled by the stage count: tile i sits in stage i % S.
    ptx::Label top = b_.label();
    done_ = b_.label();
    b_.bind(top);
    for (int s = 0; s < S_; ++s) {
      Reg end = e_.setp(Cmp::Ge, Type::S32, i_, my_tiles_);
      b_.when(end).bra(done_);
      b_.comment("warp tile in stage " + std::to_string(s));
      {
        // Tile i + S - 1 into the stage tile i - 1 used (all lanes are past it).
        ptx::Label skip = b_.label();
        Reg nxt = e_.op(Op::Add, Type::S32, i_, imm(S_ - 1));
        Reg none = e_.setp(Cmp::Ge, Type::S32, nxt, my_tiles_);
        b_.when(none).bra(skip);
        copy_tile((s + S_ - 1) % S_, tile_key(nxt));
        b_.bind(skip);
        b_.cp_async_commit();
      }
      b_.cp_async_wait(S_ - 1);       // tile i: this lane's copies landed ...
      b_.bar_warp_sync(0xffffffffu);  // ... and every lane's
      body(s, tile_key(i_));
      b_.bar_warp_sync(0xffffffffu);  // every lane is done with stage s
      b_.op(Op::Add, Type::S32, i_, i_, imm(1));
    }
    b_.bra(top);
    b_.bind(done_);
  }

  // S = Q K^T, mask, online softmax, O += P V on the tile in stage s.
  void body(int s, Reg n) {
    const int so = s * static_cast<int>(lay_.stage_bytes);
    if (fp8_ && !f8mma_) {
      scores_fp8(so);
    } else {
      // 16-bit K, or mode (b): K's bytes straight into the fp8 mma (k32).
      for (int ks = 0; ks < kD_; ++ks) {
        const Frag4 *c = ks == 0 ? &zero4_ : nullptr;
        if (!spec_.q_in_regs) tile::ldsm(b_, Role::A, qf_[0], q_lm_, qa_tile().at(0, 16 * ks));
        const Frag4 &a = qf_[spec_.q_in_regs ? ks : 0];
        tile::ldsm(b_, Role::B_NK, kb_, k_lm_, so + lay_.k.at(0, 16 * ks));
        for (int j = 0; j < 2; ++j) {
          if (f8mma_)
            tile::mma_fp8(b_, ptx::Fp8::E4M3, kv8_, s_, j, a, &kb_[2 * j], c);
          else
            tile::mma(b_, mma_, s_, j, a, &kb_[2 * j], c);
        }
      }
    }
    if (mma_ != half_ || f8mma_)  // scores of the row-scaled Q back to Q's
      for (Frag4 &f : s_.f)
        for (int x = 0; x < 4; ++x) b_.op(Op::Mul, Type::F32, f[x], f[x], q_unscale_[x / 2]);
    if (spec_.softcap)
      for (const Frag4 &f : s_.f)
        for (Reg x : f) scale_score(e_, x, score_scale_, cap_);
    if (spec_.alibi) {
      // ALiBi (tile::alibi_row_half): row half h's key n + 8j + 2q + x is
      // at distance dist_h - n - 8j - x from its diagonal.
      Reg nf = b_.f32(), d = b_.f32(), t = b_.f32();
      b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, nf, n);
      for (int h = 0; h < 2; ++h) {
        b_.op(Op::Sub, Type::F32, d, alibi_dist_[h], nf);
        tile::alibi_row_half(b_, s_, h, d, alibi_coef_[h], t);
      }
    }
    // Keys outside a row's [lo, hi) become -inf: element (j, x) of row half
    // h holds key n + 8j + 2q + x.
    Reg kq = e_.op(Op::MadLo, Type::S32, ln_.q, imm(2), n);
    Reg p = b_.pred(), t = b_.pred();
    for (int h = 0; h < 2; ++h) {
      Reg lo = e_.op(Op::Sub, Type::S32, lo_[h], kq), hi = e_.op(Op::Sub, Type::S32, hi_[h], kq);
      tile::mask_row_half(b_, s_, h, lo, hi, p, t);
    }
    if (spec_.tree_mask) tree_mask(n, kq);
    softmax_->step({s_}, {o_});
    if (f8mma_) {
      pv_f8mma(so);
      return;
    }
    tile::pack_a(b_, mma_, s_, 0, pa_);
    if (fp8_) {
      pv_fp8(so);
      return;
    }
    for (int jp = 0; jp < nO_ / 2; ++jp) {
      tile::ldsm(b_, Role::B_KN_T, kb_, v_lm_, so + lay_.v.at(0, 16 * jp));
      tile::mma(b_, mma_, o_, 2 * jp, pa_, &kb_[0]);
      tile::mma(b_, mma_, o_, 2 * jp + 1, pa_, &kb_[2]);
    }
  }

  // fp8 S = Q K^T (mode (a)): one byte ldmatrix .x4 per 32 columns of d
  // (keys 0..7 and 8..15 of two 16-byte chunks; .x2 for a last lone
  // chunk), each register converted into one n8 block's B fragment
  // (tile::b_frag_fp8_nk) against Q's fragment of that chunk (Q's columns
  // in the kperm order since tile::kperm_rows).
  void scores_fp8(int so) {
    for (int kp = 0; 2 * kp < kD_; ++kp) {
      const int nk = std::min(2, kD_ - 2 * kp);  // k chunks of this load
      tile::ldsm(b_, Role::A, kb_, k_lm_, so + lay_.k.at(0, 16 * kp), 2 * nk);
      for (int c = 0; c < nk; ++c) {
        const int ks = 2 * kp + c;
        const Frag4 *z = ks == 0 ? &zero4_ : nullptr;
        if (!spec_.q_in_regs) tile::ldsm(b_, Role::A, qf_[0], q_lm_, lay_.q.at(0, 16 * ks));
        const Frag4 &a = qf_[spec_.q_in_regs ? ks : 0];
        for (int j = 0; j < 2; ++j) {
          tile::b_frag_fp8_nk(b_, e5m2_, kb_[2 * c + j], kf_[j]);
          tile::mma(b_, mma_, s_, j, a, kf_[j], z);
        }
      }
    }
  }

  // fp8 O += P V (mode (a)): one byte ldmatrix .trans .x4 per 32 columns
  // of dv (.x2 for a last lone 16), each 16-byte chunk's two registers
  // split into the B fragments of its even and odd columns
  // (tile::b_frags_fp8_kn): O's fragments 2c, 2c + 1 (AccCols::EvenOdd).
  void pv_fp8(int so) {
    const int chunks = nO_ / 2;
    for (int cp = 0; 2 * cp < chunks; ++cp) {
      const int nc = std::min(2, chunks - 2 * cp);
      tile::ldsm(b_, Role::B_KN_T, kb_, v_lm_, so + lay_.v.at(0, 16 * cp), 2 * nc);
      for (int c = 0; c < nc; ++c) {
        tile::b_frags_fp8_kn(b_, e5m2_, kb_[2 * c], kb_[2 * c + 1], kf_[0], kf_[1]);
        tile::mma(b_, mma_, o_, 2 * (2 * cp + c), pa_, kf_[0]);
        tile::mma(b_, mma_, o_, 2 * (2 * cp + c) + 1, pa_, kf_[1]);
      }
    }
  }

  // fp8 O += P V (mode (b)): P rounded to e4m3 in tile::pack_a_fp8's key
  // order (keys 0..15 of a k32 step; a2, a3 stay 0); per 16-byte column
  // chunk c of V one byte ldmatrix .trans .x2 of the tile's 16 key rows
  // (Role::B_KN_T8) and tile::v_frags_fp8 give the B fragments of its even
  // and odd columns (keys 16..31: the zero registers), O's fragments 2c and
  // 2c + 1 (AccCols::EvenOdd) on the fp8 mma.
  void pv_f8mma(int so) {
    tile::pack_a_fp8(b_, s_, 0, pa_, 2);
    Reg ev[2] = {kf_[0][0], kf_[0][1]}, od[2] = {kf_[1][0], kf_[1][1]};
    for (int c = 0; c < nO_ / 2; ++c) {
      tile::ldsm(b_, Role::B_KN_T8, kb_, v_lm_, so + lay_.v.at(0, 8 * c), 2);
      tile::v_frags_fp8(b_, kb_, ev, od, 1);
      tile::mma_fp8(b_, ptx::Fp8::E4M3, kv8_, o_, 2 * c, pa_, ev);
      tile::mma_fp8(b_, ptx::Fp8::E4M3, kv8_, o_, 2 * c + 1, pa_, od);
    }
  }

  // Speculative decoding (DecodeParams::tree_mask): element (j, x) of row
  // half h holds key kq + 8j + x, new token jn = key - new0; it stays only
  // if jn is outside [0, seqlen_q) (the cached prefix, or past the
  // sequence: masked by its range already) or bit jn of the row is set:
  // bit jn % 32 of the row's 32-bit word jn / 32 (little-endian words, so
  // bit jn % 8 of byte jn / 8). Tiles wholly before the new tokens skip it
  // (n is the same in every lane of the warp).
  void tree_mask(Reg n, Reg kq) {
    b_.comment("tree mask among the new tokens");
    ptx::Label skip = b_.label();
    Reg end = e_.op(Op::Add, Type::S32, n, imm(kWarpKeys));
    b_.when(e_.setp(Cmp::Le, Type::S32, end, new0_)).bra(skip, true);
    Reg jn0 = e_.op(Op::Sub, Type::S32, kq, new0_);
    Reg in = b_.pred(), keep = b_.pred();
    Reg w = b_.b32(), jn = b_.b32(), x = b_.b32();
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < s_.n(); ++j)
        for (int c = 0; c < 2; ++c) {
          b_.op(Op::Add, Type::S32, jn, jn0, imm(8 * j + c));
          b_.setp(Cmp::Lt, Type::U32, in, jn, sq_);  // 0 <= jn < seqlen_q
          b_.op(Op::Shr, Type::S32, x, jn, imm(5));
          Reg wa = e_.index(mrow_[h], x, 4);
          b_.mov(Type::B32, w, imm(-1));
          b_.when(in).ld(Space::Global, Type::U32, w, at(wa), true);
          b_.op(Op::And, Type::B32, x, jn, imm(31));
          b_.op(Op::Shr, Type::U32, w, w, x);
          b_.op(Op::And, Type::B32, w, w, imm(1));
          b_.setp(Cmp::Ne, Type::U32, keep, w, imm(0));
          Reg v = s_.f[j][2 * h + c];
          b_.selp(Type::F32, v, v, fimm(kNegInf), keep);
        }
    b_.bind(skip);
  }

  // Each warp's state (O normalised, LSE) to shared memory; then per row
  // and column: M = max_w LSE_w, w = e^(LSE_w - M), O = sum w O_w / sum w,
  // LSE = M + ln sum w (every LSE_w = -inf: O = 0, LSE = -inf); stored as
  // this split's partial state.
  void merge_and_store() {
    b_.comment("merge the warps' states; store the split's partial state");
    b_.cp_async_wait(0);
    b_.bar_sync();  // every warp is out of its ring: the merge area reuses it
    std::vector<Reg> lse;
    softmax_->finish({o_}, &lse);
    const uint32_t mo = lay_.merge_o, ml = lay_.merge_lse;
    // Warp w: O at w mo, LSE at W mo + w ml.
    Reg ob = e_.op(Op::MadLo, Type::U32, warp_, imm(mo), smem_);
    Reg lb = e_.op(Op::MadLo, Type::U32, warp_, imm(ml), smem_);
    b_.op(Op::Add, Type::U32, lb, lb, imm(W_ * mo));
    const int dv = dv_slice(spec_);  // this CTA's columns of O
    for (int h = 0; h < 2; ++h) {
      Reg row = e_.op(Op::Add, Type::U32, ln_.g, imm(8 * h));
      Reg ra = e_.op(Op::MadLo, Type::U32, row, imm(lay_.merge_pitch), ob);
      tile::st_acc_row(b_, ln_, o_, ocols_, h, ra, dv);
      Reg q0 = e_.setp(Cmp::Eq, Type::U32, ln_.q, imm(0));
      Reg la = e_.op(Op::MadLo, Type::U32, row, imm(4), lb);  // before when(): unpredicated
      b_.when(q0).st(Space::Shared, Type::F32, at(la), lse[h]);
    }
    b_.bar_sync();

    // Rows: r = m0 + row -> token t = r / G, head kvh G + r % G; partial
    // rows ((split*batch + b)*sq + t)*hq + qh (O) and
    // ((split*batch + b)*hq + qh)*sq + t (LSE), in 64 bits.
    Reg split = this_split();
    Reg batch = e_.param(Type::S32, offsetof(P, batch));
    Reg hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    Reg sb = e_.wide_mad(split, batch, e_.s64(bz_));
    Reg opart = e_.global_param(offsetof(P, o_partial));
    Reg lpart = e_.global_param(offsetof(P, lse_partial));
    Reg kvh_g = e_.op(Op::MulLo, Type::S32, kvh_, imm(G_));
    const int C = dv / 4, total = kRows * C, T = 32 * W_;
    Reg vdesc = fp8_ ? descale(offsetof(P, v_descale)) : Reg();
    Reg m = b_.f32(), sum = b_.f32(), wgt = b_.f32(), x = b_.f32();
    for (int i = 0; i * T < total; ++i) {
      Reg c = e_.op(Op::Add, Type::U32, tid_, imm(i * T));
      Reg row = e_.op(Op::Div, Type::U32, c, imm(C));
      Reg col = e_.op(Op::Rem, Type::U32, c, imm(C));
      Reg r = e_.op(Op::Add, Type::S32, row, m0_);
      Reg ok = e_.setp(Cmp::Lt, Type::S32, r, rows_);
      if ((i + 1) * T > total)
        b_.op(Op::And, Type::Pred, ok, ok, e_.setp(Cmp::Lt, Type::U32, c, imm(total)));
      ptx::Label skip = b_.label();
      b_.unless(ok).bra(skip);
      Reg la = e_.op(Op::MadLo, Type::U32, row, imm(4), smem_);
      b_.op(Op::Add, Type::U32, la, la, imm(W_ * mo));
      b_.mov(Type::F32, m, fimm(kNegInf));
      std::vector<Reg> lw(W_);
      for (int w = 0; w < W_; ++w) {
        lw[w] = b_.f32();
        b_.ld(Space::Shared, Type::F32, lw[w], at(la, w * static_cast<int>(ml)));
        b_.op(Op::Max, Type::F32, m, m, lw[w]);
      }
      const tile::MergeOffset moff = tile::merge_offset(e_, m);
      Reg empty = moff.none, off = moff.off;
      Reg acc[4];
      for (Reg &a : acc) a = e_.mov(Type::F32, fimm(0.0f));
      b_.mov(Type::F32, sum, fimm(0.0f));
      Reg oa = e_.op(Op::MadLo, Type::U32, row, imm(lay_.merge_pitch), smem_);
      b_.op(Op::MadLo, Type::U32, oa, col, imm(16), oa);
      Reg ov[4] = {b_.f32(), b_.f32(), b_.f32(), b_.f32()};
      for (int w = 0; w < W_; ++w) {
        // (LSE_w - M) log2 e, subtracted first: LSE_w log2 e - M log2 e
        // cancels when the LSE is large (tile::OnlineSoftmax).
        tile::merge_weight(b_, wgt, lw[w], off, false);  // 0 for LSE_w = -inf
        b_.op(Op::Add, Type::F32, sum, sum, wgt);
        b_.ld_v(Space::Shared, Type::F32, {ov[0], ov[1], ov[2], ov[3]},
                at(oa, w * static_cast<int>(mo)));
        for (int z = 0; z < 4; ++z) b_.op(Op::Fma, Type::F32, acc[z], ov[z], wgt, acc[z]);
      }
      Reg inv = e_.op(Op::RcpRn, Type::F32, sum);
      // V's descale, before the select: an empty row stays 0 whatever it is.
      if (fp8_) b_.op(Op::Mul, Type::F32, inv, inv, vdesc);
      b_.selp(Type::F32, inv, fimm(0.0f), inv, empty);
      for (Reg &a : acc) b_.op(Op::Mul, Type::F32, a, a, inv);
      Reg t = e_.op(Op::Div, Type::S32, r, imm(G_));
      Reg qh = e_.op(Op::Add, Type::S32, kvh_g, e_.op(Op::Rem, Type::S32, r, imm(G_)));
      Reg orow =
          e_.op(Op::Add, Type::S64, e_.op(Op::MulLo, Type::S64, sb, e_.s64(sq_out_)), e_.s64(t));
      b_.op(Op::MadLo, Type::S64, orow, orow, e_.s64(hq), e_.s64(qh));
      Reg ga = e_.index64(opart, orow, spec_.head_dim_v * 4);
      if (spec_.dv_split > 1) ga = e_.index(ga, dv_slice_index(e_, spec_), dv * 4);
      ga = e_.index(ga, col, 16);
      b_.st_v(Space::Global, Type::F32, at(ga), {acc[0], acc[1], acc[2], acc[3]});
      // LSE = M + ln(sum), by the thread of column 0.
      Reg c0 = e_.setp(Cmp::Eq, Type::U32, col, imm(0));
      if (spec_.dv_split > 1)  // one writer: slice 0
        b_.op(Op::And, Type::Pred, c0, c0,
              e_.setp(Cmp::Eq, Type::U32, dv_slice_index(e_, spec_), imm(0)));
      b_.unless(c0).bra(skip);
      b_.op(Op::Lg2, Type::F32, x, sum);
      b_.op(Op::Fma, Type::F32, x, x, fimm(kLn2), m);
      b_.selp(Type::F32, x, fimm(kNegInf), x, empty);
      Reg lrow = e_.op(Op::Add, Type::S64, e_.op(Op::MulLo, Type::S64, sb, e_.s64(hq)), e_.s64(qh));
      b_.op(Op::MadLo, Type::S64, lrow, lrow, e_.s64(sq_out_), e_.s64(t));
      b_.st(Space::Global, Type::F32, at(e_.index64(lpart, lrow, 4)), x);
      b_.bind(skip);
    }
  }

  // spec.fused_combine: the combine in the last CTA of the (batch, KV head,
  // m-block) row. The CTA's partial state is stored (the barrier orders every
  // thread's stores before thread 0's atom.add.acq_rel.gpu on the row's
  // counter: release); the CTA whose add saw nctaid.x - 1 (every other split
  // and O slice of the row has released its state; the acquire, then the
  // barrier, order the loads below after them) sets the counter back to 0
  // (no CTA of this launch touches it again) and combines the splits of its
  // rows, warp w taking rows w, w + W, ...: tile::combine_row, the reduce
  // kernel's instructions per row, over the workspace's contiguous partial
  // states (split stride batch x seqlen_q x num_heads_q rows).
  void fused_combine() {
    b_.comment("fused combine: the row's last CTA merges the splits");
    b_.bar_sync();  // the partial state is stored, the merge area read
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    Reg ny = e_.mov(Type::U32, ptx::sreg(ptx::Special::NctaidY));
    Reg y = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
    Reg ctr = e_.index64(e_.global_param(offsetof(P, split_counters)),
                         e_.wide_mad(bz_, ny, e_.s64(y)), 4);
    Reg old = e_.mov(Type::U32, imm(0));
    b_.when(t0).atom_add(true, Type::U32, old, at(ctr), imm(1));
    b_.when(t0).st(Space::Shared, Type::U32, at(smem_), old);
    b_.bar_sync();
    b_.ld(Space::Shared, Type::U32, old, at(smem_));
    Reg last = e_.op(Op::Sub, Type::U32, e_.mov(Type::U32, ptx::sreg(ptx::Special::NctaidX)),
                     imm(1));
    b_.unless(e_.setp(Cmp::Eq, Type::U32, old, last)).exit();  // the CTA's value: uniform
    b_.when(t0).st(Space::Global, Type::U32, at(ctr), e_.mov(Type::U32, imm(0)));

    Reg batch = e_.param(Type::S32, offsetof(P, batch));
    Reg hq = e_.param(Type::S32, offsetof(P, num_heads_q));
    Reg opart = e_.global_param(offsetof(P, o_partial));
    Reg lpart = e_.global_param(offsetof(P, lse_partial));
    Reg o = e_.global_param(offsetof(P, o));
    const int eb = elem_bytes(spec_.dtype);
    Reg os[3];
    for (int i = 0; i < 3; ++i) os[i] = e_.stride_bytes(offsetof(P, o_stride) + 8 * i, eb);
    Reg lse_raw = e_.param(Type::U64, offsetof(P, lse));
    Reg has_lse = e_.setp(Cmp::Ne, Type::U64, lse_raw, imm(0));
    Reg lse_out = b_.b64();
    b_.cvta_to_global(lse_out, lse_raw);
    Reg sinks = spec_.sinks ? e_.global_param(offsetof(P, sinks)) : Reg();
    // Bytes from one split's state to the next's: rows = batch x sq x hq.
    Reg rows = e_.op(Op::MulLo, Type::S64, e_.wide_mul(batch, sq_out_), e_.s64(hq));
    Reg lstep = e_.op(Op::MulLo, Type::S64, rows, imm(4));
    Reg ostep = e_.op(Op::MulLo, Type::S64, rows, imm(spec_.head_dim_v * 4));
    Reg kvh_g = e_.op(Op::MulLo, Type::S32, kvh_, imm(G_));
    Reg rr = e_.mov(Type::S32, warp_);
    ptx::Label top = b_.label(), next = b_.label(), end = b_.label();
    b_.bind(top);
    Reg r = e_.op(Op::Add, Type::S32, m0_, rr);
    b_.when(e_.setp(Cmp::Ge, Type::S32, r, rows_)).bra(end, true);  // the warp's row
    Reg t = e_.op(Op::Div, Type::S32, r, imm(G_));
    Reg qh = e_.op(Op::Add, Type::S32, kvh_g, e_.op(Op::Rem, Type::S32, r, imm(G_)));
    // Split 0's LSE ((b hq + qh) sq + t) and O ((b sq + t) hq + qh).
    Reg lrow = e_.op(Op::MadLo, Type::S64, e_.wide_mad(bz_, hq, e_.s64(qh)), e_.s64(sq_out_),
                     e_.s64(t));
    Reg orow = e_.op(Op::MadLo, Type::S64, e_.wide_mad(bz_, sq_out_, e_.s64(t)), e_.s64(hq),
                     e_.s64(qh));
    tile::CombineRow c;
    c.lane = lane_;
    c.num_states = e_.param(Type::S32, offsetof(P, num_splits));
    c.l0 = e_.index64(lpart, lrow, 4);
    c.o0 = e_.index(e_.index64(opart, orow, spec_.head_dim_v * 4), lane_, 4);
    c.lstep = lstep;
    c.ostep = ostep;
    c.head_dim_v = spec_.head_dim_v;
    c.dtype = spec_.dtype;
    if (spec_.sinks) c.sink_at = [&] { return e_.index(sinks, qh, 4); };
    c.o_at = [&] {
      return e_.index(e_.index(e_.index(e_.index(o, bz_, os[0]), t, os[1]), qh, os[2]), lane_, eb);
    };
    c.lse_at = [&] { return e_.index64(lse_out, lrow, 4); };
    c.has_lse = has_lse;
    tile::combine_row(e_, c, &next);
    b_.bind(next);
    b_.op(Op::Add, Type::S32, rr, rr, imm(W_));
    b_.when(e_.setp(Cmp::Lt, Type::S32, rr, imm(kRows))).bra(top, true);
    b_.bind(end);
  }

  const KernelSpec &spec_;
  Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_, mma_;  // the dtype's 16-bit type; the mma's (f16 for fp8 K/V with bf16 Q)
  bool fp8_ = false;
  bool f32_ = false;    // fp32 Q/K/V: rounded to bf16 on load (the partial states are fp32 anyway)
  bool e5m2_ = false;   // fp8: the cache is e5m2 (else e4m3)
  bool f8mma_ = false;  // spec.kv_fp8_mma: mode (b), Q and P in e4m3 on the fp8 mma
  ptx::Fp8 kv8_;        // the cache's fp8 type (mode (b)'s mma)
  tile::AccCols ocols_ = tile::AccCols::Natural;  // O's column order (fp8: EvenOdd)
  int W_ = 0, S_ = 0, G_ = 1, kD_ = 0, nO_ = 0;
  tile::Lanes ln_;
  ptx::Symbol smem_sym_;
  Reg tid_, lane_, warp_, smem_, wsmem_, k_lm_, v_lm_, q_lm_;
  Reg score_scale_;
  Softcap cap_;
  // sq_: this sequence's queries (varlen: from cu_seqlens_q), sq_out_ the
  // partial states' rows per sequence (the launch's seqlen_q).
  Reg bz_, sq_, sq_out_, sk_, rows_, kvh_, m0_, n0_, my_tiles_, i_;
  Reg lo_[2], hi_[2];
  Reg new0_, mrow_[2];  // spec.tree_mask: first new token's key, mask rows
  Reg sn_, sk_old_;     // spec.append_kv: seqlen_new, the length before the append
  tile::RopeTable rope_;
  Reg pos_, pos_b_;  // spec.rotary: rotary_positions, its row of this sequence
  KvRows kr_, vr_;
  std::vector<CopyPlan> k_plans_, v_plans_;
  AccTile s_, o_;
  std::vector<Frag4> qf_;
  // mma_ != half_ or mode (b): rows g, g + 8's 2^-k (rows_bf16_to_f16, rows_to_e4m3)
  std::array<Reg, 2> q_unscale_;
  Frag4 kb_, pa_, zero4_;
  // fp8: converted B fragments (K: two n8 blocks; V: even, odd); mode (b):
  // V's even, odd k32 B fragments ([1], keys 16..31: 0)
  Reg kf_[2][2];
  std::unique_ptr<tile::OnlineSoftmax> softmax_;
  Reg alibi_coef_[2], alibi_dist_[2];  // spec.alibi: per row half (tile::alibi_coef)
  ptx::Label done_;
};

}  // namespace

uint32_t decode_tc_smem(const KernelSpec &spec) { return layout(spec).total; }

std::string generate_decode_tc(const KernelSpec &spec) { return DecodeTcGen(spec).run(); }

}  // namespace kgen
}  // namespace fa
