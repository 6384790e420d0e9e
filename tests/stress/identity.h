// Shared by the PTX identity programs (ptx_identity*.cc, not in CI): the
// FNV-1a 64 hash of a module and the line each prints for one
// fa_generate_for call.
#pragma once

#include <cstdio>
#include <string>

#include "flashattn.h"

inline unsigned long long fnv(const std::string &s) {
  unsigned long long h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Prints "<tag> <length> <fnv1a64>" of the module fa_generate_for(cfg,
// kind, sm, o) gives, or "<tag> ERROR <fa_last_error()>"; true when it
// printed a module.
inline bool print_module(const fa_config *cfg, fa_kernel_kind kind, int sm,
                         const fa_generate_options *o, const char *tag) {
  size_t len = 0;
  if (fa_generate_for(cfg, kind, sm, o, nullptr, 0, &len) != FA_SUCCESS) {
    std::printf("%s ERROR %s\n", tag, fa_last_error());
    return false;
  }
  std::string ptx(len + 1, '\0');
  fa_generate_for(cfg, kind, sm, o, &ptx[0], ptx.size(), &len);
  ptx.resize(len);
  std::printf("%s %zu %016llx\n", tag, len, fnv(ptx));
  return true;
}
