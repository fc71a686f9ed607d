#include "server/worker/frame.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"

namespace ferry {

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message) {
  std::string bytes;
  {
    const std::string payload = message.SerializeAsString();
    uint8_t header[10];
    uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(payload.size(), header);
    bytes.assign(reinterpret_cast<const char*>(header), static_cast<size_t>(end - header));
    bytes += payload;
  }
  const char* data = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("write to fd ", fd, ": ", std::strerror(errno)));
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FrameReader::Next(std::string* payload) {
  uint64_t length = 0;
  size_t header = 0;
  for (int shift = 0;; shift += 7) {
    if (header >= buffer_.size()) return false;
    if (shift > 63) return absl::DataLossError("corrupt frame length");
    const uint8_t byte = static_cast<uint8_t>(buffer_[header++]);
    length |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80u) == 0) break;
  }
  if (length > max_frame_bytes_) {
    return absl::DataLossError(absl::StrCat("frame of ", length, " bytes exceeds the limit of ",
                                            max_frame_bytes_));
  }
  if (buffer_.size() - header < length) return false;
  payload->assign(buffer_, header, static_cast<size_t>(length));
  buffer_.erase(0, header + static_cast<size_t>(length));
  return true;
}

absl::StatusOr<bool> FrameReader::ReadFrom(int fd, std::string* payload) {
  char chunk[4096];
  for (;;) {
    absl::StatusOr<bool> ready = Next(payload);
    if (!ready.ok() || *ready) return ready;
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("read from fd ", fd, ": ", std::strerror(errno)));
    }
    if (n == 0) return false;
    Append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace ferry
