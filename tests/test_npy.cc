// The .npy reader/writer in tools/common: round trips of every supported dtype
// with odd shapes, headers of format 2.0 and 3.0 written by hand, and every
// malformed file (bad magic, truncated header or data, fortran order,
// big-endian, unsupported dtype, garbage headers) rejected with a message.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "npy.h"
#include "reference.h"

namespace {

using fa::npy::Array;
using fa::npy::DType;

std::string temp_path(const char *name) {
  return std::string(FA_TEST_BINARY_DIR) + "/test_npy_" + name + ".npy";
}

std::vector<uint8_t> read_file(const std::string &path) {
  std::vector<uint8_t> out;
  FILE *f = std::fopen(path.c_str(), "rb");
  assert_non_null(f);
  int c;
  while ((c = std::fgetc(f)) != EOF) out.push_back(uint8_t(c));
  std::fclose(f);
  return out;
}

void write_file(const std::string &path, const std::vector<uint8_t> &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  assert_non_null(f);
  assert_int_equal(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

// A file with a hand-written header of format `major`.0, padded to 64 bytes.
std::vector<uint8_t> make_file(int major, const std::string &dict, const void *data,
                               size_t data_bytes) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t unpadded = prefix + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  const size_t n = header.size();
  out.push_back(uint8_t(n));
  out.push_back(uint8_t(n >> 8));
  if (major != 1) {
    out.push_back(uint8_t(n >> 16));
    out.push_back(uint8_t(n >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  const auto *d = static_cast<const uint8_t *>(data);
  out.insert(out.end(), d, d + data_bytes);
  return out;
}

// Parses bytes and expects failure with a message containing `needle`.
void expect_error(const std::vector<uint8_t> &bytes, const char *needle) {
  Array a;
  a.shape = {7};  // must not be relied upon after a failure
  std::string err;
  const bool ok = fa::npy::parse(bytes.data(), bytes.size(), &a, &err);
  if (ok || err.find(needle) == std::string::npos) {
    std::fprintf(stderr, "expected an error containing '%s', got ok=%d '%s'\n", needle, ok,
                 err.c_str());
    fail();
  }
  assert_null(std::strchr(err.c_str(), '\n'));  // one line
}

template <typename T>
std::vector<T> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> v(n);
  std::normal_distribution<double> nd(0.0, 3.0);
  for (auto &x : v) x = T(nd(rng) * (std::is_integral<T>::value ? 1e6 : 1.0));
  return v;
}

void test_round_trip_f32(void **) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 5, 7, 1},        {1},    {13}, {2, 3, 5},
                                                    {1, 1, 1, 1, 1, 11}, {0, 4}, {}};
  uint32_t seed = 1;
  for (const auto &shape : shapes) {
    Array a;
    a.shape = shape;
    const auto values = random_values<float>(a.element_count(), seed++);
    a = fa::npy::from_f32(shape, values.data());
    const std::string path = temp_path("f32");
    std::string err;
    assert_true(fa::npy::write(path, a, &err));
    const std::vector<uint8_t> bytes = read_file(path);
    // Version 1.0 and data aligned to 64 bytes.
    assert_int_equal(bytes[6], 1);
    const size_t header = bytes[8] | bytes[9] << 8;
    assert_int_equal((10 + header) % 64, 0);
    assert_int_equal(bytes.size(), 10 + header + 4 * values.size());
    Array b;
    assert_true(fa::npy::read(path, &b, &err));
    assert_true(b.dtype == DType::F32);
    assert_true(b.shape == shape);
    const std::vector<float> got = b.to_f32();
    assert_int_equal(got.size(), values.size());
    if (!values.empty()) assert_memory_equal(got.data(), values.data(), values.size() * 4);
  }
}

void test_round_trip_other_dtypes(void **) {
  const std::vector<int64_t> shape = {3, 1, 7, 5};
  const size_t n = 105;
  std::string err;
  Array b;

  const auto f64 = random_values<double>(n, 11);
  assert_true(fa::npy::write(temp_path("f64"), fa::npy::from_f64(shape, f64.data()), &err));
  assert_true(fa::npy::read(temp_path("f64"), &b, &err));
  assert_true(b.dtype == DType::F64 && b.shape == shape);
  assert_memory_equal(b.to_f64().data(), f64.data(), n * 8);

  const auto i32 = random_values<int32_t>(n, 12);
  assert_true(fa::npy::write(temp_path("i32"), fa::npy::from_i32(shape, i32.data()), &err));
  assert_true(fa::npy::read(temp_path("i32"), &b, &err));
  assert_true(b.dtype == DType::I32 && b.shape == shape);
  const std::vector<int64_t> i32_back = b.to_i64();
  for (size_t i = 0; i < n; ++i) assert_int_equal(i32_back[i], i32[i]);

  std::vector<int64_t> i64 = random_values<int64_t>(n, 13);
  i64[0] = int64_t(1) << 50;  // wider than 32 bits
  assert_true(fa::npy::write(temp_path("i64"), fa::npy::from_i64(shape, i64.data()), &err));
  assert_true(fa::npy::read(temp_path("i64"), &b, &err));
  assert_true(b.dtype == DType::I64 && b.shape == shape);
  assert_true(b.to_i64() == i64);

  // fp16: bit patterns survive; values decode like fa::ref::f16_to_f32.
  const auto src = random_values<float>(n, 14);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = fa::ref::f32_to_f16(src[i]);
  assert_true(fa::npy::write(temp_path("f16"), fa::npy::from_f16_bits(shape, bits.data()), &err));
  assert_true(fa::npy::read(temp_path("f16"), &b, &err));
  assert_true(b.dtype == DType::F16 && b.shape == shape);
  assert_memory_equal(b.data.data(), bits.data(), n * 2);
  const std::vector<float> f = b.to_f32();
  for (size_t i = 0; i < n; ++i) {
    assert_true(f[i] == fa::ref::f16_to_f32(bits[i]));
    assert_true(std::fabs(f[i] - src[i]) <= 1e-3 * std::fabs(src[i]) + 1e-4);
  }
}

void test_versions_2_and_3(void **) {
  const float data[6] = {1.5f, -2.25f, 3.0f, 0.125f, -7.0f, 1e-3f};
  for (int major : {1, 2, 3}) {
    // Unusual but legal spacing, double quotes, key order and trailing commas.
    const auto bytes =
        make_file(major, "{\"shape\":(2,3,),  'descr' : \"<f4\", 'fortran_order':False}", data, 24);
    Array a;
    std::string err;
    assert_true(fa::npy::parse(bytes.data(), bytes.size(), &a, &err));
    assert_true(a.dtype == DType::F32);
    assert_true((a.shape == std::vector<int64_t>{2, 3}));
    assert_memory_equal(a.to_f32().data(), data, 24);
  }
  // Scalar and 1-D shapes; '=' byte order means native (little-endian here);
  // a 1-D fortran-order array is the same as C order.
  const double d = 42.5;
  auto bytes = make_file(2, "{'descr': '=f8', 'fortran_order': False, 'shape': (), }", &d, 8);
  Array a;
  std::string err;
  assert_true(fa::npy::parse(bytes.data(), bytes.size(), &a, &err));
  assert_true(a.shape.empty() && a.element_count() == 1 && a.to_f64()[0] == 42.5);
  const int32_t v[3] = {1, -2, 3};
  bytes = make_file(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (3,), }", v, 12);
  assert_true(fa::npy::parse(bytes.data(), bytes.size(), &a, &err));
  assert_true((a.to_i64() == std::vector<int64_t>{1, -2, 3}));
  // Extra bytes after the data are ignored, as numpy does.
  bytes = make_file(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", v, 12);
  assert_true(fa::npy::parse(bytes.data(), bytes.size(), &a, &err));
  assert_int_equal(a.element_count(), 2);
  // One-byte bool and uint8 arrays (tree masks) read as U8.
  const uint8_t m[4] = {1, 0, 0, 1};
  for (const char *descr : {"|b1", "|u1"}) {
    bytes = make_file(
        1, std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 2), }", m,
        4);
    assert_true(fa::npy::parse(bytes.data(), bytes.size(), &a, &err));
    assert_true(a.dtype == DType::U8);
    assert_true((a.to_i64() == std::vector<int64_t>{1, 0, 0, 1}));
  }
}

void test_malformed_files(void **) {
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expect_error({}, "preamble");
  expect_error({0x93, 'N', 'U', 'M'}, "preamble");
  auto bytes = make_file(1, good, data, 24);
  bytes[1] = 'X';
  expect_error(bytes, "bad magic");
  bytes = make_file(1, good, data, 24);
  bytes[6] = 4;
  expect_error(bytes, "version 4.0");
  bytes[6] = 1;
  bytes[7] = 1;
  expect_error(bytes, "version 1.1");
  // Header length larger than the file.
  bytes = make_file(1, good, data, 24);
  bytes[9] = 0x40;
  expect_error(bytes, "truncated header");
  bytes = make_file(2, good, data, 24);
  bytes[11] = 0x7f;
  expect_error(bytes, "truncated header");
  // Every truncation of a valid file fails cleanly.
  for (int major : {1, 2}) {
    const auto full = make_file(major, good, data, 24);
    for (size_t n = 0; n < full.size(); ++n) {
      Array a;
      std::string err;
      assert_false(fa::npy::parse(full.data(), n, &a, &err));
      assert_false(err.empty());
    }
  }
  expect_error(make_file(1, good, data, 20), "truncated data");
  expect_error(make_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data, 24),
               "fortran_order");
  expect_error(
      make_file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data, 24),
      "big-endian");
  expect_error(make_file(1, "{'descr': '>i8', 'fortran_order': False, 'shape': (3,), }", data, 24),
               "big-endian");
  for (const char *descr : {"<c8", "<u2", "|i1", "<f16", "<u1", "<M8[s]", "f4", ""}) {
    expect_error(
        make_file(
            1, std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }",
            data, 24),
        "unsupported dtype");
  }
  expect_error(make_file(1,
                         "{'descr': [('a', '<f4'), ('b', '<f4')], 'fortran_order': False, "
                         "'shape': (3,), }",
                         data, 24),
               "structured");
  // Garbage headers.
  const char *bad_headers[] = {
      "",
      "{",
      "}",
      "descr",
      "{'descr': '<f4', 'fortran_order': False}",                           // no shape
      "{'descr': '<f4', 'shape': (2, 3)}",                                  // no fortran_order
      "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3)}",          // bad bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}",         // negative dim
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}",          // non-numeric
      "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}",          // list
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}",           // no comma
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}",  // extra key
      "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}",           // no comma
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x",        // trailing text
      "{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}",           // bad quote
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 3)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16)}",
  };
  for (const char *h : bad_headers) {
    const auto b = make_file(1, h, data, 24);
    Array a;
    std::string err;
    if (fa::npy::parse(b.data(), b.size(), &a, &err)) {
      std::fprintf(stderr, "accepted bad header: %s\n", h);
      fail();
    }
    assert_false(err.empty());
  }
  // A huge but representable shape is rejected against the file size, never
  // allocated.
  expect_error(make_file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }",
                         data, 24),
               "truncated data");
}

void test_random_corruption(void **) {
  // Flipped bytes anywhere in the header must never crash; whatever parses
  // must have a consistent size.
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const auto good =
      make_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data, 24);
  std::mt19937 rng(7);
  int rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto b = good;
    const int flips = 1 + int(rng() % 3);
    for (int f = 0; f < flips; ++f) b[rng() % (b.size() - 24)] = uint8_t(rng());
    Array a;
    std::string err;
    if (fa::npy::parse(b.data(), b.size(), &a, &err)) {
      assert_int_equal(a.data.size(), a.element_count() * fa::npy::dtype_size(a.dtype));
    } else {
      assert_false(err.empty());
      ++rejected;
    }
  }
  assert_true(rejected > 1000);
}

void test_file_errors(void **) {
  Array a;
  std::string err;
  const std::string missing = temp_path("does_not_exist_dir") + "/x.npy";
  assert_false(fa::npy::read(missing, &a, &err));
  assert_non_null(std::strstr(err.c_str(), "x.npy"));
  // Writing into a missing directory fails with the path in the message.
  const float v = 1;
  assert_false(fa::npy::write(missing, fa::npy::from_f32({1}, &v), &err));
  assert_non_null(std::strstr(err.c_str(), "x.npy"));
  // A file that is not .npy at all.
  write_file(temp_path("text"),
             std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'});
  assert_false(fa::npy::read(temp_path("text"), &a, &err));
  assert_non_null(std::strstr(err.c_str(), "bad magic"));
  // An array whose data does not match its shape cannot be written.
  Array bad = fa::npy::from_f32({1}, &v);
  bad.shape = {2, 2};
  assert_false(fa::npy::write(temp_path("bad"), bad, &err));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_f32),    cmocka_unit_test(test_round_trip_other_dtypes),
      cmocka_unit_test(test_versions_2_and_3),  cmocka_unit_test(test_malformed_files),
      cmocka_unit_test(test_random_corruption), cmocka_unit_test(test_file_errors),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
