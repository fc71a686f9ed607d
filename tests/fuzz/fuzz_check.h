#pragma once

// A fuzzer's own check failing: the message, then abort, which libFuzzer
// reports as a crash and saves the input for.

#include <cstdio>
#include <cstdlib>
#include <string>

namespace ferry::fuzz {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s\n", what.c_str());
  std::abort();
}

}  // namespace ferry::fuzz
