// Kernel specs: tile choice, canonical serialisation, names, PTX ISA
// version, launch geometry, and the generate_ptx dispatch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/codegen.h"

namespace fa {
namespace {

const char *kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Forward:
      return "forward";
    case KernelKind::Decode:
      return "decode";
    default:
      return "reduce";
  }
}
const char *dtype_name(Dtype d) { return d == Dtype::BF16 ? "bf16" : "f16"; }

void put32(std::string &o, int32_t v) {
  uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) o.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

// ceil(a / b) for a >= 0, b > 0, without overflow.
int64_t ceil_div(int64_t a, int64_t b) { return a > 0 ? (a - 1) / b + 1 : 0; }

// A grid dimension; values past UINT32_MAX saturate there, so the runtime's
// limit check (grid x < 2^31, y and z <= 65535) rejects them instead of
// launching a truncated grid.
uint32_t grid_dim(int64_t n) {
  return n > int64_t(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(n < 0 ? 0 : n);
}

// Largest rows_per_warp in {4, 2, 1} whose layout fits static shared memory.
int fit_rows_per_warp(KernelSpec s, int max_rows) {
  for (int r = max_rows; r > 1; r /= 2) {
    s.block_m = s.num_warps * r;
    if (kgen::attention_layout(s).total() <= kgen::kStaticSmemLimit) return r;
  }
  return 1;
}

// Dynamic shared memory one CTA may use (CUDA C Programming Guide,
// "Technical Specifications per Compute Capability"): 163 KB on 8.0/8.7,
// 227 KB on 9.0, 99 KB on 8.6/8.9 and anything else.
uint32_t tc_smem_budget(int sm) {
  if (sm == 80 || sm == 87) return 163 * 1024;
  if (sm >= 90) return 227 * 1024;
  return 99 * 1024;
}

// FLASHATTN_SCALAR_FORWARD=1 selects the scalar fp32 forward kernel (a
// fallback for debugging the tensor-core path).
bool tc_forward_enabled() {
  const char *v = std::getenv("FLASHATTN_SCALAR_FORWARD");
  return !(v && v[0] == '1');
}

bool spec_valid(const KernelSpec &s) {
  bool dv_ok = s.head_dim_v >= 8 && s.head_dim_v <= 256 && s.head_dim_v % 8 == 0;
  bool w_ok = s.num_warps >= 1 && s.num_warps <= 32;
  if (s.kind == KernelKind::Reduce) return dv_ok && w_ok && s.block_m == s.num_warps;
  bool d_ok = s.head_dim >= 8 && s.head_dim <= 256 && s.head_dim % 8 == 0;
  if (s.mma)
    return d_ok && dv_ok && w_ok && s.kind == KernelKind::Forward && s.sm >= 80 &&
           s.block_m == 16 * s.num_warps && s.block_n >= 16 && s.block_n % 16 == 0 &&
           s.block_n <= 128 && s.stages >= 2 && s.stages <= 3;
  return d_ok && dv_ok && w_ok && s.block_n == 32 && s.group_size >= 1 &&
         s.block_m % s.num_warps == 0 && s.block_m > 0;
}

}  // namespace

std::string KernelSpec::serialize() const {
  std::string o = "FASPEC1";
  o.push_back(static_cast<char>(kind));
  o.push_back(static_cast<char>(dtype));
  put32(o, sm);
  put32(o, head_dim);
  put32(o, head_dim_v);
  put32(o, group_size);
  o.push_back(softcap ? 1 : 0);
  o.push_back(varlen ? 1 : 0);
  put32(o, block_m);
  put32(o, block_n);
  put32(o, num_warps);
  o.push_back(mma ? 1 : 0);
  put32(o, stages);
  return o;
}

std::string KernelSpec::describe() const {
  char buf[160], st[16] = "";
  if (mma) std::snprintf(st, sizeof st, " s%d", stages);
  std::snprintf(buf, sizeof buf, "%s %s sm%d d%d dv%d g%d bm%d bn%d w%d%s%s%s%s", kind_name(kind),
                dtype_name(dtype), sm, head_dim, head_dim_v, group_size, block_m, block_n,
                num_warps, softcap ? " softcap" : "", varlen ? " varlen" : "", mma ? " mma" : "",
                st);
  return buf;
}

// Tiles (scalar fp32 kernels, docs/kernels.md): block_n = 32 (lane = key);
// forward: 4 warps x up to 4 rows each, fewer rows when shared memory is
// short; decode: one warp per query head of the GQA group (at most 4), up
// to 4 rows each; reduce: 4 warps, one row each. group_size is only part of
// the spec for decode (forward reads the head ratio at run time).
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, int sm, bool varlen) {
  KernelSpec s;
  s.kind = kind;
  s.dtype = cfg.dtype;
  s.sm = sm;
  s.head_dim_v = cfg.head_dim_v > 0 ? cfg.head_dim_v : cfg.head_dim;
  if (kind == KernelKind::Reduce) {
    s.num_warps = 4;
    s.block_m = 4;
    return s;
  }
  s.head_dim = cfg.head_dim;
  s.softcap = cfg.softcap > 0;
  s.block_n = 32;
  if (kind == KernelKind::Forward && sm >= 80 && tc_forward_enabled()) {
    // Tensor-core kernel (docs/kernels.md, tile table): 4 warps x 16 rows;
    // block_n 64 while the head dims (rounded up to 16) fit 128, else 32,
    // which keeps the f32 accumulators within the register file; a 3-stage
    // K/V ring where it fits the target's shared memory per block, else 2
    // (which fits 99 KB for every head dim).
    s.varlen = varlen;
    s.mma = true;
    s.num_warps = 4;
    s.block_m = 64;
    const int dmax = std::max(s.head_dim, s.head_dim_v);
    s.block_n = dmax <= 128 ? 64 : 32;
    s.stages = 3;
    if (kgen::tc_layout(s).total > tc_smem_budget(sm)) s.stages = 2;
  } else if (kind == KernelKind::Forward) {
    s.varlen = varlen;
    s.num_warps = 4;
    s.block_m = s.num_warps * fit_rows_per_warp(s, 4);
  } else {
    int g = cfg.num_heads_kv > 0 ? cfg.num_heads_q / cfg.num_heads_kv : 1;
    s.group_size = g < 1 ? 1 : g;
    s.num_warps = s.group_size < 4 ? s.group_size : 4;
    int want = static_cast<int>(ceil_div(s.group_size, s.num_warps));
    s.block_m = s.num_warps * fit_rows_per_warp(s, want > 4 ? 4 : want);
  }
  return s;
}

int ptx_isa_version(const KernelSpec &spec) {
  // .target sm_80 needs PTX 7.0, sm_86 7.1, sm_87 7.4, sm_89 and sm_90 7.8
  // (PTX ISA, "PTX Module Directives: .target"); every instruction used is
  // older (cvt.rn.bf16.f32: 7.0 with sm_80).
  if (spec.sm <= 80) return 70;
  if (spec.sm <= 86) return 71;
  if (spec.sm <= 87) return 74;
  return 78;
}

std::string entry_name(const KernelSpec &s) {
  char buf[128];
  if (s.kind == KernelKind::Reduce) {
    std::snprintf(buf, sizeof buf, "fa_reduce_%s_dv%d_w%d", dtype_name(s.dtype), s.head_dim_v,
                  s.num_warps);
  } else {
    char st[16] = "";
    if (s.mma) std::snprintf(st, sizeof st, "_s%d", s.stages);
    std::snprintf(buf, sizeof buf, "fa_%s%s_%s_d%d_dv%d_g%d_bm%d_bn%d_w%d%s%s%s", kind_name(s.kind),
                  s.mma ? "_mma" : "", dtype_name(s.dtype), s.head_dim, s.head_dim_v, s.group_size,
                  s.block_m, s.block_n, s.num_warps, st, s.softcap ? "_softcap" : "",
                  s.varlen ? "_varlen" : "");
  }
  return buf;
}

std::string generate_ptx(const KernelSpec &spec) {
  if (!spec_valid(spec)) return {};
  if (spec.kind == KernelKind::Reduce) return kgen::generate_reduce(spec);
  if (spec.mma) return kgen::generate_forward_tc(spec);
  return kgen::generate_attention(spec);
}

LaunchGeometry forward_geometry(const KernelSpec &spec, const ForwardParams &p) {
  LaunchGeometry g;
  g.grid[0] = grid_dim(ceil_div(p.seqlen_q, spec.block_m));
  g.grid[1] = grid_dim(p.num_heads_q);
  g.grid[2] = grid_dim(p.batch);
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  g.smem_bytes = max_dynamic_smem(spec);
  return g;
}

LaunchGeometry decode_geometry(const KernelSpec &spec, const DecodeParams &p) {
  LaunchGeometry g;
  g.grid[0] = grid_dim(p.num_splits);
  g.grid[1] = grid_dim(int64_t(p.num_heads_kv) *
                       ceil_div(int64_t(spec.group_size) * p.seqlen_q, spec.block_m));
  g.grid[2] = grid_dim(p.batch);
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  return g;
}

LaunchGeometry reduce_geometry(const KernelSpec &spec, const ReduceParams &p) {
  LaunchGeometry g;
  int64_t rows;  // batch * seqlen_q * num_heads_q, which may pass 2^63
  if (__builtin_mul_overflow(int64_t(p.batch) * p.seqlen_q, int64_t(p.num_heads_q), &rows)) {
    g.grid[0] = UINT32_MAX;
  } else {
    g.grid[0] = grid_dim(ceil_div(rows, spec.num_warps));
  }
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  return g;
}

// The tensor-core forward kernel uses dynamic shared memory only
// (kgen::tc_layout); the scalar kernels static memory only (<= 48 KB, see
// kgen::attention_layout).
uint32_t max_dynamic_smem(const KernelSpec &spec) {
  if (spec.kind == KernelKind::Forward && spec.mma) return kgen::tc_layout(spec).total;
  return 0;
}

}  // namespace fa
