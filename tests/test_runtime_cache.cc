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
#include "support/cmocka.hh"
#include "support/numerics.h"

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

// Runs one small causal forward pass through the shared numerics runner
// (poisoned output, fp64 reference). True when the launch succeeded and the
// result is right.
bool launch_and_check(fa_runtime *rt) {
  fa::test::ForwardCase c;
  c.seqlen_q = 9;
  c.seqlen_k = 13;
  c.heads_q = c.heads_kv = 2;
  c.head_dim = 32;
  c.causal = true;
  c.seed = 12345;
  const std::string err = fa::test::run_forward(rt, c);
  if (!err.empty()) std::fprintf(stderr, "%s", err.c_str());
  return err.empty();
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
    // One compile (the emulator's parse check) for the one miss; none for
    // the repeat. The emulator has no machine-code compiler.
    const bool ok = s.misses == 1 && s.memory_hits == 1 && s.disk_hits == 0 && s.entries == 1 &&
                    s.compiles == 1 && s.compiler_mode == FA_COMPILER_NONE &&
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
    std::printf("  warm: misses %llu disk_hits %llu compiles %llu\n", (unsigned long long)s.misses,
                (unsigned long long)s.disk_hits, (unsigned long long)s.compiles);
    const bool ok = s.misses == 0 && s.disk_hits == 1 && s.compiles == 0;
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
