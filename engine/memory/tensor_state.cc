#include "engine/memory/tensor_state.h"

#include <stdexcept>

namespace ferry {

const char* TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kFree:
      return "free";
    case TensorState::kCompute:
      return "compute";
    case TensorState::kHold:
      return "hold";
    case TensorState::kHoldAfterBackward:
      return "hold_after_bwd";
    case TensorState::kReadyForReduce:
      return "ready_for_reduce";
  }
  return "unknown";
}

bool IsLegalTransition(TensorState from, TensorState to) {
  switch (from) {
    case TensorState::kFree:
      return to == TensorState::kHold;
    case TensorState::kHold:
      return to == TensorState::kCompute;
    case TensorState::kCompute:
      return to == TensorState::kHold || to == TensorState::kHoldAfterBackward ||
             to == TensorState::kReadyForReduce;
    case TensorState::kHoldAfterBackward:
      return to == TensorState::kCompute;
    case TensorState::kReadyForReduce:
      return to == TensorState::kHold;
  }
  return false;
}

TensorState Transition(const std::string& tensor, TensorState from, TensorState to) {
  if (!IsLegalTransition(from, to)) {
    throw std::logic_error(std::string("illegal tensor state transition for ") + tensor + ": " +
                           TensorStateName(from) + " -> " + TensorStateName(to));
  }
  return to;
}

}  // namespace ferry
