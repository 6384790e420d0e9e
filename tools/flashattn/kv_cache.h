// The KV cache layouts of `run` and `decode` (flashattn.h, fa_kv_layout):
// the .npy cache [batch, seqlen_k_max, heads_kv, dim] is uploaded as it is
// (contiguous), re-laid into pages of page_size tokens with a shuffled
// block table (paged), or copied into one allocation per sequence (ptrs).
// Memory that holds no valid key is NaN, so a kernel that reads and uses it
// shows up as a non-finite output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flashattn.h"
#include "util.h"

namespace fa::cli {

enum class KvKind { Contiguous, Paged, Ptrs };

// --kv-layout ("" = contiguous, or paged when page_size > 0) and
// --page-size; a usage error when they disagree.
KvKind parse_kv_layout(const std::string &layout, int page_size);
const char *kv_kind_name(KvKind k);

// Which pool page holds which page of which sequence: sequence b's page i
// (keys i*page_size .. (i+1)*page_size-1) is pool page table[b * max_pages + i].
// Every sequence gets max_pages = ceil(seqlen_k_max / page_size) pages (a
// cache sized for the longest sequence) and the pool has `kSparePages` more
// that no sequence uses; the pool order is a seeded shuffle. page_size is
// bounded by the data: at most max_page_size(seqlen_k_max) (a usage error
// naming --page-size past it), so the pool stays within a few times the
// cache however large the option.
struct PagePlan {
  int page_size = 0;
  int max_pages = 0;           // pages per sequence (block_table columns)
  int num_pages = 0;           // pool size
  int key_pages = 0;           // pages holding at least one valid key
  std::vector<int32_t> table;  // [batch, max_pages]
};
constexpr int kSparePages = 2;

// The power of two at or above seqlen_k_max (at least 1): one page of it holds
// the longest sequence, so a larger page only adds NaN rows.
int max_page_size(int seqlen_k_max);
PagePlan plan_pages(int batch, int seqlen_k_max, const std::vector<int32_t> &lens, int page_size,
                    uint32_t seed);

// The pool [num_pages, page_size, heads, dim] of the cache `bits` [batch,
// seqlen_k_max, heads, dim]: row j < lens[b] of sequence b at its page and
// slot; every other row is NaN (0xFFFF, NaN in fp16 and bf16).
std::vector<uint16_t> to_pages(const std::vector<uint16_t> &bits, int batch, int seqlen_k_max,
                               int heads, int dim, const std::vector<int32_t> &lens,
                               const PagePlan &plan);

constexpr uint16_t kNanBits = 0xFFFF;

// K and V on the device in one layout, with the fa_tensor views and the
// fa_kv_cache_layout the C API takes.
class DeviceKv {
 public:
  // k, v: the rounded caches [batch, seqlen_k_max, heads_kv, head_dim(_v)];
  // lens: valid keys per sequence (page_size and seed only for Paged);
  // append_rows: rows the launch appends after each sequence's valid keys
  // (fa_decode_args.seqlen_new), which a Ptrs allocation must also hold
  // (lens[b] + append_rows <= seqlen_k_max, checked by the caller).
  DeviceKv(const Runtime &rt, KvKind kind, int batch, int seqlen_k_max, int heads_kv, int head_dim,
           int head_dim_v, const std::vector<uint16_t> &k, const std::vector<uint16_t> &v,
           const std::vector<int32_t> &lens, int page_size, uint32_t seed, int append_rows = 0);
  fa_tensor k() const { return k_; }
  fa_tensor v() const { return v_; }
  const fa_kv_cache_layout &layout() const { return layout_; }
  // One line for the report, e.g. "paged, page_size 16: pool [26, 16, 3, 64]
  // ...".
  const std::string &description() const { return description_; }

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  fa_tensor k_{}, v_{};
  fa_kv_cache_layout layout_{};
  std::string description_;
};

}  // namespace fa::cli
