#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "nam/file_store.h"
#include "nam/mem_store.h"

namespace msaflow::nam {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/msaflow-nam-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ErrorKind KindOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;
}

void Exercise(Store& s) {
  EXPECT_FALSE(s.Stat("a/b").has_value());
  EXPECT_EQ(KindOf([&] { s.Get("a/b"); }), ErrorKind::kNotFound);
  auto i1 = s.Put("a/b", "hello", {{"k", 1}});
  EXPECT_EQ(i1.version, 1u);
  auto i2 = s.Put("a/b", "world!", {{"k", 2}});
  EXPECT_EQ(i2.version, 2u);
  Object o = s.Get("a/b");
  EXPECT_EQ(o.bytes, "world!");
  EXPECT_EQ(o.info.meta["k"], 2);
  EXPECT_EQ(o.info.size, 6u);
  s.Put("a/c", std::string(1 << 20, 'x'), nullptr);
  s.Put("b/z", "", nullptr);
  auto all = s.List("a/");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "a/b");
  EXPECT_EQ(all[1].name, "a/c");
  EXPECT_EQ(s.Get("b/z").bytes, "");
  EXPECT_TRUE(s.Remove("a/b"));
  EXPECT_FALSE(s.Remove("a/b"));
  EXPECT_EQ(s.List("").size(), 2u);
}

TEST(Nam, MemStore) {
  MemStore s("nam-test-1");
  Exercise(s);
  MemStore shared("nam-test-1");  // the same name sees the same objects
  EXPECT_TRUE(shared.Stat("a/c").has_value());
}

TEST(Nam, FileStore) {
  TempDir d;
  FileStore s(d.path());
  Exercise(s);
}

TEST(Nam, NamesAreValidated) {
  MemStore s("nam-test-names");
  for (const std::string& bad : std::vector<std::string>{"", "/a", "a/", "a//b", "a/../b", "A", "a b", "x/./y", std::string(300, 'a')}) {
    EXPECT_EQ(KindOf([&] { s.Put(bad, "x", nullptr); }), ErrorKind::kInvalidInput) << bad;
  }
  try {
    s.Put("a//b", "x", nullptr);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "NAM object name 'a//b': empty segment (expected segments of [a-z0-9._-] joined by '/')");
  }
}

// Issue 14: names of 251-255 bytes failed on file:// with "File name too long" (the
// temporary file's suffix); now any name that validates can be stored, and a segment too
// long for a file name is refused by validation on every store.
TEST(Nam, LongestNamesWorkOnFileStores) {
  TempDir d;
  FileStore s(d.path());
  for (const std::string& name : {std::string(251, 'a'), std::string(120, 'b') + "/" + std::string(134, 'c'),
                                   std::string(127, 'd') + "/" + std::string(127, 'e')}) {
    ASSERT_LE(name.size(), 255u);
    s.Put(name, "x" + name, nullptr);
    EXPECT_EQ(s.Get(name).bytes, "x" + name);
  }
  MemStore m("nam-test-long");
  EXPECT_EQ(KindOf([&] { m.Put(std::string(252, 'a'), "x", nullptr); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(KindOf([&] { s.Put(std::string(252, 'a'), "x", nullptr); }), ErrorKind::kInvalidInput);
}

// Issue 14: a name with a newline split the error over two lines; one with a NUL was cut.
TEST(Nam, BadNamesAreQuotedOnOneLine) {
  MemStore s("nam-test-quoting");
  for (const std::string& bad : {std::string("a\nb"), std::string("a\0b", 3), std::string(100000, 'A')}) {
    try {
      s.Put(bad, "x", nullptr);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.find('\0'), std::string::npos);
      EXPECT_LT(what.size(), 300u) << what;
    }
  }
  try {
    s.Put(std::string("a\0b", 3), "x", nullptr);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "NAM object name 'a\\x00b': character '\\x00' not allowed (expected [a-z0-9._-])");
  }
  try {
    s.Put("x\ny", "x", nullptr);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "NAM object name 'x\\ny': character '\\n' not allowed (expected [a-z0-9._-])");
  }
}

// Issue 14: one damaged header made `nam ls` of its whole prefix fail.
TEST(Nam, ListingShowsADamagedObjectInsteadOfFailing) {
  TempDir d;
  FileStore s(d.path());
  s.Put("p/a", "1", nullptr);
  s.Put("p/b", "2", nullptr);
  s.Put("p/c", "3", nullptr);
  std::string path = s.PathOf("p/b"), bytes = ReadFile(path);
  bytes.replace(0, 4, "JUNK");
  WriteFileAtomic(path, bytes);
  auto all = s.List("p/");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].checksum.size(), 16u);
  EXPECT_EQ(all[1].name, "p/b");
  ASSERT_TRUE(all[1].meta.contains("damaged"));
  EXPECT_NE(all[1].meta["damaged"].get<std::string>().find("bad magic"), std::string::npos);
  EXPECT_EQ(all[2].name, "p/c");
  EXPECT_EQ(KindOf([&] { s.Get("p/b"); }), ErrorKind::kCorrupt);
  // Moved aside, it is no longer an object: listed no more, read as missing.
  std::string to = s.MoveAside("p/b");
  EXPECT_EQ(to, d.path() + "/DAMAGED/p/b.nam");
  EXPECT_EQ(s.List("p/").size(), 2u);
  EXPECT_EQ(s.List("").size(), 2u);  // DAMAGED/ holds no objects
  EXPECT_EQ(KindOf([&] { s.Get("p/b"); }), ErrorKind::kNotFound);
}

// A header longer than the first 64 KiB read (large metadata) is read whole, for Stat and
// List too (they once reported such an object as corrupt); a header length that runs past the
// file is corrupt before anything is allocated for it.
TEST(Nam, FileStoreHeadersOfAnyLengthAndLyingLengths) {
  TempDir d;
  FileStore s(d.path());
  // Put refuses metadata over 16 KiB; a file written before that limit can hold more.
  s.Put("big/meta", "body", {{"pad", "m"}});
  nlohmann::json meta = {{"pad", std::string(100000, 'm')}};
  {
    const std::string old = ReadFile(s.PathOf("big/meta"));
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(old[8 + i])) << (8 * i);
    nlohmann::json h = nlohmann::json::parse(old.substr(12, len));
    h["meta"] = meta;
    const std::string header = h.dump();
    std::string bytes = old.substr(0, 8);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
    WriteFileAtomic(s.PathOf("big/meta"), bytes + header + old.substr(12 + len));
  }
  EXPECT_EQ(s.Stat("big/meta")->meta, meta);
  EXPECT_EQ(s.Get("big/meta").bytes, "body");
  ASSERT_EQ(s.List("big/").size(), 1u);
  EXPECT_FALSE(s.List("big/")[0].meta.contains("damaged"));
  s.Put("lie/len", "x", nullptr);
  std::string path = s.PathOf("lie/len"), bytes = ReadFile(path);
  bytes.replace(8, 4, std::string("\xff\xff\xff\x7f", 4));  // a header of 2 GiB
  WriteFileAtomic(path, bytes);
  EXPECT_EQ(KindOf([&] { s.Stat("lie/len"); }), ErrorKind::kCorrupt);
  EXPECT_EQ(KindOf([&] { s.Get("lie/len"); }), ErrorKind::kCorrupt);
}

// Metadata of more than 16 KiB (as compact JSON) is refused by every store, as the fabric's
// server refuses it: a run that fits a file:// NAM fits a fabric:// one. Nothing is written.
TEST(Nam, MetadataOver16KiBIsRefusedByEveryStore) {
  TempDir d;
  MemStore mem("nam-test-meta");
  FileStore file(d.path());
  for (Store* s : {static_cast<Store*>(&mem), static_cast<Store*>(&file)}) {
    nlohmann::json fits = {{"pad", ""}};
    fits["pad"] = std::string(kMaxMeta - fits.dump().size(), 'm');
    ASSERT_EQ(fits.dump().size(), kMaxMeta);
    EXPECT_EQ(s->Put("meta/fits", "x", fits).meta, fits);
    nlohmann::json over = fits;
    over["pad"] = over["pad"].get<std::string>() + "m";
    try {
      s->Put("meta/over", "x", over);
      ADD_FAILURE() << "metadata of " << over.dump().size() << " bytes was stored";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_STREQ(e.what(), "NAM put 'meta/over': metadata of 16385 bytes, larger than 16 KiB (16384)");
    }
    EXPECT_FALSE(s->Stat("meta/over").has_value());
    EXPECT_EQ(KindOf([&] { s->Put("meta/list", "x", nlohmann::json::array()); }), ErrorKind::kInvalidInput);
  }
}

TEST(Nam, ChangedByteOnDiskIsDetectedOnRead) {
  TempDir d;
  FileStore s(d.path());
  s.Put("model/x", std::string(1000, 'm'), {{"a", 1}});
  std::string path = s.PathOf("model/x");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('z');
  }
  try {
    s.Get("model/x");
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("object 'model/x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
  // A truncated file is corrupt too, not a short read.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  EXPECT_EQ(KindOf([&] { s.Get("model/x"); }), ErrorKind::kCorrupt);
}

TEST(Nam, MemCorruptionIsDetected) {
  MemStore s("nam-test-corrupt");
  s.Put("x", "abcdef", nullptr);
  s.CorruptForTest("x", 2);
  EXPECT_EQ(KindOf([&] { s.Get("x"); }), ErrorKind::kCorrupt);
}

TEST(Nam, PutLeavesNoTemporaryFiles) {
  TempDir d;
  FileStore s(d.path());
  for (int i = 0; i < 5; ++i) s.Put("k/v", std::to_string(i), nullptr);
  int files = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(d.path()))
    if (e.is_regular_file() && e.path().filename() != ".lock") ++files;
  EXPECT_EQ(files, 1);
  EXPECT_EQ(s.Get("k/v").info.version, 5u);
}

TEST(Nam, OpenStoreRejectsUnknownScheme) {
  try {
    OpenStore("s3://bucket");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "NAM URI 's3://bucket': unknown scheme; expected fabric://HOST:PORT, file://DIR or mem://NAME");
  }
}

}  // namespace
}  // namespace msaflow::nam
