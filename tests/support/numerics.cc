#include "support/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "reference.h"

namespace fa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The byte O and LSE are filled with before a launch: 0xFF, NaN in fp16,
// bf16 and fp32 (an unwritten element reads as non-finite), unless a result
// may be NaN (a NaN sink or partial state: flashattn.h's formula gives O =
// NaN, LSE = NaN), where a NaN poison would pass for a written NaN: then
// 0x7B, finite (61280 in fp16, about 1.3e36 in bf16 and fp32) and far from
// every result.
uint8_t poison_byte(bool nan_results) { return nan_results ? 0x7B : 0xFF; }
bool any_nan(const std::vector<float> &x) {
  return std::any_of(x.begin(), x.end(), [](float f) { return std::isnan(f); });
}

// got matches a reference value that is not finite: NaN for NaN, the same
// infinity for an infinity.
bool same_nonfinite(double got, double want) {
  return std::isnan(want) ? std::isnan(got) : got == want;
}

// Reference elements that are not finite (the rows of a NaN sink) must be
// matched by got (same_nonfinite); they are then set to 0 in got, ref and
// (when given) lowp, so that the error statistics cover the finite ones.
// Returns the number of mismatches.
long long take_nonfinite(std::vector<float> *got, std::vector<double> *ref,
                         std::vector<double> *lowp) {
  long long bad = 0;
  for (size_t i = 0; i < ref->size(); ++i) {
    if (std::isfinite((*ref)[i])) continue;
    if (!same_nonfinite((*got)[i], (*ref)[i])) ++bad;
    (*got)[i] = 0, (*ref)[i] = 0;
    if (lowp) (*lowp)[i] = 0;
  }
  return bad;
}

// A device tensor [b, s, h, d] of 16-bit elements with optional gaps, plus
// its host copy as rounded doubles in contiguous order.
struct DevTensor {
  uint64_t ptr = 0;
  fa_tensor view{};
  size_t elems = 0;  // allocation size in elements
};

struct Ctx;
void set_workspace(Ctx &ctx, const fa_config *cfg, uint64_t ws, size_t size, uint8_t poison,
                   fa_forward_args *a);

struct Ctx {
  fa_runtime *rt;
  std::vector<uint64_t> allocs;
  std::string err;
  explicit Ctx(fa_runtime *r) : rt(r) {}
  fa_config *cfg = nullptr;  // the case's config, destroyed with the context
  ~Ctx() {
    for (uint64_t p : allocs) fa_free(rt, p);
    fa_config_destroy(cfg);
  }
  bool check(fa_status st, const char *what) {
    if (st == FA_SUCCESS) return true;
    if (err.empty()) err = std::string(what) + ": " + fa_last_error();
    return false;
  }
  uint64_t alloc(size_t bytes) {
    uint64_t p = 0;
    if (!check(fa_malloc(rt, std::max<size_t>(bytes, 16), &p), "fa_malloc")) return 0;
    allocs.push_back(p);
    return p;
  }
};

// fa_forward_args.workspace: ws and size as given, or for kAutoWorkspace
// what fa_forward_workspace_size asks for (numerics.h).
void set_workspace(Ctx &ctx, const fa_config *cfg, uint64_t ws, size_t size, uint8_t poison,
                   fa_forward_args *a) {
  a->workspace = ws;
  a->workspace_size = size;
  if (ws != kAutoWorkspace) return;
  a->workspace = 0;
  a->workspace_size = 0;
  size_t bytes = 0;
  if (!ctx.check(fa_forward_workspace_size(ctx.rt, cfg, a, &bytes), "fa_forward_workspace_size") ||
      bytes == 0)
    return;
  a->workspace = ctx.alloc(bytes);
  a->workspace_size = bytes;
  ctx.check(fa_memset(ctx.rt, a->workspace, 0, std::min<size_t>(bytes, 256)), "zero workspace");
  if (bytes > 256)
    ctx.check(fa_memset(ctx.rt, a->workspace + 256, poison, bytes - 256), "poison workspace");
}

std::vector<float> random_normal(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float &x : out) x = dist(gen) * scale;
  return out;
}

uint16_t to_bits(float x, bool bf16) { return bf16 ? ref::f32_to_bf16(x) : ref::f32_to_f16(x); }
float from_bits(uint16_t h, bool bf16) { return bf16 ? ref::bf16_to_f32(h) : ref::f16_to_f32(h); }

// Strides for [b, s, h, d]; padded adds gaps at every level (multiples of 8).
fa_tensor make_view(uint64_t ptr, int s, int h, int d, bool padded) {
  fa_tensor t;
  t.data = ptr;
  t.stride[3] = 1;
  t.stride[2] = padded ? d + 8 : d;
  t.stride[1] = int64_t(h) * t.stride[2] + (padded ? 16 : 0);
  t.stride[0] = int64_t(s) * t.stride[1] + (padded ? 24 : 0);
  return t;
}

size_t view_elems(const fa_tensor &t, int b) { return size_t(b) * size_t(t.stride[0]); }

size_t offset(const fa_tensor &t, int b, int s, int h, int d) {
  return size_t(b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d);
}

// Uploads host values [b, s, h, d] (contiguous) rounded to dtype into a new
// device tensor with view `t` (data filled in); returns the rounded doubles.
std::vector<double> upload(Ctx &ctx, const std::vector<float> &host, int b, int s, int h, int d,
                           bool bf16, bool padded, fa_tensor *t) {
  fa_tensor v = make_view(0, s, h, d, padded);
  const size_t n = view_elems(v, b);
  std::vector<uint16_t> dev(n, to_bits(7.0f, bf16));  // gaps hold a finite filler
  std::vector<double> rounded(host.size());
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < s; ++is)
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id) {
          const size_t src = ((size_t(ib) * s + is) * h + ih) * d + id;
          const uint16_t bits = to_bits(host[src], bf16);
          dev[offset(v, ib, is, ih, id)] = bits;
          rounded[src] = from_bits(bits, bf16);
        }
  v.data = ctx.alloc(n * 2);
  if (v.data) ctx.check(fa_memcpy_htod(ctx.rt, v.data, dev.data(), n * 2), "upload");
  *t = v;
  return rounded;
}

// The fp8 forward's inputs: host values [b, s, h, d] divided by the descale
// of their (sequence, KV head), rounded to the nearest fp8 (saturating, as
// cvt.rn.satfinite) into a new device tensor of bytes with view *t (padded:
// gaps of whole 16-byte granules at every level); returns the dequantised
// values fp8(byte) * descale, which the references take. seq (varlen: the
// sequence of each packed row, else empty: the batch index); group: heads
// per descale (the GQA group for Q, 1 for K and V); ds [sequence][hkv].
std::vector<double> upload_fp8(Ctx &ctx, const std::vector<float> &host, int b, int s, int h, int d,
                               bool e5m2, bool padded, const std::vector<double> &ds, int hkv,
                               int group, const std::vector<int> &seq, fa_tensor *t) {
  fa_tensor v;
  v.data = 0;
  v.stride[3] = 1;
  v.stride[2] = padded ? d + 16 : d;
  v.stride[1] = int64_t(h) * v.stride[2] + (padded ? 32 : 0);
  v.stride[0] = int64_t(s) * v.stride[1] + (padded ? 48 : 0);
  const size_t n = view_elems(v, b);
  std::vector<uint8_t> dev(n, ref::fp8_from_double(7.0, e5m2));  // gaps: a finite filler
  std::vector<double> rounded(host.size());
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < s; ++is)
      for (int ih = 0; ih < h; ++ih) {
        const double dsc = ds[size_t(seq.empty() ? ib : seq[is]) * hkv + ih / group];
        for (int id = 0; id < d; ++id) {
          const size_t src = ((size_t(ib) * s + is) * h + ih) * d + id;
          const uint8_t byte = ref::fp8_from_double(host[src] / dsc, e5m2);
          dev[offset(v, ib, is, ih, id)] = byte;
          rounded[src] = ref::fp8_to_double(byte, e5m2) * dsc;
        }
      }
  v.data = ctx.alloc(n);
  if (v.data) ctx.check(fa_memcpy_htod(ctx.rt, v.data, dev.data(), n), "upload fp8");
  *t = v;
  return rounded;
}

// The fp8 forward's descales: fills (*ds)[which] [batch][hkv] (Q, K, V) and
// sets a's pointers and descale_stride per ForwardCase::descale.
void fp8_descales(Ctx &ctx, const ForwardCase &c, std::vector<double> ds[3], fa_forward_args *a) {
  std::mt19937 gen(c.seed + 77);
  std::uniform_real_distribution<double> uf(0.5, 2.0);
  const int nb = c.batch, hkv = c.heads_kv;
  uint64_t *ptr[3] = {&a->q_descale, &a->k_descale, &a->v_descale};
  for (int w = 0; w < 3; ++w) {
    const bool e5m2 = (w == 0 ? c.q_fp8 : c.kv_fp8) == FA_DTYPE_FP8_E5M2;
    // Values of magnitude up to ~4 (N(0, 1) inputs) land near 448 / 57344.
    const double unit = 4.0 / ref::fp8_max(e5m2);
    ds[w].assign(size_t(nb) * hkv, 1.0);
    if (c.descale == 0) continue;
    if (c.descale == 1)
      std::fill(ds[w].begin(), ds[w].end(), unit * uf(gen));
    else
      for (double &x : ds[w]) x = unit * uf(gen);
    std::vector<float> dev;
    if (c.descale == 1) {
      dev = {float(ds[w][0])};
    } else if (c.descale == 2) {  // [batch][hkv + 1]: a gap after each row
      dev.assign(size_t(nb) * (hkv + 1), NAN);
      for (int b = 0; b < nb; ++b)
        for (int h = 0; h < hkv; ++h)
          dev[size_t(b) * (hkv + 1) + h] = float(ds[w][size_t(b) * hkv + h]);
    } else {  // [hkv][batch]
      dev.assign(size_t(nb) * hkv, NAN);
      for (int b = 0; b < nb; ++b)
        for (int h = 0; h < hkv; ++h) dev[size_t(h) * nb + b] = float(ds[w][size_t(b) * hkv + h]);
    }
    for (size_t i = 0; i < ds[w].size(); ++i) ds[w][i] = double(float(ds[w][i]));  // as stored
    if (c.descale == 1) ds[w].assign(ds[w].size(), double(dev[0]));
    *ptr[w] = ctx.alloc(dev.size() * 4);
    ctx.check(fa_memcpy_htod(ctx.rt, *ptr[w], dev.data(), dev.size() * 4), "descale");
  }
  a->descale_stride[0] = c.descale == 2 ? hkv + 1 : c.descale == 3 ? 1 : 0;
  a->descale_stride[1] = c.descale == 2 ? 1 : c.descale == 3 ? nb : 0;
}

}  // namespace

// numerics.h
std::string check_reject(fa_status st, const Reject &r, const char *call) {
  const char *msg = fa_last_error();
  std::printf("    %s refused: status %d, \"%s\"\n", call, int(st), msg);
  std::string err;
  if (st != r.status)
    err += std::string(call) + " returned " + std::to_string(int(st)) + ", not " +
           std::to_string(int(r.status)) + "\n";
  if (std::strstr(msg, r.message.c_str()) == nullptr)
    err += std::string(call) + ": message \"" + msg + "\" lacks \"" + r.message + "\"\n";
  return err;
}

std::vector<double> lowp_attention(const ref::Problem &p, const std::vector<double> &q,
                                   const std::vector<double> &k, const std::vector<double> &v,
                                   bool bf16, const int32_t *seqlens_k, bool p_e4m3) {
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads_q / p.num_heads_kv;
  const double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
  std::vector<double> o(size_t(p.batch) * p.seqlen_q * p.num_heads_q * dv, 0.0);
  std::vector<float> s(size_t(p.seqlen_k));
  for (int b = 0; b < p.batch; ++b) {
    const int sk = seqlens_k ? seqlens_k[b] : p.seqlen_k;
    for (int h = 0; h < p.num_heads_q; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const long long diag = (long long)i + sk - p.seqlen_q;
        long long lo = 0, hi = sk - 1;
        if (p.window_left >= 0) lo = std::max(lo, diag - p.window_left);
        if (p.causal) hi = std::min(hi, diag);
        if (p.window_right >= 0) hi = std::min(hi, diag + p.window_right);
        const float sink = p.sinks ? p.sinks[h] : -INFINITY;
        double *orow = &o[((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * dv];
        if (std::isnan(sink) || sink == INFINITY) {  // O = NaN or 0, as ref::attention
          std::fill(orow, orow + dv, std::isnan(sink) ? double(NAN) : 0.0);
          continue;
        }
        if (lo > hi) continue;  // O = 0 (a sink has no value)
        float m = sink;
        for (long long j = lo; j <= hi; ++j) {
          if (!ref::tree_visible(p, b, i, j, sk)) {
            s[size_t(j)] = -INFINITY;  // weighs nothing below
            continue;
          }
          float dot = 0;
          for (int c = 0; c < d; ++c)
            dot += float(q[((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * d + c] *
                         k[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + h / group) * d + c]);
          float x = dot * float(scale);
          if (p.softcap > 0) x = float(p.softcap) * std::tanh(x / float(p.softcap));
          x -= float(ref::alibi_slope(p, b, h)) * float(std::llabs(diag - j));
          s[size_t(j)] = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;  // every key masked by the tree: O = 0
        float l = sink == -INFINITY ? 0.0f : std::exp(sink - m);
        for (long long j = lo; j <= hi; ++j) {
          s[size_t(j)] = std::exp(s[size_t(j)] - m);
          l += s[size_t(j)];
        }
        // The fp8 forward rounds 2^8 times the unnormalised p to e4m3
        // (tile::OnlineSoftmax::fp8_form) and divides by the f32 l last.
        for (long long j = lo; j <= hi; ++j) {
          s[size_t(j)] = p_e4m3 ? float(ref::fp8_to_double(
                                      ref::fp8_from_double(256.0 * s[size_t(j)], false), false)) /
                                      (256.0f * l)
                                : ref::round_to(s[size_t(j)] / l, bf16);
        }
        for (int c = 0; c < dv; ++c) {
          float acc = 0;
          for (long long j = lo; j <= hi; ++j)
            acc += s[size_t(j)] *
                   float(v[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + h / group) * dv + c]);
          orow[c] = ref::round_to(acc, bf16);
        }
      }
  }
  return o;
}

namespace {

// Compares a downloaded O [rows, dv] (float) and LSE with the references;
// appends problems to err. Where a reference is not finite (NaN O and LSE,
// LSE of +-inf) the result must be the same (same_nonfinite).
// fp8 (the fp8 forward): the relative L2 bound is twice the framework's
// (P in e4m3 carries up to 2^-4 relative error per element) when that is
// above 1e-2.
void judge(const char *what, std::vector<float> o, std::vector<double> o_ref,
           std::vector<double> o_lowp, const std::vector<float> &lse,
           const std::vector<double> &lse_ref, std::string *err, bool fp8 = false) {
  const long long o_nonfinite_bad = take_nonfinite(&o, &o_ref, &o_lowp);
  const ref::ErrorStats e = ref::compare(o.data(), o_ref.data(), o.size());
  std::vector<float> lowp_f(o_lowp.begin(), o_lowp.end());
  const ref::ErrorStats base = ref::compare(lowp_f.data(), o_ref.data(), o.size());
  const double tol = 2.0 * base.max_abs + 1e-5;
  char buf[512];
  double lse_err = 0;
  long long lse_bad = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (!std::isfinite(lse_ref[i])) {
      if (!same_nonfinite(lse[i], lse_ref[i])) ++lse_bad;
      continue;
    }
    if (!std::isfinite(lse[i])) {
      ++lse_bad;
      continue;
    }
    lse_err =
        std::max(lse_err, std::fabs(lse[i] - lse_ref[i]) / std::max(1.0, std::fabs(lse_ref[i])));
  }
  std::snprintf(
      buf, sizeof buf,
      "%s: max_abs %.3g (tol %.3g = 2 x low-precision framework error %.3g), rel_l2 %.3g, "
      "max|ref| %.3g, lse rel err %.3g",
      what, e.max_abs, tol, base.max_abs, e.rel_l2, e.max_ref, lse_err);
  std::printf("    %s\n", buf);
  if (e.nonfinite)
    *err += std::string(buf) +
            " | non-finite or unwritten O elements: " + std::to_string(e.nonfinite) + "\n";
  if (o_nonfinite_bad)
    *err += std::string(buf) + " | O elements not the reference's NaN or infinity: " +
            std::to_string(o_nonfinite_bad) + "\n";
  if (e.max_abs > tol) *err += std::string(buf) + " | max_abs over tolerance\n";
  const double rel_max = fp8 ? std::max(1e-2, 2.0 * base.rel_l2) : 1e-2;
  if (e.rel_l2 >= rel_max)
    *err += std::string(buf) + " | rel_l2 >= " + std::to_string(rel_max) + "\n";
  if (lse_bad)
    *err += std::string(buf) +
            " | LSE wrong non-finite value or unwritten: " + std::to_string(lse_bad) + "\n";
  if (lse_err > 2e-3) *err += std::string(buf) + " | LSE error over 2e-3\n";
}

// After a refused call: the problems if any of `bytes` bytes at ptr no
// longer holds the poison byte.
std::string untouched(Ctx &ctx, uint64_t ptr, size_t bytes, uint8_t poison) {
  std::vector<uint8_t> got(bytes);
  if (bytes) ctx.check(fa_memcpy_dtoh(ctx.rt, got.data(), ptr, bytes), "download O");
  const auto changed =
      std::count_if(got.begin(), got.end(), [&](uint8_t x) { return x != poison; });
  return changed ? "O written by a refused call: " + std::to_string(changed) + " bytes\n" : "";
}

// Downloads O [b, s, h, dv] from view t as floats (contiguous order) and
// checks that every gap byte still holds the poison byte.
std::vector<float> download_o(Ctx &ctx, const fa_tensor &t, int b, int s, int h, int dv, bool bf16,
                              std::string *err, uint8_t poison = 0xFF) {
  const size_t n = view_elems(t, b);
  std::vector<uint16_t> dev(n);
  ctx.check(fa_memcpy_dtoh(ctx.rt, dev.data(), t.data, n * 2), "download O");
  std::vector<float> out(size_t(b) * s * h * dv);
  std::vector<bool> inside(n, false);
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < s; ++is)
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < dv; ++id) {
          const size_t off = offset(t, ib, is, ih, id);
          inside[off] = true;
          out[((size_t(ib) * s + is) * h + ih) * dv + id] = from_bits(dev[off], bf16);
        }
  size_t clobbered = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!inside[i] && dev[i] != poison * 0x101u) ++clobbered;
  }
  if (clobbered) *err += "O written outside its view: " + std::to_string(clobbered) + " elements\n";
  return out;
}

// Downloads the decode workspace's partial states (layout in docs/api.md),
// checks every one was written (O_s finite, LSE_s finite or -inf), merges
// them on the host in fp64 and compares with the reference. The tensor-core
// decode rounds P to the input dtype before P V (as FlashAttention does), so
// the merged O carries that rounding: 2^-8 relative for bf16, 2^-11 for fp16,
// summed over at most a few terms of either sign.
void check_partials(Ctx &ctx, uint64_t ws, int splits, int batch, int sq, int hq, int dv, bool bf16,
                    const std::vector<double> &o_ref, const std::vector<double> &lse_ref,
                    std::string *err, const std::vector<float> &sinks) {
  const size_t rows = size_t(batch) * sq * hq;
  const size_t o_bytes = size_t(splits) * rows * dv * 4;
  const size_t lse_off = (o_bytes + 255) / 256 * 256;
  std::vector<float> op(size_t(splits) * rows * dv), lp(size_t(splits) * rows);
  ctx.check(fa_memcpy_dtoh(ctx.rt, op.data(), ws, o_bytes), "download O_partial");
  ctx.check(fa_memcpy_dtoh(ctx.rt, lp.data(), ws + lse_off, lp.size() * 4), "download LSE_partial");
  long long unwritten = 0, empty = 0;
  std::string where;  // the first unwritten O_partial element, for the report
  for (size_t i = 0; i < op.size(); ++i) {
    if (std::isfinite(op[i])) continue;
    if (!unwritten++) {
      const size_t row = i / dv;  // [split, b, token, head]
      where = " (first: split " + std::to_string(row / rows) + ", batch " +
              std::to_string(row % rows / (size_t(sq) * hq)) + ", token " +
              std::to_string(row % (size_t(sq) * hq) / hq) + ", head " + std::to_string(row % hq) +
              ", column " + std::to_string(i % dv) + ")";
    }
  }
  std::vector<double> opd(op.begin(), op.end()), lpd(lp.size());
  // LSE_partial is [split, b, h, s]; the merge wants [split, row(b, s, h)].
  for (int s = 0; s < splits; ++s)
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < hq; ++h)
        for (int i = 0; i < sq; ++i) {
          const float l = lp[((size_t(s) * batch + b) * hq + h) * sq + i];
          if (std::isnan(l) || (std::isinf(l) && l > 0)) ++unwritten;
          if (std::isinf(l)) ++empty;
          lpd[size_t(s) * rows + (size_t(b) * sq + i) * hq + h] = l;
        }
  std::vector<double> om(rows * dv), lm(rows);
  // The partial states never hold the sinks: they join in the merge.
  std::vector<double> row_sinks;
  for (size_t r = 0; r < rows && !sinks.empty(); ++r) row_sinks.push_back(sinks[r % hq]);
  ref::merge_states(splits, int(rows), dv, opd.data(), lpd.data(), om.data(), lm.data(),
                    sinks.empty() ? nullptr : row_sinks.data());
  std::vector<float> omf(om.begin(), om.end());
  std::vector<double> oref = o_ref;  // NaN rows (a NaN sink) must merge to NaN
  const long long o_nonfinite_bad = take_nonfinite(&omf, &oref, nullptr);
  const ref::ErrorStats e = ref::compare(omf.data(), oref.data(), omf.size());
  double lse_err = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < sq; ++i) {
        const double want = lse_ref[(size_t(b) * hq + h) * sq + i];
        const double got = lm[(size_t(b) * sq + i) * hq + h];
        if (!std::isfinite(want) || !std::isfinite(got))
          lse_err = same_nonfinite(got, want) ? lse_err : INFINITY;
        else  // past the 1e-4 below, a few f32 ulp of a large LSE (scores of
              // 1e9 and more: the partial LSE is an f32)
          lse_err = std::max(lse_err, std::fabs(got - want) - std::fabs(want) * 0x1p-20);
      }
  std::printf("    partial states: %lld empty split rows, merged max_abs %.3g, lse err %.3g\n",
              empty, e.max_abs, lse_err);
  if (unwritten) *err += "partial states unwritten: " + std::to_string(unwritten) + where + "\n";
  const double o_tol = (bf16 ? 4e-3 : 5e-4) * std::max(1.0, e.max_ref);
  if (e.nonfinite || o_nonfinite_bad || e.max_abs > o_tol) {
    *err += "merged partial O off: max_abs " + std::to_string(e.max_abs) + "\n";
  }
  if (lse_err > 1e-4) *err += "merged partial LSE off: " + std::to_string(lse_err) + "\n";
}

// Creates the config for a case; false (with ctx.err set) on failure.
bool create_config(Ctx &ctx, bool bf16, int d, int dv, int hq, int hkv, bool causal, int wl, int wr,
                   float softcap, float scale, fa_config **cfg, int q_fp8 = 0, int kv_fp8 = 0) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.q_dtype = q_fp8;
  desc.kv_dtype = kv_fp8;
  desc.dtype = bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  desc.head_dim = d;
  desc.head_dim_v = dv;
  desc.num_heads_q = hq;
  desc.num_heads_kv = hkv;
  desc.causal = causal;
  desc.window_left = wl;
  desc.window_right = wr;
  desc.softcap = softcap;
  desc.softmax_scale = scale;
  return ctx.check(fa_config_create(&desc, cfg), "fa_config_create");
}

}  // namespace

namespace {
// " scale<x>" for a case's explicit softmax_scale.
std::string scale_note(float scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, " scale%g", double(scale));
  return buf;
}
}  // namespace

std::string ForwardCase::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "forward %s b%d sq%d sk%d hq%d hkv%d d%d dv%d%s wl%d wr%d softcap%g%s%s",
                bf16 ? "bf16" : "fp16", batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                head_dim_v ? head_dim_v : head_dim, causal ? " causal" : "", window_left,
                window_right, softcap, padded_strides ? " strided" : "", varlen ? " varlen" : "");
  std::string out = buf;
  if (varlen && varlen_first_row) out += " first_row" + std::to_string(varlen_first_row);
  if (!sinks.empty()) out += " sinks";
  if (!alibi.empty()) out += " alibi" + (alibi_stride ? "/" + std::to_string(alibi_stride) : "");
  if (softmax_scale != 0) out += scale_note(softmax_scale);
  if (q_fp8 || kv_fp8)
    out += std::string(" q_") + (q_fp8 == FA_DTYPE_FP8_E5M2 ? "e5m2" : "e4m3") + " kv_" +
           (kv_fp8 == FA_DTYPE_FP8_E5M2 ? "e5m2" : "e4m3") + " descale" + std::to_string(descale);
  return out;
}

std::string KvCase::describe() const {
  switch (layout) {
    case FA_KV_PAGED:
      return " paged" + std::to_string(page_size) + (hnd ? " hnd" : "") +
             (share_prefix ? " shared-prefix" : "");
    case FA_KV_PTR_ARRAY:
      return " ptrs";
    default:
      return "";
  }
}

std::string DecodeCase::describe() const {
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "%s %s b%d sq%d skmax%d hq%d hkv%d d%d dv%d%s wl%d softcap%g splits%d%s%s",
      prefill ? "prefill" : "decode", bf16 ? "bf16" : "fp16", batch, seqlen_q, seqlen_k_max,
      heads_q, heads_kv, head_dim, head_dim_v ? head_dim_v : head_dim, causal ? " causal" : "",
      window_left, softcap, num_splits, kv.describe().c_str(), batch_invariant ? " invariant" : "");
  std::string d = buf;
  if (!prefill_q.empty()) d += " cu_seqlens_q";
  if (prefill_fixed) d += " fixed";
  if (!tree.empty()) {
    d += tree_shared ? " tree(shared" : " tree(";
    d += tree_pad_words ? " +" + std::to_string(tree_pad_words) + "w)" : ")";
  }
  if (!sinks.empty()) d += " sinks";
  if (!alibi.empty()) d += " alibi" + (alibi_stride ? "/" + std::to_string(alibi_stride) : "");
  if (softmax_scale != 0) d += scale_note(softmax_scale);
  if (seqlen_new) d += " append" + std::to_string(seqlen_new);
  if (v_in_k) d += " v_in_k";
  if (split_counters) d += " split_counters";
  if (calls > 1) d += " calls" + std::to_string(calls);
  if (counters_preset) d += " counters_preset" + std::to_string(counters_preset);
  if (rotary_dim)
    d += std::string(" rope") + (rotary_interleaved ? "-gptj" : "-neox") +
         std::to_string(rotary_dim) + (rotary_half_table ? " table16" : "") +
         (rotary_positions ? " positions" : "");
  return d;
}

std::vector<uint32_t> pack_tree_mask(const std::vector<uint8_t> &bits, int rows, int seqlen_q,
                                     int row_words) {
  std::vector<uint32_t> out(size_t(rows) * row_words, 0);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < seqlen_q; ++j)
      if (bits[size_t(r) * seqlen_q + j]) out[size_t(r) * row_words + j / 32] |= 1u << (j % 32);
  return out;
}

namespace {

// The page assignment of a paged case: sequence b's page i is
// table[b * max_pages + i], pages shuffled, plus spare pages no sequence
// uses (filled with NaN: a kernel that reads one poisons its output).
struct Pages {
  int num_pages = 0, max_pages = 0;
  std::vector<int32_t> table;
};

Pages make_pages(const KvCase &kv, int batch, int seqlen_k_max) {
  Pages pg;
  pg.max_pages = (seqlen_k_max + kv.page_size - 1) / kv.page_size;
  const int used = batch * pg.max_pages, spare = 3;
  pg.num_pages = used + spare;
  std::vector<int32_t> perm(pg.num_pages);
  for (int i = 0; i < pg.num_pages; ++i) perm[i] = i;
  std::mt19937 gen(kv.seed);
  std::shuffle(perm.begin(), perm.end(), gen);
  pg.table.assign(perm.begin(), perm.begin() + used);
  if (kv.share_prefix && batch >= 2) pg.table[pg.max_pages] = pg.table[0];
  return pg;
}

// The case's cache values host [b, skmax, h, d] (rows past a sequence's
// length NaN) as the layout stores them, rounded to dtype; *t gets the view
// (paged: of the page pool; pointer array: data 0 and *ptrs the device
// array of per-sequence pointers).
void place_kv(Ctx &ctx, const std::vector<float> &host, int b, int skmax, int h, int d, bool bf16,
              const KvCase &kv, const Pages &pg, fa_tensor *t, uint64_t *ptrs) {
  if (kv.layout == FA_KV_PTR_ARRAY) {
    // One allocation per sequence, rows padded to d + 8.
    fa_tensor v = make_view(0, skmax, h, d, true);
    std::vector<uint64_t> p(b);
    for (int ib = 0; ib < b; ++ib) {
      std::vector<uint16_t> dev(size_t(v.stride[0]), to_bits(NAN, bf16));
      for (int is = 0; is < skmax; ++is)
        for (int ih = 0; ih < h; ++ih)
          for (int id = 0; id < d; ++id)
            dev[offset(v, 0, is, ih, id)] =
                to_bits(host[((size_t(ib) * skmax + is) * h + ih) * d + id], bf16);
      p[ib] = ctx.alloc(dev.size() * 2);
      if (p[ib]) ctx.check(fa_memcpy_htod(ctx.rt, p[ib], dev.data(), dev.size() * 2), "upload");
    }
    *ptrs = ctx.alloc(size_t(b) * 8);
    if (*ptrs) ctx.check(fa_memcpy_htod(ctx.rt, *ptrs, p.data(), p.size() * 8), "k/v ptrs");
    v.data = 0;
    *t = v;
    return;
  }
  // Pages: NHD [P, ps, h, d] or HND [P, h, ps, d], rows padded by 8.
  const int ps = kv.page_size;
  fa_tensor v;
  v.stride[3] = 1;
  if (kv.hnd) {
    v.stride[1] = d + 8;
    v.stride[2] = int64_t(ps) * v.stride[1];
    v.stride[0] = int64_t(h) * v.stride[2] + 8;
  } else {
    v.stride[2] = d + 8;
    v.stride[1] = int64_t(h) * v.stride[2];
    v.stride[0] = int64_t(ps) * v.stride[1] + 16;
  }
  const size_t n = size_t(pg.num_pages) * size_t(v.stride[0]);
  std::vector<uint16_t> dev(n, to_bits(NAN, bf16));
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < skmax; ++is) {
      const int page = pg.table[size_t(ib) * pg.max_pages + is / ps];
      if (kv.share_prefix && ib == 1 && is < ps) continue;  // sequence 0 wrote this page
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id)
          dev[size_t(page) * v.stride[0] + size_t(is % ps) * v.stride[1] + ih * v.stride[2] + id] =
              to_bits(host[((size_t(ib) * skmax + is) * h + ih) * d + id], bf16);
    }
  v.data = ctx.alloc(n * 2);
  if (v.data) ctx.check(fa_memcpy_htod(ctx.rt, v.data, dev.data(), n * 2), "upload pages");
  *t = v;
}

// Sets a's (decode or forward) kv fields for kc; k/v are placed by the caller.
void set_kv_args(Ctx &ctx, const KvCase &kc, const Pages &pg, int batch, fa_kv_cache_layout *kv) {
  kv->layout = kc.layout;
  if (kc.layout != FA_KV_PAGED) return;
  kv->page_size = kc.page_size;
  kv->num_pages = pg.num_pages;
  kv->max_pages_per_seq = pg.max_pages;
  kv->block_table_stride = pg.max_pages + 5;  // rows with unused tails
  std::vector<int32_t> t(size_t(batch) * kv->block_table_stride, -1);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < pg.max_pages; ++i)
      t[size_t(b) * kv->block_table_stride + i] = pg.table[size_t(b) * pg.max_pages + i];
  kv->block_table = ctx.alloc(t.size() * 4);
  if (kv->block_table)
    ctx.check(fa_memcpy_htod(ctx.rt, kv->block_table, t.data(), t.size() * 4), "block_table");
}

}  // namespace

ForwardCase forward_case(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                         int head_dim, int head_dim_v, bool bf16, bool causal, int wl, int wr,
                         float cap, uint32_t seed) {
  ForwardCase c;
  c.batch = batch, c.seqlen_q = seqlen_q, c.seqlen_k = seqlen_k;
  c.heads_q = heads_q, c.heads_kv = heads_kv, c.head_dim = head_dim, c.head_dim_v = head_dim_v;
  c.bf16 = bf16, c.causal = causal, c.window_left = wl, c.window_right = wr, c.softcap = cap;
  c.seed = seed;
  return c;
}

ForwardCase varlen_case(const std::vector<int> &sq, const std::vector<int> &sk, int heads_q,
                        int heads_kv, int head_dim, int head_dim_v, bool bf16, bool causal, int wl,
                        float cap, uint32_t seed) {
  ForwardCase c = forward_case(static_cast<int>(sq.size()), *std::max_element(sq.begin(), sq.end()),
                               *std::max_element(sk.begin(), sk.end()), heads_q, heads_kv,
                               head_dim, head_dim_v, bf16, causal, wl, -1, cap, seed);
  c.varlen = true;
  c.seqlens_q = sq;
  c.seqlens_k = sk;
  return c;
}

std::vector<DecodeCase> prefill_layout_cases(int short_q, uint32_t seed) {
  auto layout = [](int lay, int page_size, bool hnd, bool share) {
    KvCase k;
    k.layout = lay;
    k.page_size = page_size;
    k.hnd = hnd;
    k.share_prefix = share;
    return k;
  };
  const KvCase layouts[] = {
      layout(FA_KV_CONTIGUOUS, 0, false, false), layout(FA_KV_PAGED, 128, false, false),
      layout(FA_KV_PAGED, 256, true, true),      layout(FA_KV_PAGED, 16, false, true),
      layout(FA_KV_PAGED, 1, false, false),      layout(FA_KV_PAGED, 3, true, false),
      layout(FA_KV_PTR_ARRAY, 0, false, false)};
  std::vector<DecodeCase> out;
  int i = 0;
  for (const KvCase &kv : layouts) {
    DecodeCase c;
    c.prefill = true;
    c.batch = 3;
    c.seqlen_q = i % 2 ? short_q : 37 + 50 * (i % 3);
    c.seqlen_k_max = 256 + 32 * (i % 3);
    c.cache_seqlens = {c.seqlen_k_max, c.seqlen_q + 3, i == 3 ? 0 : c.seqlen_k_max - 41};
    c.heads_q = i % 3 == 0 ? 4 : 2;
    c.heads_kv = 2;
    c.head_dim = i % 2 ? 128 : 64 + 32 * (i % 3);
    c.bf16 = i % 2 == 0;
    c.causal = i != 4;
    c.window_left = i == 5 ? 50 : -1;
    c.softcap = i == 0 || i == 6 ? 20.0f : 0.0f;
    c.kv = kv;
    c.seed = seed + static_cast<uint32_t>(i);
    out.push_back(c);
    ++i;
  }
  return out;
}

DecodeCase decode_case(int batch, int seqlen_q, int max_k, int hq, int hkv, int d, bool bf16,
                       uint32_t seed, int len_step) {
  DecodeCase c;
  c.batch = batch;
  c.seqlen_q = seqlen_q;
  c.seqlen_k_max = max_k;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.bf16 = bf16;
  c.seed = seed;
  for (int b = 0; b < batch; ++b) c.cache_seqlens.push_back(max_k - len_step * b);
  return c;
}

DecodeCase prefill_case(const std::vector<int> &lens, int seqlen_q, int max_k, int hq, int hkv,
                        int d, bool bf16, int layout, int page_size, uint32_t seed) {
  DecodeCase x;
  x.prefill = true;
  x.batch = static_cast<int>(lens.size());
  x.seqlen_q = seqlen_q;
  x.seqlen_k_max = max_k;
  x.cache_seqlens = lens;
  x.heads_q = hq;
  x.heads_kv = hkv;
  x.head_dim = d;
  x.bf16 = bf16;
  x.causal = true;
  x.kv.layout = layout;
  x.kv.page_size = page_size;
  x.kv.seed = seed + 1;  // a shuffled block table
  x.seed = seed;
  return x;
}

bool host_forward_problem(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                          int head_dim, bool causal, uint64_t data, fa_config **cfg,
                          fa_forward_args *a) {
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = d.head_dim_v = head_dim;
  d.num_heads_q = heads_q;
  d.num_heads_kv = heads_kv;
  d.causal = causal ? 1 : 0;
  *cfg = nullptr;
  if (fa_config_create(&d, cfg) != FA_SUCCESS) return false;
  *a = FA_FORWARD_ARGS_INIT;
  a->batch = batch;
  a->seqlen_q = seqlen_q;
  a->seqlen_k = seqlen_k;
  for (fa_tensor *t : {&a->q, &a->k, &a->v, &a->o}) {
    const bool kv = t == &a->k || t == &a->v;
    const int64_t row = int64_t(kv ? heads_kv : heads_q) * head_dim;
    const int64_t st[4] = {(kv ? seqlen_k : seqlen_q) * row, row, head_dim, 1};
    t->data = data;
    for (int i = 0; i < 4; ++i) t->stride[i] = st[i];
  }
  return true;
}

fa_runtime *emulator_or_fail(int emulator_sm) {
  std::string why;
  fa_runtime *rt = make_runtime(FA_BACKEND_EMULATOR, &why, emulator_sm);
  if (rt == nullptr) std::printf("FAIL: %s\n", why.c_str());
  return rt;
}

int finish(const std::string &failures, const std::string &summary) {
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  std::printf("%s\n", summary.c_str());
  return 0;
}

std::string emulated_kernel(fa_runtime *rt) {
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(rt, &prof) != FA_SUCCESS) return "(no profile)";
  return prof.kernel;
}

namespace {
template <typename Case, typename Run>
std::string run_on(fa_runtime *rt, const std::vector<Case> &cases, const std::string &kernel,
                   const std::string &what, Run run) {
  std::string failures;
  for (const Case &c : cases) {
    const std::string e = run(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    const std::string k = emulated_kernel(rt);
    if (k.find(kernel) == std::string::npos)
      failures += c.describe() + ": ran " + k + ", not " + what + "\n";
  }
  return failures;
}
}  // namespace

std::string run_on_kernel(fa_runtime *rt, const std::vector<ForwardCase> &cases,
                          const std::string &kernel, const std::string &what) {
  return run_on(rt, cases, kernel, what, run_forward);
}

std::string run_on_kernel(fa_runtime *rt, const std::vector<DecodeCase> &cases,
                          const std::string &kernel, const std::string &what) {
  return run_on(rt, cases, kernel, what, run_decode);
}

std::string run_forward(fa_runtime *rt, const ForwardCase &c) {
  Ctx ctx(rt);
  std::printf("  %s\n", c.describe().c_str());
  const int dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  fa_config *&cfg = ctx.cfg;
  if (!create_config(ctx, c.bf16, c.head_dim, dv, c.heads_q, c.heads_kv, c.causal, c.window_left,
                     c.window_right, c.softcap, c.softmax_scale, &cfg, c.q_fp8, c.kv_fp8)) {
    return ctx.err;
  }
  const bool fp8 = c.q_fp8 != 0;
  // P in e4m3 where fp8 tensor cores run both products (the mma on sm_89
  // and sm_120/121, wgmma on sm_90a): the module rounds P with cvt to e4m3.
  // Where the inputs are converted to f16 on load, P is f16: the 16-bit
  // yardstick.
  fa_runtime_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  ctx.check(fa_runtime_get_info(rt, &info), "fa_runtime_get_info");
  bool p_e4m3 = false;
  if (fp8) {
    size_t n = 0;
    if (fa_generate(cfg, FA_KERNEL_FORWARD, info.sm, nullptr, 0, &n) == FA_SUCCESS) {
      std::string ptx(n + 1, '\0');
      if (fa_generate(cfg, FA_KERNEL_FORWARD, info.sm, ptx.data(), ptx.size(), &n) == FA_SUCCESS)
        p_e4m3 = ptx.find("cvt.rn.satfinite.e4m3x2.f32") != std::string::npos;
    }
  }

  // Varlen packs all sequences as batch 1 along dim 1.
  int tq = c.seqlen_q, tk = c.seqlen_k, nb = c.batch;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  if (c.varlen) {
    for (int b = 0; b < c.batch; ++b) {
      cu_q.push_back(cu_q.back() + c.seqlens_q[b]);
      cu_k.push_back(cu_k.back() + c.seqlens_k[b]);
    }
    tq = cu_q.back();
    tk = cu_k.back();
    nb = 1;
  }
  const std::vector<float> qh =
      c.q ? *c.q : random_normal(size_t(nb) * tq * c.heads_q * c.head_dim, c.seed, c.input_scale);
  const std::vector<float> kh =
      c.k ? *c.k
          : random_normal(size_t(nb) * tk * c.heads_kv * c.head_dim, c.seed + 1, c.input_scale);
  const std::vector<float> vh =
      c.v ? *c.v : random_normal(size_t(nb) * tk * c.heads_kv * dv, c.seed + 2, 1.0f);
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k;
  std::vector<double> q, k, v;
  if (fp8) {
    std::vector<double> ds[3];
    fp8_descales(ctx, c, ds, &a);
    std::vector<int> seq_q, seq_k;  // varlen: each packed row's sequence
    for (int b = 0; c.varlen && b < c.batch; ++b) {
      seq_q.insert(seq_q.end(), size_t(c.seqlens_q[b]), b);
      seq_k.insert(seq_k.end(), size_t(c.seqlens_k[b]), b);
    }
    const bool q5 = c.q_fp8 == FA_DTYPE_FP8_E5M2, kv5 = c.kv_fp8 == FA_DTYPE_FP8_E5M2;
    const int group = c.heads_q / c.heads_kv;
    q = upload_fp8(ctx, qh, nb, tq, c.heads_q, c.head_dim, q5, c.padded_strides, ds[0], c.heads_kv,
                   group, seq_q, &a.q);
    k = upload_fp8(ctx, kh, nb, tk, c.heads_kv, c.head_dim, kv5, c.padded_strides, ds[1],
                   c.heads_kv, 1, seq_k, &a.k);
    v = upload_fp8(ctx, vh, nb, tk, c.heads_kv, dv, kv5, c.padded_strides, ds[2], c.heads_kv, 1,
                   seq_k, &a.v);
  } else {
    q = upload(ctx, qh, nb, tq, c.heads_q, c.head_dim, c.bf16, c.padded_strides, &a.q);
    k = upload(ctx, kh, nb, tk, c.heads_kv, c.head_dim, c.bf16, c.padded_strides, &a.k);
    v = upload(ctx, vh, nb, tk, c.heads_kv, dv, c.bf16, c.padded_strides, &a.v);
  }
  a.o = make_view(0, tq, c.heads_q, dv, c.padded_strides);
  const size_t o_elems = view_elems(a.o, nb);
  a.o.data = ctx.alloc(o_elems * 2);
  const size_t lse_n = size_t(nb) * c.heads_q * tq;
  // LSE rows of head h start at h * lse_stride (+ first: varlen_first_row).
  const int64_t first = c.varlen ? c.varlen_first_row : 0;
  const size_t lse_stride = size_t(first) + size_t(nb) * tq;
  a.lse = ctx.alloc(size_t(c.heads_q) * lse_stride * 4);
  if (c.varlen) {
    std::vector<int32_t> dq = cu_q, dk = cu_k;
    for (int32_t &x : dq) x += c.varlen_first_row;
    for (int32_t &x : dk) x += c.varlen_first_row;
    a.cu_seqlens_q = ctx.alloc(dq.size() * 4);
    a.cu_seqlens_k = ctx.alloc(dk.size() * 4);
    ctx.check(fa_memcpy_htod(rt, a.cu_seqlens_q, dq.data(), dq.size() * 4), "cu_seqlens_q");
    ctx.check(fa_memcpy_htod(rt, a.cu_seqlens_k, dk.data(), dk.size() * 4), "cu_seqlens_k");
    a.seqlen_q = *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
    a.seqlen_k = *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
  }
  if (!c.sinks.empty()) {
    a.sinks = ctx.alloc(c.sinks.size() * 4);
    ctx.check(fa_memcpy_htod(rt, a.sinks, c.sinks.data(), c.sinks.size() * 4), "sinks");
  }
  if (!c.alibi.empty()) {
    a.alibi_slopes = ctx.alloc(c.alibi.size() * 4);
    a.alibi_slopes_stride = c.alibi_stride;
    ctx.check(fa_memcpy_htod(rt, a.alibi_slopes, c.alibi.data(), c.alibi.size() * 4), "alibi");
  }
  if (!ctx.err.empty()) return ctx.err;
  const uint8_t poison = poison_byte(any_nan(c.sinks));
  ctx.check(fa_memset(rt, a.o.data, poison, o_elems * 2), "poison O");
  for (int h = 0; h < c.heads_q; ++h) {
    ctx.check(fa_memset(rt, a.lse + (h * lse_stride + first) * 4, poison, lse_n / c.heads_q * 4),
              "poison LSE");
  }
  set_workspace(ctx, cfg, c.workspace, c.workspace_size, poison, &a);
  fa_forward_args la = a;  // views moved back by `first` rows (never touched)
  for (fa_tensor *t : {&la.q, &la.k, &la.v, &la.o})
    t->data -= uint64_t(first * t->stride[1] * (fp8 && t != &la.o ? 1 : 2));
  if (c.reject) {
    c.reject->forward(&la);
    return check_reject(fa_launch(rt, cfg, &la, nullptr), *c.reject, "fa_launch") +
           untouched(ctx, a.o.data, o_elems * 2, poison) + ctx.err;
  }
  ctx.check(fa_launch(rt, cfg, &la, nullptr), "fa_launch");
  ctx.check(fa_synchronize(rt, nullptr), "fa_synchronize");
  if (!ctx.err.empty()) return ctx.err;

  std::string err;
  const std::vector<float> o = download_o(ctx, a.o, nb, tq, c.heads_q, dv, c.bf16, &err, poison);
  std::vector<float> lse(lse_n);
  for (int h = 0; h < c.heads_q; ++h) {
    const size_t n = lse_n / c.heads_q;
    ctx.check(fa_memcpy_dtoh(rt, lse.data() + h * n, a.lse + (h * lse_stride + first) * 4, n * 4),
              "download LSE");
  }
  if (c.o_out) *c.o_out = o;
  if (c.lse_out) *c.lse_out = lse;

  ref::Problem p;
  p.num_heads_q = c.heads_q;
  p.num_heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.head_dim_v = dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.softmax_scale = c.softmax_scale;
  if (!c.sinks.empty()) p.sinks = c.sinks.data();
  if (!c.alibi.empty()) {
    p.alibi_slopes = c.alibi.data();
    p.alibi_stride = c.alibi_stride;
  }
  std::vector<double> o_ref(o.size()), lse_ref(lse_n), o_lowp;
  if (!c.varlen) {
    p.batch = c.batch;
    p.seqlen_q = c.seqlen_q;
    p.seqlen_k = c.seqlen_k;
    ref::attention(p, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());
    o_lowp = lowp_attention(p, q, k, v, c.bf16, nullptr, p_e4m3);
  } else {
    // Sequence by sequence; LSE of varlen is [heads, total_q].
    o_lowp.resize(o.size());
    for (int b = 0; b < c.batch; ++b) {
      p.batch = 1;
      p.alibi_batch0 = b;
      p.seqlen_q = c.seqlens_q[b];
      p.seqlen_k = c.seqlens_k[b];
      const size_t qo = size_t(cu_q[b]) * c.heads_q, ko = size_t(cu_k[b]) * c.heads_kv;
      std::vector<double> ob(size_t(p.seqlen_q) * c.heads_q * dv),
          lb(size_t(c.heads_q) * p.seqlen_q);
      const std::vector<double> qb(q.begin() + qo * c.head_dim,
                                   q.begin() + (qo + size_t(p.seqlen_q) * c.heads_q) * c.head_dim);
      const std::vector<double> kb(k.begin() + ko * c.head_dim,
                                   k.begin() + (ko + size_t(p.seqlen_k) * c.heads_kv) * c.head_dim);
      const std::vector<double> vb(v.begin() + ko * dv,
                                   v.begin() + (ko + size_t(p.seqlen_k) * c.heads_kv) * dv);
      ref::attention(p, qb.data(), kb.data(), vb.data(), ob.data(), lb.data());
      const std::vector<double> lp = lowp_attention(p, qb, kb, vb, c.bf16, nullptr, p_e4m3);
      std::copy(ob.begin(), ob.end(), o_ref.begin() + qo * dv);
      std::copy(lp.begin(), lp.end(), o_lowp.begin() + qo * dv);
      for (int h = 0; h < c.heads_q; ++h)
        for (int i = 0; i < p.seqlen_q; ++i)
          lse_ref[size_t(h) * tq + cu_q[b] + i] = lb[size_t(h) * p.seqlen_q + i];
    }
  }
  judge("O", o, o_ref, o_lowp, lse, lse_ref, &err, p_e4m3);
  return err + ctx.err;
}

namespace {

// A decode case through fa_launch (chunked prefill against a KV cache):
// seqused_k = cache_seqlens, the queries the last seqlen_q positions of each
// sequence (bottom-right causal), k/v in d's layout.
std::string run_prefill(Ctx &ctx, const DecodeCase &c, const fa_decode_args &d,
                        const std::vector<double> &q, const std::vector<double> &k,
                        const std::vector<double> &v, const std::vector<int32_t> &lens) {
  const int dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k_max;
  a.q = d.q;
  a.k = d.k_cache;
  a.v = d.v_cache;
  a.kv = d.kv;
  a.seqused_k = c.prefill_fixed ? 0 : d.cache_seqlens;
  a.sinks = d.sinks;
  a.alibi_slopes = d.alibi_slopes;
  a.alibi_slopes_stride = d.alibi_slopes_stride;
  // prefill_q: the queries packed as one "batch" of total rows (cu).
  const bool packed = !c.prefill_q.empty();
  std::vector<int32_t> cu{0};
  for (int n : c.prefill_q) cu.push_back(cu.back() + n);
  const int nb = packed ? 1 : c.batch, rows = packed ? cu.back() : c.seqlen_q;
  if (packed) {
    const size_t row = size_t(c.heads_q) * c.head_dim;
    std::vector<float> qp;
    for (int b = 0; b < c.batch; ++b) {
      const size_t first = (size_t(b) * c.seqlen_q + c.seqlen_q - c.prefill_q[b]) * row;
      qp.insert(qp.end(), q.begin() + first, q.begin() + first + c.prefill_q[b] * row);
    }
    upload(ctx, qp, 1, rows, c.heads_q, c.head_dim, c.bf16, false, &a.q);
    a.cu_seqlens_q = ctx.alloc(cu.size() * 4);
    ctx.check(fa_memcpy_htod(ctx.rt, a.cu_seqlens_q, cu.data(), cu.size() * 4), "cu_seqlens_q");
    a.seqlen_q = std::max(1, *std::max_element(c.prefill_q.begin(), c.prefill_q.end()));
  }
  a.o = make_view(0, rows, c.heads_q, dv, false);
  const size_t o_elems = view_elems(a.o, nb);
  const size_t lse_n = size_t(nb) * c.heads_q * rows;
  a.o.data = ctx.alloc(o_elems * 2);
  a.lse = ctx.alloc(lse_n * 4);
  if (!ctx.err.empty()) return ctx.err;
  const uint8_t poison = poison_byte(any_nan(c.sinks));
  ctx.check(fa_memset(ctx.rt, a.o.data, poison, o_elems * 2), "poison O");
  ctx.check(fa_memset(ctx.rt, a.lse, poison, lse_n * 4), "poison LSE");
  set_workspace(ctx, ctx.cfg, c.workspace, c.workspace_size, poison, &a);
  ctx.check(fa_launch(ctx.rt, ctx.cfg, &a, nullptr), "fa_launch");
  ctx.check(fa_synchronize(ctx.rt, nullptr), "fa_synchronize");
  if (!ctx.err.empty()) return ctx.err;
  std::string err;
  ref::Problem p;
  p.batch = c.batch;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k_max;
  p.num_heads_q = c.heads_q;
  p.num_heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.head_dim_v = dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.softcap = c.softcap;
  p.softmax_scale = c.softmax_scale;
  if (!c.sinks.empty()) p.sinks = c.sinks.data();
  if (!c.alibi.empty()) {
    p.alibi_slopes = c.alibi.data();
    p.alibi_stride = c.alibi_stride;
  }
  std::vector<double> o_ref(size_t(c.batch) * c.seqlen_q * c.heads_q * dv),
      lse_ref(size_t(c.batch) * c.heads_q * c.seqlen_q);
  ref::attention(p, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), lens.data());
  const std::vector<float> o = download_o(ctx, a.o, nb, rows, c.heads_q, dv, c.bf16, &err, poison);
  std::vector<float> lse(lse_n);
  ctx.check(fa_memcpy_dtoh(ctx.rt, lse.data(), a.lse, lse_n * 4), "download LSE");
  std::vector<double> o_lowp = lowp_attention(p, q, k, v, c.bf16, lens.data());
  if (packed) {
    // The packed rows' share of the padded references: O [rows, heads,
    // dv], LSE [heads, rows].
    const size_t orow = size_t(c.heads_q) * dv;
    std::vector<double> op(size_t(rows) * orow), wp(op.size()), lp(lse_n);
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.prefill_q[b]; ++i) {
        const size_t src = size_t(b) * c.seqlen_q + c.seqlen_q - c.prefill_q[b] + i;
        const size_t dst = size_t(cu[b]) + i;
        std::copy_n(o_ref.begin() + src * orow, orow, op.begin() + dst * orow);
        std::copy_n(o_lowp.begin() + src * orow, orow, wp.begin() + dst * orow);
        for (int h = 0; h < c.heads_q; ++h)
          lp[size_t(h) * rows + dst] =
              lse_ref[(size_t(b) * c.heads_q + h) * c.seqlen_q + src % c.seqlen_q];
      }
    o_ref.swap(op);
    o_lowp.swap(wp);
    lse_ref.swap(lp);
  }
  judge("O", o, o_ref, o_lowp, lse, lse_ref, &err);
  if (c.o_out) *c.o_out = o;
  if (c.lse_out) *c.lse_out = lse;
  return err + ctx.err;
}

}  // namespace

// KV append of case c (seqlen_new > 0): uploads k_new/v_new (and the rope
// table, positions) into a, rotates q on the host (rounded to the dtype) and
// writes into *k_after / *v_after the cache a separate rotate-then-copy
// leaves; *k and *v (the reference's inputs) become those values.
void append_case(Ctx &ctx, const DecodeCase &c, const std::vector<float> &kh,
                 const std::vector<float> &vh, fa_decode_args *a, std::vector<double> *q,
                 std::vector<double> *k, std::vector<double> *v, std::vector<float> *k_after,
                 std::vector<float> *v_after) {
  const int dv = c.head_dim_v ? c.head_dim_v : c.head_dim, d = c.head_dim, sn = c.seqlen_new;
  const int hkv = c.heads_kv, skmax = c.seqlen_k_max;
  std::vector<float> kn = random_normal(size_t(c.batch) * sn * hkv * d, c.seed + 11, 1.0f);
  std::vector<float> vn = random_normal(size_t(c.batch) * sn * hkv * dv, c.seed + 12, 1.0f);
  for (float &x : kn) x = ref::round_to(x, c.bf16);
  for (float &x : vn) x = ref::round_to(x, c.bf16);
  a->seqlen_new = sn;
  upload(ctx, kn, c.batch, sn, hkv, d, c.bf16, true, &a->k_new);
  upload(ctx, vn, c.batch, sn, hkv, dv, c.bf16, false, &a->v_new);
  // Positions: cache_seqlens + t, or random ones (rotary_positions).
  const int tokens = std::max(c.seqlen_q, sn), rows = skmax;
  std::vector<int32_t> pos(size_t(c.batch) * tokens);
  std::mt19937 gen(c.seed + 13);
  for (int b = 0; b < c.batch; ++b)
    for (int t = 0; t < tokens; ++t)
      pos[size_t(b) * tokens + t] =
          c.rotary_positions ? int32_t(gen() % uint32_t(rows)) : c.cache_seqlens[b] + t;
  const int half = c.rotary_dim / 2;
  std::vector<float> cs(size_t(rows) * std::max(half, 1)), sn_tab(cs.size());
  if (c.rotary_dim > 0) {
    for (int p = 0; p < rows; ++p)
      for (int i = 0; i < half; ++i) {
        const double th = p * std::pow(10000.0, -2.0 * i / c.rotary_dim);
        cs[size_t(p) * half + i] = float(std::cos(th));
        sn_tab[size_t(p) * half + i] = float(std::sin(th));
      }
    a->rotary_dim = c.rotary_dim;
    a->rotary_interleaved = c.rotary_interleaved;
    a->seqlen_ro = rows;
    a->rotary_cos = ctx.alloc(cs.size() * 4);
    a->rotary_sin = ctx.alloc(cs.size() * 4);
    if (c.rotary_half_table) {
      a->rotary_dtype = c.bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
      std::vector<uint16_t> hc(cs.size()), hs(cs.size());
      for (size_t i = 0; i < cs.size(); ++i) {
        hc[i] = to_bits(cs[i], c.bf16);
        hs[i] = to_bits(sn_tab[i], c.bf16);
        cs[i] = from_bits(hc[i], c.bf16);
        sn_tab[i] = from_bits(hs[i], c.bf16);
      }
      ctx.check(fa_memcpy_htod(ctx.rt, a->rotary_cos, hc.data(), hc.size() * 2), "cos");
      ctx.check(fa_memcpy_htod(ctx.rt, a->rotary_sin, hs.data(), hs.size() * 2), "sin");
    } else {
      ctx.check(fa_memcpy_htod(ctx.rt, a->rotary_cos, cs.data(), cs.size() * 4), "cos");
      ctx.check(fa_memcpy_htod(ctx.rt, a->rotary_sin, sn_tab.data(), sn_tab.size() * 4), "sin");
    }
    if (c.rotary_positions) {
      a->rotary_positions = ctx.alloc(pos.size() * 4);
      a->rotary_positions_stride = tokens;
      ctx.check(fa_memcpy_htod(ctx.rt, a->rotary_positions, pos.data(), pos.size() * 4), "pos");
    }
  }
  // Queries: at cache_seqlens + t when causal or windowed, else at
  // cache_seqlens (FlashAttention's rule), unless positions are given.
  const bool q_steps = c.causal || c.window_left >= 0;
  auto rot = [&](float *row, int b, int t, bool query) {
    if (c.rotary_dim == 0) return;
    int p = pos[size_t(b) * tokens + t];
    if (query && !c.rotary_positions && !q_steps) p = c.cache_seqlens[b];
    ref::rope_row(row, c.rotary_dim, c.rotary_interleaved, &cs[size_t(p) * half],
                  &sn_tab[size_t(p) * half], c.bf16);
  };
  std::vector<float> qr(q->size());
  for (size_t i = 0; i < qr.size(); ++i) qr[i] = float((*q)[i]);
  for (int b = 0; b < c.batch; ++b)
    for (int t = 0; t < c.seqlen_q; ++t)
      for (int h = 0; h < c.heads_q; ++h)
        rot(&qr[((size_t(b) * c.seqlen_q + t) * c.heads_q + h) * d], b, t, true);
  for (size_t i = 0; i < qr.size(); ++i) (*q)[i] = qr[i];
  *k_after = kh;
  *v_after = vh;
  for (int b = 0; b < c.batch; ++b)
    for (int t = 0; t < sn; ++t)
      for (int h = 0; h < hkv; ++h) {
        const int j = c.cache_seqlens[b] + t;
        float *kr = &(*k_after)[((size_t(b) * skmax + j) * hkv + h) * d];
        std::copy_n(&kn[((size_t(b) * sn + t) * hkv + h) * d], d, kr);
        rot(kr, b, t, false);
        std::copy_n(&vn[((size_t(b) * sn + t) * hkv + h) * dv], dv,
                    &(*v_after)[((size_t(b) * skmax + j) * hkv + h) * dv]);
      }
  for (size_t i = 0; i < k->size(); ++i) (*k)[i] = ref::round_to((*k_after)[i], c.bf16);
  for (size_t i = 0; i < v->size(); ++i) (*v)[i] = ref::round_to((*v_after)[i], c.bf16);
}

// The cache after an append: every row of every sequence (each sequence's
// rows in its layout: contiguous, pages through the table, pointer arrays)
// must hold exactly the bits of `want` (rows past the new length: NaN,
// untouched).
void check_cache(Ctx &ctx, const DecodeCase &c, const fa_tensor &t, uint64_t ptrs,
                 const fa_kv_cache_layout &kv, int d, const std::vector<float> &want,
                 const char *what, std::string *err) {
  const int skmax = c.seqlen_k_max, h = c.heads_kv;
  std::vector<uint64_t> seq_ptr(c.batch, t.data);
  std::vector<int32_t> table;
  size_t bytes = 0;
  if (kv.layout == FA_KV_PTR_ARRAY) {
    ctx.check(fa_memcpy_dtoh(ctx.rt, seq_ptr.data(), ptrs, size_t(c.batch) * 8), "ptrs");
    bytes = size_t(t.stride[0]) * 2;
  } else if (kv.layout == FA_KV_PAGED) {
    table.resize(size_t(c.batch) * kv.block_table_stride);
    ctx.check(fa_memcpy_dtoh(ctx.rt, table.data(), kv.block_table, table.size() * 4), "table");
    bytes = size_t(kv.num_pages) * size_t(t.stride[0]) * 2;
  } else {
    bytes = view_elems(t, c.batch) * 2;
  }
  long long bad = 0;
  std::vector<uint16_t> dev(bytes / 2);
  uint64_t loaded = 0;
  for (int b = 0; b < c.batch; ++b) {
    if (seq_ptr[b] != loaded) {
      ctx.check(fa_memcpy_dtoh(ctx.rt, dev.data(), seq_ptr[b], bytes), "download cache");
      loaded = seq_ptr[b];
    }
    if (!ctx.err.empty()) return;
    for (int j = 0; j < skmax; ++j)
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id) {
          size_t off;
          if (kv.layout == FA_KV_PAGED) {
            const int ps = kv.page_size;
            const int page = table[size_t(b) * kv.block_table_stride + j / ps];
            off = size_t(page) * t.stride[0] + size_t(j % ps) * t.stride[1] + ih * t.stride[2] + id;
          } else {
            off = offset(t, kv.layout == FA_KV_PTR_ARRAY ? 0 : b, j, ih, id);
          }
          const float w = want[((size_t(b) * skmax + j) * h + ih) * d + id];
          if (dev[off] != to_bits(w, c.bf16)) ++bad;
        }
  }
  if (bad)
    *err += std::string(what) + " cache: " + std::to_string(bad) +
            " elements differ from the rotate-then-copy bits\n";
}

std::string run_decode(fa_runtime *rt, const DecodeCase &c) {
  Ctx ctx(rt);
  std::printf("  %s\n", c.describe().c_str());
  const int dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  fa_config *&cfg = ctx.cfg;
  if (!create_config(ctx, c.bf16, c.head_dim, dv, c.heads_q, c.heads_kv, c.causal, c.window_left,
                     -1, c.softcap, c.softmax_scale, &cfg)) {
    return ctx.err;
  }
  const std::vector<float> qh =
      c.q ? *c.q
          : random_normal(size_t(c.batch) * c.seqlen_q * c.heads_q * c.head_dim, c.seed, 1.0f);
  std::vector<float> kh =
      c.k ? *c.k
          : random_normal(size_t(c.batch) * c.seqlen_k_max * c.heads_kv * c.head_dim, c.seed + 1,
                          1.0f);
  std::vector<float> vh =
      c.v ? *c.v
          : random_normal(size_t(c.batch) * c.seqlen_k_max * c.heads_kv * dv, c.seed + 2, 1.0f);
  if (c.v_in_k) {  // V = K's first dv columns (the reference reads this copy)
    for (size_t r = 0; r < size_t(c.batch) * c.seqlen_k_max * c.heads_kv; ++r)
      std::copy_n(kh.begin() + r * c.head_dim, dv, vh.begin() + r * dv);
  }
  // Cache rows past cache_seqlens[b] hold NaN, as uninitialised caches can:
  // the kernels must never read them (0 * NaN would leak into O).
  for (int b = 0; b < c.batch; ++b) {
    const size_t row_k = size_t(c.heads_kv) * c.head_dim, row_v = size_t(c.heads_kv) * dv;
    for (int j = std::max(0, c.cache_seqlens[b]); j < c.seqlen_k_max; ++j) {
      std::fill_n(kh.begin() + (size_t(b) * c.seqlen_k_max + j) * row_k, row_k, NAN);
      std::fill_n(vh.begin() + (size_t(b) * c.seqlen_k_max + j) * row_v, row_v, NAN);
    }
  }
  const bool paged = c.kv.layout == FA_KV_PAGED;
  const bool share = paged && c.kv.share_prefix && c.batch >= 2 &&
                     c.cache_seqlens[0] >= std::min(c.kv.page_size, c.seqlen_k_max);
  if (share) {
    // Sequence 1 starts with sequence 0's first page (a shared prompt prefix).
    const size_t row_k = size_t(c.heads_kv) * c.head_dim, row_v = size_t(c.heads_kv) * dv;
    const int rows = std::min(c.kv.page_size, c.seqlen_k_max);
    for (int j = 0; j < rows && j < c.cache_seqlens[1]; ++j) {
      std::copy_n(kh.begin() + j * row_k, row_k, kh.begin() + (c.seqlen_k_max + j) * row_k);
      std::copy_n(vh.begin() + j * row_v, row_v, vh.begin() + (c.seqlen_k_max + j) * row_v);
    }
  }
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k_max = c.seqlen_k_max;
  a.num_splits = c.num_splits;
  a.batch_invariant = c.batch_invariant;
  std::vector<double> q =
      upload(ctx, qh, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.bf16, false, &a.q);
  std::vector<double> k =
      upload(ctx, kh, c.batch, c.seqlen_k_max, c.heads_kv, c.head_dim, c.bf16, true, &a.k_cache);
  std::vector<double> v =
      upload(ctx, vh, c.batch, c.seqlen_k_max, c.heads_kv, dv, c.bf16, false, &a.v_cache);
  // KV append: the cache the kernel must leave (kh/vh with the new rows,
  // rotated), and the rotated Q, computed here by a separate
  // rotate-then-copy (ref::rope_row); the reference attends over them.
  std::vector<float> k_after, v_after;
  if (c.seqlen_new > 0) append_case(ctx, c, kh, vh, &a, &q, &k, &v, &k_after, &v_after);
  if (c.kv.layout != FA_KV_CONTIGUOUS) {
    KvCase kc = c.kv;
    kc.share_prefix = share;
    const Pages pg = paged ? make_pages(kc, c.batch, c.seqlen_k_max) : Pages();
    place_kv(ctx, kh, c.batch, c.seqlen_k_max, c.heads_kv, c.head_dim, c.bf16, kc, pg, &a.k_cache,
             &a.kv.k_ptrs);
    place_kv(ctx, vh, c.batch, c.seqlen_k_max, c.heads_kv, dv, c.bf16, kc, pg, &a.v_cache,
             &a.kv.v_ptrs);
    set_kv_args(ctx, kc, pg, c.batch, &a.kv);
  }
  if (c.v_in_k) {  // the kernel is handed K's memory for V
    a.v_cache = a.k_cache;
    a.kv.v_ptrs = a.kv.k_ptrs;
  }
  a.cache_seqlens = ctx.alloc(size_t(c.batch) * 4);
  std::vector<int32_t> lens(c.cache_seqlens.begin(), c.cache_seqlens.end());
  ctx.check(fa_memcpy_htod(rt, a.cache_seqlens, lens.data(), lens.size() * 4), "cache_seqlens");
  if (c.seqlen_new > 0)  // the reference's lengths: after the append
    for (int32_t &l : lens) l += c.seqlen_new;
  if (!c.sinks.empty()) {
    a.sinks = ctx.alloc(c.sinks.size() * 4);
    ctx.check(fa_memcpy_htod(rt, a.sinks, c.sinks.data(), c.sinks.size() * 4), "sinks");
  }
  if (!c.alibi.empty()) {
    a.alibi_slopes = ctx.alloc(c.alibi.size() * 4);
    a.alibi_slopes_stride = c.alibi_stride;
    ctx.check(fa_memcpy_htod(rt, a.alibi_slopes, c.alibi.data(), c.alibi.size() * 4), "alibi");
  }
  if (c.prefill) return run_prefill(ctx, c, a, q, k, v, lens);
  std::vector<uint8_t> tree_all;  // [batch][sq][sq] for the reference
  if (!c.tree.empty()) {
    const int words = (c.seqlen_q + 31) / 32 + c.tree_pad_words;
    const int rows = (c.tree_shared ? 1 : c.batch) * c.seqlen_q;
    const std::vector<uint32_t> packed = pack_tree_mask(c.tree, rows, c.seqlen_q, words);
    a.tree_mask = ctx.alloc(packed.size() * 4);
    ctx.check(fa_memcpy_htod(rt, a.tree_mask, packed.data(), packed.size() * 4), "tree_mask");
    a.tree_mask_stride[1] = int64_t(words) * 4;
    a.tree_mask_stride[0] = c.tree_shared ? 0 : int64_t(c.seqlen_q) * a.tree_mask_stride[1];
    if (c.tree_shared) {
      for (int b = 0; b < c.batch; ++b)
        tree_all.insert(tree_all.end(), c.tree.begin(), c.tree.end());
    } else {
      tree_all = c.tree;
    }
  }
  a.o = make_view(0, c.seqlen_q, c.heads_q, dv, false);
  const size_t o_elems = view_elems(a.o, c.batch);
  const size_t lse_n = size_t(c.batch) * c.heads_q * c.seqlen_q;
  if (!c.partials_only) {
    a.o.data = ctx.alloc(o_elems * 2);
    a.lse = ctx.alloc(lse_n * 4);
  }
  if (c.partials_only) a.sinks = 0;  // no combine: the host merges with them
  size_t ws = 0;
  int32_t splits = 0;
  ctx.check(fa_decode_workspace_size(rt, cfg, &a, &ws, &splits), "fa_decode_workspace_size");
  a.workspace = ctx.alloc(ws);
  a.workspace_size = ws;
  if (!ctx.err.empty()) return ctx.err;
  std::printf("    splits %d, workspace %zu bytes\n", splits, ws);
  const size_t n_ctr =
      c.split_counters ? FA_DECODE_SPLIT_COUNTERS(c.batch, c.heads_q, c.heads_kv, c.seqlen_q) : 0;
  if (n_ctr) {
    a.split_counters = ctx.alloc(n_ctr * 4);
    a.split_counters_size = n_ctr * 4;
    ctx.check(fa_memset(rt, a.split_counters, 0, n_ctr * 4), "zero split_counters");
  }
  const uint8_t poison = poison_byte(any_nan(c.sinks));
  auto poison_out = [&] {
    if (c.partials_only) return;
    ctx.check(fa_memset(rt, a.o.data, poison, o_elems * 2), "poison O");
    ctx.check(fa_memset(rt, a.lse, poison, lse_n * 4), "poison LSE");
  };
  poison_out();
  ctx.check(fa_memset(rt, a.workspace, 0xFF, ws), "poison workspace");
  if (c.reject) {
    const uint64_t o_data = a.o.data;
    c.reject->decode(&a);
    return check_reject(fa_decode(rt, cfg, &a, nullptr), *c.reject, "fa_decode") +
           untouched(ctx, o_data, c.partials_only ? 0 : o_elems * 2, poison) + ctx.err;
  }
  std::string err;
  for (int call = 0; call < std::max(c.calls, 1); ++call) {
    if (call > 0) poison_out();
    if (n_ctr && c.counters_preset != 0 && call == std::max(c.calls, 1) - 1) {
      const std::vector<int32_t> preset(n_ctr, c.counters_preset);
      ctx.check(fa_memcpy_htod(rt, a.split_counters, preset.data(), n_ctr * 4), "preset counters");
    }
    ctx.check(fa_decode(rt, cfg, &a, nullptr), "fa_decode");
    ctx.check(fa_synchronize(rt, nullptr), "fa_synchronize");
    if (n_ctr) {  // every fa_decode leaves them zero (CUDA-graph replays need it)
      std::vector<int32_t> ctr(n_ctr);
      ctx.check(fa_memcpy_dtoh(rt, ctr.data(), a.split_counters, n_ctr * 4), "split_counters");
      size_t bad = 0;
      for (size_t i = 0; i < n_ctr; ++i) bad += ctr[i] != 0;
      if (bad)
        err += "call " + std::to_string(call) + ": " + std::to_string(bad) + " of " +
               std::to_string(n_ctr) + " split_counters not 0 after fa_decode\n";
    }
  }
  if (!ctx.err.empty()) return err + ctx.err;
  ref::Problem p;
  p.batch = c.batch;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k_max;
  p.num_heads_q = c.heads_q;
  p.num_heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.head_dim_v = dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.softcap = c.softcap;
  p.softmax_scale = c.softmax_scale;
  if (!tree_all.empty()) p.tree_mask = tree_all.data();
  if (!c.sinks.empty()) p.sinks = c.sinks.data();
  if (!c.alibi.empty()) {
    p.alibi_slopes = c.alibi.data();
    p.alibi_stride = c.alibi_stride;
  }
  std::vector<double> o_ref(size_t(c.batch) * c.seqlen_q * c.heads_q * dv), lse_ref(lse_n);
  ref::attention(p, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), lens.data());
  check_partials(ctx, a.workspace, splits, c.batch, c.seqlen_q, c.heads_q, dv, c.bf16, o_ref,
                 lse_ref, &err, c.sinks);
  if (c.partials_only) {
    if (c.seqlen_new > 0) {
      check_cache(ctx, c, a.k_cache, a.kv.k_ptrs, a.kv, c.head_dim, k_after, "K", &err);
      check_cache(ctx, c, a.v_cache, a.kv.v_ptrs, a.kv, dv, v_after, "V", &err);
    }
    return err + ctx.err;
  }
  const std::vector<float> o =
      download_o(ctx, a.o, c.batch, c.seqlen_q, c.heads_q, dv, c.bf16, &err, poison);
  std::vector<float> lse(lse_n);
  ctx.check(fa_memcpy_dtoh(rt, lse.data(), a.lse, lse_n * 4), "download LSE");
  const std::vector<double> o_lowp = lowp_attention(p, q, k, v, c.bf16, lens.data());
  judge("O", o, o_ref, o_lowp, lse, lse_ref, &err);
  if (c.o_out) *c.o_out = o;
  if (c.lse_out) *c.lse_out = lse;
  if (c.seqlen_new > 0) {
    check_cache(ctx, c, a.k_cache, a.kv.k_ptrs, a.kv, c.head_dim, k_after, "K", &err);
    check_cache(ctx, c, a.v_cache, a.kv.v_ptrs, a.kv, dv, v_after, "V", &err);
  }
  return err + ctx.err;
}

std::string run_reduce(fa_runtime *rt, int splits, int batch, int seqlen_q, int heads, int dv,
                       bool bf16, uint32_t seed, const std::vector<float> *sinks, bool nonfinite,
                       int lse_formats, const Reject *reject) {
  Ctx ctx(rt);
  std::printf("  reduce %s splits%d b%d sq%d h%d dv%d%s%s lse_formats%d\n", bf16 ? "bf16" : "fp16",
              splits, batch, seqlen_q, heads, dv, sinks ? " sinks" : "",
              nonfinite ? " nonfinite" : "", lse_formats);
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  desc.head_dim = dv;
  desc.num_heads_q = desc.num_heads_kv = heads;
  fa_config *&cfg = ctx.cfg;
  if (!ctx.check(fa_config_create(&desc, &cfg), "fa_config_create")) return ctx.err;
  const int rows = batch * seqlen_q * heads;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uo(-2.0f, 2.0f), ul(-6.0f, 6.0f);
  std::uniform_int_distribution<int> coin(0, 4);
  // Logical partial states [split, row] with row = (b, s, h) for O and
  // (b, h, s) for LSE in the library's layouts; the reference works on
  // [split, row(b, s, h)].
  std::vector<double> op(size_t(splits) * rows * dv), lp(size_t(splits) * rows);
  for (double &x : op) x = uo(gen);
  for (double &x : lp) x = coin(gen) == 0 ? -kInf : ul(gen);
  for (int r = 0; r < rows; r += 7) {
    for (int s = 0; s < splits; ++s) lp[size_t(s) * rows + r] = -kInf;  // fully empty rows
  }
  // Non-finite states by row: one +inf, two +inf (O = their mean), a NaN,
  // +inf and NaN (NaN), one +inf among -inf.
  for (int r = 0; nonfinite && r < rows; ++r) {
    auto at = [&](int k) -> double & { return lp[size_t((r + k) % splits) * rows + r]; };
    switch (r % 6) {
      case 1:
        at(0) = kInf;
        break;
      case 2:
        at(0) = at(1) = kInf;
        break;
      case 3:
        at(1) = NAN;
        break;
      case 4:
        at(0) = kInf, at(1) = NAN;
        break;
      case 5:
        for (int k = 0; k < splits; ++k) at(k) = k ? -kInf : kInf;
        break;
      default:
        break;
    }
  }
  const double in_scale = (lse_formats & 1) ? M_LOG2E : 1.0;   // lse_partial_format
  const double out_scale = (lse_formats & 2) ? M_LOG2E : 1.0;  // lse_format
  // Device layout with padded strides: O_part [S, B, SQ, H, DV+8], LSE_part
  // [S, B, H, SQ+4].
  fa_reduce_args a = FA_REDUCE_ARGS_INIT;
  a.num_splits = splits;
  a.batch = batch;
  a.seqlen_q = seqlen_q;
  a.o_partial_stride[4] = 1;
  a.o_partial_stride[3] = dv + 8;
  a.o_partial_stride[2] = int64_t(heads) * (dv + 8);
  a.o_partial_stride[1] = int64_t(seqlen_q) * a.o_partial_stride[2];
  a.o_partial_stride[0] = int64_t(batch) * a.o_partial_stride[1];
  a.lse_partial_stride[3] = 1;
  a.lse_partial_stride[2] = seqlen_q + 4;
  a.lse_partial_stride[1] = int64_t(heads) * (seqlen_q + 4);
  a.lse_partial_stride[0] = int64_t(batch) * a.lse_partial_stride[1];
  std::vector<float> dop(size_t(splits) * a.o_partial_stride[0], NAN),
      dlp(size_t(splits) * a.lse_partial_stride[0], NAN);
  for (int s = 0; s < splits; ++s)
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < seqlen_q; ++i)
        for (int h = 0; h < heads; ++h) {
          const int r = (b * seqlen_q + i) * heads + h;
          for (int c = 0; c < dv; ++c)
            dop[s * a.o_partial_stride[0] + b * a.o_partial_stride[1] + i * a.o_partial_stride[2] +
                h * a.o_partial_stride[3] + c] = float(op[(size_t(s) * rows + r) * dv + c]);
          dlp[s * a.lse_partial_stride[0] + b * a.lse_partial_stride[1] +
              h * a.lse_partial_stride[2] + i] = float(lp[size_t(s) * rows + r] * in_scale);
        }
  a.o_partial = ctx.alloc(dop.size() * 4);
  a.lse_partial = ctx.alloc(dlp.size() * 4);
  ctx.check(fa_memcpy_htod(rt, a.o_partial, dop.data(), dop.size() * 4), "o_partial");
  ctx.check(fa_memcpy_htod(rt, a.lse_partial, dlp.data(), dlp.size() * 4), "lse_partial");
  a.o = make_view(0, seqlen_q, heads, dv, true);
  const size_t o_elems = view_elems(a.o, batch);
  a.o.data = ctx.alloc(o_elems * 2);
  const size_t lse_n = size_t(rows);
  a.lse = ctx.alloc(lse_n * 4);
  if (sinks) {
    a.sinks = ctx.alloc(sinks->size() * 4);
    ctx.check(fa_memcpy_htod(rt, a.sinks, sinks->data(), sinks->size() * 4), "sinks");
  }
  a.lse_partial_format = (lse_formats & 1) ? FA_LSE_BASE2 : FA_LSE_NATURAL;
  a.lse_format = (lse_formats & 2) ? FA_LSE_BASE2 : FA_LSE_NATURAL;
  if (!ctx.err.empty()) return ctx.err;
  const uint8_t poison =
      poison_byte(nonfinite || (sinks && any_nan(*sinks)));  // nonfinite: NaN states
  ctx.check(fa_memset(rt, a.o.data, poison, o_elems * 2), "poison O");
  ctx.check(fa_memset(rt, a.lse, poison, lse_n * 4), "poison LSE");
  if (reject) {
    reject->reduce(&a);
    return check_reject(fa_decode_reduce(rt, cfg, &a, nullptr), *reject, "fa_decode_reduce") +
           untouched(ctx, a.o.data, o_elems * 2, poison) + ctx.err;
  }
  ctx.check(fa_decode_reduce(rt, cfg, &a, nullptr), "fa_decode_reduce");
  ctx.check(fa_synchronize(rt, nullptr), "fa_synchronize");
  if (!ctx.err.empty()) return ctx.err;
  std::string err;
  const std::vector<float> o = download_o(ctx, a.o, batch, seqlen_q, heads, dv, bf16, &err, poison);
  std::vector<float> lse_dev(lse_n);
  ctx.check(fa_memcpy_dtoh(rt, lse_dev.data(), a.lse, lse_n * 4), "download LSE");
  std::vector<double> o_ref(size_t(rows) * dv), lse_ref(rows);
  std::vector<double> row_sinks;
  for (int r = 0; r < rows && sinks; ++r) row_sinks.push_back((*sinks)[r % heads]);
  ref::merge_states(splits, rows, dv, op.data(), lp.data(), o_ref.data(), lse_ref.data(),
                    sinks ? row_sinks.data() : nullptr);
  // Output rounding is the only error source beyond fp32: half an ulp of the
  // dtype plus fp32 slack.
  const double ulp = bf16 ? 1.0 / 128 : 1.0 / 1024;
  long long bad = 0, lse_bad = 0;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < seqlen_q; ++i)
      for (int h = 0; h < heads; ++h) {
        const int r = (b * seqlen_q + i) * heads + h;
        for (int c = 0; c < dv; ++c) {
          const double want = o_ref[size_t(r) * dv + c], got = o[size_t(r) * dv + c];
          if (std::isfinite(want) ? !(std::fabs(got - want) <= ulp * std::max(1.0, std::fabs(want)))
                                  : !same_nonfinite(got, want))
            ++bad;
        }
        const double lw = lse_ref[r] * out_scale;
        const double lg = lse_dev[(size_t(b) * heads + h) * seqlen_q + i];
        if (std::isfinite(lw) ? !(std::fabs(lg - lw) <= 1e-4 * std::max(1.0, std::fabs(lw)))
                              : !same_nonfinite(lg, lw))
          ++lse_bad;
      }
  std::printf("    O mismatches %lld, LSE mismatches %lld of %d rows\n", bad, lse_bad, rows);
  if (bad) err += "reduce: " + std::to_string(bad) + " O elements off\n";
  if (lse_bad) err += "reduce: " + std::to_string(lse_bad) + " LSE values off\n";
  return err + ctx.err;
}

std::string check_output(const std::vector<float> &o, const std::vector<double> &o_ref,
                         const std::vector<double> &o_lowp, const std::vector<float> &lse,
                         const std::vector<double> &lse_ref, bool fp8) {
  std::string err;
  judge("O", o, o_ref, o_lowp, lse, lse_ref, &err, fp8);
  return err;
}

}  // namespace fa::test
