#include "engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

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

std::string TestPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name;
}

std::string Example() {
  std::string bytes;
  EXPECT_TRUE(SerializeSafetensors({{"wte.weight", "F32", {2, 3}, Floats({1, 2, 3, 4, 5, 6.5f})},
                                    {"h.0.ln_1.bias", "BF16", {3}, std::string("\1\2\3\4\5\6", 6)}},
                                   {{"format", "pt"}}, &bytes)
                  .ok());
  return bytes;
}

// The 8-byte length, the header, then the data: the header as JSON text.
std::string WithHeader(const std::string& json, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xff));
  return out + json + data;
}

absl::Status ParseError(const std::string& bytes) {
  return ParseSafetensorsIndex(bytes, bytes.size(), "m.safetensors").status();
}

TEST(SafetensorsTest, ReadsBackWhatWasWritten) {
  const std::string bytes = Example();
  const std::string path = TestPath("round.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsIndex& index = reader->index();
  ASSERT_EQ(index.tensors.size(), 2u);
  EXPECT_EQ(index.metadata.at("format"), "pt");
  const SafetensorsEntry* wte = index.Find("wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->dtype, "F32");
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(wte->numel(), 6);
  std::string values(24, '\0');
  ASSERT_TRUE(reader->Read(*wte, 0, 24, values.data()).ok());
  EXPECT_EQ(values, Floats({1, 2, 3, 4, 5, 6.5f}));
  std::string part(4, '\0');
  ASSERT_TRUE(reader->Read(*wte, 20, 4, part.data()).ok());
  EXPECT_EQ(part, Floats({6.5f}));
  EXPECT_EQ(reader->Read(*wte, 20, 8, part.data()).code(), absl::StatusCode::kInvalidArgument);
  const SafetensorsEntry* bias = index.Find("h.0.ln_1.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->bytes, 6u);
  EXPECT_EQ(index.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(SafetensorsReader::Open(TestPath("absent.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

// Written a tensor at a time, in another order than the file's: the same
// bytes as the whole file serialised at once.
TEST(SafetensorsTest, AFileWrittenATensorAtATimeIsTheSameFile) {
  const std::vector<SafetensorsTensor> tensors = {
      {"wte.weight", "F32", {2, 3}, Floats({1, 2, 3, 4, 5, 6.5f})},
      {"h.0.ln_1.bias", "F32", {3}, Floats({-1, 0, 1})},
      {"empty", "F32", {0, 4}, ""},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  std::string whole;
  ASSERT_TRUE(SerializeSafetensors(tensors, metadata, &whole).ok());
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  const std::string path = TestPath("streamed.safetensors");
  {
    absl::StatusOr<SafetensorsFileWriter> writer = SafetensorsFileWriter::Create(path, entries, metadata);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ(writer->file_bytes(), whole.size());
    ASSERT_TRUE(writer->Write("h.0.ln_1.bias", tensors[1].data.data(), tensors[1].data.size()).ok());
    EXPECT_EQ(writer->Write("h.0.ln_1.bias", tensors[1].data.data(), tensors[1].data.size()).code(),
              absl::StatusCode::kInvalidArgument)
        << "twice";
    EXPECT_EQ(writer->Write("wte.weight", tensors[0].data.data(), 4).code(), absl::StatusCode::kInvalidArgument)
        << "short";
    EXPECT_EQ(writer->Write("lm_head.weight", "", 0).code(), absl::StatusCode::kInvalidArgument) << "not in it";
    const absl::Status unfinished = writer->Finish();
    EXPECT_EQ(unfinished.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(unfinished.message().find("wte.weight was not written"), std::string::npos) << unfinished;
  }
  EXPECT_FALSE(std::ifstream(path).good()) << "nothing is left of an unfinished file";
  absl::StatusOr<SafetensorsFileWriter> writer = SafetensorsFileWriter::Create(path, entries, metadata);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int i : {2, 1, 0}) {
    ASSERT_TRUE(writer->Write(tensors[i].name, tensors[i].data.data(), tensors[i].data.size()).ok()) << i;
  }
  ASSERT_TRUE(writer->Finish().ok());
  std::ifstream in(path, std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, whole);
}

TEST(SafetensorsTest, ATruncatedFileIsRefusedWithTheNumbers) {
  const std::string bytes = Example();
  // Cut inside the header: it claims more than the file holds.
  absl::Status header = ParseError(bytes.substr(0, 20));
  EXPECT_EQ(header.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(header.message().find("m.safetensors: not a valid safetensors file: the header claims"), std::string::npos)
      << header;
  EXPECT_NE(header.message().find("but the file holds 12 after its length"), std::string::npos) << header;
  // Cut inside the data: the last tensor's range leaves the file.
  absl::Status data = ParseError(bytes.substr(0, bytes.size() - 2));
  EXPECT_NE(data.message().find("tensor 'h.0.ln_1.bias': data_offsets [24, 30] lie outside the file's 28 bytes"),
            std::string::npos)
      << data;
  // And from a file on disk.
  const std::string path = TestPath("cut.safetensors");
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 7);
  EXPECT_EQ(SafetensorsReader::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseError("1234").code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, AMalformedIndexIsRefusedNamingTheTensor) {
  const std::string eight(8, 'x');
  auto message = [&](const std::string& json, const std::string& data) {
    return std::string(ParseError(WithHeader(json, data)).message());
  };
  EXPECT_NE(message(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", eight)
                .find("tensor 'w': data_offsets [0, 8] hold 8 bytes but shape [2, 2] of F32 needs 16"),
            std::string::npos);
  EXPECT_NE(message(R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", eight).find("unknown dtype 'F31'"),
            std::string::npos);
  EXPECT_NE(message(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight)
                .find("tensor 'w': a dimension that is not a whole number"),
            std::string::npos);
  EXPECT_NE(message(R"({"w":{"dtype":"F32","shape":[2]}})", eight).find("tensor 'w': dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(message(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    eight + "1234")
                .find("(overlapping)"),
            std::string::npos);
  EXPECT_NE(message(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight).find("(a gap)"),
            std::string::npos);
  EXPECT_NE(message(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight)
                .find("the tensors' data ends at data byte 4 of 8"),
            std::string::npos);
  EXPECT_NE(message(R"({"__metadata__":{"n":1}})", "").find("__metadata__ 'n' is not a string"), std::string::npos);
  EXPECT_NE(message("[1, 2]", "").find("not a JSON object"), std::string::npos);
  EXPECT_NE(message(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", eight)
                .find("needs more than the file holds"),
            std::string::npos);
  // A valid empty file: no tensors.
  absl::StatusOr<SafetensorsIndex> empty = ParseSafetensorsIndex(WithHeader("{}", ""), 10, "e");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors.empty());
}

}  // namespace
}  // namespace ferry
