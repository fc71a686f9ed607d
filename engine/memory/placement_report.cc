#include "engine/memory/placement_report.h"

namespace ferry {

const char* PayloadKindName(PayloadKind kind) {
  switch (kind) {
    case PayloadKind::kParam:
      return "param";
    case PayloadKind::kGrad:
      return "grad";
    case PayloadKind::kOptimizer:
      return "optimizer";
  }
  return "unknown";
}

}  // namespace ferry
