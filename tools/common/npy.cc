#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "reference.h"

namespace fa::npy {
namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

bool set_error(std::string *error, const std::string &message) {
  if (error) *error = message;
  return false;
}

// A cursor over the header text (a Python dict literal such as
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }").
struct HeaderParser {
  const char *p;
  const char *end;

  void skip_ws() {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  }
  bool eat(char c) {
    skip_ws();
    if (p < end && *p == c) {
      ++p;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    skip_ws();
    return p < end && *p == c;
  }
  // A quoted string ('...' or "..."); no escapes are needed by any descr.
  bool string(std::string *out) {
    skip_ws();
    if (p >= end || (*p != '\'' && *p != '"')) return false;
    const char quote = *p++;
    const char *start = p;
    while (p < end && *p != quote) {
      if (*p == '\\') return false;
      ++p;
    }
    if (p >= end) return false;
    out->assign(start, p);
    ++p;
    return true;
  }
  bool word(const char *w) {
    skip_ws();
    const size_t n = std::strlen(w);
    if (size_t(end - p) < n || std::memcmp(p, w, n) != 0) return false;
    p += n;
    return true;
  }
  // A non-negative decimal integer (an optional Python 2 'L' suffix).
  bool integer(int64_t *out) {
    skip_ws();
    if (p >= end || *p < '0' || *p > '9') return false;
    uint64_t v = 0;
    const uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max());
    while (p < end && *p >= '0' && *p <= '9') {
      const uint64_t digit = uint64_t(*p - '0');
      if (v > (limit - digit) / 10) return false;
      v = v * 10 + digit;
      ++p;
    }
    if (p < end && *p == 'L') ++p;
    *out = int64_t(v);
    return true;
  }
  // Skips a balanced [...] value (a structured dtype), reporting success.
  bool skip_list() {
    skip_ws();
    int depth = 0;
    while (p < end) {
      if (*p == '[') ++depth;
      if (*p == ']' && --depth == 0) {
        ++p;
        return true;
      }
      ++p;
    }
    return false;
  }
};

// Parses the header dict into descr / fortran_order / shape.
bool parse_header(const char *text, size_t len, std::string *descr, bool *structured, bool *fortran,
                  std::vector<int64_t> *shape, std::string *error) {
  HeaderParser hp{text, text + len};
  bool have_descr = false, have_fortran = false, have_shape = false;
  *structured = false;
  if (!hp.eat('{')) return set_error(error, "malformed header: expected '{'");
  while (!hp.eat('}')) {
    std::string key;
    if (!hp.string(&key)) return set_error(error, "malformed header: expected a quoted key");
    if (!hp.eat(':')) return set_error(error, "malformed header: expected ':' after '" + key + "'");
    if (key == "descr") {
      if (hp.peek('[')) {
        if (!hp.skip_list()) return set_error(error, "malformed header: unterminated descr list");
        *structured = true;
      } else if (!hp.string(descr)) {
        return set_error(error, "malformed header: descr is not a string");
      }
      have_descr = true;
    } else if (key == "fortran_order") {
      if (hp.word("True")) {
        *fortran = true;
      } else if (hp.word("False")) {
        *fortran = false;
      } else {
        return set_error(error, "malformed header: fortran_order is not True or False");
      }
      have_fortran = true;
    } else if (key == "shape") {
      if (!hp.eat('(')) return set_error(error, "malformed header: shape is not a tuple");
      shape->clear();
      while (!hp.eat(')')) {
        int64_t dim;
        if (!hp.integer(&dim)) {
          return set_error(error, "malformed header: shape holds a non-integer or negative value");
        }
        if (shape->size() >= 64) return set_error(error, "malformed header: more than 64 dims");
        shape->push_back(dim);
        if (!hp.eat(',') && !hp.peek(')')) {
          return set_error(error, "malformed header: expected ',' or ')' in shape");
        }
      }
      have_shape = true;
    } else {
      return set_error(error, "malformed header: unexpected key '" + key + "'");
    }
    if (!hp.eat(',') && !hp.peek('}')) {
      return set_error(error, "malformed header: expected ',' or '}'");
    }
  }
  hp.skip_ws();
  if (hp.p != hp.end) return set_error(error, "malformed header: text after the dict");
  if (!have_descr || !have_fortran || !have_shape) {
    return set_error(error, "malformed header: descr, fortran_order and shape are all required");
  }
  return true;
}

bool descr_to_dtype(const std::string &descr, DType *out, std::string *error) {
  static const struct {
    const char *code;
    DType type;
  } kTypes[] = {{"f2", DType::F16},
                {"f4", DType::F32},
                {"f8", DType::F64},
                {"i4", DType::I32},
                {"i8", DType::I64}};
  // One-byte types have no byte order ('|'): bool and uint8 (tree masks).
  if (descr == "|b1" || descr == "|u1") {
    *out = DType::U8;
    return true;
  }
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '=' || descr[0] == '>')) {
    for (const auto &t : kTypes) {
      if (descr.compare(1, 2, t.code) != 0) continue;
      if (descr[0] == '>') {
        return set_error(error, "big-endian data ('" + descr +
                                    "') is not supported; convert with "
                                    "a.astype(a.dtype.newbyteorder('<'))");
      }
      *out = t.type;
      return true;
    }
  }
  return set_error(error,
                   "unsupported dtype '" + descr + "' (supported: <f2 <f4 <f8 <i4 <i8 |b1 |u1)");
}

template <typename T>
T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename Out>
std::vector<Out> convert(const Array &a) {
  const size_t n = a.element_count();
  std::vector<Out> out(n);
  const uint8_t *d = a.data.data();
  if (a.data.size() < n * dtype_size(a.dtype)) return {};
  for (size_t i = 0; i < n; ++i) {
    switch (a.dtype) {
      case DType::F16:
        out[i] = Out(fa::ref::f16_to_f32(load<uint16_t>(d + 2 * i)));
        break;
      case DType::F32:
        out[i] = Out(load<float>(d + 4 * i));
        break;
      case DType::F64:
        out[i] = Out(load<double>(d + 8 * i));
        break;
      case DType::I32:
        out[i] = Out(load<int32_t>(d + 4 * i));
        break;
      case DType::I64:
        out[i] = Out(load<int64_t>(d + 8 * i));
        break;
      case DType::U8:
        out[i] = Out(d[i]);
        break;
    }
  }
  return out;
}

// Element count of `shape`, or false on overflow.
bool checked_count(const std::vector<int64_t> &shape, size_t elem, size_t *count, size_t *bytes) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  uint64_t b;
  if (__builtin_mul_overflow(n, uint64_t(elem), &b)) return false;
  if (b > uint64_t(std::numeric_limits<size_t>::max())) return false;
  *count = size_t(n);
  *bytes = size_t(b);
  return true;
}

template <typename T>
Array make(DType t, const std::vector<int64_t> &shape, const T *values) {
  Array a;
  a.dtype = t;
  a.shape = shape;
  const size_t bytes = a.element_count() * sizeof(T);
  a.data.resize(bytes);
  if (bytes) std::memcpy(a.data.data(), values, bytes);
  return a;
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8:
      return 1;
    case DType::F16:
      return 2;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F64:
    case DType::I64:
      return 8;
  }
  return 0;
}

const char *dtype_descr(DType t) {
  switch (t) {
    case DType::F16:
      return "<f2";
    case DType::F32:
      return "<f4";
    case DType::F64:
      return "<f8";
    case DType::I32:
      return "<i4";
    case DType::I64:
      return "<i8";
    case DType::U8:
      return "|u1";
  }
  return "?";
}

bool dtype_is_float(DType t) { return t == DType::F16 || t == DType::F32 || t == DType::F64; }

size_t Array::element_count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d < 0 ? 0 : d);
  return n;
}

std::string Array::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<double> Array::to_f64() const { return convert<double>(*this); }
std::vector<float> Array::to_f32() const { return convert<float>(*this); }

std::vector<int64_t> Array::to_i64() const {
  if (dtype_is_float(dtype)) {
    // Go through double; out-of-range values clamp instead of being UB.
    const std::vector<double> d = to_f64();
    std::vector<int64_t> out(d.size());
    for (size_t i = 0; i < d.size(); ++i) {
      const double x = d[i];
      if (!(x == x)) {
        out[i] = 0;
      } else if (x >= 9.2e18) {
        out[i] = std::numeric_limits<int64_t>::max();
      } else if (x <= -9.2e18) {
        out[i] = std::numeric_limits<int64_t>::min();
      } else {
        out[i] = int64_t(x);
      }
    }
    return out;
  }
  return convert<int64_t>(*this);
}

Array from_f32(const std::vector<int64_t> &shape, const float *values) {
  return make(DType::F32, shape, values);
}
Array from_f64(const std::vector<int64_t> &shape, const double *values) {
  return make(DType::F64, shape, values);
}
Array from_i32(const std::vector<int64_t> &shape, const int32_t *values) {
  return make(DType::I32, shape, values);
}
Array from_i64(const std::vector<int64_t> &shape, const int64_t *values) {
  return make(DType::I64, shape, values);
}
Array from_f16_bits(const std::vector<int64_t> &shape, const uint16_t *bits) {
  return make(DType::F16, shape, bits);
}

namespace {

// What the preamble and header of a .npy file say: where the data starts and
// how many bytes it holds.
struct Meta {
  DType type = DType::F32;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
  size_t data_bytes = 0;
};

// From the first bytes of a file (`held` of them at `bytes`, of a file of
// `size` bytes, held <= size): the offset at which the header ends and the
// data starts.
bool header_end(const uint8_t *bytes, size_t held, size_t size, size_t *end, std::string *error) {
  if (bytes == nullptr || held < 10) {
    return set_error(error, "not a .npy file: shorter than the 10-byte preamble");
  }
  if (std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0) {
    return set_error(error, "not a .npy file: bad magic string");
  }
  const unsigned major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0) {
    return set_error(error, "unsupported .npy format version " + std::to_string(major) + "." +
                                std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  }
  size_t header_len, offset;
  if (major == 1) {
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8;
    offset = 10;
  } else {
    if (held < 12) return set_error(error, "truncated header: no 4-byte header length");
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 |
                 size_t(bytes[11]) << 24;
    offset = 12;
  }
  if (header_len > size - offset) {
    return set_error(error, "truncated header: " + std::to_string(header_len) +
                                " header bytes announced, " + std::to_string(size - offset) +
                                " present");
  }
  *end = offset + header_len;
  return true;
}

// Parses the preamble and header held at `bytes` (at least up to the
// header's end) of a file of `size` bytes, and checks that the file holds
// the data the header announces.
bool parse_meta(const uint8_t *bytes, size_t held, size_t size, Meta *m, std::string *error) {
  size_t end;
  if (!header_end(bytes, held, size, &end, error)) return false;
  if (held < end) return set_error(error, "truncated header");
  const size_t offset = bytes[6] == 1 ? 10 : 12;
  std::string descr;
  bool structured = false, fortran = false;
  if (!parse_header(reinterpret_cast<const char *>(bytes + offset), end - offset, &descr,
                    &structured, &fortran, &m->shape, error)) {
    return false;
  }
  if (structured) return set_error(error, "unsupported dtype: structured arrays are not supported");
  if (!descr_to_dtype(descr, &m->type, error)) return false;
  if (fortran && m->shape.size() > 1) {
    return set_error(error,
                     "fortran_order arrays are not supported; save with np.ascontiguousarray(a)");
  }
  size_t count;
  if (!checked_count(m->shape, dtype_size(m->type), &count, &m->data_bytes)) {
    return set_error(error, "shape too large");
  }
  m->data_offset = end;
  const size_t available = size - end;
  if (available < m->data_bytes) {
    Array tmp;
    tmp.shape = m->shape;
    return set_error(error, "truncated data: shape " + tmp.shape_string() + " of " +
                                dtype_descr(m->type) + " needs " + std::to_string(m->data_bytes) +
                                " bytes, file has " + std::to_string(available));
  }
  return true;
}

// Reads exactly n bytes at offset (fewer only at end of file: *got says).
bool pread_full(int fd, uint8_t *dst, size_t n, size_t offset, size_t *got) {
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::pread(fd, dst + *got, n - *got, off_t(offset + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) break;
    *got += size_t(r);
  }
  return true;
}

const char *file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

bool parse(const uint8_t *bytes, size_t size, Array *out, std::string *error) {
  if (!out) return set_error(error, "no output array");
  Meta m;
  if (!parse_meta(bytes, size, size, &m, error)) return false;
  out->dtype = m.type;
  out->shape = std::move(m.shape);
  out->data.assign(bytes + m.data_offset, bytes + m.data_offset + m.data_bytes);
  return true;
}

bool read(const std::string &path, Array *out, std::string *error) {
  if (!out) return set_error(error, path + ": no output array");
  // O_NONBLOCK: opening a FIFO that has no writer must not block (it is then
  // rejected below); it changes nothing for the regular files accepted.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return set_error(error, path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return set_error(error, path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    return set_error(error, path + ": not a regular file (" + file_kind(st.st_mode) +
                                "); .npy inputs must be regular files");
  }
  // Reads are bounded by the file's size and by what the header announces:
  // bytes after the data are never read, nothing is allocated beyond them.
  const size_t size = st.st_size > 0 ? size_t(st.st_size) : 0;
  auto read_error = [&] {
    return set_error(error, path + ": read error: " + std::strerror(errno));
  };
  auto shrank = [&] {
    return set_error(error, path + ": truncated: the file shrank while it was read");
  };
  std::string message;
  uint8_t pre[12];
  const size_t pre_len = std::min(size, sizeof(pre));
  size_t got, end;
  if (!pread_full(fd, pre, pre_len, 0, &got)) return read_error();
  if (got < pre_len) return shrank();
  if (!header_end(pre, pre_len, size, &end, &message))
    return set_error(error, path + ": " + message);
  std::vector<uint8_t> head(end);
  if (!pread_full(fd, head.data(), end, 0, &got)) return read_error();
  if (got < end) return shrank();
  Meta m;
  if (!parse_meta(head.data(), end, size, &m, &message)) {
    return set_error(error, path + ": " + message);
  }
  std::vector<uint8_t> data(m.data_bytes);
  if (!pread_full(fd, data.data(), m.data_bytes, m.data_offset, &got)) return read_error();
  if (got < m.data_bytes) return shrank();
  out->dtype = m.type;
  out->shape = std::move(m.shape);
  out->data = std::move(data);
  return true;
}

bool serialize(const Array &a, std::vector<uint8_t> *out, std::string *error) {
  size_t count, nbytes;
  if (!checked_count(a.shape, dtype_size(a.dtype), &count, &nbytes)) {
    return set_error(error, "shape too large or negative");
  }
  if (a.data.size() != nbytes) {
    return set_error(error, "array holds " + std::to_string(a.data.size()) + " bytes, shape " +
                                a.shape_string() + " needs " + std::to_string(nbytes));
  }
  std::string header = "{'descr': '";
  header += dtype_descr(a.dtype);
  header += "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) {
    header += std::to_string(a.shape[i]);
    if (a.shape.size() == 1 || i + 1 < a.shape.size()) header += ",";
    if (i + 1 < a.shape.size()) header += " ";
  }
  header += "), }";
  // Pad with spaces and end with '\n' so the data starts on a 64-byte boundary.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 65535) return set_error(error, "header too long for format 1.0");
  out->clear();
  out->reserve(10 + header.size() + nbytes);
  out->insert(out->end(), kMagic, kMagic + sizeof(kMagic));
  out->push_back(1);
  out->push_back(0);
  out->push_back(uint8_t(header.size() & 0xff));
  out->push_back(uint8_t(header.size() >> 8));
  out->insert(out->end(), header.begin(), header.end());
  out->insert(out->end(), a.data.begin(), a.data.end());
  (void)count;
  return true;
}

bool write(const std::string &path, const Array &a, std::string *error) {
  std::vector<uint8_t> bytes;
  std::string message;
  if (!serialize(a, &bytes, &message)) return set_error(error, path + ": " + message);
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) return set_error(error, path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return set_error(error, path + ": write failed");
  return true;
}

}  // namespace fa::npy
