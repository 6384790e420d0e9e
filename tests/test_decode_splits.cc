// Flash-Decoding's automatic split count (fa::decode_num_splits, the rule
// Runtime::plan_decode applies to fa_decode with num_splits 0): a table of
// (batch, KV heads, seqlen_k, SMs) worked out by hand from the model in
// runtime.h (decode tile: 16 packed rows, block_n 64, 2 CTAs per SM), and
// over a grid of shapes its properties: 1..128 splits; one split when
// batch x KV heads alone give every SM a CTA; else at least one CTA per SM
// when the keys allow it (the most splits they allow otherwise); no split
// shorter than kDecodeMinSplitTiles key tiles; no second wave where fewer
// splits already fill the SMs; a large batch never splits more than a small
// one; and through fa_decode_workspace_size on the
// emulator (108 SMs) the count the runtime reports is the rule's.
#include <cstdio>
#include <string>

#include "flashattn.h"
#include "runtime/runtime.h"
#include "support/numerics.h"

namespace {

constexpr int kBlockN = 64, kPerSm = 2;

int splits_for(int64_t batch, int64_t heads_kv, int64_t seqlen_k, int sms) {
  return fa::decode_num_splits(batch * heads_kv, (seqlen_k + kBlockN - 1) / kBlockN, sms, kPerSm);
}

}  // namespace

int main(void) {
  std::string failures;
  struct Row {
    int batch, heads_kv, seqlen_k, sms, splits;
  };
  // Worked by hand: key tiles T = seqlen_k / 64, slots = 2 sms,
  // min(T / 4, 128, max(ceil(sms / ctas), slots / ctas)).
  const Row table[] = {
      {1, 8, 4096, 132, 16},   // 8 CTAs: 16 splits (T / 4), 128 CTAs: the keys allow no more
      {1, 8, 32768, 132, 33},  // 33 x 8 = 264 CTAs: one wave of 2 per SM
      {8, 8, 4096, 132, 4},    // 64 CTAs: 4 splits, 256 <= 264 (5 would need a second wave)
      {8, 8, 32768, 132, 4},   // the same: the keys allow more, the wave does not
      {2, 8, 4096, 108, 13},   // 16 CTAs: 13 splits, 208 <= 216
      {32, 8, 4096, 132, 1},   // 256 CTAs fill the SMs alone
      {17, 8, 32768, 132, 1},  // 136 CTAs >= 132 SMs
      {1, 1, 100, 132, 1},     // 2 key tiles: no split of 4
      {1, 1, 1024, 132, 4},    // 16 tiles: 4 splits of 4 at most
  };
  for (const Row &r : table) {
    const int got = splits_for(r.batch, r.heads_kv, r.seqlen_k, r.sms);
    std::printf("  b%d hkv%d sk%d sms%d: %d splits (want %d)\n", r.batch, r.heads_kv, r.seqlen_k,
                r.sms, got, r.splits);
    if (got != r.splits)
      failures += "b" + std::to_string(r.batch) + " hkv" + std::to_string(r.heads_kv) + " sk" +
                  std::to_string(r.seqlen_k) + " sms" + std::to_string(r.sms) + ": " +
                  std::to_string(got) + " splits, not " + std::to_string(r.splits) + "\n";
  }
  long checked = 0;
  for (int sms : {1, 46, 108, 132, 170})
    for (int64_t ctas = 1; ctas <= 400; ctas += ctas < 40 ? 1 : 7)
      for (int64_t tiles : {1, 3, 4, 7, 8, 16, 63, 64, 100, 512, 2048, 100000}) {
        const int s = fa::decode_num_splits(ctas, tiles, sms, kPerSm);
        const int64_t most = std::max<int64_t>(1, std::min<int64_t>(tiles / 4, 128));
        std::string bad;
        if (s < 1 || s > 128) bad += " out of 1..128";
        if (ctas >= sms && s != 1) bad += " splits though the CTAs fill the SMs";
        if (s > 1 && tiles / s < fa::kDecodeMinSplitTiles) bad += " a split under 4 tiles";
        if (ctas < sms && ctas * s < sms && s != most) bad += " leaves SMs idle the keys could fill";
        if (s > 1 && fa::decode_num_splits(ctas * 2, tiles, sms, kPerSm) > s)
          bad += " twice the CTAs split more";
        if (ctas * s > int64_t(sms) * kPerSm && ctas * (s - 1) >= sms)
          bad += " a second wave though fewer splits fill the SMs";
        if (!bad.empty())
          failures += "ctas " + std::to_string(ctas) + " tiles " + std::to_string(tiles) +
                      " sms " + std::to_string(sms) + ": " + std::to_string(s) + " splits:" +
                      bad + "\n";
        ++checked;
      }
  std::printf("  %ld (ctas, key tiles, SMs) checked\n", checked);
  // The runtime's count (fa_decode_workspace_size) on the emulator's 108
  // SMs is the rule's for the decode tile it runs.
  fa_runtime *rt = fa::test::emulator_or_fail(80);
  if (rt == nullptr) return 1;
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_FP16;
  desc.head_dim = 128;
  desc.num_heads_q = 32;
  desc.num_heads_kv = 8;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS) return 1;
  fa::AttentionConfig ac = fa::attention_config(fa::Dtype::F16, 128, 128, 32, 8, 0.0f, 0.0f);
  const fa::KernelSpec spec =
      fa::make_spec(ac, fa::KernelKind::Decode, 80, false);  // block_n, min_ctas
  for (int batch : {1, 2, 8, 16}) {
    for (int sk : {4096, 32768}) {
      fa_decode_args a = FA_DECODE_ARGS_INIT;
      a.batch = batch;
      a.seqlen_q = 1;
      a.seqlen_k_max = sk;
      // Not read, only set: the spec's fixed_len and v_in_k (V in K's memory) off.
      a.cache_seqlens = 256;
      a.k_cache.data = 4096;
      a.v_cache.data = 8192;
      size_t bytes = 0;
      int32_t splits = 0;
      if (fa_decode_workspace_size(rt, cfg, &a, &bytes, &splits) != FA_SUCCESS) {
        failures += std::string("fa_decode_workspace_size: ") + fa_last_error() + "\n";
        continue;
      }
      const int64_t bn = spec.block_n;
      const int rule = fa::decode_num_splits(int64_t(batch) * 8, (sk + bn - 1) / bn, 108,
                                             spec.min_ctas);
      // Splits of whole key tiles (plan_decode): the count they come to.
      const int64_t size = ((sk + rule - 1) / rule + bn - 1) / bn * bn;
      const int want = static_cast<int>((sk + size - 1) / size);
      std::printf("  runtime b%d sk%d: %d splits (rule %d; block_n %d, %d CTAs per SM)\n", batch, sk,
                  splits, want, spec.block_n, spec.min_ctas);
      if (splits != want)
        failures += "runtime b" + std::to_string(batch) + " sk" + std::to_string(sk) + ": " +
                    std::to_string(splits) + " splits, the rule says " + std::to_string(want) +
                    "\n";
    }
  }
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return fa::test::finish(failures, "decode split heuristic: table and properties");
}
