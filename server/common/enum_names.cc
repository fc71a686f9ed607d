#include "server/common/enum_names.h"

#include "server/spec/yaml_to_proto.h"

namespace ferry {

std::string StateName(ferry::v1::JobState state) {
  const auto* value = ferry::v1::JobState_descriptor()->FindValueByNumber(state);
  return value != nullptr ? ShortEnumName(value) : "unknown";
}

}  // namespace ferry
