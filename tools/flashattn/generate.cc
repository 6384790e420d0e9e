// `flashattn generate`: the PTX module of one kernel, via fa_generate.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "util.h"

namespace fa::cli {

int cmd_generate(const GenerateOptions &o) {
  fa_kernel_kind kind;
  if (o.kind == "forward") {
    kind = FA_KERNEL_FORWARD;
  } else if (o.kind == "decode") {
    kind = FA_KERNEL_DECODE;
  } else if (o.kind == "reduce") {
    kind = FA_KERNEL_REDUCE;
  } else {
    throw Failure(kExitUsage, "unknown kernel kind '" + o.kind + "' (forward, decode or reduce)");
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
  const Config cfg(desc);

  size_t size = 0;
  check(fa_generate(cfg.get(), kind, o.sm, nullptr, 0, &size), "fa_generate", kExitUsage);
  std::vector<char> buf(size + 1);
  check(fa_generate(cfg.get(), kind, o.sm, buf.data(), buf.size(), &size), "fa_generate");
  size = strnlen(buf.data(), buf.size());

  FILE *f = o.output.empty() ? stdout : std::fopen(o.output.c_str(), "wb");
  if (!f) throw Failure(kExitFail, o.output + ": " + std::strerror(errno));
  const bool written = std::fwrite(buf.data(), 1, size, f) == size;
  const bool closed = f == stdout ? std::fflush(f) == 0 : std::fclose(f) == 0;
  if (!written || !closed) {
    throw Failure(kExitFail,
                  (o.output.empty() ? std::string("stdout") : o.output) + ": write failed");
  }
  return kExitOk;
}

}  // namespace fa::cli
