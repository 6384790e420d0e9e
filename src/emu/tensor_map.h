// The emulator's tensor map: the 128 bytes the emulator backend's
// encode_tensor_map writes where a kernel expects a CUtensorMap (the cuda
// backend writes the driver's opaque map from cuTensorMapEncodeTiled). The
// interpreter's cp.async.bulk.tensor and cp.reduce.async.bulk.tensor read
// it back. Tile mode only
// (PTX ISA "Tensor Access Modes: Tiled mode"; CUDA Driver API
// cuTensorMapEncodeTiled).
#pragma once

#include <cstdint>
#include <cstring>

namespace fa {
namespace emu {

constexpr uint32_t kTensorMapMagic = 0x4d544146u;  // "FATM"
constexpr int kTensorMapMaxRank = 5;

// Swizzle of the shared-memory box, as CUtensorMapSwizzle: the 16-byte chunk
// index within each span of (32 << (mode-1)) bytes is XORed with the span's
// row index bits (PTX ISA "Tensor Access Modes: Swizzling Modes").
enum class TmaSwizzle : uint32_t { None = 0, B32 = 1, B64 = 2, B128 = 3 };

// The element type, as CUtensorMapDataType says it: copies need only
// elem_bytes (Untyped is fine); cp.reduce.async.bulk.tensor's .add needs
// F32, U32 or S32 (PTX ISA "cp.reduce.async.bulk.tensor": the type comes
// from the tensor map).
enum class TmaDtype : uint32_t { Untyped = 0, F32 = 1, U32 = 2, S32 = 3 };

struct TensorMap {
  uint32_t magic = kTensorMapMagic;
  uint32_t rank = 0;                         // 1..5
  uint64_t base = 0;                         // global address of element 0, 16-byte aligned
  uint64_t dims[kTensorMapMaxRank] = {};     // elements; dim 0 innermost
  uint64_t strides[kTensorMapMaxRank] = {};  // bytes; strides[0] = elem_bytes
  uint32_t box[kTensorMapMaxRank] = {};      // elements copied per dimension
  uint32_t elem_bytes = 0;                   // 1, 2, 4 or 8
  TmaSwizzle swizzle = TmaSwizzle::None;
  TmaDtype dtype = TmaDtype::Untyped;
};
static_assert(sizeof(TensorMap) <= 128, "a tensor map is 128 bytes");

inline void store_tensor_map(const TensorMap &m, uint8_t out[128]) {
  std::memset(out, 0, 128);
  std::memcpy(out, &m, sizeof m);
}

inline bool load_tensor_map(const uint8_t in[128], TensorMap *m) {
  std::memcpy(m, in, sizeof *m);
  return m->magic == kTensorMapMagic && m->rank >= 1 && m->rank <= kTensorMapMaxRank;
}

}  // namespace emu
}  // namespace fa
