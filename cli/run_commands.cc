// The commands on pipelines and runs: validate, plan, run, scaling, submit, status, report, why, resume.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/cli.h"
#include "common/files.h"
#include "modules/steps.h"
#include "orchestrator/fpga_preflight.h"
#include "orchestrator/journal.h"
#include "orchestrator/launcher.h"
#include "orchestrator/machine.h"
#include "orchestrator/placement.h"
#include "orchestrator/planner.h"
#include "orchestrator/run.h"
#include "orchestrator/scaling.h"
#include "orchestrator/slurm.h"
#include "orchestrator/progress_bar.h"
#include "orchestrator/report.h"
#include "orchestrator/status.h"
#include "orchestrator/why.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"

namespace msaflow::cli {

int Validate(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  orchestrator::Machine m = orchestrator::LoadMachine(p.machine);
  for (const auto& s : workflow::StepNames()) m.Module(p.steps.at(s).module, o.pipeline_path + ": /steps/" + s + "/module");
  for (const auto& b : p.backbones)
    if (b.kind == "onnx" && !PathExists(b.onnx))
      Throw(ErrorKind::kNotFound, o.pipeline_path + ": /backbones: " + b.onnx + ": no such file");
  workflow::CheckDatasetFiles(p, o.pipeline_path);  // without reading them
  workflow::CheckBackbones(p);                    // the models' operators, feature layers and inputs
  orchestrator::NamFor(p, m, o.runs_dir);  // the NAM URI as a run would use it
  orchestrator::FpgaPreflight(p, m);     // fpga "opencl" needs an OpenCL device here (launcher local)
  // The train layout against the machine (ranks + servers within the module's max_ranks).
  const auto& train = p.steps.at("train");
  auto layout = orchestrator::ResolveTrainLayout(p, train, m.Module(train.module, "/steps/train/module"),
                                                 static_cast<size_t>(p.rounds.candidates));
  std::printf("%s: valid (%zu backbones, up to %lld rounds of %lld candidates, machine %s)\n", o.pipeline_path.c_str(),
              p.backbones.size(), static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
              m.name.c_str());
  std::printf("  train: mode %s on %lld rank%s%s\n", layout.mode.c_str(), static_cast<long long>(layout.ranks),
              layout.ranks > 1 ? "s" : "",
              layout.servers ? fmt::format(" + {} parameter server(s)", layout.servers).c_str() : "");
  for (const char* st : {"prepare", "select"}) {
    const auto& mod = m.Module(p.steps.at(st).module, "");
    std::printf("  %s: fpga \"%s\" on module %s\n", st, orchestrator::FpgaFor(p, mod).backend.c_str(), mod.name.c_str());
  }
  return 0;
}

int PlanOrRun(Options& o, bool plan) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  orchestrator::Machine m = orchestrator::LoadMachine(o.machine_override.empty() ? p.machine : o.machine_override);
  orchestrator::LocalLauncher launcher(SelfExe());
  if (!o.launcher_override.empty()) m.launcher = o.launcher_override;
  if (o.ranks_choice == "auto") {
    // A user who knows nothing of parallel computing: ranks from what the last run measured.
    const unsigned cores = std::thread::hardware_concurrency();
    const std::string last = orchestrator::LastResults(o.runs_dir, p.name);
    orchestrator::Placement pl;
    if (last.empty()) {
      pl = orchestrator::PlaceWithoutCosts(p, m, cores);
    } else {
      nlohmann::json results = nlohmann::json::parse(ReadFile(last), nullptr, false);
      if (results.is_discarded()) Throw(ErrorKind::kCorrupt, last + ": not JSON");
      pl = orchestrator::PlaceFromCosts(p, m, results, last, cores);
    }
    std::printf("%sranks from measured costs: %s\n", m.launcher == "slurm" && plan ? "# " : "", pl.source.c_str());
    for (const auto& line : pl.why) std::printf("%s  %s\n", m.launcher == "slurm" && plan ? "# " : "", line.c_str());
    p = orchestrator::ApplyPlacement(std::move(p), pl);
  }
  if (plan && m.launcher == "slurm") {
    std::string nam = orchestrator::NamFor(p, m, o.runs_dir);
    if (nam == "serve") {
      nam = "fabric://<NAM server started for the run>";
      if (!m.nam.module.empty())
        std::printf("# NAM server: srun msaflow nam serve on module %s (partition %s), a job of its own under "
                    "`msaflow run`, a component of the coordinator's job under `msaflow submit`\n",
                    m.nam.module.c_str(), m.Module(m.nam.module, "nam").partition.c_str());
      else
        std::printf("# NAM server: msaflow nam serve, started by the coordinator where it runs\n");
    }
    std::string runs_abs = std::filesystem::absolute(o.runs_dir).lexically_normal().string();
    std::string rd = runs_abs + "/<run-id>";
    auto rp = orchestrator::PlanRound(p, m, "<run-id>", nam, 1, workflow::FirstRound(p), {});
    std::map<std::string, std::string> files;
    for (const auto& t : rp.tasks) files[t.id] = rd + "/tasks/" + t.id + ".json";
    orchestrator::SlurmScriptParams sp{"<run-id>", rd, rd + "/logs", rd + "/slurm/round-1.0.progress", SelfExe(), 1};
    if (m.slurm.mode == "chained") {
      for (const auto& t : rp.tasks) {
        std::printf("# --- job for %s%s\n", t.id.c_str(),
                    t.after.empty() ? "" : " (sbatch --dependency=afterok:<previous> --kill-on-invalid-dep=yes)");
        std::printf("%s", orchestrator::ChainedScript(t, m, files, sp).c_str());
      }
    } else if (m.slurm.mode == "single") {
      std::printf("%s", orchestrator::SingleScript(rp.tasks, m, files, sp).c_str());
    } else {
      std::printf("%s", orchestrator::HetjobScript(rp.tasks, m, files, sp).c_str());
    }
    return 0;
  }
  if (plan) {
    std::string nam = orchestrator::NamFor(p, m, o.runs_dir);
    if (nam == "serve")
      nam = "fabric://<started for the run: " + m.nam.provider + " on " + m.nam.listen + ", " + m.nam.capacity +
            ", persisting to " + std::filesystem::absolute(o.runs_dir + "/nam").lexically_normal().string() + ">";
    auto rp = orchestrator::PlanRound(p, m, "<run-id>", nam, 1, workflow::FirstRound(p), {});
    std::printf("plan for %s on machine %s (launcher %s), NAM %s\n", p.name.c_str(), m.name.c_str(),
                m.launcher.c_str(), nam.c_str());
    std::printf("round 1 of up to %lld; later rounds: %lld candidates by strategy '%s', top %lld kept\n",
                static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
                p.rounds.strategy.c_str(), static_cast<long long>(p.rounds.top_k));
    for (const auto& t : rp.tasks) {
      std::printf("  %-12s module %-3s ranks %lld%s\n", t.id.c_str(), t.module.c_str(), static_cast<long long>(t.ranks),
                  t.after.empty() ? "" : ("  after " + t.after[0]).c_str());
      auto cmd = launcher.Command(t, "runs/<run-id>/tasks/" + t.id + ".json");
      std::string line;
      for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
      std::printf("      %s%s\n", t.ranks > 1 ? fmt::format("{} x ", t.ranks).c_str() : "", line.c_str());
    }
    std::printf("candidates of round 1:\n");
    for (const auto& c : workflow::FirstRound(p))
      std::printf("  %-8s %-12s %s seed %llu\n", c.id.c_str(), c.backbone.c_str(),
                  workflow::HeadLabel(c.head).c_str(), static_cast<unsigned long long>(c.head.seed));
    return 0;
  }
  orchestrator::RunOptions opt;
  opt.runs_dir = o.runs_dir;
  opt.run_id = o.run_id;
  opt.msaflow_exe = SelfExe();
  opt.run_settled = modules::RunStepIfSettled;
  orchestrator::InstallInterruptHandlers();  // Ctrl-C / scancel of the coordinator: end what it started
  orchestrator::RunPipeline(p, m, opt, stdout);
  return 0;
}

int Scaling(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  orchestrator::Machine m = orchestrator::LoadMachine(o.machine_override.empty() ? p.machine : o.machine_override);
  if (m.launcher != "local")
    Throw(ErrorKind::kUnsupported, "scaling: machine '" + m.name + "' has launcher '" + m.launcher +
                                       "'; scaling studies run on the local launcher");
  o.scaling_opt.ranks.clear();
  for (const auto& r : SplitList(o.scaling_ranks, "--ranks")) {
    char* end = nullptr;
    long long v = std::strtoll(r.c_str(), &end, 10);
    if (!end || *end || v < 1 || v > 4096)
      Throw(ErrorKind::kInvalidInput, "scaling: --ranks: \"" + r + "\" is not a rank count in 1..4096");
    o.scaling_opt.ranks.push_back(v);
  }
  o.scaling_opt.steps = SplitList(o.scaling_steps, "--steps");
  if (!o.scaling_modes.empty()) o.scaling_opt.modes = SplitList(o.scaling_modes, "--modes");
  o.scaling_opt.runs_dir = o.runs_dir;
  o.scaling_opt.msaflow_exe = SelfExe();
  orchestrator::InstallInterruptHandlers();
  orchestrator::RunScaling(p, m, o.scaling_opt, stdout);
  return 0;
}

int Submit(Options& o) {
  workflow::Pipeline p = workflow::LoadPipeline(o.pipeline_path);
  std::string machine_arg = o.machine_override.empty() ? p.machine : o.machine_override;
  orchestrator::Machine m = orchestrator::LoadMachine(machine_arg);
  if (m.launcher != "slurm")
    Throw(ErrorKind::kInvalidInput, "submit: machine '" + m.name + "' has launcher '" + m.launcher +
                                        "'; submit needs a Slurm machine file (configs/machines/slurm-local.json) "
                                        "or use `msaflow run`");
  std::string id = o.run_id.empty() ? orchestrator::NewRunId(p.name) : o.run_id;
  nam::ValidateObjectName(id);
  std::string runs_abs = std::filesystem::absolute(o.runs_dir).lexically_normal().string();
  std::string rd = runs_abs + "/" + id;
  if (PathExists(rd + "/journal.jsonl") || PathExists(rd + "/submitted.json"))
    Throw(ErrorKind::kInvalidInput, "run directory " + rd + " already holds a run; choose another --run-id");
  MakeDirs(rd);
  const auto& cm = m.Module("cm", "submit: the coordinator");
  std::string machine_abs = machine_arg == "local" ? machine_arg : std::filesystem::absolute(machine_arg).string();
  // With a NAM module, the NAM server is component 1 of the coordinator's job: it lives
  // exactly as long as the run.
  bool nam_component = p.nam.empty() && m.nam.uri.empty() && m.nam.serve && !m.nam.module.empty();
  std::string nam_part;
  if (nam_component) {
    const auto& nm = m.Module(m.nam.module, "submit: the NAM server");
    nam_part = "#SBATCH hetjob\n#SBATCH --partition=" + nm.partition + " --nodes=1 --ntasks=1 --time=" + nm.time +
               (nm.constraint.empty() ? "" : " --constraint=" + nm.constraint) +
               "\n# component 1: the run's NAM server (module " + m.nam.module + ")\nexport MSAFLOW_NAM_HET_GROUP=1\n";
  }
  std::string script = "#!/bin/bash\n#SBATCH --job-name=msaflow-" + id + "\n#SBATCH --output=" + rd +
                       "/coordinator.out\n#SBATCH --partition=" + cm.partition +
                       " --nodes=1 --ntasks=1 --time=" + cm.time + "\n" + nam_part + "# the coordinator of run " + id +
                       ": it submits one job per round\nexec " + orchestrator::ShellQuote(SelfExe()) + " run " +
                       orchestrator::ShellQuote(std::filesystem::absolute(o.pipeline_path).string()) + " --runs " +
                       orchestrator::ShellQuote(runs_abs) + " --run-id " + id + " --machine " +
                       orchestrator::ShellQuote(machine_abs) + "\n";
  WriteFileAtomic(rd + "/coordinator.sh", script);
  orchestrator::SlurmCli cli(m.slurm.conf);
  std::string job = cli.Submit(rd + "/coordinator.sh", {});
  WriteFileAtomic(rd + "/submitted.json",
                  nlohmann::json{{"run", id}, {"job", job}, {"slurm_conf", m.slurm.conf}}.dump() + "\n");
  std::printf("run %s submitted as Slurm job %s (its coordinator runs on %s)\n  follow it: msaflow status %s\n",
              id.c_str(), job.c_str(), cm.partition.c_str(), rd.c_str());
  std::fflush(stdout);
  if (!o.wait) return 0;
  size_t shown = 0;
  std::string end;
  orchestrator::ProgressBar bar(stdout);  // on a terminal; plain lines otherwise
  int round = 0;
  for (;;) {
    // Progress: the run's journal as it grows (a line being written is read next time).
    if (PathExists(rd + "/journal.jsonl")) {
      const auto journal = orchestrator::ReadJournal(rd + "/journal.jsonl");
      for (; shown < journal.events.size(); ++shown) {
        const auto& e = journal.events[shown];
        const auto& f = e.fields;
        if (e.event == "round-start") {
          round = f.value("round", 0);
          bar.Round(round, p.rounds.max, f.value("tasks", size_t{0}), f.value("reused_tasks", size_t{0}));
        }
        if (e.event == "task-start") {
          bar.Print(fmt::format("  {} started on {}", f.value("task", ""), f.value("module", "")));
          bar.Start(f.value("task", "") + " on " + f.value("module", ""));
        }
        if (e.event == "task-end") bar.Done();
        if (e.event == "slurm-job")
          bar.Print(fmt::format("  round {}: Slurm {} job {}", f.value("round", 0), f.value("mode", ""), f.value("job", "")));
        if (e.event == "round-end")
          bar.Print(fmt::format("  round {}: champion {} accuracy {:.4f}", f.value("round", 0), f.value("champion", ""),
                                f.value("accuracy", 0.0)));
        if (e.event == "slurm-retry" || e.event == "task-retry") bar.Print("  retry: " + f.value("message", ""));
      }
      std::fflush(stdout);
    }
    bar.Tick();
    auto comps = orchestrator::ParseShowJob(cli.Show(job));
    end = comps.empty() ? "FAILED" : orchestrator::EndState(comps);
    if (!end.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  bar.Clear();
  std::printf("coordinator job %s ended %s\n", job.c_str(), orchestrator::DescribeState(end).c_str());
  orchestrator::PrintStatus(rd, stdout);
  return end == "COMPLETED" ? 0 : 1;
}

int Status(Options& o) {
  switch (orchestrator::PrintStatus(o.run_dir, stdout)) {
    case orchestrator::RunState::kFinished: return 0;
    case orchestrator::RunState::kRunning: return 75;  // EX_TEMPFAIL: ask again later
    default: return 1;
  }
}

int Report(Options& o) {
  std::printf("%s\n", orchestrator::WriteReport(o.run_dir, o.out_file).c_str());
  return 0;
}

int Why(Options& o) {
  orchestrator::ExplainTask(o.run_dir, o.why_task, stdout);
  return 0;
}

int Resume(Options& o) {
  orchestrator::RunOptions opt;
  opt.msaflow_exe = SelfExe();
  opt.run_settled = modules::RunStepIfSettled;
  orchestrator::InstallInterruptHandlers();
  orchestrator::ResumeRun(o.run_dir, opt, stdout);
  return 0;
}

}  // namespace msaflow::cli
