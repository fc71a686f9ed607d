#include "engine/model/gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/memory/simulated_device.h"
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
// GPT-2's GELU and Llama's SwiGLU in bf16: computed in fp32 and rounded
// once, the values of autograd through the conversions, op for op.
TEST(GptTest, ReducedMlpActivationsComputeInFp32AndRoundOnce) {
  ShapeOnlyCommunicator alone(0, 1);
  for (const ModelConfig& config : {SmallConfig(), *ModelPreset("llama-tiny")}) {
    for (bool upcast : {false, true}) {
      SCOPED_TRACE(absl::StrCat(config.Gated() ? "swiglu" : "gelu", upcast ? ", upcast" : ", native"));
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
      const torch::Tensor dw = mlp->c_fc->weight.grad().clone();
      mlp->zero_grad();

      const torch::Tensor x2 = x.detach().clone().requires_grad_();
      const torch::Tensor up = mlp->c_fc->forward(x2).to(torch::kFloat);
      torch::Tensor hidden;
      if (config.Gated()) {
        const std::vector<torch::Tensor> gate_up = up.chunk(2, -1);
        hidden = at::silu(gate_up[0]) * gate_up[1];
      } else {
        hidden = at::gelu(up, "tanh");
      }
      torch::Tensor want = mlp->c_proj->forward(hidden.to(torch::kBFloat16));
      want.backward(g);
      EXPECT_TRUE(torch::equal(out, want));
      EXPECT_TRUE(torch::equal(dx, x2.grad()));
      EXPECT_TRUE(torch::equal(dw, mlp->c_fc->weight.grad()));
    }
  }
}

// What a block keeps for its backward in bf16 is about half of what it keeps
// in fp32: the reduced values its products and norms need, never fp32 copies
// of the attention's probabilities or of the MLP's gate and up (the widest
// activations).
TEST(GptTest, ReducedBlocksKeepReducedValuesForTheBackward) {
  ShapeOnlyCommunicator alone(0, 1);
  const ModelConfig config = *ModelPreset("llama-tiny");
  const RotaryTables rotary = MakeRotaryTables(config, config.seq_len);
  auto kept = [&](c10::ScalarType type) {
    torch::manual_seed(4);
    auto mode = std::make_shared<ComputeMode>();
    mode->dtype = type;
    Block block(config, rotary, mode, &alone);
    block->to(type);
    const torch::Tensor x = torch::randn({1, config.seq_len, config.hidden}).to(type).requires_grad_();
    SimulatedDevice device(uint64_t{1} << 30);
    const uint64_t before = device.allocated_bytes();
    torch::Tensor out = block->forward(x);
    // The graph holds what the backward needs; the output is not counted.
    const uint64_t held = device.allocated_bytes() - before - out.numel() * out.element_size();
    out.backward(torch::ones_like(out));
    return held;
  };
  const uint64_t fp32 = kept(torch::kFloat), bf16 = kept(torch::kBFloat16);
  EXPECT_LT(double(bf16), 0.55 * double(fp32)) << bf16 << " bytes kept in bf16, " << fp32 << " in fp32";
}

// The daemon lays out chunks from ModelParameterShapes without LibTorch: it
// must be the real model's named_parameters, name by name, in order, with
// each rank's element counts.
TEST(GptTest, ParameterShapesMatchTheModel) {
  ModelConfig config = SmallConfig();
  config.layers = 3;
  ModelConfig pieces = config;  // the vocabulary in pieces of 16, 16, 16 and 2 rows
  pieces.vocab_piece_rows = 16;
  pieces.tied = false;
  for (const ModelConfig& c : {config, pieces}) {
    for (int tensor : {1, 2}) {
      for (int rank = 0; rank < tensor; ++rank) {
        SCOPED_TRACE(testing::Message() << "T=" << tensor << " rank " << rank << " pieces " << c.vocab_piece_rows);
        ShapeOnlyCommunicator comm(rank, tensor);
        Gpt model(c, &comm);
        const ModelStages stages = StagesOf(c, tensor);
        EXPECT_EQ(stages.pieces, c.vocab_piece_rows > 0 && tensor == 1 ? 4 : 1);
        EXPECT_EQ(model->vocab_pieces(), stages.pieces);
        const std::vector<ParameterShape> shapes = ModelParameterShapes(c, tensor);
        const auto named = model->named_parameters();
        ASSERT_EQ(shapes.size(), named.size());
        int64_t total = 0;
        for (size_t i = 0; i < shapes.size(); ++i) {
          EXPECT_EQ(shapes[i].name, named[i].key()) << i;
          EXPECT_EQ(shapes[i].numel, named[i].value().numel()) << shapes[i].name;
          total += shapes[i].numel;
          // The trainer's stages (ModelStages).
          const std::string& name = shapes[i].name;
          std::string base;
          int k = 0;
          int expected = 0;
          if (name.rfind("h.", 0) == 0) {
            expected = stages.block(std::stoi(name.substr(2)));
          } else if (name.rfind("ln_f.", 0) == 0 || name == "lm_head.weight") {
            expected = stages.head();
          } else if (ParseVocabPiece(name, &base, &k)) {
            expected = base == "wte.weight" ? stages.embed(k) : stages.head_piece(k);
          }
          EXPECT_EQ(shapes[i].stage, expected) << name;
        }
        if (tensor == 1) {
          EXPECT_EQ(total, c.ParameterCount());
        } else {
          EXPECT_LT(total, c.ParameterCount());
        }
      }
    }
  }
}

TEST(GptTest, VocabularyPiecesCoverItOnce) {
  ModelConfig c = SmallConfig();
  c.vocab_piece_rows = 16;
  EXPECT_EQ(VocabPieces(c), 4);
  int64_t next = 0;
  for (int k = 0; k < 4; ++k) {
    const VocabRows rows = VocabPieceRows(c, 4, k);
    EXPECT_EQ(rows.begin, next);
    EXPECT_EQ(rows.size, k < 3 ? 16 : 2);
    next += rows.size;
  }
  EXPECT_EQ(next, c.vocab_size);
  EXPECT_EQ(VocabPieces(c, /*tensor_ranks=*/2), 1) << "a tensor group splits the vocabulary already";
  // By size: at most 2^26 elements a piece, rows a multiple of 64.
  ModelConfig big = SmallConfig();
  big.vocab_size = 128256;
  big.hidden = 2048;
  EXPECT_EQ(VocabPieces(big), 4);
  EXPECT_EQ(VocabPieceRows(big, 4, 1).begin, 32064);
  big.hidden = 512;  // 65.7 M elements: one piece
  EXPECT_EQ(VocabPieces(big), 1);
  std::string base;
  int k = -1;
  EXPECT_TRUE(ParseVocabPiece("lm_head.weight_12", &base, &k));
  EXPECT_EQ(base, "lm_head.weight");
  EXPECT_EQ(k, 12);
  EXPECT_FALSE(ParseVocabPiece("wte.weight", &base, &k));
  EXPECT_FALSE(ParseVocabPiece("wte.weight_", &base, &k));
  EXPECT_FALSE(ParseVocabPiece("h.0.wte.weight_1x", &base, &k));
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

namespace ferry {
namespace {

// A vocabulary kept in pieces computes what the whole one does: the model
// built from the same values gives the same logits, and its stage-by-stage
// head (HeadNorm, HeadPieceStats, CombineHeadStats) the same loss and
// gradients as the sliced head of the whole vocabulary -- tied and untied,
// in fp32 and natively in bf16.
TEST(GptTest, VocabularyPiecesComputeAsTheWholeVocabulary) {
  for (bool tied : {true, false}) {
    for (c10::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(testing::Message() << (tied ? "tied " : "untied ") << c10::toString(dtype));
      ModelConfig config = SmallConfig();
      config.vocab_size = 5000;  // pieces of 1792, 1792 and 1416 rows
      config.tied = tied;
      torch::manual_seed(11);
      Gpt whole(config);
      std::map<std::string, at::Tensor> values;
      for (const auto& item : whole->named_parameters()) values[item.key()] = item.value().detach().clone();
      ModelConfig split = config;
      split.vocab_piece_rows = 1792;
      Gpt pieces(split, nullptr, GptImpl::ParameterInit::kDeferred);
      pieces->SetInitialValues([&](const std::string& name, at::Tensor out) { out.copy_(values.at(name)); });
      pieces->Materialize();
      ASSERT_EQ(pieces->vocab_pieces(), 3);
      for (Gpt* m : {&whole, &pieces}) {
        (*m)->to(dtype);
        (*m)->SetComputeMode({dtype, /*upcast=*/false});
      }
      torch::Tensor tokens = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
      torch::Tensor targets = torch::randint(0, config.vocab_size, {2, 12}, torch::kLong);
      const double tolerance = dtype == torch::kFloat ? 2e-6 : 2e-2;
      {
        torch::NoGradGuard no_grad;
        const torch::Tensor a = whole->forward(tokens).to(torch::kFloat);
        const torch::Tensor b = pieces->forward(tokens).to(torch::kFloat);
        EXPECT_LE((a - b).abs().max().item<double>(), tolerance * a.abs().max().item<double>());
      }
      auto run = [&](Gpt& m, bool staged) {
        m->zero_grad();
        torch::Tensor x = m->Embed(tokens);
        if (staged) {
          x = torch::Tensor();
          for (int k = 0; k < m->vocab_pieces(); ++k) x = m->EmbedPiece(k, tokens, x);
        }
        for (int64_t i = 0; i < m->block_count(); ++i) x = m->block(i).forward(x);
        torch::Tensor loss;
        if (staged) {
          const torch::Tensor normed = m->HeadNorm(x);
          EXPECT_EQ(normed.scalar_type(), torch::kFloat);
          std::vector<torch::Tensor> stats;
          for (int k = 0; k < m->vocab_pieces(); ++k) stats.push_back(m->HeadPieceStats(k, normed, targets));
          loss = m->CombineHeadStats(stats);
        } else {
          loss = m->HeadLoss(x, targets);
        }
        loss.backward();
        std::map<std::string, at::Tensor> g;
        g["loss"] = loss.detach().to(torch::kDouble).reshape({1});
        for (const auto& item : m->named_parameters()) g[item.key()] = item.value().grad().to(torch::kDouble);
        return g;
      };
      std::map<std::string, at::Tensor> expected = run(whole, false);
      std::map<std::string, at::Tensor> got = run(pieces, true);
      // The pieces' gradients are rows of the whole one's.
      for (const char* base : {"wte.weight", "lm_head.weight"}) {
        std::vector<at::Tensor> rows;
        for (int k = 0; k < 3; ++k) {
          auto it = got.find(absl::StrCat(base, "_", k));
          if (it == got.end()) break;
          rows.push_back(it->second);
          got.erase(it);
        }
        if (!rows.empty()) got[base] = at::cat(rows, 0);
      }
      ASSERT_EQ(got.size(), expected.size());
      for (const auto& [name, e] : expected) {
        ASSERT_TRUE(got.count(name)) << name;
        const double scale = std::max(1e-12, e.abs().max().item<double>());
        EXPECT_LE((got[name] - e).abs().max().item<double>(), tolerance * scale) << name;
      }
    }
  }
}

}  // namespace
}  // namespace ferry
