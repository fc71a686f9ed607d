#include "server/worker/generate_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/checkpoint/model_files.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/common/safe_path.h"
#include "engine/common/status_macros.h"
#include "engine/data/hf_tokenizer.h"
#include "engine/data/text_stream.h"
#include "engine/data/token_file.h"
#include "engine/data/tokenizer_loader.h"
#include "engine/memory/memory_device.h"
#include "engine/model/gpt2_weights.h"
#include "engine/model/hf_layout.h"
#include "engine/train/generator.h"
#include "google/protobuf/util/json_util.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/spec_validator.h"
#include "ferry/internal/worker.pb.h"
#include "server/worker/frame.h"
#include "server/worker/generate_request.h"
#include "server/worker/job_setup.h"
#include "server/worker/worker.h"

namespace ferry {
namespace {

absl::StatusOr<ferry::v1::GenerateRequest> LoadRequest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--generate: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  ferry::v1::GenerateRequest request;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &request).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--generate: ", path, " is not a GenerateRequest as JSON"));
  }
  return request;
}

// The model, its tokenizer (null: ids alone) and the checkpoint's step.
struct LoadedModel {
  std::unique_ptr<MemoryDevice> device;
  std::unique_ptr<InferenceModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t step = 0;
  // The model's end-of-sequence tokens, where it says.
  std::vector<int64_t> stop_tokens;
};

absl::Status LoadFromJob(const GenerateTextOptions& options, const AllowedRoots& roots, LoadedModel* out) {
  ASSIGN_OR_RETURN(ferry::v1::JobSpec spec, LoadCheckedJobFile(options.spec_path));
  if (spec.parallel().tensor() > 1) {
    return absl::FailedPreconditionError(
        "parallel.tensor: generating from a tensor-parallel job's checkpoints is not supported; export its weights "
        "(ferry export JOB FILE.safetensors) and generate from the file (ferry generate --weights=FILE.safetensors)");
  }
  ASSIGN_OR_RETURN(std::vector<LoadedCheckpoint> loaded, LoadJobCheckpoints(spec, roots, 1, "generate"));
  out->step = loaded[0].contents.step;
  ASSIGN_OR_RETURN(out->device, MakeMemoryDevice(options.device == "auto" ? "cpu" : options.device,
                                                 spec.memory().device_budget()));
  const JobEngineSetup setup = SetUpJobEngine(spec, EngineUse::kRead);
  ASSIGN_OR_RETURN(out->model,
                   RestoreInferenceModel(setup.model, setup.train, setup.memory, loaded[0].contents,
                                         out->device.get(), std::max<int>(1, spec.parallel().data())));
  // The tokenizer the token file's header records; none for synthetic
  // data or a flat file.
  if (!spec.data().has_synthetic() && !spec.data().path().empty()) {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenConfinedFile(roots, "data.path", spec.data().path()));
    ASSIGN_OR_RETURN(TokenFileInfo info, ReadTokenFileInfo(fd.get(), spec.data().path()));
    if (info.has_header) {
      for (const std::string& file : info.tokenizer.files) {
        RETURN_IF_ERROR(CheckConfined(roots, "data.path's tokenizer", file, PathKind::kFile).status());
      }
      ASSIGN_OR_RETURN(out->tokenizer, LoadTokenizer(info, spec.data().path()));
    }
  }
  // Where generation stops: the model folder the job started from says,
  // else its tokenizer.
  const std::string& from = spec.model().init_from();
  if (!from.empty() && ModelFiles::IsFolder(from)) {
    absl::StatusOr<HfConfig> origin = ReadHfFolderConfig(from);
    if (origin.ok()) out->stop_tokens = origin->eos_token_ids;
  }
  return absl::OkStatus();
}

absl::Status LoadFromWeights(const ferry::v1::GenerateRequest& request, const GenerateTextOptions& options,
                             const AllowedRoots& roots, LoadedModel* out) {
  const std::string& path = request.weights_path();
  absl::StatusOr<ModelConfig> config;
  if (ModelFiles::IsFolder(path)) {
    // A Hugging Face model folder: its config.json, and the end-of-sequence
    // tokens generation stops at (generation_config.json's, else
    // config.json's).
    RETURN_IF_ERROR(CheckConfined(roots, "weights_path", path, PathKind::kDirectory).status());
    for (const char* file : {"/config.json", "/generation_config.json"}) {
      absl::StatusOr<ResolvedPath> confined = CheckConfined(roots, "weights_path", path + file, PathKind::kFile);
      if (!confined.ok() && !absl::IsNotFound(confined.status())) return confined.status();
    }
    absl::StatusOr<HfConfig> folder = ReadHfFolderConfig(path);
    if (!folder.ok()) return absl::InvalidArgumentError(absl::StrCat("weights_path: ", folder.status().message()));
    config = folder->model;
    out->stop_tokens = folder->eos_token_ids;
  } else {
    RETURN_IF_ERROR(CheckConfined(roots, "weights_path", path, PathKind::kFile).status());
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
    if (!reader.ok()) return absl::InvalidArgumentError(absl::StrCat("weights_path: ", reader.status().message()));
    config = Gpt2ConfigFromWeights(reader->index(), path, request.heads());
  }
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat("weights_path: ", config.status().message()));
  ASSIGN_OR_RETURN(out->device, MakeMemoryDevice(options.device == "auto" ? "cpu" : options.device, 0));
  ASSIGN_OR_RETURN(out->model,
                   LoadInferenceModel(path, *config, TrainOptions(), MemoryOptions(), out->device.get()));
  if (request.tokenizer().empty() && ModelFiles::IsFolder(path)) {
    // A model folder's own tokenizer, where it has one.
    absl::StatusOr<TokenizerSpec> spec = HfTokenizerSpec(path);
    if (spec.ok()) {
      for (const std::string& file : spec->files) {
        RETURN_IF_ERROR(CheckConfined(roots, "weights_path", file, PathKind::kFile).status());
      }
      absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(*spec);
      if (!tokenizer.ok()) return absl::InvalidArgumentError(absl::StrCat("weights_path: ", tokenizer.status().message()));
      out->tokenizer = *std::move(tokenizer);
    }
  } else if (!request.tokenizer().empty()) {
    TokenizerSpec spec;
    spec.kind = request.tokenizer();
    for (const std::string& file : request.tokenizer_files()) {
      RETURN_IF_ERROR(CheckConfined(roots, "tokenizer_files", file, PathKind::kFile).status());
      spec.files.push_back(file);
    }
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(spec);
    if (!tokenizer.ok()) return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", tokenizer.status().message()));
    if ((*tokenizer)->vocab_size() > config->vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: its vocabulary of ", (*tokenizer)->vocab_size(),
                                                     " ids is larger than the model's ", config->vocab_size,
                                                     "; give the tokenizer the model was trained with"));
    }
    out->tokenizer = *std::move(tokenizer);
  }
  return absl::OkStatus();
}

// Frames on the report descriptor, or readable lines on stdout.
class Output {
 public:
  explicit Output(int fd) : fd_(fd) {}
  bool Write(const ferry::v1::GenerateResponse& response, bool ids_only) {
    if (fd_ >= 0) {
      ferry::internal::GenerateFrame frame;
      *frame.mutable_response() = response;
      return WriteFrame(fd_, frame).ok();
    }
    if (response.has_started()) return true;
    if (response.has_token()) {
      if (ids_only) {
        std::printf("%u ", response.token().id());
      } else {
        std::fputs(response.token().text().c_str(), stdout);
      }
    } else {
      const ferry::v1::GenerateSummary& s = response.summary();
      std::printf("%s\n(%u tokens in %.2f s)\n", s.text().c_str(), s.generated_tokens(), s.seconds());
    }
    std::fflush(stdout);
    return true;
  }

 private:
  int fd_;
};

}  // namespace

absl::Status GenerateText(const GenerateTextOptions& options) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(options.allowed_roots);
  if (!roots.ok()) return absl::InvalidArgumentError(absl::StrCat("--allowed_roots: ", roots.status().message()));
  ASSIGN_OR_RETURN(ferry::v1::GenerateRequest request, LoadRequest(options.request_path));
  RETURN_IF_ERROR(ValidateGenerateRequest(request));
  LoadedModel loaded;
  if (request.model_case() == ferry::v1::GenerateRequest::kJobId) {
    if (options.spec_path.empty()) return absl::InvalidArgumentError("--spec: the job's spec is needed for job_id");
    RETURN_IF_ERROR(LoadFromJob(options, *roots, &loaded));
  } else {
    RETURN_IF_ERROR(LoadFromWeights(request, options, *roots, &loaded));
  }
  if (loaded.stop_tokens.empty()) {
    if (const auto* hf = dynamic_cast<const HfTokenizer*>(loaded.tokenizer.get()); hf != nullptr) {
      for (uint32_t id : hf->eos_ids()) loaded.stop_tokens.push_back(id);
    }
  }
  std::vector<int64_t> prompt;
  if (!request.prompt().empty()) {
    if (loaded.tokenizer == nullptr) {
      return absl::FailedPreconditionError(
          request.model_case() == ferry::v1::GenerateRequest::kJobId
              ? "prompt: the job's data records no tokenizer (synthetic data or a token file without a header); "
                "give token ids (prompt_ids)"
              : "prompt: a text needs a tokenizer; give tokenizer (and tokenizer_files), or token ids (prompt_ids)");
    }
    for (uint32_t id : loaded.tokenizer->Encode(request.prompt())) prompt.push_back(id);
  } else {
    for (uint32_t id : request.prompt_ids()) prompt.push_back(id);
  }
  SamplingOptions sampling;
  sampling.max_tokens = request.has_max_tokens() ? request.max_tokens().value() : kDefaultGenerateTokens;
  sampling.temperature = request.has_temperature() ? request.temperature().value() : 1.0;
  sampling.top_k = request.top_k();
  sampling.top_p = request.has_top_p() ? request.top_p().value() : 1.0;
  sampling.seed = request.seed();
  sampling.stop_tokens = loaded.stop_tokens;
  Output output(options.report_fd);
  {
    ferry::v1::GenerateResponse started;
    started.mutable_started()->set_prompt_tokens(static_cast<uint32_t>(prompt.size()));
    started.mutable_started()->set_step(static_cast<uint64_t>(loaded.step));
    if (loaded.tokenizer != nullptr) started.mutable_started()->set_tokenizer(loaded.tokenizer->kind());
    if (!output.Write(started, loaded.tokenizer == nullptr)) return absl::CancelledError("the reader has gone");
  }
  std::optional<TextStream> text;
  if (loaded.tokenizer != nullptr) text.emplace(loaded.tokenizer.get());
  absl::Status decode_error;
  ASSIGN_OR_RETURN(GenerationStats stats,
                   Generate(*loaded.model, prompt, sampling, [&](int64_t id) {
                     ferry::v1::GenerateResponse response;
                     response.mutable_token()->set_id(static_cast<uint32_t>(id));
                     if (text.has_value()) {
                       absl::StatusOr<std::string> piece = text->Push(static_cast<uint32_t>(id));
                       if (!piece.ok()) {
                         decode_error = piece.status();
                         return false;
                       }
                       response.mutable_token()->set_text(*piece);
                     }
                     return output.Write(response, !text.has_value());
                   }));
  RETURN_IF_ERROR(decode_error);
  ferry::v1::GenerateResponse done;
  ferry::v1::GenerateSummary& summary = *done.mutable_summary();
  summary.set_prompt_tokens(static_cast<uint32_t>(stats.prompt_tokens));
  summary.set_generated_tokens(static_cast<uint32_t>(stats.generated_tokens));
  summary.set_seconds(stats.seconds);
  summary.set_first_token_seconds(stats.first_token_seconds);
  summary.set_step(static_cast<uint64_t>(loaded.step));
  if (loaded.tokenizer != nullptr) summary.set_tokenizer(loaded.tokenizer->kind());
  if (text.has_value()) summary.set_text(text->Finish());
  if (!output.Write(done, !text.has_value())) return absl::CancelledError("the reader has gone");
  return absl::OkStatus();
}

int RunGenerateText(const GenerateTextOptions& options) {
  const absl::Status status = GenerateText(options);
  if (status.ok()) return kWorkerSucceeded;
  std::fprintf(stderr, "ferry-worker: %s\n", std::string(status.message()).c_str());
  if (options.report_fd >= 0) {
    ferry::internal::GenerateFrame frame;
    frame.mutable_error()->set_code(static_cast<int32_t>(status.code()));
    frame.mutable_error()->set_message(std::string(status.message()));
    (void)WriteFrame(options.report_fd, frame);
  }
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kNotFound:
      return kWorkerBadUsage;
    default:
      return kWorkerFailed;
  }
}

}  // namespace ferry
