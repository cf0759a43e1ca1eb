#include "orchestrator/run.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric_store.h"
#include "nam/server.h"
#include "nam/store.h"
#include "orchestrator/coordinator_lock.h"
#include "orchestrator/fpga_preflight.h"
#include "orchestrator/journal.h"
#include "orchestrator/progress.h"
#include "orchestrator/provenance.h"
#include "orchestrator/shared_nam.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "orchestrator/nam_process.h"
#include "orchestrator/placement.h"
#include "orchestrator/slurm.h"

namespace msaflow::orchestrator {
using nlohmann::json;

std::string NewRunId(const std::string& name) {
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", std::gmtime(&t));
  std::string clean;
  for (char c : name) clean.push_back((std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '-'));
  std::mt19937 rng(std::random_device{}());
  return fmt::format("{}-{}-{:04x}", clean, ts, rng() & 0xffff);
}

namespace {

// One coordinator's hold on a run: its NAM, its launcher, its journal, and the round loop.
class RunDriver {
 public:
  RunDriver(const Pipeline& p, const Machine& m, const RunOptions& opt, std::FILE* out, std::string id,
            std::string dir, JournalWriter journal, RunSummary before)
      : p_(p), m_(m), opt_(opt), progress_(out), id_(std::move(id)), dir_(std::move(dir)),
        journal_(std::move(journal)), before_(std::move(before)), loop_(p) {}

  void Drive(Launcher* given) {
    if (m_.launcher == "slurm" && !m_.slurm.conf.empty())
      ::setenv("SLURM_CONF", m_.slurm.conf.c_str(), 1);  // for the jobs' own srun, and the NAM's
    try {
      nam_uri_ = NamFor(p_, m_, opt_.runs_dir);
      if (nam_uri_ == "serve") StartNamServer();
      store_ = nam::OpenStore(nam_uri_);
      std::unique_ptr<Launcher> own;
      if (!given) own = MakeLauncher();
      Launcher& launcher = given ? *given : *own;
      progress_.Line(fmt::format("run {}: pipeline {} on machine {}, NAM {}\n  run directory {}", id_, p_.name, m_.name,
                                 nam_uri_, dir_));
      ReattachSlurmJobs();
      const auto start = std::chrono::steady_clock::now();
      for (int round = 1; round <= p_.rounds.max; ++round)
        if (Round(round, launcher)) break;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      WriteFileAtomic(dir_ + "/results.json", loop_.Results(id_, nam_uri_, secs).dump(2) + "\n");
      WriteProvenance(true);
      const Ranked& champ = loop_.champion();
      journal_.Event("run-end", {{"champion", champ.candidate.id}, {"accuracy", champ.metric}, {"stop", loop_.stop_reason()}});
      progress_.Finish(p_, loop_, secs, dir_);
    } catch (const Error& e) {
      try {
        journal_.Event("run-failed", {{"round", round_}, {"error", e.what()}});
      } catch (const Error& j) {  // a full disk: say both, the journal's failure too
        Throw(e.kind(), std::string(e.what()) + "\n  (and the journal could not record it: " + j.what() + ")");
      }
      throw;
    }
  }

 private:
  // provenance.json, after every round (a report of a run still going, or of one that failed,
  // shows the rounds it finished); at the end with the champion's confusion matrix.
  void WriteProvenance(bool final) {
    const Ranked& champ = loop_.champion();
    json c = {{"candidate", champ.candidate.id}, {"model", champ.model}, {"accuracy", champ.metric},
              {"test", champ.test}};
    std::string result;  // the champion's result object (a kept candidate is listed in later rounds too)
    for (const json& r : provenance_)
      for (const json& e : r.at("candidates"))
        if (e.at("candidate") == champ.candidate.id) result = e.value("result", "");
    if (final && !result.empty())
      c["confusion"] = ConfusionOf(json::parse(store_->Get(result).bytes, nullptr, false));
    WriteFileAtomic(dir_ + "/provenance.json",
                    json{{"format", kProvenanceFormat}, {"run", id_}, {"pipeline", p_.name}, {"machine", m_.name},
                         {"launcher", m_.launcher}, {"nam", nam_uri_}, {"coordinator", ThisCoordinator().ToJson()},
                         {"resumes", before_.resumes + (before_.run.empty() ? 0 : 1)}, {"finished", final},
                         {"rounds", provenance_}, {"champion", c}}
                            .dump(2) +
                        "\n");
  }

  void StartNamServer() {
    if (opt_.msaflow_exe.empty()) Throw(ErrorKind::kInternal, "RunPipeline: no msaflow binary to start the NAM server");
    std::string persist = std::filesystem::absolute(opt_.runs_dir + "/nam").lexically_normal().string();
    NamLaunch launch = NamLaunchFor(m_, id_, dir_);
    // A resumed run's server persists where its dead coordinator's did, and that one may take
    // a moment to stop; so may a shared server whose last run just ended.
    launch.lock_wait_s = 15;
    json event;
    try {
      if (launch.prefix.empty() && launch.token_file.empty()) {
        // On this node, on loopback: the runs directory's shared server (orchestrator/shared_nam.h).
        shared_nam_ = std::make_unique<SharedNamServer>(opt_.msaflow_exe, m_.nam, opt_.runs_dir, launch.lock_wait_s);
        nam_uri_ = shared_nam_->uri();
        progress_.Line(fmt::format("NAM server of {}: {} (pid {}, {}; {}, persisting to {})", opt_.runs_dir, nam_uri_,
                                   shared_nam_->pid(), shared_nam_->attached() ? "already serving" : "started",
                                   m_.nam.capacity, persist));
        event = {{"uri", nam_uri_}, {"pid", shared_nam_->pid()}, {"persist", persist}, {"shared", true},
                 {"attached", shared_nam_->attached()}, {"log", shared_nam_->log()}};
      } else {
        nam_server_ = std::make_unique<NamServerProcess>(opt_.msaflow_exe, m_.nam, persist,
                                                         dir_ + "/logs/nam-server.log", dir_ + "/nam-server.json", launch);
        nam_uri_ = nam_server_->uri();
        std::string where = fmt::format("pid {}", nam_server_->pid());
        if (!nam_server_->slurm_job().empty())
          where = fmt::format("Slurm job {} on {} node {}, srun pid {}", nam_server_->slurm_job(), m_.nam.module,
                              nam_server_->node(), nam_server_->pid());
        progress_.Line(fmt::format("NAM server for this run: {} ({}, {}, persisting to {})", nam_uri_, where,
                                   m_.nam.capacity, persist));
        event = {{"uri", nam_uri_}, {"pid", nam_server_->pid()}, {"persist", persist}, {"module", m_.nam.module},
                 {"slurm_job", nam_server_->slurm_job()}, {"node", nam_server_->node()},
                 {"log", dir_ + "/logs/nam-server.log"}};
      }
    } catch (const Error& e) {
      Throw(e.kind(), std::string("starting the NAM server: ") + e.what());
    }
    event["capacity"] = m_.nam.capacity;
    journal_.Event("nam-server", event);
  }

  // "" while the run's NAM server serves; else which server, and what became of it.
  std::string NamServerGone() {
    std::string which, how, log;
    if (shared_nam_) {
      which = "pid " + std::to_string(shared_nam_->pid());
      how = shared_nam_->Exited();
      log = shared_nam_->log();
    } else if (nam_server_) {
      which = nam_server_->slurm_job().empty() ? "pid " + std::to_string(nam_server_->pid())
                                               : "Slurm job " + nam_server_->slurm_job();
      how = nam_server_->Exited();
      log = dir_ + "/logs/nam-server.log";
    }
    if (how.empty()) return "";
    return fmt::format("the run's NAM server ({}, {}) {}; its log: {}", nam_uri_, which, how, log);
  }

  // Slurm jobs the dead coordinator submitted run on without it: wait for them to end rather
  // than submit their tasks again; their done objects then say what they finished. When the
  // NAM server they use was the dead coordinator's own Slurm job and it has ended, they cannot
  // finish: they are cancelled instead of waited for.
  void ReattachSlurmJobs() {
    if (m_.launcher != "slurm" || before_.slurm_jobs.empty()) return;
    SlurmCli cli(m_.slurm.conf);
    json states = json::array();
    if (!before_.nam_slurm_job.empty()) {
      const auto nam = ParseShowJob(cli.Show(before_.nam_slurm_job));
      if (nam.empty() || !EndState(nam).empty()) {
        for (const std::string& job : before_.slurm_jobs) cli.Cancel(job);
        progress_.Line(fmt::format("the previous coordinator's NAM server (Slurm job {}) has ended, so its round's "
                                   "job(s) cannot finish: cancelled them",
                                   before_.nam_slurm_job));
      }
    }
    for (const std::string& job : before_.slurm_jobs) {
      bool said = false;
      for (;;) {
        const auto comps = ParseShowJob(cli.Show(job));
        const std::string end = comps.empty() ? "gone" : EndState(comps);
        if (!end.empty()) {
          states.push_back({{"job", job}, {"state", end}});
          break;
        }
        if (!said) {
          progress_.Line(fmt::format("re-attached to Slurm job {} ({}), which the previous coordinator submitted; "
                                     "waiting for it to end",
                                     job, comps.front().state));
          said = true;
        }
        if (int sig = InterruptSignal()) {
          cli.Cancel(job);
          Throw(ErrorKind::kTaskFailed, fmt::format("interrupted by signal {} while waiting for Slurm job {}; cancelled it",
                                                    sig, job));
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(m_.slurm.poll_s));
      }
    }
    journal_.Event("slurm-reattached", {{"jobs", states}});
  }

  std::unique_ptr<Launcher> MakeLauncher() const {
    if (m_.launcher == "slurm")
      return std::make_unique<SlurmLauncher>(m_, opt_.msaflow_exe, id_, dir_, std::make_unique<SlurmCli>(m_.slurm.conf),
                                             static_cast<int>(p_.retries.max), p_.retries.on);
    return std::make_unique<LocalLauncher>(opt_.msaflow_exe, static_cast<int>(p_.retries.max), p_.retries.on);
  }

  // The task's done object, when its step committed everything for this very task (same key).
  std::optional<nlohmann::json> Done(const Task& t) const {
    const auto info = store_->Stat(workflow::TaskDoneObject(id_, round_, t.step));
    if (!info || info->meta.value("key", "") != workflow::TaskKey(t.body)) return std::nullopt;
    return info->meta;
  }

  // Runs (or replays) one round; true when the stop rule ends the run after it.
  bool Round(int round, Launcher& launcher) {
    round_ = round;
    slurm_times_ = json();
    const std::vector<Candidate> fresh = loop_.Candidates(round);
    RoundPlan plan = PlanRound(p_, m_, id_, nam_uri_, round, fresh, loop_.kept());
    json step_seconds = json::object();
    RoundPlan todo{round, {}};
    std::map<std::string, int64_t> skipped;  // task id -> the outputs its done object lists
    for (const Task& t : plan.tasks) {
      if (auto done = Done(t)) {
        skipped[t.id] = done->value("outputs", int64_t{0});
        if (before_.seconds.count(t.id)) step_seconds[t.step] = before_.seconds.at(t.id);
        if (!before_.tasks_done.count(t.id))  // the coordinator died before it could record the end
          journal_.Event("task-reused", {{"task", t.id}, {"key", done->value("key", "")},
                                         {"outputs", done->value("outputs", 0)}});
        continue;
      }
      todo.tasks.push_back(t);
    }
    const bool replayed = todo.tasks.empty();
    const bool ended_before = before_.rounds_ended >= round;
    if (!replayed) {
      std::map<std::string, std::string> files;
      for (const auto& t : plan.tasks) {
        std::string f = dir_ + "/tasks/" + t.id + ".json";
        WriteFileAtomic(f, t.body.dump(2) + "\n");
        files[t.id] = f;
      }
      progress_.RoundStart(round, p_.rounds.max, fresh.size(), loop_.kept().size(), plan.tasks.size(), skipped.size());
      journal_.Event("round-start", {{"round", round}, {"candidates", fresh.size()}, {"tasks", plan.tasks.size()},
                                     {"reused_tasks", skipped.size()}});
      for (const Task& t : plan.tasks)
        if (skipped.count(t.id)) progress_.TaskReused(t, static_cast<size_t>(skipped.at(t.id)));
      for (Task& t : todo.tasks)  // what is done already is no dependency to wait for
        t.after.erase(std::remove_if(t.after.begin(), t.after.end(), [&](const std::string& a) { return skipped.count(a); }),
                      t.after.end());
      RunTasks(todo, files, launcher, step_seconds);
    } else if (!ended_before) {
      progress_.Line(fmt::format("\n== round {}: every task was done before the run was resumed ==", round));
    }
    RoundOutcome outcome = ReadRoundOutcome(*store_, id_, round);
    json tasks = json::array();
    for (const Task& t : plan.tasks) {
      json done = json::object();
      if (auto info = store_->Stat(workflow::TaskDoneObject(id_, round, t.step)))
        done = json::parse(store_->Get(info->name).bytes, nullptr, false);
      const std::string started = started_.count(t.id)         ? started_.at(t.id)
                                  : before_.started.count(t.id) ? before_.started.at(t.id)
                                                                : "";
      tasks.push_back(ProvenanceTask(t, done.is_object() ? done : json::object(),
                                     skipped.count(t.id) ? "done by an earlier coordinator of the run"
                                     : here_.count(t.id) ? "ran in the coordinator: nothing to compute"
                                                         : "ran",
                                     step_seconds.value(t.step, 0.0), started));
    }
    std::map<std::string, json> curves;  // the training curves of the candidates this round trained
    for (const json& e : outcome.best.at("all"))
      if (e.value("round", 0) == round && !e.value("model", "").empty())
        if (auto info = store_->Stat(e["model"].get<std::string>()); info && info->meta.contains("curve"))
          curves[info->name] = info->meta["curve"];
    provenance_.push_back(ProvenanceRound(round, std::move(tasks), outcome, curves));
    json entry = RoundEntry(p_, round, outcome, step_seconds);
    if (!slurm_times_.empty()) entry["node_seconds"] = slurm_times_;
    if (!ended_before || !replayed) {
      progress_.RoundTable(p_, round, outcome);
      journal_.Event("round-end", {{"round", round}, {"champion", outcome.best.at("champion").at("candidate").at("id")},
                                   {"accuracy", outcome.best.at("champion").at("accuracy")}});
    }
    const bool stop = loop_.Absorb(round, outcome, std::move(entry));
    if (!stop && round < p_.rounds.max) WriteProvenance(false);
    return stop;
  }

  void RunTasks(const RoundPlan& todo, const std::map<std::string, std::string>& files, Launcher& launcher,
                json& step_seconds) {
    // For node-seconds under Slurm: the mode the round's job(s) ran in, when they were
    // submitted, and the first step's start and the last step's end.
    std::string slurm_mode;
    std::optional<std::chrono::steady_clock::time_point> submitted, first_start;
    std::chrono::steady_clock::time_point last_end{};
    LaunchObserver obs;
    obs.on_start = [&](const Task& t) {
      if (!first_start) first_start = std::chrono::steady_clock::now();
      started_[t.id] = JournalTime();
      progress_.TaskStart(t);
      journal_.Event("task-start", {{"task", t.id}, {"module", t.module}, {"ranks", t.ranks}});
    };
    obs.on_line = [&](const Task& t, const std::string& line) { progress_.TaskOutput(t, line); };
    obs.on_event = [&](const std::string& ev, json fields) {
      if (ev == "slurm-job" && slurm_mode.empty()) {
        slurm_mode = fields.value("mode", "");
        submitted = std::chrono::steady_clock::now();
      }
      progress_.LauncherEvent(ev, fields);
      journal_.Event(ev, std::move(fields));
    };
    obs.on_end = [&](const Task& t, double secs) {
      progress_.TaskEnd(t, secs);
      json end = {{"task", t.id}, {"seconds", secs}, {"status", "ok"}};
      if (auto done = store_->Stat(workflow::TaskDoneObject(id_, round_, t.step))) {
        end["key"] = done->meta.value("key", "");
        const json body = json::parse(store_->Get(done->name).bytes);
        for (const char* k : {"msaflow", "inputs", "outputs", "ranks"})
          if (body.contains(k)) end[k] = body[k];
      }
      journal_.Event("task-end", std::move(end));
      step_seconds[t.step] = secs;
      last_end = std::chrono::steady_clock::now();
    };
    obs.check = [&] {
      progress_.Tick();
      return NamServerGone();
    };
    // Under Slurm every step runs in the round's job(s); locally, what has nothing to compute
    // runs here without a process of its own.
    const RoundPlan rest = m_.launcher == "slurm" ? todo : RunSettledTasks(todo, opt_.run_settled, *store_, dir_ + "/logs", obs, &here_);
    if (!rest.tasks.empty()) launcher.RunRound(rest, files, dir_ + "/logs", obs);
    if (m_.launcher == "slurm" && first_start) {
      const double round_s = std::chrono::duration<double>(last_end - *first_start).count();
      const double queue_s = submitted ? std::chrono::duration<double>(*first_start - *submitted).count() : 0;
      std::map<std::string, double> secs;
      for (const auto& [k, v] : step_seconds.items()) secs[k] = v.get<double>();
      const std::string mode = slurm_mode.empty() ? m_.slurm.mode : slurm_mode;
      json ns = json::array();
      auto measured = MeasureNodeSeconds(secs, p_, m_, mode, round_s);
      for (const auto& n : measured)
        ns.push_back({{"module", n.module}, {"nodes", n.nodes}, {"held_s", n.held_s}, {"used_s", n.used_s}});
      slurm_times_ = {{"mode", mode}, {"round_s", round_s}, {"queue_s", queue_s}, {"modules", ns}};
      progress_.Line("  " + NodeSecondsSummary(measured, mode, todo.tasks.size(), std::max(queue_s, 0.5)));
    }
  }

  const Pipeline& p_;
  const Machine& m_;
  const RunOptions& opt_;
  ProgressPrinter progress_;
  std::string id_, dir_, nam_uri_;
  JournalWriter journal_;
  RunSummary before_;
  RoundLoop loop_;
  std::unique_ptr<NamServerProcess> nam_server_;  // this run's own (under Slurm, or off loopback)
  std::unique_ptr<SharedNamServer> shared_nam_;   // or the runs directory's
  std::unique_ptr<nam::Store> store_;
  std::set<std::string> here_;  // tasks the coordinator ran itself (RunSettledTasks)
  int round_ = 0;
  json slurm_times_;
  json provenance_ = json::array();             // one entry per round (orchestrator/provenance.h)
  std::map<std::string, std::string> started_;  // task id -> when this coordinator started it
};

// The checks a run makes before it writes anything: the NAM URI, fpga "opencl" with no OpenCL
// device here, labels or splits no model can be trained on, models prepare could not feed.
// Returns the NAM the run will use (NamFor).
std::string PreRunChecks(const Pipeline& p, const Machine& m, const std::string& runs_dir) {
  std::string nam = NamFor(p, m, runs_dir);
  FpgaPreflight(p, m);
  workflow::CheckDatasets(p);
  workflow::CheckBackbones(p);
  return nam;
}

}  // namespace

std::string RunPipeline(const Pipeline& p, const Machine& m, const RunOptions& opt, std::FILE* out,
                        Launcher* given_launcher) {
  std::string id = opt.run_id.empty() ? NewRunId(p.name) : opt.run_id;
  nam::ValidateObjectName(id);
  std::string dir = std::filesystem::absolute(opt.runs_dir + "/" + id).lexically_normal().string();
  if (PathExists(dir + "/journal.jsonl"))
    Throw(ErrorKind::kInvalidInput, "run directory " + dir + " already holds a run; continue it with `msaflow resume " +
                                        dir + "`, or choose another --run-id");
  const std::string nam = PreRunChecks(p, m, opt.runs_dir);
  // The run directory is made whole beside its final name, then renamed into place: a
  // coordinator killed in its first moments leaves no run without a journal.
  const std::string staging = std::filesystem::path(dir).parent_path().string() + "/." + id + ".starting";
  std::filesystem::remove_all(staging);
  MakeDirs(staging + "/tasks");
  MakeDirs(staging + "/logs");
  WriteFileAtomic(staging + "/pipeline.json", p.source.dump(2) + "\n");
  CoordinatorLock lock(staging);  // the lock is on the file, which the rename keeps
  JournalWriter staged = JournalWriter::Create(staging + "/journal.jsonl");
  staged.Event("run-start", {{"run", id}, {"pipeline", p.name}, {"machine", m.name}, {"machine_source", m.source},
                             {"launcher", m.launcher}, {"coordinator", ThisCoordinator().ToJson()},
                             {"nam", nam == "serve" ? std::string("a NAM server started for the run") : nam}});
  if (!PathExists(dir)) {
    if (::rename(staging.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      std::filesystem::remove_all(staging);
      errno = err;
      ThrowErrno("rename " + staging + " to " + dir);
    }
  } else {
    // `submit` made the directory (coordinator.sh, submitted.json): the staged files move in,
    // the journal last, so the run still appears at once.
    for (const char* f : {"tasks", "logs", "pipeline.json", "coordinator.lock", "journal.jsonl"}) {
      const std::string from = staging + "/" + f, to = dir + "/" + f;
      if (::rename(from.c_str(), to.c_str()) != 0) ThrowErrno("rename " + from + " to " + to);
    }
    std::filesystem::remove_all(staging);
  }
  RunDriver(p, m, opt, out, id, dir, JournalWriter::Append(dir + "/journal.jsonl"), RunSummary{}).Drive(given_launcher);
  return dir;
}

bool ResumeRun(const std::string& run_dir_arg, const RunOptions& opt_in, std::FILE* out, Launcher* given_launcher) {
  const std::string dir = std::filesystem::absolute(run_dir_arg).lexically_normal().string();
  const std::string journal_path = dir + "/journal.jsonl";
  if (!PathExists(journal_path))
    Throw(ErrorKind::kNotFound, dir + ": no journal.jsonl (not a run directory, or a run submitted to Slurm whose "
                                      "coordinator never started)");
  CoordinatorLock lock(dir);
  RunSummary before = Summarize(ReadJournal(journal_path), journal_path);
  if (before.finished) {
    std::fprintf(out, "run %s finished already: %s\n", before.run.c_str(), before.finish.c_str());
    return false;
  }
  if (before.machine_source.empty())
    Throw(ErrorKind::kUnsupported, journal_path + ": the run-start event names no machine_source (a journal of an "
                                                  "older msaflow); start the pipeline again with `msaflow run`");
  json source = json::parse(ReadFile(dir + "/pipeline.json"), nullptr, false);
  if (source.is_discarded()) Throw(ErrorKind::kCorrupt, dir + "/pipeline.json: not JSON");
  const Pipeline p = workflow::PipelineFromSource(source);
  const Machine m = LoadMachine(before.machine_source);
  RunOptions opt = opt_in;
  opt.runs_dir = std::filesystem::path(dir).parent_path().string();
  PreRunChecks(p, m, opt.runs_dir);
  JournalWriter journal = JournalWriter::Append(journal_path);
  journal.Event("resume", {{"coordinator", ThisCoordinator().ToJson()}, {"resume", before.resumes + 1},
                           {"was", before.failed ? "failed: " + before.error : "interrupted"},
                           {"tasks_done", before.tasks_done.size()}, {"rounds_ended", before.rounds_ended}});
  std::fprintf(out, "resuming run %s (%s; %zu task(s) done, %d round(s) ended)\n", before.run.c_str(),
               before.failed ? ("it failed: " + Printable(before.error, 200)).c_str() : "its coordinator died",
               before.tasks_done.size(), before.rounds_ended);
  const std::string id = before.run;  // not read from `before` in the call that moves it
  RunDriver(p, m, opt, out, id, dir, std::move(journal), std::move(before)).Drive(given_launcher);
  return true;
}

std::string LastResults(const std::string& runs_dir, const std::string& name) {
  std::string best;
  std::filesystem::file_time_type best_time{};
  std::error_code ec;
  for (std::filesystem::directory_iterator it(runs_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path f = it->path() / "results.json";
    std::error_code fe;
    const auto t = std::filesystem::last_write_time(f, fe);
    if (fe || (!best.empty() && t <= best_time)) continue;
    json r = json::parse(ReadFile(f.string()), nullptr, false);
    if (r.is_discarded() || !r.is_object() || !r.contains("format") || r["format"] != kResultsFormat ||
        !r.contains("pipeline") || r["pipeline"] != name)
      continue;
    best = f.string();
    best_time = t;
  }
  return best;
}

NamLaunch NamLaunchFor(const Machine& m, const std::string& run_id, const std::string& run_dir) {
  NamLaunch l;
  std::string host, port;
  nam::SplitHostPort(m.nam.listen, "machine " + m.name + ": /nam/listen", &host, &port);
  if (!nam::IsLoopbackHost(host)) {
    // Off loopback the server needs a token; the run directory is on the file system the
    // modules share, and only this user may read it.
    l.token_file = run_dir + "/nam-token";
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", rd());
    WriteFileAtomic(l.token_file, token + "\n");
    if (::chmod(l.token_file.c_str(), 0600) != 0) ThrowErrno("chmod " + l.token_file);
  }
  if (m.nam.module.empty() || m.launcher != "slurm") return l;
  const ModuleSpec& s = m.Module(m.nam.module, "machine " + m.name + ": /nam/module");
  if (const char* group = std::getenv("MSAFLOW_NAM_HET_GROUP")) {
    // The coordinator was submitted with the NAM as a component of its own job.
    l.prefix = {"srun", std::string("--het-group=") + group, "--nodes=1", "--ntasks=1", "--mpi=none",
                "--kill-on-bad-exit=1"};
  } else {
    // Its own job on the module's nodes, for as long as this run lasts.
    l.prefix = {"srun", "--job-name=msaflow-" + run_id + "-nam", "--partition=" + s.partition, "--nodes=1",
                "--ntasks=1", "--time=" + s.time, "--mpi=none", "--kill-on-bad-exit=1"};
    if (!s.constraint.empty()) l.prefix.push_back("--constraint=" + s.constraint);
    l.own_allocation = true;
  }
  l.start_timeout_s = 300;  // an allocation may have to wait
  return l;
}

std::string NamFor(const Pipeline& p, const Machine& m, const std::string& runs_dir) {
  if (p.nam.rfind("fabric://", 0) == 0) {
    try {
      nam::ParseFabricUri(p.nam);  // host, port (1..65535), options: refused now, not at the first step
    } catch (const Error& e) {
      Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: " + e.what());
    }
  }
  if (!p.nam.empty()) return p.nam;
  if (!m.nam.uri.empty()) return m.nam.uri;
  if (m.nam.serve) return "serve";
  return "file://" + std::filesystem::absolute(runs_dir + "/nam").lexically_normal().string();
}

}  // namespace msaflow::orchestrator
