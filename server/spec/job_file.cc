#include "server/spec/job_file.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "server/spec/yaml_to_proto.h"

namespace ferry {
namespace {

std::string CurrentDirectory() {
  char buffer[PATH_MAX];
  return getcwd(buffer, sizeof(buffer)) != nullptr ? std::string(buffer) : std::string(".");
}

std::string AbsoluteDirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  char resolved[PATH_MAX];
  if (realpath(dir.c_str(), resolved) != nullptr) return resolved;
  return dir;
}

}  // namespace

absl::StatusOr<ferry::v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view base_dir,
                                                const std::vector<std::string>& overrides,
                                                absl::string_view cwd) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid YAML: line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsMap() && !root.IsNull()) {
    return absl::InvalidArgumentError("a job file is a mapping of fields (name:, model:, data:, ...)");
  }
  YamlToProtoOptions options;
  options.base_dir = std::string(base_dir);
  // Overrides resolve their relative paths against `cwd` as they are applied,
  // so the conversion below only resolves the file's own.
  for (const std::string& assignment : overrides) {
    if (absl::Status s = ApplyYamlOverride(root, ferry::v1::JobSpec::descriptor(), assignment, cwd);
        !s.ok()) {
      return s;
    }
  }
  ferry::v1::JobSpec spec;
  if (absl::Status s = YamlToMessage(root, &spec, options); !s.ok()) return s;
  return spec;
}

absl::StatusOr<ferry::v1::JobSpec> LoadJobFile(const std::string& path,
                                               const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the job file"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ferry::v1::JobSpec> spec =
      ParseJobSpec(text.str(), AbsoluteDirectoryOf(path), overrides, CurrentDirectory());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace ferry
