// Fuzz target: a kernel-cache row with fuzzed fields (any SQLite storage
// class in any column, right or wrong blob hashes, other key material) is
// written with a raw sqlite3 connection into the store's own database, then
// read with Store::get(). get() must never crash, and whenever it returns a
// record, that record's PTX and cubin must hash to the row's stored hashes
// and match the row's bytes (checked through the raw connection).
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>
#define XXH_INLINE_ALL  // as the library: header-only, no libxxhash link
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "cache/store.h"
#include "cache/store_internal.h"
#include "fuzz/fuzz_input.h"

namespace {

const fa::cache::Key kKey{0x0123456789abcdefull, 0xfedcba9876543210ull};

struct Env {
  std::string dir, path;
  sqlite3 *raw = nullptr;
  std::unique_ptr<fa::cache::Store> store;

  Env() {
    char tmpl[] = "/tmp/fa_fuzz_cache_XXXXXX";
    if (!mkdtemp(tmpl)) __builtin_trap();
    dir = tmpl;
    path = dir + "/kernels.sqlite3";
    reopen_store();
    if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
      __builtin_trap();
    sqlite3_busy_timeout(raw, 5000);
    // Scratch data: no fsync on this connection's commits (faster fuzzing).
    sqlite3_exec(raw, "PRAGMA synchronous = OFF", nullptr, nullptr, nullptr);
    std::atexit(remove_scratch);
  }
  // Removes the scratch files only: the store stays open (see env()).
  static void remove_scratch() {
    for (const char *suffix : {"", "-journal"})
      unlink((env_dir() + "/kernels.sqlite3" + suffix).c_str());
    rmdir(env_dir().c_str());
  }
  static std::string &env_dir();
  void reopen_store() {
    store.reset();
    fa::cache::Options o;
    o.dir = dir;
    o.max_bytes = 0;
    store = fa::cache::open_store(o);
    if (!store->stats().persistent) __builtin_trap();  // a scratch file must open
  }
};

// Never destroyed (still reachable, so LeakSanitizer is quiet): library code
// run from a static destructor could touch the thread's last-error string
// after its thread_local destructor ran (reported, src/common/error.cc).
Env &env() {
  static Env *e = new Env;
  return *e;
}

std::string &Env::env_dir() { return env().dir; }

std::string hash_of(const std::string &s) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(s.empty() ? "" : s.data(), s.size()));
  return std::string(reinterpret_cast<const char *>(c.digest), 16);
}

// Binds column value `bytes` as the storage class the input picks (mostly
// the column's normal class `normal`: 0 blob, 1 text, 2 integer).
void bind_value(sqlite3_stmt *s, int i, fa_fuzz::Input &in, const std::string &bytes, int normal) {
  const uint8_t pick = in.byte();
  const int cls = pick < 200 ? normal : pick % 5;
  switch (cls) {
    case 0:
      sqlite3_bind_blob(s, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
      break;
    case 1:
      sqlite3_bind_text(s, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
      break;
    case 2:
      sqlite3_bind_int64(s, i, in.get<int64_t>());
      break;
    case 3:
      sqlite3_bind_double(s, i, static_cast<double>(in.get<int32_t>()) / 7.0);
      break;
    default:
      sqlite3_bind_null(s, i);  // NOT NULL: the insert fails, get() misses
      break;
  }
}

// The column's value as SQLite stores it, as bytes (CAST AS BLOB).
std::string column_bytes(sqlite3 *db, const char *col) {
  const std::string sql =
      std::string("SELECT CAST(") + col + " AS BLOB) FROM kernels WHERE key = ?1";
  sqlite3_stmt *s = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) __builtin_trap();
  uint8_t kb[16];
  fa::cache::key_to_bytes(kKey, kb);
  sqlite3_bind_blob(s, 1, kb, 16, SQLITE_STATIC);
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW) {
    const void *p = sqlite3_column_blob(s, 0);
    const int n = sqlite3_column_bytes(s, 0);
    if (p && n > 0) out.assign(static_cast<const char *>(p), static_cast<size_t>(n));
  } else {
    __builtin_trap();  // get() returned a row that is not there
  }
  sqlite3_finalize(s);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Env &e = env();
  fa_fuzz::Input in(data, size);
  if (!e.store->stats().persistent) e.reopen_store();
  sqlite3_exec(e.raw, "DELETE FROM kernels; DELETE FROM leases;", nullptr, nullptr, nullptr);

  const std::string material = in.bytes(64);
  const std::string spec = in.bytes(64);
  const std::string ptx = in.bytes(2048);
  const std::string cubin = in.bytes(512);
  // Hashes: right (flag set) or fuzzed bytes of any length.
  const std::string ptx_hash = in.flag() ? hash_of(ptx) : in.bytes(20);
  const std::string cubin_hash = in.flag() ? hash_of(cubin) : in.bytes(20);

  uint8_t kb[16];
  fa::cache::key_to_bytes(kKey, kb);
  std::string key(reinterpret_cast<const char *>(kb), 16);
  if (in.byte() >= 240) key = in.bytes(20);  // another key, maybe not 16 bytes

  sqlite3_stmt *s = nullptr;
  if (sqlite3_prepare_v2(e.raw,
                         "INSERT OR REPLACE INTO kernels (key, key_material, spec, sm,"
                         " generator_version, driver_version, created_ms, last_used_ms, hits,"
                         " ptx_hash, cubin_hash, ptx, cubin)"
                         " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                         -1, &s, nullptr) != SQLITE_OK)
    __builtin_trap();
  bind_value(s, 1, in, key, 0);
  bind_value(s, 2, in, material, 0);
  bind_value(s, 3, in, spec, 1);
  for (int i = 4; i <= 9; ++i) bind_value(s, i, in, std::string(), 2);
  bind_value(s, 10, in, ptx_hash, 0);
  bind_value(s, 11, in, cubin_hash, 0);
  bind_value(s, 12, in, ptx, 0);
  bind_value(s, 13, in, cubin, 0);
  (void)sqlite3_step(s);  // constraint failures are fine: get() then misses
  sqlite3_finalize(s);

  // Look up with the row's material, none (no check), or other material.
  const uint8_t how = in.byte() % 3;
  const std::string want = how == 0 ? material : how == 1 ? std::string() : in.bytes(64);
  fa::cache::Record rec;
  rec.ptx = "untouched";
  const bool hit = e.store->get(kKey, want, &rec);
  if (getenv("FA_FUZZ_VERBOSE")) fprintf(stderr, "cache_row: %s\n", hit ? "hit" : "miss");
  if (hit) {
    const std::string row_ptx = column_bytes(e.raw, "ptx");
    const std::string row_cubin = column_bytes(e.raw, "cubin");
    const std::string row_ph = column_bytes(e.raw, "ptx_hash");
    const std::string row_ch = column_bytes(e.raw, "cubin_hash");
    const std::string rec_cubin(rec.cubin.begin(), rec.cubin.end());
    if (rec.ptx != row_ptx || rec_cubin != row_cubin) __builtin_trap();
    if (hash_of(rec.ptx) != row_ph || hash_of(rec_cubin) != row_ch) __builtin_trap();
    if (!want.empty() && rec.key_material != want) __builtin_trap();
  } else if (rec.ptx != "untouched") {
    __builtin_trap();  // a miss must leave *out alone
  }
  return 0;
}
