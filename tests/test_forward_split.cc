// Split-KV in the sm_90a forward (KernelSpec::split_kv, issue 27 item 3;
// docs/kernels.md, "Split-KV forward") on an emulated sm_90 (108 SMs): a
// forward whose CTAs would leave SMs idle cuts its keys into splits, each
// CTA writes its rows' partial state into the caller's workspace and the
// reduce kernel combines them. Each case runs through the numerics runner
// (fresh random inputs, O and LSE poisoned first, against the fp64
// reference) with the workspace fa_forward_workspace_size asks for (its
// partial-state bytes poisoned too, so a partial read before it is written
// shows) and must have run the split kernel; the same case with the policy
// off must run unsplit and ask for no workspace (one case per kernel). Cases: causal with
// seqlen_q > block_m (splits with no key for some rows: LSE -inf
// partials), a window both ways with GQA, head_dim 256 (block_n 64), d !=
// dv, seqlen_q = 1 over a long context, softcap with sinks (added in the
// combine only) and ALiBi, the fp8 forward, and chunked prefill through
// fa_launch over a paged cache with seqused_k (the gather variant; one
// sequence with no key). Varlen (cu_seqlens_q/k; the partial states padded
// to the longest sequence, the varlen combine packing O and LSE, checked
// by its kernel name), causal, on sm_90a (gather) and sm_80, with an empty
// sequence, a short one and one with more queries than keys, and chunked
// prefill with cu_seqlens_q over a paged cache with seqused_k (sm_90a;
// fails when the combine's packed row, LSE element or padding-row skip, or
// the forward's padded partial stride, is wrong). A workspace one byte
// short or not 256-byte aligned runs unsplit and right; with the persistent policy on the
// workspace is its 8-byte counter and nothing splits. GQA packing: a few
// queries per sequence over a cache run the decode kernel (check_gqa_pack). Fails when
// split_keys is skipped (every split sees every key: LSE off by ln splits)
// or the combine is not launched (O stays poisoned). Under FA_TEST_QUICK=1
// (the sanitizer pass) the first sm_90a and sm_80 cases and the sm_80
// varlen one, no reruns (policy off, short or misaligned workspace,
// persistent), and GQA packing on sm_90 only, packed only, contiguous
// only. The unsplit reruns (policy off) take one case of each kernel and
// the two varlen forwards; GQA packing's policy-off pass, sm_90 only.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "api/test_hooks.h"
#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

using fa::test::kAutoWorkspace;

struct Case {
  fa::test::ForwardCase c;
  fa::test::DecodeCase d;  // d.prefill: through fa_launch over a KV cache
  int sm = 90;             // the emulated SM
  // The unsplit kernel's entry name starts so (and has "_gather_" iff this does).
  std::string kernel = "fa_forward_wgmma_";
  bool rerun = false;  // rerun unsplit (the policy off), checking that kernel
  std::string describe() const { return d.prefill ? d.describe() : c.describe(); }
  // cu_seqlens_q: the combine is the varlen one (KernelSpec::varlen).
  bool varlen() const { return d.prefill ? !d.prefill_q.empty() : c.varlen; }
  std::string run(fa_runtime *rt, uint64_t ws, size_t ws_size) {
    if (d.prefill) {
      d.workspace = ws;
      d.workspace_size = ws_size;
      return fa::test::run_decode(rt, d);
    }
    c.workspace = ws;
    c.workspace_size = ws_size;
    return fa::test::run_forward(rt, c);
  }
};

// "" when rt's last launch was the combine (split; the varlen one iff the
// case is varlen) or the unsplit forward the case expects (the profile
// keeps the last launch only: the split kernel's variant is the unsplit
// one's, checked with the policy off), else the problem.
std::string check_kernel(fa_runtime *rt, const Case &x, bool split, const std::string &what) {
  const std::string k = fa::test::emulated_kernel(rt);
  const bool gather =
      (k.find("_gather_") != std::string::npos) == (x.kernel.find("gather") != std::string::npos);
  const bool varlen_reduce = k.find("_varlen") != std::string::npos;
  if (split ? k.find("fa_reduce_") != 0 || varlen_reduce != x.varlen()
            : k.compare(0, x.kernel.size(), x.kernel) != 0 || !gather ||
                  k.find("_split") != std::string::npos)
    return what + ": ran " + k + "\n";
  return "";
}

// GQA packing (Runtime::forward_as_decode): 2 new queries per sequence x
// 8 query heads per KV head = 16 rows over a cache with seqused_k, and one
// query per sequence over fixed-length K/V without it. fa_launch
// must ask for 256 bytes plus what fa_decode_workspace_size asks for the
// same problem (the decode kernel's partial states), run on the decode
// kernel (the runtime's count, api/test_hooks.h; with the policy off, not)
// and match the fp64 reference, contiguous and paged, packed and (off:
// the policy off too) not.
std::string check_gqa_pack(fa_runtime *rt, int sm, uint32_t seed, bool quick, bool off) {
  std::string failures;
  const std::string at = " (sm" + std::to_string(sm) + ")";
  fa_config *cfg = nullptr;
  fa_forward_args a;
  const uint64_t data = 1 << 20;  // host fields only: never read
  if (!fa::test::host_forward_problem(3, 2, 1024, 16, 2, 128, true, data, &cfg, &a))
    return "gqa pack: fa_config_create failed\n";
  a.seqused_k = data;
  fa_decode_args d = FA_DECODE_ARGS_INIT;
  d.batch = 3;
  d.seqlen_q = 2;
  d.seqlen_k_max = 1024;
  d.q = a.q;
  d.k_cache = a.k;
  d.v_cache = a.v;
  d.o = a.o;
  d.cache_seqlens = data;
  size_t fwd = 0, dec = 0;
  int32_t splits = 0;
  if (fa_forward_workspace_size(rt, cfg, &a, &fwd) != FA_SUCCESS ||
      fa_decode_workspace_size(rt, cfg, &d, &dec, &splits) != FA_SUCCESS || fwd != 256 + dec)
    failures += "gqa pack" + at + ": forward workspace " + std::to_string(fwd) + ", decode's " +
                std::to_string(dec) + " (" + fa_last_error() + ")\n";
  // One launch with the policy `pack`: its errors, and it must have run on
  // the decode kernel exactly when packed (the runtime's count).
  auto route = [&](const std::string &what, int pack, const std::function<std::string()> &run) {
    const uint64_t before = fa::api::forwards_as_decode(rt);
    const std::string e = run();
    const std::string w = what + at + (pack ? " (packed)" : " (policy off)");
    if (!e.empty()) failures += w + ":\n" + e;
    const uint64_t n = fa::api::forwards_as_decode(rt) - before;
    if (n != uint64_t(pack))
      failures += w + ": ran on the decode kernel " + std::to_string(n) + " times\n";
  };
  for (int pack = 1; pack >= (quick || !off ? 1 : 0); --pack) {
    fa::test::PolicyScope p(rt, &fa::KernelPolicy::forward_gqa_pack, pack == 1);
    for (int layout : {FA_KV_CONTIGUOUS, FA_KV_PAGED}) {
      if (quick && layout == FA_KV_PAGED) continue;
      fa::test::DecodeCase c = fa::test::prefill_case({700, 0, 1000}, 2, 1024, 16, 2, 128,
                                                      layout == FA_KV_PAGED, layout, 16, seed++);
      c.workspace = kAutoWorkspace;
      route(c.describe(), pack, [&] { return fa::test::run_decode(rt, c); });
    }
    // Varlen queries (cu_seqlens_q) over a paged cache with seqused_k: the
    // decode kernel's varlen form (each sequence's rows from cu_seqlens_q,
    // aligned to its own keys) and the varlen combine. A vLLM decode batch
    // (at most one query per sequence, one sequence with none) and up to 2
    // queries (one sequence with 2 queries and no key).
    for (const auto &[lens, qs] : {std::pair<std::vector<int>, std::vector<int>>{
                                       {600, 900, 0, 1000}, {1, 1, 1, 0}},
                                   {{700, 0, 1000, 300}, {1, 2, 0, 2}}}) {
      if (quick && qs[1] == 2) continue;
      const int sq = *std::max_element(qs.begin(), qs.end());
      fa::test::DecodeCase c =
          fa::test::prefill_case(lens, sq, 1024, 16, 2, 128, sq == 1, FA_KV_PAGED, 16, seed++);
      c.prefill_q = qs;
      c.workspace = kAutoWorkspace;
      route(c.describe() + " varlen", pack, [&] {
        std::string e = fa::test::run_decode(rt, c);
        const std::string k = fa::test::emulated_kernel(rt);
        if (pack && (k.find("fa_reduce_") != 0 || k.find("_varlen") == std::string::npos))
          e += "ran " + k + ", not the varlen combine\n";
        return e;
      });
    }
    // Fixed-length K/V without seqused_k (one query per sequence, as a
    // decode step through flash_attn_func): the decode kernel's fixed_len
    // form, seqlen_k keys each.
    fa::test::ForwardCase f =
        fa::test::forward_case(2, 1, 1500, 16, 2, 64, 64, pack == 1, true, -1, -1, 0, seed++);
    f.workspace = kAutoWorkspace;
    route(f.describe(), pack, [&] { return fa::test::run_forward(rt, f); });
  }
  fa_config_destroy(cfg);
  return failures;
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  unsetenv("FLASHATTN_SM90_PERSISTENT");
  unsetenv("FLASHATTN_FORWARD_SPLITS");
  fa_runtime *rt = fa::test::emulator_or_fail(90);
  fa_runtime *rt80 = fa::test::emulator_or_fail(80), *rt89 = fa::test::emulator_or_fail(89);
  if (rt == nullptr || rt80 == nullptr || rt89 == nullptr) return 1;
  auto runtime = [&](const Case &x) { return x.sm == 80 ? rt80 : x.sm == 89 ? rt89 : rt; };
  std::vector<Case> cases;
  uint32_t seed = 3100;
  cases.reserve(20);  // add() hands out pointers into it
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int d, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap) {
    Case x;
    x.c = fa::test::forward_case(b, sq, sk, hq, hkv, d, dv, bf16, causal, wl, wr, cap, seed++);
    cases.push_back(x);
    return &cases.back();
  };
  add(1, 200, 2048, 4, 2, 128, 128, false, true, -1, -1, 0);  // 8 CTAs, 4 splits
  add(1, 130, 1500, 4, 1, 64, 64, true, false, 300, 40, 0);   // window both ways, GQA 4
  add(1, 64, 900, 2, 2, 256, 256, true, false, -1, -1, 0);    // d256: block_n 64
  add(2, 100, 1300, 2, 1, 96, 64, false, false, -1, -1, 0);   // d != dv
  add(2, 1, 2000, 8, 2, 128, 128, true, true, -1, -1, 0);     // one query over a long context
  {
    Case *x = add(1, 50, 1200, 4, 2, 128, 128, false, true, -1, -1, 30);  // softcap
    x->c.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
    x->c.alibi = {0.02f, 0.01f, 0.005f, 0.0025f};
  }
  {
    Case *x = add(1, 100, 1100, 4, 2, 128, 128, false, false, -1, -1, 0);  // fp8 (gather)
    x->c.q_fp8 = x->c.kv_fp8 = FA_DTYPE_FP8_E4M3;
    x->kernel = "fa_forward_wgmma_gather_";
  }
  {
    // Chunked prefill: 100 new queries per sequence over a paged cache of
    // 1000, 0 and 1500 keys (pages of 16, shuffled), seqused_k.
    Case x;
    x.kernel = "fa_forward_wgmma_gather_";
    x.d = fa::test::prefill_case({1000, 0, 1500}, 100, 1536, 4, 2, 128, true, FA_KV_PAGED, 16,
                                 seed++);
    cases.push_back(x);
    // The mma.sync forward (sm_80): the same over pages of 3 (row lookups).
    x.sm = 80;
    x.kernel = "fa_forward_mma_";
    x.d = fa::test::prefill_case({700, 1200}, 64, 1200, 4, 1, 64, false, FA_KV_PAGED, 3, seed++);
    cases.push_back(x);
  }
  // The mma.sync forward on sm_80: causal, head_dim 320 (two O column
  // slices, each split), softcap with seqlen_q 1; the fp8 mma forward on
  // sm_89 (its O columns in even / odd blocks).
  for (Case *x : {add(1, 200, 2048, 4, 2, 128, 128, false, true, -1, -1, 0),
                  add(1, 64, 1000, 2, 1, 320, 320, true, false, -1, -1, 0),
                  add(2, 1, 1500, 8, 2, 64, 64, true, true, -1, -1, 30)}) {
    x->sm = 80;
    x->kernel = "fa_forward_mma_";
  }
  {
    Case *x = add(1, 100, 1100, 4, 2, 128, 128, true, false, -1, -1, 0);
    x->c.q_fp8 = x->c.kv_fp8 = FA_DTYPE_FP8_E4M3;
    x->sm = 89;
    x->kernel = "fa_forward_mma_";
  }

  // Varlen (cu_seqlens_q/k), causal: the partial states padded to the
  // longest sequence, the varlen combine packing the rows. Among the
  // sequences an empty one, a short one (7 or 5 rows), and one with fewer
  // keys than one split and more queries than keys (rows with no key: O 0,
  // LSE -inf; its other splits empty); the gather variant on sm_90a and the
  // mma.sync forward.
  for (int sm : {90, 80}) {
    Case *x = sm == 90 ? add(4, 150, 1800, 4, 2, 64, 64, false, true, -1, -1, 0)
                       : add(4, 90, 1200, 4, 1, 64, 64, true, true, -1, -1, 0);
    x->c.varlen = true;
    x->c.seqlens_q = sm == 90 ? std::vector<int>{150, 0, 7, 130} : std::vector<int>{90, 5, 0, 64};
    x->c.seqlens_k =
        sm == 90 ? std::vector<int>{1500, 300, 1800, 100} : std::vector<int>{1200, 1000, 50, 40};
    x->sm = sm;
    x->kernel = sm == 90 ? "fa_forward_wgmma_gather_" : "fa_forward_mma_";
  }
  {
    // Chunked prefill with cu_seqlens_q over a paged cache with seqused_k:
    // 100, 0, 5 and 60 new queries over 1000, 700, 0 and 1500 keys.
    Case x;
    x.kernel = "fa_forward_wgmma_gather_";
    x.d = fa::test::prefill_case({1000, 700, 0, 1500}, 100, 1536, 4, 2, 64, false, FA_KV_PAGED, 16,
                                 seed++);
    x.d.prefill_q = {100, 0, 5, 60};
    cases.push_back(x);
  }

  const char *quick = std::getenv("FA_TEST_QUICK");
  const bool q1 = quick && quick[0] == '1';
  // Rerun unsplit (policy off): one case of each kernel (sm_90a TMA and
  // gather, sm_80, sm_89's fp8 mma, varlen on sm_90a and sm_80).
  for (size_t i : {size_t(0), size_t(7), size_t(9), size_t(12), size_t(13), size_t(14)})
    cases[i].rerun = true;
  if (q1) cases = {cases[0], cases[9], cases[14]};  // sm_90a TMA, sm_80, sm_80 varlen
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  std::string failures;
  for (Case &x : cases) {
    const std::string what = x.describe() + " sm" + std::to_string(x.sm);
    fa_runtime *r = runtime(x);
    // The forward's split here (short ones would take the GQA packing).
    fa::test::PolicyScope nopack(r, &fa::KernelPolicy::forward_gqa_pack, false);
    std::string e = x.run(r, kAutoWorkspace, 0);
    if (!e.empty()) failures += what + " (split):\n" + e;
    failures += check_kernel(r, x, true, what + " (split)");
    if (q1 || !x.rerun) continue;
    fa::test::PolicyScope off(r, &fa::KernelPolicy::forward_splits, false);
    e = x.run(r, kAutoWorkspace, 0);  // asks for no workspace
    if (!e.empty()) failures += what + " (policy off):\n" + e;
    failures += check_kernel(r, x, false, what + " (policy off)");
  }

  // A workspace one byte short of the plan's, or not 256-byte aligned:
  // unsplit (and right). The persistent policy: an 8-byte counter, no split.
  Case &x = cases[0];  // its problem's host arguments
  fa_config *cfg = nullptr;
  fa_forward_args a;
  uint64_t ws = 0;
  size_t need = 0;
  if (fa_malloc(rt, 4 << 20, &ws) != FA_SUCCESS ||
      !fa::test::host_forward_problem(1, 200, 2048, 4, 2, 128, true, ws, &cfg, &a)) {
    std::printf("FAIL: setup: %s\n", fa_last_error());
    return 1;
  }
  if (q1) {
    // the sanitizer pass: not these reruns
  } else if (fa_forward_workspace_size(rt, cfg, &a, &need) != FA_SUCCESS || need <= 256 ||
             need > (4 << 20) - 256) {
    failures +=
        "fa_forward_workspace_size: " + std::to_string(need) + " bytes (" + fa_last_error() + ")\n";
  } else {
    fa_memset(rt, ws, 0, 4 << 20);
    const struct {
      uint64_t off;
      size_t size;
      const char *what;
    } unsplit[] = {{0, need - 1, "one byte short"}, {8, need, "8-byte aligned"}};
    for (const auto &u : unsplit) {
      const std::string e = x.run(rt, ws + u.off, u.size);
      if (!e.empty()) failures += std::string(u.what) + ":\n" + e;
      failures += check_kernel(rt, x, false, u.what);
    }
    fa::test::PolicyScope p(rt, &fa::KernelPolicy::sm90_persistent, true);
    size_t bytes = 0;
    if (fa_forward_workspace_size(rt, cfg, &a, &bytes) != FA_SUCCESS || bytes != 8)
      failures += "persistent: fa_forward_workspace_size " + std::to_string(bytes) + "\n";
    const std::string e = x.run(rt, ws, 4 << 20);
    if (!e.empty()) failures += "persistent:\n" + e;
    const std::string k = fa::test::emulated_kernel(rt);
    if (k.find("_persistent") == std::string::npos || k.find("_split") != std::string::npos)
      failures += "persistent: ran " + k + "\n";
  }
  // The policy-off pass (routing only) on sm_90 alone.
  failures += check_gqa_pack(rt, 90, 3300, q1, true);
  if (!q1) failures += check_gqa_pack(rt80, 80, 3310, false, false);
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_free(rt, ws);
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  fa_runtime_destroy(rt80);
  fa_runtime_destroy(rt89);
  return fa::test::finish(failures, std::to_string(cases.size()) +
                                        " cases: split-KV forward (sm_90a TMA and gather, sm_80 "
                                        "and sm_89 mma.sync) against the "
                                        "fp64 reference, unsplit with the policy off, a short or "
                                        "misaligned workspace, or the persistent kernel");
}
