// Index arithmetic that cannot wrap (docs/kernels.md, "Index arithmetic").
//
// Statically: no generated kernel of any kind forms a 32-bit product of two
// run-time values (every such product is mul.wide or 64-bit), checked over
// a grid of specs on every target. Dynamically, on the emulator (which
// reports any access outside an allocation and any signed 32-bit overflow):
// windows up to INT32_MAX behave as unbounded in the forward (tensor-core
// and scalar) and decode kernels, and a packed varlen batch whose rows start
// just below 2^31 writes its LSE at h * total_q + q0 > 2^32 correctly.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/tile/scheduler.h"
#include "support/cmocka.hh"  // last: its macros clash with <ios>
#include "support/numerics.h"

using namespace fa;

namespace {

// Lines of `ptx` holding a 32-bit integer multiply (mul.lo / mad.lo / mul24
// / mad24 on .s32 / .u32) of two non-immediate operands, as "line: text".
// The one exemption: a product right after the persistent schedulers'
// comment tile::kItemsProduct (u32 item numbering, every factor and product
// at most the item count, which the runtime keeps below 2^31).
std::vector<std::string> products_32(const std::string &ptx) {
  std::vector<std::string> found;
  std::istringstream in(ptx);
  std::string line;
  int no = 0;
  bool exempt = false;  // the line before was kItemsProduct's comment
  while (std::getline(in, line)) {
    ++no;
    size_t i = line.find_first_not_of(" \t");
    const bool after_marker = exempt;
    exempt = i != std::string::npos && line.compare(i, 2, "//") == 0 &&
             line.find(fa::kgen::tile::kItemsProduct) != std::string::npos;
    if (i == std::string::npos || line.compare(i, 2, "//") == 0 || after_marker) continue;
    if (line[i] == '@') i = line.find(' ', i) + 1;  // guard
    const size_t sp = line.find(' ', i);
    if (sp == std::string::npos) continue;
    const std::string op = line.substr(i, sp - i);
    const bool mul = op.rfind("mul.lo.", 0) == 0 || op.rfind("mad.lo.", 0) == 0 ||
                     op.rfind("mul24.", 0) == 0 || op.rfind("mad24.", 0) == 0;
    const bool w32 = op.size() >= 3 && (op.compare(op.size() - 3, 3, "s32") == 0 ||
                                        op.compare(op.size() - 3, 3, "u32") == 0);
    if (!mul || !w32) continue;
    // Operands: d, a, b[, c]; a and b are the factors.
    std::vector<std::string> ops;
    std::string cur;
    for (size_t k = sp + 1; k < line.size() && line[k] != ';'; ++k) {
      if (line[k] == ',') {
        ops.push_back(cur);
        cur.clear();
      } else if (line[k] != ' ') {
        cur += line[k];
      }
    }
    ops.push_back(cur);
    if (ops.size() >= 3 && ops[1][0] == '%' && ops[2][0] == '%')
      found.push_back(std::to_string(no) + ": " + line.substr(i));
  }
  return found;
}

AttentionConfig config(Dtype dt, int d, int dv, int hq, int hkv, bool softcap) {
  return attention_config(dt, d, dv, hq, hkv, 0.125f, softcap ? 30.0f : 0.0f);
}

// Split-KV forwards (the runtime's shape: KernelSpec::split_kv, its tile)
// over a contiguous and a paged cache with seqused_k, fixed-length and
// varlen (cu_seqlens_q; padded partial states), and the varlen combine.
void push_split(std::vector<KernelSpec> *out, const AttentionConfig &c, const DeviceLimits &lim) {
  for (int lay = 0; lay < 4; ++lay) {
    LaunchShape shape;
    shape.split_kv = true;
    shape.kv_layout = lay % 2 ? KvLayout::Paged : KvLayout::Contiguous;
    shape.page_size = lay % 2 ? 16 : 0;
    shape.seqused_k = lay % 2 == 1;
    shape.varlen = lay >= 2;
    out->push_back(make_spec(c, KernelKind::Forward, lim, shape));
    assert_true(out->back().split_kv && out->back().varlen == shape.varlen);
  }
  LaunchShape r;
  r.varlen = true;
  r.sinks = c.softcap > 0;  // both forms over the grid
  out->push_back(make_spec(c, KernelKind::Reduce, lim, r));
  assert_true(out->back().varlen);
}

// The persistent forward of config c on sm with the policy variable `env`
// on (FLASHATTN_SM90_PERSISTENT, FLASHATTN_SM80_PERSISTENT): static and
// dynamic, fixed-length and varlen (by work); nothing where the kernel
// chosen is not persistent (the mma.sync forward's O column slices).
void push_persistent(std::vector<KernelSpec> *out, const char *env, const AttentionConfig &c,
                     int sm) {
  setenv(env, "1", 1);
  for (bool vl : {false, true}) {
    KernelSpec p = make_spec(c, KernelKind::Forward, sm, vl);
    if (!p.persistent) continue;
    out->push_back(p);
    p.dynamic = true;
    out->push_back(p);
  }
  unsetenv(env);
}

// Every kernel kind over head dims, dtypes, softcap, varlen, GQA groups,
// the scalar forward fallback, and every target SM.
std::vector<KernelSpec> all_specs() {
  std::vector<KernelSpec> out;
  const int sms[] = {80, 86, 89, 90, 100, 120};
  const int dims[] = {8, 16, 40, 64, 72, 96, 128, 160, 256};
  const int groups[] = {1, 2, 3, 4, 8, 16};
  for (int sm : sms)
    for (Dtype dt : {Dtype::F16, Dtype::BF16})
      for (int d : dims)
        for (bool sc : {false, true}) {
          const int dv = d == 40 ? 72 : d;
          for (bool scalar : {false, true}) {
            if (scalar)
              setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
            else
              unsetenv("FLASHATTN_SCALAR_FORWARD");
            for (bool vl : {false, true})
              out.push_back(make_spec(config(dt, d, dv, 16, 16, sc), KernelKind::Forward, sm, vl));
          }
          unsetenv("FLASHATTN_SCALAR_FORWARD");
          for (int g : groups)
            out.push_back(
                make_spec(config(dt, d, dv, 2 * g, 2, sc), KernelKind::Decode, sm, false));
          out.push_back(make_spec(config(dt, d, dv, 4, 4, sc), KernelKind::Reduce, sm, false));
          // KV cache layouts: paged per tile and per row, pointer arrays.
          DeviceLimits lim;
          published_limits(sm, &lim);
          for (int lay = 0; lay < 3; ++lay) {
            LaunchShape shape;
            shape.kv_layout = lay == 2 ? KvLayout::PtrArray : KvLayout::Paged;
            shape.page_size = lay == 0 ? 128 : 3;
            shape.seqused_k = lay != 1;
            shape.varlen = lay == 1;
            out.push_back(
                make_spec(config(dt, d, dv, 16, 16, sc), KernelKind::Forward, lim, shape));
            out.push_back(make_spec(config(dt, d, dv, 8, 2, sc), KernelKind::Decode, lim, shape));
            if (lay != 1) {  // the fused combine (counter index, row addresses), with sinks
              LaunchShape fused = shape;
              fused.fused_combine = fused.sinks = true;
              out.push_back(make_spec(config(dt, d, dv, 8, 2, sc), KernelKind::Decode, lim, fused));
            }
            // fp8 KV cache (sm_89+, head dims multiples of 16): the descale
            // indices and the byte-tile copies.
            if (sm >= 89 && d % 16 == 0 && dv % 16 == 0) {
              AttentionConfig c8 = config(dt, d, dv, 8, 2, sc);
              c8.kv_fp8 = lay == 1 ? KvFp8::E5M2 : KvFp8::E4M3;
              out.push_back(make_spec(c8, KernelKind::Decode, lim, shape));
              if (lay == 0) out.push_back(make_spec(c8, KernelKind::Decode, sm, false));
            }
            // KV append with RoPE (both pairings, fp32 and 16-bit tables).
            shape.append_kv = true;
            shape.rotary = 1 + lay % 2;
            shape.rotary_half_table = lay == 2;
            out.push_back(make_spec(config(dt, d, dv, 8, 2, sc), KernelKind::Decode, lim, shape));
          }
          // Split-KV in the mma.sync forward (contiguous and paged), and
          // the persistent mma.sync forward (static and dynamic, varlen by
          // work; O in one slice).
          if (sm != 90) {
            push_split(&out, config(dt, d, dv, 16, 4, sc), lim);
            push_persistent(&out, "FLASHATTN_SM80_PERSISTENT", config(dt, d, dv, 16, 4, sc), sm);
          }
          // sm_90a: the persistent forward (static and dynamic; TMA and
          // gather, varlen by work) and the split-KV one (TMA and gather).
          if (sm == 90) {
            push_persistent(&out, "FLASHATTN_SM90_PERSISTENT", config(dt, d, dv, 16, 4, sc), sm);
            push_split(&out, config(dt, d, dv, 16, 4, sc), lim);
          }
        }
  // fp32 Q/K/V/O: the mma.sync forward and decode (every KV layout, varlen,
  // GQA) and the combine.
  for (int sm : sms)
    for (int d : dims)
      for (bool sc : {false, true}) {
        const int dv = d == 40 ? 72 : d;
        const AttentionConfig c = config(Dtype::F32, d, dv, 16, 4, sc);
        for (bool vl : {false, true}) out.push_back(make_spec(c, KernelKind::Forward, sm, vl));
        out.push_back(make_spec(c, KernelKind::Reduce, sm, false));
        DeviceLimits lim;
        published_limits(sm, &lim);
        for (int lay = 0; lay < 3; ++lay) {
          LaunchShape shape;
          shape.kv_layout = lay == 2 ? KvLayout::PtrArray : KvLayout::Paged;
          shape.page_size = lay == 0 ? 128 : 3;
          shape.seqused_k = lay != 1;
          shape.varlen = lay == 1;
          out.push_back(make_spec(c, KernelKind::Forward, lim, shape));
          shape.varlen = shape.seqused_k = false;
          out.push_back(make_spec(c, KernelKind::Decode, lim, shape));
        }
        out.push_back(make_spec(c, KernelKind::Decode, sm, false));
      }
  // The backward's kernels (head dims up to 128; varlen, sinks, ALiBi,
  // softcap, causal).
  for (int sm : sms)
    for (Dtype dt : {Dtype::F16, Dtype::BF16})
      for (int d : dims) {
        const int dv = d == 40 ? 72 : d;
        if (dv > 128) continue;
        DeviceLimits lim;
        published_limits(sm, &lim);
        for (int v = 0; v < 4; ++v) {
          LaunchShape shape;
          shape.varlen = v & 1;
          shape.sinks = v & 2;
          shape.alibi = v == 1;
          for (KernelKind k :
               {KernelKind::BackwardPre, KernelKind::Backward, KernelKind::BackwardPost}) {
            AttentionConfig cfg = config(dt, d, dv, 8, 2, v == 2);
            cfg.causal = v == 3;
            out.push_back(make_spec(cfg, k, lim, shape));
          }
        }
      }
  return out;
}

void test_checker_finds_products(void **) {
  const std::string ptx =
      "  mul.lo.s32 %r3, %r1, 64;\n"
      "  mad.lo.u32 %r4, %r1, 8, %r2;\n"
      "  mul.wide.s32 %rd1, %r1, %r2;\n"
      "  mul.lo.s64 %rd2, %rd1, %rd1;\n"
      "  // mul.lo.s32 %r5, %r1, %r2;\n"
      "  mul.lo.s32 %r5, %r1, %r2;\n"
      "  @%p1 mad.lo.s32 %r6, %r5, %ctaid.x, %r1;\n" +
      std::string("  // ") + fa::kgen::tile::kItemsProduct +
      "\n"
      "  mul.lo.u32 %r7, %r1, %r2;\n"   // exempt: right after the marker
      "  mul.lo.u32 %r8, %r1, %r2;\n";  // not: the marker covers one line
  const std::vector<std::string> f = products_32(ptx);
  assert_int_equal(f.size(), 3);
  assert_string_equal(f[0].c_str(), "6: mul.lo.s32 %r5, %r1, %r2;");
  assert_string_equal(f[1].c_str(), "7: mad.lo.s32 %r6, %r5, %ctaid.x, %r1;");
  assert_string_equal(f[2].c_str(), "10: mul.lo.u32 %r8, %r1, %r2;");
}

void test_no_32bit_products(void **) {
  size_t kernels = 0, bad = 0;
  for (const KernelSpec &spec : all_specs()) {
    const std::string ptx = generate_ptx(spec);
    assert_false(ptx.empty());
    ++kernels;
    for (const std::string &f : products_32(ptx)) {
      std::printf("  %s: %s\n", spec.describe().c_str(), f.c_str());
      ++bad;
    }
  }
  std::printf("  %zu kernels scanned, %zu 32-bit products of run-time values\n", kernels, bad);
  assert_int_equal(bad, 0);
}

struct State {
  fa_runtime *rt = nullptr;
  std::string why;
};

int setup(void **state) {
  auto *s = new State;
  s->rt = test::make_runtime(FA_BACKEND_EMULATOR, &s->why);
  *state = s;
  return s->rt ? 0 : -1;
}

int teardown(void **state) {
  auto *s = static_cast<State *>(*state);
  fa_runtime_destroy(s->rt);
  delete s;
  return 0;
}

constexpr int kMax = 2147483647;

// Windows at least as wide as the sequence, up to INT32_MAX, must equal the
// unbounded result (fp64 reference with the same windows), with seqlen_q
// shorter and longer than seqlen_k, causal or not, on both forward kernels.
void test_huge_windows_forward(void **state) {
  auto *s = static_cast<State *>(*state);
  const int wins[][2] = {{kMax, -1},         {-1, kMax}, {kMax, kMax}, {kMax - 1, 0},
                         {1 << 30, 1 << 30}, {kMax, 3},  {5, kMax},    {0, kMax}};
  const int lens[][2] = {{100, 37}, {37, 100}, {70, 70}};
  std::string failures;
  for (bool scalar : {false, true}) {
    if (scalar)
      setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
    else
      unsetenv("FLASHATTN_SCALAR_FORWARD");
    for (const auto &len : lens)
      for (bool causal : {false, true})
        for (const auto &w : wins) {
          test::ForwardCase c;
          c.seqlen_q = len[0];
          c.seqlen_k = len[1];
          c.heads_q = 2;
          c.heads_kv = 1;
          c.head_dim = 32;
          c.causal = causal;
          c.window_left = w[0];
          c.window_right = w[1];
          c.seed = 11;
          const std::string e = test::run_forward(s->rt, c);
          if (!e.empty()) failures += (scalar ? "scalar " : "") + c.describe() + ":\n" + e;
        }
  }
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

// The same for decode (window_left; decode queries are causal or see the
// whole cache), with cache_seqlens from empty to full and several splits.
void test_huge_windows_decode(void **state) {
  auto *s = static_cast<State *>(*state);
  std::string failures;
  for (int wl : {kMax, kMax - 1, 1 << 30, 300, 299})
    for (bool causal : {false, true}) {
      test::DecodeCase c;
      c.batch = 3;
      c.seqlen_q = 2;
      c.seqlen_k_max = 300;
      c.cache_seqlens = {300, 0, 131};
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim = 32;
      c.causal = causal;
      c.window_left = wl;
      c.num_splits = 3;
      c.seed = 12;
      const std::string e = test::run_decode(s->rt, c);
      if (!e.empty()) failures += c.describe() + ":\n" + e;
    }
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

// A packed batch whose rows start at 2^31 - 400: the LSE element
// h * total_q + q0 passes 2^31 (h = 1) and 2^32 (h = 2). Before it was
// formed in 64 bits it wrapped to an address gigabytes before the buffer.
// Both forward kernels, causal and windowed; the tensor-core one also with
// 600 keys in the first sequence (rows from 2^31 - 700) and the workspace
// it asks for: split-KV,
// whose varlen combine writes the packed O and LSE (checked to have run).
void test_varlen_past_2_31(void **state) {
  auto *s = static_cast<State *>(*state);
  std::string failures;
  for (int run = 0; run < 3; ++run) {
    const bool scalar = run == 2, split = run == 1;
    if (scalar)
      setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
    else
      unsetenv("FLASHATTN_SCALAR_FORWARD");
    for (bool causal : {false, true}) {
      test::ForwardCase c;
      c.batch = 3;
      c.varlen = true;
      c.seqlens_q = {100, 37, 1};
      c.seqlens_k = {150, 90, 64};
      c.seqlen_q = 100;
      c.seqlen_k = 150;
      c.heads_q = 3;
      c.heads_kv = 1;
      c.head_dim = 16;
      c.causal = causal;
      c.window_left = causal ? 40 : -1;
      c.varlen_first_row = kMax - 400;
      c.seed = 13;
      if (split) {
        // 10 key tiles of 64; cu_seqlens_k stays below 2^31 too.
        c.seqlens_k = {600, 60, 30};
        c.seqlen_k = 600;
        c.varlen_first_row = kMax - 700;
        c.workspace = test::kAutoWorkspace;
        setenv("FLASHATTN_EMU_PROFILE", "1", 1);
      }
      std::string e = test::run_forward(s->rt, c);
      unsetenv("FLASHATTN_EMU_PROFILE");
      const std::string k = split ? test::emulated_kernel(s->rt) : "";
      if (split && (k.rfind("fa_reduce_", 0) != 0 || k.find("_varlen") == std::string::npos))
        e += "split: the last kernel was " + k + ", not the varlen combine\n";
      if (!e.empty()) failures += (scalar ? "scalar " : "") + c.describe() + ":\n" + e;
    }
  }
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest statics[] = {
      cmocka_unit_test(test_checker_finds_products),
      cmocka_unit_test(test_no_32bit_products),
  };
  const struct CMUnitTest runs[] = {
      cmocka_unit_test(test_huge_windows_forward),
      cmocka_unit_test(test_huge_windows_decode),
      cmocka_unit_test(test_varlen_past_2_31),
  };
  int rc = cmocka_run_group_tests_name("index_arith_static", statics, nullptr, nullptr);
  rc |= cmocka_run_group_tests_name("index_arith_emulator", runs, setup, teardown);
  return rc;
}
