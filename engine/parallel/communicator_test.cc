#include "engine/parallel/communicator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <string>

#include "engine/parallel/rank_threads.h"

namespace ferry {
namespace {

TEST(CommunicatorTest, CollectivesOverGloo) {
  RunRanks(3, [](int rank, Communicator* comm) {
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), 3);
    at::Tensor t = at::full({4}, float(rank + 1));
    comm->AllReduce(t);
    EXPECT_TRUE(at::equal(t, at::full({4}, 6.0f)));
    at::Tensor m = at::full({2}, float(rank));
    comm->AllReduce(m, ReduceOp::kMax);
    EXPECT_TRUE(at::equal(m, at::full({2}, 2.0f)));
    at::Tensor g = comm->AllGather(at::full({2, 1}, float(rank)), 1);
    EXPECT_TRUE(at::equal(g, torch::tensor({0.0f, 1.0f, 2.0f}).repeat({2, 1})));
    // Non-contiguous tensors are reduced in place too.
    at::Tensor wide = at::full({3, 2}, float(rank)).t();
    comm->AllReduce(wide);
    EXPECT_TRUE(at::equal(wide, at::full({2, 3}, 3.0f)));
    at::Tensor b = at::full({3}, rank == 1 ? 7.0f : 0.0f);
    comm->Broadcast(b, 1);
    EXPECT_TRUE(at::equal(b, at::full({3}, 7.0f)));
    comm->Barrier();
  });
}

// Gloo has no bf16 collectives of its own: bf16 tensors travel as fp32 and
// come back bf16, in place, the sum rounded once.
TEST(CommunicatorTest, Bf16CollectivesOverGloo) {
  RunRanks(2, [](int rank, Communicator* comm) {
    at::Tensor t = at::full({5}, 1.0 + rank * 0.00390625, at::kBFloat16);  // 1 and 1 + 2^-8
    comm->AllReduce(t);
    EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(t, at::full({5}, 2.0, at::kBFloat16))) << "2 + 2^-8 rounds to 2 in bf16";
    at::Tensor pending = at::full({3}, float(rank + 1), at::kBFloat16);
    comm->StartAllReduce(pending)->Wait();
    EXPECT_TRUE(at::equal(pending, at::full({3}, 3.0, at::kBFloat16)));
    at::Tensor g = comm->AllGather(at::full({1}, float(rank), at::kBFloat16), 0);
    EXPECT_EQ(g.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(g, torch::tensor({0.0f, 1.0f}).to(at::kBFloat16)));
    at::Tensor b = at::full({2}, rank == 0 ? 0.5 : 0.0, at::kBFloat16);
    comm->Broadcast(b, 0);
    EXPECT_TRUE(at::equal(b, at::full({2}, 0.5, at::kBFloat16)));
  });
}

// Reduce-scatter and all-gather into place: each rank's block of the sum,
// then every rank's block back in rank order -- together an all-reduce.
TEST(CommunicatorTest, ReduceScatterAndAllGatherIntoPlace) {
  for (int size : {2, 3, 4}) {
    RunRanks(size, [size](int rank, Communicator* comm) {
      // Rank r's input: element i is (r + 1) * (i + 1).
      const at::Tensor input = (at::arange(1, 2 * size + 1, at::kFloat) * float(rank + 1)).contiguous();
      at::Tensor block = at::empty({2});
      comm->ReduceScatter(input, block);
      const float ranks_sum = float(size * (size + 1) / 2);
      EXPECT_TRUE(at::equal(block, at::arange(2 * rank + 1, 2 * rank + 3, at::kFloat) * ranks_sum))
          << "rank " << rank << " of " << size << ": " << block;
      at::Tensor whole = at::zeros({2 * size});
      whole.narrow(0, 2 * rank, 2).copy_(block);
      comm->AllGatherInto(whole.narrow(0, 2 * rank, 2), whole);
      EXPECT_TRUE(at::equal(whole, at::arange(1, 2 * size + 1, at::kFloat) * ranks_sum));
      // In the background: nothing touches the tensors until Wait.
      at::Tensor later = at::empty({2});
      std::unique_ptr<PendingCollective> pending = comm->StartReduceScatter(input, later);
      pending->Wait();
      EXPECT_TRUE(at::equal(later, block));
    });
  }
  // bf16 travels as fp32 and is rounded once, after the sum.
  RunRanks(2, [](int rank, Communicator* comm) {
    const at::Tensor input = at::full({4}, 1.0 + rank * 0.00390625, at::kBFloat16);
    at::Tensor block = at::empty({2}, at::kBFloat16);
    comm->ReduceScatter(input, block);
    EXPECT_TRUE(at::equal(block, at::full({2}, 2.0, at::kBFloat16)));
    at::Tensor whole = at::zeros({4}, at::kBFloat16);
    comm->AllGatherInto(at::full({2}, 0.5 + rank, at::kBFloat16), whole);
    EXPECT_TRUE(at::equal(whole, torch::tensor({0.5f, 0.5f, 1.5f, 1.5f}).to(at::kBFloat16)));
    EXPECT_THROW(comm->ReduceScatter(at::ones({3}), at::empty({1})), std::invalid_argument);
  });
  // A group of one: the identity.
  std::unique_ptr<Communicator> solo = MakeSoloCommunicator("data");
  at::Tensor out = at::empty({3});
  solo->ReduceScatter(at::arange(3, at::kFloat), out);
  EXPECT_TRUE(at::equal(out, at::arange(3, at::kFloat)));
}

TEST(CommunicatorTest, CountingCountsCallsAndBytes) {
  RunRanks(2, [](int, Communicator* comm) {
    CountingCommunicator counting(comm);
    at::Tensor t = at::ones({8, 4});
    counting.AllReduce(t);
    counting.AllReduce(t);
    counting.AllGather(at::ones({3}), 0);
    EXPECT_EQ(counting.Count(Collective::kAllReduce), 2);
    EXPECT_EQ(counting.Bytes(Collective::kAllReduce), 2u * 8 * 4 * 4);
    EXPECT_EQ(counting.Count(Collective::kAllGather), 1);
    EXPECT_EQ(counting.Bytes(Collective::kAllGather), 12u);
    // What a ring sends: an all-reduce twice a reduce-scatter of the same
    // tensor, a reduce-scatter and an all-gather of its shard one each.
    EXPECT_EQ(counting.WireBytes(), 2 * 128u + 12u);
    counting.Reset();
    at::Tensor shard = at::empty({16});
    counting.ReduceScatter(t.view(-1), shard);
    counting.AllGatherInto(shard, t.view(-1));
    EXPECT_EQ(counting.WireBytes(), 128u) << "reduce-scatter + all-gather = one all-reduce";
  });
}

TEST(CommunicatorTest, AMissingRankFailsTheCollectiveWithItsName) {
  std::atomic<bool> done{false};
  std::string message;
  RunRanks(
      2,
      [&](int rank, Communicator* comm) {
        if (rank == 1) {
          // Never joins the all-reduce; stays until rank 0 has given up.
          while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        at::Tensor t = at::ones({4});
        try {
          comm->AllReduce(t);
        } catch (const CollectiveException& e) {
          message = e.what();
        }
        done = true;
      },
      std::chrono::milliseconds(500), /*intact=*/false);
  EXPECT_NE(message.find("all-reduce in the test group (rank 0 of 2) failed"), std::string::npos) << message;
}

TEST(CommunicatorTest, SoloIsTheIdentity) {
  std::unique_ptr<Communicator> solo = MakeSoloCommunicator("tensor");
  at::Tensor t = at::arange(4).to(at::kFloat);
  solo->AllReduce(t);
  EXPECT_TRUE(at::equal(t, at::arange(4).to(at::kFloat)));
  EXPECT_TRUE(at::equal(solo->AllGather(t, 0), t));
  EXPECT_EQ(solo->size(), 1);
}

TEST(CommunicatorTest, BadRanksAreRefused) {
  EXPECT_EQ(CreateGlooCommunicator(MakeInProcessStore(), 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
