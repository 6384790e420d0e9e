/*
 * The C ABI between libflashattn and its PTX compiler plugin
 * (libflashattn_ptxc.so, built from NVIDIA's static PTX compiler library
 * nvPTXCompiler; see src/ptxc/README.md). libflashattn dlopens the plugin
 * and looks up these four symbols; nothing else is exported. No C++
 * exception crosses this interface. A plugin whose fa_ptxc_abi_version()
 * differs from FA_PTXC_ABI_VERSION is not used.
 */
#ifndef FA_PTXC_H
#define FA_PTXC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FA_PTXC_ABI_VERSION 1

/* fa_ptxc_compile's results. */
#define FA_PTXC_OK 0
#define FA_PTXC_ERROR_COMPILE 1     /* the PTX was rejected; *log says why */
#define FA_PTXC_ERROR_UNSUPPORTED 2 /* PTX ISA version or target this compiler does not know */
#define FA_PTXC_ERROR_INVALID 3     /* a null or empty argument, a target that is not sm_NN[a|f] */
#define FA_PTXC_ERROR_INTERNAL 4    /* out of memory, or the compiler failed internally */

/* FA_PTXC_ABI_VERSION of the plugin. */
int fa_ptxc_abi_version(void);

/* What a cubin's bytes depend on, as a static NUL-terminated string naming
 * the compiler library and its version and the options every compile uses,
 * e.g. "nvPTXCompiler 13.0 (nvidia-nvptxcompiler 13.0.88) -O3". Two
 * compiles of the same PTX for the same target by plugins with the same
 * string give the same cubin. */
const char *fa_ptxc_compiler_version(void);

/* Compiles `ptx_size` bytes of PTX text (a trailing NUL optional) into a
 * cubin for `target` ("sm_80", "sm_90a", "sm_100a", ...), whole-program
 * (never relocatable), -O3. Needs no GPU and no driver. On FA_PTXC_OK
 * *cubin / *cubin_size hold the ELF image. *log (may be NULL on return)
 * holds the error log then the info log (registers, spills, advisories).
 * *cubin and *log are released with fa_ptxc_free. Thread-safe. */
int fa_ptxc_compile(const char *ptx, size_t ptx_size, const char *target, void **cubin,
                    size_t *cubin_size, char **log);

/* Frees what fa_ptxc_compile returned; NULL is a no-op. */
void fa_ptxc_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* FA_PTXC_H */
