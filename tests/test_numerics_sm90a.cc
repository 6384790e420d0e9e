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
  for (const auto &c : cases) {
    const std::string e = fa::test::run_forward(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, "fa_forward_wgmma_") == nullptr)
      failures += c.describe() + ": ran " + prof.kernel + ", not the sm_90a forward\n";
  }
  // The gather producer (cp.async rows instead of TMA boxes): varlen,
  // chunked prefill through fa_launch with seqused_k over every KV layout
  // (paged by tile and by row, NHD and HND, shared prefix pages, pointer
  // arrays), sequences shorter than a tile and empty ones.
  auto ran_gather = [&](const std::string &what) {
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, "fa_forward_wgmma_gather_") == nullptr)
      failures += what + ": ran " + prof.kernel + ", not the sm_90a gather forward\n";
  };
  std::vector<fa::test::ForwardCase> varlen;
  auto add_varlen = [&](std::vector<int> sq, std::vector<int> sk, int hq, int hkv, int dd, int dv,
                        bool bf16, bool causal, int wl, float cap) {
    fa::test::ForwardCase c;
    c.batch = static_cast<int>(sq.size());
    c.varlen = true;
    c.seqlens_q = sq;
    c.seqlens_k = sk;
    c.seqlen_q = *std::max_element(sq.begin(), sq.end());
    c.seqlen_k = *std::max_element(sk.begin(), sk.end());
    c.heads_q = hq, c.heads_kv = hkv, c.head_dim = dd, c.head_dim_v = dv, c.bf16 = bf16;
    c.causal = causal, c.window_left = wl, c.softcap = cap;
    c.seed = static_cast<uint32_t>(varlen.size() + 950);
    varlen.push_back(c);
  };
  add_varlen({5, 130, 64}, {300, 7, 129}, 4, 2, 128, 128, true, true, -1, 0);
  add_varlen({1, 0, 77}, {9, 40, 0}, 2, 1, 80, 80, false, false, -1, 0);
  add_varlen({140, 33}, {141, 260}, 2, 2, 40, 72, true, false, 20, 0);
  add_varlen({64, 129}, {200, 129}, 4, 1, 256, 256, false, true, -1, 25);
  for (const auto &c : varlen) {
    const std::string e = fa::test::run_forward(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    ran_gather(c.describe());
  }
  std::vector<fa::test::DecodeCase> prefill;
  auto layout = [](int lay, int page_size, bool hnd, bool share) {
    fa::test::KvCase k;
    k.layout = lay;
    k.page_size = page_size;
    k.hnd = hnd;
    k.share_prefix = share;
    return k;
  };
  const fa::test::KvCase layouts[] = {
      layout(FA_KV_CONTIGUOUS, 0, false, false), layout(FA_KV_PAGED, 128, false, false),
      layout(FA_KV_PAGED, 256, true, true),      layout(FA_KV_PAGED, 16, false, true),
      layout(FA_KV_PAGED, 1, false, false),      layout(FA_KV_PAGED, 3, true, false),
      layout(FA_KV_PTR_ARRAY, 0, false, false)};
  int i = 0;
  for (const fa::test::KvCase &kv : layouts) {
    fa::test::DecodeCase c;
    c.prefill = true;
    c.batch = 3;
    c.seqlen_q = i % 2 ? 5 : 37 + 50 * (i % 3);
    c.seqlen_k_max = 256 + 32 * (i % 3);
    c.cache_seqlens = {c.seqlen_k_max, c.seqlen_q + 3, i == 3 ? 0 : c.seqlen_k_max - 41};
    c.heads_q = i % 3 == 0 ? 4 : 2;
    c.heads_kv = 2;
    c.head_dim = i % 2 ? 128 : 64 + 32 * (i % 3);
    c.bf16 = i % 2 == 0;
    c.causal = i != 4;
    c.window_left = i == 5 ? 50 : -1;
    c.softcap = i == 0 || i == 6 ? 20.0f : 0.0f;
    c.kv = kv;
    c.seed = static_cast<uint32_t>(960 + i);
    prefill.push_back(c);
    ++i;
  }
  for (const auto &c : prefill) {
    const std::string e = fa::test::run_decode(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    ran_gather(c.describe());
  }
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
