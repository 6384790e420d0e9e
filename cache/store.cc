// Store selection: resolves the cache directory, creates and checks it
// (trust.cc), and opens the SQLite store there, or an in-memory store when
// the cache is disabled or the directory or file cannot be used or trusted.
#include <strings.h>
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "cache/store_internal.h"
#include "common/error.h"

namespace fa::cache {

std::string Key::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

int64_t unix_now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

const std::string &host_identity() {
  static const std::string id = [] {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    std::string boot;
    if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char buf[64] = {0};
      if (std::fgets(buf, sizeof buf, f)) boot = buf;
      std::fclose(f);
    }
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    return std::string(host) + "/" + boot;
  }();
  return id;
}

int64_t resolve_max_bytes(const Options &options, std::string *warning) {
  if (options.max_bytes >= 0) return options.max_bytes;
  const char *v = std::getenv("FLASHATTN_CACHE_MAX_BYTES");
  if (!v || !v[0]) return kDefaultMaxBytes;
  errno = 0;
  char *end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  int shift = 0;
  if (end && (*end == 'k' || *end == 'K')) shift = 10;
  if (end && (*end == 'm' || *end == 'M')) shift = 20;
  if (end && (*end == 'g' || *end == 'G')) shift = 30;
  if (shift) ++end;
  if (errno != 0 || end == v || *end != 0 || v[0] == '-' ||
      n > (static_cast<unsigned long long>(INT64_MAX) >> shift)) {
    if (warning) {
      *warning = std::string("ignoring FLASHATTN_CACHE_MAX_BYTES=") + v +
                 " (want bytes, optionally with K, M or G); using 1G";
    }
    return kDefaultMaxBytes;
  }
  return static_cast<int64_t>(n << shift);
}

void key_to_bytes(const Key &key, uint8_t out[16]) {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(key.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<uint8_t>(key.lo >> (56 - 8 * i));
  }
}

std::string bytes_to_hex(const uint8_t *bytes, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[bytes[i] >> 4];
    s[2 * i + 1] = digits[bytes[i] & 15];
  }
  return s;
}

Hash hash_bytes(const void *p, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(n ? p : "", n));
  Hash h;
  std::memcpy(h.b, c.digest, 16);
  return h;
}

Key key_of_bytes(const std::string &bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  Key key;
  key.hi = h.high64;
  key.lo = h.low64;
  return key;
}

namespace {

const char *env(const char *name) {
  const char *v = std::getenv(name);
  return v && v[0] ? v : nullptr;
}

// FLASHATTN_CACHE_DISABLE=1 (also true/yes/on) turns the disk cache off.
bool disabled_by_env() {
  const char *v = env("FLASHATTN_CACHE_DISABLE");
  if (!v) return false;
  return !std::strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
         !strcasecmp(v, "on");
}

// The cache directory from options.dir, then $FLASHATTN_CACHE_DIR, then
// $XDG_CACHE_HOME/flashattn (absolute paths only, as the XDG spec asks), then
// $HOME/.cache/flashattn. "" when none is set.
std::string resolve_dir(const Options &options) {
  if (!options.dir.empty()) return options.dir;
  if (const char *d = env("FLASHATTN_CACHE_DIR")) return d;
  if (const char *x = env("XDG_CACHE_HOME"); x && x[0] == '/') {
    return std::string(x) + "/flashattn";
  }
  if (const char *h = env("HOME")) return std::string(h) + "/.cache/flashattn";
  return "";
}

std::unique_ptr<Store> memory_fallback(const std::string &why) {
  const std::string note = "kernel cache in memory only: " + why;
  fa::warn(note);
  return std::make_unique<MemoryStore>(note);
}

}  // namespace

std::unique_ptr<Store> open_store(const Options &options) {
  if (options.memory_only) {
    return std::make_unique<MemoryStore>("memory only (requested by options)");
  }
  if (disabled_by_env()) {
    return std::make_unique<MemoryStore>("disabled by FLASHATTN_CACHE_DISABLE");
  }
  const std::string dir = resolve_dir(options);
  if (dir.empty()) {
    return memory_fallback("no cache directory (FLASHATTN_CACHE_DIR, XDG_CACHE_HOME, HOME unset)");
  }
  // The trust checks come first: nothing is created or opened in a
  // directory that fails them.
  TrustedDir trusted;
  if (std::string err = prepare_cache_dir(dir, &trusted); !err.empty()) {
    return memory_fallback(err);
  }
  const std::string path = trusted.dir + "/kernels.sqlite3";
  bool read_only = trusted.read_only;
  if (std::string err = prepare_cache_file(path, &read_only); !err.empty()) {
    return memory_fallback(err);
  }
  std::string why, warning;
  SqliteSettings settings;
  settings.max_bytes = resolve_max_bytes(options, &warning);
  if (!warning.empty()) fa::warn(warning);
  if (options.lease_ttl_ms > 0) settings.lease_ttl_ms = options.lease_ttl_ms;
  if (options.lease_wait_ms > 0) settings.lease_wait_ms = options.lease_wait_ms;
  settings.read_only = read_only;
  if (auto store = open_sqlite_store(path, settings, &why)) return store;
  return memory_fallback(path + ": " + why);
}

}  // namespace fa::cache
