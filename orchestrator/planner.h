// The planner: a pipeline, a machine and a round's candidates become the round's tasks, each
// bound to a module (cm/esb/dam) with its rank count, in dependency order (a chain here:
// load -> prepare -> train -> store -> evaluate -> select). Pure: no processes, no files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orchestrator/candidates.h"
#include "orchestrator/machine.h"
#include "orchestrator/pipeline.h"

namespace msaflow::orchestrator {

inline constexpr char kTaskFormat[] = "msaflow.task/1";  // docs/formats.md

struct Task {
  std::string id;      // "r<round>-<step>"
  std::string step;
  std::string module;  // cm | esb | dam
  int64_t ranks = 1;
  std::vector<std::string> after;  // task ids that must finish first
  nlohmann::json body;             // the task file given to `msaflow module <step> --task`
};

struct RoundPlan {
  int round = 0;
  std::vector<Task> tasks;
};

struct KeptCandidate {
  Candidate candidate;
  std::string model;   // NAM model object
  std::string result;  // NAM result object
};

RoundPlan PlanRound(const Pipeline& p, const Machine& m, const std::string& run_id, const std::string& nam_uri,
                    int round, const std::vector<Candidate>& fresh, const std::vector<KeptCandidate>& kept);

// NAM object names (docs/nam.md).
std::string ModelObject(const std::string& run, int round, const std::string& cand);
std::string ResultObject(const std::string& run, int round, const std::string& cand);
std::string BestObject(const std::string& run, int round);
std::string PreparedObject(const std::string& run, int round);

}  // namespace msaflow::orchestrator
