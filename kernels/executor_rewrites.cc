// The executor's graph queries and rewrites, and the op list's (kernels/executor_parts.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "kernels/executor_parts.h"
#include "kernels/fold.h"
#include "kernels/tensor_ops.h"
#include "kernels/window.h"

namespace msaflow::kernels::exec {

bool IsLinear(const EltStep& s) { return s.alg == algorithm::eltwise_linear; }

// Appends `s` to `chain`, composing consecutive affine steps and dropping identities.
void PushStep(std::vector<EltStep>& chain, const EltStep& s) {
  if (IsLinear(s) && !chain.empty() && IsLinear(chain.back())) {
    EltStep& b = chain.back();  // y = a2 * (a1 x + b1) + b2
    b.beta = s.alpha * b.beta + s.beta;
    b.alpha = s.alpha * b.alpha;
  } else {
    chain.push_back(s);
  }
  if (IsLinear(chain.back()) && chain.back().alpha == 1.f && chain.back().beta == 0.f) chain.pop_back();
}

const ConstTensor* ConstOf(const Graph& g, const std::string& name) {
  auto it = g.consts.find(name);
  return it == g.consts.end() ? nullptr : &it->second;
}

// Every cut tensor of the graph: its output, then the more outputs of a several-cut import.
std::vector<std::string> Outputs(const Graph& g) {
  std::vector<std::string> all{g.output};
  all.insert(all.end(), g.more_outputs.begin(), g.more_outputs.end());
  return all;
}

// The index of the node producing each tensor.
std::map<std::string, size_t> Producers(const Graph& g) {
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
  return producer;
}

// Rewrites x * clip(x + 3, 0, 6) (the decomposed hardswish that exporters emit) into one
// HardSwish followed by a scale of 6, which the following "/ 6" cancels.
void RewriteHardSwish(Graph& g) {
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& n : g.nodes) {
    if (n.op != "Mul" || n.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& x = n.inputs[side];
      auto pc = producer.find(n.inputs[1 - side]);
      if (pc == producer.end()) continue;
      const Node& clip = g.nodes[pc->second];
      float lo, hi;
      if (clip.op != "Clip" || !ClipBounds(g, clip, &lo, &hi) || lo != 0.f || hi != 6.f) continue;
      auto pa = producer.find(clip.inputs[0]);
      if (pa == producer.end()) continue;
      const Node& add = g.nodes[pa->second];
      if (add.op != "Add" || add.inputs.size() != 2) continue;
      float three = 0;
      bool ok = (add.inputs[0] == x && ScalarInput(g, add, 1, &three)) ||
                (add.inputs[1] == x && ScalarInput(g, add, 0, &three));
      if (!ok || three != 3.f) continue;
      n.op = "msaflow.HardSwishX6";
      n.inputs = {x};
      break;
    }
  }
}

// x * Sigmoid(x) (SiLU, as exporters write it) becomes one swish; x * HardSigmoid(x; 1/6, 1/2)
// becomes one HardSwish (torch.onnx's hardswish below opset 14).
void RewriteGatedActivations(Graph& g) {
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& n : g.nodes) {
    if (n.op != "Mul" || n.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      auto p = producer.find(n.inputs[1 - side]);
      if (p == producer.end()) continue;
      const Node& gate = g.nodes[p->second];
      if (gate.inputs.empty() || gate.inputs[0] != n.inputs[side]) continue;
      const bool swish = gate.op == "Sigmoid";
      const bool hardswish = gate.op == "HardSigmoid" && std::fabs(gate.Float("alpha", 0.2f) - 1.f / 6.f) < 1e-7f &&
                             gate.Float("beta", 0.5f) == 0.5f;
      if (!swish && !hardswish) continue;
      n.op = swish ? "msaflow.Swish" : "HardSwish";
      n.inputs = {n.inputs[side]};
      break;
    }
  }
}

// A constant-zero Pad of the spatial axes whose one reader is a convolution (as converters from
// TensorFlow write "SAME" padding) becomes that convolution's own padding.
void RewritePadIntoConv(Graph& g) {
  std::map<std::string, int> readers;
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs) readers[in]++;
  readers[g.output]++;
  for (const auto& o : g.more_outputs) readers[o]++;
  const std::map<std::string, size_t> producer = Producers(g);
  for (auto& conv : g.nodes) {
    if (conv.op != "Conv" || conv.inputs.empty() || conv.Str("auto_pad", "NOTSET") != "NOTSET") continue;
    auto p = producer.find(conv.inputs[0]);
    if (p == producer.end() || readers[conv.inputs[0]] != 1) continue;
    const Node& pad = g.nodes[p->second];
    if (pad.op != "Pad" || pad.Str("mode", "constant") != "constant") continue;
    PadSpec spec;
    try {
      spec = ResolvePad(
          pad, [&](const std::string& t) { return ConstOf(g, t); }, 4);
    } catch (const Error&) {
      continue;  // pads computed at run time, or malformed: the Pad runs (or fails) on its own
    }
    const Dims& q = spec.pads;  // N, C, H, W begins, then ends
    if (spec.value != 0.f || q[0] || q[1] || q[4] || q[5]) continue;
    if (std::any_of(q.begin(), q.end(), [](int64_t v) { return v < 0; })) continue;
    Dims cp = conv.Has("pads") ? conv.Ints("pads") : Dims{0, 0, 0, 0};
    if (cp.size() != 4) continue;
    conv.attrs["pads"].ints = {cp[0] + q[2], cp[1] + q[3], cp[2] + q[6], cp[3] + q[7]};
    conv.inputs[0] = pad.inputs[0];
  }
}

// Drops ops nothing reads any more (e.g. the pieces of a rewritten hardswish).
std::vector<Executor::Op> DropDeadOps(std::vector<Executor::Op> ops, const std::vector<std::string>& outs) {
  std::set<std::string> live(outs.begin(), outs.end());
  std::vector<char> keep(ops.size(), 0);
  for (size_t i = ops.size(); i-- > 0;) {
    if (!live.count(ops[i].output)) continue;
    keep[i] = 1;
    for (const auto& in : ops[i].inputs) live.insert(in);
    if (!ops[i].sum_input.empty()) live.insert(ops[i].sum_input);  // a fused residual
  }
  std::vector<Executor::Op> kept;
  for (size_t i = 0; i < ops.size(); ++i)
    if (keep[i]) kept.push_back(std::move(ops[i]));
  return kept;
}

// Consumers of each tensor; each tensor of `outs` counts as one more.
std::map<std::string, int> UseCounts(const std::vector<Executor::Op>& ops, const std::vector<std::string>& outs) {
  std::map<std::string, int> uses;
  for (const auto& op : ops) {
    for (const auto& in : op.inputs) uses[in]++;
    if (!op.sum_input.empty()) uses[op.sum_input]++;
  }
  for (const auto& o : outs) uses[o]++;
  return uses;
}

// The ops not merged into another, each followed by the copies made of it.
std::vector<Executor::Op> KeepLive(std::vector<Executor::Op> ops, const std::vector<char>& dead,
                                   std::map<size_t, std::vector<Executor::Op>> copies) {
  std::vector<Executor::Op> kept;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!dead[i]) kept.push_back(std::move(ops[i]));
    for (auto& copy : copies[i]) kept.push_back(std::move(copy));
  }
  return kept;
}

// Merges single-consumer elementwise ops into their producer (Conv or Eltwise). A cut tensor
// (`outs`) that the merge would leave uncomputed is computed by a copy of its producer as it was
// (the model cut there alone computes it just so), run right after it.
std::vector<Executor::Op> FuseEltwise(std::vector<Executor::Op> ops, const std::vector<std::string>& outs) {
  auto uses = UseCounts(ops, {});
  const std::set<std::string> cuts(outs.begin(), outs.end());
  std::map<size_t, std::vector<Executor::Op>> copies;  // by the op they follow
  std::map<std::string, size_t> producer;
  std::vector<char> dead(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    Executor::Op& op = ops[i];
    if (op.kind == Kind::kEltwise) {
      auto p = producer.find(op.inputs[0]);
      if (p != producer.end() && uses[op.inputs[0]] == 1) {
        Executor::Op& prev = ops[p->second];
        if (prev.kind == Kind::kConv || prev.kind == Kind::kEltwise || prev.kind == Kind::kGemm) {
          if (cuts.count(prev.output)) copies[p->second].push_back(prev);
          auto& chain = prev.sum_input.empty() ? prev.post : prev.post_sum;
          for (const auto& s : op.post) PushStep(chain, s);
          prev.output = op.output;
          producer[op.output] = p->second;
          dead[i] = 1;
          continue;
        }
      }
    }
    producer[op.output] = i;
  }
  return KeepLive(std::move(ops), dead, std::move(copies));
}

// Residual adds fused as a convolution's "sum" post-op, now that shapes are known: Add(conv_out,
// other) of equal shapes, where the convolution's output has no other reader and `other`
// exists when the convolution runs. A cut convolution output (`outs`) is computed too, by a copy
// of the convolution without the add.
std::vector<Executor::Op> FoldResidualAdds(std::vector<Executor::Op> ops, const std::map<std::string, Dims>& shapes,
                                           const std::vector<std::string>& outs) {
  using Op = Executor::Op;
  std::map<std::string, size_t> producer;
  auto uses = UseCounts(ops, {});
  const std::set<std::string> cuts(outs.begin(), outs.end());
  std::map<size_t, std::vector<Op>> copies;  // a cut convolution's output, computed as before the fold
  std::vector<char> dead(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    if (op.kind == Kind::kBinary && op.bin == algorithm::binary_add && shapes.count(op.inputs[0]) &&
        shapes.count(op.inputs[1]) && shapes.at(op.inputs[0]) == shapes.at(op.inputs[1])) {
      for (int side = 0; side < 2; ++side) {
        auto p = producer.find(op.inputs[side]);
        if (p == producer.end() || uses[op.inputs[side]] != 1) continue;
        Op& conv = ops[p->second];
        if (conv.kind != Kind::kConv || !conv.sum_input.empty()) continue;
        // The residual must already exist when the convolution runs.
        auto other = producer.find(op.inputs[1 - side]);
        if (other != producer.end() && other->second > p->second) continue;
        if (cuts.count(conv.output)) copies[p->second].push_back(conv);
        conv.sum_input = op.inputs[1 - side];
        conv.output = op.output;
        dead[i] = 1;
        producer[op.output] = p->second;
        break;
      }
      if (dead[i]) continue;
    }
    producer[op.output] = i;
  }
  return KeepLive(std::move(ops), dead, std::move(copies));
}

}  // namespace msaflow::kernels::exec
