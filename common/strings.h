// Small string helpers shared by error messages.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace msaflow {

std::string Join(const std::vector<std::string>& parts, const std::string& sep);
size_t EditDistance(const std::string& a, const std::string& b);
// The closest candidate within a small edit distance of `got`, or "" when none is that close.
std::string Nearest(const std::string& got, const std::vector<std::string>& candidates);
// " — did you mean \"x\"?" for Nearest's answer, else "".
std::string DidYouMean(const std::string& got, const std::vector<std::string>& candidates);
// `s` fit for one line of an error message: control bytes, NUL and bytes >= 0x7f as \n, \t,
// \xHH; cut after `max` bytes with "… (N bytes)". With `utf8`, bytes >= 0x80 are kept (for
// text known to be UTF-8, such as class names) and the cut falls between characters.
std::string Printable(std::string_view s, size_t max = 80, bool utf8 = false);
// A whole error message fit for one line (docs/errors.md): a quoted value ('...') longer than
// 80 bytes and any run of 160 bytes without a space are cut with their length, control bytes
// escaped (\n, \x00); UTF-8 text is kept.
std::string OneLine(std::string_view message);
// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsUtf8(std::string_view s);
// "1.5 KiB", "3.2 MiB".
std::string HumanBytes(double bytes);

// The value among `values` whose `name` is `word`: the one reader of a closed set's words (each
// set's exhaustive switch of names is the one place it is spelled).
template <typename E, size_t N>
std::optional<E> ByName(std::string_view word, const char* (*name)(E), const E (&values)[N]) {
  for (E v : values)
    if (word == name(v)) return v;
  return std::nullopt;
}
template <typename E, size_t N>
std::optional<E> ByName(std::string_view word, const char* (*name)(E), const std::array<E, N>& values) {
  for (E v : values)
    if (word == name(v)) return v;
  return std::nullopt;
}

}  // namespace msaflow
