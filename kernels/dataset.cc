#include "kernels/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"

namespace msaflow::kernels {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// A file read through zlib (which passes plain files through unchanged), in pieces: a
// dataset with a limit is read only as far as its first `limit` images.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    if (!PathExists(path)) Throw(ErrorKind::kNotFound, path + ": no such file");
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) ThrowErrno("open " + path);
    gzbuffer(f_, 1 << 17);
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Appends up to `bytes` more bytes to *out: fewer only at the end of the file. The string
  // grows a piece at a time, so a header that claims more than the file holds costs no more
  // memory than the file.
  void Read(size_t bytes, std::string* out) {
    constexpr size_t kPiece = size_t{1} << 22;
    while (bytes > 0) {
      const size_t at = out->size(), want = std::min(bytes, kPiece);
      out->resize(at + want);
      const int n = gzread(f_, out->data() + at, static_cast<unsigned>(want));
      out->resize(at + static_cast<size_t>(std::max(n, 0)));
      if (n <= 0 || static_cast<size_t>(n) < want) {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
          Throw(ErrorKind::kInvalidInput, path_ + ": corrupt gzip stream (" + std::string(msg ? msg : "") + ")");
        return;
      }
      bytes -= want;
    }
  }
  // Appends the rest of the file to *out.
  void ReadRest(std::string* out) { Read(std::numeric_limits<size_t>::max(), out); }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

std::string ReadMaybeGz(const std::string& path) {
  std::string out;
  GzReader(path).ReadRest(&out);
  return out;
}

uint32_t BigEndian32(const std::string& b, size_t off) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(b[off])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[off + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[off + 2])) << 8) | static_cast<uint8_t>(b[off + 3]);
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void PutBigEndian32(std::string& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((v >> s) & 0xff));
}

}  // namespace

int64_t ImageSet::classes() const {
  return labels.empty() ? 0 : 1 + *std::max_element(labels.begin(), labels.end());
}

std::string ImageSet::Where(int64_t i) const {
  if (i >= 0 && static_cast<size_t>(i) < files.size()) return files[static_cast<size_t>(i)];
  return "image " + std::to_string(i);
}

std::string ImageSet::Digest() const {
  // Gray images of one size keep the key they always had (features stored earlier stay valid).
  std::string buf = std::to_string(count) + "x" + std::to_string(rows) + "x" + std::to_string(cols) + ":";
  if (channels != 1) buf += "c" + std::to_string(channels) + ":";
  for (size_t i = 0; i < offset.size(); ++i)
    buf += std::to_string(heights[i]) + "x" + std::to_string(widths[i]) + "x" + std::to_string(chans[i]) + ",";
  buf.append(reinterpret_cast<const char*>(pixels.data()), pixels.size());
  buf.append(reinterpret_cast<const char*>(labels.data()), labels.size());
  return ChecksumHex(buf);
}

ImageSet Subset(const ImageSet& s, const std::vector<int64_t>& rows) {
  ImageSet o;
  o.count = static_cast<int64_t>(rows.size());
  o.rows = s.rows;
  o.cols = s.cols;
  o.channels = s.channels;
  o.class_names = s.class_names;
  for (int64_t r : rows) {
    if (r < 0 || r >= s.count) Throw(ErrorKind::kInternal, "Subset: row " + std::to_string(r) + " of " + std::to_string(s.count));
    const size_t bytes = static_cast<size_t>(s.Rows(r) * s.Cols(r) * s.Channels(r));
    if (!s.uniform()) {
      o.offset.push_back(static_cast<int64_t>(o.pixels.size()));
      o.heights.push_back(s.Rows(r));
      o.widths.push_back(s.Cols(r));
      o.chans.push_back(s.Channels(r));
    }
    o.pixels.insert(o.pixels.end(), s.Image(r), s.Image(r) + bytes);
    o.labels.push_back(s.labels[static_cast<size_t>(r)]);
    if (!s.files.empty()) o.files.push_back(s.files[static_cast<size_t>(r)]);
  }
  return o;
}

std::vector<bool> StratifiedSplit(const std::vector<uint8_t>& labels, double fraction, uint64_t seed) {
  std::vector<bool> in_val(labels.size(), false);
  std::map<int, std::vector<size_t>> by_class;
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(i);
  for (auto& [label, idx] : by_class) {
    if (idx.size() < 2) continue;  // a class seen once stays in training
    auto take = static_cast<size_t>(std::llround(fraction * static_cast<double>(idx.size())));
    take = std::clamp<size_t>(take, 1, idx.size() - 1);
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(label));
    for (size_t i = idx.size() - 1; i > 0; --i) std::swap(idx[i], idx[rng() % (i + 1)]);  // Fisher-Yates
    for (size_t i = 0; i < take; ++i) in_val[idx[i]] = true;
  }
  return in_val;
}

namespace {

// The images file's header, checked: count, rows, cols.
struct IdxHeader {
  int64_t n = 0, rows = 0, cols = 0;
};
IdxHeader ReadIdxHeader(GzReader& images, const std::string& images_path, std::string* img) {
  images.Read(16, img);
  if (img->size() < 16)
    Throw(ErrorKind::kInvalidInput, images_path + ": " + std::to_string(img->size()) +
                                        " bytes; an IDX image file has a 16-byte header");
  uint32_t magic = BigEndian32(*img, 0);
  if (magic != kImagesMagic)
    Throw(ErrorKind::kInvalidInput, images_path + ": magic " + Hex(magic) + ", expected " + Hex(kImagesMagic) +
                                        " (IDX unsigned-byte images, 3 dims)");
  IdxHeader h;
  h.n = BigEndian32(*img, 4);
  h.rows = BigEndian32(*img, 8);
  h.cols = BigEndian32(*img, 12);
  if (h.rows <= 0 || h.cols <= 0 || h.rows > 4096 || h.cols > 4096)
    Throw(ErrorKind::kInvalidInput, images_path + ": image size " + std::to_string(h.rows) + "x" +
                                        std::to_string(h.cols) + " out of range (1..4096)");
  return h;
}

// The first `count` of the n labels, the file checked whole.
std::vector<uint8_t> ReadIdxLabelFile(const std::string& labels_path, int64_t n, const std::string& images_path,
                                      int64_t count) {
  std::string lab = ReadMaybeGz(labels_path);
  if (lab.size() < 8)
    Throw(ErrorKind::kInvalidInput, labels_path + ": " + std::to_string(lab.size()) +
                                        " bytes; an IDX label file has an 8-byte header");
  const uint32_t magic = BigEndian32(lab, 0);
  if (magic != kLabelsMagic)
    Throw(ErrorKind::kInvalidInput, labels_path + ": magic " + Hex(magic) + ", expected " + Hex(kLabelsMagic) +
                                        " (IDX unsigned-byte labels, 1 dim)");
  int64_t nl = BigEndian32(lab, 4);
  if (static_cast<int64_t>(lab.size() - 8) != nl)
    Throw(ErrorKind::kInvalidInput, labels_path + ": body has " + std::to_string(lab.size() - 8) +
                                        " bytes, header says " + std::to_string(nl) + " labels");
  if (nl != n)
    Throw(ErrorKind::kInvalidInput, labels_path + ": " + std::to_string(nl) + " labels for " + std::to_string(n) +
                                        " images in " + images_path);
  return std::vector<uint8_t>(lab.begin() + 8, lab.begin() + 8 + count);
}

}  // namespace

ImageSet ReadIdx(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  GzReader images(images_path);
  std::string img;
  const IdxHeader h = ReadIdxHeader(images, images_path, &img);
  const int64_t n = h.n;
  ImageSet s;
  s.rows = h.rows;
  s.cols = h.cols;
  int64_t px = s.rows * s.cols;
  s.count = limit > 0 ? std::min(n, limit) : n;
  const std::string shape = std::to_string(n) + " images of " + std::to_string(s.rows) + "x" + std::to_string(s.cols);
  if (s.count < n) {  // only the first images are used: the rest is neither read nor checked
    images.Read(static_cast<size_t>(s.count * px), &img);
    const int64_t have = static_cast<int64_t>(img.size() - 16);
    if (have < s.count * px)
      Throw(ErrorKind::kInvalidInput, images_path + ": body has " + std::to_string(have) + " bytes, the first " +
                                          std::to_string(s.count) + " images (the limit) need " +
                                          std::to_string(s.count * px) + " (header says " + shape + ")");
  } else {
    images.ReadRest(&img);
    const int64_t have = static_cast<int64_t>(img.size() - 16);
    if (have != n * px)
      Throw(ErrorKind::kInvalidInput, images_path + ": body has " + std::to_string(have) + " bytes, header says " +
                                          shape + " = " + std::to_string(n * px) + " bytes");
  }
  if (!labels_path.empty()) s.labels = ReadIdxLabelFile(labels_path, n, images_path, s.count);
  s.pixels.assign(img.begin() + 16, img.begin() + 16 + s.count * px);
  return s;
}

std::vector<uint8_t> ReadIdxLabels(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  GzReader images(images_path);
  std::string img;
  const IdxHeader h = ReadIdxHeader(images, images_path, &img);
  return ReadIdxLabelFile(labels_path, h.n, images_path, limit > 0 ? std::min(h.n, limit) : h.n);
}

void WriteIdxImages(const std::string& path, int64_t count, int64_t rows, int64_t cols, const uint8_t* pixels) {
  std::string b;
  PutBigEndian32(b, kImagesMagic);
  PutBigEndian32(b, static_cast<uint32_t>(count));
  PutBigEndian32(b, static_cast<uint32_t>(rows));
  PutBigEndian32(b, static_cast<uint32_t>(cols));
  b.append(reinterpret_cast<const char*>(pixels), static_cast<size_t>(count * rows * cols));
  WriteFileAtomic(path, b);
}

void WriteIdxLabels(const std::string& path, int64_t count, const uint8_t* labels) {
  std::string b;
  PutBigEndian32(b, kLabelsMagic);
  PutBigEndian32(b, static_cast<uint32_t>(count));
  b.append(reinterpret_cast<const char*>(labels), static_cast<size_t>(count));
  WriteFileAtomic(path, b);
}

}  // namespace msaflow::kernels
