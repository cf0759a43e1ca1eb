// Small building blocks for the report's inline SVG plots: escaping, linear scales, nice axis
// ticks and a palette. No I/O; the report (report/report.h) composes them.
#pragma once

#include <string>
#include <vector>

namespace msaflow::report::svg {

// Text made safe for HTML/SVG content and attribute values (& < > " ').
std::string Escape(const std::string& s);

// A linear map from [d0, d1] to [r0, r1] (a degenerate domain maps to the middle).
struct Scale {
  double d0, d1, r0, r1;
  double operator()(double v) const;
};

// About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).
std::vector<double> Ticks(double lo, double hi, int count);

// A tick label with no more digits than the step needs ("0.85", "2", "1e-05").
std::string TickLabel(double v, double step);

// The i-th colour of a palette that stays apart for the first ten (Tableau 10).
const char* Colour(size_t i);

// "x,y x,y ..." for a polyline.
std::string Points(const std::vector<double>& xs, const std::vector<double>& ys, const Scale& sx, const Scale& sy);

// Axes with ticks and labels for a plot area [left, right] x [top, bottom] in pixels.
std::string Axes(const Scale& sx, const std::vector<double>& xticks, const std::string& xlabel, const Scale& sy,
                 const std::vector<double>& yticks, const std::string& ylabel);

}  // namespace msaflow::report::svg
