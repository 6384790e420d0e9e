// Published per-SM limits of the targets (no device needed).
#include "kernels/launch.h"

namespace fa {

bool published_limits(int sm, DeviceLimits *out) {
  struct Row {
    int sm;
    uint32_t smem_kb, threads;
  };
  static const Row rows[] = {{80, 164, 2048},  {86, 100, 1536},  {87, 164, 1536},  {89, 100, 1536},
                             {90, 228, 2048},  {100, 228, 2048}, {103, 228, 2048}, {110, 228, 1536},
                             {120, 100, 1536}, {121, 100, 1536}};
  for (const Row &r : rows) {
    if (r.sm != sm) continue;
    out->sm = sm;
    out->smem_per_sm = r.smem_kb * 1024;
    out->smem_per_block_optin = out->smem_per_sm - 1024;
    out->regs_per_sm = 65536;
    out->threads_per_sm = r.threads;
    return true;
  }
  return false;
}

}  // namespace fa
