// The emulator's memory counters (emu/profile.h, fa_emulator_profile;
// docs/emulator.md "Memory counters"):
//  - the counting rules on hand-written PTX run through the emulator backend:
//    global sectors and bytes used per warp request (coalesced, strided,
//    broadcast, misaligned, vectors, stores, cp.async with and without
//    zero-fill, guarded-off lanes, loops, several warps), shared-memory
//    wavefronts and bank conflicts for every access width (phases of 32, 16
//    and 8 lanes), broadcasts, ldmatrix x1/x2/x4 (.trans) with a conflicted
//    and a padded pitch, cp.async's shared side; the main loop found from the
//    branches (innermost loops holding mma.sync, else global loads);
//  - the C API: errors, and the properties the kernels promise, on the real
//    decode (fa_decode) and forward (fa_launch) kernels at head_dim 64 and
//    128, fp16, GQA, dense contiguous and paged (page_size 16 and 8)
//    caches: in the main loop, the K/V loads (cp.async) use >= 95% of the
//    sectors they touch and shared memory has no bank conflict.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/numeric.h"
#include "emu/profile.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using fa::emu::LaunchProfile;
using fa::emu::MemCounters;
using namespace fa::test;

int setup(void **state) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  return emu_setup(state);
}

// ------------------------------------------------------------ the rules ----

// One access per lane at a lane-linear address: global base + imm +
// lane * stride (%rd3) and shared smem + lane * stride (%r4). `body` is
// the access (and whatever it needs); %r5 = 0 is a store value.
std::string probe(uint32_t stride, const std::string &body) {
  return std::string(kHeader) + R"(
.visible .entry k_probe(.param .align 8 .b8 k_probe_param[8])
{
  .reg .b32 %r<20>;
  .reg .b64 %rd<8>;
  .reg .pred %p<4>;
  .reg .f32 %f<12>;
  .shared .align 128 .b8 smem[8192];
  ld.param.u64 %rd1, [k_probe_param+0];
  mov.u32 %r1, %tid.x;
  and.b32 %r9, %r1, 31;
  mul.lo.u32 %r2, %r9, )" +
         std::to_string(stride) + R"(;
  cvt.u64.u32 %rd2, %r2;
  add.s64 %rd3, %rd1, %rd2;
  mov.u32 %r3, smem;
  add.u32 %r4, %r3, %r2;
  mov.u32 %r5, 0;
)" + body +
         R"(
  exit;
}
)";
}

// Runs ptx on `threads` threads over a fresh 8 KB global buffer and returns
// the launch's profile.
LaunchProfile run_probe(const std::string &ptx, uint32_t threads = 32) {
  DevBuf buf(8192);
  uint64_t prm = buf.ptr;
  fa_status st = run_ptx(ptx, "k_probe", geom(1, threads), &prm, sizeof prm);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n%s", fa::last_error(), ptx.c_str());
  assert_int_equal(st, FA_SUCCESS);
  LaunchProfile p;
  assert_int_equal(g_be->last_profile(&p), FA_SUCCESS);
  return p;
}

struct Global {
  uint64_t requests, sectors, bytes;
};
struct Shared {
  uint64_t requests, wavefronts, conflicts;
};

void expect_global(const char *what, const MemCounters &c, bool store, Global want,
                   bool async = false) {
  const uint64_t r = store ? c.global_store_requests : c.global_load_requests;
  const uint64_t s = store ? c.global_store_sectors : c.global_load_sectors;
  const uint64_t b = store ? c.global_store_bytes : c.global_load_bytes;
  const uint64_t other = store ? c.global_load_requests : c.global_store_requests;
  // Every load in these kernels is an ld.global or, when async, a cp.async.
  const bool async_ok =
      async ? (c.cp_async_requests == r && c.cp_async_sectors == s && c.cp_async_bytes == b)
            : c.cp_async_requests + c.cp_async_sectors + c.cp_async_bytes == 0;
  if (r != want.requests || s != want.sectors || b != want.bytes || other != 0 || !async_ok) {
    std::fprintf(stderr,
                 "%s: %s requests %llu sectors %llu bytes %llu (other kind %llu, cp.async %llu "
                 "%llu %llu); want %llu %llu %llu\n",
                 what, store ? "store" : "load", (unsigned long long)r, (unsigned long long)s,
                 (unsigned long long)b, (unsigned long long)other,
                 (unsigned long long)c.cp_async_requests, (unsigned long long)c.cp_async_sectors,
                 (unsigned long long)c.cp_async_bytes, (unsigned long long)want.requests,
                 (unsigned long long)want.sectors, (unsigned long long)want.bytes);
    fail();
  }
}

void expect_shared(const char *what, const MemCounters &c, Shared want) {
  if (c.shared_requests != want.requests || c.shared_wavefronts != want.wavefronts ||
      c.shared_bank_conflicts != want.conflicts) {
    std::fprintf(
        stderr, "%s: shared requests %llu wavefronts %llu conflicts %llu; want %llu %llu %llu\n",
        what, (unsigned long long)c.shared_requests, (unsigned long long)c.shared_wavefronts,
        (unsigned long long)c.shared_bank_conflicts, (unsigned long long)want.requests,
        (unsigned long long)want.wavefronts, (unsigned long long)want.conflicts);
    fail();
  }
}

void test_global_sectors(void **) {
  struct Case {
    const char *what;
    uint32_t stride;
    const char *body;
    bool store;
    Global want;
    uint32_t threads;
  };
  const Case cases[] = {
      // 32 consecutive words: 128 bytes in 4 sectors, 100%.
      {"u32 consecutive", 4, "ld.global.u32 %r6, [%rd3];", false, {1, 4, 128}, 32},
      // Stride 2 words: 8 sectors, half of their bytes used.
      {"u32 stride 8 B", 8, "ld.global.u32 %r6, [%rd3];", false, {1, 8, 128}, 32},
      // One sector per lane: 12.5%.
      {"u32 stride 32 B", 32, "ld.global.u32 %r6, [%rd3];", false, {1, 32, 128}, 32},
      // Every lane the same word: one sector, 4 distinct bytes.
      {"u32 broadcast", 0, "ld.global.u32 %r6, [%rd3];", false, {1, 1, 4}, 32},
      // 16 bytes past a sector boundary: 128 bytes over 5 sectors.
      {"u32 misaligned", 4, "ld.global.u32 %r6, [%rd3+16];", false, {1, 5, 128}, 32},
      {"u16 consecutive", 2, "ld.global.u16 %r6, [%rd3];", false, {1, 2, 64}, 32},
      {"v2.u32 consecutive", 8, "ld.global.v2.u32 {%r6, %r7}, [%rd3];", false, {1, 8, 256}, 32},
      {"v4.u32 consecutive",
       16,
       "ld.global.v4.u32 {%r6, %r7, %r8, %r10}, [%rd3];",
       false,
       {1, 16, 512},
       32},
      {"v4.u32 stride 64 B",
       64,
       "ld.global.v4.u32 {%r6, %r7, %r8, %r10}, [%rd3];",
       false,
       {1, 32, 512},
       32},
      {"st u32 consecutive", 4, "st.global.u32 [%rd3], %r5;", true, {1, 4, 128}, 32},
      {"st u32 stride 8 B", 8, "st.global.u32 [%rd3], %r5;", true, {1, 8, 128}, 32},
      // Lanes 16-31 guarded off: one request of 64 bytes.
      {"u32 half the lanes",
       4,
       "setp.lt.u32 %p1, %r9, 16;\n  @%p1 ld.global.u32 %r6, [%rd3];",
       false,
       {1, 2, 64},
       32},
      // Two warps: one request each.
      {"u32 two warps", 4, "ld.global.u32 %r6, [%rd3];", false, {2, 8, 256}, 64},
      // A loop without a collective: each execution is a request.
      {"u32 loop of 3",
       4,
       "  mov.u32 %r11, 0;\nLOOP:\n  ld.global.u32 %r6, [%rd3];\n  add.u32 %r11, %r11, 1;\n"
       "  setp.lt.u32 %p1, %r11, 3;\n  @%p1 bra LOOP;",
       false,
       {3, 12, 384},
       32},
  };
  for (const Case &c : cases) {
    LaunchProfile p = run_probe(probe(c.stride, c.body), c.threads);
    expect_global(c.what, p.total, c.store, c.want);
    expect_shared(c.what, p.total, {0, 0, 0});
  }
}

void test_shared_banks(void **) {
  struct Case {
    const char *what;
    uint32_t stride;
    const char *body;
    Shared want;
  };
  const Case cases[] = {
      // 32 lanes, 32 banks: one wavefront.
      {"u32 consecutive", 4, "ld.shared.u32 %r6, [%r4];", {1, 1, 0}},
      // Every lane bank 0, distinct words: 32-way conflict.
      {"u32 all bank 0", 128, "ld.shared.u32 %r6, [%r4];", {1, 32, 31}},
      {"st u32 all bank 0", 128, "st.shared.u32 [%r4], %r5;", {1, 32, 31}},
      // Every lane the same word: a broadcast, no conflict.
      {"u32 broadcast", 0, "ld.shared.u32 %r6, [%r4];", {1, 1, 0}},
      // Stride 2 words: lanes l and l + 16 share a bank.
      {"u32 stride 8 B", 8, "ld.shared.u32 %r6, [%r4];", {1, 2, 1}},
      // Bytes and halves of the same words: no conflict.
      {"u8 consecutive", 1, "ld.shared.u8 %r6, [%r4];", {1, 1, 0}},
      {"u16 consecutive", 2, "ld.shared.u16 %r6, [%r4];", {1, 1, 0}},
      // 8 bytes per lane: two half-warp phases, each conflict-free.
      {"v2.u32 consecutive", 8, "ld.shared.v2.u32 {%r6, %r7}, [%r4];", {1, 2, 0}},
      {"u64 consecutive", 8, "ld.shared.u64 %rd5, [%r4];", {1, 2, 0}},
      // ... with a 16-byte stride: lanes l and l + 8 of a half-warp collide.
      {"v2.u32 stride 16 B", 16, "ld.shared.v2.u32 {%r6, %r7}, [%r4];", {1, 4, 2}},
      // 16 bytes per lane: four quarter-warp phases.
      {"v4.u32 consecutive", 16, "ld.shared.v4.u32 {%r6, %r7, %r8, %r10}, [%r4];", {1, 4, 0}},
      {"st v4.u32 consecutive", 16, "st.shared.v4.u32 [%r4], {%r5, %r5, %r5, %r5};", {1, 4, 0}},
      // ... with a 32-byte stride: lanes l and l + 4 of a quarter collide.
      {"v4.u32 stride 32 B", 32, "ld.shared.v4.u32 {%r6, %r7, %r8, %r10}, [%r4];", {1, 8, 4}},
      // ... all 16 bytes of the same address: broadcast within each phase.
      {"v4.u32 broadcast", 0, "ld.shared.v4.u32 {%r6, %r7, %r8, %r10}, [%r4];", {1, 4, 0}},
      // Half the lanes of a 4-byte access: still one wavefront.
      {"u32 half the lanes",
       4,
       "setp.lt.u32 %p1, %r9, 16;\n  @%p1 ld.shared.u32 %r6, [%r4];",
       {1, 1, 0}},
  };
  for (const Case &c : cases) {
    LaunchProfile p = run_probe(probe(c.stride, c.body));
    expect_shared(c.what, p.total, c.want);
    expect_global(c.what, p.total, false, {0, 0, 0});
  }
}

// ldmatrix: lane r gives row r at smem + r * pitch; each matrix (8 rows of
// 16 bytes) is one phase. A pitch of 128 bytes puts every row in banks 0-3
// (8 wavefronts per matrix), 144 bytes spreads the 8 rows over all 32 banks.
void test_ldmatrix_banks(void **) {
  for (int count : {1, 2, 4}) {
    for (bool trans : {false, true}) {
      for (uint32_t pitch : {128u, 144u, 16u}) {
        std::string regs = "{%r6";
        for (int j = 1; j < count; ++j) regs += ", %r1" + std::to_string(j);
        regs += "}";
        std::string body = "ldmatrix.sync.aligned.m8n8.x" + std::to_string(count) +
                           (trans ? ".trans" : "") + ".shared.b16 " + regs + ", [%r4];";
        LaunchProfile p = run_probe(probe(pitch, body));
        const uint64_t per = pitch == 128 ? 8 : 1;
        char what[64];
        std::snprintf(what, sizeof what, "ldmatrix x%d%s pitch %u", count, trans ? ".trans" : "",
                      pitch);
        expect_shared(what, p.total, {1, per * count, (per - 1) * count});
      }
    }
  }
}

void test_cp_async(void **) {
  // 16 bytes per lane: 512 bytes in 16 sectors; shared side 4 phases.
  LaunchProfile p =
      run_probe(probe(16, "cp.async.cg.shared.global [%r4], [%rd3], 16;\n  cp.async.wait_all;"));
  expect_global("cp.async 16", p.total, false, {1, 16, 512}, true);
  expect_shared("cp.async 16", p.total, {1, 4, 0});
  // A 32-byte stride wastes half of each sector pair and conflicts 2-way.
  p = run_probe(probe(32, "cp.async.cg.shared.global [%r4], [%rd3], 16;\n  cp.async.wait_all;"));
  expect_global("cp.async 16 stride 32", p.total, false, {1, 32, 512}, true);
  expect_shared("cp.async 16 stride 32", p.total, {1, 8, 4});
  // 4-byte copies: one phase.
  p = run_probe(probe(4, "cp.async.ca.shared.global [%r4], [%rd3], 4;\n  cp.async.wait_all;"));
  expect_global("cp.async 4", p.total, false, {1, 4, 128}, true);
  expect_shared("cp.async 4", p.total, {1, 1, 0});
  // src-size 0 (zero-fill): nothing read, shared memory still written.
  p = run_probe(probe(16, "cp.async.cg.shared.global [%r4], [%rd3], 16, 0;\n  cp.async.wait_all;"));
  expect_global("cp.async zero-fill", p.total, false, {0, 0, 0}, true);
  expect_shared("cp.async zero-fill", p.total, {1, 4, 0});
  // src-size 8: only the first 8 bytes of each 16 are read.
  p = run_probe(probe(16, "cp.async.cg.shared.global [%r4], [%rd3], 16, 8;\n  cp.async.wait_all;"));
  expect_global("cp.async src-size 8", p.total, false, {1, 16, 256}, true);
}

// ----------------------------------------------------------- main loop ----

// An outer loop around an inner loop with mma.sync: the inner one is the
// main loop. In it: a conflict-free ld.shared (or, with `conflicted`, a
// 32-way one) and a coalesced global load; outside: a bank-0 ld.shared in
// the outer loop and a strided global load before the loops.
std::string loop_kernel(bool with_mma, bool conflicted) {
  const std::string mma =
      with_mma ? "  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, "
                 "{%r5, %r5, %r5, %r5}, {%r5, %r5}, {%f1, %f2, %f3, %f4};\n"
               : "";
  return std::string(kHeader) + R"(
.visible .entry k_loop(.param .align 8 .b8 k_loop_param[8])
{
  .reg .b32 %r<20>;
  .reg .b64 %rd<8>;
  .reg .pred %p<4>;
  .reg .f32 %f<8>;
  .shared .align 128 .b8 smem[8192];
  ld.param.u64 %rd1, [k_loop_param+0];
  mov.u32 %r1, %tid.x;
  mul.lo.u32 %r2, %r1, 4;
  cvt.u64.u32 %rd2, %r2;
  add.s64 %rd3, %rd1, %rd2;
  mov.u32 %r3, smem;
  add.u32 %r4, %r3, %r2;
  mul.lo.u32 %r7, %r1, 128;
  add.u32 %r8, %r3, %r7;
  mov.u32 %r5, 0;
  mul.wide.u32 %rd4, %r1, 32;
  add.s64 %rd5, %rd1, %rd4;
  ld.global.u32 %r6, [%rd5];
  mov.u32 %r11, 0;
OUTER:
  mov.u32 %r12, 0;
INNER:
  ld.shared.u32 %r6, [)" +
         (conflicted ? "%r8" : "%r4") + R"(]; // inner shared
  ld.global.u32 %r6, [%rd3];
)" + mma +
         R"(  add.u32 %r12, %r12, 1;
  setp.lt.u32 %p1, %r12, 3;
  @%p1 bra INNER; // inner end
  ld.shared.u32 %r6, [%r8];
  add.u32 %r11, %r11, 1;
  setp.lt.u32 %p2, %r11, 2;
  @%p2 bra OUTER;
  exit;
}
)";
}

LaunchProfile run_loop(const std::string &ptx) {
  DevBuf buf(8192);
  uint64_t prm = buf.ptr;
  fa_status st = run_ptx(ptx, "k_loop", geom(1, 32), &prm, sizeof prm);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  LaunchProfile p;
  assert_int_equal(g_be->last_profile(&p), FA_SUCCESS);
  return p;
}

void test_main_loop(void **) {
  for (bool with_mma : {true, false}) {
    for (bool conflicted : {false, true}) {
      const std::string ptx = loop_kernel(with_mma, conflicted);
      LaunchProfile p = run_loop(ptx);
      // With mma.sync the inner loop holds it; without, the inner loop is
      // the innermost one holding a global load. Either way: lines of the
      // inner loop's first instruction to its branch.
      assert_int_equal(p.loop.first_line, line_of(ptx, "// inner shared"));
      assert_int_equal(p.loop.last_line, line_of(ptx, "// inner end"));
      // Inner loop: 2 x 3 executions of a coalesced load and of the ld.shared.
      expect_global("main loop", p.main_loop, false, {6, 24, 768});
      expect_shared("main loop", p.main_loop,
                    conflicted ? Shared{6, 6 * 32, 6 * 31} : Shared{6, 6, 0});
      // Whole kernel: plus the strided load and 2 bank-0 loads of the outer loop.
      expect_global("kernel", p.total, false, {7, 24 + 32, 768 + 128});
      expect_shared("kernel", p.total,
                    conflicted ? Shared{8, 8 * 32, 8 * 31} : Shared{8, 6 + 2 * 32, 2 * 31});
      assert_int_equal(p.loop_worst_conflict_line,
                       conflicted ? line_of(ptx, "// inner shared") : 0);
      assert_int_equal(p.loop_worst_sector_line, 0);
    }
  }
  // No loop at all: no main loop.
  LaunchProfile p = run_probe(probe(4, "ld.global.u32 %r6, [%rd3];"));
  assert_true(p.loop.ranges.empty());
  assert_int_equal(p.loop.first_line, 0);
  expect_global("no loop", p.main_loop, false, {0, 0, 0});
}

// Profiling off: no profile is kept, and the launch still runs.
void test_profile_off(void **) {
  unsetenv("FLASHATTN_EMU_PROFILE");
  DevBuf buf(8192);
  uint64_t prm = buf.ptr;
  assert_int_equal(
      run_ptx(probe(4, "ld.global.u32 %r6, [%rd3];"), "k_probe", geom(1, 32), &prm, sizeof prm),
      FA_SUCCESS);
  LaunchProfile p;
  assert_int_equal(g_be->last_profile(&p), FA_ERROR_UNSUPPORTED);
  expect_error("FLASHATTN_EMU_PROFILE=1");
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  // A faulting launch keeps none either.
  assert_int_equal(run_ptx(probe(4, "ld.global.u32 %r6, [%rd3+8192];"), "k_probe", geom(1, 32),
                           &prm, sizeof prm),
                   FA_ERROR_LAUNCH);
  assert_int_equal(g_be->last_profile(&p), FA_ERROR_UNSUPPORTED);
}

// ------------------------------------------------------- real kernels ----

fa_runtime *g_rt = nullptr;

// An emulator runtime with an in-memory kernel cache.
fa_runtime *new_runtime() {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.cache_mode = FA_CACHE_MEMORY;
  fa_runtime *rt = nullptr;
  assert_int_equal(fa_runtime_create(&o, &rt), FA_SUCCESS);
  return rt;
}

void need_runtime() {
  if (!g_rt) g_rt = new_runtime();
}

void test_api_errors(void **) {
  need_runtime();
  fa_emu_profile p = FA_EMU_PROFILE_INIT;
  assert_int_equal(fa_emulator_profile(nullptr, &p), FA_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fa_emulator_profile(g_rt, nullptr), FA_ERROR_INVALID_ARGUMENT);
  p.struct_size = sizeof p - 4;
  assert_int_equal(fa_emulator_profile(g_rt, &p), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "struct_size"));
  // A runtime that has launched nothing has no profile.
  fa_runtime *fresh = new_runtime();
  p.struct_size = sizeof p;
  assert_int_equal(fa_emulator_profile(fresh, &p), FA_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(fa_last_error(), "fa_emulator_profile"));
  fa_runtime_destroy(fresh);
}

double efficiency(uint64_t bytes, uint64_t sectors) {
  return sectors ? static_cast<double>(bytes) / (32.0 * static_cast<double>(sectors)) : 0.0;
}

// The promise of the kernels: in the main loop, the K/V loads (cp.async;
// they must carry at least 95% of the bytes the loop loads, so K/V cannot
// hide in other loads) use at least 95% of the sectors they touch, and
// shared memory has no bank conflict. Returns the failures, naming PTX
// lines (the table on stderr lists every instruction at fault).
std::string check_kernel(const std::string &what, const char *kind) {
  fa_emu_profile p = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(g_rt, &p) != FA_SUCCESS)
    return what + ": fa_emulator_profile: " + fa_last_error() + "\n";
  char buf[1024];
  const fa_emu_mem_counters &m = p.main_loop, &t = p.total;
  const double kv = efficiency(m.cp_async_bytes, m.cp_async_sectors);
  const double all = efficiency(m.global_load_bytes, m.global_load_sectors);
  std::snprintf(buf, sizeof buf,
                "%s: %s\n  main loop (PTX lines %u-%u): K/V (cp.async) %llu req %llu sectors "
                "%.2f%% used; all loads %llu req %llu sectors %.2f%% used; %llu smem req, %llu "
                "wavefronts, %llu bank conflicts\n  whole kernel: loads %.2f%% used, %llu bank "
                "conflicts\n",
                what.c_str(), p.kernel, p.main_loop_first_line, p.main_loop_last_line,
                (unsigned long long)m.cp_async_requests, (unsigned long long)m.cp_async_sectors,
                100 * kv, (unsigned long long)m.global_load_requests,
                (unsigned long long)m.global_load_sectors, 100 * all,
                (unsigned long long)m.shared_requests, (unsigned long long)m.shared_wavefronts,
                (unsigned long long)m.shared_bank_conflicts,
                100 * efficiency(t.global_load_bytes, t.global_load_sectors),
                (unsigned long long)t.shared_bank_conflicts);
  std::printf("%s", buf);
  std::string err;
  if (!std::strstr(p.kernel, kind)) err += std::string("  not a ") + kind + " kernel\n";
  if (p.main_loop_first_line == 0 || m.cp_async_requests == 0 || m.shared_requests == 0)
    err += "  no main loop with cp.async K/V loads and shared accesses found\n";
  if (m.cp_async_bytes < 0.95 * static_cast<double>(m.global_load_bytes)) {
    std::snprintf(buf, sizeof buf,
                  "  cp.async carries %llu of the main loop's %llu loaded bytes (< 95%%)\n",
                  (unsigned long long)m.cp_async_bytes, (unsigned long long)m.global_load_bytes);
    err += buf;
  }
  if (kv < 0.95) {
    std::snprintf(buf, sizeof buf,
                  "  main-loop K/V loads use %.2f%% of their sectors (< 95%%); worst main-loop "
                  "load: PTX line %u\n",
                  100 * kv, p.main_loop_worst_sector_line);
    err += buf;
  }
  if (m.shared_bank_conflicts != 0) {
    std::snprintf(buf, sizeof buf, "  %llu bank conflicts in the main loop; worst: PTX line %u\n",
                  (unsigned long long)m.shared_bank_conflicts, p.main_loop_worst_conflict_line);
    err += buf;
  }
  return err.empty() ? err : what + ":\n" + err;
}

// Device buffers of one case, freed with it.
struct Buffers {
  std::vector<uint64_t> ptrs;
  ~Buffers() {
    for (uint64_t p : ptrs) fa_free(g_rt, p);
  }
  uint64_t alloc(size_t bytes) {
    uint64_t p = 0;
    assert_int_equal(fa_malloc(g_rt, bytes, &p), FA_SUCCESS);
    ptrs.push_back(p);
    return p;
  }
  // n random fp16 values in [-1, 1).
  uint64_t random_f16(size_t n, uint32_t seed) {
    std::vector<uint16_t> h(n);
    uint32_t x = seed * 2654435761u + 1;
    for (uint16_t &v : h) {
      x = x * 1664525u + 1013904223u;
      v = fa::emu::f32_to_f16_rn(static_cast<float>(x >> 8) / 8388608.0f - 1.0f);
    }
    uint64_t p = alloc(n * 2);
    assert_int_equal(fa_memcpy_htod(g_rt, p, h.data(), n * 2), FA_SUCCESS);
    return p;
  }
  uint64_t i32(const std::vector<int32_t> &v) {
    uint64_t p = alloc(v.size() * 4);
    assert_int_equal(fa_memcpy_htod(g_rt, p, v.data(), v.size() * 4), FA_SUCCESS);
    return p;
  }
};

// A dense [b, s, h, d] view (strides in elements).
fa_tensor dense(uint64_t data, int s, int h, int d) {
  fa_tensor t = FA_TENSOR_INIT;
  t.data = data;
  t.stride[3] = 1;
  t.stride[2] = d;
  t.stride[1] = int64_t(h) * d;
  t.stride[0] = int64_t(s) * h * d;
  return t;
}

// A real kernel's launch, on dense tensors from fa_malloc (256-byte aligned,
// as PyTorch's and vLLM's are): the layouts these properties are promised
// for. tests/support's numerics cases pad every row by 16 bytes to test
// strides, which puts every K/V row across one more sector whatever the
// kernel does.
struct RealCase {
  bool decode;  // fa_decode (partial states only) or fa_launch
  int head_dim;
  int page_size;  // 0 = contiguous K/V
  bool causal;
  std::string describe() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s fp16 d%d hq8 hkv2 %s%s", decode ? "decode" : "forward",
                  head_dim,
                  page_size ? ("paged" + std::to_string(page_size)).c_str() : "contiguous",
                  causal ? " causal" : "");
    return buf;
  }
};

// Runs c on g_rt; "" or the failure.
std::string launch_real(const RealCase &c) {
  const int hq = 8, hkv = 2, d = c.head_dim, batch = 2;
  const int sq = c.decode ? 1 : 64, skmax = 320;
  const std::vector<int32_t> lens = {300, 257};
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = d;
  desc.num_heads_q = hq;
  desc.num_heads_kv = hkv;
  desc.causal = c.causal;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS)
    return std::string("fa_config_create: ") + fa_last_error() + "\n";
  Buffers b;
  fa_kv_cache_layout kv = FA_KV_CACHE_LAYOUT_INIT;
  fa_tensor k, v;
  if (c.page_size) {
    // Pages [num_pages, page_size, hkv, d] in a shuffled order.
    const int per_seq = (skmax + c.page_size - 1) / c.page_size, pages = batch * per_seq;
    std::vector<int32_t> table(pages);
    for (int i = 0; i < pages; ++i) table[i] = (i * 7 + 3) % pages;  // 7 is prime to pages
    kv.layout = FA_KV_PAGED;
    kv.page_size = c.page_size;
    kv.num_pages = pages;
    kv.max_pages_per_seq = per_seq;
    kv.block_table = b.i32(table);
    kv.block_table_stride = per_seq;
    const size_t n = size_t(pages) * c.page_size * hkv * d;
    k = dense(b.random_f16(n, 2), c.page_size, hkv, d);
    v = dense(b.random_f16(n, 3), c.page_size, hkv, d);
  } else {
    const size_t n = size_t(batch) * skmax * hkv * d;
    k = dense(b.random_f16(n, 2), skmax, hkv, d);
    v = dense(b.random_f16(n, 3), skmax, hkv, d);
  }
  const fa_tensor q = dense(b.random_f16(size_t(batch) * sq * hq * d, 1), sq, hq, d);
  const uint64_t seqlens = b.i32(lens);
  fa_status st;
  if (c.decode) {
    fa_decode_args a = FA_DECODE_ARGS_INIT;
    a.batch = batch;
    a.seqlen_q = sq;
    a.seqlen_k_max = skmax;
    a.q = q;
    a.k_cache = k;
    a.v_cache = v;
    a.cache_seqlens = seqlens;
    a.num_splits = 2;
    a.kv = kv;
    size_t ws = 0;
    assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &a, &ws, nullptr), FA_SUCCESS);
    a.workspace = b.alloc(ws);
    a.workspace_size = ws;
    // o.data = 0: no combine, so the decode kernel is the last launch.
    st = fa_decode(g_rt, cfg, &a, nullptr);
  } else {
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.batch = batch;
    a.seqlen_q = sq;
    a.seqlen_k = skmax;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = dense(b.alloc(size_t(batch) * sq * hq * d * 2), sq, hq, d);
    a.kv = kv;
    a.seqused_k = seqlens;
    st = fa_launch(g_rt, cfg, &a, nullptr);
  }
  fa_config_destroy(cfg);
  if (st != FA_SUCCESS) return c.describe() + ": " + fa_last_error() + "\n";
  return check_kernel(c.describe(), c.decode ? "decode" : "forward");
}

void run_real(bool decode) {
  need_runtime();
  std::string failures;
  for (int d : {64, 128}) {
    for (int page : {0, 16, 8}) {
      for (bool causal : {false, true}) {
        if (decode && causal) continue;  // one query row: causal changes nothing
        failures += launch_real({decode, d, page, causal});
      }
    }
  }
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

void test_decode_kernels(void **) { run_real(true); }
void test_forward_kernels(void **) { run_real(false); }

int teardown(void **state) {
  fa_runtime_destroy(g_rt);
  g_rt = nullptr;
  return emu_teardown(state);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_global_sectors),  cmocka_unit_test(test_shared_banks),
      cmocka_unit_test(test_ldmatrix_banks),  cmocka_unit_test(test_cp_async),
      cmocka_unit_test(test_main_loop),       cmocka_unit_test(test_profile_off),
      cmocka_unit_test(test_api_errors),      cmocka_unit_test(test_decode_kernels),
      cmocka_unit_test(test_forward_kernels),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
