#include "engine/memory/placement_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ferry {
namespace {

// First and last backward period using each chunk (-1 when none).
void BackwardSpan(const PlanInput& input, std::vector<int>* first, std::vector<int>* last) {
  const size_t chunks = input.param_bytes.size();
  first->assign(chunks, -1);
  last->assign(chunks, -1);
  for (int p = input.forward_periods; p < input.forward_periods + input.backward_periods; ++p) {
    for (int c : input.period_chunks[static_cast<size_t>(p)]) {
      if ((*first)[static_cast<size_t>(c)] < 0) (*first)[static_cast<size_t>(c)] = p;
      (*last)[static_cast<size_t>(c)] = p;
    }
  }
}

}  // namespace

const char* ChunkClassName(ChunkClass c) {
  switch (c) {
    case ChunkClass::kStreamed:
      return "streamed";
    case ChunkClass::kPinnedParams:
      return "pinned_params";
    case ChunkClass::kDeviceHomed:
      return "device_homed";
  }
  return "unknown";
}

std::vector<uint64_t> PeriodNeeds(const PlanInput& input, const std::vector<ChunkClass>& classes) {
  const size_t periods = input.non_model_bytes.size();
  const int optimizer = static_cast<int>(periods) - 1;
  std::vector<int> first, last;
  BackwardSpan(input, &first, &last);
  std::vector<uint64_t> need(input.non_model_bytes);
  uint64_t largest_temp = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    const uint64_t p = input.param_bytes[c];
    const uint64_t g = input.grad(c);
    const uint64_t o = input.optimizer(c);
    const int grad_end = classes[c] == ChunkClass::kDeviceHomed ? optimizer : last[c];
    for (int period = 0; period < static_cast<int>(periods); ++period) {
      const auto& used = input.period_chunks[static_cast<size_t>(period)];
      const bool uses = std::find(used.begin(), used.end(), static_cast<int>(c)) != used.end();
      uint64_t bytes = 0;
      switch (classes[c]) {
        case ChunkClass::kDeviceHomed:
          bytes = p + o;  // P and O, always
          break;
        case ChunkClass::kPinnedParams:
          bytes = p;
          break;
        case ChunkClass::kStreamed:
          bytes = uses ? p : 0;
          break;
      }
      const int grad_begin = classes[c] == ChunkClass::kDeviceHomed && input.accumulates ? 0 : first[c];
      if (first[c] >= 0 && period >= grad_begin && period <= grad_end) bytes += g;
      need[static_cast<size_t>(period)] += bytes;
    }
    if (classes[c] == ChunkClass::kDeviceHomed) largest_temp = std::max(largest_temp, input.update_temp(c));
  }
  // Device-side updates run one chunk at a time, each with its temporaries.
  if (optimizer >= 0) need[static_cast<size_t>(optimizer)] += largest_temp;
  return need;
}

uint64_t PlannedTraffic(const PlanInput& input, const std::vector<ChunkClass>& classes) {
  uint64_t traffic = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    const uint64_t p = input.param_bytes[c];
    switch (classes[c]) {
      case ChunkClass::kStreamed:
        traffic += 2 * p + input.grad(c);
        break;
      case ChunkClass::kPinnedParams:
        traffic += p + input.grad(c);
        break;
      case ChunkClass::kDeviceHomed:
        break;
    }
  }
  return traffic;
}

Plan EvaluatePlan(const PlanInput& input, std::vector<ChunkClass> classes) {
  Plan plan;
  plan.need_bytes = PeriodNeeds(input, classes);
  plan.classes = std::move(classes);
  plan.binding_period = static_cast<int>(
      std::max_element(plan.need_bytes.begin(), plan.need_bytes.end()) - plan.need_bytes.begin());
  plan.feasible = plan.need_bytes.empty() ||
                  plan.need_bytes[static_cast<size_t>(plan.binding_period)] <= input.limit_bytes;
  plan.traffic_bytes = PlannedTraffic(input, plan.classes);
  return plan;
}

Plan PlanAuto(const PlanInput& input) {
  const size_t chunks = input.param_bytes.size();
  std::vector<ChunkClass> classes(chunks, ChunkClass::kStreamed);
  Plan plan = EvaluatePlan(input, classes);
  if (!plan.feasible) return plan;
  std::vector<size_t> order(chunks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return input.param_bytes[a] > input.param_bytes[b];
  });
  for (ChunkClass upgrade : {ChunkClass::kPinnedParams, ChunkClass::kDeviceHomed}) {
    for (size_t c : order) {
      const ChunkClass before = classes[c];
      classes[c] = upgrade;
      Plan trial = EvaluatePlan(input, classes);
      if (trial.feasible) {
        plan = std::move(trial);
      } else {
        classes[c] = before;
      }
    }
  }
  return plan;
}

Plan PlanStatic(const PlanInput& input, double param_host_fraction, double optimizer_host_fraction) {
  const size_t chunks = input.param_bytes.size();
  const auto count = [&](double fraction) {
    return static_cast<size_t>(std::ceil(std::clamp(fraction, 0.0, 1.0) * double(chunks) - 1e-9));
  };
  const size_t homed = chunks - count(optimizer_host_fraction);
  const size_t pinned = chunks - count(param_host_fraction);
  std::vector<ChunkClass> classes(chunks, ChunkClass::kStreamed);
  for (size_t c = 0; c < chunks; ++c) {
    if (c < homed) {
      classes[c] = ChunkClass::kDeviceHomed;
    } else if (c < pinned) {
      classes[c] = ChunkClass::kPinnedParams;
    }
  }
  return EvaluatePlan(input, std::move(classes));
}

}  // namespace ferry
