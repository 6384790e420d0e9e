// Internal entry points for the project's own tests (not part of the C ABI,
// not exported from the shared library; tests link the static one).
#pragma once

#include "flashattn.h"
#include "kernels/kernels.h"
#include "kernels/policy.h"

namespace fa::api {

// Replaces rt's kernel policy (read from the environment when it was
// created) and returns the one it had: tests pick kernels with it. Not
// thread-safe with launches on rt; rt must be a valid runtime.
KernelPolicy set_kernel_policy(fa_runtime *rt, const KernelPolicy &policy);

// How many fa_launch calls on rt ran on the decode kernel (GQA packing,
// Runtime::forward_as_decode) so far.
uint64_t forwards_as_decode(const fa_runtime *rt);

// fa_backward with its checks, running only the kernels whose bits are set
// in `kernels` (fa::Runtime::kBackwardPre 1, kBackwardMain 2,
// kBackwardPost 4) on the default stream: the per-row kernels' tests.
fa_status backward_kernels(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *args,
                           unsigned kernels);

// The spec of the backward kernel of `kind` (KernelKind::BackwardPre,
// Backward, BackwardPost) that fa_backward(rt, cfg, args) launches
// (Runtime::backward_spec); args are not checked.
KernelSpec backward_spec(fa_runtime *rt, const fa_config *cfg, const fa_backward_args *args,
                         KernelKind kind);

}  // namespace fa::api
