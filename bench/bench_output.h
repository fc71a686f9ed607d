#pragma once

// Where a benchmark's JSON goes: --out if given, else
// bench/results/NAME.json under the workspace (`bazel run` sets
// BUILD_WORKSPACE_DIRECTORY), else under the current directory.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace ferry {

// `s` as a JSON string literal (line breaks become spaces).
inline std::string JsonString(const std::string& s) {
  std::string e = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') e += '\\';
    e += ch == '\n' ? ' ' : ch;
  }
  return e + "\"";
}

// `v` as a JSON list of numbers (6 significant digits).
inline std::string JsonList(const std::vector<double>& v) {
  std::string out = "[";
  char number[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(number, sizeof number, "%.6g", v[i]);
    out += (i == 0 ? "" : ", ") + std::string(number);
  }
  return out + "]";
}

// Writes `json` and says where; returns the process exit code.
inline int WriteBenchResult(const std::string& name, const std::string& out_flag, const std::string& json) {
  std::string out = out_flag;
  if (out.empty()) {
    const char* root = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    out = std::string(root ? root : ".") + "/bench/results/" + name + ".json";
  }
  std::ofstream file(out);
  file << json;
  if (!file) {
    std::fprintf(stderr, "%s: cannot write %s\n", name.c_str(), out.c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace ferry
