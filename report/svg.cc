#include "report/svg.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace msaflow::report::svg {

std::string Escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

double Scale::operator()(double v) const {
  if (d1 == d0) return (r0 + r1) / 2;
  return r0 + (v - d0) / (d1 - d0) * (r1 - r0);
}

namespace {

double NiceStep(double lo, double hi, int count) {
  const double span = hi - lo;
  if (!(span > 0) || count < 1) return 1;
  const double raw = span / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

}  // namespace

std::vector<double> Ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {lo};
  const double step = NiceStep(lo, hi, count);
  std::vector<double> t;
  const double first = std::ceil(lo / step - 1e-9);
  for (double i = first; i * step <= hi + step * 1e-9; i += 1) {
    // i x step, snapped to 12 decimals: 3 x 0.2 is 0.6, not 0.6000000000000001
    const double v = std::round(i * step * 1e12) / 1e12;
    t.push_back(v == 0 ? 0.0 : v);
  }
  return t;
}

std::string TickLabel(double v, double step) {
  if (step >= 1 && std::abs(v) < 1e6) return fmt::format("{:.0f}", v);
  if (step < 1e-4) return fmt::format("{:.1e}", v);
  const int digits = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
  return fmt::format("{:.{}f}", v, digits);
}

const char* Colour(size_t i) {
  static const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % (sizeof kPalette / sizeof *kPalette)];
}

std::string Points(const std::vector<double>& xs, const std::vector<double>& ys, const Scale& sx, const Scale& sy) {
  std::string out;
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i)
    out += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", sx(xs[i]), sy(ys[i]));
  return out;
}

std::string Axes(const Scale& sx, const std::vector<double>& xticks, const std::string& xlabel, const Scale& sy,
                 const std::vector<double>& yticks, const std::string& ylabel) {
  const double left = sx.r0, right = sx.r1, bottom = sy.r0, top = sy.r1;
  std::string s = fmt::format(R"(<g class="axes"><line x1="{0:.1f}" y1="{2:.1f}" x2="{1:.1f}" y2="{2:.1f}"/>)"
                              R"(<line x1="{0:.1f}" y1="{3:.1f}" x2="{0:.1f}" y2="{2:.1f}"/>)",
                              left, right, bottom, top);
  const double xstep = xticks.size() > 1 ? xticks[1] - xticks[0] : 1;
  const double ystep = yticks.size() > 1 ? yticks[1] - yticks[0] : 1;
  for (double v : xticks)
    s += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}"/><text x="{0:.1f}" y="{3:.1f}" )"
                     R"(text-anchor="middle">{4}</text>)",
                     sx(v), bottom, bottom + 4, bottom + 16, Escape(TickLabel(v, xstep)));
  for (double v : yticks)
    s += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}"/>)"
                     R"(<text x="{3:.1f}" y="{4:.1f}" text-anchor="end">{5}</text>)",
                     left, sy(v), right, left - 6, sy(v) + 4, Escape(TickLabel(v, ystep)));
  s += fmt::format(R"(<text class="label" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", (left + right) / 2,
                   bottom + 34, Escape(xlabel));
  s += fmt::format(R"(<text class="label" x="{0:.1f}" y="{1:.1f}" text-anchor="middle" )"
                   R"~(transform="rotate(-90 {0:.1f} {1:.1f})">{2}</text>)~",
                   left - 44, (top + bottom) / 2, Escape(ylabel));
  return s + "</g>";
}

}  // namespace msaflow::report::svg
