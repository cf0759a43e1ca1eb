// file://DIR — one file per object, DIR/<name>.nam, laid out as docs/nam.md says:
//   "MSANAM01" | u32 LE header length | header JSON | object bytes
// Puts write a temporary file, fsync it and rename it into place (atomic publish); a lock
// file (flock) orders concurrent puts of several processes so versions increase.
// List shows an object file that cannot be read (bad magic, header, size) with size 0, no
// checksum and meta {"damaged": why}, rather than failing the listing; Get of it is kCorrupt.
#pragma once

#include "nam/store.h"

namespace msaflow::nam {

inline constexpr char kFileMagic[] = "MSANAM01";  // format version 1 (docs/nam.md)

class FileStore : public Store {
 public:
  explicit FileStore(std::string dir);
  ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) override;
  Object Get(const std::string& name) override;
  ObjectInfo GetInto(const std::string& name, std::string& bytes) override;
  std::optional<ObjectInfo> Stat(const std::string& name) override;
  std::vector<ObjectInfo> List(const std::string& prefix) override;
  bool Remove(const std::string& name) override;
  std::string Uri() const override { return "file://" + dir_; }

  std::string PathOf(const std::string& name) const { return dir_ + "/" + name + ".nam"; }
  // Moves an object's file into DIR/DAMAGED/ (not an object name, so no longer listed or
  // read), keeping its path; returns where it went. kNotFound if there is no such file.
  std::string MoveAside(const std::string& name);
  const std::string& dir() const { return dir_; }

  // For the NAM server's persistence: writes an object file with the info the server chose
  // (version included), atomically; and reads the header (and the bytes if `bytes` is set)
  // of an object file. Throws kNotFound, or kCorrupt naming the file and the fault.
  void WriteObject(const ObjectInfo& info, std::string_view bytes);
  ObjectInfo ReadObject(const std::string& name, std::string* bytes);

 private:
  std::string dir_;
};

}  // namespace msaflow::nam
