#include "engine/data/token_source.h"

#include <sstream>

#include "absl/strings/str_cat.h"

namespace ferry {

std::string EnginePosition(const char* kind, const std::mt19937_64& engine) {
  std::ostringstream out;
  out << kind << ' ' << engine;
  return out.str();
}

absl::Status RestoreEnginePosition(const char* kind, const std::string& position, std::mt19937_64* engine) {
  std::istringstream in(position);
  std::string found;
  in >> found;
  if (found != kind) {
    return absl::InvalidArgumentError(absl::StrCat("data position: saved by a ", found.empty() ? "?" : found,
                                                   " source, not a ", kind, " one; resume with the same data"));
  }
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) return absl::InvalidArgumentError(absl::StrCat("data position: not a ", kind, " position"));
  *engine = restored;
  return absl::OkStatus();
}

}  // namespace ferry
