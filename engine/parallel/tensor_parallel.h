#pragma once

// Megatron-style 1-D tensor parallelism over a Communicator: the layers and
// the autograd-aware collectives between them. With T ranks in the tensor
// group, each rank holds 1/T of every sharded weight; an MLP or attention
// block costs one all-reduce of its output in the forward (after the
// row-parallel layer) and one of its input's gradient in the backward
// (before the column-parallel layer).
//
// A tensor group of one runs the same code with no communication, so a
// model built from these layers is the unsharded model at T = 1.
//
// Weights start at zero: the model that owns a layer draws its values (so
// that every rank can draw the whole model's and keep its part), or
// LoadShard takes them from an unsharded layer.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>

#include "engine/parallel/communicator.h"

namespace ferry {

// The four region boundaries of Megatron's paper. `comm` must outlive the
// autograd graph that uses it.
//
// Identity forward; all-reduce of the gradient backward ("f").
at::Tensor CopyToTensorRegion(const at::Tensor& x, Communicator* comm);
// All-reduce forward; identity backward ("g").
at::Tensor ReduceFromTensorRegion(const at::Tensor& x, Communicator* comm);
// All-gather along the last dimension forward; this rank's slice backward.
at::Tensor GatherFromTensorRegion(const at::Tensor& x, Communicator* comm);
// This rank's slice of the last dimension forward; all-gather backward.
at::Tensor ScatterToTensorRegion(const at::Tensor& x, Communicator* comm);

// How a layer computes x W^T + b (b may be undefined): at::linear unless a
// model computes otherwise (e.g. in fp32 from reduced-precision weights).
using LinearFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b)>;

// [begin, end) of this rank's share of `n` (n must divide evenly).
struct Shard {
  int64_t begin;
  int64_t end;
  int64_t size() const { return end - begin; }
};
Shard ShardOf(int64_t n, const Communicator& comm);

// y = x W^T + b with W's output rows split across ranks: the output is
// split along its last dimension (or gathered, with `gather_output`).
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // Without `bias` the layer has none (`bias` stays undefined).
  ColumnParallelLinearImpl(int64_t in, int64_t out, Communicator* comm, bool gather_output = false,
                           LinearFn linear = nullptr, bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  // Takes this rank's rows of an unsharded layer's weight [out, in] and bias.
  void LoadShard(const at::Tensor& full_weight, const at::Tensor& full_bias);

  at::Tensor weight;  // [out / T, in]
  at::Tensor bias;    // [out / T]

 private:
  Communicator* comm_;
  bool gather_output_;
  LinearFn linear_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's input columns split across ranks: takes the input
// split along its last dimension (as a column-parallel layer leaves it) and
// all-reduces the partial products; the bias is added once, after (with one
// rank, it is the plain layer).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, Communicator* comm, LinearFn linear = nullptr, bool bias = true);
  at::Tensor forward(const at::Tensor& x_parallel);
  void LoadShard(const at::Tensor& full_weight, const at::Tensor& full_bias);

  at::Tensor weight;  // [out, in / T]
  at::Tensor bias;    // [out], whole on every rank

 private:
  Communicator* comm_;
  LinearFn linear_;
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose vocabulary rows are split across ranks: each rank looks
// up the ids it holds, zeroes the rest, and the partial results are
// all-reduced.
//
// In a group of one the rows may instead be kept in pieces (`piece_rows`,
// the rows of each, in order; see VocabPieces in model_config.h): parameters
// "weight_0", "weight_1", ... instead of "weight", each looked up on its own.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, Communicator* comm,
                             const std::vector<int64_t>& piece_rows = {});
  at::Tensor forward(const at::Tensor& ids);
  void LoadShard(const at::Tensor& full_weight);
  const Shard& rows() const { return rows_; }

  // The pieces: one (`weight`) unless the rows are kept in pieces.
  int piece_count() const { return static_cast<int>(pieces.size()); }
  // The rows piece `k` holds, of this rank's.
  Shard piece_rows(int k) const { return piece_rows_.at(static_cast<size_t>(k)); }
  // The ids' rows of piece `k` ([..., dim]), zero for the ids it does not hold.
  at::Tensor LookupPiece(int k, const at::Tensor& ids);

  at::Tensor weight;               // [vocab / T, dim]; undefined with several pieces
  std::vector<at::Tensor> pieces;  // weight, or its pieces

 private:
  Communicator* comm_;
  Shard rows_;
  std::vector<Shard> piece_rows_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Mean cross-entropy of logits split along the vocabulary (each rank holds
// [.., vocab / T], its `rows` of the vocabulary) against whole targets,
// without gathering the logits: three all-reduces of one value per token
// (max, sum of exponentials, target logit). Computed in fp32.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& local_logits, const at::Tensor& targets, Communicator* comm);

}  // namespace ferry
