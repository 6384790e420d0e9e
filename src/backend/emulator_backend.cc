// Placeholder until the emulator backend lands.
#include "backend/backend.h"
#include "common/error.h"

namespace fa {
fa_status create_emulator_backend(int, std::unique_ptr<Backend> *) {
  return fail(FA_ERROR_UNSUPPORTED, "emulator backend not built yet");
}
}  // namespace fa
