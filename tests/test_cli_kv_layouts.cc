// The KV cache layouts of the `flashattn` program (FA_CLI_PATH), run as a
// child process on the emulator: `decode` and `run` with --kv-layout
// paged (--page-size 1, 5, 16, 64; shuffled pages, NaN where no key is) and
// ptrs, --batch-invariant and --seqused-k, each checked against an fp64
// reference computed here and bit for bit against the contiguous run;
// `generate` with a layout gives that layout's kernel; bad combinations are
// usage errors. Output files are removed before every run, so a stale file
// never passes for a written one.

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"

// Last: it includes cmocka.
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string> &more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// ---- a problem, its files and its reference --------------------------------

struct Case {
  int b = 1, sq = 1, sk = 1, hq = 1, hkv = 1, d = 64;
  bool causal = false, bf16 = false;
  std::vector<int32_t> lens;  // decode: cache_seqlens; run: seqused_k (empty = none)
  std::vector<double> o_ref, lse_ref;
};

// Writes q/k/v (float32) and lens.npy, and computes the fp64 reference on the
// inputs rounded as the program rounds them.
void write_case(Case *c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (auto &x : v) x = nd(rng);
    return v;
  };
  const std::vector<float> q = randn(size_t(c->b) * c->sq * c->hq * c->d);
  const std::vector<float> k = randn(size_t(c->b) * c->sk * c->hkv * c->d);
  const std::vector<float> v = randn(size_t(c->b) * c->sk * c->hkv * c->d);
  write_npy("q.npy", fa::npy::from_f32({c->b, c->sq, c->hq, c->d}, q.data()));
  write_npy("k.npy", fa::npy::from_f32({c->b, c->sk, c->hkv, c->d}, k.data()));
  write_npy("v.npy", fa::npy::from_f32({c->b, c->sk, c->hkv, c->d}, v.data()));
  if (!c->lens.empty()) write_npy("lens.npy", fa::npy::from_i32({c->b}, c->lens.data()));
  auto rounded = [&](const std::vector<float> &x) {
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = fa::ref::round_to(x[i], c->bf16);
    return out;
  };
  fa::ref::Problem p;
  p.batch = c->b;
  p.seqlen_q = c->sq;
  p.seqlen_k = c->sk;
  p.num_heads_q = c->hq;
  p.num_heads_kv = c->hkv;
  p.head_dim = p.head_dim_v = c->d;
  p.causal = c->causal;
  c->o_ref.assign(size_t(c->b) * c->sq * c->hq * c->d, 0);
  c->lse_ref.assign(size_t(c->b) * c->hq * c->sq, 0);
  fa::ref::attention(p, rounded(q).data(), rounded(k).data(), rounded(v).data(), c->o_ref.data(),
                     c->lse_ref.data(), c->lens.empty() ? nullptr : c->lens.data());
}

std::vector<std::string> decode_args(const Case &c) {
  std::vector<std::string> a =
      emulator_decode_args({"--dtype", c.bf16 ? "bf16" : "fp16", "--lse-out", path_of("lse.npy")});
  if (c.causal) a.push_back("--causal");
  return a;
}

std::vector<std::string> run_args(const Case &c) {
  std::vector<std::string> a =
      emulator_run_args({"--dtype", c.bf16 ? "bf16" : "fp16", "--lse-out", path_of("lse.npy")});
  if (c.causal) a.push_back("--causal");
  if (!c.lens.empty()) a.insert(a.end(), {"--seqused-k", path_of("lens.npy")});
  return a;
}

// Runs args (which write o.npy and lse.npy) after removing both files;
// expects PASS and files that meet the documented tolerance against the
// case's reference. Returns the O and LSE file bytes.
std::pair<std::string, std::string> run_and_check(const Case &c,
                                                  const std::vector<std::string> &args) {
  std::remove(path_of("o.npy").c_str());
  std::remove(path_of("lse.npy").c_str());
  const Result r = run_cli(args);
  expect(r.exited && r.code == 0, args, r, "exit status is not 0");
  expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
  const fa::npy::Array o = read_npy("o.npy");
  assert_true((o.shape == std::vector<int64_t>{c.b, c.sq, c.hq, c.d}));
  const std::vector<float> ov = o.to_f32();
  const fa::ref::ErrorStats e = fa::ref::compare(ov.data(), c.o_ref.data(), ov.size());
  const double atol = c.bf16 ? 2e-2 : 1e-2;
  if (e.nonfinite || e.max_abs > atol * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2) {
    std::fprintf(stderr, "O.npy: max_abs %g, rel_l2 %g, non-finite %lld\n", e.max_abs, e.rel_l2,
                 e.nonfinite);
    expect(false, args, r, "O outside tolerance");
  }
  const std::vector<float> lv = read_npy("lse.npy").to_f32();
  assert_int_equal(lv.size(), c.lse_ref.size());
  for (size_t i = 0; i < lv.size(); ++i) {
    const double ref = c.lse_ref[i];
    const bool ok = std::isinf(ref)
                        ? (std::isinf(lv[i]) && lv[i] < 0)
                        : std::fabs(lv[i] - ref) <= 2e-3 * std::max(1.0, std::fabs(ref));
    if (!ok) {
      std::fprintf(stderr, "LSE.npy[%zu] = %g, reference %g\n", i, double(lv[i]), ref);
      expect(false, args, r, "LSE outside tolerance");
    }
  }
  return {read_text(path_of("o.npy")), read_text(path_of("lse.npy"))};
}

// ---- tests -------------------------------------------------------------------

void test_help(void **) {
  skip_without_cli();
  const struct {
    std::vector<std::string> args;
    std::vector<const char *> mentions;
  } kCases[] = {
      {{"decode", "--help"}, {"--kv-layout", "--page-size", "--seed", "--batch-invariant", "ptrs"}},
      {{"run", "--help"}, {"--kv-layout", "--page-size", "--seed", "--seqused-k", "paged"}},
      {{"generate", "--help"}, {"--kv-layout", "--page-size", "--seqused-k"}},
  };
  for (const auto &c : kCases) {
    const Result r = run_cli(c.args);
    expect(r.exited && r.code == 0, c.args, r, "--help did not exit 0");
    for (const char *m : c.mentions) expect(contains(r.out, m), c.args, r, m);
  }
}

// Each layout option selects its kernel; without one (or with contiguous)
// the PTX is fa_generate's, byte for byte.
void test_generate_layouts(void **) {
  skip_without_cli();
  const std::vector<std::string> base = {
      "generate",  "--kind", "decode",     "--dtype", "bf16", "--head-dim", "128",
      "--heads-q", "32",     "--heads-kv", "8",       "--sm", "90"};
  const Result plain = run_cli(base);
  expect(plain.code == 0 && contains(plain.out, ".entry"), base, plain, "plain generate");
  const Result flat = run_cli(with(base, {"--kv-layout", "contiguous"}));
  expect(flat.code == 0 && flat.out == plain.out, base, flat,
         "--kv-layout contiguous differs from the default");
  const struct {
    std::vector<std::string> more;
    const char *entry_suffix;
  } kLayouts[] = {
      {{"--kv-layout", "paged", "--page-size", "16"}, "_paged_tiles("},
      {{"--page-size", "32"}, "_paged_tiles("},
      {{"--page-size", "1"}, "_paged_rows_pow2("},
      {{"--page-size", "8"}, "_paged_rows_pow2("},
      {{"--page-size", "24"}, "_paged_rows("},
      {{"--page-size", "40"}, "_paged_rows("},
      {{"--kv-layout", "ptrs"}, "_ptrs("},
  };
  std::vector<std::string> seen;
  for (const auto &l : kLayouts) {
    const auto args = with(base, l.more);
    const Result r = run_cli(args);
    expect(r.code == 0 && contains(r.out, ".target sm_90"), args, r, "exit status / target");
    expect(contains(r.out, l.entry_suffix), args, r, l.entry_suffix);
    expect(r.out != plain.out, args, r, "same PTX as the contiguous kernel");
    // Deterministic, and -o writes the same bytes.
    const auto to_file = with(args, {"-o", path_of("k.ptx")});
    const Result f = run_cli(to_file);
    expect(f.code == 0 && read_text(path_of("k.ptx")) == r.out, to_file, f, "-o file differs");
    seen.push_back(r.out);
  }
  // Per tile, per row by shift and mask (powers of two), per row by div / rem.
  expect(seen[0] == seen[1] && seen[2] == seen[3] && seen[4] == seen[5] && seen[0] != seen[2] &&
             seen[2] != seen[4] && seen[0] != seen[4] && seen[0] != seen[6],
         base, plain, "page sizes of one lookup kind should share a kernel, the kinds differ");
  // Forward: per-tile lookups at multiples of its key tile, and seqused_k.
  const std::vector<std::string> fwd = {
      "generate",  "--kind", "forward",    "--dtype", "fp16", "--head-dim", "128",
      "--heads-q", "8",      "--heads-kv", "2",       "--sm", "80"};
  const Result tiles = run_cli(with(fwd, {"--page-size", "128", "--seqused-k"}));
  expect(tiles.code == 0 && contains(tiles.out, "_paged_tiles_seqused("), fwd, tiles,
         "forward paged tiles with seqused_k");
  const Result rows = run_cli(with(fwd, {"--page-size", "3"}));
  expect(rows.code == 0 && contains(rows.out, "_paged_rows("), fwd, rows, "forward paged rows");
}

void test_bad_kv_arguments(void **) {
  skip_without_cli();
  Case c;
  c.b = 2, c.sk = 8, c.hq = 2, c.hkv = 1, c.d = 32;
  c.lens = {8, 3};
  write_case(&c, 5);
  const int32_t big[2] = {9, 1}, one[1] = {1};
  write_npy("lens_big.npy", fa::npy::from_i32({2}, big));
  write_npy("lens_1.npy", fa::npy::from_i32({1}, one));
  const float lf[2] = {1, 2};
  write_npy("lens_f.npy", fa::npy::from_f32({2}, lf));
  const auto dec = decode_args(c);
  Case rc = c;
  rc.lens.clear();
  const auto run = run_args(rc);
  const std::vector<std::string> gen = {
      "generate",  "--kind", "decode",     "--dtype", "fp16", "--head-dim", "64",
      "--heads-q", "4",      "--heads-kv", "1",       "--sm", "80"};
  const struct {
    std::vector<std::string> args;
    const char *needle;
  } kCases[] = {
      {with(dec, {"--kv-layout", "paged"}), "--page-size"},
      {with(dec, {"--kv-layout", "ptrs", "--page-size", "16"}), "--page-size"},
      {with(dec, {"--kv-layout", "contiguous", "--page-size", "4"}), "--page-size"},
      {with(dec, {"--kv-layout", "blocks"}), "blocks"},
      {with(dec, {"--page-size", "-1"}), "page-size"},
      {with(dec, {"--page-size", "x"}), "page-size"},
      // Pages past the power of two at or above seqlen_k_max (8) only add NaN
      // rows: refused, not a pool sized from the option (300000 was 886 MiB).
      {with(dec, {"--page-size", "16"}), "--page-size 16 is larger than the cache needs"},
      {with(dec, {"--page-size", "300000"}), "at most 8"},
      {with(run, {"--page-size", "3000000"}), "--page-size"},
      {with(dec, {"--kv-layout", "paged", "--page-size", "99999999999"}), "--page-size"},
      // --kv-scale means nothing without an fp8 cache (decode) or forward (run).
      {with(dec, {"--kv-scale", "tensor"}), "--kv-dtype"},
      {with(run, {"--kv-scale", "head"}), "--q-dtype"},
      {with(dec, {"--seed", "-3"}), "seed"},
      {with(dec, {"--batch-invariant", "--num-splits", "2"}), "--num-splits"},
      {with(run, {"--kv-layout", "paged"}), "--page-size"},
      {with(run, {"--seqused-k", path_of("lens_big.npy")}), "outside"},
      {with(run, {"--seqused-k", path_of("lens_1.npy")}), "batch"},
      {with(run, {"--seqused-k", path_of("lens_f.npy")}), "integer"},
      {with(run, {"--seqused-k", path_of("missing.npy")}), "missing.npy"},
      {with(run, {"--batch-invariant"}), "batch-invariant"},
      {with(gen, {"--kv-layout", "paged"}), "--page-size"},
      {with(gen, {"--seqused-k"}), "--seqused-k"},
      {{"generate", "--kind", "reduce", "--dtype", "fp16", "--head-dim", "64", "--heads-q", "4",
        "--heads-kv", "1", "--sm", "80", "--page-size", "16"},
       "reduce"},
  };
  for (const auto &k : kCases) {
    std::remove(path_of("o.npy").c_str());
    const Result r = run_cli(k.args);
    expect(r.exited && r.code == 2, k.args, r, "exit status 2 expected");
    expect(contains(r.err, k.needle), k.args, r, "stderr does not name the problem");
    expect(!r.err.empty() && r.err.find('\n') == r.err.size() - 1, k.args, r,
           "stderr is not one line");
    expect(!contains(r.out, "PASS"), k.args, r, "PASS printed for bad arguments");
    struct stat st;
    expect(stat(path_of("o.npy").c_str(), &st) != 0, k.args, r, "--out written on a usage error");
  }
}

// Decode through every layout: each PASSes against the reference computed
// here, says which layout it ran, and writes exactly the contiguous run's
// bits (the program's own "vs contiguous" line says so too).
void test_decode_layouts(void **) {
  skip_without_cli();
  Case c;
  c.b = 4, c.sq = 2, c.sk = 70, c.hq = 8, c.hkv = 2, c.d = 64, c.causal = true;
  c.lens = {70, 0, 33, 17};  // full, empty, ending inside a page of 16 and of 5
  write_case(&c, 41);
  const auto base = decode_args(c);
  const auto flat = run_and_check(c, base);
  const struct {
    std::vector<std::string> more;
    const char *problem, *kv;
  } kLayouts[] = {
      {{"--page-size", "16"}, "kv paged (page_size 16)", "pool [22, 16, 2, 64]"},
      {{"--kv-layout", "paged", "--page-size", "5", "--seed", "9"},
       "kv paged (page_size 5)",
       "pool [58, 5, 2, 64]"},
      {{"--page-size", "1"}, "kv paged (page_size 1)", "pool [282, 1, 2, 64], 120 pages hold keys"},
      {{"--page-size", "128"}, "kv paged (page_size 128)", "pool [6, 128, 2, 64], 3 pages"},
      {{"--kv-layout", "ptrs"}, "kv ptrs", "rows [70, 0, 33, 17]"},
  };
  for (const auto &l : kLayouts) {
    const auto args = with(base, l.more);
    const auto files = run_and_check(c, args);
    const Result r = run_cli(args);  // (the same run again, for its text)
    expect(contains(r.out, l.problem), args, r, l.problem);
    expect(contains(r.out, l.kv), args, r, l.kv);
    expect(contains(r.out, "vs contiguous: O and LSE bit-identical"), args, r,
           "not bit-identical to the contiguous cache");
    expect(files == flat, args, r, "o.npy / lse.npy differ from the contiguous run's");
  }
  // Two seeds lay the pages out differently, same result.
  const Result s1 = run_cli(with(base, {"--page-size", "16", "--seed", "1"}));
  const Result s2 = run_cli(with(base, {"--page-size", "16", "--seed", "2"}));
  expect(s1.code == 0 && s2.code == 0, base, s2, "seeds");
  expect(contains(s1.out, "(seed 1)") && contains(s2.out, "(seed 2)"), base, s2, "seed in report");
}

// --batch-invariant: a 3000-key sequence gets two 2048-key splits whatever
// the batch, so its output bits are the same decoded alone and in a batch of
// three; without the flag the automatic split count follows the batch.
void test_decode_batch_invariant(void **) {
  skip_without_cli();
  Case c;
  c.b = 3, c.sq = 1, c.sk = 3000, c.hq = 2, c.hkv = 1, c.d = 32;
  c.lens = {3000, 2500, 40};
  write_case(&c, 77);
  const auto batch = with(decode_args(c), {"--batch-invariant", "--page-size", "64"});
  run_and_check(c, batch);
  const Result rb = run_cli(batch);
  expect(contains(rb.out, "splits:      2 (batch-invariant, 2048 keys each)") &&
             contains(rb.out, "batch-invariant\n"),
         batch, rb, "batch-invariant splits / problem line");
  const std::vector<float> o3 = read_npy("o.npy").to_f32();
  const std::vector<float> l3 = read_npy("lse.npy").to_f32();
  // Sequence 0 alone.
  const fa::npy::Array q = read_npy("q.npy"), k = read_npy("k.npy"), v = read_npy("v.npy");
  const std::vector<float> qv = q.to_f32(), kv = k.to_f32(), vv = v.to_f32();
  write_npy("q1.npy", fa::npy::from_f32({1, c.sq, c.hq, c.d}, qv.data()));
  write_npy("k1.npy", fa::npy::from_f32({1, c.sk, c.hkv, c.d}, kv.data()));
  write_npy("v1.npy", fa::npy::from_f32({1, c.sk, c.hkv, c.d}, vv.data()));
  write_npy("lens1.npy", fa::npy::from_i32({1}, c.lens.data()));
  std::vector<std::string> alone = {"decode",
                                    "--q",
                                    path_of("q1.npy"),
                                    "--k-cache",
                                    path_of("k1.npy"),
                                    "--v-cache",
                                    path_of("v1.npy"),
                                    "--cache-seqlens",
                                    path_of("lens1.npy"),
                                    "--backend",
                                    "emulator",
                                    "--out",
                                    path_of("o1.npy"),
                                    "--lse-out",
                                    path_of("lse1.npy"),
                                    "--batch-invariant",
                                    "--kv-layout",
                                    "ptrs"};
  std::remove(path_of("o1.npy").c_str());
  std::remove(path_of("lse1.npy").c_str());
  const Result r1 = run_cli(alone);
  expect(r1.code == 0 && contains(r1.out, "\nPASS") &&
             contains(r1.out, "splits:      2 (batch-invariant"),
         alone, r1, "alone: PASS with 2 splits");
  const std::vector<float> o1 = read_npy("o1.npy").to_f32();
  const std::vector<float> l1 = read_npy("lse1.npy").to_f32();
  assert_true(std::equal(o1.begin(), o1.end(), o3.begin()));
  assert_true(std::equal(l1.begin(), l1.end(), l3.begin()));
}

// Chunked prefill: `run` reads a paged or pointer-array cache with
// per-sequence key counts; the queries are the last seqlen_q keys.
void test_run_chunked_prefill(void **) {
  skip_without_cli();
  Case c;
  c.b = 3, c.sq = 9, c.sk = 80, c.hq = 4, c.hkv = 2, c.d = 64, c.causal = true, c.bf16 = true;
  c.lens = {80, 12, 45};
  write_case(&c, 63);
  const auto base = run_args(c);
  const auto flat = run_and_check(c, base);
  for (const std::vector<std::string> &more : {std::vector<std::string>{"--page-size", "64"},
                                               {"--page-size", "16", "--seed", "4"},
                                               {"--page-size", "7"},
                                               {"--kv-layout", "ptrs"}}) {
    const auto args = with(base, more);
    const auto files = run_and_check(c, args);
    const Result r = run_cli(args);
    expect(contains(r.out, "keys per sequence from --seqused-k") &&
               contains(r.out, "vs contiguous: O and LSE bit-identical"),
           args, r, "report lines");
    expect(files == flat, args, r, "o.npy / lse.npy differ from the contiguous run's");
  }
  // Without --seqused-k every sequence has seqlen_k keys.
  Case full = c;
  full.lens.clear();
  write_case(&full, 64);
  run_and_check(full, with(run_args(full), {"--page-size", "32"}));
}

// The SmolLM2 fixture's real KV cache, paged: same bits as the contiguous
// cache and within tolerance of the model's own attention output (--ref).
void test_fixture_paged_decode(void **) {
  skip_without_cli();
  const std::string s = std::string(FA_TEST_DATA_DIR) + "/smollm2_135m";
  std::vector<std::string> args = {"decode",
                                   "--q",
                                   s + "/q_decode.npy",
                                   "--k-cache",
                                   s + "/k_cache.npy",
                                   "--v-cache",
                                   s + "/v_cache.npy",
                                   "--cache-seqlens",
                                   s + "/cache_seqlens.npy",
                                   "--causal",
                                   "--softmax-scale",
                                   "0.125",
                                   "--backend",
                                   "emulator",
                                   "--out",
                                   path_of("o.npy"),
                                   "--ref",
                                   s + "/out_decode.npy",
                                   "--page-size",
                                   "16"};
  std::remove(path_of("o.npy").c_str());
  const Result r = run_cli(args);
  expect(r.code == 0 && contains(r.out, "\nPASS") && contains(r.out, "error --ref:") &&
             contains(r.out, "kv paged (page_size 16)") &&
             contains(r.out, "vs contiguous: O and LSE bit-identical"),
         args, r, "paged decode of the fixture");
  const std::vector<float> o = read_npy("o.npy").to_f32();
  fa::npy::Array ref;
  std::string err;
  assert_true(fa::npy::read(s + "/out_decode.npy", &ref, &err));
  const std::vector<double> rv = ref.to_f64();
  const fa::ref::ErrorStats e = fa::ref::compare(o.data(), rv.data(), o.size());
  assert_int_equal(e.nonfinite, 0);
  assert_true(e.max_abs <= 1e-2 * std::max(1.0, e.max_ref));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_generate_layouts),
      cmocka_unit_test(test_bad_kv_arguments),
      cmocka_unit_test(test_decode_layouts),
      cmocka_unit_test(test_decode_batch_invariant),
      cmocka_unit_test(test_run_chunked_prefill),
      cmocka_unit_test(test_fixture_paged_decode),
  };
  return run_cli_suite("test_cli_kv_layouts", tests);
}
