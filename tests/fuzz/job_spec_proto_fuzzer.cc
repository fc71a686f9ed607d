// Fuzzes what the daemon does with a submitted JobSpec message (protobuf
// wire bytes, as a Submit call carries it): defaults, validation, and the
// JSON the worker reads it back from (spec_checks.h).

#include <cstddef>
#include <cstdint>

#include "ferry/v1/spec.pb.h"
#include "tests/fuzz/spec_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  ferry::fuzz::CheckSpec(spec);
  return 0;
}
