#include "kernels/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "kernels/image_codec.h"

namespace msaflow::kernels {
namespace {

namespace fs = std::filesystem;

bool IsImageName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  std::string ext = fs::path(name).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The first bytes only: a file that is not an image at all is refused before anything runs;
// one that is damaged inside is found when it is decoded.
bool LooksLikeAnImage(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char b[8] = {};
  f.read(b, sizeof b);
  const auto n = f.gcount();
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n == 8 && std::memcmp(b, kPng, 8) == 0) return true;
  return n >= 3 && static_cast<unsigned char>(b[0]) == 0xff && static_cast<unsigned char>(b[1]) == 0xd8 &&
         static_cast<unsigned char>(b[2]) == 0xff;
}

}  // namespace

FolderListing ListImageFolder(const std::string& root, int64_t limit) {
  std::error_code ec;
  if (!fs::exists(root, ec)) Throw(ErrorKind::kNotFound, root + ": no such folder");
  if (!fs::is_directory(root, ec))
    Throw(ErrorKind::kInvalidInput, root + ": not a folder (an image folder is root/<class>/<image>.png|jpg)");
  FolderListing l;
  l.root = root;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string()[0] != '.') l.class_names.push_back(e.path().filename().string());
  if (ec) ThrowErrno("list " + root);
  std::sort(l.class_names.begin(), l.class_names.end());
  if (l.class_names.empty())
    Throw(ErrorKind::kInvalidInput, root + ": no class folders (an image folder is root/<class>/<image>.png|jpg)");
  for (const auto& cls : l.class_names)
    if (!IsUtf8(cls))
      Throw(ErrorKind::kInvalidInput, root + ": the class folder '" + Printable(cls) +
                                          "' has a name that is not UTF-8; class names are shown and recorded as text, "
                                          "so rename it");
  if (l.class_names.size() > 256)
    Throw(ErrorKind::kInvalidInput, root + ": " + std::to_string(l.class_names.size()) + " class folders; at most 256");
  std::vector<std::vector<std::string>> per_class;
  for (const auto& cls : l.class_names) {
    std::vector<std::string> files;
    const fs::path dir = fs::path(root) / cls;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!IsImageName(name)) continue;
      if (!e.is_regular_file()) Throw(ErrorKind::kInvalidInput, e.path().string() + ": not a file");
      if (e.file_size() == 0) Throw(ErrorKind::kInvalidInput, e.path().string() + ": an empty file (0 bytes)");
      if (!LooksLikeAnImage(e.path().string()))
        Throw(ErrorKind::kInvalidInput, e.path().string() + ": neither PNG nor JPEG (by its first bytes)");
      files.push_back(e.path().string());
    }
    if (ec) ThrowErrno("list " + dir.string());
    if (files.empty())
      Throw(ErrorKind::kInvalidInput, dir.string() + ": class '" + cls + "' has no .png, .jpg or .jpeg images");
    std::sort(files.begin(), files.end());
    per_class.push_back(std::move(files));
  }
  size_t longest = 0;
  for (const auto& f : per_class) longest = std::max(longest, f.size());
  for (size_t i = 0; i < longest; ++i)
    for (size_t c = 0; c < per_class.size(); ++c)
      if (i < per_class[c].size()) {
        l.files.push_back(per_class[c][i]);
        l.labels.push_back(static_cast<uint8_t>(c));
      }
  if (limit > 0 && static_cast<int64_t>(l.files.size()) > limit) {
    l.files.resize(static_cast<size_t>(limit));
    l.labels.resize(static_cast<size_t>(limit));
  }
  return l;
}

ImageSet DecodeFolderRows(const FolderListing& l, const std::vector<int64_t>& rows) {
  ImageSet s;
  s.class_names = l.class_names;
  s.count = static_cast<int64_t>(rows.size());
  s.channels = 1;
  for (int64_t r : rows) {
    const std::string& path = l.files.at(static_cast<size_t>(r));
    DecodedImage d = DecodeImage(ReadFile(path), path);
    s.offset.push_back(static_cast<int64_t>(s.pixels.size()));
    s.heights.push_back(d.rows);
    s.widths.push_back(d.cols);
    s.chans.push_back(d.channels);  // each image as it is: gray stays gray (prepare replicates it)
    s.channels = std::max(s.channels, d.channels);
    s.pixels.insert(s.pixels.end(), d.pixels.begin(), d.pixels.end());
    s.labels.push_back(l.labels.at(static_cast<size_t>(r)));
    s.files.push_back(path);
  }
  return s;
}

}  // namespace msaflow::kernels
