// int8 backbones (a backbone's "precision": "int8"): the executor's tensor ranges, measured when
// the backbone is loaded on the first images of the training split, and kept in the backbone's
// NAM object so every rank of every later step quantizes alike, and `msaflow predict` and the
// service's inference on the run's model too (inference/champion.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kernels/executor.h"
#include "modules/step_context.h"
#include "workflow/pipeline.h"

namespace msaflow::modules {

// The training images ranges are measured on: the first ones, up to this many.
constexpr int64_t kCalibrationImages = 256;

// Runs `ex` in f32 over the training split's first images, prepared as prepare prepares them
// (the step's FPGA backend), widening its ranges.
void CalibrateOnTrainingImages(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor& ex);

// Ranges as the backbone object's metadata keeps them ({tensor: largest magnitude}), and back;
// `where` names the object in errors (kCorrupt: not an object of finite non-negative numbers).
nlohmann::json RangesToJson(const kernels::Executor::Ranges& ranges);
kernels::Executor::Ranges RangesFromJson(const nlohmann::json& j, const std::string& where);

}  // namespace msaflow::modules
