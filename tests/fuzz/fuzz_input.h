// A tiny data producer for the fuzz targets: turns the fuzzer's bytes into
// integers, choices and byte strings. Reading past the end yields zeros, so
// every input (even an empty one) decodes to something.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace fa_fuzz {

class Input {
 public:
  Input(const uint8_t *data, size_t size) : p_(data), n_(size) {}

  // The next sizeof(T) bytes as a little-endian integer (zeros past the end).
  template <typename T>
  T get() {
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{byte()} << (8 * i);
    T out;
    std::memcpy(&out, &v, sizeof out);
    return out;
  }
  uint8_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  // A value in [0, n) (n >= 1).
  uint32_t below(uint32_t n) { return get<uint16_t>() % n; }
  // Up to max_len bytes: a length byte (or two) then the bytes.
  std::string bytes(size_t max_len) {
    size_t len = get<uint16_t>() % (max_len + 1);
    if (len > n_ - i_) len = n_ - i_;
    std::string s(reinterpret_cast<const char *>(p_ + i_), len);
    i_ += len;
    return s;
  }
  size_t left() const { return n_ - i_; }

 private:
  const uint8_t *p_;
  size_t n_, i_ = 0;
};

}  // namespace fa_fuzz
