#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Creates `path` and its missing parents (mode 0755).
absl::Status MakeDirs(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it and renames
// it over `path`: readers see the old contents or the new, never a mix.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace ferry
