// What a kernel needs to know of a launch and of a device, without knowing
// any backend: the launch geometry a generator computes and the device
// limits tiles are sized from. kernels/ depends on this, ptx/ and tile/ only;
// backend/backend.h includes it for the backends.
#pragma once

#include <cstdint>

namespace fa {

struct LaunchGeometry {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t smem_bytes = 0;  // dynamic shared memory (.extern .shared)
  // Programmatic dependent launch (CUDA driver API, "Programmatic Dependent
  // Launch and Synchronization"): the grid may start before the stream's
  // previous kernel has completed; the kernel runs griddepcontrol.wait
  // before it touches global memory (KernelSpec::pdl).
  bool programmatic = false;
};

// What a device offers one kernel: CUDA device attributes read from the
// driver or, without a device (fa_generate, the emulator), the SM's published
// limits. Kernel tiles are chosen from these, never from the SM number.
struct DeviceLimits {
  int sm = 80;                        // compute capability * 10 + minor
  uint32_t smem_per_block_optin = 0;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
  uint32_t smem_per_sm = 0;           // ..._MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
  uint32_t regs_per_sm = 65536;       // ..._MAX_REGISTERS_PER_MULTIPROCESSOR
  uint32_t threads_per_sm = 2048;     // ..._MAX_THREADS_PER_MULTIPROCESSOR
};

// The published limits of the SMs flashattn targets: 80, 86, 87, 89, 90,
// 100, 103, 110, 120, 121 (CUDA C++ Programming Guide, "Technical
// Specifications per Compute Capability": shared memory per SM, 1 KB of it
// reserved per block, resident threads, 64K registers). False for any other.
bool published_limits(int sm, DeviceLimits *out);

}  // namespace fa
