// The C entry points: argument validation, error capture, and the guarantee
// that no C++ exception crosses the ABI. Everything below works on validated
// arguments.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>

#include "api/api_internal.h"
#include "cache/remote_store.h"
#include "common/error.h"
#include "flashattn.h"
#include "kernels/kernels.h"
#include "runtime/runtime.h"

struct fa_runtime {
  std::unique_ptr<fa::Runtime> impl;
};

struct fa_config {
  fa::AttentionConfig cfg;
};

namespace {

using fa::fail;
using namespace fa::api;

fa_status check_runtime(const fa_runtime *rt) {
  FA_REQUIRE(rt != nullptr && rt->impl, "rt is NULL");
  return FA_SUCCESS;
}

fa_status check_config(const fa_config *cfg) {
  FA_REQUIRE(cfg != nullptr, "cfg is NULL");
  return FA_SUCCESS;
}

// Validates a 4-D tensor view used by a kernel: non-null, 16-byte aligned,
// last dim contiguous, other strides non-negative multiples of 8 elements.
fa_status check_tensor(const char *name, const fa_tensor &t) {
  FA_REQUIRE(t.data != 0, "%s.data is 0", name);
  FA_REQUIRE(t.data % 16 == 0, "%s.data 0x%llx is not 16-byte aligned", name,
             static_cast<unsigned long long>(t.data));
  FA_REQUIRE(t.stride[3] == 1, "%s.stride[3] must be 1, got %lld", name,
             static_cast<long long>(t.stride[3]));
  for (int i = 0; i < 3; ++i) {
    FA_REQUIRE(t.stride[i] >= 0 && t.stride[i] % 8 == 0,
               "%s.stride[%d] must be a non-negative multiple of 8 elements, got %lld", name, i,
               static_cast<long long>(t.stride[i]));
  }
  return FA_SUCCESS;
}

// A tensor whose data pointer is not used (a pointer-array KV cache's k/v:
// only their strides are): the stride rules of check_tensor.
fa_status check_strides(const char *name, const fa_tensor &t) {
  FA_REQUIRE(t.data == 0,
             "%s.data must be 0 with kv.layout FA_KV_PTR_ARRAY (k_ptrs/v_ptrs are used)", name);
  fa_tensor u = t;
  u.data = 16;
  return check_tensor(name, u);
}

// struct_size of an args struct that gained fields: the current size, or
// `old_size` (a caller built against the previous minor version, whose
// struct ends there). *out is a copy with the missing fields zero.
template <typename T>
fa_status widen_args(const T *in, std::initializer_list<size_t> old_sizes, T *out) {
  bool known = in->struct_size == sizeof(T);
  for (size_t old : old_sizes) known = known || in->struct_size == old;
  if (!known) return check_struct_size("args", in->struct_size, sizeof(T));
  std::memset(out, 0, sizeof(T));
  std::memcpy(out, in, in->struct_size);
  out->struct_size = sizeof(T);
  return FA_SUCCESS;
}

// One dimension of an array a kernel indexes: `extent` positions `stride`
// elements apart. The names are for the message: stride_name "stride[0]"
// (of tensor "k") or "alibi_slopes_stride", extent_name "batch".
struct Dim {
  int64_t stride;
  int64_t extent;
  const char *stride_name;
  const char *extent_name;
};

// The byte span rule, for every array a kernel indexes (one place, issue
// 24). The offset of the array's last byte from its base,
//   sum_i |stride_i| (extent_i - 1) elem_bytes + elem_bytes - 1,
// computed exactly (every product and sum overflow-checked), must be at
// most INT64_MAX: the kernels form offsets from int64 strides in signed
// 64-bit arithmetic, so past it an offset would turn negative, and past
// 2^64 it wraps (an fp32 stride of 2^62 put sequence 1 onto sequence 0).
// And base + that offset must not pass 2^64 - 1. No device maps 2^63 bytes,
// so the rule refuses nothing a kernel could address. `tensor`: the strides
// are fields of `name` ("k.stride[0]") and the base is "k.data"; base 0: the
// kernel takes the base from device data (pointer-array K/V), only the
// offset is checked.
fa_status check_span(const char *name, bool tensor, uint64_t base, uint64_t elem_bytes,
                     std::initializer_list<Dim> dims) {
  constexpr uint64_t kMaxOffset = uint64_t(INT64_MAX);
  const char *dot = tensor ? "." : "";
  const char *owner = tensor ? name : "";
  uint64_t off = elem_bytes - 1;
  for (const Dim &d : dims) {
    if (d.extent <= 1) continue;
    const uint64_t stride = d.stride < 0 ? 0 - uint64_t(d.stride) : uint64_t(d.stride);
    uint64_t term = 0;
    if (__builtin_mul_overflow(stride, uint64_t(d.extent - 1), &term) ||
        __builtin_mul_overflow(term, elem_bytes, &term) || term > kMaxOffset) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "%s%s%s * (%s - 1) overflows a 64-bit byte offset in %s (%lld * %lld elements "
                  "of %llu bytes; an array must end less than 2^63 bytes past its start)",
                  owner, dot, d.stride_name, d.extent_name, name, static_cast<long long>(d.stride),
                  static_cast<long long>(d.extent - 1),
                  static_cast<unsigned long long>(elem_bytes));
    }
    if (__builtin_add_overflow(off, term, &off) || off > kMaxOffset) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "%s: the byte offset of its last element overflows 64 bits (the stride * "
                  "(extent - 1) terms up to %s%s%s * (%s - 1) add up past 2^63 - 1)",
                  name, owner, dot, d.stride_name, d.extent_name);
    }
  }
  uint64_t last = 0;
  if (base != 0 && __builtin_add_overflow(base, off, &last)) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "%s%s 0x%llx plus the %llu bytes up to its last element wraps past 2^64", name,
                tensor ? ".data" : "", static_cast<unsigned long long>(base),
                static_cast<unsigned long long>(off) + 1);
  }
  return FA_SUCCESS;
}

// A 4-D tensor view of extents n (named names) and elements of eb bytes.
fa_status check_tensor_span(const char *name, const fa_tensor &t, uint64_t eb,
                            const int64_t (&n)[4], const char *const (&names)[4]) {
  return check_span(name, true, t.data, eb,
                    {{t.stride[0], n[0], "stride[0]", names[0]},
                     {t.stride[1], n[1], "stride[1]", names[1]},
                     {t.stride[2], n[2], "stride[2]", names[2]},
                     {t.stride[3], n[3], "stride[3]", names[3]}});
}

// A contiguous array of n elements of eb bytes at p (0 = not set).
fa_status check_array_span(const char *name, uint64_t p, uint64_t eb, int64_t n,
                           const char *n_name) {
  return p == 0 ? FA_SUCCESS : check_span(name, false, p, eb, {{1, n, "1", n_name}});
}

// LSE: fp32 [batch, num_heads_q, seqlen_q], contiguous (varlen: [heads,
// total_q], total_q device data: pass batch 1).
fa_status check_lse_span(const char *name, uint64_t p, int64_t batch, int64_t heads,
                         int64_t seqlen_q) {
  if (p == 0) return FA_SUCCESS;
  return check_span(name, false, p, 4,
                    {{heads * seqlen_q, batch, "num_heads_q * seqlen_q", "batch"},
                     {seqlen_q, heads, "seqlen_q", "num_heads_q"},
                     {1, seqlen_q, "1", "seqlen_q"}});
}

// [batch, n] 4-byte elements, rows `stride` apart (stride 0: one row for
// the batch): ALiBi slopes, the block table, rotary positions.
fa_status check_rows_span(const char *name, uint64_t p, const char *stride_name, int64_t stride,
                          int64_t batch, int64_t n, const char *n_name) {
  if (p == 0) return FA_SUCCESS;
  return check_span(name, false, p, 4,
                    {{stride, batch, stride_name, "batch"}, {1, n, "1", n_name}});
}

// An fp8 descale (fp32, element b descale_stride[0] + h_kv descale_stride[1]).
fa_status check_descale_span(const char *name, uint64_t p, const int64_t stride[2], int64_t batch,
                             int64_t heads_kv) {
  if (p == 0) return FA_SUCCESS;
  return check_span(name, false, p, 4,
                    {{stride[0], batch, "descale_stride[0]", "batch"},
                     {stride[1], heads_kv, "descale_stride[1]", "num_heads_kv"}});
}

// The ALiBi slopes and K/V descales of fa_forward_args or fa_decode_args.
template <typename Args>
fa_status check_slope_descale_spans(const fa::AttentionConfig &c, const Args &a, int64_t batch) {
  FA_CHECK(check_rows_span("alibi_slopes", a.alibi_slopes, "alibi_slopes_stride",
                           a.alibi_slopes_stride, batch, c.num_heads_q, "num_heads_q"));
  FA_CHECK(check_descale_span("k_descale", a.k_descale, a.descale_stride, batch, c.num_heads_kv));
  return check_descale_span("v_descale", a.v_descale, a.descale_stride, batch, c.num_heads_kv);
}

// Bytes of a Q, K/V and O element under config c (fp8 Q and K/V: 1).
struct ElemBytes {
  uint64_t q, kv, o;
};
ElemBytes elem_bytes(const fa::AttentionConfig &c) {
  const uint64_t io = c.dtype == fa::Dtype::F32 ? 4 : 2;
  return {c.q_fp8 != fa::KvFp8::None ? 1 : io, c.kv_fp8 != fa::KvFp8::None ? 1 : io, io};
}

// K and V as kv.layout reads them, and the page table or pointer arrays.
// batch_k: the contiguous layout's dim 0 (1 when packed with cu_seqlens_k);
// seqlen_k: the keys a sequence may have.
fa_status check_kv_spans(const fa::AttentionConfig &c, const fa_kv_cache_layout &kv,
                         const char *k_name, const fa_tensor &k, const char *v_name,
                         const fa_tensor &v, int64_t batch, int64_t batch_k,
                         const char *seqlen_name, int64_t seqlen_k) {
  const uint64_t eb = elem_bytes(c).kv;
  int64_t n0 = batch_k, n1 = seqlen_k;
  const char *name0 = "batch", *name1 = seqlen_name;
  if (kv.layout == FA_KV_PAGED) {
    n0 = kv.num_pages, n1 = kv.page_size;
    name0 = "kv.num_pages", name1 = "kv.page_size";
    FA_CHECK(check_rows_span("kv.block_table", kv.block_table, "kv.block_table_stride",
                             kv.block_table_stride, batch, kv.max_pages_per_seq,
                             "kv.max_pages_per_seq"));
  } else if (kv.layout == FA_KV_PTR_ARRAY) {
    n0 = 1;  // stride[0] is ignored; each sequence's base is device data
    FA_CHECK(check_array_span("kv.k_ptrs", kv.k_ptrs, 8, batch, "batch"));
    FA_CHECK(check_array_span("kv.v_ptrs", kv.v_ptrs, 8, batch, "batch"));
  }
  FA_CHECK(check_tensor_span(k_name, k, eb, {n0, n1, c.num_heads_kv, c.head_dim},
                             {name0, name1, "num_heads_kv", "head_dim"}));
  return check_tensor_span(v_name, v, eb, {n0, n1, c.num_heads_kv, c.head_dim_v},
                           {name0, name1, "num_heads_kv", "head_dim_v"});
}

fa_status check_fp32_ptr(const char *name, uint64_t p, bool required) {
  if (p == 0) {
    FA_REQUIRE(!required, "%s is 0", name);
    return FA_SUCCESS;
  }
  FA_REQUIRE(p % 4 == 0, "%s 0x%llx is not 4-byte aligned", name,
             static_cast<unsigned long long>(p));
  return FA_SUCCESS;
}

// ALiBi slopes: fp32, 4-byte aligned, or 0; the stride between sequences
// 0 (one row for the batch) or >= num_heads_q, and 0 without slopes.
fa_status check_alibi(const fa::AttentionConfig &c, uint64_t slopes, int64_t stride) {
  FA_CHECK(check_fp32_ptr("alibi_slopes", slopes, false));
  FA_REQUIRE(stride >= 0, "alibi_slopes_stride must be >= 0 (0 = one row for the batch), got %lld",
             static_cast<long long>(stride));
  FA_REQUIRE(slopes != 0 || stride == 0,
             "alibi_slopes_stride is set (%lld) but alibi_slopes is 0; set it to 0 without ALiBi",
             static_cast<long long>(stride));
  FA_REQUIRE(stride == 0 || stride >= c.num_heads_q,
             "alibi_slopes_stride must be 0 or at least num_heads_q = %d, got %lld", c.num_heads_q,
             static_cast<long long>(stride));
  return FA_SUCCESS;
}

fa_status check_positive(const char *name, int32_t v) {
  FA_REQUIRE(v >= 1, "%s must be >= 1, got %d", name, v);
  return FA_SUCCESS;
}

// A sequence length: 1..FA_MAX_SEQLEN (the kernels' position arithmetic is
// 32-bit and relies on this bound; docs/kernels.md, "Index arithmetic").
fa_status check_seqlen(const char *name, int32_t v) {
  FA_CHECK(check_positive(name, v));
  if (v > FA_MAX_SEQLEN) {
    return fail(FA_ERROR_UNSUPPORTED, "%s is %d, more than FA_MAX_SEQLEN (%d)", name, v,
                FA_MAX_SEQLEN);
  }
  return FA_SUCCESS;
}

// The KV layout fields, and k/v as that layout reads them; seqlen_k: the
// most keys a sequence may have (checked against the pages it can address).
fa_status validate_kv(const fa_kv_cache_layout &kv, const char *k_name, const fa_tensor &k,
                      const char *v_name, const fa_tensor &v, int32_t seqlen_k) {
  switch (kv.layout) {
    case FA_KV_CONTIGUOUS:
    case FA_KV_PAGED:
      FA_CHECK(check_tensor(k_name, k));
      FA_CHECK(check_tensor(v_name, v));
      break;
    case FA_KV_PTR_ARRAY:
      FA_CHECK(check_strides(k_name, k));
      FA_CHECK(check_strides(v_name, v));
      break;
    default:
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "kv.layout %d is not an fa_kv_layout (0 contiguous, 1 paged, 2 pointer array)",
                  kv.layout);
  }
  const bool paged = kv.layout == FA_KV_PAGED, ptrs = kv.layout == FA_KV_PTR_ARRAY;
  if (!paged) {
    FA_REQUIRE(kv.page_size == 0 && kv.num_pages == 0 && kv.max_pages_per_seq == 0 &&
                   kv.block_table == 0 && kv.block_table_stride == 0,
               "kv.page_size, num_pages, max_pages_per_seq, block_table and block_table_stride "
               "are for kv.layout FA_KV_PAGED only; set them to 0");
  }
  if (!ptrs) {
    FA_REQUIRE(kv.k_ptrs == 0 && kv.v_ptrs == 0,
               "kv.k_ptrs and kv.v_ptrs are for kv.layout FA_KV_PTR_ARRAY only; set them to 0");
  }
  if (paged) {
    FA_CHECK(check_positive("kv.page_size", kv.page_size));
    FA_CHECK(check_positive("kv.num_pages", kv.num_pages));
    FA_CHECK(check_positive("kv.max_pages_per_seq", kv.max_pages_per_seq));
    FA_CHECK(check_fp32_ptr("kv.block_table", kv.block_table, true));
    FA_REQUIRE(kv.block_table_stride >= kv.max_pages_per_seq,
               "kv.block_table_stride %lld is less than kv.max_pages_per_seq %d",
               static_cast<long long>(kv.block_table_stride), kv.max_pages_per_seq);
    const int64_t cap = int64_t(kv.max_pages_per_seq) * kv.page_size;
    FA_REQUIRE(cap >= seqlen_k,
               "kv.max_pages_per_seq * kv.page_size = %lld keys, fewer than the %d a sequence may "
               "hold",
               static_cast<long long>(cap), seqlen_k);
  }
  if (ptrs) {
    FA_REQUIRE(kv.k_ptrs != 0 && kv.k_ptrs % 8 == 0, "kv.k_ptrs 0x%llx is 0 or not 8-byte aligned",
               static_cast<unsigned long long>(kv.k_ptrs));
    FA_REQUIRE(kv.v_ptrs != 0 && kv.v_ptrs % 8 == 0, "kv.v_ptrs 0x%llx is 0 or not 8-byte aligned",
               static_cast<unsigned long long>(kv.v_ptrs));
  }
  return FA_SUCCESS;
}

// fa_forward_args.workspace (since 0.8): 0 with workspace_size 0, or an
// 8-byte aligned pointer to at least 8 bytes that end below 2^64.
fa_status check_forward_workspace(const fa_forward_args &a) {
  if (a.workspace == 0) {
    FA_REQUIRE(a.workspace_size == 0, "workspace_size is %zu but workspace is 0", a.workspace_size);
    return FA_SUCCESS;
  }
  FA_REQUIRE(a.workspace % 8 == 0, "workspace 0x%llx is not 8-byte aligned",
             static_cast<unsigned long long>(a.workspace));
  FA_REQUIRE(a.workspace_size >= 8,
             "workspace_size is %zu: the workspace holds two uint32 counters (8 bytes; see "
             "fa_forward_workspace_size)",
             a.workspace_size);
  return check_array_span("workspace", a.workspace, 1, static_cast<int64_t>(a.workspace_size),
                          "workspace_size");
}

fa_status validate_forward(const fa::AttentionConfig &c, const fa_forward_args *a) {
  FA_CHECK(check_positive("batch", a->batch));
  FA_CHECK(check_seqlen("seqlen_q", a->seqlen_q));
  FA_CHECK(check_seqlen("seqlen_k", a->seqlen_k));
  FA_CHECK(check_tensor("q", a->q));
  FA_CHECK(validate_kv(a->kv, "k", a->k, "v", a->v, a->seqlen_k));
  FA_CHECK(check_tensor("o", a->o));
  FA_CHECK(check_fp32_ptr("lse", a->lse, false));
  if (a->cu_seqlens_k != 0) {
    FA_REQUIRE(a->cu_seqlens_q != 0, "cu_seqlens_k is set without cu_seqlens_q");
    FA_REQUIRE(a->kv.layout == FA_KV_CONTIGUOUS,
               "cu_seqlens_k is for a contiguous k/v; a KV cache layout takes seqused_k");
    FA_REQUIRE(a->seqused_k == 0, "seqused_k and cu_seqlens_k cannot both be set");
  } else if (a->kv.layout == FA_KV_CONTIGUOUS && a->seqused_k == 0) {
    FA_REQUIRE(a->cu_seqlens_q == 0,
               "cu_seqlens_q and cu_seqlens_k must be given together (or cu_seqlens_q with "
               "seqused_k)");
  }
  FA_CHECK(check_fp32_ptr("cu_seqlens_q", a->cu_seqlens_q, false));
  FA_CHECK(check_fp32_ptr("cu_seqlens_k", a->cu_seqlens_k, false));
  FA_CHECK(check_fp32_ptr("seqused_k", a->seqused_k, false));
  FA_CHECK(check_fp32_ptr("sinks", a->sinks, false));
  FA_CHECK(check_alibi(c, a->alibi_slopes, a->alibi_slopes_stride));
  return check_forward_workspace(*a);
}

// The fp8 KV cache's descales (fa_decode_args / fa_forward_args, since 0.5):
// only with an fp8 kv_dtype, 4-byte aligned, non-negative strides; and the
// fp8 K/V strides in whole 16-byte chunks (16 elements).
fa_status validate_descales(const fa::AttentionConfig &c, uint64_t kd, uint64_t vd,
                            const int64_t stride[2], const fa_tensor &k, const fa_tensor &v) {
  if (c.kv_fp8 == fa::KvFp8::None) {
    FA_REQUIRE(kd == 0 && vd == 0 && stride[0] == 0 && stride[1] == 0,
               "k_descale, v_descale and descale_stride are for an fp8 KV cache (the config's "
               "kv_dtype FA_DTYPE_FP8_E4M3 or FA_DTYPE_FP8_E5M2); set them to 0");
    return FA_SUCCESS;
  }
  FA_CHECK(check_fp32_ptr("k_descale", kd, false));
  FA_CHECK(check_fp32_ptr("v_descale", vd, false));
  for (int i = 0; i < 2; ++i) {
    FA_REQUIRE(stride[i] >= 0, "descale_stride[%d] must be >= 0, got %lld", i,
               static_cast<long long>(stride[i]));
  }
  const fa_tensor *t[2] = {&k, &v};
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 3; ++i) {
      FA_REQUIRE(t[j]->stride[i] % 16 == 0,
                 "%s.stride[%d] must be a multiple of 16 elements with an fp8 KV cache (16-byte "
                 "rows of fp8 bytes), got %lld",
                 j ? "v_cache" : "k_cache", i, static_cast<long long>(t[j]->stride[i]));
    }
  }
  return FA_SUCCESS;
}

// The fp8 forward's Q (since 0.6): q_descale only with an fp8 q_dtype,
// 4-byte aligned; q in whole 16-byte chunks (16 elements), as K and V.
fa_status validate_q_fp8(const fa::AttentionConfig &c, const fa_forward_args &a) {
  if (c.q_fp8 == fa::KvFp8::None) {
    FA_REQUIRE(a.q_descale == 0,
               "q_descale is for an fp8 Q (the config's q_dtype FA_DTYPE_FP8_E4M3 or "
               "FA_DTYPE_FP8_E5M2); set it to 0");
    return FA_SUCCESS;
  }
  FA_CHECK(check_fp32_ptr("q_descale", a.q_descale, false));
  for (int i = 0; i < 3; ++i) {
    FA_REQUIRE(a.q.stride[i] % 16 == 0,
               "q.stride[%d] must be a multiple of 16 elements with an fp8 Q (16-byte rows of "
               "fp8 bytes), got %lld",
               i, static_cast<long long>(a.q.stride[i]));
  }
  return FA_SUCCESS;
}

// fa_launch's arrays (validated fields): the byte span rule (check_span).
// With cu_seqlens_q (or _k) the packed q/o (k/v) have no batch dimension
// and LSE is [num_heads_q, total_q]; total_q and each sequence's rows are
// device data, so their dimension is checked over seqlen_q (seqlen_k)
// rows, the most a sequence takes.
fa_status check_forward_spans(const fa::AttentionConfig &c, const fa_forward_args &a) {
  const ElemBytes e = elem_bytes(c);
  const int64_t bq = a.cu_seqlens_q ? 1 : a.batch, bk = a.cu_seqlens_k ? 1 : a.batch;
  FA_CHECK(check_tensor_span("q", a.q, e.q, {bq, a.seqlen_q, c.num_heads_q, c.head_dim},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim"}));
  FA_CHECK(check_kv_spans(c, a.kv, "k", a.k, "v", a.v, a.batch, bk, "seqlen_k", a.seqlen_k));
  FA_CHECK(check_tensor_span("o", a.o, e.o, {bq, a.seqlen_q, c.num_heads_q, c.head_dim_v},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim_v"}));
  FA_CHECK(check_lse_span("lse", a.lse, bq, c.num_heads_q, a.seqlen_q));
  FA_CHECK(check_array_span("cu_seqlens_q", a.cu_seqlens_q, 4, int64_t(a.batch) + 1, "batch + 1"));
  FA_CHECK(check_array_span("cu_seqlens_k", a.cu_seqlens_k, 4, int64_t(a.batch) + 1, "batch + 1"));
  FA_CHECK(check_array_span("seqused_k", a.seqused_k, 4, a.batch, "batch"));
  FA_CHECK(check_array_span("sinks", a.sinks, 4, c.num_heads_q, "num_heads_q"));
  FA_CHECK(check_descale_span("q_descale", a.q_descale, a.descale_stride, a.batch, c.num_heads_kv));
  return check_slope_descale_spans(c, a, a.batch);
}

// The rows of a GQA group (group * seqlen_q), which the decode kernel
// indexes with 32-bit integers (seqlen_k_max is bounded by check_seqlen).
// A rotary table's fa_dtype: 0 or FP32 (f32), or the config's 16-bit dtype.
fa_status check_rotary_dtype(const char *what, const fa::AttentionConfig &c, int32_t d) {
  const int32_t cfg_dtype = c.dtype == fa::Dtype::BF16  ? FA_DTYPE_BF16
                            : c.dtype == fa::Dtype::F32 ? FA_DTYPE_FP32
                                                        : FA_DTYPE_FP16;
  FA_REQUIRE(d == 0 || d == FA_DTYPE_FP32 || d == cfg_dtype,
             "%s must be 0, FA_DTYPE_FP32 or the config's dtype (%d), got %d", what, cfg_dtype, d);
  return FA_SUCCESS;
}

fa_status check_decode_limits(const fa::AttentionConfig &c, const fa_decode_args *a) {
  const int64_t rows = int64_t(c.num_heads_q / c.num_heads_kv) * a->seqlen_q;
  if (rows > FA_MAX_SEQLEN) {
    return fail(FA_ERROR_UNSUPPORTED,
                "decode sizes too large: (num_heads_q / num_heads_kv) * seqlen_q = %lld must be "
                "at most FA_MAX_SEQLEN (%d)",
                static_cast<long long>(rows), FA_MAX_SEQLEN);
  }
  return FA_SUCCESS;
}

// The host arguments fa_decode_workspace_size needs.
fa_status validate_decode_sizes(const fa_decode_args *a) {
  FA_CHECK(check_positive("batch", a->batch));
  FA_CHECK(check_seqlen("seqlen_q", a->seqlen_q));
  FA_CHECK(check_seqlen("seqlen_k_max", a->seqlen_k_max));
  FA_REQUIRE(a->num_splits >= 0, "num_splits must be >= 0 (0 = automatic), got %d", a->num_splits);
  FA_REQUIRE(a->batch_invariant == 0 || a->batch_invariant == 1,
             "batch_invariant must be 0 or 1, got %d", a->batch_invariant);
  FA_REQUIRE(!a->batch_invariant || a->num_splits == 0,
             "batch_invariant splits by a fixed number of keys: num_splits must be 0, got %d",
             a->num_splits);
  return FA_SUCCESS;
}

fa_status validate_decode(const fa_decode_args *a) {
  FA_CHECK(validate_decode_sizes(a));
  FA_CHECK(check_tensor("q", a->q));
  FA_CHECK(validate_kv(a->kv, "k_cache", a->k_cache, "v_cache", a->v_cache, a->seqlen_k_max));
  FA_CHECK(check_fp32_ptr("cache_seqlens", a->cache_seqlens, true));
  if (a->o.data != 0) {
    FA_CHECK(check_tensor("o", a->o));
  } else {
    FA_REQUIRE(a->lse == 0, "lse is set but o.data is 0 (no combine step to write it)");
  }
  FA_CHECK(check_fp32_ptr("lse", a->lse, false));
  FA_CHECK(check_fp32_ptr("sinks", a->sinks, false));
  FA_REQUIRE(a->sinks == 0 || a->o.data != 0,
             "sinks is set but o.data is 0: the sinks join each row's denominator in the "
             "combine, which writes o (to keep the partial states, pass the sinks to "
             "fa_decode_reduce instead)");
  if (a->tree_mask == 0) {
    FA_REQUIRE(a->tree_mask_stride[0] == 0 && a->tree_mask_stride[1] == 0,
               "tree_mask_stride is set (%lld, %lld) but tree_mask is 0; set both strides to 0 "
               "without a tree mask",
               static_cast<long long>(a->tree_mask_stride[0]),
               static_cast<long long>(a->tree_mask_stride[1]));
  } else {
    // Rows of whole 32-bit words (the kernels read words): 4-byte aligned.
    const int64_t row_bytes = (int64_t(a->seqlen_q) + 31) / 32 * 4;
    FA_REQUIRE(a->tree_mask % 4 == 0, "tree_mask 0x%llx is not 4-byte aligned",
               static_cast<unsigned long long>(a->tree_mask));
    FA_REQUIRE(a->tree_mask_stride[1] >= row_bytes && a->tree_mask_stride[1] % 4 == 0,
               "tree_mask_stride[1] must be a multiple of 4 bytes and at least 4 * "
               "ceil(seqlen_q / 32) = %lld (rows of whole 32-bit words), got %lld",
               static_cast<long long>(row_bytes), static_cast<long long>(a->tree_mask_stride[1]));
    FA_REQUIRE(a->tree_mask_stride[0] >= 0 && a->tree_mask_stride[0] % 4 == 0,
               "tree_mask_stride[0] must be a non-negative multiple of 4 bytes (0 = one mask for "
               "the batch), got %lld",
               static_cast<long long>(a->tree_mask_stride[0]));
  }
  return FA_SUCCESS;
}

// KV append and RoPE (fa_decode_args since 0.5).
fa_status validate_append(const fa::AttentionConfig &c, const fa_decode_args *a) {
  const bool rotary_set = a->rotary_dim != 0 || a->rotary_cos != 0 || a->rotary_sin != 0 ||
                          a->seqlen_ro != 0 || a->rotary_interleaved != 0 || a->rotary_dtype != 0 ||
                          a->rotary_positions != 0 || a->rotary_positions_stride != 0;
  FA_REQUIRE(a->rotary_reserved == 0, "rotary_reserved must be 0, got %d", a->rotary_reserved);
  if (a->k_new.data == 0) {
    FA_REQUIRE(a->v_new.data == 0 && a->seqlen_new == 0 && !rotary_set,
               "v_new, seqlen_new or a rotary field is set but k_new.data is 0 (no append; "
               "rotary embedding needs the append, as flash_attn_with_kvcache)");
    return FA_SUCCESS;
  }
  FA_CHECK(check_tensor("k_new", a->k_new));
  FA_CHECK(check_tensor("v_new", a->v_new));
  FA_REQUIRE(a->seqlen_new >= 1 && a->seqlen_new <= a->seqlen_k_max,
             "seqlen_new must be in 1..seqlen_k_max (%d), got %d", a->seqlen_k_max, a->seqlen_new);
  if (a->rotary_dim == 0) {
    FA_REQUIRE(!rotary_set, "a rotary field is set but rotary_dim is 0");
    return FA_SUCCESS;
  }
  FA_REQUIRE(a->rotary_dim > 0 && a->rotary_dim % 16 == 0 && a->rotary_dim <= c.head_dim,
             "rotary_dim must be a multiple of 16 in 16..head_dim (%d), or 0; got %d", c.head_dim,
             a->rotary_dim);
  FA_CHECK(check_rotary_dtype("rotary_dtype", c, a->rotary_dtype));
  const uint64_t eb = a->rotary_dtype == 0 || a->rotary_dtype == FA_DTYPE_FP32 ? 4 : 2;
  FA_REQUIRE(a->rotary_cos != 0 && a->rotary_sin != 0,
             "rotary_cos and rotary_sin must be set "
             "with rotary_dim");
  FA_REQUIRE(a->rotary_cos % eb == 0 && a->rotary_sin % eb == 0,
             "rotary_cos/rotary_sin must be %llu-byte aligned (their element size)",
             static_cast<unsigned long long>(eb));
  FA_CHECK(check_seqlen("seqlen_ro", a->seqlen_ro));
  FA_REQUIRE(a->rotary_interleaved == 0 || a->rotary_interleaved == 1,
             "rotary_interleaved must be 0 (GPT-NeoX) or 1 (GPT-J), got %d", a->rotary_interleaved);
  FA_CHECK(check_fp32_ptr("rotary_positions", a->rotary_positions, false));
  FA_REQUIRE(a->rotary_positions_stride >= 0 &&
                 (a->rotary_positions != 0 || a->rotary_positions_stride == 0),
             "rotary_positions_stride must be >= 0, and 0 without rotary_positions; got %lld",
             static_cast<long long>(a->rotary_positions_stride));
  return FA_SUCCESS;
}

// fa_decode's arrays (validated fields) but the workspace (check_decode_plan):
// the byte span rule (check_span).
fa_status check_decode_spans(const fa::AttentionConfig &c, const fa_decode_args &a) {
  const ElemBytes e = elem_bytes(c);
  FA_CHECK(check_tensor_span("q", a.q, e.q, {a.batch, a.seqlen_q, c.num_heads_q, c.head_dim},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim"}));
  FA_CHECK(check_kv_spans(c, a.kv, "k_cache", a.k_cache, "v_cache", a.v_cache, a.batch, a.batch,
                          "seqlen_k_max", a.seqlen_k_max));
  FA_CHECK(check_array_span("cache_seqlens", a.cache_seqlens, 4, a.batch, "batch"));
  if (a.o.data != 0) {
    FA_CHECK(check_tensor_span("o", a.o, e.o, {a.batch, a.seqlen_q, c.num_heads_q, c.head_dim_v},
                               {"batch", "seqlen_q", "num_heads_q", "head_dim_v"}));
  }
  FA_CHECK(check_lse_span("lse", a.lse, a.batch, c.num_heads_q, a.seqlen_q));
  FA_CHECK(check_array_span("sinks", a.sinks, 4, c.num_heads_q, "num_heads_q"));
  if (a.tree_mask != 0) {  // bytes: rows of whole 32-bit words
    FA_CHECK(
        check_span("tree_mask", false, a.tree_mask, 1,
                   {{a.tree_mask_stride[0], a.batch, "tree_mask_stride[0]", "batch"},
                    {a.tree_mask_stride[1], a.seqlen_q, "tree_mask_stride[1]", "seqlen_q"},
                    {1, (int64_t(a.seqlen_q) + 31) / 32 * 4, "1", "4 * ceil(seqlen_q / 32)"}}));
  }
  FA_CHECK(check_slope_descale_spans(c, a, a.batch));
  if (a.k_new.data == 0) return FA_SUCCESS;
  // The new rows stay in the config's dtype (an fp8 cache quantises them).
  FA_CHECK(check_tensor_span("k_new", a.k_new, e.o,
                             {a.batch, a.seqlen_new, c.num_heads_kv, c.head_dim},
                             {"batch", "seqlen_new", "num_heads_kv", "head_dim"}));
  FA_CHECK(check_tensor_span("v_new", a.v_new, e.o,
                             {a.batch, a.seqlen_new, c.num_heads_kv, c.head_dim_v},
                             {"batch", "seqlen_new", "num_heads_kv", "head_dim_v"}));
  if (a.rotary_dim == 0) return FA_SUCCESS;
  const uint64_t eb = a.rotary_dtype == 0 || a.rotary_dtype == FA_DTYPE_FP32 ? 4 : 2;
  const int64_t half = a.rotary_dim / 2;
  auto table = [&](const char *name, uint64_t p) {
    return check_span(
        name, false, p, eb,
        {{half, a.seqlen_ro, "rotary_dim / 2", "seqlen_ro"}, {1, half, "1", "rotary_dim / 2"}});
  };
  FA_CHECK(table("rotary_cos", a.rotary_cos));
  FA_CHECK(table("rotary_sin", a.rotary_sin));
  return check_rows_span("rotary_positions", a.rotary_positions, "rotary_positions_stride",
                         a.rotary_positions_stride, a.batch, std::max(a.seqlen_q, a.seqlen_new),
                         "max(seqlen_q, seqlen_new)");
}

// The plan fa_decode will run for a (into *plan) and its launch grids
// against CUDA's limits (runtime.cc geometry_ok): the decode kernel's y and
// z (num_heads_kv times a group's row blocks, and batch) at most 65535, and
// with o the combine's x (batch * seqlen_q * num_heads_q rows, num_warps
// per block) below 2^31. fa_decode_workspace_size and fa_decode both call
// it, so the size query refuses what the launch would, with the same
// message, and fa_decode refuses before its first launch. Supporting
// larger grids would need the kernels to loop over blocks.
fa_status check_decode_plan(const fa::Runtime &rt, const fa::AttentionConfig &c,
                            const fa_decode_args &a, fa::DecodePlan *plan) {
  *plan = rt.plan_decode(c, a);
  if (plan->too_large) return fa::decode_too_large();
  const fa::KernelSpec spec = rt.decode_spec(c, a);
  fa::DecodeParams p;
  std::memset(&p, 0, sizeof p);
  p.batch = a.batch;
  p.seqlen_q = a.seqlen_q;
  p.num_heads_q = c.num_heads_q;
  p.num_heads_kv = c.num_heads_kv;
  p.num_splits = plan->num_splits;
  const fa::LaunchGeometry g = fa::decode_geometry(spec, p);
  if (g.grid[2] > 65535) {
    return fail(FA_ERROR_UNSUPPORTED,
                "batch is %d, more than 65535: the decode grid has one z index per sequence "
                "(CUDA's grid z limit); split the batch across calls",
                a.batch);
  }
  if (g.grid[1] > 65535) {
    return fail(FA_ERROR_UNSUPPORTED,
                "num_heads_kv (%d) * ceil((num_heads_q / num_heads_kv) * seqlen_q / %d) blocks "
                "is more than 65535 (the decode grid's y limit): fewer query rows per call "
                "(seqlen_q %d)",
                c.num_heads_kv, spec.block_m, a.seqlen_q);
  }
  if (g.grid[0] > uint32_t(INT32_MAX)) {  // num_splits * O slices: not reachable today
    return fail(FA_ERROR_UNSUPPORTED, "the decode grid's x dimension (%u) is past 2^31 - 1",
                g.grid[0]);
  }
  if (a.o.data == 0) return FA_SUCCESS;
  fa::LaunchShape rshape;
  rshape.sinks = a.sinks != 0;
  const fa::KernelSpec rspec =
      fa::make_spec(c, fa::KernelKind::Reduce, rt.backend().info().limits, rshape, rt.policy());
  fa::ReduceParams r;
  std::memset(&r, 0, sizeof r);
  r.batch = a.batch;
  r.seqlen_q = a.seqlen_q;
  r.num_heads_q = c.num_heads_q;
  r.num_splits = plan->num_splits;
  if (fa::reduce_geometry(rspec, r).grid[0] > uint32_t(INT32_MAX)) {
    return fail(FA_ERROR_UNSUPPORTED,
                "batch * seqlen_q * num_heads_q = %d * %d * %d rows need more than 2^31 - 1 "
                "blocks of %d rows in the combine (CUDA's grid x limit): split the batch, or pass "
                "o.data = 0 and combine the partial states with fa_decode_reduce in parts",
                a.batch, a.seqlen_q, c.num_heads_q, rspec.num_warps);
  }
  return FA_SUCCESS;
}

// fa_decode_args.split_counters (since 0.8): int32, 4-byte aligned, with o,
// at least FA_DECODE_SPLIT_COUNTERS of them in split_counters_size bytes.
fa_status check_split_counters(const fa::AttentionConfig &c, const fa_decode_args &a) {
  if (a.split_counters == 0) {
    FA_REQUIRE(a.split_counters_size == 0,
               "split_counters_size is %zu but split_counters is 0; set it to 0 without counters",
               a.split_counters_size);
    return FA_SUCCESS;
  }
  FA_REQUIRE(a.split_counters % 4 == 0, "split_counters 0x%llx is not 4-byte aligned (int32)",
             static_cast<unsigned long long>(a.split_counters));
  FA_REQUIRE(a.o.data != 0,
             "split_counters is set but o.data is 0 (no combine to fuse: the partial states stay "
             "in the workspace); pass 0");
  const size_t need =
      4 * FA_DECODE_SPLIT_COUNTERS(a.batch, c.num_heads_q, c.num_heads_kv, a.seqlen_q);
  FA_REQUIRE(a.split_counters_size >= need,
             "split_counters_size is %zu bytes, %zu needed: FA_DECODE_SPLIT_COUNTERS(batch %d, "
             "num_heads_q %d, num_heads_kv %d, seqlen_q %d) int32 counters",
             a.split_counters_size, need, a.batch, c.num_heads_q, c.num_heads_kv, a.seqlen_q);
  return check_span("split_counters", false, a.split_counters, 1,
                    {{1, int64_t(need), "1", "its bytes"}});
}

fa_status validate_decode_workspace(const fa_decode_args *a) {
  FA_REQUIRE(a->workspace != 0, "workspace is 0 (size it with fa_decode_workspace_size)");
  FA_REQUIRE(a->workspace % 256 == 0, "workspace 0x%llx is not 256-byte aligned",
             static_cast<unsigned long long>(a->workspace));
  return FA_SUCCESS;
}

fa_status check_lse_format(const char *name, int32_t v) {
  FA_REQUIRE(v == FA_LSE_NATURAL || v == FA_LSE_BASE2,
             "%s must be an fa_lse_format (0 FA_LSE_NATURAL, 1 FA_LSE_BASE2), got %d", name, v);
  return FA_SUCCESS;
}

// a: already widened (widen_args) to the current struct.
fa_status validate_reduce(const fa_reduce_args *a) {
  FA_CHECK(check_lse_format("lse_partial_format", a->lse_partial_format));
  FA_CHECK(check_lse_format("lse_format", a->lse_format));
  FA_CHECK(check_fp32_ptr("sinks", a->sinks, false));
  FA_CHECK(check_positive("num_splits", a->num_splits));
  FA_CHECK(check_positive("batch", a->batch));
  FA_CHECK(check_positive("seqlen_q", a->seqlen_q));
  FA_CHECK(check_fp32_ptr("o_partial", a->o_partial, true));
  FA_CHECK(check_fp32_ptr("lse_partial", a->lse_partial, true));
  FA_REQUIRE(a->o_partial_stride[4] == 1, "o_partial_stride[4] must be 1, got %lld",
             static_cast<long long>(a->o_partial_stride[4]));
  for (int i = 0; i < 4; ++i) {
    FA_REQUIRE(a->o_partial_stride[i] >= 0, "o_partial_stride[%d] must be >= 0, got %lld", i,
               static_cast<long long>(a->o_partial_stride[i]));
    FA_REQUIRE(a->lse_partial_stride[i] >= 0, "lse_partial_stride[%d] must be >= 0, got %lld", i,
               static_cast<long long>(a->lse_partial_stride[i]));
  }
  FA_CHECK(check_tensor("o", a->o));
  FA_CHECK(check_fp32_ptr("lse", a->lse, false));
  return FA_SUCCESS;
}

// fa_decode_reduce's arrays (validated fields): the byte span rule.
fa_status check_reduce_spans(const fa::AttentionConfig &c, const fa_reduce_args &a) {
  const int64_t *os = a.o_partial_stride, *ls = a.lse_partial_stride;
  FA_CHECK(check_span("o_partial", false, a.o_partial, 4,
                      {{os[0], a.num_splits, "o_partial_stride[0]", "num_splits"},
                       {os[1], a.batch, "o_partial_stride[1]", "batch"},
                       {os[2], a.seqlen_q, "o_partial_stride[2]", "seqlen_q"},
                       {os[3], c.num_heads_q, "o_partial_stride[3]", "num_heads_q"},
                       {os[4], c.head_dim_v, "o_partial_stride[4]", "head_dim_v"}}));
  FA_CHECK(check_span("lse_partial", false, a.lse_partial, 4,
                      {{ls[0], a.num_splits, "lse_partial_stride[0]", "num_splits"},
                       {ls[1], a.batch, "lse_partial_stride[1]", "batch"},
                       {ls[2], c.num_heads_q, "lse_partial_stride[2]", "num_heads_q"},
                       {ls[3], a.seqlen_q, "lse_partial_stride[3]", "seqlen_q"}}));
  FA_CHECK(check_tensor_span("o", a.o, elem_bytes(c).o,
                             {a.batch, a.seqlen_q, c.num_heads_q, c.head_dim_v},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim_v"}));
  FA_CHECK(check_lse_span("lse", a.lse, a.batch, c.num_heads_q, a.seqlen_q));
  return check_array_span("sinks", a.sinks, 4, c.num_heads_q, "num_heads_q");
}

// The checks of fa_forward_args that fa_launch makes, on the forward a
// backward differentiates (its workspace ignored); a failure's message
// starts "fwd: ".
fa_status validate_backward_fwd(const fa::AttentionConfig &c, fa_forward_args *f) {
  f->workspace = 0;
  f->workspace_size = 0;
  fa_status st = validate_forward(c, f);
  if (st == FA_SUCCESS)
    st = validate_descales(c, f->k_descale, f->v_descale, f->descale_stride, f->k, f->v);
  if (st == FA_SUCCESS) st = validate_q_fp8(c, *f);
  if (st == FA_SUCCESS) st = check_forward_spans(c, *f);
  if (st != FA_SUCCESS) fa::prefix_error("fwd");
  return st;
}

// fa_backward_args: *a = *in, checked (flashattn.h, fa_backward's errors),
// and *plan its workspace layout. launch: the workspace too (fa_backward;
// fa_backward_workspace_size reads none).
fa_status validate_backward(const fa::Runtime &rt, const fa::AttentionConfig &c,
                            const fa_backward_args *in, bool launch, fa_backward_args *a,
                            fa::BackwardPlan *plan) {
  FA_CHECK(check_struct_size("args", in->struct_size, sizeof(fa_backward_args)));
  *a = *in;
  FA_CHECK(check_struct_size("fwd", a->fwd.struct_size, sizeof(fa_forward_args)));
  FA_CHECK(fa::check_backward(c, rt.backend().info().limits.sm));
  const int layout = raw_enum(a->fwd.kv.layout);
  if (layout == FA_KV_PAGED || layout == FA_KV_PTR_ARRAY) {
    return fail(FA_ERROR_UNSUPPORTED,
                "fwd.kv.layout is %d: the backward takes a contiguous K/V (FA_KV_CONTIGUOUS), "
                "not a paged or pointer-array KV cache",
                layout);
  }
  if (a->fwd.seqused_k != 0) {
    return fail(FA_ERROR_UNSUPPORTED,
                "fwd.seqused_k is set: the backward takes fixed-length or cu_seqlens_k keys");
  }
  FA_CHECK(validate_backward_fwd(c, &a->fwd));
  FA_REQUIRE(a->fwd.lse != 0, "fwd.lse is 0: the backward needs the forward's LSE");
  const fa_forward_args &f = a->fwd;
  FA_CHECK(check_tensor("dout", a->dout));
  FA_CHECK(check_tensor("dq", a->dq));
  FA_CHECK(check_tensor("dk", a->dk));
  FA_CHECK(check_tensor("dv", a->dv));
  // As fa_launch's q/o and k/v (check_forward_spans): packed with cu_seqlens.
  const uint64_t eb = elem_bytes(c).o;
  const int64_t bq = f.cu_seqlens_q ? 1 : f.batch, bk = f.cu_seqlens_k ? 1 : f.batch;
  FA_CHECK(check_tensor_span("dout", a->dout, eb, {bq, f.seqlen_q, c.num_heads_q, c.head_dim_v},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim_v"}));
  FA_CHECK(check_tensor_span("dq", a->dq, eb, {bq, f.seqlen_q, c.num_heads_q, c.head_dim},
                             {"batch", "seqlen_q", "num_heads_q", "head_dim"}));
  FA_CHECK(check_tensor_span("dk", a->dk, eb, {bk, f.seqlen_k, c.num_heads_kv, c.head_dim},
                             {"batch", "seqlen_k", "num_heads_kv", "head_dim"}));
  FA_CHECK(check_tensor_span("dv", a->dv, eb, {bk, f.seqlen_k, c.num_heads_kv, c.head_dim_v},
                             {"batch", "seqlen_k", "num_heads_kv", "head_dim_v"}));
  if (f.sinks != 0) {
    FA_REQUIRE(a->dsinks != 0, "dsinks is 0 but fwd.sinks is set: dsinks receives their gradient");
    FA_CHECK(check_fp32_ptr("dsinks", a->dsinks, true));
    FA_CHECK(check_array_span("dsinks", a->dsinks, 4, c.num_heads_q, "num_heads_q"));
  } else {
    FA_REQUIRE(a->dsinks == 0, "dsinks is set but fwd.sinks is 0; pass 0 without sinks");
  }
  FA_REQUIRE(a->deterministic == 0 || a->deterministic == 1, "deterministic must be 0 or 1, got %d",
             a->deterministic);
  // CUDA's grid limits (y and z at most 65535): the per-row kernels' grid
  // is (query blocks, num_heads_q, batch), the main kernel's (key blocks,
  // num_heads_kv, batch).
  if (f.batch > 65535 || c.num_heads_q > 65535) {
    return fail(FA_ERROR_UNSUPPORTED,
                "batch %d and num_heads_q %d must be at most 65535 in the backward (its grids' "
                "z and y dimensions); split the batch across calls",
                f.batch, c.num_heads_q);
  }
  *plan = fa::plan_backward(c, *a);
  if (plan->too_large) {
    return fail(FA_ERROR_UNSUPPORTED,
                "backward workspace too large: batch * seqlen_q * num_heads_q * (head_dim + 2) * "
                "4 bytes overflows 64 bits");
  }
  if (!launch) return FA_SUCCESS;
  FA_REQUIRE(a->workspace != 0, "workspace is 0 (size it with fa_backward_workspace_size)");
  FA_REQUIRE(a->workspace % 256 == 0, "workspace 0x%llx is not 256-byte aligned",
             static_cast<unsigned long long>(a->workspace));
  FA_REQUIRE(a->workspace_size >= plan->workspace_bytes,
             "workspace_size is %zu bytes, %zu needed (see fa_backward_workspace_size)",
             a->workspace_size, plan->workspace_bytes);
  return check_span("workspace", false, a->workspace, 1,
                    {{1, int64_t(plan->workspace_bytes), "1", "its bytes"}});
}

}  // namespace

fa_status fa::api::config_from_desc(const fa_config_desc *desc, fa::AttentionConfig *c) {
  FA_REQUIRE(desc != nullptr, "desc is NULL");
  // A 0.4-sized desc (before kv_dtype) reads as kv_dtype 0, a 0.5-sized one
  // (before q_dtype) as q_dtype 0.
  fa_config_desc wide;
  if (desc->struct_size == FA_CONFIG_DESC_SIZE_0_4 ||
      desc->struct_size == FA_CONFIG_DESC_SIZE_0_5) {
    std::memset(&wide, 0, sizeof wide);
    std::memcpy(&wide, desc, desc->struct_size);
    wide.struct_size = sizeof wide;
    desc = &wide;
  }
  const fa_config_desc *d = desc;
  FA_CHECK(check_struct_size("desc", d->struct_size, sizeof(fa_config_desc)));
  const int dtype = raw_enum(d->dtype);
  FA_REQUIRE(dtype == FA_DTYPE_FP16 || dtype == FA_DTYPE_BF16 || dtype == FA_DTYPE_FP32,
             "dtype must be FA_DTYPE_FP16, FA_DTYPE_BF16 or FA_DTYPE_FP32, got %d", dtype);
  const int32_t dv = d->head_dim_v == 0 ? d->head_dim : d->head_dim_v;
  if (d->head_dim < 8 || d->head_dim > FA_MAX_HEAD_DIM || d->head_dim % 8 != 0) {
    return fail(FA_ERROR_UNSUPPORTED, "head_dim must be a multiple of 8 in 8..%d, got %d",
                FA_MAX_HEAD_DIM, d->head_dim);
  }
  if (dv < 8 || dv > FA_MAX_HEAD_DIM_V || dv % 8 != 0) {
    return fail(FA_ERROR_UNSUPPORTED, "head_dim_v must be a multiple of 8 in 8..%d, got %d",
                FA_MAX_HEAD_DIM_V, d->head_dim_v);
  }
  FA_CHECK(check_positive("num_heads_q", d->num_heads_q));
  FA_CHECK(check_positive("num_heads_kv", d->num_heads_kv));
  FA_REQUIRE(d->num_heads_q % d->num_heads_kv == 0,
             "num_heads_q (%d) must be a multiple of num_heads_kv (%d)", d->num_heads_q,
             d->num_heads_kv);
  FA_REQUIRE(d->causal == 0 || d->causal == 1, "causal must be 0 or 1, got %d", d->causal);
  FA_REQUIRE(d->window_left >= -1, "window_left must be >= 0 or -1 (unbounded), got %d",
             d->window_left);
  FA_REQUIRE(d->window_right >= -1, "window_right must be >= 0 or -1 (unbounded), got %d",
             d->window_right);
  FA_REQUIRE(std::isfinite(d->softmax_scale) && d->softmax_scale >= 0,
             "softmax_scale must be finite and > 0 (0 = 1/sqrt(head_dim)), got %g",
             static_cast<double>(d->softmax_scale));
  FA_REQUIRE(std::isfinite(d->softcap) && d->softcap >= 0,
             "softcap must be finite and >= 0 (0 = off), got %g", static_cast<double>(d->softcap));
  // The kernels scale scores in the log2 domain (runtime.cc
  // set_masking_and_scale): softmax_scale * log2(e), or softmax_scale /
  // softcap and softcap * log2(e). Each must be a finite float.
  const double kLog2e = 1.4426950408889634;
  const double scale = d->softmax_scale;
  if (d->softcap > 0) {
    FA_REQUIRE(double(d->softcap) * kLog2e <= FLT_MAX,
               "softcap %g is too large: softcap * log2(e) overflows float",
               static_cast<double>(d->softcap));
    FA_REQUIRE(scale / d->softcap <= FLT_MAX, "softmax_scale / softcap = %g / %g overflows float",
               scale, static_cast<double>(d->softcap));
  } else {
    FA_REQUIRE(scale * kLog2e <= FLT_MAX,
               "softmax_scale %g is too large: softmax_scale * log2(e) overflows float", scale);
  }
  c->dtype = dtype == FA_DTYPE_BF16   ? fa::Dtype::BF16
             : dtype == FA_DTYPE_FP32 ? fa::Dtype::F32
                                      : fa::Dtype::F16;
  c->head_dim = d->head_dim;
  c->head_dim_v = dv;
  c->num_heads_q = d->num_heads_q;
  c->num_heads_kv = d->num_heads_kv;
  c->causal = d->causal != 0;
  c->window_left = d->window_left;
  c->window_right = c->causal ? 0 : d->window_right;
  c->softmax_scale =
      d->softmax_scale > 0 ? d->softmax_scale : 1.0f / std::sqrt(static_cast<float>(d->head_dim));
  c->softcap = d->softcap;
  FA_REQUIRE(
      d->kv_dtype == 0 || d->kv_dtype == FA_DTYPE_FP8_E4M3 || d->kv_dtype == FA_DTYPE_FP8_E5M2,
      "kv_dtype must be 0 (= dtype), FA_DTYPE_FP8_E4M3 (4) or FA_DTYPE_FP8_E5M2 (5), got %lld",
      static_cast<long long>(d->kv_dtype));
  if (d->kv_dtype != 0 && dtype == FA_DTYPE_FP32) {
    return fail(FA_ERROR_UNSUPPORTED,
                "an fp8 KV cache (kv_dtype %d) needs dtype FA_DTYPE_FP16 or FA_DTYPE_BF16, not "
                "FA_DTYPE_FP32",
                static_cast<int>(d->kv_dtype));
  }
  if (d->kv_dtype != 0) {
    // The fp8 rows travel in whole 16-byte chunks (16 values).
    if (d->head_dim % 16 != 0 || dv % 16 != 0) {
      return fail(FA_ERROR_UNSUPPORTED,
                  "an fp8 KV cache (kv_dtype %d) needs head_dim and head_dim_v multiples of 16, "
                  "got %d and %d",
                  static_cast<int>(d->kv_dtype), d->head_dim, dv);
    }
    c->kv_fp8 = static_cast<fa::KvFp8>(d->kv_dtype);
  }
  FA_REQUIRE(
      d->q_dtype == 0 || d->q_dtype == FA_DTYPE_FP8_E4M3 || d->q_dtype == FA_DTYPE_FP8_E5M2,
      "q_dtype must be 0 (= dtype), FA_DTYPE_FP8_E4M3 (4) or FA_DTYPE_FP8_E5M2 (5), got %lld",
      static_cast<long long>(d->q_dtype));
  if (d->q_dtype != 0) {
    // The fp8 forward: Q, K and V all fp8 (FlashAttention-3's fp8 forward).
    FA_REQUIRE(d->kv_dtype != 0,
               "an fp8 Q (q_dtype %d) needs an fp8 K and V too: set kv_dtype to "
               "FA_DTYPE_FP8_E4M3 or FA_DTYPE_FP8_E5M2",
               static_cast<int>(d->q_dtype));
    c->q_fp8 = static_cast<fa::KvFp8>(d->q_dtype);
  }
  return FA_SUCCESS;
}

namespace {

void copy_cstr(char *dst, size_t cap, const std::string &src) {
  std::snprintf(dst, cap, "%s", src.c_str());
}

// The emulator's counters as the C struct.
void copy_counters(const fa::emu::MemCounters &c, fa_emu_mem_counters *out) {
  out->global_load_requests = c.global_load_requests;
  out->global_load_sectors = c.global_load_sectors;
  out->global_load_bytes = c.global_load_bytes;
  out->cp_async_requests = c.cp_async_requests;
  out->cp_async_sectors = c.cp_async_sectors;
  out->cp_async_bytes = c.cp_async_bytes;
  out->global_store_requests = c.global_store_requests;
  out->global_store_sectors = c.global_store_sectors;
  out->global_store_bytes = c.global_store_bytes;
  out->shared_requests = c.shared_requests;
  out->shared_wavefronts = c.shared_wavefronts;
  out->shared_bank_conflicts = c.shared_bank_conflicts;
}

}  // namespace

extern "C" {

FA_API const char *fa_status_string(fa_status status) {
  switch (raw_enum(status)) {
    case FA_SUCCESS:
      return "success";
    case FA_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case FA_ERROR_UNSUPPORTED:
      return "unsupported";
    case FA_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case FA_ERROR_NO_DRIVER:
      return "CUDA driver not available";
    case FA_ERROR_NO_DEVICE:
      return "no CUDA device";
    case FA_ERROR_CUDA:
      return "CUDA driver error";
    case FA_ERROR_COMPILE:
      return "kernel compilation failed";
    case FA_ERROR_LAUNCH:
      return "kernel launch failed";
    case FA_ERROR_RUNTIME_POISONED:
      return "runtime unusable after an earlier sticky error";
    case FA_ERROR_BUFFER_TOO_SMALL:
      return "buffer too small";
    case FA_ERROR_INTERNAL:
      return "internal error";
    case FA_ERROR_CACHE:
      return "kernel cache error";
    case FA_STATUS_LAST:
      break;
  }
  return "unknown status";
}

FA_API const char *fa_last_error(void) { return fa::last_error(); }

FA_API uint32_t fa_version_number(void) { return FLASHATTN_VERSION_NUMBER; }

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)
FA_API const char *fa_version_string(void) {
  return FA_STR(FLASHATTN_VERSION_MAJOR) "." FA_STR(FLASHATTN_VERSION_MINOR) "." FA_STR(
      FLASHATTN_VERSION_PATCH);
}

FA_API fa_status fa_runtime_create(const fa_runtime_options *options, fa_runtime **out) {
  return guarded("fa_runtime_create", [&]() -> fa_status {
    FA_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
    if (options) {
      // A 0.1 to 0.5 caller's struct ends before ptx_compiler (zero: auto),
      // a 0.6 caller's before kernel_store (NULL: $FLASHATTN_KERNEL_STORE).
      if (options->struct_size != FA_RUNTIME_OPTIONS_SIZE_0_5 &&
          options->struct_size != FA_RUNTIME_OPTIONS_SIZE_0_6)
        FA_CHECK(check_struct_size("options", options->struct_size, sizeof(fa_runtime_options)));
      FA_CHECK(
          widen_args(options, {FA_RUNTIME_OPTIONS_SIZE_0_5, FA_RUNTIME_OPTIONS_SIZE_0_6}, &opts));
    }
    if (opts.kernel_store)
      FA_CHECK(fa::cache::check_kernel_store(*opts.kernel_store, "kernel_store"));
    const int backend = raw_enum(opts.backend), cache_mode = raw_enum(opts.cache_mode);
    FA_REQUIRE(
        backend == FA_BACKEND_AUTO || backend == FA_BACKEND_CUDA || backend == FA_BACKEND_EMULATOR,
        "backend must be FA_BACKEND_AUTO, _CUDA or _EMULATOR, got %d", backend);
    FA_REQUIRE(opts.device >= 0, "device must be >= 0, got %d", opts.device);
    FA_REQUIRE(
        opts.ptx_compiler == FA_PTX_COMPILER_AUTO || opts.ptx_compiler == FA_PTX_COMPILER_OFF,
        "ptx_compiler must be FA_PTX_COMPILER_AUTO or _OFF, got %lld",
        static_cast<long long>(opts.ptx_compiler));
    FA_REQUIRE(cache_mode == FA_CACHE_DEFAULT || cache_mode == FA_CACHE_DISK ||
                   cache_mode == FA_CACHE_MEMORY,
               "cache_mode must be FA_CACHE_DEFAULT, _DISK or _MEMORY, got %d", cache_mode);
    fa::DeviceLimits lim;
    if (opts.emulator_sm != 0 && !fa::published_limits(opts.emulator_sm, &lim)) {
      return fail(FA_ERROR_UNSUPPORTED, "emulator_sm must be 0 or one of %s, got %d", kSupportedSms,
                  opts.emulator_sm);
    }
    auto rt = std::make_unique<fa_runtime>();
    FA_CHECK(fa::Runtime::create(opts, &rt->impl));
    *out = rt.release();
    return FA_SUCCESS;
  });
}

FA_API void fa_runtime_destroy(fa_runtime *rt) {
  fa::clear_error();
  try {
    delete rt;
  } catch (...) {
    // Destructors do not throw; nothing may escape regardless.
  }
}

FA_API fa_status fa_runtime_get_info(const fa_runtime *rt, fa_runtime_info *info) {
  return guarded("fa_runtime_get_info", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_REQUIRE(info != nullptr, "info is NULL");
    FA_CHECK(check_struct_size("info", info->struct_size, sizeof(fa_runtime_info)));
    const fa::DeviceInfo &d = rt->impl->backend().info();
    info->backend = rt->impl->backend().kind();
    info->sm = d.sm;
    info->num_sms = d.num_sms;
    info->driver_version = d.driver_version;
    copy_cstr(info->device_name, sizeof info->device_name, d.name);
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_malloc(fa_runtime *rt, size_t bytes, uint64_t *ptr) {
  return guarded("fa_malloc", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_REQUIRE(ptr != nullptr, "ptr is NULL");
    *ptr = 0;
    FA_REQUIRE(bytes > 0, "bytes must be > 0");
    return rt->impl->backend().mem_alloc(bytes, ptr);
  });
}

FA_API fa_status fa_free(fa_runtime *rt, uint64_t ptr) {
  return guarded("fa_free", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    if (ptr == 0) return FA_SUCCESS;
    return rt->impl->backend().mem_free(ptr);
  });
}

FA_API fa_status fa_memcpy_htod(fa_runtime *rt, uint64_t dst, const void *src, size_t bytes) {
  return guarded("fa_memcpy_htod", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    if (bytes == 0) return FA_SUCCESS;
    FA_REQUIRE(dst != 0 && src != nullptr, "dst and src must be non-null");
    return rt->impl->backend().copy_htod(dst, src, bytes);
  });
}

FA_API fa_status fa_memcpy_dtoh(fa_runtime *rt, void *dst, uint64_t src, size_t bytes) {
  return guarded("fa_memcpy_dtoh", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    if (bytes == 0) return FA_SUCCESS;
    FA_REQUIRE(dst != nullptr && src != 0, "dst and src must be non-null");
    return rt->impl->backend().copy_dtoh(dst, src, bytes);
  });
}

FA_API fa_status fa_memset(fa_runtime *rt, uint64_t dst, uint8_t value, size_t bytes) {
  return guarded("fa_memset", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    if (bytes == 0) return FA_SUCCESS;
    FA_REQUIRE(dst != 0, "dst is 0");
    return rt->impl->backend().memset_d8(dst, value, bytes);
  });
}

FA_API fa_status fa_synchronize(fa_runtime *rt, void *stream) {
  return guarded("fa_synchronize", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    return rt->impl->backend().synchronize(stream);
  });
}

FA_API fa_status fa_config_create(const fa_config_desc *desc, fa_config **out) {
  return guarded("fa_config_create", [&]() -> fa_status {
    FA_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    fa::AttentionConfig c;
    FA_CHECK(config_from_desc(desc, &c));
    *out = new fa_config{c};
    return FA_SUCCESS;
  });
}

FA_API void fa_config_destroy(fa_config *cfg) {
  fa::clear_error();
  delete cfg;
}

}  // extern "C"

fa::KernelPolicy fa::api::set_kernel_policy(fa_runtime *rt, const fa::KernelPolicy &policy) {
  const fa::KernelPolicy old = rt->impl->policy();
  rt->impl->set_policy(policy);
  return old;
}

fa_status fa::api::backward_kernels(fa_runtime *rt, const fa_config *cfg,
                                    const fa_backward_args *args, unsigned kernels) {
  return guarded("fa_backward", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_backward_args a;
    fa::BackwardPlan plan;
    FA_CHECK(validate_backward(*rt->impl, cfg->cfg, args, true, &a, &plan));
    return rt->impl->backward(cfg->cfg, a, nullptr, kernels);
  });
}

fa::KernelSpec fa::api::backward_spec(fa_runtime *rt, const fa_config *cfg,
                                      const fa_backward_args *args, fa::KernelKind kind) {
  return rt->impl->backward_spec(cfg->cfg, *args, kind);
}

uint64_t fa::api::forwards_as_decode(const fa_runtime *rt) {
  return rt->impl->counters().forwards_as_decode.load(std::memory_order_relaxed);
}

fa_status fa::api::kernel_spec_for(const fa::AttentionConfig &cfg, int raw_kind, int32_t sm,
                                   const fa_generate_options *opts, const fa::KernelPolicy &policy,
                                   fa::KernelSpec *spec) {
  const bool backward = raw_kind == FA_KERNEL_BACKWARD_PRE || raw_kind == FA_KERNEL_BACKWARD ||
                        raw_kind == FA_KERNEL_BACKWARD_POST;
  FA_REQUIRE(raw_kind == FA_KERNEL_FORWARD || raw_kind == FA_KERNEL_DECODE ||
                 raw_kind == FA_KERNEL_REDUCE || backward,
             "kind must be FA_KERNEL_FORWARD, _DECODE, _REDUCE, _BACKWARD_PRE, _BACKWARD or "
             "_BACKWARD_POST, got %d",
             raw_kind);
  fa::LaunchShape shape;
  if (opts != nullptr) {
    FA_REQUIRE(opts->struct_size == sizeof(fa_generate_options) ||
                   opts->struct_size == FA_GENERATE_OPTIONS_SIZE_0_5 ||
                   opts->struct_size == FA_GENERATE_OPTIONS_SIZE_0_4_1 ||
                   opts->struct_size == FA_GENERATE_OPTIONS_SIZE_0_4 ||
                   opts->struct_size == FA_GENERATE_OPTIONS_SIZE_0_3,
               "opts->struct_size is %zu, expected %zu", opts->struct_size,
               sizeof(fa_generate_options));
    fa_generate_options o;
    std::memset(&o, 0, sizeof o);
    std::memcpy(&o, opts, opts->struct_size);
    FA_REQUIRE(o.tree_mask == 0 || o.tree_mask == 1, "opts->tree_mask must be 0 or 1, got %d",
               o.tree_mask);
    FA_REQUIRE(raw_kind == FA_KERNEL_DECODE || !o.tree_mask,
               "opts->tree_mask is for FA_KERNEL_DECODE");
    FA_CHECK(check_lse_format("opts->lse_partial_format", o.lse_partial_format));
    FA_CHECK(check_lse_format("opts->lse_format", o.lse_format));
    FA_REQUIRE(raw_kind == FA_KERNEL_REDUCE || (!o.lse_partial_format && !o.lse_format),
               "opts->lse_partial_format and opts->lse_format are for FA_KERNEL_REDUCE");
    FA_REQUIRE(o.sinks == 0 || o.sinks == 1, "opts->sinks must be 0 or 1, got %lld",
               static_cast<long long>(o.sinks));
    FA_REQUIRE(raw_kind != FA_KERNEL_DECODE || !o.sinks,
               "opts->sinks is for FA_KERNEL_FORWARD and FA_KERNEL_REDUCE (a decode kernel "
               "never reads the sinks; its combine does)");
    FA_REQUIRE(o.append_kv == 0 || o.append_kv == 1, "opts->append_kv must be 0 or 1, got %d",
               o.append_kv);
    FA_REQUIRE(raw_kind == FA_KERNEL_DECODE || !o.append_kv,
               "opts->append_kv is for FA_KERNEL_DECODE");
    FA_REQUIRE(o.rotary >= 0 && o.rotary <= 2 && (o.append_kv || !o.rotary),
               "opts->rotary must be 0, 1 (NeoX) or 2 (interleaved), and needs append_kv; "
               "got %d",
               o.rotary);
    FA_CHECK(check_rotary_dtype("opts->rotary_dtype", cfg, o.rotary_dtype));
    shape.append_kv = o.append_kv != 0;
    shape.rotary = o.rotary;
    shape.rotary_half_table = o.rotary && o.rotary_dtype != 0 && o.rotary_dtype != FA_DTYPE_FP32;
    FA_REQUIRE(o.alibi == 0 || o.alibi == 1, "opts->alibi must be 0 or 1, got %d", o.alibi);
    FA_REQUIRE(raw_kind != FA_KERNEL_REDUCE || !o.alibi,
               "opts->alibi is for FA_KERNEL_FORWARD and FA_KERNEL_DECODE");
    FA_REQUIRE(o.v_in_k == 0 || o.v_in_k == 1, "opts->v_in_k must be 0 or 1, got %d", o.v_in_k);
    FA_REQUIRE(!o.v_in_k || ((raw_kind == FA_KERNEL_DECODE || raw_kind == FA_KERNEL_FORWARD) &&
                             !o.append_kv && cfg.head_dim_v <= cfg.head_dim),
               "opts->v_in_k is for FA_KERNEL_DECODE without append_kv and FA_KERNEL_FORWARD, "
               "with head_dim_v (%d) <= head_dim (%d)",
               cfg.head_dim_v, cfg.head_dim);
    shape.v_in_k = o.v_in_k != 0;
    shape.tree_mask = o.tree_mask != 0;
    shape.sinks = o.sinks != 0;
    shape.alibi = o.alibi != 0;
    shape.lse_in_base2 = o.lse_partial_format == FA_LSE_BASE2;
    shape.lse_out_base2 = o.lse_format == FA_LSE_BASE2;
    FA_REQUIRE(opts->kv_layout == FA_KV_CONTIGUOUS || opts->kv_layout == FA_KV_PAGED ||
                   opts->kv_layout == FA_KV_PTR_ARRAY,
               "opts->kv_layout must be an fa_kv_layout, got %d", opts->kv_layout);
    if (opts->kv_layout == FA_KV_PAGED) {
      FA_REQUIRE(opts->page_size >= 1, "opts->page_size must be >= 1 with FA_KV_PAGED, got %d",
                 opts->page_size);
    } else {
      FA_REQUIRE(opts->page_size == 0, "opts->page_size is for FA_KV_PAGED only, got %d",
                 opts->page_size);
    }
    FA_REQUIRE(opts->varlen == 0 || opts->varlen == 1, "opts->varlen must be 0 or 1");
    FA_REQUIRE(opts->seqused_k == 0 || opts->seqused_k == 1, "opts->seqused_k must be 0 or 1");
    FA_REQUIRE(raw_kind == FA_KERNEL_FORWARD || backward || (!opts->varlen && !opts->seqused_k),
               "opts->varlen and opts->seqused_k are for FA_KERNEL_FORWARD (varlen also for the "
               "FA_KERNEL_BACKWARD kinds)");
    FA_REQUIRE(raw_kind != FA_KERNEL_REDUCE || opts->kv_layout == FA_KV_CONTIGUOUS,
               "FA_KERNEL_REDUCE reads no K/V cache: opts->kv_layout must be 0");
    if (backward && opts->kv_layout != FA_KV_CONTIGUOUS) {  // as fa_backward's fwd.kv.layout
      return fail(FA_ERROR_UNSUPPORTED,
                  "opts->kv_layout is %d: the backward takes a contiguous K/V "
                  "(FA_KV_CONTIGUOUS), not a paged or pointer-array KV cache",
                  opts->kv_layout);
    }
    if (backward && opts->seqused_k) {  // as fa_backward's fwd.seqused_k
      return fail(FA_ERROR_UNSUPPORTED,
                  "opts->seqused_k is set: the backward takes fixed-length or cu_seqlens_k keys");
    }
    shape.varlen = opts->varlen != 0;
    shape.seqused_k = opts->seqused_k != 0;
    shape.kv_layout = static_cast<fa::KvLayout>(opts->kv_layout);
    shape.page_size = opts->page_size;
  }
  fa::DeviceLimits lim;
  if (!fa::published_limits(sm, &lim)) {
    return fail(FA_ERROR_UNSUPPORTED, "sm must be one of %s, got %d", kSupportedSms, sm);
  }
  if (backward) {
    // The spec fa_backward's runtime takes (Runtime::backward_spec), for
    // what fa_backward accepts of cfg.
    FA_CHECK(fa::check_backward(cfg, sm));
    const fa::KernelKind k = raw_kind == FA_KERNEL_BACKWARD_PRE ? fa::KernelKind::BackwardPre
                             : raw_kind == FA_KERNEL_BACKWARD   ? fa::KernelKind::Backward
                                                                : fa::KernelKind::BackwardPost;
    *spec = fa::backward_spec(cfg, k, lim, shape, policy);
    return FA_SUCCESS;
  }
  const fa::KernelKind k = raw_kind == FA_KERNEL_FORWARD  ? fa::KernelKind::Forward
                           : raw_kind == FA_KERNEL_DECODE ? fa::KernelKind::Decode
                                                          : fa::KernelKind::Reduce;
  if (k == fa::KernelKind::Forward && shape.v_in_k) {
    // A forward over MLA's latent cache (not varlen: cu_seqlens_k keeps the
    // forward kernel): where the MLA kernel takes it
    // (Runtime::forward_as_decode), its one-split form writing O, which
    // fa_launch runs when the plan has one split or no workspace is given.
    fa::LaunchShape d = shape;
    d.direct_out = true;
    d.fixed_len = !shape.seqused_k;
    d.seqused_k = false;
    const fa::KernelSpec m = fa::make_spec(cfg, fa::KernelKind::Decode, lim, d, policy);
    if (!shape.varlen && m.tcgen05 && m.direct_out &&
        fa::mla_decode_dims(cfg.head_dim, cfg.head_dim_v) && cfg.q_fp8 == fa::KvFp8::None &&
        cfg.kv_fp8 == fa::KvFp8::None) {
      *spec = m;
      return FA_SUCCESS;
    }
    shape.v_in_k = false;  // the forward kernels read V as given
  }
  *spec = fa::make_spec(cfg, k, lim, shape, policy);
  FA_CHECK(fa::check_fp8_kv(cfg, *spec));
  FA_CHECK(fa::check_fp32(cfg, *spec));
  FA_CHECK(fa::check_head_dims(cfg, *spec));
  return FA_SUCCESS;
}

namespace {

// fa_generate and fa_generate_for: the module fa::api::kernel_spec_for
// selects, into buf.
fa_status generate_into(const fa_config *cfg, int raw_kind, int32_t sm,
                        const fa_generate_options *opts, char *buf, size_t buf_size,
                        size_t *ptx_size) {
  FA_CHECK(check_config(cfg));
  FA_REQUIRE(ptx_size != nullptr, "ptx_size is NULL");
  FA_REQUIRE(buf != nullptr || buf_size == 0, "buf is NULL but buf_size is %zu", buf_size);
  fa::KernelSpec spec;
  FA_CHECK(kernel_spec_for(cfg->cfg, raw_kind, sm, opts, fa::KernelPolicy::from_env(), &spec));
  const std::string ptx = fa::generate_ptx(spec);
  if (ptx.empty()) {  // a spec no generator takes: never an empty module
    return fail(FA_ERROR_UNSUPPORTED, "no kernel for %s", spec.describe().c_str());
  }
  *ptx_size = ptx.size();
  if (buf_size < ptx.size() + 1) {
    if (buf == nullptr) return FA_SUCCESS;  // size query
    return fail(FA_ERROR_BUFFER_TOO_SMALL, "buffer holds %zu bytes, the PTX needs %zu", buf_size,
                ptx.size() + 1);
  }
  std::memcpy(buf, ptx.c_str(), ptx.size() + 1);
  return FA_SUCCESS;
}

}  // namespace

extern "C" {

FA_API fa_status fa_generate_for(const fa_config *cfg, fa_kernel_kind kind, int32_t sm,
                                 const fa_generate_options *opts, char *buf, size_t buf_size,
                                 size_t *ptx_size) {
  return guarded("fa_generate_for", [&]() -> fa_status {
    // The kind as the caller stored it: reading a C caller's out-of-range
    // value as the enum type is undefined (raw_enum).
    return generate_into(cfg, raw_enum(kind), sm, opts, buf, buf_size, ptx_size);
  });
}

FA_API fa_status fa_generate(const fa_config *cfg, fa_kernel_kind kind, int32_t sm, char *buf,
                             size_t buf_size, size_t *ptx_size) {
  return guarded("fa_generate", [&]() -> fa_status {
    return generate_into(cfg, raw_enum(kind), sm, nullptr, buf, buf_size, ptx_size);
  });
}

// fa_forward_args of any released size, widened to this one's.
static fa_status widen_forward_args(const fa_forward_args *in, fa_forward_args *out) {
  return widen_args(in,
                    {FA_FORWARD_ARGS_SIZE_0_2, FA_FORWARD_ARGS_SIZE_0_4, FA_FORWARD_ARGS_SIZE_0_4_1,
                     FA_FORWARD_ARGS_SIZE_0_5, FA_FORWARD_ARGS_SIZE_0_7},
                    out);
}

FA_API fa_status fa_forward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                           const fa_forward_args *args, size_t *bytes) {
  return guarded("fa_forward_workspace_size", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(bytes != nullptr, "bytes is NULL");
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_forward_args a;
    FA_CHECK(widen_forward_args(args, &a));
    a.workspace = 0;  // not read
    a.workspace_size = 0;
    FA_CHECK(validate_forward(cfg->cfg, &a));
    *bytes = rt->impl->forward_workspace_bytes(cfg->cfg, a);
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_launch(fa_runtime *rt, const fa_config *cfg, const fa_forward_args *args,
                           void *stream) {
  return guarded("fa_launch", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_forward_args a;
    FA_CHECK(widen_forward_args(args, &a));
    FA_CHECK(validate_forward(cfg->cfg, &a));
    FA_CHECK(validate_descales(cfg->cfg, a.k_descale, a.v_descale, a.descale_stride, a.k, a.v));
    FA_CHECK(validate_q_fp8(cfg->cfg, a));
    FA_CHECK(check_forward_spans(cfg->cfg, a));
    return rt->impl->forward(cfg->cfg, a, stream);
  });
}

FA_API fa_status fa_decode_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                          const fa_decode_args *args, size_t *bytes,
                                          int32_t *num_splits) {
  return guarded("fa_decode_workspace_size", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(bytes != nullptr, "bytes is NULL");
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_decode_args a;
    FA_CHECK(widen_args(args,
                        {FA_DECODE_ARGS_SIZE_0_2, FA_DECODE_ARGS_SIZE_0_3, FA_DECODE_ARGS_SIZE_0_4,
                         FA_DECODE_ARGS_SIZE_0_4_1, FA_DECODE_ARGS_SIZE_0_5},
                        &a));
    FA_CHECK(validate_decode_sizes(&a));
    FA_CHECK(check_decode_limits(cfg->cfg, &a));
    fa::DecodePlan plan;
    FA_CHECK(check_decode_plan(*rt->impl, cfg->cfg, a, &plan));
    *bytes = plan.workspace_bytes;
    if (num_splits) *num_splits = plan.num_splits;
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_decode(fa_runtime *rt, const fa_config *cfg, const fa_decode_args *args,
                           void *stream) {
  return guarded("fa_decode", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_decode_args a;
    FA_CHECK(widen_args(args,
                        {FA_DECODE_ARGS_SIZE_0_2, FA_DECODE_ARGS_SIZE_0_3, FA_DECODE_ARGS_SIZE_0_4,
                         FA_DECODE_ARGS_SIZE_0_4_1, FA_DECODE_ARGS_SIZE_0_5},
                        &a));
    FA_CHECK(validate_decode(&a));
    FA_CHECK(check_alibi(cfg->cfg, a.alibi_slopes, a.alibi_slopes_stride));
    FA_CHECK(validate_descales(cfg->cfg, a.k_descale, a.v_descale, a.descale_stride, a.k_cache,
                               a.v_cache));
    FA_CHECK(validate_append(cfg->cfg, &a));
    FA_CHECK(check_decode_limits(cfg->cfg, &a));
    FA_CHECK(validate_decode_workspace(&a));
    fa::DecodePlan plan;
    FA_CHECK(check_decode_plan(*rt->impl, cfg->cfg, a, &plan));
    FA_CHECK(check_decode_spans(cfg->cfg, a));
    FA_CHECK(check_span("workspace", false, a.workspace, 1,
                        {{1, int64_t(plan.workspace_bytes), "1", "its bytes"}}));
    FA_CHECK(check_split_counters(cfg->cfg, a));
    return rt->impl->decode(cfg->cfg, a, stream);
  });
}

FA_API fa_status fa_decode_reduce(fa_runtime *rt, const fa_config *cfg, const fa_reduce_args *args,
                                  void *stream) {
  return guarded("fa_decode_reduce", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_reduce_args a;
    FA_CHECK(widen_args(args, {FA_REDUCE_ARGS_SIZE_0_3, FA_REDUCE_ARGS_SIZE_0_4}, &a));
    FA_CHECK(validate_reduce(&a));
    FA_CHECK(check_reduce_spans(cfg->cfg, a));
    return rt->impl->reduce(cfg->cfg, a, stream);
  });
}

FA_API fa_status fa_backward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                            const fa_backward_args *args, size_t *bytes) {
  return guarded("fa_backward_workspace_size", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(bytes != nullptr, "bytes is NULL");
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_backward_args a;
    fa::BackwardPlan plan;
    FA_CHECK(validate_backward(*rt->impl, cfg->cfg, args, false, &a, &plan));
    *bytes = plan.workspace_bytes;
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_backward(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *args,
                             void *stream) {
  return guarded("fa_backward", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_CHECK(check_config(cfg));
    FA_REQUIRE(args != nullptr, "args is NULL");
    fa_backward_args a;
    fa::BackwardPlan plan;
    FA_CHECK(validate_backward(*rt->impl, cfg->cfg, args, true, &a, &plan));
    return rt->impl->backward(cfg->cfg, a, stream);
  });
}

FA_API fa_status fa_cache_stats_get(fa_runtime *rt, fa_cache_stats *stats) {
  return guarded("fa_cache_stats_get", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_REQUIRE(stats != nullptr, "stats is NULL");
    // Output struct: a 0.1 caller's shorter struct gets only its fields.
    const bool v0_1 = stats->struct_size == FA_CACHE_STATS_SIZE_0_1;
    const bool v0_5 = stats->struct_size == FA_CACHE_STATS_SIZE_0_5;
    const bool v0_6 = stats->struct_size == FA_CACHE_STATS_SIZE_0_6;
    if (!v0_1 && !v0_5 && !v0_6)
      FA_CHECK(check_struct_size("stats", stats->struct_size, sizeof(fa_cache_stats)));
    const fa::Runtime::Counters &c = rt->impl->counters();
    const fa::cache::Stats s = rt->impl->store().stats();
    stats->memory_hits = c.memory_hits;
    stats->disk_hits = c.disk_hits;
    stats->misses = c.misses;
    stats->compiles = c.compiles;
    stats->discarded = s.discarded;
    stats->entries = s.entries;
    stats->bytes = s.bytes;
    stats->persistent = s.persistent ? 1 : 0;
    copy_cstr(stats->path, sizeof stats->path, s.path);
    copy_cstr(stats->note, sizeof stats->note, s.note);
    if (v0_1) return FA_SUCCESS;
    stats->collisions = s.collisions;
    stats->evicted = s.evicted;
    stats->resets = s.resets;
    stats->leases = s.leases;
    stats->leases_reclaimed = s.leases_reclaimed;
    stats->lease_waits = s.lease_found;
    stats->lease_timeouts = s.lease_timeouts;
    stats->max_bytes = s.max_bytes;
    if (v0_5) return FA_SUCCESS;
    const fa::CompilerInfo ci = rt->impl->backend().compiler();
    stats->compiler_mode = ci.mode;
    copy_cstr(stats->compiler, sizeof stats->compiler, ci.version);
    copy_cstr(stats->compiler_note, sizeof stats->compiler_note, ci.note);
    stats->cubin_refusals = c.cubin_refusals;
    if (v0_6) return FA_SUCCESS;
    stats->remote_hits = s.remote_hits;
    stats->remote_misses = s.remote_misses;
    stats->remote_puts = s.remote_puts;
    stats->remote_errors = s.remote_errors;
    stats->remote_discarded = s.remote_discarded;
    copy_cstr(stats->kernel_store, sizeof stats->kernel_store, s.kernel_store);
    copy_cstr(stats->kernel_store_note, sizeof stats->kernel_store_note, s.kernel_store_note);
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_cache_list(fa_runtime *rt, fa_cache_entry_fn fn, void *user) {
  return guarded("fa_cache_list", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_REQUIRE(fn != nullptr, "fn is NULL");
    for (const fa::cache::RowInfo &row : rt->impl->store().list()) {
      fa_cache_entry e;
      std::memset(&e, 0, sizeof e);
      e.struct_size = sizeof e;
      copy_cstr(e.key, sizeof e.key, row.key_hex);
      e.spec = row.spec_text.c_str();
      e.sm = row.sm;
      e.generator_version = row.generator_version;
      e.ptx_bytes = row.ptx_bytes;
      e.cubin_bytes = row.cubin_bytes;
      e.hits = row.hits;
      e.created = row.created;
      e.last_used = row.last_used;
      e.compiler = row.compiler.c_str();
      if (fn(&e, user) != 0) break;
    }
    return FA_SUCCESS;
  });
}

FA_API fa_status fa_cache_clear(fa_runtime *rt) {
  return guarded("fa_cache_clear", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    return rt->impl->store().clear();
  });
}

FA_API fa_status fa_emulator_profile(fa_runtime *rt, fa_emu_profile *out) {
  return guarded("fa_emulator_profile", [&]() -> fa_status {
    FA_CHECK(check_runtime(rt));
    FA_REQUIRE(out != nullptr, "out is NULL");
    FA_CHECK(check_struct_size("out", out->struct_size, sizeof(fa_emu_profile)));
    const fa::Backend &be = rt->impl->backend();
    if (be.kind() != FA_BACKEND_EMULATOR)
      return fail(FA_ERROR_UNSUPPORTED, "rt runs on the cuda backend; profiles are emulator-only");
    fa::emu::LaunchProfile p;
    FA_CHECK(be.last_profile(&p));
    copy_cstr(out->kernel, sizeof out->kernel, p.entry);
    copy_counters(p.total, &out->total);
    copy_counters(p.main_loop, &out->main_loop);
    out->main_loop_first_line = p.loop.first_line;
    out->main_loop_last_line = p.loop.last_line;
    out->main_loop_worst_conflict_line = p.loop_worst_conflict_line;
    out->main_loop_worst_sector_line = p.loop_worst_sector_line;
    return FA_SUCCESS;
  });
}

}  // extern "C"
