// The fp8 KV cache decode runner (fa_config_desc.kv_dtype, the descales of
// fa_decode_args) shared by tests/test_fp8_kv and the feature descriptions'
// C driver (tests/support/feature_cases): one case on an emulated sm_89 or
// sm_90, against the fp64 reference on the values the fp8 bytes hold,
// poisoned O, LSE and workspace, the decode kernel checked by name (the
// runtime needs FLASHATTN_EMU_PROFILE=1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"

namespace fa::test::fp8kv {

enum Layout { kContig, kPagedNhd, kPagedHnd, kPtrs };

struct Case {
  int batch = 1, seqlen_q = 1, skmax = 64;
  std::vector<int> lens;  // cache_seqlens, size batch
  int hq = 1, hkv = 1, d = 64, dv = 0;
  bool bf16 = false, e5m2 = false, causal = false;
  int window_left = -1;
  float softcap = 0;
  int splits = 0;
  bool batch_invariant = false;
  Layout layout = kContig;
  int page_size = 0;
  int descale = 2;                  // 0 none (1.0), 1 per tensor, 2 per (batch, KV head)
  bool descale_transposed = false;  // per (b, h): strides {1, batch + 1} instead of {hkv + 2, 1}
  bool tree = false, sinks = false;
  bool alibi = false;   // ALiBi slopes per (batch, query head) (fa_decode_args.alibi_slopes)
  bool direct = false;  // fa_decode with o.data set (its own combine)
  // bf16 Q rows (token, head) scaled by 2^e, e cycling over -30, -18, -6, 6,
  // 18: past f16's range both ways (the f16 mma on a row-scaled Q).
  bool q_spread = false;
  bool tight = false;  // contiguous without gaps (rows on 32-byte sectors)
  // Sequence b's descales (K and V, every KV head) are +inf: its cache must
  // be empty (lens[b] = 0), whose rows get O = 0 and LSE = -inf regardless.
  int inf_descale_seq = -1;
  // KV append (fa_decode_args.k_new): seqlen_new 16-bit tokens quantised
  // into the cache by the kernel (lens: the lengths before it); rotary 1
  // NeoX, 2 GPT-J over rotary_dim (0 = d) of K and Q; new_scale: the new
  // values' spread (past e4m3's 448: satfinite).
  int seqlen_new = 0, rotary = 0, rotary_dim = 0;
  double new_scale = 1.0;
  // Descales of sequence 1 K 0 / V +inf, of sequence 2 K NaN / V < 0 (with
  // descale 2): only the cache bytes are checked (O holds NaN).
  bool odd_descales = false;
  // V is the first dv columns of K (the same memory: MLA's latent cache,
  // KernelSpec::v_in_k); V's values are those bytes times V's descales.
  bool v_in_k = false;
  // The runtime's policy has decode_fp8_mma on: the decode kernel must be
  // mode (b)'s ("_f8mma"; else it must not be), against the derived
  // tolerance (run_case: the yardstick computes with Q rounded per row to
  // e4m3 as the kernel does and P in e4m3).
  bool fp8_mma = false;
  // The decode kernel the partial-state run must have profiled (a prefix).
  const char *kernel = "fa_decode_mma_";
  uint32_t seed = 1;
  // A call that must be refused: fa_decode gets the mutated arguments
  // (numerics.h, Reject) and nothing runs.
  const Reject *reject = nullptr;
  std::string describe() const {
    char buf[400];
    static const char *lay[] = {"contig", "paged-nhd", "paged-hnd", "ptrs"};
    std::snprintf(buf, sizeof buf,
                  "%s %s b%d sq%d skmax%d hq%d hkv%d d%d dv%d%s wl%d cap%g splits%d%s %s ps%d "
                  "descale%d%s%s%s%s%s%s new%d rope%d/%d x%g%s",
                  e5m2 ? "e5m2" : "e4m3", bf16 ? "bf16" : "fp16", batch, seqlen_q, skmax, hq, hkv,
                  d, dv ? dv : d, causal ? " causal" : "", window_left, softcap, splits,
                  batch_invariant ? " invariant" : "", lay[layout], page_size, descale,
                  descale_transposed ? "T" : "", tree ? " tree" : "", sinks ? " sinks" : "",
                  alibi ? " alibi" : "", direct ? " direct" : "", v_in_k ? " v_in_k" : "",
                  seqlen_new, rotary, rotary_dim, new_scale, fp8_mma ? " fp8_mma" : "");
    return buf;
  }
};

// The status of the last failing call in run_case (FA_SUCCESS when none).
extern fa_status g_last_fail;

// Runs one case; returns the problems found ("" = passed). *counters: the
// decode kernel's memory counters.
std::string run_case(fa_runtime *rt, const Case &c, fa_emu_mem_counters *counters = nullptr);

// A case of batch b, ... with random cache_seqlens in [sk / 2, sk] (the
// first sk).
Case base(int b, int sq, int sk, int hq, int hkv, int d, uint32_t seed);

}  // namespace fa::test::fp8kv
