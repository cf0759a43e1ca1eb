#include "ranking/rank.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/onnx_graph.h"
#include "kernels/transferability.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"

namespace msaflow::ranking {
namespace {

using workflow::BackboneKind;
using workflow::BackboneSpec;
using workflow::Pass;
using workflow::SplitSource;

// Raw pixels as read: the bytes / 255, row-major [images, dim].
std::vector<float> RawPixels(const BackboneSpec& bb, const kernels::ImageSet& ds, int64_t* dim) {
  const int64_t n = ds.count;
  *dim = ds.Rows(0) * ds.Cols(0) * ds.Channels(0);
  std::vector<float> f(static_cast<size_t>(n * *dim));
  for (int64_t i = 0; i < n; ++i) {
    if (ds.Rows(i) * ds.Cols(i) * ds.Channels(i) != *dim)
      Throw(ErrorKind::kInvalidInput, "backbone '" + bb.name + "' (raw pixels) needs images of one size; " +
                                          ds.Where(i) + " differs from the first");
    const uint8_t* px = ds.Image(i);
    for (int64_t j = 0; j < *dim; ++j) f[static_cast<size_t>(i * *dim + j)] = static_cast<float>(px[j]) / 255.f;
  }
  return f;
}

// The precision a backbone is ranked in: int8 needs the ranges the load step measures, and a
// ranking needs no such speed.
kernels::Precision RankPrecision(const BackboneSpec& bb) {
  return bb.precision == kernels::Precision::kInt8 ? kernels::Precision::kF32 : bb.precision;
}

// The executor of `group` (backbones of one model, SharePass with each other): its cuts in one
// graph. Null for resized pixels (the prepared images are the features).
std::shared_ptr<kernels::Executor> GroupExecutor(const std::vector<const BackboneSpec*>& group) {
  const BackboneSpec& bb = *group[0];
  if (bb.kind == BackboneKind::kPixels) return nullptr;
  std::vector<std::string> cuts;
  cuts.reserve(group.size());
  for (const BackboneSpec* g : group) cuts.push_back(g->feature_layer);
  return std::make_shared<kernels::Executor>(
      kernels::ImportOnnxCuts(ReadInputFile(bb.onnx, "an ONNX model", kernels::kMaxOnnxBytes), bb.onnx, cuts),
      RankPrecision(bb));
}

// The subset's features for each backbone of `group` from one pass over its images, row-major
// [images, dims[k]] each.
std::vector<std::vector<float>> GroupFeatures(const std::vector<const BackboneSpec*>& group, kernels::Executor* ex,
                                              const kernels::ImageSet& ds, kernels::fpga::Device& cpu,
                                              std::vector<int64_t>* dims) {
  const int64_t n = ds.count;
  const auto& in = group[0]->input;
  const int64_t per = in.channels * in.height * in.width;
  *dims = ex ? ex->FeatureDimsOfCuts(in.channels, in.height, in.width) : std::vector<int64_t>{per};
  const int64_t batch = in.batch > 0 ? in.batch : 64;
  std::vector<std::vector<float>> f(dims->size());
  for (size_t k = 0; k < f.size(); ++k) f[k].resize(static_cast<size_t>(n * (*dims)[k]));
  std::vector<float> x(static_cast<size_t>(batch * per));
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t b = std::min(batch, n - s);
    kernels::fpga::PrepareImages(cpu, ds, 0, s, b, in, x.data());
    if (in.batch > 0 && b < batch) std::fill(x.begin() + b * per, x.end(), 0.f);  // a fixed batch: whole ones
    if (!ex) {
      std::copy(x.begin(), x.begin() + b * per, f[0].begin() + s * per);
      continue;
    }
    const auto out = ex->FeaturesOfCuts(x.data(), in.batch > 0 ? batch : b, in.channels, in.height, in.width);
    for (size_t k = 0; k < f.size(); ++k) {
      const int64_t d = (*dims)[k];
      std::copy(out[k].begin(), out[k].begin() + b * d, f[k].begin() + s * d);
    }
  }
  return f;
}

}  // namespace

Ranking RankBackbones(const Pipeline& p, const RankOptions& o, const std::function<void(const std::string&)>& say) {
  const SplitSource train = OpenSplit(p, "train");
  Ranking r;
  r.train_images = train.count();
  r.classes = CheckSplits(p, {train});
  std::vector<int64_t> rows = kernels::StratifiedSubset(train.labels(), o.fraction, o.min_per_class, o.seed);
  if (static_cast<int64_t>(rows.size()) > o.max_images) {  // the same stratified draw, scaled down
    const double scale = static_cast<double>(o.max_images) / static_cast<double>(rows.size());
    rows = kernels::StratifiedSubset(train.labels(), o.fraction * scale, std::min<int64_t>(o.min_per_class, 2), o.seed);
    if (static_cast<int64_t>(rows.size()) > o.max_images) rows.resize(static_cast<size_t>(o.max_images));
  }
  if (rows.size() < 2) Throw(ErrorKind::kInvalidInput, "rank: the training split has fewer than 2 images");
  const kernels::ImageSet ds = train.ReadRows(rows);
  r.subset_images = ds.count;
  r.rows = rows;
  const std::unique_ptr<kernels::fpga::Device> cpu = kernels::fpga::OpenCpu();
  // The estimates of the backbones of one pass, from their features `f`; `features_s`: the pass.
  auto estimate = [&](const std::vector<const BackboneSpec*>& bbs, std::vector<std::vector<float>>& f,
                      const std::vector<int64_t>& dims, double features_s) {
    for (size_t k = 0; k < bbs.size(); ++k) {
      const BackboneSpec& bb = *bbs[k];
      BackboneRank b;
      b.backbone = bb.name;
      b.images = ds.count;
      b.dim = dims[k];
      b.features_s = features_s / static_cast<double>(bbs.size());  // the pass, shared by its cuts
      if (bb.precision == kernels::Precision::kInt8) b.note = "int8 ranked in f32";
      if (bbs.size() > 1)
        b.note =
            fmt::format("one pass for {} cuts of {}", bbs.size(), std::filesystem::path(bb.onnx).filename().string());
      const auto t0 = SteadyClock::now();
      b.knn = kernels::KnnLooAccuracy(f[k].data(), ds.count, b.dim, ds.labels.data());
      b.logme = kernels::LogMe(f[k].data(), ds.count, b.dim, ds.labels.data(), r.classes);
      b.estimate_s = SecondsSince(t0);
      b.as_prepared = bb.prepared() && bb.precision != kernels::Precision::kInt8;
      if (o.keep_features && bb.kind != BackboneKind::kPixels) b.features = std::move(f[k]);
      if (say)
        say(fmt::format("rank {}: kNN {:.3f}, LogME {:.3f} ({} features, {:.2f} s + {:.2f} s)", bb.name, b.knn, b.logme,
                        b.dim, b.features_s, b.estimate_s));
      r.backbones.push_back(std::move(b));
    }
  };
  // One model cut at several layers runs once for all its cuts, where that gives each cut the
  // very bits prepare computes (workflow::PlanPasses).
  for (const auto& group : PassGroups(p)) {
    if (!group[0]->prepared()) {  // raw pixels as read (a group of one)
      const auto t0 = SteadyClock::now();
      std::vector<int64_t> dims(1);
      std::vector<std::vector<float>> f{RawPixels(*group[0], ds, &dims[0])};
      estimate(group, f, dims, SecondsSince(t0));
      continue;
    }
    for (const Pass& pass : PlanPasses(group, [](const auto& bbs) { return GroupExecutor(bbs); })) {
      const auto t0 = SteadyClock::now();
      const std::shared_ptr<kernels::Executor> ex = pass.ex ? pass.ex : GroupExecutor(pass.bbs);
      std::vector<int64_t> dims;
      std::vector<std::vector<float>> f = GroupFeatures(pass.bbs, ex.get(), ds, *cpu, &dims);
      estimate(pass.bbs, f, dims, SecondsSince(t0));
    }
  }
  std::stable_sort(r.backbones.begin(), r.backbones.end(), [](const BackboneRank& a, const BackboneRank& b) {
    return a.knn != b.knn ? a.knn > b.knn : a.logme > b.logme;
  });
  return r;
}

}  // namespace msaflow::ranking
