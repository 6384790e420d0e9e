// Run-time loading of the CUDA driver (libcuda.so.1) and CUresult helpers.
//
// libcuda.so.1 is dlopen'ed once per process (std::call_once); every entry
// point of cuda_symbols.h is fetched through cuGetProcAddress at its pinned
// API version. A missing, stub or too old driver becomes FA_ERROR_NO_DRIVER
// and a missing device FA_ERROR_NO_DEVICE, each with a readable message;
// nothing here crashes when the driver is absent. Only built with cuda.h.
#pragma once

#if FA_HAVE_CUDA_H
#include <cuda.h>
// The pinned API needs CUDA 12.0 headers (CUdriverProcAddressQueryResult,
// cuGetProcAddress_v2); older ones build the library without the backend.
#if CUDA_VERSION >= 12000
#define FA_CUDA_BACKEND 1
#endif
#endif

#if FA_CUDA_BACKEND

#include <cudaTypedefs.h>

#include <string>

#include "backend/cuda_symbols.h"
#include "flashattn.h"

namespace fa {
namespace cuda {

enum Requirement { kRequired, kOptional };

// The resolved entry points; immutable once load_driver() succeeded.
struct Driver {
#define FA_CUDA_MEMBER(member, pfn, requirement, version) pfn member = nullptr;
  FA_CUDA_SYMBOLS(FA_CUDA_MEMBER)
#undef FA_CUDA_MEMBER
  int version = 0;   // cuDriverGetVersion, e.g. 12080
  std::string path;  // file libcuda.so.1 resolved to
};

// Loads and initialises the driver (dlopen, symbol table, version check,
// cuInit) the first time it is called; later calls return the same outcome.
// On success *out points to the process-wide table. On failure returns
// FA_ERROR_NO_DRIVER, FA_ERROR_NO_DEVICE or FA_ERROR_CUDA and records the
// message with fa::fail(). Thread-safe.
fa_status load_driver(const Driver **out);

// "CUDA_ERROR_NAME (description)" for r, or "CUresult N" when the driver
// cannot name it.
std::string result_text(const Driver &cu, CUresult r);
// "CUDA_ERROR_NAME", or "CUresult N".
std::string result_name(const Driver &cu, CUresult r);

// True for the errors the driver documents as leaving the context (or the
// process) unusable: every later call returns the same error.
bool is_sticky(CUresult r);

// True for the errors that mean the PTX or binary itself was rejected.
bool is_compile_error(CUresult r);

}  // namespace cuda
}  // namespace fa

#endif  // FA_CUDA_BACKEND
