// Whole-request deadlines for `msaflow serve`. cpp-httplib 0.11's read timeout holds for one
// recv at a time: a client that sends a byte every few seconds ("slow loris") kept a
// connection, and one of the service's workers, for ever, and 160 of them took every worker.
// A watchdog looks at the service's connections (the sockets whose local port is the
// listener's) twice a second and shuts down one whose request headers have not all come within
// `headers_s` of the connection opening or of its last response, or whose body has not come
// within `body_s` of its headers. A request whose handler runs (an event stream, a long infer)
// has no deadline. Connections are told apart by their peer's address and port, which the
// request handlers see too.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/clock.h"

namespace msaflow::service {

class Deadlines {
 public:
  // Deadlines are read on `clock` (a test's ManualClock: exact, without waiting); the watchdog's
  // looks come every 0.5 s of real time.
  Deadlines(double headers_s, double body_s, Clock& clock = SystemClock())
      : headers_s_(headers_s), body_s_(body_s), clock_(clock) {}
  ~Deadlines() { Stop(); }
  Deadlines(const Deadlines&) = delete;
  Deadlines& operator=(const Deadlines&) = delete;

  // Watches the connections accepted on `listen_fd` until Stop().
  void Start(int listen_fd);
  void Stop();

  // A request's headers are in (its body is still to come).
  void HeadersIn(const std::string& addr, int port) { Set(addr, port, Phase::kBody); }
  // Its handler runs: no deadline until its response has gone.
  void Handling(const std::string& addr, int port) { Set(addr, port, Phase::kHandler); }
  // Its response has gone: the connection may wait for its next request's headers.
  void Answered(const std::string& addr, int port) { Set(addr, port, Phase::kHeaders); }

  // Connections shut down so far, for the service's own log and tests.
  int64_t cut() const { return cut_; }

  // One look at the connections accepted on `listen_fd`, as the watchdog takes twice a second:
  // for a test that moves the clock itself instead of Start().
  void ScanOnce(int listen_fd);

 private:
  enum class Phase { kHeaders, kBody, kHandler };
  struct Conn {
    double since = 0;  // when this phase began
    Phase phase = Phase::kHeaders;
    bool seen = false;  // found by a scan (not only told of by a handler)
    bool cut = false;   // shut down
  };
  void Set(const std::string& addr, int port, Phase phase);
  void Scan(uint16_t local_port);
  void Loop(int listen_fd);

  double Now() { return clock_.NowSeconds(); }

  const double headers_s_, body_s_;
  Clock& clock_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, Conn> conns_;  // by peer address and port
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<int64_t> cut_{0};
  std::thread thread_;
};

}  // namespace msaflow::service
