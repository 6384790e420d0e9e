// Loads libcuda.so.1 once and resolves the symbol table of cuda_symbols.h.
#include "backend/cuda_driver.h"

#if FA_CUDA_BACKEND

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace fa {
namespace cuda {
namespace {

constexpr const char *kLibraryName = "libcuda.so.1";

// cuGetProcAddress as the driver exports it. CUDA 12.0+ drivers export
// "cuGetProcAddress_v2" (5 arguments, reports why a lookup failed); CUDA 11.3+
// drivers export "cuGetProcAddress" (4 arguments). cuda.h renames the
// function-style name to the _v2 symbol, so both are spelled out here.
using GetProcAddressV2 = CUresult(CUDAAPI *)(const char *symbol, void **pfn, int cuda_version,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *status);
using GetProcAddressV1 = CUresult(CUDAAPI *)(const char *symbol, void **pfn, int cuda_version,
                                             cuuint64_t flags);

// Process-wide outcome of the one load attempt.
struct Loader {
  Driver driver;
  fa_status status = FA_ERROR_INTERNAL;
  std::string message;
  GetProcAddressV2 gpa_v2 = nullptr;
  GetProcAddressV1 gpa_v1 = nullptr;
};

// "12.8 (12080)" for a cuDriverGetVersion value.
std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10) + " (" +
         std::to_string(v) + ")";
}

// Fetches `symbol` at API `version` through cuGetProcAddress with the legacy
// default-stream variants (a NULL stream is the legacy stream, as documented
// in flashattn.h). Returns null and explains why in *why when it is absent.
void *fetch(const Loader &l, const char *symbol, int version, std::string *why) {
  void *fn = nullptr;
  CUresult r;
  CUdriverProcAddressQueryResult query = CU_GET_PROC_ADDRESS_SUCCESS;
  if (l.gpa_v2) {
    r = l.gpa_v2(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &query);
  } else {
    r = l.gpa_v1(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  }
  if (r == CUDA_SUCCESS && query == CU_GET_PROC_ADDRESS_SUCCESS && fn != nullptr) return fn;
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    *why = "the library is the CUDA toolkit's stub (CUDA_ERROR_STUB_LIBRARY), not a driver";
  } else if (query == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) {
    *why = "only in API versions newer than " + std::to_string(version);
  } else if (query == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND || r == CUDA_ERROR_NOT_FOUND ||
             (r == CUDA_SUCCESS && fn == nullptr)) {
    *why = "not found";
  } else {
    *why = "cuGetProcAddress returned CUresult " + std::to_string(static_cast<int>(r));
  }
  return nullptr;
}

// The file a dlopen handle resolved to ("" if unknown).
std::string library_path(void *handle) {
  struct link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return kLibraryName;
}

// Records a failure in the loader; returns false so callers can `return fail_load(...)`.
bool fail_load(Loader *l, fa_status status, std::string message) {
  l->status = status;
  l->message = std::move(message);
  return false;
}

// Maps a cuInit failure to a status: no device, an unusable driver, or other.
fa_status init_status(CUresult r) {
  switch (static_cast<int>(r)) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
      return FA_ERROR_NO_DEVICE;
    case CUDA_ERROR_STUB_LIBRARY:
    case 36:  // CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER (newer headers)
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return FA_ERROR_NO_DRIVER;
    default:
      return FA_ERROR_CUDA;
  }
}

// The one load attempt: dlopen, cuGetProcAddress, version check, symbol
// table, cuInit. Fills l->status/message; true on success.
bool load(Loader *l) {
  // Never dlclose'd: the driver stays loaded for the life of the process
  // (contexts and modules may outlive any one runtime).
  void *handle = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *err = dlerror();
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     std::string("cannot load the CUDA driver: ") + (err ? err : kLibraryName) +
                         " (install the NVIDIA driver, or use the emulator backend)");
  }
  Driver &cu = l->driver;
  cu.path = library_path(handle);

  l->gpa_v2 = reinterpret_cast<GetProcAddressV2>(dlsym(handle, "cuGetProcAddress_v2"));
  if (l->gpa_v2 == nullptr) {
    l->gpa_v1 = reinterpret_cast<GetProcAddressV1>(dlsym(handle, "cuGetProcAddress"));
  }
  if (l->gpa_v2 == nullptr && l->gpa_v1 == nullptr) {
    std::string reported;
    auto get_version =
        reinterpret_cast<PFN_cuDriverGetVersion_v2020>(dlsym(handle, "cuDriverGetVersion"));
    int v = 0;
    if (get_version != nullptr && get_version(&v) == CUDA_SUCCESS && v > 0) {
      reported = " (it reports CUDA " + version_text(v) + ")";
    }
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     cu.path + " exports neither cuGetProcAddress_v2 nor cuGetProcAddress" +
                         reported + ": flashattn needs a CUDA " +
                         version_text(FA_CUDA_API_VERSION) + " or newer driver");
  }

  // Version first, so an old driver is named as such rather than by the
  // first entry point it lacks.
  std::string why;
  auto get_version = reinterpret_cast<PFN_cuDriverGetVersion_v2020>(
      fetch(*l, "cuDriverGetVersion", FA_CUDA_API_VERSION, &why));
  if (get_version == nullptr) {
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     cu.path + ": cannot resolve cuDriverGetVersion (" + why + ")");
  }
  CUresult r = get_version(&cu.version);
  if (r != CUDA_SUCCESS) {
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     cu.path + ": cuDriverGetVersion failed with CUresult " +
                         std::to_string(static_cast<int>(r)));
  }
  if (cu.version < FA_CUDA_API_VERSION) {
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     cu.path + " is a CUDA " + version_text(cu.version) +
                         " driver; flashattn needs CUDA " + version_text(FA_CUDA_API_VERSION) +
                         " or newer: update the NVIDIA driver");
  }

  // The whole table; every required entry that is missing is named.
  std::string missing;
#define FA_CUDA_FETCH(member, pfn, requirement, version)                                        \
  {                                                                                             \
    std::string reason;                                                                         \
    cu.member = reinterpret_cast<pfn>(fetch(*l, "cu" #member, version, &reason));               \
    if (cu.member == nullptr && requirement == kRequired) {                                     \
      missing += (missing.empty() ? "" : ", ") + std::string("cu" #member " (") + reason + ")"; \
    }                                                                                           \
  }
  FA_CUDA_SYMBOLS(FA_CUDA_FETCH)
#undef FA_CUDA_FETCH
  if (!missing.empty()) {
    return fail_load(l, FA_ERROR_NO_DRIVER,
                     cu.path + " (CUDA " + version_text(cu.version) +
                         " driver) lacks entry points flashattn needs at API version " +
                         std::to_string(FA_CUDA_API_VERSION) + ": " + missing);
  }

  r = cu.Init(0);
  if (r != CUDA_SUCCESS) {
    std::string message = "cuInit failed: " + result_text(cu, r);
    if (r == CUDA_ERROR_NO_DEVICE) {
      const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
      if (visible != nullptr) message += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")";
    }
    return fail_load(l, init_status(r), message);
  }
  l->status = FA_SUCCESS;
  return true;
}

}  // namespace

fa_status load_driver(const Driver **out) {
  static Loader loader;
  static std::once_flag once;
  std::call_once(once, [] { load(&loader); });
  if (loader.status != FA_SUCCESS) return fail(loader.status, "%s", loader.message.c_str());
  *out = &loader.driver;
  return FA_SUCCESS;
}

std::string result_name(const Driver &cu, CUresult r) {
  const char *name = nullptr;
  if (cu.GetErrorName != nullptr && cu.GetErrorName(r, &name) == CUDA_SUCCESS && name) {
    return name;
  }
  return "CUresult " + std::to_string(static_cast<int>(r));
}

std::string result_text(const Driver &cu, CUresult r) {
  std::string text = result_name(cu, r);
  const char *description = nullptr;
  if (cu.GetErrorString != nullptr && cu.GetErrorString(r, &description) == CUDA_SUCCESS &&
      description) {
    text += std::string(" (") + description + ")";
  }
  return text;
}

bool is_sticky(CUresult r) {
  switch (static_cast<int>(r)) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:      // 214
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:   // 220
    case 226:                               // CUDA_ERROR_CONTAINED (CUDA 12.4+ headers)
    case CUDA_ERROR_ILLEGAL_ADDRESS:        // 700
    case CUDA_ERROR_LAUNCH_TIMEOUT:         // 702
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:   // 709
    case CUDA_ERROR_ASSERT:                 // 710
    case CUDA_ERROR_HARDWARE_STACK_ERROR:   // 714
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:    // 715
    case CUDA_ERROR_MISALIGNED_ADDRESS:     // 716
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:  // 717
    case CUDA_ERROR_INVALID_PC:             // 718
    case CUDA_ERROR_LAUNCH_FAILED:          // 719
    case 721:                               // CUDA_ERROR_TENSOR_MEMORY_LEAK (CUDA 12.8+)
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:  // 810
    case CUDA_ERROR_EXTERNAL_DEVICE:        // 911
      return true;
    default:
      return false;
  }
}

bool is_compile_error(CUresult r) {
  switch (r) {
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_JIT_COMPILATION_DISABLED:
    case CUDA_ERROR_INVALID_SOURCE:
    case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND:
      return true;
    default:
      return false;
  }
}

}  // namespace cuda
}  // namespace fa

#endif  // FA_CUDA_BACKEND
