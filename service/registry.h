// The service's runs: what each user asked for, kept on disk, and the queue that starts them
// through the run library (orchestrator::Runs: a coordinator process per run, the same launchers
// as the CLI).
//
// Nothing lives only in memory. Under the runs directory each user has a folder of runs:
//   <runs>/<user>/<id>/                    the run directory its coordinator makes (journal, ...)
//   <runs>/<user>/.service/<id>.json       the request: {id, user, name, created, seq, state, ...}
//   <runs>/<user>/.service/<id>.pipeline.json, <id>.log   what the coordinator reads and says
// A request's state is queued, started or cancelled (cancelled before it started); once started,
// the run's state is its journal's (record/status.h). A service killed and started again reads
// them back: queued runs keep their order, and the local runs whose coordinator died with it (its
// children: they get SIGTERM when it dies) are resumed in their order, each journal saying why;
// runs that ended while it lived (finished, failed, cancelled by a user) stay as they are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "orchestrator/runs.h"
#include "service/admission.h"
#include "service/users.h"
#include "workflow/machine.h"

namespace msaflow::service {

inline constexpr char kRequestFormat[] = "msaflow.service-run/1";

struct RegistryConfig {
  std::string runs_dir;       // absolute
  std::string machine;        // "" = each pipeline's (see Admit)
  int64_t max_running = 2;    // runs whose coordinator runs at once, all users together
  std::string msaflow_exe;    // what coordinators run as
  double tick_s = 0.2;        // how often the queue looks at its runs
  // A user's own bound on running runs (the users file's max_running; 0 = none), read as the
  // queue admits runs, so that an edited users file counts at once.
  std::function<int64_t(const std::string& user)> user_quota;
};

// Where a request stands between the queue and its run (whose own state is its journal's).
enum class RequestState {
  kQueued,     // waits for the queue to start it
  kStarted,    // its coordinator was started: the run's journal says the rest
  kCancelled,  // cancelled before it started
};
const char* RequestStateName(RequestState s);  // "queued", "started", "cancelled" (the request file's words)

// What the queue starts next for a request.
enum class RequestKind {
  kRun,     // the run from its beginning
  kResume,  // a run that began, continued
};
const char* RequestKindName(RequestKind k);  // "run", "resume"

struct Request {
  std::string id, user, name, pipeline, created, machine;
  workflow::LauncherKind launcher = workflow::LauncherKind::kLocal;  // the machine's
  RequestState state = RequestState::kQueued;
  RequestKind kind = RequestKind::kRun;
  std::string cancelled_by, account, error;  // error: the coordinator could not be started
  std::string resume_reason;                 // the next resume's, for its journal (the service's own restart)
  int64_t seq = 0, starts = 0;
  int64_t pid = 0;     // the last coordinator this service started for it
  bool ended = false;  // the service saw that coordinator end: the run is not its restart's to resume
  // Its coordinator is this service's child (and dies with it), not a job of the machine's batch system.
  bool child_coordinator() const { return workflow::OnThisHost(launcher); }
  nlohmann::json ToJson() const;
  static Request FromJson(const nlohmann::json& j, const std::string& where);
};

class Registry {
 public:
  explicit Registry(RegistryConfig config);  // reads every user's requests back
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  void StartQueue();  // the thread that starts queued runs and reaps their coordinators
  void StopQueue();   // its coordinators get SIGTERM as it ends (they die with it)

  // A new run, queued: 202's body {id, state, position, ...}. Throws ApiError.
  nlohmann::json Submit(const User& user, const std::string& body);
  // What Submit would check, and nothing queued or written: {"validation": validate's lines,
  // "pipeline": the pipeline as it would run (paths absolute)}. Throws ApiError as Submit does.
  nlohmann::json Validate(const User& user, const std::string& body) const;
  // The user's runs, newest first: [{id, name, state, created, position?, champion?}].
  nlohmann::json List(const User& user, size_t offset, size_t limit) const;
  size_t Count(const User& user) const;
  // A run as GET /v1/runs/{id} shows it. Throws ApiError 404 for a run that is not the user's.
  nlohmann::json View(const User& user, const std::string& id) const;
  nlohmann::json Cancel(const User& user, const std::string& id);
  nlohmann::json Resume(const User& user, const std::string& id);

  // The run's directory, its coordinator's log; 404 unless it is the user's.
  std::string RunDir(const User& user, const std::string& id) const;
  std::string CoordinatorLog(const User& user, const std::string& id) const;
  // The state only (queued, running, ..., finished) and whether it can change any more.
  std::string StateOf(const User& user, const std::string& id, bool* terminal) const;

  const RegistryConfig& config() const { return config_; }
  static bool ValidRunId(const std::string& id);

 private:
  struct Live;
  std::string UserDir(const std::string& user) const { return config_.runs_dir + "/" + user; }
  std::string RequestPath(const Request& r) const { return UserDir(r.user) + "/.service/" + r.id + ".json"; }
  orchestrator::Runs RunsOf(const std::string& user) const;  // the run library on a user's runs
  void Save(const Request& r) const;
  Request Find(const User& user, const std::string& id) const;  // 404
  nlohmann::json Describe(const Request& r, bool full) const;
  int64_t PositionLocked(const Request& r) const;
  void QueueLoop();
  void Tick();
  void StartRun(Request& r);
  bool RunningLocked(const Request& r) const;
  void ReviveLocked();                       // the orphans whose coordinators are gone: queued again
  void EndedLocked(const std::string& key);  // a started run seen ended: recorded, logged

  RegistryConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, Request> requests_;            // by "user/id"
  std::map<std::string, std::unique_ptr<Live>> live_;  // coordinators this process started, by "user/id"
  std::set<std::string> settled_;  // started runs seen ended (their state changes only by a resume)
  // Local runs started by an earlier service process whose end it did not see: resumed (or
  // started again) once their coordinator is gone, if it left them interrupted.
  std::set<std::string> orphans_;
  // Views of ended runs (finished, failed, cancelled), each with the sizes and times of the
  // files it was made from: status polls of an ended run then cost two stat calls, not a
  // journal parsed (bench/serve_bench.py). A resume changes the journal, so the stamp.
  struct Ended {
    std::string stamp;
    nlohmann::json view;
  };
  mutable std::mutex ended_mu_;
  mutable std::map<std::string, Ended> ended_;
  int64_t next_seq_ = 1;
  std::thread queue_;
  std::atomic<bool> stop_{false};
  std::condition_variable wake_;
};

}  // namespace msaflow::service
