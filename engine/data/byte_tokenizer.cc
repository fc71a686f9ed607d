#include "engine/data/byte_tokenizer.h"

#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<uint16_t> EncodeBytes(absl::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string DecodeBytes(const std::vector<uint16_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) text[i] = static_cast<char>(tokens[i] & 0xff);
  return text;
}

absl::StatusOr<PrepareStats> PrepareTokenFile(
    const std::vector<std::string>& inputs, const std::string& output,
    const std::function<void(const std::string&, int64_t)>& on_file) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files given");
  const std::string tmp = absl::StrCat(output, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  PrepareStats stats;
  absl::Status status;
  std::vector<char> buffer(1 << 20);
  std::vector<uint16_t> encoded;
  for (const std::string& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    if (!in) {
      status = absl::NotFoundError(absl::StrCat("cannot read input ", input));
      break;
    }
    while (status.ok() && in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const size_t got = static_cast<size_t>(in.gcount());
      if (got == 0) break;
      encoded = EncodeBytes(absl::string_view(buffer.data(), got));
      for (uint16_t& t : encoded) t = htole16(t);
      status = WriteAll(fd, reinterpret_cast<const char*>(encoded.data()),
                        encoded.size() * sizeof(uint16_t), tmp);
      stats.tokens += static_cast<int64_t>(got);
    }
    if (!status.ok()) break;
    ++stats.files;
    if (on_file) on_file(input, stats.tokens);
  }
  if (status.ok() && fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", std::strerror(errno)));
  }
  close(fd);
  if (status.ok() && std::rename(tmp.c_str(), output.c_str()) != 0) {
    status = absl::InternalError(absl::StrCat("rename to ", output, ": ", std::strerror(errno)));
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return stats;
}

}  // namespace ferry
