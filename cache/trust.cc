// Trust checks of the cache directory and database file. The kernels stored
// there are code this process will run, so a directory or file that anyone
// but this user (or root) could have written is not used: the cache then runs
// in memory, and the reason goes into the store's note. The rules follow
// OpenSSH's StrictModes; see docs/reliability.md, "Threat model".
//
// Path checks use lstat() and O_PATH descriptors only: opening and closing an
// ordinary descriptor on the database would drop the POSIX locks that other
// SQLite connections of this process hold on it.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cache/store_internal.h"

namespace fa::cache {
namespace {

std::string mode_text(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

std::string errno_text(const char *what, const std::string &path) {
  return std::string(what) + " " + path + ": " + std::strerror(errno);
}

// Calls get(buffer, size) with a growing buffer while it fails with ERANGE
// (getpwuid_r and friends); true when it found the entry.
template <typename F>
bool with_nss_buffer(F get) {
  std::vector<char> buf(4096);
  for (;;) {
    const int rc = get(buf.data(), buf.size());
    if (rc == 0) return true;
    if (rc != ERANGE || buf.size() >= (1u << 20)) return false;
    buf.resize(buf.size() * 2);
  }
}

// True when gid is uid's user private group (the convention of Debian and
// Ubuntu, whose users get umask 002): the group is named after the user, is
// the user's primary group, and lists no other member. Its write bit then
// grants nobody else anything. Debian's OpenSSH accepts such modes too.
bool user_private_group(gid_t gid, uid_t uid) {
  std::string user;
  gid_t primary = 0;
  const bool have_user = with_nss_buffer([&](char *buf, size_t size) {
    struct passwd pw, *found = nullptr;
    const int rc = getpwuid_r(uid, &pw, buf, size, &found);
    if (rc != 0) return rc;
    if (!found) return ENOENT;
    user = pw.pw_name;
    primary = pw.pw_gid;
    return 0;
  });
  if (!have_user || primary != gid) return false;
  bool ok = false;
  with_nss_buffer([&](char *buf, size_t size) {
    struct group gr, *found = nullptr;
    const int rc = getgrgid_r(gid, &gr, buf, size, &found);
    if (rc != 0) return rc;
    if (!found) return ENOENT;
    ok = user == gr.gr_name;
    for (char **m = gr.gr_mem; ok && m && *m; ++m) ok = user == *m;
    return 0;
  });
  return ok;
}

// "" when only the owner may write st, else who else may.
std::string others_may_write(const struct stat &st) {
  if (st.st_mode & S_IWOTH) return "writable by others (mode " + mode_text(st.st_mode) + ")";
  if ((st.st_mode & S_IWGRP) && !user_private_group(st.st_gid, geteuid())) {
    return "writable by group " + std::to_string(st.st_gid) + " (mode " + mode_text(st.st_mode) +
           ")";
  }
  return "";
}

// "" when st is owned by this user or root, else whose it is.
std::string foreign_owner(const struct stat &st) {
  const uid_t me = geteuid();
  if (st.st_uid == me || st.st_uid == 0) return "";
  return "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
         std::to_string(me) + ") or root";
}

std::string parent_of(const std::string &p) {
  const size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// Every directory above `real` (an absolute path without symbolic links), up
// to "/": owned by this user or root, and writable by no one else unless
// sticky (like /tmp: others may not rename or remove what is ours there).
// Otherwise someone else could swap the cache directory for their own.
std::string check_ancestors(const std::string &real) {
  std::string up = real;
  while (up != "/") {
    up = parent_of(up);
    struct stat st;
    if (lstat(up.c_str(), &st) != 0) return errno_text("cannot stat", up);
    if (!S_ISDIR(st.st_mode)) return "not a directory (changed while checked): " + up;
    std::string why = foreign_owner(st);
    if (why.empty() && !(st.st_mode & S_ISVTX)) why = others_may_write(st);
    if (!why.empty()) return "a directory above the cache is " + why + ": " + up;
  }
  return "";
}

std::string real_path(const std::string &path, std::string *out) {
  char *r = realpath(path.c_str(), nullptr);
  if (!r) return errno_text("cannot resolve", path);
  *out = r;
  std::free(r);
  return "";
}

// mkdir -p: creates each missing component (mode 0700 as XDG asks of cache
// directories). Returns "" on success, else a description of the failure.
std::string make_dirs(const std::string &dir) {
  std::string path;
  size_t pos = 0;
  while (pos <= dir.size()) {
    size_t next = dir.find('/', pos);
    if (next == std::string::npos) next = dir.size();
    path = dir.substr(0, next);
    pos = next + 1;
    if (path.empty() || path == "." || path == "..") continue;
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_text("cannot create", path);
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return errno_text("cannot stat", dir);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  return "";
}

const char *const kSidecars[] = {"-journal", "-wal", "-shm"};

// SQLite's files beside the database, which it opens by name: when present,
// regular files owned by this user or root, not writable by others (a
// planted hot journal would be rolled back into the database).
std::string check_sidecars(const std::string &db) {
  for (const char *suffix : kSidecars) {
    const std::string p = db + suffix;
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      return errno_text("cannot stat", p);
    }
    std::string why;
    if (S_ISLNK(st.st_mode)) {
      why = "a symbolic link (never followed)";
    } else if (!S_ISREG(st.st_mode)) {
      why = "not a regular file";
    } else if ((why = foreign_owner(st)).empty()) {
      why = others_may_write(st);
    }
    if (!why.empty()) return std::string("kernels.sqlite3") + suffix + " is " + why + ": " + p;
  }
  return "";
}

// The checks of the database file itself on its lstat/fstat.
std::string check_db_stat(const struct stat &st, const std::string &path, bool read_only) {
  std::string why;
  if (S_ISLNK(st.st_mode)) {
    why = "a symbolic link (never followed)";
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else {
    why = foreign_owner(st);
    if (why.empty() && st.st_uid != geteuid() && !read_only) {
      why = "owned by root (this user may only read it)";
    }
    if (why.empty()) why = others_may_write(st);
  }
  return why.empty() ? "" : "kernels.sqlite3 is " + why + ": " + path;
}

// Creates path as an empty regular file of mode 0600 without opening it
// (mknod), so no descriptor of ours can drop another connection's locks; an
// existing path, even a dangling link, is left alone. "" when created or
// present.
std::string create_db_file(const std::string &path) {
  if (mknod(path.c_str(), S_IFREG | 0600, 0) == 0 || errno == EEXIST) return "";
  if (errno != EPERM && errno != ENOSYS && errno != EINVAL) {
    return errno_text("cannot create", path);
  }
  // No mknod for this file system: a new file, closed at once (only a
  // connection that opened it in between could lose its locks).
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return "";
  }
  return errno == EEXIST ? "" : errno_text("cannot create", path);
}

// chmod through an O_PATH descriptor (/proc/self/fd), so a path swapped for
// a link meanwhile is not followed; the path itself where /proc is missing
// (the directory was checked: only this user or root can swap it).
bool chmod_fd(int fd, const std::string &path, mode_t mode) {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if (chmod(proc.c_str(), mode) == 0) return true;
  return errno == ENOENT && chmod(path.c_str(), mode) == 0;
}

}  // namespace

std::string prepare_cache_dir(const std::string &dir_in, TrustedDir *out) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  // New directories are made only below one that passes the rules for the
  // directories above a cache: never inside someone else's directory.
  std::string top = dir;
  struct stat st;
  while (stat(top.c_str(), &st) != 0 && errno == ENOENT && parent_of(top) != top) {
    top = parent_of(top);
  }
  if (top != dir && stat(top.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string real;
    if (std::string why = real_path(top, &real); !why.empty()) return why;
    if (lstat(real.c_str(), &st) != 0) return errno_text("cannot stat", real);
    std::string why = foreign_owner(st);
    if (why.empty() && !(st.st_mode & S_ISVTX)) why = others_may_write(st);
    if (!why.empty()) return "a directory above the cache is " + why + ": " + real;
    if (why = check_ancestors(real); !why.empty()) return why;
  }
  if (std::string why = make_dirs(dir); !why.empty()) return why;

  // The directory itself, with every link resolved: the database is opened
  // through this path, so the links are read only once, here.
  std::string real;
  if (std::string why = real_path(dir, &real); !why.empty()) return why;
  if (lstat(real.c_str(), &st) != 0) return errno_text("cannot stat", real);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  std::string why = foreign_owner(st);
  // Sticky is not enough here: others could still create our journal.
  if (why.empty()) why = others_may_write(st);
  if (!why.empty()) return "cache directory " + why + ": " + real;
  if (why = check_ancestors(real); !why.empty()) return why;
  out->dir = real;
  out->read_only = st.st_uid != geteuid();  // root's, and we are not root
  return "";
}

std::string prepare_cache_file(const std::string &path, bool *read_only) {
  if (std::string why = check_sidecars(path); !why.empty()) return why;
  struct stat st;
  bool created = false;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return errno_text("cannot stat", path);
    if (*read_only) return "read-only cache (owned by root) has no database: " + path;
    if (std::string why = create_db_file(path); !why.empty()) return why;
    created = true;
  }
  const int fd = open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open", path);
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = errno_text("cannot stat", path);
  } else if (st.st_uid != geteuid() && !S_ISLNK(st.st_mode) && foreign_owner(st).empty()) {
    // Root's file, and we are not root: used read-only, if otherwise sound.
    *read_only = true;
  }
  if (why.empty()) why = check_db_stat(st, path, *read_only);
  // New files are 0600 whatever the umask. Another user could hold a lock on
  // a file they may read (and delay our writes), and since only root's
  // caches are shared, a user's own file gains nothing from being readable
  // by others: an older 0644 file is made 0600 too. Root's files keep their
  // mode (a provisioned cache is meant to be read by all).
  const mode_t want = created ? 0600 : (st.st_mode & 0700);
  if (why.empty() && st.st_uid == geteuid() && (created || geteuid() != 0) &&
      (st.st_mode & 07777) != want && !chmod_fd(fd, path, want)) {
    why = errno_text("cannot make private (mode 0600)", path);
  }
  close(fd);  // an O_PATH descriptor: closing it drops no lock
  return why;
}

std::string check_db_file(const std::string &path, bool read_only, FileId *id) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return errno_text("cannot stat", path);
  if (std::string why = check_db_stat(st, path, read_only); !why.empty()) return why;
  if (id->ino != 0 && (st.st_dev != id->dev || st.st_ino != id->ino)) {
    return "kernels.sqlite3 was replaced by another file: " + path;
  }
  id->dev = st.st_dev;
  id->ino = st.st_ino;
  return check_sidecars(path);
}

std::string open_trusted_code_file(const std::string &path, int *fd, std::string *real) {
  *fd = -1;
  if (path.empty() || path[0] != '/') return "not an absolute path: '" + path + "'";
  const size_t slash = path.find_last_of('/');
  const std::string name = path.substr(slash + 1);
  std::string dir;
  if (std::string why = real_path(slash == 0 ? "/" : path.substr(0, slash), &dir); !why.empty())
    return why;
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return errno_text("cannot stat", dir);
  std::string why = foreign_owner(st);
  if (why.empty()) why = others_may_write(st);
  if (!why.empty()) return "the directory of the library is " + why + ": " + dir;
  if (why = check_ancestors(dir); !why.empty()) return why;
  *real = dir == "/" ? "/" + name : dir + "/" + name;
  // O_NOFOLLOW: a link at the path itself is refused (ELOOP), never followed.
  const int f = open(real->c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (f < 0) {
    if (errno == ELOOP) return "a symbolic link (never followed): " + *real;
    return errno_text("cannot open", *real);
  }
  if (fstat(f, &st) != 0) {
    why = errno_text("cannot stat", *real);
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file: " + *real;
  } else if (!(why = foreign_owner(st)).empty() || !(why = others_may_write(st)).empty()) {
    why += ": " + *real;
  }
  if (!why.empty()) {
    close(f);
    return why;
  }
  *fd = f;
  return "";
}

}  // namespace fa::cache
