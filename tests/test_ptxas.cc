// Assembles the generated PTX of a grid of kernel specs with NVIDIA's ptxas
// (FA_PTXAS_PATH) for sm_80, sm_86, sm_89 and sm_90: every module must
// assemble. Register use and spills from `ptxas -v` are printed; a forward
// (tensor-core) or backward module with a stack frame or spills, or above
// 255 registers, fails the test (decode and reduce are only reported), as
// does any
// "Potential Performance Loss" advisory (C75xx: e.g. setmaxnreg ignored,
// wgmma serialized). Modules are assembled whole-program, as the cuda
// backend has the driver compile them (src/backend/README.md: relocatable
// code, what cuLink* makes, spills and serializes). Skipped when ptxas is
// not available. Modules whose answer tests/data/ptxas_results.tsv records
// for this ptxas are not assembled again, bar a sample that must agree
// (test_ptxas_assembles_grid). Up to one ptxas per online CPU (at least 2). Under
// FA_TEST_QUICK=1 (the sanitizer pass) the grid is generated whole, so ASan
// and UBSan see every generator path, but not assembled: ptxas is not what
// the sanitizers check, and the normal pass assembles the same bytes.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL  // header-only, as the library uses it
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/tile/tile.h"
#include "ptx/ptx.h"
#include "support/cmocka.hh"  // last: its macros clash with <ios>

extern char **environ;

using namespace fa;

namespace {

struct Job {
  KernelSpec spec;
  std::string ptx_path, log_path;
  pid_t pid = 0;
  int status = 0;
};

AttentionConfig config(Dtype dt, int d, int dv, int hq, int hkv, bool softcap) {
  return attention_config(dt, d, dv, hq, hkv, 0.1f, softcap ? 20.0f : 0.0f);
}

// The i-th of a mix of tensor-core decode shapes at head dim d (the PDL and
// fused-combine grids): paged (pages of 16) on odd i, a KV append with RoPE
// where `append`, MLA's V in K at 576 (512, one KV head of 16), else GQA 8/2;
// bf16 on odd i, softcap every third.
LaunchShape decode_mix_shape(int i, int d, bool append) {
  LaunchShape shape;
  shape.kv_layout = i % 2 ? KvLayout::Paged : KvLayout::Contiguous;
  shape.page_size = i % 2 ? 16 : 0;
  shape.append_kv = append;
  shape.rotary = append ? 1 : 0;
  shape.v_in_k = d == 576;
  return shape;
}
AttentionConfig decode_mix_config(int i, int d) {
  return config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d == 576 ? 512 : d, d == 576 ? 16 : 8,
                d == 576 ? 1 : 2, i % 3 == 1);
}

DeviceLimits limits_of(int sm) {
  DeviceLimits d;
  if (!published_limits(sm, &d)) published_limits(80, &d);
  return d;
}

// The grid: every head_dim, both dtypes, softcap and varlen toggled, on
// sm_80; a representative subset on the other targets.
std::vector<KernelSpec> grid() {
  std::vector<KernelSpec> out;
  const int dims[] = {8, 16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 224, 256};
  const Dtype dts[] = {Dtype::F16, Dtype::BF16};
  int n = 0;
  for (int d : dims) {
    for (Dtype dt : dts) {
      bool sc = (n % 2) == 0, vl = (n % 3) == 0;
      ++n;
      out.push_back(make_spec(config(dt, d, d, 8, 8, sc), KernelKind::Forward, 80, vl));
    }
  }
  const int dpairs[][2] = {{64, 128}, {128, 64}, {40, 72}, {256, 8}, {8, 256}, {96, 200}};
  for (const auto &p : dpairs)
    out.push_back(
        make_spec(config(Dtype::F16, p[0], p[1], 4, 4, true), KernelKind::Forward, 80, p[0] == 40));
  const int groups[] = {1, 4, 8};
  const int ddims[] = {64, 128, 256};
  for (int g : groups) {
    for (int d : ddims) {
      Dtype dt = (g + d / 64) % 2 ? Dtype::BF16 : Dtype::F16;
      out.push_back(make_spec(config(dt, d, d, 8, 8 / g, d == 128), KernelKind::Decode, 80, false));
    }
  }
  out.push_back(make_spec(config(Dtype::BF16, 40, 24, 8, 1, true), KernelKind::Decode, 80, false));
  const int rdims[] = {8, 40, 64, 128, 256};
  for (int dv : rdims)
    out.push_back(make_spec(config(dv == 64 ? Dtype::BF16 : Dtype::F16, 64, dv, 8, 8, false),
                            KernelKind::Reduce, 80, false));
  // Every shipped forward head dim on every target: sm_80 with f16 without
  // softcap and bf16 with softcap; sm_86/89/90 with softcap (the most
  // registers), dtypes alternating. Varlen on every third.
  const int all_sms[] = {80, 86, 89, 90};
  for (int sm : all_sms) {
    for (int d = 8; d <= 256; d += 8) {
      for (int v = 0; v < (sm == 80 ? 2 : 1); ++v) {
        Dtype dt = (sm == 80 ? v : (d / 8) % 2) ? Dtype::BF16 : Dtype::F16;
        bool sc = sm == 80 ? v == 1 : true;
        out.push_back(make_spec(config(dt, d, d, 8, 2, sc), KernelKind::Forward, sm, d % 24 == 0));
      }
    }
  }
  // FA_PTXAS_FULL=1 (tests/stress/ptxas_full.sh, not in CI): every forward
  // head dim x dtype x softcap x varlen on every target SM.
  const char *full = std::getenv("FA_PTXAS_FULL");
  if (full && full[0] == '1') {
    const int targets[] = {80, 86, 87, 89, 90, 100, 103, 110, 120, 121};
    for (int sm : targets)
      for (int d = 8; d <= 256; d += 8)
        for (Dtype dt : dts)
          for (int v = 0; v < 4; ++v)
            out.push_back(make_spec(config(dt, d, d, 8, 2, v & 1), KernelKind::Forward, sm, v & 2));
  }
  // The newer targets: the SMs' own limits choose the tiles.
  const int new_sms[] = {87, 100, 103, 110, 120, 121};
  for (int sm : new_sms) {
    for (int d : {64, 96, 128, 256})
      out.push_back(make_spec(config(d == 96 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d == 128),
                              KernelKind::Forward, sm, d == 96));
    out.push_back(
        make_spec(config(Dtype::BF16, 128, 128, 8, 2, false), KernelKind::Decode, sm, false));
    out.push_back(
        make_spec(config(Dtype::F16, 0, 128, 8, 8, false), KernelKind::Reduce, sm, false));
  }
  // KV cache layouts: paged (a page a multiple of the key tile: one lookup
  // per tile; else per row), pointer arrays, seqused_k; forward and decode,
  // at the head dims with the most registers.
  for (int sm : {80, 86, 90, 120}) {
    for (int d : {64, 128, 256}) {
      for (int lay = 0; lay < 3; ++lay) {
        LaunchShape shape;
        shape.kv_layout = lay == 2 ? KvLayout::PtrArray : KvLayout::Paged;
        shape.page_size = lay == 0 ? 256 : 16;
        shape.seqused_k = true;
        shape.varlen = lay == 1;
        const DeviceLimits lim = limits_of(sm);
        out.push_back(make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d != 64),
                                KernelKind::Forward, lim, shape));
        out.push_back(
            make_spec(config(Dtype::BF16, d, d, 8, 2, d == 128), KernelKind::Decode, lim, shape));
      }
    }
  }
  // Speculative-decoding tree masks (both decode kernels, every layout,
  // GQA groups, softcap) and the reduce's LSE formats.
  for (int sm : {80, 86, 90, 120}) {
    const DeviceLimits lim = limits_of(sm);
    for (int d : {64, 128, 256}) {
      for (int lay = 0; lay < 3; ++lay) {
        LaunchShape shape;
        shape.tree_mask = true;
        shape.kv_layout = lay == 0   ? KvLayout::Contiguous
                          : lay == 1 ? KvLayout::Paged
                                     : KvLayout::PtrArray;
        shape.page_size = lay == 1 ? (d == 128 ? 16 : 5) : 0;
        out.push_back(make_spec(
            config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, d == 64 ? 8 : 2, d != 256),
            KernelKind::Decode, lim, shape));
      }
    }
    for (int f = 1; f < 4; ++f) {
      LaunchShape shape;
      shape.lse_in_base2 = f & 1;
      shape.lse_out_base2 = f & 2;
      out.push_back(
          make_spec(config(Dtype::F16, 0, 128, 8, 8, false), KernelKind::Reduce, lim, shape));
    }
  }
  // KV append with RoPE (NeoX and GPT-J pairs, fp32 and 16-bit tables),
  // every layout, with and without a tree mask, and the append alone.
  for (int sm : {80, 90}) {
    const DeviceLimits lim = limits_of(sm);
    for (int d : {64, 128, 256}) {
      for (int lay = 0; lay < 3; ++lay) {
        LaunchShape shape;
        shape.append_kv = true;
        shape.rotary = lay == 2 ? 0 : 1 + (d == 128);
        shape.rotary_half_table = d == 256;
        shape.tree_mask = lay == 1;
        shape.kv_layout = lay == 0   ? KvLayout::Contiguous
                          : lay == 1 ? KvLayout::Paged
                                     : KvLayout::PtrArray;
        shape.page_size = lay == 1 ? (d == 128 ? 16 : 5) : 0;
        out.push_back(make_spec(
            config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, d == 64 ? 8 : 2, d != 256),
            KernelKind::Decode, lim, shape));
      }
    }
  }
  setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
  for (int d : {64, 128, 256}) {
    LaunchShape shape;
    shape.tree_mask = true;
    shape.kv_layout = d == 128 ? KvLayout::Paged : KvLayout::Contiguous;
    shape.page_size = d == 128 ? 16 : 0;
    out.push_back(make_spec(config(Dtype::BF16, d, d, 8, 2, d == 64), KernelKind::Decode,
                            limits_of(80), shape));
  }
  unsetenv("FLASHATTN_SCALAR_DECODE");
  // fp8 KV cache (e4m3, e5m2) in the tensor-core decode, sm_89 and sm_90:
  // every head dim it takes (multiples of 16), both dtypes, softcap, every
  // KV layout, GQA, tree masks.
  for (int sm : {89, 90}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (int d : {16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256})
      for (int f = 0; f < 2; ++f, ++i) {
        LaunchShape shape;
        shape.kv_layout = i % 3 == 0   ? KvLayout::Contiguous
                          : i % 3 == 1 ? KvLayout::Paged
                                       : KvLayout::PtrArray;
        shape.page_size = i % 3 == 1 ? (i % 2 ? 16 : 5) : 0;
        shape.tree_mask = i % 5 == 0;
        AttentionConfig cfg = config(f ? Dtype::BF16 : Dtype::F16, d, d, 8, i % 4 ? 2 : 8, i % 2);
        cfg.kv_fp8 = (i / 2) % 2 ? KvFp8::E5M2 : KvFp8::E4M3;
        KernelSpec s = make_spec(cfg, KernelKind::Decode, lim, shape);
        assert_true(s.mma && s.kv_fp8 == cfg.kv_fp8);
        out.push_back(s);
      }
  }
  // The fp8 forward on every SM family from sm_89 (the fp8 mma on sm_89 and
  // sm_120; the fp8 wgmma on sm_90, and its form converting to f16 on load;
  // converted by the mma.sync copy plans on sm_100 and past 256): the head dims it takes
  // (multiples of 16) up to 256 and past it (O in slices: 304 / 272, 512,
  // 576 / 512), both formats and O dtypes, softcap, varlen, every KV layout,
  // seqused_k, sinks, ALiBi.
  for (int sm : {89, 90, 100, 120}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (const auto &dd : {std::pair<int, int>{16, 16},
                           {32, 32},
                           {64, 64},
                           {80, 80},
                           {96, 64},
                           {128, 128},
                           {192, 192},
                           {256, 256},
                           {304, 272},
                           {512, 512},
                           {576, 512}})
      for (int f = 0; f < 2; ++f, ++i) {
        LaunchShape shape;
        shape.varlen = i % 5 == 1;
        shape.kv_layout = i % 5 == 2   ? KvLayout::Paged
                          : i % 5 == 3 ? KvLayout::PtrArray
                                       : KvLayout::Contiguous;
        shape.page_size = i % 5 == 2 ? (i % 2 ? 64 : 5) : 0;
        shape.seqused_k = i % 5 == 2 || i % 5 == 3;
        shape.sinks = i % 3 == 1;
        shape.alibi = i % 4 == 2;
        AttentionConfig cfg =
            config(f ? Dtype::BF16 : Dtype::F16, dd.first, dd.second, 8, i % 4 ? 2 : 8, i % 3 == 0);
        cfg.kv_fp8 = i % 2 ? KvFp8::E5M2 : KvFp8::E4M3;
        cfg.q_fp8 = (i / 2) % 2 ? KvFp8::E5M2 : KvFp8::E4M3;
        KernelSpec s = make_spec(cfg, KernelKind::Forward, lim, shape);
        // sm_90 up to 256: the wgmma kernel's gather variant.
        assert_true(s.mma && s.wgmma == (sm == 90 && dd.second <= 256 && dd.first <= 256) &&
                    s.q_fp8 == cfg.q_fp8 && s.kv_fp8 == cfg.kv_fp8);
        out.push_back(s);
        if (s.wgmma) {  // and the form converting to f16 (FLASHATTN_SM90_FP8_F16)
          setenv("FLASHATTN_SM90_FP8_F16", "1", 1);
          out.push_back(make_spec(cfg, KernelKind::Forward, lim, shape));
          unsetenv("FLASHATTN_SM90_FP8_F16");
          assert_true(out.back().fp8_f16 && !s.fp8_f16);
        }
      }
  }
  // KV append into the fp8 cache (the quantising store), sm_89 and sm_90:
  // head dims 64, 128, 256 and MLA's 576 / 512 (O in slices), both formats
  // and dtypes, RoPE off, NeoX and GPT-J, every KV layout (pages of 16 and
  // 5), GQA, tree masks.
  for (int sm : {89, 90}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (const auto &dd : {std::pair<int, int>{64, 64}, {128, 128}, {256, 256}, {576, 512}})
      for (int r = 0; r < 3; ++r, ++i) {
        LaunchShape shape;
        shape.append_kv = true;
        shape.rotary = r;
        shape.kv_layout = i % 4 == 0   ? KvLayout::Contiguous
                          : i % 4 == 3 ? KvLayout::PtrArray
                                       : KvLayout::Paged;
        shape.page_size = i % 4 == 1 ? 16 : i % 4 == 2 ? 5 : 0;
        shape.tree_mask = i % 5 == 0;
        const bool mla = dd.first > 256;
        AttentionConfig cfg = config(i % 2 ? Dtype::BF16 : Dtype::F16, dd.first, dd.second,
                                     mla ? 16 : 8, mla ? 1 : 2, i % 3 == 0);
        cfg.kv_fp8 = (i / 2) % 2 ? KvFp8::E5M2 : KvFp8::E4M3;
        KernelSpec s = make_spec(cfg, KernelKind::Decode, lim, shape);
        assert_true(s.mma && s.append_kv && s.rotary == r && s.kv_fp8 == cfg.kv_fp8);
        out.push_back(s);
      }
  }
  // fp32 Q/K/V/O (converted to bf16 on load): the mma.sync forward and
  // decode at every head dim on sm_80 and sm_90 (softcap alternating,
  // varlen every third, GQA groups 1, 4, 8), the forward on other targets
  // at the head dims with the most registers, every KV layout (decode with
  // tree masks), and the combine.
  for (int sm : {80, 90})
    for (int d = 8; d <= 256; d += 8) {
      out.push_back(make_spec(config(Dtype::F32, d, d, 8, 2, (d / 8) % 2), KernelKind::Forward, sm,
                              d % 24 == 0));
      const int hkv = d % 24 == 0 ? 8 : d % 16 == 0 ? 2 : 1;
      out.push_back(
          make_spec(config(Dtype::F32, d, d, 8, hkv, (d / 8) % 2), KernelKind::Decode, sm, false));
    }
  for (int sm : {86, 89, 120})
    for (int d : {64, 96, 112, 128, 216, 256})
      out.push_back(
          make_spec(config(Dtype::F32, d, d, 8, 2, d != 112), KernelKind::Forward, sm, d == 96));
  for (int sm : {80, 90}) {
    const DeviceLimits lim = limits_of(sm);
    for (int d : {64, 128, 256})
      for (int lay = 0; lay < 3; ++lay) {
        LaunchShape shape;
        shape.kv_layout = lay == 2 ? KvLayout::PtrArray : KvLayout::Paged;
        shape.page_size = lay == 0 ? 256 : 16;
        shape.seqused_k = true;
        shape.varlen = lay == 1;
        shape.alibi = lay == 2;
        shape.sinks = lay == 1;
        out.push_back(
            make_spec(config(Dtype::F32, d, d, 8, 2, d == 128), KernelKind::Forward, lim, shape));
        shape.varlen = shape.seqused_k = shape.sinks = false;
        shape.tree_mask = lay == 1;
        out.push_back(
            make_spec(config(Dtype::F32, d, d, 8, 2, d != 128), KernelKind::Decode, lim, shape));
      }
    out.push_back(
        make_spec(config(Dtype::F32, 0, 128, 8, 8, false), KernelKind::Reduce, lim, LaunchShape()));
  }
  // ALiBi: the mma.sync forward (the head dims with the most registers,
  // softcap, varlen, a paged cache, with sinks), both decode kernels (GQA,
  // softcap, paged, pointer arrays, tree masks), the scalar forward and the
  // sm_90a forward's TMA and gather variants.
  for (int sm : {80, 86, 120}) {
    const DeviceLimits lim = limits_of(sm);
    for (int d : {64, 128, 256})
      for (int v = 0; v < 3; ++v) {
        LaunchShape shape;
        shape.alibi = true;
        shape.varlen = v == 1;
        shape.sinks = v == 1;
        if (v == 2) {
          shape.kv_layout = KvLayout::Paged;
          shape.page_size = 16;
          shape.seqused_k = true;
        }
        out.push_back(make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, v != 1),
                                KernelKind::Forward, lim, shape));
        LaunchShape dshape;
        dshape.alibi = true;
        dshape.tree_mask = v == 1;
        dshape.kv_layout = v == 0   ? KvLayout::Contiguous
                           : v == 1 ? KvLayout::Paged
                                    : KvLayout::PtrArray;
        dshape.page_size = v == 1 ? 16 : 0;
        out.push_back(
            make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, d == 64 ? 8 : 2, v != 2),
                      KernelKind::Decode, lim, dshape));
      }
  }
  // Head dims past 256 (O in dv_split slices): the forward at 264..576 on
  // every target family (dtypes and softcap alternating, varlen, a paged
  // cache, ALiBi and sinks), the decode at MLA's 576 / 512 (GQA groups 1, 16,
  // 128, every KV layout, tree masks, fp8 on sm_89+) and at 320..512 (softcap,
  // ALiBi, append with RoPE), fp32 inputs, and the combine at 512; the
  // decode with V read from the K tile (v_in_k) alongside each 576 / 512 one.
  for (int sm : {80, 86, 89, 90, 100, 120}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (int d : {264, 320, 384, 448, 512, 576}) {
      ++i;
      LaunchShape shape;
      shape.varlen = i % 3 == 0;
      shape.alibi = i % 4 == 1;
      shape.sinks = i % 4 == 2;
      if (i % 4 == 3) {
        shape.kv_layout = KvLayout::Paged;
        shape.page_size = 64;
        shape.seqused_k = true;
      }
      out.push_back(make_spec(
          config(i % 2 ? Dtype::BF16 : Dtype::F16, d, std::min(d, 512), 8, 2, (i + sm / 10) % 2),
          KernelKind::Forward, lim, shape));
    }
    for (int g : {1, 16, 128})
      for (int lay = 0; lay < 3; ++lay) {
        LaunchShape shape;
        shape.kv_layout = lay == 0   ? KvLayout::Contiguous
                          : lay == 1 ? KvLayout::Paged
                                     : KvLayout::PtrArray;
        shape.page_size = lay == 1 ? (g == 16 ? 64 : 1) : 0;
        shape.tree_mask = g == 16 && lay == 2;
        AttentionConfig cfg = config(g == 1 ? Dtype::F16 : Dtype::BF16, 576, 512, g, 1, false);
        out.push_back(make_spec(cfg, KernelKind::Decode, lim, shape));
        shape.v_in_k = true;  // MLA's latent cache: V read from the K tile
        out.push_back(make_spec(cfg, KernelKind::Decode, lim, shape));
        if (sm >= 89 && lay == 1) {
          cfg.kv_fp8 = g == 128 ? KvFp8::E5M2 : KvFp8::E4M3;
          out.push_back(make_spec(cfg, KernelKind::Decode, lim, shape));
        }
      }
    for (int d : {320, 384, 512}) {
      LaunchShape shape;
      shape.alibi = d == 320;
      shape.append_kv = d != 320;
      shape.rotary = d == 512 ? 1 : d == 384 ? 2 : 0;
      shape.kv_layout = d == 512 ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = d == 512 ? 16 : 0;
      out.push_back(make_spec(config(d == 384 ? Dtype::F16 : Dtype::BF16, d, d, 8, 2, d == 320),
                              KernelKind::Decode, lim, shape));
    }
  }
  for (int sm : {80, 86, 90})
    for (int d : {320, 384, 512, 576}) {
      if (d <= 384)  // the fp32 forward takes head_dim 384 at most
        for (int v = 0; v < 2; ++v)
          out.push_back(
              make_spec(config(Dtype::F32, d, d, 8, 2, v == 1), KernelKind::Forward, sm, v == 1));
      out.push_back(make_spec(config(Dtype::F32, d, std::min(d, 512), 16, 1, d == 512),
                              KernelKind::Decode, sm, false));
    }
  out.push_back(
      make_spec(config(Dtype::BF16, 0, 512, 16, 1, false), KernelKind::Reduce, 90, false));
  setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
  setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
  for (int d : {64, 128, 256}) {
    LaunchShape shape;
    shape.alibi = true;
    shape.varlen = d == 128;
    out.push_back(make_spec(config(Dtype::BF16, d, d, 8, 2, d == 64), KernelKind::Forward,
                            limits_of(80), shape));
    LaunchShape dshape;
    dshape.alibi = true;
    dshape.tree_mask = d == 128;
    out.push_back(make_spec(config(Dtype::F16, d, d, 8, 2, d == 256), KernelKind::Decode,
                            limits_of(80), dshape));
  }
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  unsetenv("FLASHATTN_SCALAR_DECODE");
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  for (int d : {64, 96, 128, 192, 256})
    for (int gather = 0; gather < 2; ++gather) {
      LaunchShape shape;
      shape.alibi = true;
      shape.tma_ok = !gather;
      shape.varlen = gather;
      KernelSpec w = make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d != 96),
                               KernelKind::Forward, limits_of(90), shape);
      assert_true(w.wgmma && w.alibi && w.gather == (gather != 0));
      out.push_back(w);
    }
  unsetenv("FLASHATTN_SM90_WGMMA");
  // Attention sinks: the mma.sync forward (the head dims with the most
  // registers, softcap, varlen, a paged cache), the scalar forward, the
  // sm_90a forward's TMA and gather variants, and the reduce (both LSE
  // bases) that fa_decode's combine runs with them.
  for (int sm : {80, 86, 120}) {
    const DeviceLimits lim = limits_of(sm);
    for (int d : {64, 128, 256})
      for (int v = 0; v < 3; ++v) {
        LaunchShape shape;
        shape.sinks = true;
        shape.varlen = v == 1;
        if (v == 2) {
          shape.kv_layout = KvLayout::Paged;
          shape.page_size = 16;
          shape.seqused_k = true;
        }
        out.push_back(make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, v != 1),
                                KernelKind::Forward, lim, shape));
      }
    for (int f = 0; f < 2; ++f) {
      LaunchShape shape;
      shape.sinks = true;
      shape.lse_in_base2 = shape.lse_out_base2 = f == 1;
      out.push_back(
          make_spec(config(Dtype::F16, 0, 128, 8, 8, false), KernelKind::Reduce, lim, shape));
    }
  }
  setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
  for (int d : {64, 128, 256}) {
    LaunchShape shape;
    shape.sinks = true;
    shape.varlen = d == 128;
    out.push_back(make_spec(config(Dtype::BF16, d, d, 8, 2, d == 64), KernelKind::Forward,
                            limits_of(80), shape));
  }
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  for (int d : {64, 96, 128, 192, 256})
    for (int gather = 0; gather < 2; ++gather) {
      LaunchShape shape;
      shape.sinks = true;
      shape.tma_ok = !gather;
      shape.varlen = gather;
      KernelSpec w = make_spec(config(d == 128 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d != 96),
                               KernelKind::Forward, limits_of(90), shape);
      assert_true(w.wgmma && w.sinks && w.gather == (gather != 0));
      out.push_back(w);
    }
  unsetenv("FLASHATTN_SM90_WGMMA");
  // The sm_90a forward (wgmma, TMA): every head dim, softcap and dtype
  // alternating, and head_dim_v != head_dim.
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  for (int d = 8; d <= 256; d += 8) {
    KernelSpec w =
        make_spec(config((d / 8) % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d % 16 == 0),
                  KernelKind::Forward, 90, false);
    assert_true(w.wgmma);  // the sm_90a kernel for every head dim
    out.push_back(w);
  }
  for (const auto &p : dpairs)
    out.push_back(
        make_spec(config(Dtype::BF16, p[0], p[1], 4, 2, false), KernelKind::Forward, 90, false));
  // Persistent (FLASHATTN_SM90_PERSISTENT), static and dynamic alternating:
  // the TMA variant at every head dim (one or two Q buffers) and d != dv,
  // the gather variant (varlen by work, paged caches by row and by tile,
  // seqused_k) and the fp8 forward at 64, 128 and 256.
  setenv("FLASHATTN_SM90_PERSISTENT", "1", 1);
  for (int d = 8; d <= 256; d += 8) {
    KernelSpec w = make_spec(config(d % 16 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, d % 24 == 0),
                             KernelKind::Forward, 90, false);
    assert_true(w.wgmma && w.persistent && !w.gather);
    w.dynamic = (d / 8) % 2 == 0;
    out.push_back(w);
  }
  for (const auto &p : dpairs) {
    KernelSpec w =
        make_spec(config(Dtype::BF16, p[0], p[1], 4, 2, false), KernelKind::Forward, 90, false);
    w.dynamic = p[0] < p[1];
    out.push_back(w);
  }
  {
    const DeviceLimits lim = limits_of(90);
    int i = 0;
    for (int d : {64, 96, 128, 192, 256})
      for (int lay = 0; lay < 3; ++lay, ++i) {
        LaunchShape shape;
        shape.varlen = lay == 0;
        shape.kv_layout = lay == 0 ? KvLayout::Contiguous : KvLayout::Paged;
        shape.page_size = lay == 1 ? 16 : lay == 2 ? 128 : 0;
        shape.seqused_k = lay != 0;
        AttentionConfig cfg = config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, i % 3 == 1);
        KernelSpec w = make_spec(cfg, KernelKind::Forward, lim, shape);
        assert_true(w.wgmma && w.persistent && w.gather);
        w.dynamic = i % 2 == 0;
        out.push_back(w);
        if (lay == 0 && d % 64 == 0) {
          cfg.q_fp8 = cfg.kv_fp8 = KvFp8::E4M3;
          w = make_spec(cfg, KernelKind::Forward, lim, shape);
          assert_true(w.wgmma && w.persistent && w.q_fp8 == KvFp8::E4M3);
          w.dynamic = i % 2 == 1;
          out.push_back(w);
        }
      }
  }
  unsetenv("FLASHATTN_SM90_PERSISTENT");
  // The persistent mma.sync forward (FLASHATTN_SM80_PERSISTENT), static and
  // dynamic alternating: sm_80 at head dims 64..256 (softcap, varlen by
  // work, paged caches by row and by tile with ALiBi and sinks on tiles of
  // one m-tile per warp: on two they run one CTA per item), sm_86 / 89 /
  // 120 at 64, 128, 256, and the fp8 mma's on sm_89.
  setenv("FLASHATTN_SM80_PERSISTENT", "1", 1);
  for (int sm : {80, 86, 89, 120}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (int d = 64; d <= 256; d += sm == 80 ? 32 : 64, ++i) {
      LaunchShape shape;
      const bool paged = sm == 80 ? i == 3 || i == 6 : i % 3 == 2;
      shape.varlen = i % 3 == 1;
      shape.kv_layout = paged ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = !paged ? 0 : i == 6 ? 64 : 16;
      shape.alibi = shape.sinks = paged;
      KernelSpec w = make_spec(config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, i % 4 == 1),
                               KernelKind::Forward, lim, shape);
      assert_true(w.mma && !w.wgmma && w.persistent);
      w.dynamic = i % 2 == 0;
      out.push_back(w);
    }
  }
  for (bool dyn : {false, true}) {
    AttentionConfig cfg = config(Dtype::F16, 128, 128, 8, 2, dyn);
    cfg.q_fp8 = cfg.kv_fp8 = KvFp8::E4M3;
    LaunchShape shape;
    shape.varlen = dyn;
    KernelSpec w = make_spec(cfg, KernelKind::Forward, limits_of(89), shape);
    assert_true(w.mma && w.persistent && w.q_fp8 == KvFp8::E4M3);
    w.dynamic = dyn;
    out.push_back(w);
  }
  unsetenv("FLASHATTN_SM80_PERSISTENT");
  // The decode kernel without cache_seqlens (KernelSpec::fixed_len: the
  // runtime's GQA packing of a fixed-length forward): both decode kernels'
  // tensor-core form on sm_80 and sm_90, GQA 2..8, paged and contiguous.
  for (int sm : {80, 90}) {
    int i = 0;
    for (int d : {64, 128, 256}) {
      LaunchShape shape;
      shape.fixed_len = true;
      shape.kv_layout = i % 2 ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = i % 2 ? 16 : 0;
      shape.alibi = i == 2;
      KernelSpec w =
          make_spec(config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 16, 2 << i % 3, i == 1),
                    KernelKind::Decode, limits_of(sm), shape);
      assert_true(w.mma && w.fixed_len);
      out.push_back(w);
      ++i;
    }
  }
  // The decode kernel's varlen form (KernelSpec::varlen: the runtime's GQA
  // packing of a varlen forward; queries through cu_seqlens_q) on sm_80,
  // sm_89 and sm_90, paged with seqused_k and contiguous without, GQA 2..8.
  for (int sm : {80, 89, 90}) {
    int i = 0;
    for (int d : {64, 128, 256}) {
      LaunchShape shape;
      shape.varlen = true;
      shape.fixed_len = i % 2 == 0;
      shape.kv_layout = i % 2 ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = i % 2 ? 16 : 0;
      KernelSpec w =
          make_spec(config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 16, 2 << i % 3, i == 1),
                    KernelKind::Decode, limits_of(sm), shape);
      assert_true(w.mma && w.varlen);
      out.push_back(w);
      ++i;
    }
  }
  // Programmatic dependent launches (KernelSpec::pdl, sm_90 and up): the
  // tensor-core decode (griddepcontrol.wait in its prologue,
  // launch_dependents after its K/V loop; head dims 64..576, paged, fp8 KV,
  // KV append with RoPE, MLA's V in K) and the combine (plain, sinks,
  // varlen), on sm_90, sm_100 and sm_120.
  {
    KernelPolicy pdl;
    pdl.pdl = true;
    int i = 0;
    for (int sm : {90, 100, 120})
      for (int d : {64, 128, 256, 576}) {
        const LaunchShape shape = decode_mix_shape(i, d, d == 128 && sm == 90);
        AttentionConfig cfg = decode_mix_config(i, d);
        if (d == 256 && sm == 90) cfg.kv_fp8 = KvFp8::E4M3;
        KernelSpec w = make_spec(cfg, KernelKind::Decode, limits_of(sm), shape, pdl);
        assert_true(w.mma && w.pdl);
        out.push_back(w);
        ++i;
        LaunchShape rshape;
        rshape.sinks = d == 64;
        rshape.varlen = d == 128;
        w = make_spec(cfg, KernelKind::Reduce, limits_of(sm), rshape, pdl);
        assert_true(w.pdl);
        if (sm == 90 || d <= 128) out.push_back(w);
      }
  }
  // The sm_90a MLA decode (KernelPolicy::sm90_mla): DeepSeek's 576 / 512
  // and the other head dims it takes (512 / 512: an even atom count; 384 /
  // 384: three-atom O halves; 576 / 384), bf16 and fp16, every KV layout
  // (pages of 64: pow2 rows; of 3), fixed length (a forward run as decode),
  // windows, group 16 and 128, e4m3 and e5m2 caches. The same grid on
  // sm_100 and sm_103: the sm_100a MLA decode (KernelPolicy::sm100_mla,
  // tcgen05), and on sm_100 its direct_out form (the MLA forward).
  for (int sm : {90, 100, 103}) {
    KernelPolicy mla;
    mla.sm90_mla = true;
    int i = 0;
    for (const auto &hd : {std::pair<int, int>{576, 512}, {512, 512}, {384, 384}, {576, 384}})
      for (int layout = 0; layout < 4; ++layout) {
        LaunchShape shape;
        shape.v_in_k = true;
        shape.kv_layout = layout == 0   ? KvLayout::Contiguous
                          : layout == 3 ? KvLayout::PtrArray
                                        : KvLayout::Paged;
        shape.page_size = layout == 1 ? 64 : layout == 2 ? 3 : 0;
        shape.fixed_len = layout == 0 && i % 2 == 1;
        AttentionConfig cfg = config(i % 2 ? Dtype::BF16 : Dtype::F16, hd.first, hd.second,
                                     i % 3 == 2 ? 128 : 16, 1, false);
        cfg.causal = i % 4 != 3;
        if (i % 5 == 4) cfg.window_left = 100;
        if (i % 3 == 1) cfg.kv_fp8 = i % 2 ? KvFp8::E4M3 : KvFp8::E5M2;
        KernelSpec w = make_spec(cfg, KernelKind::Decode, limits_of(sm), shape, mla);
        assert_true((sm == 90 ? w.wgmma : w.tcgen05) && w.kind == KernelKind::Decode &&
                    !generate_ptx(w).empty());
        if (sm != 103 || i % 3 == 0) out.push_back(w);
        // sm_100a, 16-bit caches: the forward's one-split form writing O
        // (KernelSpec::direct_out), with sinks on every other, cu_seqlens_q
        // on the paged one.
        if (sm == 100 && cfg.kv_fp8 == KvFp8::None && hd.second == 512) {
          shape.direct_out = true;
          shape.sinks = i % 2 == 0;
          shape.varlen = layout == 1 && !shape.fixed_len;  // cu_seqlens_q (seqused_k)
          w = make_spec(cfg, KernelKind::Decode, limits_of(sm), shape, mla);
          assert_true(w.tcgen05 && w.direct_out && w.sinks == shape.sinks &&
                      w.varlen == shape.varlen && !generate_ptx(w).empty());
          out.push_back(w);
        }
        ++i;
      }
  }
  // The sm_100a forward (KernelPolicy::sm100_forward: tcgen05.mma, tensor
  // memory; FlashAttention-4's structure) on sm_100 (every head dim it
  // takes, 8..256: two Q tiles up to 128, one past it) and sm_103 (every
  // third), head_dim != head_dim_v, both dtypes, causal, windows, softcap,
  // GQA, sinks, ALiBi, fp8 Q/K/V (e4m3 and e5m2), split-KV, and the gather
  // warps' variant (varlen, paged, pointer arrays, seqused_k).
  {
    KernelPolicy pol;
    pol.sm100_forward = true;
    int i = 0;
    for (int sm : {100, 103})
      for (int d = 8; d <= 256; d += sm == 100 ? 8 : 24) {
        const int dv = i % 7 == 6 ? (d > 128 ? 128 : 2 * d) : d;
        AttentionConfig cfg =
            config(i % 2 ? Dtype::BF16 : Dtype::F16, d, dv, 8, i % 3 ? 2 : 8, i % 5 == 3);
        cfg.causal = i % 4 == 1;
        if (i % 4 == 2) cfg.window_left = 100;
        LaunchShape shape;
        shape.sinks = i % 3 == 2;
        shape.alibi = i % 4 == 3;
        // The gather warps: varlen, paged by tile and by row, pointer arrays,
        // seqused_k, every fifth or so.
        switch (i % 5) {
          case 2:
            shape.varlen = true;
            break;
          case 3:
            shape.kv_layout = KvLayout::Paged;
            shape.page_size = i % 2 ? 16 : 256;
            shape.seqused_k = true;
            break;
          case 4:
            shape.kv_layout = i % 2 ? KvLayout::PtrArray : KvLayout::Paged;
            shape.page_size = i % 2 ? 0 : 3;
            shape.seqused_k = true;
            break;
          default:
            break;
        }
        shape.split_kv = i % 6 == 0 && !shape.sinks;  // split-KV (partial states)
        // The fp8 forward (kind::f8f6f4) at head dims of whole k16 steps.
        if (i % 4 == 1 && d % 16 == 0 && dv % 16 == 0) {
          cfg.q_fp8 = i % 8 == 1 ? KvFp8::E4M3 : KvFp8::E5M2;
          cfg.kv_fp8 = i % 3 ? KvFp8::E4M3 : KvFp8::E5M2;
        }
        KernelSpec w = make_spec(cfg, KernelKind::Forward, limits_of(sm), shape, pol);
        assert_true(w.tcgen05 && !generate_ptx(w).empty());
        // The tile fits the SM's shared memory (two Q tiles only where they do).
        assert_true(max_dynamic_smem(w) <= limits_of(sm).smem_per_block_optin);
        out.push_back(w);
        ++i;
      }
  }
  // The backward's main kernel (backward_tc.cc: mma.sync, sm_80+): head
  // dims 8..256 (two column slices past 128; d != dv too), both dtypes, causal, windows, softcap,
  // ALiBi, GQA, varlen, on sm_80, 86, 89, 90 and 120.
  {
    int i = 0;
    for (int sm : {80, 86, 89, 90, 120})
      for (int d : {8, 32, 64, 80, 96, 128, 160, 256}) {
        const int dv = i % 5 == 4 ? (d >= 128 ? 64 : 2 * d > 128 ? 128 : 2 * d) : d;
        AttentionConfig cfg =
            config(i % 2 ? Dtype::BF16 : Dtype::F16, d, dv, 8, i % 3 ? 2 : 8, i % 4 == 3);
        cfg.causal = i % 3 == 1;
        if (i % 5 == 2) cfg.window_left = 100;
        LaunchShape shape;
        shape.alibi = i % 4 == 1;
        shape.varlen = i % 3 == 2;
        KernelSpec w = make_spec(cfg, KernelKind::Backward, limits_of(sm), shape);
        assert_true(w.kind == KernelKind::Backward && !generate_ptx(w).empty());
        out.push_back(w);
        ++i;
      }
  }
  // The sm_90a backward main kernel (backward_wgmma.cc, KernelPolicy::
  // sm90_backward): head dims 16..128 in steps of 16 (d != dv too: the dQ
  // split's shapes), both dtypes, causal, windows, softcap (its 1 - tanh^2
  // in 16 bits), ALiBi, GQA, varlen (rows by cp.async); held to no spill and
  // no advisory (wgmma serialized).
  {
    int i = 0;
    for (int d : {16, 32, 48, 64, 80, 96, 112, 128})
      for (int dv : {d, d == 128 ? 64 : 128}) {
        AttentionConfig cfg =
            config(i % 2 ? Dtype::BF16 : Dtype::F16, d, dv, 8, i % 3 ? 2 : 8, i % 4 == 3);
        cfg.causal = i % 3 == 1;
        if (i % 5 == 2) cfg.window_left = 100;
        LaunchShape shape;
        shape.alibi = i % 4 != 0;
        // Varlen (the cp.async copy: head_dim + head_dim_v up to 192).
        shape.varlen = i % 3 == 2 && d + dv <= 192;
        KernelSpec w = make_spec(cfg, KernelKind::Backward, limits_of(90), shape);
        assert_true(w.wgmma && w.gather == shape.varlen && !generate_ptx(w).empty());
        assert_true(max_dynamic_smem(w) <= limits_of(90).smem_per_block_optin);
        out.push_back(w);
        ++i;
      }
  }
  // The fp8 KV decode's mode (b) (KernelPolicy::decode_fp8_mma: Q and P in
  // e4m3 on the fp8 mma) on sm_89 and sm_120: head dims 64..576 (whole k32
  // steps; MLA's 576 / 512 with V in K in two O slices), both dtypes, e4m3
  // and e5m2, paged, tree masks, softcap, ALiBi, KV append with RoPE, the
  // fused combine; held to no local memory (summarize: fp8 is strict).
  {
    KernelPolicy pol;
    pol.decode_fp8_mma = true;
    int i = 0;
    for (int sm : {89, 120})
      for (int d : {64, 96, 128, 192, 256, 576}) {
        LaunchShape shape = decode_mix_shape(i, d, d == 128 && sm == 89);
        shape.tree_mask = i % 4 == 2;
        shape.alibi = i % 5 == 3;
        shape.fused_combine = i % 3 == 0;
        AttentionConfig cfg = decode_mix_config(i, d);
        cfg.kv_fp8 = i % 2 ? KvFp8::E5M2 : KvFp8::E4M3;
        KernelSpec w = make_spec(cfg, KernelKind::Decode, limits_of(sm), shape, pol);
        assert_true(w.mma && w.kv_fp8_mma && !generate_ptx(w).empty());
        out.push_back(w);
        ++i;
      }
  }
  // The combine fused into the decode kernel (KernelSpec::fused_combine:
  // fa_decode with split_counters): head dims 64..576 (MLA's O in two
  // slices, V in K), sinks, paged, fp8 KV, KV append with RoPE, PDL, on
  // sm_80, sm_89, sm_90 and sm_120.
  {
    int i = 0;
    for (int sm : {80, 89, 90, 120})
      for (int d : {64, 128, 256, 576}) {
        KernelPolicy pol;
        pol.pdl = sm == 90 && d == 64;
        LaunchShape shape = decode_mix_shape(i, d, d == 128 && sm >= 90);
        shape.fused_combine = true;
        shape.sinks = i % 3 == 0;
        AttentionConfig cfg = decode_mix_config(i, d);
        if (d == 256 && sm == 89) cfg.kv_fp8 = KvFp8::E4M3;
        KernelSpec w = make_spec(cfg, KernelKind::Decode, limits_of(sm), shape, pol);
        assert_true(w.mma && w.fused_combine && w.sinks == shape.sinks);
        out.push_back(w);
        ++i;
      }
  }
  // Split-KV (KernelSpec::split_kv; the runtime sets it per launch): TMA at
  // head dims 64..256 with softcap and ALiBi alternating, the gather
  // variant over a paged cache with seqused_k, and the fp8 forward; the
  // mma.sync forward on sm_80 / 86 / 120 (head dims 64..512: O column
  // slices past 256, paged, fp32) and the fp8 mma on sm_89.
  for (int d = 8; d <= 256; d += 8) {  // sm_80 at every head dim (its margin of registers)
    LaunchShape shape;
    shape.split_kv = true;
    shape.alibi = (d / 8) % 3 == 0;
    KernelSpec w =
        make_spec(config((d / 8) % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, (d / 8) % 4 == 1),
                  KernelKind::Forward, limits_of(80), shape);
    assert_true(w.mma && w.split_kv);
    out.push_back(w);
  }
  for (int sm : {80, 86, 89, 120}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (int d : {64, 128, 256, 320, 512}) {
      LaunchShape shape;
      shape.split_kv = true;
      shape.alibi = i % 2 == 1;
      shape.kv_layout = i % 3 == 1 ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = i % 3 == 1 ? 16 : 0;
      shape.seqused_k = i % 3 == 1;
      AttentionConfig cfg = config(i % 4 == 3 ? Dtype::F32
                                   : i % 2    ? Dtype::BF16
                                              : Dtype::F16,
                                   d, d, 8, 2, i % 3 == 0);
      if (sm == 89 && d <= 256) cfg.q_fp8 = cfg.kv_fp8 = KvFp8::E4M3;
      if (cfg.dtype == Dtype::F32 && d > 384) cfg.dtype = Dtype::BF16;
      KernelSpec w = make_spec(cfg, KernelKind::Forward, lim, shape);
      assert_true(w.mma && !w.wgmma && w.split_kv && !generate_ptx(w).empty());
      out.push_back(w);
      ++i;
    }
  }
  {
    const DeviceLimits lim = limits_of(90);
    int i = 0;
    for (int d : {64, 96, 128, 192, 256})
      for (int g = 0; g < 3; ++g, ++i) {
        LaunchShape shape;
        shape.split_kv = true;
        shape.alibi = i % 2 == 1;
        shape.kv_layout = g == 1 ? KvLayout::Paged : KvLayout::Contiguous;
        shape.page_size = g == 1 ? 16 : 0;
        shape.seqused_k = g == 1;
        shape.tma_ok = g == 0;
        AttentionConfig cfg = config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, i % 3 == 0);
        if (g == 2) cfg.q_fp8 = cfg.kv_fp8 = KvFp8::E4M3;
        KernelSpec w = make_spec(cfg, KernelKind::Forward, lim, shape);
        assert_true(w.wgmma && w.split_kv && w.gather == (g != 0) && !generate_ptx(w).empty());
        out.push_back(w);
      }
  }
  // Varlen split-KV (partial states padded to the longest sequence) and its
  // combine: the mma.sync forward on sm_80 and the gather variant on
  // sm_90a, head dims 64..256, with cu_seqlens_k or over a paged cache with
  // seqused_k (chunked prefill), ALiBi and softcap once; the varlen reduce
  // (with sinks on sm_90).
  for (int sm : {80, 90}) {
    const DeviceLimits lim = limits_of(sm);
    int i = 0;
    for (int d : {64, 128, 256}) {
      LaunchShape shape;
      shape.split_kv = true;
      shape.varlen = true;
      shape.alibi = i == 1;
      shape.kv_layout = i == 1 ? KvLayout::Paged : KvLayout::Contiguous;
      shape.page_size = i == 1 ? 16 : 0;
      shape.seqused_k = i == 1;
      KernelSpec w = make_spec(config(i % 2 ? Dtype::BF16 : Dtype::F16, d, d, 8, 2, i == 2),
                               KernelKind::Forward, lim, shape);
      assert_true(w.mma && w.split_kv && w.varlen && w.wgmma == (sm == 90));
      out.push_back(w);
      ++i;
    }
    LaunchShape r;
    r.varlen = true;
    r.sinks = sm == 90;
    KernelSpec w = make_spec(config(Dtype::F16, 0, 128, 8, 8, false), KernelKind::Reduce, lim, r);
    assert_true(w.varlen && !generate_ptx(w).empty());
    out.push_back(w);
  }
  unsetenv("FLASHATTN_SM90_WGMMA");
  const int sms[] = {86, 89, 90};
  for (int sm : sms) {
    out.push_back(
        make_spec(config(Dtype::F16, 64, 64, 8, 8, false), KernelKind::Forward, sm, false));
    out.push_back(
        make_spec(config(Dtype::BF16, 128, 128, 8, 8, true), KernelKind::Forward, sm, true));
    out.push_back(
        make_spec(config(Dtype::F16, 256, 256, 8, 8, false), KernelKind::Forward, sm, false));
    out.push_back(
        make_spec(config(Dtype::BF16, 40, 72, 8, 8, false), KernelKind::Forward, sm, false));
    out.push_back(
        make_spec(config(Dtype::BF16, 128, 128, 8, 2, false), KernelKind::Decode, sm, false));
    out.push_back(make_spec(config(Dtype::F16, 64, 64, 8, 1, true), KernelKind::Decode, sm, false));
    out.push_back(
        make_spec(config(Dtype::BF16, 0, 128, 8, 8, false), KernelKind::Reduce, sm, false));
  }
  return out;
}

std::string read_file(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool spawn_ptxas(const char *ptxas, Job &job) {
  std::string arch =
      "-arch=sm_" + std::to_string(job.spec.sm) + (job.spec.wgmma || job.spec.tcgen05 ? "a" : "");
  const char *argv[] = {ptxas,       arch.c_str(),         "-v",   "-o",
                        "/dev/null", job.ptx_path.c_str(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, job.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  int rc = posix_spawn(&job.pid, ptxas, &fa, nullptr, const_cast<char **>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0;
}

// "Used 94 registers" and "N bytes spill stores" from a ptxas -v log;
// counts a module with local memory in *spilling, and a forward one also in
// *forward_bad (as one that uses more than 255 registers).
// ptxas -arch=sm_90a accepts the builder's sm_90a instructions (a kernel
// with no meaning of its own: every form once, with live results so none is
// dropped) without local memory.
void test_ptxas_hopper_forms(void **) {
  const char *ptxas = FA_PTXAS_PATH;
  if (!ptxas[0] || access(ptxas, X_OK) != 0) {
    std::printf("SKIP: ptxas not available (FA_PTXAS_PATH=\"%s\")\n", ptxas);
    skip();
  }
  using namespace fa::ptx;
  Builder b("hopper_forms", 256);
  b.set_arch_specific(true);
  b.set_param_align(64);
  Symbol dyn = b.extern_shared("smem", 1024);
  Reg s = b.b32(), tm = b.b64(), desc = b.b64(), tid = b.b32();
  Reg p = b.pred(), leader = b.pred(), producer = b.pred();
  b.mov(Type::U32, s, sym(dyn));
  b.mov(Type::U32, tid, sreg(Special::TidX));
  b.setp(Cmp::Eq, Type::U32, leader, tid, imm(0));
  b.when(leader).mbarrier_init(at(s), imm(1));
  b.fence_proxy_async();
  b.bar_sync();
  Label prod = b.label(), done = b.label(), wait = b.label();
  b.setp(Cmp::Ge, Type::U32, producer, tid, imm(256));
  b.when(producer).bra(prod);
  b.setmaxnreg(true, 240);
  b.bind(wait);
  b.mbarrier_try_wait_parity(p, at(s), imm(0));
  b.unless(p).bra(wait);
  b.ld(Space::Shared, Type::B64, desc, at(s, 2048));
  std::vector<Reg> d(64);
  for (Reg &r : d) r = b.f32();
  Reg a[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  for (Reg &r : a) b.ld(Space::Shared, Type::B32, r, at(s, 4096));
  b.wgmma_fence();
  b.wgmma_ss(Type::BF16, 128, d.data(), desc, desc, imm(0), false);
  b.wgmma_rs(Type::BF16, 128, d.data(), a, desc, imm(1), true);
  b.wgmma_commit();
  b.wgmma_wait(0);
  for (size_t i = 0; i < d.size(); ++i)
    b.st(Space::Shared, Type::F32, at(s, 8192 + 4 * static_cast<int64_t>(i)), d[i]);
  b.bar_arrive(1, 256);
  b.bra(done);
  b.bind(prod);
  b.setmaxnreg(false, 40);
  b.param_address(tm);
  Reg c[2] = {tid, tid};
  b.when(leader).mbarrier_arrive_expect_tx(at(s), imm(16384));
  b.when(leader).cp_async_bulk_tensor(at(s, 1024), tm, c, 2, at(s));
  b.bar_sync(1, 256);
  b.bind(done);
  b.exit();
  const std::string ptx = std::move(b).emit(80, 90, 384);
  char dir_template[] = "/tmp/fa_ptxas_h_XXXXXX";
  const char *dir = mkdtemp(dir_template);
  assert_non_null(dir);
  const std::string path = std::string(dir) + "/hopper.ptx", log = std::string(dir) + "/log";
  {
    std::ofstream f(path);
    f << ptx;
  }
  const std::string cmd =
      std::string(ptxas) + " -arch=sm_90a -v -o /dev/null " + path + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = read_file(log);
  std::printf("%s", out.c_str());
  std::remove(path.c_str());
  std::remove(log.c_str());
  rmdir(dir);
  assert_int_equal(rc, 0);
  assert_true(out.find("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads") !=
              std::string::npos);
}

// The fp8 mma (mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}
// .f32: sm_89+, PTX ISA 8.4) as tests/test_tile.cc's test_fp8_mma uses it:
// A (16 x 64 bytes) through ldmatrix .x4 (tile::ldsm Role::A), B (8 x 64)
// through .x2, two k32 steps of tile::mma_fp8, for each of the four type
// pairs; ptxas -arch=sm_89 and sm_90 accept it without local memory. (The
// builder refuses to emit it for sm_80 or PTX ISA < 8.4: test_ptx_builder.)
void test_ptxas_fp8_mma_forms(void **) {
  const char *ptxas = FA_PTXAS_PATH;
  if (!ptxas[0] || access(ptxas, X_OK) != 0) {
    std::printf("SKIP: ptxas not available (FA_PTXAS_PATH=\"%s\")\n", ptxas);
    skip();
  }
  namespace tile = kgen::tile;
  using namespace fa::ptx;
  for (int sm : {89, 90}) {
    Builder b("fp8_mma_forms", 8);
    kgen::Emitter e(b);
    Reg out = e.global_param(0);
    Reg tid = e.mov(Type::U32, sreg(Special::TidX));
    Reg smem = e.mov(Type::U32, sym(b.extern_shared("smem", 16)));
    const tile::Lanes ln = tile::make_lanes(e, tid);
    const tile::SmemTile ta = tile::smem_tile(0, 16, 32), tb = tile::smem_tile(ta.bytes(), 8, 32);
    Reg la = tile::ldsm_base(e, ln, ta, tile::Role::A, smem, Reg());
    Reg lb = e.op(Op::MadLo, Type::U32, ln.l8, imm(tb.pitch), smem);
    lb = e.op(Op::MadLo, Type::U32, ln.h1, imm(16), lb);
    tile::Frag4 fa = tile::frag4(b);
    Reg fb[2] = {b.b32(), b.b32()};
    tile::AccTile d = tile::acc_tile(b, 4);
    tile::zero(b, d);
    for (int pair = 0; pair < 4; ++pair)
      for (int ks = 0; ks < 2; ++ks) {
        tile::ldsm(b, tile::Role::A, fa, la, ta.at(0, 16 * ks));
        b.ldmatrix(false, fb, 2, at(lb, static_cast<int>(tb.offset) + 32 * ks));
        tile::mma_fp8(b, pair & 2 ? Fp8::E5M2 : Fp8::E4M3, pair & 1 ? Fp8::E5M2 : Fp8::E4M3, d,
                      pair, fa, fb);
      }
    Reg o = e.index(out, tid, 64);
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i) b.st(Space::Global, Type::F32, at(o, 16 * j + 4 * i), d.f[j][i]);
    b.exit();
    assert_int_equal(b.min_sm(), 89);
    assert_int_equal(b.min_isa_version(), 84);
    const std::string ptx = std::move(b).emit(84, sm, 32);
    for (const char *form :
         {"f32.e4m3.e4m3.f32", "f32.e4m3.e5m2.f32", "f32.e5m2.e4m3.f32", "f32.e5m2.e5m2.f32"})
      assert_true(ptx.find(std::string("mma.sync.aligned.m16n8k32.row.col.") + form) !=
                  std::string::npos);
    char dir_template[] = "/tmp/fa_ptxas_f8_XXXXXX";
    const char *dir = mkdtemp(dir_template);
    assert_non_null(dir);
    const std::string path = std::string(dir) + "/fp8.ptx", log = std::string(dir) + "/log";
    std::ofstream(path) << ptx;
    const std::string cmd = std::string(ptxas) + " -arch=sm_" + std::to_string(sm) +
                            " -v -o /dev/null " + path + " > " + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    const std::string out_log = read_file(log);
    std::printf("sm_%d: %s", sm, out_log.c_str());
    std::remove(path.c_str());
    std::remove(log.c_str());
    rmdir(dir);
    assert_int_equal(rc, 0);
    assert_true(out_log.find("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads") !=
                std::string::npos);
  }
}

// ptxas's answer for a module is a function of (ptxas version, target,
// PTX bytes). tests/data/ptxas_results.tsv records it for the grid's
// modules, written by this test (build/tests/ptxas_results.tsv) after a run
// with the same ptxas: a module whose PTX is in it is not assembled again,
// except every kRecheckEvery-th one, which is, and must give the recorded
// answer (a stale or edited table fails). FA_PTXAS_ALL=1 assembles every
// module. A kernel change leaves its new modules out of the table: they are
// assembled, and the test says how to record them.
constexpr size_t kRecheckEvery = 25;

struct PtxasResult {
  int regs = -1, stack = 0, spill_st = 0, spill_ld = 0, advisory = 0;
  bool operator==(const PtxasResult &o) const {
    return regs == o.regs && stack == o.stack && spill_st == o.spill_st && spill_ld == o.spill_ld &&
           advisory == o.advisory;
  }
};

PtxasResult parse_log(const std::string &log) {
  PtxasResult r;
  const char *p = std::strstr(log.c_str(), "Used ");
  if (p) r.regs = std::atoi(p + 5);
  p = std::strstr(log.c_str(), "bytes stack frame");
  if (p) {
    while (p > log.c_str() && p[-1] != '\n') --p;  // start of that line
    std::sscanf(p, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &r.stack,
                &r.spill_st, &r.spill_ld);
  }
  r.advisory = log.find("Potential Performance Loss") != std::string::npos;
  return r;
}

std::string arch_of(const KernelSpec &s) {
  return "sm_" + std::to_string(s.sm) + (s.wgmma ? "a" : "");
}

// "<arch> <XXH3-128 of the PTX, hex>": the table's key.
std::string module_key(const KernelSpec &s, const std::string &ptx) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(ptx.data(), ptx.size()));
  std::string hex;
  char b[3];
  for (unsigned char x : c.digest) {
    std::snprintf(b, sizeof b, "%02x", x);
    hex += b;
  }
  return arch_of(s) + " " + hex;
}

// The last line of `ptxas --version` ("Build cuda_13.0.r13.0/compiler..."),
// or "" when it cannot be run.
std::string ptxas_version(const char *ptxas) {
  const std::string cmd = std::string("'") + ptxas + "' --version 2>/dev/null";
  FILE *f = popen(cmd.c_str(), "r");
  if (!f) return "";
  std::string out, line;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) {
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) out = line;
  }
  return pclose(f) == 0 ? out : "";
}

const char *kTableHeader = "# ptxas ";

// Reads `path` when its header names `version`: key -> result.
std::map<std::string, PtxasResult> read_table(const std::string &path, const std::string &version) {
  std::map<std::string, PtxasResult> t;
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line) || line != kTableHeader + version) return t;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    char arch[16], hex[40];
    PtxasResult r;
    if (std::sscanf(line.c_str(), "%15s %39s %d %d %d %d %d", arch, hex, &r.regs, &r.stack,
                    &r.spill_st, &r.spill_ld, &r.advisory) == 7)
      t[std::string(arch) + " " + hex] = r;
  }
  return t;
}

void summarize(const Job &job, const PtxasResult &r, const std::string &log, int *spilling,
               int *forward_bad) {
  const bool spills = r.stack || r.spill_st || r.spill_ld;
  if (spills) ++*spilling;
  // Forward and backward kernels, and the decode variants of the features
  // since 0.4 (tree masks, sinks, ALiBi, fp8, append, head dims past 256:
  // held to the same rule), must not touch local memory.
  const bool strict = job.spec.kind == KernelKind::Forward || is_backward(job.spec.kind) ||
                      job.spec.tree_mask || job.spec.sinks || job.spec.alibi ||
                      job.spec.kv_fp8 != KvFp8::None || job.spec.append_kv ||
                      job.spec.head_dim > 256 || job.spec.head_dim_v > 256;
  if (strict && (spills || r.regs < 0 || r.regs > 255 || r.advisory)) ++*forward_bad;
  std::printf("  %-52s regs %3d  stack %4d  spill st/ld %4d/%4d%s%s\n", job.spec.describe().c_str(),
              r.regs, r.stack, r.spill_st, r.spill_ld, spills ? "  <- local memory" : "",
              r.advisory ? "  <- performance advisory" : "");
  if (r.advisory && !log.empty()) std::printf("%s\n", log.c_str());
}

void test_ptxas_assembles_grid(void **) {
  const char *ptxas = FA_PTXAS_PATH;
  if (!ptxas[0] || access(ptxas, X_OK) != 0) {
    std::printf("SKIP: ptxas not available (FA_PTXAS_PATH=\"%s\")\n", ptxas);
    skip();
  }
  char dir_template[] = "/tmp/fa_ptxas_XXXXXX";
  char *dir = mkdtemp(dir_template);
  assert_non_null(dir);
  const std::string version = ptxas_version(ptxas);
  const char *all = std::getenv("FA_PTXAS_ALL");
  const std::string table_path = std::string(FA_TEST_DATA_DIR) + "/ptxas_results.tsv";
  const std::map<std::string, PtxasResult> table = version.empty() || (all && all[0] == '1')
                                                       ? std::map<std::string, PtxasResult>()
                                                       : read_table(table_path, version);
  std::vector<Job> jobs;
  std::vector<std::string> keys;
  std::vector<bool> assemble;
  size_t hits = 0;
  for (const KernelSpec &s : grid()) {
    Job j;
    j.spec = s;
    std::string ptx = generate_ptx(s);
    assert_true(ptx.size() > 0);
    std::string base = std::string(dir) + "/" + std::to_string(jobs.size()) + "_" + entry_name(s) +
                       "_sm" + std::to_string(s.sm);
    j.ptx_path = base + ".ptx";
    j.log_path = base + ".log";
    std::ofstream(j.ptx_path) << ptx;
    keys.push_back(module_key(s, ptx));
    const bool known = table.count(keys.back()) != 0;
    hits += known;
    assemble.push_back(!known || hits % kRecheckEvery == 0);
    jobs.push_back(j);
  }
  if (const char *q = std::getenv("FA_TEST_QUICK"); q && q[0] == '1') {
    std::printf("FA_TEST_QUICK=1: %zu modules generated, not assembled\n", jobs.size());
    for (const Job &j : jobs) std::remove(j.ptx_path.c_str());
    rmdir(dir);
    return;
  }
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const size_t kParallel = cpus > 2 ? size_t(cpus) : 2;
  std::vector<size_t> todo;
  for (size_t i = 0; i < jobs.size(); ++i)
    if (assemble[i]) todo.push_back(i);
  size_t next = 0, done = 0;
  std::vector<size_t> running;
  while (done < todo.size()) {
    while (running.size() < kParallel && next < todo.size()) {
      assert_true(spawn_ptxas(ptxas, jobs[todo[next]]));
      running.push_back(todo[next++]);
    }
    int status = 0;
    pid_t pid = wait(&status);
    assert_true(pid > 0);
    for (size_t i = 0; i < running.size(); ++i) {
      if (jobs[running[i]].pid != pid) continue;
      jobs[running[i]].status = status;
      running.erase(running.begin() + static_cast<long>(i));
      ++done;
      break;
    }
  }
  int failed = 0, spilling = 0, forward_bad = 0, stale = 0;
  std::printf("ptxas -v over %zu modules (%s):\n", jobs.size(), version.c_str());
  std::map<std::string, PtxasResult> record;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job &j = jobs[i];
    const auto known = table.find(keys[i]);
    std::string log;
    PtxasResult r;
    if (assemble[i]) {
      log = read_file(j.log_path);
      if (!WIFEXITED(j.status) || WEXITSTATUS(j.status) != 0) {
        ++failed;
        std::printf("FAILED: %s (sm_%d), %s\n%s\n", j.spec.describe().c_str(), j.spec.sm,
                    j.ptx_path.c_str(), log.c_str());
        continue;
      }
      r = parse_log(log);
      if (known != table.end() && !(known->second == r)) {
        ++stale;
        std::printf("STALE: %s: %s records regs %d stack %d spills %d/%d advisory %d\n",
                    j.spec.describe().c_str(), table_path.c_str(), known->second.regs,
                    known->second.stack, known->second.spill_st, known->second.spill_ld,
                    known->second.advisory);
      }
    } else {
      r = known->second;
    }
    record[keys[i]] = r;
    summarize(j, r, log, &spilling, &forward_bad);
  }
  std::printf(
      "%zu modules (%zu assembled, %zu from %s), %d failed, %d with local memory, "
      "%d forward with local memory, %d recorded results contradicted\n",
      jobs.size(), todo.size(), jobs.size() - todo.size(), table_path.c_str(), failed, spilling,
      forward_bad, stale);
  // This run's table, for tests/data when the grid or its kernels changed.
  if (failed == 0 && !version.empty()) {
    const std::string out = std::string(FA_TEST_BINARY_DIR) + "/ptxas_results.tsv";
    std::ofstream f(out);
    f << kTableHeader << version
      << "\n# target XXH3-128(PTX) regs stack spill_st spill_ld advisory\n";
    for (const auto &[k, r] : record)
      f << k << " " << r.regs << " " << r.stack << " " << r.spill_st << " " << r.spill_ld << " "
        << r.advisory << "\n";
    if (record.size() != table.size() || hits != jobs.size())
      std::printf("%zu modules not in %s: to record them, cp %s %s\n", jobs.size() - hits,
                  table_path.c_str(), out.c_str(), table_path.c_str());
  }
  if (failed == 0) {
    for (const Job &j : jobs) {
      std::remove(j.ptx_path.c_str());
      std::remove(j.log_path.c_str());
    }
    rmdir(dir);
  }
  assert_int_equal(failed, 0);
  assert_int_equal(forward_bad, 0);
  assert_int_equal(stale, 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ptxas_hopper_forms),
      cmocka_unit_test(test_ptxas_fp8_mma_forms),
      cmocka_unit_test(test_ptxas_assembles_grid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
