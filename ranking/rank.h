// `msaflow rank`: the backbones of a pipeline ranked by how well their features suit its
// training data, estimated on a stratified subset without training anything (leave-one-out kNN
// accuracy and LogME, kernels/transferability.h): for a user who only wants to choose a model,
// and the halving strategy's first rung (docs/search.md).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workflow/pipeline.h"

namespace msaflow::ranking {

using workflow::Pipeline;

struct RankOptions {
  double fraction = 0.1;       // of each class's training images ...
  int64_t min_per_class = 10;  // ... but at least this many (all, when a class has fewer)
  int64_t max_images = 4000;   // the estimates grow with the images squared: the subset is cut to this
  uint64_t seed = 0;
  bool keep_features = false;  // BackboneRank::features filled for ONNX backbones (rung 0 hands them
                               // to prepare; pixels cost nothing to compute again)
};

struct BackboneRank {
  std::string backbone;
  int64_t images = 0, dim = 0;
  double knn = 0, logme = 0;
  double features_s = 0;        // preparing the subset and running the backbone on it
  double estimate_s = 0;        // kNN and LogME on the features
  std::string note;             // e.g. int8 ranked in f32
  bool as_prepared = false;     // the features are the very bits the prepare step computes (not int8
                                // ranked in f32, not raw pixels as read)
  std::vector<float> features;  // [images, dim] row-major, in Ranking::rows order: RankOptions::keep_features
};

struct Ranking {
  int64_t train_images = 0, subset_images = 0, classes = 0;
  std::vector<int64_t> rows;            // the subset: rows of the training split, ascending
  std::vector<BackboneRank> backbones;  // by kNN accuracy, best first (then LogME)
};

// Computes the estimates for every backbone of `p` on one stratified subset of its training
// split (the same images for all). `say` gets a line per backbone as it finishes.
Ranking RankBackbones(const Pipeline& p, const RankOptions& o,
                      const std::function<void(const std::string&)>& say = nullptr);

}  // namespace msaflow::ranking
