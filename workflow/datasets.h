// The dataset splits as the steps read them (train, validation, test; docs/pipeline.md): any
// format (IDX, .npy, image folder), the validation split taken from the training split when
// the pipeline says so, and the checks every split must pass before anything is trained.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dataset.h"
#include "kernels/image_folder.h"
#include "workflow/pipeline.h"

namespace msaflow::workflow {

struct Base;  // the file or folder behind a split (datasets.cc)

class SplitSource {
 public:
  const std::string& name() const { return name_; }
  int64_t count() const { return static_cast<int64_t>(rows_.size()); }
  const std::vector<uint8_t>& labels() const { return labels_; }
  const std::vector<std::string>& class_names() const { return class_names_; }
  // Rows [lo, hi) of the split with their pixels (an image folder decodes only those).
  kernels::ImageSet Read(int64_t lo, int64_t hi) const;
  // The split's rows `rows` (in that order) with their pixels.
  kernels::ImageSet ReadRows(const std::vector<int64_t>& rows) const;
  // The content key of the split: its images' bytes and labels (an image folder's files are
  // hashed, not decoded). IDX sets keep the key they always had.
  std::string Digest() const;
  // Where row i came from: "<file>" (folders) or "<images file>, image <k>".
  std::string Where(int64_t i) const;
  // An image folder (whose images may differ in size), not an IDX or .npy file.
  bool folder() const { return folder_ != nullptr; }
  // A training split that is a subset (SplitSpec::subset): its rows' positions in the whole split
  // (ascending), and the whole split's size. Without a subset: 0..count-1, and count.
  std::vector<int64_t> Positions() const;
  int64_t whole_count() const { return static_cast<int64_t>(whole_labels_ ? whole_labels_->size() : rows_.size()); }
  // The positions in the whole split of its subset of `fraction` (seeded as SplitSpec::subset_seed
  // is): the same rows as a split opened with that subset; all of them for a fraction of 1.
  std::vector<int64_t> SubsetPositions(double fraction, uint64_t seed) const;

 private:
  friend SplitSource SplitFrom(const Pipeline& p, const std::string& split, const Base& b);
  std::string name_, origin_;
  std::shared_ptr<const kernels::ImageSet> set_;     // idx, npy: the whole file (after its limit)
  std::shared_ptr<const kernels::FolderListing> folder_;
  std::vector<int64_t> rows_;                        // split row -> row of the set or listing
  // A subset: the whole split's labels, and each row's position among them.
  std::shared_ptr<const std::vector<uint8_t>> whole_labels_;
  std::vector<int64_t> positions_;
  std::vector<uint8_t> labels_;
  std::vector<std::string> class_names_;
};

// "train", "validation" or "test". Throws kInvalidInput for a pipeline without that split.
SplitSource OpenSplit(const Pipeline& p, const std::string& split);
// What a split's content digest (SplitSource::Digest) depends on, found without reading any
// image: the split's spec (format, files, limit, the validation carve) and every file's path,
// size, inode and modification time (an image folder is listed, not decoded). Steps cache the
// digest under it (StepContext::DatasetDigest, modules/step_context.h).
std::string SplitStamp(const Pipeline& p, const std::string& split);
// Every split of `p` (SplitNames order; without test when `test` is false); a validation split
// taken from train shares the one read of the training file.
std::vector<SplitSource> OpenSplits(const Pipeline& p, bool test = true);
// `split` over an opened file or folder (internal to datasets.cc; OpenSplit and OpenSplits).
SplitSource SplitFrom(const Pipeline& p, const std::string& split, const Base& b);

// The splits a pipeline has, in the order they are prepared: train, [validation], test (left out
// when `test` is false: a round that holds the test split back, workflow::TaskSpec::test).
std::vector<std::string> SplitNames(const Pipeline& p, bool test = true);
// The split candidates are selected on: "validation", or "test" when the pipeline says so.
const std::string& SelectionSplit(const Pipeline& p);

// Every split has images; no label is outside 0..classes-1 (classes from the pipeline, else
// 1 + the largest label anywhere); every class of the validation and test splits was seen in
// training. Throws kInvalidInput naming the split's file and the image; returns the classes.
int64_t CheckSplits(const Pipeline& p, const std::vector<SplitSource>& splits);
// Opens every split of `p` (labels; IDX and .npy files are read) and checks them as above:
// what a run does before it starts anything.
int64_t CheckDatasets(const Pipeline& p);
// The same checks from the labels alone: IDX and .npy image headers (magic, shape, dtype, the
// .npy body's size), label files whole, image folders listed with every file's first bytes
// (PNG or JPEG) and no empty class; no pixel is read or decoded; with a raw-pixels backbone that
// takes images as read, every folder image's header shows one size. What `validate` runs.
int64_t CheckDatasetLabels(const Pipeline& p);
// The images of every split (train, validation, test) as CheckDatasetLabels counts them: from
// the files' headers and labels, no pixel read.
int64_t CountImages(const Pipeline& p);
// The same, per split: {"train": n, "validation": n, "test": n} (the splits the pipeline has).
std::map<std::string, int64_t> CountImagesPerSplit(const Pipeline& p);
// What `validate` can check without reading the data: every dataset file exists and is a file,
// every image folder a folder. Throws kNotFound / kInvalidInput naming `origin` and the pointer.
void CheckDatasetFiles(const Pipeline& p, const std::string& origin);

}  // namespace msaflow::workflow
