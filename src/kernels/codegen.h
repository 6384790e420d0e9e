// Internal to src/kernels: value-returning helpers over the PTX builder and
// the shared-memory layout of the attention kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/kernels.h"
#include "ptx/ptx.h"

namespace fa {
namespace kgen {

using ptx::at;
using ptx::Cmp;
using ptx::fimm;
using ptx::imm;
using ptx::Op;
using ptx::Operand;
using ptx::Reg;
using ptx::Space;
using ptx::Type;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

// Shared memory of the forward/decode kernels (all f32, static, <= 48 KB):
//   Q  [block_m][head_dim]            row stride q_stride floats
//   K  [block_n][head_dim + 4]        +4 keeps v4 reads of 8 lanes on distinct banks
//   V  [block_n][head_dim_v]          (shares K's buffer when kv_merged)
//   P  [num_warps][rows_per_warp][32] probabilities of the current tile
struct AttentionLayout {
  int rows_per_warp = 0;
  int q_stride = 0, k_stride = 0, v_stride = 0;
  bool kv_merged = false;
  uint32_t q_bytes = 0, k_bytes = 0, v_bytes = 0, p_bytes = 0;
  uint32_t total() const { return q_bytes + k_bytes + (kv_merged ? 0 : v_bytes) + p_bytes; }
};
AttentionLayout attention_layout(const KernelSpec &spec);
constexpr uint32_t kStaticSmemLimit = 48 * 1024;

// Dynamic shared memory of the tensor-core forward kernel (16-bit values,
// rows padded by 16 bytes: tile::SmemTile): Q [block_m][d], then one K
// [block_n][d] and one V [block_n][dv] buffer. After the K/V loop the O tile
// [block_m][dv] is staged from offset 0 for coalesced stores.
struct TcLayout {
  uint32_t q_off = 0, k_off = 0, v_off = 0;
  uint32_t q_bytes = 0, k_bytes = 0, v_bytes = 0, o_bytes = 0;
  uint32_t total = 0;  // max(Q + K + V, O)
};
TcLayout tc_layout(const KernelSpec &spec);

std::string generate_attention(const KernelSpec &spec);      // Forward (scalar) and Decode
std::string generate_forward_tc(const KernelSpec &spec);     // Forward with spec.mma
std::string generate_decode_tc(const KernelSpec &spec);      // Decode with spec.mma
std::string generate_forward_wgmma(const KernelSpec &spec);  // Forward with spec.wgmma
// Dynamic shared memory of the sm_90a forward kernel (forward_wgmma.cc).
uint32_t wgmma_smem(const KernelSpec &spec);
// The sm_100a forward (spec.tcgen05; forward_sm100.cc) and its dynamic
// shared memory.
std::string generate_forward_sm100(const KernelSpec &spec);
uint32_t sm100_smem(const KernelSpec &spec);
// Whether that forward keeps Q in tensor memory (one 16-bit Q tile whose
// two S buffers, O and Q fit the 512 columns).
bool sm100_q_in_tmem(const KernelSpec &spec);
// Dynamic shared memory of the tensor-core decode kernel (decode_tc.cc).
uint32_t decode_tc_smem(const KernelSpec &spec);
// The sm_90a MLA decode (Decode with spec.wgmma; decode_mla.cc) and its
// dynamic shared memory.
std::string generate_decode_mla(const KernelSpec &spec);
uint32_t decode_mla_smem(const KernelSpec &spec);
std::string generate_reduce(const KernelSpec &spec);
// The backward's main kernel (kind Backward; mma.sync, sm_80+;
// backward_tc.cc) and its dynamic shared memory, and its per-row kernels
// (BackwardPre, BackwardPost; backward_rows.cc; no dynamic shared memory).
std::string generate_backward(const KernelSpec &spec);
uint32_t backward_smem(const KernelSpec &spec);
// The sm_90a backward main kernel (Backward with spec.wgmma;
// backward_wgmma.cc) and its dynamic shared memory.
std::string generate_backward_wgmma(const KernelSpec &spec);
uint32_t backward_wgmma_smem(const KernelSpec &spec);
std::string generate_backward_rows(const KernelSpec &spec);

// Value-returning wrappers: each allocates the destination register.
class Emitter {
 public:
  explicit Emitter(ptx::Builder &b) : b(b) {}
  ptx::Builder &b;

  Reg new_reg(Type t) { return b.reg(ptx::class_of(t)); }
  Reg mov(Type t, Operand a) {
    Reg d = new_reg(t);
    b.mov(t, d, a);
    return d;
  }
  Reg op(Op o, Type t, Operand a) {
    Reg d = new_reg(t);
    b.op(o, t, d, a);
    return d;
  }
  Reg op(Op o, Type t, Operand a, Operand c) {
    Reg d = new_reg(t);
    b.op(o, t, d, a, c);
    return d;
  }
  Reg op(Op o, Type t, Operand a, Operand c, Operand e) {
    Reg d = new_reg(t);
    b.op(o, t, d, a, c, e);
    return d;
  }
  Reg setp(Cmp c, Type t, Operand x, Operand y) {
    Reg p = b.pred();
    b.setp(c, t, p, x, y);
    return p;
  }
  Reg selp(Type t, Operand x, Operand y, Reg p) {
    Reg d = new_reg(t);
    b.selp(t, d, x, y, p);
    return d;
  }
  Reg param(Type t, size_t offset) {
    Reg d = new_reg(t);
    b.ld_param(t, d, static_cast<uint32_t>(offset));
    return d;
  }
  // A pointer parameter converted to a global address.
  Reg global_param(size_t offset) {
    Reg raw = param(Type::U64, offset);
    Reg d = b.b64();
    b.cvta_to_global(d, raw);
    return d;
  }
  // A stride parameter (elements) times elem_bytes.
  Reg stride_bytes(size_t offset, int elem_bytes) {
    Reg s = param(Type::S64, offset);
    return op(Op::MulLo, Type::S64, s, imm(elem_bytes));
  }
  Reg s64(Reg s32) {
    Reg d = b.b64();
    b.cvt(Type::S64, Type::S32, ptx::Round::None, d, s32);
    return d;
  }
  // base + (s64)idx * stride (stride a b64 register, bytes).
  Reg index(Reg base, Reg idx_s32, Reg stride) {
    Reg t = op(Op::MulLo, Type::S64, s64(idx_s32), stride);
    return op(Op::Add, Type::S64, base, t);
  }
  // base + (s64)idx * bytes (bytes a constant).
  Reg index(Reg base, Reg idx_s32, int bytes) {
    Reg t = b.b64();
    b.mul_wide(Type::S32, t, idx_s32, imm(bytes));
    return op(Op::Add, Type::S64, base, t);
  }
  // base + idx * bytes for a 64-bit element index.
  Reg index64(Reg base, Reg idx_s64, int bytes) {
    return op(Op::MadLo, Type::S64, idx_s64, imm(bytes), base);
  }
  // (s64)x * (s64)y of two s32 values (mul.wide.s32). Every product of two
  // run-time values is formed in 64 bits (docs/kernels.md, "Index
  // arithmetic"; tests/test_index_arith.cc checks every kernel for it).
  Reg wide_mul(Reg x_s32, Reg y_s32) {
    Reg d = b.b64();
    b.mul_wide(Type::S32, d, x_s32, y_s32);
    return d;
  }
  // (s64)x * (s64)y + z (z 64-bit).
  Reg wide_mad(Reg x_s32, Reg y_s32, Reg z_s64) {
    Reg d = b.b64();
    b.mad_wide(Type::S32, d, x_s32, y_s32, z_s64);
    return d;
  }
  // The low 32 bits of a 64-bit value known to fit in s32.
  Reg s32(Reg s64) {
    Reg d = b.b32();
    b.cvt(Type::S32, Type::S64, ptx::Round::None, d, s64);
    return d;
  }
  // Warp-wide butterfly reduction (5 shfl.sync.bfly steps, PTX ISA
  // "shfl.sync"),
  // in place on x.
  void warp_reduce(Op o, Reg x) {
    Reg t = b.f32();
    for (int off = 16; off >= 1; off >>= 1) {
      b.shfl(ptx::Shfl::Bfly, t, x, imm(off), imm(31), 0xffffffffu);
      b.op(o, Type::F32, x, x, t);
    }
  }
};

// The per-CTA view of a forward problem shared by both forward generators:
// sequence lengths, byte strides along the sequence, and the base addresses
// of this CTA's (batch, head) in Q/K/V. With spec.varlen the lengths and
// offsets come from cu_seqlens, and a CTA whose m-block (starting at row m0)
// lies past its sequence exits here, before any barrier. q/k/v are global
// addresses; bz = batch, h = query head, kvh = KV head.
// Where key j's K (or V) row of one (batch, KV head) lies, for every KV
// layout (flashattn.h, fa_kv_layout): contiguous and pointer arrays base +
// j row; paged base + block_table[b][j / page_size] page + (j % page_size) row,
// with base the KV head's row 0 of page 0.
struct KvRows {
  KvLayout layout = KvLayout::Contiguous;
  Reg base;                   // row 0 (paged: of page 0) of this (batch, KV head)
  Reg row;                    // bytes between tokens (stride[1])
  Reg page;                   // paged: bytes between pages (stride[0])
  Reg table;                  // paged: &block_table[b][0], global
  Reg page_size;              // paged: s32
  Reg page_shift, page_mask;  // spec.page_pow2: log2(page_size), page_size - 1
  bool paged() const { return layout == KvLayout::Paged; }
  // Key j's page entry *pi = j / page_size and slot *off = j % page_size
  // (shift and mask with page_pow2).
  void page_of(Emitter &e, Reg j, Reg *pi, Reg *off) const;
  // The address of key j's row (j an s32 register, 0 <= j < the sequence's
  // keys: its page entry is then in the table).
  Reg at(Emitter &e, Reg j) const;
};
// K and V rows of (bz, kvh): k/v the global addresses of the k and v
// parameters, ks/vs their byte strides (batch or page, token, head);
// params_kv the offset of the KvPages in the kernel's parameter block.
void kv_rows(Emitter &e, const KernelSpec &spec, size_t params_kv, Reg k, Reg v, const Reg ks[3],
             const Reg vs[3], Reg bz, Reg kvh, KvRows *kr, KvRows *vr);

// This CTA's slice of O's columns, %ctaid.x % dv_split (KernelSpec::dv_split;
// the slice is the grid's fastest index).
inline Reg dv_slice_index(Emitter &e, const KernelSpec &spec) {
  return e.op(Op::Rem, Type::U32, e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX)),
              imm(spec.dv_split));
}

struct ForwardBases {
  Reg sq, sk;               // seqlen_q, seqlen_k of this sequence
  Reg q_bh, k_bh, v_bh;     // row 0 of this (batch, head); paged: of page 0
  Reg q_row, k_row, v_row;  // bytes between consecutive rows
  KvRows kr, vr;            // every layout's K/V row addresses
};
// Varlen: a CTA whose m-block (first row m0) is past its sequence exits
// there, before any barrier; with `past` (a persistent kernel, whose CTA
// still has other work items) it branches to that label instead.
ForwardBases forward_bases(Emitter &e, const KernelSpec &spec, Reg q, Reg k, Reg v, Reg bz, Reg h,
                           Reg kvh, Reg m0, const ptx::Label *past = nullptr);

// The fp32 descale of (batch bz, KV head kvh) from a descale pointer
// parameter at `ptr_param` (0 = 1.0) and the {int64, int64} descale_stride
// at `stride_param` (elements): ptr[bz stride[0] + kvh stride[1]], one load.
Reg load_descale(Emitter &e, size_t ptr_param, size_t stride_param, Reg bz, Reg kvh);
// The fp8 forward's descale at `member` (offsetof(Fp8Descales, ...)) of
// (bz, kvh), from the spec's parameter block (fp8_descales_offset).
Reg fp8_descale(Emitter &e, const KernelSpec &spec, size_t member, Reg bz, Reg kvh);
// The fp8 forward: scale (the f32 register every score is multiplied by:
// score_scale, or with softcap its -2 log2(e) constant) times Q's and K's
// descales of (bz, kvh).
void fp8_scale_scores(Emitter &e, const KernelSpec &spec, Reg bz, Reg kvh, Reg scale);

// Head h's attention sink (spec.sinks) in the log2 domain: sinks[h] *
// log2(e), read from ForwardParams::sinks at params_base +
// offsetof(ForwardParams, sinks) (params_base: where ForwardParams sits in
// the kernel's parameter block). One load per CTA, in the epilogue.
Reg sink_log2(Emitter &e, Reg h, size_t params_base = 0);
// The same from the u64 sinks pointer at parameter offset sinks_param (a
// kernel whose block is not ForwardParams: DecodeParams::sinks).
Reg sink_log2_at(Emitter &e, Reg h, size_t sinks_param);

// min(max(end - start, 0), max_len) of two device-provided int32 offsets,
// formed in 64 bits (a varlen sequence's length, cut to the launch maximum).
Reg seq_len(Emitter &e, Reg start, Reg end, Reg max_len);

// Where this CTA's (batch, head) results go: O row 0 and its row stride, the
// LSE element of row 0 (valid only when has_lse). Formed from the parameters
// (and cu_seqlens) where they are needed, so nothing is kept across the K/V
// loop; seqlen_q = this sequence's length (ForwardBases::sq). spec.split_kv:
// the split's partial state instead (ForwardTail, decode's layout): O rows
// of head_dim_v fp32 (o_row = num_heads_q head_dim_v 4 bytes; the CTA's
// column slice is the caller's) at row ((split batch + b) seqlen_q + i)
// num_heads_q + h, LSE at ((split batch + b) num_heads_q + h) seqlen_q + i,
// has_lse always; with varlen seqlen_q there is the launch's (the padded
// partial states' rows), not the argument.
struct ForwardOut {
  Reg o_bh, o_row, lse_row0, has_lse;
};
ForwardOut forward_out(Emitter &e, const KernelSpec &spec, Reg bz, Reg h, Reg seqlen_q);

// The keys of sequence bz in a decode launch (u32 bz, s32 result, not
// clamped): cache_seqlens[bz] (device data; `seqlens` its global address,
// loaded where the kernel loads it), or seqlen_k_max for a spec with
// fixed_len (a forward over fixed-length K/V run by the decode kernel,
// Runtime::forward_as_decode; fa_decode requires cache_seqlens), which
// needs no `seqlens`.
Reg decode_seqlen(Emitter &e, const KernelSpec &spec, Reg bz, Reg seqlens);

// The frame of the warp-specialised sm_90a kernels (FlashAttention-3's
// structure: warpgroup 0 a producer, warpgroups 1 and 2 consumers; 384
// threads): %tid.x, its warp and the dynamic shared memory's address
// (1024-byte aligned: the 128-byte swizzle's period), u32; the module
// arch-specific (sm_90a) with one CTA per SM (the register cap setmaxnreg
// redistributes).
struct WarpgroupFrame {
  Reg tid, warp, smem;
};
WarpgroupFrame warpgroup_frame(Emitter &e);
// The roles after the common prologue: warps 0-3 run producer(), the others
// consumers(), then every thread exits; returns the module (e.b is moved).
std::string warpgroup_roles(Emitter &e, const KernelSpec &spec, Reg warp,
                            const std::function<void()> &producer,
                            const std::function<void()> &consumers);

// spec.split_kv: the launch's m-blocks, ceil(seqlen_q / block_m) (u32), and
// this CTA's split, ctaid.x / (m-blocks x dv_split) (CTA x = (m-block x
// dv_split + slice) + m-blocks x dv_split x split).
Reg forward_m_blocks(Emitter &e, const KernelSpec &spec);
Reg forward_split_index(Emitter &e, const KernelSpec &spec);

// Softcap constants of scale_score: neg2 = -2 log2(e) score_scale and
// cap_log2 = softcap log2(e), both kernel parameters (the host computes
// them, so the assembler reads them from the constant bank and they hold no
// register across a loop). A default Softcap means no softcap.
struct Softcap {
  Reg neg2, cap_log2;
};
Softcap softcap_consts(Reg softcap_neg2, Reg softcap_log2);

// Scales a raw score s = q.k in place to the log2 domain: s * score_scale,
// or with softcap, cap_log2 tanh(x), x = s * score_scale, computed as
// cap_log2 (2 / (1 + t) - 1) with t = e^(-2x) clamped to 2^32 (where tanh is
// -1 in f32): seven instructions (one ex2, one rcp.approx), no overflow.
void scale_score(Emitter &e, Reg s, Reg score_scale, const Softcap &cap);

}  // namespace kgen
}  // namespace fa
