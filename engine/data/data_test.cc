#include <fcntl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/data/synthetic_source.h"
#include "engine/data/token_file_source.h"
#include "engine/data/token_file_writer.h"

namespace ferry {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TEST(ByteTokenizerTest, RoundTripsEveryByte) {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  std::vector<uint16_t> tokens = EncodeBytes(text);
  ASSERT_EQ(tokens.size(), 256u);
  EXPECT_EQ(tokens[200], 200);
  EXPECT_EQ(DecodeBytes(tokens), text);
}

TEST(ByteTokenizerTest, PrepareConcatenatesFilesAsLittleEndianUint16AfterTheHeader) {
  const std::string a = TempPath("a.txt"), b = TempPath("b.txt"), out = TempPath("tok.bin");
  WriteFile(a, "hi");
  WriteFile(b, "\xff!");
  std::vector<std::string> seen;
  ByteTokenizer tokenizer;
  absl::StatusOr<PrepareStats> stats = PrepareTokenFile(
      {a, b}, out, tokenizer, [&](const std::string& f, bool done, const PrepareStats&) {
        if (done) seen.push_back(f);
      });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->files, 2);
  EXPECT_EQ(stats->tokens, 4);
  EXPECT_EQ(seen.size(), 2u);
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(out);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tokenizer.kind, "byte");
  EXPECT_EQ(info->token_count, 4);
  std::ifstream in(out, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(info->data_offset), std::string("h\0i\0\xff\0!\0", 8));
}

TEST(ByteTokenizerTest, MissingInputLeavesNoOutput) {
  const std::string out = TempPath("never.bin");
  ByteTokenizer tokenizer;
  absl::StatusOr<PrepareStats> stats = PrepareTokenFile({TempPath("missing.txt")}, out, tokenizer);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST(TokenFileSourceTest, WindowsAreContiguousSlicesOfTheFile) {
  const std::string path = TempPath("count.bin");
  std::string bytes;
  for (int i = 0; i < 1000; ++i) {
    bytes.push_back(static_cast<char>(i & 0xff));
    bytes.push_back(static_cast<char>(i >> 8));
  }
  WriteFile(path, bytes);
  auto source = TokenFileSource::Open(path, /*vocab_size=*/1000, /*window=*/9, /*seed=*/3);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->token_count(), 1000);
  std::vector<int64_t> tokens;
  (*source)->SampleWindows(16, 9, &tokens);
  ASSERT_EQ(tokens.size(), 16u * 9u);
  std::set<int64_t> starts;
  for (int row = 0; row < 16; ++row) {
    starts.insert(tokens[row * 9]);
    for (int j = 1; j < 9; ++j) EXPECT_EQ(tokens[row * 9 + j], tokens[row * 9] + j);
  }
  EXPECT_GT(starts.size(), 8u) << "window starts should vary";
}

TEST(TokenFileSourceTest, SameSeedSameWindows) {
  const std::string path = TempPath("seeded.bin");
  std::string bytes(4000, '\0');
  for (size_t i = 0; i < bytes.size(); i += 2) bytes[i] = static_cast<char>(i % 251);
  WriteFile(path, bytes);
  auto a = TokenFileSource::Open(path, 256, 17, 5);
  auto b = TokenFileSource::Open(path, 256, 17, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int64_t> ta, tb;
  (*a)->SampleWindows(4, 17, &ta);
  (*b)->SampleWindows(4, 17, &tb);
  EXPECT_EQ(ta, tb);
}

// An already open file (opened safely by the caller) reads the same.
TEST(TokenFileSourceTest, FromAnOpenFileReadsTheSame) {
  const std::string path = TempPath("fd.bin");
  std::string bytes(4000, '\0');
  for (size_t i = 0; i < bytes.size(); i += 2) bytes[i] = static_cast<char>(i % 251);
  WriteFile(path, bytes);
  auto a = TokenFileSource::Open(path, 256, 17, 5);
  auto b = TokenFileSource::FromFd(open(path.c_str(), O_RDONLY | O_CLOEXEC), path, 256, 17, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int64_t> ta, tb;
  (*a)->SampleWindows(4, 17, &ta);
  (*b)->SampleWindows(4, 17, &tb);
  EXPECT_EQ(ta, tb);
  auto dir = TokenFileSource::FromFd(open(TempPath("").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), "dir", 256, 17, 5);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TokenFileSourceTest, RejectsBadFilesWithTheFieldAndTheFix) {
  const std::string odd = TempPath("odd.bin");
  WriteFile(odd, "abc");
  auto s = TokenFileSource::Open(odd, 256, 2, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("data.path"), std::string::npos);

  const std::string small = TempPath("small.bin");
  WriteFile(small, std::string(20, '\0'));
  s = TokenFileSource::Open(small, 256, 11, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("seq_len"), std::string::npos);

  const std::string big_token = TempPath("big.bin");
  WriteFile(big_token, std::string("\x01\x00\x00\x01", 4));  // tokens 1 and 256
  s = TokenFileSource::Open(big_token, 256, 2, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("vocab_size"), std::string::npos);

  s = TokenFileSource::Open(TempPath("absent.bin"), 256, 2, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
}

// A tokenizer with a large vocabulary: token i+70000 for byte i.
class WideTokenizer : public Tokenizer {
 public:
  const TokenizerSpec& spec() const override { return spec_; }
  int64_t vocab_size() const override { return 70256; }
  std::vector<uint32_t> Encode(absl::string_view text) override {
    std::vector<uint32_t> ids;
    for (char c : text) ids.push_back(70000u + static_cast<unsigned char>(c));
    return ids;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t>) const override { return std::string(); }

 private:
  TokenizerSpec spec_{"wide", {"relative/wide.model"}};
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TokenFileTest, HeaderRoundTrips) {
  TokenFileInfo info;
  info.tokenizer = {"gpt2", {"/models/vocab.json", "/models/merges \"x\".txt"}};
  info.vocab_size = 50257;
  info.token_bytes = 2;
  info.token_count = 3;
  const std::string header = EncodeTokenFileHeader(info);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.substr(0, 8), "FERRYTOK");
  absl::StatusOr<TokenFileInfo> back = ParseTokenFileHeader(header + std::string(6, '\0'), header.size() + 6, "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->has_header);
  EXPECT_EQ(back->tokenizer, info.tokenizer);
  EXPECT_EQ(back->vocab_size, 50257);
  EXPECT_EQ(back->token_bytes, 2);
  EXPECT_EQ(back->token_count, 3);
  EXPECT_EQ(back->data_offset, header.size());
}

TEST(TokenFileTest, LargeVocabulariesGetUint32TokensAndReadBack) {
  const std::string in = TempPath("wide.txt"), out = TempPath("wide.bin");
  WriteFile(in, std::string("abcdefghij\nklmnop", 17));
  WideTokenizer tokenizer;
  absl::StatusOr<PrepareStats> stats = PrepareTokenFile({in}, out, tokenizer);
  ASSERT_TRUE(stats.ok()) << stats.status();
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(out);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->token_bytes, 4);
  EXPECT_EQ(info->vocab_size, 70256);
  EXPECT_EQ(info->token_count, 17);
  EXPECT_EQ(info->data_offset % 8, 0u);
  // Recorded absolute.
  ASSERT_EQ(info->tokenizer.files.size(), 1u);
  EXPECT_EQ(info->tokenizer.files[0][0], '/');
  auto source = TokenFileSource::Open(out, 70256, 17, 1);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<int64_t> tokens;
  (*source)->SampleWindows(1, 17, &tokens);
  EXPECT_EQ(tokens[0], 70000 + 'a');
  EXPECT_EQ(tokens[10], 70000 + '\n');
  EXPECT_EQ(tokens[16], 70000 + 'p');
  // A model with a smaller vocabulary: refused naming both sizes.
  auto small = TokenFileSource::Open(out, 50000, 17, 1);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("70256"), std::string::npos);
  EXPECT_NE(small.status().message().find("50000"), std::string::npos);
}

TEST(TokenFileTest, FlatFilesStillReadAsUint16WithoutATokenizer) {
  const std::string path = TempPath("flat.bin");
  WriteFile(path, std::string("a\0b\0c\0", 6));
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_header);
  EXPECT_TRUE(info->tokenizer.kind.empty());
  EXPECT_EQ(info->vocab_size, 0);
  EXPECT_EQ(info->token_count, 3);
  auto source = TokenFileSource::Open(path, 256, 3, 1);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<int64_t> tokens;
  (*source)->SampleWindows(1, 3, &tokens);
  EXPECT_EQ(tokens, (std::vector<int64_t>{'a', 'b', 'c'}));
}

TEST(TokenFileTest, TruncatedOrDamagedHeadersAreRefusedNamingTheFile) {
  const std::string in = TempPath("h.txt"), good = TempPath("good.bin");
  WriteFile(in, "hello world");
  ByteTokenizer tokenizer;
  ASSERT_TRUE(PrepareTokenFile({in}, good, tokenizer).ok());
  const std::string bytes = ReadAll(good);
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(good);
  ASSERT_TRUE(info.ok()) << info.status();
  const size_t offset = info->data_offset;
  auto damaged = [&](const std::string& name, std::string b, const std::string& expect) {
    const std::string path = TempPath(name);
    WriteFile(path, b);
    absl::StatusOr<TokenFileInfo> r = ReadTokenFileInfo(path);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status();
    auto source = TokenFileSource::Open(path, 256, 2, 1);
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << name;
  };
  damaged("t12.bin", bytes.substr(0, 12), "truncated");
  damaged("t40.bin", bytes.substr(0, 40), "truncated");
  damaged("tdata.bin", bytes.substr(0, bytes.size() - 2), "truncated or appended to");
  damaged("appended.bin", bytes + "xx", "truncated or appended to");
  std::string b = bytes;
  b[8] = 9;
  damaged("version.bin", b, "format version 9");
  b = bytes;
  b[12] = b[13] = b[14] = b[15] = '\xff';
  damaged("length.bin", b, "description of");
  b = bytes;
  b[16] = '[';
  damaged("json.bin", b, "not a JSON object");
  b = bytes;
  b.replace(b.find("\"vocab_size\""), 12, "\"vocab_sizX\"");
  damaged("field.bin", b, "vocab_size");
  b = bytes;
  b.replace(b.find("\"token_bytes\":2"), 15, "\"token_bytes\":3");
  damaged("width.bin", b, "token_bytes");
  EXPECT_GT(offset, 16u);
}

TEST(SyntheticSourceTest, EveryTransitionFollowsTheChain) {
  SyntheticSource source(/*vocab_size=*/64, /*branching=*/3, /*chain_seed=*/1, /*sample_seed=*/2);
  std::vector<int64_t> tokens;
  source.SampleWindows(32, 20, &tokens);
  std::map<int64_t, std::set<int64_t>> seen;
  for (int row = 0; row < 32; ++row) {
    for (int j = 1; j < 20; ++j) {
      const int64_t prev = tokens[row * 20 + j - 1], next = tokens[row * 20 + j];
      ASSERT_GE(next, 0);
      ASSERT_LT(next, 64);
      const int64_t* succ = source.successors(prev);
      EXPECT_TRUE(next == succ[0] || next == succ[1] || next == succ[2]);
      seen[prev].insert(next);
    }
  }
  for (const auto& [token, nexts] : seen) EXPECT_LE(nexts.size(), 3u);
}

TEST(SyntheticSourceTest, SuccessorsAreDistinctAndTheChainDependsOnlyOnItsSeed) {
  SyntheticSource a(100, 4, 7, 1), b(100, 4, 7, 99), c(100, 4, 8, 1);
  bool differs = false;
  for (int64_t t = 0; t < 100; ++t) {
    std::set<int64_t> s(a.successors(t), a.successors(t) + 4);
    EXPECT_EQ(s.size(), 4u);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(a.successors(t)[k], b.successors(t)[k]);
    for (int k = 0; k < 4; ++k) differs |= a.successors(t)[k] != c.successors(t)[k];
  }
  EXPECT_TRUE(differs);
}

// A saved position resumes the window sequence exactly: what a checkpoint
// needs to continue the same training.
TEST(TokenSourceTest, ARestoredPositionDrawsTheSameWindows) {
  SyntheticSource synthetic(64, 2, 1, 9);
  std::vector<int64_t> first, again;
  synthetic.SampleWindows(3, 8, &first);
  const std::string position = synthetic.SavePosition();
  synthetic.SampleWindows(5, 8, &first);
  ASSERT_TRUE(synthetic.RestorePosition(position).ok());
  synthetic.SampleWindows(5, 8, &again);
  EXPECT_EQ(first, again);

  absl::Status wrong = synthetic.RestorePosition("file 1 2 3");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("saved by a file source, not a synthetic one"), std::string::npos) << wrong;
  EXPECT_EQ(synthetic.RestorePosition("synthetic nonsense").code(), absl::StatusCode::kInvalidArgument);
  // A failed restore leaves the position as it was.
  synthetic.SampleWindows(5, 8, &first);
  ASSERT_TRUE(synthetic.RestorePosition(position).ok());
  synthetic.SampleWindows(5, 8, &again);
  synthetic.SampleWindows(5, 8, &again);
  EXPECT_EQ(first, again);
}

}  // namespace
}  // namespace ferry
