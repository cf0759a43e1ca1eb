// An image folder as torchvision's ImageFolder and Keras lay it out: root/<class>/<image>, PNG
// or JPEG; the class index is the position of the folder's name in sorted order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dataset.h"

namespace msaflow::kernels {

struct FolderListing {
  std::string root;
  std::vector<std::string> class_names;  // sorted
  std::vector<std::string> files;        // every image's path
  std::vector<uint8_t> labels;
};

// Lists root/<class>/*.{png,jpg,jpeg} (any case; hidden files and other files are skipped).
// Images are ordered round-robin over the classes (the first image of every class, then the
// second, ...; files sorted by name within a class), so that a `limit` (0 = all) keeps every
// class. Throws kNotFound for a missing root, kInvalidInput naming the folder or file for no
// class folders, a class folder without images, more than 256 classes, an empty file, or a file
// whose first bytes are neither PNG's nor JPEG's.
FolderListing ListImageFolder(const std::string& root, int64_t limit);

// Decodes the listed images `rows` (in that order) into an image set; each image keeps its own
// size and channels (gray or RGB).
ImageSet DecodeFolderRows(const FolderListing& l, const std::vector<int64_t>& rows);

}  // namespace msaflow::kernels
