// A finished run's trained model, taken out of msaflow's NAM so that something else can use it:
// the champion (or any candidate the run trained), its backbone cut as the run loaded it, its
// head's weights, what the images were prepared like and what the classes are called.
// `msaflow export` writes it as ONNX (kernels/onnx_export.h); `msaflow predict` runs it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/head.h"
#include "kernels/onnx_export.h"
#include "workflow/candidates.h"
#include "workflow/pipeline.h"

namespace msaflow::inference {

struct TrainedModel {
  std::string run_dir, run;
  workflow::Pipeline pipeline;
  workflow::Candidate candidate;
  bool champion = false;       // the run's champion (else another candidate it trained)
  std::string model_object;    // its head in the NAM
  kernels::Head head;
  workflow::BackboneSpec backbone;
  // The cut backbone the run loaded (empty for raw pixels); a fine-tuned one with its trained weights.
  std::string backbone_onnx;
  std::string finetuned_from;  // fine-tuned: the backbone's layers from this one on were trained; else ""
  // An int8 backbone's tensor ranges, as the load step measured them and kept them with the
  // backbone in the NAM (empty for other precisions): predict quantizes with the run's own.
  std::map<std::string, float> int8_ranges;
  std::vector<std::string> class_names;  // by class index: an image folder's names, else "0".."N-1"
  std::string metric;          // the pipeline's metric, its value on the selection split
  double metric_value = 0;
  std::string selected_on;     // the split it was chosen on
  nlohmann::json test;         // its test-split figures as the run reported them, or null
  int64_t image_rows = 0, image_cols = 0, image_channels = 1;  // the test split's first image
};

// The candidate `candidate_id` (default: the champion) of the finished run in `run_dir`, read
// from its results (record/run_dir.h) and its NAM (the runs directory's persisted NAM, or the NAM URI the
// run used). Throws kNotFound for a run that has not finished or an unknown candidate (naming
// the ones there are), kCorrupt when the NAM's backbone is no longer the one the run loaded.
TrainedModel OpenTrainedModel(const std::string& run_dir, const std::string& candidate_id = "");

// What kernels::ExportClassifierOnnx needs, with the run, candidate, metric, classes and
// hyper-parameters as metadata_props (docs/inference.md lists the keys).
kernels::ClassifierExport ExportSpec(const TrainedModel& m, bool with_preprocessing);

}  // namespace msaflow::inference
