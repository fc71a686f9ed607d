#include "engine/parallel/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/parallel/rank_threads.h"

namespace ferry {
namespace {

constexpr double kTol = 1e-5;

bool Close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, kTol, kTol); }

// The unsharded weights and inputs, made once on the test's thread (the
// default generator is shared by the rank threads).
struct MlpCase {
  int64_t batch = 3, seq = 5, hidden = 8;
  at::Tensor x, fc_w, fc_b, proj_w, proj_b;
  MlpCase() {
    torch::manual_seed(3);
    x = torch::randn({batch, seq, hidden});
    fc_w = torch::randn({4 * hidden, hidden}) * 0.3;
    fc_b = torch::randn({4 * hidden}) * 0.1;
    proj_w = torch::randn({hidden, 4 * hidden}) * 0.3;
    proj_b = torch::randn({hidden}) * 0.1;
  }
};

// A Megatron MLP (column-parallel, GELU, row-parallel) at T = 2 and 4 gives
// the unsharded MLP's output and gradients, with one all-reduce of
// batch x seq x hidden in the forward and one in the backward.
TEST(TensorParallelTest, MlpMatchesTheUnshardedLayerWithOneAllReduceEachWay) {
  const MlpCase c;
  for (int tensor : {1, 2, 4}) {
    SCOPED_TRACE(tensor);
    RunRanks(tensor, [&](int, Communicator* group) {
      CountingCommunicator comm(group);
      // Reference, on every rank.
      at::Tensor x_ref = c.x.clone().requires_grad_(true);
      at::Tensor fc_w = c.fc_w.clone().requires_grad_(true);
      at::Tensor proj_w = c.proj_w.clone().requires_grad_(true);
      at::Tensor y_ref = at::linear(at::gelu(at::linear(x_ref, fc_w, c.fc_b)), proj_w, c.proj_b);
      y_ref.pow(2).sum().backward();

      ColumnParallelLinear fc(c.hidden, 4 * c.hidden, &comm);
      RowParallelLinear proj(4 * c.hidden, c.hidden, &comm);
      fc->LoadShard(c.fc_w, c.fc_b);
      proj->LoadShard(c.proj_w, c.proj_b);
      at::Tensor x = c.x.clone().requires_grad_(true);
      at::Tensor y = proj(at::gelu(fc(x)));
      EXPECT_TRUE(Close(y, y_ref));
      const int64_t activation_bytes = c.batch * c.seq * c.hidden * 4;
      EXPECT_EQ(comm.Count(Collective::kAllReduce), tensor > 1 ? 1 : 0);
      comm.Reset();
      y.pow(2).sum().backward();
      EXPECT_EQ(comm.Count(Collective::kAllReduce), tensor > 1 ? 1 : 0);
      if (tensor > 1) {
        EXPECT_EQ(comm.Bytes(Collective::kAllReduce), static_cast<uint64_t>(activation_bytes));
      }
      EXPECT_TRUE(Close(x.grad(), x_ref.grad()));
      const Shard rows = ShardOf(4 * c.hidden, comm);
      EXPECT_TRUE(Close(fc->weight.grad(), fc_w.grad().narrow(0, rows.begin, rows.size())));
      EXPECT_TRUE(Close(proj->weight.grad(), proj_w.grad().narrow(1, rows.begin, rows.size())));
    });
  }
}

TEST(TensorParallelTest, GatherAndScatterAreEachOthersInverse) {
  RunRanks(2, [](int rank, Communicator* comm) {
    at::Tensor x = at::arange(12).to(at::kFloat).reshape({3, 4}).requires_grad_(true);
    at::Tensor mine = ScatterToTensorRegion(x, comm);
    EXPECT_TRUE(at::equal(mine, x.detach().narrow(1, 2 * rank, 2)));
    at::Tensor whole = GatherFromTensorRegion(mine * (rank + 1), comm);
    EXPECT_EQ(whole.sizes(), x.sizes());
    whole.sum().backward();
    // Each rank's slice of the gradient comes back through the gather's
    // slicing and the scatter's all-gather.
    at::Tensor expected = at::cat({at::ones({3, 2}), at::full({3, 2}, 2.0)}, 1);
    EXPECT_TRUE(at::equal(x.grad(), expected));
  });
}

// Vocabulary-parallel embedding and cross-entropy: the tied input and output
// of a GPT, sharded by vocabulary rows, match the unsharded ones without
// ever gathering the logits.
TEST(TensorParallelTest, VocabParallelEmbeddingAndCrossEntropyMatchTheUnsharded) {
  torch::manual_seed(5);
  const int64_t vocab = 32, dim = 8;
  const at::Tensor table = torch::randn({vocab, dim});
  const at::Tensor ids = torch::randint(vocab, {4, 6});
  const at::Tensor targets = torch::randint(vocab, {4, 6});
  for (int tensor : {1, 2, 4}) {
    SCOPED_TRACE(tensor);
    RunRanks(tensor, [&](int, Communicator* group) {
      CountingCommunicator comm(group);
      at::Tensor w_ref = table.clone().requires_grad_(true);
      at::Tensor h_ref = at::embedding(w_ref, ids);
      at::Tensor logits_ref = at::matmul(h_ref, w_ref.t());
      at::Tensor loss_ref =
          at::cross_entropy_loss(logits_ref.reshape({-1, vocab}), targets.reshape({-1}));
      loss_ref.backward();

      VocabParallelEmbedding wte(vocab, dim, &comm);
      wte->LoadShard(table);
      at::Tensor h = wte(ids);
      EXPECT_TRUE(Close(h, h_ref.detach()));
      at::Tensor local_logits = at::matmul(CopyToTensorRegion(h, &comm), wte->weight.t());
      EXPECT_EQ(local_logits.size(-1), vocab / tensor);
      at::Tensor loss = VocabParallelCrossEntropy(local_logits, targets, &comm);
      EXPECT_NEAR(loss.item<double>(), loss_ref.item<double>(), kTol);
      loss.backward();
      const Shard rows = wte->rows();
      EXPECT_TRUE(Close(wte->weight.grad(), w_ref.grad().narrow(0, rows.begin, rows.size())));
      // The logits were never gathered.
      EXPECT_EQ(comm.Count(Collective::kAllGather), 0);
    });
  }
}

TEST(TensorParallelTest, AnUnevenSplitIsRefusedWithTheNumbers) {
  RunRanks(2, [](int, Communicator* comm) {
    try {
      ColumnParallelLinear layer(4, 5, comm);
      ADD_FAILURE() << "5 outputs split across 2 ranks";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("5 does not split evenly across the 2 ranks"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace ferry
