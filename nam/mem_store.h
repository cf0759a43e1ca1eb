// mem://NAME — objects in this process's memory; stores opened with the same NAME share them.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "nam/store.h"

namespace msaflow::nam {

class MemStore : public Store {
 public:
  explicit MemStore(const std::string& name);
  ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) override;
  Object Get(const std::string& name) override;
  ObjectInfo GetInto(const std::string& name, std::string& bytes) override;
  std::optional<ObjectInfo> Stat(const std::string& name) override;
  std::vector<ObjectInfo> List(const std::string& prefix) override;
  bool Remove(const std::string& name) override;
  std::string Uri() const override { return "mem://" + name_; }

  // Test hook: flips one byte of a stored object, as a memory fault would.
  void CorruptForTest(const std::string& name, size_t offset);

  struct Space {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const Object>> objects;
    std::map<std::string, uint64_t> versions;
  };

 private:
  std::string name_;
  std::shared_ptr<Space> space_;
};

}  // namespace msaflow::nam
