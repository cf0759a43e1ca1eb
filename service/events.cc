#include "service/events.h"

#include <algorithm>
#include <chrono>
#include <fstream>

namespace msaflow::service {

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::shared_ptr<JournalFollowers::Tail> JournalFollowers::Get(const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  auto& t = tails_[path];
  if (!t) t = std::make_shared<Tail>();
  return t;
}

std::vector<JournalLine> JournalFollowers::Since(const std::string& path, size_t after) {
  std::shared_ptr<Tail> t = Get(path);
  std::lock_guard<std::mutex> l(t->mu);
  const double now = Now();
  if (now - t->read_at > 0.05) {  // at most 20 reads a second, whoever asks
    t->read_at = now;
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
