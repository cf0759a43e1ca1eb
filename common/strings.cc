#include "common/strings.h"

#include <algorithm>
#include <cstdio>

namespace msaflow {

std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string Nearest(const std::string& got, const std::vector<std::string>& candidates) {
  size_t best = SIZE_MAX;
  std::string pick;
  for (const auto& c : candidates) {
    size_t d = EditDistance(got, c);
    if (d < best) {
      best = d;
      pick = c;
    }
  }
  size_t limit = std::max<size_t>(2, got.size() / 3);
  return best > limit ? "" : pick;
}

std::string DidYouMean(const std::string& got, const std::vector<std::string>& candidates) {
  const std::string pick = Nearest(got, candidates);
  return pick.empty() ? "" : " — did you mean \"" + pick + "\"?";
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  const size_t n = std::min(s.size(), max);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "… (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace msaflow
