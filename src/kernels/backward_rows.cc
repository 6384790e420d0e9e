// The backward's per-row kernels (BackwardPre, BackwardPost). (Being written.)
#include "kernels/codegen.h"

namespace fa {
namespace kgen {

std::string generate_backward_rows(const KernelSpec &) { return {}; }

}  // namespace kgen
}  // namespace fa
