// libferry_sentencepiece.so: Debian's libsentencepiece behind a C interface,
// loaded by sentencepiece_shim.cc with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a separate shared object: libsentencepiece carries its own copy of
// protobuf-lite and exports its symbols (google::protobuf::...). Linked into
// a program that also loads the system libprotobuf (every Ferry binary with
// gRPC), the two copies interpose on each other and the program crashes
// while starting. Loaded locally and bound deeply, the library uses its own
// copy and the rest of the program never sees it. Only plain C types and
// callbacks cross the boundary.

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

void SetError(const std::string& message, char* error, size_t error_bytes) {
  if (error_bytes == 0) return;
  const size_t n = std::min(message.size(), error_bytes - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

class CallbackIterator : public sentencepiece::SentenceIterator {
 public:
  CallbackIterator(int (*next)(void*, const char**, size_t*), void* context) : next_(next), context_(context) {
    Next();
  }
  bool done() const override { return done_; }
  void Next() override {
    const char* data = nullptr;
    size_t size = 0;
    done_ = next_(context_, &data, &size) == 0;
    if (!done_) value_.assign(data, size);
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  int (*next_)(void*, const char**, size_t*);
  void* context_;
  std::string value_;
  bool done_ = false;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* ferry_sp_load(const char* path, char* error, size_t error_bytes) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const sentencepiece::util::Status status = processor->Load(path);
  if (!status.ok()) {
    SetError(status.ToString(), error, error_bytes);
    delete processor;
    return nullptr;
  }
  return processor;
}

__attribute__((visibility("default"))) void ferry_sp_free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

__attribute__((visibility("default"))) int ferry_sp_size(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

// Calls `sink` once with all the ids.
__attribute__((visibility("default"))) void ferry_sp_encode(const void* processor, const char* text, size_t size,
                                                            void (*sink)(void*, const int*, size_t), void* context) {
  std::vector<int> ids;
  (void)static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Encode(std::string_view(text, size),
                                                                                      &ids);
  sink(context, ids.data(), ids.size());
}

__attribute__((visibility("default"))) void ferry_sp_decode(const void* processor, const int* ids, size_t count,
                                                            void (*sink)(void*, const char*, size_t), void* context) {
  std::string text;
  (void)static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Decode(
      std::vector<int>(ids, ids + count), &text);
  sink(context, text.data(), text.size());
}

// Trains with `count` flag/value pairs; `next` yields each sentence (returns
// 0 when there are none left). 1 on success, else 0 with `error` set.
__attribute__((visibility("default"))) int ferry_sp_train(const char* const* keys, const char* const* values,
                                                          size_t count, int (*next)(void*, const char**, size_t*),
                                                          void* context, char* error, size_t error_bytes) {
  std::unordered_map<std::string, std::string> kwargs;
  for (size_t i = 0; i < count; ++i) kwargs[keys[i]] = values[i];
  CallbackIterator sentences(next, context);
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(kwargs, &sentences);
  if (!status.ok()) {
    SetError(status.ToString(), error, error_bytes);
    return 0;
  }
  return 1;
}

}  // extern "C"
