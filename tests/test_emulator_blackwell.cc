// Tests of the emulator's sm_100a (Blackwell) tensor memory and tcgen05
// data movement through the Backend interface, on small hand-written
// kernels: tcgen05.ld / st .32x32b element by element against the PTX ISA's
// layout ("Matrix and Data Movement Shape": thread i of the warp <-> lane
// taddr.lane + i, register j <-> column taddr.column + j) over every lane
// and column of two allocations side by side, every .num; allocation
// (blocking, deadlock, relinquish, leaks); every misuse an error naming the
// PTX line(s); the builder's forms through ptxas -arch=sm_100a; and the
// deliberate emulator bugs of emu/sm100.h, each caught by one of these
// checks.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "common/error.h"  // before cmocka.h, whose fail() is a macro
#include "emu/sm100.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"

#include "support/emu_harness.h"

namespace {

using namespace fa::test;

const char *kBlackwell = ".version 8.6\n.target sm_100a\n.address_size 64\n";

// Sets a deliberate emulator bug for the scope.
struct BugScope {
  explicit BugScope(int bug) { fa::emu::g_sm100_bug = bug; }
  ~BugScope() { fa::emu::g_sm100_bug = fa::emu::kSm100BugNone; }
};

// ================================================ element by element ====

// The value the round-trip kernel stores in tensor memory lane `lane`,
// absolute column `col`: (lane << 16 | col) ^ seed. Distinct per cell.
uint32_t pattern(uint32_t lane, uint32_t col, uint32_t seed) { return ((lane << 16) + col) ^ seed; }

// The round-trip kernel for tcgen05.{ld,st}.32x32b.x<n>, 128 threads (four
// warps, one warpgroup). Warp 0 allocates A (na = max(32, n) columns) and B
// (32 columns); each warp w takes the lanes 32 (w % 4).. of both. Then:
//   B: st.x1 of pattern(seed ^ ~0) column by column;
//   A: st.x<n> of pattern(seed) chunk by chunk (its register j = column
//      c + j), wait::st after each;
//   out1: ld.x<n> of A chunk by chunk; out2: ld.x1 of A column by column;
//   out3: ld.x32 of B.
// out (u32): [0] base of A, [1] base of B, then out1, out2 (128 x na) and
// out3 (128 x 32), row = thread.
std::string roundtrip_kernel(int n) {
  const int na = n < 32 ? 32 : n;
  std::string s = std::string(kBlackwell) + R"(
.visible .entry k_rt(.param .align 8 .b8 k_rt_param[16])
{
  .reg .pred %p<4>;
  .reg .b32 %r<32>;
  .reg .b32 %v<128>;
  .reg .b64 %rd<8>;
  .shared .align 16 .b8 sm[16];
  ld.param.u64 %rd1, [k_rt_param+0];
  ld.param.u32 %r20, [k_rt_param+8];
  not.b32 %r21, %r20;
  mov.u32 %r1, %tid.x;
  shr.u32 %r2, %r1, 5;
  and.b32 %r3, %r1, 31;
  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra SKIP_ALLOC;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], )" +
                  std::to_string(na) + R"(;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm+4], 32;
SKIP_ALLOC:
  tcgen05.fence::before_thread_sync;
  bar.sync 0;
  tcgen05.fence::after_thread_sync;
  ld.shared.u32 %r4, [sm];
  ld.shared.u32 %r5, [sm+4];
  and.b32 %r6, %r2, 3;
  shl.b32 %r7, %r6, 21;
  add.u32 %r8, %r4, %r7;
  add.u32 %r9, %r5, %r7;
  shl.b32 %r10, %r6, 5;
  add.u32 %r11, %r10, %r3;
  shl.b32 %r11, %r11, 16;
  add.u32 %r12, %r11, %r4;
  add.u32 %r15, %r11, %r5;
  setp.eq.u32 %p2, %r1, 0;
  mul.wide.u32 %rd2, %r1, )" +
                  std::to_string(4 * na) + R"(;
  add.s64 %rd3, %rd1, %rd2;
  add.s64 %rd3, %rd3, 8;
  mul.wide.u32 %rd4, %r1, 128;
  add.s64 %rd4, %rd4, %rd1;
  add.s64 %rd4, %rd4, )" +
                  std::to_string(8 + 2 * 128 * 4 * na) + R"(;
  @%p2 st.global.u32 [%rd1], %r4;
  @%p2 st.global.u32 [%rd1+4], %r5;
)";
  auto line = [&s](const std::string &l) { s += "  " + l + ";\n"; };
  auto u = [](int v) { return std::to_string(v); };
  auto regs = [&u](int k) {
    std::string r = "{";
    for (int j = 0; j < k; ++j) r += (j ? ", %v" : "%v") + u(j);
    return r + "}";
  };
  for (int j = 0; j < 32; ++j) {  // B, column by column
    line("add.u32 %v0, %r15, " + u(j));
    line("xor.b32 %v0, %v0, %r21");
    line("add.u32 %r13, %r9, " + u(j));
    line("tcgen05.st.sync.aligned.32x32b.x1.b32 [%r13], {%v0}");
    line("tcgen05.wait::st.sync.aligned");
  }
  const std::string xn = ".32x32b.x" + u(n) + ".b32";
  for (int c = 0; c < na; c += n) {  // A, chunk by chunk
    for (int j = 0; j < n; ++j) {
      line("add.u32 %v" + u(j) + ", %r12, " + u(c + j));
      line("xor.b32 %v" + u(j) + ", %v" + u(j) + ", %r20");
    }
    line("add.u32 %r13, %r8, " + u(c));
    line("tcgen05.st.sync.aligned" + xn + " [%r13], " + regs(n));
    line("tcgen05.wait::st.sync.aligned");
  }
  for (int c = 0; c < na; c += n) {  // out1
    line("add.u32 %r13, %r8, " + u(c));
    line("tcgen05.ld.sync.aligned" + xn + " " + regs(n) + ", [%r13]");
    line("tcgen05.wait::ld.sync.aligned");
    for (int j = 0; j < n; ++j) line("st.global.u32 [%rd3+" + u(4 * (c + j)) + "], %v" + u(j));
  }
  for (int c = 0; c < na; ++c) {  // out2
    line("add.u32 %r13, %r8, " + u(c));
    line("tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v0}, [%r13]");
    line("tcgen05.wait::ld.sync.aligned");
    line("st.global.u32 [%rd3+" + u(4 * (128 * na + c)) + "], %v0");
  }
  line("tcgen05.ld.sync.aligned.32x32b.x32.b32 " + regs(32) + ", [%r9]");  // out3
  line("tcgen05.wait::ld.sync.aligned");
  for (int j = 0; j < 32; ++j) line("st.global.u32 [%rd4+" + u(4 * j) + "], %v" + u(j));
  s += R"(  tcgen05.fence::before_thread_sync;
  bar.sync 0;
  tcgen05.fence::after_thread_sync;
  @%p1 bra DONE;
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, )" +
       u(na) + R"(;
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r5, 32;
DONE:
  ret;
}
)";
  return s;
}

// Runs the round trip for x<n> with a fresh seed; false (and a message) on
// the first cell that differs from the ISA's layout.
bool roundtrip_ok(int n, uint32_t seed) {
  const int na = n < 32 ? 32 : n;
  const size_t words = 2 + 2 * 128 * static_cast<size_t>(na) + 128 * 32;
  DevBuf out(words * 4);
  struct {
    uint64_t out;
    uint32_t seed, pad;
  } prm = {out.ptr, seed, 0};
  const std::string ptx = roundtrip_kernel(n);
  const fa_status st = run_ptx(ptx, "k_rt", geom(1, 128), &prm, sizeof prm);
  if (st != FA_SUCCESS) {
    std::fprintf(stderr, "x%d: launch failed: %s\n", n, fa::last_error());
    return false;
  }
  const std::vector<uint32_t> o = out.get<uint32_t>();
  const uint32_t a = o[0], b = o[1];
  // The two allocations: lane 0, inside the 512 columns, disjoint.
  if ((a >> 16) || (b >> 16) || a + na > 512 || b + 32 > 512 || (a < b + 32 && b < a + na)) {
    std::fprintf(stderr, "x%d: allocations at 0x%x (%d columns) and 0x%x (32) overlap\n", n, a, na,
                 b);
    return false;
  }
  for (uint32_t t = 0; t < 128; ++t) {
    const uint32_t lane = 32 * ((t / 32) % 4) + t % 32;  // warp w: lanes 32 (w % 4)..
    for (int c = 0; c < na; ++c) {
      const uint32_t want = pattern(lane, a + c, seed);
      const uint32_t got1 = o[2 + t * na + c], got2 = o[2 + 128 * na + t * na + c];
      if (got1 != want || got2 != want) {
        std::fprintf(stderr, "x%d: thread %u column %d: ld.x%d 0x%08x, ld.x1 0x%08x, want 0x%08x\n",
                     n, t, c, n, got1, got2, want);
        return false;
      }
    }
    for (int c = 0; c < 32; ++c) {
      const uint32_t want = pattern(lane, b + c, ~seed);
      const uint32_t got = o[2 + 2 * 128 * na + t * 32 + c];
      if (got != want) {
        std::fprintf(stderr, "x%d: B thread %u column %d: 0x%08x, want 0x%08x\n", n, t, c, got,
                     want);
        return false;
      }
    }
  }
  return true;
}

void test_ld_st_layout(void **) {
  std::mt19937 rng(std::random_device{}());
  for (int n = 1; n <= 128; n *= 2) {
    assert_true(roundtrip_ok(n, static_cast<uint32_t>(rng())));
    assert_int_not_equal(ptxas_accepts(roundtrip_kernel(n), "sm_100a"), 0);
  }
}

// ==================================================== misuse ====

// A kernel of `threads` threads: %r1 = %tid.x, %r2 = warp, %r3 = lane,
// sm[16] shared; body, then ret.
std::string misuse_kernel(const std::string &body) {
  return std::string(kBlackwell) + R"(
.visible .entry k_bad(.param .align 8 .b8 k_bad_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<32>;
  .reg .b32 %v<8>;
  .shared .align 16 .b8 sm[16];
  mov.u32 %r1, %tid.x;
  shr.u32 %r2, %r1, 5;
  and.b32 %r3, %r1, 31;
)" + body +
         "  ret;\n}\n";
}

// A misuse and what its error must say: markers (PTX comments) whose lines
// the message must name, and fixed texts it must contain.
struct ErrCase {
  const char *name;
  uint32_t threads;
  std::string body;
  std::vector<const char *> markers;
  std::vector<const char *> texts;
};

// Whether the case fails to run with an error naming its lines and texts.
bool error_case_ok(const ErrCase &c) {
  const std::string ptx = misuse_kernel(c.body);
  uint64_t dummy = 0;
  const fa_status st = run_ptx(ptx, "k_bad", geom(1, c.threads, 16), &dummy, sizeof dummy);
  if (st == FA_SUCCESS) {
    std::fprintf(stderr, "%s: ran without an error\n", c.name);
    return false;
  }
  const std::string msg = fa::last_error();
  for (const char *m : c.markers) {
    const std::string want = "line " + std::to_string(line_of(ptx, m));
    if (msg.find(want) == std::string::npos) {
      std::fprintf(stderr, "%s: \"%s\" lacks \"%s\" (%s)\n", c.name, msg.c_str(), want.c_str(), m);
      return false;
    }
  }
  for (const char *t : c.texts) {
    if (msg.find(t) == std::string::npos) {
      std::fprintf(stderr, "%s: \"%s\" lacks \"%s\"\n", c.name, msg.c_str(), t);
      return false;
    }
  }
  return true;
}

// Warp 0 allocates 32 columns at sm[0] (its address in %r10 of every
// thread after the barrier), with the fences around the barrier.
const char *kAlloc32 = R"(  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra A_DONE;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 32; // @ALLOC
A_DONE:
  tcgen05.fence::before_thread_sync;
  bar.sync 0;
  tcgen05.fence::after_thread_sync;
  ld.shared.u32 %r10, [sm];
)";
// ... and frees it again (warp 0).
const char *kFree32 = R"(  tcgen05.fence::before_thread_sync;
  bar.sync 0;
  @%p1 bra F_DONE;
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r10, 32; // @FREE
F_DONE:
)";

// The misuse cases; the bug tests pick theirs by name.
std::vector<ErrCase> error_cases() {
  std::vector<ErrCase> v;
  v.push_back({"ncols not a power of 2",
               32,
               "  mov.u32 %r4, 48;\n"
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], %r4; // @A\n",
               {"@A"},
               {"nCols 48 is not a power of 2 in 32..512"}});
  v.push_back({"ncols too small",
               32,
               "  mov.u32 %r4, 16;\n"
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], %r4; // @A\n",
               {"@A"},
               {"nCols 16"}});
  v.push_back({"double dealloc",
               32,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 64;\n"
               "  ld.shared.u32 %r4, [sm];\n"
               "  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 64; // @D1\n"
               "  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 64; // @D2\n",
               {"@D1", "@D2"},
               {"already deallocated"}});
  v.push_back({"dealloc size mismatch",
               32,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 64; // @A\n"
               "  ld.shared.u32 %r4, [sm];\n"
               "  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 32; // @D\n",
               {"@A", "@D"},
               {"nCols 32 differs from the 64 columns"}});
  v.push_back({"dealloc of no allocation",
               32,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 64; // @A\n"
               "  ld.shared.u32 %r4, [sm];\n"
               "  add.u32 %r5, %r4, 32;\n"
               "  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r5, 32; // @D\n",
               {"@A", "@D"},
               {"not the address of a live allocation"}});
  v.push_back({"leak at exit",
               32,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 128; // @A\n",
               {"@A"},
               {"still allocated", "columns [0, 128)"}});
  v.push_back({"relinquish then alloc",
               32,
               "  tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned; // @R\n"
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 32; // @A\n",
               {"@R", "@A"},
               {"gave up its right to allocate"}});
  v.push_back({"deadlock",
               64,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 256; // @A1\n"
               "  bar.sync 0;\n"
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm+4], 512; // @A2\n",
               {"@A2", "@A1"},
               {"deadlock", "512 contiguous free columns"}});
  v.push_back({"wrong quarter",
               64,
               std::string(kAlloc32) +
                   "  tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v0}, [%r10]; // @LD\n"
                   "  tcgen05.wait::ld.sync.aligned;\n" +
                   kFree32,
               {"@LD"},
               {"warp 1 (warp id % 4 = 1) may access tensor memory lanes 32..63 only"}});
  v.push_back({"outside the allocation",
               32,
               std::string(kAlloc32) +
                   "  add.u32 %r11, %r10, 16;\n"
                   "  tcgen05.st.sync.aligned.32x32b.x32.b32 [%r11], {%v0, %v1, %v2, %v3, %v4, "
                   "%v5, %v6, %v7, %v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7, %v0, %v1, %v2, %v3, "
                   "%v4, %v5, %v6, %v7, %v0, %v1, %v2, %v3, %v4, %v5, %v6, %v7}; // @ST\n"
                   "  tcgen05.wait::st.sync.aligned;\n" +
                   kFree32,
               {"@ST", "@ALLOC"},
               {"columns 16..47 are not inside one allocation"}});
  v.push_back({"past column 511",
               32,
               "  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 512;\n"
               "  ld.shared.u32 %r10, [sm];\n"
               "  add.u32 %r11, %r10, 510;\n"
               "  tcgen05.ld.sync.aligned.32x32b.x4.b32 {%v0, %v1, %v2, %v3}, [%r11]; // @LD\n",
               {"@LD"},
               {"columns 510..513 run past column 511"}});
  v.push_back({"taddr differs across the warp",
               32,
               std::string(kAlloc32) +
                   "  add.u32 %r11, %r10, %r3;\n"
                   "  tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v0}, [%r11]; // @LD\n",
               {"@LD"},
               {"taddr differs across the warp"}});
  v.push_back({"read before wait::ld",
               32,
               std::string(kAlloc32) +
                   "  tcgen05.st.sync.aligned.32x32b.x2.b32 [%r10], {%v0, %v1};\n"
                   "  tcgen05.wait::st.sync.aligned;\n"
                   "  tcgen05.ld.sync.aligned.32x32b.x2.b32 {%v2, %v3}, [%r10]; // @LD\n"
                   "  add.u32 %r12, %v3, 1; // @USE\n"
                   "  tcgen05.wait::ld.sync.aligned;\n" +
                   kFree32,
               {"@LD", "@USE"},
               {"register %v3 is a destination of the tcgen05.ld", "tcgen05.wait::ld"}});
  v.push_back({"overwrite before wait::ld",
               32,
               std::string(kAlloc32) +
                   "  tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v2}, [%r10]; // @LD\n"
                   "  mov.u32 %v2, 7; // @USE\n"
                   "  tcgen05.wait::ld.sync.aligned;\n" +
                   kFree32,
               {"@LD", "@USE"},
               {"register %v2 is a destination of the tcgen05.ld"}});
  v.push_back({"overwrite before wait::st",
               32,
               std::string(kAlloc32) +
                   "  tcgen05.st.sync.aligned.32x32b.x2.b32 [%r10], {%v0, %v1}; // @ST\n"
                   "  add.u32 %r12, %v1, 1;\n"  // reading a source is allowed
                   "  mov.u32 %v1, 7; // @USE\n"
                   "  tcgen05.wait::st.sync.aligned;\n" +
                   kFree32,
               {"@ST", "@USE"},
               {"register %v1 is a source of the tcgen05.st", "tcgen05.wait::st"}});
  v.push_back({"ld of a cell before wait::st",
               32,
               std::string(kAlloc32) +
                   "  tcgen05.st.sync.aligned.32x32b.x2.b32 [%r10], {%v0, %v1}; // @ST\n"
                   "  add.u32 %r11, %r10, 1;\n"
                   "  tcgen05.ld.sync.aligned.32x32b.x1.b32 {%v2}, [%r11]; // @LD\n"
                   "  tcgen05.wait::ld.sync.aligned;\n"
                   "  tcgen05.wait::st.sync.aligned;\n" +
                   kFree32,
               {"@ST", "@LD"},
               {"lane 0 column 1 was written by the tcgen05.st", "tcgen05.wait::st first"}});
  return v;
}

const ErrCase &error_case(const std::vector<ErrCase> &v, const char *name) {
  for (const ErrCase &c : v)
    if (std::strcmp(c.name, name) == 0) return c;
  fail();
  return v.front();
}

void test_misuse(void **) {
  for (const ErrCase &c : error_cases()) assert_true(error_case_ok(c));
}

// The same kernels, fixed, run: the waits, reads of an st's sources, a
// dealloc then an alloc of the freed columns, and a tcgen05.alloc that
// waits for another warp's dealloc.
void test_correct_use(void **) {
  const std::string ok_wait =
      misuse_kernel(std::string(kAlloc32) +
                    "  mov.u32 %v0, 5;\n"
                    "  mov.u32 %v1, 6;\n"
                    "  tcgen05.st.sync.aligned.32x32b.x2.b32 [%r10], {%v0, %v1};\n"
                    "  add.u32 %r12, %v1, 1;\n"
                    "  tcgen05.wait::st.sync.aligned;\n"
                    "  mov.u32 %v1, 7;\n"
                    "  tcgen05.ld.sync.aligned.32x32b.x2.b32 {%v2, %v3}, [%r10];\n"
                    "  tcgen05.wait::ld.sync.aligned;\n"
                    "  setp.ne.u32 %p2, %v3, 6;\n"
                    "  mov.u32 %r20, 4096;\n"
                    "  @%p2 st.shared.u32 [%r20], %r1;\n" +  // out of bounds: a fault

                    kFree32);
  uint64_t dummy = 0;
  const fa_status st = run_ptx(ok_wait, "k_bad", geom(1, 32, 16), &dummy, sizeof dummy);
  if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(st, FA_SUCCESS);
  // Warp 1 asks for 256 columns while warp 0 holds all 512: it waits until
  // warp 0 frees them, then gets column 0.
  DevBuf out(8);
  const std::string blocking = std::string(kBlackwell) + R"(
.visible .entry k_blk(.param .align 8 .b8 k_blk_param[8])
{
  .reg .pred %p<4>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<4>;
  .shared .align 16 .b8 sm[16];
  ld.param.u64 %rd1, [k_blk_param+0];
  mov.u32 %r1, %tid.x;
  shr.u32 %r2, %r1, 5;
  setp.ne.u32 %p1, %r2, 0;
  @%p1 bra W1;
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 512;
  ld.shared.u32 %r4, [sm];
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 512;
  bra.uni DONE;
W1:
  tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm+4], 256;
  ld.shared.u32 %r5, [sm+4];
  st.global.u32 [%rd1], %r5;
  tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r5, 256;
DONE:
  ret;
}
)";
  uint64_t p = out.ptr;
  const fa_status sb = run_ptx(blocking, "k_blk", geom(1, 64, 16), &p, sizeof p);
  if (sb != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
  assert_int_equal(sb, FA_SUCCESS);
  assert_int_equal(out.get<uint32_t>()[0], 0);
}

// Forms the parser refuses, with the reason.
void test_parse_errors(void **) {
  struct Bad {
    const char *header, *line, *why;
  } cases[] = {
      {kBlackwell, "tcgen05.ld.sync.aligned.32x32b.x3.b32 {%v0, %v1, %v2}, [%r1];",
       "N = 1, 2, 4, .., 128"},
      {kBlackwell, "tcgen05.ld.sync.aligned.16x64b.x1.b32 {%v0}, [%r1];", "shape .16x64b"},
      {kBlackwell, "tcgen05.ld.sync.aligned.32x32b.x1.pack::16b.b32 {%v0}, [%r1];",
       "32x32b.xN.b32"},
      {kBlackwell, "tcgen05.ld.sync.aligned.32x32b.x1.b32 %v0, [%r1];", "must be a vector"},
      {kBlackwell, "tcgen05.ld.sync.aligned.32x32b.x2.b32 {%v0}, [%r1];", "vector of 2"},
      {kBlackwell, "tcgen05.st.sync.aligned.32x32b.x1.b32 [%r1+4], {%v0};", "[taddr]"},
      {kBlackwell, "tcgen05.alloc.cta_group::4.sync.aligned.shared::cta.b32 [sm], 32;",
       ".cta_group::1 or .cta_group::2"},
      {kBlackwell, "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [sm], 48;",
       "power of 2 in 32..512"},
      {kBlackwell, "tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r1, 1024;",
       "power of 2 in 32..512"},
      {kBlackwell, "tcgen05.shift.cta_group::1.down [%r1];", "tcgen05.shift is not modelled"},
      {kBlackwell, "tcgen05.cp.cta_group::1.4x256b [%r1], %r2;", "4x256b"},
      {kBlackwell, "tcgen05.mma.ws.cta_group::1.kind::f16 [%r1], [%r2], %r3, %r1, 1;",
       ".ws is not modelled"},
      {kBlackwell, "tcgen05.mma.cta_group::1.kind::tf32 [%r1], [%r2], %r3, %r1, 1;",
       "kind::f16 and .kind::f8f6f4"},
      {kBlackwell, "tcgen05.cp.cta_group::2.128x256b [%r1], %r2;", "cp.cta_group::2"},
      {kBlackwell,
       "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 "
       "[sm], 3;",
       "ctaMask must be a 16-bit register"},
      {kBlackwell, "tcgen05.commit.cta_group::2.mbarrier::arrive::one.multicast::cluster.b64 [sm];",
       "expected 2 operand"},
      {kBlackwell, "tcgen05.mmx.cta_group::1 [%r1];", "only tcgen05.{alloc"},
      {".version 8.6\n.target sm_100\n.address_size 64\n", "tcgen05.wait::ld.sync.aligned;",
       "sm_100a or sm_103a"},
      {".version 8.0\n.target sm_90a\n.address_size 64\n", "tcgen05.wait::ld.sync.aligned;",
       "sm_100a or sm_103a"},
      {".version 8.5\n.target sm_100a\n.address_size 64\n", "tcgen05.wait::st.sync.aligned;",
       ".version 8.6"},
      {".version 8.6\n.target sm_103a\n.address_size 64\n", "tcgen05.wait::st.sync.aligned;",
       ".version 8.8"},
  };
  for (const Bad &b : cases) {
    const std::string ptx = std::string(b.header) +
                            ".visible .entry k(.param .align 8 .b8 k_param[8])\n{\n"
                            "  .reg .b32 %r<4>;\n  .reg .b32 %v<4>;\n"
                            "  .shared .align 16 .b8 sm[16];\n  " +
                            b.line + "\n  ret;\n}\n";
    std::vector<uint8_t> bin;
    std::string log;
    fa_status st = g_be->compile(ptx, &bin, &log);
    if (st == FA_SUCCESS) {
      std::unique_ptr<fa::Kernel> k;
      st = g_be->load(ptx, bin, "k", 16, &k);
    }
    if (st == FA_SUCCESS) {
      std::fprintf(stderr, "accepted: %s\n", b.line);
      fail();
    }
    expect_error(b.why);
    expect_error("line 9");
  }
}

// ============================================ deliberate emulator bugs ====
// Each bug of emu/sm100.h, switched on, makes one of the checks above fail.

void test_deliberate_bugs(void **) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<ErrCase> cases = error_cases();
  {
    BugScope bug(fa::emu::kSm100BugLaneOffByOne);
    assert_false(roundtrip_ok(4, static_cast<uint32_t>(rng())));
  }
  {
    BugScope bug(fa::emu::kSm100BugColumnSwap);
    assert_false(roundtrip_ok(8, static_cast<uint32_t>(rng())));
  }
  const struct {
    int bug;
    const char *name;
  } checks[] = {
      {fa::emu::kSm100BugNoWaitLd, "read before wait::ld"},
      {fa::emu::kSm100BugNoWaitLd, "overwrite before wait::ld"},
      {fa::emu::kSm100BugNoWaitSt, "ld of a cell before wait::st"},
      {fa::emu::kSm100BugNoLeakCheck, "leak at exit"},
      {fa::emu::kSm100BugNoQuarter, "wrong quarter"},
  };
  for (const auto &c : checks) {
    BugScope bug(c.bug);
    assert_false(error_case_ok(error_case(cases, c.name)));
  }
  // And with no bug every check passes again.
  assert_true(roundtrip_ok(4, static_cast<uint32_t>(rng())));
}

// ======================================================= the builder ====

// Every tcgen05 form the builder emits: assembled by ptxas -arch=sm_100a
// and sm_103a (when a CUDA toolkit is there) and run on the emulator: warp
// 0 allocates, every warp stores its lanes' pattern with st.x<n> and loads
// it back with ld.x<n>, n = 1..128, then the warp frees and relinquishes.
void test_builder_forms(void **) {
  using namespace fa::ptx;
  Builder b("k_bld", 8);
  b.set_arch_specific(true);
  const Symbol sm = b.shared("tm", 16, 16);
  const Reg out = b.b64(), tid = b.b32(), warp = b.b32(), base = b.b32(), row = b.b32(),
            taddr = b.b32(), ncols = b.b32(), bad = b.b32(), q = b.b32();
  const Reg p0 = b.pred(), pbad = b.pred();
  b.ld_param(Type::U64, out, 0);
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.op(Op::Shr, Type::U32, warp, tid, imm(5));
  b.setp(Cmp::Ne, Type::U32, p0, warp, imm(0));
  const Label skip = b.label(), skip2 = b.label();
  b.when(p0).bra(skip);
  b.mov(Type::U32, ncols, imm(256));
  b.tcgen05_alloc(at(sm), ncols);
  b.tcgen05_alloc(at(sm, 4), imm(32));
  b.tcgen05_relinquish_alloc_permit();
  b.bind(skip);
  b.tcgen05_fence_before_thread_sync();
  b.bar_sync();
  b.tcgen05_fence_after_thread_sync();
  b.ld(Space::Shared, Type::U32, base, at(sm));
  b.op(Op::And, Type::B32, q, warp, imm(3));
  b.op(Op::Shl, Type::B32, row, q, imm(21));
  b.op(Op::Add, Type::U32, taddr, base, row);
  b.mov(Type::U32, bad, imm(0));
  std::vector<Reg> v(128), w(128);
  for (int i = 0; i < 128; ++i) {
    v[static_cast<size_t>(i)] = b.b32();
    w[static_cast<size_t>(i)] = b.b32();
  }
  int col = 0;
  for (int n = 1; n <= 128; n *= 2) {
    const Reg t = b.b32();
    b.op(Op::Add, Type::U32, t, taddr, imm(col));
    for (int j = 0; j < n; ++j)
      b.op(Op::MadLo, Type::U32, v[static_cast<size_t>(j)], tid, imm(1000), imm(col + j));
    b.tcgen05_st_32x32b(t, v.data(), n);
    b.tcgen05_wait_st();
    b.tcgen05_ld_32x32b(w.data(), n, t);
    b.tcgen05_wait_ld();
    for (int j = 0; j < n; ++j) {
      b.setp(Cmp::Ne, Type::U32, pbad, w[static_cast<size_t>(j)], v[static_cast<size_t>(j)]);
      b.selp(Type::U32, bad, imm(1), bad, pbad);
    }
    col += n;
  }
  const Reg addr = b.b64(), off = b.b64(), base2 = b.b32();
  b.mul_wide(Type::U32, off, tid, imm(4));
  b.op(Op::Add, Type::U64, addr, out, off);
  b.st(Space::Global, Type::U32, at(addr), bad);
  b.tcgen05_fence_before_thread_sync();
  b.bar_sync();
  b.when(p0).bra(skip2);
  b.ld(Space::Shared, Type::U32, base2, at(sm, 4));
  b.tcgen05_dealloc(base, ncols);
  b.tcgen05_dealloc(base2, imm(32));
  b.bind(skip2);
  b.ret();
  assert_int_equal(b.min_sm(), 100);
  assert_int_equal(b.min_isa_version(), 86);
  for (int sm : {100, 103}) {
    const std::string ptx = b.emit(sm == 103 ? 88 : 86, sm, 128);  // sm_103a: PTX ISA 8.8
    const std::string arch = "sm_" + std::to_string(sm) + "a";
    assert_true(ptx.find(".target " + arch) != std::string::npos);
    const int rc = ptxas_accepts(ptx, arch.c_str());
    if (rc == 0) {
      std::fprintf(stderr, "ptxas -arch=%s rejects:\n%s", arch.c_str(), ptx.c_str());
      fail();
    }
    if (sm != 100) continue;
    DevBuf res(128 * 4);
    uint64_t p = res.ptr;
    const fa_status st = run_ptx(ptx, "k_bld", geom(1, 128, 16), &p, sizeof p);
    if (st != FA_SUCCESS) std::fprintf(stderr, "%s\n", fa::last_error());
    assert_int_equal(st, FA_SUCCESS);
    for (uint32_t x : res.get<uint32_t>()) assert_int_equal(x, 0);
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ld_st_layout),    cmocka_unit_test(test_misuse),
      cmocka_unit_test(test_correct_use),     cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_deliberate_bugs), cmocka_unit_test(test_builder_forms),
  };
  return cmocka_run_group_tests(tests, emu_setup_sm<100>, emu_teardown);
}
