#include "server/worker/process_executor.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "server/worker/probe.h"

namespace ferry {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string WorkerBinary() {
  const char* runfiles = std::getenv("TEST_SRCDIR");
  return std::string(runfiles ? runfiles : ".") + "/ferry/server/ferry-worker";
}

std::string Script(const std::string& name, const std::string& body) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

ferry::v1::JobSpec TinySpec(uint64_t steps) {
  ferry::v1::JobSpec spec;
  spec.mutable_model()->set_layers(1);
  spec.mutable_model()->set_hidden(16);
  spec.mutable_model()->set_heads(2);
  spec.mutable_model()->set_vocab_size(32);
  spec.mutable_model()->set_seq_len(8);
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_train()->set_steps(steps);
  spec.mutable_train()->set_batch_size(2);
  spec.mutable_train()->set_threads(1);
  return spec;
}

class Recorder : public RunListener {
 public:
  void OnStarted(const std::string& d) override {
    std::lock_guard<std::mutex> lock(mu);
    device = d;
  }
  void OnProgress(const ferry::v1::Progress& p) override {
    std::lock_guard<std::mutex> lock(mu);
    progress.push_back(p);
  }
  void OnLog(ferry::v1::Severity, const std::string& m) override {
    std::lock_guard<std::mutex> lock(mu);
    logs.push_back(m);
  }
  void OnPlacement(const ferry::v1::MemoryPlacement& p) override {
    std::lock_guard<std::mutex> lock(mu);
    placements.push_back(p);
  }
  size_t steps() {
    std::lock_guard<std::mutex> lock(mu);
    return progress.size();
  }
  std::mutex mu;
  std::string device;
  std::vector<ferry::v1::Progress> progress;
  std::vector<std::string> logs;
  std::vector<ferry::v1::MemoryPlacement> placements;
};

ProcessExecutorOptions Options(const std::string& binary) {
  ProcessExecutorOptions o;
  o.worker_binary = binary;
  o.jobs_dir = TempDir() + "/jobs";
  o.device = "cpu";
  o.stop_grace = absl::Seconds(20);
  return o;
}

TEST(ProcessExecutorTest, RunsARealWorkerToSuccess) {
  ProcessExecutor executor(Options(WorkerBinary()));
  StopSignal stop;
  Recorder recorder;
  RunOutcome outcome = executor.Run("j-ok", TinySpec(5), stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_SUCCEEDED) << outcome.error;
  EXPECT_EQ(recorder.device, "sim") << "no GPU: the simulated device";
  ASSERT_EQ(recorder.progress.size(), 5u);
  EXPECT_EQ(recorder.progress.back().step(), 5u);
  EXPECT_GT(recorder.progress.front().loss(), 0);
  EXPECT_FALSE(recorder.progress.back().memory().empty());
  EXPECT_EQ(recorder.progress.front().memory_phase(), "warmup");
  EXPECT_EQ(recorder.progress.back().memory_phase(), "steady");
  ASSERT_FALSE(recorder.placements.empty()) << "the worker reports where model data lives";
  const ferry::v1::MemoryPlacement& placement = recorder.placements.back();
  EXPECT_EQ(placement.device(), "sim");
  EXPECT_EQ(placement.step(), 5u) << "the last report is the last step's";
  EXPECT_GT(placement.chunks_size(), 0);
  EXPECT_EQ(placement.trace_size(), 2 * 3 + 1) << "embed, one block, head: forward, backward, optimizer";
  std::ifstream spec(TempDir() + "/jobs/j-ok/spec.json");
  EXPECT_TRUE(spec.good()) << "the spec is kept in the job's directory";
  EXPECT_FALSE(Exists(TempDir() + "/jobs/j-ok/scratch")) << "the disk tier's directory goes with the run";
}

TEST(ProcessExecutorTest, StopEndsTheWorkerAfterItsCurrentStep) {
  ProcessExecutor executor(Options(WorkerBinary()));
  StopSignal stop;
  Recorder recorder;
  std::thread stopper([&] {
    while (recorder.steps() < 2) absl::SleepFor(absl::Milliseconds(5));
    stop.Request("cancelled by test");
  });
  RunOutcome outcome = executor.Run("j-stop", TinySpec(100000), stop, &recorder);
  stopper.join();
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_CANCELLED) << outcome.error;
  EXPECT_NE(outcome.error.find("cancelled by test"), std::string::npos) << outcome.error;
  EXPECT_LT(recorder.steps(), 100000u);
}

TEST(ProcessExecutorTest, ASpecTheWorkerRejectsFailsWithItsReason) {
  ProcessExecutor executor(Options(WorkerBinary()));
  StopSignal stop;
  Recorder recorder;
  ferry::v1::JobSpec spec = TinySpec(3);
  spec.mutable_data()->set_path("/nonexistent/tokens.bin");
  RunOutcome outcome = executor.Run("j-bad", spec, stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_NE(outcome.error.find("data.path"), std::string::npos) << outcome.error;
}

TEST(ProcessExecutorTest, ADiskDirectoryThatIsAFileFailsTheRunNamingIt) {
  ProcessExecutor executor(Options(WorkerBinary()));
  StopSignal stop;
  Recorder recorder;
  const std::string file = TempDir() + "/not-a-directory";
  std::ofstream(file) << "x";
  ferry::v1::JobSpec spec = TinySpec(3);
  spec.mutable_memory()->set_disk_dir(file);
  RunOutcome outcome = executor.Run("j-disk-file", spec, stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_NE(outcome.error.find("memory.disk_dir"), std::string::npos) << outcome.error;
}

TEST(ProcessExecutorTest, ACrashedWorkerFailsTheJobWithTheCauseAndItsLastWords) {
  ProcessExecutor executor(Options(Script("crash.sh", "echo 'segfault imminent' >&2\nkill -9 $$")));
  StopSignal stop;
  Recorder recorder;
  RunOutcome outcome = executor.Run("j-crash", TinySpec(3), stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_NE(outcome.error.find("killed by signal 9"), std::string::npos) << outcome.error;
  EXPECT_NE(outcome.error.find("segfault imminent"), std::string::npos) << outcome.error;
}

// A worker killed with -9 leaves its disk tier's chunk files: the executor
// removes the job's directory for them once the run is over, under the
// job's directory or under memory.disk_dir, leaving the rest.
TEST(ProcessExecutorTest, TheDiskTiersFilesGoWhenTheRunEnds) {
  const std::string leave_files = Script("leave_chunks.sh", R"(
for a in "$@"; do case "$a" in --job_dir=*) job_dir="${a#--job_dir=}";; --job_id=*) job_id="${a#--job_id=}";; esac; done
dir="$job_dir/scratch"
[ -n "$DISK_DIR" ] && dir="$DISK_DIR/ferry-$job_id"
mkdir -p "$dir/rank0/ferry-chunks-abc" && echo states >"$dir/rank0/ferry-chunks-abc/3.o"
kill -9 $$)");
  ProcessExecutor executor(Options(leave_files));
  StopSignal stop;
  Recorder recorder;
  RunOutcome outcome = executor.Run("j-chunks", TinySpec(3), stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_TRUE(Exists(TempDir() + "/jobs/j-chunks/spec.json"));
  EXPECT_FALSE(Exists(TempDir() + "/jobs/j-chunks/scratch"));

  const std::string disk_dir = TempDir() + "/nvme";
  ASSERT_EQ(mkdir(disk_dir.c_str(), 0755), 0);
  setenv("DISK_DIR", disk_dir.c_str(), 1);
  ferry::v1::JobSpec spec = TinySpec(3);
  spec.mutable_memory()->set_disk_dir(disk_dir);
  outcome = executor.Run("j-nvme", spec, stop, &recorder);
  unsetenv("DISK_DIR");
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_FALSE(Exists(disk_dir + "/ferry-j-nvme"));
  EXPECT_TRUE(Exists(disk_dir));
}

TEST(ProcessExecutorTest, AWorkerThatIgnoresStopIsKilledAfterTheGrace) {
  ProcessExecutorOptions options = Options(Script("stubborn.sh", "trap '' TERM INT\nsleep 60"));
  options.stop_grace = absl::Milliseconds(300);
  ProcessExecutor executor(options);
  StopSignal stop;
  stop.Request("shutting down");
  Recorder recorder;
  const absl::Time start = absl::Now();
  RunOutcome outcome = executor.Run("j-stubborn", TinySpec(3), stop, &recorder);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_CANCELLED);
  EXPECT_NE(outcome.error.find("was killed"), std::string::npos) << outcome.error;
}

TEST(ProcessExecutorTest, MissingWorkerBinaryFailsClearly) {
  ProcessExecutor executor(Options("/nonexistent/ferry-worker"));
  StopSignal stop;
  Recorder recorder;
  RunOutcome outcome = executor.Run("j-missing", TinySpec(3), stop, &recorder);
  EXPECT_EQ(outcome.state, ferry::v1::JOB_STATE_FAILED);
  EXPECT_NE(outcome.error.find("/nonexistent/ferry-worker"), std::string::npos) << outcome.error;
}

TEST(ProbeTest, TheWorkerReportsItsDevices) {
  absl::StatusOr<ferry::internal::DeviceProbe> probe = ProbeWorker(WorkerBinary(), absl::Seconds(60));
  ASSERT_TRUE(probe.ok()) << probe.status();
  ASSERT_GT(probe->devices_size(), 0);
  EXPECT_EQ(probe->devices(probe->devices_size() - 1).kind(), "cpu");
  EXPECT_FALSE(probe->torch_version().empty());
  EXPECT_EQ(ProbeWorker("/nonexistent/w", absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<ferry::internal::DeviceProbe> bad =
      ProbeWorker(Script("noisy.sh", "echo 'no torch here' >&2; exit 4"), absl::Seconds(5));
  EXPECT_NE(bad.status().message().find("no torch here"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace ferry
