#include "server/worker/frame.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "ferry/internal/worker.pb.h"

namespace ferry {
namespace {

TEST(FrameTest, FramesSurviveAPipeInAnyChunking) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ferry::internal::WorkerReport a, b;
  a.mutable_log()->set_message("hello");
  b.mutable_progress()->set_step(7);
  b.mutable_progress()->set_loss(1.5);
  ASSERT_TRUE(WriteFrame(fds[1], a).ok());
  ASSERT_TRUE(WriteFrame(fds[1], b).ok());
  close(fds[1]);

  FrameReader reader;
  std::string payload;
  ferry::internal::WorkerReport got;
  ASSERT_TRUE(*reader.ReadFrom(fds[0], &payload));
  ASSERT_TRUE(got.ParseFromString(payload));
  EXPECT_EQ(got.log().message(), "hello");
  ASSERT_TRUE(*reader.ReadFrom(fds[0], &payload));
  ASSERT_TRUE(got.ParseFromString(payload));
  EXPECT_EQ(got.progress().step(), 7u);
  EXPECT_FALSE(*reader.ReadFrom(fds[0], &payload)) << "end of file";
  close(fds[0]);
}

TEST(FrameTest, ByteAtATimeAndOversizedFrames) {
  ferry::internal::WorkerReport report;
  report.mutable_log()->set_message(std::string(300, 'x'));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_TRUE(WriteFrame(fds[1], report).ok());
  close(fds[1]);
  std::string bytes(1024, '\0');
  bytes.resize(static_cast<size_t>(read(fds[0], &bytes[0], bytes.size())));
  close(fds[0]);

  FrameReader reader;
  std::string payload;
  for (size_t i = 0; i + 1 < bytes.size(); ++i) {
    reader.Append(&bytes[i], 1);
    ASSERT_FALSE(*reader.Next(&payload)) << "incomplete at byte " << i;
  }
  reader.Append(&bytes.back(), 1);
  ASSERT_TRUE(*reader.Next(&payload));
  EXPECT_EQ(payload.size(), report.ByteSizeLong());

  FrameReader strict(100);
  strict.Append(bytes.data(), bytes.size());
  EXPECT_EQ(strict.Next(&payload).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ferry
