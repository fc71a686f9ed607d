// Loads libferry_sentencepiece.so (sentencepiece_c.cc) privately and calls it
// through its C interface; see that file for why. Includes no Abseil and no
// SentencePiece header.
#include "third_party/sentencepiece_shim.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace ferry {
namespace sentencepiece_shim {
namespace {

constexpr char kLibrary[] = "libferry_sentencepiece.so";

struct Api {
  void* (*load)(const char*, char*, size_t) = nullptr;
  void (*free)(void*) = nullptr;
  int (*size)(const void*) = nullptr;
  void (*encode)(const void*, const char*, size_t, void (*)(void*, const int*, size_t), void*) = nullptr;
  void (*decode)(const void*, const int*, size_t, void (*)(void*, const char*, size_t), void*) = nullptr;
  int (*train)(const char* const*, const char* const*, size_t, int (*)(void*, const char**, size_t*), void*, char*,
               size_t) = nullptr;
  std::string error;
};

std::string ExeDir() {
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) return ".";
  std::string exe(buffer, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

std::vector<std::string> Candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("FERRY_SENTENCEPIECE_LIB"); env && *env) paths.push_back(env);
  const std::string dir = ExeDir();
  char buffer[4096];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  const std::string exe = n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  // Installed: /usr/bin/ferry with /usr/lib/ferry/libferry_sentencepiece.so.
  paths.push_back(dir + "/../lib/ferry/" + kLibrary);
  paths.push_back(dir + "/" + kLibrary);
  // Under Bazel: the binary's or test's runfiles.
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* root = std::getenv(var); root && *root) {
      paths.push_back(std::string(root) + "/ferry/third_party/" + kLibrary);
    }
  }
  if (!exe.empty()) paths.push_back(exe + ".runfiles/ferry/third_party/" + kLibrary);
  return paths;
}

const Api& GetApi() {
  static Api* api = [] {
    auto* a = new Api();
    int flags = RTLD_NOW | RTLD_LOCAL;
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(thread_sanitizer)
    flags |= RTLD_DEEPBIND;
#endif
#else
    flags |= RTLD_DEEPBIND;
#endif
#endif
    void* handle = nullptr;
    std::string tried;
    for (const std::string& path : Candidates()) {
      if (access(path.c_str(), R_OK) != 0) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      handle = dlopen(path.c_str(), flags);
      if (handle == nullptr) {
        a->error = std::string("cannot load ") + path + ": " + dlerror();
        return a;
      }
      break;
    }
    if (handle == nullptr) {
      a->error = std::string("SentencePiece support (") + kLibrary + ") not found; looked at " + tried +
                 "; set FERRY_SENTENCEPIECE_LIB to its path";
      return a;
    }
    a->load = reinterpret_cast<decltype(a->load)>(dlsym(handle, "ferry_sp_load"));
    a->free = reinterpret_cast<decltype(a->free)>(dlsym(handle, "ferry_sp_free"));
    a->size = reinterpret_cast<decltype(a->size)>(dlsym(handle, "ferry_sp_size"));
    a->encode = reinterpret_cast<decltype(a->encode)>(dlsym(handle, "ferry_sp_encode"));
    a->decode = reinterpret_cast<decltype(a->decode)>(dlsym(handle, "ferry_sp_decode"));
    a->train = reinterpret_cast<decltype(a->train)>(dlsym(handle, "ferry_sp_train"));
    if (!a->load || !a->free || !a->size || !a->encode || !a->decode || !a->train) {
      a->error = std::string(kLibrary) + " lacks its functions (a different version?)";
      a->load = nullptr;
    }
    return a;
  }();
  return *api;
}

}  // namespace

struct Processor::Impl {
  void* handle = nullptr;
  ~Impl() {
    if (handle) GetApi().free(handle);
  }
};

Processor::Processor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Processor::~Processor() = default;

std::unique_ptr<Processor> Processor::Load(const std::string& path, std::string* error) {
  const Api& api = GetApi();
  if (api.load == nullptr) {
    *error = api.error;
    return nullptr;
  }
  char message[1024] = {};
  void* handle = api.load(path.c_str(), message, sizeof message);
  if (handle == nullptr) {
    *error = message;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->handle = handle;
  return std::unique_ptr<Processor>(new Processor(std::move(impl)));
}

int Processor::size() const { return GetApi().size(impl_->handle); }

std::vector<int> Processor::Encode(std::string_view text) const {
  std::vector<int> ids;
  GetApi().encode(
      impl_->handle, text.data(), text.size(),
      [](void* out, const int* data, size_t n) { static_cast<std::vector<int>*>(out)->assign(data, data + n); }, &ids);
  return ids;
}

std::string Processor::Decode(const std::vector<int>& ids) const {
  std::string text;
  GetApi().decode(
      impl_->handle, ids.data(), ids.size(),
      [](void* out, const char* data, size_t n) { static_cast<std::string*>(out)->assign(data, n); }, &text);
  return text;
}

bool Train(const std::map<std::string, std::string>& options,
           const std::function<bool(std::string*)>& next_sentence, std::string* error) {
  const Api& api = GetApi();
  if (api.train == nullptr) {
    *error = api.error;
    return false;
  }
  std::vector<const char*> keys, values;
  for (const auto& kv : options) {
    keys.push_back(kv.first.c_str());
    values.push_back(kv.second.c_str());
  }
  struct Context {
    const std::function<bool(std::string*)>* next;
    std::string sentence;
  } context{&next_sentence, {}};
  char message[1024] = {};
  const int ok = api.train(
      keys.data(), values.data(), keys.size(),
      [](void* c, const char** data, size_t* size) {
        auto* ctx = static_cast<Context*>(c);
        if (!(*ctx->next)(&ctx->sentence)) return 0;
        *data = ctx->sentence.data();
        *size = ctx->sentence.size();
        return 1;
      },
      &context, message, sizeof message);
  if (!ok) *error = message;
  return ok != 0;
}

}  // namespace sentencepiece_shim
}  // namespace ferry
