#include "orchestrator/run.h"

#include <fmt/core.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <future>
#include <optional>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "common/signals.h"
#include "common/strings.h"
#include "launch/nam_process.h"
#include "launch/shared_nam.h"
#include "nam/fabric_store.h"
#include "nam/store.h"
#include "orchestrator/fpga_preflight.h"
#include "orchestrator/halving.h"
#include "record/coordinator_lock.h"
#include "record/journal.h"
#include "record/provenance.h"
#include "record/run_dir.h"
#include "workflow/backbones.h"
#include "workflow/candidates.h"
#include "workflow/datasets.h"

namespace msaflow::orchestrator {
using launch::Launcher;
using launch::LaunchObserver;
using launch::NamLaunch;
using launch::NamServerProcess;
using launch::SharedNamServer;
using nlohmann::json;
using record::JournalWriter;
using record::RunSummary;

std::string NewRunId(const std::string& name) {
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", std::gmtime(&t));
  std::string clean;
  for (char c : name)
    clean.push_back(std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(static_cast<unsigned char>(c))) : '-');
  std::mt19937 rng(std::random_device{}());
  return fmt::format("{}-{}-{:04x}", clean, ts, rng() & 0xffff);
}

namespace {

// The run-failed event of a coordinator that ends on `e` in `round` (0: before round 1). A signal
// (Ctrl-C, scancel, a service stopping) makes it interrupted; a cancel asked for (Runs::Cancel,
// or the service before the coordinator began) makes it cancelled, by whom asked.
void JournalFailure(const JournalWriter& journal, const std::string& dir, int round, const Error& e) {
  try {
    json failed = {{"round", round}, {"error", e.what()}};
    if (const int sig = InterruptSignal()) failed["signal"] = sig;
    if (PathExists(dir + "/" + kCancelRequest)) {
      json req = json::parse(ReadFile(dir + "/" + kCancelRequest), nullptr, false);
      failed["cancelled"] = true;
      if (req.is_object() && req.contains("by") && req["by"].is_string()) failed["by"] = req["by"];
    }
    journal.Event(record::EventKind::kRunFailed, failed);
  } catch (const Error& j) {  // a full disk: say both, the journal's failure too
    Throw(e.kind(), std::string(e.what()) + "\n  (and the journal could not record it: " + j.what() + ")");
  }
}

// The pipeline the rounds run (and what rung 0 hands to prepare): rung 0 of the halving strategy decides it (in this process, so
// a signal is looked for before and during it); an error or a signal there is journalled as a
// failure of the run before round `next` (0 in the journal for a new run), as a round's would be.
Rung0 RoundsPipeline(const Pipeline& p, const std::string& dir, const JournalWriter& journal, RunObserver& obs,
                     int next) {
  try {
    ThrowIfInterrupted("before round " + std::to_string(next));
    return HalvingRung0(p, dir, journal, obs);
  } catch (const Error& e) {
    JournalFailure(journal, dir, next - 1, e);
    throw;
  }
}

// halving: what a round's tasks run on (workflow::RoundPipeline): the backbones still in the
// race and the part of the training split, for the journal's round-start and the run's output.
// `test`: whether the round runs the test split (RoundLoop::TestsInRound).
json HalvingRace(const Pipeline& round_p, bool test) {
  json backbones = json::array();
  for (const auto& bb : round_p.backbones) backbones.push_back(bb.name);
  return {{"backbones", std::move(backbones)}, {"train_fraction", round_p.train.subset_fraction}, {"test", test}};
}

std::string HalvingRaceLine(int round, const json& race) {
  std::vector<std::string> names = race.at("backbones").get<std::vector<std::string>>();
  const double g = race.at("train_fraction").get<double>();
  return fmt::format("round {} (halving): {} backbone{} in the race ({}), on {} of the training split{}", round,
                     names.size(), names.size() == 1 ? "" : "s", Join(names, ", "),
                     workflow::DataShareText(g) + (g >= 1 ? "" : " (stratified)"),
                     race.value("test", true) ? "" : "; the test split held back for the last round");
}

// The runs directory's shared NAM server (a local run's, on loopback), found or started on a
// thread of its own while rung 0 ranks the backbones: its start (~0.4 s, a process and its
// persisted objects) no longer waits for rung 0 (issue 47 item 6). Only halving has a rung 0,
// and only where RunDriver would take that server anyway (no test launcher); the thread holds
// no stop signal (they stay the coordinator's main thread's), and the server, detached, does
// not die with the thread that started it.
using EarlyNam = std::future<std::unique_ptr<SharedNamServer>>;
EarlyNam StartSharedNamEarly(const Pipeline& p, const Machine& m, const RunOptions& opt) {
  if (p.rounds.strategy != workflow::Strategy::kHalving || opt.make_launcher || opt.msaflow_exe.empty() ||
      !m.OnThisHost() || NamFor(p, m, opt.runs_dir) != "serve" || !launch::NamOnLoopback(m))
    return {};
  const InterruptsHeld held;  // the new thread starts with SIGINT and SIGTERM blocked
  return std::async(std::launch::async, [exe = opt.msaflow_exe, spec = m.nam, runs = opt.runs_dir] {
    return std::make_unique<SharedNamServer>(exe, spec, runs, launch::kNamLockWaitHereS);
  });
}

// One coordinator's hold on a run: its NAM, its launcher, its journal, and the round loop.
class RunDriver {
 public:
  RunDriver(Rung0& rung0, const Machine& m, const RunOptions& opt, RunObserver& obs, std::string id, std::string dir,
            JournalWriter journal, RunSummary before, EarlyNam early_nam = {})
      : p_(rung0.pipeline),
        m_(m),
        opt_(opt),
        progress_(obs),
        id_(std::move(id)),
        dir_(std::move(dir)),
        journal_(std::move(journal)),
        before_(std::move(before)),
        loop_(rung0.pipeline),
        rung0_features_(std::move(rung0.features)),
        early_nam_(std::move(early_nam)) {}

  void Drive() {
    try {
      launch::LaunchContext ctx{id_, dir_, opt_.msaflow_exe, opt_.clock, nullptr};
      launcher_ = opt_.make_launcher ? opt_.make_launcher(p_, m_, ctx) : launch::MakeLauncher(p_, m_, ctx);
      Launcher& launcher = *launcher_;
      launcher.SetUpEnvironment();
      nam_uri_ = NamFor(p_, m_, opt_.runs_dir);
      if (nam_uri_ == "serve") StartNamServer();
      store_ = nam::OpenStore(nam_uri_);
      progress_.Line(fmt::format("run {}: pipeline {} on machine {}, NAM {}\n  run directory {}", id_, p_.name, m_.name,
                                 nam_uri_, dir_));
      PutRung0Features(*store_, id_, rung0_features_, progress_);
      rung0_features_ = {};  // in the NAM now (or left out): their memory goes
      Reattach(launcher);
      const auto start = opt_.clock->Now();
      for (int round = 1; round <= p_.rounds.max; ++round)
        if (Round(round, launcher)) break;
      const double secs = opt_.clock->SecondsSince(start);
      json results = loop_.Results(id_, nam_uri_, secs);
      if (json rung0 = ReadRung0(dir_); !rung0.is_null()) results["halving"] = {{"rung0", std::move(rung0)}};
      WriteFileAtomic(record::ResultsPath(dir_), results.dump(2) + "\n");
      WriteProvenance(true);
      const Ranked& champ = loop_.champion();
      journal_.Event(record::EventKind::kRunEnd,
                     {{"champion", champ.candidate.id}, {"accuracy", champ.metric}, {"stop", loop_.stop_reason()}});
      progress_.Finish(p_, loop_, secs, dir_);
    } catch (const Error& e) {
      JournalFailure(journal_, dir_, round_, e);
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
      c["confusion"] = record::ConfusionOf(json::parse(store_->Get(result).bytes, nullptr, false));
    WriteFileAtomic(dir_ + "/provenance.json",
                    json{{"format", record::kProvenanceFormat}, {"run", id_}, {"pipeline", p_.name}, {"machine", m_.name},
                         {"launcher", workflow::LauncherName(m_.launcher)}, {"nam", nam_uri_}, {"coordinator", record::ThisCoordinator().ToJson()},
                         {"resumes", before_.resumes + (before_.run.empty() ? 0 : 1)}, {"finished", final},
                         {"rounds", provenance_}, {"champion", c}}
                            .dump(2) +
                        "\n");
  }

  void StartNamServer() {
    if (opt_.msaflow_exe.empty()) Throw(ErrorKind::kInternal, "RunPipeline: no msaflow binary to start the NAM server");
    std::string persist =
        std::filesystem::absolute(record::PersistedNamPath(opt_.runs_dir)).lexically_normal().string();
    NamLaunch launch = launcher_->NamServerLaunch();
    // A resumed run's server persists where its dead coordinator's did, and that one may take
    // a moment to stop; so may a shared server whose last run just ended. Under Slurm longer: a
    // predecessor on a node that was lost and came back ends only once that node's slurmd has
    // re-registered and been told to end the job's steps (seen: over 15 s).
    launch.lock_wait_s = launch.prefix.empty() ? launch::kNamLockWaitHereS : launch::kNamLockWaitPlacedS;
    json event;
    try {
      if (launch.prefix.empty() && launch.token_file.empty()) {
        // On this node, on loopback: the runs directory's shared server (launch/shared_nam.h),
        // found or started while rung 0 ranked, if it was.
        shared_nam_ = early_nam_.valid() ? early_nam_.get()
                                         : std::make_unique<SharedNamServer>(opt_.msaflow_exe, m_.nam, opt_.runs_dir,
                                                                             launch.lock_wait_s);
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
    journal_.Event(record::EventKind::kNamServer, event);
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

  // What a dead coordinator of the run left running (its last round's Slurm jobs): the
  // launcher waits for it or cancels it, and the journal says which.
  void Reattach(Launcher& launcher) {
    json fields = launcher.Reattach({before_.slurm_jobs, before_.nam_slurm_job},
                                    [&](const std::string& line) { progress_.Line(line); });
    if (!fields.is_null()) journal_.Event(record::EventKind::kSlurmReattached, std::move(fields));
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
    round_account_ = json();
    const std::vector<Candidate> fresh = loop_.Candidates(round);
    // halving: the backbones still in the race, on the part of the training data this round has
    const Pipeline round_p = workflow::RoundPipeline(p_, round, fresh);
    const std::vector<KeptCandidate> kept = loop_.KeptFor(fresh);
    const bool test = loop_.TestsInRound(round, fresh);
    RoundPlan plan = PlanRound(round_p, m_, id_, nam_uri_, round, fresh, kept, test);
    json step_seconds = json::object();
    RoundPlan todo{round, {}};
    std::map<std::string, int64_t> skipped;  // task id -> the outputs its done object lists
    for (const Task& t : plan.tasks) {
      if (auto done = Done(t)) {
        skipped[t.id] = done->value("outputs", int64_t{0});
        if (before_.seconds.count(t.id)) step_seconds[workflow::StepName(t.step)] = before_.seconds.at(t.id);
        if (!before_.tasks_done.count(t.id))  // the coordinator died before it could record the end
          journal_.Event(record::EventKind::kTaskReused,
                         {{"task", t.id}, {"key", done->value("key", "")}, {"outputs", done->value("outputs", 0)}});
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
      progress_.RoundStart(round, p_.rounds.max, fresh.size(), kept.size(), plan.tasks.size(), skipped.size());
      json start = {{"round", round}, {"candidates", fresh.size()}, {"tasks", plan.tasks.size()},
                    {"reused_tasks", skipped.size()}};
      if (p_.rounds.strategy == workflow::Strategy::kHalving) {
        const json race = HalvingRace(round_p, test);
        progress_.Line(HalvingRaceLine(round, race));
        start["halving"] = race;
      }
      journal_.Event(record::EventKind::kRoundStart, start);
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
      tasks.push_back(record::ProvenanceTask(t, done.is_object() ? done : json::object(),
                                     skipped.count(t.id) ? "done by an earlier coordinator of the run"
                                     : here_.count(t.id) ? "ran in the coordinator: " + here_.at(t.id)
                                                         : std::string("ran"),
                                     step_seconds.value(workflow::StepName(t.step), 0.0), started));
    }
    std::map<std::string, json> curves;  // the training curves of the candidates this round trained
    for (const json& e : outcome.best.at("all"))
      if (e.value("round", 0) == round && !e.value("model", "").empty())
        if (auto info = store_->Stat(e["model"].get<std::string>()); info && info->meta.contains("curve"))
          curves[info->name] = info->meta["curve"];
    provenance_.push_back(record::ProvenanceRound(round, std::move(tasks), outcome.best, curves));
    json entry = RoundEntry(p_, round, outcome, step_seconds);
    if (p_.rounds.strategy == workflow::Strategy::kHalving) entry["halving"] = HalvingRace(round_p, test);
    if (!round_account_.is_null() && !round_account_.empty()) entry["node_seconds"] = round_account_;
    if (!ended_before || !replayed) {
      progress_.RoundTable(p_, round, outcome);
      journal_.Event(record::EventKind::kRoundEnd, {{"round", round},
                                                    {"champion", outcome.best.at("champion").at("candidate").at("id")},
                                                    {"accuracy", outcome.best.at("champion").at("accuracy")}});
    }
    const bool stop = loop_.Absorb(round, outcome, std::move(entry));
    if (!stop && round < p_.rounds.max) WriteProvenance(false);
    return stop;
  }

  void RunTasks(const RoundPlan& todo, const std::map<std::string, std::string>& files, Launcher& launcher,
                json& step_seconds) {
    LaunchObserver obs;
    obs.on_start = [&](const Task& t) {
      started_[t.id] = record::JournalTime();
      progress_.TaskStart(t);
      journal_.Event(record::EventKind::kTaskStart, {{"task", t.id}, {"module", t.module}, {"ranks", t.ranks}});
    };
    obs.on_line = [&](const Task& t, const std::string& line) { progress_.TaskOutput(t, line); };
    obs.on_event = [&](const std::string& ev, json fields) {
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
      journal_.Event(record::EventKind::kTaskEnd, std::move(end));
      step_seconds[workflow::StepName(t.step)] = secs;
    };
    obs.check = [&] {
      progress_.Tick();
      return NamServerGone();
    };
    if (launcher.RunsStepsInCoordinator() && opt_.run_here) {
      // What costs less than a process runs here, where the launcher allows it; it runs the
      // rest one task at a time, in the plan's order, as it would the whole round.
      for (const Task& t : todo.tasks) {
        std::string why = launch::RunTaskInCoordinator(t, opt_.run_here, *store_, dir_ + "/logs", obs, *opt_.clock);
        if (!why.empty()) {
          here_[t.id] = std::move(why);
          continue;
        }
        Task one = t;
        one.after.clear();  // every task before it has ended
        launcher.RunRound(RoundPlan{todo.round, {std::move(one)}}, files, dir_ + "/logs", obs);
      }
    } else {
      launcher.RunRound(todo, files, dir_ + "/logs", obs);
    }
    std::map<std::string, double> secs;
    for (const auto& [k, v] : step_seconds.items()) secs[k] = v.get<double>();
    std::string summary;
    round_account_ = launcher.RoundAccount(secs, &summary);
    if (!summary.empty()) progress_.Line("  " + summary);
  }

  const Pipeline& p_;
  const Machine& m_;
  const RunOptions& opt_;
  RunObserver& progress_;
  // Declared before the NAM server, which may reach Slurm through the launcher's JobRunner:
  // members end in reverse order, so the launcher outlives it.
  std::unique_ptr<Launcher> launcher_;
  std::string id_, dir_, nam_uri_;
  JournalWriter journal_;
  RunSummary before_;
  RoundLoop loop_;
  std::unique_ptr<NamServerProcess> nam_server_;  // this run's own (under Slurm, or off loopback)
  std::unique_ptr<SharedNamServer> shared_nam_;   // or the runs directory's
  std::unique_ptr<nam::Store> store_;
  std::map<std::string, std::string> here_;  // tasks the coordinator ran itself, and why (RunTaskInCoordinator)
  int round_ = 0;
  json round_account_;  // what the launcher says the round cost (Slurm: node-seconds)
  json provenance_ = json::array();             // one entry per round (record/provenance.h)
  std::map<std::string, std::string> started_;  // task id -> when this coordinator started it
  std::vector<workflow::SubsetFeatures> rung0_features_;  // until they are in the NAM
  EarlyNam early_nam_;  // the shared NAM server, being found or started since before rung 0
};

}  // namespace

std::string PreRunChecks(const Pipeline& p, const Machine& m, const std::string& runs_dir) {
  std::string nam = NamFor(p, m, runs_dir);
  FpgaPreflight(p, m);
  workflow::CheckDatasets(p);
  workflow::CheckBackbones(p);
  return nam;
}

void CheckNotInProcessNam(const Pipeline& p) {
  if (p.nam.rfind("mem://", 0) == 0)
    Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: NAM URI '" + p.nam + "' is in-process memory (for "
                                        "tests): a run's steps are processes of their own and would not see each other's "
                                        "objects; use file://DIR or fabric://HOST:PORT, or leave \"nam\" out");
}

void CheckRanks(const Pipeline& p, const Machine& m) {
  for (const auto& [step, s] : p.steps) {
    if (!s.ranks_given || workflow::SingleWriter(step)) continue;
    const auto& mod = m.Module(s.module, "");
    if (s.ranks > mod.max_ranks)
      Throw(ErrorKind::kInvalidInput,
            fmt::format("pipeline {}: /steps/{}/ranks: {} ranks, but module {} of machine {} allows at most {} "
                        "(max_ranks in the machine file); ask for {} or fewer", p.name, workflow::StepName(step),
                        s.ranks, mod.name, m.name, mod.max_ranks, mod.max_ranks));
  }
}

std::string RunPipeline(const Pipeline& p, const Machine& m, const RunOptions& opt, RunObserver& obs) {
  if (!opt.make_launcher) CheckNotInProcessNam(p);  // a test's in-process launcher shares one process
  CheckRanks(p, m);
  std::string id = opt.run_id.empty() ? NewRunId(p.name) : opt.run_id;
  nam::ValidateObjectName(id);
  std::string dir = std::filesystem::absolute(opt.runs_dir + "/" + id).lexically_normal().string();
  if (record::HasJournal(dir))
    Throw(ErrorKind::kInvalidInput, "run directory " + dir + " already holds a run; continue it with `msaflow resume " +
                                        dir + "`, or choose another --run-id");
  const std::string nam = PreRunChecks(p, m, opt.runs_dir);
  // The run directory is made whole beside its final name, then renamed into place: a
  // coordinator killed in its first moments leaves no run without a journal.
  const std::string staging = std::filesystem::path(dir).parent_path().string() + "/." + id + ".starting";
  std::filesystem::remove_all(staging);
  MakeDirs(staging + "/tasks");
  MakeDirs(staging + "/logs");
  WriteFileAtomic(record::PipelinePath(staging), p.source.dump(2) + "\n");
  record::CoordinatorLock lock(staging);  // the lock is on the file, which the rename keeps
  JournalWriter staged = JournalWriter::Create(record::JournalPath(staging));
  staged.Event(record::EventKind::kRunStart,
               {{"run", id},
                {"pipeline", p.name},
                {"machine", m.name},
                {"machine_source", m.source},
                {"launcher", workflow::LauncherName(m.launcher)},
                {"coordinator", record::ThisCoordinator().ToJson()},
                {"nam", nam == "serve" ? std::string("a NAM server started for the run") : nam}});
  if (!PathExists(dir)) {
    if (::rename(staging.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      std::filesystem::remove_all(staging);
      errno = err;
      ThrowErrno("rename " + staging + " to " + dir);
    }
  } else {
    // `submit` made the directory (coordinator.sh, the submitted record): the staged files move in,
    // the journal last, so the run still appears at once.
    for (const char* f : {"tasks", "logs", record::kPipelineFile, "coordinator.lock", record::kJournalFile}) {
      const std::string from = staging + "/" + f, to = dir + "/" + f;
      if (::rename(from.c_str(), to.c_str()) != 0) ThrowErrno("rename " + from + " to " + to);
    }
    std::filesystem::remove_all(staging);
  }
  JournalWriter journal = JournalWriter::Append(record::JournalPath(dir));
  EarlyNam early_nam = StartSharedNamEarly(p, m, opt);
  Rung0 rung0 = RoundsPipeline(p, dir, journal, obs, 1);  // p itself but for strategy halving
  RunDriver(rung0, m, opt, obs, id, dir, std::move(journal), RunSummary{}, std::move(early_nam)).Drive();
  return dir;
}

bool ResumeRun(const std::string& run_dir_arg, const RunOptions& opt_in, RunObserver& obs) {
  const std::string dir = std::filesystem::absolute(run_dir_arg).lexically_normal().string();
  const std::string journal_path = record::JournalPath(dir);
  if (!PathExists(journal_path))
    Throw(ErrorKind::kNotFound, dir + ": no " + record::kJournalFile +
                                    " (not a run directory, or a run submitted to Slurm whose "
                                    "coordinator never started)");
  record::CoordinatorLock lock(dir);
  RunSummary before = record::Summarize(record::ReadJournal(journal_path), journal_path);
  if (before.finished) {
    obs.Line(fmt::format("run {} finished already: {}", before.run, before.finish));
    return false;
  }
  if (before.machine_source.empty())
    Throw(ErrorKind::kUnsupported, journal_path + ": the run-start event names no machine_source (a journal of an "
                                                  "older msaflow); start the pipeline again with `msaflow run`");
  json source = json::parse(ReadFile(record::PipelinePath(dir)), nullptr, false);
  if (source.is_discarded()) Throw(ErrorKind::kCorrupt, dir + "/pipeline.json: not JSON");
  const Pipeline p = workflow::PipelineFromSource(source);
  const Machine m = workflow::LoadMachine(before.machine_source);
  RunOptions opt = opt_in;
  opt.runs_dir = std::filesystem::path(dir).parent_path().string();
  PreRunChecks(p, m, opt.runs_dir);
  JournalWriter journal = JournalWriter::Append(journal_path);
  std::error_code gone;  // a cancel asked for before is answered
  std::filesystem::remove(dir + "/" + kCancelRequest, gone);
  json resumed = {{"coordinator", record::ThisCoordinator().ToJson()},
                  {"resume", before.resumes + 1},
                  {"was", before.cancelled ? "cancelled: " + before.error
                          : before.failed  ? "failed: " + before.error
                                           : "interrupted"},
                  {"tasks_done", before.tasks_done.size()},
                  {"rounds_ended", before.rounds_ended}};
  if (!opt.resume_reason.empty()) resumed["reason"] = opt.resume_reason;
  journal.Event(record::EventKind::kResume, resumed);
  obs.Line(fmt::format("resuming run {} ({}; {} task(s) done, {} round(s) ended)", before.run,
                       before.failed ? "it failed: " + Printable(before.error, 200) : "its coordinator died",
                       before.tasks_done.size(), before.rounds_ended));
  const std::string id = before.run;  // not read from `before` in the call that moves it
  // The decision read back, if it was made.
  EarlyNam early_nam = StartSharedNamEarly(p, m, opt);
  Rung0 rung0 = RoundsPipeline(p, dir, journal, obs, static_cast<int>(before.rounds_ended) + 1);
  RunDriver(rung0, m, opt, obs, id, dir, std::move(journal), std::move(before), std::move(early_nam)).Drive();
  return true;
}

std::string NamFor(const Pipeline& p, const Machine& m, const std::string& runs_dir) {
  if (p.nam.rfind("fabric://", 0) == 0) {
    try {
      nam::ParseFabricUri(p.nam);  // host, port (1..65535), options: refused now, not at the first step
    } catch (const Error& e) {
      Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: " + e.what());
    }
  }
  if (p.nam.rfind("file://", 0) == 0) {
    const std::string dir = p.nam.substr(7);
    std::error_code ec;
    if (dir.empty())
      Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: NAM URI 'file://' names no directory; expected file://DIR");
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
      Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: NAM URI '" + p.nam + "': " + dir +
                                          " is not a directory; expected file://DIR (made if missing)");
  }
  if (!p.nam.empty()) return p.nam;
  if (!m.nam.uri.empty()) return m.nam.uri;
  if (m.nam.serve) return "serve";
  return "file://" + std::filesystem::absolute(record::PersistedNamPath(runs_dir)).lexically_normal().string();
}

}  // namespace msaflow::orchestrator
