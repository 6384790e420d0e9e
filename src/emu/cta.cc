#include "emu/cta.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>

namespace fa {
namespace emu {

void LaunchShared::report(uint64_t block, const std::string &msg) {
  std::lock_guard<std::mutex> lock(error_mu);
  if (block < error_block) {
    error_block = block;
    error = msg;
  }
  uint64_t cur = first_error_block.load();
  while (block < cur && !first_error_block.compare_exchange_weak(cur, block)) {
  }
}

Cta::Cta(LaunchShared &sh)
    : sh_(sh), e_(*sh.entry), cfg_(*sh.cfg), prof_(cfg_.profile), pdl_(cfg_.programmatic) {
  nthreads_ = cfg_.block[0] * cfg_.block[1] * cfg_.block[2];
  ns_ = e_.num_slots;
  regs_.resize(static_cast<size_t>(nthreads_) * ns_);
  state_.resize(nthreads_);
  pc_.resize(nthreads_);
  smem_size_ = e_.dynamic_smem_offset + cfg_.dynamic_smem;
  if (cfg_.dynamic_smem == 0) smem_size_ = e_.static_smem;
  smem_.resize(std::max<size_t>(smem_size_, 1));
  if (prof_) inst_.assign(e_.code.size(), InstProfile());
  if (pdl_) early_.assign(nthreads_, 1);
}

std::string Cta::block_text() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", ctaid_[0], ctaid_[1], ctaid_[2]);
  return buf;
}

std::string Cta::thread_text(uint32_t t) const {
  char buf[96];
  const uint32_t bx = cfg_.block[0], by = cfg_.block[1];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) block (%u,%u,%u)", t % bx, (t / bx) % by,
                t / (bx * by), ctaid_[0], ctaid_[1], ctaid_[2]);
  return buf;
}

bool Cta::fail_at(uint32_t pc, uint32_t t, const char *fmt, ...) {
  char body[600];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  error_ = e_.op_text[pc] + " at PTX line " + std::to_string(e_.code[pc].line) + ": " + body +
           (t == UINT32_MAX ? "; block " + block_text() : "; " + thread_text(t));
  return false;
}

bool Cta::early_global(uint32_t t, uint32_t pc) {
  return fail_at(pc, t,
                 "global memory accessed before griddepcontrol.wait in a programmatic dependent "
                 "launch (the previous kernel may still be running: PTX ISA \"griddepcontrol\")");
}

void Cta::fault_global(uint32_t t, uint32_t pc, uint64_t addr, uint32_t size, bool misaligned) {
  const Inst &in = e_.code[pc];
  char buf[600];
  std::string where = misaligned ? "is not aligned to " + std::to_string(size) + " bytes"
                                 : sh_.mem->describe_locked(addr, size);
  std::snprintf(buf, sizeof buf,
                "%s at PTX line %u: %s global address 0x%" PRIx64 " (%u bytes) %s; %s",
                e_.op_text[pc].c_str(), in.line, misaligned ? "misaligned" : "out-of-bounds", addr,
                size, where.c_str(), thread_text(t).c_str());
  error_ = buf;
}

void Cta::fault_shared(uint32_t t, uint32_t pc, int64_t addr, uint32_t size, bool misaligned) {
  const Inst &in = e_.code[pc];
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "%s at PTX line %u: %s shared address %" PRId64
                " (%u bytes)%s; the block has "
                "%u bytes of shared memory (%u static + %u dynamic); %s",
                e_.op_text[pc].c_str(), in.line, misaligned ? "misaligned" : "out-of-bounds", addr,
                size, misaligned ? " is not naturally aligned" : "", smem_size_, e_.static_smem,
                cfg_.dynamic_smem, thread_text(t).c_str());
  error_ = buf;
}

void Cta::generic_fault(uint64_t addr, uint32_t size, uint32_t t, uint32_t pc, int why) {
  if (why == 0)
    fail_at(pc, t, "misaligned generic address 0x%" PRIx64 " (%u bytes)", addr, size);
  else if (why == 1)
    fail_at(pc, t, "store to the kernel parameter block (generic address 0x%" PRIx64 ")", addr);
  else
    fail_at(pc, t,
            "generic address 0x%" PRIx64 " (%u bytes) runs past the %zu-byte parameter block", addr,
            size, sh_.param_size);
}

Cta *Cta::cluster_target(uint32_t addr, uint32_t size, uint32_t t, uint32_t pc, uint32_t *off) {
  const uint32_t tag = addr >> kClusterRankShift;
  const uint32_t o = addr & ((1u << kClusterRankShift) - 1);
  Cta *c = this;
  if (tag != 0) {
    if (tag > cluster_->size) {
      fail_at(pc, t,
              "shared::cluster address 0x%x names CTA rank %u, but the cluster has %u CTAs "
              "(ranks 0..%u)",
              addr, tag - 1, cluster_->size, cluster_->size - 1);
      return nullptr;
    }
    c = cluster_->ctas[tag - 1];
  }
  if (o & (size - 1)) {
    fail_at(pc, t, "misaligned shared::cluster address 0x%x (%u bytes)", addr, size);
    return nullptr;
  }
  if (static_cast<uint64_t>(o) + size > c->smem_size_) {
    fail_at(pc, t,
            "out-of-bounds shared::cluster address 0x%x (%u bytes at offset %u of CTA rank %u, "
            "whose shared memory has %u bytes)",
            addr, size, o, c->rank_, c->smem_size_);
    return nullptr;
  }
  if (c->done_) {
    fail_at(pc, t,
            "shared::cluster address 0x%x is in CTA rank %u, which has exited (PTX ISA: a CTA's "
            "shared memory is accessible to its cluster only while the CTA runs)",
            addr, c->rank_);
    return nullptr;
  }
  *off = o;
  return c;
}

}  // namespace emu
}  // namespace fa
