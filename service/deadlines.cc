#include "service/deadlines.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <set>
#include <vector>

namespace msaflow::service {
namespace {

// The address (as cpp-httplib writes a request's remote_addr) and port of `sa`; port -1 when it
// is not an internet address.
std::pair<std::string, int> AddressOf(const sockaddr_storage& sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(sa);
    ::inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return {text, ntohs(in.sin_port)};
  }
  if (sa.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(sa);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    return {text, ntohs(in6.sin6_port)};
  }
  return {"", -1};
}

// The peer of connected socket `fd`, or port -1.
std::pair<std::string, int> PeerOf(int fd) {
  sockaddr_storage sa{};
  socklen_t n = sizeof sa;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &n) != 0) return {"", -1};
  return AddressOf(sa);
}

// The local port of socket `fd`, or -1.
int LocalPortOf(int fd) {
  sockaddr_storage sa{};
  socklen_t n = sizeof sa;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &n) != 0) return -1;
  return AddressOf(sa).second;
}

}  // namespace

void Deadlines::Start(int listen_fd) {
  if (thread_.joinable() || listen_fd < 0) return;
  thread_ = std::thread([this, listen_fd] { Loop(listen_fd); });
}

void Deadlines::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Deadlines::Set(const std::string& addr, int port, Phase phase) {
  std::lock_guard<std::mutex> l(mu_);
  Conn& c = conns_[{addr, port}];
  c.since = Now();
  c.phase = phase;
}

void Deadlines::ScanOnce(int listen_fd) {
  const int port = LocalPortOf(listen_fd);
  if (port >= 0) Scan(static_cast<uint16_t>(port));
}

void Deadlines::Loop(int listen_fd) {
  const int port = LocalPortOf(listen_fd);
  if (port < 0) return;
  std::unique_lock<std::mutex> l(mu_);
  while (!wake_.wait_for(l, std::chrono::milliseconds(500), [&] { return stop_; })) {
    l.unlock();
    Scan(static_cast<uint16_t>(port));
    l.lock();
  }
}

void Deadlines::Scan(uint16_t local_port) {
  // The service's connections: sockets of this process accepted on the listener's port (the
  // service's own connections elsewhere, to a NAM server, have other local ports).
  std::vector<std::pair<int, std::pair<std::string, int>>> live;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (!end || *end || end == e->d_name || fd == own) continue;
      struct stat st {};
      if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      if (LocalPortOf(static_cast<int>(fd)) != local_port) continue;
      auto peer = PeerOf(static_cast<int>(fd));  // the listener has none
      if (peer.second >= 0) live.emplace_back(static_cast<int>(fd), std::move(peer));
    }
    ::closedir(d);
  }
  std::vector<std::pair<int, std::pair<std::string, int>>> late;
  {
    std::lock_guard<std::mutex> l(mu_);
    const double now = Now();
    std::set<std::pair<std::string, int>> present;
    for (const auto& [fd, peer] : live) {
      auto [it, fresh] = conns_.try_emplace(peer);
      if (fresh) it->second.since = now;  // opened since the last look: its headers are due
      it->second.seen = true;
      present.insert(peer);
      Conn& c = it->second;
      const double limit = c.phase == Phase::kHeaders ? headers_s_
                           : c.phase == Phase::kBody  ? body_s_
                                                      : std::numeric_limits<double>::infinity();
      if (!c.cut && now - c.since > limit) {
        late.emplace_back(fd, peer);
        c.cut = true;  // once: its socket may linger until its worker closes it
      }
    }
    // Connections gone; and what a handler told of a connection no scan found (it closed in
    // between) once it is old.
    for (auto it = conns_.begin(); it != conns_.end();)
      it = !present.count(it->first) && (it->second.seen || now - it->second.since > 5) ? conns_.erase(it)
                                                                                          : std::next(it);
  }
  // Shut down through a duplicate of the descriptor, checked first: the socket checked is then
  // the socket shut down. On `fd` itself, its worker could close it between the check and the
  // shutdown and a new connection take its number, and the new one would be cut.
  for (const auto& [fd, peer] : late) {
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);  // CLOEXEC: a run started meanwhile inherits none
    if (own < 0) continue;                            // closed since the scan
    if (LocalPortOf(own) == local_port && PeerOf(own) == peer && ::shutdown(own, SHUT_RDWR) == 0) ++cut_;
    ::close(own);  // the last reference only if the worker closed its own meanwhile: that socket was done
  }
}

}  // namespace msaflow::service
