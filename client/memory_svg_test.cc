#include "client/memory_svg.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

namespace ferry {
namespace {

// The text of the element with `id` (up to its closing tag).
std::string Group(const std::string& svg, const std::string& id, const std::string& tag = "g") {
  const size_t start = svg.find("id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  const size_t end = svg.find(tag == "g" ? "</g>" : "/>", start);
  return svg.substr(start, end - start);
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(MemorySvgTest, DrawsEveryPeriodTheLinesAndTheMoves) {
  ferry::v1::MemoryPlacement p;
  p.set_job_id("j-1234abcd");
  p.set_step(7);
  p.set_device("sim");
  p.set_policy("auto");
  p.set_phase("steady");
  p.set_device_capacity_bytes(64 << 20);
  p.set_device_limit_bytes(60 << 20);
  const char* names[] = {"forward h.0", "forward h.1", "backward h.1", "backward h.0", "optimizer"};
  for (int i = 0; i < 5; ++i) {
    ferry::v1::PeriodTrace* t = p.add_trace();
    t->set_name(names[i]);
    t->set_non_model_bytes(static_cast<uint64_t>(10 + i) << 20);
    t->set_warmup_non_model_bytes(static_cast<uint64_t>(12 + i) << 20);
    t->set_step_non_model_bytes(static_cast<uint64_t>(9 + i) << 20);
    t->set_step_device_model_bytes(uint64_t{30} << 20);
    if (i == 1) t->set_evictions(2);
    if (i == 2) t->set_fetches(1);
    if (i != 4) t->set_prefetches(3);
  }
  const std::string svg = MemoryPlacementSvg(p);
  ASSERT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(Group(svg, "model"), "<rect"), 5);
  EXPECT_EQ(Count(Group(svg, "non-model"), "<rect"), 5);
  EXPECT_EQ(Count(Group(svg, "warmup", "polyline"), ","), 5) << "one point per period";
  EXPECT_EQ(Count(Group(svg, "evictions"), "<path"), 1);
  EXPECT_EQ(Count(Group(svg, "fetches"), "<circle"), 1);
  EXPECT_EQ(Count(Group(svg, "prefetches"), "<path"), 4);
  EXPECT_NE(Group(svg, "capacity", "line"), "");
  EXPECT_NE(Group(svg, "limit", "line"), "");
  EXPECT_NE(svg.find("backward h.1: non-model 11 MiB"), std::string::npos);
  EXPECT_NE(svg.find("job j-1234abcd: memory in step 7"), std::string::npos);
  // The capacity line sits above the limit line (smaller y), both inside the plot.
  std::smatch cap, lim;
  const std::string c = Group(svg, "capacity", "line"), l = Group(svg, "limit", "line");
  ASSERT_TRUE(std::regex_search(c, cap, std::regex("y1=\"([0-9.]+)\"")));
  ASSERT_TRUE(std::regex_search(l, lim, std::regex("y1=\"([0-9.]+)\"")));
  EXPECT_LT(std::stod(cap[1]), std::stod(lim[1]));
}

// The width of the element with `id`.
double Width(const std::string& svg, const std::string& id) {
  std::smatch m;
  const std::string element = Group(svg, id, "rect");
  if (!std::regex_search(element, m, std::regex("width=\"([0-9.]+)\""))) return -1;
  return std::stod(m[1]);
}

TEST(MemorySvgTest, ShowsEachTierAgainstItsLimitTheDiskWhereThereIsOne) {
  ferry::v1::MemoryPlacement p;
  p.set_device_capacity_bytes(100 << 20);
  p.set_host_budget_bytes(200 << 20);
  auto total = [&](const char* tier, uint64_t bytes) {
    ferry::v1::MemoryUsage* u = p.add_totals();
    u->set_tier(tier);
    u->set_kind("optimizer");
    u->set_bytes(bytes);
  };
  total("device", 50 << 20);
  total("host", 50 << 20);
  std::string svg = MemoryPlacementSvg(p);
  EXPECT_NE(Group(svg, "tiers"), "");
  EXPECT_DOUBLE_EQ(Width(svg, "tier-device"), 2 * Width(svg, "tier-host"));
  EXPECT_EQ(Group(svg, "tier-disk", "rect"), "") << "no disk tier";
  p.set_disk_dir("/nvme/ferry-j-1/rank0");
  p.set_disk_budget_bytes(400 << 20);
  p.set_planned_disk_bytes(300 << 20);
  p.set_planned_disk_read_bytes(300 << 20);
  p.set_planned_disk_write_bytes(300 << 20);
  total("disk", 300 << 20);
  svg = MemoryPlacementSvg(p);
  EXPECT_DOUBLE_EQ(Width(svg, "tier-disk"), 3 * Width(svg, "tier-host"));
  EXPECT_NE(svg.find("disk: 300 MiB of 400 MiB (memory.disk_budget)"), std::string::npos);
  EXPECT_NE(svg.find("disk tier files in /nvme/ferry-j-1/rank0"), std::string::npos);
  EXPECT_NE(svg.find("300 MiB read from disk and 300 MiB written"), std::string::npos);
}

TEST(MemorySvgTest, EscapesNamesAndSurvivesAnEmptyPlacement) {
  ferry::v1::MemoryPlacement p;
  p.set_job_id("<j&>");
  const std::string svg = MemoryPlacementSvg(p);
  EXPECT_NE(svg.find("&lt;j&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<j&>"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace ferry
