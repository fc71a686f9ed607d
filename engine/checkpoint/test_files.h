#pragma once

// Files for the checkpoint tests.

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry::testing {

// A path named `name` under the test's temporary directory, with nothing
// there (an earlier run's leftovers removed).
inline std::string EmptyTestPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::system(("rm -rf '" + path + "'").c_str());
  return path;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void Spit(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

}  // namespace ferry::testing
