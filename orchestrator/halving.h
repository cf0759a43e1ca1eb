// Rung 0 of the halving strategy (rounds.strategy "halving"; docs/search.md): before round 1 the
// coordinator ranks the pipeline's backbones on a stratified subset of the training split
// (ranking/rank.h: leave-one-out kNN and LogME), keeps the best ceil(B / eta) by rounds.rank_by,
// and the run's rounds see only those. Decided once per run: kept in RUN_DIR/rung0.json (a resumed
// run reads the decision back rather than ranking again), journalled as "rung0", shown as lines,
// and explained by `msaflow why RUN BACKBONE`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nam/store.h"
#include "orchestrator/run_observer.h"
#include "record/journal.h"
#include "workflow/pipeline.h"
#include "workflow/rung0_features.h"

namespace msaflow::orchestrator {

inline constexpr char kRung0File[] = "rung0.json";
inline constexpr char kRung0Format[] = "msaflow.rung0/1";

struct Rung0 {
  workflow::Pipeline pipeline;  // `p` itself unless its strategy is halving; else `p` with the backbones kept
  // The kept ONNX backbones' features on rung 0's subset (when this call ranked them, not when it
  // read the decision back): PutRung0Features hands them to round 1's prepare, which then runs
  // those images through the backbone no second time.
  std::vector<workflow::SubsetFeatures> features;
};
Rung0 HalvingRung0(const workflow::Pipeline& p, const std::string& run_dir, const record::JournalWriter& journal,
                   RunObserver& obs);

// Puts each of `features` in the NAM as workflow::Rung0FeaturesObject(run, backbone). One that
// does not go in (a full NAM) is said and left out: prepare then computes those rows itself.
void PutRung0Features(nam::Store& store, const std::string& run, const std::vector<workflow::SubsetFeatures>& features,
                      RunObserver& obs);

// The decision rung 0 wrote in `run_dir`, or null when the run has none.
nlohmann::json ReadRung0(const std::string& run_dir);

// What became of `backbone` after rung 0 in the halving run in `run_dir`: the rounds it was in
// the race and on how much of the training data (the journal's round-start), and, once the run
// has its results, why it left: its best head of its last round against the heads continued.
// Empty for a backbone no round ran.
std::vector<std::string> HalvingRaceStory(const std::string& run_dir, const std::string& backbone);

}  // namespace msaflow::orchestrator
