// The sm_100a forward (tcgen05.mma, tensor memory, TMA, warp roles:
// FlashAttention-4's structure; docs/kernels.md, "Forward on sm_100a") on
// an emulated sm_100: cases aimed at its machinery, each checked to have
// run that kernel, then the numerics suite at SM 100
// (FLASHATTN_SM100_FORWARD=1 selects it where it covers the call; the
// other calls run the mma.sync forward). First checks that the runtime
// picks it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"

int main(void) {
  setenv("FLASHATTN_SM100_FORWARD", "1", 1);
  // The selection: fa_generate for sm 100 and 103 gives the tcgen05 module.
  for (int sm : {100, 103}) {
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.head_dim = 128;
    d.num_heads_q = d.num_heads_kv = 2;
    fa_config *cfg = nullptr;
    size_t n = 0;
    if (fa_config_create(&d, &cfg) != FA_SUCCESS ||
        fa_generate(cfg, FA_KERNEL_FORWARD, sm, nullptr, 0, &n) != FA_SUCCESS) {
      std::printf("FAIL: fa_generate sm %d\n", sm);
      return 1;
    }
    std::string ptx(n + 1, '\0');
    fa_generate(cfg, FA_KERNEL_FORWARD, sm, &ptx[0], ptx.size(), &n);
    fa_config_destroy(cfg);
    const std::string target = ".target sm_" + std::to_string(sm) + "a";
    if (ptx.find("fa_forward_tc05_") == std::string::npos ||
        ptx.find(target) == std::string::npos || ptx.find("tcgen05.mma") == std::string::npos) {
      std::printf("FAIL: FLASHATTN_SM100_FORWARD=1 does not select the sm_100a forward on sm %d\n",
                  sm);
      return 1;
    }
  }
  // Cases aimed at the new machinery: sequences shorter than a Q tile or
  // a TMA box, rows of the second Q tile only, tails inside swizzle atoms,
  // both head dims of a 64-column atom count, GQA, every mask kind, key
  // ranges of one tile and of several ring rounds, softcap, a row whose
  // maximum grows by more than 2^8 after its first tile (the conditional
  // O rescale), rows with no key (window past the keys).
  std::string why;
  fa_runtime *rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &why, 100);
  if (rt == nullptr) {
    std::printf("FAIL: %s\n", why.c_str());
    return 1;
  }
  std::vector<fa::test::ForwardCase> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int dd, bool bf16, bool causal, int wl,
                 int wr, float cap) {
    cases.push_back(fa::test::forward_case(b, sq, sk, hq, hkv, dd, dd, bf16, causal, wl, wr, cap,
                                           static_cast<uint32_t>(cases.size() + 1100)));
  };
  add(1, 5, 3, 2, 1, 64, false, false, -1, -1, 0);      // shorter than a box, one tile
  add(1, 300, 1000, 2, 1, 128, true, true, -1, -1, 0);  // causal, 8 tiles, both Q tiles
  add(2, 131, 259, 4, 2, 64, true, false, -1, -1, 0);   // tails inside atoms, GQA
  add(1, 200, 700, 2, 2, 96, false, false, 150, 20, 0);  // window, d 96 (partial atom)
  add(1, 64, 130, 2, 2, 32, true, false, -1, -1, 30);   // softcap, small d
  add(1, 257, 257, 1, 1, 128, false, true, -1, -1, 0);  // the second m-block's one row
  add(1, 20, 500, 2, 1, 16, true, false, 5, 0, 0);      // window: one tile a row, d 16
  cases.back().sinks = {0.5f, -1.0f};                    // with a sink per head
  add(2, 100, 300, 4, 2, 64, false, true, -1, -1, 0);   // ALiBi, causal
  cases.back().alibi = {0.25f, 0.125f, 0.0625f, 0.03125f};
  add(1, 150, 290, 2, 1, 256, true, true, -1, -1, 0);   // one Q tile (d 256), causal
  add(1, 70, 200, 2, 2, 192, false, false, 60, 3, 0);   // d 192, window
  add(1, 40, 140, 2, 2, 24, true, false, -1, -1, 0);    // d 24: half a k16 step
  cases.push_back(fa::test::forward_case(1, 90, 333, 2, 1, 64, 128, true, true, -1, -1, 0, 1190));
  cases.push_back(fa::test::forward_case(1, 33, 129, 2, 2, 192, 128, false, false, -1, -1, 0,
                                         1191));  // d != dv both ways
  // Scores of standard deviation ~23 in the log2 domain: tile maxima apart
  // by far more than 2^8, so O is rescaled in tensor memory often (the
  // conditional rescale's path; without it this case fails).
  add(1, 260, 900, 2, 1, 64, false, false, -1, -1, 0);
  cases.back().input_scale = 4.0f;
  add(1, 130, 700, 2, 2, 128, true, true, -1, -1, 0);
  cases.back().input_scale = 4.0f;
  // The fp8 forward (kind::f8f6f4 on the bytes, P in e4m3, FlashAttention-3's
  // fp8 softmax form): e4m3 and e5m2, per-tensor and per-(batch, KV head)
  // descales (one transposed), two Q tiles and one.
  auto fp8 = [&](int q, int kv, int descale) {
    cases.back().q_fp8 = q;
    cases.back().kv_fp8 = kv;
    cases.back().descale = descale;
  };
  add(2, 200, 333, 4, 2, 128, true, true, -1, -1, 0);
  fp8(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E4M3, 2);
  cases.back().padded_strides = true;  // byte strides with gaps in the tensor maps
  add(1, 100, 260, 2, 1, 64, false, false, -1, -1, 0);
  fp8(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, 1);
  add(1, 90, 300, 2, 2, 256, true, false, 70, 0, 0);
  fp8(FA_DTYPE_FP8_E5M2, FA_DTYPE_FP8_E5M2, 3);
  std::string failures;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  for (const auto &c : cases) {
    const std::string e = fa::test::run_forward(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    fa_emu_profile prof = FA_EMU_PROFILE_INIT;
    if (fa_emulator_profile(rt, &prof) != FA_SUCCESS ||
        std::strstr(prof.kernel, "fa_forward_tc05_") == nullptr)
      failures += c.describe() + ": ran " + prof.kernel + ", not the sm_100a forward\n";
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  return fa::test::run_numerics_suite("numerics_emulator_sm100a", FA_BACKEND_EMULATOR, false, 100);
}
