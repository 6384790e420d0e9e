// The C API's argument validation: a table over every argument of every call.
// Each row starts from a valid call, breaks one thing, and checks the exact
// status, a message naming the problem, and that no output byte was written.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn.h"
#include "reference.h"
#include "support/policy.h"

namespace {

constexpr uint8_t kPoison = 0xA5;

// Stores an arbitrary int into an enum field, as a C caller can (a C++ cast
// to an out-of-range enum value would itself be undefined).
template <typename E>
void set_raw(E *field, int v) {
  static_assert(sizeof(E) == sizeof(int), "int-sized enum");
  std::memcpy(field, &v, sizeof v);
}

// fa_generate and fa_status_string as a C caller sees them, taking plain ints.
using GenerateInt = fa_status (*)(const fa_config *, int, int32_t, char *, size_t, size_t *);
using StatusStringInt = const char *(*)(int);
const GenerateInt generate_int = reinterpret_cast<GenerateInt>(&fa_generate);
const StatusStringInt status_string_int = reinterpret_cast<StatusStringInt>(&fa_status_string);

struct State {
  fa_runtime *rt = nullptr;
  fa_config *cfg = nullptr;    // fp16, d 64, 4 q heads, 2 kv heads
  fa_config *cfg32 = nullptr;  // the same with fp32 Q/K/V/O
  // Device buffers (emulator), large enough for every valid call below
  // (q/k/v/o: fp32-sized; aux: int32 block table {0, 1}, then at +64 fp32
  // ALiBi slopes [B][HQ]).
  uint64_t q = 0, k = 0, v = 0, o = 0, lse = 0, seqlens = 0, ws = 0, opart = 0, lsepart = 0;
  uint64_t aux = 0;
  size_t o_bytes = 0, lse_bytes = 0, ws_bytes = 0;
};

constexpr int B = 2, SQ = 5, SK = 7, HQ = 4, HKV = 2, D = 64;

fa_tensor contiguous(uint64_t data, int s, int h, int d) {
  fa_tensor t;
  t.data = data;
  t.stride[3] = 1;
  t.stride[2] = d;
  t.stride[1] = int64_t(h) * d;
  t.stride[0] = int64_t(s) * h * d;
  return t;
}

void fill_device(State *s, uint64_t ptr, size_t bytes, uint32_t seed) {
  // Small random fp16 values (exponent bits kept moderate), never zeros.
  std::vector<uint16_t> host(bytes / 2);
  uint32_t x = seed;
  for (auto &h : host) {
    x = x * 1664525u + 1013904223u;
    h = static_cast<uint16_t>(0x3000u | ((x >> 16) & 0x8fffu));
  }
  assert_int_equal(fa_memcpy_htod(s->rt, ptr, host.data(), bytes), FA_SUCCESS);
}

int setup(void **state) {
  auto *s = new State;
  fa_runtime_options ro = FA_RUNTIME_OPTIONS_INIT;
  ro.backend = FA_BACKEND_EMULATOR;
  ro.cache_mode = FA_CACHE_MEMORY;
  if (fa_runtime_create(&ro, &s->rt) != FA_SUCCESS) {
    print_error("emulator runtime: %s\n", fa_last_error());
    delete s;
    return -1;
  }
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = D;
  d.num_heads_q = HQ;
  d.num_heads_kv = HKV;
  if (fa_config_create(&d, &s->cfg) != FA_SUCCESS) return -1;
  d.dtype = FA_DTYPE_FP32;
  if (fa_config_create(&d, &s->cfg32) != FA_SUCCESS) return -1;
  // fp16 sizes; every allocation holds the fp32 tensors too (twice that).
  const size_t qb = size_t(B) * SQ * HQ * D * 2, kb = size_t(B) * SK * HKV * D * 2;
  s->o_bytes = qb;
  s->lse_bytes = size_t(B) * HQ * SQ * 4;
  s->ws_bytes = size_t(1) << 20;
  fa_malloc(s->rt, 2 * qb, &s->q);
  fa_malloc(s->rt, 2 * kb, &s->k);
  fa_malloc(s->rt, 2 * kb, &s->v);
  fa_malloc(s->rt, 2 * qb, &s->o);
  fa_malloc(s->rt, 256, &s->aux);
  fa_malloc(s->rt, s->lse_bytes, &s->lse);
  fa_malloc(s->rt, B * 4, &s->seqlens);
  fa_malloc(s->rt, s->ws_bytes, &s->ws);
  fa_malloc(s->rt, 3 * qb * 2, &s->opart);
  fa_malloc(s->rt, 3 * s->lse_bytes, &s->lsepart);
  fill_device(s, s->q, 2 * qb, 1);
  fill_device(s, s->k, 2 * kb, 2);
  fill_device(s, s->v, 2 * kb, 3);
  const int32_t lens[B] = {SK, 3};
  fa_memcpy_htod(s->rt, s->seqlens, lens, sizeof lens);
  const int32_t pages[B] = {0, 1};
  fa_memcpy_htod(s->rt, s->aux, pages, sizeof pages);
  const float slopes[B * HQ] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.75f, 0.375f, 0.1875f, 0.09375f};
  fa_memcpy_htod(s->rt, s->aux + 64, slopes, sizeof slopes);
  std::vector<float> part(3 * size_t(B) * SQ * HQ * D, 0.25f), lpart(3 * size_t(B) * HQ * SQ, 1.5f);
  fa_memcpy_htod(s->rt, s->opart, part.data(), part.size() * 4);
  fa_memcpy_htod(s->rt, s->lsepart, lpart.data(), lpart.size() * 4);
  *state = s;
  return 0;
}

int teardown(void **state) {
  auto *s = static_cast<State *>(*state);
  for (uint64_t p :
       {s->q, s->k, s->v, s->o, s->lse, s->seqlens, s->ws, s->opart, s->lsepart, s->aux}) {
    fa_free(s->rt, p);
  }
  fa_config_destroy(s->cfg);
  fa_config_destroy(s->cfg32);
  fa_runtime_destroy(s->rt);
  delete s;
  return 0;
}

// O's whole allocation (fp32-sized) and LSE.
void poison_outputs(State *s) {
  assert_int_equal(fa_memset(s->rt, s->o, kPoison, 2 * s->o_bytes), FA_SUCCESS);
  assert_int_equal(fa_memset(s->rt, s->lse, kPoison, s->lse_bytes), FA_SUCCESS);
}

// True when every output byte still holds the poison.
bool outputs_untouched(State *s) {
  std::vector<uint8_t> o(2 * s->o_bytes), l(s->lse_bytes);
  fa_memcpy_dtoh(s->rt, o.data(), s->o, o.size());
  fa_memcpy_dtoh(s->rt, l.data(), s->lse, l.size());
  for (uint8_t b : o) {
    if (b != kPoison) return false;
  }
  for (uint8_t b : l) {
    if (b != kPoison) return false;
  }
  return true;
}

// Checks a rejected call: exact status, a message containing `needle` and
// the API name, and untouched outputs.
void expect_rejected(State *s, const char *row, fa_status got, fa_status want, const char *api,
                     const char *needle) {
  const std::string msg = fa_last_error();
  if (got != want || msg.find(needle) == std::string::npos || msg.find(api) == std::string::npos) {
    print_error("row '%s': status %d (%s), want %d; message \"%s\", want it to contain \"%s\"\n",
                row, got, fa_status_string(got), want, msg.c_str(), needle);
    fail();
  }
  if (s && !outputs_untouched(s)) {
    print_error("row '%s': output written although the call was rejected\n", row);
    fail();
  }
}

// Runs a table of rejected calls: each row breaks a copy of `valid`, and
// call(args) must return the row's status and message and write nothing.
template <typename Row, size_t N, typename Args, typename Call>
void run_table(State *s, const Row (&rows)[N], const Args &valid, const char *api, Call call) {
  for (const Row &r : rows) {
    Args a = valid;
    r.mutate(a);
    poison_outputs(s);
    expect_rejected(s, r.name, call(a), r.want, api, r.needle);
  }
}

// ---------------------------------------------------------------- configs --

struct ConfigRow {
  const char *name;
  std::function<void(fa_config_desc &)> mutate;
  fa_status want;
  const char *needle;
};

void test_config_table(void **) {
  const ConfigRow rows[] = {
      {"struct_size 0", [](fa_config_desc &d) { d.struct_size = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "struct_size"},
      {"struct_size +8", [](fa_config_desc &d) { d.struct_size += 8; }, FA_ERROR_INVALID_ARGUMENT,
       "struct_size"},
      {"dtype 0", [](fa_config_desc &d) { set_raw(&d.dtype, 0); }, FA_ERROR_INVALID_ARGUMENT,
       "dtype"},
      {"dtype fp8", [](fa_config_desc &d) { d.dtype = FA_DTYPE_FP8_E4M3; },
       FA_ERROR_INVALID_ARGUMENT, "dtype"},
      {"head_dim 0", [](fa_config_desc &d) { d.head_dim = 0; }, FA_ERROR_UNSUPPORTED, "head_dim"},
      {"head_dim 60", [](fa_config_desc &d) { d.head_dim = 60; }, FA_ERROR_UNSUPPORTED, "head_dim"},
      {"head_dim 584", [](fa_config_desc &d) { d.head_dim = 584; }, FA_ERROR_UNSUPPORTED,
       "head_dim must be a multiple of 8 in 8..576"},
      {"head_dim 580", [](fa_config_desc &d) { d.head_dim = 580; }, FA_ERROR_UNSUPPORTED,
       "head_dim"},
      {"head_dim -8", [](fa_config_desc &d) { d.head_dim = -8; }, FA_ERROR_UNSUPPORTED, "head_dim"},
      {"head_dim_v 12", [](fa_config_desc &d) { d.head_dim_v = 12; }, FA_ERROR_UNSUPPORTED,
       "head_dim_v"},
      {"head_dim_v 520", [](fa_config_desc &d) { d.head_dim_v = 520; }, FA_ERROR_UNSUPPORTED,
       "head_dim_v must be a multiple of 8 in 8..512"},
      {"head_dim_v 576", [](fa_config_desc &d) { d.head_dim_v = 576; }, FA_ERROR_UNSUPPORTED,
       "head_dim_v"},
      {"num_heads_q 0", [](fa_config_desc &d) { d.num_heads_q = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "num_heads_q"},
      {"num_heads_kv 0", [](fa_config_desc &d) { d.num_heads_kv = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "num_heads_kv"},
      {"num_heads_kv -1", [](fa_config_desc &d) { d.num_heads_kv = -1; }, FA_ERROR_INVALID_ARGUMENT,
       "num_heads_kv"},
      {"heads not divisible",
       [](fa_config_desc &d) {
         d.num_heads_q = 6;
         d.num_heads_kv = 4;
       },
       FA_ERROR_INVALID_ARGUMENT, "multiple of num_heads_kv"},
      {"causal 2", [](fa_config_desc &d) { d.causal = 2; }, FA_ERROR_INVALID_ARGUMENT, "causal"},
      {"window_left -2", [](fa_config_desc &d) { d.window_left = -2; }, FA_ERROR_INVALID_ARGUMENT,
       "window_left"},
      {"window_right -5", [](fa_config_desc &d) { d.window_right = -5; }, FA_ERROR_INVALID_ARGUMENT,
       "window_right"},
      {"scale negative", [](fa_config_desc &d) { d.softmax_scale = -1.0f; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale"},
      {"scale NaN", [](fa_config_desc &d) { d.softmax_scale = NAN; }, FA_ERROR_INVALID_ARGUMENT,
       "softmax_scale"},
      {"scale inf", [](fa_config_desc &d) { d.softmax_scale = INFINITY; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale"},
      {"softcap negative", [](fa_config_desc &d) { d.softcap = -30.0f; }, FA_ERROR_INVALID_ARGUMENT,
       "softcap"},
      {"softcap NaN", [](fa_config_desc &d) { d.softcap = NAN; }, FA_ERROR_INVALID_ARGUMENT,
       "softcap"},
      // The kernels use softmax_scale * log2(e) (or scale / softcap and
      // softcap * log2(e)): each must be a finite float.
      {"scale * log2e overflows", [](fa_config_desc &d) { d.softmax_scale = 3e38f; },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale * log2(e) overflows"},
      {"softcap * log2e overflows", [](fa_config_desc &d) { d.softcap = 3e38f; },
       FA_ERROR_INVALID_ARGUMENT, "softcap * log2(e) overflows"},
      {"scale / softcap overflows",
       [](fa_config_desc &d) {
         d.softmax_scale = 1e30f;
         d.softcap = 1e-30f;
       },
       FA_ERROR_INVALID_ARGUMENT, "softmax_scale / softcap"},
  };
  for (const ConfigRow &r : rows) {
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.head_dim = 64;
    d.num_heads_q = 8;
    d.num_heads_kv = 2;
    r.mutate(d);
    fa_config *cfg = reinterpret_cast<fa_config *>(0x1);
    const fa_status st = fa_config_create(&d, &cfg);
    expect_rejected(nullptr, r.name, st, r.want, "fa_config_create", r.needle);
    assert_null(cfg);
  }
  fa_config *cfg = nullptr;
  expect_rejected(nullptr, "desc NULL", fa_config_create(nullptr, &cfg), FA_ERROR_INVALID_ARGUMENT,
                  "fa_config_create", "desc is NULL");
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 64;
  d.num_heads_q = d.num_heads_kv = 1;
  expect_rejected(nullptr, "out NULL", fa_config_create(&d, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_config_create", "out is NULL");
  // Every valid head_dim is accepted, and a valid call clears the last error.
  for (int hd = 8; hd <= 256; hd += 8) {
    d.head_dim = hd;
    assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
    assert_string_equal(fa_last_error(), "");
    fa_config_destroy(cfg);
  }
  fa_config_destroy(nullptr);
}

// ---------------------------------------------------------------- forward --

struct ForwardRow {
  const char *name;
  std::function<void(fa_forward_args &)> mutate;
  fa_status want;
  const char *needle;
};

fa_forward_args valid_forward(State *s) {
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = B;
  a.seqlen_q = SQ;
  a.seqlen_k = SK;
  a.q = contiguous(s->q, SQ, HQ, D);
  a.k = contiguous(s->k, SK, HKV, D);
  a.v = contiguous(s->v, SK, HKV, D);
  a.o = contiguous(s->o, SQ, HQ, D);
  a.lse = s->lse;
  return a;
}

void test_forward_table(void **state) {
  auto *s = static_cast<State *>(*state);
  const ForwardRow rows[] = {
      {"struct_size 0", [](fa_forward_args &a) { a.struct_size = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "struct_size"},
      {"struct_size small", [](fa_forward_args &a) { a.struct_size -= 4; },
       FA_ERROR_INVALID_ARGUMENT, "struct_size"},
      {"sinks misaligned", [](fa_forward_args &a) { a.sinks = a.lse + 2; },
       FA_ERROR_INVALID_ARGUMENT, "sinks 0x"},
      {"batch 0", [](fa_forward_args &a) { a.batch = 0; }, FA_ERROR_INVALID_ARGUMENT, "batch"},
      {"batch -1", [](fa_forward_args &a) { a.batch = -1; }, FA_ERROR_INVALID_ARGUMENT, "batch"},
      {"seqlen_q 0", [](fa_forward_args &a) { a.seqlen_q = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "seqlen_q"},
      {"seqlen_k 0", [](fa_forward_args &a) { a.seqlen_k = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "seqlen_k"},
      {"seqlen_q > FA_MAX_SEQLEN", [](fa_forward_args &a) { a.seqlen_q = FA_MAX_SEQLEN + 1; },
       FA_ERROR_UNSUPPORTED, "seqlen_q is 1073741825, more than FA_MAX_SEQLEN"},
      {"seqlen_k INT32_MAX", [](fa_forward_args &a) { a.seqlen_k = INT32_MAX; },
       FA_ERROR_UNSUPPORTED, "FA_MAX_SEQLEN"},
      {"batch past grid z", [](fa_forward_args &a) { a.batch = 65536; }, FA_ERROR_UNSUPPORTED,
       "exceeds the device limits"},
      {"q null", [](fa_forward_args &a) { a.q.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "q.data is 0"},
      {"k null", [](fa_forward_args &a) { a.k.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "k.data is 0"},
      {"v null", [](fa_forward_args &a) { a.v.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "v.data is 0"},
      {"o null", [](fa_forward_args &a) { a.o.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "o.data is 0"},
      {"q misaligned", [](fa_forward_args &a) { a.q.data += 2; }, FA_ERROR_INVALID_ARGUMENT,
       "q.data"},
      {"k misaligned", [](fa_forward_args &a) { a.k.data += 8; }, FA_ERROR_INVALID_ARGUMENT,
       "k.data"},
      {"v misaligned", [](fa_forward_args &a) { a.v.data += 4; }, FA_ERROR_INVALID_ARGUMENT,
       "v.data"},
      {"o misaligned", [](fa_forward_args &a) { a.o.data += 2; }, FA_ERROR_INVALID_ARGUMENT,
       "o.data"},
      {"q last stride 2", [](fa_forward_args &a) { a.q.stride[3] = 2; }, FA_ERROR_INVALID_ARGUMENT,
       "q.stride[3] must be 1, got 2"},
      {"k last stride 0", [](fa_forward_args &a) { a.k.stride[3] = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "k.stride[3]"},
      {"v last stride", [](fa_forward_args &a) { a.v.stride[3] = 64; }, FA_ERROR_INVALID_ARGUMENT,
       "v.stride[3]"},
      {"o last stride", [](fa_forward_args &a) { a.o.stride[3] = -1; }, FA_ERROR_INVALID_ARGUMENT,
       "o.stride[3]"},
      {"q head stride odd", [](fa_forward_args &a) { a.q.stride[2] = 65; },
       FA_ERROR_INVALID_ARGUMENT, "q.stride[2]"},
      {"k seq stride negative", [](fa_forward_args &a) { a.k.stride[1] = -128; },
       FA_ERROR_INVALID_ARGUMENT, "k.stride[1]"},
      {"v batch stride odd", [](fa_forward_args &a) { a.v.stride[0] = 4; },
       FA_ERROR_INVALID_ARGUMENT, "v.stride[0]"},
      {"lse misaligned", [](fa_forward_args &a) { a.lse += 2; }, FA_ERROR_INVALID_ARGUMENT, "lse"},
      {"cu_seqlens_q alone", [](fa_forward_args &a) { a.cu_seqlens_q = a.lse; },
       FA_ERROR_INVALID_ARGUMENT, "cu_seqlens"},
      {"cu_seqlens_k alone", [](fa_forward_args &a) { a.cu_seqlens_k = a.lse; },
       FA_ERROR_INVALID_ARGUMENT, "cu_seqlens"},
      {"workspace misaligned",
       [](fa_forward_args &a) {
         a.workspace = a.lse + 4;
         a.workspace_size = 8;
       },
       FA_ERROR_INVALID_ARGUMENT, "workspace 0x"},
      {"workspace_size 4",
       [](fa_forward_args &a) {
         a.workspace = a.lse;
         a.workspace_size = 4;
       },
       FA_ERROR_INVALID_ARGUMENT, "workspace_size is 4"},
      {"workspace_size alone", [](fa_forward_args &a) { a.workspace_size = 8; },
       FA_ERROR_INVALID_ARGUMENT, "workspace_size is 8 but workspace is 0"},
      {"workspace past 2^64",
       [](fa_forward_args &a) {
         a.workspace = UINT64_MAX - 7;
         a.workspace_size = 16;
       },
       FA_ERROR_INVALID_ARGUMENT, "workspace"},
  };
  run_table(s, rows, valid_forward(s), "fa_launch",
            [&](const fa_forward_args &a) { return fa_launch(s->rt, s->cfg, &a, nullptr); });
  fa_forward_args a = valid_forward(s);
  poison_outputs(s);
  expect_rejected(s, "rt NULL", fa_launch(nullptr, s->cfg, &a, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_launch", "rt is NULL");
  expect_rejected(s, "cfg NULL", fa_launch(s->rt, nullptr, &a, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_launch", "cfg is NULL");
  expect_rejected(s, "args NULL", fa_launch(s->rt, s->cfg, nullptr, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_launch", "args is NULL");
  // The unbroken call works and writes every output element.
  assert_int_equal(fa_launch(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  assert_false(outputs_untouched(s));
  std::vector<uint16_t> o(s->o_bytes / 2);
  fa_memcpy_dtoh(s->rt, o.data(), s->o, s->o_bytes);
  for (uint16_t h : o) assert_int_not_equal(h, 0xA5A5);
  // 0.8's workspace: a valid one is accepted (ignored by this kernel); a
  // 0.7-sized struct never reads the fields past it (garbage there is fine).
  a.workspace = s->ws;
  a.workspace_size = 8;
  assert_int_equal(fa_launch(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  a.struct_size = FA_FORWARD_ARGS_SIZE_0_7;
  a.workspace = 3;
  a.workspace_size = 1;
  poison_outputs(s);
  assert_int_equal(fa_launch(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  assert_false(outputs_untouched(s));
  // fa_forward_workspace_size: 0 for this (non-persistent) kernel with the
  // GQA packing off, whatever the workspace fields hold, with any released
  // struct_size; with it (5 queries x a group of 2 <= 16 rows: the decode
  // kernel), 256 bytes and the decode kernel's partial states.
  size_t ws = 7;
  {
    fa::test::PolicyScope nopack(s->rt, &fa::KernelPolicy::forward_gqa_pack, false);
    assert_int_equal(fa_forward_workspace_size(s->rt, s->cfg, &a, &ws), FA_SUCCESS);
    assert_int_equal(ws, 0);
    a.struct_size = sizeof a;
    ws = 7;
    assert_int_equal(fa_forward_workspace_size(s->rt, s->cfg, &a, &ws), FA_SUCCESS);
    assert_int_equal(ws, 0);
  }
  assert_int_equal(fa_forward_workspace_size(s->rt, s->cfg, &a, &ws), FA_SUCCESS);
  assert_true(ws > 256);
  expect_rejected(nullptr, "ws bytes NULL", fa_forward_workspace_size(s->rt, s->cfg, &a, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_forward_workspace_size", "bytes is NULL");
  expect_rejected(nullptr, "ws args NULL", fa_forward_workspace_size(s->rt, s->cfg, nullptr, &ws),
                  FA_ERROR_INVALID_ARGUMENT, "fa_forward_workspace_size", "args is NULL");
  a.struct_size = FA_FORWARD_ARGS_SIZE_0_7 + 4;
  expect_rejected(nullptr, "ws struct_size", fa_forward_workspace_size(s->rt, s->cfg, &a, &ws),
                  FA_ERROR_INVALID_ARGUMENT, "fa_forward_workspace_size", "struct_size");
  a.struct_size = sizeof a;
  a.seqlen_q = 0;
  expect_rejected(nullptr, "ws seqlen_q", fa_forward_workspace_size(s->rt, s->cfg, &a, &ws),
                  FA_ERROR_INVALID_ARGUMENT, "fa_forward_workspace_size", "seqlen_q");
}

// ----------------------------------------------------------------- decode --

struct DecodeRow {
  const char *name;
  std::function<void(fa_decode_args &)> mutate;
  fa_status want;
  const char *needle;
};

fa_decode_args valid_decode(State *s) {
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = B;
  a.seqlen_q = 1;
  a.seqlen_k_max = SK;
  a.q = contiguous(s->q, 1, HQ, D);
  a.k_cache = contiguous(s->k, SK, HKV, D);
  a.v_cache = contiguous(s->v, SK, HKV, D);
  a.cache_seqlens = s->seqlens;
  a.workspace = s->ws;
  a.workspace_size = s->ws_bytes;
  a.o = contiguous(s->o, 1, HQ, D);
  a.lse = s->lse;
  return a;
}

// A KV append of one token per sequence (k_new, v_new: the first rows of q
// and k) with RoPE over a one-row fp32 table (the LSE buffer).
void with_append(fa_decode_args &a) {
  a.k_new = a.k_cache;
  a.v_new = a.v_cache;
  a.seqlen_new = 1;
  a.rotary_dim = 16;
  a.rotary_cos = a.rotary_sin = a.lse;
  a.seqlen_ro = 1;
}

void test_decode_table(void **state) {
  auto *s = static_cast<State *>(*state);
  const DecodeRow rows[] = {
      {"struct_size", [](fa_decode_args &a) { a.struct_size = 8; }, FA_ERROR_INVALID_ARGUMENT,
       "struct_size"},
      {"batch 0", [](fa_decode_args &a) { a.batch = 0; }, FA_ERROR_INVALID_ARGUMENT, "batch"},
      {"sinks misaligned", [](fa_decode_args &a) { a.sinks = a.lse + 1; },
       FA_ERROR_INVALID_ARGUMENT, "sinks 0x"},
      {"sinks without o", [](fa_decode_args &a) { a.sinks = a.lse, a.o.data = 0, a.lse = 0; },
       FA_ERROR_INVALID_ARGUMENT, "sinks is set but o.data is 0"},
      {"seqlen_q 0", [](fa_decode_args &a) { a.seqlen_q = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "seqlen_q"},
      {"seqlen_k_max 0", [](fa_decode_args &a) { a.seqlen_k_max = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "seqlen_k_max"},
      {"seqlen_k_max > FA_MAX_SEQLEN", [](fa_decode_args &a) { a.seqlen_k_max = INT32_MAX; },
       FA_ERROR_UNSUPPORTED, "seqlen_k_max is 2147483647, more than FA_MAX_SEQLEN"},
      {"group rows > FA_MAX_SEQLEN", [](fa_decode_args &a) { a.seqlen_q = FA_MAX_SEQLEN; },
       FA_ERROR_UNSUPPORTED, "(num_heads_q / num_heads_kv) * seqlen_q"},
      {"num_splits -1", [](fa_decode_args &a) { a.num_splits = -1; }, FA_ERROR_INVALID_ARGUMENT,
       "num_splits"},
      {"q null", [](fa_decode_args &a) { a.q.data = 0; }, FA_ERROR_INVALID_ARGUMENT, "q.data is 0"},
      {"k_cache null", [](fa_decode_args &a) { a.k_cache.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "k_cache.data is 0"},
      {"v_cache misaligned", [](fa_decode_args &a) { a.v_cache.data += 2; },
       FA_ERROR_INVALID_ARGUMENT, "v_cache.data"},
      {"k_cache last stride", [](fa_decode_args &a) { a.k_cache.stride[3] = 3; },
       FA_ERROR_INVALID_ARGUMENT, "k_cache.stride[3]"},
      {"v_cache head stride", [](fa_decode_args &a) { a.v_cache.stride[2] = 12; },
       FA_ERROR_INVALID_ARGUMENT, "v_cache.stride[2]"},
      {"cache_seqlens null", [](fa_decode_args &a) { a.cache_seqlens = 0; },
       FA_ERROR_INVALID_ARGUMENT, "cache_seqlens"},
      {"cache_seqlens misaligned", [](fa_decode_args &a) { a.cache_seqlens += 1; },
       FA_ERROR_INVALID_ARGUMENT, "cache_seqlens"},
      {"workspace null", [](fa_decode_args &a) { a.workspace = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "workspace"},
      {"workspace misaligned", [](fa_decode_args &a) { a.workspace += 16; },
       FA_ERROR_INVALID_ARGUMENT, "workspace"},
      {"workspace too small", [](fa_decode_args &a) { a.workspace_size = 64; },
       FA_ERROR_INVALID_ARGUMENT, "workspace_size"},
      {"o misaligned", [](fa_decode_args &a) { a.o.data += 2; }, FA_ERROR_INVALID_ARGUMENT,
       "o.data"},
      {"o stride", [](fa_decode_args &a) { a.o.stride[1] = 7; }, FA_ERROR_INVALID_ARGUMENT,
       "o.stride[1]"},
      {"lse without o", [](fa_decode_args &a) { a.o.data = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "lse is set"},
      {"lse misaligned", [](fa_decode_args &a) { a.lse += 1; }, FA_ERROR_INVALID_ARGUMENT, "lse"},
      // Byte spans (fp16 here; the fp32 rows are in test_decode_spans): the
      // KV append's arrays.
      {"k_new.stride[0] 2^62: 2^63 bytes",
       [](fa_decode_args &a) {
         with_append(a);
         a.k_new.stride[0] = int64_t(1) << 62;
       },
       FA_ERROR_INVALID_ARGUMENT, "k_new.stride[0] * (batch - 1) overflows a 64-bit byte offset"},
      {"rotary_positions_stride 2^62 wraps",
       [](fa_decode_args &a) {
         with_append(a);
         a.rotary_positions = a.lse;
         a.rotary_positions_stride = int64_t(1) << 62;
       },
       FA_ERROR_INVALID_ARGUMENT,
       "rotary_positions_stride * (batch - 1) overflows a 64-bit byte offset"},
      {"rotary_cos past 2^64",
       [](fa_decode_args &a) {
         with_append(a);
         a.rotary_cos = ~uint64_t(3);
       },
       FA_ERROR_INVALID_ARGUMENT, "rotary_cos 0xfffffffffffffffc"},
  };
  run_table(s, rows, valid_decode(s), "fa_decode",
            [&](const fa_decode_args &a) { return fa_decode(s->rt, s->cfg, &a, nullptr); });
  fa_decode_args a = valid_decode(s);
  size_t bytes = 0;
  int32_t splits = 0;
  expect_rejected(nullptr, "ws bytes NULL",
                  fa_decode_workspace_size(s->rt, s->cfg, &a, nullptr, &splits),
                  FA_ERROR_INVALID_ARGUMENT, "fa_decode_workspace_size", "bytes is NULL");
  a.batch = 0;
  expect_rejected(nullptr, "ws batch 0",
                  fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, &splits),
                  FA_ERROR_INVALID_ARGUMENT, "fa_decode_workspace_size", "batch");
  // splits * batch * seqlen_q * heads * head_dim_v * 4 bytes past 2^64: an
  // error, never a wrapped (small) size.
  a.batch = INT32_MAX;
  a.seqlen_q = 1 << 29;
  a.seqlen_k_max = FA_MAX_SEQLEN;
  a.num_splits = 128;
  bytes = 12345;
  expect_rejected(nullptr, "ws overflows 64 bits",
                  fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, &splits),
                  FA_ERROR_UNSUPPORTED, "fa_decode_workspace_size", "decode workspace too large");
  assert_int_equal(bytes, 12345);
  expect_rejected(nullptr, "decode ws overflows 64 bits", fa_decode(s->rt, s->cfg, &a, nullptr),
                  FA_ERROR_UNSUPPORTED, "fa_decode", "decode workspace too large");
  a = valid_decode(s);
  assert_int_equal(fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, &splits), FA_SUCCESS);
  assert_true(bytes > 0 && bytes <= s->ws_bytes);
  assert_true(splits >= 1);
  poison_outputs(s);
  assert_int_equal(fa_decode(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  assert_false(outputs_untouched(s));

  // cache_seqlens lives on the device, so out-of-range values cannot be
  // rejected up front: the kernel clamps them to [0, seqlen_k_max] and never
  // reads past the cache (the emulator would report any stray access).
  const int32_t bad_lens[B] = {SK + 1000, -5};
  fa_memcpy_htod(s->rt, s->seqlens, bad_lens, sizeof bad_lens);
  poison_outputs(s);
  assert_int_equal(fa_decode(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  std::vector<float> lse(size_t(B) * HQ);
  fa_memcpy_dtoh(s->rt, lse.data(), s->lse, lse.size() * 4);
  for (int h = 0; h < HQ; ++h) {
    assert_true(std::isfinite(lse[h]));                       // clamped to SK keys
    assert_true(std::isinf(lse[HQ + h]) && lse[HQ + h] < 0);  // clamped to 0 keys
  }
  const int32_t lens[B] = {SK, 3};
  fa_memcpy_htod(s->rt, s->seqlens, lens, sizeof lens);
}

// ----------------------------------------------------------------- reduce --

struct ReduceRow {
  const char *name;
  std::function<void(fa_reduce_args &)> mutate;
  fa_status want;
  const char *needle;
};

fa_reduce_args valid_reduce(State *s) {
  fa_reduce_args a = FA_REDUCE_ARGS_INIT;
  a.num_splits = 3;
  a.batch = B;
  a.seqlen_q = SQ;
  a.o_partial = s->opart;
  a.o_partial_stride[4] = 1;
  a.o_partial_stride[3] = D;
  a.o_partial_stride[2] = int64_t(HQ) * D;
  a.o_partial_stride[1] = int64_t(SQ) * HQ * D;
  a.o_partial_stride[0] = int64_t(B) * SQ * HQ * D;
  a.lse_partial = s->lsepart;
  a.lse_partial_stride[3] = 1;
  a.lse_partial_stride[2] = SQ;
  a.lse_partial_stride[1] = int64_t(HQ) * SQ;
  a.lse_partial_stride[0] = int64_t(B) * HQ * SQ;
  a.o = contiguous(s->o, SQ, HQ, D);
  a.lse = s->lse;
  return a;
}

void test_reduce_table(void **state) {
  auto *s = static_cast<State *>(*state);
  const ReduceRow rows[] = {
      {"struct_size", [](fa_reduce_args &a) { a.struct_size = 1; }, FA_ERROR_INVALID_ARGUMENT,
       "struct_size"},
      {"num_splits 0", [](fa_reduce_args &a) { a.num_splits = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "num_splits"},
      {"batch 0", [](fa_reduce_args &a) { a.batch = 0; }, FA_ERROR_INVALID_ARGUMENT, "batch"},
      {"sinks misaligned", [](fa_reduce_args &a) { a.sinks = a.lse + 3; },
       FA_ERROR_INVALID_ARGUMENT, "sinks 0x"},
      {"seqlen_q 0", [](fa_reduce_args &a) { a.seqlen_q = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "seqlen_q"},
      {"o_partial null", [](fa_reduce_args &a) { a.o_partial = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "o_partial"},
      {"o_partial misaligned", [](fa_reduce_args &a) { a.o_partial += 2; },
       FA_ERROR_INVALID_ARGUMENT, "o_partial"},
      {"lse_partial null", [](fa_reduce_args &a) { a.lse_partial = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "lse_partial"},
      {"o_partial last stride", [](fa_reduce_args &a) { a.o_partial_stride[4] = 2; },
       FA_ERROR_INVALID_ARGUMENT, "o_partial_stride[4]"},
      {"o_partial stride negative", [](fa_reduce_args &a) { a.o_partial_stride[1] = -1; },
       FA_ERROR_INVALID_ARGUMENT, "o_partial_stride[1]"},
      {"lse_partial stride negative", [](fa_reduce_args &a) { a.lse_partial_stride[0] = -4; },
       FA_ERROR_INVALID_ARGUMENT, "lse_partial_stride[0]"},
      {"o null", [](fa_reduce_args &a) { a.o.data = 0; }, FA_ERROR_INVALID_ARGUMENT, "o.data is 0"},
      {"o last stride", [](fa_reduce_args &a) { a.o.stride[3] = 0; }, FA_ERROR_INVALID_ARGUMENT,
       "o.stride[3]"},
      {"lse misaligned", [](fa_reduce_args &a) { a.lse += 3; }, FA_ERROR_INVALID_ARGUMENT, "lse"},
      // batch * seqlen_q * num_heads_q rows: the grid would need more than
      // 2^31 CTAs (an int32 grid size would have wrapped to a small one).
      {"rows past the grid",
       [](fa_reduce_args &a) {
         a.batch = (1 << 20) + 1;  // 2^40 + 2^20 CTAs: 2^20 if truncated to 32 bits
         a.seqlen_q = 1 << 20;
       },
       FA_ERROR_UNSUPPORTED, "exceeds the device limits"},
      {"rows past 2^63",
       [](fa_reduce_args &a) {
         a.batch = INT32_MAX;
         a.seqlen_q = INT32_MAX;
         a.lse = 0;  // [batch, heads, seqlen_q] would pass 2^63 bytes (next row)
       },
       FA_ERROR_UNSUPPORTED, "exceeds the device limits"},
      {"lse past 2^63 bytes",
       [](fa_reduce_args &a) {
         a.batch = INT32_MAX;
         a.seqlen_q = INT32_MAX;
       },
       FA_ERROR_INVALID_ARGUMENT,
       "num_heads_q * seqlen_q * (batch - 1) overflows a 64-bit byte offset in lse"},
  };
  run_table(s, rows, valid_reduce(s), "fa_decode_reduce",
            [&](const fa_reduce_args &a) { return fa_decode_reduce(s->rt, s->cfg, &a, nullptr); });
  fa_reduce_args a = valid_reduce(s);
  poison_outputs(s);
  assert_int_equal(fa_decode_reduce(s->rt, s->cfg, &a, nullptr), FA_SUCCESS);
  // All partial states are 0.25 with equal LSE 1.5: O = 0.25, LSE = 1.5 + log(3).
  std::vector<uint16_t> o(size_t(B) * SQ * HQ * D);
  std::vector<float> lse(size_t(B) * HQ * SQ);
  fa_memcpy_dtoh(s->rt, o.data(), s->o, o.size() * 2);
  fa_memcpy_dtoh(s->rt, lse.data(), s->lse, lse.size() * 4);
  for (uint16_t h : o) assert_int_equal(h, 0x3400);  // 0.25 in fp16
  for (float l : lse) assert_true(std::fabs(l - (1.5f + std::log(3.0f))) < 1e-5f);
}

// ------------------------------------------------------------- byte spans --
//
// Every array a kernel indexes must end less than 2^63 bytes past its start
// (offsets are signed 64-bit) and below 2^64 (issue 24: an fp32
// k.stride[0] of 2^62 over a batch of 2 put sequence 1 at k.data + 2^64 =
// k.data, and fa_launch returned FA_SUCCESS). The fp32 config makes a stride
// of 2^62 elements wrap exactly.

constexpr int64_t k2e62 = int64_t(1) << 62;
constexpr uint64_t kTop = ~uint64_t(0xff);  // 256-byte aligned, 256 bytes below 2^64

// Sequence b's K/V is page b (kv.block_table = aux = {0, 1}).
void paged(State *s, fa_kv_cache_layout &kv, int64_t table_stride) {
  kv.layout = FA_KV_PAGED;
  kv.page_size = SK;
  kv.num_pages = B;
  kv.max_pages_per_seq = 1;
  kv.block_table = s->aux;
  kv.block_table_stride = table_stride;
}

// Pointer arrays: k_ptrs = v_ptrs = aux + 128 (never read: refused first).
void ptr_array(State *s, fa_kv_cache_layout &kv, fa_tensor &k, fa_tensor &v) {
  kv.layout = FA_KV_PTR_ARRAY;
  kv.k_ptrs = kv.v_ptrs = s->aux + 128;
  k.data = v.data = 0;
}

// ALiBi slopes (aux + 64, fp32 [B][HQ]) `stride` elements apart.
void slopes(State *s, uint64_t &p, int64_t &p_stride, int64_t stride) {
  p = s->aux + 64;
  p_stride = stride;
}

void test_forward_spans(void **state) {
  auto *s = static_cast<State *>(*state);
  const ForwardRow rows[] = {
      {"k.stride[0] 2^62 wraps to 0", [](fa_forward_args &a) { a.k.stride[0] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT, "k.stride[0] * (batch - 1) overflows a 64-bit byte offset"},
      {"q.stride[0] 2^61: 2^63 bytes", [](fa_forward_args &a) { a.q.stride[0] = k2e62 / 2; },
       FA_ERROR_INVALID_ARGUMENT, "q.stride[0] * (batch - 1) overflows"},
      {"v.stride[1] 2^60", [](fa_forward_args &a) { a.v.stride[1] = k2e62 / 4; },
       FA_ERROR_INVALID_ARGUMENT, "v.stride[1] * (seqlen_k - 1) overflows"},
      {"o.stride[2] 2^61", [](fa_forward_args &a) { a.o.stride[2] = k2e62 / 2; },
       FA_ERROR_INVALID_ARGUMENT, "o.stride[2] * (num_heads_q - 1) overflows"},
      // 2^61 + 6 * 2^60 bytes: each term fits, their sum is 2^63.
      {"k's terms add past 2^63",
       [](fa_forward_args &a) {
         a.k.stride[0] = k2e62 / 8;
         a.k.stride[1] = k2e62 / 16;
       },
       FA_ERROR_INVALID_ARGUMENT, "k: the byte offset of its last element overflows"},
      {"kv.block_table_stride 2^62 wraps", [s](fa_forward_args &a) { paged(s, a.kv, k2e62); },
       FA_ERROR_INVALID_ARGUMENT,
       "kv.block_table_stride * (batch - 1) overflows a 64-bit byte offset"},
      {"paged k.stride[0] 2^62 over the pages",
       [s](fa_forward_args &a) {
         paged(s, a.kv, 1);
         a.k.stride[0] = k2e62;
       },
       FA_ERROR_INVALID_ARGUMENT, "k.stride[0] * (kv.num_pages - 1) overflows"},
      {"pointer-array v.stride[1] 2^61",
       [s](fa_forward_args &a) { ptr_array(s, a.kv, a.k, a.v), a.v.stride[1] = k2e62 / 2; },
       FA_ERROR_INVALID_ARGUMENT, "v.stride[1] * (seqlen_k - 1) overflows"},
      {"kv.k_ptrs past 2^64",
       [s](fa_forward_args &a) {
         ptr_array(s, a.kv, a.k, a.v);
         a.kv.k_ptrs = ~uint64_t(7);
       },
       FA_ERROR_INVALID_ARGUMENT, "kv.k_ptrs 0xfffffffffffffff8"},
      {"alibi_slopes_stride 2^62 wraps",
       [s](fa_forward_args &a) { slopes(s, a.alibi_slopes, a.alibi_slopes_stride, k2e62); },
       FA_ERROR_INVALID_ARGUMENT,
       "alibi_slopes_stride * (batch - 1) overflows a 64-bit byte offset"},
      {"q.data past 2^64", [](fa_forward_args &a) { a.q.data = kTop; }, FA_ERROR_INVALID_ARGUMENT,
       "q.data 0xffffffffffffff00"},
      // LSE's 160 bytes from 64 bytes below 2^64.
      {"lse past 2^64", [](fa_forward_args &a) { a.lse = ~uint64_t(0x3f); },
       FA_ERROR_INVALID_ARGUMENT, "lse 0xffffffffffffffc0 plus the 160 bytes"},
      {"sinks past 2^64", [](fa_forward_args &a) { a.sinks = ~uint64_t(3); },
       FA_ERROR_INVALID_ARGUMENT, "sinks 0xfffffffffffffffc"},
      {"cu_seqlens_q past 2^64",
       [](fa_forward_args &a) {
         a.cu_seqlens_q = ~uint64_t(7);
         a.cu_seqlens_k = a.lse;
       },
       FA_ERROR_INVALID_ARGUMENT, "cu_seqlens_q 0xfffffffffffffff8"},
  };
  run_table(s, rows, valid_forward(s), "fa_launch",
            [&](const fa_forward_args &a) { return fa_launch(s->rt, s->cfg32, &a, nullptr); });
  // The same arguments unbroken (contiguous, paged, ALiBi) run.
  fa_forward_args a = valid_forward(s);
  assert_int_equal(fa_launch(s->rt, s->cfg32, &a, nullptr), FA_SUCCESS);
  paged(s, a.kv, 1);
  slopes(s, a.alibi_slopes, a.alibi_slopes_stride, HQ);
  assert_int_equal(fa_launch(s->rt, s->cfg32, &a, nullptr), FA_SUCCESS);
}

void test_decode_spans(void **state) {
  auto *s = static_cast<State *>(*state);
  const DecodeRow rows[] = {
      {"k_cache.stride[0] 2^62 wraps", [](fa_decode_args &a) { a.k_cache.stride[0] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT, "k_cache.stride[0] * (batch - 1) overflows a 64-bit byte offset"},
      {"q.stride[0] 2^62 wraps", [](fa_decode_args &a) { a.q.stride[0] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT, "q.stride[0] * (batch - 1) overflows"},
      {"o.stride[2] 2^61", [](fa_decode_args &a) { a.o.stride[2] = k2e62 / 2; },
       FA_ERROR_INVALID_ARGUMENT, "o.stride[2] * (num_heads_q - 1) overflows"},
      {"kv.block_table_stride 2^62 wraps", [s](fa_decode_args &a) { paged(s, a.kv, k2e62); },
       FA_ERROR_INVALID_ARGUMENT, "kv.block_table_stride * (batch - 1) overflows"},
      {"pointer-array k_cache.stride[1] 2^61",
       [s](fa_decode_args &a) {
         ptr_array(s, a.kv, a.k_cache, a.v_cache), a.k_cache.stride[1] = k2e62 / 2;
       },
       FA_ERROR_INVALID_ARGUMENT, "k_cache.stride[1] * (seqlen_k_max - 1) overflows"},
      {"alibi_slopes_stride 2^62 wraps",
       [s](fa_decode_args &a) { slopes(s, a.alibi_slopes, a.alibi_slopes_stride, k2e62); },
       FA_ERROR_INVALID_ARGUMENT, "alibi_slopes_stride * (batch - 1) overflows"},
      {"tree_mask + tree_mask_stride[0] past 2^64",
       [](fa_decode_args &a) {
         a.tree_mask = uint64_t(3) << 62;
         a.tree_mask_stride[0] = k2e62;
         a.tree_mask_stride[1] = 4;
       },
       FA_ERROR_INVALID_ARGUMENT, "tree_mask 0xc000000000000000"},
      {"cache_seqlens past 2^64", [](fa_decode_args &a) { a.cache_seqlens = ~uint64_t(3); },
       FA_ERROR_INVALID_ARGUMENT, "cache_seqlens 0xfffffffffffffffc"},
      {"workspace past 2^64", [](fa_decode_args &a) { a.workspace = kTop; },
       FA_ERROR_INVALID_ARGUMENT, "workspace 0xffffffffffffff00"},
  };
  run_table(s, rows, valid_decode(s), "fa_decode",
            [&](const fa_decode_args &a) { return fa_decode(s->rt, s->cfg32, &a, nullptr); });
  fa_decode_args a = valid_decode(s);
  assert_int_equal(fa_decode(s->rt, s->cfg32, &a, nullptr), FA_SUCCESS);
}

void test_reduce_spans(void **state) {
  auto *s = static_cast<State *>(*state);
  const ReduceRow rows[] = {
      {"o_partial_stride[1] 2^62 wraps", [](fa_reduce_args &a) { a.o_partial_stride[1] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT,
       "o_partial_stride[1] * (batch - 1) overflows a 64-bit byte offset"},
      {"lse_partial_stride[0] 2^62", [](fa_reduce_args &a) { a.lse_partial_stride[0] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT, "lse_partial_stride[0] * (num_splits - 1) overflows"},
      {"o.stride[0] 2^62 wraps", [](fa_reduce_args &a) { a.o.stride[0] = k2e62; },
       FA_ERROR_INVALID_ARGUMENT, "o.stride[0] * (batch - 1) overflows"},
      {"o_partial past 2^64", [](fa_reduce_args &a) { a.o_partial = kTop; },
       FA_ERROR_INVALID_ARGUMENT, "o_partial 0xffffffffffffff00"},
  };
  run_table(s, rows, valid_reduce(s), "fa_decode_reduce", [&](const fa_reduce_args &a) {
    return fa_decode_reduce(s->rt, s->cfg32, &a, nullptr);
  });
  fa_reduce_args a = valid_reduce(s);
  assert_int_equal(fa_decode_reduce(s->rt, s->cfg32, &a, nullptr), FA_SUCCESS);
}

// fp32 [n] from N(0, 1) (fresh each run; the seed is printed on failure).
std::vector<float> random_f32(size_t n, std::mt19937 &gen) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float &v : x) v = dist(gen);
  return x;
}

// One fp32 forward of args a on cfg32 with O and LSE poisoned first: O's
// bits [batch, SQ, HQ, D] and LSE [batch, HQ, SQ].
std::vector<float> run_forward32(State *s, const fa_forward_args &a) {
  poison_outputs(s);
  assert_int_equal(fa_launch(s->rt, s->cfg32, &a, nullptr), FA_SUCCESS);
  const size_t no = size_t(a.batch) * SQ * HQ * D, nl = size_t(a.batch) * HQ * SQ;
  std::vector<float> out(no + nl);
  fa_memcpy_dtoh(s->rt, out.data(), s->o, no * 4);
  fa_memcpy_dtoh(s->rt, out.data() + no, s->lse, nl * 4);
  for (float x : out) assert_true(std::isfinite(x));  // every element written
  return out;
}

// Huge strides that keep every offset below 2^63 are valid and run: K
// sequences 2^38 bytes apart in one lazily reserved allocation (fp32, batch
// 2), and stride[0] = 2^63 - 8 on every tensor with a batch of 1 (never
// multiplied by a nonzero index), with the ALiBi stride as large. Each O
// and LSE equals, bit for bit, the same launch on contiguous memory, which
// matches the fp64 reference on the bf16-rounded inputs.
void test_huge_valid_strides(void **state) {
  auto *s = static_cast<State *>(*state);
  const unsigned seed = std::random_device{}();
  std::printf("huge strides: seed %u\n", seed);
  std::mt19937 gen(seed);
  const size_t nq = size_t(B) * SQ * HQ * D, nk = size_t(B) * SK * HKV * D;
  const std::vector<float> q = random_f32(nq, gen), k = random_f32(nk, gen),
                           v = random_f32(nk, gen);
  fa_memcpy_htod(s->rt, s->q, q.data(), nq * 4);
  fa_memcpy_htod(s->rt, s->k, k.data(), nk * 4);
  fa_memcpy_htod(s->rt, s->v, v.data(), nk * 4);
  const fa_forward_args plain = valid_forward(s);
  const std::vector<float> want = run_forward32(s, plain);

  // The fp64 reference on the inputs as the kernel rounds them (bf16).
  fa::ref::Problem p;
  p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV;
  p.head_dim = p.head_dim_v = D;
  auto rounded = [](const std::vector<float> &x) {
    std::vector<double> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = fa::ref::round_to(x[i], true);
    return r;
  };
  std::vector<double> ro(nq), rl(size_t(B) * HQ * SQ);
  fa::ref::attention(p, rounded(q).data(), rounded(k).data(), rounded(v).data(), ro.data(),
                     rl.data());
  const fa::ref::ErrorStats eo = fa::ref::compare(want.data(), ro.data(), nq);
  const fa::ref::ErrorStats el = fa::ref::compare(want.data() + nq, rl.data(), rl.size());
  assert_true(eo.rel_l2 < 1e-2 && eo.nonfinite == 0);
  assert_true(el.max_abs < 2e-3 && el.nonfinite == 0);

  // K's sequences 2^38 bytes apart.
  const int64_t gap = int64_t(1) << 36;  // elements
  const size_t seq_k = size_t(SK) * HKV * D;
  uint64_t big = 0;
  assert_int_equal(fa_malloc(s->rt, size_t(gap) * 4 + seq_k * 4, &big), FA_SUCCESS);
  for (int b = 0; b < B; ++b) {
    assert_int_equal(
        fa_memcpy_htod(s->rt, big + uint64_t(b) * gap * 4, k.data() + b * seq_k, seq_k * 4),
        FA_SUCCESS);
  }
  fa_forward_args a = plain;
  a.k.data = big;
  a.k.stride[0] = gap;
  assert_true(run_forward32(s, a) == want);
  fa_free(s->rt, big);

  // Batch 1: stride[0] = 2^63 - 8 everywhere, ALiBi rows 2^63 - 8 apart,
  // against the same sequence with contiguous views and one slope row.
  a = plain;
  a.batch = 1;
  a.alibi_slopes = s->aux + 64;
  const std::vector<float> want1 = run_forward32(s, a);
  const int64_t huge = INT64_MAX - 7;
  for (fa_tensor *t : {&a.q, &a.k, &a.v, &a.o}) t->stride[0] = huge;
  a.alibi_slopes_stride = huge;
  assert_true(run_forward32(s, a) == want1);
  // Back to the fp16 inputs the other tests expect.
  fill_device(s, s->q, 2 * s->o_bytes, 1);
  fill_device(s, s->k, nk * 4, 2);
  fill_device(s, s->v, nk * 4, 3);
}

// CUDA's grid limits bound the decode launch: y and z (num_heads_kv times
// the query-row blocks of a group, and batch) at most 65535, and the
// combine's blocks (batch * seqlen_q * num_heads_q rows) below 2^31.
// fa_decode_workspace_size refuses what fa_decode would, with the same
// message naming the sizes, before anything runs.
void test_decode_grid_limits(void **state) {
  auto *s = static_cast<State *>(*state);
  struct Grid {
    const char *name;
    int32_t batch, seqlen_q;
    bool with_o;
    const char *needle;
  };
  const Grid rows[] = {
      {"batch 65536", 65536, 1, true, "batch is 65536, more than 65535"},
      {"batch 100000 without o", 100000, 1, false, "batch is 100000, more than 65535"},
      {"group rows past grid y", 1, 1 << 29, false, "num_heads_kv"},
      {"combine rows past 2^31 blocks", 65535, 1 << 17, true, "batch * seqlen_q * num_heads_q"},
  };
  for (const Grid &g : rows) {
    fa_decode_args a = valid_decode(s);
    a.batch = g.batch;
    a.seqlen_q = g.seqlen_q;
    if (!g.with_o) a.o.data = a.lse = 0;
    size_t bytes = 12345;
    int32_t splits = -7;
    fa_status st = fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, &splits);
    const std::string size_msg = fa_last_error();
    expect_rejected(nullptr, g.name, st, FA_ERROR_UNSUPPORTED, "fa_decode_workspace_size",
                    g.needle);
    assert_int_equal(bytes, 12345);
    assert_int_equal(splits, -7);
    poison_outputs(s);
    st = fa_decode(s->rt, s->cfg, &a, nullptr);
    const std::string msg = fa_last_error();
    expect_rejected(s, g.name, st, FA_ERROR_UNSUPPORTED, "fa_decode", g.needle);
    // The same reason after each API's name.
    assert_string_equal(msg.substr(msg.find(':')).c_str(),
                        size_msg.substr(size_msg.find(':')).c_str());
  }
  // The combine's limit only binds with o: the same shape without it is sized.
  fa_decode_args a = valid_decode(s);
  a.batch = 65535;
  a.seqlen_q = 1 << 17;
  a.o.data = a.lse = 0;
  size_t bytes = 0;
  assert_int_equal(fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, nullptr), FA_SUCCESS);
  assert_true(bytes > 0);
  // The largest batch is sized (and would run).
  a = valid_decode(s);
  a.batch = 65535;
  assert_int_equal(fa_decode_workspace_size(s->rt, s->cfg, &a, &bytes, nullptr), FA_SUCCESS);
}

// ------------------------------------------------- runtime, memory, cache --

void test_runtime_table(void **) {
  fa_runtime *rt = reinterpret_cast<fa_runtime *>(0x1);
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  expect_rejected(nullptr, "out NULL", fa_runtime_create(&o, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_runtime_create", "out is NULL");
  o.struct_size = 4;
  expect_rejected(nullptr, "struct_size", fa_runtime_create(&o, &rt), FA_ERROR_INVALID_ARGUMENT,
                  "fa_runtime_create", "struct_size");
  assert_null(rt);
  o = FA_RUNTIME_OPTIONS_INIT;
  set_raw(&o.backend, 7);
  expect_rejected(nullptr, "backend 7", fa_runtime_create(&o, &rt), FA_ERROR_INVALID_ARGUMENT,
                  "fa_runtime_create", "backend");
  o = FA_RUNTIME_OPTIONS_INIT;
  o.device = -1;
  expect_rejected(nullptr, "device -1", fa_runtime_create(&o, &rt), FA_ERROR_INVALID_ARGUMENT,
                  "fa_runtime_create", "device");
  o = FA_RUNTIME_OPTIONS_INIT;
  set_raw(&o.cache_mode, 9);
  expect_rejected(nullptr, "cache_mode 9", fa_runtime_create(&o, &rt), FA_ERROR_INVALID_ARGUMENT,
                  "fa_runtime_create", "cache_mode");
  o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_EMULATOR;
  o.emulator_sm = 75;
  expect_rejected(nullptr, "emulator_sm 75", fa_runtime_create(&o, &rt), FA_ERROR_UNSUPPORTED,
                  "fa_runtime_create", "emulator_sm");
  // FLASHATTN_EMU_SM (emulator_sm 0): a whole decimal SM number, nothing
  // else ("90abc" was read as 90); a number not listed is UNSUPPORTED.
  o.emulator_sm = 0;
  for (const char *bad : {"90abc", "90a", "sm_90", " 90", "90 ", "+90", "-90", "8.6", "0x50"}) {
    setenv("FLASHATTN_EMU_SM", bad, 1);
    const std::string needle = std::string("FLASHATTN_EMU_SM=") + bad + " is not a decimal";
    expect_rejected(nullptr, bad, fa_runtime_create(&o, &rt), FA_ERROR_INVALID_ARGUMENT,
                    "fa_runtime_create", needle.c_str());
    assert_null(rt);
  }
  for (const char *unlisted : {"75", "0", "99999999999999999999"}) {
    setenv("FLASHATTN_EMU_SM", unlisted, 1);
    const std::string needle = std::string("FLASHATTN_EMU_SM=") + unlisted + " is not a supported";
    expect_rejected(nullptr, unlisted, fa_runtime_create(&o, &rt), FA_ERROR_UNSUPPORTED,
                    "fa_runtime_create", needle.c_str());
  }
  for (const char *good : {"90", "086", ""}) {
    setenv("FLASHATTN_EMU_SM", good, 1);
    assert_int_equal(fa_runtime_create(&o, &rt), FA_SUCCESS);
    fa_runtime_info info = FA_RUNTIME_INFO_INIT;
    assert_int_equal(fa_runtime_get_info(rt, &info), FA_SUCCESS);
    assert_int_equal(info.sm, good[0] ? std::atoi(good) : 80);
    fa_runtime_destroy(rt);
  }
  unsetenv("FLASHATTN_EMU_SM");

  // Calls on a NULL runtime.
  uint64_t p = 0;
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  fa_cache_stats cs = FA_CACHE_STATS_INIT;
  expect_rejected(nullptr, "info rt", fa_runtime_get_info(nullptr, &info),
                  FA_ERROR_INVALID_ARGUMENT, "fa_runtime_get_info", "rt is NULL");
  expect_rejected(nullptr, "malloc rt", fa_malloc(nullptr, 16, &p), FA_ERROR_INVALID_ARGUMENT,
                  "fa_malloc", "rt is NULL");
  expect_rejected(nullptr, "free rt", fa_free(nullptr, 16), FA_ERROR_INVALID_ARGUMENT, "fa_free",
                  "rt is NULL");
  expect_rejected(nullptr, "htod rt", fa_memcpy_htod(nullptr, 16, &p, 8), FA_ERROR_INVALID_ARGUMENT,
                  "fa_memcpy_htod", "rt is NULL");
  expect_rejected(nullptr, "dtoh rt", fa_memcpy_dtoh(nullptr, &p, 16, 8), FA_ERROR_INVALID_ARGUMENT,
                  "fa_memcpy_dtoh", "rt is NULL");
  expect_rejected(nullptr, "memset rt", fa_memset(nullptr, 16, 0, 8), FA_ERROR_INVALID_ARGUMENT,
                  "fa_memset", "rt is NULL");
  expect_rejected(nullptr, "sync rt", fa_synchronize(nullptr, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_synchronize", "rt is NULL");
  expect_rejected(nullptr, "stats rt", fa_cache_stats_get(nullptr, &cs), FA_ERROR_INVALID_ARGUMENT,
                  "fa_cache_stats_get", "rt is NULL");
  expect_rejected(nullptr, "clear rt", fa_cache_clear(nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_cache_clear", "rt is NULL");
  fa_runtime_destroy(nullptr);
}

void test_memory_table(void **state) {
  auto *s = static_cast<State *>(*state);
  uint64_t p = 0;
  char host[64];
  expect_rejected(nullptr, "malloc 0", fa_malloc(s->rt, 0, &p), FA_ERROR_INVALID_ARGUMENT,
                  "fa_malloc", "bytes");
  expect_rejected(nullptr, "malloc ptr", fa_malloc(s->rt, 8, nullptr), FA_ERROR_INVALID_ARGUMENT,
                  "fa_malloc", "ptr is NULL");
  expect_rejected(nullptr, "htod src", fa_memcpy_htod(s->rt, s->o, nullptr, 8),
                  FA_ERROR_INVALID_ARGUMENT, "fa_memcpy_htod", "non-null");
  expect_rejected(nullptr, "dtoh dst", fa_memcpy_dtoh(s->rt, nullptr, s->o, 8),
                  FA_ERROR_INVALID_ARGUMENT, "fa_memcpy_dtoh", "non-null");
  expect_rejected(nullptr, "memset dst", fa_memset(s->rt, 0, 1, 8), FA_ERROR_INVALID_ARGUMENT,
                  "fa_memset", "dst");
  // The emulator knows its allocations: foreign pointers and overruns fail.
  assert_int_equal(fa_free(s->rt, s->o + 16), FA_ERROR_INVALID_ARGUMENT);
  assert_true(std::strlen(fa_last_error()) > 0);
  assert_int_equal(fa_memcpy_dtoh(s->rt, host, s->seqlens, sizeof host), FA_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fa_free(s->rt, 0), FA_SUCCESS);
  assert_int_equal(fa_malloc(s->rt, 100, &p), FA_SUCCESS);
  assert_int_equal(p % 256, 0);
  assert_int_equal(fa_free(s->rt, p), FA_SUCCESS);
}

void test_info_and_cache_args(void **state) {
  auto *s = static_cast<State *>(*state);
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  assert_int_equal(fa_runtime_get_info(s->rt, &info), FA_SUCCESS);
  assert_int_equal(info.backend, FA_BACKEND_EMULATOR);
  assert_int_equal(info.sm, 80);
  assert_true(info.num_sms > 0);
  assert_true(std::strlen(info.device_name) > 0);
  info.struct_size = 3;
  expect_rejected(nullptr, "info struct_size", fa_runtime_get_info(s->rt, &info),
                  FA_ERROR_INVALID_ARGUMENT, "fa_runtime_get_info", "struct_size");
  expect_rejected(nullptr, "info NULL", fa_runtime_get_info(s->rt, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_runtime_get_info", "info is NULL");
  fa_cache_stats cs = FA_CACHE_STATS_INIT;
  for (size_t bad : {size_t(16), FA_CACHE_STATS_SIZE_0_1 - 8, FA_CACHE_STATS_SIZE_0_1 + 8,
                     sizeof(fa_cache_stats) + 8}) {
    cs.struct_size = bad;
    expect_rejected(nullptr, "stats struct_size", fa_cache_stats_get(s->rt, &cs),
                    FA_ERROR_INVALID_ARGUMENT, "fa_cache_stats_get", "struct_size");
  }
  // A caller built against 0.1 passes the shorter size: its fields are
  // filled, nothing past them is written.
  static_assert(FA_CACHE_STATS_SIZE_0_1 == 840, "the 0.1 layout is frozen");
  std::memset(&cs, 0xa5, sizeof cs);
  cs.struct_size = FA_CACHE_STATS_SIZE_0_1;
  assert_int_equal(fa_cache_stats_get(s->rt, &cs), FA_SUCCESS);
  assert_true(cs.persistent == 0 || cs.persistent == 1);
  assert_true(std::memchr(cs.note, 0, sizeof cs.note) != nullptr);
  const unsigned char *tail =
      reinterpret_cast<const unsigned char *>(&cs) + FA_CACHE_STATS_SIZE_0_1;
  for (size_t i = 0; i < sizeof cs - FA_CACHE_STATS_SIZE_0_1; ++i) assert_int_equal(tail[i], 0xa5);
  std::memset(&cs, 0xa5, sizeof cs);
  cs.struct_size = sizeof cs;
  assert_int_equal(fa_cache_stats_get(s->rt, &cs), FA_SUCCESS);
  assert_int_not_equal(cs.collisions, 0xa5a5a5a5a5a5a5a5ull);
  assert_int_not_equal(cs.max_bytes, 0xa5a5a5a5a5a5a5a5ull);
  expect_rejected(nullptr, "stats NULL", fa_cache_stats_get(s->rt, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_cache_stats_get", "stats is NULL");
  expect_rejected(nullptr, "list fn", fa_cache_list(s->rt, nullptr, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_cache_list", "fn is NULL");
}

void test_generate_table(void **state) {
  auto *s = static_cast<State *>(*state);
  size_t n = 0;
  char small[16];
  expect_rejected(nullptr, "cfg", fa_generate(nullptr, FA_KERNEL_FORWARD, 80, nullptr, 0, &n),
                  FA_ERROR_INVALID_ARGUMENT, "fa_generate", "cfg is NULL");
  expect_rejected(nullptr, "size", fa_generate(s->cfg, FA_KERNEL_FORWARD, 80, nullptr, 0, nullptr),
                  FA_ERROR_INVALID_ARGUMENT, "fa_generate", "ptx_size is NULL");
  expect_rejected(nullptr, "kind", generate_int(s->cfg, 6, 80, nullptr, 0, &n),
                  FA_ERROR_INVALID_ARGUMENT, "fa_generate", "kind");
  expect_rejected(nullptr, "kind -1", generate_int(s->cfg, -1, 80, nullptr, 0, &n),
                  FA_ERROR_INVALID_ARGUMENT, "fa_generate", "kind");
  expect_rejected(nullptr, "sm 70", fa_generate(s->cfg, FA_KERNEL_FORWARD, 70, nullptr, 0, &n),
                  FA_ERROR_UNSUPPORTED, "fa_generate", "sm");
  expect_rejected(nullptr, "buf NULL", fa_generate(s->cfg, FA_KERNEL_FORWARD, 80, nullptr, 10, &n),
                  FA_ERROR_INVALID_ARGUMENT, "fa_generate", "buf is NULL");
  std::memset(small, 'x', sizeof small);
  expect_rejected(nullptr, "too small",
                  fa_generate(s->cfg, FA_KERNEL_FORWARD, 80, small, sizeof small, &n),
                  FA_ERROR_BUFFER_TOO_SMALL, "fa_generate", "needs");
  assert_true(n > sizeof small);
  // Size query, then the real call: NUL-terminated, identical twice.
  // The backward kinds: fa_backward's kernels (entry prefixes as
  // src/kernels/spec.cc names them; test_backward_api checks them against
  // the kernels fa_backward launches).
  const struct {
    fa_kernel_kind kind;
    const char *entry;
  } kinds[] = {
      {FA_KERNEL_FORWARD, ".entry fa_"},
      {FA_KERNEL_DECODE, ".entry fa_decode_"},
      {FA_KERNEL_REDUCE, ".entry fa_reduce_"},
      {FA_KERNEL_BACKWARD_PRE, ".entry fa_bwdpre_mma_f16_d64_dv64_g1_"},
      {FA_KERNEL_BACKWARD, ".entry fa_backward_mma_f16_d64_dv64_g2_bm64_bn64_w4_"},
      {FA_KERNEL_BACKWARD_POST, ".entry fa_bwdpost_mma_f16_d64_dv64_g1_"},
  };
  std::vector<std::string> modules;
  for (const auto &k : kinds) {
    assert_int_equal(fa_generate(s->cfg, k.kind, 86, nullptr, 0, &n), FA_SUCCESS);
    std::vector<char> a(n + 1, 'x'), b(n + 1, 'y');
    assert_int_equal(fa_generate(s->cfg, k.kind, 86, a.data(), a.size(), &n), FA_SUCCESS);
    assert_int_equal(fa_generate(s->cfg, k.kind, 86, b.data(), b.size(), &n), FA_SUCCESS);
    assert_int_equal(a[n], '\0');
    assert_memory_equal(a.data(), b.data(), n + 1);
    if (std::strstr(a.data(), k.entry) == nullptr) fail_msg("kind %d: no '%s'", k.kind, k.entry);
    assert_non_null(std::strstr(a.data(), ".target sm_86"));
    modules.emplace_back(a.data(), n);
  }
  for (size_t i = 0; i < modules.size(); ++i)
    for (size_t j = 0; j < i; ++j) assert_true(modules[i] != modules[j]);
  // fa_generate_for: NULL options and zero options are fa_generate's module;
  // a paged page_size 16 decode looks its pages up per tile, page_size 3 per
  // row; pointer arrays; varlen + seqused_k forward.
  auto gen = [&](fa_kernel_kind kind, const fa_generate_options *o) {
    size_t len = 0;
    assert_int_equal(fa_generate_for(s->cfg, kind, 80, o, nullptr, 0, &len), FA_SUCCESS);
    std::string t(len + 1, 'x');
    assert_int_equal(fa_generate_for(s->cfg, kind, 80, o, &t[0], t.size(), &len), FA_SUCCESS);
    t.resize(len);
    return t;
  };
  auto plain = [&](fa_kernel_kind kind) {
    size_t len = 0;
    assert_int_equal(fa_generate(s->cfg, kind, 80, nullptr, 0, &len), FA_SUCCESS);
    std::string t(len + 1, 'x');
    assert_int_equal(fa_generate(s->cfg, kind, 80, &t[0], t.size(), &len), FA_SUCCESS);
    t.resize(len);
    return t;
  };
  fa_generate_options go = FA_GENERATE_OPTIONS_INIT;
  assert_true(gen(FA_KERNEL_DECODE, nullptr) == plain(FA_KERNEL_DECODE));
  assert_true(gen(FA_KERNEL_FORWARD, &go) == plain(FA_KERNEL_FORWARD));
  go.kv_layout = FA_KV_PAGED;
  go.page_size = 16;
  const std::string tiles = gen(FA_KERNEL_DECODE, &go);
  assert_true(tiles.find("_paged_tiles") != std::string::npos);
  go.page_size = 3;
  assert_true(gen(FA_KERNEL_DECODE, &go).find("_paged_rows") != std::string::npos);
  go.kv_layout = FA_KV_PTR_ARRAY;
  go.page_size = 0;
  assert_true(gen(FA_KERNEL_DECODE, &go).find("_ptrs") != std::string::npos);
  go.kv_layout = FA_KV_CONTIGUOUS;
  go.varlen = 1;
  go.seqused_k = 1;
  const std::string fwd = gen(FA_KERNEL_FORWARD, &go);
  assert_true(fwd != plain(FA_KERNEL_FORWARD) && fwd.find("_varlen") != std::string::npos);
  struct Bad {
    const char *what, *needle;
    fa_kernel_kind kind;
    fa_generate_options o;
  };
  const Bad bad[] = {
      {"size",
       "struct_size",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options) - 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"layout",
       "kv_layout",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"page 0",
       "page_size",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"page contiguous",
       "page_size",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"varlen decode",
       "varlen",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"reduce layout",
       "REDUCE",
       FA_KERNEL_REDUCE,
       {sizeof(fa_generate_options), 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"tree 2",
       "tree_mask",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"tree forward",
       "tree_mask",
       FA_KERNEL_FORWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"lse format 2",
       "lse_format",
       FA_KERNEL_REDUCE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0}},
      {"lse format decode",
       "FA_KERNEL_REDUCE",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}},
      {"sinks 2",
       "sinks",
       FA_KERNEL_FORWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0}},
      {"sinks decode",
       "FA_KERNEL_REDUCE",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}},
      {"append forward",
       "append_kv",
       FA_KERNEL_FORWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}},
      {"append 2",
       "append_kv",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0}},
      {"rotary without append",
       "rotary",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}},
      {"rotary 3",
       "rotary",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0}},
      {"rotary dtype",
       "rotary_dtype",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, FA_DTYPE_BF16, 0}},
      {"v_in_k 2",
       "v_in_k",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}},
      {"v_in_k reduce",
       "v_in_k is for FA_KERNEL_DECODE without append_kv and FA_KERNEL_FORWARD",
       FA_KERNEL_REDUCE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}},
      {"v_in_k append",
       "without append_kv",
       FA_KERNEL_DECODE,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1}},
  };
  for (const Bad &b : bad) {
    expect_rejected(nullptr, b.what, fa_generate_for(s->cfg, b.kind, 80, &b.o, nullptr, 0, &n),
                    FA_ERROR_INVALID_ARGUMENT, "fa_generate_for", b.needle);
  }
}

// fa_generate_for's backward kinds: the launch shape's varlen, sinks and
// ALiBi reach the kernels that read them (BackwardPre reads no sinks or
// ALiBi, BackwardPost no ALiBi); deterministic is a launch argument, so
// there is nothing to ask for. Every option fa_backward does not take is
// refused by name: INVALID_ARGUMENT for the options of other kinds,
// UNSUPPORTED for what fa_backward refuses (a paged or pointer-array K/V,
// seqused_k, fp32 and fp8 configs, head dims it has no kernel for).
void test_generate_backward(void **state) {
  auto *s = static_cast<State *>(*state);
  auto gen = [&](const fa_config *cfg, fa_kernel_kind kind, int sm, const fa_generate_options *o) {
    size_t len = 0;
    assert_int_equal(fa_generate_for(cfg, kind, sm, o, nullptr, 0, &len), FA_SUCCESS);
    std::string t(len + 1, 'x');
    assert_int_equal(fa_generate_for(cfg, kind, sm, o, &t[0], t.size(), &len), FA_SUCCESS);
    t.resize(len);
    const size_t at = t.find(".entry ");
    assert_true(at != std::string::npos);
    return t.substr(at + 7, t.find('(', at) - at - 7);
  };
  fa_generate_options go = FA_GENERATE_OPTIONS_INIT;
  go.varlen = 1;
  go.sinks = 1;
  go.alibi = 1;
  assert_string_equal(gen(s->cfg, FA_KERNEL_BACKWARD_PRE, 80, &go).c_str(),
                      "fa_bwdpre_mma_f16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0_varlen");
  assert_string_equal(gen(s->cfg, FA_KERNEL_BACKWARD, 80, &go).c_str(),
                      "fa_backward_mma_f16_d64_dv64_g2_bm64_bn64_w4_s2_mt1_c0_varlen_sinks_alibi");
  assert_string_equal(gen(s->cfg, FA_KERNEL_BACKWARD_POST, 80, &go).c_str(),
                      "fa_bwdpost_mma_f16_d64_dv64_g1_bm64_bn64_w4_s0_mt1_c0_varlen_sinks");
  assert_string_equal(gen(s->cfg, FA_KERNEL_BACKWARD, 80, nullptr).c_str(),
                      "fa_backward_mma_f16_d64_dv64_g2_bm64_bn64_w4_s2_mt1_c0");
  // Head dim 256: two column slices, query blocks of 32 where sm_80's
  // shared memory holds the tiles and 16 on sm_86 (the SM's limits); on
  // sm_80 with Q and dO double-buffered (stages 2), on sm_86 not (no room).
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.dtype = FA_DTYPE_BF16;
  d.head_dim = 256;
  d.num_heads_q = 8;
  d.num_heads_kv = 8;
  d.causal = 1;
  fa_config *big = nullptr;
  assert_int_equal(fa_config_create(&d, &big), FA_SUCCESS);
  assert_string_equal(gen(big, FA_KERNEL_BACKWARD, 80, nullptr).c_str(),
                      "fa_backward_mma_bf16_d256_dv256_g1_bm32_bn64_w4_s2_mt1_c0_dvs2");
  assert_string_equal(gen(big, FA_KERNEL_BACKWARD, 86, nullptr).c_str(),
                      "fa_backward_mma_bf16_d256_dv256_g1_bm16_bn64_w4_s0_mt1_c0_dvs2");
  fa_config_destroy(big);

  size_t n = 0;
  struct Bad {
    const char *what, *needle;
    fa_status want;
    fa_kernel_kind kind;
    fa_generate_options o;
  };
  constexpr fa_status kBad = FA_ERROR_INVALID_ARGUMENT, kUns = FA_ERROR_UNSUPPORTED;
  const Bad bad[] = {
      {"paged",
       "opts->kv_layout is 1: the backward takes a contiguous K/V",
       kUns,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), FA_KV_PAGED, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"ptrs",
       "opts->kv_layout is 2",
       kUns,
       FA_KERNEL_BACKWARD_PRE,
       {sizeof(fa_generate_options), FA_KV_PTR_ARRAY, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"seqused_k",
       "opts->seqused_k is set: the backward",
       kUns,
       FA_KERNEL_BACKWARD_POST,
       {sizeof(fa_generate_options), 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"tree_mask",
       "opts->tree_mask is for FA_KERNEL_DECODE",
       kBad,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"lse format",
       "opts->lse_partial_format and opts->lse_format are for FA_KERNEL_REDUCE",
       kBad,
       FA_KERNEL_BACKWARD_POST,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}},
      {"append_kv",
       "opts->append_kv is for FA_KERNEL_DECODE",
       kBad,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}},
      {"v_in_k",
       "opts->v_in_k is for FA_KERNEL_DECODE",
       kBad,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}},
      {"sinks 2",
       "opts->sinks must be 0 or 1",
       kBad,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0}},
      {"varlen 2",
       "opts->varlen must be 0 or 1",
       kBad,
       FA_KERNEL_BACKWARD,
       {sizeof(fa_generate_options), 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
  };
  for (const Bad &b : bad) {
    expect_rejected(nullptr, b.what, fa_generate_for(s->cfg, b.kind, 80, &b.o, nullptr, 0, &n),
                    b.want, "fa_generate_for", b.needle);
  }
  // Configs fa_backward refuses (fa::check_backward), for each kind.
  auto make = [](fa_config_desc desc) {
    fa_config *c = nullptr;
    assert_int_equal(fa_config_create(&desc, &c), FA_SUCCESS);
    return c;
  };
  fa_config_desc e = FA_CONFIG_DESC_INIT;
  e.head_dim = 64, e.num_heads_q = 4, e.num_heads_kv = 2;
  fa_config_desc fp8 = e, wide = e, odd = e;
  fp8.kv_dtype = FA_DTYPE_FP8_E4M3;
  fp8.q_dtype = FA_DTYPE_FP8_E4M3;
  wide.head_dim = wide.head_dim_v = 512;
  odd.head_dim = 136;
  fa_config *f8 = make(fp8), *w = make(wide), *o = make(odd);
  const struct {
    const char *what;
    const fa_config *cfg;
    const char *needle;
  } configs[] = {
      {"fp32", s->cfg32, "dtype FA_DTYPE_FP32 is not supported"},
      {"fp8", f8, "fp8 configs (kv_dtype, q_dtype)"},
      {"head_dim 512", w, "got 512 and 512"},
      {"head_dim 136", o, "got 136 and 136"},
  };
  for (const auto &c : configs)
    for (fa_kernel_kind kind :
         {FA_KERNEL_BACKWARD_PRE, FA_KERNEL_BACKWARD, FA_KERNEL_BACKWARD_POST}) {
      expect_rejected(nullptr, c.what, fa_generate(c.cfg, kind, 90, nullptr, 0, &n),
                      FA_ERROR_UNSUPPORTED, "fa_generate", c.needle);
    }
  fa_config_destroy(f8);
  fa_config_destroy(w);
  fa_config_destroy(o);
}

void test_status_strings(void **) {
  for (int c = 0; c < FA_STATUS_LAST; ++c) {
    const char *t = fa_status_string(fa_status(c));
    assert_non_null(t);
    assert_string_not_equal(t, "unknown status");
  }
  assert_string_equal(status_string_int(999), "unknown status");
  assert_string_equal(status_string_int(-1), "unknown status");
  assert_int_equal(fa_version_number(), FLASHATTN_VERSION_NUMBER);
  char want[32];
  std::snprintf(want, sizeof want, "%d.%d.%d", FLASHATTN_VERSION_MAJOR, FLASHATTN_VERSION_MINOR,
                FLASHATTN_VERSION_PATCH);
  assert_string_equal(fa_version_string(), want);
}

// Head dims past 256: MLA's 576 / 512 and Gemma's 512 generate on sm_80+
// (O in slices: KernelSpec::dv_split, "_dvs" in the entry), the sm_90
// forward takes mma.sync there; the scalar fallbacks and the fp32 forward
// past 384 are refused with the reason.
void test_large_head_dims(void **) {
  auto make = [](fa_dtype dt, int d, int dv, int hq, int hkv) {
    fa_config_desc desc = FA_CONFIG_DESC_INIT;
    desc.dtype = dt;
    desc.head_dim = d;
    desc.head_dim_v = dv;
    desc.num_heads_q = hq;
    desc.num_heads_kv = hkv;
    fa_config *cfg = nullptr;
    assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
    return cfg;
  };
  auto ptx = [](const fa_config *cfg, fa_kernel_kind kind, int sm) {
    size_t n = 0;
    assert_int_equal(fa_generate(cfg, kind, sm, nullptr, 0, &n), FA_SUCCESS);
    std::string t(n + 1, 'x');
    assert_int_equal(fa_generate(cfg, kind, sm, &t[0], t.size(), &n), FA_SUCCESS);
    t.resize(n);
    return t;
  };
  fa_config *mla = make(FA_DTYPE_BF16, 576, 512, 16, 1);
  const std::string dec = ptx(mla, FA_KERNEL_DECODE, 90);
  assert_non_null(std::strstr(dec.c_str(), "fa_decode_mma_bf16_d576_dv512_g16"));
  assert_non_null(std::strstr(dec.c_str(), "_dvs2"));
  assert_non_null(std::strstr(ptx(mla, FA_KERNEL_REDUCE, 90).c_str(), "fa_reduce_bf16_dv512"));
  // V read from the latent K tile (v_in_k); 0.5's options struct ends before it.
  auto ptx_for = [](const fa_config *cfg, const fa_generate_options &o) {
    size_t len = 0;
    assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, 90, &o, nullptr, 0, &len), FA_SUCCESS);
    std::string t(len + 1, 'x');
    assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, 90, &o, &t[0], t.size(), &len),
                     FA_SUCCESS);
    t.resize(len);
    return t;
  };
  fa_generate_options go = FA_GENERATE_OPTIONS_INIT;
  go.v_in_k = 1;
  assert_non_null(std::strstr(ptx_for(mla, go).c_str(), "_dvs2_vink("));
  go.struct_size = FA_GENERATE_OPTIONS_SIZE_0_5;
  assert_true(ptx_for(mla, go) == dec);
  fa_config *gemma = make(FA_DTYPE_FP16, 512, 0, 8, 4);
  const std::string fwd = ptx(gemma, FA_KERNEL_FORWARD, 90);
  assert_non_null(std::strstr(fwd.c_str(), "fa_forward_mma_f16_d512_dv512"));
  assert_null(std::strstr(fwd.c_str(), "wgmma"));
  size_t n = 0;
  setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
  expect_rejected(nullptr, "scalar decode d576",
                  fa_generate(mla, FA_KERNEL_DECODE, 80, nullptr, 0, &n), FA_ERROR_UNSUPPORTED,
                  "fa_generate", "need the tensor-core kernels");
  unsetenv("FLASHATTN_SCALAR_DECODE");
  setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
  expect_rejected(nullptr, "scalar forward d512",
                  fa_generate(gemma, FA_KERNEL_FORWARD, 80, nullptr, 0, &n), FA_ERROR_UNSUPPORTED,
                  "fa_generate", "need the tensor-core kernels");
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  fa_config *f32 = make(FA_DTYPE_FP32, 576, 512, 16, 1);
  expect_rejected(nullptr, "fp32 forward d576",
                  fa_generate(f32, FA_KERNEL_FORWARD, 80, nullptr, 0, &n), FA_ERROR_UNSUPPORTED,
                  "fa_generate", "head_dim up to 384");
  assert_non_null(std::strstr(ptx(f32, FA_KERNEL_DECODE, 80).c_str(), "_dvs2"));
  fa_config_destroy(mla);
  fa_config_destroy(gemma);
  fa_config_destroy(f32);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings),      cmocka_unit_test(test_config_table),
      cmocka_unit_test(test_runtime_table),       cmocka_unit_test(test_memory_table),
      cmocka_unit_test(test_info_and_cache_args), cmocka_unit_test(test_generate_table),
      cmocka_unit_test(test_generate_backward),   cmocka_unit_test(test_forward_table),
      cmocka_unit_test(test_decode_table),        cmocka_unit_test(test_reduce_table),
      cmocka_unit_test(test_large_head_dims),     cmocka_unit_test(test_forward_spans),
      cmocka_unit_test(test_decode_spans),        cmocka_unit_test(test_reduce_spans),
      cmocka_unit_test(test_huge_valid_strides),  cmocka_unit_test(test_decode_grid_limits),
  };
  return cmocka_run_group_tests_name("api_validation", tests, setup, teardown);
}
