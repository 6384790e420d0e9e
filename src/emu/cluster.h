// The cluster state of a CTA (emu/arch.h): mapa, ld / st .shared::cluster
// (distributed shared memory) and barrier.cluster.arrive / wait, over the
// CTAs of its cluster (emu/cta.h, Cluster), which one worker runs together
// (emu/interp.cc). The remote mbarrier arrive, fence.mbarrier_init and the
// multicast cp.async.bulk.tensor are the sm_90 state's (emu/sm90.h).
// docs/emulator.md, "Clusters", has the model and its sources in the PTX
// ISA. Internal to the emulator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emu/arch.h"
#include "emu/cta.h"

namespace fa {
namespace emu {

// Deliberate emulator bugs, for the tests that must catch each one
// (tests/test_emulator_cluster.cc); kClusterBugNone in normal use. Read at
// each instruction or block start, so a test sets it around one launch.
enum ClusterBug : int {
  kClusterBugNone = 0,
  kClusterBugRankOffByOne,   // %cluster_ctarank reads (rank + 1) % size
  kClusterBugBarrierEarly,   // barrier.cluster completes its phase one arrival early
  kClusterBugMulticastSkip,  // multicast TMA skips the highest CTA of its ctaMask
  kClusterBugDsmemLocal,     // ld.shared::cluster reads the executing CTA's memory
};
extern int g_cluster_bug;

class ClusterState final : public ArchState {
 public:
  explicit ClusterState(Cta &cta);

  void reset_block() override;
  // mapa, ld / st .shared::cluster, barrier.cluster.arrive / wait.
  Step exec(uint32_t t, uint32_t pc, uint64_t *r) override;
  // Completes the cluster barrier's phase once every non-exited thread of
  // the cluster arrived (exits can complete it): 1 when it did.
  int resolve_collectives(std::string *stuck) override;
  // A thread at barrier.cluster.wait.
  std::string wait_text(uint32_t t, uint32_t nwait) override;
  bool finish_block() override { return true; }

  // Thread t exited: it no longer counts for the cluster barrier.
  void thread_exited(uint32_t t);

 private:
  bool arrive(uint32_t t, uint32_t pc);
  void complete_phase();

  Cta &cta_;
  // Per thread: 0, or 1 + the pc of its barrier.cluster.arrive not yet
  // followed by a barrier.cluster.wait, and that arrival's phase.
  std::vector<uint32_t> arrive_pc_, arrive_phase_;
};

}  // namespace emu
}  // namespace fa
