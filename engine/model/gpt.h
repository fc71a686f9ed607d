#pragma once

// A GPT-2 architecture model built from our own modules, so that the memory
// manager, recompute and tensor parallelism can work block by block.
//
// Parameter names follow the GPT-2 checkpoints where they correspond
// (wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2,
// h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f). The output layer is tied to wte.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/gradient_claims.h"
#include "engine/model/dropout.h"
#include "engine/model/gpt_config.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/tensor_parallel.h"

namespace ferry {

// How the model computes. With fp32 weights everything is plain fp32. With
// reduced-precision weights (fp16, bf16) activations are kept in that type;
// layer norms, softmax and GELU always compute in fp32; and with `upcast` (for
// devices without fast kernels for the type: a CPU in fp16, or in bf16
// without bf16 arithmetic) matrix products compute in fp32 too, their
// results stored reduced. Without it they compute in the reduced type (fp32
// accumulation, one rounding of each result).
struct ComputeMode {
  c10::ScalarType dtype = c10::kFloat;
  bool upcast = false;
  // Data parallel: the batch this rank computes is rows
  // [batch_offset, batch_offset + its size) of a global batch of
  // `batch_whole` (0: the batch is whole), so that dropout drops what it
  // would in the global batch.
  int64_t batch_whole = 0;
  int64_t batch_offset = 0;
  // Set: the products that make the parameters' gradients ask it whether
  // to write or add them (the memory manager's; it outlives the mode's use).
  GradientClaims* claims = nullptr;
};

// Multi-head self-attention where position t attends to positions <= t.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  // `causal_mask`: lower-triangular [seq_len, seq_len] bool, true where
  // attention is allowed; shared by every block of the model, as `mode`.
  // `tensor`: the tensor-parallel group; this rank computes heads
  // [rank * heads / T, (rank + 1) * heads / T).
  CausalSelfAttentionImpl(const GptConfig& config, torch::Tensor causal_mask,
                          std::shared_ptr<const ComputeMode> mode, Communicator* tensor);
  // x: [batch, time, hidden] -> [batch, time, hidden].
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear c_attn{nullptr};  // this rank's heads' q, k and v rows
  RowParallelLinear c_proj{nullptr};

 private:
  int64_t heads_;        // in the model
  int64_t local_heads_;  // on this rank
  Communicator* tensor_;
  std::shared_ptr<const ComputeMode> mode_;
  Dropout attn_dropout_{nullptr};
  Dropout resid_dropout_{nullptr};
  torch::Tensor causal_mask_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const GptConfig& config, std::shared_ptr<const ComputeMode> mode, Communicator* tensor);
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear c_fc{nullptr};
  RowParallelLinear c_proj{nullptr};

 private:
  std::shared_ptr<const ComputeMode> mode_;
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Mlp);

// A pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptConfig& config, torch::Tensor causal_mask, std::shared_ptr<const ComputeMode> mode,
            Communicator* tensor);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};

 private:
  std::shared_ptr<const ComputeMode> mode_;
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Parameters are initialised as GPT-2's: N(0, 0.02), residual output
  // projections scaled by 1/sqrt(2 * layers), zero biases, unit norms. Draws
  // from LibTorch's default generator: seed it first for reproducibility.
  //
  // With a tensor-parallel group of T ranks (`tensor`, which must outlive
  // the model; none is a group of one) the model is Megatron's: each rank
  // holds 1/T of every block's attention heads and MLP and of the
  // vocabulary (the tied embedding and output layer); layer norms and
  // position embeddings are whole on every rank. Every rank draws the whole
  // model's initial values and keeps its part, and attention dropout drops
  // what the whole model would, so training is the same for every T.
  //
  // ParameterInit::kDeferred builds the same model without its values:
  // each module's parameters are replaced, as soon as it is built, by a
  // placeholder of the same shape holding one element, so building GPT-2 XL
  // takes one block's memory, not the model's. InitialValue then writes each
  // parameter's value where its caller keeps it (a chunk, say).
  enum class ParameterInit { kNow, kDeferred };
  explicit GptImpl(const GptConfig& config, Communicator* tensor = nullptr,
                   ParameterInit init = ParameterInit::kNow);

  // Deferred initialisation: writes the initial value of parameter `index`
  // (named_parameters() order) into `out` (contiguous, its number of
  // elements, any floating type), drawing from the generator the
  // constructor saw, exactly as kNow would have: call it once for each
  // parameter, in order, before anything else draws from that generator,
  // and the values and the generator's state after the last are kNow's bit
  // for bit. Throws std::logic_error out of order or without kDeferred.
  void InitialValue(size_t index, at::Tensor out);
  // Initial values given instead of drawn (pretrained weights): `whole(name,
  // out)` writes parameter `name`'s value across the whole tensor group, in
  // the model's layout, into the fp32 tensor `out` of that shape;
  // InitialValue keeps this rank's part of it. Nothing is drawn from the
  // generator then.
  using WholeValues = std::function<void(const std::string& name, at::Tensor out)>;
  void SetInitialValues(WholeValues whole) { whole_values_ = std::move(whole); }
  // A deferred model made whole: each parameter given fp32 storage of its
  // own and its initial value (InitialValue, in order), as kNow would have.
  void Materialize();
  // Whether parameters are still waiting for InitialValue.
  bool deferred() const { return next_initial_ < pending_.size(); }
  // The bytes InitialValue(index) takes while it runs into an fp32 `out`:
  // the parameter's whole tensor across the tensor group, in fp32, for a
  // drawn tensor-parallel shard; 0 for one set to a constant or drawn in
  // place (all of it this rank's).
  // With values given (SetInitialValues), the whole tensor in fp32, twice for
  // a tensor-parallel shard.
  uint64_t InitialValueScratchBytes(size_t index) const;

  // tokens: [batch, time] int64 with time <= seq_len -> logits
  // [batch, time, vocab_size / T] (this rank's part of the vocabulary).
  torch::Tensor forward(const torch::Tensor& tokens);

  // The stages of forward(), for callers that work block by block.
  torch::Tensor Embed(const torch::Tensor& tokens);
  torch::Tensor Head(const torch::Tensor& x);

  // Mean cross-entropy of logits (as forward() returns them) against
  // targets ([batch, time] int64), computed in fp32 whatever the logits'
  // type; across the tensor group without gathering the logits.
  torch::Tensor Loss(const torch::Tensor& logits, const torch::Tensor& targets);

  // Head(x) and Loss() in one, never holding the whole logits (see
  // lm_head_loss.h): what the chunked engine trains with. With a tensor
  // group of more than one rank, Loss(Head(x)).
  torch::Tensor HeadLoss(const torch::Tensor& x, const torch::Tensor& targets);

  // The head at each row's last position only, for generation: x [batch,
  // time, hidden] (as the last block returns it) -> fp32 logits [batch,
  // vocab_size] (the whole vocabulary: needs a tensor group of one).
  torch::Tensor LastLogits(const torch::Tensor& x);

  Communicator& tensor_group() { return *tensor_; }

  // How to compute from now on (the weights must already be of mode.dtype).
  void SetComputeMode(const ComputeMode& mode) { *mode_ = mode; }
  void SetBatchShare(int64_t whole, int64_t offset) {
    mode_->batch_whole = whole;
    mode_->batch_offset = offset;
  }
  const ComputeMode& compute_mode() const { return *mode_; }

  const GptConfig& config() const { return config_; }
  int64_t block_count() const { return static_cast<int64_t>(h->size()); }
  BlockImpl& block(int64_t i) { return *h[i]->as<BlockImpl>(); }

  VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GptConfig config_;
  std::unique_ptr<Communicator> solo_;  // when no group was given
  Communicator* tensor_;
  std::shared_ptr<ComputeMode> mode_;
  Dropout drop_{nullptr};
  // The one causal mask every block uses (a buffer: it moves with the model).
  torch::Tensor causal_mask_;
  // Deferred initialisation: every parameter's name and shape, in order,
  // the next to initialise, and the generator to draw from.
  std::vector<std::pair<std::string, std::vector<int64_t>>> pending_;
  size_t next_initial_ = 0;
  at::Generator generator_;
  // Values given instead of drawn (SetInitialValues), and this rank's part
  // of the one named.
  WholeValues whole_values_;
  at::Tensor WholeValueOf(const std::string& name, const std::vector<int64_t>& shape);
};
TORCH_MODULE(Gpt);

// This rank's part of the whole model's value of parameter `name` (its
// gradient, say): what a model built with `tensor` holds of it.
at::Tensor TensorParallelPart(const std::string& name, const at::Tensor& whole, const Communicator& tensor);

// Whether parameter `name` is split across the tensor group (else each rank
// holds it whole).
bool IsTensorParallelShard(const std::string& name);

}  // namespace ferry
