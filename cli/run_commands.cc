// The commands on pipelines and runs: validate, plan, run, scaling, submit, status, report, why, resume,
// cancel. Each parses nothing itself (cli/main.cc binds the options) and prints; the work is the
// run library's (orchestrator/runs.h).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/cli.h"
#include "common/files.h"
#include "common/signals.h"
#include "launch/launcher.h"
#include "modules/steps.h"
#include "nam/fabric.h"
#include "orchestrator/fpga_preflight.h"
#include "orchestrator/halving.h"
#include "orchestrator/placement.h"
#include "orchestrator/planner.h"
#include "orchestrator/runs.h"
#include "orchestrator/scaling.h"
#include "orchestrator/validate.h"
#include "record/journal.h"
#include "record/run_dir.h"
#include "record/status.h"
#include "record/why.h"
#include "report/progress.h"
#include "report/progress_bar.h"
#include "report/report.h"
#include "simulate/simulate.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/machine.h"

namespace msaflow::cli {
namespace {

// A coordinator's stop signals (Ctrl-C, scancel, the service's cancel) end what it started and
// are journalled: handled once libfabric is loaded (nam/fabric.h says why). Where it cannot be
// loaded, the run's first fabric call says so, as it would have.
void HandleStopSignals() {
  try {
    nam::fabric::LoadLibrary();
  } catch (const Error&) {
  }
  InstallInterruptHandlers();
}

// The run library as this process's commands use it: the runs directory, and this binary for
// tasks and NAM servers.
orchestrator::Runs RunsOf(const Options& o) {
  orchestrator::RunsConfig c;
  c.runs_dir = o.runs_dir;
  c.msaflow_exe = SelfExe();
  c.run_here = modules::RunStepInCoordinator;
  return orchestrator::Runs(std::move(c));
}

workflow::Machine MachineOf(const Options& o, const workflow::Pipeline& p) {
  workflow::Machine m = workflow::LoadMachine(o.machine_override.empty() ? p.machine : o.machine_override);
  if (!o.launcher_override.empty() && !workflow::ParseLauncherKind(o.launcher_override, &m.launcher))
    Throw(ErrorKind::kInvalidInput, "--launcher: '" + o.launcher_override + "' is not a launcher (expected local or slurm)");
  return m;
}

}  // namespace

int Validate(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  if (o.structure_only) {
    std::printf("%s: valid structure (%zu backbones, up to %lld rounds of %lld candidates; machine, datasets and "
                "models not checked)\n",
                o.pipeline_path.c_str(), p.backbones.size(), static_cast<long long>(p.rounds.max),
                static_cast<long long>(p.rounds.candidates));
    return 0;
  }
  const workflow::Machine m = workflow::LoadMachine(p.machine);
  const auto lines = orchestrator::CheckPipeline(p, m, o.pipeline_path, o.runs_dir);
  std::printf("%s: valid (%zu backbones, up to %lld rounds of %lld candidates, machine %s)\n", o.pipeline_path.c_str(),
              p.backbones.size(), static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
              m.name.c_str());
  for (const auto& line : lines) std::printf("  %s\n", line.c_str());
  return 0;
}

namespace {

// "KEY=N" items of an option into a map; throws kInvalidInput naming the option.
std::map<std::string, int64_t> KeyCounts(const std::vector<std::string>& items, const std::string& option) {
  std::map<std::string, int64_t> out;
  for (const auto& item : items) {
    const size_t eq = item.find('=');
    char* end = nullptr;
    const long long n = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq == 0 || !end || *end || end == item.c_str() + eq + 1 || n < 1)
      Throw(ErrorKind::kInvalidInput, option + " " + item + ": expected NAME=N with N a whole number of at least 1");
    out[item.substr(0, eq)] = n;
  }
  return out;
}

}  // namespace

int Simulate(Options& o) {
  simulate::RequireSimGrid("msaflow simulate");
  const workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  const workflow::Machine m = MachineOf(o, p);
  for (const auto& [name, n] : KeyCounts(o.sim_ranks, "--ranks")) {
    const std::optional<workflow::Step> step = workflow::StepFromName(name);
    if (!step)
      Throw(ErrorKind::kInvalidInput, "--ranks " + name + "=" + std::to_string(n) +
                                          ": not a step (load, prepare, train, store, evaluate, select)");
    o.sim.ranks[*step] = n;
  }
  o.sim.nodes = KeyCounts(o.sim_nodes, "--nodes");
  const simulate::Calibration c = simulate::Calibrate(o.sim_from, p, m.slurm.nodes_share_cores);
  const simulate::Result r = simulate::Simulate(p, m, c, o.sim);
  if (o.as_json) {
    nlohmann::json j = simulate::ToJson(r);
    j["pipeline"] = p.name;
    j["machine"] = m.name;
    j["calibration"] = {{"runs", c.runs},
                        {"launcher", c.launcher},
                        {"queue_wait_s", c.queue_wait_s},
                        {"job_overhead_s", c.job_overhead_s},
                        {"chain_wait_s", c.chain_wait_s},
                        {"measured_round_s", c.measured_round_s}};
    // Each round's step models as calibrated: what the simulation charges per item and per
    // step (a fine-tuning round's train: its work per update and the gradient bytes a sync
    // update moves, the head's and the tail's).
    nlohmann::json rounds = nlohmann::json::array();
    for (const auto& steps : c.rounds) {
      nlohmann::json r = nlohmann::json::object();
      for (const auto& [step, s] : steps)
        r[workflow::StepName(step)] = {{"ranks", s.ranks},
                                       {"items", s.items},
                                       {"per_item_s", s.per_item_s},
                                       {"fixed_core_s", s.fixed_core_s},
                                       {"model_bytes", s.model_bytes},
                                       {"finetunes", s.finetunes}};
      rounds.push_back(std::move(r));
    }
    j["calibration"]["rounds"] = std::move(rounds);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s on %s, calibrated by %zu run(s) (latest %s)\n", p.name.c_str(), m.name.c_str(), c.runs.size(),
              c.runs.back().c_str());
  if (workflow::LauncherKind k; workflow::ParseLauncherKind(c.launcher, &k) && !workflow::OnThisHost(k)) {
    std::printf("Slurm, as measured: %.2f s in the queue and %.2f s more per job (its start and end, srun between "
                "steps)",
                c.queue_wait_s, c.job_overhead_s);
    if (c.chain_wait_s >= 0) std::printf("; chained, %.2f s from one job's step to the next's", c.chain_wait_s);
    std::printf("\n");
  }
  std::printf("%s", simulate::Table(r).c_str());
  return 0;
}

int Rank(Options& o) {
  const workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  const workflow::Machine m = MachineOf(o, p);
  orchestrator::CheckPipeline(p, m, o.pipeline_path, o.runs_dir);  // what run would refuse, refused here
  const ranking::Ranking r = ranking::RankBackbones(p, o.rank, [&](const std::string& line) {
    if (!o.as_json) std::fprintf(stderr, "%s\n", line.c_str());
  });
  if (o.as_json) {
    nlohmann::json j = {{"pipeline", p.name}, {"train_images", r.train_images}, {"subset_images", r.subset_images},
                        {"classes", r.classes}, {"fraction", o.rank.fraction}, {"min_per_class", o.rank.min_per_class},
                        {"seed", o.rank.seed}, {"subset_rows", r.rows}, {"backbones", nlohmann::json::array()}};
    for (const auto& b : r.backbones)
      j["backbones"].push_back({{"backbone", b.backbone}, {"knn", b.knn}, {"logme", b.logme}, {"dim", b.dim},
                                {"features_s", b.features_s}, {"estimate_s", b.estimate_s}, {"note", b.note}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %lld backbones on %lld of %lld training images (%g%% of each class, at least %lld), %lld classes\n",
              p.name.c_str(), static_cast<long long>(r.backbones.size()), static_cast<long long>(r.subset_images),
              static_cast<long long>(r.train_images), 100 * o.rank.fraction, static_cast<long long>(o.rank.min_per_class),
              static_cast<long long>(r.classes));
  size_t w = 8;
  for (const auto& b : r.backbones) w = std::max(w, b.backbone.size());
  std::printf("  %-*s  %5s  %8s  %8s  %9s\n", static_cast<int>(w), "backbone", "kNN", "LogME", "features", "seconds");
  for (const auto& b : r.backbones)
    std::printf("  %-*s  %5.3f  %8.4f  %8lld  %9.2f%s\n", static_cast<int>(w), b.backbone.c_str(), b.knn, b.logme,
                static_cast<long long>(b.dim), b.features_s + b.estimate_s, b.note.empty() ? "" : ("  (" + b.note + ")").c_str());
  std::printf("kNN: leave-one-out accuracy of the 5 nearest (standardised features); LogME: evidence per image "
              "(higher is better; comparable between backbones on this data only)\n");
  return 0;
}

// Ranks per step as the simulator's model favours them, calibrated on the earlier runs of `p`
// under `runs_dir` (no simulation is run: the model's uncontended time per rank count); every
// divisible step on its limit when there is no such run.
orchestrator::Placement PlaceByModel(const workflow::Pipeline& p, const workflow::Machine& m,
                                     const std::string& runs_dir) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (!simulate::HaveSimGrid()) {  // a build without SimGrid (meson option `simulate`): say so, place by cores
    orchestrator::Placement pl = orchestrator::PlaceWithoutCosts(p, m, cores);
    pl.source = "no model: this msaflow was built without SimGrid (libsimgrid-dev), so none of the earlier runs";
    return pl;
  }
  simulate::Calibration cal;
  try {
    cal = simulate::Calibrate(runs_dir, p, m.slurm.nodes_share_cores);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kNotFound) throw;
    return orchestrator::PlaceWithoutCosts(p, m, cores);
  }
  const std::string source =
      cal.runs.size() == 1
          ? "run " + cal.runs.front() + ", through the simulator's model (docs/simulate.md)"
          : fmt::format("{} runs under {}, through the simulator's model (docs/simulate.md)", cal.runs.size(), runs_dir);
  return orchestrator::PlaceFromModel(p, m, simulate::FavouredRanks(p, m, cal, {}), source, cores);
}

int PlanOrRun(Options& o, bool plan) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  const workflow::Machine m = MachineOf(o, p);
  const orchestrator::Runs runs = RunsOf(o);
  const std::string comment = plan && runs.PlanIsScript(p, m) ? "# " : "";
  if (o.ranks_choice == "auto") {
    // A user who knows nothing of parallel computing: ranks from the simulator's model,
    // calibrated on what the earlier runs of this pipeline measured (docs/simulate.md).
    const orchestrator::Placement pl = PlaceByModel(p, m, o.runs_dir);
    std::printf("%sranks from measured costs: %s\n", comment.c_str(), pl.source.c_str());
    for (const auto& line : pl.why) std::printf("%s  %s\n", comment.c_str(), line.c_str());
    p = orchestrator::ApplyPlacement(std::move(p), pl);
  }
  if (plan) {
    if (p.rounds.strategy == workflow::Strategy::kHalving)  // rung 0 decides round 1's backbones when the run starts
      std::printf("%shalving: rung 0 keeps %lld of these %zu backbones when the run starts (`msaflow rank` shows "
                  "which); round 1 below is drawn over all of them\n",
                  comment.c_str(), static_cast<long long>((p.backbones.size() + p.rounds.eta - 1) / p.rounds.eta),
                  p.backbones.size());
    std::printf("%s", runs.Plan(p, m).c_str());
    for (const auto& line : orchestrator::FinetuneLines(p, m)) std::printf("%s%s\n", comment.c_str(), line.c_str());
    return 0;
  }
  // What validate checks, in its order: a run stops where validate would, with the same line.
  orchestrator::CheckPipeline(p, m, o.pipeline_path, o.runs_dir);
  HandleStopSignals();  // Ctrl-C / scancel of the coordinator: end what it started
  report::ProgressPrinter progress(stdout);
  runs.Start(p, m, o.run_id, progress);
  return 0;
}

int Scaling(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  const workflow::Machine m = workflow::LoadMachine(o.machine_override.empty() ? p.machine : o.machine_override);
  if (!m.OnThisHost())
    Throw(ErrorKind::kUnsupported, "scaling: machine '" + m.name + "' has launcher '" +
                                       workflow::LauncherName(m.launcher) +
                                       "'; scaling studies run on the local launcher");
  o.scaling_opt.ranks.clear();
  for (const auto& r : SplitList(o.scaling_ranks, "--ranks")) {
    char* end = nullptr;
    long long v = std::strtoll(r.c_str(), &end, 10);
    if (!end || *end || v < 1 || v > 4096)
      Throw(ErrorKind::kInvalidInput, "scaling: --ranks: \"" + r + "\" is not a rank count in 1..4096");
    o.scaling_opt.ranks.push_back(v);
  }
  o.scaling_opt.steps.clear();
  for (const auto& name : SplitList(o.scaling_steps, "--steps")) {
    const std::optional<workflow::Step> step = workflow::StepFromName(name);  // a step that does not divide:
    if (!step)                                                                // RunScaling says the same
      Throw(ErrorKind::kInvalidInput, "scaling: --steps: \"" + name + "\" is not one of prepare, train, evaluate");
    o.scaling_opt.steps.push_back(*step);
  }
  if (!o.scaling_modes.empty()) o.scaling_opt.modes = SplitList(o.scaling_modes, "--modes");
  o.scaling_opt.runs_dir = o.runs_dir;
  o.scaling_opt.msaflow_exe = SelfExe();
  o.scaling_opt.observe = [](std::FILE* log) { return std::make_unique<report::ProgressPrinter>(log); };
  HandleStopSignals();
  orchestrator::RunScaling(p, m, o.scaling_opt, stdout);
  return 0;
}

int Submit(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  const std::string machine_arg = o.machine_override.empty() ? p.machine : o.machine_override;
  const workflow::Machine m = workflow::LoadMachine(machine_arg);
  const orchestrator::Runs runs = RunsOf(o);
  const orchestrator::SubmittedRun sub = runs.Submit(p, m, o.pipeline_path, machine_arg, o.run_id);
  const std::string& rd = sub.run_dir;
  const std::string& job = sub.job;
  std::printf("run %s submitted as Slurm job %s (its coordinator runs on %s)\n  follow it: msaflow status %s\n",
              sub.run_id.c_str(), job.c_str(), sub.where.c_str(), rd.c_str());
  std::fflush(stdout);
  if (!o.wait) return 0;
  // Ctrl-C stops the following, not the run: the coordinator is a Slurm job of its own. Say so,
  // and how to stop it, instead of leaving the user to guess whether it died with us.
  InstallInterruptHandlers();
  record::JournalFollower journal = runs.Observe(rd);
  std::string end;
  report::ProgressBar bar(stdout);  // on a terminal; plain lines otherwise
  int round = 0;
  for (;;) {
    if (const int sig = InterruptSignal()) {
      bar.Clear();
      std::printf("stopped following run %s (signal %d); it goes on as Slurm job %s\n  follow it: msaflow status %s\n"
                  "  stop it:   msaflow cancel %s\n",
                  sub.run_id.c_str(), sig, job.c_str(), rd.c_str(), rd.c_str());
      std::fflush(stdout);
      return 128 + sig;
    }
    // Progress: the run's journal as it grows (a line being written is read next time).
    for (const record::JournalEvent& e : journal.Next()) {
      const auto& f = e.fields;
      if (e.kind == record::EventKind::kRoundStart) {
        round = f.value("round", 0);
        bar.Round(round, p.rounds.max, f.value("tasks", size_t{0}), f.value("reused_tasks", size_t{0}));
      }
      if (e.kind == record::EventKind::kTaskStart) {
        bar.Print(fmt::format("  {} started on {}", f.value("task", ""), f.value("module", "")));
        bar.Start(f.value("task", "") + " on " + f.value("module", ""));
      }
      if (e.kind == record::EventKind::kTaskEnd) bar.Done();
      if (e.kind == record::EventKind::kSlurmJob)
        bar.Print(
            fmt::format("  round {}: Slurm {} job {}", f.value("round", 0), f.value("mode", ""), f.value("job", "")));
      if (e.kind == record::EventKind::kRoundEnd)
        bar.Print(fmt::format("  round {}: champion {} accuracy {:.4f}", f.value("round", 0), f.value("champion", ""),
                              f.value("accuracy", 0.0)));
      if (e.kind == record::EventKind::kSlurmRetry || e.kind == record::EventKind::kTaskRetry)
        bar.Print("  retry: " + f.value("message", ""));
    }
    std::fflush(stdout);
    bar.Tick();
    try {
      end = runs.SubmittedEnd(p, m, job);
    } catch (const Error&) {
      if (InterruptSignal()) continue;  // squeue got the terminal's Ctrl-C too
      throw;
    }
    if (!end.empty()) break;
    SystemClock().SleepSeconds(0.5);  // Ctrl-C ends the wait at once
  }
  bar.Clear();
  std::printf("coordinator job %s ended %s\n", job.c_str(), launch::DescribeState(end).c_str());
  record::PrintStatus(rd, stdout);
  return end == "COMPLETED" ? 0 : 1;
}

int Status(Options& o) {
  switch (record::PrintStatus(o.run_dir, stdout)) {
    case record::RunState::kFinished: return 0;
    case record::RunState::kRunning: return 75;  // EX_TEMPFAIL: ask again later
    case record::RunState::kCancelled:
    default: return 1;
  }
}

int Report(Options& o) {
  std::printf("%s\n", report::WriteReport(o.run_dir, o.out_file).c_str());
  return 0;
}

int Why(Options& o) {
  // A backbone of a halving run: what rung 0 decided for it, and on what figures.
  if (const nlohmann::json rung0 = orchestrator::ReadRung0(o.run_dir); !rung0.is_null())
    for (const auto& b : rung0["backbones"])
      if (b.value("backbone", "") == o.why_task) {
        std::printf("%s in run %s: %s (kNN %.3f, LogME %.4f on %lld training images, rounds.rank_by %s)\n",
                    o.why_task.c_str(), std::filesystem::path(o.run_dir).filename().c_str(), b.value("why", "").c_str(),
                    b.value("knn", 0.0), b.value("logme", 0.0), static_cast<long long>(rung0.value("subset_images", 0)),
                    rung0.value("rank_by", "").c_str());
        for (const auto& line : orchestrator::HalvingRaceStory(o.run_dir, o.why_task)) std::printf("  %s\n", line.c_str());
        return 0;
      }
  record::ExplainTask(o.run_dir, o.why_task, stdout);
  return 0;
}

int Resume(Options& o) {
  HandleStopSignals();
  report::ProgressPrinter progress(stdout);
  RunsOf(o).Resume(o.run_dir, progress, o.resume_reason);
  return 0;
}

int Cancel(Options& o) {
  const char* user = std::getenv("USER");
  std::printf("%s\n", RunsOf(o).Cancel(o.run_dir, std::string("msaflow cancel (user ") + (user ? user : "?") + ")").c_str());
  return 0;
}

}  // namespace msaflow::cli
