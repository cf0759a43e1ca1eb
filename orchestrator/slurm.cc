#include "orchestrator/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fmt/core.h>
#include <set>
#include <sstream>
#include <thread>

#include "common/child_process.h"
#include "common/error.h"
#include "common/files.h"

namespace msaflow::orchestrator {
namespace {

using nlohmann::json;

struct CommandResult {
  int rc = -1;
  std::string out, err;
};

// Runs argv with SLURM_CONF set (when given), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& conf) {
  SpawnOptions opt;
  if (!conf.empty()) opt.set_env = {"SLURM_CONF=" + conf};
  Captured c = RunCaptured(argv, opt, 60);
  CommandResult r;
  r.rc = c.status.signal ? 128 + c.status.signal : c.status.code;
  r.out = std::move(c.out);
  r.err = std::move(c.err);
  if (c.timed_out) r.err += argv[0] + " did not answer in 60 s; killed\n";
  return r;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

// The modules a set of tasks uses, in order of first use, with the ranks each needs.
std::vector<std::pair<std::string, int64_t>> Components(const std::vector<Task>& tasks) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Task& t : tasks) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.first == t.module; });
    if (it == out.end()) {
      out.push_back({t.module, t.ranks});
    } else {
      it->second = std::max(it->second, t.ranks);
    }
  }
  return out;
}

std::string ComponentOptions(const ModuleSpec& s, int64_t ntasks) {
  std::string o = "--partition=" + s.partition + " --nodes=" + std::to_string(s.nodes) +
                  " --ntasks=" + std::to_string(ntasks) + " --time=" + s.time;
  if (!s.gres.empty()) o += " --gres=" + s.gres;
  if (!s.constraint.empty()) o += " --constraint=" + s.constraint;
  return o;
}

// Every step runs in the background so its srun's PID is recorded: if Slurm's srun hangs
// after the step (a known 22.05 bug) the coordinator can find and end it.
constexpr char kStepFunction[] = R"SH(set -u
PROGRESS=@PROGRESS@
step() {
  local id=$1 log=$2; shift 2
  echo "start $id $(date +%s.%N)" >> "$PROGRESS"
  "$@" > "$log" 2>&1 &
  local pid=$!
  echo "srun $id $pid" >> "$PROGRESS"
  wait "$pid"
  local rc=$?
  echo "end $id $rc $(date +%s.%N)" >> "$PROGRESS"
  return "$rc"
}
)SH";

std::string StepFunction(const SlurmScriptParams& p) {
  std::string f = kStepFunction;
  f.replace(f.find("@PROGRESS@"), 10, ShellQuote(p.progress));
  return f;
}

// `placement`: the srun options that put the step on its module ("--het-group=1", or in
// single mode "--nodes=1 --nodelist=$NODES_dam"; empty in chained mode).
std::string StepLine(const Task& t, const std::string& placement, const std::map<std::string, std::string>& task_files,
                     const SlurmScriptParams& p) {
  std::string srun = "srun";
  if (!placement.empty()) srun += " " + placement;
  // Every step is an MPI program: PMIx, one component per step (a PMIx step spanning hetjob
  // components can hang at exit in Slurm 22.05, ../shared/INFRA.md).
  srun += " --ntasks=" + std::to_string(t.ranks) + " --mpi=pmix --kill-on-bad-exit=1";
  return "step " + t.id + " " + ShellQuote(p.log_dir + "/" + t.id + ".log") + " " + srun + " " + ShellQuote(p.exe) +
         " module " + t.step + " --task " + ShellQuote(task_files.at(t.id)) + " || exit 1\n";
}

// Single mode: the batch script splits its one allocation into the modules' node sets,
// by node feature (the feature names a module's nodes) or, without features, in order.
constexpr char kTakeNodes[] = R"SH(POOL=" $(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\n' ' ')"
take_nodes() {
  local module=$1 feature=$2 n=$3 h
  TAKEN=""
  for h in $POOL; do
    [ "$n" -gt 0 ] || break
    if [ -n "$feature" ]; then
      sinfo -h -N -n "$h" -o %b | tr ',' '\n' | grep -qx -- "$feature" || continue
    fi
    TAKEN+=${TAKEN:+,}$h
    POOL=${POOL/ $h / }
    n=$((n - 1))
  done
  if [ "$n" -gt 0 ]; then
    echo "msaflow: allocation $SLURM_JOB_NODELIST has too few nodes${feature:+ with feature $feature} left for module $module" >&2
    exit 1
  fi
  echo "nodes $module $TAKEN" >> "$PROGRESS"
}
)SH";

std::string Header(const std::string& job_name, const std::string& log_name, const SlurmScriptParams& p) {
  return "#!/bin/bash\n#SBATCH --job-name=" + job_name + "\n#SBATCH --output=" + p.log_dir + "/" + log_name +
         "\n#SBATCH --chdir=" + p.run_dir + "\n";
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=+@%,") ==
                        std::string::npos)
    return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string HetjobScript(const std::vector<Task>& tasks, const Machine& m,
                         const std::map<std::string, std::string>& task_files, const SlurmScriptParams& p) {
  auto comps = Components(tasks);
  std::string s = Header("msaflow-" + p.run + "-r" + std::to_string(p.round),
                         "slurm-r" + std::to_string(p.round) + "-%j.out", p);
  for (size_t i = 0; i < comps.size(); ++i) {
    if (i > 0) s += "#SBATCH hetjob\n";
    s += "#SBATCH " + ComponentOptions(m.Module(comps[i].first, "machine " + m.name), comps[i].second) + "\n";
  }
  s += fmt::format("# round {} of run {}: one heterogeneous job, components ", p.round, p.run);
  for (size_t i = 0; i < comps.size(); ++i) s += (i ? ", " : "") + std::to_string(i) + "=" + comps[i].first;
  s += "\n";
  s += StepFunction(p);
  for (const Task& t : tasks) {
    size_t group = 0;
    while (comps[group].first != t.module) ++group;
    s += StepLine(t, "--het-group=" + std::to_string(group), task_files, p);
  }
  return s;
}

std::string SingleScript(const std::vector<Task>& tasks, const Machine& m,
                         const std::map<std::string, std::string>& task_files, const SlurmScriptParams& p) {
  auto comps = Components(tasks);
  int64_t nodes = 0, per_node = 1, time = 0;
  bool by_feature = false;
  std::string constraint, left_out, layout;
  for (const auto& [name, ranks] : comps) {
    const ModuleSpec& s = m.Module(name, "machine " + m.name);
    nodes += s.nodes;
    per_node = std::max(per_node, (ranks + s.nodes - 1) / s.nodes);
    int64_t t = ParseSlurmTime(s.time, "machine " + m.name + ": module " + name + " time");
    time = (t < 0 || time < 0) ? -1 : std::max(time, t);
    if (!s.feature.empty()) {
      by_feature = true;
      constraint += (constraint.empty() ? "" : "&") + s.feature + "*" + std::to_string(s.nodes);
    }
    if (!s.gres.empty()) left_out += " " + name + " --gres=" + s.gres + ";";
    if (!s.constraint.empty()) left_out += " " + name + " --constraint=" + s.constraint + ";";
    layout += fmt::format("{}{} {} node{}", layout.empty() ? "" : ", ", name, s.nodes, s.nodes > 1 ? "s" : "");
  }
  std::string time_s = time < 0 ? "UNLIMITED" : fmt::format("{}:{:02}:{:02}", time / 3600, time / 60 % 60, time % 60);
  std::string s = Header("msaflow-" + p.run + "-r" + std::to_string(p.round),
                         "slurm-r" + std::to_string(p.round) + "-%j.out", p);
  s += fmt::format("#SBATCH --partition={} --nodes={} --ntasks-per-node={} --time={}{}\n", m.slurm.partition, nodes,
                   per_node, time_s, by_feature ? " --constraint=[" + constraint + "]" : "");
  s += fmt::format("# round {} of run {}: one allocation, modules as node subsets {}: {}\n", p.round, p.run,
                   by_feature ? "by node feature" : "in node order", layout);
  if (!left_out.empty())
    s += "# left out (a job's --gres and --constraint apply to all its nodes):" + left_out + "\n";
  s += StepFunction(p);
  s += kTakeNodes;
  for (const auto& [name, ranks] : comps) {
    const ModuleSpec& ms = m.Module(name, "machine " + m.name);
    s += fmt::format("take_nodes {} {} {}\nNODES_{}=$TAKEN\n", name, ms.feature.empty() ? "''" : ms.feature,
                     ms.nodes, name);
  }
  for (const Task& t : tasks) {
    int64_t module_nodes = m.Module(t.module, "machine " + m.name).nodes;
    int64_t n = std::min(t.ranks, module_nodes);
    std::string list = n < module_nodes ? fmt::format("$(echo \"$NODES_{}\" | cut -d, -f1-{})", t.module, n)
                                        : "$NODES_" + t.module;
    s += StepLine(t, fmt::format("--nodes={} --nodelist={}", n, list), task_files, p);
  }
  return s;
}

std::string ChainedScript(const Task& t, const Machine& m, const std::map<std::string, std::string>& task_files,
                          const SlurmScriptParams& p) {
  std::string s = Header("msaflow-" + p.run + "-r" + std::to_string(p.round) + "-" + t.step,
                         "slurm-" + t.id + "-%j.out", p);
  s += "#SBATCH " + ComponentOptions(m.Module(t.module, "machine " + m.name), t.ranks) + "\n";
  s += fmt::format("# round {} of run {}: step {} on module {} (chained mode)\n", p.round, p.run, t.step, t.module);
  s += StepFunction(p);
  s += StepLine(t, "", task_files, p);
  return s;
}

std::vector<JobState> ParseShowJob(const std::string& text) {
  std::vector<JobState> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::map<std::string, std::string> kv;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos && eq > 0) kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
    if (!kv.count("JobId") || !kv.count("JobState")) continue;
    JobState j;
    j.job_id = kv["JobId"];
    j.state = kv["JobState"];
    j.reason = kv.count("Reason") ? kv["Reason"] : "";
    j.partition = kv.count("Partition") ? kv["Partition"] : "";
    j.nodes = kv.count("NodeList") ? kv["NodeList"] : "";
    if (kv.count("HetJobId") && kv.count("HetJobOffset")) {
      j.offset = std::atoi(kv["HetJobOffset"].c_str());
      j.id = kv["HetJobId"] + "+" + kv["HetJobOffset"];
    } else {
      j.id = j.job_id;
    }
    if (kv.count("ExitCode")) {
      const std::string& e = kv["ExitCode"];
      size_t colon = e.find(':');
      j.exit_code = std::atoi(e.substr(0, colon).c_str());
      if (colon != std::string::npos) j.signal = std::atoi(e.substr(colon + 1).c_str());
    }
    out.push_back(j);
  }
  std::sort(out.begin(), out.end(), [](const JobState& a, const JobState& b) { return a.offset < b.offset; });
  return out;
}

bool IsTerminal(const std::string& s) {
  static const std::set<std::string> kEnd = {"COMPLETED", "FAILED",        "CANCELLED", "TIMEOUT",  "PREEMPTED",
                                             "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"};
  return kEnd.count(s) > 0;
}

std::string EndState(const std::vector<JobState>& comps) {
  for (const auto& c : comps)
    if (!IsTerminal(c.state)) return "";
  // The most telling state: a component that did not complete, failures before cancellations
  // (Slurm cancels the other components of a failed hetjob).
  for (const char* s : {"NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "FAILED",
                        "CANCELLED", "SPECIAL_EXIT"})
    for (const auto& c : comps)
      if (c.state == s) return s;
  return comps.empty() ? "" : "COMPLETED";
}

std::string DescribeState(const std::string& s) {
  if (s == "COMPLETED") return "COMPLETED";
  if (s == "FAILED") return "FAILED: a step exited non-zero";
  if (s == "CANCELLED") return "CANCELLED (scancel, or a dependency that can never be met)";
  if (s == "TIMEOUT") return "TIMEOUT: the job hit its time limit";
  if (s == "PREEMPTED") return "PREEMPTED by a higher-priority job";
  if (s == "NODE_FAIL") return "NODE_FAIL: a node of the job failed";
  if (s == "OUT_OF_MEMORY") return "OUT_OF_MEMORY: a step exceeded its memory";
  return s;
}

std::string SlurmCli::Submit(const std::string& script, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(script);
  CommandResult r = RunCommand(argv, conf_);
  std::string id = Trim(r.out);
  if (r.rc != 0 || id.empty()) {
    std::string why = Trim(r.err.empty() ? r.out : r.err);
    for (size_t nl; (nl = why.find('\n')) != std::string::npos;) why.replace(nl, 1, "; ");
    Throw(ErrorKind::kTaskFailed, "sbatch refused " + script + ": " + why);
  }
  size_t semi = id.find(';');  // "id;cluster"
  return semi == std::string::npos ? id : id.substr(0, semi);
}

std::string SlurmCli::Show(const std::string& job_id) {
  CommandResult r = RunCommand({"scontrol", "show", "job", "-o", job_id}, conf_);
  if (r.rc != 0) {
    if (r.err.find("Invalid job id") != std::string::npos) return "";
    Throw(ErrorKind::kUnavailable, "scontrol show job " + job_id + ": " + Trim(r.err));
  }
  return r.out;
}

void SlurmCli::Cancel(const std::string& job_id) { RunCommand({"scancel", job_id}, conf_); }

SlurmLauncher::SlurmLauncher(Machine m, std::string exe, std::string run, std::string run_dir,
                             std::unique_ptr<JobRunner> runner, int retries, std::vector<std::string> retry_on)
    : m_(std::move(m)),
      exe_(std::move(exe)),
      run_(std::move(run)),
      run_dir_(std::move(run_dir)),
      runner_(std::move(runner)),
      retries_(retries),
      retry_on_(std::move(retry_on)) {
  modes_.push_back(m_.slurm.mode);
  for (const auto& f : m_.slurm.fallback)
    if (std::find(modes_.begin(), modes_.end(), f) == modes_.end()) modes_.push_back(f);
}

namespace {

// What the batch scripts wrote to the progress file.
struct Progress {
  std::set<std::string> started;
  std::map<std::string, int> ended;  // task -> exit status
  std::map<std::string, double> start_time, end_time;
  std::map<std::string, pid_t> srun;
};

Progress ReadProgress(const std::string& path) {
  Progress p;
  std::string text;
  try {
    text = ReadFile(path);
  } catch (const Error&) {
    return p;
  }
  std::istringstream in(text);
  std::string kind, id;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    w >> kind >> id;
    if (kind == "start") {
      double t = 0;
      w >> t;
      p.started.insert(id);
      p.start_time[id] = t;
    } else if (kind == "end") {
      int rc = -1;
      double t = 0;
      w >> rc >> t;
      p.ended[id] = rc;
      p.end_time[id] = t;
    } else if (kind == "srun") {
      pid_t pid = 0;
      w >> pid;
      p.srun[id] = pid;
    }
  }
  return p;
}

// An srun that outlived its job (Slurm 22.05 can leave one hanging, re-parented to PID 1,
// surviving scancel): found through the PIDs the scripts recorded, ended by PID.
int EndLeftoverSruns(const Progress& p) {
  int n = 0;
  for (const auto& [id, pid] : p.srun) {
    std::string cmd;
    try {
      cmd = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    } catch (const Error&) {
      continue;
    }
    if (cmd.rfind("srun", 0) == 0 || cmd.find("/srun") != std::string::npos) {
      ::kill(pid, SIGKILL);
      ++n;
    }
  }
  return n;
}

json StatesJson(const std::vector<JobState>& comps) {
  json a = json::array();
  for (const auto& c : comps)
    a.push_back({{"id", c.id}, {"state", c.state}, {"exit", c.exit_code}, {"signal", c.signal},
                 {"partition", c.partition}, {"nodes", c.nodes}, {"reason", c.reason}});
  return a;
}

}  // namespace

void SlurmLauncher::RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                             const std::string& log_dir, const LaunchObserver& obs) {
  std::string slurm_dir = run_dir_ + "/slurm";
  MakeDirs(slurm_dir);
  std::set<std::string> done;  // tasks finished with status 0, over all attempts
  auto event = [&](const std::string& name, json fields) {
    if (obs.on_event) obs.on_event(name, std::move(fields));
  };
  for (int attempt = 0;; ++attempt) {
    std::vector<Task> todo;
    for (const Task& t : plan.tasks)
      if (!done.count(t.id)) todo.push_back(t);
    if (todo.empty()) return;
    SlurmScriptParams sp{run_, run_dir_, log_dir, fmt::format("{}/round-{}.{}.progress", slurm_dir, plan.round, attempt),
                         exe_, plan.round};
    ::unlink(sp.progress.c_str());
    std::vector<std::string> jobs;  // leader ids, in order
    // Submits the round in `mode`; throws kTaskFailed when Slurm refuses it (having cancelled
    // whatever of it was already submitted).
    auto submit = [&](const std::string& mode) {
      if (mode == "hetjob" || mode == "single") {
        std::string script = fmt::format("{}/round-{}.{}{}.sh", slurm_dir, plan.round, attempt,
                                         mode == "single" ? ".single" : "");
        WriteFileAtomic(script, mode == "hetjob" ? HetjobScript(todo, m_, task_files, sp)
                                                 : SingleScript(todo, m_, task_files, sp));
        jobs.push_back(runner_->Submit(script, {}));
        json comps = json::array();
        auto cs = Components(todo);
        for (size_t i = 0; i < cs.size(); ++i) {
          const ModuleSpec& ms = m_.Module(cs[i].first, "machine");
          if (mode == "hetjob") {
            comps.push_back({{"id", jobs[0] + "+" + std::to_string(i)}, {"module", cs[i].first},
                             {"partition", ms.partition}});
          } else {
            comps.push_back({{"id", jobs[0]}, {"module", cs[i].first}, {"partition", m_.slurm.partition},
                             {"nodes", ms.nodes}, {"feature", ms.feature}});
          }
        }
        event("slurm-job", {{"round", plan.round}, {"attempt", attempt}, {"mode", mode}, {"job", jobs[0]},
                            {"script", script}, {"components", comps}});
        return;
      }
      std::string prev;  // chained: one job per step
      for (const Task& t : todo) {
        std::string script = fmt::format("{}/round-{}.{}.{}.sh", slurm_dir, plan.round, attempt, t.step);
        WriteFileAtomic(script, ChainedScript(t, m_, task_files, sp));
        std::vector<std::string> extra;
        if (!prev.empty()) extra = {"--dependency=afterok:" + prev, "--kill-on-invalid-dep=yes"};
        try {
          prev = runner_->Submit(script, extra);
        } catch (...) {
          for (const auto& j : jobs) runner_->Cancel(j);
          jobs.clear();
          throw;
        }
        jobs.push_back(prev);
        event("slurm-job", {{"round", plan.round}, {"attempt", attempt}, {"mode", "chained"}, {"job", prev},
                            {"task", t.id}, {"script", script},
                            {"components", json::array({{{"id", prev}, {"module", t.module},
                                                         {"partition", m_.Module(t.module, "machine").partition}}})}});
      }
    };
    for (;;) {
      try {
        submit(modes_[mode_i_]);
        break;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kTaskFailed || mode_i_ + 1 >= modes_.size()) throw;
        const std::string &from = modes_[mode_i_], &to = modes_[mode_i_ + 1];
        event("slurm-fallback", {{"round", plan.round}, {"from", from}, {"to", to}, {"why", e.what()}});
        if (obs.on_line)
          obs.on_line(todo.front(), fmt::format("Slurm refused the {} mode, falling back to {}: {}", from, to, e.what()));
        ++mode_i_;
      }
    }

    // Follow the jobs: progress lines from the scripts, states from scontrol.
    std::set<std::string> announced, finished;
    std::map<std::string, size_t> log_offset;
    std::map<std::string, std::vector<JobState>> last;
    std::string end_state;
    std::string why;
    auto relay_logs = [&](const Task& t) {
      std::string path = log_dir + "/" + t.id + ".log";
      std::string text;
      try {
        text = ReadFile(path);
      } catch (const Error&) {
        return;
      }
      size_t& off = log_offset[t.id];
      while (off < text.size()) {
        size_t nl = text.find('\n', off);
        if (nl == std::string::npos) break;
        if (obs.on_line) obs.on_line(t, text.substr(off, nl - off));
        off = nl + 1;
      }
    };
    for (;;) {
      if (int sig = InterruptSignal()) {
        // The coordinator is asked to stop: its jobs go with it.
        for (const auto& j : jobs) runner_->Cancel(j);
        // Let Slurm end the steps and clean up (COMPLETING) before the coordinator goes, so
        // nothing of the run is left in the queue: at most 30 s, then the leftovers below.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        for (bool gone = false; !gone && std::chrono::steady_clock::now() < give_up;) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          gone = true;
          for (const auto& j : jobs)
            for (const auto& c : ParseShowJob(runner_->Show(j))) gone = gone && IsTerminal(c.state);
        }
        int leftovers = EndLeftoverSruns(ReadProgress(sp.progress));
        std::string list;
        for (const auto& j : jobs) list += (list.empty() ? "" : ", ") + j;
        std::string msg = fmt::format("round {}: interrupted by signal {}; cancelled Slurm job(s) {}", plan.round, sig,
                                      list);
        if (leftovers) msg += fmt::format("; {} leftover srun process(es) ended", leftovers);
        event("slurm-interrupted", {{"round", plan.round}, {"signal", sig}, {"jobs", jobs}, {"message", msg}});
        Throw(ErrorKind::kTaskFailed, msg);
      }
      if (std::string dead = obs.check ? obs.check() : ""; !dead.empty()) {
        for (const auto& j : jobs) runner_->Cancel(j);
        event("slurm-cancelled", {{"round", plan.round}, {"jobs", jobs}, {"message", dead}});
        Throw(ErrorKind::kUnavailable, dead + "; the round's Slurm job(s) were cancelled");
      }
      Progress pr = ReadProgress(sp.progress);
      for (const Task& t : todo) {
        if (pr.started.count(t.id) && !announced.count(t.id)) {
          announced.insert(t.id);
          if (obs.on_start) obs.on_start(t);
        }
        if (announced.count(t.id)) relay_logs(t);
        if (pr.ended.count(t.id) && !finished.count(t.id)) {
          finished.insert(t.id);
          if (pr.ended[t.id] == 0) {
            done.insert(t.id);
            if (obs.on_end) obs.on_end(t, pr.end_time[t.id] - pr.start_time[t.id]);
          }
        }
      }
      bool all_terminal = true;
      for (const auto& j : jobs) {
        std::string text = runner_->Show(j);
        auto comps = ParseShowJob(text);
        if (comps.empty()) {
          // Forgotten by Slurm (older than MinJobAge): its last known state stands.
          if (last[j].empty()) last[j] = {JobState{j, j, -1, "FAILED", "vanished", 1, 0, "", ""}};
          continue;
        }
        if (!last[j].empty() && StatesJson(last[j]) != StatesJson(comps) && obs.on_event)
          event("slurm-state", {{"round", plan.round}, {"job", j}, {"components", StatesJson(comps)}});
        last[j] = comps;
        if (EndState(comps).empty()) all_terminal = false;
      }
      // Chained: once a job fails, later jobs never start; stop waiting for them.
      std::string first_bad;
      for (const auto& j : jobs) {
        std::string e = EndState(last[j]);
        if (!e.empty() && e != "COMPLETED") {
          first_bad = j;
          break;
        }
      }
      if (!first_bad.empty() && !all_terminal) {
        for (const auto& j : jobs)
          if (EndState(last[j]).empty()) runner_->Cancel(j);
      }
      if (all_terminal) {
        pr = ReadProgress(sp.progress);
        for (const Task& t : todo) relay_logs(t);
        for (const Task& t : todo)
          if (pr.ended.count(t.id) && pr.ended[t.id] == 0 && !finished.count(t.id)) {
            done.insert(t.id);
            if (obs.on_end) obs.on_end(t, pr.end_time[t.id] - pr.start_time[t.id]);
          }
        int leftovers = EndLeftoverSruns(pr);
        end_state = "COMPLETED";
        std::string bad_job;
        for (const auto& j : jobs) {
          std::string e = EndState(last[j]);
          if (e != "COMPLETED") {
            end_state = e;
            bad_job = j;
            break;
          }
        }
        json summary = json::array();
        for (const auto& j : jobs) summary.push_back({{"job", j}, {"components", StatesJson(last[j])}});
        event("slurm-end", {{"round", plan.round}, {"attempt", attempt}, {"state", end_state}, {"jobs", summary},
                            {"leftover_sruns_killed", leftovers}});
        if (end_state == "COMPLETED") {
          for (const Task& t : todo)
            if (!done.count(t.id)) {
              end_state = "FAILED";
              why = "task " + t.id + " never reported its end";
            }
          if (why.empty()) return;
        }
        // Which task failed, and how.
        std::string comp_desc;
        for (const auto& c : last[bad_job.empty() ? jobs.back() : bad_job])
          comp_desc += (comp_desc.empty() ? "" : ", ") + c.id + " " + c.partition + " " + c.state +
                       (c.state == "FAILED" ? " exit " + std::to_string(c.exit_code) : "");
        std::string failed_task;
        for (const Task& t : todo)
          if (!done.count(t.id) && (pr.started.count(t.id) || failed_task.empty())) {
            failed_task = t.id;
            if (pr.started.count(t.id)) break;
          }
        std::string msg = fmt::format("round {} (attempt {}): Slurm job {} ended {}; components: {}", plan.round,
                                      attempt + 1, bad_job.empty() ? jobs.back() : bad_job, DescribeState(end_state),
                                      comp_desc);
        if (!failed_task.empty())
          msg += fmt::format("; task {} {} (log {}/{}.log)", failed_task,
                             pr.ended.count(failed_task) ? "exited with status " + std::to_string(pr.ended[failed_task])
                                                         : (pr.started.count(failed_task) ? "did not finish" : "never started"),
                             log_dir, failed_task);
        if (!why.empty()) msg += "; " + why;
        if (leftovers) msg += fmt::format("; {} leftover srun process(es) ended", leftovers);
        bool retry = attempt < retries_ && std::find(retry_on_.begin(), retry_on_.end(), end_state) != retry_on_.end();
        event(retry ? "slurm-retry" : "slurm-failed", {{"round", plan.round}, {"attempt", attempt}, {"state", end_state},
                                                      {"message", msg}});
        if (!retry) Throw(ErrorKind::kTaskFailed, msg);
        if (obs.on_line) obs.on_line(todo.front(), "retrying: " + msg);
        break;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(m_.slurm.poll_s));
    }
  }
}

}  // namespace msaflow::orchestrator
