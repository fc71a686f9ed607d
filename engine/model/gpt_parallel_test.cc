// The tensor-parallel GPT against the whole one, with ranks as threads.

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "engine/common/cpu_generator.h"
#include "engine/model/gpt.h"
#include "engine/parallel/rank_threads.h"

namespace ferry {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.vocab_size = 64;
  c.seq_len = 16;
  c.dropout = 0.1;
  return c;
}

constexpr uint64_t kInitSeed = 7;
constexpr uint64_t kDropoutSeed = 11;

struct Whole {
  torch::Tensor tokens, targets, logits;
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

// The whole model's step, on the test's thread.
Whole RunWhole() {
  Whole w;
  torch::manual_seed(3);
  w.tokens = torch::randint(Config().vocab_size, {2, Config().seq_len});
  w.targets = torch::randint(Config().vocab_size, {2, Config().seq_len});
  torch::manual_seed(kInitSeed);
  Gpt model(Config());
  CpuGeneratorScope dropout(at::make_generator<at::CPUGeneratorImpl>(kDropoutSeed));
  w.logits = model->forward(w.tokens);
  torch::Tensor loss = model->Loss(w.logits, w.targets);
  loss.backward();
  w.loss = loss.item<double>();
  for (const auto& p : model->named_parameters()) w.grads[p.key()] = p.value().grad().clone();
  w.logits = w.logits.detach();
  return w;
}

bool Close(const torch::Tensor& a, const torch::Tensor& b) { return torch::allclose(a, b, 1e-5, 1e-6); }

// T = 2 and 4: each rank's logits are its slice of the whole model's, the
// loss is the whole model's, and every gradient is its part of the whole
// one's, with dropout on: the same training whatever T.
TEST(GptParallelTest, ShardedModelComputesTheWholeOne) {
  const Whole whole = RunWhole();
  std::mutex construction;  // the default generator is shared by the rank threads
  for (int tensor : {2, 4}) {
    SCOPED_TRACE(tensor);
    RunRanks(tensor, [&](int rank, Communicator* comm) {
      Gpt model{nullptr};
      {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(kInitSeed);
        model = Gpt(Config(), comm);
      }
      CpuGeneratorScope dropout(at::make_generator<at::CPUGeneratorImpl>(kDropoutSeed));
      torch::Tensor logits = model->forward(whole.tokens);
      const int64_t part = Config().vocab_size / tensor;
      EXPECT_TRUE(Close(logits, whole.logits.narrow(2, rank * part, part)));
      torch::Tensor loss = model->Loss(logits, whole.targets);
      EXPECT_NEAR(loss.item<double>(), whole.loss, 1e-5);
      loss.backward();
      for (const auto& p : model->named_parameters()) {
        EXPECT_TRUE(Close(p.value().grad(), TensorParallelPart(model->config(), p.key(), whole.grads.at(p.key()), *comm)))
            << p.key();
      }
    });
  }
}

// Megatron's count: a transformer block at T > 1 all-reduces two
// activations of batch x seq x hidden in the forward (after attention and
// after the MLP) and two in the backward (before each), and nothing else.
TEST(GptParallelTest, ABlockAllReducesTwiceEachWay) {
  RunRanks(2, [](int, Communicator* group) {
    CountingCommunicator comm(group);
    ModelConfig c = Config();
    c.dropout = 0;
    Gpt model(c, &comm);
    torch::Tensor x = torch::ones({3, 8, c.hidden}).requires_grad_(true);
    torch::Tensor y = model->block(0).forward(x);
    const uint64_t activation = 3 * 8 * c.hidden * 4;
    EXPECT_EQ(comm.Count(Collective::kAllReduce), 2);
    EXPECT_EQ(comm.Bytes(Collective::kAllReduce), 2 * activation);
    EXPECT_EQ(comm.calls().size(), 2u);
    comm.Reset();
    y.sum().backward();
    EXPECT_EQ(comm.Count(Collective::kAllReduce), 2);
    EXPECT_EQ(comm.Bytes(Collective::kAllReduce), 2 * activation);
    EXPECT_EQ(comm.calls().size(), 2u);
  });
}

TEST(GptParallelTest, HeadsThatDoNotSplitAreRefused) {
  RunRanks(3, [](int, Communicator* comm) {
    ModelConfig c = Config();
    c.vocab_size = 63;
    c.hidden = 48;
    c.heads = 4;
    EXPECT_THROW(Gpt(c, comm), std::invalid_argument);
  });
}

}  // namespace
}  // namespace ferry
