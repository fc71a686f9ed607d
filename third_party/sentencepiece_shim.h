#pragma once

// Debian's libsentencepiece behind standard types only, loaded privately at
// run time (sentencepiece_c.cc says why). Its headers declare
// `namespace absl { using std::string_view; }`, which clashes with Debian's
// Abseil (absl::string_view is a class there), so only
// sentencepiece_shim.cc includes them and no Abseil header may be included
// with this file's implementation. Errors come back as strings; callers turn
// them into absl::Status.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {
namespace sentencepiece_shim {

// A loaded SentencePiece model (.model file). Encode and Decode are
// thread-safe (the library's processor is const for them).
class Processor {
 public:
  // Loads `path`; nullptr with `*error` set when the file is not a model.
  static std::unique_ptr<Processor> Load(const std::string& path, std::string* error);
  ~Processor();

  // Pieces in the model; ids are 0 .. size()-1.
  int size() const;
  std::vector<int> Encode(std::string_view text) const;
  std::string Decode(const std::vector<int>& ids) const;

 private:
  struct Impl;
  explicit Processor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Trains a model with SentencePieceTrainer::Train. `options` are trainer
// flags without the leading dashes (model_prefix, vocab_size, model_type,
// ...); `next_sentence` yields the training sentences one by one (false
// when there are no more). True on success, else false with `*error` set.
bool Train(const std::map<std::string, std::string>& options,
           const std::function<bool(std::string*)>& next_sentence, std::string* error);

}  // namespace sentencepiece_shim
}  // namespace ferry
