#include "engine/data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Ids above this are refused: model.vocab_size's own limit.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
// The piece cache is dropped when it holds this many pieces.
constexpr size_t kMaxCacheEntries = 1 << 20;
// PCRE2's JIT stack: long runs of one class need more than its 32 KiB default.
constexpr size_t kJitStackBytes = 1 << 20;

struct ByteTable {
  uint32_t to_code[256];
  // Code point (< 324) -> byte + 1; 0 where no byte maps to it.
  uint16_t from_code[324] = {};
  ByteTable() {
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_code[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
      from_code[to_code[b]] = static_cast<uint16_t>(b + 1);
    }
  }
};

const ByteTable& Table() {
  static const ByteTable* table = new ByteTable();
  return *table;
}

// Decodes one UTF-8 code point at `*i`; false on an invalid sequence.
bool NextCodePoint(absl::string_view s, size_t* i, uint32_t* cp) {
  const auto c0 = static_cast<unsigned char>(s[*i]);
  int len;
  uint32_t v;
  if (c0 < 0x80) {
    len = 1, v = c0;
  } else if ((c0 & 0xE0) == 0xC0) {
    len = 2, v = c0 & 0x1F;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3, v = c0 & 0x0F;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4, v = c0 & 0x07;
  } else {
    return false;
  }
  if (*i + static_cast<size_t>(len) > s.size()) return false;
  for (int k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[*i + static_cast<size_t>(k)]);
    if ((c & 0xC0) != 0x80) return false;
    v = (v << 6) | (c & 0x3F);
  }
  *i += static_cast<size_t>(len);
  *cp = v;
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Reads vocab.json as a stream of events: one object of string -> integer,
// nothing nested (so no input can build a deep document).
class VocabReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::vector<std::pair<std::string, int64_t>> entries;
  std::string error;

  bool null() override { return Fail("a null"); }
  bool boolean(bool) override { return Fail("a boolean"); }
  bool number_integer(number_integer_t v) override { return Value(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return v > static_cast<number_unsigned_t>(kMaxId) ? Value(kMaxId + 1) : Value(static_cast<int64_t>(v));
  }
  bool number_float(number_float_t, const string_t&) override { return Fail("a fractional number"); }
  bool string(string_t&) override { return Fail("a string"); }
  bool binary(binary_t&) override { return Fail("binary data"); }
  bool start_object(std::size_t) override {
    if (depth_++ != 0) return Fail("a nested object");
    return true;
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return Fail("an array"); }
  bool end_array() override { return Fail("an array"); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    if (error.empty()) error = absl::StrCat("is not valid JSON (at byte ", position, ")");
    return false;
  }

 private:
  bool Value(int64_t v) {
    if (depth_ != 1) return Fail("a bare number");
    if (v < 0 || v > kMaxId) {
      return Fail(absl::StrCat("an id out of range for token ", nlohmann::json(key_).dump(), " (ids are 0 to ", kMaxId, ")"));
    }
    entries.emplace_back(std::move(key_), v);
    return true;
  }
  bool Fail(const std::string& what) {
    error = absl::StrCat("must be one JSON object of token -> id; found ", what);
    return false;
  }
  int depth_ = 0;
  std::string key_;
};

}  // namespace

absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  return text.str();
}

uint32_t Gpt2ByteToCodePoint(unsigned char byte) { return Table().to_code[byte]; }

bool Gpt2TokenBytes(absl::string_view token, std::string* bytes) {
  const ByteTable& table = Table();
  bytes->clear();
  size_t i = 0;
  while (i < token.size()) {
    uint32_t cp;
    if (!NextCodePoint(token, &i, &cp) || cp >= 324 || table.from_code[cp] == 0) return false;
    bytes->push_back(static_cast<char>(table.from_code[cp] - 1));
  }
  return true;
}

std::string Gpt2TokenText(absl::string_view bytes) {
  std::string text;
  for (char b : bytes) AppendUtf8(Table().to_code[static_cast<unsigned char>(b)], &text);
  return text;
}

struct Gpt2Tokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~Regex() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(TokenizerSpec spec, std::unique_ptr<Regex> regex)
    : spec_(std::move(spec)), regex_(std::move(regex)) {}
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(const std::string& vocab_path,
                                                                   const std::string& merges_path) {
  absl::StatusOr<std::string> vocab = ReadTokenizerFile(vocab_path, "vocab.json");
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::string> merges = ReadTokenizerFile(merges_path, "merges.txt");
  if (!merges.ok()) return merges.status();
  return FromContents(*vocab, *merges, TokenizerSpec{kGpt2Tokenizer, {vocab_path, merges_path}});
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::FromContents(absl::string_view vocab_json,
                                                                           absl::string_view merges_txt,
                                                                           TokenizerSpec spec) {
  const std::string vocab_name = spec.files.size() > 0 ? spec.files[0] : "vocab.json";
  const std::string merges_name = spec.files.size() > 1 ? spec.files[1] : "merges.txt";
  auto regex = std::make_unique<Regex>();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset,
                              nullptr);
  if (regex->code == nullptr) return absl::InternalError("GPT-2's pattern does not compile with PCRE2");
  // Without the JIT (not built for every CPU) the interpreter matches the same.
  if (pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0) {
    regex->jit_stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
    regex->context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(regex->context, nullptr, regex->jit_stack);
  }
  regex->match = pcre2_match_data_create_from_pattern(regex->code, nullptr);

  std::unique_ptr<Gpt2Tokenizer> t(new Gpt2Tokenizer(std::move(spec), std::move(regex)));
  VocabReader reader;
  const bool parsed = nlohmann::json::sax_parse(vocab_json.begin(), vocab_json.end(), &reader);
  if (!parsed || reader.entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(vocab_name, ": ", reader.error.empty() ? "holds no tokens" : reader.error));
  }
  int64_t max_id = 0;
  for (const auto& entry : reader.entries) max_id = std::max(max_id, entry.second);
  t->tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->used_.assign(static_cast<size_t>(max_id + 1), false);
  absl::flat_hash_map<std::string, uint32_t> ids;
  ids.reserve(reader.entries.size());
  bool have_byte[256] = {};
  std::string bytes;
  for (const auto& [token, id] : reader.entries) {
    const auto index = static_cast<size_t>(id);
    if (t->used_[index]) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_name, ": id ", id, " is given to two tokens, ",
                                                     nlohmann::json(Gpt2TokenText(t->tokens_[index])).dump(), " and ",
                                                     nlohmann::json(token).dump(), "; ids must be unique"));
    }
    t->used_[index] = true;
    // A token outside GPT-2's alphabet (a special token) decodes as its
    // text and is never produced by merging bytes.
    if (!Gpt2TokenBytes(token, &bytes)) {
      t->tokens_[index] = token;
      continue;
    }
    t->tokens_[index] = bytes;
    if (!ids.emplace(bytes, static_cast<uint32_t>(id)).second) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_name, ": token ", nlohmann::json(token).dump(),
                                                     " appears twice"));
    }
    if (bytes.size() == 1) {
      const auto b = static_cast<unsigned char>(bytes[0]);
      have_byte[b] = true;
      t->byte_ids_[b] = static_cast<uint32_t>(id);
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!have_byte[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          vocab_name, ": has no token for byte ", b, " (", nlohmann::json(Gpt2TokenText(std::string(1, static_cast<char>(b)))).dump(),
          "); a byte-level BPE vocabulary holds all 256 bytes"));
    }
  }

  uint32_t rank = 0;
  int64_t line_number = 0;
  std::string left, right;
  for (absl::string_view line : absl::StrSplit(merges_txt, '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && absl::StartsWith(line, "#version"))) continue;
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(merges_name, ": line ", line_number,
                                                     " is not two tokens separated by one space"));
    }
    if (!Gpt2TokenBytes(line.substr(0, space), &left) || !Gpt2TokenBytes(line.substr(space + 1), &right)) {
      return absl::InvalidArgumentError(absl::StrCat(merges_name, ": line ", line_number,
                                                     " holds a character outside GPT-2's byte alphabet"));
    }
    const auto l = ids.find(left);
    const auto r = ids.find(right);
    const auto joined = ids.find(left + right);
    if (l == ids.end() || r == ids.end() || joined == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_name, ": line ", line_number, ": ",
          l == ids.end() ? "its first token" : r == ids.end() ? "its second token" : "the merged token",
          " is not in ", vocab_name));
    }
    // A pair listed twice keeps its first (lowest) rank, as GPT-2's does not
    // see the second.
    t->merges_.try_emplace((uint64_t{l->second} << 32) | r->second, Merge{rank++, joined->second});
  }
  return t;
}

std::vector<absl::string_view> Gpt2Tokenizer::PreTokenize(absl::string_view text) const {
  std::vector<absl::string_view> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), at, 0, regex_->match, regex_->context);
    if (rc < 0) {
      // No valid character left (only invalid UTF-8), or a resource limit:
      // the rest is one piece.
      pieces.push_back(text.substr(at));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(regex_->match);
    const size_t start = ovector[0], end = ovector[1];
    if (end <= start || start < at || end > text.size()) {
      pieces.push_back(text.substr(at));
      break;
    }
    // Bytes the pattern skipped are invalid UTF-8: a piece of their own.
    if (start > at) pieces.push_back(text.substr(at, start - at));
    pieces.push_back(text.substr(start, end - start));
    at = end;
  }
  return pieces;
}

std::vector<uint32_t> Gpt2Tokenizer::Encode(absl::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  for (absl::string_view piece : PreTokenize(text)) EncodePiece(piece, &ids);
  return ids;
}

void Gpt2Tokenizer::EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) {
  if (piece.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (auto it = cache_.find(piece); it != cache_.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  // Symbols as a linked list over the piece's bytes; candidate merges in a
  // heap ordered by (rank, position). GPT-2 merges every occurrence of the
  // lowest-ranked pair, left to right, before it looks for the next pair:
  // so pairs made while merging one rank wait in `made` until that rank is
  // done. An entry is stale once either symbol has changed.
  const int n = static_cast<int>(piece.size());
  std::vector<uint32_t> id(static_cast<size_t>(n));
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[static_cast<size_t>(i)])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int left;
    int right;
    uint32_t left_id;
    uint32_t right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int l, std::vector<Candidate>* into) {
    if (l < 0 || next[l] < 0) return;
    const int r = next[l];
    auto it = merges_.find((uint64_t{id[l]} << 32) | id[r]);
    if (it == merges_.end()) return;
    Candidate c{it->second.rank, l, r, id[l], id[r]};
    if (into) {
      into->push_back(c);
    } else {
      heap.push(c);
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, nullptr);
  std::vector<Candidate> made;
  while (!heap.empty()) {
    const uint32_t rank = heap.top().rank;
    made.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      const Candidate c = heap.top();
      heap.pop();
      if (id[c.left] != c.left_id || next[c.left] != c.right || id[c.right] != c.right_id) continue;
      // Valid: the symbol at c.left is alive (its next is still c.right).
      id[c.left] = merges_.find((uint64_t{c.left_id} << 32) | c.right_id)->second.id;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      // The right symbol is gone: no entry may match it again.
      next[c.right] = -2;
      id[c.right] = UINT32_MAX;
      consider(prev[c.left], &made);
      consider(c.left, &made);
    }
    for (const Candidate& c : made) heap.push(c);
  }
  std::vector<uint32_t> ids;
  for (int i = 0; i >= 0; i = next[i]) ids.push_back(id[i]);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(piece), std::move(ids));
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= tokens_.size() || !used_[ids[i]]) {
      return absl::InvalidArgumentError(absl::StrCat("token ", ids[i], " at position ", i, " is not in ",
                                                     spec_.files.empty() ? "vocab.json" : spec_.files[0]));
    }
    text += tokens_[ids[i]];
  }
  return text;
}

}  // namespace ferry
