// Small string helpers shared by error messages.
#pragma once

#include <string>
#include <vector>

namespace msaflow {

std::string Join(const std::vector<std::string>& parts, const std::string& sep);
size_t EditDistance(const std::string& a, const std::string& b);
// " — did you mean \"x\"?" for the closest candidate within a small edit distance, else "".
std::string DidYouMean(const std::string& got, const std::vector<std::string>& candidates);
// "1.5 KiB", "3.2 MiB".
std::string HumanBytes(double bytes);

}  // namespace msaflow
