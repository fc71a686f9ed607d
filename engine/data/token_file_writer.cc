#include "engine/data/token_file_writer.h"

#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/data/token_file.h"

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

bool PrintableAscii(char c) { return c > ' ' && c < 0x7f; }

// The end of the last line in text[from, size) after which the text may be
// cut (see the header), or 0 when there is none.
size_t LastCut(const std::string& text, size_t from) {
  for (size_t p = text.size() - 1; p >= std::max<size_t>(from, 2) && p < text.size(); --p) {
    if (text[p - 1] == '\n' && PrintableAscii(text[p]) && PrintableAscii(text[p - 2])) return p;
  }
  return 0;
}

std::string Absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

}  // namespace

absl::StatusOr<PrepareStats> PrepareTokenFile(const std::vector<std::string>& inputs, const std::string& output,
                                              Tokenizer& tokenizer, const PrepareProgress& progress,
                                              size_t block_bytes) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files given");
  for (const std::string& input : inputs) {
    if (!std::ifstream(input)) return absl::NotFoundError(absl::StrCat("cannot read input ", input));
  }
  TokenFileInfo info;
  info.tokenizer = tokenizer.spec();
  for (std::string& f : info.tokenizer.files) f = Absolute(f);
  info.vocab_size = tokenizer.vocab_size();
  info.token_bytes = TokenBytesFor(info.vocab_size);
  // Room for any token count (20 digits), filled in at the end.
  const size_t json_bytes = TokenFileJsonBytes(info) + 20;
  const std::string header = EncodeTokenFileHeader(info, json_bytes);

  const std::string tmp = absl::StrCat(output, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  PrepareStats stats;
  absl::Status status = WriteAll(fd, header.data(), header.size(), tmp);
  std::string pending;
  std::string block(block_bytes, '\0');
  std::string out;
  auto encode = [&](absl::string_view text) {
    const std::vector<uint32_t> ids = tokenizer.Encode(text);
    out.resize(ids.size() * static_cast<size_t>(info.token_bytes));
    if (info.token_bytes == 2) {
      for (size_t i = 0; i < ids.size(); ++i) {
        const uint16_t v = htole16(static_cast<uint16_t>(ids[i]));
        std::memcpy(&out[i * 2], &v, 2);
      }
    } else {
      for (size_t i = 0; i < ids.size(); ++i) {
        const uint32_t v = htole32(ids[i]);
        std::memcpy(&out[i * 4], &v, 4);
      }
    }
    stats.tokens += static_cast<int64_t>(ids.size());
    return WriteAll(fd, out.data(), out.size(), tmp);
  };
  for (const std::string& input : inputs) {
    if (!status.ok()) break;
    std::ifstream in(input, std::ios::binary);
    if (!in) {
      status = absl::NotFoundError(absl::StrCat("cannot read input ", input));
      break;
    }
    pending.clear();
    while (status.ok()) {
      in.read(block.data(), static_cast<std::streamsize>(block.size()));
      const size_t got = static_cast<size_t>(in.gcount());
      if (got == 0) break;
      const size_t scanned = pending.size();
      pending.append(block.data(), got);
      stats.bytes += static_cast<int64_t>(got);
      const size_t cut = LastCut(pending, scanned);
      if (cut == 0) continue;
      status = encode(absl::string_view(pending).substr(0, cut));
      pending.erase(0, cut);
      if (progress && status.ok()) progress(input, false, stats);
    }
    if (status.ok() && in.bad()) status = absl::InternalError(absl::StrCat("read ", input, " failed"));
    if (status.ok() && !pending.empty()) status = encode(pending);
    if (!status.ok()) break;
    ++stats.files;
    if (progress) progress(input, true, stats);
  }
  if (status.ok()) {
    // Rewritten in place: the reserved JSON has room for any count.
    info.token_count = stats.tokens;
    const std::string final_header = EncodeTokenFileHeader(info, json_bytes);
    if (final_header.size() != header.size()) {
      status = absl::InternalError("the token file header grew past its reserved size");
    } else if (pwrite(fd, final_header.data(), final_header.size(), 0) != static_cast<ssize_t>(final_header.size())) {
      status = absl::InternalError(absl::StrCat("write ", tmp, ": ", std::strerror(errno)));
    }
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
