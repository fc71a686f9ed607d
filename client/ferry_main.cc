// ferry: the command line client of ferryd.

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "server/common/files.h"
#include "server/common/version.h"

ABSL_FLAG(std::string, address, "", "ferryd's address (default $FERRY_ADDRESS, else 127.0.0.1:50051).");
ABSL_FLAG(std::string, o, "text", "Output: text (or table), json or yaml.");
ABSL_FLAG(bool, wait, false, "submit: watch the job until it ends; exit 0 only if it succeeded.");
ABSL_FLAG(std::vector<std::string>, set, {}, "submit: FIELD=VALUE overrides of the job file.");
ABSL_FLAG(std::string, request_id, "", "submit: idempotency key (default: a fresh one).");
ABSL_FLAG(double, timeout, 10, "Seconds to wait for each answer.");
ABSL_FLAG(std::vector<std::string>, state, {}, "list: only jobs in these states.");
ABSL_FLAG(int, limit, 1000, "list: at most this many jobs.");
ABSL_FLAG(std::string, out, "", "data prepare: the token file to write; data train-tokenizer: the model's PREFIX.");
ABSL_FLAG(std::string, tokenizer, "byte", "data prepare: byte, gpt2 (--vocab, --merges) or sentencepiece (--sp_model).");
ABSL_FLAG(std::string, vocab, "", "data prepare --tokenizer=gpt2: GPT-2's vocab.json.");
ABSL_FLAG(std::string, merges, "", "data prepare --tokenizer=gpt2: GPT-2's merges.txt.");
ABSL_FLAG(std::string, sp_model, "", "data prepare --tokenizer=sentencepiece: the .model file.");
ABSL_FLAG(int64_t, vocab_size, 8000, "data train-tokenizer: pieces in the model.");
ABSL_FLAG(std::string, model_type, "unigram", "data train-tokenizer: bpe or unigram.");
ABSL_FLAG(std::string, prompt, "", "generate: the text to continue (needs a tokenizer).");
ABSL_FLAG(std::string, prompt_ids, "", "generate: token ids to continue, comma-separated (e.g. 1,2,3).");
ABSL_FLAG(int64_t, max_tokens, 64, "generate: tokens to generate (1 .. 4096).");
ABSL_FLAG(double, temperature, 1.0, "generate: sampling temperature; 0 is greedy.");
ABSL_FLAG(int64_t, top_k, 0, "generate: sample from the k most likely tokens only (0: all).");
ABSL_FLAG(double, top_p, 1.0, "generate: sample from the most likely tokens whose probability reaches p (0 < p <= 1).");
ABSL_FLAG(uint64_t, seed, 0, "generate: the sampler's seed.");
ABSL_FLAG(std::string, weights, "", "generate: a GPT-2 safetensors file (ferry export's) instead of a job.");
ABSL_FLAG(int64_t, heads, 0, "generate --weights: attention heads, when the file does not record n_head.");
ABSL_FLAG(int, rank, 0, "memory, top: which rank of a parallel job.");
ABSL_FLAG(std::string, svg, "", "memory: also draw the placement, period by period, into this SVG file.");
ABSL_FLAG(double, interval, 1, "top: seconds between refreshes.");
ABSL_FLAG(bool, once, false, "top: print one frame and exit.");
ABSL_FLAG(std::string, token, "",
          "Bearer token for a ferryd with --tokens_file (default $FERRY_TOKEN; the environment keeps "
          "it out of the process list).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signed ferryd's certificate; turns TLS on (default $FERRY_TLS_CA).");
ABSL_FLAG(std::string, tls_cert, "",
          "This client's PEM certificate, for a ferryd that requires one (default $FERRY_TLS_CERT).");
ABSL_FLAG(std::string, tls_key, "", "The PEM private key of --tls_cert (default $FERRY_TLS_KEY).");
ABSL_FLAG(bool, version, false, "Print the version and exit.");

namespace {

// The flag's value, else the environment variable's.
std::string FlagOrEnv(const std::string& flag, const char* env) {
  if (!flag.empty()) return flag;
  const char* value = std::getenv(env);
  return value != nullptr ? value : "";
}

bool ReadPem(const char* flag, const char* env, const std::string& path, std::string* pem) {
  absl::StatusOr<std::string> text = ferry::ReadFileToString(path);
  if (!text.ok()) {
    std::cerr << "ferry: --" << flag << " (or " << env << ") = " << path << ": cannot read it\n";
    return false;
  }
  *pem = *std::move(text);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(ferry::CliUsage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_version)) {
    std::cout << "ferry " << ferry::kFerryVersion << "\n";
    return 0;
  }
  ferry::CliOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  if (options.address.empty()) {
    const char* env = std::getenv("FERRY_ADDRESS");
    options.address = env != nullptr && *env ? env : "127.0.0.1:50051";
  }
  const std::string output = absl::GetFlag(FLAGS_o);
  if (output != "text" && output != "table" && output != "json" && output != "yaml") {
    std::cerr << "ferry: -o " << output << ": use text, table, json or yaml\n";
    return ferry::kExitUsage;
  }
  options.json = output == "json" || output == "yaml";
  options.yaml = output == "yaml";
  options.svg_path = absl::GetFlag(FLAGS_svg);
  options.once = absl::GetFlag(FLAGS_once);
  if (!(absl::GetFlag(FLAGS_interval) >= 0.1)) {
    std::cerr << "ferry: --interval must be at least 0.1 seconds\n";
    return ferry::kExitUsage;
  }
  options.interval = absl::Seconds(absl::GetFlag(FLAGS_interval));
  options.wait = absl::GetFlag(FLAGS_wait);
  options.overrides = absl::GetFlag(FLAGS_set);
  options.request_id = absl::GetFlag(FLAGS_request_id);
  if (!(absl::GetFlag(FLAGS_timeout) > 0)) {
    std::cerr << "ferry: --timeout must be positive\n";
    return ferry::kExitUsage;
  }
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout));
  options.states = absl::GetFlag(FLAGS_state);
  options.limit = absl::GetFlag(FLAGS_limit);
  options.out_path = absl::GetFlag(FLAGS_out);
  options.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  options.vocab_path = absl::GetFlag(FLAGS_vocab);
  options.merges_path = absl::GetFlag(FLAGS_merges);
  options.sp_model_path = absl::GetFlag(FLAGS_sp_model);
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.model_type = absl::GetFlag(FLAGS_model_type);
  if (absl::GetFlag(FLAGS_rank) < 0) {
    std::cerr << "ferry: --rank must be 0 or more\n";
    return ferry::kExitUsage;
  }
  options.rank = absl::GetFlag(FLAGS_rank);
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.prompt_ids = absl::GetFlag(FLAGS_prompt_ids);
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.weights_path = absl::GetFlag(FLAGS_weights);
  options.heads = absl::GetFlag(FLAGS_heads);
  // generate --weights: a tokenizer only when one is named (data prepare's
  // default of byte does not apply).
  options.tokenizer_given = !options.vocab_path.empty() || !options.sp_model_path.empty();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--tokenizer", 0) == 0 || arg.rfind("-tokenizer", 0) == 0) options.tokenizer_given = true;
  }
  options.token = FlagOrEnv(absl::GetFlag(FLAGS_token), "FERRY_TOKEN");
  for (char c : options.token) {
    if (c <= ' ' || c >= 0x7f) {
      std::cerr << "ferry: --token (or FERRY_TOKEN) has a space or a character that is not visible "
                   "ASCII; give the token alone\n";
      return ferry::kExitUsage;
    }
  }
  const std::string tls_ca = FlagOrEnv(absl::GetFlag(FLAGS_tls_ca), "FERRY_TLS_CA");
  const std::string tls_cert = FlagOrEnv(absl::GetFlag(FLAGS_tls_cert), "FERRY_TLS_CERT");
  const std::string tls_key = FlagOrEnv(absl::GetFlag(FLAGS_tls_key), "FERRY_TLS_KEY");
  if (tls_cert.empty() != tls_key.empty()) {
    std::cerr << "ferry: --tls_cert and --tls_key (FERRY_TLS_CERT, FERRY_TLS_KEY) go together: give both\n";
    return ferry::kExitUsage;
  }
  options.tls = !tls_ca.empty() || !tls_cert.empty();
  if ((!tls_ca.empty() && !ReadPem("tls_ca", "FERRY_TLS_CA", tls_ca, &options.tls_ca_pem)) ||
      (!tls_cert.empty() && !ReadPem("tls_cert", "FERRY_TLS_CERT", tls_cert, &options.tls_cert_pem)) ||
      (!tls_key.empty() && !ReadPem("tls_key", "FERRY_TLS_KEY", tls_key, &options.tls_key_pem))) {
    return ferry::kExitUsage;
  }
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  return ferry::RunCli(args, options, std::cout, std::cerr);
}
