#include "runtime/warm.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "common/error.h"
#include "runtime/runtime.h"

namespace fa {
namespace {

struct Job {
  const KernelSpec *spec = nullptr;
  std::string material;
  cache::Key key;
};

enum class Outcome { kBuilt, kPresent, kFailed };

// One kernel: its row is left alone when current, else generated, compiled
// and written. *message: why it failed.
Outcome warm_one(cache::Store &store, const Job &job, const ptxc::PluginState *plugin,
                 uint64_t *bytes, std::string *message) {
  cache::Record rec;
  if (store.get(job.key, job.material, &rec) && !rec.ptx.empty() && rec.sm == job.spec->sm &&
      rec.generator_version == kGeneratorVersion) {
    CompilerInfo with;
    with.mode = FA_COMPILER_PLUGIN;
    with.version = plugin ? plugin->version : "";
    if (plugin == nullptr || binary_current(rec, with, 0)) return Outcome::kPresent;
  }
  rec = new_record(*job.spec, job.material);
  if (rec.ptx.empty()) {
    *message = "no generator takes it";
    return Outcome::kFailed;
  }
  if (plugin != nullptr) {
    std::string log;
    const fa_status st = ptxc::compile_cubin(
        plugin->plugin, rec.ptx, ptxc::cubin_target(rec.ptx, job.spec->sm), &rec.cubin, &log);
    if (st != FA_SUCCESS) {
      *message = last_error();
      clear_error();
      return Outcome::kFailed;
    }
    rec.compiler = plugin->version;
  }
  *bytes = rec.ptx.size() + rec.cubin.size();
  store.put(job.key, rec);
  return Outcome::kBuilt;
}

}  // namespace

void warm_store(cache::Store &store, const std::vector<KernelSpec> &specs,
                const ptxc::PluginState *plugin, int jobs, const WarmProgressFn &progress,
                WarmResult *out) {
  const auto start = std::chrono::steady_clock::now();
  *out = WarmResult();
  std::vector<Job> todo;
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (const KernelSpec &spec : specs) {
    Job job;
    job.spec = &spec;
    job.material = kernel_key_material(spec);
    job.key = key_of_material(job.material);
    if (seen.insert({job.key.hi, job.key.lo}).second) todo.push_back(std::move(job));
  }
  WarmCounts &c = out->counts;
  c.total = todo.size();

  // Workers take jobs in order; the calling thread reports each finished
  // one, so that `progress` is never called concurrently or from a worker.
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;
  struct Finished {
    const KernelSpec *spec;
    Outcome outcome;
    uint64_t bytes;
    std::string message;
  };
  std::deque<Finished> finished;
  auto worker = [&]() {
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next == todo.size()) return;
        i = next++;
      }
      Finished f{todo[i].spec, Outcome::kFailed, 0, ""};
      try {  // nothing may leave a thread: std::terminate
        f.outcome = warm_one(store, todo[i], plugin, &f.bytes, &f.message);
      } catch (const std::exception &e) {
        f.message = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      finished.push_back(std::move(f));
      cv.notify_one();
    }
  };
  std::vector<std::thread> threads;
  const int n =
      static_cast<int>(std::min<size_t>(std::max(jobs, 1), std::max<size_t>(todo.size(), 1)));
  for (int t = 0; t < n; ++t) threads.emplace_back(worker);
  for (uint64_t reported = 0; reported < c.total; ++reported) {
    Finished f;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !finished.empty(); });
      f = std::move(finished.front());
      finished.pop_front();
    }
    ++c.done;
    if (f.outcome == Outcome::kBuilt) ++c.built, c.bytes += f.bytes;
    if (f.outcome == Outcome::kPresent) ++c.present;
    if (f.outcome == Outcome::kFailed) {
      ++c.failed;
      if (out->first_failure.empty()) out->first_failure = f.spec->describe() + ": " + f.message;
    }
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(c, *f.spec);  // must not throw: the workers are running
  }
  for (std::thread &t : threads) t.join();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace fa
