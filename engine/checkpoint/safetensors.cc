#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ferry {

int64_t SafetensorsDtypeBytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

uint64_t SafetensorsHeaderBytes(absl::string_view first8) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[static_cast<size_t>(i)]);
  return n;
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(std::vector<SafetensorsEntry>* entries,
                                              const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> items;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) kv.push_back(absl::StrCat(JsonString(k), ":", JsonString(v)));
    items.push_back(absl::StrCat("\"__metadata__\":{", absl::StrJoin(kv, ","), "}"));
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (SafetensorsEntry& t : *entries) {
    const int64_t size = SafetensorsDtypeBytes(t.dtype);
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": unknown dtype ", t.dtype));
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: bad or repeated tensor name '", t.name, "'"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": negative dimension"));
    }
    t.bytes = static_cast<uint64_t>(t.numel() * size);
    t.offset = offset;
    items.push_back(absl::StrCat(JsonString(t.name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                                 absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
                                 offset + t.bytes, "]}"));
    offset += t.bytes;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(items, ","), "}");
  // Pad with spaces so that the data starts 8-byte aligned.
  while ((8 + header.size()) % 8 != 0) header += ' ';
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(header);
  for (SafetensorsEntry& t : *entries) t.offset += out.size();
  return out;
}

absl::Status SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata, std::string* out) {
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  absl::StatusOr<std::string> header = SafetensorsHeader(&entries, metadata);
  if (!header.ok()) return header.status();
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (entries[i].bytes != tensors[i].data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: ", tensors[i].name, ": ", tensors[i].data.size(),
                                                     " bytes for ", entries[i].numel(), " values of ",
                                                     tensors[i].dtype));
    }
    data_bytes += entries[i].bytes;
  }
  out->clear();
  out->reserve(header->size() + data_bytes);
  out->append(*header);
  for (const SafetensorsTensor& t : tensors) out->append(t.data);
  return absl::OkStatus();
}

// --- Writing a tensor at a time. ---

namespace {

absl::Status WriteAt(int fd, const char* data, uint64_t bytes, uint64_t offset, const std::string& what) {
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, data, std::min<uint64_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::FailedPreconditionError(absl::StrCat("cannot write ", what, ": ", std::strerror(errno)));
    data += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFileWriter> SafetensorsFileWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> entries, const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = SafetensorsHeader(&entries, metadata);
  if (!header.ok()) return header.status();
  uint64_t file_bytes = header->size();
  for (const SafetensorsEntry& e : entries) file_bytes += e.bytes;
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  SafetensorsFileWriter writer(fd, path, std::move(tmp), std::move(entries), file_bytes);
  if (absl::Status s = WriteAt(fd, header->data(), header->size(), 0, writer.tmp_); !s.ok()) return s;
  return writer;
}

SafetensorsFileWriter::SafetensorsFileWriter(SafetensorsFileWriter&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      entries_(std::move(other.entries_)),
      written_(std::move(other.written_)),
      file_bytes_(other.file_bytes_) {}

SafetensorsFileWriter& SafetensorsFileWriter::operator=(SafetensorsFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    tmp_ = std::move(other.tmp_);
    entries_ = std::move(other.entries_);
    written_ = std::move(other.written_);
    file_bytes_ = other.file_bytes_;
  }
  return *this;
}

SafetensorsFileWriter::~SafetensorsFileWriter() { Abandon(); }

void SafetensorsFileWriter::Abandon() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  unlink(tmp_.c_str());
}

absl::Status SafetensorsFileWriter::Write(const std::string& name, const void* data, uint64_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": the writer is closed"));
  for (size_t i = 0; i < entries_.size(); ++i) {
    const SafetensorsEntry& e = entries_[i];
    if (e.name != name) continue;
    if (written_[i]) return absl::InvalidArgumentError(absl::StrCat("safetensors: ", name, " written twice"));
    if (bytes != e.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: ", name, ": ", bytes, " bytes for ", e.numel(), " values of ", e.dtype));
    }
    if (absl::Status s = WriteAt(fd_, static_cast<const char*>(data), bytes, e.offset, tmp_); !s.ok()) return s;
    written_[i] = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", path_, " has no tensor ", name));
}

absl::Status SafetensorsFileWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": the writer is closed"));
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!written_[i]) {
      return absl::FailedPreconditionError(absl::StrCat("safetensors: ", entries_[i].name, " was not written"));
    }
  }
  const bool synced = fsync(fd_) == 0;
  const int err = errno;
  close(fd_);
  fd_ = -1;
  if (!synced || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int why = synced ? errno : err;
    unlink(tmp_.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path_, ": ", std::strerror(why)));
  }
  return absl::OkStatus();
}

// --- Reading. ---

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsIndex::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : tensors) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

namespace {

using google::protobuf::Value;

// A JSON number that is a whole number a double holds exactly, within [0, 2^53].
bool AsCount(const Value& v, uint64_t* out) {
  if (v.kind_case() != Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<uint64_t>(d);
  return true;
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view head, uint64_t file_bytes,
                                                       const std::string& what) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a valid safetensors file: ", why));
  };
  if (file_bytes < 8 || head.size() < 8) {
    return bad(absl::StrCat(file_bytes, " bytes, fewer than the 8 of the header's length"));
  }
  const uint64_t n = SafetensorsHeaderBytes(head);
  if (n > file_bytes - 8) {
    return bad(absl::StrCat("the header claims ", n, " bytes but the file holds ", file_bytes - 8,
                            " after its length (truncated?)"));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return bad(absl::StrCat("a header of ", n, " bytes, over the ", kMaxSafetensorsHeaderBytes, " read"));
  }
  if (head.size() < 8 + n) return bad("the header was not read whole");
  const std::string json(head.substr(8, n));
  google::protobuf::Struct header;
  if (!google::protobuf::util::JsonStringToMessage(json, &header).ok()) return bad("the header is not a JSON object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_bytes = file_bytes - data_start;
  SafetensorsIndex index;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") {
      if (value.kind_case() != Value::kStructValue) return bad("__metadata__ is not an object");
      for (const auto& [k, v] : value.struct_value().fields()) {
        if (v.kind_case() != Value::kStringValue) return bad(absl::StrCat("__metadata__ '", k, "' is not a string"));
        index.metadata[k] = v.string_value();
      }
      continue;
    }
    // (A structured binding cannot be captured in C++17.)
    const std::string& tensor = name;
    auto bad_tensor = [&](const std::string& why) { return bad(absl::StrCat("tensor '", tensor, "': ", why)); };
    if (name.empty()) return bad("a tensor without a name");
    if (value.kind_case() != Value::kStructValue) return bad_tensor("not an object");
    const auto& fields = value.struct_value().fields();
    auto dtype = fields.find("dtype");
    auto shape = fields.find("shape");
    auto offsets = fields.find("data_offsets");
    if (dtype == fields.end() || shape == fields.end() || offsets == fields.end()) {
      return bad_tensor("dtype, shape and data_offsets are required");
    }
    SafetensorsEntry e;
    e.name = name;
    if (dtype->second.kind_case() != Value::kStringValue) return bad_tensor("dtype is not a string");
    e.dtype = dtype->second.string_value();
    const int64_t size = SafetensorsDtypeBytes(e.dtype);
    if (size == 0) return bad_tensor(absl::StrCat("unknown dtype '", e.dtype, "'"));
    if (shape->second.kind_case() != Value::kListValue) return bad_tensor("shape is not a list");
    // The product stays within the file: each dimension is checked against
    // what is left of it.
    uint64_t numel = 1;
    for (const Value& d : shape->second.list_value().values()) {
      uint64_t dim = 0;
      if (!AsCount(d, &dim)) return bad_tensor("a dimension that is not a whole number >= 0");
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && numel > data_bytes / dim) numel = data_bytes + 1;  // past anything the file holds
      else numel *= dim;
    }
    if (offsets->second.kind_case() != Value::kListValue || offsets->second.list_value().values_size() != 2) {
      return bad_tensor("data_offsets is not a list of two offsets");
    }
    uint64_t begin = 0, end = 0;
    if (!AsCount(offsets->second.list_value().values(0), &begin) ||
        !AsCount(offsets->second.list_value().values(1), &end)) {
      return bad_tensor("data_offsets are not whole numbers >= 0");
    }
    if (begin > end || end > data_bytes) {
      return bad_tensor(absl::StrCat("data_offsets [", begin, ", ", end, "] lie outside the file's ", data_bytes,
                                     " bytes of data (truncated?)"));
    }
    const uint64_t want = numel > data_bytes ? data_bytes + 1 : numel * static_cast<uint64_t>(size);
    if (end - begin != want) {
      return bad_tensor(absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but shape ",
                                     FormatShape(e.shape), " of ", e.dtype, " needs ",
                                     numel > data_bytes ? std::string("more than the file holds")
                                                        : absl::StrCat(want)));
    }
    e.offset = data_start + begin;
    e.bytes = end - begin;
    index.tensors.push_back(std::move(e));
  }
  // The data, tensor after tensor, with no gaps and nothing after.
  std::sort(index.tensors.begin(), index.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  uint64_t at = data_start;
  for (const SafetensorsEntry& e : index.tensors) {
    if (e.offset != at) {
      return bad(absl::StrCat("tensor '", e.name, "' starts at data byte ", e.offset - data_start, " where ",
                              at - data_start, " was expected (", e.offset < at ? "overlapping" : "a gap", ")"));
    }
    at += e.bytes;
  }
  if (at != file_bytes) {
    return bad(absl::StrCat("the tensors' data ends at data byte ", at - data_start, " of ", data_bytes));
  }
  return index;
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat(path, ": ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(why);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  SafetensorsReader reader(fd, path, {});
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  std::string head(8, '\0');
  if (file_bytes >= 8) {
    if (::pread(fd, head.data(), 8, 0) != 8) return absl::DataLossError(absl::StrCat(path, ": cannot read the header"));
    const uint64_t n = SafetensorsHeaderBytes(head);
    if (n <= file_bytes - 8 && n <= kMaxSafetensorsHeaderBytes) {
      head.resize(8 + n);
      if (n > 0 && ::pread(fd, head.data() + 8, n, 8) != static_cast<ssize_t>(n)) {
        return absl::DataLossError(absl::StrCat(path, ": cannot read the header"));
      }
    }
  }
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(head, file_bytes, path);
  if (!index.ok()) return index.status();
  reader.index_ = *std::move(index);
  return reader;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), index_(std::move(other.index_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    index_ = std::move(other.index_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SafetensorsReader::Read(const SafetensorsEntry& entry, uint64_t begin, uint64_t size, void* out) const {
  if (begin > entry.bytes || size > entry.bytes - begin) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": bytes [", begin, ", ", begin + size, ") of tensor '",
                                                   entry.name, "', which has ", entry.bytes));
  }
  char* dst = static_cast<char*>(out);
  uint64_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd_, dst + done, size - done, static_cast<off_t>(entry.offset + begin + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat(path_, ": tensor '", entry.name, "' could not be read (",
                                              got < 0 ? std::strerror(errno) : "the file is shorter than its index",
                                              ")"));
    }
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace ferry
