// provenance.json (docs/formats.md): how a run reached its champion — per round, every task
// (module, ranks, the hosts its ranks ran on, when it started, its seconds, the bytes it moved to
// and from the NAM, its key, whether it ran or was reused) and every candidate (backbone, head,
// model object, result object, accuracy), then the champion. Built from the tasks' done objects
// in the NAM, so a resumed run's provenance covers what its dead coordinator finished too.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workflow/task.h"

namespace msaflow::record {

inline constexpr char kProvenanceFormat[] = "msaflow.provenance/1";

// One task's entry, from its done object's body (workflow::TaskDoneObject).
nlohmann::json ProvenanceTask(const workflow::Task& t, const nlohmann::json& done, const std::string& how, double seconds,
                              const std::string& started);
// One round's entry: its tasks, its candidates with their models and results, its champion
// (`best`: the round's best object, workflow::BestObject).
// `curves`: model object -> its training curve (the model's metadata), for the candidates the
// round trained.
nlohmann::json ProvenanceRound(int round, nlohmann::json tasks, const nlohmann::json& best,
                               const std::map<std::string, nlohmann::json>& curves);
// The champion's confusion matrix from its result object's body: on the test split when the
// result holds one, else on the split it was selected on. {split, classes, matrix: [[...]]}
// with matrix[true][predicted]; null when the body holds none.
nlohmann::json ConfusionOf(const nlohmann::json& result_body);

}  // namespace msaflow::record
