// fa::ref::attention_backward (tools/common/reference.cc), the fp64
// gradients of attention, against central finite differences (fourth order) of
// L = sum(dout o attention(q, k, v)) in every element of q, k, v and every
// finite sink, on tiny shapes with fresh random inputs: each feature alone
// (causal with seqlen_q < and > seqlen_k, sliding windows, softcap, ALiBi,
// sinks, GQA, MQA, head_dim != head_dim_v, seqlens_k below seqlen_k and 0,
// batch 2, a tree mask) and combined. Besides:
// - a row that sees no key gets dq exactly 0, a key no row sees dk and dv
//   exactly 0 (each case that has such rows or keys says so, and they are
//   counted, so the check is never empty);
// - without softcap and sinks every row's logits may shift by one constant
//   (k_j += c for all j): the dk of a KV head sum to 0 over its keys, and
//   since each row's P sums to 1, its dv sum to the dout of the rows that
//   see a key;
// - non-finite sinks as attention() defines them: +inf gives zero
//   gradients, NaN NaN ones, -inf those of no sink, bit for bit.
#include "support/cmocka.hh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference.h"

namespace {

using fa::ref::Problem;

struct Case {
  std::string name;
  Problem p;                     // its pointers are set by check()
  std::vector<int32_t> seqlens;  // empty: seqlen_k for every sequence
  bool sinks = false, alibi = false, tree = false;
  // Has rows that see no key / keys that no row sees (checked, so that the
  // zero checks are not empty).
  bool empty_rows = false, unseen_keys = false;
};

// Tensors of one problem, dout and the analytic gradients.
struct Data {
  std::vector<double> q, k, v, dout, dq, dk, dv, dsinks;
  std::vector<float> sinks, alibi;
  std::vector<uint8_t> tree;
};

int dim_v(const Problem &p) { return p.head_dim_v ? p.head_dim_v : p.head_dim; }

// Whether query i of sequence b sees key j: attention()'s mask,
// written again from flashattn.h's description.
bool visible(const Problem &p, const int32_t *seqlens, int b, int i, long long j) {
  const long long sk = seqlens ? seqlens[b] : p.seqlen_k;
  const long long diag = i + sk - p.seqlen_q;
  if (j >= sk) return false;
  if (p.causal && j > diag) return false;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return fa::ref::tree_visible(p, b, i, j, sk);
}

double loss(const Problem &p, const Data &x, const int32_t *seqlens) {
  std::vector<double> o(x.dout.size());
  fa::ref::attention(p, x.q.data(), x.k.data(), x.v.data(), o.data(), nullptr, seqlens);
  double l = 0;
  for (size_t e = 0; e < o.size(); ++e) l += x.dout[e] * o[e];
  return l;
}

// |fd - g| within 1e-6 of max(|g|, |fd|, 1e-4): relative, and absolute for
// gradients below 1e-4 (the finite differences' own error, about 1e-12
// here, stays far below either).
bool close(double fd, double g) {
  return std::fabs(fd - g) <= 1e-6 * std::max({std::fabs(g), std::fabs(fd), 1e-4});
}

// The derivative of f at x by central differences of fourth order, step
// h = 2^-10 (exact around the sinks, which are multiples of 2^-16 below 2):
// (8 (f(x + h) - f(x - h)) - (f(x + 2h) - f(x - 2h))) / 12h; truncation
// error h^4 f^(5) / 30, about 1e-13 f^(5); rounding about 1e-13 |f|.
template <class T, class F>
double derivative(T &x, F f) {
  const T x0 = x;
  const double h = 1.0 / 1024;
  double at[4];
  const double steps[4] = {h, -h, 2 * h, -2 * h};
  for (int s = 0; s < 4; ++s) {
    x = T(x0 + steps[s]);
    at[s] = f();
  }
  x = x0;
  return (8 * (at[0] - at[1]) - (at[2] - at[3])) / (12 * h);
}

// Checks grad against finite differences of L in each element of x,
// appending failures to err (at most 4 per tensor).
void check_fd(const Problem &p, Data &d, std::vector<double> &x, const std::vector<double> &grad,
              const int32_t *seqlens, const char *what, std::string &err) {
  int bad = 0;
  for (size_t e = 0; e < x.size(); ++e) {
    const double fd = derivative(x[e], [&] { return loss(p, d, seqlens); });
    if (!close(fd, grad[e]) && bad++ < 4) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "  %s[%zu]: analytic %.12g, finite difference %.12g\n", what,
                    e, grad[e], fd);
      err += buf;
    }
  }
}

// Runs one case; returns what failed ("" when all passed).
std::string check(const Case &c, std::mt19937_64 &rng) {
  Problem p = c.p;
  const int d = p.head_dim, dv = dim_v(p), group = p.num_heads_q / p.num_heads_kv;
  const size_t rows_q = size_t(p.batch) * p.seqlen_q * p.num_heads_q;
  const size_t rows_k = size_t(p.batch) * p.seqlen_k * p.num_heads_kv;
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Data x;
  auto fill = [&](std::vector<double> &t, size_t n) {
    t.resize(n);
    for (double &e : t) e = normal(rng);
  };
  fill(x.q, rows_q * d);
  fill(x.k, rows_k * d);
  fill(x.v, rows_k * dv);
  fill(x.dout, rows_q * dv);
  x.dq.assign(x.q.size(), NAN);  // poison: every element is written
  x.dk.assign(x.k.size(), NAN);
  x.dv.assign(x.v.size(), NAN);
  if (c.sinks) {
    for (int h = 0; h < p.num_heads_q; ++h)  // in (-2, 2), multiples of 2^-16
      x.sinks.push_back(float(std::round((4 * uniform(rng) - 2) * 65536) / 65536));
    x.dsinks.assign(x.sinks.size(), NAN);
    p.sinks = x.sinks.data();
  }
  if (c.alibi) {  // one row of slopes per sequence
    for (int e = 0; e < p.batch * p.num_heads_q; ++e) x.alibi.push_back(float(uniform(rng)));
    p.alibi_slopes = x.alibi.data();
    p.alibi_stride = p.num_heads_q;
  }
  if (c.tree) {
    for (size_t e = 0; e < size_t(p.batch) * p.seqlen_q * p.seqlen_q; ++e)
      x.tree.push_back(uniform(rng) < 0.6);
    p.tree_mask = x.tree.data();
  }
  const int32_t *seqlens = c.seqlens.empty() ? nullptr : c.seqlens.data();
  fa::ref::attention_backward(p, x.q.data(), x.k.data(), x.v.data(), x.dout.data(), x.dq.data(),
                              x.dk.data(), x.dv.data(), c.sinks ? x.dsinks.data() : nullptr,
                              seqlens);

  std::string err;
  check_fd(p, x, x.q, x.dq, seqlens, "dq", err);
  check_fd(p, x, x.k, x.dk, seqlens, "dk", err);
  check_fd(p, x, x.v, x.dv, seqlens, "dv", err);
  for (size_t h = 0; h < x.sinks.size(); ++h) {
    const double fd = derivative(x.sinks[h], [&] { return loss(p, x, seqlens); });
    if (!close(fd, x.dsinks[h])) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "  dsinks[%zu]: analytic %.12g, finite difference %.12g\n", h,
                    x.dsinks[h], fd);
      err += buf;
    }
  }

  // Rows that see no key: dq exactly 0; keys that no row sees: dk, dv
  // exactly 0.
  long long empty_rows = 0, unseen_keys = 0;
  std::vector<char> seen(rows_k, 0);
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seqlen_q; ++i)
      for (int h = 0; h < p.num_heads_q; ++h) {
        bool any = false;
        for (long long j = 0; j < p.seqlen_k; ++j)
          if (visible(p, seqlens, b, i, j)) {
            any = true;
            seen[(size_t(b) * p.seqlen_k + j) * p.num_heads_kv + h / group] = 1;
          }
        if (any) continue;
        ++empty_rows;
        const size_t row = (size_t(b) * p.seqlen_q + i) * p.num_heads_q + h;
        for (int e = 0; e < d; ++e)
          if (x.dq[row * d + e] != 0) err += "  dq of a row that sees no key is not 0\n";
      }
  for (size_t r = 0; r < rows_k; ++r) {
    if (seen[r]) continue;
    ++unseen_keys;
    for (int e = 0; e < d; ++e)
      if (x.dk[r * d + e] != 0) err += "  dk of a key no row sees is not 0\n";
    for (int e = 0; e < dv; ++e)
      if (x.dv[r * dv + e] != 0) err += "  dv of a key no row sees is not 0\n";
  }
  if (c.empty_rows && empty_rows == 0) err += "  no row sees no key\n";
  if (c.unseen_keys && unseen_keys == 0) err += "  every key is seen\n";

  // Without softcap and sinks: per (sequence, KV head, column), dk sums to
  // 0 over the keys, dv to the dout of the rows that see a key.
  if (p.softcap == 0 && !p.sinks) {
    for (int b = 0; b < p.batch; ++b)
      for (int hk = 0; hk < p.num_heads_kv; ++hk) {
        for (int e = 0; e < d; ++e) {
          double sum = 0, mag = 0;
          for (int j = 0; j < p.seqlen_k; ++j) {
            const double g = x.dk[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + hk) * d + e];
            sum += g;
            mag += std::fabs(g);
          }
          if (std::fabs(sum) > 1e-12 * (mag + 1)) err += "  dk does not sum to 0 over the keys\n";
        }
        for (int e = 0; e < dv; ++e) {
          double sum = 0, want = 0, mag = 0;
          for (int j = 0; j < p.seqlen_k; ++j)
            sum += x.dv[((size_t(b) * p.seqlen_k + j) * p.num_heads_kv + hk) * dv + e];
          for (int i = 0; i < p.seqlen_q; ++i)
            for (int h = hk * group; h < (hk + 1) * group; ++h) {
              bool any = false;
              for (long long j = 0; j < p.seqlen_k; ++j) any = any || visible(p, seqlens, b, i, j);
              const double g = x.dout[((size_t(b) * p.seqlen_q + i) * p.num_heads_q + h) * dv + e];
              if (any) want += g;
              mag += std::fabs(g);
            }
          if (std::fabs(sum - want) > 1e-12 * (mag + 1))
            err += "  dv does not sum to the dout of the rows that see a key\n";
        }
      }
  }
  return err;
}

Problem shape(int batch, int sq, int sk, int hq, int hkv, int d, int dv) {
  Problem p;
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  p.head_dim_v = dv;
  return p;
}

void run_cases(const std::vector<Case> &cases) {
  const unsigned long long seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  std::string failures;
  for (const Case &c : cases) {
    const std::string e = check(c, rng);
    if (!e.empty()) failures += c.name + ":\n" + e;
  }
  if (!failures.empty()) {
    print_error("seed %llu\n%s", seed, failures.c_str());
    fail();
  }
}

void test_each_feature(void **) {
  std::vector<Case> cases;
  auto add = [&](const char *name, Problem p) {
    cases.emplace_back();
    cases.back().name = name;
    cases.back().p = p;
    return &cases.back();
  };
  add("plain", shape(1, 3, 4, 2, 2, 4, 4));
  add("batch 2", shape(2, 3, 4, 2, 2, 4, 4));
  Problem p = shape(1, 3, 5, 2, 2, 4, 4);
  p.causal = true;
  add("causal, seqlen_q < seqlen_k", p);
  p = shape(1, 5, 3, 2, 2, 4, 4);
  p.causal = true;
  add("causal, seqlen_q > seqlen_k (rows that see no key)", p)->empty_rows = true;
  p = shape(1, 4, 6, 2, 2, 4, 4);
  p.window_left = 1;
  p.window_right = 1;
  add("window (1, 1)", p)->unseen_keys = true;
  p.window_left = 0;
  p.window_right = 2;
  add("window (0, 2)", p)->unseen_keys = true;
  p.window_left = 2;
  p.window_right = -1;
  add("window (2, -1)", p);
  p = shape(1, 3, 5, 2, 2, 4, 4);
  p.softmax_scale = 1.5;  // logits beyond the cap, where tanh bends
  p.softcap = 2.0;
  add("softcap", p);
  add("alibi", shape(2, 3, 5, 2, 2, 4, 4))->alibi = true;
  add("sinks", shape(1, 3, 4, 3, 3, 4, 4))->sinks = true;
  add("GQA (4 / 2)", shape(1, 3, 4, 4, 2, 4, 4));
  add("MQA (4 / 1)", shape(1, 3, 4, 4, 1, 4, 4));
  add("head_dim 4, head_dim_v 3", shape(1, 3, 4, 2, 2, 4, 3));
  add("head_dim 3, head_dim_v 6", shape(1, 3, 4, 2, 2, 3, 6));
  Case *c = add("seqlens_k {4, 6} of 6", shape(2, 3, 6, 2, 2, 4, 4));
  c->seqlens = {4, 6};
  c->unseen_keys = true;
  c = add("seqlens_k {3, 0} of 5 (a sequence without keys)", shape(2, 2, 5, 2, 2, 4, 4));
  c->seqlens = {3, 0};
  c->empty_rows = c->unseen_keys = true;
  add("tree mask", shape(2, 3, 5, 2, 2, 4, 4))->tree = true;
  run_cases(cases);
}

void test_combined(void **) {
  std::vector<Case> cases(4);
  Case *c = &cases[0];
  c->name = "causal, window, softcap, ALiBi, sinks, GQA, d != dv, seqlens_k";
  c->p = shape(2, 5, 6, 4, 2, 4, 3);
  c->p.causal = true;
  c->p.window_left = 2;
  c->p.softmax_scale = 1.2;
  c->p.softcap = 1.5;
  c->seqlens = {3, 6};
  c->sinks = c->alibi = c->empty_rows = c->unseen_keys = true;
  c = &cases[1];
  c->name = "window, softcap, sinks, MQA, d != dv, a sequence without keys";
  c->p = shape(2, 4, 5, 4, 1, 5, 2);
  c->p.window_left = 1;
  c->p.window_right = 0;
  c->p.softcap = 0.7;
  c->seqlens = {5, 0};
  c->sinks = c->empty_rows = c->unseen_keys = true;
  c = &cases[2];
  c->name = "causal, ALiBi, tree mask, MQA, seqlens_k";
  c->p = shape(2, 4, 4, 2, 1, 4, 4);
  c->p.causal = true;
  c->seqlens = {4, 3};
  c->alibi = c->tree = true;
  c = &cases[3];
  c->name = "causal, seqlen_q > seqlen_k, window, ALiBi, MQA, d != dv";
  c->p = shape(1, 6, 4, 3, 1, 3, 5);
  c->p.causal = true;
  c->p.window_left = 1;
  c->alibi = c->empty_rows = true;
  run_cases(cases);
}

// Sinks of +inf, NaN, -inf next to a finite one (heads 1, 2, 3, 0; one KV
// head per query head), with rows that see no key.
void test_nonfinite_sinks(void **) {
  Problem p = shape(1, 4, 3, 4, 4, 4, 4);
  p.causal = true;  // row 0 sees no key
  const size_t nq = size_t(p.seqlen_q) * 4 * 4, nk = size_t(p.seqlen_k) * 4 * 4;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  std::vector<double> q(nq), k(nk), v(nk), dout(nq);
  for (auto *t : {&q, &k, &v, &dout})
    for (double &e : *t) e = normal(rng);
  const float sinks[4] = {0.5f, INFINITY, NAN, -INFINITY};
  std::vector<double> dq(nq), dk(nk), dv(nk), dq0(nq), dk0(nk), dv0(nk), ds(4, -1.0);
  fa::ref::attention_backward(p, q.data(), k.data(), v.data(), dout.data(), dq0.data(), dk0.data(),
                              dv0.data(), nullptr);
  p.sinks = sinks;
  fa::ref::attention_backward(p, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                              dv.data(), ds.data());
  // Element e of a [seqlen, 4 heads, 4] tensor is of head (e / 4) % 4.
  for (size_t e = 0; e < nq; ++e) {
    const size_t h = e / 4 % 4;
    if (h == 1) assert_true(dq[e] == 0);
    if (h == 2) assert_true(std::isnan(dq[e]));
    if (h == 3) assert_memory_equal(&dq[e], &dq0[e], sizeof(double));
  }
  for (size_t e = 0; e < nk; ++e) {
    const size_t h = e / 4 % 4;
    if (h == 1) assert_true(dk[e] == 0 && dv[e] == 0);
    if (h == 2) assert_true(std::isnan(dk[e]) && std::isnan(dv[e]));
    if (h == 3) {
      assert_memory_equal(&dk[e], &dk0[e], sizeof(double));
      assert_memory_equal(&dv[e], &dv0[e], sizeof(double));
    }
  }
  assert_true(std::isfinite(ds[0]) && ds[0] != 0);
  assert_true(ds[1] == 0);
  assert_true(std::isnan(ds[2]));
  assert_true(ds[3] == 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_feature),
      cmocka_unit_test(test_combined),
      cmocka_unit_test(test_nonfinite_sinks),
  };
  return cmocka_run_group_tests_name("reference_backward", tests, nullptr, nullptr);
}
