#include "shim.h"

#include "_cgo_export.h" /* fagoWarmProgress (warm.go) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records the calling thread's message when st is a failure. */
static fa_status take(fa_status st, fago_err *e) {
  if (st != FA_SUCCESS) {
    snprintf(e->msg, sizeof e->msg, "%s", fa_last_error());
  } else {
    e->msg[0] = '\0';
  }
  return st;
}

fa_status fago_runtime_create(const fa_runtime_options *o, fa_runtime **out, fago_err *e) {
  return take(fa_runtime_create(o, out), e);
}

fa_status fago_runtime_get_info(const fa_runtime *rt, fa_runtime_info *info, fago_err *e) {
  return take(fa_runtime_get_info(rt, info), e);
}

fa_status fago_malloc(fa_runtime *rt, size_t bytes, uint64_t *ptr, fago_err *e) {
  return take(fa_malloc(rt, bytes, ptr), e);
}

fa_status fago_free(fa_runtime *rt, uint64_t ptr, fago_err *e) { return take(fa_free(rt, ptr), e); }

fa_status fago_memcpy_htod(fa_runtime *rt, uint64_t dst, const void *src, size_t bytes,
                           fago_err *e) {
  return take(fa_memcpy_htod(rt, dst, src, bytes), e);
}

fa_status fago_memcpy_dtoh(fa_runtime *rt, void *dst, uint64_t src, size_t bytes, fago_err *e) {
  return take(fa_memcpy_dtoh(rt, dst, src, bytes), e);
}

fa_status fago_memset(fa_runtime *rt, uint64_t dst, uint8_t value, size_t bytes, fago_err *e) {
  return take(fa_memset(rt, dst, value, bytes), e);
}

fa_status fago_synchronize(fa_runtime *rt, uint64_t stream, fago_err *e) {
  return take(fa_synchronize(rt, (void *)(uintptr_t)stream), e);
}

fa_status fago_config_create(const fa_config_desc *d, fa_config **out, fago_err *e) {
  return take(fa_config_create(d, out), e);
}

fa_status fago_generate(const fa_config *cfg, int32_t kind, int32_t sm, char **out, size_t *len,
                        fago_err *e) {
  *out = NULL;
  *len = 0;
  size_t n = 0;
  fa_status st = fa_generate(cfg, (fa_kernel_kind)kind, sm, NULL, 0, &n);
  if (st != FA_SUCCESS && st != FA_ERROR_BUFFER_TOO_SMALL) return take(st, e);
  char *buf = malloc(n + 1);
  if (buf == NULL) {
    snprintf(e->msg, sizeof e->msg, "fa_generate: cannot allocate %zu bytes", n + 1);
    return FA_ERROR_OUT_OF_MEMORY;
  }
  st = fa_generate(cfg, (fa_kernel_kind)kind, sm, buf, n + 1, &n);
  if (st != FA_SUCCESS) {
    free(buf);
    return take(st, e);
  }
  *out = buf;
  *len = n;
  return take(st, e);
}

fa_status fago_launch(fa_runtime *rt, const fa_config *cfg, const fa_forward_args *a,
                      uint64_t stream, fago_err *e) {
  return take(fa_launch(rt, cfg, a, (void *)(uintptr_t)stream), e);
}

fa_status fago_forward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                      const fa_forward_args *a, size_t *bytes, fago_err *e) {
  return take(fa_forward_workspace_size(rt, cfg, a, bytes), e);
}

/* The backward (0.9) is referenced weakly, so that the package still links
 * and runs against an older library: there its functions are NULL and the
 * calls below say so. */
#pragma weak fa_backward
#pragma weak fa_backward_workspace_size

static fa_status no_backward(const char *what, fago_err *e) {
  snprintf(e->msg, sizeof e->msg,
           "%s: the loaded libflashattn has no fa_backward (it needs flashattn 0.9 or later)",
           what);
  return FA_ERROR_UNSUPPORTED;
}

fa_status fago_backward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                       const fa_backward_args *a, size_t *bytes, fago_err *e) {
  if (!fa_backward_workspace_size) return no_backward("fa_backward_workspace_size", e);
  return take(fa_backward_workspace_size(rt, cfg, a, bytes), e);
}

fa_status fago_backward(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *a,
                        uint64_t stream, fago_err *e) {
  if (!fa_backward) return no_backward("fa_backward", e);
  return take(fa_backward(rt, cfg, a, (void *)(uintptr_t)stream), e);
}

fa_status fago_decode_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                     const fa_decode_args *a, size_t *bytes, int32_t *splits,
                                     fago_err *e) {
  return take(fa_decode_workspace_size(rt, cfg, a, bytes, splits), e);
}

fa_status fago_decode(fa_runtime *rt, const fa_config *cfg, const fa_decode_args *a,
                      uint64_t stream, fago_err *e) {
  return take(fa_decode(rt, cfg, a, (void *)(uintptr_t)stream), e);
}

fa_status fago_decode_reduce(fa_runtime *rt, const fa_config *cfg, const fa_reduce_args *a,
                             uint64_t stream, fago_err *e) {
  return take(fa_decode_reduce(rt, cfg, a, (void *)(uintptr_t)stream), e);
}

fa_status fago_cache_stats(fa_runtime *rt, fa_cache_stats *s, fago_err *e) {
  return take(fa_cache_stats_get(rt, s), e);
}

/* fa_cache_list callback: appends a copy of the entry; stops on OOM. */
static int collect(const fa_cache_entry *en, void *user) {
  fago_list *l = (fago_list *)user;
  if (l->len == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    fago_entry *items = realloc(l->items, cap * sizeof *items);
    if (items == NULL) {
      l->oom = 1;
      return 1;
    }
    l->items = items;
    l->cap = cap;
  }
  fago_entry *d = &l->items[l->len];
  memcpy(d->key, en->key, sizeof d->key);
  d->key[sizeof d->key - 1] = '\0';
  d->spec = strdup(en->spec ? en->spec : "");
  d->compiler = strdup(en->compiler ? en->compiler : "");
  if (d->spec == NULL || d->compiler == NULL) {
    free(d->spec);
    free(d->compiler);
    l->oom = 1;
    return 1;
  }
  d->sm = en->sm;
  d->generator_version = en->generator_version;
  d->ptx_bytes = en->ptx_bytes;
  d->cubin_bytes = en->cubin_bytes;
  d->hits = en->hits;
  d->created = en->created;
  d->last_used = en->last_used;
  l->len++;
  return 0;
}

fa_status fago_cache_list(fa_runtime *rt, fago_list *l, fago_err *e) {
  memset(l, 0, sizeof *l);
  fa_status st = fa_cache_list(rt, collect, l);
  if (st == FA_SUCCESS && l->oom) {
    fago_list_free(l);
    snprintf(e->msg, sizeof e->msg, "fa_cache_list: out of host memory collecting entries");
    return FA_ERROR_OUT_OF_MEMORY;
  }
  if (st != FA_SUCCESS) fago_list_free(l);
  return take(st, e);
}

void fago_list_free(fago_list *l) {
  for (size_t i = 0; i < l->len; ++i) {
    free(l->items[i].spec);
    free(l->items[i].compiler);
  }
  free(l->items);
  memset(l, 0, sizeof *l);
}

fa_status fago_cache_clear(fa_runtime *rt, fago_err *e) { return take(fa_cache_clear(rt), e); }

/* fa_cache_warm_progress_fn: hands each report to Go with the handle. */
static void warm_progress(const fa_cache_warm_progress *p, void *user) {
  fagoWarmProgress((fa_cache_warm_progress *)p, (uintptr_t)user);
}

fa_status fago_cache_warm(fa_cache_warm_options *o, uintptr_t handle, fa_cache_warm_progress *r,
                          fago_err *e) {
  if (handle != 0) {
    o->progress = warm_progress;
    o->user = (void *)handle;
  }
  return take(fa_cache_warm(o, r), e);
}

const char *fago_cache_warm_preset(const char *name, fago_err *e) {
  const char *text = fa_cache_warm_preset(name);
  take(text != NULL ? FA_SUCCESS : FA_ERROR_INVALID_ARGUMENT, e);
  return text;
}
