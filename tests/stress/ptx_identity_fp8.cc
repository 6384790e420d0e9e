// PTX identity of the 0.6 fp8 forward (not in CI), the companion of
// ptx_identity.cc (which leaves q_dtype and kv_dtype 0): "<shape> <length>
// <fnv1a64>" or "<shape> ERROR" of every forward module with an fp8 Q, K
// and V over dtype, the four e4m3/e5m2 pairs, head dims 16..256 (and
// head_dim_v != head_dim), GQA, causal, softcap, SMs 89/90/120 (sm_90: the
// wgmma forward with its fp8 V transpose, by default and with
// FLASHATTN_SM90_WGMMA=1), contiguous, paged (whole tiles and rows) and
// varlen. Build and diff as ptx_identity.cc.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "identity.h"

int main() {
  long n = 0;
  const int e4 = int(FA_DTYPE_FP8_E4M3), e5 = int(FA_DTYPE_FP8_E5M2);
  const int pairs[][2] = {{e4, e4}, {e4, e5}, {e5, e5}, {e5, e4}};
  const int dims[][2] = {{16, 16}, {32, 32}, {64, 64}, {64, 32},   {80, 80},
                         {96, 96}, {128, 128}, {192, 128}, {256, 256}};
  for (const char *env : {static_cast<const char *>(nullptr), "FLASHATTN_SM90_WGMMA"}) {
    if (env) setenv(env, "1", 1);
    for (int dt = 0; dt < 2; ++dt)
      for (const auto &pq : pairs)
        for (const auto &dd : dims)
          for (int var = 0; var < 3; ++var) {
            fa_config_desc desc = FA_CONFIG_DESC_INIT;
            desc.dtype = dt ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
            desc.q_dtype = pq[0];
            desc.kv_dtype = pq[1];
            desc.head_dim = dd[0];
            desc.head_dim_v = dd[1];
            desc.num_heads_q = 8;
            desc.num_heads_kv = var == 1 ? 1 : 2;
            desc.causal = var & 1;
            desc.softcap = var == 2 ? 30.0f : 0.0f;
            fa_config *cfg = nullptr;
            if (fa_config_create(&desc, &cfg) != FA_SUCCESS) continue;
            for (int sm : {89, 90, 120})
              for (int shape = 0; shape < 4; ++shape) {
                fa_generate_options o;
                std::memset(&o, 0, sizeof o);
                o.struct_size = sizeof o;
                if (shape == 1) o.kv_layout = FA_KV_PAGED, o.page_size = 128;
                if (shape == 2) o.kv_layout = FA_KV_PAGED, o.page_size = 16;
                if (shape == 3) o.varlen = 1;
                char tag[120];
                std::snprintf(tag, sizeof tag, "%s dt%d q%d kv%d d%d/%d v%d sm%d s%d",
                              env ? "wgmma" : "-", dt, pq[0], pq[1], dd[0], dd[1], var, sm, shape);
                if (!print_module(cfg, FA_KERNEL_FORWARD, sm, &o, tag)) continue;
                ++n;
              }
            fa_config_destroy(cfg);
          }
    if (env) unsetenv(env);
  }
  std::fprintf(stderr, "%ld modules\n", n);
  return 0;
}
