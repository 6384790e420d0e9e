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
// Q's ring: head_dim 64, 128 and 256 take two Q buffers (the next item's Q
// copied during this one), head_dim 192 one (its K/V stages leave no
// room); with two and head_dim_v <= 128 an item's O is stored while the
// next item's first S = Q K^T runs (head_dim 256: after it); each form
// ran, TMA and gather.
// fa_forward_workspace_size is 8 with the policy on, 0 off; a misaligned
// or too small workspace is refused naming it, nothing written.
// The gather variant (KernelSpec::gather: cp.async rows from 128 producer
// threads) runs the same checks: varlen with empty sequences (seqlen 0),
// sequences shorter than one m-block and a launch seqlen_q above every
// sequence's (varlen runs by work: only real items), causal with
// seqlen_q > seqlen_k, GQA, and through fa_launch against a KV cache
// (chunked prefill): seqused_k on a contiguous cache and paged caches of
// page 16, 3 (row lookups) and 128 (whole tiles) with shuffled block tables,
// some sequences with no key; and the fp8 forward (its V transposed by the
// producer). Each launch must have run the gather kernel. Varlen runs by
// work (tile::WorkScheduler: only the real items, from the m-block prefix
// each CTA builds): 20 sequences, half empty, on 5 CTAs and on 108 (more
// than the 68 real items: idle CTAs still count out, and the dynamic
// workspace must be zero after); 1030 sequences (above kWorkBatchMax) take
// the padded order. The by-work cases fail with the prefix's m-block count
// off by one and when idle CTAs exit without retiring.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/persistent.h"
#include "support/policy.h"

namespace {

using Case = fa::test::PersistentCase;
using fa::test::varlen_case;

}  // namespace

int main(void) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  setenv("FLASHATTN_EMU_THREADS", "3", 1);  // CTAs race for the dynamic order's tickets
  unsetenv("FLASHATTN_SM90_PERSISTENT");
  fa_runtime *rt = fa::test::emulator_or_fail(90);
  if (rt == nullptr) return 1;
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
  add(1, 200, 200, 3, 1, 192, 192, true, false, -1, -1, 0, 2);   // d192: one Q buffer
  auto add_gather = [&](Case x, int grid) {
    x.grid = grid;
    x.gather = true;
    cases.push_back(x);
  };
  const uint32_t seed = 2800;
  Case g;
  // Varlen: empty sequences, one shorter than an m-block, one of several
  // m-blocks with fewer keys than queries (causal: rows with no key); the
  // launch's seqlen_q 300 would pad the grid to 3 m-blocks (3 x 4 x 5 = 60
  // items; by work, 6 x 4 = 24 real ones).
  g.c =
      varlen_case({0, 37, 260, 0, 129}, {5, 0, 100, 0, 200}, 300, 200, 4, 2, 128, true, true, seed);
  add_gather(g, 7);
  // d64 fp16 not causal, GQA 4, an empty sequence first and last.
  g.c = varlen_case({0, 150, 1, 0}, {0, 90, 300, 0}, 150, 300, 8, 2, 64, false, false, seed + 1);
  add_gather(g, 5);
  // d256 (no ping-pong), 108 CTAs.
  g.c = varlen_case({129, 0, 77}, {140, 10, 77}, 200, 140, 2, 1, 256, false, true, seed + 2);
  add_gather(g, 0);
  // d192: one Q buffer.
  g.c = varlen_case({100, 0, 150}, {120, 30, 150}, 150, 150, 2, 1, 192, true, false, seed + 11);
  add_gather(g, 2);
  // Varlen scheduled by work (tile::WorkScheduler): 20 sequences, half of
  // them empty, lengths 1, 2, 5, 128 and 129 (an m-block prefix off by one
  // drops or adds a block); 68 real items of the padded 240 (grid 5:
  // several items per CTA; 108 CTAs: 40 of them get no item, and the
  // dynamic order's last one out must still reset the workspace).
  {
    const std::vector<int> sq = {0, 37,  0, 129, 0, 1, 0, 300, 0, 5,
                                 0, 260, 0, 128, 0, 2, 0, 64,  0, 200};
    const std::vector<int> sk = {9, 140, 0, 100, 3, 0, 0, 290, 1, 64,
                                 0, 300, 5, 128, 0, 7, 2, 200, 0, 33};
    g.c = varlen_case(sq, sk, 300, 300, 4, 2, 64, true, true, seed + 8);
    add_gather(g, 5);
    g.c = varlen_case(sq, sk, 300, 300, 4, 2, 64, false, false, seed + 9);
    add_gather(g, 0);
  }
  // Above tile::kWorkBatchMax sequences (1030): the padded order, its
  // items past their sequence skipped.
  {
    std::vector<int> sq(1030, 0), sk(1030, 0);
    for (size_t b = 3; b < sq.size(); b += 101) sq[b] = sk[b] = 1 + static_cast<int>(b % 100);
    sk[3] = 0;
    g.c = varlen_case(sq, sk, 100, 100, 1, 1, 64, false, true, seed + 10);
    add_gather(g, 8);
  }
  // Through fa_launch against a KV cache: seqused_k on a contiguous cache
  // (a sequence with no key: its rows all empty; seqlen_q > seqused_k).
  g = Case();
  g.d = fa::test::prefill_case({0, 300, 90}, 200, 320, 4, 2, 128, true, FA_KV_CONTIGUOUS, 0,
                               seed + 3);
  add_gather(g, 5);
  // Paged, page 16 and 3 (row lookups) and 128 (whole tiles), shuffled tables.
  g.d = fa::test::prefill_case({250, 0, 33}, 140, 256, 6, 2, 64, false, FA_KV_PAGED, 16, seed + 4);
  add_gather(g, 4);
  g.d = fa::test::prefill_case({70, 161}, 130, 170, 4, 1, 128, true, FA_KV_PAGED, 3, seed + 5);
  add_gather(g, 3);
  g.d =
      fa::test::prefill_case({256, 5, 200}, 150, 256, 2, 2, 64, false, FA_KV_PAGED, 128, seed + 6);
  add_gather(g, 5);
  // The fp8 forward (gather, V transposed by the producer), varlen.
  g = Case();
  g.c = varlen_case({0, 140, 20}, {30, 150, 0}, 160, 150, 4, 2, 128, false, true, seed + 7);
  g.c.q_fp8 = g.c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  add_gather(g, 4);
  // The dynamic order's workspace: zeroed once, here; every launch must
  // leave it zero.
  uint64_t ws = 0;
  if (fa_malloc(rt, 64, &ws) != FA_SUCCESS || fa_memset(rt, ws, 0, 64) != FA_SUCCESS) {
    std::printf("FAIL: workspace: %s\n", fa_last_error());
    return 1;
  }
  std::string failures = fa::test::check_workspace_api(rt, &fa::KernelPolicy::sm90_persistent, ws);
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  // Persistent runs by [gather][form]: one Q buffer; two; two with the
  // held item's store during the next item's first S = Q K^T (head_dim_v
  // <= 128).
  int q_ring[2][3] = {};
  for (Case &x : cases) {
    std::string kernel[fa::test::kPersistentRuns];
    failures += fa::test::run_persistent(rt, x, &fa::KernelPolicy::sm90_persistent, ws, kernel);
    for (int run = 0; run < fa::test::kPersistentRuns; ++run) {
      const std::string &k = kernel[run];
      const bool is_p = k.find("_persistent") != std::string::npos;
      const bool is_d = k.find("_dynamic") != std::string::npos;
      const bool is_g = k.find("fa_forward_wgmma_gather_") == 0;
      if (k.find("fa_forward_wgmma_") != 0 || is_p != (run > 0) || is_d != (run >= 2) ||
          is_g != x.gather)
        failures += x.describe() + fa::test::kPersistentRunName[run] + ": ran " + k + "\n";
      if (is_p) {
        const bool two = k.find("_q2") != std::string::npos;
        const size_t dv = k.find("_dv");
        ++q_ring[is_g][two ? 1 + (std::atoi(k.c_str() + dv + 3) <= 128) : 0];
      }
    }
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  // Every form of Q's ring (KernelSpec::q_stages) ran, TMA and gather.
  const char *forms[] = {"one Q buffer", "two Q buffers", "two Q buffers and the overlapped store"};
  for (int g = 0; g < 2; ++g)
    for (int q = 0; q < 3; ++q)
      if (q_ring[g][q] == 0)
        failures +=
            std::string(g ? "gather" : "TMA") + ": no persistent run with " + forms[q] + "\n";
  fa_free(rt, ws);
  fa_runtime_destroy(rt);
  return fa::test::finish(failures, std::to_string(cases.size()) +
                                        " cases (TMA and gather): static and dynamic persistent O "
                                        "and LSE bit-identical to one CTA per item; workspace "
                                        "zero after each launch");
}
