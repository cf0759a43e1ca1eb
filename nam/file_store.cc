#include "nam/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"

namespace msaflow::nam {
namespace {

class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    fd_ = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) ThrowErrno("open " + dir + "/.lock");
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      ThrowErrno("lock " + dir + "/.lock");
    }
  }
  ~DirLock() { ::close(fd_); }

 private:
  int fd_;
};

constexpr size_t kMagicLen = 8;

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  MakeDirs(dir_);
}

ObjectInfo FileStore::Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) {
  ValidateObjectName(name);
  DirLock lock(dir_);
  ObjectInfo info;
  info.name = name;
  info.size = bytes.size();
  info.checksum = ChecksumHex(bytes);
  info.meta = CheckedMeta(name, meta);
  info.version = 1;
  std::string path = PathOf(name);
  if (PathExists(path)) {
    try {
      info.version = ReadObject(name, nullptr).version + 1;
    } catch (const Error&) {
      info.version = 1;  // an unreadable old object is replaced
    }
  }
  WriteObject(info, bytes);
  return info;
}

void FileStore::WriteObject(const ObjectInfo& info, std::string_view bytes) {
  nlohmann::json h = {{"name", info.name}, {"size", info.size}, {"checksum", info.checksum},
                      {"version", info.version}, {"meta", info.meta}};
  std::string head(kFileMagic, kMagicLen);
  std::string header = h.dump();
  uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < 4; ++i) head.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  head += header;
  WriteFileAtomic(PathOf(info.name), {head, bytes});
}

ObjectInfo FileStore::ReadObject(const std::string& name, std::string* bytes) {
  std::string path = PathOf(name);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) Throw(ErrorKind::kNotFound, "NAM " + Uri() + ": no object '" + name + "'");
    ThrowErrno("open " + path);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  auto read_at = [&](char* out, size_t len, uint64_t off) {
    for (size_t done = 0; done < len;) {
      ssize_t n = ::pread(fd, out + done, len - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) ThrowErrno("read " + path);
      if (n == 0) return done;
      done += static_cast<size_t>(n);
    }
    return len;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) ThrowErrno("stat " + path);
  const uint64_t total = static_cast<uint64_t>(st.st_size);
  // The header (headers are small; the length field says how small), then with `bytes` the
  // body straight into the caller's buffer: no copy of the whole file, no fresh allocation.
  std::string file(static_cast<size_t>(std::min<uint64_t>(total, 1 << 16)), '\0');
  file.resize(read_at(file.data(), file.size(), 0));
  auto corrupt = [&](const std::string& why) {
    Throw(ErrorKind::kCorrupt, "NAM " + Uri() + ": object '" + name + "' (" + path + ") is corrupt: " + why);
  };
  if (file.size() < kMagicLen + 4 || std::memcmp(file.data(), kFileMagic, kMagicLen) != 0)
    corrupt("bad magic (expected " + std::string(kFileMagic) + ")");
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(file[kMagicLen + static_cast<size_t>(i)])) << (8 * i);
  // The length is checked against the file before anything is allocated for it.
  if (kMagicLen + 4 + uint64_t{len} > total) corrupt("header length " + std::to_string(len) + " runs past the end");
  if (kMagicLen + 4 + len > file.size()) {  // a header longer than the first read: the rest of it
    const size_t had = file.size();
    file.resize(kMagicLen + 4 + static_cast<size_t>(len));
    if (read_at(file.data() + had, file.size() - had, had) != file.size() - had) corrupt("the file ended while it was read");
  }
  nlohmann::json h = nlohmann::json::parse(file.begin() + kMagicLen + 4, file.begin() + kMagicLen + 4 + len, nullptr, false);
  if (h.is_discarded() || !h.is_object() || !h.contains("checksum") || !h.contains("size")) corrupt("unreadable header");
  ObjectInfo info;
  try {
    info.name = h.at("name").get<std::string>();
    info.size = h.at("size").get<uint64_t>();
    info.checksum = h.at("checksum").get<std::string>();
    info.version = h.at("version").get<uint64_t>();
    info.meta = h.at("meta");
  } catch (const nlohmann::json::exception&) {
    corrupt("header fields of the wrong type");
  }
  if (info.name != name) corrupt("header names '" + info.name + "'");
  if (bytes) {
    const uint64_t start = kMagicLen + 4 + len;
    const uint64_t body = total >= start ? total - start : 0;
    if (body != info.size) corrupt("body has " + std::to_string(body) + " bytes, header says " + std::to_string(info.size));
    bytes->resize(static_cast<size_t>(body));
    if (read_at(bytes->data(), bytes->size(), start) != bytes->size()) corrupt("the file ended while it was read");
    std::string got = ChecksumHex(*bytes);
    if (got != info.checksum) corrupt("checksum mismatch (stored " + info.checksum + ", bytes hash to " + got + ")");
  }
  return info;
}

Object FileStore::Get(const std::string& name) {
  Object o;
  o.info = GetInto(name, o.bytes);
  return o;
}

ObjectInfo FileStore::GetInto(const std::string& name, std::string& bytes) {
  ValidateObjectName(name);
  if (!PathExists(PathOf(name))) Throw(ErrorKind::kNotFound, "NAM " + Uri() + ": no object '" + name + "'");
  return ReadObject(name, &bytes);
}

std::optional<ObjectInfo> FileStore::Stat(const std::string& name) {
  ValidateObjectName(name);
  if (!PathExists(PathOf(name))) return std::nullopt;
  return ReadObject(name, nullptr);
}

std::vector<ObjectInfo> FileStore::List(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    std::string rel = std::filesystem::relative(it->path(), dir_).string();
    if (rel.size() < 4 || rel.compare(rel.size() - 4, 4, ".nam") != 0) continue;
    std::string name = rel.substr(0, rel.size() - 4);
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!IsObjectName(name)) continue;  // not an object file (DAMAGED/, a foreign file)
    try {
      out.push_back(ReadObject(name, nullptr));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kNotFound) continue;  // removed while listing
      if (e.kind() != ErrorKind::kCorrupt) throw;
      ObjectInfo damaged;
      damaged.name = name;
      damaged.meta = {{"damaged", e.what()}};
      out.push_back(std::move(damaged));
    }
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.name < b.name; });
  return out;
}

std::string FileStore::MoveAside(const std::string& name) {
  ValidateObjectName(name);
  DirLock lock(dir_);
  const std::string from = PathOf(name);
  std::string to = dir_ + "/DAMAGED/" + name + ".nam";
  MakeDirs(std::filesystem::path(to).parent_path().string());
  for (int i = 1; PathExists(to); ++i) to = dir_ + "/DAMAGED/" + name + ".nam." + std::to_string(i);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    if (errno == ENOENT) Throw(ErrorKind::kNotFound, "NAM " + Uri() + ": no object '" + name + "'");
    ThrowErrno("rename " + from + " -> " + to);
  }
  return to;
}

bool FileStore::Remove(const std::string& name) {
  ValidateObjectName(name);
  DirLock lock(dir_);
  if (::unlink(PathOf(name).c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  ThrowErrno("remove " + PathOf(name));
}

}  // namespace msaflow::nam
