// SVG line plots.
#include "bench/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace sluice {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string TickLabel(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e9) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.3g}", v);
}

}  // namespace

std::string EscapeXml(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  double raw = (hi - lo) / std::max(1, target);
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  // The last tick is the first at or above `hi`, so the ticks cover the data.
  for (double v = std::ceil(lo / step - 1e-9) * step;; v += step) {
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    if (v >= hi - step * 1e-9 || ticks.size() > 1000) break;
  }
  return ticks;
}

std::string RenderLinePlotSvg(const PlotSpec& spec) {
  const double left = 80, right = 180, top = 40, bottom = 60;
  const double plot_w = spec.width - left - right, plot_h = spec.height - top - bottom;
  auto tx = [&](double x) { return spec.log2_x ? std::log2(std::max(x, 1e-12)) : x; };

  double x_lo = std::numeric_limits<double>::max(), x_hi = std::numeric_limits<double>::lowest();
  double y_hi = 0;
  for (const PlotSeries& s : spec.series) {
    for (auto [x, y] : s.points) {
      x_lo = std::min(x_lo, tx(x));
      x_hi = std::max(x_hi, tx(x));
      if (std::isfinite(y)) y_hi = std::max(y_hi, y);
    }
  }
  if (x_lo > x_hi) x_lo = 0, x_hi = 1;
  if (x_hi == x_lo) x_lo -= 0.5, x_hi += 0.5;
  std::vector<double> y_ticks = NiceTicks(0, y_hi > 0 ? y_hi : 1, 5);
  double y_top = std::max(y_ticks.back(), y_hi > 0 ? y_hi : 1);
  auto px = [&](double x) { return left + (tx(x) - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return top + plot_h - y / y_top * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      spec.width, spec.height, left + plot_w / 2, EscapeXml(spec.title));
  // Grid and y ticks.
  for (double v : y_ticks) {
    svg += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e5e5e5\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        left, left + plot_w, py(v), left - 6, py(v) + 4, TickLabel(v));
  }
  // X ticks: the data's own x values on a log2 axis, nice values otherwise.
  std::vector<double> x_ticks;
  if (spec.log2_x) {
    for (const PlotSeries& s : spec.series) {
      for (auto [x, y] : s.points) x_ticks.push_back(x);
    }
    std::sort(x_ticks.begin(), x_ticks.end());
    x_ticks.erase(std::unique(x_ticks.begin(), x_ticks.end()), x_ticks.end());
  } else {
    x_ticks = NiceTicks(x_lo, x_hi, 6);
  }
  for (double v : x_ticks) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#333\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        px(v), top + plot_h, top + plot_h + 5, top + plot_h + 20, TickLabel(v));
  }
  // Axes and labels.
  svg += fmt::format(
      "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#333\"/>"
      "<line x1=\"{0}\" x2=\"{3}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#333\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">{6}</text>\n"
      "<text transform=\"translate(18 {7}) rotate(-90)\" text-anchor=\"middle\">{8}</text>\n",
      left, top, top + plot_h, left + plot_w, left + plot_w / 2, spec.height - 15,
      EscapeXml(spec.x_label), top + plot_h / 2, EscapeXml(spec.y_label));
  // Series and legend.
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const PlotSeries& s = spec.series[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string points;
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(x),
                         py(y), color);
    }
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       color, points);
    double ly = top + 10 + 20 * static_cast<double>(i);
    svg += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        left + plot_w + 15, left + plot_w + 40, ly, color, left + plot_w + 46, ly + 4,
        EscapeXml(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sluice
