#pragma once

// Byte sizes as people write them: "512MiB", "4GiB", "1.5GB", "100KB", "64B",
// or a plain number of bytes.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Binary (KiB, MiB, GiB, TiB, or Ki, Mi, Gi, Ti) and decimal (KB, MB, GB, TB)
// units, case-insensitive, an optional space before the unit, fractions allowed
// ("1.5GiB"). INVALID_ARGUMENT for anything else, negative sizes and sizes
// beyond 2^63 bytes.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);
constexpr uint64_t kMaxSizeBytes = uint64_t{1} << 63;  // the largest it reads

// The largest binary unit that keeps the number >= 1, one decimal place when
// it is not whole: "512 MiB", "1.5 GiB", "100 B".
std::string FormatSize(uint64_t bytes);

}  // namespace ferry
