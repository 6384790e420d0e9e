/*
 * The shared example, linked against the installed library:
 *   cc pkgconfig_example.c $(pkg-config --cflags --libs flashattn)
 *   ./a.out tests/data/minilm_l6
 * Loads the MiniLM-L6 layer's q/k/v (float32 [1, 145, 12, 32]), runs the
 * forward pass in fp16 on the emulator and compares with out.npy.
 */
#include <flashattn.h>

#include "fixture.h"

#define CHECK(call) FIXTURE_CHECK(call, fa_status_string, fa_last_error)

int main(int argc, char **argv) {
  const char *names[4] = {"q", "k", "v", "out"};
  float *host[4] = {NULL, NULL, NULL, NULL};
  int64_t shape[4][4];
  uint64_t dev[4] = {0, 0, 0, 0};
  uint16_t *half = NULL;
  size_t n = 0, i;
  int t, ok;
  char path[4096];

  if (argc != 2) {
    fprintf(stderr, "usage: %s FIXTURE_DIR (tests/data/minilm_l6)\n", argv[0]);
    return 2;
  }
  for (t = 0; t < 4; t++) {
    int ndim;
    snprintf(path, sizeof path, "%s/%s.npy", argv[1], names[t]);
    if (npy_load_f32(path, shape[t], &ndim, &host[t]) != 0) return 1;
    if (ndim != 4 || memcmp(shape[t], shape[0], sizeof shape[0]) != 0) {
      fprintf(stderr, "%s: expected the shape of q.npy\n", path);
      return 1;
    }
  }
  const int32_t B = (int32_t)shape[0][0], S = (int32_t)shape[0][1], H = (int32_t)shape[0][2],
                D = (int32_t)shape[0][3];
  n = (size_t)B * S * H * D;

  printf("flashattn %s (header %d.%d.%d)\n", fa_version_string(), FLASHATTN_VERSION_MAJOR,
         FLASHATTN_VERSION_MINOR, FLASHATTN_VERSION_PATCH);

  fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
  opts.backend = FA_BACKEND_EMULATOR;
  fa_runtime *rt = NULL;
  CHECK(fa_runtime_create(&opts, &rt));
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  CHECK(fa_runtime_get_info(rt, &info));
  printf("device: %s (sm_%d)\n", info.device_name, info.sm);

  fa_config_desc desc = FA_CONFIG_DESC_INIT; /* fp16, non-causal, default scale */
  desc.head_dim = D;
  desc.num_heads_q = H;
  desc.num_heads_kv = H;
  fa_config *cfg = NULL;
  CHECK(fa_config_create(&desc, &cfg));

  half = (uint16_t *)malloc(n * sizeof(uint16_t));
  if (!half) return 1;
  for (t = 0; t < 4; t++) {
    CHECK(fa_malloc(rt, n * sizeof(uint16_t), &dev[t]));
    if (t < 3) { /* q, k, v: rounded to fp16 */
      for (i = 0; i < n; i++) half[i] = f32_to_f16(host[t][i]);
      CHECK(fa_memcpy_htod(rt, dev[t], half, n * sizeof(uint16_t)));
    } else { /* o: poisoned with NaN so an unwritten element shows */
      CHECK(fa_memset(rt, dev[t], 0xff, n * sizeof(uint16_t)));
    }
  }

  fa_forward_args args = FA_FORWARD_ARGS_INIT;
  args.batch = B;
  args.seqlen_q = S;
  args.seqlen_k = S;
  fa_tensor *views[4] = {&args.q, &args.k, &args.v, &args.o};
  for (t = 0; t < 4; t++) { /* contiguous [B, S, H, D], strides in elements */
    views[t]->data = dev[t];
    views[t]->stride[0] = (int64_t)S * H * D;
    views[t]->stride[1] = (int64_t)H * D;
    views[t]->stride[2] = D;
    views[t]->stride[3] = 1;
  }
  CHECK(fa_launch(rt, cfg, &args, NULL));
  CHECK(fa_synchronize(rt, NULL));
  CHECK(fa_memcpy_dtoh(rt, half, dev[3], n * sizeof(uint16_t)));

  ok = fixture_check("pkgconfig_example", half, host[3], n);

  for (t = 0; t < 4; t++) {
    CHECK(fa_free(rt, dev[t]));
    free(host[t]);
  }
  free(half);
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return ok ? 0 : 1;
}
