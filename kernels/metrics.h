// Evaluation metrics (the select step's reduction over them: kernels/fpga/select.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct Metrics {
  int64_t count = 0, correct = 0;
  double loss_sum = 0;                 // summed cross-entropy
  int64_t classes = 0;
  std::vector<int64_t> confusion;      // classes x classes, [true][predicted]
  double accuracy() const { return count ? static_cast<double>(correct) / static_cast<double>(count) : 0; }
  double loss() const { return count ? loss_sum / static_cast<double>(count) : 0; }
  // Adds another shard's counts (same classes).
  void Merge(const Metrics& other);
  // No image counted yet, over `classes` classes (what shards' metrics merge into).
  static Metrics Empty(int64_t classes);
};

// Metrics of logits (n x classes) against labels.
Metrics Evaluate(const float* logits, const uint8_t* labels, int64_t n, int64_t classes);

}  // namespace msaflow::kernels
