#pragma once

// ferry-worker: runs one rank of one job. Under the daemon it reads commands
// from stdin and writes WorkerReport frames to --report_fd; on its own (e.g.
// under a launcher) it prints progress to stdout.

#include <string>

namespace ferry {

struct WorkerOptions {
  // The job file (YAML or JSON, the JSON mapping of ferry.v1.JobSpec).
  std::string spec_path;
  // Where WorkerReport frames go; -1 prints human-readable progress on stdout
  // and reads no commands.
  int report_fd = -1;
  // Where commands come from when report_fd >= 0. End of file there means the
  // daemon has gone: the worker stops.
  int command_fd = 0;
  // "auto", "cpu", "cuda", "cuda:N".
  std::string device = "auto";
  // The job's id and its directory under the daemon's state directory
  // (ferryd passes both). The disk tier's files go in
  // memory.disk_dir/ferry-<job_id>/rank<r>/, or job_dir/scratch/rank<r>/
  // when memory.disk_dir is unset. On its own (no job_dir) a worker uses the
  // disk tier only where memory.disk_dir is set, and without a job_id names
  // the directory after the training's fingerprint (TrainingFingerprint):
  // the same training run again finds and clears what a killed run left.
  std::string job_id;
  std::string job_dir;
  // Comma-separated directories every path of the spec must stay in (ferryd
  // passes its --allowed_roots): the data file and checkpoint directories
  // are opened beneath them without following links. Empty: no confinement.
  std::string allowed_roots;

  // One rank of a job of parallel.tensor x parallel.data ranks, started
  // once per rank by a launcher (torchrun's environment: RANK, WORLD_SIZE,
  // LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Rank 0 hosts the rendezvous
  // store at master_addr:master_port and prints the progress.
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How long to wait for the other ranks to arrive, and for any collective:
  // a rank that dies or hangs fails the others after this long.
  int collective_timeout_seconds = 300;
};

// Exit codes of ferry-worker.
inline constexpr int kWorkerSucceeded = 0;
inline constexpr int kWorkerFailed = 1;
inline constexpr int kWorkerBadUsage = 2;
inline constexpr int kWorkerCancelled = 3;

// Trains the job; returns the process exit code.
int RunWorker(const WorkerOptions& options);

// Prints the devices this build can use, as JSON (ferry.internal.DeviceProbe),
// on stdout; returns the exit code.
int RunProbe();

}  // namespace ferry
