// Placeholder until the cuda backend lands.
#include "backend/backend.h"
#include "common/error.h"

namespace fa {
fa_status create_cuda_backend(int, std::unique_ptr<Backend> *) {
  return fail(FA_ERROR_NO_DRIVER, "cuda backend not built yet");
}
}  // namespace fa
