#pragma once

// Checkpoints written in the background: the caller hands over a snapshot
// (bytes already copied out of the training state) and goes on while a
// thread writes it. At most one write is in flight; handing over the next
// one first waits for the previous to finish, so writes happen in order and
// at most one snapshot besides the training state is held in memory.
//
//   AsyncCheckpointWriter writer(
//       [&](const CheckpointContents& c) { return WriteCheckpoint(root, c, keep); },
//       [&](const CheckpointWriteResult& r) { /* log r */ });
//   writer.Submit(std::move(snapshot), snapshot_seconds);  // returns once the write has started
//   ...
//   writer.Wait();  // before exiting: the last write is complete
//
// No LibTorch here.

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/checkpoint/checkpoint_store.h"

namespace ferry {

// One finished write, as reported to the writer's `on_done`.
struct CheckpointWriteResult {
  int64_t step = 0;
  absl::Status status;
  // How long the caller was held up: the snapshot (as the caller measured
  // it) plus waiting for the previous write in Submit.
  double blocked_seconds = 0;
  // From the start of the snapshot until the write finished: blocked plus
  // writing.
  double total_seconds = 0;
  // The checkpoint's files, in all.
  uint64_t bytes = 0;
};

class AsyncCheckpointWriter {
 public:
  using WriteFn = std::function<absl::Status(const CheckpointContents&)>;
  using DoneFn = std::function<void(const CheckpointWriteResult&)>;

  // `write` runs on the writer's thread, one call at a time; so does
  // `on_done` (may be null), right after each write, before the next starts.
  explicit AsyncCheckpointWriter(WriteFn write, DoneFn on_done = nullptr);
  // Waits for the write in flight.
  ~AsyncCheckpointWriter();

  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Waits for the write in flight, then starts writing `contents` in the
  // background and returns; with produced files (which may read live
  // training state) it returns once the write is done, its error left for
  // the next Submit or Wait like any other. `snapshot_seconds`: what taking the snapshot
  // cost the caller, for the result's blocked and total times. Returns OK,
  // or the first error of an earlier write that neither Submit nor Wait has
  // returned yet (this write is started all the same).
  absl::Status Submit(CheckpointContents contents, double snapshot_seconds = 0);

  // Waits for the write in flight, if any. Returns OK, or the first error
  // of a write that neither Submit nor Wait has returned yet.
  absl::Status Wait();

  // Whether a write is still running (it may finish at any moment).
  bool Busy() const;

  // Writes started and writes that failed so far.
  int64_t submitted() const;
  int64_t failed() const;

 private:
  // Joins the thread of the previous write; returns the unreturned error.
  absl::Status JoinPrevious();

  const WriteFn write_;
  const DoneFn on_done_;
  // Submit/Wait/destructor only (one caller thread at a time).
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status unreturned_ ABSL_GUARDED_BY(mu_);
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry
