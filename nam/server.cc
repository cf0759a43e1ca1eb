#include "nam/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/fi_errno.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric.h"
#include "nam/file_store.h"
#include "nam/pool.h"
#include "nam/protocol.h"
#include "nam/store.h"

namespace msaflow::nam {

using nlohmann::json;
using wire::Op;
using wire::Status;

void SplitHostPort(const std::string& text, const std::string& what, std::string* host, std::string* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    Throw(ErrorKind::kInvalidInput, what + ": '" + text + "' is not HOST:PORT");
  *host = text.substr(0, colon);
  *port = text.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  for (char c : *port)
    if (!std::isdigit(static_cast<unsigned char>(c))) Throw(ErrorKind::kInvalidInput, what + ": port '" + *port + "' is not a number");
  if (port->size() > 5 || std::stoul(*port) > 65535) Throw(ErrorKind::kInvalidInput, what + ": port " + *port + " is out of range");
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

namespace {

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// A request handler's way out: the reply status and its message.
struct Reject {
  Status status;
  std::string message;
};

[[noreturn]] void Fail(Status s, const std::string& m) { throw Reject{s, m}; }

}  // namespace

struct Server::Impl {
  // One region of the pool, freed (and its registration closed) when the last holder lets
  // go: the index entry, and any reader that pinned it.
  struct Region {
    Impl* srv;
    uint64_t offset = 0, size = 0;
    fabric::Registration read_mr, write_mr;
    Region(Impl* s, uint64_t off, uint64_t sz) : srv(s), offset(off), size(sz) {}
    ~Region() {
      fabric::Endpoint::Deregister(read_mr);
      fabric::Endpoint::Deregister(write_mr);
      srv->pool->Free(offset, size);
    }
    char* data() const { return srv->pool->base() + offset; }
  };
  struct Stored {
    ObjectInfo info;
    bool persisted = false;
    std::shared_ptr<Region> region;  // null when evicted (then persisted is true)
    uint64_t last_use = 0;
  };
  struct PendingPut {
    uint64_t session;
    std::string name;
    json meta;
    std::shared_ptr<Region> region;
  };
  struct Session {
    fi_addr_t addr;
    std::string raw_addr;
    SteadyClock::time_point last_seen;
    std::map<uint64_t, std::shared_ptr<Region>> pins;
    std::set<uint64_t> puts;
  };
  struct SendBuf {
    fabric::OpContext ctx;
    std::vector<char> data;
    fabric::Registration mr;
    bool busy = false;
  };
  struct RecvBuf {
    fabric::OpContext ctx;
    std::vector<char> data;
    fabric::Registration mr;
  };
  enum Kind { kRecv = 1, kSend = 2 };

  ServerOptions opt;
  Clock& clock() const { return opt.clock ? *opt.clock : SystemClock(); }
  std::string host, port, token, boot_id;
  std::string host_name;  // gethostname: with boot_id, which clients share this host (and may map the pool)
  std::unique_ptr<fabric::Endpoint> ep;
  std::unique_ptr<Pool> pool;
  std::unique_ptr<FileStore> persist;
  int persist_lock_fd = -1;
  int users_fd = -1;         // --users-lock: held exclusively from the moment no run uses the server
  bool wrote_ready = false;  // only a server that wrote the ready file removes it
  std::map<std::string, Stored> index;
  std::map<std::string, uint64_t> versions;  // highest version handed out per name
  // Persisted objects that could not be read at start: name -> why. Reads of them are
  // kCorrupt (not "no object"); a put replaces them; removing one moves its file aside.
  std::map<std::string, std::string> damaged;
  std::map<uint64_t, Session> sessions;
  std::map<uint64_t, PendingPut> puts;
  std::map<std::string, fi_addr_t> av;       // raw address -> AV entry
  std::vector<std::unique_ptr<RecvBuf>> recvs;
  std::vector<std::unique_ptr<SendBuf>> sends;
  std::deque<fabric::Completion> backlog;
  std::mt19937_64 rng{std::random_device{}()};
  uint64_t next_id = 1, tick = 0;
  uint64_t pool_dev = 0, pool_ino = 0;
  uint64_t requests = 0, rejected = 0, dropped = 0;

  void Log(const std::string& line) {
    std::fprintf(opt.log, "nam: %s\n", line.c_str());
    std::fflush(opt.log);
  }

  // ---- startup ----
  void Open() {
    SplitHostPort(opt.listen, "--listen", &host, &port);
    if (host == "*") {  // this node's name: a server placed by Slurm does not know its node beforehand
      char name[256] = {};
      if (::gethostname(name, sizeof name - 1) != 0) ThrowErrno("gethostname");
      host = name;
    }
    if (!opt.token_file.empty()) {
      token = ReadFile(opt.token_file);
      while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
      if (token.size() < 16)
        Throw(ErrorKind::kInvalidInput, "--token-file " + opt.token_file + ": the token must be at least 16 characters");
    }
    if (!IsLoopbackHost(host) && token.empty())
      Throw(ErrorKind::kInvalidInput, "--listen " + opt.listen +
                                          ": a non-loopback address needs a token (--token-file F); "
                                          "listen on 127.0.0.1 for a private server");
    if (opt.capacity == 0) Throw(ErrorKind::kInvalidInput, "--capacity must be positive");
    if (opt.lease_s <= 0) Throw(ErrorKind::kInvalidInput, "--lease must be positive");
    boot_id = ReadBootId();
    char hn[256] = {0};
    ::gethostname(hn, sizeof hn - 1);
    host_name = hn;
    pool = std::make_unique<Pool>(opt.capacity);
    struct stat st {};
    if (::fstat(pool->fd(), &st) == 0) {
      pool_dev = st.st_dev;
      pool_ino = st.st_ino;
    }
    if (!opt.persist_dir.empty()) OpenPersist();
    std::string service = port;
    if (fabric::ProviderName(opt.provider) == "shm" && port == "0") {
      // shm has names, not ports: pick a number unlikely to be taken (give one to be sure).
      static int counter = 0;
      service = std::to_string(10000 + (::getpid() * 7 + counter++ * 101) % 50000);
    }
    ep = fabric::Endpoint::Open(opt.provider, host, service, true);
    if (port == "0" || fabric::ProviderName(opt.provider) == "shm") port = BoundPort(service);
    for (int i = 0; i < 32; ++i) {
      auto r = std::make_unique<RecvBuf>();
      r->data.resize(wire::kMaxMessage);
      r->ctx.kind = kRecv;
      if (ep->needs_local_mr()) r->mr = ep->Register(r->data.data(), r->data.size(), FI_RECV);
      PostRecv(*r);
      recvs.push_back(std::move(r));
    }
    for (int i = 0; i < 64; ++i) {
      auto s = std::make_unique<SendBuf>();
      s->data.resize(wire::kMaxMessage);
      s->ctx.kind = kSend;
      s->ctx.index = i;
      if (ep->needs_local_mr()) s->mr = ep->Register(s->data.data(), s->data.size(), FI_SEND);
      sends.push_back(std::move(s));
    }
  }

  std::string BoundPort(const std::string& service) {
    if (fabric::ProviderName(opt.provider) == "shm") return service;
    std::string raw = ep->Name();
    if (raw.size() >= sizeof(sockaddr_in)) {
      sockaddr_storage ss{};
      std::memcpy(&ss, raw.data(), std::min(raw.size(), sizeof ss));
      if (ss.ss_family == AF_INET) return std::to_string(ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
      if (ss.ss_family == AF_INET6) return std::to_string(ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port));
    }
    Throw(ErrorKind::kInternal, "cannot tell which port the endpoint bound (" + ep->PrintableName() + ")");
  }

  void OpenPersist() {
    persist = std::make_unique<FileStore>(opt.persist_dir);
    const std::string& dir = persist->dir();
    std::string lock = dir + "/.server.lock";
    persist_lock_fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (persist_lock_fd < 0) ThrowErrno("open " + lock);
    const auto give_up = clock().Now() + std::chrono::duration<double>(opt.lock_wait_s);
    while (::flock(persist_lock_fd, LOCK_EX | LOCK_NB) != 0) {
      if (clock().Now() >= give_up)
        Throw(ErrorKind::kIo, "--persist " + dir + ": another NAM server persists to this directory (" + lock +
                                  " is locked)");
      clock().SleepSeconds(0.05);
    }
    // A server killed mid-write leaves temporary files: they were never committed.
    size_t leftovers = 0, loaded = 0, bad = 0;
    std::error_code ec;
    std::vector<std::filesystem::path> junk;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file() && IsAtomicWriteLeftover(it->path().filename().string())) junk.push_back(it->path());
    for (const auto& p : junk) leftovers += std::filesystem::remove(p, ec) ? 1 : 0;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      std::string rel = std::filesystem::relative(it->path(), dir).string();
      if (rel.size() < 5 || rel.compare(rel.size() - 4, 4, ".nam") != 0) continue;
      std::string name = rel.substr(0, rel.size() - 4);
      if (!IsObjectName(name)) continue;  // not an object file (DAMAGED/, a foreign file)
      try {
        Stored s;
        s.info = persist->ReadObject(name, nullptr);
        s.persisted = true;
        versions[name] = std::max(versions[name], s.info.version);
        index[name] = std::move(s);
        ++loaded;
      } catch (const Error& e) {
        ++bad;
        damaged[name] = e.what();
        Log("DAMAGED persisted object '" + name + "': " + e.what());
      }
    }
    Log("persist " + dir + ": " + std::to_string(loaded) + " objects indexed (loaded on first use)" +
        (leftovers ? ", " + std::to_string(leftovers) + " uncommitted leftovers removed" : "") +
        (bad ? ", " + std::to_string(bad) + " DAMAGED (reads of them fail as corrupt; `msaflow nam verify --repair` "
                                            "moves them aside)"
             : ""));
  }

  std::string Uri() const {
    std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    std::string u = "fabric://" + h + ":" + port;
    if (opt.provider != "tcp") u += "?provider=" + opt.provider;
    return u;
  }

  // ---- fabric plumbing ----
  void PostRecv(RecvBuf& r) {
    for (;;) {
      ssize_t rc = ep->PostRecv(r.data.data(), r.data.size(), r.mr.desc, &r.ctx);
      if (rc == 0) return;
      if (rc != -FI_EAGAIN) Throw(ErrorKind::kInternal, "fi_recv: " + fabric::FabricError(rc));
      Progress();
    }
  }

  // Reads completions; sends are retired at once, receives wait in the backlog.
  void Progress(int timeout_ms = -1) {
    fabric::Completion c[16];
    int n = ep->Poll(c, 16, timeout_ms);
    for (int i = 0; i < n; ++i) {
      if (c[i].ctx && c[i].ctx->kind == kSend) {
        sends[static_cast<size_t>(c[i].ctx->index)]->busy = false;
        if (c[i].err && opt.verbose) Log("a reply was not delivered: " + c[i].what);
      } else {
        backlog.push_back(c[i]);
      }
    }
  }

  SendBuf& FreeSend() {
    for (;;) {
      for (auto& s : sends)
        if (!s->busy) return *s;
      Progress(10);
    }
  }

  fi_addr_t AddrOf(const std::string& raw) {
    auto it = av.find(raw);
    if (it != av.end()) return it->second;
    if (av.size() >= 4096) Fail(Status::kProtocol, "too many peers");
    fi_addr_t a = ep->Insert(raw);
    av[raw] = a;
    return a;
  }

  void Send(fi_addr_t dest, uint16_t op, uint64_t session, uint64_t request, Status status, const json& body,
            std::string_view payload = {}) {
    std::string text = body.dump();
    if (text.size() > wire::kMaxJson) {
      text = json{{"error", "reply too large"}}.dump();
      status = Status::kInternal;
      payload = {};
    }
    SendBuf& s = FreeSend();
    wire::Header h;
    h.op = static_cast<uint16_t>(op | wire::kReplyBit);
    h.session = session;
    h.request = request;
    h.status = static_cast<uint16_t>(status);
    size_t len = wire::Build(h, {}, text, payload, s.data.data());
    for (;;) {
      ssize_t rc = ep->PostSend(s.data.data(), len, s.mr.desc, dest, &s.ctx);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN) {
        if (opt.verbose) Log("cannot send a reply: " + fabric::FabricError(rc));
        return;
      }
      Progress(1);
    }
    s.busy = true;
  }

  // ---- sessions ----
  void DropSession(uint64_t id, const std::string& why) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    for (uint64_t p : it->second.puts) puts.erase(p);
    if (opt.verbose || why != "bye")
      Log("session " + Hex64(id).substr(8) + " closed (" + why + "); " + std::to_string(it->second.pins.size()) +
          " pins and " + std::to_string(it->second.puts.size()) + " uncommitted puts released");
    sessions.erase(it);
  }

  void ExpireSessions() {
    auto now = clock().Now();
    std::vector<uint64_t> old;
    for (const auto& [id, s] : sessions)
      if (Seconds(now - s.last_seen) > opt.lease_s) old.push_back(id);
    for (uint64_t id : old) DropSession(id, "silent for more than " + fmt(opt.lease_s) + " s");
  }
  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }

  // ---- objects ----
  // A region of `size` bytes, evicting persisted objects nobody reads (least recently used
  // first) when the pool is full. Never evicts what exists only in memory.
  std::shared_ptr<Region> Allocate(uint64_t size, const std::string& name) {
    if (size > pool->capacity())
      Fail(Status::kFull, "NAM full: object '" + name + "' of " + HumanBytes(static_cast<double>(size)) + " is larger than the capacity " +
                              HumanBytes(static_cast<double>(pool->capacity())));
    for (;;) {
      if (auto off = pool->Allocate(size)) return std::make_shared<Region>(this, *off, size);
      Stored* victim = nullptr;
      for (auto& [n, s] : index)
        if (s.persisted && s.region && s.region.use_count() == 1 && (!victim || s.last_use < victim->last_use))
          victim = &s;
      if (!victim)
        Fail(Status::kFull, "NAM full (" + HumanBytes(static_cast<double>(pool->used())) + " used / " + HumanBytes(static_cast<double>(pool->capacity())) + " capacity" +
                                "): no room for '" + name + "' (" + HumanBytes(static_cast<double>(size)) +
                                "); only persisted objects can be evicted and none is idle");
      victim->region.reset();
    }
  }

  // The first damaged objects' names, as many as a reply holds with room to spare.
  json DamagedNames() const {
    json names = json::array();
    for (const auto& [name, why] : damaged) {
      if (names.size() >= 64) break;
      names.push_back(name);
    }
    return names;
  }

  [[noreturn]] void Missing(const std::string& name) {
    auto d = damaged.find(name);
    if (d != damaged.end())
      Fail(Status::kCorrupt, "object '" + name + "' is damaged in the persist directory: " + d->second +
                                 " (`msaflow nam verify --repair` moves it aside)");
    Fail(Status::kNotFound, "no object '" + name + "'");
  }

  // Makes an object resident (reloading it from the persist directory) and returns it.
  Stored& Resident(const std::string& name) {
    auto it = index.find(name);
    if (it == index.end()) Missing(name);
    Stored& s = it->second;
    s.last_use = ++tick;
    if (s.region) return s;
    std::string bytes;
    try {
      ObjectInfo info = persist->ReadObject(name, &bytes);
      if (info.checksum != s.info.checksum || info.version != s.info.version) s.info = info;
    } catch (const Error& e) {
      Fail(e.kind() == ErrorKind::kNotFound ? Status::kNotFound : Status::kCorrupt,
           std::string("reloading from the persist directory: ") + e.what());
    }
    auto region = Allocate(bytes.size(), name);
    std::memcpy(region->data(), bytes.data(), bytes.size());
    s.region = std::move(region);
    return s;
  }

  json InfoJson(const ObjectInfo& i) {
    return {{"name", i.name}, {"size", i.size}, {"checksum", i.checksum}, {"version", i.version}, {"meta", i.meta}};
  }

  // Publishes the bytes in `region` as `name`: checks the checksum the client computed,
  // writes through to disk, then swaps the index entry (readers of the old version keep it).
  json Commit(const std::string& name, const json& meta, std::shared_ptr<Region> region, const std::string& checksum) {
    std::string got = Hex64(Checksum64(std::string_view(region->data(), region->size)));
    if (got != checksum)
      Fail(Status::kCorrupt, "object '" + name + "': the bytes that arrived hash to " + got + ", the client says " +
                                 checksum + " (nothing was published)");
    ObjectInfo info;
    info.name = name;
    info.size = region->size;
    info.checksum = got;
    info.meta = meta;
    info.version = versions[name] + 1;
    bool persisted = false;
    if (persist) {
      try {
        persist->WriteObject(info, std::string_view(region->data(), region->size));
        persisted = true;
      } catch (const Error& e) {
        Fail(Status::kInternal, std::string("object '") + name + "' not published: writing it through failed: " + e.what());
      }
    }
    versions[name] = info.version;
    damaged.erase(name);  // the damaged file was just replaced
    Stored& s = index[name];
    s.info = info;
    s.persisted = persisted;
    s.region = std::move(region);
    s.last_use = ++tick;
    return InfoJson(info);
  }

  // ---- requests ----
  static std::string Str(const json& b, const char* key) {
    auto it = b.find(key);
    if (it == b.end() || !it->is_string()) Fail(Status::kInvalid, std::string("field '") + key + "' must be a string");
    return it->get<std::string>();
  }
  static uint64_t U64(const json& b, const char* key) {
    auto it = b.find(key);
    if (it == b.end() || !it->is_number_unsigned()) Fail(Status::kInvalid, std::string("field '") + key + "' must be an unsigned integer");
    return it->get<uint64_t>();
  }
  static std::string Name(const json& b) {
    std::string n = Str(b, "name");
    try {
      ValidateObjectName(n);
    } catch (const Error& e) {
      Fail(Status::kInvalid, e.what());
    }
    return n;
  }
  static json Meta(const json& b) {
    auto it = b.find("meta");
    if (it == b.end() || it->is_null()) return json::object();
    if (!it->is_object()) Fail(Status::kInvalid, "field 'meta' must be a JSON object");
    if (it->dump().size() > wire::kMaxMeta) Fail(Status::kInvalid, "field 'meta' is larger than 16 KiB");
    return *it;
  }
  static std::string Checksum(const json& b) {
    std::string c = Str(b, "checksum");
    if (c.size() != 16 || c.find_first_not_of("0123456789abcdef") != std::string::npos)
      Fail(Status::kInvalid, "field 'checksum' must be 16 lowercase hex digits");
    return c;
  }

  json Hello(const json& b, const std::string& raw_addr, uint64_t* session_out) {
    if (!token.empty()) {
      auto it = b.find("token");
      if (it == b.end() || !it->is_string() || !ConstantTimeEqual(it->get<std::string>(), token))
        Fail(Status::kUnauthorized, "this NAM server needs its token (wrong or missing)");
    }
    if (sessions.size() >= 4096) Fail(Status::kFull, "too many sessions");
    uint64_t id;
    do id = rng(); while (id == 0 || sessions.count(id));
    Session s;
    s.raw_addr = raw_addr;
    s.addr = AddrOf(raw_addr);
    s.last_seen = clock().Now();
    sessions[id] = std::move(s);
    *session_out = id;
    json r = {{"session", Hex64(id)}, {"server_pid", ::getpid()}, {"capacity", pool->capacity()},
              {"provider", ep->provider()}, {"inline_max", wire::kInlineMax}};
    if (opt.allow_map && !boot_id.empty())
      r["map"] = {{"boot_id", boot_id}, {"host", host_name}, {"pid", ::getpid()}, {"fd", pool->fd()},
                  {"size", pool->capacity()}, {"dev", pool_dev}, {"ino", pool_ino}};
    return r;
  }

  // alloc: room for a put of `size` bytes, written by the client (RMA, or the pool mapping)
  // and committed later.
  json OnAlloc(uint64_t sid, Session& sess, const json& b) {
    std::string name = Name(b);
    uint64_t size = U64(b, "size");
    json meta = Meta(b);
    std::string via = b.value("via", "rma");
    if (via != "rma" && via != "map") Fail(Status::kInvalid, "field 'via' must be \"rma\" or \"map\"");
    if (via == "map" && !opt.allow_map) Fail(Status::kInvalid, "this server does not offer the pool mapping");
    if (sess.puts.size() >= 64) Fail(Status::kInvalid, "more than 64 uncommitted puts in one session");
    auto region = Allocate(size, name);
    json r = {{"offset", region->offset}};
    if (via == "rma" && size > 0) {
      region->write_mr = ep->Register(region->data(), size, FI_REMOTE_WRITE);
      r["addr"] = region->write_mr.base;
      r["key"] = region->write_mr.key;
    }
    uint64_t id = next_id++;
    puts[id] = PendingPut{sid, name, meta, std::move(region)};
    sess.puts.insert(id);
    r["alloc"] = id;
    return r;
  }

  // commit / abort: ends an alloc's put, committing its bytes under their checksum or
  // dropping them.
  json OnFinish(Op op, uint64_t sid, Session& sess, const json& b) {
    uint64_t id = U64(b, "alloc");
    auto it = puts.find(id);
    if (it == puts.end() || it->second.session != sid) Fail(Status::kInvalid, "no uncommitted put " + std::to_string(id) + " in this session");
    PendingPut p = std::move(it->second);
    puts.erase(it);
    sess.puts.erase(id);
    if (op == Op::kAbort) return json::object();
    std::string checksum = Checksum(b);
    fabric::Endpoint::Deregister(p.region->write_mr);  // the client can no longer write it
    return Commit(p.name, p.meta, std::move(p.region), checksum);
  }

  // put-inline: a small object whose bytes came with the request.
  json OnPutInline(const json& b, std::string_view payload) {
    std::string name = Name(b);
    json meta = Meta(b);
    std::string checksum = Checksum(b);
    auto region = Allocate(payload.size(), name);
    if (!payload.empty()) std::memcpy(region->data(), payload.data(), payload.size());
    return Commit(name, meta, std::move(region), checksum);
  }

  // lookup: an object's info and its bytes, inline when small, else pinned for the client to
  // read until it releases them.
  json OnLookup(Session& sess, const json& b, std::string* reply_payload) {
    std::string name = Name(b);
    std::string via = b.value("via", "rma");
    if (via != "rma" && via != "map") Fail(Status::kInvalid, "field 'via' must be \"rma\" or \"map\"");
    Stored& s = Resident(name);
    json r = {{"info", InfoJson(s.info)}};
    if (s.info.size <= wire::kInlineMax) {
      reply_payload->assign(s.region->data(), s.info.size);
      return r;
    }
    if (sess.pins.size() >= 256) Fail(Status::kInvalid, "more than 256 pinned objects in one session");
    if (via == "rma" && !s.region->read_mr.mr) s.region->read_mr = ep->Register(s.region->data(), s.info.size, FI_REMOTE_READ);
    uint64_t id = next_id++;
    sess.pins[id] = s.region;
    r["read"] = id;
    r["offset"] = s.region->offset;
    if (via == "rma") {
      r["addr"] = s.region->read_mr.base;
      r["key"] = s.region->read_mr.key;
    }
    return r;
  }

  // release: a pinned read ends.
  json OnRelease(Session& sess, const json& b) {
    uint64_t id = U64(b, "read");
    if (!sess.pins.erase(id)) Fail(Status::kInvalid, "no pinned read " + std::to_string(id) + " in this session");
    return json::object();
  }

  // stat: an object's info.
  json OnStat(const json& b) {
    std::string name = Name(b);
    auto it = index.find(name);
    if (it == index.end()) Missing(name);
    return {{"info", InfoJson(it->second.info)}};
  }

  // list: the objects under a prefix, a page at a time.
  json OnList(const json& b) {
    std::string prefix = b.value("prefix", std::string());
    std::string after = b.value("after", std::string());
    if (prefix.size() > 255 || after.size() > 255) Fail(Status::kInvalid, "prefix or 'after' longer than 255 bytes");
    json items = json::array();
    size_t bytes = 0;
    bool more = false;
    auto it = after.empty() ? index.lower_bound(prefix) : index.upper_bound(std::max(after, prefix));
    for (; it != index.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      json j = InfoJson(it->second.info);
      size_t add = j.dump().size() + 1;
      if (bytes + add > wire::kListPageBytes && !items.empty()) {
        more = true;
        break;
      }
      bytes += add;
      items.push_back(std::move(j));
    }
    return {{"objects", items}, {"more", more}};
  }

  // remove: an object, or a damaged one moved aside.
  json OnRemove(const json& b) {
    std::string name = Name(b);
    auto it = index.find(name);
    if (it == index.end()) {
      auto d = damaged.find(name);
      if (d == damaged.end()) return {{"removed", false}};
      std::string to;
      try {
        to = persist->MoveAside(name);
      } catch (const Error& e) {
        Fail(Status::kInternal, std::string("moving damaged object aside: ") + e.what());
      }
      damaged.erase(d);
      Log("damaged object '" + name + "' moved aside to " + to);
      return {{"removed", true}, {"moved_to", to}};
    }
    if (it->second.persisted) {
      std::string path = persist->PathOf(name);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        Fail(Status::kInternal, "removing " + path + ": " + std::strerror(errno));
    }
    index.erase(it);
    return {{"removed", true}};
  }

  // capacity: what `msaflow nam df` shows.
  json OnCapacity() {
    size_t resident = 0;
    uint64_t pinned = 0;
    for (const auto& [n, s] : index) resident += s.region ? 1 : 0;
    for (const auto& [id, s] : sessions) pinned += s.pins.size();
    return {{"capacity", pool->capacity()}, {"used", pool->used()}, {"largest_free", pool->largest_free()},
            {"objects", index.size()}, {"resident", resident}, {"pinned", pinned},
            {"uncommitted", puts.size()}, {"sessions", sessions.size()},
            {"persist", persist ? persist->dir() : ""}, {"requests", requests}, {"rejected", rejected},
            {"damaged", damaged.size()}, {"damaged_names", DamagedNames()}};
  }

  // One request of session `sid`: its handler's reply (and bytes for a small lookup in
  // `reply_payload`). Fail() throws the error reply.
  json Handle(Op op, uint64_t sid, Session& sess, const json& b, std::string_view payload,
              std::string* reply_payload) {
    switch (op) {
      case Op::kAlloc: return OnAlloc(sid, sess, b);
      case Op::kCommit:
      case Op::kAbort: return OnFinish(op, sid, sess, b);
      case Op::kPutInline: return OnPutInline(b, payload);
      case Op::kLookup: return OnLookup(sess, b, reply_payload);
      case Op::kRelease: return OnRelease(sess, b);
      case Op::kStat: return OnStat(b);
      case Op::kList: return OnList(b);
      case Op::kRemove: return OnRemove(b);
      case Op::kCapacity: return OnCapacity();
      case Op::kBye: return json::object();
      case Op::kHello: break;
    }
    Fail(Status::kProtocol, "unknown operation " + std::to_string(static_cast<int>(op)));
  }

  void OnMessage(const char* buf, size_t len) {
    ++requests;
    wire::Message m;
    std::string bad = wire::Parse(buf, len, &m);
    const wire::Header& h = m.header;
    if (bad.empty() && (h.op & wire::kReplyBit)) bad = "a reply sent to the server";
    if (bad.empty() && m.addr.empty()) bad = "no reply address";
    if (!bad.empty()) {
      ++rejected;
      // Answer when there is an address to answer to, then forget that session.
      std::string_view addr;
      if (len >= wire::kHeaderSize && h.magic == wire::kMagic && h.addr_len > 0 && h.addr_len <= wire::kMaxAddr &&
          wire::kHeaderSize + h.addr_len <= len)
        addr = std::string_view(buf + wire::kHeaderSize, h.addr_len);
      if (!addr.empty()) {
        try {
          Send(AddrOf(std::string(addr)), h.op & ~wire::kReplyBit, h.session, h.request, Status::kProtocol,
               {{"error", "malformed message: " + bad}});
        } catch (const Reject&) {
        } catch (const Error&) {
        }
      } else {
        ++dropped;
      }
      if (h.session) DropSession(h.session, "malformed message: " + bad);
      if (opt.verbose) Log("malformed message: " + bad);
      return;
    }
    std::string raw_addr(m.addr);
    Op op = static_cast<Op>(h.op);
    fi_addr_t reply_to;
    try {
      reply_to = AddrOf(raw_addr);
    } catch (const Reject&) {
      ++dropped;
      return;
    } catch (const Error& e) {
      ++dropped;
      if (opt.verbose) Log(std::string("unusable reply address: ") + e.what());
      return;
    }
    uint64_t sid = h.session;
    json body = json::parse(m.json, nullptr, false);
    std::string reply_payload;
    try {
      if (body.is_discarded() || !body.is_object()) Fail(Status::kProtocol, "the JSON part is not a JSON object");
      if (op == Op::kHello) {
        if (sid != 0) Fail(Status::kProtocol, "HELLO must carry session 0");
        json r = Hello(body, raw_addr, &sid);
        Send(reply_to, h.op, sid, h.request, Status::kOk, r);
        if (opt.verbose) Log("session " + Hex64(sid).substr(8) + " opened by " + body.value("host", "?"));
        return;
      }
      auto it = sessions.find(sid);
      if (it == sessions.end() || it->second.raw_addr != raw_addr)
        Fail(Status::kStaleSession, "unknown or expired session (the server may have restarted); say hello again");
      Session& sess = it->second;
      sess.last_seen = clock().Now();
      json r = Handle(op, sid, sess, body, m.payload, &reply_payload);
      Send(reply_to, h.op, sid, h.request, Status::kOk, r, reply_payload);
      if (op == Op::kBye) DropSession(sid, "bye");
      if (opt.verbose) Log("op " + std::to_string(h.op) + " ok");
    } catch (const Reject& r) {
      if (r.status == Status::kProtocol || r.status == Status::kUnauthorized) ++rejected;
      Send(reply_to, h.op, sid, h.request, r.status, {{"error", r.message}});
      if (r.status == Status::kProtocol) DropSession(sid, r.message);
      if (opt.verbose || r.status == Status::kProtocol || r.status == Status::kUnauthorized)
        Log("request refused: " + r.message);
    } catch (const Error& e) {
      Send(reply_to, h.op, sid, h.request, Status::kInternal, {{"error", e.what()}});
      Log(std::string("internal error: ") + e.what());
    }
  }

  void Run(const std::atomic<bool>& stop) {
    if (!opt.ready_file.empty()) {
      json ready = {{"uri", Uri()}, {"pid", ::getpid()}, {"provider", ep->provider()}, {"capacity", pool->capacity()}};
      // Placed by Slurm: where, so the coordinator can say so (and cancel the job if need be).
      if (const char* job = std::getenv("SLURM_JOB_ID")) ready["slurm_job"] = job;
      if (const char* node = std::getenv("SLURMD_NODENAME")) ready["node"] = node;
      WriteFileAtomic(opt.ready_file, ready.dump() + "\n");
      wrote_ready = true;
    }
    Log("serving " + Uri() + " (provider " + ep->provider() + ", capacity " + HumanBytes(static_cast<double>(pool->capacity())) +
        (persist ? ", persist " + persist->dir() : ", memory only") + (token.empty() ? "" : ", token required") + ")");
    auto last_sweep = clock().Now(), last_users_check = clock().Now();
    while (!stop.load()) {
      if (backlog.empty()) Progress(100);
      while (!backlog.empty()) {
        fabric::Completion c = backlog.front();
        backlog.pop_front();
        if (!c.ctx || c.ctx->kind != kRecv) continue;
        RecvBuf* r = reinterpret_cast<RecvBuf*>(c.ctx);
        if (c.err) {
          ++dropped;
          if (opt.verbose) Log("receive failed: " + c.what);
        } else {
          OnMessage(r->data.data(), c.len);
        }
        PostRecv(*r);
      }
      if (Seconds(clock().Now() - last_sweep) > 1) {
        ExpireSessions();
        last_sweep = clock().Now();
      }
      if (Seconds(clock().Now() - last_users_check) > 0.25) {
        if (NoUsersLeft()) break;
        last_users_check = clock().Now();
      }
    }
    Log("stopping: " + std::to_string(index.size()) + " objects, " + HumanBytes(static_cast<double>(pool->used())) + " in memory" +
        (persist ? " (persisted objects stay in " + persist->dir() + ")" : " (memory only: they are gone)"));
  }

  // True once no run holds the users lock; the server then holds it until it has exited.
  bool NoUsersLeft() {
    if (opt.users_lock.empty()) return false;
    if (users_fd < 0) {
      users_fd = ::open(opt.users_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (users_fd < 0) return false;
    }
    if (::flock(users_fd, LOCK_EX | LOCK_NB) != 0) return false;
    Log("no run uses this server any more (" + opt.users_lock + ")");
    return true;
  }

  ~Impl() {
    // The ready file goes first, while this server still holds the persist directory: a
    // server started after it never has its ready file removed by this one.
    if (wrote_ready) ::unlink(opt.ready_file.c_str());
    sessions.clear();
    puts.clear();
    index.clear();
    for (auto& r : recvs) fabric::Endpoint::Deregister(r->mr);
    for (auto& s : sends) fabric::Endpoint::Deregister(s->mr);
    ep.reset();
    if (persist_lock_fd >= 0) ::close(persist_lock_fd);
    if (users_fd >= 0) ::close(users_fd);  // after the ready file is gone: a run waiting on it starts a new server
  }
};

Server::Server(const ServerOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = options;
  impl_->Open();
}

Server::~Server() = default;

std::string Server::Uri() const { return impl_->Uri(); }

void Server::Run(const std::atomic<bool>& stop) { impl_->Run(stop); }

}  // namespace msaflow::nam
