// The sm_90a forward (wgmma, TMA, mbarriers, warp specialisation;
// docs/kernels.md, "Forward on sm_90a") on an emulated sm_90: cases aimed at
// its machinery, each checked to have run that kernel, then the numerics
// suite (FLASHATTN_SM90_WGMMA=1 pins the choice). The forward cases whose launch the
// kernel cannot take (varlen, KV layouts, seqused_k) run the mma.sync kernel,
// as on a GPU. First checks that the runtime does pick the wgmma kernel.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"

int main(void) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  // The selection itself: fa_generate for sm 90 gives the wgmma module.
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 128;
  d.num_heads_q = d.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  size_t n = 0;
  if (fa_config_create(&d, &cfg) != FA_SUCCESS ||
      fa_generate(cfg, FA_KERNEL_FORWARD, 90, nullptr, 0, &n) != FA_SUCCESS) {
    std::printf("FAIL: fa_generate\n");
    return 1;
  }
  std::string ptx(n + 1, '\0');
  fa_generate(cfg, FA_KERNEL_FORWARD, 90, &ptx[0], ptx.size(), &n);
  fa_config_destroy(cfg);
  if (ptx.find("fa_forward_wgmma_") == std::string::npos ||
      ptx.find(".target sm_90a") == std::string::npos) {
    std::printf("FAIL: FLASHATTN_SM90_WGMMA=1 does not select the sm_90a forward\n");
    return 1;
  }
  // Cases aimed at the new machinery: sequences shorter than one TMA box,
  // tails inside a swizzle atom (8-row groups), head dims that are not a
  // multiple of 64, head_dim_v != head_dim, GQA groups whose query heads
  // fall in different CTAs, every mask kind, several K/V ring rounds.
  std::string why;
  fa_runtime *rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &why, 90);
  if (rt == nullptr) {
    std::printf("FAIL: %s\n", why.c_str());
    return 1;
  }
  std::vector<fa::test::ForwardCase> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int dd, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap) {
    fa::test::ForwardCase c;
    c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = hq, c.heads_kv = hkv;
    c.head_dim = dd, c.head_dim_v = dv, c.bf16 = bf16, c.causal = causal;
    c.window_left = wl, c.window_right = wr, c.softcap = cap;
    c.seed = static_cast<uint32_t>(cases.size() + 900);
    cases.push_back(c);
  };
  add(1, 5, 3, 2, 1, 64, 64, false, false, -1, -1, 0);        // shorter than a box
  add(2, 131, 259, 4, 2, 128, 128, true, true, -1, -1, 0);    // tails inside atoms, causal
  add(1, 70, 517, 8, 2, 80, 80, false, false, -1, -1, 0);     // d not a multiple of 64, 5 rounds
  add(1, 64, 200, 3, 1, 40, 72, true, false, 33, 7, 0);       // d != dv, window
  add(1, 129, 129, 2, 2, 256, 256, false, true, -1, -1, 30);  // d256, softcap
  add(2, 200, 90, 6, 3, 96, 96, true, false, -1, -1, 0);      // seqlen_q > seqlen_k
  add(1, 33, 400, 4, 4, 8, 8, false, false, 100, 0, 0);       // smallest head dim, window
  std::string failures;
  // The emulator's profile names the kernel each launch ran: every case
  // must have run the sm_90a forward, not the mma.sync fallback.
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  for (const auto &c : cases) {
    const std::string e = fa::test::run_forward(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, "fa_forward_wgmma_") == nullptr)
      failures += c.describe() + ": ran " + prof.kernel + ", not the sm_90a forward\n";
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  if (std::getenv("FA_TEST_QUICK") == nullptr) setenv("FA_TEST_QUICK", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm90a", FA_BACKEND_EMULATOR, false, 90);
}
