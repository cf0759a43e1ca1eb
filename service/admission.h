// Whether a submitted pipeline may run for its user: parsed and validated with the code of
// `msaflow validate` (orchestrator/validate.h), and every file it names inside the user's
// folders once symbolic links and `..` are resolved (realpath). Nothing is written.
#pragma once

#include <string>
#include <vector>

#include "service/api_error.h"
#include "service/users.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::service {

struct Admitted {
  workflow::Pipeline pipeline;  // its source has absolute paths
  std::string machine;          // "local" or an absolute machine file, for the coordinator's --machine
  workflow::Machine machine_spec;
  std::string name;             // the run's name (the request's, else the pipeline's)
  std::vector<std::string> summary;  // validate's lines
};

// `body` is the pipeline JSON, or {"pipeline": {...}, "machine"?: "...", "name"?: "..."}.
// `service_machine` ("" = none) is the machine every run of the service uses. Relative paths
// resolve against the user's first folder. Throws ApiError: 422 invalid (with the pointer,
// message and hint as the CLI prints them), 403 a file outside the user's folders.
Admitted Admit(const std::string& body, const User& user, const std::string& service_machine,
               const std::string& user_runs_dir);

// Splits a validation message "<origin>: <pointer>: <problem> — <hint>" into its parts.
ApiError InvalidPipeline(const std::string& what, const std::string& origin);

// The real path of `path` when it lies in one of `folders` (their real paths), else "".
std::string InsideFolders(const std::string& path, const std::vector<std::string>& folders);

}  // namespace msaflow::service
