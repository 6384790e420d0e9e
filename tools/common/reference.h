// Float64 reference attention and fp16/bf16 conversions, shared by the CLI,
// the tests and the benchmarks. Straightforward loops over the definition in
// include/flashattn.h; no tiling, no online softmax.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fa::ref {

// IEEE binary16 and bfloat16 <-> float, round to nearest even.
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
// Rounds x to fp16 (bf16 when bf16 is true) and back.
float round_to(float x, bool bf16);

// fp8 (flashattn.h, FA_DTYPE_FP8_E4M3 / FA_DTYPE_FP8_E5M2) from the format's
// definition (OCP 8-bit floating point): e4m3 1-4-3 bits, bias 7, no
// infinities, S.1111.111 NaN; e5m2 1-5-2 bits, bias 15, exponent 31 inf/NaN.
double fp8_to_double(uint8_t code, bool e5m2);
// The finite fp8 code nearest to x (ties to the even code; beyond the
// largest finite value: it, as cvt.rn.satfinite; NaN: the NaN code 0x7f).
uint8_t fp8_from_double(double x, bool e5m2);
// The largest finite value: 448 (e4m3), 57344 (e5m2).
inline double fp8_max(bool e5m2) { return e5m2 ? 57344.0 : 448.0; }

struct Problem {
  int batch = 1, seqlen_q = 1, seqlen_k = 1;
  int num_heads_q = 1, num_heads_kv = 1;
  int head_dim = 0, head_dim_v = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;  // -1 = unbounded
  double softmax_scale = 0;                 // 0 = 1/sqrt(head_dim)
  double softcap = 0;                       // 0 = off
  // Decode's tree mask (flashattn.h, fa_decode_args.tree_mask), or null:
  // bool [batch][seqlen_q][seqlen_q], nonzero = query i sees new token j
  // (key sk - seqlen_q + j); keys before the new tokens stay visible.
  const uint8_t *tree_mask = nullptr;
  // Attention sinks (flashattn.h, fa_forward_args.sinks), or null: float
  // [num_heads_q] natural-log logits, one more term exp(sinks[h]) in every
  // row's softmax denominator with no value (openai/gpt-oss, model.py sdpa:
  // softmax over [scale q.k_j ..., sink], the sink's column dropped).
  const float *sinks = nullptr;
  // ALiBi (flashattn.h, fa_forward_args.alibi_slopes), or null: the logit
  // of query i, key j (after softcap) loses slope |i + sk - seqlen_q - j|,
  // slope = alibi_slopes[b * alibi_stride + h] (alibi_stride 0: one row);
  // sk the sequence's key count. The sink is not biased.
  const float *alibi_slopes = nullptr;
  long long alibi_stride = 0;
  // The batch index the slopes of sequence b of this problem are read at:
  // b + alibi_batch0 (a varlen reference run one sequence at a time).
  int alibi_batch0 = 0;
};
// The ALiBi slope of (sequence b, head h) in p, or 0 without ALiBi.
inline double alibi_slope(const Problem &p, int b, int h) {
  return p.alibi_slopes
             ? double(p.alibi_slopes[(long long)(b + p.alibi_batch0) * p.alibi_stride + h])
             : 0.0;
}
// The standard ALiBi slopes of n heads (Press et al. 2022; BLOOM's
// build_alibi_tensor, MPT's gen_slopes): for n a power of two, head h gets
// 2^(-8 (h + 1) / n); otherwise, with p the largest power of two below n,
// the p slopes of p heads then every other slope of 2p heads (2^(-4 (2k+1)
// / p), k = 0 .. n - p - 1).
std::vector<float> standard_alibi_slopes(int n);

// Whether the tree mask of p lets query i of sequence b (with sk valid keys)
// see key j (true without a mask).
inline bool tree_visible(const Problem &p, int b, int i, long long j, long long sk) {
  const long long jn = j - (sk - p.seqlen_q);
  return !p.tree_mask || jn < 0 ||
         p.tree_mask[(static_cast<size_t>(b) * p.seqlen_q + i) * p.seqlen_q + jn] != 0;
}

// q [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv, head_dim],
// v [batch, seqlen_k, heads_kv, head_dim_v], contiguous. Writes o [batch,
// seqlen_q, heads_q, head_dim_v] and lse [batch, heads_q, seqlen_q] (natural
// log; -inf and o = 0 for a row that sees no key, LSE = sinks[h] with sinks; a
// sink of +inf: o = 0, LSE = +inf, of NaN: o = NaN, LSE = NaN, on every row of
// its head, as flashattn.h's formula gives). seqlens_k, if given,
// holds the valid key count per batch (decode: cache_seqlens); keys past it are invisible and the
// causal alignment uses it as seqlen_k. lse may be null.
void attention(const Problem &p, const double *q, const double *k, const double *v, double *o,
               double *lse, const int32_t *seqlens_k = nullptr);

// Gradients of attention(p, q, k, v) -> o for the upstream gradient dout
// (like o), i.e. of the loss L = sum(dout o O): dq (like q), dk (like k), dv
// (like v; dk and dv summed over the query heads of a KV head's group) and,
// with p.sinks and dsinks both set, dsinks [num_heads_q] (summed over batch
// and rows); all overwritten. FlashAttention-2 (Dao, 2023), section 3.1 /
// Algorithm 2, straightforwardly in fp64, per row i of head h with P
// recomputed from attention()'s definition:
//   x_ij = scale q_i.k_j,  S_ij = cap tanh(x_ij / cap) - slope |diag_i - j|
//   (S_ij = x_ij - ... without softcap), P_ij = exp(S_ij - LSE_i), P_i,sink =
//   exp(sink_h - LSE_i), masked keys P_ij = 0;
//   dV_j += P_ij dO_i,  dP_ij = dO_i . V_j,  D_i = rowsum(dO_i o O_i),
//   dS_ij = P_ij (dP_ij - D_i),
//   g_ij = the derivative of S_ij in q_i.k_j = scale (1 - tanh^2(x_ij / cap))
//   (scale without softcap; the ALiBi bias is no function of q or k),
//   dQ_i += dS_ij g_ij K_j,  dK_j += dS_ij g_ij Q_i.
// The sink is one more softmax column with no value (dP_i,sink = 0): the
// derivative of P_ij in sink_h is -P_ij P_i,sink, so with D_i = sum_j P_ij
// dP_ij, dsinks[h] = sum_i sum_j dP_ij (-P_ij P_i,sink) = -sum over b, i of
// P_i,sink D_i (= dS_i,sink = P_i,sink (0 - D_i) summed). A row that sees
// no key (O = 0, D = 0) gives and takes nothing. A sink of +inf (O = 0 on
// its head) gives zero gradients; one of NaN (O = NaN) NaN dsinks, dq on its
// head and dk, dv of every key the head sees; one of -inf is no sink
// (dsinks 0).
// seqlens_k as in attention().
void attention_backward(const Problem &p, const double *q, const double *k, const double *v,
                        const double *dout, double *dq, double *dk, double *dv, double *dsinks,
                        const int32_t *seqlens_k = nullptr);

// Merges partial states: o_part [splits, rows, dv], lse_part [splits, rows]
// -> o [rows, dv], lse [rows], per the formula in fa_decode_reduce;
// row_sinks [rows] (natural log), if given, is one more state per row with
// o = 0 (fa_reduce_args.sinks). Non-finite LSEs as fa_decode_reduce: any NaN
// gives o = NaN, lse = NaN; else +inf states share all the weight (o = their
// mean, lse = +inf); -inf states weigh nothing (all -inf: o = 0, lse = -inf).
void merge_states(int splits, int rows, int dv, const double *o_part, const double *lse_part,
                  double *o, double *lse, const double *row_sinks = nullptr);

// Error summary of `got` against `ref` (n elements).
struct ErrorStats {
  double max_abs = 0;       // max |got - ref|
  double max_ref = 0;       // max |ref|
  double rel_l2 = 0;        // ||got - ref||_2 / ||ref||_2
  long long nonfinite = 0;  // NaN or inf elements in got
};
ErrorStats compare(const float *got, const double *ref, size_t n);

// Rotary embedding of one row of 16-bit values x[0..d) (already rounded to
// the dtype, as f32) in place, the rule of fa_decode_args.rotary_dim:
// pairs (2i, 2i+1) when interleaved, else (i, i + rotary_dim / 2); for
// pair (x0, x1) with c = cos_row[i], s = sin_row[i]:
//   y0 = fma(x1, -s, rn(x0 c)), y1 = fma(x0, s, rn(x1 c)) in f32,
// each then rounded to the dtype (bf16 or fp16). Columns >= rotary_dim stay.
void rope_row(float *x, int rotary_dim, bool interleaved, const float *cos_row,
              const float *sin_row, bool bf16);

}  // namespace fa::ref
