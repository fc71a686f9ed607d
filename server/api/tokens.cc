#include "server/api/tokens.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

// Tokens files are a few lines; anything this large is a wrong path.
constexpr size_t kMaxFileBytes = 1 << 20;

bool IsVisibleAscii(char c) { return c > ' ' && c < 0x7f; }

// A role field is shown in an error only when it cannot be a token, nor
// part of one: plain letters, digits, '-' and '_', and short enough that
// with the quotes around it in the message ('ROLE';) it is still shorter
// than a token.
bool SafeToShow(absl::string_view field) {
  if (field.size() + 3 >= kMinTokenLength) return false;
  for (char c : field) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kSubmitter:
      return "submitter";
  }
  return "unknown";
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::optional<Role> TokenTable::Find(absl::string_view token) const {
  // No early exit: which entry matched, if any, does not change the time.
  int found = -1;
  for (const Entry& entry : entries_) {
    const bool match = ConstantTimeEquals(entry.token, token);
    const int role = static_cast<int>(entry.role);
    found = match ? role : found;
  }
  if (found < 0) return std::nullopt;
  return static_cast<Role>(found);
}

size_t TokenTable::Count(Role role) const {
  size_t n = 0;
  for (const Entry& entry : entries_) n += entry.role == role ? 1 : 0;
  return n;
}

absl::StatusOr<TokenTable> ParseTokens(absl::string_view text) {
  if (absl::StartsWith(text, "\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
  std::vector<TokenTable::Entry> entries;
  absl::flat_hash_map<std::string, size_t> line_of;
  size_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("line ", line_number, ": ");
    if (fields.size() == 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected `ROLE TOKEN`, found one field; put the role (viewer or "
                              "submitter) before the token"));
    }
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected `ROLE TOKEN`, found ", fields.size(),
          " fields; a token cannot contain spaces, and a comment takes a whole line starting with #"));
    }
    Role role;
    if (fields[0] == "viewer") {
      role = Role::kViewer;
    } else if (fields[0] == "submitter") {
      role = Role::kSubmitter;
    } else if (SafeToShow(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown role '", fields[0], "'; use viewer or submitter"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the first field is not a role; use `viewer TOKEN` or `submitter TOKEN`"));
    }
    const absl::string_view token = fields[1];
    for (size_t i = 0; i < token.size(); ++i) {
      if (!IsVisibleAscii(token[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the token has a character that is not visible ASCII at position ", i + 1,
            "; use letters, digits and punctuation (e.g. from `openssl rand -hex 32`)"));
      }
    }
    if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "the token is ", token.size(), " characters; use ", kMinTokenLength, " to ",
          kMaxTokenLength, " (e.g. `openssl rand -hex 32`)"));
    }
    auto [it, inserted] = line_of.emplace(std::string(token), line_number);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the same token as line ", it->second,
                                                     "; give each client its own token"));
    }
    entries.push_back({role, std::string(token)});
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        "no tokens: add a line `ROLE TOKEN` (role viewer or submitter); without tokens no client "
        "could call the daemon");
  }
  return TokenTable(std::move(entries));
}

absl::StatusOr<TokenTable> ReadTokensFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, ": cannot read: ", std::strerror(error)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxFileBytes) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": larger than ", kMaxFileBytes, " bytes; is it the tokens file?"));
    }
  }
  close(fd);
  absl::StatusOr<TokenTable> table = ParseTokens(text);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

}  // namespace ferry
