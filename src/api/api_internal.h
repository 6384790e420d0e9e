// Pieces the C entry points share across src/api/*.cc: error capture
// (guarded), argument checks, and the kernel a config, kind, SM and launch
// shape select (what fa_generate_for and fa_cache_warm build).
#pragma once

#include <cstring>
#include <exception>
#include <new>

#include "common/error.h"
#include "flashattn.h"
#include "api/test_hooks.h"
#include "kernels/kernels.h"


namespace fa::api {

// The SMs fa_generate and the emulator accept (fa::published_limits).
constexpr const char *kSupportedSms = "80, 86, 87, 89, 90, 100, 103, 110, 120, 121";

// Runs body with the thread's error cleared, converts exceptions to statuses
// and prefixes a failure's message with the API name.
template <typename F>
fa_status guarded(const char *api, F &&body) {
  clear_error();
  fa_status st;
  try {
    st = body();
  } catch (const std::bad_alloc &) {
    st = fail(FA_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception &e) {
    st = fail(FA_ERROR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    st = fail(FA_ERROR_INTERNAL, "internal error: unknown exception");
  }
  if (st != FA_SUCCESS) prefix_error(api);
  return st;
}

// struct_size must cover every field this library reads and must not claim
// fields it does not know (a newer header).
inline fa_status check_struct_size(const char *name, size_t given, size_t expected) {
  if (given != expected) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "%s.struct_size is %zu, expected %zu (use the FA_*_INIT initializer; a "
                "different size means a header from another flashattn version)",
                name, given, expected);
  }
  return FA_SUCCESS;
}

#define FA_CHECK(expr)                 \
  do {                                 \
    fa_status st_ = (expr);            \
    if (st_ != FA_SUCCESS) return st_; \
  } while (0)

#define FA_REQUIRE(cond, ...)                                         \
  do {                                                                \
    if (!(cond)) return fail(FA_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

// The value of an enum field as the caller stored it. A C caller may store
// any int; reading an out-of-range value as the C++ enum type is undefined.
template <typename E>
int raw_enum(const E &e) {
  static_assert(sizeof(E) == sizeof(int), "fa_ enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// fa_config_create's validation: *c from desc (any struct_size a released
// header had). Errors: INVALID_ARGUMENT naming the field.
fa_status config_from_desc(const fa_config_desc *desc, AttentionConfig *c);

// The kernel fa_generate_for(cfg, kind, sm, opts) generates with `policy`
// (fa_generate_for: the environment's): *spec, after
// the checks that launch would make (fp8, fp32 and head-dim support on that
// SM; the backward kinds: fa::check_backward, and fa::backward_spec as
// fa_backward's runtime). opts NULL = fa_generate's shape. Errors:
// INVALID_ARGUMENT (kind, an option; the message names it), UNSUPPORTED (sm,
// the kernel on that SM, or an option fa_backward refuses).
fa_status kernel_spec_for(const AttentionConfig &cfg, int kind, int32_t sm,
                          const fa_generate_options *opts, const KernelPolicy &policy,
                          KernelSpec *spec);

}  // namespace fa::api
