#include "engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace ferry {
namespace {

std::string Floats(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), sizeof v);  // x86-64: little-endian
  return s;
}

// The file parses as the format says, checked by an independent reader
// (Python's json and struct), values included.
TEST(SafetensorsTest, PythonReadsWhatWeWrite) {
  std::vector<SafetensorsTensor> tensors = {
      {"wte.weight", "F32", {2, 3}, Floats({1, 2, 3, 4, 5, 6.5f})},
      {"h.0.ln_1.bias", "F32", {3}, Floats({-1, 0, 1})},
      {"odd\"name", "U8", {5}, std::string("\1\2\3\4\5", 5)},
  };
  std::string bytes;
  ASSERT_TRUE(SerializeSafetensors(tensors, {{"format", "pt"}, {"step", "12"}}, &bytes).ok());
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/model.safetensors";
  std::ofstream(path, std::ios::binary) << bytes;
  const std::string script = R"PY(
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
assert (8 + n) % 8 == 0, n
header = json.loads(data[8:8 + n])
body = data[8 + n:]
assert header["__metadata__"] == {"format": "pt", "step": "12"}, header
def floats(name):
    t = header[name]
    a, b = t["data_offsets"]
    return t["shape"], list(struct.unpack("<%df" % ((b - a) // 4), body[a:b]))
assert floats("wte.weight") == ([2, 3], [1, 2, 3, 4, 5, 6.5]), floats("wte.weight")
assert floats("h.0.ln_1.bias") == ([3], [-1, 0, 1])
t = header['odd"name']
assert t["dtype"] == "U8" and body[t["data_offsets"][0]:t["data_offsets"][1]] == bytes([1, 2, 3, 4, 5])
ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
assert ends[0][0] == 0 and all(x[1] == y[0] for x, y in zip(ends, ends[1:])) and ends[-1][1] == len(body)
)PY";
  const std::string script_path = path + ".py";
  std::ofstream(script_path) << script;
  EXPECT_EQ(std::system(("/usr/bin/python3 " + script_path + " " + path).c_str()), 0);
}

TEST(SafetensorsTest, BadTensorsAreRefusedWithTheName) {
  std::string bytes;
  absl::Status s = SerializeSafetensors({{"w", "F32", {2, 2}, Floats({1, 2, 3})}}, {}, &bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("w: 12 bytes for 4 values of F32"), std::string::npos) << s;
  EXPECT_FALSE(SerializeSafetensors({{"w", "F31", {1}, Floats({1})}}, {}, &bytes).ok());
  EXPECT_FALSE(SerializeSafetensors({{"w", "F32", {1}, Floats({1})}, {"w", "F32", {1}, Floats({2})}}, {}, &bytes).ok());
}

}  // namespace
}  // namespace ferry
