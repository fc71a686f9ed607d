#pragma once

// A group of ranks that run collectives together, and the one place that
// knows torch.distributed's C++ engine (c10d), whose API differs between
// LibTorch 1.13 and 2.x: Gloo on the CPU and the simulated device, NCCL on
// GPUs, with ranks meeting through a c10d store (TCPStore across processes,
// the same rendezvous torchrun uses; HashStore for ranks as threads in one
// process, as tests run them).
//
// Collectives run inside autograd functions, where no Status can be
// returned: a failed or timed-out collective throws CollectiveException,
// whose message names the group, the rank and the collective.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

class CollectiveException : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
enum class ReduceOp { kSum, kMax };
const char* CollectiveName(Collective c);

// A collective in flight.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Returns once it is done; throws CollectiveException if it failed.
  virtual void Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // "tensor", "data", "world": what the group is for, for messages.
  virtual const std::string& name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Reduces `t` over the group (sum by default), in place.
  virtual void AllReduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  // Starts summing `t` (contiguous) over the group in place and returns at
  // once where the backend runs collectives in the background (Gloo, NCCL);
  // `t` must be left alone until Wait() returns.
  virtual std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor t);
  // The sum over the group of `input` (contiguous, size() equal blocks):
  // this rank's block of it (block rank()) into `output`, input.numel() /
  // size() elements, which must not overlap `input`. Each rank sends
  // (size() - 1) / size() of `input`: half an all-reduce. Returns at once
  // where the backend runs collectives in the background; `input` and
  // `output` must be left alone until Wait() returns.
  virtual std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor input, at::Tensor output) = 0;
  void ReduceScatter(const at::Tensor& input, const at::Tensor& output) { StartReduceScatter(input, output)->Wait(); }
  // Every rank's `shard` into `output` (contiguous, size() blocks of
  // shard.numel() elements) in rank order; `shard` may be output's own
  // block. Each rank receives (size() - 1) / size() of `output`.
  virtual void AllGatherInto(const at::Tensor& shard, const at::Tensor& output) = 0;
  // The same, started: returns at once where the backend runs collectives
  // in the background (Gloo, NCCL); `shard` and `output` must be left alone
  // until Wait() returns.
  virtual std::unique_ptr<PendingCollective> StartAllGatherInto(at::Tensor shard, at::Tensor output);
  // Every rank's `t`, concatenated along `dim` in rank order.
  virtual at::Tensor AllGather(const at::Tensor& t, int64_t dim) = 0;
  // `t` from `root` to every rank, in place.
  virtual void Broadcast(at::Tensor& t, int root) = 0;
  virtual void Barrier() = 0;
};

// A store shared by ranks that are threads of one process.
c10::intrusive_ptr<c10d::Store> MakeInProcessStore();

// The store rank 0 hosts at host:port and the others connect to; waits up
// to `timeout` for all `world_size` ranks.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeTcpStore(const std::string& host, uint16_t port,
                                                            int rank, int world_size,
                                                            std::chrono::milliseconds timeout);

// Keys under `prefix` of `store`: one namespace per job and per group.
c10::intrusive_ptr<c10d::Store> PrefixedStore(const std::string& prefix, c10::intrusive_ptr<c10d::Store> store);

struct CommunicatorOptions {
  // Gloo for CPU tensors (CPU and the simulated device); NCCL for CUDA
  // tensors, in a CUDA build of LibTorch.
  enum class Backend { kGloo, kNccl };
  Backend backend = Backend::kGloo;
  // For messages: what the group is for.
  std::string name = "world";
  // A collective that has not finished by then fails the job.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gloo: the address to bind; empty lets Gloo resolve this host's name
  // (falling back to loopback). Across machines, the address other ranks
  // reach this one at.
  std::string gloo_hostname = "127.0.0.1";
};

// Joins the group of `size` ranks meeting in `store` as `rank`. Gloo for CPU
// tensors (the only backend of a CPU LibTorch).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                                     int rank, int size,
                                                                     const CommunicatorOptions& options);

// A group of one: every collective is the identity, nothing is sent.
std::unique_ptr<Communicator> MakeSoloCommunicator(const std::string& name);

// A rank's groups in a world of tensor x data ranks: world rank
// w = d * tensor + t is tensor rank t of data group member d. Its tensor
// group is the `tensor` ranks with its d, its data group the `data` ranks
// with its t; a group of one is solo (no backend). `store` is shared by the
// world; each group meets under its own prefix of it. Returns once every
// member of both groups has connected. Before tearing the groups down after
// use, call FinishParallelGroups on every rank.
struct ParallelGroups {
  std::unique_ptr<Communicator> tensor;
  std::unique_ptr<Communicator> data;
};
absl::StatusOr<ParallelGroups> JoinParallelGroups(c10::intrusive_ptr<c10d::Store> store, int world_rank,
                                                  int tensor, int data, const CommunicatorOptions& options);
// Waits until every rank is done with the groups (a rank that closes its
// connections while a peer's last messages are in flight fails the peer).
absl::Status FinishParallelGroups(const ParallelGroups& groups);

// Joins with NCCL, for CUDA tensors: needs a CUDA build of LibTorch
// (UNIMPLEMENTED otherwise). Compiled against such a build; not run here.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                                     int rank, int size,
                                                                     const CommunicatorOptions& options);

// Counts the collectives another communicator runs, and their bytes: what
// the tests check a layer's communication against.
class CountingCommunicator : public Communicator {
 public:
  struct Call {
    Collective collective;
    uint64_t bytes;  // of this rank's input
    // What this rank sends under the bandwidth-optimal (ring) algorithm:
    // an all-reduce of N bytes 2 (n - 1) / n N, a reduce-scatter of N
    // (n - 1) / n N, an all-gather of a shard of N / n bytes (n - 1) / n N,
    // a broadcast of N bytes N from the root.
    uint64_t wire_bytes;
  };

  // `inner` must outlive this.
  explicit CountingCommunicator(Communicator* inner) : inner_(inner) {}

  const std::string& name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void AllReduce(at::Tensor& t, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor t) override;
  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor input, at::Tensor output) override;
  void AllGatherInto(const at::Tensor& shard, const at::Tensor& output) override;
  std::unique_ptr<PendingCollective> StartAllGatherInto(at::Tensor shard, at::Tensor output) override;
  at::Tensor AllGather(const at::Tensor& t, int64_t dim) override;
  void Broadcast(at::Tensor& t, int root) override;
  void Barrier() override;

  const std::vector<Call>& calls() const { return calls_; }
  int Count(Collective c) const;
  uint64_t Bytes(Collective c) const;
  // Summed over every collective.
  uint64_t WireBytes() const;
  void Reset() { calls_.clear(); }

 private:
  Communicator* inner_;
  void Record(Collective c, uint64_t bytes);

  std::vector<Call> calls_;
};

}  // namespace ferry
