// fp32 Q/K/V/O (fa_config_desc.dtype FA_DTYPE_FP32) in fa_launch on the
// emulator (sm_80 and sm_90), against the fp64 reference on the inputs
// rounded to bf16 exactly as the kernel rounds them (round to nearest even,
// tools/common/reference.cc f32_to_bf16):
// - fresh random inputs; head dims 64, 128, 72 and 96 (head_dim_v 64), 384 / 320
//   and MLA's 576 / 512 (O in slices);
//   causal and not, GQA, a window with softcap, varlen (cu_seqlens), paged
//   KV with per-row (page 16) and per-tile (page 64) lookups;
// - inputs with gaps at every stride level holding NaN (never read), O and
//   LSE poisoned with NaN first: every O element and LSE written and
//   finite, every O gap still poisoned;
// - O within twice the error of the same attention at framework precision
//   (P rounded to bf16, O kept in fp32) and rel_l2 < 1e-2, LSE within 2e-3;
//   O holds fp32 values (most are not bf16 or fp16 numbers: not rounded);
// - the launch ran the mma.sync forward with the f32 variant (by name, on
//   sm_90 too, where 16-bit dtypes take the wgmma kernel);
// - fa_decode (with its combine writing fp32 O) on every KV layout
//   (contiguous, paged by tile and by row, pointer arrays), GQA packing,
//   seqlen_q > 1, forced splits, an empty cache; cache rows past
//   cache_seqlens hold NaN (never read);
// - FA_ERROR_UNSUPPORTED for the scalar kernels (FLASHATTN_SCALAR_FORWARD,
//   FLASHATTN_SCALAR_DECODE), a KV append and an fp8 kv_dtype;
//   fa_decode_reduce alone writes fp32 O.
#include "support/cmocka.hh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/dev.h"
#include "support/numerics.h"

namespace {

fa_runtime *g_rt80 = nullptr, *g_rt90 = nullptr;
std::string g_why;

int setup(void **) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  g_rt80 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 80);
  g_rt90 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 90);
  return 0;
}
int teardown(void **) {
  fa_runtime_destroy(g_rt80);
  fa_runtime_destroy(g_rt90);
  unsetenv("FLASHATTN_EMU_PROFILE");
  return 0;
}
void need_runtime() {
  if (!g_rt80 || !g_rt90) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
}

constexpr uint32_t kPoison = 0xFFFFFFFFu;  // a NaN

struct Case {
  int batch = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 64, dv = 0;
  bool causal = false;
  int window_left = -1;
  float softcap = 0;
  std::vector<int> lq, lk;  // varlen: per-sequence lengths (sq, sk are the maxima)
  int page_size = 0;        // > 0: paged K/V (FA_KV_PAGED), pages in shuffled order
  uint32_t seed = 1;
  bool varlen() const { return !lq.empty(); }
  int dvv() const { return dv ? dv : d; }
  std::string describe() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "b%d sq%d sk%d hq%d hkv%d d%d dv%d%s wl%d cap%g%s ps%d", batch,
                  sq, sk, hq, hkv, d, dvv(), causal ? " causal" : "", window_left, softcap,
                  varlen() ? " varlen" : "", page_size);
    return buf;
  }
};

using fa::test::Dev;

float nan_f() { return std::numeric_limits<float>::quiet_NaN(); }
double bf16_round(float x) { return fa::ref::round_to(x, true); }

// A [b, s, h, d] view with gaps at every level (multiples of 8 elements).
fa_tensor view(int s, int h, int d) {
  fa_tensor t{};
  t.stride[3] = 1;
  t.stride[2] = d + 8;
  t.stride[1] = int64_t(h) * t.stride[2] + 16;
  t.stride[0] = int64_t(s) * t.stride[1] + 24;
  return t;
}
size_t at(const fa_tensor &t, int b, int s, int h, int x) {
  return size_t(b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + x);
}

// The attention of one sequence at framework precision for fp32 outputs:
// S in fp64 on the rounded inputs, P rounded to bf16 (the kernel's P V
// operand), O accumulated and kept unrounded. Its error against fp64 is the
// yardstick. q [sq, hq, d], k [sk, hkv, d], v [sk, hkv, dv] contiguous.
std::vector<double> lowp(const Case &c, int sq, int sk, const std::vector<double> &q,
                         const std::vector<double> &k, const std::vector<double> &v) {
  const int d = c.d, dv = c.dvv(), g = c.hq / c.hkv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> o(size_t(sq) * c.hq * dv, 0.0);
  std::vector<double> s(static_cast<size_t>(sk));
  for (int h = 0; h < c.hq; ++h)
    for (int i = 0; i < sq; ++i) {
      const long long diag = (long long)i + sk - sq;
      long long lo = 0, hi = sk - 1;
      if (c.window_left >= 0) lo = std::max(lo, diag - c.window_left);
      if (c.causal) hi = std::min(hi, diag);
      if (lo > hi) continue;
      double m = -INFINITY;
      for (long long j = lo; j <= hi; ++j) {
        double dot = 0;
        for (int x = 0; x < d; ++x)
          dot += q[(size_t(i) * c.hq + h) * d + x] * k[(size_t(j) * c.hkv + h / g) * d + x];
        double y = dot * scale;
        if (c.softcap > 0) y = c.softcap * std::tanh(y / c.softcap);
        s[size_t(j)] = y;
        m = std::max(m, y);
      }
      double l = 0;
      for (long long j = lo; j <= hi; ++j) l += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
      for (int x = 0; x < dv; ++x) {
        double acc = 0;
        for (long long j = lo; j <= hi; ++j)
          acc += bf16_round(float(s[size_t(j)] / l)) * v[(size_t(j) * c.hkv + h / g) * dv + x];
        o[(size_t(i) * c.hq + h) * dv + x] = acc;
      }
    }
  return o;
}

// Runs one case on rt; returns the errors found (empty = passed).
// What a case's outputs add up to against the reference: O element by
// element (got vs the fp64 r, base = the P-in-bf16 computation), each LSE,
// each O gap, then the verdict ("" when the case passed).
struct Tally {
  double max_err = 0, max_base = 0, se = 0, sr = 0, lse_err = 0;
  long long bad = 0, gaps = 0, rounded16 = 0, n_o = 0;
  void o(float got, double r, double base) {
    n_o += r != 0;
    if (!std::isfinite(got)) {
      ++bad;
      return;
    }
    if (r != 0 && (double(fa::ref::round_to(got, true)) == got ||
                   double(fa::ref::round_to(got, false)) == got))
      ++rounded16;
    max_err = std::max(max_err, std::fabs(got - r));
    max_base = std::max(max_base, std::fabs(base - r));
    se += (got - r) * (got - r);
    sr += r * r;
  }
  void lse(float got, double r) {
    if (std::isinf(r)) {
      if (!(std::isinf(got) && got < 0)) ++bad;
    } else if (!std::isfinite(got)) {
      ++bad;
    } else {
      lse_err = std::max(lse_err, std::fabs(got - r) / std::max(1.0, std::fabs(r)));
    }
  }
  void gap(float o) {
    uint32_t u;
    std::memcpy(&u, &o, 4);
    if (u != kPoison) ++gaps;
  }
  std::string verdict(const std::string &what) const {
    const double tol = 2.0 * max_base + 1e-5, rel = sr > 0 ? std::sqrt(se / sr) : 0;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%s: max_abs %.3g (tol %.3g), rel_l2 %.3g, lse err %.3g, %lld of %lld nonzero O "
                  "values 16-bit numbers",
                  what.c_str(), max_err, tol, rel, lse_err, rounded16, n_o);
    std::printf("    %s\n", buf);
    std::string err;
    if (bad) err += std::string(buf) + " | " + std::to_string(bad) + " NaN or unwritten values\n";
    if (gaps) err += std::string(buf) + " | O gaps written\n";
    if (max_err > tol) err += std::string(buf) + " | max_abs over tolerance\n";
    if (rel >= 1e-2) err += std::string(buf) + " | rel_l2 >= 1e-2\n";
    if (lse_err > 2e-3) err += std::string(buf) + " | LSE error over 2e-3\n";
    if (rounded16 * 4 > n_o) err += std::string(buf) + " | O looks rounded to 16 bits\n";
    return err;
  }
};

std::string run_case(fa_runtime *rt, const Case &c) {
  Dev dev(rt);
  const int d = c.d, dv = c.dvv();
  const bool var = c.varlen();
  std::vector<int> lq(c.batch, c.sq), lk(c.batch, c.sk);
  if (var) lq = c.lq, lk = c.lk;
  std::vector<int32_t> cq(c.batch + 1, 0), ck(c.batch + 1, 0);
  for (int b = 0; b < c.batch; ++b) cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
  // Views: varlen packs the sequences along dim 1 of "batch" 0.
  const int nb = var ? 1 : c.batch, rq = var ? cq[c.batch] : c.sq, rk = var ? ck[c.batch] : c.sk;
  fa_tensor tq = view(rq, c.hq, d), tk = view(rk, c.hkv, d), tv = view(rk, c.hkv, dv),
            to = view(rq, c.hq, dv);
  std::mt19937 gen(c.seed * 7919u + 17u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Host values per sequence, contiguous [s, h, d], and their bf16 roundings.
  std::vector<std::vector<float>> hq(c.batch), hk(c.batch), hv(c.batch);
  for (int b = 0; b < c.batch; ++b) {
    hq[b].resize(size_t(lq[b]) * c.hq * d);
    hk[b].resize(size_t(lk[b]) * c.hkv * d);
    hv[b].resize(size_t(lk[b]) * c.hkv * dv);
    for (auto *vec : {&hq[b], &hk[b], &hv[b]})
      for (float &x : *vec) x = nd(gen);
  }
  // Row r of sequence b in a view: (b, r) or, packed, (0, cu[b] + r).
  auto place = [&](const fa_tensor &t, const std::vector<std::vector<float>> &src, int heads,
                   int cols, const std::vector<int> &lens, const std::vector<int32_t> &cu,
                   size_t total) {
    std::vector<float> buf(total, nan_f());  // gaps hold NaN: never read
    for (int b = 0; b < c.batch; ++b)
      for (int r = 0; r < lens[b]; ++r)
        for (int h = 0; h < heads; ++h)
          for (int x = 0; x < cols; ++x)
            buf[at(t, var ? 0 : b, var ? cu[b] + r : r, h, x)] =
                src[b][(size_t(r) * heads + h) * cols + x];
    return buf;
  };
  const std::vector<float> dq = place(tq, hq, c.hq, d, lq, cq, size_t(nb) * size_t(tq.stride[0]));
  tq.data = dev.put(dq.data(), dq.size() * 4);
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = c.sq;
  a.seqlen_k = c.sk;
  std::vector<int32_t> table;
  if (c.page_size > 0) {
    // Pages [num_pages, page_size, hkv, d] with gaps, in shuffled order.
    const int ps = c.page_size, per = (c.sk + ps - 1) / ps, np = c.batch * per + 1;
    std::vector<int32_t> order(np);
    for (int i = 0; i < np; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), gen);
    table.assign(order.begin(), order.begin() + c.batch * per);
    for (int pass = 0; pass < 2; ++pass) {
      const int cols = pass ? dv : d;
      fa_tensor t{};
      t.stride[3] = 1;
      t.stride[2] = cols + 8;
      t.stride[1] = int64_t(c.hkv) * t.stride[2];
      t.stride[0] = int64_t(ps) * t.stride[1] + 32;
      std::vector<float> buf(size_t(np) * size_t(t.stride[0]), nan_f());
      const auto &src = pass ? hv : hk;
      for (int b = 0; b < c.batch; ++b)
        for (int j = 0; j < c.sk; ++j)
          for (int h = 0; h < c.hkv; ++h)
            for (int x = 0; x < cols; ++x)
              buf[size_t(table[size_t(b) * per + j / ps]) * t.stride[0] + (j % ps) * t.stride[1] +
                  h * t.stride[2] + x] = src[b][(size_t(j) * c.hkv + h) * cols + x];
      t.data = dev.put(buf.data(), buf.size() * 4);
      (pass ? a.v : a.k) = t;
    }
    a.kv.layout = FA_KV_PAGED;
    a.kv.page_size = ps;
    a.kv.num_pages = np;
    a.kv.max_pages_per_seq = per;
    a.kv.block_table = dev.put(table.data(), table.size() * 4);
    a.kv.block_table_stride = per;
  } else {
    const std::vector<float> dk =
        place(tk, hk, c.hkv, d, lk, ck, size_t(nb) * size_t(tk.stride[0]));
    const std::vector<float> dvs =
        place(tv, hv, c.hkv, dv, lk, ck, size_t(nb) * size_t(tv.stride[0]));
    tk.data = dev.put(dk.data(), dk.size() * 4);
    tv.data = dev.put(dvs.data(), dvs.size() * 4);
    a.k = tk;
    a.v = tv;
  }
  const size_t o_elems = size_t(nb) * size_t(to.stride[0]);
  const size_t lse_n = size_t(c.hq) * (var ? size_t(cq[c.batch]) : size_t(c.batch) * c.sq);
  to.data = dev.put(nullptr, o_elems * 4);
  a.q = tq;
  a.o = to;
  a.lse = dev.put(nullptr, lse_n * 4);
  if (var) {
    a.cu_seqlens_q = dev.put(cq.data(), cq.size() * 4);
    a.cu_seqlens_k = dev.put(ck.data(), ck.size() * 4);
  }
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_FP32;
  desc.head_dim = d;
  desc.head_dim_v = dv;
  desc.num_heads_q = c.hq;
  desc.num_heads_kv = c.hkv;
  desc.causal = c.causal;
  desc.window_left = c.window_left;
  desc.softcap = c.softcap;
  dev.check(fa_config_create(&desc, &dev.cfg), "fa_config_create");
  if (!dev.err.empty()) return dev.err;
  dev.check(fa_memset(rt, to.data, 0xFF, o_elems * 4), "poison O");
  dev.check(fa_memset(rt, a.lse, 0xFF, lse_n * 4), "poison LSE");
  dev.check(fa_launch(rt, dev.cfg, &a, nullptr), "fa_launch");
  dev.check(fa_synchronize(rt, nullptr), "fa_synchronize");
  if (!dev.err.empty()) return dev.err;
  std::string err;
  fa_emu_profile prof;
  std::memset(&prof, 0, sizeof prof);
  prof.struct_size = sizeof prof;
  if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
      std::strncmp(prof.kernel, "fa_forward_mma_f32_", 19) != 0)
    err += std::string("kernel ") + prof.kernel + " is not the fp32 mma.sync forward\n";
  std::vector<float> o(o_elems), lse(lse_n);
  dev.check(fa_memcpy_dtoh(rt, o.data(), to.data, o_elems * 4), "download O");
  dev.check(fa_memcpy_dtoh(rt, lse.data(), a.lse, lse_n * 4), "download LSE");
  if (!dev.err.empty()) return dev.err;

  // References per sequence on the bf16-rounded inputs.
  Tally t;
  std::vector<bool> real(o_elems, false);
  for (int b = 0; b < c.batch; ++b) {
    std::vector<double> q(hq[b].size()), k(hk[b].size()), v(hv[b].size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_round(hq[b][i]);
    for (size_t i = 0; i < k.size(); ++i) k[i] = bf16_round(hk[b][i]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_round(hv[b][i]);
    fa::ref::Problem p;
    p.seqlen_q = lq[b];
    p.seqlen_k = lk[b];
    p.num_heads_q = c.hq;
    p.num_heads_kv = c.hkv;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.causal = c.causal;
    p.window_left = c.window_left;
    p.softcap = c.softcap;
    std::vector<double> oref(size_t(lq[b]) * c.hq * dv), lref(size_t(c.hq) * lq[b]);
    fa::ref::attention(p, q.data(), k.data(), v.data(), oref.data(), lref.data());
    const std::vector<double> olow = lowp(c, lq[b], lk[b], q, k, v);
    for (int i = 0; i < lq[b]; ++i)
      for (int h = 0; h < c.hq; ++h) {
        for (int x = 0; x < dv; ++x) {
          const size_t gi = at(to, var ? 0 : b, var ? cq[b] + i : i, h, x);
          real[gi] = true;
          const size_t ri = (size_t(i) * c.hq + h) * dv + x;
          t.o(o[gi], oref[ri], olow[ri]);
        }
        const size_t li =
            var ? size_t(h) * cq[c.batch] + cq[b] + i : (size_t(b) * c.hq + h) * c.sq + i;
        t.lse(lse[li], lref[size_t(h) * lq[b] + i]);
      }
  }
  for (size_t i = 0; i < o_elems; ++i)
    if (!real[i]) t.gap(o[i]);
  return err + t.verdict(c.describe());
}

// Runs every case through `run` (run_case, run_decode_case); fails the
// test with their reports when any failed.
template <typename C, typename Run>
void run_cases(fa_runtime *rt, const std::vector<C> &cases, Run run, const char *what) {
  std::string all;
  for (const C &c : cases) all += run(rt, c);
  if (!all.empty()) {
    std::printf("%s", all.c_str());
    fail_msg("fp32 %s cases failed", what);
  }
}

void run_all(fa_runtime *rt, const std::vector<Case> &cases) {
  run_cases(rt, cases, run_case, "forward");
}

std::vector<Case> base_cases() {
  std::vector<Case> v;
  Case c;
  c.batch = 2, c.sq = 37, c.sk = 70, c.hq = 2, c.hkv = 2, c.d = 64, c.seed = 1;
  v.push_back(c);
  c = Case();
  c.sq = 65, c.sk = 65, c.hq = 4, c.hkv = 1, c.d = 128, c.causal = true, c.seed = 2;
  v.push_back(c);
  c = Case();
  c.sq = 20, c.sk = 100, c.hq = 2, c.hkv = 1, c.d = 72, c.causal = true, c.seed = 3;
  v.push_back(c);
  c = Case();
  c.sq = 33, c.sk = 50, c.hq = 2, c.hkv = 2, c.d = 96, c.dv = 64, c.window_left = 16;
  c.softcap = 30, c.seed = 4;
  v.push_back(c);
  c = Case();
  c.batch = 3, c.sq = 33, c.sk = 70, c.hq = 2, c.hkv = 1, c.d = 64, c.causal = true;
  c.lq = {5, 33, 17}, c.lk = {40, 33, 70}, c.seed = 5;
  v.push_back(c);
  c = Case();  // past 256: O in two slices of 160
  c.sq = 18, c.sk = 40, c.hq = 2, c.hkv = 1, c.d = 384, c.dv = 320, c.causal = true, c.seed = 6;
  v.push_back(c);
  return v;
}

void test_forward_sm80(void **) {
  need_runtime();
  run_all(g_rt80, base_cases());
}

// sm_90: fp32 takes the mma.sync forward (16-bit dtypes the wgmma one).
void test_forward_sm90(void **) {
  need_runtime();
  std::vector<Case> v = base_cases();
  v.erase(v.begin());  // the rest covers it
  for (Case &c : v) c.seed += 100;
  run_all(g_rt90, v);
}

// Paged KV: pages shorter than a key tile (rows gathered one by one) and
// whole-tile pages.
void test_forward_paged(void **) {
  need_runtime();
  std::vector<Case> v;
  Case c;
  c.batch = 2, c.sq = 17, c.sk = 80, c.hq = 2, c.hkv = 1, c.d = 64, c.causal = true;
  c.page_size = 16, c.seed = 11;
  v.push_back(c);
  c = Case();
  c.batch = 2, c.sq = 30, c.sk = 130, c.hq = 2, c.hkv = 2, c.d = 128, c.page_size = 64;
  c.seed = 12;
  v.push_back(c);
  run_all(g_rt80, v);
}

// ---- fa_decode ----

struct DCase {
  int batch = 2, sq = 1, skmax = 64, hq = 4, hkv = 1, d = 64, dv = 0;
  std::vector<int> lens;  // cache_seqlens, size batch
  bool causal = false;
  int layout = FA_KV_CONTIGUOUS, page_size = 0;
  int splits = 0;
  uint32_t seed = 1;
  std::string describe() const {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "decode b%d sq%d skmax%d hq%d hkv%d d%d dv%d%s layout%d ps%d "
                  "splits%d",
                  batch, sq, skmax, hq, hkv, d, dv ? dv : d, causal ? " causal" : "", layout,
                  page_size, splits);
    return buf;
  }
};

// One fa_decode (with its combine: fp32 O) against the references.
std::string run_decode_case(fa_runtime *rt, const DCase &c) {
  Dev dev(rt);
  const int d = c.d, dv = c.dv ? c.dv : c.d, sk = c.skmax;
  std::mt19937 gen(c.seed * 104729u + 3u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Host [b, s, h, x]; cache rows past lens[b] are NaN (never read).
  std::vector<float> hq(size_t(c.batch) * c.sq * c.hq * d), hk(size_t(c.batch) * sk * c.hkv * d),
      hv(size_t(c.batch) * sk * c.hkv * dv);
  for (float &x : hq) x = nd(gen);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<float> &t = pass ? hv : hk;
    const size_t row = size_t(c.hkv) * (pass ? dv : d);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = int((i / row) % sk) < c.lens[(i / row) / sk] ? nd(gen) : nan_f();
  }
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = c.batch;
  a.seqlen_q = c.sq;
  a.seqlen_k_max = sk;
  fa_tensor tq = view(c.sq, c.hq, d), to = view(c.sq, c.hq, dv);
  {
    std::vector<float> buf(size_t(c.batch) * tq.stride[0], nan_f());
    for (int b = 0; b < c.batch; ++b)
      for (int s = 0; s < c.sq; ++s)
        for (int h = 0; h < c.hq; ++h)
          for (int x = 0; x < d; ++x)
            buf[at(tq, b, s, h, x)] = hq[((size_t(b) * c.sq + s) * c.hq + h) * d + x];
    tq.data = dev.put(buf.data(), buf.size() * 4);
  }
  std::vector<int32_t> table;
  const int ps = c.page_size, per = ps ? (sk + ps - 1) / ps : 0, np = c.batch * per + 2;
  if (c.layout == FA_KV_PAGED) {
    std::vector<int32_t> order(np);
    for (int i = 0; i < np; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), gen);
    table.assign(order.begin(), order.begin() + c.batch * per);
  }
  uint64_t ptrs[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass) {
    const int cols = pass ? dv : d;
    const std::vector<float> &src = pass ? hv : hk;
    auto val = [&](int b, int j, int h, int x) {
      return src[((size_t(b) * sk + j) * c.hkv + h) * cols + x];
    };
    fa_tensor t = view(sk, c.hkv, cols);
    if (c.layout == FA_KV_PAGED) {
      t.stride[1] = int64_t(c.hkv) * t.stride[2];
      t.stride[0] = int64_t(ps) * t.stride[1] + 32;
      std::vector<float> buf(size_t(np) * t.stride[0], nan_f());
      for (int b = 0; b < c.batch; ++b)
        for (int j = 0; j < sk; ++j)
          for (int h = 0; h < c.hkv; ++h)
            for (int x = 0; x < cols; ++x)
              buf[at(t, table[size_t(b) * per + j / ps], j % ps, h, x)] = val(b, j, h, x);
      t.data = dev.put(buf.data(), buf.size() * 4);
    } else if (c.layout == FA_KV_PTR_ARRAY) {
      std::vector<uint64_t> p(c.batch);
      for (int b = 0; b < c.batch; ++b) {
        std::vector<float> buf(size_t(t.stride[0]), nan_f());
        for (int j = 0; j < sk; ++j)
          for (int h = 0; h < c.hkv; ++h)
            for (int x = 0; x < cols; ++x) buf[at(t, 0, j, h, x)] = val(b, j, h, x);
        p[b] = dev.put(buf.data(), buf.size() * 4);
      }
      ptrs[pass] = dev.put(p.data(), p.size() * 8);
    } else {
      std::vector<float> buf(size_t(c.batch) * t.stride[0], nan_f());
      for (int b = 0; b < c.batch; ++b)
        for (int j = 0; j < sk; ++j)
          for (int h = 0; h < c.hkv; ++h)
            for (int x = 0; x < cols; ++x) buf[at(t, b, j, h, x)] = val(b, j, h, x);
      t.data = dev.put(buf.data(), buf.size() * 4);
    }
    (pass ? a.v_cache : a.k_cache) = t;
  }
  a.kv.layout = c.layout;
  if (c.layout == FA_KV_PAGED) {
    a.kv.page_size = ps;
    a.kv.num_pages = np;
    a.kv.max_pages_per_seq = per;
    a.kv.block_table = dev.put(table.data(), table.size() * 4);
    a.kv.block_table_stride = per;
  } else if (c.layout == FA_KV_PTR_ARRAY) {
    a.kv.k_ptrs = ptrs[0];
    a.kv.v_ptrs = ptrs[1];
  }
  a.q = tq;
  a.cache_seqlens = dev.put(c.lens.data(), c.lens.size() * 4);
  a.num_splits = c.splits;
  const size_t o_elems = size_t(c.batch) * to.stride[0];
  const size_t lse_n = size_t(c.batch) * c.hq * c.sq;
  to.data = dev.put(nullptr, o_elems * 4);
  a.o = to;
  a.lse = dev.put(nullptr, lse_n * 4);
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_FP32;
  desc.head_dim = d;
  desc.head_dim_v = dv;
  desc.num_heads_q = c.hq;
  desc.num_heads_kv = c.hkv;
  desc.causal = c.causal;
  dev.check(fa_config_create(&desc, &dev.cfg), "fa_config_create");
  if (!dev.err.empty()) return dev.err;
  size_t ws = 0;
  dev.check(fa_decode_workspace_size(rt, dev.cfg, &a, &ws, nullptr), "workspace size");
  a.workspace = dev.put(nullptr, ws);
  a.workspace_size = ws;
  dev.check(fa_memset(rt, to.data, 0xFF, o_elems * 4), "poison O");
  dev.check(fa_memset(rt, a.lse, 0xFF, lse_n * 4), "poison LSE");
  dev.check(fa_decode(rt, dev.cfg, &a, nullptr), "fa_decode");
  dev.check(fa_synchronize(rt, nullptr), "fa_synchronize");
  if (!dev.err.empty()) return dev.err;
  std::vector<float> o(o_elems), lse(lse_n);
  dev.check(fa_memcpy_dtoh(rt, o.data(), to.data, o_elems * 4), "download O");
  dev.check(fa_memcpy_dtoh(rt, lse.data(), a.lse, lse_n * 4), "download LSE");
  if (!dev.err.empty()) return dev.err;

  std::string err;
  Tally t;
  std::vector<bool> real(o_elems, false);
  Case fc;  // lowp()'s view of the problem
  fc.hq = c.hq, fc.hkv = c.hkv, fc.d = d, fc.dv = dv, fc.causal = c.causal;
  for (int b = 0; b < c.batch; ++b) {
    const int L = c.lens[b];
    std::vector<double> q(size_t(c.sq) * c.hq * d), k(size_t(L) * c.hkv * d),
        v(size_t(L) * c.hkv * dv);
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_round(hq[size_t(b) * q.size() + i]);
    for (size_t i = 0; i < k.size(); ++i) k[i] = bf16_round(hk[size_t(b) * sk * c.hkv * d + i]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_round(hv[size_t(b) * sk * c.hkv * dv + i]);
    fa::ref::Problem p;
    p.seqlen_q = c.sq;
    p.seqlen_k = std::max(L, 1);
    p.num_heads_q = c.hq;
    p.num_heads_kv = c.hkv;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.causal = c.causal;
    const int32_t len = L;
    std::vector<double> oref(size_t(c.sq) * c.hq * dv), lref(size_t(c.hq) * c.sq);
    fa::ref::attention(p, q.data(), k.data(), v.data(), oref.data(), lref.data(), &len);
    const std::vector<double> olow = lowp(fc, c.sq, L, q, k, v);
    for (int i = 0; i < c.sq; ++i)
      for (int h = 0; h < c.hq; ++h) {
        for (int x = 0; x < dv; ++x) {
          const size_t gi = at(to, b, i, h, x);
          real[gi] = true;
          const size_t ri = (size_t(i) * c.hq + h) * dv + x;
          t.o(o[gi], oref[ri], olow[ri]);
        }
        t.lse(lse[(size_t(b) * c.hq + h) * c.sq + i], lref[size_t(h) * c.sq + i]);
      }
  }
  for (size_t i = 0; i < o_elems; ++i)
    if (!real[i]) t.gap(o[i]);
  return err + t.verdict(c.describe());
}

void run_decode_all(fa_runtime *rt, const std::vector<DCase> &cases) {
  run_cases(rt, cases, run_decode_case, "decode");
}

// Every KV layout, GQA packing, chunked prefill (seqlen_q > 1, causal),
// forced splits, head dims 64, 128 and 72 (head_dim_v 64), an empty cache.
std::vector<DCase> decode_cases() {
  std::vector<DCase> v;
  DCase c;
  c.lens = {50, 64}, c.seed = 21;
  v.push_back(c);
  c = DCase();
  c.sq = 3, c.skmax = 100, c.lens = {100, 37}, c.hq = 8, c.hkv = 2, c.d = 128, c.causal = true;
  c.splits = 3, c.seed = 22;
  v.push_back(c);
  c = DCase();
  c.skmax = 80, c.lens = {0, 77}, c.hq = 2, c.hkv = 2, c.d = 72, c.dv = 64;
  c.layout = FA_KV_PAGED, c.page_size = 16, c.seed = 23;
  v.push_back(c);
  c = DCase();
  c.sq = 2, c.skmax = 70, c.lens = {70, 20}, c.causal = true, c.layout = FA_KV_PAGED;
  c.page_size = 5, c.splits = 2, c.seed = 24;
  v.push_back(c);
  c = DCase();
  c.skmax = 90, c.lens = {33, 90}, c.hq = 4, c.hkv = 2, c.layout = FA_KV_PTR_ARRAY, c.seed = 25;
  v.push_back(c);
  c = DCase();  // MLA's 576 / 512 over one KV head (O in two slices), pages of 64
  c.skmax = 130, c.lens = {130, 9}, c.hq = 16, c.hkv = 1, c.d = 576, c.dv = 512;
  c.layout = FA_KV_PAGED, c.page_size = 64, c.splits = 2, c.seed = 26;
  v.push_back(c);
  return v;
}

void test_decode_sm80(void **) {
  need_runtime();
  run_decode_all(g_rt80, decode_cases());
}

void test_decode_sm90(void **) {
  need_runtime();
  std::vector<DCase> v = decode_cases();
  for (DCase &c : v) c.seed += 100;
  run_decode_all(g_rt90, v);
}

fa_config *fp32_config(int d, int kv_dtype, fa_status *st) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_FP32;
  desc.head_dim = d;
  desc.num_heads_q = 2;
  desc.num_heads_kv = 1;
  desc.kv_dtype = kv_dtype;
  fa_config *cfg = nullptr;
  *st = fa_config_create(&desc, &cfg);
  return cfg;
}

std::string generate(fa_config *cfg, fa_kernel_kind kind, int sm, fa_status *st) {
  size_t n = 0;
  *st = fa_generate(cfg, kind, sm, nullptr, 0, &n);
  if (*st != FA_SUCCESS) return {};
  std::string p(n + 1, '\0');
  *st = fa_generate(cfg, kind, sm, &p[0], p.size(), &n);
  p.resize(n);
  return p;
}

// What fp32 does not run in: clear statuses and messages.
void test_statuses(void **) {
  need_runtime();
  fa_status st;
  fa_config *bad = fp32_config(64, FA_DTYPE_FP8_E4M3, &st);
  assert_int_equal(st, FA_ERROR_UNSUPPORTED);
  assert_null(bad);
  assert_non_null(std::strstr(fa_last_error(), "FA_DTYPE_FP32"));

  fa_config *cfg = fp32_config(64, 0, &st);
  assert_int_equal(st, FA_SUCCESS);
  // The forward PTX on sm_80 and sm_90: mma.sync (no wgmma), bf16 operands
  // converted from fp32 loads.
  for (int sm : {80, 90}) {
    const std::string p = generate(cfg, FA_KERNEL_FORWARD, sm, &st);
    assert_int_equal(st, FA_SUCCESS);
    assert_non_null(std::strstr(p.c_str(), "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert_non_null(std::strstr(p.c_str(), "cvt.rn.bf16x2.f32"));
    assert_non_null(std::strstr(p.c_str(), "ld.global.v4.f32"));
    assert_null(std::strstr(p.c_str(), "wgmma"));
    assert_null(std::strstr(p.c_str(), "cp.async.cg"));
  }
  // Decode: the tensor-core kernel (not the scalar one, no KV append).
  {
    const std::string p = generate(cfg, FA_KERNEL_DECODE, 80, &st);
    assert_int_equal(st, FA_SUCCESS);
    assert_non_null(std::strstr(p.c_str(), "cvt.rn.bf16x2.f32"));
    fa_generate_options o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.append_kv = 1;
    size_t n = 0;
    assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, 80, &o, nullptr, 0, &n),
                     FA_ERROR_UNSUPPORTED);
    assert_non_null(std::strstr(fa_last_error(), "append"));
    setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
    generate(cfg, FA_KERNEL_DECODE, 80, &st);
    unsetenv("FLASHATTN_SCALAR_DECODE");
    assert_int_equal(st, FA_ERROR_UNSUPPORTED);
    assert_non_null(std::strstr(fa_last_error(), "FLASHATTN_SCALAR_DECODE"));
  }
  // The scalar forward (FLASHATTN_SCALAR_FORWARD=1) has no fp32 path.
  setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
  generate(cfg, FA_KERNEL_FORWARD, 80, &st);
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  assert_int_equal(st, FA_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(fa_last_error(), "FLASHATTN_SCALAR_FORWARD"));
  fa_config_destroy(cfg);
}

// fa_decode_reduce with an fp32 config writes fp32 O (not rounded).
void test_reduce(void **) {
  need_runtime();
  fa_status st;
  fa_config *cfg = fp32_config(64, 0, &st);
  assert_int_equal(st, FA_SUCCESS);
  Dev dev(g_rt80);
  const int splits = 3, rows = 2, dv = 64;  // batch 1, seqlen_q 1, heads 2
  std::mt19937 gen(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> op(size_t(splits) * rows * dv), lp(size_t(splits) * rows);
  for (float &x : op) x = nd(gen);
  for (float &x : lp) x = nd(gen);
  fa_reduce_args a = FA_REDUCE_ARGS_INIT;
  a.num_splits = splits;
  a.batch = 1;
  a.seqlen_q = 1;
  a.o_partial = dev.put(op.data(), op.size() * 4);
  a.lse_partial = dev.put(lp.data(), lp.size() * 4);
  // o_partial [splits, batch, seqlen_q, heads, dv], lse_partial [splits, batch, heads, seqlen_q]
  a.o_partial_stride[0] = int64_t(rows) * dv;
  a.o_partial_stride[1] = int64_t(rows) * dv;
  a.o_partial_stride[2] = int64_t(rows) * dv;
  a.o_partial_stride[3] = dv;
  a.o_partial_stride[4] = 1;
  a.lse_partial_stride[0] = rows;
  a.lse_partial_stride[1] = rows;
  a.lse_partial_stride[2] = 1;
  a.lse_partial_stride[3] = 1;
  a.o.stride[3] = 1;
  a.o.stride[2] = dv + 8;
  a.o.stride[1] = 2 * (dv + 8);
  a.o.stride[0] = 2 * (dv + 8);
  const size_t on = size_t(2) * (dv + 8);
  a.o.data = dev.put(nullptr, on * 4);
  assert_int_equal(fa_memset(g_rt80, a.o.data, 0xFF, on * 4), FA_SUCCESS);
  assert_int_equal(fa_decode_reduce(g_rt80, cfg, &a, nullptr), FA_SUCCESS);
  std::vector<float> o(on);
  assert_int_equal(fa_memcpy_dtoh(g_rt80, o.data(), a.o.data, on * 4), FA_SUCCESS);
  std::vector<double> od(op.begin(), op.end()), ld(lp.begin(), lp.end()), ref(rows * dv),
      lref(rows);
  fa::ref::merge_states(splits, rows, dv, od.data(), ld.data(), ref.data(), lref.data());
  int not16 = 0;
  for (int r = 0; r < rows; ++r) {
    for (int x = 0; x < dv; ++x) {
      const float got = o[size_t(r) * (dv + 8) + x];
      assert_true(std::fabs(got - ref[size_t(r) * dv + x]) <=
                  1e-5 + 1e-5 * std::fabs(ref[r * dv + x]));
      if (fa::ref::round_to(got, true) != got && fa::ref::round_to(got, false) != got) ++not16;
    }
    for (int x = dv; x < dv + 8; ++x) {
      uint32_t u;
      std::memcpy(&u, &o[size_t(r) * (dv + 8) + x], 4);
      assert_int_equal(u, kPoison);
    }
  }
  assert_true(not16 > rows * dv / 2);
  fa_config_destroy(cfg);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_sm80),  cmocka_unit_test(test_forward_sm90),
      cmocka_unit_test(test_forward_paged), cmocka_unit_test(test_decode_sm80),
      cmocka_unit_test(test_decode_sm90),   cmocka_unit_test(test_statuses),
      cmocka_unit_test(test_reduce),
  };
  return cmocka_run_group_tests_name("fp32_inputs", tests, setup, teardown);
}
