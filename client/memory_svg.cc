#include "client/memory_svg.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "server/spec/size.h"

namespace ferry {
namespace {

constexpr double kLeft = 90, kTop = 70, kPlotHeight = 300, kBarWidth = 26, kRight = 170;
constexpr double kMarkRows = 3, kMarkRowHeight = 16, kLabelSpace = 130;
constexpr double kTierRowHeight = 20, kTierBarWidth = 300, kTierTitle = 24;
constexpr const char* kModelColour = "#4a78b5";
constexpr const char* kNonModelColour = "#e39b3b";
constexpr const char* kWarmupColour = "#555555";
constexpr const char* kCapacityColour = "#c0392b";
constexpr const char* kLimitColour = "#7d3c98";
constexpr const char* kEvictColour = "#c0392b";
constexpr const char* kFetchColour = "#d35400";
constexpr const char* kPrefetchColour = "#1e8449";
constexpr const char* kHostColour = "#8fb3dc";
constexpr const char* kDiskColour = "#8e6c3a";

std::string Escape(const std::string& text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

}  // namespace

std::string MemoryPlacementSvg(const ferry::v1::MemoryPlacement& placement) {
  const int periods = placement.trace_size();
  const double plot_width = std::max(1, periods) * kBarWidth;
  const double width = std::max(kLeft + plot_width + kRight, kLeft + kTierBarWidth + 260);
  const double axis_y = kTop + kPlotHeight;
  const double marks_y = axis_y + 8;
  // Model data per tier: the device, the host, and the disk tier where the
  // job has one.
  uint64_t tier_bytes[3] = {0, 0, 0};
  for (const ferry::v1::MemoryUsage& u : placement.totals()) {
    if (u.tier() == "device") tier_bytes[0] += u.bytes();
    if (u.tier() == "host") tier_bytes[1] += u.bytes();
    if (u.tier() == "disk") tier_bytes[2] += u.bytes();
  }
  const bool disk = !placement.disk_dir().empty() || tier_bytes[2] > 0;
  const int tiers = disk ? 3 : 2;
  const double tiers_y = marks_y + kMarkRows * kMarkRowHeight + kLabelSpace;
  const double height = tiers_y + kTierTitle + tiers * kTierRowHeight + 24;

  uint64_t top = std::max(placement.device_capacity_bytes(), placement.device_limit_bytes());
  for (const ferry::v1::PeriodTrace& t : placement.trace()) {
    top = std::max({top, t.step_device_model_bytes() + t.step_non_model_bytes(), t.warmup_non_model_bytes(),
                    t.non_model_bytes()});
  }
  top = std::max<uint64_t>(top, 1);
  const double scale = kPlotHeight / (static_cast<double>(top) * 1.05);
  auto y = [&](uint64_t bytes) { return axis_y - static_cast<double>(bytes) * scale; };
  auto x = [&](int period) { return kLeft + period * kBarWidth; };

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  const std::string rank = placement.world_size() > 1
                               ? absl::StrCat(" rank ", placement.rank(), " of ", placement.world_size())
                               : "";
  absl::StrAppendFormat(&svg, "<text id=\"title\" x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
                        kLeft, Escape(absl::StrCat("job ", placement.job_id(), rank, ": memory in step ",
                                                   placement.step())));
  absl::StrAppendFormat(
      &svg, "<text x=\"%.0f\" y=\"40\">%s</text>\n", kLeft,
      Escape(absl::StrCat(placement.device(), ", ", placement.policy(), " policy, ", placement.phase(),
                          "; capacity ", FormatSize(placement.device_capacity_bytes()), ", the plan fills ",
                          FormatSize(placement.device_limit_bytes()), "; ",
                          FormatSize(placement.planned_traffic_bytes()), " planned moves per step")));
  if (placement.planned_disk_bytes() > 0) {
    absl::StrAppendFormat(
        &svg, "<text x=\"%.0f\" y=\"55\">%s</text>\n", kLeft,
        Escape(absl::StrCat("disk tier: ", FormatSize(placement.planned_disk_bytes()),
                            " of gradients and optimizer states; ",
                            FormatSize(placement.planned_disk_read_bytes()), " read from disk and ",
                            FormatSize(placement.planned_disk_write_bytes()), " written per step")));
  }

  // Axes and a few ticks.
  absl::StrAppendFormat(&svg,
                        "<g id=\"axes\" stroke=\"#333\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n",
                        kLeft, kTop, kLeft, axis_y, kLeft, axis_y, kLeft + plot_width, axis_y);
  svg += "<g id=\"ticks\" text-anchor=\"end\">";
  for (int i = 0; i <= 4; ++i) {
    const uint64_t bytes = static_cast<uint64_t>(static_cast<double>(top) * i / 4);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>",
                          kLeft, y(bytes), kLeft + plot_width, y(bytes), kLeft - 6, y(bytes) + 4,
                          Escape(FormatSize(bytes)));
  }
  svg += "</g>\n";

  // The last step: model data on the device, non-model memory above it.
  std::string model = absl::StrFormat("<g id=\"model\" fill=\"%s\">", kModelColour);
  std::string non_model = absl::StrFormat("<g id=\"non-model\" fill=\"%s\">", kNonModelColour);
  std::string warmup = absl::StrFormat(
      "<polyline id=\"warmup\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"4 3\" points=\"",
      kWarmupColour);
  std::string evictions = absl::StrFormat("<g id=\"evictions\" fill=\"%s\">", kEvictColour);
  std::string fetches = absl::StrFormat("<g id=\"fetches\" fill=\"%s\">", kFetchColour);
  std::string prefetches = absl::StrFormat("<g id=\"prefetches\" fill=\"%s\">", kPrefetchColour);
  std::string labels = "<g id=\"periods\" font-size=\"10\">";
  for (int i = 0; i < periods; ++i) {
    const ferry::v1::PeriodTrace& t = placement.trace(i);
    const double x0 = x(i) + 3, w = kBarWidth - 6, cx = x(i) + kBarWidth / 2;
    const uint64_t m = t.step_device_model_bytes(), n = t.step_non_model_bytes();
    absl::StrAppendFormat(&model, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%s</title></rect>",
                          x0, y(m), w, axis_y - y(m),
                          Escape(absl::StrCat(t.name(), ": model data on the device ", FormatSize(m))));
    absl::StrAppendFormat(&non_model,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%s</title></rect>", x0,
                          y(m + n), w, y(m) - y(m + n),
                          Escape(absl::StrCat(t.name(), ": non-model ", FormatSize(n), " (planned ",
                                              FormatSize(t.non_model_bytes()), ")")));
    absl::StrAppendFormat(&warmup, "%s%.1f,%.1f", i == 0 ? "" : " ", cx, y(t.warmup_non_model_bytes()));
    auto mark = [&](std::string* group, uint32_t count, int row, const char* shape) {
      if (count == 0) return;
      const double my = marks_y + row * kMarkRowHeight + 8;
      if (std::string(shape) == "down") {
        absl::StrAppendFormat(group, "<path d=\"M%.1f %.1f l-5 -8 h10 z\"/>", cx - 4, my + 4);
      } else if (std::string(shape) == "up") {
        absl::StrAppendFormat(group, "<path d=\"M%.1f %.1f l-5 8 h10 z\"/>", cx - 4, my - 4);
      } else {
        absl::StrAppendFormat(group, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\"/>", cx - 4, my);
      }
      absl::StrAppendFormat(group, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\">%d</text>", cx + 2, my + 3, count);
    };
    mark(&evictions, t.evictions(), 0, "down");
    mark(&fetches, t.fetches(), 1, "dot");
    mark(&prefetches, t.prefetches(), 2, "up");
    const double ly = marks_y + kMarkRows * kMarkRowHeight + 6;
    absl::StrAppendFormat(&labels, "<text transform=\"translate(%.1f %.1f) rotate(60)\">%s</text>", cx - 3, ly,
                          Escape(t.name()));
  }
  svg += model + "</g>\n" + non_model + "</g>\n" + warmup + "\"/>\n";
  svg += evictions + "</g>\n" + fetches + "</g>\n" + prefetches + "</g>\n" + labels + "</g>\n";
  absl::StrAppendFormat(&svg, "<g font-size=\"9\" text-anchor=\"end\"><text x=\"%.1f\" y=\"%.1f\">evict</text>"
                              "<text x=\"%.1f\" y=\"%.1f\">fetch</text><text x=\"%.1f\" y=\"%.1f\">prefetch</text></g>\n",
                        kLeft - 6, marks_y + 11, kLeft - 6, marks_y + kMarkRowHeight + 11, kLeft - 6,
                        marks_y + 2 * kMarkRowHeight + 11);

  // Capacity and the limit the policy fills.
  const double line_end = kLeft + plot_width;
  absl::StrAppendFormat(&svg,
                        "<line id=\"capacity\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                        "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">capacity %s</text>\n",
                        kLeft, y(placement.device_capacity_bytes()), line_end, y(placement.device_capacity_bytes()),
                        kCapacityColour, line_end + 6, y(placement.device_capacity_bytes()) + 4, kCapacityColour,
                        Escape(FormatSize(placement.device_capacity_bytes())));
  absl::StrAppendFormat(&svg,
                        "<line id=\"limit\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                        "stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">"
                        "plan fills %s</text>\n",
                        kLeft, y(placement.device_limit_bytes()), line_end, y(placement.device_limit_bytes()),
                        kLimitColour, line_end + 6, y(placement.device_limit_bytes()) + 14, kLimitColour,
                        Escape(FormatSize(placement.device_limit_bytes())));

  // Legend.
  const double lx = line_end + 10;
  double ly = kTop + 60;
  auto legend = [&](const char* colour, const std::string& text, bool line) {
    if (line) {
      absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                                  "stroke-width=\"2\" stroke-dasharray=\"4 3\"/>",
                            lx, ly - 4, lx + 12, ly - 4, colour);
    } else {
      absl::StrAppendFormat(&svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"10\" fill=\"%s\"/>", lx,
                            ly - 9, colour);
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 16, ly, Escape(text));
    ly += 16;
  };
  svg += "<g id=\"legend\">";
  legend(kModelColour, "model data on device", false);
  legend(kNonModelColour, "non-model (measured)", false);
  legend(kWarmupColour, "warm-up non-model", true);
  legend(kEvictColour, "evictions", false);
  legend(kFetchColour, "on-demand fetches", false);
  legend(kPrefetchColour, "prefetches", false);
  svg += "</g>\n";

  // Model data per tier against what the tier may hold.
  absl::StrAppendFormat(&svg, "<g id=\"tiers\"><text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>", kLeft,
                        tiers_y + 14, "model data by tier");
  struct Row {
    const char* name;
    uint64_t bytes, limit;
    std::string of;
    const char* colour;
  };
  std::vector<Row> rows = {
      {"device", tier_bytes[0], placement.device_capacity_bytes(), "capacity", kModelColour},
      {"host", tier_bytes[1], placement.host_budget_bytes(), "memory.host_budget", kHostColour},
  };
  if (disk) rows.push_back({"disk", tier_bytes[2], placement.disk_budget_bytes(), "memory.disk_budget", kDiskColour});
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double ry = tiers_y + kTierTitle + static_cast<double>(i) * kTierRowHeight;
    const double filled =
        r.limit > 0 ? std::min(1.0, static_cast<double>(r.bytes) / static_cast<double>(r.limit)) * kTierBarWidth : 0;
    const std::string text =
        r.limit > 0 ? absl::StrCat(FormatSize(r.bytes), " of ", FormatSize(r.limit), " (", r.of, ")")
                    : absl::StrCat(FormatSize(r.bytes), " (no limit)");
    absl::StrAppendFormat(
        &svg,
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>"
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"12\" fill=\"none\" stroke=\"#999\"/>"
        "<rect id=\"tier-%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"12\" fill=\"%s\"><title>%s</title></rect>"
        "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
        kLeft - 6, ry + 10, r.name, kLeft, ry, kTierBarWidth, r.name, kLeft, ry, filled, r.colour,
        Escape(absl::StrCat(r.name, ": ", text)), kLeft + kTierBarWidth + 8, ry + 10, Escape(text));
  }
  if (disk && !placement.disk_dir().empty()) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\">%s</text>", kLeft,
                          tiers_y + kTierTitle + static_cast<double>(rows.size()) * kTierRowHeight + 4,
                          Escape(absl::StrCat("disk tier files in ", placement.disk_dir())));
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace ferry
