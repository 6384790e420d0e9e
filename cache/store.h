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

struct Record {
  std::string ptx;
  std::vector<uint8_t> cubin;  // empty when no binary was built (emulator)
  int driver_version = 0;      // driver the cubin was built with; 0 if none
  std::string spec_text;       // KernelSpec::describe()
  uint32_t generator_version = 0;
  int sm = 0;
};

struct RowInfo {
  std::string key_hex, spec_text;
  int sm = 0;
  uint32_t generator_version = 0;
  int driver_version = 0;
  uint64_t ptx_bytes = 0, cubin_bytes = 0, hits = 0;
  int64_t created = 0, last_used = 0;
};

struct Stats {
  uint64_t hits = 0, misses = 0, puts = 0;
  uint64_t discarded = 0;  // rows dropped because a blob hash did not verify
  uint64_t entries = 0, bytes = 0;
  bool persistent = false;
  std::string path;  // database file; "" when memory only
  std::string note;  // why memory only / last warning
};

struct Options {
  // "" = $FLASHATTN_CACHE_DIR, else $XDG_CACHE_HOME/flashattn, else
  // $HOME/.cache/flashattn. The file is <dir>/kernels.sqlite3.
  std::string dir;
  bool memory_only = false;  // also forced by FLASHATTN_CACHE_DISABLE=1
};

class Store {
 public:
  virtual ~Store() = default;
  // True and *out filled when key is present and both blob hashes verify.
  // A row that fails verification is deleted and counted in discarded.
  virtual bool get(const Key &key, Record *out) = 0;
  // Inserts or replaces the row for key in one transaction.
  virtual void put(const Key &key, const Record &record) = 0;
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
