#include "orchestrator/status.h"

#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "orchestrator/coordinator_lock.h"
#include "orchestrator/journal.h"
#include "orchestrator/slurm.h"

namespace msaflow::orchestrator {

using nlohmann::json;

RunState PrintStatus(const std::string& run_dir, std::FILE* out) {
  if (!PathExists(run_dir + "/journal.jsonl") && PathExists(run_dir + "/submitted.json")) {
    json sub = json::parse(ReadFile(run_dir + "/submitted.json"), nullptr, false);
    if (sub.is_discarded()) Throw(ErrorKind::kCorrupt, run_dir + "/submitted.json: not JSON");
    std::fprintf(out, "run %s submitted as Slurm job %s; the coordinator has not started yet\n",
                 sub.value("run", "").c_str(), sub.value("job", "").c_str());
    SlurmCli cli(sub.value("slurm_conf", ""));
    const auto comps = ParseShowJob(cli.Show(sub.value("job", "")));
    for (const auto& c : comps)
      std::fprintf(out, "  coordinator job %s: %s %s\n", c.id.c_str(), c.state.c_str(), c.reason.c_str());
    const std::string end = comps.empty() ? "gone from Slurm" : EndState(comps);
    if (end.empty()) {
      std::fprintf(out, "state: waiting for its coordinator job to start\n");
      return RunState::kRunning;
    }
    std::fprintf(out, "state: failed: the coordinator job ended (%s) before it started the run\n", end.c_str());
    return RunState::kFailed;
  }
  const std::string path = run_dir + "/journal.jsonl";
  const Journal journal = ReadJournal(path);
  const RunSummary summary = Summarize(journal, path);
  // Slurm jobs: the components each round used and their last known states.
  std::map<std::string, json> components;  // component id -> last state
  for (const JournalEvent& je : journal.events) try {
    const json& e = je.fields;
    const std::string& ev = je.event;
    if (ev == "run-start")
      std::fprintf(out, "run %s (pipeline %s, machine %s, launcher %s, NAM %s)\n", e.value("run", "").c_str(),
                   e.value("pipeline", "").c_str(), e.value("machine", "").c_str(), e.value("launcher", "local").c_str(),
                   e.value("nam", "").c_str());
    if (ev == "nam-server") {
      std::string where = e.value("slurm_job", "").empty()
                              ? fmt::format("pid {}", e.value("pid", 0))
                              : fmt::format("Slurm job {} on node {}", e.value("slurm_job", ""), e.value("node", ""));
      std::fprintf(out, "  NAM server %s (%s, persisting to %s)\n", e.value("uri", "").c_str(), where.c_str(),
                   e.value("persist", "").c_str());
    }
    if (ev == "round-start") std::fprintf(out, "  round %d:\n", e.at("round").get<int>());
    if (ev == "slurm-job") {
      std::string comps;
      for (const auto& c : e.at("components"))
        comps += (comps.empty() ? "" : ", ") + c.value("id", "") + " " + c.value("module", "") + "@" +
                 c.value("partition", "");
      std::fprintf(out, "    slurm %s job %s%s: %s\n", e.value("mode", "").c_str(), e.value("job", "").c_str(),
                   e.value("attempt", 0) ? fmt::format(" (attempt {})", e.value("attempt", 0) + 1).c_str() : "",
                   comps.c_str());
    }
    if (ev == "slurm-state")
      for (const auto& c : e.at("components")) components[c.value("id", "")] = c;
    if (ev == "slurm-end") {
      for (const auto& j : e.at("jobs"))
        for (const auto& c : j.at("components")) {
          components[c.value("id", "")] = c;
          std::fprintf(out, "      %-8s %-10s %-9s exit %d:%d  %s\n", c.value("id", "").c_str(),
                       c.value("partition", "").c_str(), c.value("state", "").c_str(), c.value("exit", 0),
                       c.value("signal", 0), c.value("nodes", "").c_str());
        }
      if (e.value("leftover_sruns_killed", 0) > 0)
        std::fprintf(out, "      %d leftover srun process(es) ended\n", e.value("leftover_sruns_killed", 0));
    }
    if (ev == "slurm-retry") std::fprintf(out, "    retried: %s\n", e.value("message", "").c_str());
    if (ev == "slurm-fallback")
      std::fprintf(out, "    Slurm refused the %s mode; fell back to %s: %s\n", e.value("from", "").c_str(),
                   e.value("to", "").c_str(), e.value("why", "").c_str());
    if (ev == "resume") {
      const json& c = e.at("coordinator");
      std::fprintf(out, "  resumed by coordinator pid %lld on %s (%s)\n", c.at("pid").get<long long>(),
                   c.at("host").get<std::string>().c_str(), e.value("was", "").c_str());
    }
    if (ev == "task-reused")
      std::fprintf(out, "    step %-12s done before the resume; not run again\n", e.value("task", "").c_str());
    if (ev == "task-start") {
      std::fprintf(out, "    step %-12s on %-3s %d rank(s) started\n", e.value("task", "").c_str(),
                   e.value("module", "").c_str(), e.value("ranks", 1));
    }
    if (ev == "task-end")
      std::fprintf(out, "    step %-12s done in %.1f s\n", e.value("task", "").c_str(), e.value("seconds", 0.0));
    if (ev == "round-end")
      std::fprintf(out, "    champion %s accuracy %.4f\n", e.at("champion").get<std::string>().c_str(),
                   e.at("accuracy").get<double>());
  } catch (const json::exception& x) {
    // A field missing or of the wrong type: the journal was edited or damaged.
    Throw(ErrorKind::kCorrupt, path + ":" + std::to_string(je.line) + ": a malformed '" + Printable(je.event, 40) +
                                   "' event (" + x.what() + ")");
  }
  RunState state;
  std::string line;
  const pid_t holder = CoordinatorHolding(run_dir);
  if (summary.finished) {
    state = RunState::kFinished;
    line = "finished: " + summary.finish;
  } else if (holder > 0) {
    state = RunState::kRunning;
    line = fmt::format("running (coordinator pid {}){}", holder,
                       summary.last_started.empty() ? "" : ", task " + summary.last_started);
  } else if (summary.failed) {
    state = RunState::kFailed;
    line = "failed: " + summary.error + "\n  what finished is kept: `msaflow resume " + run_dir + "` continues it";
  } else {
    state = RunState::kInterrupted;
    line = fmt::format("interrupted: its coordinator (pid {} on {}) is gone{}; `msaflow resume {}` continues it",
                       summary.coordinator.pid, summary.coordinator.host.empty() ? "?" : summary.coordinator.host,
                       summary.last_started.empty() ? "" : " during task " + summary.last_started, run_dir);
  }
  if (state == RunState::kRunning && !components.empty()) {
    std::fprintf(out, "  Slurm components (last seen):\n");
    for (const auto& [id, c] : components)
      std::fprintf(out, "    %-8s %-10s %s\n", id.c_str(), c.value("partition", "").c_str(), c.value("state", "").c_str());
  }
  std::fprintf(out, "state: %s\n", line.c_str());
  return state;
}

}  // namespace msaflow::orchestrator
