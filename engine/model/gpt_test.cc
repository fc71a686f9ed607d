#include "engine/model/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "engine/parallel/communicator.h"

namespace ferry {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.vocab_size = 50;
  c.seq_len = 16;
  c.dropout = 0.0;
  return c;
}

TEST(GptTest, LogitsHaveBatchTimeVocabShape) {
  torch::manual_seed(0);
  Gpt model(SmallConfig());
  torch::Tensor tokens = torch::randint(0, 50, {3, 10}, torch::kLong);
  torch::Tensor logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, 50}));
}

TEST(GptTest, ParameterCountMatchesConfig) {
  ModelConfig config = SmallConfig();
  Gpt model(config);
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(total, config.ParameterCount());
}

TEST(GptTest, OutputLayerIsTiedToTokenEmbedding) {
  Gpt model(SmallConfig());
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.key().find("lm_head"), std::string::npos) << item.key();
  }
  // Changing wte changes the logits' projection directly.
  torch::Tensor tokens = torch::zeros({1, 1}, torch::kLong);
  torch::Tensor before = model->forward(tokens).detach().clone();
  {
    torch::NoGradGuard no_grad;
    // Not a constant shift: the final LayerNorm's output has zero mean.
    model->wte->weight[7].add_(torch::randn({32}));
  }
  torch::Tensor after = model->forward(tokens).detach();
  EXPECT_GT((after[0][0][7] - before[0][0][7]).abs().item<float>(), 1e-4);
}

TEST(GptTest, FutureTokensDoNotChangeEarlierLogits) {
  torch::manual_seed(1);
  Gpt model(SmallConfig());
  model->eval();
  torch::Tensor a = torch::randint(0, 50, {2, 12}, torch::kLong);
  torch::Tensor b = a.clone();
  // Change every token from position 6 on.
  b.slice(1, 6, 12).copy_((b.slice(1, 6, 12) + 1) % 50);
  torch::Tensor la = model->forward(a);
  torch::Tensor lb = model->forward(b);
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, 6), lb.slice(1, 0, 6), 0, 0))
      << "positions before the change must see identical logits";
  EXPECT_FALSE(torch::allclose(la.slice(1, 6, 12), lb.slice(1, 6, 12)));
}

TEST(GptTest, SameSeedSameInitialisation) {
  torch::manual_seed(42);
  Gpt a(SmallConfig());
  torch::manual_seed(42);
  Gpt b(SmallConfig());
  auto pa = a->parameters();
  auto pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

// Built without its values, the model takes no memory for them, and
// InitialValue in order gives kNow's values and leaves the generator where
// kNow leaves it, bit for bit.
TEST(GptTest, DeferredInitialisationIsTheSameModel) {
  ModelConfig config = SmallConfig();
  config.layers = 3;
  torch::manual_seed(7);
  Gpt now(config);
  const at::Tensor after_now = torch::randn({4});
  torch::manual_seed(7);
  Gpt later(config, nullptr, GptImpl::ParameterInit::kDeferred);
  EXPECT_TRUE(later->deferred());
  const auto built = later->named_parameters();
  const auto expected = now->named_parameters();
  ASSERT_EQ(built.size(), expected.size());
  for (size_t i = 0; i < built.size(); ++i) {
    EXPECT_EQ(built[i].key(), expected[i].key());
    EXPECT_EQ(built[i].value().sizes(), expected[i].value().sizes()) << built[i].key();
    EXPECT_LE(built[i].value().storage().nbytes(), sizeof(float)) << built[i].key() << ": a placeholder";
    const bool drawn = built[i].key().find("ln_") == std::string::npos &&
                       built[i].key().find(".bias") == std::string::npos;
    (void)drawn;
    EXPECT_EQ(later->InitialValueScratchBytes(i), 0u) << built[i].key() << ": drawn in place, or a constant";
  }
  EXPECT_THROW(later->InitialValue(1, at::empty({built[1].value().numel()})), std::logic_error) << "out of order";
  for (size_t i = 0; i < built.size(); ++i) {
    at::Tensor flat = at::empty({built[i].value().numel()});
    later->InitialValue(i, flat);
    EXPECT_TRUE(torch::equal(flat, expected[i].value().detach().reshape({-1}))) << built[i].key();
  }
  EXPECT_FALSE(later->deferred());
  EXPECT_TRUE(torch::equal(torch::randn({4}), after_now)) << "the generator is where kNow leaves it";
  EXPECT_THROW(later->InitialValue(0, at::empty({1})), std::logic_error) << "once each";
}

// What drawing in place relies on: the generator fills a contiguous fp32
// tensor in memory order, so a flat view of a parameter's elements gets the
// numbers its shaped tensor would (Box-Muller in groups of 16 included).
TEST(GptTest, NormalDrawsDependOnlyOnTheNumberOfElements) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{50, 33}, {7, 3}, {1600, 4800}, {17}}) {
    torch::manual_seed(11);
    const at::Tensor shaped = at::empty(shape).normal_(0.0, 0.02);
    torch::manual_seed(11);
    at::Tensor chunk = at::zeros({shaped.numel() + 40});
    chunk.narrow(0, 40, shaped.numel()).normal_(0.0, 0.02);
    EXPECT_TRUE(torch::equal(chunk.narrow(0, 40, shaped.numel()), shaped.reshape({-1}))) << shape.size();
  }
}

TEST(GptTest, RejectsSequencesLongerThanContext) {
  Gpt model(SmallConfig());
  torch::Tensor tokens = torch::zeros({1, 17}, torch::kLong);
  EXPECT_THROW(model->forward(tokens), c10::Error);
}

TEST(GptTest, LossIsLogVocabAtUniformLogits) {
  Gpt model(SmallConfig());
  torch::Tensor logits = torch::zeros({2, 3, 50});
  torch::Tensor targets = torch::randint(0, 50, {2, 3}, torch::kLong);
  EXPECT_NEAR(model->Loss(logits, targets).item<double>(), std::log(50.0), 1e-5);
}

TEST(GptTest, ReducedPrecisionComputesCloseToFp32) {
  for (c10::ScalarType dtype : {torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(5);
    Gpt model(SmallConfig());
    model->eval();
    torch::Tensor tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
    torch::Tensor reference = model->forward(tokens).detach();
    model->to(dtype);
    // The CPU has no fp16 matrix kernels: products run in fp32, results are
    // stored reduced.
    model->SetComputeMode({dtype, /*upcast=*/true});
    torch::Tensor logits = model->forward(tokens);
    EXPECT_EQ(logits.scalar_type(), dtype) << "activations stay reduced";
    EXPECT_LT((logits.to(torch::kFloat) - reference).abs().max().item<float>(), 0.05);
    torch::Tensor targets = torch::randint(0, 50, {2, 12}, torch::kLong);
    torch::Tensor loss = model->Loss(logits, targets);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat) << "the loss is computed in fp32";
    loss.backward();
    for (const auto& item : model->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_EQ(item.value().grad().scalar_type(), dtype) << item.key();
    }
  }
}

TEST(GptTest, GradientsReachEveryParameter) {
  ModelConfig config = SmallConfig();
  Gpt model(config);
  torch::Tensor tokens = torch::randint(0, 50, {2, 8}, torch::kLong);
  torch::Tensor targets = torch::randint(0, 50, {2, 8}, torch::kLong);
  model->Loss(model->forward(tokens), targets).backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
  }
}

// Claims every parameter whose product asks, once each.
struct ClaimAll : public GradientClaims {
  bool Claim(const at::Tensor& param) override {
    return claimed.insert(param.unsafeGetTensorImpl()).second;
  }
  std::set<const c10::TensorImpl*> claimed;
};

// The linear layers and the head write their weights' gradients where the
// weights keep them: a claimed gradient is overwritten with the product,
// one not claimed is added to, as autograd adds to a gradient that exists.
TEST(GptTest, ProductsWriteOrAddTheWeightsGradientsInPlace) {
  ModelConfig config = SmallConfig();
  config.vocab_size = 5000;  // two slices of the head's 4096 rows
  torch::manual_seed(5);
  Gpt model(config);
  const torch::Tensor tokens = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
  auto backward = [&] {
    torch::Tensor x = model->Embed(tokens);
    for (int64_t i = 0; i < model->block_count(); ++i) x = model->block(i).forward(x);
    model->HeadLoss(x, targets).backward();
  };
  backward();  // no gradients yet: autograd keeps what the products return
  std::vector<torch::Tensor> want;
  for (const auto& p : model->parameters()) want.push_back(p.grad().clone());
  for (bool claiming : {true, false}) {
    SCOPED_TRACE(claiming ? "claimed" : "added to");
    for (const auto& p : model->parameters()) p.grad().fill_(1.0);
    ClaimAll all;
    ComputeMode mode = model->compute_mode();
    mode.claims = claiming ? &all : nullptr;
    model->SetComputeMode(mode);
    backward();
    size_t i = 0;
    for (const auto& item : model->named_parameters()) {
      const torch::Tensor& got = item.value().grad();
      if (all.claimed.count(item.value().unsafeGetTensorImpl()) > 0) {
        EXPECT_TRUE(torch::equal(got, want[i])) << item.key() << " is overwritten";
      } else {
        EXPECT_TRUE(torch::allclose(got, want[i] + 1, 1e-6, 1e-6)) << item.key() << " is added to";
      }
      ++i;
    }
    // Every linear layer's weight and the (tied) head's; nothing else.
    EXPECT_EQ(all.claimed.size(), claiming ? size_t(4 * config.layers + 1) : 0u);
  }
}

// A tensor group's shape without a backend: building the model needs only
// its rank and size.
class ShapeOnlyCommunicator : public Communicator {
 public:
  ShapeOnlyCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduce(at::Tensor&, ReduceOp) override { ADD_FAILURE() << "a collective while building"; }
  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor, at::Tensor) override {
    ADD_FAILURE() << "a collective while building";
    return nullptr;
  }
  void AllGatherInto(const at::Tensor&, const at::Tensor&) override {
    ADD_FAILURE() << "a collective while building";
  }
  at::Tensor AllGather(const at::Tensor& t, int64_t) override {
    ADD_FAILURE() << "a collective while building";
    return t;
  }
  void Broadcast(at::Tensor&, int) override { ADD_FAILURE() << "a collective while building"; }
  void Barrier() override { ADD_FAILURE() << "a collective while building"; }

 private:
  const std::string name_ = "tensor";
  int rank_, size_;
};

// In bf16, the MLP's GELU computes in fp32 and rounds once, forward and
// backward, whether or not the products upcast: exactly what autograd gives
// for the GELU of the widened values, rounded back.
TEST(GptTest, ReducedGeluComputesInFp32AndRoundsOnce) {
  ShapeOnlyCommunicator alone(0, 1);
  ModelConfig config = SmallConfig();
  config.dropout = 0;
  for (bool upcast : {false, true}) {
    SCOPED_TRACE(upcast ? "upcast" : "native");
    torch::manual_seed(3);
    auto mode = std::make_shared<ComputeMode>();
    mode->dtype = torch::kBFloat16;
    mode->upcast = upcast;
    Mlp mlp(config, mode, &alone);
    mlp->to(torch::kBFloat16);
    mlp->eval();
    const torch::Tensor x = torch::randn({2, 5, config.hidden}).to(torch::kBFloat16).requires_grad_();
    const torch::Tensor g = torch::randn({2, 5, config.hidden}).to(torch::kBFloat16);
    torch::Tensor out = mlp->forward(x);
    out.backward(g);
    const torch::Tensor dx = x.grad().clone();

    const torch::Tensor x2 = x.detach().clone().requires_grad_();
    const torch::Tensor up = mlp->c_fc->forward(x2);
    const torch::Tensor hidden = at::gelu(up.to(torch::kFloat), "tanh").to(torch::kBFloat16);
    torch::Tensor want = mlp->c_proj->forward(hidden);
    want.backward(g);
    EXPECT_TRUE(torch::equal(out, want));
    EXPECT_TRUE(torch::equal(dx, x2.grad()));
  }
}

// The daemon lays out chunks from ModelParameterShapes without LibTorch: it
// must be the real model's named_parameters, name by name, in order, with
// each rank's element counts.
TEST(GptTest, ParameterShapesMatchTheModel) {
  ModelConfig config = SmallConfig();
  config.layers = 3;
  for (int tensor : {1, 2}) {
    for (int rank = 0; rank < tensor; ++rank) {
      SCOPED_TRACE(testing::Message() << "T=" << tensor << " rank " << rank);
      ShapeOnlyCommunicator comm(rank, tensor);
      Gpt model(config, &comm);
      const std::vector<ParameterShape> shapes = ModelParameterShapes(config, tensor);
      const auto named = model->named_parameters();
      ASSERT_EQ(shapes.size(), named.size());
      int64_t total = 0;
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(shapes[i].name, named[i].key()) << i;
        EXPECT_EQ(shapes[i].numel, named[i].value().numel()) << shapes[i].name;
        total += shapes[i].numel;
        // The trainer's stages: embed, h.0 ... h.(L-1), head.
        const std::string& name = shapes[i].name;
        const int expected = name.rfind("h.", 0) == 0 ? 1 + std::stoi(name.substr(2))
                             : name.rfind("ln_f.", 0) == 0 ? static_cast<int>(config.layers) + 1
                                                           : 0;
        EXPECT_EQ(shapes[i].stage, expected) << name;
      }
      if (tensor == 1) {
        EXPECT_EQ(total, config.ParameterCount());
      } else {
        EXPECT_LT(total, config.ParameterCount());
      }
    }
  }
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// The sliced head with its loss is the model's head and loss: the same loss
// and gradients for every parameter (fp32, within 2e-6 of the largest).
TEST(GptTest, HeadLossIsLossOfHead) {
  ModelConfig config = SmallConfig();
  config.vocab_size = 5000;  // two slices of 4096
  torch::manual_seed(5);
  Gpt model(config);
  torch::Tensor tokens = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
  torch::Tensor targets = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
  auto grads = [&](bool sliced) {
    model->zero_grad();
    torch::Tensor x = model->Embed(tokens);
    for (int64_t i = 0; i < model->block_count(); ++i) x = model->block(i).forward(x);
    torch::Tensor loss = sliced ? model->HeadLoss(x, targets) : model->Loss(model->Head(x), targets);
    loss.backward();
    std::vector<torch::Tensor> g = {loss.detach().reshape({1})};
    for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const std::vector<torch::Tensor> whole = grads(false);
  const std::vector<torch::Tensor> sliced = grads(true);
  ASSERT_EQ(whole.size(), sliced.size());
  EXPECT_NEAR(sliced[0].item<double>(), whole[0].item<double>(), 1e-6 * whole[0].item<double>());
  for (size_t i = 1; i < whole.size(); ++i) {
    const double scale = whole[i].abs().max().item<double>();
    EXPECT_LE((sliced[i] - whole[i]).abs().max().item<double>(), 2e-6 * scale) << "parameter " << i - 1;
  }
}

}  // namespace
}  // namespace ferry
