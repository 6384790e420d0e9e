// A SQLite shim VFS for tests: it wraps the default ("unix") VFS, counts the
// I/O operations SQLite does through it, and can fail chosen ones, so tests
// can check that storage errors never fail a caller (docs/reliability.md,
// promise 7b). It can also cap the bytes written under a directory, which
// makes writes past the cap fail with SQLITE_FULL (a simulated full disk).
//
// Counted operations (one count per call): xOpen, xDelete, xAccess (VFS);
// xRead, xWrite, xTruncate, xSync, xFileSize, xLock, xUnlock,
// xCheckReservedLock (file). Not counted and never failed: xClose,
// xFileControl, xSectorSize, xDeviceCharacteristics and the VFS's
// non-I/O methods (path names, randomness, time, dlopen). Only the
// iVersion 1 file methods are offered, so SQLite uses no WAL, shm or mmap
// through this VFS.
//
// The counters and the armed fault live in a shared anonymous mapping, so a
// process forked after install() counts into, and is failed by, the same
// state as its parent. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace fa::test {

class FaultVfs {
 public:
  enum Op : unsigned {
    kOpen,
    kDelete,
    kAccess,
    kRead,
    kWrite,
    kTruncate,
    kSync,
    kFileSize,
    kLock,
    kUnlock,
    kCheckReservedLock,
    kNumOps
  };
  static constexpr unsigned bit(Op op) { return 1u << op; }
  static constexpr unsigned kAllOps = (1u << kNumOps) - 1;

  // Registers the shim as SQLite's default VFS (idempotent). Every connection
  // opened afterwards with a NULL VFS name goes through it. False when there
  // is no default VFS to wrap or registration failed.
  static bool install();
  // Makes the wrapped VFS the default again (connections already open keep
  // using the shim).
  static void uninstall();

  // Fails the n-th (1-based) operation among those in `ops` counted from now
  // on; with sticky, that one and every later one in `ops`. code 0 picks each
  // operation's natural error (SQLITE_CANTOPEN for xOpen, SQLITE_IOERR_READ
  // for xRead, SQLITE_IOERR_WRITE for xWrite, SQLITE_IOERR_FSYNC for xSync,
  // ...); otherwise every failure returns `code` (e.g. SQLITE_FULL with
  // ops = bit(kWrite)). A failed operation does nothing to the real file; a
  // failed xRead zero-fills its buffer.
  static void arm(uint64_t n, int code, bool sticky, unsigned ops = kAllOps);
  static void disarm();

  // Operations counted since the last reset_counts(), of the kinds in ops.
  static uint64_t op_count(unsigned ops = kAllOps);
  static void reset_counts();
  // Failures returned since the last reset_counts() (armed faults and quota).
  static uint64_t injected();

  // Simulated full disk: a write or truncate that would grow the files
  // directly in `dir` (their st_size summed) past `bytes` fails with
  // SQLITE_FULL. bytes < 0 removes the quota. Set it before forking children.
  static void set_quota(const std::string &dir, int64_t bytes);
  static void clear_quotas();

  // With skip, xSync is still counted (and can be failed) but does not reach
  // the disk: faster sweeps, same behaviour short of a power loss.
  static void set_skip_sync(bool skip);

  static const char *op_name(Op op);
};

}  // namespace fa::test
