// SVG line plots drawn by Sluice itself (no plotting dependency).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in the given order.
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  // Batch sizes and concurrencies read best on a log2 axis.
  std::vector<PlotSeries> series;
  int width = 720;
  int height = 440;
};

// `text` with & < > " as entities, for SVG and HTML text and attribute values.
std::string EscapeXml(std::string_view text);

// A self-contained SVG document: axes with ticks, one polyline with markers per series, a legend.
std::string RenderLinePlotSvg(const PlotSpec& spec);

// "Nice" tick values covering [lo, hi]: about `target` steps of 1, 2 or 5 x 10^k, the last at or
// above `hi`.
std::vector<double> NiceTicks(double lo, double hi, int target);

}  // namespace sluice
