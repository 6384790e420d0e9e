// Host-side rules of a tiled tensor map, shared by both backends
// (cuTensorMapEncodeTiled's requirements, CUDA Driver API reference).
#include "backend/tensor_map.h"

#include "common/error.h"

namespace fa {

fa_status check_tensor_map_desc(const TensorMapDesc &d) {
  if (d.rank < 1 || d.rank > 5)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: rank %u outside 1..5", d.rank);
  if (d.elem_bytes != 2 && d.elem_bytes != 1)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: %u-byte elements (1 or 2 expected)",
                d.elem_bytes);
  if (d.base % 16)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: base address not 16-byte aligned");
  if (d.strides[0] != d.elem_bytes)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: dimension 0 is not contiguous");
  for (uint32_t i = 0; i < d.rank; ++i) {
    if (d.dims[i] < 1 || d.dims[i] > (uint64_t(1) << 32))
      return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: dimension %u size %llu outside 1..2^32",
                  i, static_cast<unsigned long long>(d.dims[i]));
    if (d.box[i] < 1 || d.box[i] > 256)
      return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: box[%u] = %u outside 1..256", i,
                  d.box[i]);
    if (i > 0 && (d.strides[i] % 16 || d.strides[i] >= (uint64_t(1) << 40)))
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "tensor map: stride of dimension %u (%llu bytes) is not a multiple of 16 "
                  "below 2^40",
                  i, static_cast<unsigned long long>(d.strides[i]));
  }
  if (d.box[0] * d.elem_bytes % 16)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: inner box not a multiple of 16 bytes");
  if (d.swizzle != 0 && d.swizzle != 3)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: swizzle mode %u (0 or 3)", d.swizzle);
  if (d.swizzle == 3 && d.box[0] * d.elem_bytes > 128)
    return fail(FA_ERROR_INVALID_ARGUMENT, "tensor map: a 128B-swizzled inner box exceeds 128 B");
  return FA_SUCCESS;
}

}  // namespace fa
