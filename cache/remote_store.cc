// The second tier: a caller's fa_kernel_store behind the local store, and
// the Redis plugin that $FLASHATTN_KERNEL_STORE names (remote_store.h).
//
// Rows from the second tier are code this process will run, so each is
// verified like a SQLite row (its key is the hash of its key material, that
// material is the kernel's, and the ptx and cubin hashes match) before it
// is copied into the local store. Nothing the tier does fails a caller: an
// error is a miss or a skipped write.
#include "cache/remote_store.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "cache/store_internal.h"
#include "common/error.h"
#include "common/plugin.h"
#include "store_redis/fa_store_redis.h"

namespace fa::cache {

fa_store_record record_view(const std::string &hex, const Record &rec) {
  fa_store_record r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  std::snprintf(r.key, sizeof r.key, "%s", hex.c_str());
  r.key_material = reinterpret_cast<const uint8_t *>(rec.key_material.data());
  r.key_material_size = rec.key_material.size();
  r.spec = rec.spec_text.c_str();
  r.sm = rec.sm;
  r.generator_version = rec.generator_version;
  r.driver_version = rec.driver_version;
  r.compiler = rec.compiler.c_str();
  r.ptx = reinterpret_cast<const uint8_t *>(rec.ptx.data());
  r.ptx_size = rec.ptx.size();
  r.cubin = rec.cubin.data();
  r.cubin_size = rec.cubin.size();
  std::memcpy(r.ptx_hash, hash_bytes(r.ptx, r.ptx_size).b, 16);
  std::memcpy(r.cubin_hash, hash_bytes(r.cubin, r.cubin_size).b, 16);
  return r;
}

namespace {

// Copies size bytes at p into *out; false for a null pointer with size > 0.
template <typename Out>
bool take_bytes(const uint8_t *p, size_t size, Out *out) {
  if (size > 0 && p == nullptr) return false;
  out->assign(p, p + size);
  return true;
}

}  // namespace

std::string copy_record(const fa_store_record *r, std::string *key, Record *rec, Hash *ptx_hash,
                        Hash *cubin_hash) {
  if (r == nullptr) return "found was called with NULL";
  if (r->struct_size < sizeof(fa_store_record)) {
    return "found was called with a record whose struct_size is " + std::to_string(r->struct_size) +
           ", not " + std::to_string(sizeof(fa_store_record));
  }
  try {
    if (std::memchr(r->key, 0, sizeof r->key) == nullptr) return "the record's key has no NUL";
    *key = r->key;
    if (!take_bytes(r->key_material, r->key_material_size, &rec->key_material) ||
        !take_bytes(r->ptx, r->ptx_size, &rec->ptx) ||
        !take_bytes(r->cubin, r->cubin_size, &rec->cubin)) {
      return "the record has a NULL key_material, ptx or cubin with a non-zero size";
    }
    rec->spec_text = r->spec ? r->spec : "";
    rec->compiler = r->compiler ? r->compiler : "";
    rec->sm = r->sm;
    rec->generator_version = r->generator_version;
    rec->driver_version = r->driver_version;
    std::memcpy(ptx_hash->b, r->ptx_hash, 16);
    std::memcpy(cubin_hash->b, r->cubin_hash, 16);
    return "";
  } catch (const std::bad_alloc &) {
    return "out of memory copying the record";
  } catch (...) {
    return "cannot copy the record";
  }
}

fa_status check_kernel_store(const fa_kernel_store &store, const char *name) {
  if (store.struct_size != sizeof(fa_kernel_store)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "%s.struct_size is %zu, expected %zu (sizeof(fa_kernel_store))", name,
                store.struct_size, sizeof(fa_kernel_store));
  }
  if (store.get == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "%s.get is NULL", name);
  if (store.put == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "%s.put is NULL", name);
  return FA_SUCCESS;
}

namespace {

// What a get callback handed to found, copied.
struct Found {
  int calls = 0;
  std::string key;
  Record rec;
  Hash ptx_hash{}, cubin_hash{};
  std::string why;      // not "" when the record could not be taken
  bool failed = false;  // copying it threw (out of memory)
};

extern "C" {
// fa_store_found_fn: copies the row (a C callback: nothing may escape).
static void on_found(void *ctx, const fa_store_record *r) {
  Found *f = static_cast<Found *>(ctx);
  if (++f->calls > 1) return;  // the first row counts
  try {
    f->why = copy_record(r, &f->key, &f->rec, &f->ptx_hash, &f->cubin_hash);
  } catch (...) {
    f->failed = true;
  }
}
}  // extern "C"

const char *result_name(int rc) {
  switch (rc) {
    case FA_STORE_OK:
      return "FA_STORE_OK";
    case FA_STORE_NOT_FOUND:
      return "FA_STORE_NOT_FOUND";
    case FA_STORE_ERROR:
      return "FA_STORE_ERROR";
    case FA_STORE_DAMAGED:
      return "FA_STORE_DAMAGED";
    default:
      return "an unknown result";
  }
}

bool same_hash(const Hash &a, const Hash &b) { return std::memcmp(a.b, b.b, 16) == 0; }

class TieredStore final : public Store {
 public:
  // remote null: no second tier (FLASHATTN_KERNEL_STORE could not be used;
  // note says why).
  TieredStore(std::unique_ptr<Store> local, const fa_kernel_store *remote, std::string note)
      : local_(std::move(local)), note_(std::move(note)) {
    if (remote) {
      remote_ = *remote;
      have_remote_ = true;
      name_ = remote->name && remote->name[0] ? remote->name : "caller's kernel store";
    }
  }
  ~TieredStore() override {
    if (have_remote_ && remote_.destroy) remote_.destroy(remote_.user);
  }
  TieredStore(const TieredStore &) = delete;
  TieredStore &operator=(const TieredStore &) = delete;

  using Store::get;
  bool get(const Key &key, const std::string &key_material, Record *out) override {
    if (local_->get(key, key_material, out)) return true;
    if (!have_remote_) return false;
    Record rec;
    if (!fetch(key, key_material, &rec)) return false;
    local_->put(key, rec);
    ++hits_;
    if (out) *out = std::move(rec);
    return true;
  }

  void put(const Key &key, const Record &record) override {
    local_->put(key, record);
    if (!have_remote_) return;
    const std::string hex = key.hex();
    const fa_store_record r = record_view(hex, record);
    const int rc = remote_.put(remote_.user, &r);
    if (rc == FA_STORE_OK) {
      ++puts_;
    } else {
      error("put of " + hex + " returned " + result_name(rc));
    }
  }

  LeaseResult acquire_lease(const Key &key, const std::string &key_material, Record *out) override {
    return local_->acquire_lease(key, key_material, out);
  }
  void release_lease(const Key &key) override { local_->release_lease(key); }

  Stats stats() override {
    Stats s = local_->stats();
    s.remote_hits = hits_;
    s.remote_misses = misses_;
    s.remote_puts = puts_;
    s.remote_errors = errors_;
    s.remote_discarded = discarded_;
    s.discarded += discarded_;
    s.collisions += collisions_;
    s.kernel_store = name_;
    std::lock_guard<std::mutex> lock(mu_);
    s.kernel_store_note = note_;
    return s;
  }
  std::vector<RowInfo> list() override { return local_->list(); }
  fa_status clear() override { return local_->clear(); }

 private:
  // Asks the second tier for key; true and *out filled with a verified row.
  bool fetch(const Key &key, const std::string &key_material, Record *out) {
    const std::string hex = key.hex();
    Found f;
    const int rc = remote_.get(remote_.user, hex.c_str(),
                               reinterpret_cast<const uint8_t *>(key_material.data()),
                               key_material.size(), on_found, &f);
    if (rc == FA_STORE_NOT_FOUND) {
      ++misses_;
      return false;
    }
    if (rc == FA_STORE_DAMAGED) {
      discard(hex, "the store could not decode it");
      return false;
    }
    if (rc != FA_STORE_OK) {
      error("get of " + hex + " returned " + result_name(rc));
      return false;
    }
    if (f.calls == 0) {
      error("get of " + hex + " returned FA_STORE_OK without calling found");
      return false;
    }
    if (f.failed || !f.why.empty()) {
      error("get of " + hex + ": " + (f.failed ? std::string("out of memory") : f.why));
      return false;
    }
    if (f.key != hex) {
      error("get of " + hex + " returned the row of key " + f.key.substr(0, 40));
      return false;
    }
    const Record &rec = f.rec;
    if (!(key_of_bytes(rec.key_material) == key)) {
      discard(hex, "its key is not the hash of its key material");
      return false;
    }
    if (!same_hash(hash_bytes(rec.ptx.data(), rec.ptx.size()), f.ptx_hash) ||
        !same_hash(hash_bytes(rec.cubin.data(), rec.cubin.size()), f.cubin_hash)) {
      discard(hex, "blob hash mismatch");
      return false;
    }
    if (!key_material.empty() && rec.key_material != key_material) {
      // Another kernel with the same 128-bit key: a miss; the caller's put()
      // replaces the row, as in the local store.
      ++collisions_;
      ++misses_;
      fa::warn("kernel store row " + hex + " holds another kernel's key material (collision)");
      return false;
    }
    *out = std::move(f.rec);
    return true;
  }

  // A row that failed verification: counted, removed from the second tier.
  void discard(const std::string &hex, const std::string &why) {
    ++discarded_;
    fa::warn("discarded kernel store row " + hex + " (" + name_ + "): " + why);
    if (remote_.remove == nullptr) return;
    const int rc = remote_.remove(remote_.user, hex.c_str());
    if (rc != FA_STORE_OK && rc != FA_STORE_NOT_FOUND) {
      error("remove of " + hex + " returned " + result_name(rc));
    }
  }

  // A failed call: counted; the first one is warned about and kept in the note.
  void error(const std::string &what) {
    ++errors_;
    std::lock_guard<std::mutex> lock(mu_);
    if (warned_) return;
    warned_ = true;
    note_ = name_ + ": " + what;
    fa::warn("kernel store " + note_ +
             "; the local cache serves alone (later errors are counted in "
             "fa_cache_stats.remote_errors)");
  }

  std::unique_ptr<Store> local_;
  fa_kernel_store remote_{};
  bool have_remote_ = false;
  std::string name_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, puts_{0}, errors_{0}, discarded_{0}, collisions_{0};
  std::mutex mu_;  // guards note_, warned_
  std::string note_;
  bool warned_ = false;
};

// The URL with any password replaced by "***" (for messages).
std::string redact_url(const std::string &url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t start = scheme + 3;
  const size_t slash = url.find('/', start);
  const size_t at = url.rfind('@', slash == std::string::npos ? std::string::npos : slash);
  if (at == std::string::npos || at < start) return url;
  const size_t colon = url.find(':', start);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

// The Redis plugin's entry point, looked up once per process; null with
// *why when it cannot be used.
fa_store_redis_create_fn redis_plugin(std::string *why) {
  static fa_store_redis_create_fn create = nullptr;
  static std::string note;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string path;
    if (const char *p = std::getenv(kKernelStorePluginEnv); p && p[0]) {
      if (p[0] != '/') {
        note = std::string(kKernelStorePluginEnv) + "=" + p + " is not an absolute path";
        return;
      }
      path = p;
    }
    const PluginFile file = open_plugin(path, kRedisPluginName, "Redis kernel store plugin");
    if (file.handle == nullptr) {
      note = file.why;
      return;
    }
    // Never dlclose'd: stores made by it may live as long as the process.
    create = reinterpret_cast<fa_store_redis_create_fn>(dlsym(file.handle, kRedisCreateSymbol));
    if (create == nullptr) note = file.path + " lacks " + kRedisCreateSymbol;
  });
  *why = note;
  return create;
}

// The store FLASHATTN_KERNEL_STORE=url names; false with *why when none.
bool store_from_url(const char *url, fa_kernel_store *out, std::string *why) {
  if (std::strncmp(url, "redis://", 8) != 0 && std::strncmp(url, "unix://", 7) != 0) {
    *why = "not a redis:// or unix:// URL (or off)";
    return false;
  }
  const fa_store_redis_create_fn create = redis_plugin(why);
  if (create == nullptr) return false;
  char err[256] = {0};
  std::memset(out, 0, sizeof *out);
  if (create(url, out, err, sizeof err) != 0) {
    *why = std::string("the Redis plugin refused it: ") + (err[0] ? err : "no reason given");
    return false;
  }
  if (check_kernel_store(*out, "the Redis plugin's store") != FA_SUCCESS) {
    *why = last_error();
    clear_error();
    if (out->struct_size == sizeof *out && out->destroy) out->destroy(out->user);
    return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Store> make_tiered_store(std::unique_ptr<Store> local,
                                         const fa_kernel_store &remote) {
  return std::make_unique<TieredStore>(std::move(local), &remote, "");
}

std::unique_ptr<Store> add_kernel_store(std::unique_ptr<Store> local,
                                        const fa_kernel_store *explicit_store) {
  if (explicit_store) return make_tiered_store(std::move(local), *explicit_store);
  const char *url = std::getenv(kKernelStoreEnv);
  if (url == nullptr || url[0] == '\0' || turned_off(url)) return local;
  fa_kernel_store store;
  std::string why;
  if (store_from_url(url, &store, &why)) return make_tiered_store(std::move(local), store);
  const std::string note =
      std::string(kKernelStoreEnv) + "=" + redact_url(url) + " not used: " + why;
  fa::warn(note + " (the local cache serves alone)");
  return std::make_unique<TieredStore>(std::move(local), nullptr, note);
}

}  // namespace fa::cache
