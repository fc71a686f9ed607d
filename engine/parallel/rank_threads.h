#pragma once

// Runs ranks as threads of the test process, each with its own Gloo
// communicator over one in-process store: multi-rank tests without
// processes or ports, as c10d's own tests run them.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/parallel/communicator.h"

namespace ferry {

// `intact`: the body leaves the group usable, so the ranks can wait for
// each other before tearing it down; false for a test that breaks it on
// purpose (a collective after a timeout is undefined in Gloo).
inline void RunRanks(int size, const std::function<void(int rank, Communicator* comm)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30), bool intact = true) {
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions options;
      options.name = "test";
      options.timeout = timeout;
      absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(store, r, size, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      // Every rank connected before any uses the group, and done with it
      // before any tears it down (a rank that closes its connections early
      // fails its peers' pending ones).
      try {
        (*comm)->Barrier();
      } catch (const CollectiveException& e) {
        FAIL() << e.what();
      }
      body(r, comm->get());
      if (!intact) return;
      try {
        (*comm)->Barrier();
      } catch (const CollectiveException& e) {
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace ferry
