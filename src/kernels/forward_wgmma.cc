// sm_90a forward generator: FlashAttention-3's structure (Shah, Bikshandi,
// Zhang, Thakkar, Ramani, Dao, 2024) on wgmma and TMA.
//
// A CTA of three warpgroups owns block_m = 128 query rows of one (batch,
// head). Warpgroup 0 is the producer: one thread issues TMA copies
// (cp.async.bulk.tensor) of Q once and of K and V tile by tile into a ring
// of `stages` buffers; each buffer has a "full" mbarrier (the copy's bytes,
// expect_tx / complete_tx) and an "empty" one (every consumer thread arrives
// when done with it). Warpgroups 1 and 2 are consumers of 64 rows each: per
// K/V tile S = Q K^T (wgmma, both operands in shared memory through matrix
// descriptors, 128-byte swizzle), the mask where the tile needs one, the
// online softmax (tile::OnlineSoftmax: the accumulator of wgmma m64nNk16 is,
// per warp, the mma.m16n8 C layout), then O += P V with P packed from the S
// registers as wgmma's register A operand and V read N-major (trans-b).
// setmaxnreg moves registers from the producer to the consumers. K/V tiles
// are visited from the last to the first, as in the mma.sync forward.
// spec.persistent: one CTA per SM runs work items (m-block, head, batch)
// one after another in tile::TileScheduler's order, the ring running on
// across them and Q's buffer refilled once the previous item's epilogue is
// done with it (q_empty; docs/kernels.md, "Persistent variant").
// The fp8 forward (wgmma_fp8) runs both products on wgmma k32 e4m3/e5m2 on
// the bytes, with V transposed by the gather producer (v_tile_t) since fp8
// wgmma reads B K-major only, and P in e4m3.
// Layouts and descriptors: docs/kernels.md, "Forward on sm_90a", "fp8 forward".
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/launch.h"
#include "kernels/tile/key_range.h"
#include "kernels/tile/kv_gather.h"
#include "kernels/tile/ring.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/scheduler.h"
#include "kernels/tile/swizzle.h"
#include "kernels/tile/tile.h"

namespace fa {
namespace kgen {
namespace {

using tile::AccTile;
using tile::Frag4;

constexpr int kAtomBytes = tile::Swizzle128::kRowBytes;  // one swizzled row: 64 16-bit values
constexpr int kAtomCols = 64;
// setmaxnreg: producer x 128 + consumer x 256 <= 168 x 384, the registers
// the CTA starts with. The TMA producer needs few (FA3's 24/240); the gather
// producer computes row addresses.
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
constexpr int kGatherProducerRegs = 56, kGatherConsumerRegs = 224;
// The gather producer converting fp8 to f16 holds each chunk's bytes and
// halves: 16 more (56 spilled at head_dim 128 and 256). The fp8 wgmma's
// producer (V's transpose: 16 words a unit) fits the gather's 56.
constexpr int kFp8ProducerRegs = 72, kFp8ConsumerRegs = 216;
// Named barriers: 0 the CTA's, 1 the gather producer's, 2 and 3 ping-pong,
// 4 and 5 each consumer warpgroup's epilogue.
constexpr int kProducerBar = 1, kSchedBar = 2, kEpilogueBar = 4;

// Dynamic shared memory (every tile 1024-byte aligned, as the 128-byte
// swizzle pattern repeats every 1024 bytes): Q as qa column atoms of
// [128 rows][128 B] (max(qa, va) of them: O is staged there at the end),
// spec.q_stages such buffers when persistent; `stages` K buffers of qa
// atoms of [block_n][128 B]; `stages` V buffers of va atoms of
// [block_n][128 B]; then the mbarriers q_full, k_full[s], k_empty[s],
// v_full[s], v_empty[s] (8 bytes each), and with spec.persistent Q's ring
// (q_full[2] and q_empty[2], the latter: Q's buffer free for the next work
// item; q_full above unused) and the work-item pipe of spec.dynamic
// (reserved with any spec.persistent, so the tile choice, made before a
// workspace is known, counts it): two stages of a full and an empty
// mbarrier and an 8-byte slot; then,
// for the gather producer's per-row page lookups, K and V row addresses (8
// bytes each); then, persistent varlen (by_work), the batch's m-block prefix
// (up to tile::kWorkPrefixBytes: what sm_90's opt-in shared memory leaves
// the tile, so that the tile choice is unchanged; tile::WorkScheduler).
struct Layout {
  int qa = 0, va = 0;  // 128-byte column atoms of Q/K rows and of V (O staged: max(qa, va))
  uint32_t q = 0, k = 0, v = 0, k_stage = 0, v_stage = 0, q_atom = 0, kv_atom = 0;
  uint32_t bars = 0, rows = 0, total = 0;  // rows: gather, paged by row: K, V row addresses
  uint32_t prefix = 0;                     // by_work: the m-block prefix
  int work_cap = 0;    // by_work: the most sequences the prefix holds (tile::WorkScheduler)
  uint32_t q_buf = 0;  // one Q buffer's bytes (spec.q_stages of them)
  uint32_t qbars = 0;  // Q's barriers: q_full's stage 0 (bars; persistent: Q's ring)
  uint32_t q_full() const { return qbars; }
  uint32_t k_full(int s) const { return bars + 8 + 8 * static_cast<uint32_t>(s); }
  uint32_t k_empty(int s, int S) const { return k_full(S) + 8 * static_cast<uint32_t>(s); }
  uint32_t v_full(int s, int S) const { return k_empty(S, S) + 8 * static_cast<uint32_t>(s); }
  uint32_t v_empty(int s, int S) const { return v_full(S, S) + 8 * static_cast<uint32_t>(s); }
  // spec.persistent: Q's ring of 2 stages (tile::Ring: stage s + 8 s).
  uint32_t q_empty() const { return qbars + 16; }
  // spec.dynamic: stage s of the work-item pipe (tile::Ring of 2 stages).
  uint32_t item_full(int s) const { return qbars + 32 + 8 * static_cast<uint32_t>(s); }
  uint32_t item_empty(int s) const { return qbars + 48 + 8 * static_cast<uint32_t>(s); }
  uint32_t item_slot(int s) const { return qbars + 64 + 8 * static_cast<uint32_t>(s); }
};

// The gather producer looks pages up row by row: one thread per row of the
// tile, its K and V addresses passed through shared memory.
bool row_table(const KernelSpec &s) {
  return s.gather && s.kv_layout == KvLayout::Paged && !s.page_tiles;
}

// Persistent varlen: the items are the batch's real ones (tile::WorkScheduler),
// up to tile::kWorkBatchMax sequences; above, the padded order.
bool by_work(const KernelSpec &s) { return s.persistent && s.varlen; }

// The fp8 wgmma (wgmma_fp8): Q and K rows of bytes, 128 per atom; V
// transposed, one atom of [head_dim_v rows][128 B] (block_n keys used) per
// stage; O is staged in 16-bit atoms (va of them).
Layout layout(const KernelSpec &s) {
  Layout l;
  const bool f8 = wgmma_fp8(s);
  l.qa = (s.head_dim + (f8 ? kAtomBytes : kAtomCols) - 1) / (f8 ? kAtomBytes : kAtomCols);
  l.va = (s.head_dim_v + kAtomCols - 1) / kAtomCols;
  l.q_atom = static_cast<uint32_t>(s.block_m) * kAtomBytes;
  l.kv_atom = static_cast<uint32_t>(s.block_n) * kAtomBytes;
  l.q = 0;
  l.k_stage = static_cast<uint32_t>(l.qa) * l.kv_atom;
  l.v_stage = f8 ? static_cast<uint32_t>((s.head_dim_v + 7) / 8 * 8) * kAtomBytes
                 : static_cast<uint32_t>(l.va) * l.kv_atom;
  // Q's buffer also stages O in the epilogue: max(qa, va) atoms.
  l.q_buf = static_cast<uint32_t>(std::max(l.qa, l.va)) * l.q_atom;
  l.k = l.q + static_cast<uint32_t>(s.persistent ? s.q_stages : 1) * l.q_buf;
  l.v = l.k + static_cast<uint32_t>(s.stages) * l.k_stage;
  l.bars = l.v + static_cast<uint32_t>(s.stages) * l.v_stage;
  l.qbars = s.persistent ? l.v_empty(s.stages, s.stages) : l.bars;
  l.rows = l.bars + 8 * (1 + 4 * static_cast<uint32_t>(s.stages)) + (s.persistent ? 80 : 0);
  l.rows = (l.rows + 15) / 16 * 16;
  l.total = l.rows + (row_table(s) ? 16 * static_cast<uint32_t>(s.block_n) : 0);
  l.prefix = (l.total + 15) / 16 * 16;
  if (by_work(s)) {
    // What sm_90's opt-in shared memory leaves the tile (it keeps its
    // stages), at most tile::kWorkBatchMax sequences.
    DeviceLimits sm90;
    published_limits(90, &sm90);
    const int64_t room = (int64_t(sm90.smem_per_block_optin) - l.prefix) / 4 - 1;
    l.work_cap =
        static_cast<int>(std::min<int64_t>(std::max<int64_t>(room, 0), tile::kWorkBatchMax));
    l.total = l.prefix + 4 * static_cast<uint32_t>(l.work_cap + 1);
  }
  return l;
}

class ForwardWgmmaGen {
 public:
  explicit ForwardWgmmaGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), forward_params_size(spec)),
        e_(b_),
        // fp8 inputs (spec.q_fp8) with fp8_f16: converted to f16 by the
        // gather producer
        half_(spec.dtype == Dtype::BF16 && spec.q_fp8 == KvFp8::None ? Type::BF16 : Type::F16),
        out_(spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16),
        f8_(wgmma_fp8(spec)),
        q8_(spec.q_fp8 == KvFp8::None || f8_ ? 0
            : spec.q_fp8 == KvFp8::E5M2      ? 2
                                             : 1),
        kv8_(spec.kv_fp8 == KvFp8::None || f8_ ? 0
             : spec.kv_fp8 == KvFp8::E5M2      ? 2
                                               : 1) {
    S_ = spec.stages;
    nS_ = spec.block_n / 8;
    const int kstep = f8_ ? 32 : 16;  // wgmma K
    kD_ = (spec.head_dim + kstep - 1) / kstep;
    nv_ = (spec.head_dim_v + 7) / 8 * 8;  // wgmma N of O += P V
    nO_ = nv_ / 8;
    kP_ = spec.block_n / kstep;
  }

  std::string run() {
    b_.comment(spec_.describe());
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=384 compute_warps=8 block_m=%d block_n=%d "
                  "rows_per_warp=16",
                  lay_.total, spec_.block_m, spec_.block_n);
    b_.comment(perf);
    b_.set_param_align(64);
    const WarpgroupFrame f = warpgroup_frame(e_);
    tid_ = f.tid;
    warp_ = f.warp;
    smem_ = f.smem;
    prologue();
    return warpgroup_roles(
        e_, spec_, warp_, [this] { producer(); }, [this] { consumers(); });
  }

 private:
  using P = ForwardParams;

  // The launch's window edges and head counts (ForwardParams).
  struct Dims {
    Reg wl, wr, hq, hkv;
  };
  Dims dims() {
    const size_t f = offsetof(WgmmaParams, f);
    Dims d;
    d.wl = e_.param(Type::S32, f + offsetof(P, window_left));
    d.wr = e_.param(Type::S32, f + offsetof(P, window_right));
    d.hq = e_.param(Type::S32, f + offsetof(P, num_heads_q));
    d.hkv = e_.param(Type::S32, f + offsetof(P, num_heads_kv));
    return d;
  }

  // ---- every thread: the CTA's rows and key range (spec.persistent: each
  // role's, per work item: item()); barriers set up ----
  void prologue() {
    if (!spec_.persistent) {
      const Dims d = dims();
      Reg mblk = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
      // spec.split_kv: x = m-block + m-blocks x split (forward_split_index).
      if (spec_.split_kv) mblk = e_.op(Op::Rem, Type::U32, mblk, forward_m_blocks(e_, spec_));
      h_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY));
      bz_ = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ));
      work(mblk, d);
      if (spec_.split_kv) {
        Reg size =
            e_.param(Type::S32, forward_tail_offset(spec_) + offsetof(ForwardTail, split_size));
        tile::split_keys(e_, &keys_, forward_split_index(e_, spec_), size, spec_.block_n);
      }
    }
    b_.comment(spec_.gather
                   ? "mbarriers: full = 128 producer threads' arrivals; empty = 256 consumers"
                   : "mbarriers: full = the producer's arrival + the copy's bytes; empty = 256 "
                     "consumers");
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    const int full = spec_.gather ? 128 : 1;
    for (int s = 0; s < (spec_.persistent ? spec_.q_stages : 1); ++s)
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.q_full() + 8 * s)), imm(full));
    for (int s = 0; s < S_; ++s) {
      b_.when(t0).mbarrier_init(at(smem_, lay_.k_full(s)), imm(full));
      b_.when(t0).mbarrier_init(at(smem_, lay_.v_full(s, S_)), imm(full));
      b_.when(t0).mbarrier_init(at(smem_, lay_.k_empty(s, S_)), imm(256));
      b_.when(t0).mbarrier_init(at(smem_, lay_.v_empty(s, S_)), imm(256));
    }
    for (int s = 0; s < (spec_.persistent ? spec_.q_stages : 0); ++s)
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.q_empty() + 8 * s)), imm(256));
    for (int s = 0; s < (spec_.dynamic ? 2 : 0); ++s) {
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.item_full(s))), imm(1));
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.item_empty(s))), imm(256));
    }
    if (by_work(spec_)) {
      // Warp 0 writes the batch's m-block prefix; every role reads it after
      // the barrier below (it is never rewritten).
      const size_t f = offsetof(WgmmaParams, f);
      Reg batch = e_.param(Type::S32, f + offsetof(P, batch));
      ptx::Label built = b_.label();
      Reg skip = e_.setp(Cmp::Ge, Type::U32, tid_, imm(32));
      b_.op(Op::Or, Type::Pred, skip, skip, e_.setp(Cmp::Gt, Type::S32, batch, imm(lay_.work_cap)));
      b_.when(skip).bra(built);
      tile::build_work_prefix(e_, prefix(), e_.global_param(f + offsetof(P, cu_seqlens_q)),
                              e_.param(Type::S32, f + offsetof(P, seqlen_q)), batch, tid_,
                              spec_.block_m, lay_.work_cap);
      b_.bind(built);
    }
    b_.fence_proxy_async();  // the inits, visible to the copy engine
    b_.bar_sync();
  }

  // spec.persistent: work item t (u32) in tile::TileScheduler's order: its
  // head, batch and rows and their keys (work()), or to `exit` past the last
  // item. Everything is re-derived from the parameters per item, so nothing
  // but t is held across the item loop. Varlen (skips()): to `skip` when the
  // item's m-block is past its sequence's rows (an item of the padded grid
  // with no work).
  void item(Reg t, ptx::Label exit, ptx::Label skip = ptx::Label()) {
    const Dims d = dims();
    const size_t f = offsetof(WgmmaParams, f);
    Reg sq = e_.param(Type::S32, f + offsetof(P, seqlen_q));
    Reg sk = e_.param(Type::S32, f + offsetof(P, seqlen_k));
    Reg batch = e_.param(Type::S32, f + offsetof(P, batch));
    const tile::TileScheduler::Item it = tile::persistent_item(
        e_, t, exit, by_work(spec_) ? prefix() : Reg(), sq, sk, d.hq, d.hkv, batch, d.wl, d.wr,
        spec_.block_m, (spec_.head_dim + spec_.head_dim_v) * 2, lay_.work_cap);
    h_ = it.head;
    bz_ = it.batch;
    work(it.m_block, d, skips() ? &skip : nullptr);
  }

  // spec.persistent with varlen: items past their sequence are skipped by
  // every role (forward_bases branches instead of exiting): only in the
  // padded order of a batch above tile::kWorkBatchMax.
  bool skips() const { return spec_.persistent && spec_.varlen; }
  // by_work: the m-block prefix's shared address.
  Reg prefix() { return e_.op(Op::Add, Type::U32, smem_, imm(lay_.prefix)); }

  // spec.persistent: Q's ring (tile::Ring of spec.q_stages stages, its
  // barriers q_full() and q_empty(), its buffers q_buf apart). qi (u32)
  // counts the items that used Q (next_q: a skipped item did not); item qi
  // has stage qi % q_stages: its barriers' address, its buffer's and the
  // phase parity of its q_full.
  struct QSlot {
    Reg stage, bars, buf, parity;
  };
  QSlot q_slot(Reg qi) {
    const tile::Ring q(e_, smem_, spec_.q_stages);
    const tile::Ring::Slot sl = q.slot(qi);
    return {sl.stage, q.bars(sl.stage),
            e_.op(Op::MadLo, Type::U32, sl.stage, imm(lay_.q_buf), smem_), sl.parity};
  }
  void next_q(Reg qi) { b_.op(Op::Add, Type::U32, qi, qi, imm(1)); }

  // The next work item of a persistent CTA into t.
  // Static: t += nctaid.x. spec.dynamic: handoff j (u32, incremented) of
  // the work-item pipe, stage j % 2: the producer (tid 0) waits for the
  // stage's slot to be free, takes a ticket (atom.add on the workspace's
  // `next`), t = nctaid.x + ticket, and passes t on; the consumers wait for
  // it, read it and free the slot (256 arrivals). The gather producer's
  // other 127 threads read the slot after named barrier 1 with tid 0, which
  // wrote it: the slot is rewritten two handoffs later, after tid 0's next
  // such barrier, which each thread reaches only after its read.
  void next_item(Reg t, Reg j, bool producer) {
    Reg nctaid = e_.mov(Type::U32, ptx::sreg(ptx::Special::NctaidX));
    if (!spec_.dynamic) {
      b_.op(Op::Add, Type::U32, t, t, nctaid);
      return;
    }
    const tile::Ring pipe(e_, smem_, 2);
    const tile::Ring::Slot sl = pipe.slot(j);
    Reg bars = pipe.bars(sl.stage);
    b_.op(Op::Add, Type::U32, j, j, imm(1));
    if (producer) {
      b_.comment("dynamic: the next work item is nctaid.x + a ticket from the workspace");
      ptx::Label taken = b_.label();
      if (spec_.gather) b_.unless(e_.setp(Cmp::Eq, Type::U32, tid_, imm(0))).bra(taken);
      pipe.wait(bars, static_cast<int>(lay_.item_empty(0)), pipe.free_parity(sl.parity));
      Reg ticket = b_.b32();
      b_.atom_add(false, Type::U32, ticket, at(workspace(), 0), imm(1));
      b_.op(Op::Add, Type::U32, t, ticket, nctaid);
      b_.st(ptx::Space::Shared, Type::U32, at(bars, static_cast<int>(lay_.item_slot(0))), t);
      b_.mbarrier_arrive(at(bars, static_cast<int>(lay_.item_full(0))));
      if (spec_.gather) {
        b_.comment("dynamic, gather: the producer's 128 threads read tid 0's item");
        b_.bind(taken);
        b_.bar_sync(kProducerBar, 128);
        b_.ld(ptx::Space::Shared, Type::U32, t, at(bars, static_cast<int>(lay_.item_slot(0))));
      }
    } else {
      b_.comment("dynamic: the next work item, from the producer");
      pipe.wait(bars, static_cast<int>(lay_.item_full(0)), sl.parity);
      b_.ld(ptx::Space::Shared, Type::U32, t, at(bars, static_cast<int>(lay_.item_slot(0))));
      b_.mbarrier_arrive(at(bars, static_cast<int>(lay_.item_empty(0))));
    }
  }

  // spec.dynamic: the workspace {u32 next, u32 exited} (global address).
  Reg workspace() {
    return e_.global_param(forward_tail_offset(spec_) + offsetof(ForwardTail, workspace));
  }

  // spec.dynamic, the producer thread past the last item: this CTA is out
  // (atom.add on `exited`, acq_rel); the last one out (exited was nctaid.x
  // - 1: every other CTA took its last ticket before its own add) sets both
  // counters back to zero for the next launch.
  void retire() {
    b_.comment("dynamic: the last CTA out resets the workspace");
    tile::retire_dynamic(e_, workspace());
  }

  // The rows of m-block mblk of (bz_, h_): kvh_, m0_, the sequence lengths,
  // the key range and lean bound (gather: the row addresses).
  void work(Reg mblk, const Dims &d, const ptx::Label *past = nullptr) {
    const size_t f = offsetof(WgmmaParams, f);
    const Reg wl = d.wl, wr = d.wr, hq = d.hq, hkv = d.hkv;
    kvh_ = e_.op(Op::Div, Type::S32, h_, e_.op(Op::Div, Type::S32, hq, hkv));
    m0_ = e_.op(Op::MulLo, Type::S32, mblk, imm(spec_.block_m));
    if (spec_.gather) {
      // This sequence's lengths (cu_seqlens, seqused_k) and row addresses
      // for the producer; a CTA past its sequence leaves here (persistent:
      // the item is skipped, *past).
      Reg q = e_.global_param(f + offsetof(P, q));
      Reg k = e_.global_param(f + offsetof(P, k));
      Reg v = e_.global_param(f + offsetof(P, v));
      fb_ = forward_bases(e_, spec_, q, k, v, bz_, h_, kvh_, m0_, past);
      sq_ = fb_.sq;
      sk_ = fb_.sk;
    } else {
      sq_ = e_.param(Type::S32, f + offsetof(P, seqlen_q));
      sk_ = e_.param(Type::S32, f + offsetof(P, seqlen_k));
    }
    // Query i sees keys [i + sk - sq - wl, i + sk - sq + wr] within [0, sk):
    // the CTA's keys are the union over its rows, from a block_n-aligned
    // start; a tile in [lean_lo, lean_hi] is visible to every row.
    Reg shift = e_.op(Op::Sub, Type::S32, sk_, sq_);
    keys_ = tile::key_range(e_, m0_, shift, sq_, sk_, wl, wr, spec_.block_m, spec_.block_n);
    lean_hi_ = tile::lean_hi(e_, keys_.dfirst, wr, sk_, spec_.block_n);
  }

  // The K/V ring: S_ stages, barriers at smem + 8 stage (tile::Ring).
  tile::Ring ring() { return tile::Ring(e_, smem_, S_); }
  void wait(Reg bars, int off, Reg parity) { ring().wait(bars, off, parity); }

  // ---- warpgroup 0: one thread issues every TMA copy ----
  void producer() {
    b_.setmaxnreg(false, f8_                          ? kGatherProducerRegs
                         : spec_.q_fp8 != KvFp8::None ? kFp8ProducerRegs
                         : spec_.gather               ? kGatherProducerRegs
                                                      : kProducerRegs);
    if (spec_.gather) return producer_gather();
    ptx::Label out = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, tid_, imm(0))).bra(out);
    Reg pa = b_.b64();
    b_.param_address(pa);
    Reg tq =
        e_.op(Op::Add, Type::S64, pa, imm(static_cast<int64_t>(offsetof(WgmmaParams, tmap_q))));
    Reg tk =
        e_.op(Op::Add, Type::S64, pa, imm(static_cast<int64_t>(offsetof(WgmmaParams, tmap_k))));
    Reg tv =
        e_.op(Op::Add, Type::S64, pa, imm(static_cast<int64_t>(offsetof(WgmmaParams, tmap_v))));
    // persistent: the work item, Q's item count, the ring's tile count,
    // the work-item pipe's handoffs (spec.dynamic)
    Reg t, qi, it, j;
    Reg qbars = smem_, qbuf = smem_;  // Q's barriers and buffer (persistent: the item's stage)
    ptx::Label items, next = out, retired = out;
    if (spec_.persistent) {
      persistent_start(&t, &qi, &j);
      it = e_.mov(Type::U32, imm(0));
      items = b_.label();
      next = b_.label();
      if (spec_.dynamic) retired = b_.label();
      b_.bind(items);
      item(t, retired);
      // q_empty of the item's stage completes a phase when all 256 consumer
      // threads are done with the Q last held there (their last S = Q K^T
      // retired) and with its O, which the epilogue stages in that buffer;
      // for the stage's first use the phase before the first counts as
      // complete (tile::Ring's convention). With two stages this is the
      // item before the previous one: the copy below runs while the
      // consumers still work on the previous item.
      const QSlot q = q_slot(qi);
      qbars = q.bars;
      qbuf = q.buf;
      b_.comment("Q's buffer: free once the epilogue of its last item has read O out of it");
      wait(qbars, static_cast<int>(lay_.q_empty()), ring().free_parity(q.parity));
    }
    b_.comment("Q: qa boxes of [128 rows][64 columns]");
    b_.mbarrier_arrive_expect_tx(at(qbars, lay_.q_full()),
                                 imm(static_cast<int64_t>(lay_.qa) * lay_.q_atom));
    for (int a = 0; a < lay_.qa; ++a) {
      Reg c[4] = {e_.mov(Type::S32, imm(kAtomCols * a)), m0_, h_, bz_};
      b_.cp_async_bulk_tensor(at(qbuf, lay_.q + static_cast<uint32_t>(a) * lay_.q_atom), tq, c, 4,
                              at(qbars, lay_.q_full()));
    }
    b_.when(keys_.empty).bra(next);
    b_.comment("K and V tiles, last to first, into the ring");
    Reg n = e_.mov(Type::S32, keys_.top);
    if (!spec_.persistent) it = e_.mov(Type::U32, imm(0));  // persistent: runs on across items
    ptx::Label top = b_.label();
    b_.bind(top);
    const tile::Ring::Slot slot = ring().slot(it);
    const Reg s = slot.stage;
    Reg free_ph = ring().free_parity(slot.parity);  // a fresh buffer counts as freed
    Reg bar = ring().bars(s);
    for (int kv = 0; kv < 2; ++kv) {
      const int atoms = kv ? lay_.va : lay_.qa;
      const uint32_t stage_bytes = kv ? lay_.v_stage : lay_.k_stage;
      const uint32_t base = kv ? lay_.v : lay_.k;
      wait(bar, static_cast<int>(kv ? lay_.v_empty(0, S_) : lay_.k_empty(0, S_)), free_ph);
      const int full = static_cast<int>(kv ? lay_.v_full(0, S_) : lay_.k_full(0));
      b_.mbarrier_arrive_expect_tx(at(bar, full), imm(static_cast<int64_t>(atoms) * lay_.kv_atom));
      Reg dst = e_.op(Op::MadLo, Type::U32, s, imm(stage_bytes), smem_);
      for (int a = 0; a < atoms; ++a) {
        Reg c[4] = {e_.mov(Type::S32, imm(kAtomCols * a)), n, kvh_, bz_};
        b_.cp_async_bulk_tensor(at(dst, base + static_cast<uint32_t>(a) * lay_.kv_atom),
                                kv ? tv : tk, c, 4, at(bar, full));
      }
    }
    b_.op(Op::Add, Type::U32, it, it, imm(1));
    b_.op(Op::Sub, Type::S32, n, n, imm(spec_.block_n));
    b_.when(e_.setp(Cmp::Ge, Type::S32, n, keys_.n_begin)).bra(top);
    if (spec_.persistent) {
      b_.bind(next);
      next_q(qi);
      next_item(t, j, true);
      b_.bra(items);
    }
    if (spec_.dynamic) {
      b_.bind(retired);
      retire();
    }
    b_.bind(out);
  }

  // A persistent role's first work item, ctaid.x (the first ticket of the
  // dynamic order is item nctaid.x), no item in Q's ring and no handoff yet.
  void persistent_start(Reg *t, Reg *qi, Reg *j) {
    b_.comment(spec_.dynamic ? "persistent, dynamic: work item ctaid.x, then from the workspace"
                             : "persistent: work items ctaid.x, ctaid.x + nctaid.x, ...");
    *t = e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
    *qi = e_.mov(Type::U32, imm(0));
    if (spec_.dynamic) *j = e_.mov(Type::U32, imm(0));
  }

  // ---- warpgroup 0, gather mode: 128 threads copy rows with cp.async ----
  // Tile it's K and V land as two commit groups; the full barriers of tile
  // it - 1 are arrived on once tile it's K is in flight (wait_group 1), so
  // one and a half tiles stream at a time. cp.async writes are generic-proxy
  // writes: each thread fences them (fence.proxy.async) before its arrival
  // lets wgmma read them.
  // spec.persistent: every producer thread runs the item loop (the item
  // from next_item); per item it waits for q_empty before its cp.async
  // writes of Q (the previous item's epilogue is done with the buffer), and
  // a skipped item (skips()) touches neither Q's barriers nor the ring, so
  // the tile count, the ring's cursor and Q's parity stay in step with the
  // consumers'.
  void producer_gather() {
    using RowAddr = std::function<Reg(Reg)>;
    Reg t, qi, it, j, it0;
    Reg qbars = smem_, qbuf = smem_;  // Q's barriers and buffer (persistent: the item's stage)
    ptx::Label items, next, skip, retired;
    if (spec_.persistent) {
      persistent_start(&t, &qi, &j);
      it = e_.mov(Type::U32, imm(0));
      it0 = b_.b32();
      items = b_.label();
      skip = b_.label();
      retired = b_.label();
      b_.bind(items);
      item(t, retired, skip);
      const QSlot q = q_slot(qi);
      qbars = q.bars;
      qbuf = q.buf;
      b_.comment("Q's buffer: free once the epilogue of its last item has read O out of it");
      wait(qbars, static_cast<int>(lay_.q_empty()), ring().free_parity(q.parity));
      b_.mov(Type::U32, it0, it);
    }
    b_.comment("Q rows (zeros past seqlen_q)");
    RowAddr q_row = [&](Reg i) { return e_.index(fb_.q_bh, i, fb_.q_row); };
    // 16-byte chunks of a row: 2 per wgmma K step; fp8_f16 loads 8 bytes per chunk.
    const int qk_data = spec_.head_dim / (f8_ ? 16 : 8);
    gather(qbuf, lay_.q, lay_.q_atom, spec_.block_m, 2 * kD_, qk_data, m0_, sq_, q_row, q8_);
    b_.cp_async_commit();
    next = b_.label();
    ptx::Label only_q = b_.label();
    b_.when(keys_.empty).bra(only_q);
    b_.comment("K and V tiles, last to first (zeros past seqlen_k)");
    Reg n = e_.mov(Type::S32, keys_.top);
    if (!spec_.persistent) it = e_.mov(Type::U32, imm(0));  // persistent: runs on across items
    Reg pbar = e_.mov(Type::U32, smem_);  // the previous tile's barriers (stage base)
    ptx::Label top = b_.label();
    b_.bind(top);
    const tile::Ring::Slot slot = ring().slot(it);
    const Reg s = slot.stage;
    Reg free_ph = ring().free_parity(slot.parity);
    Reg bar = ring().bars(s);
    wait(bar, static_cast<int>(lay_.k_empty(0, S_)), free_ph);
    if (row_table(spec_)) page_rows(n);
    Reg kdst = e_.op(Op::MulLo, Type::U32, s, imm(lay_.k_stage));
    kv_tile(kdst, lay_.k, 2 * kD_, qk_data, n, fb_.kr, 0);
    b_.cp_async_commit();
    b_.cp_async_wait(1);  // Q (first tile) or the previous tile's K and V
    b_.fence_proxy_async();
    Reg first = spec_.persistent ? e_.setp(Cmp::Eq, Type::U32, it, it0)
                                 : e_.setp(Cmp::Eq, Type::U32, it, imm(0));
    b_.when(first).mbarrier_arrive(at(qbars, lay_.q_full()));
    b_.unless(first).mbarrier_arrive(at(pbar, static_cast<int>(lay_.k_full(0))));
    b_.unless(first).mbarrier_arrive(at(pbar, static_cast<int>(lay_.v_full(0, S_))));
    wait(bar, static_cast<int>(lay_.v_empty(0, S_)), free_ph);
    Reg vdst = e_.op(Op::MulLo, Type::U32, s, imm(lay_.v_stage));
    if (f8_)
      v_tile_t(vdst, n, fb_.vr, 8 * spec_.block_n);
    else
      kv_tile(vdst, lay_.v, spec_.head_dim_v / 8, spec_.head_dim_v / 8, n, fb_.vr,
              8 * spec_.block_n);
    b_.cp_async_commit();
    b_.mov(Type::U32, pbar, bar);
    b_.op(Op::Add, Type::U32, it, it, imm(1));
    b_.op(Op::Sub, Type::S32, n, n, imm(spec_.block_n));
    b_.when(e_.setp(Cmp::Ge, Type::S32, n, keys_.n_begin)).bra(top);
    b_.cp_async_wait(0);
    b_.fence_proxy_async();
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.k_full(0))));
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.v_full(0, S_))));
    b_.bra(next);
    b_.bind(only_q);
    b_.cp_async_wait(0);
    b_.fence_proxy_async();
    b_.mbarrier_arrive(at(qbars, lay_.q_full()));
    b_.bind(next);
    if (!spec_.persistent) return;
    next_q(qi);
    if (skips()) b_.bind(skip);
    next_item(t, j, true);
    b_.bra(items);
    b_.bind(retired);
    if (spec_.dynamic) {
      ptx::Label out = b_.label();
      b_.unless(e_.setp(Cmp::Eq, Type::U32, tid_, imm(0))).bra(out);
      retire();
      b_.bind(out);
    }
  }

  // The producer warpgroup's K/V tile copies (tile::KvGather): its row
  // table at lay_.rows, named barrier 1 among its 128 threads.
  tile::KvGather kv_gather() {
    tile::KvGather g(e_, tid_);
    g.threads = 128;
    g.smem = smem_;
    g.rows = lay_.rows;
    g.block_n = spec_.block_n;
    g.seqlen_k = sk_;
    g.bar = kProducerBar;
    g.row_table = row_table(spec_);
    g.page_tiles = spec_.page_tiles;
    g.fp8 = kv8_;
    g.half = Type::F16;
    return g;
  }
  void page_rows(Reg n) { kv_gather().page_rows(n, fb_.kr, fb_.vr); }
  // The K (or V) tile of keys n .. n + block_n - 1 into the stage at smem +
  // base + dst (tile::KvGather::tile; `half` bytes into the row table).
  void kv_tile(Reg dst, uint32_t base, int chunks, int data, Reg n, const KvRows &kv, int half) {
    kv_gather().tile(dst, base, lay_.kv_atom, chunks, data, n, kv, half);
  }

  // The fp8 wgmma's V tile (keys n .. n + block_n - 1), transposed into the
  // stage at smem + lay_.v + dst, since fp8 wgmma reads B K-major only: row
  // c of the atom holds V's column c, its byte 16 G + 4 q + i key
  // 16 G + 2 q + i % 2 + 8 (i / 2) (the key order in which tile::pack_a_fp8
  // leaves P, so P needs no shuffle), 16-byte chunk G of row c at chunk
  // G ^ (c % 8) (the 128-byte swizzle). Keys at or past seqlen_k are zeros.
  // `half`: V's offset in the row-address table (row_table).
  // A unit is 16 keys (chunk G) x `cols` columns (group cg): 16 loads of
  // cols bytes, cols / 4 x four 4 x 4 byte transposes (8 prmt.b32 each),
  // cols st.shared.v4. With block_n 128, cols = 8 (ld.global.v2) and G =
  // u % 8: the 8 threads of a v4 store phase write the 8 chunk positions of
  // their rows, and a warp's load reads 8 key rows of 32 bytes (whole
  // sectors). Else cols = 4, unit u's lowest bit is cg's, its next log2(g)
  // G's (g = min(4, block_n / 16)): distinct positions at g = 4, two-way
  // conflicts at g = 2; a warp's load reads 4 key rows of 32 bytes.
  void v_tile_t(Reg dst, Reg n, const KvRows &kv, int half) {
    const int NG = spec_.block_n / 16, W = NG == 8 ? 2 : 1, cols = 4 * W;
    const int NC = spec_.head_dim_v / cols, g = std::min(4, NG);
    const int units = NG * NC, passes = (units + 127) / 128, lg2 = g == 4 ? 3 : 2;
    b_.comment("V transposed: [head_dim_v][keys], keys in pack_a_fp8's order");
    b_.op(Op::Add, Type::U32, dst, dst, smem_);
    Reg rem = e_.op(Op::Sub, Type::S32, sk_, n);  // keys of the tile in range
    Reg row0;                                     // page_tiles: the tile's first row
    if (spec_.page_tiles) {
      Reg pi = e_.op(Op::Div, Type::U32, n, kv.page_size);
      Reg off = e_.op(Op::Rem, Type::U32, n, kv.page_size);
      Reg pg = b_.b32();
      b_.ld(Space::Global, Type::S32, pg, at(e_.index(kv.table, pi, 4)), true);
      row0 = e_.index(e_.index(kv.base, pg, kv.page), off, kv.row);
    }
    Reg w[16][2], t[4], o[2][4][4];  // words [key][h], transposes [h][q][x]
    for (auto &k : w)
      for (int h = 0; h < W; ++h) k[h] = b_.b32();
    for (Reg &x : t) x = b_.b32();
    for (int h = 0; h < W; ++h)
      for (auto &q : o[h])
        for (Reg &x : q) x = b_.b32();
    Reg ok = b_.pred(), full = e_.setp(Cmp::Ge, Type::S32, rem, imm(spec_.block_n));
    auto load = [&](Reg a, int k) {
      if (W == 2)
        b_.ld_v(Space::Global, Type::B32, {w[k][0], w[k][1]}, at(a));
      else
        b_.ld(Space::Global, Type::B32, w[k][0], at(a));
    };
    for (int p = 0; p < passes; ++p) {
      ptx::Label skip = b_.label();
      Reg u = e_.op(Op::Add, Type::U32, tid_, imm(128 * p));
      if ((p + 1) * 128 > units) b_.when(e_.setp(Cmp::Ge, Type::U32, u, imm(units))).bra(skip);
      // The unit writes chunk G of rows c = cols cg .. cols cg + cols - 1;
      // sw: the chunk's slot in the first of them (tile::Swizzle128).
      Reg cg, G, sw;
      if (W == 2) {
        G = e_.op(Op::And, Type::B32, u, imm(7));
        cg = e_.op(Op::Shr, Type::U32, u, imm(3));
        sw = tile::Swizzle128::slot_bytes(e_, G, Reg());  // c % 8 = 0
      } else {
        Reg hi = e_.op(Op::Shr, Type::U32, u, imm(lg2));
        cg = e_.op(Op::Rem, Type::U32, hi, imm(NC / 2));
        b_.op(Op::Shl, Type::B32, cg, cg, imm(1));
        Reg odd = e_.op(Op::And, Type::B32, u, imm(1));
        b_.op(Op::Add, Type::U32, cg, cg, odd);
        G = e_.op(Op::Div, Type::U32, hi, imm(NC / 2));
        b_.op(Op::MulLo, Type::U32, G, G, imm(g));
        b_.op(Op::Add, Type::U32, G, G,
              e_.op(Op::And, Type::B32, e_.op(Op::Shr, Type::U32, u, imm(1)), imm(g - 1)));
        // The first row 4 cg has c % 8 = 4 (cg & 1).
        sw = tile::Swizzle128::slot_bytes(e_, G, e_.op(Op::Shl, Type::B32, odd, imm(2)));
      }
      Reg k0 = e_.op(Op::MulLo, Type::U32, G, imm(16));  // the unit's first key in the tile
      // Key k's address: from the row table, or row k0 + k of a linear run.
      Reg slot, a, colb = b_.b64();  // colb: the group's byte offset in a row
      b_.mul_wide(Type::U32, colb, cg, imm(cols));
      if (row_table(spec_)) {
        slot = e_.op(Op::MadLo, Type::U32, k0, imm(8), smem_);
      } else {
        a = spec_.page_tiles ? e_.index(row0, k0, kv.row)
                             : kv.at(e_, e_.op(Op::Add, Type::S32, n, k0));
        b_.op(Op::Add, Type::S64, a, a, colb);
      }
      auto key_addr = [&](int k) {
        if (!row_table(spec_)) {
          if (k) b_.op(Op::Add, Type::S64, a, a, kv.row);
          return a;
        }
        Reg r = b_.b64();
        b_.ld(Space::Shared, Type::U64, r, at(slot, lay_.rows + half + 8 * k));
        b_.op(Op::Add, Type::S64, r, r, colb);
        return r;
      };
      // A tile wholly before seqlen_k (all but the first) loads unpredicated.
      ptx::Label part = b_.label(), loaded = b_.label();
      b_.unless(full).bra(part);
      for (int k = 0; k < 16; ++k) load(key_addr(k), k);
      b_.bra(loaded);
      b_.bind(part);
      Reg left = e_.op(Op::Sub, Type::S32, rem, k0);
      for (int k = 0; k < 16; ++k) {
        Reg ak = key_addr(k);
        for (int h = 0; h < W; ++h) b_.mov(Type::B32, w[k][h], imm(0));
        b_.setp(Cmp::Gt, Type::S32, ok, left, imm(k));
        b_.when(ok);
        load(ak, k);
      }
      b_.bind(loaded);
      // Logical keys 4q .. 4q + 3 of the chunk: keys 2q, 2q + 1, 2q + 8,
      // 2q + 9; o[h][q][x] their bytes of column cols cg + 4 h + x.
      for (int h = 0; h < W; ++h) {
        for (int q = 0; q < 4; ++q) {
          Reg a0 = w[2 * q][h], a1 = w[2 * q + 1][h], b0 = w[2 * q + 8][h], b1 = w[2 * q + 9][h];
          b_.op(Op::Prmt, Type::B32, t[0], a0, a1, imm(0x5140));
          b_.op(Op::Prmt, Type::B32, t[1], a0, a1, imm(0x7362));
          b_.op(Op::Prmt, Type::B32, t[2], b0, b1, imm(0x5140));
          b_.op(Op::Prmt, Type::B32, t[3], b0, b1, imm(0x7362));
          b_.op(Op::Prmt, Type::B32, o[h][q][0], t[0], t[2], imm(0x5410));
          b_.op(Op::Prmt, Type::B32, o[h][q][1], t[0], t[2], imm(0x7632));
          b_.op(Op::Prmt, Type::B32, o[h][q][2], t[1], t[3], imm(0x5410));
          b_.op(Op::Prmt, Type::B32, o[h][q][3], t[1], t[3], imm(0x7632));
        }
      }
      // Row c = cols cg + r (r = 4 h + x < cols; cols cg % 8 & r = 0): the
      // first row's slot, flipped by r, r rows on.
      Reg rowa = e_.op(Op::MadLo, Type::U32, cg, imm(cols * kAtomBytes), dst);
      Reg sa = b_.b32();
      for (int h = 0; h < W; ++h) {
        for (int x = 0; x < 4; ++x) {
          const int r = 4 * h + x;
          b_.op(Op::Xor, Type::B32, sa, sw, imm(tile::Swizzle128::flip(r)));
          b_.op(Op::Add, Type::U32, sa, sa, rowa);
          b_.st_v(Space::Shared, Type::B32, at(sa, lay_.v + static_cast<uint32_t>(r * kAtomBytes)),
                  {o[h][0][x], o[h][1][x], o[h][2][x], o[h][3][x]});
        }
      }
      b_.bind(skip);
    }
  }

  void gather(uint32_t base, uint32_t atom_bytes, int rows, int chunks, int data, Reg first,
              Reg limit, const std::function<Reg(Reg)> &row_addr, int fp8) {
    gather(smem_, base, atom_bytes, rows, chunks, data, first, limit, row_addr, fp8);
  }

  // tile::gather_rows by the producer's 128 threads.
  void gather(Reg dst, uint32_t base, uint32_t atom_bytes, int rows, int chunks, int data,
              Reg first, Reg limit, const std::function<Reg(Reg)> &row_addr, int fp8 = 0) {
    tile::gather_rows(e_, tid_, dst, base, atom_bytes, rows, chunks, data, first, limit, row_addr,
                      fp8);
  }

  // The KV head, re-derived where the consumers need it (the fp8
  // descales): kvh_ kept live from the prologue into them spilled.
  Reg kv_head() {
    const size_t f = offsetof(WgmmaParams, f);
    Reg g = e_.op(Op::Div, Type::S32, e_.param(Type::S32, f + offsetof(P, num_heads_q)),
                  e_.param(Type::S32, f + offsetof(P, num_heads_kv)));
    return e_.op(Op::Div, Type::S32, h_, g);
  }

  // ---- warpgroups 1 and 2: 64 rows each ----
  void consumers() {
    b_.setmaxnreg(true, f8_                          ? kGatherConsumerRegs
                        : spec_.q_fp8 != KvFp8::None ? kFp8ConsumerRegs
                        : spec_.gather               ? kGatherConsumerRegs
                                                     : kConsumerRegs);
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    ln_ = tile::make_lanes(e_, lane);
    // wg = warp / 4 - 1: rows 64 wg .. 64 wg + 63 of the CTA; this warp's
    // 16 rows start at wrow = 16 (warp - 4).
    Reg wg = e_.op(Op::Sub, Type::U32, e_.op(Op::Shr, Type::U32, warp_, imm(2)), imm(1));
    wg1_ = e_.setp(Cmp::Eq, Type::U32, wg, imm(0));
    wg_ = wg;
    wrow_ = e_.op(Op::MulLo, Type::U32, e_.op(Op::Sub, Type::U32, warp_, imm(4)), imm(16));
    // Descriptors (start address >> 4 in bits 0-13): Q K-major (its
    // warpgroup's 64 rows), K K-major, V N-major; SBO = 8 rows of 128 B,
    // V's LBO = the next 64-column atom.
    Reg qaddr = e_.op(Op::MadLo, Type::U32, wg, imm(64 * kAtomBytes), smem_);
    using tile::Swizzle128;
    qdesc_ = desc(qaddr, lay_.q, Swizzle128::desc_bits(16));
    qbars_ = qbuf_ = smem_;  // persistent: per item
    kdesc0_ = desc(smem_, lay_.k, Swizzle128::desc_bits(16));
    // fp8 wgmma: V transposed, K-major like K.
    vdesc0_ =
        desc(smem_, lay_.v, f8_ ? Swizzle128::desc_bits(16) : Swizzle128::desc_bits(lay_.kv_atom));

    s_ = tile::acc_tile(b_, nS_);
    o_ = tile::acc_tile(b_, nO_);
    if (!spec_.persistent) tile::zero(b_, o_);  // persistent: per item
    for (const Frag4 &f : s_.f)
      for (Reg r : f) s_flat_.push_back(r);
    for (const Frag4 &f : o_.f)
      for (Reg r : f) o_flat_.push_back(r);
    for (int t = 0; t < kP_; ++t) pa_.push_back(tile::frag4(b_));
    const size_t f = offsetof(WgmmaParams, f);
    score_scale_ = e_.param(Type::F32, f + offsetof(P, score_scale));
    if (spec_.softcap)
      cap_ = softcap_consts(e_.param(Type::F32, f + offsetof(P, softcap_neg2)),
                            e_.param(Type::F32, f + offsetof(P, softcap_log2)));
    if (spec_.q_fp8 != KvFp8::None && !spec_.persistent)  // persistent: per item
      fp8_scale_scores(e_, spec_, bz_, kv_head(), spec_.softcap ? cap_.neg2 : score_scale_);
    softmax_ = std::make_unique<tile::OnlineSoftmax>(
        e_, 1, spec_.softcap ? Reg() : score_scale_,
        f8_ ? tile::OnlineSoftmax::fp8_form() : tile::OnlineSoftmax::Form());
    if (!spec_.persistent) return consumer_item(Reg());
    consumer_items();
  }

  // spec.persistent: one work item after another (item()). The ring's
  // cursor runs on across them, as the producer's tile count does. An
  // item's O is stored by the next pass of the loop (an item finished but
  // not stored is `held`): with two Q buffers after the next item's first
  // S = Q K^T is issued, so that GEMM runs on the tensor cores during the
  // epilogue (the next item's Q is in the other buffer; the stored one's O
  // is staged in its own); with one buffer before the next item's Q can
  // arrive (it reuses the buffer). An item's Q buffer (its stage of Q's
  // ring) is refilled only when its q_empty has completed the item's phase:
  // each consumer thread arrives once its epilogue has read its O rows back
  // out of that buffer (ld.shared; the arrive's release orders those reads
  // before it) and after a fence.proxy.async, which orders its
  // generic-proxy stmatrix writes of O there before the async-proxy TMA
  // write of a later Q (PTX ISA, "Memory Consistency Model": proxies). Its
  // S = Q K^T wgmma reads of Q retired before the epilogue began.
  void consumer_items() {
    const size_t f = offsetof(WgmmaParams, f);
    // The overlap needs the next item's Q in the other buffer and registers
    // for O packed beside the accumulators (head_dim_v 256 spilled).
    const bool overlap = spec_.q_stages > 1 && spec_.head_dim_v <= 128;
    cur_ = ring().begin();
    Reg t, qi, j;
    const Reg qdesc0 = qdesc_;
    persistent_start(&t, &qi, &j);
    // held: an item's O waits to be stored (in o_, or packed with the
    // overlap; its rows, Q buffer and barriers in `last`).
    Reg held = e_.mov(Type::U32, imm(0));
    Finished last;
    for (Reg *r : {&last.m0, &last.sq, &last.buf, &last.bars}) *r = b_.b32();
    for (Reg *r : {&last.out.o_bh, &last.out.o_row, &last.out.lse_row0}) *r = b_.b64();
    last.lse = {b_.f32(), b_.f32()};
    for (int i = 0; overlap && i < 2 * o_.n(); ++i) last.packed.push_back(b_.b32());
    // Whether LSE is written: the same for every item (forward_out's test).
    last.out.has_lse =
        e_.setp(Cmp::Ne, Type::U64, e_.param(Type::U64, offsetof(ForwardParams, lse)), imm(0));
    // The held item's store. Emitted on each path (S in flight, none, past
    // the last item) rather than joined: ptxas serializes a wgmma whose
    // in-flight region another path joins.
    auto store_held = [&] {
      ptx::Label none_held = b_.label();
      b_.when(e_.setp(Cmp::Eq, Type::U32, held, imm(0))).bra(none_held);
      store_o(last);
      b_.comment("Q's buffer: this thread is done with it");
      b_.fence_proxy_async();
      b_.mbarrier_arrive(at(last.bars, lay_.q_empty()));
      b_.bind(none_held);
    };
    ptx::Label items = b_.label(), none = b_.label(), exit = b_.label(), skip = b_.label();
    ptx::Label ran = b_.label();
    ItemFlow fl;
    b_.bind(items);
    item(t, none, skip);
    if (spec_.q_fp8 != KvFp8::None) {  // this item's (batch, KV head) descales
      Reg sc = spec_.softcap ? cap_.neg2 : score_scale_;
      b_.ld_param(Type::F32, sc,
                  static_cast<uint32_t>(
                      f + (spec_.softcap ? offsetof(P, softcap_neg2) : offsetof(P, score_scale))));
      fp8_scale_scores(e_, spec_, bz_, kv_head(), sc);
    }
    const QSlot q = q_slot(qi);
    qbars_ = q.bars;
    qbuf_ = q.buf;
    qdesc_ = spec_.q_stages > 1 ? stage_desc(q.stage, qdesc0, lay_.q_buf) : qdesc0;
    softmax_->reset();
    // O starts at zero: set once the first S = Q K^T is in (first_finish;
    // ptxas serializes a wgmma in flight while another's accumulators are
    // written), on the path with no key here. That path and the one with S
    // in flight join only after the item's K/V loop.
    ptx::Label keyed = b_.label();
    if (overlap) {
      fl = start_item(q.parity);
      store_held();  // while the item's first S = Q K^T runs
      b_.bra(keyed);
      b_.bind(fl.no_key);
      store_held();
    } else {
      store_held();
      fl = start_item(q.parity);
      b_.bra(keyed);
      b_.bind(fl.no_key);
    }
    tile::zero(b_, o_);
    b_.bra(ran);
    b_.bind(keyed);
    run_item(fl);
    b_.bind(ran);
    const Finished x = finish();
    for (auto [to, from] :
         {std::pair{last.m0, x.m0}, {last.sq, x.sq}, {last.buf, x.buf}, {last.bars, x.bars}})
      b_.mov(Type::B32, to, from);
    for (auto [to, from] : {std::pair{last.out.o_bh, x.out.o_bh},
                            {last.out.o_row, x.out.o_row},
                            {last.out.lse_row0, x.out.lse_row0}})
      b_.mov(Type::B64, to, from);
    for (int h = 0; h < 2; ++h) b_.mov(Type::F32, last.lse[h], x.lse[h]);
    if (overlap) tile::pack_acc(e_, o_, out_, last.packed);
    b_.mov(Type::U32, held, imm(1));
    next_q(qi);
    b_.bind(skip);
    next_item(t, j, false);
    b_.bra(items);
    b_.bind(none);
    b_.comment("past the last item: store the one held");
    store_held();
    b_.bind(exit);
  }

  // One work item's rows (all of the kernel's without spec.persistent): the
  // K/V loop and the epilogue. qpar: the phase parity of q_full (invalid:
  // the first and only phase), at qbars_; Q (and O in the epilogue) at qbuf_.
  void consumer_item(Reg qpar) {
    const ItemFlow fl = start_item(qpar);
    run_item(fl);
    b_.bind(fl.no_key);
    epilogue();
  }

  // An item's labels and loop predicates: no_key (bound by the caller) is
  // where an item with no key goes from start_item.
  struct ItemFlow {
    ptx::Label no_key, masked, lean, tail;
    Reg p, t;
  };

  // An item's start: ALiBi's row terms, Q in place (q_full's phase qpar)
  // and, to fl.no_key when its key range is empty, its first S = Q K^T
  // issued (first_issue).
  ItemFlow start_item(Reg qpar) {
    const size_t f = offsetof(WgmmaParams, f);
    if (spec_.alibi) {
      // ALiBi: the CTA's coefficient and each row half's distance from its
      // diagonal to the lane's first key column 2q, as f32.
      alibi_coef_ = tile::alibi_coef(e_, f + offsetof(P, alibi_slopes), bz_, h_,
                                     spec_.softcap ? Reg() : score_scale_);
      Reg d0 = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
      b_.op(Op::Add, Type::S32, d0, d0, e_.op(Op::Sub, Type::S32, sk_, sq_));
      b_.op(Op::Sub, Type::S32, d0, d0, e_.op(Op::Shl, Type::B32, ln_.q, imm(1)));
      for (int h = 0; h < 2; ++h) {
        alibi_dist_[h] = b_.f32();
        b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, alibi_dist_[h],
               h ? e_.op(Op::Add, Type::S32, d0, imm(8)) : d0);
      }
    }

    wait(qbars_, static_cast<int>(lay_.q_full()), qpar.valid() ? qpar : e_.mov(Type::U32, imm(0)));
    ItemFlow fl;
    fl.no_key = b_.label();
    fl.masked = b_.label();
    fl.lean = b_.label();
    fl.tail = b_.label();
    b_.when(keys_.empty).bra(fl.no_key);
    n_ = e_.mov(Type::S32, keys_.top);
    if (pingpong()) {
      b_.comment("ping-pong: warpgroup 1 issues its GEMMs first");
      b_.unless(wg1_).bar_arrive(kSchedBar, 256);
    }
    fl.p = b_.pred();
    fl.t = b_.pred();
    // The first tile alone (no P V in flight yet); then every tile issues its
    // S = Q K^T and the previous tile's O += P V together and runs its
    // softmax while the P V runs (FlashAttention-3's intra-warpgroup
    // overlap); the last P V after the loop.
    first_issue();
    return fl;
  }

  // An item's K/V loop once its first S = Q K^T is issued (start_item):
  // the first tile's softmax, every further tile, the last P V.
  void run_item(const ItemFlow &fl) {
    first_finish();
    b_.setp(Cmp::Lt, Type::S32, fl.p, n_, keys_.n_begin);
    b_.when(fl.p).bra(fl.tail);
    tile::KeyLoop loop;
    loop.n = n_;
    loop.n_begin = keys_.n_begin;
    loop.lean_lo = keys_.lean_lo;
    loop.lean_hi = [this] { return lean_hi_; };
    loop.masked = fl.masked;
    loop.lean = fl.lean;
    loop.exit = fl.tail;
    loop.p = fl.p;
    loop.t = fl.t;
    tile::key_loop(b_, loop, [this](bool m) { body(m); });
    b_.bind(fl.tail);
    last_pv();
    // Warpgroup 2 arrived once more than warpgroup 1 waited: balance it.
    if (pingpong()) b_.when(wg1_).bar_sync(kSchedBar, 256);
  }

  // The descriptor of the swizzled matrix at addr + off (tile::Swizzle128).
  Reg desc(Reg addr, uint32_t off, uint64_t bits) {
    return tile::Swizzle128::descriptor(e_, addr, off, bits);
  }

  // Descriptor of stage s's K (or V) tile: stage_bytes >> 4 further per stage.
  Reg stage_desc(Reg s, Reg desc0, uint32_t stage_bytes) {
    Reg off = e_.op(Op::MulLo, Type::U32, s, imm(stage_bytes >> 4));
    Reg d = b_.b64();
    b_.cvt(Type::U64, Type::U32, ptx::Round::None, d, off);
    b_.op(Op::Add, Type::S64, d, d, desc0);
    return d;
  }

  // Issues S = Q K^T on stage s (no commit).
  void issue_s(Reg kdesc) {
    for (int kk = 0; kk < kD_; ++kk) {
      // K slice kk (k16, or k32 of fp8): atom kk / 4, 32 bytes per slice within it.
      const int64_t qoff = (int64_t(kk / 4) * lay_.q_atom + (kk % 4) * 32) >> 4;
      const int64_t koff = (int64_t(kk / 4) * lay_.kv_atom + (kk % 4) * 32) >> 4;
      Reg qd = e_.op(Op::Add, Type::S64, qdesc_, imm(qoff));
      Reg kdd = e_.op(Op::Add, Type::S64, kdesc, imm(koff));
      if (f8_)
        b_.wgmma_ss_fp8(fp8_type(spec_.q_fp8), fp8_type(spec_.kv_fp8), spec_.block_n,
                        s_flat_.data(), qd, kdd, imm(kk == 0 ? 0 : 1));
      else
        b_.wgmma_ss(half_, spec_.block_n, s_flat_.data(), qd, kdd, imm(kk == 0 ? 0 : 1), false);
    }
  }

  // Issues O += P V with P in pa_ and V in the stage of vdesc (no commit).
  void issue_pv(Reg vdesc) {
    if (f8_) {  // keys 32 t .. 32 t + 31: 32 bytes further in V's transposed rows
      for (int t = 0; t < kP_; ++t) {
        Reg vdd = e_.op(Op::Add, Type::S64, vdesc, imm(int64_t(t) * 32 >> 4));
        b_.wgmma_rs_fp8(ptx::Fp8::E4M3, fp8_type(spec_.kv_fp8), nv_, o_flat_.data(), pa_[t].data(),
                        vdd, imm(1));
      }
      return;
    }
    for (int t = 0; t < kP_; ++t) {
      // Keys 16 t .. 16 t + 15: 16 rows of 128 B further in each V atom.
      Reg vdd = e_.op(Op::Add, Type::S64, vdesc, imm((int64_t(t) * 16 * kAtomBytes) >> 4));
      b_.wgmma_rs(half_, nv_, o_flat_.data(), pa_[t].data(), vdd, imm(1), true);
    }
  }

  // Softcap and the mask on S (now in registers).
  void scores_ready(bool masked) {
    if (spec_.softcap)
      for (const Frag4 &fr : s_.f)
        for (Reg x : fr) scale_score(e_, x, score_scale_, cap_);
    if (spec_.alibi) {
      // ALiBi on every tile (tile::alibi_row_half): row half h's key
      // n + 8j + 2q + x is at distance dist_h - n - 8j - x.
      b_.comment("alibi");
      Reg nf = b_.f32(), d = b_.f32(), t = b_.f32();
      b_.cvt(Type::F32, Type::S32, ptx::Round::Rn, nf, n_);
      for (int h = 0; h < 2; ++h) {
        b_.op(Op::Sub, Type::F32, d, alibi_dist_[h], nf);
        tile::alibi_row_half(b_, s_, h, d, alibi_coef_, t);
      }
    }
    if (masked) mask();
  }

  // P as wgmma's A operand: 16-bit, or e4m3 in pack_a_fp8's key order.
  void pack_p() {
    for (int t = 0; t < kP_; ++t) {
      if (f8_)
        tile::pack_a_fp8(b_, s_, 4 * t, pa_[t]);
      else
        tile::pack_a(b_, half_, s_, 2 * t, pa_[t]);
    }
  }

  static ptx::Fp8 fp8_type(KvFp8 f) { return f == KvFp8::E5M2 ? ptx::Fp8::E5M2 : ptx::Fp8::E4M3; }

  // Moves to the next tile: the ring's cursor (the current stage becomes
  // the previous one) and the key.
  void next_tile() {
    ring().advance(cur_);
    b_.op(Op::Sub, Type::S32, n_, n_, imm(spec_.block_n));
  }

  // The first tile (the last in key order; masked: it may hold the tail).
  // first_issue: its S = Q K^T issued; first_finish: the rest once in.
  void first_issue() {
    b_.comment("first K/V tile: S, softmax, P (its P V runs with the next S)");
    if (!spec_.persistent) cur_ = ring().begin();  // persistent: runs on across items
    Reg s = cur_.stage, ph = cur_.parity;
    first_bar_ = ring().bars(s);
    wait(first_bar_, static_cast<int>(lay_.k_full(0)), ph);
    sched_sync();
    b_.wgmma_fence();
    issue_s(stage_desc(s, kdesc0_, lay_.k_stage));
    b_.wgmma_commit();
    sched_arrive();
  }
  void first_finish() {
    b_.wgmma_wait(0);
    if (spec_.persistent) tile::zero(b_, o_);  // the item's O (the last one's stored by now)
    b_.mbarrier_arrive(at(first_bar_, static_cast<int>(lay_.k_empty(0, S_))));
    scores_ready(true);
    softmax_->step({s_}, {o_});
    pack_p();
    next_tile();
  }

  // Tile it: S_it = Q K_it^T and O += P_{it-1} V_{it-1} in flight together;
  // the softmax of S_it while the P V runs; O rescaled once it is done.
  void body(bool masked) {
    Reg s = cur_.stage, ph = cur_.parity, sp = cur_.prev_stage, pp = cur_.prev_parity;
    Reg bar = ring().bars(s);
    Reg pbar = ring().bars(sp);
    wait(bar, static_cast<int>(lay_.k_full(0)), ph);
    wait(pbar, static_cast<int>(lay_.v_full(0, S_)), pp);
    sched_sync();
    b_.wgmma_fence();
    b_.comment("S = Q K^T");
    issue_s(stage_desc(s, kdesc0_, lay_.k_stage));
    b_.wgmma_commit();
    b_.comment("O += P V of the previous tile");
    issue_pv(stage_desc(sp, vdesc0_, lay_.v_stage));
    b_.wgmma_commit();
    sched_arrive();
    b_.wgmma_wait(1);  // S is in; P V may still run
    b_.mbarrier_arrive(at(bar, static_cast<int>(lay_.k_empty(0, S_))));
    scores_ready(masked);
    softmax_->step_scores({s_});
    b_.wgmma_wait(0);  // P V done: O and the previous V stage are free
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.v_empty(0, S_))));
    softmax_->rescale({o_});
    pack_p();
    next_tile();
  }

  // FlashAttention-3's ping-pong (head_dim <= 128, as FA3 does): the two
  // consumer warpgroups take turns issuing their GEMMs, so one's softmax
  // runs while the other's GEMMs use the tensor cores. Warpgroup w waits on
  // named barrier kSchedBar + w - 1 (its 128 threads + the other's 128
  // arrivals) before issuing and arrives on the other's after.
  bool pingpong() const { return spec_.head_dim <= 128; }
  void sched_sync() {
    if (!pingpong()) return;
    b_.when(wg1_).bar_sync(kSchedBar, 256);
    b_.unless(wg1_).bar_sync(kSchedBar + 1, 256);
  }
  void sched_arrive() {
    if (!pingpong()) return;
    b_.when(wg1_).bar_arrive(kSchedBar + 1, 256);
    b_.unless(wg1_).bar_arrive(kSchedBar, 256);
  }

  // O += P V of the last tile.
  void last_pv() {
    b_.comment("O += P V of the last tile");
    Reg sp = cur_.prev_stage, pp = cur_.prev_parity;
    Reg pbar = ring().bars(sp);
    wait(pbar, static_cast<int>(lay_.v_full(0, S_)), pp);
    b_.wgmma_fence();
    issue_pv(stage_desc(sp, vdesc0_, lay_.v_stage));
    b_.wgmma_commit();
    b_.wgmma_wait(0);
    b_.mbarrier_arrive(at(pbar, static_cast<int>(lay_.v_empty(0, S_))));
  }

  // Keys outside a row's [lo, hi) = [max(diag - wl, 0), min(diag + wr + 1,
  // sk)) become -inf; element (j, x) of row half h holds key n + 8j + 2q + x.
  void mask() {
    b_.comment("mask");
    const size_t f = offsetof(WgmmaParams, f);
    Reg wl = e_.param(Type::S32, f + offsetof(P, window_left));
    Reg wr = e_.param(Type::S32, f + offsetof(P, window_right));
    Reg diag0 = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
    b_.op(Op::Add, Type::S32, diag0, diag0, e_.op(Op::Sub, Type::S32, sk_, sq_));
    Reg kq = e_.op(Op::MadLo, Type::S32, ln_.q, imm(2), n_);
    Reg p = b_.pred(), t = b_.pred();
    for (int h = 0; h < 2; ++h) {
      Reg diag = e_.op(Op::Add, Type::S32, diag0, imm(8 * h));
      tile::mask_row(b_, s_, h, tile::row_range(e_, diag, wl, wr, imm(0), sk_), kq, p, t);
    }
  }

  // O / l and LSE. O goes through shared memory: stmatrix puts each warp's
  // 16 rows into this warpgroup's own 64 rows of the item's Q buffer (free once its
  // last wgmma has retired; as many 64-column atoms as O needs, swizzled as
  // Q is, so the eight rows of each 8x8 matrix hit distinct banks), then
  // every thread of the warpgroup copies 16-byte chunks to global memory, a
  // row's chunks on consecutive threads (whole sectors).
  void epilogue() {
    const Finished x = finish();
    if (spec_.split_kv) return partial_epilogue(x.lse);
    store_o(x);
  }

  // A finished item: O / l in o_, its LSE, where they go (forward_out),
  // its first row m0, seqlen_q, Q buffer (where O is staged) and Q's
  // barriers (spec.persistent).
  struct Finished {
    ForwardOut out;
    std::vector<Reg> lse;
    Reg m0, sq, buf, bars;
    std::vector<Reg> packed;  // O as out_ pairs (tile::pack_acc), or empty: in o_
  };
  // The item's softmax finished (O / l, LSE; sinks; fp8: V's descale) and,
  // unless split, its output addresses.
  Finished finish() {
    b_.comment("epilogue: O through shared memory (stmatrix), LSE");
    Finished x;
    if (spec_.sinks)
      softmax_->finish({o_}, &x.lse, sink_log2(e_, h_, offsetof(WgmmaParams, f)));
    else
      softmax_->finish({o_}, &x.lse);
    if (spec_.q_fp8 != KvFp8::None) {  // O times V's descale
      Reg vd = fp8_descale(e_, spec_, offsetof(Fp8Descales, v_descale), bz_, kv_head());
      for (Reg r : o_flat_) b_.op(Op::Mul, Type::F32, r, r, vd);
    }
    if (!spec_.split_kv) x.out = forward_out(e_, spec_, bz_, h_, sq_);
    x.m0 = m0_;
    x.sq = sq_;
    x.buf = qbuf_;
    x.bars = qbars_;
    return x;
  }

  // Stores finished item x's O (in o_) and LSE.
  void store_o(const Finished &x) {
    const ForwardOut &out = x.out;
    // The warp's 16 rows of O into its warpgroup's 64 rows of Q's buffer
    // (tile::store_acc; lanes re-derived here rather than held across the
    // loops).
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    Reg wgrow = e_.op(Op::And, Type::B32, wrow_, imm(63));  // the warp's first row in its warpgroup
    Reg wg_base = e_.op(Op::MadLo, Type::U32, wg_, imm(64 * kAtomBytes), x.buf);
    tile::store_acc(e_, tile::make_lanes(e_, lane), o_, out_, tile::Swizzle128{lay_.q_atom},
                    wg_base, wgrow, lay_.q, x.packed.empty() ? nullptr : &x.packed);
    b_.when(wg1_).bar_sync(kEpilogueBar, 128);
    b_.unless(wg1_).bar_sync(kEpilogueBar + 1, 128);
    // 16-byte chunks: thread t of the warpgroup owns chunk t % T of every
    // (128 / T)-th row, T = the row's chunks rounded up to a power of two.
    const int chunks = spec_.head_dim_v / 8;
    int lg = 0;
    while ((1 << lg) < chunks) ++lg;
    const int T = 1 << lg, R = 128 / T;
    Reg wt = e_.op(Op::And, Type::B32, tid_, imm(127));
    Reg c = e_.op(Op::And, Type::B32, wt, imm(T - 1));
    Reg row = e_.op(Op::Shr, Type::U32, wt, imm(lg));
    Reg live = chunks < T ? e_.setp(Cmp::Lt, Type::U32, c, imm(chunks)) : Reg();
    Reg sa = tile::Swizzle128{lay_.q_atom}.addr(e_, wg_base, row, c);
    Reg i0 = e_.op(Op::MadLo, Type::S32, wg_, imm(64), x.m0);
    b_.op(Op::Add, Type::S32, i0, i0, row);
    Reg ga = e_.index(e_.index(out.o_bh, i0, out.o_row), c, 16);
    Reg step = e_.op(Op::MulLo, Type::S64, out.o_row, imm(R));
    Reg ok = b_.pred();
    Reg v[4] = {b_.b32(), b_.b32(), b_.b32(), b_.b32()};
    for (int p = 0; p * R < 64; ++p) {
      Reg i = e_.op(Op::Add, Type::S32, i0, imm(p * R));
      b_.setp(Cmp::Lt, Type::S32, ok, i, x.sq);
      if (live.valid()) b_.op(Op::And, Type::Pred, ok, ok, live);
      if ((p + 1) * R > 64) {  // head_dim_v 8: one chunk a row, R = 128 > 64 rows
        Reg in = e_.setp(Cmp::Lt, Type::U32, row, imm(64 - p * R));
        b_.op(Op::And, Type::Pred, ok, ok, in);
      }
      // With R = 4 alternate passes flip bit 2 of the row's swizzle.
      const uint32_t off = static_cast<uint32_t>(p * R * kAtomBytes);
      Reg s_at = sa;
      if (R == 4 && (p & 1)) s_at = e_.op(Op::Xor, Type::B32, sa, imm(tile::Swizzle128::flip(4)));
      b_.ld_v(Space::Shared, Type::B32, {v[0], v[1], v[2], v[3]}, at(s_at, off));
      b_.when(ok).st_v(Space::Global, Type::B32, at(ga), {v[0], v[1], v[2], v[3]});
      if ((p + 1) * R < 64) b_.op(Op::Add, Type::S64, ga, ga, step);
    }
    b_.comment("LSE");
    Reg q0 = e_.setp(Cmp::Eq, Type::U32, ln_.q, imm(0));
    b_.op(Op::And, Type::Pred, q0, q0, out.has_lse);
    for (int h = 0; h < 2; ++h) {
      Reg li = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, x.m0, wrow_), ln_.g);
      if (h) b_.op(Op::Add, Type::S32, li, li, imm(8));
      Reg lok = e_.setp(Cmp::Lt, Type::S32, li, x.sq);
      b_.op(Op::And, Type::Pred, lok, lok, q0);
      Reg la = e_.index(out.lse_row0, li, 4);
      b_.when(lok).st(Space::Global, Type::F32, at(la), x.lse[h]);
    }
  }

  // spec.split_kv: the rows' partial state (forward_out's), O / l in fp32
  // straight from the accumulator (a lane's column pairs, 8 bytes; a quad's
  // 32 bytes in a row) and the natural LSE. Rows with no key in the split
  // hold O = 0 and LSE = -inf (weight 0 in the reduce).
  void partial_epilogue(const std::vector<Reg> &lse) {
    b_.comment("split-KV: the partial O (fp32) and LSE of the split");
    const ForwardOut out = forward_out(e_, spec_, bz_, h_, sq_);
    Reg q0 = e_.setp(Cmp::Eq, Type::U32, ln_.q, imm(0));
    for (int h = 0; h < 2; ++h) {
      Reg i = e_.op(Op::Add, Type::S32, e_.op(Op::Add, Type::S32, m0_, wrow_), ln_.g);
      if (h) b_.op(Op::Add, Type::S32, i, i, imm(8));
      Reg ok = e_.setp(Cmp::Lt, Type::S32, i, sq_);
      Reg oa = e_.index(e_.index(out.o_bh, i, out.o_row), ln_.q, 8);
      for (int j = 0; j < nO_ && 8 * j < spec_.head_dim_v; ++j)
        b_.when(ok).st_v(Space::Global, Type::F32, at(oa, 32 * j),
                         {o_.f[j][2 * h], o_.f[j][2 * h + 1]});
      Reg la = e_.index(out.lse_row0, i, 4);  // before when(): unpredicated
      b_.op(Op::And, Type::Pred, ok, ok, q0);
      b_.when(ok).st(Space::Global, Type::F32, at(la), lse[h]);
    }
  }

  const KernelSpec &spec_;
  Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;     // the wgmma's 16-bit type
  Type out_;      // O's
  bool f8_;       // the fp8 wgmma (wgmma_fp8)
  int q8_, kv8_;  // fp8 Q, K/V converted on load by the producer: 1 e4m3, 2 e5m2 (0: none)
  int S_ = 2, nS_ = 0, kD_ = 0, nv_ = 0, nO_ = 0, kP_ = 0;
  tile::Lanes ln_;
  Reg tid_, warp_, smem_, wrow_;
  Reg h_, bz_, kvh_, m0_, sq_, sk_, lean_hi_, n_;
  tile::KeyRange keys_;     // the CTA's keys (tile::key_range)
  ForwardBases fb_;         // gather: row addresses
  Reg wg_, wg1_;            // consumers: warpgroup - 1 (0 or 1); it is 0 (rows 0-63)
  tile::Ring::Cursor cur_;  // consumers: stage and parity of this tile and of the previous
  Reg qdesc_, kdesc0_, vdesc0_;
  Reg qbars_, qbuf_;  // consumers: this item's Q barriers and buffer (smem_ unless persistent)
  Reg first_bar_;     // the first tile's ring barriers (first_issue to first_finish)
  Reg score_scale_;
  Softcap cap_;
  AccTile s_, o_;
  std::vector<Reg> s_flat_, o_flat_;
  std::vector<Frag4> pa_;
  std::unique_ptr<tile::OnlineSoftmax> softmax_;
  Reg alibi_coef_, alibi_dist_[2];  // spec.alibi (tile::alibi_coef)
};

}  // namespace

uint32_t wgmma_smem(const KernelSpec &spec) { return layout(spec).total; }

std::string generate_forward_wgmma(const KernelSpec &spec) { return ForwardWgmmaGen(spec).run(); }

}  // namespace kgen

TmaBox wgmma_tma_box(const KernelSpec &spec, TmaOperand which) {
  TmaBox box;
  // One 128-byte swizzle atom per box row: 64 16-bit values, or 128 bytes
  // (the sm_100a fp8 forward reads Q, K and V as fp8 bytes).
  const bool bytes = spec.tcgen05 && spec.q_fp8 != KvFp8::None;
  box.box_cols = bytes ? 128 : kgen::kAtomCols;
  box.elem_bytes = bytes ? 1 : 2;
  box.box_rows = static_cast<uint32_t>(which == TmaOperand::Q ? spec.block_m : spec.block_n);
  // The sm_100a CTA pair: each CTA reads half of every K tile's keys.
  if (spec.cta_pair && which == TmaOperand::K) box.box_rows /= 2;
  box.swizzle_128b = true;
  return box;
}
}  // namespace fa
