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

PlanInput PlanInputFromReport(const PlacementReport& report, uint64_t limit_bytes) {
  PlanInput in;
  in.limit_bytes = limit_bytes;
  in.forward_periods = in.backward_periods = static_cast<int>(report.trace.size() - 1) / 2;
  for (const PeriodReport& p : report.trace) {
    in.non_model_bytes.push_back(p.non_model_bytes);
    in.period_chunks.push_back(p.chunks);
  }
  for (const PayloadReport& p : report.payloads) {
    if (p.kind == PayloadKind::kParam) in.param_bytes.push_back(p.bytes);
  }
  return in;
}

}  // namespace ferry
