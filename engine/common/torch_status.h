#pragma once

// The edge where engine code meets LibTorch's exceptions: run a callable,
// turn a c10::Error (or any std::exception) into an absl::Status with context.

#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Thrown by engine code that runs where no Status can be returned (inside
// autograd hooks) when a job needs more memory than its budgets allow; the
// message says what to change. Maps to RESOURCE_EXHAUSTED.
class ResourceExhaustedException : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown where no Status can be returned to carry one that can (a disk
// tier's I/O error, a damaged chunk file); maps back to it.
class StatusException : public std::runtime_error {
 public:
  explicit StatusException(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Maps the exception currently being handled to a Status whose message starts
// with `context`. Out-of-memory errors and ResourceExhaustedException map to
// RESOURCE_EXHAUSTED, a StatusException to its status, everything else to
// INTERNAL. Call only from inside a
// catch block.
absl::Status StatusFromCurrentException(absl::string_view context);

// Runs `fn`, which returns void, a Status or a StatusOr<T>, converting thrown
// exceptions with StatusFromCurrentException.
template <typename Fn>
auto CallTorch(absl::string_view context, Fn&& fn) -> decltype(auto) {
  using Result = std::invoke_result_t<Fn>;
  try {
    if constexpr (std::is_void_v<Result>) {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } else {
      return std::forward<Fn>(fn)();
    }
  } catch (...) {
    if constexpr (std::is_void_v<Result>) {
      return StatusFromCurrentException(context);
    } else {
      return Result(StatusFromCurrentException(context));
    }
  }
}

}  // namespace ferry
