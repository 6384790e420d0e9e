// Host-side validation of a tiled tensor map description (backend.h).
#pragma once

#include "backend/backend.h"

namespace fa {

// FA_SUCCESS when `d` satisfies cuTensorMapEncodeTiled's rules for the
// maps flashattn makes; else FA_ERROR_INVALID_ARGUMENT with the rule broken.
fa_status check_tensor_map_desc(const TensorMapDesc &d);

}  // namespace fa
