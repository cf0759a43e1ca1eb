// The NAM server (`msaflow nam serve`): a memory pool registered with libfabric, a control
// path over messages and object bytes moved by RMA. docs/nam-protocol.md is the contract.
//
// One thread runs the event loop: it receives requests, replies, drives the provider's
// progress (tcp needs the target to keep reading its completion queue), expires sessions
// that stopped talking, and stops when `stop` becomes true.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "common/clock.h"

namespace msaflow::nam {

struct ServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  uint64_t capacity = 1ull << 30;
  std::string persist_dir;  // "" = memory only
  double lock_wait_s = 0;   // wait this long for another server to let go of persist_dir
  std::string token_file;   // "" = no token (loopback only)
  std::string provider = "tcp";
  std::string ready_file;   // written (JSON: uri, pid) once the server accepts requests
  // Runs hold a shared lock on this file while they use the server; once none does (checked
  // four times a second), the server stops, removing its ready file before it lets go of the lock.
  std::string users_lock;
  double lease_s = 60;      // a session silent this long is dropped with its pins and puts
  bool allow_map = true;    // offer same-node clients the pool mapping
  bool verbose = false;     // one log line per request
  // Time for the sessions' leases, the sweeps and the persist lock's wait; null: the real clock
  // (a test may give a ManualClock and move it past a lease).
  Clock* clock = nullptr;
  std::FILE* log = stderr;
};

class Server {
 public:
  // Opens the endpoint and the pool and reloads the persisted objects. Throws
  // kInvalidInput (options), kUnavailable (cannot listen), kIo (persist directory).
  explicit Server(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // fabric://HOST:PORT (with ?provider=... unless tcp): what clients open.
  std::string Uri() const;
  void Run(const std::atomic<bool>& stop);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Splits "HOST:PORT" ("[::1]:7000" for IPv6). Throws kInvalidInput naming `what`.
void SplitHostPort(const std::string& text, const std::string& what, std::string* host, std::string* port);
bool IsLoopbackHost(const std::string& host);

}  // namespace msaflow::nam
