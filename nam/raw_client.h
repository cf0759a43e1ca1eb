// A client that sends hand-made NAM protocol messages and waits for the replies: for the tests
// and the fuzzer of the server's message handling (nam::FabricStore is the real client).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nam/fabric.h"
#include "nam/protocol.h"

namespace msaflow::nam {

class RawClient {
 public:
  explicit RawClient(const std::string& uri);  // fabric://HOST:PORT[?provider=...]

  struct Reply {
    int status = -1;  // wire::Status, or -1 when no reply came in time
    uint16_t op = 0;
    uint64_t session = 0;
    std::string json;
  };
  // Sends `bytes` as one message; waits up to `secs` for a reply echoing `request` (any
  // reply when `request` is 0; others are dropped). A HELLO's reply sets session().
  Reply Send(const std::string& bytes, double secs = 2, uint64_t request = 0);
  // A well-formed request from this client (its reply address included).
  std::string Message(wire::Op op, std::string_view json, uint64_t session, uint64_t request = 7,
                      std::string_view payload = {}) const;

  const std::string& addr() const { return addr_; }
  uint64_t session() const { return session_; }
  void forget_session() { session_ = 0; }

 private:
  void Drain(int ms, uint64_t request, Reply* got);
  std::unique_ptr<fabric::Endpoint> ep_;
  fi_addr_t server_ = 0;
  std::string addr_;
  std::vector<char> rbuf_, sbuf_;
  fabric::OpContext rctx_{}, sctx_{};
  uint64_t session_ = 0;
};

}  // namespace msaflow::nam
