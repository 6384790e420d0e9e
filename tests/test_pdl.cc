// Programmatic dependent launch (KernelPolicy::pdl, KernelSpec::pdl,
// LaunchGeometry::programmatic; issue 28 item 3) on the emulator: with the
// policy on, the sm_90 tensor-core decode and every combine are launched as
// programmatic dependents, and the emulator makes any global memory access
// a thread issues before its griddepcontrol.wait a launch error (the
// previous kernel may still run on a GPU). Each case runs through the
// numerics runner (fresh random inputs, outputs poisoned first, against the
// fp64 reference), so it fails if a kernel reads Q, the cache, its tables
// or the partial states, or writes anything, before the wait; and the
// kernel it must have run (the emulator profile's last launch) carries
// `_pdl`: fa_decode's combine, the decode kernel itself (partial states
// only), the combine after a split forward (sm_90a) and after a GQA-packed
// forward (fa_launch on the decode kernel, fixed length). Cases: GQA over a
// contiguous cache, a paged cache (pages of 16, shuffled) with KV append
// and RoPE (the kernel writes the cache), a tree mask, sinks and ALiBi. The
// policy off, or on with sm_80 (no griddepcontrol there), runs the same
// kernels without `_pdl`.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

// A decode case of `batch` sequences of up to max_k keys, head_dim 128.
fa::test::DecodeCase decode(int batch, int seqlen_q, int max_k, int hq, int hkv, bool bf16,
                            uint32_t seed) {
  return fa::test::decode_case(batch, seqlen_q, max_k, hq, hkv, 128, bf16, seed, 97);
}

// "" when the last launch's entry contains `want` and, iff pdl, "_pdl".
std::string ran(fa_runtime *rt, const std::string &want, bool pdl, const std::string &what) {
  const std::string k = fa::test::emulated_kernel(rt);
  if (k.find(want) != 0 || (k.find("_pdl") != std::string::npos) != pdl)
    return what + ": ran " + k + "\n";
  return "";
}

}  // namespace

int main(void) {
  unsetenv("FLASHATTN_PDL");
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  fa_runtime *rt = fa::test::emulator_or_fail(90), *rt80 = fa::test::emulator_or_fail(80);
  if (rt == nullptr || rt80 == nullptr) return 1;
  const bool quick = std::getenv("FA_TEST_QUICK") != nullptr;
  std::string failures;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  uint32_t seed = 4400;
  // (runtime, pdl expected): sm_90 with the policy on and off, sm_80 on.
  struct Run {
    fa_runtime *rt;
    bool policy, pdl;
    const char *name;
  };
  const Run runs[] = {{rt, true, true, "sm90 pdl"},
                      {rt, false, false, "sm90 policy off"},
                      {rt80, true, false, "sm80 policy on"}};
  for (const Run &r : runs) {
    if (quick && !r.pdl) continue;
    fa::test::PolicyScope on(r.rt, &fa::KernelPolicy::pdl, r.policy);
    auto check = [&](const std::string &what, const std::string &err, const std::string &want) {
      if (!err.empty()) failures += what + " (" + r.name + "):\n" + err;
      failures += ran(r.rt, want, r.pdl, what + " (" + r.name + ")");
    };
    {  // GQA over a contiguous cache: the decode kernel, then its combine.
      fa::test::DecodeCase d = decode(3, 1, 700, 8, 2, true, seed++);
      check(d.describe(), fa::test::run_decode(r.rt, d), "fa_reduce_");
      d.partials_only = true;  // the decode kernel is the last launch
      check(d.describe() + " partials", fa::test::run_decode(r.rt, d), "fa_decode_mma_");
    }
    if (!quick) {
      // Paged (pages of 16, shuffled) with KV append and RoPE: the kernel
      // writes the cache.
      fa::test::DecodeCase d = decode(2, 2, 500, 4, 2, false, seed++);
      d.kv.layout = FA_KV_PAGED;
      d.kv.page_size = 16;
      d.seqlen_new = 2;
      d.rotary_dim = 64;
      for (int &s : d.cache_seqlens) s -= 2;
      check(d.describe(), fa::test::run_decode(r.rt, d), "fa_reduce_");
      // A tree mask, sinks and ALiBi.
      fa::test::DecodeCase t = decode(2, 3, 400, 4, 1, true, seed++);
      t.tree = {1, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1};
      t.sinks = {0.5f, -1.0f, 1.5f, 0.0f};
      t.alibi = {0.02f, 0.01f, 0.005f, 0.0025f};
      check(t.describe(), fa::test::run_decode(r.rt, t), "fa_reduce_");
    }
    {  // A split forward (sm_90a; mma.sync on sm_80) and its combine.
      fa::test::ForwardCase c =
          fa::test::forward_case(1, 64, 1500, 4, 2, 128, 128, false, true, -1, -1, 0, seed++);
      c.workspace = fa::test::kAutoWorkspace;
      check(c.describe() + " split", fa::test::run_forward(r.rt, c), "fa_reduce_");
    }
    if (!quick) {
      // GQA packing: a fixed-length fa_launch of 2 queries per sequence
      // (group 4) on the decode kernel (fixed_len), then the combine.
      fa::test::ForwardCase c =
          fa::test::forward_case(2, 2, 600, 8, 2, 128, 128, true, true, -1, -1, 0, seed++);
      c.workspace = fa::test::kAutoWorkspace;
      check(c.describe() + " packed", fa::test::run_forward(r.rt, c), "fa_reduce_");
    }
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  fa_runtime_destroy(rt80);
  return fa::test::finish(failures,
                          "decode, split and packed forwards with programmatic "
                          "dependent launches: no global access before "
                          "griddepcontrol.wait, results against fp64");
}
