// The tile scheduler of a persistent forward kernel: the work items (m-block,
// query head, batch) of a launch numbered 0 .. total - 1 in the order a
// persistent CTA takes them (CTA c runs items c, c + nctaid, c + 2 nctaid,
// ...), and the decode of an item number into its coordinates, in PTX and on
// the host (the same arithmetic, for tests and the runtime).
//
// The order (FlashAttention-3's longest-processing-time-first scheduler):
//  - (batch, head) pairs are numbered bh = batch * heads + head, so the
//    query heads of one batch are adjacent, and those of one KV head (head /
//    group, group = heads / heads_kv) are adjacent within them;
//  - the pairs are cut into sections of `section` KV heads (section x group
//    consecutive bh; the last section may be shorter), sized so that one
//    section's K and V fit in kL2Bytes of L2: CTAs running at once work on
//    few KV heads and re-read their K/V from L2;
//  - within a section the items go m-block by m-block, every pair of the
//    section at one m-block before the next m-block, longest first: the last
//    m-blocks first when window_right <= window_left (causal: row i sees
//    more keys the larger i is, and with seqlen_q > seqlen_k the first
//    m-blocks see none), else the first ones first (a left window alone:
//    the first rows see the most keys). Sizes and windows are the launch's
//    (ForwardParams: resolved window edges, set_masking_and_scale).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/codegen.h"

namespace fa::kgen::tile {

// The L2 bytes one section's K and V are sized for (FlashAttention-3 uses
// 32 MiB on H100 / H200, whose L2 holds 50 MiB: room for Q, O and the other
// sections' tails).
constexpr int64_t kL2Bytes = int64_t(32) << 20;

// One work item: query rows [block_m m_block, block_m (m_block + 1)) of
// (batch, head).
struct WorkItem {
  int64_t m_block = 0;
  int head = 0, batch = 0;
};

// The host's twin of TileScheduler: the same order from the same inputs.
struct Schedule {
  int64_t m_blocks = 0;  // ceil(seqlen_q / block_m)
  int heads = 0, heads_kv = 0, batch = 0;
  int64_t section = 1;  // KV heads per section, 1 .. heads_kv batch
  bool reverse = false;
  int64_t total() const { return m_blocks * heads * batch; }
  WorkItem decode(int64_t t) const;  // t in [0, total())
};
// kv_row_bytes: the bytes of one key's K and V rows (head_dim + head_dim_v)
// x element size; wl, wr the resolved window edges; heads_kv divides heads.
Schedule make_schedule(int64_t seqlen_q, int64_t seqlen_k, int heads, int heads_kv, int batch,
                       int64_t wl, int64_t wr, int block_m, int kv_row_bytes);

// The same in PTX. Every input is an s32 register of the launch (sizes from
// ForwardParams, wl and wr resolved); block_m and kv_row_bytes are the
// kernel's. The constructor emits the schedule's constants (a few
// divisions): a kernel short of registers makes it per item rather than
// holding them across its loops. Item numbers and the total are u32: the
// runtime launches the persistent kernel only when total() < 2^31.
class TileScheduler {
 public:
  TileScheduler(Emitter &e, Reg seqlen_q, Reg seqlen_k, Reg heads, Reg heads_kv, Reg batch, Reg wl,
                Reg wr, int block_m, int kv_row_bytes);
  Reg total() const { return total_; }  // u32
  struct Item {
    Reg m_block, head, batch;  // u32, new registers
  };
  Item decode(Reg t) const;  // t: u32, < total()

 private:
  Emitter &e_;
  Reg m_blocks_, heads_, pairs_, sec_heads_, reverse_, total_;
};

// ---- Varlen batches scheduled by work ----
// A varlen launch (cu_seqlens_q) numbers only real items: sequence b has
// n_b = ceil(len_b / block_m) m-blocks (len_b = cu_seqlens_q[b + 1] -
// cu_seqlens_q[b] clamped to [0, seqlen_q], as forward_bases does), and the
// m-block prefix P[0] = 0, P[b + 1] = P[b] + n_b gives the total P[batch] x
// heads. The order: sequence by sequence (items [P[b] heads, P[b + 1]
// heads) are sequence b's), and within a sequence the order above with one
// batch (sections of whole KV heads sized for kL2Bytes from the launch's
// seqlen_k, every head of a section at one m-block before the next m-block,
// longest first). A sequence's K and V are what its CTAs share, so running
// one sequence after the other keeps them in L2; heads of one KV head stay
// adjacent.
// The prefix lives in shared memory (cap + 1 u32 entries, built by each CTA
// at its start: build_work_prefix; cap <= kWorkBatchMax, the kernel's: what
// its tile leaves of shared memory); a batch larger than cap falls back to
// the padded order of one sequence after the other with n_b = ceil(seqlen_q
// / block_m) for every b (items past a sequence's rows included: the kernel
// skips them), decided at run time from the batch (no host read of
// cu_seqlens).
constexpr int kWorkBatchMax = 1024;
// The comment line the schedulers put before each u32 product of their
// item numbering (factors and product at most the item count, < 2^31):
// tests/test_index_arith.cc exempts exactly those products.
constexpr const char *kItemsProduct = "u32 product of the item numbering: at most the item count";
constexpr uint32_t kWorkPrefixBytes = 4 * (kWorkBatchMax + 1);  // at most

// The host's twin of WorkScheduler.
struct WorkSchedule {
  std::vector<int64_t> prefix;  // batch + 1 entries; fallback: the padded one
  int heads = 0, heads_kv = 0, batch = 0;
  int64_t section = 1;  // KV heads per section, 1 .. heads_kv
  bool reverse = false;
  bool by_work = true;  // batch <= cap
  int64_t total() const { return prefix.back() * heads; }
  WorkItem decode(int64_t t) const;  // t in [0, total())
};
// seqlens_q: the batch's lengths (clamped here to [0, seqlen_q]); seqlen_q
// and seqlen_k the launch's maxima; the rest as make_schedule's.
WorkSchedule make_work_schedule(const std::vector<int64_t> &seqlens_q, int64_t seqlen_q,
                                int64_t seqlen_k, int heads, int heads_kv, int64_t wl, int64_t wr,
                                int block_m, int kv_row_bytes, int cap = kWorkBatchMax);

// One warp (all 32 lanes, lane = tid % 32) writes P[0 .. batch] as u32 at
// the shared address `prefix` from cu_seqlens_q (global address, s32
// entries): 32 sequences per step, an inclusive shfl.up scan carried from
// step to step, unrolled for up to cap sequences. batch must be <= cap
// (the caller tests it);
// seqlen_q, batch: s32 of the launch. The readers need a barrier after it.
void build_work_prefix(Emitter &e, Reg prefix, Reg cu_seqlens_q, Reg seqlen_q, Reg batch, Reg lane,
                       int block_m, int cap = kWorkBatchMax);

// The same order in PTX (prefix: the shared address build_work_prefix
// wrote, read only when batch <= cap). decode finds an item's
// sequence by a binary search over the prefix, unrolled: log2(cap) + 1
// steps of one shared load each (a linear search would read up to batch
// entries per item; a search loop would nest a loop in the item loop).
class WorkScheduler {
 public:
  WorkScheduler(Emitter &e, Reg prefix, Reg seqlen_q, Reg seqlen_k, Reg heads, Reg heads_kv,
                Reg batch, Reg wl, Reg wr, int block_m, int kv_row_bytes, int cap = kWorkBatchMax);
  Reg total() const { return total_; }      // u32
  TileScheduler::Item decode(Reg t) const;  // t: u32, < total()

 private:
  Reg m_blocks() const;  // ceil(seqlen_q / block_m), emitted where needed
  Emitter &e_;
  Reg prefix_, seqlen_q_, seqlen_k_, heads_, heads_kv_, batch_, wl_, wr_, total_;
  int block_m_, kv_row_bytes_, cap_;
};

// ---- A persistent kernel's item loop: the pieces both forward generators
// share (forward_wgmma.cc, forward_tc.cc) ----
// Work item t (u32) of a persistent kernel: to `past_last` when t >= the
// launch's item count, else its coordinates (new registers). prefix: varlen
// by work, build_work_prefix's shared address for up to cap sequences
// (WorkScheduler's order); invalid: TileScheduler's. The other inputs as
// TileScheduler's.
TileScheduler::Item persistent_item(Emitter &e, Reg t, ptx::Label past_last, Reg prefix,
                                    Reg seqlen_q, Reg seqlen_k, Reg heads, Reg heads_kv, Reg batch,
                                    Reg wl, Reg wr, int block_m, int kv_row_bytes,
                                    int cap = kWorkBatchMax);

// A dynamic persistent kernel (items handed out by an atomic ticket counter
// at `workspace`, a global address of {u32 next, u32 exited}), one thread
// of a CTA past its last item: the CTA is out (atom.add on `exited`,
// acq_rel); the last one out (exited was nctaid.x - 1: every other CTA took
// its last ticket before its own add) sets both counters back to zero for
// the next launch (CUDA-graph replay needs no host reset).
void retire_dynamic(Emitter &e, Reg workspace);

}  // namespace fa::kgen::tile
