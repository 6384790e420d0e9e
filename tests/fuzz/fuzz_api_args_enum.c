/* C shims for fuzz_api_args.cc: pass an arbitrary int where the API takes an
 * enum by value. In C an enum is an int, so any value may be passed (as any C
 * caller may); in C++ merely loading an out-of-range enum value is undefined
 * behaviour and UBSan (-fsanitize=enum) reports it in the harness. */
#include "flashattn.h"

fa_status fa_fuzz_generate(const fa_config *cfg, int kind, int32_t sm, char *buf, size_t buf_size,
                           size_t *ptx_size);

fa_status fa_fuzz_generate(const fa_config *cfg, int kind, int32_t sm, char *buf, size_t buf_size,
                           size_t *ptx_size) {
  return fa_generate(cfg, (fa_kernel_kind)kind, sm, buf, buf_size, ptx_size);
}
