// Fuzzes the tokens-file reader (server/api/tokens): any text gives a table
// or an error, never a crash or a hang; an error never contains anything
// that could be a token (a word of the file of a token's length); a table
// holds only well-formed, distinct tokens, each found with its role.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/api/tokens.h"
#include "tests/fuzz/fuzz_check.h"

using ferry::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ferry::TokenTable> table = ferry::ParseTokens(text);
  if (!table.ok()) {
    const std::string message(table.status().message());
    if (message.empty()) Fail("an error without a message");
    for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \t\r\n\v\f"), absl::SkipEmpty())) {
      if (word.size() >= ferry::kMinTokenLength && message.find(word.data(), 0, word.size()) != std::string::npos) {
        Fail("the error shows a possible token: " + message);
      }
    }
    return 0;
  }
  if (table->size() == 0) Fail("an empty table");
  std::set<std::string> seen;
  for (const ferry::TokenTable::Entry& entry : table->entries()) {
    const std::string& token = entry.token;
    if (token.size() < ferry::kMinTokenLength || token.size() > ferry::kMaxTokenLength) {
      Fail("a token of " + std::to_string(token.size()) + " characters");
    }
    for (char c : token) {
      if (c <= ' ' || c > '~') Fail("a token with a character that is not visible ASCII");
    }
    if (!seen.insert(token).second) Fail("a token twice");
    const std::optional<ferry::Role> role = table->Find(token);
    if (!role.has_value() || *role != entry.role) Fail("a token not found with its role");
  }
  if (table->Find("").has_value()) Fail("the empty token is found");
  return 0;
}
