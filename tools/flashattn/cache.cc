// `flashattn cache stats|list|clear`, on an emulator runtime so they work
// without a GPU (the store is the same file for every backend); `cache warm`
// and `cache presets` (fa_cache_warm), which need no runtime at all.
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
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
  if (s.kernel_store[0]) {
    std::printf("kernel store: %s (second tier)\n", s.kernel_store);
    std::printf("             remote hits %" PRIu64 ", misses %" PRIu64 ", puts %" PRIu64
                ", errors %" PRIu64 ", discarded %" PRIu64 " (this process)\n",
                s.remote_hits, s.remote_misses, s.remote_puts, s.remote_errors,
                s.remote_discarded);
  } else {
    std::printf("kernel store: none (FLASHATTN_KERNEL_STORE unset)\n");
  }
  if (s.kernel_store_note[0]) std::printf("             %s\n", s.kernel_store_note);
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

// "80,86,90a,sm_100a" -> {80, 86, 90, 100}: an "sm_" prefix and an "a" or
// "f" suffix are accepted (the kernels choose the arch-specific target).
std::vector<int32_t> parse_sms(const std::string &list) {
  std::vector<int32_t> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::string digits = item.compare(0, 3, "sm_") == 0 ? item.substr(3) : item;
    if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.pop_back();
    const bool ok = !digits.empty() && digits.size() <= 4 &&
                    digits.find_first_not_of("0123456789") == std::string::npos;
    if (!ok) throw Failure(kExitUsage, "--sm: '" + item + "' is not an SM (80, 90a, sm_100a, ...)");
    out.push_back(std::stoi(digits));
  }
  if (out.empty()) throw Failure(kExitUsage, "--sm names no SM");
  return out;
}

// Progress on stderr: a line rewritten in place on a terminal; else a line
// at every tenth of the work.
struct WarmReport {
  bool tty = isatty(2) != 0;
  uint64_t next_tenth = 1;
};

void print_progress(const fa_cache_warm_progress *p, void *user) {
  auto *r = static_cast<WarmReport *>(user);
  const double rate = p->seconds > 0 ? double(p->done) / p->seconds : 0;
  if (r->tty) {
    std::fprintf(stderr,
                 "\r[%" PRIu64 "/%" PRIu64 "] %.1f kernels/s, built %" PRIu64 ", present %" PRIu64
                 "  sm_%d %.60s\033[K",
                 p->done, p->total, rate, p->built, p->present, p->sm, p->spec);
    if (p->done == p->total) std::fprintf(stderr, "\n");
  } else if (p->done * 10 >= r->next_tenth * p->total) {
    while (p->done * 10 >= r->next_tenth * p->total) ++r->next_tenth;
    std::fprintf(stderr,
                 "[%" PRIu64 "/%" PRIu64 "] %.1f kernels/s, built %" PRIu64 ", present %" PRIu64
                 "\n",
                 p->done, p->total, rate, p->built, p->present);
  }
}

int cmd_warm(const CacheOptions &o) {
  if (o.presets.empty() && o.spec_file.empty()) {
    throw Failure(kExitUsage, "name kernels with --preset, --spec or both");
  }
  const std::vector<int32_t> sms = parse_sms(o.sms);
  std::string specs;
  if (!o.spec_file.empty()) {
    std::ifstream in(o.spec_file);
    if (!in) throw Failure(kExitUsage, "--spec: cannot read " + o.spec_file);
    std::ostringstream text;
    text << in.rdbuf();
    specs = text.str();
  }
  fa_cache_warm_options w = FA_CACHE_WARM_OPTIONS_INIT;
  w.cache_dir = o.cache_dir.empty() ? nullptr : o.cache_dir.c_str();
  w.sms = sms.data();
  w.num_sms = static_cast<int32_t>(sms.size());
  w.jobs = o.jobs;
  w.presets = o.presets.empty() ? nullptr : o.presets.c_str();
  w.specs = o.spec_file.empty() ? nullptr : specs.c_str();
  w.ptx_compiler = o.ptx_only ? FA_PTX_COMPILER_OFF : FA_PTX_COMPILER_AUTO;
  WarmReport report;
  w.progress = print_progress;
  w.user = &report;
  fa_cache_warm_progress r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  const fa_status st = fa_cache_warm(&w, &r);
  if (st == FA_ERROR_INVALID_ARGUMENT || st == FA_ERROR_UNSUPPORTED) {
    check(st, "fa_cache_warm", kExitUsage);  // an option, preset or spec line
  }
  if (st != FA_SUCCESS && st != FA_ERROR_COMPILE) check(st, "fa_cache_warm");
  std::printf("warmed %" PRIu64 " kernel%s in %.1f s: built %" PRIu64 " (%" PRIu64
              " bytes), already present %" PRIu64 ", failed %" PRIu64 ", skipped %" PRIu64
              " (not for that SM)\n",
              r.total, r.total == 1 ? "" : "s", r.seconds, r.built, r.bytes, r.present, r.failed,
              r.skipped);
  std::printf("binaries: %s\n",
              r.compiler[0] ? r.compiler
                            : "none (PTX rows: the GPU's driver JIT-compiles them on first use)");
  check(st, "fa_cache_warm");
  return kExitOk;
}

int cmd_presets(const CacheOptions &o) {
  if (o.preset.empty()) {
    std::fputs(fa_cache_warm_presets(), stdout);
    return kExitOk;
  }
  const char *text = fa_cache_warm_preset(o.preset.c_str());
  if (text == nullptr) throw Failure(kExitUsage, fa_last_error());
  std::fputs(text, stdout);
  return kExitOk;
}

}  // namespace

int cmd_cache(const CacheOptions &o) {
  if (o.action == "warm") return cmd_warm(o);
  if (o.action == "presets") return cmd_presets(o);
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
  throw Failure(kExitUsage,
                "unknown cache action '" + o.action + "' (stats, list, clear, warm or presets)");
}

}  // namespace fa::cli
