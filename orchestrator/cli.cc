// msaflow: the command-line front end. Exit codes (docs/cli.md):
//   0 success · 1 a task or run failed · 2 usage error · 3 invalid input · 4 not found
//   5 corrupt data · 6 unsupported · 7 I/O error · 70 internal error
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fmt/core.h>

#include "common/error.h"
#include "common/files.h"
#include "modules/steps.h"
#include "nam/store.h"
#include "orchestrator/launcher.h"
#include "orchestrator/machine.h"
#include "orchestrator/pipeline.h"
#include "orchestrator/planner.h"
#include "orchestrator/run.h"

namespace {

using namespace msaflow;

int ExitCode(ErrorKind k) {
  switch (k) {
    case ErrorKind::kTaskFailed: return 1;
    case ErrorKind::kInvalidInput: return 3;
    case ErrorKind::kNotFound: return 4;
    case ErrorKind::kCorrupt: return 5;
    case ErrorKind::kUnsupported: return 6;
    case ErrorKind::kIo: return 7;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) Throw(ErrorKind::kIo, "cannot resolve /proc/self/exe: " + ec.message());
  return p.string();
}

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"msaflow — transfer-learning workflows on a Modular Supercomputer Architecture"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "msaflow 0.1.0");

  std::string pipeline_path, machine_override, runs_dir = "runs", run_id, task_file, run_dir, step;
  auto* validate = app.add_subcommand("validate", "Check a pipeline JSON; print a summary or the first error");
  validate->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();

  auto* plan = app.add_subcommand("plan", "Print the plan of round 1: tasks, modules, ranks and commands");
  plan->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  plan->add_option("--machine", machine_override, "machine name or file (overrides the pipeline's)");

  auto* run = app.add_subcommand("run", "Run a pipeline on this machine (blocking, with progress)");
  run->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  run->add_option("--runs", runs_dir, "directory holding run directories and the default NAM")->capture_default_str();
  run->add_option("--run-id", run_id, "run id (default: <name>-<time>-<random>)");
  run->add_option("--machine", machine_override, "machine name or file (overrides the pipeline's)");

  auto* status = app.add_subcommand("status", "Show the state of a run directory");
  status->add_option("run_dir", run_dir, "runs/<id>")->required();

  auto* module = app.add_subcommand("module", "Run one step of a round as a module process (what launchers start)");
  module->add_option("step", step, "load | prepare | train | store | evaluate | select")
      ->required()
      ->check(CLI::IsMember({"load", "prepare", "train", "store", "evaluate", "select"}));
  module->add_option("--task", task_file, "task JSON written by the planner")->required()->check(CLI::ExistingFile);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  try {
    if (*validate) {
      orchestrator::Pipeline p = orchestrator::LoadPipeline(pipeline_path);
      orchestrator::Machine m = orchestrator::LoadMachine(p.machine);
      for (const auto& s : orchestrator::StepNames()) m.Module(p.steps.at(s).module, pipeline_path + ": /steps/" + s + "/module");
      for (const auto& b : p.backbones)
        if (b.kind == "onnx" && !PathExists(b.onnx))
          Throw(ErrorKind::kNotFound, pipeline_path + ": /backbones: " + b.onnx + ": no such file");
      std::printf("%s: valid (%zu backbones, up to %lld rounds of %lld candidates, machine %s)\n", pipeline_path.c_str(),
                  p.backbones.size(), static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
                  m.name.c_str());
      return 0;
    }
    if (*plan || *run) {
      orchestrator::Pipeline p = orchestrator::LoadPipeline(pipeline_path);
      orchestrator::Machine m = orchestrator::LoadMachine(machine_override.empty() ? p.machine : machine_override);
      orchestrator::LocalLauncher launcher(SelfExe());
      if (*plan) {
        std::string nam = p.nam.empty() ? "file://" + std::filesystem::absolute(runs_dir + "/nam").lexically_normal().string() : p.nam;
        auto rp = orchestrator::PlanRound(p, m, "<run-id>", nam, 1, orchestrator::FirstRound(p), {});
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
        for (const auto& c : orchestrator::FirstRound(p))
          std::printf("  %-8s %-12s %s seed %llu\n", c.id.c_str(), c.backbone.c_str(),
                      orchestrator::HeadLabel(c.head).c_str(), static_cast<unsigned long long>(c.head.seed));
        return 0;
      }
      orchestrator::RunOptions opt;
      opt.runs_dir = runs_dir;
      opt.run_id = run_id;
      orchestrator::RunPipeline(p, m, launcher, opt, stdout);
      return 0;
    }
    if (*status) {
      orchestrator::PrintStatus(run_dir, stdout);
      return 0;
    }
    if (*module) {
      std::string text = ReadFile(task_file);
      nlohmann::json task = nlohmann::json::parse(text, nullptr, false);
      if (task.is_discarded()) Throw(ErrorKind::kInvalidInput, task_file + ": not valid JSON");
      modules::RunStep(step, task, EnvInt("MSAFLOW_RANK", 0), EnvInt("MSAFLOW_SIZE", 1), stdout);
      return 0;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow: error: %s\n", e.what());
    return ExitCode(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msaflow: internal error: %s\n", e.what());
    return 70;
  }
  return 0;
}
