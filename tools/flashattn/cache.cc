// `flashattn cache stats|list|clear`, on an emulator runtime so they work
// without a GPU (the store is the same file for every backend).
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "util.h"

namespace fa::cli {
namespace {

// "2025-01-31 12:34:56 UTC", or "never" for 0.
std::string format_time(int64_t unix_seconds) {
  if (unix_seconds <= 0) return "never";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) return std::to_string(unix_seconds);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Rows per compiler (fa_cache_entry.compiler), in first-seen order.
struct CompilerCounts {
  std::vector<std::pair<std::string, uint64_t>> rows;
};

int count_compiler(const fa_cache_entry *e, void *user) {
  auto *c = static_cast<CompilerCounts *>(user);
  const std::string name = e->compiler && e->compiler[0] ? e->compiler : "(none: emulator or pre-0.6 row)";
  for (auto &r : c->rows) {
    if (r.first == name) {
      ++r.second;
      return 0;
    }
  }
  c->rows.emplace_back(name, 1);
  return 0;
}

void print_stats(const fa_cache_stats &s, const CompilerCounts &counts) {
  std::printf("path:        %s\n", s.path[0] ? s.path : "(none)");
  std::printf("storage:     %s\n", s.persistent ? "persistent (on disk)" : "memory only");
  if (s.note[0]) std::printf("note:        %s\n", s.note);
  std::printf("entries:     %" PRIu64 "\n", s.entries);
  std::printf("bytes:       %" PRIu64 "\n", s.bytes);
  if (s.max_bytes) {
    std::printf("size cap:    %" PRIu64 " bytes (FLASHATTN_CACHE_MAX_BYTES)\n", s.max_bytes);
  } else {
    std::printf("size cap:    none\n");
  }
  std::printf("counters:    memory hits %" PRIu64 ", disk hits %" PRIu64 ", misses %" PRIu64
              ", compiles %" PRIu64 ", discarded %" PRIu64 ", resets %" PRIu64 " (this process)\n",
              s.memory_hits, s.disk_hits, s.misses, s.compiles, s.discarded, s.resets);
  const char *mode = s.compiler_mode == FA_COMPILER_PLUGIN       ? "PTX compiler plugin"
                     : s.compiler_mode == FA_COMPILER_DRIVER_JIT ? "driver JIT"
                                                                 : "none (emulator)";
  std::printf("compiler:    %s%s%s\n", mode, s.compiler[0] ? ": " : "", s.compiler);
  if (s.compiler_note[0]) std::printf("             %s\n", s.compiler_note);
  std::printf("rows by compiler:%s\n", counts.rows.empty() ? " none" : "");
  for (const auto &r : counts.rows) {
    std::printf("  %" PRIu64 "  %s\n", r.second, r.first.c_str());
  }
}

struct ListState {
  uint64_t count = 0;
};

int print_entry(const fa_cache_entry *e, void *user) {
  std::string spec = e->spec ? e->spec : "";
  for (char &c : spec) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  char key[sizeof(e->key) + 1] = {0};
  std::snprintf(key, sizeof(key), "%.32s", e->key);
  std::printf("%s  %s  sm_%d  ptx %" PRIu64 " B, cubin %" PRIu64 " B  hits %" PRIu64
              "  last used %s  compiler %s\n",
              key, spec.c_str(), e->sm, e->ptx_bytes, e->cubin_bytes, e->hits,
              format_time(e->last_used).c_str(),
              e->compiler && e->compiler[0] ? e->compiler : "(none)");
  ++static_cast<ListState *>(user)->count;
  return 0;
}

}  // namespace

int cmd_cache(const CacheOptions &o) {
  const Runtime rt(FA_BACKEND_EMULATOR, o.cache_dir.empty() ? nullptr : o.cache_dir.c_str());
  if (o.action == "stats") {
    CompilerCounts counts;
    check(fa_cache_list(rt.get(), count_compiler, &counts), "fa_cache_list");
    print_stats(rt.cache_stats(), counts);
    return kExitOk;
  }
  if (o.action == "list") {
    ListState st;
    check(fa_cache_list(rt.get(), print_entry, &st), "fa_cache_list");
    std::printf("%" PRIu64 " kernel%s\n", st.count, st.count == 1 ? "" : "s");
    return kExitOk;
  }
  if (o.action == "clear") {
    const fa_cache_stats before = rt.cache_stats();
    check(fa_cache_clear(rt.get()), "fa_cache_clear");
    const fa_cache_stats after = rt.cache_stats();
    std::printf("cleared %" PRIu64 " kernel%s (%" PRIu64 " bytes) from %s\n",
                before.entries - after.entries, before.entries - after.entries == 1 ? "" : "s",
                before.bytes - after.bytes, before.path[0] ? before.path : "the memory cache");
    return kExitOk;
  }
  throw Failure(kExitUsage, "unknown cache action '" + o.action + "' (stats, list or clear)");
}

}  // namespace fa::cli
