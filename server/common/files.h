#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// The whole contents of the file `path`; an error's message is the reason
// it cannot be read (strerror).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Creates `path` and its missing parents (mode 0755).
absl::Status MakeDirs(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it and renames
// it over `path`: readers see the old contents or the new, never a mix.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Removes the file `path`, or the folder `path` and the files in it (one
// level: what an export writes). Nothing there is not an error.
void RemoveFileOrFolder(const std::string& path);

}  // namespace ferry
