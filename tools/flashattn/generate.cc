// `flashattn generate`: the PTX module of one kernel, via fa_generate_for
// (the launch shape from --kv-layout, --page-size, --varlen, --seqused-k
// and the feature flags).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "kv_cache.h"
#include "util.h"

namespace fa::cli {
namespace {

fa_kernel_kind parse_kind(const std::string &kind) {
  if (kind == "forward") return FA_KERNEL_FORWARD;
  if (kind == "decode") return FA_KERNEL_DECODE;
  if (kind == "reduce") return FA_KERNEL_REDUCE;
  if (kind == "backward-pre") return FA_KERNEL_BACKWARD_PRE;
  if (kind == "backward") return FA_KERNEL_BACKWARD;
  if (kind == "backward-post") return FA_KERNEL_BACKWARD_POST;
  throw Failure(kExitUsage,
                "unknown kernel kind '" + kind +
                    "' (forward, decode, reduce, backward-pre, backward or backward-post)");
}

bool is_backward(fa_kernel_kind k) {
  return k == FA_KERNEL_BACKWARD_PRE || k == FA_KERNEL_BACKWARD || k == FA_KERNEL_BACKWARD_POST;
}

}  // namespace

int cmd_generate(const GenerateOptions &o) {
  const fa_kernel_kind kind = parse_kind(o.kind);
  const bool shaped = !o.kv_layout.empty() || o.page_size != 0 || o.seqused_k;
  const KvKind kv = parse_kv_layout(o.kv_layout, o.page_size);
  if (shaped && kind == FA_KERNEL_REDUCE) {
    throw Failure(kExitUsage,
                  "--kv-layout, --page-size and --seqused-k are for --kind forward or decode, not "
                  "reduce");
  }
  if (is_backward(kind) && (kv != KvKind::Contiguous || o.seqused_k)) {
    throw Failure(kExitUsage,
                  "--kv-layout paged|ptrs, --page-size and --seqused-k are not for the backward "
                  "kinds (fa_backward takes a contiguous K/V and no seqused_k)");
  }
  if (o.seqused_k && kind != FA_KERNEL_FORWARD) {
    throw Failure(kExitUsage, "--seqused-k is for --kind forward (decode reads cache_seqlens)");
  }
  if (o.varlen && kind != FA_KERNEL_FORWARD && !is_backward(kind)) {
    throw Failure(kExitUsage,
                  "--varlen is for --kind forward and the backward kinds (decode and reduce have "
                  "no varlen variant)");
  }
  if (o.tree_mask && kind != FA_KERNEL_DECODE) {
    throw Failure(kExitUsage, "--tree-mask is for --kind decode");
  }
  if (o.sinks && kind == FA_KERNEL_DECODE) {
    throw Failure(kExitUsage,
                  "--sinks is for --kind forward, reduce or the backward kinds (decode adds the "
                  "sinks in its combine, the reduce kernel)");
  }
  if (o.alibi && kind == FA_KERNEL_REDUCE) {
    throw Failure(kExitUsage, "--alibi is for --kind forward, decode or the backward kinds");
  }
  if ((o.append_kv || !o.rotary.empty() || o.rotary_table16) && kind != FA_KERNEL_DECODE) {
    throw Failure(kExitUsage, "--append-kv, --rotary and --rotary-table16 are for --kind decode");
  }
  if (o.rotary_table16 && o.rotary.empty()) {
    throw Failure(kExitUsage, "--rotary-table16 needs --rotary");
  }
  const bool in2 = o.lse_partial_format == "base2", out2 = o.lse_format == "base2";
  if ((in2 || out2) && kind != FA_KERNEL_REDUCE) {
    throw Failure(kExitUsage, "--lse-partial-format and --lse-format are for --kind reduce");
  }
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = parse_dtype(o.attn.dtype);
  desc.head_dim = o.head_dim;
  desc.head_dim_v = o.head_dim_v;
  desc.num_heads_q = o.heads_q;
  desc.num_heads_kv = o.heads_kv;
  desc.causal = o.attn.causal ? 1 : 0;
  desc.window_left = o.attn.window_left;
  desc.window_right = o.attn.window_right;
  desc.softmax_scale = float(o.attn.softmax_scale);
  desc.softcap = float(o.attn.softcap);
  if (!o.q_dtype.empty() && kind != FA_KERNEL_FORWARD)
    throw Failure(kExitUsage, "--q-dtype is for --kind forward (the fp8 forward)");
  if (!o.kv_dtype.empty() && kind != FA_KERNEL_DECODE && o.q_dtype.empty())
    throw Failure(kExitUsage,
                  "--kv-dtype is for --kind decode (an fp8 KV cache), or --kind forward with "
                  "--q-dtype");
  // The fp8 forward's K/V default to Q's format.
  const std::string kv_fmt = o.kv_dtype.empty() ? o.q_dtype : o.kv_dtype;
  if (!kv_fmt.empty()) desc.kv_dtype = kv_fmt == "e5m2" ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
  if (!o.q_dtype.empty())
    desc.q_dtype = o.q_dtype == "e5m2" ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
  const Config cfg(desc);

  fa_generate_options go = FA_GENERATE_OPTIONS_INIT;
  go.kv_layout = kv == KvKind::Paged  ? FA_KV_PAGED
                 : kv == KvKind::Ptrs ? FA_KV_PTR_ARRAY
                                      : FA_KV_CONTIGUOUS;
  go.page_size = kv == KvKind::Paged ? o.page_size : 0;
  go.varlen = o.varlen ? 1 : 0;
  go.seqused_k = o.seqused_k ? 1 : 0;
  go.tree_mask = o.tree_mask ? 1 : 0;
  go.sinks = o.sinks ? 1 : 0;
  go.alibi = o.alibi ? 1 : 0;
  go.append_kv = o.append_kv || !o.rotary.empty() ? 1 : 0;
  go.v_in_k = o.v_in_k ? 1 : 0;
  go.rotary = o.rotary == "neox" ? 1 : o.rotary == "gptj" ? 2 : 0;
  go.rotary_dtype = o.rotary_table16 ? desc.dtype : 0;
  go.lse_partial_format = in2 ? FA_LSE_BASE2 : FA_LSE_NATURAL;
  go.lse_format = out2 ? FA_LSE_BASE2 : FA_LSE_NATURAL;
  size_t size = 0;
  check(fa_generate_for(cfg.get(), kind, o.sm, &go, nullptr, 0, &size), "fa_generate_for",
        kExitUsage);
  std::vector<char> buf(size + 1);
  check(fa_generate_for(cfg.get(), kind, o.sm, &go, buf.data(), buf.size(), &size),
        "fa_generate_for");
  size = strnlen(buf.data(), buf.size());
  const std::string ptx(buf.data(), size);

  FILE *f = o.output.empty() ? stdout : std::fopen(o.output.c_str(), "wb");
  if (!f) throw Failure(kExitFail, o.output + ": " + std::strerror(errno));
  const bool written = std::fwrite(ptx.data(), 1, ptx.size(), f) == ptx.size();
  const bool closed = f == stdout ? std::fflush(f) == 0 : std::fclose(f) == 0;
  if (!written || !closed) {
    throw Failure(kExitFail,
                  (o.output.empty() ? std::string("stdout") : o.output) + ": write failed");
  }
  return kExitOk;
}

}  // namespace fa::cli
