// A store that injects faults into another: fail, delay or corrupt chosen calls, on demand.
// Tests of the modules use it to check that a step whose NAM misbehaves stops with one clear
// error and leaves nothing half-written.
//
// Rules come from code, or from the environment: MSAFLOW_NAM_FAULTS holds a JSON array, and
// OpenStore() then wraps every store it opens, e.g.
//   [{"op": "get", "prefix": "features/", "action": "corrupt"},
//    {"op": "put", "prefix": "model/", "action": "fail", "nth": 2, "kind": "unavailable"},
//    {"op": "any", "action": "delay", "delay_ms": 50, "count": 0}]
// A rule applies to calls `op` (put, get, stat, list, remove or any) on names starting with
// `prefix`, from its `nth` matching call (1 = the first) for `count` calls (0 = all later).
// "fail" throws an error of `kind` (unavailable, io, capacity, not-found; default
// unavailable) before the call reaches the store; "delay" sleeps `delay_ms` first;
// "corrupt" flips one byte of what a get returns, which the checksum check then reports.
#pragma once

#include <memory>
#include <mutex>

#include "common/clock.h"
#include "nam/store.h"

namespace msaflow::nam {

// The clock "delay" sleeps on: SystemClock, or a test's (a ManualClock makes delays instant and
// exactly measurable). The stores MSAFLOW_NAM_FAULTS wraps are made deep inside the steps, so
// this is process-wide; null restores SystemClock.
void SetFaultDelayClock(Clock* clock);

struct FaultRule {
  std::string op = "any";
  std::string prefix;
  std::string action;
  int64_t nth = 1;
  int64_t count = 1;
  double delay_ms = 0;
  std::string kind = "unavailable";
  int64_t seen = 0;  // matching calls so far
};

// Parses the MSAFLOW_NAM_FAULTS format; throws kInvalidInput naming the rule and field.
std::vector<FaultRule> ParseFaultRules(const std::string& text, const std::string& origin);

class FaultStore : public Store {
 public:
  FaultStore(std::unique_ptr<Store> inner, std::vector<FaultRule> rules);
  ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) override;
  Object Get(const std::string& name) override;
  ObjectInfo GetInto(const std::string& name, std::string& bytes) override;
  std::optional<ObjectInfo> Stat(const std::string& name) override;
  std::vector<ObjectInfo> List(const std::string& prefix) override;
  bool Remove(const std::string& name) override;
  std::string Uri() const override { return inner_->Uri(); }

  Store& inner() { return *inner_; }
  // How many faults have fired.
  int64_t fired() const;

 private:
  // Applies fail/delay rules; returns true if a get's bytes are to be corrupted.
  bool Before(const char* op, const std::string& name);
  std::unique_ptr<Store> inner_;
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;
  int64_t fired_ = 0;
};

}  // namespace msaflow::nam
