#include "service/http_server.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/signals.h"
#include "common/version.h"
#include "launch/launcher.h"
#include "record/run_dir.h"
#include "report/report.h"
#include "service/api_error.h"
#include "service/catalog.h"
#include "service/deadlines.h"
#include "service/events.h"
#include "service/inference_api.h"
#include "service/log.h"
#include "service/registry.h"
#include "service/users.h"
#include "service_assets.h"

namespace msaflow::service {

using nlohmann::json;

namespace {

std::atomic<int> g_stop_signal{0};

// The users file, read again when it changes (`msaflow users add` while the service runs).
class UsersSource {
 public:
  explicit UsersSource(std::string path) : path_(std::move(path)) { Get(); }
  std::shared_ptr<const Users> Get() {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) ThrowErrno("users file " + path_);
    std::lock_guard<std::mutex> l(mu_);
    const std::pair<long long, long long> stamp{st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec, st.st_size};
    if (!users_ || stamp != stamp_) {
      if ((st.st_mode & 077) != 0)
        std::fprintf(stderr, "msaflow serve: warning: %s can be read by others (chmod 600 it)\n", path_.c_str());
      users_ = std::make_shared<const Users>(LoadUsers(path_));
      stamp_ = stamp;
    }
    return users_;
  }

 private:
  std::string path_;
  std::mutex mu_;
  std::shared_ptr<const Users> users_;
  std::pair<long long, long long> stamp_{-1, -1};
};

// The caller of the request this thread serves (set by the pre-routing handler).
thread_local std::shared_ptr<const Users> t_users;
thread_local const User* t_user = nullptr;
// This connection is over the bound: answer 503 and close.
thread_local bool t_reject = false;
// When the pre-routing handler saw the request this thread serves (0: it did not, e.g. a
// request that could not be parsed), for the access log.
thread_local std::chrono::steady_clock::time_point t_start{};

// A pool of `workers` threads for connections, with at most `max_waiting` waiting: a
// connection beyond that is answered 503 by a thread of its own, so that a flood neither
// grows memory without bound nor delays the clients being served.
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(size_t workers, size_t max_waiting) : max_waiting_(max_waiting) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(false); });
    threads_.emplace_back([this] { Work(true); });
  }
  ~BoundedPool() override = default;
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (jobs_.size() < max_waiting_)
        jobs_.push_back(std::move(fn));
      else
        rejects_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work(bool rejecter) {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        auto& q = rejecter ? rejects_ : jobs_;
        cv_.wait(l, [&] { return stop_ || !q.empty(); });
        if (q.empty()) return;  // stopping, and nothing left
        fn = std::move(q.front());
        q.pop_front();
      }
      t_reject = rejecter;
      fn();
      t_reject = false;
    }
  }
  size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_, rejects_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer realm=\"msaflow\"");
  SendJson(res, e.status(), e.Body());
}

const char* CodeFor(int status) {
  switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 403: return "forbidden";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 408: return "request_timeout";
    case 409: return "conflict";
    case 411: return "length_required";
    case 413: return "payload_too_large";
    case 414: return "uri_too_long";
    case 416: return "range_not_satisfiable";
    case 422: return "invalid";
    case 431: return "headers_too_large";
    case 503: return "unavailable";
    default: return status >= 500 ? "internal" : "error";
  }
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// A safe task name for /logs/{task}: what the launchers name logs (r1-train, nam-server).
bool ValidTaskName(const std::string& t) {
  if (t.empty() || t.size() > 64 || t[0] == '.' || t[0] == '-') return false;
  for (char c : t)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

struct Handler {
  Route route;
  std::string pattern;  // cpp-httplib's regex
  std::function<void(const httplib::Request&, httplib::Response&)> fn;
};

class Service {
 public:
  explicit Service(const ServeOptions& o)
      : o_(o),
        users_(o.users_file),
        registry_(RegistryConfig{o.runs_dir, o.machine, o.max_running, o.msaflow_exe, 0.2,
                                 [this](const std::string& name) -> int64_t {
                                   try {
                                     const auto users = users_.Get();
                                     const User* u = users->Find(name);
                                     return u ? u->max_running : 0;
                                   } catch (const Error&) {
                                     return 0;  // the users file is being replaced: the global bound holds
                                   }
                                 }}),
        models_(registry_, o.models, inference::BatchOptions{o.max_batch, o.max_delay_ms, o.max_queue}),
        clock_(o.clock ? *o.clock : SystemClock()),
        deadlines_(o.read_timeout_s, o.request_timeout_s, clock_) {}

  static std::vector<Handler> Handlers(Service* self);
  static void InferenceHandlers(Service* self, std::vector<Handler>& h);
  static void FormHandlers(Service* self, std::vector<Handler>& h);
  int Run();
  void Configure(httplib::Server& s);
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);

 private:
  const User& Caller() const {
    if (!t_user) throw ApiError(401, "unauthorized", "no valid bearer token");
    return *t_user;
  }
  void Events(const httplib::Request& req, httplib::Response& res);
  void RunsEvents(const httplib::Request& req, httplib::Response& res);
  bool StreamSlot(httplib::Response& res);

  ServeOptions o_;
  UsersSource users_;
  Registry registry_;
  ModelServer models_;
  JournalFollowers followers_;
  std::atomic<size_t> streams_{0};
  std::atomic<bool> stopping_{false};
  int listen_fd_ = -1;
  Clock& clock_;
  Deadlines deadlines_;  // whole-request deadlines: headers, then body
};

// Takes one of the bounded event-stream slots, or answers 503.
bool Service::StreamSlot(httplib::Response& res) {
  if (streams_.fetch_add(1) >= o_.max_streams) {
    streams_.fetch_sub(1);
    SendError(res, ApiError(503, "too_many_streams", fmt::format("{} event streams are open; try again later", o_.max_streams)));
    return false;
  }
  return true;
}

// GET /v1/runs/{id}/events: every journal record as an SSE event whose id is its line in the
// journal, so a client that reconnects with Last-Event-ID gets exactly what it missed; `state`
// events when the run's state changes; `end` once it can change no more.
void Service::Events(const httplib::Request& req, httplib::Response& res) {
  const User& user = Caller();
  const std::string id = req.matches[1];
  const std::string dir = registry_.RunDir(user, id);  // 404 before anything streams
  size_t after = 0;
  const std::string last = req.has_header("Last-Event-ID") ? req.get_header_value("Last-Event-ID")
                                                           : req.get_param_value("after");
  if (!last.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(last.c_str(), &end, 10);
    if (!end || *end || last.size() > 12)
      throw ApiError(400, "bad_request", "Last-Event-ID: expected the id of an event (a number), got \"" +
                                             last.substr(0, 40) + "\"");
    after = static_cast<size_t>(v);
  }
  if (!StreamSlot(res)) return;
  auto users_keep = t_users;  // the provider runs after the handler returns
  const User* who = &user;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, dir, id, after, users_keep, who, last_state = std::string(), last_check = 0.0, last_beat = 0.0](
          size_t, httplib::DataSink& sink) mutable {
        auto now = [this] { return clock_.NowSeconds(); };
        if (last_beat == 0) {
          last_beat = now();
          if (!sink.write("retry: 1000\n\n", 13)) return false;
        }
        for (;;) {
          if (stopping_ || !sink.is_writable()) return false;
          bool terminal = false;
          std::string state;
          const bool check = now() - last_check > 0.5;
          if (check) {
            state = registry_.StateOf(*who, id, &terminal);
            last_check = now();
          }
          // Events after the state was read: a terminal state's last events are all here.
          for (const auto& e : followers_.Since(record::JournalPath(dir), after)) {
            const std::string msg = fmt::format("id: {}\nevent: journal\ndata: {}\n\n", e.line, e.text);
            if (!sink.write(msg.data(), msg.size())) return false;
            after = e.line;
          }
          if (check && state != last_state) {
            const std::string msg = fmt::format("event: state\ndata: {}\n\n", json{{"id", id}, {"state", state}}.dump());
            if (!sink.write(msg.data(), msg.size())) return false;
            last_state = state;
          }
          if (terminal) {
            const std::string msg = fmt::format("event: end\ndata: {}\n\n", json{{"id", id}, {"state", state}}.dump());
            sink.write(msg.data(), msg.size());
            sink.done();
            return true;
          }
          if (now() - last_beat > 15) {
            if (!sink.write(": keep-alive\n\n", 14)) return false;
            last_beat = now();
          }
          clock_.SleepSeconds(0.1);
        }
      },
      [this](bool) { streams_.fetch_sub(1); });
}

// GET /v1/events: the caller's runs (as GET /v1/runs lists them) each time one changes.
void Service::RunsEvents(const httplib::Request&, httplib::Response& res) {
  const User& user = Caller();
  if (!StreamSlot(res)) return;
  auto users_keep = t_users;
  const User* who = &user;
  res.set_header("Cache-Control", "no-store");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, users_keep, who, last = std::string(), last_beat = -1.0](size_t, httplib::DataSink& sink) mutable {
        if (last_beat < 0) last_beat = clock_.NowSeconds();
        for (;;) {
          if (stopping_ || !sink.is_writable()) return false;
          const std::string now = registry_.List(*who, 0, 100).dump();
          if (now != last) {
            const std::string msg = "event: runs\ndata: " + now + "\n\n";
            if (!sink.write(msg.data(), msg.size())) return false;
            last = now;
            last_beat = clock_.NowSeconds();
          } else if (clock_.NowSeconds() - last_beat >= 15) {
            if (!sink.write(": keep-alive\n\n", 14)) return false;
            last_beat = clock_.NowSeconds();
          }
          clock_.SleepSeconds(0.5);
        }
      },
      [this](bool) { streams_.fetch_sub(1); });
}

// What the dashboard's new-run form asks: a pipeline checked without a run, the user's data sets
// and models, a model's layers (service/catalog.h).
void Service::FormHandlers(Service* self, std::vector<Handler>& h) {
  h.push_back({{"POST", "/v1/validate"}, "/v1/validate", [self](const httplib::Request& req, httplib::Response& res) {
                 if (req.body.size() > self->o_.max_body)
                   throw ApiError(413, "payload_too_large",
                                  fmt::format("a pipeline is at most {} bytes", self->o_.max_body));
                 SendJson(res, 200, self->registry_.Validate(self->Caller(), req.body));
               }});
  h.push_back({{"GET", "/v1/catalog"}, "/v1/catalog", [self](const httplib::Request&, httplib::Response& res) {
                 SendJson(res, 200, Catalog(self->Caller()));
               }});
  h.push_back({{"GET", "/v1/catalog/layers"},
               "/v1/catalog/layers",
               [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 200, CatalogLayers(self->Caller(), req.get_param_value("onnx")));
               }});
}

// Inference: the Open Inference Protocol v2 subset (service/inference_api.h).
void Service::InferenceHandlers(Service* self, std::vector<Handler>& h) {
  h.push_back({{"GET", "/v2"}, "/v2", [](const httplib::Request&, httplib::Response& res) {
                 SendJson(res, 200, {{"name", "msaflow"}, {"version", kVersion}, {"extensions", json::array()}});
               }});
  h.push_back({{"GET", "/v2/health/live"}, "/v2/health/live",
               [](const httplib::Request&, httplib::Response& res) { SendJson(res, 200, {{"live", true}}); }});
  h.push_back({{"GET", "/v2/health/ready"}, "/v2/health/ready", [self](const httplib::Request&, httplib::Response& res) {
                 SendJson(res, self->stopping_ ? 503 : 200, {{"ready", !self->stopping_}});
               }});
  const std::string model = "/v2/models/([A-Za-z0-9._@:-]{1,200})";
  h.push_back({{"GET", "/v2/models/{name}"}, model, [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 200, self->models_.Metadata(self->Caller(), req.matches[1]));
               }});
  h.push_back({{"GET", "/v2/models/{name}/ready"}, model + "/ready",
               [self](const httplib::Request& req, httplib::Response& res) {
                 self->models_.Metadata(self->Caller(), req.matches[1]);  // 404 unless it loads
                 SendJson(res, 200, {{"name", req.matches[1]}, {"ready", true}});
               }});
  h.push_back({{"POST", "/v2/models/{name}/infer"}, model + "/infer",
               [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 200, self->models_.Infer(self->Caller(), req.matches[1], req.body));
               }});
}

// The routes and what serves them. `self` is only captured here (Routes() reads the table with none).
std::vector<Handler> Service::Handlers(Service* self) {
  auto asset = [](const char* body, const char* type) {
    return [body, type](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(body, type);
    };
  };
  std::vector<Handler> h;
  h.push_back({{"GET", "/"}, "/", asset(kIndexHtml, "text/html; charset=utf-8")});
  h.push_back({{"GET", "/app.js"}, "/app.js", asset(kAppJs, "text/javascript; charset=utf-8")});
  h.push_back({{"GET", "/app.css"}, "/app.css", asset(kAppCss, "text/css; charset=utf-8")});
  h.push_back({{"GET", "/v1/health"}, "/v1/health", [](const httplib::Request&, httplib::Response& res) {
                 SendJson(res, 200, {{"ok", true}, {"version", kVersion}});
               }});
  h.push_back({{"GET", "/v1/openapi.json"}, "/v1/openapi.json", asset(kOpenapiJson, "application/json")});
  h.push_back({{"GET", "/v1/whoami"}, "/v1/whoami", [self](const httplib::Request&, httplib::Response& res) {
                 const User& u = self->Caller();
                 SendJson(res, 200, {{"user", u.name}, {"folders", u.allow}, {"max_running", u.max_running},
                                     {"account", u.account}, {"machine", self->o_.machine.empty() ? "the pipeline's" : self->o_.machine}});
               }});
  h.push_back({{"POST", "/v1/runs"}, "/v1/runs", [self](const httplib::Request& req, httplib::Response& res) {
                 if (req.body.size() > self->o_.max_body)
                   throw ApiError(413, "payload_too_large", fmt::format("a pipeline is at most {} bytes", self->o_.max_body));
                 json out = self->registry_.Submit(self->Caller(), req.body);
                 res.set_header("Location", "/v1/runs/" + out["id"].get<std::string>());
                 SendJson(res, 202, out);
               }});
  h.push_back({{"GET", "/v1/runs"}, "/v1/runs", [self](const httplib::Request& req, httplib::Response& res) {
                 auto number = [&](const char* key, size_t dflt, size_t max) {
                   if (!req.has_param(key)) return dflt;
                   const std::string s = req.get_param_value(key);
                   char* end = nullptr;
                   const unsigned long v = std::strtoul(s.c_str(), &end, 10);
                   if (s.empty() || !end || *end || s.size() > 9 || v > max)
                     throw ApiError(400, "bad_request", fmt::format("?{}: expected a number from 0 to {}", key, max));
                   return static_cast<size_t>(v);
                 };
                 const size_t offset = number("offset", 0, 1000000000), limit = number("limit", 50, 500);
                 const User& u = self->Caller();
                 SendJson(res, 200, {{"runs", self->registry_.List(u, offset, limit)}, {"offset", offset}, {"limit", limit},
                                     {"total", self->registry_.Count(u)}});
               }});
  const std::string id = "([A-Za-z0-9._-]{1,128})";
  h.push_back({{"GET", "/v1/runs/{id}"}, "/v1/runs/" + id, [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 200, self->registry_.View(self->Caller(), req.matches[1]));
               }});
  h.push_back({{"DELETE", "/v1/runs/{id}"}, "/v1/runs/" + id, [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 202, self->registry_.Cancel(self->Caller(), req.matches[1]));
               }});
  h.push_back({{"POST", "/v1/runs/{id}/resume"}, "/v1/runs/" + id + "/resume",
               [self](const httplib::Request& req, httplib::Response& res) {
                 SendJson(res, 202, self->registry_.Resume(self->Caller(), req.matches[1]));
               }});
  h.push_back({{"GET", "/v1/runs/{id}/results"},
               "/v1/runs/" + id + "/results",
               [self](const httplib::Request& req, httplib::Response& res) {
                 const std::string f = record::ResultsPath(self->registry_.RunDir(self->Caller(), req.matches[1]));
                 if (!PathExists(f))
                   throw ApiError(404, "no_results", "run " + std::string(req.matches[1]) + " has no results (yet)");
                 res.set_content(ReadFile(f), "application/json");
               }});
  h.push_back({{"GET", "/v1/runs/{id}/report"}, "/v1/runs/" + id + "/report",
               [self](const httplib::Request& req, httplib::Response& res) {
                 const std::string dir = self->registry_.RunDir(self->Caller(), req.matches[1]);
                 if (!record::HasJournal(dir))
                   throw ApiError(404, "no_report", "run " + std::string(req.matches[1]) + " has not begun");
                 const std::string out = dir + "/report.html";
                 report::WriteReport(dir, out);
                 res.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'unsafe-inline'");
                 res.set_content(ReadFile(out), "text/html; charset=utf-8");
               }});
  h.push_back({{"GET", "/v1/runs/{id}/logs/{task}"}, "/v1/runs/" + id + "/logs/([^/]{1,64})",
               [self](const httplib::Request& req, httplib::Response& res) {
                 const User& u = self->Caller();
                 const std::string task = req.matches[2];
                 if (!ValidTaskName(task))
                   throw ApiError(400, "bad_request", "logs: expected a task id such as r1-train, or \"coordinator\"");
                 const std::string f = task == "coordinator" ? self->registry_.CoordinatorLog(u, req.matches[1])
                                                             : self->registry_.RunDir(u, req.matches[1]) + "/logs/" + task + ".log";
                 if (!PathExists(f)) throw ApiError(404, "no_log", "run " + std::string(req.matches[1]) + " has no log " + task);
                 res.set_content(ReadFile(f), "text/plain; charset=utf-8");
               }});
  h.push_back({{"GET", "/v1/runs/{id}/events"}, "/v1/runs/" + id + "/events",
               [self](const httplib::Request& req, httplib::Response& res) { self->Events(req, res); }});
  h.push_back({{"GET", "/v1/events"}, "/v1/events",
               [self](const httplib::Request& req, httplib::Response& res) { self->RunsEvents(req, res); }});
  FormHandlers(self, h);
  InferenceHandlers(self, h);
  return h;
}

// Before routing, once a request's headers are in: limits, then authentication.
httplib::Server::HandlerResponse Service::PreRoute(const httplib::Request& req, httplib::Response& res) {
  deadlines_.HeadersIn(req.remote_addr, req.remote_port);
  t_start = std::chrono::steady_clock::now();
  t_user = nullptr;
  t_users.reset();
  if (t_reject) {
    res.set_header("Connection", "close");
    res.set_header("Retry-After", "1");
    SendError(res, ApiError(503, "busy", "the service has too many connections; try again"));
    return httplib::Server::HandlerResponse::Handled;
  }
  // Only an infer request may carry more than a pipeline's bound (64 MiB against 1 MiB): a
  // declared length over it is refused before the body is read.
  const bool infer = req.path.rfind("/v2/models/", 0) == 0 && req.path.size() > 6 &&
                     req.path.compare(req.path.size() - 6, 6, "/infer") == 0;
  if (!infer && req.get_header_value<uint64_t>("Content-Length") > o_.max_body) {
    res.set_header("Connection", "close");
    SendError(res, ApiError(413, "payload_too_large", fmt::format("a request body here is at most {} bytes", o_.max_body)));
    return httplib::Server::HandlerResponse::Handled;
  }
  // A chunked body declares no length: cpp-httplib would read up to the infer bound (64 MiB)
  // before the route's own bound could refuse it. Only infer takes one.
  if (!infer && !req.has_header("Content-Length") && req.has_header("Transfer-Encoding")) {
    res.set_header("Connection", "close");
    SendError(res, ApiError(411, "length_required",
                            fmt::format("a request body here needs a Content-Length (at most {} bytes); only "
                                        "/v2/models/.../infer takes a chunked body",
                                        o_.max_body)));
    return httplib::Server::HandlerResponse::Handled;
  }
  // A request with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3), as
  // `curl -X POST .../resume` sends it; cpp-httplib 0.11 would read a POST's body until the
  // connection closes, then answer 400 after the read timeout. It is told the length is 0. (The
  // Request is httplib's own non-const object, handed to this handler as const.)
  if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") && !req.has_header("Content-Length") &&
      !req.has_header("Transfer-Encoding"))
    const_cast<httplib::Request&>(req).set_header("Content-Length",
                                                  "0");  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  const bool api = req.path.rfind("/v1/", 0) == 0 || req.path.rfind("/v2/", 0) == 0;
  if (!api || req.path == "/v1/health" || req.path.rfind("/v2/health/", 0) == 0)
    return httplib::Server::HandlerResponse::Unhandled;
  const std::string auth = req.get_header_value("Authorization");
  const std::string scheme = "Bearer ";
  std::shared_ptr<const Users> users;
  try {
    users = users_.Get();
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow serve: %s\n", e.what());
    SendError(res, ApiError(503, "users_unreadable", "the service cannot read its users file"));
    return httplib::Server::HandlerResponse::Handled;
  }
  const User* u = auth.rfind(scheme, 0) == 0 ? users->Authenticate(auth.substr(scheme.size())) : nullptr;
  if (!u) {
    SendError(res, ApiError(401, "unauthorized", auth.empty() ? "this needs an Authorization: Bearer <token> header"
                                                              : "the bearer token is not one the service knows"));
    return httplib::Server::HandlerResponse::Handled;
  }
  t_users = users;
  t_user = u;
  return httplib::Server::HandlerResponse::Unhandled;
}

// Limits, authentication, errors as JSON, and the routes.
void Service::Configure(httplib::Server& s) {
  const size_t workers = o_.workers, waiting = o_.max_waiting;
  s.new_task_queue = [workers, waiting] { return new BoundedPool(workers, waiting); };
  // Nagle's algorithm would hold a response's body behind its headers until the client's
  // delayed ACK (40 ms a request); accepted sockets inherit the listener's TCP_NODELAY.
  s.set_socket_options([this](socket_t sock) {
    listen_fd_ = sock;  // the listening socket's (the only one this is called for)
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
  s.set_payload_max_length(std::max(o_.max_body, o_.max_infer_body));  // a pipeline's own bound: POST /v1/runs
  s.set_read_timeout(o_.read_timeout_s, 0);
  s.set_write_timeout(10, 0);
  s.set_keep_alive_timeout(5);
  s.set_keep_alive_max_count(1000);
  s.set_default_headers({{"X-Content-Type-Options", "nosniff"}, {"Referrer-Policy", "no-referrer"}});
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    deadlines_.Answered(req.remote_addr, req.remote_port);
    // The access log: the path without its query, and no header (the token is one).
    json line = {{"method", req.method.substr(0, 16)},
                 {"path", req.path.substr(0, 256)},
                 {"status", res.status},
                 {"remote", req.remote_addr},
                 {"bytes", res.body.size()}};
    if (t_user) line["user"] = t_user->name;
    if (t_start != std::chrono::steady_clock::time_point{})
      line["ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    Log("http", std::move(line));
    t_user = nullptr;  // a next request on this connection that is never routed must not inherit them
    t_users.reset();
    t_start = {};
  });
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return PreRoute(req, res); });
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = res.status == 404   ? "no such route"
                      : res.status == 413 ? "the request body is over the limit"
                      : res.status == 400 ? "the request could not be read as HTTP/1.1: a malformed request line or "
                                            "header, or a body shorter than its Content-Length"
                                          : fmt::format("HTTP {} ({})", res.status, CodeFor(res.status));
    json err = {{"code", CodeFor(res.status)}, {"message", msg}};
    // cpp-httplib takes at most 8 KiB as a form (curl -d's default type); JSON has no such bound.
    if (res.status == 413 && req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0)
      err["hint"] = "a body sent as a form is at most 8 KiB: send it with Content-Type: application/json";
    SendJson(res, res.status, {{"error", err}});
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(std::move(ep));
    } catch (const ApiError& e) {
      SendError(res, e);
    } catch (const Error& e) {
      const int status = e.kind() == ErrorKind::kNotFound ? 404 : e.kind() == ErrorKind::kInvalidInput ? 422 : 500;
      SendJson(res, status, {{"error", {{"code", ErrorKindName(e.kind())}, {"message", e.what()}}}});
    } catch (const std::exception& e) {
      SendJson(res, 500, {{"error", {{"code", "internal"}, {"message", e.what()}}}});
    }
  });
  for (Handler& h : Handlers(this)) {
    // The body is in once the handler runs: no deadline while it answers (an event stream).
    auto fn = [this, f = std::move(h.fn)](const httplib::Request& req, httplib::Response& res) {
      deadlines_.Handling(req.remote_addr, req.remote_port);
      f(req, res);
    };
    if (h.route.method == "GET") s.Get(h.pattern, fn);
    if (h.route.method == "POST") s.Post(h.pattern, fn);
    if (h.route.method == "DELETE") s.Delete(h.pattern, fn);
  }
}

int Service::Run() {
  const size_t colon = o_.listen.rfind(':');
  if (colon == std::string::npos) Throw(ErrorKind::kInvalidInput, "--listen: expected HOST:PORT, got \"" + o_.listen + "\"");
  std::string host = o_.listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(o_.listen.c_str() + colon + 1, &end, 10);
  if (!end || *end || port < 0 || port > 65535 || colon + 1 == o_.listen.size())
    Throw(ErrorKind::kInvalidInput, "--listen: the port must be 0..65535, got \"" + o_.listen.substr(colon + 1) + "\"");
  const bool tls = !o_.tls_cert.empty() || !o_.tls_key.empty();
  if (tls && (o_.tls_cert.empty() || o_.tls_key.empty()))
    Throw(ErrorKind::kInvalidInput, "--tls-cert and --tls-key go together");
  if (!tls && !IsLoopback(host) && !o_.insecure)
    Throw(ErrorKind::kInvalidInput, "--listen " + o_.listen + ": serving tokens in clear text beyond this host is refused; "
                                    "give --tls-cert and --tls-key (or --insecure, behind a TLS proxy of your own)");
  std::unique_ptr<httplib::Server> srv;
  if (tls) {
    for (const auto& f : {o_.tls_cert, o_.tls_key})
      if (!PathExists(f)) Throw(ErrorKind::kNotFound, f + ": no such file (--tls-cert / --tls-key)");
    auto s = std::make_unique<httplib::SSLServer>(o_.tls_cert.c_str(), o_.tls_key.c_str());
    if (!s->is_valid()) Throw(ErrorKind::kInvalidInput, "--tls-cert/--tls-key: OpenSSL refused " + o_.tls_cert + " / " + o_.tls_key);
    srv = std::move(s);
  } else {
    srv = std::make_unique<httplib::Server>();
  }
  httplib::Server& s = *srv;
  Configure(s);
  int bound = static_cast<int>(port);
  if (port == 0) {
    bound = s.bind_to_any_port(host);
  } else if (!s.bind_to_port(host, static_cast<int>(port))) {
    bound = -1;
  }
  if (bound <= 0) Throw(ErrorKind::kIo, "--listen " + o_.listen + ": cannot listen there (in use, or not this host's address)");
  // cpp-httplib 0.11 listens with a backlog of 5: 16 clients connecting at once would see
  // SYNs dropped and retried a second later. Listening again only raises the backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);
  deadlines_.Start(listen_fd_);
  registry_.StartQueue();
  const std::string url = fmt::format("{}://{}:{}", tls ? "https" : "http", host.find(':') != std::string::npos ? "[" + host + "]" : host, bound);
  if (!o_.ready_file.empty()) WriteFileAtomic(o_.ready_file, json{{"url", url}, {"pid", ::getpid()}}.dump() + "\n");
  Log("serve-start", {{"url", url}, {"pid", ::getpid()}, {"runs", o_.runs_dir}, {"max_running", o_.max_running}});
  std::printf("msaflow serve: %s (runs in %s, at most %lld running)\n", url.c_str(), o_.runs_dir.c_str(),
              static_cast<long long>(o_.max_running));
  std::fflush(stdout);
  // SIGINT/SIGTERM are held back in every thread (Serve blocks them before any starts) and taken
  // here: none lands in a thread running inference in oneDNN (see InterruptsHeld).
  std::thread watcher([&] {
    const sigset_t stop = StopSignals();
    const timespec tick{0, 100'000'000};
    while (!stopping_) {
      if (const int sig = ::sigtimedwait(&stop, nullptr, &tick); sig > 0) {
        g_stop_signal = sig;
        break;
      }
    }
    stopping_ = true;
    s.stop();
  });
  const bool ok = s.listen_after_bind();
  stopping_ = true;
  watcher.join();
  deadlines_.Stop();
  if (deadlines_.cut() > 0)
    std::printf("msaflow serve: %lld connection(s) cut off for sending a request too slowly\n",
                static_cast<long long>(deadlines_.cut()));
  registry_.StopQueue();
  if (!o_.ready_file.empty()) ::unlink(o_.ready_file.c_str());
  if (g_stop_signal) std::printf("msaflow serve: stopped by signal %d\n", g_stop_signal.load());
  Log("serve-stop", {{"signal", g_stop_signal.load()}, {"ok", ok}});
  return ok || g_stop_signal ? 0 : 1;
}

}  // namespace

std::vector<Route> Routes() {
  std::vector<Route> r;
  for (const Handler& h : Service::Handlers(nullptr)) r.push_back(h.route);
  return r;
}

const char* OpenApiDocument() { return kOpenapiJson; }

int Serve(const ServeOptions& o) {
  // Before any thread starts, so that all of them, and OpenMP's pool, inherit the mask; the
  // runs' coordinators start with a clean one (ChildProcess).
  const sigset_t stop = StopSignals();
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  Service s(o);
  return s.Run();
}

}  // namespace msaflow::service
