#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ferry {

// The one mapping from absl::Status to a gRPC status: same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace ferry
