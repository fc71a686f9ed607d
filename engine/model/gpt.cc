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
#include <limits>
#include <string>

#include <ATen/ATen.h>

namespace ferry {
namespace {

bool Reduced(const ComputeMode& m) { return m.dtype != at::kFloat; }

// Where this rank's activations sit in the global batch's.
DropoutSlice BatchSlice(const ComputeMode& m) {
  return m.batch_whole > 0 ? DropoutSlice().Along(0, m.batch_whole, m.batch_offset) : DropoutSlice();
}

// x W^T (+ b) of rows x. One fp32 row (a token generated with the key/value
// cache) is a matrix-vector product: LibTorch's matrix product of one row
// against W^T reads W at a third of the rate at::mv does here (16 against
// 50 GB/s for a [16384, 2048] W on two cores); in bf16 the matrix product
// is the faster.
at::Tensor RowsTimesTransposed(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = at::Tensor()) {
  if (x.numel() != x.size(-1) || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat) {
    return at::linear(x, w, b);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  at::Tensor y = at::mv(w, x.reshape({-1}));
  if (b.defined()) y.add_(b);
  return y.view(shape);
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
    return RowsTimesTransposed(x, w, biased ? b : at::Tensor());
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

// This rank's part of `full`, the whole model's value of parameter `name`:
// its share of each segment of the split dimension (TensorParallelSplit).
at::Tensor PartOf(const ModelConfig& config, const std::string& name, const at::Tensor& full,
                  const Communicator& comm) {
  const TensorSplit split = TensorParallelSplit(config, name);
  if (split.dim < 0 || comm.size() == 1) return full;
  if (split.segments.size() == 1) {
    const Shard s = ShardOf(full.size(split.dim), comm);
    return full.narrow(split.dim, s.begin, s.size());
  }
  std::vector<at::Tensor> parts;
  int64_t begin = 0;
  for (int64_t n : split.segments) {
    const Shard s = ShardOf(n, comm);
    parts.push_back(full.narrow(split.dim, begin + s.begin, s.size()));
    begin += n;
  }
  return at::cat(parts, split.dim);
}

// RMSNorm over the last dimension in fp32 whatever x's type, rounded once:
// x * rsqrt(mean(x^2) + eps) * w. Keeps only x and one fp32 value a row for
// the backward.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            double eps) {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor r = xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps).rsqrt_();
    ctx->save_for_backward({x, w, r});
    return (xf * r).mul_(w.to(at::kFloat)).to(x.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& r = saved[2];
    const at::Tensor g = grads[0].to(at::kFloat);
    at::Tensor normed = x.to(at::kFloat) * r;  // never in place: x may be the saved input itself
    at::Tensor grad_w;
    if (ctx->needs_input_grad(1)) grad_w = (g * normed).reshape({-1, normed.size(-1)}).sum(0).to(w.scalar_type());
    // d/dx of x r w: r (g w - normed mean(g w normed)).
    at::Tensor gw = g * w.to(at::kFloat);
    const at::Tensor mean = (gw * normed).mean(-1, /*keepdim=*/true);
    at::Tensor grad_x = gw.sub_(normed.mul_(mean)).mul_(r).to(x.scalar_type());
    return {grad_x, grad_w, at::Tensor()};
  }
};

// [-x2, x1] of a head's halves [x1, x2].
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
}

// x [batch, heads, time, head_dim] of positions [first, first + time)
// rotated by their angles, in fp32, rounded once.
at::Tensor Rotate(const at::Tensor& x, const RotaryTables& rotary, int64_t first) {
  const int64_t time = x.size(2);
  const at::Tensor cos = rotary.cos.narrow(0, first, time);
  const at::Tensor sin = rotary.sin.narrow(0, first, time);
  if (x.scalar_type() == at::kFloat) return x * cos + RotateHalf(x) * sin;
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * cos + RotateHalf(xf) * sin).to(x.scalar_type());
}

// SwiGLU of reduced values: silu(gate) * up of the halves [gate, up] of
// the MLP's first product, computed in fp32 and rounded once, forward and
// backward (the same values, op for op, as autograd through the fp32
// conversions), keeping only the reduced [gate, up] for the backward where
// autograd would keep three fp32 tensors as wide as the MLP (24 bytes a
// token and intermediate unit against 4).
struct WideSwiGlu : public torch::autograd::Function<WideSwiGlu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    const std::vector<at::Tensor> halves = gate_up.chunk(2, /*dim=*/-1);
    return (at::silu(halves[0].to(at::kFloat)) * halves[1].to(at::kFloat)).to(gate_up.scalar_type());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const std::vector<at::Tensor> halves = gate_up.chunk(2, /*dim=*/-1);
    const at::Tensor gate = halves[0].to(at::kFloat), up = halves[1].to(at::kFloat);
    const at::Tensor g = grads[0].to(at::kFloat);
    at::Tensor grad = at::empty_like(gate_up, at::MemoryFormat::Contiguous);
    const std::vector<at::Tensor> out = grad.chunk(2, /*dim=*/-1);
    out[0].copy_(at::silu_backward(g * up, gate));
    out[1].copy_(g * at::silu(gate));
    return {grad};
  }
};

// The attention's softmax of scores of reduced or fp32 values, in fp32,
// rounded once to `type`, keeping only the rounded probabilities for the
// backward -- the tensor the product with the values keeps anyway -- where
// autograd through the conversion would keep an fp32 copy of them (the
// step's largest activation, at twice the size).
struct WideSoftmax : public torch::autograd::Function<WideSoftmax> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& scores, c10::ScalarType type) {
    at::Tensor probabilities = scores.to(at::kFloat).softmax(-1).to(type);
    ctx->save_for_backward({probabilities});
    ctx->saved_data["scores_type"] = scores.scalar_type();
    return probabilities;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0].to(at::kFloat);
    const at::Tensor grad = at::_softmax_backward_data(grads[0].to(at::kFloat), p, -1, at::kFloat);
    return {grad.to(ctx->saved_data["scores_type"].toScalarType()), at::Tensor()};
  }
};

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

NormImpl::NormImpl(int64_t width, ModelConfig::Norm kind, double eps, std::shared_ptr<const ComputeMode> mode,
                   Communicator* partial)
    : kind_(kind), eps_(eps), mode_(std::move(mode)), partial_(partial) {
  weight = register_parameter("weight", at::ones({width}));
  if (kind_ == ModelConfig::Norm::kLayerNorm) bias = register_parameter("bias", at::zeros({width}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (kind_ == ModelConfig::Norm::kRmsNorm) {
    // Identity forward; the backward sums the ranks' gradients.
    const at::Tensor w = partial_ != nullptr ? CopyToTensorRegion(weight, partial_) : weight;
    return RmsNormFn::apply(x, w, eps_);
  }
  const int64_t width = weight.size(0);
  if (!Reduced(*mode_)) return at::layer_norm(x, {width}, weight, bias, eps_);
  return at::layer_norm(x.to(at::kFloat), {width}, weight.to(at::kFloat), bias.to(at::kFloat), eps_)
      .to(mode_->dtype);
}

RotaryTables MakeRotaryTables(const ModelConfig& config, int64_t positions) {
  // As Hugging Face's rotary embedding: every step in fp32.
  const int64_t dim = config.HeadDim();
  at::Tensor inv_freq =
      1.0 / at::pow(config.rope_theta, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / double(dim));
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == RopeScaling::Type::kLinear) {
    inv_freq = inv_freq / scaling.factor;
  } else if (scaling.type == RopeScaling::Type::kLlama3) {
    const double original = double(scaling.original_max_positions);
    const double low_wavelength = original / scaling.low_freq_factor;
    const double high_wavelength = original / scaling.high_freq_factor;
    const at::Tensor wavelength = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelength > low_wavelength, inv_freq / scaling.factor, inv_freq);
    const at::Tensor smooth =
        (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
    const at::Tensor smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
    const at::Tensor medium = (wavelength < high_wavelength).logical_not() &
                              (wavelength > low_wavelength).logical_not();
    inv_freq = at::where(medium, smoothed, scaled);
  }
  const at::Tensor angles = at::arange(positions, at::kLong).to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor both = at::cat({angles, angles}, -1);
  return {both.cos(), both.sin()};
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& config, RotaryTables rotary,
                                                 std::shared_ptr<const ComputeMode> mode, Communicator* tensor)
    : heads_(config.heads),
      local_heads_(ShardOf(config.heads, *tensor).size()),
      local_kv_heads_(ShardOf(config.KvHeads(), *tensor).size()),
      head_dim_(config.HeadDim()),
      seq_len_(config.seq_len),
      tensor_(tensor),
      mode_(std::move(mode)),
      rotary_(std::move(rotary)) {
  // The q, k and v rows of this rank's heads.
  c_attn = register_module("c_attn", ColumnParallelLinear(config.hidden, config.QkvRows(), tensor,
                                                          /*gather_output=*/false, Dense(mode_), config.qkv_bias));
  if (config.qk_norm) {
    // Each rank norms its own heads with the whole weight.
    q_norm = register_module("q_norm", Norm(head_dim_, ModelConfig::Norm::kRmsNorm, config.norm_eps, mode_, tensor));
    k_norm = register_module("k_norm", Norm(head_dim_, ModelConfig::Norm::kRmsNorm, config.norm_eps, mode_, tensor));
  }
  c_proj = register_module("c_proj", RowParallelLinear(config.heads * head_dim_, config.hidden, tensor, Dense(mode_),
                                                       config.proj_bias));
  attn_dropout_ = register_module("attn_dropout", Dropout(config.dropout));
  resid_dropout_ = register_module("resid_dropout", Dropout(config.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, KvCacheLayer* cache) {
  const int64_t batch = x.size(0);
  const int64_t time = x.size(1);
  const int64_t head_dim = head_dim_;
  const int64_t kv_heads = local_kv_heads_;
  const int64_t group = local_heads_ / kv_heads;  // query heads a key/value head serves
  const int64_t first = cache != nullptr ? cache->length : 0;  // the new positions' first
  TORCH_CHECK(first + time <= seq_len_, "attention over ", first + time, " positions, beyond seq_len ", seq_len_);

  const ComputeMode& m = *mode_;
  std::vector<torch::Tensor> qkv =
      c_attn(x).split_with_sizes({local_heads_ * head_dim, kv_heads * head_dim, kv_heads * head_dim}, /*dim=*/2);
  // [batch, time, n * head_dim] -> [batch, n, time, head_dim], normed and
  // rotated where the model does.
  const bool rotary = rotary_.cos.defined();
  auto to_heads = [&](const torch::Tensor& t, int64_t n, Norm norm, bool rotate) {
    torch::Tensor h = t.view({batch, time, n, head_dim});
    if (norm) h = norm(h);
    h = h.transpose(1, 2);
    return rotate ? Rotate(h, rotary_, first) : h;
  };
  torch::Tensor q = to_heads(qkv[0], local_heads_, q_norm, rotary);
  torch::Tensor k = to_heads(qkv[1], kv_heads, k_norm, rotary);
  torch::Tensor v = to_heads(qkv[2], kv_heads, nullptr, false);
  if (cache != nullptr) {
    // The new keys and values after the cached ones; attention sees all.
    if (!cache->k.defined()) {
      cache->k = at::empty({batch, kv_heads, seq_len_, head_dim}, k.options());
      cache->v = at::empty({batch, kv_heads, seq_len_, head_dim}, v.options());
    }
    cache->k.narrow(2, first, time).copy_(k);
    cache->v.narrow(2, first, time).copy_(v);
    cache->length = first + time;
    k = cache->k.narrow(2, 0, first + time);
    v = cache->v.narrow(2, 0, first + time);
  }
  const int64_t keys = first + time;

  // The scores are the step's largest activations (batch x heads x time x
  // keys): one batched product makes them with the scale and the causal
  // mask (an additive 0 / -inf bias: query i, at position first + i, sees
  // keys up to it) folded in, rather than three passes. The query heads
  // that share a key/value head are one product's rows ([group x time,
  // head_dim] against that head's keys), so keys and values are never
  // repeated.
  const c10::ScalarType compute = Reduced(m) && m.upcast ? at::kFloat : q.scalar_type();
  torch::Tensor bias =
      at::full({time, keys}, -std::numeric_limits<float>::infinity(), q.options().dtype(compute)).triu_(first + 1);
  if (group > 1) bias = bias.repeat({group, 1});
  torch::Tensor scores =
      at::baddbmm(bias, q.reshape({batch * kv_heads, group * time, head_dim}).to(compute),
                  k.reshape({batch * kv_heads, keys, head_dim}).to(compute).transpose(1, 2), /*beta=*/1.0,
                  /*alpha=*/1.0 / std::sqrt(double(head_dim)))
          .view({batch, local_heads_, time, keys});
  // Softmax always in fp32.
  torch::Tensor probabilities = Reduced(m) ? WideSoftmax::apply(scores, m.dtype) : scores.softmax(-1);
  // This rank's heads (and rows) drop what the whole model's would.
  const DropoutSlice rows = BatchSlice(m);
  torch::Tensor weights = attn_dropout_->forward(
      probabilities, tensor_->size() == 1 ? rows : rows.Along(1, heads_, ShardOf(heads_, *tensor_).begin));
  torch::Tensor y = group == 1 ? MatMul(weights, v, m)
                               : MatMul(weights.reshape({batch, kv_heads, group * time, keys}), v, m)
                                     .view({batch, local_heads_, time, head_dim});
  y = y.transpose(1, 2).contiguous().view({batch, time, local_heads_ * head_dim});
  return resid_dropout_->forward(c_proj(y), rows);
}

MlpImpl::MlpImpl(const ModelConfig& config, std::shared_ptr<const ComputeMode> mode, Communicator* tensor)
    : gated_(config.Gated()), mode_(std::move(mode)) {
  const int64_t width = config.Intermediate();
  c_fc = register_module("c_fc", ColumnParallelLinear(config.hidden, (gated_ ? 2 : 1) * width, tensor,
                                                      /*gather_output=*/false, Dense(mode_), config.proj_bias));
  c_proj = register_module("c_proj", RowParallelLinear(width, config.hidden, tensor, Dense(mode_), config.proj_bias));
  dropout_ = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const ComputeMode& m = *mode_;
  torch::Tensor up = c_fc(x);
  torch::Tensor hidden;
  if (gated_) {
    if (Reduced(m)) {
      hidden = WideSwiGlu::apply(up);
    } else {
      std::vector<torch::Tensor> gate_up = up.chunk(2, /*dim=*/-1);
      hidden = at::silu(gate_up[0]) * gate_up[1];
    }
  } else {
    // GPT-2 uses the tanh approximation of GELU.
    hidden = Reduced(m) ? WideGelu::apply(up) : at::gelu(up, "tanh");
  }
  return dropout_->forward(c_proj(hidden), BatchSlice(m));
}

BlockImpl::BlockImpl(const ModelConfig& config, RotaryTables rotary, std::shared_ptr<const ComputeMode> mode,
                     Communicator* tensor)
    : mode_(mode) {
  ln_1 = register_module("ln_1", Norm(config.hidden, config.norm, config.norm_eps, mode));
  attn = register_module("attn", CausalSelfAttention(config, std::move(rotary), mode, tensor));
  ln_2 = register_module("ln_2", Norm(config.hidden, config.norm, config.norm_eps, mode));
  mlp = register_module("mlp", Mlp(config, mode, tensor));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, KvCacheLayer* cache) {
  torch::Tensor y = x + attn->forward(ln_1(x), cache);
  return y + mlp->forward(ln_2(y));
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

GptImpl::GptImpl(const ModelConfig& config, Communicator* tensor, ParameterInit init)
    : config_(config),
      solo_(tensor == nullptr ? MakeSoloCommunicator("tensor") : nullptr),
      tensor_(tensor == nullptr ? solo_.get() : tensor),
      mode_(std::make_shared<ComputeMode>()) {
  const bool deferred = init == ParameterInit::kDeferred;
  // The vocabulary's pieces (model_config.h), each one's rows.
  std::vector<int64_t> piece_rows;
  const int pieces = VocabPieces(config, tensor_->size());
  for (int k = 0; pieces > 1 && k < pieces; ++k) piece_rows.push_back(VocabPieceRows(config, pieces, k).size);
  // Built in the same order either way, so that what the modules' own
  // constructors draw is the same.
  wte = register_module("wte", VocabParallelEmbedding(config.vocab_size, config.hidden, tensor_, piece_rows));
  if (deferred) Defer(*wte);
  if (config.Rotary()) {
    // Buffers, not parameters: they move with the model and are not
    // trained. Blocks hold the same tensors, so moving them moves theirs.
    RotaryTables tables = MakeRotaryTables(config, config.seq_len);
    rotary_.cos = register_buffer("rotary_cos", tables.cos);
    rotary_.sin = register_buffer("rotary_sin", tables.sin);
  } else {
    wpe = register_module("wpe", torch::nn::Embedding(config.seq_len, config.hidden));
    if (deferred) Defer(*wpe);
  }
  drop_ = register_module("drop", Dropout(config.dropout));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.layers; ++i) {
    Block block(config, rotary_, mode_, tensor_);
    if (deferred) Defer(*block);
    h->push_back(block);
  }
  ln_f = register_module("ln_f", Norm(config.hidden, config.norm, config.norm_eps, mode_));
  if (deferred) Defer(*ln_f);
  if (!config.tied) {
    lm_head =
        register_module("lm_head", VocabParallelEmbedding(config.vocab_size, config.hidden, tensor_, piece_rows));
    if (deferred) Defer(*lm_head);
  }

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
Initialiser InitialiserOf(const std::string& name, const ModelConfig& config) {
  const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  if (name.find("ln_") != std::string::npos || name.find("_norm.") != std::string::npos) {
    return {false, is_bias ? 0.0 : 1.0, 0};
  }
  if (is_bias) return {false, 0, 0};
  // GPT-2 scales its residual projections down; the Llama family does not.
  const bool scaled = config.model_type == "gpt2" && name.find("c_proj.weight") != std::string::npos;
  return {true, 0, scaled ? 0.02 / std::sqrt(2.0 * double(config.layers)) : 0.02};
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
  const Initialiser init = InitialiserOf(name, config_);
  if (!init.drawn) {
    out.fill_(init.fill);
    return;
  }
  // Drawn whole, in the same order on every rank, whatever the group; a
  // tensor that is all this rank's is drawn in place (the same numbers: the
  // generator fills a contiguous tensor in memory order, whatever its shape).
  const TensorSplit split = TensorParallelSplit(config_, name);
  if ((split.dim < 0 || tensor_->size() == 1) && out.scalar_type() == at::kFloat) {
    out.normal_(0.0, init.std, generator_);
    return;
  }
  std::vector<int64_t> whole = shape;
  if (split.dim >= 0) whole[static_cast<size_t>(split.dim)] *= tensor_->size();
  out.copy_(PartOf(config_, name, at::empty(whole).normal_(0.0, init.std, generator_), *tensor_).reshape(out.sizes()));
}

at::Tensor GptImpl::WholeValueOf(const std::string& name, const std::vector<int64_t>& shape) {
  std::string base;
  int k = 0;
  if (ParseVocabPiece(name, &base, &k)) {
    // A piece's rows of the whole matrix (a group of one).
    at::Tensor value = at::empty({config_.vocab_size, shape.at(1)}, at::kFloat);
    whole_values_(base, value);
    const VocabRows rows = VocabPieceRows(config_, vocab_pieces(), k);
    return value.narrow(0, rows.begin, rows.size);
  }
  const int dim = TensorParallelSplit(config_, name).dim;
  std::vector<int64_t> whole = shape;
  if (dim >= 0) whole[static_cast<size_t>(dim)] *= tensor_->size();
  at::Tensor value = at::empty(whole, at::kFloat);
  whole_values_(name, value);
  return PartOf(config_, name, value, *tensor_);
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
  const bool split = IsTensorParallelShard(config_, name);
  std::string base;
  int k = 0;
  if (whole_values_ && ParseVocabPiece(name, &base, &k)) {
    return sizeof(float) * static_cast<uint64_t>(config_.vocab_size * shape.at(1));  // the whole matrix
  }
  if (whole_values_) {
    uint64_t n = sizeof(float) * static_cast<uint64_t>(split ? tensor_->size() : 1);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return split && tensor_->size() > 1 ? 2 * n : n;
  }
  if (!InitialiserOf(name, config_).drawn || !split || tensor_->size() == 1) return 0;
  uint64_t n = sizeof(float) * static_cast<uint64_t>(tensor_->size());
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

at::Tensor TensorParallelPart(const ModelConfig& config, const std::string& name, const at::Tensor& whole,
                              const Communicator& tensor) {
  return PartOf(config, name, whole, tensor);
}

at::Tensor TensorParallelJoin(const ModelConfig& config, const std::string& name,
                              const std::vector<at::Tensor>& parts) {
  const TensorSplit split = TensorParallelSplit(config, name);
  if (parts.size() == 1 || split.dim < 0) return parts.at(0);
  const int64_t ranks = static_cast<int64_t>(parts.size());
  std::vector<at::Tensor> pieces;  // segment by segment, rank by rank
  int64_t begin = 0;
  for (int64_t n : split.segments) {
    for (const at::Tensor& part : parts) pieces.push_back(part.narrow(split.dim, begin, n / ranks));
    begin += n / ranks;
  }
  return at::cat(pieces, split.dim);
}

bool IsTensorParallelShard(const ModelConfig& config, const std::string& name) {
  return TensorParallelSplit(config, name).dim >= 0;
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens, int64_t first_position) {
  if (vocab_pieces() > 1) {
    torch::Tensor x;
    for (int k = 0; k < vocab_pieces(); ++k) x = EmbedPiece(k, tokens, x, first_position);
    return x;
  }
  torch::Tensor x = wte->forward(tokens);
  if (wpe) {
    const int64_t time = tokens.size(1);
    x = x + wpe->forward(torch::arange(first_position, first_position + time, tokens.options().dtype(torch::kLong)));
  }
  return drop_->forward(x, BatchSlice(*mode_));
}

torch::Tensor GptImpl::EmbedPiece(int k, const torch::Tensor& tokens, const torch::Tensor& partial,
                                  int64_t first_position) {
  if (vocab_pieces() == 1) return Embed(tokens, first_position);
  torch::Tensor x = wte->LookupPiece(k, tokens);
  if (k > 0) x = partial + x;
  if (k == 0 && wpe) {
    const int64_t time = tokens.size(1);
    x = x + wpe->forward(torch::arange(first_position, first_position + time, tokens.options().dtype(torch::kLong)));
  }
  return k + 1 == vocab_pieces() ? drop_->forward(x, BatchSlice(*mode_)) : x;
}

torch::Tensor GptImpl::Head(const torch::Tensor& x) {
  // Every rank's logits depend on the whole of x: its gradient is summed.
  const torch::Tensor normed = CopyToTensorRegion(ln_f(x), tensor_);
  std::vector<torch::Tensor> logits;
  for (const torch::Tensor& w : OutputLayer().pieces) logits.push_back(MatMul(normed, w.t(), *mode_));
  return logits.size() == 1 ? logits[0] : at::cat(logits, -1);
}

torch::Tensor GptImpl::HeadLoss(const torch::Tensor& x, const torch::Tensor& targets) {
  if (tensor_->size() > 1) return Loss(Head(x), targets);
  if (vocab_pieces() > 1) {
    const torch::Tensor normed = HeadNorm(x);
    std::vector<torch::Tensor> stats;
    for (int k = 0; k < vocab_pieces(); ++k) stats.push_back(HeadPieceStats(k, normed, targets));
    return CombineHeadStats(stats);
  }
  const torch::Tensor normed = ln_f(x);
  return LmHeadCrossEntropy(normed.reshape({-1, normed.size(-1)}), OutputLayer().weight, targets.reshape({-1}),
                            /*slice_rows=*/4096, /*native=*/Reduced(*mode_) && !mode_->upcast, mode_->claims);
}

torch::Tensor GptImpl::HeadNorm(const torch::Tensor& x) {
  const torch::Tensor normed = ln_f(x);
  return normed.reshape({-1, normed.size(-1)}).to(at::kFloat);
}

torch::Tensor GptImpl::HeadPieceStats(int k, const torch::Tensor& normed, const torch::Tensor& targets) {
  VocabParallelEmbeddingImpl& out = OutputLayer();
  return LmHeadPieceStats(normed, out.pieces.at(static_cast<size_t>(k)),
                          targets.reshape({-1}) - out.piece_rows(k).begin,
                          /*slice_rows=*/4096, /*native=*/Reduced(*mode_) && !mode_->upcast, mode_->claims);
}

torch::Tensor GptImpl::CombineHeadStats(const std::vector<torch::Tensor>& stats) {
  const torch::Tensor all = at::stack(stats, 0);  // [pieces, rows, 2]
  return (at::logsumexp(all.select(2, 0), 0) - all.select(2, 1).sum(0)).mean();
}

torch::Tensor GptImpl::PieceLogits(int k, const torch::Tensor& normed_rows) {
  const at::Tensor& piece = OutputLayer().pieces.at(static_cast<size_t>(k));
  return RowsTimesTransposed(normed_rows.to(at::kFloat), piece.to(at::kFloat));
}

torch::Tensor GptImpl::LastLogits(const torch::Tensor& x) {
  TORCH_CHECK(tensor_->size() == 1, "LastLogits needs the whole vocabulary (a tensor group of one)");
  // One position's row of the head: [batch, hidden] x [hidden, vocab], in
  // fp32 whatever the weights' type.
  const torch::Tensor normed = ln_f(x.select(1, x.size(1) - 1));
  std::vector<torch::Tensor> logits;
  for (int k = 0; k < OutputLayer().piece_count(); ++k) logits.push_back(PieceLogits(k, normed));
  return logits.size() == 1 ? logits[0] : at::cat(logits, -1);
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
