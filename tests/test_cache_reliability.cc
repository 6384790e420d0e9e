// The kernel cache's reliability promises (docs/reliability.md):
//  1. compile lease: processes x threads starting cold together build each
//     kernel once; a lease left by a dead or expired holder is reclaimed;
//  2. size cap: least recently used rows are evicted inside put() so the
//     database stays within FLASHATTN_CACHE_MAX_BYTES;
//  3. stale kernels are never reused: rows keep their key material, so a
//     forged or colliding row is a miss, and a new generator version or SM
//     is a new key.
// Each test works in its own temporary directory under FA_TEST_BINARY_DIR.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
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
#include "runtime/runtime.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"

using fa::cache::Key;
using fa::cache::LeaseResult;
using fa::cache::Options;
using fa::cache::Record;
using fa::cache::Stats;
using fa::cache::Store;
using fa::test::db_file;
using fa::test::file_size;
using fa::test::fork_child;
using fa::test::RawDb;
using fa::test::rm_rf;
using fa::test::wait_exit;

namespace {

using Clock = std::chrono::steady_clock;
using fa::test::seconds_since;

std::string temp_dir(const char *tag) { return fa::test::temp_dir("cache_rel", tag); }

std::unique_ptr<Store> open_dir(const std::string &dir, int64_t max_bytes = -1,
                                int lease_wait_ms = 0, int lease_ttl_ms = 0) {
  Options o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.lease_wait_ms = lease_wait_ms;
  o.lease_ttl_ms = lease_ttl_ms;
  return fa::cache::open_store(o);
}

std::string key_bytes(const Key &k) {
  uint8_t b[16];
  fa::cache::key_to_bytes(k, b);
  return std::string(reinterpret_cast<const char *>(b), 16);
}

// The 16-byte key of material, as stored.
std::string key_of(const std::string &material) { return key_bytes(fa::key_of_material(material)); }

// A pid that belonged to a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = fork_child([] { return 0; });
  wait_exit(pid);
  return pid;
}

// ---- launches through the public API -----------------------------------------

fa_runtime *open_rt(const std::string &dir, int sm = 0) {
  return fa::test::open_emulator_runtime(dir, sm);
}
bool launch_and_check(fa_runtime *rt, int d, uint32_t seed) {
  return fa::test::launch_small_forward(rt, d, seed);
}
fa_cache_stats stats_of(fa_runtime *rt) { return fa::test::cache_stats_of(rt); }

// Checks the database after a run: integrity, one row per expected key, every
// row's key is the hash of its key material, and no lease left behind.
void check_db(const std::string &dir, int64_t want_rows) {
  RawDb raw(db_file(dir));
  assert_non_null(raw.db);
  assert_string_equal(raw.text("PRAGMA quick_check").c_str(), "ok");
  assert_int_equal(raw.scalar("SELECT count(*) FROM kernels"), want_rows);
  assert_int_equal(raw.scalar("SELECT count(DISTINCT key) FROM kernels"), want_rows);
  assert_int_equal(raw.scalar("SELECT count(*) FROM leases"), 0);
  for (const auto &kv : raw.keys()) {
    assert_true(kv.second.size() > 16);
    assert_true(kv.first == key_of(kv.second));
  }
}

// ---- 1. compile lease --------------------------------------------------------

constexpr int kProcs = 4, kThreads = 2;
constexpr int kSharedDims[] = {32, 64};
constexpr int kOwnDims[kProcs] = {16, 24, 40, 48};  // one distinct key per process

// Shared between the forked processes of one round.
struct LeaseShared {
  std::atomic<int> ready, failures;
  std::atomic<uint64_t> misses, disk_hits, memory_hits, leases, lease_found, lease_timeouts;
};

// One thread of a process: its own runtime (its own connection), every
// shared key and its process's key, in an order that depends on the thread.
void lease_worker(const std::string &dir, int proc, int thread, LeaseShared *sh) {
  fa_runtime *rt = open_rt(dir);
  if (!rt) {
    sh->failures++;
    return;
  }
  std::vector<int> dims = {kSharedDims[0], kSharedDims[1], kOwnDims[proc]};
  std::rotate(dims.begin(), dims.begin() + (proc + thread) % 3, dims.end());
  // Start together: every thread of every process spins until all are ready.
  sh->ready++;
  while (sh->ready.load() < kProcs * kThreads) std::this_thread::yield();
  for (int pass = 0; pass < 2; ++pass) {  // the second pass hits memory
    for (int d : dims) {
      if (!launch_and_check(rt, d, static_cast<uint32_t>(proc * 10 + thread + d))) sh->failures++;
    }
  }
  const fa_cache_stats s = stats_of(rt);
  if (!s.persistent) sh->failures++;
  sh->misses += s.misses;
  sh->disk_hits += s.disk_hits;
  sh->memory_hits += s.memory_hits;
  fa_runtime_destroy(rt);
}

void test_lease_cold_start(void **) {
  const int rounds = std::getenv("FA_LEASE_ROUNDS") ? std::atoi(std::getenv("FA_LEASE_ROUNDS")) : 3;
  const int want_keys = 2 + kProcs;
  auto *sh = static_cast<LeaseShared *>(mmap(nullptr, sizeof(LeaseShared), PROT_READ | PROT_WRITE,
                                             MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  assert_true(sh != MAP_FAILED);
  int total_failures = 0;
  const auto t0 = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    new (sh) LeaseShared();
    const std::string dir = temp_dir("lease");
    assert_false(dir.empty());
    std::vector<pid_t> pids;
    for (int p = 0; p < kProcs; ++p) {
      pids.push_back(fork_child([&, p] {
        std::vector<std::thread> ts;
        for (int t = 0; t < kThreads; ++t) ts.emplace_back(lease_worker, dir, p, t, sh);
        for (auto &t : ts) t.join();
        return 0;
      }));
    }
    for (pid_t pid : pids) assert_int_equal(wait_exit(pid), 0);
    const int runtimes = kProcs * kThreads;
    std::printf(
        "  round %d: %d processes x %d threads, misses %llu disk_hits %llu memory_hits "
        "%llu failures %d\n",
        round, kProcs, kThreads, (unsigned long long)sh->misses.load(),
        (unsigned long long)sh->disk_hits.load(), (unsigned long long)sh->memory_hits.load(),
        sh->failures.load());
    total_failures += sh->failures.load();
    assert_int_equal(sh->failures.load(), 0);
    // Each distinct kernel was generated exactly once across all processes;
    // every other first use found it on disk.
    assert_int_equal(sh->misses.load(), want_keys);
    assert_int_equal(sh->disk_hits.load(), uint64_t(runtimes) * 3 - want_keys);
    assert_int_equal(sh->memory_hits.load(), uint64_t(runtimes) * 3);
    check_db(dir, want_keys);
    rm_rf(dir);
  }
  std::printf("  lease cold start: %d rounds, %.2f s, failures %d\n", rounds, seconds_since(t0),
              total_failures);
  munmap(sh, sizeof(LeaseShared));
}

// Writes a lease row for key (16 bytes) as another process would.
void plant_lease(const std::string &dir, const std::string &key, int64_t pid,
                 const std::string &host, int64_t expires_ms) {
  RawDb raw(db_file(dir));
  assert_int_equal(
      raw.exec_bound("INSERT OR REPLACE INTO leases (key, pid, token, expires_ms, host)"
                     " VALUES (?1, ?2, ?3, ?4, ?5)",
                     key, {pid, 4242, expires_ms}, host),
      1);
}

void test_lease_dead_holder_runtime(void **) {
  const std::string dir = temp_dir("dead");
  // A cold launch writes the row; remember its key, delete the row, and leave
  // a lease held by a process that no longer exists (expiring in 10 minutes).
  assert_int_equal(wait_exit(fork_child([&] {
                     fa_runtime *rt = open_rt(dir);
                     const bool ok = rt && launch_and_check(rt, 32, 1);
                     fa_runtime_destroy(rt);
                     return ok ? 0 : 1;
                   })),
                   0);
  std::string key;
  {
    RawDb raw(db_file(dir));
    const auto keys = raw.keys();
    assert_int_equal(keys.size(), 1);
    key = keys[0].first;
    assert_int_equal(raw.exec_bound("DELETE FROM kernels WHERE key = ?1", key), 1);
  }
  const pid_t gone = dead_pid();
  assert_int_not_equal(kill(gone, 0), 0);
  plant_lease(dir, key, gone, fa::cache::host_identity(), fa::cache::unix_now_ms() + 600000);
  const auto t0 = Clock::now();
  fa_runtime *rt = open_rt(dir);
  assert_non_null(rt);
  assert_true(launch_and_check(rt, 32, 2));
  const double took = seconds_since(t0);
  const fa_cache_stats s = stats_of(rt);
  std::printf("  dead holder pid %d reclaimed: launch took %.3f s, misses %llu\n", int(gone), took,
              (unsigned long long)s.misses);
  assert_true(took < 2.0);  // no waiting for the 10-minute expiry
  assert_int_equal(s.misses, 1);
  fa_runtime_destroy(rt);
  check_db(dir, 1);
  rm_rf(dir);
}

void test_lease_store(void **) {
  const std::string dir = temp_dir("leasestore");
  const Key key{0x1111, 0x2222};
  const std::string material = "material-1";
  Record rec;
  rec.ptx = "// ptx\n";
  rec.spec_text = "spec";
  rec.key_material = material;
  auto a = open_dir(dir, -1, 300);
  auto b = open_dir(dir, -1, 300);
  Record got;
  // a takes it; b (another connection in the same live process) waits the
  // full 300 ms and gives up.
  assert_int_equal(int(a->acquire_lease(key, material, &got)), int(LeaseResult::kAcquired));
  auto t0 = Clock::now();
  assert_int_equal(int(b->acquire_lease(key, material, &got)), int(LeaseResult::kTimedOut));
  double waited = seconds_since(t0);
  assert_true(waited >= 0.29 && waited < 3.0);
  assert_int_equal(b->stats().lease_timeouts, 1);
  // a releases without writing: b takes it at once.
  a->release_lease(key);
  assert_int_equal(int(b->acquire_lease(key, material, &got)), int(LeaseResult::kAcquired));
  // b's put ends its lease in the same transaction: a finds the row.
  b->put(key, rec);
  {
    RawDb raw(db_file(dir));
    assert_int_equal(raw.scalar("SELECT count(*) FROM leases"), 0);
  }
  got = Record();
  assert_int_equal(int(a->acquire_lease(key, material, &got)), int(LeaseResult::kFound));
  assert_string_equal(got.ptx.c_str(), rec.ptx.c_str());
  assert_int_equal(a->stats().lease_found, 1);

  // A waiter wakes up when the holder writes the row.
  const Key key2{0x3333, 0x4444};
  auto c = open_dir(dir, -1, 10000);
  assert_int_equal(int(a->acquire_lease(key2, material, &got)), int(LeaseResult::kAcquired));
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    a->put(key2, rec);
  });
  t0 = Clock::now();
  got = Record();
  assert_int_equal(int(c->acquire_lease(key2, material, &got)), int(LeaseResult::kFound));
  waited = seconds_since(t0);
  writer.join();
  assert_true(waited >= 0.25 && waited < 5.0);
  assert_string_equal(got.ptx.c_str(), rec.ptx.c_str());

  // An expired lease (another host, so no pid check) is reclaimed.
  const Key key3{0x5555, 0x6666};
  plant_lease(dir, key_bytes(key3), 1, "elsewhere/boot", fa::cache::unix_now_ms() + 400);
  t0 = Clock::now();
  assert_int_equal(int(c->acquire_lease(key3, material, &got)), int(LeaseResult::kAcquired));
  waited = seconds_since(t0);
  assert_true(waited >= 0.3 && waited < 5.0);
  assert_int_equal(c->stats().leases_reclaimed, 1);
  c->release_lease(key3);

  // A lease held by a live process on this host is respected until expiry.
  const Key key4{0x7777, 0x8888};
  plant_lease(dir, key_bytes(key4), getppid(), fa::cache::host_identity(),
              fa::cache::unix_now_ms() + 600000);
  assert_int_equal(int(b->acquire_lease(key4, material, &got)), int(LeaseResult::kTimedOut));

  // Memory stores skip leases.
  Options mo;
  mo.memory_only = true;
  assert_int_equal(int(fa::cache::open_store(mo)->acquire_lease(key, material, &got)),
                   int(LeaseResult::kSkipped));
  a.reset();
  b.reset();
  c.reset();
  rm_rf(dir);
}

// ---- 2. size cap ---------------------------------------------------------------

Record random_record(uint64_t seed, size_t min_bytes, size_t max_bytes) {
  std::mt19937_64 rng(seed);
  Record r;
  const size_t n = min_bytes + rng() % (max_bytes - min_bytes + 1);
  r.ptx = "// seed " + std::to_string(seed) + "\n";
  while (r.ptx.size() < n / 2) r.ptx.push_back(static_cast<char>('a' + rng() % 26));
  r.cubin.resize(n - r.ptx.size());
  for (auto &b : r.cubin) b = static_cast<uint8_t>(rng());
  r.spec_text = "random " + std::to_string(seed);
  r.key_material = "material " + std::to_string(seed);
  r.sm = 80;
  return r;
}

Key key_for(uint64_t id) { return fa::key_of_material("material " + std::to_string(id)); }

void test_size_cap_lru(void **) {
  const std::string dir = temp_dir("lru");
  const int64_t cap = 128 * 1024;
  auto store = open_dir(dir, cap);
  assert_int_equal(store->stats().max_bytes, cap);
  // A 6-8 KiB row takes about two 4 KiB pages, so about 13 rows fit next to
  // the schema's pages. 8 rows fit; touch rows 0..3, then write 8 more.
  for (uint64_t id = 0; id < 8; ++id) store->put(key_for(id), random_record(id, 6000, 8000));
  assert_int_equal(store->stats().evicted, 0);
  Record got;
  for (uint64_t id = 0; id < 4; ++id) assert_true(store->get(key_for(id), &got));
  for (uint64_t id = 8; id < 16; ++id) {
    store->put(key_for(id), random_record(id, 6000, 8000));
    const Stats st = store->stats();
    assert_true(st.bytes <= uint64_t(cap));
    assert_true(store->get(key_for(id), &got));  // the newest row is always there
  }
  const Stats st = store->stats();
  std::printf("  cap %lld: entries %llu bytes %llu evicted %llu file %lld\n", (long long)cap,
              (unsigned long long)st.entries, (unsigned long long)st.bytes,
              (unsigned long long)st.evicted, (long long)file_size(db_file(dir)));
  assert_true(st.evicted > 0);
  // The touched rows outlived the untouched ones written after them.
  for (uint64_t id = 0; id < 4; ++id) assert_true(store->get(key_for(id), &got));
  int untouched_left = 0;
  for (uint64_t id = 4; id < 8; ++id) untouched_left += store->get(key_for(id), &got);
  assert_true(untouched_left < 4);
  // Untouched rows went oldest first: once one survives, all later ones do.
  for (uint64_t id = 4; id < 8; ++id) {
    if (store->get(key_for(id), &got)) {
      for (uint64_t later = id + 1; later < 16; ++later) {
        assert_true(store->get(key_for(later), &got));
      }
      break;
    }
  }
  // A row larger than the cap is not kept, and nothing breaks.
  store->put(key_for(99), random_record(99, 200000, 200000));
  assert_false(store->get(key_for(99), &got));
  assert_true(store->stats().bytes <= uint64_t(cap));
  store.reset();
  rm_rf(dir);
}

// Shared between the writer processes of the concurrent cap test.
struct CapShared {
  std::atomic<int> ready, failures, puts;
  std::atomic<uint64_t> evicted;
  std::atomic<int64_t> max_bytes_seen;
};

void test_size_cap_concurrent(void **) {
  const std::string dir = temp_dir("capconc");
  const int64_t cap = 256 * 1024;
  const size_t row_max = 8192;
  const int procs = 4, threads = 2;
  const int per_thread = 2 * cap / (procs * threads * 6000) + 1;  // about twice the cap in all
  auto *sh = static_cast<CapShared *>(
      mmap(nullptr, sizeof(CapShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  assert_true(sh != MAP_FAILED);
  new (sh) CapShared();
  open_dir(dir, cap);  // schema first
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p) {
    pids.push_back(fork_child([&, p] {
      auto work = [&](int t) {
        auto store = open_dir(dir, cap);
        RawDb raw(db_file(dir));
        sh->ready++;
        while (sh->ready.load() < procs * threads) std::this_thread::yield();
        for (int i = 0; i < per_thread; ++i) {
          const uint64_t id = 1000 + p * 100 + t * 50 + i;
          store->put(key_for(id), random_record(id, 4000, row_max));
          const int put_no = ++sh->puts;
          Record got;
          if (!store->get(key_for(id), &got)) {
            // LRU may rightly evict the row if this thread was descheduled
            // while others wrote about a cap's worth (some 40 rows); far
            // fewer puts since ours mean it was lost.
            const int since = sh->puts.load() - put_no;
            std::printf("  row %llu missing after its put, %d puts later: %s\n",
                        (unsigned long long)id, since, store->stats().note.c_str());
            if (since < 16) sh->failures++;
          }
          // Checked by an outside reader after every put, each figure in one
          // statement (one read transaction): page_count and freelist_count
          // read apart could straddle another writer's commit.
          const int64_t blob_bytes =
              raw.scalar("SELECT coalesce(sum(length(ptx) + length(cubin)), 0) FROM kernels");
          const int64_t used = raw.scalar(
              "SELECT (p.page_count - f.freelist_count) * s.page_size FROM pragma_page_count() p, "
              "pragma_freelist_count() f, pragma_page_size() s");
          if (blob_bytes < 0 || blob_bytes > cap || used < 0 || used > cap) {
            std::printf("  over the cap (or unreadable): blob bytes %lld, pages in use %lld B\n",
                        (long long)blob_bytes, (long long)used);
            sh->failures++;
          }
          int64_t seen = sh->max_bytes_seen.load();
          while (blob_bytes > seen && !sh->max_bytes_seen.compare_exchange_weak(seen, blob_bytes)) {
          }
        }
        const Stats st = store->stats();
        if (!st.persistent || st.discarded) {
          std::printf("  store persistent %d, discarded %llu: %s\n", int(st.persistent),
                      (unsigned long long)st.discarded, st.note.c_str());
          sh->failures++;
        }
        sh->evicted += st.evicted;
      };
      std::thread a(work, 0), b(work, 1);
      a.join();
      b.join();
      return 0;
    }));
  }
  for (pid_t pid : pids) assert_int_equal(wait_exit(pid), 0);
  const int64_t size = file_size(db_file(dir));
  const int64_t slack = int64_t(row_max) + 16 * 4096;
  std::printf(
      "  %d processes x %d threads, %d puts of 4-8 KiB (%d KiB) into a %lld KiB cap in "
      "%.2f s: evicted %llu, max blob bytes seen %lld, file %lld (cap + slack %lld), "
      "failures %d\n",
      procs, threads, sh->puts.load(), sh->puts.load() * 6, (long long)cap / 1024,
      seconds_since(t0), (unsigned long long)sh->evicted.load(),
      (long long)sh->max_bytes_seen.load(), (long long)size, (long long)(cap + slack),
      sh->failures.load());
  assert_int_equal(sh->failures.load(), 0);
  assert_true(sh->evicted.load() > 0);
  assert_true(size > 0 && size <= cap + slack);
  RawDb raw(db_file(dir));
  assert_string_equal(raw.text("PRAGMA quick_check").c_str(), "ok");
  munmap(sh, sizeof(CapShared));
  rm_rf(dir);
}

void test_size_cap_env(void **) {
  const std::string dir = temp_dir("capenv");
  const char *old = std::getenv("FLASHATTN_CACHE_MAX_BYTES");
  const std::string saved = old ? old : "";
  unsetenv("FLASHATTN_CACHE_MAX_BYTES");
  assert_int_equal(open_dir(dir)->stats().max_bytes, uint64_t(1) << 30);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "64K", 1);
  assert_int_equal(open_dir(dir)->stats().max_bytes, 65536);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "3m", 1);
  assert_int_equal(open_dir(dir)->stats().max_bytes, 3 << 20);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "12345", 1);
  assert_int_equal(open_dir(dir)->stats().max_bytes, 12345);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "0", 1);  // no cap
  auto unlimited = open_dir(dir);
  assert_int_equal(unlimited->stats().max_bytes, 0);
  for (uint64_t id = 0; id < 4; ++id) unlimited->put(key_for(id), random_record(id, 30000, 30000));
  assert_int_equal(unlimited->stats().evicted, 0);
  assert_int_equal(unlimited->stats().entries, 4);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "lots", 1);  // ignored with a warning
  assert_int_equal(open_dir(dir)->stats().max_bytes, uint64_t(1) << 30);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "-5", 1);
  assert_int_equal(open_dir(dir)->stats().max_bytes, uint64_t(1) << 30);
  setenv("FLASHATTN_CACHE_MAX_BYTES", "100000", 1);  // options win over the variable
  assert_int_equal(open_dir(dir, 777)->stats().max_bytes, 777);
  // Opening with a smaller cap shrinks the table at the next put.
  auto small = open_dir(dir);
  small->put(key_for(9), random_record(9, 1000, 1000));
  const Stats st = small->stats();
  assert_true(st.bytes <= 100000 && st.evicted >= 1);
  if (old) {
    setenv("FLASHATTN_CACHE_MAX_BYTES", saved.c_str(), 1);
  } else {
    unsetenv("FLASHATTN_CACHE_MAX_BYTES");
  }
  unlimited.reset();
  small.reset();
  rm_rf(dir);
}

// ---- 3. stale kernels never reused ----------------------------------------------

void test_key_material_collision_store(void **) {
  const std::string dir = temp_dir("collide");
  Options mo;
  mo.memory_only = true;
  auto disk = open_dir(dir);
  auto mem = fa::cache::open_store(mo);
  for (Store *store : {disk.get(), mem.get()}) {
    const Key key{0xabc, 0xdef};
    Record rec;
    rec.ptx = "// kernel A\n";
    rec.key_material = "A material";
    store->put(key, rec);
    Record got;
    got.ptx = "poison";
    // Same key, other material: a miss, counted, *out untouched.
    assert_false(store->get(key, "B material", &got));
    assert_string_equal(got.ptx.c_str(), "poison");
    Stats st = store->stats();
    assert_int_equal(st.collisions, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.entries, 1);  // the row stays for its owner
    assert_true(store->get(key, "A material", &got));
    assert_string_equal(got.ptx.c_str(), "// kernel A\n");
    assert_string_equal(got.key_material.c_str(), "A material");
    assert_true(store->get(key, &got));  // no material given: no check
    assert_int_equal(store->stats().collisions, 1);
  }
  {
    RawDb raw(db_file(dir));
    assert_int_equal(raw.scalar("PRAGMA user_version"), 3);
    assert_string_equal(raw.text("SELECT key_material FROM kernels").c_str(), "A material");
  }
  disk.reset();
  rm_rf(dir);
}

void test_forged_row_runtime(void **) {
  const std::string dir = temp_dir("forged");
  assert_int_equal(wait_exit(fork_child([&] {
                     fa_runtime *rt = open_rt(dir);
                     const bool ok = rt && launch_and_check(rt, 32, 3);
                     fa_runtime_destroy(rt);
                     return ok ? 0 : 1;
                   })),
                   0);
  std::string key, material;
  {
    RawDb raw(db_file(dir));
    const auto keys = raw.keys();
    assert_int_equal(keys.size(), 1);
    key = keys[0].first;
    material = keys[0].second;
    // Forge: the row keeps its key (and valid blob hashes) but claims other
    // key material, as a colliding kernel's row would.
    std::string other = material;
    other[0] ^= 0x5a;
    sqlite3_stmt *s = nullptr;
    assert_int_equal(
        sqlite3_prepare_v2(raw.db, "UPDATE kernels SET key_material = ?2 WHERE key = ?1", -1, &s,
                           nullptr),
        SQLITE_OK);
    sqlite3_bind_blob(s, 1, key.data(), 16, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 2, other.data(), static_cast<int>(other.size()), SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    assert_int_equal(sqlite3_changes(raw.db), 1);
  }
  fa_runtime *rt = open_rt(dir);
  assert_non_null(rt);
  assert_true(launch_and_check(rt, 32, 4));
  const fa_cache_stats s = stats_of(rt);
  std::printf("  forged row: misses %llu disk_hits %llu note '%s'\n", (unsigned long long)s.misses,
              (unsigned long long)s.disk_hits, s.note);
  assert_int_equal(s.misses, 1);
  assert_int_equal(s.disk_hits, 0);
  assert_non_null(std::strstr(s.note, "collision"));
  fa_runtime_destroy(rt);
  check_db(dir, 1);  // the row was rewritten with the true material
  RawDb raw(db_file(dir));
  assert_true(raw.keys()[0].second == material);
  rm_rf(dir);
}

void test_generator_version_and_sm_change(void **) {
  // A new generator version is new key material, hence a new key.
  fa::KernelSpec spec;
  spec.kind = fa::KernelKind::Forward;
  spec.sm = 80;
  spec.head_dim = spec.head_dim_v = 64;
  spec.block_m = 4;
  spec.block_n = 32;
  spec.num_warps = 4;
  const std::string m1 = fa::kernel_key_material(spec);
  const std::string m2 = fa::kernel_key_material(spec, fa::kGeneratorVersion + 1);
  assert_true(m1 != m2);
  assert_false(fa::key_of_material(m1) == fa::key_of_material(m2));
  assert_true(fa::kernel_key(spec) == fa::key_of_material(m1));
  fa::KernelSpec spec90 = spec;
  spec90.sm = 90;
  assert_false(fa::kernel_key(spec90) == fa::kernel_key(spec));
  // A store holding the old version's row misses for the new version.
  const std::string dir = temp_dir("genver");
  auto store = open_dir(dir);
  Record rec;
  rec.ptx = "// old generator\n";
  rec.key_material = m1;
  store->put(fa::key_of_material(m1), rec);
  Record got;
  assert_false(store->get(fa::key_of_material(m2), m2, &got));
  assert_true(store->get(fa::key_of_material(m1), m1, &got));
  store.reset();

  // Through the API: a runtime for another SM does not reuse sm80's kernel.
  const std::string dir2 = temp_dir("smchange");
  auto run = [&](int sm, uint64_t want_misses, uint64_t want_disk) {
    return wait_exit(fork_child([&] {
      fa_runtime *rt = open_rt(dir2, sm);
      const bool ok = rt && launch_and_check(rt, 32, uint32_t(sm));
      const fa_cache_stats s = stats_of(rt);
      fa_runtime_destroy(rt);
      return ok && s.misses == want_misses && s.disk_hits == want_disk ? 0 : 1;
    }));
  };
  assert_int_equal(run(80, 1, 0), 0);
  assert_int_equal(run(86, 1, 0), 0);  // new SM: new key, generated again
  assert_int_equal(run(80, 0, 1), 0);  // the sm80 row is still served
  check_db(dir2, 2);
  rm_rf(dir);
  rm_rf(dir2);
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_QUIET", "1", 1);  // expected warnings would only clutter the log
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lease_cold_start),
      cmocka_unit_test(test_lease_dead_holder_runtime),
      cmocka_unit_test(test_lease_store),
      cmocka_unit_test(test_size_cap_lru),
      cmocka_unit_test(test_size_cap_concurrent),
      cmocka_unit_test(test_size_cap_env),
      cmocka_unit_test(test_key_material_collision_store),
      cmocka_unit_test(test_forged_row_runtime),
      cmocka_unit_test(test_generator_version_and_sm_change),
  };
  return cmocka_run_group_tests_name("cache_reliability", tests, nullptr, nullptr);
}
