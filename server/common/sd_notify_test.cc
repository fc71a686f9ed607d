#include "server/common/sd_notify.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace ferry {
namespace {

// A datagram socket standing in for systemd's; returns its fd.
int Listen(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  EXPECT_LT(name.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, name.data(), name.size());
  if (name[0] == '@') addr.sun_path[0] = '\0';
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
            0);
  return fd;
}

std::string Receive(int fd) {
  char buffer[256];
  const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

TEST(SdNotifyTest, NothingToDoOutsideSystemd) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotify("READY=1").ok());
}

TEST(SdNotifyTest, SendsToAPathSocket) {
  // Short: socket paths are limited to 107 bytes (a test's TMPDIR can be longer).
  const std::string path = "/tmp/ferry-notify-" + std::to_string(getpid());
  unlink(path.c_str());
  const int fd = Listen(path);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  ASSERT_TRUE(SdNotify("READY=1\nSTATUS=serving").ok());
  EXPECT_EQ(Receive(fd), "READY=1\nSTATUS=serving");
  close(fd);
  unlink(path.c_str());
}

TEST(SdNotifyTest, SendsToAnAbstractSocket) {
  const std::string name = "@ferry-notify-test-" + std::to_string(getpid());
  const int fd = Listen(name);
  setenv("NOTIFY_SOCKET", name.c_str(), 1);
  ASSERT_TRUE(SdNotify("STOPPING=1").ok());
  EXPECT_EQ(Receive(fd), "STOPPING=1");
  close(fd);
}

TEST(SdNotifyTest, ReportsABadOrMissingSocket) {
  setenv("NOTIFY_SOCKET", "relative", 1);
  EXPECT_FALSE(SdNotify("READY=1").ok());
  setenv("NOTIFY_SOCKET", "/nonexistent/ferry.sock", 1);
  EXPECT_FALSE(SdNotify("READY=1").ok());
  setenv("NOTIFY_SOCKET", ("/" + std::string(200, 'x')).c_str(), 1);
  EXPECT_FALSE(SdNotify("READY=1").ok()) << "too long for a socket address";
  unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace ferry
