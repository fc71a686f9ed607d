#include "server/common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status SdNotify(const std::string& state) {
  const char* socket_name = std::getenv("NOTIFY_SOCKET");
  if (socket_name == nullptr || socket_name[0] == '\0') return absl::OkStatus();
  const std::string name = socket_name;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if ((name[0] != '/' && name[0] != '@') || name.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET=", name, ": not a socket path"));
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  if (name[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("sd_notify: socket: ", std::strerror(errno)));
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
  const int error = errno;
  close(fd);
  if (sent < 0) return absl::UnavailableError(absl::StrCat("sd_notify to ", name, ": ", std::strerror(error)));
  return absl::OkStatus();
}

}  // namespace ferry
