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

#include <cstddef>
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
  // Clusters (PTX ISA "Special Registers"; docs/emulator.md, "Clusters"):
  // the CTA's rank and position in its cluster, the cluster's in the grid.
  kClusterCtarank,
  kClusterNctarank,
  kClusteridX,
  kClusteridY,
  kClusteridZ,
  kNclusteridX,
  kNclusteridY,
  kNclusteridZ,
  kClusterCtaidX,
  kClusterCtaidY,
  kClusterCtaidZ,
  kClusterNctaidX,
  kClusterNctaidY,
  kClusterNctaidZ,
  kIsExplicitCluster,  // .pred
  kNumSpecialSlots
};

// How an op runs (emu/ops.def).
enum class OpScope : uint8_t { kThread, kBlocking, kCta, kWarp, kWarpgroup };
// Who runs an op (emu/ops.def): the interpreter, or an architecture state
// (emu/arch.h).
enum class OpHandler : uint8_t { kInterp, kSm90, kSm100, kCluster };
constexpr size_t kNumOpHandlers = 4;

enum class Op : uint16_t {
#define OP(name, scope, handler) name,
#include "emu/ops.def"
#undef OP
  kNumOps
};

inline constexpr OpScope kOpScope[] = {
#define OP(name, scope, handler) OpScope::scope,
#include "emu/ops.def"
#undef OP
};
static_assert(sizeof(kOpScope) / sizeof(kOpScope[0]) == static_cast<size_t>(Op::kNumOps),
              "ops.def");
inline constexpr OpScope op_scope(Op op) { return kOpScope[static_cast<size_t>(op)]; }

inline constexpr OpHandler kOpHandler[] = {
#define OP(name, scope, handler) OpHandler::handler,
#include "emu/ops.def"
#undef OP
};
inline constexpr OpHandler op_handler(Op op) { return kOpHandler[static_cast<size_t>(op)]; }

// Op is a collective or may block (the thread stops at it and the
// scheduler runs or resumes it).
inline constexpr bool is_collective(Op op) { return op_scope(op) != OpScope::kThread; }
// Warp-wide collectives: resolved per warp over a membermask.
inline constexpr bool is_warp_collective(Op op) { return op_scope(op) == OpScope::kWarp; }
// Warpgroup-wide collectives (PTX ISA "Warpgroup": four contiguous warps,
// the first one's rank a multiple of 4).
inline constexpr bool is_warpgroup_collective(Op op) { return op_scope(op) == OpScope::kWarpgroup; }

enum Cmp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kEqu, kNeu, kLtu, kLeu, kGtu, kGeu, kNum, kNan };
enum ShflMode : uint8_t { kShflUp, kShflDown, kShflBfly, kShflIdx };
// Op::kAtom's / kAtomShared's sub: the operation (kAtomAdd: .u32 / .s32).
enum AtomOp : uint8_t { kAtomAdd, kAtomExch, kAtomCas, kAtomAddF32 };
// Op::kBulkReduce's sub: the element type of .add (.u32 and .s32 add alike).
enum BulkRedType : uint8_t { kBulkRedF32, kBulkRedU32 };
enum Round : uint8_t { kRzi, kRni, kRmi, kRpi };
// mma.sync.aligned shapes and input types (all .row.col, f32 accumulators):
// m16n8k16 and m16n8k8 with f16 or bf16, m16n8k32 with fp8 A and B
// (kMmaF8K32 + 2 * (A is e5m2) + (B is e5m2)).
enum MmaKind : uint8_t { kMmaF16K16, kMmaBF16K16, kMmaF16K8, kMmaBF16K8, kMmaF8K32 };

// (4 is taken: cvt's signed destination.)
enum InstFlags : uint8_t {
  kFtz = 1,
  kSigned = 2,
  kTrans = 8,
  kClusterSpace = 16,  // the address operand is .shared::cluster (mbarrier.arrive, tcgen05.commit)
  kMulticast = 32  // .multicast::cluster (a ctaMask operand): cp.async.bulk.tensor, tcgen05.commit
};
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

// tcgen05.mma variant bits (Inst::sub of kUmma).
enum UmmaFlags : uint8_t {
  kUmmaF8F6F4 = 1,  // .kind::f8f6f4 (else .kind::f16)
  kUmmaATmem = 2,   // A from tensor memory [a_taddr] (else a shared-memory descriptor)
  kUmmaPair = 4     // .cta_group::2: the CTA pair's MMA (else .cta_group::1)
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
  // Cluster directives (PTX ISA "Performance-Tuning Directives"):
  // .reqnctapercluster (0 = not given), .explicitcluster, .maxclusterrank
  // (0 = not given).
  uint32_t reqnctapercluster[3] = {0, 0, 0};
  bool explicitcluster = false;
  uint32_t maxclusterrank = 0;
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
