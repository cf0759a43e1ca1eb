#include "service/events.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace msaflow::service {

std::shared_ptr<JournalFollowers::Tail> JournalFollowers::Get(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  auto& t = tails_[path];
  if (!t) t = std::make_shared<Tail>(path);
  return t;
}

std::vector<JournalLine> JournalFollowers::Since(const std::string& path, size_t after) {
  std::shared_ptr<Tail> t = Get(path);
  std::lock_guard<std::mutex> l(t->mu);
  // The follower stats the file on every call and reads its new bytes once, whoever asks. No
  // throttle: a caller that saw the run end must be given the journal's last lines, however
  // recently another caller read.
  if (t->error.empty()) try {
      for (const record::JournalEvent& e : t->journal.Next()) t->events.push_back({e.line, e.fields.dump()});
    } catch (const Error& e) {
      t->error = e.what();
      std::fprintf(stderr, "msaflow serve: %s (its event stream ends there)\n", e.what());
    }
  auto from = std::upper_bound(t->events.begin(), t->events.end(), after,
                               [](size_t a, const JournalLine& e) { return a < e.line; });
  return {from, t->events.end()};
}

}  // namespace msaflow::service
