#include "engine/data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "engine/data/gpt2_tokenizer.h"

namespace ferry {
namespace {

using json = nlohmann::json;

// GPT-2's pattern, which a ByteLevel pre-tokenizer with use_regex applies.
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Ids above this are refused (as gpt2_tokenizer does): they would make the
// id tables of a malformed file huge.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
// The piece cache is dropped when it holds this many pieces; pieces this
// long or longer are not cached (a SentencePiece-style file's pieces are
// whole stretches of text, seldom seen twice).
constexpr size_t kMaxCacheEntries = 1 << 20;
constexpr size_t kMaxCachedPiece = 256;
// PCRE2's JIT stack: long runs of one class need more than its 32 KiB default.
constexpr size_t kJitStackBytes = 1 << 20;
constexpr uint32_t kNoId = UINT32_MAX;
// Sequences nest no deeper than this (real files nest one level).
constexpr int kMaxDepth = 16;

// --- UTF-8 ----------------------------------------------------------------

// The length of the valid UTF-8 sequence at s[i] (its code point in *cp),
// or 0 when the byte there does not start one (overlong forms, surrogates
// and values above U+10FFFF are invalid, as utf8proc and PCRE2 read them).
size_t Utf8At(absl::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    n = 2, v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, v = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3F);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// The code point that ends at s[end) (0 bytes back when none: start of text
// or an invalid byte), for the word and space tests of added tokens.
size_t Utf8Before(absl::string_view s, size_t end, uint32_t* cp) {
  for (size_t n = 1; n <= 4 && n <= end; ++n) {
    if (Utf8At(s, end - n, cp) == n) return n;
  }
  return 0;
}

// Unicode White_Space (Rust's and Oniguruma's \s).
bool IsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// A word character as Rust's regex \w reads it: letters, marks, decimal and
// letter numbers, connector punctuation.
bool IsWordChar(uint32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// `text` in a Unicode normalization form (utf8proc options); invalid bytes
// are kept as they are, the valid stretches between them normalized.
std::string Normalize(absl::string_view text, int options) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    // The next valid stretch, and whether it is all ASCII (which every form
    // leaves as it is).
    size_t end = i;
    bool ascii = true;
    uint32_t cp;
    for (size_t n; end < text.size() && (n = Utf8At(text, end, &cp)) > 0; end += n) ascii = ascii && n == 1;
    if (end > i) {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t len = ascii ? -1
                                         : utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                                        static_cast<utf8proc_ssize_t>(end - i), &mapped,
                                                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
      if (len >= 0) {
        out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
      } else {
        out.append(text.data() + i, end - i);
      }
      std::free(mapped);
      i = end;
    }
    if (i < text.size()) out.push_back(text[i++]);  // an invalid byte
  }
  return out;
}

// Where a JSON text stops being JSON, for the message.
class ErrorPosition : public nlohmann::json_sax<json> {
 public:
  size_t position = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t p, const std::string&, const nlohmann::detail::exception&) override {
    position = p;
    return false;
  }
};

absl::StatusOr<json> ParseJson(absl::string_view text, const std::string& name) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  ErrorPosition error;
  json::sax_parse(text.begin(), text.end(), &error);
  return absl::InvalidArgumentError(absl::StrCat(name, " is not valid JSON (at byte ", error.position, ")"));
}

// Reads the fields of one file, naming it and the field in each error.
class Fields {
 public:
  explicit Fields(std::string file) : file_(std::move(file)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", field, " ", what));
  }
  // `obj[key]` when it is there and not null; nullptr otherwise.
  static const json* Find(const json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  absl::Status String(const json& obj, const char* key, const std::string& field, std::string* out,
                      bool required = false) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return required ? Error(field, "is missing; it must be a string") : absl::OkStatus();
    if (!v->is_string()) return Error(field, absl::StrCat("must be a string, not ", v->type_name()));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status Bool(const json& obj, const char* key, const std::string& field, bool* out) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Error(field, absl::StrCat("must be true or false, not ", v->type_name()));
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status Int(const json& obj, const char* key, const std::string& field, int64_t* out, int64_t max) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(field, "is missing; it must be a number");
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > max) {
      return Error(field, absl::StrCat("must be a whole number from 0 to ", max));
    }
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }
  // The "type" of a component object.
  absl::Status Type(const json& obj, const std::string& field, std::string* type) const {
    if (!obj.is_object()) return Error(field, absl::StrCat("must be an object, not ", obj.type_name()));
    return String(obj, "type", field + ".type", type, /*required=*/true);
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// A string or {"content": string} (an AddedToken), as tokenizer_config.json
// writes bos_token and eos_token; empty when null or absent.
absl::Status TokenText(const Fields& f, const json& obj, const char* key, std::string* out) {
  const json* v = Fields::Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_object()) return f.String(*v, "content", absl::StrCat(key, ".content"), out, /*required=*/true);
  return f.String(obj, key, key, out);
}

// A PCRE2 regex and its match data.
class Regex {
 public:
  ~Regex() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  // `literal`: the pattern is a plain string. Empty `error` on success.
  static std::unique_ptr<Regex> Compile(absl::string_view pattern, bool literal, std::string* error) {
    auto r = std::unique_ptr<Regex>(new Regex());
    int code = 0;
    PCRE2_SIZE offset = 0;
    r->code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &code,
                             &offset, nullptr);
    if (r->code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(code, message, sizeof(message));
      *error = absl::StrCat("does not compile (", reinterpret_cast<const char*>(message), " at offset ", offset, ")");
      return nullptr;
    }
    // Without the JIT (not built for every CPU) the interpreter matches the same.
    if (pcre2_jit_compile(r->code_, PCRE2_JIT_COMPLETE) == 0) {
      r->jit_stack_ = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
      r->context_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(r->context_, nullptr, r->jit_stack_);
    }
    r->match_ = pcre2_match_data_create_from_pattern(r->code_, nullptr);
    return r;
  }
  // The non-empty matches in `text`, left to right, as [begin, end) pairs.
  // Invalid UTF-8 is never inside a match. A resource limit ends the search
  // (the rest counts as unmatched).
  void Matches(absl::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
    out->clear();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), at, PCRE2_NOTEMPTY, match_, context_);
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_);
      const size_t start = ovector[0], end = ovector[1];
      if (end <= start || start < at || end > text.size()) break;
      out->emplace_back(start, end);
      at = end;
    }
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

// A "pattern" object: {"String": s} or {"Regex": r}.
absl::Status ReadPattern(const Fields& f, const json& obj, const std::string& field, std::string* pattern,
                         bool* literal) {
  const json* p = Fields::Find(obj, "pattern");
  if (p == nullptr || !p->is_object()) return f.Error(field, "must be an object {\"String\": ...} or {\"Regex\": ...}");
  if (Fields::Find(*p, "String") != nullptr) {
    *literal = true;
    absl::Status st = f.String(*p, "String", field + ".String", pattern, true);
    if (st.ok() && pattern->empty()) return f.Error(field + ".String", "must not be empty");
    return st;
  }
  if (Fields::Find(*p, "Regex") != nullptr) {
    *literal = false;
    return f.String(*p, "Regex", field + ".Regex", pattern, true);
  }
  return f.Error(field, "must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace

// --- the parts, read from tokenizer.json ------------------------------------

// What tokenizer.json describes beyond the vocabulary: the steps of each
// stage, the added tokens' matchers, and the BPE model's tables.
struct HfTokenizer::Impl {
  struct NormalizerStep {
    enum Kind { kUnicode, kPrepend, kReplace } kind;
    int unicode_options = 0;       // kUnicode: utf8proc's
    std::string text;              // kPrepend: what; kReplace: the replacement
    std::string literal;           // kReplace with a String pattern
    std::unique_ptr<Regex> regex;  // kReplace with a Regex pattern
  };
  struct PreTokenizerStep {
    enum Kind { kSplit, kByteLevel } kind;
    std::unique_ptr<Regex> regex;  // kSplit; kByteLevel with use_regex
    bool add_prefix_space = false;
  };
  struct DecoderStep {
    enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip } kind;
    std::string from, to;         // kReplace; kStrip: `from` is the character
    int64_t start = 0, stop = 0;  // kStrip
  };
  struct AddedToken {
    std::string content;
    uint32_t id;
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
  };
  // Finds added tokens: a byte trie, leftmost then longest match.
  class Matcher {
   public:
    void Add(const std::string& content, int token) {
      if (content.empty()) return;
      if (nodes_.empty()) nodes_.push_back(-1);
      int node = 0;
      for (char c : content) {
        const uint64_t key = (uint64_t(node) << 8) | static_cast<unsigned char>(c);
        auto it = children_.find(key);
        if (it == children_.end()) {
          it = children_.emplace(key, static_cast<int>(nodes_.size())).first;
          nodes_.push_back(-1);
        }
        node = it->second;
      }
      first_[static_cast<unsigned char>(content[0])] = true;
      if (nodes_[static_cast<size_t>(node)] < 0) nodes_[static_cast<size_t>(node)] = token;
    }
    bool empty() const { return nodes_.empty(); }
    // The first match at or after `from`: false when none.
    bool Find(absl::string_view text, size_t from, size_t* start, size_t* end, int* token) const {
      for (size_t i = from; i < text.size(); ++i) {
        if (!first_[static_cast<unsigned char>(text[i])]) continue;
        int node = 0, found = -1;
        size_t found_end = 0;
        for (size_t j = i; j < text.size(); ++j) {
          auto it = children_.find((uint64_t(node) << 8) | static_cast<unsigned char>(text[j]));
          if (it == children_.end()) break;
          node = it->second;
          if (nodes_[static_cast<size_t>(node)] >= 0) found = nodes_[static_cast<size_t>(node)], found_end = j + 1;
        }
        if (found >= 0) {
          *start = i, *end = found_end, *token = found;
          return true;
        }
      }
      return false;
    }

   private:
    // Node -> the added token ending there, or -1.
    std::vector<int> nodes_;
    absl::flat_hash_map<uint64_t, int> children_;
    bool first_[256] = {};
  };
  // A stretch of text between added tokens, or an added token.
  struct Segment {
    size_t begin, end;
    int token;  // index into added, or -1 for text
  };

  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  std::vector<AddedToken> added;
  Matcher raw_matcher, normalized_matcher;

  // The model. Token (model alphabet: raw bytes for byte-level files) -> id.
  absl::flat_hash_map<std::string, uint32_t> vocab;
  // (left id << 32 | right id) -> the merge's rank and the merged id.
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  absl::flat_hash_map<uint64_t, Merge> merges;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  uint32_t unk_id = kNoId;
  // <0xNN> -> its id (kNoId where the vocabulary lacks it).
  uint32_t byte_token_ids[256];
  // Byte-level files: byte -> the ids its character starts as (empty: not
  // in the vocabulary and no unk token, so dropped, as Hugging Face does).
  std::vector<uint32_t> byte_units[256];

  // Normalizes `text` (a stretch between raw added tokens).
  std::string Normalized(absl::string_view text) const {
    std::string s(text);
    std::vector<std::pair<size_t, size_t>> matches;
    for (const NormalizerStep& step : normalizer) {
      if (step.kind == NormalizerStep::kUnicode) {
        s = Normalize(s, step.unicode_options);
      } else if (step.kind == NormalizerStep::kPrepend) {
        if (!s.empty()) s.insert(0, step.text);
      } else if (step.regex == nullptr) {
        s = absl::StrReplaceAll(s, {{step.literal, step.text}});
      } else {
        step.regex->Matches(s, &matches);
        std::string r;
        size_t at = 0;
        for (const auto& [b, e] : matches) {
          r.append(s, at, b - at);
          r += step.text;
          at = e;
        }
        r.append(s, at, std::string::npos);
        s = std::move(r);
      }
    }
    return s;
  }

  // Splits `text` at the added tokens `matcher` finds, as Hugging Face's
  // AddedVocabulary::find_matches does (lstrip/rstrip widen a token over
  // the white space beside it; single_word skips a token inside a word).
  void SplitAdded(const Matcher& m, absl::string_view text, std::vector<Segment>* out) const {
    out->clear();
    if (m.empty()) {
      if (!text.empty()) out->push_back({0, text.size(), -1});
      return;
    }
    size_t offset = 0, pos = 0, start, stop;
    int token;
    uint32_t cp;
    while (m.Find(text, pos, &start, &stop, &token)) {
      pos = stop;
      const AddedToken& t = added[static_cast<size_t>(token)];
      if (t.single_word) {
        const size_t before = Utf8Before(text, start, &cp);
        const bool word_before = before > 0 && IsWordChar(cp);
        const size_t after = stop < text.size() ? Utf8At(text, stop, &cp) : 0;
        const bool word_after = after > 0 && IsWordChar(cp);
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        size_t s = start, n;
        while ((n = Utf8Before(text, s, &cp)) > 0 && IsSpace(cp)) s -= n;
        start = std::max(s, offset);
      }
      if (t.rstrip) {
        size_t n;
        while (stop < text.size() && (n = Utf8At(text, stop, &cp)) > 0 && IsSpace(cp)) stop += n;
        pos = stop;
      }
      if (offset < start) out->push_back({offset, start, -1});
      out->push_back({start, stop, token});
      offset = stop;
    }
    if (offset < text.size()) out->push_back({offset, text.size(), -1});
  }

  // The pieces the pre-tokenizers split `text` into (their bytes; the
  // ByteLevel step's mapping to GPT-2's alphabet is left to the model's
  // byte table). Prefix spaces live in `owned`.
  void PreTokenize(absl::string_view text, std::deque<std::string>* owned,
                   std::vector<absl::string_view>* pieces) const {
    pieces->assign(1, text);
    std::vector<absl::string_view> next;
    std::vector<std::pair<size_t, size_t>> matches;
    for (const PreTokenizerStep& step : pre_tokenizer) {
      next.clear();
      for (absl::string_view piece : *pieces) {
        if (step.kind == PreTokenizerStep::kByteLevel && step.add_prefix_space && !piece.empty() && piece[0] != ' ') {
          owned->push_back(absl::StrCat(" ", piece));
          piece = owned->back();
        }
        if (step.regex == nullptr) {
          if (!piece.empty()) next.push_back(piece);
          continue;
        }
        // Isolated: each match a piece, and each stretch between matches.
        step.regex->Matches(piece, &matches);
        size_t at = 0;
        for (const auto& [b, e] : matches) {
          if (b > at) next.push_back(piece.substr(at, b - at));
          next.push_back(piece.substr(b, e - b));
          at = e;
        }
        if (at < piece.size()) next.push_back(piece.substr(at));
      }
      pieces->swap(next);
    }
  }
};

namespace {

using Impl = HfTokenizer::Impl;

// The type of a step of a component that nests (normalizer, pre-tokenizer,
// decoder, post-processor) into *type, refused deeper than kMaxDepth. A
// Sequence has each of its steps (the list `steps`, e.g. "normalizers")
// read by `read` one level deeper; *type is then "Sequence" and nothing is
// left to read.
using ReadStep = std::function<absl::Status(const json& step, const std::string& field, int depth)>;
absl::Status ReadStepType(const Fields& f, const json& node, const std::string& field, const char* steps, int depth,
                          const ReadStep& read, std::string* type) {
  if (depth > kMaxDepth) return f.Error(field, absl::StrCat("nests Sequences deeper than ", kMaxDepth));
  if (absl::Status s = f.Type(node, field, type); !s.ok()) return s;
  if (*type != "Sequence") return absl::OkStatus();
  const json* list = Fields::Find(node, steps);
  if (list == nullptr || !list->is_array()) return f.Error(absl::StrCat(field, ".", steps), "must be a list");
  for (size_t i = 0; i < list->size(); ++i) {
    if (absl::Status s = read((*list)[i], absl::StrCat(field, ".", steps, "[", i, "]"), depth + 1); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadNormalizer(const Fields& f, const json& n, const std::string& field, Impl* impl, int depth = 0) {
  std::string type;
  const ReadStep read = [&](const json& step, const std::string& at, int deeper) {
    return ReadNormalizer(f, step, at, impl, deeper);
  };
  if (absl::Status s = ReadStepType(f, n, field, "normalizers", depth, read, &type); !s.ok() || type == "Sequence") {
    return s;
  }
  Impl::NormalizerStep step;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Impl::NormalizerStep::kUnicode;
    step.unicode_options =
        (type[2] == 'K' ? UTF8PROC_COMPAT : 0) | (type.back() == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
  } else if (type == "Prepend") {
    step.kind = Impl::NormalizerStep::kPrepend;
    if (absl::Status s = f.String(n, "prepend", field + ".prepend", &step.text, true); !s.ok()) return s;
  } else if (type == "Replace") {
    step.kind = Impl::NormalizerStep::kReplace;
    std::string pattern;
    bool literal = false;
    if (absl::Status s = ReadPattern(f, n, field + ".pattern", &pattern, &literal); !s.ok()) return s;
    if (absl::Status s = f.String(n, "content", field + ".content", &step.text, true); !s.ok()) return s;
    if (literal) {
      step.literal = pattern;
    } else {
      std::string error;
      step.regex = Regex::Compile(pattern, false, &error);
      if (step.regex == nullptr) return f.Error(field + ".pattern.Regex", error);
    }
  } else {
    return f.Error(field + ".type", absl::StrCat("is \"", type,
                                                 "\"; Ferry supports the normalizers NFC, NFD, NFKC, "
                                                 "NFKD, Prepend, Replace and Sequence"));
  }
  impl->normalizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ReadPreTokenizer(const Fields& f, const json& p, const std::string& field, Impl* impl, int depth = 0) {
  std::string type;
  const ReadStep read = [&](const json& step, const std::string& at, int deeper) {
    return ReadPreTokenizer(f, step, at, impl, deeper);
  };
  if (absl::Status s = ReadStepType(f, p, field, "pretokenizers", depth, read, &type); !s.ok() || type == "Sequence") {
    return s;
  }
  if (!impl->pre_tokenizer.empty() && impl->pre_tokenizer.back().kind == Impl::PreTokenizerStep::kByteLevel) {
    return f.Error(field, "follows a ByteLevel pre-tokenizer; Ferry supports ByteLevel only as the last one");
  }
  Impl::PreTokenizerStep step;
  std::string error;
  if (type == "Split") {
    step.kind = Impl::PreTokenizerStep::kSplit;
    std::string pattern, behavior;
    bool literal = false, invert = false;
    if (absl::Status s = ReadPattern(f, p, field + ".pattern", &pattern, &literal); !s.ok()) return s;
    if (absl::Status s = f.String(p, "behavior", field + ".behavior", &behavior, true); !s.ok()) return s;
    if (absl::Status s = f.Bool(p, "invert", field + ".invert", &invert); !s.ok()) return s;
    if (behavior != "Isolated") {
      return f.Error(field + ".behavior",
                     absl::StrCat("is \"", behavior, "\"; Ferry supports Split with behavior Isolated only"));
    }
    if (invert) return f.Error(field + ".invert", "is true; Ferry supports Split with invert false only");
    step.regex = Regex::Compile(pattern, literal, &error);
    if (step.regex == nullptr) return f.Error(field + ".pattern", error);
  } else if (type == "ByteLevel") {
    step.kind = Impl::PreTokenizerStep::kByteLevel;
    bool use_regex = true;
    if (absl::Status s = f.Bool(p, "add_prefix_space", field + ".add_prefix_space", &step.add_prefix_space); !s.ok()) {
      return s;
    }
    if (absl::Status s = f.Bool(p, "use_regex", field + ".use_regex", &use_regex); !s.ok()) return s;
    if (use_regex) {
      step.regex = Regex::Compile(kGpt2Pattern, false, &error);
      if (step.regex == nullptr) return absl::InternalError("GPT-2's pattern does not compile with PCRE2");
    }
  } else {
    return f.Error(field + ".type", absl::StrCat("is \"", type,
                                                 "\"; Ferry supports the pre-tokenizers Split, "
                                                 "ByteLevel and Sequence"));
  }
  impl->pre_tokenizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ReadDecoder(const Fields& f, const json& d, const std::string& field, Impl* impl, int depth = 0) {
  std::string type;
  const ReadStep read = [&](const json& step, const std::string& at, int deeper) {
    return ReadDecoder(f, step, at, impl, deeper);
  };
  if (absl::Status s = ReadStepType(f, d, field, "decoders", depth, read, &type); !s.ok() || type == "Sequence") {
    return s;
  }
  Impl::DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = Impl::DecoderStep::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Impl::DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Impl::DecoderStep::kFuse;
  } else if (type == "Replace") {
    step.kind = Impl::DecoderStep::kReplace;
    bool literal = false;
    if (absl::Status s = ReadPattern(f, d, field + ".pattern", &step.from, &literal); !s.ok()) return s;
    if (!literal) return f.Error(field + ".pattern", "is a Regex; Ferry supports Replace decoders with a String only");
    if (absl::Status s = f.String(d, "content", field + ".content", &step.to, true); !s.ok()) return s;
  } else if (type == "Strip") {
    step.kind = Impl::DecoderStep::kStrip;
    uint32_t cp;
    if (absl::Status s = f.String(d, "content", field + ".content", &step.from, true); !s.ok()) return s;
    if (step.from.empty() || Utf8At(step.from, 0, &cp) != step.from.size()) {
      return f.Error(field + ".content", "must be one character");
    }
    if (absl::Status s = f.Int(d, "start", field + ".start", &step.start, 1 << 20); !s.ok()) return s;
    if (absl::Status s = f.Int(d, "stop", field + ".stop", &step.stop, 1 << 20); !s.ok()) return s;
  } else {
    return f.Error(field + ".type", absl::StrCat("is \"", type,
                                                 "\"; Ferry supports the decoders ByteLevel, Replace, "
                                                 "ByteFallback, Fuse, Strip and Sequence"));
  }
  impl->decoder.push_back(std::move(step));
  return absl::OkStatus();
}

// The single-sequence template of a post_processor: ids before and after
// the text.
absl::Status ReadPostProcessor(const Fields& f, const json& p, const std::string& field, const HfTokenizer& t,
                               bool* have_template, std::vector<uint32_t>* prefix, std::vector<uint32_t>* suffix,
                               int depth = 0) {
  std::string type;
  const ReadStep read = [&](const json& step, const std::string& at, int deeper) {
    return ReadPostProcessor(f, step, at, t, have_template, prefix, suffix, deeper);
  };
  if (absl::Status s = ReadStepType(f, p, field, "processors", depth, read, &type); !s.ok() || type == "Sequence") {
    return s;
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type != "TemplateProcessing") {
    return f.Error(field + ".type", absl::StrCat("is \"", type,
                                                 "\"; Ferry supports the post-processors "
                                                 "TemplateProcessing, ByteLevel and Sequence"));
  }
  if (*have_template) return f.Error(field, "is a second TemplateProcessing; Ferry supports one");
  *have_template = true;
  const json* single = Fields::Find(p, "single");
  if (single == nullptr || !single->is_array()) return f.Error(field + ".single", "must be a list");
  const json* special = Fields::Find(p, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string where = absl::StrCat(field, ".single[", i, "]");
    if (const json* seq = Fields::Find(item, "Sequence")) {
      std::string id;
      if (absl::Status s = f.String(*seq, "id", where + ".Sequence.id", &id, true); !s.ok()) return s;
      if (id != "A" || seen_sequence) {
        return f.Error(where + ".Sequence.id", "must be \"A\", once, in a single-sequence template");
      }
      seen_sequence = true;
      continue;
    }
    const json* tok = Fields::Find(item, "SpecialToken");
    if (tok == nullptr) return f.Error(where, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    std::string name;
    if (absl::Status s = f.String(*tok, "id", where + ".SpecialToken.id", &name, true); !s.ok()) return s;
    std::vector<uint32_t> ids;
    const json* entry = special != nullptr ? Fields::Find(*special, name.c_str()) : nullptr;
    const json* entry_ids = entry != nullptr ? Fields::Find(*entry, "ids") : nullptr;
    if (entry_ids != nullptr) {
      if (!entry_ids->is_array()) return f.Error(field + ".special_tokens." + name + ".ids", "must be a list");
      for (const json& id : *entry_ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= t.vocab_size() ||
            !t.Decode({static_cast<uint32_t>(id.get<int64_t>())}).ok()) {
          return f.Error(field + ".special_tokens." + name + ".ids", "holds an id that is not a token");
        }
        ids.push_back(static_cast<uint32_t>(id.get<int64_t>()));
      }
    } else if (std::optional<uint32_t> id = t.TokenId(name)) {
      ids.push_back(*id);
    } else {
      return f.Error(where + ".SpecialToken.id", absl::StrCat("names \"", name, "\", which is not a token"));
    }
    (seen_sequence ? suffix : prefix)->insert((seen_sequence ? suffix : prefix)->end(), ids.begin(), ids.end());
  }
  if (!seen_sequence) return f.Error(field + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
  return absl::OkStatus();
}

// Reads a merge, "a b" or ["a", "b"].
bool MergePair(const json& m, std::string* a, std::string* b) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == s.size()) return false;
    *a = s.substr(0, space);
    *b = s.substr(space + 1);
    return true;
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *a = m[0].get<std::string>();
    *b = m[1].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

// --- loading -----------------------------------------------------------------

HfTokenizer::HfTokenizer(TokenizerSpec spec) : spec_(std::move(spec)), impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& tokenizer_json_path,
                                                               const std::string& config_path) {
  absl::StatusOr<std::string> tokenizer = ReadTokenizerFile(tokenizer_json_path, "tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status();
  std::string config;
  TokenizerSpec spec{kHfTokenizer, {tokenizer_json_path}};
  if (!config_path.empty()) {
    absl::StatusOr<std::string> c = ReadTokenizerFile(config_path, "tokenizer_config.json");
    if (!c.ok()) return c.status();
    config = std::move(*c);
    spec.files.push_back(config_path);
  }
  return FromContents(*tokenizer, config, std::move(spec));
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromContents(absl::string_view tokenizer_json,
                                                                       absl::string_view config_json,
                                                                       TokenizerSpec spec) {
  const Fields f(spec.files.size() > 0 ? spec.files[0] : "tokenizer.json");
  const Fields fc(spec.files.size() > 1 ? spec.files[1] : "tokenizer_config.json");
  absl::StatusOr<json> root = ParseJson(tokenizer_json, f.file());
  if (!root.ok()) return root.status();
  if (!root->is_object()) return f.Error("(the whole file)", "must be a JSON object");
  json config = json::object();
  if (!config_json.empty()) {
    absl::StatusOr<json> c = ParseJson(config_json, fc.file());
    if (!c.ok()) return c.status();
    if (!c->is_object()) return fc.Error("(the whole file)", "must be a JSON object");
    config = std::move(*c);
  }
  std::unique_ptr<HfTokenizer> t(new HfTokenizer(std::move(spec)));
  Impl& impl = *t->impl_;

  // The model: BPE only.
  const json* model = Fields::Find(*root, "model");
  if (model == nullptr) return f.Error("model", "is missing");
  std::string type;
  if (absl::Status s = f.String(*model, "type", "model.type", &type); !s.ok()) return s;
  if (type.empty() && Fields::Find(*model, "merges") != nullptr) type = "BPE";  // files of old tokenizers
  if (type != "BPE") {
    return f.Error("model.type", absl::StrCat("is \"", type.empty() ? "(none)" : type,
                                              "\"; Ferry's hf tokenizer supports BPE models only (Llama 2/3, "
                                              "Mistral, Qwen, GPT-2); for a SentencePiece Unigram model use the "
                                              "sentencepiece tokenizer with its .model file"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string affix;
    if (absl::Status s = f.String(*model, key, absl::StrCat("model.", key), &affix); !s.ok()) return s;
    if (!affix.empty()) return f.Error(absl::StrCat("model.", key), "is set; Ferry supports BPE without one");
  }
  if (const json* dropout = Fields::Find(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return f.Error("model.dropout", "is set; Ferry supports BPE without dropout");
  }
  if (absl::Status s = f.Bool(*model, "byte_fallback", "model.byte_fallback", &impl.byte_fallback); !s.ok()) return s;
  if (absl::Status s = f.Bool(*model, "fuse_unk", "model.fuse_unk", &impl.fuse_unk); !s.ok()) return s;
  if (absl::Status s = f.Bool(*model, "ignore_merges", "model.ignore_merges", &impl.ignore_merges); !s.ok()) return s;

  const json* vocab = Fields::Find(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return f.Error("model.vocab", "must be an object of token -> id");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxId) {
      return f.Error("model.vocab",
                     absl::StrCat("gives token ", json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace),
                                  " no id from 0 to ", kMaxId));
    }
    max_id = std::max(max_id, it->get<int64_t>());
  }
  const json* added = Fields::Find(*root, "added_tokens");
  if (added != nullptr && !added->is_array()) return f.Error("added_tokens", "must be a list");
  if (added != nullptr) {
    for (size_t i = 0; i < added->size(); ++i) {
      int64_t id;
      if (absl::Status s = f.Int((*added)[i], "id", absl::StrCat("added_tokens[", i, "].id"), &id, kMaxId); !s.ok()) {
        return s;
      }
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) return f.Error("model.vocab", "holds no tokens");
  const auto size = static_cast<size_t>(max_id + 1);
  t->tokens_.assign(size, std::string());
  t->used_.assign(size, false);
  t->added_.assign(size, false);
  // Token as written -> id, for the merges and the special tokens.
  absl::flat_hash_map<std::string, uint32_t> ids;
  ids.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<uint32_t>(it->get<int64_t>());
    if (t->used_[id]) {
      return f.Error("model.vocab", absl::StrCat("gives id ", id, " to two tokens; ids must be unique"));
    }
    t->used_[id] = true;
    t->tokens_[id] = it.key();
    ids.emplace(it.key(), id);
  }

  const json* merges = Fields::Find(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return f.Error("model.merges", "must be a list of \"a b\" strings or [\"a\", \"b\"] pairs");
  }
  impl.merges.reserve(merges->size());
  std::string a, b;
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string field = absl::StrCat("model.merges[", i, "]");
    if (!MergePair((*merges)[i], &a, &b)) {
      return f.Error(field, "must be \"a b\" (two tokens, one space) or [\"a\", \"b\"]");
    }
    const auto l = ids.find(a), r = ids.find(b), joined = ids.find(a + b);
    if (l == ids.end() || r == ids.end() || joined == ids.end()) {
      return f.Error(field, absl::StrCat("has a ",
                                         l == ids.end()   ? "first"
                                         : r == ids.end() ? "second"
                                                          : "merged",
                                         " token that is not in model.vocab"));
    }
    // A pair listed twice keeps its last rank, as Hugging Face's map does.
    impl.merges.insert_or_assign((uint64_t{l->second} << 32) | r->second,
                                 Impl::Merge{static_cast<uint32_t>(i), joined->second});
  }
  std::string unk;
  if (absl::Status s = f.String(*model, "unk_token", "model.unk_token", &unk); !s.ok()) return s;
  if (!unk.empty()) {
    auto it = ids.find(unk);
    if (it == ids.end())
      return f.Error("model.unk_token", absl::StrCat("names \"", unk, "\", which is not in model.vocab"));
    impl.unk_id = it->second;
  }
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    auto it = ids.find(name);
    impl.byte_token_ids[byte] = it == ids.end() ? kNoId : it->second;
  }

  // Added tokens: ids of their own or of vocabulary tokens.
  if (added != nullptr) {
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a_json = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      Impl::AddedToken token;
      int64_t id;
      bool special = false;
      if (absl::Status s = f.Int(a_json, "id", field + ".id", &id, kMaxId); !s.ok()) return s;
      token.id = static_cast<uint32_t>(id);
      if (absl::Status s = f.String(a_json, "content", field + ".content", &token.content, true); !s.ok()) return s;
      if (token.content.empty()) return f.Error(field + ".content", "is empty");
      if (absl::Status s = f.Bool(a_json, "special", field + ".special", &special); !s.ok()) return s;
      token.normalized = !special;  // Hugging Face's default
      for (auto [key, out] : {std::pair<const char*, bool*>{"lstrip", &token.lstrip},
                              {"rstrip", &token.rstrip},
                              {"single_word", &token.single_word},
                              {"normalized", &token.normalized}}) {
        if (absl::Status s = f.Bool(a_json, key, absl::StrCat(field, ".", key), out); !s.ok()) return s;
      }
      if (t->used_[token.id] && !t->added_[token.id] && t->tokens_[token.id] != token.content) {
        return f.Error(field + ".id", absl::StrCat("is ", token.id, ", which model.vocab gives to another token"));
      }
      t->used_[token.id] = true;
      t->added_[token.id] = true;
      t->tokens_[token.id] = token.content;
      ids.insert_or_assign(token.content, token.id);
      impl.added.push_back(std::move(token));
    }
  }

  // Normalizer, pre-tokenizer, decoder.
  if (const json* n = Fields::Find(*root, "normalizer")) {
    if (absl::Status s = ReadNormalizer(f, *n, "normalizer", &impl); !s.ok()) return s;
  }
  if (const json* p = Fields::Find(*root, "pre_tokenizer")) {
    if (absl::Status s = ReadPreTokenizer(f, *p, "pre_tokenizer", &impl); !s.ok()) return s;
  }
  t->byte_level_ = !impl.pre_tokenizer.empty() && impl.pre_tokenizer.back().kind == Impl::PreTokenizerStep::kByteLevel;
  if (const json* d = Fields::Find(*root, "decoder")) {
    impl.has_decoder = true;
    if (absl::Status s = ReadDecoder(f, *d, "decoder", &impl); !s.ok()) return s;
  }
  // Added tokens are found in the raw text, or (normalized true, with a
  // normalizer) in the normalized text by their normalized content.
  for (size_t i = 0; i < impl.added.size(); ++i) {
    Impl::AddedToken& token = impl.added[i];
    if (token.normalized && !impl.normalizer.empty()) {
      impl.normalized_matcher.Add(impl.Normalized(token.content), static_cast<int>(i));
    } else {
      impl.raw_matcher.Add(token.content, static_cast<int>(i));
    }
  }

  // The model's keys: raw bytes for byte-level files (tokens outside GPT-2's
  // alphabet are never produced by merging bytes), the text otherwise.
  impl.vocab.reserve(vocab->size());
  std::string bytes;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<uint32_t>(it->get<int64_t>());
    if (!t->byte_level_) {
      impl.vocab.emplace(it.key(), id);
    } else if (Gpt2TokenBytes(it.key(), &bytes)) {
      impl.vocab.emplace(bytes, id);
    }
  }
  if (t->byte_level_) {
    for (int byte = 0; byte < 256; ++byte) {
      std::string unit;
      const uint32_t cp = Gpt2ByteToCodePoint(static_cast<unsigned char>(byte));
      // GPT-2's alphabet is below U+0800: two bytes at most.
      if (cp < 0x80) {
        unit.push_back(static_cast<char>(cp));
      } else {
        unit.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        unit.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      std::vector<uint32_t>& out = impl.byte_units[byte];
      if (auto it = vocab->find(unit); it != vocab->end()) {
        out.push_back(static_cast<uint32_t>(it->get<int64_t>()));
        continue;
      }
      bool all = impl.byte_fallback;
      for (char c : unit) all = all && impl.byte_token_ids[static_cast<unsigned char>(c)] != kNoId;
      if (all) {
        for (char c : unit) out.push_back(impl.byte_token_ids[static_cast<unsigned char>(c)]);
      } else if (impl.unk_id != kNoId) {
        out.push_back(impl.unk_id);
      }
    }
  }

  // The template of EncodeWithSpecialTokens, and BOS/EOS.
  bool have_template = false;
  if (const json* p = Fields::Find(*root, "post_processor")) {
    if (absl::Status s =
            ReadPostProcessor(f, *p, "post_processor", *t, &have_template, &t->prefix_ids_, &t->suffix_ids_);
        !s.ok()) {
      return s;
    }
  }
  std::string bos, eos;
  if (absl::Status s = TokenText(fc, config, "bos_token", &bos); !s.ok()) return s;
  if (absl::Status s = TokenText(fc, config, "eos_token", &eos); !s.ok()) return s;
  if (!bos.empty()) {
    t->bos_id_ = t->TokenId(bos);
    if (!t->bos_id_) return fc.Error("bos_token", absl::StrCat("names \"", bos, "\", which is not a token"));
  } else if (!t->prefix_ids_.empty()) {
    t->bos_id_ = t->prefix_ids_.front();
  }
  if (!eos.empty()) {
    std::optional<uint32_t> id = t->TokenId(eos);
    if (!id) return fc.Error("eos_token", absl::StrCat("names \"", eos, "\", which is not a token"));
    t->eos_ids_.push_back(*id);
  } else if (!t->suffix_ids_.empty()) {
    t->eos_ids_.push_back(t->suffix_ids_.back());
  }
  bool add_bos = false, add_eos = false;
  if (absl::Status s = fc.Bool(config, "add_bos_token", "add_bos_token", &add_bos); !s.ok()) return s;
  if (absl::Status s = fc.Bool(config, "add_eos_token", "add_eos_token", &add_eos); !s.ok()) return s;
  if (Fields::Find(config, "add_bos_token") != nullptr || Fields::Find(config, "add_eos_token") != nullptr) {
    // As transformers' Llama tokenizers rebuild the template from them.
    if (add_bos && bos.empty()) return fc.Error("add_bos_token", "is true but bos_token names no token");
    if (add_eos && eos.empty()) return fc.Error("add_eos_token", "is true but eos_token names no token");
    t->prefix_ids_.clear();
    t->suffix_ids_.clear();
    if (add_bos) t->prefix_ids_.push_back(*t->bos_id_);
    if (add_eos) t->suffix_ids_.push_back(t->eos_ids_.front());
  }
  return t;
}

absl::StatusOr<TokenizerSpec> HfTokenizerSpec(const std::string& dir_or_file) {
  struct stat st;
  if (stat(dir_or_file.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(dir_or_file, " does not exist; give a model folder or its tokenizer.json"));
  }
  if (!S_ISDIR(st.st_mode)) return TokenizerSpec{kHfTokenizer, {dir_or_file}};
  const std::string dir = dir_or_file.back() == '/' ? dir_or_file.substr(0, dir_or_file.size() - 1) : dir_or_file;
  TokenizerSpec spec{kHfTokenizer, {dir + "/tokenizer.json"}};
  if (stat(spec.files[0].c_str(), &st) != 0 || S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(dir_or_file,
                                            " holds no tokenizer.json (a Hugging Face model folder "
                                            "has one; older ones with only vocab.json and merges.txt "
                                            "load as the gpt2 tokenizer)"));
  }
  const std::string config = dir + "/tokenizer_config.json";
  if (stat(config.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) spec.files.push_back(config);
  return spec;
}

// --- encoding -----------------------------------------------------------------

std::optional<uint32_t> HfTokenizer::TokenId(absl::string_view token) const {
  for (const Impl::AddedToken& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  std::string key(token);
  if (byte_level_ && !Gpt2TokenBytes(token, &key)) {
    // Outside GPT-2's alphabet: only the slow way.
    for (size_t id = 0; id < tokens_.size(); ++id) {
      if (used_[id] && tokens_[id] == token) return static_cast<uint32_t>(id);
    }
    return std::nullopt;
  }
  auto it = impl_->vocab.find(key);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::vector<uint32_t> HfTokenizer::Encode(absl::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  std::vector<Impl::Segment> segments, inner;
  impl_->SplitAdded(impl_->raw_matcher, text, &segments);
  for (const Impl::Segment& s : segments) {
    if (s.token >= 0) {
      ids.push_back(impl_->added[static_cast<size_t>(s.token)].id);
      continue;
    }
    const std::string normalized = impl_->Normalized(text.substr(s.begin, s.end - s.begin));
    impl_->SplitAdded(impl_->normalized_matcher, normalized, &inner);
    for (const Impl::Segment& n : inner) {
      if (n.token >= 0) {
        ids.push_back(impl_->added[static_cast<size_t>(n.token)].id);
      } else {
        EncodeText(absl::string_view(normalized).substr(n.begin, n.end - n.begin), &ids);
      }
    }
  }
  return ids;
}

std::vector<uint32_t> HfTokenizer::EncodeWithSpecialTokens(absl::string_view text) {
  std::vector<uint32_t> ids = prefix_ids_;
  std::vector<uint32_t> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void HfTokenizer::EncodeText(absl::string_view text, std::vector<uint32_t>* out) {
  std::deque<std::string> owned;
  std::vector<absl::string_view> pieces;
  impl_->PreTokenize(text, &owned, &pieces);
  for (absl::string_view piece : pieces) EncodePiece(piece, out);
}

void HfTokenizer::EncodePiece(absl::string_view piece, std::vector<uint32_t>* out) {
  Impl& m = *impl_;
  if (piece.empty()) return;
  if (m.ignore_merges) {
    if (auto it = m.vocab.find(piece); it != m.vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() < kMaxCachedPiece;
  if (cacheable) {
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // The symbols the piece starts as: a byte's character (byte-level files)
  // or each character; one outside the vocabulary becomes its <0xNN> byte
  // tokens (byte_fallback), else unk (consecutive ones fused with
  // fuse_unk), else nothing.
  std::vector<uint32_t> id;
  id.reserve(piece.size());
  if (byte_level_) {
    for (char c : piece) {
      const std::vector<uint32_t>& unit = m.byte_units[static_cast<unsigned char>(c)];
      id.insert(id.end(), unit.begin(), unit.end());
    }
  } else {
    bool last_unk = false;
    uint32_t cp;
    for (size_t i = 0; i < piece.size();) {
      const size_t n = std::max<size_t>(1, Utf8At(piece, i, &cp));
      const absl::string_view ch = piece.substr(i, n);
      i += n;
      if (auto it = m.vocab.find(ch); it != m.vocab.end()) {
        id.push_back(it->second);
        last_unk = false;
        continue;
      }
      bool all = m.byte_fallback;
      for (char c : ch) all = all && m.byte_token_ids[static_cast<unsigned char>(c)] != kNoId;
      if (all) {
        for (char c : ch) id.push_back(m.byte_token_ids[static_cast<unsigned char>(c)]);
        last_unk = false;
      } else if (m.unk_id != kNoId) {
        if (!(last_unk && m.fuse_unk)) id.push_back(m.unk_id);
        last_unk = true;
      }
    }
  }

  // Merges as Hugging Face's Word::merge_all does: a heap of candidate
  // pairs by (rank, position); a popped pair is applied when the symbols at
  // its position still form a pair that merges into the same token.
  const int n = static_cast<int>(id.size());
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<bool> gone(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int pos;
    uint32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto find = [&](int l) -> const Impl::Merge* {
    const int r = next[static_cast<size_t>(l)];
    if (r < 0) return nullptr;
    auto it = m.merges.find((uint64_t{id[static_cast<size_t>(l)]} << 32) | id[static_cast<size_t>(r)]);
    return it == m.merges.end() ? nullptr : &it->second;
  };
  for (int i = 0; i + 1 < n; ++i) {
    if (const Impl::Merge* merge = find(i)) heap.push({merge->rank, i, merge->id});
  }
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto p = static_cast<size_t>(c.pos);
    if (gone[p]) continue;
    const Impl::Merge* merge = find(c.pos);
    if (merge == nullptr || merge->id != c.new_id) continue;
    const int r = next[p];
    id[p] = c.new_id;
    next[p] = next[static_cast<size_t>(r)];
    if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = c.pos;
    gone[static_cast<size_t>(r)] = true;
    if (prev[p] >= 0) {
      if (const Impl::Merge* left = find(prev[p])) heap.push({left->rank, prev[p], left->id});
    }
    if (const Impl::Merge* right = find(c.pos)) heap.push({right->rank, c.pos, right->id});
  }
  std::vector<uint32_t> ids;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[static_cast<size_t>(i)]) ids.push_back(id[static_cast<size_t>(i)]);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(ids));
  }
}

// --- decoding -----------------------------------------------------------------

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  struct Piece {
    std::string text;
    bool added;
  };
  std::vector<Piece> pieces;
  pieces.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= tokens_.size() || !used_[ids[i]]) {
      return absl::InvalidArgumentError(absl::StrCat("token ", ids[i], " at position ", i, " is not in ",
                                                     spec_.files.empty() ? "tokenizer.json" : spec_.files[0]));
    }
    pieces.push_back({tokens_[ids[i]], added_[ids[i]]});
  }
  if (!impl_->has_decoder) {
    // Hugging Face joins the tokens with spaces when there is no decoder.
    std::vector<std::string> texts;
    for (Piece& p : pieces) texts.push_back(std::move(p.text));
    return absl::StrJoin(texts, " ");
  }
  std::string bytes;
  for (const Impl::DecoderStep& step : impl_->decoder) {
    std::vector<Piece> next;
    switch (step.kind) {
      case Impl::DecoderStep::kByteLevel: {
        // Model tokens back to their bytes (a token outside GPT-2's alphabet
        // as its own text); added tokens as they are. One piece results.
        std::string all;
        for (const Piece& p : pieces) {
          if (!p.added && Gpt2TokenBytes(p.text, &bytes)) {
            all += bytes;
          } else {
            all += p.text;
          }
        }
        next.push_back({std::move(all), false});
        break;
      }
      case Impl::DecoderStep::kReplace:
        for (Piece& p : pieces) next.push_back({absl::StrReplaceAll(p.text, {{step.from, step.to}}), p.added});
        break;
      case Impl::DecoderStep::kByteFallback: {
        // Runs of <0xNN> tokens become their bytes.
        std::string run;
        for (Piece& p : pieces) {
          const std::string& s = p.text;
          char* end = nullptr;
          const long byte = s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
                                    std::isxdigit(static_cast<unsigned char>(s[3])) &&
                                    std::isxdigit(static_cast<unsigned char>(s[4]))
                                ? std::strtol(s.substr(3, 2).c_str(), &end, 16)
                                : -1;
          if (byte >= 0) {
            run.push_back(static_cast<char>(byte));
            continue;
          }
          if (!run.empty()) next.push_back({std::move(run), false}), run.clear();
          next.push_back(std::move(p));
        }
        if (!run.empty()) next.push_back({std::move(run), false});
        break;
      }
      case Impl::DecoderStep::kFuse: {
        std::string all;
        for (const Piece& p : pieces) all += p.text;
        next.push_back({std::move(all), false});
        break;
      }
      case Impl::DecoderStep::kStrip:
        // Up to `start` leading and `stop` trailing copies of the character.
        for (Piece& p : pieces) {
          absl::string_view s = p.text;
          for (int64_t k = 0; k < step.start && absl::ConsumePrefix(&s, step.from); ++k) {
          }
          for (int64_t k = 0; k < step.stop && absl::ConsumeSuffix(&s, step.from); ++k) {
          }
          next.push_back({std::string(s), p.added});
        }
        break;
    }
    pieces = std::move(next);
  }
  std::string text;
  for (const Piece& p : pieces) text += p.text;
  return text;
}

}  // namespace ferry
