// The persistent mma.sync forward (KernelSpec::persistent on the
// FlashAttention-2-style kernel, KernelPolicy::sm80_persistent; docs/
// kernels.md, "Persistent mma.sync forward") on an emulated sm_80 (and
// sm_89 for the fp8 forward on the fp8 mma): each case runs through the
// numerics runner (fresh random inputs, outputs poisoned first, O and LSE
// against the fp64 reference) on the one-CTA-per-item kernel, persistent in
// the static order, and in the dynamic order (a workspace given: items
// handed out by an atomic ticket counter) twice back to back on one
// workspace, CTAs on 3 emulator host threads; every persistent run must
// agree bit for bit in O and LSE with the first, and the workspace must be
// zero after each dynamic run (the last CTA out resets it).
// The persistent grid is forced small (KernelPolicy::persistent_grid):
// several items per CTA, item counts not a multiple of the grid; one case
// keeps the emulator's 108 SMs x min_ctas. Cases: seqlen_q = 1, causal
// with seqlen_q > seqlen_k (m-blocks and rows with no key), windows both
// ways and left only, GQA, head_dim 64 / 128 / 256 and d != dv, fp16 and
// bf16, softcap, sinks with ALiBi (the item's head read back in the
// epilogue), the fp8 forward (descales per batch and KV head); varlen
// with empty sequences, by work (tile::WorkScheduler) and above
// tile::kWorkBatchMax sequences (the padded order, items past a sequence
// skipped); through fa_launch against a KV cache (chunked prefill):
// seqused_k on a contiguous cache, paged caches of page 64 and 3. Each
// launch's kernel is checked by name (the emulator profile).
// fa_forward_workspace_size is 8 with the policy on, 0 off; a misaligned
// or too small workspace is refused naming it.
// FA_TEST_QUICK=1 keeps every third case.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/persistent.h"

namespace {

using Case = fa::test::PersistentCase;
using fa::test::varlen_case;

// The problems with the kernels x's runs ran: the mma.sync forward,
// persistent from the second run, dynamic from the third.
std::string check_kernels(const Case &x, const std::string kernel[]) {
  std::string failures;
  for (int run = 0; run < fa::test::kPersistentRuns; ++run) {
    const std::string &k = kernel[run];
    const bool is_p = k.find("_persistent") != std::string::npos;
    const bool is_d = k.find("_dynamic") != std::string::npos;
    if (k.find("fa_forward_mma_") != 0 || is_p != (run > 0) || is_d != (run >= 2))
      failures += x.describe() + fa::test::kPersistentRunName[run] + ": ran " + k + "\n";
  }
  return failures;
}

std::vector<Case> sm80_cases() {
  std::vector<Case> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int dd, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap, int grid) -> Case & {
    Case x;
    x.c = fa::test::forward_case(b, sq, sk, hq, hkv, dd, dv, bf16, causal, wl, wr, cap,
                                 static_cast<uint32_t>(cases.size() + 4700));
    x.grid = grid;
    cases.push_back(x);
    return cases.back();
  };
  add(2, 300, 300, 4, 2, 128, 128, true, true, -1, -1, 0, 5);    // 24 items on 5 CTAs
  add(3, 1, 200, 4, 1, 64, 64, false, true, -1, -1, 0, 5);       // seqlen_q = 1, GQA 4
  add(2, 300, 100, 3, 3, 128, 128, false, true, -1, -1, 0, 4);   // rows and m-blocks with no key
  add(1, 260, 517, 4, 2, 64, 64, true, false, 100, 30, 0, 3);    // window both ways
  add(1, 200, 300, 3, 1, 256, 256, false, true, -1, -1, 30, 4);  // d256, softcap
  add(2, 129, 129, 2, 1, 96, 64, true, false, 40, -1, 0, 3);     // d != dv, left window alone
  add(4, 200, 140, 4, 2, 64, 64, false, true, -1, -1, 0, 0);     // 32 items, 108 x min_ctas CTAs
  {
    Case &x = add(2, 150, 180, 4, 2, 64, 64, false, true, -1, -1, 0, 3);  // sinks + ALiBi
    x.c.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
    x.c.alibi = {0.25f, 0.125f, 0.0625f, 0.5f};
  }
  const uint32_t seed = 4800;
  Case g;
  // Varlen by work: empty sequences, one shorter than an m-block, one of
  // several m-blocks with fewer keys than queries (causal: rows with no key).
  g.c =
      varlen_case({0, 37, 260, 0, 129}, {5, 0, 100, 0, 200}, 300, 200, 4, 2, 128, true, true, seed);
  g.grid = 7;
  cases.push_back(g);
  // 20 sequences, half of them empty, lengths 1, 2, 5, 128 and 129 (an
  // m-block prefix off by one drops or adds a block).
  g.c = varlen_case({0, 37, 0, 129, 0, 1, 0, 300, 0, 5, 0, 260, 0, 128, 0, 2, 0, 64, 0, 200},
                    {9, 140, 0, 100, 3, 0, 0, 290, 1, 64, 0, 300, 5, 128, 0, 7, 2, 200, 0, 33}, 300,
                    300, 2, 1, 64, false, false, seed + 1);
  g.grid = 5;
  cases.push_back(g);
  // Above tile::kWorkBatchMax sequences (1030): the padded order, its items
  // past their sequence skipped.
  {
    std::vector<int> sq(1030, 0), sk(1030, 0);
    for (size_t b = 3; b < sq.size(); b += 101) sq[b] = sk[b] = 1 + static_cast<int>(b % 100);
    sk[3] = 0;
    g.c = varlen_case(sq, sk, 100, 100, 1, 1, 64, false, true, seed + 2);
    g.grid = 8;
    cases.push_back(g);
  }
  // Through fa_launch against a KV cache: seqused_k on a contiguous cache
  // (a sequence with no key), paged caches of page 64 (whole tiles, d160) and
  // 3 (row lookups, d192) with shuffled block tables (paged on tiles of two
  // m-tiles per warp, d <= 128 on sm_80, runs one CTA per item).
  g = Case();
  g.d = fa::test::prefill_case({0, 300, 90}, 200, 320, 4, 2, 128, true, FA_KV_CONTIGUOUS, 0,
                               seed + 3);
  g.grid = 5;
  cases.push_back(g);
  g.d = fa::test::prefill_case({250, 0, 33}, 140, 256, 4, 2, 160, false, FA_KV_PAGED, 64, seed + 4);
  g.grid = 4;
  cases.push_back(g);
  g.d = fa::test::prefill_case({70, 161}, 130, 170, 4, 1, 192, true, FA_KV_PAGED, 3, seed + 5);
  g.grid = 3;
  cases.push_back(g);
  return fa::test::maybe_quick(cases, 3);
}

// Runs the cases on an emulated sm; the failures.
std::string run_cases(int sm, std::vector<Case> cases, int *runs) {
  fa_runtime *rt = fa::test::emulator_or_fail(sm);
  if (rt == nullptr) return "no emulator runtime for sm_" + std::to_string(sm) + "\n";
  // The dynamic order's workspace: zeroed once, here; every launch must
  // leave it zero.
  uint64_t ws = 0;
  if (fa_malloc(rt, 64, &ws) != FA_SUCCESS || fa_memset(rt, ws, 0, 64) != FA_SUCCESS) {
    fa_runtime_destroy(rt);
    return std::string("workspace: ") + fa_last_error() + "\n";
  }
  std::string failures;
  if (sm == 80)
    failures += fa::test::check_workspace_api(rt, &fa::KernelPolicy::sm80_persistent, ws);
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  for (Case &x : cases) {
    std::string kernel[fa::test::kPersistentRuns];
    failures += fa::test::run_persistent(rt, x, &fa::KernelPolicy::sm80_persistent, ws, kernel);
    failures += check_kernels(x, kernel);
    ++*runs;
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_free(rt, ws);
  fa_runtime_destroy(rt);
  return failures;
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_EMU_THREADS", "3", 1);  // CTAs race for the dynamic order's tickets
  unsetenv("FLASHATTN_SM80_PERSISTENT");
  int runs = 0;
  std::string failures = run_cases(80, sm80_cases(), &runs);
  // The fp8 forward on sm_89's fp8 mma (m16n8k32), descales per (batch,
  // KV head): the item's batch and KV head.
  Case f;
  f.c = varlen_case({0, 140, 20}, {30, 150, 0}, 160, 150, 4, 2, 128, false, true, 4900);
  f.c.q_fp8 = f.c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  f.grid = 4;
  failures += run_cases(89, {f}, &runs);
  return fa::test::finish(failures, std::to_string(runs) +
                                        " cases: static and dynamic persistent mma.sync forward O "
                                        "and LSE bit-identical to one CTA per item; workspace zero "
                                        "after each launch");
}
