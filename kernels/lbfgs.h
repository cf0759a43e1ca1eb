// A limited-memory BFGS minimiser (Nocedal & Wright, algorithm 7.4 and 7.5): the two-loop
// recursion over the last `memory` steps, scaled by s'y / y'y, with a backtracking (Armijo)
// line search. Full-batch and deterministic: the same function and start give the same
// iterates. The heads use it for softmax regression with L2, as scikit-learn's
// LogisticRegression(solver="lbfgs") does (parallel/train_lbfgs.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct LbfgsOptions {
  int max_iterations = 100;
  int memory = 10;
  double gradient_tolerance = 1e-5;  // stop when max |g_i| falls to this
  double relative_decrease = 1e-10;  // stop when an iteration lowers f by less than this (relative)
  int max_line_search = 30;
};

struct LbfgsResult {
  int iterations = 0, evaluations = 0;
  double f = 0, max_gradient = 0;
  std::string stop;  // "converged", "no progress", "max iterations", "line search failed"
};

// f(w, grad): the objective at w, with its gradient written to grad (w.size()).
using Objective = std::function<double(const std::vector<double>& w, std::vector<double>& grad)>;

// Minimises f from w (replaced by the minimiser found). `on_iteration(k, f)` is called after
// iteration k (1-based) with the accepted point's value, the objective having just been
// evaluated there.
LbfgsResult MinimizeLbfgs(std::vector<double>& w, const Objective& f, const LbfgsOptions& opt = {},
                          const std::function<void(int, double)>& on_iteration = {});

}  // namespace msaflow::kernels
