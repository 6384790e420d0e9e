// `flashattn run` (fa_launch) and `flashattn decode` (fa_decode): load .npy
// inputs, round them to the kernel dtype, run twice (cold, then warm), and
// check O and LSE against the fp64 reference on the same rounded inputs.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "reference.h"
#include "util.h"

namespace fa::cli {
namespace {

// Shapes of the Q/K/V inputs, checked against each other.
struct Dims {
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
};

Dims check_shapes(const npy::Array &q, const npy::Array &k, const npy::Array &v, const char *k_opt,
                  const char *v_opt) {
  Dims d;
  d.batch = int(q.shape[0]);
  d.seqlen_q = int(q.shape[1]);
  d.heads_q = int(q.shape[2]);
  d.head_dim = int(q.shape[3]);
  d.seqlen_k = int(k.shape[1]);
  d.heads_kv = int(k.shape[2]);
  d.head_dim_v = int(v.shape[3]);
  auto mismatch = [&](const std::string &what) {
    throw Failure(kExitUsage, "shape mismatch: " + what + " (q " + q.shape_string() + ", " + k_opt +
                                  " " + k.shape_string() + ", " + v_opt + " " + v.shape_string() +
                                  ")");
  };
  if (k.shape[0] != d.batch || v.shape[0] != d.batch) mismatch("batch (dim 0) differs");
  if (v.shape[1] != d.seqlen_k) mismatch("seqlen_k (dim 1) of k and v differs");
  if (v.shape[2] != d.heads_kv) mismatch("num_heads_kv (dim 2) of k and v differs");
  if (k.shape[3] != d.head_dim) mismatch("head_dim (dim 3) of q and k differs");
  if (d.heads_q % d.heads_kv != 0) mismatch("num_heads_q is not a multiple of num_heads_kv");
  return d;
}

fa_config_desc make_desc(const AttentionOptions &a, fa_dtype dtype, const Dims &d) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = dtype;
  desc.head_dim = d.head_dim;
  desc.head_dim_v = d.head_dim_v;
  desc.num_heads_q = d.heads_q;
  desc.num_heads_kv = d.heads_kv;
  desc.causal = a.causal ? 1 : 0;
  desc.window_left = a.window_left;
  desc.window_right = a.window_right;
  desc.softmax_scale = float(a.softmax_scale);
  desc.softcap = float(a.softcap);
  return desc;
}

fa::ref::Problem make_problem(const fa_config_desc &desc, const Dims &d) {
  fa::ref::Problem p;
  p.batch = d.batch;
  p.seqlen_q = d.seqlen_q;
  p.seqlen_k = d.seqlen_k;
  p.num_heads_q = d.heads_q;
  p.num_heads_kv = d.heads_kv;
  p.head_dim = d.head_dim;
  p.head_dim_v = d.head_dim_v;
  p.causal = desc.causal != 0;
  p.window_left = desc.window_left;
  p.window_right = desc.window_right;
  p.softmax_scale = desc.softmax_scale;
  p.softcap = desc.softcap;
  return p;
}

void print_problem(const char *kind, const fa_config_desc &desc, const Dims &d) {
  std::printf(
      "problem:     %s batch %d, seqlen_q %d, seqlen_k %d, heads %d/%d, head_dim %d/%d, "
      "%s%s, window (%d, %d), softcap %g, scale %s\n",
      kind, d.batch, d.seqlen_q, d.seqlen_k, d.heads_q, d.heads_kv, d.head_dim, d.head_dim_v,
      desc.dtype == FA_DTYPE_BF16 ? "bf16" : "fp16", desc.causal ? ", causal" : "",
      desc.window_left, desc.window_right, double(desc.softcap),
      desc.softmax_scale > 0 ? std::to_string(desc.softmax_scale).c_str() : "1/sqrt(head_dim)");
}

// The device-side tensors shared by run and decode.
struct DeviceIo {
  DeviceBuffer q, k, v, o, lse;
  DeviceIo(const Runtime &rt, const Dims &d, const Rounded &qr, const Rounded &kr,
           const Rounded &vr)
      : q(rt, qr.bits.size() * 2, "q"),
        k(rt, kr.bits.size() * 2, "k"),
        v(rt, vr.bits.size() * 2, "v"),
        o(rt, size_t(d.batch) * d.seqlen_q * d.heads_q * d.head_dim_v * 2, "o"),
        lse(rt, size_t(d.batch) * d.heads_q * d.seqlen_q * 4, "lse") {
    q.upload(qr.bits.data(), q.bytes());
    k.upload(kr.bits.data(), k.bytes());
    v.upload(vr.bits.data(), v.bytes());
  }
  // Fills O and LSE with NaN bit patterns so an unwritten element shows up as
  // non-finite in the report.
  void poison() {
    o.fill(0xff);
    lse.fill(0xff);
  }
  void download(fa_dtype dtype, Outcome *out) const {
    std::vector<uint16_t> bits(o.bytes() / 2);
    o.download(bits.data(), o.bytes());
    out->o = to_float(bits, dtype);
    out->lse.resize(lse.bytes() / 4);
    lse.download(out->lse.data(), lse.bytes());
  }
};

}  // namespace

int cmd_run(const RunOptions &opts) {
  const fa_dtype dtype = parse_dtype(opts.attn.dtype);
  check_writable(opts.out, "--out");
  check_writable(opts.lse_out, "--lse-out");
  const npy::Array q = load_array(opts.q, "--q", 4, true);
  const npy::Array k = load_array(opts.k, "--k", 4, true);
  const npy::Array v = load_array(opts.v, "--v", 4, true);
  const Dims d = check_shapes(q, k, v, "k", "v");
  Outcome r;
  r.dtype = dtype;
  r.o_shape = {d.batch, d.seqlen_q, d.heads_q, d.head_dim_v};
  r.ref_file = load_reference(opts.ref, r.o_shape);
  const fa_config_desc desc = make_desc(opts.attn, dtype, d);
  const Config cfg(desc);
  const Runtime rt(parse_backend(opts.backend));
  print_device(rt);
  print_problem("forward", desc, d);

  const Rounded qr = round_input(q, dtype), kr = round_input(k, dtype), vr = round_input(v, dtype);
  DeviceIo io(rt, d, qr, kr, vr);
  fa_forward_args args{};  // FA_FORWARD_ARGS_INIT warns under -Wextra in C++
  args.struct_size = sizeof(args);
  args.batch = d.batch;
  args.seqlen_q = d.seqlen_q;
  args.seqlen_k = d.seqlen_k;
  args.q = contiguous(io.q.ptr(), d.seqlen_q, d.heads_q, d.head_dim);
  args.k = contiguous(io.k.ptr(), d.seqlen_k, d.heads_kv, d.head_dim);
  args.v = contiguous(io.v.ptr(), d.seqlen_k, d.heads_kv, d.head_dim_v);
  args.o = contiguous(io.o.ptr(), d.seqlen_q, d.heads_q, d.head_dim_v);
  args.lse = io.lse.ptr();
  auto launch = [&] { check(fa_launch(rt.get(), cfg.get(), &args, nullptr), "fa_launch"); };

  io.poison();
  r.first_ms = timed_ms(rt, launch);
  io.poison();
  r.warm_ms = timed_ms(rt, launch);
  io.download(dtype, &r);

  r.o_ref.resize(r.o.size());
  r.lse_ref.resize(r.lse.size());
  fa::ref::attention(make_problem(desc, d), qr.values.data(), kr.values.data(), vr.values.data(),
                     r.o_ref.data(), r.lse_ref.data());
  return report(opts, rt, r);
}

int cmd_decode(const RunOptions &opts) {
  const fa_dtype dtype = parse_dtype(opts.attn.dtype);
  check_writable(opts.out, "--out");
  check_writable(opts.lse_out, "--lse-out");
  const npy::Array q = load_array(opts.q, "--q", 4, true);
  const npy::Array k = load_array(opts.k, "--k-cache", 4, true);
  const npy::Array v = load_array(opts.v, "--v-cache", 4, true);
  const Dims d = check_shapes(q, k, v, "k_cache", "v_cache");
  const npy::Array s = load_array(opts.cache_seqlens, "--cache-seqlens", 1, false);
  if (s.shape[0] != d.batch) {
    throw Failure(kExitUsage, "--cache-seqlens: " + opts.cache_seqlens + " has shape " +
                                  s.shape_string() + ", expected [" + std::to_string(d.batch) +
                                  "] (the batch of q)");
  }
  std::vector<int32_t> seqlens;
  for (int64_t x : s.to_i64()) {
    if (x < 0 || x > d.seqlen_k) {
      throw Failure(kExitUsage, "--cache-seqlens: value " + std::to_string(x) +
                                    " is outside [0, seqlen_k_max = " + std::to_string(d.seqlen_k) +
                                    "]");
    }
    seqlens.push_back(int32_t(x));
  }
  Outcome r;
  r.dtype = dtype;
  r.o_shape = {d.batch, d.seqlen_q, d.heads_q, d.head_dim_v};
  r.ref_file = load_reference(opts.ref, r.o_shape);
  const fa_config_desc desc = make_desc(opts.attn, dtype, d);
  const Config cfg(desc);
  const Runtime rt(parse_backend(opts.backend));
  print_device(rt);
  print_problem("decode", desc, d);

  const Rounded qr = round_input(q, dtype), kr = round_input(k, dtype), vr = round_input(v, dtype);
  DeviceIo io(rt, d, qr, kr, vr);
  DeviceBuffer seq(rt, seqlens.size() * 4, "cache_seqlens");
  seq.upload(seqlens.data(), seq.bytes());

  fa_decode_args args{};  // FA_DECODE_ARGS_INIT warns under -Wextra in C++
  args.struct_size = sizeof(args);
  args.batch = d.batch;
  args.seqlen_q = d.seqlen_q;
  args.seqlen_k_max = d.seqlen_k;
  args.q = contiguous(io.q.ptr(), d.seqlen_q, d.heads_q, d.head_dim);
  args.k_cache = contiguous(io.k.ptr(), d.seqlen_k, d.heads_kv, d.head_dim);
  args.v_cache = contiguous(io.v.ptr(), d.seqlen_k, d.heads_kv, d.head_dim_v);
  args.cache_seqlens = seq.ptr();
  args.num_splits = opts.num_splits;
  args.o = contiguous(io.o.ptr(), d.seqlen_q, d.heads_q, d.head_dim_v);
  args.lse = io.lse.ptr();
  size_t ws_bytes = 0;
  int32_t splits = 0;
  check(fa_decode_workspace_size(rt.get(), cfg.get(), &args, &ws_bytes, &splits),
        "fa_decode_workspace_size", kExitUsage);
  const std::string how =
      opts.num_splits ? "requested " + std::to_string(opts.num_splits) : std::string("automatic");
  std::printf("splits:      %d (%s), workspace %zu bytes\n", splits, how.c_str(), ws_bytes);
  DeviceBuffer ws(rt, ws_bytes, "workspace");
  args.workspace = ws.ptr();
  args.workspace_size = ws_bytes;
  auto launch = [&] { check(fa_decode(rt.get(), cfg.get(), &args, nullptr), "fa_decode"); };

  io.poison();
  r.first_ms = timed_ms(rt, launch);
  io.poison();
  r.warm_ms = timed_ms(rt, launch);
  io.download(dtype, &r);

  r.o_ref.resize(r.o.size());
  r.lse_ref.resize(r.lse.size());
  fa::ref::attention(make_problem(desc, d), qr.values.data(), kr.values.data(), vr.values.data(),
                     r.o_ref.data(), r.lse_ref.data(), seqlens.data());
  return report(opts, rt, r);
}

}  // namespace fa::cli
