#pragma once

// Reads a protobuf message from YAML written as the message's JSON mapping,
// with errors that name the field path ("model.layers: ...") and the fix.
// Generic over messages: it follows the descriptor, and honours the field
// options of ferry/v1/options.proto (sizes written "512MiB", paths relative
// to a base directory).

#include <string>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace ferry {

struct YamlToProtoOptions {
  // Relative values of fields marked `(ferry.v1.path)` are resolved against
  // this directory; empty leaves them as written.
  std::string base_dir;
};

// Fills `message` (cleared first) from `node`. Field names as in the .proto
// or in lowerCamelCase; enums by full name (`PRECISION_FP32`) or short name
// (`fp32`), case-insensitive. INVALID_ARGUMENT for unknown fields (with a
// suggestion), wrong types, out-of-range numbers and two members of a oneof.
absl::Status YamlToMessage(const YAML::Node& node, google::protobuf::Message* message,
                           const YamlToProtoOptions& options = {});

// Parses YAML text, then as YamlToMessage.
absl::Status YamlTextToMessage(absl::string_view text, google::protobuf::Message* message,
                               const YamlToProtoOptions& options = {});

// Applies one `dotted.path=value` assignment to `root`, a YAML document for a
// message of type `descriptor`. The value is parsed as YAML ("4", "fp32",
// "{synthetic: {}}"). Setting a member of a oneof removes its siblings; a
// relative path value is resolved against `cwd`. Unknown fields are
// INVALID_ARGUMENT.
absl::Status ApplyYamlOverride(YAML::Node& root, const google::protobuf::Descriptor* descriptor,
                               absl::string_view assignment, absl::string_view cwd);

// The enum value's name without its type prefix, lower-case:
// JOB_STATE_RUNNING -> "running", PRECISION_FP32 -> "fp32".
std::string ShortEnumName(const google::protobuf::EnumValueDescriptor* value);

// The short names of an enum's values other than the zero (unspecified) one,
// comma-separated: "fp32, fp16, bf16".
std::string EnumChoices(const google::protobuf::EnumDescriptor* e);

}  // namespace ferry
