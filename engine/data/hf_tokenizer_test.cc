// The hf tokenizer on small tokenizer.json files written here: BPE merging
// (rank, then leftmost; ignore_merges), byte fallback and unk, added tokens
// (leftmost-longest, lstrip/rstrip/single_word as Hugging Face's own unit
// tests have them), normalizers, decoders, the special-token template and
// BOS/EOS, the loader, and the errors for malformed files and what Ferry
// does not support. hf_tokenizer_reference_test compares real files with
// Hugging Face's implementation.

#include "engine/data/hf_tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/test_files.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/text_stream.h"
#include "engine/data/tokenizer_loader.h"

namespace ferry {
namespace {

using json = nlohmann::json;
using Ids = std::vector<uint32_t>;

using testing::EmptyTestPath;
using testing::Spit;

const TokenizerSpec kSpec{kHfTokenizer, {"t.json", "c.json"}};

std::unique_ptr<HfTokenizer> Make(const json& tokenizer, const json& config = nullptr) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t =
      HfTokenizer::FromContents(tokenizer.dump(), config.is_null() ? "" : config.dump(), kSpec);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// A byte-level BPE: the 256 bytes as ids 0..255 (in GPT-2's alphabet), then
// one token per merge (raw bytes; written in the alphabet), ranked in order.
json ByteLevel(const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2TokenText(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(Gpt2TokenText(a + b))) vocab[Gpt2TokenText(a + b)] = static_cast<int>(vocab.size());
    m.push_back(json::array({Gpt2TokenText(a), Gpt2TokenText(b)}));
  }
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"( ?\p{L}+| ?\p{N}+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", ignore_merges}, {"byte_fallback", false}}}};
}

uint32_t Id(HfTokenizer& t, const std::string& raw) {
  std::optional<uint32_t> id = t.TokenId(Gpt2TokenText(raw));
  EXPECT_TRUE(id.has_value()) << raw;
  return id.value_or(0);
}

TEST(HfTokenizerTest, MergesByRankThenLeftmost) {
  std::unique_ptr<HfTokenizer> t = Make(ByteLevel({{"b", "c"}, {"a", "b"}, {"a", "a"}, {"aa", "a"}}));
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->byte_level());
  // "b c" ranks first, so "abc" is a + bc, not ab + c.
  EXPECT_EQ(t->Encode("abc"), (Ids{'a', Id(*t, "bc")}));
  EXPECT_EQ(t->Encode("ab"), (Ids{Id(*t, "ab")}));
  // Ties go to the leftmost pair: aaa -> aa a -> (aa a).
  EXPECT_EQ(t->Encode("aaa"), (Ids{Id(*t, "aaa")}));
  // Every "a a" at rank 2 goes before any "aa a": aaaa -> aa aa, as GPT-2's.
  EXPECT_EQ(t->Encode("aaaa"), (Ids{Id(*t, "aa"), Id(*t, "aa")}));
  // Pieces are merged apart: " abc" is one piece, "ab" then " " then "c" are not.
  EXPECT_EQ(t->Encode("ab\tc"), (Ids{Id(*t, "ab"), '\t', 'c'}));
}

TEST(HfTokenizerTest, IgnoreMergesEmitsAWholeTokenPiece) {
  // "xyz" is in the vocabulary but no merge makes it.
  json j = ByteLevel({{"x", "y"}});
  j["model"]["vocab"]["xyz"] = 300;
  std::unique_ptr<HfTokenizer> plain = Make(j);
  j["model"]["ignore_merges"] = true;
  std::unique_ptr<HfTokenizer> ignoring = Make(j);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(plain->Encode("xyz"), (Ids{Id(*plain, "xy"), 'z'}));
  EXPECT_EQ(ignoring->Encode("xyz"), (Ids{300}));
  EXPECT_EQ(plain->vocab_size(), 301);
}

TEST(HfTokenizerTest, ByteLevelRoundTripsArbitraryBytes) {
  json j = ByteLevel({{"a", "b"}, {" ", "a"}, {"\xc3", "\xa9"}});
  j["normalizer"] = {{"type", "NFC"}};
  std::unique_ptr<HfTokenizer> t = Make(ByteLevel({{"a", "b"}, {" ", "a"}, {"\xc3", "\xa9"}}));
  std::unique_ptr<HfTokenizer> nfc = Make(j);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(nfc, nullptr);
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(round % 2 ? rng() : "ab \n\xc3\xa9\xff\xcc\x81"[rng() % 9]);
    absl::StatusOr<std::string> back = t->Decode(t->Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, bytes) << "round " << round;
    // With NFC: never a crash, ids in range.
    for (uint32_t id : nfc->Encode(bytes)) ASSERT_LT(id, static_cast<uint32_t>(nfc->vocab_size()));
  }
}

TEST(HfTokenizerTest, UnicodeNormalizers) {
  json j = ByteLevel({{"\xc3", "\xa9"}});
  j["normalizer"] = {{"type", "NFC"}};
  std::unique_ptr<HfTokenizer> nfc = Make(j);
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKD"}}}}};
  std::unique_ptr<HfTokenizer> nfkd = Make(j);
  ASSERT_NE(nfc, nullptr);
  ASSERT_NE(nfkd, nullptr);
  const uint32_t e_acute = Id(*nfc, "\xc3\xa9");
  // e + U+0301 composes to é; an invalid byte beside it stays as it is.
  EXPECT_EQ(nfc->Encode("e\xcc\x81"), Ids{e_acute});
  EXPECT_EQ(*nfc->Decode(nfc->Encode("e\xcc\x81\xff"
                                     "e\xcc\x81")),
            "\xc3\xa9\xff\xc3\xa9");
  // NFKD: é decomposes, the ligature ﬁ becomes f i.
  EXPECT_EQ(*nfkd->Decode(nfkd->Encode("\xc3\xa9\xef\xac\x81")),
            "e\xcc\x81"
            "fi");
}

TEST(HfTokenizerTest, AddedTokensAreFoundLeftmostLongestAndNeverSplit) {
  json j = ByteLevel({{"a", "b"}});
  j["added_tokens"] = {{{"id", 300}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
                       {{"id", 301}, {"content", "<a><b>"}, {"special", true}, {"normalized", false}},
                       {{"id", 302}, {"content", "ab"}, {"special", false}, {"normalized", false}}};
  std::unique_ptr<HfTokenizer> t = Make(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 303);
  EXPECT_EQ(t->Encode("x<a><b>y<a>ab"), (Ids{'x', 301, 'y', 300, 302}));
  EXPECT_EQ(t->Encode("<a"), (Ids{'<', 'a'}));
  EXPECT_EQ(*t->Decode({301, 'x', 300}), "<a><b>x<a>");
  EXPECT_EQ(t->TokenId("<a><b>"), 301u);
}

// Hugging Face's own cases (tokenizers' added_vocabulary.rs tests, without
// their Lowercase normalizer).
TEST(HfTokenizerTest, AddedTokenStripAndSingleWordAsHuggingFaces) {
  json j = ByteLevel({});
  j["added_tokens"] = {{{"id", 300},
                        {"content", "<mask>"},
                        {"lstrip", true},
                        {"rstrip", true},
                        {"single_word", true},
                        {"special", false},
                        {"normalized", false}}};
  std::unique_ptr<HfTokenizer> strip = Make(j);
  ASSERT_NE(strip, nullptr);
  auto concat = [](std::vector<Ids> parts) {
    Ids all;
    for (const Ids& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  // "hi", " <mask> ", "there", "\t<mask>\t", "<mask>\u2000".
  EXPECT_EQ(strip->Encode("hi <mask> there\t<mask>\t<mask>\xe2\x80\x80"),
            concat({strip->Encode("hi"), {300}, strip->Encode("there"), {300}, {300}}));

  j["added_tokens"][0]["lstrip"] = false;
  j["added_tokens"][0]["rstrip"] = false;
  std::unique_ptr<HfTokenizer> word = Make(j);
  ASSERT_NE(word, nullptr);
  EXPECT_EQ(word->Encode("<mask> my name <mask> a<mask> <mask>ony <mask>"),
            concat({{300}, word->Encode(" my name "), {300}, word->Encode(" a<mask> <mask>ony "), {300}}));
  // Punctuation is no word character, a combining mark (U+0330) is.
  EXPECT_EQ(word->Encode("<mask>, <mask>- \xe2\x97\x8c\xcc\xb0<mask>"),
            concat({{300}, word->Encode(", "), {300}, word->Encode("- \xe2\x97\x8c\xcc\xb0<mask>")}));
}

// Llama 2's tokenizer.json, in small: Prepend("▁") and Replace(" ", "▁"),
// no pre-tokenizer, byte fallback, the SentencePiece decoder, <s> first.
json SentencePieceStyle() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const char* t : {"\xe2\x96\x81", "a", "b", "c",
                        "\xe2\x96\x81"
                        "a",
                        "ab",
                        "\xe2\x96\x81"
                        "ab",
                        "bc"}) {
    vocab[t] = next++;
  }
  return {{"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges",
             {"\xe2\x96\x81 a", "a b",
              "\xe2\x96\x81"
              "a b",
              "b c"}}}}};
}

TEST(HfTokenizerTest, SentencePieceStyleWithByteFallback) {
  std::unique_ptr<HfTokenizer> t = Make(SentencePieceStyle());
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->byte_level());
  const uint32_t space = 259, a = 260, b = 261, c = 262, space_a = 263, space_ab = 265;
  // "▁ab▁c": merges ▁a (rank 0) then ▁ab.
  EXPECT_EQ(t->Encode("ab c"), (Ids{space_ab, space, c}));
  EXPECT_EQ(t->Encode("b"), (Ids{space, b}));
  // é is outside the vocabulary: its UTF-8 bytes.
  EXPECT_EQ(t->Encode("a\xc3\xa9"), (Ids{space_a, 3 + 0xC3, 3 + 0xA9}));
  // Each stretch between added tokens gets its own "▁".
  EXPECT_EQ(t->Encode("a</s>a"), (Ids{space_a, 2, space_a}));
  EXPECT_EQ(t->EncodeWithSpecialTokens("a"), (Ids{1, space_a}));
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(*t->Decode(t->Encode("ab c \xc3\xa9!")), "ab c \xc3\xa9!");
  EXPECT_EQ(*t->Decode({1, space_a, 2}), "<s> a</s>");
  // Invalid UTF-8: a byte of its own, through byte fallback.
  EXPECT_EQ(t->Encode("\xff"), (Ids{space, 3 + 0xFF}));
  EXPECT_EQ(*t->Decode(t->Encode("a\xff"
                                 "b")),
            "a\xff"
            "b");

  // Without byte fallback: unk, consecutive ones fused with fuse_unk.
  json j = SentencePieceStyle();
  j["model"]["byte_fallback"] = false;
  std::unique_ptr<HfTokenizer> unk = Make(j);
  ASSERT_NE(unk, nullptr);
  EXPECT_EQ(unk->Encode("\xc3\xa9\xc3\xa8"
                        "a"),
            (Ids{space, 0, a}));
  j["model"]["fuse_unk"] = false;
  std::unique_ptr<HfTokenizer> unfused = Make(j);
  ASSERT_NE(unfused, nullptr);
  EXPECT_EQ(unfused->Encode("\xc3\xa9\xc3\xa8"), (Ids{space, 0, 0}));
}

TEST(HfTokenizerTest, StreamingDecodeGivesWholeCharacters) {
  std::unique_ptr<HfTokenizer> t = Make(SentencePieceStyle());
  ASSERT_NE(t, nullptr);
  const std::string text = "ab \xe4\xb8\xad c";
  TextStream stream(t.get());
  std::string all;
  for (uint32_t id : t->Encode(text)) {
    absl::StatusOr<std::string> piece = stream.Push(id);
    ASSERT_TRUE(piece.ok());
    all += *piece;
  }
  all += stream.Finish();
  EXPECT_EQ(all, text);
}

TEST(HfTokenizerTest, SpecialTokensFromTheTemplateAndTheConfig) {
  json j = SentencePieceStyle();
  // A template with a token after the text too: BOS and EOS from it.
  j["post_processor"]["single"].push_back({{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}});
  std::unique_ptr<HfTokenizer> t = Make(j);
  ASSERT_NE(t, nullptr);
  const uint32_t space_a = 263;  // "▁a"
  EXPECT_EQ(t->EncodeWithSpecialTokens("a"), (Ids{1, space_a, 2}));
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_ids(), Ids{2});

  // tokenizer_config.json's add_bos_token/add_eos_token rebuild it;
  // eos_token may be an AddedToken object.
  std::unique_ptr<HfTokenizer> c =
      Make(SentencePieceStyle(), {{"add_bos_token", false},
                                  {"add_eos_token", true},
                                  {"bos_token", "<s>"},
                                  {"eos_token", {{"content", "</s>"}, {"special", true}}}});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->EncodeWithSpecialTokens("a"), (Ids{space_a, 2}));
  EXPECT_EQ(c->Encode("a"), (Ids{space_a}));
  EXPECT_EQ(c->bos_id(), 1u);
  EXPECT_EQ(c->eos_ids(), Ids{2});

  // A ByteLevel post-processor adds nothing; without config nothing names
  // BOS or EOS.
  json b = ByteLevel({});
  b["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}}}};
  std::unique_ptr<HfTokenizer> none = Make(b);
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->EncodeWithSpecialTokens("a"), Ids{'a'});
  EXPECT_EQ(none->bos_id(), std::nullopt);
  EXPECT_TRUE(none->eos_ids().empty());
}

TEST(HfTokenizerTest, DecodeRefusesUnknownIdsAndJoinsWithoutADecoder) {
  json j = ByteLevel({});
  j["added_tokens"] = {{{"id", 400}, {"content", "<x>"}, {"special", true}}};
  std::unique_ptr<HfTokenizer> t = Make(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 401);
  EXPECT_EQ(t->Decode({300}).status().code(), absl::StatusCode::kInvalidArgument);  // a hole
  EXPECT_EQ(t->Decode({401}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t->Decode({401}).status().message().find("t.json"), std::string::npos);
  j["decoder"] = nullptr;
  std::unique_ptr<HfTokenizer> plain = Make(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(*plain->Decode({'a', 400, 'b'}), "a <x> b");
}

TEST(HfTokenizerTest, GptTwoStylePreTokenizer) {
  // GPT-2's tokenizer.json: ByteLevel alone, with GPT-2's pattern.
  json j = ByteLevel({{" ", "a"}});
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  std::unique_ptr<HfTokenizer> t = Make(j);
  ASSERT_NE(t, nullptr);
  // " a" once the prefix space is added; "'s" is a piece of its own.
  EXPECT_EQ(t->Encode("a's"), (Ids{Id(*t, " a"), '\'', 's'}));
  EXPECT_EQ(t->Encode(" a"), (Ids{Id(*t, " a")}));
}

TEST(HfTokenizerTest, StringSplitAndRegexReplace) {
  json j = ByteLevel({{"a", "b"}});
  // Split at each "|" (a String pattern), then replace digit runs by "#".
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "|"}};
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\p{N}+"}}}, {"content", "#"}};
  std::unique_ptr<HfTokenizer> t = Make(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("ab|a 12b"), (Ids{Id(*t, "ab"), '|', 'a', ' ', '#', 'b'}));
  EXPECT_EQ(*t->Decode(t->Encode("x\xd9\xa3\xd9\xa4|ab")), "x#|ab");
}

// --- errors -------------------------------------------------------------------

struct BadCase {
  std::string what;
  std::function<void(json&)> edit;
  std::string expect;  // in the message
};

TEST(HfTokenizerErrorsTest, RefusedNamingTheFileAndField) {
  const std::vector<BadCase> cases = {
      {"WordPiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "t.json: model.type is \"WordPiece\"; Ferry's hf tokenizer supports BPE models only"},
      {"Unigram",
       [](json& j) {
         j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
       },
       "model.type is \"Unigram\""},
      {"no model", [](json& j) { j.erase("model"); }, "t.json: model is missing"},
      {"unknown pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer.pretokenizers[1].type is \"Metaspace\"; Ferry supports the pre-tokenizers Split, ByteLevel"},
      {"unknown normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
       },
       "normalizer.normalizers[1].type is \"Lowercase\"; Ferry supports the normalizers"},
      {"unknown decoder",
       [](json& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       "decoder.type is \"Metaspace\""},
      {"unknown post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor.type is \"BertProcessing\"; Ferry supports the post-processors"},
      {"Split behavior", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior is \"Removed\"; Ferry supports Split with behavior Isolated only"},
      {"Split invert", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }, "invert is true"},
      {"bad regex",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
       },
       "pre_tokenizer.pretokenizers[0].pattern does not compile"},
      {"ByteLevel first",
       [](json& j) { std::swap(j["pre_tokenizer"]["pretokenizers"][0], j["pre_tokenizer"]["pretokenizers"][1]); },
       "Ferry supports ByteLevel only as the last one"},
      {"vocab not an object", [](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab must be an object"},
      {"negative id", [](json& j) { j["model"]["vocab"]["zz"] = -1; }, "model.vocab gives token \"zz\" no id"},
      {"merge of unknown tokens", [](json& j) { j["model"]["merges"] = {"q z"}; },
       "model.merges[0] has a merged token that is not in model.vocab"},
      {"merge not a pair", [](json& j) { j["model"]["merges"] = {"abc"}; }, "model.merges[0] must be \"a b\""},
      {"merges missing", [](json& j) { j["model"].erase("merges"); }, "model.merges must be a list"},
      {"unk not a token", [](json& j) { j["model"]["unk_token"] = "<nope>"; }, "model.unk_token names \"<nope>\""},
      {"prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix is set"},
      {"added token without id",
       [](json& j) {
         j["added_tokens"] = {{{"content", "<x>"}}};
       },
       "added_tokens[0].id is missing"},
      {"added token flag",
       [](json& j) {
         j["added_tokens"] = {{{"id", 300}, {"content", "<x>"}, {"lstrip", "yes"}}};
       },
       "added_tokens[0].lstrip must be true or false, not string"},
      {"added token on another's id",
       [](json& j) {
         j["added_tokens"] = {{{"id", 97}, {"content", "<x>"}}};
       },
       "added_tokens[0].id is 97, which model.vocab gives to another token"},
      {"template without A",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", json::array()}};
       },
       "post_processor.single has no {\"Sequence\""},
      {"template token unknown",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<bos>"}}}}, {{"Sequence", {{"id", "A"}}}}}}};
       },
       "post_processor.single[0].SpecialToken.id names \"<bos>\", which is not a token"},
      {"Strip content",
       [](json& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
       },
       "decoder.content must be one character"},
      {"whole file", [](json& j) { j = json::array(); }, "t.json: (the whole file) must be a JSON object"},
  };
  for (const BadCase& c : cases) {
    json j = ByteLevel({{"a", "b"}});
    c.edit(j);
    absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromContents(j.dump(), "", kSpec);
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << c.what << ": " << t.status();
  }
}

TEST(HfTokenizerErrorsTest, MalformedJsonAndConfig) {
  const std::string good = ByteLevel({{"a", "b"}}).dump();
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::FromContents("{\"model\": ", "", kSpec);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("t.json is not valid JSON (at byte"), std::string::npos) << t.status();
  t = HfTokenizer::FromContents(good, "{,}", kSpec);
  EXPECT_NE(t.status().message().find("c.json is not valid JSON"), std::string::npos) << t.status();
  t = HfTokenizer::FromContents(good, R"({"bos_token": "<nope>"})", kSpec);
  EXPECT_NE(t.status().message().find("c.json: bos_token names \"<nope>\""), std::string::npos) << t.status();
  t = HfTokenizer::FromContents(good, R"({"eos_token": {"special": true}})", kSpec);
  EXPECT_NE(t.status().message().find("c.json: eos_token.content is missing"), std::string::npos) << t.status();
  t = HfTokenizer::FromContents(good, R"({"add_bos_token": true})", kSpec);
  EXPECT_NE(t.status().message().find("add_bos_token is true but bos_token names no token"), std::string::npos)
      << t.status();
  t = HfTokenizer::FromContents(good, R"({"add_bos_token": 1})", kSpec);
  EXPECT_NE(t.status().message().find("c.json: add_bos_token must be true or false"), std::string::npos) << t.status();
  // Deep nesting: refused, without running out of stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  t = HfTokenizer::FromContents(deep, "", kSpec);
  EXPECT_NE(t.status().message().find("t.json: (the whole file) must be a JSON object"), std::string::npos)
      << t.status();
  json nested = {{"type", "NFC"}};
  for (int i = 0; i < 100; ++i) nested = {{"type", "Sequence"}, {"normalizers", {nested}}};
  json j = ByteLevel({});
  j["normalizer"] = nested;
  t = HfTokenizer::FromContents(j.dump(), "", kSpec);
  EXPECT_NE(t.status().message().find("nests Sequences deeper than"), std::string::npos) << t.status();
  // Every cut of a valid file is refused or loads; none crashes.
  const std::string sp = SentencePieceStyle().dump();
  for (size_t cut = 0; cut < sp.size(); cut += 7) {
    t = HfTokenizer::FromContents(sp.substr(0, cut), "", kSpec);
    ASSERT_FALSE(t.ok());
    ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(HfTokenizerErrorsTest, MissingFiles) {
  EXPECT_EQ(HfTokenizer::Load(EmptyTestPath("absent") + "/tokenizer.json", "").status().code(),
            absl::StatusCode::kNotFound);
  const std::string t_only = EmptyTestPath("t_only.json");
  Spit(t_only, ByteLevel({}).dump());
  EXPECT_EQ(HfTokenizer::Load(t_only, EmptyTestPath("absent_config.json")).status().code(),
            absl::StatusCode::kNotFound);
}

// --- the loader -----------------------------------------------------------------

TEST(HfTokenizerLoaderTest, FilesAndFolders) {
  const std::string dir = EmptyTestPath("model");
  mkdir(dir.c_str(), 0755);
  Spit(dir + "/tokenizer.json", ByteLevel({{"a", "b"}}).dump());

  // A folder without tokenizer_config.json, then with one.
  absl::StatusOr<TokenizerSpec> spec = HfTokenizerSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(*spec, (TokenizerSpec{kHfTokenizer, {dir + "/tokenizer.json"}}));
  Spit(dir + "/tokenizer_config.json", R"({"eos_token": "b"})");
  spec = HfTokenizerSpec(dir + "/");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(*spec, (TokenizerSpec{kHfTokenizer, {dir + "/tokenizer.json", dir + "/tokenizer_config.json"}}));
  spec = HfTokenizerSpec(dir + "/tokenizer.json");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(*spec, (TokenizerSpec{kHfTokenizer, {dir + "/tokenizer.json"}}));
  EXPECT_EQ(HfTokenizerSpec(EmptyTestPath("absent")).status().code(), absl::StatusCode::kNotFound);
  const std::string empty = EmptyTestPath("empty_folder");
  mkdir(empty.c_str(), 0755);
  EXPECT_EQ(HfTokenizerSpec(empty).status().code(), absl::StatusCode::kNotFound);  // no tokenizer.json

  // LoadTokenizer: a folder is resolved to its files.
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(TokenizerSpec{kHfTokenizer, {dir}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), kHfTokenizer);
  EXPECT_EQ((*t)->spec().files.size(), 2u);
  EXPECT_EQ((*t)->Encode("ab"), Ids{256});
  EXPECT_EQ(static_cast<HfTokenizer*>(t->get())->eos_ids(), Ids{'b'});
  t = LoadTokenizer(TokenizerSpec{kHfTokenizer, {dir + "/tokenizer.json", dir + "/tokenizer_config.json"}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(LoadTokenizer(TokenizerSpec{kHfTokenizer, {}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTokenizer(TokenizerSpec{kHfTokenizer, {"a", "b", "c"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTokenizer(TokenizerSpec{kHfTokenizer, {EmptyTestPath("absent")}}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry
