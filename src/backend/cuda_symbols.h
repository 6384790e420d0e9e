// The one table of CUDA driver entry points flashattn uses (X-macro).
//
// Every entry is fetched through cuGetProcAddress at the API version in its
// last column, so the driver hands back the ABI variant matching the PFN type
// named here (e.g. cuMemAlloc at 12000 is cuMemAlloc_v2, whose PFN is
// PFN_cuMemAlloc_v3020; cuCtxSynchronize at 12000 is the argument-less one,
// not CUDA 13's cuCtxSynchronize(CUcontext)). The PFN types come from
// cudaTypedefs.h and carry the version in which that ABI appeared.
//
// Columns: X(member, PFN type, requirement, api version)
//   member       the entry's name without the "cu" prefix (the string passed
//                to cuGetProcAddress is "cu" #member; the prefix is dropped so
//                cuda.h's #define cuMemAlloc cuMemAlloc_v2 cannot rename it)
//   requirement  kRequired: a missing entry is FA_ERROR_NO_DRIVER;
//                kOptional: a missing entry leaves the pointer null
//   api version  the cudaVersion argument of cuGetProcAddress
//
// Only include after <cuda.h> and <cudaTypedefs.h> (see cuda_driver.h).
#pragma once

// Pinned driver API: CUDA 12.0. Drivers older than this are refused.
#define FA_CUDA_API_VERSION 12000

#define FA_CUDA_SYMBOLS_BASE(X)                                                                    \
  X(GetErrorName, PFN_cuGetErrorName_v6000, kRequired, FA_CUDA_API_VERSION)                        \
  X(GetErrorString, PFN_cuGetErrorString_v6000, kRequired, FA_CUDA_API_VERSION)                    \
  X(Init, PFN_cuInit_v2000, kRequired, FA_CUDA_API_VERSION)                                        \
  X(DriverGetVersion, PFN_cuDriverGetVersion_v2020, kRequired, FA_CUDA_API_VERSION)                \
  X(DeviceGetCount, PFN_cuDeviceGetCount_v2000, kRequired, FA_CUDA_API_VERSION)                    \
  X(DeviceGet, PFN_cuDeviceGet_v2000, kRequired, FA_CUDA_API_VERSION)                              \
  X(DeviceGetName, PFN_cuDeviceGetName_v2000, kRequired, FA_CUDA_API_VERSION)                      \
  X(DeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000, kRequired, FA_CUDA_API_VERSION)            \
  X(DevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000, kRequired, FA_CUDA_API_VERSION)    \
  X(DevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000, kRequired, FA_CUDA_API_VERSION) \
  X(CtxPushCurrent, PFN_cuCtxPushCurrent_v4000, kRequired, FA_CUDA_API_VERSION)                    \
  X(CtxPopCurrent, PFN_cuCtxPopCurrent_v4000, kRequired, FA_CUDA_API_VERSION)                      \
  X(ModuleLoadDataEx, PFN_cuModuleLoadDataEx_v2010, kRequired, FA_CUDA_API_VERSION)                \
  X(ModuleUnload, PFN_cuModuleUnload_v2000, kRequired, FA_CUDA_API_VERSION)                        \
  X(ModuleGetFunction, PFN_cuModuleGetFunction_v2000, kRequired, FA_CUDA_API_VERSION)              \
  X(FuncGetAttribute, PFN_cuFuncGetAttribute_v2020, kRequired, FA_CUDA_API_VERSION)                \
  X(FuncSetAttribute, PFN_cuFuncSetAttribute_v9000, kRequired, FA_CUDA_API_VERSION)                \
  X(LaunchKernel, PFN_cuLaunchKernel_v4000, kRequired, FA_CUDA_API_VERSION)                        \
  /* Programmatic dependent launches (LaunchGeometry::programmatic). */                            \
  X(LaunchKernelEx, PFN_cuLaunchKernelEx_v11060, kOptional, FA_CUDA_API_VERSION)                   \
  X(MemAlloc, PFN_cuMemAlloc_v3020, kRequired, FA_CUDA_API_VERSION)                                \
  X(MemFree, PFN_cuMemFree_v3020, kRequired, FA_CUDA_API_VERSION)                                  \
  X(MemcpyHtoD, PFN_cuMemcpyHtoD_v3020, kRequired, FA_CUDA_API_VERSION)                            \
  X(MemcpyDtoH, PFN_cuMemcpyDtoH_v3020, kRequired, FA_CUDA_API_VERSION)                            \
  X(MemsetD8, PFN_cuMemsetD8_v3020, kRequired, FA_CUDA_API_VERSION)                                \
  X(StreamSynchronize, PFN_cuStreamSynchronize_v2000, kRequired, FA_CUDA_API_VERSION)              \
  /* For the sm_90 path (TMA descriptors); null on drivers without it. */                          \
  X(TensorMapEncodeTiled, PFN_cuTensorMapEncodeTiled_v12000, kOptional, FA_CUDA_API_VERSION)

// Entries newer than the pinned API, fetched at their own version. They only
// exist in cudaTypedefs.h from that CUDA release on, so older headers drop them.
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12040
#define FA_CUDA_SYMBOLS_12040(X)                                         \
  /* Size of a kernel's parameter block, checked against each launch. */ \
  X(FuncGetParamInfo, PFN_cuFuncGetParamInfo_v12040, kOptional, 12040)
#else
#define FA_CUDA_SYMBOLS_12040(X)
#endif

#define FA_CUDA_SYMBOLS(X) \
  FA_CUDA_SYMBOLS_BASE(X)  \
  FA_CUDA_SYMBOLS_12040(X)
