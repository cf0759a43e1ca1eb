// Journals followed as they grow, for the event streams: each journal's new bytes are read once
// (record::JournalFollower) however many clients follow it, and each client asks for the events
// after the last one it got. An event's id is its line in the journal (the format line is 1).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "record/journal.h"

namespace msaflow::service {

struct JournalLine {
  size_t line = 0;
  std::string text;  // the journal's JSON object, as written
};

class JournalFollowers {
 public:
  // The complete lines of `path` after line `after` (none while it does not exist). A line that
  // is not an event ends what is given of that journal (the stream then ends with the run).
  std::vector<JournalLine> Since(const std::string& path, size_t after);

 private:
  struct Tail {
    explicit Tail(const std::string& path) : journal(path) {}
    std::mutex mu;
    record::JournalFollower journal;  // record/'s follower: the new lines read once for all clients
    std::vector<JournalLine> events;
    std::string error;  // the journal's bad line, once met
  };
  std::shared_ptr<Tail> Get(const std::string& path);
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Tail>> tails_;
};

}  // namespace msaflow::service
