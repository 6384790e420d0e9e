// PTX identity of the 0.5 KV-cache decode features (not in CI), the
// companion of ptx_identity.cc (which leaves them off): "<shape> <length>
// <fnv1a64>" or "<shape> ERROR" of every decode module of a grid over
// dtype, kv_dtype (16-bit, e4m3, e5m2), head dims (16..576 with
// head_dim_v != head_dim), GQA, causal, SMs 80/89/90/120, KV layouts, tree
// masks, ALiBi, the KV append and rotary (NeoX, GPT-J, 16-bit tables). Build
// it against the library before and after a change and diff the outputs
// (as ptx_identity.cc: g++ -std=c++17 -Iinclude, -Lbuild -lflashattn).
// (The fp8 KV append: only the "append" lines of fp8 configs changed, from
// ERROR to modules; every other line identical.)
#include <cstdio>
#include <cstring>
#include <string>

#include "identity.h"

int main() {
  long n = 0;
  const int dims[][2] = {{16, 16},   {64, 64},   {64, 32},   {80, 80},   {96, 64},
                         {128, 128}, {192, 128}, {256, 256}, {512, 512}, {576, 512}};
  for (int dt = 0; dt < 2; ++dt)
    for (int kvd : {0, int(FA_DTYPE_FP8_E4M3), int(FA_DTYPE_FP8_E5M2)})
      for (const auto &dd : dims)
        for (int var = 0; var < 2; ++var) {
          fa_config_desc desc = FA_CONFIG_DESC_INIT;
          desc.dtype = dt ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
          desc.kv_dtype = kvd;
          desc.head_dim = dd[0];
          desc.head_dim_v = dd[1];
          desc.num_heads_q = 8;
          desc.num_heads_kv = var ? 1 : 2;
          desc.causal = var;
          fa_config *cfg = nullptr;
          if (fa_config_create(&desc, &cfg) != FA_SUCCESS) continue;
          for (int sm : {80, 89, 90, 120})
            for (int shape = 0; shape < 6; ++shape)
              for (int feat = 0; feat < 7; ++feat) {
                fa_generate_options o;
                std::memset(&o, 0, sizeof o);
                o.struct_size = sizeof o;
                if (shape == 1) o.kv_layout = FA_KV_PAGED, o.page_size = 16;
                if (shape == 2) o.kv_layout = FA_KV_PAGED, o.page_size = 5;
                if (shape == 3) o.kv_layout = FA_KV_PTR_ARRAY;
                if (shape == 4) o.tree_mask = 1;
                if (shape == 5) o.alibi = 1;
                if (feat >= 1) o.append_kv = 1;
                if (feat >= 2) o.rotary = feat % 2 ? 1 : 2;
                if (feat >= 4) o.rotary_dtype = desc.dtype;
                if (feat == 6) o.rotary = 0, o.rotary_dtype = 0, o.alibi = 1;
                char tag[120];
                std::snprintf(tag, sizeof tag, "dt%d kv%d d%d/%d v%d sm%d s%d f%d%s", dt, kvd,
                              dd[0], dd[1], var, sm, shape, feat, o.append_kv ? " append" : "");
                if (!print_module(cfg, FA_KERNEL_DECODE, sm, &o, tag)) continue;
                ++n;
              }
          fa_config_destroy(cfg);
        }
  std::fprintf(stderr, "%ld modules\n", n);
  return 0;
}
