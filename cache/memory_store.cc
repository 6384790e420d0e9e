// The in-memory store: a mutex-guarded map, lost when the process exits.
#include "cache/store_internal.h"

namespace fa::cache {

bool MemoryStore::get(const Key &key, const std::string &key_material, Record *out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rows_.find({key.hi, key.lo});
  if (it == rows_.end()) {
    ++misses_;
    return false;
  }
  if (!key_material.empty() && it->second.record.key_material != key_material) {
    ++collisions_;
    ++misses_;
    return false;
  }
  ++hits_;
  it->second.hits++;
  it->second.last_used = unix_now();
  if (out) *out = it->second.record;
  return true;
}

void MemoryStore::put(const Key &key, const Record &record) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry &e = rows_[{key.hi, key.lo}];
  e.record = record;
  e.created = e.last_used = unix_now();
  e.hits = 0;
  ++puts_;
}

Stats MemoryStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.hits = hits_;
  s.misses = misses_;
  s.puts = puts_;
  s.collisions = collisions_;
  s.entries = rows_.size();
  for (const auto &kv : rows_) {
    s.bytes += kv.second.record.ptx.size() + kv.second.record.cubin.size();
  }
  s.persistent = false;
  s.note = note_;
  return s;
}

std::vector<RowInfo> MemoryStore::list() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RowInfo> rows;
  rows.reserve(rows_.size());
  for (const auto &kv : rows_) {
    RowInfo r;
    r.key_hex = Key{kv.first.first, kv.first.second}.hex();
    const Record &rec = kv.second.record;
    r.spec_text = rec.spec_text;
    r.sm = rec.sm;
    r.generator_version = rec.generator_version;
    r.driver_version = rec.driver_version;
    r.compiler = rec.compiler;
    r.ptx_bytes = rec.ptx.size();
    r.cubin_bytes = rec.cubin.size();
    r.hits = kv.second.hits;
    r.created = kv.second.created;
    r.last_used = kv.second.last_used;
    rows.push_back(std::move(r));
  }
  return rows;
}

fa_status MemoryStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rows_.clear();
  return FA_SUCCESS;
}

}  // namespace fa::cache
