#include "kernels/executor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/executor_parts.h"
#include "kernels/fold.h"
#include "kernels/tensor_ops.h"
#include "kernels/window.h"

namespace msaflow::kernels {

std::optional<Precision> PrecisionFromName(std::string_view name) {
  return ByName(name, PrecisionName, {Precision::kF32, Precision::kBF16, Precision::kInt8});
}

Precision ParsePrecision(const std::string& name) {
  if (const auto p = PrecisionFromName(name)) return *p;
  Throw(ErrorKind::kInvalidInput, "precision '" + name + "': expected \"f32\", \"bf16\" or \"int8\"");
}

const char* PrecisionName(Precision p) {
  return p == Precision::kBF16 ? "bf16" : p == Precision::kInt8 ? "int8" : "f32";
}

bool PrecisionAvailable(Precision p, std::string* why) {
  if (p == Precision::kF32) return true;
  using isa = dnnl::cpu_isa;
  const isa have = dnnl::get_effective_cpu_isa();
  auto one_of = [have](std::initializer_list<isa> fast) { return std::find(fast.begin(), fast.end(), have) != fast.end(); };
  if (p == Precision::kInt8) {
    // Without VNNI oneDNN multiplies u8 by s8 in pairs summed into int16 (vpmaddubsw), which
    // saturates for large weights: results would be silently wrong, not just slow.
    if (one_of({isa::avx2_vnni, isa::avx512_core_vnni, isa::avx512_core_bf16, isa::avx512_core_amx})) return true;
    if (why) *why = "int8 needs a CPU with VNNI (AVX512_VNNI or AVX-VNNI); without it oneDNN's int8 sums can saturate";
    return false;
  }
  // oneDNN runs bf16 convolutions natively from AVX512_BF16 on and emulates them on AVX-512
  // cores; below that it has only reference kernels, hundreds of times slower.
  if (one_of({isa::avx512_core, isa::avx512_core_vnni, isa::avx512_core_bf16, isa::avx512_core_amx})) return true;
  if (why) *why = "bf16 needs a CPU with AVX-512 (oneDNN has only reference kernels below it)";
  return false;
}

Executor::Executor(Graph graph, Precision precision)
    : graph_(std::move(graph)), precision_(precision), engine_(std::make_unique<Engine>()) {
  std::string why;
  if (!PrecisionAvailable(precision, &why)) Throw(ErrorKind::kUnsupported, std::string("executor: ") + why);
  // Unfused: shape arithmetic written as elementwise ops must fold node by node per plan.
  ops_ = exec::BuildOps(graph_);
  fused_op_count_ = exec::FuseEltwise(ops_, exec::Outputs(graph_)).size();
}

Executor::~Executor() = default;

size_t Executor::FusedOpCount() const { return fused_op_count_; }

int64_t Executor::FeatureDim(int64_t c, int64_t h, int64_t w) {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  return PlanFor({n, c, h, w}).channels;
}

void Executor::SetRanges(Ranges ranges) {
  ranges_ = std::move(ranges);
  if (precision_ == Precision::kInt8) plans_.clear();
}

void Executor::Calibrate(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  Plan& plan = PlanFor({n, c, h, w}, PlanKind::kObserve);
  auto widen = [this](const std::string& name, const float* v, size_t count) {
    float m = 0;
    for (size_t i = 0; i < count; ++i) m = std::max(m, std::fabs(v[i]));
    if (!std::isfinite(m)) Throw(ErrorKind::kInvalidInput, "executor: calibration: tensor '" + name + "' is not finite");
    float& r = ranges_[name];
    r = std::max(r, m);
  };
  widen(graph_.input, x, static_cast<size_t>(n * c * h * w));
  plan.input.set_data_handle(const_cast<float*>(x));
  size_t next = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    plan.steps[i].Run(engine_->strm);
    for (; next < plan.observations.size() && plan.observations[next].after == i + 1; ++next) {
      engine_->strm.wait();
      const dnnl::memory& m = plan.observations[next].mem;  // f32; blocked layouts pad with zeros
      widen(plan.observations[next].name, static_cast<const float*>(m.get_data_handle()),
            m.get_desc().get_size() / sizeof(float));
    }
  }
  engine_->strm.wait();
  if (precision_ == Precision::kInt8) plans_.clear();
}

std::vector<float> Executor::Features(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (precision_ == Precision::kInt8 && ranges_.empty())
    Throw(ErrorKind::kInvalidInput, "executor: int8 needs calibration ranges first (Calibrate or SetRanges)");
  Plan& plan = PlanFor({n, c, h, w});
  plan.input.set_data_handle(const_cast<float*>(x));
  for (auto& s : plan.steps) s.Run(engine_->strm);
  engine_->strm.wait();
  std::vector<float> out(static_cast<size_t>(n * plan.channels));
  std::memcpy(out.data(), plan.output.get_data_handle(), out.size() * sizeof(float));
  return out;
}

std::vector<std::vector<float>> Executor::Maps(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                               std::vector<std::vector<int64_t>>* dims) {
  if (precision_ == Precision::kInt8 && ranges_.empty())
    Throw(ErrorKind::kInvalidInput, "executor: int8 needs calibration ranges first (Calibrate or SetRanges)");
  Plan& plan = PlanFor({n, c, h, w}, PlanKind::kMaps);
  plan.input.set_data_handle(const_cast<float*>(x));
  for (auto& s : plan.steps) s.Run(engine_->strm);
  engine_->strm.wait();
  std::vector<std::vector<float>> out;
  dims->clear();
  out.reserve(plan.maps.size());
  dims->reserve(plan.maps.size());
  for (const Plan::Map& m : plan.maps) {
    const auto* p = static_cast<const float*>(m.mem.get_data_handle());
    out.emplace_back(p, p + NumElements(m.dims));
    dims->push_back(m.dims);
  }
  return out;
}

std::vector<float> Executor::FeaturesAndMaps(const float* x, int64_t n, int64_t c, int64_t h, int64_t w,
                                             std::vector<std::vector<float>>* maps,
                                             std::vector<std::vector<int64_t>>* dims) {
  std::vector<std::vector<float>> all = Maps(x, n, c, h, w, dims);  // the maps plan pools the first cut too
  const Plan& plan = PlanFor({n, c, h, w}, PlanKind::kMaps);
  std::vector<float> features(static_cast<size_t>(n * plan.channels));
  std::memcpy(features.data(), plan.output.get_data_handle(), features.size() * sizeof(float));
  maps->assign(std::make_move_iterator(all.begin() + 1), std::make_move_iterator(all.end()));
  dims->erase(dims->begin());
  return features;
}

std::vector<std::vector<float>> Executor::FeaturesOfCuts(const float* x, int64_t n, int64_t c, int64_t h, int64_t w) {
  std::vector<std::vector<float>> all;
  all.push_back(Features(x, n, c, h, w));  // runs the plan: every cut is pooled
  for (const Plan::Cut& more : PlanFor({n, c, h, w}).more) {
    all.emplace_back(static_cast<size_t>(n * more.channels));
    std::memcpy(all.back().data(), more.output.get_data_handle(), all.back().size() * sizeof(float));
  }
  return all;
}

std::vector<int64_t> Executor::FeatureDimsOfCuts(int64_t c, int64_t h, int64_t w) {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  const Plan& plan = PlanFor({n, c, h, w});
  std::vector<int64_t> dims{plan.channels};
  for (const Plan::Cut& more : plan.more) dims.push_back(more.channels);
  return dims;
}

namespace {

bool SameSteps(const std::vector<exec::EltStep>& a, const std::vector<exec::EltStep>& b) {
  auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].alg != b[i].alg || bits(a[i].alpha) != bits(b[i].alpha) || bits(a[i].beta) != bits(b[i].beta)) return false;
  return true;
}

// Whether two fused ops compute the same thing the same way: the same node(s), inputs, output
// and fused chains (the primitives built from them are then the same).
bool SameOp(const Executor::Op& a, const Executor::Op& b) {
  return a.kind == b.kind && a.name == b.name && a.inputs == b.inputs && a.output == b.output &&
         a.sum_input == b.sum_input && a.part == b.part && a.pads == b.pads && a.strides == b.strides &&
         SameSteps(a.post, b.post) && SameSteps(a.post_sum, b.post_sum);
}

}  // namespace

std::vector<bool> Executor::CutsAsAlone(int64_t c, int64_t h, int64_t w) const {
  const int64_t n = graph_.input_dims.empty() || graph_.input_dims[0] <= 0 ? 1 : graph_.input_dims[0];
  const exec::Dims in{n, c, h, w};
  const exec::Resolved all = exec::Resolve(ops_, graph_, in);
  const std::vector<Op> fused =
      exec::FuseEltwise(exec::FoldResidualAdds(all.ops, all.shapes, all.outputs()), all.outputs());
  const std::vector<std::string> cuts = exec::Outputs(graph_), resolved = all.outputs();
  std::vector<bool> same;
  for (size_t k = 0; k < cuts.size(); ++k) {
    Graph alone = graph_;  // the model cut at this tensor only, as ImportOnnx would give it
    alone.output = cuts[k];
    alone.more_outputs.clear();
    const std::vector<Op> unfused = exec::BuildOps(alone);
    const exec::Resolved r = exec::Resolve(unfused, alone, in);
    const std::vector<Op> want = exec::FuseEltwise(exec::FoldResidualAdds(r.ops, r.shapes, {r.output}), {r.output});
    const std::vector<Op> got = exec::DropDeadOps(fused, {resolved[k]});  // the several-cut plan's ops this cut needs
    bool equal = r.output == resolved[k] && want.size() == got.size();
    for (size_t i = 0; equal && i < want.size(); ++i) equal = SameOp(want[i], got[i]);
    same.push_back(equal);
  }
  return same;
}

void Executor::CheckShape(int64_t n, int64_t c, int64_t h, int64_t w) const {
  const exec::Dims in{n, c, h, w};
  for (size_t i = 0; i < 4; ++i)
    if (graph_.input_dims[i] > 0 && graph_.input_dims[i] != in[i])
      Throw(ErrorKind::kInvalidInput, "executor: input '" + graph_.input + "' dim " + std::to_string(i) +
                                          " is fixed at " + std::to_string(graph_.input_dims[i]) + " by the model, got " +
                                          std::to_string(in[i]));
  const exec::Resolved r = exec::Resolve(ops_, graph_, in);
  const std::vector<std::string> layers = exec::Outputs(graph_), cuts = r.outputs();
  for (size_t k = 0; k < cuts.size(); ++k) {
    const exec::Dims& cut = r.shapes.at(cuts[k]);
    if (cut.size() != 4 && cut.size() != 2)
      Throw(ErrorKind::kUnsupported, "the feature layer '" + layers[k] + "' is " + exec::DimsText(cut) +
                                         "; expected an NCHW tensor (average-pooled) or N x features");
  }
}

}  // namespace msaflow::kernels
