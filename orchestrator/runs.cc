#include "orchestrator/runs.h"

#include <fmt/core.h>
#include <signal.h>

#include <filesystem>

#include "common/child_process.h"
#include "common/error.h"
#include "common/files.h"
#include "nam/store.h"
#include "orchestrator/planner.h"
#include "record/coordinator_lock.h"
#include "record/journal.h"
#include "record/run_dir.h"
#include "workflow/candidates.h"

namespace msaflow::orchestrator {
namespace {

std::string Absolute(const std::string& path) { return std::filesystem::absolute(path).lexically_normal().string(); }

}  // namespace

Runs::Runs(RunsConfig config) : config_(std::move(config)) {}

RunOptions Runs::Options(const std::string& run_id) const {
  RunOptions o;
  o.runs_dir = config_.runs_dir;
  o.msaflow_exe = config_.msaflow_exe;
  o.run_id = run_id;
  o.run_here = config_.run_here;
  o.clock = config_.clock;
  o.make_launcher = config_.make_launcher;
  return o;
}

std::unique_ptr<launch::Launcher> Runs::LauncherFor(const Pipeline& p, const Machine& m, const std::string& run_id,
                                                    const std::string& run_dir) const {
  launch::LaunchContext ctx{run_id, run_dir, config_.msaflow_exe, config_.clock, nullptr};
  return config_.make_launcher ? config_.make_launcher(p, m, ctx) : launch::MakeLauncher(p, m, ctx);
}

bool Runs::PlanIsScript(const Pipeline& p, const Machine& m) const {
  return LauncherFor(p, m, "<run-id>", Absolute(config_.runs_dir) + "/<run-id>")->batch();
}

std::string Runs::Plan(const Pipeline& p, const Machine& m) const {
  auto launcher = LauncherFor(p, m, "<run-id>", Absolute(config_.runs_dir) + "/<run-id>");
  const std::string nam =
      launcher->PlanNam(NamFor(p, m, config_.runs_dir), Absolute(record::PersistedNamPath(config_.runs_dir)));
  const RoundPlan rp = PlanRound(p, m, "<run-id>", nam, 1, workflow::FirstRound(p), {});
  return launcher->PlanText(rp, nam, Absolute(config_.runs_dir));
}

std::string Runs::Start(const Pipeline& p, const Machine& m, const std::string& run_id, RunObserver& obs) const {
  return RunPipeline(p, m, Options(run_id), obs);
}

bool Runs::Resume(const std::string& run_dir, RunObserver& obs, const std::string& reason) const {
  RunOptions o = Options("");
  o.resume_reason = reason;
  o.runs_dir = std::filesystem::path(Absolute(run_dir)).parent_path().string();
  return ResumeRun(run_dir, o, obs);
}

SubmittedRun Runs::Submit(const Pipeline& p, const Machine& m, const std::string& pipeline_path,
                          const std::string& machine_arg, const std::string& run_id) const {
  SubmittedRun r;
  r.run_id = run_id.empty() ? NewRunId(p.name) : run_id;
  nam::ValidateObjectName(r.run_id);
  const std::string runs_abs = Absolute(config_.runs_dir);
  r.run_dir = runs_abs + "/" + r.run_id;
  auto launcher = LauncherFor(p, m, r.run_id, r.run_dir);
  launch::SubmitRequest req{std::filesystem::absolute(pipeline_path).string(),
                            machine_arg == "local" ? machine_arg : std::filesystem::absolute(machine_arg).string(),
                            runs_abs};
  if (!launcher->batch()) launcher->Submit(req);  // refuses, saying why
  if (record::HasJournal(r.run_dir) || record::WasSubmitted(r.run_dir))
    Throw(ErrorKind::kInvalidInput, "run directory " + r.run_dir + " already holds a run; choose another --run-id");
  MakeDirs(r.run_dir);
  const launch::Submitted s = launcher->Submit(req);
  r.job = s.job;
  r.where = s.where;
  // The record of it, which `status`, `cancel` and the service read until the coordinator begins.
  record::WriteSubmitted(r.run_dir, launch::SubmittedCoordinator{r.run_id, s.job, m.slurm.conf});
  return r;
}

std::string Runs::SubmittedEnd(const Pipeline& p, const Machine& m, const std::string& job) const {
  return LauncherFor(p, m, "", "")->SubmittedJobEnd(job);
}

ChildProcess Runs::StartCoordinator(const CoordinatorStart& c, const SpawnOptions& o) const {
  if (config_.msaflow_exe.empty()) Throw(ErrorKind::kInternal, "Runs::StartCoordinator: no msaflow binary");
  std::vector<std::string> argv{config_.msaflow_exe};
  switch (c.kind) {
    case CoordinatorStart::Kind::kResume:
      argv.insert(argv.end(), {"resume", run_dir(c.run_id)});
      if (!c.reason.empty()) argv.insert(argv.end(), {"--reason", c.reason});
      break;
    case CoordinatorStart::Kind::kRun:
    case CoordinatorStart::Kind::kSubmit:
      argv.insert(argv.end(), {c.kind == CoordinatorStart::Kind::kRun ? "run" : "submit", c.pipeline_path, "--machine",
                               c.machine_arg, "--runs", config_.runs_dir, "--run-id", c.run_id});
      break;
  }
  return ChildProcess::Start(argv, o);
}

void Runs::RequestCancel(const std::string& run_dir, const std::string& by) {
  // The coordinator reads this when the signal ends its run: the journal says cancelled, and by whom.
  const std::string dir = Absolute(run_dir);
  MakeDirs(dir);
  WriteFileAtomic(dir + "/" + kCancelRequest, nlohmann::json{{"by", by}, {"time", record::JournalTime()}}.dump() + "\n");
}

std::string Runs::Cancel(const std::string& run_dir, const std::string& by) const {
  const std::string dir = Absolute(run_dir);
  const bool submitted = record::WasSubmitted(dir);
  if (!record::HasJournal(dir) && !submitted)
    Throw(ErrorKind::kNotFound,
          dir + ": no " + record::kJournalFile + " (not a run directory, or its coordinator never started)");
  const pid_t holder = record::CoordinatorHolding(dir);
  const bool ended = record::HasJournal(dir) && [&] {
    const auto s = record::Summarize(record::ReadJournal(record::JournalPath(dir)), record::JournalPath(dir));
    return s.finished || s.failed;
  }();
  if (holder <= 0 && (!submitted || ended))
    Throw(ErrorKind::kInvalidInput, "run " + dir + " has no live coordinator on this host to stop (see `msaflow status " +
                                        dir + "`)");
  RequestCancel(dir, by);
  if (holder > 0) {
    if (::kill(holder, SIGTERM) != 0) ThrowErrno(fmt::format("kill -TERM {} (the coordinator of {})", holder, dir));
    return fmt::format("asked the coordinator of {} (pid {}) to stop; it ends the run's tasks and jobs", dir, holder);
  }
  // A submitted coordinator on another node (or still waiting in the batch system's queue): the
  // batch system sends it SIGTERM, and it cancels the round's jobs as it ends.
  const launch::SubmittedCoordinator job = record::ReadSubmittedCoordinator(dir);
  try {
    job.Cancel();
  } catch (const Error& e) {
    Throw(e.kind(), fmt::format("{} (the coordinator job of {})", e.what(), dir));
  }
  return fmt::format("cancelled the coordinator job {} of {}; it ends the run's jobs as it stops", job.job, dir);
}

record::JournalFollower Runs::Observe(const std::string& run_dir) const {
  return record::JournalFollower(record::JournalPath(Absolute(run_dir)));
}

}  // namespace msaflow::orchestrator
