// The sm_100a forward (tcgen05.mma, tensor memory, TMA, warp roles:
// FlashAttention-4's structure; docs/kernels.md, "Forward on sm_100a") on
// an emulated sm_100: cases aimed at its machinery, each checked to have
// run that kernel, then the numerics suite at SM 100
// (the default there, FLASHATTN_SM100_FORWARD=1 pins it, =0 keeps the
// mma.sync forward; calls it does not cover run the mma.sync forward).
// First checks that the runtime picks it. Then its gather variant (varlen, chunked prefill over
// every KV layout) and split-KV (partial states, then the combine).
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

// The module fa_generate writes for a forward at head_dim 128 on `sm`.
std::string generated(int sm) {
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 128;
  d.num_heads_q = d.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  size_t n = 0;
  if (fa_config_create(&d, &cfg) != FA_SUCCESS ||
      fa_generate(cfg, FA_KERNEL_FORWARD, sm, nullptr, 0, &n) != FA_SUCCESS)
    return "";
  std::string ptx(n + 1, '\0');
  fa_generate(cfg, FA_KERNEL_FORWARD, sm, &ptx[0], ptx.size(), &n);
  fa_config_destroy(cfg);
  return ptx;
}

int main(void) {
  // The default (the variable unset) and FLASHATTN_SM100_FORWARD=0.
  unsetenv("FLASHATTN_SM100_FORWARD");
  const std::string dflt = generated(100);
  setenv("FLASHATTN_SM100_FORWARD", "0", 1);
  const std::string off = generated(100);
  if (dflt.find("fa_forward_tc05_") == std::string::npos ||
      off.find("fa_forward_mma_") == std::string::npos) {
    std::printf(
        "FAIL: the sm_100a forward is not the default on sm 100, or "
        "FLASHATTN_SM100_FORWARD=0 does not keep the mma.sync forward\n");
    return 1;
  }
  setenv("FLASHATTN_SM100_FORWARD", "1", 1);
  // The selection: fa_generate for sm 100 and 103 gives the tcgen05 module.
  for (int sm : {100, 103}) {
    const std::string ptx = generated(sm);
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
  add(1, 5, 3, 2, 1, 64, false, false, -1, -1, 0);       // shorter than a box, one tile
  add(1, 300, 1000, 2, 1, 128, true, true, -1, -1, 0);   // causal, 8 tiles, both Q tiles
  add(2, 131, 259, 4, 2, 64, true, false, -1, -1, 0);    // tails inside atoms, GQA
  add(1, 200, 700, 2, 2, 96, false, false, 150, 20, 0);  // window, d 96 (partial atom)
  add(1, 64, 130, 2, 2, 32, true, false, -1, -1, 30);    // softcap, small d
  add(1, 257, 257, 1, 1, 128, false, true, -1, -1, 0);   // the second m-block's one row
  add(1, 20, 500, 2, 1, 16, true, false, 5, 0, 0);       // window: one tile a row, d 16
  cases.back().sinks = {0.5f, -1.0f};                    // with a sink per head
  add(2, 100, 300, 4, 2, 64, false, true, -1, -1, 0);    // ALiBi, causal
  cases.back().alibi = {0.25f, 0.125f, 0.0625f, 0.03125f};
  add(1, 150, 290, 2, 1, 256, true, true, -1, -1, 0);  // one Q tile (d 256), causal
  add(1, 70, 200, 2, 2, 192, false, false, 60, 3, 0);  // d 192, window
  add(1, 40, 140, 2, 2, 24, true, false, -1, -1, 0);   // d 24: half a k16 step
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
  failures += fa::test::run_on_kernel(rt, cases, "fa_forward_tc05_", "the sm_100a forward");
  // CTA pairs (KernelSpec::cta_pair: tcgen05.mma.cta_group::2, clusters of
  // two; non-causal, no window, head_dim_v 128, head_dim 128..256): one
  // pair over a ring that wraps (GQA), one m-block (the pair's odd CTA past
  // seqlen_q), three m-blocks (a full pair and a padded one) with rescales
  // (scaled scores), head_dim 160 and 192 (K tiles of odd atom counts),
  // softcap, sinks, ALiBi; then the policy off (one CTA) and a causal call
  // (never paired) on the first.
  std::vector<fa::test::ForwardCase> pairs;
  pairs.push_back(
      fa::test::forward_case(2, 300, 1000, 4, 2, 128, 128, true, false, -1, -1, 0, 1200));
  pairs.push_back(
      fa::test::forward_case(1, 200, 259, 2, 2, 192, 128, false, false, -1, -1, 0, 1201));
  pairs.push_back(
      fa::test::forward_case(1, 600, 333, 2, 1, 128, 128, false, false, -1, -1, 0, 1202));
  pairs.back().input_scale = 4.0f;
  pairs.push_back(
      fa::test::forward_case(1, 513, 130, 2, 2, 160, 128, true, false, -1, -1, 20, 1203));
  pairs.back().sinks = {0.5f, -1.0f};
  pairs.back().alibi = {0.25f, 0.125f};
  failures += fa::test::run_on_kernel(rt, pairs, "_pair", "the sm_100a forward on CTA pairs");
  {
    fa::test::PolicyScope off(rt, &fa::KernelPolicy::sm100_cta_pair, false);
    const std::string e = fa::test::run_forward(rt, pairs[0]);
    const std::string k = fa::test::emulated_kernel(rt);
    if (!e.empty() || k.find("fa_forward_tc05_") != 0 || k.find("_pair") != std::string::npos)
      failures += pairs[0].describe() + " (FLASHATTN_SM100_CTA_PAIR=0): ran " + k + "\n" + e;
  }
  {
    fa::test::ForwardCase c = pairs[0];
    c.causal = true;
    const std::string e = fa::test::run_forward(rt, c);
    const std::string k = fa::test::emulated_kernel(rt);
    if (!e.empty() || k.find("fa_forward_tc05_") != 0 || k.find("_pair") != std::string::npos)
      failures += c.describe() + " (causal: one CTA): ran " + k + "\n" + e;
  }
  // The gather warps (cp.async rows instead of TMA boxes): varlen, and
  // chunked prefill with seqused_k over every KV layout (paged by tile and
  // by row, NHD and HND, shared prefix pages, pointer arrays), sequences
  // shorter than a tile and empty ones; fp8 over a paged cache.

  std::vector<fa::test::ForwardCase> varlen;
  auto add_varlen = [&](std::vector<int> sq, std::vector<int> sk, int hq, int hkv, int dd,
                        bool bf16, bool causal, int wl, float cap) {
    varlen.push_back(fa::test::varlen_case(sq, sk, hq, hkv, dd, dd, bf16, causal, wl, cap,
                                           static_cast<uint32_t>(varlen.size() + 1150)));
  };
  add_varlen({5, 300, 64}, {300, 7, 129}, 4, 2, 128, true, true, -1, 0);
  add_varlen({1, 0, 77}, {9, 40, 0}, 2, 1, 64, false, false, -1, 0);
  add_varlen({140, 33}, {141, 260}, 2, 2, 256, true, false, 20, 0);
  add_varlen({64, 129}, {200, 129}, 4, 1, 96, false, true, -1, 25);
  failures +=
      fa::test::run_on_kernel(rt, varlen, "fa_forward_tc05_gather_", "the sm_100a gather forward");
  const std::vector<fa::test::DecodeCase> prefill = fa::test::prefill_layout_cases(40, 1160);
  failures +=
      fa::test::run_on_kernel(rt, prefill, "fa_forward_tc05_gather_", "the sm_100a gather forward");
  // Split-KV (few CTAs, the workspace fa_forward_workspace_size asks for):
  // the split kernel writes partial states and the combine runs last (the
  // profile's kernel); which forward wrote them is read from the profile
  // lines the emulator prints for every launch (stderr, captured).
  auto splits = [&](fa::test::ForwardCase c, const char *what) {
    c.workspace = fa::test::kAutoWorkspace;
    std::fflush(stderr);
    const int saved = dup(2);
    FILE *log = std::tmpfile();
    if (!std::getenv("FA_TEST_NO_CAPTURE")) dup2(fileno(log), 2);
    const std::string e = fa::test::run_forward(rt, c);
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string text;
    std::rewind(log);
    for (int ch; (ch = std::fgetc(log)) != EOF;) text.push_back(static_cast<char>(ch));
    std::fclose(log);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    const size_t at = text.find("profile: fa_forward_tc05_");
    if (at == std::string::npos || text.find("_split", at) == std::string::npos ||
        fa::test::emulated_kernel(rt).find("fa_reduce_") != 0)
      failures += std::string(what) + ": not the sm_100a split forward then the combine\n";
  };
  splits(fa::test::forward_case(1, 100, 3000, 2, 1, 128, 128, true, true, -1, -1, 0, 1180),
         "split, causal");
  {
    fa::test::ForwardCase c =
        fa::test::forward_case(1, 300, 2500, 4, 2, 64, 64, false, false, 200, 50, 0, 1181);
    c.alibi = {0.25f, 0.125f, 0.0625f, 0.03125f};
    splits(c, "split, window, ALiBi");
    c = fa::test::forward_case(1, 64, 2000, 2, 2, 128, 128, true, false, -1, -1, 0, 1182);
    c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E4M3;
    splits(c, "split, fp8");
    c = varlen.front();
    c.seqlens_q = {50, 200};
    c.seqlens_k = {1500, 900};
    c.batch = 2;
    c.seqlen_q = 200;
    c.seqlen_k = 1500;
    splits(c, "split, varlen");
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  // The whole suite and both fixtures, each forward case the kernel takes
  // checked to have run it (the profile's kernel name).
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm100a", FA_BACKEND_EMULATOR, false, 100,
                                      "fa_forward_tc05_");
}
