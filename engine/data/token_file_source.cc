#include "engine/data/token_file_source.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<TokenFileSource>> TokenFileSource::Open(const std::string& path,
                                                                       int64_t vocab_size,
                                                                       int64_t window,
                                                                       uint64_t seed) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("data.path: cannot open ", path, ": ", std::strerror(errno)));
  }
  return FromFd(fd, path, vocab_size, window, seed);
}

absl::StatusOr<std::unique_ptr<TokenFileSource>> TokenFileSource::FromFd(int fd, const std::string& path,
                                                                         int64_t vocab_size,
                                                                         int64_t window, uint64_t seed) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("data.path: ", path, " is not a regular file"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes % 2 != 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "data.path: ", path, " has ", bytes,
        " bytes, not a whole number of uint16 tokens; write it with `ferry data prepare`"));
  }
  const int64_t tokens = static_cast<int64_t>(bytes / 2);
  if (tokens < window) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "data.path: ", path, " holds ", tokens, " tokens, fewer than one training window of ",
        window, " (model.seq_len + 1); use more data or a shorter seq_len"));
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("data.path: mmap ", path, ": ", std::strerror(errno)));
  }
  const auto* data = static_cast<const uint16_t*>(mapped);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t token = le16toh(data[i]);
    if (token >= vocab_size) {
      munmap(mapped, bytes);
      return absl::FailedPreconditionError(absl::StrCat(
          "data.path: token ", token, " at position ", i, " of ", path,
          " is not below model.vocab_size ", vocab_size, "; raise vocab_size to at least ",
          token + 1, " or re-tokenise the data"));
    }
  }
  return std::unique_ptr<TokenFileSource>(new TokenFileSource(data, bytes, tokens, seed));
}

TokenFileSource::TokenFileSource(const uint16_t* data, size_t mapped_bytes, int64_t token_count,
                                 uint64_t seed)
    : data_(data), mapped_bytes_(mapped_bytes), token_count_(token_count), rng_(seed) {}

TokenFileSource::~TokenFileSource() { munmap(const_cast<uint16_t*>(data_), mapped_bytes_); }

void TokenFileSource::SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) {
  tokens->resize(static_cast<size_t>(count * window));
  std::uniform_int_distribution<int64_t> start_dist(0, token_count_ - window);
  for (int64_t row = 0; row < count; ++row) {
    const int64_t start = start_dist(rng_);
    int64_t* out = tokens->data() + row * window;
    for (int64_t j = 0; j < window; ++j) out[j] = le16toh(data_[start + j]);
  }
}

}  // namespace ferry
