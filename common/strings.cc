#include "common/strings.h"

#include <algorithm>
#include <cctype>
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
  const size_t limit = std::max<size_t>(2, got.size() / 3);
  if (got.size() > 1024) return "";  // no name is that long: nothing to suggest, and no O(n*m) search
  for (const auto& c : candidates) {
    // The distance is at least the difference in length: no need to compute it past the limit.
    if ((c.size() > got.size() ? c.size() - got.size() : got.size() - c.size()) > limit || c.size() > 4096) continue;
    size_t d = EditDistance(got, c);
    if (d < best) {
      best = d;
      pick = c;
    }
  }
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

namespace {

// `s` with control bytes escaped (\n, \t, \xHH), cut after `max` bytes with "… (N bytes)".
// utf8: bytes >= 0x80 kept and the cut between characters; backslash: "\\" for a backslash.
std::string EscapeCut(std::string_view s, size_t max, bool utf8, bool backslash) {
  std::string out;
  size_t n = std::min(s.size(), max);
  if (utf8)
    while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;  // not inside a character
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\' && backslash) {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f || (c > 0x7f && !utf8)) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > n) out += "… (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace

std::string Printable(std::string_view s, size_t max, bool utf8) { return EscapeCut(s, max, utf8, /*backslash=*/true); }

std::string OneLine(std::string_view message) {
  constexpr size_t kQuoted = 80, kRun = 200, kKeep = 60;
  // Long quoted values first: '<value>' -> '<first 60 bytes>… (N bytes)'. A quote opens after
  // a space, '(', '[', '=' or ':' (not the apostrophe of "model's") and closes before anything
  // but a letter or digit.
  auto opens = [&](size_t k) { return k == 0 || std::string_view(" ([=:\"").find(message[k - 1]) != std::string_view::npos; };
  auto closes = [&](size_t k) { return k + 1 == message.size() || !std::isalnum(static_cast<unsigned char>(message[k + 1])); };
  std::string cut;
  size_t i = 0;
  while (i < message.size()) {
    size_t open = message.find('\'', i);
    while (open != std::string_view::npos && !opens(open)) open = message.find('\'', open + 1);
    if (open == std::string_view::npos) break;
    size_t close = message.find('\'', open + 1);
    while (close != std::string_view::npos && !closes(close)) close = message.find('\'', close + 1);
    if (close == std::string_view::npos) break;
    const std::string_view value = message.substr(open + 1, close - open - 1);
    cut.append(message.substr(i, open + 1 - i));
    if (value.size() > kQuoted) {
      size_t n = kKeep;
      while (n > 0 && (static_cast<unsigned char>(value[n]) & 0xc0) == 0x80) --n;
      cut.append(value.substr(0, n));
      cut += "… (" + std::to_string(value.size()) + " bytes)";
    } else {
      cut.append(value);
    }
    cut += '\'';
    i = close + 1;
  }
  cut.append(message.substr(std::min(i, message.size())));
  // Then long unbroken runs (a path, a value not quoted), and every control byte escaped (a
  // backslash stays one: JSON's "\u0000" reads as it was written).
  auto escaped = [](std::string_view w, size_t max) { return EscapeCut(w, max, /*utf8=*/true, /*backslash=*/false); };
  std::string out;
  size_t start = 0;
  while (start < cut.size()) {
    size_t end = cut.find(' ', start);
    if (end == std::string::npos) end = cut.size();
    const std::string_view word = std::string_view(cut).substr(start, end - start);
    if (word.size() > kRun) {  // cut, keeping the punctuation that ends it ("path:")
      const bool punct = std::string_view(":,;").find(word.back()) != std::string_view::npos;
      out += escaped(word.substr(0, word.size() - (punct ? 1 : 0)), kKeep);
      if (punct) out += word.back();
    } else {
      out += escaped(word, word.size());
    }
    if (end < cut.size()) out += ' ';
    start = end + 1;
  }
  return out;
}

bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1fu;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0fu;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3fu);
    }
    static constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

}  // namespace msaflow
