#include "engine/parallel/communicator.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <functional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

uint64_t TensorBytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel() * t.element_size()); }

class DoneCollective : public PendingCollective {
 public:
  void Wait() override {}
};

std::string What(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// Gloo (LibTorch 1.13) has no bf16 collectives ("Invalid scalar type"):
// on the CPU a bf16 tensor travels as fp32, exactly, and a sum is rounded to
// bf16 once, after it.
at::Tensor ForTheWire(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t.contiguous();
}

// A c10d process group (or, in LibTorch 2.x, backend) behind our interface:
// ProcessGroupGloo or ProcessGroupNCCL, whose collectives take the same
// arguments in LibTorch 1.13 and 2.x.
template <typename Group>
class C10dCommunicator : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<Group> group, CommunicatorOptions options)
      : group_(std::move(group)), options_(std::move(options)) {}

  const std::string& name() const override { return options_.name; }
  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }

  void AllReduce(at::Tensor& t, ReduceOp op) override {
    at::Tensor dense = ForTheWire(t);
    std::vector<at::Tensor> tensors{dense};
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    o.timeout = options_.timeout;
    Run(Collective::kAllReduce, [&] { return group_->allreduce(tensors, o); });
    if (!dense.is_same(t)) t.copy_(dense);
  }

  std::unique_ptr<PendingCollective> StartAllReduce(at::Tensor t) override {
    if (!t.is_contiguous()) throw std::invalid_argument("StartAllReduce: the tensor must be contiguous");
    auto pending = std::make_unique<Pending>(this, Collective::kAllReduce);
    at::Tensor wire = ForTheWire(t);
    if (!wire.is_same(t)) pending->finish = [t, wire]() mutable { t.copy_(wire); };
    pending->tensors = {std::move(wire)};
    c10d::AllreduceOptions o;
    o.timeout = options_.timeout;
    pending->Start([&] { return group_->allreduce(pending->tensors, o); });
    return pending;
  }

  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor input, at::Tensor output) override {
    const int64_t n = size();
    if (!input.is_contiguous() || !output.is_contiguous() || input.numel() % n != 0 ||
        output.numel() != input.numel() / n || output.scalar_type() != input.scalar_type()) {
      throw std::invalid_argument(absl::StrCat("ReduceScatter: ", input.numel(), " elements into blocks of ",
                                               output.numel(), " over ", n, " ranks"));
    }
    auto pending = std::make_unique<Pending>(this, Collective::kReduceScatter);
    at::Tensor wire = ForTheWire(input);
    if constexpr (std::is_same_v<Group, c10d::ProcessGroupGloo>) {
      // Gloo (LibTorch 1.13) has no reduce-scatter: an all-to-all sends
      // each rank its block of every rank's input (the same bytes a ring
      // reduce-scatter sends), and the blocks are summed here, in rank
      // order, in the wire's type (fp32 for bf16), rounded once.
      at::Tensor blocks = at::empty_like(wire);
      pending->tensors = {wire, blocks};
      pending->finish = [blocks, output, n]() mutable {
        output.copy_(blocks.view({n, -1}).sum(0));
      };
      std::vector<int64_t> even;
      c10d::AllToAllOptions o;
      o.timeout = options_.timeout;
      pending->Start([&] { return group_->alltoall_base(pending->tensors[1], pending->tensors[0], even, even, o); });
    } else {
      at::Tensor out = wire.is_same(input) ? output : at::empty({output.numel()}, wire.options());
      if (!out.is_same(output)) pending->finish = [out, output]() mutable { output.copy_(out); };
      std::vector<at::Tensor> outputs{out};
      std::vector<std::vector<at::Tensor>> inputs{wire.chunk(n)};
      pending->tensors = {wire, out};
      c10d::ReduceScatterOptions o;
      o.timeout = options_.timeout;
      pending->Start([&] { return group_->reduce_scatter(outputs, inputs, o); });
    }
    return pending;
  }

  void AllGatherInto(const at::Tensor& shard, const at::Tensor& output) override {
    StartAllGatherInto(shard, output)->Wait();
  }

  std::unique_ptr<PendingCollective> StartAllGatherInto(at::Tensor shard, at::Tensor output) override {
    const int64_t n = size();
    if (!output.is_contiguous() || output.numel() != shard.numel() * n ||
        output.scalar_type() != shard.scalar_type()) {
      throw std::invalid_argument(absl::StrCat("AllGatherInto: blocks of ", shard.numel(), " into ",
                                               output.numel(), " elements over ", n, " ranks"));
    }
    auto pending = std::make_unique<Pending>(this, Collective::kAllGather);
    // A copy of the shard, which may be a block of `output` itself.
    at::Tensor input = ForTheWire(shard).clone();
    at::Tensor flat = ForTheWire(output);
    if (!flat.is_same(output)) pending->finish = [flat, output]() mutable { output.copy_(flat); };
    pending->tensors = {input, flat};
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs{flat.view({n, -1}).unbind(0)};
    c10d::AllgatherOptions o;
    o.timeout = options_.timeout;
    pending->Start([&] { return group_->allgather(outputs, inputs, o); });
    return pending;
  }

  at::Tensor AllGather(const at::Tensor& t, int64_t dim) override {
    std::vector<at::Tensor> input{ForTheWire(t)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < size(); ++r) output[0].push_back(at::empty_like(input[0]));
    c10d::AllgatherOptions o;
    o.timeout = options_.timeout;
    Run(Collective::kAllGather, [&] { return group_->allgather(output, input, o); });
    return at::cat(output[0], dim).to(t.scalar_type());
  }

  void Broadcast(at::Tensor& t, int root) override {
    at::Tensor dense = ForTheWire(t);
    std::vector<at::Tensor> tensors{dense};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = options_.timeout;
    Run(Collective::kBroadcast, [&] { return group_->broadcast(tensors, o); });
    if (!dense.is_same(t)) t.copy_(dense);
  }

  void Barrier() override {
    c10d::BarrierOptions o;
    o.timeout = options_.timeout;
    Run(Collective::kBarrier, [&] { return group_->barrier(o); });
  }

 private:
  struct Pending : public PendingCollective {
    Pending(C10dCommunicator* owner, Collective collective) : owner(owner), collective(collective) {}
    void Start(const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
      try {
        work = start();
      } catch (const std::exception& e) {
        throw owner->Failure(collective, e);
      }
    }
    void Wait() override {
      try {
        owner->Finish(work);
      } catch (const std::exception& e) {
        throw owner->Failure(collective, e);
      }
      if (finish) finish();
    }
    C10dCommunicator* owner;
    Collective collective;
    std::vector<at::Tensor> tensors;  // kept alive while in flight
    // Once done: results from the wire's tensors into the caller's.
    std::function<void()> finish;
    c10::intrusive_ptr<c10d::Work> work;
  };

  CollectiveException Failure(Collective c, const std::exception& e) const {
    return CollectiveException(absl::StrCat(CollectiveName(c), " in the ", options_.name, " group (rank ", rank(),
                                            " of ", size(), ") failed: ", What(e)));
  }

  void Finish(const c10::intrusive_ptr<c10d::Work>& work) {
    if (!work->wait(options_.timeout)) {
      throw std::runtime_error(absl::StrCat("did not finish in ", options_.timeout.count(), " ms"));
    }
  }

  void Run(Collective c, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
    try {
      Finish(start());
    } catch (const std::exception& e) {
      throw Failure(c, e);
    }
  }

  c10::intrusive_ptr<Group> group_;
  CommunicatorOptions options_;
};

class SoloCommunicator : public Communicator {
 public:
  explicit SoloCommunicator(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduce(at::Tensor&, ReduceOp) override {}
  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor input, at::Tensor output) override {
    output.copy_(input.view_as(output));
    return std::make_unique<DoneCollective>();
  }
  void AllGatherInto(const at::Tensor& shard, const at::Tensor& output) override {
    output.copy_(shard.view_as(output));
  }
  at::Tensor AllGather(const at::Tensor& t, int64_t) override { return t.clone(); }
  void Broadcast(at::Tensor&, int) override {}
  void Barrier() override {}

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> MakeSoloCommunicator(const std::string& name) {
  return std::make_unique<SoloCommunicator>(name);
}

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "collective";
}

c10::intrusive_ptr<c10d::Store> MakeInProcessStore() { return c10::make_intrusive<c10d::HashStore>(); }

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeTcpStore(const std::string& host, uint16_t port, int rank,
                                                            int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = rank == 0;
  o.numWorkers = static_cast<size_t>(world_size);
  o.waitWorkers = true;
  o.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(host, o);
    return store;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, " of ", world_size,
                                               ": cannot rendezvous through the store at ", host, ":", port,
                                               " (", What(e), "); check MASTER_ADDR and MASTER_PORT"));
  }
}

c10::intrusive_ptr<c10d::Store> PrefixedStore(const std::string& prefix, c10::intrusive_ptr<c10d::Store> store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                                     int rank, int size,
                                                                     const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in a group of ", size));
  }
#ifdef USE_C10D_GLOO
  try {
    auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
    o->devices.push_back(options.gloo_hostname.empty()
                             ? c10d::ProcessGroupGloo::createDefaultDevice()
                             : c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname));
    // Connecting waits for every rank of the group.
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o);
    return std::unique_ptr<Communicator>(new C10dCommunicator<c10d::ProcessGroupGloo>(std::move(group), options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("the ", options.name, " group (rank ", rank, " of ", size,
                                               ") could not connect: ", What(e)));
  }
#else
  // A LibTorch installed without Gloo's headers (see tools/gpu/CMakeLists.txt).
  (void)store;
  return absl::UnimplementedError("Gloo is not available in this build (LibTorch's Gloo headers were missing)");
#endif
}

absl::StatusOr<ParallelGroups> JoinParallelGroups(c10::intrusive_ptr<c10d::Store> store, int world_rank,
                                                  int tensor, int data, const CommunicatorOptions& options) {
  if (tensor < 1 || data < 1 || world_rank < 0 || world_rank >= tensor * data) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", world_rank, " is not in a world of ", tensor, " x ", data, " ranks"));
  }
  const int t = world_rank % tensor;
  const int d = world_rank / tensor;
  ParallelGroups groups;
  auto join = [&](const std::string& kind, int group, int rank, int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (size == 1) return MakeSoloCommunicator(kind);
    CommunicatorOptions o = options;
    o.name = kind;
    c10::intrusive_ptr<c10d::Store> prefixed = PrefixedStore(absl::StrCat(kind, "-", group), store);
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        options.backend == CommunicatorOptions::Backend::kNccl ? CreateNcclCommunicator(prefixed, rank, size, o)
                                                               : CreateGlooCommunicator(prefixed, rank, size, o);
    if (!comm.ok()) return comm.status();
    // Every member connected before the group is used.
    try {
      (*comm)->Barrier();
    } catch (const CollectiveException& e) {
      return absl::UnavailableError(e.what());
    }
    return comm;
  };
  absl::StatusOr<std::unique_ptr<Communicator>> tensor_group = join("tensor", d, t, tensor);
  if (!tensor_group.ok()) return tensor_group.status();
  absl::StatusOr<std::unique_ptr<Communicator>> data_group = join("data", t, d, data);
  if (!data_group.ok()) return data_group.status();
  groups.tensor = std::move(*tensor_group);
  groups.data = std::move(*data_group);
  return groups;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                                                     int rank, int size,
                                                                     const CommunicatorOptions& options) {
#ifdef USE_C10D_NCCL
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in a group of ", size));
  }
  try {
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = options.timeout;
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
    return std::unique_ptr<Communicator>(new C10dCommunicator<c10d::ProcessGroupNCCL>(std::move(group), options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("the ", options.name, " group (rank ", rank, " of ", size,
                                               ") could not start NCCL: ", What(e)));
  }
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)options;
  return absl::UnimplementedError("NCCL needs a CUDA build of LibTorch (set FERRY_LIBTORCH to one)");
#endif
}

absl::Status FinishParallelGroups(const ParallelGroups& groups) {
  try {
    if (groups.tensor != nullptr) groups.tensor->Barrier();
    if (groups.data != nullptr) groups.data->Barrier();
  } catch (const CollectiveException& e) {
    return absl::UnavailableError(e.what());
  }
  return absl::OkStatus();
}

void CountingCommunicator::Record(Collective c, uint64_t bytes) {
  const uint64_t n = static_cast<uint64_t>(size());
  uint64_t wire = 0;
  switch (c) {
    case Collective::kAllReduce:
      wire = 2 * (n - 1) * bytes / n;
      break;
    case Collective::kReduceScatter:
      wire = (n - 1) * bytes / n;
      break;
    case Collective::kAllGather:
      wire = (n - 1) * bytes;
      break;
    case Collective::kBroadcast:
      wire = n > 1 ? bytes : 0;
      break;
    case Collective::kBarrier:
      break;
  }
  calls_.push_back({c, bytes, wire});
}

void CountingCommunicator::AllReduce(at::Tensor& t, ReduceOp op) {
  Record(Collective::kAllReduce, TensorBytes(t));
  inner_->AllReduce(t, op);
}

std::unique_ptr<PendingCollective> Communicator::StartAllReduce(at::Tensor t) {
  AllReduce(t);
  return std::make_unique<DoneCollective>();
}

std::unique_ptr<PendingCollective> Communicator::StartAllGatherInto(at::Tensor shard, at::Tensor output) {
  AllGatherInto(shard, output);
  return std::make_unique<DoneCollective>();
}

std::unique_ptr<PendingCollective> CountingCommunicator::StartAllGatherInto(at::Tensor shard, at::Tensor output) {
  Record(Collective::kAllGather, TensorBytes(shard));
  return inner_->StartAllGatherInto(std::move(shard), std::move(output));
}

std::unique_ptr<PendingCollective> CountingCommunicator::StartAllReduce(at::Tensor t) {
  Record(Collective::kAllReduce, TensorBytes(t));
  return inner_->StartAllReduce(std::move(t));
}

std::unique_ptr<PendingCollective> CountingCommunicator::StartReduceScatter(at::Tensor input, at::Tensor output) {
  Record(Collective::kReduceScatter, TensorBytes(input));
  return inner_->StartReduceScatter(std::move(input), std::move(output));
}

void CountingCommunicator::AllGatherInto(const at::Tensor& shard, const at::Tensor& output) {
  Record(Collective::kAllGather, TensorBytes(shard));
  inner_->AllGatherInto(shard, output);
}

at::Tensor CountingCommunicator::AllGather(const at::Tensor& t, int64_t dim) {
  Record(Collective::kAllGather, TensorBytes(t));
  return inner_->AllGather(t, dim);
}

void CountingCommunicator::Broadcast(at::Tensor& t, int root) {
  Record(Collective::kBroadcast, TensorBytes(t));
  inner_->Broadcast(t, root);
}

void CountingCommunicator::Barrier() {
  Record(Collective::kBarrier, 0);
  inner_->Barrier();
}

int CountingCommunicator::Count(Collective c) const {
  int n = 0;
  for (const Call& call : calls_) n += call.collective == c ? 1 : 0;
  return n;
}

uint64_t CountingCommunicator::Bytes(Collective c) const {
  uint64_t n = 0;
  for (const Call& call : calls_) n += call.collective == c ? call.bytes : 0;
  return n;
}

uint64_t CountingCommunicator::WireBytes() const {
  uint64_t n = 0;
  for (const Call& call : calls_) n += call.wire_bytes;
  return n;
}

}  // namespace ferry
