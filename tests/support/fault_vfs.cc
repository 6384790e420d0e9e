// The fault-injecting SQLite VFS of fault_vfs.h: a thin wrapper over the
// default VFS whose file handles carry the real handle right behind them.
#include "support/fault_vfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace fa::test {
namespace {

using Op = FaultVfs::Op;

// Counters and the armed fault; in a shared mapping (see the header).
struct Shared {
  std::atomic<uint64_t> counts[FaultVfs::kNumOps];
  std::atomic<uint64_t> injected;
  std::atomic<uint64_t> matched;  // operations in `mask` since arm()
  std::atomic<uint64_t> n;        // 0 = disarmed
  std::atomic<int> code;
  std::atomic<bool> sticky;
  std::atomic<unsigned> mask;
  std::atomic<bool> skip_sync;
};

Shared *g_shared = nullptr;
Shared g_local;  // used when the shared mapping cannot be made
sqlite3_vfs *g_real = nullptr;
sqlite3_vfs g_vfs;
bool g_registered = false;
std::mutex g_quota_mu;
std::map<std::string, int64_t> *g_quotas = new std::map<std::string, int64_t>;  // never freed

int natural_code(Op op) {
  switch (op) {
    case FaultVfs::kOpen:
      return SQLITE_CANTOPEN;
    case FaultVfs::kDelete:
      return SQLITE_IOERR_DELETE;
    case FaultVfs::kAccess:
      return SQLITE_IOERR_ACCESS;
    case FaultVfs::kRead:
      return SQLITE_IOERR_READ;
    case FaultVfs::kWrite:
      return SQLITE_IOERR_WRITE;
    case FaultVfs::kTruncate:
      return SQLITE_IOERR_TRUNCATE;
    case FaultVfs::kSync:
      return SQLITE_IOERR_FSYNC;
    case FaultVfs::kFileSize:
      return SQLITE_IOERR_FSTAT;
    case FaultVfs::kLock:
      return SQLITE_IOERR_LOCK;
    case FaultVfs::kUnlock:
      return SQLITE_IOERR_UNLOCK;
    case FaultVfs::kCheckReservedLock:
      return SQLITE_IOERR_CHECKRESERVEDLOCK;
    default:
      return SQLITE_IOERR;
  }
}

// Counts one operation; returns the error to fail it with, or SQLITE_OK.
int check(Op op) {
  Shared *s = g_shared;
  s->counts[op].fetch_add(1);
  const uint64_t n = s->n.load();
  if (n == 0 || !(s->mask.load() & FaultVfs::bit(op))) return SQLITE_OK;
  const uint64_t m = s->matched.fetch_add(1) + 1;
  if (m != n && !(s->sticky.load() && m > n)) return SQLITE_OK;
  s->injected.fetch_add(1);
  const int code = s->code.load();
  return code ? code : natural_code(op);
}

// The directory part of a path ("" when there is none).
std::string dir_of(const char *path) {
  if (!path) return "";
  const char *slash = std::strrchr(path, '/');
  return slash ? std::string(path, static_cast<size_t>(slash - path)) : std::string();
}

// Sum of st_size over the regular files directly in dir.
int64_t dir_usage(const std::string &dir) {
  int64_t total = 0;
  DIR *d = opendir(dir.c_str());
  if (!d) return 0;
  while (const dirent *e = readdir(d)) {
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<int64_t>(st.st_size);
    }
  }
  closedir(d);
  return total;
}

struct FaultFile {
  sqlite3_file base;
  sqlite3_file *real;  // the wrapped VFS's handle, right after this struct
  char dir[1024];      // directory of the file, for the quota; "" for temp files
};
constexpr size_t kRealOffset = (sizeof(FaultFile) + 15) & ~size_t(15);

sqlite3_file *real_of(sqlite3_file *f) { return reinterpret_cast<FaultFile *>(f)->real; }

// SQLITE_FULL when growing the file to new_end would put its directory over
// its quota; SQLITE_OK otherwise (or without a quota).
int quota_check(sqlite3_file *f, sqlite3_int64 new_end) {
  const FaultFile *ff = reinterpret_cast<FaultFile *>(f);
  if (!ff->dir[0]) return SQLITE_OK;
  int64_t quota = -1;
  {
    std::lock_guard<std::mutex> lock(g_quota_mu);
    auto it = g_quotas->find(ff->dir);
    if (it != g_quotas->end()) quota = it->second;
  }
  if (quota < 0) return SQLITE_OK;
  sqlite3_int64 size = 0;
  if (ff->real->pMethods->xFileSize(ff->real, &size) != SQLITE_OK) return SQLITE_OK;
  const int64_t growth = new_end > size ? new_end - size : 0;
  if (growth == 0 || dir_usage(ff->dir) + growth <= quota) return SQLITE_OK;
  g_shared->injected.fetch_add(1);
  return SQLITE_FULL;
}

// ---- file methods ---------------------------------------------------------

int f_close(sqlite3_file *f) {
  sqlite3_file *r = real_of(f);
  const int rc = r->pMethods ? r->pMethods->xClose(r) : SQLITE_OK;
  f->pMethods = nullptr;
  return rc;
}

int f_read(sqlite3_file *f, void *buf, int amt, sqlite3_int64 off) {
  if (int rc = check(FaultVfs::kRead)) {
    std::memset(buf, 0, static_cast<size_t>(amt));
    return rc;
  }
  sqlite3_file *r = real_of(f);
  return r->pMethods->xRead(r, buf, amt, off);
}

int f_write(sqlite3_file *f, const void *buf, int amt, sqlite3_int64 off) {
  if (int rc = check(FaultVfs::kWrite)) return rc;
  if (int rc = quota_check(f, off + amt)) return rc;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xWrite(r, buf, amt, off);
}

int f_truncate(sqlite3_file *f, sqlite3_int64 size) {
  if (int rc = check(FaultVfs::kTruncate)) return rc;
  if (int rc = quota_check(f, size)) return rc;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xTruncate(r, size);
}

int f_sync(sqlite3_file *f, int flags) {
  if (int rc = check(FaultVfs::kSync)) return rc;
  if (g_shared->skip_sync.load()) return SQLITE_OK;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xSync(r, flags);
}

int f_file_size(sqlite3_file *f, sqlite3_int64 *size) {
  if (int rc = check(FaultVfs::kFileSize)) return rc;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xFileSize(r, size);
}

int f_lock(sqlite3_file *f, int level) {
  if (int rc = check(FaultVfs::kLock)) return rc;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xLock(r, level);
}

int f_unlock(sqlite3_file *f, int level) {
  if (int rc = check(FaultVfs::kUnlock)) return rc;
  sqlite3_file *r = real_of(f);
  return r->pMethods->xUnlock(r, level);
}

int f_check_reserved(sqlite3_file *f, int *out) {
  if (int rc = check(FaultVfs::kCheckReservedLock)) {
    *out = 0;
    return rc;
  }
  sqlite3_file *r = real_of(f);
  return r->pMethods->xCheckReservedLock(r, out);
}

int f_file_control(sqlite3_file *f, int op, void *arg) {
  sqlite3_file *r = real_of(f);
  return r->pMethods->xFileControl(r, op, arg);
}

int f_sector_size(sqlite3_file *f) {
  sqlite3_file *r = real_of(f);
  return r->pMethods->xSectorSize(r);
}

int f_device_characteristics(sqlite3_file *f) {
  sqlite3_file *r = real_of(f);
  return r->pMethods->xDeviceCharacteristics(r);
}

const sqlite3_io_methods g_io = {
    1,  // iVersion: no shm, no mmap
    f_close, f_read,   f_write,          f_truncate,     f_sync,        f_file_size,
    f_lock,  f_unlock, f_check_reserved, f_file_control, f_sector_size, f_device_characteristics,
    nullptr, nullptr,  nullptr,          nullptr,        nullptr,       nullptr,
};

// ---- VFS methods ----------------------------------------------------------

int v_open(sqlite3_vfs *, const char *name, sqlite3_file *f, int flags, int *out_flags) {
  auto *ff = reinterpret_cast<FaultFile *>(f);
  f->pMethods = nullptr;  // on failure SQLite must not call xClose
  ff->real = reinterpret_cast<sqlite3_file *>(reinterpret_cast<char *>(f) + kRealOffset);
  ff->real->pMethods = nullptr;
  ff->dir[0] = 0;
  if (int rc = check(FaultVfs::kOpen)) return rc;
  const int rc = g_real->xOpen(g_real, name, ff->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    if (ff->real->pMethods) ff->real->pMethods->xClose(ff->real);
    return rc;
  }
  const std::string dir = dir_of(name);
  if (dir.size() < sizeof ff->dir) std::memcpy(ff->dir, dir.c_str(), dir.size() + 1);
  f->pMethods = &g_io;
  return SQLITE_OK;
}

int v_delete(sqlite3_vfs *, const char *name, int sync_dir) {
  if (int rc = check(FaultVfs::kDelete)) return rc;
  return g_real->xDelete(g_real, name, sync_dir);
}

int v_access(sqlite3_vfs *, const char *name, int flags, int *out) {
  if (int rc = check(FaultVfs::kAccess)) {
    *out = 0;
    return rc;
  }
  return g_real->xAccess(g_real, name, flags, out);
}

int v_full_pathname(sqlite3_vfs *, const char *name, int n, char *out) {
  return g_real->xFullPathname(g_real, name, n, out);
}
void *v_dl_open(sqlite3_vfs *, const char *name) { return g_real->xDlOpen(g_real, name); }
void v_dl_error(sqlite3_vfs *, int n, char *msg) { g_real->xDlError(g_real, n, msg); }
void (*v_dl_sym(sqlite3_vfs *, void *h, const char *sym))(void) {
  return g_real->xDlSym(g_real, h, sym);
}
void v_dl_close(sqlite3_vfs *, void *h) { g_real->xDlClose(g_real, h); }
int v_randomness(sqlite3_vfs *, int n, char *out) { return g_real->xRandomness(g_real, n, out); }
int v_sleep(sqlite3_vfs *, int us) { return g_real->xSleep(g_real, us); }
int v_current_time(sqlite3_vfs *, double *t) { return g_real->xCurrentTime(g_real, t); }
int v_get_last_error(sqlite3_vfs *, int n, char *msg) {
  return g_real->xGetLastError ? g_real->xGetLastError(g_real, n, msg) : 0;
}
int v_current_time_int64(sqlite3_vfs *, sqlite3_int64 *t) {
  if (g_real->iVersion >= 2 && g_real->xCurrentTimeInt64) {
    return g_real->xCurrentTimeInt64(g_real, t);
  }
  double d = 0;
  const int rc = g_real->xCurrentTime(g_real, &d);
  *t = static_cast<sqlite3_int64>(d * 86400000.0);
  return rc;
}

}  // namespace

bool FaultVfs::install() {
  if (!g_shared) {
    void *p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_shared = new (p == MAP_FAILED ? static_cast<void *>(&g_local) : p) Shared();
  }
  if (!g_real) {
    sqlite3_vfs *dflt = sqlite3_vfs_find(nullptr);
    if (!dflt) return false;
    g_real = dflt;
    std::memset(&g_vfs, 0, sizeof g_vfs);
    g_vfs.iVersion = 2;
    g_vfs.szOsFile = static_cast<int>(kRealOffset) + g_real->szOsFile;
    g_vfs.mxPathname = g_real->mxPathname;
    g_vfs.zName = "fa_fault";
    g_vfs.xOpen = v_open;
    g_vfs.xDelete = v_delete;
    g_vfs.xAccess = v_access;
    g_vfs.xFullPathname = v_full_pathname;
    g_vfs.xDlOpen = v_dl_open;
    g_vfs.xDlError = v_dl_error;
    g_vfs.xDlSym = v_dl_sym;
    g_vfs.xDlClose = v_dl_close;
    g_vfs.xRandomness = v_randomness;
    g_vfs.xSleep = v_sleep;
    g_vfs.xCurrentTime = v_current_time;
    g_vfs.xGetLastError = v_get_last_error;
    g_vfs.xCurrentTimeInt64 = v_current_time_int64;
  }
  if (sqlite3_vfs_register(&g_vfs, 1) != SQLITE_OK) return false;
  g_registered = true;
  return sqlite3_vfs_find(nullptr) == &g_vfs;
}

void FaultVfs::uninstall() {
  if (g_registered && g_real) sqlite3_vfs_register(g_real, 1);
}

void FaultVfs::arm(uint64_t n, int code, bool sticky, unsigned ops) {
  if (!g_shared) return;
  g_shared->n.store(0);
  g_shared->matched.store(0);
  g_shared->code.store(code);
  g_shared->sticky.store(sticky);
  g_shared->mask.store(ops);
  g_shared->n.store(n);
}

void FaultVfs::disarm() {
  if (g_shared) g_shared->n.store(0);
}

uint64_t FaultVfs::op_count(unsigned ops) {
  if (!g_shared) return 0;
  uint64_t total = 0;
  for (unsigned i = 0; i < kNumOps; ++i) {
    if (ops & (1u << i)) total += g_shared->counts[i].load();
  }
  return total;
}

void FaultVfs::reset_counts() {
  if (!g_shared) return;
  for (auto &c : g_shared->counts) c.store(0);
  g_shared->injected.store(0);
}

uint64_t FaultVfs::injected() { return g_shared ? g_shared->injected.load() : 0; }

void FaultVfs::set_quota(const std::string &dir, int64_t bytes) {
  // SQLite hands the VFS canonical paths (symbolic links resolved).
  char buf[PATH_MAX];
  const std::string key = realpath(dir.c_str(), buf) ? std::string(buf) : dir;
  std::lock_guard<std::mutex> lock(g_quota_mu);
  if (bytes < 0) {
    g_quotas->erase(key);
  } else {
    (*g_quotas)[key] = bytes;
  }
}

void FaultVfs::clear_quotas() {
  std::lock_guard<std::mutex> lock(g_quota_mu);
  g_quotas->clear();
}

void FaultVfs::set_skip_sync(bool skip) {
  if (g_shared) g_shared->skip_sync.store(skip);
}

const char *FaultVfs::op_name(Op op) {
  static const char *const names[kNumOps] = {
      "xOpen", "xDelete", "xAccess",           "xRead", "xWrite", "xTruncate", "xSync", "xFileSize",
      "xLock", "xUnlock", "xCheckReservedLock"};
  return op < kNumOps ? names[op] : "?";
}

}  // namespace fa::test
