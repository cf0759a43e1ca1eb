#include "nam/fault_store.h"

#include <atomic>

#include <chrono>
#include <thread>

#include "common/checksum.h"
#include "common/error.h"

namespace msaflow::nam {

std::vector<FaultRule> ParseFaultRules(const std::string& text, const std::string& origin) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) Throw(ErrorKind::kInvalidInput, origin + ": expected a JSON array of fault rules");
  std::vector<FaultRule> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& r = j[i];
    std::string where = origin + ": [" + std::to_string(i) + "]";
    if (!r.is_object()) Throw(ErrorKind::kInvalidInput, where + ": expected an object");
    FaultRule f;
    for (const auto& item : r.items()) {
      const std::string& k = item.key();
      const auto& v = item.value();  // named, not a structured binding: lambdas capture it
      auto bad = [&](const std::string& expected) {
        Throw(ErrorKind::kInvalidInput, where + "." + k + ": expected " + expected + ", got " + v.dump());
      };
      if (k == "op") {
        if (!v.is_string()) bad("a string");
        f.op = v;
        if (f.op != "put" && f.op != "get" && f.op != "stat" && f.op != "list" && f.op != "remove" && f.op != "any")
          bad("put, get, stat, list, remove or any");
      } else if (k == "prefix") {
        if (!v.is_string()) bad("a string");
        f.prefix = v;
      } else if (k == "action") {
        if (!v.is_string() || (v != "fail" && v != "delay" && v != "corrupt")) bad("fail, delay or corrupt");
        f.action = v;
      } else if (k == "nth") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1) bad("an integer >= 1");
        f.nth = v;
      } else if (k == "count") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) bad("an integer >= 0");
        f.count = v;
      } else if (k == "delay_ms") {
        if (!v.is_number() || v.get<double>() < 0) bad("milliseconds >= 0");
        f.delay_ms = v;
      } else if (k == "kind") {
        if (!v.is_string() || (v != "unavailable" && v != "io" && v != "capacity" && v != "not-found"))
          bad("unavailable, io, capacity or not-found");
        f.kind = v;
      } else {
        Throw(ErrorKind::kInvalidInput, where + ": unknown field '" + k +
                                            "' (expected op, prefix, action, nth, count, delay_ms, kind)");
      }
    }
    if (f.action.empty()) Throw(ErrorKind::kInvalidInput, where + ": missing field 'action'");
    if (f.action == "corrupt" && f.op != "get") Throw(ErrorKind::kInvalidInput, where + ": 'corrupt' applies to op \"get\"");
    out.push_back(f);
  }
  return out;
}

namespace {
std::atomic<Clock*> delay_clock{nullptr};
Clock& DelayClock() {
  Clock* c = delay_clock.load();
  return c ? *c : SystemClock();
}
}  // namespace

void SetFaultDelayClock(Clock* clock) { delay_clock.store(clock); }

FaultStore::FaultStore(std::unique_ptr<Store> inner, std::vector<FaultRule> rules)
    : inner_(std::move(inner)), rules_(std::move(rules)) {}

int64_t FaultStore::fired() const {
  std::lock_guard<std::mutex> l(mu_);
  return fired_;
}

bool FaultStore::Before(const char* op, const std::string& name) {
  double delay = 0;
  bool corrupt = false;
  const FaultRule* fail = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& r : rules_) {
      if (r.op != "any" && r.op != op) continue;
      if (name.compare(0, r.prefix.size(), r.prefix) != 0) continue;
      int64_t k = ++r.seen;
      if (k < r.nth || (r.count > 0 && k >= r.nth + r.count)) continue;
      ++fired_;
      if (r.action == "delay") delay += r.delay_ms;
      if (r.action == "corrupt") corrupt = true;
      if (r.action == "fail" && !fail) fail = &r;
    }
  }
  if (delay > 0) DelayClock().Sleep(std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double, std::milli>(delay)));
  if (fail) {
    ErrorKind kind = fail->kind == "io" ? ErrorKind::kIo
                     : fail->kind == "capacity" ? ErrorKind::kCapacity
                     : fail->kind == "not-found" ? ErrorKind::kNotFound
                                                 : ErrorKind::kUnavailable;
    Throw(kind, "NAM " + Uri() + ": " + op + " '" + name + "' failed (injected fault)");
  }
  return corrupt;
}

ObjectInfo FaultStore::Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) {
  Before("put", name);
  return inner_->Put(name, bytes, meta);
}

ObjectInfo FaultStore::GetInto(const std::string& name, std::string& bytes) {
  bool corrupt = Before("get", name);
  ObjectInfo info = inner_->GetInto(name, bytes);
  if (corrupt) {
    // As if a byte flipped on the way: the check every get makes catches it.
    if (bytes.empty()) bytes.push_back('\0');
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x20);
    std::string got = ChecksumHex(bytes);
    if (got != info.checksum)
      Throw(ErrorKind::kCorrupt, "NAM " + Uri() + ": object '" + name + "' fails its checksum (stored " +
                                     info.checksum + ", bytes hash to " + got + ") [injected fault]");
  }
  return info;
}

Object FaultStore::Get(const std::string& name) {
  Object o;
  o.info = GetInto(name, o.bytes);
  return o;
}

std::optional<ObjectInfo> FaultStore::Stat(const std::string& name) {
  Before("stat", name);
  return inner_->Stat(name);
}

std::vector<ObjectInfo> FaultStore::List(const std::string& prefix) {
  Before("list", prefix);
  return inner_->List(prefix);
}

bool FaultStore::Remove(const std::string& name) {
  Before("remove", name);
  return inner_->Remove(name);
}

}  // namespace msaflow::nam
