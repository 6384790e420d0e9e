// Tests of the cuda backend (src/backend/cuda_*.cc).
//
// The driver is loaded once per process, and CUDA cannot be used across
// fork(), so every case runs in a fresh child: this program re-executes
// itself with `--probe NAME ...`, the child prints `probe:key=value` lines
// and exits 0 (passed), 1 (failed) or 77 (skipped), and the parent asserts on
// the result. A child killed by a signal is a failure ("never an abort").
//
// Without a GPU (CI): the backend must report FA_ERROR_NO_DRIVER or
// FA_ERROR_NO_DEVICE with a readable message, also when LD_LIBRARY_PATH
// points at fake libcuda.so.1 libraries built here with the system cc (no
// cuGetProcAddress, a 9.0 driver, a missing entry point, no device, a bad
// ordinal) or at the toolkit's stub libcuda.
// With a GPU: hand-written PTX kernels are compiled, loaded and launched
// (vector add, > 48 KB dynamic shared memory, a faulting store that must
// poison the backend), plus error paths and concurrent use.
// Our headers first: cmocka.h defines a fail() macro that would clash with
// fa::fail in common/error.h.
#include "backend/backend.h"
#include "backend/ptx_compiler.h"
#include "common/error.h"
#include "flashattn.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

// cmocka.h declares print_error & co. without C linkage for C++.
extern "C" {
#include <cmocka.h>
}

#include <dlfcn.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// Hand-written PTX (PTX ISA 7.0, sm_52 so any device the driver supports
// can JIT it). Each takes one .param byte array, as generated kernels do.
// ---------------------------------------------------------------------------

// c[i] = a[i] + b[i] for i < n. Params: a, b, c (u64 at 0, 8, 16), n (u32 at 24).
const char kVecAddPtx[] = R"(.version 7.0
.target sm_52
.address_size 64

.visible .entry vec_add(.param .align 8 .b8 vec_add_param[32])
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<11>;
  .reg .f32 %f<4>;

  ld.param.u64 %rd1, [vec_add_param];
  ld.param.u64 %rd2, [vec_add_param+8];
  ld.param.u64 %rd3, [vec_add_param+16];
  ld.param.u32 %r1, [vec_add_param+24];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd4, %rd1;
  cvta.to.global.u64 %rd5, %rd2;
  cvta.to.global.u64 %rd6, %rd3;
  mul.wide.u32 %rd7, %r5, 4;
  add.s64 %rd8, %rd4, %rd7;
  add.s64 %rd9, %rd5, %rd7;
  add.s64 %rd10, %rd6, %rd7;
  ld.global.f32 %f1, [%rd8];
  ld.global.f32 %f2, [%rd9];
  add.rn.f32 %f3, %f1, %f2;
  st.global.f32 [%rd10], %f3;
DONE:
  ret;
}
)";

// One block fills n words of dynamic shared memory with 3*i+1, then writes
// them reversed: out[i] = 3*(n-1-i)+1. Params: out (u64 at 0), n (u32 at 8).
const char kSmemPtx[] = R"(.version 7.0
.target sm_52
.address_size 64

.extern .shared .align 16 .b8 dsmem[];

.visible .entry smem_reverse(.param .align 8 .b8 smem_reverse_param[16])
{
  .reg .pred %p<3>;
  .reg .b32 %r<13>;
  .reg .b64 %rd<5>;

  ld.param.u64 %rd1, [smem_reverse_param];
  ld.param.u32 %r1, [smem_reverse_param+8];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, dsmem;
  mov.u32 %r5, %r2;
FILL:
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra FILLED;
  mad.lo.s32 %r6, %r5, 3, 1;
  shl.b32 %r7, %r5, 2;
  add.s32 %r8, %r4, %r7;
  st.shared.u32 [%r8], %r6;
  add.s32 %r5, %r5, %r3;
  bra.uni FILL;
FILLED:
  bar.sync 0;
  mov.u32 %r5, %r2;
COPY:
  setp.ge.u32 %p2, %r5, %r1;
  @%p2 bra DONE;
  sub.s32 %r9, %r1, %r5;
  sub.s32 %r9, %r9, 1;
  shl.b32 %r10, %r9, 2;
  add.s32 %r11, %r4, %r10;
  ld.shared.u32 %r12, [%r11];
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r12;
  add.s32 %r5, %r5, %r3;
  bra.uni COPY;
DONE:
  ret;
}
)";

// Stores to global address 0x10, which no allocation covers: the launch or
// the next synchronisation reports a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS).
const char kFaultPtx[] = R"(.version 7.0
.target sm_52
.address_size 64

.visible .entry fault(.param .align 8 .b8 fault_param[8])
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;

  mov.u64 %rd1, 16;
  mov.u32 %r1, 42;
  st.global.u32 [%rd1], %r1;
  ret;
}
)";

// vec_add with an undefined register: the JIT must reject it.
const char kBadPtx[] = R"(.version 7.0
.target sm_52
.address_size 64

.visible .entry bad(.param .align 8 .b8 bad_param[8])
{
  .reg .f32 %f<2>;
  add.f32 %f1, %f1, %nosuchreg;
  ret;
}
)";

// A CPU stand-in for libcuda.so.1 (C, built at test time with cc): the
// driver calls the backend makes, on host memory, with vec_add and
// smem_reverse computed on the CPU and `fault` raising a sticky
// CUDA_ERROR_ILLEGAL_ADDRESS. It also polices the backend: a call without the
// primary context current, an unbalanced push/pop, a lookup at an unexpected
// API version, a cubin used after cuLinkDestroy... count as violations, which
// the probe reports through the mock_* functions.
const char kMockDriverSource[] =
    R"MOCK(// A CPU stand-in for libcuda.so.1: enough of the driver API for the cuda
// backend's probes, with checks of how the backend drives it.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define EXPORT __attribute__((visibility("default")))
#define CTX ((void *)0x5eed)
#define OPTIN 232448

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount, live_modules, inited, sticky, violations;
static __thread int depth;
static __thread void *stack[16];

typedef struct { char *ptx; } Module;
typedef struct { Module *m; char name[64]; size_t param; int max_dyn; } Function;
typedef struct { char *info, *err; unsigned info_size, err_size; char *ptx; char *cubin; } Link;

// Every allocation stays referenced from here, so leak checkers do not
// report what a sticky error (or a function handle) leaves behind.
static void *kept[1 << 16];
static unsigned nkept;
static void *keep(void *p) {
  pthread_mutex_lock(&mu);
  kept[nkept++ % (1 << 16)] = p;
  pthread_mutex_unlock(&mu);
  return p;
}

static void violation(const char *what) {
  fprintf(stderr, "mock libcuda: %s\n", what);
  __sync_fetch_and_add(&violations, 1);
}
// Every context-bound call: the primary context must be current and no sticky error pending.
static CUresult bound(void) {
  if (!inited) { violation("call before cuInit"); return 3; }
  if (depth == 0 || stack[depth - 1] != CTX) { violation("no current context"); return 201; }
  return sticky;
}
EXPORT int mock_violations(void) { return violations; }
EXPORT int mock_refcount(void) { return refcount; }
EXPORT int mock_live_modules(void) { return live_modules; }
static int attention_launches;
EXPORT int mock_attention_launches(void) { return attention_launches; }
// cuLinkCreate calls, and module loads that name the sm_90a target.
static int links, accelerated_loads;
EXPORT int mock_links(void) { return links; }
EXPORT int mock_accelerated_loads(void) { return accelerated_loads; }
// Module loads of a cubin (ELF: no JIT) and of PTX (a JIT), refused ones included.
static int cubin_loads, ptx_loads;
EXPORT int mock_cubin_loads(void) { return cubin_loads; }
EXPORT int mock_ptx_loads(void) { return ptx_loads; }
EXPORT int mock_depth(void) { return depth; }
// Stream-capture mode (what CUDA graphs require of a captured call): no
// allocation, copy, memset, synchronisation or module load. While it is on,
// each such call is a violation; launches are counted.
static int capturing, captured_launches;
EXPORT void mock_capture(int on) { capturing = on; }
EXPORT int mock_captured_launches(void) { return captured_launches; }
static void not_in_capture(const char *what) {
  if (capturing) violation(what);
}

static CUresult error_name(CUresult r, const char **s) {
  switch (r) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 200: *s = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 209: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return 0;
    case 218: *s = "CUDA_ERROR_INVALID_PTX"; return 0;
    case 222: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; return 0;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return 0;
    default: *s = 0; return 1;
  }
}
static CUresult error_string(CUresult r, const char **s) {
  *s = r == 700 ? "an illegal memory access was encountered" : "mock error";
  return 0;
}
static CUresult init(unsigned flags) { (void)flags; inited = 1; return 0; }
static CUresult driver_version(int *v) {
  const char *e = getenv("MOCK_CUDA_DRIVER_VERSION");  // a driver update, for the cache
  *v = e ? atoi(e) : 12080; return 0;
}
static CUresult device_count(int *n) { *n = 1; return 0; }
static CUresult device_get(int *d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return 0; }
static CUresult device_name(char *name, int len, int dev) {
  (void)dev; snprintf(name, (size_t)len, "Mock GPU"); return 0;
}
static CUresult device_attribute(int *v, int attr, int dev) {
  (void)dev;
  switch (attr) {
    case 75: *v = 9; return 0;     // compute capability major
    case 76: *v = 0; return 0;     // minor
    case 16: *v = 132; return 0;   // multiprocessors
    case 97: *v = OPTIN; return 0; // opt-in shared memory
    case 81: *v = OPTIN + 1024; return 0;  // shared memory per SM
    case 82: *v = 65536; return 0;  // registers per SM
    case 39: *v = 2048; return 0;   // threads per SM
    default: return 1;
  }
}
static CUresult retain(void **ctx, int dev) {
  (void)dev; pthread_mutex_lock(&mu); ++refcount; pthread_mutex_unlock(&mu); *ctx = CTX; return 0;
}
static CUresult release(int dev) {
  (void)dev; pthread_mutex_lock(&mu);
  if (--refcount < 0) violation("primary context released more often than retained");
  pthread_mutex_unlock(&mu); return 0;
}
static CUresult push(void *ctx) {
  if (ctx != CTX) { violation("push of a foreign context"); return 201; }
  if (depth == 16) { violation("context stack overflow"); return 1; }
  stack[depth++] = ctx; return 0;
}
static CUresult pop(void **ctx) {
  if (depth == 0) { violation("pop of an empty stack"); return 201; }
  *ctx = stack[--depth]; return 0;
}
// Options are (CUjit_option, value) pairs; the log buffers are recorded.
static void jit_options(Link *l, unsigned n, int *opt, void **val) {
  for (unsigned i = 0; i < n; ++i) {
    if (opt[i] == 3) l->info = (char *)val[i];
    if (opt[i] == 4) l->info_size = (unsigned)(uintptr_t)val[i];
    if (opt[i] == 5) l->err = (char *)val[i];
    if (opt[i] == 6) l->err_size = (unsigned)(uintptr_t)val[i];
  }
}
static CUresult link_create(unsigned n, int *opt, void **val, void **state) {
  not_in_capture("cuLinkCreate during capture");
  CUresult r = bound(); if (r) return r;
  Link *l = calloc(1, sizeof *l);
  __sync_fetch_and_add(&links, 1);
  jit_options(l, n, opt, val);
  if (!l->info || !l->err || !l->info_size || !l->err_size) violation("cuLinkCreate without log buffers");
  *state = l; return 0;
}
static CUresult link_add(void *state, int type, void *data, size_t size, const char *name,
                         unsigned n, int *o, void **v) {
  (void)name; (void)n; (void)o; (void)v;
  CUresult r = bound(); if (r) return r;
  Link *l = state;
  if (type != 1) { violation("input is not PTX"); return 1; }
  if (size == 0 || ((char *)data)[size - 1] != 0) { violation("PTX size excludes its NUL"); return 1; }
  if (strstr(data, "%nosuchreg")) {
    snprintf(l->err, l->err_size, "ptxas application ptx input, line 8; error   : Unknown symbol '%%nosuchreg'");
    return 218;
  }
  l->ptx = strdup(data); return 0;
}
static CUresult link_complete(void *state, void **cubin, size_t *size) {
  CUresult r = bound(); if (r) return r;
  Link *l = state;
  if (!l->ptx) return 1;
  size_t n = strlen(l->ptx) + 1;
  l->cubin = malloc(4 + n);
  memcpy(l->cubin, "\x7f" "ELF", 4);
  memcpy(l->cubin + 4, l->ptx, n);
  snprintf(l->info, l->info_size, "ptxas info    : Used 8 registers (mock)");
  *cubin = l->cubin; *size = 4 + n; return 0;
}
static CUresult link_destroy(void *state) {
  CUresult r = bound(); if (r) return r;
  Link *l = state;
  if (l->cubin) memset(l->cubin, 0, 4);  // the backend must have copied it
  free(l->ptx); free(l->cubin); free(l); return 0;
}
static CUresult module_load(void **mod, const void *image, unsigned n, int *opt, void **val) {
  not_in_capture("cuModuleLoadDataEx during capture");
  CUresult r = bound(); if (r) return r;
  Link logs = {0};
  jit_options(&logs, n, opt, val);
  for (unsigned i = 0; i < n; ++i) {
    if (opt[i] == 9 && (uintptr_t)val[i] == 0x10000 + 90) __sync_fetch_and_add(&accelerated_loads, 1);
  }
  const char *text;
  if (memcmp(image, "\x7f" "ELF", 4) == 0) {
    __sync_fetch_and_add(&cubin_loads, 1);
    // A driver refusing a cubin: too new (222), another SM (209), damaged (200).
    const char *refuse = getenv("MOCK_CUDA_REFUSE_CUBIN");
    if (refuse && atoi(refuse)) {
      if (logs.err) snprintf(logs.err, logs.err_size, "mock: cubin refused");
      return atoi(refuse);
    }
    text = (const char *)image + 4;
  } else if (strstr(image, ".version")) {
    __sync_fetch_and_add(&ptx_loads, 1);
    text = image;
  } else {
    return 200;
  }
  if (logs.info) snprintf(logs.info, logs.info_size, "ptxas info    : Used 8 registers (mock load)");
  if (strstr(text, "%nosuchreg")) {
    if (logs.err) snprintf(logs.err, logs.err_size, "mock JIT: Unknown symbol '%%nosuchreg'");
    return 218;
  }
  Module *m = keep(calloc(1, sizeof *m));
  m->ptx = keep(strdup(text));
  __sync_fetch_and_add(&live_modules, 1);
  *mod = m; return 0;
}
static CUresult module_unload(void *mod) {
  CUresult r = bound(); if (r) return r;
  Module *m = mod;
  free(m->ptx); free(m);
  __sync_fetch_and_sub(&live_modules, 1); return 0;
}
static CUresult module_function(void **fn, void *mod, const char *name) {
  CUresult r = bound(); if (r) return r;
  Module *m = mod;
  char key[96];
  snprintf(key, sizeof key, ".entry %s(", name);
  if (!strstr(m->ptx, key)) return 500;
  Function *f = keep(calloc(1, sizeof *f));  // lives as long as the process
  f->m = m;
  snprintf(f->name, sizeof f->name, "%s", name);
  snprintf(key, sizeof key, "%s_param[", name);
  const char *p = strstr(m->ptx, key);
  f->param = p ? (size_t)atoi(p + strlen(key)) : 0;
  f->max_dyn = 48 * 1024;
  *fn = f; return 0;
}
static CUresult func_get_attribute(int *v, int attr, void *fn) {
  CUresult r = bound(); if (r) return r;
  if (attr == 1) { *v = 0; return 0; }  // static shared memory
  if (attr == 8) { *v = ((Function *)fn)->max_dyn; return 0; }
  return 1;
}
static CUresult func_set_attribute(void *fn, int attr, int value) {
  CUresult r = bound(); if (r) return r;
  if (attr != 8 || value > OPTIN) return 1;
  ((Function *)fn)->max_dyn = value; return 0;
}
static CUresult func_param_info(void *fn, size_t index, size_t *offset, size_t *size) {
  Function *f = fn;
  if (index != 0 || f->param == 0) return 1;
  *offset = 0; if (size) *size = f->param; return 0;
}
static CUresult launch(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned smem, void *stream, void **params, void **extra) {
  (void)stream;
  CUresult r = bound(); if (r) return r;
  Function *f = fn;
  if (extra != 0 || params == 0) { violation("launch without kernelParams"); return 1; }
  if ((int)smem > f->max_dyn) return 1;
  if (gx * gy * gz == 0 || bx * by * bz == 0 || bx * by * bz > 1024) return 1;
  const unsigned char *block = params[0];
  unsigned long long threads = (unsigned long long)gx * gy * gz * bx * by * bz;
  if (strcmp(f->name, "fault") == 0) { sticky = 700; return 0; }
  // flashattn's own kernels: accepted and counted, not computed (no numerics here).
  if (strncmp(f->name, "fa_", 3) == 0) {
    __sync_fetch_and_add(&attention_launches, 1);
    if (capturing) __sync_fetch_and_add(&captured_launches, 1);
    return 0;
  }
  if (strcmp(f->name, "vec_add") == 0) {
    float *a, *b, *c; unsigned n;
    memcpy(&a, block, 8); memcpy(&b, block + 8, 8); memcpy(&c, block + 16, 8);
    memcpy(&n, block + 24, 4);
    for (unsigned i = 0; i < n && i < threads; ++i) c[i] = a[i] + b[i];
    return 0;
  }
  if (strcmp(f->name, "smem_reverse") == 0) {
    unsigned *out, n;
    memcpy(&out, block, 8); memcpy(&n, block + 8, 4);
    if ((unsigned long long)n * 4 > smem) { sticky = 700; return 0; }
    for (unsigned i = 0; i < n; ++i) out[i] = 3 * (n - 1 - i) + 1;
    return 0;
  }
  return 1;
}
static CUresult mem_alloc(CUdeviceptr *p, size_t bytes) {
  not_in_capture("cuMemAlloc during capture");
  CUresult r = bound(); if (r) return r;
  void *m = keep(aligned_alloc(256, (bytes + 255) / 256 * 256));
  if (!m) return 2;
  *p = (CUdeviceptr)(uintptr_t)m; return 0;
}
static CUresult mem_free(CUdeviceptr p) {
  not_in_capture("cuMemFree during capture");
  CUresult r = bound(); if (r) return r;
  free((void *)(uintptr_t)p); return 0;
}
static CUresult htod(CUdeviceptr d, const void *s, size_t n) {
  not_in_capture("cuMemcpyHtoD during capture");
  CUresult r = bound(); if (r) return r;
  memcpy((void *)(uintptr_t)d, s, n); return 0;
}
static CUresult dtoh(void *d, CUdeviceptr s, size_t n) {
  not_in_capture("cuMemcpyDtoH during capture (a host read of device data)");
  CUresult r = bound(); if (r) return r;
  memcpy(d, (void *)(uintptr_t)s, n); return 0;
}
static CUresult memset_d8(CUdeviceptr d, unsigned char v, size_t n) {
  not_in_capture("cuMemsetD8 during capture");
  CUresult r = bound(); if (r) return r;
  memset((void *)(uintptr_t)d, v, n); return 0;
}
static CUresult stream_sync(void *stream) {
  (void)stream;
  not_in_capture("cuStreamSynchronize during capture");
  return bound();
}

/* Host-only, as the real one: a zeroed 128-byte map (the mock launches
   nothing that reads it). */
static CUresult tensor_map_encode(void *map, int dtype, unsigned rank, void *addr,
                                  const unsigned long long *dims,
                                  const unsigned long long *strides, const unsigned *box,
                                  const unsigned *estrides, int interleave, int swizzle, int l2,
                                  int oob) {
  (void)dtype; (void)addr; (void)dims; (void)strides; (void)box; (void)estrides;
  (void)interleave; (void)swizzle; (void)l2; (void)oob;
  if (rank < 1 || rank > 5) return 1;
  memset(map, 0, 128);
  return 0;
}

static const struct { const char *name; void *fn; } table[] = {
  {"cuGetErrorName", (void *)error_name}, {"cuGetErrorString", (void *)error_string},
  {"cuInit", (void *)init}, {"cuDriverGetVersion", (void *)driver_version},
  {"cuDeviceGetCount", (void *)device_count}, {"cuDeviceGet", (void *)device_get},
  {"cuDeviceGetName", (void *)device_name}, {"cuDeviceGetAttribute", (void *)device_attribute},
  {"cuDevicePrimaryCtxRetain", (void *)retain}, {"cuDevicePrimaryCtxRelease", (void *)release},
  {"cuCtxPushCurrent", (void *)push}, {"cuCtxPopCurrent", (void *)pop},
  {"cuLinkCreate", (void *)link_create}, {"cuLinkAddData", (void *)link_add},
  {"cuLinkComplete", (void *)link_complete}, {"cuLinkDestroy", (void *)link_destroy},
  {"cuModuleLoadDataEx", (void *)module_load}, {"cuModuleUnload", (void *)module_unload},
  {"cuModuleGetFunction", (void *)module_function},
  {"cuFuncGetAttribute", (void *)func_get_attribute},
  {"cuFuncSetAttribute", (void *)func_set_attribute},
  {"cuFuncGetParamInfo", (void *)func_param_info}, {"cuLaunchKernel", (void *)launch},
  {"cuMemAlloc", (void *)mem_alloc}, {"cuMemFree", (void *)mem_free},
  {"cuMemcpyHtoD", (void *)htod}, {"cuMemcpyDtoH", (void *)dtoh},
  {"cuMemsetD8", (void *)memset_d8}, {"cuStreamSynchronize", (void *)stream_sync},
  {"cuTensorMapEncodeTiled", (void *)tensor_map_encode},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status) {
  *pfn = 0;
  if (flags != 1) violation("lookup without CU_GET_PROC_ADDRESS_LEGACY_STREAM");
  int want = strcmp(symbol, "cuFuncGetParamInfo") == 0 ? 12040 : 12000;
  if (version != want) violation("lookup at an unexpected API version");
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
    if (strcmp(table[i].name, symbol) == 0) {
      *pfn = table[i].fn;
      if (status) *status = 0;
      return 0;
    }
  }
  if (status) *status = 1;
  return 500;
}
)MOCK";

// A stand-in for the PTX compiler plugin (src/ptxc/fa_ptxc.h): its "cubin"
// is an ELF magic, the PTX and a line naming the target, which the mock
// driver loads without a JIT. PTX holding %nosuchreg is rejected with a
// log. FAKE_PTXC_VERSION overrides its compiler version; -DFAKE_ABI=2
// builds one of a foreign ABI.
const char kFakePluginSource[] = R"FAKE(#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define EXPORT __attribute__((visibility("default")))
#ifndef FAKE_ABI
#define FAKE_ABI 1
#endif
EXPORT int fa_ptxc_abi_version(void) { return FAKE_ABI; }
EXPORT const char *fa_ptxc_compiler_version(void) {
  const char *v = getenv("FAKE_PTXC_VERSION");
  return v ? v : "fake-ptxc 1.0";
}
EXPORT int fa_ptxc_compile(const char *ptx, size_t n, const char *target, void **cubin,
                           size_t *size, char **log) {
  *cubin = 0; *size = 0;
  while (n > 0 && ptx[n - 1] == 0) --n;
  *log = malloc(256);
  if (memmem(ptx, n, "%nosuchreg", 10)) {
    snprintf(*log, 256, "ptxas fatal   : Unknown symbol '%%nosuchreg' (fake, %s)", target);
    return 1;
  }
  snprintf(*log, 256, "ptxas info    : Function properties for 'sm' (%s)", target);
  char tail[64];
  snprintf(tail, sizeof tail, "\n// fake-ptxc target %s\n", target);
  char *c = malloc(4 + n + strlen(tail) + 1);
  memcpy(c, "\x7f" "ELF", 4);
  memcpy(c + 4, ptx, n);
  strcpy(c + 4 + n, tail);
  *cubin = c; *size = 4 + n + strlen(tail) + 1;
  return 0;
}
EXPORT void fa_ptxc_free(void *p) { free(p); }
)FAKE";

struct VecAddParams {
  uint64_t a, b, c;
  uint32_t n, pad;
};
static_assert(sizeof(VecAddParams) == 32, "matches vec_add_param[32]");

struct SmemParams {
  uint64_t out;
  uint32_t n, pad;
};
static_assert(sizeof(SmemParams) == 16, "matches smem_reverse_param[16]");

// ---------------------------------------------------------------------------
// Child side (probe mode)
// ---------------------------------------------------------------------------

constexpr int kExitPass = 0;
constexpr int kExitFail = 1;
constexpr int kExitSkip = 77;

void emit(const char *key, const std::string &value) {
  // One line per value: newlines inside messages are flattened.
  std::string flat = value;
  for (char &c : flat) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::printf("probe:%s=%s\n", key, flat.c_str());
  std::fflush(stdout);
}

// A failed check in a child: print where and why, exit 1.
#define PROBE_CHECK(cond, ...)                                      \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                     \
      std::printf("\n");                                            \
      std::fflush(stdout);                                          \
      std::_Exit(kExitFail);                                        \
    }                                                               \
  } while (0)

// Checks that `call` returned `want`, printing the error message if not.
#define PROBE_STATUS(want, call)                                                                   \
  do {                                                                                             \
    fa_status got_ = (call);                                                                       \
    PROBE_CHECK(got_ == (want), "%s returned %s (%d), want %s: %s", #call, fa_status_string(got_), \
                static_cast<int>(got_), fa_status_string(want), fa::last_error());                 \
  } while (0)

bool contains(const std::string &haystack, const char *needle) {
  return haystack.find(needle) != std::string::npos;
}

// create twice on `device`; prints both outcomes (and the device on success).
int probe_create(int device) {
  std::unique_ptr<fa::Backend> first, second;
  fa_status s1 = fa::create_cuda_backend(device, &first);
  std::string m1 = fa::last_error();
  fa_status s2 = fa::create_cuda_backend(device, &second);
  std::string m2 = fa::last_error();
  emit("status1", std::to_string(s1));
  emit("message1", m1);
  emit("status2", std::to_string(s2));
  emit("message2", m2);
  if (s1 == FA_SUCCESS) {
    const fa::DeviceInfo &info = first->info();
    emit("name", info.name);
    emit("sm", std::to_string(info.sm));
    emit("num_sms", std::to_string(info.num_sms));
    emit("smem_optin", std::to_string(info.limits.smem_per_block_optin));
    emit("driver_version", std::to_string(info.driver_version));
    emit("kind", std::to_string(first->kind()));
  }
  return kExitPass;
}

// A backend on device 0, or exit 77 (skip) when there is none.
std::unique_ptr<fa::Backend> gpu_backend() {
  std::unique_ptr<fa::Backend> backend;
  fa_status s = fa::create_cuda_backend(0, &backend);
  if (s != FA_SUCCESS) {
    std::printf("no CUDA device: %s\n", fa::last_error());
    std::fflush(stdout);
    std::_Exit(kExitSkip);
  }
  return backend;
}

// Compiles `ptx` and loads `entry` from the cubin (from_binary) or the PTX.
std::unique_ptr<fa::Kernel> compile_and_load(fa::Backend &b, const char *ptx, const char *entry,
                                             uint32_t dynamic_smem, bool from_binary) {
  std::vector<uint8_t> cubin;
  std::string log;
  std::unique_ptr<fa::Kernel> kernel;
  if (from_binary) {
    PROBE_STATUS(FA_SUCCESS, b.compile(ptx, &cubin, &log));
    // Whole-program JIT: the binary is the PTX itself and a NUL.
    PROBE_CHECK(cubin.size() == std::strlen(ptx) + 1 && cubin.back() == 0 &&
                    std::memcmp(cubin.data(), ptx, cubin.size() - 1) == 0,
                "compile gave %zu bytes, not the PTX (%zu) and a NUL", cubin.size(),
                std::strlen(ptx));
    emit((std::string(entry) + "_jit_log").c_str(), log);
    PROBE_STATUS(FA_SUCCESS, b.load(ptx, cubin, entry, dynamic_smem, &kernel));
  } else {
    PROBE_STATUS(FA_SUCCESS, b.load(ptx, {}, entry, dynamic_smem, &kernel));
  }
  PROBE_CHECK(kernel != nullptr, "load gave no kernel");
  return kernel;
}

// Runs vec_add on n elements through `kernel` and checks every output and
// that nothing past n was written. Returns "" or a description of the failure.
std::string run_vec_add(fa::Backend &b, fa::Kernel &kernel, uint32_t n, float seed) {
  const uint32_t pad = 37;  // sentinel words after c[n-1]
  std::vector<float> a(n), bv(n);
  for (uint32_t i = 0; i < n; ++i) {
    a[i] = seed + 0.5f * static_cast<float>(i);
    bv[i] = 3.0f - 0.25f * static_cast<float>(i) / (seed + 1.0f);
  }
  uint64_t da = 0, db = 0, dc = 0;
  if (b.mem_alloc(n * 4, &da) || b.mem_alloc(n * 4, &db) || b.mem_alloc((n + pad) * 4, &dc)) {
    return std::string("mem_alloc: ") + fa::last_error();
  }
  std::string error;
  std::vector<uint32_t> c(n + pad, 0);
  fa::LaunchGeometry g;
  g.block[0] = 128;
  g.grid[0] = (n + 127) / 128;
  VecAddParams p{da, db, dc, n, 0};
  if (b.copy_htod(da, a.data(), n * 4) || b.copy_htod(db, bv.data(), n * 4) ||
      b.memset_d8(dc, 0xFF, (n + pad) * 4)) {
    error = std::string("copy/memset: ") + fa::last_error();
  } else if (b.launch(kernel, g, &p, sizeof p, nullptr) || b.synchronize(nullptr) ||
             b.copy_dtoh(c.data(), dc, (n + pad) * 4)) {
    error = std::string("launch/sync/copy: ") + fa::last_error();
  } else {
    for (uint32_t i = 0; i < n + pad && error.empty(); ++i) {
      uint32_t want;
      if (i < n) {
        float sum = a[i] + bv[i];
        std::memcpy(&want, &sum, 4);
      } else {
        want = 0xFFFFFFFFu;
      }
      if (c[i] != want) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "c[%u] = 0x%08x, want 0x%08x (n = %u)", i, c[i], want, n);
        error = buf;
      }
    }
  }
  b.mem_free(da);
  b.mem_free(db);
  b.mem_free(dc);
  return error;
}

// compile + load (cubin and PTX paths) + launch vec_add; checks values.
int probe_vec_add() {
  auto b = gpu_backend();
  auto from_cubin = compile_and_load(*b, kVecAddPtx, "vec_add", 0, true);
  auto from_ptx = compile_and_load(*b, kVecAddPtx, "vec_add", 0, false);
  for (uint32_t n : {1u, 127u, 1000u, 65537u}) {
    std::string e = run_vec_add(*b, *from_cubin, n, 1.0f);
    PROBE_CHECK(e.empty(), "cubin kernel: %s", e.c_str());
    e = run_vec_add(*b, *from_ptx, n, 2.0f);
    PROBE_CHECK(e.empty(), "PTX kernel: %s", e.c_str());
  }
  return kExitPass;
}

// A kernel using more than 48 KB of dynamic shared memory, and the limits.
int probe_big_smem() {
  auto b = gpu_backend();
  const size_t optin = b->info().limits.smem_per_block_optin;
  const uint32_t bytes = static_cast<uint32_t>(std::min<size_t>(optin, 96 * 1024) & ~size_t{1023});
  if (bytes <= 48 * 1024) {
    std::printf("device allows only %zu bytes of shared memory per block\n", optin);
    return kExitSkip;
  }
  emit("smem_bytes", std::to_string(bytes));
  auto kernel = compile_and_load(*b, kSmemPtx, "smem_reverse", bytes, true);

  const uint32_t n = bytes / 4, pad = 16;
  uint64_t out = 0;
  PROBE_STATUS(FA_SUCCESS, b->mem_alloc((n + pad) * 4, &out));
  PROBE_STATUS(FA_SUCCESS, b->memset_d8(out, 0xFF, (n + pad) * 4));
  fa::LaunchGeometry g;
  g.block[0] = 256;
  g.smem_bytes = bytes;
  SmemParams p{out, n, 0};
  PROBE_STATUS(FA_SUCCESS, b->launch(*kernel, g, &p, sizeof p, nullptr));
  PROBE_STATUS(FA_SUCCESS, b->synchronize(nullptr));
  std::vector<uint32_t> host(n + pad, 0);
  PROBE_STATUS(FA_SUCCESS, b->copy_dtoh(host.data(), out, (n + pad) * 4));
  for (uint32_t i = 0; i < n + pad; ++i) {
    const uint32_t want = i < n ? 3 * (n - 1 - i) + 1 : 0xFFFFFFFFu;
    PROBE_CHECK(host[i] == want, "out[%u] = %u, want %u", i, host[i], want);
  }

  // Asking a launch for more than the kernel was loaded for is refused.
  g.smem_bytes = bytes + 1024;
  PROBE_STATUS(FA_ERROR_INVALID_ARGUMENT, b->launch(*kernel, g, &p, sizeof p, nullptr));
  // Loading for more than the device's opt-in limit fails clearly.
  std::unique_ptr<fa::Kernel> too_big;
  fa_status s =
      b->load(kSmemPtx, {}, "smem_reverse", static_cast<uint32_t>(optin) + 1024, &too_big);
  PROBE_CHECK(s == FA_ERROR_UNSUPPORTED && contains(fa::last_error(), "shared memory"),
              "load above the opt-in limit returned %d: %s", s, fa::last_error());
  PROBE_STATUS(FA_SUCCESS, b->mem_free(out));
  return kExitPass;
}

// A faulting kernel: FA_ERROR_CUDA once, then FA_ERROR_RUNTIME_POISONED.
int probe_fault() {
  auto b = gpu_backend();
  auto fault = compile_and_load(*b, kFaultPtx, "fault", 0, true);
  auto vec_add = compile_and_load(*b, kVecAddPtx, "vec_add", 0, true);
  uint64_t buffer = 0;
  PROBE_STATUS(FA_SUCCESS, b->mem_alloc(4096, &buffer));

  fa::LaunchGeometry g;
  uint64_t unused = 0;
  fa_status s = b->launch(*fault, g, &unused, sizeof unused, nullptr);
  std::string message = fa::last_error();
  if (s == FA_SUCCESS) {  // usual: the fault is seen at synchronisation
    s = b->synchronize(nullptr);
    message = fa::last_error();
  }
  emit("fault_message", message);
  PROBE_CHECK(s == FA_ERROR_CUDA, "the fault gave %s: %s", fa_status_string(s), message.c_str());
  PROBE_CHECK(contains(message, "CUDA_ERROR_") && contains(message, "sticky"),
              "message does not name the sticky error: %s", message.c_str());

  // Every later call is refused, naming the original error.
  std::vector<uint8_t> cubin;
  std::string log;
  std::unique_ptr<fa::Kernel> k;
  uint64_t p = 0;
  uint32_t word = 0;
  VecAddParams params{buffer, buffer, buffer, 1, 0};
  const fa_status later[] = {
      b->synchronize(nullptr),
      b->mem_alloc(256, &p),
      b->copy_htod(buffer, &word, 4),
      b->copy_dtoh(&word, buffer, 4),
      b->memset_d8(buffer, 0, 4),
      b->launch(*vec_add, g, &params, sizeof params, nullptr),
      b->compile(kVecAddPtx, &cubin, &log),
      b->load(kVecAddPtx, {}, "vec_add", 0, &k),
      b->mem_free(buffer),
  };
  for (size_t i = 0; i < sizeof later / sizeof later[0]; ++i) {
    PROBE_CHECK(later[i] == FA_ERROR_RUNTIME_POISONED, "later call %zu returned %s", i,
                fa_status_string(later[i]));
  }
  PROBE_STATUS(FA_ERROR_RUNTIME_POISONED, b->synchronize(nullptr));
  const std::string poisoned = fa::last_error();
  emit("poisoned_message", poisoned);
  PROBE_CHECK(contains(poisoned, "an earlier sticky CUDA error (CUDA_ERROR_") &&
                  contains(poisoned, "destroy the runtime"),
              "poisoned message: %s", poisoned.c_str());
  // Teardown after a sticky error must not crash.
  fault.reset();
  vec_add.reset();
  b.reset();
  return kExitPass;
}

// Error paths that must not poison, memory helpers, device info.
int probe_errors() {
  auto b = gpu_backend();
  const fa::DeviceInfo &info = b->info();
  PROBE_CHECK(!info.name.empty() && info.sm >= 50 && info.num_sms > 0 &&
                  info.limits.smem_per_block_optin >= 48 * 1024 && info.driver_version >= 12000,
              "implausible info: '%s' sm %d, %d SMs, %u smem, driver %d", info.name.c_str(),
              info.sm, info.num_sms, info.limits.smem_per_block_optin, info.driver_version);
  PROBE_CHECK(b->kind() == FA_BACKEND_CUDA, "kind %d", b->kind());

  std::vector<uint8_t> cubin{1, 2, 3};
  std::string log;
  fa_status s = b->compile(kBadPtx, &cubin, &log);
  PROBE_CHECK(s == FA_ERROR_COMPILE && cubin.empty() && std::strlen(fa::last_error()) > 0,
              "bad PTX: %s, %zu bytes: %s", fa_status_string(s), cubin.size(), fa::last_error());
  emit("compile_error", fa::last_error());
  emit("compile_error_log", log);

  std::unique_ptr<fa::Kernel> k;
  s = b->load(kVecAddPtx, {}, "no_such_entry", 0, &k);
  PROBE_CHECK(s == FA_ERROR_COMPILE && contains(fa::last_error(), "no_such_entry"),
              "missing entry: %s: %s", fa_status_string(s), fa::last_error());
  PROBE_STATUS(FA_ERROR_COMPILE,
               b->load("", std::vector<uint8_t>{1, 2, 3, 4, 5}, "vec_add", 0, &k));
  PROBE_STATUS(FA_ERROR_COMPILE, b->load(kBadPtx, {}, "bad", 0, &k));

  auto vec_add = compile_and_load(*b, kVecAddPtx, "vec_add", 0, true);
  VecAddParams p{0, 0, 0, 0, 0};
  fa::LaunchGeometry zero;
  zero.grid[1] = 0;
  PROBE_STATUS(FA_ERROR_INVALID_ARGUMENT, b->launch(*vec_add, zero, &p, sizeof p, nullptr));
  if (info.driver_version >= 12040) {
    // cuFuncGetParamInfo reports the 32-byte block: a shorter one is refused.
    fa::LaunchGeometry g;
    PROBE_STATUS(FA_ERROR_INVALID_ARGUMENT, b->launch(*vec_add, g, &p, 24, nullptr));
  }

  // Memory helpers.
  const size_t bytes = 1 << 20;
  uint64_t d = 0;
  PROBE_STATUS(FA_ERROR_INVALID_ARGUMENT, b->mem_alloc(0, &d));
  PROBE_STATUS(FA_SUCCESS, b->mem_alloc(bytes, &d));
  PROBE_CHECK(d != 0 && d % 256 == 0, "allocation 0x%llx not 256-byte aligned",
              static_cast<unsigned long long>(d));
  std::vector<uint8_t> host(bytes, 0);
  PROBE_STATUS(FA_SUCCESS, b->memset_d8(d, 0x5A, bytes));
  PROBE_STATUS(FA_SUCCESS, b->copy_dtoh(host.data(), d, bytes));
  for (size_t i = 0; i < bytes; ++i) PROBE_CHECK(host[i] == 0x5A, "byte %zu = %u", i, host[i]);
  std::vector<uint8_t> pattern(1000);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  PROBE_STATUS(FA_SUCCESS, b->copy_htod(d + 4096 + 3, pattern.data(), pattern.size()));
  PROBE_STATUS(FA_SUCCESS, b->copy_dtoh(host.data(), d, bytes));
  for (size_t i = 0; i < bytes; ++i) {
    const bool in = i >= 4099 && i < 4099 + pattern.size();
    const uint8_t want = in ? pattern[i - 4099] : 0x5A;
    PROBE_CHECK(host[i] == want, "byte %zu = %u, want %u", i, host[i], want);
  }
  PROBE_STATUS(FA_SUCCESS, b->copy_htod(d, pattern.data(), 0));
  PROBE_STATUS(FA_SUCCESS, b->mem_free(d));
  PROBE_STATUS(FA_SUCCESS, b->mem_free(0));
  // None of the failures above was sticky.
  PROBE_STATUS(FA_SUCCESS, b->synchronize(nullptr));
  std::string e = run_vec_add(*b, *vec_add, 300, 5.0f);
  PROBE_CHECK(e.empty(), "vec_add after the error paths: %s", e.c_str());
  return kExitPass;
}

// Several threads share one backend and one kernel, each with its own data.
int probe_threads() {
  auto b = gpu_backend();
  auto kernel = compile_and_load(*b, kVecAddPtx, "vec_add", 0, true);
  std::atomic<int> failures{0};
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread also JIT-compiles, to exercise concurrent JITs.
      std::vector<uint8_t> cubin;
      std::string log;
      if (b->compile(kVecAddPtx, &cubin, &log) != FA_SUCCESS) {
        errors[t] = std::string("compile: ") + fa::last_error();
        ++failures;
        return;
      }
      for (int i = 0; i < 20; ++i) {
        std::string e = run_vec_add(*b, *kernel, 500 + 97 * t + i, static_cast<float>(t + i));
        if (!e.empty()) {
          errors[t] = e;
          ++failures;
          return;
        }
      }
    });
  }
  for (auto &th : threads) th.join();
  for (int t = 0; t < 4; ++t) PROBE_CHECK(errors[t].empty(), "thread %d: %s", t, errors[t].c_str());
  PROBE_CHECK(failures == 0, "%d failures", failures.load());
  return kExitPass;
}

// When the mock driver is the loaded libcuda.so.1, prints its counters
// (after the probe destroyed everything it created).
void emit_mock_counters() {
  void *mock = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (mock == nullptr) return;
  for (const char *name :
       {"mock_violations", "mock_depth", "mock_refcount", "mock_live_modules",
        "mock_attention_launches", "mock_links", "mock_accelerated_loads", "mock_cubin_loads",
        "mock_ptx_loads"}) {
    auto fn = reinterpret_cast<int (*)()>(dlsym(mock, name));
    if (fn != nullptr) emit(name, std::to_string(fn()));
  }
}

// An arch-specific (sm_90a) module compiles whole-program through
// cuModuleLoadDataEx, never cuLink (relocatable code, where ptxas ignores
// setmaxnreg and serializes wgmma): its binary is its own PTX, which loads
// and runs; a binary that is neither a cubin nor that PTX is refused.
int probe_whole_program() {
  auto b = gpu_backend();
  if (b->info().sm != 90) {
    std::printf("sm_%d: the sm_90a module needs an sm_90 device\n", b->info().sm);
    return kExitSkip;
  }
  std::string ptx = kVecAddPtx;
  const std::string from = ".version 7.0\n.target sm_52", to = ".version 8.0\n.target sm_90a";
  PROBE_CHECK(ptx.compare(0, from.size(), from) == 0, "unexpected vec_add header");
  ptx.replace(0, from.size(), to);
  std::vector<uint8_t> binary;
  std::string log;
  PROBE_STATUS(FA_SUCCESS, b->compile(ptx, &binary, &log));
  PROBE_CHECK(binary.size() == ptx.size() + 1 && binary.back() == 0 &&
                  std::memcmp(binary.data(), ptx.data(), ptx.size()) == 0,
              "the whole-program binary (%zu bytes) is not the PTX (%zu bytes) and a NUL",
              binary.size(), ptx.size());
  PROBE_CHECK(!log.empty(), "no JIT log from the whole-program compile");
  emit("whole_program_jit_log", log);
  std::unique_ptr<fa::Kernel> kernel;
  PROBE_STATUS(FA_SUCCESS, b->load(ptx, binary, "vec_add", 0, &kernel));
  for (uint32_t n : {1u, 1000u}) {
    const std::string e = run_vec_add(*b, *kernel, n, 1.5f);
    PROBE_CHECK(e.empty(), "sm_90a vec_add: %s", e.c_str());
  }
  std::vector<uint8_t> other = binary;
  other[other.size() / 2] ^= 1;
  std::unique_ptr<fa::Kernel> k2;
  PROBE_STATUS(FA_ERROR_COMPILE, b->load(ptx, other, "vec_add", 0, &k2));
  PROBE_CHECK(contains(fa::last_error(), "neither a cubin"), "refusal says: %s", fa::last_error());
  return kExitPass;
}

// Kernels that outlive their backend still unload with the context current.
int probe_lifetime() {
  auto b = gpu_backend();
  auto kernel = compile_and_load(*b, kVecAddPtx, "vec_add", 0, true);
  b.reset();
  kernel.reset();
  return kExitPass;
}

// The kernel cache across a driver update (docs/reliability.md, promise 6),
// on the mock driver through the public API: a row's cubin is used only with
// the driver version that built it; after an update the cubin is rebuilt
// from the stored PTX (a disk hit of the PTX, one compile) and the row is
// rewritten for the new version. The mock launches without computing, so
// only the cache's behaviour is checked here. The driver is loaded once per
// process, so each step is its own process.
struct DriverStep {
  const char *version;
  uint64_t misses, disk_hits, compiles;
};
const DriverStep kDriverSteps[] = {
    {"12080", 1, 0, 1},   // cold: generated and compiled
    {"12080", 0, 1, 0},   // same driver: the stored cubin
    {"12090", 0, 1, 1},   // driver update: rebuilt from the stored PTX
    {"12090", 0, 1, 0}};  // the rewritten row is used as is

// One small fp16 forward (d64, 2 heads, 16 tokens) on a cuda runtime made
// with `o`, then its cache statistics; the runtime is destroyed again.
fa_cache_stats run_small_forward(const fa_runtime_options &o, int want_driver) {
  fa_runtime *rt = nullptr;
  PROBE_STATUS(FA_SUCCESS, fa_runtime_create(&o, &rt));
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  PROBE_STATUS(FA_SUCCESS, fa_runtime_get_info(rt, &info));
  PROBE_CHECK(info.driver_version == want_driver, "driver %d", info.driver_version);
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 64;
  d.num_heads_q = d.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  PROBE_STATUS(FA_SUCCESS, fa_config_create(&d, &cfg));
  const int s = 16, h = 2, hd = 64;
  uint64_t buf[4] = {0, 0, 0, 0};
  for (uint64_t &b : buf) PROBE_STATUS(FA_SUCCESS, fa_malloc(rt, size_t(s) * h * hd * 2, &b));
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = a.seqlen_k = s;
  fa_tensor *t[4] = {&a.q, &a.k, &a.v, &a.o};
  for (int i = 0; i < 4; ++i) {
    t[i]->data = buf[i];
    t[i]->stride[0] = int64_t(s) * h * hd;
    t[i]->stride[1] = int64_t(h) * hd;
    t[i]->stride[2] = hd;
    t[i]->stride[3] = 1;
  }
  PROBE_STATUS(FA_SUCCESS, fa_launch(rt, cfg, &a, nullptr));
  PROBE_STATUS(FA_SUCCESS, fa_synchronize(rt, nullptr));
  fa_cache_stats cs = FA_CACHE_STATS_INIT;
  PROBE_STATUS(FA_SUCCESS, fa_cache_stats_get(rt, &cs));
  PROBE_CHECK(cs.persistent == 1 || o.cache_mode == FA_CACHE_MEMORY, "cache not on disk: %s",
              cs.note);
  for (uint64_t b : buf) PROBE_STATUS(FA_SUCCESS, fa_free(rt, b));
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return cs;
}

// The one row of the cache in `cache_dir`: its driver_version, compiler and
// binary (the probe fails unless there is exactly one).
struct OneRow {
  int driver_version = 0;
  std::string compiler, cubin, ptx;
};
OneRow read_one_row(const char *cache_dir) {
  sqlite3 *db = nullptr;
  sqlite3_stmt *q = nullptr;
  const std::string path = std::string(cache_dir) + "/kernels.sqlite3";
  PROBE_CHECK(sqlite3_open(path.c_str(), &db) == SQLITE_OK, "open %s", path.c_str());
  PROBE_CHECK(sqlite3_prepare_v2(db,
                                 "SELECT (SELECT count(*) FROM kernels), driver_version, compiler,"
                                 " cubin, ptx FROM kernels",
                                 -1, &q, nullptr) == SQLITE_OK &&
                  sqlite3_step(q) == SQLITE_ROW,
              "query: %s", sqlite3_errmsg(db));
  OneRow r;
  const int rows = sqlite3_column_int(q, 0);
  r.driver_version = sqlite3_column_int(q, 1);
  r.compiler = reinterpret_cast<const char *>(sqlite3_column_text(q, 2));
  r.cubin.assign(static_cast<const char *>(sqlite3_column_blob(q, 3)),
                 size_t(sqlite3_column_bytes(q, 3)));
  r.ptx.assign(static_cast<const char *>(sqlite3_column_blob(q, 4)),
               size_t(sqlite3_column_bytes(q, 4)));
  sqlite3_finalize(q);
  sqlite3_close(db);
  PROBE_CHECK(rows == 1 && !r.cubin.empty(), "rows %d, cubin %zu bytes", rows, r.cubin.size());
  return r;
}

int probe_driver_change(const char *cache_dir, int step) {
  if (step < 0 || step >= int(std::size(kDriverSteps))) return kExitFail;
  const DriverStep &st = kDriverSteps[step];
  setenv("MOCK_CUDA_DRIVER_VERSION", st.version, 1);
  setenv("FLASHATTN_PTX_COMPILER", "off", 1);  // the driver-JIT path
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_CUDA;
  o.cache_dir = cache_dir;
  const fa_cache_stats cs = run_small_forward(o, std::atoi(st.version));
  std::printf("driver %s: misses %llu, disk hits %llu, compiles %llu, persistent %d\n", st.version,
              (unsigned long long)cs.misses, (unsigned long long)cs.disk_hits,
              (unsigned long long)cs.compiles, cs.persistent);
  PROBE_CHECK(cs.misses == st.misses && cs.disk_hits == st.disk_hits && cs.compiles == st.compiles,
              "driver %s: want misses %llu, disk hits %llu, compiles %llu", st.version,
              (unsigned long long)st.misses, (unsigned long long)st.disk_hits,
              (unsigned long long)st.compiles);
  PROBE_CHECK(cs.compiler_mode == FA_COMPILER_DRIVER_JIT, "compiler mode %d", cs.compiler_mode);
  // One row, recording the driver that built its binary.
  const OneRow row = read_one_row(cache_dir);
  PROBE_CHECK(row.driver_version == std::atoi(st.version) && row.compiler == "driver-jit",
              "driver_version %d, compiler '%s'", row.driver_version, row.compiler.c_str());
  return kExitPass;
}

// The PTX compiler plugin across processes sharing one cache (issue 25), on
// the mock driver with a fake plugin whose "cubin" is an ELF header and the
// PTX (the mock loads that without a JIT). Each step is its own process:
// the plugin choice, the driver version and what the driver refuses
// change between them. mock_cubin_loads / mock_ptx_loads count module loads
// (refused ones too); a PTX load is a JIT.
struct PtxcStep {
  const char *plugin;  // "fake", "fake2" (another compiler version), "off" (env), "option"
  const char *driver;  // MOCK_CUDA_DRIVER_VERSION
  const char *refuse;  // MOCK_CUDA_REFUSE_CUBIN: "0", or the CUresult for every cubin
  uint64_t misses, disk_hits, compiles, refusals;
  int mode;  // fa_compiler_mode
  int cubin_loads, ptx_loads;
  const char *row_compiler;
  bool row_is_cubin;
};
constexpr int kPlugin = FA_COMPILER_PLUGIN, kJit = FA_COMPILER_DRIVER_JIT;
const PtxcStep kPtxcSteps[] = {
    // cold miss: one compile, one module load (the cubin), no JIT
    {"fake", "12080", "0", 1, 0, 1, 0, kPlugin, 1, 0, "fake-ptxc 1.0", true},
    // warm: no compile, the stored cubin loaded, no JIT
    {"fake", "12080", "0", 0, 1, 0, 0, kPlugin, 1, 0, "fake-ptxc 1.0", true},
    // without the plugin (env or option) the stored cubin is still loaded as it is
    {"off", "12080", "0", 0, 1, 0, 0, kJit, 1, 0, "fake-ptxc 1.0", true},
    {"option", "12080", "0", 0, 1, 0, 0, kJit, 1, 0, "fake-ptxc 1.0", true},
    // the driver refuses it (another SM): the PTX is JIT-compiled, the row rewritten
    {"fake", "12080", "209", 0, 1, 1, 1, kPlugin, 1, 1,
     "driver-jit (cubin of fake-ptxc 1.0 refused)", false},
    // that row on the same driver: the PTX as it is, no compile, no cubin offered
    {"fake", "12080", "209", 0, 1, 0, 0, kPlugin, 0, 1,
     "driver-jit (cubin of fake-ptxc 1.0 refused)", false},
    // a driver update: the plugin's cubin again
    {"fake", "12090", "0", 0, 1, 1, 0, kPlugin, 1, 0, "fake-ptxc 1.0", true},
    // another compiler version: rebuilt
    {"fake2", "12090", "0", 0, 1, 1, 0, kPlugin, 1, 0, "fake-ptxc 2.0", true},
    // the cubin too new for the driver
    {"fake2", "12090", "222", 0, 1, 1, 1, kPlugin, 1, 1,
     "driver-jit (cubin of fake-ptxc 2.0 refused)", false},
    {"fake", "12090", "0", 0, 1, 1, 0, kPlugin, 1, 0, "fake-ptxc 1.0", true},
    // a damaged cubin, without the plugin: JIT, the row becomes a driver-JIT row
    {"off", "12090", "200", 0, 1, 1, 1, kJit, 1, 1, "driver-jit", false},
    {"off", "12090", "0", 0, 1, 0, 0, kJit, 0, 1, "driver-jit", false},
    // the plugin back: the driver-JIT row is rebuilt as a cubin
    {"fake", "12090", "0", 0, 1, 1, 0, kPlugin, 1, 0, "fake-ptxc 1.0", true},
};

int probe_ptxc_step(const char *cache_dir, const char *plugin_path, int step) {
  if (step < 0 || step >= int(std::size(kPtxcSteps))) return kExitFail;
  const PtxcStep &st = kPtxcSteps[step];
  const std::string plugin = st.plugin;
  setenv("MOCK_CUDA_DRIVER_VERSION", st.driver, 1);
  setenv("MOCK_CUDA_REFUSE_CUBIN", st.refuse, 1);
  setenv("FLASHATTN_PTX_COMPILER", plugin == "off" ? "off" : plugin_path, 1);
  if (plugin == "fake2") setenv("FAKE_PTXC_VERSION", "fake-ptxc 2.0", 1);
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_CUDA;
  o.cache_dir = cache_dir;
  if (plugin == "option") o.ptx_compiler = FA_PTX_COMPILER_OFF;
  const fa_cache_stats cs = run_small_forward(o, std::atoi(st.driver));
  std::printf("step %d (%s, driver %s, refuse %s): misses %llu, disk hits %llu, compiles %llu, "
              "refusals %llu, mode %d '%s' (%s)\n",
              step, st.plugin, st.driver, st.refuse, (unsigned long long)cs.misses,
              (unsigned long long)cs.disk_hits, (unsigned long long)cs.compiles,
              (unsigned long long)cs.cubin_refusals, cs.compiler_mode, cs.compiler,
              cs.compiler_note);
  PROBE_CHECK(cs.misses == st.misses && cs.disk_hits == st.disk_hits &&
                  cs.compiles == st.compiles && cs.cubin_refusals == st.refusals,
              "want misses %llu, disk hits %llu, compiles %llu, refusals %llu",
              (unsigned long long)st.misses, (unsigned long long)st.disk_hits,
              (unsigned long long)st.compiles, (unsigned long long)st.refusals);
  PROBE_CHECK(cs.compiler_mode == st.mode, "compiler mode %d, want %d", cs.compiler_mode, st.mode);
  if (st.mode == kPlugin) {
    PROBE_CHECK(std::strcmp(cs.compiler, plugin == "fake2" ? "fake-ptxc 2.0" : "fake-ptxc 1.0") ==
                        0 &&
                    cs.compiler_note[0] == '\0',
                "compiler '%s', note '%s'", cs.compiler, cs.compiler_note);
  } else {
    PROBE_CHECK(std::strcmp(cs.compiler, "driver-jit") == 0 &&
                    std::strstr(cs.compiler_note, "turned off") != nullptr,
                "compiler '%s', note '%s'", cs.compiler, cs.compiler_note);
  }
  const OneRow row = read_one_row(cache_dir);
  const bool elf = row.cubin.compare(0, 4, "\x7f" "ELF") == 0;
  PROBE_CHECK(row.compiler == st.row_compiler && elf == st.row_is_cubin,
              "row compiler '%s' (want '%s'), cubin %d", row.compiler.c_str(), st.row_compiler,
              int(elf));
  if (elf) {
    // The generated sm_90 forward is arch-specific PTX: compiled for sm_90a.
    PROBE_CHECK(contains(row.cubin, "// fake-ptxc target sm_90a"), "not built for sm_90a");
  } else {
    PROBE_CHECK(row.cubin == row.ptx + std::string(1, '\0'), "the binary is not the PTX and a NUL");
  }
  return kExitPass;
}

// Offline warming (fa_cache_warm, issue 25 item 3) with the fake plugin:
// "warm" fills `cache_dir` for sm_90 with run_small_forward's kernel, no
// driver call made (the mock counts none); "run_fake" / "run_off" then run
// that forward on the mock sm_90 with the plugin or without it: 0 misses,
// 0 compiles, the warmed cubin loaded as it is.
int probe_ptxc_warm(const char *cache_dir, const char *plugin_path, const std::string &step) {
  setenv("MOCK_CUDA_DRIVER_VERSION", "12080", 1);
  setenv("FLASHATTN_PTX_COMPILER", step == "run_off" ? "off" : plugin_path, 1);
  if (step == "warm") {
    fa_cache_warm_options w = FA_CACHE_WARM_OPTIONS_INIT;
    const int32_t sms[] = {90};
    w.cache_dir = cache_dir;
    w.sms = sms;
    w.num_sms = 1;
    w.specs = "forward dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2";
    fa_cache_warm_progress r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    PROBE_STATUS(FA_SUCCESS, fa_cache_warm(&w, &r));
    PROBE_CHECK(r.total == 1 && r.built == 1 && std::strcmp(r.compiler, "fake-ptxc 1.0") == 0,
                "total %llu, built %llu, compiler '%s'", (unsigned long long)r.total,
                (unsigned long long)r.built, r.compiler);
  } else {
    fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
    o.backend = FA_BACKEND_CUDA;
    o.cache_dir = cache_dir;
    const fa_cache_stats cs = run_small_forward(o, 12080);
    PROBE_CHECK(cs.misses == 0 && cs.disk_hits == 1 && cs.compiles == 0,
                "misses %llu, disk hits %llu, compiles %llu", (unsigned long long)cs.misses,
                (unsigned long long)cs.disk_hits, (unsigned long long)cs.compiles);
    PROBE_CHECK(cs.compiler_mode == (step == "run_off" ? kJit : kPlugin), "mode %d",
                cs.compiler_mode);
  }
  const OneRow row = read_one_row(cache_dir);
  PROBE_CHECK(row.compiler == "fake-ptxc 1.0" && row.driver_version == 0 &&
                  contains(row.cubin, "// fake-ptxc target sm_90a"),
              "row compiler '%s', driver %d", row.compiler.c_str(), row.driver_version);
  return kExitPass;
}

// FLASHATTN_PTX_COMPILER=`value`: the plugin is not used (a warning, and the
// note contains `why`); kernels still build through the driver's JIT.
int probe_ptxc_refused(const char *value, const char *why) {
  setenv("FLASHATTN_PTX_COMPILER", value, 1);
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_CUDA;
  o.cache_mode = FA_CACHE_MEMORY;
  const fa_cache_stats cs = run_small_forward(o, 12080);
  emit("compiler_note", cs.compiler_note);
  PROBE_CHECK(cs.compiler_mode == FA_COMPILER_DRIVER_JIT && cs.compiles == 1,
              "mode %d, compiles %llu", cs.compiler_mode, (unsigned long long)cs.compiles);
  PROBE_CHECK(contains(cs.compiler_note, why), "note '%s' lacks '%s'", cs.compiler_note, why);
  return kExitPass;
}

// A PTX the plugin rejects is FA_ERROR_COMPILE with its log, in the message
// and in *log; the driver is not asked to JIT it.
int probe_ptxc_compile_error(const char *plugin_path) {
  setenv("FLASHATTN_PTX_COMPILER", plugin_path, 1);
  auto b = gpu_backend();
  PROBE_CHECK(b->compiler().mode == FA_COMPILER_PLUGIN, "no plugin: %s", b->compiler().note.c_str());
  std::string bad = kVecAddPtx;
  bad.replace(bad.find("%r1"), 3, "%nosuchreg");
  std::vector<uint8_t> binary;
  std::string log;
  PROBE_STATUS(FA_ERROR_COMPILE, b->compile(bad, &binary, &log));
  emit("compile_error", fa::last_error());
  PROBE_CHECK(contains(fa::last_error(), "Unknown symbol '%nosuchreg'") && contains(log, "nosuchreg"),
              "message '%s', log '%s'", fa::last_error(), log.c_str());
  PROBE_CHECK(binary.empty(), "a binary after a failed compile");
  // The good PTX: a cubin for the device's own SM (sm_90: the mock's).
  PROBE_STATUS(FA_SUCCESS, b->compile(kVecAddPtx, &binary, &log));
  const std::string text(binary.begin(), binary.end());
  PROBE_CHECK(text.compare(0, 4, "\x7f" "ELF") == 0 && contains(text, "target sm_90\n"),
              "cubin of %zu bytes", binary.size());
  std::unique_ptr<fa::Kernel> kernel;
  PROBE_STATUS(FA_SUCCESS, b->load(kVecAddPtx, binary, "vec_add", 0, &kernel));
  return kExitPass;
}

// The real PTX compiler plugin on a real GPU (issue 25): the cubins it
// builds for the device's exact SM (vec_add, and on sm_90 the sm_90a
// whole-program form) are ELF images the installed driver loads as they are
// and that compute the right answer.
int probe_gpu_ptxc(const char *plugin_path) {
  setenv("FLASHATTN_PTX_COMPILER", plugin_path, 1);
  auto b = gpu_backend();
  PROBE_CHECK(b->compiler().mode == FA_COMPILER_PLUGIN, "no plugin: %s", b->compiler().note.c_str());
  emit("compiler", b->compiler().version);
  std::vector<std::string> ptxs = {kVecAddPtx};
  if (b->info().sm == 90) {
    std::string ptx = kVecAddPtx;
    const std::string from = ".version 7.0\n.target sm_52", to = ".version 8.0\n.target sm_90a";
    PROBE_CHECK(ptx.compare(0, from.size(), from) == 0, "unexpected vec_add header");
    ptxs.push_back(ptx.replace(0, from.size(), to));
  }
  for (const std::string &ptx : ptxs) {
    std::vector<uint8_t> binary;
    std::string log, used;
    PROBE_STATUS(FA_SUCCESS, b->compile(ptx, &binary, &log, fa::CompileWith::kBest, &used));
    PROBE_CHECK(used == b->compiler().version, "compiled by '%s'", used.c_str());
    PROBE_CHECK(fa::ptxc::is_cubin(binary), "not a cubin (%zu bytes)", binary.size());
    uint32_t flags = 0;
    std::memcpy(&flags, &binary[48], 4);
    PROBE_CHECK(int((flags >> 8) & 0xff) == b->info().sm, "cubin for sm_%u on sm_%d",
                (flags >> 8) & 0xff, b->info().sm);
    std::unique_ptr<fa::Kernel> kernel;
    PROBE_STATUS(FA_SUCCESS, b->load(ptx, binary, "vec_add", 0, &kernel));
    for (uint32_t n : {1u, 1000u, 65537u}) {
      const std::string e = run_vec_add(*b, *kernel, n, 0.5f);
      PROBE_CHECK(e.empty(), "plugin cubin vec_add: %s", e.c_str());
    }
  }
  return kExitPass;
}

// CUDA-graph safety (issue 11; docs/api.md): once a shape's kernels are
// loaded, fa_decode, fa_decode_reduce and fa_launch make no allocation, copy,
// memset, synchronisation or module load, and never read device data on the
// host: every such driver call while the mock is in capture mode is a
// violation. Covered: contiguous, paged (page_size 16 and 3) and
// pointer-array caches, seqlen_q 1 and 3, automatic, forced and
// batch-invariant splits; chunked prefill through a paged cache with
// seqused_k. The workspace size depends on host arguments only: the
// same before and after the device lengths change.
int probe_graph_safe() {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = FA_BACKEND_CUDA;
  o.cache_mode = FA_CACHE_MEMORY;
  fa_runtime *rt = nullptr;
  PROBE_STATUS(FA_SUCCESS, fa_runtime_create(&o, &rt));
  void *mock = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  PROBE_CHECK(mock != nullptr, "the mock driver is not loaded");
  auto capture = reinterpret_cast<void (*)(int)>(dlsym(mock, "mock_capture"));
  auto captured = reinterpret_cast<int (*)()>(dlsym(mock, "mock_captured_launches"));
  PROBE_CHECK(capture && captured, "mock without capture mode");
  const int batch = 3, hq = 8, hkv = 2, d = 128, skmax = 96, sq_max = 3;
  fa_config_desc cd = FA_CONFIG_DESC_INIT;
  cd.head_dim = d;
  cd.num_heads_q = hq;
  cd.num_heads_kv = hkv;
  cd.causal = 1;
  fa_config *cfg = nullptr;
  PROBE_STATUS(FA_SUCCESS, fa_config_create(&cd, &cfg));
  // Device buffers: Q/O for the largest seqlen_q, a contiguous cache, a page
  // pool large enough for page_size 3, tables, pointer arrays, lengths.
  auto alloc = [&](size_t bytes) {
    uint64_t p = 0;
    PROBE_STATUS(FA_SUCCESS, fa_malloc(rt, bytes, &p));
    return p;
  };
  const size_t row = size_t(hkv) * d;
  const uint64_t q = alloc(size_t(batch) * sq_max * hq * d * 2);
  const uint64_t out = alloc(size_t(batch) * sq_max * hq * d * 2);
  const uint64_t lse = alloc(size_t(batch) * sq_max * hq * 4);
  const uint64_t kc = alloc(size_t(batch) * skmax * row * 2);
  const uint64_t vc = alloc(size_t(batch) * skmax * row * 2);
  const int max_pages = skmax;  // page_size 1 would need this many
  const uint64_t table = alloc(size_t(batch) * max_pages * 4);
  const uint64_t ptrs = alloc(size_t(2) * batch * 8);
  const uint64_t lens = alloc(size_t(batch) * 4);
  std::vector<int32_t> host_table(size_t(batch) * max_pages);
  for (size_t i = 0; i < host_table.size(); ++i) host_table[i] = int32_t(i % (skmax / 3));
  PROBE_STATUS(FA_SUCCESS, fa_memcpy_htod(rt, table, host_table.data(), host_table.size() * 4));
  const uint64_t host_ptrs[6] = {kc, kc + skmax * row * 2, kc + 2 * skmax * row * 2,
                                 vc, vc + skmax * row * 2, vc + 2 * skmax * row * 2};
  PROBE_STATUS(FA_SUCCESS, fa_memcpy_htod(rt, ptrs, host_ptrs, sizeof host_ptrs));
  const int32_t host_lens[3] = {96, 1, 40};
  PROBE_STATUS(FA_SUCCESS, fa_memcpy_htod(rt, lens, host_lens, sizeof host_lens));
  auto bhsd = [](fa_tensor *t, uint64_t data, int64_t s, int64_t h, int64_t dd) {
    t->data = data;
    t->stride[0] = s * h * dd;
    t->stride[1] = h * dd;
    t->stride[2] = dd;
    t->stride[3] = 1;
  };
  struct DecodeVariant {
    int layout, page_size, seqlen_q, num_splits, invariant;
  };
  const DecodeVariant variants[] = {
      {FA_KV_CONTIGUOUS, 0, 1, 0, 0}, {FA_KV_CONTIGUOUS, 0, 3, 3, 0}, {FA_KV_PAGED, 16, 1, 0, 0},
      {FA_KV_PAGED, 3, 3, 0, 1},      {FA_KV_PTR_ARRAY, 0, 1, 2, 0},
  };
  const uint64_t ws_bytes = 1 << 20;
  const uint64_t ws = alloc(ws_bytes);
  auto decode_args = [&](const DecodeVariant &v) {
    fa_decode_args a = FA_DECODE_ARGS_INIT;
    a.batch = batch;
    a.seqlen_q = v.seqlen_q;
    a.seqlen_k_max = skmax;
    bhsd(&a.q, q, v.seqlen_q, hq, d);
    bhsd(&a.o, out, v.seqlen_q, hq, d);
    bhsd(&a.k_cache, kc, skmax, hkv, d);
    bhsd(&a.v_cache, vc, skmax, hkv, d);
    a.cache_seqlens = lens;
    a.num_splits = v.num_splits;
    a.lse = lse;
    a.workspace = ws;
    a.workspace_size = ws_bytes;
    a.batch_invariant = v.invariant;
    a.kv.layout = v.layout;
    if (v.layout == FA_KV_PAGED) {
      a.kv.page_size = v.page_size;
      a.kv.num_pages = skmax / 3;
      a.kv.max_pages_per_seq = (skmax + v.page_size - 1) / v.page_size;
      a.kv.block_table = table;
      a.kv.block_table_stride = max_pages;
      bhsd(&a.k_cache, kc, v.page_size, hkv, d);
      bhsd(&a.v_cache, vc, v.page_size, hkv, d);
    } else if (v.layout == FA_KV_PTR_ARRAY) {
      a.kv.k_ptrs = ptrs;
      a.kv.v_ptrs = ptrs + 3 * 8;
      a.k_cache.data = a.v_cache.data = 0;
      a.k_cache.stride[0] = a.v_cache.stride[0] = 0;
    }
    return a;
  };
  fa_forward_args f = FA_FORWARD_ARGS_INIT;
  f.batch = batch;
  f.seqlen_q = sq_max;
  f.seqlen_k = skmax;
  bhsd(&f.q, q, sq_max, hq, d);
  bhsd(&f.o, out, sq_max, hq, d);
  bhsd(&f.k, kc, 16, hkv, d);
  bhsd(&f.v, vc, 16, hkv, d);
  f.kv.layout = FA_KV_PAGED;
  f.kv.page_size = 16;
  f.kv.num_pages = skmax / 3;
  f.kv.max_pages_per_seq = skmax / 16;
  f.kv.block_table = table;
  f.kv.block_table_stride = max_pages;
  f.seqused_k = lens;
  f.lse = lse;
  // Every call twice: loads its kernels (outside capture), then in capture.
  int launches = 0;
  std::vector<size_t> ws_before;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      PROBE_STATUS(FA_SUCCESS, fa_synchronize(rt, nullptr));
      // Lengths change on the device between graph replays: nothing host-side may depend on them.
      const int32_t other[3] = {5, 96, 0};
      PROBE_STATUS(FA_SUCCESS, fa_memcpy_htod(rt, lens, other, sizeof other));
      capture(1);
    }
    size_t i = 0;
    for (const DecodeVariant &v : variants) {
      fa_decode_args a = decode_args(v);
      size_t bytes = 0;
      int32_t splits = 0;
      PROBE_STATUS(FA_SUCCESS, fa_decode_workspace_size(rt, cfg, &a, &bytes, &splits));
      PROBE_CHECK(bytes <= ws_bytes, "workspace %zu", bytes);
      if (pass == 0) ws_before.push_back(bytes);
      PROBE_CHECK(ws_before[i++] == bytes, "workspace size changed with device data");
      PROBE_STATUS(FA_SUCCESS, fa_decode(rt, cfg, &a, nullptr));
      // The partial states alone, then the combine on its own.
      a.o.data = 0;
      a.lse = 0;
      PROBE_STATUS(FA_SUCCESS, fa_decode(rt, cfg, &a, nullptr));
      // The workspace layout of docs/api.md: O_partial [splits, batch,
      // seqlen_q, hq, d] fp32, then LSE_partial [splits, batch, hq, seqlen_q]
      // at the next 256-byte boundary.
      fa_reduce_args r = FA_REDUCE_ARGS_INIT;
      const int64_t sq = v.seqlen_q;
      r.batch = batch;
      r.seqlen_q = v.seqlen_q;
      r.num_splits = splits;
      r.o_partial = ws;
      const int64_t os[5] = {batch * sq * hq * d, sq * hq * d, hq * d, d, 1};
      std::copy(os, os + 5, r.o_partial_stride);
      r.lse_partial = ws + (uint64_t(splits) * batch * sq * hq * d * 4 + 255) / 256 * 256;
      const int64_t ls[4] = {batch * hq * sq, hq * sq, sq, 1};
      std::copy(ls, ls + 4, r.lse_partial_stride);
      bhsd(&r.o, out, v.seqlen_q, hq, d);
      PROBE_STATUS(FA_SUCCESS, fa_decode_reduce(rt, cfg, &r, nullptr));
      launches += pass == 1 ? (splits > 1 ? 2 : 1) + 1 + 1 : 0;
    }
    PROBE_STATUS(FA_SUCCESS, fa_launch(rt, cfg, &f, nullptr));
    launches += pass == 1 ? 1 : 0;
  }
  capture(0);
  PROBE_STATUS(FA_SUCCESS, fa_synchronize(rt, nullptr));
  std::printf("captured launches %d (at least %d expected)\n", captured(), launches);
  PROBE_CHECK(captured() >= launches, "captured %d launches, want >= %d", captured(), launches);
  for (uint64_t b : {q, out, lse, kc, vc, table, ptrs, lens, ws})
    PROBE_STATUS(FA_SUCCESS, fa_free(rt, b));
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return kExitPass;
}

// The real PTX compiler plugin (libflashattn_ptxc.so built here), no GPU
// and no driver: the generated fp16 d128 forward for sm_80, sm_90 (sm_90a
// wgmma PTX) and sm_100 compiles whole-program into a cubin for exactly
// that SM, with no spills and no advisory (C7504 setmaxnreg ignored, C7509
// wgmma serialized: what relocatable code gets). Prints the compile time.
int probe_ptxc_real(const char *plugin_path) {
  setenv("FLASHATTN_PTX_COMPILER", plugin_path, 1);
  const fa::ptxc::PluginState &ps = fa::ptxc::plugin_state();
  PROBE_CHECK(ps.plugin != nullptr, "plugin not loaded: %s", ps.note.c_str());
  emit("version", ps.version);
  PROBE_CHECK(contains(ps.version, "nvPTXCompiler"), "version '%s'", ps.version.c_str());
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 128;
  d.num_heads_q = d.num_heads_kv = 8;
  fa_config *cfg = nullptr;
  PROBE_STATUS(FA_SUCCESS, fa_config_create(&d, &cfg));
  for (int sm : {80, 90, 100}) {
    size_t size = 0;
    PROBE_STATUS(FA_SUCCESS, fa_generate(cfg, FA_KERNEL_FORWARD, sm, nullptr, 0, &size));
    std::string ptx(size + 1, '\0');
    PROBE_STATUS(FA_SUCCESS, fa_generate(cfg, FA_KERNEL_FORWARD, sm, &ptx[0], ptx.size(), &size));
    ptx.resize(std::strlen(ptx.c_str()));
    const std::string target = fa::ptxc::cubin_target(ptx, sm);
    // sm_90a and sm_100a: the wgmma and tcgen05 forwards are architecture-specific.
    PROBE_CHECK(target == "sm_" + std::to_string(sm) + (sm == 80 ? "" : "a"), "target %s",
                target.c_str());
    std::vector<uint8_t> cubin;
    std::string log;
    const auto t0 = std::chrono::steady_clock::now();
    PROBE_STATUS(FA_SUCCESS, fa::ptxc::compile_cubin(ps.plugin, ptx, target, &cubin, &log));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %zu bytes of PTX -> %zu-byte cubin in %.0f ms\n%s\n", target.c_str(),
                ptx.size(), cubin.size(), ms, log.c_str());
    // ELF64, EM_CUDA (190), the SM in bits 8..15 of e_flags (CUDA's ELF ABI v8).
    PROBE_CHECK(cubin.size() > 64 && fa::ptxc::is_cubin(cubin) && cubin[4] == 2, "not ELF64");
    uint16_t machine = 0;
    uint32_t flags = 0;
    std::memcpy(&machine, &cubin[18], 2);
    std::memcpy(&flags, &cubin[48], 4);
    PROBE_CHECK(machine == 190 && int((flags >> 8) & 0xff) == sm, "e_machine %u, e_flags 0x%x",
                machine, flags);
    PROBE_CHECK(contains(log, ("for '" + target + "'").c_str()), "log names no target %s",
                target.c_str());
    PROBE_CHECK(contains(log, " 0 bytes spill stores, 0 bytes spill loads") &&
                    !contains(log, "advisory") && !contains(log, "warning"),
                "spills or advisories:\n%s", log.c_str());
  }
  // A rejected PTX is FA_ERROR_COMPILE with ptxas's message; an SM the
  // compiler does not know is UNSUPPORTED (the backend then JITs).
  std::vector<uint8_t> cubin;
  std::string log;
  std::string bad = kVecAddPtx;
  bad.replace(bad.find("%r1"), 3, "%nosuchreg");
  PROBE_STATUS(FA_ERROR_COMPILE, fa::ptxc::compile_cubin(ps.plugin, bad, "sm_80", &cubin, &log));
  PROBE_CHECK(contains(log, "nosuchreg"), "log: %s", log.c_str());
  PROBE_STATUS(FA_ERROR_UNSUPPORTED,
               fa::ptxc::compile_cubin(ps.plugin, kVecAddPtx, "sm_999", &cubin, &log));
  fa_config_destroy(cfg);
  return kExitPass;
}

int probe_main(int argc, char **argv) {
  alarm(300);  // a hung driver call ends the child, and the parent reports it
  const std::string name = argv[2];
  int rc = kExitFail;
  if (name == "create") {
    rc = probe_create(argc > 3 ? std::atoi(argv[3]) : 0);
  } else if (name == "vec_add") {
    rc = probe_vec_add();
  } else if (name == "big_smem") {
    rc = probe_big_smem();
  } else if (name == "fault") {
    rc = probe_fault();
  } else if (name == "errors") {
    rc = probe_errors();
  } else if (name == "threads") {
    rc = probe_threads();
  } else if (name == "lifetime") {
    rc = probe_lifetime();
  } else if (name == "whole_program") {
    rc = probe_whole_program();
  } else if (name == "graph_safe") {
    rc = probe_graph_safe();
  } else if (name == "driver_change" && argc > 4) {
    rc = probe_driver_change(argv[3], std::atoi(argv[4]));
  } else if (name == "ptxc_step" && argc > 5) {
    rc = probe_ptxc_step(argv[3], argv[4], std::atoi(argv[5]));
  } else if (name == "ptxc_warm" && argc > 5) {
    rc = probe_ptxc_warm(argv[3], argv[4], argv[5]);
  } else if (name == "ptxc_refused" && argc > 4) {
    rc = probe_ptxc_refused(argv[3], argv[4]);
  } else if (name == "gpu_ptxc" && argc > 3) {
    rc = probe_gpu_ptxc(argv[3]);
  } else if (name == "ptxc_compile_error" && argc > 3) {
    rc = probe_ptxc_compile_error(argv[3]);
  } else if (name == "ptxc_real" && argc > 3) {
    rc = probe_ptxc_real(argv[3]);
  } else {
    std::printf("unknown probe %s\n", name.c_str());
  }
  emit_mock_counters();
  return rc;
}

// ---------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------

struct ProbeResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;
  std::map<std::string, std::string> values;

  std::string get(const std::string &key) const {
    auto it = values.find(key);
    return it == values.end() ? std::string() : it->second;
  }
};

// Runs this program with `--probe args...` (ld_library_path, when set, put
// first on LD_LIBRARY_PATH) and collects its output.
ProbeResult run_probe(const std::vector<std::string> &args, const char *ld_library_path) {
  ProbeResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    result.output = "pipe failed";
    return result;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[1]);
    if (ld_library_path != nullptr) {
      // Ahead of the rest: the fake or mock libcuda.so.1 is found first, the
      // libraries the test itself needs (a carried libcmocka) still are.
      const char *old = std::getenv("LD_LIBRARY_PATH");
      const std::string path =
          std::string(ld_library_path) + (old && old[0] ? std::string(":") + old : "");
      setenv("LD_LIBRARY_PATH", path.c_str(), 1);
    }
    std::vector<std::string> storage = {"test_cuda_backend", "--probe"};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (auto &s : storage) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    result.output = "fork failed";
    return result;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) result.output.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  size_t pos = 0;
  while (pos < result.output.size()) {
    size_t end = result.output.find('\n', pos);
    if (end == std::string::npos) end = result.output.size();
    std::string line = result.output.substr(pos, end - pos);
    if (line.compare(0, 6, "probe:") == 0) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) result.values[line.substr(6, eq - 6)] = line.substr(eq + 1);
    }
    pos = end + 1;
  }
  return result;
}

// Fails the test (printing the child's output) unless it exited 0; skips
// it on 77.
void expect_probe_passed(const ProbeResult &r) {
  if (r.exit_code == kExitSkip) {
    std::printf("%s", r.output.c_str());
    skip();
  }
  if (r.exit_code != kExitPass) {
    std::printf("probe output:\n%s\n", r.output.c_str());
    if (r.signal != 0) fail_msg("probe killed by signal %d (%s)", r.signal, strsignal(r.signal));
    fail_msg("probe exited with %d", r.exit_code);
  }
}

// Shared by every test: what the ambient driver said, detected once.
struct State {
  ProbeResult ambient;
  bool have_gpu = false;
  bool built_without_cuda_h = false;
  std::string reason;  // why there is no GPU
};

int group_setup(void **state) {
  auto *s = new State;
  s->ambient = run_probe({"create", "0"}, nullptr);
  s->have_gpu = s->ambient.exit_code == 0 && s->ambient.get("status1") == "0";
  s->reason = s->ambient.get("message1");
  s->built_without_cuda_h = contains(s->reason, "built without cuda.h");
  *state = s;
  return 0;
}

int group_teardown(void **state) {
  delete static_cast<State *>(*state);
  return 0;
}

State &st(void **state) { return *static_cast<State *>(*state); }

// GPU tests call this first.
void require_gpu(void **state) {
  if (!st(state).have_gpu) {
    std::printf("no CUDA driver: %s\n", st(state).reason.c_str());
    skip();
  }
}

// --- tests without a GPU ----------------------------------------------------

// The ambient driver: no GPU here gives NO_DRIVER/NO_DEVICE with a readable
// message, the same on the second (call_once) call; a GPU gives sane info.
void test_create_reports_status_twice(void **state) {
  const ProbeResult &r = st(state).ambient;
  if (r.exit_code != 0) {
    std::printf("%s\n", r.output.c_str());
    fail_msg("create probe exited %d, signal %d", r.exit_code, r.signal);
  }
  const std::string s1 = r.get("status1"), m1 = r.get("message1");
  std::printf("create_cuda_backend(0): status %s, message \"%s\"\n", s1.c_str(), m1.c_str());
  assert_string_equal(s1.c_str(), r.get("status2").c_str());
  if (s1 == "0") {
    assert_string_equal(r.get("kind").c_str(), "1");
    assert_true(!r.get("name").empty());
    assert_true(std::atoi(r.get("sm").c_str()) >= 50);
    assert_true(std::atoi(r.get("num_sms").c_str()) > 0);
    assert_true(std::atol(r.get("smem_optin").c_str()) >= 48 * 1024);
    assert_true(std::atoi(r.get("driver_version").c_str()) >= 12000);
    std::printf("device: %s sm_%s, %s SMs, driver %s\n", r.get("name").c_str(), r.get("sm").c_str(),
                r.get("num_sms").c_str(), r.get("driver_version").c_str());
    return;
  }
  const int status = std::atoi(s1.c_str());
  assert_true(status == FA_ERROR_NO_DRIVER || status == FA_ERROR_NO_DEVICE);
  assert_true(m1.size() > 20);
  assert_string_equal(m1.c_str(), r.get("message2").c_str());
  if (status == FA_ERROR_NO_DRIVER) {
    assert_true(contains(m1, "libcuda.so.1") || contains(m1, "built without cuda.h") ||
                contains(m1, "driver"));
  }
}

// A device ordinal nobody has is NO_DEVICE (or NO_DRIVER without a driver).
void test_create_bad_ordinal(void **state) {
  ProbeResult r = run_probe({"create", "4096"}, nullptr);
  assert_int_equal(r.exit_code, 0);
  const int status = std::atoi(r.get("status1").c_str());
  if (st(state).have_gpu) {
    assert_int_equal(status, FA_ERROR_NO_DEVICE);
    assert_true(contains(r.get("message1"), "4096"));
  } else {
    assert_true(status == FA_ERROR_NO_DRIVER || status == FA_ERROR_NO_DEVICE);
  }
  assert_true(!r.get("message1").empty());
}

// The fake libcuda.so.1 variants: C source of each.
struct Fake {
  const char *name;
  bool has_gpa;         // exports cuGetProcAddress(_v2)
  int version;          // cuDriverGetVersion
  int init_result;      // cuInit
  const char *missing;  // entry point cuGetProcAddress does not find
  int device;           // ordinal the probe asks for
  int want_status;
  const char *want_text;  // must appear in the message
};

std::string fake_source(const Fake &f) {
  std::string src;
  src += "#define FAKE_HAS_GPA " + std::to_string(f.has_gpa ? 1 : 0) + "\n";
  src += "#define FAKE_VERSION " + std::to_string(f.version) + "\n";
  src += "#define FAKE_INIT_RESULT " + std::to_string(f.init_result) + "\n";
  src += std::string("#define FAKE_MISSING \"") + f.missing + "\"\n";
  src += R"(
#include <stdio.h>
#include <string.h>
typedef int CUresult;
#define EXPORT __attribute__((visibility("default")))
EXPORT CUresult cuDriverGetVersion(int *v) { *v = FAKE_VERSION; return 0; }
EXPORT CUresult cuInit(unsigned flags) { (void)flags; return FAKE_INIT_RESULT; }
static CUresult device_count(int *n) { *n = 1; return 0; }
static CUresult error_name(CUresult r, const char **s) {
  *s = r == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_FAKE";
  return 0;
}
static CUresult error_string(CUresult r, const char **s) {
  *s = r == 100 ? "no CUDA-capable device is detected" : "fake";
  return 0;
}
static CUresult unexpected(void) {
  fprintf(stderr, "fake libcuda: unexpected call\n");
  return 999;
}
#if FAKE_HAS_GPA
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags, int *status) {
  (void)version;
  (void)flags;
  *pfn = 0;
  if (FAKE_MISSING[0] && strcmp(symbol, FAKE_MISSING) == 0) {
    if (status) *status = 1;
    return 500;
  }
  if (!strcmp(symbol, "cuDriverGetVersion")) *pfn = (void *)cuDriverGetVersion;
  else if (!strcmp(symbol, "cuInit")) *pfn = (void *)cuInit;
  else if (!strcmp(symbol, "cuDeviceGetCount")) *pfn = (void *)device_count;
  else if (!strcmp(symbol, "cuGetErrorName")) *pfn = (void *)error_name;
  else if (!strcmp(symbol, "cuGetErrorString")) *pfn = (void *)error_string;
  else *pfn = (void *)unexpected;
  if (status) *status = 0;
  return 0;
}
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags) {
  int status = 0;
  return cuGetProcAddress_v2(symbol, pfn, version, flags, &status);
}
#endif
)";
  return src;
}

bool have_cc() { return std::system("cc --version > /dev/null 2>&1") == 0; }

// Builds FA_TEST_BINARY_DIR/fake_libcuda/NAME/libcuda.so.1; returns its
// directory, or "" (with the reason printed) when it cannot.
std::string build_fake(const Fake &f) {
  std::string root = std::string(FA_TEST_BINARY_DIR) + "/fake_libcuda";
  std::string dir = root + "/" + f.name;
  mkdir(root.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::string src = dir + "/fake.c";
  FILE *file = std::fopen(src.c_str(), "w");
  if (file == nullptr) {
    std::printf("cannot write %s\n", src.c_str());
    return "";
  }
  std::string text = fake_source(f);
  std::fwrite(text.data(), 1, text.size(), file);
  std::fclose(file);
  std::string cmd = "cc -shared -fPIC -o '" + dir + "/libcuda.so.1' '" + src + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::printf("'%s' failed\n", cmd.c_str());
    return "";
  }
  return dir;
}

// Skips the fake-driver tests where they cannot say anything.
void require_fake_prerequisites(void **state) {
  if (st(state).built_without_cuda_h) {
    std::printf("built without cuda.h: the loader is not compiled in\n");
    skip();
  }
  if (!have_cc()) {
    std::printf("no C compiler (cc) to build a fake libcuda.so.1\n");
    skip();
  }
}

void run_fake(void **state, const Fake &f) {
  require_fake_prerequisites(state);
  std::string dir = build_fake(f);
  assert_false(dir.empty());
  ProbeResult r = run_probe({"create", std::to_string(f.device)}, dir.c_str());
  std::printf("fake libcuda '%s': status %s, message \"%s\"\n", f.name, r.get("status1").c_str(),
              r.get("message1").c_str());
  if (r.exit_code != 0) {
    std::printf("%s\n", r.output.c_str());
    fail_msg("probe exited %d, signal %d", r.exit_code, r.signal);
  }
  assert_int_equal(std::atoi(r.get("status1").c_str()), f.want_status);
  assert_string_equal(r.get("status1").c_str(), r.get("status2").c_str());
  assert_string_equal(r.get("message1").c_str(), r.get("message2").c_str());
  if (!contains(r.get("message1"), f.want_text)) {
    fail_msg("message \"%s\" does not mention \"%s\"", r.get("message1").c_str(), f.want_text);
  }
  // The message names the library that was loaded.
  assert_true(contains(r.get("message1"), "libcuda.so.1") || f.want_status == FA_ERROR_NO_DEVICE);
}

void test_fake_driver_without_get_proc_address(void **state) {
  run_fake(state, {"no_gpa", false, 12080, 0, "", 0, FA_ERROR_NO_DRIVER, "cuGetProcAddress"});
}

void test_fake_driver_too_old(void **state) {
  run_fake(state, {"old", true, 9000, 0, "", 0, FA_ERROR_NO_DRIVER, "9.0 (9000)"});
}

void test_fake_driver_missing_entry_point(void **state) {
  run_fake(state, {"missing", true, 12020, 0, "cuModuleLoadDataEx", 0, FA_ERROR_NO_DRIVER,
                   "cuModuleLoadDataEx (not found)"});
}

void test_fake_driver_no_device(void **state) {
  run_fake(state, {"no_device", true, 12080, 100, "", 0, FA_ERROR_NO_DEVICE,
                   "cuInit failed: CUDA_ERROR_NO_DEVICE"});
}

void test_fake_driver_bad_ordinal(void **state) {
  run_fake(state, {"ordinal", true, 12080, 0, "", 3, FA_ERROR_NO_DEVICE,
                   "device 3 requested, but the driver sees 1 device"});
}

// The CUDA toolkit ships a stub libcuda.so for linking; loaded as the driver
// it answers CUDA_ERROR_STUB_LIBRARY to everything.
void test_toolkit_stub_library(void **state) {
  require_fake_prerequisites(state);
  std::string ptxas = FA_PTXAS_PATH;
  std::string stub;
  if (!ptxas.empty()) {
    std::string root = ptxas.substr(0, ptxas.rfind('/'));  // .../bin
    root = root.substr(0, root.rfind('/'));
    for (const char *rel : {"/lib64/stubs/libcuda.so", "/targets/x86_64-linux/lib/stubs/libcuda.so",
                            "/targets/sbsa-linux/lib/stubs/libcuda.so"}) {
      if (access((root + rel).c_str(), R_OK) == 0) {
        stub = root + rel;
        break;
      }
    }
  }
  if (stub.empty()) {
    std::printf("no CUDA toolkit stub libcuda.so found next to ptxas ('%s')\n", ptxas.c_str());
    skip();
  }
  std::string root = std::string(FA_TEST_BINARY_DIR) + "/fake_libcuda";
  std::string dir = root + "/stub";
  mkdir(root.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::string link = dir + "/libcuda.so.1";
  unlink(link.c_str());
  assert_int_equal(symlink(stub.c_str(), link.c_str()), 0);
  ProbeResult r = run_probe({"create", "0"}, dir.c_str());
  std::printf("stub libcuda: status %s, message \"%s\"\n", r.get("status1").c_str(),
              r.get("message1").c_str());
  assert_int_equal(r.exit_code, 0);
  assert_int_equal(std::atoi(r.get("status1").c_str()), FA_ERROR_NO_DRIVER);
  assert_true(contains(r.get("message1"), "stub"));
  assert_string_equal(r.get("message1").c_str(), r.get("message2").c_str());
}

// The PTX the GPU tests JIT must assemble (ptxas), so a GPU run does not
// discover a typo in the test itself.
void test_test_kernels_assemble(void **state) {
  (void)state;
  const std::string ptxas = FA_PTXAS_PATH;
  if (ptxas.empty() || access(ptxas.c_str(), X_OK) != 0) {
    std::printf("no ptxas\n");
    skip();
  }
  const std::string dir = std::string(FA_TEST_BINARY_DIR) + "/cuda_backend_ptx";
  mkdir(dir.c_str(), 0755);
  struct {
    const char *name;
    const char *text;
    bool valid;
  } modules[] = {{"vec_add", kVecAddPtx, true},
                 {"smem", kSmemPtx, true},
                 {"fault", kFaultPtx, true},
                 {"bad", kBadPtx, false}};
  for (const auto &m : modules) {
    const std::string path = dir + "/" + m.name + ".ptx";
    FILE *f = std::fopen(path.c_str(), "w");
    assert_non_null(f);
    std::fputs(m.text, f);
    std::fclose(f);
    for (const char *arch : {"sm_75", "sm_80", "sm_90"}) {
      const std::string cmd = "'" + ptxas + "' -arch=" + arch + " '" + path + "' -o '" + path +
                              "." + arch + ".cubin' > '" + path + ".log' 2>&1";
      const int rc = std::system(cmd.c_str());
      if ((rc == 0) != m.valid) fail_msg("ptxas %s on %s: exit %d", arch, m.name, rc);
    }
  }
}

// --- the backend against the mock driver (no GPU needed) ---------------------

// Runs `probe` against the mock libcuda.so.1 and checks that it passed and
// that the backend drove the driver correctly (no violations, balanced
// push/pop, primary context released, modules unloaded).
ProbeResult run_on_mock(void **state, const std::vector<std::string> &probe,
                        bool modules_unloaded) {
  require_fake_prerequisites(state);
  static std::string dir;  // built once per test process
  if (dir.empty()) {
    const std::string root = std::string(FA_TEST_BINARY_DIR) + "/fake_libcuda";
    const std::string d = root + "/mock";
    mkdir(root.c_str(), 0755);
    mkdir(d.c_str(), 0755);
    FILE *f = std::fopen((d + "/mock.c").c_str(), "w");
    assert_non_null(f);
    std::fputs(kMockDriverSource, f);
    std::fclose(f);
    const std::string cmd =
        "cc -shared -fPIC -pthread -o '" + d + "/libcuda.so.1' '" + d + "/mock.c'";
    assert_int_equal(std::system(cmd.c_str()), 0);
    dir = d;
  }
  ProbeResult r = run_probe(probe, dir.c_str());
  expect_probe_passed(r);
  if (r.get("mock_violations") != "0" || r.get("mock_depth") != "0" ||
      r.get("mock_refcount") != "0" || (modules_unloaded && r.get("mock_live_modules") != "0")) {
    std::printf("%s\n", r.output.c_str());
    fail_msg("mock driver: %s violations, context depth %s, primary refcount %s, %s live modules",
             r.get("mock_violations").c_str(), r.get("mock_depth").c_str(),
             r.get("mock_refcount").c_str(), r.get("mock_live_modules").c_str());
  }
  return r;
}

void test_mock_vec_add(void **state) { run_on_mock(state, {"vec_add"}, true); }
void test_mock_dynamic_smem_above_48k(void **state) { run_on_mock(state, {"big_smem"}, true); }
// After the sticky error the mock refuses cuModuleUnload, as a real driver does.
void test_mock_fault_poisons_backend(void **state) { run_on_mock(state, {"fault"}, false); }
void test_mock_error_paths_and_memory(void **state) { run_on_mock(state, {"errors"}, true); }
void test_mock_threads_share_backend(void **state) { run_on_mock(state, {"threads"}, true); }
void test_mock_driver_change_rebuilds_cubin(void **state) {
  const std::string dir = std::string(FA_TEST_BINARY_DIR) + "/cuda_driver_change";
  std::system(("rm -rf '" + dir + "'").c_str());
  mkdir(dir.c_str(), 0755);
  for (size_t step = 0; step < std::size(kDriverSteps); ++step) {
    const ProbeResult r = run_on_mock(state, {"driver_change", dir, std::to_string(step)}, true);
    std::printf("%s", r.output.c_str());
    assert_string_equal(r.get("mock_attention_launches").c_str(), "1");
    // One JIT per process: a compile's module is the one load() uses.
    assert_string_equal(r.get("mock_ptx_loads").c_str(), "1");
    assert_string_equal(r.get("mock_cubin_loads").c_str(), "0");
  }
}

void test_mock_kernel_outlives_backend(void **state) { run_on_mock(state, {"lifetime"}, true); }

// Builds the fake plugin as `name` (mode 0755) in its own directory (0755)
// under the test binary directory; returns its path.
std::string fake_plugin(const char *name, const char *cflags = "") {
  const std::string d = std::string(FA_TEST_BINARY_DIR) + "/fake_ptxc";
  mkdir(d.c_str(), 0755);
  chmod(d.c_str(), 0755);
  const std::string src = d + "/fake_ptxc.c", so = d + "/" + name;
  FILE *f = std::fopen(src.c_str(), "w");
  assert_non_null(f);
  std::fputs(kFakePluginSource, f);
  std::fclose(f);
  const std::string cmd = std::string("cc -shared -fPIC ") + cflags + " -o '" + so + "' '" + src + "'";
  assert_int_equal(std::system(cmd.c_str()), 0);
  assert_int_equal(chmod(so.c_str(), 0755), 0);
  return so;
}

// Issue 25 on the mock driver: a cold miss compiles once and loads once (no
// JIT), a warm process compiles nothing and loads the stored cubin, and a
// cubin the driver refuses (209 another SM, 222 too new, 200 damaged) falls
// back to the PTX with the row rewritten (kPtxcSteps).
void test_mock_ptx_compiler_plugin_cache(void **state) {
  const std::string plugin = fake_plugin("libfake_ptxc.so");
  const std::string dir = std::string(FA_TEST_BINARY_DIR) + "/cuda_ptxc_cache";
  std::system(("rm -rf '" + dir + "'").c_str());
  mkdir(dir.c_str(), 0700);
  for (size_t step = 0; step < std::size(kPtxcSteps); ++step) {
    const PtxcStep &st = kPtxcSteps[step];
    const ProbeResult r = run_on_mock(state, {"ptxc_step", dir, plugin, std::to_string(step)}, true);
    std::printf("%s", r.output.c_str());
    assert_string_equal(r.get("mock_attention_launches").c_str(), "1");
    assert_int_equal(std::atoi(r.get("mock_cubin_loads").c_str()), st.cubin_loads);
    assert_int_equal(std::atoi(r.get("mock_ptx_loads").c_str()), st.ptx_loads);
    assert_string_equal(r.get("mock_links").c_str(), "0");
  }
}

// A cache warmed offline with the plugin (fa_cache_warm, no GPU) serves a
// process on the GPU with 0 compiles and no JIT, with the plugin and
// without it (driver-JIT mode loads plugin cubins as they are).
void test_mock_ptx_compiler_plugin_warm(void **state) {
  const std::string plugin = fake_plugin("libfake_ptxc.so");
  const std::string dir = std::string(FA_TEST_BINARY_DIR) + "/cuda_ptxc_warm";
  std::system(("rm -rf '" + dir + "'").c_str());
  mkdir(dir.c_str(), 0700);
  // Warming loads no driver: none is on the library path.
  const ProbeResult w = run_probe({"ptxc_warm", dir, plugin, "warm"}, nullptr);
  std::printf("warm: %s", w.output.c_str());
  expect_probe_passed(w);
  for (const char *step : {"run_fake", "run_off"}) {
    const ProbeResult r = run_on_mock(state, {"ptxc_warm", dir, plugin, step}, true);
    std::printf("%s: %s", step, r.output.c_str());
    assert_string_equal(r.get("mock_attention_launches").c_str(), "1");
    assert_string_equal(r.get("mock_cubin_loads").c_str(), "1");
    assert_string_equal(r.get("mock_ptx_loads").c_str(), "0");
  }
}

// A plugin that the trust rules or its ABI refuse gives a warning and the
// driver-JIT path, never a failed launch.
void test_mock_ptx_compiler_plugin_refused(void **state) {
  const std::string good = fake_plugin("libfake_ptxc.so");
  const std::string d = std::string(FA_TEST_BINARY_DIR) + "/fake_ptxc";
  struct Case {
    std::string value, why;
  };
  std::vector<Case> cases = {
      {"off", "turned off by FLASHATTN_PTX_COMPILER=off"},
      {"0", "turned off by FLASHATTN_PTX_COMPILER=0"},
      {"fake_ptxc/libfake_ptxc.so", "not an absolute path"},
      {d + "/missing.so", "cannot open"},
      {fake_plugin("libfake_abi2.so", "-DFAKE_ABI=2"), "has ABI version 2"},
  };
  const std::string world = fake_plugin("libfake_world.so");
  assert_int_equal(chmod(world.c_str(), 0757), 0);
  cases.push_back({world, "writable by others (mode 0757)"});
  const std::string link = d + "/libfake_link.so";
  unlink(link.c_str());
  assert_int_equal(symlink(good.c_str(), link.c_str()), 0);
  cases.push_back({link, "a symbolic link (never followed)"});
  // A directory others may write (someone could swap the file).
  const std::string open_dir = std::string(FA_TEST_BINARY_DIR) + "/fake_ptxc_open";
  mkdir(open_dir.c_str(), 0777);
  assert_int_equal(chmod(open_dir.c_str(), 0777), 0);
  const std::string in_open = open_dir + "/libfake_ptxc.so";
  std::system(("cp '" + good + "' '" + in_open + "'").c_str());
  cases.push_back({in_open, "the directory of the library is writable by others"});
  if (geteuid() == 0) {
    // Another owner (only root can make one) and a foreign group's write bit.
    const std::string other = fake_plugin("libfake_other.so");
    assert_int_equal(chown(other.c_str(), 1, 1), 0);
    cases.push_back({other, "owned by uid 1"});
    const std::string group = fake_plugin("libfake_group.so");
    assert_int_equal(chown(group.c_str(), 0, 1), 0);
    assert_int_equal(chmod(group.c_str(), 0775), 0);
    cases.push_back({group, "writable by group 1"});
  }
  for (const Case &c : cases) {
    const ProbeResult r = run_on_mock(state, {"ptxc_refused", c.value, c.why}, true);
    std::printf("%s: %s\n", c.value.c_str(), r.get("compiler_note").c_str());
    // The compile of the one kernel was the driver's JIT, its module reused.
    assert_string_equal(r.get("mock_ptx_loads").c_str(), "1");
    assert_string_equal(r.get("mock_cubin_loads").c_str(), "0");
  }
}

void test_mock_ptx_compiler_plugin_compile_error(void **state) {
  const ProbeResult r =
      run_on_mock(state, {"ptxc_compile_error", fake_plugin("libfake_ptxc.so")}, true);
  std::printf("%s\n", r.get("compile_error").c_str());
  // The rejected PTX never reached the driver; the good one loaded as a cubin.
  assert_string_equal(r.get("mock_ptx_loads").c_str(), "0");
  assert_string_equal(r.get("mock_cubin_loads").c_str(), "1");
}

// The real plugin: $FA_TEST_PTXC_PLUGIN (a packed build on the GPU
// machine), else the one this build made (FA_BUILD_PTXC), else "".
std::string real_plugin_path() {
  const char *env = std::getenv("FA_TEST_PTXC_PLUGIN");
  return env != nullptr && env[0] != '\0' ? env : FA_PTXC_PLUGIN_PATH;
}

void test_real_ptx_compiler_plugin(void **) {
  const std::string plugin = real_plugin_path();
  struct stat st;
  if (plugin.empty() || stat(plugin.c_str(), &st) != 0) {
    std::printf("no PTX compiler plugin in this build (tools/setup.sh fetches its library)\n");
    skip();
  }
  const ProbeResult r = run_probe({"ptxc_real", plugin}, nullptr);
  std::printf("%s", r.output.c_str());
  expect_probe_passed(r);
}

void test_mock_whole_program_sm90a(void **state) {
  const ProbeResult r = run_on_mock(state, {"whole_program"}, true);
  // compile JITs the PTX for sm_90a once and load takes that module; the
  // refused binary never reaches the driver; nothing went through cuLink.
  assert_string_equal(r.get("mock_links").c_str(), "0");
  assert_string_equal(r.get("mock_accelerated_loads").c_str(), "1");
}

void test_mock_launch_path_is_graph_safe(void **state) {
  const ProbeResult r = run_on_mock(state, {"graph_safe"}, true);
  std::printf("%s", r.output.c_str());
}

// --- tests with a GPU -------------------------------------------------------

void test_gpu_vec_add(void **state) {
  require_gpu(state);
  expect_probe_passed(run_probe({"vec_add"}, nullptr));
}

void test_gpu_whole_program_sm90a(void **state) {
  require_gpu(state);
  const ProbeResult r = run_probe({"whole_program"}, nullptr);
  expect_probe_passed(r);
  std::printf("%s\n", r.get("whole_program_jit_log").c_str());
}

void test_gpu_ptx_compiler_plugin(void **state) {
  require_gpu(state);
  const std::string plugin = real_plugin_path();
  struct stat st;
  if (plugin.empty() || stat(plugin.c_str(), &st) != 0) {
    std::printf("no PTX compiler plugin (set FA_TEST_PTXC_PLUGIN)\n");
    skip();
  }
  const ProbeResult r = run_probe({"gpu_ptxc", plugin}, nullptr);
  std::printf("%s\n", r.get("compiler").c_str());
  expect_probe_passed(r);
}

void test_gpu_dynamic_smem_above_48k(void **state) {
  require_gpu(state);
  expect_probe_passed(run_probe({"big_smem"}, nullptr));
}

void test_gpu_fault_poisons_backend(void **state) {
  require_gpu(state);
  ProbeResult r = run_probe({"fault"}, nullptr);
  std::printf("fault: %s\nlater: %s\n", r.get("fault_message").c_str(),
              r.get("poisoned_message").c_str());
  expect_probe_passed(r);
}

void test_gpu_error_paths_and_memory(void **state) {
  require_gpu(state);
  ProbeResult r = run_probe({"errors"}, nullptr);
  std::printf("compile error: %s\n", r.get("compile_error").c_str());
  expect_probe_passed(r);
}

void test_gpu_threads_share_backend(void **state) {
  require_gpu(state);
  expect_probe_passed(run_probe({"threads"}, nullptr));
}

}  // namespace

int main(int argc, char **argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--probe") == 0) return probe_main(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_reports_status_twice),
      cmocka_unit_test(test_create_bad_ordinal),
      cmocka_unit_test(test_fake_driver_without_get_proc_address),
      cmocka_unit_test(test_fake_driver_too_old),
      cmocka_unit_test(test_fake_driver_missing_entry_point),
      cmocka_unit_test(test_fake_driver_no_device),
      cmocka_unit_test(test_fake_driver_bad_ordinal),
      cmocka_unit_test(test_toolkit_stub_library),
      cmocka_unit_test(test_test_kernels_assemble),
      cmocka_unit_test(test_mock_vec_add),
      cmocka_unit_test(test_mock_dynamic_smem_above_48k),
      cmocka_unit_test(test_mock_fault_poisons_backend),
      cmocka_unit_test(test_mock_error_paths_and_memory),
      cmocka_unit_test(test_mock_threads_share_backend),
      cmocka_unit_test(test_mock_kernel_outlives_backend),
      cmocka_unit_test(test_mock_driver_change_rebuilds_cubin),
      cmocka_unit_test(test_mock_launch_path_is_graph_safe),
      cmocka_unit_test(test_mock_whole_program_sm90a),
      cmocka_unit_test(test_mock_ptx_compiler_plugin_cache),
      cmocka_unit_test(test_mock_ptx_compiler_plugin_warm),
      cmocka_unit_test(test_mock_ptx_compiler_plugin_refused),
      cmocka_unit_test(test_mock_ptx_compiler_plugin_compile_error),
      cmocka_unit_test(test_real_ptx_compiler_plugin),
      cmocka_unit_test(test_gpu_vec_add),
      cmocka_unit_test(test_gpu_whole_program_sm90a),
      cmocka_unit_test(test_gpu_ptx_compiler_plugin),
      cmocka_unit_test(test_gpu_dynamic_smem_above_48k),
      cmocka_unit_test(test_gpu_fault_poisons_backend),
      cmocka_unit_test(test_gpu_error_paths_and_memory),
      cmocka_unit_test(test_gpu_threads_share_backend),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
