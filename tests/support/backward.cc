// The backward's numerics runner (support/backward.h).
#include "support/backward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "api/test_hooks.h"
#include "reference.h"
#include "support/numerics.h"

namespace fa::test::bwd {

namespace {

// Device buffer helpers over the public API.
struct Dev {
  fa_runtime *rt;
  std::vector<uint64_t> ptrs;
  ~Dev() {
    for (uint64_t p : ptrs) fa_free(rt, p);
  }
  uint64_t alloc(size_t bytes) {
    uint64_t p = 0;
    if (fa_malloc(rt, bytes ? bytes : 16, &p) != FA_SUCCESS) return 0;
    ptrs.push_back(p);
    return p;
  }
  template <typename T>
  uint64_t put(const std::vector<T> &v) {
    uint64_t p = alloc(v.size() * sizeof(T));
    if (p && !v.empty()) fa_memcpy_htod(rt, p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <typename T>
  std::vector<T> get(uint64_t p, size_t n) {
    std::vector<T> v(n);
    if (n) fa_memcpy_dtoh(rt, v.data(), p, n * sizeof(T));
    return v;
  }
};

uint16_t to_half(float x, bool bf16) {
  return bf16 ? fa::ref::f32_to_bf16(x) : fa::ref::f32_to_f16(x);
}
float from_half(uint16_t h, bool bf16) {
  return bf16 ? fa::ref::bf16_to_f32(h) : fa::ref::f16_to_f32(h);
}

// Checks got against ref: no NaN (outputs were poisoned), rel L2 and max
// abs error relative to the reference's largest magnitude.
std::string compare(const char *what, const std::vector<float> &got, const std::vector<double> &ref,
                    bool bf16) {
  const fa::ref::ErrorStats e = fa::ref::compare(got.data(), ref.data(), ref.size());
  // Observed (emulator, these cases): rel_l2 <= 4e-4 (fp16), 2.5e-3 (bf16);
  // max_abs <= 7e-4 (fp16), 5e-3 (bf16) of max|ref|: P and dS are rounded to
  // the 16-bit type for their products.
  const double rel_tol = bf16 ? 1e-2 : 1.5e-3, abs_tol = (bf16 ? 2e-2 : 3e-3) * e.max_ref + 1e-6;
  char b[256];
  std::snprintf(b, sizeof b,
                "    %s: max_abs %.3g (tol %.3g), rel_l2 %.3g (tol %.3g), max|ref| %.3g\n", what,
                e.max_abs, abs_tol, e.rel_l2, rel_tol, e.max_ref);
  std::printf("%s", b);
  std::string err;
  if (e.nonfinite) err += std::string(what) + ": non-finite or unwritten elements\n";
  if (e.max_abs > abs_tol || (e.max_ref > 0 && e.rel_l2 > rel_tol)) err += b;
  return err;
}

}  // namespace

std::string run_case(fa_runtime *rt, const Case &c_given) {
  // `only` in a fixed-length batch: the sequences' lengths are all sq, sk.
  Case c_in = c_given;
  const bool fixed_only = c_in.only >= 0 && c_in.lens_q.empty();
  if (fixed_only) {
    c_in.lens_q.assign(size_t(c_in.batch), c_in.sq);
    c_in.lens_k.assign(size_t(c_in.batch), c_in.sk);
  }
  Case c = c_in;
  if (c.only >= 0) {
    c.batch = 1;
    c.sq = c.lens_q[size_t(c.only)];
    c.sk = c.lens_k[size_t(c.only)];
    c.lens_q = {c.sq};
    c.lens_k = {c.sk};
    if (fixed_only) c.lens_q.clear(), c.lens_k.clear();
  }
  const bool varlen = !c.lens_q.empty();
  const int dv = c.dv ? c.dv : c.d;
  // Rows: fixed length [b, s, h, d]; varlen packed [total, h, d].
  std::vector<int> lq(c.batch, c.sq), lk(c.batch, c.sk);
  if (varlen) lq = c.lens_q, lk = c.lens_k;
  std::vector<int> cuq(c.batch + 1, 0), cuk(c.batch + 1, 0);
  for (int b = 0; b < c.batch; ++b) cuq[b + 1] = cuq[b] + lq[b], cuk[b + 1] = cuk[b] + lk[b];
  const size_t rq = varlen ? cuq[c.batch] : size_t(c.batch) * c.sq;
  const size_t rk = varlen ? cuk[c.batch] : size_t(c.batch) * c.sk;
  std::mt19937 gen(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rand_half = [&](size_t n) {
    std::vector<uint16_t> h(n);
    for (auto &x : h) x = to_half(nd(gen), c.bf16);
    return h;
  };
  // The batch's inputs (c_in's); with `only` that sequence's rows.
  size_t fq = rq, fk = rk, q0 = 0, k0 = 0;
  if (c_in.only >= 0) {
    fq = fk = 0;
    for (size_t b = 0; b < c_in.lens_q.size(); ++b) {
      if (int(b) == c_in.only) q0 = fq, k0 = fk;
      fq += size_t(c_in.lens_q[b]), fk += size_t(c_in.lens_k[b]);
    }
  }
  std::vector<uint16_t> q = rand_half(fq * c.hq * c.d), k = rand_half(fk * c.hkv * c.d),
                        v = rand_half(fk * c.hkv * dv), dout = rand_half(fq * c.hq * dv);
  if (c_in.only >= 0) {
    auto cut = [](std::vector<uint16_t> &x, size_t row0, size_t rows, size_t w) {
      x = std::vector<uint16_t>(x.begin() + row0 * w, x.begin() + (row0 + rows) * w);
    };
    cut(q, q0, rq, size_t(c.hq) * c.d);
    cut(dout, q0, rq, size_t(c.hq) * dv);
    cut(k, k0, rk, size_t(c.hkv) * c.d);
    cut(v, k0, rk, size_t(c.hkv) * dv);
  }
  std::vector<float> sinks, slopes;
  if (c.sinks)
    for (int h = 0; h < c.hq; ++h) sinks.push_back(0.5f * nd(gen));
  if (c.alibi) slopes = fa::ref::standard_alibi_slopes(c.hq);

  Dev dev{rt, {}};
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = c.bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  desc.head_dim = c.d;
  desc.head_dim_v = dv;
  desc.num_heads_q = c.hq;
  desc.num_heads_kv = c.hkv;
  desc.causal = c.causal;
  desc.window_left = c.wl;
  desc.window_right = c.wr;
  desc.softcap = c.softcap;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS) return std::string("config: ") + fa_last_error();
  auto tensor = [&](uint64_t p, int seq, int heads, int dim) {
    fa_tensor t = FA_TENSOR_INIT;
    t.data = p;
    t.stride[3] = 1;
    t.stride[2] = dim;
    t.stride[1] = int64_t(heads) * dim;
    t.stride[0] = varlen ? 0 : int64_t(seq) * heads * dim;
    return t;
  };
  fa_forward_args fa = FA_FORWARD_ARGS_INIT;
  fa.batch = c.batch;
  fa.seqlen_q = c.sq;
  fa.seqlen_k = c.sk;
  fa.q = tensor(dev.put(q), c.sq, c.hq, c.d);
  fa.k = tensor(dev.put(k), c.sk, c.hkv, c.d);
  fa.v = tensor(dev.put(v), c.sk, c.hkv, dv);
  fa.o = tensor(dev.alloc(rq * c.hq * dv * 2), c.sq, c.hq, dv);
  fa.lse = dev.alloc(size_t(c.batch) * c.hq * c.sq * 4 + rq * c.hq * 4);
  if (varlen) {
    fa.cu_seqlens_q = dev.put(cuq);
    fa.cu_seqlens_k = dev.put(cuk);
  }
  if (c.sinks) fa.sinks = dev.put(sinks);
  if (c.alibi) fa.alibi_slopes = dev.put(slopes);
  std::string err;
  if (fa_launch(rt, cfg, &fa, nullptr) != FA_SUCCESS) {
    err = std::string("fa_launch: ") + fa_last_error() + "\n";
    fa_config_destroy(cfg);
    return err;
  }
  fa_backward_args ba = FA_BACKWARD_ARGS_INIT;
  ba.fwd = fa;
  ba.dout = tensor(dev.put(dout), c.sq, c.hq, dv);
  const std::vector<uint16_t> nan_q(rq * c.hq * c.d, 0x7fff), nan_k(rk * c.hkv * c.d, 0x7fff),
      nan_v(rk * c.hkv * dv, 0x7fff);
  ba.dq = tensor(dev.put(nan_q), c.sq, c.hq, c.d);
  ba.dk = tensor(dev.put(nan_k), c.sk, c.hkv, c.d);
  ba.dv = tensor(dev.put(nan_v), c.sk, c.hkv, dv);
  if (c.sinks) ba.dsinks = dev.put(std::vector<float>(c.hq, NAN));
  ba.deterministic = c.deterministic;
  size_t ws = 0;
  if (fa_backward_workspace_size(rt, cfg, &ba, &ws) != FA_SUCCESS) {
    fa_config_destroy(cfg);
    return std::string("fa_backward_workspace_size: ") + fa_last_error() + "\n";
  }
  ba.workspace = dev.put(std::vector<float>((ws + 3) / 4, NAN));  // poisoned
  ba.workspace_size = ws;
  const fa_status st = fa_backward(rt, cfg, &ba, nullptr);
  if (st != FA_SUCCESS)
    err = std::string("fa_backward: ") + fa_status_string(st) + ": " + fa_last_error() + "\n";
  if (st == FA_SUCCESS && c.kernel && !c.deterministic) {
    // The main kernel once more, alone and profiled: its entry's name. (It
    // rewrites dK and dV with the same values; dQ's accumulators are not
    // read again.)
    setenv("FLASHATTN_EMU_PROFILE", "1", 1);
    const fa_status s2 = fa::api::backward_kernels(rt, cfg, &ba, 2);
    unsetenv("FLASHATTN_EMU_PROFILE");
    const std::string k = fa::test::emulated_kernel(rt);
    if (s2 != FA_SUCCESS || k.rfind(c.kernel, 0) != 0)
      err += "main kernel: ran " + k + ", expected " + c.kernel + "...\n";
  }
  fa_config_destroy(cfg);
  if (st != FA_SUCCESS) return err;
  const std::vector<uint16_t> gq = dev.get<uint16_t>(ba.dq.data, nan_q.size()),
                              gk = dev.get<uint16_t>(ba.dk.data, nan_k.size()),
                              gv = dev.get<uint16_t>(ba.dv.data, nan_v.size());
  std::vector<float> gds;
  if (c.sinks) gds = dev.get<float>(ba.dsinks, c.hq);
  if (c.dq_out) *c.dq_out = gq;
  if (c.dk_out) *c.dk_out = gk;
  if (c.dv_out) *c.dv_out = gv;

  // The reference, one sequence at a time, on the rounded inputs.
  std::vector<double> rdq(nan_q.size(), 0), rdk(nan_k.size(), 0), rdv(nan_v.size(), 0),
      rds(c.hq, 0);
  for (int b = 0; b < c.batch; ++b) {
    fa::ref::Problem p;
    p.batch = 1;
    p.seqlen_q = lq[b];
    p.seqlen_k = lk[b];
    p.num_heads_q = c.hq;
    p.num_heads_kv = c.hkv;
    p.head_dim = c.d;
    p.head_dim_v = dv;
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.softcap = c.softcap;
    if (c.sinks) p.sinks = sinks.data();
    if (c.alibi) p.alibi_slopes = slopes.data();
    if (lq[b] == 0 || lk[b] == 0) continue;  // nothing to differentiate (zeros)
    const size_t q0 = varlen ? cuq[b] : size_t(b) * c.sq, k0 = varlen ? cuk[b] : size_t(b) * c.sk;
    auto slice = [&](const std::vector<uint16_t> &x, size_t row0, size_t rows, size_t w) {
      std::vector<double> o(rows * w);
      for (size_t i = 0; i < o.size(); ++i) o[i] = from_half(x[row0 * w + i], c.bf16);
      return o;
    };
    const std::vector<double> sq_ = slice(q, q0, lq[b], size_t(c.hq) * c.d),
                              sk_ = slice(k, k0, lk[b], size_t(c.hkv) * c.d),
                              sv_ = slice(v, k0, lk[b], size_t(c.hkv) * dv),
                              sd_ = slice(dout, q0, lq[b], size_t(c.hq) * dv);
    std::vector<double> dq(sq_.size()), dk(sk_.size()), dvv(sv_.size()), ds(c.hq, 0);
    fa::ref::attention_backward(p, sq_.data(), sk_.data(), sv_.data(), sd_.data(), dq.data(),
                                dk.data(), dvv.data(), c.sinks ? ds.data() : nullptr);
    for (size_t i = 0; i < dq.size(); ++i) rdq[q0 * c.hq * c.d + i] = dq[i];
    for (size_t i = 0; i < dk.size(); ++i) rdk[k0 * c.hkv * c.d + i] = dk[i];
    for (size_t i = 0; i < dvv.size(); ++i) rdv[k0 * c.hkv * dv + i] = dvv[i];
    for (int h = 0; h < c.hq; ++h) rds[h] += ds[h];
  }
  auto floats = [&](const std::vector<uint16_t> &x) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); ++i) f[i] = from_half(x[i], c.bf16);
    return f;
  };
  err += compare("dQ", floats(gq), rdq, c.bf16);
  err += compare("dK", floats(gk), rdk, c.bf16);
  err += compare("dV", floats(gv), rdv, c.bf16);
  if (c.sinks) err += compare("dsinks", gds, rds, c.bf16);
  return err;
}

std::string Case::describe() const {
  char b[256];
  std::snprintf(b, sizeof b, "%s b%d sq%d sk%d hq%d hkv%d d%d dv%d%s wl%d wr%d cap%g%s%s%s",
                bf16 ? "bf16" : "fp16", batch, sq, sk, hq, hkv, d, dv ? dv : d,
                causal ? " causal" : "", wl, wr, softcap, alibi ? " alibi" : "",
                sinks ? " sinks" : "", lens_q.empty() ? "" : " varlen");
  return b;
}

std::vector<Case> cases() {
  uint32_t seed = 9100;
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.seed = seed++;
    cases.push_back(c);
  };
  {
    Case c;  // plain, batch 2, rows not a multiple of the blocks
    c.batch = 2, c.sq = 70, c.sk = 90;
    add(c);
  }
  {
    Case c;  // causal, seqlen_q < seqlen_k, GQA, d128 (block_m 32), bf16
    c.sq = 50, c.sk = 130, c.hq = 4, c.hkv = 2, c.d = 128, c.bf16 = c.causal = true;
    add(c);
  }
  {
    Case c;  // causal, seqlen_q > seqlen_k: the first rows see no key
    c.sq = 100, c.sk = 40, c.causal = true, c.d = 32;
    add(c);
  }
  {
    Case c;  // a window, MQA
    c.sq = 120, c.sk = 120, c.hq = 3, c.hkv = 1, c.wl = 30, c.wr = 10;
    add(c);
  }
  {
    Case c;  // softcap, bf16, d80
    c.sq = 60, c.sk = 75, c.d = 80, c.softcap = 2.0f, c.bf16 = true;
    add(c);
  }
  {
    Case c;  // ALiBi, causal
    c.sq = 64, c.sk = 96, c.alibi = true, c.causal = true, c.hq = 4, c.hkv = 2;
    add(c);
  }
  {
    Case c;  // sinks (dsinks)
    c.sq = 48, c.sk = 80, c.sinks = true, c.hq = 2, c.hkv = 1;
    add(c);
  }
  {
    Case c;  // head_dim != head_dim_v, d8
    c.sq = 40, c.sk = 33, c.d = 8, c.dv = 24;
    add(c);
  }
  {
    Case c;  // d96 / dv 64, bf16, GQA
    c.sq = 45, c.sk = 70, c.d = 96, c.dv = 64, c.hq = 4, c.hkv = 2, c.bf16 = true;
    add(c);
  }
  {
    Case c;  // fp16 softcap (bent: cap 1.5) with ALiBi, causal, MQA, two key blocks of 128
    c.sq = 100, c.sk = 150, c.d = 128, c.hq = 4, c.hkv = 1, c.softcap = 1.5f;
    c.alibi = c.causal = true;
    add(c);
  }
  {
    Case c;  // d112 / dv48 (sm_90a: dQ's second warpgroup ragged), a causal window, bf16
    c.sq = 90, c.sk = 70, c.d = 112, c.dv = 48, c.wl = 50, c.wr = 0, c.bf16 = true;
    add(c);
  }
  {
    Case c;  // head dims past 128: two column slices; GQA, causal, bf16
    c.sq = 70, c.sk = 90, c.d = 256, c.hq = 4, c.hkv = 2, c.causal = c.bf16 = true;
    add(c);
  }
  {
    Case c;  // d 192 / dv 128 (slices of 96 and 64), softcap, ALiBi, sinks
    c.sq = 50, c.sk = 66, c.d = 192, c.dv = 128, c.softcap = 5.0f, c.alibi = c.sinks = true;
    add(c);
  }
  {
    Case c;  // d 144 / dv 160 (slices of 72 and 80: half 16-column groups), varlen
    c.batch = 2, c.sq = 40, c.sk = 70, c.d = 144, c.dv = 160;
    c.lens_q = {40, 17};
    c.lens_k = {70, 33};
    add(c);
  }
  {
    Case c;  // varlen: three sequences, one empty, causal
    c.batch = 3, c.sq = 70, c.sk = 90, c.causal = true, c.d = 64;
    c.lens_q = {70, 0, 33};
    c.lens_k = {90, 20, 33};
    add(c);
  }
  {
    Case c;  // varlen past one key block of 128 (sm_90a: gather), GQA, softcap, a window
    c.batch = 3, c.sq = 150, c.sk = 260, c.d = 96, c.dv = 64, c.hq = 4, c.hkv = 2;
    c.softcap = 3.0f, c.wl = 80, c.wr = 20, c.bf16 = true;
    c.lens_q = {150, 1, 65};
    c.lens_k = {260, 10, 130};
    add(c);
  }
  return cases;
}

std::string deterministic_check(fa_runtime *rt, bool varlen) {
  Case d;
  d.batch = 3, d.sq = 150, d.sk = 200, d.hq = 4, d.hkv = 2, d.causal = true, d.bf16 = true;
  d.d = 96;  // query blocks of 32: the semaphores at every kSemRows rows
  if (varlen) {
    d.lens_q = {150, 97, 20};
    d.lens_k = {200, 130, 64};
  }
  d.deterministic = true;
  d.seed = 9200;
  std::vector<uint16_t> q1, q2, k1, k2, v1, v2;
  d.dq_out = &q1, d.dk_out = &k1, d.dv_out = &v1;
  std::string e = run_case(rt, d);
  d.dq_out = &q2, d.dk_out = &k2, d.dv_out = &v2;
  for (int run = 0; run < 2 && e.empty(); ++run) {
    e += run_case(rt, d);
    if (q1 != q2 || k1 != k2 || v1 != v2)
      e += "deterministic: run " + std::to_string(run + 2) + " differs in its bits\n";
  }
  // The second sequence alone: its rows' bits as in the batch.
  Case one = d;
  one.only = 1;
  std::vector<uint16_t> q3, k3, v3;
  one.dq_out = &q3, one.dk_out = &k3, one.dv_out = &v3;
  if (e.empty()) e += run_case(rt, one);
  if (e.empty()) {
    const size_t qr = size_t(d.hq) * d.d, kr = size_t(d.hkv) * d.d;
    const bool same = std::equal(q3.begin(), q3.end(), q1.begin() + 150 * qr) &&
                      std::equal(k3.begin(), k3.end(), k1.begin() + 200 * kr) &&
                      std::equal(v3.begin(), v3.end(), v1.begin() + 200 * kr);
    if (!same) e += "deterministic: a sequence alone differs from it in a batch\n";
  }
  return e;
}

}  // namespace fa::test::bwd
