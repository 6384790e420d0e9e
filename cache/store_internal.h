// Pieces shared by the store implementations: the in-memory store, the SQLite
// store's factory, and small helpers. Not part of the store interface.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cache/store.h"

namespace fa::cache {

// Seconds and milliseconds since the Unix epoch.
int64_t unix_now();
int64_t unix_now_ms();

// Who holds a compile lease: "<hostname>/<boot id>". Two holders with the same
// identity share a pid namespace as far as we can tell, so kill(pid, 0) on
// the holder's pid is meaningful.
const std::string &host_identity();

// The size cap: options.max_bytes when >= 0, else $FLASHATTN_CACHE_MAX_BYTES
// (bytes, with an optional K/M/G suffix, powers of 1024), else
// kDefaultMaxBytes. 0 = no cap. *warning is set for an unparsable variable.
int64_t resolve_max_bytes(const Options &options, std::string *warning);

// The 16-byte big-endian form of a key (hi first), as stored in the database.
void key_to_bytes(const Key &key, uint8_t out[16]);

// 32 lowercase hex digits for 16 bytes.
std::string bytes_to_hex(const uint8_t *bytes, size_t n);

// Keeps rows in a map for the life of the process. Used when the cache is
// disabled and as the fallback when the database cannot be used.
class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::string note) : note_(std::move(note)) {}
  using Store::get;
  bool get(const Key &key, const std::string &key_material, Record *out) override;
  void put(const Key &key, const Record &record) override;
  // Memory stores are private to the process: nothing to share, no lease.
  LeaseResult acquire_lease(const Key &, const std::string &, Record *) override {
    return LeaseResult::kSkipped;
  }
  void release_lease(const Key &) override {}
  Stats stats() override;
  std::vector<RowInfo> list() override;
  fa_status clear() override;

 private:
  struct Entry {
    Record record;
    int64_t created = 0, last_used = 0;
    uint64_t hits = 0;
  };
  std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, Entry> rows_;
  uint64_t hits_ = 0, misses_ = 0, puts_ = 0, collisions_ = 0;
  std::string note_;
};

// Settings of a SQLite store, resolved (no -1 or 0 defaults left).
struct SqliteSettings {
  int64_t max_bytes = kDefaultMaxBytes;  // 0 = no cap
  int lease_ttl_ms = kDefaultLeaseTtlMs;
  int lease_wait_ms = kDefaultLeaseWaitMs;
};

// Opens (creating if needed) the SQLite store at `path`. Returns null and sets
// *why when the file cannot be used at all; the caller falls back to memory.
std::unique_ptr<Store> open_sqlite_store(const std::string &path, const SqliteSettings &settings,
                                         std::string *why);

}  // namespace fa::cache
