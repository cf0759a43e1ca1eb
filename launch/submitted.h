// A run's coordinator handed to a batch system by `msaflow submit`, as the run directory's
// submitted record names it (record/run_dir.h: {"run", "job", "slurm_conf"}). What a process
// that did not submit it (`status`, `cancel`, the service) may ask of it, without the pipeline
// or the machine file: its job's state, and a cancel. Slurm is the batch system msaflow submits
// to; this is the one place outside the Slurm launcher that knows it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/slurm.h"

namespace msaflow::launch {

struct SubmittedCoordinator {
  std::string run, job;
  std::string conf;  // the batch system's configuration file ("" = its default)

  nlohmann::json ToRecord() const;
  // Throws kCorrupt naming `where` for a record without a job id.
  static SubmittedCoordinator FromRecord(const nlohmann::json& j, const std::string& where);

  // The coordinator job's components as the batch system shows them; empty once it has
  // forgotten the job.
  std::vector<JobState> States() const;
  // Cancels the job (the batch system sends its coordinator SIGTERM). Throws kIo with the
  // batch system's answer when it refuses.
  void Cancel() const;
  std::string Describe() const { return "Slurm job " + job; }
};

}  // namespace msaflow::launch
