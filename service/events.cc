#include "service/events.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

namespace msaflow::service {

std::shared_ptr<JournalFollowers::Tail> JournalFollowers::Get(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  auto& t = tails_[path];
  if (!t) t = std::make_shared<Tail>();
  return t;
}

std::vector<JournalLine> JournalFollowers::Since(const std::string& path, size_t after) {
  std::shared_ptr<Tail> t = Get(path);
  std::lock_guard<std::mutex> l(t->mu);
  // A stat on every call, the new bytes read once whoever asks. No throttle: a caller that saw
  // the run end must be given the journal's last lines, however recently another caller read.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<size_t>(st.st_size) != t->offset) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      f.seekg(0, std::ios::end);
      const auto size = static_cast<size_t>(f.tellg());
      if (size < t->offset) {  // replaced (not what journals do): read it again from the top
        t->offset = t->lines = 0;
        t->partial.clear();
        t->events.clear();
      }
      if (size > t->offset) {
        std::string chunk(size - t->offset, '\0');
        f.seekg(static_cast<std::streamoff>(t->offset));
        f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        chunk.resize(static_cast<size_t>(f.gcount()));
        t->offset += chunk.size();
        t->partial += chunk;
        size_t start = 0;
        for (size_t nl; (nl = t->partial.find('\n', start)) != std::string::npos; start = nl + 1) {
          ++t->lines;
          if (t->lines > 1 && nl > start) t->events.push_back({t->lines, t->partial.substr(start, nl - start)});
        }
        t->partial.erase(0, start);
      }
    }
  }
  auto from = std::upper_bound(t->events.begin(), t->events.end(), after,
                               [](size_t a, const JournalLine& e) { return a < e.line; });
  return {from, t->events.end()};
}

}  // namespace msaflow::service
