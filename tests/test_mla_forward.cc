// The forward over MLA's latent cache on sm_100a (issue 29: "the MLA/512
// shapes"): fa_launch with head_dim 576, head_dim_v 512 and V passed as
// the first 512 columns of K's memory runs the sm_100a MLA kernel
// (kgen::generate_decode_mla with spec.tcgen05; Runtime::forward_as_decode)
// at any seqlen_q, the query heads x tokens packed 64 rows a CTA. With one
// split (the plan's, or no workspace for more) each CTA writes O and the
// LSE itself (KernelSpec::direct_out, entry `_out`: no workspace, no
// combine, sinks in the kernel; with cu_seqlens_q always, entry `_varlen`);
// with the caller's workspace and more splits, the partial states and the
// combine. On the emulator at SM 100,
// each case through the numerics runner (fresh random inputs, O and LSE
// poisoned first, fp64 reference; paged caches shuffled with NaN in the
// unused pages) and checked by the last launch's entry name; fa_generate_for
// with v_in_k gives the module the fixed-length case ran. The policy off
// (FLASHATTN_SM100_MLA=0) runs the mma.sync forward on the first case.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

// A DeepSeek-shaped forward through fa_launch: hq query heads over hkv
// latent heads, V in K, causal (bottom-right), sequences of lens[b] keys.
fa::test::DecodeCase mla(const std::vector<int> &lens, int seqlen_q, int max_k, int hq, int hkv,
                         uint32_t seed) {
  fa::test::DecodeCase d =
      fa::test::prefill_case(lens, seqlen_q, max_k, hq, hkv, 576, true, FA_KV_CONTIGUOUS, 0, seed);
  d.head_dim_v = 512;
  d.v_in_k = true;
  return d;
}

// A causal bf16 config at 576 / 512, hq query heads over one latent head
// (null on failure).
fa_config *mla_config(int hq) {
  fa_config_desc cd = FA_CONFIG_DESC_INIT;
  cd.dtype = FA_DTYPE_BF16;
  cd.head_dim = 576;
  cd.head_dim_v = 512;
  cd.num_heads_q = hq;
  cd.num_heads_kv = 1;
  cd.causal = 1;
  fa_config *cfg = nullptr;
  return fa_config_create(&cd, &cfg) == FA_SUCCESS ? cfg : nullptr;
}

struct Expect {
  fa::test::DecodeCase c;
  const char *kernel;  // the last launch's entry starts with it
  const char *has;     // ... and contains it ("" none)
};

}  // namespace

int main(void) {
  const bool quick = std::getenv("FA_TEST_QUICK") != nullptr;
  std::string failures;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  uint32_t seed = 7300;
  const char *direct = "fa_decode_tc05_";
  std::vector<Expect> cases;
  {  // Fixed length (no seqused_k), 16 heads x 8 tokens (2 m-blocks), no
     // workspace: one split writing O.
    fa::test::DecodeCase d = mla({150, 150}, 8, 150, 16, 1, seed++);
    d.prefill_fixed = true;
    cases.push_back({d, direct, "_fixedlen_out"});
  }
  {  // seqused_k with an empty sequence, pages of 64 (shuffled), sinks and
     // a window, 128 heads x 2 tokens: the sinks in the kernel.
    fa::test::DecodeCase d = mla({200, 0, 77}, 2, 200, 128, 1, seed++);
    d.kv.layout = FA_KV_PAGED;
    d.kv.page_size = 64;
    d.window_left = 90;
    d.sinks.resize(128);
    for (int h = 0; h < 128; ++h) d.sinks[h] = 0.25f * static_cast<float>(h % 9) - 1.0f;
    cases.push_back({d, direct, "_sinks_vink_out"});
  }
  {  // cu_seqlens_q (vLLM's chunked prefill against the latent cache): 8,
     // 0 and 5 new tokens over 150, 90 and 200 keys (seqused_k) on pages of
     // 64, 16 heads: the packed rows' O and LSE [heads, total_q].
    fa::test::DecodeCase d = mla({150, 90, 200}, 8, 200, 16, 1, seed++);
    d.prefill_q = {8, 0, 5};
    d.kv.layout = FA_KV_PAGED;
    d.kv.page_size = 64;
    cases.push_back({d, direct, "_varlen"});
  }
  if (!quick) {
    // ... with 128 heads, a window and sinks (fp16, contiguous).
    fa::test::DecodeCase v = mla({130, 61}, 3, 130, 128, 1, seed++);
    v.prefill_q = {2, 3};
    v.bf16 = false;
    v.window_left = 40;
    v.sinks.resize(128);
    for (int h = 0; h < 128; ++h) v.sinks[h] = 0.5f - 0.01f * static_cast<float>(h);
    cases.push_back({v, direct, "_varlen"});
    // Not causal, fp16, two latent heads of 16 query heads, 9 tokens (3
    // m-blocks each, the last with padding rows), pages of 3.
    fa::test::DecodeCase d = mla({130, 61}, 9, 130, 32, 2, seed++);
    d.causal = false;
    d.bf16 = false;
    d.kv.layout = FA_KV_PAGED;
    d.kv.page_size = 3;
    cases.push_back({d, direct, "_out"});
    // The caller's workspace (what fa_forward_workspace_size asks for) and
    // few rows over many keys: the plan splits, the combine runs last.
    fa::test::DecodeCase s = mla({1500}, 1, 1500, 16, 1, seed++);
    s.workspace = fa::test::kAutoWorkspace;
    cases.push_back({s, "fa_reduce_", ""});
    // ... and the same with no workspace: one split writing O.
    s.workspace = 0;
    s.seed = seed++;
    cases.push_back({s, direct, "_out"});
  }

  fa_runtime *rt = fa::test::emulator_or_fail(100);
  if (rt == nullptr) return 1;
  std::string first;  // the first case's kernel
  for (const Expect &x : cases) {
    const std::string what = x.c.describe();
    const std::string err = fa::test::run_decode(rt, x.c);
    if (!err.empty()) failures += what + ":\n" + err;
    const std::string k = fa::test::emulated_kernel(rt);
    if (k.find(x.kernel) != 0 || k.find(x.has) == std::string::npos)
      failures += what + ": ran " + k + "\n";
    if (first.empty()) first = k;
  }
  {  // fa_generate_for(FA_KERNEL_FORWARD, v_in_k) gives the module the first
     // (fixed-length) case ran; without v_in_k, the mma.sync forward's.
    fa_config *cfg = mla_config(16);
    if (cfg == nullptr) return 1;
    for (int v_in_k = 0; v_in_k < 2; ++v_in_k) {
      fa_generate_options o = FA_GENERATE_OPTIONS_INIT;
      o.v_in_k = v_in_k;
      size_t n = 0;
      std::string ptx;
      if (fa_generate_for(cfg, FA_KERNEL_FORWARD, 100, &o, nullptr, 0, &n) == FA_SUCCESS) {
        ptx.assign(n + 1, '\0');
        fa_generate_for(cfg, FA_KERNEL_FORWARD, 100, &o, &ptx[0], ptx.size(), &n);
      }
      const std::string want = v_in_k ? ".entry " + first + "(" : ".entry fa_forward_mma_";
      if (ptx.find(want) == std::string::npos)
        failures +=
            "fa_generate_for forward v_in_k=" + std::to_string(v_in_k) + ": not " + want + "\n";
    }
    fa_config_destroy(cfg);
  }
  {  // The policy off: the mma.sync forward (two O slices), as before.
    fa::test::PolicyScope off(rt, &fa::KernelPolicy::sm100_mla, false);
    const fa::test::DecodeCase &d = cases[0].c;
    const std::string err = fa::test::run_decode(rt, d);
    if (!err.empty()) failures += d.describe() + " (policy off):\n" + err;
    const std::string k = fa::test::emulated_kernel(rt);
    if (k.find("fa_forward_mma_") != 0) failures += d.describe() + " (policy off): ran " + k + "\n";
  }
  {  // fa_forward_workspace_size: nothing where the plan has one split (a
     // prefill: 64 CTAs a sequence), the partial states where it splits (one
     // token over 100k keys), and V elsewhere than K's memory: the mma.sync
     // forward, no workspace.
    fa_config *cfg = mla_config(128);
    if (cfg == nullptr) return 1;
    struct Size {
      int sq, sk;
      bool v_in_k, want_zero;
    };
    for (const Size &z : {Size{4096, 4096, true, true}, Size{1, 100000, true, false},
                          Size{1, 100000, false, true}}) {
      fa_forward_args a = FA_FORWARD_ARGS_INIT;
      a.batch = 1;
      a.seqlen_q = z.sq;
      a.seqlen_k = z.sk;
      const uint64_t base = uint64_t(1) << 32;
      for (fa_tensor *t : {&a.q, &a.k, &a.v, &a.o}) {
        const bool kv = t == &a.k || t == &a.v;
        const int64_t d = t == &a.o ? 512 : t == &a.v && !z.v_in_k ? 512 : 576;
        const int64_t row = (kv ? 1 : 128) * d;
        const int64_t st[4] = {(kv ? z.sk : z.sq) * row, row, d, 1};
        t->data = base + (t == &a.v && !z.v_in_k ? (uint64_t(1) << 31) : t == &a.v ? 0 : 0);
        for (int i = 0; i < 4; ++i) t->stride[i] = st[i];
      }
      a.q.data = base + (uint64_t(1) << 33);
      a.o.data = base + (uint64_t(1) << 34);
      if (z.v_in_k) {  // V: K's first 512 columns, K's strides
        a.v = a.k;
      }
      size_t bytes = 1;
      const fa_status st = fa_forward_workspace_size(rt, cfg, &a, &bytes);
      if (st != FA_SUCCESS || (bytes == 0) != z.want_zero)
        failures += "fa_forward_workspace_size sq" + std::to_string(z.sq) + " sk" +
                    std::to_string(z.sk) + (z.v_in_k ? " v_in_k" : "") + ": status " +
                    std::to_string(st) + ", " + std::to_string(bytes) + " bytes\n";
    }
    fa_config_destroy(cfg);
  }
  fa_runtime_destroy(rt);
  unsetenv("FLASHATTN_EMU_PROFILE");
  return fa::test::finish(failures,
                          "the forward over MLA's latent cache on sm_100a (tcgen05; 576 / 512, "
                          "V in K) against fp64 on the emulator");
}
