#include "workflow/backbones.h"

#include <fmt/core.h>

#include <memory>
#include <mutex>
#include <set>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/executor.h"
#include "kernels/tail.h"
#include "kernels/tensor_ops.h"

namespace msaflow::workflow {

namespace {

// Float16 storage makes other features than float32.
std::string StorageSuffix(const BackboneSpec& bb) { return bb.feature_dtype == "f32" ? "" : " features " + bb.feature_dtype; }

}  // namespace

bool SharePass(const BackboneSpec& a, const BackboneSpec& b) {
  const kernels::InputSpec &x = a.input, &y = b.input;
  return a.kind != BackboneKind::kPixels && b.kind != BackboneKind::kPixels && a.onnx == b.onnx &&
         a.precision == kernels::Precision::kF32 && b.precision == kernels::Precision::kF32 &&
         x.channels == y.channels && x.height == y.height && x.width == y.width && x.batch == y.batch &&
         x.mean == y.mean && x.std == y.std;
}

std::vector<std::vector<const BackboneSpec*>> PassGroups(const Pipeline& p) {
  std::vector<std::vector<const BackboneSpec*>> groups;
  std::vector<char> taken(p.backbones.size(), 0);
  for (size_t i = 0; i < p.backbones.size(); ++i) {
    if (taken[i]) continue;
    groups.push_back({&p.backbones[i]});
    for (size_t j = i + 1; j < p.backbones.size(); ++j)
      if (!taken[j] && SharePass(p.backbones[i], p.backbones[j])) {
        groups.back().push_back(&p.backbones[j]);
        taken[j] = 1;
      }
  }
  return groups;
}

std::vector<Pass> PlanPasses(std::vector<const BackboneSpec*> group, const CutsExecutorFn& cuts_executor) {
  std::vector<Pass> passes;
  while (group.size() > 1) {
    std::shared_ptr<kernels::Executor> ex = cuts_executor(group);
    if (!ex) break;
    const auto& in = group[0]->input;
    const std::vector<bool> alone = ex->CutsAsAlone(in.channels, in.height, in.width);
    std::vector<const BackboneSpec*> together;
    for (size_t k = 0; k < group.size(); ++k) {
      if (alone[k]) together.push_back(group[k]);
      else passes.push_back({{group[k]}, nullptr});
    }
    if (together.size() == group.size()) {
      passes.push_back({std::move(together), std::move(ex)});
      return passes;
    }
    group = std::move(together);
  }
  for (const auto* bb : group) passes.push_back({{bb}, nullptr});
  return passes;
}

std::string BackboneDigestOf(const BackboneSpec& bb, const std::string& model, const std::string& calibration) {
  const auto& in = bb.input;
  if (bb.kind == BackboneKind::kPixels) {
    // Resized pixels are other features than pixels as read (which keep the digest they had).
    const std::string resized = bb.prepared() ? fmt::format(" resized {}x{}x{}", in.channels, in.height, in.width) : "";
    return ChecksumHex(std::string("pixels/v1") + resized + StorageSuffix(bb));
  }
  const std::string rest =
      "\n" + bb.feature_layer + "\n" +
      fmt::format("{}x{}x{} {} {} {} {} {} {}", in.channels, in.height, in.width, in.mean[0], in.mean[1], in.mean[2],
                  in.std[0], in.std[1], in.std[2]) +
      (in.batch > 0 ? fmt::format(" batch {}", in.batch) : "") +
      (bb.precision != kernels::Precision::kF32 ? std::string(" precision ") + kernels::PrecisionName(bb.precision)
                                                : "") +
      calibration + StorageSuffix(bb);
  // The checksum of model + rest, without a copy of the model (87 MB for InceptionV3).
  Hasher h;
  h.Update(model.data(), model.size());
  h.Update(rest.data(), rest.size());
  return Hex64(h.Digest());
}

// The model's input against what the prepare step will feed it: a fixed batch size other than
// the steps' batch, or an image size or channel count other than the pipeline's input.
void CheckBackboneInput(const kernels::Graph& g, const BackboneSpec& bb) {
  const std::string who = "backbone '" + bb.name + "': " + bb.onnx;
  const auto& d = g.input_dims;  // N, C, H, W; -1 where dynamic
  const auto& in = bb.input;
  if (d.size() == 4 && d[0] > 0 && d[0] != (in.batch > 0 ? in.batch : 64)) {
    if (in.batch > 0)
      Throw(ErrorKind::kInvalidInput, fmt::format("{} has a fixed batch size of {}; input.batch is {}", who, d[0], in.batch));
    Throw(ErrorKind::kInvalidInput, fmt::format("{} has a fixed batch size of {}; export it with a dynamic batch "
                                                "dimension (or set input.batch: {})", who, d[0], d[0]));
  }
  const int64_t want[3] = {in.channels, in.height, in.width};
  for (size_t i = 1; i < 4 && i < d.size(); ++i)
    if (d[i] > 0 && d[i] != want[i - 1])
      Throw(ErrorKind::kInvalidInput,
            fmt::format("{} takes inputs of {} x {} x {} (channels x height x width, -1 = any); the pipeline's input "
                        "is {} x {} x {}", who, d[1], d[2], d[3], in.channels, in.height, in.width));
}

namespace {

// One backbone alone: its model cut at its feature layer, every operator up to it one the executor
// runs on the pipeline's input size (shape arithmetic folded, broadcasts and pads checked), as the
// load step will.
void CheckBackbone(const BackboneSpec& bb, const std::string& model) {
  kernels::Graph g = kernels::ImportOnnx(model, bb.onnx, bb.feature_layer);
  CheckBackboneInput(g, bb);
  try {
    const kernels::Executor ex(std::move(g));
    ex.CheckShape(bb.input.batch > 0 ? bb.input.batch : 64, bb.input.channels, bb.input.height, bb.input.width);
  } catch (const Error& e) {
    Throw(e.kind(), fmt::format("backbone '{}': {}: {}", bb.name, bb.onnx, e.what()));
  }
}

// The cuts of one model that one pass serves (PassGroups), imported and checked in one go: the
// graph up to the deepest cut is what each cut's own graph is part of. Where that fails, each cut
// is checked alone, so the error names the backbone it is about.
void CheckCuts(const std::vector<const BackboneSpec*>& group, const std::string& model) {
  const BackboneSpec& first = *group.front();
  std::vector<std::string> cuts;
  cuts.reserve(group.size());
  for (const auto* bb : group) cuts.push_back(bb->feature_layer);
  try {
    kernels::Graph g = kernels::ImportOnnxCuts(model, first.onnx, cuts);
    CheckBackboneInput(g, first);  // the group's backbones are prepared alike (SharePass)
    const kernels::Executor ex(std::move(g));
    ex.CheckShape(first.input.batch > 0 ? first.input.batch : 64, first.input.channels, first.input.height,
                  first.input.width);
  } catch (const Error& e) {
    for (const auto* bb : group) CheckBackbone(*bb, model);
    std::string names;
    for (const auto* bb : group) names += (names.empty() ? "'" : ", '") + bb->name + "'";
    Throw(e.kind(), fmt::format("backbones {}: {}: {}", names, first.onnx, e.what()));
  }
}

// A fine-tuning backbone's tail: train_from names a layer before the cut, and every operator from
// it to the cut has a backward pass (kernels/tail.h's refusals, naming the backbone).
std::unique_ptr<kernels::Tail> TailOf(const BackboneSpec& bb, const std::string& model) {
  try {
    return std::make_unique<kernels::Tail>(kernels::ImportOnnx(model, bb.onnx, bb.feature_layer), bb.train_from);
  } catch (const Error& e) {
    Throw(e.kind(), fmt::format("backbone '{}' ({}/train_from): {}", bb.name, bb.pointer, e.what()));
  }
}

}  // namespace

TailShape DescribeTail(const BackboneSpec& bb) {
  const std::string model = ReadInputFile(bb.onnx, "an ONNX model", kernels::kMaxOnnxBytes);
  const std::unique_ptr<kernels::Tail> tail = TailOf(bb, model);
  TailShape t;
  t.layers = tail->NodeNames();
  t.weights = tail->ParamCount();
  t.inputs = tail->inputs();
  kernels::Executor trunk(kernels::ImportOnnxCuts(model, bb.onnx, tail->inputs()));
  const auto& in = bb.input;
  const std::vector<float> one(static_cast<size_t>(in.channels * in.height * in.width), 0.f);
  std::vector<std::vector<int64_t>> dims;
  trunk.Maps(one.data(), 1, in.channels, in.height, in.width, &dims);  // the maps' dims
  for (const auto& d : dims) {
    t.dims.emplace_back(d.begin() + 1, d.end());
    t.values += kernels::NumElements(t.dims.back());
  }
  t.kept_values = tail->KeptValuesPerImage(t.dims);
  return t;
}

void CheckBackbones(const Pipeline& p) {
  // What passed once in this process, by the model's content, its cuts and its input: `msaflow
  // run` checks what `validate` just did, and a service admits the same models again and again.
  // An 87 MB model takes half a second to parse, per cut checked alone.
  static std::mutex mu;
  static std::set<std::string> passed;
  for (const auto& group : PassGroups(p)) {
    const BackboneSpec& first = *group.front();
    if (first.kind != BackboneKind::kOnnx) continue;
    const std::string model = ReadInputFile(first.onnx, "an ONNX model", kernels::kMaxOnnxBytes);
    std::string key = BackboneDigestOf(first, model, "") + first.train_from;
    for (size_t i = 1; i < group.size(); ++i)
      key += " " + BackboneDigestOf(*group[i], model, "") + group[i]->train_from;
    {
      const std::lock_guard<std::mutex> lock(mu);
      if (passed.count(key)) continue;
    }
    if (group.size() == 1) {
      CheckBackbone(first, model);
    } else {
      CheckCuts(group, model);
    }
    for (const auto* bb : group)
      if (bb->finetunes()) TailOf(*bb, model);
    const std::lock_guard<std::mutex> lock(mu);
    passed.insert(key);
  }
}

bool MapsInHalf(const BackboneSpec& bb, const std::string& split) {
  (void)split;  // every split alike
  return bb.feature_dtype == "f16";
}

}  // namespace msaflow::workflow
