/* libflashattn_ptxc.so: the PTX compiler plugin (fa_ptxc.h) over NVIDIA's
 * static PTX compiler library (libnvptxcompiler_static.a, nvPTXCompiler.h
 * from the nvidia-nvptxcompiler wheel). Whole-program compilation for the
 * exact target: no --compile-only, so setmaxnreg and wgmma pipelining are
 * kept (relocatable code would drop both). */
#include <nvPTXCompiler.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_ptxc.h"

#define EXPORT __attribute__((visibility("default")))

#ifndef FA_PTXC_WHEEL_VERSION
#define FA_PTXC_WHEEL_VERSION "unknown"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

EXPORT int fa_ptxc_abi_version(void) { return FA_PTXC_ABI_VERSION; }

EXPORT const char *fa_ptxc_compiler_version(void) {
  /* Static: the library's own major.minor is read once (it never changes
   * within a process); the wheel's full version comes from the build. */
  static char text[128];
  static int done;
  if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
    unsigned major = 0, minor = 0;
    char buf[128];
    if (nvPTXCompilerGetVersion(&major, &minor) != NVPTXCOMPILE_SUCCESS) major = minor = 0;
    snprintf(buf, sizeof buf, "nvPTXCompiler %u.%u (nvidia-nvptxcompiler %s) -O3", major, minor,
             FA_PTXC_WHEEL_VERSION);
    /* Every thread computes the same text: a benign race. */
    memcpy(text, buf, sizeof buf);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
  }
  return text;
}

/* sm_NN, sm_NNN, optionally followed by 'a' or 'f'. */
static int valid_target(const char *t) {
  if (strncmp(t, "sm_", 3) != 0) return 0;
  const char *p = t + 3;
  int digits = 0;
  while (*p >= '0' && *p <= '9') ++p, ++digits;
  if (digits < 2 || digits > 3) return 0;
  if (*p == 'a' || *p == 'f') ++p;
  return *p == '\0';
}

/* Whether this compiler knows SM `sm` (nvPTXCompilerGetSupportedArchs,
 * since CUDA 13.1; with an older library the compile itself says). */
static int supported_sm(int sm) {
#ifndef FA_PTXC_HAVE_SUPPORTED_ARCHS
  (void)sm;
  return 1;
#else
  int n = 0;
  if (nvPTXCompilerGetNumSupportedArchs(&n) != NVPTXCOMPILE_SUCCESS || n <= 0 || n > 4096) return 1;
  int *archs = malloc(sizeof(int) * (size_t)n);
  if (archs == NULL) return 1;
  int found = 0;
  if (nvPTXCompilerGetSupportedArchs(archs) == NVPTXCOMPILE_SUCCESS) {
    for (int i = 0; i < n && !found; ++i) found = archs[i] == sm;
  } else {
    found = 1;  /* cannot tell: let the compile decide */
  }
  free(archs);
  return found;
#endif
}

/* The error log, then the info log, as one malloc'ed string (NULL if both
 * are empty or memory ran out). */
static char *logs_of(nvPTXCompilerHandle h) {
  size_t err = 0, info = 0;
  if (nvPTXCompilerGetErrorLogSize(h, &err) != NVPTXCOMPILE_SUCCESS) err = 0;
  if (nvPTXCompilerGetInfoLogSize(h, &info) != NVPTXCOMPILE_SUCCESS) info = 0;
  if (err + info == 0) return NULL;
  char *out = malloc(err + info + 2);
  if (out == NULL) return NULL;
  size_t n = 0;
  if (err > 0 && nvPTXCompilerGetErrorLog(h, out) == NVPTXCOMPILE_SUCCESS) {
    n = strnlen(out, err);
    if (n > 0 && info > 0) out[n++] = '\n';
  }
  if (info > 0 && nvPTXCompilerGetInfoLog(h, out + n) == NVPTXCOMPILE_SUCCESS) {
    n += strnlen(out + n, info);
  }
  out[n] = '\0';
  return out;
}

EXPORT int fa_ptxc_compile(const char *ptx, size_t ptx_size, const char *target, void **cubin,
                           size_t *cubin_size, char **log) {
  if (cubin) *cubin = NULL;
  if (cubin_size) *cubin_size = 0;
  if (log) *log = NULL;
  if (!ptx || !target || !cubin || !cubin_size || !log) return FA_PTXC_ERROR_INVALID;
  while (ptx_size > 0 && ptx[ptx_size - 1] == '\0') --ptx_size;
  if (ptx_size == 0 || !valid_target(target)) return FA_PTXC_ERROR_INVALID;

  /* A target this compiler does not know (a GPU newer than the plugin):
   * UNSUPPORTED, so the caller falls back to the driver's JIT. */
  if (!supported_sm(atoi(target + 3))) return FA_PTXC_ERROR_UNSUPPORTED;

  char gpu_name[32];
  snprintf(gpu_name, sizeof gpu_name, "--gpu-name=%s", target);
  /* Whole-program (the default; never --compile-only), -O3, verbose info
   * log (registers, spills per function), warnings kept. */
  const char *options[] = {gpu_name, "-O3", "--verbose"};
  nvPTXCompilerHandle h = NULL;
  nvPTXCompileResult r = nvPTXCompilerCreate(&h, ptx_size, ptx);
  if (r != NVPTXCOMPILE_SUCCESS) {
    return r == NVPTXCOMPILE_ERROR_OUT_OF_MEMORY ? FA_PTXC_ERROR_INTERNAL : FA_PTXC_ERROR_INVALID;
  }
  r = nvPTXCompilerCompile(h, (int)(sizeof options / sizeof options[0]), options);
  *log = logs_of(h);
  int status = FA_PTXC_OK;
  if (r == NVPTXCOMPILE_SUCCESS) {
    size_t size = 0;
    void *image = NULL;
    if (nvPTXCompilerGetCompiledProgramSize(h, &size) != NVPTXCOMPILE_SUCCESS || size == 0 ||
        (image = malloc(size)) == NULL ||
        nvPTXCompilerGetCompiledProgram(h, image) != NVPTXCOMPILE_SUCCESS) {
      free(image);
      status = FA_PTXC_ERROR_INTERNAL;
    } else {
      *cubin = image;
      *cubin_size = size;
    }
  } else if (r == NVPTXCOMPILE_ERROR_COMPILATION_FAILURE) {
    /* A library without nvPTXCompilerGetSupportedArchs names an unknown
     * target only in its log: "Value 'sm_NNN' is not defined for option
     * 'gpu-name'". */
    status = *log && strstr(*log, "is not defined for option 'gpu-name'") ? FA_PTXC_ERROR_UNSUPPORTED
                                                                           : FA_PTXC_ERROR_COMPILE;
  } else if (r == NVPTXCOMPILE_ERROR_UNSUPPORTED_PTX_VERSION) {
    status = FA_PTXC_ERROR_UNSUPPORTED;
  } else if (r == NVPTXCOMPILE_ERROR_INVALID_INPUT) {
    status = FA_PTXC_ERROR_COMPILE;  /* an unknown option value: the target */
  } else {
    status = FA_PTXC_ERROR_INTERNAL;
  }
  nvPTXCompilerDestroy(&h);
  return status;
}

EXPORT void fa_ptxc_free(void *p) { free(p); }
