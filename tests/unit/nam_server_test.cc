// The NAM server and its fabric:// client, driven in-process over real libfabric endpoints
// (tcp;ofi_rxm and shm on loopback), plus the pool allocator and the fault-injecting store.
#include <gtest/gtest.h>
#include <rdma/fi_errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "nam/fabric.h"
#include "nam/fabric_store.h"
#include "nam/fault_store.h"
#include "nam/mem_store.h"
#include "nam/pool.h"
#include "nam/protocol.h"
#include "nam/raw_client.h"
#include "nam/server.h"
#include "nam/verify.h"

namespace msaflow::nam {
namespace {

using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/msaflow-namsrv-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ErrorKind KindOf(const std::function<void()>& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (what) *what = e.what();
    return e.kind();
  }
  return ErrorKind::kInternal;
}

// A server running on its own thread for the life of the object.
class TestServer {
 public:
  explicit TestServer(ServerOptions o) {
    o.log = stderr;
    server_ = std::make_unique<Server>(o);
    uri_ = server_->Uri();
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  ~TestServer() { Stop(); }
  void Stop() {
    if (thread_.joinable()) {
      stop_ = true;
      thread_.join();
      server_.reset();
    }
  }
  std::string Uri(const std::string& extra = "") const {
    if (extra.empty()) return uri_;
    return uri_ + (uri_.find('?') == std::string::npos ? "?" : "&") + extra;
  }

 private:
  std::atomic<bool> stop_{false};
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::string uri_;
};

// A server in its own process (`msaflow nam serve`): the shm provider cannot put a server and
// a client endpoint in one process, and this is how users run it anyway.
class ProcessServer {
 public:
  explicit ProcessServer(const ServerOptions& o) {
    const char* exe = std::getenv("MSAFLOW_BIN");
    if (!exe) throw std::runtime_error("MSAFLOW_BIN is not set (meson test sets it)");
    ready_ = dir_.path() + "/ready.json";
    std::vector<std::string> args = {exe, "nam", "serve", "--listen", o.listen, "--provider", o.provider,
                                     "--capacity", std::to_string(o.capacity), "--ready-file", ready_};
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 400 && !PathExists(ready_); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    uri_ = json::parse(ReadFile(ready_)).at("uri");
  }
  ~ProcessServer() {
    ::kill(pid_, SIGTERM);
    int st;
    ::waitpid(pid_, &st, 0);
  }
  const std::string& Uri() const { return uri_; }
  std::string Uri(const std::string& extra) const {
    return uri_ + (uri_.find('?') == std::string::npos ? "?" : "&") + extra;
  }

 private:
  TempDir dir_;
  std::string ready_, uri_;
  pid_t pid_ = -1;
};

ServerOptions Opts(const std::string& provider = "tcp", uint64_t capacity = 256ull << 20) {
  ServerOptions o;
  o.provider = provider;
  o.capacity = capacity;
  static int port = 21000 + ::getpid() % 20000;
  o.listen = provider == "shm" ? "127.0.0.1:" + std::to_string(port++) : "127.0.0.1:0";
  return o;
}

std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

// ---- pool ----

TEST(Pool, AllocatesFirstFitAndCoalesces) {
  Pool p(1 << 20);
  auto a = p.Allocate(1000), b = p.Allocate(5000), c = p.Allocate(100);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a % Pool::kAlign, 0u);
  EXPECT_EQ(*b, Pool::Rounded(1000));
  EXPECT_EQ(p.used(), Pool::Rounded(1000) + Pool::Rounded(5000) + Pool::Rounded(100));
  p.Free(*b, 5000);
  EXPECT_EQ(*p.Allocate(4000), *b);  // the hole is reused
  p.Free(*b, 4000);
  p.Free(*a, 1000);
  p.Free(*c, 100);
  EXPECT_EQ(p.used(), 0u);
  EXPECT_EQ(p.largest_free(), p.capacity());  // all coalesced back into one extent
  EXPECT_FALSE(p.Allocate(p.capacity() + 1).has_value());
  EXPECT_TRUE(p.Allocate(p.capacity()).has_value());
}

TEST(Pool, ParsesSizes) {
  EXPECT_EQ(ParseSize("4096", "x"), 4096u);
  EXPECT_EQ(ParseSize("512MiB", "x"), 512ull << 20);
  EXPECT_EQ(ParseSize("2g", "x"), 2ull << 30);
  EXPECT_EQ(ParseSize("1.5KiB", "x"), 1536u);
  std::string what;
  EXPECT_EQ(KindOf([] { ParseSize("12 parsecs", "--capacity"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("--capacity"), std::string::npos);
  EXPECT_EQ(KindOf([] { ParseSize("", "--capacity"); }), ErrorKind::kInvalidInput);
}

// ---- the store contract over every provider and transport ----

struct Case {
  std::string provider, transport;
};

class FabricContract : public ::testing::TestWithParam<Case> {};

TEST_P(FabricContract, BehavesLikeEveryStore) {
  ProcessServer srv(Opts(GetParam().provider));
  FabricStore s(srv.Uri("transport=" + GetParam().transport + "&timeout=10"));
  EXPECT_EQ(s.Transport(), GetParam().transport);
  EXPECT_FALSE(s.Stat("a/b").has_value());
  EXPECT_EQ(KindOf([&] { s.Get("a/b"); }), ErrorKind::kNotFound);
  EXPECT_EQ(s.Put("a/b", "hello", {{"k", 1}}).version, 1u);
  EXPECT_EQ(s.Put("a/b", "world!", {{"k", 2}}).version, 2u);
  Object o = s.Get("a/b");
  EXPECT_EQ(o.bytes, "world!");
  EXPECT_EQ(o.info.meta["k"], 2);
  // Sizes around the inline limit and the RMA chunk size, checked byte for byte.
  for (size_t n : {size_t{0}, size_t{1}, wire::kInlineMax, wire::kInlineMax + 1, wire::kRmaChunk - 1,
                   wire::kRmaChunk * 3 + 17, size_t{40} << 20}) {
    std::string name = "sizes/" + std::to_string(n);
    std::string bytes = Pattern(n, n);
    ObjectInfo info = s.Put(name, bytes, nullptr);
    EXPECT_EQ(info.size, n);
    EXPECT_EQ(info.checksum, ChecksumHex(bytes));
    std::string back;
    s.GetInto(name, back);
    EXPECT_TRUE(back == bytes) << "size " << n;
  }
  EXPECT_EQ(s.List("a/").size(), 1u);
  EXPECT_EQ(s.List("sizes/").size(), 7u);
  EXPECT_TRUE(s.Remove("a/b"));
  EXPECT_FALSE(s.Remove("a/b"));
  EXPECT_EQ(KindOf([&] { s.Put("../x", "y", nullptr); }), ErrorKind::kInvalidInput);
  json cap = s.Capacity();
  EXPECT_EQ(cap["objects"], 7);
  EXPECT_EQ(cap["pinned"], 0);
  EXPECT_EQ(cap["uncommitted"], 0);
}

INSTANTIATE_TEST_SUITE_P(Nam, FabricContract,
                         ::testing::Values(Case{"tcp", "rma"}, Case{"tcp", "map"}, Case{"shm", "rma"},
                                           Case{"shm", "map"}),
                         [](const auto& info) { return info.param.provider + "_" + info.param.transport; });

TEST(NamServer, ListPagesThroughManyObjects) {
  TestServer srv(Opts());
  FabricStore s(srv.Uri());
  std::string long_meta(2000, 'm');
  for (int i = 0; i < 60; ++i) s.Put("many/" + std::to_string(1000 + i), "x", {{"pad", long_meta}});
  auto all = s.List("many/");
  ASSERT_EQ(all.size(), 60u);  // more than one page of 24 KiB
  for (int i = 0; i < 60; ++i) EXPECT_EQ(all[static_cast<size_t>(i)].name, "many/" + std::to_string(1000 + i));
}

TEST(NamServer, ReadersSeeWholeObjectsWhileAWriterReplacesThem) {
  TestServer srv(Opts("tcp", 512ull << 20));
  std::atomic<bool> done{false};
  // One reader per transport, both reading while the writer replaces the object (a reader
  // that only started after the writer finished would prove nothing).
  struct Reader {
    std::string transport, used;
    int reads = 0, during_writes = 0;
    std::string error;
  };
  std::vector<Reader> readers(2);
  readers[0].transport = "rma";
  readers[1].transport = "map";
  std::vector<std::thread> threads;
  for (auto& rd : readers)
    threads.emplace_back([&srv, &done, &rd] {
      try {
        FabricStore r(srv.Uri("transport=" + rd.transport));
        while (!done || rd.reads < 5) {
          const bool writing = !done;
          std::string b;
          try {
            r.GetInto("hot/x", b);
          } catch (const Error& e) {
            if (e.kind() != ErrorKind::kNotFound) throw;  // not found: before the first put
            continue;
          }
          if (b.size() != (3u << 20) && b.size() != (5u << 20)) throw std::runtime_error("object of " + std::to_string(b.size()) + " bytes");
          if (b.find_first_not_of(b[0]) != std::string::npos) throw std::runtime_error("a torn object");
          ++rd.reads;
          rd.during_writes += writing && !done ? 1 : 0;
        }
        rd.used = r.Transport();
      } catch (const std::exception& e) {
        rd.error = e.what();
      }
    });
  std::thread writer([&] {
    FabricStore w(srv.Uri("transport=rma"));
    for (int i = 0; i < 30; ++i) w.Put("hot/x", std::string((i % 2 ? 3 : 5) << 20, static_cast<char>('a' + i % 26)), nullptr);
    done = true;
  });
  writer.join();
  for (auto& t : threads) t.join();
  for (const auto& rd : readers) {
    EXPECT_EQ(rd.error, "") << rd.transport;
    EXPECT_EQ(rd.used, rd.transport);  // the transport asked for is the one that moved the bytes
    EXPECT_GE(rd.reads, 5) << rd.transport;
    EXPECT_GE(rd.during_writes, 1) << rd.transport << ": no read overlapped the writes";
  }
}

TEST(NamServer, FullPoolIsAClearErrorAndLosesNothing) {
  TestServer srv(Opts("tcp", 8ull << 20));
  FabricStore s(srv.Uri());
  std::string five(5 << 20, 'f');
  s.Put("x/first", five, nullptr);
  std::string what;
  EXPECT_EQ(KindOf([&] { s.Put("x/second", five, nullptr); }, &what), ErrorKind::kCapacity);
  EXPECT_NE(what.find("NAM full"), std::string::npos) << what;
  EXPECT_NE(what.find("capacity"), std::string::npos) << what;
  EXPECT_EQ(KindOf([&] { s.Put("x/huge", std::string(9 << 20, 'h'), nullptr); }, &what), ErrorKind::kCapacity);
  EXPECT_EQ(s.Get("x/first").bytes, five);  // nothing was evicted
  EXPECT_FALSE(s.Stat("x/second").has_value());
  EXPECT_EQ(s.Capacity()["uncommitted"], 0);
}

TEST(NamServer, PersistsWritesThroughReloadsAndEvictsOnlyPersisted) {
  TempDir dir;
  std::vector<std::string> objs;
  for (int i = 0; i < 4; ++i) objs.push_back(Pattern(3 << 20, static_cast<uint64_t>(i)));
  {
    ServerOptions o = Opts("tcp", 8ull << 20);
    o.persist_dir = dir.path();
    TestServer srv(o);
    FabricStore s(srv.Uri());
    // 12 MiB into an 8 MiB pool: idle persisted objects make room.
    for (int i = 0; i < 4; ++i) s.Put("p/" + std::to_string(i), objs[static_cast<size_t>(i)], {{"i", i}});
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(s.Get("p/" + std::to_string(i)).bytes == objs[static_cast<size_t>(i)]);
    EXPECT_EQ(s.Put("p/0", objs[0], nullptr).version, 2u);
  }
  // The layout is the file:// one: a FileStore reads what the server persisted.
  {
    auto fs = OpenStore("file://" + dir.path());
    EXPECT_TRUE(fs->Get("p/3").bytes == objs[3]);
  }
  ServerOptions o = Opts("tcp", 8ull << 20);
  o.persist_dir = dir.path();
  TestServer again(o);
  FabricStore s(again.Uri());
  EXPECT_EQ(s.List("p/").size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(s.Get("p/" + std::to_string(i)).bytes == objs[static_cast<size_t>(i)]);
  EXPECT_EQ(s.Stat("p/0")->version, 2u);
  EXPECT_EQ(s.Put("p/0", "x", nullptr).version, 3u);  // versions keep increasing across restarts
  // A second server on the same directory is refused.
  std::string what;
  EXPECT_EQ(KindOf([&] { Server second(o); }, &what), ErrorKind::kIo);
  EXPECT_NE(what.find("another NAM server"), std::string::npos) << what;
}

// Issue 14: names the docs allow, up to 255 bytes with segments up to 251, work on a
// persisting server (the temporary file's suffix once made them "File name too long").
TEST(NamServer, LongestNamesPersist) {
  TempDir dir;
  ServerOptions o = Opts("tcp", 64ull << 20);
  o.persist_dir = dir.path();
  const std::string longest = std::string(251, 'a');                       // one segment
  const std::string deep = std::string(120, 'b') + "/" + std::string(134, 'c');  // 255 bytes
  ASSERT_EQ(deep.size(), 255u);
  {
    TestServer srv(o);
    FabricStore s(srv.Uri());
    s.Put(longest, "one", nullptr);
    s.Put(deep, "two", nullptr);
    std::string what;
    EXPECT_EQ(KindOf([&] { s.Put(std::string(252, 'a'), "x", nullptr); }, &what), ErrorKind::kInvalidInput);
    EXPECT_NE(what.find("a segment of 252 bytes, longer than 251"), std::string::npos) << what;
  }
  TestServer again(o);
  FabricStore s(again.Uri());
  EXPECT_EQ(s.Get(longest).bytes, "one");
  EXPECT_EQ(s.Get(deep).bytes, "two");
}

// Issue 14: a persisted object whose header was damaged is reported when the server starts
// and read as corrupt (not "no object"); verify --repair moves it aside.
TEST(NamServer, DamagedPersistedObjectsAreReportedNotHidden) {
  TempDir dir;
  {
    auto fs = OpenStore("file://" + dir.path());
    fs->Put("d/good", "fine", nullptr);
    fs->Put("d/bad", "will be damaged", nullptr);
  }
  {
    std::string path = dir.path() + "/d/bad.nam", bytes = ReadFile(path);
    bytes[0] = 'X';  // the magic
    WriteFileAtomic(path, bytes);
  }
  ServerOptions o = Opts("tcp", 8ull << 20);
  o.persist_dir = dir.path();
  char* log_text = nullptr;
  size_t log_size = 0;
  std::FILE* log = ::open_memstream(&log_text, &log_size);
  o.log = log;
  {
    auto server = std::make_unique<Server>(o);
    std::fflush(log);
    std::string started(log_text, log_size);
    EXPECT_NE(started.find("DAMAGED persisted object 'd/bad': "), std::string::npos) << started;
    EXPECT_NE(started.find("1 DAMAGED"), std::string::npos) << started;
    std::atomic<bool> stop{false};
    std::thread t([&] { server->Run(stop); });
    {
      FabricStore s(server->Uri());
      std::string what;
      EXPECT_EQ(KindOf([&] { s.Get("d/bad"); }, &what), ErrorKind::kCorrupt);
      EXPECT_NE(what.find("damaged in the persist directory"), std::string::npos) << what;
      EXPECT_EQ(KindOf([&] { s.Stat("d/bad"); }), ErrorKind::kCorrupt);
      EXPECT_EQ(s.Get("d/good").bytes, "fine");
      EXPECT_EQ(s.Capacity()["damaged"], 1);
      VerifyReport r = Verify(s, false);
      EXPECT_EQ(r.objects, 2);
      ASSERT_EQ(r.damaged.size(), 1u);
      EXPECT_EQ(r.damaged[0].name, "d/bad");
      r = Verify(s, true);
      ASSERT_EQ(r.damaged.size(), 1u);
      EXPECT_NE(r.damaged[0].moved_to, "");
      EXPECT_EQ(KindOf([&] { s.Get("d/bad"); }), ErrorKind::kNotFound);  // aside now
      EXPECT_TRUE(Verify(s, false).damaged.empty());
    }
    stop = true;
    t.join();
  }
  std::fclose(log);
  std::free(log_text);
  EXPECT_TRUE(PathExists(dir.path() + "/DAMAGED/d/bad.nam"));
}

// Issue 14: "Address already in use" did not say which address.
TEST(NamServer, APortInUseIsNamed) {
  TestServer first(Opts());
  const std::string uri = first.Uri();
  const std::string port = uri.substr(uri.rfind(':') + 1);
  ServerOptions o = Opts();
  o.listen = "127.0.0.1:" + port;
  std::string what;
  EXPECT_EQ(KindOf([&] { Server second(o); }, &what), ErrorKind::kUnavailable);
  EXPECT_NE(what.find("listening on 127.0.0.1:" + port), std::string::npos) << what;
  EXPECT_NE(what.find("Address already in use"), std::string::npos) << what;
}

// Found by fuzz/nam_wire_fuzz.cc: a reply (no address) with an empty JSON part passed a null
// pointer to memcpy, undefined behaviour that UBSan stops at (scripts/sanitize.sh asan).
TEST(NamWire, BuildsMessagesWithEmptyParts) {
  wire::Header h;
  h.op = static_cast<uint16_t>(wire::Op::kStat) | wire::kReplyBit;
  std::string out(wire::kMaxMessage, '\0');
  out.resize(wire::Build(h, std::string_view(), std::string_view(), std::string_view(), out.data()));
  ASSERT_EQ(out.size(), wire::kHeaderSize);
  wire::Message m;
  EXPECT_EQ(wire::Parse(out.data(), out.size(), &m), "");
  EXPECT_TRUE(m.addr.empty());
  EXPECT_TRUE(m.json.empty());
  EXPECT_TRUE(m.payload.empty());
}

TEST(NamServer, TokenIsRequiredWhenConfiguredAndOffLoopback) {
  TempDir dir;
  std::string token_file = dir.path() + "/token";
  WriteFileAtomic(token_file, "0123456789abcdef-secret\n");
  ServerOptions o = Opts();
  o.token_file = token_file;
  TestServer srv(o);
  std::string what;
  {
    FabricStore anonymous(srv.Uri("timeout=5"));
    EXPECT_EQ(KindOf([&] { anonymous.Stat("a"); }, &what), ErrorKind::kInvalidInput);
    EXPECT_NE(what.find("token"), std::string::npos) << what;
  }
  FabricStore with(srv.Uri("token-file=" + token_file));
  with.Put("a", "b", nullptr);
  EXPECT_EQ(with.Get("a").bytes, "b");
  ServerOptions open = Opts();
  open.listen = "0.0.0.0:0";
  EXPECT_EQ(KindOf([&] { Server s(open); }, &what), ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("needs a token"), std::string::npos) << what;
}

TEST(NamServer, ClientOfADeadServerGetsAnErrorNotAHang) {
  auto srv = std::make_unique<TestServer>(Opts());
  std::string uri = srv->Uri("timeout=2");
  FabricStore s(uri);
  s.Put("a", "b", nullptr);
  srv.reset();
  auto t0 = std::chrono::steady_clock::now();
  std::string what;
  ErrorKind k = KindOf([&] { s.Get("a"); }, &what);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(k, ErrorKind::kUnavailable) << what;
  EXPECT_LT(secs, 10.0);
  FabricStore never("fabric://127.0.0.1:1?timeout=1");
  EXPECT_EQ(KindOf([&] { never.Stat("a"); }), ErrorKind::kUnavailable);
}

TEST(NamServer, UriErrorsNameThePart) {
  std::string what;
  EXPECT_EQ(KindOf([] { ParseFabricUri("fabric://localhost"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_EQ(KindOf([] { ParseFabricUri("fabric://h:99999"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_EQ(KindOf([] { ParseFabricUri("fabric://h:1?transport=carrier-pigeon"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("transport"), std::string::npos);
  EXPECT_EQ(KindOf([] { ParseFabricUri("fabric://h:1?colour=red"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("colour"), std::string::npos);
  FabricUri u = ParseFabricUri("fabric://[::1]:7000?provider=shm&timeout=2.5");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "7000");
  EXPECT_EQ(u.provider, "shm");
  EXPECT_DOUBLE_EQ(u.timeout_s, 2.5);
}

// ---- hostile and malformed messages, sent raw over the fabric ----

TEST(NamServer, HostileMessagesGetErrorsAndTheServerServesOthers) {
  TestServer srv(Opts("tcp", 16ull << 20));
  FabricStore good(srv.Uri());
  good.Put("keep/me", "precious", nullptr);
  RawClient raw(srv.Uri());
  using wire::Op;
  using St = wire::Status;
  // Garbage without a reply address: dropped, no reply.
  EXPECT_EQ(raw.Send(std::string(100, '\x7f'), 0.5).status, -1);
  // Wrong protocol version: an error reply.
  std::string v99 = raw.Message(Op::kHello, "{}", 0);
  wire::PutU16(v99.data() + 4, 99);
  EXPECT_EQ(raw.Send(v99).status, static_cast<int>(St::kProtocol));
  // A header announcing more JSON than the message holds.
  std::string lying = raw.Message(Op::kHello, "{}", 0);
  wire::PutU32(lying.data() + 28, 30000);
  EXPECT_EQ(raw.Send(lying).status, static_cast<int>(St::kProtocol));
  // A request without a session.
  EXPECT_EQ(raw.Send(raw.Message(Op::kStat, json({{"name", "keep/me"}}).dump(), 12345)).status, static_cast<int>(St::kStaleSession));
  // Now a proper session, then bad requests inside it.
  auto hello = raw.Send(raw.Message(Op::kHello, "{}", 0));
  ASSERT_EQ(hello.status, 0);
  uint64_t sid = raw.session();
  auto r = raw.Send(raw.Message(Op::kAlloc, json({{"name", "../etc/passwd"}, {"size", 10}}).dump(), sid));
  EXPECT_EQ(r.status, static_cast<int>(St::kInvalid));
  EXPECT_NE(r.json.find("not allowed"), std::string::npos) << r.json;
  EXPECT_EQ(raw.Send(raw.Message(Op::kAlloc, json({{"name", "x/big"}, {"size", 1ull << 40}}).dump(), sid)).status,
            static_cast<int>(St::kFull));
  EXPECT_EQ(raw.Send(raw.Message(Op::kAlloc, json({{"name", "x/neg"}, {"size", -5}}).dump(), sid)).status, static_cast<int>(St::kInvalid));
  EXPECT_EQ(raw.Send(raw.Message(Op::kCommit, json({{"alloc", 999999}, {"checksum", "0000000000000000"}}).dump(), sid)).status,
            static_cast<int>(St::kInvalid));
  // An inline put whose bytes do not match its checksum is refused, and nothing appears.
  EXPECT_EQ(raw.Send(raw.Message(Op::kPutInline, json({{"name", "x/lie"}, {"checksum", "0123456789abcdef"}}).dump(), sid, 7, "data")).status,
            static_cast<int>(St::kCorrupt));
  EXPECT_FALSE(good.Stat("x/lie").has_value());
  // An allocation of the whole pool, never committed, is released when the session closes.
  EXPECT_EQ(raw.Send(raw.Message(Op::kAlloc, json({{"name", "x/hog"}, {"size", 15ull << 20}}).dump(), sid)).status, 0);
  EXPECT_EQ(good.Capacity()["uncommitted"], 1);
  // Protocol violations close the session: an unknown operation...
  EXPECT_EQ(raw.Send(raw.Message(static_cast<Op>(999), "{}", sid)).status, static_cast<int>(St::kProtocol));
  // ... after which the session is gone, and so is its allocation.
  EXPECT_EQ(raw.Send(raw.Message(Op::kStat, json({{"name", "keep/me"}}).dump(), sid)).status, static_cast<int>(St::kStaleSession));
  EXPECT_EQ(good.Capacity()["uncommitted"], 0);
  // JSON that is not an object, in a fresh session.
  ASSERT_EQ(raw.Send(raw.Message(Op::kHello, "{}", 0)).status, 0);
  std::string notjson = raw.Message(Op::kStat, "[1, 2]", raw.session());
  EXPECT_EQ(raw.Send(notjson).status, static_cast<int>(St::kProtocol));
  // Everyone else is still served, and the object is intact.
  EXPECT_EQ(good.Get("keep/me").bytes, "precious");
  good.Put("keep/more", std::string(2 << 20, 'm'), nullptr);
  EXPECT_GE(good.Capacity()["rejected"].get<int>(), 3);
}

// A session silent past its lease is dropped with what it held: an allocation of the whole pool,
// never committed, is free again. On a clock the test moves: the 60 s lease takes no waiting.
TEST(NamServer, ASilentSessionIsDroppedAfterItsLeaseWithItsAllocations) {
  ManualClock clock;
  ServerOptions o = Opts("tcp", 16ull << 20);
  o.lease_s = 60;
  o.clock = &clock;
  TestServer srv(o);
  FabricStore good(srv.Uri());
  RawClient raw(srv.Uri());
  using wire::Op;
  ASSERT_EQ(raw.Send(raw.Message(Op::kHello, "{}", 0)).status, 0);
  const uint64_t sid = raw.session();
  ASSERT_EQ(raw.Send(raw.Message(Op::kAlloc, json({{"name", "x/hog"}, {"size", 15ull << 20}}).dump(), sid)).status, 0);
  EXPECT_EQ(good.Capacity()["uncommitted"], 1);
  clock.AdvanceSeconds(59);  // within the lease (the other client's requests are its own session's)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server's loop sweeps in real time
  EXPECT_EQ(good.Capacity()["uncommitted"], 1);
  clock.AdvanceSeconds(2);  // 61 s without a word
  int64_t left = 1;
  for (int i = 0; i < 50 && left != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = good.Capacity()["uncommitted"].get<int64_t>();
  }
  EXPECT_EQ(left, 0);
  EXPECT_EQ(raw.Send(raw.Message(Op::kStat, json({{"name", "x/hog"}}).dump(), sid)).status,
            static_cast<int>(wire::Status::kStaleSession));
  good.Put("x/after", std::string(15 << 20, 'a'), nullptr);  // the pool is whole again
}

// Each operation's handler against a real server process, as another client would abuse it:
// one session may not commit, abort or release what another session allocated or pinned, and
// each handler's limits hold (uncommitted puts per session, a transport that does not exist,
// an oversized list prefix). The owner's own requests still work afterwards.
TEST(NamServer, OneSessionCannotTouchAnothersPutsOrPinsAndEachOperationKeepsItsLimits) {
  ProcessServer srv(Opts("tcp", 16ull << 20));
  FabricStore good(srv.Uri());
  good.Put("keep/big", std::string(64 << 10, 'b'), nullptr);  // larger than inline: a lookup pins it
  RawClient owner(srv.Uri()), other(srv.Uri());
  using wire::Op;
  using St = wire::Status;
  ASSERT_EQ(owner.Send(owner.Message(Op::kHello, "{}", 0)).status, 0);
  ASSERT_EQ(other.Send(other.Message(Op::kHello, "{}", 0)).status, 0);
  const uint64_t mine = owner.session(), theirs = other.session();
  ASSERT_NE(mine, theirs);
  auto field = [](const RawClient::Reply& r, const char* k) { return json::parse(r.json).at(k).get<uint64_t>(); };
  // A put in progress: the other session can neither commit nor abort it.
  auto alloc = owner.Send(owner.Message(Op::kAlloc, json({{"name", "x/mine"}, {"size", 10}}).dump(), mine));
  ASSERT_EQ(alloc.status, 0) << alloc.json;
  const uint64_t id = field(alloc, "alloc");
  EXPECT_EQ(other.Send(other.Message(Op::kCommit, json({{"alloc", id}, {"checksum", "0000000000000000"}}).dump(), theirs)).status,
            static_cast<int>(St::kInvalid));
  EXPECT_EQ(other.Send(other.Message(Op::kAbort, json({{"alloc", id}}).dump(), theirs)).status, static_cast<int>(St::kInvalid));
  EXPECT_EQ(good.Capacity()["uncommitted"], 1);  // still the owner's
  EXPECT_EQ(owner.Send(owner.Message(Op::kAbort, json({{"alloc", id}}).dump(), mine)).status, 0);
  EXPECT_EQ(good.Capacity()["uncommitted"], 0);
  // A pinned read: the other session cannot release it; the owner can, once.
  auto look = owner.Send(owner.Message(Op::kLookup, json({{"name", "keep/big"}, {"via", "rma"}}).dump(), mine));
  ASSERT_EQ(look.status, 0) << look.json;
  const uint64_t read = field(look, "read");
  EXPECT_EQ(good.Capacity()["pinned"], 1);
  EXPECT_EQ(other.Send(other.Message(Op::kRelease, json({{"read", read}}).dump(), theirs)).status, static_cast<int>(St::kInvalid));
  EXPECT_EQ(good.Capacity()["pinned"], 1);
  EXPECT_EQ(owner.Send(owner.Message(Op::kRelease, json({{"read", read}}).dump(), mine)).status, 0);
  EXPECT_EQ(owner.Send(owner.Message(Op::kRelease, json({{"read", read}}).dump(), mine)).status, static_cast<int>(St::kInvalid));
  EXPECT_EQ(good.Capacity()["pinned"], 0);
  // A transport that does not exist, for a put and for a read.
  EXPECT_EQ(other.Send(other.Message(Op::kAlloc, json({{"name", "x/v"}, {"size", 1}, {"via", "carrier-pigeon"}}).dump(), theirs)).status,
            static_cast<int>(St::kInvalid));
  EXPECT_EQ(other.Send(other.Message(Op::kLookup, json({{"name", "keep/big"}, {"via", "carrier-pigeon"}}).dump(), theirs)).status,
            static_cast<int>(St::kInvalid));
  // A list prefix past the limit of a name.
  EXPECT_EQ(other.Send(other.Message(Op::kList, json({{"prefix", std::string(300, 'p')}}).dump(), theirs)).status,
            static_cast<int>(St::kInvalid));
  // At most 64 uncommitted puts in one session: the 65th is refused, the others are held.
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(other.Send(other.Message(Op::kAlloc, json({{"name", "x/p" + std::to_string(i)}, {"size", 1}}).dump(), theirs)).status, 0)
        << i;
  auto over = other.Send(other.Message(Op::kAlloc, json({{"name", "x/p64"}, {"size", 1}}).dump(), theirs));
  EXPECT_EQ(over.status, static_cast<int>(St::kInvalid));
  EXPECT_NE(over.json.find("more than 64 uncommitted puts"), std::string::npos) << over.json;
  EXPECT_EQ(good.Capacity()["uncommitted"], 64);
  // The server serves on, and nothing half-written became visible.
  EXPECT_EQ(good.Get("keep/big").bytes, std::string(64 << 10, 'b'));
  EXPECT_TRUE(good.List("x/").empty());
}

// ---- the fault-injecting store ----

TEST(FaultStore, FailsDelaysAndCorruptsOnDemand) {
  auto inner = std::make_unique<MemStore>("fault-test");
  inner->Put("features/a", "0123456789", nullptr);
  inner->Put("model/m", "weights", nullptr);
  FaultStore f(std::move(inner),
               ParseFaultRules(R"([{"op": "get", "prefix": "features/", "action": "corrupt"},
                                    {"op": "put", "prefix": "model/", "action": "fail", "nth": 2, "kind": "io"},
                                    {"op": "stat", "action": "delay", "delay_ms": 30, "count": 0}])",
                               "test"));
  std::string what;
  EXPECT_EQ(KindOf([&] { f.Get("features/a"); }, &what), ErrorKind::kCorrupt);
  EXPECT_NE(what.find("features/a"), std::string::npos);
  EXPECT_EQ(f.Get("features/a").bytes, "0123456789");  // count 1: only the first get
  EXPECT_EQ(f.Get("model/m").bytes, "weights");
  f.Put("model/m", "v2", nullptr);                                               // 1st put passes
  EXPECT_EQ(KindOf([&] { f.Put("model/m", "v3", nullptr); }), ErrorKind::kIo);  // 2nd fails
  EXPECT_EQ(f.Get("model/m").bytes, "v2");                                        // and stored nothing
  auto t0 = std::chrono::steady_clock::now();
  f.Stat("model/m");
  f.Stat("model/m");
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.055);
  EXPECT_EQ(f.fired(), 4);
}

TEST(FaultStore, RulesAreValidated) {
  std::string what;
  EXPECT_EQ(KindOf([] { ParseFaultRules("{}", "MSAFLOW_NAM_FAULTS"); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(KindOf([&] { ParseFaultRules(R"([{"action": "explode"}])", "MSAFLOW_NAM_FAULTS"); }, &what),
            ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("[0].action"), std::string::npos) << what;
  EXPECT_EQ(KindOf([&] { ParseFaultRules(R"([{"op": "put", "action": "corrupt"}])", "F"); }, &what),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(KindOf([&] { ParseFaultRules(R"([{"action": "fail", "nth": 0}])", "F"); }, &what), ErrorKind::kInvalidInput);
  EXPECT_NE(what.find("nth"), std::string::npos) << what;
}

TEST(FaultStore, OpenStoreWrapsWhenTheEnvironmentAsks) {
  ::setenv("MSAFLOW_NAM_FAULTS", R"([{"op": "any", "action": "fail", "kind": "unavailable"}])", 1);
  auto s = OpenStore("mem://fault-env");
  ::unsetenv("MSAFLOW_NAM_FAULTS");
  EXPECT_EQ(KindOf([&] { s->Put("a", "b", nullptr); }), ErrorKind::kUnavailable);
  EXPECT_NE(dynamic_cast<FaultStore*>(s.get()), nullptr);
  EXPECT_EQ(dynamic_cast<FaultStore*>(OpenStore("mem://fault-env").get()), nullptr);
}

}  // namespace
}  // namespace msaflow::nam
