// Every NAM object name msaflow uses, in one place (docs/nam.md lists them). Names are
// `[a-z0-9._-]` segments joined by `/`; run ids and candidate ids are made to fit.
#pragma once

#include <cstdint>
#include <string>

#include "workflow/kinds.h"

namespace msaflow::workflow {

// Round 1..: the objects a round's steps write.
std::string BackboneObject(const std::string& backbone);  // backbone/<name>: the cut ONNX model
// features/<backbone digest>-<dataset digest>: a backbone's features on a dataset split,
// reused by every later round, candidate and run that asks for the same content.
std::string FeaturesObject(const std::string& backbone_digest, const std::string& dataset_digest);
// <features object>.p<part, 5+ digits>: rows [part x part_rows, ...) of it, written before it.
std::string FeaturesPartObject(const std::string& features_object, int64_t part);
// Rows per part for features (or maps) of `dim` values a row: whole batches of `batch` rows,
// about `part_bytes` a part at float32 (at least one batch).
int64_t FeaturesPartRows(int64_t dim, int64_t batch, int64_t part_bytes);
// The part size prepare aims at: MSAFLOW_PART_BYTES, default 1 MiB; kInvalidInput if malformed.
int64_t FeaturesPartBytes();
// A maps object's parts (computed in a pass of their own) are whole batches of this many rows.
inline constexpr int64_t kMapsBatch = 64;
// maps/<backbone digest>-<dataset digest>-<train_from's checksum>: a fine-tuning backbone's
// trunk activations at its tail's inputs on a dataset split (docs/finetune.md), in parts named
// as a features object's (FeaturesPartObject), reused like features.
std::string MapsObject(const std::string& backbone_digest, const std::string& dataset_digest,
                       const std::string& train_from);
std::string PreparedObject(const std::string& run, int round);  // prepared/<run>/<round>: what prepare did
std::string StagingObject(const std::string& run, int round, const std::string& cand);  // a trained head, unpublished
std::string StagingPrefix(const std::string& run, int round);
std::string ModelObject(const std::string& run, int round, const std::string& cand);
std::string EvalObject(const std::string& run, int round, const std::string& cand, int64_t shard);
std::string EvalPrefix(const std::string& run, int round, const std::string& cand);  // every shard of a candidate
std::string TrainedObject(const std::string& run, int round);    // trained/<run>/<round>: the train step's figures
std::string EvaluatedObject(const std::string& run, int round);  // evaluated/<run>/<round>: the farm's figures
std::string ResultObject(const std::string& run, int round, const std::string& cand);
std::string BestObject(const std::string& run, int round);
// done/<run>/<round>/<step>: written last by a step that succeeded, listing the objects it
// committed. A resumed run never runs a task whose done object exists.
std::string TaskDoneObject(const std::string& run, int round, Step step);
// rung0/<run>/<backbone>: the features rung 0 of the halving strategy computed for a backbone
// it kept, on its subset of the training split, for round 1's prepare to use rather than run
// those images through the backbone again (orchestrator/halving.h).
std::string Rung0FeaturesObject(const std::string& run, const std::string& backbone);
// digest/<checksum of a split stamp>: the dataset digest of the split the stamp describes
// (workflow::SplitStamp), in its metadata; the stamp is the body.
std::string DatasetDigestObject(const std::string& split_stamp);

}  // namespace msaflow::workflow
