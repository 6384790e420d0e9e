// Picking kernels in tests: a runtime reads its KernelPolicy from the
// environment once, when it is created (kernels/policy.h), so a test that
// wants the scalar, mma.sync or sm_90a kernels on a runtime it already has
// sets that runtime's policy for a scope instead of the environment.
#pragma once

#include "api/test_hooks.h"

namespace fa::test {

// The policy rt runs with until the scope ends: rt's own, with one field
// changed (e.g. PolicyScope s(rt, &fa::KernelPolicy::scalar_forward)).
class PolicyScope {
 public:
  PolicyScope(fa_runtime *rt, bool fa::KernelPolicy::*field, bool value = true) : rt_(rt) {
    set(field, value);
  }
  // The same for an int field (e.g. &fa::KernelPolicy::persistent_grid).
  PolicyScope(fa_runtime *rt, int fa::KernelPolicy::*field, int value) : rt_(rt) {
    set(field, value);
  }
  ~PolicyScope() { fa::api::set_kernel_policy(rt_, old_); }
  PolicyScope(const PolicyScope &) = delete;
  PolicyScope &operator=(const PolicyScope &) = delete;

 private:
  template <typename T>
  void set(T fa::KernelPolicy::*field, T value) {
    fa::KernelPolicy p = fa::api::set_kernel_policy(rt_, fa::KernelPolicy());
    old_ = p;
    p.*field = value;
    fa::api::set_kernel_policy(rt_, p);
  }
  fa_runtime *rt_;
  fa::KernelPolicy old_;
};

}  // namespace fa::test
