// Helpers shared by the kernel-cache tests: scratch directories, records
// whose every byte derives from a seed, forked children, and raw SQL access
// to a store's database file as another program would have it.
#pragma once

#include <sqlite3.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cache/store.h"
#include "flashattn.h"

namespace fa::test {

// Seconds since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// splitmix64 finalizer.
uint64_t mix(uint64_t x);

// A key derived from id; different ids give different keys.
cache::Key key_for(uint64_t id);

// A record whose every field derives from seed: PTX-like text whose first
// line names the seed (about 0.8-4.8 KB, or about extra_bytes more), random
// cubin bytes (none when empty_cubin).
cache::Record record_for(uint64_t seed, bool empty_cubin = false, size_t extra_bytes = 0);

// The seed in a record's first PTX line, or UINT64_MAX.
uint64_t seed_of(const cache::Record &r);

bool same_record(const cache::Record &a, const cache::Record &b);

// A fresh directory FA_TEST_BINARY_DIR/<group>/<tag>-XXXXXX; "" on failure.
std::string temp_dir(const char *group, const char *tag);
void rm_rf(const std::string &dir);
inline std::string db_file(const std::string &dir) { return dir + "/kernels.sqlite3"; }
// -1 / 0 when the file does not exist.
int64_t file_size(const std::string &path);
ino_t inode_of(const std::string &path);

// In a forked child: CMocka's signal handlers back to the defaults (they
// would carry on with the test run in the child), stdout to /dev/null when
// quiet, and SIGALRM after alarm_s seconds (0 = none), so a hung child dies.
void child_setup(bool quiet, int alarm_s);

// Runs fn() in a forked child whose exit status is fn's return value; a
// crash shows as 128 + signal in wait_exit().
template <typename F>
pid_t fork_child(F fn, bool quiet = false, int alarm_s = 0) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    child_setup(quiet, alarm_s);
    const int rc = fn();
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// Waits for pid: its exit status, 128 + signal when killed, -1 on error.
int wait_exit(pid_t pid);

// Raw access to a database file, as another program would do it. Failures
// give -1 / "<error>" / empty results rather than asserting, so it can be
// used in children.
struct RawDb {
  sqlite3 *db = nullptr;
  explicit RawDb(const std::string &path);
  ~RawDb();
  RawDb(const RawDb &) = delete;
  RawDb &operator=(const RawDb &) = delete;
  int64_t scalar(const char *sql);
  std::string text(const char *sql);
  // Runs sql with blob bound to ?1, then ints to ?2..., then text; the
  // number of rows changed, or -1.
  int exec_bound(const char *sql, const std::string &blob, std::vector<int64_t> ints = {},
                 const std::string &text = "");
  // All (key, key_material) pairs of the kernels table.
  std::vector<std::pair<std::string, std::string>> keys();
};

// ---- a full file system ---------------------------------------------------------

// Child status (and mount_private_tmpfs result) when mounting is not
// permitted here (not root, no CAP_SYS_ADMIN, no mount namespaces).
constexpr int kNoMount = 77;

// For a forked child: a private mount namespace, then a tmpfs of `size`
// (e.g. "256k"), mode 0700, on mnt; it vanishes with the child. 0, kNoMount,
// or -1 with *why set.
int mount_private_tmpfs(const std::string &mnt, const char *size, std::string *why);

// Fills the file system holding dir with dir/filler until ENOSPC, then gives
// back `leave` bytes. False on an unexpected error.
bool fill_fs(const std::string &dir, off_t leave);

// ---- launches through the public API ----------------------------------------

// An emulator runtime (sm_80 unless sm) whose kernel cache is in dir; null
// (after printing why) on failure.
fa_runtime *open_emulator_runtime(const std::string &dir, int sm = 0);

// One small causal forward pass (seqlen_q 7, seqlen_k 11, 2 heads) with
// head_dim d through the shared numerics runner: poisoned output, fp64
// reference, the suite's tolerance. "" when right, else what was wrong.
std::string small_forward_error(fa_runtime *rt, int d, uint32_t seed);
// The same; true when right, else prints what was wrong on stderr.
bool launch_small_forward(fa_runtime *rt, int d, uint32_t seed);

// fa_cache_stats_get into a zero-initialised struct.
fa_cache_stats cache_stats_of(fa_runtime *rt);

}  // namespace fa::test
