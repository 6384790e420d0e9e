// The numerics suite as a CMocka group, shared by test_numerics (emulator)
// and test_gpu (cuda).
#include "support/cmocka.hh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/backward.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace fa::test {
namespace {

struct SuiteState {
  fa_runtime *rt = nullptr;
  std::string why;
  bool gpu = false;
};

fa_backend g_backend = FA_BACKEND_EMULATOR;
bool g_gpu = false;
int g_emulator_sm = 0;
const char *g_forward_kernel = nullptr;  // run_numerics_suite's forward_kernel

// With forward_kernel: case c's launch must have run it (its entry name
// contains it; FLASHATTN_EMU_PROFILE=1 set by the caller), unless the
// kernel cannot take c (a refused launch, head dims past 256, fp8 head
// dims not whole k16 steps).
std::string check_forward_kernel(fa_runtime *rt, const ForwardCase &c) {
  const int dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  if (!g_forward_kernel || c.reject || c.head_dim > 256 || dv > 256 ||
      (c.q_fp8 && (c.head_dim % 16 || dv % 16)))
    return "";
  const std::string k = emulated_kernel(rt);
  if (k.find(g_forward_kernel) != std::string::npos) return "";
  return c.describe() + ": ran " + k + ", not " + g_forward_kernel + "\n";
}

int suite_setup(void **state) {
  auto *s = new SuiteState;
  s->gpu = g_gpu;
  s->rt = make_runtime(g_backend, &s->why, g_emulator_sm);
  *state = s;
  return 0;
}

int suite_teardown(void **state) {
  auto *s = static_cast<SuiteState *>(*state);
  fa_runtime_destroy(s->rt);
  delete s;
  return 0;
}

SuiteState *need_runtime(void **state) {
  auto *s = static_cast<SuiteState *>(*state);
  if (!s->rt) {
    std::printf("SKIP: backend unavailable: %s\n", s->why.c_str());
    skip();
  }
  return s;
}

void report(const std::string &failures) {
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

void test_forward_random(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  for (const ForwardCase &c : forward_cases(s->gpu)) {
    const std::string e = run_forward(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    failures += check_forward_kernel(s->rt, c);
  }
  report(failures);
}

void test_forward_fixtures(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  int ran = 0;
  for (const char *name : {"minilm_l6", "smollm2_135m"}) {
    std::vector<float> q, k, v;
    std::vector<int64_t> qs, ks, vs;
    if (!load_fixture(name, "q", &q, &qs) || !load_fixture(name, "k", &k, &ks) ||
        !load_fixture(name, "v", &v, &vs) || qs.size() != 4 || ks.size() != 4) {
      continue;
    }
    for (bool bf16 : {false, true}) {
      ForwardCase c;
      c.batch = int(qs[0]);
      c.seqlen_q = int(qs[1]);
      c.heads_q = int(qs[2]);
      c.head_dim = int(qs[3]);
      c.seqlen_k = int(ks[1]);
      c.heads_kv = int(ks[2]);
      c.head_dim_v = int(vs[3]);
      c.causal = std::string(name) == "smollm2_135m";
      c.bf16 = bf16;
      c.q = &q;
      c.k = &k;
      c.v = &v;
      std::printf("  fixture %s\n", name);
      const std::string e = run_forward(s->rt, c);
      if (!e.empty()) failures += std::string(name) + " " + c.describe() + ":\n" + e;
      failures += check_forward_kernel(s->rt, c);
      ++ran;
    }
  }
  if (ran == 0) {
    print_error("no fixture found under %s\n", FA_TEST_DATA_DIR);
    fail();
  }
  report(failures);
}

void test_decode(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  for (const DecodeCase &c : decode_cases(s->gpu)) {
    const std::string e = run_decode(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  report(failures);
}

void test_decode_fixture(void **state) {
  SuiteState *s = need_runtime(state);
  const char *fx = "smollm2_135m";
  std::vector<float> k, v, lens;
  std::vector<int64_t> ks, vs, ls;
  if (!load_fixture(fx, "k_cache", &k, &ks) || !load_fixture(fx, "v_cache", &v, &vs) ||
      !load_fixture(fx, "cache_seqlens", &lens, &ls)) {
    print_error("no decode fixture under %s/%s\n", FA_TEST_DATA_DIR, fx);
    fail();
  }
  std::string failures;
  // One next-token query per sequence, then the last two positions (causal).
  for (const char *qname : {"q_decode", "q_decode2"}) {
    std::vector<float> q;
    std::vector<int64_t> qs;
    if (!load_fixture(fx, qname, &q, &qs)) {
      print_error("missing %s/%s.npy\n", fx, qname);
      fail();
    }
    // Contiguous (automatic and forced splits), then the same cache re-laid
    // into shuffled pages of 16 and of 3 tokens, and into per-sequence
    // pointer arrays.
    struct Variant {
      int splits, layout, page_size;
    };
    for (const Variant &var : {Variant{0, FA_KV_CONTIGUOUS, 0}, Variant{5, FA_KV_CONTIGUOUS, 0},
                               Variant{0, FA_KV_PAGED, 16}, Variant{5, FA_KV_PAGED, 3},
                               Variant{0, FA_KV_PTR_ARRAY, 0}}) {
      const int splits = var.splits;
      DecodeCase c;
      c.kv.layout = var.layout;
      c.kv.page_size = var.page_size;
      c.kv.seed = 23;
      c.batch = int(qs[0]);
      c.seqlen_q = int(qs[1]);
      c.heads_q = int(qs[2]);
      c.head_dim = int(qs[3]);
      c.seqlen_k_max = int(ks[1]);
      c.heads_kv = int(ks[2]);
      c.head_dim_v = int(vs[3]);
      for (float l : lens) c.cache_seqlens.push_back(int(l));
      c.causal = true;
      c.num_splits = splits;
      c.q = &q;
      c.k = &k;
      c.v = &v;
      std::printf("  fixture %s %s\n", fx, qname);
      const std::string e = run_decode(s->rt, c);
      if (!e.empty()) failures += c.describe() + ":\n" + e;
    }
  }
  report(failures);
}

void test_features(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  for (const ForwardCase &c : feature_forward_cases(s->gpu)) {
    const std::string e = run_forward(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    failures += check_forward_kernel(s->rt, c);
  }
  for (const DecodeCase &c : feature_decode_cases(s->gpu)) {
    const std::string e = run_decode(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  report(failures);
}

// MLA's latent cache read once: the same decode (one split, one sequence,
// 16 query heads over one KV head, 576 / 512: two O slices) with V a copy
// of K's first 512 columns and with V handed as K's own memory. The second
// runs the v_in_k kernel and its cp.async sectors lack exactly V's: each
// of the two slice CTAs reads 256 columns (16 sectors) of V's 100 rows.
// The mma.sync decode's (at SM 100 the MLA shape otherwise runs the sm_100a
// MLA kernel, test_mla_decode's).
std::string v_in_k_sectors(fa_runtime *rt) {
  PolicyScope mma_sync(rt, &fa::KernelPolicy::sm100_mla, false);
  const bool profiling = std::getenv("FLASHATTN_EMU_PROFILE") != nullptr;  // the caller's
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  DecodeCase c;
  c.seqlen_k_max = 100;
  c.cache_seqlens = {100};
  c.heads_q = 16;
  c.head_dim = 576;
  c.head_dim_v = 512;
  c.bf16 = true;
  c.num_splits = 1;
  c.partials_only = true;  // the decode kernel is the last launch
  c.seed = 607;
  std::string err;
  fa_emu_profile sep = FA_EMU_PROFILE_INIT, in_k = FA_EMU_PROFILE_INIT;
  err += run_decode(rt, c);
  if (fa_emulator_profile(rt, &sep) != FA_SUCCESS) err += "no profile\n";
  c.v_in_k = true;
  err += run_decode(rt, c);
  if (fa_emulator_profile(rt, &in_k) != FA_SUCCESS) err += "no profile\n";
  if (!profiling) unsetenv("FLASHATTN_EMU_PROFILE");
  const unsigned long long s_sep = sep.total.cp_async_sectors, s_in = in_k.total.cp_async_sectors;
  std::printf("  v_in_k: %s %llu sectors, %s %llu sectors\n", sep.kernel, s_sep, in_k.kernel, s_in);
  if (std::strstr(sep.kernel, "_vink") || !std::strstr(in_k.kernel, "_vink"))
    err += "v_in_k: kernels " + std::string(sep.kernel) + ", " + in_k.kernel + "\n";
  if (s_sep < s_in || s_sep - s_in != 2ull * 100 * 16)
    err += "v_in_k: sectors " + std::to_string(s_sep) + " vs " + std::to_string(s_in) + "\n";
  return err;
}

void test_large_heads(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  for (const ForwardCase &c : large_head_forward_cases(s->gpu)) {
    const std::string e = run_forward(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  for (const DecodeCase &c : large_head_decode_cases(s->gpu)) {
    const std::string e = run_decode(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  if (g_backend == FA_BACKEND_EMULATOR) failures += v_in_k_sectors(s->rt);
  report(failures);
}

// The backward (fa_backward: mma.sync, sm_80+): every third of
// support/backward.h's cases (all of them on a GPU) and the deterministic
// checks; head dims past 128 are taken where shared memory holds their tile.
void test_backward(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  const std::vector<bwd::Case> all = bwd::cases();
  // FA_TEST_QUICK (the sanitizer pass): every sixth, no deterministic check
  // (test_backward has both).
  const char *q = std::getenv("FA_TEST_QUICK");
  const bool quick = q && q[0] == '1' && !s->gpu;
  for (size_t i = 0; i < all.size(); i += s->gpu ? 1 : quick ? 6 : 3) {
    const std::string e = bwd::run_case(s->rt, all[i]);
    if (!e.empty()) failures += all[i].describe() + ":\n" + e;
  }
  if (!quick) failures += bwd::deterministic_check(s->rt);
  report(failures);
}

// The fp8 forward where the device has it (sm_89+: every form, by SM); below
// sm_89, UNSUPPORTED with the reason.
void test_fp8_forward(void **state) {
  SuiteState *s = need_runtime(state);
  fa_runtime_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  assert_int_equal(fa_runtime_get_info(s->rt, &info), FA_SUCCESS);
  std::string failures;
  for (const ForwardCase &c : fp8_forward_cases(s->gpu)) {
    const std::string e = run_forward(s->rt, c);
    if (info.sm < 89) {
      if (e.find("sm_89") == std::string::npos)
        failures += c.describe() + ": expected UNSUPPORTED (sm_89), got: " + e + "\n";
      continue;
    }
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    failures += check_forward_kernel(s->rt, c);
  }
  report(failures);
}

void test_reduce(void **state) {
  SuiteState *s = need_runtime(state);
  std::string failures;
  failures += run_reduce(s->rt, 5, 2, 3, 4, 64, false, 1);
  failures += run_reduce(s->rt, 1, 1, 2, 2, 128, true, 2);
  failures += run_reduce(s->rt, 17, 1, 1, 8, 256, false, 3);
  failures += run_reduce(s->rt, 3, 3, 5, 1, 8, true, 4);
  failures += run_reduce(s->rt, 4, 2, 1, 3, 512, true, 5);  // MLA's head_dim_v
  report(failures);
}

// Split-KV in the forward (docs/kernels.md, "Split-KV forward") at GPU
// sizes: launches whose CTAs leave SMs idle, with the workspace
// fa_forward_workspace_size asks for (partial states poisoned), against
// the fp64 reference: on sm_90a the runtime splits them. On the emulator
// test_forward_split runs smaller cases (and checks that they split).
void test_forward_split(void **state) {
  SuiteState *s = need_runtime(state);
  if (!s->gpu) return;
  std::string failures;
  std::vector<ForwardCase> cases = {
      forward_case(1, 200, 16384, 8, 2, 128, 128, true, true, -1, -1, 0, 901),
      forward_case(2, 1, 32768, 32, 8, 128, 128, true, true, -1, -1, 0, 902),
      forward_case(1, 64, 8192, 16, 2, 64, 64, false, false, -1, -1, 0, 903),
      forward_case(1, 128, 4096, 8, 8, 256, 256, true, true, 2000, 0, 0, 904)};
  for (ForwardCase &c : cases) {
    c.workspace = kAutoWorkspace;
    const std::string e = run_forward(s->rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  report(failures);
}

}  // namespace

int run_numerics_suite(const char *group, fa_backend backend, bool gpu_shapes, int emulator_sm,
                       const char *forward_kernel) {
  g_backend = backend;
  g_forward_kernel = forward_kernel;
  g_emulator_sm = emulator_sm;
  g_gpu = gpu_shapes;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_random), cmocka_unit_test(test_forward_fixtures),
      cmocka_unit_test(test_decode),         cmocka_unit_test(test_decode_fixture),
      cmocka_unit_test(test_reduce),         cmocka_unit_test(test_features),
      cmocka_unit_test(test_large_heads),    cmocka_unit_test(test_fp8_forward),
      cmocka_unit_test(test_forward_split),  cmocka_unit_test(test_backward),
  };
  return _cmocka_run_group_tests(group, tests, sizeof tests / sizeof tests[0], suite_setup,
                                 suite_teardown);
}

}  // namespace fa::test
