#include "runtime/runtime.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/ptx_compiler.h"
#include "cache/remote_store.h"
#include "common/error.h"

#ifndef FA_GENERATOR_HASH
#error "FA_GENERATOR_HASH must be defined by the build (CMakeLists.txt)"
#endif

namespace fa {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

void append_u32(std::string *s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Fills the head counts, resolved window edges and score scaling that
// ForwardParams and DecodeParams share (same field names). A window edge is
// resolved against the launch's largest seqlen_q / seqlen_k: window_left >=
// seqlen_k - 1 or window_right >= seqlen_q - 1 already reaches every key, so
// wider windows (and -1) become exactly those values. The kernels' range
// arithmetic (diag - window_left, diag + window_right + 1 with |diag| <
// seqlen <= FA_MAX_SEQLEN) then stays inside int32 for any window.
template <typename Params>
void set_masking_and_scale(const AttentionConfig &cfg, int32_t seqlen_q, int32_t seqlen_k,
                           Params *p) {
  const int32_t wl_max = std::max(seqlen_k - 1, 0), wr_max = std::max(seqlen_q - 1, 0);
  p->num_heads_q = cfg.num_heads_q;
  p->num_heads_kv = cfg.num_heads_kv;
  p->window_left = cfg.window_left < 0 ? wl_max : std::min(cfg.window_left, wl_max);
  p->window_right =
      cfg.causal ? 0 : (cfg.window_right < 0 ? wr_max : std::min(cfg.window_right, wr_max));
  if (cfg.softcap > 0) {
    p->score_scale = cfg.softmax_scale / cfg.softcap;
    p->softcap_log2 = cfg.softcap * kLog2e;
    p->softcap_neg2 = -2.0f * kLog2e * p->score_scale;
  } else {
    p->score_scale = cfg.softmax_scale * kLog2e;
    p->softcap_log2 = 0;
    p->softcap_neg2 = 0;
  }
}

void copy_strides(int64_t dst[3], const fa_tensor &t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride[i];
}

// CUDA's grid limits (CUDA C Programming Guide, "Technical Specifications
// per Compute Capability"): x < 2^31, y and z <= 65535.
bool geometry_ok(const LaunchGeometry &g) {
  for (int i = 0; i < 3; ++i) {
    if (g.grid[i] == 0) return false;
  }
  return g.grid[0] <= uint32_t(INT32_MAX) && g.grid[1] <= 65535 && g.grid[2] <= 65535;
}

fa_status launch_checked(Backend &backend, Kernel &kernel, const LaunchGeometry &g,
                         const void *params, size_t size, void *stream) {
  if (!geometry_ok(g)) {
    return fail(FA_ERROR_UNSUPPORTED, "launch grid (%u, %u, %u) exceeds the device limits",
                g.grid[0], g.grid[1], g.grid[2]);
  }
  return backend.launch(kernel, g, params, size, stream);
}

}  // namespace

fa_status decode_too_large() {
  return fail(FA_ERROR_UNSUPPORTED,
              "decode workspace too large: num_splits * batch * seqlen_q * num_heads_q * "
              "head_dim_v * 4 bytes overflows 64 bits");
}

fa_status check_fp8_kv(const AttentionConfig &cfg, const KernelSpec &spec) {
  if (cfg.kv_fp8 == KvFp8::None || spec.kind == KernelKind::Reduce) return FA_SUCCESS;
  if (cfg.q_fp8 != KvFp8::None && spec.kind == KernelKind::Decode) {
    return fail(FA_ERROR_UNSUPPORTED,
                "an fp8 Q (q_dtype) is for fa_launch (the fp8 forward); fa_decode takes a "
                "16-bit Q over an fp8 KV cache (a config with q_dtype 0)");
  }
  if (spec.kind == KernelKind::Forward && cfg.q_fp8 == KvFp8::None) {
    return fail(FA_ERROR_UNSUPPORTED,
                "an fp8 KV cache (kv_dtype) with a 16-bit Q runs in fa_decode only (chunked "
                "prefill over an fp8 cache: fa_decode with seqlen_q > 1); fa_launch takes fp8 "
                "K/V with an fp8 Q (q_dtype, the fp8 forward)");
  }
  if (spec.kind == KernelKind::Forward && spec.sm < 89) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the fp8 forward (q_dtype) needs sm_89 or newer (mma.sync m16n8k32 with "
                "e4m3/e5m2), the device is sm_%d",
                spec.sm);
  }
  if (spec.kind == KernelKind::Forward && spec.q_fp8 != cfg.q_fp8) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the fp8 forward (q_dtype) runs in the tensor-core forward kernel only, not "
                "the scalar one (FLASHATTN_SCALAR_FORWARD)");
  }
  if (spec.sm < 89) {
    return fail(FA_ERROR_UNSUPPORTED,
                "an fp8 KV cache (kv_dtype) needs sm_89 or newer (cvt.rn.f16x2.e4m3x2 / "
                "e5m2x2), the device is sm_%d",
                spec.sm);
  }
  if (spec.kv_fp8 != cfg.kv_fp8) {
    return fail(FA_ERROR_UNSUPPORTED,
                "an fp8 KV cache (kv_dtype) runs in the tensor-core decode kernel only, not the "
                "scalar one (FLASHATTN_SCALAR_DECODE)");
  }
  return FA_SUCCESS;
}

fa_status check_head_dims(const AttentionConfig &cfg, const KernelSpec &spec) {
  if (spec.kind != KernelKind::Reduce && !spec.mma && (cfg.head_dim > 256 || cfg.head_dim_v > 256))
    return fail(FA_ERROR_UNSUPPORTED,
                "head_dim %d / head_dim_v %d (past 256) need the tensor-core kernels (sm_80+, "
                "not FLASHATTN_SCALAR_FORWARD=1 or FLASHATTN_SCALAR_DECODE=1); the device is "
                "sm_%d",
                cfg.head_dim, cfg.head_dim_v, spec.sm);
  return FA_SUCCESS;
}

fa_status check_fp32(const AttentionConfig &cfg, const KernelSpec &spec) {
  if (cfg.dtype != Dtype::F32 || spec.kind == KernelKind::Reduce) return FA_SUCCESS;
  if (spec.kind == KernelKind::Decode && spec.append_kv) {
    return fail(FA_ERROR_UNSUPPORTED,
                "a KV append (k_new) with fp32 Q/K/V (dtype FA_DTYPE_FP32) is not supported yet; "
                "write the new keys into the cache first");
  }
  if (spec.kind == KernelKind::Forward && cfg.head_dim > 384) {
    return fail(FA_ERROR_UNSUPPORTED,
                "fp32 Q/K/V/O (dtype FA_DTYPE_FP32) take head_dim up to 384 in fa_launch "
                "(the forward's fp32 loads spill past it), got %d",
                cfg.head_dim);
  }
  if (!spec.mma || spec.wgmma) {
    return fail(FA_ERROR_UNSUPPORTED,
                "fp32 Q/K/V/O (dtype FA_DTYPE_FP32) need the tensor-core kernels (sm_80+, not "
                "FLASHATTN_SCALAR_FORWARD=1 or FLASHATTN_SCALAR_DECODE=1); the device is sm_%d",
                spec.sm);
  }
  return FA_SUCCESS;
}

std::string kernel_key_material(const KernelSpec &spec, uint32_t generator_version) {
  std::string bytes = spec.serialize();
  append_u32(&bytes, generator_version);
  bytes += FA_GENERATOR_HASH;  // hash of the generator sources (CMakeLists.txt)
  append_u32(&bytes, static_cast<uint32_t>(spec.sm));
  append_u32(&bytes, static_cast<uint32_t>(ptx_isa_version(spec)));
  return bytes;
}

cache::Key key_of_material(const std::string &material) { return cache::key_of_bytes(material); }

// Warns about every line of a JIT info log that ptxas means as a warning:
// spills, local memory, "warning"/"advisory" lines. Register counts and
// other informational lines stay quiet.
static void surface_jit_log(const std::string &spec_text, const std::string &log) {
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    std::string lower = line;
    for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool spills =
        lower.find("spill") != std::string::npos &&
        lower.find(" 0 bytes spill stores, 0 bytes spill loads") == std::string::npos;
    if (spills || lower.find("warning") != std::string::npos ||
        lower.find("advisory") != std::string::npos) {
      warn("ptxas (" + spec_text + "): " + line);
    }
    start = end + 1;
  }
}

cache::Record new_record(const KernelSpec &spec, const std::string &material) {
  cache::Record rec;
  rec.ptx = generate_ptx(spec);
  rec.spec_text = spec.describe();
  rec.generator_version = kGeneratorVersion;
  rec.sm = spec.sm;
  rec.key_material = material;
  return rec;
}

cache::Key kernel_key(const KernelSpec &spec) { return key_of_material(kernel_key_material(spec)); }

std::string refused_by_driver(const std::string &plugin_version) {
  return std::string(ptxc::kDriverJit) + " (cubin of " + plugin_version + " refused)";
}

bool binary_current(const cache::Record &rec, const CompilerInfo &compiler, int driver) {
  const bool cubin = ptxc::is_cubin(rec.cubin);
  const bool own_ptx = rec.cubin.size() == rec.ptx.size() + 1 && rec.cubin.back() == 0 &&
                       std::memcmp(rec.cubin.data(), rec.ptx.data(), rec.ptx.size()) == 0;
  if (compiler.mode == FA_COMPILER_PLUGIN) {
    // This plugin's cubin; or the PTX, for this driver, after the driver
    // refused this plugin's cubin (a newer driver gets the cubin again).
    return (cubin && rec.compiler == compiler.version) ||
           (own_ptx && rec.driver_version == driver &&
            rec.compiler == refused_by_driver(compiler.version));
  }
  // Driver JIT: the PTX the driver compiles whole-program, for this driver
  // (a binary is valid only for the driver that built it); or a cubin some
  // plugin built (machine code: no JIT; a refusal falls back to the PTX).
  // An ELF row without a plugin's name is an older library's cuLink cubin
  // (relocatable code, slower): rebuilt.
  const bool plugin_cubin =
      cubin && !rec.compiler.empty() &&
      rec.compiler.compare(0, std::strlen(ptxc::kDriverJit), ptxc::kDriverJit) != 0;
  return plugin_cubin || (own_ptx && rec.driver_version == driver);
}

void Runtime::note_compile(const std::string &spec_text, const std::string &log) {
  surface_jit_log(spec_text, log);
  jit_logs_[spec_text] = log;
}

fa_status Runtime::ensure_binary(const KernelSpec &spec, cache::Record *rec, bool *dirty) {
  const CompilerInfo compiler = backend_->compiler();
  const int driver = backend_->info().driver_version;
  if (binary_current(*rec, compiler, driver)) return FA_SUCCESS;
  std::string log, used;
  std::vector<uint8_t> binary;
  fa_status st = backend_->compile(rec->ptx, &binary, &log, CompileWith::kBest, &used);
  if (st != FA_SUCCESS) return st;
  counters_.compiles++;
  note_compile(rec->spec_text, log);
  rec->cubin = std::move(binary);
  rec->compiler = used;
  rec->driver_version = driver;
  rec->key_material = kernel_key_material(spec);
  *dirty = true;
  return FA_SUCCESS;
}

fa_status Runtime::create(const fa_runtime_options &options, std::unique_ptr<Runtime> *out) {
  auto rt = std::make_unique<Runtime>();
  rt->policy_ = KernelPolicy::from_env();
  fa_backend which = options.backend;
  if (which == FA_BACKEND_AUTO) {
    // FLASHATTN_BACKEND=cuda|emulator overrides auto (handy for tests and CI).
    const char *env = std::getenv("FLASHATTN_BACKEND");
    if (env && std::strcmp(env, "cuda") == 0) which = FA_BACKEND_CUDA;
    if (env && std::strcmp(env, "emulator") == 0) which = FA_BACKEND_EMULATOR;
  }
  // FLASHATTN_EMU_SM picks the emulator's SM when the options leave it 0:
  // the whole value a decimal number, one of the SMs published_limits
  // knows. A sign, space or suffix is refused, not read past ("90abc" and
  // "90a" are not 90; sm 90 already runs the sm_90a kernels).
  int emu_sm = options.emulator_sm ? options.emulator_sm : 80;
  if (options.emulator_sm == 0) {
    if (const char *env = std::getenv("FLASHATTN_EMU_SM"); env && env[0]) {
      int sm = 0;
      bool decimal = true;
      for (const char *c = env; *c && decimal; ++c) {
        decimal = *c >= '0' && *c <= '9';
        sm = std::min(sm * 10 + (*c - '0'), 1000000);  // saturates: no SM, no overflow
      }
      if (!decimal) {
        return fail(FA_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_EMU_SM=%s is not a decimal SM number (80, 86, 87, 89, 90, 100, "
                    "103, 110, 120 or 121; 90 runs the sm_90a kernels)",
                    env);
      }
      DeviceLimits lim;
      if (!published_limits(sm, &lim))
        return fail(FA_ERROR_UNSUPPORTED, "FLASHATTN_EMU_SM=%s is not a supported SM", env);
      emu_sm = sm;
    }
  }
  const bool ptx_compiler = options.ptx_compiler != FA_PTX_COMPILER_OFF;
  fa_status st;
  if (which == FA_BACKEND_CUDA) {
    st = create_cuda_backend(options.device, ptx_compiler, &rt->backend_);
  } else if (which == FA_BACKEND_EMULATOR) {
    st = create_emulator_backend(emu_sm, &rt->backend_);
  } else {
    st = create_cuda_backend(options.device, ptx_compiler, &rt->backend_);
    if (st == FA_ERROR_NO_DRIVER || st == FA_ERROR_NO_DEVICE) {
      st = create_emulator_backend(emu_sm, &rt->backend_);
    }
  }
  if (st != FA_SUCCESS) return st;

  cache::Options copts;
  if (options.cache_dir) copts.dir = options.cache_dir;
  copts.memory_only = options.cache_mode == FA_CACHE_MEMORY;
  rt->store_ = cache::open_store(copts);
  if (!rt->store_) return fail(FA_ERROR_INTERNAL, "kernel store could not be created");
  // The second tier (options.kernel_store, else $FLASHATTN_KERNEL_STORE).
  rt->store_ = cache::add_kernel_store(std::move(rt->store_), options.kernel_store);
  *out = std::move(rt);
  return FA_SUCCESS;
}

fa_status Runtime::get_kernel(const KernelSpec &spec, Kernel **out) {
  const std::string material = kernel_key_material(spec);
  const cache::Key key = key_of_material(material);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kernels_.find({key.hi, key.lo});
  if (it != kernels_.end()) {
    counters_.memory_hits++;
    *out = it->second.get();
    return FA_SUCCESS;
  }

  const bool wants_binary = backend_->kind() == FA_BACKEND_CUDA;
  // The key material already pins SM and generator version; the field checks
  // only guard against a row forged with matching material.
  auto usable = [&](const cache::Record &r) {
    return !r.ptx.empty() && r.sm == spec.sm && r.generator_version == kGeneratorVersion;
  };
  cache::Record rec;
  bool have = store_->get(key, material, &rec) && usable(rec);
  // A miss: take the compile lease, so one process builds while the others
  // wait for its row. Whatever the lease says, the launch goes on.
  struct LeaseGuard {
    cache::Store *store = nullptr;
    cache::Key key;
    ~LeaseGuard() {
      if (store) store->release_lease(key);
    }
  } lease;
  if (!have) {
    rec = cache::Record();
    const cache::LeaseResult lr = store_->acquire_lease(key, material, &rec);
    if (lr == cache::LeaseResult::kFound) have = usable(rec);
    if (lr == cache::LeaseResult::kAcquired) {
      lease.store = store_.get();
      lease.key = key;
    }
  }
  bool dirty = false;
  if (have) {
    counters_.disk_hits++;
  } else {
    counters_.misses++;
    rec = new_record(spec, material);
    if (rec.ptx.empty()) {
      return fail(FA_ERROR_INTERNAL, "generator produced no PTX for %s", spec.describe().c_str());
    }
    dirty = true;
  }
  if (wants_binary) {
    if (fa_status st = ensure_binary(spec, &rec, &dirty); st != FA_SUCCESS) return st;
  } else if (dirty) {
    std::vector<uint8_t> none;
    std::string log;
    fa_status st = backend_->compile(rec.ptx, &none, &log);  // emulator: parse check
    if (st != FA_SUCCESS) return st;
    counters_.compiles++;
  }
  std::unique_ptr<Kernel> kernel;
  fa_status st = backend_->load(rec.ptx, wants_binary ? rec.cubin : std::vector<uint8_t>(),
                                entry_name(spec), max_dynamic_smem(spec), &kernel);
  if (st == FA_ERROR_COMPILE && ptxc::is_cubin(rec.cubin)) {
    // The driver refused the cubin (too new for it, another SM, damaged):
    // the PTX is JIT-compiled instead and the row rewritten, so that this
    // driver is not handed that cubin again.
    counters_.cubin_refusals++;
    warn("the driver refused the cubin of " + rec.spec_text + " (built by " +
         (rec.compiler.empty() ? std::string("an older flashattn") : rec.compiler) +
         "): " + last_error() + "; JIT-compiling its PTX and rewriting the row");
    clear_error();
    std::string log;
    std::vector<uint8_t> binary;
    st = backend_->compile(rec.ptx, &binary, &log, CompileWith::kDriverJit, nullptr);
    if (st != FA_SUCCESS) return st;
    counters_.compiles++;
    note_compile(rec.spec_text, log);
    const CompilerInfo ci = backend_->compiler();
    rec.compiler = ci.mode == FA_COMPILER_PLUGIN ? refused_by_driver(ci.version) : ptxc::kDriverJit;
    rec.cubin = std::move(binary);
    rec.driver_version = backend_->info().driver_version;
    rec.key_material = material;
    dirty = true;
    st = backend_->load(rec.ptx, rec.cubin, entry_name(spec), max_dynamic_smem(spec), &kernel);
  }
  if (st != FA_SUCCESS) return st;
  // The emulator never replaces a row that may hold another process's cubin.
  // put() also drops the lease, in the same transaction as the row.
  if (dirty) store_->put(key, rec);
  *out = kernel.get();
  kernels_[{key.hi, key.lo}] = std::move(kernel);
  return FA_SUCCESS;
}

// The KV layout a launch's arguments ask for, as kernels see it.
static LaunchShape kv_shape(const fa_kv_cache_layout &kv) {
  LaunchShape s;
  s.kv_layout = static_cast<KvLayout>(kv.layout);
  s.page_size = kv.page_size;
  return s;
}

static KvPages kv_pages(const fa_kv_cache_layout &kv) {
  KvPages p;
  std::memset(&p, 0, sizeof p);
  if (kv.layout == FA_KV_PAGED) {
    p.block_table = kv.block_table;
    p.block_table_stride = kv.block_table_stride;
    p.page_size = kv.page_size;
    while ((int64_t(1) << p.page_shift) < kv.page_size) ++p.page_shift;
    if ((int64_t(1) << p.page_shift) != kv.page_size) p.page_shift = 0;
  } else if (kv.layout == FA_KV_PTR_ARRAY) {
    p.k_ptrs = kv.k_ptrs;
    p.v_ptrs = kv.v_ptrs;
  }
  return p;
}

// The parameters of a forward (fa_launch's, or the forward a backward
// differentiates) from its arguments: tensors, sizes, KV layout, sinks,
// ALiBi, resolved windows and scales; the tensor-core steps
// (set_forward_steps) and any tail are the caller's.
static ForwardParams forward_params(const AttentionConfig &cfg, const fa_forward_args &a) {
  ForwardParams p;
  std::memset(&p, 0, sizeof p);
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.o.data;
  p.lse = a.lse;
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.cu_seqlens_k = a.cu_seqlens_k;
  copy_strides(p.q_stride, a.q);
  copy_strides(p.k_stride, a.k);
  copy_strides(p.v_stride, a.v);
  copy_strides(p.o_stride, a.o);
  p.batch = a.batch;
  p.seqlen_q = a.seqlen_q;
  p.seqlen_k = a.seqlen_k;
  p.kv = kv_pages(a.kv);
  p.seqused_k = a.seqused_k;
  p.sinks = a.sinks;
  p.alibi_slopes = a.alibi_slopes;
  p.alibi_slopes_stride = a.alibi_slopes_stride;
  set_masking_and_scale(cfg, a.seqlen_q, a.seqlen_k, &p);
  return p;
}

KernelSpec Runtime::decode_spec(const AttentionConfig &cfg, const fa_decode_args &a,
                                uint64_t cu_seqlens_q, bool fused, bool direct) const {
  LaunchShape shape = kv_shape(a.kv);
  shape.varlen = cu_seqlens_q != 0;
  shape.tree_mask = a.tree_mask != 0;
  shape.alibi = a.alibi_slopes != 0;
  shape.append_kv = a.k_new.data != 0;
  shape.fixed_len = a.cache_seqlens == 0;  // forward_as_decode's (fa_decode requires them)
  shape.fused_combine = fused;
  shape.direct_out = direct;
  // only the fused combine's or the direct output's (else the reduce kernel's)
  shape.sinks = (fused || direct) && a.sinks != 0;
  shape.rotary = a.rotary_dim == 0 ? 0 : a.rotary_interleaved ? 2 : 1;
  shape.rotary_half_table = shape.rotary && a.rotary_dtype != 0 && a.rotary_dtype != FA_DTYPE_FP32;
  // V the first head_dim_v columns of K (MLA's latent cache): the same
  // memory, strides and, for pointer arrays, the same pointer array.
  shape.v_in_k = a.v_cache.data == a.k_cache.data &&
                 std::equal(a.v_cache.stride, a.v_cache.stride + 4, a.k_cache.stride) &&
                 (a.kv.layout != FA_KV_PTR_ARRAY || a.kv.v_ptrs == a.kv.k_ptrs);
  return make_spec(cfg, KernelKind::Decode, backend_->info().limits, shape, policy());
}

// Whether TMA can address a [batch, seq, heads, d] tensor of eb-byte
// values (2, or 1 for fp8): a 16-byte aligned base and strides of whole
// 16-byte units (cuTensorMapEncodeTiled), below 2^40 bytes.
static bool tma_addressable(const fa_tensor &t, int eb) {
  if (t.data % 16 != 0 || t.stride[3] != 1) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.stride[i] <= 0 || t.stride[i] % (16 / eb) != 0 || t.stride[i] >= (int64_t(1) << 40) / eb)
      return false;
  }
  return true;
}

// The tensor map of a [batch, rows, heads, cols] tensor in the boxes the
// sm_90a and sm_100a forwards read (wgmma_tma_box: 16-bit values, or fp8
// bytes).
static TensorMapDesc tile_map(const fa_tensor &t, bool bf16, int rows, int heads, int cols,
                              int batch, const TmaBox &box) {
  TensorMapDesc d;
  d.rank = 4;
  const uint64_t eb = box.elem_bytes;
  d.elem_bytes = box.elem_bytes;
  d.bf16 = bf16 && eb == 2;
  d.base = t.data;
  const uint64_t dims[4] = {uint64_t(cols), uint64_t(rows), uint64_t(heads), uint64_t(batch)};
  const uint64_t strides[4] = {eb, uint64_t(t.stride[1]) * eb, uint64_t(t.stride[2]) * eb,
                               uint64_t(t.stride[0]) * eb};
  const uint32_t boxes[4] = {box.box_cols, box.box_rows, 1, 1};
  for (int i = 0; i < 4; ++i) {
    d.dims[i] = dims[i];
    d.strides[i] = strides[i];
    d.box[i] = boxes[i];
  }
  d.swizzle = box.swizzle_128b ? 3 : 0;
  return d;
}

fa_status Runtime::encode_qkv_maps(const KernelSpec &spec, const AttentionConfig &cfg,
                                   const fa_forward_args &a, uint8_t *tq, uint8_t *tk,
                                   uint8_t *tv) const {
  const bool bf16 = cfg.dtype == Dtype::BF16;
  auto encode = [&](TmaOperand which, const fa_tensor &t, int rows, int heads, int cols,
                    uint8_t *out) {
    return backend_->encode_tensor_map(
        tile_map(t, bf16, rows, heads, cols, a.batch, wgmma_tma_box(spec, which)), out);
  };
  fa_status s = encode(TmaOperand::Q, a.q, a.seqlen_q, cfg.num_heads_q, cfg.head_dim, tq);
  if (s == FA_SUCCESS)
    s = encode(TmaOperand::K, a.k, a.seqlen_k, cfg.num_heads_kv, cfg.head_dim, tk);
  if (s == FA_SUCCESS)
    s = encode(TmaOperand::V, a.v, a.seqlen_k, cfg.num_heads_kv, cfg.head_dim_v, tv);
  return s;
}

static LaunchShape forward_shape(const AttentionConfig &cfg, const fa_forward_args &a) {
  LaunchShape shape = kv_shape(a.kv);
  shape.varlen = a.cu_seqlens_q != 0;
  shape.seqused_k = a.seqused_k != 0;
  shape.sinks = a.sinks != 0;
  shape.alibi = a.alibi_slopes != 0;
  const int qb = cfg.q_fp8 != KvFp8::None ? 1 : 2, kvb = cfg.kv_fp8 != KvFp8::None ? 1 : 2;
  shape.tma_ok = tma_addressable(a.q, qb) && tma_addressable(a.k, kvb) && tma_addressable(a.v, kvb);
  return shape;
}

KernelSpec Runtime::forward_spec(const AttentionConfig &cfg, const fa_forward_args &a,
                                 const LaunchShape &shape) const {
  KernelSpec spec = make_spec(cfg, KernelKind::Forward, backend_->info().limits, shape, policy());
  const int64_t items =
      (int64_t(a.seqlen_q) + spec.block_m - 1) / spec.block_m * cfg.num_heads_q * a.batch;
  if (spec.persistent && items > INT32_MAX) {
    // The persistent kernel numbers its work items in 32 bits.
    KernelPolicy one_per_item = policy();
    one_per_item.sm90_persistent = one_per_item.sm80_persistent = false;
    spec = make_spec(cfg, KernelKind::Forward, backend_->info().limits, shape, one_per_item);
  }
  spec.dynamic = spec.persistent && a.workspace != 0;
  return spec;
}

size_t Runtime::forward_workspace_bytes(const AttentionConfig &cfg,
                                        const fa_forward_args &a) const {
  fa_decode_args d;
  bool mla = false;
  if (forward_as_decode(cfg, a, &d, &mla)) {
    const DecodePlan plan = plan_decode(cfg, d, a.cu_seqlens_q);
    // The MLA kernel with one split writes O itself (decode's direct form).
    if (mla && (plan.num_splits <= 1 || plan.too_large || a.cu_seqlens_q != 0)) return 0;
    if (!plan.too_large) return 256 + plan.workspace_bytes;
  }
  const LaunchShape shape = forward_shape(cfg, a);
  const KernelSpec spec = forward_spec(cfg, a, shape);
  if (spec.persistent) return 8;
  ForwardSplitPlan plan;
  forward_split_spec(cfg, a, shape, spec, &plan);
  return plan.workspace_bytes;
}

bool Runtime::forward_as_decode(const AttentionConfig &cfg, const fa_forward_args &a,
                                fa_decode_args *d, bool *mla) const {
  *mla = false;
  const int group = cfg.num_heads_kv > 0 ? cfg.num_heads_q / cfg.num_heads_kv : 1;
  const bool few = policy().forward_gqa_pack && group >= 2 && int64_t(group) * a.seqlen_q <= 16;
  // MLA's shapes with V in K's memory (decode_spec decides whether the MLA
  // kernel takes them).
  const bool latent = mla_decode_dims(cfg.head_dim, cfg.head_dim_v) && a.v.data == a.k.data;
  if (!(few || latent) || a.cu_seqlens_k != 0 || cfg.q_fp8 != KvFp8::None ||
      cfg.kv_fp8 != KvFp8::None)
    return false;
  std::memset(d, 0, sizeof *d);
  d->struct_size = sizeof *d;
  d->batch = a.batch;
  d->seqlen_q = a.seqlen_q;
  d->seqlen_k_max = a.seqlen_k;
  d->q = a.q;
  d->k_cache = a.k;
  d->v_cache = a.v;
  d->cache_seqlens = a.seqused_k;  // 0: seqlen_k keys each (decode_seqlen)
  d->o = a.o;
  d->lse = a.lse;
  d->kv = a.kv;
  d->sinks = a.sinks;
  d->alibi_slopes = a.alibi_slopes;
  d->alibi_slopes_stride = a.alibi_slopes_stride;
  if (a.workspace != 0 && a.workspace_size >= 256) {
    d->workspace = a.workspace + 256;
    d->workspace_size = a.workspace_size - 256;
  }
  // The sm_100a MLA kernel (its one-split form takes cu_seqlens_q too), at
  // any seqlen_q whose grid fits (y: KV heads x 64-row blocks <= 65535).
  if (latent) {
    const KernelSpec m = decode_spec(cfg, *d, a.cu_seqlens_q, false, true);
    if (m.tcgen05 && m.kind == KernelKind::Decode &&
        int64_t(cfg.num_heads_kv) * ((int64_t(group) * a.seqlen_q + m.block_m - 1) / m.block_m) <=
            65535) {
      *mla = true;
      return true;
    }
  }
  // The tensor-core decode (the scalar one packs no rows; with
  // cu_seqlens_q, its varlen form).
  const KernelSpec spec = decode_spec(cfg, *d, a.cu_seqlens_q);
  return few && spec.mma && spec.varlen == (a.cu_seqlens_q != 0);
}

KernelSpec Runtime::forward_split_spec(const AttentionConfig &cfg, const fa_forward_args &a,
                                       const LaunchShape &shape, const KernelSpec &unsplit,
                                       ForwardSplitPlan *plan) const {
  *plan = plan_forward_split(cfg, a, unsplit);
  if (plan->num_splits <= 1) return unsplit;
  LaunchShape split_shape = shape;
  split_shape.split_kv = true;
  split_shape.sinks = false;  // in the combine
  const KernelSpec spec = forward_spec(cfg, a, split_shape);
  *plan = plan_forward_split(cfg, a, spec);
  return plan->num_splits > 1 ? spec : unsplit;
}

fa_status Runtime::forward(const AttentionConfig &cfg, const fa_forward_args &a, void *stream) {
  // Few queries over a KV cache: the decode kernel packs a KV head's query
  // rows (forward_as_decode), given room for its partial states.
  fa_decode_args d;
  bool mla = false;
  if (forward_as_decode(cfg, a, &d, &mla)) {
    const DecodePlan plan = plan_decode(cfg, d, a.cu_seqlens_q);
    const bool room = !plan.too_large && d.workspace != 0 && d.workspace % 256 == 0 &&
                      d.workspace_size >= plan.workspace_bytes;
    // MLA: one split writing O where the plan has one or the workspace
    // holds no more (the kernel's direct form), else the splits and combine.
    if (mla && (plan.num_splits <= 1 || !room || a.cu_seqlens_q != 0)) {
      counters_.forwards_as_decode.fetch_add(1, std::memory_order_relaxed);
      d.num_splits = 1;
      d.batch_invariant = 0;
      return decode(cfg, d, stream, a.cu_seqlens_q, true);
    }
    if (room) {
      counters_.forwards_as_decode.fetch_add(1, std::memory_order_relaxed);
      return decode(cfg, d, stream, a.cu_seqlens_q);
    }
  }
  LaunchShape shape = forward_shape(cfg, a);
  KernelSpec spec = forward_spec(cfg, a, shape);
  if (fa_status st = check_fp8_kv(cfg, spec); st != FA_SUCCESS) return st;
  if (fa_status st = check_fp32(cfg, spec); st != FA_SUCCESS) return st;
  if (fa_status st = check_head_dims(cfg, spec); st != FA_SUCCESS) return st;
  WgmmaParams wp;
  std::memset(&wp, 0, sizeof wp);
  if ((spec.wgmma || spec.tcgen05) && !spec.gather) {
    // TMA descriptors of Q, K, V (host only). A map the backend cannot make
    // (a rule of cuTensorMapEncodeTiled this check does not know, a driver
    // without it) sends the launch to the gather variant instead.
    const fa_status s3 = encode_qkv_maps(spec, cfg, a, wp.tmap_q, wp.tmap_k, wp.tmap_v);
    if (s3 != FA_SUCCESS) {
      clear_error();
      shape.tma_ok = false;
      spec = forward_spec(cfg, a, shape);
    }
  }
  // Split-KV when the caller's workspace holds the plan's partial states
  // (256-byte aligned); sinks join in the combine.
  ForwardSplitPlan split;
  const KernelSpec split_spec = forward_split_spec(cfg, a, shape, spec, &split);
  const bool splitting =
      split.num_splits > 1 && a.workspace % 256 == 0 && a.workspace_size >= split.workspace_bytes;
  Kernel *reduce_kernel = nullptr;
  KernelSpec rspec;
  if (splitting) {
    spec = split_spec;
    if (fa_status st =
            combine_kernel(cfg, a.sinks != 0, a.cu_seqlens_q != 0, &reduce_kernel, &rspec);
        st != FA_SUCCESS)
      return st;
  }
  ForwardParams p = forward_params(cfg, a);
  Kernel *kernel = nullptr;
  fa_status st = get_kernel(spec, &kernel);
  if (st != FA_SUCCESS) return st;
  set_forward_steps(spec, &p);
  // The persistent grid: one CTA per SM for the sm_90a kernel (it holds a
  // whole SM's registers), min_ctas per SM for the mma.sync one (its
  // occupancy target), or a test's smaller one.
  const int64_t ctas = policy().persistent_grid > 0
                           ? policy().persistent_grid
                           : int64_t(std::max(backend_->info().num_sms, 1)) *
                                 (spec.wgmma ? 1 : std::max(spec.min_ctas, 1));
  const LaunchGeometry geom = forward_geometry(spec, p, ctas, split.num_splits);
  Fp8Descales ds;  // the fp8 forward's (spec.q_fp8)
  ds.q_descale = a.q_descale;
  ds.k_descale = a.k_descale;
  ds.v_descale = a.v_descale;
  ds.descale_stride[0] = a.descale_stride[0];
  ds.descale_stride[1] = a.descale_stride[1];
  ForwardTail tail;  // spec.dynamic or spec.split_kv
  std::memset(&tail, 0, sizeof tail);
  tail.workspace = a.workspace;
  if (splitting) {
    tail.o_partial = a.workspace + split.o_offset;
    tail.lse_partial = a.workspace + split.lse_offset;
    tail.num_splits = split.num_splits;
    tail.split_size = split.split_size;
  }
  const bool has_tail = spec.dynamic || spec.split_kv;
  // Each block without its tail is what the kernel reads when it has none.
  fa_status st2;
  if (spec.wgmma || spec.tcgen05) {
    wp.f = p;
    if (spec.q_fp8 != KvFp8::None) {  // the gather variant (fp8 converted on load)
      WgmmaFp8TailParams fw;
      std::memset(&fw, 0, sizeof fw);
      fw.w.w = wp;
      fw.w.d = ds;
      fw.t = tail;
      st2 =
          launch_checked(*backend_, *kernel, geom, &fw, has_tail ? sizeof fw : sizeof fw.w, stream);
    } else {
      WgmmaTailParams wt;
      std::memset(&wt, 0, sizeof wt);
      wt.w = wp;
      wt.t = tail;
      st2 =
          launch_checked(*backend_, *kernel, geom, &wt, has_tail ? sizeof wt : sizeof wt.w, stream);
    }
  } else if (spec.q_fp8 != KvFp8::None) {
    Fp8ForwardTailParams ft;
    std::memset(&ft, 0, sizeof ft);
    ft.f.f = p;
    ft.f.d = ds;
    ft.t = tail;
    st2 = launch_checked(*backend_, *kernel, geom, &ft, has_tail ? sizeof ft : sizeof ft.f, stream);
  } else {
    ForwardTailParams pt;
    std::memset(&pt, 0, sizeof pt);
    pt.f = p;
    pt.t = tail;
    st2 = launch_checked(*backend_, *kernel, geom, &pt, has_tail ? sizeof pt : sizeof pt.f, stream);
  }
  if (st2 != FA_SUCCESS || !splitting) return st2;
  return combine(*reduce_kernel, rspec, cfg, tail.o_partial, tail.lse_partial, split.num_splits,
                 a.batch, a.seqlen_q, a.o, a.lse, a.sinks, a.cu_seqlens_q, stream);
}

// The bytes of split launches' partial states: O_partial fp32 [splits,
// batch, seqlen_q, heads_q, head_dim_v] and LSE_partial fp32 [splits,
// batch, heads_q, seqlen_q]; false when a product overflows 64 bits or O's
// passes 2^62 (the API's int32 sizes allow far more than 2^64 bytes).
static bool partial_bytes(const AttentionConfig &cfg, int64_t splits, int64_t batch,
                          int64_t seqlen_q, uint64_t *o_bytes, uint64_t *lse_bytes) {
  uint64_t rows = 0;
  return !__builtin_mul_overflow(uint64_t(batch) * uint64_t(seqlen_q), uint64_t(cfg.num_heads_q),
                                 &rows) &&
         !__builtin_mul_overflow(rows, uint64_t(splits), &rows) &&
         !__builtin_mul_overflow(rows, uint64_t(cfg.head_dim_v) * sizeof(float), o_bytes) &&
         !__builtin_mul_overflow(rows, uint64_t(sizeof(float)), lse_bytes) &&
         *o_bytes <= (uint64_t(1) << 62);
}

// How many ways to split a forward's keys (FlashAttention-3's rule): none
// once its CTAs fill 80% of the SMs (one CTA per SM) or with fewer than 8
// key tiles; else the fewest splits (each of at least 4 tiles, at most 128)
// whose waves are at least 85% as full as the best count's, the fullness
// of w = ctas x splits / SMs waves being w / ceil(w).
static int forward_num_splits(int64_t ctas, int num_sms, int64_t key_tiles) {
  if (ctas <= 0 || num_sms <= 0 || 10 * ctas >= 8LL * num_sms || key_tiles < 8) return 1;
  const int64_t most = std::min<int64_t>({key_tiles / 4, 128, num_sms});
  auto fullness = [&](int64_t s) {
    const double w = double(ctas * s) / num_sms;
    return w / std::ceil(w);
  };
  double best = 0;
  for (int64_t s = 1; s <= most; ++s) best = std::max(best, fullness(s));
  for (int64_t s = 1; s <= most; ++s)
    if (fullness(s) >= 0.85 * best) return static_cast<int>(s);
  return 1;
}

ForwardSplitPlan Runtime::plan_forward_split(const AttentionConfig &cfg, const fa_forward_args &a,
                                             const KernelSpec &spec) const {
  ForwardSplitPlan plan;
  // The tensor-core forwards (not the scalar one); the mma.sync one holds
  // min_ctas CTAs per SM, each O column slice a CTA of its own.
  if (!policy().forward_splits || !spec.mma || spec.persistent || spec.block_n <= 0) return plan;
  const int64_t block_n = spec.block_n, sk = a.seqlen_k;
  const int64_t ctas = (int64_t(a.seqlen_q) + spec.block_m - 1) / spec.block_m * cfg.num_heads_q *
                       a.batch * spec.dv_split;
  const int per_sm = spec.wgmma ? 1 : std::max(spec.min_ctas, 1);
  const int splits =
      forward_num_splits(ctas, backend_->info().num_sms * per_sm, (sk + block_n - 1) / block_n);
  if (splits <= 1) return plan;
  const int64_t size = ((sk + splits - 1) / splits + block_n - 1) / block_n * block_n;
  const int n = static_cast<int>((sk + size - 1) / size);
  uint64_t o_bytes = 0, lse_bytes = 0, total = 0;
  if (n <= 1 || !partial_bytes(cfg, n, a.batch, a.seqlen_q, &o_bytes, &lse_bytes) ||
      __builtin_add_overflow(256 + round_up(o_bytes, 256), lse_bytes, &total) ||
      total > uint64_t(SIZE_MAX))
    return plan;
  plan.num_splits = n;
  plan.split_size = static_cast<int>(size);
  plan.o_offset = 256;
  plan.lse_offset = 256 + round_up(o_bytes, 256);
  plan.workspace_bytes = static_cast<size_t>(total);
  return plan;
}

int decode_num_splits(int64_t ctas, int64_t key_tiles, int num_sms, int ctas_per_sm) {
  if (ctas <= 0 || num_sms <= 0 || ctas >= num_sms) return 1;
  const int64_t slots = int64_t(num_sms) * std::max(ctas_per_sm, 1);
  const int64_t most = std::clamp<int64_t>(key_tiles / kDecodeMinSplitTiles, 1, 128);
  const int64_t every_sm = (num_sms + ctas - 1) / ctas, one_wave = slots / ctas;
  return static_cast<int>(std::min(most, std::max(every_sm, one_wave)));
}

DecodePlan Runtime::plan_decode(const AttentionConfig &cfg, const fa_decode_args &a,
                                uint64_t cu_seqlens_q) const {
  const KernelSpec spec = decode_spec(cfg, a, cu_seqlens_q);
  // 64-bit throughout: the API bounds the sizes (check_decode_limits), but
  // the arithmetic must not overflow on the way.
  const int64_t block_n = std::max(spec.block_n, 1);
  const int64_t block_m = std::max(spec.block_m, 1);
  const int64_t sk = a.seqlen_k_max;
  const int64_t rows = int64_t(spec.group_size) * a.seqlen_q;
  const long long ctas = static_cast<long long>(a.batch) * cfg.num_heads_kv *
                         ((rows + block_m - 1) / block_m) *
                         spec.dv_split;  // O's column slices are CTAs too
  int64_t splits = a.num_splits;
  if (a.batch_invariant) {
    // Splits of FA_DECODE_INVARIANT_SPLIT keys whatever the batch: a
    // sequence's partial states, and so its output bits, depend only on it
    // (empty splits weigh exactly 0 in the reduce).
    splits = (sk + FA_DECODE_INVARIANT_SPLIT - 1) / FA_DECODE_INVARIANT_SPLIT;
  } else if (splits <= 0) {
    // Flash-Decoding from the real work (decode_num_splits' model).
    splits = decode_num_splits(ctas, (sk + block_n - 1) / block_n, backend_->info().num_sms,
                               spec.mma ? spec.min_ctas : 1);
  }
  splits = std::max<int64_t>(std::min(splits, (sk + block_n - 1) / block_n), 1);
  DecodePlan plan;
  int64_t split_size = (((sk + splits - 1) / splits) + block_n - 1) / block_n * block_n;
  if (a.batch_invariant) split_size = FA_DECODE_INVARIANT_SPLIT;  // a multiple of every block_n
  plan.split_size = static_cast<int>(split_size);
  plan.num_splits = static_cast<int>((sk + split_size - 1) / split_size);
  uint64_t o_bytes = 0, lse_bytes = 0, total = 0;
  const bool overflow =
      !partial_bytes(cfg, plan.num_splits, a.batch, a.seqlen_q, &o_bytes, &lse_bytes) ||
      __builtin_add_overflow(round_up(o_bytes, 256), lse_bytes, &total) ||
      total > uint64_t(SIZE_MAX);
  if (overflow) {
    plan.too_large = true;
    return plan;
  }
  plan.o_partial_bytes = static_cast<size_t>(o_bytes);
  plan.lse_offset = round_up(plan.o_partial_bytes, 256);
  plan.workspace_bytes = static_cast<size_t>(total);
  return plan;
}

bool Runtime::decode_fuses(const AttentionConfig &cfg, const fa_decode_args &a,
                           const DecodePlan &plan, uint64_t cu_seqlens_q) const {
  if (a.split_counters == 0 || a.o.data == 0 || plan.num_splits <= 1 || !policy().decode_fused)
    return false;
  return decode_spec(cfg, a, cu_seqlens_q, true).fused_combine;
}

fa_status Runtime::decode(const AttentionConfig &cfg, const fa_decode_args &a, void *stream,
                          uint64_t cu_seqlens_q, bool direct) {
  const KernelSpec unfused = decode_spec(cfg, a, cu_seqlens_q, false, direct);
  if (fa_status st = check_fp32(cfg, unfused); st != FA_SUCCESS) return st;
  if (fa_status st = check_head_dims(cfg, unfused); st != FA_SUCCESS) return st;
  const DecodePlan plan = plan_decode(cfg, a, cu_seqlens_q);
  if (direct && (!unfused.direct_out || plan.num_splits != 1 || a.o.data == 0))
    return fail(FA_ERROR_INTERNAL, "decode: no one-split kernel writing O for this launch");
  if (plan.too_large && !direct) return decode_too_large();
  const bool fused = !direct && decode_fuses(cfg, a, plan, cu_seqlens_q);
  const KernelSpec spec = fused ? decode_spec(cfg, a, cu_seqlens_q, true) : unfused;
  if (!direct && a.workspace_size < plan.workspace_bytes) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "workspace_size is %zu bytes, %zu needed for %d splits "
                "(see fa_decode_workspace_size)",
                a.workspace_size, plan.workspace_bytes, plan.num_splits);
  }
  if (spec.append_kv && !spec.mma) {
    return fail(FA_ERROR_UNSUPPORTED,
                "KV append (k_new) needs the tensor-core decode kernel (sm_80+, not "
                "FLASHATTN_SCALAR_DECODE=1)");
  }
  fa_status st = check_fp8_kv(cfg, spec);
  if (st != FA_SUCCESS) return st;
  Kernel *kernel = nullptr;
  st = get_kernel(spec, &kernel);
  if (st != FA_SUCCESS) return st;
  Kernel *reduce_kernel = nullptr;
  KernelSpec rspec;
  if (a.o.data != 0 && !fused && !direct) {
    st = combine_kernel(cfg, a.sinks != 0, cu_seqlens_q != 0, &reduce_kernel, &rspec);
    if (st != FA_SUCCESS) return st;
  }

  DecodeParams p;
  std::memset(&p, 0, sizeof p);
  p.q = a.q.data;
  p.k = a.k_cache.data;
  p.v = a.v_cache.data;
  p.cache_seqlens = a.cache_seqlens;
  p.cu_seqlens_q = cu_seqlens_q;
  p.o_partial = a.workspace;
  p.lse_partial = a.workspace + plan.lse_offset;
  copy_strides(p.q_stride, a.q);
  copy_strides(p.k_stride, a.k_cache);
  copy_strides(p.v_stride, a.v_cache);
  p.batch = a.batch;
  p.seqlen_q = a.seqlen_q;
  p.seqlen_k_max = a.seqlen_k_max;
  p.num_splits = plan.num_splits;
  p.split_size = plan.split_size;
  p.kv = kv_pages(a.kv);
  p.tree_mask = a.tree_mask;
  p.tree_mask_stride[0] = a.tree_mask_stride[0];
  p.tree_mask_stride[1] = a.tree_mask_stride[1];
  p.alibi_slopes = a.alibi_slopes;
  p.alibi_slopes_stride = a.alibi_slopes_stride;
  p.k_descale = a.k_descale;
  p.v_descale = a.v_descale;
  p.descale_stride[0] = a.descale_stride[0];
  p.descale_stride[1] = a.descale_stride[1];
  if (spec.append_kv) {
    p.k_new = a.k_new.data;
    p.v_new = a.v_new.data;
    copy_strides(p.k_new_stride, a.k_new);
    copy_strides(p.v_new_stride, a.v_new);
    p.seqlen_new = a.seqlen_new;
    p.rotary_dim = a.rotary_dim;
    p.rotary_cos = a.rotary_cos;
    p.rotary_sin = a.rotary_sin;
    p.seqlen_ro = a.seqlen_ro;
    p.rotary_positions = a.rotary_positions;
    p.rotary_positions_stride = a.rotary_positions_stride;
    // Queries at cache_seqlens + t when causal or windowed, else all at
    // cache_seqlens (FlashAttention's flash_attn_with_kvcache).
    p.rotary_pos_causal = cfg.causal || cfg.window_left >= 0 || cfg.window_right >= 0 ? 1 : 0;
  }
  if (direct) {  // no partial state: O and the LSE by the kernel
    p.o_partial = 0;
    p.lse_partial = 0;
  }
  if (fused || direct) {
    p.split_counters = fused ? a.split_counters : 0;
    p.o = a.o.data;
    copy_strides(p.o_stride, a.o);
    p.lse = a.lse;
    p.sinks = a.sinks;
  }
  set_masking_and_scale(cfg, a.seqlen_q, a.seqlen_k_max, &p);
  st = launch_checked(*backend_, *kernel, decode_geometry(spec, p), &p, sizeof p, stream);
  if (st != FA_SUCCESS || a.o.data == 0 || fused || direct) return st;
  return combine(*reduce_kernel, rspec, cfg, p.o_partial, p.lse_partial, plan.num_splits, a.batch,
                 a.seqlen_q, a.o, a.lse, a.sinks, cu_seqlens_q, stream);
}

fa_status Runtime::combine_kernel(const AttentionConfig &cfg, bool sinks, bool varlen,
                                  Kernel **kernel, KernelSpec *spec) {
  LaunchShape rshape;
  rshape.sinks = sinks;
  rshape.varlen = varlen;
  *spec = make_spec(cfg, KernelKind::Reduce, backend_->info().limits, rshape, policy());
  return get_kernel(*spec, kernel);
}

fa_status Runtime::combine(Kernel &kernel, const KernelSpec &spec, const AttentionConfig &cfg,
                           uint64_t o_partial, uint64_t lse_partial, int num_splits, int batch,
                           int seqlen_q, const fa_tensor &o, uint64_t lse, uint64_t sinks,
                           uint64_t cu_seqlens_q, void *stream) {
  ReduceParams r;
  std::memset(&r, 0, sizeof r);
  const int64_t hq = cfg.num_heads_q, dv = cfg.head_dim_v, sq = seqlen_q;
  r.o_partial = o_partial;
  r.lse_partial = lse_partial;
  r.o = o.data;
  r.lse = lse;
  r.o_partial_stride[4] = 1;
  r.o_partial_stride[3] = dv;
  r.o_partial_stride[2] = hq * dv;
  r.o_partial_stride[1] = sq * hq * dv;
  r.o_partial_stride[0] = batch * sq * hq * dv;
  r.lse_partial_stride[3] = 1;
  r.lse_partial_stride[2] = sq;
  r.lse_partial_stride[1] = hq * sq;
  r.lse_partial_stride[0] = batch * hq * sq;
  copy_strides(r.o_stride, o);
  r.num_splits = num_splits;
  r.batch = batch;
  r.seqlen_q = seqlen_q;
  r.num_heads_q = cfg.num_heads_q;
  r.sinks = sinks;
  r.cu_seqlens_q = cu_seqlens_q;
  return launch_checked(*backend_, kernel, reduce_geometry(spec, r), &r, sizeof r, stream);
}

fa_status Runtime::reduce(const AttentionConfig &cfg, const fa_reduce_args &a, void *stream) {
  LaunchShape shape;
  shape.lse_in_base2 = a.lse_partial_format == FA_LSE_BASE2;
  shape.lse_out_base2 = a.lse_format == FA_LSE_BASE2;
  shape.sinks = a.sinks != 0;
  const KernelSpec spec =
      make_spec(cfg, KernelKind::Reduce, backend_->info().limits, shape, policy());
  Kernel *kernel = nullptr;
  fa_status st = get_kernel(spec, &kernel);
  if (st != FA_SUCCESS) return st;
  ReduceParams r;
  std::memset(&r, 0, sizeof r);
  r.o_partial = a.o_partial;
  r.lse_partial = a.lse_partial;
  r.o = a.o.data;
  r.lse = a.lse;
  for (int i = 0; i < 5; ++i) r.o_partial_stride[i] = a.o_partial_stride[i];
  for (int i = 0; i < 4; ++i) r.lse_partial_stride[i] = a.lse_partial_stride[i];
  copy_strides(r.o_stride, a.o);
  r.num_splits = a.num_splits;
  r.batch = a.batch;
  r.seqlen_q = a.seqlen_q;
  r.num_heads_q = cfg.num_heads_q;
  r.sinks = a.sinks;
  return launch_checked(*backend_, *kernel, reduce_geometry(spec, r), &r, sizeof r, stream);
}

BackwardPlan plan_backward(const AttentionConfig &cfg, const fa_backward_args &a) {
  BackwardPlan plan;
  uint64_t rows = 0, dq_bytes = 0, stats_bytes = 0, total = 0, sems = 0;
  // deterministic: a u32 per (batch, head, kSemRows rows, column slice).
  const uint64_t blocks = (uint64_t(a.fwd.seqlen_q) + kSemRows - 1) / kSemRows;
  if (__builtin_mul_overflow(uint64_t(a.fwd.batch) * uint64_t(a.fwd.seqlen_q),
                             uint64_t(cfg.num_heads_q), &rows) ||
      __builtin_mul_overflow(rows, uint64_t(cfg.head_dim) * sizeof(float), &dq_bytes) ||
      __builtin_mul_overflow(rows, 2 * sizeof(float), &stats_bytes) ||
      dq_bytes > (uint64_t(1) << 62) ||
      __builtin_add_overflow(round_up(dq_bytes, 256), stats_bytes, &total) ||
      total > (uint64_t(1) << 62) ||
      __builtin_mul_overflow(uint64_t(a.fwd.batch) * uint64_t(cfg.num_heads_q),
                             blocks * 4 * kSemSlices, &sems) ||
      (a.deterministic && __builtin_add_overflow(round_up(total, 256), sems, &total)) ||
      total > uint64_t(SIZE_MAX) || total > uint64_t(INT64_MAX)) {
    plan.too_large = true;
    return plan;
  }
  plan.rows = static_cast<int64_t>(rows);
  plan.row_stats_offset = round_up(dq_bytes, 256);
  if (a.deterministic) plan.sem_offset = round_up(plan.row_stats_offset + stats_bytes, 256);
  plan.workspace_bytes = static_cast<size_t>(total);
  return plan;
}

fa_status check_backward(const AttentionConfig &cfg, int sm) {
  if (cfg.kv_fp8 != KvFp8::None || cfg.q_fp8 != KvFp8::None) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the backward takes fp16 or bf16 Q/K/V; fp8 configs (kv_dtype, q_dtype) are "
                "forward-only");
  }
  if (cfg.dtype == Dtype::F32) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the backward takes fp16 or bf16 Q/K/V/O (dtype FA_DTYPE_FP32 is not supported)");
  }
  if (cfg.head_dim > 256 || cfg.head_dim_v > 256 ||
      ((cfg.head_dim > 128 || cfg.head_dim_v > 128) &&
       (cfg.head_dim % 16 != 0 || cfg.head_dim_v % 16 != 0))) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the backward takes head_dim and head_dim_v up to 128, and past 128 multiples of "
                "16 up to 256, got %d and %d",
                cfg.head_dim, cfg.head_dim_v);
  }
  if (sm < 80) {
    return fail(FA_ERROR_UNSUPPORTED,
                "the backward needs sm_80 or newer (mma.sync), the device is sm_%d", sm);
  }
  return FA_SUCCESS;
}

LaunchShape backward_shape(const fa_backward_args &a) {
  LaunchShape shape;
  shape.varlen = a.fwd.cu_seqlens_q != 0;
  shape.sinks = a.fwd.sinks != 0;
  shape.alibi = a.fwd.alibi_slopes != 0;
  // The sm_90a main kernel reads Q, K, V and dO by TMA.
  shape.tma_ok = tma_addressable(a.fwd.q, 2) && tma_addressable(a.fwd.k, 2) &&
                 tma_addressable(a.fwd.v, 2) && tma_addressable(a.dout, 2);
  return shape;
}

KernelSpec backward_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                         const LaunchShape &shape, const KernelPolicy &policy) {
  KernelSpec s = make_spec(cfg, kind, dev, shape, policy);
  if (kind != KernelKind::Backward) {
    // The per-row kernels read no softcap, ALiBi, GQA group or tile (and
    // BackwardPre no sinks): one kernel serves all such configs.
    s.softcap = s.alibi = false;
    s.group_size = 1;
    s.block_m = 64;
    if (kind == KernelKind::BackwardPre) s.sinks = false;
  }
  return s;
}

KernelSpec Runtime::backward_spec(const AttentionConfig &cfg, const fa_backward_args &a,
                                  KernelKind kind) const {
  return fa::backward_spec(cfg, kind, backend_->info().limits, backward_shape(a), policy());
}

size_t Runtime::backward_workspace_bytes(const AttentionConfig &cfg,
                                         const fa_backward_args &a) const {
  const BackwardPlan plan = plan_backward(cfg, a);
  return plan.too_large ? 0 : plan.workspace_bytes;
}

fa_status Runtime::backward(const AttentionConfig &cfg, const fa_backward_args &a, void *stream,
                            unsigned kernels) {
  if (fa_status st = check_backward(cfg, backend_->info().limits.sm); st != FA_SUCCESS) return st;
  const BackwardPlan plan = plan_backward(cfg, a);
  if (plan.too_large) {
    return fail(FA_ERROR_UNSUPPORTED,
                "backward workspace too large: batch * seqlen_q * num_heads_q * (head_dim + 2) * "
                "4 bytes overflows 64 bits");
  }
  if (a.workspace_size < plan.workspace_bytes) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "workspace_size is %zu bytes, %zu needed (see fa_backward_workspace_size)",
                a.workspace_size, plan.workspace_bytes);
  }
  // Every kernel before the first launch: a missing one writes nothing.
  const KernelKind kinds[3] = {KernelKind::BackwardPre, KernelKind::Backward,
                               KernelKind::BackwardPost};
  const unsigned bits[3] = {kBackwardPre, kBackwardMain, kBackwardPost};
  const char *names[3] = {"row statistics (BackwardPre)", "main (Backward)", "dQ (BackwardPost)"};
  const char *sources[3] = {"src/kernels/backward_rows.cc",
                            "src/kernels/backward_tc.cc or backward_wgmma.cc",
                            "src/kernels/backward_rows.cc"};
  KernelSpec specs[3];
  Kernel *ks[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (!(kernels & bits[i])) continue;
    specs[i] = backward_spec(cfg, a, kinds[i]);
    fa_status st = get_kernel(specs[i], &ks[i]);
    if (st == FA_ERROR_INTERNAL && generate_ptx(specs[i]).empty()) {
      // No generator takes the spec (check_backward refused every config
      // it knows no kernel for): a kernel still being written.
      return fail(FA_ERROR_UNSUPPORTED, "the backward's %s kernel is not generated for %s (%s)",
                  names[i], specs[i].describe().c_str(), sources[i]);
    }
    if (st != FA_SUCCESS) return st;
  }
  BackwardParams p;
  std::memset(&p, 0, sizeof p);
  p.f = forward_params(cfg, a.fwd);
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  copy_strides(p.dout_stride, a.dout);
  copy_strides(p.dq_stride, a.dq);
  copy_strides(p.dk_stride, a.dk);
  copy_strides(p.dv_stride, a.dv);
  p.dq_accum = a.workspace;
  p.row_stats = a.workspace + plan.row_stats_offset;
  p.dsinks = a.dsinks;
  p.softmax_scale = cfg.softmax_scale;
  p.deterministic = a.deterministic;
  if (a.deterministic) p.dq_sem = a.workspace + plan.sem_offset;
  // The sm_90a main kernel's block: the parameters, then the tensor maps of
  // Q, dO (block_m rows), K and V (block_n rows). A map the backend cannot
  // make sends the launch to its gather variant (cp.async).
  BackwardWgmmaParams wp;
  std::memset(&wp, 0, sizeof wp);
  if (ks[1] && specs[1].wgmma && !specs[1].gather) {
    fa_status s3 = encode_qkv_maps(specs[1], cfg, a.fwd, wp.tmap_q, wp.tmap_k, wp.tmap_v);
    if (s3 == FA_SUCCESS)  // dO: Q's shape (head_dim_v columns) and box
      s3 = backend_->encode_tensor_map(
          tile_map(a.dout, cfg.dtype == Dtype::BF16, a.fwd.seqlen_q, cfg.num_heads_q,
                   cfg.head_dim_v, a.fwd.batch, wgmma_tma_box(specs[1], TmaOperand::Q)),
          wp.tmap_do);
    if (s3 != FA_SUCCESS) {
      clear_error();
      LaunchShape no_tma = backward_shape(a);
      no_tma.tma_ok = false;
      specs[1] =
          fa::backward_spec(cfg, KernelKind::Backward, backend_->info().limits, no_tma, policy());
      if (fa_status st = get_kernel(specs[1], &ks[1]); st != FA_SUCCESS) return st;
    }
  }
  wp.p = p;
  LaunchGeometry geoms[3];
  for (int i = 0; i < 3; ++i) {
    if (!ks[i]) continue;
    geoms[i] = backward_geometry(specs[i], p);
    if (!geometry_ok(geoms[i])) {  // before the first launch
      return fail(FA_ERROR_UNSUPPORTED,
                  "the backward's %s grid (%u, %u, %u) exceeds the device limits", names[i],
                  geoms[i].grid[0], geoms[i].grid[1], geoms[i].grid[2]);
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (!ks[i]) continue;
    const bool w = i == 1 && specs[1].wgmma;
    if (fa_status st = backend_->launch(*ks[i], geoms[i], w ? static_cast<const void *>(&wp) : &p,
                                        w ? sizeof wp : sizeof p, stream);
        st != FA_SUCCESS)
      return st;
  }
  return FA_SUCCESS;
}

}  // namespace fa
