// LSE interchange in fa_decode_reduce (flashattn.h, fa_lse_format): partial
// states whose LSE is a natural log (flashattn, FlashAttention) or a base-2
// log (FlashInfer) merge to the same O and LSE, written in either base.
// - fa_decode's own partial states, converted to base 2 on the host, merge
//   to the O/LSE of the natural ones and of fa_decode's combine;
// - random partial states (with -inf splits and fully empty rows) in every
//   input/output format pair against the fp64 merge (tools/common), outputs
//   poisoned with NaN first and checked written;
// - a 0.3-sized fa_reduce_args still works (natural logs, the new fields
//   not read); bad formats give INVALID_ARGUMENT with a message and write
//   nothing; fa_generate_for's formats.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/emu_runtime.h"
#include "support/numerics.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kLog2e = 1.4426950408889634;

using fa::test::g_rt;
using fa::test::need_runtime;

void ok(fa_status st, const char *what) {
  if (st != FA_SUCCESS) {
    print_error("%s: %s (%s)\n", what, fa_status_string(st), fa_last_error());
    fail();
  }
}

// Device allocations freed at scope exit.
struct Mem {
  std::vector<uint64_t> ptrs;
  ~Mem() {
    for (uint64_t p : ptrs) fa_free(g_rt, p);
  }
  uint64_t alloc(size_t bytes, uint8_t poison = 0xFF) {
    uint64_t p = 0;
    ok(fa_malloc(g_rt, bytes, &p), "fa_malloc");
    ptrs.push_back(p);
    ok(fa_memset(g_rt, p, poison, bytes), "fa_memset");
    return p;
  }
  template <typename T>
  uint64_t upload(const std::vector<T> &v) {
    const uint64_t p = alloc(v.size() * sizeof(T));
    ok(fa_memcpy_htod(g_rt, p, v.data(), v.size() * sizeof(T)), "upload");
    return p;
  }
  template <typename T>
  std::vector<T> download(uint64_t p, size_t n) {
    std::vector<T> v(n);
    ok(fa_memcpy_dtoh(g_rt, v.data(), p, n * sizeof(T)), "download");
    return v;
  }
};

fa_config *make_config(int heads, int dv, bool bf16) {
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.dtype = bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
  d.head_dim = dv;
  d.num_heads_q = d.num_heads_kv = heads;
  fa_config *cfg = nullptr;
  ok(fa_config_create(&d, &cfg), "fa_config_create");
  return cfg;
}

float half_to_float(uint16_t h, bool bf16) {
  return bf16 ? fa::ref::bf16_to_f32(h) : fa::ref::f16_to_f32(h);
}

double to_format(double lse_natural, int format) {
  return format == FA_LSE_BASE2 ? lse_natural * kLog2e : lse_natural;  // -inf stays -inf
}

// Whether an LSE matches: both -inf, or within a relative 2e-6 (fp32 with
// one conversion) and 1e-5 absolute.
bool lse_close(double got, double want) {
  if (std::isinf(want)) return std::isinf(got) && got < 0;
  return std::fabs(got - want) <= 1e-5 + 2e-6 * std::fabs(want);
}

// Random partial states [splits, batch, seqlen_q, heads] merged with the
// given formats against the fp64 merge; padded strides; O and LSE outputs
// poisoned with NaN (0xFF bytes) first.
void reduce_case(int in_fmt, int out_fmt, size_t struct_size, int splits, int batch, int sq,
                 int heads, int dv, bool bf16, uint32_t seed) {
  std::printf("  reduce in %d out %d struct %zu splits %d b%d sq%d h%d dv%d %s\n", in_fmt, out_fmt,
              struct_size, splits, batch, sq, heads, dv, bf16 ? "bf16" : "fp16");
  Mem mem;
  fa_config *cfg = make_config(heads, dv, bf16);
  const int rows = batch * sq * heads;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> uo(-2.0, 2.0), ul(-8.0, 8.0);
  std::uniform_int_distribution<int> coin(0, 4);
  // Logical states per (split, row(b, s, h)), natural logs.
  std::vector<double> op(size_t(splits) * rows * dv), lp(size_t(splits) * rows);
  for (double &x : op) x = uo(gen);
  for (double &x : lp) x = coin(gen) == 0 ? -kInf : ul(gen);
  for (int r = 0; r < rows; r += 5)
    for (int s = 0; s < splits; ++s) lp[size_t(s) * rows + r] = -kInf;  // rows with no state
  fa_reduce_args a = FA_REDUCE_ARGS_INIT;
  a.num_splits = splits;
  a.batch = batch;
  a.seqlen_q = sq;
  a.o_partial_stride[4] = 1;
  a.o_partial_stride[3] = dv + 4;
  a.o_partial_stride[2] = int64_t(heads) * a.o_partial_stride[3];
  a.o_partial_stride[1] = int64_t(sq) * a.o_partial_stride[2];
  a.o_partial_stride[0] = int64_t(batch) * a.o_partial_stride[1] + 8;
  a.lse_partial_stride[3] = 1;
  a.lse_partial_stride[2] = sq + 3;
  a.lse_partial_stride[1] = int64_t(heads) * a.lse_partial_stride[2];
  a.lse_partial_stride[0] = int64_t(batch) * a.lse_partial_stride[1] + 2;
  std::vector<float> dop(size_t(splits) * a.o_partial_stride[0], NAN),
      dlp(size_t(splits) * a.lse_partial_stride[0], NAN);
  for (int s = 0; s < splits; ++s)
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < sq; ++i)
        for (int h = 0; h < heads; ++h) {
          const size_t r = (size_t(b) * sq + i) * heads + h;
          for (int c = 0; c < dv; ++c)
            dop[s * a.o_partial_stride[0] + b * a.o_partial_stride[1] + i * a.o_partial_stride[2] +
                h * a.o_partial_stride[3] + c] = float(op[(size_t(s) * rows + r) * dv + c]);
          // The library reads fp32: the reference merges the same fp32 values.
          const float l = float(to_format(lp[size_t(s) * rows + r], in_fmt));
          dlp[s * a.lse_partial_stride[0] + b * a.lse_partial_stride[1] +
              h * a.lse_partial_stride[2] + i] = l;
          lp[size_t(s) * rows + r] = in_fmt == FA_LSE_BASE2 ? double(l) / kLog2e : double(l);
          for (int c = 0; c < dv; ++c)
            op[(size_t(s) * rows + r) * dv + c] =
                double(float(op[(size_t(s) * rows + r) * dv + c]));
        }
  a.o_partial = mem.upload(dop);
  a.lse_partial = mem.upload(dlp);
  a.o.stride[3] = 1;
  a.o.stride[2] = dv;
  a.o.stride[1] = int64_t(heads) * dv;
  a.o.stride[0] = int64_t(sq) * a.o.stride[1];
  a.o.data = mem.alloc(size_t(rows) * dv * 2);
  a.lse = mem.alloc(size_t(rows) * 4);
  a.lse_partial_format = in_fmt;
  a.lse_format = out_fmt;
  a.struct_size = struct_size;
  if (struct_size != sizeof(fa_reduce_args)) {
    // A 0.3 caller's struct ends before the formats: whatever lies there
    // must not be read.
    a.lse_partial_format = 77;
    a.lse_format = -3;
  }
  ok(fa_decode_reduce(g_rt, cfg, &a, nullptr), "fa_decode_reduce");
  ok(fa_synchronize(g_rt, nullptr), "fa_synchronize");
  const std::vector<uint16_t> o = mem.download<uint16_t>(a.o.data, size_t(rows) * dv);
  const std::vector<float> lse = mem.download<float>(a.lse, size_t(rows));
  std::vector<double> o_ref(size_t(rows) * dv), lse_ref(rows);
  fa::ref::merge_states(splits, rows, dv, op.data(), lp.data(), o_ref.data(), lse_ref.data());
  const double ulp = bf16 ? 1.0 / 128 : 1.0 / 1024;
  long long bad = 0, lse_bad = 0;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < heads; ++h) {
        const size_t r = (size_t(b) * sq + i) * heads + h;
        for (int c = 0; c < dv; ++c) {
          const double got = half_to_float(o[r * dv + c], bf16), want = o_ref[r * dv + c];
          if (!(std::fabs(got - want) <= ulp * std::max(1.0, std::fabs(want)))) ++bad;
        }
        const double lg = lse[(size_t(b) * heads + h) * sq + i];
        if (!lse_close(lg, to_format(lse_ref[r], out_fmt))) ++lse_bad;
      }
  std::printf("    O mismatches %lld, LSE mismatches %lld of %d rows\n", bad, lse_bad, rows);
  assert_int_equal(bad, 0);
  assert_int_equal(lse_bad, 0);
  fa_config_destroy(cfg);
}

// Every input/output format pair against the fp64 merge, at head dims and
// split counts other than lse_formats.cases' (4 splits of dv 32, through
// test_features).
void test_reduce_formats_vs_fp64(void **) {
  need_runtime();
  uint32_t seed = 11;
  for (int in : {FA_LSE_NATURAL, FA_LSE_BASE2})
    for (int out : {FA_LSE_NATURAL, FA_LSE_BASE2}) {
      reduce_case(in, out, sizeof(fa_reduce_args), 5, 1, 2, 3, 40, true, seed++);
      reduce_case(in, out, sizeof(fa_reduce_args), 1, 2, 1, 2, 128, false, seed++);
    }
}

// A caller built against 0.3 (FA_REDUCE_ARGS_SIZE_0_3): natural logs in and
// out, the bytes past its struct ignored.
void test_reduce_0_3_struct(void **) {
  need_runtime();
  reduce_case(FA_LSE_NATURAL, FA_LSE_NATURAL, FA_REDUCE_ARGS_SIZE_0_3, 4, 2, 2, 4, 64, false, 5);
}

// fa_decode's own partial states (o.data = 0), their LSE converted to base 2
// on the host, merged by fa_decode_reduce, equal the natural merge and
// fa_decode's combine; a base-2 output is the natural one times log2(e).
void test_decode_states_in_base2(void **) {
  need_runtime();
  Mem mem;
  const int batch = 2, sq = 3, hq = 8, hkv = 2, d = 64, sk_max = 300;
  const bool bf16 = false;
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = d;
  desc.num_heads_q = hq;
  desc.num_heads_kv = hkv;
  desc.causal = 1;
  fa_config *cfg = nullptr;
  ok(fa_config_create(&desc, &cfg), "fa_config_create");
  std::mt19937 gen(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_half = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (uint16_t &x : v) x = fa::ref::f32_to_f16(nd(gen));
    return v;
  };
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = batch;
  a.seqlen_q = sq;
  a.seqlen_k_max = sk_max;
  a.num_splits = 4;
  a.q = {mem.upload(random_half(size_t(batch) * sq * hq * d)), {sq * hq * d, hq * d, d, 1}};
  a.k_cache = {mem.upload(random_half(size_t(batch) * sk_max * hkv * d)),
               {int64_t(sk_max) * hkv * d, hkv * d, d, 1}};
  a.v_cache = {mem.upload(random_half(size_t(batch) * sk_max * hkv * d)),
               {int64_t(sk_max) * hkv * d, hkv * d, d, 1}};
  a.cache_seqlens = mem.upload(std::vector<int32_t>{sk_max, 70});
  size_t ws = 0;
  int32_t splits = 0;
  ok(fa_decode_workspace_size(g_rt, cfg, &a, &ws, &splits), "fa_decode_workspace_size");
  assert_true(splits > 1);
  a.workspace = mem.alloc(ws);
  a.workspace_size = ws;
  const size_t rows = size_t(batch) * sq * hq;
  // fa_decode's combine, for comparison.
  a.o = {mem.alloc(rows * d * 2), {sq * hq * d, hq * d, d, 1}};
  a.lse = mem.alloc(rows * 4);
  ok(fa_decode(g_rt, cfg, &a, nullptr), "fa_decode");
  const std::vector<uint16_t> o_dec = mem.download<uint16_t>(a.o.data, rows * d);
  const std::vector<float> lse_dec = mem.download<float>(a.lse, rows);
  // The workspace: O_partial [splits, b, sq, hq, d], then at the next
  // 256-byte boundary LSE_partial [splits, b, hq, sq].
  const size_t o_bytes = size_t(splits) * rows * d * 4;
  const uint64_t lse_part = a.workspace + (o_bytes + 255) / 256 * 256;
  std::vector<float> lp = mem.download<float>(lse_part, size_t(splits) * rows);
  size_t n_inf = 0;
  for (float &x : lp) {
    n_inf += std::isinf(x);
    x = float(double(x) * kLog2e);
  }
  std::printf("  %d splits, %zu of %zu partial LSEs -inf\n", splits, n_inf, lp.size());
  assert_true(n_inf > 0);  // sequence 1's late splits are empty
  const uint64_t lp2 = mem.upload(lp);

  auto merge = [&](uint64_t lse_partial, int in_fmt, int out_fmt, std::vector<uint16_t> *o,
                   std::vector<float> *lse) {
    fa_reduce_args r = FA_REDUCE_ARGS_INIT;
    r.num_splits = splits;
    r.batch = batch;
    r.seqlen_q = sq;
    r.o_partial = a.workspace;
    r.o_partial_stride[4] = 1;
    r.o_partial_stride[3] = d;
    r.o_partial_stride[2] = int64_t(hq) * d;
    r.o_partial_stride[1] = int64_t(sq) * hq * d;
    r.o_partial_stride[0] = int64_t(rows) * d;
    r.lse_partial = lse_partial;
    r.lse_partial_stride[3] = 1;
    r.lse_partial_stride[2] = sq;
    r.lse_partial_stride[1] = int64_t(hq) * sq;
    r.lse_partial_stride[0] = int64_t(rows);
    r.o = {mem.alloc(rows * d * 2), {sq * hq * d, hq * d, d, 1}};
    r.lse = mem.alloc(rows * 4);
    r.lse_partial_format = in_fmt;
    r.lse_format = out_fmt;
    ok(fa_decode_reduce(g_rt, cfg, &r, nullptr), "fa_decode_reduce");
    *o = mem.download<uint16_t>(r.o.data, rows * d);
    *lse = mem.download<float>(r.lse, rows);
  };
  std::vector<uint16_t> o_nat, o_b2, o_b2b2;
  std::vector<float> lse_nat, lse_b2, lse_b2b2;
  merge(lse_part, FA_LSE_NATURAL, FA_LSE_NATURAL, &o_nat, &lse_nat);
  merge(lp2, FA_LSE_BASE2, FA_LSE_NATURAL, &o_b2, &lse_b2);
  merge(lp2, FA_LSE_BASE2, FA_LSE_BASE2, &o_b2b2, &lse_b2b2);
  // The natural merge is fa_decode's combine, bit for bit.
  assert_memory_equal(o_nat.data(), o_dec.data(), o_nat.size() * 2);
  assert_memory_equal(lse_nat.data(), lse_dec.data(), lse_nat.size() * 4);
  long long o_diff = 0, lse_bad = 0;
  for (size_t i = 0; i < o_nat.size(); ++i) {
    const double x = half_to_float(o_nat[i], bf16), y = half_to_float(o_b2[i], bf16),
                 z = half_to_float(o_b2b2[i], bf16);
    assert_false(std::isnan(y));
    // The weights differ by fp32 rounding only: at most one fp16 ulp.
    if (std::fabs(x - y) > std::max(1.0, std::fabs(x)) / 1024 || y != z) ++o_diff;
  }
  for (size_t r = 0; r < rows; ++r) {
    if (!lse_close(lse_b2[r], lse_nat[r])) ++lse_bad;
    if (!lse_close(lse_b2b2[r], to_format(lse_nat[r], FA_LSE_BASE2))) ++lse_bad;
  }
  std::printf("  O differences %lld, LSE mismatches %lld\n", o_diff, lse_bad);
  assert_int_equal(o_diff, 0);
  assert_int_equal(lse_bad, 0);
  fa_config_destroy(cfg);
}

// Bad formats: INVALID_ARGUMENT naming the field, nothing written.
void test_reduce_bad_formats(void **) {
  need_runtime();
  Mem mem;
  fa_config *cfg = make_config(2, 64, false);
  fa_reduce_args a = FA_REDUCE_ARGS_INIT;
  a.num_splits = 2;
  a.batch = 1;
  a.seqlen_q = 1;
  a.o_partial = mem.upload(std::vector<float>(2 * 2 * 64, 1.0f));
  a.o_partial_stride[4] = 1;
  a.o_partial_stride[3] = 64;
  a.o_partial_stride[2] = 128;
  a.o_partial_stride[1] = 128;
  a.o_partial_stride[0] = 128;
  a.lse_partial = mem.upload(std::vector<float>(4, 0.5f));
  a.lse_partial_stride[3] = 1;
  a.lse_partial_stride[2] = 1;
  a.lse_partial_stride[1] = 2;
  a.lse_partial_stride[0] = 2;
  a.o = {mem.alloc(2 * 64 * 2, 0xAB), {128, 128, 64, 1}};
  a.lse = mem.alloc(2 * 4, 0xAB);
  struct Bad {
    int in, out;
    const char *field;
  } bad[] = {{2, 0, "lse_partial_format"},
             {-1, 0, "lse_partial_format"},
             {1, 1000, "lse_format"}};  // (7: lse_formats.cases)
  for (const Bad &b : bad) {
    a.lse_partial_format = b.in;
    a.lse_format = b.out;
    assert_int_equal(fa_decode_reduce(g_rt, cfg, &a, nullptr), FA_ERROR_INVALID_ARGUMENT);
    std::printf("  %s\n", fa_last_error());
    assert_non_null(std::strstr(fa_last_error(), b.field));
    assert_non_null(std::strstr(fa_last_error(), "fa_lse_format"));
  }
  // A struct size of neither 0.3 nor 0.4.
  a.lse_partial_format = a.lse_format = 0;
  a.struct_size = FA_REDUCE_ARGS_SIZE_0_3 + 4;
  assert_int_equal(fa_decode_reduce(g_rt, cfg, &a, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "struct_size"));
  for (uint8_t x : mem.download<uint8_t>(a.o.data, 2 * 64 * 2)) assert_int_equal(x, 0xAB);
  for (uint8_t x : mem.download<uint8_t>(a.lse, 8)) assert_int_equal(x, 0xAB);
  fa_config_destroy(cfg);
}

std::string generate(const fa_config *cfg, fa_kernel_kind kind, const fa_generate_options *o) {
  size_t n = 0;
  if (fa_generate_for(cfg, kind, 80, o, nullptr, 0, &n) != FA_SUCCESS) return "";
  std::string s(n + 1, '\0');
  ok(fa_generate_for(cfg, kind, 80, o, s.data(), s.size(), &n), "fa_generate_for");
  s.resize(n);
  return s;
}

// fa_generate_for's lse formats: distinct kernels per format pair (the
// natural pair is fa_generate's); formats only for REDUCE; bad values.
void test_generate_formats(void **) {
  fa_config *cfg = make_config(4, 128, true);
  fa_generate_options o = FA_GENERATE_OPTIONS_INIT;
  const std::string plain = generate(cfg, FA_KERNEL_REDUCE, nullptr);
  assert_false(plain.empty());
  assert_true(generate(cfg, FA_KERNEL_REDUCE, &o) == plain);
  o.struct_size = FA_GENERATE_OPTIONS_SIZE_0_3;
  assert_true(generate(cfg, FA_KERNEL_REDUCE, &o) == plain);
  o.struct_size = sizeof o;
  std::vector<std::string> seen{plain};
  for (int in : {0, 1})
    for (int out : {0, 1}) {
      if (!in && !out) continue;
      o.lse_partial_format = in;
      o.lse_format = out;
      const std::string p = generate(cfg, FA_KERNEL_REDUCE, &o);
      assert_false(p.empty());
      for (const std::string &s : seen) assert_false(p == s);
      seen.push_back(p);
    }
  size_t n = 0;
  o.lse_partial_format = 2;
  assert_int_equal(fa_generate_for(cfg, FA_KERNEL_REDUCE, 80, &o, nullptr, 0, &n),
                   FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "lse_partial_format"));
  o.lse_partial_format = 1;
  assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, 80, &o, nullptr, 0, &n),
                   FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "FA_KERNEL_REDUCE"));
  fa_config_destroy(cfg);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_formats_vs_fp64), cmocka_unit_test(test_reduce_0_3_struct),
      cmocka_unit_test(test_decode_states_in_base2), cmocka_unit_test(test_reduce_bad_formats),
      cmocka_unit_test(test_generate_formats),
  };
  return cmocka_run_group_tests(tests, fa::test::emu_runtime_setup, fa::test::emu_runtime_teardown);
}
