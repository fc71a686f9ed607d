// ferry-worker: one rank of one training job. Normally started by ferryd.
//
//   ferry-worker --spec=JOB.yaml [--device=auto]        train, print progress
//   ferry-worker --probe                                print devices as JSON

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "server/worker/worker.h"

ABSL_FLAG(std::string, spec, "", "Job file (YAML or JSON) to train.");
ABSL_FLAG(int, report_fd, -1,
          "Write progress frames to this descriptor and read commands from stdin "
          "(how ferryd runs workers). -1 prints progress on stdout.");
ABSL_FLAG(std::string, device, "auto", "auto, cpu, cuda or cuda:N.");
ABSL_FLAG(bool, probe, false, "Print the devices this build can use as JSON and exit.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ferry-worker --spec=JOB.yaml [--device=auto] | ferry-worker --probe");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_probe)) return ferry::RunProbe();
  if (absl::GetFlag(FLAGS_spec).empty() || rest.size() > 1) {
    std::fprintf(stderr, "usage: ferry-worker --spec=JOB.yaml [--device=auto]\n");
    return ferry::kWorkerBadUsage;
  }
  ferry::WorkerOptions options;
  options.spec_path = absl::GetFlag(FLAGS_spec);
  options.report_fd = absl::GetFlag(FLAGS_report_fd);
  options.device = absl::GetFlag(FLAGS_device);
  return ferry::RunWorker(options);
}
