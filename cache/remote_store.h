// The second tier of the kernel store: a caller's fa_kernel_store (C
// callbacks, include/flashattn.h) or the Redis plugin that
// $FLASHATTN_KERNEL_STORE names, behind the local store (SQLite or memory).
// See cache/README.md, "Remote tier".
#pragma once

#include <memory>

#include <string>

#include "cache/store.h"
#include "cache/store_internal.h"
#include "flashattn.h"

namespace fa::cache {

// The variable naming the second tier: redis://..., unix://..., or "off".
constexpr const char *kKernelStoreEnv = "FLASHATTN_KERNEL_STORE";
// An absolute path to the Redis plugin, instead of the file next to libflashattn.
constexpr const char *kKernelStorePluginEnv = "FLASHATTN_KERNEL_STORE_PLUGIN";
// The Redis plugin's file name and entry point (src/store_redis/).
constexpr const char *kRedisPluginName = "libflashattn_store_redis.so";
constexpr const char *kRedisCreateSymbol = "fa_store_redis_create";

// FA_SUCCESS when `store` may be used as a second tier, else
// FA_ERROR_INVALID_ARGUMENT with a message naming the field as `name`.field
// ("kernel_store.get is NULL"): struct_size other than
// sizeof(fa_kernel_store), get or put NULL.
fa_status check_kernel_store(const fa_kernel_store &store, const char *name);

// rec under the key `hex` (32 hex digits) as a fa_store_record: pointers
// into hex and rec (valid while they are), both blob hashes computed.
fa_store_record record_view(const std::string &hex, const Record &rec);

// Copies a record a store handed back into *key, *rec and the two hashes
// (NULL strings read as ""). "" on success, else why it cannot be taken: a
// null record, struct_size below sizeof(fa_store_record), a key without its
// NUL, a NULL blob with a non-zero size, out of memory. Never throws.
std::string copy_record(const fa_store_record *r, std::string *key, Record *rec, Hash *ptx_hash,
                        Hash *cubin_hash);

// `local` with `remote` behind it (remote checked by check_kernel_store).
// get(): the local store, then on a miss remote.get; a row it returns is
// verified (key = key_of_bytes(its key material), that material = the one
// asked for when given, the ptx and cubin hashes) and copied into the local
// store, or, failing, removed there and counted. put(): local, then remote.
// A failed callback is a miss or a skipped write, counted in
// remote_errors, with one warning per store. Leases, list() and clear() are
// the local store's; stats() is the local store's plus the remote counters.
// remote.destroy, when set, is called when the store is destroyed.
// Thread-safe as the local store is; callbacks may run concurrently.
std::unique_ptr<Store> make_tiered_store(std::unique_ptr<Store> local,
                                         const fa_kernel_store &remote);

// What Runtime::create uses: make_tiered_store(local, *explicit_store) when
// explicit_store is not null; else, when $FLASHATTN_KERNEL_STORE is set and
// not "off" (or 0, false, no), the Redis plugin's store for that URL
// (libflashattn_store_redis.so next to libflashattn, or
// $FLASHATTN_KERNEL_STORE_PLUGIN; the cache's trust checks; loaded once per
// process). Never fails: a variable that cannot be used gives one warning,
// the local store alone, and the reason in stats().kernel_store_note.
std::unique_ptr<Store> add_kernel_store(std::unique_ptr<Store> local,
                                        const fa_kernel_store *explicit_store);

}  // namespace fa::cache
