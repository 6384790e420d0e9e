// The SQLite kernel store: one table, one row per kernel, written in one
// transaction. Every storage problem becomes a miss, a skipped write, an
// in-place reset of a corrupt file, or a fall back to memory; never an error
// for the caller.
//
// Journal mode: rollback journal (DELETE), not WAL. Debian's SQLite 3.40
// predates the fix (3.51.3) for the WAL-reset race, where two connections
// checkpointing and resetting the WAL at the same time can corrupt the file.
// The bug needs WAL mode, and many processes sharing this file is exactly our
// workload. Writes are rare (one per compiled kernel), so WAL's concurrency
// gain is not worth that risk. The blob hashes are a second line: a damaged
// row becomes a miss, never a wrong kernel.
//
// Compile leases (table `leases`, one row per key being built) let one
// process build a kernel while the others wait for its row; a size cap
// evicts least recently used rows inside put()'s transaction. See
// docs/reliability.md.
//
// The file is opened only after the trust checks (trust.cc) passed, never
// through a symbolic link (SQLITE_OPEN_NOFOLLOW), and never created by SQLite
// (the checks create it with mode 0600; SQLite gives its journal the
// database's mode). A lock that another connection keeps without making
// progress delays a launch by about kStuckMs at most (on_busy()).
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "cache/store_internal.h"
#include "common/error.h"

namespace fa::cache {
namespace {

constexpr int kSchemaVersion = 3;      // PRAGMA user_version; bump on any schema change
// Version 2 (flashattn 0.2 to 0.5) lacks kernels.compiler; it is migrated in
// place (ALTER TABLE ... ADD COLUMN, the rows kept, compiler ''), and a
// read-only version 2 cache is read with compiler ''.
constexpr int kSchemaVersionNoCompiler = 2;
constexpr int kBusyTimeoutMs = 10000;  // longest wait for a lock whose holders progress
// A lock wait ends after kStuckMs in which neither the database nor its
// journal changed: the holder is not letting go (a stopped process, a
// reader that never ends its transaction). For kStuckCooldownMs after that,
// a statement that meets a lock gives up at once, so one launch (a lookup, a
// lease, a write) is delayed about kStuckMs in all.
constexpr int kStuckMs = 1500;
constexpr int kStuckCooldownMs = 10000;
constexpr int kTouchTimeoutMs = 50;       // a hits/last_used flush gives up if busy longer
constexpr int64_t kTouchFlushMs = 30000;  // get() flushes pending hits at most this often
constexpr size_t kMaxPendingTouches = 4096;
constexpr int kMaintTimeoutMs = 200;  // VACUUM after clear() is best effort

constexpr int kLeaseMaxSleepMs = 50;  // a lease waiter polls at most this far apart

// Small columns first: reading them never walks the blobs' overflow pages.
// Times are Unix milliseconds, so LRU order holds within a second.
constexpr const char *kCreateTables =
    "CREATE TABLE IF NOT EXISTS kernels ("
    " key BLOB PRIMARY KEY NOT NULL CHECK (length(key) = 16),"
    " key_material BLOB NOT NULL,"
    " spec TEXT NOT NULL,"
    " sm INTEGER NOT NULL,"
    " generator_version INTEGER NOT NULL,"
    " driver_version INTEGER NOT NULL,"
    " compiler TEXT NOT NULL DEFAULT '',"
    " created_ms INTEGER NOT NULL,"
    " last_used_ms INTEGER NOT NULL,"
    " hits INTEGER NOT NULL DEFAULT 0,"
    " ptx_hash BLOB NOT NULL,"
    " cubin_hash BLOB NOT NULL,"
    " ptx BLOB NOT NULL,"
    " cubin BLOB NOT NULL);"
    "CREATE INDEX IF NOT EXISTS kernels_lru ON kernels (last_used_ms, created_ms);"
    "CREATE TABLE IF NOT EXISTS leases ("
    " key BLOB PRIMARY KEY NOT NULL,"
    " pid INTEGER NOT NULL,"
    " host TEXT NOT NULL,"
    " token INTEGER NOT NULL,"
    " expires_ms INTEGER NOT NULL);";

constexpr const char *kDropTables =
    "DROP TABLE IF EXISTS kernels; DROP TABLE IF EXISTS leases;"
    " DROP INDEX IF EXISTS kernels_lru;";

// The compile-lease tokens held by live stores of this process. A lease row
// with our own pid is alive only while its token is here: a store that gave
// up its file (disk full, I/O error) may have left its row behind.
class LiveTokens {
 public:
  static LiveTokens &get() {
    static LiveTokens *t = new LiveTokens;  // never destroyed: used at exit
    return *t;
  }
  void add(int64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.insert(token);
  }
  void remove(int64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.erase(token);
  }
  bool contains(int64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_.count(token) != 0;
  }

 private:
  std::mutex mu_;
  std::set<int64_t> tokens_;
};

// True when the lease holder (pid on host, with token) may still be
// building. Only a holder on this host (same boot) can be checked; others
// live until expiry.
bool holder_alive(int64_t pid, const std::string &host, int64_t token) {
  if (host != host_identity() || pid <= 0 || pid > INT32_MAX) return true;
  if (pid == getpid()) return LiveTokens::get().contains(token);  // a store in this process
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

bool is_corrupt(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

bool is_busy(int rc) {
  rc &= 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

// A prepared statement that finalizes itself. A failed prepare makes step()
// return the prepare error, so callers check one code.
class Stmt {
 public:
  Stmt(sqlite3 *db, const char *sql) { prep_rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt &) = delete;
  Stmt &operator=(const Stmt &) = delete;

  // Binds n bytes as a blob; never binds NULL, even for n == 0.
  void blob(int i, const void *p, size_t n) {
    if (s_) sqlite3_bind_blob64(s_, i, n ? p : "", n, SQLITE_TRANSIENT);
  }
  void text(int i, const std::string &t) {
    if (s_) sqlite3_bind_text64(s_, i, t.data(), t.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  }
  void int64(int i, int64_t v) {
    if (s_) sqlite3_bind_int64(s_, i, v);
  }
  int step() { return s_ ? sqlite3_step(s_) : (prep_rc_ ? prep_rc_ : SQLITE_MISUSE); }
  // Ends the statement's read so its locks are released.
  void reset() {
    if (s_) sqlite3_reset(s_);
  }

  // Column accessors for the current row.
  int64_t col_int(int i) { return sqlite3_column_int64(s_, i); }
  size_t col_size(int i) { return static_cast<size_t>(sqlite3_column_bytes(s_, i)); }
  const uint8_t *col_blob(int i) {
    const void *p = sqlite3_column_blob(s_, i);
    return p ? static_cast<const uint8_t *>(p) : reinterpret_cast<const uint8_t *>("");
  }
  std::string col_text(int i) {
    const uint8_t *p = col_blob(i);
    return std::string(reinterpret_cast<const char *>(p), col_size(i));
  }

 private:
  sqlite3_stmt *s_ = nullptr;
  int prep_rc_ = SQLITE_OK;
};

// What a busy handler compares to tell a lock holder at work from a stuck
// one: the database's and the journal's identity, size and modification
// time (stat only: no descriptor of ours may touch the file's locks).
struct FileSig {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = -1;
  int64_t mtime_ns = -1;
  bool operator==(const FileSig &o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};
FileSig file_sig(const std::string &path) {
  FileSig f;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    f.dev = st.st_dev;
    f.ino = st.st_ino;
    f.size = st.st_size;
    f.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  return f;
}

using Clock = std::chrono::steady_clock;

// Why a lock wait ended early, for notes.
std::string stuck_text() {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (locked %.1f s without progress; no lock waits for %d s)",
                kStuckMs / 1000.0, kStuckCooldownMs / 1000);
  return buf;
}

class SqliteStore final : public Store {
 public:
  SqliteStore(std::string path, const SqliteSettings &settings)
      : path_(std::move(path)), settings_(settings), pid_(getpid()) {
    std::random_device rd;
    rng_.seed((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid()) ^ uint64_t(unix_now_ms()));
  }
  ~SqliteStore() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (db_ && pid_ == getpid()) {
      const auto held = held_;  // drop_lease() may degrade, which clears held_
      for (const auto &kv : held) drop_lease(kv.first, kv.second);
      flush_touches(kTouchTimeoutMs);
    }
    forget_leases();
    close();
  }

  // Opens the connection and prepares the schema; "" or why it failed.
  std::string open() {
    std::lock_guard<std::mutex> lock(mu_);
    return connect();
  }

  using Store::get;
  bool get(const Key &key, const std::string &key_material, Record *out) override;
  void put(const Key &key, const Record &record) override;
  LeaseResult acquire_lease(const Key &key, const std::string &key_material, Record *out) override;
  void release_lease(const Key &key) override;
  Stats stats() override;
  std::vector<RowInfo> list() override;
  fa_status clear() override;

 private:
  enum class Try { kAcquired, kFound, kWait, kBusy };
  using KeyPair = std::pair<uint64_t, uint64_t>;
  // Everything below runs with mu_ held.
  std::string connect();
  static int busy_callback(void *store, int count) {
    return static_cast<SqliteStore *>(store)->on_busy(count);
  }
  int on_busy(int count);
  bool locked_out() const { return Clock::now() < stuck_until_; }
  int setup_schema();
  int schema_state(int *version, bool *has_tables);
  int reset_in_place();
  int reset_and_setup();
  int exec(const char *sql) { return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr); }
  void rollback_if_open() {
    if (db_ && !sqlite3_get_autocommit(db_)) exec("ROLLBACK");
  }
  bool usable();
  bool on_error(int rc, const std::string &what);
  void degrade(const std::string &why);
  void close();
  bool get_locked(const Key &key, const std::string &key_material, Record *out);
  int write_row(const Key &key, const Record &r, const Hash &ph, const Hash &ch, uint64_t *evicted);
  int evict(int64_t keep_rowid, uint64_t *evicted);
  int apply_touches();
  void flush_touches(int timeout_ms);
  int row_exists(const uint8_t key[16], const std::string &key_material, bool *exists);
  int lease_taken(const uint8_t key[16], bool *taken, bool *present);
  Try try_lease(const Key &key, const std::string &key_material, Record *out);
  void drop_lease(const KeyPair &key, int64_t token);
  // Stop holding leases (the rows stay; see LiveTokens).
  void forget_lease(const KeyPair &key) {
    auto it = held_.find(key);
    if (it == held_.end()) return;
    LiveTokens::get().remove(it->second);
    held_.erase(it);
  }
  void forget_leases() {
    for (const auto &kv : held_) LiveTokens::get().remove(kv.second);
    held_.clear();
  }

  std::mutex mu_;
  std::string path_;
  SqliteSettings settings_;
  FileId file_id_;       // the file db_ opened
  // How queries read kernels.compiler: the column, or '' in a read-only
  // version 2 cache (which cannot be migrated).
  const char *compiler_col_ = "compiler";
  std::string refusal_;  // why the last SQLITE_CANTOPEN of ours (not SQLite's) was returned
  // Lock waits (on_busy): the longest wait now, when the current one began,
  // when the files last changed and how they looked, and until when waits
  // give up at once.
  int busy_limit_ms_ = kBusyTimeoutMs;
  Clock::time_point wait_start_, last_change_, stuck_until_;
  FileSig db_sig_, journal_sig_;
  pid_t pid_;  // process that opened db_; a forked child reconnects
  sqlite3 *db_ = nullptr;
  std::unique_ptr<MemoryStore> mem_;  // set once the file is given up
  std::string note_;
  uint64_t hits_ = 0, misses_ = 0, puts_ = 0, discarded_ = 0, collisions_ = 0, evicted_ = 0;
  uint64_t resets_ = 0;
  uint64_t leases_ = 0, leases_reclaimed_ = 0, lease_found_ = 0, lease_timeouts_ = 0;
  std::map<KeyPair, int64_t> held_;  // compile leases this store holds: key -> token
  std::mt19937_64 rng_;              // lease tokens
  // Hits not yet written to the file: a row update per get() would cost a
  // write transaction (several fsyncs) on the lookup path. They are written
  // with the next put(), by stats()/list(), every kTouchFlushSecs, and when
  // the store is destroyed; best effort, lost on a crash.
  struct Touch {
    uint64_t hits = 0;
    int64_t last_used = 0;
  };
  std::map<KeyPair, Touch> touches_;
  int64_t last_flush_ = unix_now_ms();
};

// Closes the connection unless it was inherited through fork(): closing the
// parent's handle in a child could disturb the parent's locks and journal.
void SqliteStore::close() {
  if (db_ && pid_ == getpid()) sqlite3_close_v2(db_);
  db_ = nullptr;
}

// Opens path_ (which the trust checks created) read-write, or read-only for
// a root-owned cache, and prepares the schema; a file that is not a database
// or is corrupt is reset in place.
std::string SqliteStore::connect() {
  // The path must still be the file that was checked, before and after
  // SQLite opens it (a forked child reconnects here too).
  refusal_.clear();
  FileId id;
  if (std::string why = check_db_file(path_, settings_.read_only, &id); !why.empty()) return why;
  const int mode = settings_.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
  int rc = sqlite3_open_v2(path_.c_str(), &db_, mode | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    return why;
  }
  if (std::string why = check_db_file(path_, settings_.read_only, &id); !why.empty()) {
    close();
    return why;
  }
  file_id_ = id;
  // SQLite silently opens a file it may not write read-only.
  if (!settings_.read_only && sqlite3_db_readonly(db_, "main") == 1) {
    close();
    return "database file is read-only";
  }
  sqlite3_extended_result_codes(db_, 1);
  busy_limit_ms_ = kBusyTimeoutMs;
  sqlite3_busy_handler(db_, busy_callback, this);
  rc = setup_schema();
  if (is_corrupt(rc) && !settings_.read_only) {
    note_ = "reset corrupt database " + path_ + " (" + sqlite3_errmsg(db_) + ")";
    fa::warn(note_);
    rc = reset_and_setup();
  }
  if (rc != SQLITE_OK) {
    std::string why = rc == SQLITE_CANTOPEN && !refusal_.empty() ? refusal_ : sqlite3_errmsg(db_);
    if (is_busy(rc) && locked_out()) why += stuck_text();
    rollback_if_open();
    close();
    return why;
  }
  if (settings_.read_only) {
    note_ = "read-only kernel cache (owned by root): lookups only, new kernels stay in memory";
  }
  return "";
}

// SQLite's busy handler: true (1) to try the lock again after a short sleep.
// Waits while the database or its journal keeps changing (the holder is
// working: other writers' commits take a few ms each), up to busy_limit_ms_;
// gives up after kStuckMs without a change, and then for kStuckCooldownMs
// gives up at once.
int SqliteStore::on_busy(int count) {
  const auto now = Clock::now();
  const FileSig db = file_sig(path_), journal = file_sig(path_ + "-journal");
  if (count == 0) {
    if (now < stuck_until_) return 0;
    wait_start_ = last_change_ = now;
  } else if (!(db == db_sig_) || !(journal == journal_sig_)) {
    last_change_ = now;
  }
  db_sig_ = db;
  journal_sig_ = journal;
  const auto waited = now - wait_start_;
  if (waited >= std::chrono::milliseconds(busy_limit_ms_)) return 0;
  if (now - last_change_ >= std::chrono::milliseconds(kStuckMs)) {
    stuck_until_ = now + std::chrono::milliseconds(kStuckCooldownMs);
    return 0;
  }
  // 1, 2, 4 ... 16 ms, then 25 ms: short enough for a queue of writers.
  const auto left = std::chrono::milliseconds(busy_limit_ms_) - waited;
  const auto sleep =
      std::min<Clock::duration>(std::chrono::milliseconds(count < 5 ? 1 << count : 25), left);
  std::this_thread::sleep_for(sleep);
  return 1;
}

// Sets the journal mode and creates the table when the file is new or has a
// different schema version (that table is dropped: the cache is rebuildable).
int SqliteStore::setup_schema() {
  if (settings_.read_only) {
    // Nothing can be changed: the file must already be what we expect.
    exec("PRAGMA cell_size_check=ON");
    int version = 0;
    bool has_tables = false;
    const int rc = schema_state(&version, &has_tables);
    if (rc != SQLITE_OK) return rc;
    if (version == kSchemaVersion && has_tables) return SQLITE_OK;
    if (version == kSchemaVersionNoCompiler && has_tables) {
      compiler_col_ = "''";
      return SQLITE_OK;
    }
    refusal_ = "read-only cache has schema version " + std::to_string(version) + ", not " +
               std::to_string(kSchemaVersion);
    return SQLITE_CANTOPEN;
  }
  {
    Stmt jm(db_, "PRAGMA journal_mode=DELETE");  // see the comment at the top
    int rc = jm.step();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rc;
  }
  exec("PRAGMA cell_size_check=ON");  // detect damaged pages early
  int version = 0;
  bool has_table = false;
  int rc = schema_state(&version, &has_table);
  if (rc != SQLITE_OK) return rc;
  if (version == kSchemaVersion && has_table) return SQLITE_OK;  // common case: no write lock

  // Re-check under the write lock: another process may have just done it.
  if ((rc = exec("BEGIN IMMEDIATE")) != SQLITE_OK) return rc;
  rc = schema_state(&version, &has_table);
  if (rc == SQLITE_OK && !(version == kSchemaVersion && has_table)) {
    if (version == kSchemaVersionNoCompiler && has_table) {
      // The rows stay: they are driver-JIT rows (or older cuLink cubins,
      // which the runtime rebuilds), recorded with compiler ''.
      rc = exec("ALTER TABLE kernels ADD COLUMN compiler TEXT NOT NULL DEFAULT ''");
    } else if (version != kSchemaVersion) {
      rc = exec(kDropTables);
    }
    if (rc == SQLITE_OK) rc = exec(kCreateTables);
    if (rc == SQLITE_OK) {
      char sql[64];
      std::snprintf(sql, sizeof sql, "PRAGMA user_version = %d", kSchemaVersion);
      rc = exec(sql);
    }
  }
  if (rc == SQLITE_OK) rc = exec("COMMIT");
  if (rc != SQLITE_OK) {
    const int saved = rc;
    rollback_if_open();
    return saved;
  }
  return SQLITE_OK;
}

// The schema version and whether all our tables and the index exist.
int SqliteStore::schema_state(int *version, bool *has_tables) {
  Stmt v(db_, "PRAGMA user_version");
  int rc = v.step();
  if (rc != SQLITE_ROW) return rc;
  *version = static_cast<int>(v.col_int(0));
  Stmt t(db_,
         "SELECT count(*) FROM sqlite_master WHERE (type = 'table' AND name IN ('kernels',"
         " 'leases')) OR (type = 'index' AND name = 'kernels_lru')");
  rc = t.step();
  if (rc != SQLITE_ROW) return rc;
  *has_tables = t.col_int(0) == 3;
  return SQLITE_OK;
}

// Empties the database file in place (same inode, so processes holding it
// open stay consistent): SQLITE_DBCONFIG_RESET_DATABASE + VACUUM.
int SqliteStore::reset_in_place() {
  rollback_if_open();
  // The reset writes through the open file, the journal through the path:
  // both must still be what the trust checks saw.
  if (std::string why = check_db_file(path_, settings_.read_only, &file_id_); !why.empty()) {
    refusal_ = "not reset: " + why;
    return SQLITE_CANTOPEN;
  }
  sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 1, nullptr);
  int rc = exec("VACUUM");
  sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 0, nullptr);
  if (rc == SQLITE_OK) ++resets_;
  return rc;
}

// reset_in_place() and setup_schema(), tried up to three times: another
// process may damage the file again while it is being reset.
int SqliteStore::reset_and_setup() {
  int rc = SQLITE_CORRUPT;
  for (int attempt = 0; attempt < 3 && is_corrupt(rc); ++attempt) {
    rc = reset_in_place();
    if (rc == SQLITE_OK) rc = setup_schema();
  }
  return rc;
}

// True when the database can be used now. A forked child abandons the
// inherited connection and opens its own; a failure there falls back to memory.
bool SqliteStore::usable() {
  if (mem_) return false;
  if (pid_ != getpid()) {
    db_ = nullptr;  // the parent's handle: leaked on purpose, never closed here
    pid_ = getpid();
    touches_.clear();  // the parent's to write
    forget_leases();   // the parent's leases
    std::string why = connect();
    if (!why.empty()) {
      degrade(why);
      return false;
    }
  }
  return db_ != nullptr;
}

// Reacts to a failed statement: a corrupt file is reset in place, and one
// emptied under us gets its tables again (unless another process already
// did); all three return true: the database is usable again. A busy one only
// skips this operation; anything else (read-only, full, I/O error) falls back
// to memory.
bool SqliteStore::on_error(int rc, const std::string &what) {
  const std::string msg = sqlite3_errmsg(db_);
  rollback_if_open();
  if (settings_.read_only && !is_busy(rc)) {
    degrade(what + ": " + msg + " (read-only cache: not repaired)");
    return false;
  }
  if ((rc & 0xff) == SQLITE_ERROR || (rc & 0xff) == SQLITE_SCHEMA) {
    // "no such table": the file was emptied under us (truncated to zero
    // length, or tables dropped by another program), or was and has been
    // repaired by another process since.
    int version = 0;
    bool has_tables = false;
    const int state = schema_state(&version, &has_tables);
    if (state == SQLITE_OK && version == kSchemaVersion && has_tables) return true;
    if (state == SQLITE_OK) {
      note_ = "recreated the tables of emptied database " + path_ + " (" + what + ": " + msg + ")";
      fa::warn(note_);
      if (setup_schema() == SQLITE_OK) {
        ++resets_;
        return true;
      }
      rc = sqlite3_extended_errcode(db_);
    } else {
      rc = state;  // e.g. corrupt by now: handled below
    }
  }
  if (is_corrupt(rc)) {
    note_ = "reset corrupt database " + path_ + " (" + what + ": " + msg + ")";
    fa::warn(note_);
    refusal_.clear();
    const int reset = reset_and_setup();
    if (reset == SQLITE_OK) return true;
    degrade("corrupt and could not be reset: " + (reset == SQLITE_CANTOPEN && !refusal_.empty()
                                                      ? refusal_
                                                      : std::string(sqlite3_errmsg(db_))));
    return false;
  }
  if (is_busy(rc)) {
    note_ = "kernel cache busy, " + what + " skipped: " + msg +
            (locked_out() ? stuck_text() : std::string()) + ": " + path_;
    fa::warn(note_);
    return false;
  }
  degrade(what + ": " + msg);
  return false;
}

// Gives up the file for the rest of this store's life: rows go to memory.
void SqliteStore::degrade(const std::string &why) {
  note_ = "kernel cache in memory only: " + path_ + ": " + why;
  fa::warn(note_);
  // Best effort: the file may refuse this write too. A lease row left behind
  // is reclaimed, since no live store of this process holds its token.
  for (const auto &kv : held_) {
    if (!db_) break;
    uint8_t kb[16];
    key_to_bytes(Key{kv.first.first, kv.first.second}, kb);
    Stmt d(db_, "DELETE FROM leases WHERE key = ?1 AND token = ?2");
    d.blob(1, kb, 16);
    d.int64(2, kv.second);
    d.step();
  }
  forget_leases();
  close();
  mem_ = std::make_unique<MemoryStore>(note_);
}

bool SqliteStore::get(const Key &key, const std::string &key_material, Record *out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable()) return mem_->get(key, key_material, out);
  return get_locked(key, key_material, out);
}

// get() with mu_ held and the database usable.
bool SqliteStore::get_locked(const Key &key, const std::string &key_material, Record *out) {
  uint8_t kb[16];
  key_to_bytes(key, kb);
  const std::string sql =
      std::string("SELECT spec, sm, generator_version, ptx, ptx_hash, cubin, cubin_hash,"
                  " driver_version, key_material, ") +
      compiler_col_ + " FROM kernels WHERE key = ?1";
  Stmt q(db_, sql.c_str());
  q.blob(1, kb, 16);
  int rc = q.step();
  if (rc != SQLITE_ROW) {
    if (rc != SQLITE_DONE) {
      q.reset();
      on_error(rc, "read");
    }
    ++misses_;
    return false;
  }
  if (!key_material.empty() &&
      (q.col_size(8) != key_material.size() ||
       std::memcmp(q.col_blob(8), key_material.data(), key_material.size()) != 0)) {
    // Same 128-bit key, different kernel: a hash collision (or a forged row).
    // A miss; the caller's put() replaces the row with its own.
    q.reset();
    ++collisions_;
    ++misses_;
    note_ = "cache row " + key.hex() + " holds another kernel's key material (collision)";
    fa::warn(note_);
    return false;
  }
  Record rec;
  rec.spec_text = q.col_text(0);
  rec.sm = static_cast<int>(q.col_int(1));
  rec.generator_version = static_cast<uint32_t>(q.col_int(2));
  rec.ptx.assign(reinterpret_cast<const char *>(q.col_blob(3)), q.col_size(3));
  rec.cubin.assign(q.col_blob(5), q.col_blob(5) + q.col_size(5));
  rec.driver_version = static_cast<int>(q.col_int(7));
  rec.key_material = q.col_text(8);
  rec.compiler = q.col_text(9);
  const Hash ph = hash_bytes(rec.ptx.data(), rec.ptx.size());
  const Hash ch = hash_bytes(rec.cubin.data(), rec.cubin.size());
  const bool ok = q.col_size(4) == 16 && !std::memcmp(q.col_blob(4), ph.b, 16) &&
                  q.col_size(6) == 16 && !std::memcmp(q.col_blob(6), ch.b, 16);
  std::vector<uint8_t> stored_ph(q.col_blob(4), q.col_blob(4) + q.col_size(4));
  std::vector<uint8_t> stored_ch(q.col_blob(6), q.col_blob(6) + q.col_size(6));
  q.reset();  // release the read lock before writing

  if (!ok && settings_.read_only) {
    ++discarded_;
    ++misses_;
    note_ = "read-only cache row " + key.hex() + " failed its blob hash check: not used";
    fa::warn(note_);
    return false;
  }
  if (!ok) {
    // Delete only the row we read: another process may have replaced it.
    Stmt d(db_,
           "DELETE FROM kernels WHERE key = ?1 AND ptx = ?2 AND cubin = ?3 AND ptx_hash = ?4"
           " AND cubin_hash = ?5");
    d.blob(1, kb, 16);
    d.blob(2, rec.ptx.data(), rec.ptx.size());
    d.blob(3, rec.cubin.data(), rec.cubin.size());
    d.blob(4, stored_ph.data(), stored_ph.size());
    d.blob(5, stored_ch.data(), stored_ch.size());
    rc = d.step();
    d.reset();
    if (rc != SQLITE_DONE) on_error(rc, "discard");
    ++discarded_;
    ++misses_;
    note_ = "discarded cache row " + key.hex() + ": blob hash mismatch";
    fa::warn(note_);
    return false;
  }

  if (settings_.read_only) {  // hits are not recorded: nothing is written
    ++hits_;
    if (out) *out = std::move(rec);
    return true;
  }
  Touch &t = touches_[{key.hi, key.lo}];
  t.hits++;
  t.last_used = unix_now_ms();
  if (t.last_used - last_flush_ >= kTouchFlushMs || touches_.size() >= kMaxPendingTouches) {
    flush_touches(kTouchTimeoutMs);
  }
  ++hits_;
  if (out) *out = std::move(rec);
  return true;
}

// Adds the pending hits to their rows; inside a write transaction. The hits
// also move last_used_ms, which is what eviction orders by.
int SqliteStore::apply_touches() {
  if (touches_.empty()) return SQLITE_OK;
  Stmt u(db_,
         "UPDATE kernels SET hits = hits + ?2, last_used_ms = max(last_used_ms, ?3)"
         " WHERE key = ?1");
  for (const auto &kv : touches_) {
    uint8_t kb[16];
    key_to_bytes(Key{kv.first.first, kv.first.second}, kb);
    u.blob(1, kb, 16);
    u.int64(2, static_cast<int64_t>(kv.second.hits));
    u.int64(3, kv.second.last_used);
    const int rc = u.step();
    u.reset();
    if (rc != SQLITE_DONE) return rc;
  }
  return SQLITE_OK;
}

// Writes the pending hits in one transaction, waiting at most timeout_ms for
// the lock. On a busy database they stay pending (up to a bound); a corrupt
// one is handled like any other failed statement.
void SqliteStore::flush_touches(int timeout_ms) {
  last_flush_ = unix_now_ms();
  if (touches_.empty() || !db_) return;
  busy_limit_ms_ = timeout_ms;
  int rc = exec("BEGIN IMMEDIATE");
  if (rc == SQLITE_OK) rc = apply_touches();
  if (rc == SQLITE_OK) rc = exec("COMMIT");
  busy_limit_ms_ = kBusyTimeoutMs;
  if (rc == SQLITE_OK) {
    touches_.clear();
    return;
  }
  if (!is_busy(rc)) {
    touches_.clear();
    on_error(rc, "record hits");  // rolls back
    return;
  }
  rollback_if_open();
  if (touches_.size() >= kMaxPendingTouches) touches_.clear();
}

// Inside put()'s transaction: while the database's used pages exceed the cap,
// deletes the least recently used row other than keep_rowid (the row just
// written); when only that row is left and it alone is too big, it goes too.
// Freed pages stay in the file's free list and are reused by later rows, so
// the file stays within the cap plus about one row.
int SqliteStore::evict(int64_t keep_rowid, uint64_t *evicted) {
  if (settings_.max_bytes <= 0) return SQLITE_OK;
  auto used_bytes = [this](int64_t *used) {
    Stmt pc(db_, "PRAGMA page_count");
    Stmt fl(db_, "PRAGMA freelist_count");
    Stmt ps(db_, "PRAGMA page_size");
    int rc = pc.step();
    if (rc == SQLITE_ROW) rc = fl.step();
    if (rc == SQLITE_ROW) rc = ps.step();
    if (rc != SQLITE_ROW) return rc;
    *used = (pc.col_int(0) - fl.col_int(0)) * ps.col_int(0);
    return SQLITE_OK;
  };
  Stmt oldest(db_,
              "SELECT rowid FROM kernels WHERE rowid != ?1 ORDER BY last_used_ms, created_ms"
              " LIMIT 1");
  Stmt del(db_, "DELETE FROM kernels WHERE rowid = ?1");
  for (;;) {
    int64_t used = 0;
    int rc = used_bytes(&used);
    if (rc != SQLITE_OK) return rc;
    if (used <= settings_.max_bytes) return SQLITE_OK;
    oldest.int64(1, keep_rowid);
    rc = oldest.step();
    int64_t victim = keep_rowid;
    if (rc == SQLITE_ROW) {
      victim = oldest.col_int(0);
    } else if (rc != SQLITE_DONE) {
      return rc;
    }
    oldest.reset();
    del.int64(1, victim);
    rc = del.step();
    del.reset();
    if (rc != SQLITE_DONE) return rc;
    ++*evicted;
    if (victim == keep_rowid) {
      note_ = "kernel larger than FLASHATTN_CACHE_MAX_BYTES not stored";
      return SQLITE_OK;
    }
  }
}

// BEGIN IMMEDIATE; pending hits; INSERT OR REPLACE; drop this store's lease
// on the key and expired leases; evict down to the cap; COMMIT. The caller
// rolls back on error.
int SqliteStore::write_row(const Key &key, const Record &r, const Hash &ph, const Hash &ch,
                           uint64_t *evicted) {
  uint8_t kb[16];
  key_to_bytes(key, kb);
  int rc = exec("BEGIN IMMEDIATE");
  if (rc != SQLITE_OK) return rc;
  if ((rc = apply_touches()) != SQLITE_OK) return rc;
  const int64_t now = unix_now_ms();
  {
    Stmt s(db_,
           "INSERT OR REPLACE INTO kernels (key, key_material, spec, sm, generator_version,"
           " driver_version, created_ms, last_used_ms, hits, ptx_hash, cubin_hash, ptx, cubin,"
           " compiler) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, 0, ?8, ?9, ?10, ?11, ?12)");
    s.blob(1, kb, 16);
    s.blob(2, r.key_material.data(), r.key_material.size());
    s.text(3, r.spec_text);
    s.int64(4, r.sm);
    s.int64(5, r.generator_version);
    s.int64(6, r.driver_version);
    s.int64(7, now);
    s.blob(8, ph.b, 16);
    s.blob(9, ch.b, 16);
    s.blob(10, r.ptx.data(), r.ptx.size());
    s.blob(11, r.cubin.data(), r.cubin.size());
    s.text(12, r.compiler);
    rc = s.step();
    if (rc != SQLITE_DONE) return rc;
  }
  const int64_t rowid = sqlite3_last_insert_rowid(db_);
  {
    Stmt d(db_, "DELETE FROM leases WHERE (key = ?1 AND token = ?2) OR expires_ms < ?3");
    auto it = held_.find({key.hi, key.lo});
    d.blob(1, kb, 16);
    d.int64(2, it == held_.end() ? -1 : it->second);
    d.int64(3, now);
    rc = d.step();
    if (rc != SQLITE_DONE) return rc;
  }
  if ((rc = evict(rowid, evicted)) != SQLITE_OK) return rc;
  return exec("COMMIT");
}

void SqliteStore::put(const Key &key, const Record &record) {
  const Hash ph = hash_bytes(record.ptx.data(), record.ptx.size());
  const Hash ch = hash_bytes(record.cubin.data(), record.cubin.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (settings_.read_only && !mem_) return;  // the runtime keeps its kernels in memory
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!usable()) break;
    uint64_t evicted = 0;
    const int rc = write_row(key, record, ph, ch, &evicted);
    if (rc == SQLITE_OK) {
      touches_.clear();
      forget_lease({key.hi, key.lo});  // released in the same transaction
      evicted_ += evicted;
      ++puts_;
      return;
    }
    // Retry once after a successful reset; a busy database skips the write.
    if (!on_error(rc, "write")) break;
  }
  if (mem_) mem_->put(key, record);
}

// *exists = the kernels table has key with this key material (any, if empty).
int SqliteStore::row_exists(const uint8_t key[16], const std::string &key_material, bool *exists) {
  Stmt q(db_,
         "SELECT count(*) FROM kernels WHERE key = ?1 AND (length(?2) = 0 OR key_material = ?2)");
  q.blob(1, key, 16);
  q.blob(2, key_material.data(), key_material.size());
  const int rc = q.step();
  if (rc != SQLITE_ROW) return rc;
  *exists = q.col_int(0) > 0;
  return SQLITE_OK;
}

// *present = a lease row exists for key; *taken = its holder may still be
// building (not expired, not a dead process on this host, not this store).
int SqliteStore::lease_taken(const uint8_t key[16], bool *taken, bool *present) {
  Stmt q(db_, "SELECT pid, host, token, expires_ms FROM leases WHERE key = ?1");
  q.blob(1, key, 16);
  const int rc = q.step();
  *taken = *present = false;
  if (rc == SQLITE_DONE) return SQLITE_OK;
  if (rc != SQLITE_ROW) return rc;
  *present = true;
  bool mine = false;
  for (const auto &kv : held_) mine = mine || kv.second == q.col_int(2);
  *taken = !mine && q.col_int(3) > unix_now_ms() &&
           holder_alive(q.col_int(0), q.col_text(1), q.col_int(2));
  return SQLITE_OK;
}

// One attempt at the lease, with mu_ held and the database usable: the row
// is there (kFound), the lease is ours now (kAcquired), or another live
// holder has it or the database is busy (kWait).
SqliteStore::Try SqliteStore::try_lease(const Key &key, const std::string &key_material,
                                        Record *out) {
  uint8_t kb[16];
  key_to_bytes(key, kb);
  bool exists = false, taken = false, present = false;
  // Cheap checks first, without the write lock: waiters poll here.
  int rc = row_exists(kb, key_material, &exists);
  if (rc == SQLITE_OK && exists) {
    if (get_locked(key, key_material, out)) return Try::kFound;
    if (!usable()) return Try::kWait;  // the caller sees the store gone
  }
  if (rc == SQLITE_OK) rc = lease_taken(kb, &taken, &present);
  if (rc == SQLITE_OK && taken) return Try::kWait;
  // Take it under the write lock, after checking both again.
  if (rc == SQLITE_OK) rc = exec("BEGIN IMMEDIATE");
  if (rc == SQLITE_OK) rc = row_exists(kb, key_material, &exists);
  if (rc == SQLITE_OK && exists) {
    rollback_if_open();
    return get_locked(key, key_material, out) ? Try::kFound : Try::kWait;
  }
  if (rc == SQLITE_OK) rc = lease_taken(kb, &taken, &present);
  if (rc == SQLITE_OK && taken) {
    rollback_if_open();
    return Try::kWait;
  }
  const int64_t token = static_cast<int64_t>(rng_() >> 1);
  if (rc == SQLITE_OK) {
    Stmt ins(db_,
             "INSERT OR REPLACE INTO leases (key, pid, host, token, expires_ms)"
             " VALUES (?1, ?2, ?3, ?4, ?5)");
    ins.blob(1, kb, 16);
    ins.int64(2, getpid());
    ins.text(3, host_identity());
    ins.int64(4, token);
    ins.int64(5, unix_now_ms() + settings_.lease_ttl_ms);
    rc = ins.step();
    if (rc == SQLITE_DONE) rc = exec("COMMIT");
  }
  if (rc != SQLITE_OK) {
    rollback_if_open();
    if (is_busy(rc)) return Try::kBusy;
    on_error(rc, "compile lease");
    return Try::kWait;
  }
  held_[{key.hi, key.lo}] = token;
  LiveTokens::get().add(token);
  ++leases_;
  if (present) ++leases_reclaimed_;
  return Try::kAcquired;
}

LeaseResult SqliteStore::acquire_lease(const Key &key, const std::string &key_material,
                                       Record *out) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(settings_.lease_wait_ms);
  int sleep_ms = 1;
  for (;;) {
    int jitter = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!usable() || settings_.read_only) return LeaseResult::kSkipped;
      switch (try_lease(key, key_material, out)) {
        case Try::kAcquired:
          return LeaseResult::kAcquired;
        case Try::kFound:
          ++lease_found_;
          return LeaseResult::kFound;
        case Try::kWait:
          break;
        case Try::kBusy:
          // A lock held without progress: build now rather than poll it.
          if (!locked_out()) break;
          note_ = "kernel cache busy, compile lease skipped" + stuck_text() + ": " + path_;
          fa::warn(note_);
          return LeaseResult::kSkipped;
      }
      if (!usable()) return LeaseResult::kSkipped;
      if (Clock::now() >= deadline) {
        ++lease_timeouts_;
        note_ = "compile lease on " + key.hex() + " still held after " +
                std::to_string(settings_.lease_wait_ms) + " ms; building locally";
        fa::warn(note_);
        return LeaseResult::kTimedOut;
      }
      jitter = static_cast<int>(rng_() % static_cast<uint64_t>(sleep_ms + 1));
    }
    // Exponential backoff with jitter, so waiters do not poll in lock step.
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms + jitter));
    sleep_ms = std::min(sleep_ms * 2, kLeaseMaxSleepMs);
  }
}

// Deletes this store's lease row (only while it still carries our token).
void SqliteStore::drop_lease(const KeyPair &key, int64_t token) {
  if (!db_) return;
  uint8_t kb[16];
  key_to_bytes(Key{key.first, key.second}, kb);
  Stmt d(db_, "DELETE FROM leases WHERE key = ?1 AND token = ?2");
  d.blob(1, kb, 16);
  d.int64(2, token);
  const int rc = d.step();
  d.reset();
  if (rc != SQLITE_DONE) on_error(rc, "release compile lease");  // else it expires
}

void SqliteStore::release_lease(const Key &key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find({key.hi, key.lo});
  if (it == held_.end()) return;
  const auto held = *it;
  forget_lease(held.first);
  if (usable()) drop_lease(held.first, held.second);
}

Stats SqliteStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  if (usable()) flush_touches(kTouchTimeoutMs);
  if (usable()) {
    Stmt q(db_, "SELECT count(*), coalesce(sum(length(ptx) + length(cubin)), 0) FROM kernels");
    const int rc = q.step();
    if (rc == SQLITE_ROW) {
      s.entries = static_cast<uint64_t>(q.col_int(0));
      s.bytes = static_cast<uint64_t>(q.col_int(1));
    } else {
      q.reset();
      on_error(rc, "stats");
    }
  }
  s.hits = hits_;
  s.misses = misses_;
  s.puts = puts_;
  s.discarded = discarded_;
  s.collisions = collisions_;
  s.evicted = evicted_;
  s.resets = resets_;
  s.leases = leases_;
  s.leases_reclaimed = leases_reclaimed_;
  s.lease_found = lease_found_;
  s.lease_timeouts = lease_timeouts_;
  s.max_bytes = static_cast<uint64_t>(settings_.max_bytes);
  if (mem_) {
    const Stats m = mem_->stats();
    s.hits += m.hits;
    s.misses += m.misses;
    s.puts += m.puts;
    s.collisions += m.collisions;
    s.entries = m.entries;
    s.bytes = m.bytes;
  } else {
    s.persistent = true;
    s.read_only = settings_.read_only;
    s.path = path_;
  }
  s.note = note_;
  return s;
}

std::vector<RowInfo> SqliteStore::list() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable()) return mem_->list();
  flush_touches(kTouchTimeoutMs);
  if (!usable()) return mem_->list();
  std::vector<RowInfo> rows;
  const std::string sql =
      std::string("SELECT key, spec, sm, generator_version, driver_version, length(ptx),"
                  " length(cubin), hits, created_ms / 1000, last_used_ms / 1000, ") +
      compiler_col_ + " FROM kernels ORDER BY created_ms, key";
  Stmt q(db_, sql.c_str());
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    RowInfo r;
    r.key_hex = bytes_to_hex(q.col_blob(0), q.col_size(0));
    r.spec_text = q.col_text(1);
    r.sm = static_cast<int>(q.col_int(2));
    r.generator_version = static_cast<uint32_t>(q.col_int(3));
    r.driver_version = static_cast<int>(q.col_int(4));
    r.ptx_bytes = static_cast<uint64_t>(q.col_int(5));
    r.cubin_bytes = static_cast<uint64_t>(q.col_int(6));
    r.hits = static_cast<uint64_t>(q.col_int(7));
    r.created = q.col_int(8);
    r.last_used = q.col_int(9);
    r.compiler = q.col_text(10);
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) {
    q.reset();
    on_error(rc, "list");
  }
  return rows;
}

fa_status SqliteStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable()) return mem_->clear();
  if (settings_.read_only) {
    return fa::fail(FA_ERROR_CACHE, "cannot clear the read-only kernel cache %s (owned by root)",
                    path_.c_str());
  }
  touches_.clear();
  int rc = exec("BEGIN IMMEDIATE");
  if (rc == SQLITE_OK) rc = exec("DELETE FROM kernels");
  if (rc == SQLITE_OK) rc = exec("COMMIT");
  if (rc != SQLITE_OK) {
    // A corrupt file reset in place is as empty as a cleared one.
    if (is_corrupt(rc) && on_error(rc, "clear")) return FA_SUCCESS;
    if (mem_) return fa::fail(FA_ERROR_CACHE, "cannot clear kernel cache: %s", note_.c_str());
    const std::string msg = sqlite3_errmsg(db_);
    rollback_if_open();
    return fa::fail(FA_ERROR_CACHE, "cannot clear kernel cache %s: %s", path_.c_str(), msg.c_str());
  }
  // Give the space back to the file system; skipped if others hold the file.
  busy_limit_ms_ = kMaintTimeoutMs;
  exec("VACUUM");
  busy_limit_ms_ = kBusyTimeoutMs;
  return FA_SUCCESS;
}

}  // namespace

std::unique_ptr<Store> open_sqlite_store(const std::string &path, const SqliteSettings &settings,
                                         std::string *why) {
  auto store = std::make_unique<SqliteStore>(path, settings);
  std::string err = store->open();
  if (!err.empty()) {
    if (why) *why = err;
    return nullptr;
  }
  return store;
}

}  // namespace fa::cache
