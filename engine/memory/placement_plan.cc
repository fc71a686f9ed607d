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

// Backward periods between a chunk's first and last backward use that do
// not use it: while they run, a gradient sent home waits on the host.
int GradientGaps(const PlanInput& input, size_t c) {
  int gaps = 0;
  bool used_before = true;
  bool started = false;
  for (int p = input.forward_periods; p < input.forward_periods + input.backward_periods; ++p) {
    const auto& used = input.period_chunks[static_cast<size_t>(p)];
    const bool uses = std::find(used.begin(), used.end(), static_cast<int>(c)) != used.end();
    if (uses && started && !used_before) ++gaps;
    started = started || uses;
    used_before = uses;
  }
  return gaps;
}

bool Released(const std::vector<bool>& released, size_t c) { return c < released.size() && released[c]; }

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

std::vector<uint64_t> PeriodNeeds(const PlanInput& input, const std::vector<ChunkClass>& classes,
                                  const std::vector<bool>& released) {
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
      const bool waits_home = Released(released, c) && classes[c] != ChunkClass::kDeviceHomed && !uses;
      if (first[c] >= 0 && period >= grad_begin && period <= grad_end && !waits_home) bytes += g;
      need[static_cast<size_t>(period)] += bytes;
    }
    if (classes[c] == ChunkClass::kDeviceHomed) largest_temp = std::max(largest_temp, input.update_temp(c));
  }
  // Device-side updates run one chunk at a time, each with its temporaries.
  if (optimizer >= 0) need[static_cast<size_t>(optimizer)] += largest_temp;
  return need;
}

uint64_t PlannedTraffic(const PlanInput& input, const std::vector<ChunkClass>& classes,
                        const std::vector<bool>& released) {
  uint64_t traffic = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    const uint64_t p = input.param_bytes[c];
    if (Released(released, c) && classes[c] != ChunkClass::kDeviceHomed) {
      traffic += 2 * input.grad(c) * static_cast<uint64_t>(GradientGaps(input, c));
    }
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

Plan EvaluatePlan(const PlanInput& input, std::vector<ChunkClass> classes, std::vector<bool> released) {
  Plan plan;
  plan.need_bytes = PeriodNeeds(input, classes, released);
  plan.classes = std::move(classes);
  plan.binding_period = static_cast<int>(
      std::max_element(plan.need_bytes.begin(), plan.need_bytes.end()) - plan.need_bytes.begin());
  plan.feasible = plan.binding_need() <= input.limit_bytes;
  plan.traffic_bytes = PlannedTraffic(input, plan.classes, released);
  plan.grads_released = std::move(released);
  return plan;
}

std::vector<bool> GradientsWithGaps(const PlanInput& input) {
  std::vector<bool> gaps(input.param_bytes.size());
  for (size_t c = 0; c < gaps.size(); ++c) gaps[c] = GradientGaps(input, c) > 0;
  return gaps;
}

Plan PlanLeast(const PlanInput& input) {
  return EvaluatePlan(input, std::vector<ChunkClass>(input.param_bytes.size(), ChunkClass::kStreamed),
                      GradientsWithGaps(input));
}

Plan PlanAuto(const PlanInput& input) {
  const size_t chunks = input.param_bytes.size();
  std::vector<ChunkClass> classes(chunks, ChunkClass::kStreamed);
  std::vector<bool> released(chunks, false);
  Plan plan = EvaluatePlan(input, classes, released);
  std::vector<size_t> order(chunks);
  std::iota(order.begin(), order.end(), 0);
  if (!plan.feasible) {
    // Gradients that wait on the device between their uses go home for the
    // wait, the largest first, as far as needed to fit.
    std::vector<size_t> by_grad = order;
    std::stable_sort(by_grad.begin(), by_grad.end(),
                     [&](size_t a, size_t b) { return input.grad(a) > input.grad(b); });
    const std::vector<bool> gaps = GradientsWithGaps(input);
    for (size_t c : by_grad) {
      if (!gaps[c]) continue;
      released[c] = true;
      plan = EvaluatePlan(input, classes, released);
      if (plan.feasible) break;
    }
    if (!plan.feasible) return plan;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return input.param_bytes[a] > input.param_bytes[b];
  });
  for (ChunkClass upgrade : {ChunkClass::kPinnedParams, ChunkClass::kDeviceHomed}) {
    for (size_t c : order) {
      const ChunkClass before = classes[c];
      classes[c] = upgrade;
      Plan trial = EvaluatePlan(input, classes, released);
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
