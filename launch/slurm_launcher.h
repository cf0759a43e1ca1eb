// The Slurm launcher (docs/slurm.md): each round becomes one heterogeneous job with one
// component per module the round uses, each step an `srun --het-group=K msaflow module ...`; or,
// where Slurm refuses that, one allocation, or a chain of one job per step. Built by MakeLauncher
// (launch/launcher.h) for a machine whose launcher is slurm; its scripts and Slurm's states are
// read by launch/slurm.h's functions.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "launch/job_runner.h"
#include "launch/launcher.h"
#include "workflow/machine.h"

namespace msaflow::launch {

// Runs each round as one hetjob (or one allocation, or a chain of jobs) and follows it through
// the progress file its script writes and scontrol's states. Built by MakeLauncher.
class SlurmLauncher : public Launcher {
 public:
  SlurmLauncher(Pipeline p, Machine m, LaunchContext ctx);
  void SetUpEnvironment() override;
  bool RunsStepsInCoordinator() const override { return false; }
  nlohmann::json Reattach(const Leftovers& left, const std::function<void(const std::string&)>& say) override;
  // A round whose job ends in one of the pipeline's retries.on is resubmitted (its unfinished
  // steps only), up to retries.max times.
  void RunRound(const RoundPlan& plan, const std::map<std::string, std::string>& task_files, const std::string& log_dir,
                const LaunchObserver& obs) override;
  nlohmann::json RoundAccount(const std::map<std::string, double>& step_seconds, std::string* summary) override;
  std::string PlanNam(const std::string& nam, const std::string& persist_dir) const override;
  std::string PlanText(const RoundPlan& round1, const std::string& nam, const std::string& runs_dir) const override;
  bool batch() const override { return true; }
  Submitted Submit(const SubmitRequest& req) override;
  std::string SubmittedJobEnd(const std::string& job) override;

 protected:
  void PlaceNamServer(NamLaunch* launch) const override;

 private:
  struct Attempt;  // one submission of a round (slurm.cc)
  void SubmitAttempt(Attempt& a, const LaunchObserver& obs);
  void SubmitIn(workflow::SlurmMode mode, Attempt& a, const LaunchObserver& obs);
  // Follows the attempt's jobs until every one has ended.
  void Follow(Attempt& a, const LaunchObserver& obs);
  [[noreturn]] void Interrupted(Attempt& a, int sig, const LaunchObserver& obs);
  // After the attempt's jobs ended: false when the round is done; else what failed, and true
  // when the round is tried again (kTaskFailed when not).
  bool Ended(Attempt& a, const LaunchObserver& obs);

  JobRunner& jobs() const { return *jobs_; }
  std::unique_ptr<JobRunner> own_jobs_;
  JobRunner* jobs_;
  std::vector<workflow::SlurmMode> modes_;  // slurm.mode, then its fallbacks
  size_t mode_i_ = 0;                       // the mode in use; moves on when Slurm refuses one
  // The last round's timing, for RoundAccount: when its first job was submitted, its first
  // step started and its last step ended, the mode it ran in, how many tasks it had.
  std::optional<Clock::TimePoint> submitted_, first_start_;
  Clock::TimePoint last_end_{};
  std::optional<workflow::SlurmMode> round_mode_;
  size_t round_tasks_ = 0;
};

}  // namespace msaflow::launch
