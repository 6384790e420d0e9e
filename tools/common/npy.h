// A small reader and writer for NumPy .npy files, used by the CLI, the tests
// and the benchmarks.
//
// Reading accepts format versions 1.0, 2.0 and 3.0, C order, little-endian
// (or byte-order-free) dtypes <f2 <f4 <f8 <i4 <i8, and |b1 |u1 (read as U8).
// Writing produces version
// 1.0. Every malformed or unsupported file yields false and a one-line message
// (never a crash, never an allocation sized by an unchecked header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fa::npy {

enum class DType { F16, F32, F64, I32, I64, U8 };  // U8: bool (|b1) or uint8 (|u1)

// Bytes per element of `t`.
size_t dtype_size(DType t);
// The .npy descr of `t` ("<f4").
const char *dtype_descr(DType t);
// True for F16, F32 and F64.
bool dtype_is_float(DType t);

// An array in C order: `data` holds element_count() * dtype_size(dtype)
// little-endian bytes.
struct Array {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // empty = scalar (one element)
  std::vector<uint8_t> data;

  size_t element_count() const;
  // "[2, 3, 4]"
  std::string shape_string() const;
  // Every element converted to double / float / int64 (floats truncated toward
  // zero for to_i64). Returns an empty vector for an empty array.
  std::vector<double> to_f64() const;
  std::vector<float> to_f32() const;
  std::vector<int64_t> to_i64() const;
};

// Arrays built from host values, C order; the count of values must equal the
// product of `shape`.
Array from_f32(const std::vector<int64_t> &shape, const float *values);
Array from_f64(const std::vector<int64_t> &shape, const double *values);
Array from_i32(const std::vector<int64_t> &shape, const int32_t *values);
Array from_i64(const std::vector<int64_t> &shape, const int64_t *values);
// fp16 bit patterns stored as <f2.
Array from_f16_bits(const std::vector<int64_t> &shape, const uint16_t *bits);

// Parses a whole .npy file held in memory. On failure returns false and sets
// *error (when non-null) to a message without a trailing newline.
bool parse(const uint8_t *bytes, size_t size, Array *out, std::string *error);

// Reads `path`; messages are prefixed with the path. Only regular files are
// accepted (a device, FIFO, directory or socket is refused without reading;
// FIFOs are opened non-blocking so this never waits for a writer), and only
// the preamble, the header and the data bytes the header announces are read,
// after checking them against the file's size: trailing bytes are ignored.
bool read(const std::string &path, Array *out, std::string *error);

// Serialises `a` as a version 1.0 .npy file.
bool serialize(const Array &a, std::vector<uint8_t> *out, std::string *error);

// Writes `a` to `path` (version 1.0); messages are prefixed with the path.
bool write(const std::string &path, const Array &a, std::string *error);

}  // namespace fa::npy
