// Pieces shared by the store implementations: the in-memory store, the SQLite
// store's factory, and small helpers. Not part of the store interface.
#pragma once

#include <sys/types.h>

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

// XXH3-128 of n bytes in canonical (big-endian) form: the blob hashes a row
// carries (p may be null when n is 0).
struct Hash {
  uint8_t b[16];
};
Hash hash_bytes(const void *p, size_t n);

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
  // A cache owned by root that this (non-root) user may only read: lookups
  // are served, nothing is written (docs/reliability.md, "Threat model").
  bool read_only = false;
};

// ---- Trust checks (trust.cc; docs/reliability.md, "Threat model") ---------
// Each returns "" when the path may be used, else why not (for the note).

struct TrustedDir {
  std::string dir;         // the cache directory, every symbolic link resolved
  bool read_only = false;  // owned by root, and this user is not root
};

// Creates the cache directory if missing (mkdir -p, mode 0700, only below a
// directory that passes the rule for directories above a cache) and checks
// it: owned by this user or root, writable by no one else, and every
// directory above it owned by this user or root and writable by no one else
// unless sticky. A group write bit counts only for a group other than the
// user's private group.
std::string prepare_cache_dir(const std::string &dir, TrustedDir *out);

// Checks the database file: never a symbolic link, a regular file owned by
// this user (or root: then *read_only is set) and writable by no one else;
// its -journal, -wal and -shm files, when present, likewise. A missing file
// is created empty with mode 0600 (not in a read-only cache); a file of this
// (non-root) user that others may read is made 0600.
std::string prepare_cache_file(const std::string &path, bool *read_only);

// Identity of the database file a connection opened.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
};

// The database path still passes the checks of prepare_cache_file and, when
// id->ino != 0, is the same file (id is filled otherwise). Run before SQLite
// opens the path and before a reset in place writes to it.
std::string check_db_file(const std::string &path, bool read_only, FileId *id);

// Checks a shared library before it is loaded (the PTX compiler plugin:
// code this process will run, under the same rules as the cache): `path`
// itself never a symbolic link, a regular file owned by this user or root
// and writable by no one else; its directory (links resolved) owned by this
// user or root and writable by no one else; every directory above that as
// for a cache. On success opens the file (O_RDONLY | O_NOFOLLOW) and stores
// the descriptor in *fd, so the caller loads the very file checked (dlopen
// of /proc/self/fd/N), and *real gets the path with the directory's links
// resolved. *fd is -1 on failure.
std::string open_trusted_code_file(const std::string &path, int *fd, std::string *real);

// Opens (creating if needed) the SQLite store at `path`. Returns null and sets
// *why when the file cannot be used at all; the caller falls back to memory.
std::unique_ptr<Store> open_sqlite_store(const std::string &path, const SqliteSettings &settings,
                                         std::string *why);

}  // namespace fa::cache
