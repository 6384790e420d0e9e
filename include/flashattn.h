/*
 * flashattn: an embeddable FlashAttention runtime with a stable C ABI.
 *
 * Kernels are generated as PTX text at run time, JIT-compiled through the
 * CUDA Driver API (or run on the CPU by the built-in PTX emulator), cached on
 * disk in SQLite and launched on the caller's device pointers and stream.
 *
 * ABI rules
 *  - Versions with the same major number are ABI compatible.
 *  - fa_status codes are never renumbered.
 *  - Every args/options struct starts with `size_t struct_size`; set it with
 *    the matching FA_*_INIT initializer (or sizeof). Fields are only appended.
 *  - No C++ exception ever crosses this interface.
 *
 * Errors
 *  Every function returning fa_status also records a detailed message,
 *  readable with fa_last_error() on the same thread until that thread's next
 *  fa_ call. fa_status_string() gives the static text of a code.
 *
 * Tensors
 *  Device pointers are uint64_t (CUdeviceptr); streams are void* (CUstream,
 *  NULL = the legacy default stream). FlashAttention's layout is used:
 *  Q [batch, seqlen_q, num_heads_q, head_dim], K/V [batch, seqlen_k,
 *  num_heads_kv, head_dim], O [batch, seqlen_q, num_heads_q, head_dim_v].
 *  Strides are in elements; the last dimension must be contiguous (stride 1);
 *  the other strides must be multiples of 8 elements and data pointers 16-byte
 *  aligned. Every array a call reads or writes (tensors, LSE, tables,
 *  slopes, descales, masks, partial states) must end less than 2^63 bytes
 *  past its start and below 2^64: the offset of its last byte,
 *  sum_i stride_i (extent_i - 1) esize + esize - 1 (esize: element bytes,
 *  computed exactly), is at most 2^63 - 1 and the data pointer plus it does
 *  not wrap; else INVALID_ARGUMENT naming the stride or pointer. A stride
 *  times a zero index (stride[0] with batch 1) may be any valid value.
 *  LSE is fp32 [batch, num_heads_q, seqlen_q] (contiguous), natural
 *  logarithm of the softmax denominator (scaled scores), -inf for a row that
 *  sees no key.
 *
 * Semantics (as FlashAttention)
 *  S = softmax_scale * Q K^T; with softcap > 0, S = softcap * tanh(S / softcap);
 *  causal masking is bottom-right aligned: query i sees key j iff
 *  j <= i + seqlen_k - seqlen_q; a sliding window (window_left, window_right)
 *  restricts j to [i + seqlen_k - seqlen_q - window_left,
 *  i + seqlen_k - seqlen_q + window_right], -1 meaning unbounded. A row with no
 *  visible key gets O = 0 and LSE = -inf. Algorithms: FlashAttention-2 (Dao,
 *  2023) for the forward pass; Flash-Decoding (Dao, Haziza, Massa, Sizov,
 *  2023) for split-KV decoding.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 9
#define FLASHATTN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FLASHATTN_VERSION_NUMBER \
  (FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH)

/* Largest seqlen_q, seqlen_k and seqlen_k_max (and, for decode, rows of a
 * GQA group: (num_heads_q / num_heads_kv) * seqlen_q) the kernels accept:
 * their position arithmetic is 32-bit. Larger values give FA_ERROR_UNSUPPORTED. */
#define FA_MAX_SEQLEN (1 << 30)
/* Largest head_dim (Q and K) and head_dim_v (V and O): Gemma's 512, and
 * DeepSeek's MLA decode (576 for Q/K over the latent KV head, 512 for V). Past
 * 256 they run on the tensor-core kernels only (sm_80+; the scalar fallback
 * kernels and, on sm_90, the wgmma forward take up to 256: that forward then
 * runs on mma.sync). Since 0.5. */
#define FA_MAX_HEAD_DIM 576
#define FA_MAX_HEAD_DIM_V 512

#if defined(_WIN32)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status and errors                                                        */
/* ------------------------------------------------------------------------ */

typedef enum fa_status {
  FA_SUCCESS = 0,
  FA_ERROR_INVALID_ARGUMENT = 1,  /* null, wrong struct_size, bad shape/stride */
  FA_ERROR_UNSUPPORTED = 2,       /* valid but not implemented (head_dim, SM) */
  FA_ERROR_OUT_OF_MEMORY = 3,     /* host or device allocation failed */
  FA_ERROR_NO_DRIVER = 4,         /* libcuda.so.1 missing or too old */
  FA_ERROR_NO_DEVICE = 5,         /* no CUDA device, or ordinal out of range */
  FA_ERROR_CUDA = 6,              /* a CUDA driver call failed */
  FA_ERROR_COMPILE = 7,           /* PTX could not be JIT-compiled or parsed */
  FA_ERROR_LAUNCH = 8,            /* the kernel faulted (emulator: memcheck,
                                     barrier deadlock, divergent collective) */
  FA_ERROR_RUNTIME_POISONED = 9,  /* an earlier sticky error: destroy it */
  FA_ERROR_BUFFER_TOO_SMALL = 10, /* output buffer too small; size returned */
  FA_ERROR_INTERNAL = 11,         /* a bug in flashattn; please report */
  FA_ERROR_CACHE = 12,            /* a cache maintenance call failed */
  FA_STATUS_LAST                  /* never use */
} fa_status;

/* Static text for a status code ("invalid argument"); never NULL.
 * Thread safety: any thread. */
FA_API const char *fa_status_string(fa_status status);

/* The detailed message of the calling thread's last failed fa_ call
 * ("fa_launch: q.stride[3] must be 1, got 2"), or "" if it succeeded.
 * Valid until the thread's next fa_ call. Thread safety: thread-local. */
FA_API const char *fa_last_error(void);

/* Run-time version: FLASHATTN_VERSION_NUMBER of the loaded library, and its
 * "MAJOR.MINOR.PATCH" text. Thread safety: any thread. */
FA_API uint32_t fa_version_number(void);
FA_API const char *fa_version_string(void);

/* ------------------------------------------------------------------------ */
/* Enumerations                                                             */
/* ------------------------------------------------------------------------ */

typedef enum fa_dtype {
  FA_DTYPE_FP16 = 1, /* IEEE binary16 */
  FA_DTYPE_BF16 = 2, /* bfloat16 */
  FA_DTYPE_FP32 = 3, /* IEEE binary32: partial states, LSE; and as
                        fa_config_desc.dtype, fp32 Q/K/V/O (see there) */
  /* Since 0.5: fp8 (OCP 8-bit floating point, PTX ISA "Alternate
     Floating-Point Data Formats"), only as fa_config_desc.kv_dtype. */
  FA_DTYPE_FP8_E4M3 = 4, /* 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
                            infinities, 0x7f/0xff NaN; largest 448 */
  FA_DTYPE_FP8_E5M2 = 5  /* 1 sign, 5 exponent (bias 15), 2 mantissa bits
                            (the top byte of an IEEE binary16); largest 57344 */
} fa_dtype;

typedef enum fa_backend {
  FA_BACKEND_AUTO = 0,    /* cuda when a device exists, else emulator */
  FA_BACKEND_CUDA = 1,    /* NVIDIA GPU through libcuda.so.1 */
  FA_BACKEND_EMULATOR = 2 /* CPU interpreter of the generated PTX */
} fa_backend;

typedef enum fa_kernel_kind {
  FA_KERNEL_FORWARD = 0, /* prefill / forward pass */
  FA_KERNEL_DECODE = 1,  /* split-KV partial states */
  FA_KERNEL_REDUCE = 2,  /* combine partial states */
  /* Since 0.9: fa_backward's three kernels, in its launch order (for
     fa_generate; fa_backward launches them itself). */
  FA_KERNEL_BACKWARD_PRE = 3, /* per query row: D = rowsum(dO o O), the LSE
                                 in log2 units, dQ's accumulators zeroed */
  FA_KERNEL_BACKWARD = 4,     /* main: dK, dV and dQ's fp32 accumulators, a
                                 CTA per key block and KV head */
  FA_KERNEL_BACKWARD_POST = 5 /* per query row: dQ from its accumulators,
                                 dsinks */
} fa_kernel_kind;

/* The logarithm base of an LSE value (since 0.4): the natural log of the
 * softmax denominator (flashattn, FlashAttention), or its base-2 log
 * (FlashInfer's attention states: lse2 = lse * log2(e)). -inf is -inf in
 * both. */
typedef enum fa_lse_format {
  FA_LSE_NATURAL = 0, /* ln(sum_j exp(s_j)) */
  FA_LSE_BASE2 = 1    /* log2(sum_j exp(s_j)) = ln(...) * log2(e) */
} fa_lse_format;

typedef enum fa_cache_mode {
  FA_CACHE_DEFAULT = 0, /* disk, unless FLASHATTN_CACHE_DISABLE=1 */
  FA_CACHE_DISK = 1,    /* disk (falls back to memory if it cannot) */
  FA_CACHE_MEMORY = 2   /* this process only */
} fa_cache_mode;

/* ------------------------------------------------------------------------ */
/* Runtime                                                                  */
/* ------------------------------------------------------------------------ */

/* A device binding (CUDA primary context of one device, or the emulator),
 * its loaded kernels and its kernel cache. Thread safety: every call taking
 * a runtime may be made from any thread concurrently, except destroy. */
typedef struct fa_runtime fa_runtime;

typedef struct fa_runtime_options {
  size_t struct_size;
  fa_backend backend;
  int32_t device; /* CUDA device ordinal (cuda backend), >= 0 */
  fa_cache_mode cache_mode;
  const char *cache_dir; /* NULL: $FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn,
                            ~/.cache/flashattn, in that order. Used only if it
                            and every directory above it are owned by this
                            user or root and writable by no one else (root's:
                            read-only); else the cache is in memory and
                            fa_cache_stats.note says why */
  int32_t emulator_sm;   /* SM the emulator targets, with that SM's shared
                            memory and register limits (80, 86, 87, 89, 90,
                            100, 103, 110, 120, 121); 0 = $FLASHATTN_EMU_SM
                            if set (the whole value a decimal number: "90",
                            not "90a" or " 90"), else 80 */
  /* Since 0.6 (FA_RUNTIME_OPTIONS_SIZE_0_5 ends before it; zero = as 0.5).
   * fa_ptx_compiler: FA_PTX_COMPILER_AUTO compiles each new kernel to a
   * cubin with the PTX compiler plugin (libflashattn_ptxc.so next to
   * libflashattn, or $FLASHATTN_PTX_COMPILER; "off" there turns it off for
   * the process) when it is present and trusted, else leaves the PTX to
   * the driver's JIT; FA_PTX_COMPILER_OFF always uses the driver's JIT
   * (cuda backend only; fa_cache_stats.compiler_mode says which is used). */
  int64_t ptx_compiler;
  /* Since 0.7 (FA_RUNTIME_OPTIONS_SIZE_0_6 ends before it; zero = as 0.6).
   * A second kernel store below the local cache (see fa_kernel_store in
   * "Kernel cache"): a local miss asks it, a verified row it returns is
   * copied into the local cache, and new kernels are written to both. NULL:
   * $FLASHATTN_KERNEL_STORE (redis://..., unix://..., or "off"/unset for
   * none) loads the Redis plugin; a non-NULL kernel_store wins over the
   * variable. The struct is copied by fa_runtime_create; its `user` must
   * stay valid until its destroy callback runs (or, without one, until
   * fa_runtime_destroy returns). */
  const struct fa_kernel_store *kernel_store;
} fa_runtime_options;

typedef enum fa_ptx_compiler {
  FA_PTX_COMPILER_AUTO = 0, /* the plugin when present and trusted */
  FA_PTX_COMPILER_OFF = 1   /* never the plugin: the driver's JIT */
} fa_ptx_compiler;

/* struct_size of fa_runtime_options in flashattn 0.1 to 0.5 (before ptx_compiler). */
#define FA_RUNTIME_OPTIONS_SIZE_0_5 (offsetof(fa_runtime_options, ptx_compiler))
/* struct_size of fa_runtime_options in flashattn 0.6 (before kernel_store). */
#define FA_RUNTIME_OPTIONS_SIZE_0_6 (offsetof(fa_runtime_options, kernel_store))

#define FA_RUNTIME_OPTIONS_INIT \
  { sizeof(fa_runtime_options), FA_BACKEND_AUTO, 0, FA_CACHE_DEFAULT, NULL, 0, 0, NULL }

/* Creates a runtime. options may be NULL (= FA_RUNTIME_OPTIONS_INIT).
 * struct_size may be sizeof(fa_runtime_options), FA_RUNTIME_OPTIONS_SIZE_0_6
 * or FA_RUNTIME_OPTIONS_SIZE_0_5.
 * Errors: FA_ERROR_INVALID_ARGUMENT (null out, bad struct_size, bad enum,
 * emulator_sm 0 with a FLASHATTN_EMU_SM that is not a decimal number, a
 * kernel_store whose struct_size is not sizeof(fa_kernel_store) or whose get
 * or put is NULL: the message names the field),
 * FA_ERROR_NO_DRIVER / FA_ERROR_NO_DEVICE (backend cuda only; auto falls back
 * to the emulator), FA_ERROR_UNSUPPORTED (a device of compute capability
 * below 8.0, or an emulator_sm or FLASHATTN_EMU_SM not listed), FA_ERROR_CUDA,
 * FA_ERROR_OUT_OF_MEMORY. A cache that cannot
 * be opened never fails creation: it degrades to memory with a warning (see
 * fa_cache_stats); nor does a FLASHATTN_KERNEL_STORE that cannot be used
 * (one warning; fa_cache_stats.kernel_store_note says why). On failure a
 * caller's kernel_store->destroy is not called: the caller still owns it. */
FA_API fa_status fa_runtime_create(const fa_runtime_options *options, fa_runtime **out);

/* Destroys a runtime and unloads its kernels; NULL is a no-op. Memory from
 * fa_malloc must be freed before. Not thread-safe with other calls on rt. */
FA_API void fa_runtime_destroy(fa_runtime *rt);

typedef struct fa_runtime_info {
  size_t struct_size;
  fa_backend backend;     /* the backend actually in use */
  int32_t sm;             /* compute capability * 10 + minor, e.g. 80, 90 */
  int32_t num_sms;        /* streaming multiprocessors */
  int32_t driver_version; /* cuDriverGetVersion, 0 on the emulator */
  char device_name[128];
} fa_runtime_info;

#define FA_RUNTIME_INFO_INIT                                 \
  {                                                          \
    sizeof(fa_runtime_info), FA_BACKEND_AUTO, 0, 0, 0, { 0 } \
  }

/* Fills *info (whose struct_size the caller sets). Errors:
 * FA_ERROR_INVALID_ARGUMENT. */
FA_API fa_status fa_runtime_get_info(const fa_runtime *rt, fa_runtime_info *info);

/* ------------------------------------------------------------------------ */
/* Device memory helpers (for callers without an allocator of their own)     */
/* ------------------------------------------------------------------------ */

/* Allocates `bytes` (> 0) of device memory, 256-byte aligned. On the
 * emulator, kernels may only touch memory allocated here: every access is
 * bounds-checked against these allocations; allocations of 1 GiB and more
 * are reserved lazily (pages are committed when touched) and start zeroed,
 * smaller ones start filled with 0xFF bytes. Errors: INVALID_ARGUMENT,
 * OUT_OF_MEMORY, CUDA, RUNTIME_POISONED. */
FA_API fa_status fa_malloc(fa_runtime *rt, size_t bytes, uint64_t *ptr);
/* Frees memory from fa_malloc; 0 is a no-op. Errors: INVALID_ARGUMENT (not
 * an allocation of rt), CUDA. */
FA_API fa_status fa_free(fa_runtime *rt, uint64_t ptr);
/* Synchronous copies (host memory is pageable); bytes may be 0. */
FA_API fa_status fa_memcpy_htod(fa_runtime *rt, uint64_t dst, const void *src, size_t bytes);
FA_API fa_status fa_memcpy_dtoh(fa_runtime *rt, void *dst, uint64_t src, size_t bytes);
/* Sets `bytes` bytes to `value`. Synchronous. */
FA_API fa_status fa_memset(fa_runtime *rt, uint64_t dst, uint8_t value, size_t bytes);
/* Waits for all work on `stream` (NULL = default stream). */
FA_API fa_status fa_synchronize(fa_runtime *rt, void *stream);

/* ------------------------------------------------------------------------ */
/* Configs                                                                  */
/* ------------------------------------------------------------------------ */

/* A validated attention problem family, independent of any device. Immutable
 * once created: may be shared by threads and runtimes. */
typedef struct fa_config fa_config;

typedef struct fa_config_desc {
  size_t struct_size;
  fa_dtype dtype;       /* FA_DTYPE_FP16, FA_DTYPE_BF16 or FA_DTYPE_FP32 (Q, K,
                           V, O). FP32: the tensors are fp32 in memory (no
                           conversion pass; strides still in elements, data
                           16-byte aligned); Q, K and V are rounded to bf16
                           (round to nearest even) on their way into shared
                           memory and the tensor cores compute as for bf16
                           with fp32 accumulation, so each input element
                           carries a relative error of at most 2^-9 (bf16's
                           8-bit significand), the same as a bf16 caller's
                           conversion; P is rounded to bf16 as with BF16. O
                           is written as fp32 (never rounded to 16 bits).
                           fa_launch (head_dim up to 384), fa_decode
                           (without a KV append) and
                           fa_decode_reduce; not with an fp8 kv_dtype
                           (UNSUPPORTED), not in the scalar fallback kernels
                           (FLASHATTN_SCALAR_FORWARD / _DECODE: UNSUPPORTED) */
  int32_t head_dim;     /* multiple of 8, 8..FA_MAX_HEAD_DIM (576) */
  int32_t head_dim_v;   /* multiple of 8, 8..FA_MAX_HEAD_DIM_V (512); 0 =
                           head_dim. Past 256 (either) only on sm_80+
                           tensor-core kernels (else UNSUPPORTED at launch) */
  int32_t num_heads_q;  /* >= 1 */
  int32_t num_heads_kv; /* >= 1, divides num_heads_q (GQA / MQA) */
  int32_t causal;       /* 0 or 1, bottom-right aligned */
  int32_t window_left;  /* >= 0, or -1 = unbounded; any width (up to
                           INT32_MAX) that covers the sequence acts as -1 */
  int32_t window_right; /* >= 0, or -1 = unbounded (causal forces 0) */
  float softmax_scale;  /* > 0, finite, and softmax_scale * log2(e) finite;
                           0 = 1/sqrt(head_dim). Any such scale and any
                           finite score work: each exponent is formed as
                           (s - rowmax) * scale (not s * scale - rowmax *
                           scale, which cancels past ~2^24), so O is the
                           softmax of the fp32 scores s = q.k however large
                           (e.g. scale 1e10, or fp16 q, k near 30000).
                           Outside the range: a q.k that overflows fp32
                           (bf16 / fp32 inputs of about 1e18 and more:
                           NaN out); LSE (fp32) is +-inf where
                           |scale * rowmax| passes FLT_MAX; scores closer
                           than their fp32 rounding are not told apart
                           (docs/kernels.md, "Large scores") */
  float softcap;        /* >= 0 and finite, softcap * log2(e) and
                           softmax_scale / softcap finite; 0 = off */
  /* Since 0.5 (FA_CONFIG_DESC_SIZE_0_4 ends before it; zero = as 0.4). */
  int64_t kv_dtype; /* 0 = dtype; FA_DTYPE_FP8_E4M3 or FA_DTYPE_FP8_E5M2: K and
                       V (the KV cache) are fp8 bytes, Q and O stay dtype. A K
                       element's value is fp8(byte) * k_descale (the decode
                       args' descales), V's likewise; attention runs on those
                       values with fp32 accumulation (products in f16; a
                       bf16 Q is scaled per row by a power of two into
                       f16's range first, exact but for elements below
                       2^-10 of their row's largest). fa_decode only (sm_89+:
                       UNSUPPORTED below it and from fa_launch; a KV append
                       quantises the new rows, see k_new); head_dim and
                       head_dim_v multiples of 16 (else UNSUPPORTED). 64-bit
                       so that 0.4's struct, padding included, ends where it
                       begins (as fa_generate_options.sinks). With q_dtype
                       fp8: fa_launch (the fp8 forward) */
  /* Since 0.6 (FA_CONFIG_DESC_SIZE_0_5 ends before it; zero = as 0.5). */
  int64_t q_dtype; /* 0 = dtype; FA_DTYPE_FP8_E4M3 or FA_DTYPE_FP8_E5M2: Q is
                      fp8 bytes too, with an fp8 kv_dtype (else
                      INVALID_ARGUMENT): the fp8 forward of
                      FlashAttention-3, fa_launch only (fa_decode:
                      UNSUPPORTED), sm_89+ (else UNSUPPORTED). A Q element's
                      value is fp8(byte) * q_descale (fa_forward_args).
                      On sm_89 and sm_120/121 S = Q K^T and O = P V run on
                      fp8 tensor cores (mma.sync m16n8k32, f32
                      accumulation; PTX ISA "Matrix Fragments for
                      mma.m16n8k32"), P rounded to e4m3 (round to nearest
                      even: a relative error of at most 2^-4 per
                      probability, none for the row sums, which stay f32);
                      on sm_90a the same on wgmma m64nNk32 .e4m3/.e5m2;
                      on sm_100 .. sm_110 the bytes are converted exactly
                      to f16 on load and the f16 kernels run (P in f16). O
                      written in dtype (FA_DTYPE_FP16 or FA_DTYPE_BF16), LSE
                      in fp32. head_dim and head_dim_v
                      multiples of 16; q/k/v data 16-byte aligned, strides
                      multiples of 16 elements */
} fa_config_desc;

/* struct_size of fa_config_desc in flashattn 0.4 (before kv_dtype). */
#define FA_CONFIG_DESC_SIZE_0_4 (offsetof(fa_config_desc, kv_dtype))
/* struct_size of fa_config_desc in flashattn 0.5 (before q_dtype). */
#define FA_CONFIG_DESC_SIZE_0_5 (offsetof(fa_config_desc, q_dtype))

#define FA_CONFIG_DESC_INIT \
  { sizeof(fa_config_desc), FA_DTYPE_FP16, 0, 0, 0, 0, 0, -1, -1, 0.0f, 0.0f, 0, 0 }

/* Validates desc and creates a config. Errors: INVALID_ARGUMENT (null,
 * struct_size, dtype, heads not divisible, negative window other than -1,
 * bad scale/softcap), UNSUPPORTED (head_dim not a multiple of 8 in
 * 8..FA_MAX_HEAD_DIM, head_dim_v not one in 8..FA_MAX_HEAD_DIM_V,
 * dtype FA_DTYPE_FP32 with an fp8 kv_dtype).
 * Thread safety: any thread. */
FA_API fa_status fa_config_create(const fa_config_desc *desc, fa_config **out);
/* NULL is a no-op. */
FA_API void fa_config_destroy(fa_config *cfg);

/* ------------------------------------------------------------------------ */
/* Code generation (needs no GPU)                                           */
/* ------------------------------------------------------------------------ */

/* Writes the PTX module the runtime would use for `kind` of cfg on SM `sm`
 * (80, 86, 87, 89, 90, 100, 103, 110, 120, 121: every GPU of compute
 * capability 8.0 and up runs the mma.sync kernels; tiles are sized from that
 * SM's published shared memory and register limits) into buf as a
 * NUL-terminated string. *ptx_size receives the length without the NUL.
 * Pass buf = NULL, buf_size = 0 to query the size. Output is byte-identical
 * for identical arguments. The backward kinds give the module fa_backward
 * launches for that kernel (deterministic is a launch argument: the same
 * module either way). Errors: INVALID_ARGUMENT, UNSUPPORTED (sm; with a
 * backward kind, what fa_backward refuses of cfg: fp8 or fp32 configs, head
 * dims past 256, or past 128 and not multiples of 16), BUFFER_TOO_SMALL
 * (*ptx_size still set). Thread safety: any thread. */
FA_API fa_status fa_generate(const fa_config *cfg, fa_kernel_kind kind, int32_t sm, char *buf,
                             size_t buf_size, size_t *ptx_size);

/* The launch shape a kernel is generated for (since 0.3): the module a
 * launch with such arguments would run. Zero = fa_generate's shape
 * (fixed-length, contiguous K/V). */
typedef struct fa_generate_options {
  size_t struct_size;
  int32_t kv_layout; /* fa_kv_layout of the K/V cache (forward and decode) */
  int32_t page_size; /* FA_KV_PAGED: tokens per page, >= 1 (a multiple of
                        the key tile selects the per-tile page lookup) */
  int32_t varlen;    /* forward, backward kinds: 1 = cu_seqlens_q is set */
  int32_t seqused_k; /* forward: 1 = seqused_k is set */
  /* Since 0.4 (FA_GENERATE_OPTIONS_SIZE_0_3 ends before them; zero = as 0.3). */
  int32_t tree_mask;          /* decode: 1 = fa_decode_args.tree_mask is set */
  int32_t lse_partial_format; /* reduce: fa_lse_format of the partial LSEs read */
  int32_t lse_format;         /* reduce: fa_lse_format of the LSE written */
  /* Since 0.4.1 (FA_GENERATE_OPTIONS_SIZE_0_4 ends before it; zero = as 0.4). */
  int64_t sinks; /* forward, reduce, backward kinds: 1 = attention sinks
                    are set (the forward's fa_forward_args.sinks, a
                    backward's fwd.sinks; a reduce's fa_reduce_args.sinks,
                    which fa_decode's combine also runs with
                    fa_decode_args.sinks). 64-bit so that 0.4.0's struct,
                    padding included, ends where it begins */
  /* Since 0.5 (FA_GENERATE_OPTIONS_SIZE_0_4_1 ends before them; zero = as
     0.4.1). */
  int32_t alibi;        /* forward, decode, backward kinds: 1 =
                           alibi_slopes are set (the fa_forward_args,
                           fa_decode_args or backward's fwd alibi_slopes) */
  int32_t append_kv;    /* decode: 1 = k_new/v_new are set (KV append) */
  int32_t rotary;       /* decode, with append_kv: 0 = no rotary, 1 = GPT-NeoX
                           pairs, 2 = GPT-J (interleaved) pairs */
  int32_t rotary_dtype; /* fa_dtype of rotary_cos/sin: FP32 (or 0) or the
                           cfg dtype */
  /* Since 0.5.1 (FA_GENERATE_OPTIONS_SIZE_0_5 ends before it; zero = as 0.5). */
  int32_t v_in_k; /* decode: 1 = v_cache is k_cache's memory with its strides
                     (and page table or pointer array): V is K's first
                     head_dim_v columns, read from the K tile (MLA's latent
                     cache; fa_decode_args.v_cache). Forward (since 0.9,
                     not varlen): 1 = fa_forward_args.v is k's memory the
                     same way; on sm_100/103 at MLA's dims the module is
                     then the MLA kernel fa_launch runs with one split */
} fa_generate_options;

/* struct_size of fa_generate_options in flashattn 0.3 (before tree_mask). */
#define FA_GENERATE_OPTIONS_SIZE_0_3 (offsetof(fa_generate_options, tree_mask))
/* struct_size of fa_generate_options in flashattn 0.4.0 (before sinks). */
#define FA_GENERATE_OPTIONS_SIZE_0_4 (offsetof(fa_generate_options, sinks))
/* struct_size of fa_generate_options in flashattn 0.4.1 (before alibi). */
#define FA_GENERATE_OPTIONS_SIZE_0_4_1 (offsetof(fa_generate_options, alibi))
/* struct_size of fa_generate_options in flashattn 0.5 (before v_in_k). */
#define FA_GENERATE_OPTIONS_SIZE_0_5 (offsetof(fa_generate_options, v_in_k))

#define FA_GENERATE_OPTIONS_INIT \
  { sizeof(fa_generate_options), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* fa_generate for the launch shape in *opts (NULL = fa_generate). struct_size
 * may be sizeof(fa_generate_options), FA_GENERATE_OPTIONS_SIZE_0_5,
 * FA_GENERATE_OPTIONS_SIZE_0_4_1,
 * FA_GENERATE_OPTIONS_SIZE_0_4 or FA_GENERATE_OPTIONS_SIZE_0_3. Errors:
 * as fa_generate, plus INVALID_ARGUMENT (struct_size, an unknown layout,
 * page_size < 1 with PAGED, page_size with another layout, varlen with
 * kind DECODE or REDUCE, seqused_k with kind DECODE or REDUCE, a layout
 * with kind REDUCE, tree_mask not 0 or 1 or with kind != DECODE, an lse
 * format that is not an fa_lse_format or with kind != REDUCE, sinks not 0
 * or 1 or with kind DECODE: a decode kernel never reads the sinks, its
 * combine does; alibi not 0 or 1 or with kind REDUCE; append_kv not 0 or 1
 * or with kind != DECODE, rotary not 0..2 or without append_kv,
 * rotary_dtype neither 0, FP32 nor the cfg dtype; v_in_k not 0 or 1, or
 * with kind != DECODE, append_kv, or head_dim_v > head_dim) and, with a
 * backward kind, UNSUPPORTED for what fa_backward refuses: a paged or
 * pointer-array layout, seqused_k. */
FA_API fa_status fa_generate_for(const fa_config *cfg, fa_kernel_kind kind, int32_t sm,
                                 const fa_generate_options *opts, char *buf, size_t buf_size,
                                 size_t *ptx_size);

/* ------------------------------------------------------------------------ */
/* Forward (prefill)                                                        */
/* ------------------------------------------------------------------------ */

/* A 4-D tensor view: data pointer and strides in elements. */
typedef struct fa_tensor {
  uint64_t data;
  int64_t stride[4];
} fa_tensor;

/* How K and V are addressed (since 0.3). One code path serves every layout
 * through strides; the kernel reads a key's row from:
 *  FA_KV_CONTIGUOUS  k/v [batch, seqlen_k, num_heads_kv, head_dim]:
 *                    data + b stride[0] + j stride[1] + h stride[2].
 *  FA_KV_PAGED       k/v [num_pages, page_size, num_heads_kv, head_dim] with
 *                    any strides (stride[0] page, stride[1] token in page,
 *                    stride[2] head), so both NHD (FlashAttention, vLLM) and
 *                    HND ([num_pages, num_heads_kv, page_size, head_dim],
 *                    FlashInfer: swap stride[1] and stride[2]) work. Key j of
 *                    sequence b is token j % page_size of page
 *                    block_table[b * block_table_stride + j / page_size].
 *                    Any page_size >= 1; fastest when it is a multiple of 64.
 *  FA_KV_PTR_ARRAY   sequence b's keys at k_ptrs[b] (values at v_ptrs[b]),
 *                    each [seqlen_k, num_heads_kv, head_dim] with stride[1..3]
 *                    of k/v (their data must be 0, stride[0] is ignored).
 * block_table, k_ptrs and v_ptrs are device data the caller vouches for:
 * every page of a valid key in [0, num_pages), every pointer 16-byte aligned
 * and covering its sequence (docs/reliability.md, "Threat model"). */
typedef enum fa_kv_layout {
  FA_KV_CONTIGUOUS = 0,
  FA_KV_PAGED = 1,
  FA_KV_PTR_ARRAY = 2
} fa_kv_layout;

typedef struct fa_kv_cache_layout {
  int32_t layout;             /* fa_kv_layout; 0 = contiguous */
  int32_t page_size;          /* PAGED: tokens per page, >= 1 */
  int32_t num_pages;          /* PAGED: pages in k and v, >= 1 */
  int32_t max_pages_per_seq;  /* PAGED: used columns of block_table, >= 1 and
                                 >= ceil(seqlen_k / page_size) */
  uint64_t block_table;       /* PAGED: int32 [batch, max_pages_per_seq],
                                 4-byte aligned */
  int64_t block_table_stride; /* PAGED: elements between block_table rows,
                                 >= max_pages_per_seq */
  uint64_t k_ptrs, v_ptrs;    /* PTR_ARRAY: uint64 [batch], 8-byte aligned */
} fa_kv_cache_layout;

typedef struct fa_forward_args {
  size_t struct_size;
  int32_t batch;         /* >= 1 */
  int32_t seqlen_q;      /* 1..FA_MAX_SEQLEN; with cu_seqlens_q: the maximum over
                            the batch (a longer sequence is cut to it) */
  int32_t seqlen_k;      /* 1..FA_MAX_SEQLEN; with cu_seqlens_k: the maximum */
  fa_tensor q;           /* [batch, seqlen_q, num_heads_q, head_dim], cfg dtype */
  fa_tensor k;           /* [batch, seqlen_k, num_heads_kv, head_dim] */
  fa_tensor v;           /* [batch, seqlen_k, num_heads_kv, head_dim_v] */
  fa_tensor o;           /* [batch, seqlen_q, num_heads_q, head_dim_v], written */
  uint64_t lse;          /* fp32 [batch, num_heads_q, seqlen_q]; 0 = not written.
                            With cu_seqlens_q: [num_heads_q, total_q],
                            total_q = cu_seqlens_q[batch] */
  uint64_t cu_seqlens_q; /* int32 [batch + 1] prefix sums, or 0 (fixed length).
                            When set, sequences are packed along dim 1 of q/o
                            (stride[0] ignored, use batch dim of 1 in strides):
                            sequence b is rows cu[b] .. cu[b+1]-1. Device data,
                            trusted: non-decreasing, within q/o (and lse). Each
                            length is clamped to [0, seqlen_q] in the kernel */
  uint64_t cu_seqlens_k; /* int32 [batch + 1]; set together with cu_seqlens_q;
                            lengths clamped to [0, seqlen_k] */
  /* Since 0.3 (FA_FORWARD_ARGS_SIZE_0_2 ends before them; zero = as 0.2). */
  fa_kv_cache_layout kv; /* how k and v are addressed; PAGED and PTR_ARRAY
                            read a KV cache (chunked prefill: the queries are
                            the last tokens of each sequence) and need
                            seqused_k or seqlen_k keys per sequence, not
                            cu_seqlens_k */
  uint64_t seqused_k;    /* int32 [batch] or 0: sequence b has keys
                            0..seqused_k[b]-1 (clamped to [0, seqlen_k]);
                            0 = seqlen_k (or cu_seqlens_k) keys. Not with
                            cu_seqlens_k. As flash_attn_varlen_func's
                            seqused_k */
  /* Since 0.4.1 (FA_FORWARD_ARGS_SIZE_0_4 ends before it; zero = as 0.4). */
  uint64_t sinks; /* attention sinks (gpt-oss), or 0 = none: fp32
                     [num_heads_q] device data, 4-byte aligned, one
                     natural-log logit per query head that joins every row's
                     softmax denominator and contributes no value:
                     O = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) +
                     e^(sinks[h] - m)), s_j = softmax_scale q.k_j (after
                     softcap) and m any offset; the sink is compared with
                     the scaled scores as it is (not multiplied by
                     softmax_scale, not softcapped) and is outside every
                     mask and window. LSE includes it:
                     log(sum_j e^s_j + e^sinks[h]); a row with no visible
                     key gets O = 0 and LSE = sinks[h]. -inf = no sink;
                     +inf: O = 0, LSE = +inf, and NaN: O = NaN, LSE = NaN,
                     on every row of head h (those with no visible key
                     too), as the formula gives */
  /* Since 0.5 (FA_FORWARD_ARGS_SIZE_0_4_1 ends before them; zero = as 0.4.1). */
  uint64_t alibi_slopes;         /* ALiBi (Press et al. 2022), or 0 = none: fp32
                                    device data, 4-byte aligned; the slope of
                                    (batch b, query head h) is alibi_slopes[b *
                                    alibi_slopes_stride + h]. The logit of query
                                    i, key j becomes s_ij - slope |i + seqlen_k -
                                    seqlen_q - j| (s_ij = softmax_scale q.k_j,
                                    after softcap; bottom-right aligned, per
                                    sequence with varlen or seqused_k), causal or
                                    not, as FlashAttention-2's alibi_slopes
                                    (whose causal kernel adds slope j instead:
                                    the same O, an LSE moved by a per-row
                                    constant). Non-finite slopes are the
                                    caller's data (NaN in, NaN out) */
  int64_t alibi_slopes_stride;   /* elements between sequences' slopes (>=
                                    num_heads_q), or 0 = one [num_heads_q] row
                                    for the whole batch; 0 when alibi_slopes is
                                    0 */
  uint64_t k_descale, v_descale; /* fp8 K/V (fa_config_desc.kv_dtype) only:
                                    fp32, 4-byte aligned, or 0 = 1.0: descale
                                    of (b, h_kv) at k_descale[b *
                                    descale_stride[0] + h_kv *
                                    descale_stride[1]] (device data) */
  int64_t descale_stride[2];     /* elements, >= 0; {0, 0} = one value per
                                    tensor (FA3's [batch, num_heads_kv]
                                    descales: {num_heads_kv, 1}) */
  /* Since 0.6 (FA_FORWARD_ARGS_SIZE_0_5 ends before it; zero = as 0.5). */
  uint64_t q_descale; /* fp8 Q (fa_config_desc.q_dtype) only: as k_descale
                         (the same descale_stride; FA3's q_descale [batch,
                         num_heads_kv]: every query head of a KV head's
                         group shares it), or 0 = 1.0 */
  /* Since 0.8 (FA_FORWARD_ARGS_SIZE_0_7 ends before them; zero = as 0.7). */
  uint64_t workspace;    /* scratch for the forward kernels, or 0 = none: device
                            memory of fa_forward_workspace_size bytes, zeroed
                            by the caller once before its first use
                            (cuMemsetD8 after the allocation), not shared by
                            launches that may run at the same time (one per
                            stream). Its first 8 bytes are the persistent
                            kernel's work counter (8-byte aligned): when the
                            runtime runs a persistent forward kernel
                            (experimental, off by default: the sm_90a one
                            with FLASHATTN_SM90_PERSISTENT=1, the mma.sync
                            one of sm_80 and up with
                            FLASHATTN_SM80_PERSISTENT=1), a workspace makes it
                            hand out work items dynamically (an atomic
                            counter; with 0 it runs the static order), and
                            every launch leaves the counter zero again, so it
                            serves back-to-back launches and CUDA-graph
                            replays with no memset and no host sync. From byte
                            256 on, split-KV partial states: when
                            the CTAs of a launch (fixed-length or varlen)
                            would leave SMs idle, the tensor-core forward splits the keys and
                            combines the splits with a second kernel
                            (FLASHATTN_FORWARD_SPLITS=0: never), or a few
                            queries per sequence run on the GQA-packing
                            decode kernel (see
                            fa_forward_workspace_size), but only with
                            a workspace 256-byte aligned and of at least the
                            bytes fa_forward_workspace_size gives; a smaller
                            or 8-byte aligned one runs unsplit. Ignored by
                            every other kernel. Device data: a counter not
                            zeroed before its first use gives wrong results */
  size_t workspace_size; /* bytes at workspace, >= 8 when workspace != 0;
                            0 when workspace is 0 */
} fa_forward_args;

/* struct_size of fa_forward_args in flashattn 0.2 (before kv). */
#define FA_FORWARD_ARGS_SIZE_0_2 (offsetof(fa_forward_args, kv))
/* struct_size of fa_forward_args in flashattn 0.3 and 0.4.0 (before sinks). */
#define FA_FORWARD_ARGS_SIZE_0_4 (offsetof(fa_forward_args, sinks))
/* struct_size of fa_forward_args in flashattn 0.4.1 (before alibi_slopes). */
#define FA_FORWARD_ARGS_SIZE_0_4_1 (offsetof(fa_forward_args, alibi_slopes))
/* struct_size of fa_forward_args in flashattn 0.5 (before q_descale). */
#define FA_FORWARD_ARGS_SIZE_0_5 (offsetof(fa_forward_args, q_descale))
/* struct_size of fa_forward_args in flashattn 0.6 and 0.7 (before workspace). */
#define FA_FORWARD_ARGS_SIZE_0_7 (offsetof(fa_forward_args, workspace))

#define FA_TENSOR_INIT \
  {                    \
    0, { 0, 0, 0, 0 }  \
  }
#define FA_KV_CACHE_LAYOUT_INIT \
  { 0, 0, 0, 0, 0, 0, 0, 0 }
#define FA_FORWARD_ARGS_INIT                                                          \
  {                                                                                   \
    sizeof(fa_forward_args), 0, 0, 0, FA_TENSOR_INIT, FA_TENSOR_INIT, FA_TENSOR_INIT, \
        FA_TENSOR_INIT, 0, 0, 0, FA_KV_CACHE_LAYOUT_INIT, 0, 0, 0, 0, 0, 0, {0, 0},   \
        0, 0, 0                                                                       \
  }

/* O = softmax(S) V for every (batch, head, query), FlashAttention-2. Runs
 * asynchronously on `stream` (emulator: synchronously). The first call for a
 * config generates, compiles and caches its kernel. struct_size may be
 * sizeof(fa_forward_args), FA_FORWARD_ARGS_SIZE_0_7 (no workspace),
 * FA_FORWARD_ARGS_SIZE_0_5 (no q_descale),
 * FA_FORWARD_ARGS_SIZE_0_4_1 (no ALiBi), FA_FORWARD_ARGS_SIZE_0_4 (no
 * sinks) or FA_FORWARD_ARGS_SIZE_0_2. With
 * sinks, the gpt-oss softmax (see fa_forward_args.sinks; openai/gpt-oss
 * gpt_oss/torch/model.py sdpa, FlashAttention-3's learnable sink), in every
 * forward kernel. With alibi_slopes, ALiBi's linear bias (see
 * fa_forward_args.alibi_slopes; the sink is never biased), in every forward
 * kernel, with every mask, window, softcap and KV layout. With an fp32
 * config (fa_config_desc.dtype) q/k/v/o are fp32 and the mma.sync kernel
 * runs (on sm_90 too).
 * Errors: INVALID_ARGUMENT (null, struct_size, sizes, strides, alignment,
 * sinks or alibi_slopes not 4-byte aligned, alibi_slopes_stride < 0, set
 * without alibi_slopes or between 1 and num_heads_q - 1, an array past 2^63
 * bytes or 2^64 (see Tensors above): "k.stride[0] * (batch - 1) overflows a
 * 64-bit byte offset ..."; with cu_seqlens, q/o/lse (k/v) are checked over
 * seqlen_q (seqlen_k) rows, the rest being device data; workspace not
 * 8-byte aligned or ending past 2^64, workspace_size < 8 with a workspace
 * or != 0 without one: "workspace ..." / "workspace_size ..."),
 * UNSUPPORTED, OUT_OF_MEMORY, COMPILE, CUDA, LAUNCH, RUNTIME_POISONED.
 * Nothing is written when an argument is rejected. */
FA_API fa_status fa_launch(fa_runtime *rt, const fa_config *cfg, const fa_forward_args *args,
                           void *stream);

/* The bytes of fa_forward_args.workspace fa_launch uses for args on rt: 8
 * (two uint32 counters, 8-byte aligned) when it would run them on a
 * persistent forward kernel (sm_90a, FLASHATTN_SM90_PERSISTENT; mma.sync,
 * FLASHATTN_SM80_PERSISTENT), which then takes its work items from the
 * workspace's counter (dynamic scheduling); 256 plus the split-KV partial
 * states (fp32 O [splits, batch, seqlen_q, num_heads_q, head_dim_v] and
 * LSE [splits, batch, num_heads_q, seqlen_q], each 256-byte aligned;
 * varlen: padded to batch sequences of seqlen_q, the longest, as the
 * host cannot read cu_seqlens) when it would split the keys of a launch
 * (fixed-length or varlen) whose CTAs leave SMs idle (FlashAttention-3's rule: under 80% of the SMs, at
 * least 8 key tiles, the fewest splits of at least 4 tiles whose waves are
 * 85% as full as the best count's); 256 plus fa_decode_workspace_size's
 * answer when a launch without cu_seqlens_k (fixed-length, or cu_seqlens_q
 * with seqused_k: a vLLM-style decode batch; any KV layout) with a GQA group
 * of 2 or more and seqlen_q x group <= 16 (no fp8) runs on the decode
 * kernel, which packs a KV head's query rows into one CTA
 * (FLASHATTN_FORWARD_GQA_PACK=0: never), or on sm_100/103 when a launch
 * without cu_seqlens over MLA's latent cache (head_dim 576, head_dim_v 512,
 * v the first head_dim_v columns of k's memory with k's strides; 16-bit, no
 * softcap or ALiBi) runs on the MLA decode kernel and its plan splits the
 * keys (FLASHATTN_SM100_MLA=0: never; with one split, and always with
 * cu_seqlens_q, that kernel writes O itself: 0); else 0 (no workspace
 * needed; one given is ignored). The answer depends on rt's device (SM count) and policy
 * (FLASHATTN_SM90_PERSISTENT, FLASHATTN_SM80_PERSISTENT, FLASHATTN_FORWARD_SPLITS,
 * FLASHATTN_FORWARD_GQA_PACK, read by
 * fa_runtime_create), the config and the host fields of args (sizes,
 * layouts, which pointers are set); args' own workspace fields are not
 * read. struct_size as fa_launch's. Errors:
 * INVALID_ARGUMENT (null rt, cfg, args or bytes, struct_size, sizes,
 * strides: fa_launch's checks of them). Thread safety: any thread. Since
 * 0.8. */
FA_API fa_status fa_forward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                           const fa_forward_args *args, size_t *bytes);

/* ------------------------------------------------------------------------ */
/* Decode (Flash-Decoding) and reduce                                       */
/* ------------------------------------------------------------------------ */

typedef struct fa_decode_args {
  size_t struct_size;
  int32_t batch;          /* >= 1 */
  int32_t seqlen_q;       /* query tokens per sequence, 1..FA_MAX_SEQLEN */
  int32_t seqlen_k_max;   /* keys a sequence may hold, 1..FA_MAX_SEQLEN (the
                             contiguous cache's dim 1; PAGED: at most
                             max_pages_per_seq * page_size) */
  fa_tensor q;            /* [batch, seqlen_q, num_heads_q, head_dim] */
  fa_tensor k_cache;      /* [batch, seqlen_k_max, num_heads_kv, head_dim], or
                             as kv.layout says */
  fa_tensor v_cache;      /* [batch, seqlen_k_max, num_heads_kv, head_dim_v].
                             The same data and strides as k_cache (and,
                             PTR_ARRAY, the same v_ptrs as k_ptrs), with
                             head_dim_v <= head_dim and no k_new: V is K's
                             first head_dim_v columns (MLA's latent cache),
                             and the kernel copies K only, reading V from
                             the K tile (since 0.5) */
  uint64_t cache_seqlens; /* int32 [batch], each in [0, seqlen_k_max]: keys
                             0..cache_seqlens[b]-1 are valid; the queries are the
                             last seqlen_q positions (causal alignment) */
  int32_t num_splits;     /* >= 1, or 0 = chosen from SM count and lengths.
                             Each split covers whole key tiles, so fewer may be
                             used; fa_decode_workspace_size says how many */
  uint64_t workspace;     /* partial states, fa_decode_workspace_size bytes,
                             256-byte aligned; layout in docs/api.md */
  size_t workspace_size;
  fa_tensor o;  /* [batch, seqlen_q, num_heads_q, head_dim_v] cfg
                   dtype; data 0 = leave the partial states in the
                   workspace and skip the combine */
  uint64_t lse; /* fp32 [batch, num_heads_q, seqlen_q]; 0 = none */
  /* Since 0.3 (FA_DECODE_ARGS_SIZE_0_2 ends before them; zero = as 0.2). */
  fa_kv_cache_layout kv;   /* how k_cache and v_cache are addressed */
  int32_t batch_invariant; /* 1: splits of a fixed number of keys
                              (FA_DECODE_INVARIANT_SPLIT), so a sequence's
                              output bits do not depend on the rest of the
                              batch or its size (num_splits must be 0) */
  /* Since 0.4 (FA_DECODE_ARGS_SIZE_0_3 ends before them; zero = as 0.3). */
  uint64_t tree_mask;          /* speculative decoding (tree attention among the new
                                  tokens), or 0 = none. Bits [batch, seqlen_q, row]
                                  in rows of little-endian 32-bit words: query i of
                                  sequence b sees new token j (key cache_seqlens[b] -
                                  seqlen_q + j) iff bit j % 32 of word j / 32 of row
                                  (b, i) is set, i.e. bit j % 8 of byte
                                  tree_mask[b * tree_mask_stride[0] +
                                  i * tree_mask_stride[1] + j / 8]: the bytes of
                                  numpy.packbits(m, axis=-1, bitorder="little") of a
                                  bool [batch, seqlen_q, seqlen_q] m, each row padded
                                  to a multiple of 4 bytes. Keys before the new
                                  tokens (the cached prefix) stay visible. The
                                  config's causal and window rules still apply on top
                                  (a key is seen iff every rule allows it; windows
                                  count positions by index, not tree depth; causal
                                  leaves a tree unchanged when every token follows
                                  its ancestors, as in a topological order). Device
                                  data, 4-byte aligned; bits j >= seqlen_q ignored */
  int64_t tree_mask_stride[2]; /* bytes, multiples of 4: [0] between sequences
                                  (>= 0; 0 = one mask for the whole batch),
                                  [1] between query rows (>= 4 * ceil(seqlen_q
                                  / 32)); both 0 when tree_mask is 0 */
  /* Since 0.4.1 (FA_DECODE_ARGS_SIZE_0_4 ends before it; zero = as 0.4). */
  uint64_t sinks; /* attention sinks, as fa_forward_args.sinks (fp32
                     [num_heads_q], 4-byte aligned, or 0). They join each
                     row's denominator once, in the combine (fa_decode_reduce
                     with fa_reduce_args.sinks), never in the partial states:
                     so they need o.data != 0 */
  /* Since 0.5 (FA_DECODE_ARGS_SIZE_0_4_1 ends before them; zero = as 0.4.1). */
  uint64_t alibi_slopes;         /* ALiBi, as fa_forward_args.alibi_slopes: query
                                    i of the seqlen_q new tokens of sequence b,
                                    key j, bias -slope |i + seqlen_k - seqlen_q
                                    - j|, seqlen_k = cache_seqlens[b] (plus
                                    seqlen_new with a KV append) */
  int64_t alibi_slopes_stride;   /* as fa_forward_args.alibi_slopes_stride */
  uint64_t k_descale, v_descale; /* fp8 KV cache (fa_config_desc.kv_dtype)
                                    only: fp32 descales, 4-byte aligned, or 0
                                    = 1.0; (b, h_kv) at k_descale[b *
                                    descale_stride[0] + h_kv *
                                    descale_stride[1]] (device data). K's
                                    scales the scores, V's the output */
  int64_t descale_stride[2];     /* elements, >= 0; {0, 0} = one value per
                                    tensor (FA3's [batch, num_heads_kv]
                                    descales: {num_heads_kv, 1}) */
  /* KV append with rotary embedding, in the same launch (as FlashAttention's
   * flash_attn_with_kvcache): with k_new.data != 0, the seqlen_new new keys
   * and values of sequence b are written into the cache at positions
   * cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (any kv.layout) and
   * attended to in the same call; cache_seqlens[b] is then the length BEFORE
   * the append (clamped to [0, seqlen_k_max - seqlen_new]) and the sequence
   * has cache_seqlens[b] + seqlen_new keys. cache_seqlens itself is not
   * updated. With rotary_dim > 0, Q and the new K are rotated (RoPE) first:
   * pair (x0, x1) of columns (2i, 2i+1) (rotary_interleaved = 1, GPT-J) or
   * (i, i + rotary_dim/2) (0, GPT-NeoX) at position p becomes
   *   y0 = fma(x1, -sin, x0 cos), y1 = fma(x0, sin, x1 cos)
   * in fp32 (fma with one rounding, the products x0 cos and x1 cos rounded
   * to fp32 first), cos/sin = rotary_cos/sin[p][i], then rounded to the
   * cache dtype; columns >= rotary_dim are copied. The cache entries
   * written are exactly those bytes (docs/api.md, "KV append"). New token j
   * of sequence b is at p = cache_seqlens[b] + j, query t at
   * cache_seqlens[b] + t when causal or windowed, else at
   * cache_seqlens[b] (FlashAttention's rule); rotary_positions overrides
   * both. Needs the tensor-core decode (sm_80+). Into an fp8 cache
   * (kv_dtype): k_new/v_new stay cfg dtype and each element x (K's after
   * the rotation) is written as the byte cvt.rn.satfinite(div.rn.f32(x,
   * descale)) with the (b, h_kv) descale (beyond the largest finite: it;
   * NaN: NaN; a descale of 0 saturates, docs/api.md); sm_89+. */
  fa_tensor k_new;                 /* [batch, seqlen_new, num_heads_kv, head_dim] cfg dtype,
                                      or data 0 = no append (every field below 0) */
  fa_tensor v_new;                 /* [batch, seqlen_new, num_heads_kv, head_dim_v] */
  int32_t seqlen_new;              /* 1..seqlen_k_max with k_new */
  int32_t rotary_dim;              /* 0 = no rotary; else a multiple of 16, <= head_dim */
  uint64_t rotary_cos, rotary_sin; /* [seqlen_ro, rotary_dim / 2] contiguous,
                                      fp32 or cfg dtype (rotary_dtype),
                                      element-aligned */
  int32_t seqlen_ro;               /* rows of rotary_cos/sin, >= 1; a position
                                      past the table reads its last row (the
                                      caller provides a table that covers
                                      cache_seqlens[b] + seqlen_new) */
  int32_t rotary_interleaved;      /* 1 = GPT-J pairs (2i, 2i+1), 0 = GPT-NeoX
                                      pairs (i, i + rotary_dim / 2) */
  int32_t rotary_dtype;            /* FA_DTYPE_FP32 or the cfg dtype; 0 = FP32 */
  int32_t rotary_reserved;         /* must be 0 */
  uint64_t rotary_positions;       /* int32 [batch, max(seqlen_q, seqlen_new)]
                                      or 0: the position of query / new token
                                      t of sequence b is
                                      rotary_positions[b * rotary_positions_stride
                                      + t] (speculative trees: each token's
                                      depth); 4-byte aligned */
  int64_t rotary_positions_stride; /* elements between sequences, >= 0 */
  /* Since 0.8 (FA_DECODE_ARGS_SIZE_0_5 ends before them; zero = as 0.5).
   * The combine fused into the decode kernel (Flash-Decoding with no second
   * launch; as FlashAttention-3's zeroed tile_count_semaphore): with
   * split_counters != 0, o.data != 0 and more than one split, the last CTA
   * to finish each block of up to 16 query rows (a KV head's GQA group x
   * new tokens) combines the splits' partial states into o and lse itself,
   * with the combine's exact arithmetic (the same bits as two launches).
   * Otherwise the counters are not touched. */
  uint64_t split_counters;    /* int32 counters, 4-byte aligned device
                                 memory the caller zeroes once (cuMemsetD32
                                 after the allocation): every fa_decode
                                 leaves them zero again, so one array serves
                                 back-to-back calls and CUDA-graph replays
                                 with no memset, but not calls that may run
                                 at the same time (one per stream). At least
                                 FA_DECODE_SPLIT_COUNTERS(batch, num_heads_q,
                                 num_heads_kv, seqlen_q) of them (batch *
                                 num_heads_q * seqlen_q always suffice). Or 0
                                 = the combine runs as a second kernel.
                                 Needs o.data != 0. Counters not zero before
                                 the call give wrong results */
  size_t split_counters_size; /* bytes at split_counters; 0 when it is 0 */
} fa_decode_args;

/* struct_size of fa_decode_args in flashattn 0.2 (before kv). */
#define FA_DECODE_ARGS_SIZE_0_2 (offsetof(fa_decode_args, kv))
/* struct_size of fa_decode_args in flashattn 0.3 (before tree_mask). */
#define FA_DECODE_ARGS_SIZE_0_3 (offsetof(fa_decode_args, tree_mask))
/* struct_size of fa_decode_args in flashattn 0.4.0 (before sinks). */
#define FA_DECODE_ARGS_SIZE_0_4 (offsetof(fa_decode_args, sinks))
/* struct_size of fa_decode_args in flashattn 0.4.1 (before alibi_slopes). */
#define FA_DECODE_ARGS_SIZE_0_4_1 (offsetof(fa_decode_args, alibi_slopes))
/* struct_size of fa_decode_args in flashattn 0.5 to 0.7 (before split_counters). */
#define FA_DECODE_ARGS_SIZE_0_5 (offsetof(fa_decode_args, split_counters))
/* The int32 counters fa_decode_args.split_counters must hold: one per
 * (sequence, KV head, block of 16 packed query rows), the rows of a KV head
 * being its (num_heads_q / num_heads_kv) query heads x seqlen_q tokens. */
#define FA_DECODE_SPLIT_COUNTERS(batch, num_heads_q, num_heads_kv, seqlen_q)               \
  ((size_t)(batch) * (size_t)(num_heads_kv) *                                              \
   (((size_t)((num_heads_q) / (num_heads_kv)) * (size_t)(seqlen_q) + 15) / 16))
/* Keys per split under batch_invariant. */
#define FA_DECODE_INVARIANT_SPLIT 2048

#define FA_DECODE_ARGS_INIT                                                                      \
  {                                                                                              \
    sizeof(fa_decode_args), 0, 0, 0, FA_TENSOR_INIT, FA_TENSOR_INIT, FA_TENSOR_INIT, 0, 0, 0, 0, \
        FA_TENSOR_INIT, 0, FA_KV_CACHE_LAYOUT_INIT, 0, 0, {0, 0}, 0, 0, 0, 0, 0, {0, 0},         \
        FA_TENSOR_INIT, FA_TENSOR_INIT, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0                       \
  }

/* The workspace fa_decode needs for args (num_splits 0 resolved on rt's
 * device) and the number of splits it will use. The workspace holds
 * O_partial fp32 [num_splits, batch, seqlen_q, num_heads_q, head_dim_v] then,
 * 256-byte aligned, LSE_partial fp32 [num_splits, batch, num_heads_q,
 * seqlen_q]. Errors: INVALID_ARGUMENT; UNSUPPORTED for a workspace past
 * 2^64 bytes and for launch grids past CUDA's limits, with fa_decode's
 * message: batch > 65535 (one grid z index per sequence), num_heads_kv *
 * ceil((num_heads_q / num_heads_kv) * seqlen_q / block_m) > 65535 (grid y),
 * and, with o.data != 0, batch * seqlen_q * num_heads_q rows needing 2^31 or
 * more combine blocks. Thread safety: any thread. */
FA_API fa_status fa_decode_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                          const fa_decode_args *args, size_t *bytes,
                                          int32_t *num_splits);

/* Flash-Decoding: splits each sequence's valid keys into num_splits chunks,
 * writes each chunk's partial state (O_s normalised within the chunk, LSE_s;
 * an empty chunk has O_s = 0, LSE_s = -inf) to the workspace, then, if
 * o.data != 0, combines them into o and lse (see fa_decode_reduce). Honours
 * the config's causal, window and softcap, and tree_mask (tree attention for
 * speculative decoding, as FlashInfer's custom mask and SpecInfer's tree
 * attention: a query row with no visible key gets O = 0, LSE = -inf).
 * With sinks (gpt-oss), each row's sink joins its denominator once, in the
 * combine: the partial states in the workspace never include it. With
 * alibi_slopes, ALiBi's bias in every split's scores (the partial states
 * include it), with tree_mask, GQA (one slope per query head), every KV
 * layout and batch_invariant. With an fp32 config q, the cache and o are
 * fp32 (the partial states are fp32 whatever the dtype); a KV append
 * (k_new) with it is UNSUPPORTED.
 * With split_counters (since 0.8) and more than one split, the decode
 * kernel's last CTA of each row block combines the splits (one launch, the
 * same bits as the two; docs/kernels.md, "Fused combine"); the workspace
 * still holds the partial states.
 * struct_size may be sizeof(fa_decode_args), FA_DECODE_ARGS_SIZE_0_5,
 * FA_DECODE_ARGS_SIZE_0_4_1,
 * FA_DECODE_ARGS_SIZE_0_4, FA_DECODE_ARGS_SIZE_0_3 or FA_DECODE_ARGS_SIZE_0_2.
 * Errors: as fa_launch (alibi_slopes and alibi_slopes_stride included),
 * plus INVALID_ARGUMENT for sinks not 4-byte aligned or set with o.data 0
 * (no combine to add them: pass them to fa_decode_reduce), for a
 * workspace that is too small, a tree_mask not 4-byte aligned, a
 * tree_mask_stride not a multiple of 4, tree_mask_stride[1] < 4 *
 * ceil(seqlen_q / 32), tree_mask_stride[0] < 0, or strides set with
 * tree_mask 0; a workspace whose end passes 2^64; split_counters not
 * 4-byte aligned, set with o.data 0, or split_counters_size below 4 *
 * FA_DECODE_SPLIT_COUNTERS(...) bytes (or not 0 with split_counters 0);
 * UNSUPPORTED for the
 * grid limits of fa_decode_workspace_size (checked before any launch). */
FA_API fa_status fa_decode(fa_runtime *rt, const fa_config *cfg, const fa_decode_args *args,
                           void *stream);

typedef struct fa_reduce_args {
  size_t struct_size;
  int32_t num_splits;            /* >= 1 */
  int32_t batch;                 /* >= 1 */
  int32_t seqlen_q;              /* >= 1 */
  uint64_t o_partial;            /* fp32 [num_splits, batch, seqlen_q, num_heads_q,
                                    head_dim_v] */
  int64_t o_partial_stride[5];   /* elements; [4] must be 1 */
  uint64_t lse_partial;          /* fp32 [num_splits, batch, num_heads_q, seqlen_q] */
  int64_t lse_partial_stride[4]; /* elements */
  fa_tensor o;                   /* [batch, seqlen_q, num_heads_q, head_dim_v],
                                    cfg dtype, written */
  uint64_t lse;                  /* fp32 [batch, num_heads_q, seqlen_q]; 0 = none */
  /* Since 0.4 (FA_REDUCE_ARGS_SIZE_0_3 ends before them; zero = as 0.3). */
  int32_t lse_partial_format; /* fa_lse_format of lse_partial: FA_LSE_NATURAL
                                 (flashattn's fa_decode workspace,
                                 FlashAttention) or FA_LSE_BASE2 (FlashInfer) */
  int32_t lse_format;         /* fa_lse_format written to lse */
  /* Since 0.4.1 (FA_REDUCE_ARGS_SIZE_0_4 ends before it; zero = as 0.4). */
  uint64_t sinks; /* attention sinks, fp32 [num_heads_q] natural-log logits
                     (fa_forward_args.sinks), 4-byte aligned, or 0: sinks[h]
                     joins each row's denominator once, as one more state
                     with LSE = sinks[h] and O = 0 (in the partial states'
                     base: times log2 e for FA_LSE_BASE2), +inf and NaN
                     included (see fa_decode_reduce) */
} fa_reduce_args;

/* struct_size of fa_reduce_args in flashattn 0.3 (before lse_partial_format). */
#define FA_REDUCE_ARGS_SIZE_0_3 (offsetof(fa_reduce_args, lse_partial_format))
/* struct_size of fa_reduce_args in flashattn 0.4.0 (before sinks). */
#define FA_REDUCE_ARGS_SIZE_0_4 (offsetof(fa_reduce_args, sinks))

#define FA_REDUCE_ARGS_INIT                                                                        \
  {                                                                                                \
    sizeof(fa_reduce_args), 0, 0, 0, 0, {0, 0, 0, 0, 0}, 0, {0, 0, 0, 0}, FA_TENSOR_INIT, 0, 0, 0, \
        0                                                                                          \
  }

/* Combines partial attention states: m = max_s LSE_s, w_s = exp(LSE_s - m),
 * O = sum_s w_s O_s / sum_s w_s, LSE = m + log(sum_s w_s); states with
 * LSE_s = -inf weigh nothing, and all -inf gives O = 0, LSE = -inf. States
 * with LSE_s = +inf take all the weight, shared equally (w_s = 1 for them,
 * 0 for the others: O = their mean, LSE = +inf); a NaN LSE_s gives O = NaN,
 * LSE = NaN (NaN before +inf). Also
 * merges states computed over separate KV segments, by flashattn or by
 * another library: lse_partial_format and lse_format say whether each LSE
 * is a natural or a base-2 logarithm (the kernel converts on load and on
 * store, working in base 2: w_s = 2^(LSE2_s - m2); as FlashInfer's
 * merge_states). The o_partial and lse_partial pointers must be 4-byte
 * aligned. With sinks, m and sum_s w_s also take the term of sinks[h] (an
 * extra state with O = 0, under the same rules: a sink of +inf is a +inf
 * state with O = 0, one of NaN a NaN state): the gpt-oss sink joins the
 * denominator once however many states are merged. struct_size may be sizeof(fa_reduce_args),
 * FA_REDUCE_ARGS_SIZE_0_4 (no sinks) or FA_REDUCE_ARGS_SIZE_0_3 (natural
 * logs). Errors: as fa_launch, plus INVALID_ARGUMENT for a format that is not
 * an fa_lse_format or sinks not 4-byte aligned. */
FA_API fa_status fa_decode_reduce(fa_runtime *rt, const fa_config *cfg, const fa_reduce_args *args,
                                  void *stream);

/* ------------------------------------------------------------------------ */
/* Backward (training)                                                      */
/* ------------------------------------------------------------------------ */

/* The gradients of fa_launch's O with respect to Q, K and V (since 0.9).
 * Math (FlashAttention-2, Dao 2023, section 3.1 and Algorithm 2): with
 * P = softmax(Z) the forward's probabilities (Z the logits after scale,
 * softcap, ALiBi and masks) recomputed from Q, K and the forward's LSE,
 * dV = P^T dO, dP = dO V^T, D_i = rowsum(dO_i o O_i), dZ = P o (dP - D),
 * and back through the logit: dX = dZ softmax_scale (1 - tanh^2(X
 * softmax_scale / softcap) with softcap) for X = Q K^T, dQ = dX K,
 * dK = dX^T Q. ALiBi and masks have no gradient. With GQA/MQA, dK and dV
 * sum over the query heads of a KV head. With sinks, the sink logit's
 * gradient is dsinks[h] = -sum over the head's rows of exp(sinks[h] -
 * LSE_i) D_i. Rows that see no key get zero gradients. */
typedef struct fa_backward_args {
  size_t struct_size;
  /* The forward call's arguments as given to fa_launch (struct_size =
     sizeof(fa_forward_args); q, k, v, the sizes, cu_seqlens_q/k,
     sinks and alibi_slopes as there), with fwd.o its output O and
     fwd.lse its LSE, both required. fwd.kv.layout must be
     FA_KV_CONTIGUOUS and fwd.seqused_k 0; fwd.workspace is ignored; fp8
     configs are refused */
  fa_forward_args fwd;
  fa_tensor dout; /* dO: like fwd.o, cfg dtype */
  fa_tensor dq;   /* written: like fwd.q */
  fa_tensor dk;   /* written: like fwd.k (summed over each KV head's group) */
  fa_tensor dv;   /* written: like fwd.v */
  uint64_t dsinks; /* fp32 [num_heads_q], written, with fwd.sinks (required
                      then); else 0. 4-byte aligned */
  uint64_t workspace;    /* fa_backward_workspace_size bytes, 256-byte
                            aligned (fp32 dQ accumulators and per-row
                            statistics); contents on entry do not matter;
                            not shared by launches that may run at the same
                            time */
  size_t workspace_size; /* bytes at workspace */
  int32_t deterministic; /* 1: the same bits on every run and every batch
                            composition (dQ summed over key blocks in a
                            fixed order); 0: faster atomic accumulation */
} fa_backward_args;

#define FA_BACKWARD_ARGS_INIT                                                                     \
  {                                                                                               \
    sizeof(fa_backward_args), FA_FORWARD_ARGS_INIT, FA_TENSOR_INIT, FA_TENSOR_INIT, FA_TENSOR_INIT, \
        FA_TENSOR_INIT, 0, 0, 0, 0                                                                \
  }

/* The bytes of fa_backward_args.workspace that fa_backward uses for args
 * on rt: fp32 dQ accumulators [batch, num_heads_q, seqlen_q, head_dim] and
 * two fp32 row statistics [batch, num_heads_q, seqlen_q] (varlen: padded to
 * batch sequences of seqlen_q, the longest), each part 256-byte aligned.
 * Errors: INVALID_ARGUMENT (null rt, cfg, args or bytes; fa_backward's
 * checks but the workspace's), UNSUPPORTED (as fa_backward's, but a kernel
 * not generated yet). Thread safety: any thread. */
FA_API fa_status fa_backward_workspace_size(const fa_runtime *rt, const fa_config *cfg,
                                            const fa_backward_args *args, size_t *bytes);

/* Writes dQ, dK and dV (and dsinks) for the forward in args->fwd and the
 * upstream gradient dout, asynchronously on `stream` (emulator:
 * synchronously): a kernel for the row statistics (D and the LSE in log2
 * units), the main kernel (one CTA per key block and KV head, looping over
 * the group's query heads and the query blocks that see its keys; dK and
 * dV in registers, dQ added to fp32 accumulators), and one converting dQ.
 * Strides and alignment as fa_launch's (dout/dq/dk/dv like o/q/k/v).
 * Errors: INVALID_ARGUMENT (null, struct_size, fwd's checks as in
 * fa_launch, fwd.o or fwd.lse 0, dout/dq/dk/dv sizes, strides or spans,
 * dsinks missing with sinks or set without them, workspace not 256-byte
 * aligned or smaller than fa_backward_workspace_size, deterministic not 0
 * or 1), UNSUPPORTED (fp8 or fp32 configs, paged or pointer-array K/V,
 * seqused_k, head_dim or head_dim_v past 256, or past 128 and not a
 * multiple of 16, SMs below 8.0, batch or
 * num_heads_q past 65535, and with the note naming it, any feature a
 * kernel does not take yet), OUT_OF_MEMORY,
 * COMPILE, CUDA, LAUNCH, RUNTIME_POISONED. Nothing is written when an
 * argument is rejected. Thread safety: as fa_launch. */
FA_API fa_status fa_backward(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *args,
                             void *stream);

/* ------------------------------------------------------------------------ */
/* Kernel cache                                                             */
/* ------------------------------------------------------------------------ */

typedef struct fa_cache_stats {
  size_t struct_size;
  uint64_t memory_hits; /* launches served by the in-process kernel map */
  uint64_t disk_hits;   /* kernels loaded from the on-disk store */
  uint64_t misses;      /* kernels generated */
  uint64_t compiles;    /* PTX compilations: cuda, the plugin's or the
                           driver's JIT of a new or stale kernel; emulator,
                           the parse check of a new kernel. 0 on a warm run */
  uint64_t discarded;   /* stored blobs whose hash did not verify */
  uint64_t entries;     /* rows in the store */
  uint64_t bytes;       /* PTX + binary bytes in the store */
  int32_t persistent;   /* 1 = on disk, 0 = memory only */
  char path[512];       /* database file, "" when memory only */
  char note[256];       /* why memory only, or the last warning; "" if none */
  /* Since 0.2 (FA_CACHE_STATS_SIZE_0_1 ends before them). Counters are for
   * this runtime's store since it was opened. */
  uint64_t collisions;       /* rows with this key but another kernel's key material */
  uint64_t evicted;          /* rows deleted to stay under max_bytes */
  uint64_t resets;           /* damaged database files emptied in place */
  uint64_t leases;           /* compile leases taken... */
  uint64_t leases_reclaimed; /* ...of which from a dead or expired holder */
  uint64_t lease_waits;      /* kernels another process built while we waited */
  uint64_t lease_timeouts;   /* waits that ran out (the kernel was built here) */
  uint64_t max_bytes;        /* size cap in force (FLASHATTN_CACHE_MAX_BYTES); 0 = none */
  /* Since 0.6 (FA_CACHE_STATS_SIZE_0_5 ends before them). */
  int32_t compiler_mode;   /* fa_compiler_mode of this runtime */
  char compiler[128];      /* FA_COMPILER_PLUGIN: the plugin's compiler version
                              (what cache rows record, see fa_cache_entry);
                              FA_COMPILER_DRIVER_JIT: "driver-jit"; else "" */
  char compiler_note[256]; /* why the plugin is not used; "" when it is */
  uint64_t cubin_refusals; /* cubins the driver refused (too new, wrong SM,
                              damaged): their PTX was JIT-compiled and the row
                              rewritten */
  /* Since 0.7 (FA_CACHE_STATS_SIZE_0_6 ends before them): the second tier
   * (fa_kernel_store: fa_runtime_options.kernel_store or
   * $FLASHATTN_KERNEL_STORE). The fields above describe the local cache
   * (entries, bytes, path); disk_hits include remote_hits, and discarded
   * includes remote_discarded. All 0 / "" without a second tier. */
  uint64_t remote_hits;      /* local misses served by the kernel store (rows
                                verified, then copied into the local cache) */
  uint64_t remote_misses;    /* local misses it did not have */
  uint64_t remote_puts;      /* new rows written to it */
  uint64_t remote_errors;    /* its calls that failed (unreachable, timed out,
                                a malformed answer): each a miss or a skipped
                                write, never a failed launch */
  uint64_t remote_discarded; /* rows it returned that failed verification
                                (hashes, key, key material): removed there */
  char kernel_store[128];      /* what the second tier is: the Redis plugin's
                                  URL (no password), fa_kernel_store.name of
                                  a caller's store; "" = none */
  char kernel_store_note[256]; /* why FLASHATTN_KERNEL_STORE is not used, or
                                  the first error of the kernel store; "" if none */
} fa_cache_stats;

/* How a runtime turns PTX into machine code. */
typedef enum fa_compiler_mode {
  FA_COMPILER_NONE = 0,       /* emulator: runs the PTX itself */
  FA_COMPILER_DRIVER_JIT = 1, /* the driver JIT-compiles the stored PTX when a
                                 kernel is loaded (its compute cache may keep
                                 the machine code) */
  FA_COMPILER_PLUGIN = 2      /* the PTX compiler plugin builds a cubin on a
                                 miss; hits load the stored cubin, no JIT */
} fa_compiler_mode;

/* struct_size of fa_cache_stats in flashattn 0.1 (no counters after note). */
#define FA_CACHE_STATS_SIZE_0_1 (offsetof(fa_cache_stats, collisions))
/* struct_size of fa_cache_stats in flashattn 0.2 to 0.5 (before compiler_mode). */
#define FA_CACHE_STATS_SIZE_0_5 (offsetof(fa_cache_stats, compiler_mode))
/* struct_size of fa_cache_stats in flashattn 0.6 (before remote_hits). */
#define FA_CACHE_STATS_SIZE_0_6 (offsetof(fa_cache_stats, remote_hits))

#define FA_CACHE_STATS_INIT                                                                      \
  {                                                                                              \
    sizeof(fa_cache_stats), 0, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, \
        0, 0, 0, 0, 0, 0, {0}, {0}                                                               \
  }

/* Fills *stats. struct_size may be sizeof(fa_cache_stats),
 * FA_CACHE_STATS_SIZE_0_6, FA_CACHE_STATS_SIZE_0_5 or FA_CACHE_STATS_SIZE_0_1
 * (a caller built against an older version: only its fields are written).
 * Errors: INVALID_ARGUMENT. */
FA_API fa_status fa_cache_stats_get(fa_runtime *rt, fa_cache_stats *stats);

typedef struct fa_cache_entry {
  size_t struct_size;
  char key[33];     /* 32 hex digits of the XXH3-128 key */
  const char *spec; /* human-readable kernel spec */
  int32_t sm;
  uint32_t generator_version;
  uint64_t ptx_bytes;
  uint64_t cubin_bytes; /* the binary: a cubin (see compiler), or the PTX the
                           driver JITs whole-program (0.5 rows: always) */
  uint64_t hits;
  int64_t created;   /* unix seconds */
  int64_t last_used; /* unix seconds */
  /* Since 0.6: what built the binary: the PTX compiler plugin's version (the
   * binary is a cubin), "driver-jit" (the binary is the PTX, JIT-compiled
   * when loaded), "driver-jit (cubin of <version> refused)" (the driver
   * refused that plugin's cubin), or "" (no binary, or a row written before
   * 0.6). Valid during the call only. */
  const char *compiler;
} fa_cache_entry;

/* Calls fn once per stored kernel (entry valid during the call only); a
 * non-zero return from fn stops the walk. Errors: INVALID_ARGUMENT, CACHE. */
typedef int (*fa_cache_entry_fn)(const fa_cache_entry *entry, void *user);
FA_API fa_status fa_cache_list(fa_runtime *rt, fa_cache_entry_fn fn, void *user);

/* Deletes every stored kernel (kernels already loaded stay usable).
 * Errors: INVALID_ARGUMENT, CACHE. */
FA_API fa_status fa_cache_clear(fa_runtime *rt);

/* ------------------------------------------------------------------------ */
/* Offline cache warming (since 0.7)                                        */
/* ------------------------------------------------------------------------ */

/* Counts of an fa_cache_warm call, so far (progress) or in all (result). */
typedef struct fa_cache_warm_progress {
  size_t struct_size;
  uint64_t total;     /* distinct kernels asked for: (spec line, SM) pairs
                         that SM runs, duplicates counted once */
  uint64_t done;      /* of which finished: built + present + failed */
  uint64_t built;     /* rows written */
  uint64_t present;   /* rows already there with this compiler's binary */
  uint64_t failed;    /* kernels the compiler rejected (fa_last_error names
                         the first after the call) */
  uint64_t skipped;   /* (spec line, SM) pairs that SM cannot run (an fp8 KV
                         cache below sm_89, ...): not counted in total */
  uint64_t bytes;     /* PTX + binary bytes of the rows written */
  double seconds;     /* wall time since the call began */
  const char *spec;   /* progress: the kernel just finished, as
                         fa_cache_entry.spec; result: NULL. Valid during the
                         call only */
  int32_t sm;         /* progress: its SM; result: 0 */
  char compiler[128]; /* what built the binaries: the PTX compiler plugin's
                         version, or "" (PTX rows, JIT-compiled by the
                         device's driver on first use) */
} fa_cache_warm_progress;

/* Called on the calling thread after each kernel (never concurrently). */
typedef void (*fa_cache_warm_progress_fn)(const fa_cache_warm_progress *progress, void *user);

typedef struct fa_cache_warm_options {
  size_t struct_size;
  const char *cache_dir; /* the cache to fill, as fa_runtime_options.cache_dir
                            (NULL: the default directory); it must pass the
                            same trust checks and be writable */
  const int32_t *sms;    /* the targets: 80, 86, 87, 89, 90 (sm_90a kernels
                            where the kernel takes them), 100, 103, 110, 120,
                            121; num_sms >= 1 of them */
  int32_t num_sms;
  int32_t jobs;                       /* kernels compiled at once; 0 = the online CPUs */
  const char *presets;                /* comma-separated preset names
                                         (fa_cache_warm_presets), or NULL */
  const char *specs;                  /* kernel spec lines (cache/README.md, "Warming"), or
                                         NULL; at least one of presets and specs */
  int64_t ptx_compiler;               /* fa_ptx_compiler: AUTO builds cubins with the PTX
                                         compiler plugin (fa_runtime_options.ptx_compiler
                                         explains where it is looked for) and writes PTX
                                         rows when there is none; OFF writes PTX rows */
  fa_cache_warm_progress_fn progress; /* or NULL */
  void *user;                         /* passed to progress */
} fa_cache_warm_options;

#define FA_CACHE_WARM_OPTIONS_INIT \
  { sizeof(fa_cache_warm_options), NULL, NULL, 0, 0, NULL, NULL, 0, NULL, NULL }

/* Fills a kernel cache, on a machine without a GPU or driver, with the rows a
 * runtime on each target SM would build for the kernels the presets and spec
 * lines name: the same keys, the generated PTX and, with the PTX compiler
 * plugin, a whole-program cubin for the exact target (sm_90a for the sm_90
 * wgmma forward, else sm_NN). A runtime on such a GPU then loads them with 0
 * compiles (fa_cache_stats.compiles); with the same plugin version, or with
 * none (the driver JIT mode loads any plugin's cubin as it is). Rows already
 * current are left alone; kernels a target cannot run are skipped and
 * counted. The kernel choice follows this process's environment, as a
 * runtime's does (FLASHATTN_SCALAR_FORWARD and the like): warm with the
 * serving processes' settings. *result (struct_size set by the caller) gets
 * the counts; it may be NULL. Errors: INVALID_ARGUMENT (struct_size, no sms,
 * jobs < 0, an unknown preset, a spec line that does not parse or that
 * fa_config_create / fa_generate_for refuse: the message names the line and
 * the key), UNSUPPORTED (an sm not listed), CACHE (the directory or file
 * cannot be used, or is read-only: nothing written), COMPILE (some kernels
 * failed to compile: the others are written, result.failed counts them and
 * the message names the first). Thread safety: any thread; several
 * processes may warm one cache at once. */
FA_API fa_status fa_cache_warm(const fa_cache_warm_options *options,
                               fa_cache_warm_progress *result);

/* The built-in presets, one per line: "<name>: <description>" (models people
 * serve: Llama 3, Qwen, Mistral, Gemma 2 / 3, gpt-oss, DeepSeek MLA). Static
 * text; never NULL. */
FA_API const char *fa_cache_warm_presets(void);

/* The spec lines of preset `name` (static text), or NULL with
 * fa_last_error naming the presets when there is no such preset. */
FA_API const char *fa_cache_warm_preset(const char *name);

/* ------------------------------------------------------------------------ */
/* Kernel store (since 0.7): a second tier below the local cache            */
/* ------------------------------------------------------------------------ */

/* One kernel row as the library hands it to a kernel store (put) and as the
 * store hands it back (the found callback of get). Every pointer is valid
 * during the call only: whoever receives a record copies what it keeps.
 * Byte arrays may hold any bytes (no terminator); NULL is allowed for size
 * 0. Strings are NUL-terminated UTF-8; NULL reads as "". */
typedef struct fa_store_record {
  size_t struct_size;            /* sizeof(fa_store_record) */
  char key[33];                  /* 32 lowercase hex digits of the XXH3-128 key
                                    (the hash of key_material, high half first) */
  const uint8_t *key_material;   /* the exact bytes hashed into key (the kernel
                                    spec, generator version and source hash, SM,
                                    PTX ISA); the library checks that they hash
                                    to key and equal the ones it asked for */
  size_t key_material_size;      /* bytes */
  const char *spec;              /* human-readable kernel spec (fa_cache_entry.spec) */
  int32_t sm;                    /* target SM (80, 90, ...) */
  uint32_t generator_version;    /* generator version of the PTX */
  int32_t driver_version;        /* CUDA driver the binary was built or last
                                    loaded with (1000 * major + 10 * minor); 0 if none */
  const char *compiler;          /* what built cubin (fa_cache_entry.compiler) */
  const uint8_t *ptx;            /* PTX text (no terminator) */
  size_t ptx_size;               /* bytes, > 0 */
  const uint8_t *cubin;          /* the binary: a cubin, the PTX and a NUL for
                                    the driver's JIT, or nothing (emulator) */
  size_t cubin_size;             /* bytes, may be 0 */
  uint8_t ptx_hash[16];          /* XXH3-128 of ptx, canonical (big-endian) */
  uint8_t cubin_hash[16];        /* XXH3-128 of cubin (of no bytes when empty) */
} fa_store_record;

/* What the callbacks of fa_kernel_store return. */
typedef enum fa_store_result {
  FA_STORE_OK = 0,        /* get: found was called with the row; put, remove: done */
  FA_STORE_NOT_FOUND = 1, /* get: no row under that key (remove: also fine) */
  FA_STORE_ERROR = 2,     /* the store could not answer: unreachable, timed
                             out, out of memory, ... (a miss; counted in
                             fa_cache_stats.remote_errors) */
  FA_STORE_DAMAGED = 3    /* get: a row exists but cannot be decoded: counted
                             in remote_discarded and removed, like a row whose
                             hash does not verify */
} fa_store_result;

/* Called by a store's get, at most once, with the row found; the library
 * copies what it needs before it returns. */
typedef void (*fa_store_found_fn)(void *found_ctx, const fa_store_record *record);

/* A caller's kernel store: a shared second tier (a fleet's Redis, an object
 * store, ...) behind the local cache. Rows are code this process will run:
 * the library verifies each one it reads (key = XXH3-128 of the row's key
 * material, that key material = the kernel's, and the XXH3-128 hashes of
 * ptx and cubin) and discards a row that fails (remove, counted in
 * fa_cache_stats.remote_discarded). The hashes catch damage, not an attacker
 * who can write the store: whoever can write rows can run code on the GPU
 * (cache/README.md, "Remote tier").
 *
 * Threads: the callbacks may be called from any thread that calls into a
 * runtime using the store, concurrently (several runtimes may share one), so
 * they must be thread-safe. Time: a launch that misses the local cache waits
 * for get, and put runs after the kernel is built, so each call should
 * return within about a second (the Redis plugin: 200 ms to connect, 500 ms
 * per command); the library cannot interrupt it. A callback must not call
 * into flashattn with the runtime it serves, and no C++ exception may leave
 * it. Errors are never fatal: a failed get is a miss and a failed put is
 * skipped, counted in remote_errors, with one warning per runtime. */
typedef struct fa_kernel_store {
  size_t struct_size; /* sizeof(fa_kernel_store) */
  void *user;         /* passed to every callback */
  const char *name;   /* for fa_cache_stats.kernel_store (copied; keep
                         secrets out of it); NULL = "caller's kernel store" */
  /* Looks up key (32 hex digits; key_material as in fa_store_record, the
   * bytes the row must carry). On a hit it calls found(found_ctx, &row)
   * once, with row.struct_size = sizeof(fa_store_record), before returning
   * FA_STORE_OK. Returns an fa_store_result. Required. */
  int (*get)(void *user, const char *key, const uint8_t *key_material, size_t key_material_size,
             fa_store_found_fn found, void *found_ctx);
  /* Inserts or replaces the row under record->key (all fields filled by
   * the library, hashes included; store them as they are). Returns
   * FA_STORE_OK or FA_STORE_ERROR. Required. */
  int (*put)(void *user, const fa_store_record *record);
  /* Deletes the row under key (one that failed verification). Returns
   * FA_STORE_OK, FA_STORE_NOT_FOUND or FA_STORE_ERROR. May be NULL (bad
   * rows then stay, and are discarded again by each reader). */
  int (*remove)(void *user, const char *key);
  /* Called once when the runtime is destroyed (fa_runtime_destroy), after
   * the last other callback; not when fa_runtime_create fails. May be NULL.
   * A store shared by several runtimes gets one call per runtime. */
  void (*destroy)(void *user);
} fa_kernel_store;

/* ------------------------------------------------------------------------ */
/* Emulator memory profile (since 0.3)                                      */
/* ------------------------------------------------------------------------ */

/* Memory traffic of a set of instructions, counted per warp instruction the
 * way the GPU issues it (model and sources: docs/emulator.md, "Memory
 * counters"). Counts, except where a unit is given. */
typedef struct fa_emu_mem_counters {
  uint64_t global_load_requests; /* warp-level ld.global and cp.async executions
                                    that read global memory */
  uint64_t global_load_sectors;  /* 32-byte sectors they touched */
  uint64_t global_load_bytes;    /* bytes they used (distinct per request);
                                    efficiency = bytes / (32 * sectors) */
  uint64_t cp_async_requests;    /* the cp.async part of the three above (how
                                    flashattn's kernels load K/V tiles) */
  uint64_t cp_async_sectors;
  uint64_t cp_async_bytes;
  uint64_t global_store_requests; /* warp-level st.global executions */
  uint64_t global_store_sectors;  /* 32-byte sectors they touched */
  uint64_t global_store_bytes;    /* bytes written (distinct per request) */
  uint64_t shared_requests;       /* warp-level ld.shared, st.shared, ldmatrix
                                     and cp.async (its shared-memory side) */
  uint64_t shared_wavefronts;     /* shared-memory wavefronts they took */
  uint64_t shared_bank_conflicts; /* wavefronts beyond the minimum each request
                                     needs (one per 128-byte phase) */
} fa_emu_mem_counters;

typedef struct fa_emu_profile {
  size_t struct_size;
  char kernel[128];              /* entry name of the launch */
  fa_emu_mem_counters total;     /* the whole kernel */
  fa_emu_mem_counters main_loop; /* the main loop's instructions only */
  uint32_t main_loop_first_line; /* PTX lines (1-based) the main loop spans:
                                    the innermost loops holding mma.sync
                                    (none: those holding global loads);
                                    0 = no loop found */
  uint32_t main_loop_last_line;
  uint32_t main_loop_worst_conflict_line; /* main-loop instruction with the most
                                             bank conflicts; 0 = none */
  uint32_t main_loop_worst_sector_line;   /* main-loop global access wasting the
                                             most sector bytes; 0 = none */
} fa_emu_profile;

#define FA_EMU_PROFILE_INIT                                            \
  {                                                                    \
    sizeof(fa_emu_profile), {0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, \
        {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0               \
  }

/* Fills *out (whose struct_size the caller sets to sizeof(fa_emu_profile))
 * with the memory counters of the most recent kernel launch on rt. Counters
 * exist only for launches made while the environment variable
 * FLASHATTN_EMU_PROFILE=1 is set (read at each launch; it also prints a
 * table per launch to stderr); profiling slows the emulator. fa_decode with
 * o.data != 0 launches the decode kernel, then the combine: the counters are
 * the combine's (o.data = 0, or the combine fused in with split_counters,
 * leaves the decode kernel's).
 * Errors: INVALID_ARGUMENT (null, struct_size), UNSUPPORTED (rt is not an
 * emulator runtime, or its most recent launch was not profiled, faulted, or
 * there was none). Thread safety: any thread; "most recent" is per runtime. */
FA_API fa_status fa_emulator_profile(fa_runtime *rt, fa_emu_profile *out);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
