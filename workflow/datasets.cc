#include "workflow/datasets.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "kernels/image_codec.h"
#include "kernels/image_folder.h"
#include "kernels/npy.h"
#include "kernels/transferability.h"

namespace msaflow::workflow {

// The file or folder a split reads, with its limit applied.
struct Base {
  std::shared_ptr<const kernels::ImageSet> set;
  std::shared_ptr<const kernels::FolderListing> folder;
  std::vector<uint8_t> labels;
  std::vector<std::string> class_names;
  std::string origin;
};

namespace {

// pixels = false: the labels only (headers checked, no pixel read), for `validate`.
Base OpenBase(const SplitSpec& s, bool pixels = true) {
  Base b;
  b.origin = s.origin();
  if (s.format == "folder") {
    auto l = std::make_shared<kernels::FolderListing>(kernels::ListImageFolder(s.root, s.limit));
    b.labels = l->labels;
    b.class_names = l->class_names;
    b.folder = std::move(l);
  } else if (!pixels) {
    b.labels = s.format == "npy" ? kernels::ReadNpyLabels(s.images, s.labels, s.limit)
                                 : kernels::ReadIdxLabels(s.images, s.labels, s.limit);
  } else {
    auto set = std::make_shared<kernels::ImageSet>(s.format == "npy" ? kernels::ReadNpy(s.images, s.labels, s.limit)
                                                                     : kernels::ReadIdx(s.images, s.labels, s.limit));
    b.labels = set->labels;
    b.set = std::move(set);
  }
  return b;
}

}  // namespace

kernels::ImageSet SplitSource::Read(int64_t lo, int64_t hi) const {
  lo = std::clamp<int64_t>(lo, 0, count());
  hi = std::clamp<int64_t>(hi, lo, count());
  std::vector<int64_t> rows(rows_.begin() + lo, rows_.begin() + hi);
  if (folder_) return kernels::DecodeFolderRows(*folder_, rows);
  if (lo == 0 && hi == set_->count && static_cast<int64_t>(rows_.size()) == set_->count) return *set_;
  return kernels::Subset(*set_, rows);
}

kernels::ImageSet SplitSource::ReadRows(const std::vector<int64_t>& rows) const {
  std::vector<int64_t> base;
  base.reserve(rows.size());
  for (int64_t r : rows) {
    if (r < 0 || r >= count()) Throw(ErrorKind::kInternal, "SplitSource::ReadRows: row " + std::to_string(r) + " of " + std::to_string(count()));
    base.push_back(rows_[static_cast<size_t>(r)]);
  }
  if (folder_) return kernels::DecodeFolderRows(*folder_, base);
  return kernels::Subset(*set_, base);
}

std::string SplitSource::Digest() const {
  if (set_) {
    if (static_cast<int64_t>(rows_.size()) == set_->count) return set_->Digest();  // the whole file
    return kernels::Subset(*set_, rows_).Digest();
  }
  std::string buf = "folder:" + std::to_string(rows_.size()) + ":";
  for (int64_t r : rows_) {
    const size_t i = static_cast<size_t>(r);
    buf += ChecksumHex(ReadFile(folder_->files[i]));
    buf += ":" + std::to_string(folder_->labels[i]) + ",";
  }
  return ChecksumHex(buf);
}

std::string SplitSource::Where(int64_t i) const {
  if (i < 0 || i >= count()) return origin_;
  const int64_t r = rows_[static_cast<size_t>(i)];
  if (folder_) return folder_->files[static_cast<size_t>(r)];
  return origin_ + ", image " + std::to_string(r);
}

const std::string& SelectionSplit(const Pipeline& p) { return p.select_on; }

std::vector<std::string> SplitNames(const Pipeline& p, bool test) {
  std::vector<std::string> out = {"train"};
  if (p.validation) out.emplace_back("validation");
  if (test) out.emplace_back("test");
  return out;
}

namespace {

// Whether `split` is carved out of the training file (a validation split taken from train).
bool Carved(const Pipeline& p, const std::string& split) {
  return (split == "train" || split == "validation") && p.validation && p.validation->from_train();
}

const SplitSpec& SpecOf(const Pipeline& p, const std::string& split) {
  if (split != "train" && split != "validation" && split != "test")
    Throw(ErrorKind::kInternal, "OpenSplit: no split '" + split + "'");
  if (split == "validation" && !p.validation)
    Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": no validation split (/datasets/validation)");
  return split == "test" ? p.test : (split == "train" || Carved(p, split) ? p.train : *p.validation);
}

}  // namespace

SplitSource OpenSplit(const Pipeline& p, const std::string& split) { return SplitFrom(p, split, OpenBase(SpecOf(p, split))); }

namespace {

// "path size inode mtime_ns" of a file; a file that cannot be stat'ed is named as missing, so
// that the digest is computed (and the read fails with the usual message).
std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return path + " missing\n";
  return fmt::format("{} {} {} {}\n", path, static_cast<long long>(st.st_size), static_cast<unsigned long long>(st.st_ino),
                     static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec);
}

}  // namespace

std::string SplitStamp(const Pipeline& p, const std::string& split) {
  const SplitSpec& s = SpecOf(p, split);
  std::string out = fmt::format("msaflow.split-stamp/1 {} format={} limit={}\n", split, s.format, s.limit);
  if (Carved(p, split))
    out += fmt::format("carved from train: fraction={} seed={}\n", p.validation->fraction, p.validation->seed);
  if (split == "train" && s.subset())
    out += fmt::format("subset: fraction={} seed={} min_per_class={}\n", s.subset_fraction, s.subset_seed,
                       kSubsetMinPerClass);
  if (s.format == "folder") {
    const kernels::FolderListing l = kernels::ListImageFolder(s.root, s.limit);
    out += "folder " + s.root + "\n";
    for (size_t i = 0; i < l.files.size(); ++i) out += std::to_string(l.labels[i]) + " " + FileStamp(l.files[i]);
  } else {
    out += FileStamp(s.images) + FileStamp(s.labels);
  }
  return out;
}

std::vector<SplitSource> OpenSplits(const Pipeline& p, bool test) {
  std::vector<SplitSource> out;
  std::optional<Base> train;  // read once when validation is carved out of it
  for (const auto& split : SplitNames(p, test)) {
    if (!Carved(p, split)) {
      out.push_back(OpenSplit(p, split));
      continue;
    }
    if (!train) train = OpenBase(p.train);
    out.push_back(SplitFrom(p, split, *train));
  }
  return out;
}

SplitSource SplitFrom(const Pipeline& p, const std::string& split, const Base& b) {
  const bool carve = Carved(p, split);
  SplitSource s;
  s.name_ = split;
  s.origin_ = b.origin;
  s.set_ = b.set;
  s.folder_ = b.folder;
  s.class_names_ = b.class_names;
  if (carve) {
    // Stratified by class, seeded: the same rows on every rank and every run.
    const std::vector<bool> in_val = kernels::StratifiedSplit(b.labels, p.validation->fraction, p.validation->seed);
    for (size_t i = 0; i < b.labels.size(); ++i)
      if (in_val[i] == (split == "validation")) s.rows_.push_back(static_cast<int64_t>(i));
  } else {
    s.rows_.resize(b.labels.size());
    std::iota(s.rows_.begin(), s.rows_.end(), 0);
  }
  for (int64_t r : s.rows_) s.labels_.push_back(b.labels[static_cast<size_t>(r)]);
  if (split == "train" && p.train.subset()) {  // a stratified part of the split as carved
    s.whole_labels_ = std::make_shared<const std::vector<uint8_t>>(std::move(s.labels_));
    s.positions_ = s.SubsetPositions(p.train.subset_fraction, p.train.subset_seed);
    std::vector<int64_t> rows;
    rows.reserve(s.positions_.size());
    s.labels_.clear();
    for (int64_t pos : s.positions_) {
      rows.push_back(s.rows_[static_cast<size_t>(pos)]);
      s.labels_.push_back((*s.whole_labels_)[static_cast<size_t>(pos)]);
    }
    s.rows_ = std::move(rows);
  }
  return s;
}

std::vector<int64_t> SplitSource::Positions() const {
  if (whole_labels_) return positions_;
  std::vector<int64_t> all(rows_.size());
  std::iota(all.begin(), all.end(), 0);
  return all;
}

std::vector<int64_t> SplitSource::SubsetPositions(double fraction, uint64_t seed) const {
  const std::vector<uint8_t>& whole = whole_labels_ ? *whole_labels_ : labels_;
  if (fraction >= 1) {
    std::vector<int64_t> all(whole.size());
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return kernels::StratifiedSubset(whole, fraction, kSubsetMinPerClass, seed);
}

int64_t CheckSplits(const Pipeline& p, const std::vector<SplitSource>& splits) {
  auto bad = [&](const std::string& what) { Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": " + what); };
  int64_t classes = p.classes;
  for (const auto& s : splits) {
    if (s.count() == 0) bad("the " + s.name() + " split has no images (" + s.Where(-1) + ")");
    if (p.classes == 0)
      for (uint8_t l : s.labels()) classes = std::max<int64_t>(classes, l + 1);
  }
  for (const auto& s : splits)
    for (int64_t i = 0; i < s.count(); ++i)
      if (s.labels()[static_cast<size_t>(i)] >= classes)
        bad(s.Where(i) + ": label " + std::to_string(s.labels()[static_cast<size_t>(i)]) + " (the " + s.name() +
            " split's image " + std::to_string(i) + ") is outside 0.." + std::to_string(classes - 1) + " (" +
            std::to_string(classes) + " classes, /datasets/classes)");
  // A folder's classes are numbered in the sorted order of its class folders, so a split whose
  // folders differ from training's would give the same index to different classes.
  const SplitSource* train = nullptr;
  for (const auto& s : splits)
    if (s.name() == "train") train = &s;
  for (const auto& s : splits)
    if (train && &s != train && !train->class_names().empty() && !s.class_names().empty() &&
        s.class_names() != train->class_names())
      bad(fmt::format("the {} split's class folders ({}) are not the training split's ({}): a folder's classes are "
                      "numbered in the sorted order of their folders' names, so every split needs the same class folders",
                      s.name(), Printable(Join(s.class_names(), ", "), 200, true),
                      Printable(Join(train->class_names(), ", "), 200, true)));
  std::vector<bool> seen(static_cast<size_t>(classes), false);
  for (const auto& s : splits)
    if (s.name() == "train")
      for (uint8_t l : s.labels()) seen[l] = true;
  for (const auto& s : splits) {
    if (s.name() == "train") continue;
    for (int64_t i = 0; i < s.count(); ++i) {
      const uint8_t l = s.labels()[static_cast<size_t>(i)];
      if (!seen[l])
        bad(s.Where(i) + ": class " + std::to_string(l) + " (the " + s.name() + " split's image " + std::to_string(i) +
            ") never occurs in the training split; a model cannot learn it");
    }
  }
  return classes;
}

int64_t CheckDatasets(const Pipeline& p) { return CheckSplits(p, OpenSplits(p)); }

namespace {

// An image file's size and channels from its header: its first 64 KiB, or the whole file where
// a JPEG's metadata pushes its header further.
kernels::DecodedImage FileHeader(const std::string& path) {
  constexpr std::streamsize kPrefix = 64 << 10;
  std::ifstream f(path, std::ios::binary);
  if (!f) Throw(ErrorKind::kIo, path + ": cannot be read");
  std::string head(static_cast<size_t>(kPrefix), '\0');
  f.read(head.data(), kPrefix);
  head.resize(static_cast<size_t>(f.gcount()));
  if (f.gcount() < kPrefix) return kernels::ReadImageHeader(head, path);
  try {
    return kernels::ReadImageHeader(head, path);
  } catch (const Error&) {
    return kernels::ReadImageHeader(ReadFile(path), path);
  }
}

std::string SizeText(const kernels::DecodedImage& h) {
  return fmt::format("{} x {} {}", h.rows, h.cols, h.channels == 1 ? "gray" : "RGB");
}

// Raw pixels taken as read are as many features as an image has pixels: every image of every
// split needs the first one's size. Image folders are checked from their files' headers (IDX
// and .npy files hold images of one size by their format).
void CheckOneImageSize(const Pipeline& p, const std::vector<SplitSource>& splits) {
  const BackboneSpec* raw = nullptr;
  for (const auto& bb : p.backbones)
    if (!bb.prepared()) raw = &bb;
  if (!raw) return;
  std::optional<kernels::DecodedImage> first;
  std::string first_file;
  for (const auto& s : splits) {
    if (!s.folder()) continue;
    for (int64_t i = 0; i < s.count(); ++i) {
      const std::string file = s.Where(i);
      const kernels::DecodedImage h = FileHeader(file);
      if (!first) {
        first = h;
        first_file = file;
      } else if (h.rows != first->rows || h.cols != first->cols || h.channels != first->channels) {
        Throw(ErrorKind::kInvalidInput,
              fmt::format("pipeline {}: {}: backbone '{}' (raw pixels) needs images of one size, and {} is {} but {} is {}: give "
                          "the backbone an \"input\": {{\"height\": {}, \"width\": {}}} to resize every image to "
                          "one size", p.name, raw->pointer.empty() ? "/backbones" : raw->pointer, raw->name, first_file,
                          SizeText(*first), file, SizeText(h), first->rows, first->cols));
      }
    }
  }
}

}  // namespace

namespace {

// Every split with its labels and sizes, no pixel read.
std::vector<SplitSource> OpenSplitLabels(const Pipeline& p) {
  std::vector<SplitSource> splits;
  std::optional<Base> train;
  for (const auto& split : SplitNames(p)) {
    if (Carved(p, split)) {
      if (!train) train = OpenBase(p.train, /*pixels=*/false);
      splits.push_back(SplitFrom(p, split, *train));
    } else {
      splits.push_back(SplitFrom(p, split, OpenBase(SpecOf(p, split), /*pixels=*/false)));
    }
  }
  return splits;
}

}  // namespace

int64_t CountImages(const Pipeline& p) {
  int64_t n = 0;
  for (const auto& [_, count] : CountImagesPerSplit(p)) n += count;
  return n;
}

std::map<std::string, int64_t> CountImagesPerSplit(const Pipeline& p) {
  std::map<std::string, int64_t> n;
  for (const auto& s : OpenSplitLabels(p)) n[s.name()] += s.count();
  return n;
}

int64_t CheckDatasetLabels(const Pipeline& p) {
  const std::vector<SplitSource> splits = OpenSplitLabels(p);
  const int64_t classes = CheckSplits(p, splits);
  CheckOneImageSize(p, splits);
  return classes;
}

void CheckDatasetFiles(const Pipeline& p, const std::string& origin) {
  auto check = [&](const SplitSpec& s, const std::string& ptr) {
    if (s.from_train()) return;
    std::error_code ec;
    if (s.format == "folder") {
      if (!std::filesystem::exists(s.root, ec)) Throw(ErrorKind::kNotFound, origin + ": " + ptr + "/root: " + s.root + ": no such folder");
      if (!std::filesystem::is_directory(s.root, ec))
        Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + "/root: " + s.root + ": not a folder");
      return;
    }
    for (const auto& [key, path] : {std::pair{"images", &s.images}, std::pair{"labels", &s.labels}}) {
      if (!std::filesystem::exists(*path, ec)) Throw(ErrorKind::kNotFound, origin + ": " + ptr + "/" + key + ": " + *path + ": no such file");
      if (!std::filesystem::is_regular_file(*path, ec))
        Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + "/" + key + ": " + *path + ": not a file");
    }
  };
  check(p.train, "/datasets/train");
  check(p.test, "/datasets/test");
  if (p.validation) check(*p.validation, "/datasets/validation");
}

}  // namespace msaflow::workflow
