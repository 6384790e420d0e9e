// The sm_90a forward (wgmma, TMA, mbarriers, warp specialisation;
// docs/kernels.md, "Forward on sm_90a") on an emulated sm_90: cases aimed at
// its machinery, each checked to have run that kernel, then the numerics
// suite (FLASHATTN_SM90_WGMMA=1 pins the choice). Launches TMA cannot
// address (varlen, KV layouts, seqused_k) run its gather variant, checked
// here too. First checks that the runtime does pick the wgmma kernel.
#include <algorithm>
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
    cases.push_back(fa::test::forward_case(b, sq, sk, hq, hkv, dd, dv, bf16, causal, wl, wr, cap,
                                           static_cast<uint32_t>(cases.size() + 900)));
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
  failures += fa::test::run_on_kernel(rt, cases, "fa_forward_wgmma_", "the sm_90a forward");
  // The gather producer (cp.async rows instead of TMA boxes): varlen,
  // chunked prefill through fa_launch with seqused_k over every KV layout
  // (paged by tile and by row, NHD and HND, shared prefix pages, pointer
  // arrays), sequences shorter than a tile and empty ones.

  std::vector<fa::test::ForwardCase> varlen;
  auto add_varlen = [&](std::vector<int> sq, std::vector<int> sk, int hq, int hkv, int dd, int dv,
                        bool bf16, bool causal, int wl, float cap) {
    varlen.push_back(fa::test::varlen_case(sq, sk, hq, hkv, dd, dv, bf16, causal, wl, cap,
                                           static_cast<uint32_t>(varlen.size() + 950)));
  };
  add_varlen({5, 130, 64}, {300, 7, 129}, 4, 2, 128, 128, true, true, -1, 0);
  add_varlen({1, 0, 77}, {9, 40, 0}, 2, 1, 80, 80, false, false, -1, 0);
  add_varlen({140, 33}, {141, 260}, 2, 2, 40, 72, true, false, 20, 0);
  add_varlen({64, 129}, {200, 129}, 4, 1, 256, 256, false, true, -1, 25);
  failures += fa::test::run_on_kernel(rt, varlen, "fa_forward_wgmma_gather_", "the sm_90a gather forward");
  const std::vector<fa::test::DecodeCase> prefill = fa::test::prefill_layout_cases(5, 960);
  failures += fa::test::run_on_kernel(rt, prefill, "fa_forward_wgmma_gather_", "the sm_90a gather forward");
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  // The whole forward grid and both fixtures (about 20 s; the sanitizer
  // pass sets FA_TEST_QUICK=1 for its short list).
  return fa::test::run_numerics_suite("numerics_emulator_sm90a", FA_BACKEND_EMULATOR, false, 90);
}
