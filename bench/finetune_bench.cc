// Fine-tuning's figures, in bench/results/finetune.json:
// * Tokenizer throughput: MB of text per second for byte, gpt2 and
//   sentencepiece (BPE and unigram), and the seconds `ferry data prepare`
//   takes over all of /usr/share/common-licenses with each (goal: under 1 s).
// * A fine-tune from exported weights: a small GPT pretrained on every
//   licence but the GPL-2 and GPL-3, exported in GPT-2's layout, then trained
//   from that file (model.init_from) on the GPL-3 and evaluated on the GPL-2
//   (data.eval.path): the eval loss before and after, beside the same steps
//   from random weights.
//
// No GPT-2 vocabulary is on an offline machine, so the bench learns one:
// `--merges` BPE merges over the corpus's GPT-2 pieces (plain pair counting,
// GPT-2's layout of vocab.json and merges.txt). SentencePiece models are
// trained on the corpus with `--sp_vocab` pieces.
//
//   bazel run //bench:finetune [-- --merges=3000 --sp_vocab=2000 --pretrain_steps=300 --finetune_steps=60]

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
#include "engine/model/gpt2_weights.h"
#include "engine/data/token_file_writer.h"
#include "engine/data/tokenizer_loader.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/data/token_file_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/train/hf_export.h"
#include "engine/train/trainer.h"

ABSL_FLAG(std::string, corpus, "/usr/share/common-licenses", "Directory of text files to tokenise.");
ABSL_FLAG(int, merges, 3000, "BPE merges to learn for the gpt2 tokenizer.");
ABSL_FLAG(int, sp_vocab, 2000, "Pieces in the SentencePiece models.");
ABSL_FLAG(int, pretrain_steps, 300, "Steps of pretraining before the export.");
ABSL_FLAG(int, finetune_steps, 60, "Steps of fine-tuning from the exported weights.");
ABSL_FLAG(double, finetune_lr, 3e-4, "Peak learning rate of the fine-tune (and of the run from random weights).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/finetune.json).");

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

// Evaluations of one run: (steps done, eval loss).
class EvalObserver : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override {
    if (r.initial_eval.has_value()) evals.emplace_back(0, r.initial_eval->loss);
    if (r.eval.has_value()) evals.emplace_back(r.step, r.eval->loss);
    last_loss = r.loss;
    seconds += r.step_seconds;
  }
  std::vector<std::pair<int64_t, double>> evals;
  double last_loss = 0;
  double seconds = 0;
};

struct FinetuneResult {
  std::string error;
  ModelConfig model;
  int64_t pretrain_tokens = 0, finetune_tokens = 0;
  double pretrain_final_loss = 0, pretrain_seconds = 0, export_seconds = 0;
  EvalObserver from_file, from_scratch;
};

FinetuneResult Finetune(const std::vector<std::string>& files, const TokenizerSpec& spec, const std::string& dir) {
  FinetuneResult result;
  auto fail = [&](const absl::Status& s) {
    result.error = std::string(s.message());
    return result;
  };
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  std::vector<std::string> pretrain_files, finetune_files, eval_files;
  for (const std::string& f : files) {
    const std::string name = f.substr(f.rfind('/') + 1);
    (name == "GPL-3" ? finetune_files : name == "GPL-2" ? eval_files : pretrain_files).push_back(f);
  }
  if (finetune_files.empty() || eval_files.empty() || pretrain_files.empty()) {
    return fail(absl::NotFoundError("no GPL-2 and GPL-3 in the corpus"));
  }
  for (const auto& [inputs, out] : {std::pair(pretrain_files, dir + "/pretrain.bin"),
                                    std::pair(finetune_files, dir + "/finetune.bin"),
                                    std::pair(eval_files, dir + "/eval.bin")}) {
    absl::StatusOr<PrepareStats> stats = PrepareTokenFile(inputs, out, **tokenizer);
    if (!stats.ok()) return fail(stats.status());
    if (out.find("pretrain") != std::string::npos) result.pretrain_tokens = stats->tokens;
    if (out.find("finetune") != std::string::npos) result.finetune_tokens = stats->tokens;
  }
  ModelConfig& model = result.model;
  model.layers = 2;
  model.hidden = 128;
  model.heads = 4;
  model.vocab_size = (*tokenizer)->vocab_size();
  model.seq_len = 64;
  TrainOptions train;
  train.batch_size = 8;
  train.lr = 3e-3;
  train.min_lr = 3e-4;
  train.warmup_steps = 10;
  const uint64_t kDevice = uint64_t{1} << 30;

  // Pretraining, its last step checkpointed, exported as GPT-2's file.
  {
    SimulatedDevice device(kDevice);
    absl::StatusOr<std::unique_ptr<TokenFileSource>> data =
        TokenFileSource::Open(dir + "/pretrain.bin", model.vocab_size, model.seq_len + 1, 1);
    if (!data.ok()) return fail(data.status());
    TrainOptions pretrain = train;
    pretrain.steps = absl::GetFlag(FLAGS_pretrain_steps);
    std::optional<CheckpointContents> last;
    EngineOptions engine;
    engine.device = &device;
    engine.checkpoint_every_steps = pretrain.steps;
    engine.on_checkpoint = [&last](CheckpointContents c, double) {
      last = std::move(c);
      return absl::OkStatus();
    };
    EvalObserver observer;
    std::printf("pretraining %lld parameters for %lld steps on %lld tokens\n",
                static_cast<long long>(model.ParameterCount()), static_cast<long long>(pretrain.steps),
                static_cast<long long>(result.pretrain_tokens));
    std::fflush(stdout);
    if (absl::Status s = Trainer(model, pretrain, engine, std::move(*data), &observer).Run(); !s.ok()) return fail(s);
    result.pretrain_final_loss = observer.last_loss;
    result.pretrain_seconds = observer.seconds;
    const double start = Now();
    absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
        ExportHfWeights(model, pretrain, *engine.memory, {&*last}, &device);
    if (!tensors.ok()) return fail(tensors.status());
    std::string bytes;
    if (absl::Status s = SerializeSafetensors(*tensors, Gpt2ConfigMetadata(model), &bytes); !s.ok()) return fail(s);
    std::ofstream(dir + "/pretrained.safetensors", std::ios::binary) << bytes;
    result.export_seconds = Now() - start;
  }

  // Fine-tuning on the GPL-3, evaluated on the GPL-2 (data.eval.path: a
  // related text neither run trains on), from the file and from random
  // weights.
  for (const bool from_file : {true, false}) {
    SimulatedDevice device(kDevice);
    absl::StatusOr<std::unique_ptr<TokenFileSource>> data =
        TokenFileSource::Open(dir + "/finetune.bin", model.vocab_size, model.seq_len + 1, 2);
    absl::StatusOr<std::unique_ptr<TokenFileSource>> held_out =
        TokenFileSource::Open(dir + "/eval.bin", model.vocab_size, model.seq_len + 1, 3);
    if (!data.ok()) return fail(data.status());
    if (!held_out.ok()) return fail(held_out.status());
    TrainOptions finetune = train;
    finetune.steps = absl::GetFlag(FLAGS_finetune_steps);
    finetune.lr = absl::GetFlag(FLAGS_finetune_lr);
    finetune.min_lr = finetune.lr / 10;
    finetune.eval_every_steps = std::max<int64_t>(1, finetune.steps / 4);
    finetune.eval_batches = 8;
    EngineOptions engine;
    engine.device = &device;
    engine.eval_data = held_out->get();
    if (from_file) engine.init_from = dir + "/pretrained.safetensors";
    EvalObserver& observer = from_file ? result.from_file : result.from_scratch;
    if (absl::Status t = Trainer(model, finetune, engine, std::move(*data), &observer).Run(); !t.ok()) return fail(t);
  }
  return result;
}

std::string EvalsJson(const EvalObserver& o) {
  std::string json = "[";
  for (size_t i = 0; i < o.evals.size(); ++i) {
    absl::StrAppendFormat(&json, "%s{\"step\": %d, \"eval_loss\": %.4f}", i ? ", " : "", o.evals[i].first,
                          o.evals[i].second);
  }
  return json + "]";
}

int Run() {
  const std::vector<std::string> files = CorpusFiles(absl::GetFlag(FLAGS_corpus));
  std::string text;
  for (const std::string& f : files) text += ReadAll(f);
  if (text.empty()) {
    std::fprintf(stderr, "finetune: no text in %s\n", absl::GetFlag(FLAGS_corpus).c_str());
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
      std::fprintf(stderr, "finetune: %s\n", std::string(s.message()).c_str());
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
  json += "\n  ],\n";
  std::printf("(gpt2: %d merges learned in %.1f s; SentencePiece trained in %.1f s (bpe), %.1f s (unigram))\n\n",
              absl::GetFlag(FLAGS_merges), learn_seconds, train_seconds["bpe"], train_seconds["unigram"]);

  const FinetuneResult ft =
      Finetune(files, TokenizerSpec{"gpt2", {dir + "/vocab.json", dir + "/merges.txt"}}, dir);
  if (!ft.error.empty()) {
    std::fprintf(stderr, "finetune: %s\n", ft.error.c_str());
    return 1;
  }
  const auto& file_evals = ft.from_file.evals;
  const auto& scratch_evals = ft.from_scratch.evals;
  std::printf("fine-tune (gpt2 tokens, %lld parameters): pretrained %d steps on %lld tokens (loss %.3f, %.1f s), "
              "exported in %.2f s\n",
              static_cast<long long>(ft.model.ParameterCount()), absl::GetFlag(FLAGS_pretrain_steps),
              static_cast<long long>(ft.pretrain_tokens), ft.pretrain_final_loss, ft.pretrain_seconds,
              ft.export_seconds);
  std::printf("%-24s %14s %14s\n", "eval loss (GPL-2)", "from the file", "from random");
  for (size_t i = 0; i < file_evals.size() && i < scratch_evals.size(); ++i) {
    std::printf("%-24s %14.4f %14.4f\n", absl::StrCat("after step ", file_evals[i].first).c_str(),
                file_evals[i].second, scratch_evals[i].second);
  }
  absl::StrAppendFormat(&json,
                        "  \"finetune\": {\"tokenizer\": \"gpt2\", \"parameters\": %d, \"layers\": %d, "
                        "\"hidden\": %d, \"seq_len\": %d, \"vocab_size\": %d,\n"
                        "    \"pretrain_steps\": %d, \"pretrain_tokens\": %d, \"pretrain_final_loss\": %.4f, "
                        "\"export_seconds\": %.3f,\n    \"finetune_steps\": %d, \"finetune_tokens\": %d, "
                        "\"finetune_lr\": %g, \"eval_data\": \"GPL-2\",\n    \"from_file\": %s,\n    \"from_random\": %s}\n}\n",
                        ft.model.ParameterCount(), ft.model.layers, ft.model.hidden, ft.model.seq_len,
                        ft.model.vocab_size, absl::GetFlag(FLAGS_pretrain_steps), ft.pretrain_tokens,
                        ft.pretrain_final_loss, ft.export_seconds, absl::GetFlag(FLAGS_finetune_steps),
                        ft.finetune_tokens, absl::GetFlag(FLAGS_finetune_lr), EvalsJson(ft.from_file), EvalsJson(ft.from_scratch));
  const std::string rm = "rm -rf " + dir;
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "finetune: could not remove %s\n", dir.c_str());
  return WriteBenchResult("finetune", absl::GetFlag(FLAGS_out), json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
