#include "kernels/policy.h"

#include <cstdlib>

namespace fa {
namespace {

bool env_on(const char *name) {
  const char *v = std::getenv(name);
  return v && v[0] == '1';
}

}  // namespace

KernelPolicy KernelPolicy::from_env() {
  KernelPolicy p;
  p.scalar_forward = env_on("FLASHATTN_SCALAR_FORWARD");
  p.scalar_decode = env_on("FLASHATTN_SCALAR_DECODE");
  if (const char *w = std::getenv("FLASHATTN_SM90_WGMMA")) p.sm90_wgmma = w[0] == '1';
  if (env_on("FLASHATTN_FORCE_SM80_FORWARD")) p.sm90_wgmma = false;
  p.sm90_fp8_f16 = env_on("FLASHATTN_SM90_FP8_F16");
  p.sm90_persistent = env_on("FLASHATTN_SM90_PERSISTENT");
  p.sm80_persistent = env_on("FLASHATTN_SM80_PERSISTENT");
  p.pdl = env_on("FLASHATTN_PDL");
  p.sm90_mla = env_on("FLASHATTN_SM90_MLA");
  if (const char *f = std::getenv("FLASHATTN_FORWARD_SPLITS")) p.forward_splits = f[0] == '1';
  if (const char *g = std::getenv("FLASHATTN_FORWARD_GQA_PACK")) p.forward_gqa_pack = g[0] == '1';
  if (const char *d = std::getenv("FLASHATTN_DECODE_FUSED")) p.decode_fused = d[0] == '1';
  p.decode_fp8_mma = env_on("FLASHATTN_DECODE_FP8_MMA");
  if (const char *v = std::getenv("FLASHATTN_SM100_FORWARD")) p.sm100_forward = v[0] == '1';
  if (const char *v = std::getenv("FLASHATTN_SM100_MLA")) p.sm100_mla = v[0] == '1';
  if (const char *v = std::getenv("FLASHATTN_SM100_CTA_PAIR")) p.sm100_cta_pair = v[0] == '1';
  if (const char *v = std::getenv("FLASHATTN_SM90_BACKWARD")) p.sm90_backward = v[0] == '1';
  return p;
}

}  // namespace fa
