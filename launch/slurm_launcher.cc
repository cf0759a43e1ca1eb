// The Slurm launcher: submitting a round (in the machine's mode, falling back when Slurm refuses
// it), following its jobs, describing how it failed, retrying; re-attaching to a dead
// coordinator's jobs; node-seconds; the plan script; `submit`.
#include "launch/slurm_launcher.h"

#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/child_process.h"
#include "common/error.h"
#include "common/files.h"
#include "common/signals.h"
#include "common/strings.h"
#include "launch/node_seconds.h"
#include "launch/slurm.h"

namespace msaflow::launch {

using nlohmann::json;

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


struct SlurmLauncher::Attempt {
  int round = 0, number = 0;
  std::vector<Task> todo;  // the round's tasks not finished in an earlier attempt
  const std::map<std::string, std::string>* task_files = nullptr;
  std::string log_dir, slurm_dir;
  SlurmScriptParams sp;
  std::vector<std::string> jobs;  // leader ids, in order
  std::set<std::string>* done = nullptr;  // tasks finished with status 0, over all attempts
  // Following the jobs.
  std::set<std::string> announced, finished;
  std::map<std::string, size_t> log_offset;
  std::map<std::string, std::vector<JobState>> last;  // job -> its components' last states
  Progress progress;
};

namespace {

void Emit(const LaunchObserver& obs, const std::string& name, json fields) {
  if (obs.on_event) obs.on_event(name, std::move(fields));
}

}  // namespace

SlurmLauncher::SlurmLauncher(Pipeline p, Machine m, LaunchContext ctx)
    : Launcher(std::move(p), std::move(m), std::move(ctx)), jobs_(ctx_.jobs) {
  if (!jobs_) {
    own_jobs_ = std::make_unique<SlurmCli>(m_.slurm.conf);
    jobs_ = own_jobs_.get();
  }
  modes_.push_back(m_.slurm.mode);
  for (const auto& f : m_.slurm.fallback)
    if (std::find(modes_.begin(), modes_.end(), f) == modes_.end()) modes_.push_back(f);
}

void SlurmLauncher::SetUpEnvironment() {
  if (!m_.slurm.conf.empty()) ::setenv("SLURM_CONF", m_.slurm.conf.c_str(), 1);  // for the jobs' own srun, and the NAM's
}

void SlurmLauncher::RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                             const std::string& log_dir, const LaunchObserver& obs) {
  const std::string slurm_dir = ctx_.run_dir + "/slurm";
  MakeDirs(slurm_dir);
  submitted_.reset();
  first_start_.reset();
  round_mode_.reset();
  round_tasks_ = plan.tasks.size();
  // The round's timing for RoundAccount, seen through the observer the coordinator gave.
  LaunchObserver timed = obs;
  timed.on_start = [&](const Task& t) {
    if (!first_start_) first_start_ = ctx_.clock->Now();
    if (obs.on_start) obs.on_start(t);
  };
  timed.on_end = [&](const Task& t, double secs) {
    last_end_ = ctx_.clock->Now();
    if (obs.on_end) obs.on_end(t, secs);
  };
  std::set<std::string> done;
  for (int attempt = 0;; ++attempt) {
    Attempt a;
    a.round = plan.round;
    a.number = attempt;
    for (const Task& t : plan.tasks)
      if (!done.count(t.id)) a.todo.push_back(t);
    if (a.todo.empty()) return;
    a.task_files = &task_files;
    a.log_dir = log_dir;
    a.slurm_dir = slurm_dir;
    a.done = &done;
    a.sp = {ctx_.run_id,  ctx_.run_dir, log_dir, fmt::format("{}/round-{}.{}.progress", slurm_dir, plan.round, attempt),
            ctx_.msaflow_exe, plan.round};
    ::unlink(a.sp.progress.c_str());
    SubmitAttempt(a, timed);
    Follow(a, timed);
    if (!Ended(a, timed)) return;
  }
}

// Submits the attempt in the mode in use; when Slurm refuses it, in the next fallback mode.
void SlurmLauncher::SubmitAttempt(Attempt& a, const LaunchObserver& obs) {
  for (;;) {
    try {
      SubmitIn(modes_[mode_i_], a, obs);
      if (!submitted_) submitted_ = ctx_.clock->Now();
      if (!round_mode_) round_mode_ = modes_[mode_i_];
      return;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kTaskFailed || mode_i_ + 1 >= modes_.size()) throw;
      const std::string from = workflow::SlurmModeName(modes_[mode_i_]),
                        to = workflow::SlurmModeName(modes_[mode_i_ + 1]);
      Emit(obs, "slurm-fallback", {{"round", a.round}, {"from", from}, {"to", to}, {"why", e.what()}});
      if (obs.on_line)
        obs.on_line(a.todo.front(), fmt::format("Slurm refused the {} mode, falling back to {}: {}", from, to, e.what()));
      ++mode_i_;
    }
  }
}

// Submits the attempt in `mode`; throws kTaskFailed when Slurm refuses it (having cancelled
// whatever of it was already submitted).
void SlurmLauncher::SubmitIn(workflow::SlurmMode mode, Attempt& a, const LaunchObserver& obs) {
  if (mode != workflow::SlurmMode::kChained) {  // one job for the round
    const bool het = mode == workflow::SlurmMode::kHetjob;
    std::string script = fmt::format("{}/round-{}.{}{}.sh", a.slurm_dir, a.round, a.number, het ? "" : ".single");
    WriteFileAtomic(
        script, het ? HetjobScript(a.todo, m_, *a.task_files, a.sp) : SingleScript(a.todo, m_, *a.task_files, a.sp));
    a.jobs.push_back(jobs().Submit(script, {}));
    json comps = json::array();
    auto cs = Components(a.todo);
    for (size_t i = 0; i < cs.size(); ++i) {
      const ModuleSpec& ms = m_.Module(cs[i].first, "machine");
      if (het) {
        comps.push_back({{"id", a.jobs[0] + "+" + std::to_string(i)}, {"module", cs[i].first},
                         {"partition", ms.partition}});
      } else {
        comps.push_back({{"id", a.jobs[0]}, {"module", cs[i].first}, {"partition", m_.slurm.partition},
                         {"nodes", ms.nodes}, {"feature", ms.feature}});
      }
    }
    Emit(obs, "slurm-job",
         {{"round", a.round},
          {"attempt", a.number},
          {"mode", workflow::SlurmModeName(mode)},
          {"job", a.jobs[0]},
          {"script", script},
          {"components", comps}});
    return;
  }
  std::string prev;  // chained: one job per step
  for (const Task& t : a.todo) {
    std::string script = fmt::format("{}/round-{}.{}.{}.sh", a.slurm_dir, a.round, a.number, workflow::StepName(t.step));
    WriteFileAtomic(script, ChainedScript(t, m_, *a.task_files, a.sp));
    std::vector<std::string> extra;
    if (!prev.empty()) extra = {"--dependency=afterok:" + prev, "--kill-on-invalid-dep=yes"};
    try {
      prev = jobs().Submit(script, extra);
    } catch (...) {
      for (const auto& j : a.jobs) jobs().Cancel(j);
      a.jobs.clear();
      throw;
    }
    a.jobs.push_back(prev);
    Emit(obs, "slurm-job", {{"round", a.round}, {"attempt", a.number}, {"mode", "chained"}, {"job", prev},
                            {"task", t.id}, {"script", script},
                            {"components", json::array({{{"id", prev}, {"module", t.module},
                                                         {"partition", m_.Module(t.module, "machine").partition}}})}});
  }
}

namespace {

// srun exits 128 + N when a signal ended one of the step's tasks (msaflow's modules exit below
// 128: docs/cli.md), and its log says which: "srun: error: <node>: task <R>: Killed". Such a
// step failed SIGNALED, as a local one does; "" when `rc` is not a signal's. The rank named is
// the first one a signal other than SIGTERM ended: the others were ended by srun tearing the
// step down (SIGTERM), and srun's own status is the highest of its tasks' (143 beside a 137).
std::string RankSignal(int rc, const std::string& log_path) {
  if (rc <= 128 || rc > 128 + 64) return "";
  std::string text, who = "a rank";
  int sig = rc - 128;
  try {
    text = ReadFile(log_path);
  } catch (const Error&) {  // no log: the rank stays unnamed
  }
  const std::string mark = "srun: error: ";
  bool cause = false;
  for (size_t at = text.find(mark); at != std::string::npos && !cause; at = text.find(mark, at + 1)) {
    const std::string line = text.substr(at, text.find('\n', at) - at);
    const size_t task = line.find(": task ");
    if (task == std::string::npos) continue;
    char* end = nullptr;
    const long rank = std::strtol(line.c_str() + task + 7, &end, 10);
    if (end == line.c_str() + task + 7 || *end != ':' || rank < 0) continue;
    std::string name = end + 1;
    while (!name.empty() && name.front() == ' ') name.erase(0, 1);
    int named = 0;
    for (int s = 1; s < 65 && !named; ++s)
      if (const char* d = ::strsignal(s); d && name == d) named = s;
    if (named == 0) continue;  // "task 0: Exited with exit code 2": not a signal
    if (who == "a rank" || named != SIGTERM) {
      who = fmt::format("rank {} (on {})", rank, line.substr(mark.size(), task - mark.size()));
      sig = named;
      cause = named != SIGTERM;
    }
  }
  return who + " ended by " + ExitStatus{-1, sig}.Describe();
}

// The task's log lines not relayed yet (a line being written is relayed next time).
void RelayLog(const Task& t, const std::string& log_dir, size_t* offset, const LaunchObserver& obs) {
  std::string text;
  try {
    text = ReadFile(log_dir + "/" + t.id + ".log");
  } catch (const Error&) {
    return;
  }
  while (*offset < text.size()) {
    size_t nl = text.find('\n', *offset);
    if (nl == std::string::npos) break;
    if (obs.on_line) obs.on_line(t, text.substr(*offset, nl - *offset));
    *offset = nl + 1;
  }
}

}  // namespace

// The coordinator is asked to stop: its jobs go with it.
void SlurmLauncher::Interrupted(Attempt& a, int sig, const LaunchObserver& obs) {
  for (const auto& j : a.jobs) jobs().Cancel(j);
  // Let Slurm end the steps and clean up (COMPLETING) before the coordinator goes, so nothing
  // of the run is left in the queue: at most 30 s, then the leftovers below.
  const auto give_up = ctx_.clock->Now() + std::chrono::seconds(30);
  for (bool gone = false; !gone && ctx_.clock->Now() < give_up;) {
    ctx_.clock->Sleep(std::chrono::milliseconds(200));
    gone = true;
    for (const auto& j : a.jobs)
      for (const auto& c : ParseShowJob(jobs().Show(j))) gone = gone && IsTerminal(c.state);
  }
  int leftovers = EndLeftoverSruns(ReadProgress(a.sp.progress));
  std::string list;
  for (const auto& j : a.jobs) list += (list.empty() ? "" : ", ") + j;
  std::string msg = fmt::format("round {}: interrupted by signal {}; cancelled Slurm job(s) {}", a.round, sig, list);
  if (leftovers) msg += fmt::format("; {} leftover srun process(es) ended", leftovers);
  Emit(obs, "slurm-interrupted", {{"round", a.round}, {"signal", sig}, {"jobs", a.jobs}, {"message", msg}});
  Throw(ErrorKind::kTaskFailed, msg);
}

// Follows the jobs: progress lines from the scripts, states from scontrol, until every job is
// terminal.
void SlurmLauncher::Follow(Attempt& a, const LaunchObserver& obs) {
  auto announce_ends = [&] {
    for (const Task& t : a.todo)
      if (a.progress.ended.count(t.id) && a.progress.ended[t.id] == 0 && !a.finished.count(t.id)) {
        a.finished.insert(t.id);
        a.done->insert(t.id);
        if (obs.on_end) obs.on_end(t, a.progress.end_time[t.id] - a.progress.start_time[t.id]);
      }
  };
  for (;;) {
    if (int sig = InterruptSignal()) Interrupted(a, sig, obs);
    if (std::string dead = obs.check ? obs.check() : ""; !dead.empty()) {
      for (const auto& j : a.jobs) jobs().Cancel(j);
      Emit(obs, "slurm-cancelled", {{"round", a.round}, {"jobs", a.jobs}, {"message", dead}});
      Throw(ErrorKind::kUnavailable, dead + "; the round's Slurm job(s) were cancelled");
    }
    a.progress = ReadProgress(a.sp.progress);
    for (const Task& t : a.todo) {
      if (a.progress.started.count(t.id) && !a.announced.count(t.id)) {
        a.announced.insert(t.id);
        if (obs.on_start) obs.on_start(t);
      }
      if (a.announced.count(t.id)) RelayLog(t, a.log_dir, &a.log_offset[t.id], obs);
      if (a.progress.ended.count(t.id) && !a.finished.count(t.id)) {
        a.finished.insert(t.id);
        if (a.progress.ended[t.id] == 0) {
          a.done->insert(t.id);
          if (obs.on_end) obs.on_end(t, a.progress.end_time[t.id] - a.progress.start_time[t.id]);
        }
      }
    }
    bool all_terminal = true;
    for (const auto& j : a.jobs) {
      auto comps = ParseShowJob(jobs().Show(j));
      if (comps.empty()) {
        // Forgotten by Slurm (older than MinJobAge): its last known state stands.
        if (a.last[j].empty()) a.last[j] = {JobState{j, j, -1, "FAILED", "vanished", 1, 0, "", ""}};
        continue;
      }
      if (!a.last[j].empty() && StatesJson(a.last[j]) != StatesJson(comps))
        Emit(obs, "slurm-state", {{"round", a.round}, {"job", j}, {"components", StatesJson(comps)}});
      a.last[j] = comps;
      if (EndState(comps).empty()) all_terminal = false;
    }
    if (!all_terminal) {
      // Chained: once a job fails, later jobs never start; stop waiting for them.
      bool failed = false;
      for (const auto& j : a.jobs) {
        const std::string e = EndState(a.last[j]);
        failed = failed || (!e.empty() && e != "COMPLETED");
      }
      if (failed)
        for (const auto& j : a.jobs)
          if (EndState(a.last[j]).empty()) jobs().Cancel(j);
      ctx_.clock->SleepSeconds(m_.slurm.poll_s);
      continue;
    }
    a.progress = ReadProgress(a.sp.progress);
    for (const Task& t : a.todo) RelayLog(t, a.log_dir, &a.log_offset[t.id], obs);
    announce_ends();
    return;
  }
}

// Every job of the attempt is terminal: the summary event, then whether the round completed
// (false); if not, what failed and how, and either a retry (true) or kTaskFailed.
bool SlurmLauncher::Ended(Attempt& a, const LaunchObserver& obs) {
  const int leftovers = EndLeftoverSruns(a.progress);
  std::string end_state = "COMPLETED", bad_job, why;
  for (const auto& j : a.jobs) {
    std::string e = EndState(a.last[j]);
    if (e != "COMPLETED") {
      end_state = e;
      bad_job = j;
      break;
    }
  }
  json summary = json::array();
  for (const auto& j : a.jobs) summary.push_back({{"job", j}, {"components", StatesJson(a.last[j])}});
  Emit(obs, "slurm-end", {{"round", a.round}, {"attempt", a.number}, {"state", end_state}, {"jobs", summary},
                          {"leftover_sruns_killed", leftovers}});
  if (end_state == "COMPLETED") {
    for (const Task& t : a.todo)
      if (!a.done->count(t.id)) {
        end_state = "FAILED";
        why = "task " + t.id + " never reported its end";
      }
    if (why.empty()) return false;  // the round is done
  }
  // Which task failed, and how.
  std::string comp_desc;
  for (const auto& c : a.last[bad_job.empty() ? a.jobs.back() : bad_job])
    comp_desc += (comp_desc.empty() ? "" : ", ") + c.id + " " + c.partition + " " + c.state +
                 (c.state == "FAILED" ? " exit " + std::to_string(c.exit_code) : "");
  std::string failed_task;
  for (const Task& t : a.todo)
    if (!a.done->count(t.id) && (a.progress.started.count(t.id) || failed_task.empty())) {
      failed_task = t.id;
      if (a.progress.started.count(t.id)) break;
    }
  std::string msg = fmt::format("round {} (attempt {}): Slurm job {} ended {}; components: {}", a.round, a.number + 1,
                                bad_job.empty() ? a.jobs.back() : bad_job, DescribeState(end_state), comp_desc);
  if (end_state == "NODE_FAIL") {  // which host was lost, as Slurm saw it
    const std::vector<std::string> lost = LostNodesOf(jobs(), a.last[bad_job.empty() ? a.jobs.back() : bad_job]);
    if (!lost.empty()) msg += "; lost node(s): " + Join(lost, ", ");
  }
  std::string reason = end_state;  // what retries.on is matched against
  if (!failed_task.empty()) {
    const std::string log = a.log_dir + "/" + failed_task + ".log";
    std::string how = a.progress.started.count(failed_task) ? "did not finish" : "never started";
    if (a.progress.ended.count(failed_task)) {
      const int rc = a.progress.ended[failed_task];
      how = "exited with status " + std::to_string(rc);
      const std::string signal = end_state == "FAILED" ? RankSignal(rc, log) : "";
      if (!signal.empty()) {
        how += " (" + signal + ")";
        reason = "SIGNALED";
      }
    }
    std::string text;
    try {
      text = ReadFile(log);
    } catch (const Error&) {  // no log: nothing more to say
    }
    if (const std::string launch = LaunchFailure(text); !launch.empty() && reason != "SIGNALED") how += " (" + launch + ")";
    msg += fmt::format("; task {} {} (log {})", failed_task, how, log);
    if (const std::string said = FirstError(text); !said.empty()) msg += "\n  last output: " + said;
  }
  if (!why.empty()) msg += "; " + why;
  if (leftovers) msg += fmt::format("; {} leftover srun process(es) ended", leftovers);
  const bool retry =
      a.number < retries() && std::find(retry_on().begin(), retry_on().end(), reason) != retry_on().end();
  Emit(obs, retry ? "slurm-retry" : "slurm-failed",
       {{"round", a.round}, {"attempt", a.number}, {"state", end_state}, {"reason", reason}, {"message", msg}});
  if (!retry) Throw(ErrorKind::kTaskFailed, msg);
  if (obs.on_line) obs.on_line(a.todo.front(), "retrying: " + msg);
  return true;
}

json SlurmLauncher::RoundAccount(const std::map<std::string, double>& step_seconds, std::string* summary) {
  if (!first_start_) return nullptr;
  const double round_s = std::chrono::duration<double>(last_end_ - *first_start_).count();
  const double queue_s = submitted_ ? std::chrono::duration<double>(*first_start_ - *submitted_).count() : 0;
  const workflow::SlurmMode mode = round_mode_.value_or(m_.slurm.mode);
  const auto measured = MeasureNodeSeconds(step_seconds, p_, m_, mode, round_s);
  json ns = json::array();
  for (const auto& n : measured)
    ns.push_back({{"module", n.module}, {"nodes", n.nodes}, {"held_s", n.held_s}, {"used_s", n.used_s}});
  if (summary) *summary = NodeSecondsSummary(measured, mode, round_tasks_, std::max(queue_s, 0.5));
  return {{"mode", workflow::SlurmModeName(mode)}, {"round_s", round_s}, {"queue_s", queue_s}, {"modules", ns}};
}

// Slurm jobs the dead coordinator submitted run on without it: wait for them to end rather than
// submit their tasks again; their done objects then say what they finished. When the NAM server
// they use was the dead coordinator's own Slurm job and it has ended, they cannot finish: they
// are cancelled instead of waited for.
json SlurmLauncher::Reattach(const Leftovers& left, const std::function<void(const std::string&)>& say) {
  if (left.jobs.empty()) return nullptr;
  json states = json::array();
  if (!left.nam_job.empty()) {
    const auto nam = ParseShowJob(jobs().Show(left.nam_job));
    if (nam.empty() || !EndState(nam).empty()) {
      for (const std::string& job : left.jobs) jobs().Cancel(job);
      say(fmt::format("the previous coordinator's NAM server (Slurm job {}) has ended, so its round's "
                      "job(s) cannot finish: cancelled them",
                      left.nam_job));
    }
  }
  for (const std::string& job : left.jobs) {
    bool said = false;
    for (;;) {
      const auto comps = ParseShowJob(jobs().Show(job));
      const std::string end = comps.empty() ? "gone" : EndState(comps);
      if (!end.empty()) {
        states.push_back({{"job", job}, {"state", end}});
        break;
      }
      if (!said) {
        say(fmt::format("re-attached to Slurm job {} ({}), which the previous coordinator submitted; "
                        "waiting for it to end",
                        job, comps.front().state));
        said = true;
      }
      if (int sig = InterruptSignal()) {
        jobs().Cancel(job);
        Throw(ErrorKind::kTaskFailed,
              fmt::format("interrupted by signal {} while waiting for Slurm job {}; cancelled it", sig, job));
      }
      ctx_.clock->SleepSeconds(m_.slurm.poll_s);
    }
  }
  return {{"jobs", states}};
}

void SlurmLauncher::PlaceNamServer(NamLaunch* l) const {
  l->jobs = jobs_;  // a server that finds itself in a Slurm job is stopped through it
  if (m_.nam.module.empty()) return;
  const ModuleSpec& s = m_.Module(m_.nam.module, "machine " + m_.name + ": /nam/module");
  if (const char* group = std::getenv("MSAFLOW_NAM_HET_GROUP")) {
    // The coordinator was submitted with the NAM as a component of its own job.
    l->prefix = {"srun", std::string("--het-group=") + group, "--nodes=1", "--ntasks=1", "--mpi=none",
                 "--kill-on-bad-exit=1"};
  } else {
    // Its own job on the module's nodes, for as long as this run lasts.
    l->prefix = {"srun", "--job-name=msaflow-" + ctx_.run_id + "-nam", "--partition=" + s.partition, "--nodes=1",
                 "--ntasks=1", "--time=" + s.time, "--mpi=none", "--kill-on-bad-exit=1"};
    if (!s.constraint.empty()) l->prefix.push_back("--constraint=" + s.constraint);
    l->own_allocation = true;
  }
  l->start_timeout_s = 300;  // an allocation may have to wait
}

std::string SlurmLauncher::PlanNam(const std::string& nam, const std::string& persist_dir) const {
  (void)persist_dir;
  return nam == "serve" ? "fabric://<NAM server started for the run>" : nam;
}

std::string SlurmLauncher::PlanText(const RoundPlan& rp, const std::string& nam, const std::string& runs_dir) const {
  std::string out;
  if (nam.rfind("fabric://<", 0) == 0) {
    if (!m_.nam.module.empty())
      out += fmt::format(
          "# NAM server: srun msaflow nam serve on module {} (partition {}), a job of its own under "
          "`msaflow run`, a component of the coordinator's job under `msaflow submit`\n",
          m_.nam.module, m_.Module(m_.nam.module, "nam").partition);
    else
      out += "# NAM server: msaflow nam serve, started by the coordinator where it runs\n";
  }
  const std::string rd = runs_dir + "/<run-id>";
  std::map<std::string, std::string> files;
  for (const auto& t : rp.tasks) files[t.id] = rd + "/tasks/" + t.id + ".json";
  SlurmScriptParams sp{"<run-id>", rd, rd + "/logs", rd + "/slurm/round-1.0.progress", ctx_.msaflow_exe, 1};
  if (m_.slurm.mode == workflow::SlurmMode::kChained) {
    for (const auto& t : rp.tasks) {
      out += fmt::format("# --- job for {}{}\n", t.id,
                         t.after.empty() ? "" : " (sbatch --dependency=afterok:<previous> --kill-on-invalid-dep=yes)");
      out += ChainedScript(t, m_, files, sp);
    }
  } else if (m_.slurm.mode == workflow::SlurmMode::kSingle) {
    out += SingleScript(rp.tasks, m_, files, sp);
  } else {
    out += HetjobScript(rp.tasks, m_, files, sp);
  }
  return out;
}

Submitted SlurmLauncher::Submit(const SubmitRequest& req) {
  const std::string& rd = ctx_.run_dir;
  const ModuleSpec& cm = m_.Module("cm", "submit: the coordinator");
  // With a NAM module, the NAM server is component 1 of the coordinator's job: it lives
  // exactly as long as the run.
  const bool nam_component = p_.nam.empty() && m_.nam.uri.empty() && m_.nam.serve && !m_.nam.module.empty();
  std::string nam_part;
  if (nam_component) {
    const ModuleSpec& nm = m_.Module(m_.nam.module, "submit: the NAM server");
    nam_part = "#SBATCH hetjob\n#SBATCH --partition=" + nm.partition + " --nodes=1 --ntasks=1 --time=" + nm.time +
               (nm.constraint.empty() ? "" : " --constraint=" + nm.constraint) +
               "\n# component 1: the run's NAM server (module " + m_.nam.module + ")\nexport MSAFLOW_NAM_HET_GROUP=1\n";
  }
  // --no-requeue: a coordinator requeued after its node failed would start the run again over
  // its own journal; it ends instead, and `msaflow resume` continues the run.
  const std::string script = "#!/bin/bash\n#SBATCH --job-name=msaflow-" + ctx_.run_id + "\n#SBATCH --output=" + rd +
                             "/coordinator.out\n#SBATCH --no-requeue\n#SBATCH --partition=" + cm.partition +
                             " --nodes=1 --ntasks=1 --time=" + cm.time + "\n" + nam_part +
                             "# the coordinator of run " + ctx_.run_id + ": it submits one job per round\nexec " +
                             ShellQuote(ctx_.msaflow_exe) + " run " + ShellQuote(req.pipeline_path) + " --runs " +
                             ShellQuote(req.runs_dir) + " --run-id " + ctx_.run_id + " --machine " +
                             ShellQuote(req.machine_arg) + "\n";
  WriteFileAtomic(rd + "/coordinator.sh", script);
  Submitted s;
  s.job = jobs().Submit(rd + "/coordinator.sh", {});
  s.where = cm.partition;
  return s;
}

std::string SlurmLauncher::SubmittedJobEnd(const std::string& job) {
  const auto comps = ParseShowJob(jobs().Show(job));
  return comps.empty() ? "FAILED" : EndState(comps);
}

}  // namespace msaflow::launch
