// One runtime used from several threads at once, as flashattn.h promises:
// concurrent first launches of the same and of different kernels, memory
// helpers and cache queries. Every result is checked against the reference.
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/cmocka.hh"
#include "support/numerics.h"

namespace {

void test_concurrent_launches(void **) {
  std::string why;
  fa_runtime *rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &why);
  if (!rt) {
    print_error("runtime: %s\n", why.c_str());
    fail();
  }
  // Four threads; two share each config, so the same kernel is requested
  // concurrently while a different one is being built.
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        fa::test::ForwardCase c;
        c.seqlen_q = 23 + round;
        c.seqlen_k = 41;
        c.heads_q = 2;
        c.heads_kv = 1;
        c.head_dim = t % 2 ? 64 : 40;
        c.causal = t % 2;
        c.seed = 100 * t + round;
        errors[t] += fa::test::run_forward(rt, c);
        fa_cache_stats s = FA_CACHE_STATS_INIT;
        if (fa_cache_stats_get(rt, &s) != FA_SUCCESS) errors[t] += "fa_cache_stats_get failed\n";
      }
    });
  }
  for (auto &th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    if (!errors[t].empty()) print_error("thread %d: %s", t, errors[t].c_str());
    assert_true(errors[t].empty());
  }
  // Two distinct kernels were built, each exactly once.
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  assert_int_equal(fa_cache_stats_get(rt, &s), FA_SUCCESS);
  assert_int_equal(s.misses, 2);
  assert_int_equal(s.memory_hits, 10);
  fa_runtime_destroy(rt);
}

// fa_last_error is per thread: a failure on one thread never shows on another.
void test_last_error_is_thread_local(void **) {
  fa_config *cfg = nullptr;
  fa_config_desc bad = FA_CONFIG_DESC_INIT;
  bad.head_dim = 12;
  bad.num_heads_q = bad.num_heads_kv = 1;
  assert_int_equal(fa_config_create(&bad, &cfg), FA_ERROR_UNSUPPORTED);
  std::string other;
  std::thread([&] { other = fa_last_error(); }).join();
  assert_string_equal(other.c_str(), "");
  assert_non_null(std::strstr(fa_last_error(), "head_dim"));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_launches),
      cmocka_unit_test(test_last_error_is_thread_local),
  };
  return cmocka_run_group_tests_name("threads", tests, nullptr, nullptr);
}
