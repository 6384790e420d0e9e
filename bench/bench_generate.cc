// PTX generation time per kernel: median over many runs of generate_ptx(),
// printed as a table. Not a test. Usage: bench_generate [runs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/kernels.h"

using namespace fa;

namespace {

AttentionConfig config(Dtype dt, int d, int dv, int hq, int hkv, float softcap) {
  return attention_config(dt, d, dv, hq, hkv, 0.1f, softcap);
}

}  // namespace

int main(int argc, char **argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  struct Row {
    AttentionConfig cfg;
    KernelKind kind;
    bool varlen;
  };
  const Row rows[] = {
      {config(Dtype::F16, 64, 64, 8, 8, 0), KernelKind::Forward, false},
      {config(Dtype::F16, 128, 128, 8, 8, 0), KernelKind::Forward, false},
      {config(Dtype::BF16, 128, 128, 8, 8, 30), KernelKind::Forward, true},
      {config(Dtype::F16, 256, 256, 8, 8, 0), KernelKind::Forward, false},
      {config(Dtype::F16, 128, 128, 32, 4, 0), KernelKind::Decode, false},
      {config(Dtype::BF16, 256, 256, 8, 1, 0), KernelKind::Decode, false},
      {config(Dtype::F16, 128, 128, 8, 8, 0), KernelKind::Reduce, false},
  };
  std::printf("PTX generation, median of %d runs (sm_80)\n", runs);
  std::printf("%-58s %10s %10s %8s\n", "kernel", "median us", "min us", "KB");
  for (const Row &r : rows) {
    KernelSpec s = make_spec(r.cfg, r.kind, 80, r.varlen);
    std::vector<double> us;
    size_t bytes = 0;
    for (int i = 0; i < runs; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      std::string ptx = generate_ptx(s);
      auto t1 = std::chrono::steady_clock::now();
      bytes = ptx.size();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("%-58s %10.1f %10.1f %8.1f\n", s.describe().c_str(), us[us.size() / 2], us[0],
                bytes / 1024.0);
  }
  return 0;
}
