// Datasets as users hold them (issue 10): .npy arrays, PNG/JPEG decoding, the validation split,
// and the checks that refuse data no model can be trained or judged on, each with its message.
#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "kernels/image_codec.h"
#include "kernels/npy.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"

namespace msaflow::workflow {
namespace {

namespace fs = std::filesystem;

// A .npy file written the way numpy.save writes version 1.0.
std::string Npy(const std::string& descr, const std::string& shape, const std::string& body) {
  return kernels::NpyBytes(descr, shape, body);
}

std::string Int64s(const std::vector<int64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

class Datasets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("msaflow-datasets-" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string p = dir_ + "/" + name;
    WriteFileAtomic(p, bytes);
    return p;
  }
  // A pipeline over .npy files; `extra` goes into "datasets".
  Pipeline Npys(const std::string& extra, const std::string& select_on = "") {
    std::string text = R"({"name": "n", "datasets": {"train": {"format": "npy", "images": "tr-x.npy", "labels": "tr-y.npy"},
        "test": {"format": "npy", "images": "te-x.npy", "labels": "te-y.npy"})" + extra + R"(},
        "backbones": [{"name": "pixels", "kind": "pixels"}])" + select_on + "}";
    return ParsePipeline(text, "p.json", dir_);
  }
  std::string dir_;
};

TEST_F(Datasets, NpyImagesAndLabelsOfAnyIntegerType) {
  std::string px;
  for (int i = 0; i < 4 * 3 * 2 * 3; ++i) px += static_cast<char>(i);
  auto s = kernels::ReadNpy(Write("x.npy", Npy("|u1", "(4, 3, 2, 3)", px)), Write("y.npy", Npy("<i8", "(4,)", Int64s({0, 2, 1, 2}))), 0);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.rows, 3);
  EXPECT_EQ(s.cols, 2);
  EXPECT_EQ(s.channels, 3);
  EXPECT_EQ(s.labels, (std::vector<uint8_t>{0, 2, 1, 2}));
  EXPECT_EQ(s.Image(1)[0], 18);
  auto limited = kernels::ReadNpy(dir_ + "/x.npy", Write("y8.npy", Npy("|u1", "(4,)", std::string("\x00\x01\x02\x03", 4))), 2);
  EXPECT_EQ(limited.count, 2);
  EXPECT_EQ(limited.pixels.size(), 2u * 18);
}

TEST_F(Datasets, BadNpyFilesNameTheFileAndWhatWasExpected) {
  const std::string y = Write("y.npy", Npy("<i8", "(2,)", Int64s({0, 1})));
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(Write("f.npy", Npy("<f4", "(2, 2, 2)", std::string(32, 0))), y, 0); }),
            dir_ + "/f.npy: dtype '<f4'; images must be uint8 (|u1)");
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(Write("c.npy", Npy("|u1", "(2, 2, 2, 4)", std::string(32, 0))), y, 0); }),
            dir_ + "/c.npy: shape (2, 2, 2, 4): 4 channels; expected 1 (gray) or 3 (RGB)");
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(Write("s.npy", Npy("|u1", "(2, 2, 2)", std::string(7, 0))), y, 0); }),
            dir_ + "/s.npy: body has 7 bytes, the shape (2, 2, 2) needs 8");
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(Write("z.npy", Npy("|u1", "(2, 0, 2)", "")), y, 0); }),
            dir_ + "/z.npy: shape (2, 0, 2): images of size 0");
  const std::string x = Write("x.npy", Npy("|u1", "(2, 2, 2)", std::string(8, 0)));
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(x, Write("n.npy", Npy("<i8", "(2,)", Int64s({0, -1}))), 0); }),
            dir_ + "/n.npy: label -1 at index 1; labels must be 0..255 (class indices)");
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(x, Write("m.npy", Npy("<i8", "(3,)", Int64s({0, 1, 1}))), 0); }),
            dir_ + "/m.npy: 3 labels for 2 images in " + x);
  EXPECT_EQ(ErrorOf([&] { kernels::ReadNpy(Write("t.txt", "not numpy"), y, 0); }),
            dir_ + "/t.txt: not a .npy file (no \\x93NUMPY magic)");
}

// What the service's catalog lists: a .npy file's role from its header and size alone.
TEST_F(Datasets, PeekNpyTellsImagesFromLabelsFromNeither) {
  using kernels::NpyRole;
  auto peek = [&](const std::string& name, const std::string& bytes) { return kernels::PeekNpy(Write(name, bytes)); };
  const NpyRole images = peek("x.npy", Npy("|u1", "(2, 3, 3)", std::string(18, '\1')));
  EXPECT_EQ(images.kind, NpyRole::kImages);
  EXPECT_EQ(images.count, 2);
  const NpyRole labels = peek("y.npy", Npy("<i8", "(3,)", Int64s({0, 1, 2})));
  EXPECT_EQ(labels.kind, NpyRole::kLabels);
  EXPECT_EQ(labels.count, 3);
  EXPECT_EQ(peek("rgb.npy", Npy("|u1", "(1, 2, 2, 3)", std::string(12, '\0'))).kind, NpyRole::kImages);
  EXPECT_EQ(peek("f.npy", Npy("<f4", "(2, 3, 3)", std::string(72, '\0'))).kind, NpyRole::kNeither);
  EXPECT_EQ(peek("short.npy", Npy("|u1", "(2, 3, 3)", std::string(17, '\0'))).kind, NpyRole::kNeither);
  EXPECT_EQ(peek("shorty.npy", Npy("<i8", "(3,)", Int64s({0, 1}))).kind, NpyRole::kNeither);
  EXPECT_EQ(peek("floaty.npy", Npy("<f8", "(2,)", std::string(16, '\0'))).kind, NpyRole::kNeither);
  EXPECT_EQ(peek("2ch.npy", Npy("|u1", "(1, 2, 2, 2)", std::string(8, '\0'))).kind, NpyRole::kNeither);
  EXPECT_EQ(peek("text.npy", "not an array").kind, NpyRole::kNeither);
  EXPECT_EQ(kernels::PeekNpy(dir_ + "/none.npy").kind, NpyRole::kNeither);
}

TEST_F(Datasets, DecodesPngAndRefusesWhatIsNotAnImage) {
  // A 3 x 2 RGB PNG, written by libpng.
  std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9, 1, 2, 3, 200, 100, 50};
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = 3;
  img.height = 2;
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, rgb.data(), 0, nullptr));
  std::string bytes(size, '\0');
  ASSERT_TRUE(png_image_write_to_memory(&img, bytes.data(), &size, 0, rgb.data(), 0, nullptr));
  auto d = kernels::DecodeImage(bytes, "a.png");
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.cols, 3);
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.pixels, rgb);
  EXPECT_EQ(ErrorOf([&] { kernels::DecodeImage("", "e.png"); }), "e.png: an empty file (0 bytes)");
  EXPECT_EQ(ErrorOf([&] { kernels::DecodeImage("GIF89a....", "g.png"); }), "g.png: neither PNG nor JPEG (by its first bytes)");
  std::string truncated = bytes.substr(0, bytes.size() - 20);
  EXPECT_NE(ErrorOf([&] { kernels::DecodeImage(truncated, "t.png"); }).find("t.png: corrupt or truncated PNG"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { kernels::DecodeImage(std::string("\xff\xd8\xff\xe0 junk", 9), "j.jpg"); }).find("j.jpg: corrupt or truncated JPEG"),
            std::string::npos);
}

TEST_F(Datasets, ValidationFromTrainIsStratifiedSeededAndDisjoint) {
  std::vector<uint8_t> labels;
  for (int i = 0; i < 100; ++i) labels.push_back(static_cast<uint8_t>(i < 70 ? 0 : i < 99 ? 1 : 2));
  auto a = kernels::StratifiedSplit(labels, 0.1, 5), b = kernels::StratifiedSplit(labels, 0.1, 5),
       c = kernels::StratifiedSplit(labels, 0.1, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int per[3] = {0, 0, 0};
  for (size_t i = 0; i < labels.size(); ++i) per[labels[i]] += a[i];
  EXPECT_EQ(per[0], 7);  // 10 % of each class
  EXPECT_EQ(per[1], 3);
  EXPECT_EQ(per[2], 0);  // a class seen once stays in training
  // Through the pipeline: train and validation partition the training file.
  std::string px(100 * 4, 'x');
  std::vector<int64_t> l64(labels.begin(), labels.end());
  Write("tr-x.npy", Npy("|u1", "(100, 2, 2)", px));
  Write("tr-y.npy", Npy("<i8", "(100,)", Int64s(l64)));
  Write("te-x.npy", Npy("|u1", "(3, 2, 2)", std::string(12, 'y')));
  Write("te-y.npy", Npy("<i8", "(3,)", Int64s({0, 1, 2})));
  Pipeline p = Npys(R"(, "validation": {"from": "train", "fraction": 0.1, "seed": 5})");
  SplitSource tr = OpenSplit(p, "train"), va = OpenSplit(p, "validation"), te = OpenSplit(p, "test");
  EXPECT_EQ(tr.count(), 90);
  EXPECT_EQ(va.count(), 10);
  EXPECT_EQ(te.count(), 3);
  EXPECT_NE(tr.Digest(), va.Digest());
  EXPECT_EQ(va.Read(0, 10).count, 10);
  EXPECT_EQ(CheckDatasets(p), 3);
}

// A training subset (the halving strategy's growing rounds): stratified, at least 10 of a class,
// a smaller fraction's rows among a larger one's, a content digest and a stamp of its own.
TEST_F(Datasets, ATrainingSubsetIsStratifiedNestedAndKeyedApart) {
  std::vector<int64_t> l64;
  for (int i = 0; i < 300; ++i) l64.push_back(i < 200 ? 0 : i < 285 ? 1 : 2);  // 200, 85 and 15 images
  std::string px;
  for (int i = 0; i < 300; ++i) px += std::string(4, static_cast<char>(i));
  Write("tr-x.npy", Npy("|u1", "(300, 2, 2)", px));
  Write("tr-y.npy", Npy("<i8", "(300,)", Int64s(l64)));
  Write("te-x.npy", Npy("|u1", "(3, 2, 2)", std::string(12, 'y')));
  Write("te-y.npy", Npy("<i8", "(3,)", Int64s({0, 1, 2})));
  const std::string val = R"(, "validation": {"from": "train", "fraction": 0.2, "seed": 5})";
  Pipeline whole = Npys(val);
  auto with_subset = [&](double fraction) {
    Pipeline p = whole;
    p.train.subset_fraction = fraction;
    p.train.subset_seed = 3;
    return p;
  };
  const SplitSource all = OpenSplit(whole, "train");
  ASSERT_EQ(all.count(), 240);  // 160, 68 and 12 after the validation carve
  const SplitSource third = OpenSplit(with_subset(1.0 / 3), "train"), tenth = OpenSplit(with_subset(0.1), "train");
  int per[3] = {0, 0, 0};
  for (uint8_t l : third.labels()) ++per[l];
  EXPECT_EQ(per[0], 53);  // round(160 / 3)
  EXPECT_EQ(per[1], 23);
  EXPECT_EQ(per[2], 10);  // at least 10 of a class
  std::fill(per, per + 3, 0);
  for (uint8_t l : tenth.labels()) ++per[l];
  EXPECT_EQ(per[0], 16);
  EXPECT_EQ(per[1], 10);
  EXPECT_EQ(per[2], 10);
  // Nested: the tenth's rows are among the third's, each row the whole split's at its position.
  const std::vector<int64_t> p3 = third.Positions(), p10 = tenth.Positions();
  EXPECT_TRUE(std::includes(p3.begin(), p3.end(), p10.begin(), p10.end()));
  EXPECT_EQ(third.whole_count(), 240);
  EXPECT_EQ(all.SubsetPositions(1.0 / 3, 3), p3);
  EXPECT_EQ(tenth.SubsetPositions(1.0 / 3, 3), p3);
  EXPECT_NE(all.SubsetPositions(1.0 / 3, 4), p3);  // another seed, other rows
  const kernels::ImageSet sub = third.Read(0, third.count()), full = all.Read(0, all.count());
  for (size_t i = 0; i < p3.size(); ++i) {
    ASSERT_EQ(std::memcmp(sub.Image(static_cast<int64_t>(i)), full.Image(p3[i]), 4), 0) << i;
    ASSERT_EQ(third.labels()[i], all.labels()[static_cast<size_t>(p3[i])]) << i;
  }
  EXPECT_EQ(all.Positions().size(), 240u);
  EXPECT_EQ(all.SubsetPositions(1, 3), all.Positions());
  // Its own content key and stamp; validation and test are not touched.
  EXPECT_NE(third.Digest(), all.Digest());
  EXPECT_NE(third.Digest(), tenth.Digest());
  EXPECT_NE(SplitStamp(with_subset(1.0 / 3), "train"), SplitStamp(whole, "train"));
  EXPECT_EQ(SplitStamp(with_subset(1.0 / 3), "validation"), SplitStamp(whole, "validation"));
  EXPECT_EQ(OpenSplit(with_subset(0.1), "validation").Digest(), OpenSplit(whole, "validation").Digest());
  EXPECT_EQ(CheckDatasets(with_subset(0.1)), 3);
  // From the pipeline's JSON, on the training split only.
  const std::string text = R"({"name": "n", "datasets": {"train": {"format": "npy", "images": "tr-x.npy", "labels": "tr-y.npy",
      "subset": {"fraction": 0.5, "seed": 9}}, "test": {"format": "npy", "images": "te-x.npy", "labels": "te-y.npy"}},
      "select_on": "test", "backbones": [{"name": "pixels", "kind": "pixels"}]})";
  const Pipeline j = ParsePipeline(text, "p.json", dir_);
  EXPECT_EQ(j.train.subset_fraction, 0.5);
  EXPECT_EQ(j.train.subset_seed, 9u);
  EXPECT_EQ(OpenSplit(j, "train").count(), 153);  // 100 + 43 + 8, but at least 10 of the third class
  std::string bad = text;
  bad.replace(bad.find("\"te-y.npy\""), 10, R"("te-y.npy", "subset": {"fraction": 0.5})");
  EXPECT_EQ(ErrorOf([&] { ParsePipeline(bad, "p.json", dir_); }),
            "p.json: /datasets/test/subset: only the training split (/datasets/train) can be a subset");
  bad = text;
  bad.replace(bad.find("0.5"), 3, "0");
  EXPECT_EQ(ErrorOf([&] { ParsePipeline(bad, "p.json", dir_); }),
            "p.json: /datasets/train/subset/fraction: 0 is out of range; expected 0.001..1");
}

TEST_F(Datasets, LabelsNoModelCanLearnAreRefusedNamingFileAndImage) {
  Write("tr-x.npy", Npy("|u1", "(4, 2, 2)", std::string(16, 'x')));
  Write("tr-y.npy", Npy("<i8", "(4,)", Int64s({0, 1, 0, 1})));
  Write("te-x.npy", Npy("|u1", "(3, 2, 2)", std::string(12, 'y')));
  Write("te-y.npy", Npy("<i8", "(3,)", Int64s({1, 2, 0})));
  const std::string so = R"(, "select_on": "test")";
  EXPECT_EQ(ErrorOf([&] { CheckDatasets(Npys("", so)); }),
            "pipeline n: " + dir_ + "/te-x.npy, image 1: class 2 (the test split's image 1) never occurs in the training "
                                    "split; a model cannot learn it");
  EXPECT_EQ(ErrorOf([&] { CheckDatasets(Npys(R"(, "classes": 2)", so)); }),
            "pipeline n: " + dir_ + "/te-x.npy, image 1: label 2 (the test split's image 1) is outside 0..1 (2 classes, "
                                    "/datasets/classes)");
  Write("va-x.npy", Npy("|u1", "(0, 2, 2)", ""));
  Write("va-y.npy", Npy("<i8", "(0,)", ""));
  EXPECT_EQ(ErrorOf([&] {
              CheckDatasets(Npys(R"(, "validation": {"format": "npy", "images": "va-x.npy", "labels": "va-y.npy"})"));
            }),
            "pipeline n: the validation split has no images (" + dir_ + "/va-x.npy)");
}

TEST_F(Datasets, APipelineWithoutValidationMustSaySelectOnTest) {
  EXPECT_EQ(ErrorOf([&] { Npys(""); }),
            "p.json: /datasets: no validation split to select models on; add \"validation\": {\"from\": \"train\", "
            "\"fraction\": 0.1} (or a split of its own), or say \"select_on\": \"test\" to select on the test split (the "
            "reported accuracy is then optimistic)");
  EXPECT_EQ(Npys("", R"(, "select_on": "test")").select_on, "test");
  EXPECT_EQ(ErrorOf([&] { Npys(R"(, "validation": {"from": "train", "fraction": 1.5})"); }),
            "p.json: /datasets/validation/fraction: 1.5 is out of range; expected 0.001..0.9");
  EXPECT_EQ(ErrorOf([&] { CheckDatasetFiles(Npys(R"(, "validation": {"from": "train", "fraction": 0.1})"), "p.json"); }),
            "p.json: /datasets/train/images: " + dir_ + "/tr-x.npy: no such file");
}

TEST_F(Datasets, ImageFoldersListClassesInOrderAndRefuseEmptyOnes) {
  fs::create_directories(dir_ + "/f/zebra");
  fs::create_directories(dir_ + "/f/ant");
  fs::create_directories(dir_ + "/f/.hidden");
  Write("f/zebra/b.png", std::string("\x89PNG\r\n\x1a\n", 8));
  Write("f/zebra/a.jpg", "\xff\xd8\xff");
  Write("f/ant/x.JPEG", "\xff\xd8\xff");
  Write("f/ant/notes.txt", "skipped");
  auto l = kernels::ListImageFolder(dir_ + "/f", 0);
  EXPECT_EQ(l.class_names, (std::vector<std::string>{"ant", "zebra"}));
  // Round-robin over the classes, so a limit keeps every class.
  EXPECT_EQ(l.files, (std::vector<std::string>{dir_ + "/f/ant/x.JPEG", dir_ + "/f/zebra/a.jpg", dir_ + "/f/zebra/b.png"}));
  EXPECT_EQ(l.labels, (std::vector<uint8_t>{0, 1, 1}));
  Write("f/zebra/empty.png", "");
  EXPECT_EQ(ErrorOf([&] { kernels::ListImageFolder(dir_ + "/f", 0); }), dir_ + "/f/zebra/empty.png: an empty file (0 bytes)");
  fs::remove(dir_ + "/f/zebra/empty.png");
  Write("f/zebra/c.png", "GIF89a");
  EXPECT_EQ(ErrorOf([&] { kernels::ListImageFolder(dir_ + "/f", 0); }), dir_ + "/f/zebra/c.png: neither PNG nor JPEG (by its first bytes)");
  fs::remove(dir_ + "/f/zebra/c.png");
  fs::create_directories(dir_ + "/f/moth");
  EXPECT_EQ(ErrorOf([&] { kernels::ListImageFolder(dir_ + "/f", 0); }),
            dir_ + "/f/moth: class 'moth' has no .png, .jpg or .jpeg images");
}

// Issue 32: class names are shown and recorded as text, so a folder's must be UTF-8.
TEST_F(Datasets, AClassFolderWhoseNameIsNotUtf8IsRefused) {
  fs::create_directories(dir_ + "/f/caf\xe9");
  Write("f/caf\xe9/a.png", std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(ErrorOf([&] { kernels::ListImageFolder(dir_ + "/f", 0); }),
            dir_ + "/f: the class folder 'caf\\xe9' has a name that is not UTF-8; class names are shown and recorded as "
                   "text, so rename it");
  fs::rename(dir_ + "/f/caf\xe9", dir_ + "/f/caf\xc3\xa9");
  EXPECT_EQ(kernels::ListImageFolder(dir_ + "/f", 0).class_names, std::vector<std::string>{"caf\xc3\xa9"});
}

// A folder's classes are numbered by the sorted names of its class folders: a test folder
// without one of training's classes would shift every later label onto the wrong class.
TEST_F(Datasets, FolderSplitsMustHaveTheTrainingSplitsClassFolders) {
  const std::string png("\x89PNG\r\n\x1a\n", 8);  // listing reads only an image's first bytes
  for (const char* f : {"tr/ant/a.png", "tr/bee/a.png", "tr/moth/a.png", "te/ant/a.png", "te/moth/a.png"}) {
    fs::create_directories(fs::path(dir_ + "/" + f).parent_path());
    Write(f, png);
  }
  const std::string text = R"({"name": "n", "datasets": {"train": {"format": "folder", "root": "tr"},
      "test": {"format": "folder", "root": "te"}}, "select_on": "test", "backbones": [{"name": "pixels", "kind": "pixels"}]})";
  EXPECT_EQ(ErrorOf([&] { CheckDatasets(ParsePipeline(text, "p.json", dir_)); }),
            "pipeline n: the test split's class folders (ant, moth) are not the training split's (ant, bee, moth): a "
            "folder's classes are numbered in the sorted order of their folders' names, so every split needs the same "
            "class folders");
  fs::create_directories(dir_ + "/te/bee");
  Write("te/bee/a.png", png);
  EXPECT_EQ(CheckDatasets(ParsePipeline(text, "p.json", dir_)), 3);
}

TEST(Backbones, AFixedBatchOrSizeIsNamedWithTheBackboneAndFile) {
  kernels::Graph g;
  g.input_dims = {1, 3, 224, 224};
  BackboneSpec bb;
  bb.name = "inception";
  bb.onnx = "models/x.onnx";
  bb.input.channels = 3;
  bb.input.height = bb.input.width = 224;
  EXPECT_EQ(ErrorOf([&] { CheckBackboneInput(g, bb); }),
            "backbone 'inception': models/x.onnx has a fixed batch size of 1; export it with a dynamic batch dimension "
            "(or set input.batch: 1)");
  bb.input.batch = 1;
  EXPECT_EQ(ErrorOf([&] { CheckBackboneInput(g, bb); }), "no error");
  bb.input.height = 96;
  EXPECT_EQ(ErrorOf([&] { CheckBackboneInput(g, bb); }),
            "backbone 'inception': models/x.onnx takes inputs of 3 x 224 x 224 (channels x height x width, -1 = any); "
            "the pipeline's input is 3 x 96 x 224");
  g.input_dims = {-1, 3, -1, -1};
  bb.input.batch = 0;
  EXPECT_EQ(ErrorOf([&] { CheckBackboneInput(g, bb); }), "no error");
}

}  // namespace
}  // namespace msaflow::workflow
