// Offline cache warming (issue 25 item 3): fa_cache_warm and
// `flashattn cache warm` fill a cache with no GPU, and a runtime on the
// warmed SM then builds nothing.
// - bad options and spec lines: clear statuses naming the argument, line and
//   key; an unusable cache directory is FA_ERROR_CACHE;
// - every preset expands on every SM (PTX rows), kernels an SM cannot run
//   skipped and counted;
// - warm, then an emulator runtime at sm_80 and sm_90 (another runtime,
//   same cache) runs a forward and a split decode with 0 misses and 0
//   compiles, outputs (poisoned first) bitwise those of a runtime that built
//   its own kernels; a second warm finds every row present;
// - the program: `cache warm` with the PTX compiler plugin (when built),
//   then `flashattn run` / `decode` in a process with a fresh HOME whose only
//   cache is the warmed one: PASS against the fp64 reference, 0 compiles;
//   every row's binary a cubin of the plugin.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>  // before cmocka (small_problem.h): its fail() macro
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "support/small_problem.h"

// Last: it includes cmocka.
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

// The kernels SmallProblem runs: forward, decode and its combine.
constexpr const char *kSmallSpecs =
    "# SmallProblem: fp16, head_dim 64, 2 heads\n"
    "forward dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2\n"
    "decode  dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2   # contiguous\n"
    "reduce dtype=fp16 head_dim=64\n";

std::string fresh_dir(const std::string &name) {
  const std::string d = path_of(name);
  std::system(("rm -rf '" + d + "'").c_str());
  assert_int_equal(mkdir(d.c_str(), 0700), 0);
  return d;
}

fa_status warm(const char *dir, std::vector<int32_t> sms, const char *presets, const char *specs,
               fa_cache_warm_progress *r, int64_t ptx_compiler = FA_PTX_COMPILER_OFF) {
  fa_cache_warm_options o = FA_CACHE_WARM_OPTIONS_INIT;
  o.cache_dir = dir;
  o.sms = sms.data();
  o.num_sms = static_cast<int32_t>(sms.size());
  o.presets = presets;
  o.specs = specs;
  o.ptx_compiler = ptx_compiler;
  o.jobs = 2;
  std::memset(r, 0xAB, sizeof *r);  // poisoned: every count must be written
  r->struct_size = sizeof *r;
  return fa_cache_warm(&o, r);
}

void expect_error(fa_status got, fa_status want, std::vector<const char *> words) {
  if (got != want) std::fprintf(stderr, "status %d, want %d: %s\n", got, want, fa_last_error());
  assert_int_equal(got, want);
  for (const char *w : words) {
    if (std::strstr(fa_last_error(), w) == nullptr) {
      std::fprintf(stderr, "'%s' lacks '%s'\n", fa_last_error(), w);
      fail();
    }
  }
}

void test_bad_options(void **) {
  const std::string dir = fresh_dir("bad");
  fa_cache_warm_progress r;
  expect_error(fa_cache_warm(nullptr, &r), FA_ERROR_INVALID_ARGUMENT, {"options is NULL"});
  fa_cache_warm_options o = FA_CACHE_WARM_OPTIONS_INIT;
  o.struct_size -= 8;
  expect_error(fa_cache_warm(&o, nullptr), FA_ERROR_INVALID_ARGUMENT, {"options.struct_size"});
  expect_error(warm(dir.c_str(), {}, "gpt-oss", nullptr, &r), FA_ERROR_INVALID_ARGUMENT,
               {"sms must name at least one SM"});
  expect_error(warm(dir.c_str(), {80, 75}, "gpt-oss", nullptr, &r), FA_ERROR_UNSUPPORTED,
               {"sms[1]", "got 75"});
  expect_error(warm(dir.c_str(), {80}, nullptr, nullptr, &r), FA_ERROR_INVALID_ARGUMENT,
               {"neither presets nor specs"});
  expect_error(warm(dir.c_str(), {80}, "llama-3-8b,llama-9", nullptr, &r),
               FA_ERROR_INVALID_ARGUMENT, {"unknown preset 'llama-9'", "gpt-oss:"});
  // Spec lines: the line and the key are named.
  const struct {
    const char *specs;
    std::vector<const char *> words;
  } kBad[] = {
      {"\n\nbackward dtype=fp16 head_dim=64", {"specs line 3", "forward, decode or reduce"}},
      {"forward dtype=fp16 head_dim=64 heads=4", {"specs line 1", "unknown key 'heads'"}},
      {"forward dtype=fp16 head_dim", {"'head_dim' is not key=value"}},
      {"forward dtype=fp15 head_dim=64", {"'fp15' is not a value of dtype"}},
      {"forward dtype=fp16 head_dim=64,6x", {"'6x' is not a value of head_dim"}},
      {"forward dtype=fp16 head_dim=64 head_dim=128", {"'head_dim' given twice"}},
      {"forward dtype=fp16 head_dim=64 num_heads_q=0", {"specs line 1", "num_heads_q"}},
      {"decode dtype=fp16 head_dim=64 num_heads_q=3 num_heads_kv=2", {"specs line 1", "num_heads"}},
      {"decode dtype=fp16 head_dim=64 page_size=16",
       {"specs line 1", "page_size is for FA_KV_PAGED"}},
      {"reduce dtype=fp16 head_dim=64 varlen=1", {"specs line 1", "varlen"}},
      {"decode dtype=fp16 head_dim=64 sinks=1", {"specs line 1", "sinks is for"}},
  };
  for (const auto &b : kBad) {
    expect_error(warm(dir.c_str(), {80}, nullptr, b.specs, &r), FA_ERROR_INVALID_ARGUMENT, b.words);
  }
  expect_error(warm(dir.c_str(), {80}, nullptr, "forward dtype=fp16 head_dim=60", &r),
               FA_ERROR_UNSUPPORTED, {"specs line 1", "head_dim must be a multiple of 8"});
  // An unknown preset name through fa_cache_warm_preset.
  assert_null(fa_cache_warm_preset("nope"));
  assert_non_null(std::strstr(fa_last_error(), "unknown preset 'nope'"));
  assert_null(fa_cache_warm_preset(nullptr));
  // Nothing was written by any of them.
  struct stat st;
  assert_int_not_equal(stat((dir + "/kernels.sqlite3").c_str(), &st), 0);
}

// A directory others may write is not a cache anyone should run code from:
// nothing is warmed (no silent memory store).
void test_untrusted_dir(void **) {
  const std::string dir = fresh_dir("open");
  assert_int_equal(chmod(dir.c_str(), 0777), 0);
  fa_cache_warm_progress r;
  expect_error(warm(dir.c_str(), {80}, nullptr, kSmallSpecs, &r), FA_ERROR_CACHE,
               {"cannot be written", "writable"});
}

// Every preset on every SM: the listing names them all, each expands, the
// kernels an SM cannot run (fp8 KV below sm_89) are skipped, not failed.
void test_presets(void **) {
  std::string list = fa_cache_warm_presets();
  std::vector<std::string> names;
  for (size_t at = 0; at < list.size();) {
    const size_t colon = list.find(':', at), nl = list.find('\n', at);
    assert_true(colon < nl && nl != std::string::npos);
    names.push_back(list.substr(at, colon - at));
    at = nl + 1;
  }
  assert_true(names.size() >= 9);
  std::string all;
  for (const std::string &n : names) {
    const char *text = fa_cache_warm_preset(n.c_str());
    assert_non_null(text);
    assert_non_null(std::strstr(text, "forward "));
    assert_non_null(std::strstr(text, "decode "));
    assert_non_null(std::strstr(text, "reduce "));
    all += (all.empty() ? "" : ",") + n;
  }
  const std::string dir = fresh_dir("presets");
  fa_cache_warm_progress r;
  assert_int_equal(warm(dir.c_str(), {86, 89}, all.c_str(), nullptr, &r), FA_SUCCESS);
  std::printf("presets x {86, 89}: %llu kernels, %llu skipped, %llu bytes, %.1f s\n",
              (unsigned long long)r.total, (unsigned long long)r.skipped,
              (unsigned long long)r.bytes, r.seconds);
  assert_true(r.total > 40);
  assert_int_equal(r.done, r.total);
  assert_int_equal(r.built, r.total);
  assert_int_equal(r.present, 0);
  assert_int_equal(r.failed, 0);
  assert_true(r.skipped > 0);  // the fp8 KV decode on sm_86
  assert_null(r.spec);
  assert_string_equal(r.compiler, "");  // PTX rows
}

struct Outputs {
  std::vector<uint8_t> fwd, dec;
};

// SmallProblem's forward and split decode on an emulator runtime at `sm`
// over `cache` (nullptr: memory only); the cache counters after them.
Outputs run_small(int sm, const char *cache, fa_cache_stats *cs) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.emulator_sm = sm;
  o.cache_dir = cache;
  o.cache_mode = cache ? FA_CACHE_DISK : FA_CACHE_MEMORY;
  fa_runtime *rt = nullptr;
  assert_int_equal(fa_runtime_create(&o, &rt), FA_SUCCESS);
  Outputs out;
  {
    fa::test::SmallProblem p(rt);
    p.set_heads(0, 0);
    p.poison_and_read(true);
    const fa_forward_args f = p.fwd();
    assert_int_equal(fa_launch(rt, p.cfg, &f, nullptr), FA_SUCCESS);
    out.fwd = p.poison_and_read(false);
    p.poison_and_read(true);
    const fa_decode_args d = p.dec();
    assert_int_equal(fa_decode(rt, p.cfg, &d, nullptr), FA_SUCCESS);
    out.dec = p.poison_and_read(false);
  }
  *cs = FA_CACHE_STATS_INIT;
  assert_int_equal(fa_cache_stats_get(rt, cs), FA_SUCCESS);
  fa_runtime_destroy(rt);
  return out;
}

void test_warm_then_run(void **) {
  const std::string dir = fresh_dir("small");
  fa_cache_warm_progress r;
  assert_int_equal(warm(dir.c_str(), {80, 90}, nullptr, kSmallSpecs, &r), FA_SUCCESS);
  assert_int_equal(r.total, 6);  // 3 kernels x 2 SMs
  assert_int_equal(r.built, 6);
  assert_int_equal(r.skipped, 0);
  assert_true(r.bytes > 0);
  for (int sm : {80, 90}) {
    fa_cache_stats warm_cs, own_cs;
    const Outputs warmed = run_small(sm, dir.c_str(), &warm_cs);
    std::printf("sm_%d on the warmed cache: misses %llu, disk hits %llu, compiles %llu\n", sm,
                (unsigned long long)warm_cs.misses, (unsigned long long)warm_cs.disk_hits,
                (unsigned long long)warm_cs.compiles);
    assert_int_equal(warm_cs.persistent, 1);
    assert_int_equal(warm_cs.misses, 0);
    assert_int_equal(warm_cs.compiles, 0);
    assert_int_equal(warm_cs.disk_hits, 3);
    const Outputs own = run_small(sm, nullptr, &own_cs);
    assert_int_equal(own_cs.misses, 3);  // the control built them
    assert_true(warmed.fwd == own.fwd);
    assert_true(warmed.dec == own.dec);
  }
  // Warming again writes nothing; another SM's rows are added beside.
  assert_int_equal(warm(dir.c_str(), {90, 80, 120}, nullptr, kSmallSpecs, &r), FA_SUCCESS);
  assert_int_equal(r.total, 9);
  assert_int_equal(r.present, 6);
  assert_int_equal(r.built, 3);
}

// Progress: once per kernel, on this thread, in order of completion,
// counts consistent, the last equal to the result.
struct ProgressLog {
  std::vector<fa_cache_warm_progress> calls;
  std::vector<std::string> specs;
};
void log_progress(const fa_cache_warm_progress *p, void *user) {
  auto *log = static_cast<ProgressLog *>(user);
  log->calls.push_back(*p);
  log->specs.push_back(p->spec ? p->spec : "(null)");
}

void test_progress(void **) {
  const std::string dir = fresh_dir("progress");
  ProgressLog log;
  fa_cache_warm_options o = FA_CACHE_WARM_OPTIONS_INIT;
  const int32_t sms[] = {80, 89};
  o.cache_dir = dir.c_str();
  o.sms = sms;
  o.num_sms = 2;
  o.specs = kSmallSpecs;
  o.ptx_compiler = FA_PTX_COMPILER_OFF;
  o.progress = log_progress;
  o.user = &log;
  fa_cache_warm_progress r = {};
  r.struct_size = sizeof r;
  assert_int_equal(fa_cache_warm(&o, &r), FA_SUCCESS);
  assert_int_equal(log.calls.size(), r.total);
  for (size_t i = 0; i < log.calls.size(); ++i) {
    const fa_cache_warm_progress &p = log.calls[i];
    assert_int_equal(p.done, i + 1);
    assert_int_equal(p.built + p.present + p.failed, p.done);
    assert_true(p.sm == 80 || p.sm == 89);
    assert_true(log.specs[i].find("d64") != std::string::npos ||
                log.specs[i].find("reduce") != std::string::npos);
  }
  assert_int_equal(log.calls.back().built, r.built);
  assert_int_equal(log.calls.back().bytes, r.bytes);
}

// The program, in processes of their own: warm (with the PTX compiler
// plugin when it was built), then run and decode with a fresh HOME whose
// only cache is the warmed one.
void test_cli_warm_other_machine(void **) {
  skip_without_cli();
  const std::string plugin = FA_PTXC_PLUGIN_PATH;
  if (!plugin.empty()) setenv("FLASHATTN_PTX_COMPILER", plugin.c_str(), 1);
  const std::string cache = fresh_dir("cli_cache");
  {
    FILE *f = std::fopen(path_of("specs.txt").c_str(), "w");
    assert_non_null(f);
    std::fputs(
        "forward dtype=fp16 head_dim=64 num_heads_q=4 num_heads_kv=2\n"
        "decode dtype=fp16 head_dim=64 num_heads_q=4 num_heads_kv=2 kv_layout=paged "
        "page_size=16\nreduce dtype=fp16 head_dim=64\n",
        f);
    std::fclose(f);
  }
  const std::vector<std::string> w = {
      "cache",       "warm", "--sm", "80,sm_90a", "--spec", path_of("specs.txt"),
      "--cache-dir", cache,  "-j",   "2"};
  Result r = run_cli(w);
  expect(r.exited && r.code == 0 && contains(r.out, "warmed 6 kernels") &&
             contains(r.out, "built 6") && contains(r.err, "[6/6]"),
         w, r, "cache warm");
  if (!plugin.empty()) {
    expect(contains(r.out, "binaries: nvPTXCompiler"), w, r, "cubins by the plugin");
  }
  r = run_cli(w);
  expect(r.exited && r.code == 0 && contains(r.out, "already present 6"), w, r, "warm again");
  // Usage errors: exit 2, the message names what is wrong.
  {
    FILE *f = std::fopen(path_of("bad.txt").c_str(), "w");
    assert_non_null(f);
    std::fputs("forward dtype=fp16 head_dim=64\ndecode dtype=fp16 head_dim=64 heads=2\n", f);
    std::fclose(f);
  }
  const std::vector<std::vector<std::string>> bad = {
      {"cache", "warm", "--sm", "80", "--spec", path_of("bad.txt"), "--cache-dir", cache},
      {"cache", "warm", "--sm", "80", "--preset", "llama-9", "--cache-dir", cache},
      {"cache", "warm", "--sm", "80,9x", "--preset", "gpt-oss", "--cache-dir", cache},
      {"cache", "warm", "--sm", "75", "--preset", "gpt-oss", "--cache-dir", cache},
      {"cache", "warm", "--sm", "80", "--cache-dir", cache},
      {"cache", "presets", "llama-9"}};
  const char *const why[] = {"specs line 2: unknown key 'heads'",
                             "unknown preset 'llama-9'",
                             "'9x' is not an SM",
                             "sms[0] must be one of",
                             "--preset, --spec",
                             "unknown preset 'llama-9'"};
  for (size_t i = 0; i < bad.size(); ++i) {
    r = run_cli(bad[i]);
    expect(r.exited && r.code == 2 && contains(r.err, why[i]), bad[i], r, why[i]);
  }
  const std::vector<std::string> list = {"cache", "list", "--cache-dir", cache};
  r = run_cli(list);
  expect(r.exited && r.code == 0 && contains(r.out, "6 kernels"), list, r, "cache list");
  if (!plugin.empty()) {
    // Every row's binary is the plugin's cubin, for its exact target.
    size_t rows = 0;
    for (size_t at = r.out.find("compiler nvPTXCompiler"); at != std::string::npos;
         at = r.out.find("compiler nvPTXCompiler", at + 1)) {
      ++rows;
    }
    expect(rows == 6, list, r, "6 rows built by the plugin");
  }
  // "Another machine": a fresh HOME, no XDG cache, the warmed directory as
  // its cache, the plugin off (that machine has none: driver-JIT mode
  // would load the cubins as they are; the emulator runs the PTX).
  const std::string home = fresh_dir("home");
  setenv("HOME", home.c_str(), 1);
  unsetenv("XDG_CACHE_HOME");
  setenv("FLASHATTN_CACHE_DIR", cache.c_str(), 1);
  setenv("FLASHATTN_PTX_COMPILER", "off", 1);
  const std::vector<int32_t> lens = {70, 33};
  write_qkv(5, 2, 7, 70, 4, 2, 64, &lens);
  for (const char *sm : {"80", "90"}) {
    setenv("FLASHATTN_EMU_SM", sm, 1);
    const std::vector<std::string> run = emulator_run_args({"--causal"});
    r = run_cli(run);
    expect(r.exited && r.code == 0 && contains(r.out, "PASS") &&
               contains(r.out, "misses 0, compiles 0"),
           run, r, "run on the warmed cache");
    const std::vector<std::string> dec = emulator_decode_args(
        {"--kv-layout", "paged", "--page-size", "16", "--num-splits", "2"});
    r = run_cli(dec);
    expect(r.exited && r.code == 0 && contains(r.out, "PASS") &&
               contains(r.out, "misses 0, compiles 0"),
           dec, r, "decode on the warmed cache");
  }
  unsetenv("FLASHATTN_EMU_SM");
  unsetenv("FLASHATTN_PTX_COMPILER");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options), cmocka_unit_test(test_untrusted_dir),
      cmocka_unit_test(test_presets),     cmocka_unit_test(test_warm_then_run),
      cmocka_unit_test(test_progress),    cmocka_unit_test(test_cli_warm_other_machine),
  };
  return run_cli_suite("test_cache_warm", tests);
}
