#include "support/persistent.h"

#include <cstring>

#include "support/policy.h"

namespace fa::test {

std::string PersistentCase::run(fa_runtime *rt, std::vector<float> *o, std::vector<float> *lse,
                                uint64_t ws, size_t ws_size) {
  if (d.prefill) {
    d.o_out = o;
    d.lse_out = lse;
    d.workspace = ws;
    d.workspace_size = ws_size;
    return run_decode(rt, d);
  }
  c.o_out = o;
  c.lse_out = lse;
  c.workspace = ws;
  c.workspace_size = ws_size;
  return run_forward(rt, c);
}

ForwardCase varlen_case(const std::vector<int> &sq, const std::vector<int> &sk, int max_q,
                        int max_k, int hq, int hkv, int d, bool bf16, bool causal, uint32_t seed) {
  ForwardCase c = forward_case(static_cast<int>(sq.size()), max_q, max_k, hq, hkv, d, d, bf16,
                               causal, -1, -1, 0, seed);
  c.varlen = true;
  c.seqlens_q = sq;
  c.seqlens_k = sk;
  return c;
}

const char *const kPersistentRunName[kPersistentRuns] = {"", " persistent", " dynamic",
                                                         " dynamic (second launch)"};

namespace {

// The problems with the workspace's two counters (they must be zero).
std::string workspace_zero(fa_runtime *rt, uint64_t ws, const std::string &what) {
  uint32_t w[2] = {1, 1};
  if (fa_memcpy_dtoh(rt, w, ws, sizeof w) != FA_SUCCESS) return what + ": workspace unreadable\n";
  if (w[0] == 0 && w[1] == 0) return "";
  return what + ": workspace left at {" + std::to_string(w[0]) + ", " + std::to_string(w[1]) +
         "}, not zero\n";
}

}  // namespace

std::string run_persistent(fa_runtime *rt, PersistentCase &x, bool fa::KernelPolicy::*on,
                           uint64_t ws, std::string kernel[kPersistentRuns]) {
  std::string failures;
  std::vector<float> o[kPersistentRuns], lse[kPersistentRuns];
  for (int run = 0; run < kPersistentRuns; ++run) {
    PolicyScope p(rt, on, run > 0);
    PolicyScope grid(rt, &fa::KernelPolicy::persistent_grid, x.grid);
    const std::string e = x.run(rt, &o[run], &lse[run], run >= 2 ? ws : 0, run >= 2 ? 8 : 0);
    const std::string what = x.describe() + kPersistentRunName[run];
    if (!e.empty()) failures += what + ":\n" + e;
    kernel[run] = emulated_kernel(rt);
    if (run >= 2) failures += workspace_zero(rt, ws, what);
    if (o[0].size() != o[run].size() || lse[0].size() != lse[run].size() ||
        std::memcmp(o[0].data(), o[run].data(), o[0].size() * sizeof(float)) != 0 ||
        std::memcmp(lse[0].data(), lse[run].data(), lse[0].size() * sizeof(float)) != 0) {
      size_t diff = 0;
      for (size_t i = 0; i < o[0].size() && i < o[run].size(); ++i)
        diff += std::memcmp(&o[0][i], &o[run][i], sizeof(float)) != 0;
      failures += what + ": O or LSE differs from the one-CTA-per-item kernel's (" +
                  std::to_string(diff) + " O elements)\n";
    }
  }
  return failures;
}

std::string check_workspace_api(fa_runtime *rt, bool fa::KernelPolicy::*on, uint64_t ws) {
  std::string failures;
  ForwardCase c = forward_case(1, 200, 200, 2, 1, 64, 64, false, true, -1, -1, 0, 2790);
  fa_config *cfg = nullptr;
  fa_forward_args a;
  if (!host_forward_problem(1, 200, 200, 2, 1, 64, true, ws, &cfg, &a))
    return "fa_config_create failed\n";
  for (int set = 0; set < 2; ++set) {
    PolicyScope p(rt, on, set == 1);
    size_t bytes = 99;
    const fa_status st = fa_forward_workspace_size(rt, cfg, &a, &bytes);
    if (st != FA_SUCCESS || bytes != (set ? 8u : 0u))
      failures += "fa_forward_workspace_size (persistent " + std::to_string(set) + "): status " +
                  std::to_string(st) + ", " + std::to_string(bytes) + " bytes: " + fa_last_error() +
                  "\n";
  }
  fa_config_destroy(cfg);
  PolicyScope p(rt, on, true);
  struct Bad {
    uint64_t off;
    size_t size;
    const char *message;
  } bads[] = {{4, 8, "workspace 0x"}, {0, 4, "workspace_size is 4"}};
  for (const Bad &b : bads) {
    Reject r;
    r.forward = [&](fa_forward_args *x) {
      x->workspace = ws + b.off;
      x->workspace_size = b.size;
    };
    r.message = b.message;
    c.reject = &r;
    const std::string e = run_forward(rt, c);
    if (!e.empty()) failures += std::string("bad workspace (") + b.message + "): " + e;
  }
  return failures;
}

}  // namespace fa::test
