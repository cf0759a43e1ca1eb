// The service's parts without a socket: the routes against the OpenAPI document, the users
// file and its tokens, the folders a pipeline may name, and how a validation message splits
// into pointer, message and hint. tests/integration/service_test.py drives the real process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "service/admission.h"
#include "service/deadlines.h"
#include "service/events.h"
#include "service/http_server.h"
#include "service/users.h"

namespace msaflow::service {
namespace {

using nlohmann::json;

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/msaflow-service-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST(Routes, EveryRouteIsInTheOpenApiDocumentAndNoOther) {
  const json doc = json::parse(OpenApiDocument());
  std::set<std::pair<std::string, std::string>> documented, served;
  for (const auto& [path, ops] : doc.at("paths").items())
    for (const auto& [method, _] : ops.items()) documented.insert({method, path});
  for (const Route& r : Routes()) {
    std::string m = r.method;
    for (char& c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_TRUE(served.insert({m, r.path}).second) << "served twice: " << r.method << " " << r.path;
  }
  EXPECT_EQ(served, documented);
  EXPECT_EQ(doc.at("openapi"), "3.0.3");
}

TEST(Users, TokensAreKeptAsHashesAndCheckedAgainstEveryUser) {
  const std::string t1 = NewToken(), t2 = NewToken();
  EXPECT_EQ(t1.size(), 64u);
  EXPECT_NE(t1, t2);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Users u;
  u.users.push_back({"ana", Sha256Hex(t1), {}, 0, ""});
  u.users.push_back({"ben", Sha256Hex(t2), {}, 2, "proj"});
  EXPECT_EQ(u.Authenticate(t1)->name, "ana");
  EXPECT_EQ(u.Authenticate(t2)->name, "ben");
  EXPECT_EQ(u.Authenticate(""), nullptr);
  EXPECT_EQ(u.Authenticate(t1.substr(1)), nullptr);
  EXPECT_EQ(u.Authenticate(Sha256Hex(t1)), nullptr);  // the hash is not the token
}

TEST_F(TempDir, UsersFileRoundTripsReadableByItsOwnerOnly) {
  Users u;
  u.users.push_back({"ana", Sha256Hex("x"), {dir_}, 3, "proj-1"});
  const std::string path = dir_ + "/users.json";
  SaveUsers(path, u);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const Users back = LoadUsers(path);
  ASSERT_EQ(back.users.size(), 1u);
  EXPECT_EQ(back.users[0].allow, std::vector<std::string>{dir_});
  EXPECT_EQ(back.users[0].max_running, 3);
  EXPECT_EQ(back.users[0].account, "proj-1");
}

TEST(Users, ABadUsersFileNamesTheEntry) {
  auto error_of = [](const std::string& text) {
    try {
      ParseUsers(text, "u.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok_hash = std::string(64, 'a');
  EXPECT_EQ(error_of("[]"), "u.json: /: expected a JSON object {\"format\": \"msaflow.users/1\", \"users\": [...]}");
  EXPECT_NE(error_of(R"({"format":"msaflow.users/1","users":[{"name":"Ana","token_sha256":")" + ok_hash + "\"}]}")
                .find("u.json: /users/0/name: "),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format":"msaflow.users/1","users":[{"name":"ana","token_sha256":"xyz"}]})")
                .find("/users/0/token_sha256"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format":"msaflow.users/1","users":[{"name":"ana","token_sha256":")" + ok_hash +
                     R"(","allow":["rel"]}]})")
                .find("/users/0/allow/0: expected an absolute folder"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format":"msaflow.users/1","users":[{"name":"a","token_sha256":")" + ok_hash +
                     R"("},{"name":"a","token_sha256":")" + ok_hash + "\"}]}")
                .find("/users/1/name: user \"a\" is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format":"msaflow.users/1","users":[{"name":"a","token_sha256":")" + ok_hash +
                     R"(","account":"x;rm"}]})")
                .find("/users/0/account"),
            std::string::npos);
  EXPECT_FALSE(ValidUserName("../x"));
  EXPECT_FALSE(ValidUserName(""));
  EXPECT_FALSE(ValidUserName("-a"));
  EXPECT_TRUE(ValidUserName("ana_2"));
}

TEST_F(TempDir, OnlyRealPathsInsideTheFoldersPass) {
  const std::string mine = dir_ + "/mine", other = dir_ + "/mine-too", out = dir_ + "/out";
  for (const auto& d : {mine, other, out}) std::filesystem::create_directories(d);
  WriteFileAtomic(mine + "/a", "a");
  WriteFileAtomic(other + "/b", "b");
  WriteFileAtomic(out + "/c", "c");
  std::filesystem::create_symlink(out + "/c", mine + "/link");
  std::filesystem::create_symlink(out, mine + "/dirlink");
  EXPECT_EQ(InsideFolders(mine + "/a", {mine}), mine + "/a");
  EXPECT_EQ(InsideFolders(mine + "/../out/c", {mine}), "");
  EXPECT_EQ(InsideFolders(mine + "/link", {mine}), "");       // a link out
  EXPECT_EQ(InsideFolders(mine + "/dirlink/c", {mine}), "");  // through a linked folder
  EXPECT_EQ(InsideFolders(other + "/b", {mine}), "");         // a name that only starts like it
  EXPECT_EQ(InsideFolders(mine + "/missing", {mine}), "");
  EXPECT_EQ(InsideFolders(out + "/c", {mine, out}), out + "/c");
}

TEST(Admission, AValidationMessageSplitsIntoPointerMessageAndHint) {
  const ApiError e = InvalidPipeline("pipeline: /head/optimiser: unknown key — did you mean \"optimizer\"?", "pipeline");
  const json b = e.Body();
  EXPECT_EQ(e.status(), 422);
  EXPECT_EQ(b["error"]["pointer"], "/head/optimiser");
  EXPECT_EQ(b["error"]["message"], "unknown key");
  EXPECT_EQ(b["error"]["hint"], "did you mean \"optimizer\"?");
  const json plain = InvalidPipeline("pipeline: not valid JSON (x)", "pipeline").Body();
  EXPECT_FALSE(plain["error"].contains("pointer"));
  EXPECT_EQ(plain["error"]["message"], "not valid JSON (x)");
}

TEST_F(TempDir, AFollowedJournalGivesEachCompleteLineOnceByItsLineNumber) {
  const std::string path = dir_ + "/journal.jsonl";
  JournalFollowers f;
  EXPECT_TRUE(f.Since(path, 0).empty());  // not there yet
  AppendLineSynced(path, R"({"format":"msaflow.journal/1"})");
  AppendLineSynced(path, R"({"event":"a"})");
  {
    std::FILE* torn = std::fopen(path.c_str(), "a");
    std::fputs(R"({"event":"b")", torn);  // a line still being written
    std::fclose(torn);
  }
  auto got = f.Since(path, 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].line, 2u);
  {
    std::FILE* rest = std::fopen(path.c_str(), "a");
    std::fputs("}\n", rest);
    std::fclose(rest);
  }
  // At once, with no pause: a follower that saw the run end right after another follower read
  // must still be given the last lines (a throttle on reads once lost them).
  got = f.Since(path, 2);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].line, 3u);
  EXPECT_EQ(got[0].text, R"({"event":"b"})");
  EXPECT_EQ(f.Since(path, 0).size(), 2u);
  EXPECT_TRUE(f.Since(path, 3).empty());
}

// A listening socket on loopback, port chosen by the kernel.
int Listener() {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(l, 16), 0);
  return l;
}

// A client connected to `listener`, and the accepted end; the client's port.
struct Pair {
  int client = -1, served = -1, port = -1;
};
Pair Connect(int listener) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &n);
  Pair p;
  p.client = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(p.client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  p.served = ::accept(listener, nullptr, nullptr);
  sockaddr_in c{};
  n = sizeof c;
  ::getsockname(p.client, reinterpret_cast<sockaddr*>(&c), &n);
  p.port = ntohs(c.sin_port);
  return p;
}

// Whether the service's end of `p` was shut down: the client reads the end of the stream (a
// shutdown on loopback reaches it at once; a second is left for a loaded machine).
bool Cut(const Pair& p, int wait_ms = 1000) {
  pollfd f{p.client, POLLIN, 0};
  if (::poll(&f, 1, wait_ms) <= 0) return false;
  char b;
  return ::recv(p.client, &b, 1, MSG_DONTWAIT) == 0;
}
bool NotCut(const Pair& p) { return !Cut(p, 0); }

// The watchdog behind `msaflow serve`'s whole-request deadlines, on real sockets and a clock the
// test moves: a connection silent past the headers' deadline is shut down, one whose body is late
// past the body's, one whose handler runs never; the process's other connections (another port)
// are not its business.
TEST(Deadlines, ConnectionsLateWithTheirRequestAreShutDownAndNoOther) {
  const int service = Listener(), other = Listener();
  ManualClock clock;
  Deadlines d(1.0, 4.0, clock);
  const Pair silent = Connect(service), body = Connect(service), handled = Connect(service), elsewhere = Connect(other);
  d.HeadersIn("127.0.0.1", body.port);
  d.Handling("127.0.0.1", handled.port);
  d.ScanOnce(service);  // at 0 s: each connection seen; the silent one's headers are due by 1 s
  clock.AdvanceSeconds(0.9);
  d.ScanOnce(service);
  EXPECT_TRUE(NotCut(silent));
  clock.AdvanceSeconds(0.2);  // 1.1 s
  d.ScanOnce(service);
  EXPECT_TRUE(Cut(silent));
  EXPECT_TRUE(NotCut(body));
  clock.AdvanceSeconds(2.8);  // 3.9 s: the body is due by 4 s
  d.ScanOnce(service);
  EXPECT_TRUE(NotCut(body));
  clock.AdvanceSeconds(0.2);
  d.ScanOnce(service);
  EXPECT_TRUE(Cut(body));
  EXPECT_TRUE(NotCut(handled));
  EXPECT_TRUE(NotCut(elsewhere));
  EXPECT_EQ(d.cut(), 2);
  // Answered, a connection is given the headers' deadline again for its next request.
  d.Answered("127.0.0.1", handled.port);
  clock.AdvanceSeconds(0.9);
  d.ScanOnce(service);
  EXPECT_TRUE(NotCut(handled));
  clock.AdvanceSeconds(0.2);
  d.ScanOnce(service);
  EXPECT_TRUE(Cut(handled));
  EXPECT_TRUE(NotCut(elsewhere));
  EXPECT_EQ(d.cut(), 3);
  for (const Pair& p : {silent, body, handled, elsewhere}) ::close(p.client), ::close(p.served);
  ::close(service);
  ::close(other);
}

// The watchdog's own thread on the real clock: it looks twice a second, so a connection silent
// past a 0.2 s deadline is cut within a second or so.
TEST(Deadlines, TheWatchdogThreadCutsOnTheRealClock) {
  const int service = Listener();
  Deadlines d(0.2, 4.0);
  d.Start(service);
  const Pair silent = Connect(service), handled = Connect(service);
  d.Handling("127.0.0.1", handled.port);
  EXPECT_TRUE(Cut(silent, 3000));
  EXPECT_TRUE(NotCut(handled));
  d.Stop();
  for (const Pair& p : {silent, handled}) ::close(p.client), ::close(p.served);
  ::close(service);
}

}  // namespace
}  // namespace msaflow::service
