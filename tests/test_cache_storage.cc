// The kernel cache on hostile storage (docs/reliability.md, promises 4 and
// 7b): storage errors never fail a launch.
//  - I/O error sweep: the SQLite I/O operations of a cold-then-warm
//    scenario (two processes, one after the other, on one cache directory)
//    are failed in turn through a test VFS (support/fault_vfs.h): each one
//    once, and every few from then on (sticky), with several error codes
//    (every 7th under FA_TEST_QUICK=1). Every launch still succeeds and
//    is numerically right, nothing crashes or hangs, a store that gave up
//    its file says why, the file left behind passes PRAGMA quick_check, and
//    the directory is usable again once the fault is gone. A denser sweep
//    does the same at the store level (open_store/get/put/leases), where a
//    row read back must be exactly the row written.
//  - Full disk: a byte quota in the test VFS (always), and a real tmpfs in a
//    private mount namespace (skipped where mounting is not permitted): full
//    before the runtime opens, and filling up while it runs.
//  - Missing HOME: no cache directory at all; the cache runs in memory and
//    fa_cache_stats says why.
// Each test works in its own temporary directory under FA_TEST_BINARY_DIR.
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cache/store.h"
#include "flashattn.h"
#include "runtime/runtime.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"
#include "support/fault_vfs.h"
#include "support/numerics.h"

using fa::test::db_file;
using fa::test::FaultVfs;
using fa::test::rm_rf;
using fa::test::wait_exit;

namespace {

// Operation counts of the last scenario, taken before its checks (which
// also go through the VFS).
uint64_t g_counts[FaultVfs::kNumOps];

void snapshot_counts() {
  for (unsigned op = 0; op < FaultVfs::kNumOps; ++op) g_counts[op] = FaultVfs::op_count(1u << op);
}

// The operations of the kinds in ops among counts.
uint64_t count_in(const uint64_t (&counts)[FaultVfs::kNumOps], unsigned ops) {
  uint64_t n = 0;
  for (unsigned op = 0; op < FaultVfs::kNumOps; ++op) n += (ops >> op & 1) ? counts[op] : 0;
  return n;
}

uint64_t counted(unsigned ops) { return count_in(g_counts, ops); }

using Clock = std::chrono::steady_clock;

constexpr int kChildTimeoutS = 120;  // a child still running after this is hung

using fa::test::seconds_since;

bool quick_mode() {
  const char *q = std::getenv("FA_TEST_QUICK");
  return q && std::strcmp(q, "1") == 0;
}

std::string temp_dir(const char *tag) { return fa::test::temp_dir("cache_storage", tag); }

bool exists(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

bool contains(const char *hay, const char *needle) { return std::strstr(hay, needle) != nullptr; }

// PRAGMA quick_check of a database file ("ok" when sound).
std::string quick_check(const std::string &path) {
  sqlite3 *db = nullptr;
  std::string v = "<cannot open>";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(db, 10000);
    sqlite3_stmt *s = nullptr;
    v = "<error>";
    if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
      const unsigned char *t = sqlite3_column_text(s, 0);
      v = t ? reinterpret_cast<const char *>(t) : "";
    } else {
      v = std::string("<error: ") + sqlite3_errmsg(db) + ">";
    }
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return v;
}

// Prints the operation counts of the last scenario.
void print_counts(const char *what, double seconds) {
  std::printf("  %s: %llu operations (", what, (unsigned long long)counted(FaultVfs::kAllOps));
  for (unsigned op = 0; op < FaultVfs::kNumOps; ++op) {
    std::printf("%s%s %llu", op ? ", " : "", FaultVfs::op_name(static_cast<FaultVfs::Op>(op)),
                (unsigned long long)g_counts[op]);
  }
  std::printf("), %.3f s\n", seconds);
}

// ---- forked children -------------------------------------------------------

// What a child saw, in memory shared with the parent.
struct Report {
  int launches, bad_launches;
  int persistent;
  uint64_t disk_hits, misses, entries;
  char note[256];
  char msg[768];  // first problem, "" if none
};

Report *new_report() {
  void *p =
      mmap(nullptr, sizeof(Report), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Report *>(p);
}

void clear_report(Report *r) { std::memset(r, 0, sizeof *r); }

// Records the first problem in r->msg; returns 1 (a child's failure status).
int note_fail(Report *r, const char *fmt, ...) {
  if (!r->msg[0]) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
  }
  return 1;
}

// Runs fn in a forked child (no CMocka asserts there); its exit status is
// fn's result. A child that runs past kChildTimeoutS dies of SIGALRM.
template <typename F>
pid_t fork_child(F fn, bool silence_stdout) {
  return fa::test::fork_child(fn, silence_stdout, kChildTimeoutS);
}

// Describes a child's exit status and report.
std::string child_problem(int rc, const Report *r) {
  if (rc == 0) return "";
  std::string s;
  if (rc == 128 + SIGALRM) {
    s = "hung (killed after " + std::to_string(kChildTimeoutS) + " s)";
  } else if (rc > 128) {
    s = "crashed with signal " + std::to_string(rc - 128);
  } else {
    s = "exit " + std::to_string(rc);
  }
  if (r && r->msg[0]) s += std::string(": ") + r->msg;
  return s;
}

// ---- launches through the public API ----------------------------------------

fa_runtime *open_rt(const char *dir) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.cache_dir = dir;
  fa_runtime *rt = nullptr;
  return fa_runtime_create(&o, &rt) == FA_SUCCESS ? rt : nullptr;
}

// One small causal forward pass through the shared numerics runner: "" when right.
std::string launch_and_check(fa_runtime *rt, int d, uint32_t seed) {
  return fa::test::small_forward_error(rt, d, seed);
}

fa_cache_stats stats_of(fa_runtime *rt) {
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  fa_cache_stats_get(rt, &s);
  return s;
}

void copy_stats(const fa_cache_stats &s, Report *r) {
  r->persistent = s.persistent;
  r->disk_hits = s.disk_hits;
  r->misses = s.misses;
  r->entries = s.entries;
  std::snprintf(r->note, sizeof r->note, "%s", s.note);
}

// A runtime on dir (NULL: the default directory); one checked launch per head
// dim; the stats into *r. A store that is not persistent must say why.
// Returns a child's exit status.
int run_phase(const char *dir, const std::vector<int> &dims, uint32_t seed, Report *r) {
  fa_runtime *rt = open_rt(dir);
  if (!rt) return note_fail(r, "fa_runtime_create: %s", fa_last_error());
  for (int d : dims) {
    r->launches++;
    const std::string err = launch_and_check(rt, d, seed + static_cast<uint32_t>(d));
    if (!err.empty()) {
      r->bad_launches++;
      note_fail(r, "launch d=%d: %s", d, err.c_str());
    }
  }
  const fa_cache_stats s = stats_of(rt);
  copy_stats(s, r);
  fa_runtime_destroy(rt);
  if (!s.persistent && !contains(s.note, "memory only")) {
    return note_fail(r, "memory only but the note does not say why: '%s'", s.note);
  }
  if (s.persistent && (!s.path[0] || (dir && !contains(s.path, dir)))) {
    return note_fail(r, "persistent with path '%s'", s.path);
  }
  return r->bad_launches ? 1 : 0;
}

// ---- 1. I/O error sweep, runtime level --------------------------------------

struct Sweep {
  const char *name;
  unsigned ops;  // operations the fault counts and fails
  int code;      // 0 = each operation's natural error
  bool sticky;
  uint64_t stride = 1, first = 1;  // fail operations first, first + stride, ...
};

// Starts a scenario's counts; fault n of sweep sw (none when n is 0).
void arm_scenario(uint64_t n, const Sweep &sw) {
  FaultVfs::reset_counts();
  if (n) {
    FaultVfs::arm(n, sw.code, sw.sticky, sw.ops);
  } else {
    FaultVfs::disarm();
  }
}

const std::vector<int> kPhase1Dims = {32, 64};      // cold: generated and stored
const std::vector<int> kPhase2Dims = {32, 64, 16};  // two disk hits and one new kernel

struct Tally {
  int scenarios = 0, faulted = 0, fallbacks = 0, failures = 0;
};

// One scenario with the fault armed at operation n (0 = none): a process
// launches cold on a fresh directory, then a second one launches warm. Two
// processes, as in real use: a compile lease left in the file by a failed
// put belongs to a dead process then, and is reclaimed at once (within one
// live process it would hold a later runtime for lease_wait_ms). On a
// failure, prints it and counts it.
void runtime_scenario(uint64_t n, const Sweep &sw, Report *r1, Report *r2, Tally *t) {
  const std::string dir = temp_dir("sweep");
  arm_scenario(n, sw);
  clear_report(r1);
  clear_report(r2);
  const int rc1 =
      wait_exit(fork_child([&] { return run_phase(dir.c_str(), kPhase1Dims, 1, r1); }, true));
  const int rc2 =
      wait_exit(fork_child([&] { return run_phase(dir.c_str(), kPhase2Dims, 7, r2); }, true));
  const bool faulted = FaultVfs::injected() > 0;
  FaultVfs::disarm();
  snapshot_counts();

  std::string problem;
  if (rc1 != 0) problem = "first process " + child_problem(rc1, r1);
  if (problem.empty() && rc2 != 0) problem = "second process " + child_problem(rc2, r2);
  if (problem.empty() && !faulted &&
      !(r1->persistent && r2->persistent && r2->disk_hits == 2 && r2->misses == 1 &&
        r2->entries == 3)) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "no fault, yet persistent %d/%d, disk_hits %llu, misses %llu, entries %llu (%s)",
                  r1->persistent, r2->persistent, (unsigned long long)r2->disk_hits,
                  (unsigned long long)r2->misses, (unsigned long long)r2->entries, r2->note);
    problem = buf;
  }
  if (problem.empty() && exists(db_file(dir))) {
    const std::string qc = quick_check(db_file(dir));
    if (qc != "ok") problem = "quick_check of the file left: " + qc;
  }
  if (problem.empty()) {
    // The fault is gone: the directory must be usable again.
    fa::cache::Options o;
    o.dir = dir;
    const fa::cache::Stats s = fa::cache::open_store(o)->stats();
    if (!s.persistent) problem = "not persistent again after the fault: " + s.note;
  }
  t->scenarios++;
  if (faulted) t->faulted++;
  if (faulted && (!r1->persistent || !r2->persistent)) t->fallbacks++;
  if (!problem.empty()) {
    t->failures++;
    std::printf("  FAIL %s, operation %llu: %s\n", sw.name, (unsigned long long)n, problem.c_str());
  }
  rm_rf(dir);
}

void test_io_error_sweep_runtime(void **) {
  assert_true(FaultVfs::install());
  FaultVfs::set_skip_sync(true);  // fsync costs most of the time otherwise
  Report *r1 = new_report(), *r2 = new_report();
  assert_non_null(r1);
  assert_non_null(r2);
  const auto t0 = Clock::now();

  // The clean scenario: how many operations of each kind it does.
  Tally clean;
  runtime_scenario(0, Sweep{"clean", FaultVfs::kAllOps, 0, false}, r1, r2, &clean);
  assert_int_equal(clean.failures, 0);
  const double one = seconds_since(t0);
  print_counts("clean scenario", one);
  uint64_t counts[FaultVfs::kNumOps];
  std::memcpy(counts, g_counts, sizeof counts);
  auto total = [&](unsigned ops) { return count_in(counts, ops); };
  // The scenario must really go to disk, or the sweep proves nothing.
  assert_true(counts[FaultVfs::kWrite] > 0 && counts[FaultVfs::kSync] > 0 &&
              counts[FaultVfs::kRead] > 0 && counts[FaultVfs::kOpen] > 0);

  const unsigned writes = FaultVfs::bit(FaultVfs::kWrite) | FaultVfs::bit(FaultVfs::kTruncate);
  const unsigned opens = FaultVfs::bit(FaultVfs::kOpen);
  // The two one-shot sweeps together fail every operation once; the others
  // take every few (a sticky fault from operation n fails every later one
  // too, so neighbouring starts mostly repeat each other: every 6th, every
  // 8th write). The store sweep below is denser.
  const Sweep sweeps[] = {
      {"all ops, natural error, once", FaultVfs::kAllOps, 0, false, 2, 1},
      {"all ops, SQLITE_IOERR, once", FaultVfs::kAllOps, SQLITE_IOERR, false, 2, 2},
      {"all ops, natural error, sticky", FaultVfs::kAllOps, 0, true, 6, 1},
      {"writes, SQLITE_FULL, once", writes, SQLITE_FULL, false, 2, 1},
      {"writes, SQLITE_FULL, sticky", writes, SQLITE_FULL, true, 8, 2},
      {"opens, SQLITE_CANTOPEN, once", opens, SQLITE_CANTOPEN, false},
  };
  // Under the sanitizers (FA_TEST_QUICK=1), 7 times sparser.
  const uint64_t sparse = quick_mode() ? 7 : 1;
  Tally all;
  for (const Sweep &sw : sweeps) {
    const auto ts = Clock::now();
    Tally t;
    const uint64_t last = total(sw.ops);
    for (uint64_t n = sw.first; n <= last; n += sw.stride * sparse) {
      runtime_scenario(n, sw, r1, r2, &t);
    }
    // One past the last operation: nothing fails, everything persists.
    runtime_scenario(last + 1, sw, r1, r2, &t);
    std::printf(
        "  %-34s operations %3llu: scenarios %d, faults injected in %d, memory fallbacks "
        "%d, failures %d (%.1f s)\n",
        sw.name, (unsigned long long)last, t.scenarios, t.faulted, t.fallbacks, t.failures,
        seconds_since(ts));
    all.scenarios += t.scenarios;
    all.faulted += t.faulted;
    all.fallbacks += t.fallbacks;
    all.failures += t.failures;
  }
  std::printf(
      "  runtime sweep: %d scenarios, %d with a fault injected, %d fell back to memory, "
      "%d failures, %.1f s\n",
      all.scenarios, all.faulted, all.fallbacks, all.failures, seconds_since(t0));
  assert_true(all.faulted > 0);
  assert_true(all.fallbacks > 0);  // the faults really hit the store
  FaultVfs::set_skip_sync(false);
  assert_int_equal(all.failures, 0);
  munmap(r1, sizeof(Report));
  munmap(r2, sizeof(Report));
}

// ---- 2. I/O error sweep, store level -----------------------------------------

struct Row {
  fa::cache::Key key;
  fa::cache::Record rec;
};

// Four rows with multi-page PTX (overflow pages), distinct contents.
std::vector<Row> make_rows() {
  std::vector<Row> rows;
  for (int i = 0; i < 4; ++i) {
    Row r;
    r.rec.key_material = "storage-test-material-" + std::to_string(i);
    r.key = fa::key_of_material(r.rec.key_material);
    r.rec.spec_text = "test row " + std::to_string(i);
    r.rec.sm = 80;
    r.rec.generator_version = 1;
    for (int j = 0; r.rec.ptx.size() < size_t(3000 + 4000 * i); ++j) {
      r.rec.ptx += "// row " + std::to_string(i) + " line " + std::to_string(j) + "\n";
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// A row read back must be exactly the row written.
bool same(const fa::cache::Record &a, const fa::cache::Record &b) {
  return a.ptx == b.ptx && a.cubin == b.cubin && a.spec_text == b.spec_text && a.sm == b.sm &&
         a.generator_version == b.generator_version && a.key_material == b.key_material;
}

std::unique_ptr<fa::cache::Store> open_dir(const std::string &dir) {
  fa::cache::Options o;
  o.dir = dir;
  // A lease left in the file by a failed put is held by this live process:
  // wait for it only briefly.
  o.lease_wait_ms = 5;
  return fa::cache::open_store(o);
}

// One store-level scenario; "" or the problem.
std::string store_scenario(uint64_t n, const Sweep &sw, const std::vector<Row> &rows, bool *faulted,
                           bool *fell_back) {
  const std::string dir = temp_dir("store");
  arm_scenario(n, sw);
  std::string problem;
  auto check_stats = [&](fa::cache::Store &s, const char *when) {
    const fa::cache::Stats st = s.stats();
    if (!st.persistent) {
      *fell_back = true;
      const std::string want = "kernel cache in memory only: " + db_file(dir) + ": ";
      if (problem.empty() && st.note.compare(0, want.size(), want) != 0) {
        problem = std::string(when) + ": memory only, note '" + st.note + "'";
      }
    }
  };
  auto check_get = [&](fa::cache::Store &s, const Row &r, bool must_hit, const char *when) {
    fa::cache::Record out;
    const bool hit = s.get(r.key, r.rec.key_material, &out);
    if (problem.empty() && hit && !same(out, r.rec)) {
      problem = std::string(when) + ": row " + r.rec.spec_text + " read back different";
    }
    if (problem.empty() && must_hit && !hit) problem = std::string(when) + ": lost a row";
  };
  {
    auto s = open_dir(dir);
    for (int i = 0; i < 3; ++i) {
      fa::cache::Record got;
      const auto lr = s->acquire_lease(rows[i].key, rows[i].rec.key_material, &got);
      if (lr == fa::cache::LeaseResult::kFound && problem.empty() && !same(got, rows[i].rec)) {
        problem = "lease found a different row";
      }
      s->put(rows[i].key, rows[i].rec);
      s->release_lease(rows[i].key);
    }
    for (int i = 0; i < 3; ++i) check_get(*s, rows[i], false, "first store");
    check_stats(*s, "first store");
    s->list();
  }
  {
    auto s = open_dir(dir);
    for (int i = 0; i < 3; ++i) check_get(*s, rows[i], false, "second store");
    s->put(rows[3].key, rows[3].rec);
    check_stats(*s, "second store");
    s->list();
  }
  *faulted = FaultVfs::injected() > 0;
  FaultVfs::disarm();
  snapshot_counts();
  if (problem.empty() && !*faulted) {
    auto s = open_dir(dir);
    for (int i = 0; i < 4; ++i) check_get(*s, rows[i], true, "no fault");
  }
  if (problem.empty() && exists(db_file(dir))) {
    const std::string qc = quick_check(db_file(dir));
    if (qc != "ok") problem = "quick_check of the file left: " + qc;
  }
  if (problem.empty()) {
    auto s = open_dir(dir);
    const fa::cache::Stats st = s->stats();
    if (!st.persistent) problem = "not persistent again after the fault: " + st.note;
    for (const Row &r : rows) check_get(*s, r, false, "after the fault");
  }
  rm_rf(dir);
  return problem;
}

void test_io_error_sweep_store(void **) {
  assert_true(FaultVfs::install());
  FaultVfs::set_skip_sync(true);  // fsync costs most of the time otherwise
  const std::vector<Row> rows = make_rows();
  const auto t0 = Clock::now();
  bool faulted = false, fell_back = false;
  assert_string_equal(
      store_scenario(0, Sweep{"clean", FaultVfs::kAllOps, 0, false}, rows, &faulted, &fell_back)
          .c_str(),
      "");
  assert_false(fell_back);
  print_counts("clean store scenario", seconds_since(t0));
  uint64_t counts[FaultVfs::kNumOps];
  std::memcpy(counts, g_counts, sizeof counts);
  auto total = [&](unsigned ops) { return count_in(counts, ops); };
  const unsigned writes = FaultVfs::bit(FaultVfs::kWrite) | FaultVfs::bit(FaultVfs::kTruncate);
  const unsigned reads = FaultVfs::bit(FaultVfs::kRead);
  const unsigned syncs = FaultVfs::bit(FaultVfs::kSync);
  const Sweep sweeps[] = {
      {"all ops, natural error, once", FaultVfs::kAllOps, 0, false},
      {"all ops, natural error, sticky", FaultVfs::kAllOps, 0, true},
      {"all ops, SQLITE_IOERR, sticky", FaultVfs::kAllOps, SQLITE_IOERR, true},
      {"writes, SQLITE_FULL, once", writes, SQLITE_FULL, false},
      {"writes, SQLITE_IOERR_WRITE, sticky", writes, SQLITE_IOERR_WRITE, true},
      {"reads, SQLITE_IOERR_READ, once", reads, SQLITE_IOERR_READ, false},
      {"syncs, SQLITE_IOERR_FSYNC, once", syncs, SQLITE_IOERR_FSYNC, false},
  };
  const uint64_t stride = quick_mode() ? 3 : 1;
  int scenarios = 0, injected = 0, fallbacks = 0, failures = 0;
  for (const Sweep &sw : sweeps) {
    const uint64_t last = total(sw.ops);
    std::vector<uint64_t> ns;
    for (uint64_t n = 1; n <= last; n += stride) ns.push_back(n);
    ns.push_back(last + 1);  // one past the last operation: no fault
    for (uint64_t n : ns) {
      faulted = fell_back = false;
      const std::string problem = store_scenario(n, sw, rows, &faulted, &fell_back);
      scenarios++;
      injected += faulted;
      fallbacks += fell_back;
      if (!problem.empty()) {
        failures++;
        std::printf("  FAIL store, %s, operation %llu: %s\n", sw.name, (unsigned long long)n,
                    problem.c_str());
      }
    }
  }
  std::printf(
      "  store sweep: %d scenarios, %d with a fault injected, %d fell back to memory, "
      "%d failures, %.1f s\n",
      scenarios, injected, fallbacks, failures, seconds_since(t0));
  FaultVfs::set_skip_sync(false);
  assert_true(injected > 0 && fallbacks > 0);
  assert_int_equal(failures, 0);
}

// A put that fails on a full disk had taken the kernel's compile lease. When
// the store gives up the file, it also stops holding the lease, even when the
// lease row cannot be deleted either (every write fails here): another store
// of this process takes it over at once instead of waiting lease_wait_ms.
// A lease held by a live store is still respected.
void test_failed_put_leaves_no_live_lease(void **) {
  assert_true(FaultVfs::install());
  const std::string dir = temp_dir("lease");
  fa::cache::Options o;
  o.dir = dir;
  o.lease_wait_ms = 3000;
  auto a = fa::cache::open_store(o);
  assert_true(a->stats().persistent);
  const fa::cache::Key k = fa::test::key_for(1), k2 = fa::test::key_for(2);
  fa::cache::Record rec = fa::test::record_for(1), out;
  rec.key_material = "lease test kernel";
  assert_true(a->acquire_lease(k, rec.key_material, &out) == fa::cache::LeaseResult::kAcquired);
  FaultVfs::reset_counts();
  FaultVfs::arm(1, SQLITE_FULL, /*sticky=*/true, FaultVfs::bit(FaultVfs::kWrite));
  a->put(k, rec);
  const uint64_t failed_writes = FaultVfs::injected();
  FaultVfs::disarm();
  assert_true(failed_writes > 0);
  assert_false(a->stats().persistent);
  assert_true(a->get(k, rec.key_material, &out));  // kept in memory
  {
    fa::test::RawDb raw(db_file(dir));
    assert_int_equal(raw.scalar("SELECT count(*) FROM leases"), 1);  // the row is still there
  }
  auto b = fa::cache::open_store(o);
  const auto t0 = Clock::now();
  assert_true(b->acquire_lease(k, rec.key_material, &out) == fa::cache::LeaseResult::kAcquired);
  assert_true(seconds_since(t0) < 1.0);
  assert_int_equal(b->stats().leases_reclaimed, 1);
  b->put(k, rec);
  assert_true(b->get(k, rec.key_material, &out));
  assert_true(fa::test::same_record(out, rec));

  // A live holder in this process: a waiter times out after lease_wait_ms.
  assert_true(b->acquire_lease(k2, "other kernel", &out) == fa::cache::LeaseResult::kAcquired);
  fa::cache::Options o2 = o;
  o2.lease_wait_ms = 200;
  auto c = fa::cache::open_store(o2);
  const auto t1 = Clock::now();
  assert_true(c->acquire_lease(k2, "other kernel", &out) == fa::cache::LeaseResult::kTimedOut);
  assert_true(seconds_since(t1) >= 0.19);
  b->release_lease(k2);
  assert_true(c->acquire_lease(k2, "other kernel", &out) == fa::cache::LeaseResult::kAcquired);
  c->release_lease(k2);
  a.reset();
  b.reset();
  c.reset();
  rm_rf(dir);
}

// ---- 3. full disk --------------------------------------------------------------

const std::vector<int> kFillDims = {16, 32, 48, 64, 80, 96, 112, 128};

// Launches kernels of growing head dims on dir while its space runs out:
// each launch is right; the store is persistent after the first kernel and
// in memory, saying the disk is full, by the end. Then the file left behind
// is sound (or absent), and a second runtime on the full directory still
// launches right. A child's exit status.
int fill_up_while_running(const std::string &dir, Report *r) {
  fa_runtime *rt = open_rt(dir.c_str());
  if (!rt) return note_fail(r, "fa_runtime_create: %s", fa_last_error());
  int rc = 0;
  for (size_t i = 0; i < kFillDims.size() && rc == 0; ++i) {
    const std::string err = launch_and_check(rt, kFillDims[i], 100 + static_cast<uint32_t>(i));
    if (!err.empty()) rc = note_fail(r, "launch d=%d: %s", kFillDims[i], err.c_str());
    const fa_cache_stats s = stats_of(rt);
    if (rc == 0 && i == 0 && !s.persistent) {
      rc = note_fail(r, "not persistent after the first kernel (too little room?): %s", s.note);
    }
  }
  const fa_cache_stats s = stats_of(rt);
  copy_stats(s, r);
  fa_runtime_destroy(rt);
  if (rc) return rc;
  if (s.persistent) return note_fail(r, "still persistent: the disk never filled up");
  if (!contains(s.note, "memory only") || !contains(s.note, "full")) {
    return note_fail(r, "note does not say the disk is full: '%s'", s.note);
  }
  if (exists(db_file(dir))) {
    const std::string qc = quick_check(db_file(dir));
    if (qc != "ok") return note_fail(r, "quick_check of the file left: %s", qc.c_str());
  }
  // A second runtime on the full directory: the first kernel, stored before
  // the disk filled, is still served, and every other kernel is built at
  // once. (The put that hit the full disk had taken a compile lease; the
  // store that gave up the file no longer holds it, so nobody waits out
  // lease_wait_ms, 20 s, for a lease that will never be released.)
  fa_runtime *rt2 = open_rt(dir.c_str());
  if (!rt2) return note_fail(r, "second fa_runtime_create: %s", fa_last_error());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < kFillDims.size() && rc == 0; ++i) {
    const std::string err = launch_and_check(rt2, kFillDims[i], 300 + static_cast<uint32_t>(i));
    if (!err.empty())
      rc = note_fail(r, "second runtime, launch d=%d: %s", kFillDims[i], err.c_str());
  }
  const double t_second = seconds_since(t0);
  const fa_cache_stats s2 = stats_of(rt2);
  fa_runtime_destroy(rt2);
  if (rc == 0 && s2.disk_hits < 1) {
    rc = note_fail(r, "the kernel stored before the disk filled was not served (%s)", s2.note);
  }
  if (rc == 0 && (t_second > 10.0 || s2.lease_timeouts != 0)) {
    rc = note_fail(r, "second runtime took %.1f s (%llu lease timeouts): a stale lease", t_second,
                   (unsigned long long)s2.lease_timeouts);
  }
  return rc;
}

// The size of a cache file holding the schema and the first kernel of
// kFillDims, measured on a fresh directory; -1 on failure.
int64_t one_kernel_db_bytes() {
  const std::string dir = temp_dir("measure");
  Report *r = new_report();
  if (!r) return -1;
  clear_report(r);
  const int rc =
      wait_exit(fork_child([&] { return run_phase(dir.c_str(), {kFillDims[0]}, 1, r); }, true));
  struct stat st;
  const int64_t bytes =
      rc == 0 && stat(db_file(dir).c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  munmap(r, sizeof(Report));
  rm_rf(dir);
  return bytes;
}

// Room for the schema and the first kernel, with 32 KiB of slack for the
// rollback journal of its transaction (a handful of pages), but not for the
// next kernel as well (more PTX than the first, plus its journal), in whole
// 4 KiB pages.
int64_t fill_room() {
  const int64_t one = one_kernel_db_bytes();
  return one < 0 ? -1 : (one + 32 * 1024 + 4095) / 4096 * 4096;
}

// A runtime on a directory that is full from the start: right launches,
// memory only, and the note says the disk is full.
int full_from_start(const std::string &dir, Report *r) {
  const int rc = run_phase(dir.c_str(), {32, 64}, 11, r);
  if (rc) return rc;
  if (r->persistent) return note_fail(r, "persistent on a full disk");
  if (!contains(r->note, "database or disk is full")) {
    return note_fail(r, "note does not say the disk is full: '%s'", r->note);
  }
  return 0;
}

void test_full_disk_quota(void **) {
  assert_true(FaultVfs::install());
  Report *r = new_report();
  assert_non_null(r);
  // (a) Full before the runtime opens: a quota of zero bytes.
  {
    const std::string dir = temp_dir("quota0");
    FaultVfs::set_quota(dir, 0);
    clear_report(r);
    const int rc = wait_exit(fork_child([&] { return full_from_start(dir, r); }, true));
    FaultVfs::set_quota(dir, -1);
    if (rc) std::printf("  quota 0: %s\n", child_problem(rc, r).c_str());
    assert_int_equal(rc, 0);
    std::printf("  quota 0 B: note '%s'\n", r->note);
    rm_rf(dir);
  }
  // (b) Room for the schema and one kernel, then full.
  {
    const int64_t room = fill_room();
    assert_true(room > 0);
    const std::string dir = temp_dir("quota");
    FaultVfs::set_quota(dir, room);
    clear_report(r);
    const int rc = wait_exit(fork_child([&] { return fill_up_while_running(dir, r); }, true));
    FaultVfs::set_quota(dir, -1);
    if (rc) std::printf("  quota %lld B: %s\n", (long long)room, child_problem(rc, r).c_str());
    assert_int_equal(rc, 0);
    std::printf("  quota %lld B: note '%s'\n", (long long)room, r->note);
    rm_rf(dir);
  }
  munmap(r, sizeof(Report));
}

using fa::test::fill_fs;
using fa::test::kNoMount;

// In a forked child: a private tmpfs of `size` on mnt, then fn(). kNoMount
// when mounting is not permitted.
template <typename F>
int with_tmpfs(const std::string &mnt, const char *size, Report *r, F fn) {
  std::string why;
  const int m = fa::test::mount_private_tmpfs(mnt, size, &why);
  if (m == kNoMount) return kNoMount;
  if (m != 0) return note_fail(r, "%s", why.c_str());
  const int rc = fn();
  umount2(mnt.c_str(), MNT_DETACH);
  return rc;
}

void test_full_disk_tmpfs(void **) {
  Report *r = new_report();
  assert_non_null(r);
  // (a) Full before the runtime opens.
  const std::string mnt_a = temp_dir("tmpfs-full");
  clear_report(r);
  int rc = wait_exit(fork_child(
      [&] {
        return with_tmpfs(mnt_a, "256k", r, [&] {
          mkdir((mnt_a + "/cache").c_str(), 0700);
          if (!fill_fs(mnt_a, 0)) return note_fail(r, "cannot fill the tmpfs");
          return full_from_start(mnt_a + "/cache", r);
        });
      },
      true));
  rm_rf(mnt_a);
  if (rc == kNoMount) {
    munmap(r, sizeof(Report));
    std::printf(
        "  SKIP: mounting a tmpfs is not permitted here (needs root or CAP_SYS_ADMIN); "
        "the simulated full disk (test_full_disk_quota) still ran\n");
    skip();
  }
  if (rc) std::printf("  tmpfs full from the start: %s\n", child_problem(rc, r).c_str());
  assert_int_equal(rc, 0);
  std::printf("  tmpfs full from the start: note '%s'\n", r->note);

  // (b) Fills up while the runtime runs: room for one kernel beside the filler.
  const int64_t room = fill_room();
  assert_true(room > 0);
  const std::string mnt_b = temp_dir("tmpfs-fill");
  clear_report(r);
  rc = wait_exit(fork_child(
      [&] {
        return with_tmpfs(mnt_b, "1m", r, [&] {
          if (!fill_fs(mnt_b, room)) return note_fail(r, "cannot fill the tmpfs");
          return fill_up_while_running(mnt_b, r);
        });
      },
      true));
  rm_rf(mnt_b);
  if (rc) std::printf("  tmpfs filling up: %s\n", child_problem(rc, r).c_str());
  assert_int_equal(rc, 0);
  std::printf("  tmpfs filling up (%lld B free): note '%s'\n", (long long)room, r->note);
  munmap(r, sizeof(Report));
}

// ---- 4. missing HOME ---------------------------------------------------------------

void test_missing_home(void **) {
  Report *r = new_report();
  assert_non_null(r);
  const int rc = wait_exit(fork_child(
      [&] {
        unsetenv("HOME");
        unsetenv("XDG_CACHE_HOME");
        unsetenv("FLASHATTN_CACHE_DIR");
        unsetenv("FLASHATTN_CACHE_DISABLE");
        const int st = run_phase(nullptr, {32, 64}, 21, r);
        if (st) return st;
        if (r->persistent) return note_fail(r, "persistent without a cache directory");
        if (!contains(r->note, "no cache directory")) {
          return note_fail(r, "note does not say why: '%s'", r->note);
        }
        return 0;
      },
      true));
  if (rc) std::printf("  %s\n", child_problem(rc, r).c_str());
  assert_int_equal(rc, 0);
  assert_int_equal(r->launches, 2);
  std::printf("  no HOME: note '%s'\n", r->note);
  munmap(r, sizeof(Report));
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_QUIET", "1", 1);  // expected warnings would only clutter the log
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_home),
      cmocka_unit_test(test_full_disk_quota),
      cmocka_unit_test(test_full_disk_tmpfs),
      cmocka_unit_test(test_io_error_sweep_store),
      cmocka_unit_test(test_io_error_sweep_runtime),
      cmocka_unit_test(test_failed_put_leaves_no_live_lease),
  };
  return cmocka_run_group_tests_name("cache_storage", tests, nullptr, nullptr);
}
