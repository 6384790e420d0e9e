/*
 * The shared example, loading flashattn at run time: no link against it,
 * every call resolved with dlsym. The header only supplies types and the
 * FA_*_INIT initialisers.
 *   cc -I PREFIX/include dlopen_example.c -ldl
 *   ./a.out tests/data/minilm_l6 [PREFIX/lib/libflashattn.so.0]
 * The library is $FLASHATTN_LIBRARY, else the second argument, else
 * libflashattn.so.0 on the loader's search path.
 */
#include <dlfcn.h>
#include <flashattn.h>

#include "fixture.h"

/* The entry points used, as pointers with the header's signatures. */
static struct {
  const char *(*status_string)(fa_status);
  const char *(*last_error)(void);
  uint32_t (*version_number)(void);
  const char *(*version_string)(void);
  fa_status (*runtime_create)(const fa_runtime_options *, fa_runtime **);
  void (*runtime_destroy)(fa_runtime *);
  fa_status (*runtime_get_info)(const fa_runtime *, fa_runtime_info *);
  fa_status (*config_create)(const fa_config_desc *, fa_config **);
  void (*config_destroy)(fa_config *);
  fa_status (*malloc_)(fa_runtime *, size_t, uint64_t *);
  fa_status (*free_)(fa_runtime *, uint64_t);
  fa_status (*memcpy_htod)(fa_runtime *, uint64_t, const void *, size_t);
  fa_status (*memcpy_dtoh)(fa_runtime *, void *, uint64_t, size_t);
  fa_status (*memset_)(fa_runtime *, uint64_t, uint8_t, size_t);
  fa_status (*synchronize)(fa_runtime *, void *);
  fa_status (*launch)(fa_runtime *, const fa_config *, const fa_forward_args *, void *);
} fa;

/* Resolves `name` into *slot; returns 0, or -1 after printing dlerror(). */
static int resolve(void *lib, const char *name, void *slot) {
  void *sym = dlsym(lib, name);
  if (!sym) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    return -1;
  }
  memcpy(slot, &sym, sizeof sym); /* object pointer -> function pointer */
  return 0;
}

#define CHECK(call) FIXTURE_CHECK(call, fa.status_string, fa.last_error)

int main(int argc, char **argv) {
  const char *names[4] = {"q", "k", "v", "out"};
  float *host[4] = {NULL, NULL, NULL, NULL};
  int64_t shape[4][4];
  uint64_t dev[4] = {0, 0, 0, 0};
  uint16_t *half = NULL;
  size_t n, i;
  int t, ok, bad = 0;
  char path[4096];

  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s FIXTURE_DIR [LIBRARY]\n", argv[0]);
    return 2;
  }
  const char *libpath = getenv("FLASHATTN_LIBRARY");
  if (!libpath || !*libpath) libpath = argc == 3 ? argv[2] : "libflashattn.so.0";
  void *lib = dlopen(libpath, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen(%s): %s\n", libpath, dlerror());
    return 1;
  }
  bad |= resolve(lib, "fa_status_string", &fa.status_string);
  bad |= resolve(lib, "fa_last_error", &fa.last_error);
  bad |= resolve(lib, "fa_version_number", &fa.version_number);
  bad |= resolve(lib, "fa_version_string", &fa.version_string);
  bad |= resolve(lib, "fa_runtime_create", &fa.runtime_create);
  bad |= resolve(lib, "fa_runtime_destroy", &fa.runtime_destroy);
  bad |= resolve(lib, "fa_runtime_get_info", &fa.runtime_get_info);
  bad |= resolve(lib, "fa_config_create", &fa.config_create);
  bad |= resolve(lib, "fa_config_destroy", &fa.config_destroy);
  bad |= resolve(lib, "fa_malloc", &fa.malloc_);
  bad |= resolve(lib, "fa_free", &fa.free_);
  bad |= resolve(lib, "fa_memcpy_htod", &fa.memcpy_htod);
  bad |= resolve(lib, "fa_memcpy_dtoh", &fa.memcpy_dtoh);
  bad |= resolve(lib, "fa_memset", &fa.memset_);
  bad |= resolve(lib, "fa_synchronize", &fa.synchronize);
  bad |= resolve(lib, "fa_launch", &fa.launch);
  if (bad) return 1;
  /* Same major version = same ABI (include/flashattn.h). */
  if (fa.version_number() / 10000 != FLASHATTN_VERSION_MAJOR) {
    fprintf(stderr, "%s is version %s, this program needs major %d\n", libpath, fa.version_string(),
            FLASHATTN_VERSION_MAJOR);
    return 1;
  }
  printf("dlopen(%s): flashattn %s\n", libpath, fa.version_string());

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

  fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
  opts.backend = FA_BACKEND_EMULATOR;
  fa_runtime *rt = NULL;
  CHECK(fa.runtime_create(&opts, &rt));
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  CHECK(fa.runtime_get_info(rt, &info));
  printf("device: %s (sm_%d)\n", info.device_name, info.sm);

  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = D;
  desc.num_heads_q = H;
  desc.num_heads_kv = H;
  fa_config *cfg = NULL;
  CHECK(fa.config_create(&desc, &cfg));

  half = (uint16_t *)malloc(n * sizeof(uint16_t));
  if (!half) return 1;
  for (t = 0; t < 4; t++) {
    CHECK(fa.malloc_(rt, n * sizeof(uint16_t), &dev[t]));
    if (t < 3) {
      for (i = 0; i < n; i++) half[i] = f32_to_f16(host[t][i]);
      CHECK(fa.memcpy_htod(rt, dev[t], half, n * sizeof(uint16_t)));
    } else {
      CHECK(fa.memset_(rt, dev[t], 0xff, n * sizeof(uint16_t))); /* NaN poison */
    }
  }

  fa_forward_args args = FA_FORWARD_ARGS_INIT;
  args.batch = B;
  args.seqlen_q = S;
  args.seqlen_k = S;
  fa_tensor *views[4] = {&args.q, &args.k, &args.v, &args.o};
  for (t = 0; t < 4; t++) {
    views[t]->data = dev[t];
    views[t]->stride[0] = (int64_t)S * H * D;
    views[t]->stride[1] = (int64_t)H * D;
    views[t]->stride[2] = D;
    views[t]->stride[3] = 1;
  }
  CHECK(fa.launch(rt, cfg, &args, NULL));
  CHECK(fa.synchronize(rt, NULL));
  CHECK(fa.memcpy_dtoh(rt, half, dev[3], n * sizeof(uint16_t)));

  ok = fixture_check("dlopen_example", half, host[3], n);

  /* An error path through the table: a bad stride gives the detailed message. */
  args.q.stride[3] = 2;
  fa_status st = fa.launch(rt, cfg, &args, NULL);
  printf("bad q.stride[3]: %s: %s\n", fa.status_string(st), fa.last_error());
  if (st != FA_ERROR_INVALID_ARGUMENT) ok = 0;

  for (t = 0; t < 4; t++) {
    CHECK(fa.free_(rt, dev[t]));
    free(host[t]);
  }
  free(half);
  fa.config_destroy(cfg);
  fa.runtime_destroy(rt);
  dlclose(lib);
  return ok ? 0 : 1;
}
