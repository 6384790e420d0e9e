// The runtime's two cache levels end to end: a repeated launch is served by
// the in-process map, a second process finds the kernel on disk (no
// generation), a corrupt database file or an unusable directory never fails
// a launch, and FLASHATTN_CACHE_DISABLE keeps everything in memory.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "reference.h"
#include "support/cmocka.hh"

namespace {

std::string make_dir(const char *tag) {
  std::string tmpl = std::string(FA_TEST_BINARY_DIR) + "/rtcache_" + tag + "_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) return "";
  return buf.data();
}

fa_runtime *open_rt(const std::string &dir) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.cache_dir = dir.empty() ? nullptr : dir.c_str();
  fa_runtime *rt = nullptr;
  if (fa_runtime_create(&o, &rt) != FA_SUCCESS) {
    std::fprintf(stderr, "fa_runtime_create: %s\n", fa_last_error());
    return nullptr;
  }
  return rt;
}

// Runs one small causal forward pass and checks its output against the fp64
// reference. Returns true when the launch succeeded and the result is right.
bool launch_and_check(fa_runtime *rt) {
  const int sq = 9, sk = 13, h = 2, d = 32;
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = d;
  desc.num_heads_q = desc.num_heads_kv = h;
  desc.causal = 1;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS) return false;
  std::vector<uint16_t> q(size_t(sq) * h * d), k(size_t(sk) * h * d), v(k.size());
  std::vector<double> qd(q.size()), kd(k.size()), vd(v.size());
  uint32_t x = 12345;
  auto fill = [&](std::vector<uint16_t> &dst, std::vector<double> &dd) {
    for (size_t i = 0; i < dst.size(); ++i) {
      x = x * 1103515245u + 12345u;
      const float f = float((x >> 8) & 0xffff) / 32768.0f - 1.0f;
      dst[i] = fa::ref::f32_to_f16(f);
      dd[i] = fa::ref::f16_to_f32(dst[i]);
    }
  };
  fill(q, qd);
  fill(k, kd);
  fill(v, vd);
  uint64_t dq = 0, dk = 0, dv = 0, dout = 0;
  fa_malloc(rt, q.size() * 2, &dq);
  fa_malloc(rt, k.size() * 2, &dk);
  fa_malloc(rt, v.size() * 2, &dv);
  fa_malloc(rt, q.size() * 2, &dout);
  fa_memcpy_htod(rt, dq, q.data(), q.size() * 2);
  fa_memcpy_htod(rt, dk, k.data(), k.size() * 2);
  fa_memcpy_htod(rt, dv, v.data(), v.size() * 2);
  fa_memset(rt, dout, 0xFF, q.size() * 2);
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = sq;
  a.seqlen_k = sk;
  a.q = {dq, {int64_t(sq) * h * d, h * d, d, 1}};
  a.k = {dk, {int64_t(sk) * h * d, h * d, d, 1}};
  a.v = {dv, {int64_t(sk) * h * d, h * d, d, 1}};
  a.o = {dout, {int64_t(sq) * h * d, h * d, d, 1}};
  const fa_status st = fa_launch(rt, cfg, &a, nullptr);
  if (st != FA_SUCCESS) std::fprintf(stderr, "fa_launch: %s\n", fa_last_error());
  std::vector<uint16_t> o(q.size());
  fa_memcpy_dtoh(rt, o.data(), dout, o.size() * 2);
  for (uint64_t p : {dq, dk, dv, dout}) fa_free(rt, p);
  fa_config_destroy(cfg);
  if (st != FA_SUCCESS) return false;
  fa::ref::Problem p;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.num_heads_q = p.num_heads_kv = h;
  p.head_dim = p.head_dim_v = d;
  p.causal = true;
  std::vector<double> ref(o.size());
  fa::ref::attention(p, qd.data(), kd.data(), vd.data(), ref.data(), nullptr);
  for (size_t i = 0; i < o.size(); ++i) {
    const double got = fa::ref::f16_to_f32(o[i]);
    if (!(std::abs(got - ref[i]) < 2e-3)) {
      std::fprintf(stderr, "element %zu: got %g, want %g\n", i, got, ref[i]);
      return false;
    }
  }
  return true;
}

fa_cache_stats stats_of(fa_runtime *rt) {
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  fa_cache_stats_get(rt, &s);
  return s;
}

// Runs fn in a child process; returns its exit status (0 = pass).
template <typename F>
int in_child(F fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    const bool ok = fn();
    std::fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void test_memory_then_disk_hits(void **) {
  const std::string dir = make_dir("hits");
  assert_false(dir.empty());
  // Process 1: cold, generates once, then serves repeats from memory.
  int rc = in_child([&] {
    fa_runtime *rt = open_rt(dir);
    if (!rt || !launch_and_check(rt) || !launch_and_check(rt)) return false;
    const fa_cache_stats s = stats_of(rt);
    std::printf("  cold: misses %llu memory_hits %llu disk_hits %llu entries %llu persistent %d\n",
                (unsigned long long)s.misses, (unsigned long long)s.memory_hits,
                (unsigned long long)s.disk_hits, (unsigned long long)s.entries, s.persistent);
    const bool ok = s.misses == 1 && s.memory_hits == 1 && s.disk_hits == 0 && s.entries == 1 &&
                    s.persistent == 1 && std::strstr(s.path, dir.c_str()) == s.path;
    fa_runtime_destroy(rt);
    return ok;
  });
  assert_int_equal(rc, 0);
  // Process 2: finds the kernel on disk, generates nothing.
  rc = in_child([&] {
    fa_runtime *rt = open_rt(dir);
    if (!rt || !launch_and_check(rt)) return false;
    const fa_cache_stats s = stats_of(rt);
    std::printf("  warm: misses %llu disk_hits %llu\n", (unsigned long long)s.misses,
                (unsigned long long)s.disk_hits);
    const bool ok = s.misses == 0 && s.disk_hits == 1;
    fa_runtime_destroy(rt);
    return ok;
  });
  assert_int_equal(rc, 0);
  // fa_cache_list sees the kernel with its spec; fa_cache_clear empties.
  fa_runtime *rt = open_rt(dir);
  assert_non_null(rt);
  int rows = 0;
  assert_int_equal(fa_cache_list(
                       rt,
                       [](const fa_cache_entry *e, void *user) {
                         ++*static_cast<int *>(user);
                         return (std::strlen(e->key) == 32 && e->ptx_bytes > 1000 &&
                                 std::strstr(e->spec, "forward") != nullptr && e->sm == 80)
                                    ? 0
                                    : 1;
                       },
                       &rows),
                   FA_SUCCESS);
  assert_int_equal(rows, 1);
  assert_int_equal(stats_of(rt).entries, 1);
  assert_int_equal(fa_cache_clear(rt), FA_SUCCESS);
  assert_int_equal(stats_of(rt).entries, 0);
  fa_runtime_destroy(rt);
}

void test_corrupt_file_never_fails_launch(void **) {
  const std::string dir = make_dir("corrupt");
  assert_false(dir.empty());
  assert_int_equal(in_child([&] {
                     fa_runtime *rt = open_rt(dir);
                     const bool ok = rt && launch_and_check(rt);
                     fa_runtime_destroy(rt);
                     return ok;
                   }),
                   0);
  // Overwrite the database with garbage, then launch again.
  const std::string file = dir + "/kernels.sqlite3";
  FILE *f = std::fopen(file.c_str(), "r+b");
  assert_non_null(f);
  std::vector<unsigned char> junk(8192);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = (unsigned char)(i * 131 + 7);
  std::fwrite(junk.data(), 1, junk.size(), f);
  std::fclose(f);
  fa_runtime *rt = open_rt(dir);
  assert_non_null(rt);
  assert_true(launch_and_check(rt));
  const fa_cache_stats s = stats_of(rt);
  std::printf("  after corruption: misses %llu persistent %d note '%s'\n",
              (unsigned long long)s.misses, s.persistent, s.note);
  assert_int_equal(s.misses, 1);
  fa_runtime_destroy(rt);
}

void test_unusable_dir_falls_back_to_memory(void **) {
  // A path under a regular file cannot be a directory, even for root.
  const std::string dir = make_dir("notdir");
  const std::string file = dir + "/plain";
  FILE *f = std::fopen(file.c_str(), "w");
  assert_non_null(f);
  std::fputs("not a directory", f);
  std::fclose(f);
  fa_runtime *rt = open_rt(file + "/cache");
  assert_non_null(rt);
  assert_true(launch_and_check(rt));
  const fa_cache_stats s = stats_of(rt);
  std::printf("  note: %s\n", s.note);
  assert_int_equal(s.persistent, 0);
  assert_true(std::strlen(s.note) > 0);
  fa_runtime_destroy(rt);
}

void test_disable_env(void **) {
  const std::string dir = make_dir("disabled");
  setenv("FLASHATTN_CACHE_DISABLE", "1", 1);
  fa_runtime *rt = open_rt(dir);
  unsetenv("FLASHATTN_CACHE_DISABLE");
  assert_non_null(rt);
  assert_true(launch_and_check(rt));
  const fa_cache_stats s = stats_of(rt);
  assert_int_equal(s.persistent, 0);
  assert_int_equal(s.misses, 1);
  fa_runtime_destroy(rt);
  struct stat st;
  assert_int_not_equal(stat((dir + "/kernels.sqlite3").c_str(), &st), 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory_then_disk_hits),
      cmocka_unit_test(test_corrupt_file_never_fails_launch),
      cmocka_unit_test(test_unusable_dir_falls_back_to_memory),
      cmocka_unit_test(test_disable_env),
  };
  return cmocka_run_group_tests_name("runtime_cache", tests, nullptr, nullptr);
}
