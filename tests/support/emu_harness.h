// Helpers for tests that run hand-written PTX on the emulator backend
// directly (test_emulator, test_emulator_tc): one backend per test group,
// compile + load + launch, error-message checks, poisoned device buffers.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "common/error.h"
#include "support/cmocka.hh"

namespace fa::test {

// The group's emulator backend (sm_80), made by emu_setup.
inline fa::Backend *g_be = nullptr;

inline const char *kHeader = ".version 7.0\n.target sm_80\n.address_size 64\n";

// A group setup: g_be = an emulator backend of SM Sm (emu_setup: sm_80).
template <int Sm>
int emu_setup_sm(void **) {
  std::unique_ptr<fa::Backend> be;
  if (fa::create_emulator_backend(Sm, &be) != FA_SUCCESS) return -1;
  g_be = be.release();
  return 0;
}
inline int emu_setup(void **state) { return emu_setup_sm<80>(state); }

inline int emu_teardown(void **) {
  delete g_be;
  g_be = nullptr;
  return 0;
}

inline fa::LaunchGeometry geom(uint32_t gx, uint32_t bx, uint32_t smem = 0) {
  fa::LaunchGeometry g;
  g.grid[0] = gx;
  g.block[0] = bx;
  g.smem_bytes = smem;
  return g;
}

// compile + load + launch; returns the first failing status. The emulator
// builds no binary.
inline fa_status run_ptx(const std::string &ptx, const char *entry, const fa::LaunchGeometry &g,
                         const void *params, size_t params_size) {
  std::vector<uint8_t> bin;
  std::string log;
  fa_status st = g_be->compile(ptx, &bin, &log);
  if (st != FA_SUCCESS) return st;
  assert_true(bin.empty());
  std::unique_ptr<fa::Kernel> k;
  st = g_be->load(ptx, bin, entry, g.smem_bytes, &k);
  if (st != FA_SUCCESS) return st;
  return g_be->launch(*k, g, params, params_size, nullptr);
}

// Whether ptxas -arch=<arch> (FA_PTXAS_PATH) accepts the PTX: 1 / 0, -1
// without a CUDA toolkit.
inline int ptxas_accepts(const std::string &ptx, const char *arch) {
  const std::string ptxas = FA_PTXAS_PATH;
  if (ptxas.empty() || access(ptxas.c_str(), X_OK) != 0) return -1;
  char path[] = "/tmp/fa_ptxas_XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_true(write(fd, ptx.data(), ptx.size()) == static_cast<ssize_t>(ptx.size()));
  close(fd);
  const std::string cubin = std::string(path) + ".cubin";
  const std::string cmd =
      "'" + ptxas + "' -arch=" + arch + " '" + path + "' -o '" + cubin + "' 2>/dev/null";
  const int rc = std::system(cmd.c_str());
  unlink(path);
  unlink(cubin.c_str());
  return rc == 0 ? 1 : 0;
}

// 1-based line of the first line containing marker.
inline int line_of(const std::string &text, const char *marker) {
  size_t pos = text.find(marker);
  assert_true(pos != std::string::npos);
  int line = 1;
  for (size_t i = 0; i < pos; ++i) line += text[i] == '\n';
  return line;
}

// Fails unless the thread's last error contains `what`.
inline void expect_error(const std::string &what) {
  const char *msg = fa::last_error();
  if (!std::strstr(msg, what.c_str())) {
    std::fprintf(stderr, "error message \"%s\" lacks \"%s\"\n", msg, what.c_str());
    fail();
  }
}

// A device buffer poisoned with 0xAB bytes.
struct DevBuf {
  uint64_t ptr = 0;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    assert_int_equal(g_be->mem_alloc(n, &ptr), FA_SUCCESS);
    poison();
  }
  ~DevBuf() { g_be->mem_free(ptr); }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  void poison() { assert_int_equal(g_be->memset_d8(ptr, 0xAB, bytes), FA_SUCCESS); }
  template <typename T>
  std::vector<T> get() {
    std::vector<T> v(bytes / sizeof(T));
    assert_int_equal(g_be->copy_dtoh(v.data(), ptr, v.size() * sizeof(T)), FA_SUCCESS);
    return v;
  }
  template <typename T>
  void put(const std::vector<T> &v) {
    assert_true(v.size() * sizeof(T) <= bytes);
    assert_int_equal(g_be->copy_htod(ptr, v.data(), v.size() * sizeof(T)), FA_SUCCESS);
  }
};

}  // namespace fa::test
