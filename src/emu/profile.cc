#include "emu/profile.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <tuple>

namespace fa {
namespace emu {

void MemCounters::add(Op op, const InstProfile &p) {
  if (op == Op::kStGlobal) {
    global_store_requests += p.global_requests;
    global_store_sectors += p.global_sectors;
    global_store_bytes += p.global_bytes;
  } else {
    global_load_requests += p.global_requests;
    global_load_sectors += p.global_sectors;
    global_load_bytes += p.global_bytes;
  }
  if (op == Op::kCpAsync) {
    cp_async_requests += p.global_requests;
    cp_async_sectors += p.global_sectors;
    cp_async_bytes += p.global_bytes;
  }
  if (op == Op::kBulkTensor) {
    tma_requests += p.global_requests;
    tma_sectors += p.global_sectors;
    tma_bytes += p.global_bytes;
  }
  wgmma_requests += p.wgmma_requests;
  wgmma_shared_bytes += p.wgmma_bytes;
  wgmma_shared_wavefronts += p.wgmma_wavefronts;
  shared_requests += p.shared_requests;
  shared_wavefronts += p.shared_wavefronts;
  shared_bank_conflicts += p.shared_wavefronts - p.shared_phases;
}

void cost_global(LaneAccess *a, size_t n, uint64_t *sectors, uint64_t *bytes) {
  std::sort(a, a + n, [](const LaneAccess &x, const LaneAccess &y) { return x.addr < y.addr; });
  uint64_t sec = 0, used = 0;
  uint64_t cur_lo = 0, cur_hi = 0;  // merged interval [lo, hi)
  uint64_t last_sector = UINT64_MAX;
  bool open = false;
  auto close = [&] {
    used += cur_hi - cur_lo;
    uint64_t first = cur_lo >> 5, last = (cur_hi - 1) >> 5;
    sec += last - first + 1;
    if (first == last_sector) --sec;  // shared with the previous interval
    last_sector = last;
  };
  for (size_t i = 0; i < n; ++i) {
    if (a[i].bytes == 0) continue;
    const uint64_t lo = a[i].addr, hi = a[i].addr + a[i].bytes;
    if (open && lo <= cur_hi) {
      cur_hi = std::max(cur_hi, hi);
      continue;
    }
    if (open) close();
    cur_lo = lo;
    cur_hi = hi;
    open = true;
  }
  if (open) close();
  *sectors = sec;
  *bytes = used;
}

void cost_shared(const LaneAccess *a, size_t n, uint32_t bytes, uint64_t *wavefronts,
                 uint64_t *phases) {
  // Lanes per phase: a phase moves at most 128 bytes (32 banks x 4 bytes).
  const uint32_t per_phase = bytes <= 4 ? 32 : std::max<uint32_t>(1, 128 / bytes);
  const uint32_t nphases = 32 / per_phase;
  uint64_t wf = 0, ph = 0;
  uint32_t words[128];
  for (uint32_t p = 0; p < nphases; ++p) {
    uint32_t nw = 0;
    for (size_t i = 0; i < n; ++i) {
      if (a[i].lane / per_phase != p) continue;
      const uint64_t w0 = a[i].addr >> 2, w1 = (a[i].addr + bytes - 1) >> 2;
      for (uint64_t w = w0; w <= w1 && nw < 128; ++w) words[nw++] = static_cast<uint32_t>(w);
    }
    if (nw == 0) continue;
    std::sort(words, words + nw);
    nw = static_cast<uint32_t>(std::unique(words, words + nw) - words);
    uint32_t per_bank[32] = {0};
    uint32_t most = 0;
    for (uint32_t i = 0; i < nw; ++i) most = std::max(most, ++per_bank[words[i] & 31]);
    wf += most;
    ++ph;
  }
  *wavefronts = wf;
  *phases = ph;
}

MainLoop find_main_loop(const Entry &e) {
  MainLoop m;
  const size_t n = e.code.size();
  m.member.assign(n, 0);
  // Prefix counts of mma.sync and of global loads, for "loop contains".
  std::vector<uint32_t> mma(n + 1, 0), gld(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Op op = e.code[i].op;
    mma[i + 1] = mma[i] + (op == Op::kMma || op == Op::kWgmma || op == Op::kBulkTensor);
    gld[i + 1] = gld[i] + (op == Op::kLdGlobal || op == Op::kCpAsync);
  }
  std::vector<std::pair<uint32_t, uint32_t>> loops;
  for (size_t i = 0; i < n; ++i) {
    const Inst &in = e.code[i];
    if (in.op == Op::kBra && in.imm >= 0 && static_cast<size_t>(in.imm) <= i)
      loops.emplace_back(static_cast<uint32_t>(in.imm), static_cast<uint32_t>(i));
  }
  for (const std::vector<uint32_t> *count : {&mma, &gld}) {
    std::vector<std::pair<uint32_t, uint32_t>> with;
    for (const auto &l : loops)
      if ((*count)[l.second + 1] - (*count)[l.first] > 0) with.push_back(l);
    for (const auto &l : with) {
      bool innermost = true;
      for (const auto &o : with)
        if (o != l && o.first >= l.first && o.second <= l.second) innermost = false;
      if (innermost) m.ranges.push_back(l);
    }
    if (!m.ranges.empty()) break;
  }
  std::sort(m.ranges.begin(), m.ranges.end());
  m.ranges.erase(std::unique(m.ranges.begin(), m.ranges.end()), m.ranges.end());
  uint32_t lo = UINT32_MAX, hi = 0;
  for (const auto &r : m.ranges) {
    for (uint32_t pc = r.first; pc <= r.second; ++pc) m.member[pc] = 1;
    lo = std::min(lo, r.first);
    hi = std::max(hi, r.second);
  }
  if (!m.ranges.empty()) {
    m.first_line = e.code[lo].line;
    m.last_line = e.code[hi].line;
  }
  return m;
}

LaunchProfile summarize(const Entry &e, std::vector<InstProfile> by_pc) {
  LaunchProfile p;
  p.entry = e.name;
  p.by_pc = std::move(by_pc);
  p.by_pc.resize(e.code.size());
  p.loop = find_main_loop(e);
  uint64_t worst_conflicts = 0, worst_waste = 0;
  for (size_t pc = 0; pc < p.by_pc.size(); ++pc) {
    const InstProfile &ip = p.by_pc[pc];
    const Op op = e.code[pc].op;
    p.total.add(op, ip);
    if (!p.loop.contains(static_cast<uint32_t>(pc))) continue;
    p.main_loop.add(op, ip);
    const uint64_t conflicts = ip.shared_wavefronts - ip.shared_phases;
    const uint64_t waste = ip.global_sectors * 32 - ip.global_bytes;
    if (conflicts > worst_conflicts) {
      worst_conflicts = conflicts;
      p.loop_worst_conflict_line = e.code[pc].line;
    }
    if (waste > worst_waste) {
      worst_waste = waste;
      p.loop_worst_sector_line = e.code[pc].line;
    }
  }
  return p;
}

namespace {

double pct(uint64_t used, uint64_t sectors) {
  return sectors ? 100.0 * static_cast<double>(used) / (32.0 * static_cast<double>(sectors))
                 : 100.0;
}

std::string row(const char *scope, const MemCounters &c) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "  %-22s %9" PRIu64 " %10" PRIu64 " %6.1f%% %9" PRIu64 " %6.1f%% %9" PRIu64
                " %10" PRIu64 " %6.1f%% %9" PRIu64 " %10" PRIu64 " %9" PRIu64 "\n",
                scope, c.global_load_requests, c.global_load_sectors,
                pct(c.global_load_bytes, c.global_load_sectors), c.cp_async_requests,
                pct(c.cp_async_bytes, c.cp_async_sectors), c.global_store_requests,
                c.global_store_sectors, pct(c.global_store_bytes, c.global_store_sectors),
                c.shared_requests, c.shared_wavefronts, c.shared_bank_conflicts);
  return buf;
}

}  // namespace

std::string format_profile(const Entry &e, const LaunchProfile &p, int max_lines) {
  std::string s = "flashattn emulator profile: " + e.name + "\n";
  char buf[400];
  std::snprintf(buf, sizeof buf, "  %-22s %9s %10s %7s %9s %7s %9s %10s %7s %9s %10s %9s\n", "",
                "ld req", "ld sectors", "ld eff", "cp.async", "eff", "st req", "st sectors",
                "st eff", "smem req", "wavefronts", "conflicts");
  s += buf;
  s += row("kernel", p.total);
  if (p.loop.ranges.empty()) {
    s += "  main loop: none found\n";
  } else {
    std::snprintf(buf, sizeof buf, "main loop (%u-%u)", p.loop.first_line, p.loop.last_line);
    s += row(buf, p.main_loop);
  }
  // sm_90 traffic, when there is any: TMA loads (part of the ld columns)
  // and wgmma's shared operand reads.
  for (int scope = 0; scope < 2; ++scope) {
    const MemCounters &c = scope == 0 ? p.total : p.main_loop;
    if (!c.tma_requests && !c.wgmma_requests) continue;
    std::snprintf(buf, sizeof buf,
                  "  %-22s TMA %" PRIu64 " requests, %" PRIu64
                  " sectors (%.1f%% used); wgmma "
                  "shared operands %" PRIu64 " requests, %" PRIu64 " bytes, %" PRIu64
                  " wavefronts\n",
                  scope == 0 ? "kernel" : "main loop", c.tma_requests, c.tma_sectors,
                  pct(c.tma_bytes, c.tma_sectors), c.wgmma_requests, c.wgmma_shared_bytes,
                  c.wgmma_shared_wavefronts);
    s += buf;
  }
  // The worst instructions: bank conflicts, then wasted sector bytes.
  for (int kind = 0; kind < 2; ++kind) {
    // (in the main loop, excess, pc): main-loop instructions first, the
    // largest excess (conflict wavefronts, unused sector bytes) first.
    std::vector<std::tuple<bool, uint64_t, size_t>> bad;
    for (size_t pc = 0; pc < p.by_pc.size(); ++pc) {
      const InstProfile &ip = p.by_pc[pc];
      const uint64_t v = kind == 0 ? ip.shared_wavefronts - ip.shared_phases
                                   : ip.global_sectors * 32 - ip.global_bytes;
      if (v) bad.emplace_back(p.loop.contains(static_cast<uint32_t>(pc)), v, pc);
    }
    std::sort(bad.begin(), bad.end(), [](const auto &x, const auto &y) {
      if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x);
      if (std::get<1>(x) != std::get<1>(y)) return std::get<1>(x) > std::get<1>(y);
      return std::get<2>(x) < std::get<2>(y);
    });
    for (size_t i = 0; i < bad.size() && static_cast<int>(i) < max_lines; ++i) {
      const size_t pc = std::get<2>(bad[i]);
      const InstProfile &ip = p.by_pc[pc];
      const char *where = p.loop.contains(static_cast<uint32_t>(pc)) ? "main loop" : "outside";
      if (kind == 0) {
        std::snprintf(buf, sizeof buf,
                      "  bank conflicts: PTX line %u %s (%s): %" PRIu64 " wavefronts for %" PRIu64
                      " phases in %" PRIu64 " requests\n",
                      e.code[pc].line, e.op_text[pc].c_str(), where, ip.shared_wavefronts,
                      ip.shared_phases, ip.shared_requests);
      } else {
        std::snprintf(buf, sizeof buf,
                      "  sector waste: PTX line %u %s (%s): %" PRIu64 " of %" PRIu64
                      " sector bytes used (%.1f%%) in %" PRIu64 " requests\n",
                      e.code[pc].line, e.op_text[pc].c_str(), where, ip.global_bytes,
                      ip.global_sectors * 32, pct(ip.global_bytes, ip.global_sectors),
                      ip.global_requests);
      }
      s += buf;
    }
    if (bad.size() > static_cast<size_t>(max_lines)) {
      std::snprintf(buf, sizeof buf, "  ... %zu more instructions with %s\n",
                    bad.size() - static_cast<size_t>(max_lines),
                    kind == 0 ? "bank conflicts" : "sector waste");
      s += buf;
    }
  }
  return s;
}

}  // namespace emu
}  // namespace fa
