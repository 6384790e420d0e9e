// Decoded form of a PTX module for the emulator: every instruction is an
// opcode enum plus register-file slot indices, so execution does no string
// work. Registers, special registers and immediates all live in one flat
// array of 64-bit slots per thread (immediates are constant slots filled from
// Entry::slot_init), so every operand read is `regs[slot]`.
//
// Slot value convention: a slot holds the register's bits in its low part;
// readers truncate to the instruction's width (a 32-bit read of a slot is
// its low 32 bits), writers of narrow values may leave the high bits zero.
// Predicates are 0 or 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fa {
namespace emu {

// Special register slots, identical in every entry (filled per thread).
enum SpecialSlot : uint32_t {
  kTidX = 0,
  kTidY,
  kTidZ,
  kNtidX,
  kNtidY,
  kNtidZ,
  kCtaidX,
  kCtaidY,
  kCtaidZ,
  kNctaidX,
  kNctaidY,
  kNctaidZ,
  kLaneid,
  kWarpid,
  kNwarpid,
  kNumSpecialSlots
};

enum class Op : uint16_t {
  // Data movement.
  kMov,     // d = a (whole slot)
  kPack32,  // d.b32 = {v0.b16 (low), v1.b16}
  kPack64,  // d.b64 = {v0.b32 (low), v1.b32}
  kUnpack32,
  kUnpack64,
  kLdParam,  // d = param[imm], sub = bytes, flags kSigned
  kLdGlobal,
  kStGlobal,
  kLdShared,
  kStShared,
  // Integer (32/64 suffix = operand width).
  kAdd32,
  kAdd64,
  kSub32,
  kSub64,
  kMulLo32,
  kMulLo64,
  kMulHiS32,
  kMulHiU32,
  kMadLo32,
  kMadLo64,
  kMulWideS32,
  kMulWideU32,
  kMadWideS32,
  kMadWideU32,
  kDivS32,
  kDivU32,
  kDivS64,
  kDivU64,
  kRemS32,
  kRemU32,
  kRemS64,
  kRemU64,
  kMinS32,
  kMinU32,
  kMinS64,
  kMinU64,
  kMaxS32,
  kMaxU32,
  kMaxS64,
  kMaxU64,
  kNeg32,
  kNeg64,
  kAbs32,
  kAbs64,
  kAnd,  // whole-slot bitwise ops (valid for b32, b64 and pred)
  kOr,
  kXor,
  kNot,
  kNotPred,
  kShl32,
  kShl64,
  kShrU32,
  kShrS32,
  kShrU64,
  kShrS64,
  // f32 (flags kFtz).
  kAddF,
  kSubF,
  kMulF,
  kFmaF,
  kDivF,
  kRcpF,
  kSqrtF,
  kRsqrtF,
  kNegF,
  kAbsF,
  kMinF,
  kMaxF,
  kEx2F,
  kLg2F,
  kTanhF,
  // Comparison and selection (sub = Cmp).
  kSetpS32,
  kSetpU32,
  kSetpS64,
  kSetpU64,
  kSetpF32,
  kSelp,
  // Conversions.
  kCvtF32F16,
  kCvtF32BF16,
  kCvtF16F32,     // .rn
  kCvtBF16F32,    // .rn
  kCvtF16x2F32,   // .rn, d = {a -> high half, b -> low half}
  kCvtBF16x2F32,  // .rn
  kCvtF8x2F32,    // .rn.satfinite, d (16 bits) = {a -> high byte, b -> low byte}; sub 1 = e5m2
  kCvtF16x2F8x2,  // .rn, d = {a's high byte -> high half, low byte -> low half}; sub 1 = e5m2
  kCvtF32S32,     // .rn
  kCvtF32U32,     // .rn
  kCvtS32F32,     // sub = Round (rzi/rni/rmi/rpi), saturating
  kCvtU32F32,
  kCvtInt,  // integer width change: sub = source bits, flags kSigned extends
  // Asynchronous copies (PTX ISA "Data Movement: cp.async"), per thread.
  kCpAsync,        // [a + imm] (shared) <- [b + c] (global); sub = cp-size, e = src-size
                   // slot or kNoSlot, v[0] = ignore-src predicate or kNoSlot
  kCpAsyncCommit,  // cp.async.commit_group
  kCpAsyncWait,    // cp.async.wait_group imm; imm = -1: cp.async.wait_all
  // Control.
  kBra,  // imm = target pc
  kExit,
  // Collectives (the thread stops and the CTA scheduler runs them).
  kBarSync,      // imm = barrier id, b = thread count slot or kNoSlot (all threads)
  kBarWarpSync,  // a = membermask
  kShfl,         // d[, v0 = pred or kNoSlot] = a, b, c, e = membermask; sub = ShflMode
  // Warp-wide (.aligned) collectives: e = a constant slot holding 0xffffffff,
  // so the scheduler treats them like a full-membermask shfl.sync.
  kMma,       // Entry::operand_slots[imm..]: d[4], a[4], b[2], c[4]; sub = MmaKind
  kLdmatrix,  // v[0..sub) = m8n8 .b16 fragments from rows at [a + imm]; flags kTrans
  // add/sub/mul.lo/mad.lo .s32: as the 32-bit ops, but a result outside
  // int32 is a fault. No flashattn kernel relies on signed wrap-around, so
  // one is an index overflow (docs/kernels.md, "Index arithmetic").
  kAddS32,
  kSubS32,
  kMulLoS32,
  kMadLoS32,
  kVote,  // d = any (sub 0) / all (sub 1) of pred a over membermask e (collective)
  // --- sm_90 (docs/emulator.md, "Hopper"). Per-thread, run inline:
  kLdGeneric,     // as kLdGlobal, address generic (param block, shared window or global)
  kStGeneric,     // as kStGlobal, address generic (shared window or global)
  kCvtaParam,     // d = generic address of kernel-parameter address a (cvta.param)
  kCvtaShared,    // d = generic address of shared address a (cvta.shared)
  kCvtaToShared,  // d = shared address of generic address a (cvta.to.shared)
  kBarArrive,     // bar.arrive imm, count b: arrives on named barrier imm, does not wait
  kMbarInit,      // mbarrier.init [a + imm], count b
  kMbarInval,     // mbarrier.inval [a + imm]
  kMbarArrive,    // d (state or kNoSlot) = mbarrier.arrive [a + imm]{, count b};
                  // c = expect_tx bytes or kNoSlot; sub 1: expect_tx only (no arrive)
  kMbarTryWait,   // d = mbarrier.try_wait.parity [a + imm], parity b (blocks while incomplete)
  kBulkTensor,    // cp.async.bulk.tensor: dst [a + imm], tensor map generic address b,
                  // operand_slots[c..]: sub coords, mbarrier base slot, mbarrier offset slot
  // fence.proxy.async: this thread's generic shared writes reach the async proxy.
  kFenceProxyAsync,
  // Warp-wide collectives of sm_90 (e = membermask slot, as kShfl):
  kStmatrix,  // stmatrix: m8n8 .b16 fragments v[0..sub) to rows at [a + imm]; flags kTrans
  kElect,     // elect.sync d|v[0] (either kNoSlot for '_'), membermask e
  // Warpgroup-wide (.sync.aligned) collectives: the 128 threads of warps
  // 4k..4k+3 stop at the same pc and the scheduler runs them once.
  kWgmmaFence,   // wgmma.fence
  kWgmmaCommit,  // wgmma.commit_group
  kWgmmaWait,    // wgmma.wait_group imm
  kWgmma,        // wgmma.mma_async.m64nNk16 (16-bit inputs) or .m64nNk32 (fp8 inputs,
                 // flags = WgmmaFp8): N = 8 * vec, sub = WgmmaFlags, a = A descriptor
                 // (ss), b = B descriptor, c = scale-d (slot, nonzero = accumulate);
                 // operand_slots[imm..]: N/2 D slots, then 4 A slots (rs)
  kSetmaxnreg,   // setmaxnreg.{inc (sub 1), dec (sub 0)} imm
  kPrmt,         // prmt.b32 d, a, b, c (default mode: byte selectors in c's nibbles)
  kNumOps
};

// Op is a collective (the thread stops at it and the scheduler runs it).
inline bool is_collective(Op op) {
  return (op >= Op::kBarSync && op <= Op::kLdmatrix) || op == Op::kVote || op >= Op::kStmatrix ||
         op == Op::kMbarTryWait;
}
// Warp-wide collectives: resolved per warp over a membermask.
inline bool is_warp_collective(Op op) {
  return op == Op::kBarWarpSync || op == Op::kShfl || op == Op::kMma || op == Op::kLdmatrix ||
         op == Op::kVote || op == Op::kStmatrix || op == Op::kElect;
}
// Warpgroup-wide collectives (PTX ISA "Warpgroup": four contiguous warps,
// the first one's rank a multiple of 4).
inline bool is_warpgroup_collective(Op op) { return op >= Op::kWgmmaFence; }

enum Cmp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kEqu, kNeu, kLtu, kLeu, kGtu, kGeu, kNum, kNan };
enum ShflMode : uint8_t { kShflUp, kShflDown, kShflBfly, kShflIdx };
enum Round : uint8_t { kRzi, kRni, kRmi, kRpi };
// mma.sync.aligned shapes and input types (all .row.col, f32 accumulators):
// m16n8k16 and m16n8k8 with f16 or bf16, m16n8k32 with fp8 A and B
// (kMmaF8K32 + 2 * (A is e5m2) + (B is e5m2)).
enum MmaKind : uint8_t { kMmaF16K16, kMmaBF16K16, kMmaF16K8, kMmaBF16K8, kMmaF8K32 };

// (4 is taken: cvt's signed destination.)
enum InstFlags : uint8_t { kFtz = 1, kSigned = 2, kTrans = 8 };
// wgmma.mma_async variant bits (Inst::sub of kWgmma).
enum WgmmaFlags : uint8_t {
  kWgBF16 = 1,    // .bf16 inputs (else .f16)
  kWgRegA = 2,    // A from registers (else from a descriptor)
  kWgTransA = 4,  // imm-trans-a = 1: A is M-major
  kWgTransB = 8,  // imm-trans-b = 1: B is N-major
  kWgNegA = 16,   // imm-scale-a = -1
  kWgNegB = 32    // imm-scale-b = -1
};
// wgmma.mma_async input types (Inst::flags of kWgmma): 0 = 16-bit
// (m64nNk16, kWgBF16 picks the type); kWgFp8 = m64nNk32 with .e4m3 / .e5m2
// A and B (K-major only: never kWgTransA / kWgTransB).
enum WgmmaFp8 : uint8_t {
  kWgFp8 = 1,    // fp8 inputs, K = 32, 1 byte per element
  kWgE5M2A = 2,  // A is .e5m2 (else .e4m3)
  kWgE5M2B = 4   // B is .e5m2 (else .e4m3)
};

constexpr uint32_t kNoSlot = 0xffffffffu;
constexpr uint32_t kGuardNeg = 0x80000000u;

struct Inst {
  Op op = Op::kExit;
  uint8_t flags = 0;
  uint8_t sub = 0;  // Cmp / ShflMode / Round / element bytes / source bits
  uint8_t vec = 1;  // ld/st vector count
  uint8_t pad = 0;
  uint16_t pad2 = 0;
  uint32_t guard = kNoSlot;  // predicate slot | kGuardNeg, or kNoSlot
  uint32_t d = kNoSlot, a = kNoSlot, b = kNoSlot, c = kNoSlot, e = kNoSlot;
  uint32_t v[4] = {kNoSlot, kNoSlot, kNoSlot, kNoSlot};
  int64_t imm = 0;  // address offset, branch target, param offset, barrier id
  uint32_t line = 0;
};

struct Entry {
  std::string name;
  std::vector<Inst> code;               // always ends with kExit
  std::vector<std::string> op_text;     // opcode text per pc (error messages)
  std::vector<uint64_t> slot_init;      // initial register file (constants set)
  std::vector<std::string> slot_name;   // for debugging / messages
  std::vector<uint32_t> operand_slots;  // long operand lists (mma.sync), indexed by Inst::imm
  uint32_t num_slots = 0;
  uint32_t param_size = 0;           // bytes of the parameter buffer
  uint32_t static_smem = 0;          // bytes of static .shared
  uint32_t dynamic_smem_offset = 0;  // where .extern .shared starts
  uint32_t maxntid[3] = {0, 0, 0};   // 0 = not given
  uint32_t reqntid[3] = {0, 0, 0};
  uint32_t line = 0;
};

struct Module {
  int version = 0;             // .version times 10
  int target_sm = 0;           // .target sm_NN
  bool arch_specific = false;  // .target sm_NNa: runs only on that SM
  std::vector<Entry> entries;
  const Entry *find(const std::string &name) const {
    for (const Entry &e : entries)
      if (e.name == name) return &e;
    return nullptr;
  }
};

// Parses PTX text. On error returns nullptr and sets *error to "line N: message".
std::shared_ptr<const Module> parse_module(const std::string &text, std::string *error);

}  // namespace emu
}  // namespace fa
