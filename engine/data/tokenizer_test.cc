// Tokenizers against independent references: GPT-2's BPE against a Python
// encoder written here after GPT-2's encoder.py (with the `regex` module for
// the pattern), SentencePiece against python3-sentencepiece.

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/sentencepiece_tokenizer.h"
#include "engine/data/tokenizer_loader.h"

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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs a Python script; its stdout.
std::string RunPython(const std::string& script, const std::string& args) {
  const std::string path = TempPath("script.py"), out = TempPath("script.out");
  WriteFile(path, script);
  const std::string command = absl::StrCat("/usr/bin/python3 ", path, " ", args, " > ", out);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return ReadFile(out);
}

// Texts: Unicode letters with accents, CJK, emoji, runs of spaces and
// newlines, contractions, digits, punctuation.
const std::vector<std::string>& Texts() {
  static const auto* texts = new std::vector<std::string>{
      "Hello world! It's a test: we've 12345 apples, they'll say I'd won.",
      "  leading   spaces, trailing spaces   \n\n\nthree newlines\r\n\tand a tab\t \n",
      "Caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m \xc3\x9f\xc3\xbc\xc3\xb6 \xce\xb1\xce\xb2\xce\xb3 \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
      "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd and \xf0\x9f\x87\xab\xf0\x9f\x87\xb7 flags; Zero\xe2\x80\x8bwidth; nbsp\xc2\xa0here; NEL\xc2\x85" "end",
      "'s 't 're 've 'm 'll 'd 'S 'T DON'T don't ''quoted'' it''s",
      "digits 0 1 22 333 4444 \xd9\xa3\xd9\xa4 \xe2\x85\xa7 \xc2\xbd 3.14159 1,000,000",
      "Symbols: <|endoftext|> ~!@#$%^&*()_+{}|:\"<>? `-=[]\\;',./ \xe2\x80\x94 \xe2\x80\x9cquotes\xe2\x80\x9d",
      "the quick brown fox jumps over the lazy dog. The Quick Brown Fox Jumps Over The Lazy Dog.",
      "x",
      "",
      "   ",
      "\n",
      "a\n\nb \nc  \n d\n \n",
  };
  return *texts;
}

// Trains a small BPE (merges by pair count, ties by the pair's text) on a
// training text, writes vocab.json and merges.txt, and encodes each text
// file with a plain port of GPT-2's encoder.py. Prints one line of ids per
// text, then the pieces of each text (JSON).
constexpr char kGpt2Reference[] = R"PY(
import json, sys, regex
from collections import Counter

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))

PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
b2u = bytes_to_unicode()
def to_unicode(s):
    return "".join(b2u[b] for b in s.encode("utf-8"))

directory, train_file, merges_count, texts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
words = Counter(tuple(to_unicode(w)) for w in PAT.findall(open(train_file, encoding="utf-8").read()))
merges = []
for _ in range(merges_count):
    pairs = Counter()
    for w, c in words.items():
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += c
    if not pairs:
        break
    best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
    merges.append(best)
    merged = Counter()
    for w, c in words.items():
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                out.append(w[i] + w[i + 1]); i += 2
            else:
                out.append(w[i]); i += 1
        merged[tuple(out)] += c
    words = merged
# Byte tokens in a shuffled-looking order, so ids are not bytes.
vocab = {}
for b in sorted(range(256), key=lambda b: (b * 37) % 256):
    vocab[b2u[b]] = len(vocab)
for a, b in merges:
    if a + b not in vocab:
        vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
json.dump(vocab, open(directory + "/vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
with open(directory + "/merges.txt", "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n")
    for a, b in merges:
        f.write(a + " " + b + "\n")

# GPT-2's encoder.py, unchanged in substance.
ranks = dict(zip(merges, range(len(merges))))
def get_pairs(word):
    return set(zip(word, word[1:]))
def bpe(token):
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return [token]
    while True:
        bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j]); i = j
            except ValueError:
                new_word.extend(word[i:]); break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second); i += 2
            else:
                new_word.append(word[i]); i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)
pieces = []
for path in texts:
    text = open(path, encoding="utf-8", newline="").read()
    ids = []
    for piece in PAT.findall(text):
        ids.extend(vocab[t] for t in bpe(to_unicode(piece)))
    print(" ".join(map(str, ids)))
    pieces.append(PAT.findall(text))
print(json.dumps(pieces))
)PY";

std::vector<uint32_t> ParseIds(absl::string_view line) {
  std::vector<uint32_t> ids;
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    ids.push_back(static_cast<uint32_t>(std::stoul(std::string(field))));
  }
  return ids;
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Training text: the texts themselves, several times, and a licence.
    std::string train;
    for (int i = 0; i < 3; ++i) {
      for (const std::string& t : Texts()) train += t + "\n";
    }
    train += ReadFile("/usr/share/common-licenses/Apache-2.0").substr(0, 20000);
    WriteFile(TempPath("train.txt"), train);
    std::string args = absl::StrCat(TempPath(""), " ", TempPath("train.txt"), " 400");
    for (size_t i = 0; i < Texts().size(); ++i) {
      const std::string path = TempPath(absl::StrCat("text", i, ".txt"));
      WriteFile(path, Texts()[i]);
      absl::StrAppend(&args, " ", path);
    }
    reference_ = absl::StrSplit(RunPython(kGpt2Reference, args), '\n');
    ASSERT_GE(reference_.size(), Texts().size() + 1);
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t =
        Gpt2Tokenizer::Load(TempPath("vocab.json"), TempPath("merges.txt"));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
  }

  std::vector<std::string> reference_;
  std::unique_ptr<Gpt2Tokenizer> tokenizer_;
};

TEST_F(Gpt2TokenizerTest, IdsAreThoseOfGpt2sEncoder) {
  EXPECT_GT(tokenizer_->merge_count(), 300);
  for (size_t i = 0; i < Texts().size(); ++i) {
    // Twice: the second time from the piece cache.
    for (int pass = 0; pass < 2; ++pass) {
      EXPECT_EQ(tokenizer_->Encode(Texts()[i]), ParseIds(reference_[i])) << "text " << i << ": " << Texts()[i];
    }
  }
}

TEST_F(Gpt2TokenizerTest, PiecesAreThoseOfTheRegexModule) {
  // The reference's last line: a JSON list of each text's pieces. Compare
  // by rebuilding ours the same way.
  std::string ours = "[";
  for (size_t i = 0; i < Texts().size(); ++i) {
    ours += i == 0 ? "[" : ", [";
    std::vector<absl::string_view> pieces = tokenizer_->PreTokenize(Texts()[i]);
    std::string joined;
    for (size_t k = 0; k < pieces.size(); ++k) {
      absl::StrAppend(&joined, pieces[k]);
      ours += absl::StrCat(k == 0 ? "" : ", ", pieces[k].size());
    }
    ours += "]";
    EXPECT_EQ(joined, Texts()[i]);
  }
  ours += "]";
  // Lengths in bytes of the reference's pieces, computed in Python.
  const std::string lengths = RunPython(
      "import json,sys\nprint(json.dumps([[len(p.encode('utf-8')) for p in t] for t in json.loads(open(sys.argv[1], encoding='utf-8').read())]))\n",
      [&] {
        WriteFile(TempPath("pieces.json"), reference_[Texts().size()]);
        return TempPath("pieces.json");
      }());
  EXPECT_EQ(ours, std::string(absl::StripTrailingAsciiWhitespace(lengths)));
}

TEST_F(Gpt2TokenizerTest, DecodeInvertsEncodeOnArbitraryBytes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string bytes(rng() % 300, '\0');
    // Half the rounds from a small alphabet, so merges apply.
    for (char& c : bytes) c = static_cast<char>(round % 2 ? rng() : "ab \n\xc3\xa9\xff"[rng() % 7]);
    absl::StatusOr<std::string> back = tokenizer_->Decode(tokenizer_->Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, bytes) << "round " << round;
  }
  for (const std::string& t : Texts()) EXPECT_EQ(*tokenizer_->Decode(tokenizer_->Encode(t)), t);
  EXPECT_EQ(tokenizer_->Decode({static_cast<uint32_t>(tokenizer_->vocab_size())}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(Gpt2TokenizerTest, ALongPieceIsMergedInTime) {
  // One piece of a million letters: merging is not quadratic in its length.
  std::string text;
  while (text.size() < (1 << 20)) text += "the";
  std::vector<uint32_t> ids = tokenizer_->Encode(text);
  EXPECT_LT(ids.size(), text.size());
  EXPECT_EQ(*tokenizer_->Decode(ids), text);
}

TEST_F(Gpt2TokenizerTest, LongRunsOfSpacesSplitAsGpt2Does) {
  // A megabyte of white space before a word: all but the last character,
  // then " a" (only a plain space joins the word), as `\s+(?!\S)` backs off.
  for (const char* space : {" ", "\n", "\xe3\x80\x80"}) {
    std::string run;
    while (run.size() < (1 << 20)) run += space;
    const std::string text = run + "a";  // the pieces view into it
    std::vector<absl::string_view> pieces = tokenizer_->PreTokenize(text);
    const bool joins = std::string(space) == " ";
    ASSERT_EQ(pieces.size(), joins ? 2u : 3u) << "space " << space;
    EXPECT_EQ(pieces[0].size(), run.size() - std::strlen(space));
    if (joins) {
      EXPECT_EQ(pieces[1], " a");
    } else {
      EXPECT_EQ(pieces[1], space);
      EXPECT_EQ(pieces[2], "a");
    }
  }
}

TEST(Gpt2TokenizerFilesTest, MalformedFilesAreRefusedNamingTheFile) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&vocab, b ? "," : "", "\"", Gpt2TokenText(std::string(1, static_cast<char>(b))) == "\""
                                                    ? "\\\""
                                                    : Gpt2TokenText(std::string(1, static_cast<char>(b))) == "\\"
                                                          ? "\\\\"
                                                          : Gpt2TokenText(std::string(1, static_cast<char>(b))),
                    "\":", b);
  }
  const TokenizerSpec spec{kGpt2Tokenizer, {"v.json", "m.txt"}};
  ASSERT_TRUE(Gpt2Tokenizer::FromContents(vocab + "}", "", spec).ok());
  struct Case {
    std::string vocab, merges, expect;
  } cases[] = {
      {"[1,2]", "", "v.json: must be one JSON object"},
      {"{\"a\":1", "", "v.json: is not valid JSON"},
      {"{\"a\":-1}", "", "out of range"},
      {"{\"a\":{}}", "", "nested"},
      {"{\"a\":1}", "", "has no token for byte 0"},
      {vocab + ",\"zz\":1}", "", "id 1 is given to two tokens"},
      {vocab + "}", "a b\n", "m.txt: line 1: the merged token is not in v.json"},
      {vocab + "}", "#version: 0.2\nab\n", "m.txt: line 2 is not two tokens"},
      {vocab + "}", "a  b\n", "m.txt: line 1 is not two tokens"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t = Gpt2Tokenizer::FromContents(c.vocab, c.merges, spec);
    ASSERT_FALSE(t.ok()) << c.vocab.substr(0, 20) << " / " << c.merges;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status();
  }
  EXPECT_EQ(Gpt2Tokenizer::Load(TempPath("absent.json"), TempPath("absent.txt")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SentencePieceTokenizerTest, IdsAreThoseOfPythonSentencePiece) {
  const std::vector<std::string> inputs = {"/usr/share/common-licenses/Apache-2.0",
                                           "/usr/share/common-licenses/GPL-3"};
  for (const std::string type : {"bpe", "unigram"}) {
    SentencePieceTrainOptions options;
    options.vocab_size = 600;
    options.model_type = type;
    options.output_prefix = TempPath("sp_" + type);
    ASSERT_TRUE(TrainSentencePiece(inputs, options).ok());
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        LoadTokenizer(TokenizerSpec{kSentencePieceTokenizer, {options.output_prefix + ".model"}});
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->vocab_size(), 600);
    std::string args = options.output_prefix + ".model";
    for (size_t i = 0; i < Texts().size(); ++i) absl::StrAppend(&args, " ", TempPath(absl::StrCat("text", i, ".txt")));
    for (size_t i = 0; i < Texts().size(); ++i) WriteFile(TempPath(absl::StrCat("text", i, ".txt")), Texts()[i]);
    const std::vector<std::string> reference = absl::StrSplit(
        RunPython("import sys, sentencepiece as spm\n"
                  "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
                  "for p in sys.argv[2:]:\n"
                  "    print(' '.join(map(str, sp.encode(open(p, encoding='utf-8', newline='').read()))))\n",
                  args),
        '\n');
    ASSERT_GE(reference.size(), Texts().size());
    for (size_t i = 0; i < Texts().size(); ++i) {
      const std::vector<uint32_t> ids = (*t)->Encode(Texts()[i]);
      EXPECT_EQ(ids, ParseIds(reference[i])) << type << " text " << i;
      EXPECT_TRUE((*t)->Decode(ids).ok());
    }
    EXPECT_EQ((*t)->Decode({600}).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(SentencePieceTokenizerTest, BadOptionsAndFilesAreRefused) {
  SentencePieceTrainOptions options;
  options.output_prefix = TempPath("never");
  options.model_type = "wordpiece";
  EXPECT_EQ(TrainSentencePiece({"/usr/share/common-licenses/GPL-3"}, options).code(),
            absl::StatusCode::kInvalidArgument);
  options.model_type = "bpe";
  options.vocab_size = 2;
  EXPECT_EQ(TrainSentencePiece({"/usr/share/common-licenses/GPL-3"}, options).code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile(TempPath("not.model"), "not a model");
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::Load(TempPath("not.model"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("not.model"), std::string::npos);
}

TEST(TokenizerLoaderTest, KindsAndFileCounts) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(TokenizerSpec{"byte", {}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->vocab_size(), 256);
  EXPECT_EQ((*t)->Encode("\xff" "a"), (std::vector<uint32_t>{255, 97}));
  EXPECT_EQ(LoadTokenizer(TokenizerSpec{"gpt2", {"only-one"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTokenizer(TokenizerSpec{"wordpiece", {}}).status().code(), absl::StatusCode::kInvalidArgument);
  TokenFileInfo flat;
  EXPECT_EQ(LoadTokenizer(flat, "f.bin").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
