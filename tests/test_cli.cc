// The `flashattn` program, run as a child process (FA_CLI_PATH): help and
// version, PTX generation, every kind of bad argument (usage errors exit 2
// with one line on stderr, never a signal), and `run` / `decode` / `cache`
// end to end on the emulator, with the written O and LSE files checked
// against the fp64 reference independently of the program's own verdict.

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"

// Last: they include cmocka.
#include "support/cache_fixture.h"
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

// ---- inputs -------------------------------------------------------------

std::vector<float> randn(size_t n, std::mt19937 *rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto &x : v) x = nd(*rng);
  return v;
}

// Writes `values` (float32 data) in the given .npy dtype.
void write_as(const std::string &name, const std::vector<int64_t> &shape,
              const std::vector<float> &values, fa::npy::DType t) {
  if (t == fa::npy::DType::F32) {
    write_npy(name, fa::npy::from_f32(shape, values.data()));
  } else if (t == fa::npy::DType::F64) {
    const std::vector<double> d(values.begin(), values.end());
    write_npy(name, fa::npy::from_f64(shape, d.data()));
  } else {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = fa::ref::f32_to_f16(values[i]);
    write_npy(name, fa::npy::from_f16_bits(shape, bits.data()));
  }
}

// One attention problem written as .npy files, with its fp64 reference on the
// inputs rounded as the program rounds them.
struct Case {
  int b = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 64, dv = 64;
  bool bf16 = false, causal = false;
  int wl = -1, wr = -1;
  double softcap = 0, scale = 0;
  std::vector<int32_t> seqlens;  // decode only
  fa::npy::DType file_type = fa::npy::DType::F32;
  std::vector<double> o_ref, lse_ref;
};

void write_inputs(Case *c, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> q = randn(size_t(c->b) * c->sq * c->hq * c->d, &rng);
  const std::vector<float> k = randn(size_t(c->b) * c->sk * c->hkv * c->d, &rng);
  const std::vector<float> v = randn(size_t(c->b) * c->sk * c->hkv * c->dv, &rng);
  write_as("q.npy", {c->b, c->sq, c->hq, c->d}, q, c->file_type);
  write_as("k.npy", {c->b, c->sk, c->hkv, c->d}, k, c->file_type);
  write_as("v.npy", {c->b, c->sk, c->hkv, c->dv}, v, c->file_type);
  if (!c->seqlens.empty()) {
    write_npy("s.npy", fa::npy::from_i32({c->b}, c->seqlens.data()));
  }
  // The program first narrows to float (f16 files: exact), then rounds.
  auto rounded = [&](const std::vector<float> &x) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      float f = x[i];
      if (c->file_type == fa::npy::DType::F16) f = fa::ref::round_to(f, false);
      out[i] = fa::ref::round_to(f, c->bf16);
    }
    return out;
  };
  fa::ref::Problem p;
  p.batch = c->b;
  p.seqlen_q = c->sq;
  p.seqlen_k = c->sk;
  p.num_heads_q = c->hq;
  p.num_heads_kv = c->hkv;
  p.head_dim = c->d;
  p.head_dim_v = c->dv;
  p.causal = c->causal;
  p.window_left = c->wl;
  p.window_right = c->wr;
  p.softmax_scale = float(c->scale);
  p.softcap = float(c->softcap);
  c->o_ref.assign(size_t(c->b) * c->sq * c->hq * c->dv, 0);
  c->lse_ref.assign(size_t(c->b) * c->hq * c->sq, 0);
  fa::ref::attention(p, rounded(q).data(), rounded(k).data(), rounded(v).data(), c->o_ref.data(),
                     c->lse_ref.data(), c->seqlens.empty() ? nullptr : c->seqlens.data());
}

std::vector<std::string> option_args(const Case &c) {
  std::vector<std::string> a = {"--dtype", c.bf16 ? "bf16" : "fp16", "--backend", "emulator"};
  if (c.causal) a.push_back("--causal");
  if (c.wl >= 0) a.insert(a.end(), {"--window-left", std::to_string(c.wl)});
  if (c.wr >= 0) a.insert(a.end(), {"--window-right", std::to_string(c.wr)});
  if (c.softcap > 0) a.insert(a.end(), {"--softcap", std::to_string(c.softcap)});
  if (c.scale > 0) a.insert(a.end(), {"--softmax-scale", std::to_string(c.scale)});
  return a;
}

// Checks the O.npy / LSE.npy files written by the program against the case's
// reference, with the tolerance the program documents.
void check_outputs(const Case &c) {
  const fa::npy::Array o = read_npy("o.npy");
  assert_true(o.dtype == fa::npy::DType::F32);
  assert_true((o.shape == std::vector<int64_t>{c.b, c.sq, c.hq, c.dv}));
  const std::vector<float> ov = o.to_f32();
  const fa::ref::ErrorStats e = fa::ref::compare(ov.data(), c.o_ref.data(), ov.size());
  const double atol = c.bf16 ? 2e-2 : 1e-2;
  if (e.nonfinite || e.max_abs > atol * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2) {
    std::fprintf(stderr, "O.npy: max_abs %g, rel_l2 %g, non-finite %lld\n", e.max_abs, e.rel_l2,
                 e.nonfinite);
    fail();
  }
  const fa::npy::Array l = read_npy("lse.npy");
  assert_true(l.dtype == fa::npy::DType::F32);
  assert_true((l.shape == std::vector<int64_t>{c.b, c.hq, c.sq}));
  const std::vector<float> lv = l.to_f32();
  for (size_t i = 0; i < lv.size(); ++i) {
    const double r = c.lse_ref[i];
    if (std::isinf(r)) {
      assert_true(std::isinf(lv[i]) && lv[i] < 0);
    } else if (!(std::fabs(lv[i] - r) <= 2e-3 * std::max(1.0, std::fabs(r)))) {
      std::fprintf(stderr, "LSE.npy[%zu] = %g, reference %g\n", i, double(lv[i]), r);
      fail();
    }
  }
}

// Runs `run` (or `decode`) on the case and expects PASS, exit 0 and correct
// files.
void run_case(Case c, bool decode, uint32_t seed, int num_splits = 0) {
  write_inputs(&c, seed);
  std::remove(path_of("o.npy").c_str());
  std::remove(path_of("lse.npy").c_str());
  std::vector<std::string> args;
  if (decode) {
    args = {"decode",         "--q",          path_of("q.npy"),          "--k-cache",
            path_of("k.npy"), "--v-cache",    path_of("v.npy"),          "--cache-seqlens",
            path_of("s.npy"), "--num-splits", std::to_string(num_splits)};
  } else {
    args = {"run", "--q", path_of("q.npy"), "--k", path_of("k.npy"), "--v", path_of("v.npy")};
  }
  const auto opts = option_args(c);
  args.insert(args.end(), opts.begin(), opts.end());
  args.insert(args.end(), {"--out", path_of("o.npy"), "--lse-out", path_of("lse.npy")});
  const Result r = run_cli(args);
  expect(!r.signaled, args, r, "killed by a signal");
  expect(r.code == 0, args, r, "exit status is not 0");
  expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
  for (const char *line : {"backend:", "device:", "launch:", "cache:", "error O:", "error LSE:"}) {
    expect(contains(r.out, line), args, r, line);
  }
  expect(contains(r.out, "warm"), args, r, "no warm launch time");
  expect(!decode || contains(r.out, "splits:"), args, r, "no splits line");
  check_outputs(c);
}

// ---- tests ----------------------------------------------------------------

void test_help(void **) {
  skip_without_cli();
  const struct {
    std::vector<std::string> args;
    std::vector<const char *> mentions;
  } kCases[] = {
      {{"--help"}, {"generate", "run", "decode", "cache", "--version"}},
      {{"generate", "--help"},
       {"--kind", "--dtype", "--head-dim", "--head-dim-v", "--heads-q", "--heads-kv", "--sm",
        "--causal", "--window-left", "--window-right", "--softcap", "-o"}},
      {{"run", "--help"},
       {"--q", "--k", "--v", "--dtype", "--causal", "--window-left", "--window-right", "--softcap",
        "--softmax-scale", "--backend", "--out", "--lse-out", "--ref", "1e-2", "2e-2", "rel_l2"}},
      {{"decode", "--help"},
       {"--q", "--k-cache", "--v-cache", "--cache-seqlens", "--num-splits", "--dtype", "--causal",
        "--window-left", "--softcap", "--softmax-scale", "--backend", "--out", "--lse-out"}},
      {{"cache", "--help"}, {"stats", "list", "clear"}},
      {{"cache", "stats", "--help"}, {"--cache-dir"}},
      {{"cache", "list", "--help"}, {"--cache-dir"}},
      {{"cache", "clear", "--help"}, {"--cache-dir"}},
  };
  for (const auto &c : kCases) {
    const Result r = run_cli(c.args);
    expect(r.exited && r.code == 0, c.args, r, "--help did not exit 0");
    for (const char *m : c.mentions) expect(contains(r.out, m), c.args, r, m);
  }
}

void test_version(void **) {
  skip_without_cli();
  const Result r = run_cli({"--version"});
  expect(r.code == 0, {"--version"}, r, "exit status");
  expect(contains(r.out, fa_version_string()), {"--version"}, r, "version text");
}

void test_generate(void **) {
  skip_without_cli();
  for (const char *kind : {"forward", "decode", "reduce"}) {
    for (const char *dtype : {"fp16", "bf16", "fp32"}) {
      std::vector<std::string> args = {"generate",   "--kind", kind,        "--dtype", dtype,
                                       "--head-dim", "64",     "--heads-q", "4",       "--heads-kv",
                                       "2",          "--sm",   "80"};
      const Result r = run_cli(args);
      expect(r.code == 0 && !r.signaled, args, r, "exit status");
      expect(r.out.rfind("//", 0) == 0 || r.out.rfind(".version", 0) == 0, args, r,
             "PTX does not start with // or .version");
      expect(contains(r.out, ".entry"), args, r, "no .entry");
      expect(contains(r.out, ".target sm_80"), args, r, "no .target sm_80");
      // -o writes the same bytes, and generation is deterministic.
      args.insert(args.end(), {"-o", path_of("k.ptx")});
      const Result f = run_cli(args);
      expect(f.code == 0 && f.out.empty(), args, f, "-o run");
      expect(read_text(path_of("k.ptx")) == r.out, args, f, "-o file differs from stdout");
    }
  }
  // The backward kinds: fa_backward's kernels (fp32 refused: test_bad_arguments),
  // by entry name; --varlen, --sinks and --alibi reach the kernels that read them.
  const struct {
    const char *kind, *dtype;
    std::vector<std::string> more;
    const char *entry;
  } kBackward[] = {
      {"backward-pre", "fp16", {}, ".entry fa_bwdpre_mma_f16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0("},
      {"backward", "fp16", {}, ".entry fa_backward_mma_f16_d64_dv64_g2_bm64_bn64_w4_s2_mt1_c0("},
      {"backward-post",
       "fp16",
       {},
       ".entry fa_bwdpost_mma_f16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0("},
      {"backward-pre",
       "bf16",
       {"--varlen", "--sinks", "--alibi"},
       ".entry fa_bwdpre_mma_bf16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0_varlen("},
      {"backward",
       "bf16",
       {"--varlen", "--sinks", "--alibi", "--softcap", "30"},
       ".entry "
       "fa_backward_mma_bf16_d64_dv64_g2_bm64_bn64_w4_s2_mt1_c0_softcap_varlen_sinks_alibi("},
      {"backward-post",
       "bf16",
       {"--varlen", "--sinks", "--alibi"},
       ".entry fa_bwdpost_mma_bf16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0_varlen_sinks("},
  };
  for (const auto &c : kBackward) {
    std::vector<std::string> args = {"generate",   "--kind", c.kind,      "--dtype", c.dtype,
                                     "--head-dim", "64",     "--heads-q", "4",       "--heads-kv",
                                     "2",          "--sm",   "80"};
    args.insert(args.end(), c.more.begin(), c.more.end());
    const Result r = run_cli(args);
    expect(r.code == 0 && !r.signaled, args, r, "exit status");
    expect(contains(r.out, c.entry), args, r, c.entry);
    expect(contains(r.out, ".target sm_80"), args, r, "no .target sm_80");
  }
  // Options that change the kernel change the PTX.
  const std::vector<std::string> base = {
      "generate",  "--kind", "forward",    "--dtype", "fp16", "--head-dim", "128",
      "--heads-q", "2",      "--heads-kv", "2",       "--sm", "80"};
  std::vector<std::string> variant = base;
  variant.insert(variant.end(), {"--head-dim-v", "64"});
  const Result a = run_cli(base), b = run_cli(variant);
  expect(a.code == 0 && b.code == 0, variant, b, "exit status");
  expect(a.out != b.out, variant, b, "--head-dim-v did not change the PTX");
}

void test_bad_arguments(void **) {
  skip_without_cli();
  // Valid inputs, plus malformed and mismatched ones.
  std::mt19937 rng(3);
  write_npy("q.npy", fa::npy::from_f32({1, 4, 2, 64}, randn(512, &rng).data()));
  write_npy("k.npy", fa::npy::from_f32({1, 6, 1, 64}, randn(384, &rng).data()));
  write_npy("v.npy", fa::npy::from_f32({1, 6, 1, 64}, randn(384, &rng).data()));
  write_npy("k32.npy", fa::npy::from_f32({1, 6, 1, 32}, randn(192, &rng).data()));
  write_npy("v5.npy", fa::npy::from_f32({1, 5, 1, 64}, randn(320, &rng).data()));
  write_npy("q3d.npy", fa::npy::from_f32({4, 2, 64}, randn(512, &rng).data()));
  write_npy("k_b2.npy", fa::npy::from_f32({2, 6, 1, 64}, randn(768, &rng).data()));
  write_npy("q_h3.npy", fa::npy::from_f32({1, 4, 3, 64}, randn(768, &rng).data()));
  write_npy("k_h2.npy", fa::npy::from_f32({1, 6, 2, 64}, randn(768, &rng).data()));
  write_npy("v_h2.npy", fa::npy::from_f32({1, 6, 2, 64}, randn(768, &rng).data()));
  write_npy("q_d12.npy", fa::npy::from_f32({1, 4, 2, 12}, randn(96, &rng).data()));
  write_npy("k_d12.npy", fa::npy::from_f32({1, 6, 1, 12}, randn(72, &rng).data()));
  write_npy("v_d12.npy", fa::npy::from_f32({1, 6, 1, 12}, randn(72, &rng).data()));
  write_npy("q_empty.npy", fa::npy::from_f32({1, 0, 2, 64}, nullptr));
  std::vector<int32_t> ints(512, 1);
  write_npy("q_int.npy", fa::npy::from_i32({1, 4, 2, 64}, ints.data()));
  const int32_t lens_ok[1] = {6}, lens_big[1] = {7}, lens_neg[1] = {-1};
  write_npy("s.npy", fa::npy::from_i32({1}, lens_ok));
  write_npy("s_big.npy", fa::npy::from_i32({1}, lens_big));
  write_npy("s_neg.npy", fa::npy::from_i32({1}, lens_neg));
  write_npy("s_2.npy", fa::npy::from_i32({2}, ints.data()));
  const float lens_f[1] = {6};
  write_npy("s_f.npy", fa::npy::from_f32({1}, lens_f));
  {
    // A fortran-order file, a truncated one and a text file.
    std::string q = read_text(path_of("q.npy"));
    std::string fortran = q;
    const size_t pos = fortran.find("False");
    fortran.replace(pos, 5, "True ");
    std::ofstream(path_of("q_fortran.npy"), std::ios::binary) << fortran;
    std::ofstream(path_of("q_trunc.npy"), std::ios::binary) << q.substr(0, q.size() - 100);
    std::ofstream(path_of("q_text.npy"), std::ios::binary) << "not an array\n";
    std::string be = q;
    be.replace(be.find("<f4"), 3, ">f4");
    std::ofstream(path_of("q_be.npy"), std::ios::binary) << be;
  }
  const std::string Q = path_of("q.npy"), K = path_of("k.npy"), V = path_of("v.npy"),
                    O = path_of("o_bad.npy");
  auto run = [&](const std::string &q, const std::string &k, const std::string &v) {
    return std::vector<std::string>{"run", "--q", q, "--k", k, "--v", v, "--out", O};
  };
  auto with = [](std::vector<std::string> a, std::vector<std::string> more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto gen = [](const char *kind, const char *dtype, const char *hd, const char *hkv,
                const char *sm, std::vector<std::string> more) {
    std::vector<std::string> a = {"generate",   "--kind", kind,        "--dtype", dtype,
                                  "--head-dim", hd,       "--heads-q", "2",       "--heads-kv",
                                  hkv,          "--sm",   sm};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::vector<std::string> dec = {"decode", "--q",   Q, "--k-cache", K, "--v-cache",
                                        V,        "--out", O};
  const struct {
    std::vector<std::string> args;
    int code;
    const char *needle;
  } kCases[] = {
      {{}, 2, "subcommand"},
      {{"frobnicate"}, 2, "frobnicate"},
      {{"--frobnicate"}, 2, "frobnicate"},
      {{"generate"}, 2, "--kind"},
      {gen("forward", "fp16", "sixty", "1", "80", {}), 2, "head-dim"},
      {gen("forward", "fp16", "12", "1", "80", {}), 2, "head_dim"},
      {gen("forward", "fp16", "584", "1", "80", {}), 2, "head_dim"},
      {gen("backward", "fp16", "64", "1", "80", {"--v-in-k"}), 2, "v_in_k is for FA_KERNEL_DECODE"},
      {gen("sideways", "fp16", "64", "1", "80", {}), 2, "sideways"},
      {gen("backward", "fp32", "64", "1", "80", {}), 2, "FA_DTYPE_FP32 is not supported"},
      {gen("backward", "bf16", "136", "1", "80", {}), 2, "got 136 and 136"},
      {gen("backward", "fp16", "64", "1", "80", {"--kv-layout", "paged", "--page-size", "16"}), 2,
       "not for the backward kinds"},
      {gen("backward-pre", "fp16", "64", "1", "80", {"--kv-layout", "ptrs"}), 2,
       "not for the backward kinds"},
      {gen("backward-post", "fp16", "64", "1", "80", {"--seqused-k"}), 2,
       "not for the backward kinds"},
      {gen("backward", "fp16", "64", "1", "80", {"--tree-mask"}), 2,
       "--tree-mask is for --kind decode"},
      {gen("backward", "fp16", "64", "1", "80", {"--q-dtype", "e4m3"}), 2,
       "--q-dtype is for --kind forward"},
      {gen("backward", "fp16", "64", "1", "80", {"--append-kv"}), 2,
       "--append-kv, --rotary and --rotary-table16 are for --kind decode"},
      {gen("backward", "fp16", "64", "1", "80", {"--v-in-k"}), 2, "v_in_k is for FA_KERNEL_DECODE"},
      {gen("decode", "fp16", "64", "1", "80", {"--varlen"}), 2,
       "--varlen is for --kind forward and the backward kinds"},
      {gen("reduce", "fp16", "64", "1", "80", {"--varlen"}), 2,
       "--varlen is for --kind forward and the backward kinds"},
      {gen("forward", "fp8", "64", "1", "80", {}), 2, "fp8"},
      {gen("forward", "fp16", "64", "1", "70", {}), 2, "70"},
      {gen("forward", "fp16", "64", "3", "80", {}), 2, "heads"},
      {gen("forward", "fp16", "64", "1", "80", {"--window-left", "-5"}), 2, "window-left"},
      {gen("forward", "fp16", "64", "1", "80", {"--softcap", "1e"}), 2, "softcap"},
      {gen("forward", "fp16", "64", "1", "80", {"-o", path_of("no_such_dir/k.ptx")}), 1, "k.ptx"},
      {{"run", "--q", Q, "--k", K, "--v", V}, 2, "--out"},
      {run(path_of("missing.npy"), K, V), 2, "missing.npy"},
      {run(path_of("q3d.npy"), K, V), 2, "4-D"},
      {run(Q, path_of("k32.npy"), V), 2, "head_dim"},
      {run(Q, K, path_of("v5.npy")), 2, "seqlen_k"},
      {run(Q, path_of("k_b2.npy"), V), 2, "batch"},
      {run(path_of("q_h3.npy"), path_of("k_h2.npy"), path_of("v_h2.npy")), 2, "num_heads"},
      {run(Q, K, path_of("v_h2.npy")), 2, "num_heads_kv"},
      {run(path_of("q_d12.npy"), path_of("k_d12.npy"), path_of("v_d12.npy")), 2, "head_dim"},
      {run(path_of("q_empty.npy"), K, V), 2, "dimension"},
      {run(path_of("q_int.npy"), K, V), 2, "float"},
      {run(path_of("q_fortran.npy"), K, V), 2, "fortran"},
      {run(path_of("q_trunc.npy"), K, V), 2, "truncated"},
      {run(path_of("q_text.npy"), K, V), 2, "magic"},
      {run(path_of("q_be.npy"), K, V), 2, "big-endian"},
      {with(run(Q, K, V), {"--backend", "gpu"}), 2, "gpu"},
      {with(run(Q, K, V), {"--softcap", "abc"}), 2, "softcap"},
      {with(run(Q, K, V), {"--softcap", "-1"}), 2, "softcap"},
      {with(run(Q, K, V), {"--softmax-scale", "nan"}), 2, "scale"},
      {with(run(Q, K, V), {"--window-right", "x"}), 2, "window-right"},
      {with(run(Q, K, V), {"--lse-out", path_of("no_such_dir/l.npy")}), 2, "l.npy"},
      {with(run(Q, K, V), {"--ref", path_of("missing_ref.npy")}), 2, "missing_ref.npy"},
      {with(run(Q, K, V), {"--ref", K}), 2, "shape"},
      {with(dec, {}), 2, "--cache-seqlens"},
      {with(dec, {"--cache-seqlens", path_of("s_big.npy")}), 2, "outside"},
      {with(dec, {"--cache-seqlens", path_of("s_neg.npy")}), 2, "outside"},
      {with(dec, {"--cache-seqlens", path_of("s_2.npy")}), 2, "batch"},
      {with(dec, {"--cache-seqlens", path_of("s_f.npy")}), 2, "integer"},
      {with(dec, {"--cache-seqlens", path_of("s.npy"), "--num-splits", "-1"}), 2, "num-splits"},
      {with(run(Q, K, V), {"--dtype", "fp32"}), 2, "--dtype fp32 is for generate"},
      {with(dec, {"--cache-seqlens", path_of("s.npy"), "--dtype", "fp32"}), 2,
       "--dtype fp32 is for generate"},
      {{"cache"}, 2, "subcommand"},
      {{"cache", "purge"}, 2, "purge"},
      {{"cache", "stats", "--verbose"}, 2, "verbose"},
  };
  for (const auto &c : kCases) {
    const Result r = run_cli(c.args);
    expect(r.exited && !r.signaled, c.args, r, "did not exit normally");
    expect(r.code == c.code, c.args, r, "unexpected exit status");
    expect(contains(r.err, c.needle), c.args, r, "stderr does not name the problem");
    // Exactly one line on stderr, and no verdict on stdout.
    expect(!r.err.empty() && r.err.find('\n') == r.err.size() - 1, c.args, r,
           "stderr is not one line");
    expect(!contains(r.out, "PASS"), c.args, r, "PASS printed for bad arguments");
  }
  // The cuda backend without a GPU fails cleanly with the driver's message;
  // with one it runs.
  const auto cuda = with(run(Q, K, V), {"--backend", "cuda"});
  const Result r = run_cli(cuda);
  expect(r.exited && !r.signaled, cuda, r, "did not exit normally");
  expect(r.code == 0 || (r.code == 1 && contains(r.err, "fa_runtime_create")) ||
             contains(r.out, "FAIL"),
         cuda, r, "cuda backend: neither a run nor a clean failure");
}

void test_run_fp16_gqa(void **) {
  skip_without_cli();
  Case c;
  c.b = 2, c.sq = 37, c.sk = 53, c.hq = 4, c.hkv = 2, c.d = 64, c.dv = 32;
  run_case(c, false, 11);
}

void test_run_bf16_masks_f64_inputs(void **) {
  skip_without_cli();
  Case c;
  c.b = 1, c.sq = 29, c.sk = 45, c.hq = 2, c.hkv = 1, c.d = 32, c.dv = 32;
  c.bf16 = true, c.causal = true, c.wl = 9, c.softcap = 5.0, c.scale = 0.3;
  c.file_type = fa::npy::DType::F64;
  run_case(c, false, 12);
}

void test_run_window_f16_inputs(void **) {
  skip_without_cli();
  Case c;
  c.b = 2, c.sq = 16, c.sk = 16, c.hq = 3, c.hkv = 3, c.d = 128, c.dv = 128;
  c.wl = 4, c.wr = 2;
  c.file_type = fa::npy::DType::F16;
  run_case(c, false, 13);
}

void test_run_ref_file(void **) {
  skip_without_cli();
  Case c;
  c.b = 1, c.sq = 8, c.sk = 24, c.hq = 2, c.hkv = 1, c.d = 64, c.dv = 64;
  write_inputs(&c, 14);
  std::vector<float> ref(c.o_ref.begin(), c.o_ref.end());
  write_npy("o_ref.npy", fa::npy::from_f32({c.b, c.sq, c.hq, c.dv}, ref.data()));
  std::vector<std::string> args = emulator_run_args({"--ref", path_of("o_ref.npy")});
  Result r = run_cli(args);
  expect(r.code == 0 && contains(r.out, "\nPASS") && contains(r.out, "error --ref:"), args, r,
         "--ref with the right reference");
  // A reference off by 0.5 in one element makes the run FAIL with exit 1.
  ref[ref.size() / 2] += 0.5f;
  write_npy("o_ref.npy", fa::npy::from_f32({c.b, c.sq, c.hq, c.dv}, ref.data()));
  r = run_cli(args);
  expect(r.exited && r.code == 1 && contains(r.out, "\nFAIL"), args, r,
         "--ref with a wrong reference");
}

// --emulator-sm runs the emulator as that SM (its limits, the kernels the
// runtime picks for it); FLASHATTN_EMU_SM does the same when the option is
// absent, and an unknown SM is a clear error.
void test_emulator_sm(void **) {
  skip_without_cli();
  Case c;
  c.b = 1, c.sq = 8, c.sk = 24, c.hq = 2, c.hkv = 1, c.d = 64, c.dv = 64;
  write_inputs(&c, 15);
  std::vector<std::string> args = emulator_run_args({"--emulator-sm", "90"});
  Result r = run_cli(args);
  expect(r.code == 0 && contains(r.out, "(sm_90,") && contains(r.out, "\nPASS"), args, r,
         "--emulator-sm 90");
  args.back() = "75";
  r = run_cli(args);
  expect(r.exited && r.code == 2, args, r, "--emulator-sm 75 is a usage error");
  args.resize(args.size() - 2);
  setenv("FLASHATTN_EMU_SM", "86", 1);
  r = run_cli(args);
  expect(r.code == 0 && contains(r.out, "(sm_86,"), args, r, "FLASHATTN_EMU_SM=86");
  setenv("FLASHATTN_EMU_SM", "75", 1);
  r = run_cli(args);
  unsetenv("FLASHATTN_EMU_SM");
  expect(r.exited && r.code != 0 && contains(r.err, "FLASHATTN_EMU_SM=75"), args, r,
         "FLASHATTN_EMU_SM=75");
}

void test_decode_splits(void **) {
  skip_without_cli();
  Case c;
  c.b = 3, c.sq = 1, c.sk = 96, c.hq = 8, c.hkv = 2, c.d = 64, c.dv = 64;
  c.seqlens = {96, 41, 1};
  run_case(c, true, 21, 3);
  c.causal = true, c.sq = 2, c.bf16 = true;
  run_case(c, true, 22, 0);
}

void test_decode_empty_sequence(void **) {
  skip_without_cli();
  Case c;
  c.b = 2, c.sq = 1, c.sk = 32, c.hq = 2, c.hkv = 1, c.d = 32, c.dv = 32;
  c.seqlens = {0, 9};
  run_case(c, true, 23, 2);
  const fa::npy::Array o = read_npy("o.npy");
  const std::vector<float> ov = o.to_f32();
  for (size_t i = 0; i < ov.size() / 2; ++i) assert_true(ov[i] == 0.0f);  // batch 0: O = 0
}

// DeepSeek MLA's decode shape (head dims past 256, 0.5): Q/K 576 over one KV
// head, V/O 512, 16 query heads, bf16, two splits.
void test_decode_mla_head_dims(void **) {
  skip_without_cli();
  Case c;
  c.b = 2, c.sq = 1, c.sk = 200, c.hq = 16, c.hkv = 1, c.d = 576, c.dv = 512;
  c.bf16 = true;
  c.seqlens = {200, 77};
  run_case(c, true, 24, 2);
}

void test_cache_commands(void **) {
  skip_without_cli();
  const std::string dir = path_of("cache_cmd");
  const std::vector<std::string> at = {"--cache-dir", dir};
  auto cache = [&](const char *action) {
    std::vector<std::string> a = {"cache", action};
    a.insert(a.end(), at.begin(), at.end());
    return a;
  };
  Result r = run_cli(cache("clear"));
  expect(r.code == 0, cache("clear"), r, "clear on a fresh directory");
  r = run_cli(cache("stats"));
  expect(r.code == 0 && contains(r.out, "entries:     0") && contains(r.out, dir) &&
             contains(r.out, "persistent"),
         cache("stats"), r, "stats of an empty cache");

  // A run stores its kernel where FLASHATTN_CACHE_DIR points.
  setenv("FLASHATTN_CACHE_DIR", dir.c_str(), 1);
  Case c;
  c.b = 1, c.sq = 4, c.sk = 8, c.hq = 2, c.hkv = 2, c.d = 32, c.dv = 32;
  write_inputs(&c, 31);
  const std::vector<std::string> args = emulator_run_args();
  r = run_cli(args);
  expect(r.exited && contains(r.out, "misses 1"), args, r, "cold run: one miss");
  r = run_cli(args);
  expect(r.exited && contains(r.out, "disk hits 1") && contains(r.out, "misses 0"), args, r,
         "second process: a disk hit");
  setenv("FLASHATTN_CACHE_DIR", (g_dir + "/cache_default").c_str(), 1);

  r = run_cli(cache("stats"));
  expect(r.code == 0 && !contains(r.out, "entries:     0"), cache("stats"), r, "stats after run");
  r = run_cli(cache("list"));
  expect(r.code == 0 && contains(r.out, "forward") && contains(r.out, "sm_80") &&
             contains(r.out, "last used") && contains(r.out, "1 kernel\n"),
         cache("list"), r, "list after run");
  // The first token of each kernel line is the 32-hex-digit key.
  const std::string first = r.out.substr(0, r.out.find(' '));
  expect(first.size() == 32 && first.find_first_not_of("0123456789abcdef") == std::string::npos,
         cache("list"), r, "key is not 32 hex digits");
  r = run_cli(cache("clear"));
  expect(r.code == 0 && contains(r.out, "cleared 1 kernel"), cache("clear"), r, "clear");
  r = run_cli(cache("list"));
  expect(r.code == 0 && contains(r.out, "0 kernels"), cache("list"), r, "list after clear");

  // With the cache disabled, stats says memory only and why.
  setenv("FLASHATTN_CACHE_DISABLE", "1", 1);
  const std::vector<std::string> plain = {"cache", "stats"};
  r = run_cli(plain);
  unsetenv("FLASHATTN_CACHE_DISABLE");
  expect(r.code == 0 && contains(r.out, "memory only") && contains(r.out, "note:"), plain, r,
         "stats with FLASHATTN_CACHE_DISABLE=1");
}

// ---- hostile storage (docs/reliability.md, promise 4) ----------------------

// `cache stats` with no cache directory at all (HOME, XDG_CACHE_HOME and
// FLASHATTN_CACHE_DIR unset): exit 0, memory only, and the note says why.
void test_cache_stats_no_home(void **) {
  skip_without_cli();
  const char *names[] = {"HOME", "XDG_CACHE_HOME", "FLASHATTN_CACHE_DIR"};
  std::vector<std::pair<std::string, bool>> saved;
  for (const char *n : names) {
    const char *v = std::getenv(n);
    saved.emplace_back(v ? v : "", v != nullptr);
    unsetenv(n);
  }
  const std::vector<std::string> args = {"cache", "stats"};
  const Result r = run_cli(args);
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].second) setenv(names[i], saved[i].first.c_str(), 1);
  }
  expect(r.code == 0 && contains(r.out, "memory only") && contains(r.out, "no cache directory") &&
             contains(r.out, "path:        (none)"),
         args, r, "stats without HOME");
}

// Child status of test_cache_stats_full_disk when the set-up failed.
constexpr int kSetupFailed = 78;
using fa::test::kNoMount;

// `cache stats` on a full file system: a tmpfs, filled to ENOSPC, mounted in
// a forked child's private mount namespace (gone with the child). Exit 0,
// memory only, and the note says the disk is full. Skips where mounting is
// not permitted (not root, no CAP_SYS_ADMIN).
void test_cache_stats_full_disk(void **) {
  skip_without_cli();
  const std::string mnt = path_of("full_fs");
  mkdir(mnt.c_str(), 0755);
  const std::string out = path_of("full_stdout.txt"), err = path_of("full_stderr.txt");
  const std::vector<std::string> args = {"cache", "stats", "--cache-dir", mnt};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    std::string why;
    const int m = fa::test::mount_private_tmpfs(mnt, "256k", &why);
    if (m != 0) _exit(m == kNoMount ? kNoMount : kSetupFailed);
    if (!fa::test::fill_fs(mnt, 0)) _exit(kSetupFailed);
    const int status = spawn_cli(args, out, err);
    umount2(mnt.c_str(), MNT_DETACH);
    _exit(status < 0 || !WIFEXITED(status) ? kSetupFailed : WEXITSTATUS(status));
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == kNoMount) {
    std::printf("  SKIP: mounting a tmpfs is not permitted here (needs root or CAP_SYS_ADMIN)\n");
    skip();
  }
  assert_int_not_equal(WEXITSTATUS(status), kSetupFailed);
  Result r;
  r.exited = true;
  r.code = WEXITSTATUS(status);
  r.out = read_text(out);
  r.err = read_text(err);
  expect(r.code == 0 && contains(r.out, "memory only") &&
             contains(r.out, "database or disk is full") && contains(r.out, mnt),
         args, r, "stats on a full file system");
  rmdir(mnt.c_str());
}

// ---- inputs that are not regular files (issue 9, part 3) -------------------

// Like run_cli, but the child is killed after `timeout_s` seconds (a program
// blocked on a FIFO or reading an endless device must fail the test, not
// hang it) and, outside AddressSanitizer builds, its address space is capped
// at 2 GiB (a program reading without bound fails fast instead of taking the
// machine's memory; under ASan a 2 GiB RSS limit does the same).
struct BoundedResult {
  Result r;
  bool timed_out = false;
  double seconds = 0;
};

#if defined(__SANITIZE_ADDRESS__)
#define FA_CLI_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_CLI_TEST_ASAN 1
#endif
#endif

BoundedResult run_cli_bounded(const std::vector<std::string> &args, int timeout_s) {
  const std::string out_path = path_of("bounded_stdout.txt");
  const std::string err_path = path_of("bounded_stderr.txt");
  std::vector<std::string> all = {kCli};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (auto &a : all) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
#ifdef FA_CLI_TEST_ASAN
  const char *asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_options =
      std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "hard_rss_limit_mb=2048";
#endif
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
#ifdef FA_CLI_TEST_ASAN
    setenv("ASAN_OPTIONS", asan_options.c_str(), 1);
#else
    struct rlimit lim;
    lim.rlim_cur = lim.rlim_max = rlim_t(2) << 30;
    setrlimit(RLIMIT_AS, &lim);
#endif
    execv(kCli, argv.data());
    _exit(127);
  }
  BoundedResult b;
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    assert_true(w >= 0);
    if (w == pid) break;
    b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (b.seconds > timeout_s) {
      kill(pid, SIGKILL);
      assert_int_equal(waitpid(pid, &status, 0), pid);
      b.timed_out = true;
      break;
    }
    usleep(10 * 1000);
  }
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.r.exited = WIFEXITED(status);
  b.r.signaled = WIFSIGNALED(status);
  b.r.code = b.r.exited ? WEXITSTATUS(status) : -1;
  b.r.out = read_text(out_path);
  b.r.err = read_text(err_path);
  return b;
}

// Writes a small valid run problem (q, k, v) and returns the run arguments
// with `option` (--q, --k or --v) replaced by `path`.
std::vector<std::string> run_args_with(const std::string &option, const std::string &path) {
  Case c;
  c.sq = 8;
  c.sk = 8;
  c.hq = 2;
  c.hkv = 2;
  c.d = c.dv = 32;
  write_inputs(&c, 91);
  std::vector<std::string> args = {"run", "--backend", "emulator", "--out", path_of("o.npy")};
  for (const char *o : {"--q", "--k", "--v"}) {
    args.push_back(o);
    const std::string own = path_of(std::string(o + 2) + ".npy");
    args.push_back(option == o ? path : own);
  }
  return args;
}

// One input that is not a regular file: exit 2 within the time limit, one
// line naming the option, the path and the kind of file.
void expect_not_regular(const std::string &option, const std::string &path, const char *kind) {
  const std::vector<std::string> args = run_args_with(option, path);
  const BoundedResult b = run_cli_bounded(args, 20);
  expect(!b.timed_out, args, b.r, "did not finish within 20 s (blocked or reading without end)");
  expect(b.r.exited && b.r.code == 2, args, b.r, "exit status 2 expected");
  expect(contains(b.r.err, option + ": " + path + ": not a regular file (" + kind + ")"), args, b.r,
         "message naming the option, the path and the kind of file");
  expect(std::count(b.r.err.begin(), b.r.err.end(), '\n') == 1, args, b.r, "one line on stderr");
  expect(b.seconds < 10, args, b.r, "took too long to reject");
}

// /dev/zero used to be read until memory ran out; /dev/null, a character
// device too, is rejected the same way.
void test_input_char_device(void **) {
  skip_without_cli();
  expect_not_regular("--q", "/dev/zero", "a character device");
  expect_not_regular("--v", "/dev/null", "a character device");
}

// Opening a FIFO with no writer used to block forever.
void test_input_fifo(void **) {
  skip_without_cli();
  const std::string fifo = path_of("input.fifo");
  unlink(fifo.c_str());
  assert_int_equal(mkfifo(fifo.c_str(), 0600), 0);
  expect_not_regular("--k", fifo, "a FIFO");
  // --cache-seqlens of decode goes through the same reader.
  Case c;
  c.sq = 1;
  c.sk = 8;
  c.hq = 2;
  c.hkv = 2;
  c.d = c.dv = 32;
  c.seqlens = {8};
  write_inputs(&c, 92);
  const std::vector<std::string> args = {"decode",
                                         "--backend",
                                         "emulator",
                                         "--q",
                                         path_of("q.npy"),
                                         "--k-cache",
                                         path_of("k.npy"),
                                         "--v-cache",
                                         path_of("v.npy"),
                                         "--cache-seqlens",
                                         fifo,
                                         "--out",
                                         path_of("o.npy")};
  const BoundedResult b = run_cli_bounded(args, 20);
  expect(!b.timed_out && b.r.exited && b.r.code == 2 &&
             contains(b.r.err, "--cache-seqlens: " + fifo + ": not a regular file (a FIFO)"),
         args, b.r, "a FIFO as --cache-seqlens");
  unlink(fifo.c_str());
}

// A directory used to fail only with "read error".
void test_input_directory(void **) {
  skip_without_cli();
  expect_not_regular("--v", g_dir, "a directory");
  std::vector<std::string> args = run_args_with("--q", path_of("q.npy"));
  args.push_back("--ref");
  args.push_back(g_dir);
  const BoundedResult b = run_cli_bounded(args, 20);
  expect(b.r.exited && b.r.code == 2 &&
             contains(b.r.err, "--ref: " + g_dir + ": not a regular file (a directory)"),
         args, b.r, "a directory as --ref");
}

// A regular file far longer than its header announces (a 64 GiB sparse
// tail) is read only as far as the header says, and a symbolic link to a
// regular file is followed: the run passes, fast and in little memory.
void test_input_longer_than_header(void **) {
  skip_without_cli();
  std::vector<std::string> args = run_args_with("--q", path_of("q_long.npy"));
  const std::string q = path_of("q.npy"), q_long = path_of("q_long.npy");
  const std::string bytes = read_text(q);
  {
    std::ofstream f(q_long, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
  }
  if (truncate(q_long.c_str(), off_t(64) << 30) != 0) {
    std::printf("  SKIP: cannot make a 64 GiB sparse file here: %s\n", std::strerror(errno));
    unlink(q_long.c_str());
    skip();
  }
  const std::string k_link = path_of("k_link.npy");
  unlink(k_link.c_str());
  assert_int_equal(symlink(path_of("k.npy").c_str(), k_link.c_str()), 0);
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--k") args[i + 1] = k_link;
  }
  const BoundedResult b = run_cli_bounded(args, 60);
  unlink(q_long.c_str());
  unlink(k_link.c_str());
  expect(!b.timed_out, args, b.r, "did not finish within 60 s");
  expect(b.r.exited && b.r.code == 0 && contains(b.r.out, "PASS"), args, b.r,
         "a long regular file and a symlink are valid inputs");
}

// Empties the children's cache first, so no kernel stored by an older build
// of a generator is reused.
int clear_cache(void **) {
  if (kCli[0] == 0) return 0;
  const Result r = run_cli({"cache", "clear"});
  return r.code == 0 ? 0 : -1;
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_generate),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_run_fp16_gqa),
      cmocka_unit_test(test_run_bf16_masks_f64_inputs),
      cmocka_unit_test(test_run_window_f16_inputs),
      cmocka_unit_test(test_run_ref_file),
      cmocka_unit_test(test_decode_splits),
      cmocka_unit_test(test_decode_empty_sequence),
      cmocka_unit_test(test_decode_mla_head_dims),
      cmocka_unit_test(test_cache_commands),
      cmocka_unit_test(test_cache_stats_no_home),
      cmocka_unit_test(test_cache_stats_full_disk),
      cmocka_unit_test(test_input_char_device),
      cmocka_unit_test(test_input_fifo),
      cmocka_unit_test(test_input_directory),
      cmocka_unit_test(test_input_longer_than_header),
      cmocka_unit_test(test_emulator_sm),
  };
  return run_cli_suite("test_cli", tests, clear_cache, "cache_default");
}
