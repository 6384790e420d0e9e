// Running the `flashattn` program (FA_CLI_PATH) as a child process in a
// test's scratch directory: spawn with stdout/stderr captured in files, the
// exit status, assertions that print the whole command on failure, and .npy
// files in the scratch directory. Include it last (it includes cmocka).
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "npy.h"
#include "reference.h"

// cmocka last: its fail() macro clashes with std::basic_ios::fail.
#include "support/cmocka.hh"

extern char **environ;

namespace fa::test::cli {

inline const char *const kCli = FA_CLI_PATH;

// The test's scratch directory (set once by its main).
inline std::string g_dir;

inline std::string path_of(const std::string &name) { return g_dir + "/" + name; }

inline std::string read_text(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Result {
  bool exited = false, signaled = false;
  int code = -1;
  std::string out, err;
};

// Runs the program with `args`, stdout and stderr into out_path and
// err_path, without CMocka (safe in a forked child): the waitpid status, or
// -1 when it could not be started or waited for.
inline int spawn_cli(const std::vector<std::string> &args, const std::string &out_path,
                     const std::string &err_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> all = {kCli};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (auto &a : all) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, kCli, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  if (rc != 0 || waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

// Runs the program with `args`, stdout and stderr captured in files.
inline Result run_cli(const std::vector<std::string> &args) {
  const std::string out_path = path_of("stdout.txt"), err_path = path_of("stderr.txt");
  const int status = spawn_cli(args, out_path, err_path);
  assert_int_not_equal(status, -1);
  Result r;
  r.exited = WIFEXITED(status);
  r.signaled = WIFSIGNALED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

inline std::string join(const std::vector<std::string> &args) {
  std::string s;
  for (const auto &a : args) s += " " + a;
  return s;
}

inline bool contains(const std::string &hay, const std::string &needle) {
  return hay.find(needle) != std::string::npos;
}

// Fails the test with the command, its exit status and its output unless cond.
inline void expect(bool cond, const std::vector<std::string> &args, const Result &r,
                   const char *what) {
  if (cond) return;
  std::fprintf(stderr, "flashattn%s: %s\n  exit %d (signaled %d)\n  stdout: %s\n  stderr: %s\n",
               join(args).c_str(), what, r.code, r.signaled, r.out.c_str(), r.err.c_str());
  fail();
}

inline void skip_without_cli() {
  if (kCli[0] == 0) skip();
}

inline void write_npy(const std::string &name, const fa::npy::Array &a) {
  std::string err;
  if (!fa::npy::write(path_of(name), a, &err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    fail();
  }
}

inline fa::npy::Array read_npy(const std::string &name) {
  fa::npy::Array a;
  std::string err;
  if (!fa::npy::read(path_of(name), &a, &err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    fail();
  }
  return a;
}

// Random N(0, 1) inputs of one attention problem (seeded), written as
// q.npy [b, sq, hq, d], k.npy and v.npy [b, sk, hkv, d] (fp32) and, when
// lens is given, lens.npy (int32 [b]); returned rounded to fp16, as the
// program's fp16 run and the fp64 reference (fa::ref) read them.
struct QkvInputs {
  std::vector<double> q, k, v;
};
inline QkvInputs write_qkv(uint32_t seed, int b, int sq, int sk, int hq, int hkv, int d,
                           const std::vector<int32_t> *lens) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  QkvInputs in;
  auto one = [&](const char *name, int64_t s, int64_t h, std::vector<double> *out) {
    std::vector<float> x(size_t(b) * s * h * d);
    for (float &e : x) e = nd(rng);
    write_npy(name, fa::npy::from_f32({b, s, h, d}, x.data()));
    out->resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) (*out)[i] = fa::ref::round_to(x[i], false);
  };
  one("q.npy", sq, hq, &in.q);
  one("k.npy", sk, hkv, &in.k);
  one("v.npy", sk, hkv, &in.v);
  if (lens) write_npy("lens.npy", fa::npy::from_i32({b}, lens->data()));
  return in;
}

// The values of a float array x [b, s, h, d] as the program quantises it to
// fp8 (--q-dtype, --kv-dtype): descale = float(amax / fp8 max) over the
// valid rows (the first valid[b] of sequence b; all without valid) of each
// (sequence, head / group) group (per_head, --kv-scale head) or of the whole
// array (--kv-scale tensor), 1 where they are all 0; each value the fp8
// byte of x / descale times descale. Rows past valid are 0. *descales: the
// descales, [b][h / group] or [1].
inline std::vector<double> cli_fp8_values(const std::vector<float> &x, int b, int s, int h, int d,
                                          int group, bool e5m2, bool per_head,
                                          const std::vector<int32_t> *valid,
                                          std::vector<double> *descales = nullptr) {
  auto slot = [&](int ib, int ih) { return per_head ? size_t(ib) * (h / group) + ih / group : 0; };
  auto rows = [&](int ib) { return valid ? (*valid)[ib] : s; };
  std::vector<double> amax(per_head ? size_t(b) * (h / group) : 1, 0.0), ds(amax.size());
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < rows(ib); ++is)
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id) {
          double &m = amax[slot(ib, ih)];
          m = std::max(m, std::fabs(double(x[((size_t(ib) * s + is) * h + ih) * d + id])));
        }
  for (size_t i = 0; i < ds.size(); ++i)
    ds[i] = double(float(amax[i] > 0 ? amax[i] / fa::ref::fp8_max(e5m2) : 1.0));
  if (descales) *descales = ds;
  std::vector<double> out(x.size(), 0.0);
  for (int ib = 0; ib < b; ++ib)
    for (int is = 0; is < rows(ib); ++is)
      for (int ih = 0; ih < h; ++ih)
        for (int id = 0; id < d; ++id) {
          const size_t i = ((size_t(ib) * s + is) * h + ih) * d + id;
          const double sc = ds[slot(ib, ih)];
          out[i] = fa::ref::fp8_to_double(fa::ref::fp8_from_double(x[i] / sc, e5m2), e5m2) * sc;
        }
  return out;
}

// `run` on the emulator with the scratch directory's q/k/v.npy, O to o.npy,
// then `extra`.
inline std::vector<std::string> emulator_run_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"run",
                                "--q",
                                path_of("q.npy"),
                                "--k",
                                path_of("k.npy"),
                                "--v",
                                path_of("v.npy"),
                                "--backend",
                                "emulator",
                                "--out",
                                path_of("o.npy")};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// `decode` on the emulator with the scratch directory's q/k/v.npy as the
// query and the K/V cache and lens.npy as cache_seqlens, O to o.npy, then
// `extra`.
inline std::vector<std::string> emulator_decode_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"decode",
                                "--q",
                                path_of("q.npy"),
                                "--k-cache",
                                path_of("k.npy"),
                                "--v-cache",
                                path_of("v.npy"),
                                "--cache-seqlens",
                                path_of("lens.npy"),
                                "--backend",
                                "emulator",
                                "--out",
                                path_of("o.npy")};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// `run`, or `decode` over a paged cache (16-key pages) in 3 splits, as the
// two builders above, then `extra`.
inline std::vector<std::string> emulator_args(bool decode, std::vector<std::string> extra) {
  if (!decode) return emulator_run_args(std::move(extra));
  std::vector<std::string> paged = {"--num-splits", "3", "--kv-layout", "paged", "--page-size", "16"};
  paged.insert(paged.end(), extra.begin(), extra.end());
  return emulator_decode_args(std::move(paged));
}

// A CLI test's main: its scratch directory FA_TEST_BINARY_DIR/<name>_work
// (g_dir), the children's kernel cache in g_dir/<cache> (away from the
// user's), then the tests with the group setup.
template <size_t N>
int run_cli_suite(const char *name, const CMUnitTest (&tests)[N], CMFixtureFunction setup = nullptr,
                  const char *cache = "cache") {
  g_dir = std::string(FA_TEST_BINARY_DIR) + "/" + name + "_work";
  mkdir(g_dir.c_str(), 0755);
  setenv("FLASHATTN_CACHE_DIR", (g_dir + "/" + cache).c_str(), 1);
  return _cmocka_run_group_tests(name, tests, N, setup, nullptr);
}

}  // namespace fa::test::cli
