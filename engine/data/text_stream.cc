#include "engine/data/text_stream.h"

#include <algorithm>

#include "engine/common/status_macros.h"

namespace ferry {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// The length a sequence starting with `lead` has, 0 for a byte that cannot
// start one.
size_t SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether bytes[i..i+n) is a valid sequence of length n (no overlong
// forms, surrogates or values above U+10FFFF); `n` bytes must be there.
bool ValidSequence(const std::string& bytes, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(bytes[i + k]); };
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return false;
  }
  if (n == 3 && b(0) == 0xE0 && b(1) < 0xA0) return false;
  if (n == 3 && b(0) == 0xED && b(1) >= 0xA0) return false;
  if (n == 4 && b(0) == 0xF0 && b(1) < 0x90) return false;
  if (n == 4 && b(0) == 0xF4 && b(1) >= 0x90) return false;
  return true;
}

// Whether bytes[i..) is a proper prefix of some valid sequence.
bool IncompleteSequence(const std::string& bytes, size_t i) {
  const size_t n = SequenceLength(static_cast<unsigned char>(bytes[i]));
  const size_t have = bytes.size() - i;
  if (n <= 1 || have >= n) return false;
  for (size_t k = 1; k < have; ++k) {
    if ((static_cast<unsigned char>(bytes[i + k]) & 0xC0) != 0x80) return false;
  }
  return true;
}

}  // namespace

size_t CompleteUtf8Prefix(const std::string& bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = SequenceLength(static_cast<unsigned char>(bytes[i]));
    if (n > 1 && IncompleteSequence(bytes, i)) return i;
    i += n > 0 && i + n <= bytes.size() && ValidSequence(bytes, i, n) ? n : 1;
  }
  return i;
}

std::string SanitizeUtf8(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = SequenceLength(static_cast<unsigned char>(bytes[i]));
    if (n > 0 && i + n <= bytes.size() && ValidSequence(bytes, i, n)) {
      out.append(bytes, i, n);
      i += n;
    } else if (IncompleteSequence(bytes, i)) {
      out += kReplacement;  // one for the whole cut-off character
      break;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

absl::StatusOr<std::string> TextStream::Push(uint32_t id) {
  ids_.push_back(id);
  absl::StatusOr<std::string> all = tokenizer_->Decode(ids_);
  if (!all.ok()) {
    ids_.pop_back();
    return all.status();
  }
  // A decoding that no longer starts with what was returned (a tokenizer
  // whose earlier text depends on later ids) continues from its new bytes.
  held_ += all->size() > emitted_ ? all->substr(emitted_) : std::string();
  emitted_ = std::max(emitted_, all->size());
  const size_t ready = CompleteUtf8Prefix(held_);
  std::string piece = SanitizeUtf8(held_.substr(0, ready));
  held_.erase(0, ready);
  return piece;
}

std::string TextStream::Finish() {
  std::string rest = SanitizeUtf8(held_);
  held_.clear();
  return rest;
}

}  // namespace ferry
