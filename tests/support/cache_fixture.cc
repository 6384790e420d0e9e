#include "support/cache_fixture.h"

#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "support/numerics.h"

namespace fa::test {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

cache::Key key_for(uint64_t id) { return cache::Key{mix(id * 2 + 1), mix(id * 2 + 2)}; }

cache::Record record_for(uint64_t seed, bool empty_cubin, size_t extra_bytes) {
  std::mt19937_64 rng(mix(seed));
  cache::Record r;
  r.ptx = "// seed " + std::to_string(seed) + "\n.version 8.0\n.target sm_80\n";
  const size_t n_text = 800 + rng() % 4000 + extra_bytes;
  for (size_t i = 0; i < n_text; ++i) {
    const uint64_t v = rng() % 64;
    r.ptx.push_back(v == 0 ? '\n' : static_cast<char>(' ' + rng() % 95));
  }
  if (!empty_cubin) {
    r.cubin.resize(500 + rng() % 3000);
    for (auto &b : r.cubin) b = static_cast<uint8_t>(rng());
  }
  r.driver_version = empty_cubin ? 0 : 12000 + static_cast<int>(seed % 1000);
  if (!empty_cubin) r.compiler = "compiler " + std::to_string(seed % 7);
  r.spec_text =
      "spec seed=" + std::to_string(seed) + " head_dim=" + std::to_string(64 + seed % 3 * 32);
  r.generator_version = static_cast<uint32_t>(seed * 7 + 3);
  r.sm = 70 + static_cast<int>(seed % 30);
  return r;
}

uint64_t seed_of(const cache::Record &r) {
  unsigned long long s = 0;
  if (std::sscanf(r.ptx.c_str(), "// seed %llu", &s) != 1) return UINT64_MAX;
  return s;
}

bool same_record(const cache::Record &a, const cache::Record &b) {
  return a.ptx == b.ptx && a.cubin == b.cubin && a.driver_version == b.driver_version &&
         a.compiler == b.compiler &&
         a.spec_text == b.spec_text && a.generator_version == b.generator_version && a.sm == b.sm;
}

std::string temp_dir(const char *group, const char *tag) {
  const std::string base = std::string(FA_TEST_BINARY_DIR) + "/" + group;
  mkdir(base.c_str(), 0755);
  std::string templ = base + "/" + tag + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) return "";
  return buf.data();
}

namespace {
int rm_entry(const char *path, const struct stat *, int, struct FTW *) { return remove(path); }
}  // namespace

void rm_rf(const std::string &dir) { nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int64_t file_size(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

ino_t inode_of(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

void child_setup(bool quiet, int alarm_s) {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) signal(sig, SIG_DFL);
  if (alarm_s > 0) alarm(static_cast<unsigned>(alarm_s));
  if (quiet) {
    const int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      close(fd);
    }
  }
}

int wait_exit(pid_t pid) {
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

RawDb::RawDb(const std::string &path) {
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    db = nullptr;
  }
  if (db) sqlite3_busy_timeout(db, 10000);
}

RawDb::~RawDb() { sqlite3_close(db); }

int64_t RawDb::scalar(const char *sql) {
  sqlite3_stmt *s = nullptr;
  int64_t v = -1;
  if (db && sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    v = sqlite3_column_int64(s, 0);
  }
  sqlite3_finalize(s);
  return v;
}

std::string RawDb::text(const char *sql) {
  sqlite3_stmt *s = nullptr;
  std::string v = "<error>";
  if (db && sqlite3_prepare_v2(db, sql, -1, &s, nullptr) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW) {
    const unsigned char *t = sqlite3_column_text(s, 0);
    v = t ? reinterpret_cast<const char *>(t) : "";
  }
  sqlite3_finalize(s);
  return v;
}

int RawDb::exec_bound(const char *sql, const std::string &blob, std::vector<int64_t> ints,
                      const std::string &text) {
  sqlite3_stmt *s = nullptr;
  if (!db || sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) return -1;
  sqlite3_bind_blob(s, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  int i = 2;
  for (int64_t v : ints) sqlite3_bind_int64(s, i++, v);
  if (!text.empty()) sqlite3_bind_text(s, i, text.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(s);
  sqlite3_finalize(s);
  return rc == SQLITE_DONE ? sqlite3_changes(db) : -1;
}

std::vector<std::pair<std::string, std::string>> RawDb::keys() {
  std::vector<std::pair<std::string, std::string>> out;
  sqlite3_stmt *s = nullptr;
  if (!db || sqlite3_prepare_v2(db, "SELECT key, key_material FROM kernels", -1, &s, nullptr) !=
                 SQLITE_OK) {
    return out;
  }
  while (sqlite3_step(s) == SQLITE_ROW) {
    auto col = [&](int i) {
      const char *p = static_cast<const char *>(sqlite3_column_blob(s, i));
      return std::string(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(s, i)));
    };
    out.emplace_back(col(0), col(1));
  }
  sqlite3_finalize(s);
  return out;
}

int mount_private_tmpfs(const std::string &mnt, const char *size, std::string *why) {
  if (unshare(CLONE_NEWNS) != 0) {
    if (errno == EPERM || errno == EINVAL || errno == ENOSYS) return kNoMount;
    *why = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    return -1;
  }
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    if (errno == EPERM || errno == EACCES) return kNoMount;
    *why = std::string("making / private: ") + std::strerror(errno);
    return -1;
  }
  // Mode 0700: a tmpfs root is 1777 by default, which the cache refuses.
  const std::string opts = std::string("size=") + size + ",mode=0700";
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    if (errno == EPERM || errno == EACCES) return kNoMount;
    *why = "mount tmpfs on " + mnt + ": " + std::strerror(errno);
    return -1;
  }
  return 0;
}

bool fill_fs(const std::string &dir, off_t leave) {
  const std::string path = dir + "/filler";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  std::vector<char> chunk(4096, 'x');
  off_t size = 0;
  for (;;) {
    const ssize_t w = write(fd, chunk.data(), chunk.size());
    if (w > 0) {
      size += w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    break;
  }
  const bool full = errno == ENOSPC;
  const bool ok = full && (leave == 0 || ftruncate(fd, size > leave ? size - leave : 0) == 0);
  close(fd);
  return ok;
}

fa_runtime *open_emulator_runtime(const std::string &dir, int sm) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.emulator_sm = sm;
  o.cache_dir = dir.c_str();
  fa_runtime *rt = nullptr;
  if (fa_runtime_create(&o, &rt) != FA_SUCCESS) {
    std::fprintf(stderr, "fa_runtime_create: %s\n", fa_last_error());
    return nullptr;
  }
  return rt;
}

std::string small_forward_error(fa_runtime *rt, int d, uint32_t seed) {
  ForwardCase c;
  c.seqlen_q = 7;
  c.seqlen_k = 11;
  c.heads_q = c.heads_kv = 2;
  c.head_dim = d;
  c.causal = true;
  c.seed = seed;
  return run_forward(rt, c);
}

bool launch_small_forward(fa_runtime *rt, int d, uint32_t seed) {
  const std::string err = small_forward_error(rt, d, seed);
  if (!err.empty()) std::fprintf(stderr, "d=%d: %s", d, err.c_str());
  return err.empty();
}

fa_cache_stats cache_stats_of(fa_runtime *rt) {
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  fa_cache_stats_get(rt, &s);
  return s;
}

}  // namespace fa::test
