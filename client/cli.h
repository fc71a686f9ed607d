#pragma once

// The `ferry` command line: each subcommand as a function of its arguments
// and options, writing to the given streams and returning the exit code.

#include <iosfwd>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ferry {

// Exit codes.
inline constexpr int kExitOk = 0;
// The job failed or was cancelled (submit --wait, watch).
inline constexpr int kExitJobFailed = 1;
// Bad usage or input the daemon refused.
inline constexpr int kExitUsage = 2;
// The daemon could not be reached or answered with an internal error.
inline constexpr int kExitUnavailable = 3;

struct CliOptions {
  // ferryd's gRPC address.
  std::string address = "127.0.0.1:50051";
  // Print JSON (one object; NDJSON events for watch) instead of text.
  bool json = false;
  // With json: print YAML instead (a document per event for watch and top).
  bool yaml = false;
  // memory: also draw the placement as SVG into this file.
  std::string svg_path;
  // top: refresh this often; --once prints one frame and exits.
  absl::Duration interval = absl::Seconds(1);
  bool once = false;
  // submit: watch the job until it ends.
  bool wait = false;
  // submit: FIELD=VALUE assignments applied over the job file.
  std::vector<std::string> overrides;
  // submit: idempotency key; generated when empty.
  std::string request_id;
  // Deadline of each unary call.
  absl::Duration timeout = absl::Seconds(10);
  // list: only these states (short names); empty is all.
  std::vector<std::string> states;
  // list: at most this many jobs.
  int limit = 1000;
  // data prepare: the token file to write; data train-tokenizer: the
  // model's PREFIX (PREFIX.model, PREFIX.vocab).
  std::string out_path;
  // data prepare: byte, gpt2 (vocab_path, merges_path) or sentencepiece
  // (sp_model_path).
  std::string tokenizer = "byte";
  std::string vocab_path;
  std::string merges_path;
  std::string sp_model_path;
  // data train-tokenizer: pieces in the model, and bpe or unigram.
  int64_t vocab_size = 8000;
  std::string model_type = "unigram";
  // memory: which rank of a parallel job.
  int rank = 0;
  // generate: the prompt (a text, or comma-separated token ids), sampling
  // (see ferry.v1.GenerateRequest), and instead of a job a GPT-2 weights
  // file (with `heads` when the file does not say, and the tokenizer above
  // when `tokenizer_given`).
  std::string prompt;
  std::string prompt_ids;
  int64_t max_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string weights_path;
  int64_t heads = 0;
  bool tokenizer_given = false;
  // watch: how long to keep trying to reconnect before giving up.
  absl::Duration reconnect_for = absl::Minutes(2);
  // Sent with every call as `authorization: Bearer TOKEN`; empty sends none.
  std::string token;
  // TLS to ferryd. The PEM contents of the CA that signed ferryd's
  // certificate (empty: the system's roots), and for mTLS this client's
  // certificate and key.
  bool tls = false;
  std::string tls_ca_pem;
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

// `args` are the positional arguments after the program name, starting with
// the subcommand.
int RunCli(const std::vector<std::string>& args, const CliOptions& options, std::ostream& out,
           std::ostream& err);

// The usage text.
std::string CliUsage();

}  // namespace ferry
