#include "engine/model/gpt.h"

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

torch::Tensor Dense(const torch::Tensor& x, torch::nn::Linear l, const ComputeMode& m) {
  if (!Reduced(m) || !m.upcast) return l->forward(x);
  return at::linear(x.to(at::kFloat), l->weight.to(at::kFloat), l->bias.to(at::kFloat)).to(m.dtype);
}

torch::Tensor Norm(const torch::Tensor& x, torch::nn::LayerNorm ln, const ComputeMode& m) {
  if (!Reduced(m)) return ln->forward(x);
  return at::layer_norm(x.to(at::kFloat), ln->options.normalized_shape(), ln->weight.to(at::kFloat),
                        ln->bias.to(at::kFloat), ln->options.eps())
      .to(m.dtype);
}

// a @ b, in fp32 when upcasting.
torch::Tensor MatMul(const torch::Tensor& a, const torch::Tensor& b, const ComputeMode& m) {
  if (!Reduced(m) || !m.upcast) return a.matmul(b);
  return a.to(at::kFloat).matmul(b.to(at::kFloat)).to(m.dtype);
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config, torch::Tensor causal_mask,
                                                 std::shared_ptr<const ComputeMode> mode)
    : heads_(config.heads), mode_(std::move(mode)), causal_mask_(std::move(causal_mask)) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.hidden, 3 * config.hidden));
  c_proj = register_module("c_proj", torch::nn::Linear(config.hidden, config.hidden));
  attn_dropout_ = register_module("attn_dropout", Dropout(config.dropout));
  resid_dropout_ = register_module("resid_dropout", Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t time = x.size(1);
  const int64_t hidden = x.size(2);
  const int64_t head_dim = hidden / heads_;

  const ComputeMode& m = *mode_;
  std::vector<torch::Tensor> qkv = Dense(x, c_attn, m).split(hidden, /*dim=*/2);
  auto to_heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, heads_, head_dim}).transpose(1, 2);  // [B, nh, T, hd]
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
      at::baddbmm(bias, q.reshape({batch * heads_, time, head_dim}).to(compute),
                  k.reshape({batch * heads_, time, head_dim}).to(compute).transpose(1, 2), /*beta=*/1.0,
                  /*alpha=*/1.0 / std::sqrt(double(head_dim)))
          .view({batch, heads_, time, time});
  // Softmax always in fp32.
  torch::Tensor probabilities = Reduced(m) ? scores.to(at::kFloat).softmax(-1).to(m.dtype) : scores.softmax(-1);
  torch::Tensor weights = attn_dropout_->forward(probabilities);
  torch::Tensor y = MatMul(weights, v, m).transpose(1, 2).contiguous().view({batch, time, hidden});
  return resid_dropout_->forward(Dense(y, c_proj, m));
}

MlpImpl::MlpImpl(const GptConfig& config, std::shared_ptr<const ComputeMode> mode) : mode_(std::move(mode)) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.hidden, 4 * config.hidden));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.hidden, config.hidden));
  dropout_ = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const ComputeMode& m = *mode_;
  // GPT-2 uses the tanh approximation of GELU.
  torch::Tensor up = Dense(x, c_fc, m);
  torch::Tensor hidden = Reduced(m) && m.upcast ? at::gelu(up.to(at::kFloat), "tanh").to(m.dtype)
                                                : at::gelu(up, "tanh");
  return dropout_->forward(Dense(hidden, c_proj, m));
}

BlockImpl::BlockImpl(const GptConfig& config, torch::Tensor causal_mask,
                     std::shared_ptr<const ComputeMode> mode)
    : mode_(mode) {
  ln_1 = register_module("ln_1", MakeLayerNorm(config.hidden));
  attn = register_module("attn", CausalSelfAttention(config, std::move(causal_mask), mode));
  ln_2 = register_module("ln_2", MakeLayerNorm(config.hidden));
  mlp = register_module("mlp", Mlp(config, mode));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = x + attn->forward(Norm(x, ln_1, *mode_));
  return y + mlp->forward(Norm(y, ln_2, *mode_));
}

GptImpl::GptImpl(const GptConfig& config) : config_(config), mode_(std::make_shared<ComputeMode>()) {
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.hidden));
  wpe = register_module("wpe", torch::nn::Embedding(config.seq_len, config.hidden));
  drop_ = register_module("drop", Dropout(config.dropout));
  // A buffer, not a parameter: it moves with the model and is not trained.
  // Blocks hold the same tensor, so moving it moves theirs.
  causal_mask_ = register_buffer(
      "causal_mask", torch::ones({config.seq_len, config.seq_len}, torch::kBool).tril());
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) h->push_back(Block(config, causal_mask_, mode_));
  ln_f = register_module("ln_f", MakeLayerNorm(config.hidden));

  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * double(config.layers));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find("ln_") != std::string::npos) {
      if (is_bias) p.zero_(); else p.fill_(1.0);
    } else if (is_bias) {
      p.zero_();
    } else if (name.find("c_proj.weight") != std::string::npos) {
      p.normal_(0.0, residual_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t time = tokens.size(1);
  torch::Tensor positions = torch::arange(time, tokens.options().dtype(torch::kLong));
  return drop_->forward(wte->forward(tokens) + wpe->forward(positions));
}

torch::Tensor GptImpl::Head(const torch::Tensor& x) {
  return MatMul(Norm(x, ln_f, *mode_), wte->weight.t(), *mode_);
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
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}));
}

}  // namespace ferry
