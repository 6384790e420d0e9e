// `flashattn run` (fa_launch) and `flashattn decode` (fa_decode): load .npy
// inputs, round them to the kernel dtype, lay K/V out as --kv-layout says,
// run twice (cold, then warm), and check O and LSE against the fp64
// reference on the same rounded inputs; a paged or pointer-array run is
// also compared with the same launch on the contiguous cache.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "kv_cache.h"
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

// The problem line ends with the KV layout (and, for decode, batch
// invariance): the summary of what ran.
void print_problem(const char *kind, const fa_config_desc &desc, const Dims &d, KvKind kv,
                   int page_size, bool batch_invariant) {
  std::string layout = kv_kind_name(kv);
  if (kv == KvKind::Paged) layout += " (page_size " + std::to_string(page_size) + ")";
  std::printf(
      "problem:     %s batch %d, seqlen_q %d, seqlen_k %d, heads %d/%d, head_dim %d/%d, "
      "%s%s, window (%d, %d), softcap %g, scale %s, kv %s%s\n",
      kind, d.batch, d.seqlen_q, d.seqlen_k, d.heads_q, d.heads_kv, d.head_dim, d.head_dim_v,
      desc.dtype == FA_DTYPE_BF16 ? "bf16" : "fp16", desc.causal ? ", causal" : "",
      desc.window_left, desc.window_right, double(desc.softcap),
      desc.softmax_scale > 0 ? std::to_string(desc.softmax_scale).c_str() : "1/sqrt(head_dim)",
      layout.c_str(), batch_invariant ? ", batch-invariant" : "");
}

// Valid keys per sequence from an integer .npy [batch], each in [0, limit].
std::vector<int32_t> load_lengths(const std::string &path, const char *option, int batch, int limit,
                                  const char *limit_name) {
  const npy::Array s = load_array(path, option, 1, false);
  if (s.shape[0] != batch) {
    throw Failure(kExitUsage, std::string(option) + ": " + path + " has shape " + s.shape_string() +
                                  ", expected [" + std::to_string(batch) + "] (the batch of q)");
  }
  std::vector<int32_t> lens;
  for (int64_t x : s.to_i64()) {
    if (x < 0 || x > limit) {
      throw Failure(kExitUsage, std::string(option) + ": value " + std::to_string(x) +
                                    " is outside [0, " + limit_name + " = " +
                                    std::to_string(limit) + "]");
    }
    lens.push_back(int32_t(x));
  }
  return lens;
}

// decode --tree-mask: a bool or integer .npy [batch or 1, seqlen_q,
// seqlen_q], nonzero = visible, as 0/1 bytes [batch][seqlen_q][seqlen_q]
// (the reference's form) and packed into rows of 32-bit words (the
// kernel's: flashattn.h, fa_decode_args.tree_mask). *shared: one tree.
std::vector<uint8_t> load_tree_mask(const std::string &path, int batch, int seqlen_q,
                                    std::vector<uint32_t> *packed, bool *shared) {
  const npy::Array m = load_array(path, "--tree-mask", 3, false);
  const int64_t sq = seqlen_q;
  if ((m.shape[0] != batch && m.shape[0] != 1) || m.shape[1] != sq || m.shape[2] != sq) {
    throw Failure(kExitUsage, "--tree-mask: " + path + " has shape " + m.shape_string() +
                                  ", expected [" + std::to_string(batch) + " or 1, " +
                                  std::to_string(sq) + ", " + std::to_string(sq) +
                                  "] (batch, seqlen_q, seqlen_q of q)");
  }
  *shared = m.shape[0] == 1;
  const std::vector<int64_t> v = m.to_i64();
  const int words = (seqlen_q + 31) / 32;
  packed->assign(v.size() / size_t(sq) * words, 0);
  std::vector<uint8_t> bits(size_t(batch) * sq * sq);
  for (size_t r = 0; r < v.size() / size_t(sq); ++r)
    for (int64_t j = 0; j < sq; ++j)
      if (v[r * sq + j] != 0) (*packed)[r * words + size_t(j / 32)] |= 1u << (j % 32);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = v[i % v.size()] != 0;
  return bits;
}

// --sinks: a float .npy [heads_q] (flashattn.h, fa_forward_args.sinks); empty
// path = none.
std::vector<float> load_sinks(const std::string &path, int heads_q) {
  if (path.empty()) return {};
  const npy::Array s = load_array(path, "--sinks", 1, true);
  if (s.shape[0] != heads_q) {
    throw Failure(kExitUsage, "--sinks: " + path + " has shape " + s.shape_string() +
                                  ", expected [" + std::to_string(heads_q) + "] (heads_q of q)");
  }
  return s.to_f32();
}

// ALiBi slopes: --alibi-slopes, a float .npy [heads_q] (one row for the
// batch) or [batch, heads_q]; or --alibi, the standard slopes
// (fa::ref::standard_alibi_slopes); neither = none. *stride is the
// alibi_slopes_stride: 0 for one row, heads_q for one per sequence.
std::vector<float> load_alibi(const RunOptions &opts, const Dims &d, int64_t *stride) {
  *stride = 0;
  if (!opts.alibi_slopes.empty() && opts.alibi) {
    throw Failure(kExitUsage, "--alibi and --alibi-slopes: give one of them");
  }
  if (opts.alibi) return fa::ref::standard_alibi_slopes(d.heads_q);
  if (opts.alibi_slopes.empty()) return {};
  npy::Array probe;
  std::string err;
  if (!npy::read(opts.alibi_slopes, &probe, &err))
    throw Failure(kExitUsage, "--alibi-slopes: " + err);
  const size_t rank = probe.shape.size() == 2 ? 2 : 1;
  const npy::Array s = load_array(opts.alibi_slopes, "--alibi-slopes", rank, true);
  const bool ok =
      rank == 1 ? s.shape[0] == d.heads_q : s.shape[0] == d.batch && s.shape[1] == d.heads_q;
  if (!ok) {
    throw Failure(kExitUsage, "--alibi-slopes: " + opts.alibi_slopes + " has shape " +
                                  s.shape_string() + ", expected [" + std::to_string(d.heads_q) +
                                  "] or [" + std::to_string(d.batch) + ", " +
                                  std::to_string(d.heads_q) + "] (heads_q, batch of q)");
  }
  if (rank == 2) *stride = d.heads_q;
  return s.to_f32();
}

// The device-side Q, O and LSE shared by run and decode (K/V: DeviceKv).
struct DeviceIo {
  DeviceBuffer q, o, lse;
  DeviceIo(const Runtime &rt, const Dims &d, const Rounded &qr)
      : q(rt, qr.bits.size() * 2, "q"),
        o(rt, size_t(d.batch) * d.seqlen_q * d.heads_q * d.head_dim_v * 2, "o"),
        lse(rt, size_t(d.batch) * d.heads_q * d.seqlen_q * 4, "lse") {
    q.upload(qr.bits.data(), q.bytes());
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

// decode --kv-dtype, run --q-dtype: a tensor [batch, seqlen, heads, dim]
// quantised to fp8 bytes with descales (per (batch, head / group), or one:
// per_head false) = amax / fp8_max over the valid rows (1 where they are all
// 0); group > 1 for Q, whose descale is its KV head's. bits: the bytes in
// pairs (little-endian), so that DeviceKv lays them out as dim / 2 16-bit
// elements; values: what the bytes hold times their descale, for the
// reference; descale: [batch, heads / group] (per_head) or [1].
struct Fp8Cache {
  Rounded r;
  std::vector<float> descale;
};

Fp8Cache quantize_fp8(const npy::Array &a, bool e5m2, bool per_head, int batch, int seqlen, int h,
                      int group, int dim, const std::vector<int32_t> &lens) {
  const std::vector<double> x = a.to_f64();
  auto at = [&](int b, int j, int hh) { return (size_t(b) * seqlen + j) * h * dim + hh * dim; };
  auto slot = [&](int b, int hh) { return per_head ? size_t(b) * (h / group) + hh / group : 0; };
  Fp8Cache c;
  std::vector<double> amax(per_head ? size_t(batch) * (h / group) : 1, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < lens[size_t(b)]; ++j)
      for (int hh = 0; hh < h; ++hh)
        for (int e = 0; e < dim; ++e) {
          double &m = amax[slot(b, hh)];
          m = std::max(m, std::fabs(x[at(b, j, hh) + e]));
        }
  for (double m : amax) c.descale.push_back(m > 0 ? float(m / fa::ref::fp8_max(e5m2)) : 1.0f);
  std::vector<uint8_t> bytes(x.size(), 0xff);  // NaN past a sequence
  c.r.values.assign(x.size(), 0.0);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < lens[size_t(b)]; ++j)
      for (int hh = 0; hh < h; ++hh) {
        const double ds = c.descale[slot(b, hh)];
        for (int e = 0; e < dim; ++e) {
          const size_t i = at(b, j, hh) + e;
          bytes[i] = fa::ref::fp8_from_double(x[i] / ds, e5m2);
          c.r.values[i] = fa::ref::fp8_to_double(bytes[i], e5m2) * ds;
        }
      }
  c.r.bits.resize(bytes.size() / 2);
  for (size_t i = 0; i < c.r.bits.size(); ++i)
    c.r.bits[i] = uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8));
  return c;
}

// A view of fp8 bytes laid out by DeviceKv as pairs: strides in bytes.
fa_tensor bytes_view(fa_tensor t) {
  for (int i = 0; i < 3; ++i) t.stride[i] *= 2;
  return t;
}

// Launches once more on the contiguous cache (launch(kv) sets the K/V
// arguments and runs) and adds a note on how the output of the layout under
// test compares with it; the report's cache line keeps the timed runs' counts.
template <typename Launch>
void compare_with_contiguous(const Runtime &rt, const Dims &d, const Rounded &kr, const Rounded &vr,
                             const std::vector<int32_t> &lens, fa_dtype dtype, DeviceIo *io,
                             Launch &&launch, Outcome *r, int dim_div = 1) {
  r->cache_stats = rt.cache_stats();
  r->have_cache_stats = true;
  const DeviceKv flat(rt, KvKind::Contiguous, d.batch, d.seqlen_k, d.heads_kv, d.head_dim / dim_div,
                      d.head_dim_v / dim_div, kr.bits, vr.bits, lens, 0, 0);
  io->poison();
  launch(flat);
  Outcome c;
  io->download(dtype, &c);
  // Elements whose bits differ, of which non-finite on one side only, and
  // the largest finite difference.
  struct Diff {
    size_t n = 0, nonfinite = 0;
    double max = 0;
  };
  auto diff = [](const std::vector<float> &a, const std::vector<float> &b) {
    Diff d;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;  // same bits
      ++d.n;
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
        ++d.nonfinite;
      } else {
        d.max = std::max(d.max, std::fabs(double(a[i]) - double(b[i])));
      }
    }
    return d;
  };
  const Diff o = diff(r->o, c.o), l = diff(r->lse, c.lse);
  char line[320];
  if (o.n == 0 && l.n == 0) {
    std::snprintf(line, sizeof line,
                  "vs contiguous: O and LSE bit-identical to the same launch on the contiguous "
                  "cache");
  } else {
    std::snprintf(line, sizeof line,
                  "vs contiguous: %zu O elements differ (%zu non-finite on one side, max finite "
                  "|diff| %.3e), %zu LSE (%zu, %.3e) from the same launch on the contiguous cache",
                  o.n, o.nonfinite, o.max, l.n, l.nonfinite, l.max);
  }
  r->notes.push_back(line);
}

// fp32 tensors run through the library (fa_launch, fa_decode); this
// program's run and decode stage their inputs as 16-bit values only.
constexpr const char *kFp32Usage =
    "--dtype fp32 is for generate in this version; run and decode round their inputs to fp16 or "
    "bf16 (pass fp32 arrays to the library or the Python binding)";

}  // namespace

int cmd_run(const RunOptions &opts) {
  const fa_dtype dtype = parse_dtype(opts.attn.dtype);
  if (dtype == FA_DTYPE_FP32) throw Failure(kExitUsage, kFp32Usage);
  const KvKind kv = parse_kv_layout(opts.kv_layout, opts.page_size);
  check_writable(opts.out, "--out");
  check_writable(opts.lse_out, "--lse-out");
  const npy::Array q = load_array(opts.q, "--q", 4, true);
  const npy::Array k = load_array(opts.k, "--k", 4, true);
  const npy::Array v = load_array(opts.v, "--v", 4, true);
  const Dims d = check_shapes(q, k, v, "k", "v");
  // Keys per sequence: --seqused-k, else all seqlen_k.
  const std::vector<int32_t> lens =
      opts.seqused_k.empty()
          ? std::vector<int32_t>(size_t(d.batch), d.seqlen_k)
          : load_lengths(opts.seqused_k, "--seqused-k", d.batch, d.seqlen_k, "seqlen_k");
  Outcome r;
  r.dtype = dtype;
  r.o_shape = {d.batch, d.seqlen_q, d.heads_q, d.head_dim_v};
  r.ref_file = load_reference(opts.ref, r.o_shape);
  fa_config_desc desc = make_desc(opts.attn, dtype, d);
  // --q-dtype: the fp8 forward, K/V in --kv-dtype (default: Q's format).
  const bool fp8 = !opts.q_dtype.empty(), q_e5m2 = opts.q_dtype == "e5m2";
  if (!fp8 && !opts.kv_dtype.empty())
    throw Failure(kExitUsage,
                  "run --kv-dtype needs --q-dtype (the fp8 forward: Q, K and V fp8); "
                  "an fp8 KV cache with a 16-bit Q runs in decode");
  const bool kv_e5m2 = opts.kv_dtype.empty() ? q_e5m2 : opts.kv_dtype == "e5m2";
  const bool per_head = opts.kv_scale != "tensor";
  if (fp8) {
    desc.q_dtype = q_e5m2 ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
    desc.kv_dtype = kv_e5m2 ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
    r.fp8_forward = true;
  }
  const Config cfg(desc);
  const Runtime rt(parse_backend(opts.backend), nullptr, opts.emulator_sm);
  print_device(rt);
  print_problem("forward", desc, d, kv, opts.page_size, false);

  Fp8Cache q8, k8, v8;
  if (fp8) {
    const std::vector<int32_t> all_q(size_t(d.batch), d.seqlen_q);
    q8 = quantize_fp8(q, q_e5m2, per_head, d.batch, d.seqlen_q, d.heads_q, d.heads_q / d.heads_kv,
                      d.head_dim, all_q);
    k8 = quantize_fp8(k, kv_e5m2, per_head, d.batch, d.seqlen_k, d.heads_kv, 1, d.head_dim, lens);
    v8 = quantize_fp8(v, kv_e5m2, per_head, d.batch, d.seqlen_k, d.heads_kv, 1, d.head_dim_v, lens);
  }
  const Rounded qr = fp8 ? q8.r : round_input(q, dtype), kr = fp8 ? k8.r : round_input(k, dtype),
                vr = fp8 ? v8.r : round_input(v, dtype);
  const int div = fp8 ? 2 : 1;  // fp8 bytes travel as pairs
  DeviceIo io(rt, d, qr);
  const DeviceKv cache(rt, kv, d.batch, d.seqlen_k, d.heads_kv, d.head_dim / div,
                       d.head_dim_v / div, kr.bits, vr.bits, lens, opts.page_size, opts.seed);
  std::printf("kv cache:    %s%s%s\n", cache.description().c_str(),
              opts.seqused_k.empty() ? "" : ", keys per sequence from --seqused-k",
              fp8 ? " (pairs of fp8 bytes)" : "");
  DeviceBuffer descales(rt, 3 * std::max<size_t>(q8.descale.size(), 1) * 4, "descales");
  if (fp8) {
    std::vector<float> qkv = q8.descale;  // [3][batch, heads_kv] or [3][1]
    qkv.insert(qkv.end(), k8.descale.begin(), k8.descale.end());
    qkv.insert(qkv.end(), v8.descale.begin(), v8.descale.end());
    descales.upload(qkv.data(), qkv.size() * 4);
    std::printf("fp8:         Q %s, K/V %s bytes, descale per %s = amax / fp8 max\n",
                opts.q_dtype.c_str(), kv_e5m2 ? "e5m2" : "e4m3",
                per_head ? "(batch, kv head)" : "tensor");
  }
  DeviceBuffer used(rt, lens.size() * 4, "seqused_k");
  used.upload(lens.data(), used.bytes());
  const std::vector<float> sinks = load_sinks(opts.sinks, d.heads_q);
  DeviceBuffer sink_buf(rt, std::max<size_t>(sinks.size(), 1) * 4, "sinks");
  if (!sinks.empty()) {
    sink_buf.upload(sinks.data(), sinks.size() * 4);
    std::printf("sinks:       %d, one per query head (natural-log logits)\n", d.heads_q);
  }
  int64_t alibi_stride = 0;
  const std::vector<float> alibi = load_alibi(opts, d, &alibi_stride);
  DeviceBuffer alibi_buf(rt, std::max<size_t>(alibi.size(), 1) * 4, "alibi_slopes");
  if (!alibi.empty()) {
    alibi_buf.upload(alibi.data(), alibi.size() * 4);
    std::printf("alibi:       %s slopes, %s\n", opts.alibi ? "standard" : "given",
                alibi_stride ? "one row per sequence" : "one row for the batch");
  }
  fa_forward_args args{};  // FA_FORWARD_ARGS_INIT warns under -Wextra in C++
  args.struct_size = sizeof(args);
  args.batch = d.batch;
  args.seqlen_q = d.seqlen_q;
  args.seqlen_k = d.seqlen_k;
  args.q = contiguous(io.q.ptr(), d.seqlen_q, d.heads_q, d.head_dim);
  args.o = contiguous(io.o.ptr(), d.seqlen_q, d.heads_q, d.head_dim_v);
  args.lse = io.lse.ptr();
  args.seqused_k = opts.seqused_k.empty() ? 0 : used.ptr();
  args.sinks = sinks.empty() ? 0 : sink_buf.ptr();
  args.alibi_slopes = alibi.empty() ? 0 : alibi_buf.ptr();
  args.alibi_slopes_stride = alibi_stride;
  if (fp8) {
    const uint64_t n = q8.descale.size();
    args.q_descale = descales.ptr();
    args.k_descale = descales.ptr() + 4 * n;
    args.v_descale = descales.ptr() + 8 * n;
    if (per_head) args.descale_stride[0] = d.heads_kv, args.descale_stride[1] = 1;
  }
  auto use = [&](const DeviceKv &c) {
    args.k = fp8 ? bytes_view(c.k()) : c.k();
    args.v = fp8 ? bytes_view(c.v()) : c.v();
    args.kv = c.layout();
  };
  auto launch = [&] { check(fa_launch(rt.get(), cfg.get(), &args, nullptr), "fa_launch"); };
  use(cache);

  io.poison();
  r.first_ms = timed_ms(rt, launch);
  io.poison();
  r.warm_ms = timed_ms(rt, launch);
  io.download(dtype, &r);
  if (kv != KvKind::Contiguous) {
    compare_with_contiguous(
        rt, d, kr, vr, lens, dtype, &io,
        [&](const DeviceKv &c) {
          use(c);
          launch();
          check(fa_synchronize(rt.get(), nullptr), "fa_synchronize");
        },
        &r, div);
  }

  r.o_ref.resize(r.o.size());
  r.lse_ref.resize(r.lse.size());
  fa::ref::Problem problem = make_problem(desc, d);
  if (!sinks.empty()) problem.sinks = sinks.data();
  if (!alibi.empty()) problem.alibi_slopes = alibi.data(), problem.alibi_stride = alibi_stride;
  fa::ref::attention(problem, qr.values.data(), kr.values.data(), vr.values.data(), r.o_ref.data(),
                     r.lse_ref.data(), opts.seqused_k.empty() ? nullptr : lens.data());
  return report(opts, rt, r);
}

// --k-new/--v-new and the rotary options (flashattn.h, fa_decode_args.k_new):
// the device inputs, and on the host the rotate-then-copy the kernel must
// match: *q becomes the rotated Q, *k/*v the caches after the append and
// *seqlens the lengths after it.
struct Append {
  std::unique_ptr<DeviceBuffer> k_new, v_new, cos, sin, pos;
  int seqlen_new = 0, rotary_dim = 0, seqlen_ro = 0, positions = 0;
};

Append load_append(const RunOptions &opts, const Runtime &rt, const Dims &d, fa_dtype dtype,
                   bool causal_or_window, Rounded *q, Rounded *k, Rounded *v,
                   std::vector<int32_t> *seqlens) {
  Append a;
  const bool rotary = !opts.rotary_cos.empty() || !opts.rotary_sin.empty();
  if (opts.k_new.empty()) {
    if (!opts.v_new.empty() || rotary || !opts.rotary_positions.empty() || opts.rotary_interleaved)
      throw Failure(kExitUsage, "--v-new and the --rotary-* options need --k-new");
    return a;
  }
  if (opts.v_new.empty()) throw Failure(kExitUsage, "--k-new needs --v-new");
  const npy::Array kn = load_array(opts.k_new, "--k-new", 4, true);
  const npy::Array vn = load_array(opts.v_new, "--v-new", 4, true);
  a.seqlen_new = int(kn.shape[1]);
  if (kn.shape[0] != d.batch || kn.shape[2] != d.heads_kv || kn.shape[3] != d.head_dim ||
      vn.shape[0] != d.batch || vn.shape[1] != kn.shape[1] || vn.shape[2] != d.heads_kv ||
      vn.shape[3] != d.head_dim_v)
    throw Failure(kExitUsage, "--k-new " + kn.shape_string() + " / --v-new " + vn.shape_string() +
                                  " must be [batch, seqlen_new, heads_kv, head_dim(_v)] of the "
                                  "caches");
  for (int b = 0; b < d.batch; ++b)
    if ((*seqlens)[b] > d.seqlen_k - a.seqlen_new)
      throw Failure(kExitUsage, "--cache-seqlens: sequence " + std::to_string(b) + " holds " +
                                    std::to_string((*seqlens)[b]) + " keys; with " +
                                    std::to_string(a.seqlen_new) +
                                    " new ones it would pass seqlen_k_max " +
                                    std::to_string(d.seqlen_k));
  const Rounded kr = round_input(kn, dtype), vr = round_input(vn, dtype);
  a.k_new = std::make_unique<DeviceBuffer>(rt, kr.bits.size() * 2, "k_new");
  a.k_new->upload(kr.bits.data(), a.k_new->bytes());
  a.v_new = std::make_unique<DeviceBuffer>(rt, vr.bits.size() * 2, "v_new");
  a.v_new->upload(vr.bits.data(), a.v_new->bytes());
  std::vector<float> cs, sn;
  std::vector<int64_t> pos;
  if (rotary) {
    if (opts.rotary_cos.empty() || opts.rotary_sin.empty())
      throw Failure(kExitUsage, "--rotary-cos and --rotary-sin go together");
    const npy::Array c = load_array(opts.rotary_cos, "--rotary-cos", 2, true);
    const npy::Array s = load_array(opts.rotary_sin, "--rotary-sin", 2, true);
    if (c.shape != s.shape)
      throw Failure(kExitUsage, "--rotary-cos " + c.shape_string() + " and --rotary-sin " +
                                    s.shape_string() + " differ");
    a.seqlen_ro = int(c.shape[0]);
    a.rotary_dim = int(2 * c.shape[1]);
    if (a.rotary_dim % 16 != 0 || a.rotary_dim > d.head_dim)
      throw Failure(kExitUsage, "--rotary-cos: rotary_dim = 2 x " + std::to_string(c.shape[1]) +
                                    " must be a multiple of 16 and at most head_dim " +
                                    std::to_string(d.head_dim));
    cs = c.to_f32();
    sn = s.to_f32();
    a.cos = std::make_unique<DeviceBuffer>(rt, cs.size() * 4, "rotary_cos");
    a.cos->upload(cs.data(), a.cos->bytes());
    a.sin = std::make_unique<DeviceBuffer>(rt, sn.size() * 4, "rotary_sin");
    a.sin->upload(sn.data(), a.sin->bytes());
    if (!opts.rotary_positions.empty()) {
      const npy::Array p = load_array(opts.rotary_positions, "--rotary-positions", 2, false);
      if (p.shape[0] != d.batch || p.shape[1] < std::max(d.seqlen_q, a.seqlen_new))
        throw Failure(kExitUsage, "--rotary-positions " + p.shape_string() +
                                      " must be [batch, n >= max(seqlen_q, seqlen_new)]");
      a.positions = int(p.shape[1]);
      pos = p.to_i64();
      std::vector<int32_t> p32(pos.begin(), pos.end());
      a.pos = std::make_unique<DeviceBuffer>(rt, p32.size() * 4, "rotary_positions");
      a.pos->upload(p32.data(), a.pos->bytes());
    }
  } else if (!opts.rotary_positions.empty() || opts.rotary_interleaved) {
    throw Failure(kExitUsage, "--rotary-positions and --rotary-interleaved need --rotary-cos");
  }
  // The host's rotate-then-copy (fa::ref::rope_row), as the kernel's rule.
  const bool bf16 = dtype == FA_DTYPE_BF16;
  const int half = a.rotary_dim / 2;
  auto rot = [&](double *row, int dim, int b, int t, bool query) {
    if (!a.rotary_dim) return;
    long long p = a.positions                  ? pos[size_t(b) * a.positions + t]
                  : query && !causal_or_window ? (*seqlens)[b]
                                               : (*seqlens)[b] + t;
    p = std::clamp<long long>(p, 0, a.seqlen_ro - 1);
    std::vector<float> x(row, row + dim);
    fa::ref::rope_row(x.data(), a.rotary_dim, opts.rotary_interleaved, &cs[size_t(p) * half],
                      &sn[size_t(p) * half], bf16);
    std::copy(x.begin(), x.end(), row);
  };
  for (int b = 0; b < d.batch; ++b)
    for (int t = 0; t < d.seqlen_q; ++t)
      for (int h = 0; h < d.heads_q; ++h)
        rot(&q->values[((size_t(b) * d.seqlen_q + t) * d.heads_q + h) * d.head_dim], d.head_dim, b,
            t, true);
  for (int b = 0; b < d.batch; ++b)
    for (int t = 0; t < a.seqlen_new; ++t)
      for (int h = 0; h < d.heads_kv; ++h) {
        const size_t j = size_t(b) * d.seqlen_k + (*seqlens)[b] + t;
        const size_t src = (size_t(b) * a.seqlen_new + t) * d.heads_kv + h;
        double *kd = &k->values[(j * d.heads_kv + h) * d.head_dim];
        std::copy_n(&kr.values[src * d.head_dim], d.head_dim, kd);
        rot(kd, d.head_dim, b, t, false);
        std::copy_n(&vr.values[src * d.head_dim_v], d.head_dim_v,
                    &v->values[(j * d.heads_kv + h) * d.head_dim_v]);
      }
  std::printf("kv append:   %d new tokens per sequence%s\n", a.seqlen_new,
              a.rotary_dim ? (", RoPE " + std::string(opts.rotary_interleaved ? "GPT-J" : "NeoX") +
                              " rotary_dim " + std::to_string(a.rotary_dim))
                                 .c_str()
                           : "");
  return a;
}

int cmd_decode(const RunOptions &opts) {
  const fa_dtype dtype = parse_dtype(opts.attn.dtype);
  if (dtype == FA_DTYPE_FP32) throw Failure(kExitUsage, kFp32Usage);
  const KvKind kv = parse_kv_layout(opts.kv_layout, opts.page_size);
  if (opts.batch_invariant && opts.num_splits != 0) {
    throw Failure(kExitUsage, "--batch-invariant chooses the splits itself (" +
                                  std::to_string(FA_DECODE_INVARIANT_SPLIT) +
                                  " keys each): leave --num-splits at 0, got " +
                                  std::to_string(opts.num_splits));
  }
  check_writable(opts.out, "--out");
  check_writable(opts.lse_out, "--lse-out");
  const npy::Array q = load_array(opts.q, "--q", 4, true);
  const npy::Array k = load_array(opts.k, "--k-cache", 4, true);
  const npy::Array v = load_array(opts.v, "--v-cache", 4, true);
  const Dims d = check_shapes(q, k, v, "k_cache", "v_cache");
  const std::vector<int32_t> seqlens =
      load_lengths(opts.cache_seqlens, "--cache-seqlens", d.batch, d.seqlen_k, "seqlen_k_max");
  Outcome r;
  r.dtype = dtype;
  r.o_shape = {d.batch, d.seqlen_q, d.heads_q, d.head_dim_v};
  r.ref_file = load_reference(opts.ref, r.o_shape);
  fa_config_desc desc = make_desc(opts.attn, dtype, d);
  const bool fp8 = !opts.kv_dtype.empty(), e5m2 = opts.kv_dtype == "e5m2";
  const bool per_head = opts.kv_scale != "tensor";
  if (fp8) desc.kv_dtype = e5m2 ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
  const Config cfg(desc);
  const Runtime rt(parse_backend(opts.backend), nullptr, opts.emulator_sm);
  print_device(rt);
  print_problem("decode", desc, d, kv, opts.page_size, opts.batch_invariant);

  const Rounded qr = round_input(q, dtype);
  Fp8Cache k8, v8;
  if (fp8) {
    k8 = quantize_fp8(k, e5m2, per_head, d.batch, d.seqlen_k, d.heads_kv, 1, d.head_dim, seqlens);
    v8 = quantize_fp8(v, e5m2, per_head, d.batch, d.seqlen_k, d.heads_kv, 1, d.head_dim_v, seqlens);
  }
  const Rounded kr = fp8 ? k8.r : round_input(k, dtype), vr = fp8 ? v8.r : round_input(v, dtype);
  const int div = fp8 ? 2 : 1;  // fp8 bytes travel as pairs
  DeviceIo io(rt, d, qr);
  // The reference's inputs after the append (the device's stay as loaded).
  Rounded q_ref = qr, k_ref = kr, v_ref = vr;
  std::vector<int32_t> lens_ref = seqlens;
  const Append app = load_append(opts, rt, d, dtype,
                                 desc.causal || desc.window_left >= 0 || desc.window_right >= 0,
                                 &q_ref, &k_ref, &v_ref, &lens_ref);
  const DeviceKv cache(rt, kv, d.batch, d.seqlen_k, d.heads_kv, d.head_dim / div,
                       d.head_dim_v / div, kr.bits, vr.bits, seqlens, opts.page_size, opts.seed,
                       app.seqlen_new);
  if (fp8 && app.seqlen_new > 0) {
    // The kernel quantises the appended rows (K after RoPE) with the cache's
    // descales, fp8(rn_f32(x / descale)); the reference reads them the same.
    for (int kv = 0; kv < 2; ++kv) {
      const int dim = kv ? d.head_dim_v : d.head_dim;
      const std::vector<float> &ds = kv ? v8.descale : k8.descale;
      std::vector<double> &val = kv ? v_ref.values : k_ref.values;
      for (int b = 0; b < d.batch; ++b)
        for (int t = 0; t < app.seqlen_new; ++t)
          for (int hh = 0; hh < d.heads_kv; ++hh) {
            const float s = ds[per_head ? size_t(b) * d.heads_kv + hh : 0];
            const size_t j = size_t(b) * d.seqlen_k + seqlens[size_t(b)] + t;
            for (int e = 0; e < dim; ++e) {
              double &x = val[(j * d.heads_kv + hh) * dim + e];
              const float y = float(x) / s;
              x = fa::ref::fp8_to_double(fa::ref::fp8_from_double(y, e5m2), e5m2) * double(s);
            }
          }
    }
  }
  for (int32_t &l : lens_ref) l += app.seqlen_new;
  std::printf("kv cache:    %s%s\n", cache.description().c_str(),
              fp8 ? " (pairs of fp8 bytes)" : "");
  DeviceBuffer kd_buf(rt, std::max<size_t>(k8.descale.size(), 1) * 4, "k_descale");
  DeviceBuffer vd_buf(rt, std::max<size_t>(v8.descale.size(), 1) * 4, "v_descale");
  if (fp8) {
    kd_buf.upload(k8.descale.data(), k8.descale.size() * 4);
    vd_buf.upload(v8.descale.data(), v8.descale.size() * 4);
    const auto [kmin, kmax] = std::minmax_element(k8.descale.begin(), k8.descale.end());
    std::printf("kv dtype:    %s bytes, descale per %s = amax / %g: K %.4g..%.4g\n",
                opts.kv_dtype.c_str(), per_head ? "(batch, kv head)" : "tensor",
                fa::ref::fp8_max(e5m2), double(*kmin), double(*kmax));
  }
  DeviceBuffer seq(rt, seqlens.size() * 4, "cache_seqlens");
  seq.upload(seqlens.data(), seq.bytes());
  std::vector<uint8_t> tree;  // [batch][seqlen_q][seqlen_q] 0/1, for the reference
  std::vector<uint32_t> tree_words;
  bool tree_shared = false;
  std::unique_ptr<DeviceBuffer> tree_buf;
  if (!opts.tree_mask.empty()) {
    tree = load_tree_mask(opts.tree_mask, d.batch, d.seqlen_q, &tree_words, &tree_shared);
    tree_buf = std::make_unique<DeviceBuffer>(rt, tree_words.size() * 4, "tree_mask");
    tree_buf->upload(tree_words.data(), tree_buf->bytes());
    std::printf("tree mask:   %s, %zu of %zu bits set\n",
                tree_shared ? "one for the batch" : "one per sequence",
                size_t(std::count(tree.begin(), tree.end(), 1)), tree.size());
  }
  const std::vector<float> sinks = load_sinks(opts.sinks, d.heads_q);
  DeviceBuffer sink_buf(rt, std::max<size_t>(sinks.size(), 1) * 4, "sinks");
  if (!sinks.empty()) {
    sink_buf.upload(sinks.data(), sinks.size() * 4);
    std::printf("sinks:       %d, one per query head, added in the combine\n", d.heads_q);
  }
  int64_t alibi_stride = 0;
  const std::vector<float> alibi = load_alibi(opts, d, &alibi_stride);
  DeviceBuffer alibi_buf(rt, std::max<size_t>(alibi.size(), 1) * 4, "alibi_slopes");
  if (!alibi.empty()) {
    alibi_buf.upload(alibi.data(), alibi.size() * 4);
    std::printf("alibi:       %s slopes, %s\n", opts.alibi ? "standard" : "given",
                alibi_stride ? "one row per sequence" : "one row for the batch");
  }

  fa_decode_args args{};  // FA_DECODE_ARGS_INIT warns under -Wextra in C++
  args.struct_size = sizeof(args);
  args.batch = d.batch;
  args.seqlen_q = d.seqlen_q;
  args.seqlen_k_max = d.seqlen_k;
  args.q = contiguous(io.q.ptr(), d.seqlen_q, d.heads_q, d.head_dim);
  args.cache_seqlens = seq.ptr();
  args.num_splits = opts.num_splits;
  args.batch_invariant = opts.batch_invariant ? 1 : 0;
  args.o = contiguous(io.o.ptr(), d.seqlen_q, d.heads_q, d.head_dim_v);
  args.lse = io.lse.ptr();
  if (tree_buf) {
    args.tree_mask = tree_buf->ptr();
    args.tree_mask_stride[1] = int64_t((d.seqlen_q + 31) / 32) * 4;
    args.tree_mask_stride[0] = tree_shared ? 0 : int64_t(d.seqlen_q) * args.tree_mask_stride[1];
  }
  args.sinks = sinks.empty() ? 0 : sink_buf.ptr();
  args.alibi_slopes = alibi.empty() ? 0 : alibi_buf.ptr();
  args.alibi_slopes_stride = alibi_stride;
  if (app.k_new) {
    args.k_new = contiguous(app.k_new->ptr(), app.seqlen_new, d.heads_kv, d.head_dim);
    args.v_new = contiguous(app.v_new->ptr(), app.seqlen_new, d.heads_kv, d.head_dim_v);
    args.seqlen_new = app.seqlen_new;
    if (app.rotary_dim) {
      args.rotary_dim = app.rotary_dim;
      args.rotary_cos = app.cos->ptr();
      args.rotary_sin = app.sin->ptr();
      args.seqlen_ro = app.seqlen_ro;
      args.rotary_interleaved = opts.rotary_interleaved ? 1 : 0;
      if (app.pos) {
        args.rotary_positions = app.pos->ptr();
        args.rotary_positions_stride = app.positions;
      }
    }
  }
  if (fp8) {
    args.k_descale = kd_buf.ptr();
    args.v_descale = vd_buf.ptr();
    if (per_head) args.descale_stride[0] = d.heads_kv, args.descale_stride[1] = 1;
  }
  std::unique_ptr<DeviceBuffer> ws;
  // Points args at cache c and a workspace large enough for it.
  auto use = [&](const DeviceKv &c, bool print) {
    args.k_cache = fp8 ? bytes_view(c.k()) : c.k();
    args.v_cache = fp8 ? bytes_view(c.v()) : c.v();
    args.kv = c.layout();
    size_t ws_bytes = 0;
    int32_t splits = 0;
    check(fa_decode_workspace_size(rt.get(), cfg.get(), &args, &ws_bytes, &splits),
          "fa_decode_workspace_size", kExitUsage);
    if (print) {
      const std::string how =
          opts.batch_invariant
              ? "batch-invariant, " + std::to_string(FA_DECODE_INVARIANT_SPLIT) + " keys each"
          : opts.num_splits ? "requested " + std::to_string(opts.num_splits)
                            : std::string("automatic");
      std::printf("splits:      %d (%s), workspace %zu bytes\n", splits, how.c_str(), ws_bytes);
    }
    if (!ws || ws->bytes() < ws_bytes)
      ws = std::make_unique<DeviceBuffer>(rt, ws_bytes, "workspace");
    args.workspace = ws->ptr();
    args.workspace_size = ws->bytes();
  };
  auto launch = [&] { check(fa_decode(rt.get(), cfg.get(), &args, nullptr), "fa_decode"); };
  use(cache, true);

  io.poison();
  r.first_ms = timed_ms(rt, launch);
  io.poison();
  r.warm_ms = timed_ms(rt, launch);
  io.download(dtype, &r);
  if (kv != KvKind::Contiguous) {
    compare_with_contiguous(
        rt, d, kr, vr, seqlens, dtype, &io,
        [&](const DeviceKv &c) {
          use(c, false);
          launch();
          check(fa_synchronize(rt.get(), nullptr), "fa_synchronize");
        },
        &r, div);
  }

  r.o_ref.resize(r.o.size());
  r.lse_ref.resize(r.lse.size());
  fa::ref::Problem problem = make_problem(desc, d);
  if (!tree.empty()) problem.tree_mask = tree.data();
  if (!sinks.empty()) problem.sinks = sinks.data();
  if (!alibi.empty()) problem.alibi_slopes = alibi.data(), problem.alibi_stride = alibi_stride;
  fa::ref::attention(problem, q_ref.values.data(), k_ref.values.data(), v_ref.values.data(),
                     r.o_ref.data(), r.lse_ref.data(), lens_ref.data());
  return report(opts, rt, r);
}

}  // namespace fa::cli
