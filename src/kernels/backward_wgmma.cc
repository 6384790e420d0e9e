// The backward's main kernel on sm_90a: FlashAttention-3's structure (Shah
// et al., 2024, section 3 and its backward, Appendix B) on wgmma and TMA,
// computing FlashAttention-2's Algorithm 2 (Dao, 2023, section 3.1) in the
// transposed orientation of backward_tc.cc.
//
// A CTA of three warpgroups owns block_n = 128 keys of one (KV head,
// batch). Warpgroup 0 produces: its warp 0 copies K and V once (TMA), then
// for each (query head of the group, query block of 64 rows that sees the
// keys) the block's Q and dO tiles (TMA) and its rows' LSE_log2 and D
// (BackwardPre's row_stats, loaded by the warp's lanes) into a ring of two
// stages; its warp 1 adds each block's dQ to the fp32 accumulators with
// cp.reduce.async.bulk, a row at a time. Warpgroups 1 and 2 consume: WG w
// owns keys 64 w .. 64 w + 63 (a warp 16 of them: the rows of every wgmma
// accumulator below, M = 64) and holds their dK and dV in registers. Per
// query block:
//   S^T  = K_w Q^T     wgmma SS, N = 64 queries, K-major A and B
//   dP^T = V_w dO^T    wgmma SS
//   P^T  = 2^(S^T c - LSE_log2)  (backward_probabilities: softcap, ALiBi, masks)
//   dV  += P^T dO      wgmma RS (P^T packed from the accumulator), dO N-major
//   dS^T = P^T o (dP^T - D)      (backward_grad_s)
//   dS^T -> shared memory as dS [64 queries][128 keys] (stmatrix .trans)
//   dK  += dS^T Q      wgmma RS, Q N-major
//   dQ_w = dS K[:, columns of w]  wgmma SS over all 128 keys (both WGs' dS:
//                      named barrier), K N-major; to shared memory (f32,
//                      padded rows), then warp 1's bulk reduce-add.
// dK (times softmax_scale) and dV are written once at the end; dQ is scaled
// and rounded by BackwardPost. Deterministic mode: warp 1 orders its adds
// per query block by the dq_sem semaphores (backward_scores.h). Layout and
// synchronisation: docs/kernels.md, "Backward on sm_90a".
#include <algorithm>
#include <cstddef>
#include <cstdio>

#include "kernels/backward_scores.h"
#include "kernels/codegen.h"
#include "kernels/tile/ring.h"
#include "kernels/tile/row_mask.h"
#include "kernels/tile/swizzle.h"
#include "kernels/tile/tile.h"

namespace fa {
namespace kgen {
namespace {

using tile::AccTile;
using tile::Frag4;
using tile::Swizzle128;

constexpr int kAtomBytes = Swizzle128::kRowBytes;  // a swizzled row: 64 16-bit values
constexpr int kAtomCols = 64;
constexpr int kStages = 2;         // the Q / dO / statistics ring
constexpr int kBlockM = 64;        // query rows a block
constexpr int kBlockN = 128;       // keys a CTA: 64 a consumer warpgroup
constexpr int kProducerRegs = 24;  // setmaxnreg (FlashAttention-3's 24 / 240)
// spec.gather: the copying warp computes row addresses (128 x 32 + 256 x
// 232 <= 384 x 168, what the CTA starts with).
constexpr int kGatherProducerRegs = 40, kGatherConsumerRegs = 224;
constexpr int kConsumerRegs = 240;
// Named barriers: 1 both consumer warpgroups' dS stored; 2 dQ staged (the
// consumers arrive, warp 1 waits); 3 dQ's staging read (warp 1 arrives,
// the consumers wait).
constexpr int kDsBar = 1, kDqFullBar = 2, kDqEmptyBar = 3;
constexpr int kConsumers = 256, kDqParties = 256 + 32;
// dQ's staging rows: head_dim f32 and 32 bytes (rows 8 words apart in the
// banks: the consumers' v2 stores are conflict-free).
constexpr int kDqPad = 32;

// Dynamic shared memory, each tile 1024-byte aligned (the swizzle's
// period): K and V as atoms of [128 keys][128 B]; per stage Q and dO as
// atoms of [64 rows][128 B]; dS as two atoms of [64 queries][128 B] (keys
// 64 a atom: atom w is warpgroup w's); dQ [64][head_dim f32 + pad]; per
// stage the rows' LSE_log2 and D (f32 [64] each); the mbarriers kv_full,
// full[2], empty[2].
struct Layout {
  int qa = 0, va = 0;  // 64-column atoms of head_dim and head_dim_v
  uint32_t k = 0, v = 0, q = 0, dout = 0, ds = 0, dq = 0, stats = 0, bars = 0, seq = 0, total = 0;
  uint32_t kv_atom = 0, row_atom = 0;  // bytes: [128][128 B], [64][128 B]
  uint32_t q_stage = 0, dout_stage = 0, dq_row = 0;
  static constexpr uint32_t kStatsStage = 2 * 4 * kBlockM;
  uint32_t kv_full() const { return bars; }
  // tile::Ring's barriers: stage s at bars + 8 + 8 s (full), + 16 (empty).
  uint32_t ring() const { return bars + 8; }
  static constexpr int kFull = 0, kEmpty = 8 * kStages;
};

uint32_t align1k(uint32_t x) { return (x + 1023) / 1024 * 1024; }

Layout layout(const KernelSpec &s) {
  Layout l;
  l.qa = (s.head_dim + kAtomCols - 1) / kAtomCols;
  l.va = (s.head_dim_v + kAtomCols - 1) / kAtomCols;
  l.kv_atom = kBlockN * kAtomBytes;
  l.row_atom = kBlockM * kAtomBytes;
  l.q_stage = static_cast<uint32_t>(l.qa) * l.row_atom;
  l.dout_stage = static_cast<uint32_t>(l.va) * l.row_atom;
  l.k = 0;
  l.v = l.k + static_cast<uint32_t>(l.qa) * l.kv_atom;
  l.q = l.v + static_cast<uint32_t>(l.va) * l.kv_atom;
  l.dout = l.q + kStages * l.q_stage;
  l.ds = l.dout + kStages * l.dout_stage;
  l.dq = l.ds + 2 * l.row_atom;
  l.dq_row = 4 * static_cast<uint32_t>(s.head_dim) + kDqPad;
  l.stats = align1k(l.dq + kBlockM * l.dq_row);
  l.bars = l.stats + kStages * Layout::kStatsStage;
  l.seq = l.bars + 48;  // after the 5 mbarriers, 16-byte aligned: varlen sq, sk, q0, k0 (s32)
  l.total = l.seq + 16;
  return l;
}

class BackwardWgmmaGen {
 public:
  explicit BackwardWgmmaGen(const KernelSpec &spec)
      : spec_(spec),
        lay_(layout(spec)),
        b_(entry_name(spec), sizeof(BackwardWgmmaParams)),
        e_(b_),
        half_(spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16) {
    kD_ = (spec.head_dim + 15) / 16;
    kV_ = (spec.head_dim_v + 15) / 16;
    // dQ's columns: WG w takes [w dqn_, (w + 1) dqn_): the halves of one
    // atom up to head dim 64, else an atom each (an N-major operand's
    // descriptor starts on a 64-column boundary or inside one atom; past 64
    // WG 1's columns past head_dim are K's zero padding, not stored). One
    // shape for both: the wgmma code is not branched.
    dqn_ = spec.head_dim <= kAtomCols ? spec.head_dim / 2 : kAtomCols;
  }

  std::string run() {
    b_.comment(spec_.describe());
    // For the model (../shared/perf/sass-report): block_n is the tile each
    // iteration streams in, here a query block; block_m the CTA's keys.
    char perf[200];
    std::snprintf(perf, sizeof perf,
                  "perf: smem=%u threads=384 compute_warps=8 block_m=%d block_n=%d "
                  "rows_per_warp=16",
                  lay_.total, kBlockN, kBlockM);
    b_.comment(perf);
    b_.set_param_align(64);
    const WarpgroupFrame f = warpgroup_frame(e_);
    tid_ = f.tid;
    warp_ = f.warp;
    smem_ = f.smem;
    sequence();
    prologue();
    return warpgroup_roles(
        e_, spec_, warp_, [this] { producer(); }, [this] { consumers(); });
  }

 private:
  using F = ForwardParams;
  using P = BackwardParams;

  // ---- values read where used ----
  Reg hq() { return e_.param(Type::S32, offsetof(F, num_heads_q)); }
  // The launch's seqlen_q (varlen: the longest; the workspace's rows are
  // padded to it) and this sequence's lengths (varlen: sequence() sets them
  // in each role).
  Reg sq_max() { return e_.param(Type::S32, offsetof(F, seqlen_q)); }
  Reg sq() { return spec_.varlen ? seq(0) : sq_max(); }
  Reg sk() { return spec_.varlen ? seq(1) : e_.param(Type::S32, offsetof(F, seqlen_k)); }
  // Varlen: this sequence's sq, sk, first query row, first key row, read
  // from shared memory where used (sequence() put them there; held in
  // registers they spilled in the copying warp and the consumers).
  Reg seq(int i) {
    Reg r = b_.b32();
    b_.ld(Space::Shared, Type::S32, r, at(smem_, static_cast<int>(lay_.seq + 4 * i)));
    return r;
  }
  Reg wl() { return e_.param(Type::S32, offsetof(F, window_left)); }
  Reg wr() { return e_.param(Type::S32, offsetof(F, window_right)); }
  Reg score_scale() { return e_.param(Type::F32, offsetof(F, score_scale)); }
  Reg bz() { return e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidZ)); }
  Reg kvh() { return e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidY)); }
  Reg n0() {
    return e_.op(Op::MulLo, Type::S32, e_.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX)),
                 imm(kBlockN));
  }
  BackwardDims dims() {
    return {[this] { return sq(); }, [this] { return sk(); }, [this] { return wl(); },
            [this] { return wr(); }};
  }
  // Row 0 of (b, h) in the workspace's per-row arrays: (b heads_q + h) seqlen_q.
  Reg row0(Reg h) {
    return e_.op(Op::MulLo, Type::S64, e_.wide_mad(bz(), hq(), e_.s64(h)), e_.s64(sq_max()));
  }
  // A tensor map's generic address (in the parameter block).
  Reg tmap(size_t off) {
    Reg pa = b_.b64();
    b_.param_address(pa);
    return e_.op(Op::Add, Type::S64, pa, imm(static_cast<int64_t>(off)));
  }

  // ---- every thread: this sequence (varlen), the barriers ----
  // Varlen: sequence bz's query rows cu_q[bz] .., key rows cu_k[bz] .. of
  // "batch" 0, lengths clamped to the launch's maxima; a CTA whose keys
  // start past its sequence's leaves (every thread, before the barriers).
  void sequence() {
    if (!spec_.varlen) return;
    auto span = [&](size_t param, Reg max_len, Reg *start) {
      Reg a = e_.index(e_.global_param(param), bz(), 4);
      Reg s0 = b_.b32(), s1 = b_.b32();
      b_.ld(Space::Global, Type::S32, s0, at(a), true);
      b_.ld(Space::Global, Type::S32, s1, at(a, 4), true);
      *start = s0;
      return seq_len(e_, s0, s1, max_len);
    };
    Reg q0, k0;
    Reg sq = span(offsetof(F, cu_seqlens_q), sq_max(), &q0);
    Reg sk = span(offsetof(F, cu_seqlens_k), e_.param(Type::S32, offsetof(F, seqlen_k)), &k0);
    b_.when(e_.setp(Cmp::Ge, Type::S32, n0(), sk)).exit();
    ptx::Label stored = b_.label();
    b_.unless(e_.setp(Cmp::Eq, Type::U32, tid_, imm(0))).bra(stored);
    b_.st_v(Space::Shared, Type::B32, at(smem_, static_cast<int>(lay_.seq)), {sq, sk, q0, k0});
    b_.bind(stored);  // read after the prologue's barrier
  }

  void prologue() {
    b_.comment(
        "mbarriers: kv_full (the copy's bytes), full (warp 0's 32 lanes and the bytes), "
        "empty (256 consumers)");
    Reg t0 = e_.setp(Cmp::Eq, Type::U32, tid_, imm(0));
    b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.kv_full())),
                              imm(spec_.gather ? 32 : 1));
    for (int s = 0; s < kStages; ++s) {
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.ring() + Layout::kFull + 8 * s)),
                                imm(32));
      b_.when(t0).mbarrier_init(at(smem_, static_cast<int>(lay_.ring() + Layout::kEmpty + 8 * s)),
                                imm(kConsumers));
    }
    b_.fence_proxy_async();  // the inits, visible to the copy engine
    b_.bar_sync();
  }

  // The CTA's iteration space, the same in every role: the group's query
  // heads h, each over the query blocks m0 that see the keys
  // (backward_query_range). body() runs once per block with it_ (u32, the
  // block's count), h_ and m0_ set.
  void blocks(const std::function<void()> &body) {
    const BackwardQueryRange r0 = backward_query_range(e_, dims(), n0(), kBlockN, kBlockM);
    ptx::Label hloop = b_.label(), done = b_.label();
    b_.when(e_.setp(Cmp::Ge, Type::S32, r0.begin, r0.end)).bra(done);
    it_ = e_.mov(Type::U32, imm(0));
    h_ = e_.op(Op::MulLo, Type::S32, kvh(), imm(spec_.group_size));
    b_.bind(hloop);
    {
      m0_ = e_.mov(Type::S32, backward_query_range(e_, dims(), n0(), kBlockN, kBlockM).begin);
      ptx::Label mloop = b_.label();
      b_.bind(mloop);
      body();
      b_.op(Op::Add, Type::U32, it_, it_, imm(1));
      b_.op(Op::Add, Type::S32, m0_, m0_, imm(kBlockM));
      const BackwardQueryRange r = backward_query_range(e_, dims(), n0(), kBlockN, kBlockM);
      b_.when(e_.setp(Cmp::Lt, Type::S32, m0_, r.end)).bra(mloop);
    }
    b_.op(Op::Add, Type::S32, h_, h_, imm(1));
    Reg h_end = e_.op(Op::MulLo, Type::S32, kvh(), imm(spec_.group_size));
    b_.op(Op::Add, Type::S32, h_end, h_end, imm(spec_.group_size));
    b_.when(e_.setp(Cmp::Lt, Type::S32, h_, h_end)).bra(hloop);
    b_.bind(done);
  }

  tile::Ring ring() {
    return tile::Ring(e_, e_.op(Op::Add, Type::U32, smem_, imm(lay_.ring())), kStages);
  }

  // ---- warpgroup 0 ----
  void producer() {
    b_.setmaxnreg(false, spec_.gather ? kGatherProducerRegs : kProducerRegs);
    ptx::Label out = b_.label(), writer = b_.label();
    b_.when(e_.setp(Cmp::Eq, Type::U32, warp_, imm(1))).bra(writer);
    b_.when(e_.setp(Cmp::Ne, Type::U32, warp_, imm(0))).bra(out);
    loader();
    b_.bra(out);
    b_.bind(writer);
    dq_writer();
    b_.bind(out);
  }

  // Warp 0: K and V once, then each block's Q, dO and statistics (every
  // lane: rows lane and lane + 32) into stage it % 2. TMA: lane 0 issues
  // the copies, its arrival expecting their bytes. spec.gather (varlen, or
  // tensors TMA cannot address): the warp's lanes copy the rows
  // (tile::gather_rows, cp.async; rows past the sequence and columns past
  // the head dim zero-filled), wait for them and fence them for wgmma.
  void loader() {
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    Reg l0 = e_.setp(Cmp::Eq, Type::U32, lane, imm(0));
    if (spec_.gather) {
      b_.comment("K and V of the key block (cp.async; rows past seqlen_k zero)");
      for (int kv = 0; kv < 2; ++kv)
        gather(lane, smem_, kv ? lay_.v : lay_.k, lay_.kv_atom, kBlockN,
               kv ? spec_.head_dim_v : spec_.head_dim, n0(), sk(),
               rows_of(kv ? offsetof(F, v) : offsetof(F, k),
                       kv ? offsetof(F, v_stride) : offsetof(F, k_stride),
                       spec_.varlen ? seq(3) : Reg(), kvh()));
      landed(smem_, static_cast<int>(lay_.kv_full()));
    } else {
      b_.comment("K and V of the key block (TMA; rows past seqlen_k zero-filled)");
      ptx::Label skip = b_.label();
      b_.unless(l0).bra(skip);
      const int64_t bytes = int64_t(lay_.qa + lay_.va) * lay_.kv_atom;
      Reg bar = smem_;
      b_.mbarrier_arrive_expect_tx(at(bar, static_cast<int>(lay_.kv_full())), imm(bytes));
      for (int kv = 0; kv < 2; ++kv) {
        Reg tm = tmap(kv ? offsetof(BackwardWgmmaParams, tmap_v)
                         : offsetof(BackwardWgmmaParams, tmap_k));
        const int atoms = kv ? lay_.va : lay_.qa;
        for (int a = 0; a < atoms; ++a) {
          Reg c[4] = {e_.mov(Type::S32, imm(kAtomCols * a)), n0(), kvh(), bz()};
          const uint32_t dst = (kv ? lay_.v : lay_.k) + static_cast<uint32_t>(a) * lay_.kv_atom;
          b_.cp_async_bulk_tensor(at(smem_, static_cast<int>(dst)), tm, c, 4,
                                  at(bar, static_cast<int>(lay_.kv_full())));
        }
      }
      b_.bind(skip);
    }
    blocks([&] {
      const tile::Ring rg = ring();
      const tile::Ring::Slot sl = rg.slot(it_);
      Reg bars = rg.bars(sl.stage);
      rg.wait(bars, Layout::kEmpty, rg.free_parity(sl.parity));
      if (spec_.gather) {
        b_.comment("Q and dO of the block (cp.async)");
        for (int t = 0; t < 2; ++t) {
          Reg dst =
              e_.op(Op::MadLo, Type::U32, sl.stage, imm(t ? lay_.dout_stage : lay_.q_stage), smem_);
          gather(lane, dst, t ? lay_.dout : lay_.q, lay_.row_atom, kBlockM,
                 t ? spec_.head_dim_v : spec_.head_dim, m0_, sq(),
                 rows_of(t ? offsetof(P, dout) : offsetof(F, q),
                         t ? offsetof(P, dout_stride) : offsetof(F, q_stride),
                         spec_.varlen ? seq(2) : Reg(), h_));
        }
      } else {
        b_.comment("Q and dO of the block (TMA)");
        ptx::Label skip = b_.label();
        b_.unless(l0).bra(skip);
        const int64_t bytes = int64_t(lay_.qa + lay_.va) * lay_.row_atom;
        b_.mbarrier_arrive_expect_tx(at(bars, Layout::kFull), imm(bytes));
        for (int t = 0; t < 2; ++t) {
          Reg tm = tmap(t ? offsetof(BackwardWgmmaParams, tmap_do)
                          : offsetof(BackwardWgmmaParams, tmap_q));
          const int atoms = t ? lay_.va : lay_.qa;
          const uint32_t stage = t ? lay_.dout_stage : lay_.q_stage;
          Reg dst = e_.op(Op::MadLo, Type::U32, sl.stage, imm(stage), smem_);
          for (int a = 0; a < atoms; ++a) {
            Reg c[4] = {e_.mov(Type::S32, imm(kAtomCols * a)), m0_, h_, bz()};
            const uint32_t off =
                (t ? lay_.dout : lay_.q) + static_cast<uint32_t>(a) * lay_.row_atom;
            b_.cp_async_bulk_tensor(at(dst, static_cast<int>(off)), tm, c, 4,
                                    at(bars, Layout::kFull));
          }
        }
        b_.bind(skip);
      }
      b_.comment("the rows' LSE_log2 and D (past seqlen_q: +inf and 0, every p of the row 0)");
      Reg st = e_.op(Op::MadLo, Type::U32, sl.stage, imm(Layout::kStatsStage), smem_);
      Reg r0 = row0(h_);
      for (int half = 0; half < 2; ++half) {
        Reg i = e_.op(Op::Add, Type::S32, m0_, e_.op(Op::Add, Type::U32, lane, imm(32 * half)));
        Reg in = e_.setp(Cmp::Lt, Type::S32, i, sq());
        Reg a = e_.index64(e_.global_param(offsetof(P, row_stats)),
                           e_.op(Op::Add, Type::S64, r0, e_.s64(i)), 4);
        Reg rows = e_.wide_mul(e_.param(Type::S32, offsetof(F, batch)), hq());
        b_.op(Op::MulLo, Type::S64, rows, rows, e_.s64(sq_max()));
        Reg al = e_.index64(a, rows, 4);
        Reg d = e_.mov(Type::F32, fimm(0.0f)), l2 = e_.mov(Type::F32, fimm(__builtin_huge_valf()));
        b_.when(in).ld(Space::Global, Type::F32, d, at(a));
        b_.when(in).ld(Space::Global, Type::F32, l2, at(al));
        Reg sa = e_.op(Op::MadLo, Type::U32, lane, imm(4), st);
        b_.st(Space::Shared, Type::F32, at(sa, static_cast<int>(lay_.stats + 128 * half)), l2);
        b_.st(Space::Shared, Type::F32,
              at(sa, static_cast<int>(lay_.stats + 4 * kBlockM + 128 * half)), d);
      }
      if (spec_.gather) {
        landed(bars, Layout::kFull);
        return;
      }
      // Lane 0's arrival carried the bytes; the others' order their stores.
      ptx::Label arrived = b_.label();
      b_.when(l0).bra(arrived);
      b_.mbarrier_arrive(at(bars, Layout::kFull));
      b_.bind(arrived);
    });
  }

  // spec.gather: the warp's rows first .. first + rows - 1 (below limit) of
  // `cols` 16-bit columns into 128-byte-swizzled atoms at dst + base
  // (atom_bytes apart), every column of the atoms written (zeros past cols).
  void gather(Reg lane, Reg dst, uint32_t base, uint32_t atom_bytes, int rows, int cols, Reg first,
              Reg limit, const std::function<Reg(Reg)> &row_addr) {
    const int chunks = (cols + kAtomCols - 1) / kAtomCols * 8;
    tile::gather_rows(e_, lane, dst, base, atom_bytes, rows, chunks, cols / 8, first, limit,
                      row_addr, 0, half_, 32);
    b_.cp_async_commit();
  }
  // Row j's address (u64) of the tensor at ptr_param (strides at
  // stride_param: batch, seq, head, in elements) for this sequence and head
  // (varlen: row start + j of "batch" 0).
  // Row 0 and the row stride are formed once (a few registers for every
  // pass of the copy).
  std::function<Reg(Reg)> rows_of(size_t ptr_param, size_t stride_param, Reg start, Reg head) {
    Reg row = e_.stride_bytes(stride_param + 8, 2);
    Reg p = e_.global_param(ptr_param);
    p = spec_.varlen ? e_.index(p, start, row)
                     : e_.index(p, bz(), e_.stride_bytes(stride_param, 2));
    p = e_.index(p, head, e_.stride_bytes(stride_param + 16, 2));
    return [=](Reg j) { return e_.index(p, j, row); };
  }
  // spec.gather: the warp's copies landed (cp.async.wait_group 0), fenced
  // for the async proxy (wgmma), then each lane arrives on the full
  // barrier at bars + off (32 arrivals).
  void landed(Reg bars, int off) {
    b_.cp_async_wait(0);
    b_.fence_proxy_async();
    b_.mbarrier_arrive(at(bars, off));
  }

  // Warp 1: each block's dQ, staged by the consumers, added to the fp32
  // accumulators: lane l issues rows l and l + 32 (below seqlen_q) as
  // cp.reduce.async.bulk of head_dim f32, then the staging is free again
  // once read. Deterministic: lane 0 first waits for the key blocks before
  // this one (dq_sem), and releases the next after the adds completed.
  void dq_writer() {
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    Reg det = e_.setp(Cmp::Ne, Type::S32, e_.param(Type::S32, offsetof(P, deterministic)), imm(0));
    b_.comment("dQ writer: the staging starts free");
    b_.bar_arrive(kDqEmptyBar, kDqParties);
    blocks([&] {
      b_.bar_sync(kDqFullBar, kDqParties);
      ptx::Label go = b_.label();
      b_.unless(det).bra(go);
      {
        ptx::Label spin = b_.label(), waited = b_.label();
        b_.unless(e_.setp(Cmp::Eq, Type::U32, lane, imm(0))).bra(waited);
        const DqSemaphore m = semaphore();
        b_.bind(spin);
        Reg v = b_.b32();
        b_.atom_add(true, Type::U32, v, at(m.addr), imm(0));
        b_.when(e_.setp(Cmp::Ne, Type::S32, v, m.before)).bra(spin);
        b_.bind(waited);
        b_.bar_warp_sync(0xffffffffu);
      }
      b_.bind(go);
      Reg r0 = row0(h_);
      for (int half = 0; half < 2; ++half) {
        Reg i = e_.op(Op::Add, Type::U32, lane, imm(32 * half));
        Reg row = e_.op(Op::Add, Type::S32, m0_, i);
        Reg dst = e_.index64(e_.global_param(offsetof(P, dq_accum)),
                             e_.op(Op::Add, Type::S64, r0, e_.s64(row)), 4 * spec_.head_dim);
        Reg src = e_.op(Op::MadLo, Type::U32, i, imm(lay_.dq_row), smem_);
        Reg in = e_.setp(Cmp::Lt, Type::S32, row, sq());
        b_.when(in).cp_reduce_async_bulk_add(Type::F32, at(dst), at(src, static_cast<int>(lay_.dq)),
                                             imm(4 * spec_.head_dim));
      }
      b_.cp_async_bulk_commit();
      b_.cp_async_bulk_wait(0, true);
      b_.bar_arrive(kDqEmptyBar, kDqParties);
      ptx::Label done = b_.label();
      b_.unless(det).bra(done);
      {
        // The adds complete, then lane 0 releases the next key block.
        b_.cp_async_bulk_wait(0, false);
        b_.bar_warp_sync(0xffffffffu);
        ptx::Label skip = b_.label();
        b_.unless(e_.setp(Cmp::Eq, Type::U32, lane, imm(0))).bra(skip);
        const DqSemaphore m = semaphore();
        Reg old = b_.b32();
        b_.atom_add(true, Type::U32, old, at(m.addr), imm(1));
        b_.bind(skip);
      }
      b_.bind(done);
    });
    b_.cp_async_bulk_wait(0, false);
  }

  DqSemaphore semaphore() {
    return dq_semaphore(
        e_, dims(), [this] { return e_.global_param(offsetof(P, dq_sem)); },
        [this] { return sq_max(); }, [this] { return bz(); }, [this] { return hq(); }, h_, m0_,
        e_.mov(Type::U32, imm(0)), n0(), kBlockN);
  }

  // ---- warpgroups 1 and 2 ----
  void consumers() {
    b_.setmaxnreg(true, spec_.gather ? kGatherConsumerRegs : kConsumerRegs);
    Reg lane = e_.op(Op::And, Type::B32, tid_, imm(31));
    ln_ = tile::make_lanes(e_, lane);
    wkeys_ = e_.op(Op::Sub, Type::U32, warp_, imm(4));  // this warp's 16 keys: 16 wkeys_ ..
    wg_ = e_.op(Op::Shr, Type::U32, wkeys_, imm(2));    // 0 or 1
    // Every matrix descriptor is base_ (the shared window's start >> 4)
    // plus an immediate (the tile's offset and the layout bits) plus, where
    // it varies, a register offset (stage, warpgroup): nothing but base_ is
    // held across the loop.
    base_ = b_.b64();
    b_.cvt(Type::U64, Type::U32, ptx::Round::None, base_, e_.op(Op::Shr, Type::U32, smem_, imm(4)));
    dk_ = tile::acc_tile(b_, kD_ * 2);
    dv_ = tile::acc_tile(b_, kV_ * 2);
    tile::zero(b_, dk_);
    tile::zero(b_, dv_);
    s_ = tile::acc_tile(b_, kBlockM / 8);
    dp_ = tile::acc_tile(b_, kBlockM / 8);
    if (spec_.softcap) {
      // 1 - tanh^2 of each score, in the 16-bit type (BackwardScores::dtanh16).
      for (int i = 0; i < kBlockM / 4; ++i) dtanh16_.push_back(b_.b32());
      cap_ = softcap_consts(e_.param(Type::F32, offsetof(F, softcap_neg2)),
                            e_.param(Type::F32, offsetof(F, softcap_log2)));
    }
    for (int t = 0; t < kBlockM / 16; ++t) {
      pa_p_.push_back(tile::frag4(b_));
      pa_ds_.push_back(tile::frag4(b_));
    }
    b_.comment("K and V");
    tile::Ring(e_, smem_, 1)
        .wait(smem_, static_cast<int>(lay_.kv_full()), e_.mov(Type::U32, imm(0)));
    blocks([&] { consume(); });
    b_.comment("the last dQ staging read (balances the writer's first arrival)");
    b_.bar_sync(kDqEmptyBar, kDqParties);
    epilogue();
  }

  // The descriptor (tile::Swizzle128) of the matrix at byte off (+ reg, a
  // u32 register or invalid) of the shared window: K-major (lbo 16) or
  // N-major (lbo the next 64-column atom). A new b64.
  Reg desc(uint32_t lbo, int64_t off, Reg reg = Reg()) {
    const uint64_t bits = Swizzle128::desc_bits(lbo) + static_cast<uint64_t>(off >> 4);
    Reg d = e_.op(Op::Add, Type::S64, base_, imm(static_cast<int64_t>(bits)));
    if (reg.valid()) {
      Reg w = b_.b64();
      b_.cvt(Type::U64, Type::U32, ptx::Round::None, w, e_.op(Op::Shr, Type::U32, reg, imm(4)));
      b_.op(Op::Add, Type::S64, d, d, w);
    }
    return d;
  }
  // This warpgroup's offset of rows 64 wg in a [128][128 B] atom (K, V as A).
  Reg wg_rows() { return e_.op(Op::MulLo, Type::U32, wg_, imm(kAtomCols * kAtomBytes)); }
  static std::vector<Reg> flat(const AccTile &t, int from = 0, int n = -1) {
    std::vector<Reg> r;
    if (n < 0) n = t.n();
    for (int j = from; j < from + n; ++j)
      for (Reg x : t.f[j]) r.push_back(x);
    return r;
  }

  // One query block: stage it_ % 2.
  void consume() {
    const tile::Ring rg = ring();
    const tile::Ring::Slot sl = rg.slot(it_);
    Reg bars = rg.bars(sl.stage);
    Reg qoff = e_.op(Op::MulLo, Type::U32, sl.stage, imm(lay_.q_stage));
    Reg dooff = e_.op(Op::MulLo, Type::U32, sl.stage, imm(lay_.dout_stage));
    rg.wait(bars, Layout::kFull, sl.parity);
    std::vector<Reg> sf = flat(s_), dpf = flat(dp_);
    b_.comment("S^T = K_w Q^T, dP^T = V_w dO^T");
    b_.wgmma_fence();
    issue_rows_t(sf, kD_, lay_.k, lay_.q, qoff);
    issue_rows_t(dpf, kV_, lay_.v, lay_.dout, dooff);
    b_.wgmma_wait(1);
    Reg st = e_.op(Op::MadLo, Type::U32, sl.stage, imm(Layout::kStatsStage), smem_);
    b_.comment("P^T: softcap, ALiBi, masks, 2^(s c - LSE_log2)");
    const BackwardScores x = score_args(st);
    backward_probabilities(e_, dims(), x);
    for (int t = 0; t < kBlockM / 16; ++t) tile::pack_a(b_, half_, s_, 2 * t, pa_p_[t]);
    b_.comment("dV += P^T dO");
    std::vector<Reg> dvf = flat(dv_);
    b_.wgmma_fence();
    for (int t = 0; t < kBlockM / 16; ++t)
      b_.wgmma_rs(half_, 8 * dv_.n(), dvf.data(), pa_p_[t].data(),
                  desc(lay_.row_atom, lay_.dout + int64_t(t) * 16 * kAtomBytes, dooff), imm(1),
                  true);
    b_.wgmma_commit();
    b_.wgmma_wait(1);
    b_.comment("dS^T = P^T o (dP^T - D)");
    backward_grad_s(e_, x, dp_, spec_.softcap);
    for (int t = 0; t < kBlockM / 16; ++t) tile::pack_a(b_, half_, s_, 2 * t, pa_ds_[t]);
    store_ds();
    b_.comment("dK += dS^T Q");
    std::vector<Reg> dkf = flat(dk_);
    b_.wgmma_fence();
    for (int t = 0; t < kBlockM / 16; ++t)
      b_.wgmma_rs(half_, 8 * dk_.n(), dkf.data(), pa_ds_[t].data(),
                  desc(lay_.row_atom, lay_.q + int64_t(t) * 16 * kAtomBytes, qoff), imm(1), true);
    b_.wgmma_commit();
    b_.fence_proxy_async();  // dS's stores, visible to wgmma
    b_.bar_sync(kDsBar, kConsumers);
    grad_q(bars);
  }

  // acc = X_w Y^T (one commit group) over k16 slices of the K-major tiles:
  // X (K or V) at x, this warpgroup's 64 rows, Y (Q or dO) at y + yoff
  // (the stage).
  void issue_rows_t(const std::vector<Reg> &acc, int slices, uint32_t x, uint32_t y, Reg yoff) {
    for (int kk = 0; kk < slices; ++kk) {
      const int64_t a = int64_t(kk / 4) * lay_.kv_atom + (kk % 4) * 32;
      const int64_t bq = int64_t(kk / 4) * lay_.row_atom + (kk % 4) * 32;
      b_.wgmma_ss(half_, kBlockM, acc.data(), desc(16, x + a, wg_rows()), desc(16, y + bq, yoff),
                  imm(kk == 0 ? 0 : 1), false);
    }
    b_.wgmma_commit();
  }

  // The warp's scores and the block's statistics (stage base st).
  BackwardScores score_args(Reg st) {
    BackwardScores x = backward_scores(
        e_, spec_, [this] { return score_scale(); }, [this] { return bz(); }, h_, wkeys_, n0(), m0_,
        &ln_, st, static_cast<int>(lay_.stats), static_cast<int>(lay_.stats) + 4 * kBlockM);
    x.s = &s_;
    x.dtanh16 = &dtanh16_;
    x.dtype = spec_.dtype;
    if (spec_.softcap) x.cap = cap_;
    // formed per block (held across the loop, a register short at 128)
    if (spec_.softcap) x.inv_cap = e_.op(Op::RcpRn, Type::F32, cap_.cap_log2);
    return x;
  }

  // dS^T (packed, pa_ds_) into dS [64 queries][128 keys], the warpgroup's
  // atom: stmatrix .x4 .trans per 16 queries t: matrix m of lane group m
  // (keys 16 (warp % 4) + 8 (m % 2), queries 16 t + 8 (m / 2)) stored
  // transposed, lane l addressing query row 16 t + 8 h2 + l8, key chunk
  // 2 (warp % 4) + h1.
  void store_ds() {
    Reg wl4 = e_.op(Op::And, Type::B32, wkeys_, imm(3));
    Reg chunk = e_.op(Op::MadLo, Type::U32, wl4, imm(2), ln_.h1);
    Reg row = e_.op(Op::MadLo, Type::U32, ln_.h2, imm(8), ln_.l8);
    Reg a = e_.op(Op::MadLo, Type::U32, wg_, imm(lay_.row_atom), smem_);
    b_.op(Op::MadLo, Type::U32, a, row, imm(kAtomBytes), a);
    Reg slot = e_.op(Op::Shl, Type::B32, e_.op(Op::Xor, Type::B32, chunk, ln_.l8), imm(4));
    b_.op(Op::Add, Type::U32, a, a, slot);
    for (int t = 0; t < kBlockM / 16; ++t)
      b_.stmatrix(true, pa_ds_[t].data(), 4,
                  at(a, static_cast<int>(lay_.ds + static_cast<uint32_t>(t) * 16 * kAtomBytes)));
  }

  // dQ_w = dS K[:, columns of w] over the 128 keys, then staged for warp 1.
  void grad_q(Reg bars) {
    b_.comment("dQ_w = dS K");
    AccTile dq = tile::acc_tile(b_, dqn_ / 8);
    issue_dq(dq, dqn_);
    b_.wgmma_wait(0);
    // Q, dO, the statistics and (both WGs past kDsBar's next use) dS read.
    b_.mbarrier_arrive(at(bars, Layout::kEmpty));
    b_.comment("dQ into the staging (once warp 1 has read the last)");
    b_.bar_sync(kDqEmptyBar, kDqParties);
    // Row 16 (warp % 4) + g (+ 8), column w dqn_ + 8j + 2q: v2 stores.
    Reg wl4 = e_.op(Op::And, Type::B32, wkeys_, imm(3));
    Reg row = e_.op(Op::MadLo, Type::U32, wl4, imm(16), ln_.g);
    Reg a = e_.op(Op::MadLo, Type::U32, row, imm(lay_.dq_row), smem_);
    b_.op(Op::MadLo, Type::U32, a, ln_.q, imm(8), a);
    b_.op(Op::MadLo, Type::U32, a, wg_, imm(4 * dqn_), a);
    // Past head dim 64 and not a multiple of 64: WG 1's columns from
    // head_dim on are padding (8j < head_dim - 64 to store).
    const bool ragged = spec_.head_dim > kAtomCols && spec_.head_dim % kAtomCols != 0;
    Reg wg0 = ragged ? e_.setp(Cmp::Eq, Type::U32, wg_, imm(0)) : Reg();
    for (int j = 0; j < dqn_ / 8; ++j) {
      Reg ok;
      if (ragged && kAtomCols + 8 * j >= spec_.head_dim) ok = wg0;
      for (int h = 0; h < 2; ++h) {
        const ptx::Addr dst = at(a, static_cast<int>(lay_.dq + 8 * lay_.dq_row * h + 32 * j));
        if (ok.valid()) b_.when(ok);
        b_.st_v(Space::Shared, Type::F32, dst, {dq.f[j][2 * h], dq.f[j][2 * h + 1]});
      }
    }
    b_.fence_proxy_async();  // the staging's stores, visible to the bulk copies
    b_.bar_arrive(kDqFullBar, kDqParties);
  }

  // WG w's dQ columns of K (N-major B): w dqn_ columns, 2 dqn_ bytes into
  // atom 0 up to head dim 64, else atom w.
  Reg dq_cols() {
    const uint32_t off1 =
        spec_.head_dim <= kAtomCols ? 2 * static_cast<uint32_t>(dqn_) : lay_.kv_atom;
    return e_.op(Op::MulLo, Type::U32, wg_, imm(off1));
  }

  void issue_dq(const AccTile &dq, int n) {
    std::vector<Reg> f = flat(dq, 0, n / 8);
    b_.wgmma_fence();
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const int64_t a = int64_t(kk / 4) * lay_.row_atom + (kk % 4) * 32;
      b_.wgmma_ss(half_, n, f.data(), desc(16, lay_.ds + a),
                  desc(lay_.kv_atom, lay_.k + int64_t(kk) * 16 * kAtomBytes, dq_cols()),
                  imm(kk == 0 ? 0 : 1), true);
    }
    b_.wgmma_commit();
  }

  // dK (times softmax_scale) and dV of this warp's keys, rounded.
  void epilogue() {
    b_.comment("dK * softmax_scale, dV: this warp's keys");
    Reg scale = e_.param(Type::F32, offsetof(P, softmax_scale));
    Reg key0 = e_.op(Op::MadLo, Type::S32, wkeys_, imm(16), n0());
    b_.op(Op::Add, Type::S32, key0, key0, ln_.g);
    Reg col = e_.op(Op::Shl, Type::B32, ln_.q, imm(2));  // bytes of column 2q
    Reg w = b_.b32();
    auto store = [&](const AccTile &acc, size_t ptr, size_t strides, int cols, bool scaled) {
      Reg row_bytes = e_.stride_bytes(strides + 8, 2);
      Reg base = e_.global_param(ptr);
      base = spec_.varlen ? e_.index(base, seq(3), row_bytes)
                          : e_.index(base, bz(), e_.stride_bytes(strides, 2));
      base = e_.index(base, kvh(), e_.stride_bytes(strides + 16, 2));
      backward_store_keys(
          e_, half_, acc, base, row_bytes, key0, col, [this] { return sk(); }, cols,
          scaled ? scale : Reg(), w);
    };
    store(dk_, offsetof(P, dk), offsetof(P, dk_stride), spec_.head_dim, true);
    store(dv_, offsetof(P, dv), offsetof(P, dv_stride), spec_.head_dim_v, false);
  }

  const KernelSpec &spec_;
  const Layout lay_;
  ptx::Builder b_;
  Emitter e_;
  Type half_;
  int kD_ = 0, kV_ = 0;
  int dqn_ = 0;
  Reg tid_, warp_, smem_;
  Reg it_, h_, m0_;
  tile::Lanes ln_;
  Reg wkeys_, wg_;
  Reg base_;
  AccTile dk_, dv_, s_, dp_;
  std::vector<Reg> dtanh16_;
  std::vector<Frag4> pa_p_, pa_ds_;
  Softcap cap_;
};

}  // namespace

std::string generate_backward_wgmma(const KernelSpec &spec) { return BackwardWgmmaGen(spec).run(); }

uint32_t backward_wgmma_smem(const KernelSpec &spec) { return layout(spec).total; }

}  // namespace kgen
}  // namespace fa
