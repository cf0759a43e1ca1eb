// `msaflow export` and `msaflow predict`: a run's model used outside msaflow (docs/inference.md).
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/cli.h"
#include "common/files.h"
#include "inference/champion.h"
#include "inference/predict.h"
#include "kernels/onnx_export.h"

namespace msaflow::cli {

using nlohmann::json;

int Export(Options& o) {
  const inference::TrainedModel m = inference::OpenTrainedModel(o.run_dir, o.candidate);
  const std::string bytes = kernels::ExportClassifierOnnx(inference::ExportSpec(m, o.with_preprocessing));
  WriteFileAtomic(o.out_file, bytes);
  std::printf("%s: %s candidate %s (%s, %s %.4f on %s%s), %lld classes, %s input; %zu bytes\n", o.out_file.c_str(),
              m.champion ? "champion" : "the", m.candidate.id.c_str(), m.backbone.name.c_str(), m.metric.c_str(),
              m.metric_value, m.selected_on.empty() ? "selection" : m.selected_on.c_str(),
              m.test.is_object() ? fmt::format(", test {:.4f}", m.test.value("accuracy", 0.0)).c_str() : "",
              static_cast<long long>(m.head.classes), o.with_preprocessing ? "uint8 image" : "prepared float",
              bytes.size());
  return 0;
}

int Predict(Options& o) {
  const std::string& src = o.run_dir;
  const bool file = src.size() > 5 && src.compare(src.size() - 5, 5, ".onnx") == 0;
  std::unique_ptr<inference::Classifier> c =
      file ? inference::Classifier::FromOnnx(src)
           : std::make_unique<inference::Classifier>(inference::OpenTrainedModel(src, o.candidate));
  if (!c->note().empty()) std::fprintf(stderr, "msaflow predict: note: %s\n", c->note().c_str());
  c->set_batch(o.predict_batch);
  const inference::Images in = inference::ReadImages(o.images, o.labels, o.limit);
  const std::vector<float> p = c->Classify(in.images);
  const int64_t k = c->classes(), top = std::min<int64_t>(o.top, k);
  const auto& names = c->class_names();
  auto name_of = [&](int64_t j) { return j < static_cast<int64_t>(names.size()) ? names[static_cast<size_t>(j)] : std::to_string(j); };
  json out = json::array();
  int64_t labelled = 0, correct = 0;
  for (size_t i = 0; i < in.images.size(); ++i) {
    const float* row = p.data() + static_cast<int64_t>(i) * k;
    std::vector<int64_t> order(static_cast<size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    const int64_t best = order[0];
    if (in.labels[i] >= 0) {
      ++labelled;
      correct += in.labels[i] == best;
    }
    if (o.as_json) {
      json t = json::array();
      for (int64_t r = 0; r < top; ++r)
        t.push_back({{"class_index", order[static_cast<size_t>(r)]}, {"class", name_of(order[static_cast<size_t>(r)])},
                     {"probability", row[order[static_cast<size_t>(r)]]}});
      json e = {{"image", in.names[i]}, {"class_index", best}, {"class", name_of(best)}, {"probability", row[best]},
                {"top", t}, {"probabilities", std::vector<float>(row, row + k)}};
      if (in.labels[i] >= 0) e["label"] = in.labels[i];
      out.push_back(std::move(e));
    } else {
      std::string line = in.names[i] + ":";
      for (int64_t r = 0; r < top; ++r)
        line += fmt::format(" {} {:.4f}", name_of(order[static_cast<size_t>(r)]), row[order[static_cast<size_t>(r)]]);
      std::printf("%s\n", line.c_str());
    }
  }
  if (o.as_json) {
    std::printf("%s\n", out.dump().c_str());
  } else if (labelled > 0) {
    std::printf("accuracy: %lld of %lld labelled images, %.4f\n", static_cast<long long>(correct),
                static_cast<long long>(labelled), static_cast<double>(correct) / static_cast<double>(labelled));
  }
  return 0;
}

}  // namespace msaflow::cli
