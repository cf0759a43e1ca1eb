#include "launch/nam_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "launch/slurm.h"

namespace msaflow::launch {
namespace {

std::string Tail(const std::string& path) {
  try {
    std::string s = ReadFile(path);
    if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  } catch (const Error&) {
    return "(no log)";
  }
}

// Waits (at most timeout_s) until Slurm is done with the job: not queued, running or still
// cleaning up (COMPLETING) once its srun has ended, so that the coordinator leaves nothing of
// its run in the queue (as the Slurm launcher does for a round's jobs when interrupted).
void WaitUntilOutOfQueue(JobRunner& jobs, Clock& clock, const std::string& job, double timeout_s) {
  static const std::set<std::string> kActive = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
                                                "SIGNALING", "STAGE_OUT",  "SUSPENDED"};
  const auto give_up = clock.Now() + std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(timeout_s));
  while (clock.Now() < give_up) {
    if (!kActive.count(jobs.QueueState(job))) return;  // ended, purged (no state) or squeue unusable
    clock.Sleep(std::chrono::milliseconds(100));
  }
}

}  // namespace

NamServerProcess::NamServerProcess(const std::string& exe, const NamSpec& spec, const std::string& persist_dir,
                                   const std::string& log_path, const std::string& ready_path, const NamLaunch& launch) {
  ::unlink(ready_path.c_str());
  std::vector<std::string> args = launch.prefix;
  for (const std::string& a : {exe, std::string("nam"), std::string("serve"), std::string("--listen"), spec.listen,
                               std::string("--provider"), spec.provider, std::string("--capacity"), spec.capacity,
                               std::string("--ready-file"), ready_path})
    args.push_back(a);
  if (!launch.token_file.empty()) {
    args.emplace_back("--token-file");
    args.push_back(launch.token_file);
  }
  if (!persist_dir.empty()) {
    args.emplace_back("--persist");
    args.push_back(persist_dir);
    if (!launch.users_lock.empty()) {
      args.emplace_back("--users-lock");
      args.push_back(launch.users_lock);
    }
    if (launch.lock_wait_s > 0) {
      args.emplace_back("--lock-wait");
      args.push_back(fmt::format("{}", launch.lock_wait_s));
    }
  }
  SpawnOptions opt;
  opt.output = SpawnOptions::Output::kFile;
  opt.output_file = log_path;
  opt.stdin_null = true;
  if (launch.detached)
    opt.new_session = true;  // not in the coordinator's process group: a Ctrl-C of one run leaves the others' server
  else
    opt.death_signal = SIGTERM;  // the coordinator died without stopping it: no NAM outlives its run
  if (launch.own_allocation)  // a new job, not a step of the one this coordinator may run in: srun must not see it
    opt.drop_env = [](const std::string& k) { return k.rfind("SLURM_", 0) == 0 && k != "SLURM_CONF"; };
  child_ = ChildProcess::Start(args, opt);
  detached_ = launch.detached;
  jobs_ = launch.jobs;
  clock_ = launch.clock;
  const auto start = clock_->Now();
  for (;;) {
    if (PathExists(ready_path)) {
      auto j = nlohmann::json::parse(ReadFile(ready_path), nullptr, false);
      if (!j.is_discarded() && j.contains("uri")) {
        uri_ = j["uri"].get<std::string>();
        if (!launch.token_file.empty()) uri_ += (uri_.find('?') == std::string::npos ? "?" : "&") +
                                                std::string("token-file=") + launch.token_file;
        slurm_job_ = j.value("slurm_job", "");
        node_ = j.value("node", "");
        return;
      }
    }
    if (child_.Poll())
      Throw(ErrorKind::kUnavailable, "the NAM server for this run exited at start (" + log_path + "):\n" + Tail(log_path));
    if (clock_->SecondsSince(start) > launch.start_timeout_s) {
      child_.Stop(SIGTERM, 5);  // srun, if it is one, ends its job on TERM
      Throw(ErrorKind::kUnavailable, fmt::format("the NAM server for this run did not come up in {:.0f} s ({}):\n{}",
                                                 launch.start_timeout_s, log_path, Tail(log_path)));
    }
    clock_->Sleep(std::chrono::milliseconds(10));
  }
}

std::string NamServerProcess::Exited() {
  if (child_.pid() <= 0) return "not running";
  const auto st = child_.Poll();
  if (!st) return "";
  std::string how = st->signal ? fmt::format("killed by signal {} ({})", st->signal, ::strsignal(st->signal))
                               : fmt::format("exited with status {}", st->code);
  // Under Slurm srun's own status says little (0 when Slurm ended the step): the job's end
  // state says why, and after NODE_FAIL which host was lost.
  if (!slurm_job_.empty() && jobs_) {
    try {
      const auto comps = ParseShowJob(jobs_->Show(slurm_job_));
      const std::string end = EndState(comps);
      if (!end.empty() && end != "COMPLETED") {
        how += "; its Slurm job ended " + DescribeState(end);
        const std::vector<std::string> lost = end == "NODE_FAIL" ? LostNodesOf(*jobs_, comps) : std::vector<std::string>{};
        if (!lost.empty()) how += "; lost node(s): " + Join(lost, ", ");
      }
    } catch (const Error&) {  // Slurm did not answer: srun's status is all there is
    }
  }
  return how;
}

NamServerProcess::~NamServerProcess() {
  if (child_.pid() <= 0 || child_.Poll()) return;
  if (detached_) {
    child_.Release();  // it outlives this run, and stops once no run uses it
    return;
  }
  if (!slurm_job_.empty() && jobs_) {
    // Under Slurm, SIGTERM to srun would kill the step outright; signal the server itself,
    // so that it stops cleanly and its step, then srun, end.
    try {
      jobs_->Signal(slurm_job_, "TERM");
      if (child_.WaitFor(10)) {
        WaitUntilOutOfQueue(*jobs_, *clock_, slurm_job_, 10);
        return;
      }
    } catch (const Error&) {  // Slurm did not answer: stop srun itself below
    }
  }
  child_.Stop(SIGTERM, 10);
}

}  // namespace msaflow::launch
