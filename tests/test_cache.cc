// Tests of the kernel store (cache/store.h): the SQLite store on real files,
// several processes and threads sharing one file, damaged and unusable files,
// and the in-memory fallback. Each test works in its own temporary directory.
//
// The binary re-runs itself (posix_spawn of /proc/self/exe) with "child-get"
// or "child-put" as its first argument to act as a second process.
#include <fcntl.h>
#include <grp.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}
// clang-format on

#include "cache/store.h"
#include "support/cache_fixture.h"

extern char **environ;

using fa::cache::Key;
using fa::cache::Options;
using fa::cache::Record;
using fa::cache::RowInfo;
using fa::cache::Stats;
using fa::cache::Store;
using fa::test::db_file;
using fa::test::inode_of;
using fa::test::key_for;
using fa::test::record_for;
using fa::test::rm_rf;
using fa::test::same_record;
using fa::test::seed_of;
using fa::test::wait_exit;

namespace {

std::string g_self;  // path of this test binary

// ---- helpers ----------------------------------------------------------------

void assert_same_record(const Record &got, const Record &want) {
  assert_int_equal(got.ptx.size(), want.ptx.size());
  assert_memory_equal(got.ptx.data(), want.ptx.data(), want.ptx.size());
  assert_int_equal(got.cubin.size(), want.cubin.size());
  if (!want.cubin.empty()) {
    assert_memory_equal(got.cubin.data(), want.cubin.data(), want.cubin.size());
  }
  assert_int_equal(got.driver_version, want.driver_version);
  assert_string_equal(got.compiler.c_str(), want.compiler.c_str());
  assert_string_equal(got.spec_text.c_str(), want.spec_text.c_str());
  assert_int_equal(got.generator_version, want.generator_version);
  assert_int_equal(got.sm, want.sm);
}

// A fresh directory under FA_TEST_BINARY_DIR/cache_tests.
std::string temp_dir(const char *tag) {
  std::string dir = fa::test::temp_dir("cache_tests", tag);
  assert_false(dir.empty());
  return dir;
}

std::unique_ptr<Store> open_dir(const std::string &dir) {
  Options o;
  o.dir = dir;
  auto s = fa::cache::open_store(o);
  assert_non_null(s.get());
  return s;
}

// Runs this binary with args; returns its exit status (or -1).
pid_t spawn_self(const std::vector<std::string> &args) {
  std::vector<char *> argv;
  argv.push_back(const_cast<char *>(g_self.c_str()));
  for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, g_self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Raw access to the database, as another program would do it.
struct RawDb {
  sqlite3 *db = nullptr;
  explicit RawDb(const std::string &path) {
    assert_int_equal(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
  }
  ~RawDb() { sqlite3_close(db); }
  int64_t scalar(const char *sql) {
    sqlite3_stmt *s = nullptr;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, nullptr), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    const int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
  }
  std::string text(const char *sql) {
    sqlite3_stmt *s = nullptr;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, nullptr), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    std::string v(reinterpret_cast<const char *>(sqlite3_column_text(s, 0)));
    sqlite3_finalize(s);
    return v;
  }
  void exec(const char *sql) {
    assert_int_equal(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
  }
  // Reads column `col` (a blob) of the row for key.
  std::vector<uint8_t> blob(const Key &key, const char *col) {
    std::string sql = std::string("SELECT ") + col + " FROM kernels WHERE key = ?1";
    sqlite3_stmt *s = nullptr;
    assert_int_equal(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK);
    uint8_t kb[16];
    key_bytes(key, kb);
    sqlite3_bind_blob(s, 1, kb, 16, SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    const uint8_t *p = static_cast<const uint8_t *>(sqlite3_column_blob(s, 0));
    std::vector<uint8_t> v(p, p + sqlite3_column_bytes(s, 0));
    sqlite3_finalize(s);
    return v;
  }
  void set_blob(const Key &key, const char *col, const std::vector<uint8_t> &v) {
    std::string sql = std::string("UPDATE kernels SET ") + col + " = ?2 WHERE key = ?1";
    sqlite3_stmt *s = nullptr;
    assert_int_equal(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK);
    uint8_t kb[16];
    key_bytes(key, kb);
    sqlite3_bind_blob(s, 1, kb, 16, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 2, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(s), SQLITE_DONE);
    assert_int_equal(sqlite3_changes(db), 1);
    sqlite3_finalize(s);
  }
  static void key_bytes(const Key &key, uint8_t kb[16]) {
    for (int i = 0; i < 8; ++i) {
      kb[i] = static_cast<uint8_t>(key.hi >> (56 - 8 * i));
      kb[8 + i] = static_cast<uint8_t>(key.lo >> (56 - 8 * i));
    }
  }
};

std::vector<uint8_t> xxh128(const void *p, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
  return std::vector<uint8_t>(c.digest, c.digest + 16);
}

// Saves an environment variable and restores it on scope exit.
struct EnvGuard {
  std::string name, value;
  bool had;
  explicit EnvGuard(const char *n) : name(n) {
    const char *v = std::getenv(n);
    had = v != nullptr;
    if (v) value = v;
  }
  ~EnvGuard() {
    if (had) {
      setenv(name.c_str(), value.c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
};

// ---- child processes ---------------------------------------------------------

// child-get DIR ID: opens the store, expects a hit equal to record_for(ID).
int child_get(const char *dir, uint64_t id) {
  Options o;
  o.dir = dir;
  auto store = fa::cache::open_store(o);
  if (!store || !store->stats().persistent) return 3;
  Record r;
  if (!store->get(key_for(id), &r)) return 1;
  return same_record(r, record_for(id)) ? 0 : 2;
}

// Record written by process `proc`, thread `thread`, round `round` for key k.
uint64_t concurrent_seed(int k, int proc, int thread, int round) {
  return 1000000ull + k * 1000 + proc * 100 + thread * 10 + round;
}

// The key index a concurrent seed belongs to.
int concurrent_key_of(uint64_t seed) { return static_cast<int>((seed - 1000000ull) / 1000); }

// child-put DIR PROC NKEYS ROUNDS: two threads share one store; each puts
// every key ROUNDS times with its own content and reads keys back. Any hit
// must be one writer's complete record for that key.
int child_put(const char *dir, int proc, int nkeys, int rounds) {
  Options o;
  o.dir = dir;
  auto store = fa::cache::open_store(o);
  if (!store || !store->stats().persistent) return 3;
  std::atomic<int> bad{0};
  auto work = [&](int thread) {
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < nkeys; ++k) {
        const int kk = (k + thread * 7 + proc * 3) % nkeys;  // vary the order
        store->put(key_for(kk), record_for(concurrent_seed(kk, proc, thread, round)));
        Record r;
        const int probe = (kk * 5 + round) % nkeys;
        if (store->get(key_for(probe), &r)) {
          const uint64_t s = seed_of(r);
          if (s == UINT64_MAX || concurrent_key_of(s) != probe || !same_record(r, record_for(s))) {
            bad++;
          }
        }
      }
    }
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  const Stats st = store->stats();
  if (!st.persistent || st.discarded != 0) return 4;
  return bad.load() ? 2 : 0;
}

// ---- tests -----------------------------------------------------------------

void test_key_hex(void **) {
  const Key k1{0x0123456789abcdefull, 0xfedcba9876543210ull}, k2{1, 0xa0};
  assert_string_equal(k1.hex().c_str(), "0123456789abcdeffedcba9876543210");
  assert_string_equal(k2.hex().c_str(), "000000000000000100000000000000a0");
}

void test_round_trip(void **) {
  const std::string dir = temp_dir("roundtrip");
  auto store = open_dir(dir);
  Stats st = store->stats();
  assert_true(st.persistent);
  assert_string_equal(st.path.c_str(), db_file(dir).c_str());
  assert_int_equal(st.entries, 0);

  const Record a = record_for(1), b = record_for(2), c = record_for(3, /*empty_cubin=*/true);
  assert_true(a.cubin.size() > 100 && a.ptx != b.ptx && a.cubin != b.cubin);
  store->put(key_for(1), a);
  store->put(key_for(2), b);
  store->put(key_for(3), c);

  Record got;
  got.ptx = "poison";
  got.cubin.assign(17, 0xEE);
  assert_true(store->get(key_for(1), &got));
  assert_same_record(got, a);
  assert_true(store->get(key_for(2), &got));
  assert_same_record(got, b);
  assert_true(store->get(key_for(3), &got));
  assert_same_record(got, c);
  assert_true(got.cubin.empty());
  Record untouched = record_for(9);
  assert_false(store->get(key_for(4), &untouched));
  assert_same_record(untouched, record_for(9));  // a miss leaves *out alone

  st = store->stats();
  assert_int_equal(st.hits, 3);
  assert_int_equal(st.misses, 1);
  assert_int_equal(st.puts, 3);
  assert_int_equal(st.discarded, 0);
  assert_int_equal(st.entries, 3);
  assert_int_equal(st.bytes,
                   a.ptx.size() + a.cubin.size() + b.ptx.size() + b.cubin.size() + c.ptx.size());
  assert_true(st.note.empty());

  // The row on disk: 16-byte key, blobs, XXH3-128 hashes, schema version, journal mode.
  RawDb raw(db_file(dir));
  assert_int_equal(raw.scalar("PRAGMA user_version"), 3);
  assert_string_equal(raw.text("PRAGMA journal_mode").c_str(), "delete");
  assert_int_equal(raw.scalar("SELECT count(*) FROM kernels WHERE length(key) = 16"), 3);
  const std::vector<uint8_t> ptx = raw.blob(key_for(1), "ptx");
  assert_int_equal(ptx.size(), a.ptx.size());
  assert_memory_equal(ptx.data(), a.ptx.data(), ptx.size());
  const std::vector<uint8_t> ph = raw.blob(key_for(1), "ptx_hash");
  const std::vector<uint8_t> want_ph = xxh128(a.ptx.data(), a.ptx.size());
  assert_int_equal(ph.size(), 16);
  assert_memory_equal(ph.data(), want_ph.data(), 16);
  const std::vector<uint8_t> ch = raw.blob(key_for(1), "cubin_hash");
  const std::vector<uint8_t> want_ch = xxh128(a.cubin.data(), a.cubin.size());
  assert_memory_equal(ch.data(), want_ch.data(), 16);
  const std::vector<uint8_t> kb = raw.blob(key_for(2), "key");
  assert_int_equal(kb.size(), 16);
  std::string kb_hex;
  for (uint8_t byte : kb) {
    kb_hex += "0123456789abcdef"[byte >> 4];
    kb_hex += "0123456789abcdef"[byte & 15];
  }
  assert_string_equal(kb_hex.c_str(), key_for(2).hex().c_str());  // big-endian, hi first
  store.reset();
  rm_rf(dir);
}

void test_replace(void **) {
  const std::string dir = temp_dir("replace");
  auto store = open_dir(dir);
  const Record a = record_for(10), b = record_for(11);
  store->put(key_for(10), a);
  store->put(key_for(10), b);
  Record got;
  assert_true(store->get(key_for(10), &got));
  assert_same_record(got, b);
  const Stats st = store->stats();
  assert_int_equal(st.entries, 1);
  assert_int_equal(st.puts, 2);
  assert_int_equal(st.bytes, b.ptx.size() + b.cubin.size());
  const std::vector<RowInfo> rows = store->list();
  assert_int_equal(rows.size(), 1);
  assert_int_equal(rows[0].ptx_bytes, b.ptx.size());
  assert_int_equal(rows[0].cubin_bytes, b.cubin.size());
  assert_string_equal(rows[0].spec_text.c_str(), b.spec_text.c_str());
  store.reset();
  rm_rf(dir);
}

void test_persistence(void **) {
  const std::string dir = temp_dir("persist");
  const Record a = record_for(20), b = record_for(21, true);
  {
    auto store = open_dir(dir);
    store->put(key_for(20), a);
    store->put(key_for(21), b);
  }
  auto store = open_dir(dir);
  assert_true(store->stats().persistent);
  assert_int_equal(store->stats().entries, 2);
  Record got;
  assert_true(store->get(key_for(20), &got));
  assert_same_record(got, a);
  assert_true(store->get(key_for(21), &got));
  assert_same_record(got, b);
  assert_true(store->get(key_for(20), &got));
  store.reset();  // hits are written by the latest when the store closes
  // Hits and last_used are stored in the row.
  auto again = open_dir(dir);
  for (const RowInfo &r : again->list()) {
    if (r.key_hex == key_for(20).hex()) {
      assert_int_equal(r.hits, 2);
    } else {
      assert_string_equal(r.key_hex.c_str(), key_for(21).hex().c_str());
      assert_int_equal(r.hits, 1);
    }
    assert_true(r.last_used >= r.created && r.created > 1600000000);
  }
  rm_rf(dir);
}

void test_second_process(void **) {
  const std::string dir = temp_dir("process");
  auto store = open_dir(dir);
  store->put(key_for(30), record_for(30));
  assert_int_equal(store->list()[0].hits, 0);
  // A separate process (exec'd) sees the row, byte for byte.
  assert_int_equal(wait_exit(spawn_self({"child-get", dir, "30"})), 0);
  // A key it does not have is a miss there (the child is able to fail).
  assert_int_equal(wait_exit(spawn_self({"child-get", dir, "31"})), 1);
  // Its hit was recorded in the shared file.
  std::vector<RowInfo> rows = store->list();
  assert_int_equal(rows.size(), 1);
  assert_int_equal(rows[0].hits, 1);
  assert_true(rows[0].last_used >= rows[0].created);

  // A forked child keeps using the inherited store object: it reconnects.
  fflush(nullptr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    Record r;
    if (!store->get(key_for(30), &r) || !same_record(r, record_for(30))) _exit(1);
    store->put(key_for(32), record_for(32));  // also writes the pending hit
    if (!store->stats().persistent) _exit(2);
    _exit(0);
  }
  assert_int_equal(wait_exit(pid), 0);
  Record got;
  assert_true(store->get(key_for(32), &got));
  assert_same_record(got, record_for(32));
  rows = store->list();
  assert_int_equal(rows.size(), 2);
  for (const RowInfo &r : rows) {
    // Key 30 was hit by the exec'd and the forked child; 32 once by the parent.
    assert_int_equal(r.hits, r.key_hex == key_for(30).hex() ? 2 : 1);
  }
  store.reset();
  rm_rf(dir);
}

void test_concurrent_puts(void **) {
  const std::string dir = temp_dir("concurrent");
  const int nkeys = 16, rounds = 2;
  open_dir(dir);  // create the schema first, so both children race on rows
  const pid_t p1 =
      spawn_self({"child-put", dir, "1", std::to_string(nkeys), std::to_string(rounds)});
  const pid_t p2 =
      spawn_self({"child-put", dir, "2", std::to_string(nkeys), std::to_string(rounds)});
  assert_int_equal(wait_exit(p1), 0);
  assert_int_equal(wait_exit(p2), 0);

  auto store = open_dir(dir);
  const std::vector<RowInfo> rows = store->list();
  assert_int_equal(rows.size(), nkeys);
  int writers_seen[3] = {0, 0, 0};
  for (int k = 0; k < nkeys; ++k) {
    Record got;
    assert_true(store->get(key_for(k), &got));
    const uint64_t s = seed_of(got);
    assert_int_not_equal(s, UINT64_MAX);
    assert_int_equal(concurrent_key_of(s), k);
    assert_same_record(got, record_for(s));  // one writer's PTX with that writer's cubin
    writers_seen[(s / 100) % 10]++;
  }
  assert_int_equal(writers_seen[1] + writers_seen[2], nkeys);
  assert_int_equal(store->stats().discarded, 0);
  store.reset();
  rm_rf(dir);
}

void test_tampered_blob(void **) {
  const std::string dir = temp_dir("tamper");
  auto store = open_dir(dir);
  const Record a = record_for(40), b = record_for(41), c = record_for(42);
  store->put(key_for(40), a);
  store->put(key_for(41), b);
  store->put(key_for(42), c);
  {
    RawDb raw(db_file(dir));
    std::vector<uint8_t> ptx = raw.blob(key_for(40), "ptx");
    ptx[ptx.size() / 2] ^= 0x01;
    raw.set_blob(key_for(40), "ptx", ptx);
    std::vector<uint8_t> cubin = raw.blob(key_for(41), "cubin");
    cubin[7] ^= 0x80;
    raw.set_blob(key_for(41), "cubin", cubin);
  }
  Record got = record_for(99);
  assert_false(store->get(key_for(40), &got));
  assert_same_record(got, record_for(99));
  assert_int_equal(store->stats().discarded, 1);
  assert_false(store->get(key_for(41), &got));
  Stats st = store->stats();
  assert_int_equal(st.discarded, 2);
  assert_int_equal(st.misses, 2);
  assert_int_equal(st.entries, 1);  // both damaged rows were deleted
  assert_true(st.note.find("hash") != std::string::npos);
  assert_true(store->get(key_for(42), &got));
  assert_same_record(got, c);
  // The discarded key can be written again.
  store->put(key_for(40), a);
  assert_true(store->get(key_for(40), &got));
  assert_same_record(got, a);
  assert_int_equal(store->stats().discarded, 2);
  store.reset();
  rm_rf(dir);
}

// Writes n random bytes over the start of path without truncating it.
void scribble(const std::string &path, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> junk(n);
  for (auto &b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 'X';  // never the SQLite magic
  const int fd = open(path.c_str(), O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, junk.data(), n, 0), static_cast<ssize_t>(n));
  close(fd);
}

void test_garbage_file(void **) {
  const std::string dir = temp_dir("garbage");
  const std::string path = db_file(dir);
  {
    auto store = open_dir(dir);
    store->put(key_for(50), record_for(50));
  }
  struct stat st0;
  assert_int_equal(stat(path.c_str(), &st0), 0);
  scribble(path, st0.st_size, 5);
  {
    auto store = open_dir(dir);
    const Stats st = store->stats();
    assert_true(st.persistent);
    assert_true(st.note.find("reset") != std::string::npos);
    assert_int_equal(st.entries, 0);
    assert_int_equal(inode_of(path), st0.st_ino);
    store->put(key_for(51), record_for(51));
    Record got;
    assert_true(store->get(key_for(51), &got));
    assert_same_record(got, record_for(51));
  }
  {
    // The reset file is a real database again: a new instance reads it.
    auto store = open_dir(dir);
    Record got;
    assert_true(store->get(key_for(51), &got));
    assert_same_record(got, record_for(51));
    assert_true(store->stats().note.empty());
    char magic[16] = {};
    const int fd = open(path.c_str(), O_RDONLY);
    assert_int_equal(read(fd, magic, 16), 16);
    close(fd);
    assert_memory_equal(magic, "SQLite format 3", 16);

    // Damage while the store is open: the next call notices and resets.
    struct stat st1;
    assert_int_equal(stat(path.c_str(), &st1), 0);
    scribble(path, st1.st_size, 6);
    assert_false(store->get(key_for(51), &got));
    store->put(key_for(52), record_for(52));
    assert_true(store->get(key_for(52), &got));
    assert_same_record(got, record_for(52));
    assert_true(store->stats().persistent);
    assert_int_equal(inode_of(path), st0.st_ino);
  }
  {
    // Damaged pages behind a valid header (SQLITE_CORRUPT, not NOTADB).
    auto store = open_dir(dir);
    for (uint64_t id = 53; id < 56; ++id) store->put(key_for(id), record_for(id));
    store.reset();
    struct stat st2;
    assert_int_equal(stat(path.c_str(), &st2), 0);
    assert_true(st2.st_size > 4 * 4096);
    std::mt19937_64 rng(7);
    std::vector<uint8_t> junk(st2.st_size - 4096);
    for (auto &b : junk) b = static_cast<uint8_t>(rng());
    const int fd = open(path.c_str(), O_WRONLY);
    assert_int_equal(pwrite(fd, junk.data(), junk.size(), 4096), static_cast<ssize_t>(junk.size()));
    close(fd);
    store = open_dir(dir);
    Record got;
    for (uint64_t id = 53; id < 56; ++id) assert_false(store->get(key_for(id), &got));
    store->put(key_for(56), record_for(56));
    assert_true(store->get(key_for(56), &got));
    assert_same_record(got, record_for(56));
    const Stats st = store->stats();
    assert_true(st.persistent);
    assert_int_equal(st.entries, 1);
    assert_true(st.note.find("corrupt") != std::string::npos);
    assert_int_equal(inode_of(path), st0.st_ino);
  }
  rm_rf(dir);
}

void test_zero_length_file(void **) {
  const std::string dir = temp_dir("empty");
  const std::string path = db_file(dir);
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  assert_true(fd >= 0);
  close(fd);
  const ino_t ino = inode_of(path);
  auto store = open_dir(dir);
  const Stats st = store->stats();
  assert_true(st.persistent);
  assert_true(st.note.empty());
  store->put(key_for(60), record_for(60));
  Record got;
  assert_true(store->get(key_for(60), &got));
  assert_same_record(got, record_for(60));
  assert_int_equal(inode_of(path), ino);
  struct stat s;
  assert_int_equal(stat(path.c_str(), &s), 0);
  assert_true(s.st_size > 0);
  store.reset();
  rm_rf(dir);
}

// A file truncated to zero length while the store has it open: the next
// statement finds no tables; they are created again in the same file.
void test_emptied_while_open(void **) {
  const std::string dir = temp_dir("emptied");
  const std::string path = db_file(dir);
  auto store = open_dir(dir);
  store->put(key_for(62), record_for(62));
  const ino_t ino = inode_of(path);
  assert_int_equal(truncate(path.c_str(), 0), 0);
  Record got;
  assert_false(store->get(key_for(62), &got));
  Stats st = store->stats();
  assert_true(st.persistent);
  assert_int_equal(st.resets, 1);
  assert_true(st.note.find("recreated") != std::string::npos);
  store->put(key_for(63), record_for(63));
  assert_true(store->get(key_for(63), &got));
  assert_same_record(got, record_for(63));
  // The tables dropped by another program: the same repair.
  {
    RawDb raw(path);
    raw.exec("DROP TABLE kernels");
  }
  store->put(key_for(64), record_for(64));
  assert_true(store->get(key_for(64), &got));
  assert_same_record(got, record_for(64));
  st = store->stats();
  assert_true(st.persistent);
  assert_int_equal(st.resets, 2);
  assert_int_equal(st.entries, 1);
  assert_int_equal(inode_of(path), ino);
  store.reset();
  rm_rf(dir);
}

// Drops root to nobody (in a forked child); 0 when done or not root.
int drop_root() {
  if (geteuid() != 0) return 0;
  return setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0 ? 0 : -1;
}

// Checks a memory store reached through fallback: not persistent, a note, and
// it still caches. Returns 0 or a failure code (usable in a child).
int check_memory_fallback(Store *store, const char *note_part) {
  const Stats st = store->stats();
  if (st.persistent || !st.path.empty()) return 1;
  if (st.note.empty() || (note_part && st.note.find(note_part) == std::string::npos)) return 2;
  store->put(key_for(70), record_for(70));
  Record got;
  if (!store->get(key_for(70), &got) || !same_record(got, record_for(70))) return 3;
  if (store->get(key_for(71), &got)) return 4;
  const Stats after = store->stats();
  if (after.entries != 1 || after.hits != 1 || after.misses != 1 || after.puts != 1) return 5;
  return 0;
}

void test_unwritable_dir(void **) {
  // A path below a regular file fails with ENOTDIR, even for root.
  const std::string dir = temp_dir("notdir");
  const std::string file = dir + "/plain";
  const int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0644);
  assert_true(fd >= 0);
  close(fd);
  {
    auto store = open_dir(file + "/sub");
    assert_int_equal(check_memory_fallback(store.get(), "Not a directory"), 0);
  }
  {
    auto store = open_dir(file);  // the "directory" is a file
    assert_int_equal(check_memory_fallback(store.get(), "not a directory"), 0);
  }
  rm_rf(dir);

  // A directory without write permission. Root ignores permission bits, so
  // the check runs in a child that drops to nobody. /tmp so nobody can reach it.
  // (Root's directory: a read-only cache for nobody, which has no file.)
  // A database file of nobody's that nobody may not write: SQLite would open
  // it read-only; the store must not use it (puts would fail).
  char templ[] = "/tmp/fa_cache_ro-XXXXXX", templ2[] = "/tmp/fa_cache_rofile-XXXXXX";
  assert_non_null(mkdtemp(templ));
  assert_non_null(mkdtemp(templ2));
  const std::string ro = templ, rofile = templ2;
  assert_int_equal(chmod(ro.c_str(), 0555), 0);
  open_dir(rofile)->put(key_for(75), record_for(75));
  assert_int_equal(chmod(db_file(rofile).c_str(), 0444), 0);
  assert_int_equal(chmod(rofile.c_str(), 0755), 0);
  if (geteuid() == 0) {
    assert_int_equal(chown(db_file(rofile).c_str(), 65534, 65534), 0);
    assert_int_equal(chown(rofile.c_str(), 65534, 65534), 0);
  }
  fflush(nullptr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (drop_root() != 0) _exit(10);
    struct stat st;
    if (stat(ro.c_str(), &st) != 0) _exit(11);     // reachable...
    if (access(ro.c_str(), W_OK) == 0) _exit(12);  // ...but not writable
    Options o;
    o.dir = ro;
    auto store = fa::cache::open_store(o);
    if (const int rc = check_memory_fallback(store.get(), "kernels.sqlite3")) _exit(20 + rc);
    o.dir = ro + "/sub/dir";  // mkdir fails with EACCES
    store = fa::cache::open_store(o);
    if (const int rc = check_memory_fallback(store.get(), "Permission denied")) _exit(30 + rc);
    if (access(db_file(rofile).c_str(), R_OK) != 0 || access(db_file(rofile).c_str(), W_OK) == 0) {
      _exit(13);
    }
    o.dir = rofile;
    store = fa::cache::open_store(o);
    if (const int rc = check_memory_fallback(store.get(), "read-only")) _exit(40 + rc);
    _exit(0);
  }
  const int rc = wait_exit(pid);
  chmod(ro.c_str(), 0700);
  rm_rf(ro);
  rm_rf(rofile);
  assert_int_equal(rc, 0);
}

// A store whose file stops being writable after it was opened (here: the
// directory loses write permission, so no journal can be created) falls back
// to memory on the next write and keeps caching there.
void test_degrade_while_open(void **) {
  char templ[] = "/tmp/fa_cache_degrade-XXXXXX";
  assert_non_null(mkdtemp(templ));
  const std::string dir = templ;
  if (geteuid() == 0) assert_int_equal(chown(dir.c_str(), 65534, 65534), 0);
  fflush(nullptr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (drop_root() != 0) _exit(10);
    Options o;
    o.dir = dir;
    auto store = fa::cache::open_store(o);
    store->put(key_for(120), record_for(120));
    Record got;
    if (!store->stats().persistent || !store->get(key_for(120), &got)) _exit(11);
    if (chmod(dir.c_str(), 0555) != 0) _exit(12);
    store->put(key_for(121), record_for(121));  // needs a journal file: fails
    const Stats st = store->stats();
    if (st.persistent || st.note.find("memory only") == std::string::npos) _exit(13);
    if (!store->get(key_for(121), &got) || !same_record(got, record_for(121))) _exit(14);
    if (store->stats().entries != 1) _exit(15);
    _exit(0);
  }
  const int rc = wait_exit(pid);
  chmod(dir.c_str(), 0700);
  rm_rf(dir);
  assert_int_equal(rc, 0);
}

void test_disable_env(void **) {
  const std::string dir = temp_dir("disable");
  EnvGuard g("FLASHATTN_CACHE_DISABLE");
  setenv("FLASHATTN_CACHE_DISABLE", "1", 1);
  {
    auto store = open_dir(dir);
    assert_int_equal(check_memory_fallback(store.get(), "FLASHATTN_CACHE_DISABLE"), 0);
    struct stat st;
    assert_int_not_equal(stat(db_file(dir).c_str(), &st), 0);  // no file was created
  }
  setenv("FLASHATTN_CACHE_DISABLE", "0", 1);
  {
    auto store = open_dir(dir);
    assert_true(store->stats().persistent);
  }
  unsetenv("FLASHATTN_CACHE_DISABLE");
  {
    Options o;
    o.dir = dir;
    o.memory_only = true;
    auto store = fa::cache::open_store(o);
    assert_int_equal(check_memory_fallback(store.get(), nullptr), 0);
    // Memory store: replace, list and clear.
    store->put(key_for(70), record_for(72));
    Record got;
    assert_true(store->get(key_for(70), &got));
    assert_same_record(got, record_for(72));
    const std::vector<RowInfo> rows = store->list();
    assert_int_equal(rows.size(), 1);
    assert_string_equal(rows[0].key_hex.c_str(), key_for(70).hex().c_str());
    assert_int_equal(rows[0].ptx_bytes, record_for(72).ptx.size());
    assert_int_equal(rows[0].hits, 1);
    assert_int_equal(store->clear(), FA_SUCCESS);
    assert_int_equal(store->list().size(), 0);
    assert_false(store->get(key_for(70), &got));
  }
  rm_rf(dir);
}

void test_env_resolution(void **) {
  const std::string root = temp_dir("env");
  EnvGuard g1("FLASHATTN_CACHE_DIR"), g2("XDG_CACHE_HOME"), g3("HOME"),
      g4("FLASHATTN_CACHE_DISABLE");
  unsetenv("FLASHATTN_CACHE_DISABLE");
  const std::string a = root + "/a", x = root + "/x", h = root + "/h";
  setenv("FLASHATTN_CACHE_DIR", (a + "/deep/er").c_str(), 1);
  setenv("XDG_CACHE_HOME", x.c_str(), 1);
  setenv("HOME", h.c_str(), 1);
  Options none;
  assert_string_equal(fa::cache::open_store(none)->stats().path.c_str(),
                      (a + "/deep/er/kernels.sqlite3").c_str());
  unsetenv("FLASHATTN_CACHE_DIR");
  assert_string_equal(fa::cache::open_store(none)->stats().path.c_str(),
                      (x + "/flashattn/kernels.sqlite3").c_str());
  setenv("FLASHATTN_CACHE_DIR", "", 1);         // empty counts as unset
  setenv("XDG_CACHE_HOME", "relative/dir", 1);  // not absolute: ignored
  assert_string_equal(fa::cache::open_store(none)->stats().path.c_str(),
                      (h + "/.cache/flashattn/kernels.sqlite3").c_str());
  unsetenv("XDG_CACHE_HOME");
  auto store = fa::cache::open_store(none);
  assert_string_equal(store->stats().path.c_str(),
                      (h + "/.cache/flashattn/kernels.sqlite3").c_str());
  store->put(key_for(80), record_for(80));
  struct stat st;
  assert_int_equal(stat((h + "/.cache/flashattn/kernels.sqlite3").c_str(), &st), 0);
  assert_int_equal(stat((h + "/.cache/flashattn").c_str(), &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);  // created private
  // options.dir beats every variable.
  setenv("FLASHATTN_CACHE_DIR", a.c_str(), 1);
  Options o;
  o.dir = root + "/explicit";
  assert_string_equal(fa::cache::open_store(o)->stats().path.c_str(),
                      (root + "/explicit/kernels.sqlite3").c_str());
  // Nothing set at all: memory, with a note.
  unsetenv("FLASHATTN_CACHE_DIR");
  unsetenv("HOME");
  assert_int_equal(check_memory_fallback(fa::cache::open_store(none).get(), "HOME"), 0);
  rm_rf(root);
}

void test_clear_and_list(void **) {
  const std::string dir = temp_dir("clear");
  auto store = open_dir(dir);
  const int64_t before = static_cast<int64_t>(time(nullptr));
  for (uint64_t id = 90; id < 93; ++id) store->put(key_for(id), record_for(id, id == 92));
  std::vector<RowInfo> rows = store->list();
  assert_int_equal(rows.size(), 3);
  int seen = 0;
  for (const RowInfo &r : rows) {
    for (uint64_t id = 90; id < 93; ++id) {
      if (r.key_hex != key_for(id).hex()) continue;
      const Record want = record_for(id, id == 92);
      assert_string_equal(r.spec_text.c_str(), want.spec_text.c_str());
      assert_int_equal(r.ptx_bytes, want.ptx.size());
      assert_int_equal(r.cubin_bytes, want.cubin.size());
      assert_int_equal(r.sm, want.sm);
      assert_int_equal(r.generator_version, want.generator_version);
      assert_int_equal(r.driver_version, want.driver_version);
      assert_int_equal(r.hits, 0);
      assert_true(r.created >= before && r.created <= before + 60);
      seen |= 1 << (id - 90);
    }
  }
  assert_int_equal(seen, 7);
  assert_int_equal(store->clear(), FA_SUCCESS);
  assert_int_equal(store->list().size(), 0);
  const Stats st = store->stats();
  assert_int_equal(st.entries, 0);
  assert_int_equal(st.bytes, 0);
  Record got;
  assert_false(store->get(key_for(90), &got));
  // Another instance sees it empty too, and the store keeps working.
  assert_int_equal(open_dir(dir)->stats().entries, 0);
  store->put(key_for(90), record_for(90));
  assert_true(store->get(key_for(90), &got));
  assert_same_record(got, record_for(90));
  store.reset();
  rm_rf(dir);
}

// A version 2 database (flashattn 0.2 to 0.5: no compiler column) is
// migrated in place: its rows stay and read with compiler "", new rows
// record theirs.
void test_schema_2_migrated(void **) {
  const std::string dir = temp_dir("schema2");
  Record old = record_for(110);
  old.compiler.clear();
  open_dir(dir)->put(key_for(110), old);
  {
    RawDb raw(db_file(dir));
    raw.exec("ALTER TABLE kernels DROP COLUMN compiler");
    raw.exec("PRAGMA user_version = 2");
  }
  auto store = open_dir(dir);
  assert_true(store->stats().persistent);
  assert_int_equal(store->stats().entries, 1);
  Record got;
  assert_true(store->get(key_for(110), &got));
  assert_same_record(got, old);
  store->put(key_for(111), record_for(111));
  assert_true(store->get(key_for(111), &got));
  assert_same_record(got, record_for(111));
  const std::vector<RowInfo> rows = store->list();
  assert_int_equal(rows.size(), 2);
  assert_string_equal(rows[1].compiler.c_str(), record_for(111).compiler.c_str());
  RawDb raw(db_file(dir));
  assert_int_equal(raw.scalar("PRAGMA user_version"), 3);
  store.reset();
  rm_rf(dir);
}

void test_schema_version_change(void **) {
  const std::string dir = temp_dir("schema");
  open_dir(dir)->put(key_for(100), record_for(100));
  {
    RawDb raw(db_file(dir));
    raw.exec("PRAGMA user_version = 99");
    assert_string_equal(raw.text("PRAGMA journal_mode=WAL").c_str(), "wal");
  }
  auto store = open_dir(dir);
  assert_true(store->stats().persistent);
  assert_int_equal(store->stats().entries, 0);  // table recreated
  RawDb raw(db_file(dir));
  assert_int_equal(raw.scalar("PRAGMA user_version"), 3);
  assert_string_equal(raw.text("PRAGMA journal_mode").c_str(), "delete");  // WAL switched off
  store->put(key_for(101), record_for(101));
  Record got;
  assert_true(store->get(key_for(101), &got));
  assert_same_record(got, record_for(101));
  store.reset();
  rm_rf(dir);
}

void test_busy_database(void **) {
  const std::string dir = temp_dir("busy");
  auto store = open_dir(dir);
  store->put(key_for(110), record_for(110));
  RawDb raw(db_file(dir));

  // Another connection in a write transaction (RESERVED lock): get() still
  // hits at once, and recording the hit waits for the lock to be free.
  raw.exec("BEGIN IMMEDIATE");
  const auto t0 = std::chrono::steady_clock::now();
  Record got;
  assert_true(store->get(key_for(110), &got));
  assert_same_record(got, record_for(110));
  assert_int_equal(store->list()[0].hits, 0);  // flush skipped: the file is locked
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  assert_true(waited < 2.0);
  raw.exec("COMMIT");
  assert_int_equal(store->list()[0].hits, 1);  // the pending hit was kept and written now
  assert_true(store->get(key_for(110), &got));
  assert_int_equal(store->list()[0].hits, 2);

  // A writer holding the lock for a while: put() waits for it and succeeds.
  raw.exec("BEGIN IMMEDIATE");
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    sqlite3_exec(raw.db, "COMMIT", nullptr, nullptr, nullptr);
  });
  const auto t1 = std::chrono::steady_clock::now();
  store->put(key_for(111), record_for(111));
  const double blocked =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  release.join();
  assert_true(blocked > 0.5);
  assert_true(store->get(key_for(111), &got));
  assert_same_record(got, record_for(111));
  assert_true(store->stats().persistent);
  store.reset();
  rm_rf(dir);
}

}  // namespace

int main(int argc, char **argv) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  g_self = n > 0 ? std::string(self, n) : argv[0];
  if (argc == 4 && !std::strcmp(argv[1], "child-get")) {
    return child_get(argv[2], std::strtoull(argv[3], nullptr, 10));
  }
  if (argc == 6 && !std::strcmp(argv[1], "child-put")) {
    return child_put(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  }
  setenv("FLASHATTN_QUIET", "1", 1);  // expected warnings would only clutter the log
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_hex),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_replace),
      cmocka_unit_test(test_persistence),
      cmocka_unit_test(test_second_process),
      cmocka_unit_test(test_concurrent_puts),
      cmocka_unit_test(test_tampered_blob),
      cmocka_unit_test(test_garbage_file),
      cmocka_unit_test(test_zero_length_file),
      cmocka_unit_test(test_emptied_while_open),
      cmocka_unit_test(test_unwritable_dir),
      cmocka_unit_test(test_disable_env),
      cmocka_unit_test(test_env_resolution),
      cmocka_unit_test(test_clear_and_list),
      cmocka_unit_test(test_schema_version_change),
      cmocka_unit_test(test_schema_2_migrated),
      cmocka_unit_test(test_busy_database),
      cmocka_unit_test(test_degrade_while_open),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
