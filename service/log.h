// The service's log: one JSON object a line on stderr for each thing it does to a run (admitted,
// started, ended, resumed on its own start, cancelled, refused) and for each HTTP request
// answered (method, path without its query, status, user, milliseconds). An operator reading the
// log after an incident sees what happened, in order; `jq` reads it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace msaflow::service {

// Writes {"time": ..., "event": event, ...fields} as one line (whole lines, from any thread).
void Log(const std::string& event, nlohmann::json fields);

}  // namespace msaflow::service
