// The kernel cache under crashes and damage (docs/reliability.md):
//  2. kill -9 of writers at random moments, many rounds: the cache reopens,
//     PRAGMA integrity_check is ok, and every row is present and intact
//     (hashes verify, content equals what its writer put) or absent;
//  3. a database file garbled, emptied or cut short while several processes
//     hold it open is reset in place (same inode, never unlinked or renamed)
//     and every process keeps launching, with right results, on a persistent
//     cache.
// Rounds and durations grow with FA_KILL_ROUNDS, FA_KILL_LAUNCH_ROUNDS and
// FA_CORRUPT_SECONDS (tests/stress/run.sh sets them); FA_TEST_QUICK=1 (the
// sanitizer pass) shortens them.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/store.h"
#include "cache/store_internal.h"
#include "flashattn.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"

using fa::cache::Key;
using fa::cache::LeaseResult;
using fa::cache::Options;
using fa::cache::Record;
using fa::cache::Stats;
using fa::cache::Store;
using fa::test::db_file;
using fa::test::fork_child;
using fa::test::inode_of;
using fa::test::key_for;
using fa::test::mix;
using fa::test::RawDb;
using fa::test::record_for;
using fa::test::rm_rf;
using fa::test::same_record;
using fa::test::seed_of;
using fa::test::wait_exit;

namespace {

using Clock = std::chrono::steady_clock;
using fa::test::seconds_since;

bool quick() {
  const char *q = std::getenv("FA_TEST_QUICK");
  return q && q[0] == '1';
}

// $name as a positive integer, else dflt (dflt_quick under FA_TEST_QUICK=1).
int env_int(const char *name, int dflt, int dflt_quick) {
  const char *v = std::getenv(name);
  if (v && std::atoi(v) > 0) return std::atoi(v);
  return quick() ? dflt_quick : dflt;
}

std::string temp_dir(const char *tag) {
  std::string dir = fa::test::temp_dir("cache_crash", tag);
  assert_false(dir.empty());
  return dir;
}

// Shared counters in memory that survives the children, even killed ones.
template <typename T>
T *shared_new() {
  void *p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  return new (p) T();
}
template <typename T>
void shared_delete(T *p) {
  p->~T();
  munmap(p, sizeof(T));
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

Key key_from_bytes(const std::string &b) {
  Key k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | static_cast<uint8_t>(b[i]);
    k.lo = (k.lo << 8) | static_cast<uint8_t>(b[8 + i]);
  }
  return k;
}

// ---- 2. kill -9 of writers -----------------------------------------------------

constexpr uint64_t kIds = 160;             // keys the writers share
constexpr uint64_t kSeedStride = 1000000;  // seed = id * kSeedStride + generation
constexpr int64_t kKillCapBytes = 768 << 10;

std::string kill_material(uint64_t id) { return "kill-test id " + std::to_string(id); }

// What a writer stores for `seed`: derived from the seed alone, so any row can
// be checked against it. Up to about 80 KB (overflow pages); every fifth has
// no cubin.
Record kill_record(uint64_t seed) {
  Record r = record_for(seed, seed % 5 == 0, (mix(seed) % 4) * 24000);
  r.key_material = kill_material(seed / kSeedStride);
  return r;
}

// True when r is exactly what some writer stored for id.
bool intact(const Record &r, uint64_t id) {
  const uint64_t seed = seed_of(r);
  return seed != UINT64_MAX && seed / kSeedStride == id && same_record(r, kill_record(seed)) &&
         r.key_material == kill_material(id);
}

struct KillShared {
  std::atomic<uint64_t> puts{0}, gets{0}, hits{0}, leases{0}, clears{0}, bad{0}, started{0};
};

Options kill_options(const std::string &dir) {
  Options o;
  o.dir = dir;
  o.max_bytes = kKillCapBytes;  // evictions in most transactions
  o.lease_ttl_ms = 500;
  o.lease_wait_ms = 100;
  return o;
}

// A writer: puts, reads (checking every hit), takes compile leases and now
// and then clears, until it is killed. Returns only on a failure.
int kill_writer(const std::string &dir, int proc, KillShared *sh) {
  auto store = fa::cache::open_store(kill_options(dir));
  if (!store->stats().persistent) return 3;
  sh->started++;
  std::mt19937_64 rng(mix(static_cast<uint64_t>(getpid()) * 31 + proc));
  for (uint64_t gen = 1;; ++gen) {
    const uint64_t id = rng() % kIds;
    const uint64_t seed = id * kSeedStride + (gen * 8 + proc) % kSeedStride;
    const int action = static_cast<int>(rng() % 200);
    Record r;
    if (action < 110) {
      store->put(key_for(id), kill_record(seed));
      sh->puts++;
    } else if (action < 180) {
      sh->gets++;
      if (store->get(key_for(id), kill_material(id), &r)) {
        sh->hits++;
        if (!intact(r, id)) sh->bad++;
      }
    } else if (action < 199) {
      switch (store->acquire_lease(key_for(id), kill_material(id), &r)) {
        case LeaseResult::kAcquired:
          sh->leases++;
          store->put(key_for(id), kill_record(seed));  // releases the lease
          break;
        case LeaseResult::kFound:
          if (!intact(r, id)) sh->bad++;
          break;
        default:
          break;
      }
    } else {
      if (store->clear() != FA_SUCCESS) sh->bad++;
      sh->clears++;
    }
    if (gen % 64 == 0 && !store->stats().persistent) {
      sh->bad++;
      return 4;
    }
  }
}

// Reopens the cache after a round: persistent, nothing reset or discarded,
// integrity_check ok, and every row intact. Returns the rows checked.
uint64_t verify_after_kills(const std::string &dir) {
  auto store = fa::cache::open_store(kill_options(dir));
  Stats st = store->stats();
  if (!st.persistent || !st.note.empty()) std::printf("  reopen note: %s\n", st.note.c_str());
  assert_true(st.persistent);
  assert_int_equal(st.resets, 0);
  RawDb raw(db_file(dir));
  assert_non_null(raw.db);
  assert_string_equal(raw.text("PRAGMA integrity_check").c_str(), "ok");
  const auto rows = raw.keys();
  for (const auto &kv : rows) {
    const std::string prefix = "kill-test id ";
    assert_true(kv.second.compare(0, prefix.size(), prefix) == 0);
    const uint64_t id = std::strtoull(kv.second.c_str() + prefix.size(), nullptr, 10);
    assert_true(id < kIds);
    assert_true(key_from_bytes(kv.first) == key_for(id));
    Record r;
    assert_true(store->get(key_for(id), kill_material(id), &r));
    assert_true(intact(r, id));
  }
  st = store->stats();
  assert_int_equal(st.discarded, 0);
  assert_int_equal(st.collisions, 0);
  assert_int_equal(st.resets, 0);
  assert_true(st.persistent);
  return rows.size();
}

void test_kill9_writers(void **) {
  const int rounds = env_int("FA_KILL_ROUNDS", 40, 10);
  constexpr int kWriters = 3;
  const std::string dir = temp_dir("kill");
  auto *sh = shared_new<KillShared>();
  std::mt19937_64 rng(12345);
  uint64_t kills = 0, rows_checked = 0, max_rows = 0, hot_journals = 0;
  const auto t0 = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    std::vector<pid_t> pids;
    sh->started = 0;
    for (int p = 0; p < kWriters; ++p) {
      pids.push_back(fork_child([&, p] { return kill_writer(dir, p, sh); }, /*quiet=*/false, 600));
    }
    // Let them get going, then kill each at its own random moment.
    const auto t_start = Clock::now();
    while (sh->started.load() < kWriters && seconds_since(t_start) < 10) sleep_ms(1);
    for (pid_t pid : pids) {
      sleep_ms(static_cast<int>(rng() % 40));
      kill(pid, SIGKILL);
    }
    for (pid_t pid : pids) assert_int_equal(wait_exit(pid), 128 + SIGKILL);
    kills += kWriters;
    // A journal left behind means a kill landed inside a write transaction:
    // the reopen below must roll it back.
    if (fa::test::file_size(db_file(dir) + "-journal") > 0) ++hot_journals;
    const uint64_t rows = verify_after_kills(dir);
    rows_checked += rows;
    max_rows = std::max(max_rows, rows);
    assert_int_equal(sh->bad.load(), 0);
  }
  assert_true(sh->puts.load() > 0 && rows_checked > 0);  // not vacuous
  assert_true(fa::test::file_size(db_file(dir)) < 2 * kKillCapBytes);
  std::printf(
      "  kill -9: %d rounds x %d writers, %llu killed, puts %llu, gets %llu (hits %llu), leases "
      "%llu, clears %llu; %llu rounds left a hot journal; rows verified %llu (at most %llu at "
      "once); bad 0; %.1f s\n",
      rounds, kWriters, (unsigned long long)kills, (unsigned long long)sh->puts.load(),
      (unsigned long long)sh->gets.load(), (unsigned long long)sh->hits.load(),
      (unsigned long long)sh->leases.load(), (unsigned long long)sh->clears.load(),
      (unsigned long long)hot_journals, (unsigned long long)rows_checked,
      (unsigned long long)max_rows, seconds_since(t0));
  shared_delete(sh);
  rm_rf(dir);
}

// kill -9 of processes launching through the public API (generation, compile
// lease, store writes, cache clears): afterwards a fresh runtime launches
// every kernel correctly from the same cache.
constexpr int kLaunchDims[] = {16, 24, 32, 40, 48, 56, 64};

struct LaunchShared {
  std::atomic<uint64_t> launches{0}, bad{0}, started{0};
};

int kill_launcher(const std::string &dir, int proc, LaunchShared *sh) {
  std::mt19937_64 rng(mix(static_cast<uint64_t>(getpid()) + proc));
  sh->started++;
  for (int iter = 0;; ++iter) {
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);
    if (!rt) {
      sh->bad++;
      return 3;
    }
    if (rng() % 3 == 0 && fa_cache_clear(rt) != FA_SUCCESS) sh->bad++;
    const int d = kLaunchDims[rng() % std::size(kLaunchDims)];
    if (!fa::test::launch_small_forward(rt, d, static_cast<uint32_t>(iter))) sh->bad++;
    sh->launches++;
    if (!fa::test::cache_stats_of(rt).persistent) sh->bad++;
    fa_runtime_destroy(rt);
  }
}

void test_kill9_launching(void **) {
  const int rounds = env_int("FA_KILL_LAUNCH_ROUNDS", 6, 3);
  const std::string dir = temp_dir("killrt");
  auto *sh = shared_new<LaunchShared>();
  std::mt19937_64 rng(777);
  const auto t0 = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    sh->started = 0;
    std::vector<pid_t> pids;
    for (int p = 0; p < 2; ++p) {
      pids.push_back(fork_child([&, p] { return kill_launcher(dir, p, sh); }, /*quiet=*/true));
    }
    while (sh->started.load() < 2) sleep_ms(1);
    for (pid_t pid : pids) {
      sleep_ms(20 + static_cast<int>(rng() % 300));
      kill(pid, SIGKILL);
    }
    for (pid_t pid : pids) assert_int_equal(wait_exit(pid), 128 + SIGKILL);
    assert_int_equal(sh->bad.load(), 0);
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);
    assert_non_null(rt);
    for (int d : kLaunchDims) assert_true(fa::test::launch_small_forward(rt, d, 99));
    const fa_cache_stats s = fa::test::cache_stats_of(rt);
    assert_int_equal(s.persistent, 1);
    assert_int_equal(s.discarded, 0);
    assert_int_equal(s.resets, 0);
    fa_runtime_destroy(rt);
    RawDb raw(db_file(dir));
    assert_string_equal(raw.text("PRAGMA integrity_check").c_str(), "ok");
  }
  std::printf("  kill -9 while launching: %d rounds x 2 processes, %llu launches, bad 0, %.1f s\n",
              rounds, (unsigned long long)sh->launches.load(), seconds_since(t0));
  shared_delete(sh);
  rm_rf(dir);
}

// ---- 3. damaged blobs, through the public API ----------------------------------------

// The kernel's PTX blob flipped, truncated or emptied in the file (its stored
// hash left alone): a fresh runtime never hands those bytes to the emulator.
// It counts the row as discarded, regenerates the kernel (right result) and
// stores it again, so the next runtime gets a clean disk hit.
void test_damaged_blob_runtime(void **) {
  const std::string dir = temp_dir("blob");
  const std::string path = db_file(dir);
  const char *const kinds[] = {"one byte flipped", "truncated", "emptied"};
  for (int kind = 0; kind < 3; ++kind) {
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);
    assert_non_null(rt);
    assert_true(fa::test::launch_small_forward(rt, 40, 1));
    fa_runtime_destroy(rt);
    {
      RawDb raw(path);
      assert_int_equal(raw.scalar("SELECT count(*) FROM kernels"), 1);
      const char *sql[] = {
          "UPDATE kernels SET ptx = CAST(substr(ptx, 1, length(ptx) / 2) ||"
          " char((unicode(substr(ptx, length(ptx) / 2 + 1, 1)) | 1) -"
          " (unicode(substr(ptx, length(ptx) / 2 + 1, 1)) & 1)) ||"  // XOR 1
          " substr(ptx, length(ptx) / 2 + 2) AS BLOB)",
          "UPDATE kernels SET ptx = substr(ptx, 1, length(ptx) - 40)",
          "UPDATE kernels SET ptx = zeroblob(0)"};
      assert_int_equal(sqlite3_exec(raw.db, sql[kind], nullptr, nullptr, nullptr), SQLITE_OK);
    }
    rt = fa::test::open_emulator_runtime(dir);
    assert_non_null(rt);
    assert_true(fa::test::launch_small_forward(rt, 40, 2));
    fa_cache_stats s = fa::test::cache_stats_of(rt);
    std::printf("  PTX blob %s: discarded %llu, misses %llu, disk hits %llu\n", kinds[kind],
                (unsigned long long)s.discarded, (unsigned long long)s.misses,
                (unsigned long long)s.disk_hits);
    assert_int_equal(s.discarded, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.disk_hits, 0);
    assert_true(std::strstr(s.note, "hash mismatch") != nullptr);
    fa_runtime_destroy(rt);
    rt = fa::test::open_emulator_runtime(dir);  // the regenerated row is sound
    assert_true(fa::test::launch_small_forward(rt, 40, 3));
    s = fa::test::cache_stats_of(rt);
    assert_int_equal(s.disk_hits, 1);
    assert_int_equal(s.discarded, 0);
    assert_int_equal(fa_cache_clear(rt), FA_SUCCESS);
    fa_runtime_destroy(rt);
  }
  rm_rf(dir);
}

// ---- 3. damage while others hold the file open ------------------------------------

enum Damage { kGarbledHeader, kGarbledPages, kZeroLength, kCutShort, kDamageKinds };
const char *const kDamageNames[] = {"garbled header", "garbled pages", "zero length", "cut short"};

// Damages path in place: pwrite/ftruncate on the same inode.
void damage(const std::string &path, Damage kind, std::mt19937_64 &rng) {
  const int fd = open(path.c_str(), O_WRONLY);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  const int64_t size = st.st_size;
  auto scribble = [&](int64_t off, int64_t n) {
    std::vector<uint8_t> junk(static_cast<size_t>(n));
    for (auto &b : junk) b = static_cast<uint8_t>(rng());
    if (off == 0 && n > 0) junk[0] = 'X';  // never the SQLite magic
    assert_int_equal(pwrite(fd, junk.data(), junk.size(), off), n);
  };
  switch (kind) {
    case kGarbledHeader:
      scribble(0, std::min<int64_t>(size, 100 + static_cast<int64_t>(rng() % 4000)));
      break;
    case kGarbledPages:
      if (size > 4096) {
        const int64_t off = 4096 + static_cast<int64_t>(rng() % static_cast<uint64_t>(size - 4096));
        scribble(off, std::min<int64_t>(size - off, 512 + static_cast<int64_t>(rng() % 8192)));
      }
      break;
    case kZeroLength:
      assert_int_equal(ftruncate(fd, 0), 0);
      break;
    case kCutShort:
      assert_int_equal(ftruncate(fd, size / 2), 0);
      break;
    default:
      break;
  }
  close(fd);
}

struct DamageShared {
  std::atomic<int> stop{0}, ready{0};
  std::atomic<uint64_t> launches{0}, store_hits{0}, bad{0}, degraded{0}, resets{0}, discarded{0};
};

constexpr int kDamageProcs = 3;
constexpr int kDamageDims[] = {16, 32, 48, 64};

// One process: a long-lived runtime and store (connections held open across
// every damage) plus a fresh runtime per iteration, launching until stopped.
int damage_worker(const std::string &dir, int proc, DamageShared *sh) {
  fa_runtime *held = fa::test::open_emulator_runtime(dir);
  Options o;
  o.dir = dir;
  auto store = fa::cache::open_store(o);
  if (!held || !store->stats().persistent) return 3;
  sh->ready++;
  std::mt19937_64 rng(mix(static_cast<uint64_t>(proc) + 5));
  for (int iter = 0; !sh->stop.load(); ++iter) {
    const int d = kDamageDims[(iter + proc) % std::size(kDamageDims)];
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);
    if (!rt || !fa::test::launch_small_forward(rt, d, static_cast<uint32_t>(iter))) sh->bad++;
    if (rt) {
      const fa_cache_stats s = fa::test::cache_stats_of(rt);
      if (!s.persistent) sh->degraded++;
      sh->resets += s.resets;
      sh->discarded += s.discarded;
      fa_runtime_destroy(rt);
    }
    if (!fa::test::launch_small_forward(held, d, static_cast<uint32_t>(iter) + 1)) sh->bad++;
    sh->launches += 2;
    // Store traffic on the held connection: every hit must be intact.
    const uint64_t id = 100000 + static_cast<uint64_t>(proc) * 100 + rng() % 20;
    Record r;
    if (store->get(key_for(id), &r)) {
      sh->store_hits++;
      if (seed_of(r) / kSeedStride != id || !same_record(r, record_for(seed_of(r)))) sh->bad++;
    }
    store->put(key_for(id), record_for(id * kSeedStride + static_cast<uint64_t>(iter)));
  }
  const Stats st = store->stats();
  const fa_cache_stats hs = fa::test::cache_stats_of(held);
  if (!st.persistent) sh->degraded++;
  if (!hs.persistent) sh->degraded++;
  sh->resets += st.resets + hs.resets;
  sh->discarded += st.discarded + hs.discarded;
  if (!st.persistent || !hs.persistent) {
    std::fprintf(stderr, "  worker %d degraded: %s | %s\n", proc, st.note.c_str(), hs.note);
  }
  fa_runtime_destroy(held);
  return 0;
}

void test_damage_under_open_handles(void **) {
  const double seconds = env_int("FA_CORRUPT_SECONDS", 6, 3);
  const std::string dir = temp_dir("damage");
  const std::string path = db_file(dir);
  {
    fa_runtime *rt = fa::test::open_emulator_runtime(dir);  // a populated file to start with
    assert_non_null(rt);
    for (int d : kDamageDims) assert_true(fa::test::launch_small_forward(rt, d, 1));
    fa_runtime_destroy(rt);
  }
  const ino_t ino = inode_of(path);
  assert_true(ino != 0);
  auto *sh = shared_new<DamageShared>();
  std::vector<pid_t> pids;
  for (int p = 0; p < kDamageProcs; ++p) {
    pids.push_back(fork_child([&, p] { return damage_worker(dir, p, sh); }, /*quiet=*/true,
                              static_cast<int>(seconds) + 300));
  }
  while (sh->ready.load() < kDamageProcs) sleep_ms(1);
  std::mt19937_64 rng(4242);
  int done[kDamageKinds] = {0};
  int damages = 0;
  const auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    sleep_ms(80 + static_cast<int>(rng() % 120));
    const Damage kind = static_cast<Damage>(damages % kDamageKinds);
    damage(path, kind, rng);
    ++done[kind];
    ++damages;
    assert_int_equal(inode_of(path), ino);  // never replaced
  }
  sleep_ms(300);  // a last stretch of launches on the damaged file
  sh->stop = 1;
  for (pid_t pid : pids) assert_int_equal(wait_exit(pid), 0);
  std::printf(
      "  damage under open handles: %d processes, %.1f s, %d damages (%s %d, %s %d, %s %d, %s "
      "%d), %llu launches, %llu store hits, resets %llu, discarded %llu, degraded %llu, bad "
      "%llu\n",
      kDamageProcs, seconds_since(t0), damages, kDamageNames[0], done[0], kDamageNames[1], done[1],
      kDamageNames[2], done[2], kDamageNames[3], done[3], (unsigned long long)sh->launches.load(),
      (unsigned long long)sh->store_hits.load(), (unsigned long long)sh->resets.load(),
      (unsigned long long)sh->discarded.load(), (unsigned long long)sh->degraded.load(),
      (unsigned long long)sh->bad.load());
  assert_int_equal(sh->bad.load(), 0);
  assert_int_equal(sh->degraded.load(), 0);
  assert_true(sh->resets.load() > 0);    // the damage was seen and repaired
  assert_true(damages >= kDamageKinds);  // every kind at least once
  assert_int_equal(inode_of(path), ino);

  // A fresh process uses the file: right launches, on disk, a valid header.
  // (The last damage may leave a page that no statement has read yet, so
  // PRAGMA integrity_check is not asserted here: such a page is repaired when
  // it is first read, and never yields a wrong kernel, as the launches show.)
  fa_runtime *rt = fa::test::open_emulator_runtime(dir);
  assert_non_null(rt);
  for (int d : kDamageDims) assert_true(fa::test::launch_small_forward(rt, d, 7));
  const fa_cache_stats s = fa::test::cache_stats_of(rt);
  assert_int_equal(s.persistent, 1);
  fa_runtime_destroy(rt);
  char magic[16] = {0};
  const int fd = open(path.c_str(), O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(read(fd, magic, 16), 16);
  close(fd);
  assert_memory_equal(magic, "SQLite format 3", 16);
  assert_int_equal(inode_of(path), ino);
  shared_delete(sh);
  rm_rf(dir);
}

}  // namespace

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill9_writers),
      cmocka_unit_test(test_kill9_launching),
      cmocka_unit_test(test_damaged_blob_runtime),
      cmocka_unit_test(test_damage_under_open_handles),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
