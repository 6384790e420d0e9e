// Placeholder until the generators land.
#include "kernels/kernels.h"

namespace fa {
std::string KernelSpec::serialize() const { return {}; }
std::string KernelSpec::describe() const { return {}; }
KernelSpec make_spec(const AttentionConfig &, KernelKind kind, int sm, bool) {
  KernelSpec s;
  s.kind = kind;
  s.sm = sm;
  return s;
}
int ptx_isa_version(const KernelSpec &) { return 70; }
std::string entry_name(const KernelSpec &) { return "fa_stub"; }
std::string generate_ptx(const KernelSpec &) { return {}; }
LaunchGeometry forward_geometry(const KernelSpec &, const ForwardParams &) { return {}; }
LaunchGeometry decode_geometry(const KernelSpec &, const DecodeParams &) { return {}; }
LaunchGeometry reduce_geometry(const KernelSpec &, const ReduceParams &) { return {}; }
uint32_t max_dynamic_smem(const KernelSpec &) { return 0; }
}  // namespace fa
