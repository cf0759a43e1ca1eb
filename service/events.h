// Journals followed as they grow, for the event streams: each journal's new bytes are read once
// however many clients follow it, and each client asks for the events
// after the last one it got. An event's id is its line in the journal (the format line is 1).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace msaflow::service {

struct JournalLine {
  size_t line = 0;
  std::string text;  // the journal's JSON object, as written
};

class JournalFollowers {
 public:
  // The complete lines of `path` after line `after` (none while it does not exist).
  std::vector<JournalLine> Since(const std::string& path, size_t after);

 private:
  struct Tail {
    std::mutex mu;
    size_t offset = 0, lines = 0;  // bytes and lines read
    std::string partial;           // a line not finished yet
    std::vector<JournalLine> events;
  };
  std::shared_ptr<Tail> Get(const std::string& path);
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Tail>> tails_;
};

}  // namespace msaflow::service
