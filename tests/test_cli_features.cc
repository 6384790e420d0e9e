// The feature descriptions (tests/features/<feature>.cases) through the
// `flashattn` program (FA_CLI_PATH) on the emulator, one test per file:
// forward lines as `run`, decode lines as `decode`, with inputs drawn here
// from the line's seed into .npy files (cache rows past cache_seqlens NaN),
// O and LSE read back and checked against the fp64 reference computed here
// (fp8 values quantised by the program's rule, the append and RoPE done on
// the host) under the runners' rule (numerics.h, check_output); reject
// lines become the program's equivalent bad input (a slopes or sinks file of
// the wrong shape, a tree mask with a column too many, rotary tables of 8
// dims, rotary tables without --k-new, --kv-scale without --kv-dtype,
// --page-size 0) and must exit with status 2, the message in stderr and no
// --out written. Lines the program cannot express (reduce: no such command;
// misaligned pointers, bad descale strides and decode without a combine:
// not reachable from files) are listed by name once per op; a key or value
// the parser does not know fails the line.

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"
#include "support/feature_cases.h"
#include "support/numerics.h"

// Last: it includes cmocka.
#include "support/cli_harness.h"
#include "support/feature_suite.h"

namespace {

using namespace fa::test::cli;
namespace ft = fa::test::features;

std::string str(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::vector<float> randn(size_t n, std::mt19937 *gen) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(n);
  for (float &e : x) e = nd(*gen);
  return x;
}

std::vector<double> rounded(const std::vector<float> &x, bool bf16) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = fa::ref::round_to(x[i], bf16);
  return out;
}

const char *fp8_name(int dtype) { return dtype == FA_DTYPE_FP8_E5M2 ? "e5m2" : "e4m3"; }

// One line as a program run: its arguments, and the reference inputs.
struct Run {
  std::vector<std::string> args;
  fa::ref::Problem p;
  std::vector<double> q, k, v;
  std::vector<int32_t> lens;  // decode: the valid keys after the append
  std::vector<uint8_t> tree;  // [batch][sq][sq] for the reference
  std::vector<float> sinks, slopes;
  bool p_e4m3 = false;  // the fp8 forward rounds P to e4m3
};

// The reject line's bad input written over the good one (args edited);
// false when the program cannot express it.
bool cli_mutation(const ft::Spec &s, Run *r) {
  auto set_file = [&](const char *opt, const std::string &file) {
    for (size_t i = 0; i + 1 < r->args.size(); ++i)
      if (r->args[i] == opt) r->args[i + 1] = path_of(file);
  };
  const std::string &b = s.bad;
  if (b == "alibi_slopes_stride") {  // [batch, heads_q - 1]
    std::vector<float> x(size_t(s.batch) * (s.heads_q - 1), 0.25f);
    write_npy("bad_slopes.npy", fa::npy::from_f32({s.batch, s.heads_q - 1}, x.data()));
    set_file("--alibi-slopes", "bad_slopes.npy");
  } else if (b == "sinks_misaligned") {  // heads_q + 1 values
    std::vector<float> x(size_t(s.heads_q) + 1, 1.0f);
    write_npy("bad_sinks.npy", fa::npy::from_f32({s.heads_q + 1}, x.data()));
    set_file("--sinks", "bad_sinks.npy");
  } else if (b == "tree_mask_row_stride") {  // [batch, seqlen_q, seqlen_q + 1]
    std::vector<int32_t> x(size_t(s.batch) * s.seqlen_q * (s.seqlen_q + 1), 1);
    write_npy("bad_mask.npy", fa::npy::from_i32({s.batch, s.seqlen_q, s.seqlen_q + 1}, x.data()));
    set_file("--tree-mask", "bad_mask.npy");
  } else if (b == "descale_without_fp8") {
    r->args.insert(r->args.end(), {"--kv-scale", s.descale == "tensor" ? "tensor" : "head"});
  } else if (b == "rotary_dim") {  // tables of 8 dims
    std::vector<float> x(size_t(s.seqlen_k) * 4, 0.5f);
    write_npy("bad_cos.npy", fa::npy::from_f32({s.seqlen_k, 4}, x.data()));
    set_file("--rotary-cos", "bad_cos.npy");
    set_file("--rotary-sin", "bad_cos.npy");
  } else if (b == "rotary_without_new") {  // the tables, no --k-new
    const int half = s.rotary_dim / 2;
    std::vector<float> x(size_t(s.seqlen_k) * half, 0.5f);
    write_npy("cos.npy", fa::npy::from_f32({s.seqlen_k, half}, x.data()));
    r->args.insert(r->args.end(),
                   {"--rotary-cos", path_of("cos.npy"), "--rotary-sin", path_of("cos.npy")});
  } else if (b == "page_size") {
    for (size_t i = 0; i + 1 < r->args.size(); ++i)
      if (r->args[i] == "--page-size") r->args[i + 1] = "0";
  } else {
    return false;
  }
  return true;
}

// Q rotated at its positions (cache_seqlens + i when causal or windowed,
// else cache_seqlens), the new keys rotated and the new rows put in the
// cache (fp8: quantised with the cache's descales, as the kernel does).
void append(const ft::Spec &s, const std::vector<float> &kn, const std::vector<float> &vn,
            const std::vector<float> &cs, const std::vector<float> &sn,
            const std::vector<double> *kds, const std::vector<double> *vds, Run *r) {
  const int d = s.head_dim, dv = s.dv(), hkv = s.hkv(), sk = s.seqlen_k, rd = s.rotary_dim;
  const bool e5m2 = s.kv_dtype == FA_DTYPE_FP8_E5M2;
  const std::vector<int> lens = s.lens();
  auto rope = [&](float *row, int pos) {
    if (rd)
      fa::ref::rope_row(row, rd, s.rotary_interleaved, &cs[size_t(pos) * rd / 2],
                        &sn[size_t(pos) * rd / 2], s.bf16);
  };
  std::vector<float> row(size_t(std::max(d, dv)));
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.seqlen_q; ++i)
      for (int h = 0; h < s.heads_q; ++h) {
        double *qr = &r->q[((size_t(b) * s.seqlen_q + i) * s.heads_q + h) * d];
        std::copy(qr, qr + d, row.begin());
        rope(row.data(), lens[b] + (s.causal || s.window_left >= 0 ? i : 0));
        std::copy(row.begin(), row.begin() + d, qr);
      }
    for (int t = 0; t < s.seqlen_new; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int kv = 0; kv < 2; ++kv) {
          const int w = kv ? dv : d, pos = lens[b] + t;
          const float *src = &(kv ? vn : kn)[((size_t(b) * s.seqlen_new + t) * hkv + h) * w];
          for (int e = 0; e < w; ++e) row[e] = fa::ref::round_to(src[e], s.bf16);
          if (!kv) rope(row.data(), pos);
          const std::vector<double> *ds = kv ? vds : kds;
          double *dst = &(kv ? r->v : r->k)[((size_t(b) * sk + pos) * hkv + h) * w];
          for (int e = 0; e < w; ++e) {
            if (!s.kv_dtype) {
              dst[e] = row[e];
              continue;
            }
            const float sc = float((*ds)[ds->size() == 1 ? 0 : size_t(b) * hkv + h]);
            dst[e] = fa::ref::fp8_to_double(fa::ref::fp8_from_double(row[e] / sc, e5m2), e5m2) * sc;
          }
        }
    r->lens[b] += s.seqlen_new;
  }
}

// The command line and reference inputs of a forward or decode line; the
// inputs are written to the scratch directory.
Run prepare(const ft::Spec &s) {
  const bool decode = s.op == "decode";
  const int b = s.batch, sq = s.seqlen_q, sk = s.seqlen_k, hq = s.heads_q, hkv = s.hkv();
  const int d = s.head_dim, dv = s.dv();
  std::mt19937 gen(s.seed);
  const std::vector<float> qf = randn(size_t(b) * sq * hq * d, &gen);
  std::vector<float> kf = randn(size_t(b) * sk * hkv * d, &gen);
  std::vector<float> vf = randn(size_t(b) * sk * hkv * dv, &gen);
  Run r;
  const std::vector<int> lens = s.lens();
  r.lens.assign(lens.begin(), lens.end());
  if (decode)  // rows past cache_seqlens: NaN, never to be read
    for (int ib = 0; ib < b; ++ib)
      for (int j = lens[ib]; j < sk; ++j) {
        std::fill_n(&kf[(size_t(ib) * sk + j) * hkv * d], size_t(hkv) * d, NAN);
        std::fill_n(&vf[(size_t(ib) * sk + j) * hkv * dv], size_t(hkv) * dv, NAN);
      }
  write_npy("q.npy", fa::npy::from_f32({b, sq, hq, d}, qf.data()));
  write_npy("k.npy", fa::npy::from_f32({b, sk, hkv, d}, kf.data()));
  write_npy("v.npy", fa::npy::from_f32({b, sk, hkv, dv}, vf.data()));
  write_npy("lens.npy", fa::npy::from_i32({b}, r.lens.data()));
  std::vector<std::string> extra = {"--dtype", s.bf16 ? "bf16" : "fp16", "--lse-out",
                                    path_of("lse.npy")};
  auto opt = [&](const char *name, const std::string &value) {
    extra.insert(extra.end(), {name, value});
  };
  if (s.causal) extra.push_back("--causal");
  if (s.window_left >= 0) opt("--window-left", std::to_string(s.window_left));
  if (s.window_right >= 0) opt("--window-right", std::to_string(s.window_right));
  if (s.softcap > 0) opt("--softcap", str(s.softcap));
  if (decode) opt("--num-splits", std::to_string(s.num_splits));
  if (s.kv_layout == FA_KV_PAGED)
    opt("--kv-layout", "paged"), opt("--page-size", std::to_string(s.page_size));
  if (s.kv_layout == FA_KV_PTR_ARRAY) opt("--kv-layout", "ptrs");
  r.sinks = ft::sinks(s);
  if (!r.sinks.empty()) {
    write_npy("sinks.npy", fa::npy::from_f32({hq}, r.sinks.data()));
    opt("--sinks", path_of("sinks.npy"));
  }
  r.slopes = ft::alibi_slopes(s);
  if (!r.slopes.empty()) {
    write_npy("slopes.npy", s.alibi == "batch" ? fa::npy::from_f32({b, hq}, r.slopes.data())
                                               : fa::npy::from_f32({hq}, r.slopes.data()));
    opt("--alibi-slopes", path_of("slopes.npy"));
  }
  const std::vector<uint8_t> bits = ft::tree_bits(s);
  if (!bits.empty()) {
    const int n = s.tree == "shared" ? 1 : b;
    fa::npy::Array m;
    m.dtype = fa::npy::DType::U8;
    m.shape = {n, sq, sq};
    m.data = bits;
    write_npy("mask.npy", m);
    opt("--tree-mask", path_of("mask.npy"));
    for (int ib = 0; ib < b; ++ib)
      r.tree.insert(r.tree.end(), bits.begin() + (n == 1 ? 0 : size_t(ib) * sq * sq),
                    bits.begin() + (n == 1 ? 0 : size_t(ib) * sq * sq) + size_t(sq) * sq);
  }
  // Q, K, V as the kernel sees them: rounded to the dtype, or fp8.
  const bool per_head = s.descale != "tensor";
  std::vector<double> kds, vds;
  if (s.kv_dtype) {
    opt("--emulator-sm", "89");
    opt("--kv-dtype", fp8_name(s.kv_dtype));
    if (!s.descale.empty()) opt("--kv-scale", per_head ? "head" : "tensor");
    const std::vector<int32_t> *valid = decode ? &r.lens : nullptr;
    const bool e5 = s.kv_dtype == FA_DTYPE_FP8_E5M2;
    r.k = cli_fp8_values(kf, b, sk, hkv, d, 1, e5, per_head, valid, &kds);
    r.v = cli_fp8_values(vf, b, sk, hkv, dv, 1, e5, per_head, valid, &vds);
  } else {
    r.k = rounded(kf, s.bf16);
    r.v = rounded(vf, s.bf16);
  }
  if (s.q_dtype) {
    opt("--q-dtype", fp8_name(s.q_dtype));
    r.q = cli_fp8_values(qf, b, sq, hq, d, hq / hkv, s.q_dtype == FA_DTYPE_FP8_E5M2, per_head,
                         nullptr);
    r.p_e4m3 = true;  // sm_89's fp8 mma rounds P to e4m3
  } else {
    r.q = rounded(qf, s.bf16);
  }
  if (s.seqlen_new > 0) {
    const std::vector<float> kn = randn(size_t(b) * s.seqlen_new * hkv * d, &gen);
    const std::vector<float> vn = randn(size_t(b) * s.seqlen_new * hkv * dv, &gen);
    write_npy("k_new.npy", fa::npy::from_f32({b, s.seqlen_new, hkv, d}, kn.data()));
    write_npy("v_new.npy", fa::npy::from_f32({b, s.seqlen_new, hkv, dv}, vn.data()));
    opt("--k-new", path_of("k_new.npy"));
    opt("--v-new", path_of("v_new.npy"));
    std::vector<float> cs(size_t(sk) * std::max(s.rotary_dim / 2, 1)), sn(cs.size());
    std::uniform_real_distribution<double> angle(0.0, 2 * M_PI);
    for (size_t i = 0; i < cs.size(); ++i) {
      const double a = angle(gen);
      cs[i] = float(std::cos(a)), sn[i] = float(std::sin(a));
    }
    if (s.rotary_dim) {
      write_npy("cos.npy", fa::npy::from_f32({sk, s.rotary_dim / 2}, cs.data()));
      write_npy("sin.npy", fa::npy::from_f32({sk, s.rotary_dim / 2}, sn.data()));
      opt("--rotary-cos", path_of("cos.npy"));
      opt("--rotary-sin", path_of("sin.npy"));
      if (s.rotary_interleaved) extra.push_back("--rotary-interleaved");
    }
    append(s, kn, vn, cs, sn, &kds, &vds, &r);
  }
  r.args = decode ? emulator_decode_args(extra) : emulator_run_args(extra);
  fa::ref::Problem &p = r.p;
  p.batch = b, p.seqlen_q = sq, p.seqlen_k = sk, p.num_heads_q = hq, p.num_heads_kv = hkv;
  p.head_dim = d, p.head_dim_v = dv, p.causal = s.causal;
  p.window_left = s.window_left, p.window_right = s.window_right, p.softcap = s.softcap;
  if (!r.tree.empty()) p.tree_mask = r.tree.data();
  if (!r.sinks.empty()) p.sinks = r.sinks.data();
  if (!r.slopes.empty()) p.alibi_slopes = r.slopes.data();
  p.alibi_stride = s.alibi == "batch" ? hq : 0;
  return r;
}

// What prepare() cannot express for a forward or decode line ("" = all).
std::string unsupported(const ft::Spec &s) {
  if (s.op == "forward" && (!s.cache_seqlens.empty() || s.kv_layout != FA_KV_CONTIGUOUS ||
                            !s.tree.empty() || s.seqlen_new))
    return "cache_seqlens, kv_layout, tree_mask, seqlen_new are decode's\n";
  if (s.op == "forward" && s.kv_dtype && !s.q_dtype)
    return "run's fp8 forward takes q_dtype and kv_dtype together\n";
  if (s.op == "decode" && s.q_dtype) return "q_dtype on decode\n";
  return "";
}

// Runs a forward or decode line; the problems found.
std::string run_line(const ft::Spec &s) {
  if (!unsupported(s).empty()) return "not expressible: " + unsupported(s);
  Run r = prepare(s);
  std::remove(path_of("o.npy").c_str());
  std::remove(path_of("lse.npy").c_str());
  const bool decode = s.op == "decode";
  const Result res = run_cli(r.args);
  const std::string cmd = "flashattn" + join(r.args) + "\n";
  if (!res.exited || res.code != 0 || !contains(res.out, "\nPASS"))
    return cmd + "exit " + std::to_string(res.code) + ", stdout:\n" + res.out +
           "stderr: " + res.err;
  const size_t no = size_t(s.batch) * s.seqlen_q * s.heads_q * s.dv();
  const std::vector<float> o = read_npy("o.npy").to_f32(), lse = read_npy("lse.npy").to_f32();
  if (o.size() != no || lse.size() != size_t(s.batch) * s.heads_q * s.seqlen_q)
    return cmd + "o.npy / lse.npy of the wrong size\n";
  std::vector<double> o_ref(no), lse_ref(lse.size());
  const int32_t *lens = decode ? r.lens.data() : nullptr;
  fa::ref::attention(r.p, r.q.data(), r.k.data(), r.v.data(), o_ref.data(), lse_ref.data(), lens);
  const std::vector<double> lowp =
      fa::test::lowp_attention(r.p, r.q, r.k, r.v, s.bf16, lens, r.p_e4m3);
  const std::string e = fa::test::check_output(o, o_ref, lowp, lse, lse_ref, r.p_e4m3);
  return e.empty() ? "" : cmd + e;
}

// The CLI names a C field by its option: `message` with '_' read as '-'
// (alibi_slopes: --alibi-slopes), as tests/features/README.md says.
std::string as_option(std::string m) {
  std::replace(m.begin(), m.end(), '_', '-');
  return m;
}

// Runs a reject line: exit status 2, the message (or its option spelling)
// in stderr, no --out.
std::string run_reject(const ft::Spec &s, Run *r) {
  std::remove(path_of("o.npy").c_str());
  const Result res = run_cli(r->args);
  const std::string cmd = "flashattn" + join(r->args) + "\n";
  std::printf("    exit %d: %s", res.code, res.err.c_str());
  std::string err;
  if (!res.exited || res.code != 2) err += "exit status " + std::to_string(res.code) + ", not 2\n";
  if (!contains(res.err, s.message) && !contains(res.err, as_option(s.message)))
    err += "stderr lacks \"" + s.message + "\" (or \"" + as_option(s.message) + "\")\n";
  struct stat st;
  if (stat(path_of("o.npy").c_str(), &st) == 0) err += "--out written on a refused run\n";
  return err.empty() ? "" : cmd + "stderr: " + res.err + err;
}

void test_feature(void **state) {
  skip_without_cli();
  const std::string name = static_cast<const char *>(*state);
  std::vector<ft::Line> lines;
  std::string failures;
  if (!ft::load(name, &lines, &failures)) failures += "\n";
  if (lines.empty() && failures.empty()) failures = name + ".cases: no lines\n";
  std::map<std::string, std::string> skipped;  // op -> lines the program cannot express
  for (const ft::Line &l : lines) {
    std::printf("%s: %s\n", l.where().c_str(), l.text.c_str());
    ft::Spec s;
    std::string e;
    const bool parsed = ft::parse(l, &s, &e);
    if (!parsed) {
      e += "\n";
    } else if (s.op == "reduce") {
      skipped["reduce (the program has no reduce command)"] += " " + l.where();
      continue;
    } else if (s.reject) {
      Run r = prepare(s);
      if (!cli_mutation(s, &r)) {
        skipped["reject bad=" + s.bad + " (not reachable from the program's options)"] +=
            " " + l.where();
        continue;
      }
      e = run_reject(s, &r);
    } else {
      e = run_line(s);
    }
    if (!e.empty()) failures += l.where() + ": " + l.text + "\n" + e;
  }
  for (const auto &[op, where] : skipped)
    std::printf("not expressible by the CLI: %s:%s\n", op.c_str(), where.c_str());
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

}  // namespace

int main() {
  g_dir = std::string(FA_TEST_BINARY_DIR) + "/test_cli_features_work";
  mkdir(g_dir.c_str(), 0755);
  setenv("FLASHATTN_CACHE_DIR", (g_dir + "/cache").c_str(), 1);
  return ft::run_suite("test_cli_features", test_feature, nullptr, nullptr);
}
