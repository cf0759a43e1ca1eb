#include "nam/fabric_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <rdma/fi_errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "common/version.h"
#include "nam/fabric.h"
#include "nam/protocol.h"
#include "nam/server.h"

namespace msaflow::nam {

using nlohmann::json;
using wire::Op;
using wire::Status;

namespace {

// The server said the session is unknown: connect again and retry once.
struct StaleSession {};

enum Kind { kRecvCtx = 1, kSendCtx = 2, kRmaCtx = 3 };

std::string OpName(Op op) {
  switch (op) {
    case Op::kHello: return "HELLO";
    case Op::kAlloc: return "ALLOC";
    case Op::kCommit: return "COMMIT";
    case Op::kAbort: return "ABORT";
    case Op::kLookup: return "LOOKUP";
    case Op::kRelease: return "RELEASE";
    case Op::kStat: return "STAT";
    case Op::kList: return "LIST";
    case Op::kRemove: return "REMOVE";
    case Op::kCapacity: return "CAPACITY";
    case Op::kBye: return "BYE";
    case Op::kPutInline: return "PUT";
  }
  return "?";
}

ErrorKind KindOf(Status s) {
  switch (s) {
    case Status::kInvalid: return ErrorKind::kInvalidInput;
    case Status::kNotFound: return ErrorKind::kNotFound;
    case Status::kCorrupt: return ErrorKind::kCorrupt;
    case Status::kFull: return ErrorKind::kCapacity;
    case Status::kUnauthorized: return ErrorKind::kInvalidInput;
    case Status::kInternal: return ErrorKind::kIo;
    default: return ErrorKind::kInternal;
  }
}

ObjectInfo InfoFrom(const json& j) {
  ObjectInfo i;
  i.name = j.at("name").get<std::string>();
  i.size = j.at("size").get<uint64_t>();
  i.checksum = j.at("checksum").get<std::string>();
  i.version = j.at("version").get<uint64_t>();
  i.meta = j.at("meta");
  return i;
}

std::string Hostname() {
  char b[256] = {0};
  ::gethostname(b, sizeof b - 1);
  return b;
}

}  // namespace

namespace {

// A server's host as a client names it: an IPv6 literal, a dotted IPv4 address (each part
// 0..255), or a host name (a listen address may also be "*"; SplitHostPort takes both).
void CheckServerHost(const std::string& h, const std::string& what) {
  auto bad_host = [&](const std::string& why) {
    Throw(ErrorKind::kInvalidInput, what + ": host '" + h + "' " + why);
  };
  if (h.find(':') != std::string::npos) {
    in6_addr a6;
    if (inet_pton(AF_INET6, h.c_str(), &a6) != 1) bad_host("is not an IPv6 address");
  } else if (!h.empty() && h.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr a4;
    if (inet_pton(AF_INET, h.c_str(), &a4) != 1) bad_host("is not an IPv4 address (four numbers 0..255)");
  } else {
    if (h.size() > 253) bad_host("is longer than a host name can be (253)");
    size_t label = 0;
    for (char c : h) {
      if (c == '.') {
        if (label == 0) bad_host("has an empty label");
        label = 0;
      } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
        if (++label > 63) bad_host("has a label longer than 63 characters");
      } else {
        bad_host("has a character a host name cannot have");
      }
    }
  }
}

}  // namespace

FabricUri ParseFabricUri(const std::string& uri) {
  const std::string scheme = "fabric://";
  if (uri.rfind(scheme, 0) != 0) Throw(ErrorKind::kInvalidInput, "NAM URI '" + uri + "': expected fabric://HOST:PORT");
  FabricUri u;
  std::string rest = uri.substr(scheme.size());
  std::string query;
  if (size_t q = rest.find('?'); q != std::string::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  SplitHostPort(rest, "NAM URI '" + uri + "'", &u.host, &u.port);
  if (std::stoul(u.port) == 0) Throw(ErrorKind::kInvalidInput, "NAM URI '" + uri + "': port 0; a server's port is 1..65535");
  CheckServerHost(u.host, "NAM URI '" + uri + "'");
  if (const char* t = std::getenv("MSAFLOW_NAM_TIMEOUT"); t && *t) {
    char* end = nullptr;
    double v = std::strtod(t, &end);
    if (!end || *end || !(v > 0)) Throw(ErrorKind::kInvalidInput, "MSAFLOW_NAM_TIMEOUT='" + std::string(t) + "': expected seconds > 0");
    u.timeout_s = v;
  }
  size_t start = 0;
  while (start < query.size()) {
    size_t amp = query.find('&', start);
    if (amp == std::string::npos) amp = query.size();
    std::string kv = query.substr(start, amp - start);
    start = amp + 1;
    size_t eq = kv.find('=');
    std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    auto bad = [&](const std::string& expected) {
      Throw(ErrorKind::kInvalidInput, "NAM URI '" + uri + "': " + k + "='" + v + "': expected " + expected);
    };
    if (k == "provider") {
      if (v.empty()) bad("a libfabric provider (tcp, shm, ...)");
      u.provider = v;
    } else if (k == "transport") {
      if (v != "auto" && v != "rma" && v != "map") bad("auto, rma or map");
      u.transport = v;
    } else if (k == "timeout") {
      char* end = nullptr;
      double t = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(t > 0)) bad("seconds > 0");
      u.timeout_s = t;
    } else if (k == "token-file") {
      if (v.empty()) bad("a file name");
      u.token_file = v;
    } else {
      Throw(ErrorKind::kInvalidInput, "NAM URI '" + uri + "': unknown parameter '" + k +
                                          "' (expected provider, transport, timeout, token-file)");
    }
  }
  return u;
}

// One connection (session) to the server. Any transport failure marks it broken; the store
// then drops it and the next call opens a new one.
struct FabricStore::Conn {
  FabricUri u;
  std::string uri;
  std::unique_ptr<fabric::Endpoint> ep;
  fi_addr_t server = FI_ADDR_UNSPEC;
  std::string my_addr;
  uint64_t session = 0, next_request = 1;
  std::vector<char> rbuf, sbuf;
  fabric::Registration rmr, smr;
  fabric::OpContext rctx{}, sctx{};
  bool recv_posted = false, send_busy = false;
  bool broken = false, timed_out = false;
  std::vector<fabric::OpContext> rma_ctx;
  std::vector<char> rma_done;
  int rma_inflight = 0, rma_errors = 0;
  std::string rma_error;
  char* map = nullptr;
  uint64_t map_size = 0;
  // The last reply.
  wire::Header reply{};
  std::string reply_json, reply_payload;
  bool have_reply = false;

  ~Conn() {
    if (ep) {
      fabric::Endpoint::Deregister(rmr);
      fabric::Endpoint::Deregister(smr);
    }
    ep.reset();
    if (map) ::munmap(map, map_size);
  }

  [[noreturn]] void Broken(const std::string& why, bool timeout = false) {
    broken = true;
    timed_out = timeout;
    Throw(ErrorKind::kUnavailable, "NAM " + uri + ": " + why);
  }

  void OnCompletion(const fabric::Completion& c) {
    if (!c.ctx) return;
    if (c.ctx->kind == kRmaCtx) {
      --rma_inflight;
      if (c.err) {
        ++rma_errors;
        rma_error = c.what;
      }
      rma_done[static_cast<size_t>(c.ctx->index)] = 1;
      return;
    }
    if (c.err) Broken(std::string(c.ctx->kind == kSendCtx ? "sending" : "receiving") + " failed: " + c.what +
                      " (is the server running?)");
    if (c.ctx->kind == kSendCtx) {
      send_busy = false;
    } else if (c.ctx->kind == kRecvCtx) {
      recv_posted = false;
      wire::Message m;
      std::string bad = wire::Parse(rbuf.data(), c.len, &m);
      if (!bad.empty()) Broken("malformed reply from the server: " + bad);
      reply = m.header;
      reply_json.assign(m.json);
      reply_payload.assign(m.payload);
      have_reply = true;
      PostRecv();
    }
  }

  // Waits until `done()` holds, reading completions; throws after `timeout_s` without any.
  template <typename Pred>
  void WaitUntil(Pred done, const std::string& what, double timeout_s) {
    auto last = SteadyClock::now();
    fabric::Completion c[16];
    while (!done()) {
      int n = ep->Poll(c, 16, 20);
      for (int i = 0; i < n; ++i) OnCompletion(c[i]);
      if (n > 0) {
        last = SteadyClock::now();
      } else if (std::chrono::duration<double>(SteadyClock::now() - last).count() > timeout_s) {
        char b[64];
        std::snprintf(b, sizeof b, "%g", timeout_s);
        Broken("no answer to " + what + " within " + b + " s (is the server running at " + u.host + ":" + u.port +
                   "?)",
               true);
      }
    }
  }

  void PostRecv() {
    ssize_t rc = ep->PostRecv(rbuf.data(), rbuf.size(), rmr.desc, &rctx);
    if (rc) Broken("fi_recv: " + fabric::FabricError(rc));
    recv_posted = true;
  }

  // Sends one request and returns the reply's JSON; `payload` rides along (inline puts).
  json Call(Op op, const json& body, std::string_view payload = {}, double timeout_s = -1) {
    if (timeout_s < 0) timeout_s = u.timeout_s;
    std::string text = body.dump();
    if (text.size() > wire::kMaxJson) Throw(ErrorKind::kInvalidInput, "NAM request too large");
    wire::Header h;
    h.op = static_cast<uint16_t>(op);
    h.session = session;
    h.request = next_request++;
    size_t len = wire::Build(h, my_addr, text, payload, sbuf.data());
    have_reply = false;
    const std::string what = OpName(op);
    // The send queue stays full while the provider cannot reach the server (tcp keeps
    // retrying a refused connection): bounded by the same timeout.
    auto start = SteadyClock::now();
    for (;;) {
      ssize_t rc = ep->PostSend(sbuf.data(), len, smr.desc, server, &sctx);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN) Broken("fi_send: " + fabric::FabricError(rc));
      fabric::Completion c[16];
      int n = ep->Poll(c, 16, 5);
      for (int i = 0; i < n; ++i) OnCompletion(c[i]);
      if (std::chrono::duration<double>(SteadyClock::now() - start).count() > timeout_s) {
        char b[64];
        std::snprintf(b, sizeof b, "%g", timeout_s);
        Broken("cannot reach the server at " + u.host + ":" + u.port + " to send " + what + " within " + b +
                   " s (is it running?)",
               true);
      }
    }
    send_busy = true;
    for (;;) {
      WaitUntil([&] { return have_reply && !send_busy; }, what, timeout_s);
      if (reply.request == h.request && reply.op == (h.op | wire::kReplyBit)) break;
      have_reply = false;  // a late reply to something else: keep waiting for ours
      send_busy = false;
    }
    json j = json::parse(reply_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) Broken("malformed reply to " + what + " (not a JSON object)");
    auto status = static_cast<Status>(reply.status);
    if (status == Status::kOk) return j;
    if (status == Status::kStaleSession) throw StaleSession{};
    std::string msg = j.value("error", std::string("no message"));
    if (status == Status::kProtocol) broken = true;  // the server forgot this session
    Throw(KindOf(status), "NAM " + uri + ": " + msg);
  }

  void Connect(const std::string& token) {
    ep = fabric::Endpoint::Open(u.provider, u.host, u.port, false);
    my_addr = ep->Name();
    if (my_addr.size() > wire::kMaxAddr) Broken("this endpoint's address is too long");
    server = ep->Insert(ep->ResolveServer(u.host, u.port));
    rbuf.resize(wire::kMaxMessage);
    sbuf.resize(wire::kMaxMessage);
    rctx.kind = kRecvCtx;
    sctx.kind = kSendCtx;
    if (ep->needs_local_mr()) {
      rmr = ep->Register(rbuf.data(), rbuf.size(), FI_RECV);
      smr = ep->Register(sbuf.data(), sbuf.size(), FI_SEND);
    }
    rma_ctx.resize(wire::kRmaWindow);
    PostRecv();
    std::string boot = ReadBootId();
    json hello = {{"pid", ::getpid()}, {"host", Hostname()}, {"boot_id", boot}, {"client", std::string("msaflow ") + kVersion}};
    if (!token.empty()) hello["token"] = token;
    json r = Call(Op::kHello, hello);
    session = reply.session;
    if (session == 0) Broken("the server opened no session");
    if (u.transport != "rma") TryMap(r, boot);
  }

  void TryMap(const json& r, const std::string& boot) {
    std::string why;
    if (!r.contains("map")) {
      why = "the server does not offer its pool";
    } else {
      try {
        const json& m = r.at("map");
        // One kernel is not one host: containers and network namespaces with hostnames of
        // their own stand for separate nodes (scripts/slurm-cluster.sh --hosts), and reach
        // the server over the fabric as a node elsewhere would.
        if (boot.empty() || m.at("boot_id").get<std::string>() != boot ||
            (m.contains("host") && m.at("host").get<std::string>() != Hostname())) {
          why = "the server runs on another node";
        } else {
          std::string path = "/proc/" + std::to_string(m.at("pid").get<long>()) + "/fd/" + std::to_string(m.at("fd").get<int>());
          int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
          struct stat st {};
          if (fd < 0) {
            why = "cannot open " + path + ": " + std::strerror(errno);
          } else if (::fstat(fd, &st) != 0 || st.st_ino != m.at("ino").get<uint64_t>() ||
                     st.st_dev != m.at("dev").get<uint64_t>() ||
                     static_cast<uint64_t>(st.st_size) != m.at("size").get<uint64_t>()) {
            why = path + " is not the server's pool";
            ::close(fd);
          } else {
            map_size = m.at("size").get<uint64_t>();
            void* p = ::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            ::close(fd);
            if (p == MAP_FAILED) {
              why = std::string("mmap of the pool: ") + std::strerror(errno);
              map_size = 0;
            } else {
              map = static_cast<char*>(p);
            }
          }
        }
      } catch (const json::exception&) {
        why = "malformed map offer";
      }
    }
    if (!map && u.transport == "map") Throw(ErrorKind::kUnavailable, "NAM " + uri + ": transport=map is impossible: " + why);
  }

  // Moves `len` bytes between `local` and the server's region (addr, key) in pipelined
  // chunks, feeding the bytes to `hasher` in order as they are settled.
  void Rma(bool write, char* local, uint64_t len, uint64_t addr, uint64_t key, Hasher& hasher) {
    const uint64_t chunk = wire::kRmaChunk;
    const size_t nchunks = static_cast<size_t>((len + chunk - 1) / chunk);
    fabric::Registration lmr;
    if (ep->needs_local_mr()) lmr = ep->Register(local, len, write ? FI_WRITE : FI_READ);
    struct Dereg {
      fabric::Registration& r;
      ~Dereg() { fabric::Endpoint::Deregister(r); }
    } dereg{lmr};
    rma_done.assign(nchunks, 0);
    rma_inflight = 0;
    rma_errors = 0;
    std::vector<int> slot_of(wire::kRmaWindow, -1);
    size_t next = 0, hashed = 0;
    auto last = SteadyClock::now();
    fabric::Completion c[16];
    auto free_slot = [&]() -> int {
      for (int s = 0; s < wire::kRmaWindow; ++s)
        if (slot_of[static_cast<size_t>(s)] < 0 || rma_done[static_cast<size_t>(slot_of[static_cast<size_t>(s)])])
          return s;
      return -1;
    };
    // Contexts carry the chunk index; slots bound what is in flight. Hashing overlaps the
    // transfers: a write hashes its source at any time, a read hashes each chunk once it
    // has arrived, in order.
    while (hashed < nchunks || next < nchunks || rma_inflight > 0) {
      while (next < nchunks && rma_inflight < wire::kRmaWindow) {
        int s = free_slot();
        if (s < 0) break;
        uint64_t off = next * chunk, n = std::min<uint64_t>(chunk, len - off);
        fabric::OpContext& ctx = rma_ctx[static_cast<size_t>(s)];
        ctx.kind = kRmaCtx;
        ctx.index = static_cast<int>(next);
        ssize_t rc = write ? ep->PostWrite(local + off, n, lmr.desc, server, addr + off, key, &ctx)
                           : ep->PostRead(local + off, n, lmr.desc, server, addr + off, key, &ctx);
        if (rc == -FI_EAGAIN) break;
        if (rc) Broken(std::string(write ? "fi_write" : "fi_read") + ": " + fabric::FabricError(rc));
        slot_of[static_cast<size_t>(s)] = static_cast<int>(next);
        ++rma_inflight;
        ++next;
      }
      bool hashed_one = false;
      if (hashed < nchunks && (write || rma_done[hashed])) {
        uint64_t off = hashed * chunk, n = std::min<uint64_t>(chunk, len - off);
        hasher.Update(local + off, n);
        ++hashed;
        hashed_one = true;
      }
      int n = ep->Poll(c, 16, hashed_one ? -1 : 20);
      for (int i = 0; i < n; ++i) OnCompletion(c[i]);
      if (rma_errors) Broken(std::string("RMA ") + (write ? "write" : "read") + " failed: " + rma_error);
      if (n > 0 || hashed_one) {
        last = SteadyClock::now();
      } else if (std::chrono::duration<double>(SteadyClock::now() - last).count() > u.timeout_s) {
        char b[64];
        std::snprintf(b, sizeof b, "%g", u.timeout_s);
        Broken(std::string("RMA ") + (write ? "write" : "read") + " made no progress for " + b +
                   " s (is the server running?)",
               true);
      }
    }
  }
};

FabricStore::FabricStore(const std::string& uri) : uri_(uri), parsed_(ParseFabricUri(uri)) {}

FabricStore::~FabricStore() {
  std::lock_guard<std::mutex> l(mu_);
  if (conn_ && !conn_->broken) {
    try {
      conn_->Call(Op::kBye, json::object(), {}, 1.0);
    } catch (...) {
      // The server is gone or busy; its lease will drop the session.
    }
  }
}

FabricStore::Conn& FabricStore::Connection() {
  if (conn_ && conn_->broken) conn_.reset();
  if (!conn_) {
    auto c = std::make_unique<Conn>();
    c->u = parsed_;
    c->uri = uri_;
    std::string token;
    if (!parsed_.token_file.empty()) {
      token = ReadFile(parsed_.token_file);
    } else if (const char* f = std::getenv("MSAFLOW_NAM_TOKEN_FILE"); f && *f) {
      token = ReadFile(f);
    } else if (const char* t = std::getenv("MSAFLOW_NAM_TOKEN"); t && *t) {
      token = t;
    }
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
    c->Connect(token);
    conn_ = std::move(c);
  }
  return *conn_;
}

// Runs f(conn); a stale session, or a connection that broke at once (a restarted server),
// gets one fresh connection and one more try. Timeouts are not retried.
template <typename F>
auto FabricStore::WithRetry(const char* what, F&& f) {
  for (int attempt = 0;; ++attempt) {
    try {
      return f(Connection());
    } catch (const StaleSession&) {
      conn_.reset();
      if (attempt > 0) Throw(ErrorKind::kUnavailable, "NAM " + uri_ + ": " + what + ": the server keeps refusing the session");
    } catch (const json::exception& e) {
      conn_.reset();
      Throw(ErrorKind::kUnavailable, "NAM " + uri_ + ": " + what + ": malformed reply from the server (" + e.what() + ")");
    } catch (const Error& e) {
      bool retry = e.kind() == ErrorKind::kUnavailable && conn_ && conn_->broken && !conn_->timed_out && attempt == 0;
      if (conn_ && conn_->broken) conn_.reset();
      if (!retry) throw;
    }
  }
}

ObjectInfo FabricStore::Put(const std::string& name, std::string_view bytes, const json& meta) {
  ValidateObjectName(name);
  const json m = CheckedMeta(name, meta);
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("put", [&](Conn& c) {
    if (bytes.size() <= wire::kInlineMax) {
      json r = c.Call(Op::kPutInline, {{"name", name}, {"meta", m}, {"checksum", ChecksumHex(bytes)}}, bytes);
      return InfoFrom(r);
    }
    bool via_map = c.map != nullptr;
    json a = c.Call(Op::kAlloc, {{"name", name}, {"size", bytes.size()}, {"meta", m}, {"via", via_map ? "map" : "rma"}});
    uint64_t alloc = a.at("alloc").get<uint64_t>();
    Hasher h;
    try {
      if (via_map) {
        uint64_t off = a.at("offset").get<uint64_t>();
        if (off + bytes.size() > c.map_size) c.Broken("the server offered a region outside its pool");
        CopyAndHash(c.map + off, bytes.data(), bytes.size(), h);
      } else {
        c.Rma(true, const_cast<char*>(bytes.data()), bytes.size(), a.at("addr").get<uint64_t>(),
              a.at("key").get<uint64_t>(), h);
      }
    } catch (...) {
      if (!c.broken) {
        try {
          c.Call(Op::kAbort, {{"alloc", alloc}});
        } catch (...) {
        }
      }
      throw;
    }
    json r = c.Call(Op::kCommit, {{"alloc", alloc}, {"checksum", Hex64(h.Digest())}});
    return InfoFrom(r);
  });
}

ObjectInfo FabricStore::GetInto(const std::string& name, std::string& bytes) {
  ValidateObjectName(name);
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("get", [&](Conn& c) {
    bool via_map = c.map != nullptr;
    json r = c.Call(Op::kLookup, {{"name", name}, {"via", via_map ? "map" : "rma"}});
    ObjectInfo info = InfoFrom(r.at("info"));
    uint64_t got;
    if (!r.contains("read")) {
      if (c.reply_payload.size() != info.size) c.Broken("inline reply of the wrong size");
      bytes.assign(c.reply_payload);
      got = Checksum64(bytes);
    } else {
      uint64_t read = r.at("read").get<uint64_t>();
      bytes.resize(info.size);
      Hasher h;
      if (via_map) {
        uint64_t off = r.at("offset").get<uint64_t>();
        if (off + info.size > c.map_size) c.Broken("the server offered a region outside its pool");
        CopyAndHash(bytes.data(), c.map + off, info.size, h);
      } else {
        c.Rma(false, bytes.data(), info.size, r.at("addr").get<uint64_t>(), r.at("key").get<uint64_t>(), h);
      }
      got = h.Digest();
      c.Call(Op::kRelease, {{"read", read}});
    }
    if (Hex64(got) != info.checksum)
      Throw(ErrorKind::kCorrupt, "NAM " + uri_ + ": object '" + name + "' fails its checksum (stored " + info.checksum +
                                     ", bytes hash to " + Hex64(got) + ")");
    return info;
  });
}

Object FabricStore::Get(const std::string& name) {
  Object o;
  o.info = GetInto(name, o.bytes);
  return o;
}

std::optional<ObjectInfo> FabricStore::Stat(const std::string& name) {
  ValidateObjectName(name);
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("stat", [&](Conn& c) -> std::optional<ObjectInfo> {
    try {
      return InfoFrom(c.Call(Op::kStat, {{"name", name}}).at("info"));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kNotFound) return std::nullopt;
      throw;
    }
  });
}

std::vector<ObjectInfo> FabricStore::List(const std::string& prefix) {
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("list", [&](Conn& c) {
    std::vector<ObjectInfo> out;
    std::string after;
    for (;;) {
      json r = c.Call(Op::kList, {{"prefix", prefix}, {"after", after}});
      for (const auto& j : r.at("objects")) out.push_back(InfoFrom(j));
      if (!r.at("more").get<bool>() || out.empty()) break;
      after = out.back().name;
    }
    return out;
  });
}

bool FabricStore::Remove(const std::string& name) {
  ValidateObjectName(name);
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("remove", [&](Conn& c) { return c.Call(Op::kRemove, {{"name", name}}).at("removed").get<bool>(); });
}

json FabricStore::Capacity() {
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("capacity", [&](Conn& c) { return c.Call(Op::kCapacity, json::object()); });
}

std::string FabricStore::Transport() {
  std::lock_guard<std::mutex> l(mu_);
  return WithRetry("connect", [&](Conn& c) { return std::string(c.map ? "map" : "rma"); });
}

}  // namespace msaflow::nam
