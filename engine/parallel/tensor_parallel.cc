#include "engine/parallel/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t Handle(Communicator* comm) { return reinterpret_cast<int64_t>(comm); }
Communicator* FromHandle(AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}

at::Tensor Slice(const at::Tensor& x, const Communicator& comm) {
  const Shard s = ShardOf(x.size(-1), comm);
  return x.narrow(-1, s.begin, s.size()).contiguous();
}

struct CopyToRegion : public torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0].clone();
    FromHandle(ctx)->AllReduce(g);
    return {g, at::Tensor()};
  }
};

struct ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t comm) {
    at::Tensor y = x.clone();
    reinterpret_cast<Communicator*>(comm)->AllReduce(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return reinterpret_cast<Communicator*>(comm)->AllGather(x, x.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Slice(grads[0], *FromHandle(ctx)), at::Tensor()};
  }
};

struct ScatterToRegion : public torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return Slice(x, *reinterpret_cast<Communicator*>(comm));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {FromHandle(ctx)->AllGather(grads[0], grads[0].dim() - 1), at::Tensor()};
  }
};

struct ParallelCrossEntropy : public torch::autograd::Function<ParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local_logits, const at::Tensor& targets,
                            int64_t handle) {
    Communicator* comm = reinterpret_cast<Communicator*>(handle);
    const int64_t local_vocab = local_logits.size(-1);
    const Shard rows{comm->rank() * local_vocab, (comm->rank() + 1) * local_vocab};
    const at::Tensor x = local_logits.reshape({-1, local_vocab}).to(at::kFloat);
    const at::Tensor t = targets.reshape({-1});
    const int64_t tokens = x.size(0);

    at::Tensor max = std::get<0>(x.max(-1));
    comm->AllReduce(max, ReduceOp::kMax);
    at::Tensor exp = (x - max.unsqueeze(1)).exp();
    at::Tensor sum = exp.sum(-1);
    comm->AllReduce(sum);
    const at::Tensor mine = t.ge(rows.begin).logical_and(t.lt(rows.end));
    const at::Tensor index = (t - rows.begin).clamp(0, local_vocab - 1).unsqueeze(1);
    at::Tensor target_logit = x.gather(1, index).squeeze(1).mul(mine);
    comm->AllReduce(target_logit);

    const at::Tensor losses = sum.log() + max - target_logit;
    ctx->save_for_backward({exp.div_(sum.unsqueeze(1)), mine, index});
    ctx->saved_data["dtype"] = static_cast<int64_t>(local_logits.scalar_type());
    ctx->saved_data["tokens"] = tokens;
    ctx->saved_data["shape"] = local_logits.sizes().vec();
    return losses.mean();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor softmax = saved[0];
    const at::Tensor& mine = saved[1];
    const at::Tensor& index = saved[2];
    // d loss_i / d logit_ij = softmax_ij - [j is the target], over the mean.
    softmax.scatter_add_(1, index, mine.to(at::kFloat).neg().unsqueeze(1));
    const double tokens = static_cast<double>(ctx->saved_data["tokens"].toInt());
    at::Tensor d = softmax.mul_(grads[0] / tokens);
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {d.to(dtype).view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

LinearFn OrDefault(LinearFn linear) {
  if (linear) return linear;
  return [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) { return at::linear(x, w, b); };
}

}  // namespace

at::Tensor CopyToTensorRegion(const at::Tensor& x, Communicator* comm) {
  return comm->size() == 1 ? x : CopyToRegion::apply(x, Handle(comm));
}
at::Tensor ReduceFromTensorRegion(const at::Tensor& x, Communicator* comm) {
  return comm->size() == 1 ? x : ReduceFromRegion::apply(x, Handle(comm));
}
at::Tensor GatherFromTensorRegion(const at::Tensor& x, Communicator* comm) {
  return comm->size() == 1 ? x : GatherFromRegion::apply(x, Handle(comm));
}
at::Tensor ScatterToTensorRegion(const at::Tensor& x, Communicator* comm) {
  return comm->size() == 1 ? x : ScatterToRegion::apply(x, Handle(comm));
}

Shard ShardOf(int64_t n, const Communicator& comm) {
  if (n % comm.size() != 0) {
    throw std::invalid_argument(
        absl::StrCat(n, " does not split evenly across the ", comm.size(), " ranks of the ", comm.name(), " group"));
  }
  const int64_t each = n / comm.size();
  return {comm.rank() * each, (comm.rank() + 1) * each};
}


ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, Communicator* comm, bool gather_output,
                                                   LinearFn linear, bool biased)
    : comm_(comm), gather_output_(gather_output), linear_(OrDefault(std::move(linear))) {
  const Shard rows = ShardOf(out, *comm);
  weight = register_parameter("weight", at::zeros({rows.size(), in}));
  if (biased) bias = register_parameter("bias", at::zeros({rows.size()}));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = linear_(CopyToTensorRegion(x, comm_), weight, bias);
  return gather_output_ ? GatherFromTensorRegion(y, comm_) : y;
}

void ColumnParallelLinearImpl::LoadShard(const at::Tensor& full_weight, const at::Tensor& full_bias) {
  const Shard rows = ShardOf(full_weight.size(0), *comm_);
  at::NoGradGuard no_grad;
  weight.copy_(full_weight.narrow(0, rows.begin, rows.size()));
  if (bias.defined()) bias.copy_(full_bias.narrow(0, rows.begin, rows.size()));
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, Communicator* comm, LinearFn linear,
                                             bool biased)
    : comm_(comm), linear_(OrDefault(std::move(linear))) {
  const Shard columns = ShardOf(in, *comm);
  weight = register_parameter("weight", at::zeros({out, columns.size()}));
  if (biased) bias = register_parameter("bias", at::zeros({out}));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x_parallel) {
  if (comm_->size() == 1) return linear_(x_parallel, weight, bias);
  at::Tensor y = ReduceFromTensorRegion(linear_(x_parallel, weight, at::Tensor()), comm_);
  return bias.defined() ? y + bias : y;
}

void RowParallelLinearImpl::LoadShard(const at::Tensor& full_weight, const at::Tensor& full_bias) {
  const Shard columns = ShardOf(full_weight.size(1), *comm_);
  at::NoGradGuard no_grad;
  weight.copy_(full_weight.narrow(1, columns.begin, columns.size()));
  if (bias.defined()) bias.copy_(full_bias);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, Communicator* comm,
                                                       const std::vector<int64_t>& piece_rows)
    : comm_(comm), rows_(ShardOf(vocab, *comm)) {
  if (piece_rows.size() <= 1) {
    weight = register_parameter("weight", at::zeros({rows_.size(), dim}));
    pieces.push_back(weight);
    piece_rows_.push_back({0, rows_.size()});
    return;
  }
  TORCH_CHECK(comm->size() == 1, "vocabulary pieces need a tensor group of one");
  int64_t begin = 0;
  for (size_t k = 0; k < piece_rows.size(); ++k) {
    pieces.push_back(register_parameter(absl::StrCat("weight_", k), at::zeros({piece_rows[k], dim})));
    piece_rows_.push_back({begin, begin + piece_rows[k]});
    begin += piece_rows[k];
  }
  TORCH_CHECK(begin == vocab, "vocabulary pieces of ", begin, " rows for a vocabulary of ", vocab);
}

at::Tensor VocabParallelEmbeddingImpl::LookupPiece(int k, const at::Tensor& ids) {
  const Shard rows = piece_rows(k);
  const at::Tensor mine = ids.ge(rows.begin).logical_and(ids.lt(rows.end));
  const at::Tensor local = (ids - rows.begin).masked_fill(mine.logical_not(), 0);
  return at::embedding(pieces.at(static_cast<size_t>(k)), local).mul(mine.unsqueeze(-1));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (pieces.size() > 1) {
    at::Tensor x = LookupPiece(0, ids);
    for (int k = 1; k < piece_count(); ++k) x = x + LookupPiece(k, ids);
    return x;
  }
  if (comm_->size() == 1) return at::embedding(weight, ids);
  const at::Tensor mine = ids.ge(rows_.begin).logical_and(ids.lt(rows_.end));
  const at::Tensor local = (ids - rows_.begin).masked_fill(mine.logical_not(), 0);
  at::Tensor partial = at::embedding(weight, local).mul(mine.unsqueeze(-1));
  return ReduceFromTensorRegion(partial, comm_);
}

void VocabParallelEmbeddingImpl::LoadShard(const at::Tensor& full_weight) {
  at::NoGradGuard no_grad;
  for (int k = 0; k < piece_count(); ++k) {
    const Shard rows = piece_rows(k);
    pieces[static_cast<size_t>(k)].copy_(full_weight.narrow(0, rows_.begin + rows.begin, rows.size()));
  }
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& local_logits, const at::Tensor& targets, Communicator* comm) {
  return ParallelCrossEntropy::apply(local_logits, targets, Handle(comm));
}

}  // namespace ferry
