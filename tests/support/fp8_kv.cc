#include "support/fp8_kv.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/dev.h"

namespace fa::test::fp8kv {

fa_status g_last_fail = FA_SUCCESS;

namespace {

using fa::test::Dev;

uint16_t to16(double x, bool bf16) {
  return bf16 ? fa::ref::f32_to_bf16(float(x)) : fa::ref::f32_to_f16(float(x));
}
double from16(uint16_t h, bool bf16) {
  return bf16 ? fa::ref::bf16_to_f32(h) : fa::ref::f16_to_f32(h);
}

constexpr uint8_t kNanCode = 0x7f;  // NaN in both formats

// The device images of one cache [b, skmax, h, d] of fp8 codes in a
// layout (one per allocation: pointer arrays one per sequence) and its
// strides in *t; gaps and rows past a sequence hold NaN bytes.
std::vector<std::vector<uint8_t>> images(const Case &c, const std::vector<uint8_t> &codes, int d,
                                         const std::vector<int32_t> &table, int max_pages,
                                         int num_pages, fa_tensor *t) {
  std::vector<std::vector<uint8_t>> out;
  const int h = c.hkv, sk = c.skmax;
  auto code = [&](int b, int s, int ih, int id) {
    return codes[((size_t(b) * sk + s) * h + ih) * d + id];
  };
  fa_tensor v{};
  v.stride[3] = 1;
  if (c.layout == kContig || c.layout == kPtrs) {
    const bool gaps = !c.tight;
    v.stride[2] = d + (gaps ? 16 : 0);
    v.stride[1] = int64_t(h) * v.stride[2] + (gaps ? 32 : 0);
    v.stride[0] = int64_t(sk) * v.stride[1] + (gaps ? 16 : 0);
    const int nb = c.layout == kContig ? c.batch : 1;
    for (int part = 0; part < (c.layout == kContig ? 1 : c.batch); ++part) {
      std::vector<uint8_t> dev(size_t(nb) * v.stride[0], kNanCode);
      for (int ib = 0; ib < nb; ++ib)
        for (int s = 0; s < sk; ++s)
          for (int ih = 0; ih < h; ++ih)
            for (int id = 0; id < d; ++id)
              dev[ib * v.stride[0] + s * v.stride[1] + ih * v.stride[2] + id] =
                  code(c.layout == kContig ? ib : part, s, ih, id);
      out.push_back(std::move(dev));
    }
    *t = v;
    return out;
  }
  const int ps = c.page_size;
  if (c.layout == kPagedHnd) {
    v.stride[1] = d + 16;
    v.stride[2] = int64_t(ps) * v.stride[1];
    v.stride[0] = int64_t(h) * v.stride[2] + 16;
  } else {
    v.stride[2] = d + 16;
    v.stride[1] = int64_t(h) * v.stride[2];
    v.stride[0] = int64_t(ps) * v.stride[1] + 32;
  }
  std::vector<uint8_t> dev(size_t(num_pages) * v.stride[0], kNanCode);
  for (int ib = 0; ib < c.batch; ++ib)
    for (int s = 0; s < sk; ++s) {
      const int page = table[size_t(ib) * max_pages + s / ps];
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id)
          dev[page * v.stride[0] + (s % ps) * v.stride[1] + ih * v.stride[2] + id] =
              code(ib, s, ih, id);
    }
  out.push_back(std::move(dev));
  *t = v;
  return out;
}

// images() uploaded: *t and (pointer arrays) *ptrs set; *allocs: the
// allocations, in images() order.
void place(Dev &dv, const Case &c, const std::vector<uint8_t> &codes, int d,
           const std::vector<int32_t> &table, int max_pages, int num_pages, fa_tensor *t,
           uint64_t *ptrs, std::vector<uint64_t> *allocs) {
  const std::vector<std::vector<uint8_t>> im = images(c, codes, d, table, max_pages, num_pages, t);
  allocs->clear();
  for (const std::vector<uint8_t> &x : im) allocs->push_back(dv.put(x.data(), x.size()));
  if (c.layout == kPtrs) {
    t->data = 0;
    *ptrs = dv.put(allocs->data(), allocs->size() * 8);
  } else {
    t->data = (*allocs)[0];
  }
}

// The same attention at a framework's low precision (S in fp32, P rounded to
// dtype, O accumulated in fp32 and rounded): its error against fp64 is the
// yardstick (FlashAttention's test rule). p_e4m3: P as mode (b) of the fp8
// decode rounds it instead (each 2^8 e^(s - rowmax) to e4m3, divided by
// 2^8 and by the unrounded row sum: tile::OnlineSoftmax::fp8_form).
std::vector<double> lowp(const fa::ref::Problem &p, const std::vector<double> &q,
                         const std::vector<double> &k, const std::vector<double> &v, bool bf16,
                         const int32_t *lens, bool p_e4m3) {
  const int d = p.head_dim, dv = p.head_dim_v, group = p.num_heads_q / p.num_heads_kv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> o(size_t(p.batch) * p.seqlen_q * p.num_heads_q * dv, 0.0);
  std::vector<float> s(size_t(p.seqlen_k));
  for (int b = 0; b < p.batch; ++b) {
    const int sk = lens[b];
    for (int h = 0; h < p.num_heads_q; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const long long diag = (long long)i + sk - p.seqlen_q;
        long long lo = 0, hi = sk - 1;
        if (p.window_left >= 0) lo = std::max(lo, diag - p.window_left);
        if (p.causal) hi = std::min(hi, diag);
        if (lo > hi) continue;
        const float sink = p.sinks ? p.sinks[h] : -INFINITY;
        float m = sink;
        for (long long j = lo; j <= hi; ++j) {
          if (!fa::ref::tree_visible(p, b, i, j, sk)) {
            s[size_t(j)] = -INFINITY;
            continue;
          }
          float dot = 0;
          for (int x = 0; x < d; ++x)
            dot += float(q[((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * d + x] *
                         k[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + h / group) * d + x]);
          float y = dot * float(scale);
          if (p.softcap > 0) y = float(p.softcap) * std::tanh(y / float(p.softcap));
          y -= float(fa::ref::alibi_slope(p, b, h) * std::fabs(double(diag - j)));
          s[size_t(j)] = y;
          m = std::max(m, y);
        }
        if (m == -INFINITY) continue;
        float l = sink == -INFINITY ? 0.0f : std::exp(sink - m);
        for (long long j = lo; j <= hi; ++j) {
          s[size_t(j)] = std::exp(s[size_t(j)] - m);
          l += s[size_t(j)];
        }
        double *orow = &o[((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * dv];
        for (int x = 0; x < dv; ++x) {
          float acc = 0;
          for (long long j = lo; j <= hi; ++j)
            acc += (p_e4m3 ? float(fa::ref::fp8_to_double(
                                 fa::ref::fp8_from_double(256.0 * s[size_t(j)], false), false)) /
                                 (256.0f * l)
                           : fa::ref::round_to(s[size_t(j)] / l, bf16)) *
                   float(v[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + h / group) * dv + x]);
          orow[x] = fa::ref::round_to(acc, bf16);
        }
      }
  }
  return o;
}

// Q as mode (b) of the fp8 decode quantises it (tile::rows_to_e4m3): each
// row of d values times 2^k, k = 8 - the exponent of its largest magnitude
// (one less when that one's mantissa is past 1.75), clamped to [-126, 126]
// (126 for an all-zero row), rounded to e4m3 (nearest even, saturating),
// times 2^-k.
std::vector<double> q_rows_e4m3(const std::vector<double> &q, int d) {
  std::vector<double> out(q.size());
  for (size_t r = 0; r < q.size() / size_t(d); ++r) {
    double amax = 0;
    for (int x = 0; x < d; ++x) amax = std::max(amax, std::fabs(q[r * d + x]));
    int k = 126;
    if (amax > 0) {
      int e = 0;
      const double m = 2.0 * std::frexp(amax, &e);  // amax = m 2^(e - 1), m in [1, 2)
      k = std::min(126, std::max(-126, 8 - (e - 1) - (m > 1.75 ? 1 : 0)));
    }
    for (int x = 0; x < d; ++x)
      out[r * d + x] =
          std::ldexp(fa::ref::fp8_to_double(
                         fa::ref::fp8_from_double(std::ldexp(q[r * d + x], k), false), false),
                     -k);
  }
  return out;
}

fa_config *make_config(Dev &dv, const Case &c) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = c.bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  desc.head_dim = c.d;
  desc.head_dim_v = c.dv;
  desc.num_heads_q = c.hq;
  desc.num_heads_kv = c.hkv;
  desc.causal = c.causal;
  desc.window_left = c.window_left;
  desc.softcap = c.softcap;
  desc.kv_dtype = c.e5m2 ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
  dv.check(fa_config_create(&desc, &dv.cfg), "fa_config_create");
  return dv.cfg;
}

// Runs one case; returns the problems found ("" = passed). *counters: the
// decode kernel's memory counters.
}  // namespace

std::string run_case(fa_runtime *rt, const Case &c, fa_emu_mem_counters *counters) {
  std::printf("  %s\n", c.describe().c_str());
  Dev dev(rt);
  dev.last_fail = &g_last_fail;
  if (!make_config(dev, c)) return dev.err;
  const int dv = c.dv ? c.dv : c.d, hq = c.hq, hkv = c.hkv, sq = c.seqlen_q, sk = c.skmax;
  std::mt19937 gen(c.seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> uf(0.5, 2.0);
  // Q rounded to dtype.
  std::vector<uint16_t> qb(size_t(c.batch) * sq * hq * c.d);
  std::vector<double> q(qb.size());
  for (size_t i = 0; i < qb.size(); ++i) {
    const int row = int(i / size_t(c.d));
    const double f = c.q_spread ? std::ldexp(1.0, (row * 7 % 5) * 12 - 30) : 1.0;
    qb[i] = to16(nd(gen) * f, c.bf16);
    q[i] = from16(qb[i], c.bf16);
  }
  // Descales [batch][hkv] (the real values are N(0, 1) times a per-head
  // spread; the stored bytes are value / descale).
  const double fmax = fa::ref::fp8_max(c.e5m2);
  std::vector<double> kd(size_t(c.batch) * hkv, 1.0), vd(kd.size(), 1.0);
  if (c.descale == 1) {
    std::fill(kd.begin(), kd.end(), 4.0 / fmax * uf(gen));
    std::fill(vd.begin(), vd.end(), 4.0 / fmax * uf(gen));
  } else if (c.descale == 2) {
    for (double &x : kd) x = 4.0 / fmax * uf(gen);
    for (double &x : vd) x = 4.0 / fmax * uf(gen);
  }
  if (c.odd_descales)
    for (int h = 0; h < hkv; ++h) {
      kd[size_t(1) * hkv + h] = 0.0;
      vd[size_t(1) * hkv + h] = INFINITY;
      kd[size_t(2) * hkv + h] = NAN;
      vd[size_t(2) * hkv + h] = -vd[size_t(2) * hkv + h];
    }
  const int inf_b = c.inf_descale_seq;
  auto make_cache = [&](int d, const std::vector<double> &ds, std::vector<uint8_t> *codes,
                        std::vector<double> *vals) {
    codes->assign(size_t(c.batch) * sk * hkv * d, kNanCode);
    vals->assign(codes->size(), 0.0);
    for (int b = 0; b < c.batch; ++b)
      for (int s = 0; s < sk; ++s)
        for (int h = 0; h < hkv; ++h)
          for (int x = 0; x < d; ++x) {
            const size_t i = ((size_t(b) * sk + s) * hkv + h) * d + x;
            const double real = nd(gen) * (0.5 + h);
            if (s >= c.lens[b] || b == inf_b) continue;  // NaN bytes: never read
            (*codes)[i] = fa::ref::fp8_from_double(real / ds[size_t(b) * hkv + h], c.e5m2);
            (*vals)[i] = fa::ref::fp8_to_double((*codes)[i], c.e5m2) * ds[size_t(b) * hkv + h];
          }
  };
  std::vector<uint8_t> kc, vc;
  std::vector<double> k, v;
  make_cache(c.d, kd, &kc, &k);
  make_cache(dv, vd, &vc, &v);
  if (c.v_in_k)  // V: K's bytes (row r = (b sk + s) hkv + h), times V's descales
    for (size_t r = 0; r < vc.size() / size_t(dv); ++r)
      for (int x = 0; x < dv; ++x) {
        const uint8_t code = kc[r * size_t(c.d) + size_t(x)];
        const size_t b = r / (size_t(sk) * hkv), bh = b * hkv + r % hkv;
        vc[r * dv + x] = code;
        // (kNanCode: a row never read, as make_cache leaves it)
        v[r * dv + x] = code == kNanCode ? 0.0 : fa::ref::fp8_to_double(code, c.e5m2) * vd[bh];
      }

  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = sq;
  a.seqlen_k_max = sk;
  a.num_splits = c.splits;
  a.batch_invariant = c.batch_invariant;
  a.q.data = dev.put(qb.data(), qb.size() * 2);
  a.q.stride[3] = 1;
  a.q.stride[2] = c.d;
  a.q.stride[1] = int64_t(hq) * c.d;
  a.q.stride[0] = int64_t(sq) * hq * c.d;
  std::vector<int32_t> table;
  int max_pages = 0, num_pages = 0;
  if (c.layout == kPagedNhd || c.layout == kPagedHnd) {
    max_pages = (sk + c.page_size - 1) / c.page_size;
    num_pages = c.batch * max_pages + 2;
    std::vector<int32_t> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), gen);
    table.assign(perm.begin(), perm.begin() + c.batch * max_pages);
    a.kv.layout = FA_KV_PAGED;
    a.kv.page_size = c.page_size;
    a.kv.num_pages = num_pages;
    a.kv.max_pages_per_seq = max_pages;
    a.kv.block_table_stride = max_pages;
    a.kv.block_table = dev.put(table.data(), table.size() * 4);
  } else if (c.layout == kPtrs) {
    a.kv.layout = FA_KV_PTR_ARRAY;
  }
  std::vector<uint64_t> k_allocs, v_allocs;
  place(dev, c, kc, c.d, table, max_pages, num_pages, &a.k_cache, &a.kv.k_ptrs, &k_allocs);
  if (c.v_in_k) {
    a.v_cache = a.k_cache;
    a.kv.v_ptrs = a.kv.k_ptrs;
  } else {
    place(dev, c, vc, dv, table, max_pages, num_pages, &a.v_cache, &a.kv.v_ptrs, &v_allocs);
  }
  std::vector<int32_t> lens(c.lens.begin(), c.lens.end());
  a.cache_seqlens = dev.put(lens.data(), lens.size() * 4);
  // Descale arrays.
  if (c.descale == 1) {
    const float kf = float(kd[0]), vf = float(vd[0]);
    a.k_descale = dev.put(&kf, 4);
    a.v_descale = dev.put(&vf, 4);
  } else if (c.descale == 2) {
    int64_t s0 = hkv + 2, s1 = 1;
    if (c.descale_transposed) s0 = 1, s1 = c.batch + 1;
    const size_t n = size_t((c.batch - 1) * s0 + (hkv - 1) * s1 + 1);
    std::vector<float> kf(n, NAN), vf(n, NAN);
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < hkv; ++h) {
        kf[b * s0 + h * s1] = b == inf_b ? INFINITY : float(kd[size_t(b) * hkv + h]);
        vf[b * s0 + h * s1] = b == inf_b ? INFINITY : float(vd[size_t(b) * hkv + h]);
      }
    a.k_descale = dev.put(kf.data(), n * 4);
    a.v_descale = dev.put(vf.data(), n * 4);
    a.descale_stride[0] = s0;
    a.descale_stride[1] = s1;
  }
  // Descales as the kernel sees them: fp32.
  for (double &x : kd) x = double(float(x));
  for (double &x : vd) x = double(float(x));
  // KV append: new 16-bit K/V rows (padded strides); the expected cache
  // rows lens[b] + t are fp8(rn_f32(x / descale)), x the 16-bit value (K
  // after RoPE, rounded to 16 bits: ref::rope_row), as the kernel writes
  // them; Q rotated the same way for the reference.
  const int sn = c.seqlen_new;
  std::vector<int32_t> lens_ref(c.lens.begin(), c.lens.end());
  if (sn > 0) {
    const int rd = c.rotary ? (c.rotary_dim ? c.rotary_dim : c.d) : 0;
    std::vector<float> cosv, sinv;
    if (rd) {
      for (int pos = 0; pos < sk; ++pos)
        for (int i = 0; i < rd / 2; ++i) {
          const double ang = pos * std::pow(10000.0, -2.0 * i / rd);
          cosv.push_back(float(std::cos(ang)));
          sinv.push_back(float(std::sin(ang)));
        }
      a.rotary_dim = rd;
      a.rotary_cos = dev.put(cosv.data(), cosv.size() * 4);
      a.rotary_sin = dev.put(sinv.data(), sinv.size() * 4);
      a.seqlen_ro = sk;
      a.rotary_interleaved = c.rotary == 2;
      // Q: position lens[b] + i when causal or windowed, else lens[b].
      std::vector<float> row(static_cast<size_t>(c.d));
      for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < sq; ++i)
          for (int h = 0; h < hq; ++h) {
            const size_t o = ((size_t(b) * sq + i) * hq + h) * c.d;
            const int pos = c.lens[b] + (c.causal || c.window_left >= 0 ? i : 0);
            for (int x = 0; x < c.d; ++x) row[x] = float(q[o + x]);
            fa::ref::rope_row(row.data(), rd, c.rotary == 2, &cosv[size_t(pos) * (rd / 2)],
                              &sinv[size_t(pos) * (rd / 2)], c.bf16);
            for (int x = 0; x < c.d; ++x) q[o + x] = row[x];
          }
    }
    for (int kv = 0; kv < 2; ++kv) {
      const int w = kv ? dv : c.d;
      fa_tensor t{};
      t.stride[3] = 1;
      t.stride[2] = w + 8;
      t.stride[1] = int64_t(hkv) * t.stride[2];
      t.stride[0] = int64_t(sn) * t.stride[1] + 8;
      std::vector<uint16_t> bits(size_t(c.batch) * t.stride[0], 0x7fff);  // NaN gaps
      std::vector<float> row(static_cast<size_t>(w));
      std::vector<uint8_t> &codes = kv ? vc : kc;
      std::vector<double> &vals = kv ? v : k;
      const std::vector<double> &ds = kv ? vd : kd;
      for (int b = 0; b < c.batch; ++b)
        for (int tk = 0; tk < sn; ++tk)
          for (int h = 0; h < hkv; ++h) {
            uint16_t *src = &bits[b * t.stride[0] + tk * t.stride[1] + h * t.stride[2]];
            for (int x = 0; x < w; ++x) {
              src[x] = to16(nd(gen) * (0.5 + h) * c.new_scale, c.bf16);
              row[x] = float(from16(src[x], c.bf16));
            }
            const int pos = c.lens[b] + tk;
            if (!kv && rd)
              fa::ref::rope_row(row.data(), rd, c.rotary == 2, &cosv[size_t(pos) * (rd / 2)],
                                &sinv[size_t(pos) * (rd / 2)], c.bf16);
            const float scale = float(ds[size_t(b) * hkv + h]);
            for (int x = 0; x < w; ++x) {
              const size_t i = ((size_t(b) * sk + pos) * hkv + h) * w + x;
              const float y = row[x] / scale;  // rn f32, as div.rn.f32
              codes[i] = fa::ref::fp8_from_double(double(y), c.e5m2);
              vals[i] = fa::ref::fp8_to_double(codes[i], c.e5m2) * double(scale);
            }
          }
      t.data = dev.put(bits.data(), bits.size() * 2);
      (kv ? a.v_new : a.k_new) = t;
    }
    a.seqlen_new = sn;
    for (int b = 0; b < c.batch; ++b) lens_ref[b] += sn;
  }
  std::vector<uint8_t> tree;
  if (c.tree) {
    tree.resize(size_t(c.batch) * sq * sq);
    std::uniform_int_distribution<int> coin(0, 2);
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < sq; ++i)
        for (int j = 0; j < sq; ++j)
          tree[(size_t(b) * sq + i) * sq + j] = j == i || (j < i && coin(gen) != 0);
    const int words = (sq + 31) / 32;
    const std::vector<uint32_t> packed = fa::test::pack_tree_mask(tree, c.batch * sq, sq, words);
    a.tree_mask = dev.put(packed.data(), packed.size() * 4);
    a.tree_mask_stride[1] = int64_t(words) * 4;
    a.tree_mask_stride[0] = int64_t(sq) * a.tree_mask_stride[1];
  }
  std::vector<float> slopes;  // c.alibi: [batch][hq], stride hq
  if (c.alibi) {
    std::uniform_real_distribution<float> ua(0.01f, 0.5f);
    for (int i = 0; i < c.batch * hq; ++i) slopes.push_back(ua(gen));
    a.alibi_slopes = dev.put(slopes.data(), slopes.size() * 4);
    a.alibi_slopes_stride = hq;
  }
  std::vector<float> sinks;
  uint64_t sinks_dev = 0;
  if (c.sinks) {
    std::uniform_real_distribution<float> us(-1.0f, 4.0f);
    for (int h = 0; h < hq; ++h) sinks.push_back(h == 1 ? -INFINITY : us(gen));
    sinks_dev = dev.put(sinks.data(), sinks.size() * 4);
  }
  fa_tensor o{};
  o.stride[3] = 1;
  o.stride[2] = dv;
  o.stride[1] = int64_t(hq) * dv;
  o.stride[0] = int64_t(sq) * hq * dv;
  const size_t on = size_t(c.batch) * sq * hq * dv, ln = size_t(c.batch) * hq * sq;
  o.data = dev.put(nullptr, on * 2);
  const uint64_t lse = dev.put(nullptr, ln * 4);
  size_t ws = 0;
  int32_t splits = 0;
  dev.check(fa_decode_workspace_size(rt, dev.cfg, &a, &ws, &splits), "workspace size");
  a.workspace = dev.put(nullptr, ws);
  a.workspace_size = ws;
  if (!dev.err.empty()) return dev.err;
  dev.check(fa_memset(rt, o.data, 0xFF, on * 2), "poison O");
  dev.check(fa_memset(rt, lse, 0xFF, ln * 4), "poison LSE");
  dev.check(fa_memset(rt, a.workspace, 0xFF, ws), "poison workspace");
  if (c.reject) {
    a.o = o;
    a.lse = lse;
    a.sinks = sinks_dev;
    c.reject->decode(&a);
    std::string err = check_reject(fa_decode(rt, dev.cfg, &a, nullptr), *c.reject, "fa_decode");
    std::vector<uint16_t> ob(on);
    dev.check(fa_memcpy_dtoh(rt, ob.data(), o.data, on * 2), "download O");
    if (std::count(ob.begin(), ob.end(), uint16_t(0xFFFF)) != std::ptrdiff_t(on))
      err += "O written by a refused call\n";
    return err + dev.err;
  }
  std::string err;
  const char *want = c.e5m2 ? "_kve5m2" : "_kve4m3";
  if (c.direct) {
    a.o = o;
    a.lse = lse;
    a.sinks = sinks_dev;
    dev.check(fa_decode(rt, dev.cfg, &a, nullptr), "fa_decode");
    // The combine ran last (with the sinks when given).
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, "fa_reduce_") == nullptr ||
        (c.sinks && std::strstr(prof.kernel, "_sinks") == nullptr))
      err += std::string("the combine ran ") + prof.kernel + "\n";
  } else {
    // The decode kernel alone (profiled: its name and counters), then the combine.
    dev.check(fa_decode(rt, dev.cfg, &a, nullptr), "fa_decode (partials)");
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, c.kernel) != prof.kernel ||
        std::strstr(prof.kernel, want) == nullptr ||
        (std::strstr(prof.kernel, "_f8mma") != nullptr) != c.fp8_mma)
      err += std::string("ran ") + prof.kernel + ", not " + c.kernel + "..." + want +
             (c.fp8_mma ? "..._f8mma" : " (mode (a))") + "\n";
    std::printf("    %s, splits %d, cp.async sectors %llu\n", prof.kernel, splits,
                static_cast<unsigned long long>(prof.total.cp_async_sectors));
    if (counters) *counters = prof.total;
    fa_reduce_args r = FA_REDUCE_ARGS_INIT;
    r.num_splits = splits;
    r.batch = c.batch;
    r.seqlen_q = sq;
    r.o_partial = a.workspace;
    const size_t ob = size_t(splits) * on * 4;
    r.lse_partial = a.workspace + (ob + 255) / 256 * 256;
    r.o_partial_stride[4] = 1;
    r.o_partial_stride[3] = dv;
    r.o_partial_stride[2] = int64_t(hq) * dv;
    r.o_partial_stride[1] = int64_t(sq) * hq * dv;
    r.o_partial_stride[0] = int64_t(c.batch) * sq * hq * dv;
    r.lse_partial_stride[3] = 1;
    r.lse_partial_stride[2] = sq;
    r.lse_partial_stride[1] = int64_t(hq) * sq;
    r.lse_partial_stride[0] = int64_t(c.batch) * hq * sq;
    r.o = o;
    r.lse = lse;
    r.sinks = sinks_dev;
    dev.check(fa_decode_reduce(rt, dev.cfg, &r, nullptr), "fa_decode_reduce");
  }
  dev.check(fa_synchronize(rt, nullptr), "fa_synchronize");
  if (!dev.err.empty()) return err + dev.err;
  if (sn > 0) {
    // Every byte of both caches: the appended rows bit for bit, the rest
    // (old rows, rows past the new length, gaps, spare pages) unchanged.
    for (int kv = 0; kv < 2; ++kv) {
      fa_tensor t{};
      const std::vector<std::vector<uint8_t>> want =
          images(c, kv ? vc : kc, kv ? dv : c.d, table, max_pages, num_pages, &t);
      const std::vector<uint64_t> &al = kv ? v_allocs : k_allocs;
      long long bad = 0, first = -1;
      for (size_t i = 0; i < want.size(); ++i) {
        std::vector<uint8_t> got(want[i].size());
        dev.check(fa_memcpy_dtoh(rt, got.data(), al[i], got.size()), "download cache");
        for (size_t j = 0; j < got.size(); ++j)
          if (got[j] != want[i][j]) {
            if (first < 0) first = (long long)j;
            ++bad;
          }
      }
      if (bad)
        err += std::string(kv ? "V" : "K") + " cache: " + std::to_string(bad) +
               " bytes differ from the host quantisation / the old contents (first at " +
               std::to_string(first) + ")\n";
    }
    if (c.odd_descales) return err + dev.err;
  }
  std::vector<uint16_t> ob(on);
  std::vector<float> lg(ln), og(on);
  dev.check(fa_memcpy_dtoh(rt, ob.data(), o.data, on * 2), "download O");
  dev.check(fa_memcpy_dtoh(rt, lg.data(), lse, ln * 4), "download LSE");
  for (size_t i = 0; i < on; ++i) og[i] = float(from16(ob[i], c.bf16));

  fa::ref::Problem p;
  p.batch = c.batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = c.d;
  p.head_dim_v = dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.softcap = c.softcap;
  if (c.tree) p.tree_mask = tree.data();
  if (c.sinks) p.sinks = sinks.data();
  if (c.alibi) {
    p.alibi_slopes = slopes.data();
    p.alibi_stride = hq;
  }
  // Rows past a sequence's length are NaN in the reference's inputs too
  // (zeros here: the reference never reads them, lens bound it).
  std::vector<double> o_ref(on), lse_ref(ln);
  fa::ref::attention(p, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(),
                     lens_ref.data());
  // Mode (b) (c.fp8_mma): the yardstick runs on Q rounded per row to e4m3
  // as the kernel rounds it, with P in e4m3 (its error against fp64 is the
  // error of those two roundings, about 2^-4 relative per element); the
  // rule stays twice it. LSE: the fp64 attention on that Q, whose LSE error
  // is the Q rounding's; twice it, at least 2e-3. rel_l2: twice the
  // yardstick's, at least 1e-2.
  const std::vector<double> qy = c.fp8_mma ? q_rows_e4m3(q, c.d) : q;
  const std::vector<double> o_low = lowp(p, qy, k, v, c.bf16, lens_ref.data(), c.fp8_mma);
  const fa::ref::ErrorStats e = fa::ref::compare(og.data(), o_ref.data(), on);
  std::vector<float> lowf(o_low.begin(), o_low.end());
  const fa::ref::ErrorStats base = fa::ref::compare(lowf.data(), o_ref.data(), on);
  const double tol = 2.0 * base.max_abs + 1e-5;
  const double l2_tol = c.fp8_mma ? std::max(1e-2, 2.0 * base.rel_l2) : 1e-2;
  auto lse_error = [&](const auto &got, long long *bad) {
    double err = 0;
    for (size_t i = 0; i < ln; ++i) {
      if (std::isinf(lse_ref[i])) {
        *bad += !(std::isinf(got[i]) && got[i] < 0);
      } else if (!std::isfinite(got[i])) {
        ++*bad;
      } else {
        err = std::max(err, std::fabs(got[i] - lse_ref[i]) / std::max(1.0, std::fabs(lse_ref[i])));
      }
    }
    return err;
  };
  double lse_tol = 2e-3;
  if (c.fp8_mma) {
    std::vector<double> o_q(on), lse_q(ln);
    fa::ref::attention(p, qy.data(), k.data(), v.data(), o_q.data(), lse_q.data(), lens_ref.data());
    long long ignored = 0;
    lse_tol = std::max(lse_tol, 2.0 * lse_error(lse_q, &ignored));
  }
  long long lse_bad = 0;
  const double lse_err = lse_error(lg, &lse_bad);
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "O max_abs %.3g (tol %.3g), rel_l2 %.3g (tol %.3g), max|ref| %.3g, lse err %.3g "
                "(tol %.3g)",
                e.max_abs, tol, e.rel_l2, l2_tol, e.max_ref, lse_err, lse_tol);
  std::printf("    %s\n", buf);
  if (e.nonfinite)
    err += std::string(buf) + " | non-finite/unwritten O: " + std::to_string(e.nonfinite) + "\n";
  if (e.max_abs > tol) err += std::string(buf) + " | max_abs over tolerance\n";
  if (e.rel_l2 >= l2_tol) err += std::string(buf) + " | rel_l2 over tolerance\n";
  if (lse_bad)
    err += std::string(buf) + " | LSE wrong/unwritten: " + std::to_string(lse_bad) + "\n";
  if (lse_err > lse_tol) err += std::string(buf) + " | LSE error over tolerance\n";
  return err + dev.err;
}

Case base(int b, int sq, int sk, int hq, int hkv, int d, uint32_t seed) {
  Case c;
  c.batch = b;
  c.seqlen_q = sq;
  c.skmax = sk;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.seed = seed;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> len(std::max(1, sk / 2), sk);
  for (int i = 0; i < b; ++i) c.lens.push_back(len(gen));
  c.lens[0] = sk;
  return c;
}

}  // namespace fa::test::fp8kv
