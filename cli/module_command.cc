#include <fmt/core.h>

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "common/files.h"
#include "common/strings.h"
#include "modules/steps.h"
#include "parallel/mpi_comm.h"
#include "workflow/kinds.h"

namespace msaflow::cli {

// `msaflow module STEP --task FILE`: one rank of a step. MPI is initialised here when an MPI
// launcher started the process; one started alone is rank 0 of 1, without MPI
// (parallel/mpi_comm.h). An error on any rank ends every rank, so none is left waiting in a
// collective.
int RunModule(const std::string& step, const std::string& task_file, int* argc, char*** argv) {
  parallel::MpiSession mpi(argc, argv);
  parallel::Comm& world = mpi.world();
  try {
    std::string text = ReadFile(task_file);
    nlohmann::json task = nlohmann::json::parse(text, nullptr, false);
    if (task.is_discarded()) Throw(ErrorKind::kInvalidInput, task_file + ": not valid JSON");
    // Under Slurm, say where this rank runs: the launch modes are checked by it, and users
    // read it when a node misbehaves.
    if (const char* node = std::getenv("SLURMD_NODENAME")) {
      const char* job = std::getenv("SLURM_JOB_ID");
      const char* st = std::getenv("SLURM_STEP_ID");
      char host[256] = {0};
      ::gethostname(host, sizeof host - 1);
      std::printf("rank %d/%d on node %s (host %s, Slurm job %s, step %s), %d thread%s\n", world.rank(), world.size(),
                  node, host, job ? job : "?", st ? st : "?", mpi.threads(), mpi.threads() > 1 ? "s" : "");
      std::fflush(stdout);
    }
    modules::RunStep(workflow::ParseStep(step, "step"), task, world, stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow: error: %s%s\n", world.size() > 1 ? fmt::format("[rank {}] ", world.rank()).c_str() : "",
                 OneLine(e.message()).c_str());
    std::fflush(stderr);
    mpi.AbortIfParallel(ExitCode(e.kind()));
    return ExitCode(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msaflow: internal error: %s\n", e.what());
    std::fflush(stderr);
    mpi.AbortIfParallel(70);
    return 70;
  }
}

}  // namespace msaflow::cli
