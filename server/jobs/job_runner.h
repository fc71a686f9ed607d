#pragma once

#include <atomic>
#include <thread>

#include "server/jobs/job_executor.h"
#include "server/jobs/job_registry.h"

namespace ferry {

// Takes pending jobs from the registry one at a time, in submission order,
// and runs each on the executor (one job at a time on the daemon's devices).
class JobRunner {
 public:
  // Both must outlive the runner.
  JobRunner(JobRegistry* registry, JobExecutor* executor);
  ~JobRunner();

  void Start();
  // Returns once the running job (if any) has ended; call after the
  // registry's BeginDrain() so that it stops soon.
  void Join();

 private:
  void Loop();

  JobRegistry* registry_;
  JobExecutor* executor_;
  std::thread thread_;
};

}  // namespace ferry
