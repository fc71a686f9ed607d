#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "engine/data/token_file.h"
#include "engine/data/token_source.h"

namespace ferry {

// Random windows from a token file (token_file.h): one with a header, of
// uint16 or uint32 tokens, or a flat file of uint16 tokens. The file is
// memory-mapped read-only; window starts are uniform over its tokens.
class TokenFileSource : public TokenSource {
 public:
  // Opens and checks the file: its header (if any) is whole and records a
  // vocabulary no larger than `vocab_size` (else INVALID_ARGUMENT naming
  // both), its size is a whole number of tokens, it holds at least `window`
  // tokens, and every token is below `vocab_size`.
  static absl::StatusOr<std::unique_ptr<TokenFileSource>> Open(const std::string& path,
                                                               int64_t vocab_size,
                                                               int64_t window, uint64_t seed);
  // The same for a file already open for reading (`fd`, which this takes
  // and closes): for callers that open it safely themselves (see
  // engine/common/safe_path.h). `path` names it in messages.
  static absl::StatusOr<std::unique_ptr<TokenFileSource>> FromFd(int fd, const std::string& path,
                                                                 int64_t vocab_size, int64_t window,
                                                                 uint64_t seed);
  ~TokenFileSource() override;

  void SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) override;
  std::string SavePosition() const override { return EnginePosition("file", rng_); }
  absl::Status RestorePosition(const std::string& position) override {
    return RestoreEnginePosition("file", position, &rng_);
  }

  int64_t token_count() const { return token_count_; }
  const TokenFileInfo& info() const { return info_; }

 private:
  TokenFileSource(void* mapped, size_t mapped_bytes, TokenFileInfo info, uint64_t seed);
  int64_t Token(int64_t i) const;

  void* mapped_;
  size_t mapped_bytes_;
  TokenFileInfo info_;
  // The first token.
  const unsigned char* data_;
  int64_t token_count_;
  std::mt19937_64 rng_;
};

}  // namespace ferry
