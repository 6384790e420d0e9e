/* Built against an installed flashattn through pkg-config or find_package:
 * creates an emulator runtime, runs a small forward pass, checks one row. */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  fa_runtime_options ro = FA_RUNTIME_OPTIONS_INIT;
  ro.backend = FA_BACKEND_EMULATOR;
  ro.cache_mode = FA_CACHE_MEMORY;
  fa_runtime *rt = NULL;
  if (fa_runtime_create(&ro, &rt) != FA_SUCCESS) {
    fprintf(stderr, "fa_runtime_create: %s\n", fa_last_error());
    return 1;
  }
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 8;
  d.num_heads_q = d.num_heads_kv = 1;
  fa_config *cfg = NULL;
  if (fa_config_create(&d, &cfg) != FA_SUCCESS) return 1;
  /* One query, two keys with equal scores: O is the mean of the two V rows. */
  uint16_t q[8], k[16], v[16], o[8];
  for (int i = 0; i < 8; ++i) q[i] = 0x3C00;                    /* 1.0 */
  for (int i = 0; i < 16; ++i) k[i] = 0x3800;                   /* 0.5 */
  for (int i = 0; i < 16; ++i) v[i] = i < 8 ? 0x4000 : 0x4400;  /* 2.0, 4.0 */
  uint64_t dq, dk, dv, dout;
  fa_malloc(rt, sizeof q, &dq);
  fa_malloc(rt, sizeof k, &dk);
  fa_malloc(rt, sizeof v, &dv);
  fa_malloc(rt, sizeof o, &dout);
  fa_memcpy_htod(rt, dq, q, sizeof q);
  fa_memcpy_htod(rt, dk, k, sizeof k);
  fa_memcpy_htod(rt, dv, v, sizeof v);
  fa_memset(rt, dout, 0xFF, sizeof o);
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = 1;
  a.seqlen_k = 2;
  fa_tensor tq = {dq, {8, 8, 8, 1}}, tk = {dk, {16, 8, 8, 1}}, tv = {dv, {16, 8, 8, 1}},
            to = {dout, {8, 8, 8, 1}};
  a.q = tq;
  a.k = tk;
  a.v = tv;
  a.o = to;
  if (fa_launch(rt, cfg, &a, NULL) != FA_SUCCESS) {
    fprintf(stderr, "fa_launch: %s\n", fa_last_error());
    return 1;
  }
  fa_memcpy_dtoh(rt, o, dout, sizeof o);
  int bad = 0;
  for (int i = 0; i < 8; ++i) bad += o[i] != 0x4200; /* 3.0 */
  printf("flashattn %s: forward through the installed library %s\n", fa_version_string(),
         bad ? "WRONG" : "ok");
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return bad ? 1 : 0;
}
