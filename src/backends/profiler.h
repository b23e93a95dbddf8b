// libtorch's profiler around model runs, for a bounded window (TorchServe's
// ENABLE_TORCH_PROFILER, as `--profile` or SLUICE_TORCH_PROFILER=1).
//
// A profiled backend hands out instances that, on the thread that runs them, skip a few runs,
// record the next `runs` with the Kineto CPU profiler (operators, input shapes), then write the
// Chrome trace `profile-<model>-<instance>.json` and `profile-<model>-<instance>-ops.json`: the
// operators ranked by self time (time in the operator less the operators it called), summed over
// the window. Outside the window an instance costs one branch per run. Torch-free header.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "sluice/backend.h"

namespace sluice {

struct ProfileOptions {
  std::filesystem::path dir;  // Where the files go (created if missing).
  int skip_runs = 2;          // Runs before the window (warm-up); >= 0.
  int runs = 20;              // Runs in the window; >= 1.
  int top_operators = 20;     // Operators kept in the -ops.json file.
};

// What a finished window wrote. Thread-safe.
class ProfileLog {
 public:
  void Add(std::filesystem::path trace, std::filesystem::path ops);
  std::vector<std::filesystem::path> files() const;

 private:
  mutable Mutex mu_;
  std::vector<std::filesystem::path> files_ GUARDED_BY(mu_);
};

// `backend`'s instances, profiled as above; windows that finish are listed in `log`.
std::shared_ptr<Backend> WithProfiler(std::shared_ptr<Backend> backend, std::string model,
                                      ProfileOptions options, std::shared_ptr<ProfileLog> log);

// Whether SLUICE_TORCH_PROFILER is set to 1 (or true / yes / on).
bool ProfilerRequestedByEnvironment();

}  // namespace sluice
