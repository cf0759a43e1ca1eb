#include "nam/mem_store.h"

#include "common/checksum.h"
#include "common/error.h"

namespace msaflow::nam {

MemStore::MemStore(const std::string& name) : name_(name) {
  static std::mutex registry_mu;
  static std::map<std::string, std::weak_ptr<Space>> registry;
  std::lock_guard<std::mutex> l(registry_mu);
  space_ = registry[name].lock();
  if (!space_) {
    space_ = std::make_shared<Space>();
    registry[name] = space_;
  }
}

ObjectInfo MemStore::Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) {
  ValidateObjectName(name);
  auto obj = std::make_shared<Object>();
  obj->bytes.assign(bytes);
  obj->info.name = name;
  obj->info.size = bytes.size();
  obj->info.checksum = ChecksumHex(bytes);
  obj->info.meta = CheckedMeta(name, meta);
  std::lock_guard<std::mutex> l(space_->mu);
  obj->info.version = ++space_->versions[name];
  space_->objects[name] = obj;
  return obj->info;
}

Object MemStore::Get(const std::string& name) {
  Object o;
  o.info = GetInto(name, o.bytes);
  return o;
}

ObjectInfo MemStore::GetInto(const std::string& name, std::string& bytes) {
  ValidateObjectName(name);
  std::shared_ptr<const Object> obj;
  {
    std::lock_guard<std::mutex> l(space_->mu);
    auto it = space_->objects.find(name);
    if (it == space_->objects.end()) Throw(ErrorKind::kNotFound, "NAM " + Uri() + ": no object '" + name + "'");
    obj = it->second;
  }
  if (ChecksumHex(obj->bytes) != obj->info.checksum)
    Throw(ErrorKind::kCorrupt, "NAM " + Uri() + ": object '" + name + "' fails its checksum (stored " +
                                   obj->info.checksum + ", bytes hash to " + ChecksumHex(obj->bytes) + ")");
  bytes.assign(obj->bytes);  // reuses the caller's memory when it is large enough
  return obj->info;
}

std::optional<ObjectInfo> MemStore::Stat(const std::string& name) {
  ValidateObjectName(name);
  std::lock_guard<std::mutex> l(space_->mu);
  auto it = space_->objects.find(name);
  if (it == space_->objects.end()) return std::nullopt;
  return it->second->info;
}

std::vector<ObjectInfo> MemStore::List(const std::string& prefix) {
  std::lock_guard<std::mutex> l(space_->mu);
  std::vector<ObjectInfo> out;
  for (auto it = space_->objects.lower_bound(prefix); it != space_->objects.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(it->second->info);
  }
  return out;
}

bool MemStore::Remove(const std::string& name) {
  ValidateObjectName(name);
  std::lock_guard<std::mutex> l(space_->mu);
  return space_->objects.erase(name) > 0;
}

void MemStore::CorruptForTest(const std::string& name, size_t offset) {
  std::lock_guard<std::mutex> l(space_->mu);
  auto copy = std::make_shared<Object>(*space_->objects.at(name));
  copy->bytes.at(offset) ^= 0x5a;
  space_->objects[name] = copy;
}

}  // namespace msaflow::nam
