#include "record/status.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "launch/slurm.h"
#include "record/coordinator_lock.h"
#include "record/journal.h"
#include "record/run_dir.h"

namespace msaflow::record {

using launch::EndState;

using nlohmann::json;

RunStatus StateFrom(RunSummary summary, pid_t holder, const std::string& run_dir) {
  RunStatus st;
  st.holder = holder;
  if (summary.finished) {
    st.state = RunState::kFinished;
    st.line = "finished: " + summary.finish;
  } else if (holder > 0) {
    st.state = RunState::kRunning;
    st.line = fmt::format("running (coordinator pid {}){}", holder,
                          summary.last_started.empty() ? "" : ", task " + summary.last_started);
  } else if (summary.failed && summary.cancelled) {
    st.state = RunState::kCancelled;
    st.line = "cancelled: " + summary.error + "\n  what finished is kept: `msaflow resume " + run_dir + "` continues it";
  } else if (summary.failed && summary.signal) {
    st.state = RunState::kInterrupted;
    st.line = fmt::format("interrupted: {}; `msaflow resume {}` continues it", summary.error, run_dir);
  } else if (summary.failed) {
    st.state = RunState::kFailed;
    st.line = "failed: " + summary.error + "\n  what finished is kept: `msaflow resume " + run_dir + "` continues it";
  } else {
    st.state = RunState::kInterrupted;
    st.line = fmt::format("interrupted: its coordinator (pid {} on {}) is gone{}; `msaflow resume {}` continues it",
                          summary.coordinator.pid, summary.coordinator.host.empty() ? "?" : summary.coordinator.host,
                          summary.last_started.empty() ? "" : " during task " + summary.last_started, run_dir);
  }
  st.summary = std::move(summary);
  return st;
}

RunStatus StatusOf(const std::string& run_dir) {
  const std::string path = JournalPath(run_dir);
  return StateFrom(Summarize(ReadJournal(path), path), CoordinatorHolding(run_dir), run_dir);
}

const char* StateName(RunState s) {
  switch (s) {
    case RunState::kRunning: return "running";
    case RunState::kInterrupted: return "interrupted";
    case RunState::kFailed: return "failed";
    case RunState::kCancelled: return "cancelled";
    case RunState::kFinished: return "finished";
  }
  return "?";
}

std::vector<TaskRow> TaskRows(const RunStatus& st) {
  const RunSummary& s = st.summary;
  std::vector<TaskRow> rows;
  for (const std::string& t : s.tasks) {
    TaskRow r;
    r.task = t;
    r.module = s.module.count(t) ? s.module.at(t) : "";
    r.ranks = s.ranks.count(t) ? s.ranks.at(t) : 1;
    r.starts = s.starts.count(t) ? s.starts.at(t) : 0;
    r.retries = s.retries.count(t) ? s.retries.at(t) : 0;
    r.started = s.started.count(t) ? s.started.at(t) : "";
    if (s.seconds.count(t)) r.seconds = s.seconds.at(t);
    if (s.reused.count(t) && !s.seconds.count(t))
      r.state = "reused";
    else if (s.tasks_done.count(t))
      r.state = "done";
    else if (st.state == RunState::kRunning)
      r.state = t == s.last_started ? "running" : "pending";
    else if (st.state == RunState::kFailed && t == s.last_started)
      r.state = "failed";
    else if (st.state == RunState::kCancelled && t == s.last_started)
      r.state = "cancelled";
    else
      r.state = "interrupted";
    rows.push_back(std::move(r));
  }
  return rows;
}

namespace {

// An event's retry attempt, for printing: a damaged journal's 2^31 - 1 would overflow "+ 2".
int Attempt(const nlohmann::json& e) {
  const int64_t a = e.value("attempt", int64_t{0});
  return static_cast<int>(std::clamp<int64_t>(a, 0, 1 << 20));
}

void PrintTaskTable(const std::vector<TaskRow>& rows, std::FILE* out) {
  if (rows.empty()) return;
  std::fprintf(out, "\n  %-14s %-11s %5s  %-11s %7s %8s  %s\n", "task", "module", "ranks", "state", "retries", "seconds",
               "started (UTC)");
  for (const TaskRow& r : rows) {
    const std::string secs = r.seconds >= 0 ? fmt::format("{:.1f}", r.seconds) : "-";
    const std::string when = r.started.size() >= 19 ? r.started.substr(11, 8) : "-";
    std::fprintf(out, "  %-14s %-11s %5d  %-11s %7d %8s  %s\n", r.task.c_str(), r.module.c_str(), r.ranks,
                 r.state.c_str(), r.retries, secs.c_str(), when.c_str());
  }
  std::fprintf(out, "\n");
}

// A table of the runs in a runs directory, oldest first.
void PrintRunsTable(const std::string& dir, std::FILE* out) {
  struct Row {
    std::string started, run, state, rounds, tasks, what;
  };
  std::vector<Row> rows;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string run_dir = it->path().string();
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || !HasJournal(run_dir)) {
      if (WasSubmitted(run_dir)) rows.push_back({"", name, "submitted", "-", "-", "waiting for Slurm"});
      continue;
    }
    try {
      const RunStatus st = StatusOf(run_dir);
      const RunSummary& s = st.summary;
      std::string what = st.line.substr(st.line.find(": ") == std::string::npos ? 0 : st.line.find(": ") + 2);
      if (st.state == RunState::kRunning) what = st.line;
      what = Printable(what.substr(0, what.find('\n')), 70);
      rows.push_back({s.started_at, name, StateName(st.state), std::to_string(s.rounds_ended),
                      fmt::format("{}/{}", s.tasks_done.size(), s.tasks.size()), what});
    } catch (const Error& e) {
      rows.push_back({"", name, "unreadable", "-", "-", Printable(e.what(), 70)});
    }
  }
  if (rows.empty()) {
    std::fprintf(out, "%s: no runs\n", dir.c_str());
    return;
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return std::tie(a.started, a.run) < std::tie(b.started, b.run); });
  size_t w = 3;
  for (const Row& r : rows) w = std::max(w, r.run.size());
  std::fprintf(out, "%-*s  %-11s %6s %7s  %-20s %s\n", static_cast<int>(w), "run", "state", "rounds", "tasks",
               "started (UTC)", "champion / where it is");
  for (const Row& r : rows)
    std::fprintf(out, "%-*s  %-11s %6s %7s  %-20s %s\n", static_cast<int>(w), r.run.c_str(), r.state.c_str(),
                 r.rounds.c_str(), r.tasks.c_str(), r.started.substr(0, 19).c_str(), r.what.c_str());
}

}  // namespace

RunState PrintStatus(const std::string& run_dir, std::FILE* out) {
  if (!HasJournal(run_dir) && !WasSubmitted(run_dir) && std::filesystem::is_directory(run_dir)) {
    PrintRunsTable(run_dir, out);
    return RunState::kFinished;
  }
  if (!HasJournal(run_dir) && WasSubmitted(run_dir)) {
    const launch::SubmittedCoordinator sub = ReadSubmittedCoordinator(run_dir);
    std::fprintf(out, "run %s submitted as %s; the coordinator has not started yet\n", sub.run.c_str(),
                 sub.Describe().c_str());
    const auto comps = sub.States();
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
  const std::string path = JournalPath(run_dir);
  const Journal journal = ReadJournal(path);
  const RunStatus st = StateFrom(Summarize(journal, path), CoordinatorHolding(run_dir), run_dir);
  // Slurm jobs: the components each round used and their last known states.
  std::map<std::string, json> components;  // component id -> last state
  for (const JournalEvent& je : journal.events) try {
    const json& e = je.fields;
    const EventKind ev = je.kind;
    if (ev == EventKind::kRunStart)
      std::fprintf(out, "run %s (pipeline %s, machine %s, launcher %s, NAM %s)\n", e.value("run", "").c_str(),
                   e.value("pipeline", "").c_str(), e.value("machine", "").c_str(), e.value("launcher", "local").c_str(),
                   e.value("nam", "").c_str());
    if (ev == EventKind::kNamServer) {
      std::string where = e.value("slurm_job", "").empty()
                              ? fmt::format("pid {}", e.value("pid", 0))
                              : fmt::format("Slurm job {} on node {}", e.value("slurm_job", ""), e.value("node", ""));
      std::fprintf(out, "  NAM server %s (%s, persisting to %s)\n", e.value("uri", "").c_str(), where.c_str(),
                   e.value("persist", "").c_str());
    }
    if (ev == EventKind::kRoundStart) std::fprintf(out, "  round %d:\n", e.at("round").get<int>());
    if (ev == EventKind::kTaskRetry)
      std::fprintf(out, "    task %s failed (%s) and was started again (attempt %d)\n", e.value("task", "").c_str(),
                   e.value("reason", "").c_str(), Attempt(e) + 2);
    if (ev == EventKind::kSlurmJob) {
      std::string comps;
      for (const auto& c : e.at("components"))
        comps += (comps.empty() ? "" : ", ") + c.value("id", "") + " " + c.value("module", "") + "@" +
                 c.value("partition", "");
      std::fprintf(out, "    slurm %s job %s%s: %s\n", e.value("mode", "").c_str(), e.value("job", "").c_str(),
                   Attempt(e) ? fmt::format(" (attempt {})", Attempt(e) + 1).c_str() : "",
                   comps.c_str());
    }
    if (ev == EventKind::kSlurmState)
      for (const auto& c : e.at("components")) components[c.value("id", "")] = c;
    if (ev == EventKind::kSlurmEnd) {
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
    if (ev == EventKind::kSlurmRetry) std::fprintf(out, "    retried: %s\n", e.value("message", "").c_str());
    if (ev == EventKind::kSlurmFallback)
      std::fprintf(out, "    Slurm refused the %s mode; fell back to %s: %s\n", e.value("from", "").c_str(),
                   e.value("to", "").c_str(), e.value("why", "").c_str());
    if (ev == EventKind::kResume) {
      const json& c = e.at("coordinator");
      std::fprintf(out, "  resumed by coordinator pid %lld on %s (%s)\n", c.at("pid").get<long long>(),
                   c.at("host").get<std::string>().c_str(), e.value("was", "").c_str());
      if (e.contains("reason")) std::fprintf(out, "    why: %s\n", e.value("reason", "").c_str());
    }
    if (ev == EventKind::kRoundEnd)
      std::fprintf(out, "    champion %s accuracy %.4f\n", e.at("champion").get<std::string>().c_str(),
                   e.at("accuracy").get<double>());
  } catch (const json::exception& x) {
    // A field missing or of the wrong type: the journal was edited or damaged.
    Throw(ErrorKind::kCorrupt, path + ":" + std::to_string(je.line) + ": a malformed '" + Printable(je.event, 40) +
                                   "' event (" + x.what() + ")");
  }
  if (st.state == RunState::kRunning && !components.empty()) {
    std::fprintf(out, "  Slurm components (last seen):\n");
    for (const auto& [id, c] : components)
      std::fprintf(out, "    %-8s %-10s %s\n", id.c_str(), c.value("partition", "").c_str(), c.value("state", "").c_str());
  }
  PrintTaskTable(TaskRows(st), out);
  std::fprintf(out, "state: %s\n", st.line.c_str());
  return st.state;
}

}  // namespace msaflow::record
