// A store that notes every object put through it (name, size, checksum, version) and the bytes
// moved each way, and passes everything on to the store it wraps. A module step runs on one, so that when it ends it can
// say exactly what it committed (modules/steps.h, the task's done object).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "nam/store.h"

namespace msaflow::nam {

class RecordingStore : public Store {
 public:
  explicit RecordingStore(std::unique_ptr<Store> inner) : owned_(std::move(inner)), inner_(owned_.get()) {}
  // Over a store the caller keeps (and keeps alive while this one is used).
  explicit RecordingStore(Store& inner) : inner_(&inner) {}
  ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) override {
    ObjectInfo info = inner_->Put(name, bytes, meta);
    std::lock_guard<std::mutex> lock(mu_);
    puts_.push_back({info.name, info.size, info.checksum, info.version, nlohmann::json::object()});
    put_bytes_ += bytes.size();
    return info;
  }
  Object Get(const std::string& name) override {
    Object o = inner_->Get(name);
    got_bytes_ += o.bytes.size();
    return o;
  }
  ObjectInfo GetInto(const std::string& name, std::string& bytes) override {
    ObjectInfo info = inner_->GetInto(name, bytes);
    got_bytes_ += info.size;
    return info;
  }
  std::optional<ObjectInfo> Stat(const std::string& name) override { return inner_->Stat(name); }
  std::vector<ObjectInfo> List(const std::string& prefix) override { return inner_->List(prefix); }
  bool Remove(const std::string& name) override {
    const bool removed = inner_->Remove(name);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = puts_.begin(); it != puts_.end();)  // put and removed again: not an output
      it = it->name == name ? puts_.erase(it) : it + 1;
    return removed;
  }
  std::string Uri() const override { return inner_->Uri(); }

  // What was put and not removed since, in order (metadata left out).
  std::vector<ObjectInfo> Puts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return puts_;
  }
  // Bytes moved to and from the NAM through this store.
  uint64_t put_bytes() const { return put_bytes_; }
  uint64_t got_bytes() const { return got_bytes_; }

 private:
  std::unique_ptr<Store> owned_;
  Store* inner_;
  mutable std::mutex mu_;
  std::vector<ObjectInfo> puts_;
  std::atomic<uint64_t> put_bytes_{0}, got_bytes_{0};
};

}  // namespace msaflow::nam
