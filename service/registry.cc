#include "service/registry.h"

#include <fmt/core.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "orchestrator/run.h"
#include "orchestrator/runs.h"
#include "record/coordinator_lock.h"
#include "record/journal.h"
#include "record/run_dir.h"
#include "record/status.h"
#include "service/log.h"

namespace msaflow::service {

using nlohmann::json;

struct Registry::Live {
  ChildProcess child;
};

namespace {

std::string Key(const std::string& user, const std::string& id) { return user + "/" + id; }

std::string Tail(const std::string& path, size_t n) {
  try {
    std::string s = ReadFile(path);
    return s.size() > n ? s.substr(s.size() - n) : s;
  } catch (const Error&) {
    return "";
  }
}

// Whether `pid` is still a process of run `id` (a coordinator that the service's death has
// signalled but that has not ended yet): its command line names the run.
bool StillRunning(int64_t pid, const std::string& id) {
  if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) != 0) return false;
  std::string cmd;
  try {
    cmd = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  } catch (const Error&) {
    return false;
  }
  return cmd.find(id) != std::string::npos;
}

// A coordinator from before (of an earlier service process, or one this service stopped) that has
// its signal but is still ending: it holds the run, or it is still a process of the run.
bool StillEnding(const std::string& dir, int64_t pid, const std::string& id) {
  return (record::HasJournal(dir) && record::CoordinatorHolding(dir) > 0) || StillRunning(pid, id);
}

bool Terminal(const std::string& state) {
  return state == "finished" || state == "failed" || state == "cancelled" || state == "interrupted";
}

}  // namespace

const char* RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kQueued:
      return "queued";
    case RequestState::kStarted:
      return "started";
    case RequestState::kCancelled:
      return "cancelled";
  }
  return "?";
}

const char* RequestKindName(RequestKind k) {
  switch (k) {
    case RequestKind::kRun:
      return "run";
    case RequestKind::kResume:
      return "resume";
  }
  return "?";
}

namespace {

// The request file's word for an enum's value (`name` gives each value's), or a kCorrupt error
// naming the field and what it may be.
template <typename E, size_t N>
E ParseWord(const std::string& word, const char* (*name)(E), const E (&values)[N], const std::string& where,
            const char* field) {
  if (const auto v = ByName(word, name, values)) return *v;
  std::string expected;
  for (E v : values) expected += std::string(expected.empty() ? "" : " or ") + name(v);
  Throw(ErrorKind::kCorrupt, where + ": /" + field + ": '" + word + "'; expected " + expected);
}

}  // namespace

json Request::ToJson() const {
  json j = {{"format", kRequestFormat},
            {"id", id},
            {"user", user},
            {"name", name},
            {"pipeline", pipeline},
            {"created", created},
            {"machine", machine},
            {"launcher", workflow::LauncherName(launcher)},
            {"state", RequestStateName(state)},
            {"kind", RequestKindName(kind)},
            {"seq", seq},
            {"starts", starts}};
  if (!cancelled_by.empty()) j["cancelled_by"] = cancelled_by;
  if (!account.empty()) j["account"] = account;
  if (!error.empty()) j["error"] = error;
  if (!resume_reason.empty()) j["resume_reason"] = resume_reason;
  if (pid > 0) j["pid"] = pid;
  if (ended) j["ended"] = true;
  return j;
}

Request Request::FromJson(const json& j, const std::string& where) {
  try {
    if (j.at("format") != kRequestFormat) Throw(ErrorKind::kCorrupt, where + ": not a " + kRequestFormat + " record");
    Request r;
    r.id = j.at("id");
    r.user = j.at("user");
    r.name = j.at("name");
    r.pipeline = j.value("pipeline", r.name);
    r.created = j.at("created");
    r.machine = j.at("machine");
    if (!workflow::ParseLauncherKind(j.value("launcher", "local"), &r.launcher))
      Throw(ErrorKind::kCorrupt, where + ": /launcher: expected local or slurm");
    r.state = ParseWord(j.at("state").get<std::string>(), RequestStateName,
                        {RequestState::kQueued, RequestState::kStarted, RequestState::kCancelled}, where, "state");
    r.kind =
        ParseWord(j.value("kind", "run"), RequestKindName, {RequestKind::kRun, RequestKind::kResume}, where, "kind");
    r.seq = j.at("seq");
    r.starts = j.value("starts", int64_t{0});
    r.cancelled_by = j.value("cancelled_by", "");
    r.account = j.value("account", "");
    r.error = j.value("error", "");
    r.resume_reason = j.value("resume_reason", "");
    r.pid = j.value("pid", int64_t{0});
    r.ended = j.value("ended", false);
    return r;
  } catch (const json::exception& e) {
    Throw(ErrorKind::kCorrupt, where + ": " + e.what());
  }
}

bool Registry::ValidRunId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.' || id[0] == '-') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
  });
}

Registry::Registry(RegistryConfig config) : config_(std::move(config)) {
  MakeDirs(config_.runs_dir);
  std::error_code ec;
  for (std::filesystem::directory_iterator u(config_.runs_dir, ec), end; !ec && u != end; u.increment(ec)) {
    const std::filesystem::path dir = u->path() / ".service";
    std::error_code ec2;
    for (std::filesystem::directory_iterator f(dir, ec2); !ec2 && f != end; f.increment(ec2)) {
      const std::string name = f->path().filename().string();
      if (name.size() < 6 || name.substr(name.size() - 5) != ".json" || name.find(".pipeline.json") != std::string::npos ||
          IsAtomicWriteLeftover(name))
        continue;
      json j = json::parse(ReadFile(f->path().string()), nullptr, false);
      if (j.is_discarded()) Throw(ErrorKind::kCorrupt, f->path().string() + ": not JSON");
      Request r = Request::FromJson(j, f->path().string());
      next_seq_ = std::max(next_seq_, r.seq + 1);
      // A local coordinator is this service's child and died with the process that started it.
      if (r.state == RequestState::kStarted && !r.ended && r.child_coordinator()) orphans_.insert(Key(r.user, r.id));
      requests_[Key(r.user, r.id)] = std::move(r);
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  ReviveLocked();  // before the API answers: such a run reads as queued, not interrupted
}

Registry::~Registry() { StopQueue(); }

orchestrator::Runs Registry::RunsOf(const std::string& user) const {
  orchestrator::RunsConfig c;
  c.runs_dir = UserDir(user);
  c.msaflow_exe = config_.msaflow_exe;
  return orchestrator::Runs(std::move(c));
}

void Registry::Save(const Request& r) const {
  WriteFileAtomic(RequestPath(r), r.ToJson().dump(2) + "\n");
}

void Registry::StartQueue() {
  stop_ = false;
  queue_ = std::thread([this] { QueueLoop(); });
}

void Registry::StopQueue() {
  if (!queue_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  queue_.join();
  // The coordinators were started by that thread: its end sends them their parent-death signal.
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [k, live] : live_) live->child.WaitFor(30);
  live_.clear();
}

void Registry::QueueLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    try {
      Tick();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "msaflow serve: the queue: %s\n", e.what());
    }
    l.lock();
    wake_.wait_for(l, std::chrono::duration<double>(config_.tick_s), [this] { return stop_.load(); });
  }
}

bool Registry::RunningLocked(const Request& r) const {
  if (r.state != RequestState::kStarted) return false;
  const std::string key = Key(r.user, r.id);
  if (live_.count(key)) return true;
  if (settled_.count(key)) return false;
  const std::string dir = UserDir(r.user) + "/" + r.id;
  if (record::HasJournal(dir)) return record::CoordinatorHolding(dir) > 0;
  // Submitted to Slurm, its coordinator's job not started yet: it holds its place.
  return !r.child_coordinator() && r.error.empty() && record::WasSubmitted(dir);
}

void Registry::ReviveLocked() {
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    Request& r = requests_.at(*it);
    const std::string dir = UserDir(r.user) + "/" + r.id;
    if (r.state != RequestState::kStarted) {  // a user resumed or cancelled it meanwhile
      it = orphans_.erase(it);
      continue;
    }
    if (StillEnding(dir, r.pid, r.id)) {
      ++it;  // the next tick looks again
      continue;
    }
    const bool began = record::HasJournal(dir);
    std::string was;
    if (began) {
      try {
        const record::RunStatus st = record::StatusOf(dir);
        if (st.state == record::RunState::kInterrupted) was = st.line.substr(0, st.line.find(';'));
      } catch (const Error& e) {
        Log("run-not-resumed", {{"user", r.user}, {"run", r.id}, {"why", e.what()}});
      }
    } else if (r.error.empty() && !PathExists(dir + "/" + orchestrator::kCancelRequest)) {
      was = "its coordinator ended before the run began";
    }
    if (was.empty()) {  // it ended on its own (finished, failed, cancelled): nothing to do
      EndedLocked(*it);
    } else {
      r.kind = began ? RequestKind::kResume : RequestKind::kRun;
      r.state = RequestState::kQueued;  // its seq is unchanged: it keeps its place, ahead of later requests
      r.resume_reason = "msaflow serve (pid " + std::to_string(::getpid()) +
                        ") started again and resumes the runs that its stop interrupted: this one was " + was;
      Save(r);
      Log("run-requeued", {{"user", r.user}, {"run", r.id}, {"kind", RequestKindName(r.kind)}, {"was", was}});
    }
    it = orphans_.erase(it);
  }
}

void Registry::EndedLocked(const std::string& key) {
  settled_.insert(key);
  Request& r = requests_.at(key);
  if (r.ended) return;  // seen and logged by this process or an earlier one
  const std::string dir = UserDir(r.user) + "/" + r.id;
  json fields = {{"user", r.user}, {"run", r.id}};
  if (record::HasJournal(dir)) {
    try {
      const record::RunStatus st = record::StatusOf(dir);
      fields["state"] = record::StateName(st.state);
      fields["line"] = st.line.substr(0, st.line.find('\n'));
    } catch (const Error& e) {
      fields["state"] = "unknown";
      fields["line"] = e.what();
    }
  } else {
    fields["state"] = r.error.empty() ? "cancelled" : "failed";
    if (!r.error.empty()) fields["line"] = r.error;
  }
  r.ended = true;
  Save(r);
  Log("run-ended", fields);
}

void Registry::Tick() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = live_.begin(); it != live_.end();) {
    if (auto st = it->second->child.Poll()) {
      Request& r = requests_.at(it->first);
      const std::string dir = UserDir(r.user) + "/" + r.id;
      // Without a journal the run never began: unless a cancel stopped it, that is a failure
      // with a reason, whatever the exit status (a request must never read as running with no
      // coordinator behind it).
      if (!record::HasJournal(dir) && r.error.empty() && r.state == RequestState::kStarted) {
        r.error = "its coordinator ended (" + st->Describe() + ") before the run began: " +
                  Tail(UserDir(r.user) + "/.service/" + r.id + ".log", 1500);
        Save(r);
      }
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  ReviveLocked();
  int64_t running = 0;
  std::map<std::string, int64_t> per_user;
  std::vector<Request*> queued;
  for (auto& [key, r] : requests_) {
    if (r.state == RequestState::kQueued) queued.push_back(&r);
    if (r.state != RequestState::kStarted || settled_.count(key)) continue;
    if (RunningLocked(r) || orphans_.count(key)) {
      ++running;
      ++per_user[r.user];
    } else {
      EndedLocked(key);
    }
  }
  std::sort(queued.begin(), queued.end(), [](const Request* a, const Request* b) { return a->seq < b->seq; });
  for (Request* r : queued) {
    if (stop_ || running >= config_.max_running) break;
    const int64_t quota = config_.user_quota ? config_.user_quota(r->user) : 0;
    if (quota > 0 && per_user[r->user] >= quota) continue;  // the next user's run may go first
    // Its coordinator from before a restart is still ending: the next tick starts it, so that
    // `resume` does not find it alive and refuse. (A queued run has no live child of this process.)
    if (StillEnding(UserDir(r->user) + "/" + r->id, r->pid, r->id)) continue;
    StartRun(*r);
    ++running;
    ++per_user[r->user];
  }
}

void Registry::StartRun(Request& r) {
  const std::string svc = UserDir(r.user) + "/.service/";
  const std::string runs = UserDir(r.user);
  // A start that began the run but died with a service before the request said so: it goes on.
  if (r.kind == RequestKind::kRun && record::HasJournal(runs + "/" + r.id)) r.kind = RequestKind::kResume;
  orchestrator::CoordinatorStart start;
  start.kind = r.kind == RequestKind::kResume ? orchestrator::CoordinatorStart::Kind::kResume
               : r.child_coordinator()        ? orchestrator::CoordinatorStart::Kind::kRun
                                              : orchestrator::CoordinatorStart::Kind::kSubmit;
  start.pipeline_path = svc + r.id + ".pipeline.json";
  start.machine_arg = r.machine;
  start.run_id = r.id;
  start.reason = r.resume_reason;
  SpawnOptions o;
  o.output = SpawnOptions::Output::kFile;
  o.output_file = svc + r.id + ".log";
  o.stdin_null = true;
  o.new_session = true;       // a Ctrl-C of the service's terminal is the service's
  o.death_signal = SIGTERM;   // a coordinator here does not outlive the service: its run is interrupted
  if (!r.account.empty()) o.set_env = {"SLURM_ACCOUNT=" + r.account, "SBATCH_ACCOUNT=" + r.account};
  const std::string key = Key(r.user, r.id);
  r.state = RequestState::kStarted;
  r.error.clear();
  r.resume_reason.clear();
  r.ended = false;
  r.pid = 0;
  ++r.starts;
  settled_.erase(key);
  try {
    auto live = std::make_unique<Live>();
    live->child = RunsOf(r.user).StartCoordinator(start, o);
    r.pid = live->child.pid();
    live_[key] = std::move(live);
  } catch (const Error& e) {
    r.error = std::string("its coordinator could not be started: ") + e.what();
  }
  Save(r);
  json fields = {{"user", r.user},
                 {"run", r.id},
                 {"kind", RequestKindName(r.kind)},
                 {"launcher", workflow::LauncherName(r.launcher)},
                 {"starts", r.starts}};
  if (r.pid > 0) fields["pid"] = r.pid;
  if (!r.error.empty()) fields["error"] = r.error;
  Log(r.error.empty() ? "run-started" : "run-not-started", fields);
}

json Registry::Submit(const User& user, const std::string& body) {
  const std::string runs = UserDir(user.name);
  Admitted a;
  try {
    a = Admit(body, user, config_.machine, runs);
  } catch (const ApiError& e) {
    Log("run-refused", {{"user", user.name}, {"status", e.status()}, {"code", e.code()}, {"why", e.what()}});
    throw;
  }
  Request r;
  r.user = user.name;
  r.name = a.name;
  r.pipeline = a.pipeline.name;
  r.machine = a.machine;
  r.launcher = a.machine_spec.launcher;
  r.account = user.account;
  r.created = record::JournalTime();
  {
    std::lock_guard<std::mutex> l(mu_);
    do {
      r.id = orchestrator::NewRunId(a.name);
    } while (requests_.count(Key(r.user, r.id)) || PathExists(runs + "/" + r.id));
    r.seq = next_seq_++;
    WriteFileAtomic(runs + "/.service/" + r.id + ".pipeline.json", a.pipeline.source.dump(2) + "\n");
    Save(r);  // the request exists once this file does
    requests_[Key(r.user, r.id)] = r;
  }
  Log("run-admitted", {{"user", r.user},
                       {"run", r.id},
                       {"pipeline", r.pipeline},
                       {"machine", r.machine},
                       {"launcher", workflow::LauncherName(r.launcher)},
                       {"seq", r.seq}});
  wake_.notify_all();
  json out = View(user, r.id);
  out["validation"] = a.summary;
  return out;
}

json Registry::Validate(const User& user, const std::string& body) const {
  const Admitted a = Admit(body, user, config_.machine, UserDir(user.name));
  return {{"validation", a.summary}, {"pipeline", a.pipeline.source}};
}

Request Registry::Find(const User& user, const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = requests_.find(Key(user.name, id));
  if (!ValidRunId(id) || it == requests_.end()) throw ApiError(404, "not_found", "no run " + id);
  return it->second;
}

int64_t Registry::PositionLocked(const Request& r) const {
  int64_t pos = 1;
  for (const auto& [k, o] : requests_)
    if (o.state == RequestState::kQueued && o.seq < r.seq) ++pos;
  return pos;
}

namespace {
// What the view of an ended run was made from: the journal's and the results' sizes and
// modification times (nanoseconds). Empty when the journal cannot be read.
std::string FileStamp(const std::string& dir) {
  std::string stamp;
  for (const std::string& f : {record::JournalPath(dir), record::ResultsPath(dir)}) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) {
      if (stamp.empty()) return "";
      stamp += "-";
      continue;
    }
    stamp += fmt::format("{}.{}.{};", st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  return stamp;
}

// The run's view from its journal (and its results once finished): state, champion, rounds,
// each task's row.
json DescribeJournal(const std::string& dir, bool child_alive) {
  json v;
  const std::string jpath = record::JournalPath(dir);
  const record::Journal journal = record::ReadJournal(jpath);
  record::RunStatus st = record::StateFrom(record::Summarize(journal, jpath), record::CoordinatorHolding(dir), dir);
  std::string state = record::StateName(st.state);
  if (child_alive && state != "running" && state != "finished") state = "running";  // a resume about to take over
  v["state"] = state;
  v["line"] = st.line;
  v["started"] = st.summary.started_at;
  v["events"] = journal.events.empty() ? 0 : journal.events.back().line;
  json rounds = json::array();
  for (const auto& e : journal.events)
    if (e.kind == record::EventKind::kRoundEnd)
      rounds.push_back({{"round", e.fields.value("round", 0)}, {"champion", e.fields.value("champion", "")},
                        {"accuracy", e.fields.value("accuracy", 0.0)}, {"time", e.fields.value("time", "")}});
  if (!rounds.empty()) v["champion"] = {{"candidate", rounds.back()["champion"]}, {"accuracy", rounds.back()["accuracy"]}};
  if (st.state == record::RunState::kFailed || st.state == record::RunState::kCancelled ||
      st.state == record::RunState::kInterrupted)
    v["error"] = {{"code", state}, {"message", st.summary.error.empty() ? st.line : st.summary.error}};
  if (st.state == record::RunState::kFinished && record::HasResults(dir)) {
    json res = json::parse(ReadFile(record::ResultsPath(dir)), nullptr, false);
    if (res.is_object() && res.contains("champion")) {
      const json& c = res["champion"];
      json champ = {{"candidate", c.value("candidate", json::object()).value("id", "")},
                    {"accuracy", c.value("accuracy", 0.0)}};
      if (c.contains("test") && c["test"].is_object()) champ["test_accuracy"] = c["test"].value("accuracy", 0.0);
      v["champion"] = champ;
      v["result"] = {{"champion", champ}, {"stop", res.value("stop_reason", "")}, {"seconds", res.value("seconds", 0.0)},
                     {"rounds", res.value("rounds", json::array()).size()}};
    }
  }
  v["rounds"] = rounds;
  json tasks = json::array();
  for (const record::TaskRow& t : record::TaskRows(st)) {
    json row = {{"task", t.task},   {"module", t.module},   {"state", t.state},    {"ranks", t.ranks},
                {"starts", t.starts}, {"retries", t.retries}, {"started", t.started}};
    if (t.seconds >= 0) row["seconds"] = t.seconds;
    tasks.push_back(std::move(row));
  }
  v["tasks"] = tasks;
  return v;
}
}  // namespace

std::string Registry::StateOf(const User& user, const std::string& id, bool* terminal) const {
  const json v = Describe(Find(user, id), false);
  std::string s = v.at("state");
  if (terminal) *terminal = Terminal(s);
  return s;
}

json Registry::Describe(const Request& r, bool full) const {
  json v = {{"id", r.id},           {"name", r.name},       {"pipeline", r.pipeline},
            {"created", r.created}, {"machine", r.machine}, {"launcher", workflow::LauncherName(r.launcher)}};
  const std::string dir = UserDir(r.user) + "/" + r.id;
  bool child_alive = false;
  std::string cancelled_by;  // a cancel the service answered itself, before a coordinator held the run
  int64_t orphan_position = 0;  // > 0: a run the service's own stop interrupted, to be queued again
  auto requeued = [&](json& view) {
    if (orphan_position <= 0 || view.value("state", "") != "interrupted") return;
    view["state"] = "queued";
    view["position"] = orphan_position;
    view["line"] = fmt::format(
        "queued (position {}): msaflow serve stopped while it ran, and resumes it once its "
        "coordinator from before has stopped",
        orphan_position);
    view.erase("error");
  };
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = requests_.find(Key(r.user, r.id));
    const Request& now = it == requests_.end() ? r : it->second;
    child_alive = live_.count(Key(r.user, r.id)) > 0;
    if (now.state == RequestState::kCancelled) cancelled_by = now.cancelled_by;
    if (now.state == RequestState::kQueued) {
      v["state"] = "queued";
      v["position"] = PositionLocked(now);
      v["line"] = fmt::format("queued (position {})", v["position"].get<int64_t>());
      return v;
    }
    // Started by a service that died: its coordinator got the parent-death signal and may still
    // be stopping, its journal saying interrupted already. ReviveLocked queues it again (in its
    // place) once that coordinator is gone, unless it ended otherwise: until then it reads as
    // queued, never as the interrupted run a user would have to resume.
    if (orphans_.count(Key(r.user, r.id)) && now.state == RequestState::kStarted) {
      orphan_position = PositionLocked(now);
    }
    if (now.state == RequestState::kCancelled && !record::HasJournal(dir)) {
      v["state"] = "cancelled";
      v["line"] = "cancelled before it started by " + now.cancelled_by;
      return v;
    }
  }
  if (!record::HasJournal(dir)) {
    if (!r.error.empty()) {
      v["state"] = "failed";
      v["error"] = {{"code", "not_started"}, {"message", r.error}};
      v["line"] = "failed: " + r.error;
    } else if (child_alive || !r.child_coordinator()) {
      v["state"] = "running";
      v["line"] = child_alive ? "starting its coordinator" : "its coordinator's job waits in Slurm's queue";
    } else {  // a local run's coordinator is gone before it began: never "running" with nothing behind it
      v["state"] = "interrupted";
      v["line"] =
          "interrupted: its coordinator ended before the run began (the service stopped); "
          "the service starts it again";
      v["error"] = {{"code", "interrupted"}, {"message", v["line"]}};
      requeued(v);
    }
    return v;
  }
  json view;
  const std::string key = Key(r.user, r.id), stamp = child_alive ? "" : FileStamp(dir);
  {
    std::lock_guard<std::mutex> l(ended_mu_);
    auto it = ended_.find(key);
    if (!stamp.empty() && it != ended_.end() && it->second.stamp == stamp) view = it->second.view;
  }
  if (view.is_null()) {
    view = DescribeJournal(dir, child_alive);
    const std::string& state = view["state"].get_ref<const std::string&>();
    if (!stamp.empty() && (state == "finished" || state == "failed" || state == "cancelled")) {
      std::lock_guard<std::mutex> l(ended_mu_);
      if (ended_.size() >= 4096) ended_.clear();  // a bound, not a policy: views are remade on demand
      ended_[key] = {stamp, view};
    }
  }
  // A resume's coordinator stopped by a cancel before it took the run over leaves the journal
  // as it was (interrupted): the run is cancelled, and by whom.
  if (!cancelled_by.empty() && view["state"] == "interrupted") {
    view["state"] = "cancelled";
    view["line"] = "cancelled by " + cancelled_by + " before its coordinator took the run over";
    view["error"] = {{"code", "cancelled"}, {"message", view["line"]}};
  }
  requeued(view);
  if (!full) {
    view.erase("rounds");
    view.erase("tasks");
  }
  for (auto& [k, x] : v.items()) view[k] = x;
  return view;
}

json Registry::View(const User& user, const std::string& id) const {
  json v = Describe(Find(user, id), true);
  if (!v.contains("tasks")) v["tasks"] = json::array();
  return v;
}

json Registry::List(const User& user, size_t offset, size_t limit) const {
  std::vector<Request> mine;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [k, r] : requests_)
      if (r.user == user.name) mine.push_back(r);
  }
  std::sort(mine.begin(), mine.end(), [](const Request& a, const Request& b) { return a.seq > b.seq; });
  json out = json::array();
  for (size_t i = offset; i < mine.size() && i < offset + limit; ++i) out.push_back(Describe(mine[i], false));
  return out;
}

size_t Registry::Count(const User& user) const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<size_t>(std::count_if(requests_.begin(), requests_.end(),
                                           [&](const auto& kv) { return kv.second.user == user.name; }));
}

json Registry::Cancel(const User& user, const std::string& id) {
  const Request r = Find(user, id);
  const std::string by = "user " + user.name + " (msaflow serve)";
  const std::string dir = UserDir(r.user) + "/" + r.id;
  {
    std::lock_guard<std::mutex> l(mu_);
    Request& now = requests_.at(Key(r.user, r.id));
    if (now.state == RequestState::kQueued) {  // never started: it leaves the queue
      now.state = now.kind == RequestKind::kResume ? RequestState::kStarted : RequestState::kCancelled;
      now.cancelled_by = by;
      Save(now);
      if (now.kind == RequestKind::kResume) settled_.erase(Key(r.user, r.id));
      Log("run-cancel", {{"user", r.user}, {"run", r.id}, {"by", by}, {"what", "taken out of the queue"}});
      return {{"id", r.id}, {"state", "cancelled"}, {"message", "taken out of the queue"}};
    }
  }
  bool terminal = false;
  const std::string state = StateOf(user, id, &terminal);
  if (terminal) throw ApiError(409, "not_running", "run " + id + " is " + state + "; there is nothing to cancel");
  std::string said;
  if ((record::HasJournal(dir) && record::CoordinatorHolding(dir) > 0) ||
      (!r.child_coordinator() && record::WasSubmitted(dir))) {
    said = RunsOf(r.user).Cancel(dir, by);
    if (!record::HasJournal(dir)) {  // its coordinator's job had not started: it never will
      std::lock_guard<std::mutex> l(mu_);
      Request& now = requests_.at(Key(r.user, r.id));
      now.state = RequestState::kCancelled;
      now.cancelled_by = by;
      Save(now);
    }
  } else {
    // Its coordinator has not begun the run yet: stop it before it does. It may be past the
    // point where SIGTERM ends it at once, and begin the run before it sees the signal: the
    // request in the directory then makes the run's journal say cancelled, not interrupted.
    orchestrator::Runs::RequestCancel(dir, by);
    std::lock_guard<std::mutex> l(mu_);
    Request& now = requests_.at(Key(r.user, r.id));
    now.state = RequestState::kCancelled;
    now.cancelled_by = by;
    Save(now);
    auto it = live_.find(Key(r.user, r.id));
    if (it != live_.end()) it->second->child.Signal(SIGTERM);
    said = "its coordinator was stopped before the run began";
  }
  Log("run-cancel", {{"user", r.user}, {"run", r.id}, {"by", by}, {"what", said}});
  return {{"id", r.id}, {"state", "cancelling"}, {"message", said}};
}

json Registry::Resume(const User& user, const std::string& id) {
  const Request r = Find(user, id);
  bool terminal = false;
  const std::string state = StateOf(user, id, &terminal);
  if (state == "finished" || !terminal)
    throw ApiError(409, "not_resumable", "run " + id + " is " + state + "; only an interrupted, failed or cancelled run resumes");
  {
    std::lock_guard<std::mutex> l(mu_);
    if (live_.count(Key(r.user, r.id)))  // cancelled before it began, and its coordinator not gone yet
      throw ApiError(409, "stopping", "run " + id + " is " + state + " but its coordinator is still stopping; try again in a moment");
    Request& now = requests_.at(Key(r.user, r.id));
    now.kind = record::HasJournal(UserDir(r.user) + "/" + r.id) ? RequestKind::kResume : RequestKind::kRun;
    if (now.kind == RequestKind::kRun) {  // it starts afresh: a cancel asked for before it began is answered
      std::error_code gone;
      std::filesystem::remove(UserDir(r.user) + "/" + r.id + "/" + orchestrator::kCancelRequest, gone);
    }
    now.state = RequestState::kQueued;
    now.error.clear();
    now.resume_reason.clear();
    now.seq = next_seq_++;
    Save(now);
    Log("run-resume-asked", {{"user", r.user}, {"run", r.id}, {"kind", RequestKindName(now.kind)}, {"was", state}});
  }
  wake_.notify_all();
  return View(user, id);
}

std::string Registry::RunDir(const User& user, const std::string& id) const {
  const Request r = Find(user, id);
  return UserDir(r.user) + "/" + r.id;
}

std::string Registry::CoordinatorLog(const User& user, const std::string& id) const {
  const Request r = Find(user, id);
  return UserDir(r.user) + "/.service/" + r.id + ".log";
}

}  // namespace msaflow::service
