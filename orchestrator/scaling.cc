#include "orchestrator/scaling.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/version.h"
#include "orchestrator/placement.h"
#include "orchestrator/run.h"
#include "record/run_dir.h"

namespace msaflow::orchestrator {
namespace {

using nlohmann::json;
using workflow::TrainMode;

// What the step itself measured (launch left out): prepare's features, train's candidates,
// evaluate's farm.
double StepSeconds(const json& round, workflow::Step step) {
  switch (step) {
    case workflow::Step::kPrepare: {
      double s = 0;
      for (const auto& f : round.at("features").at("computed")) s += f.value("seconds", 0.0) * PassShare(f);
      return s;
    }
    case workflow::Step::kTrain:
      return round.at("training").at("wall_s");
    case workflow::Step::kEvaluate:
      return round.at("evaluation").at("wall_s");
    case workflow::Step::kLoad:
    case workflow::Step::kStore:
    case workflow::Step::kSelect:
      break;
  }
  return 0;  // CheckOptions lets only the divisible steps through
}

std::string CpuModel() {
  std::string text;
  try {
    text = ReadFile("/proc/cpuinfo");
  } catch (const Error&) {
    return "unknown CPU";
  }
  auto pos = text.find("model name");
  if (pos == std::string::npos) return "unknown CPU";
  auto colon = text.find(':', pos), nl = text.find('\n', pos);
  return text.substr(colon + 2, nl - colon - 2);
}

json MachineJson() {
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return {{"host", host}, {"cores", std::thread::hardware_concurrency()}, {"cpu", CpuModel()}, {"date", ts}};
}

// Why a (mode, ranks) pair cannot run, or "". No mode: the steps measured do not train.
std::string Unfit(std::optional<TrainMode> mode, int64_t ranks) {
  if (!mode) return "";
  switch (*mode) {
    case TrainMode::kAsync: return ranks < 2 ? "async needs 2 ranks or more" : "";
    case TrainMode::kHybrid: return ranks < 4 || ranks % 2 != 0 ? "hybrid needs 2 groups of 2 ranks or more" : "";
    case TrainMode::kAuto:
    case TrainMode::kIndependent:
    case TrainMode::kSync: return "";
  }
  return "";
}

std::string ModeLabel(std::optional<TrainMode> mode) { return mode ? workflow::TrainModeName(*mode) : "-"; }

// The options checked; returns the training modes to measure (one "no mode" when no step
// measured trains).
std::vector<std::optional<TrainMode>> CheckOptions(const workflow::Pipeline& p, const ScalingOptions& opt) {
  if (opt.ranks.empty()) Throw(ErrorKind::kInvalidInput, "scaling: --ranks: give at least one rank count");
  for (const workflow::Step s : opt.steps)
    if (!workflow::Divisible(s))
      Throw(ErrorKind::kInvalidInput,
            std::string("scaling: --steps: \"") + workflow::StepName(s) + "\" is not one of prepare, train, evaluate");
  if (opt.weak && (p.train.limit == 0 || p.test.limit == 0))
    Throw(ErrorKind::kInvalidInput, "scaling: --weak grows the datasets' limits with the ranks; give "
                                    "datasets.train.limit and datasets.test.limit in " + p.name);
  std::vector<std::optional<TrainMode>> modes;
  for (const auto& name : opt.modes) {
    auto mode = workflow::TrainModeFromName(name);
    if (!mode)
      Throw(ErrorKind::kInvalidInput, "scaling: --modes: \"" + name + "\" is not one of auto, independent, sync, async, hybrid");
    modes.push_back(mode);
  }
  if (modes.empty()) modes = {p.steps.at(workflow::Step::kTrain).parallel.mode};
  if (std::find(opt.steps.begin(), opt.steps.end(), workflow::Step::kTrain) == opt.steps.end()) modes = {std::nullopt};
  return modes;
}

// Round 1 of the pipeline at `r` ranks for the measured steps (and `mode` for train), run in
// dir/runs/<run_id>; returns its entry for scaling.json.
json MeasureOne(const workflow::Pipeline& p, const Machine& m, const ScalingOptions& opt, const std::string& dir,
                std::optional<TrainMode> mode, int64_t r, std::FILE* out) {
  json doc = p.source;
  doc["rounds"]["max"] = 1;
  for (const workflow::Step s : opt.steps) doc["steps"][workflow::StepName(s)]["ranks"] = r;
  if (mode) doc["steps"]["train"]["mode"] = workflow::TrainModeName(*mode);
  if (!(mode && workflow::UsesParameterServers(*mode)) && doc["steps"].contains("train"))
    for (const char* k : {"servers", "groups", "max_staleness"}) doc["steps"]["train"].erase(k);
  if (opt.weak) {
    doc["datasets"]["train"]["limit"] = p.train.limit * r;
    doc["datasets"]["test"]["limit"] = p.test.limit * r;
  }
  const std::string run_id = fmt::format("{}-r{}", mode ? ModeLabel(mode) : "steps", r);
  doc["nam"] = "file://" + dir + "/nam-" + run_id;  // fresh: every backbone runs again
  workflow::Pipeline q = workflow::ParsePipeline(doc.dump(), "scaling " + run_id, "/");
  RunOptions ro;
  ro.runs_dir = dir + "/runs";
  ro.run_id = run_id;
  ro.msaflow_exe = opt.msaflow_exe;
  const std::string log_path = dir + "/" + run_id + ".log";
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (!log) ThrowErrno("open " + log_path);
  try {
    std::unique_ptr<RunObserver> watcher = opt.observe ? opt.observe(log) : std::make_unique<RunObserver>();
    RunPipeline(q, m, ro, *watcher);
  } catch (...) {
    std::fclose(log);
    throw;
  }
  std::fclose(log);
  json res = json::parse(ReadFile(record::ResultsPath(dir + "/runs/" + run_id)));
  const json& round = res.at("rounds").at(0);
  const std::string asked = ModeLabel(mode);
  json entry = {{"mode", mode ? round.at("training").value("mode", asked) : ""},
                {"asked_mode", asked}, {"ranks", r}, {"steps", json::object()},
                {"train_rows", q.train.limit}, {"test_rows", q.test.limit},
                {"champion_accuracy", res.at("champion").at("accuracy")}};
  std::string line;
  for (const workflow::Step step : opt.steps) {
    const char* s = workflow::StepName(step);
    double secs = StepSeconds(round, step);
    entry["steps"][s] = {{"seconds", secs}, {"with_launch_s", round.at("step_seconds").value(s, 0.0)}};
    line += fmt::format(" {} {:.2f} s;", s, secs);
  }
  std::fprintf(out, "  %-6s mode %-11s%s\n", fmt::format("{}", r).c_str(), entry["mode"].get<std::string>().c_str(),
               line.c_str());
  std::fflush(out);
  return entry;
}

// The table, per step and mode, each rank count against the smallest: appended to `md` as
// Markdown, returned as scaling.json's "table".
json Table(const ScalingOptions& opt, const std::vector<std::optional<TrainMode>>& modes, const json& runs,
           std::string& md) {
  md += "| step | mode | ranks | rows (train/test) | time s | speed-up | efficiency |\n|---|---|---|---|---|---|---|\n";
  json table = json::array();
  for (const workflow::Step step : opt.steps) {
    const char* s = workflow::StepName(step);
    const bool train = step == workflow::Step::kTrain;
    for (const auto& mode : modes) {
      const json* first = nullptr;
      for (const auto& e : runs) {
        if (e["asked_mode"] != ModeLabel(mode)) continue;
        if (!first) first = &e;
        double t0 = (*first)["steps"][s]["seconds"], t = e["steps"][s]["seconds"];
        int64_t r0 = (*first)["ranks"], r = e["ranks"];
        double speedup = t > 0 ? t0 / t : 0;
        double eff = opt.weak ? speedup : speedup * static_cast<double>(r0) / static_cast<double>(r);
        std::string mode_label = train ? e["mode"].get<std::string>() : "-";
        md += fmt::format("| {} | {} | {} | {}/{} | {:.3f} | {:.2f}x | {:.0f} % |\n", s, mode_label, r,
                          e["train_rows"].get<int64_t>(), e["test_rows"].get<int64_t>(), t, speedup, 100 * eff);
        table.push_back({{"step", s}, {"mode", mode_label}, {"ranks", r}, {"seconds", t}, {"speedup", speedup},
                         {"efficiency", eff}});
      }
      if (!train) break;  // other steps do not depend on the training mode
    }
  }
  return table;
}

}  // namespace

std::string RunScaling(const workflow::Pipeline& p, const Machine& m, const ScalingOptions& opt, std::FILE* out) {
  const std::vector<std::optional<TrainMode>> modes = CheckOptions(p, opt);
  std::vector<int64_t> ranks = opt.ranks;
  std::sort(ranks.begin(), ranks.end());

  std::string id = opt.id.empty() ? "scaling-" + NewRunId(p.name) : opt.id;
  std::string dir = std::filesystem::absolute(opt.runs_dir + "/" + id).lexically_normal().string();
  if (PathExists(dir + "/scaling.json")) Throw(ErrorKind::kInvalidInput, dir + " already holds a scaling study");
  MakeDirs(dir);
  // One thread per rank, so that a rank is a core on any machine.
  ::setenv("OMP_NUM_THREADS", "1", 1);
  json runs = json::array();
  std::vector<std::string> step_names;
  for (const workflow::Step s : opt.steps) step_names.emplace_back(workflow::StepName(s));
  std::fprintf(out, "scaling study %s: %s scaling of %s at %s ranks, one thread per rank\n", id.c_str(),
               opt.weak ? "weak" : "strong", fmt::format("{}", fmt::join(step_names, ", ")).c_str(),
               fmt::format("{}", fmt::join(ranks, ", ")).c_str());
  for (const auto& mode : modes) {
    for (int64_t r : ranks) {
      const std::string why = Unfit(mode, r);
      if (!why.empty()) {
        std::fprintf(out, "  %-6s mode %-11s skipped: %s\n", fmt::format("{}", r).c_str(), ModeLabel(mode).c_str(),
                     why.c_str());
        continue;
      }
      runs.push_back(MeasureOne(p, m, opt, dir, mode, r, out));
    }
  }
  json machine = MachineJson();
  std::string md = fmt::format("# {} scaling of {}\n\nMachine: {} ({} cores, {}), {}; one thread per rank; "
                               "msaflow {}.\n\n",
                               opt.weak ? "Weak" : "Strong", p.name, machine["host"].get<std::string>(),
                               machine["cores"].get<unsigned>(), machine["cpu"].get<std::string>(),
                               machine["date"].get<std::string>(), kVersion);
  md += opt.weak ? "Weak scaling: the data grows with the ranks; efficiency = T(first) / T(ranks).\n\n"
                 : "Strong scaling: the same data at every rank count; speed-up = T(first) / T(ranks), "
                   "efficiency = speed-up x first / ranks.\n\n";
  json table = Table(opt, modes, runs, md);
  json doc = {{"format", "msaflow.scaling/1"}, {"pipeline", p.name},  {"kind", opt.weak ? "weak" : "strong"},
              {"machine", machine},             {"threads_per_rank", 1}, {"runs", runs}, {"table", table}};
  WriteFileAtomic(dir + "/scaling.json", doc.dump(2) + "\n");
  WriteFileAtomic(dir + "/scaling.md", md);
  std::fprintf(out, "\n%s\nwritten: %s/scaling.json, %s/scaling.md\n", md.c_str(), dir.c_str(), dir.c_str());
  return dir;
}

}  // namespace msaflow::orchestrator
