// Unit tests of the PTX builder (src/ptx) and of the generators' determinism
// and spec serialisation (src/kernels).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"  // last: its macros clash with <ios>

using namespace fa;
using namespace fa::ptx;

namespace {

bool contains(const std::string &s, const char *needle) {
  return s.find(needle) != std::string::npos;
}

// Runs fn in a child process; true when it died from SIGABRT (the builder's
// reaction to a malformed instruction).
bool aborts(const std::function<void()> &fn) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    // Silence the expected diagnostic.
    if (!freopen("/dev/null", "w", stderr)) _exit(3);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

void test_register_names_and_declarations(void **) {
  Builder b("k", 16);
  Reg r0 = b.b32(), r1 = b.b32(), f0 = b.f32(), rd0 = b.b64(), p0 = b.pred(), h0 = b.b16();
  assert_int_equal(r0.id, 0);
  assert_int_equal(r1.id, 1);
  assert_int_equal(f0.id, 0);
  b.op(Op::Add, Type::S32, r1, r0, imm(-7));
  b.op(Op::Fma, Type::F32, f0, f0, f0, f0);
  b.ld_param(Type::U64, rd0, 8);
  b.setp(Cmp::Lt, Type::S32, p0, r0, r1);
  b.cvt(Type::F16, Type::F32, Round::Rn, h0, f0);
  std::string s = b.emit(70, 80, 128);
  assert_true(contains(s, ".version 7.0\n.target sm_80\n.address_size 64\n"));
  assert_true(contains(
      s, ".visible .entry k(\n\t.param .align 8 .b8 k_param[16]\n)\n.maxntid 128, 1, 1\n"));
  assert_true(contains(s, "\t.reg .pred %p<1>;\n"));
  assert_true(contains(s, "\t.reg .b16 %h<1>;\n"));
  assert_true(contains(s, "\t.reg .b32 %r<2>;\n"));
  assert_true(contains(s, "\t.reg .b64 %rd<1>;\n"));
  assert_true(contains(s, "\t.reg .f32 %f<1>;\n"));
  assert_true(contains(s, "\tadd.s32 %r1, %r0, -7;\n"));
  assert_true(contains(s, "\tfma.rn.f32 %f0, %f0, %f0, %f0;\n"));
  assert_true(contains(s, "\tld.param.u64 %rd0, [k_param+8];\n"));
  assert_true(contains(s, "\tsetp.lt.s32 %p0, %r0, %r1;\n"));
  assert_true(contains(s, "\tcvt.rn.f16.f32 %h0, %f0;\n"));
}

void test_unused_classes_not_declared(void **) {
  Builder b("k", 8);
  Reg r = b.b32();
  b.mov(Type::U32, r, sreg(Special::TidX));
  std::string s = b.emit(78, 90, 0);
  assert_true(contains(s, ".target sm_90"));
  assert_true(contains(s, ".version 7.8"));
  assert_false(contains(s, ".maxntid"));
  assert_false(contains(s, "%f<"));
  assert_false(contains(s, "%p<"));
  assert_true(contains(s, "mov.u32 %r0, %tid.x;"));
}

void test_guards_labels_and_branches(void **) {
  Builder b("k", 8);
  Reg p = b.pred(), r = b.b32();
  Label l0 = b.label(), l1 = b.label();
  assert_int_equal(l0.id, 0);
  assert_int_equal(l1.id, 1);
  b.bind(l0);
  b.when(p).op(Op::Add, Type::U32, r, r, imm(1));
  b.unless(p).bra(l1);
  b.op(Op::Sub, Type::U32, r, r, imm(1));  // guard applies to one instruction only
  b.bind(l1);
  b.bar_sync();
  b.bar_warp_sync(0xffffffffu);
  b.exit();
  std::string s = b.emit(70, 80, 32);
  assert_true(contains(s,
                       "L_0:\n\t@%p0 add.u32 %r0, %r0, 1;\n\t@!%p0 bra L_1;\n"
                       "\tsub.u32 %r0, %r0, 1;\nL_1:\n\tbar.sync 0;\n"
                       "\tbar.warp.sync 4294967295;\n\texit;\n"));
}

void test_float_immediates_and_memory_forms(void **) {
  Builder b("k", 8);
  Symbol sm = b.shared("smem_x", 16, 256);
  Reg f = b.f32(), a = b.b32(), g = b.b64(), v[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
  b.mov(Type::F32, f, fimm(1.0f));
  b.mov(Type::F32, f, fimm(-__builtin_huge_valf()));
  b.op(Op::Mul, Type::F32, f, f, fimm(1.4426950408889634f));
  b.mov(Type::U32, a, sym(sm));
  b.ld_v(Space::Shared, Type::F32, {v[0], v[1], v[2], v[3]}, at(a, 32));
  b.st(Space::Shared, Type::F32, at(sm, 4), f);
  b.ld(Space::Global, Type::F32, f, at(g), true);
  b.shfl(Shfl::Bfly, f, f, imm(16), imm(31), 0xffffffffu);
  std::string s = b.emit(70, 80, 32);
  assert_true(contains(s, "mov.f32 %f0, 0f3F800000;"));
  assert_true(contains(s, "mov.f32 %f0, 0fFF800000;"));
  assert_true(contains(s, "mul.f32 %f0, %f0, 0f3FB8AA3B;"));
  assert_true(contains(s, "\t.shared .align 16 .b8 smem_x[256];\n"));
  assert_true(contains(s, "mov.u32 %r0, smem_x;"));
  assert_true(contains(s, "ld.shared.v4.f32 {%f1, %f2, %f3, %f4}, [%r0+32];"));
  assert_true(contains(s, "st.shared.f32 [smem_x+4], %f0;"));
  assert_true(contains(s, "ld.global.nc.f32 %f0, [%rd0];"));
  assert_true(contains(s, "shfl.sync.bfly.b32 %f0, %f0, 16, 31, 4294967295;"));
  assert_int_equal(b.shared_bytes(), 256);
}

void test_type_checks_abort(void **) {
  // Each of these is a generator bug: the builder aborts.
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg f = b.f32();
    b.op(Op::Add, Type::S32, f, f, f);  // f32 register in an s32 add
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.op(Op::Ex2, Type::S32, r, r);  // ex2 has no integer form
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), f = b.f32();
    b.ld(Space::Global, Type::F32, f, at(r));  // 32-bit global address
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg rd = b.b64(), f = b.f32();
    b.ld(Space::Shared, Type::F32, f, at(rd));  // 64-bit shared address
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg f = b.f32(), h = b.b16();
    b.cvt(Type::F32, Type::BF16, Round::None, f, h);  // cvt.f32.bf16 needs sm_90: not in the subset
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b64();
    b.ld_param(Type::U64, r, 4);  // beyond the 8-byte parameter
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.op(Op::Add, Type::F32, b.f32(), r, fimm(1.0f));  // b32 register in an f32 add
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.setp(Cmp::Ltu, Type::S32, b.pred(), r, r);  // unordered compare on integers
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.when(r).exit();  // guard must be a predicate
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.op(Op::Add, Type::U32, r, r);  // missing operand
  }));
  // Control: a well-formed instruction does not abort.
  assert_false(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), f = b.f32();
    b.op(Op::Add, Type::U32, r, r, imm(1));
    b.mov(Type::B32, f, r);  // b32 accepts any 32-bit register
  }));
}

// prmt (Op::Prmt) has only the .b32 form, with three sources; pack_b32 takes
// a b32 destination and two b16 halves (their printed forms and what the
// emulator makes of them: test_emulator's test_prmt_pack_builder).
void test_prmt_pack_checks_abort(void **) {
  for (Type t : {Type::U32, Type::S32, Type::B64, Type::F32}) {
    assert_true(aborts([t] {
      Builder b("k", 8);
      Reg r = t == Type::B64 ? b.b64() : t == Type::F32 ? b.f32() : b.b32();
      b.op(Op::Prmt, t, r, r, r, r);
    }));
  }
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.op(Op::Prmt, Type::B32, r, r, r);  // no selector
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), rd = b.b64();
    b.op(Op::Prmt, Type::B32, r, r, rd, imm(0x3210));  // a 64-bit source
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32();
    b.pack_b32(r, r, r);  // b32 halves
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg h = b.b16();
    b.pack_b32(h, h, h);  // a b16 destination
  }));
  // Control: the well-formed ones do not abort, and print as PTX writes them.
  Builder b("k", 8);
  Reg r = b.b32(), h = b.b16();
  b.op(Op::Prmt, Type::B32, r, r, r, imm(0x5140));
  b.op(Op::Prmt, Type::B32, r, r, r, r);
  b.pack_b32(r, h, h);
  const std::string s = b.emit(70, 80, 32);
  assert_true(contains(s, "\tprmt.b32 %r0, %r0, %r0, 20800;\n"));
  assert_true(contains(s, "\tprmt.b32 %r0, %r0, %r0, %r0;\n"));
  assert_true(contains(s, "\tmov.b32 %r0, {%h0, %h0};\n"));
}

// The tensor-core instructions print in the form the emulator and ptxas
// read (PTX ISA mma, ldmatrix, cp.async, cvt), dynamic shared memory is
// declared at module scope, and .minnctapersm follows .maxntid.
void test_tensor_core_forms(void **) {
  Builder b("k", 8);
  Symbol dyn = b.extern_shared("smem", 16);
  Symbol st = b.shared("smem_s", 16, 64);
  b.set_min_ctas_per_sm(1);
  Reg d[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
  Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  Reg s = b.b32(), g = b.b64(), n = b.b32();
  b.mov(Type::U32, s, sym(dyn));
  b.mma_m16n8k16(Type::BF16, d, a, a + 2, d);
  b.mma_m16n8k16(Type::F16, d, a, a, d);
  b.ldmatrix(false, a, 4, at(s, 64));
  b.ldmatrix(true, a, 2, at(s));
  b.ldmatrix(true, a, 1, at(st, 16));
  b.cp_async_cg16(at(s, 32), at(g), n);
  b.cp_async_cg16(at(s), at(g, 16), imm(0));
  b.cp_async_cg16(at(s, 16), at(g, 32));
  b.cp_async_ca(at(s, 8), at(g, 4), 4, n);
  b.cp_async_ca(at(s), at(g), 8, imm(0));
  Reg pv = b.pred(), pw = b.pred();
  b.vote(false, pw, pv, 0xffffffffu);
  b.cp_async_commit();
  b.cp_async_wait(1);
  b.cvt_pack(Type::BF16, n, d[1], d[0]);
  b.cvt_pack(Type::F16, n, d[3], d[2]);
  std::string t = b.emit(70, 80, 128);
  assert_true(contains(t, ".address_size 64\n\n.extern .shared .align 16 .b8 smem[];\n"));
  assert_true(contains(t, ".maxntid 128, 1, 1\n.minnctapersm 1\n{"));
  assert_true(contains(t, "\t.shared .align 16 .b8 smem_s[64];\n"));
  assert_false(contains(t, "\t.extern"));
  assert_int_equal(b.shared_bytes(), 64);
  assert_true(contains(t, "mov.u32 %r4, smem;"));
  assert_true(
      contains(t,
               "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f0, %f1, %f2, %f3}, "
               "{%r0, %r1, %r2, %r3}, {%r2, %r3}, {%f0, %f1, %f2, %f3};\n"));
  assert_true(contains(t, "\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0,"));
  assert_true(
      contains(t, "\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r0, %r1, %r2, %r3}, [%r4+64];\n"));
  assert_true(contains(t, "\tldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%r0, %r1}, [%r4];\n"));
  assert_true(contains(t, "\tldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%r0}, [smem_s+16];"));
  assert_true(contains(t, "\tcp.async.cg.shared.global [%r4+32], [%rd0], 16, %r5;\n"));
  assert_true(contains(t, "\tcp.async.cg.shared.global [%r4], [%rd0+16], 16, 0;\n"));
  assert_true(contains(t, "\tcp.async.cg.shared.global [%r4+16], [%rd0+32], 16;\n"));
  assert_true(contains(t, "\tcp.async.ca.shared.global [%r4+8], [%rd0+4], 4, %r5;\n"));
  assert_true(contains(t, "\tcp.async.ca.shared.global [%r4], [%rd0], 8, 0;\n"));
  assert_true(contains(t, "\tvote.sync.any.pred %p"));
  assert_true(contains(t, "\tcp.async.commit_group;\n\tcp.async.wait_group 1;\n"));
  assert_true(contains(t, "\tcvt.rn.bf16x2.f32 %r5, %f1, %f0;\n"));
  assert_true(contains(t, "\tcvt.rn.f16x2.f32 %r5, %f3, %f2;\n"));
}

void test_tensor_core_type_checks_abort(void **) {
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg d[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
    b.mma_m16n8k16(Type::F32, d, d, d, d);  // f32 A/B: not an f16/bf16 mma
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg d[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
    Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
    b.mma_m16n8k16(Type::F16, a, a, a, d);  // b32 accumulator
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg d[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
    b.mma_m16n8k16(Type::F16, d, d, d, d);  // f32 registers as A fragments
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
    b.ldmatrix(false, a, 3, at(a[0]));  // x3 does not exist
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
    Reg g = b.b64();
    b.ldmatrix(false, a, 4, at(g));  // 64-bit shared address
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg f[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
    Reg s = b.b32();
    b.ldmatrix(false, f, 4, at(s));  // f32 destinations
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg s = b.b32(), g = b.b64();
    b.cp_async_cg16(at(g), at(s), imm(16));  // shared and global swapped
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg s = b.b32(), g = b.b64();
    b.cp_async_cg16(at(s), at(g), imm(17));  // src-size above cp-size
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg s = b.b32(), g = b.b64();
    b.cp_async_cg16(at(s), at(g), g);  // 64-bit src-size
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg s = b.b32(), g = b.b64();
    b.cp_async_ca(at(s), at(g), 2, imm(0));  // no 2-byte cp.async
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg s = b.b32(), g = b.b64();
    b.cp_async_ca(at(s), at(g), 4, imm(8));  // src-size above cp-size
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), f = b.f32();
    b.cvt_pack(Type::F16, f, r, r);  // packed result in an f32 register, b32 sources
  }));
  assert_true(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), f = b.f32();
    b.cvt_pack(Type::F32, r, f, f);  // not a half type
  }));
  assert_false(aborts([] {
    Builder b("k", 8);
    Reg r = b.b32(), f = b.f32(), s = b.b32(), g = b.b64();
    b.cvt_pack(Type::BF16, r, f, f);
    b.cp_async_cg16(at(s), at(g), r);
  }));
}

// The fp8 mma (PTX ISA "mma", m16n8k32 with .e4m3 / .e5m2): the four forms
// print as ptxas reads them; the builder records sm_89 and PTX ISA 8.4 and
// emit() aborts for an older target or version (a generator bug, like any
// misuse) instead of printing PTX that ptxas would reject.
void test_fp8_mma_forms(void **) {
  auto build = [](Builder &b) {
    Reg d[4] = {b.f32(), b.f32(), b.f32(), b.f32()};
    Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
    b.mma_m16n8k32_f8(Fp8::E4M3, Fp8::E4M3, d, a, a + 2, d);
    b.mma_m16n8k32_f8(Fp8::E4M3, Fp8::E5M2, d, a, a, d);
    b.mma_m16n8k32_f8(Fp8::E5M2, Fp8::E4M3, d, a, a, d);
    b.mma_m16n8k32_f8(Fp8::E5M2, Fp8::E5M2, d, a, a, d);
  };
  Builder b("k", 8);
  assert_int_equal(b.min_sm(), 0);
  assert_int_equal(b.min_isa_version(), 0);
  build(b);
  assert_int_equal(b.min_sm(), 89);
  assert_int_equal(b.min_isa_version(), 84);
  const std::string t = b.emit(84, 89, 32);
  assert_true(contains(t, ".version 8.4\n.target sm_89\n"));
  assert_true(
      contains(t,
               "\tmma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f0, %f1, %f2, %f3}, "
               "{%r0, %r1, %r2, %r3}, {%r2, %r3}, {%f0, %f1, %f2, %f3};\n"));
  assert_true(contains(t, "\tmma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%f0,"));
  assert_true(contains(t, "\tmma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%f0,"));
  assert_true(contains(t, "\tmma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%f0,"));
  assert_false(aborts([&] { (void)b.emit(88, 90, 32); }));
  assert_true(aborts([&] { (void)b.emit(84, 80, 32); }));  // sm_80: no fp8 mma
  assert_true(aborts([&] { (void)b.emit(87, 86, 32); }));  // sm_86 neither
  assert_true(aborts([&] { (void)b.emit(83, 89, 32); }));  // PTX ISA 8.3: too old
  assert_true(aborts([&] {
    Builder c("k", 8);
    build(c);
    (void)std::move(c).emit(81, 89, 32);
  }));
  assert_true(aborts([] {
    Builder c("k", 8);
    Reg d[4] = {c.f32(), c.f32(), c.f32(), c.f32()};
    c.mma_m16n8k32_f8(Fp8::E4M3, Fp8::E4M3, d, d, d, d);  // f32 registers as A / B
  }));
  assert_true(aborts([] {
    Builder c("k", 8);
    Reg a[4] = {c.b32(), c.b32(), c.b32(), c.b32()};
    c.mma_m16n8k32_f8(Fp8::E5M2, Fp8::E4M3, a, a, a, a);  // b32 accumulators
  }));
}

// The sm_90a instructions (PTX ISA 8.0): target, parameter alignment and
// address, mbarriers, TMA, wgmma, setmaxnreg, named barriers.
void test_hopper_forms(void **) {
  Builder b("k", 256);
  b.set_arch_specific(true);
  b.set_param_align(64);
  Symbol dyn = b.extern_shared("smem", 1024);
  Reg s = b.b32(), tm = b.b64(), da = b.b64(), db = b.b64(), n = b.b32();
  Reg c[2] = {b.b32(), b.b32()};
  Reg p = b.pred();
  b.mov(Type::U32, s, sym(dyn));
  b.param_address(tm);
  b.mbarrier_init(at(s), imm(1));
  b.fence_proxy_async();
  b.mbarrier_arrive_expect_tx(at(s, 8), imm(16384));
  b.cp_async_bulk_tensor(at(s, 1024), tm, c, 2, at(s, 8));
  b.mbarrier_arrive(at(s));
  b.mbarrier_try_wait_parity(p, at(s, 8), n);
  std::vector<Reg> d(64);
  for (Reg &r : d) r = b.f32();
  Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  b.wgmma_fence();
  b.wgmma_ss(Type::BF16, 128, d.data(), da, db, imm(0), false);
  b.wgmma_rs(Type::F16, 16, d.data(), a, db, p, true);
  b.wgmma_commit();
  b.wgmma_wait(1);
  b.setmaxnreg(true, 240);
  b.setmaxnreg(false, 24);
  b.bar_sync(1, 256);
  b.bar_arrive(2, 128);
  const std::string t = b.emit(80, 90, 384);
  assert_true(contains(t, "\n.target sm_90a\n"));
  assert_true(contains(t, "\t.param .align 64 .b8 k_param[256]\n"));
  assert_true(contains(t, "\tmov.u64 %rd0, k_param;\n\tcvta.param.u64 %rd0, %rd0;\n"));
  assert_true(contains(t, "\tmbarrier.init.shared::cta.b64 [%r0], 1;\n"));
  assert_true(contains(t, "\tfence.proxy.async.shared::cta;\n"));
  assert_true(contains(t, "\tmbarrier.arrive.expect_tx.shared::cta.b64 _, [%r0+8], 16384;\n"));
  assert_true(contains(t,
                       "\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::"
                       "bytes [%r0+1024], [%rd0, {%r2, %r3}], [%r0+8];\n"));
  assert_true(contains(t, "\tmbarrier.arrive.shared::cta.b64 _, [%r0];\n"));
  assert_true(contains(t, "\tmbarrier.try_wait.parity.shared::cta.b64 %p0, [%r0+8], %r1;\n"));
  assert_true(contains(t, "\twgmma.fence.sync.aligned;\n"));
  assert_true(contains(t, "\twgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f0, %f1, "));
  assert_true(contains(t, "%f62, %f63}, %rd1, %rd2, 0, 1, 1, 0, 0;\n"));
  assert_true(contains(t,
                       "\twgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%f0, %f1, %f2, %f3, "
                       "%f4, %f5, %f6, %f7}, {%r4, %r5, %r6, %r7}, %rd2, %p0, 1, 1, 1;\n"));
  assert_true(
      contains(t, "\twgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 1;"));
  assert_true(contains(t, "\tsetmaxnreg.inc.sync.aligned.u32 240;\n"));
  assert_true(contains(t, "\tsetmaxnreg.dec.sync.aligned.u32 24;\n"));
  assert_true(contains(t, "\tbar.sync 1, 256;\n\tbar.arrive 2, 128;\n"));
  // Misuse aborts.
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> d(6);
    for (Reg &r : d) r = x.f32();
    Reg g = x.b64();
    x.wgmma_ss(Type::BF16, 12, d.data(), g, g, imm(1), false);  // N not a multiple of 8
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> d(4);
    for (Reg &r : d) r = x.f32();
    Reg g = x.b64();
    x.wgmma_ss(Type::F32, 8, d.data(), g, g, imm(1), false);  // tf32 is not offered
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> d(4);
    for (Reg &r : d) r = x.f32();
    Reg g = x.b64(), r = x.b32();
    x.wgmma_ss(Type::F16, 8, d.data(), g, g, r, false);  // scale-d not a predicate
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> d(4);
    for (Reg &r : d) r = x.f32();
    Reg g = x.b64();
    x.wgmma_ss(Type::F16, 8, d.data(), g, d[0], imm(1), false);  // f32 descriptor
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.setmaxnreg(true, 20);  // below 24
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.bar_sync(16, 64);  // id above 15
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.bar_arrive(1, 100);  // not a multiple of 32
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    Reg g = x.b64(), tm = x.b64();
    Reg c[1] = {x.b32()};
    x.cp_async_bulk_tensor(at(g), tm, c, 1, at(g));  // global destination address
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    Reg s = x.b32(), r = x.b32();
    x.mbarrier_try_wait_parity(r, at(s), imm(0));  // result not a predicate
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.wgmma_wait(8);  // 0..7
  }));
}

// ptxas assembles module text t for sm_90a (skipped without a CUDA toolkit).
void assemble_sm90a(const std::string &t) {
  const std::string ptxas = FA_PTXAS_PATH;
  if (ptxas.empty() || access(ptxas.c_str(), X_OK) != 0) {
    std::printf("no ptxas: not assembled\n");
    return;
  }
  char path[] = "/tmp/fa_builder_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_true(write(fd, t.data(), t.size()) == static_cast<ssize_t>(t.size()));
  close(fd);
  const std::string cmd = "'" + ptxas + "' -arch=sm_90a '" + path + "' -o '" + path + ".cubin'";
  const int rc = std::system(cmd.c_str());
  unlink(path);
  unlink((std::string(path) + ".cubin").c_str());
  if (rc != 0) std::fprintf(stderr, "%s", t.c_str());
  assert_int_equal(rc, 0);
}

// wgmma_ss_fp8 / wgmma_rs_fp8: m64nNk32 with .e4m3 / .e5m2 A and B, no
// imm-trans operands (fp8 is K-major only), imm-scale 1; misuse aborts; a
// small sm_90a kernel with both assembles with ptxas.
void test_wgmma_fp8_forms(void **) {
  Builder b("k_w8", 8);
  b.set_arch_specific(true);
  Reg da = b.b64(), db = b.b64(), g = b.b64();
  Reg p = b.pred();
  std::vector<Reg> d(128);
  for (Reg &r : d) r = b.f32();
  Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  b.mov(Type::U64, da, imm(0));
  b.mov(Type::U64, db, imm(0));
  for (Reg x : a) b.mov(Type::B32, x, imm(0x38383838));
  b.ld_param(Type::U64, g, 0);
  b.setp(fa::ptx::Cmp::Ne, Type::U64, p, g, imm(0));
  b.wgmma_fence();
  b.wgmma_ss_fp8(Fp8::E4M3, Fp8::E5M2, 256, d.data(), da, db, imm(0));
  b.wgmma_rs_fp8(Fp8::E5M2, Fp8::E4M3, 8, d.data(), a, db, p);
  b.wgmma_ss_fp8(Fp8::E5M2, Fp8::E5M2, 8, d.data(), da, db, imm(1));
  b.wgmma_commit();
  b.wgmma_wait(0);
  for (int i = 0; i < 4; ++i) b.st(fa::ptx::Space::Global, Type::F32, at(g, 4 * i), d[i]);
  b.exit();
  const std::string t = b.emit(80, 90, 32);
  assert_true(contains(t, "\twgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e5m2 {%f0, %f1, "));
  assert_true(contains(t, "%f126, %f127}, %rd0, %rd1, 0, 1, 1;\n"));
  assert_true(
      contains(t,
               "\twgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e4m3 {%f0, %f1, %f2, %f3}, "
               "{%r0, %r1, %r2, %r3}, %rd1, %p0, 1, 1;\n"));
  assert_true(
      contains(t,
               "\twgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2 {%f0, %f1, %f2, %f3}, "
               "%rd0, %rd1, 1, 1, 1;\n"));
  // Misuse aborts.
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> q(6);
    for (Reg &r : q) r = x.f32();
    x.wgmma_ss_fp8(Fp8::E4M3, Fp8::E4M3, 12, q.data(), x.b64(), x.b64(), imm(1));  // N % 8
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> q(4);
    for (Reg &r : q) r = x.f32();
    Reg f[4] = {x.f32(), x.f32(), x.f32(), x.f32()};
    x.wgmma_rs_fp8(Fp8::E4M3, Fp8::E4M3, 8, q.data(), f, x.b64(), imm(1));  // A not b32
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    std::vector<Reg> q(4);
    for (Reg &r : q) r = x.f32();
    x.wgmma_ss_fp8(Fp8::E4M3, Fp8::E4M3, 8, q.data(), x.b32(), x.b64(), imm(1));  // b32 desc
  }));
  assemble_sm90a(t);
}

AttentionConfig config(int d, int dv, int hq, int hkv, Dtype dt, float softcap) {
  return attention_config(dt, d, dv, hq, hkv, 0.125f, softcap);
}

// stmatrix (PTX ISA 7.8) and elect.sync (8.0), sm_90: printed forms, misuse,
// and a small sm_90a kernel using both that ptxas assembles.
void test_stmatrix_elect_forms(void **) {
  Builder b("k_se", 8);
  b.set_arch_specific(true);
  Symbol s = b.shared("smem_s", 16, 1024);
  Reg r[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  Reg a = b.b32(), lane = b.b32(), p = b.pred(), g = b.b64();
  b.mov(Type::U32, a, sym(s));
  for (Reg x : r) b.mov(Type::B32, x, imm(0x3c003c00));
  b.stmatrix(false, r, 4, at(a, 64));
  b.stmatrix(true, r, 2, at(a));
  b.stmatrix(false, r, 1, at(s, 16));
  b.elect_sync(p, 0xffffffffu);
  b.elect_sync(lane, p, 0x0000ff00u);
  b.when(p).st(Space::Shared, Type::U32, at(a), lane);
  b.ld_param(Type::U64, g, 0);
  b.exit();
  const std::string t = b.emit(80, 90, 32);
  assert_true(
      contains(t, "\tstmatrix.sync.aligned.m8n8.x4.shared.b16 [%r4+64], {%r0, %r1, %r2, %r3};\n"));
  assert_true(contains(t, "\tstmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%r4], {%r0, %r1};\n"));
  assert_true(contains(t, "\tstmatrix.sync.aligned.m8n8.x1.shared.b16 [smem_s+16], {%r0};\n"));
  assert_true(contains(t, "\telect.sync _|%p0, 0xffffffff;\n"));
  assert_true(contains(t, "\telect.sync %r5|%p0, 0x0000ff00;\n"));
  // Misuse aborts.
  assert_true(aborts([] {
    Builder x("k", 8);
    Reg q[3] = {x.b32(), x.b32(), x.b32()};
    x.stmatrix(false, q, 3, at(q[0]));  // x3 does not exist
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    Reg q[2] = {x.b32(), x.b32()};
    Reg w = x.b64();
    x.stmatrix(true, q, 2, at(w));  // 64-bit shared address
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    Reg q[1] = {x.f32()};
    Reg w = x.b32();
    x.stmatrix(false, q, 1, at(w));  // f32 source
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.elect_sync(x.b32(), 0xffffffffu);  // not a predicate
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.elect_sync(x.b64(), x.pred(), 0xffffffffu);  // lane id not b32
  }));
  assert_true(aborts([] {
    Builder x("k", 8);
    x.elect_sync(x.b32(), x.b32(), 0xffffffffu);  // second not a predicate
  }));
  // ptxas assembles it for sm_90a (skipped without a CUDA toolkit).
  assemble_sm90a(t);
}

void test_generation_is_deterministic(void **) {
  const KernelKind kinds[] = {KernelKind::Forward, KernelKind::Decode, KernelKind::Reduce};
  for (KernelKind k : kinds) {
    KernelSpec s = make_spec(config(128, 128, 8, 2, Dtype::BF16, 30.f), k, 80, false);
    std::string a = generate_ptx(s), b = generate_ptx(s);
    assert_true(a.size() > 1000);
    assert_true(a == b);
    assert_true(contains(a, (".visible .entry " + entry_name(s) + "(").c_str()));
    assert_true(s.serialize() ==
                make_spec(config(128, 128, 8, 2, Dtype::BF16, 30.f), k, 80, false).serialize());
  }
}

void test_specs_differ(void **) {
  // Every variation below must change both the PTX and the serialised spec.
  std::set<std::string> ptx, bytes, names, desc;
  struct V {
    int d, dv, hq, hkv;
    Dtype dt;
    float cap;
    KernelKind kind;
    int sm;
    bool varlen;
  };
  const V vs[] = {
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Forward, 80, false},
      {64, 64, 4, 4, Dtype::BF16, 0, KernelKind::Forward, 80, false},
      {64, 64, 4, 4, Dtype::F16, 10, KernelKind::Forward, 80, false},
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Forward, 80, true},
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Forward, 86, false},
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Forward, 90, false},
      {72, 64, 4, 4, Dtype::F16, 0, KernelKind::Forward, 80, false},
      {64, 72, 4, 4, Dtype::F16, 0, KernelKind::Forward, 80, false},
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Decode, 80, false},
      {64, 64, 8, 2, Dtype::F16, 0, KernelKind::Decode, 80, false},
      {64, 64, 8, 1, Dtype::F16, 0, KernelKind::Decode, 80, false},
      {64, 64, 4, 4, Dtype::F16, 0, KernelKind::Reduce, 80, false},
      {64, 128, 4, 4, Dtype::F16, 0, KernelKind::Reduce, 80, false},
  };
  for (const V &v : vs) {
    KernelSpec s = make_spec(config(v.d, v.dv, v.hq, v.hkv, v.dt, v.cap), v.kind, v.sm, v.varlen);
    ptx.insert(generate_ptx(s));
    bytes.insert(s.serialize());
    desc.insert(s.describe());
  }
  const size_t n = sizeof vs / sizeof vs[0];
  assert_int_equal(ptx.size(), n);
  assert_int_equal(bytes.size(), n);
  assert_int_equal(desc.size(), n);
}

void test_spec_choices(void **) {
  // Tensor-core forward tiles (docs/kernels.md, "Tile choice"), from each
  // SM's published limits: 2 m-tiles per warp while the accumulators fit
  // (Q in registers up to head dim 64), then 1; 8 warps where 4 would leave
  // fewer warps per SM; shared memory = Q + one K + one V tile, 16-byte row
  // padding, or the O staging tile if larger.
  auto fwd = [](int d, int dv, int sm, bool varlen = false) {
    return make_spec(config(d, dv, 4, 4, Dtype::F16, 0), KernelKind::Forward, sm, varlen);
  };
  // sm_90 runs the wgmma forward by default (docs/kernels.md, "Forward on
  // sm_90a"): 384 threads, 128 rows, block_n from registers, stages from
  // shared memory; varlen takes its gather variant, the environment's
  // override mma.sync.
  {
    const KernelSpec w = fwd(128, 128, 90);
    assert_true(w.wgmma && w.mma && w.num_warps == 12 && w.block_m == 128);
    assert_int_equal(w.block_n, 128);
    assert_int_equal(w.stages, 3);
    DeviceLimits h100;
    assert_true(published_limits(90, &h100));
    assert_true(max_dynamic_smem(w) <= h100.smem_per_block_optin);
    const KernelSpec w256 = fwd(256, 256, 90);
    assert_true(w256.wgmma && w256.block_n == 64 && w256.stages == 2);
    assert_true(w.gather == false);
    const KernelSpec wv = fwd(128, 128, 90, true);  // varlen: the gather variant
    assert_true(wv.wgmma && wv.gather && wv.varlen && wv.block_n == 128);
    assert_false(fwd(128, 128, 80).wgmma);
    assert_false(fwd(128, 128, 100).wgmma);  // sm_90a code runs on sm_90 only
    setenv("FLASHATTN_FORCE_SM80_FORWARD", "1", 1);
    assert_false(fwd(128, 128, 90).wgmma);
  }
  // The mma.sync forward's tiles (FLASHATTN_FORCE_SM80_FORWARD=1 keeps it on sm_90).
  const KernelSpec f64 = fwd(64, 64, 90);
  assert_true(f64.mma);
  assert_int_equal(f64.m_tiles, 2);
  assert_true(f64.q_in_regs);
  assert_int_equal(f64.block_m, 128);
  assert_int_equal(f64.block_n, 64);
  assert_int_equal(f64.num_warps, 4);
  assert_int_equal(f64.stages, 1);
  assert_int_equal(f64.min_ctas, 2);
  assert_int_equal(max_dynamic_smem(f64), (128 + 64 + 64) * (2 * 64 + 16));
  const KernelSpec f128 = fwd(128, 128, 80);
  assert_int_equal(f128.m_tiles, 2);
  assert_false(f128.q_in_regs);
  assert_int_equal(f128.block_m, 128);
  assert_int_equal(f128.min_ctas, 2);  // 68 KB twice in sm_80's 164 KB
  assert_int_equal(max_dynamic_smem(f128), (128 + 64 + 64) * (2 * 128 + 16));
  // d256: H100 fits two 64x64 CTAs of 4 warps (99 KB each); A100 one, so
  // 8 warps of 16 rows (128x64, 132 KB) give it FlashAttention-2's 8 warps.
  const KernelSpec f256h = fwd(256, 256, 90), f256a = fwd(256, 256, 80);
  assert_int_equal(f256h.m_tiles, 1);
  assert_int_equal(f256h.num_warps, 4);
  assert_int_equal(f256h.min_ctas, 2);
  assert_int_equal(f256a.num_warps, 8);
  assert_int_equal(f256a.block_m, 128);
  assert_int_equal(f256a.min_ctas, 1);
  // sm_120 (99 KB per block, 100 KB per SM) must launch: the SM's limits, not
  // a table by SM number, size the tile.
  for (int sm : {80, 86, 87, 89, 90, 100, 103, 110, 120, 121}) {
    DeviceLimits lim;
    assert_true(published_limits(sm, &lim));
    for (int d = 8; d <= 256; d += 8) {
      for (int dv = 8; dv <= 256; dv += 24) {
        KernelSpec x = fwd(d, dv, sm, (d + dv) % 3 == 0);
        // sm_100 / sm_103: the tcgen05 forward (a ring of 2..6 slots).
        if (sm == 100 || sm == 103)
          assert_true(x.tcgen05 && x.stages >= 2);
        else
          assert_true(x.mma && x.stages == 1 && x.min_ctas >= 1);
        assert_true(max_dynamic_smem(x) <= lim.smem_per_block_optin);
        assert_false(generate_ptx(x).empty());
      }
    }
  }
  // A device reporting its own (smaller) limits gets a smaller tile.
  DeviceLimits tiny;
  assert_true(published_limits(80, &tiny));
  tiny.smem_per_sm = 48 * 1024;
  tiny.smem_per_block_optin = 47 * 1024;
  const KernelSpec t =
      make_spec(config(128, 128, 4, 4, Dtype::F16, 0), KernelKind::Forward, tiny, false);
  assert_true(max_dynamic_smem(t) <= 47 * 1024);
  assert_int_equal(t.m_tiles, 1);
  const KernelSpec f = fwd(256, 256, 80);
  // Decode on tensor cores: 16 packed rows, 4 warps x 3 stages at d128
  // (2 CTAs per SM on sm_90's 228 KB, 1 on sm_80's 164 KB), Q re-read from
  // shared memory past d128; every SM's tile fits its opt-in limit.
  const KernelSpec d80 =
      make_spec(config(128, 128, 32, 8, Dtype::F16, 0), KernelKind::Decode, 80, false);
  assert_true(d80.mma && d80.block_m == 16 && d80.num_warps == 4 && d80.stages == 3);
  assert_true(d80.q_in_regs && d80.group_size == 4 && d80.min_ctas == 1);
  const KernelSpec d90 =
      make_spec(config(128, 128, 32, 8, Dtype::F16, 0), KernelKind::Decode, 90, false);
  assert_int_equal(d90.min_ctas, 2);
  const KernelSpec d256 =
      make_spec(config(256, 256, 8, 8, Dtype::F16, 0), KernelKind::Decode, 80, false);
  assert_true(d256.mma && !d256.q_in_regs && d256.stages == 2);
  for (int sm : {80, 86, 89, 90, 120}) {
    DeviceLimits lim;
    assert_true(published_limits(sm, &lim));
    for (int d : {8, 64, 128, 200, 256}) {
      const KernelSpec x =
          make_spec(config(d, d, 8, 2, Dtype::BF16, 0), KernelKind::Decode, sm, false);
      assert_true(x.mma && x.min_ctas >= 1);
      assert_true(max_dynamic_smem(x) > 0 && max_dynamic_smem(x) <= lim.smem_per_block_optin);
      assert_false(generate_ptx(x).empty());
    }
  }
  // FLASHATTN_SCALAR_DECODE=1 keeps the scalar kernel (static shared memory).
  setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
  const KernelSpec ds =
      make_spec(config(128, 128, 8, 2, Dtype::F16, 0), KernelKind::Decode, 80, false);
  unsetenv("FLASHATTN_SCALAR_DECODE");
  assert_false(ds.mma);
  assert_int_equal(max_dynamic_smem(ds), 0);
  KernelSpec v = f;
  const int isa[][2] = {{80, 70},  {86, 71},  {87, 74},  {89, 78},  {90, 78},
                        {100, 86}, {103, 88}, {110, 90}, {120, 87}, {121, 88}};
  for (const auto &p : isa) {
    v.sm = p[0];
    assert_int_equal(ptx_isa_version(v), p[1]);
  }
  KernelSpec d = make_spec(config(128, 128, 32, 4, Dtype::F16, 0), KernelKind::Decode, 80, false);
  assert_int_equal(d.group_size, 8);
  ForwardParams fp{};
  fp.batch = 3;
  fp.seqlen_q = 33;
  fp.num_heads_q = 5;
  LaunchGeometry g = forward_geometry(f, fp);
  assert_int_equal(g.grid[0], (33 + f.block_m - 1) / f.block_m);
  assert_int_equal(g.grid[1], 5);
  assert_int_equal(g.grid[2], 3);
  assert_int_equal(g.block[0], 32 * f.num_warps);
  assert_int_equal(g.smem_bytes, max_dynamic_smem(f));
  DecodeParams dp{};
  dp.batch = 2;
  dp.seqlen_q = 3;
  dp.num_heads_kv = 4;
  dp.num_splits = 7;
  g = decode_geometry(d, dp);
  assert_int_equal(g.grid[0], 7);
  assert_int_equal(g.grid[1], 4 * ((8 * 3 + d.block_m - 1) / d.block_m));
  assert_int_equal(g.grid[2], 2);
  // An invalid spec yields no PTX rather than a malformed module.
  KernelSpec bad = f;
  bad.head_dim = 12;
  assert_true(generate_ptx(bad).empty());
  unsetenv("FLASHATTN_FORCE_SM80_FORWARD");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_names_and_declarations),
      cmocka_unit_test(test_unused_classes_not_declared),
      cmocka_unit_test(test_guards_labels_and_branches),
      cmocka_unit_test(test_float_immediates_and_memory_forms),
      cmocka_unit_test(test_type_checks_abort),
      cmocka_unit_test(test_prmt_pack_checks_abort),
      cmocka_unit_test(test_tensor_core_forms),
      cmocka_unit_test(test_tensor_core_type_checks_abort),
      cmocka_unit_test(test_fp8_mma_forms),
      cmocka_unit_test(test_hopper_forms),
      cmocka_unit_test(test_stmatrix_elect_forms),
      cmocka_unit_test(test_wgmma_fp8_forms),
      cmocka_unit_test(test_generation_is_deterministic),
      cmocka_unit_test(test_specs_differ),
      cmocka_unit_test(test_spec_choices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
