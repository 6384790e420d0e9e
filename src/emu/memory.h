// Emulated device memory: host allocations whose address is the device
// address. The table of live allocations answers "does [addr, addr+size)
// lie inside one allocation" for every global access (memcheck-like).
// Thread-safe: alloc/free take the lock exclusively, launches hold it shared
// for their whole run (so nothing is freed under a running kernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <shared_mutex>
#include <string>

#include "flashattn.h"

namespace fa {
namespace emu {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory &) = delete;
  DeviceMemory &operator=(const DeviceMemory &) = delete;

  // 256-byte aligned, filled with 0xff bytes (NaN in f16/bf16/f32) so reads
  // of never-written memory show up in results. Allocations of 1 GiB and
  // more are reserved lazily (mmap MAP_NORESERVE: pages are committed when
  // touched) and start zero-filled instead.
  fa_status alloc(size_t bytes, uint64_t *ptr);
  fa_status free(uint64_t ptr);
  // Host <-> device copies and memset; the range must lie in one allocation.
  fa_status copy_in(uint64_t dst, const void *src, size_t bytes);
  fa_status copy_out(void *dst, uint64_t src, size_t bytes);
  fa_status set(uint64_t dst, uint8_t value, size_t bytes);

  // Lock held shared by a launch.
  std::shared_mutex &mutex() { return mu_; }

  // With the lock held: the allocation [*base, *end) containing [addr,
  // addr+size), or false. Cheap enough for a cache-miss path.
  bool find_locked(uint64_t addr, uint64_t size, uint64_t *base, uint64_t *end) const;
  // With the lock held: text describing where addr is relative to the
  // nearest allocation (for error messages).
  std::string describe_locked(uint64_t addr, uint64_t size) const;

 private:
  bool check(uint64_t addr, size_t bytes, const char *what);
  void release(uint64_t base);  // frees or unmaps (lock held)
  mutable std::shared_mutex mu_;
  std::map<uint64_t, uint64_t> allocs_;  // base -> size
  std::map<uint64_t, size_t> mapped_;    // lazy allocations: base -> mapped bytes
};

}  // namespace emu
}  // namespace fa
