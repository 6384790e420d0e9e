// The sm_90a MLA decode (KernelPolicy::sm90_mla, kgen::generate_decode_mla;
// issue 28 item 1) on the emulator at SM 90: DeepSeek's latent cache (one KV
// head of 576 = 512 + 64, V = K's first 512 columns passed as the same
// memory), query heads x new tokens packed 64 rows a CTA, the two consumer
// warpgroups summing half of Q K^T each and owning half of O. Each case runs
// through the numerics runner (fresh random inputs, outputs poisoned first,
// fp64 reference; paged caches shuffled with NaN in the unused pages); a
// case asking for the partial states only (the kernel's own output) must
// have run the wgmma kernel (the emulator profile's last launch:
// `fa_decode_wgmma_`), the others run the combine after it. Cases: 16 heads on pages of 64 with 3
// splits, 128 heads x 2 speculative tokens (4 m-blocks) on a contiguous
// cache, pages of 1 and 3, a sliding window, an empty sequence, fp16, the
// batch-invariant split (2048 keys: not a multiple of the kernel's key
// tile), partial states only, and a second KV head; an fp8 latent cache
// (tests/support/fp8_kv: e4m3 and e5m2 with descales, bf16 and fp16, pages
// of 64 and 3, an empty sequence with +inf descales, sinks through the
// combine). The policy off runs the mma.sync decode (two O slices) on the
// first two cases of each list. Split counters given (fa_decode's fused
// combine) and FLASHATTN_PDL=1 must leave the MLA kernels as they are:
// before, on sm_100 the first ran the MLA kernel marked fused with no
// combine (O never written) and the second generated no PTX.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/fp8_kv.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

// DeepSeek-shaped decode: heads_q over heads_kv latent heads, V in K.
fa::test::DecodeCase mla(int batch, int seqlen_q, int max_k, int hq, int hkv, uint32_t seed) {
  fa::test::DecodeCase d =
      fa::test::decode_case(batch, seqlen_q, max_k, hq, hkv, 576, true, seed, 61);
  d.head_dim_v = 512;
  d.causal = true;
  d.v_in_k = true;
  return d;
}

}  // namespace

int main(void) {
  const bool quick = std::getenv("FA_TEST_QUICK") != nullptr;
  std::string failures;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  uint32_t seed = 5800;
  std::vector<fa::test::DecodeCase> cases;
  {  // 16 heads (one m-block, 48 padding rows) on shuffled pages of 64, 3
     // splits: the partial states (the kernel's own output, by name), then
     // through the combine.
    fa::test::DecodeCase d = mla(2, 1, 300, 16, 1, seed++);
    d.kv.layout = FA_KV_PAGED;
    d.kv.page_size = 64;
    d.num_splits = 3;
    d.partials_only = true;
    cases.push_back(d);
    d.partials_only = false;
    d.seed = seed++;
    cases.push_back(d);
    // With split counters given (fa_decode's fused combine): the MLA
    // kernels never fuse it, so the combine kernel must still run.
    d.split_counters = true;
    d.seed = seed++;
    cases.push_back(d);
  }
  {  // 128 heads x 2 tokens (multi-token prediction): 4 m-blocks; contiguous.
    fa::test::DecodeCase d = mla(1, 2, 130, 128, 1, seed++);
    d.partials_only = true;
    cases.push_back(d);
  }
  if (!quick) {
    // Pages of 1 and of 3 (every row its own lookup), automatic splits.
    for (int page : {1, 3}) {
      fa::test::DecodeCase d = mla(2, 1, 150, 16, 1, seed++);
      d.kv.layout = FA_KV_PAGED;
      d.kv.page_size = page;
      d.partials_only = true;
      cases.push_back(d);
    }
    // A sliding window over 2 tokens x 32 heads (one full m-block), fp16.
    fa::test::DecodeCase w = mla(2, 2, 220, 32, 1, seed++);
    w.window_left = 70;
    w.bf16 = false;
    w.partials_only = true;
    cases.push_back(w);
    // An empty sequence between two others.
    fa::test::DecodeCase e = mla(3, 1, 120, 16, 1, seed++);
    e.cache_seqlens = {120, 0, 47};
    e.num_splits = 2;
    e.partials_only = true;
    cases.push_back(e);
    // Batch-invariant splits of 2048 keys (tiles of 48 from each split's
    // first key), two KV heads of 8 query heads each, pages of 64.
    fa::test::DecodeCase bi = mla(2, 1, 2200, 16, 2, seed++);
    bi.batch_invariant = true;
    bi.kv.layout = FA_KV_PAGED;
    bi.kv.page_size = 64;
    cases.push_back(bi);
  }
  // An fp8 latent cache (e4m3 / e5m2 bytes times a descale, converted to
  // Q's 16-bit type by the producer): 16 heads on shuffled pages of 64
  // with 3 splits and per-(batch, KV head) descales; 128 heads x 2 tokens,
  // e5m2, fp16, one descale; pages of 3 (HND) with an empty sequence whose
  // descales are +inf (O = 0, LSE = -inf); through the combine with sinks.
  std::vector<fa::test::fp8kv::Case> fp8;
  {
    using fa::test::fp8kv::base;
    fa::test::fp8kv::Case c = base(2, 1, 200, 16, 1, 576, seed++);
    c.dv = 512;
    c.v_in_k = c.bf16 = c.causal = true;
    c.layout = fa::test::fp8kv::kPagedNhd;
    c.page_size = 64;
    c.splits = 3;
    fp8.push_back(c);
    if (!quick) {
      fa::test::fp8kv::Case m = base(1, 2, 110, 128, 1, 576, seed++);
      m.dv = 512;
      m.v_in_k = m.causal = m.e5m2 = true;
      m.descale = 1;
      fp8.push_back(m);
      fa::test::fp8kv::Case p = base(3, 1, 90, 16, 1, 576, seed++);
      p.dv = 512;
      p.v_in_k = p.bf16 = true;
      p.layout = fa::test::fp8kv::kPagedHnd;
      p.page_size = 3;
      p.lens[1] = 0;
      p.inf_descale_seq = 1;
      fp8.push_back(p);
      c.direct = c.sinks = true;
      c.seed = seed++;
      fp8.push_back(c);
    }
  }
  // Each list at SM 90 (the sm_90a kernel, FLASHATTN_SM90_MLA) and at SM
  // 100 (the sm_100a one, on by default). The policy off (the mma.sync
  // decode, whose MLA shapes the numerics suites cover) runs the first two
  // cases of each list at SM 90: the same inputs through both kernels.
  struct Target {
    int sm;
    bool fa::KernelPolicy::*policy;
    const char *kernel, *name;
  };
  const Target targets[] = {{90, &fa::KernelPolicy::sm90_mla, "fa_decode_wgmma_", "sm90 mla"},
                            {100, &fa::KernelPolicy::sm100_mla, "fa_decode_tc05_", "sm100 mla"}};
  for (const Target &tg : targets) {
    fa_runtime *rt = fa::test::emulator_or_fail(tg.sm);
    if (rt == nullptr) return 1;
    for (bool on : {true, false}) {
      if ((quick || tg.sm != 90) && !on) continue;
      fa::test::PolicyScope scope(rt, tg.policy, on);
      const std::string tag = on ? std::string(" (") + tg.name + ")" : " (policy off)";
      const size_t n_fp8 = on ? fp8.size() : std::min<size_t>(2, fp8.size());
      for (size_t i = 0; i < n_fp8; ++i) {
        fa::test::fp8kv::Case c = fp8[i];
        c.kernel = on ? tg.kernel : "fa_decode_mma_";
        const std::string err = fa::test::fp8kv::run_case(rt, c);
        if (!err.empty()) failures += c.describe() + tag + ":\n" + err;
      }
      for (size_t i = 0; i < (on ? cases.size() : std::min<size_t>(2, cases.size())); ++i) {
        const fa::test::DecodeCase &d = cases[i];
        const std::string what = d.describe() + tag;
        const std::string err = fa::test::run_decode(rt, d);
        if (!err.empty()) failures += what + ":\n" + err;
        // The profile names the last launch: the decode kernel itself when
        // only partial states are asked for, else the combine.
        const std::string k = fa::test::emulated_kernel(rt);
        const bool ok =
            d.partials_only ? (k.find(tg.kernel) == 0) == on : k.find("fa_reduce_") == 0;
        if (!ok) failures += what + ": ran " + k + "\n";
      }
    }
    {  // FLASHATTN_PDL=1 (programmatic launches) leaves the MLA kernel as
       // it is (it has no griddepcontrol form): the same kernel, no error.
      fa::test::PolicyScope mla_on(rt, tg.policy, true);
      fa::test::PolicyScope pdl(rt, &fa::KernelPolicy::pdl, true);
      const fa::test::DecodeCase &d = cases[0];
      const std::string err = fa::test::run_decode(rt, d);
      const std::string k = fa::test::emulated_kernel(rt);
      if (!err.empty() || k.find(tg.kernel) != 0)
        failures += d.describe() + " (pdl on): ran " + k + "\n" + err;
    }
    fa_runtime_destroy(rt);
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  return fa::test::finish(failures,
                          "sm_90a and sm_100a MLA decodes (wgmma, tcgen05; 576 / 512, V in K) "
                          "against fp64 on the emulator");
}
