/* C shims for the Go package: each calls one fa_ function and, on failure,
 * copies fa_last_error() into the caller's buffer in the same C call, so the
 * thread-local message is read on the thread that produced it (cgo may move
 * a goroutine to another OS thread between two C calls). */
#ifndef FLASHATTN_GO_SHIM_H
#define FLASHATTN_GO_SHIM_H

#include <flashattn.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fago_err {
  char msg[1024];
} fago_err;

/* One kernel-cache row, with spec and compiler copied into malloc'd memory. */
typedef struct fago_entry {
  char key[33];
  char *spec;
  int32_t sm;
  uint32_t generator_version;
  uint64_t ptx_bytes;
  uint64_t cubin_bytes;
  uint64_t hits;
  int64_t created;
  int64_t last_used;
  char *compiler; /* since 0.6 */
} fago_entry;

typedef struct fago_list {
  fago_entry *items;
  size_t len;
  size_t cap;
  int oom;
} fago_list;

fa_status fago_runtime_create(const fa_runtime_options *o, fa_runtime **out, fago_err *e);
fa_status fago_runtime_get_info(const fa_runtime *rt, fa_runtime_info *info, fago_err *e);
fa_status fago_malloc(fa_runtime *rt, size_t bytes, uint64_t *ptr, fago_err *e);
fa_status fago_free(fa_runtime *rt, uint64_t ptr, fago_err *e);
fa_status fago_memcpy_htod(fa_runtime *rt, uint64_t dst, const void *src, size_t bytes,
                           fago_err *e);
fa_status fago_memcpy_dtoh(fa_runtime *rt, void *dst, uint64_t src, size_t bytes, fago_err *e);
fa_status fago_memset(fa_runtime *rt, uint64_t dst, uint8_t value, size_t bytes, fago_err *e);
fa_status fago_synchronize(fa_runtime *rt, uint64_t stream, fago_err *e);
fa_status fago_config_create(const fa_config_desc *d, fa_config **out, fago_err *e);
/* Generates into a malloc'd string (*out, *len); the caller frees it. */
fa_status fago_generate(const fa_config *cfg, int32_t kind, int32_t sm, char **out, size_t *len,
                        fago_err *e);
fa_status fago_launch(fa_runtime *rt, const fa_config *cfg, const fa_forward_args *a,
                      uint64_t stream, fago_err *e);
fa_status fago_forward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                      const fa_forward_args *a, size_t *bytes, fago_err *e);
fa_status fago_backward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                       const fa_backward_args *a, size_t *bytes, fago_err *e);
fa_status fago_backward(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *a,
                        uint64_t stream, fago_err *e);
fa_status fago_decode_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                     const fa_decode_args *a, size_t *bytes, int32_t *splits,
                                     fago_err *e);
fa_status fago_decode(fa_runtime *rt, const fa_config *cfg, const fa_decode_args *a,
                      uint64_t stream, fago_err *e);
fa_status fago_decode_reduce(fa_runtime *rt, const fa_config *cfg, const fa_reduce_args *a,
                             uint64_t stream, fago_err *e);
fa_status fago_cache_stats(fa_runtime *rt, fa_cache_stats *s, fago_err *e);
/* Collects every cache entry into *l (free with fago_list_free). */
fa_status fago_cache_list(fa_runtime *rt, fago_list *l, fago_err *e);
void fago_list_free(fago_list *l);
fa_status fago_cache_clear(fa_runtime *rt, fago_err *e);
/* fa_cache_warm; with handle != 0 (a runtime/cgo.Handle), progress goes to
 * the Go function fagoWarmProgress(progress, handle). */
fa_status fago_cache_warm(fa_cache_warm_options *o, uintptr_t handle, fa_cache_warm_progress *r,
                          fago_err *e);
/* fa_cache_warm_preset; NULL with the message in *e when there is none. */
const char *fago_cache_warm_preset(const char *name, fago_err *e);

#endif
