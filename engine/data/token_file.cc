#include "engine/data/token_file.h"

#include <endian.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

constexpr size_t kMagicBytes = 8;
constexpr size_t kFixedBytes = 16;  // magic, version, JSON length

uint64_t RoundUp8(uint64_t n) { return (n + 7) / 8 * 8; }

uint32_t Le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return le32toh(v);
}

void PutLe32(uint32_t v, std::string* out) {
  v = htole32(v);
  out->append(reinterpret_cast<const char*>(&v), 4);
}

// An integer field of the header, within [lo, hi].
bool IntField(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return false;
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(v);
  } else {
    *out = it->get<int64_t>();
  }
  return *out >= lo && *out <= hi;
}

std::string HeaderJson(const TokenFileInfo& info) {
  nlohmann::json j;
  j["tokenizer"] = {{"kind", info.tokenizer.kind}, {"files", info.tokenizer.files}};
  j["vocab_size"] = info.vocab_size;
  j["token_bytes"] = info.token_bytes;
  j["token_count"] = info.token_count;
  // Invalid UTF-8 in a path is replaced rather than thrown on.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int TokenBytesFor(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

size_t TokenFileJsonBytes(const TokenFileInfo& info) { return HeaderJson(info).size(); }

std::string EncodeTokenFileHeader(const TokenFileInfo& info, size_t min_json_bytes) {
  std::string json = HeaderJson(info);
  if (json.size() < min_json_bytes) json.append(min_json_bytes - json.size(), ' ');
  std::string header(kTokenFileMagic, kMagicBytes);
  PutLe32(kTokenFileVersion, &header);
  PutLe32(static_cast<uint32_t>(json.size()), &header);
  header += json;
  header.resize(RoundUp8(header.size()), '\0');
  return header;
}

absl::StatusOr<TokenFileInfo> ParseTokenFileHeader(absl::string_view head, uint64_t file_size,
                                                   const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": damaged token file header: ", what, "; write the file again with `ferry data prepare`"));
  };
  TokenFileInfo info;
  if (head.size() < kMagicBytes || head.substr(0, kMagicBytes) != absl::string_view(kTokenFileMagic, kMagicBytes)) {
    // A flat file of uint16 tokens.
    if (file_size % 2 != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " has ", file_size,
          " bytes, not a whole number of uint16 tokens, and no token file header; write it with `ferry data prepare`"));
    }
    info.token_count = static_cast<int64_t>(file_size / 2);
    return info;
  }
  if (head.size() < kFixedBytes || file_size < kFixedBytes) {
    return bad(absl::StrCat("the file ends inside its first ", kFixedBytes, " bytes (truncated)"));
  }
  const uint32_t version = Le32(head.data() + 8);
  if (version != kTokenFileVersion) {
    return bad(absl::StrCat("format version ", version, ", but this build reads version ", kTokenFileVersion));
  }
  const uint32_t json_bytes = Le32(head.data() + 12);
  if (json_bytes == 0 || json_bytes > kMaxTokenFileJsonBytes) {
    return bad(absl::StrCat("a description of ", json_bytes, " bytes (0 or over ", kMaxTokenFileJsonBytes, ")"));
  }
  info.data_offset = RoundUp8(kFixedBytes + json_bytes);
  if (file_size < info.data_offset || head.size() < kFixedBytes + json_bytes) {
    return bad(absl::StrCat("the file (", file_size, " bytes) ends inside its ", info.data_offset,
                            "-byte header (truncated)"));
  }
  const absl::string_view json_text = head.substr(kFixedBytes, json_bytes);
  const nlohmann::json j = nlohmann::json::parse(json_text.begin(), json_text.end(), nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("its description is not a JSON object");
  auto tokenizer = j.find("tokenizer");
  if (tokenizer == j.end() || !tokenizer->is_object()) return bad("no \"tokenizer\" object");
  auto kind = tokenizer->find("kind");
  if (kind == tokenizer->end() || !kind->is_string() || kind->get_ref<const std::string&>().empty()) {
    return bad("no tokenizer \"kind\"");
  }
  info.tokenizer.kind = kind->get<std::string>();
  auto files = tokenizer->find("files");
  if (files == tokenizer->end() || !files->is_array()) return bad("no tokenizer \"files\" list");
  for (const nlohmann::json& f : *files) {
    if (!f.is_string()) return bad("a tokenizer file that is not a string");
    info.tokenizer.files.push_back(f.get<std::string>());
  }
  int64_t token_bytes = 0;
  if (!IntField(j, "vocab_size", 1, int64_t{1} << 32, &info.vocab_size)) {
    return bad("no \"vocab_size\" from 1 to 2^32");
  }
  if (!IntField(j, "token_bytes", 2, 4, &token_bytes) || token_bytes == 3) return bad("\"token_bytes\" is not 2 or 4");
  info.token_bytes = static_cast<int>(token_bytes);
  if (token_bytes == 2 && info.vocab_size > 65536) {
    return bad(absl::StrCat("vocab_size ", info.vocab_size, " does not fit 2-byte tokens"));
  }
  if (!IntField(j, "token_count", 0, std::numeric_limits<int64_t>::max(), &info.token_count)) {
    return bad("no \"token_count\"");
  }
  const uint64_t data_bytes = file_size - info.data_offset;
  if (data_bytes % static_cast<uint64_t>(token_bytes) != 0 ||
      data_bytes / static_cast<uint64_t>(token_bytes) != static_cast<uint64_t>(info.token_count)) {
    return bad(absl::StrCat("it records ", info.token_count, " tokens of ", token_bytes, " bytes, but ", data_bytes,
                            " bytes follow it (truncated or appended to)"));
  }
  info.has_header = true;
  return info;
}

absl::StatusOr<TokenFileInfo> ReadTokenFileInfo(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min<uint64_t>(size, kFixedBytes), '\0');
  auto read_at = [&](size_t from) -> absl::Status {
    size_t done = from;
    while (done < head.size()) {
      const ssize_t n = pread(fd, &head[done], head.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::InternalError(absl::StrCat("read ", path, ": ", n < 0 ? std::strerror(errno) : "file shrank"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read_at(0); !s.ok()) return s;
  if (head.size() == kFixedBytes && head.compare(0, kMagicBytes, kTokenFileMagic, kMagicBytes) == 0) {
    const uint32_t json_bytes = Le32(head.data() + 12);
    if (json_bytes <= kMaxTokenFileJsonBytes) {
      head.resize(std::min<uint64_t>(size, kFixedBytes + json_bytes), '\0');
      if (absl::Status s = read_at(kFixedBytes); !s.ok()) return s;
    }
  }
  return ParseTokenFileHeader(head, size, path);
}

absl::StatusOr<TokenFileInfo> ReadTokenFileInfo(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(fd, path);
  close(fd);
  return info;
}

}  // namespace ferry
