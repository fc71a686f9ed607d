#include "server/worker/generate_request.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status ValidateGenerateRequest(const ferry::v1::GenerateRequest& request) {
  if (request.model_case() == ferry::v1::GenerateRequest::MODEL_NOT_SET) {
    return absl::InvalidArgumentError("job_id: give a job id, or weights_path: a safetensors file");
  }
  if (request.model_case() == ferry::v1::GenerateRequest::kWeightsPath && request.weights_path().empty()) {
    return absl::InvalidArgumentError("weights_path: is empty; give an absolute path to a .safetensors file");
  }
  if (request.prompt().empty() == (request.prompt_ids_size() == 0)) {
    return absl::InvalidArgumentError(request.prompt().empty()
                                          ? "prompt: is empty; give a text (prompt) or token ids (prompt_ids)"
                                          : "prompt: give a text (prompt) or token ids (prompt_ids), not both");
  }
  if (request.has_max_tokens() &&
      (request.max_tokens().value() < 1 || request.max_tokens().value() > kMaxGenerateTokens)) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", request.max_tokens().value(),
                                                   " is outside 1 .. ", kMaxGenerateTokens));
  }
  if (request.has_temperature() &&
      (!std::isfinite(request.temperature().value()) || request.temperature().value() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: ", request.temperature().value(),
                                                   " is not allowed; give 0 (greedy) or a positive number"));
  }
  if (request.has_top_p() && !(request.top_p().value() > 0 && request.top_p().value() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p: ", request.top_p().value(),
                                                   " is outside (0, 1]; give e.g. 0.9, or 1 to keep every token"));
  }
  if (request.model_case() == ferry::v1::GenerateRequest::kJobId &&
      (!request.tokenizer().empty() || request.tokenizer_files_size() > 0 || request.heads() > 0)) {
    return absl::InvalidArgumentError(
        "tokenizer: a job's tokenizer is the one its token file records; give tokenizer, tokenizer_files and "
        "heads only with weights_path");
  }
  const std::string& kind = request.tokenizer();
  const int files = request.tokenizer_files_size();
  if (!kind.empty() && kind != "byte" && kind != "gpt2" && kind != "sentencepiece" && kind != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: '", kind, "' is not one; give gpt2, sentencepiece, hf or byte"));
  }
  if ((kind == "byte" && files != 0) || (kind == "gpt2" && files != 2) || (kind == "sentencepiece" && files != 1) ||
      (kind == "hf" && (files < 1 || files > 2)) || (kind.empty() && files != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer_files: ", files, " given for tokenizer '", kind,
        "'; gpt2 takes vocab.json and merges.txt, sentencepiece its .model file, hf tokenizer.json (and "
        "tokenizer_config.json) or a model folder, byte none"));
  }
  for (const std::string& file : request.tokenizer_files()) {
    if (file.empty() || file[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer_files: '", file, "' is not an absolute path"));
    }
  }
  if (request.model_case() == ferry::v1::GenerateRequest::kWeightsPath && request.weights_path()[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("weights_path: '", request.weights_path(), "' is not an absolute path"));
  }
  return absl::OkStatus();
}

}  // namespace ferry
