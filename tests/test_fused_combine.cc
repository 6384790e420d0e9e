// The combine fused into the decode kernel (fa_decode_args.split_counters,
// KernelSpec::fused_combine; issue 28 item 3) on the emulator, its CTAs on
// 3 host threads so that the splits of a row finish in varying orders and
// race for the counter. Each case runs through the numerics runner (fresh
// random inputs, O and LSE poisoned first, against the fp64 reference) twice
// with the same inputs: the policy's decode_fused off (the decode kernel,
// then the reduce kernel; the counters untouched) and on (one launch, whose
// entry carries `_fused`); the two outputs must be bit-identical (O and LSE:
// one combine, tile::combine_row, in the same order), and the counters zero
// after every call. Cases: GQA over a contiguous cache with LSE, two calls
// in a row on one workspace and one counter array; bf16 with causal
// masking, sinks, ALiBi and an empty sequence; MLA's d576/dv512 (O in two
// column slices, so a row's counter counts splits x slices) with V read
// from K; batch_invariant over a paged cache with a KV append; sm_90 with
// programmatic dependent launch. One split (num_splits 1) does not fuse.
// A broken reset (counters left non-zero before a call) must be caught, and
// bad split_counters arguments are refused with messages naming them.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

fa::test::DecodeCase decode(int batch, int seqlen_q, int max_k, int hq, int hkv, int d, bool bf16,
                            uint32_t seed) {
  fa::test::DecodeCase c =
      fa::test::decode_case(batch, seqlen_q, max_k, hq, hkv, d, bf16, seed, 97);
  c.split_counters = true;
  return c;
}

// Whether two runs' outputs have the same bits.
bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// c unfused, then fused ("" or the problems): both right against fp64,
// the kernels expected (fused: the last launch `_fused`; unfused, or one
// split: the reduce kernel), the same bits.
std::string fused_vs_unfused(fa_runtime *rt, fa::test::DecodeCase c, bool expect_fused) {
  std::string err;
  std::vector<float> o[2], lse[2];
  for (int fused = 0; fused < 2; ++fused) {
    fa::test::PolicyScope p(rt, &fa::KernelPolicy::decode_fused, fused == 1);
    c.o_out = &o[fused];
    c.lse_out = &lse[fused];
    const std::string what = c.describe() + (fused ? " fused" : " unfused");
    const std::string e = fa::test::run_decode(rt, c);
    if (!e.empty()) err += what + ":\n" + e;
    const std::string k = fa::test::emulated_kernel(rt);
    const bool ran_fused = k.find("_fused") != std::string::npos;
    const bool want = fused == 1 && expect_fused;
    if (ran_fused != want || (!want && k.find("fa_reduce_") != 0))
      err += what + ": the last launch was " + k + "\n";
  }
  if (err.empty() && !(same_bits(o[0], o[1]) && same_bits(lse[0], lse[1])))
    err += c.describe() + ": fused and unfused O / LSE differ in their bits\n";
  return err;
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_EMU_THREADS", "3", 1);  // CTAs race for the counters
  unsetenv("FLASHATTN_DECODE_FUSED");
  unsetenv("FLASHATTN_PDL");
  fa_runtime *rt = fa::test::emulator_or_fail(80), *rt90 = fa::test::emulator_or_fail(90);
  if (rt == nullptr || rt90 == nullptr) return 1;
  const bool quick = std::getenv("FA_TEST_QUICK") != nullptr;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);  // emulated_kernel: the last launch's entry
  std::string failures;
  uint32_t seed = 9100;
  {  // GQA, LSE, automatic splits; two calls in a row on one workspace.
    fa::test::DecodeCase c = decode(1, 1, 1500, 8, 2, 128, false, seed++);
    c.calls = 2;
    failures += fused_vs_unfused(rt, c, true);
  }
  {  // bf16, causal, sinks, ALiBi, an empty sequence, two tokens.
    fa::test::DecodeCase c = decode(3, 2, 700, 8, 2, 64, true, seed++);
    c.cache_seqlens = {700, 0, 350};
    c.causal = true;
    c.num_splits = 4;
    c.sinks = {0.5f, -1.0f, 1.5f, 0.0f, 2.0f, -0.5f, 0.25f, 1.0f};
    c.alibi = {0.02f, 0.01f, 0.005f, 0.0025f, 0.04f, 0.03f, 0.015f, 0.001f};
    failures += fused_vs_unfused(rt, c, true);
  }
  if (!quick) {  // MLA: d576 / dv512 in two O slices, V read from K.
    fa::test::DecodeCase c = decode(1, 1, 300, 16, 1, 576, true, seed++);
    c.head_dim_v = 512;
    c.v_in_k = true;
    c.num_splits = 3;
    failures += fused_vs_unfused(rt, c, true);
  }
  if (!quick) {  // batch_invariant (splits of 2048 keys), paged, KV append.
    fa::test::DecodeCase c = decode(2, 1, 4400, 4, 4, 64, false, seed++);
    c.batch_invariant = true;
    c.kv.layout = FA_KV_PAGED;
    c.kv.page_size = 16;
    c.seqlen_new = 1;
    c.cache_seqlens = {4399, 2100};
    failures += fused_vs_unfused(rt, c, true);
  }
  {  // sm_90 with programmatic dependent launch: the fused kernel waits too.
    fa::test::PolicyScope pdl(rt90, &fa::KernelPolicy::pdl, true);
    fa::test::DecodeCase c = decode(2, 1, 900, 4, 1, 128, false, seed++);
    failures += fused_vs_unfused(rt90, c, true);
  }
  {  // One split: nothing to fuse; the counters stay zero.
    fa::test::DecodeCase c = decode(2, 1, 600, 4, 2, 64, false, seed++);
    c.num_splits = 1;
    failures += fused_vs_unfused(rt, c, false);
  }
  {  // A broken reset: counters left at 1 before the second call. A row's
     // next-to-last CTA then takes itself for the last (it may combine
     // before the last split is stored) and the counters end non-zero: the
     // runner must report it. With CTAs racing, a row's last add can land
     // before the early CTA's reset (the counter then ends at 0), so this
     // case runs them one at a time, in grid order: split 0 takes itself
     // for the last, resets, and split 1 leaves the counter at 1, in every
     // row.
    fa::test::DecodeCase c = decode(1, 1, 800, 4, 2, 64, false, seed++);
    c.calls = 2;
    c.counters_preset = 1;
    setenv("FLASHATTN_EMU_THREADS", "1", 1);
    const std::string e = fa::test::run_decode(rt, c);
    setenv("FLASHATTN_EMU_THREADS", "3", 1);
    if (e.find("call 1: 2 of 2 split_counters not 0") == std::string::npos)
      failures += c.describe() + ": counters left at 1 went unnoticed (" + e + ")\n";
  }
  // Refused arguments, each naming split_counters or its size.
  struct Bad {
    const char *what, *message;
    void (*edit)(fa_decode_args *);
  };
  const Bad bad[] = {
      {"misaligned", "split_counters 0x", [](fa_decode_args *a) { a->split_counters += 2; }},
      {"too small", "split_counters_size is",
       [](fa_decode_args *a) { a->split_counters_size -= 4; }},
      {"size without counters", "but split_counters is 0",
       [](fa_decode_args *a) { a->split_counters = 0; }},
      {"without o", "split_counters is set but o.data is 0",
       [](fa_decode_args *a) { a->o.data = 0, a->lse = 0; }},
  };
  for (const Bad &b : bad) {
    fa::test::Reject r;
    r.decode = b.edit;
    r.message = b.message;
    fa::test::DecodeCase c = decode(2, 1, 500, 4, 2, 64, false, seed++);
    c.reject = &r;
    const std::string e = fa::test::run_decode(rt, c);
    if (!e.empty()) failures += std::string(b.what) + ": " + e;
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  fa_runtime_destroy(rt90);
  return fa::test::finish(failures,
                          "fused combine: bit-identical to the two launches, right against fp64, "
                          "counters zero after every call, bad counters refused");
}
