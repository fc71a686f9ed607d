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
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(fd, path);
  if (!info.ok()) {
    close(fd);
    return absl::Status(info.status().code(), absl::StrCat("data.path: ", info.status().message()));
  }
  if (info->vocab_size > vocab_size) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path: ", path, " was tokenised with a vocabulary of ", info->vocab_size,
        ", larger than model.vocab_size ", vocab_size, "; set model.vocab_size to at least ", info->vocab_size,
        " or prepare the data with the model's tokenizer"));
  }
  const int64_t tokens = info->token_count;
  if (tokens < window) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "data.path: ", path, " holds ", tokens, " tokens, fewer than one training window of ",
        window, " (model.seq_len + 1); use more data or a shorter seq_len"));
  }
  const size_t bytes = info->data_offset + static_cast<size_t>(tokens) * static_cast<size_t>(info->token_bytes);
  void* mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("data.path: mmap ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TokenFileSource> source(new TokenFileSource(mapped, bytes, *info, seed));
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t token = source->Token(i);
    if (token >= vocab_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.path: token ", token, " at position ", i, " of ", path,
          " is not below model.vocab_size ", vocab_size, "; raise vocab_size to at least ",
          token + 1, " or re-tokenise the data"));
    }
  }
  return source;
}

TokenFileSource::TokenFileSource(void* mapped, size_t mapped_bytes, TokenFileInfo info, uint64_t seed)
    : mapped_(mapped),
      mapped_bytes_(mapped_bytes),
      info_(std::move(info)),
      data_(static_cast<const unsigned char*>(mapped) + info_.data_offset),
      token_count_(info_.token_count),
      rng_(seed) {}

TokenFileSource::~TokenFileSource() { munmap(mapped_, mapped_bytes_); }

int64_t TokenFileSource::Token(int64_t i) const {
  // The data is 8-byte aligned from a page-aligned mapping, so the loads are
  // aligned.
  if (info_.token_bytes == 2) return le16toh(reinterpret_cast<const uint16_t*>(data_)[i]);
  return le32toh(reinterpret_cast<const uint32_t*>(data_)[i]);
}

void TokenFileSource::SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) {
  tokens->resize(static_cast<size_t>(count * window));
  std::uniform_int_distribution<int64_t> start_dist(0, token_count_ - window);
  for (int64_t row = 0; row < count; ++row) {
    const int64_t start = start_dist(rng_);
    int64_t* out = tokens->data() + row * window;
    for (int64_t j = 0; j < window; ++j) out[j] = Token(start + j);
  }
}

}  // namespace ferry
