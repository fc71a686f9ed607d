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

inline void RunRanks(int size, const std::function<void(int rank, Communicator* comm)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions options;
      options.name = "test";
      options.timeout = timeout;
      absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(store, r, size, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, comm->get());
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace ferry
