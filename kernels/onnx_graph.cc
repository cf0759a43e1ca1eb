#include "kernels/onnx_graph.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>

#include "common/error.h"
#include "common/strings.h"

namespace msaflow::kernels {
namespace {

const std::set<std::string>& SupportedOps() {
  static const std::set<std::string> ops = {
      "Conv",    "BatchNormalization", "Relu",    "Clip",    "HardSigmoid", "HardSwish",
      "Sigmoid", "Add",                "Sub",     "Mul",     "Div",         "GlobalAveragePool",
      "AveragePool", "MaxPool",        "Concat",  "Identity", "Dropout",    "Constant",
      // Data layout and pooling as exported CNNs write them.
      "Pad",     "ReduceMean",         "Flatten", "Reshape", "Squeeze",     "Unsqueeze",
      "Transpose", "Slice",            "Split",   "Gemm",    "MatMul",
      // Shape arithmetic, folded when a plan is compiled (kernels/fold.cc).
      "Shape",   "Gather",             "Cast",    "ConstantOfShape"};
  return ops;
}

ConstTensor ToConst(const onnx::TensorProto& t, const std::string& where) {
  ConstTensor c;
  int64_t n = 1;
  for (auto d : t.dims()) {
    if (d < 0) Throw(ErrorKind::kInvalidInput, where + ": negative dimension in tensor " + t.name());
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      Throw(ErrorKind::kInvalidInput, where + ": tensor '" + t.name() + "' has dims whose product overflows 64 bits");
    c.dims.push_back(d);
    n *= d;
  }
  const bool raw = t.has_raw_data();
  size_t width = 0;
  int64_t have = 0;
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      width = 4;
      have = raw ? static_cast<int64_t>(t.raw_data().size() / 4) : t.float_data_size();
      break;
    case onnx::TensorProto::INT64:
      width = 8;
      have = raw ? static_cast<int64_t>(t.raw_data().size() / 8) : t.int64_data_size();
      break;
    case onnx::TensorProto::INT32:
      width = 4;
      have = raw ? static_cast<int64_t>(t.raw_data().size() / 4) : t.int32_data_size();
      break;
    default:
      Throw(ErrorKind::kUnsupported, where + ": tensor '" + t.name() + "' has data type " +
                                         std::to_string(t.data_type()) + "; expected float, int64 or int32");
  }
  // Checked before anything is allocated: dims cannot make a small file claim gigabytes.
  if (raw && t.raw_data().size() % width != 0)
    Throw(ErrorKind::kInvalidInput, where + ": tensor '" + t.name() + "' has " + std::to_string(t.raw_data().size()) +
                                        " bytes of raw data, not a whole number of " + std::to_string(width) +
                                        "-byte values");
  if (have != n)
    Throw(ErrorKind::kInvalidInput, where + ": tensor '" + t.name() + "' holds " + std::to_string(have) +
                                        " values, its dims say " + std::to_string(n));
  c.data.resize(static_cast<size_t>(n));
  if (t.data_type() == onnx::TensorProto::FLOAT && raw) {
    std::memcpy(c.data.data(), t.raw_data().data(), static_cast<size_t>(n) * 4);
  } else if (t.data_type() == onnx::TensorProto::FLOAT) {
    std::copy(t.float_data().begin(), t.float_data().end(), c.data.begin());
  } else {
    c.is_int = true;
    c.ints.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int64_t v;
      if (width == 8 && raw) {
        std::memcpy(&v, t.raw_data().data() + 8 * i, 8);
      } else if (width == 8) {
        v = t.int64_data(static_cast<int>(i));
      } else {
        int32_t v32;
        if (raw) {
          std::memcpy(&v32, t.raw_data().data() + 4 * i, 4);
        } else {
          v32 = t.int32_data(static_cast<int>(i));
        }
        v = v32;
      }
      c.ints[static_cast<size_t>(i)] = v;
      c.data[static_cast<size_t>(i)] = static_cast<float>(v);
    }
  }
  return c;
}

onnx::ModelProto Parse(const std::string& bytes, const std::string& origin) {
  onnx::ModelProto m;
  if (bytes.empty()) Throw(ErrorKind::kInvalidInput, origin + ": empty file; expected an ONNX model");
  if (!m.ParseFromString(bytes))
    Throw(ErrorKind::kInvalidInput,
          origin + ": not a valid ONNX protobuf (truncated or not an ONNX file; " +
              std::to_string(bytes.size()) + " bytes read)");
  if (!m.has_graph() || m.graph().node_size() == 0)
    Throw(ErrorKind::kInvalidInput, origin + ": ONNX model has no graph nodes");
  return m;
}

// Indices of the nodes `cut` depends on, in file order; throws if `cut` is no tensor.
std::vector<int> NeededNodes(const onnx::GraphProto& g, const std::string& origin, const std::string& cut) {
  std::map<std::string, int> producer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& o : g.node(i).output()) producer[o] = i;
  if (!producer.count(cut)) {
    std::vector<std::string> names;
    names.reserve(producer.size());
    for (const auto& [k, v] : producer) names.push_back(k);
    std::string hint = DidYouMean(cut, names);
    Throw(ErrorKind::kNotFound, origin + ": no tensor named '" + cut + "' (the feature layer)" + hint);
  }
  std::vector<char> need(static_cast<size_t>(g.node_size()), 0);
  std::vector<std::string> stack{cut};
  while (!stack.empty()) {
    std::string t = stack.back();
    stack.pop_back();
    auto it = producer.find(t);
    if (it == producer.end() || need[static_cast<size_t>(it->second)]) continue;
    need[static_cast<size_t>(it->second)] = 1;
    for (const auto& in : g.node(it->second).input())
      if (!in.empty()) stack.push_back(in);
  }
  std::vector<int> out;
  for (int i = 0; i < g.node_size(); ++i)
    if (need[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

// Among the needed nodes, a chain of tensors that leads from `start`'s output back to it
// ("a -> b -> a"), or "" when there is no cycle through it.
std::string CycleThrough(const onnx::GraphProto& g, const std::vector<int>& need, int start) {
  std::map<std::string, int> producer;
  for (int i : need)
    for (const auto& o : g.node(i).output()) producer[o] = i;
  // Depth-first from start's inputs, remembering the path of node indices.
  std::vector<int> path{start};
  std::set<int> seen;
  std::function<bool(int)> reaches = [&](int node) -> bool {
    for (const auto& in : g.node(node).input()) {
      auto it = producer.find(in);
      if (it == producer.end()) continue;
      if (it->second == start) return true;
      if (!seen.insert(it->second).second) continue;
      path.push_back(it->second);
      if (reaches(it->second)) return true;
      path.pop_back();
    }
    return false;
  };
  if (!reaches(start)) return "";
  std::string chain;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const auto& n = g.node(*it);
    chain += (chain.empty() ? "" : " -> ") + (n.output_size() ? n.output(0) : "#" + std::to_string(*it));
  }
  const auto& last = g.node(path.back());
  return chain + " -> " + (last.output_size() ? last.output(0) : "#" + std::to_string(path.back()));
}

}  // namespace

int64_t Node::Int(const std::string& a, int64_t dflt) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? dflt : it->second.i;
}
float Node::Float(const std::string& a, float dflt) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? dflt : it->second.f;
}
std::vector<int64_t> Node::Ints(const std::string& a) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? std::vector<int64_t>{} : it->second.ints;
}
std::string Node::Str(const std::string& a, const std::string& dflt) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? dflt : it->second.s;
}

bool IsSupportedOp(const std::string& op) { return SupportedOps().count(op) != 0; }

Graph ImportOnnx(const std::string& bytes, const std::string& origin, const std::string& cut) {
  return ImportOnnxCuts(bytes, origin, {cut});
}

Graph ImportOnnxCuts(const std::string& bytes, const std::string& origin, const std::vector<std::string>& cuts) {
  if (cuts.empty()) Throw(ErrorKind::kInvalidInput, origin + ": no feature layer to cut at");
  const std::string& cut = cuts[0];
  onnx::ModelProto m = Parse(bytes, origin);
  const auto& g = m.graph();
  Graph out;
  for (const auto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") out.opset = op.version();
  for (const auto& init : g.initializer()) out.consts[init.name()] = ToConst(init, origin);

  std::vector<int> need;  // what any cut depends on, in the model's order
  for (const auto& c : cuts) {
    std::vector<int> more = NeededNodes(g, origin, c), both;
    std::set_union(need.begin(), need.end(), more.begin(), more.end(), std::back_inserter(both));
    need = std::move(both);
  }
  std::map<std::string, int> producer_of;  // among the needed nodes
  for (int idx : need)
    for (const auto& o : g.node(idx).output()) producer_of[o] = idx;
  std::set<std::string> produced;
  for (int idx : need) {
    const auto& np = g.node(idx);
    Node n;
    n.op = np.op_type();
    n.name = np.name().empty() ? (np.output_size() ? np.output(0) : "#" + std::to_string(idx)) : np.name();
    std::string where = origin + ": node '" + n.name + "' (" + n.op + ")";
    if (!np.domain().empty() && np.domain() != "ai.onnx")
      Throw(ErrorKind::kUnsupported, where + ": operator domain '" + np.domain() + "' is not supported");
    if (!IsSupportedOp(n.op))
      Throw(ErrorKind::kUnsupported, where + ": operator " + n.op +
                                         " is not supported by the msaflow executor (supported: " +
                                         Join(std::vector<std::string>(SupportedOps().begin(), SupportedOps().end()), ", ") + ")");
    for (const auto& a : np.attribute()) {
      Attr at;
      at.i = a.i();
      at.f = a.f();
      at.s = a.s();
      at.ints.assign(a.ints().begin(), a.ints().end());
      at.floats.assign(a.floats().begin(), a.floats().end());
      if (a.has_t()) {
        at.has_tensor = true;
        at.t = ToConst(a.t(), where);
      }
      n.attrs[a.name()] = std::move(at);
    }
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    if (n.op == "Constant") {
      if (!n.Has("value") || !n.attrs["value"].has_tensor)
        Throw(ErrorKind::kUnsupported, where + ": only Constant with a 'value' tensor is supported");
      out.consts[n.outputs.at(0)] = n.attrs["value"].t;
      continue;
    }
    for (const auto& in : n.inputs) {
      if (in.empty() || out.consts.count(in) || produced.count(in)) continue;
      if (producer_of.count(in)) {
        // Produced, but by a node further on: a cycle, or nodes out of order.
        std::string cycle = CycleThrough(g, need, idx);
        if (!cycle.empty())
          Throw(ErrorKind::kInvalidInput, where + ": the graph has a cycle (" + cycle + "); an ONNX graph must be acyclic");
        Throw(ErrorKind::kInvalidInput, where + ": reads '" + in + "' before the node producing it; ONNX requires the "
                                                "nodes in topological order");
      }
      if (out.input.empty()) {
        out.input = in;
      } else if (out.input != in) {
        Throw(ErrorKind::kUnsupported, where + ": reads a second graph input '" + in + "' (besides '" +
                                           out.input + "'); one image input is supported");
      }
    }
    for (const auto& o : n.outputs) produced.insert(o);
    out.nodes.push_back(std::move(n));
  }
  if (out.input.empty()) Throw(ErrorKind::kInvalidInput, origin + ": '" + cut + "' does not depend on a graph input");
  bool found = false;
  for (const auto& vi : g.input()) {
    if (vi.name() != out.input) continue;
    found = true;
    for (const auto& d : vi.type().tensor_type().shape().dim())
      out.input_dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  }
  if (!found) Throw(ErrorKind::kInvalidInput, origin + ": tensor '" + out.input + "' is neither produced, a constant nor a graph input");
  if (out.input_dims.size() != 4)
    Throw(ErrorKind::kUnsupported, origin + ": input '" + out.input + "' has rank " +
                                       std::to_string(out.input_dims.size()) + "; expected an NCHW image (rank 4)");
  out.output = cut;
  out.more_outputs.assign(cuts.begin() + 1, cuts.end());
  return out;
}

ModelLayers ListCutLayers(const std::string& bytes, const std::string& origin) {
  const onnx::ModelProto m = Parse(bytes, origin);
  const auto& g = m.graph();
  std::set<std::string> computable;  // tensors the executor can compute: the input, constants, ...
  for (const auto& init : g.initializer()) computable.insert(init.name());
  ModelLayers out;
  for (const auto& vi : g.input()) {
    if (computable.count(vi.name()) || !out.input_dims.empty()) continue;
    const auto& shape = vi.type().tensor_type().shape();
    if (shape.dim_size() != 4) continue;
    for (const auto& d : shape.dim()) out.input_dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    computable.insert(vi.name());
  }
  // Nodes whose output is no place to cut: constants, shape arithmetic, copies.
  static const std::set<std::string> kNoCut = {"Constant", "Shape",   "Gather",  "Cast",      "ConstantOfShape",
                                               "Identity", "Dropout", "Squeeze", "Unsqueeze", "Transpose",
                                               "Slice",    "Split",   "Pad"};
  std::string last_pool_input;
  for (const auto& n : g.node()) {
    bool ok = (n.domain().empty() || n.domain() == "ai.onnx") && IsSupportedOp(n.op_type());
    for (const auto& in : n.input()) ok = ok && (in.empty() || computable.count(in) != 0);
    if (!ok || n.output_size() == 0) continue;
    for (const auto& o : n.output()) computable.insert(o);
    if ((n.op_type() == "GlobalAveragePool" || n.op_type() == "ReduceMean") && n.input_size() > 0)
      last_pool_input = n.input(0);
    if (!kNoCut.count(n.op_type()))
      out.layers.push_back({n.output(0), n.name().empty() ? n.output(0) : n.name(), n.op_type()});
  }
  const bool pool_listed =
      std::any_of(out.layers.begin(), out.layers.end(), [&](const CutLayer& l) { return l.name == last_pool_input; });
  out.suggested = pool_listed ? last_pool_input : out.layers.empty() ? "" : out.layers.back().name;
  return out;
}

std::string CutOnnx(const std::string& bytes, const std::string& origin, const std::string& cut) {
  onnx::ModelProto m = Parse(bytes, origin);
  onnx::GraphProto* g = m.mutable_graph();
  std::vector<int> need = NeededNodes(*g, origin, cut);
  std::set<std::string> used;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int idx : need) {
    for (const auto& in : g->node(idx).input()) used.insert(in);
    *kept.Add() = g->node(idx);
  }
  g->mutable_node()->Swap(&kept);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  for (const auto& t : g->initializer())
    if (used.count(t.name())) *inits.Add() = t;
  g->mutable_initializer()->Swap(&inits);
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> inputs;
  for (const auto& vi : g->input())
    if (used.count(vi.name())) *inputs.Add() = vi;
  g->mutable_input()->Swap(&inputs);
  g->clear_value_info();
  g->clear_output();
  auto* o = g->add_output();
  o->set_name(cut);
  o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  std::string out;
  m.SerializeToString(&out);
  return out;
}

}  // namespace msaflow::kernels

namespace msaflow::kernels {

std::string ReplaceInitializers(const std::string& bytes, const std::string& origin,
                                const std::map<std::string, std::vector<float>>& values) {
  onnx::ModelProto m = Parse(bytes, origin);
  std::map<std::string, bool> found;
  for (const auto& [name, v] : values) found[name] = false;
  for (onnx::TensorProto& t : *m.mutable_graph()->mutable_initializer()) {
    auto it = values.find(t.name());
    if (it == values.end()) continue;
    int64_t n = 1;
    for (int64_t d : t.dims()) n *= d;
    if (t.data_type() != onnx::TensorProto::FLOAT || n != static_cast<int64_t>(it->second.size()))
      Throw(ErrorKind::kInvalidInput, origin + ": initializer '" + t.name() + "' is not " +
                                          std::to_string(it->second.size()) +
                                          " float values; the trained weights do not fit this model");
    t.clear_float_data();
    t.set_raw_data(std::string(reinterpret_cast<const char*>(it->second.data()), it->second.size() * sizeof(float)));
    found[t.name()] = true;
  }
  for (const auto& [name, ok] : found)
    if (!ok) Throw(ErrorKind::kInvalidInput, origin + ": no initializer '" + name + "' for a trained weight");
  std::string out;
  if (!m.SerializeToString(&out)) Throw(ErrorKind::kIo, origin + ": the model could not be serialised");
  return out;
}

std::string RoundThroughHalfAt(const std::string& bytes, const std::string& origin,
                               const std::vector<std::string>& tensors) {
  onnx::ModelProto m = Parse(bytes, origin);
  onnx::GraphProto& g = *m.mutable_graph();
  for (const std::string& t : tensors) {
    int producer = -1;
    for (int i = 0; i < g.node_size() && producer < 0; ++i)
      for (const auto& o : g.node(i).output())
        if (o == t) producer = i;
    if (producer < 0) Throw(ErrorKind::kInvalidInput, origin + ": no node computes tensor '" + t + "'");
    // Not msaflow/: predict drops the nodes of that name from an export (its own preprocessing and head).
    const std::string half = "msaflow.f16/" + t, rounded = "msaflow.f16/" + t + "/rounded";
    for (auto& n : *g.mutable_node())
      for (auto& in : *n.mutable_input())
        if (in == t) in = rounded;
    onnx::NodeProto down, up;
    down.set_op_type("Cast");
    down.set_name(half);
    down.add_input(t);
    down.add_output(half);
    auto* a = down.add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(onnx::TensorProto::FLOAT16);
    up = down;
    up.set_name(rounded);
    up.set_input(0, half);
    up.set_output(0, rounded);
    up.mutable_attribute(0)->set_i(onnx::TensorProto::FLOAT);
    // Right after the producer: the graph's nodes stay sorted.
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int i = 0; i < g.node_size(); ++i) {
      *nodes.Add() = g.node(i);
      if (i == producer) {
        *nodes.Add() = down;
        *nodes.Add() = up;
      }
    }
    g.mutable_node()->Swap(&nodes);
  }
  std::string out;
  if (!m.SerializeToString(&out)) Throw(ErrorKind::kIo, origin + ": the model could not be serialised");
  return out;
}

}  // namespace msaflow::kernels
