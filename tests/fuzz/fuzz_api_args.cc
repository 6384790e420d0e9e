// Fuzz target: the C API's argument handling. Bytes become a config desc and
// forward / decode / reduce / generate arguments (shapes, strides, dtypes,
// enums, struct_size values, null and misaligned pointers; pointers are 0,
// one of a few real fa_malloc'd emulator buffers, or misaligned or
// out-of-range offsets of them) for fa_config_create, fa_launch, fa_decode,
// fa_decode_workspace_size, fa_decode_reduce and fa_generate on one emulator
// runtime created once. Any status is fine; a crash, a sanitizer report or a
// hang is a bug.
//
// Bounded work (the choice documented in docs/reliability.md): a call with
// arguments that might all be valid runs a real emulated kernel, so such a
// call is only made when its problem is small (batch <= 2, seqlens <= 32 or
// 64, num_heads_q <= 4, num_splits <= 4). Otherwise one late-checked pointer
// (lse / cache_seqlens / lse_partial) is made misaligned, so the call fails
// validation after every other field was checked. The buffers hold small
// values (int buffers: small ascending prefix sums), so a kernel reading
// cache_seqlens or cu_seqlens from any of them stays bounded, and
// FLASHATTN_EMU_MAX_STEPS caps each launch at 2e7 instructions.
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "flashattn.h"
#include "fuzz/fuzz_input.h"

// fuzz_api_args_enum.c: fa_generate with the kind as a plain int.
extern "C" fa_status fa_fuzz_generate(const fa_config *cfg, int kind, int32_t sm, char *buf,
                                      size_t buf_size, size_t *ptx_size);

namespace {

constexpr int kNumBuffers = 4;
constexpr size_t kBufferBytes = 64 * 1024;

struct Env {
  fa_runtime *rt = nullptr;
  uint64_t buf[kNumBuffers] = {};
  std::vector<char> gen_buf = std::vector<char>(256 * 1024);

  Env() {
    setenv("FLASHATTN_EMU_MAX_STEPS", "20000000", 0);
    setenv("FLASHATTN_EMU_THREADS", "1", 0);
    fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
    o.backend = FA_BACKEND_EMULATOR;
    o.cache_mode = FA_CACHE_MEMORY;
    if (fa_runtime_create(&o, &rt) != FA_SUCCESS) __builtin_trap();
    for (int i = 0; i < kNumBuffers; ++i) {
      if (fa_malloc(rt, kBufferBytes, &buf[i]) != FA_SUCCESS) __builtin_trap();
      std::vector<int32_t> fill(kBufferBytes / 4);
      for (size_t j = 0; j < fill.size(); ++j) {
        // Buffers 0-1: fp16/bf16 pairs near 1; 2-3: int32 0, 1, 2, ..., 60, 0, 1...
        // (their fp32 view is tiny denormals).
        fill[j] = i < 2 ? 0x3c003c00 : static_cast<int32_t>(j % 61);
      }
      if (fa_memcpy_htod(rt, buf[i], fill.data(), kBufferBytes) != FA_SUCCESS) __builtin_trap();
    }
  }
};

// Never destroyed (still reachable, so LeakSanitizer is quiet): an fa_ call
// from a static destructor would touch the thread's last-error string after
// its thread_local destructor ran (reported, src/common/error.cc).
Env &env() {
  static Env *e = new Env;
  return *e;
}

// A pointer: mostly a real buffer at a 256-aligned offset, else 0, a
// misaligned or far-out offset, or any 64-bit value.
uint64_t pick_ptr(fa_fuzz::Input &in, Env &e) {
  const uint8_t k = in.byte();
  const uint64_t base = e.buf[k % kNumBuffers];
  switch (k >> 5) {
    case 0:
      return 0;
    case 1:
      return base + 1 + in.byte() % 15;  // misaligned
    case 2:
      return base + kBufferBytes - 16 * (in.byte() % 4);  // at or near the end
    case 3:
      return in.get<uint64_t>();
    default:
      return base + 256 * (in.byte() % 8);
  }
}

int32_t pick_int(fa_fuzz::Input &in, int32_t lo, int32_t hi) {
  const uint8_t k = in.byte();
  if (k < 200) return lo + static_cast<int32_t>(in.below(static_cast<uint32_t>(hi - lo + 1)));
  switch (k % 6) {
    case 0:
      return 0;
    case 1:
      return -1;
    case 2:
      return std::numeric_limits<int32_t>::max();
    case 3:
      return std::numeric_limits<int32_t>::min();
    default:
      return in.get<int32_t>();
  }
}

int64_t pick_stride(fa_fuzz::Input &in) {
  const uint8_t k = in.byte();
  if (k < 200) return 8 * static_cast<int64_t>(in.byte() % 64);
  switch (k % 5) {
    case 0:
      return -8;
    case 1:
      return 1 + in.byte() % 7;
    case 2:
      return std::numeric_limits<int64_t>::max() - 7;  // multiple of 8
    default:
      return in.get<int64_t>();
  }
}

size_t pick_struct_size(fa_fuzz::Input &in, size_t right) {
  const uint8_t k = in.byte();
  if (k < 224) return right;
  switch (k % 4) {
    case 0:
      return 0;
    case 1:
      return right - 8;
    case 2:
      return right + 8;
    default:
      return in.get<uint32_t>();
  }
}

// An enum value as an int: mostly in [lo, hi], sometimes any int (stored
// with memcpy, or passed through the C shim, never loaded as the C++ enum).
int pick_enum(fa_fuzz::Input &in, int lo, int hi) {
  return in.byte() < 224 ? lo + static_cast<int>(in.below(static_cast<uint32_t>(hi - lo + 1)))
                         : in.get<int32_t>();
}

void pick_tensor(fa_fuzz::Input &in, Env &e, fa_tensor *t) {
  t->data = pick_ptr(in, e);
  for (int i = 0; i < 3; ++i) t->stride[i] = pick_stride(in);
  t->stride[3] = in.byte() < 240 ? 1 : pick_stride(in);
}

float pick_float(fa_fuzz::Input &in) {
  switch (in.byte() % 8) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -1.0f;
    case 3: {
      const uint32_t bits = in.get<uint32_t>();
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    default:
      return static_cast<float>(in.byte() % 16) / 8.0f;
  }
}

// With FA_FUZZ_VERBOSE set, prints each call's status (to check seeds).
void report(const char *api, fa_status st) {
  static const bool verbose = getenv("FA_FUZZ_VERBOSE") != nullptr;
  if (verbose) fprintf(stderr, "%s: %s %s\n", api, fa_status_string(st), fa_last_error());
}

bool small(int32_t v, int32_t cap) { return v <= cap; }

// Makes p non-zero and misaligned, so validation fails on it.
void spoil(uint64_t *p, Env &e) { *p = e.buf[0] + 2; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Env &e = env();
  fa_fuzz::Input in(data, size);

  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.struct_size = pick_struct_size(in, sizeof d);
  const int dtype = pick_enum(in, 1, 3);
  std::memcpy(&d.dtype, &dtype, sizeof dtype);
  // Unsigned arithmetic: a wild pick times 8 wraps instead of overflowing.
  d.head_dim = static_cast<int32_t>(static_cast<uint32_t>(pick_int(in, 0, 33)) * 8u +
                                    (in.byte() >= 240 ? 4u : 0u));
  d.head_dim_v =
      in.flag() ? 0 : static_cast<int32_t>(static_cast<uint32_t>(pick_int(in, 0, 33)) * 8u);
  d.num_heads_kv = pick_int(in, 1, 4);
  d.num_heads_q = static_cast<int32_t>(static_cast<uint32_t>(d.num_heads_kv) *
                                       static_cast<uint32_t>(pick_int(in, 1, 4)));
  d.causal = pick_int(in, 0, 1);
  d.window_left = pick_int(in, -1, 40);
  d.window_right = pick_int(in, -1, 40);
  d.softmax_scale = pick_float(in);
  d.softcap = in.flag() ? 0.0f : pick_float(in);

  fa_config *cfg = nullptr;
  const fa_status cst = fa_config_create(in.byte() < 250 ? &d : nullptr, &cfg);
  report("fa_config_create", cst);
  if ((cst == FA_SUCCESS) != (cfg != nullptr)) __builtin_trap();
  // A bounded kernel needs few heads; a valid config with more is only used
  // with arguments that fail validation.
  const bool small_cfg = cfg && small(d.num_heads_q, 4);
  fa_runtime *rt = in.byte() < 250 ? e.rt : nullptr;
  const fa_config *use_cfg = in.byte() < 250 ? cfg : nullptr;

  while (in.left() > 0) {
    switch (in.byte() % 4) {
      case 0: {  // forward
        fa_forward_args a = FA_FORWARD_ARGS_INIT;
        a.struct_size = pick_struct_size(in, sizeof a);
        a.batch = pick_int(in, 1, 2);
        a.seqlen_q = pick_int(in, 1, 32);
        a.seqlen_k = pick_int(in, 1, 64);
        pick_tensor(in, e, &a.q);
        pick_tensor(in, e, &a.k);
        pick_tensor(in, e, &a.v);
        pick_tensor(in, e, &a.o);
        a.lse = pick_ptr(in, e);
        if (in.flag()) {
          a.cu_seqlens_q = pick_ptr(in, e);
          a.cu_seqlens_k = pick_ptr(in, e);
        }
        if (!(small_cfg && small(a.batch, 2) && small(a.seqlen_q, 32) && small(a.seqlen_k, 64)))
          spoil(&a.lse, e);
        report("fa_launch", fa_launch(rt, use_cfg, in.byte() < 250 ? &a : nullptr, nullptr));
        break;
      }
      case 1: {  // decode (with its workspace query)
        fa_decode_args a = FA_DECODE_ARGS_INIT;
        a.struct_size = pick_struct_size(in, sizeof a);
        a.batch = pick_int(in, 1, 2);
        a.seqlen_q = pick_int(in, 1, 4);
        a.seqlen_k_max = pick_int(in, 1, 64);
        pick_tensor(in, e, &a.q);
        pick_tensor(in, e, &a.k_cache);
        pick_tensor(in, e, &a.v_cache);
        a.cache_seqlens = pick_ptr(in, e);
        a.num_splits = pick_int(in, 0, 4);
        a.workspace = pick_ptr(in, e);
        pick_tensor(in, e, &a.o);
        if (in.flag()) a.o.data = 0;
        a.lse = pick_ptr(in, e);
        size_t ws = 0;
        int32_t splits = 0;
        const fa_status wst = fa_decode_workspace_size(rt, use_cfg, &a, &ws, &splits);
        a.workspace_size = wst == FA_SUCCESS && in.flag() ? ws : in.get<uint32_t>();
        if (!(small_cfg && small(a.batch, 2) && small(a.seqlen_q, 4) && small(a.seqlen_k_max, 64) &&
              small(a.num_splits, 4)))
          spoil(&a.cache_seqlens, e);
        report("fa_decode", fa_decode(rt, use_cfg, in.byte() < 250 ? &a : nullptr, nullptr));
        break;
      }
      case 2: {  // reduce
        fa_reduce_args a = FA_REDUCE_ARGS_INIT;
        a.struct_size = pick_struct_size(in, sizeof a);
        a.num_splits = pick_int(in, 1, 4);
        a.batch = pick_int(in, 1, 2);
        a.seqlen_q = pick_int(in, 1, 8);
        a.o_partial = pick_ptr(in, e);
        for (int i = 0; i < 4; ++i) a.o_partial_stride[i] = pick_stride(in);
        a.o_partial_stride[4] = in.byte() < 240 ? 1 : pick_stride(in);
        a.lse_partial = pick_ptr(in, e);
        for (int i = 0; i < 4; ++i) a.lse_partial_stride[i] = pick_stride(in);
        pick_tensor(in, e, &a.o);
        a.lse = pick_ptr(in, e);
        if (!(small_cfg && small(a.num_splits, 4) && small(a.batch, 2) && small(a.seqlen_q, 8)))
          spoil(&a.lse_partial, e);
        report("fa_decode_reduce",
               fa_decode_reduce(rt, use_cfg, in.byte() < 250 ? &a : nullptr, nullptr));
        break;
      }
      default: {  // generate into a buffer of a fuzzed (true) size
        const int kind = pick_enum(in, 0, 5);
        const int32_t sm =
            in.flag() ? 80 + 2 * static_cast<int32_t>(in.below(6)) : in.get<int32_t>();
        size_t cap = in.flag() ? e.gen_buf.size() : in.get<uint16_t>();
        char *buf = in.byte() < 32 ? nullptr : e.gen_buf.data();
        if (!buf && in.flag()) cap = 0;
        size_t ptx_size = 0;
        const fa_status st =
            fa_fuzz_generate(use_cfg, kind, sm, buf, cap, in.byte() < 250 ? &ptx_size : nullptr);
        report("fa_generate", st);
        if (st == FA_SUCCESS && buf && (ptx_size >= cap || buf[ptx_size] != '\0'))
          __builtin_trap();  // the PTX must be NUL-terminated within the buffer
        break;
      }
    }
  }
  fa_config_destroy(cfg);
  return 0;
}
