// The backward's per-row kernels (kinds BackwardPre and BackwardPost,
// fa_backward), FlashAttention-2's backward (Dao, 2023, Algorithm 2) before
// and after its main loop. One thread per query row i of (batch b, query
// head h): grid (ceil(seqlen_q / (32 num_warps)), heads_q, batch)
// (backward_geometry), and workspace row r = (b heads_q + h) seqlen_q + i
// (BackwardParams; varlen sequences padded to seqlen_q, the launch's
// maximum, so rows = batch heads_q seqlen_q).
//
// BackwardPre: D_i = rowsum(dO_i o O_i), summed in f32 over head_dim_v
// (16-byte loads), to row_stats[r]; LSE_i log2(e) to row_stats[rows + r],
// +inf where LSE_i = -inf (a row that sees no key: every exp2(s - LSE) of
// it is then 0); dq_accum[r] (head_dim floats) zeroed. A row past its
// sequence's length (varlen) gets D = 0, +inf and zeros, and reads nothing.
//
// BackwardPost: dQ_i = dq_accum[r] softmax_scale rounded to the dtype
// (cvt.rn), stored like Q (dq_stride; varlen: packed row cu_seqlens_q[b] +
// i), for the rows of each sequence only. With spec.sinks, CTA (0, h, 0)
// first writes dsinks[h] = -sum over b, i of exp(sinks[h] - LSE_i) D_i
// (flashattn.h, fa_backward_args) from row_stats, in a fixed order: thread t
// sums rows i = t, t + 32 num_warps, ... of b = 0, 1, ... in turn, then the
// warps' sums (shfl butterflies) are added in warp order. A term with D_i =
// 0 is 0 (a padded row, a row with no key, a head whose sink is +inf: its
// exp is 0 or NaN there).
#include "kernels/backward_scores.h"
#include "kernels/codegen.h"

namespace fa {
namespace kgen {
namespace {

using P = BackwardParams;
static_assert(offsetof(BackwardParams, f) == 0, "ForwardParams' offsets are the block's");

constexpr float kPosInf = __builtin_huge_valf();

// Where this thread's row lies (s32 unless noted).
struct RowFrame {
  Reg tid;       // u32 %tid.x
  Reg i, h, bz;  // the row within its sequence, the query head, the batch entry
  Reg sq;        // the launch's seqlen_q: the workspace's rows per sequence
  Reg len;       // the sequence's rows: sq, or from cu_seqlens_q (clamped to sq)
  Reg q0;        // varlen: the sequence's first packed row (cu_seqlens_q[b])
  Reg r, rows;   // s64: the workspace row, batch heads_q seqlen_q
};

RowFrame row_frame(Emitter &e, const KernelSpec &spec) {
  ptx::Builder &b = e.b;
  RowFrame f;
  f.tid = e.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
  Reg cx = e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
  // i < seqlen_q + 32 num_warps: no u32 overflow.
  f.i = e.op(Op::MadLo, Type::U32, cx, imm(32 * spec.num_warps), f.tid);
  f.h = e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
  f.bz = e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
  f.sq = e.param(Type::S32, offsetof(ForwardParams, seqlen_q));
  Reg batch = e.param(Type::S32, offsetof(ForwardParams, batch));
  Reg hq = e.param(Type::S32, offsetof(ForwardParams, num_heads_q));
  Reg sq64 = e.s64(f.sq);
  f.r = e.op(Op::MadLo, Type::S64, e.wide_mad(f.bz, hq, e.s64(f.h)), sq64, e.s64(f.i));
  f.rows = e.op(Op::MulLo, Type::S64, e.wide_mul(batch, hq), sq64);
  if (spec.varlen) {
    Reg aq = e.index(e.global_param(offsetof(ForwardParams, cu_seqlens_q)), f.bz, 4);
    f.q0 = b.b32();
    Reg q1 = b.b32();
    b.ld(Space::Global, Type::S32, f.q0, at(aq), true);
    b.ld(Space::Global, Type::S32, q1, at(aq, 4), true);
    f.len = seq_len(e, f.q0, q1, f.sq);
  } else {
    f.len = f.sq;
  }
  return f;
}

// Row (b, i, h)'s first element in a [batch, seq, head, dim] tensor of
// `eb`-byte elements whose strides (elements) are the three int64 at
// `stride_param` (varlen: packed row q0 + i, stride[0] unused).
Reg row_address(Emitter &e, const KernelSpec &spec, const RowFrame &f, size_t ptr_param,
                size_t stride_param, int eb) {
  Reg base = e.global_param(ptr_param);
  Reg s[3];
  for (int k = 0; k < 3; ++k) s[k] = e.stride_bytes(stride_param + 8 * k, eb);
  Reg row = spec.varlen ? e.index(base, e.op(Op::Add, Type::S32, f.q0, f.i), s[1])
                        : e.index(e.index(base, f.bz, s[0]), f.i, s[1]);
  return e.index(row, f.h, s[2]);
}

// D_i = sum_c dO[c] O[c] (fma in column order) over head_dim_v columns,
// eight at a time (two 16-byte loads).
Reg dot_do_o(Emitter &e, const KernelSpec &spec, const RowFrame &f) {
  ptx::Builder &b = e.b;
  const int eb = elem_bytes(spec.dtype);
  Reg dout = row_address(e, spec, f, offsetof(P, dout), offsetof(P, dout_stride), eb);
  Reg o =
      row_address(e, spec, f, offsetof(ForwardParams, o), offsetof(ForwardParams, o_stride), eb);
  Reg d = e.mov(Type::F32, fimm(0.0f));
  Reg x[4], y[4];
  for (int k = 0; k < 4; ++k) x[k] = b.b32(), y[k] = b.b32();
  Reg xl = b.f32(), xh = b.f32(), yl = b.f32(), yh = b.f32();
  for (int c = 0; c < spec.head_dim_v; c += 8) {
    b.ld_v(Space::Global, Type::U32, {x[0], x[1], x[2], x[3]}, at(dout, 2 * c), true);
    b.ld_v(Space::Global, Type::U32, {y[0], y[1], y[2], y[3]}, at(o, 2 * c), true);
    for (int k = 0; k < 4; ++k) {
      unpack_half2(e, spec.dtype, x[k], xl, xh);
      unpack_half2(e, spec.dtype, y[k], yl, yh);
      b.op(Op::Fma, Type::F32, d, xl, yl, d);
      b.op(Op::Fma, Type::F32, d, xh, yh, d);
    }
  }
  return d;
}

// The forward's LSE of this row times log2(e), +inf for -inf. LSE is
// [batch, heads_q, seqlen_q] (element r), varlen [heads_q, total_q]
// (element h total_q + q0 + i, total_q = cu_seqlens_q[batch]).
Reg lse_log2(Emitter &e, const KernelSpec &spec, const RowFrame &f) {
  ptx::Builder &b = e.b;
  Reg lse = e.global_param(offsetof(ForwardParams, lse));
  Reg idx = f.r;
  if (spec.varlen) {
    Reg cuq = e.global_param(offsetof(ForwardParams, cu_seqlens_q));
    Reg total = b.b32();
    b.ld(Space::Global, Type::S32, total,
         at(e.index(cuq, e.param(Type::S32, offsetof(ForwardParams, batch)), 4)), true);
    idx = e.wide_mad(f.h, total, e.op(Op::Add, Type::S64, e.s64(f.q0), e.s64(f.i)));
  }
  Reg l = b.f32();
  b.ld(Space::Global, Type::F32, l, at(e.index64(lse, idx, 4)), true);
  Reg none = e.setp(Cmp::Eq, Type::F32, l, fimm(kNegInf));
  Reg l2 = e.op(Op::Mul, Type::F32, l, fimm(kLog2e));
  return e.selp(Type::F32, fimm(kPosInf), l2, none);
}

void pre_body(Emitter &e, const KernelSpec &spec) {
  ptx::Builder &b = e.b;
  RowFrame f = row_frame(e, spec);
  b.when(e.setp(Cmp::Ge, Type::S32, f.i, f.sq)).exit();
  Reg d = e.mov(Type::F32, fimm(0.0f));
  Reg l2 = e.mov(Type::F32, fimm(kPosInf));
  ptx::Label store = b.label();
  if (spec.varlen) {
    b.comment("varlen: a row past its sequence reads nothing (D = 0, +inf)");
    b.when(e.setp(Cmp::Ge, Type::S32, f.i, f.len)).bra(store);
  }
  b.comment("D = rowsum(dO o O); LSE in log2 units");
  b.mov(Type::F32, d, dot_do_o(e, spec, f));
  b.mov(Type::F32, l2, lse_log2(e, spec, f));
  b.bind(store);
  Reg stats = e.global_param(offsetof(P, row_stats));
  b.st(Space::Global, Type::F32, at(e.index64(stats, f.r, 4)), d);
  b.st(Space::Global, Type::F32, at(e.index64(stats, e.op(Op::Add, Type::S64, f.rows, f.r), 4)),
       l2);
  {
    // Deterministic: every kSemRows-th row zeroes its dQ semaphore
    // (BackwardParams::dq_sem; the main kernel's blocks start on such rows).
    ptx::Label skip = b.label();
    Reg det = e.param(Type::S32, offsetof(P, deterministic));
    Reg first = e.setp(Cmp::Eq, Type::U32, e.op(Op::Rem, Type::U32, f.i, imm(kSemRows)), imm(0));
    b.unless(e.op(Op::And, Type::Pred, first, e.setp(Cmp::Ne, Type::S32, det, imm(0)))).bra(skip);
    Reg nqb =
        e.op(Op::Div, Type::S32, e.op(Op::Add, Type::S32, f.sq, imm(kSemRows - 1)), imm(kSemRows));
    Reg idx =
        e.op(Op::MulLo, Type::S64,
             e.wide_mad(f.bz, e.param(Type::S32, offsetof(ForwardParams, num_heads_q)), e.s64(f.h)),
             e.s64(nqb));
    b.op(Op::Add, Type::S64, idx, idx, e.s64(e.op(Op::Div, Type::U32, f.i, imm(kSemRows))));
    Reg sem = e.index64(e.global_param(offsetof(P, dq_sem)), idx, 4 * kSemSlices);
    Reg zero = e.mov(Type::U32, imm(0));
    for (int s = 0; s < kSemSlices; ++s) b.st(Space::Global, Type::U32, at(sem, 4 * s), zero);
    b.bind(skip);
  }
  b.comment("dq_accum[r] = 0");
  Reg acc = e.index64(e.global_param(offsetof(P, dq_accum)), f.r, spec.head_dim * 4);
  Reg z = e.mov(Type::F32, fimm(0.0f));
  for (int c = 0; c < spec.head_dim; c += 4)
    b.st_v(Space::Global, Type::F32, at(acc, 4 * c), {z, z, z, z});
  b.exit();
}

// dsinks[h] = -sum over the head's rows of exp2(sinks[h] log2(e) - L_r) D_r
// (row_stats), by the whole CTA in a fixed order (the file's comment).
void dsinks_sum(Emitter &e, const KernelSpec &spec, const RowFrame &f) {
  ptx::Builder &b = e.b;
  const int threads = 32 * spec.num_warps;
  ptx::Symbol red = b.shared("dsinks_red", 4, 4 * spec.num_warps);
  Reg stats = e.global_param(offsetof(P, row_stats));
  Reg lse_off = e.op(Op::MulLo, Type::S64, f.rows, imm(4));  // bytes from D_r to L_r
  Reg batch = e.param(Type::S32, offsetof(ForwardParams, batch));
  Reg hq = e.param(Type::S32, offsetof(ForwardParams, num_heads_q));
  Reg sink = sink_log2(e, f.h);
  Reg acc = e.mov(Type::F32, fimm(0.0f));
  Reg bi = e.mov(Type::S32, imm(0));
  Reg dr = b.f32(), lr = b.f32(), t = b.f32();
  ptx::Label next_b = b.label(), next_i = b.label(), done_i = b.label(), done = b.label();
  b.bind(next_b);
  b.when(e.setp(Cmp::Ge, Type::S32, bi, batch)).bra(done);
  // Row 0 of (bi, h): (bi heads_q + h) seqlen_q.
  Reg row0 = e.op(Op::MulLo, Type::S64, e.wide_mad(bi, hq, e.s64(f.h)), e.s64(f.sq));
  Reg a = e.index64(stats, e.op(Op::Add, Type::S64, row0, e.s64(f.tid)), 4);
  Reg i = e.mov(Type::S32, f.tid);
  b.bind(next_i);
  b.when(e.setp(Cmp::Ge, Type::S32, i, f.sq)).bra(done_i);
  b.ld(Space::Global, Type::F32, dr, at(a));
  b.ld(Space::Global, Type::F32, lr, at(e.op(Op::Add, Type::S64, a, lse_off)));
  b.op(Op::Sub, Type::F32, t, sink, lr);
  b.op(Op::Ex2, Type::F32, t, t);
  b.op(Op::Mul, Type::F32, t, t, dr);
  Reg zero_d = e.setp(Cmp::Eq, Type::F32, dr, fimm(0.0f));
  b.selp(Type::F32, t, fimm(0.0f), t, zero_d);
  b.op(Op::Add, Type::F32, acc, acc, t);
  b.op(Op::Add, Type::S32, i, i, imm(threads));
  b.op(Op::Add, Type::S64, a, a, imm(4 * threads));
  b.bra(next_i);
  b.bind(done_i);
  b.op(Op::Add, Type::S32, bi, bi, imm(1));
  b.bra(next_b);
  b.bind(done);
  b.comment("the warps' sums, then thread 0 adds them in warp order");
  e.warp_reduce(Op::Add, acc);
  Reg lane = e.op(Op::And, Type::B32, f.tid, imm(31));
  Reg warp = e.op(Op::Shr, Type::U32, f.tid, imm(5));
  Reg slot = e.op(Op::Add, Type::U32, e.mov(Type::U32, ptx::sym(red)),
                  e.op(Op::Shl, Type::B32, warp, imm(2)));
  b.when(e.setp(Cmp::Eq, Type::U32, lane, imm(0))).st(Space::Shared, Type::F32, at(slot), acc);
  b.bar_sync();
  ptx::Label skip = b.label();
  b.when(e.setp(Cmp::Ne, Type::U32, f.tid, imm(0))).bra(skip);
  Reg sum = b.f32();
  b.ld(Space::Shared, Type::F32, sum, at(red));
  for (int w = 1; w < spec.num_warps; ++w) {
    b.ld(Space::Shared, Type::F32, t, at(red, 4 * w));
    b.op(Op::Add, Type::F32, sum, sum, t);
  }
  b.op(Op::Neg, Type::F32, sum, sum);
  Reg ds = e.global_param(offsetof(P, dsinks));
  b.st(Space::Global, Type::F32, at(e.index(ds, f.h, 4)), sum);
  b.bind(skip);
}

void post_body(Emitter &e, const KernelSpec &spec) {
  ptx::Builder &b = e.b;
  RowFrame f = row_frame(e, spec);
  if (spec.sinks) {
    b.comment("CTA (0, h, 0): dsinks[h] first (every thread; no exit before)");
    ptx::Label rows = b.label();
    Reg cx = e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    Reg other = e.setp(Cmp::Ne, Type::U32, e.op(Op::Or, Type::B32, cx, f.bz), imm(0));
    b.when(other).bra(rows);
    dsinks_sum(e, spec, f);
    b.bind(rows);
  }
  b.when(e.setp(Cmp::Ge, Type::S32, f.i, f.len)).exit();
  b.comment("dQ = dq_accum softmax_scale, rounded to the dtype");
  Reg acc = e.index64(e.global_param(offsetof(P, dq_accum)), f.r, spec.head_dim * 4);
  Reg dq = row_address(e, spec, f, offsetof(P, dq), offsetof(P, dq_stride), elem_bytes(spec.dtype));
  Reg scale = e.param(Type::F32, offsetof(P, softmax_scale));
  const Type half = spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16;
  Reg x[8], w[4];
  for (Reg &r : x) r = b.f32();
  for (Reg &r : w) r = b.b32();
  for (int c = 0; c < spec.head_dim; c += 8) {
    b.ld_v(Space::Global, Type::F32, {x[0], x[1], x[2], x[3]}, at(acc, 4 * c), true);
    b.ld_v(Space::Global, Type::F32, {x[4], x[5], x[6], x[7]}, at(acc, 4 * c + 16), true);
    for (Reg &r : x) b.op(Op::Mul, Type::F32, r, r, scale);
    for (int k = 0; k < 4; ++k) b.cvt_pack(half, w[k], x[2 * k + 1], x[2 * k]);
    b.st_v(Space::Global, Type::B32, at(dq, 2 * c), {w[0], w[1], w[2], w[3]});
  }
  b.exit();
}

}  // namespace

std::string generate_backward_rows(const KernelSpec &spec) {
  ptx::Builder b(entry_name(spec), sizeof(BackwardParams));
  Emitter e(b);
  b.comment(spec.describe());
  if (spec.kind == KernelKind::BackwardPre)
    pre_body(e, spec);
  else
    post_body(e, spec);
  return std::move(b).emit(ptx_isa_version(spec), spec.sm,
                           static_cast<uint32_t>(32 * spec.num_warps));
}

}  // namespace kgen
}  // namespace fa
