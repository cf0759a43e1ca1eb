// `msaflow simulate`: a discrete-event model of a whole run on a Modular Supercomputer
// Architecture, on SimGrid's S4U (hosts, links, actors, activities). What each step costs comes
// from earlier runs (their results' "costs" and their journals' bytes to and from the NAM),
// never from guesses; the machine, the ranks and the data size may be other than measured.
// docs/simulate.md: the model, what it leaves out, how to calibrate it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow::simulate {

// One step of one round as measured: its divisible work and what does not divide.
struct StepModel {
  workflow::Step step = workflow::Step::kLoad;
  int64_t ranks = 1;        // the ranks it ran with
  double per_item_s = 0;    // divisible work per item (image pass, training update, task) in
                            // rank-seconds as measured; once calibrated, core-seconds per unit of size
  double size = 0;          // what the work grows with: items; for evaluate, the bytes it read
  double fixed_core_s = 0;  // once calibrated: the work that does not grow with the size
  std::map<bool, double> serial_by_ranks;  // once calibrated: serial_s for one rank (false), several (true)
  int64_t per_node = 0;     // the most ranks it had on one node (0: not recorded, all on one)
  int64_t threads = 0;      // the fewest threads a rank had (0: not recorded)
  int64_t items = 0;        // items in that round
  double serial_s = 0;      // per process: start-up, reading inputs, committing
  double nam_in_bytes = 0;  // all ranks together, from the NAM
  double nam_out_bytes = 0; // ... and to it
  double model_bytes = 0;   // train: the bytes of one trained model (what an allreduce moves per step)
  bool finetunes = false;   // train: the round fine-tuned (an update runs a tail forward and backward),
                            // so its work is fitted apart from the rounds that train heads alone
  double measured_s = 0;    // the step's wall time as it ran
};

// What earlier runs of the pipeline measured. Per item and per process figures are pooled over
// every matching run and round (work over items; serial time by median); the items of each round
// are the latest run's.
struct Calibration {
  std::vector<std::string> runs;                         // the run directories used
  std::vector<std::map<workflow::Step, StepModel>> rounds;  // per round, by step
  std::vector<double> measured_round_s;                  // the latest run's rounds as they ran
  std::string launcher;                                  // the latest run's: "local" or "slurm"
  double queue_wait_s = 0;                               // Slurm: a round's wait in the queue (median)
  double job_overhead_s = 0;  // Slurm: per job, what a round took beyond its queue wait and its steps (median)
  // Slurm, chained: from a job's step ending to the next job's step starting (median); < 0 when
  // no chained round was measured (then each later job waits as a round's first does).
  double chain_wait_s = -1;
  int64_t cores = 1;  // of a node the runs ran on: taken as this machine's (calibrate where you simulate from)
};
// `from` is a run directory or a directory of them; only runs of pipeline `p.name` with costs
// recorded count. `nodes_share_cores`: the runs' nodes were namespaces of this machine (the
// machine file's slurm.nodes_share_cores), so a step's ranks shared its cores wherever they ran.
// Throws kNotFound when no run counts, kCorrupt naming a file that is not a run's.
Calibration Calibrate(const std::string& from, const workflow::Pipeline& p, bool nodes_share_cores = false);

struct Options {
  std::map<workflow::Step, int64_t> ranks;  // step -> ranks; default: the pipeline's
  std::map<std::string, int64_t> nodes;  // module -> nodes; default: the machine's
  double data_scale = 1;                 // images x this (prepare and train work, NAM bytes)
  int64_t rounds = 0;                    // 0: as many as the latest calibrating run had
  double link_bytes_per_s = 12.5e9;      // each node's link to the fabric (100 Gb/s)
  double latency_s = 1.5e-6;             // per message
  double queue_wait_s = -1;              // Slurm: each job's wait before it starts; < 0: as measured
  std::string slurm_mode;                // "hetjob" | "chained"; default: the machine's
};

struct StepResult {
  workflow::Step step = workflow::Step::kLoad;
  std::string module;
  int64_t ranks = 1, nodes = 1;
  double start_s = 0, seconds = 0;
  double measured_s = 0;  // the calibrating run's, where the ranks and data are the same
};
struct RoundResult {
  int64_t round = 0;
  double start_s = 0, seconds = 0;
  std::vector<StepResult> steps;
};
struct NodeSeconds {
  double held = 0, used = 0;
};
struct Result {
  double makespan_s = 0;
  std::vector<RoundResult> rounds;
  std::map<std::string, NodeSeconds> node_seconds;  // per module
  nlohmann::json placement;                         // what ran where, and the ranks the model favours
  double simulation_wall_s = 0;                     // how long the simulation itself took
  int64_t hosts = 0, actors = 0;
};

// Runs the model once (SimGrid allows one engine per process). Throws kInvalidInput for options
// the machine cannot meet (a module it lacks, ranks or nodes below 1).
// Whether this msaflow was built with SimGrid (meson option `simulate`); without it Simulate
// and FavouredRanks throw kUnsupported saying what they need, and RequireSimGrid(what) does.
bool HaveSimGrid();
void RequireSimGrid(const std::string& what);

Result Simulate(const workflow::Pipeline& p, const workflow::Machine& m, const Calibration& c, const Options& o);
// The ranks the model favours for prepare, train (sync and independent) and evaluate, from the
// calibration alone, without running the simulation: each step's seconds at 1, 2, 4 ... ranks
// up to its limit (the module's max_ranks; locally also this machine's cores) by the model's
// uncontended time (and at the limit itself), the next taken while it saves >= 5 %. What
// `plan --ranks auto` and `run --ranks auto` use, and the same as
// Result::placement["favoured_ranks"]: {step: {"ranks", "seconds", "seconds_by_ranks" {"1": s,
// "2": s, ...}, "work_s" (core-seconds that divide), "serial_s" (one rank's that do not),
// "round" (the round whose work was largest), "limit"}}.
nlohmann::json FavouredRanks(const workflow::Pipeline& p, const workflow::Machine& m, const Calibration& c,
                             const Options& o);
nlohmann::json ToJson(const Result& r);
std::string Table(const Result& r);

}  // namespace msaflow::simulate
