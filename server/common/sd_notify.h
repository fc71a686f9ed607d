#pragma once

// systemd's readiness protocol without libsystemd: a datagram to the unix
// socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract
// namespace). Without $NOTIFY_SOCKET (not under systemd's Type=notify) it
// does nothing.

#include <string>

#include "absl/status/status.h"

namespace ferry {

// Sends `state`, e.g. "READY=1\nSTATUS=serving on 127.0.0.1:50051" or
// "STOPPING=1". OK when sent or when there is no socket to send to.
absl::Status SdNotify(const std::string& state);

}  // namespace ferry
