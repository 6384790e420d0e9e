// PTX identity across a change (not in CI): prints "<shape> <length>
// <fnv1a64>" of every module of a grid of fa_generate_for calls (public API
// only: dtypes, every head dim, GQA, causal, softcap, head_dim_v != head_dim,
// SMs 80/86/89/90/120, forward/decode/reduce, KV layouts, varlen, seqused_k,
// tree masks, LSE formats, the scalar, sm_90a and forced-sm80 kernels) with
// every newer option left 0. Build it against the library before and after
// a change and diff the outputs:
//   g++ -std=c++17 -Iinclude tests/stress/ptx_identity.cc -Lbuild -lflashattn
//   (continued) -Wl,-rpath,$PWD/build -o /tmp/ptx_identity && /tmp/ptx_identity > after.txt
// (Attention sinks: 115,200 modules, 23,218 distinct, identical.)
// (0.5, with ALiBi, the fp8 KV cache and the KV append off: the same 115,200
// modules, 23,218 distinct, identical to 0.4.1's a1023f2, each feature
// checked on its own branch.)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "identity.h"

int main() {
  long n = 0;
  const char *envs[][2] = {{nullptr, nullptr},
                           {"FLASHATTN_SCALAR_FORWARD", "1"},
                           {"FLASHATTN_SCALAR_DECODE", "1"},
                           {"FLASHATTN_SM90_WGMMA", "1"},
                           {"FLASHATTN_FORCE_SM80_FORWARD", "1"}};
  for (auto &ev : envs) {
    if (ev[0]) setenv(ev[0], ev[1], 1);
    for (int dt = 0; dt < 2; ++dt)
      for (int d = 8; d <= 256; d += 8)
        for (int var = 0; var < 4; ++var) {
          fa_config_desc desc = FA_CONFIG_DESC_INIT;
          desc.dtype = dt ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
          desc.head_dim = d;
          desc.head_dim_v = (var == 3 && d > 8) ? d - 8 : d;
          desc.num_heads_q = 8;
          desc.num_heads_kv = var == 2 ? 1 : 2;
          desc.causal = var & 1;
          desc.softcap = var == 2 ? 30.0f : 0.0f;
          fa_config *cfg = nullptr;
          if (fa_config_create(&desc, &cfg) != FA_SUCCESS) continue;
          for (int sm : {80, 86, 89, 90, 120})
            for (int kind = 0; kind < 3; ++kind)
              for (int shape = 0; shape < 7; ++shape) {
                if (kind == 2 && shape > 3) continue;
                fa_generate_options o;
                std::memset(&o, 0, sizeof o);
                o.struct_size = sizeof o;
                if (kind == 2) {
                  o.lse_partial_format = shape & 1;
                  o.lse_format = (shape >> 1) & 1;
                } else {
                  if (shape == 1) o.kv_layout = FA_KV_PAGED, o.page_size = 16;
                  if (shape == 2) o.kv_layout = FA_KV_PAGED, o.page_size = 256;
                  if (shape == 3) o.kv_layout = FA_KV_PTR_ARRAY;
                  if (kind == 0 && shape == 4) o.varlen = 1;
                  if (kind == 0 && shape == 5) o.varlen = 1, o.seqused_k = 1;
                  if (kind == 0 && shape >= 1 && shape <= 3) o.seqused_k = 1;
                  if (kind == 1 && shape >= 4) o.tree_mask = 1;
                  if (kind == 1 && shape == 5) o.kv_layout = FA_KV_PAGED, o.page_size = 5;
                  if (shape == 6) o.kv_layout = FA_KV_PAGED, o.page_size = 64;
                  if (kind == 0 && shape == 6) o.seqused_k = 1;
                }
                char tag[120];
                std::snprintf(tag, sizeof tag, "%s dt%d d%d v%d sm%d k%d s%d", ev[0] ? ev[0] : "-",
                              dt, d, var, sm, kind, shape);
                if (!print_module(cfg, fa_kernel_kind(kind), sm, &o, tag)) continue;
                ++n;
              }
          fa_config_destroy(cfg);
        }
    if (ev[0]) unsetenv(ev[0]);
  }
  std::fprintf(stderr, "%ld modules\n", n);
  return 0;
}
