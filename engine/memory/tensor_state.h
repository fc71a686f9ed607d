#pragma once

// The life of a model tensor within a training step. A chunk may leave the
// device only when none of its tensors is in COMPUTE, and its gradients are
// reduced once all of them are READY_FOR_REDUCE.
//
//   FREE ──► HOLD                        (first placement)
//   HOLD ──► COMPUTE ──► HOLD            (forward)
//   HOLD ──► COMPUTE ──► HOLD_AFTER_BWD  (backward, more uses to come)
//   HOLD_AFTER_BWD ──► COMPUTE ──► ...   (tied weights: a later backward use)
//   COMPUTE ──► READY_FOR_REDUCE         (backward, last use)
//   READY_FOR_REDUCE ──► HOLD            (after the optimizer step)

#include <string>

namespace ferry {

enum class TensorState {
  kFree,
  kCompute,
  kHold,
  kHoldAfterBackward,
  kReadyForReduce,
};

const char* TensorStateName(TensorState state);

bool IsLegalTransition(TensorState from, TensorState to);

// Returns `to`, or throws std::logic_error naming the tensor and both states:
// an illegal transition is a bug in the memory manager, never a user error.
TensorState Transition(const std::string& tensor, TensorState from, TensorState to);

}  // namespace ferry
