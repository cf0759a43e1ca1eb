#include "service/log.h"

#include <cstdio>
#include <mutex>

#include "record/journal.h"

namespace msaflow::service {

void Log(const std::string& event, nlohmann::json fields) {
  static std::mutex mu;
  nlohmann::json line = {{"time", record::JournalTime()}, {"event", event}};
  for (auto& [k, v] : fields.items()) line[k] = std::move(v);
  // Names and paths come from users: dump's replacement keeps a bad byte from ending the line.
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> l(mu);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace msaflow::service
