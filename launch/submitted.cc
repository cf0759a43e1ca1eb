#include "launch/submitted.h"

#include <fmt/core.h>

#include "common/child_process.h"
#include "common/error.h"
#include "launch/job_runner.h"

namespace msaflow::launch {

nlohmann::json SubmittedCoordinator::ToRecord() const { return {{"run", run}, {"job", job}, {"slurm_conf", conf}}; }

SubmittedCoordinator SubmittedCoordinator::FromRecord(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("job") || !j["job"].is_string() || j["job"].get<std::string>().empty())
    Throw(ErrorKind::kCorrupt, where + ": expected {\"job\": \"<Slurm job id>\", ...}");
  SubmittedCoordinator c;
  c.job = j["job"];
  if (j.contains("run") && j["run"].is_string()) c.run = j["run"];
  if (j.contains("slurm_conf") && j["slurm_conf"].is_string()) c.conf = j["slurm_conf"];
  return c;
}

std::vector<JobState> SubmittedCoordinator::States() const { return ParseShowJob(SlurmCli(conf).Show(job)); }

void SubmittedCoordinator::Cancel() const {
  SpawnOptions o;
  if (!conf.empty()) o.set_env = {"SLURM_CONF=" + conf};
  const Captured c = RunCaptured({"scancel", job}, o, 60);
  if (!c.status.ok())
    Throw(ErrorKind::kIo, fmt::format("scancel {}: {}{}", job, c.status.Describe(), c.err.empty() ? "" : ": " + c.err));
}

}  // namespace msaflow::launch
