// The msaflow command line: the options every command reads (bound by cli/main.cc), the
// commands, a file per family (cli/run_commands.cc, cli/nam_commands.cc,
// cli/module_command.cc), and what they share. Exit codes (docs/cli.md):
//   0 success · 1 a task or run failed · 2 usage error · 3 invalid input · 4 not found
//   5 corrupt data · 6 unsupported · 7 I/O error · 8 NAM unavailable · 9 NAM full · 70 internal
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "nam/server.h"
#include "nam/store.h"
#include "orchestrator/scaling.h"
#include "ranking/rank.h"
#include "service/http_server.h"
#include "simulate/simulate.h"

namespace msaflow::cli {

struct Options {
  std::string pipeline_path, machine_override, runs_dir = "runs", run_id, task_file, run_dir, step;
  std::string launcher_override, ranks_choice = "pipeline";
  bool wait = false;
  bool structure_only = false;  // validate: the pipeline file alone
  orchestrator::ScalingOptions scaling_opt;
  std::string scaling_ranks = "1,2", scaling_steps = "prepare,train,evaluate", scaling_modes;
  nam::ServerOptions sopt;
  std::string capacity = "1GiB";
  bool no_map = false;
  std::string nam_uri, obj_name, obj_file, meta_text, out_file, prefix;
  bool as_json = false, repair = false;
  std::string why_task;
  std::string resume_reason;    // resume --reason
  service::ServeOptions serve;  // serve
  std::vector<std::string> serve_models;  // serve --model NAME=PATH
  std::string users_file, user_name, user_account;  // users
  std::vector<std::string> user_allow;
  int64_t user_max_running = 0;
  std::string candidate, labels;  // export, predict
  bool with_preprocessing = false;
  std::vector<std::string> images;
  int64_t top = 3, limit = 0, predict_batch = 64;
  ranking::RankOptions rank;   // rank
  simulate::Options sim;       // simulate
  std::string sim_from;
  std::vector<std::string> sim_ranks, sim_nodes;
};

// Pipelines and runs (cli/run_commands.cc).
int Validate(Options& o);
int PlanOrRun(Options& o, bool plan);  // plan: print round 1's plan; else run the pipeline here
int Scaling(Options& o);
int Rank(Options& o);  // the backbones by kNN and LogME on a subset (docs/search.md)
int Simulate(Options& o);  // a run's model on SimGrid, calibrated by earlier runs (docs/simulate.md)
int Submit(Options& o);
int Status(Options& o);
int Why(Options& o);
int Report(Options& o);
int Resume(Options& o);
int Cancel(Options& o);
// The service and its users file (cli/service_commands.cc).
int Serve(Options& o);
// A run's model outside msaflow (cli/model_commands.cc, docs/inference.md).
int Export(Options& o);
int Predict(Options& o);
int UsersAdd(Options& o);
int UsersRemove(Options& o);
int UsersList(Options& o);
// The NAM by hand (cli/nam_commands.cc).
int NamServe(Options& o);
int NamPut(Options& o);
int NamGet(Options& o);
int NamStat(Options& o);
int NamLs(Options& o);
int NamRm(Options& o);
int NamVerify(Options& o);
int NamDf(Options& o);
// One step as an MPI program (cli/module_command.cc).
int RunModule(const std::string& step, const std::string& task_file, int* argc, char*** argv);

// Shared (cli/util.cc).
int ExitCode(ErrorKind k);
std::string SelfExe();
// "a,b,c" -> {"a", "b", "c"}; an empty item is a usage error naming the option.
std::vector<std::string> SplitList(const std::string& s, const std::string& option);
// --nam, else $MSAFLOW_NAM; throws kInvalidInput when neither is given.
std::string NamUri(const std::string& flag);
void PrintInfo(const nam::ObjectInfo& i);

}  // namespace msaflow::cli
