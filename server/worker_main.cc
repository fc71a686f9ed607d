// ferry-worker: one rank of one training job. Normally started by ferryd.
//
//   ferry-worker --spec=JOB.yaml [--device=auto]        train, print progress
//   RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=p ferry-worker --spec=JOB.yaml
//                                                       one rank of a parallel job
//   ferry-worker --probe                                print devices as JSON
//   ferry-worker --export=OUT.safetensors --spec=JOB.yaml
//                                                       write the job's latest
//                                                       checkpointed weights
//                                                       (GPT-2 layout)
//   ferry-worker --generate=REQUEST.json [--spec=JOB.yaml]
//                                                       text from the job's
//                                                       newest checkpoint or
//                                                       the request's weights

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "server/worker/export_weights.h"
#include "server/worker/generate_text.h"
#include "server/worker/worker.h"

ABSL_FLAG(std::string, spec, "", "Job file (YAML or JSON) to train.");
ABSL_FLAG(std::string, export, "",
          "Write the job's latest weights (its newest checkpoint under checkpoint.dir) to this "
          "safetensors file, named and laid out as Hugging Face's GPT-2, and exit.");
ABSL_FLAG(std::string, generate, "",
          "Generate text as this JSON file (a ferry.v1.GenerateRequest) asks, from the --spec job's newest "
          "checkpoint or the request's weights_path, and exit. With --report_fd the responses go there as frames.");
ABSL_FLAG(int, report_fd, -1,
          "Write progress frames to this descriptor and read commands from stdin "
          "(how ferryd runs workers). -1 prints progress on stdout.");
ABSL_FLAG(std::string, device, "auto", "auto, cpu, cuda or cuda:N.");
ABSL_FLAG(bool, probe, false, "Print the devices this build can use as JSON and exit.");
ABSL_FLAG(int, parent_pid, 0,
          "Exit at once (SIGKILL) when this process, the daemon that started the worker, dies: a "
          "daemon that crashed and started again must not find its old workers still writing.");
ABSL_FLAG(std::string, allowed_roots, "",
          "Comma-separated directories the job's paths (data.path, checkpoint.dir) must stay in; they "
          "are opened beneath them without following links (ferryd passes its own). Empty: anywhere.");
ABSL_FLAG(std::string, job_id, "",
          "The job's id (ferryd passes it): the disk tier's files go in memory.disk_dir/ferry-ID/. Empty: "
          "named after the training's fingerprint.");
ABSL_FLAG(std::string, job_dir, "",
          "The job's directory (ferryd passes it): the disk tier's files go in its scratch/ when "
          "memory.disk_dir is unset. Empty: no disk tier without memory.disk_dir.");
ABSL_FLAG(int, collective_timeout_s, 300,
          "Under a launcher: seconds to wait for the other ranks and for any collective.");

namespace {

// A launcher's environment variable as an int; `fallback` when unset.
bool EnvInt(const char* name, int fallback, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    *out = fallback;
    return true;
  }
  if (!absl::SimpleAtoi(v, out)) {
    std::fprintf(stderr, "ferry-worker: %s=%s is not a whole number\n", name, v);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ferry-worker --spec=JOB.yaml [--device=auto] | ferry-worker --probe | "
      "ferry-worker --export=OUT.safetensors --spec=JOB.yaml | "
      "ferry-worker --generate=REQUEST.json [--spec=JOB.yaml]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_probe)) return ferry::RunProbe();
  if (const std::string out = absl::GetFlag(FLAGS_export); !out.empty()) {
    if (absl::GetFlag(FLAGS_spec).empty() || rest.size() > 1) {
      std::fprintf(stderr, "usage: ferry-worker --export=OUT.safetensors --spec=JOB.yaml\n");
      return ferry::kWorkerBadUsage;
    }
    return ferry::RunExportWeights(absl::GetFlag(FLAGS_spec), out, absl::GetFlag(FLAGS_allowed_roots));
  }
  if (const std::string request = absl::GetFlag(FLAGS_generate); !request.empty()) {
    if (rest.size() > 1) {
      std::fprintf(stderr, "usage: ferry-worker --generate=REQUEST.json [--spec=JOB.yaml]\n");
      return ferry::kWorkerBadUsage;
    }
    ferry::GenerateTextOptions options;
    options.request_path = request;
    options.spec_path = absl::GetFlag(FLAGS_spec);
    options.device = absl::GetFlag(FLAGS_device);
    options.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
    options.report_fd = absl::GetFlag(FLAGS_report_fd);
    return ferry::RunGenerateText(options);
  }
  if (absl::GetFlag(FLAGS_spec).empty() || rest.size() > 1) {
    std::fprintf(stderr, "usage: ferry-worker --spec=JOB.yaml [--device=auto]\n");
    return ferry::kWorkerBadUsage;
  }
  if (const int parent = absl::GetFlag(FLAGS_parent_pid); parent > 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) return ferry::kWorkerFailed;  // it died before prctl took effect
  }
  ferry::WorkerOptions options;
  options.spec_path = absl::GetFlag(FLAGS_spec);
  options.report_fd = absl::GetFlag(FLAGS_report_fd);
  options.device = absl::GetFlag(FLAGS_device);
  options.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.job_dir = absl::GetFlag(FLAGS_job_dir);
  // Under a launcher (torchrun, a Kubernetes training operator): one process
  // per rank, told its place by the environment.
  if (!EnvInt("RANK", 0, &options.rank) || !EnvInt("WORLD_SIZE", 1, &options.world_size) ||
      !EnvInt("LOCAL_RANK", 0, &options.local_rank) || !EnvInt("MASTER_PORT", 29500, &options.master_port)) {
    return ferry::kWorkerBadUsage;
  }
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') options.master_addr = addr;
  options.collective_timeout_seconds = absl::GetFlag(FLAGS_collective_timeout_s);
  return ferry::RunWorker(options);
}
