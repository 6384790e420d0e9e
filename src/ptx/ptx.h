// PTX builder: typed virtual registers, instructions checked operand by
// operand when each is built, counter-derived labels, and an emitter that
// prints one deterministic module (header, one entry with a single .param
// byte array, register and shared declarations, body).
//
// Generation time matters (every kernel-cache miss pays it), so each
// instruction is printed into the body text as soon as it has been checked:
// no instruction list, no per-instruction heap allocation. The declarations
// that depend on the final register counts are printed by emit().
//
// Only the PTX subset listed in notes/common.md (and docs/kernels.md) can be
// built. A type mismatch (an f32 register given to add.s32, a b64 address for
// a shared access, a cvt pair outside the subset, ...) is a bug in a
// generator, never a user error: the builder prints the offending
// instruction to stderr and calls std::abort(), in every build type. The
// generators are deterministic and tests/test_ptxas.cc builds every kind, so
// such a bug cannot hide behind a particular user input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace fa {
namespace ptx {

// Register classes: one `.reg` declaration line and one name prefix each.
enum class RegClass : uint8_t { Pred = 0, B16, B32, B64, F32 };
constexpr int kNumRegClasses = 5;

// Instruction type suffixes (.s32, .f32, ...).
enum class Type : uint8_t { Pred, B16, U16, F16, BF16, B32, U32, S32, F32, B64, U64, S64 };

const char *type_name(Type t);       // "s32"
RegClass class_of(Type t);           // register class that holds a value of t
const char *class_prefix(RegClass);  // "%r"

struct Reg {
  RegClass cls = RegClass::B32;
  uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};

struct Label {
  uint32_t id = UINT32_MAX;
};

// A shared-memory (or other module-level) symbol declared by the builder.
struct Symbol {
  uint32_t id = UINT32_MAX;
};

// Special registers (PTX ISA "Special Registers"), read with mov.u32. The
// cluster ones (ClusterCtarank..) need sm_90 and PTX ISA 7.8 (mov records it);
// without a cluster launch they describe the implicit 1x1x1 cluster.
enum class Special : uint8_t {
  TidX,
  NtidX,
  CtaidX,
  CtaidY,
  CtaidZ,
  NctaidX,
  NctaidY,
  LaneId,
  ClusterCtarank,   // %cluster_ctarank: the CTA's rank in its cluster
  ClusterNctarank,  // %cluster_nctarank: CTAs per cluster
  ClusteridX,       // %clusterid.{x,y,z}: the cluster's position in the grid
  ClusteridY,
  ClusteridZ,
  NclusteridX,  // %nclusterid.{x,y,z}: clusters per grid dimension
  NclusteridY,
  NclusteridZ,
  ClusterCtaidX,  // %cluster_ctaid.{x,y,z}: the CTA's position in its cluster
  ClusterCtaidY,
  ClusterCtaidZ,
  ClusterNctaidX,  // %cluster_nctaid.{x,y,z}: the cluster's shape
  ClusterNctaidY,
  ClusterNctaidZ
};

// A source operand: register, integer immediate, f32 immediate (printed as
// 0fXXXXXXXX), symbol address (mov.u32 d, NAME) or special register.
struct Operand {
  enum class Kind : uint8_t { Reg, Imm, F32, Symbol, Special };
  Kind kind = Kind::Reg;
  Special special = Special::TidX;
  Reg reg;
  float f = 0;
  // Integer immediate, or the symbol id (Kind::Symbol).
  int64_t imm = 0;
  Operand(Reg r) : kind(Kind::Reg), reg(r) {}  // NOLINT: implicit by design
  Operand() = default;
};
Operand imm(int64_t v);
Operand fimm(float v);
Operand sym(Symbol s);
Operand sreg(Special s);

// A memory address: [reg+offset] or [NAME+offset], offset >= 0.
struct Addr {
  Reg base;                   // valid: register base
  uint32_t sym = UINT32_MAX;  // else: symbol base
  int64_t offset = 0;
};
inline Addr at(Reg r, int64_t off = 0) { return Addr{r, UINT32_MAX, off}; }
inline Addr at(Symbol s, int64_t off = 0) { return Addr{Reg{}, s.id, off}; }

// Cluster: .shared::cluster (sm_90, PTX ISA 7.8): a b32 address from mapa
// (another CTA's shared memory) or a shared::cta one (the executing CTA's).
enum class Space : uint8_t { Global, Shared, Cluster };
enum class Cmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan };
enum class Shfl : uint8_t { Bfly, Idx, Up, Down };
enum class Round : uint8_t { None, Rn, Rzi, Rni };
// The fp8 formats of mma's A and B operands (PTX ISA "Alternate
// Floating-Point Data Formats").
enum class Fp8 : uint8_t { E4M3, E5M2 };

// Arithmetic and logic operations, each "name.type d, a[, b[, c]]".
enum class Op : uint8_t {
  Add,
  Sub,
  MulLo,
  MadLo,
  Div,
  Rem,
  Min,
  Max,
  Neg,
  Abs,  // integer (add/sub/min/max/neg/abs also f32)
  And,
  Or,
  Xor,
  Not,
  Shl,
  Shr,  // bits
  Mul,
  MulFtz,
  AddFtz,
  SubFtz,
  Fma,
  FmaFtz,
  DivRn,
  DivApprox,
  RcpRn,
  RcpApprox,
  Sqrt,
  Ex2,
  Lg2,
  Tanh,  // f32 only
  // prmt.b32 d, a, b, c (default mode): byte i of d is byte c[4i+2:4i] of
  // the eight bytes {b, a} (a's bytes 0..3, b's 4..7), or that byte's sign
  // replicated when c[4i+3] is set (PTX ISA "prmt"). b32 only.
  Prmt,
  // max.f32 d, a, b, c: the largest of three (PTX ISA "max": three inputs
  // need sm_100 and PTX ISA 8.8). f32 only.
  Max3
};

class Builder {
 public:
  // `entry`: the entry name; `param_bytes`: size of its single parameter.
  Builder(std::string entry, uint32_t param_bytes);

  Reg reg(RegClass c);
  Reg pred() { return reg(RegClass::Pred); }
  Reg b16() { return reg(RegClass::B16); }
  Reg b32() { return reg(RegClass::B32); }
  Reg b64() { return reg(RegClass::B64); }
  Reg f32() { return reg(RegClass::F32); }
  uint32_t num_regs(RegClass c) const { return counts_[static_cast<int>(c)]; }

  Label label();
  void bind(Label l);  // "L_<id>:" at this point
  // Declares `.shared .align A .b8 NAME[bytes]`.
  Symbol shared(const std::string &name, uint32_t align, uint32_t bytes);
  // Declares `.extern .shared .align A .b8 NAME[]` (dynamic shared memory,
  // sized at launch; PTX ISA "State Spaces: Shared State Space").
  Symbol extern_shared(const std::string &name, uint32_t align);
  // Static shared bytes (extern arrays excluded).
  uint32_t shared_bytes() const;

  // Guards the next instruction built with @p (when) or @!p (unless).
  // Build the operands first: in `b.when(p).st(..., at(e.index(...)), v)`
  // the guard would land on the first instruction index() emits.
  Builder &when(Reg p);
  Builder &unless(Reg p);
  void comment(const std::string &text);

  // ---- memory (PTX ISA "Data Movement and Conversion Instructions": ld, st, cvta) ----
  void ld_param(Type t, Reg d, uint32_t offset);
  void ld(Space s, Type t, Reg d, Addr a, bool nc = false);
  void ld_v(Space s, Type t, std::initializer_list<Reg> d, Addr a, bool nc = false);
  void st(Space s, Type t, Addr a, Reg v);
  void st_v(Space s, Type t, Addr a, std::initializer_list<Reg> v);
  void cvta_to_global(Reg d, Reg a);
  // atom.global.{relaxed,acq_rel}.gpu.add.T d, [a], b (PTX ISA "atom"): T
  // U32 or S32; d (b32) = the word's old value, the word += b. acq_rel:
  // this thread's earlier accesses happen before the add, and the writes
  // released by other threads' adds of the word before it are visible
  // after it. Needs sm_70 and PTX ISA 6.0 (the .sem and .scope qualifiers).
  void atom_add(bool acq_rel, Type t, Reg d, Addr a, Operand b);
  // atom.{global,shared}.{relaxed,acq_rel}.{gpu,cta}.add.T d, [a], b (PTX ISA
  // "atom"): as above in either space (shared: .cta scope, a b32 address), T
  // U32, S32 or F32 (d and b f32 registers or b32; the add rounds to nearest
  // even; on global memory subnormal inputs and result flush to zero, on
  // shared memory they do not). sm_70, PTX ISA 6.0.
  void atom_add(Space s, bool acq_rel, Type t, Reg d, Addr a, Operand b);
  // red.{global,shared}.{relaxed,release}.{gpu,cta}.add.T [a], b (PTX ISA
  // "red"): atom_add without the old value; release: this thread's earlier
  // accesses happen before the add. sm_70, PTX ISA 6.0.
  void red_add(Space s, bool release, Type t, Addr a, Operand b);
  // red.global.relaxed.gpu.add.vN.f32 [a], {v} (PTX ISA "red", vector
  // types): N = 2 or 4 f32 registers added to the N consecutive words at a
  // (8- or 16-byte aligned), each element atomic on its own. sm_90, PTX ISA
  // 8.1.
  void red_add_v(Addr a, std::initializer_list<Reg> v);

  // ---- data movement, arithmetic, comparison, conversion ----
  void mov(Type t, Reg d, Operand a);
  void op(Op o, Type t, Reg d, Operand a);
  void op(Op o, Type t, Reg d, Operand a, Operand b);
  void op(Op o, Type t, Reg d, Operand a, Operand b, Operand c);
  void mul_wide(Type t, Reg d, Operand a, Operand b);             // t: s32/u32, d: b64
  void mad_wide(Type t, Reg d, Operand a, Operand b, Operand c);  // c: b64
  void setp(Cmp c, Type t, Reg p, Operand a, Operand b);
  void selp(Type t, Reg d, Operand a, Operand b, Reg p);
  void cvt(Type dt, Type st, Round r, Reg d, Reg a);

  // ---- control flow and collectives (PTX ISA "Control Flow Instructions",
  // "Parallel Synchronization and Communication Instructions": bar, bar.warp.sync) ----
  void bra(Label l, bool uni = false);
  void ret();
  void exit();
  void bar_sync();                    // bar.sync 0
  void bar_warp_sync(uint32_t mask);  // bar.warp.sync mask
  // shfl.sync.MODE.b32 d, a, b, c, membermask (PTX ISA "Data Movement and
  // Conversion Instructions: shfl.sync"; 9.7.8.6 in the 7.x manuals).
  void shfl(Shfl m, Reg d, Reg a, Operand b, Operand c, uint32_t membermask);
  // vote.sync.any.pred d, a, membermask (all = false) or vote.sync.all.pred
  // (PTX ISA "Parallel Synchronization and Communication Instructions:
  // vote.sync"): d = a in any (all) lane of membermask.
  void vote(bool all, Reg d, Reg a, uint32_t membermask);

  // ---- tensor-core path (sm_80+) ----
  // mma.sync.aligned.m16n8k16.row.col.f32.AB.AB.f32 {d}, {a}, {b}, {c} with
  // AB = F16 or BF16: d, c four f32 registers, a four b32, b two b32 (PTX ISA
  // "Warp Level Matrix Multiply-Accumulate Instructions: mma", fragments in
  // "Matrix Fragments for mma.m16n8k16 with floating point type").
  void mma_m16n8k16(Type ab, const Reg *d, const Reg *a, const Reg *b, const Reg *c);
  // mma.sync.aligned.m16n8k32.row.col.f32.A.B.f32 {d}, {a}, {b}, {c} with A,
  // B each .e4m3 or .e5m2 (fp8): d, c four f32 registers, a four b32 (four
  // fp8 each, lowest byte first), b two b32 (PTX ISA "Warp-level matrix
  // multiply-accumulate instructions: mma", "Matrix Fragments for
  // mma.m16n8k32"). Needs .target sm_89 or higher and PTX ISA 8.4: emit()
  // aborts on an older target or version instead of printing PTX that ptxas
  // rejects.
  void mma_m16n8k32_f8(Fp8 a_type, Fp8 b_type, const Reg *d, const Reg *a, const Reg *b,
                       const Reg *c);
  // ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 {d}, [a]: N = d's
  // count (1, 2 or 4) b32 registers (PTX ISA "Warp-level matrix load
  // instruction: ldmatrix").
  void ldmatrix(bool trans, const Reg *d, int count, Addr a);
  // cp.async.cg.shared.global [dst], [src], 16, src_size: src_size a b32
  // register or an immediate in 0..16; bytes past it are zero-filled (PTX ISA
  // "Data Movement and Conversion Instructions: cp.async").
  void cp_async_cg16(Addr dst, Addr src, Operand src_size);
  // cp.async.cg.shared.global [dst], [src], 16: all 16 bytes copied.
  void cp_async_cg16(Addr dst, Addr src);
  // cp.async.ca.shared.global [dst], [src], cp_size, src_size: cp_size 4, 8
  // or 16 (.ca is the form for 4 and 8 bytes), src_size a b32 register or an
  // immediate in 0..cp_size; bytes past it are zero-filled.
  void cp_async_ca(Addr dst, Addr src, int cp_size, Operand src_size);
  void cp_async_commit();     // cp.async.commit_group
  void cp_async_wait(int n);  // cp.async.wait_group n (n >= 0)
  // cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 d, hi, lo: hi lands in the upper
  // 16 bits (PTX ISA cvt); half is F16 or BF16, d b32, hi and lo f32.
  void cvt_pack(Type half, Reg d, Reg hi, Reg lo);
  // cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, hi, lo: two f32 to fp8 (round
  // to nearest even; NaN -> NaN, beyond the largest finite -> it), hi in the
  // upper byte of the b16 d. cvt.rn.f16x2.{e4m3x2,e5m2x2} d, a: the b16 a's
  // two fp8 to f16 (exact), its upper byte to d's upper half. sm_89 with
  // PTX ISA 8.1, sm_90 with 7.8 (PTX ISA "cvt", "Alternate Floating-Point
  // Data Formats").
  void cvt_f8x2_f32(bool e5m2, Reg d, Reg hi, Reg lo);
  void cvt_f16x2_f8x2(bool e5m2, Reg d, Reg a);
  // mov.b32 {lo, hi}, a: the b32 a's low and high halves to two b16
  // registers (PTX ISA "mov", vector unpack).
  void unpack_b32(Reg lo, Reg hi, Reg a);
  // mov.b32 d, {lo, hi}: two b16 registers into the b32 d, lo in the low
  // half (PTX ISA "mov", vector pack).
  void pack_b32(Reg d, Reg lo, Reg hi);

  // ---- Hopper: sm_90a (PTX ISA 8.0) ----
  // `.target sm_90a` instead of `sm_<sm>` (wgmma and setmaxnreg need the
  // architecture-specific target; PTX ISA "Target ISA notes").
  void set_arch_specific(bool on) { arch_specific_ = on; }
  // Alignment of the parameter block (default 8); 64 when it embeds tensor
  // maps (CUtensorMap is 64-byte aligned).
  void set_param_align(uint32_t a) { param_align_ = a; }
  // d (b64) = the generic address of the parameter block (mov + cvta.param;
  // PTX ISA "cvta"): tensor maps inside it are read by cp.async.bulk.tensor.
  void param_address(Reg d);
  // mbarrier.init.shared::cta.b64 [a], count (PTX ISA "mbarrier.init").
  void mbarrier_init(Addr a, Operand count);
  // mbarrier.arrive.shared::cta.b64 _, [a] (state discarded).
  void mbarrier_arrive(Addr a);
  // mbarrier.arrive.expect_tx.shared::cta.b64 _, [a], tx: one arrival that
  // also expects tx more bytes of asynchronous transactions.
  void mbarrier_arrive_expect_tx(Addr a, Operand tx);
  // mbarrier.try_wait.parity.shared::cta.b64 p, [a], parity: p = the phase
  // with that parity has completed (PTX ISA "mbarrier.test_wait/try_wait").
  void mbarrier_try_wait_parity(Reg p, Addr a, Operand parity);
  // fence.proxy.async.shared::cta: orders this thread's generic-proxy shared
  // accesses with the async proxy (TMA, wgmma operands).
  void fence_proxy_async();
  // griddepcontrol.wait / .launch_dependents (PTX ISA "griddepcontrol",
  // 7.8, sm_90): wait until the grids this one depends on (a programmatic
  // dependent launch's predecessor) have completed and their memory is
  // visible; let this grid's dependents be scheduled.
  void griddepcontrol_wait();
  void griddepcontrol_launch_dependents();
  // cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes
  // [dst], [tmap, {coords}], [mbar]: N = count(coords) in 1..5; tmap the
  // generic address of a tensor map; completes tx bytes on mbar.
  void cp_async_bulk_tensor(Addr dst, Reg tmap, const Reg *coords, int n, Addr mbar);
  // cp.reduce.async.bulk.global.shared::cta.bulk_group.add.T [dst], [src],
  // size (PTX ISA "cp.reduce.async.bulk"): adds size bytes (a multiple of
  // 16; a b32 register or an immediate) of T elements (F32, U32 or S32) of
  // shared memory at src into global memory at dst (a b64 address), both
  // 16-byte aligned; each element's add is atomic on its own (.relaxed.gpu);
  // f32 subnormals flush to zero. Asynchronous: tracked by bulk
  // async-groups (cp_async_bulk_commit, cp_async_bulk_wait). sm_90, PTX ISA
  // 8.0.
  void cp_reduce_async_bulk_add(Type t, Addr dst, Addr src, Operand size);
  // cp.reduce.async.bulk.tensor.Nd.global.shared::cta.add.tile.bulk_group
  // [tmap, {coords}], [src] (PTX ISA "cp.reduce.async.bulk.tensor"): adds
  // the box at src (laid out as cp_async_bulk_tensor lays it out; the
  // element type is the tensor map's) into the tensor at coords (n = 1..5
  // b32 registers); box elements outside the tensor are not written. src
  // 128-byte aligned. sm_90, PTX ISA 8.0.
  void cp_reduce_async_bulk_tensor_add(Reg tmap, const Reg *coords, int n, Addr src);
  // cp.async.bulk.commit_group: this thread's uncommitted bulk operations
  // become a bulk async-group. cp.async.bulk.wait_group{.read} n: waits
  // until at most the newest n groups are pending (read: until their
  // operations have read their sources, which may then be overwritten).
  // PTX ISA "cp.async.bulk.commit_group", "cp.async.bulk.wait_group"; sm_90,
  // PTX ISA 8.0.
  void cp_async_bulk_commit();
  void cp_async_bulk_wait(int n, bool read);
  // wgmma.fence / commit_group / wait_group n (PTX ISA "Asynchronous
  // Warpgroup Level Matrix Multiply-Accumulate Instructions").
  void wgmma_fence();
  void wgmma_commit();
  void wgmma_wait(int n);
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.AB.AB: D (N/2 f32) += A B
  // with A and B from shared-memory descriptors (b64); scale_d 0 (D = A B)
  // or 1, an immediate or a predicate; trans_b: B is N-major.
  void wgmma_ss(Type ab, int n, const Reg *d, Reg desc_a, Reg desc_b, Operand scale_d,
                bool trans_b);
  // The same with A in registers (four b32, the m64nNk16 A fragment).
  void wgmma_rs(Type ab, int n, const Reg *d, const Reg *a, Reg desc_b, Operand scale_d,
                bool trans_b);
  // wgmma.mma_async.sync.aligned.m64nNk32.f32.A.B with A, B each .e4m3 or
  // .e5m2: both operands K-major (fp8 has no transposed forms); A from a
  // descriptor, or (wgmma_rs_fp8) four b32 of four fp8 each, lowest byte
  // first: thread (warp w, lane) holds row 16 w + lane / 4 + 8 (i / 4 % 2),
  // column 4 (lane % 4) + i % 4 + 16 (i / 8) in byte i (PTX ISA "Register
  // Fragments", m64nNk32).
  void wgmma_ss_fp8(Fp8 a_type, Fp8 b_type, int n, const Reg *d, Reg desc_a, Reg desc_b,
                    Operand scale_d);
  void wgmma_rs_fp8(Fp8 a_type, Fp8 b_type, int n, const Reg *d, const Reg *a, Reg desc_b,
                    Operand scale_d);
  // stmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 [a], {r}: N = r's
  // count (1, 2 or 4) b32 registers, the inverse of ldmatrix (PTX ISA
  // "Warp-level matrix store instruction: stmatrix"; PTX ISA 7.8, sm_90).
  void stmatrix(bool trans, const Reg *r, int count, Addr a);
  // elect.sync _|p, membermask: p (a predicate) is true in the one elected
  // lane of membermask (PTX ISA "elect.sync"; PTX ISA 8.0, sm_90). The
  // overload also writes the elected lane's id into d (b32): d|p.
  void elect_sync(Reg pred, uint32_t membermask);
  void elect_sync(Reg d, Reg pred, uint32_t membermask);
  // setmaxnreg.{inc,dec}.sync.aligned.u32 n (n in 24..256, a multiple of 8).
  void setmaxnreg(bool inc, int n);
  // bar.sync id, count / bar.arrive id, count (named barriers; count a
  // multiple of 32).
  void bar_sync(int id, int count);
  void bar_arrive(int id, int count);

  // ---- Clusters (sm_90+) ----
  // Thread-block clusters (PTX ISA "Cluster of Cooperative Thread Arrays";
  // sm_90, PTX ISA 7.8; docs/emulator.md, "Clusters"): the CTAs of a
  // cluster run together, read and write each other's shared memory
  // (distributed shared memory: ld / st with Space::Cluster at addresses
  // from mapa) and synchronise with the cluster barrier. Each of these
  // records sm_90 and its PTX ISA version (emit() checks them).
  //
  // Prints `.reqnctapercluster x, y, z` (PTX ISA "Performance-Tuning
  // Directives"): the kernel runs as clusters of that shape, x * y * z CTAs
  // (1..16; more than 8 needs the non-portable cluster size attribute on a
  // GPU); every grid dimension must be a multiple (cuLaunchKernel launches
  // it as is). (0, 0, 0), the default: no cluster.
  void set_cluster_dims(uint32_t x, uint32_t y, uint32_t z);
  // mov.pred p, %is_explicit_cluster: whether the launch has clusters.
  void is_explicit_cluster(Reg p);
  // mapa.shared::cluster.u32 d, a, rank: d (b32) = the shared::cluster
  // address of the byte at shared address a (a b32 register or a symbol)
  // in the cluster's CTA `rank` (a b32 register or an immediate,
  // %cluster_ctarank's numbering) (PTX ISA "mapa").
  void mapa(Reg d, Operand a, Operand rank);
  // barrier.cluster.arrive{.relaxed}.aligned: the thread arrives at the
  // cluster barrier (without .relaxed, with release semantics: its earlier
  // writes, mbarrier.init included, are visible to the cluster's threads
  // after their wait). Each arrive must be followed by the thread's
  // barrier_cluster_wait before its next arrive (PTX ISA "barrier.cluster").
  void barrier_cluster_arrive(bool relaxed = false);
  // barrier.cluster.wait.aligned: waits until every non-exited thread of the
  // cluster arrived (acquire semantics).
  void barrier_cluster_wait();
  // mbarrier.arrive.release.cluster.shared::cluster.b64 _, [a]: one
  // arrival on the mbarrier at shared::cluster address a (from mapa: maybe
  // another CTA's), ordering this thread's earlier writes before the phase
  // completes (PTX ISA "mbarrier.arrive"). The mbarrier's CTA must have
  // made its init visible first: fence_mbarrier_init (or a release
  // barrier_cluster_arrive), then a cluster barrier phase.
  void mbarrier_arrive_cluster(Addr a);
  // fence.mbarrier_init.release.cluster: this thread's earlier
  // mbarrier.inits are visible to the cluster after a following cluster
  // barrier (PTX ISA "membar/fence").
  void fence_mbarrier_init();
  // cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes
  // .multicast::cluster [dst], [tmap, {coords}], [mbar], ctaMask: as
  // cp_async_bulk_tensor, the box landing at dst's CTA-relative offset in
  // every CTA whose rank bit is set in cta_mask (a b16 register) and
  // completing its bytes on the mbarrier at mbar's offset in each of them
  // (PTX ISA "cp.async.bulk.tensor").
  void cp_async_bulk_tensor_multicast(Addr dst, Reg tmap, const Reg *coords, int n, Addr mbar,
                                      Reg cta_mask);

  // ---- Blackwell: sm_100a / sm_103a (PTX ISA 8.6) ----
  // Tensor memory (PTX ISA "tcgen05": "Tensor Memory"): per CTA 128 lanes
  // of 512 columns of 32-bit cells, addressed lane << 16 | column (a b32
  // taddr). Each of these needs set_arch_specific(true) and emit() with sm
  // 100 (PTX ISA 8.6 or later) or 103 (8.8 or later: ptxas refuses an
  // older .version for sm_103a); emit() aborts otherwise. All but
  // the fences are warp-wide (.sync.aligned): every thread of the warp
  // executes them, with the same operands.
  //
  // cta_group (1 or 2; else emit-time misuse) is the .cta_group::N of
  // alloc, dealloc, relinquish_alloc_permit, mma and commit: 2 is the CTA
  // pair (PTX ISA "tcgen05": "CTA Pair": cluster ranks 2k and 2k + 1; the
  // kernel needs a cluster of even size), and one kernel uses one value
  // (ptxas refuses a function that mixes them).
  //
  // tcgen05.alloc.cta_group::N.sync.aligned.shared::cta.b32 [dst], nCols:
  // allocates nCols columns (a b32 register or an immediate power of 2 in
  // 32..512) of all 128 lanes and writes their address (lane 0, first
  // column) to the shared b32 at dst; waits while the columns are not free.
  // cta_group 2: one warp of each CTA of the pair executes it (the first
  // waits for the other); both get the same columns.
  void tcgen05_alloc(Addr dst, Operand ncols, int cta_group = 1);
  // tcgen05.dealloc.cta_group::N.sync.aligned.b32 taddr, nCols: frees the
  // allocation at taddr (b32), nCols its size. Every allocation must be
  // freed before the CTA exits. cta_group 2: one warp of each CTA of the
  // pair, as for alloc.
  void tcgen05_dealloc(Reg taddr, Operand ncols, int cta_group = 1);
  // tcgen05.relinquish_alloc_permit.cta_group::N.sync.aligned: the CTA
  // allocates no more.
  void tcgen05_relinquish_alloc_permit(int cta_group = 1);
  // tcgen05.ld.sync.aligned.32x32b.xN.b32 {d}, [taddr] (N = n in 1, 2, 4,
  // .., 128; d n 32-bit registers, b32 or f32): thread i of the warp gets lane
  // taddr.lane + i, d[j] column taddr.column + j. Warp w (%warpid % 4 = q)
  // may only access lanes 32q..32q+31. Asynchronous: use d only after
  // tcgen05_wait_ld().
  void tcgen05_ld_32x32b(const Reg *d, int n, Reg taddr);
  // tcgen05.st.sync.aligned.32x32b.xN.b32 [taddr], {v}: the inverse.
  // Asynchronous: overwrite v, or tcgen05.ld the cells, only after
  // tcgen05_wait_st().
  void tcgen05_st_32x32b(Reg taddr, const Reg *v, int n);
  // tcgen05.wait::ld.sync.aligned / tcgen05.wait::st.sync.aligned: the
  // warp's earlier tcgen05.ld (st) have completed.
  void tcgen05_wait_ld();
  void tcgen05_wait_st();
  // tcgen05.fence::before_thread_sync / ::after_thread_sync: order the
  // thread's tcgen05 operations before (after) a following (preceding)
  // thread synchronisation (bar.sync, mbarrier).
  void tcgen05_fence_before_thread_sync();
  void tcgen05_fence_after_thread_sync();
  // tcgen05.mma.cta_group::N.kind::K [d_taddr], a, b_desc, idesc,
  // enable_input_d (PTX ISA "tcgen05.mma"): D (M x N f32 in tensor memory
  // at d_taddr, M lanes from lane 0, N columns) = A B (+ D when
  // enable_input_d, an immediate 0 / 1 or a predicate). A is M x K: a
  // shared-memory descriptor (b64, tcgen05_mma_ss) or tensor memory (a b32
  // taddr, tcgen05_mma_ts: M lanes, K / 2 columns of packed 16-bit pairs for
  // kind::f16); B is K x N from a shared-memory descriptor (b64). idesc
  // (b32 register or immediate) is the instruction descriptor ("Instruction
  // Descriptor": types, transposes, N >> 3 at bits 17-22, M >> 4 at
  // 24-28). K = 16 for kind::f16 (f16 / bf16), 32 for kind::f8f6f4 (e4m3 /
  // e5m2). Issued by one thread; asynchronous: its completion is tracked by
  // tcgen05_commit. cta_group 2 (M 128 or 256, N 16..256 step 16, with A
  // in tensor memory step 32): one thread of the pair issues it; each CTA
  // holds M / 2 rows of A and of D and N / 2 columns of B at the same
  // addresses (docs/emulator.md, "Blackwell": the pair's layouts).
  enum class MmaKind : uint8_t { F16, F8F6F4 };
  void tcgen05_mma_ss(MmaKind kind, Reg d_taddr, Reg desc_a, Reg desc_b, Operand idesc,
                      Operand enable_input_d, int cta_group = 1);
  void tcgen05_mma_ts(MmaKind kind, Reg d_taddr, Reg a_taddr, Reg desc_b, Operand idesc,
                      Operand enable_input_d, int cta_group = 1);
  // tcgen05.commit.cta_group::N.mbarrier::arrive::one.shared::cluster.b64
  // [mbar] (PTX ISA "tcgen05.commit"): one arrive on the mbarrier at mbar (a
  // shared::cta address: the executing CTA's, or a shared::cluster one from
  // mapa) once every tcgen05.mma (and cp) this thread issued before it has
  // completed. Issued by the thread that issued them.
  void tcgen05_commit(Addr mbar, int cta_group = 1);
  // The same with .multicast::cluster: the arrive goes to the mbarrier at
  // mbar's offset in every CTA of the cluster whose %cluster_ctarank bit is
  // set in cta_mask (a b16 register: ptxas refuses an immediate), e.g. 3 <<
  // (rank & ~1) for both CTAs of a pair.
  void tcgen05_commit_multicast(Addr mbar, Reg cta_mask, int cta_group = 1);
  // Packed f32 pairs (PTX ISA "add", "mul", "fma" with .f32x2; sm_100, PTX
  // ISA 8.6): add.f32x2 / sub.f32x2 / mul.f32x2 d, a, b and fma.rn.f32x2
  // d, a, b, c on b64 registers, each half (low: the first element) an
  // f32 computed as the scalar instruction would (round to nearest).
  // o: Op::Add, Sub, Mul (c unset) or Fma.
  void f32x2(Op o, Reg d, Reg a, Reg b, Reg c = Reg());
  // mov.b64 d, {lo, hi} / mov.b64 {lo, hi}, a: two f32 registers to and
  // from a b64 pair (lo the low half; PTX ISA "mov", vector pack).
  void pack_f32x2(Reg d, Reg lo, Reg hi);
  void unpack_f32x2(Reg lo, Reg hi, Reg a);
  // tcgen05.cp.cta_group::1.{128x256b,128x128b} [taddr], s_desc (PTX ISA
  // "tcgen05.cp"): copies a 128-row matrix from shared memory (s_desc, a b64
  // shared memory descriptor as for tcgen05_mma_ss, its rows K-major) into
  // tensor memory lanes 0..127 at taddr (a b32 register; lane field 0): 256
  // bits (8 columns) or 128 bits (4 columns) of each row. Asynchronous like
  // the mma: ordered before a later tcgen05_mma_* of the same thread,
  // complete for others once a later tcgen05_commit's phase is observed.
  enum class TmemCpShape : uint8_t { k128x256b, k128x128b };
  void tcgen05_cp(TmemCpShape shape, Reg taddr, Reg s_desc);

  // Prints `.minnctapersm n` after `.maxntid` (PTX ISA "Performance-Tuning
  // Directives"); 0 (the default) prints nothing. Without it ptxas may cap
  // registers low enough to spill.
  void set_min_ctas_per_sm(uint32_t n) { min_ctas_ = n; }

  // Room for `bytes` of body text up front (a generator's estimate): one
  // allocation instead of a doubling series.
  void reserve(size_t bytes) {
    if (bytes > text_.capacity()) text_.reserve(bytes);
  }

  // The oldest .target and PTX ISA version (times 10) the instructions
  // built so far accept; 0 when no instruction built records one (only the
  // fp8 mma does for now: sm_89, 8.4).
  int min_sm() const { return need_sm_; }
  int min_isa_version() const { return need_isa_; }

  // Instructions (labels and comments excluded) built so far.
  uint32_t num_instrs() const { return num_instrs_; }

  // The module text: `.version`, `.target sm_<sm>`, `.address_size 64`, the
  // entry with `.maxntid maxntid, 1, 1` (0: none), declarations and body.
  // Aborts (a generator bug, as every misuse) when an instruction built
  // needs a newer target or PTX ISA version than the ones given (see
  // min_sm() / min_isa_version()).
  std::string emit(int isa_version_x10, int sm, uint32_t maxntid) const &;
  // The same text, built in place in the body's buffer (no copy of the
  // body); the builder is left empty. Use as std::move(b).emit(...).
  std::string emit(int isa_version_x10, int sm, uint32_t maxntid) &&;

 private:
  struct Opcode;  // the opcode being built ("ld.global.nc.v4.u32"), defined in ptx.cc
  class Line;     // writer of one body line, defined in ptx.cc

  [[noreturn]] void misuse(const Opcode &in, const char *what) const;
  // Records that an instruction (what) needs .target sm_<sm> and PTX ISA
  // isa (times 10); arch: an sm_100a / sm_103a one (tcgen05).
  void require(int sm, int isa, const char *what, bool arch = false);
  void bulk_tensor_opcode(Opcode &in, Addr dst, Reg tmap, const Reg *coords, int n, Addr mbar,
                          bool multicast) const;
  void atomic_add_opcode(Opcode &in, Space s, const char *sem, Type t) const;
  void check_word(const Opcode &in, const Operand &o, Type t, const char *what) const;
  void tcgen05_ncols(const Opcode &in, const Operand &ncols) const;
  static std::string cta_group_text(int cta_group);
  void check_cta_group(const Opcode &in, int cta_group) const;
  void tcgen05_32x32b(const char *op, const Reg *r, int n, Reg taddr, bool ld);
  void tcgen05_mma_line(MmaKind kind, Reg d_taddr, Reg a, bool a_tmem, Reg desc_b,
                        const Operand &idesc, const Operand &enable_input_d, int cta_group);
  void check(const Opcode &in, const Operand &o, Type t, const char *what) const;
  void check_reg(const Opcode &in, Reg r, Type t, const char *what) const;
  void check_addr(const Opcode &in, const Addr &a, Space s) const;
  // Records sm_90 / PTX ISA 7.8 for an access through Space::Cluster.
  void space_needs(Space s) {
    if (s == Space::Cluster) require(90, 78, "ld / st .shared::cluster");
  }
  void matrix_m8n8(Opcode &in, bool trans, const Reg *r, int count, Addr a, const char *bad_count,
                   const char *bad_reg) const;
  void wgmma_line(const Opcode &in, int n, const Reg *d, const Reg *a, Reg desc_a, Reg desc_b,
                  const Operand &scale_d, const int *trans, int ntrans);
  // At least n writable bytes at the end of the body text.
  char *room(size_t n);
  // Everything emit() prints before the body.
  std::string header(int isa_version_x10, int sm, uint32_t maxntid) const;

  std::string entry_;
  std::string param_name_;  // entry_ + "_param"
  uint32_t param_bytes_;
  uint32_t counts_[kNumRegClasses] = {0, 0, 0, 0, 0};
  uint32_t labels_ = 0;
  struct SharedDecl {
    std::string name;
    uint32_t align, bytes;
    bool is_extern;
  };
  std::vector<SharedDecl> shared_;
  size_t max_name_ = 0;  // longest symbol name printed in an operand
  // Body text: the first text_len_ bytes of text_ (the rest is room that
  // Line writes into before it counts).
  std::string text_;
  size_t text_len_ = 0;
  uint32_t num_instrs_ = 0;
  uint32_t min_ctas_ = 0;
  uint32_t cluster_[3] = {0, 0, 0};  // set_cluster_dims (0: none)
  // The newest target and PTX ISA version an instruction built so far needs
  // (0: none beyond what every target has); checked by emit().
  int need_sm_ = 0, need_isa_ = 0;
  const char *need_what_ = nullptr;  // the instruction that set them
  bool need_tcgen05_ = false;        // a tcgen05 instruction: sm_100a / sm_103a only
  bool arch_specific_ = false;
  uint32_t param_align_ = 8;
  Reg guard_;
  bool guard_neg_ = false;
};

}  // namespace ptx
}  // namespace fa
