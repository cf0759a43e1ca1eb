// Rung 0 of the halving strategy (rounds.strategy "halving"; docs/search.md): before round 1 the
// coordinator ranks the pipeline's backbones on a stratified subset of the training split
// (workflow/rank.h: leave-one-out kNN and LogME), keeps the best ceil(B / eta) by rounds.rank_by,
// and the run's rounds see only those. Decided once per run: kept in RUN_DIR/rung0.json (a resumed
// run reads the decision back rather than ranking again), journalled as "rung0", shown as lines,
// and explained by `msaflow why RUN BACKBONE`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "orchestrator/run_observer.h"
#include "record/journal.h"
#include "workflow/pipeline.h"

namespace msaflow::orchestrator {

inline constexpr char kRung0File[] = "rung0.json";
inline constexpr char kRung0Format[] = "msaflow.rung0/1";

// `p` itself unless its strategy is halving; else `p` with the backbones rung 0 keeps.
workflow::Pipeline HalvingRung0(const workflow::Pipeline& p, const std::string& run_dir, const record::JournalWriter& journal,
                                RunObserver& obs);

// The decision rung 0 wrote in `run_dir`, or null when the run has none.
nlohmann::json ReadRung0(const std::string& run_dir);

}  // namespace msaflow::orchestrator
