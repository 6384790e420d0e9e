// fa_backward and fa_backward_workspace_size (issue 30) on the emulator,
// around the main kernel: every argument the call refuses (by status and
// the argument's name in the message, nothing written), the workspace's
// size, and the per-row kernels run alone (fa::api::backward_kernels)
// against host computations on random data: BackwardPre's D = rowsum(dO o
// O), LSE log2(e) (+inf for -inf) and zeroed dQ accumulators, rows past a
// varlen sequence included; BackwardPost's dQ (the accumulators times
// softmax_scale, rounded as cvt.rn does, strided and packed views) and
// dsinks, from the workspace's statistics and, after a real forward with
// sinks (-inf and +inf ones among them, rows that see no key), against
// fa::ref::attention_backward's dsinks.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/test_hooks.h"
#include "reference.h"
#include "runtime/runtime.h"
#include "support/cmocka.hh"
#include "support/dev.h"
#include "support/emu_runtime.h"

namespace {

using fa::test::Dev;
using fa::test::g_rt;
using fa::test::need_runtime;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kPre = fa::Runtime::kBackwardPre, kPost = fa::Runtime::kBackwardPost;

size_t round256(size_t x) { return (x + 255) / 256 * 256; }

// A backward problem's shape: fixed-length, or varlen with sequences of
// lens_q[b] queries and lens_k[b] keys (sq, sk their maxima).
struct Shape {
  int batch = 2, sq = 37, sk = 29, hq = 4, hkv = 2, d = 48, dv = 72;
  bool bf16 = false, causal = false;
  float softmax_scale = 0.3f, softcap = 0;
  std::vector<int> lens_q, lens_k;  // varlen when set
  std::vector<float> sinks;         // fwd.sinks when set
  int row_pad = 8;                  // elements between rows of dout and dq (a gap)
  bool varlen() const { return !lens_q.empty(); }
  // Rows of a Q-like tensor: packed (varlen) or batch * sq, and the first
  // packed row of each sequence.
  int q_rows() const {
    if (!varlen()) return batch * sq;
    int n = 0;
    for (int l : lens_q) n += l;
    return n;
  }
  int q_start(int b) const {
    if (!varlen()) return b * sq;
    int n = 0;
    for (int i = 0; i < b; ++i) n += lens_q[size_t(i)];
    return n;
  }
  int q_len(int b) const { return varlen() ? lens_q[size_t(b)] : sq; }
  int k_rows() const {
    if (!varlen()) return batch * sk;
    int n = 0;
    for (int l : lens_k) n += l;
    return n;
  }
  int64_t ws_rows() const { return int64_t(batch) * hq * sq; }
  size_t stats_offset() const { return round256(size_t(ws_rows()) * d * 4); }
  size_t ws_bytes() const { return stats_offset() + size_t(ws_rows()) * 8; }
  // Workspace row of (b, h, i).
  int64_t ws_row(int b, int h, int i) const { return (int64_t(b) * hq + h) * sq + i; }
  // The forward's LSE element of (b, h, i): [batch, hq, sq], varlen [hq, total_q].
  size_t lse_index(int b, int h, int i) const {
    return varlen() ? size_t(h) * q_rows() + q_start(b) + i : size_t(ws_row(b, h, i));
  }
};

uint16_t to_bits(float x, bool bf16) {
  return bf16 ? fa::ref::f32_to_bf16(x) : fa::ref::f32_to_f16(x);
}
float from_bits(uint16_t x, bool bf16) {
  return bf16 ? fa::ref::bf16_to_f32(x) : fa::ref::f16_to_f32(x);
}

// A [rows, heads, dim] 16-bit tensor on the device whose rows are `rs`
// elements apart (rs >= heads * dim; the gap poisoned with NaN bits), with
// its host values (NaN in the gaps).
struct Tensor16 {
  int rows = 0, heads = 0, dim = 0;
  int64_t rs = 0, seq = 0;  // row stride; rows per batch entry (stride[0] = seq rs)
  std::vector<uint16_t> bits;
  uint64_t ptr = 0;
  size_t bytes() const { return bits.size() * 2; }
  fa_tensor view() const { return fa_tensor{ptr, {seq * rs, rs, dim, 1}}; }
  size_t at(int row, int h, int c) const { return size_t(row * rs + int64_t(h) * dim + c); }
  float value(int row, int h, int c, bool bf16) const {
    return from_bits(bits[at(row, h, c)], bf16);
  }
};

Tensor16 tensor16(Dev &dev, int rows, int heads, int dim, int pad, int seq, bool bf16,
                  std::mt19937 &gen, float scale = 1.0f) {
  Tensor16 t;
  t.rows = rows, t.heads = heads, t.dim = dim, t.seq = seq;
  t.rs = int64_t(heads) * dim + pad;
  t.bits.assign(size_t(rows) * t.rs + 8, 0x7fff);  // NaN (fp16 and bf16) in gaps and tail
  std::normal_distribution<float> n(0.0f, scale);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < dim; ++c) t.bits[t.at(r, h, c)] = to_bits(n(gen), bf16);
  t.ptr = dev.put(t.bits.data(), t.bytes());
  return t;
}

// Device buffers of one problem and fa_backward_args over them.
struct Problem {
  Shape s;
  Dev dev;
  fa_config *cfg = nullptr;
  Tensor16 q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;  // the forward's, on the device at lse_ptr
  uint64_t lse_ptr = 0, cuq = 0, cuk = 0, sinks = 0, dsinks = 0, ws = 0;
  Problem(fa_runtime *rt, const Shape &shape, uint32_t seed) : s(shape), dev(rt) {
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.dtype = s.bf16 ? FA_DTYPE_BF16 : FA_DTYPE_FP16;
    d.head_dim = s.d;
    d.head_dim_v = s.dv;
    d.num_heads_q = s.hq;
    d.num_heads_kv = s.hkv;
    d.causal = s.causal ? 1 : 0;
    d.softmax_scale = s.softmax_scale;
    d.softcap = s.softcap;
    assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
    dev.cfg = cfg;
    std::mt19937 gen(seed);
    q = tensor16(dev, s.q_rows(), s.hq, s.d, 0, s.sq, s.bf16, gen);
    k = tensor16(dev, s.k_rows(), s.hkv, s.d, 0, s.sk, s.bf16, gen);
    v = tensor16(dev, s.k_rows(), s.hkv, s.dv, 0, s.sk, s.bf16, gen);
    o = tensor16(dev, s.q_rows(), s.hq, s.dv, 0, s.sq, s.bf16, gen);
    dout = tensor16(dev, s.q_rows(), s.hq, s.dv, s.row_pad, s.sq, s.bf16, gen);
    // dq, dk, dv: three rows past the last one, all poisoned (NaN).
    auto poisoned = [&](int rows, int heads, int dim, int pad, int seq) {
      Tensor16 t = tensor16(dev, rows + 3, heads, dim, pad, seq, s.bf16, gen);
      t.rows = rows;
      std::fill(t.bits.begin(), t.bits.end(), uint16_t(0x7fff));
      fa_memcpy_htod(dev.rt, t.ptr, t.bits.data(), t.bytes());
      return t;
    };
    dq = poisoned(s.q_rows(), s.hq, s.d, s.row_pad, s.sq);
    dk = poisoned(s.k_rows(), s.hkv, s.d, 0, s.sk);
    dv = poisoned(s.k_rows(), s.hkv, s.dv, 0, s.sk);
    lse.resize(s.varlen() ? size_t(s.hq) * s.q_rows() : size_t(s.ws_rows()));
    std::uniform_real_distribution<float> u(-3.0f, 8.0f);
    for (float &x : lse) x = u(gen);
    lse_ptr = dev.put(lse.data(), lse.size() * 4);
    if (s.varlen()) {
      std::vector<int32_t> cq(1, 0), ck(1, 0);
      for (int b = 0; b < s.batch; ++b) {
        cq.push_back(cq.back() + s.lens_q[size_t(b)]);
        ck.push_back(ck.back() + s.lens_k[size_t(b)]);
      }
      cuq = dev.put(cq.data(), cq.size() * 4);
      cuk = dev.put(ck.data(), ck.size() * 4);
    }
    if (!s.sinks.empty()) {
      sinks = dev.put(s.sinks.data(), s.sinks.size() * 4);
      dsinks = dev.put(nullptr, s.sinks.size() * 4);
    }
    ws = dev.put(nullptr, s.ws_bytes() + 256);
    assert_true(dev.err.empty());
  }
  fa_backward_args args() const {
    fa_backward_args a = FA_BACKWARD_ARGS_INIT;
    a.fwd.batch = s.batch;
    a.fwd.seqlen_q = s.sq;
    a.fwd.seqlen_k = s.sk;
    a.fwd.q = q.view(), a.fwd.k = k.view(), a.fwd.v = v.view(), a.fwd.o = o.view();
    a.fwd.lse = lse_ptr;
    a.fwd.cu_seqlens_q = cuq;
    a.fwd.cu_seqlens_k = cuk;
    a.fwd.sinks = sinks;
    a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    a.dsinks = dsinks;
    a.workspace = ws;
    a.workspace_size = s.ws_bytes();
    return a;
  }
  // Uploads changed host values of a tensor or the LSE.
  void upload(const Tensor16 &t) { fa_memcpy_htod(dev.rt, t.ptr, t.bits.data(), t.bytes()); }
  void upload_lse() { fa_memcpy_htod(dev.rt, lse_ptr, lse.data(), lse.size() * 4); }
  std::vector<uint16_t> read(const Tensor16 &t) const {
    std::vector<uint16_t> out(t.bits.size());
    fa_memcpy_dtoh(dev.rt, out.data(), t.ptr, t.bytes());
    return out;
  }
  std::vector<float> read_ws() const {
    std::vector<float> out(s.ws_bytes() / 4);
    fa_memcpy_dtoh(dev.rt, out.data(), ws, s.ws_bytes());
    return out;
  }
  // Every byte fa_backward may write: dq, dk, dv, dsinks and the workspace.
  std::vector<uint8_t> outputs() const {
    std::vector<uint8_t> out;
    auto add = [&](uint64_t p, size_t n) {
      const size_t at = out.size();
      out.resize(at + n);
      fa_memcpy_dtoh(dev.rt, out.data() + at, p, n);
    };
    add(dq.ptr, dq.bytes());
    add(dk.ptr, dk.bytes());
    add(dv.ptr, dv.bytes());
    if (dsinks) add(dsinks, s.sinks.size() * 4);
    add(ws, s.ws_bytes() + 256);
    return out;
  }
  void poison_outputs() const {
    fa_memset(dev.rt, dq.ptr, 0xA5, dq.bytes());
    fa_memset(dev.rt, dk.ptr, 0xA5, dk.bytes());
    fa_memset(dev.rt, dv.ptr, 0xA5, dv.bytes());
    if (dsinks) fa_memset(dev.rt, dsinks, 0xA5, s.sinks.size() * 4);
    fa_memset(dev.rt, ws, 0xA5, s.ws_bytes() + 256);
  }
  // D_i = rowsum(dO_i o O_i) in fp64 over the rounded values.
  double d_ref(int b, int h, int i, double *abs_sum = nullptr) const {
    const int row = s.q_start(b) + i;
    double d = 0, a = 0;
    for (int c = 0; c < s.dv; ++c) {
      const double t = double(dout.value(row, h, c, s.bf16)) * o.value(row, h, c, s.bf16);
      d += t;
      a += std::fabs(t);
    }
    if (abs_sum) *abs_sum = a;
    return d;
  }
};

// Runs `call`, which must fail with `want` and a message holding `needle`
// (and the API name), writing nothing.
template <typename Call>
bool expect_refused(const Problem &p, const char *row, fa_status want, const char *needle,
                    const char *api, Call call) {
  p.poison_outputs();
  const std::vector<uint8_t> before = p.outputs();
  const fa_status got = call();
  const std::string msg = fa_last_error();
  bool ok = true;
  if (got != want || msg.find(needle) == std::string::npos || msg.find(api) == std::string::npos) {
    std::printf("row '%s': status %d (%s), want %d; message \"%s\", want \"%s\"\n", row, got,
                fa_status_string(got), want, msg.c_str(), needle);
    ok = false;
  }
  if (p.outputs() != before) {
    std::printf("row '%s': an output or the workspace was written\n", row);
    ok = false;
  }
  return ok;
}

Shape reject_shape() {
  Shape s;
  s.batch = 2, s.sq = 9, s.sk = 12, s.hq = 4, s.hkv = 2, s.d = 64, s.dv = 64;
  s.sinks = {0.5f, -1.0f, 0.0f, 2.0f};
  return s;
}

// Every argument fa_backward refuses, by name, with nothing written.
void test_rejected_args(void **) {
  need_runtime();
  Problem p(g_rt, reject_shape(), 11);
  const fa_backward_args valid = p.args();
  struct Row {
    const char *name;
    void (*mutate)(fa_backward_args &);
    fa_status want;
    const char *needle;
  };
  constexpr fa_status kBad = FA_ERROR_INVALID_ARGUMENT, kUns = FA_ERROR_UNSUPPORTED;
  const Row rows[] = {
      {"struct_size", [](fa_backward_args &a) { a.struct_size -= 8; }, kBad, "args.struct_size"},
      {"fwd.struct_size", [](fa_backward_args &a) { a.fwd.struct_size = FA_FORWARD_ARGS_SIZE_0_7; },
       kBad, "fwd.struct_size"},
      {"fwd.o missing", [](fa_backward_args &a) { a.fwd.o.data = 0; }, kBad, "fwd: o.data is 0"},
      {"fwd.lse missing", [](fa_backward_args &a) { a.fwd.lse = 0; }, kBad, "fwd.lse is 0"},
      {"fwd.q stride", [](fa_backward_args &a) { a.fwd.q.stride[1] = 12; }, kBad,
       "fwd: q.stride[1]"},
      {"fwd.batch", [](fa_backward_args &a) { a.fwd.batch = 0; }, kBad, "fwd: batch"},
      {"fwd.cu_seqlens_q alone", [](fa_backward_args &a) { a.fwd.cu_seqlens_q = a.fwd.lse; }, kBad,
       "fwd: cu_seqlens_q and cu_seqlens_k"},
      {"dout missing", [](fa_backward_args &a) { a.dout.data = 0; }, kBad, "dout.data is 0"},
      {"dout misaligned", [](fa_backward_args &a) { a.dout.data += 2; }, kBad, "dout.data 0x"},
      {"dout.stride[1]", [](fa_backward_args &a) { a.dout.stride[1] = 12; }, kBad,
       "dout.stride[1] must be"},
      {"dout.stride[3]", [](fa_backward_args &a) { a.dout.stride[3] = 2; }, kBad,
       "dout.stride[3] must be 1"},
      {"dq missing", [](fa_backward_args &a) { a.dq.data = 0; }, kBad, "dq.data is 0"},
      {"dq misaligned", [](fa_backward_args &a) { a.dq.data += 8; }, kBad, "dq.data 0x"},
      {"dq.stride[0] span", [](fa_backward_args &a) { a.dq.stride[0] = int64_t(1) << 62; }, kBad,
       "dq.stride[0] * (batch - 1) overflows"},
      {"dq.stride[2]", [](fa_backward_args &a) { a.dq.stride[2] = -64; }, kBad,
       "dq.stride[2] must be"},
      {"dk missing", [](fa_backward_args &a) { a.dk.data = 0; }, kBad, "dk.data is 0"},
      {"dk.stride[1]", [](fa_backward_args &a) { a.dk.stride[1] = 4; }, kBad,
       "dk.stride[1] must be"},
      {"dk.stride[1] span", [](fa_backward_args &a) { a.dk.stride[1] = int64_t(1) << 60; }, kBad,
       "dk.stride[1] * (seqlen_k - 1) overflows"},
      {"dv misaligned", [](fa_backward_args &a) { a.dv.data += 4; }, kBad, "dv.data 0x"},
      {"dv.stride[3]", [](fa_backward_args &a) { a.dv.stride[3] = 0; }, kBad,
       "dv.stride[3] must be 1"},
      {"dsinks missing", [](fa_backward_args &a) { a.dsinks = 0; }, kBad,
       "dsinks is 0 but fwd.sinks is set"},
      {"dsinks misaligned", [](fa_backward_args &a) { a.dsinks += 2; }, kBad, "not 4-byte aligned"},
      {"dsinks without sinks", [](fa_backward_args &a) { a.fwd.sinks = 0; }, kBad,
       "dsinks is set but fwd.sinks is 0"},
      {"workspace missing", [](fa_backward_args &a) { a.workspace = 0; }, kBad, "workspace is 0"},
      {"workspace misaligned", [](fa_backward_args &a) { a.workspace += 16; }, kBad,
       "not 256-byte aligned"},
      {"workspace too small", [](fa_backward_args &a) { a.workspace_size -= 4; }, kBad,
       "workspace_size is"},
      {"deterministic 2", [](fa_backward_args &a) { a.deterministic = 2; }, kBad,
       "deterministic must be 0 or 1"},
      {"deterministic -1", [](fa_backward_args &a) { a.deterministic = -1; }, kBad,
       "deterministic must be 0 or 1"},
      {"paged", [](fa_backward_args &a) { a.fwd.kv.layout = FA_KV_PAGED; }, kUns,
       "fwd.kv.layout is 1"},
      {"pointer arrays", [](fa_backward_args &a) { a.fwd.kv.layout = FA_KV_PTR_ARRAY; }, kUns,
       "fwd.kv.layout is 2"},
      {"seqused_k", [](fa_backward_args &a) { a.fwd.seqused_k = a.fwd.lse; }, kUns,
       "fwd.seqused_k is set"},
      {"bad kv.layout", [](fa_backward_args &a) { a.fwd.kv.layout = fa_kv_layout(7); }, kBad,
       "fwd: kv.layout 7"},
  };
  bool ok = true;
  for (const Row &r : rows) {
    fa_backward_args a = valid;
    r.mutate(a);
    ok &= expect_refused(p, r.name, r.want, r.needle, "fa_backward",
                         [&] { return fa_backward(g_rt, p.cfg, &a, nullptr); });
  }
  ok &= expect_refused(p, "rt NULL", kBad, "rt is NULL", "fa_backward",
                       [&] { return fa_backward(nullptr, p.cfg, &valid, nullptr); });
  ok &= expect_refused(p, "cfg NULL", kBad, "cfg is NULL", "fa_backward",
                       [&] { return fa_backward(g_rt, nullptr, &valid, nullptr); });
  ok &= expect_refused(p, "args NULL", kBad, "args is NULL", "fa_backward",
                       [&] { return fa_backward(g_rt, p.cfg, nullptr, nullptr); });
  // Configs the backward does not take (the args are valid for the test's).
  struct CfgRow {
    const char *name;
    void (*mutate)(fa_config_desc &);
    const char *needle;
  };
  const CfgRow cfg_rows[] = {
      {"fp32", [](fa_config_desc &d) { d.dtype = FA_DTYPE_FP32; }, "FA_DTYPE_FP32"},
      {"fp8 kv_dtype", [](fa_config_desc &d) { d.kv_dtype = FA_DTYPE_FP8_E4M3; }, "fp8"},
      {"fp8 q_dtype", [](fa_config_desc &d) { d.kv_dtype = d.q_dtype = FA_DTYPE_FP8_E5M2; }, "fp8"},
      {"head_dim 264", [](fa_config_desc &d) { d.head_dim = 264, d.head_dim_v = 64; },
       "multiples of 16 up to 256, got 264 and 64"},
      {"head_dim_v 136", [](fa_config_desc &d) { d.head_dim_v = 136; },
       "multiples of 16 up to 256, got 64 and 136"},
  };
  for (const CfgRow &r : cfg_rows) {
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.head_dim = 64;
    d.num_heads_q = 4;
    d.num_heads_kv = 2;
    r.mutate(d);
    fa_config *cfg = nullptr;
    assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
    ok &= expect_refused(p, r.name, kUns, r.needle, "fa_backward",
                         [&] { return fa_backward(g_rt, cfg, &valid, nullptr); });
    size_t n = 0;
    ok &= expect_refused(p, r.name, kUns, r.needle, "fa_backward_workspace_size",
                         [&] { return fa_backward_workspace_size(g_rt, cfg, &valid, &n); });
    fa_config_destroy(cfg);
  }
  // Below sm_80 (no emulated SM is): the runtime's check.
  fa::AttentionConfig c = fa::attention_config(fa::Dtype::F16, 64, 64, 4, 2, 0.125f, 0);
  assert_int_equal(fa::check_backward(c, 75), FA_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(fa_last_error(), "needs sm_80 or newer"));
  assert_int_equal(fa::check_backward(c, 80), FA_SUCCESS);
  assert_true(ok);
}

// fa_backward_workspace_size: the layout's bytes (dQ accumulators, then two
// statistics per row 256-byte aligned), no device memory read, the
// workspace fields ignored, and fa_backward's other checks.
void test_workspace_size(void **) {
  need_runtime();
  struct Case {
    int batch, sq, hq, d;
    bool varlen;
  };
  for (const Case &c : {Case{3, 5, 1, 8, false}, Case{2, 37, 4, 48, false},
                        Case{3, 40, 6, 128, true}, Case{1, 1, 1, 8, false}}) {
    // Host-only arguments (never read): the size query touches no memory.
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.head_dim = c.d;
    d.head_dim_v = 64;
    d.num_heads_q = c.hq;
    d.num_heads_kv = 1;
    fa_config *cfg = nullptr;
    assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
    const uint64_t base = uint64_t(1) << 32;
    auto view = [&](int heads, int dim, int seq) {
      return fa_tensor{base, {int64_t(seq) * heads * dim, int64_t(heads) * dim, dim, 1}};
    };
    fa_backward_args a = FA_BACKWARD_ARGS_INIT;
    a.fwd.batch = c.batch, a.fwd.seqlen_q = c.sq, a.fwd.seqlen_k = 17;
    a.fwd.q = a.dq = view(c.hq, c.d, c.sq);
    a.fwd.k = a.dk = view(1, c.d, 17);
    a.fwd.v = a.dv = view(1, 64, 17);
    a.fwd.o = a.dout = view(c.hq, 64, c.sq);
    a.fwd.lse = base;
    if (c.varlen) a.fwd.cu_seqlens_q = a.fwd.cu_seqlens_k = base;
    a.workspace = 3;  // ignored
    size_t n = 0;
    assert_int_equal(fa_backward_workspace_size(g_rt, cfg, &a, &n), FA_SUCCESS);
    const size_t rows = size_t(c.batch) * c.hq * c.sq;
    assert_int_equal(n, round256(rows * c.d * 4) + rows * 8);
    if (c.batch == 3 && c.sq == 5) assert_int_equal(n, 512 + 120);
    // The checks that are not the workspace's.
    a.dq.stride[1] = 4;
    assert_int_equal(fa_backward_workspace_size(g_rt, cfg, &a, &n), FA_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(fa_last_error(), "dq.stride[1]"));
    assert_int_equal(fa_backward_workspace_size(g_rt, cfg, &a, nullptr), FA_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(fa_last_error(), "bytes is NULL"));
    assert_int_equal(fa_backward_workspace_size(g_rt, cfg, nullptr, &n), FA_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(fa_last_error(), "args is NULL"));
    // Grids: batch (z) and num_heads_q (y) at most 65535.
    a.dq.stride[1] = a.fwd.q.stride[1];
    a.fwd.batch = 65536;
    assert_int_equal(fa_backward_workspace_size(g_rt, cfg, &a, &n), FA_ERROR_UNSUPPORTED);
    assert_non_null(std::strstr(fa_last_error(), "at most 65535"));
    fa_config_destroy(cfg);
  }
}

// BackwardPre alone: D, LSE log2(e) (+inf for -inf, exact), dq_accum
// zeroed, and rows past a varlen sequence D = 0, +inf, zeros without
// reading a row (dout's gaps and every row past the packed ones are NaN).
void check_pre(const Shape &shape, uint32_t seed) {
  Problem p(g_rt, shape, seed);
  const Shape &s = p.s;
  // Some rows see no key: LSE -inf (and O = 0, as the forward writes it).
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h)
      for (int i = (b + h) % 5; i < s.q_len(b); i += 5) {
        p.lse[s.lse_index(b, h, i)] = -kInf;
        for (int c = 0; c < s.dv; ++c) p.o.bits[p.o.at(s.q_start(b) + i, h, c)] = 0;
      }
  p.upload(p.o);
  p.upload_lse();
  p.poison_outputs();
  const fa_backward_args a = p.args();
  const std::vector<uint16_t> dq_before = p.read(p.dq);
  assert_int_equal(fa::api::backward_kernels(g_rt, p.cfg, &a, kPre), FA_SUCCESS);
  const std::vector<float> ws = p.read_ws();
  const float *stats = ws.data() + s.stats_offset() / 4;
  const int64_t rows = s.ws_rows();
  int bad = 0;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.hq; ++h) {
      for (int i = 0; i < s.sq; ++i) {
        const int64_t r = s.ws_row(b, h, i);
        const bool real = i < s.q_len(b);
        double abs_sum = 0;
        const double d = real ? p.d_ref(b, h, i, &abs_sum) : 0.0;
        const float lse = real ? p.lse[s.lse_index(b, h, i)] : -kInf;
        const float l2 = lse == -kInf ? kInf : lse * kLog2e;
        const float got_d = stats[r], got_l = stats[rows + r];
        if (!(std::fabs(got_d - d) <= 1e-5 * abs_sum) || std::memcmp(&got_l, &l2, 4) != 0) {
          if (bad++ < 5)
            std::printf("b %d h %d i %d: D %.9g (want %.9g), L %.9g (want %.9g)\n", b, h, i,
                        double(got_d), d, double(got_l), double(l2));
        }
        for (int c = 0; c < s.d; ++c) {
          const float x = ws[size_t(r) * s.d + c];
          if (x != 0 || std::signbit(x)) {
            if (bad++ < 5) std::printf("b %d h %d i %d: dq_accum[%d] = %g\n", b, h, i, c, x);
          }
        }
      }
    }
  }
  // BackwardPre writes the workspace only.
  if (p.read(p.dq) != dq_before) {
    std::printf("BackwardPre wrote dq\n");
    ++bad;
  }
  assert_int_equal(bad, 0);
}

void test_pre_fixed(void **) {
  need_runtime();
  Shape s;  // 2 x 37 queries (a partial block of 128), d 48, dv 72 (nine 16-byte loads)
  check_pre(s, 1);
  s.bf16 = true;
  s.batch = 1, s.sq = 130, s.hq = 2, s.hkv = 1, s.d = 128, s.dv = 8;  // two blocks
  check_pre(s, 2);
}

void test_pre_varlen(void **) {
  need_runtime();
  Shape s;
  s.batch = 3, s.sq = 37, s.sk = 20;
  s.lens_q = {37, 0, 12};
  s.lens_k = {20, 5, 0};
  check_pre(s, 3);
  s.bf16 = true;
  s.d = 64, s.dv = 128;
  s.lens_q = {5, 37, 1};
  check_pre(s, 4);
}

// BackwardPost alone, after BackwardPre (the statistics) and random dQ
// accumulators: dQ = round(acc softmax_scale) bit for bit in every row of
// every sequence, nothing else of dq written (gaps, rows past the last
// sequence); dsinks = -sum exp(sinks[h] - LSE_i) D_i over the real rows
// (rows past a sequence, and a +inf sink's rows with LSE +inf and O = 0, add
// nothing).
void check_post(const Shape &shape, uint32_t seed) {
  Problem p(g_rt, shape, seed);
  const Shape &s = p.s;
  for (int h = 0; h < s.hq; ++h) {
    if (s.sinks.empty() || !(s.sinks[size_t(h)] == kInf)) continue;
    // The forward's output for a +inf sink: O = 0, LSE = +inf.
    for (int b = 0; b < s.batch; ++b)
      for (int i = 0; i < s.q_len(b); ++i) {
        p.lse[s.lse_index(b, h, i)] = kInf;
        for (int c = 0; c < s.dv; ++c) p.o.bits[p.o.at(s.q_start(b) + i, h, c)] = 0;
      }
  }
  p.upload(p.o);
  p.upload_lse();
  p.poison_outputs();
  const fa_backward_args a = p.args();
  assert_int_equal(fa::api::backward_kernels(g_rt, p.cfg, &a, kPre), FA_SUCCESS);
  std::mt19937 gen(seed + 100);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> acc(size_t(s.ws_rows()) * s.d);
  for (float &x : acc) x = n(gen);
  fa_memcpy_htod(g_rt, p.ws, acc.data(), acc.size() * 4);
  assert_int_equal(fa::api::backward_kernels(g_rt, p.cfg, &a, kPost), FA_SUCCESS);
  const std::vector<uint16_t> dq = p.read(p.dq);
  std::vector<uint16_t> want(dq.size(), 0xA5A5);  // poison_outputs' bytes
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h)
      for (int i = 0; i < s.q_len(b); ++i)
        for (int c = 0; c < s.d; ++c) {
          const float x = acc[size_t(s.ws_row(b, h, i)) * s.d + c] * s.softmax_scale;
          want[p.dq.at(s.q_start(b) + i, h, c)] = to_bits(x, s.bf16);
        }
  int bad = 0;
  for (size_t e = 0; e < dq.size(); ++e) {
    if (dq[e] != want[e] && bad++ < 5)
      std::printf("dq element %zu: 0x%04x, want 0x%04x\n", e, dq[e], want[e]);
  }
  if (!s.sinks.empty()) {
    std::vector<float> got(s.sinks.size());
    fa_memcpy_dtoh(g_rt, got.data(), p.dsinks, got.size() * 4);
    for (int h = 0; h < s.hq; ++h) {
      double sum = 0, abs_sum = 0;
      for (int b = 0; b < s.batch; ++b)
        for (int i = 0; i < s.q_len(b); ++i) {
          const double d = p.d_ref(b, h, i);
          if (d == 0) continue;  // no key, or a +inf sink: O = 0
          const double t = std::exp(double(s.sinks[size_t(h)]) - p.lse[s.lse_index(b, h, i)]) * d;
          sum -= t;
          abs_sum += std::fabs(t);
        }
      if (!(std::fabs(got[size_t(h)] - sum) <= 1e-4 * abs_sum + 1e-30) && bad++ < 5)
        std::printf("dsinks[%d] = %.9g, want %.9g\n", h, double(got[size_t(h)]), sum);
    }
  }
  assert_int_equal(bad, 0);
}

void test_post_fixed(void **) {
  need_runtime();
  Shape s;  // dq rows with a gap, fp16
  s.sinks = {0.3f, -kInf, 1.5f, -2.0f};
  check_post(s, 5);
  Shape t;  // bf16, no sinks, two blocks of rows, head_dim 128
  t.bf16 = true;
  t.batch = 1, t.sq = 131, t.hq = 2, t.hkv = 2, t.d = 128, t.dv = 16;
  t.softmax_scale = 0.0883883f;
  t.softcap = 30;  // read by the main kernel only
  t.hkv = 1;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);  // the kernel's name (emulated_kernel)
  check_post(t, 6);
  unsetenv("FLASHATTN_EMU_PROFILE");
  // The per-row kernels do not depend on softcap, ALiBi or the GQA group:
  // one kernel per head dims, dtype, varlen and sinks.
  const std::string name = fa::test::emulated_kernel(g_rt);
  std::printf("ran %s\n", name.c_str());
  assert_true(name.rfind("fa_bwdpost_mma_bf16_d128_dv16_g1_bm64_bn64_w4", 0) == 0);
  assert_true(name.find("softcap") == std::string::npos);
}

void test_post_varlen(void **) {
  need_runtime();
  Shape s;  // an empty sequence; rows past each sequence; a +inf sink
  s.bf16 = true;
  s.batch = 3, s.sq = 37, s.sk = 20;
  s.lens_q = {37, 0, 12};
  s.lens_k = {20, 5, 1};
  s.sinks = {0.3f, kInf, -kInf, 4.0f};
  check_post(s, 7);
  s.bf16 = false;
  s.batch = 2;
  s.sq = 200;  // CTA (0, h, 0)'s threads loop over more rows than they are
  s.lens_q = {200, 150};
  s.lens_k = {3, 20};
  s.sinks = {-0.5f, 1.0f, 2.5f, 0.0f};
  check_post(s, 8);
}

// dsinks after a real forward with sinks (fa_launch on the emulator):
// BackwardPre then BackwardPost, against fa::ref::attention_backward's
// dsinks on the same rounded inputs; causal with more queries than keys
// (rows that see no key), a -inf sink (dsinks 0) and a +inf one (O = 0,
// LSE = +inf: dsinks 0). With the main kernel left out dQ is exactly 0
// (BackwardPre zeroed its accumulators).
void test_dsinks_reference(void **) {
  need_runtime();
  Shape s;
  s.batch = 2, s.sq = 12, s.sk = 7, s.hq = 4, s.hkv = 2, s.d = 32, s.dv = 40;
  s.causal = true;
  s.softmax_scale = 0.25f;
  s.sinks = {0.7f, -kInf, kInf, -1.2f};
  Problem p(g_rt, s, 9);
  fa_backward_args a = p.args();
  fa_forward_args f = a.fwd;
  assert_int_equal(fa_launch(g_rt, p.cfg, &f, nullptr), FA_SUCCESS);
  // The forward's O (its bits replace the random ones) and LSE.
  p.o.bits = p.read(p.o);
  fa_memcpy_dtoh(g_rt, p.lse.data(), p.lse_ptr, p.lse.size() * 4);
  assert_int_equal(fa::api::backward_kernels(g_rt, p.cfg, &a, kPre | kPost), FA_SUCCESS);
  std::vector<float> got(4);
  fa_memcpy_dtoh(g_rt, got.data(), p.dsinks, 16);
  // The reference on contiguous fp64 copies of the rounded inputs.
  auto dense = [&](const Tensor16 &t) {
    std::vector<double> out(size_t(t.rows) * t.heads * t.dim);
    for (int r = 0; r < t.rows; ++r)
      for (int h = 0; h < t.heads; ++h)
        for (int c = 0; c < t.dim; ++c)
          out[(size_t(r) * t.heads + h) * t.dim + c] = t.value(r, h, c, s.bf16);
    return out;
  };
  const std::vector<double> q = dense(p.q), k = dense(p.k), v = dense(p.v), dout = dense(p.dout);
  fa::ref::Problem rp;
  rp.batch = s.batch, rp.seqlen_q = s.sq, rp.seqlen_k = s.sk;
  rp.num_heads_q = s.hq, rp.num_heads_kv = s.hkv, rp.head_dim = s.d, rp.head_dim_v = s.dv;
  rp.causal = true;
  rp.softmax_scale = s.softmax_scale;
  rp.sinks = s.sinks.data();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dsinks(4);
  fa::ref::attention_backward(rp, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                              dv.data(), dsinks.data());
  int bad = 0;
  for (int h = 0; h < s.hq; ++h) {
    // The tolerance: O and LSE as the forward rounded them (O to 16 bits).
    double scale = 0;
    for (int b = 0; b < s.batch; ++b)
      for (int i = 0; i < s.sq; ++i) {
        double abs_sum = 0;
        p.d_ref(b, h, i, &abs_sum);
        const float lse = p.lse[s.lse_index(b, h, i)];
        if (std::isfinite(lse)) scale += std::exp(double(s.sinks[size_t(h)]) - lse) * abs_sum;
      }
    // O's rounding to fp16 is within 2^-11 relative (D_i within 2^-11
    // sum_c |dO O|); the forward's LSE adds little.
    const double tol = 6e-4 * scale + 1e-6;
    std::printf("dsinks[%d] = %.7g, reference %.7g (tolerance %.2g)\n", h, double(got[size_t(h)]),
                dsinks[size_t(h)], tol);
    if (!(std::fabs(got[size_t(h)] - dsinks[size_t(h)]) <= tol)) ++bad;
  }
  assert_true(dsinks[0] != 0 && dsinks[3] != 0 && dsinks[1] == 0 && dsinks[2] == 0);
  // dQ: every element of every row 0 (+0.0), the gaps and rows past poisoned.
  const std::vector<uint16_t> got_dq = p.read(p.dq);
  for (int r = 0; r < p.dq.rows; ++r)
    for (int h = 0; h < s.hq; ++h)
      for (int c = 0; c < s.d; ++c)
        if (got_dq[p.dq.at(r, h, c)] != 0 && bad++ < 5) std::printf("dq row %d not 0\n", r);
  assert_int_equal(bad, 0);
}

// The whole call today: the main kernel (src/kernels/backward_tc.cc) may
// not be generated yet; then fa_backward says so (UNSUPPORTED, naming it)
// and writes nothing: every kernel is had before the first launch.
void test_backward_call(void **) {
  need_runtime();
  Shape s = reject_shape();
  Problem p(g_rt, s, 10);
  const fa_backward_args a = p.args();
  p.poison_outputs();
  const std::vector<uint8_t> before = p.outputs();
  const fa_status st = fa_backward(g_rt, p.cfg, &a, nullptr);
  if (st == FA_ERROR_UNSUPPORTED) {
    std::printf("fa_backward: %s\n", fa_last_error());
    assert_non_null(std::strstr(fa_last_error(), "main (Backward) kernel is not generated"));
    assert_true(p.outputs() == before);
  } else {
    assert_int_equal(st, FA_SUCCESS);  // its numerics: the main kernel's tests
  }
}

// fa_generate_for's backward kinds give the modules fa_backward launches:
// for each of its kernels, the entry the emulator ran (its profile) is the
// generated module's, and the runtime's spec for the call
// (fa::api::backward_spec) generates the same bytes. Fixed-length GQA with
// sinks on the group's runtime; varlen with sinks, ALiBi, softcap and
// causal; head dim 256 on sm_80 and sm_86 emulators (query blocks of 32
// and 16: each SM's shared memory).
void test_generate_matches_launch(void **) {
  need_runtime();
  struct Case {
    const char *what;
    Shape s;
    bool alibi;
    int sm;  // 0: the group's runtime
  };
  std::vector<Case> cases;
  cases.push_back({"fixed, GQA, sinks", reject_shape(), false, 0});
  Shape v;
  v.bf16 = true, v.causal = true, v.softcap = 20;
  v.batch = 2, v.sq = 9, v.sk = 12, v.hq = 4, v.hkv = 1, v.d = 96, v.dv = 64;
  v.lens_q = {9, 4};
  v.lens_k = {12, 7};
  v.sinks = {0.5f, -1.0f, 0.0f, 2.0f};
  cases.push_back({"varlen, sinks, ALiBi, softcap, causal", v, true, 0});
  Shape w;
  w.bf16 = true;
  w.batch = 1, w.sq = 5, w.sk = 6, w.hq = 2, w.hkv = 2, w.d = 256, w.dv = 256;
  cases.push_back({"head dim 256", w, false, 80});
  cases.push_back({"head dim 256", w, false, 86});
  // sm_90: the sm_90a main kernel, TMA (fixed length) and cp.async (varlen).
  cases.push_back({"fixed, GQA, sinks (sm_90a)", reject_shape(), false, 90});
  cases.push_back({"varlen, sinks, ALiBi, softcap, causal (sm_90a gather)", v, true, 90});
  const fa_kernel_kind kinds[3] = {FA_KERNEL_BACKWARD_PRE, FA_KERNEL_BACKWARD,
                                   FA_KERNEL_BACKWARD_POST};
  const fa::KernelKind inner[3] = {fa::KernelKind::BackwardPre, fa::KernelKind::Backward,
                                   fa::KernelKind::BackwardPost};
  const unsigned bits[3] = {kPre, fa::Runtime::kBackwardMain, kPost};
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  int bad = 0;
  for (const Case &c : cases) {
    std::string why;
    fa_runtime *own = c.sm ? fa::test::make_runtime(FA_BACKEND_EMULATOR, &why, c.sm) : nullptr;
    fa_runtime *rt = c.sm ? own : g_rt;
    assert_non_null(rt);
    fa_runtime_info info = FA_RUNTIME_INFO_INIT;
    assert_int_equal(fa_runtime_get_info(rt, &info), FA_SUCCESS);
    {
      Problem p(rt, c.s, 12);
      fa_backward_args a = p.args();
      if (c.alibi) {
        const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
        a.fwd.alibi_slopes = p.dev.put(slopes.data(), slopes.size() * 4);
      }
      fa_generate_options go = FA_GENERATE_OPTIONS_INIT;
      go.varlen = c.s.varlen() ? 1 : 0;
      go.sinks = c.s.sinks.empty() ? 0 : 1;
      go.alibi = c.alibi ? 1 : 0;
      for (int i = 0; i < 3; ++i) {
        size_t n = 0;
        assert_int_equal(fa_generate_for(p.cfg, kinds[i], info.sm, &go, nullptr, 0, &n),
                         FA_SUCCESS);
        std::string ptx(n + 1, 'x');
        assert_int_equal(fa_generate_for(p.cfg, kinds[i], info.sm, &go, &ptx[0], n + 1, &n),
                         FA_SUCCESS);
        ptx.resize(n);
        const size_t at = ptx.find(".entry ");
        assert_true(at != std::string::npos);
        const std::string entry = ptx.substr(at + 7, ptx.find('(', at) - at - 7);
        // The kernels before it first: the main kernel reads BackwardPre's
        // statistics.
        assert_int_equal(fa::api::backward_kernels(rt, p.cfg, &a, bits[i] | (bits[i] - 1)),
                         FA_SUCCESS);
        const std::string ran = fa::test::emulated_kernel(rt);
        const fa::KernelSpec spec = fa::api::backward_spec(rt, p.cfg, &a, inner[i]);
        const bool same = fa::generate_ptx(spec) == ptx;
        std::printf("%s, sm_%d: ran %s, generated %s%s\n", c.what, info.sm, ran.c_str(),
                    entry.c_str(), same ? "" : " (the runtime's module differs)");
        if (ran != entry || !same) ++bad;
      }
    }
    fa_runtime_destroy(own);
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  assert_int_equal(bad, 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rejected_args),
      cmocka_unit_test(test_workspace_size),
      cmocka_unit_test(test_pre_fixed),
      cmocka_unit_test(test_pre_varlen),
      cmocka_unit_test(test_post_fixed),
      cmocka_unit_test(test_post_varlen),
      cmocka_unit_test(test_dsinks_reference),
      cmocka_unit_test(test_backward_call),
      cmocka_unit_test(test_generate_matches_launch),
  };
  return cmocka_run_group_tests(tests, fa::test::emu_runtime_setup, fa::test::emu_runtime_teardown);
}
