#pragma once

// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr
// (Debian's Abseil does not ship them).

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function unless it is OK.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status ferry_status_ = (expr);                 \
    if (!ferry_status_.ok()) return ferry_status_;         \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares (or assigns) `x` from the
// value of a StatusOr, or returns its error from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, expr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
