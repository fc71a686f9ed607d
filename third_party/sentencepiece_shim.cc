// Includes SentencePiece's headers and nothing from Abseil (see the header).
#include "third_party/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

namespace ferry {
namespace sentencepiece_shim {

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

Processor::Processor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Processor::~Processor() = default;

std::unique_ptr<Processor> Processor::Load(const std::string& path, std::string* error) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status status = impl->processor.Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<Processor>(new Processor(std::move(impl)));
}

int Processor::size() const { return impl_->processor.GetPieceSize(); }

std::vector<int> Processor::Encode(std::string_view text) const {
  std::vector<int> ids;
  // Fails only for an unloaded model; this one is loaded.
  (void)impl_->processor.Encode(text, &ids);
  return ids;
}

std::string Processor::Decode(const std::vector<int>& ids) const {
  std::string text;
  (void)impl_->processor.Decode(ids, &text);
  return text;
}

namespace {

// Feeds the trainer from the caller's function.
class FunctionIterator : public sentencepiece::SentenceIterator {
 public:
  explicit FunctionIterator(const std::function<bool(std::string*)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(&value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::function<bool(std::string*)>& next_;
  std::string value_;
  bool done_ = false;
};

}  // namespace

bool Train(const std::map<std::string, std::string>& options,
           const std::function<bool(std::string*)>& next_sentence, std::string* error) {
  const std::unordered_map<std::string, std::string> kwargs(options.begin(), options.end());
  FunctionIterator sentences(next_sentence);
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(kwargs, &sentences);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

}  // namespace sentencepiece_shim
}  // namespace ferry
