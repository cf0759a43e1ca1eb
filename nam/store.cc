#include "nam/store.h"

#include "common/error.h"
#include "common/strings.h"
#include "nam/fabric_store.h"
#include "nam/fault_store.h"
#include "nam/file_store.h"
#include "nam/mem_store.h"
#include "nam/protocol.h"

namespace msaflow::nam {

void ValidateObjectName(const std::string& name) {
  auto bad = [&](const std::string& why) {
    Throw(ErrorKind::kInvalidInput, "NAM object name '" + Printable(name) + "': " + why);
  };
  if (name.empty()) bad("empty");
  if (name.size() > kMaxName) bad(std::to_string(name.size()) + " bytes, longer than " + std::to_string(kMaxName));
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    std::string seg = name.substr(start, end - start);
    if (seg.empty()) bad("empty segment (expected segments of [a-z0-9._-] joined by '/')");
    if (seg == "." || seg == "..") bad("segment '" + seg + "' is not allowed");
    if (seg.size() > kMaxSegment)
      bad("a segment of " + std::to_string(seg.size()) + " bytes, longer than " + std::to_string(kMaxSegment) +
          " (a segment is a file name, with \".nam\", in file:// stores and persist directories)");
    for (char c : seg) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!ok) bad("character '" + Printable(std::string(1, c)) + "' not allowed (expected [a-z0-9._-])");
    }
    start = end + 1;
  }
}

static_assert(kMaxMeta == wire::kMaxMeta, "every store keeps the wire's metadata limit");

nlohmann::json CheckedMeta(const std::string& name, const nlohmann::json& meta) {
  nlohmann::json m = meta.is_null() ? nlohmann::json::object() : meta;
  if (!m.is_object()) Throw(ErrorKind::kInvalidInput, "NAM put '" + name + "': metadata must be a JSON object");
  if (const size_t n = m.dump().size(); n > kMaxMeta)
    Throw(ErrorKind::kInvalidInput, "NAM put '" + name + "': metadata of " + std::to_string(n) +
                                        " bytes, larger than 16 KiB (" + std::to_string(kMaxMeta) + ")");
  return m;
}

bool IsObjectName(const std::string& name) {
  try {
    ValidateObjectName(name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

ObjectInfo Store::GetInto(const std::string& name, std::string& bytes) {
  Object o = Get(name);
  bytes.swap(o.bytes);
  return o.info;
}

namespace {

std::unique_ptr<Store> OpenPlain(const std::string& uri) {
  if (uri.rfind("mem://", 0) == 0) return std::make_unique<MemStore>(uri.substr(6));
  if (uri.rfind("file://", 0) == 0) {
    std::string dir = uri.substr(7);
    if (dir.empty()) Throw(ErrorKind::kInvalidInput, "NAM URI '" + uri + "': file:// needs a directory");
    return std::make_unique<FileStore>(dir);
  }
  if (uri.rfind("fabric://", 0) == 0) return std::make_unique<FabricStore>(uri);
  Throw(ErrorKind::kInvalidInput,
        "NAM URI '" + uri + "': unknown scheme; expected fabric://HOST:PORT, file://DIR or mem://NAME");
}

}  // namespace

std::unique_ptr<Store> OpenStore(const std::string& uri) {
  auto store = OpenPlain(uri);
  if (const char* f = std::getenv("MSAFLOW_NAM_FAULTS"); f && *f)
    return std::make_unique<FaultStore>(std::move(store), ParseFaultRules(f, "MSAFLOW_NAM_FAULTS"));
  return store;
}

}  // namespace msaflow::nam
