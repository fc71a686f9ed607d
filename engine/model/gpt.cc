#include "engine/model/gpt.h"

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"

#include "engine/common/cpu_generator.h"
#include "engine/model/lm_head_loss.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include <cmath>
#include <string>

#include <ATen/ATen.h>

namespace ferry {
namespace {

torch::nn::LayerNorm MakeLayerNorm(int64_t hidden) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(1e-5));
}

bool Reduced(const ComputeMode& m) { return m.dtype != at::kFloat; }

// Where this rank's activations sit in the global batch's.
DropoutSlice BatchSlice(const ComputeMode& m) {
  return m.batch_whole > 0 ? DropoutSlice().Along(0, m.batch_whole, m.batch_offset) : DropoutSlice();
}

// x W^T + b whose backward puts W's gradient where W keeps it -- a chunk's
// view, say -- by the product itself: C += G^T X, or C = G^T X where
// `claims` says C holds nothing yet. No [out, in] temporary for autograd to
// add, no separate pass over the gradient. Where W has no gradient of the
// product's type, it is returned for autograd to keep, as at::linear's
// backward would.
struct Linear : public torch::autograd::Function<Linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b, bool biased, int64_t claims) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["weight"] = w;  // the parameter itself, for its .grad()
    ctx->saved_data["bias"] = biased;
    ctx->saved_data["claims"] = claims;
    return at::linear(x, w, biased ? b : at::Tensor());
  }
  // A custom function's tensor inputs must all be defined: no bias is an
  // empty one.
  static at::Tensor Apply(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, GradientClaims* claims) {
    return apply(x, w, b.defined() ? b : at::empty({0}, w.options()), b.defined(), reinterpret_cast<int64_t>(claims));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = grads[0].matmul(w);
    if (ctx->needs_input_grad(1)) {
      const at::Tensor rows = x.reshape({-1, x.size(-1)});
      at::Tensor into = ctx->saved_data["weight"].toTensor().grad();
      if (into.defined() && into.scalar_type() == g.scalar_type() && into.device() == g.device() &&
          into.is_contiguous()) {
        auto* claims = reinterpret_cast<GradientClaims*>(ctx->saved_data["claims"].toInt());
        if (claims != nullptr && claims->Claim(ctx->saved_data["weight"].toTensor())) {
          at::mm_out(into, g.t(), rows);
        } else {
          into.addmm_(g.t(), rows);
        }
      } else {
        grad_w = g.t().mm(rows);
      }
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_b = g.sum(0);
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
  }
};

// x W^T + b as the model computes it: in fp32 from reduced values when
// upcasting. Reads the mode at each call: it changes with SetComputeMode.
LinearFn Dense(std::shared_ptr<const ComputeMode> mode) {
  return [mode](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    const ComputeMode& m = *mode;
    if (!Reduced(m) || !m.upcast) return Linear::Apply(x, w, b, m.claims);
    return at::linear(x.to(at::kFloat), w.to(at::kFloat), b.defined() ? b.to(at::kFloat) : b).to(m.dtype);
  };
}

// Parameters split across the tensor group, by the dimension that is split
// (0: rows, 1: columns); -1 for whole ones.
int ShardedDim(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("c_attn.weight") || ends_with("c_attn.bias") || ends_with("c_fc.weight") ||
      ends_with("c_fc.bias") || name == "wte.weight") {
    return 0;
  }
  if (ends_with("c_proj.weight")) return 1;
  return -1;
}

// This rank's part of `full`, the whole model's value of parameter `name`.
// c_attn's rows are [q; k; v], each split by heads.
at::Tensor PartOf(const std::string& name, const at::Tensor& full, const Communicator& comm) {
  const int dim = ShardedDim(name);
  if (dim < 0 || comm.size() == 1) return full;
  if (name.find("c_attn.") != std::string::npos) {
    const int64_t hidden = full.size(0) / 3;
    const Shard s = ShardOf(hidden, comm);
    at::Tensor qkv = full.reshape({3, hidden, -1}).narrow(1, s.begin, s.size());
    return full.dim() == 1 ? qkv.reshape({-1}) : qkv.reshape({3 * s.size(), full.size(1)});
  }
  const Shard s = ShardOf(full.size(dim), comm);
  return full.narrow(dim, s.begin, s.size());
}

torch::Tensor Norm(const torch::Tensor& x, torch::nn::LayerNorm ln, const ComputeMode& m) {
  if (!Reduced(m)) return ln->forward(x);
  return at::layer_norm(x.to(at::kFloat), ln->options.normalized_shape(), ln->weight.to(at::kFloat),
                        ln->bias.to(at::kFloat), ln->options.eps())
      .to(m.dtype);
}

// GPT-2's GELU (the tanh approximation) of reduced values, computed in fp32
// and rounded once -- forward and backward -- keeping only the reduced input
// for the backward. The same values as LibTorch 1.13's bf16 kernel on the
// CPU, which takes 1.7x the time (gpt2-large's [128, 5120]: 3.4 against
// 2.0 ms forward with the conversions, 5.1 against 3.1 ms backward).
struct WideGelu : public torch::autograd::Function<WideGelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return at::gelu(x.to(at::kFloat), "tanh").to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {at::gelu_backward(grads[0].to(at::kFloat), x.to(at::kFloat), "tanh").to(x.scalar_type())};
  }
};

// a @ b, in fp32 when upcasting.
torch::Tensor MatMul(const torch::Tensor& a, const torch::Tensor& b, const ComputeMode& m) {
  if (!Reduced(m) || !m.upcast) return a.matmul(b);
  return a.to(at::kFloat).matmul(b.to(at::kFloat)).to(m.dtype);
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config, torch::Tensor causal_mask,
                                                 std::shared_ptr<const ComputeMode> mode, Communicator* tensor)
    : heads_(config.heads),
      local_heads_(ShardOf(config.heads, *tensor).size()),
      tensor_(tensor),
      mode_(std::move(mode)),
      causal_mask_(std::move(causal_mask)) {
  // The q, k and v rows of this rank's heads (3 x hidden / T of them).
  c_attn = register_module("c_attn", ColumnParallelLinear(config.hidden, 3 * config.hidden, tensor,
                                                          /*gather_output=*/false, Dense(mode_)));
  c_proj = register_module("c_proj", RowParallelLinear(config.hidden, config.hidden, tensor, Dense(mode_)));
  attn_dropout_ = register_module("attn_dropout", Dropout(config.dropout));
  resid_dropout_ = register_module("resid_dropout", Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t time = x.size(1);
  const int64_t head_dim = x.size(2) / heads_;
  const int64_t hidden = local_heads_ * head_dim;  // this rank's share

  const ComputeMode& m = *mode_;
  std::vector<torch::Tensor> qkv = c_attn(x).split(hidden, /*dim=*/2);
  auto to_heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, local_heads_, head_dim}).transpose(1, 2);  // [B, nh, T, hd]
  };
  torch::Tensor q = to_heads(qkv[0]);
  torch::Tensor k = to_heads(qkv[1]);
  torch::Tensor v = to_heads(qkv[2]);

  // The scores are the step's largest activations (batch x heads x time x
  // time): one batched product makes them with the scale and the causal
  // mask (an additive 0 / -inf bias) folded in, rather than three passes.
  const c10::ScalarType compute = Reduced(m) && m.upcast ? at::kFloat : q.scalar_type();
  torch::Tensor allowed = causal_mask_.slice(0, 0, time).slice(1, 0, time);
  torch::Tensor bias = at::zeros({time, time}, q.options().dtype(compute))
                           .masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  torch::Tensor scores =
      at::baddbmm(bias, q.reshape({batch * local_heads_, time, head_dim}).to(compute),
                  k.reshape({batch * local_heads_, time, head_dim}).to(compute).transpose(1, 2), /*beta=*/1.0,
                  /*alpha=*/1.0 / std::sqrt(double(head_dim)))
          .view({batch, local_heads_, time, time});
  // Softmax always in fp32.
  torch::Tensor probabilities = Reduced(m) ? scores.to(at::kFloat).softmax(-1).to(m.dtype) : scores.softmax(-1);
  // This rank's heads (and rows) drop what the whole model's would.
  const DropoutSlice rows = BatchSlice(m);
  torch::Tensor weights = attn_dropout_->forward(
      probabilities, tensor_->size() == 1 ? rows : rows.Along(1, heads_, ShardOf(heads_, *tensor_).begin));
  torch::Tensor y = MatMul(weights, v, m).transpose(1, 2).contiguous().view({batch, time, hidden});
  return resid_dropout_->forward(c_proj(y), rows);
}

MlpImpl::MlpImpl(const GptConfig& config, std::shared_ptr<const ComputeMode> mode, Communicator* tensor)
    : mode_(std::move(mode)) {
  c_fc = register_module("c_fc", ColumnParallelLinear(config.hidden, 4 * config.hidden, tensor,
                                                      /*gather_output=*/false, Dense(mode_)));
  c_proj = register_module("c_proj", RowParallelLinear(4 * config.hidden, config.hidden, tensor, Dense(mode_)));
  dropout_ = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const ComputeMode& m = *mode_;
  // GPT-2 uses the tanh approximation of GELU.
  torch::Tensor up = c_fc(x);
  torch::Tensor hidden = Reduced(m) ? WideGelu::apply(up) : at::gelu(up, "tanh");
  return dropout_->forward(c_proj(hidden), BatchSlice(m));
}

BlockImpl::BlockImpl(const GptConfig& config, torch::Tensor causal_mask,
                     std::shared_ptr<const ComputeMode> mode, Communicator* tensor)
    : mode_(mode) {
  ln_1 = register_module("ln_1", MakeLayerNorm(config.hidden));
  attn = register_module("attn", CausalSelfAttention(config, std::move(causal_mask), mode, tensor));
  ln_2 = register_module("ln_2", MakeLayerNorm(config.hidden));
  mlp = register_module("mlp", Mlp(config, mode, tensor));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = x + attn->forward(Norm(x, ln_1, *mode_));
  return y + mlp->forward(Norm(y, ln_2, *mode_));
}

namespace {

// A parameter's stand-in until its value is written where it will live: its
// shape, one element of storage.
void Defer(torch::nn::Module& module) {
  for (torch::Tensor& p : module.parameters()) {
    p.set_data(at::zeros({1}, p.options()).expand(p.sizes()));
  }
}

}  // namespace

GptImpl::GptImpl(const GptConfig& config, Communicator* tensor, ParameterInit init)
    : config_(config),
      solo_(tensor == nullptr ? MakeSoloCommunicator("tensor") : nullptr),
      tensor_(tensor == nullptr ? solo_.get() : tensor),
      mode_(std::make_shared<ComputeMode>()) {
  const bool deferred = init == ParameterInit::kDeferred;
  // Built in the same order either way, so that what the modules' own
  // constructors draw is the same.
  wte = register_module("wte", VocabParallelEmbedding(config.vocab_size, config.hidden, tensor_));
  if (deferred) Defer(*wte);
  wpe = register_module("wpe", torch::nn::Embedding(config.seq_len, config.hidden));
  if (deferred) Defer(*wpe);
  drop_ = register_module("drop", Dropout(config.dropout));
  // A buffer, not a parameter: it moves with the model and is not trained.
  // Blocks hold the same tensor, so moving it moves theirs.
  causal_mask_ = register_buffer(
      "causal_mask", torch::ones({config.seq_len, config.seq_len}, torch::kBool).tril());
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) {
    Block block(config, causal_mask_, mode_, tensor_);
    if (deferred) Defer(*block);
    h->push_back(block);
  }
  ln_f = register_module("ln_f", MakeLayerNorm(config.hidden));
  if (deferred) Defer(*ln_f);

  generator_ = CpuGenerator();
  for (auto& item : named_parameters()) pending_.emplace_back(item.key(), item.value().sizes().vec());
  if (deferred) return;
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& item : named_parameters()) InitialValue(i++, item.value());
}

namespace {

// How a parameter starts, by its name: constant (norms' weights 1, biases 0)
// or drawn from N(0, std).
struct Initialiser {
  bool drawn = false;
  double fill = 0;
  double std = 0;
};
Initialiser InitialiserOf(const std::string& name, int64_t layers) {
  const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  if (name.find("ln_") != std::string::npos) return {false, is_bias ? 0.0 : 1.0, 0};
  if (is_bias) return {false, 0, 0};
  const double residual_std = 0.02 / std::sqrt(2.0 * double(layers));
  return {true, 0, name.find("c_proj.weight") != std::string::npos ? residual_std : 0.02};
}

}  // namespace

void GptImpl::InitialValue(size_t index, at::Tensor out) {
  if (index != next_initial_ || index >= pending_.size()) {
    throw std::logic_error(absl::StrCat("GptImpl::InitialValue: parameter ", index, " asked for, ",
                                        next_initial_ < pending_.size() ? absl::StrCat("the next is ", next_initial_)
                                                                        : std::string("all are initialised")));
  }
  ++next_initial_;
  const auto& [name, shape] = pending_[index];
  torch::NoGradGuard no_grad;
  if (whole_values_) {
    out.copy_(WholeValueOf(name, shape).reshape(out.sizes()));
    return;
  }
  const Initialiser init = InitialiserOf(name, config_.layers);
  if (!init.drawn) {
    out.fill_(init.fill);
    return;
  }
  // Drawn whole, in the same order on every rank, whatever the group; a
  // tensor that is all this rank's is drawn in place (the same numbers: the
  // generator fills a contiguous tensor in memory order, whatever its shape).
  const int dim = ShardedDim(name);
  if ((dim < 0 || tensor_->size() == 1) && out.scalar_type() == at::kFloat) {
    out.normal_(0.0, init.std, generator_);
    return;
  }
  std::vector<int64_t> whole = shape;
  whole[static_cast<size_t>(dim)] *= tensor_->size();
  out.copy_(PartOf(name, at::empty(whole).normal_(0.0, init.std, generator_), *tensor_).reshape(out.sizes()));
}

at::Tensor GptImpl::WholeValueOf(const std::string& name, const std::vector<int64_t>& shape) {
  const int dim = ShardedDim(name);
  std::vector<int64_t> whole = shape;
  if (dim >= 0) whole[static_cast<size_t>(dim)] *= tensor_->size();
  at::Tensor value = at::empty(whole, at::kFloat);
  whole_values_(name, value);
  return PartOf(name, value, *tensor_);
}

void GptImpl::Materialize() {
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    at::Tensor value = at::empty(pending_.at(next_initial_).second, at::kFloat);
    InitialValue(next_initial_, value);
    item.value().set_data(value);
  }
}

uint64_t GptImpl::InitialValueScratchBytes(size_t index) const {
  const auto& [name, shape] = pending_.at(index);
  if (whole_values_) {
    uint64_t n = sizeof(float) * static_cast<uint64_t>(ShardedDim(name) >= 0 ? tensor_->size() : 1);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return ShardedDim(name) >= 0 && tensor_->size() > 1 ? 2 * n : n;
  }
  if (!InitialiserOf(name, config_.layers).drawn || ShardedDim(name) < 0 || tensor_->size() == 1) return 0;
  uint64_t n = sizeof(float) * static_cast<uint64_t>(tensor_->size());
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

at::Tensor TensorParallelPart(const std::string& name, const at::Tensor& whole, const Communicator& tensor) {
  return PartOf(name, whole, tensor);
}

bool IsTensorParallelShard(const std::string& name) { return ShardedDim(name) >= 0; }

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t time = tokens.size(1);
  torch::Tensor positions = torch::arange(time, tokens.options().dtype(torch::kLong));
  return drop_->forward(wte->forward(tokens) + wpe->forward(positions), BatchSlice(*mode_));
}

torch::Tensor GptImpl::Head(const torch::Tensor& x) {
  // Every rank's logits depend on the whole of x: its gradient is summed.
  return MatMul(CopyToTensorRegion(Norm(x, ln_f, *mode_), tensor_), wte->weight.t(), *mode_);
}

torch::Tensor GptImpl::HeadLoss(const torch::Tensor& x, const torch::Tensor& targets) {
  if (tensor_->size() > 1) return Loss(Head(x), targets);
  const torch::Tensor normed = Norm(x, ln_f, *mode_);
  return LmHeadCrossEntropy(normed.reshape({-1, normed.size(-1)}), wte->weight, targets.reshape({-1}),
                            /*slice_rows=*/4096, /*native=*/Reduced(*mode_) && !mode_->upcast, mode_->claims);
}

torch::Tensor GptImpl::LastLogits(const torch::Tensor& x) {
  TORCH_CHECK(tensor_->size() == 1, "LastLogits needs the whole vocabulary (a tensor group of one)");
  // One position's row of the head: [batch, hidden] x [hidden, vocab], in
  // fp32 whatever the weights' type.
  const torch::Tensor normed = Norm(x.select(1, x.size(1) - 1), ln_f, *mode_);
  return at::matmul(normed.to(at::kFloat), wte->weight.to(at::kFloat).t());
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [batch, time], got ", tokens.sizes());
  TORCH_CHECK(tokens.size(1) <= config_.seq_len, "sequence of ", tokens.size(1),
              " tokens is longer than seq_len ", config_.seq_len);
  torch::Tensor x = Embed(tokens);
  for (const auto& block : *h) x = block->as<BlockImpl>()->forward(x);
  return Head(x);
}

torch::Tensor GptImpl::Loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (tensor_->size() > 1) return VocabParallelCrossEntropy(logits, targets, tensor_);
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}));
}

}  // namespace ferry
