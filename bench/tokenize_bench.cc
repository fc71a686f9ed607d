// Tokenizer throughput: MB of text per second for byte, gpt2 and
// sentencepiece (BPE and unigram), and the seconds `ferry data prepare`
// takes over all of /usr/share/common-licenses with each (goal: under 1 s).
//
// No GPT-2 vocabulary is on an offline machine, so the bench learns one:
// `--merges` BPE merges over the corpus's GPT-2 pieces (plain pair counting,
// GPT-2's layout of vocab.json and merges.txt). SentencePiece models are
// trained on the corpus with `--sp_vocab` pieces.
//
//   bazel run //bench:tokenize [-- --merges=5000 --sp_vocab=8000]

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_output.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/sentencepiece_tokenizer.h"
#include "engine/data/token_file_writer.h"
#include "engine/data/tokenizer_loader.h"

ABSL_FLAG(std::string, corpus, "/usr/share/common-licenses", "Directory of text files to tokenise.");
ABSL_FLAG(int, merges, 5000, "BPE merges to learn for the gpt2 tokenizer.");
ABSL_FLAG(int, sp_vocab, 8000, "Pieces in the SentencePiece models.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/tokenize.json).");

namespace ferry {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> CorpusFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string path = dir + "/" + e->d_name;
      struct stat st;
      if (e->d_name[0] != '.' && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
    }
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Learns `count` merges the plain way: count adjacent pairs over the
// distinct pieces (weighted by frequency), merge the most frequent, repeat.
// Writes vocab.json and merges.txt in GPT-2's alphabet into `dir`.
void LearnGpt2Files(const std::string& text, int count, const std::string& dir) {
  std::string bytes_vocab = "{";
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&bytes_vocab, b ? "," : "", JsonString(Gpt2TokenText(std::string(1, static_cast<char>(b)))), ":",
                    b);
  }
  std::unique_ptr<Gpt2Tokenizer> splitter =
      std::move(*Gpt2Tokenizer::FromContents(bytes_vocab + "}", "", TokenizerSpec{"gpt2", {}}));
  absl::flat_hash_map<std::string, int64_t> piece_counts;
  for (absl::string_view piece : splitter->PreTokenize(text)) ++piece_counts[std::string(piece)];
  // Words as symbol ids; symbol i's bytes in `symbols`.
  std::vector<std::string> symbols;
  for (int b = 0; b < 256; ++b) symbols.emplace_back(1, static_cast<char>(b));
  std::vector<std::vector<int>> words;
  std::vector<int64_t> freq;
  for (const auto& [piece, n] : piece_counts) {
    std::vector<int> w;
    for (char c : piece) w.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
    freq.push_back(n);
  }
  std::string merges = "#version: 0.2\n";
  for (int m = 0; m < count; ++m) {
    absl::flat_hash_map<uint64_t, int64_t> pairs;
    for (size_t i = 0; i < words.size(); ++i) {
      for (size_t k = 0; k + 1 < words[i].size(); ++k) {
        pairs[(uint64_t(words[i][k]) << 32) | uint32_t(words[i][k + 1])] += freq[i];
      }
    }
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [pair, n] : pairs) {
      if (n > best_count || (n == best_count && pair < best)) best = pair, best_count = n;
    }
    if (best_count < 2) break;
    const int a = static_cast<int>(best >> 32), b = static_cast<int>(best & 0xffffffff);
    const int merged = static_cast<int>(symbols.size());
    symbols.push_back(symbols[a] + symbols[b]);
    absl::StrAppend(&merges, Gpt2TokenText(symbols[a]), " ", Gpt2TokenText(symbols[b]), "\n");
    for (std::vector<int>& w : words) {
      size_t out = 0;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == a && w[k + 1] == b) {
          w[out++] = merged;
          ++k;
        } else {
          w[out++] = w[k];
        }
      }
      w.resize(out);
    }
  }
  std::string vocab = "{";
  for (size_t i = 0; i < symbols.size(); ++i) {
    absl::StrAppend(&vocab, i ? "," : "", JsonString(Gpt2TokenText(symbols[i])), ":", i);
  }
  absl::StrAppend(&vocab, ",\"<|endoftext|>\":", symbols.size(), "}");
  std::ofstream(dir + "/vocab.json") << vocab;
  std::ofstream(dir + "/merges.txt") << merges;
}

struct Row {
  std::string name;
  int64_t vocab_size = 0;
  double cold_mb_s = 0;  // first pass over the corpus
  double warm_mb_s = 0;  // again, with whatever the tokenizer cached
  double prepare_seconds = 0;
  int64_t tokens = 0;
};

Row Measure(const std::string& name, const TokenizerSpec& spec, const std::string& text,
            const std::vector<std::string>& files, const std::string& dir) {
  Row row;
  row.name = name;
  std::unique_ptr<Tokenizer> t = std::move(*LoadTokenizer(spec));
  row.vocab_size = t->vocab_size();
  // Encoded in the blocks prepare uses (1 MiB), so SentencePiece sees
  // sentences of that size at most.
  auto pass = [&] {
    const double start = Now();
    int64_t tokens = 0;
    for (size_t at = 0; at < text.size(); at += 1 << 20) {
      tokens += static_cast<int64_t>(t->Encode(absl::string_view(text).substr(at, 1 << 20)).size());
    }
    row.tokens = tokens;
    return static_cast<double>(text.size()) / (Now() - start) / 1e6;
  };
  row.cold_mb_s = pass();
  row.warm_mb_s = pass();
  // `ferry data prepare` over the files, with a fresh tokenizer.
  std::unique_ptr<Tokenizer> fresh = std::move(*LoadTokenizer(spec));
  const double start = Now();
  absl::StatusOr<PrepareStats> stats = PrepareTokenFile(files, dir + "/" + name + ".bin", *fresh);
  row.prepare_seconds = Now() - start;
  if (!stats.ok()) std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(stats.status().message()).c_str());
  return row;
}

int Run() {
  const std::vector<std::string> files = CorpusFiles(absl::GetFlag(FLAGS_corpus));
  std::string text;
  for (const std::string& f : files) text += ReadAll(f);
  if (text.empty()) {
    std::fprintf(stderr, "tokenize: no text in %s\n", absl::GetFlag(FLAGS_corpus).c_str());
    return 1;
  }
  char tmpl[] = "/tmp/ferry-tokenize-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::printf("corpus: %zu files, %.2f MB\n", files.size(), static_cast<double>(text.size()) / 1e6);

  double start = Now();
  LearnGpt2Files(text, absl::GetFlag(FLAGS_merges), dir);
  const double learn_seconds = Now() - start;
  std::map<std::string, double> train_seconds;
  for (const std::string type : {"bpe", "unigram"}) {
    SentencePieceTrainOptions options;
    options.vocab_size = absl::GetFlag(FLAGS_sp_vocab);
    options.model_type = type;
    options.output_prefix = dir + "/sp_" + type;
    start = Now();
    if (absl::Status s = TrainSentencePiece(files, options); !s.ok()) {
      std::fprintf(stderr, "tokenize: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    train_seconds[type] = Now() - start;
  }

  std::vector<Row> rows;
  rows.push_back(Measure("byte", TokenizerSpec{"byte", {}}, text, files, dir));
  rows.push_back(Measure("gpt2", TokenizerSpec{"gpt2", {dir + "/vocab.json", dir + "/merges.txt"}}, text, files, dir));
  rows.push_back(Measure("sentencepiece-bpe", TokenizerSpec{"sentencepiece", {dir + "/sp_bpe.model"}}, text, files, dir));
  rows.push_back(
      Measure("sentencepiece-unigram", TokenizerSpec{"sentencepiece", {dir + "/sp_unigram.model"}}, text, files, dir));

  std::printf("\n%-22s %8s %10s %10s %11s %13s %12s\n", "tokenizer", "vocab", "tokens", "bytes/tok", "cold MB/s",
              "cached MB/s", "prepare s");
  std::string json = absl::StrFormat(
      "{\n  \"corpus\": %s,\n  \"corpus_files\": %d,\n  \"corpus_bytes\": %d,\n  \"gpt2_merges_learned_seconds\": %.3f,\n"
      "  \"sentencepiece_train_seconds\": {\"bpe\": %.3f, \"unigram\": %.3f},\n  \"tokenizers\": [",
      JsonString(absl::GetFlag(FLAGS_corpus)), files.size(), text.size(), learn_seconds, train_seconds["bpe"],
      train_seconds["unigram"]);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%-22s %8lld %10lld %10.2f %11.2f %13.2f %12.3f\n", r.name.c_str(), static_cast<long long>(r.vocab_size),
                static_cast<long long>(r.tokens), static_cast<double>(text.size()) / static_cast<double>(r.tokens),
                r.cold_mb_s, r.warm_mb_s, r.prepare_seconds);
    absl::StrAppendFormat(&json,
                          "%s\n    {\"name\": %s, \"vocab_size\": %d, \"tokens\": %d, \"encode_mb_per_s\": %.3f, "
                          "\"encode_cached_mb_per_s\": %.3f, \"prepare_seconds\": %.4f}",
                          i ? "," : "", JsonString(r.name), r.vocab_size, r.tokens, r.cold_mb_s, r.warm_mb_s,
                          r.prepare_seconds);
  }
  json += "\n  ]\n}\n";
  std::printf("(gpt2: %d merges learned in %.1f s; SentencePiece trained in %.1f s (bpe), %.1f s (unigram))\n",
              absl::GetFlag(FLAGS_merges), learn_seconds, train_seconds["bpe"], train_seconds["unigram"]);
  const std::string rm = "rm -rf " + dir;
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "tokenize: could not remove %s\n", dir.c_str());
  return WriteBenchResult("tokenize", absl::GetFlag(FLAGS_out), json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
