// The cluster state of a CTA (emu/cluster.h). docs/emulator.md,
// "Clusters", has the model and its sources in the PTX ISA.
#include "emu/cluster.h"

#include <cstdio>
#include <cstring>

#include "emu/sm90.h"

namespace fa {
namespace emu {

int g_cluster_bug = kClusterBugNone;

namespace {

// Whether the cluster barrier's current phase is complete: every
// non-exited thread of the cluster arrived (PTX ISA "barrier.cluster").
bool barrier_complete(const Cluster &cl) {
  const uint32_t early = g_cluster_bug == kClusterBugBarrierEarly ? 1 : 0;
  return cl.bar_arrived > 0 && cl.bar_arrived + early >= cl.live;
}

}  // namespace

ClusterState::ClusterState(Cta &cta) : cta_(cta) {}

void ClusterState::reset_block() {
  arrive_pc_.assign(cta_.nthreads_, 0);
  arrive_phase_.assign(cta_.nthreads_, 0);
}

Step ClusterState::exec(uint32_t t, uint32_t pc, uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  Cluster &cl = *cta_.cluster_;
  switch (in.op) {
    case Op::kMapa: {  // PTX ISA "mapa": the same offset in CTA rank b
      const uint32_t a = static_cast<uint32_t>(static_cast<uint32_t>(r[in.a]) + in.imm);
      const uint32_t rank = static_cast<uint32_t>(r[in.b]);
      if (rank >= cl.size) {
        cta_.fail_at(pc, t, "target CTA rank %u is outside the cluster's %u CTAs (ranks 0..%u)",
                     rank, cl.size, cl.size - 1);
        return Step::kFault;
      }
      uint32_t off;
      if (!cta_.cluster_target(a, 1, t, pc, &off)) return Step::kFault;
      r[in.d] = cluster_address(rank, off);
      return Step::kNext;
    }
    case Op::kLdCluster:
    case Op::kStCluster: {  // PTX ISA "ld", "st" on .shared::cluster
      const uint32_t a = static_cast<uint32_t>(static_cast<uint32_t>(r[in.a]) + in.imm);
      const uint32_t es = in.sub, n = es * in.vec;
      uint32_t off;
      Cta *c = cta_.cluster_target(a, n, t, pc, &off);
      if (!c) return Step::kFault;
      const bool ld = in.op == Op::kLdCluster;
      if (ld && g_cluster_bug == kClusterBugDsmemLocal) c = &cta_;
      uint8_t *p = c->smem_.data() + off;
      for (uint32_t k = 0; k < in.vec; ++k) {
        uint64_t &reg = r[in.vec == 1 ? (ld ? in.d : in.b) : in.v[k]];
        if (!ld) {
          std::memcpy(p + k * es, &reg, es);  // little-endian: the low es bytes
          continue;
        }
        uint64_t v = 0;
        std::memcpy(&v, p + k * es, es);
        if ((in.flags & kSigned) && es < 8 && ((v >> (8 * es - 1)) & 1)) v |= ~0ull << (8 * es);
        reg = v;
      }
      return Step::kNext;
    }
    case Op::kClusterArrive:
      return arrive(t, pc) ? Step::kNext : Step::kFault;
    case Op::kClusterWait:
      if (!arrive_pc_[t]) {
        cta_.fail_at(pc, t,
                     "barrier.cluster.wait without a preceding barrier.cluster.arrive of the "
                     "thread (PTX ISA \"barrier.cluster\": each wait pairs with an arrive)");
        return Step::kFault;
      }
      if (arrive_phase_[t] < cl.bar_phase) {  // its arrival's phase completed
        arrive_pc_[t] = 0;
        return Step::kNext;
      }
      return Step::kBlock;
    default:
      cta_.fail_at(pc, t, "not a cluster op (emulator bug: emu/ops.def handler)");
      return Step::kFault;
  }
}

// barrier.cluster.arrive{.release,.relaxed}: the thread's arrival in the
// current phase; a second one before its wait is an error. The .release
// form (the default) also makes the thread's earlier mbarrier.inits visible
// to the cluster, as fence.mbarrier_init does.
bool ClusterState::arrive(uint32_t t, uint32_t pc) {
  Cluster &cl = *cta_.cluster_;
  if (arrive_pc_[t]) {
    const uint32_t first = arrive_pc_[t] - 1;
    return cta_.fail_at(pc, t,
                        "the thread arrives at the cluster barrier again without a "
                        "barrier.cluster.wait after its arrival at PTX line %u (PTX ISA "
                        "\"barrier.cluster\": an arrive must be followed by a wait)",
                        cta_.e_.code[first].line);
  }
  arrive_pc_[t] = pc + 1;
  arrive_phase_[t] = cl.bar_phase;
  ++cl.bar_arrived;
  if (cta_.e_.code[pc].sub == 0) cl.sm90[cta_.rank_]->publish_inits(t);
  if (barrier_complete(cl)) complete_phase();
  return true;
}

// The phase completes: the threads of every CTA waiting for it go on.
void ClusterState::complete_phase() {
  Cluster &cl = *cta_.cluster_;
  const uint32_t done = cl.bar_phase++;
  cl.bar_arrived = 0;
  for (ClusterState *s : cl.state) {
    Cta &c = s->cta_;
    for (uint32_t u = 0; u < c.nthreads_; ++u) {
      if (c.state_[u] != ThreadState::kWaiting || c.e_.code[c.pc_[u]].op != Op::kClusterWait ||
          !s->arrive_pc_[u] || s->arrive_phase_[u] != done)
        continue;
      s->arrive_pc_[u] = 0;
      ++c.pc_[u];
      c.wake(u);
    }
  }
}

int ClusterState::resolve_collectives(std::string *) {
  if (!barrier_complete(*cta_.cluster_)) return 0;
  complete_phase();
  return 1;
}

void ClusterState::thread_exited(uint32_t t) {
  Cluster &cl = *cta_.cluster_;
  --cl.live;
  if (arrive_pc_[t] && arrive_phase_[t] == cl.bar_phase) --cl.bar_arrived;
}

// The deadlock report of thread t at barrier.cluster.wait: the phase, the
// arrivals, and the first non-exited thread of the cluster that did not
// arrive, with the line it waits at.
std::string ClusterState::wait_text(uint32_t t, uint32_t nwait) {
  const Cluster &cl = *cta_.cluster_;
  const uint32_t pc = cta_.pc_[t];
  std::string missing = "none";
  for (const ClusterState *s : cl.state) {
    const Cta &c = s->cta_;
    for (uint32_t u = 0; u < c.nthreads_ && missing == "none"; ++u) {
      if (c.state_[u] == ThreadState::kExited ||
          (s->arrive_pc_[u] && s->arrive_phase_[u] == cl.bar_phase))
        continue;
      missing = c.thread_text(u) + " at PTX line " + std::to_string(c.e_.code[c.pc_[u]].line);
    }
  }
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "%s at PTX line %u: deadlock: %u thread(s) of the CTA wait for phase %u of the "
                "cluster barrier; %u of the cluster's %u non-exited threads arrived (the first "
                "missing: %s)",
                cta_.e_.op_text[pc].c_str(), cta_.e_.code[pc].line, nwait, cl.bar_phase,
                cl.bar_arrived, cl.live, missing.c_str());
  return buf;
}

}  // namespace emu
}  // namespace fa
