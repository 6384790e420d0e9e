// Placeholder until the SQLite store lands.
#include "cache/store.h"

namespace fa::cache {
std::unique_ptr<Store> open_store(const Options &) { return nullptr; }
}  // namespace fa::cache
