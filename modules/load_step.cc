// Step 1 (CM): each backbone imported, checked, cut at its feature layer and put in the NAM.
#include <fmt/core.h>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"
#include "modules/int8_calibration.h"
#include "modules/step_context.h"
#include "workflow/backbones.h"
#include "workflow/objects.h"

namespace msaflow::modules {

void Load(StepContext& c) {
  if (!c.root()) return;  // one writer; the other ranks (if any were started) have nothing to do
  // Every backbone is imported and checked before the first is stored: a bad one leaves the
  // NAM as it was.
  struct Ready {
    std::string obj, bytes;
    nlohmann::json meta;
  };
  std::vector<Ready> ready;
  for (const auto& bb : c.pipeline().backbones) {
    std::string obj = workflow::BackboneObject(bb.name);
    nlohmann::json meta = {{"kind", bb.kind}, {"name", bb.name}};
    std::string bytes;
    if (bb.kind == workflow::BackboneKind::kPixels) {
      meta["digest"] = workflow::BackboneDigestOf(bb, "", "");
      c.inputs["backbones"][bb.name] = meta["digest"];
      auto have = c.store->Stat(obj);
      if (have && have->meta.value("digest", "") == meta["digest"]) {
        c.Say(fmt::format("backbone {}: already in NAM ({})", bb.name, obj));
        continue;
      }
      c.WorkAhead();
    } else {
      std::string model = ReadInputFile(bb.onnx, "an ONNX model", kernels::kMaxOnnxBytes);
      const auto& in = bb.input;
      // int8 quantizes by ranges measured on the training images: they are part of what the
      // backbone gives.
      const std::string calibration =
          bb.precision == kernels::Precision::kInt8
              ? fmt::format(" calibrated on {} x{}", c.DatasetDigest("train"), kCalibrationImages)
              : "";
      std::string digest = workflow::BackboneDigestOf(bb, model, calibration);
      c.inputs["backbones"][bb.name] = digest;
      auto have = c.store->Stat(obj);
      if (have && have->meta.value("digest", "") == digest) {
        c.Say(fmt::format("backbone {}: already in NAM ({}, digest {})", bb.name, obj, digest));
        continue;
      }
      c.WorkAhead();
      // Import, check every operator, cut at the feature layer, and dry-run one image.
      kernels::Graph g = kernels::ImportOnnx(model, bb.onnx, bb.feature_layer);
      workflow::CheckBackboneInput(g, bb);
      std::unique_ptr<kernels::Executor> made;
      try {
        made = std::make_unique<kernels::Executor>(g, bb.precision);
      } catch (const Error& e) {
        Throw(e.kind(),
              fmt::format("backbone '{}': precision {}: {}", bb.name, kernels::PrecisionName(bb.precision), e.what()));
      }
      kernels::Executor& ex = *made;
      if (bb.precision == kernels::Precision::kInt8) {
        CalibrateOnTrainingImages(c, bb, ex);
        meta["int8_ranges"] = RangesToJson(ex.ranges());
        c.Say(fmt::format("backbone {}: int8 ranges of {} tensors measured on the first {} training images", bb.name,
                          ex.ranges().size(), kCalibrationImages));
      }
      int64_t dim = ex.FeatureDim(in.channels, in.height, in.width);
      // A full batch, as prepare will run it: a graph that only works for some batch sizes (a
      // Reshape to a fixed batch inside) fails here, named, not in the middle of prepare.
      const int64_t batch = in.batch > 0 ? in.batch : 64;
      std::vector<float> zeros(static_cast<size_t>(batch * in.channels * in.height * in.width));
      try {
        ex.Features(zeros.data(), batch, in.channels, in.height, in.width);
      } catch (const Error& e) {
        Throw(e.kind(), fmt::format("backbone '{}': {}: a batch of {} images fails: {}", bb.name, bb.onnx, batch, e.what()));
      }
      bytes = kernels::CutOnnx(model, bb.onnx, bb.feature_layer);
      meta["digest"] = digest;
      meta["source"] = bb.onnx;
      meta["feature_layer"] = bb.feature_layer;
      meta["feature_dim"] = dim;
      meta["input"] = {{"channels", in.channels}, {"height", in.height}, {"width", in.width},
                       {"mean", in.mean},         {"std", in.std}};
      meta["precision"] = kernels::PrecisionName(bb.precision);
      c.Say(fmt::format("backbone {}: imported {} ({} nodes up to '{}', {} fused ops), {} features", bb.name, bb.onnx,
                        g.nodes.size(), bb.feature_layer, ex.FusedOpCount(), dim));
    }
    ready.push_back({obj, std::move(bytes), std::move(meta)});
  }
  for (const auto& r : ready) {
    auto info = c.store->Put(r.obj, r.bytes, r.meta);
    c.Say(fmt::format("backbone {}: stored as {} (version {})", r.meta.value("name", ""), r.obj, info.version));
  }
}

}  // namespace msaflow::modules
