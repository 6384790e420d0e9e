// KV append with rotary embedding (fa_decode_args.k_new, rotary_dim) on the
// real SmolLM2-135M fixture (tests/data/smollm2_135m, layer 24, RoPE theta
// 100000, GQA 9/3, d 64), on the emulator, fp16 and bf16: the fused path is
// checked against the model's own post-rotary values, not against our own
// rotation.
// - The cache is the fixture's k_cache / v_cache without each sequence's
//   last token (that row, position L_b - 1, and the padding rows after it
//   hold NaN); cache_seqlens = L_b - 1; k_new / v_new / q are the new
//   token's PRE-rotary K, its V and its pre-rotary Q (k_new_prerope.npy,
//   v_new.npy, q_decode_prerope.npy); the rotary tables are the model's own
//   fp32 cos/sin (rope_cos/sin.npy, rotate_half = GPT-NeoX pairs, rotary_dim
//   64, seqlen_ro 128); causal, softmax_scale 0.125.
// - (a) the K row the kernel wrote at position L_b - 1 is exactly
//   flashattn's documented rotate-then-round of the rounded inputs
//   (ref::rope_row), and is as close to the model's post-rotary row
//   (k_cache.npy) as rounding allows: k_new is passed in the dtype, so each
//   element may be off by half an ulp of each pre-rotary input of its pair
//   (times |cos|, |sin|) plus half an ulp of the result. Where the pair's two
//   terms cancel that is more than one ulp of the value (fp16: up to 27 ulp
//   on 20 of 576 elements), so "one ulp of the value" is printed, not
//   asserted. The V row is v_new rounded (= the fixture's v_cache row);
//   every other row is untouched (the prefix keeps its bits, the padding
//   its NaN).
// - (b) O against the model's attention (out_decode.npy, fp64 from the
//   model's fp32 Q/K/V) with the rule of the fixture decode test
//   (support/suite.cc, judge in support/numerics.cc): max_abs <= 2 x the
//   error of a low-precision framework computation (S fp32, P rounded to the
//   dtype) on the same rounded, rotated inputs + 1e-5, rel_l2 < 1e-2; LSE
//   against lse_decode.npy within 2e-3 relative (or twice the framework's
//   LSE error where that is larger: bf16, whose rounding of Q and K alone
//   moves the LSE by 4e-3). Automatic splits and num_splits 5.
// - (c) O and LSE are poisoned (0xFF: NaN) before the launch, the
//   workspace too, and every O / LSE element must have been written.
#include "support/cmocka.hh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "reference.h"
#include "support/emu_runtime.h"
#include "support/numerics.h"

namespace {

using fa::test::g_rt;
using fa::test::load_fixture;
using fa::test::need_runtime;

constexpr const char *kFixture = "smollm2_135m";

struct Fixture {
  std::vector<float> k_cache, v_cache, lens, q_pre, k_pre, v_new, cos, sin, out, lse;
  int batch = 0, skmax = 0, hq = 0, hkv = 0, d = 0, ro_rows = 0, half = 0;
};

bool load(const char *file, std::vector<float> *out, std::vector<int64_t> *shape) {
  if (load_fixture(kFixture, file, out, shape)) return true;
  print_error("missing %s/%s/%s.npy (tools/capture_fixture.py --only smollm2_135m)\n",
              FA_TEST_DATA_DIR, kFixture, file);
  return false;
}

bool load_all(Fixture *f) {
  std::vector<int64_t> kc, vc, ls, qp, kp, vn, cs, sn, os, lss;
  if (!load("k_cache", &f->k_cache, &kc) || !load("v_cache", &f->v_cache, &vc) ||
      !load("cache_seqlens", &f->lens, &ls) || !load("q_decode_prerope", &f->q_pre, &qp) ||
      !load("k_new_prerope", &f->k_pre, &kp) || !load("v_new", &f->v_new, &vn) ||
      !load("rope_cos", &f->cos, &cs) || !load("rope_sin", &f->sin, &sn) ||
      !load("out_decode", &f->out, &os) || !load("lse_decode", &f->lse, &lss)) {
    return false;
  }
  f->batch = int(kc[0]);
  f->skmax = int(kc[1]);
  f->hkv = int(kc[2]);
  f->d = int(kc[3]);
  f->hq = int(qp[2]);
  f->ro_rows = int(cs[0]);
  f->half = int(cs[1]);
  const bool ok = kc.size() == 4 && vc == kc && ls == std::vector<int64_t>{kc[0]} &&
                  qp == std::vector<int64_t>{kc[0], 1, qp[2], kc[3]} &&
                  kp == std::vector<int64_t>{kc[0], 1, kc[2], kc[3]} && vn == kp && sn == cs &&
                  cs.size() == 2 && 2 * cs[1] == kc[3] && os == qp &&
                  lss == std::vector<int64_t>{kc[0], qp[2], 1};
  if (!ok) print_error("unexpected fixture shapes\n");
  for (float l : f->lens)
    if (!(l >= 1 && l <= f->skmax && l <= f->ro_rows)) {
      print_error("cache_seqlens out of range\n");
      return false;
    }
  return ok;
}

uint16_t to_bits(float x, bool bf16) {
  return bf16 ? fa::ref::f32_to_bf16(x) : fa::ref::f32_to_f16(x);
}
float from_bits(uint16_t h, bool bf16) {
  return bf16 ? fa::ref::bf16_to_f32(h) : fa::ref::f16_to_f32(h);
}

// One unit in the last place of the dtype at |x| (subnormals: the smallest).
double ulp(double x, bool bf16) {
  const int mant = bf16 ? 7 : 10, emin = bf16 ? -126 : -14;
  const double a = std::fabs(x);
  const int e = a > 0 ? std::max(int(std::floor(std::log2(a))), emin) : emin;
  return std::ldexp(1.0, e - mant);
}

struct Dev {
  fa_runtime *rt;
  std::vector<uint64_t> ptrs;
  bool ok = true;
  explicit Dev(fa_runtime *r) : rt(r) {}
  ~Dev() {
    for (uint64_t p : ptrs) fa_free(rt, p);
  }
  void check(fa_status st, const char *what) {
    if (st != FA_SUCCESS && ok) {
      print_error("%s: %s\n", what, fa_last_error());
      ok = false;
    }
  }
  uint64_t put(const void *host, size_t bytes) {
    uint64_t p = 0;
    check(fa_malloc(rt, std::max<size_t>(bytes, 16), &p), "fa_malloc");
    if (!ok) return 0;
    ptrs.push_back(p);
    if (host) check(fa_memcpy_htod(rt, p, host, bytes), "fa_memcpy_htod");
    return p;
  }
};

std::vector<uint16_t> to_dtype(const std::vector<float> &x, bool bf16) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_bits(x[i], bf16);
  return out;
}

fa_tensor contiguous(uint64_t data, int s, int h, int d) {
  fa_tensor t;
  t.data = data;
  t.stride[3] = 1;
  t.stride[2] = d;
  t.stride[1] = int64_t(h) * d;
  t.stride[0] = int64_t(s) * h * d;
  return t;
}

// Softmax attention of one query row over keys 0..n-1 the way a framework
// computes it at low precision (S in fp32, P rounded to the dtype, O
// accumulated in fp32 and rounded): the yardstick of the fixture tests.
// Returns its LSE (fp32).
float lowp_row(const float *q, const std::vector<float> &k, const std::vector<float> &v, int b,
               int n, int h_kv, const Fixture &f, bool bf16, float scale, float *o) {
  std::vector<float> s(static_cast<size_t>(n));
  float m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float *kr = &k[((size_t(b) * f.skmax + j) * f.hkv + h_kv) * f.d];
    float dot = 0;
    for (int c = 0; c < f.d; ++c) dot += q[c] * kr[c];
    s[size_t(j)] = dot * scale;
    m = std::max(m, s[size_t(j)]);
  }
  float l = 0;
  for (float &x : s) {
    x = std::exp(x - m);
    l += x;
  }
  for (int c = 0; c < f.d; ++c) {
    float acc = 0;
    for (int j = 0; j < n; ++j)
      acc += fa::ref::round_to(s[size_t(j)] / l, bf16) *
             v[((size_t(b) * f.skmax + j) * f.hkv + h_kv) * f.d + c];
    o[c] = fa::ref::round_to(acc, bf16);
  }
  return m + std::log(l);
}

struct Result {
  std::string err;
  double k_vs_model = 0, k_vs_model_ulps = 0, k_vs_bound = 0;  // new K row vs the model's
  long long k_over_ulp = 0;                                    // elements > 1 ulp off
  double o_err = 0, o_tol = 0, lse_err = 0, lse_tol = 0;
};

// interleaved: the pairing passed to the kernel (the fixture is NeoX; 1 is
// only for trying that the checks catch a wrong convention).
// splits: fa_decode_args.num_splits (0 = chosen).
Result run_case(const Fixture &f, bool bf16, int interleaved, int splits_arg) {
  Result r;
  const int B = f.batch, S = f.skmax, HQ = f.hq, HKV = f.hkv, D = f.d;
  const float scale = 0.125f;
  std::vector<int32_t> before(static_cast<size_t>(B)), after(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    after[size_t(b)] = int32_t(f.lens[size_t(b)]);
    before[size_t(b)] = after[size_t(b)] - 1;
  }
  // The cache before the append: the fixture's rows 0..L-2; the new token's
  // row and the padding after it are NaN (never to be read).
  std::vector<float> kh = f.k_cache, vh = f.v_cache;
  const size_t row = size_t(HKV) * D;
  for (int b = 0; b < B; ++b)
    for (int j = before[size_t(b)]; j < S; ++j) {
      std::fill_n(kh.begin() + (size_t(b) * S + j) * row, row, NAN);
      std::fill_n(vh.begin() + (size_t(b) * S + j) * row, row, NAN);
    }
  const std::vector<uint16_t> kbits = to_dtype(kh, bf16), vbits = to_dtype(vh, bf16);

  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  desc.head_dim = D;
  desc.num_heads_q = HQ;
  desc.num_heads_kv = HKV;
  desc.causal = 1;
  desc.softmax_scale = scale;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS) {
    r.err = std::string("fa_config_create: ") + fa_last_error();
    return r;
  }
  Dev dev(g_rt);
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = B;
  a.seqlen_q = 1;
  a.seqlen_k_max = S;
  a.num_splits = splits_arg;
  const std::vector<uint16_t> qb = to_dtype(f.q_pre, bf16), knb = to_dtype(f.k_pre, bf16),
                              vnb = to_dtype(f.v_new, bf16);
  a.q = contiguous(dev.put(qb.data(), qb.size() * 2), 1, HQ, D);
  a.k_cache = contiguous(dev.put(kbits.data(), kbits.size() * 2), S, HKV, D);
  a.v_cache = contiguous(dev.put(vbits.data(), vbits.size() * 2), S, HKV, D);
  a.cache_seqlens = dev.put(before.data(), before.size() * 4);
  a.k_new = contiguous(dev.put(knb.data(), knb.size() * 2), 1, HKV, D);
  a.v_new = contiguous(dev.put(vnb.data(), vnb.size() * 2), 1, HKV, D);
  a.seqlen_new = 1;
  a.rotary_dim = D;
  a.rotary_cos = dev.put(f.cos.data(), f.cos.size() * 4);
  a.rotary_sin = dev.put(f.sin.data(), f.sin.size() * 4);
  a.seqlen_ro = f.ro_rows;
  a.rotary_interleaved = interleaved;
  a.rotary_dtype = FA_DTYPE_FP32;
  const size_t o_n = size_t(B) * HQ * D, lse_n = size_t(B) * HQ;
  a.o = contiguous(dev.put(nullptr, o_n * 2), 1, HQ, D);
  a.lse = dev.put(nullptr, lse_n * 4);
  size_t ws = 0;
  int32_t splits = 0;
  dev.check(fa_decode_workspace_size(g_rt, cfg, &a, &ws, &splits), "fa_decode_workspace_size");
  a.workspace = dev.put(nullptr, ws);
  a.workspace_size = ws;
  if (dev.ok) {
    dev.check(fa_memset(g_rt, a.o.data, 0xFF, o_n * 2), "poison O");
    dev.check(fa_memset(g_rt, a.lse, 0xFF, lse_n * 4), "poison LSE");
    dev.check(fa_memset(g_rt, a.workspace, 0xFF, ws), "poison workspace");
  }
  if (dev.ok) dev.check(fa_decode(g_rt, cfg, &a, nullptr), "fa_decode");
  if (dev.ok) dev.check(fa_synchronize(g_rt, nullptr), "fa_synchronize");
  std::vector<uint16_t> kout(kbits.size()), vout(vbits.size()), ob(o_n);
  std::vector<float> lse(lse_n);
  if (dev.ok) {
    dev.check(fa_memcpy_dtoh(g_rt, kout.data(), a.k_cache.data, kout.size() * 2), "get K");
    dev.check(fa_memcpy_dtoh(g_rt, vout.data(), a.v_cache.data, vout.size() * 2), "get V");
    dev.check(fa_memcpy_dtoh(g_rt, ob.data(), a.o.data, o_n * 2), "get O");
    dev.check(fa_memcpy_dtoh(g_rt, lse.data(), a.lse, lse_n * 4), "get LSE");
  }
  fa_config_destroy(cfg);
  if (!dev.ok) {
    r.err = "device call failed\n";
    return r;
  }
  std::printf("    %s, splits %d, interleaved %d\n", bf16 ? "bf16" : "fp16", splits, interleaved);

  // (a) The cache after the append. Expected: prefix rows keep their bits,
  // the new row is the documented rotate-then-round of the rounded inputs,
  // padding keeps its NaN bits; the new K row is also within one ulp of the
  // model's own post-rotary row.
  // The cache the kernel should attend over (the new row as specified).
  std::vector<float> k_after(kh.size()), v_after(vh.size());
  long long k_bad = 0, k_spec = 0, v_bad = 0, other_bad = 0;
  for (int b = 0; b < B; ++b) {
    const int p = before[size_t(b)];
    for (int j = 0; j < S; ++j)
      for (int h = 0; h < HKV; ++h) {
        const size_t base = ((size_t(b) * S + j) * HKV + h) * D;
        if (j != p) {
          for (int c = 0; c < D; ++c) {
            other_bad += kout[base + c] != kbits[base + c];
            other_bad += vout[base + c] != vbits[base + c];
            k_after[base + c] = from_bits(kbits[base + c], bf16);
            v_after[base + c] = from_bits(vbits[base + c], bf16);
          }
          continue;
        }
        std::vector<float> spec(static_cast<size_t>(D));
        const size_t nb = (size_t(b) * HKV + h) * D;
        for (int c = 0; c < D; ++c) spec[size_t(c)] = from_bits(knb[nb + c], bf16);
        fa::ref::rope_row(spec.data(), D, false, &f.cos[size_t(p) * f.half],
                          &f.sin[size_t(p) * f.half], bf16);
        for (int c = 0; c < D; ++c) {
          const float got = from_bits(kout[base + c], bf16);
          const double model = f.k_cache[base + c];  // post-rotary, fp32
          const double diff = std::fabs(double(got) - model);
          const double u = ulp(model, bf16);
          // What rounding alone allows: k_new is passed in the dtype, so
          // each input of the pair (x0, x1) carries up to half an ulp of
          // its own, scaled by |cos| / |sin|; the result is rounded once
          // more (half an ulp); fp32 arithmetic adds a few 2^-24.
          const int i = c % f.half;
          const float cs = f.cos[size_t(p) * f.half + i], sn = f.sin[size_t(p) * f.half + i];
          const double x_own = f.k_pre[nb + c], x_pair = f.k_pre[nb + (c + f.half) % D];
          const double bound =
              0.5 * (ulp(x_own, bf16) * std::fabs(cs) + ulp(x_pair, bf16) * std::fabs(sn)) +
              0.5 * ulp(std::max(std::fabs(double(got)), std::fabs(model)), bf16) +
              std::ldexp(std::fabs(x_own * cs) + std::fabs(x_pair * sn), -20);
          if (!(diff <= bound)) ++k_bad;
          if (!(diff <= u)) ++r.k_over_ulp;
          if (std::isfinite(diff)) {
            r.k_vs_model = std::max(r.k_vs_model, diff);
            r.k_vs_model_ulps = std::max(r.k_vs_model_ulps, diff / u);
            r.k_vs_bound = std::max(r.k_vs_bound, diff / bound);
          } else {
            r.k_vs_model = r.k_vs_model_ulps = r.k_vs_bound = INFINITY;
          }
          k_spec += kout[base + c] != to_bits(spec[size_t(c)], bf16);
          v_bad += vout[base + c] != vnb[nb + c];
          v_bad += vout[base + c] != to_bits(f.v_cache[base + c], bf16);  // v_new is that row
          k_after[base + c] = spec[size_t(c)];
          v_after[base + c] = from_bits(vnb[nb + c], bf16);
        }
      }
  }
  std::printf(
      "    new K rows vs the model's post-rotary rows: max |diff| %.3g, max %.2f ulp of "
      "the value (%lld of %d elements over 1 ulp), max %.2f of the rounding bound\n",
      r.k_vs_model, r.k_vs_model_ulps, r.k_over_ulp, B * HKV * D, r.k_vs_bound);
  if (k_bad)
    r.err += std::to_string(k_bad) +
             " new K elements further from the model's row than input + output rounding allow\n";
  if (k_spec)
    r.err += std::to_string(k_spec) + " new K elements differ from rotate-then-round bits\n";
  if (v_bad) r.err += std::to_string(v_bad) + " new V elements differ from v_new\n";
  if (other_bad)
    r.err += std::to_string(other_bad) + " cache elements outside the new row changed\n";

  // (b), (c) O and LSE against the model's attention.
  double base_err = 0, base_lse = 0, sum2 = 0, ref2 = 0, max_ref = 0;
  long long unwritten = 0;
  for (int b = 0; b < B; ++b) {
    const int p = before[size_t(b)];
    for (int h = 0; h < HQ; ++h) {
      const int hk = h / (HQ / HKV);
      std::vector<float> qr(static_cast<size_t>(D));  // the query the kernel attends with
      for (int c = 0; c < D; ++c) qr[size_t(c)] = from_bits(qb[(size_t(b) * HQ + h) * D + c], bf16);
      fa::ref::rope_row(qr.data(), D, false, &f.cos[size_t(p) * f.half], &f.sin[size_t(p) * f.half],
                        bf16);
      std::vector<float> lo(static_cast<size_t>(D));
      const float lo_lse =
          lowp_row(qr.data(), k_after, v_after, b, after[size_t(b)], hk, f, bf16, scale, lo.data());
      for (int c = 0; c < D; ++c) {
        const size_t i = (size_t(b) * HQ + h) * D + c;
        const double want = f.out[i], got = from_bits(ob[i], bf16);
        if (!std::isfinite(got)) {
          ++unwritten;
          continue;
        }
        r.o_err = std::max(r.o_err, std::fabs(got - want));
        base_err = std::max(base_err, std::fabs(double(lo[size_t(c)]) - want));
        sum2 += (got - want) * (got - want);
        ref2 += want * want;
        max_ref = std::max(max_ref, std::fabs(want));
      }
      const size_t li = size_t(b) * HQ + h;
      if (!std::isfinite(lse[li])) {
        ++unwritten;
        continue;
      }
      const double lse_scale = std::max(1.0, std::fabs(double(f.lse[li])));
      r.lse_err = std::max(r.lse_err, std::fabs(double(lse[li]) - f.lse[li]) / lse_scale);
      base_lse = std::max(base_lse, std::fabs(double(lo_lse) - f.lse[li]) / lse_scale);
    }
  }
  r.o_tol = 2.0 * base_err + 1e-5;
  // LSE: the judge's 2e-3, or twice the framework's LSE error where the
  // rounding of Q and K to the dtype alone costs more (bf16).
  r.lse_tol = std::max(2e-3, 2.0 * base_lse + 1e-5);
  const double rel_l2 = std::sqrt(sum2 / std::max(ref2, 1e-300));
  std::printf(
      "    O vs the model's attention: max_abs %.3g (tol %.3g = 2 x low-precision "
      "framework error %.3g + 1e-5), rel_l2 %.3g, max|ref| %.3g, lse rel err %.3g "
      "(tol %.3g; framework %.3g)\n",
      r.o_err, r.o_tol, base_err, rel_l2, max_ref, r.lse_err, r.lse_tol, base_lse);
  if (unwritten) r.err += std::to_string(unwritten) + " O/LSE elements unwritten (NaN)\n";
  if (r.o_err > r.o_tol) r.err += "O max_abs over tolerance\n";
  if (rel_l2 >= 1e-2) r.err += "O rel_l2 >= 1e-2\n";
  if (r.lse_err > r.lse_tol) r.err += "LSE error over tolerance\n";
  return r;
}

void check(bool bf16) {
  need_runtime();
  Fixture f;
  if (!load_all(&f)) fail();
  std::string failures;
  for (int splits : {0, 5}) {  // automatic (one split here), and splits that cut the cache
    const Result r = run_case(f, bf16, 0, splits);
    if (!r.err.empty()) failures += "num_splits " + std::to_string(splits) + ":\n" + r.err;
  }
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

void test_fixture_rope_fp16(void **) { check(false); }
void test_fixture_rope_bf16(void **) { check(true); }

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture_rope_fp16),
      cmocka_unit_test(test_fixture_rope_bf16),
  };
  return cmocka_run_group_tests_name("fixture_rope", tests, fa::test::emu_runtime_setup,
                                     fa::test::emu_runtime_teardown);
}
