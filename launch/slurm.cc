#include "launch/slurm.h"

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

namespace msaflow::launch {

using workflow::ParseSlurmTime;
namespace {

using nlohmann::json;

struct CommandResult {
  int rc = -1;
  std::string out, err;
};

// Runs argv with SLURM_CONF set (when given), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& conf, int timeout_s = 60) {
  SpawnOptions opt;
  if (!conf.empty()) opt.set_env = {"SLURM_CONF=" + conf};
  Captured c = RunCaptured(argv, opt, timeout_s);
  CommandResult r;
  r.rc = c.status.signal ? 128 + c.status.signal : c.status.code;
  r.out = std::move(c.out);
  r.err = std::move(c.err);
  if (c.timed_out) r.err += argv[0] + " did not answer in " + std::to_string(timeout_s) + " s; killed\n";
  return r;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
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
         " module " + workflow::StepName(t.step) + " --task " + ShellQuote(task_files.at(t.id)) + " || exit 1\n";
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
  // --no-requeue: a job that loses a node (NODE_FAIL) ends, and the coordinator decides (the
  // pipeline's retries, or `msaflow resume`); Slurm's own requeue would hold the round pending
  // for as long as the node stays down, with nothing said.
  return "#!/bin/bash\n#SBATCH --job-name=" + job_name + "\n#SBATCH --output=" + p.log_dir + "/" + log_name +
         "\n#SBATCH --chdir=" + p.run_dir + "\n#SBATCH --no-requeue\n";
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> Components(const std::vector<Task>& tasks) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Task& t : tasks) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.first == t.module; });
    if (it == out.end()) {
      out.emplace_back(t.module, t.ranks);
    } else {
      it->second = std::max(it->second, t.ranks);
    }
  }
  return out;
}

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
  std::string s = Header("msaflow-" + p.run + "-r" + std::to_string(p.round) + "-" + workflow::StepName(t.step),
                         "slurm-" + t.id + "-%j.out", p);
  s += "#SBATCH " + ComponentOptions(m.Module(t.module, "machine " + m.name), t.ranks) + "\n";
  s += fmt::format("# round {} of run {}: step {} on module {} (chained mode)\n", p.round, p.run, workflow::StepName(t.step), t.module);
  s += StepFunction(p);
  s += StepLine(t, "", task_files, p);
  return s;
}

namespace {

// One line of `scontrol show ... -o`: its KEY=VALUE words (a value with spaces keeps its first word).
std::map<std::string, std::string> KeyValues(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream words(line);
  for (std::string w; words >> w;) {
    const size_t eq = w.find('=');
    if (eq != std::string::npos && eq > 0) kv[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return kv;
}

}  // namespace

std::vector<JobState> ParseShowJob(const std::string& text) {
  std::vector<JobState> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::map<std::string, std::string> kv = KeyValues(line);
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

std::string FirstError(const std::string& log_text) {
  std::istringstream in(log_text);
  for (std::string line; std::getline(in, line);)
    if (line.find("msaflow: error: ") != std::string::npos || line.find("msaflow: internal error: ") != std::string::npos)
      return line.size() > 2000 ? line.substr(0, 2000) + "..." : line;
  return "";
}

std::string LaunchFailure(const std::string& log_text) {
  const std::string mark = "srun: error: Task launch for StepId=", on = " failed on node ";
  const size_t at = log_text.find(mark);
  if (at == std::string::npos) return "";
  const std::string line = log_text.substr(at, log_text.find('\n', at) - at);
  const size_t node = line.find(on);
  if (node == std::string::npos) return "";
  return "srun could not start it on node " + line.substr(node + on.size());  // "dam01: Communication ..."
}

std::vector<std::string> LostNodes(const std::string& show_node) {
  std::vector<std::string> out;
  std::istringstream in(show_node);
  std::string line;
  while (std::getline(in, line)) {
    std::map<std::string, std::string> kv = KeyValues(line);
    const std::string& state = kv["State"];
    if (kv["NodeName"].empty() || (state.find("DOWN") == std::string::npos && state.find("NOT_RESPONDING") == std::string::npos &&
                                   state.find("FAIL") == std::string::npos))
      continue;
    // Reason is the line's last field and has spaces: "Reason=Not responding [slurm@...]".
    std::string reason;
    if (size_t r = line.find(" Reason="); r != std::string::npos) {
      reason = line.substr(r + 8);
      if (size_t at = reason.find(" ["); at != std::string::npos) reason.resize(at);
    }
    out.push_back(kv["NodeName"] + " (" + state + (reason.empty() ? "" : ": " + reason) + ")");
  }
  return out;
}

std::vector<std::string> LostNodesOf(JobRunner& jobs, const std::vector<JobState>& components) {
  std::vector<std::string> lost;
  for (const auto& c : components)
    if (!c.nodes.empty() && c.nodes != "(null)")
      for (auto& n : LostNodes(jobs.ShowNodes(c.nodes))) lost.push_back(std::move(n));
  return lost;
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

std::string SlurmCli::ShowNodes(const std::string& nodelist) {
  CommandResult r = RunCommand({"scontrol", "show", "node", "-o", nodelist}, conf_);
  return r.rc == 0 ? r.out : "";
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

void SlurmCli::Signal(const std::string& job_id, const std::string& signal) {
  RunCommand({"scancel", "--signal=" + signal, job_id}, conf_, 10);
}

std::string SlurmCli::QueueState(const std::string& job_id) {
  CommandResult r = RunCommand({"squeue", "-h", "-j", job_id, "-o", "%T"}, conf_, 5);
  return r.rc == 0 ? Trim(r.out) : "";
}

}  // namespace msaflow::launch
