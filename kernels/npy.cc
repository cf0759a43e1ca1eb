#include "kernels/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.h"
#include "common/files.h"

namespace msaflow::kernels {
namespace {

[[noreturn]] void BadNpy(const std::string& path, const std::string& what) {
  Throw(ErrorKind::kInvalidInput, path + ": " + what);
}

std::string ReadExisting(const std::string& path) {
  if (!PathExists(path)) Throw(ErrorKind::kNotFound, path + ": no such file");
  return ReadFile(path);
}

// The value of 'key' in the header's dict: the text up to the next top-level ',' or '}'.
std::string DictValue(const std::string& h, const std::string& key, const std::string& path) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) BadNpy(path, "the .npy header has no '" + key + "'");
  size_t colon = h.find(':', k);
  if (colon == std::string::npos) BadNpy(path, "malformed .npy header");
  size_t i = colon + 1, depth = 0, start = i;
  for (; i < h.size(); ++i) {
    char c = h[i];
    if (c == '(') ++depth;
    if (c == ')') {
      if (depth == 0) break;
      --depth;
    }
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string v = h.substr(start, i - start + (i < h.size() && h[i] == ')' ? 1 : 0));
  size_t a = v.find_first_not_of(" \t"), b = v.find_last_not_of(" \t");
  return a == std::string::npos ? "" : v.substr(a, b - a + 1);
}

int64_t CountOf(const NpyHeader& h) {
  int64_t n = 1;
  for (int64_t d : h.shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

// The images' header, checked: uint8, C order, (N, H, W) or (N, H, W, C) with C 1 or 3.
// `img` holds at least the header; `file_size` is the whole file's.
NpyHeader ImagesHeader(const std::string& img, uint64_t file_size, const std::string& path) {
  NpyHeader h = ParseNpyHeader(img, path);
  if (h.descr != "|u1" && h.descr != "<u1" && h.descr != ">u1" && h.descr != "=u1")
    BadNpy(path, "dtype '" + h.descr + "'; images must be uint8 (|u1)");
  if (h.fortran_order) BadNpy(path, "Fortran order; save the images in C order (numpy.ascontiguousarray)");
  if (h.shape.size() != 3 && h.shape.size() != 4)
    BadNpy(path, "shape " + ShapeText(h.shape) + "; images must be N x H x W or N x H x W x C");
  if (h.shape.size() == 4 && h.shape[3] != 1 && h.shape[3] != 3)
    BadNpy(path, "shape " + ShapeText(h.shape) + ": " + std::to_string(h.shape[3]) +
                     " channels; expected 1 (gray) or 3 (RGB)");
  if (h.shape[1] < 1 || h.shape[2] < 1) BadNpy(path, "shape " + ShapeText(h.shape) + ": images of size 0");
  if (h.shape[1] > 16384 || h.shape[2] > 16384)
    BadNpy(path, "shape " + ShapeText(h.shape) + ": images larger than 16384 a side");
  const int64_t n = CountOf(h);
  if (n < 0 || static_cast<uint64_t>(n) != file_size - h.data_offset)
    BadNpy(path, "body has " + std::to_string(file_size - h.data_offset) + " bytes, the shape " + ShapeText(h.shape) +
                     " needs " + std::to_string(n));
  return h;
}

bool LittleEndianInteger(const std::string& d) {
  return d.size() >= 3 && (d[0] == '|' || d[0] == '<' || d[0] == '=') && (d[1] == 'u' || d[1] == 'i' || d[1] == 'b');
}

// The first 1 MiB of a regular file (NEP 1 headers are at most 4 GiB in theory, a few hundred
// bytes in practice) and the whole file's size.
std::string ReadHead(const std::string& path, uint64_t& size) {
  if (!PathExists(path)) Throw(ErrorKind::kNotFound, path + ": no such file");
  if (!std::filesystem::is_regular_file(path))
    Throw(ErrorKind::kInvalidInput, path + ": not a regular file (a device, FIFO or folder); expected a .npy file");
  std::ifstream f(path, std::ios::binary);
  std::string head(1 << 20, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(f.gcount()));
  std::error_code ec;
  size = std::filesystem::file_size(path, ec);
  if (ec) Throw(ErrorKind::kIo, path + ": " + ec.message());
  return head;
}

std::vector<uint8_t> Labels(const std::string& lab, const std::string& path, int64_t n_images,
                            const std::string& images_path, int64_t count) {
  NpyHeader h = ParseNpyHeader(lab, path);
  if (h.shape.size() != 1) BadNpy(path, "shape " + ShapeText(h.shape) + "; labels must be one-dimensional (N,)");
  if (h.fortran_order && h.shape.size() != 1) BadNpy(path, "Fortran order");
  const std::string& d = h.descr;
  if (!LittleEndianInteger(d)) BadNpy(path, "dtype '" + d + "'; labels must be little-endian integers (e.g. |u1, <i8)");
  const int width = std::atoi(d.c_str() + 2);
  if (width != 1 && width != 2 && width != 4 && width != 8)
    BadNpy(path, "dtype '" + d + "': an unsupported integer width");
  if (h.shape[0] != n_images)
    BadNpy(path, std::to_string(h.shape[0]) + " labels for " + std::to_string(n_images) + " images in " + images_path);
  if (lab.size() - h.data_offset != static_cast<size_t>(h.shape[0] * width))
    BadNpy(path, "body has " + std::to_string(lab.size() - h.data_offset) + " bytes, " + std::to_string(h.shape[0]) +
                     " labels of " + std::to_string(width) + " bytes need " + std::to_string(h.shape[0] * width));
  std::vector<uint8_t> out(static_cast<size_t>(count));
  const bool is_signed = d[1] == 'i';
  for (int64_t i = 0; i < count; ++i) {
    const char* p = lab.data() + h.data_offset + static_cast<size_t>(i * width);
    uint64_t u = 0;
    std::memcpy(&u, p, static_cast<size_t>(width));  // little-endian host
    int64_t v = static_cast<int64_t>(u);
    if (is_signed && width < 8 && (u >> (width * 8 - 1)) & 1) v -= static_cast<int64_t>(uint64_t{1} << (width * 8));
    if (v < 0 || v > 255)
      BadNpy(path, "label " + std::to_string(v) + " at index " + std::to_string(i) +
                       "; labels must be 0..255 (class indices)");
    out[static_cast<size_t>(i)] = static_cast<uint8_t>(v);
  }
  return out;
}

}  // namespace

NpyHeader ParseNpyHeader(const std::string& b, const std::string& path) {
  static const char kMagic[] = "\x93NUMPY";
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, 6) != 0) BadNpy(path, "not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<uint8_t>(b[6]);
  size_t len = 0, start = 0;
  if (major == 1) {
    len = static_cast<uint8_t>(b[8]) | (static_cast<size_t>(static_cast<uint8_t>(b[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) BadNpy(path, "a truncated .npy header");
    len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(b[8 + static_cast<size_t>(i)]);
    start = 12;
  } else {
    BadNpy(path, ".npy format version " + std::to_string(major) + "; expected 1, 2 or 3");
  }
  if (len > b.size() - start) BadNpy(path, "a truncated .npy header");
  const std::string h = b.substr(start, len);
  NpyHeader out;
  out.data_offset = start + len;
  std::string descr = DictValue(h, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"'))
    BadNpy(path, "the .npy dtype is not a simple type: " + descr.substr(0, 40));
  out.descr = descr.substr(1, descr.size() - 2);
  std::string fo = DictValue(h, "fortran_order", path);
  if (fo != "True" && fo != "False") BadNpy(path, "malformed fortran_order in the .npy header");
  out.fortran_order = fo == "True";
  std::string shape = DictValue(h, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    BadNpy(path, "malformed shape in the .npy header");
  std::string inner = shape.substr(1, shape.size() - 2);
  size_t i = 0;
  while (i < inner.size()) {
    while (i < inner.size() && (inner[i] == ' ' || inner[i] == ',')) ++i;
    if (i >= inner.size()) break;
    size_t j = i;
    while (j < inner.size() && inner[j] >= '0' && inner[j] <= '9') ++j;
    if (j == i || j - i > 12) BadNpy(path, "malformed shape " + shape.substr(0, 40) + " in the .npy header");
    out.shape.push_back(std::stoll(inner.substr(i, j - i)));
    i = j;
    while (i < inner.size() && inner[i] == ' ') ++i;
    if (i < inner.size() && inner[i] != ',')
      BadNpy(path, "malformed shape " + shape.substr(0, 40) + " in the .npy header");
  }
  return out;
}

ImageSet ReadNpy(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  const std::string img = ReadExisting(images_path);
  const NpyHeader h = ImagesHeader(img, img.size(), images_path);
  ImageSet s;
  s.rows = h.shape[1];
  s.cols = h.shape[2];
  s.channels = h.shape.size() == 4 ? h.shape[3] : 1;
  s.count = limit > 0 ? std::min(h.shape[0], limit) : h.shape[0];
  if (!labels_path.empty()) s.labels = Labels(ReadExisting(labels_path), labels_path, h.shape[0], images_path, s.count);
  const size_t bytes = static_cast<size_t>(s.count * s.rows * s.cols * s.channels);
  s.pixels.assign(img.begin() + static_cast<std::ptrdiff_t>(h.data_offset),
                  img.begin() + static_cast<std::ptrdiff_t>(h.data_offset + bytes));
  return s;
}

std::vector<uint8_t> ReadNpyLabels(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  // The images' header only, and the file's size for the body check.
  uint64_t size = 0;
  const std::string head = ReadHead(images_path, size);
  const NpyHeader h = ImagesHeader(head, size, images_path);
  const int64_t count = limit > 0 ? std::min(h.shape[0], limit) : h.shape[0];
  return Labels(ReadExisting(labels_path), labels_path, h.shape[0], images_path, count);
}

NpyRole PeekNpy(const std::string& path) {
  try {
    uint64_t size = 0;
    const std::string head = ReadHead(path, size);
    const NpyHeader h = ParseNpyHeader(head, path);
    if (h.shape.size() == 1) {
      const int width = LittleEndianInteger(h.descr) ? std::atoi(h.descr.c_str() + 2) : 0;
      const bool whole = (width == 1 || width == 2 || width == 4 || width == 8) &&
                         size - h.data_offset == static_cast<uint64_t>(h.shape[0]) * static_cast<uint64_t>(width);
      return whole ? NpyRole{NpyRole::kLabels, h.shape[0]} : NpyRole{};
    }
    return {NpyRole::kImages, ImagesHeader(head, size, path).shape[0]};
  } catch (const Error&) {
    return {};  // not a dataset's array: the caller lists what is
  }
}

std::string NpyBytes(const std::string& descr, const std::string& shape, const std::string& body) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + body;
}

}  // namespace msaflow::kernels
