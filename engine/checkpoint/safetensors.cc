#include "engine/checkpoint/safetensors.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

int64_t DtypeBytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

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

absl::Status SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata, std::string* out) {
  std::vector<std::string> entries;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) kv.push_back(absl::StrCat(JsonString(k), ":", JsonString(v)));
    entries.push_back(absl::StrCat("\"__metadata__\":{", absl::StrJoin(kv, ","), "}"));
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    const int64_t size = DtypeBytes(t.dtype);
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": unknown dtype ", t.dtype));
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: bad or repeated tensor name '", t.name, "'"));
    }
    int64_t count = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": negative dimension"));
      count *= d;
    }
    if (static_cast<uint64_t>(count * size) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": ", t.data.size(),
                                                     " bytes for ", count, " values of ", t.dtype));
    }
    entries.push_back(absl::StrCat(JsonString(t.name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
                                   offset + t.data.size(), "]}"));
    offset += t.data.size();
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  // Pad with spaces so that the data starts 8-byte aligned.
  while ((8 + header.size()) % 8 != 0) header += ' ';
  out->clear();
  out->reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(header);
  for (const SafetensorsTensor& t : tensors) out->append(t.data);
  return absl::OkStatus();
}

}  // namespace ferry
