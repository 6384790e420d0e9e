// The persistent sm_90a forward (KernelSpec::persistent, KernelPolicy::
// sm90_persistent; docs/kernels.md, "Persistent variant") on an emulated
// sm_90: each case runs through the numerics runner (fresh random inputs,
// outputs poisoned first, O and LSE against the fp64 reference) once on the
// one-CTA-per-item kernel and once on the persistent one, and the two must
// agree bit for bit in O and LSE. The persistent grid is forced small
// (KernelPolicy::persistent_grid) so that each CTA runs several work items
// and the item count is not a multiple of the grid; one case keeps the
// emulator's SM count (108 CTAs for 128 items). Cases: seqlen_q = 1, causal
// with seqlen_q > seqlen_k (m-blocks and rows with no key), windows both
// ways and left only, GQA, head_dim 64 / 128 / 256 and d != dv, fp16 and
// bf16, softcap, several K/V ring rounds per item. Each launch is checked
// (by the emulator profile's kernel name) to have run the kernel it should.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

struct Case {
  fa::test::ForwardCase c;
  int grid = 0;  // persistent CTAs at most (0: the emulator's SM count)
};

std::string ran(fa_runtime *rt) {
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(rt, &prof) != FA_SUCCESS) return "(no profile)";
  return prof.kernel;
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  unsetenv("FLASHATTN_SM90_PERSISTENT");
  std::string why;
  fa_runtime *rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &why, 90);
  if (rt == nullptr) {
    std::printf("FAIL: %s\n", why.c_str());
    return 1;
  }
  std::vector<Case> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int dd, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap, int grid) {
    Case x;
    x.c = fa::test::forward_case(b, sq, sk, hq, hkv, dd, dv, bf16, causal, wl, wr, cap,
                                 static_cast<uint32_t>(cases.size() + 2700));
    x.grid = grid;
    cases.push_back(x);
  };
  add(2, 300, 300, 4, 2, 128, 128, true, true, -1, -1, 0, 5);    // 24 items on 5 CTAs
  add(3, 1, 200, 4, 1, 64, 64, false, true, -1, -1, 0, 5);       // seqlen_q = 1, GQA 4
  add(2, 300, 100, 3, 3, 128, 128, false, true, -1, -1, 0, 4);   // rows and m-blocks with no key
  add(1, 260, 517, 8, 2, 64, 64, true, false, 100, 30, 0, 7);    // window both ways, 5 rounds
  add(1, 200, 300, 6, 2, 256, 256, false, true, -1, -1, 30, 5);  // d256 (no ping-pong), softcap
  add(2, 129, 129, 2, 1, 96, 64, true, false, 40, -1, 0, 3);     // d != dv, left window alone
  add(8, 129, 140, 8, 4, 64, 64, false, true, -1, -1, 0, 0);     // 128 items on 108 CTAs
  std::string failures;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  for (Case &x : cases) {
    fa::test::ForwardCase &c = x.c;
    std::vector<float> o[2], lse[2];
    for (int persistent = 0; persistent < 2; ++persistent) {
      fa::test::PolicyScope on(rt, &fa::KernelPolicy::sm90_persistent, persistent == 1);
      fa::test::PolicyScope grid(rt, &fa::KernelPolicy::persistent_grid, x.grid);
      c.o_out = &o[persistent];
      c.lse_out = &lse[persistent];
      const std::string e = fa::test::run_forward(rt, c);
      const std::string what = c.describe() + (persistent ? " persistent" : "");
      if (!e.empty()) failures += what + ":\n" + e;
      const std::string k = ran(rt);
      const bool is_p = k.find("_persistent") != std::string::npos;
      if (k.find("fa_forward_wgmma_") != 0 || is_p != (persistent == 1))
        failures += what + ": ran " + k + "\n";
    }
    if (o[0].size() != o[1].size() || lse[0].size() != lse[1].size() ||
        std::memcmp(o[0].data(), o[1].data(), o[0].size() * sizeof(float)) != 0 ||
        std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * sizeof(float)) != 0) {
      size_t diff = 0;
      for (size_t i = 0; i < o[0].size() && i < o[1].size(); ++i)
        diff += std::memcmp(&o[0][i], &o[1][i], sizeof(float)) != 0;
      failures += c.describe() + ": the persistent kernel's O or LSE differs from the " +
                  "one-CTA-per-item kernel's (" + std::to_string(diff) + " O elements)\n";
    }
  }
  unsetenv("FLASHATTN_EMU_PROFILE");
  fa_runtime_destroy(rt);
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  std::printf("%zu cases: persistent O and LSE bit-identical to one CTA per item\n", cases.size());
  return 0;
}
