// The kernel store: opaque blobs keyed by a 128-bit hash. A SQLite file on
// disk, or memory only when disabled or when the file cannot be used. It
// never fails a caller: every storage problem becomes a miss or a warning.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flashattn.h"

namespace fa::cache {

struct Key {
  uint64_t hi = 0, lo = 0;  // XXH3-128 high and low halves
  std::string hex() const;  // 32 lowercase hex digits, hi first
  bool operator==(const Key &o) const { return hi == o.hi && lo == o.lo; }
};

// XXH3-128 of bytes: the key of a row whose key material they are.
Key key_of_bytes(const std::string &bytes);

struct Record {
  std::string ptx;
  std::vector<uint8_t> cubin;  // empty when no binary was built (emulator)
  int driver_version = 0;      // driver the cubin was built (or last loaded) with; 0 if none
  // What built `cubin` (fa_cache_entry.compiler): the PTX compiler plugin's
  // version (a cubin), "driver-jit" (the PTX and a NUL), "driver-jit (cubin
  // of <version> refused)", or "" (none, or a row of schema version 2).
  std::string compiler;
  std::string spec_text;       // KernelSpec::describe()
  uint32_t generator_version = 0;
  int sm = 0;
  // The exact bytes hashed into the key (spec, generator version, SM, PTX
  // ISA). get() compares them, so a key collision is a miss, never a wrong
  // kernel. May be empty (no check) for callers that do not hash anything.
  std::string key_material;
};

struct RowInfo {
  std::string key_hex, spec_text;
  int sm = 0;
  uint32_t generator_version = 0;
  int driver_version = 0;
  std::string compiler;  // Record::compiler
  uint64_t ptx_bytes = 0, cubin_bytes = 0, hits = 0;
  int64_t created = 0, last_used = 0;  // Unix seconds
};

struct Stats {
  uint64_t hits = 0, misses = 0, puts = 0;
  uint64_t discarded = 0;   // rows dropped because a blob hash did not verify
  uint64_t collisions = 0;  // rows whose key matched but whose key material did not
  uint64_t evicted = 0;     // rows this store deleted to stay under max_bytes
  uint64_t resets = 0;      // damaged database files this store emptied in place
  // Compile leases (SQLite store only): taken, of which reclaimed from a dead
  // or expired holder; lookups answered by waiting for another holder's row;
  // waits that ran out (the caller then built the kernel without a lease).
  uint64_t leases = 0, leases_reclaimed = 0, lease_found = 0, lease_timeouts = 0;
  uint64_t entries = 0, bytes = 0;  // rows; PTX + cubin bytes in them
  uint64_t max_bytes = 0;           // size cap in force; 0 = none
  bool persistent = false;
  bool read_only = false;  // a root-owned file this user may only read: put() keeps rows in memory
  std::string path;  // database file; "" when memory only
  std::string note;  // why memory only / last warning
  // The second tier (remote_store.h; fa_cache_stats since 0.7): local
  // misses it served (verified, then copied into the local store), did not
  // have, rows written to it, failed calls, and rows it returned that
  // failed verification (also in discarded; its key material mismatches are
  // in collisions). The other fields describe the local store.
  uint64_t remote_hits = 0, remote_misses = 0, remote_puts = 0, remote_errors = 0;
  uint64_t remote_discarded = 0;
  std::string kernel_store;       // what the second tier is; "" = none
  std::string kernel_store_note;  // why FLASHATTN_KERNEL_STORE is unused / its first error
};

constexpr int64_t kDefaultMaxBytes = int64_t(1) << 30;  // 1 GiB
constexpr int kDefaultLeaseTtlMs = 60000;
constexpr int kDefaultLeaseWaitMs = 20000;

struct Options {
  // "" = $FLASHATTN_CACHE_DIR, else $XDG_CACHE_HOME/flashattn, else
  // $HOME/.cache/flashattn. The file is <dir>/kernels.sqlite3.
  std::string dir;
  bool memory_only = false;  // also forced by FLASHATTN_CACHE_DISABLE=1
  // Cap on the database's used pages, in bytes; least recently used rows are
  // evicted by put(). -1 = $FLASHATTN_CACHE_MAX_BYTES, else kDefaultMaxBytes;
  // 0 = no cap.
  int64_t max_bytes = -1;
  // A compile lease expires lease_ttl_ms after it was taken; a waiter gives
  // up after lease_wait_ms. 0 = the defaults above.
  int lease_ttl_ms = 0;
  int lease_wait_ms = 0;
};

// What acquire_lease() did.
enum class LeaseResult {
  kAcquired,  // the caller holds the lease: build, put(), then release_lease()
  kFound,     // the row is there now (another holder wrote it): *out is filled
  kTimedOut,  // a live holder kept it past lease_wait_ms: build without a lease
  kSkipped,   // no shared file (memory store, or the file was given up)
};

class Store {
 public:
  virtual ~Store() = default;
  // True and *out filled when key is present, both blob hashes verify and,
  // when key_material is not empty, the row's key material equals it. A row
  // that fails verification is deleted and counted in discarded; one with
  // other key material is a miss counted in collisions (the row stays).
  virtual bool get(const Key &key, const std::string &key_material, Record *out) = 0;
  bool get(const Key &key, Record *out) { return get(key, std::string(), out); }
  // Inserts or replaces the row for key in one transaction, evicting least
  // recently used rows to stay under the size cap, and drops this store's
  // compile lease on key in the same transaction.
  virtual void put(const Key &key, const Record &record) = 0;
  // Takes the cross-process compile lease for key, or waits (bounded) for
  // another holder to write the row. Never fails: see LeaseResult.
  virtual LeaseResult acquire_lease(const Key &key, const std::string &key_material,
                                    Record *out) = 0;
  // Drops this store's lease on key, if it still holds one.
  virtual void release_lease(const Key &key) = 0;
  virtual Stats stats() = 0;
  virtual std::vector<RowInfo> list() = 0;
  // Deletes all rows. Errors: FA_ERROR_CACHE (message set with fa::fail).
  virtual fa_status clear() = 0;
};

// Opens the store described by options; never fails (falls back to memory,
// with the reason in stats().note and a warning on stderr). Thread-safe:
// the returned store may be used from several threads.
std::unique_ptr<Store> open_store(const Options &options);

}  // namespace fa::cache
