// The NAM store: named objects every step reads and writes. docs/nam.md is the contract.
//
// Names are `/`-joined segments of [a-z0-9._-] (no empty segment, no "." or ".."), at most
// 255 bytes, a segment at most 251. An object is bytes + small JSON metadata + an XXH3-64
// checksum of the bytes + a version that increases on every put of the same name. A put
// publishes atomically: readers see the whole old object or the whole new one. Every Get
// verifies the checksum and throws kCorrupt on mismatch.
//
// Backends: mem://NAME (process-local, for tests), file://DIR (a shared filesystem),
// fabric://HOST:PORT (the NAM server, `msaflow nam serve`; docs/nam-protocol.md).
// When MSAFLOW_NAM_FAULTS is set, OpenStore wraps the store in a FaultStore (nam/fault_store.h).
// Thread-safety: implementations are safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace msaflow::nam {

struct ObjectInfo {
  std::string name;
  uint64_t size = 0;
  std::string checksum;  // 16 hex digits, XXH3-64 of the bytes
  uint64_t version = 0;
  nlohmann::json meta = nlohmann::json::object();
};

struct Object {
  ObjectInfo info;
  std::string bytes;
};

class Store {
 public:
  virtual ~Store() = default;
  // Publishes `bytes` under `name`; returns the stored info (new version).
  virtual ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) = 0;
  // Throws kNotFound if absent, kCorrupt if the bytes fail their checksum.
  virtual Object Get(const std::string& name) = 0;
  // Like Get, into `bytes`, reusing its memory (no allocation when it is large enough).
  virtual ObjectInfo GetInto(const std::string& name, std::string& bytes);
  virtual std::optional<ObjectInfo> Stat(const std::string& name) = 0;
  // Objects whose name starts with `prefix`, sorted by name.
  virtual std::vector<ObjectInfo> List(const std::string& prefix) = 0;
  // Returns false if there was nothing to remove.
  virtual bool Remove(const std::string& name) = 0;
  virtual std::string Uri() const = 0;
};

// Names are at most kMaxName bytes, each segment at most kMaxSegment (segment + ".nam" is a
// file name on file:// stores, and file names end at 255 bytes).
inline constexpr size_t kMaxName = 255;
inline constexpr size_t kMaxSegment = 251;
// Throws kInvalidInput naming the problem ("NAM object name 'a//b': empty segment").
void ValidateObjectName(const std::string& name);
// An object's metadata: a JSON object (null reads as {}) of at most kMaxMeta bytes as compact
// JSON, on every store alike, so what fits in a mem:// or file:// NAM fits on the fabric too.
inline constexpr size_t kMaxMeta = size_t{16} * 1024;
// The metadata to store (null made {}); throws kInvalidInput naming the object and the size.
nlohmann::json CheckedMeta(const std::string& name, const nlohmann::json& meta);
bool IsObjectName(const std::string& name);

// Opens a store by URI. Throws kInvalidInput for an unknown scheme (with the known ones).
std::unique_ptr<Store> OpenStore(const std::string& uri);

}  // namespace msaflow::nam
