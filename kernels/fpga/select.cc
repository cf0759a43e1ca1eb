#include "kernels/fpga/select.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/strings.h"

namespace msaflow::kernels::fpga {

uint64_t OrderKey(double metric) {
  if (metric == 0) metric = 0;  // -0 -> +0
  uint64_t bits;
  std::memcpy(&bits, &metric, sizeof bits);
  constexpr uint64_t kSign = uint64_t{1} << 63;
  return (bits & kSign) ? ~bits : bits | kSign;
}

std::vector<Scored> SelectOrder(Device& device, const std::vector<Scored>& scores) {
  if (scores.empty()) Throw(ErrorKind::kInvalidInput, "select: no results to select from");
  if (scores.size() > UINT32_MAX) Throw(ErrorKind::kInvalidInput, "select: more than 2^32 candidates");
  // Candidates in id order: the position breaks ties.
  std::vector<size_t> by_id(scores.size());
  for (size_t i = 0; i < by_id.size(); ++i) by_id[i] = i;
  std::sort(by_id.begin(), by_id.end(), [&](size_t a, size_t b) { return scores[a].candidate < scores[b].candidate; });
  std::vector<uint64_t> keys(scores.size());
  for (size_t i = 0; i < by_id.size(); ++i) {
    const Scored& s = scores[by_id[i]];
    if (std::isnan(s.metric))
      Throw(ErrorKind::kInvalidInput, "select: candidate '" + Printable(s.candidate, 80) +
                                          "' has no valid metric (NaN); its evaluation failed or diverged");
    if (i > 0 && scores[by_id[i - 1]].candidate == s.candidate)
      Throw(ErrorKind::kInvalidInput, "select: candidate '" + Printable(s.candidate, 80) + "' has two results");
    keys[i] = OrderKey(s.metric);
  }
  std::vector<uint32_t> order = device.Order(keys);
  if (order.size() != keys.size())
    Throw(ErrorKind::kInternal, "select: device " + device.Name() + " ordered " + std::to_string(order.size()) + " of " +
                                    std::to_string(keys.size()) + " candidates");
  std::vector<Scored> out;
  out.reserve(order.size());
  std::vector<bool> seen(order.size());
  for (uint32_t p : order) {
    if (p >= order.size() || seen[p])
      Throw(ErrorKind::kInternal, "select: device " + device.Name() + " returned an order that is not a permutation");
    seen[p] = true;
    out.push_back(scores[by_id[p]]);
  }
  return out;
}

}  // namespace msaflow::kernels::fpga
