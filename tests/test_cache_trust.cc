// The kernel cache as a trust boundary (docs/reliability.md, "Threat
// model"): the kernels in the cache are code the victim will run, so a
// directory or file another user could have written is never used, links are
// never followed, the database is private (0600, its journal too), a lock
// that is never released delays a launch by about 1.5 s at most, and a cache
// provisioned by root is served read-only.
//
// A second user is needed: the test runs as root and forked children switch
// to uids that need no /etc/passwd entry (kAttacker plants directories,
// files, links and locks; kVictim is a non-root victim). Elsewhere every test
// is skipped, saying why. Each case launches a small causal forward pass as
// the victim (emulator, poisoned output, fp64 reference) and checks that
// nothing outside the cache directory changed. The planted kernel is a real,
// valid kernel that leaves the output unwritten, stored under the victim's
// key with recomputed hashes; test_planted_row_runs_when_trusted shows it is
// served (and gives wrong results) when the file is trusted, so its absence
// elsewhere is the checks' doing.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/store.h"
#include "flashattn.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"

using fa::test::db_file;
using fa::test::fork_child;
using fa::test::key_for;
using fa::test::record_for;
using fa::test::rm_rf;
using fa::test::wait_exit;

namespace {

constexpr uid_t kAttacker = 54321;  // another local user
constexpr uid_t kVictim = 54322;    // a victim that is not root
constexpr int kNoUid = 76;          // child status: could not switch uid
constexpr int kChildAlarmS = 120;   // a child still running after this is hung
constexpr int kDim = 32;            // the head_dim whose kernel is planted
// How long a launch may take while another process holds a lock forever:
// the store gives up after 1.5 s without progress; the rest is the
// emulator's cold launch (generation, parsing), slow under ASan.
constexpr double kLockBoundS = 6.0;

using Clock = std::chrono::steady_clock;
using fa::test::seconds_since;

bool contains(const std::string &hay, const char *needle) {
  return hay.find(needle) != std::string::npos;
}

// ---- processes as other users ----------------------------------------------

// Runs fn() in a forked child as uid/gid `uid` (root stays root); its return
// value is the child's exit status, kNoUid when the switch failed.
int run_as(uid_t uid, const std::function<int()> &fn) {
  return wait_exit(fork_child(
      [&] {
        if (uid != 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) {
          return kNoUid;
        }
        return fn();
      },
      false, kChildAlarmS));
}

// Skips the test unless a second user can be had here.
void require_second_uid() {
  if (geteuid() != 0) {
    std::printf("  SKIP: needs root to act as a second user (uid %u here)\n",
                static_cast<unsigned>(geteuid()));
    skip();
  }
  if (run_as(kAttacker, [] { return getuid() == kAttacker ? 0 : 1; }) != 0) {
    std::printf("  SKIP: setuid(%u) is not permitted here\n", static_cast<unsigned>(kAttacker));
    skip();
  }
}

// A block of memory shared with forked children.
template <typename T>
struct Shared {
  T *p;
  Shared() {
    void *m = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    p = new (m) T();
  }
  ~Shared() { munmap(p, sizeof(T)); }
  T *operator->() { return p; }
};

void copy_text(char *dst, size_t n, const std::string &s) {
  std::snprintf(dst, n, "%s", s.c_str());
}

// ---- the victim's launches ----------------------------------------------------

struct Outcome {
  int right = 0, wrong = 0;  // launches checked against the reference
  int32_t persistent = -1;
  uint64_t disk_hits = 0, misses = 0;
  int clear_status = -1;  // fa_cache_clear, when asked for
  double launch_s = 0;    // runtime creation and the launches
  double total_s = 0;     // ... and its destruction
  char note[256] = {0};
  char path[512] = {0};
  char error[512] = {0};  // the first wrong launch
};

struct VictimRun {
  uid_t uid = 0;
  std::string dir;  // "" = resolve from the environment (XDG_CACHE_HOME below)
  std::string xdg;  // when set: XDG_CACHE_HOME, with FLASHATTN_CACHE_DIR unset
  std::vector<int> dims = {kDim};
  bool clear = false;
  mode_t umask_bits = 022;
};

VictimRun at(uid_t uid, const std::string &dir) {
  VictimRun v;
  v.uid = uid;
  v.dir = dir;
  return v;
}

// A child running as the victim: an emulator runtime on the cache, one small
// causal forward per head_dim, each right or wrong; the stats after.
Outcome victim_launch(const VictimRun &v) {
  Shared<Outcome> out;
  Outcome *o = out.p;
  const int rc = run_as(v.uid, [&] {
    umask(v.umask_bits);
    if (!v.xdg.empty()) {
      unsetenv("FLASHATTN_CACHE_DIR");
      setenv("XDG_CACHE_HOME", v.xdg.c_str(), 1);
    }
    const auto t0 = Clock::now();
    fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
    opts.backend = FA_BACKEND_EMULATOR;
    opts.cache_dir = v.dir.empty() ? nullptr : v.dir.c_str();
    fa_runtime *rt = nullptr;
    if (fa_runtime_create(&opts, &rt) != FA_SUCCESS) {
      copy_text(o->error, sizeof o->error, std::string("fa_runtime_create: ") + fa_last_error());
      return 2;
    }
    uint32_t seed = 7;
    for (int d : v.dims) {
      const std::string err = fa::test::small_forward_error(rt, d, seed++);
      if (err.empty()) {
        ++o->right;
      } else if (o->wrong++ == 0) {
        copy_text(o->error, sizeof o->error, "d=" + std::to_string(d) + ": " + err);
      }
    }
    o->launch_s = seconds_since(t0);
    const fa_cache_stats s = fa::test::cache_stats_of(rt);
    o->persistent = s.persistent;
    o->disk_hits = s.disk_hits;
    o->misses = s.misses;
    copy_text(o->note, sizeof o->note, s.note);
    copy_text(o->path, sizeof o->path, s.path);
    if (v.clear) o->clear_status = fa_cache_clear(rt);
    fa_runtime_destroy(rt);
    o->total_s = seconds_since(t0);
    return 0;
  });
  if (rc != 0) std::printf("  victim child: status %d, %s\n", rc, o->error);
  assert_int_equal(rc, 0);
  return *o;
}

void print_outcome(const char *what, const Outcome &o) {
  std::printf("  %s: %d right, %d wrong, %s, disk hits %llu, misses %llu, %.2f s; note '%s'\n",
              what, o.right, o.wrong, o.persistent ? "on disk" : "memory",
              static_cast<unsigned long long>(o.disk_hits),
              static_cast<unsigned long long>(o.misses), o.launch_s, o.note);
  if (o.wrong) std::printf("    first wrong launch: %s\n", o.error);
}

// Every launch right, from memory, and the note says `why`.
void expect_refused(const char *what, const Outcome &o, const char *why) {
  print_outcome(what, o);
  assert_int_equal(o.wrong, 0);
  assert_true(o.right > 0);
  assert_int_equal(o.persistent, 0);
  assert_int_equal(o.disk_hits, 0);
  assert_true(contains(o.note, "kernel cache in memory only"));
  if (!contains(o.note, why)) std::printf("    note lacks '%s'\n", why);
  assert_true(contains(o.note, why));
}

// ---- snapshots: nothing outside the cache changes --------------------------------

// Every entry under dir, not following links: type, owner, mode, size,
// mtime, inode, and the content's hash (files) or target (links).
void snapshot_into(const std::string &path, std::map<std::string, std::string> *m) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  char head[160];
  std::snprintf(head, sizeof head,
                "type %o uid %u gid %u mode %04o size %lld ino %llu mtime %lld.%09ld",
                static_cast<unsigned>(st.st_mode & S_IFMT), static_cast<unsigned>(st.st_uid),
                static_cast<unsigned>(st.st_gid), static_cast<unsigned>(st.st_mode & 07777),
                static_cast<long long>(st.st_size), static_cast<unsigned long long>(st.st_ino),
                static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec);
  std::string d = head;
  if (S_ISREG(st.st_mode)) {
    std::string bytes;
    if (FILE *f = std::fopen(path.c_str(), "rb")) {
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
      std::fclose(f);
    }
    d += " xxh3 " + std::to_string(XXH3_64bits(bytes.data(), bytes.size()));
  } else if (S_ISLNK(st.st_mode)) {
    char target[4096];
    const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
    d += " -> " + std::string(target, n > 0 ? size_t(n) : 0);
  }
  (*m)[path] = d;
  if (!S_ISDIR(st.st_mode)) return;
  if (DIR *dir = opendir(path.c_str())) {
    while (dirent *e = readdir(dir)) {
      if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
      snapshot_into(path + "/" + e->d_name, m);
    }
    closedir(dir);
  }
}

struct Snapshot {
  std::string root;
  std::map<std::string, std::string> entries;
  explicit Snapshot(std::string dir) : root(std::move(dir)) { snapshot_into(root, &entries); }
  // Asserts that nothing under root changed, was added or removed.
  void assert_unchanged(const char *what) const {
    std::map<std::string, std::string> now;
    snapshot_into(root, &now);
    bool same = now == entries;
    for (const auto &kv : entries) {
      auto it = now.find(kv.first);
      if (it == now.end()) std::printf("  %s: %s was removed\n", what, kv.first.c_str());
      if (it != now.end() && it->second != kv.second) {
        std::printf("  %s: %s changed:\n    %s\n    %s\n", what, kv.first.c_str(),
                    kv.second.c_str(), it->second.c_str());
      }
    }
    for (const auto &kv : now) {
      if (!entries.count(kv.first)) std::printf("  %s: %s appeared\n", what, kv.first.c_str());
    }
    assert_true(same);
  }
};

// ---- files -----------------------------------------------------------------

std::string read_file(const std::string &path) {
  std::string bytes;
  if (FILE *f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
    std::fclose(f);
  }
  return bytes;
}

// Writes bytes to a new file owned by uid with the given mode.
void install_file(const std::string &path, const std::string &bytes, uid_t uid, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  assert_int_equal(fchown(fd, uid, uid), 0);
  assert_int_equal(fchmod(fd, mode), 0);
  close(fd);
}

void make_dir(const std::string &path, uid_t uid, mode_t mode, gid_t gid = gid_t(-1)) {
  assert_int_equal(mkdir(path.c_str(), 0700), 0);
  assert_int_equal(chown(path.c_str(), uid, gid == gid_t(-1) ? uid : gid), 0);
  assert_int_equal(chmod(path.c_str(), mode), 0);
}

mode_t mode_of(const std::string &path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : mode_t(-1);
}

bool exists(const std::string &path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// A case's directory (0755, so other users can reach what is inside) with
// `outside/`: a shell rc file and a valid database of the victim's, the kind
// of files a link out of the cache would aim at.
struct Case {
  std::string root, outside;
  explicit Case(const char *tag) {
    root = fa::test::temp_dir("cache_trust", tag);
    assert_false(root.empty());
    assert_int_equal(chmod(root.c_str(), 0755), 0);
    outside = root + "/outside";
    make_dir(outside, 0, 0755);
    install_file(outside + "/bashrc", "export PATH=$HOME/bin:$PATH\n", 0, 0644);
  }
  ~Case() { rm_rf(root); }
};

// ---- the planted kernel ----------------------------------------------------------

std::vector<uint8_t> xxh128(const std::string &bytes) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(bytes.data(), bytes.size()));
  return std::vector<uint8_t>(c.digest, c.digest + 16);
}

// A valid kernel that computes nothing useful: the real one with its stores
// of O removed (the output keeps its poison).
std::string evil_ptx(const std::string &ptx) {
  std::string out, line;
  size_t dropped = 0;
  for (size_t i = 0; i < ptx.size(); ++i) {
    line.push_back(ptx[i]);
    if (ptx[i] != '\n' && i + 1 < ptx.size()) continue;
    if (line.find("st.global.v4") != std::string::npos) {
      ++dropped;
    } else {
      out += line;
    }
    line.clear();
  }
  return dropped ? out : "";
}

// Database files (bytes) holding the victim's kDim kernel: as built, and
// with the planted kernel under the same key, key material, SM and
// generator version, its hashes recomputed (a row a forger would write).
struct Plant {
  std::string legit, evil;
};

const Plant &plant() {
  static Plant p;
  if (!p.legit.empty()) return p;
  const std::string dir = fa::test::temp_dir("cache_trust", "plant");
  assert_false(dir.empty());
  const Outcome o = victim_launch(at(0, dir));
  assert_int_equal(o.right, 1);
  assert_int_equal(o.persistent, 1);
  const std::string db = db_file(dir);
  p.legit = read_file(db);
  sqlite3 *h = nullptr;
  assert_int_equal(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  sqlite3_stmt *s = nullptr;
  assert_int_equal(sqlite3_prepare_v2(h, "SELECT ptx FROM kernels", -1, &s, nullptr), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  const std::string ptx(static_cast<const char *>(sqlite3_column_blob(s, 0)),
                        static_cast<size_t>(sqlite3_column_bytes(s, 0)));
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);  // one row: the kDim kernel
  sqlite3_finalize(s);
  const std::string evil = evil_ptx(ptx);
  assert_false(evil.empty());
  const std::vector<uint8_t> hash = xxh128(evil);
  assert_int_equal(
      sqlite3_prepare_v2(h, "UPDATE kernels SET ptx = ?1, ptx_hash = ?2", -1, &s, nullptr),
      SQLITE_OK);
  sqlite3_bind_blob(s, 1, evil.data(), static_cast<int>(evil.size()), SQLITE_TRANSIENT);
  sqlite3_bind_blob(s, 2, hash.data(), 16, SQLITE_TRANSIENT);
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);
  assert_int_equal(sqlite3_changes(h), 1);
  sqlite3_finalize(s);
  sqlite3_close(h);
  p.evil = read_file(db);
  assert_true(p.evil != p.legit);
  rm_rf(dir);
  return p;
}

// ---- tests -----------------------------------------------------------------

// The control: trusted, the planted row is served and the launch is wrong.
// Every other test plants the same row where it must not be used.
void test_planted_row_runs_when_trusted(void **) {
  require_second_uid();
  Case c("control");
  const std::string cache = c.root + "/cache";
  make_dir(cache, 0, 0700);
  install_file(db_file(cache), plant().evil, 0, 0600);
  const Outcome o = victim_launch(at(0, cache));
  print_outcome("planted row, trusted file", o);
  assert_int_equal(o.persistent, 1);
  assert_int_equal(o.disk_hits, 1);
  assert_int_equal(o.misses, 0);
  assert_int_equal(o.wrong, 1);
  assert_false(contains(o.error, "fa_launch"));  // it ran, and wrote nothing
  // The legitimate file: a right disk hit.
  rm_rf(cache);
  make_dir(cache, 0, 0700);
  install_file(db_file(cache), plant().legit, 0, 0600);
  const Outcome ok = victim_launch(at(0, cache));
  assert_int_equal(ok.right, 1);
  assert_int_equal(ok.disk_hits, 1);
}

// (a) A squatted $XDG_CACHE_HOME/flashattn: the attacker created the
// directory and a database with the planted row before the victim ever ran.
void test_foreign_directory(void **) {
  require_second_uid();
  Case c("foreign-dir");
  const std::string xdg = c.root + "/xdg";  // shared, like /tmp
  make_dir(xdg, 0, 01777);
  const std::string squat = xdg + "/flashattn";
  const std::string evil = plant().evil;
  assert_int_equal(run_as(kAttacker,
                          [&] {
                            if (mkdir(squat.c_str(), 0755) != 0) return 1;
                            const int fd = open(db_file(squat).c_str(), O_WRONLY | O_CREAT, 0644);
                            if (fd < 0) return 2;
                            const bool ok = write(fd, evil.data(), evil.size()) ==
                                            static_cast<ssize_t>(evil.size());
                            close(fd);
                            return ok ? 0 : 3;
                          }),
                   0);
  const Snapshot outside(c.outside), cache(xdg);
  for (uid_t victim : {uid_t(0), kVictim}) {
    VictimRun v;
    v.uid = victim;
    v.xdg = xdg;
    const Outcome o = victim_launch(v);
    expect_refused(victim ? "squatted XDG dir, victim uid 54322" : "squatted XDG dir, victim root",
                   o, "owned by uid 54321");
    assert_true(contains(o.note, squat.c_str()));
  }
  // Also when named explicitly, and through a link of the victim's.
  const std::string link = c.root + "/link";
  assert_int_equal(symlink(squat.c_str(), link.c_str()), 0);
  expect_refused("link to the attacker's directory", victim_launch(at(0, link)),
                 "owned by uid 54321");
  cache.assert_unchanged("the squatted directory");
  outside.assert_unchanged("outside");
}

// (b) Directories others may write: the cache directory itself (even
// sticky), or one above it without the sticky bit. Their modes are left alone.
void test_writable_directories(void **) {
  require_second_uid();
  Case c("modes");
  const Snapshot outside(c.outside);
  struct Mode {
    mode_t mode;
    gid_t gid;
    const char *why;
  };
  const Mode modes[] = {{0777, 0, "writable by others (mode 0777)"},
                        {01777, 0, "writable by others (mode 1777)"},
                        {0770, kAttacker, "writable by group 54321 (mode 0770)"},
                        {0730, kAttacker, "writable by group 54321 (mode 0730)"}};
  int n = 0;
  for (const Mode &m : modes) {
    const std::string cache = c.root + "/cache" + std::to_string(n++);
    make_dir(cache, 0, m.mode, m.gid);
    install_file(db_file(cache), plant().evil, 0, 0600);  // as if planted through the mode
    const Snapshot before(cache);
    const Outcome o = victim_launch(at(0, cache));
    char what[64];
    std::snprintf(what, sizeof what, "cache directory mode %04o", static_cast<unsigned>(m.mode));
    expect_refused(what, o, m.why);
    before.assert_unchanged(what);  // not chmod'ed, nothing written
  }
  // A directory above the cache that others may write (no sticky bit): they
  // could rename the cache away and put their own in its place.
  const std::string shared = c.root + "/shared";
  make_dir(shared, 0, 0777);
  make_dir(shared + "/cache", 0, 0700);
  install_file(db_file(shared + "/cache"), plant().evil, 0, 0600);
  expect_refused("directory above writable by others", victim_launch(at(0, shared + "/cache")),
                 "a directory above the cache is writable by others (mode 0777)");
  // ... and nothing is created below it.
  expect_refused("new cache below it", victim_launch(at(0, shared + "/new/cache")),
                 "a directory above the cache is writable by others");
  assert_false(exists(shared + "/new"));
  // A sticky one above (like /tmp) is fine: others may not rename our entry.
  const std::string tmp = c.root + "/tmp";
  make_dir(tmp, 0, 01777);
  const Outcome sticky = victim_launch(at(0, tmp + "/cache"));
  print_outcome("below a sticky 1777 directory", sticky);
  assert_int_equal(sticky.right, 1);
  assert_int_equal(sticky.persistent, 1);
  assert_int_equal(mode_of(tmp + "/cache"), 0700);
  // A group write bit for the user's private group (umask 002 users) grants
  // nobody else anything: root's group 0 here, if it has no other member.
  const std::string upg = c.root + "/upg";
  make_dir(upg, 0, 0770, 0);
  const group *g = getgrgid(0);
  if (g && g->gr_mem && g->gr_mem[0]) {
    std::printf("  (group 0 has members: the user-private-group case is not checked)\n");
  } else {
    const Outcome o = victim_launch(at(0, upg));
    print_outcome("mode 0770 for the user's private group", o);
    assert_int_equal(o.right, 1);
    assert_int_equal(o.persistent, 1);
  }
  outside.assert_unchanged("outside");
}

// (c) Links: kernels.sqlite3 or its journal a symbolic link (to a file
// outside, dangling, or to a database with the planted row) is never
// followed; a linked cache directory is resolved and checked.
void test_symlinks(void **) {
  require_second_uid();
  Case c("links");
  install_file(c.outside + "/victim.db", plant().evil, 0, 0600);
  const Snapshot outside(c.outside);
  struct Link {
    const char *target, *name, *what;
  };
  const Link links[] = {
      {"/bashrc", "kernels.sqlite3", "database linked to a file outside"},
      {"/missing.db", "kernels.sqlite3", "database linked nowhere (dangling)"},
      {"/victim.db", "kernels.sqlite3", "database linked to a planted database"},
      {"/bashrc", "kernels.sqlite3-journal", "journal linked to a file outside"},
      {"/missing", "kernels.sqlite3-journal", "journal linked nowhere (dangling)"},
  };
  int n = 0;
  for (const Link &l : links) {
    const std::string cache = c.root + "/cache" + std::to_string(n++);
    make_dir(cache, 0, 0700);
    if (contains(l.name, "journal")) install_file(db_file(cache), plant().legit, 0, 0600);
    const std::string link = cache + "/" + l.name;
    assert_int_equal(symlink((c.outside + l.target).c_str(), link.c_str()), 0);
    assert_int_equal(lchown(link.c_str(), kAttacker, kAttacker), 0);
    const Outcome o = victim_launch(at(0, cache));
    expect_refused(l.what, o, "is a symbolic link (never followed)");
    outside.assert_unchanged(l.what);
  }
  // A linked cache directory of the victim's own is used, under its real path.
  const std::string real = c.root + "/real", link = c.root + "/linked";
  make_dir(real, 0, 0700);
  assert_int_equal(symlink(real.c_str(), link.c_str()), 0);
  const Outcome o = victim_launch(at(0, link));
  print_outcome("linked cache directory", o);
  assert_int_equal(o.right, 1);
  assert_int_equal(o.persistent, 1);
  assert_string_equal(o.path, db_file(real).c_str());
  outside.assert_unchanged("outside");
}

// (c) The database path replaced while a store has the file open, then the
// open file found damaged: the reset in place is refused (it would write
// the journal through the new path), the store goes to memory, and the
// file the new link points to is left alone.
void test_swapped_while_open(void **) {
  require_second_uid();
  Case c("swap");
  const std::string cache = c.root + "/cache", db = db_file(cache);
  const Snapshot outside(c.outside);
  for (const bool as_link : {true, false}) {
    rm_rf(cache);
    fa::cache::Options opts;
    opts.dir = cache;
    auto store = fa::cache::open_store(opts);
    store->put(key_for(1), record_for(1));
    assert_true(store->stats().persistent);
    assert_int_equal(rename(db.c_str(), (db + ".old").c_str()), 0);
    if (as_link) {
      assert_int_equal(symlink((c.outside + "/bashrc").c_str(), db.c_str()), 0);
    } else {
      install_file(db, "not a database either\n", 0, 0600);
    }
    // Damage the open file's header (it now lives at kernels.sqlite3.old).
    const int fd = open((db + ".old").c_str(), O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "garbage garbage garbage garbage", 32, 0), 32);
    close(fd);
    fa::cache::Record got;
    assert_false(store->get(key_for(1), &got));
    const fa::cache::Stats st = store->stats();
    std::printf("  %s: %s; note '%s'\n", as_link ? "path now a link" : "path now another file",
                st.persistent ? "on disk" : "memory", st.note.c_str());
    assert_false(st.persistent);
    assert_int_equal(st.resets, 0);
    assert_true(contains(st.note, "not reset"));
    assert_true(contains(st.note, as_link ? "symbolic link" : "replaced by another file"));
    assert_false(exists(db + "-journal"));
    // It still works, in memory.
    store->put(key_for(2), record_for(2));
    assert_true(store->get(key_for(2), &got));
    outside.assert_unchanged("outside");
  }
  if (!exists(db)) return;
  // The file at the path (not the store's) was not touched either.
  assert_string_equal(read_file(db).c_str(), "not a database either\n");
}

// (d) A database owned by another user, with the planted row and good
// hashes; one others may write; and a journal planted by another user.
void test_foreign_files(void **) {
  require_second_uid();
  Case c("foreign-file");
  const Snapshot outside(c.outside);
  struct File {
    uid_t owner;
    mode_t mode;
    uid_t victim;
    const char *what, *why;
  };
  const File files[] = {
      {kAttacker, 0644, 0, "attacker's database, victim root", "owned by uid 54321"},
      {kAttacker, 0644, kVictim, "attacker's database, victim uid 54322", "owned by uid 54321"},
      {0, 0666, 0, "database writable by others", "writable by others (mode 0666)"},
  };
  int n = 0;
  for (const File &f : files) {
    const std::string cache = c.root + "/cache" + std::to_string(n++);
    make_dir(cache, f.victim, 0755);
    install_file(db_file(cache), plant().evil, f.owner, f.mode);
    const Snapshot before(cache);
    expect_refused(f.what, victim_launch(at(f.victim, cache)), f.why);
    before.assert_unchanged(f.what);
  }
  // A hot journal of the attacker's beside the victim's database: SQLite
  // would roll it back into the database on the next read.
  const std::string cache = c.root + "/journal";
  make_dir(cache, 0, 0700);
  install_file(db_file(cache), plant().legit, 0, 0600);
  install_file(db_file(cache) + "-journal", "a hot journal", kAttacker, 0644);
  const Snapshot before(cache);
  expect_refused("attacker's journal", victim_launch(at(0, cache)),
                 "kernels.sqlite3-journal is owned by uid 54321");
  before.assert_unchanged("attacker's journal");
  outside.assert_unchanged("outside");
}

// (e) The database is created 0600 whatever the umask, and SQLite's journal
// gets the same mode: seen while a write transaction of the store's is open.
// An older 0644 file of a (non-root) user is made 0600.
void test_private_modes(void **) {
  require_second_uid();
  Case c("private");
  const Snapshot outside(c.outside);
  VictimRun v;
  v.dir = c.root + "/new/cache";
  v.umask_bits = 0;
  const Outcome o = victim_launch(v);
  print_outcome("fresh cache, umask 0", o);
  assert_int_equal(o.right, 1);
  assert_int_equal(o.persistent, 1);
  assert_int_equal(mode_of(c.root + "/new"), 0700);
  assert_int_equal(mode_of(v.dir), 0700);
  assert_int_equal(mode_of(db_file(v.dir)), 0600);

  // The journal: a reader keeps its shared lock, so the store's put() waits
  // for the exclusive lock with its journal written. Looked at meanwhile.
  const mode_t old_umask = umask(0);
  const std::string dir = c.root + "/journal";
  fa::cache::Options opts;
  opts.dir = dir;
  auto store = fa::cache::open_store(opts);
  assert_true(store->stats().persistent);
  sqlite3 *reader = nullptr;
  assert_int_equal(sqlite3_open(db_file(dir).c_str(), &reader), SQLITE_OK);
  assert_int_equal(
      sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM kernels;", nullptr, nullptr, nullptr),
      SQLITE_OK);
  std::thread writer([&] { store->put(key_for(5), record_for(5)); });
  const std::string journal = db_file(dir) + "-journal";
  const auto t0 = Clock::now();
  while (!exists(journal) && seconds_since(t0) < 1.0) usleep(200);
  const mode_t jmode = mode_of(journal);
  sqlite3_exec(reader, "COMMIT", nullptr, nullptr, nullptr);
  writer.join();
  sqlite3_close(reader);
  umask(old_umask);
  std::printf("  journal mode while the write was open: %04o\n", static_cast<unsigned>(jmode));
  assert_int_equal(jmode, 0600);
  fa::cache::Record got;
  assert_true(store->get(key_for(5), &got));  // the write went through
  store.reset();

  // An older 0644 database of a non-root user becomes 0600; its row stays.
  const std::string legacy = c.root + "/legacy";
  make_dir(legacy, kVictim, 0755);
  install_file(db_file(legacy), plant().legit, kVictim, 0644);
  const Outcome l = victim_launch(at(kVictim, legacy));
  print_outcome("0644 database of uid 54322", l);
  assert_int_equal(l.right, 1);
  assert_int_equal(l.disk_hits, 1);
  assert_int_equal(mode_of(db_file(legacy)), 0600);
  outside.assert_unchanged("outside");
}

// Holds a lock on db in a child as uid until killed: "shared" (a read
// transaction), "reserved" (BEGIN IMMEDIATE) or "exclusive". Returns the
// child once the lock is held, or -1.
pid_t hold_lock(uid_t uid, const std::string &db, const std::string &kind) {
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    fa::test::child_setup(false, kChildAlarmS);
    close(ready[0]);
    if (uid != 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) {
      _exit(kNoUid);
    }
    sqlite3 *h = nullptr;
    const int flags = kind == "shared" ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    if (sqlite3_open_v2(db.c_str(), &h, flags, nullptr) != SQLITE_OK) _exit(2);
    const char *sql = kind == "shared"     ? "BEGIN; SELECT count(*) FROM kernels;"
                      : kind == "reserved" ? "BEGIN IMMEDIATE;"
                                           : "PRAGMA locking_mode=EXCLUSIVE; BEGIN EXCLUSIVE;";
    if (sqlite3_exec(h, sql, nullptr, nullptr, nullptr) != SQLITE_OK) _exit(3);
    if (write(ready[1], "x", 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char c = 0;
  const bool ok = read(ready[0], &c, 1) == 1;
  close(ready[0]);
  if (!ok) {
    std::printf("  lock holder: status %d\n", wait_exit(pid));
    return -1;
  }
  return pid;
}

void release_lock(pid_t pid) {
  kill(pid, SIGKILL);
  wait_exit(pid);
}

// (f) Locks. Another user cannot open a 0600 database at all. One who opened
// an older 0644 file before it was made private, or the victim's own stuck
// process, holds a lock forever: the victim's cold launch (a kernel not in
// the file) is still right and done within kLockBoundS, against 30 s or more
// before (a 10 s busy timeout per statement and a 20 s lease wait).
void test_lock_bound(void **) {
  require_second_uid();
  Case c("locks");
  const Snapshot outside(c.outside);
  const std::string cache = c.root + "/cache";
  make_dir(cache, 0, 0755);  // reachable: the file's mode alone keeps others out
  install_file(db_file(cache), plant().legit, 0, 0600);
  const std::string db = db_file(cache);
  assert_int_equal(run_as(kAttacker,
                          [&] {
                            if (open(db.c_str(), O_RDONLY) >= 0 || errno != EACCES) return 1;
                            sqlite3 *h = nullptr;
                            sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr);
                            const int rc = sqlite3_exec(h, "SELECT count(*) FROM kernels", nullptr,
                                                        nullptr, nullptr);
                            sqlite3_close(h);
                            return rc == SQLITE_OK ? 2 : 0;
                          }),
                   0);

  struct Hold {
    uid_t holder, victim;
    const char *kind, *what;
    mode_t mode;
  };
  const Hold holds[] = {
      {kAttacker, kVictim, "shared", "attacker's shared lock on an older 0644 file", 0644},
      {0, 0, "reserved", "victim's own process in a write transaction", 0600},
      {0, 0, "exclusive", "victim's own process holding the exclusive lock", 0600},
  };
  int n = 0;
  for (const Hold &h : holds) {
    const std::string dir = c.root + "/held" + std::to_string(n++);
    make_dir(dir, h.victim, 0755);
    install_file(db_file(dir), plant().legit, h.victim, h.mode);
    const pid_t holder = hold_lock(h.holder, db_file(dir), h.kind);
    assert_true(holder > 0);
    VictimRun v;
    v.uid = h.victim;
    v.dir = dir;
    v.dims = {16, kDim};  // a cold kernel (a lease and a write), then the stored one
    const Outcome o = victim_launch(v);
    release_lock(holder);
    print_outcome(h.what, o);
    std::printf("    runtime + 2 launches %.2f s, with destroy %.2f s (bound %.1f s)\n", o.launch_s,
                o.total_s, kLockBoundS);
    assert_int_equal(o.wrong, 0);
    assert_int_equal(o.right, 2);
    assert_true(o.total_s < kLockBoundS);
    assert_true(contains(o.note, "without progress"));
    if (h.mode == 0644) assert_int_equal(mode_of(db_file(dir)), 0600);
    // Released: the next runtime is on disk and right.
    const Outcome after = victim_launch(v);
    assert_int_equal(after.right, 2);
    assert_int_equal(after.persistent, 1);
  }
  outside.assert_unchanged("outside");
}

// (g) A cache provisioned by root (directory 0755, file 0644, both root's):
// another user gets its kernels from disk, builds the others in memory,
// cannot clear it, and writes nothing to it. Root's own file keeps its mode.
void test_root_read_only(void **) {
  require_second_uid();
  Case c("provisioned");
  const Snapshot outside(c.outside);
  const std::string fleet = c.root + "/fleet";
  const Outcome p = victim_launch(at(0, fleet));  // root provisions it
  assert_int_equal(p.right, 1);
  assert_int_equal(chmod(fleet.c_str(), 0755), 0);
  assert_int_equal(chmod(db_file(fleet).c_str(), 0644), 0);
  const Snapshot before(fleet);
  for (int round = 0; round < 2; ++round) {
    VictimRun v;
    v.uid = kVictim;
    v.dir = fleet;
    v.dims = {kDim, 16};
    v.clear = true;
    const Outcome o = victim_launch(v);
    print_outcome("root's cache, victim uid 54322", o);
    assert_int_equal(o.wrong, 0);
    assert_int_equal(o.right, 2);
    assert_int_equal(o.persistent, 1);
    assert_int_equal(o.disk_hits, 1);  // the provisioned kernel
    assert_int_equal(o.misses, 1);     // built in memory, every time
    assert_int_equal(o.clear_status, FA_ERROR_CACHE);
    assert_true(contains(o.note, "read-only"));
    before.assert_unchanged("root's cache");
  }
  // Group- or other-writable, it is not trusted.
  assert_int_equal(chmod(db_file(fleet).c_str(), 0664), 0);
  expect_refused("root's cache, file mode 0664", victim_launch(at(kVictim, fleet)),
                 "writable by group 0 (mode 0664)");
  assert_int_equal(chmod(db_file(fleet).c_str(), 0644), 0);
  // Root itself writes to it, and leaves its mode alone.
  VictimRun r;
  r.dir = fleet;
  r.dims = {16};
  const Outcome o = victim_launch(r);
  assert_int_equal(o.right, 1);
  assert_int_equal(o.misses, 1);
  assert_int_equal(o.persistent, 1);
  assert_int_equal(mode_of(db_file(fleet)), 0644);
  outside.assert_unchanged("outside");
}

// `flashattn cache stats --cache-dir dir` run as uid: its output.
std::string cli_stats(uid_t uid, const std::string &dir, const std::string &out_path) {
  const std::string cli = FA_CLI_PATH;
  const int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(fd >= 0);
  const int rc = run_as(uid, [&] {
    dup2(fd, 1);
    execl(cli.c_str(), cli.c_str(), "cache", "stats", "--cache-dir", dir.c_str(),
          static_cast<char *>(nullptr));
    return 2;
  });
  close(fd);
  assert_int_equal(rc, 0);
  return read_file(out_path);
}

void test_cli_stats(void **) {
  require_second_uid();
  if (std::strlen(FA_CLI_PATH) == 0) {
    std::printf("  SKIP: the flashattn program is not built\n");
    skip();
  }
  Case c("cli");
  const std::string foreign = c.root + "/foreign";
  make_dir(foreign, kAttacker, 0755);
  const std::string out = cli_stats(0, foreign, c.root + "/out1.txt");
  std::printf("%s", out.c_str());
  assert_true(contains(out, "memory only"));
  assert_true(contains(out, "cache directory owned by uid 54321"));
  const std::string fleet = c.root + "/fleet";
  assert_int_equal(victim_launch(at(0, fleet)).right, 1);
  assert_int_equal(chmod(fleet.c_str(), 0755), 0);
  assert_int_equal(chmod(db_file(fleet).c_str(), 0644), 0);
  const std::string ro = cli_stats(kVictim, fleet, c.root + "/out2.txt");
  std::printf("%s", ro.c_str());
  assert_true(contains(ro, "persistent"));
  assert_true(contains(ro, "read-only kernel cache (owned by root)"));
}

}  // namespace

int main() {
  setenv("FLASHATTN_QUIET", "1", 1);  // expected warnings would only clutter the log
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_planted_row_runs_when_trusted),
      cmocka_unit_test(test_foreign_directory),
      cmocka_unit_test(test_writable_directories),
      cmocka_unit_test(test_symlinks),
      cmocka_unit_test(test_swapped_while_open),
      cmocka_unit_test(test_foreign_files),
      cmocka_unit_test(test_private_modes),
      cmocka_unit_test(test_lock_bound),
      cmocka_unit_test(test_root_read_only),
      cmocka_unit_test(test_cli_stats),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
