#include "kernels/lbfgs.h"

#include <algorithm>
#include <cmath>
#include <deque>

namespace msaflow::kernels {
namespace {

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double MaxAbs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

struct Pair {
  std::vector<double> s, y;
  double rho;
};

// d = -H g by the two-loop recursion; H0 = gamma I with gamma = s'y / y'y of the newest pair.
void Direction(const std::deque<Pair>& mem, const std::vector<double>& g, std::vector<double>& d) {
  d = g;
  std::vector<double> alpha(mem.size());
  for (size_t k = mem.size(); k-- > 0;) {
    alpha[k] = mem[k].rho * Dot(mem[k].s, d);
    for (size_t i = 0; i < d.size(); ++i) d[i] -= alpha[k] * mem[k].y[i];
  }
  if (!mem.empty()) {
    const Pair& last = mem.back();
    const double gamma = 1.0 / (last.rho * Dot(last.y, last.y));
    for (double& v : d) v *= gamma;
  }
  for (size_t k = 0; k < mem.size(); ++k) {
    const double beta = mem[k].rho * Dot(mem[k].y, d);
    for (size_t i = 0; i < d.size(); ++i) d[i] += (alpha[k] - beta) * mem[k].s[i];
  }
  for (double& v : d) v = -v;
}

}  // namespace

LbfgsResult MinimizeLbfgs(std::vector<double>& w, const Objective& f, const LbfgsOptions& opt,
                          const std::function<void(int, double)>& on_iteration) {
  LbfgsResult r;
  const size_t n = w.size();
  std::vector<double> g(n), d(n), w_new(n), g_new(n);
  double fx = f(w, g);
  ++r.evaluations;
  std::deque<Pair> mem;
  r.stop = "max iterations";
  for (int k = 0; k < opt.max_iterations; ++k) {
    if (MaxAbs(g) <= opt.gradient_tolerance) {
      r.stop = "converged";
      break;
    }
    Direction(mem, g, d);
    double gd = Dot(g, d);
    if (!(gd < 0)) {  // not a descent direction (rounding): start again from steepest descent
      mem.clear();
      for (size_t i = 0; i < n; ++i) d[i] = -g[i];
      gd = Dot(g, d);
    }
    // The first step has no curvature to scale it: a unit step along -g / |g|.
    double t = mem.empty() ? std::min(1.0, 1.0 / std::sqrt(Dot(g, g))) : 1.0;
    double f_new = 0;
    bool accepted = false;
    for (int ls = 0; ls < opt.max_line_search; ++ls) {
      for (size_t i = 0; i < n; ++i) w_new[i] = w[i] + t * d[i];
      f_new = f(w_new, g_new);
      ++r.evaluations;
      if (std::isfinite(f_new) && f_new <= fx + 1e-4 * t * gd) {
        accepted = true;
        break;
      }
      t *= 0.5;
    }
    if (!accepted) {
      f(w, g);  // the objective's last evaluation is at the point returned
      ++r.evaluations;
      r.stop = "line search failed";
      break;
    }
    Pair p{std::vector<double>(n), std::vector<double>(n), 0};
    for (size_t i = 0; i < n; ++i) p.s[i] = w_new[i] - w[i], p.y[i] = g_new[i] - g[i];
    const double sy = Dot(p.s, p.y);
    if (sy > 1e-10 * Dot(p.y, p.y)) {  // curvature condition; else the pair would spoil H
      p.rho = 1.0 / sy;
      mem.push_back(std::move(p));
      if (static_cast<int>(mem.size()) > opt.memory) mem.pop_front();
    }
    const double decrease = fx - f_new;
    w.swap(w_new);
    g.swap(g_new);
    fx = f_new;
    r.iterations = k + 1;
    if (on_iteration) on_iteration(r.iterations, fx);
    if (decrease <= opt.relative_decrease * std::max({std::abs(fx), std::abs(fx + decrease), 1.0})) {
      r.stop = "no progress";
      break;
    }
  }
  r.f = fx;
  r.max_gradient = MaxAbs(g);
  return r;
}

}  // namespace msaflow::kernels
