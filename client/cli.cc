#include "client/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/format.h"
#include "client/memory_svg.h"
#include "engine/data/hf_tokenizer.h"
#include "engine/data/sentencepiece_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/data/token_file_writer.h"
#include "engine/data/tokenizer_loader.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "server/common/enum_names.h"
#include "server/common/files.h"
#include "server/spec/job_file.h"
#include "server/spec/yaml_to_proto.h"

namespace ferry {
namespace {

std::string JsonQuote(const std::string& s);

using ferry::v1::Job;
using ferry::v1::JobEvent;
using ferry::v1::JobState;


// Adds `authorization: Bearer TOKEN` to every call of the channel.
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string& header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", header_);
    }
    methods->Proceed();
  }

 private:
  const std::string& header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(header_);
  }

 private:
  const std::string header_;
};

int ExitCodeFor(JobState s) { return s == ferry::v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitJobFailed; }

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "ok", "cancelled", "unknown", "invalid argument", "deadline exceeded", "not found",
      "already exists", "permission denied", "resource exhausted", "failed precondition",
      "aborted", "out of range", "unimplemented", "internal", "unavailable", "data loss",
      "unauthenticated"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "error";
}

class Cli {
 public:
  Cli(const CliOptions& options, std::ostream& out, std::ostream& err)
      : options_(options), out_(out), err_(err) {}

  int Run(const std::vector<std::string>& args);

 private:
  ferry::v1::Ferry::Stub& Stub() {
    if (!stub_) {
      std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
      if (options_.tls) {
        grpc::SslCredentialsOptions ssl;
        ssl.pem_root_certs = options_.tls_ca_pem;
        ssl.pem_cert_chain = options_.tls_cert_pem;
        ssl.pem_private_key = options_.tls_key_pem;
        credentials = grpc::SslCredentials(ssl);
      }
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
      if (!options_.token.empty()) interceptors.push_back(std::make_unique<BearerTokenFactory>(options_.token));
      stub_ = ferry::v1::Ferry::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
          options_.address, credentials, grpc::ChannelArguments(), std::move(interceptors)));
    }
    return *stub_;
  }

  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
  }

  // Prints the failed status as one line and returns the exit code.
  int Report(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
        status.error_message().find("shutting down") == std::string::npos &&
        status.error_message().find("starting") == std::string::npos) {
      std::string tls_hint;
      if (status.error_message().find("Connection refused") == std::string::npos) {
        tls_hint = options_.tls ? " (with TLS: --tls_ca must be the CA that signed ferryd's certificate; "
                                  "a ferryd that requires client certificates needs --tls_cert and --tls_key)"
                                : " (if ferryd serves TLS, give --tls_ca)";
      }
      err_ << "ferry: cannot reach ferryd at " << options_.address
           << " (is it running? set --address or FERRY_ADDRESS): " << status.error_message() << tls_hint
           << "\n";
      return kExitUnavailable;
    }
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      err_ << "ferry: ferryd at " << options_.address << " did not answer within "
           << absl::FormatDuration(options_.timeout) << " (raise --timeout)\n";
      return kExitUnavailable;
    }
    err_ << "ferry: " << CodeName(status.error_code()) << ": " << status.error_message() << "\n";
    switch (status.error_code()) {
      case grpc::StatusCode::INTERNAL:
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::UNKNOWN:
        return kExitUnavailable;
      default:
        return kExitUsage;
    }
  }

  int Usage(const std::string& problem) {
    err_ << "ferry: " << problem << "\n" << CliUsage();
    return kExitUsage;
  }

  int Submit(const std::vector<std::string>& args);
  int List(const std::vector<std::string>& args);
  int Get(const std::vector<std::string>& args);
  int Watch(const std::string& id, bool quiet_start);
  int Cancel(const std::vector<std::string>& args);
  int Info(const std::vector<std::string>& args);
  int Memory(const std::vector<std::string>& args);
  int Data(const std::vector<std::string>& args);
  int TrainTokenizer(const std::vector<std::string>& inputs);
  int Export(const std::vector<std::string>& args);
  int Generate(const std::vector<std::string>& args);
  int Top(const std::vector<std::string>& args);
  int Completion(const std::vector<std::string>& args);
  // Structured output (-o json or -o yaml) of JSON text.
  std::string Structured(const std::string& json) const { return options_.yaml ? JsonToYaml(json) : json; }
  // The same for one of a stream of objects (watch, top): YAML as documents.
  std::string StructuredItem(const std::string& json) const {
    return options_.yaml ? "---\n" + JsonToYaml(json) : json;
  }

  const CliOptions& options_;
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<ferry::v1::Ferry::Stub> stub_;
};

int Cli::Run(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("no command given");
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "submit") return Submit(rest);
  if (command == "list") return List(rest);
  if (command == "get") return Get(rest);
  if (command == "watch") {
    if (rest.size() != 1) return Usage("watch takes one job id");
    return Watch(rest[0], false);
  }
  if (command == "cancel") return Cancel(rest);
  if (command == "info") return Info(rest);
  if (command == "memory") return Memory(rest);
  if (command == "data") return Data(rest);
  if (command == "export") return Export(rest);
  if (command == "generate") return Generate(rest);
  if (command == "top") return Top(rest);
  if (command == "completion") return Completion(rest);
  if (command == "help") {
    out_ << CliUsage();
    return kExitOk;
  }
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

int Cli::Submit(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("submit takes one job file");
  absl::StatusOr<ferry::v1::JobSpec> spec = LoadJobFile(args[0], options_.overrides);
  if (!spec.ok()) {
    err_ << "ferry: " << spec.status().message() << "\n";
    return kExitUsage;
  }
  ferry::v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_request_id(options_.request_id);
  if (request.request_id().empty()) {
    // Retrying this one submission can never create a second job.
    std::random_device random;
    request.set_request_id(absl::StrFormat("cli-%08x%08x", random(), random()));
  }
  Job job;
  grpc::Status status;
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    status = Stub().SubmitJob(&ctx, request, &job);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        status.error_message().find("shutting down") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(300 << attempt));
  }
  if (!status.ok()) return Report(status);
  if (options_.json && !options_.wait) {
    out_ << Structured(ToJson(job, true));
  } else if (!options_.json) {
    out_ << "submitted " << job.id() << (job.spec().name().empty() ? "" : " (" + job.spec().name() + ")")
         << "\n";
    out_.flush();
  }
  if (!options_.wait) return kExitOk;
  return Watch(job.id(), true);
}

int Cli::List(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("list takes no arguments (filter with --state)");
  ferry::v1::ListJobsRequest request;
  for (const std::string& name : options_.states) {
    const auto* descriptor = ferry::v1::JobState_descriptor();
    bool found = false;
    for (int i = 0; i < descriptor->value_count(); ++i) {
      if (descriptor->value(i)->number() != 0 && ShortEnumName(descriptor->value(i)) == absl::AsciiStrToLower(name)) {
        request.add_states(static_cast<JobState>(descriptor->value(i)->number()));
        found = true;
      }
    }
    if (!found) return Usage(absl::StrCat("--state=", name, ": use pending, running, succeeded, failed or cancelled"));
  }
  std::vector<Job> jobs;
  ferry::v1::ListJobsResponse all;
  do {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ferry::v1::ListJobsResponse page;
    grpc::Status status = Stub().ListJobs(&ctx, request, &page);
    if (!status.ok()) return Report(status);
    for (const Job& job : page.jobs()) {
      if (static_cast<int>(jobs.size()) >= options_.limit) break;
      jobs.push_back(job);
      *all.add_jobs() = job;
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty() && static_cast<int>(jobs.size()) < options_.limit);
  if (options_.json) {
    out_ << Structured(ToJson(all, true));
  } else {
    out_ << JobTable(jobs, absl::Now());
  }
  return kExitOk;
}

int Cli::Get(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("get takes one job id");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ferry::v1::GetJobRequest request;
  request.set_job_id(args[0]);
  Job job;
  grpc::Status status = Stub().GetJob(&ctx, request, &job);
  if (!status.ok()) return Report(status);
  out_ << (options_.json ? Structured(ToJson(job, true)) : JobDetails(job, absl::Now()));
  return kExitOk;
}

int Cli::Watch(const std::string& id, bool quiet_start) {
  const bool tty = !options_.json && &out_ == &std::cout && isatty(STDOUT_FILENO);
  uint64_t after_seq = 0;
  JobState state = ferry::v1::JOB_STATE_UNSPECIFIED;
  ferry::v1::Progress last_progress;
  absl::Time last_print = absl::InfinitePast();
  absl::Time failing_since = absl::InfiniteFuture();
  bool line_open = false;
  std::string final_error;
  auto end_line = [&] {
    if (line_open) out_ << "\n";
    line_open = false;
  };
  auto show_progress = [&](bool force) {
    if (options_.json || last_progress.step() == 0) return;
    const absl::Time now = absl::Now();
    if (tty) {
      out_ << "\r\033[K" << id << "  " << ProgressLine(last_progress);
      out_.flush();
      line_open = true;
    } else if (force || now - last_print >= absl::Seconds(2)) {
      out_ << id << "  " << ProgressLine(last_progress) << "\n";
      out_.flush();
      last_print = now;
    }
  };

  for (;;) {
    grpc::ClientContext ctx;
    ferry::v1::WatchJobRequest request;
    request.set_job_id(id);
    request.set_after_seq(after_seq);
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader = Stub().WatchJob(&ctx, request);
    JobEvent event;
    while (reader->Read(&event)) {
      failing_since = absl::InfiniteFuture();
      if (options_.json) out_ << StructuredItem(ToJson(event, false));
      if (event.has_snapshot()) {
        const Job& job = event.snapshot();
        state = job.state();
        if (job.progress().step() > 0) last_progress = job.progress();
        final_error = job.error();
        if (!options_.json && after_seq == 0 && !quiet_start) {
          out_ << id << "  " << ShortState(state) << "\n";
        }
        if (after_seq == 0) after_seq = event.seq();
        continue;
      }
      after_seq = event.seq();
      switch (event.kind_case()) {
        case JobEvent::kProgress:
          last_progress = event.progress();
          show_progress(false);
          break;
        case JobEvent::kStateChange: {
          state = event.state_change().to();
          final_error = event.state_change().reason();
          if (!options_.json) {
            if (IsTerminalState(state)) show_progress(true);
            end_line();
            out_ << id << "  " << ShortState(state)
                 << (final_error.empty() ? "" : ": " + final_error) << "\n";
          }
          break;
        }
        case JobEvent::kLog:
          if (!options_.json) {
            end_line();
            out_ << id << "  " << event.log().message() << "\n";
          }
          break;
        default:
          break;
      }
    }
    const grpc::Status status = reader->Finish();
    if (status.ok()) {
      end_line();
      if (!options_.json && IsTerminalState(state) && last_progress.step() > 0) {
        out_ << absl::StrFormat("%s  final loss %.4f after %d steps\n", id, last_progress.loss(),
                                last_progress.step());
      }
      return IsTerminalState(state) ? ExitCodeFor(state) : kExitJobFailed;
    }
    if (status.error_code() == grpc::StatusCode::OUT_OF_RANGE) {
      // Fell behind the buffer: start again from a fresh snapshot.
      end_line();
      if (!options_.json) err_ << "ferry: missed some events; resuming from the current state\n";
      after_seq = 0;
      continue;
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      end_line();
      const absl::Time now = absl::Now();
      if (failing_since == absl::InfiniteFuture()) {
        failing_since = now;
        if (!options_.json) err_ << "ferry: lost the connection to ferryd; reconnecting\n";
      }
      if (now - failing_since > options_.reconnect_for) return Report(status);
      absl::SleepFor(absl::Seconds(1));
      continue;
    }
    end_line();
    return Report(status);
  }
}

int Cli::Cancel(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("cancel takes one job id");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ferry::v1::CancelJobRequest request;
  request.set_job_id(args[0]);
  Job job;
  grpc::Status status = Stub().CancelJob(&ctx, request, &job);
  if (!status.ok()) return Report(status);
  if (options_.json) {
    out_ << Structured(ToJson(job, true));
  } else if (job.state() == ferry::v1::JOB_STATE_CANCELLED) {
    out_ << job.id() << " cancelled\n";
  } else {
    out_ << job.id() << " is stopping after its current step\n";
  }
  return kExitOk;
}

int Cli::Info(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("info takes no arguments");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ferry::v1::DaemonInfo info;
  grpc::Status status = Stub().GetDaemonInfo(&ctx, ferry::v1::GetDaemonInfoRequest(), &info);
  if (!status.ok()) return Report(status);
  out_ << (options_.json ? Structured(ToJson(info, true)) : DaemonInfoText(info));
  return kExitOk;
}

int Cli::Memory(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("memory takes one job id");
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  ferry::v1::GetMemoryPlacementRequest request;
  request.set_job_id(args[0]);
  request.set_rank(static_cast<uint32_t>(options_.rank));
  ferry::v1::MemoryPlacement placement;
  grpc::Status status = Stub().GetMemoryPlacement(&ctx, request, &placement);
  if (!status.ok()) return Report(status);
  if (!options_.svg_path.empty()) {
    if (absl::Status s = WriteFileAtomically(options_.svg_path, MemoryPlacementSvg(placement)); !s.ok()) {
      err_ << "ferry: --svg: " << s.message() << "\n";
      return kExitUsage;
    }
    if (!options_.json) {
      out_ << "wrote " << options_.svg_path << ": " << placement.trace_size() << " periods of step "
           << placement.step() << "\n";
      return kExitOk;
    }
  }
  out_ << (options_.json ? Structured(ToJson(placement, true)) : MemoryPlacementText(placement));
  return kExitOk;
}

// An absolute path for the daemon: relative ones are taken from here.
std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

// --tokenizer names a Hugging Face tokenizer: a model folder or a
// tokenizer.json, not one of the built-in kinds.
bool IsHfTokenizerPath(const std::string& kind) {
  if (kind == kByteTokenizer || kind == kGpt2Tokenizer || kind == kSentencePieceTokenizer) return false;
  struct stat st;
  return absl::EndsWith(kind, ".json") || (stat(kind.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}

int Cli::Data(const std::vector<std::string>& args) {
  constexpr char kUse[] =
      "use: ferry data prepare [--tokenizer=byte|gpt2|sentencepiece|MODEL_DIR|tokenizer.json] --out=FILE TEXT_FILE..., or "
      "ferry data train-tokenizer --vocab_size=N --model_type=bpe|unigram --out=PREFIX TEXT_FILE...";
  if (args.empty()) return Usage(kUse);
  if (args[0] == "train-tokenizer") return TrainTokenizer(std::vector<std::string>(args.begin() + 1, args.end()));
  if (args[0] != "prepare") return Usage(kUse);
  const std::vector<std::string> inputs(args.begin() + 1, args.end());
  if (inputs.empty()) return Usage("data prepare needs at least one text file");
  if (options_.out_path.empty()) return Usage("data prepare needs --out=FILE");
  TokenizerSpec spec{options_.tokenizer, {}};
  std::string kind = options_.tokenizer;
  if (IsHfTokenizerPath(kind)) {
    // A model folder or its tokenizer.json: Hugging Face's tokenizer,
    // recorded with absolute paths.
    absl::StatusOr<TokenizerSpec> hf = HfTokenizerSpec(Absolute(kind));
    if (!hf.ok()) return Usage(absl::StrCat("--tokenizer: ", hf.status().message()));
    spec = *hf;
    kind = kHfTokenizer;
  } else if (kind == kGpt2Tokenizer) {
    if (options_.vocab_path.empty() || options_.merges_path.empty()) {
      return Usage("--tokenizer=gpt2 needs --vocab=vocab.json and --merges=merges.txt");
    }
    spec.files = {options_.vocab_path, options_.merges_path};
  } else if (kind == kSentencePieceTokenizer) {
    if (options_.sp_model_path.empty()) return Usage("--tokenizer=sentencepiece needs --sp_model=FILE.model");
    spec.files = {options_.sp_model_path};
  } else if (kind != kByteTokenizer) {
    return Usage(absl::StrCat("--tokenizer: '", kind,
                              "' is not one of byte, gpt2, sentencepiece, nor a model folder or tokenizer.json"));
  }
  if (kind != kGpt2Tokenizer && (!options_.vocab_path.empty() || !options_.merges_path.empty())) {
    return Usage("--vocab and --merges go with --tokenizer=gpt2");
  }
  if (kind != kSentencePieceTokenizer && !options_.sp_model_path.empty()) {
    return Usage("--sp_model goes with --tokenizer=sentencepiece");
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
  if (!tokenizer.ok()) {
    err_ << "ferry: " << tokenizer.status().message() << "\n";
    return kExitUsage;
  }
  // Progress: each input as it ends, and every 64 MiB within a long one.
  constexpr int64_t kProgressBytes = int64_t{64} << 20;
  int64_t next_report = kProgressBytes;
  const absl::Time start = absl::Now();
  absl::StatusOr<PrepareStats> stats = PrepareTokenFile(
      inputs, options_.out_path, **tokenizer, [&](const std::string& file, bool done, const PrepareStats& so_far) {
        if (options_.json || (!done && so_far.bytes < next_report)) return;
        next_report = so_far.bytes + kProgressBytes;
        err_ << "  " << file << (done ? "" : " ...") << "  (" << so_far.tokens << " tokens so far)\n";
      });
  if (!stats.ok()) {
    err_ << "ferry: " << stats.status().message() << "\n";
    return kExitUsage;
  }
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start));
  const int64_t vocab_size = (*tokenizer)->vocab_size();
  const int token_bytes = TokenBytesFor(vocab_size);
  if (options_.json) {
    out_ << Structured(absl::StrFormat(
        "{\"path\": %s, \"files\": %d, \"tokens\": %d, \"tokenizer\": %s, \"vocab_size\": %d, \"token_bytes\": %d, "
        "\"seconds\": %.3f, \"tokens_per_second\": %.0f}\n",
        JsonQuote(options_.out_path), stats->files, stats->tokens, JsonQuote(kind), vocab_size, token_bytes, seconds,
        static_cast<double>(stats->tokens) / seconds));
  } else {
    out_ << absl::StrFormat(
        "wrote %d tokens from %d files to %s (%s, vocab_size %d, %d-byte tokens) in %.2f s: %.0f tokens/s, %.1f MB/s of text\n",
        stats->tokens, stats->files, options_.out_path, kind, vocab_size, token_bytes, seconds,
        static_cast<double>(stats->tokens) / seconds, static_cast<double>(stats->bytes) / seconds / 1e6);
  }
  return kExitOk;
}

int Cli::TrainTokenizer(const std::vector<std::string>& inputs) {
  if (inputs.empty()) return Usage("data train-tokenizer needs at least one text file");
  if (options_.out_path.empty()) return Usage("data train-tokenizer needs --out=PREFIX (writes PREFIX.model)");
  SentencePieceTrainOptions train;
  train.vocab_size = options_.vocab_size;
  train.model_type = options_.model_type;
  train.output_prefix = options_.out_path;
  const absl::Time start = absl::Now();
  if (absl::Status s = TrainSentencePiece(inputs, train); !s.ok()) {
    err_ << "ferry: " << s.message() << "\n";
    return kExitUsage;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string model = options_.out_path + ".model";
  if (options_.json) {
    out_ << Structured(absl::StrFormat("{\"model\": %s, \"vocab_size\": %d, \"model_type\": %s, \"seconds\": %.3f}\n",
                                       JsonQuote(model), train.vocab_size, JsonQuote(train.model_type), seconds));
  } else {
    out_ << absl::StrFormat(
        "wrote %s and %s.vocab (%s, vocab_size %d) in %.1f s\n"
        "tokenise with: ferry data prepare --tokenizer=sentencepiece --sp_model=%s --out=FILE TEXT_FILE...\n",
        model, options_.out_path, train.model_type, train.vocab_size, seconds, model);
  }
  return kExitOk;
}

int Cli::Top(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("top takes one job id");
  const std::string& id = args[0];
  const bool tty = !options_.json && &out_ == &std::cout && isatty(STDOUT_FILENO);
  // The device's matrix-product rate, to set the job's achieved rate beside.
  ferry::v1::DaemonInfo info;
  bool have_info = false;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    have_info = Stub().GetDaemonInfo(&ctx, ferry::v1::GetDaemonInfoRequest(), &info).ok();
  }
  for (;;) {
    Job job;
    {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      ferry::v1::GetJobRequest request;
      request.set_job_id(id);
      grpc::Status status = Stub().GetJob(&ctx, request, &job);
      if (!status.ok()) return Report(status);
    }
    ferry::v1::MemoryPlacement placement;
    bool have_placement = false;
    if (job.progress().step() > 0) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      ferry::v1::GetMemoryPlacementRequest request;
      request.set_job_id(id);
      request.set_rank(static_cast<uint32_t>(options_.rank));
      have_placement = Stub().GetMemoryPlacement(&ctx, request, &placement).ok();
    }
    const bool ended = IsTerminalState(job.state());
    if (options_.json) {
      // One object per refresh: the job and (once known) its placement.
      out_ << StructuredItem(ToJson(job, false));
      if (have_placement) out_ << StructuredItem(ToJson(placement, false));
    } else {
      const char* columns = std::getenv("COLUMNS");
      int width = 100;
      if (columns != nullptr) width = std::max(40, std::atoi(columns));
      if (tty) out_ << "\x1b[H\x1b[2J";  // home and clear: a live view
      out_ << TopFrame(job, have_placement ? &placement : nullptr, width, have_info ? &info : nullptr);
      if (!tty) out_ << "\n";
    }
    out_.flush();
    if (ended || options_.once) return ended && job.state() != ferry::v1::JOB_STATE_SUCCEEDED ? kExitJobFailed : kExitOk;
    absl::SleepFor(options_.interval);
  }
}

int Cli::Completion(const std::vector<std::string>& args) {
  if (args.size() != 1 || (args[0] != "bash" && args[0] != "zsh")) {
    return Usage("completion takes a shell: bash or zsh (e.g. source <(ferry completion bash))");
  }
  // zsh runs the bash function through bashcompinit.
  if (args[0] == "zsh") out_ << "autoload -U +X bashcompinit && bashcompinit\n";
  out_ << R"SH(# ferry shell completion: source <(ferry completion bash)
_ferry() {
  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" w
  for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
    case "$w" in -*) ;; *) cmd="$w"; break ;; esac
  done
  case "$cur" in
    -o=*|--o=*) COMPREPLY=($(compgen -P "${cur%%=*}=" -W "text table json yaml" -- "${cur#*=}")); return ;;
    --tokenizer=*) COMPREPLY=($(compgen -P "--tokenizer=" -W "byte gpt2 sentencepiece" -- "${cur#*=}") $(compgen -P "--tokenizer=" -d -- "${cur#*=}")); return ;;
    --model_type=*) COMPREPLY=($(compgen -P "--model_type=" -W "bpe unigram" -- "${cur#*=}")); return ;;
    --state=*) COMPREPLY=($(compgen -P "--state=" -W "pending running succeeded failed cancelled" -- "${cur#*=}")); return ;;
    -*) COMPREPLY=($(compgen -W "--address= --token= --tls_ca= --tls_cert= --tls_key= -o= --timeout= --wait --set= --request_id= --state= --limit= --rank= --svg= --out= --tokenizer= --vocab= --merges= --sp_model= --vocab_size= --model_type= --interval= --once --prompt= --prompt_ids= --max_tokens= --temperature= --top_k= --top_p= --seed= --weights= --heads=" -- "$cur")); compopt -o nospace 2>/dev/null; return ;;
  esac
  if [ -z "$cmd" ]; then
    COMPREPLY=($(compgen -W "submit list get watch cancel info memory top data export generate completion help" -- "$cur"))
    return
  fi
  case "$cmd" in
    submit) COMPREPLY=($(compgen -f -X '!*.@(yaml|yml|json)' -- "$cur")); compopt -o plusdirs 2>/dev/null ;;
    get|watch|cancel|memory|top|export|generate)
      COMPREPLY=($(compgen -W "$(ferry list --limit=200 2>/dev/null | awk 'NR > 1 {print $1}')" -- "$cur")) ;;
    data) COMPREPLY=($(compgen -W "prepare train-tokenizer" -- "$cur")) ;;
    completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")) ;;
  esac
}
complete -F _ferry ferry
)SH";
  return kExitOk;
}

// A JSON string literal.
std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

int Cli::Export(const std::vector<std::string>& args) {
  if (args.size() != 2) {
    return Usage("export takes a job id and where to write: FILE.safetensors, or a folder for a Hugging Face model "
                 "folder");
  }
  const std::string& id = args[0];
  std::string path = args[1];
  const bool folder = !absl::EndsWith(path, ".safetensors");
  while (folder && path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st;
  if (folder && stat(path.c_str(), &st) == 0) {
    err_ << "ferry: " << path << " exists; export a model folder into a new one (or name a FILE.safetensors)\n";
    return kExitUsage;
  }
  // Written beside the destination and renamed over it once complete.
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid());
  if (folder && mkdir(tmp.c_str(), 0755) != 0) {
    err_ << "ferry: cannot create " << tmp << ": " << std::strerror(errno) << "\n";
    return kExitUsage;
  }
  int fd = -1;
  std::vector<std::string> written_files;
  auto open_file = [&](const std::string& file) {
    const std::string target = folder ? tmp + "/" + file : tmp;
    fd = open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) written_files.push_back(target);
    return fd >= 0;
  };
  auto abandon = [&](int code) {
    if (fd >= 0) close(fd);
    for (const std::string& f : written_files) unlink(f.c_str());
    if (folder) rmdir(tmp.c_str());
    return code;
  };
  if (!folder && !open_file("")) {
    err_ << "ferry: cannot write " << tmp << ": " << std::strerror(errno) << "\n";
    return kExitUsage;
  }
  // No deadline: a large model takes a while to restore and send.
  grpc::ClientContext ctx;
  ferry::v1::ExportWeightsRequest request;
  request.set_job_id(id);
  request.set_folder(folder);
  std::unique_ptr<grpc::ClientReader<ferry::v1::ExportChunk>> reader = Stub().ExportWeights(&ctx, request);
  ferry::v1::ExportChunk chunk, first, current;
  uint64_t written = 0, total = 0;
  bool any = false;
  auto file_complete = [&]() { return written == current.total_bytes(); };
  auto fail = [&](const std::string& message, int code) {
    ctx.TryCancel();
    (void)reader->Finish();
    err_ << "ferry: " << message << "\n";
    return abandon(code);
  };
  while (reader->Read(&chunk)) {
    if (!any) first = chunk;
    const bool next_file = !any || chunk.file() != current.file();
    if (next_file && folder) {
      // A name within the folder, nothing else.
      const std::string& name = chunk.file();
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
        return fail(absl::StrCat("the export named a file '", name.substr(0, 64), "' outside its folder"),
                    kExitUnavailable);
      }
      if (any && !file_complete()) {
        return fail(absl::StrCat("received ", written, " of ", current.file(), "'s ", current.total_bytes(), " bytes"),
                    kExitUnavailable);
      }
      if (fd >= 0 && (fsync(fd) != 0 || close(fd) != 0)) {
        fd = -1;
        return fail(absl::StrCat("cannot write ", current.file(), ": ", std::strerror(errno)), kExitUsage);
      }
      fd = -1;
      if (!open_file(name)) return fail(absl::StrCat("cannot write ", tmp, "/", name, ": ", std::strerror(errno)), kExitUsage);
      written = 0;
    }
    if (next_file) current = chunk;
    any = true;
    if (chunk.offset() != written) {
      return fail(absl::StrCat("the export arrived out of order (offset ", chunk.offset(), ", expected ", written, ")"),
                  kExitUnavailable);
    }
    const std::string& data = chunk.data();
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)), kExitUsage);
      done += static_cast<size_t>(n);
    }
    written += data.size();
    total += data.size();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return abandon(Report(status));
  if (!any || !file_complete() || (folder && written_files.size() != first.files())) {
    err_ << "ferry: received " << (folder ? absl::StrCat(written_files.size(), " of ", first.files(), " files; ") : "")
         << written << " of " << (any ? current.total_bytes() : 0) << " bytes of the last\n";
    return abandon(kExitUnavailable);
  }
  if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    fd = -1;
    err_ << "ferry: cannot write " << path << ": " << std::strerror(errno) << "\n";
    return abandon(kExitUsage);
  }
  fd = -1;
  if (options_.json) {
    out_ << Structured(absl::StrFormat(
        "{\"job_id\": %s, \"path\": %s, \"step\": %d, \"tensors\": %d, \"files\": %d, \"bytes\": %d}\n", JsonQuote(id),
        JsonQuote(path), first.step(), first.tensors(), folder ? first.files() : 1, total));
  } else {
    out_ << absl::StrFormat("exported %d tensors (%s%s) of %s at step %d to %s\n", first.tensors(),
                            absl::StrFormat("%.1f MiB", double(total) / (1 << 20)),
                            folder ? absl::StrFormat(" in %d files", first.files()) : "", id, first.step(), path);
  }
  return kExitOk;
}


int Cli::Generate(const std::vector<std::string>& args) {
  ferry::v1::GenerateRequest request;
  const bool from_weights = !options_.weights_path.empty();
  if (from_weights) {
    if (!args.empty()) return Usage("generate takes a job id or --weights=FILE, not both");
    request.set_weights_path(Absolute(options_.weights_path));
    if (options_.heads < 0) return Usage("--heads: give the model's attention heads, a positive number");
    request.set_heads(static_cast<uint32_t>(options_.heads));
    if (options_.tokenizer_given && IsHfTokenizerPath(options_.tokenizer)) {
      absl::StatusOr<TokenizerSpec> hf = HfTokenizerSpec(Absolute(options_.tokenizer));
      if (!hf.ok()) return Usage(absl::StrCat("--tokenizer: ", hf.status().message()));
      request.set_tokenizer(kHfTokenizer);
      for (const std::string& file : hf->files) request.add_tokenizer_files(file);
    } else if (options_.tokenizer_given) {
      const std::string& kind = options_.tokenizer_given && options_.tokenizer == kByteTokenizer &&
                                        (!options_.vocab_path.empty() || !options_.sp_model_path.empty())
                                    ? (!options_.vocab_path.empty() ? std::string(kGpt2Tokenizer)
                                                                    : std::string(kSentencePieceTokenizer))
                                    : options_.tokenizer;
      request.set_tokenizer(kind);
      if (kind == kGpt2Tokenizer) {
        if (options_.vocab_path.empty() || options_.merges_path.empty()) {
          return Usage("--tokenizer=gpt2 needs --vocab=vocab.json and --merges=merges.txt");
        }
        request.add_tokenizer_files(Absolute(options_.vocab_path));
        request.add_tokenizer_files(Absolute(options_.merges_path));
      } else if (kind == kSentencePieceTokenizer) {
        if (options_.sp_model_path.empty()) return Usage("--tokenizer=sentencepiece needs --sp_model=FILE.model");
        request.add_tokenizer_files(Absolute(options_.sp_model_path));
      } else if (kind != kByteTokenizer) {
        return Usage(absl::StrCat("--tokenizer: '", kind,
                                  "' is not one of byte, gpt2, sentencepiece, nor a model folder or tokenizer.json"));
      }
    }
  } else {
    if (args.size() != 1) return Usage("generate takes one job id (or --weights=FILE.safetensors)");
    if (options_.tokenizer_given || options_.heads != 0) {
      return Usage("--tokenizer, --vocab, --merges, --sp_model and --heads go with --weights; a job's tokenizer is "
                   "the one its token file records");
    }
    request.set_job_id(args[0]);
  }
  if (options_.prompt.empty() == options_.prompt_ids.empty()) {
    return Usage("generate needs --prompt=TEXT or --prompt_ids=1,2,3 (one of them)");
  }
  request.set_prompt(options_.prompt);
  if (!options_.prompt_ids.empty()) {
    for (absl::string_view part : absl::StrSplit(options_.prompt_ids, ',')) {
      uint32_t id = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
        return Usage(absl::StrCat("--prompt_ids: '", part, "' is not a token id; give ids such as 1,2,3"));
      }
      request.add_prompt_ids(id);
    }
  }
  if (options_.max_tokens < 1 || options_.max_tokens > 4096) {
    return Usage(absl::StrCat("--max_tokens: ", options_.max_tokens, " is outside 1 .. 4096"));
  }
  if (options_.top_k < 0) return Usage("--top_k: give 0 (all tokens) or a positive count");
  request.mutable_max_tokens()->set_value(static_cast<uint32_t>(options_.max_tokens));
  request.mutable_temperature()->set_value(options_.temperature);
  request.set_top_k(static_cast<uint32_t>(std::min<int64_t>(options_.top_k, UINT32_MAX)));
  request.mutable_top_p()->set_value(options_.top_p);
  request.set_seed(options_.seed);
  // No deadline: a large model takes a while to restore.
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<ferry::v1::GenerateResponse>> reader = Stub().Generate(&ctx, request);
  ferry::v1::GenerateResponse response;
  ferry::v1::GenerateSummary summary;
  std::string text;
  std::vector<uint32_t> ids;
  ferry::v1::GenerateStarted started;
  while (reader->Read(&response)) {
    if (response.has_started()) {
      started = response.started();
      continue;
    }
    if (response.has_summary()) {
      summary = response.summary();
      continue;
    }
    ids.push_back(response.token().id());
    text += response.token().text();
    if (options_.json) continue;
    // As it comes: the text, or for a model without a tokenizer the ids.
    if (started.tokenizer().empty()) {
      out_ << (ids.size() > 1 ? " " : "") << response.token().id();
    } else {
      out_ << response.token().text();
    }
    out_.flush();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    if (!options_.json && !ids.empty()) out_ << "\n";
    return Report(status);
  }
  text += summary.text();
  if (options_.json) {
    std::vector<std::string> id_text;
    for (uint32_t id : ids) id_text.push_back(absl::StrCat(id));
    out_ << Structured(absl::StrFormat(
        "{\"model\": %s, \"step\": %d, \"tokenizer\": %s, \"text\": %s, \"ids\": [%s], \"prompt_tokens\": %d, "
        "\"generated_tokens\": %d, \"seconds\": %.3f, \"first_token_seconds\": %.3f}\n",
        JsonQuote(from_weights ? request.weights_path() : request.job_id()), summary.step(),
        JsonQuote(summary.tokenizer()), JsonQuote(text), absl::StrJoin(id_text, ", "), summary.prompt_tokens(),
        summary.generated_tokens(), summary.seconds(), summary.first_token_seconds()));
    return kExitOk;
  }
  out_ << summary.text() << "\n";
  err_ << absl::StrFormat("(%d tokens after a prompt of %d in %.2f s%s)\n", summary.generated_tokens(),
                          summary.prompt_tokens(), summary.seconds(),
                          from_weights ? std::string() : absl::StrCat(", step ", summary.step()));
  return kExitOk;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, const CliOptions& options, std::ostream& out,
           std::ostream& err) {
  return Cli(options, out, err).Run(args);
}

std::string CliUsage() {
  return R"(usage: ferry [--address=HOST:PORT] [-o text|table|json|yaml] COMMAND ...

  submit FILE [--wait] [--set=FIELD=VALUE,...]   submit a job file; --wait watches it to the end
  list [--state=running,...]                      list jobs
  get ID                                          show one job
  watch ID                                        follow a job's progress until it ends
  cancel ID                                       cancel a pending or running job
  info                                            show the daemon's version, devices and limits
  memory ID [--rank=N] [--svg=FILE]               show where a job's model data lives; --svg
                                                  draws it, period by period, as a picture
  top ID [--interval=S] [--once]                  a live view of a running job: progress, memory
                                                  per tier, bytes moved, where the step's time goes
  data prepare --out=FILE TEXT_FILE...            tokenise text into a token file; --tokenizer=
      [--tokenizer=byte|gpt2|sentencepiece|DIR]   byte (default), gpt2 (--vocab=vocab.json
      [--vocab=F --merges=F | --sp_model=F]       --merges=merges.txt), sentencepiece
                                                  (--sp_model=FILE.model), or a Hugging Face
                                                  model folder or its tokenizer.json; the
                                                  file's header records the tokenizer
  data train-tokenizer --vocab_size=N             train a SentencePiece model on text files:
      --model_type=bpe|unigram --out=PREFIX       writes PREFIX.model and PREFIX.vocab
      TEXT_FILE...
  export ID OUT.safetensors | DIR                 write a job's latest checkpointed weights (fp32,
                                                  the model family's Hugging Face names) as one
                                                  file, or as a model folder from_pretrained loads
  generate ID --prompt=TEXT | --prompt_ids=1,2,3  continue a prompt with the job's newest checkpoint,
      [--max_tokens=64] [--temperature=1]         printing the text as it comes (ids for a job
      [--top_k=K] [--top_p=P] [--seed=S]          without a tokenizer); --temperature=0 is greedy
  generate --weights=FILE.safetensors [--heads=N] the same from an exported weights file, with a
      [--tokenizer=... --vocab= --merges= | --sp_model=]  tokenizer given as data prepare takes it
  completion bash|zsh                             print shell completion (source <(ferry completion bash))

  --address   ferryd's address (default $FERRY_ADDRESS, else 127.0.0.1:50051)
  --token     bearer token for a ferryd with --tokens_file (default $FERRY_TOKEN)
  --tls_ca    PEM CA that signed ferryd's certificate; turns TLS on (default $FERRY_TLS_CA)
  --tls_cert, --tls_key   this client's PEM certificate and key, for a ferryd that
              requires client certificates (default $FERRY_TLS_CERT, $FERRY_TLS_KEY)
  -o          text (or table, the same), json or yaml: every command's output
  --timeout   seconds to wait for each answer (default 10)
Exit codes: 0 ok, 1 the job failed or was cancelled, 2 bad usage or a refused request,
3 ferryd unreachable.
)";
}

}  // namespace ferry
