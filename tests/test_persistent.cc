// The persistent sm_90a forward (KernelSpec::persistent, KernelPolicy::
// sm90_persistent; docs/kernels.md, "Persistent variant") on an emulated
// sm_90: each case runs through the numerics runner (fresh random inputs,
// outputs poisoned first, O and LSE against the fp64 reference) once on the
// one-CTA-per-item kernel and once on the persistent one, and the two must
// agree bit for bit in O and LSE. The persistent grid is forced small
// (KernelPolicy::persistent_grid) so that each CTA runs several work items
// and the item count is not a multiple of the grid; one case keeps the
// emulator's SM count (108 CTAs for 128 items). Cases: seqlen_q = 1, causal
// with seqlen_q > seqlen_k (m-blocks and rows with no key), windows both
// ways and left only, GQA, head_dim 64 / 128 / 256 and d != dv, fp16 and
// bf16, softcap, several K/V ring rounds per item. Each launch is checked
// (by the emulator profile's kernel name) to have run the kernel it should.
// The dynamic order (KernelSpec::dynamic: a workspace given, items handed
// out by an atomic counter) runs each case twice back to back on one
// workspace, CTAs on 3 emulator host threads: both runs bit-identical to
// one CTA per item, and the workspace zero after each (the last CTA out
// resets it; without that reset the second run finds its items taken).
// fa_forward_workspace_size is 8 with the policy on, 0 off; a misaligned
// or too small workspace is refused naming it, nothing written.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

struct Case {
  fa::test::ForwardCase c;
  int grid = 0;  // persistent CTAs at most (0: the emulator's SM count)
};

std::string ran(fa_runtime *rt) {
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(rt, &prof) != FA_SUCCESS) return "(no profile)";
  return prof.kernel;
}

// Runs: one CTA per item, static persistent, then the dynamic order twice
// on one workspace.
constexpr int kRuns = 4;
const char *const kRunName[kRuns] = {"", " persistent", " dynamic", " dynamic (second launch)"};

// The problems with the workspace's two counters (they must be zero).
std::string workspace_zero(fa_runtime *rt, uint64_t ws, const std::string &what) {
  uint32_t w[2] = {1, 1};
  if (fa_memcpy_dtoh(rt, w, ws, sizeof w) != FA_SUCCESS) return what + ": workspace unreadable\n";
  if (w[0] == 0 && w[1] == 0) return "";
  return what + ": workspace left at {" + std::to_string(w[0]) + ", " + std::to_string(w[1]) +
         "}, not zero\n";
}

// fa_forward_workspace_size with the persistent policy on (8) and off (0),
// and a misaligned or too small workspace refused by name with nothing
// written (the numerics runner's reject path).
std::string check_workspace_api(fa_runtime *rt, uint64_t ws) {
  std::string failures;
  fa::test::ForwardCase c =
      fa::test::forward_case(1, 200, 200, 2, 1, 64, 64, false, true, -1, -1, 0, 2790);
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = d.head_dim_v = 64;
  d.num_heads_q = 2;
  d.num_heads_kv = 1;
  d.causal = 1;
  fa_config *cfg = nullptr;
  if (fa_config_create(&d, &cfg) != FA_SUCCESS) return "fa_config_create failed\n";
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = a.seqlen_k = 200;
  for (fa_tensor *t : {&a.q, &a.k, &a.v, &a.o}) {
    t->data = ws;  // host fields only: never read
    const int64_t st[4] = {200 * 2 * 64, 2 * 64, 64, 1};
    for (int i = 0; i < 4; ++i) t->stride[i] = st[i];
  }
  a.k.stride[0] = a.v.stride[0] = 200 * 64;
  a.k.stride[1] = a.v.stride[1] = 64;
  for (int on = 0; on < 2; ++on) {
    fa::test::PolicyScope p(rt, &fa::KernelPolicy::sm90_persistent, on == 1);
    size_t bytes = 99;
    const fa_status st = fa_forward_workspace_size(rt, cfg, &a, &bytes);
    if (st != FA_SUCCESS || bytes != (on ? 8u : 0u))
      failures += "fa_forward_workspace_size (persistent " + std::to_string(on) + "): status " +
                  std::to_string(st) + ", " + std::to_string(bytes) + " bytes: " + fa_last_error() +
                  "\n";
  }
  fa_config_destroy(cfg);
  fa::test::PolicyScope p(rt, &fa::KernelPolicy::sm90_persistent, true);
  struct Bad {
    uint64_t off;
    size_t size;
    const char *message;
  } bads[] = {{4, 8, "workspace 0x"}, {0, 4, "workspace_size is 4"}};
  for (const Bad &b : bads) {
    fa::test::Reject r;
    r.forward = [&](fa_forward_args *x) {
      x->workspace = ws + b.off;
      x->workspace_size = b.size;
    };
    r.message = b.message;
    c.reject = &r;
    const std::string e = fa::test::run_forward(rt, c);
    if (!e.empty()) failures += std::string("bad workspace (") + b.message + "): " + e;
  }
  return failures;
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  setenv("FLASHATTN_EMU_THREADS", "3", 1);  // CTAs race for the dynamic order's tickets
  unsetenv("FLASHATTN_SM90_PERSISTENT");
  std::string why;
  fa_runtime *rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &why, 90);
  if (rt == nullptr) {
    std::printf("FAIL: %s\n", why.c_str());
    return 1;
  }
  std::vector<Case> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int dd, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap, int grid) {
    Case x;
    x.c = fa::test::forward_case(b, sq, sk, hq, hkv, dd, dv, bf16, causal, wl, wr, cap,
                                 static_cast<uint32_t>(cases.size() + 2700));
    x.grid = grid;
    cases.push_back(x);
  };
  add(2, 300, 300, 4, 2, 128, 128, true, true, -1, -1, 0, 5);    // 24 items on 5 CTAs
  add(3, 1, 200, 4, 1, 64, 64, false, true, -1, -1, 0, 5);       // seqlen_q = 1, GQA 4
  add(2, 300, 100, 3, 3, 128, 128, false, true, -1, -1, 0, 4);   // rows and m-blocks with no key
  add(1, 260, 517, 8, 2, 64, 64, true, false, 100, 30, 0, 7);    // window both ways, 5 rounds
  add(1, 200, 300, 6, 2, 256, 256, false, true, -1, -1, 30, 5);  // d256 (no ping-pong), softcap
  add(2, 129, 129, 2, 1, 96, 64, true, false, 40, -1, 0, 3);     // d != dv, left window alone
  add(8, 129, 140, 8, 4, 64, 64, false, true, -1, -1, 0, 0);     // 128 items on 108 CTAs
  // The dynamic order's workspace: zeroed once, here; every launch must
  // leave it zero.
  uint64_t ws = 0;
  if (fa_malloc(rt, 64, &ws) != FA_SUCCESS || fa_memset(rt, ws, 0, 64) != FA_SUCCESS) {
    std::printf("FAIL: workspace: %s\n", fa_last_error());
    return 1;
  }
  std::string failures = check_workspace_api(rt, ws);
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  for (Case &x : cases) {
    fa::test::ForwardCase &c = x.c;
    std::vector<float> o[kRuns], lse[kRuns];
    for (int run = 0; run < kRuns; ++run) {
      fa::test::PolicyScope on(rt, &fa::KernelPolicy::sm90_persistent, run > 0);
      fa::test::PolicyScope grid(rt, &fa::KernelPolicy::persistent_grid, x.grid);
      c.o_out = &o[run];
      c.lse_out = &lse[run];
      c.workspace = run >= 2 ? ws : 0;
      c.workspace_size = run >= 2 ? 8 : 0;
      const std::string e = fa::test::run_forward(rt, c);
      const std::string what = c.describe() + kRunName[run];
      if (!e.empty()) failures += what + ":\n" + e;
      const std::string k = ran(rt);
      const bool is_p = k.find("_persistent") != std::string::npos;
      const bool is_d = k.find("_dynamic") != std::string::npos;
      if (k.find("fa_forward_wgmma_") != 0 || is_p != (run > 0) || is_d != (run >= 2))
        failures += what + ": ran " + k + "\n";
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
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_free(rt, ws);
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  std::printf(
      "%zu cases: static and dynamic persistent O and LSE bit-identical to one CTA per item; "
      "workspace zero after each launch\n",
      cases.size());
  return 0;
}
