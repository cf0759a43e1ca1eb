#include "kernels/tail.h"

#include <algorithm>
#include <set>

#include "common/error.h"
#include "common/strings.h"

namespace msaflow::kernels {

namespace {

bool IsConst(const Graph& g, const std::string& t) { return g.consts.count(t) != 0; }

// Whether node i of g holds a weight training could change.
bool HasWeights(const Graph& g, const Node& n) {
  for (size_t k : TrainableInputs(n))
    if (k < n.inputs.size() && IsConst(g, n.inputs[k])) return true;
  return false;
}

// The nodes from `start` on that read, directly or not, what node `start` computes.
std::vector<size_t> Descendants(const Graph& g, size_t start, std::set<std::string>* computed) {
  std::vector<size_t> nodes{start};
  computed->insert(g.nodes[start].outputs.begin(), g.nodes[start].outputs.end());
  for (size_t i = start + 1; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (std::none_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& t) { return computed->count(t) != 0; }))
      continue;
    nodes.push_back(i);
    computed->insert(n.outputs.begin(), n.outputs.end());
  }
  return nodes;
}

size_t FindStart(const Graph& g, const std::string& from) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == from) return i;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs)
      if (o == from) return i;
  std::vector<std::string> names;
  for (const auto& n : g.nodes) names.push_back(n.name);
  Throw(ErrorKind::kNotFound, "train_from '" + from + "': no layer of the cut model (up to '" + g.output +
                                  "') has that name" + DidYouMean(from, names));
}

// The first layer with weights after node `after` that the cut depends on, or "".
std::string LaterStart(const Graph& g, size_t after) {
  for (size_t j = after + 1; j < g.nodes.size(); ++j) {
    if (!HasWeights(g, g.nodes[j])) continue;
    std::set<std::string> computed;
    Descendants(g, j, &computed);
    if (computed.count(g.output)) return g.nodes[j].name;
  }
  return "";
}

}  // namespace

TailSplit SplitTail(const Graph& g, const std::string& from) {
  if (!g.more_outputs.empty())
    Throw(ErrorKind::kUnsupported, "train_from '" + from + "': a model cut at several layers does not fine-tune");
  const size_t start = FindStart(g, from);
  std::set<std::string> computed;
  TailSplit split;
  split.nodes = Descendants(g, start, &computed);
  if (!computed.count(g.output))
    Throw(ErrorKind::kInvalidInput, "train_from '" + from + "': the cut '" + g.output +
                                        "' does not depend on it (train_from must lie before the cut)");
  for (size_t i : split.nodes) {
    const Node& n = g.nodes[i];
    if (HasBackward(n.op)) continue;
    size_t last = i;
    for (size_t j : split.nodes)
      if (!HasBackward(g.nodes[j].op)) last = j;
    const std::string later = LaterStart(g, last);
    Throw(ErrorKind::kUnsupported, "train_from '" + from + "': layer '" + n.name + "' (" + n.op +
                                       ") has no backward pass in msaflow; " +
                                       (later.empty() ? "no later layer with weights leaves it out"
                                                      : "the nearest later layer to train from is '" + later + "'") +
                                       " (docs/finetune.md lists the operators that train)");
  }
  if (std::none_of(split.nodes.begin(), split.nodes.end(), [&](size_t i) { return HasWeights(g, g.nodes[i]); }))
    Throw(ErrorKind::kInvalidInput,
          "train_from '" + from + "': the layers from it to the cut '" + g.output + "' hold no weights to train");
  for (size_t i : split.nodes)
    for (const auto& t : g.nodes[i].inputs)
      if (!t.empty() && !computed.count(t) && !IsConst(g, t) &&
          std::find(split.inputs.begin(), split.inputs.end(), t) == split.inputs.end())
        split.inputs.push_back(t);
  return split;
}

Tail::Tail(const Graph& graph, const std::string& from) : graph_(graph), split_(SplitTail(graph, from)) {
  std::set<size_t> in_tail(split_.nodes.begin(), split_.nodes.end());
  std::set<std::string> read_outside;
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    if (!in_tail.count(i)) read_outside.insert(graph_.nodes[i].inputs.begin(), graph_.nodes[i].inputs.end());
  // The params first: the ops keep pointers into them.
  std::map<std::string, size_t> param_of;
  for (size_t pos = 0; pos < split_.nodes.size(); ++pos) {
    const Node& n = graph_.nodes[split_.nodes[pos]];
    for (size_t k : TrainableInputs(n)) {
      if (k >= n.inputs.size() || !IsConst(graph_, n.inputs[k]) || read_outside.count(n.inputs[k]) ||
          param_of.count(n.inputs[k]))
        continue;
      const ConstTensor& c = graph_.consts.at(n.inputs[k]);
      param_of[n.inputs[k]] = params_.size();
      params_.push_back({n.inputs[k], c.dims, c.data, std::vector<float>(c.data.size(), 0.f)});
      first_reader_.push_back(pos);
    }
  }
  for (size_t i : split_.nodes) {
    const Node& n = graph_.nodes[i];
    std::vector<WeightRef> weights(n.inputs.size());
    const std::vector<size_t> trainable = TrainableInputs(n);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& t = n.inputs[k];
      const bool weight_slot = std::find(trainable.begin(), trainable.end(), k) != trainable.end();
      if (t.empty() || !IsConst(graph_, t)) continue;
      if (!weight_slot) {
        const ConstTensor& c = graph_.consts.at(t);
        consts_[t] = Act{c.dims, c.data};
      } else if (auto p = param_of.find(t); p != param_of.end()) {
        TailParam& param = params_[p->second];
        weights[k] = {&param.value, &param.grad, param.dims};
      } else {
        const ConstTensor& c = graph_.consts.at(t);
        weights[k] = {&c.data, nullptr, c.dims};
      }
    }
    ops_.push_back(MakeTailOp(graph_, n, weights));
  }
  // A convolution whose output only an activation reads takes the activation over: the tail
  // keeps neither the convolution's output nor a second pass over it (docs/finetune.md).
  std::map<std::string, int> readers;
  for (const Node& n : graph_.nodes)
    for (const auto& t : n.inputs) ++readers[t];
  std::map<std::string, size_t> position_of;
  for (size_t pos = 0; pos < split_.nodes.size(); ++pos)
    for (const auto& t : graph_.nodes[split_.nodes[pos]].outputs) position_of[t] = pos;
  writes_.resize(split_.nodes.size());
  taken_over_.assign(split_.nodes.size(), false);
  for (size_t pos = 0; pos < split_.nodes.size(); ++pos) writes_[pos] = graph_.nodes[split_.nodes[pos]].outputs[0];
  for (size_t pos = 0; pos < split_.nodes.size(); ++pos) {
    const Node& act = graph_.nodes[split_.nodes[pos]];
    if (act.inputs.empty() || act.outputs.size() != 1) continue;
    const auto from = position_of.find(act.inputs[0]);
    if (from == position_of.end() || readers[act.inputs[0]] != 1 || act.inputs[0] == graph_.output) continue;
    const Node& conv = graph_.nodes[split_.nodes[from->second]];
    if (conv.op != "Conv" || conv.outputs.size() != 1 || taken_over_[from->second]) continue;
    const std::optional<Activation> a = FusableActivation(graph_, act);
    if (!a || !ops_[from->second]->Fuse(*a)) continue;
    writes_[from->second] = act.outputs[0];
    taken_over_[pos] = true;
  }
}

Tail::~Tail() = default;

std::vector<std::string> Tail::NodeNames() const {
  std::vector<std::string> names;
  for (size_t i : split_.nodes) names.push_back(graph_.nodes[i].name);
  return names;
}

int64_t Tail::ParamCount() const {
  int64_t n = 0;
  for (const auto& p : params_) n += static_cast<int64_t>(p.value.size());
  return n;
}

const std::vector<float>& Tail::Forward(const std::vector<const float*>& xs, const std::vector<TensorDims>& dims) {
  if (xs.size() != split_.inputs.size() || dims.size() != xs.size())
    Throw(ErrorKind::kInternal, "Tail::Forward: " + std::to_string(xs.size()) + " inputs given, the tail reads " +
                                    std::to_string(split_.inputs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    if (dims[i].empty() || dims[i][0] != dims[0][0])
      Throw(ErrorKind::kInvalidInput, "tail input '" + split_.inputs[i] + "': every input needs the same batch size");
    Act& a = acts_[split_.inputs[i]];
    a.dims = dims[i];
    a.cl = dims[i].size() == 4;  // images are kept channels-last (kernels/tail_ops.h)
    if (a.cl) {
      a.v.resize(static_cast<size_t>(NumElements(dims[i])));
      ToChannelsLast(xs[i], dims[i], a.v.data());
    } else {
      a.v.assign(xs[i], xs[i] + NumElements(dims[i]));
    }
  }
  for (size_t k = 0; k < split_.nodes.size(); ++k) {
    if (taken_over_[k]) continue;  // its convolution wrote its output
    const Node& n = graph_.nodes[split_.nodes[k]];
    std::vector<const Act*> in(n.inputs.size(), nullptr);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (auto a = acts_.find(n.inputs[j]); a != acts_.end()) {
        in[j] = &a->second;
      } else if (auto c = consts_.find(n.inputs[j]); c != consts_.end()) {
        in[j] = &c->second;
      }
    }
    ops_[k]->Forward(in, &acts_[writes_[k]]);
  }
  const Act& out = acts_.at(graph_.output);
  out_dims_ = out.dims;
  if (out.dims.size() != 4 && out.dims.size() != 2)
    Throw(ErrorKind::kUnsupported, "the cut '" + graph_.output + "' must be NCHW or N x features to fine-tune");
  const int64_t n = out.dims[0], c = out.dims[1], hw = out.dims.size() == 4 ? out.dims[2] * out.dims[3] : 1;
  feature_dim_ = c;
  features_.assign(static_cast<size_t>(n * c), 0.f);
  // The mean over the pixels of each image's channels (an image is channels-last, or hw is 1).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> s(static_cast<size_t>(c), 0.0);
    for (int64_t j = 0; j < hw; ++j)
      for (int64_t k = 0; k < c; ++k) s[static_cast<size_t>(k)] += out.v[static_cast<size_t>((i * hw + j) * c + k)];
    for (int64_t k = 0; k < c; ++k)
      features_[static_cast<size_t>(i * c + k)] =
          static_cast<float>(s[static_cast<size_t>(k)] / static_cast<double>(hw));
  }
  return features_;
}

void Tail::Backward(const float* dfeat, std::vector<std::vector<float>>* input_grads, const FinalFrom& final_from) {
  for (auto& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.f);
  std::set<std::string> computed, inputs(split_.inputs.begin(), split_.inputs.end());
  for (size_t i : split_.nodes) computed.insert(graph_.nodes[i].outputs.begin(), graph_.nodes[i].outputs.end());
  // The gradients' buffers are kept from batch to batch (allocating them anew cost more than
  // the elementwise operators' arithmetic: fresh pages fault in).
  std::map<std::string, Act>& grads = grads_;
  std::set<std::string> written;
  // The pooling: each position's share of its channel's mean.
  Act& seed = grads[graph_.output];
  seed.dims = out_dims_;
  seed.cl = out_dims_.size() == 4;
  const int64_t n = out_dims_[0], c = out_dims_[1], hw = NumElements(out_dims_) / (n * c);
  seed.v.resize(static_cast<size_t>(n * hw * c));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < hw; ++j)
      for (int64_t k = 0; k < c; ++k)
        seed.v[static_cast<size_t>((i * hw + j) * c + k)] = dfeat[i * c + k] / static_cast<float>(hw);
  written.insert(graph_.output);
  size_t final_from_param = params_.size();
  // After position k: every param whose first reader is at k or later has all its gradient.
  auto done_with = [&](size_t k) {
    while (final_from_param > 0 && first_reader_[final_from_param - 1] >= k) --final_from_param;
    if (final_from) final_from(final_from_param);
  };
  for (size_t k = split_.nodes.size(); k-- > 0;) {
    const Node& n = graph_.nodes[split_.nodes[k]];
    if (taken_over_[k] || !written.count(writes_[k])) {  // its convolution's, or nothing after it reaches the cut
      done_with(k);
      continue;
    }
    auto dout = grads.find(writes_[k]);
    std::vector<const Act*> in(n.inputs.size(), nullptr);
    std::vector<GradOut> din(n.inputs.size());
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const std::string& t = n.inputs[j];
      if (auto a = acts_.find(t); a != acts_.end())
        in[j] = &a->second;
      else if (auto c = consts_.find(t); c != consts_.end())
        in[j] = &c->second;
      if (t.empty() || !(computed.count(t) || (input_grads && inputs.count(t)))) continue;
      din[j] = {&grads[t], written.count(t) != 0};
      written.insert(t);
    }
    ops_[k]->Backward(in, acts_.at(writes_[k]), dout->second, din);
    done_with(k);
  }
  if (!input_grads) return;
  input_grads->clear();
  for (const auto& t : split_.inputs) {
    auto g = grads.find(t);
    std::vector<float> v(acts_.at(t).v.size(), 0.f);
    if (g != grads.end() && written.count(t) && g->second.cl)
      ToChannelsFirst(g->second.v.data(), g->second.dims, v.data());
    else if (g != grads.end() && written.count(t))
      v = g->second.v;
    input_grads->push_back(std::move(v));
  }
}

int64_t Tail::KeptValuesPerImage(const std::vector<TensorDims>& image_dims) {
  std::vector<std::vector<float>> zeros;
  std::vector<const float*> xs;
  std::vector<TensorDims> dims;
  for (const TensorDims& d : image_dims) {
    zeros.emplace_back(static_cast<size_t>(NumElements(d)), 0.f);
    xs.push_back(zeros.back().data());
    dims.push_back(d);
    dims.back().insert(dims.back().begin(), 1);
  }
  const std::vector<float> dfeat(Forward(xs, dims).size(), 0.f);
  Backward(dfeat.data());
  return KeptValues();
}

int64_t Tail::KeptValues() const {
  int64_t n = 0, grad = 0, add = 0;
  for (const auto* m : {&acts_, &grads_})
    for (const auto& [_, a] : *m) n += static_cast<int64_t>(a.v.size());
  for (const auto& op : ops_) {
    grad = std::max(grad, op->Scratches().grad);
    add = std::max(add, op->Scratches().add);
  }
  return n + grad + add;
}

void Tail::WriteWeights(Graph* g) const {
  for (const auto& p : params_) {
    auto it = g->consts.find(p.name);
    if (it == g->consts.end() || it->second.data.size() != p.value.size())
      Throw(ErrorKind::kInvalidInput, "fine-tuned weight '" + p.name + "' has no initializer of its size in the model");
    it->second.data = p.value;
  }
}

}  // namespace msaflow::kernels
