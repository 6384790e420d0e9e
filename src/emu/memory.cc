#include "emu/memory.h"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace fa {
namespace emu {

namespace {
// Allocations this large are reserved, not committed (see alloc()).
constexpr size_t kLazyBytes = size_t{1} << 30;
}  // namespace

void DeviceMemory::release(uint64_t base) {
  auto m = mapped_.find(base);
  if (m != mapped_.end()) {
    munmap(reinterpret_cast<void *>(base), m->second);
    mapped_.erase(m);
  } else {
    std::free(reinterpret_cast<void *>(base));
  }
}

DeviceMemory::~DeviceMemory() {
  for (auto &a : allocs_) release(a.first);
}

fa_status DeviceMemory::alloc(size_t bytes, uint64_t *ptr) {
  if (!ptr) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator mem_alloc: null output pointer");
  if (bytes == 0) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator mem_alloc: 0 bytes");
  if (bytes > (size_t{1} << 40))
    return fail(FA_ERROR_OUT_OF_MEMORY, "emulator mem_alloc: %zu bytes is too large", bytes);
  size_t rounded = (bytes + 255) & ~size_t{255};
  void *p = nullptr;
  const bool lazy = rounded >= kLazyBytes;
  if (lazy) {
    // Reserved address space: a page is committed when first touched, so a
    // huge logical buffer with a little real work (index tests past 2^31)
    // costs only what it touches. It starts zero-filled, not poisoned.
    p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(256, rounded);
    if (p) std::memset(p, 0xff, rounded);
  }
  if (!p)
    return fail(FA_ERROR_OUT_OF_MEMORY, "emulator mem_alloc: %zu bytes: out of memory", bytes);
  std::unique_lock<std::shared_mutex> lock(mu_);
  try {
    if (lazy) mapped_[reinterpret_cast<uint64_t>(p)] = rounded;
    allocs_[reinterpret_cast<uint64_t>(p)] = bytes;
  } catch (...) {  // the table could not grow: give the block back
    mapped_.erase(reinterpret_cast<uint64_t>(p));
    if (lazy)
      munmap(p, rounded);
    else
      std::free(p);
    throw;
  }
  *ptr = reinterpret_cast<uint64_t>(p);
  return FA_SUCCESS;
}

fa_status DeviceMemory::free(uint64_t ptr) {
  if (ptr == 0) return FA_SUCCESS;  // freeing null is a no-op, like free()
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end())
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "emulator mem_free: 0x%" PRIx64 " is not the start of a live allocation", ptr);
  release(ptr);
  allocs_.erase(it);
  return FA_SUCCESS;
}

bool DeviceMemory::find_locked(uint64_t addr, uint64_t size, uint64_t *base, uint64_t *end) const {
  auto it = allocs_.upper_bound(addr);
  if (it == allocs_.begin()) return false;
  --it;
  uint64_t b = it->first, e = it->first + it->second;
  if (addr < b || addr + size > e || addr + size < addr) return false;
  *base = b;
  *end = e;
  return true;
}

std::string DeviceMemory::describe_locked(uint64_t addr, uint64_t size) const {
  char buf[160];
  auto it = allocs_.upper_bound(addr);
  if (it != allocs_.begin()) {
    auto prev = std::prev(it);
    uint64_t b = prev->first, e = prev->first + prev->second;
    if (addr < e) {
      std::snprintf(buf, sizeof buf,
                    "runs %" PRIu64 " bytes past the end of allocation 0x%" PRIx64 " (%" PRIu64
                    " bytes)",
                    addr + size - e, b, prev->second);
    } else {
      std::snprintf(buf, sizeof buf,
                    "starts %" PRIu64 " bytes after the end of allocation 0x%" PRIx64 " (%" PRIu64
                    " bytes)",
                    addr - e, b, prev->second);
    }
    return buf;
  }
  if (it != allocs_.end()) {
    std::snprintf(buf, sizeof buf, "is %" PRIu64 " bytes before allocation 0x%" PRIx64,
                  it->first - addr, it->first);
    return buf;
  }
  return "no allocation is live";
}

bool DeviceMemory::check(uint64_t addr, size_t bytes, const char *what) {
  uint64_t b, e;
  if (bytes == 0) return true;
  if (find_locked(addr, bytes, &b, &e)) return true;
  fail(FA_ERROR_INVALID_ARGUMENT, "emulator %s: [0x%" PRIx64 ", +%zu) %s", what, addr, bytes,
       describe_locked(addr, bytes).c_str());
  return false;
}

fa_status DeviceMemory::copy_in(uint64_t dst, const void *src, size_t bytes) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (!check(dst, bytes, "copy_htod")) return FA_ERROR_INVALID_ARGUMENT;
  if (bytes && !src) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator copy_htod: null source");
  if (bytes) std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
  return FA_SUCCESS;
}

fa_status DeviceMemory::copy_out(void *dst, uint64_t src, size_t bytes) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (!check(src, bytes, "copy_dtoh")) return FA_ERROR_INVALID_ARGUMENT;
  if (bytes && !dst) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator copy_dtoh: null destination");
  if (bytes) std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
  return FA_SUCCESS;
}

fa_status DeviceMemory::set(uint64_t dst, uint8_t value, size_t bytes) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (!check(dst, bytes, "memset_d8")) return FA_ERROR_INVALID_ARGUMENT;
  if (bytes) std::memset(reinterpret_cast<void *>(dst), value, bytes);
  return FA_SUCCESS;
}

}  // namespace emu
}  // namespace fa
