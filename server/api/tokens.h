#pragma once

// Bearer tokens and their roles: the tokens file ferryd reads with
// --tokens_file, and the lookup of a token a client sends.
//
// The file holds one `ROLE TOKEN` per line, separated by spaces or tabs.
// Lines that are blank or whose first non-blank character is `#` are
// ignored. Roles are `viewer` and `submitter`. A token is 16 to 4096
// visible ASCII characters (no spaces); each token appears once.
//
// Nothing here ever puts a token into an error message: errors name the
// line and what is wrong with it.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

enum class Role {
  // May read: jobs, watch streams, memory placement, daemon info.
  kViewer = 0,
  // May do everything a viewer may, and submit, cancel and export.
  kSubmitter = 1,
};

// "viewer", "submitter".
absl::string_view RoleName(Role role);

// True when `granted` includes everything `required` allows.
inline bool RoleAllows(Role granted, Role required) {
  return static_cast<int>(granted) >= static_cast<int>(required);
}

inline constexpr size_t kMinTokenLength = 16;
inline constexpr size_t kMaxTokenLength = 4096;

class TokenTable {
 public:
  struct Entry {
    Role role;
    std::string token;
  };

  TokenTable() = default;
  explicit TokenTable(std::vector<Entry> entries) : entries_(std::move(entries)) {}

  // The role of `token`, if it is in the table. Takes the same time whether
  // and wherever the token matches: every entry is compared, each in time
  // that depends only on the lengths.
  std::optional<Role> Find(absl::string_view token) const;

  size_t size() const { return entries_.size(); }
  size_t Count(Role role) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// Parses a tokens file's text. Errors say "line N: ..." and never contain a
// token; a file without a single token is an error too.
absl::StatusOr<TokenTable> ParseTokens(absl::string_view text);

// Reads and parses the file at `path`; errors start with the path.
absl::StatusOr<TokenTable> ReadTokensFile(const std::string& path);

// Compares in time that depends only on the lengths of `a` and `b`.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace ferry
