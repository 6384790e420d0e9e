// Device allocations of one test run, freed together, and the first failed
// call's message: the allocator the hand-written runners share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"

namespace fa::test {

struct Dev {
  fa_runtime *rt;
  std::vector<uint64_t> allocs;
  std::string err;                // "what: fa_last_error()" of the first failure
  fa_config *cfg = nullptr;       // destroyed with the allocations
  fa_status *last_fail = nullptr;  // when set, receives every failing status
  explicit Dev(fa_runtime *r) : rt(r) {}
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  ~Dev() {
    for (uint64_t p : allocs) fa_free(rt, p);
    fa_config_destroy(cfg);
  }
  bool check(fa_status st, const char *what) {
    if (st == FA_SUCCESS) return true;
    if (last_fail) *last_fail = st;
    if (err.empty()) err = std::string(what) + ": " + fa_last_error() + "\n";
    return false;
  }
  // A device copy of `bytes` bytes of host (uninitialised when host is
  // null; at least 16 bytes allocated); 0 after a failure.
  uint64_t put(const void *host, size_t bytes) {
    uint64_t p = 0;
    if (!check(fa_malloc(rt, std::max<size_t>(bytes, 16), &p), "fa_malloc")) return 0;
    allocs.push_back(p);
    if (host) check(fa_memcpy_htod(rt, p, host, bytes), "upload");
    return p;
  }
};

}  // namespace fa::test
