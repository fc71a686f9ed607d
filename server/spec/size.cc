#include "server/spec/size.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace {

struct Unit {
  const char* suffix;
  double bytes;
};

// Longest suffixes first, so "KiB" is not read as "B".
constexpr Unit kUnits[] = {
    {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    {"kb", 1e3},     {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
    // Kubernetes' spelling of the binary units.
    {"ki", 1024.0},  {"mi", 1048576.0},  {"gi", 1073741824.0},  {"ti", 1099511627776.0},
    {"b", 1.0},
};

absl::Status BadSize(absl::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat(
      "'", text, "' is not a size; write bytes or a number with a unit, e.g. 512MiB, 4GiB, 1.5GB"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  const std::string lower = absl::AsciiStrToLower(s);
  double scale = 1.0;
  absl::string_view number = s;
  for (const Unit& unit : kUnits) {
    const size_t n = std::char_traits<char>::length(unit.suffix);
    if (lower.size() > n && lower.compare(lower.size() - n, n, unit.suffix) == 0) {
      scale = unit.bytes;
      number = absl::StripAsciiWhitespace(s.substr(0, s.size() - n));
      break;
    }
  }
  if (number.empty()) return BadSize(text);
  uint64_t whole = 0;
  if (scale == 1.0 && absl::SimpleAtoi(number, &whole)) {
    if (whole > (uint64_t{1} << 63)) return BadSize(text);
    return whole;
  }
  double value = 0;
  for (char c : number) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '.') return BadSize(text);
  }
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value < 0) return BadSize(text);
  const double bytes = std::round(value * scale);
  if (bytes > 9.2e18) return BadSize(text);
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  if (std::fabs(value - std::round(value)) < 0.05) {
    return absl::StrFormat("%.0f %s", value, kNames[unit]);
  }
  return absl::StrFormat("%.1f %s", value, kNames[unit]);
}

}  // namespace ferry
