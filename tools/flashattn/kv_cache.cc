#include "kv_cache.h"

#include <algorithm>
#include <random>

#include "commands.h"

namespace fa::cli {

KvKind parse_kv_layout(const std::string &layout, int page_size) {
  if (page_size < 0) {
    throw Failure(kExitUsage,
                  "--page-size must be >= 1 (0 = not paged), got " + std::to_string(page_size));
  }
  if (layout.empty()) return page_size > 0 ? KvKind::Paged : KvKind::Contiguous;
  if (layout == "paged") {
    if (page_size < 1) {
      throw Failure(kExitUsage, "--kv-layout paged needs --page-size N (tokens per page, N >= 1)");
    }
    return KvKind::Paged;
  }
  if (layout != "contiguous" && layout != "ptrs") {
    throw Failure(kExitUsage, "unknown --kv-layout '" + layout + "' (contiguous, paged or ptrs)");
  }
  if (page_size > 0) {
    throw Failure(kExitUsage, "--page-size " + std::to_string(page_size) +
                                  " is for --kv-layout paged, not " + layout);
  }
  return layout == "ptrs" ? KvKind::Ptrs : KvKind::Contiguous;
}

const char *kv_kind_name(KvKind k) {
  switch (k) {
    case KvKind::Paged:
      return "paged";
    case KvKind::Ptrs:
      return "ptrs";
    default:
      return "contiguous";
  }
}

int max_page_size(int seqlen_k_max) {
  int p = 1;
  while (p < seqlen_k_max) p *= 2;
  return p;
}

PagePlan plan_pages(int batch, int seqlen_k_max, const std::vector<int32_t> &lens, int page_size,
                    uint32_t seed) {
  if (page_size > max_page_size(seqlen_k_max)) {
    throw Failure(kExitUsage, "--page-size " + std::to_string(page_size) +
                                  " is larger than the cache needs: at most " +
                                  std::to_string(max_page_size(seqlen_k_max)) +
                                  " (the power of two at or above seqlen_k_max " +
                                  std::to_string(seqlen_k_max) + ")");
  }
  PagePlan p;
  p.page_size = page_size;
  p.max_pages = (seqlen_k_max + page_size - 1) / page_size;
  const int64_t pool = int64_t(batch) * p.max_pages + kSparePages;
  if (pool > INT32_MAX) {
    throw Failure(kExitUsage, "--page-size " + std::to_string(page_size) + ": " +
                                  std::to_string(pool) + " pages do not fit num_pages (int32)");
  }
  p.num_pages = int(pool);
  // Fisher-Yates with the generator's raw output: the same order on every
  // platform for a seed (std::shuffle's algorithm is the library's choice).
  std::vector<int32_t> perm(size_t(p.num_pages));
  for (int i = 0; i < p.num_pages; ++i) perm[size_t(i)] = i;
  std::mt19937 gen(seed);
  for (int i = p.num_pages - 1; i > 0; --i)
    std::swap(perm[size_t(i)], perm[gen() % uint32_t(i + 1)]);
  p.table.assign(perm.begin(), perm.begin() + int64_t(batch) * p.max_pages);
  for (int b = 0; b < batch; ++b) p.key_pages += (lens[size_t(b)] + page_size - 1) / page_size;
  return p;
}

std::vector<uint16_t> to_pages(const std::vector<uint16_t> &bits, int batch, int seqlen_k_max,
                               int heads, int dim, const std::vector<int32_t> &lens,
                               const PagePlan &plan) {
  const size_t row = size_t(heads) * dim, ps = size_t(plan.page_size);
  std::vector<uint16_t> pool(size_t(plan.num_pages) * ps * row, kNanBits);
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < lens[size_t(b)]; ++j) {
      const size_t page = size_t(plan.table[size_t(b) * plan.max_pages + size_t(j) / ps]);
      std::copy_n(bits.begin() + (size_t(b) * seqlen_k_max + size_t(j)) * row, row,
                  pool.begin() + (page * ps + size_t(j) % ps) * row);
    }
  }
  return pool;
}

namespace {

std::string shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ", " +
         std::to_string(d) + "]";
}

}  // namespace

DeviceKv::DeviceKv(const Runtime &rt, KvKind kind, int batch, int seqlen_k_max, int heads_kv,
                   int head_dim, int head_dim_v, const std::vector<uint16_t> &k,
                   const std::vector<uint16_t> &v, const std::vector<int32_t> &lens, int page_size,
                   uint32_t seed, int append_rows) {
  auto upload_bytes = [&](const void *data, size_t bytes, const char *name) {
    buffers_.push_back(std::make_unique<DeviceBuffer>(rt, bytes, name));
    buffers_.back()->upload(data, bytes);
    return buffers_.back()->ptr();
  };
  auto upload = [&](const std::vector<uint16_t> &bits, const char *name) {
    return upload_bytes(bits.data(), bits.size() * 2, name);
  };
  layout_.layout = kind == KvKind::Paged  ? FA_KV_PAGED
                   : kind == KvKind::Ptrs ? FA_KV_PTR_ARRAY
                                          : FA_KV_CONTIGUOUS;
  if (kind == KvKind::Contiguous) {
    k_ = contiguous(upload(k, "k"), seqlen_k_max, heads_kv, head_dim);
    v_ = contiguous(upload(v, "v"), seqlen_k_max, heads_kv, head_dim_v);
    description_ = "contiguous " + shape4(batch, seqlen_k_max, heads_kv, head_dim);
    return;
  }
  if (kind == KvKind::Paged) {
    const PagePlan plan = plan_pages(batch, seqlen_k_max, lens, page_size, seed);
    k_ = contiguous(
        upload(to_pages(k, batch, seqlen_k_max, heads_kv, head_dim, lens, plan), "k pages"),
        page_size, heads_kv, head_dim);
    v_ = contiguous(
        upload(to_pages(v, batch, seqlen_k_max, heads_kv, head_dim_v, lens, plan), "v pages"),
        page_size, heads_kv, head_dim_v);
    layout_.block_table = upload_bytes(plan.table.data(), plan.table.size() * 4, "block_table");
    layout_.page_size = page_size;
    layout_.num_pages = plan.num_pages;
    layout_.max_pages_per_seq = plan.max_pages;
    layout_.block_table_stride = plan.max_pages;
    description_ = "paged, page_size " + std::to_string(page_size) + ": pool " +
                   shape4(plan.num_pages, page_size, heads_kv, head_dim) + ", " +
                   std::to_string(plan.key_pages) + " pages hold keys, " +
                   std::to_string(plan.num_pages - plan.key_pages) + " NaN; block_table [" +
                   std::to_string(batch) + ", " + std::to_string(plan.max_pages) +
                   "] shuffled (seed " + std::to_string(seed) + ")";
    return;
  }
  // One allocation per sequence and cache, exactly as long as its valid keys
  // plus the rows the launch appends (at least one row; rows past the valid
  // keys are NaN): the emulator's bounds check then catches a read or write
  // past a sequence's end.
  std::vector<uint64_t> kp(static_cast<size_t>(batch)), vp(static_cast<size_t>(batch));
  const size_t krow = size_t(heads_kv) * head_dim, vrow = size_t(heads_kv) * head_dim_v;
  std::string rows;
  for (int b = 0; b < batch; ++b) {
    const size_t n = size_t(lens[size_t(b)]), rows_b = n + size_t(append_rows);
    auto slice = [&](const std::vector<uint16_t> &bits, size_t r) {
      std::vector<uint16_t> s(std::max<size_t>(rows_b, 1) * r, kNanBits);
      std::copy_n(bits.begin() + size_t(b) * seqlen_k_max * r, n * r, s.begin());
      return s;
    };
    kp[size_t(b)] = upload(slice(k, krow), "k sequence");
    vp[size_t(b)] = upload(slice(v, vrow), "v sequence");
    rows += (b ? ", " : "") + std::to_string(rows_b);
  }
  layout_.k_ptrs = upload_bytes(kp.data(), kp.size() * 8, "k_ptrs");
  layout_.v_ptrs = upload_bytes(vp.data(), vp.size() * 8, "v_ptrs");
  k_ = contiguous(0, seqlen_k_max, heads_kv, head_dim);
  v_ = contiguous(0, seqlen_k_max, heads_kv, head_dim_v);
  k_.stride[0] = v_.stride[0] = 0;  // ignored
  description_ =
      "ptrs: one allocation per sequence for K and for V, rows [" + rows + "] (the valid keys" +
      (append_rows ? " and " + std::to_string(append_rows) + " appended)" : ")");
}

}  // namespace fa::cli
