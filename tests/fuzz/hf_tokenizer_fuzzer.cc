// Fuzzes a Hugging Face tokenizer.json (engine/data/hf_tokenizer). The input
// is tokenizer.json, "\n--\n", tokenizer_config.json, "\n--\n", text.
// HfTokenizer::FromContents gives a tokenizer or INVALID_ARGUMENT naming the
// file, never a crash or a hang; a tokenizer encodes the text into ids below
// its vocabulary, with and without its special tokens, and decodes them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/data/hf_tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

using ferry::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t first = input.find("\n--\n");
  if (first == absl::string_view::npos) return 0;
  const size_t second = input.find("\n--\n", first + 4);
  if (second == absl::string_view::npos) return 0;
  const absl::string_view json = input.substr(0, first);
  const absl::string_view config = input.substr(first + 4, second - first - 4);
  const absl::string_view text = input.substr(second + 4);
  ferry::TokenizerSpec spec{ferry::kHfTokenizer, {"tokenizer.json", "tokenizer_config.json"}};
  absl::StatusOr<std::unique_ptr<ferry::HfTokenizer>> tokenizer = ferry::HfTokenizer::FromContents(json, config, spec);
  if (!tokenizer.ok()) {
    if (tokenizer.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail(absl::StrCat("an error other than INVALID_ARGUMENT: ", tokenizer.status().message()));
    }
    if (!absl::StrContains(tokenizer.status().message(), "tokenizer")) Fail("an error not naming the file");
    return 0;
  }
  for (const std::vector<uint32_t>& ids : {(*tokenizer)->Encode(text), (*tokenizer)->EncodeWithSpecialTokens(text)}) {
    for (uint32_t id : ids) {
      if (static_cast<int64_t>(id) >= (*tokenizer)->vocab_size()) Fail("an id beyond the vocabulary");
    }
    if (!(*tokenizer)->Decode(ids).ok()) Fail("its own ids do not decode");
  }
  return 0;
}
