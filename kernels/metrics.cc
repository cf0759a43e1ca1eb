#include "kernels/metrics.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace msaflow::kernels {

void Metrics::Merge(const Metrics& o) {
  if (classes == 0) {
    *this = o;
    return;
  }
  if (o.classes != classes) Throw(ErrorKind::kInvalidInput, "metrics: merging shards with different class counts");
  count += o.count;
  correct += o.correct;
  loss_sum += o.loss_sum;
  for (size_t i = 0; i < confusion.size(); ++i) confusion[i] += o.confusion[i];
}

Metrics Metrics::Empty(int64_t classes) {
  Metrics m;
  m.classes = classes;
  m.confusion.assign(static_cast<size_t>(classes * classes), 0);
  return m;
}

Metrics Evaluate(const float* logits, const uint8_t* labels, int64_t n, int64_t classes) {
  Metrics m = Metrics::Empty(classes);
  m.count = n;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * classes;
    int64_t pred = std::max_element(z, z + classes) - z;
    float mx = z[pred];
    double s = 0;
    for (int64_t j = 0; j < classes; ++j) s += std::exp(static_cast<double>(z[j] - mx));
    int64_t t = labels[i];
    if (t >= classes) Throw(ErrorKind::kInvalidInput, "evaluate: label " + std::to_string(t) + " >= classes " + std::to_string(classes));
    m.loss_sum += std::log(s) - static_cast<double>(z[t] - mx);
    if (pred == t) ++m.correct;
    m.confusion[static_cast<size_t>(t * classes + pred)]++;
  }
  return m;
}

}  // namespace msaflow::kernels
