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
#include <sqlite3.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <map>

#include "cache/store_internal.h"
#include "common/error.h"

namespace fa::cache {
namespace {

constexpr int kSchemaVersion = 1;        // PRAGMA user_version; bump on any schema change
constexpr int kBusyTimeoutMs = 10000;    // writers and readers wait this long for locks
constexpr int kTouchTimeoutMs = 50;      // a hits/last_used flush gives up if busy longer
constexpr int64_t kTouchFlushSecs = 30;  // get() flushes pending hits at most this often
constexpr size_t kMaxPendingTouches = 4096;
constexpr int kMaintTimeoutMs = 200;  // VACUUM after clear() is best effort

constexpr const char *kCreateTable =
    "CREATE TABLE IF NOT EXISTS kernels ("
    " key BLOB PRIMARY KEY NOT NULL CHECK (length(key) = 16),"
    " spec TEXT NOT NULL,"
    " sm INTEGER NOT NULL,"
    " generator_version INTEGER NOT NULL,"
    " ptx BLOB NOT NULL,"
    " ptx_hash BLOB NOT NULL,"
    " cubin BLOB NOT NULL,"
    " cubin_hash BLOB NOT NULL,"
    " driver_version INTEGER NOT NULL,"
    " created INTEGER NOT NULL,"
    " last_used INTEGER NOT NULL,"
    " hits INTEGER NOT NULL DEFAULT 0)";

bool is_corrupt(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

bool is_busy(int rc) {
  rc &= 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

// XXH3-128 of n bytes in canonical (big-endian) form.
struct Hash {
  uint8_t b[16];
};
Hash hash_bytes(const void *p, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(n ? p : "", n));
  Hash h;
  std::memcpy(h.b, c.digest, 16);
  return h;
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

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(std::string path) : path_(std::move(path)), pid_(getpid()) {}
  ~SqliteStore() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (db_ && pid_ == getpid()) flush_touches(kTouchTimeoutMs);
    close();
  }

  // Opens the connection and prepares the schema; "" or why it failed.
  std::string open() {
    std::lock_guard<std::mutex> lock(mu_);
    return connect();
  }

  bool get(const Key &key, Record *out) override;
  void put(const Key &key, const Record &record) override;
  Stats stats() override;
  std::vector<RowInfo> list() override;
  fa_status clear() override;

 private:
  // Everything below runs with mu_ held.
  std::string connect();
  int setup_schema();
  int reset_in_place();
  int exec(const char *sql) { return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr); }
  void rollback_if_open() {
    if (db_ && !sqlite3_get_autocommit(db_)) exec("ROLLBACK");
  }
  bool usable();
  bool on_error(int rc, const std::string &what);
  void degrade(const std::string &why);
  void close();
  int write_row(const uint8_t key[16], const Record &r, const Hash &ph, const Hash &ch);
  int apply_touches();
  void flush_touches(int timeout_ms);

  std::mutex mu_;
  std::string path_;
  pid_t pid_;  // process that opened db_; a forked child reconnects
  sqlite3 *db_ = nullptr;
  std::unique_ptr<MemoryStore> mem_;  // set once the file is given up
  std::string note_;
  uint64_t hits_ = 0, misses_ = 0, puts_ = 0, discarded_ = 0;
  // Hits not yet written to the file: a row update per get() would cost a
  // write transaction (several fsyncs) on the lookup path. They are written
  // with the next put(), by stats()/list(), every kTouchFlushSecs, and when
  // the store is destroyed; best effort, lost on a crash.
  struct Touch {
    uint64_t hits = 0;
    int64_t last_used = 0;
  };
  std::map<std::pair<uint64_t, uint64_t>, Touch> touches_;
  int64_t last_flush_ = unix_now();
};

// Closes the connection unless it was inherited through fork(): closing the
// parent's handle in a child could disturb the parent's locks and journal.
void SqliteStore::close() {
  if (db_ && pid_ == getpid()) sqlite3_close_v2(db_);
  db_ = nullptr;
}

// Opens path_ read-write (creating it) and prepares the schema; a file that is
// not a database or is corrupt is reset in place once.
std::string SqliteStore::connect() {
  int rc =
      sqlite3_open_v2(path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    return why;
  }
  // SQLite silently opens a file it may not write read-only.
  if (sqlite3_db_readonly(db_, "main") == 1) {
    close();
    return "database file is read-only";
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  rc = setup_schema();
  if (is_corrupt(rc)) {
    note_ = "reset corrupt database " + path_ + " (" + sqlite3_errmsg(db_) + ")";
    fa::warn(note_);
    rc = reset_in_place();
    if (rc == SQLITE_OK) rc = setup_schema();
  }
  if (rc != SQLITE_OK) {
    std::string why = sqlite3_errmsg(db_);
    rollback_if_open();
    close();
    return why;
  }
  return "";
}

// Sets the journal mode and creates the table when the file is new or has a
// different schema version (that table is dropped: the cache is rebuildable).
int SqliteStore::setup_schema() {
  {
    Stmt jm(db_, "PRAGMA journal_mode=DELETE");  // see the comment at the top
    int rc = jm.step();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return rc;
  }
  exec("PRAGMA cell_size_check=ON");  // detect damaged pages early
  auto state = [this](int *version, bool *has_table) {
    Stmt v(db_, "PRAGMA user_version");
    int rc = v.step();
    if (rc != SQLITE_ROW) return rc;
    *version = static_cast<int>(v.col_int(0));
    Stmt t(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'kernels'");
    rc = t.step();
    if (rc != SQLITE_ROW) return rc;
    *has_table = t.col_int(0) > 0;
    return SQLITE_OK;
  };
  int version = 0;
  bool has_table = false;
  int rc = state(&version, &has_table);
  if (rc != SQLITE_OK) return rc;
  if (version == kSchemaVersion && has_table) return SQLITE_OK;  // common case: no write lock

  // Re-check under the write lock: another process may have just done it.
  if ((rc = exec("BEGIN IMMEDIATE")) != SQLITE_OK) return rc;
  rc = state(&version, &has_table);
  if (rc == SQLITE_OK && !(version == kSchemaVersion && has_table)) {
    if (version != kSchemaVersion) rc = exec("DROP TABLE IF EXISTS kernels");
    if (rc == SQLITE_OK) rc = exec(kCreateTable);
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

// Empties the database file in place (same inode, so processes holding it
// open stay consistent): SQLITE_DBCONFIG_RESET_DATABASE + VACUUM.
int SqliteStore::reset_in_place() {
  rollback_if_open();
  sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 1, nullptr);
  int rc = exec("VACUUM");
  sqlite3_db_config(db_, SQLITE_DBCONFIG_RESET_DATABASE, 0, nullptr);
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
    std::string why = connect();
    if (!why.empty()) {
      degrade(why);
      return false;
    }
  }
  return db_ != nullptr;
}

// Reacts to a failed statement: a corrupt file is reset in place (returns true
// when the database is usable again); a busy one only skips this operation;
// anything else (read-only, full, I/O error) falls back to memory.
bool SqliteStore::on_error(int rc, const std::string &what) {
  const std::string msg = sqlite3_errmsg(db_);
  rollback_if_open();
  if (is_corrupt(rc)) {
    note_ = "reset corrupt database " + path_ + " (" + what + ": " + msg + ")";
    fa::warn(note_);
    int r = reset_in_place();
    if (r == SQLITE_OK) r = setup_schema();
    if (r == SQLITE_OK) return true;
    degrade("corrupt and could not be reset: " + std::string(sqlite3_errmsg(db_)));
    return false;
  }
  if (is_busy(rc)) {
    note_ = "kernel cache " + path_ + " busy, " + what + " skipped: " + msg;
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
  close();
  mem_ = std::make_unique<MemoryStore>(note_);
}

bool SqliteStore::get(const Key &key, Record *out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!usable()) return mem_->get(key, out);
  uint8_t kb[16];
  key_to_bytes(key, kb);
  Stmt q(db_,
         "SELECT spec, sm, generator_version, ptx, ptx_hash, cubin, cubin_hash, driver_version"
         " FROM kernels WHERE key = ?1");
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
  Record rec;
  rec.spec_text = q.col_text(0);
  rec.sm = static_cast<int>(q.col_int(1));
  rec.generator_version = static_cast<uint32_t>(q.col_int(2));
  rec.ptx.assign(reinterpret_cast<const char *>(q.col_blob(3)), q.col_size(3));
  rec.cubin.assign(q.col_blob(5), q.col_blob(5) + q.col_size(5));
  rec.driver_version = static_cast<int>(q.col_int(7));
  const Hash ph = hash_bytes(rec.ptx.data(), rec.ptx.size());
  const Hash ch = hash_bytes(rec.cubin.data(), rec.cubin.size());
  const bool ok = q.col_size(4) == 16 && !std::memcmp(q.col_blob(4), ph.b, 16) &&
                  q.col_size(6) == 16 && !std::memcmp(q.col_blob(6), ch.b, 16);
  std::vector<uint8_t> stored_ph(q.col_blob(4), q.col_blob(4) + q.col_size(4));
  std::vector<uint8_t> stored_ch(q.col_blob(6), q.col_blob(6) + q.col_size(6));
  q.reset();  // release the read lock before writing

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

  Touch &t = touches_[{key.hi, key.lo}];
  t.hits++;
  t.last_used = unix_now();
  if (t.last_used - last_flush_ >= kTouchFlushSecs || touches_.size() >= kMaxPendingTouches) {
    flush_touches(kTouchTimeoutMs);
  }
  ++hits_;
  if (out) *out = std::move(rec);
  return true;
}

// Adds the pending hits to their rows; inside a write transaction.
int SqliteStore::apply_touches() {
  if (touches_.empty()) return SQLITE_OK;
  Stmt u(db_, "UPDATE kernels SET hits = hits + ?2, last_used = max(last_used, ?3) WHERE key = ?1");
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
  last_flush_ = unix_now();
  if (touches_.empty() || !db_) return;
  sqlite3_busy_timeout(db_, timeout_ms);
  int rc = exec("BEGIN IMMEDIATE");
  if (rc == SQLITE_OK) rc = apply_touches();
  if (rc == SQLITE_OK) rc = exec("COMMIT");
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
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

// BEGIN IMMEDIATE; pending hits; INSERT OR REPLACE; COMMIT. The caller rolls
// back on error.
int SqliteStore::write_row(const uint8_t key[16], const Record &r, const Hash &ph, const Hash &ch) {
  int rc = exec("BEGIN IMMEDIATE");
  if (rc != SQLITE_OK) return rc;
  if ((rc = apply_touches()) != SQLITE_OK) return rc;
  {
    Stmt s(db_,
           "INSERT OR REPLACE INTO kernels (key, spec, sm, generator_version, ptx, ptx_hash,"
           " cubin, cubin_hash, driver_version, created, last_used, hits)"
           " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, 0)");
    s.blob(1, key, 16);
    s.text(2, r.spec_text);
    s.int64(3, r.sm);
    s.int64(4, r.generator_version);
    s.blob(5, r.ptx.data(), r.ptx.size());
    s.blob(6, ph.b, 16);
    s.blob(7, r.cubin.data(), r.cubin.size());
    s.blob(8, ch.b, 16);
    s.int64(9, r.driver_version);
    s.int64(10, unix_now());
    rc = s.step();
    if (rc != SQLITE_DONE) return rc;
  }
  return exec("COMMIT");
}

void SqliteStore::put(const Key &key, const Record &record) {
  const Hash ph = hash_bytes(record.ptx.data(), record.ptx.size());
  const Hash ch = hash_bytes(record.cubin.data(), record.cubin.size());
  uint8_t kb[16];
  key_to_bytes(key, kb);
  std::lock_guard<std::mutex> lock(mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!usable()) break;
    const int rc = write_row(kb, record, ph, ch);
    if (rc == SQLITE_OK) {
      touches_.clear();
      ++puts_;
      return;
    }
    // Retry once after a successful reset; a busy database skips the write.
    if (!on_error(rc, "write")) break;
  }
  if (mem_) mem_->put(key, record);
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
  if (mem_) {
    const Stats m = mem_->stats();
    s.hits += m.hits;
    s.misses += m.misses;
    s.puts += m.puts;
    s.entries = m.entries;
    s.bytes = m.bytes;
  } else {
    s.persistent = true;
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
  Stmt q(db_,
         "SELECT key, spec, sm, generator_version, driver_version, length(ptx), length(cubin),"
         " hits, created, last_used FROM kernels ORDER BY created, key");
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
  sqlite3_busy_timeout(db_, kMaintTimeoutMs);
  exec("VACUUM");
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  return FA_SUCCESS;
}

}  // namespace

std::unique_ptr<Store> open_sqlite_store(const std::string &path, std::string *why) {
  auto store = std::make_unique<SqliteStore>(path);
  std::string err = store->open();
  if (!err.empty()) {
    if (why) *why = err;
    return nullptr;
  }
  return store;
}

}  // namespace fa::cache
