/*
 * The Redis kernel store plugin (libflashattn_store_redis.so): a
 * fa_kernel_store (include/flashattn.h) over one Redis connection, for a
 * fleet sharing built kernels. libflashattn dlopens it when
 * FLASHATTN_KERNEL_STORE names a Redis URL; a program may also load it and
 * pass the store in fa_runtime_options.kernel_store. See README.md here.
 */
#ifndef FA_STORE_REDIS_H
#define FA_STORE_REDIS_H

#include <stddef.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *out with a store for `url`:
 *   redis://[[user]:password@]host[:port][/db]   (port 6379, db 0 by default)
 *   unix://[[user]:password@]/path/to/socket[?db=N]
 * (no percent-decoding; host may be a name, an IPv4 address or a bracketed
 * IPv6 address). Nothing is sent yet: a server that is down is fine, the
 * store connects on first use and again after errors, with backoff. On
 * failure (a malformed URL, out of memory) returns non-zero, writes why into
 * error[error_size] (NUL-terminated; error may be NULL) and leaves *out
 * untouched. out->destroy frees the store; out->name is the URL without
 * the password, valid until then. */
int fa_store_redis_create(const char *url, fa_kernel_store *out, char *error, size_t error_size);

/* The type of fa_store_redis_create, for dlsym. */
typedef int (*fa_store_redis_create_fn)(const char *url, fa_kernel_store *out, char *error,
                                        size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* FA_STORE_REDIS_H */
