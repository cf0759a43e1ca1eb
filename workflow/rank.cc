#include "workflow/rank.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/onnx_graph.h"
#include "kernels/transferability.h"
#include "workflow/datasets.h"

namespace msaflow::workflow {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The subset's features for one backbone, row-major [images, dim].
std::vector<float> ComputeSubsetFeatures(const BackboneSpec& bb, const kernels::ImageSet& ds,
                                         kernels::fpga::Device& cpu, int64_t* dim, std::string* note) {
  const int64_t n = ds.count;
  if (!bb.prepared()) {  // raw pixels as read
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
  const auto& in = bb.input;
  std::unique_ptr<kernels::Executor> ex;
  if (bb.kind != "pixels") {
    // int8 needs ranges the load step measures; a ranking needs no such precision.
    const std::string precision = bb.precision == "int8" ? "f32" : bb.precision;
    if (bb.precision == "int8") *note = "int8 ranked in f32";
    ex = std::make_unique<kernels::Executor>(
        kernels::ImportOnnx(ReadInputFile(bb.onnx, "an ONNX model", kernels::kMaxOnnxBytes), bb.onnx, bb.feature_layer),
        kernels::ParsePrecision(precision));
  }
  const int64_t per = in.channels * in.height * in.width;
  *dim = ex ? ex->FeatureDim(in.channels, in.height, in.width) : per;
  const int64_t batch = in.batch > 0 ? in.batch : 64;
  std::vector<float> f(static_cast<size_t>(n * *dim)), x(static_cast<size_t>(batch * per));
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t b = std::min(batch, n - s);
    kernels::fpga::PrepareImages(cpu, ds, 0, s, b, in, x.data());
    if (in.batch > 0 && b < batch) std::fill(x.begin() + b * per, x.end(), 0.f);  // a fixed batch: whole ones
    if (ex) {
      const auto out = ex->Features(x.data(), in.batch > 0 ? batch : b, in.channels, in.height, in.width);
      std::copy(out.begin(), out.begin() + b * *dim, f.begin() + s * *dim);
    } else {
      std::copy(x.begin(), x.begin() + b * per, f.begin() + s * *dim);
    }
  }
  return f;
}

}  // namespace

Ranking RankBackbones(const Pipeline& p, const RankOptions& o,
                      const std::function<void(const std::string&)>& say) {
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
  for (const auto& bb : p.backbones) {
    BackboneRank b;
    b.backbone = bb.name;
    b.images = ds.count;
    auto t0 = Clock::now();
    std::vector<float> f = ComputeSubsetFeatures(bb, ds, *cpu, &b.dim, &b.note);
    b.features_s = Since(t0);
    t0 = Clock::now();
    b.knn = kernels::KnnLooAccuracy(f.data(), ds.count, b.dim, ds.labels.data());
    b.logme = kernels::LogMe(f.data(), ds.count, b.dim, ds.labels.data(), r.classes);
    b.estimate_s = Since(t0);
    b.as_prepared = bb.prepared() && bb.precision != "int8";
    if (o.keep_features && bb.kind != "pixels") b.features = std::move(f);
    if (say)
      say(fmt::format("rank {}: kNN {:.3f}, LogME {:.3f} ({} features, {:.2f} s + {:.2f} s)", bb.name, b.knn, b.logme,
                      b.dim, b.features_s, b.estimate_s));
    r.backbones.push_back(std::move(b));
  }
  std::stable_sort(r.backbones.begin(), r.backbones.end(), [](const BackboneRank& a, const BackboneRank& b) {
    return a.knn != b.knn ? a.knn > b.knn : a.logme > b.logme;
  });
  return r;
}

}  // namespace msaflow::workflow

namespace msaflow::workflow {

std::string SubsetFeaturesBody(const SubsetFeatures& s) {
  std::string body(s.rows.size() * sizeof(int64_t) + s.values.size() * sizeof(float), '\0');
  std::memcpy(body.data(), s.rows.data(), s.rows.size() * sizeof(int64_t));
  std::memcpy(body.data() + s.rows.size() * sizeof(int64_t), s.values.data(), s.values.size() * sizeof(float));
  return body;
}

nlohmann::json SubsetFeaturesMeta(const SubsetFeatures& s) {
  return {{"kind", "rung0-features"}, {"format", kSubsetFeaturesFormat}, {"backbone", s.backbone},
          {"backbone_digest", s.backbone_digest}, {"split", "train"}, {"split_stamp", s.split_stamp},
          {"rows", static_cast<int64_t>(s.rows.size())}, {"dim", s.dim}};
}

SubsetFeatures ParseSubsetFeatures(const std::string& body, const nlohmann::json& meta, int64_t split_rows,
                                   const std::string& where) {
  auto bad = [&](const std::string& what) { Throw(ErrorKind::kCorrupt, where + ": " + what); };
  if (!meta.is_object() || meta.value("format", "") != kSubsetFeaturesFormat)
    bad(std::string("metadata is not ") + kSubsetFeaturesFormat);
  SubsetFeatures s;
  try {
    s.backbone = meta.at("backbone").get<std::string>();
    s.backbone_digest = meta.at("backbone_digest").get<std::string>();
    s.split_stamp = meta.at("split_stamp").get<std::string>();
    s.dim = meta.at("dim").get<int64_t>();
    const int64_t n = meta.at("rows").get<int64_t>();
    if (n < 0 || s.dim <= 0 || n > split_rows) bad(fmt::format("{} rows of {} values (a split of {} rows)", n, s.dim, split_rows));
    s.rows.resize(static_cast<size_t>(n));
    s.values.resize(static_cast<size_t>(n * s.dim));
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("metadata: ") + e.what());
  }
  const size_t want = s.rows.size() * sizeof(int64_t) + s.values.size() * sizeof(float);
  if (body.size() != want) bad(fmt::format("{} bytes; {} rows of {} values take {}", body.size(), s.rows.size(), s.dim, want));
  std::memcpy(s.rows.data(), body.data(), s.rows.size() * sizeof(int64_t));
  std::memcpy(s.values.data(), body.data() + s.rows.size() * sizeof(int64_t), s.values.size() * sizeof(float));
  for (size_t i = 0; i < s.rows.size(); ++i)
    if (s.rows[i] < 0 || s.rows[i] >= split_rows || (i > 0 && s.rows[i] <= s.rows[i - 1]))
      bad(fmt::format("row {} of the list is {}: rows must ascend within [0, {})", i, s.rows[i], split_rows));
  return s;
}

}  // namespace msaflow::workflow
