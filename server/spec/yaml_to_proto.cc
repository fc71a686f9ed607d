#include "server/spec/yaml_to_proto.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/v1/options.pb.h"
#include "google/protobuf/stubs/common.h"
#include "server/spec/size.h"

namespace ferry {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Join(absl::string_view path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

absl::Status Error(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path.empty() ? "job" : path, ": ", what));
}

const char* NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a scalar";
    default:
      return "nothing";
  }
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const FieldDescriptor* FindField(const Descriptor* d, absl::string_view key) {
  const std::string k(key);
  if (const FieldDescriptor* f = d->FindFieldByName(k)) return f;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == k) return d->field(i);
  }
  return nullptr;
}

absl::Status UnknownField(const Descriptor* d, absl::string_view path, absl::string_view key) {
  std::vector<std::string> names;
  std::string suggestion;
  size_t best = 3;
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& name = d->field(i)->name();
    names.push_back(name);
    const size_t distance = EditDistance(absl::AsciiStrToLower(key), name);
    if (distance < best) {
      best = distance;
      suggestion = name;
    }
  }
  std::string message = absl::StrCat("unknown field '", key, "'");
  if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean '", suggestion, "'?");
  absl::StrAppend(&message, " (fields here: ", absl::StrJoin(names, ", "), ")");
  return Error(path, message);
}

std::string ResolvePath(absl::string_view value, absl::string_view base_dir) {
  if (value.empty() || value[0] == '/' || base_dir.empty()) return std::string(value);
  absl::string_view rest = value;
  while (absl::ConsumePrefix(&rest, "./")) {
  }
  return absl::StrCat(base_dir, base_dir.back() == '/' ? "" : "/", rest);
}

template <typename T>
absl::Status ParseInteger(const FieldDescriptor* f, const std::string& text,
                          absl::string_view path, T* out) {
  if (f->options().GetExtension(ferry::v1::size_bytes)) {
    absl::StatusOr<uint64_t> bytes = ParseSize(text);
    if (!bytes.ok()) return Error(path, bytes.status().message());
    if (*bytes > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return Error(path, absl::StrCat("'", text, "' is too large"));
    }
    *out = static_cast<T>(*bytes);
    return absl::OkStatus();
  }
  if (std::is_unsigned<T>::value && absl::StartsWith(text, "-")) {
    return Error(path, absl::StrCat("must not be negative, got ", text));
  }
  if (!absl::SimpleAtoi(text, out)) {
    double as_double = 0;
    // Range first: converting a double outside int64's range (1e300, inf,
    // nan) to an integer is undefined.
    if (absl::SimpleAtod(text, &as_double) && std::isfinite(as_double) && std::abs(as_double) < 9e15 &&
        as_double == std::trunc(as_double)) {
      // Accept 1e3-style whole numbers.
      if (as_double >= static_cast<double>(std::numeric_limits<T>::min()) &&
          as_double <= static_cast<double>(std::numeric_limits<T>::max())) {
        *out = static_cast<T>(as_double);
        return absl::OkStatus();
      }
    }
    return Error(path, absl::StrCat("expected a whole number in range, got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status SetScalar(const YAML::Node& node, Message* message, const FieldDescriptor* f,
                       absl::string_view path, const YamlToProtoOptions& options) {
  if (!node.IsScalar()) {
    return Error(path, absl::StrCat("expected a single value, got ", NodeKind(node)));
  }
  const std::string text = node.Scalar();
  const Reflection* r = message->GetReflection();
  const bool repeated = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (absl::Status s = ParseInteger(f, text, path, &v); !s.ok()) return s;
      repeated ? r->AddInt32(message, f, v) : r->SetInt32(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (absl::Status s = ParseInteger(f, text, path, &v); !s.ok()) return s;
      repeated ? r->AddInt64(message, f, v) : r->SetInt64(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (absl::Status s = ParseInteger(f, text, path, &v); !s.ok()) return s;
      repeated ? r->AddUInt32(message, f, v) : r->SetUInt32(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v = 0;
      if (absl::Status s = ParseInteger(f, text, path, &v); !s.ok()) return s;
      repeated ? r->AddUInt64(message, f, v) : r->SetUInt64(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v = 0;
      if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
        return Error(path, absl::StrCat("expected a number, got '", text, "'"));
      }
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        repeated ? r->AddDouble(message, f, v) : r->SetDouble(message, f, v);
      } else {
        repeated ? r->AddFloat(message, f, float(v)) : r->SetFloat(message, f, float(v));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string lower = absl::AsciiStrToLower(text);
      bool v;
      if (lower == "true" || lower == "yes" || lower == "on") {
        v = true;
      } else if (lower == "false" || lower == "no" || lower == "off") {
        v = false;
      } else {
        return Error(path, absl::StrCat("expected true or false, got '", text, "'"));
      }
      repeated ? r->AddBool(message, f, v) : r->SetBool(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      // A string field that is not UTF-8 could not be sent: protobuf refuses
      // to serialize or parse one, by this check.
      if (f->type() == FieldDescriptor::TYPE_STRING &&
          !google::protobuf::internal::IsStructurallyValidUTF8(text.data(), static_cast<int>(text.size()))) {
        return Error(path, "is not valid UTF-8 text");
      }
      std::string v = text;
      if (f->options().GetExtension(ferry::v1::path)) v = ResolvePath(v, options.base_dir);
      repeated ? r->AddString(message, f, v) : r->SetString(message, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor* e = f->enum_type();
      const std::string lower = absl::AsciiStrToLower(text);
      for (int i = 0; i < e->value_count(); ++i) {
        const EnumValueDescriptor* value = e->value(i);
        if (value->number() == 0) continue;
        if (lower == absl::AsciiStrToLower(value->name()) || lower == ShortEnumName(value)) {
          repeated ? r->AddEnum(message, f, value) : r->SetEnum(message, f, value);
          return absl::OkStatus();
        }
      }
      return Error(path, absl::StrCat("'", text, "' is not one of ", EnumChoices(e)));
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return Error(path, "unsupported field type");
}

absl::Status FillMessage(const YAML::Node& node, Message* message, absl::string_view path,
                         const YamlToProtoOptions& options);

absl::Status SetField(const YAML::Node& value, Message* message, const FieldDescriptor* f,
                      absl::string_view path, const YamlToProtoOptions& options) {
  const Reflection* r = message->GetReflection();
  if (f->is_map()) return Error(path, "map fields are not supported in job files");
  if (f->is_repeated()) {
    if (value.IsNull()) return absl::OkStatus();
    if (!value.IsSequence()) {
      return Error(path, absl::StrCat("expected a list, got ", NodeKind(value)));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        if (absl::Status s = FillMessage(value[i], r->AddMessage(message, f), item_path, options);
            !s.ok()) {
          return s;
        }
      } else if (absl::Status s = SetScalar(value[i], message, f, item_path, options); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return FillMessage(value, r->MutableMessage(message, f), path, options);
  }
  if (value.IsNull()) return Error(path, "has no value");
  return SetScalar(value, message, f, path, options);
}

absl::Status FillMessage(const YAML::Node& node, Message* message, absl::string_view path,
                         const YamlToProtoOptions& options) {
  // `synthetic:` and `synthetic: {}` both mean "present, all defaults".
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return Error(path, absl::StrCat("expected a mapping of fields, got ", NodeKind(node),
                                    node.IsScalar() ? absl::StrCat(" '", node.Scalar(), "'") : ""));
  }
  const Descriptor* d = message->GetDescriptor();
  const Reflection* r = message->GetReflection();
  std::vector<const FieldDescriptor*> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return Error(path, "field names must be plain words");
    const std::string key = entry.first.Scalar();
    const FieldDescriptor* f = FindField(d, key);
    if (f == nullptr) return UnknownField(d, path, key);
    const std::string field_path = Join(path, f->name());
    if (std::find(seen.begin(), seen.end(), f) != seen.end()) {
      return Error(field_path, "is given twice");
    }
    if (const auto* oneof = f->real_containing_oneof()) {
      if (const FieldDescriptor* other = r->GetOneofFieldDescriptor(*message, oneof)) {
        return Error(path, absl::StrCat("set only one of ", other->name(), " and ", f->name()));
      }
    }
    seen.push_back(f);
    if (absl::Status s = SetField(entry.second, message, f, field_path, options); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShortEnumName(const EnumValueDescriptor* value) {
  // The type's name in UPPER_SNAKE_CASE is the values' common prefix.
  std::string prefix;
  for (char c : value->type()->name()) {
    if (absl::ascii_isupper(static_cast<unsigned char>(c)) && !prefix.empty()) prefix += '_';
    prefix += absl::ascii_toupper(static_cast<unsigned char>(c));
  }
  prefix += '_';
  absl::string_view name = value->name();
  absl::ConsumePrefix(&name, prefix);
  return absl::AsciiStrToLower(name);
}

std::string EnumChoices(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(ShortEnumName(e->value(i)));
  }
  return absl::StrJoin(names, ", ");
}

absl::Status YamlToMessage(const YAML::Node& node, Message* message,
                           const YamlToProtoOptions& options) {
  message->Clear();
  return FillMessage(node, message, "", options);
}

absl::Status YamlTextToMessage(absl::string_view text, Message* message,
                               const YamlToProtoOptions& options) {
  YAML::Node node;
  try {
    node = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not valid YAML: line ", e.mark.line + 1, ", column ", e.mark.column + 1,
                     ": ", e.msg));
  }
  return YamlToMessage(node, message, options);
}

absl::Status ApplyYamlOverride(YAML::Node& root, const Descriptor* descriptor,
                               absl::string_view assignment, absl::string_view cwd) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set '", assignment, "': write FIELD=VALUE, e.g. --set train.steps=50"));
  }
  const std::string dotted(absl::StripAsciiWhitespace(assignment.substr(0, eq)));
  const std::string text(assignment.substr(eq + 1));
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", dotted, ": the value is not valid YAML: ", e.msg));
  }

  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  std::vector<std::string> parts = absl::StrSplit(dotted, '.');
  YAML::Node node = root;
  const Descriptor* d = descriptor;
  std::string path;
  for (size_t i = 0; i < parts.size(); ++i) {
    const FieldDescriptor* f = d ? FindField(d, parts[i]) : nullptr;
    if (f == nullptr) {
      if (d == nullptr) return Error(path, "has no fields to set");
      return UnknownField(d, path, parts[i]);
    }
    // Setting one member of a oneof replaces whichever other member is set.
    if (const auto* oneof = f->real_containing_oneof()) {
      for (int k = 0; k < oneof->field_count(); ++k) {
        const FieldDescriptor* sibling = oneof->field(k);
        if (sibling != f) {
          node.remove(sibling->name());
          node.remove(sibling->json_name());
        }
      }
    }
    path = Join(path, f->name());
    if (i + 1 == parts.size()) {
      if (f->options().GetExtension(ferry::v1::path) && value.IsScalar()) {
        value = YAML::Node(ResolvePath(value.Scalar(), cwd));
      }
      if (f->json_name() != f->name()) node.remove(f->json_name());
      node[f->name()] = value;
      return absl::OkStatus();
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated()) {
      return Error(path, "is not a group of fields; set it as a whole");
    }
    YAML::Node child = node[f->name()];
    if (!child.IsMap()) {
      node[f->name()] = YAML::Node(YAML::NodeType::Map);
      child = node[f->name()];
    }
    node.reset(child);
    d = f->message_type();
  }
  return absl::OkStatus();
}

}  // namespace ferry
