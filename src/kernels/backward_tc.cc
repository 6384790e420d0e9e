// The backward's main kernel on mma.sync (sm_80+): FlashAttention-2's
// Algorithm 2 (Dao, 2023, section 3.1). (Being written.)
#include "kernels/codegen.h"

namespace fa {
namespace kgen {

std::string generate_backward(const KernelSpec &) { return {}; }
uint32_t backward_smem(const KernelSpec &) { return 0; }

}  // namespace kgen
}  // namespace fa
