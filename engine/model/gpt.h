#pragma once

// A decoder-only transformer -- GPT-2 or one of the Llama family, as its
// ModelConfig says -- built from our own modules, so that the memory
// manager, recompute and tensor parallelism can work block by block.
//
// Parameter names follow the GPT-2 checkpoints whatever the family (wte,
// wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc,
// h.N.mlp.c_proj, ln_f), with h.N.attn.q_norm/k_norm (Qwen3) and lm_head
// (an untied output layer). The q, k and v projections are one layer
// (c_attn: query heads' rows, then key heads', then value heads'), and so
// are SwiGLU's gate and up projections (c_fc: gate rows, then up rows):
// one product each instead of three or two. engine/model/hf_layout.h maps
// these names to each family's Hugging Face names.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/gradient_claims.h"
#include "engine/model/dropout.h"
#include "engine/model/model_config.h"
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

// A normalisation over the last dimension: LayerNorm (weight and bias) or
// RMSNorm (weight only), computed in fp32 whatever the activations' type
// and rounded once.
class NormImpl : public torch::nn::Module {
 public:
  // `partial`: a tensor group whose ranks each norm a part of the values
  // with the same weight (Qwen3's q/k norms of each rank's heads), whose
  // weight gradients are summed across it; null for a norm of whole rows.
  NormImpl(int64_t width, ModelConfig::Norm kind, double eps, std::shared_ptr<const ComputeMode> mode,
           Communicator* partial = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;
  torch::Tensor bias;  // LayerNorm's; undefined for RMSNorm

 private:
  ModelConfig::Norm kind_;
  double eps_;
  std::shared_ptr<const ComputeMode> mode_;
  Communicator* partial_;
};
TORCH_MODULE(Norm);

// The rotary angles' cosines and sines, [positions, head_dim] fp32 each,
// as Hugging Face computes them (in fp32; rope_scaling applied; each
// frequency repeated over both halves of the head), for positions
// [0, positions).
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};
RotaryTables MakeRotaryTables(const ModelConfig& config, int64_t positions);

// One block's keys and values of the positions seen so far, for
// generation: the next positions attend to them instead of recomputing
// them. [batch, kv heads, capacity, head_dim] each, `length` of them
// filled.
struct KvCacheLayer {
  torch::Tensor k;
  torch::Tensor v;
  int64_t length = 0;
};

// Every block's, and where the next positions start.
struct KvCache {
  std::vector<KvCacheLayer> layers;
  int64_t positions() const { return layers.empty() ? 0 : layers[0].length; }
  void Clear() { layers.clear(); }
};

// Multi-head self-attention where position t attends to positions <= t,
// with grouped-query attention (each key/value head serving heads /
// kv_heads query heads, never repeated in memory), rotary positions and
// Qwen3's per-head q/k norms where the configuration has them.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  // `rotary`: the model's tables (empty for learned positions), shared by
  // every block, as `mode`. `tensor`: the tensor-parallel group; this rank
  // computes query heads [rank * heads / T, (rank + 1) * heads / T) and
  // their key/value heads likewise.
  CausalSelfAttentionImpl(const ModelConfig& config, RotaryTables rotary, std::shared_ptr<const ComputeMode> mode,
                          Communicator* tensor);
  // x: [batch, time, hidden] -> [batch, time, hidden]. With `cache`, x is
  // the positions after the cached ones (whose keys and values it appends,
  // the cache growing to seq_len positions at most), which attend to them
  // too.
  torch::Tensor forward(const torch::Tensor& x, KvCacheLayer* cache = nullptr);

  ColumnParallelLinear c_attn{nullptr};  // this rank's heads' q, k and v rows
  Norm q_norm{nullptr};                  // Qwen3's; else null
  Norm k_norm{nullptr};
  RowParallelLinear c_proj{nullptr};

 private:
  int64_t heads_;           // in the model
  int64_t local_heads_;     // on this rank
  int64_t local_kv_heads_;  // on this rank
  int64_t head_dim_;
  int64_t seq_len_;
  Communicator* tensor_;
  std::shared_ptr<const ComputeMode> mode_;
  Dropout attn_dropout_{nullptr};
  Dropout resid_dropout_{nullptr};
  RotaryTables rotary_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& config, std::shared_ptr<const ComputeMode> mode, Communicator* tensor);
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear c_fc{nullptr};  // GELU: up; SwiGLU: [gate; up] of this rank's columns
  RowParallelLinear c_proj{nullptr};

 private:
  bool gated_;
  std::shared_ptr<const ComputeMode> mode_;
  Dropout dropout_{nullptr};
};
TORCH_MODULE(Mlp);

// A pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, RotaryTables rotary, std::shared_ptr<const ComputeMode> mode,
            Communicator* tensor);
  torch::Tensor forward(const torch::Tensor& x, KvCacheLayer* cache = nullptr);

  Norm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  Norm ln_2{nullptr};
  Mlp mlp{nullptr};

 private:
  std::shared_ptr<const ComputeMode> mode_;
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Parameters are initialised as GPT-2's: N(0, 0.02), residual output
  // projections scaled by 1/sqrt(2 * layers) (GPT-2 only; the Llama family
  // draws them as the rest), zero biases, unit norms. Draws
  // from LibTorch's default generator: seed it first for reproducibility.
  //
  // With a tensor-parallel group of T ranks (`tensor`, which must outlive
  // the model; none is a group of one) the model is Megatron's: each rank
  // holds 1/T of every block's attention heads and MLP and of the
  // vocabulary (the tied embedding and output layer); layer norms and
  // position embeddings are whole on every rank; key/value heads are split
  // as the query heads (T must divide both). Every rank draws the whole
  // model's initial values and keeps its part, and attention dropout drops
  // what the whole model would, so training is the same for every T.
  //
  // ParameterInit::kDeferred builds the same model without its values:
  // each module's parameters are replaced, as soon as it is built, by a
  // placeholder of the same shape holding one element, so building GPT-2 XL
  // takes one block's memory, not the model's. InitialValue then writes each
  // parameter's value where its caller keeps it (a chunk, say).
  enum class ParameterInit { kNow, kDeferred };
  explicit GptImpl(const ModelConfig& config, Communicator* tensor = nullptr,
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

  // The stages of forward(), for callers that work block by block. The
  // tokens' positions start at `first_position` (the cached ones before
  // them, in generation).
  torch::Tensor Embed(const torch::Tensor& tokens, int64_t first_position = 0);
  torch::Tensor Head(const torch::Tensor& x);

  // Mean cross-entropy of logits (as forward() returns them) against
  // targets ([batch, time] int64), computed in fp32 whatever the logits'
  // type; across the tensor group without gathering the logits.
  torch::Tensor Loss(const torch::Tensor& logits, const torch::Tensor& targets);

  // Head(x) and Loss() in one, never holding the whole logits (see
  // lm_head_loss.h): what the chunked engine trains with. With a tensor
  // group of more than one rank, Loss(Head(x)).
  torch::Tensor HeadLoss(const torch::Tensor& x, const torch::Tensor& targets);

  // The stages of a model whose vocabulary is in pieces (ModelStages),
  // which the chunked engine runs one by one:
  //   x = EmbedPiece(0, tokens, {}, first); x = EmbedPiece(k, tokens, x) ...
  //   (the positions and dropout come with the first and last pieces);
  //   n = HeadNorm(x) (fp32, so the pieces' gradients are summed in fp32);
  //   s_k = HeadPieceStats(k, n, targets) each, loss = CombineHeadStats(s).
  // With one piece, EmbedPiece is Embed() and HeadLoss() the head.
  int vocab_pieces() const { return wte->piece_count(); }
  torch::Tensor EmbedPiece(int k, const torch::Tensor& tokens, const torch::Tensor& partial,
                           int64_t first_position = 0);
  torch::Tensor HeadNorm(const torch::Tensor& x);
  // Per row of `normed`: the log-sum-exp of piece k's logits, and the
  // target's logit where piece k holds the target (0 elsewhere), [rows, 2]
  // fp32 (LmHeadPieceStats).
  torch::Tensor HeadPieceStats(int k, const torch::Tensor& normed, const torch::Tensor& targets);
  torch::Tensor CombineHeadStats(const std::vector<torch::Tensor>& stats);
  // The logits of output piece k for rows of the final norm's output, in
  // fp32 whatever the weights' type (generation).
  torch::Tensor PieceLogits(int k, const torch::Tensor& normed_rows);

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

  const ModelConfig& config() const { return config_; }
  int64_t block_count() const { return static_cast<int64_t>(h->size()); }
  BlockImpl& block(int64_t i) { return *h[i]->as<BlockImpl>(); }

  VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};  // learned positions only
  torch::nn::ModuleList h{nullptr};
  Norm ln_f{nullptr};
  VocabParallelEmbedding lm_head{nullptr};  // untied output layer only

  // The output layer: lm_head, or wte when tied.
  VocabParallelEmbeddingImpl& OutputLayer() { return config_.tied ? *wte : *lm_head; }

 private:
  ModelConfig config_;
  std::unique_ptr<Communicator> solo_;  // when no group was given
  Communicator* tensor_;
  std::shared_ptr<ComputeMode> mode_;
  Dropout drop_{nullptr};
  // Rotary positions' tables every block uses (buffers: they move with the
  // model).
  RotaryTables rotary_;
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
// gradient, say): what a model of `config` built with `tensor` holds of it
// (TensorParallelSplit).
at::Tensor TensorParallelPart(const ModelConfig& config, const std::string& name, const at::Tensor& whole,
                              const Communicator& tensor);

// The whole tensor from every tensor rank's part, in rank order: the
// inverse of TensorParallelPart.
at::Tensor TensorParallelJoin(const ModelConfig& config, const std::string& name, const std::vector<at::Tensor>& parts);

// Whether parameter `name` is split across the tensor group (else each rank
// holds it whole).
bool IsTensorParallelShard(const ModelConfig& config, const std::string& name);

}  // namespace ferry
