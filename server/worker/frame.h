#pragma once

// Length-prefixed protobuf frames (a varint length, then the message) over
// pipes, for the daemon <-> worker channel.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

namespace ferry {

// Writes one frame to `fd`, retrying short writes and EINTR.
absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message);

// Splits a byte stream into frames.
class FrameReader {
 public:
  explicit FrameReader(size_t max_frame_bytes = 64 << 20) : max_frame_bytes_(max_frame_bytes) {}

  void Append(const char* data, size_t size) { buffer_.append(data, size); }

  // True and the payload when a whole frame is buffered; false when more
  // bytes are needed; DATA_LOSS for a frame longer than the limit.
  absl::StatusOr<bool> Next(std::string* payload);

  // Reads from `fd` until a frame is complete (true) or end of file (false).
  absl::StatusOr<bool> ReadFrom(int fd, std::string* payload);

 private:
  size_t max_frame_bytes_;
  std::string buffer_;
};

}  // namespace ferry
