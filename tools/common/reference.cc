#include "reference.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace fa::ref {

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // fp16 subnormal or zero: value = m * 2^-24
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24 -> maps 2^(e-127) mant to units of 2^-24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t u;
  if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  std::memcpy(&out, &u, 4);
  return out;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &u, 4);
  return out;
}

double fp8_to_double(uint8_t code, bool e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  const int e = (code & 0x7f) >> mbits, m = code & ((1 << mbits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e5m2 && e == 31) return m ? NAN : sign * INFINITY;
  if (!e5m2 && e == 15 && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - mbits);  // subnormal
  return sign * std::ldexp(double((1 << mbits) + m), e - bias - mbits);
}

uint8_t fp8_from_double(double x, bool e5m2) {
  if (std::isnan(x)) return 0x7f;
  // The finite codes 0..max of one sign, ordered by value (one table per
  // format, built once): the nearest by binary search, ties to the even code.
  struct Table {
    std::vector<double> v;
    explicit Table(bool f) {
      for (int c = 0; c < 0x80; ++c) {
        const double x = fp8_to_double(static_cast<uint8_t>(c), f);
        if (!std::isfinite(x)) break;
        v.push_back(x);
      }
    }
  };
  static const Table e4m3(false), e5m2_table(true);
  const std::vector<double> &t = e5m2 ? e5m2_table.v : e4m3.v;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min(std::fabs(x), t.back());
  const size_t hi = size_t(std::lower_bound(t.begin(), t.end(), a) - t.begin());
  size_t best = hi;
  if (hi > 0) {
    const double dl = a - t[hi - 1], dh = t[hi] - a;
    if (dl < dh || (dl == dh && ((hi - 1) & 1) == 0)) best = hi - 1;
  }
  return static_cast<uint8_t>(sign | best);
}

float round_to(float x, bool bf16) {
  return bf16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x));
}

void attention(const Problem &p, const double *q, const double *k, const double *v, double *o,
               double *lse, const int32_t *seqlens_k) {
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads_q / p.num_heads_kv;
  const double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(static_cast<size_t>(p.seqlen_k));
  for (int b = 0; b < p.batch; ++b) {
    const int sk = seqlens_k ? seqlens_k[b] : p.seqlen_k;
    for (int h = 0; h < p.num_heads_q; ++h) {
      const int hk = h / group;
      for (int i = 0; i < p.seqlen_q; ++i) {
        const double *qi = q + ((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * d;
        const long long diag = static_cast<long long>(i) + sk - p.seqlen_q;
        const double alibi = alibi_slope(p, b, h);
        long long lo = 0, hi = sk - 1;
        if (p.window_left >= 0) lo = std::max(lo, diag - p.window_left);
        if (p.causal) hi = std::min(hi, diag);
        if (p.window_right >= 0) hi = std::min(hi, diag + p.window_right);
        double m = ninf;
        for (long long j = lo; j <= hi; ++j) {
          if (!tree_visible(p, b, i, j, sk)) {
            s[size_t(j)] = ninf;  // weighs nothing below
            continue;
          }
          const double *kj = k + ((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + hk) * d;
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += qi[c] * kj[c];
          double x = dot * scale;
          if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
          x -= alibi * double(std::llabs(diag - j));
          s[size_t(j)] = x;
          m = std::max(m, x);
        }
        // Attention sink (gpt-oss): one more logit in the denominator, no
        // value, compared with the scaled scores as it is.
        const double sink = p.sinks ? double(p.sinks[h]) : ninf;
        m = std::max(m, sink);
        double *oi = o + ((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * dv;
        for (int c = 0; c < dv; ++c) oi[c] = 0;
        if (std::isnan(sink) || (std::isinf(sink) && sink > 0)) {
          // e^sink is NaN or +inf, so is the denominator: LSE = sink, O =
          // NaN or (a finite sum over +inf) 0, whatever keys the row sees.
          if (std::isnan(sink))
            for (int c = 0; c < dv; ++c) oi[c] = sink;
          if (lse) lse[(size_t(b) * p.num_heads_q + h) * p.seqlen_q + i] = sink;
          continue;
        }
        double l = sink == ninf ? 0 : std::exp(sink - m);
        for (long long j = lo; j <= hi; ++j) {
          if (s[size_t(j)] == ninf) continue;  // masked by the tree
          const double w = std::exp(s[size_t(j)] - m);
          l += w;
          const double *vj = v + ((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + hk) * dv;
          for (int c = 0; c < dv; ++c) oi[c] += w * vj[c];
        }
        if (l > 0) {
          for (int c = 0; c < dv; ++c) oi[c] /= l;
        }
        if (lse)
          lse[(size_t(b) * p.num_heads_q + h) * p.seqlen_q + i] = l > 0 ? m + std::log(l) : ninf;
      }
    }
  }
}

void attention_backward(const Problem &p, const double *q, const double *k, const double *v,
                        const double *dout, double *dq, double *dk, double *dv, double *dsinks,
                        const int32_t *seqlens_k) {
  const int d = p.head_dim, dvd = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads_q / p.num_heads_kv;
  const double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
  const double ninf = -std::numeric_limits<double>::infinity();
  const size_t rows_q = size_t(p.batch) * p.seqlen_q * p.num_heads_q;
  const size_t rows_k = size_t(p.batch) * p.seqlen_k * p.num_heads_kv;
  std::fill(dq, dq + rows_q * d, 0.0);
  std::fill(dk, dk + rows_k * d, 0.0);
  std::fill(dv, dv + rows_k * dvd, 0.0);
  if (dsinks && p.sinks) std::fill(dsinks, dsinks + p.num_heads_q, 0.0);
  // Per key of the row: the logit S_ij and the chain factor dS_ij / d(q_i.k_j).
  std::vector<double> s(static_cast<size_t>(p.seqlen_k)), g(s.size());
  std::vector<double> oi(static_cast<size_t>(dvd));
  for (int b = 0; b < p.batch; ++b) {
    const int sk = seqlens_k ? seqlens_k[b] : p.seqlen_k;
    for (int h = 0; h < p.num_heads_q; ++h) {
      const int hk = h / group;
      for (int i = 0; i < p.seqlen_q; ++i) {
        const size_t row = (size_t(b) * p.seqlen_q + i) * p.num_heads_q + h;
        const double *qi = q + row * d, *doi = dout + row * dvd;
        double *dqi = dq + row * d;
        const long long diag = static_cast<long long>(i) + sk - p.seqlen_q;
        const double alibi = alibi_slope(p, b, h);
        long long lo = 0, hi = sk - 1;
        if (p.window_left >= 0) lo = std::max(lo, diag - p.window_left);
        if (p.causal) hi = std::min(hi, diag);
        if (p.window_right >= 0) hi = std::min(hi, diag + p.window_right);
        auto key = [&](long long j) {
          return (size_t(b) * p.seqlen_k + size_t(j)) * p.num_heads_kv + hk;
        };
        double m = ninf;
        for (long long j = lo; j <= hi; ++j) {
          if (!tree_visible(p, b, i, j, sk)) {
            s[size_t(j)] = ninf;  // P = 0: no gradient
            continue;
          }
          const double *kj = k + key(j) * d;
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += qi[c] * kj[c];
          double x = dot * scale, chain = scale;
          if (p.softcap > 0) {
            const double t = std::tanh(x / p.softcap);
            x = p.softcap * t;
            chain = scale * (1 - t * t);  // d(cap tanh(x / cap)) / dx = 1 - tanh^2
          }
          x -= alibi * double(std::llabs(diag - j));
          s[size_t(j)] = x;
          g[size_t(j)] = chain;
          m = std::max(m, x);
        }
        const double sink = p.sinks ? double(p.sinks[h]) : ninf;
        // A sink of +inf takes all the weight (every P_ij = 0, O = 0): no
        // gradient. One of NaN makes O NaN, and l, P and all below.
        if (std::isinf(sink) && sink > 0) continue;
        if (std::isnan(sink)) std::fill(dqi, dqi + d, sink);
        m = std::max(m, sink);
        double l = sink == ninf ? 0 : std::exp(sink - m);
        for (long long j = lo; j <= hi; ++j)
          if (s[size_t(j)] != ninf) l += std::exp(s[size_t(j)] - m);
        if (l == 0) continue;  // no key, no sink: O = 0, zero gradients
        // P_ij in s; O_i and D_i = dO_i . O_i.
        std::fill(oi.begin(), oi.end(), 0.0);
        for (long long j = lo; j <= hi; ++j) {
          if (s[size_t(j)] == ninf) continue;
          s[size_t(j)] = std::exp(s[size_t(j)] - m) / l;
          const double *vj = v + key(j) * dvd;
          for (int c = 0; c < dvd; ++c) oi[size_t(c)] += s[size_t(j)] * vj[c];
        }
        double dd = 0;
        for (int c = 0; c < dvd; ++c) dd += doi[c] * oi[size_t(c)];
        for (long long j = lo; j <= hi; ++j) {
          if (s[size_t(j)] == ninf) continue;
          const double pj = s[size_t(j)];
          const double *kj = k + key(j) * d, *vj = v + key(j) * dvd;
          double *dkj = dk + key(j) * d, *dvj = dv + key(j) * dvd;
          double dp = 0;  // dP_ij = dO_i . V_j
          for (int c = 0; c < dvd; ++c) {
            dp += doi[c] * vj[c];
            dvj[c] += pj * doi[c];
          }
          const double ds = pj * (dp - dd) * g[size_t(j)];  // dL / d(q_i.k_j)
          for (int c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
        if (dsinks && p.sinks && sink != ninf) dsinks[h] -= std::exp(sink - m) / l * dd;
      }
    }
  }
}

std::vector<float> standard_alibi_slopes(int n) {
  std::vector<float> out;
  if (n <= 0) return out;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  for (int h = 0; h < p2; ++h) out.push_back(float(std::exp2(-8.0 * (h + 1) / p2)));
  for (int k = 0; int(out.size()) < n; ++k)
    out.push_back(float(std::exp2(-4.0 * (2 * k + 1) / p2)));
  return out;
}

void merge_states(int splits, int rows, int dv, const double *o_part, const double *lse_part,
                  double *o, double *lse, const double *row_sinks) {
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < rows; ++r) {
    // State s of this row (s == splits: the sink, LSE = row_sinks[r], O = 0).
    const int states = splits + (row_sinks ? 1 : 0);
    auto lse_of = [&](int s) { return s < splits ? lse_part[size_t(s) * rows + r] : row_sinks[r]; };
    auto o_of = [&](int s, int c) {
      return s < splits ? o_part[(size_t(s) * rows + r) * dv + c] : 0.0;
    };
    double m = ninf;
    bool nan = false;
    for (int s = 0; s < states; ++s) {
      nan = nan || std::isnan(lse_of(s));
      m = std::max(m, lse_of(s));
    }
    double *orow = o + size_t(r) * dv;
    for (int c = 0; c < dv; ++c) orow[c] = nan ? NAN : 0.0;
    if (nan || m == ninf) {  // NaN in: NaN out; no state: O = 0, LSE = -inf
      lse[r] = nan ? NAN : ninf;
      continue;
    }
    // w_s = e^(LSE_s - m); with m = +inf the +inf states weigh 1 each (the
    // weights' limit as equal LSEs grow) and the others 0: O = their mean.
    const bool inf = std::isinf(m);  // +inf (m > -inf here)
    double sum = 0;
    for (int s = 0; s < states; ++s) {
      const double w = inf ? (lse_of(s) == m ? 1.0 : 0.0) : std::exp(lse_of(s) - m);
      sum += w;
      for (int c = 0; c < dv; ++c) orow[c] += w * o_of(s, c);
    }
    for (int c = 0; c < dv; ++c) orow[c] /= sum;
    lse[r] = m + std::log(sum);
  }
}

ErrorStats compare(const float *got, const double *ref, size_t n) {
  ErrorStats e;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      ++e.nonfinite;
      continue;
    }
    const double diff = std::fabs(double(got[i]) - ref[i]);
    e.max_abs = std::max(e.max_abs, diff);
    e.max_ref = std::max(e.max_ref, std::fabs(ref[i]));
    num += diff * diff;
    den += ref[i] * ref[i];
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

void rope_row(float *x, int rotary_dim, bool interleaved, const float *cos_row,
              const float *sin_row, bool bf16) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    float &x0 = interleaved ? x[2 * i] : x[i];
    float &x1 = interleaved ? x[2 * i + 1] : x[i + half];
    const float c = cos_row[i], s = sin_row[i];
    // volatile: the products are rounded to f32 on their own, never fused.
    volatile float p0 = x0 * c, p1 = x1 * c;
    const float y0 = std::fma(x1, -s, p0), y1 = std::fma(x0, s, p1);
    x0 = round_to(y0, bf16);
    x1 = round_to(y1, bf16);
  }
}

}  // namespace fa::ref
