#include "server/jobs/event_buffer.h"

#include <gtest/gtest.h>

#include <thread>

namespace ferry {
namespace {

ferry::v1::JobEvent Log(const std::string& text) {
  ferry::v1::JobEvent e;
  e.mutable_log()->set_message(text);
  return e;
}

TEST(EventBufferTest, NumbersEventsFromOneAndReadsAfterASeq) {
  EventBuffer buffer(10);
  EXPECT_EQ(buffer.last_seq(), 0u);
  EXPECT_EQ(buffer.Append(Log("a")), 1u);
  EXPECT_EQ(buffer.Append(Log("b")), 2u);
  EXPECT_EQ(buffer.Append(Log("c")), 3u);
  std::vector<ferry::v1::JobEvent> out;
  ASSERT_TRUE(buffer.ReadAfter(1, 100, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].seq(), 2u);
  EXPECT_EQ(out[0].log().message(), "b");
  EXPECT_TRUE(out[0].has_time());
  out.clear();
  ASSERT_TRUE(buffer.ReadAfter(3, 100, &out).ok());
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(buffer.ReadAfter(0, 2, &out).ok());
  EXPECT_EQ(out.size(), 2u) << "max_events bounds the read";
}

TEST(EventBufferTest, OverflowDropsTheOldestAndReadersLearnOfIt) {
  EventBuffer buffer(3);
  for (int i = 0; i < 5; ++i) buffer.Append(Log(std::to_string(i)));
  EXPECT_EQ(buffer.first_seq(), 3u);
  EXPECT_EQ(buffer.last_seq(), 5u);
  std::vector<ferry::v1::JobEvent> out;
  // A reader that has seen seq 2 misses nothing: 3, 4, 5 are all held.
  ASSERT_TRUE(buffer.ReadAfter(2, 10, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out.front().seq(), 3u);
  // One that has seen only seq 1 would miss seq 2.
  out.clear();
  absl::Status s = buffer.ReadAfter(1, 10, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("after_seq=0"), std::string::npos);
  EXPECT_TRUE(out.empty());
}

TEST(EventBufferTest, EndedOnlyOnceTheReadReachesTheLastEventOfAClosedBuffer) {
  EventBuffer buffer(10);
  buffer.Append(Log("a"));
  buffer.Append(Log("b"));
  std::vector<ferry::v1::JobEvent> out;
  bool ended = true;
  ASSERT_TRUE(buffer.ReadAfter(0, 10, &out, &ended).ok());
  EXPECT_FALSE(ended) << "open";
  buffer.Append(Log("end"));
  buffer.Close();
  out.clear();
  ASSERT_TRUE(buffer.ReadAfter(2, 0, &out, &ended).ok());
  EXPECT_FALSE(ended) << "closed, but the last event is not read yet";
  ASSERT_TRUE(buffer.ReadAfter(2, 10, &out, &ended).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(ended);
}

// A reader that stops on `ended` never misses the events appended just
// before Close(), however the two threads interleave.
TEST(EventBufferTest, AReaderStoppingOnEndedSeesEveryEventBeforeClose) {
  for (int trial = 0; trial < 200; ++trial) {
    EventBuffer buffer(100);
    std::thread writer([&] {
      for (int i = 0; i < 20; ++i) buffer.Append(Log(std::to_string(i)));
      buffer.Close();
    });
    uint64_t cursor = 0;
    size_t seen = 0;
    for (bool ended = false; !ended;) {
      std::vector<ferry::v1::JobEvent> out;
      ASSERT_TRUE(buffer.ReadAfter(cursor, 3, &out, &ended).ok());
      for (const auto& e : out) cursor = e.seq();
      seen += out.size();
    }
    writer.join();
    ASSERT_EQ(seen, 20u) << "trial " << trial;
  }
}

TEST(EventBufferTest, ShrinkKeepsTheNewest) {
  EventBuffer buffer(10);
  for (int i = 0; i < 8; ++i) buffer.Append(Log(std::to_string(i)));
  buffer.Shrink(3);
  EXPECT_EQ(buffer.first_seq(), 6u);
  EXPECT_EQ(buffer.last_seq(), 8u);
  buffer.Append(Log("next"));
  EXPECT_EQ(buffer.first_seq(), 7u) << "the smaller capacity holds for new events";
}

TEST(EventBufferTest, WaitWakesOnAppendAndOnClose) {
  EventBuffer buffer(10);
  EXPECT_FALSE(buffer.WaitForEventsAfter(0, absl::Milliseconds(10)));
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    buffer.Append(Log("x"));
  });
  EXPECT_TRUE(buffer.WaitForEventsAfter(0, absl::Seconds(10)));
  writer.join();

  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    buffer.Close();
  });
  const absl::Time start = absl::Now();
  EXPECT_FALSE(buffer.WaitForEventsAfter(1, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  closer.join();
  EXPECT_TRUE(buffer.closed());
  EXPECT_EQ(buffer.Append(Log("late")), 0u) << "a closed buffer takes no events";
}

TEST(EventBufferTest, AWriterNeverWaitsForASlowReader) {
  EventBuffer buffer(100);
  // Nobody reads; a hundred thousand appends still finish promptly and memory stays bounded.
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100000; ++i) buffer.Append(Log("p"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(buffer.last_seq() - buffer.first_seq() + 1, 100u);
}

}  // namespace
}  // namespace ferry
