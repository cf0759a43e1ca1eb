// The NAM wire protocol, server side: a real server (in this process, tcp on loopback) fed
// raw messages from a raw client endpoint. The input's first bytes choose how much of the
// framing is right — magic and version, this client's reply address, a live session, the op —
// and the rest is the JSON and payload parts, so both the framing checks and every request
// handler see arbitrary bytes. A finding is a crash, a sanitizer report, or a server that
// stops answering: a message carrying a usable reply address must be answered within 10 s.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "fuzz/fuzz_util.h"
#include "nam/protocol.h"
#include "nam/raw_client.h"
#include "nam/server.h"

namespace {

using namespace msaflow::nam;

class Harness {
 public:
  Harness() {
    ServerOptions o;
    o.capacity = 64ull << 20;
    o.lease_s = 5;  // puts a message abandoned are dropped soon
    o.log = std::fopen("/dev/null", "w");
    server_ = std::make_unique<Server>(o);
    thread_ = std::thread([this] { server_->Run(stop_); });
    raw_ = std::make_unique<RawClient>(server_->Uri());
  }
  ~Harness() {
    stop_ = true;
    thread_.join();
  }

  void Hello() {
    const uint64_t request = ++request_;
    if (raw_->Send(raw_->Message(wire::Op::kHello, "{}", 0, request), 10, request).status != 0) {
      std::fprintf(stderr, "nam_wire_fuzz: the server did not answer HELLO\n");
      std::abort();
    }
  }

  void One(const uint8_t* data, size_t size) {
    if (size < 4) return;
    const uint8_t flags = data[0];
    if (!raw_->session()) Hello();
    wire::Header h;
    h.op = static_cast<uint16_t>(flags & 0x80 ? data[1] | (data[2] << 8) : 1 + data[1] % 12);
    h.session = flags & 1 ? raw_->session() : (static_cast<uint64_t>(data[2]) << 8 | data[1]);
    h.request = ++request_;
    if (!(flags & 2)) h.magic = 0x4E41534Du ^ data[3];
    if (!(flags & 4)) h.version = static_cast<uint16_t>(data[3] % 3);
    h.status = static_cast<uint16_t>(flags & 8 ? data[3] : 0);
    const bool real_addr = flags & 16;
    const std::string addr =
        real_addr ? raw_->addr()
                  : std::string(reinterpret_cast<const char*>(data + 1), std::min<size_t>(size - 1, data[3] % 130));
    const std::string_view rest(reinterpret_cast<const char*>(data + 4), size - 4);
    const size_t json_len = rest.empty() ? 0 : rest.size() * (flags & 0x60) / 0x60;
    std::string_view json = rest.substr(0, std::min(json_len, wire::kMaxJson + 16));
    std::string_view payload = rest.substr(json.size());
    if (wire::kHeaderSize + addr.size() + json.size() + payload.size() > wire::kMaxMessage)
      payload = payload.substr(0, wire::kMaxMessage - wire::kHeaderSize - addr.size() - json.size());
    std::string out(wire::kMaxMessage, '\0');
    out.resize(wire::Build(h, addr, json, payload, out.data()));
    // The header is encoded from `h`; let some inputs lie about the lengths too.
    if (flags & 0x80 && out.size() >= wire::kHeaderSize) std::memcpy(out.data() + 24, data + 1, 2);
    // Only a message with the right magic can expect an answer (the server does not trust the
    // address in anything else); a well-framed one must get it.
    const bool answerable = real_addr && (flags & 0x82) == 2;
    const int status = raw_->Send(out, answerable ? 10 : 0.002, h.request).status;
    if (answerable && status < 0 && (flags & 0x86) == 6) {
      std::fprintf(stderr, "nam_wire_fuzz: a well-framed request with a usable reply address got no answer\n");
      std::abort();
    }
    // The server forgets a session on a protocol error, on BYE and when it expires.
    if (status != static_cast<int>(wire::Status::kOk) || h.op == static_cast<uint16_t>(wire::Op::kBye))
      raw_->forget_session();
  }

 private:
  std::unique_ptr<Server> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::unique_ptr<RawClient> raw_;
  uint64_t request_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();  // lives for the whole run (libFuzzer never returns)
  msaflow::fuzz::Expect([&] { h->One(data, size); });
  return 0;
}
