// The main() of a feature-description suite (test_features,
// test_cli_features): one cmocka test per tests/features/*.cases file,
// named after it, its state the name.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "support/cmocka.hh"
#include "support/feature_cases.h"

namespace fa::test::features {

// Runs `test` once per feature file as the group `suite`; 1 when there is
// no .cases file (a suite that checks nothing fails).
inline int run_suite(const char *suite, CMUnitTestFunction test, CMFixtureFunction setup,
                     CMFixtureFunction teardown) {
  static std::vector<std::string> names = feature_names();
  static std::vector<CMUnitTest> tests;
  for (const std::string &n : names)
    tests.push_back({n.c_str(), test, nullptr, nullptr, const_cast<char *>(n.c_str())});
  if (tests.empty()) {
    std::fprintf(stderr, "no .cases files in %s\n", FA_TEST_FEATURES_DIR);
    return 1;
  }
  return _cmocka_run_group_tests(suite, tests.data(), tests.size(), setup, teardown);
}

}  // namespace fa::test::features
