#include "kernels/onnx_export.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "common/error.h"
#include "common/version.h"
#include "kernels/onnx_graph.h"

namespace msaflow::kernels {
namespace {

constexpr int64_t kOpset = 13;
constexpr int64_t kIrVersion = 7;  // the IR version of opset 13 (ONNX 1.8)

using Dims = std::vector<int64_t>;

class Builder {
 public:
  explicit Builder(onnx::GraphProto* g) : g_(g) {}

  void Floats(const std::string& name, const Dims& dims, const float* v, size_t n) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(v), n * sizeof(float)));
  }
  void Floats(const std::string& name, const Dims& dims, const std::vector<float>& v) {
    Floats(name, dims, v.data(), v.size());
  }
  void Ints(const std::string& name, const std::vector<int64_t>& v) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(v.size()));
    t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t)));
  }
  onnx::NodeProto* Node(const std::string& op, const std::vector<std::string>& in, const std::string& out) {
    onnx::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(out.rfind("msaflow/", 0) == 0 ? out : "msaflow/" + out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }
  static void Int(onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void Float(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void Str(onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  static void IntList(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }

 private:
  onnx::GraphProto* g_;
};

// Dimensions left to the caller: any batch; any image size where the graph resizes, or where
// the backbone is convolutional up to its pooling (OpenCV's dnn 4.6 mis-sizes batches above 1
// when every dimension but the batch is fixed, so the model's height and width are named).
constexpr int64_t kBatchDim = -1, kHeightDim = -2, kWidthDim = -3;

// Sets a value's type: elem_type and dims (the negative ones named, as above).
void SetType(onnx::ValueInfoProto* v, const std::string& name, int elem, const Dims& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  shape->clear_dim();
  for (int64_t d : dims) {
    auto* dim = shape->add_dim();
    if (d < 0) {
      dim->set_dim_param(d == kBatchDim ? "N" : d == kHeightDim ? "height" : "width");
    } else {
      dim->set_dim_value(d);
    }
  }
}

const onnx::AttributeProto* FindAttr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void DropAttrs(onnx::NodeProto* n, const std::set<std::string>& names) {
  google::protobuf::RepeatedPtrField<onnx::AttributeProto> kept;
  for (const auto& a : n->attribute())
    if (!names.count(a.name())) *kept.Add() = a;
  n->mutable_attribute()->Swap(&kept);
}

// The graph's one-value float constants (initializers and Constant nodes), for Clip's bounds.
std::map<std::string, float> ScalarConstants(const onnx::GraphProto& g) {
  std::map<std::string, float> scalars;
  auto scalar_of = [](const onnx::TensorProto& t, float* v) {
    if (t.data_type() != onnx::TensorProto::FLOAT) return false;
    if (t.has_raw_data() && t.raw_data().size() == sizeof(float)) {
      std::memcpy(v, t.raw_data().data(), sizeof(float));
      return true;
    }
    if (t.float_data_size() == 1) {
      *v = t.float_data(0);
      return true;
    }
    return false;
  };
  for (const auto& t : g.initializer()) {
    float v;
    if (scalar_of(t, &v)) scalars[t.name()] = v;
  }
  for (const auto& nd : g.node()) {
    float v;
    if (nd.op_type() == "Constant" && nd.output_size() == 1)
      if (const auto* a = FindAttr(nd, "value"); a && a->has_t() && scalar_of(a->t(), &v)) scalars[nd.output(0)] = v;
  }
  return scalars;
}

// Clip(x, lo, hi) written without Clip: OpenCV's dnn (4.6, Debian 12's) reads only Clip's
// opset-6 form, whose bounds are attributes, which opset 13 no longer allows.
// clip(x, lo, hi) is lo + (hi - lo) * HardSigmoid(x; 1 / (hi - lo), -lo / (hi - lo)), within a
// rounding of the original; a lower bound of 0 and none above is a Relu, exactly.
// inference/predict.cc recognises the pattern by its names and puts the Clip back.
void RewriteClip(const onnx::NodeProto& n, int64_t opset, const std::map<std::string, float>& scalars,
                 const std::string& tag, const std::string& where, Builder& b,
                 google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
  float lo = std::numeric_limits<float>::lowest(), hi = std::numeric_limits<float>::max();
  if (opset < 11) {
    if (const auto* a = FindAttr(n, "min")) lo = a->f();
    if (const auto* a = FindAttr(n, "max")) hi = a->f();
  } else {
    for (int k = 1; k <= 2 && k < n.input_size(); ++k) {
      if (n.input(k).empty()) continue;
      auto it = scalars.find(n.input(k));
      if (it == scalars.end()) Throw(ErrorKind::kUnsupported, where + ": a bound that is not a constant scalar");
      (k == 1 ? lo : hi) = it->second;
    }
  }
  const bool has_lo = lo > std::numeric_limits<float>::lowest(), has_hi = hi < std::numeric_limits<float>::max();
  const std::string x = n.input(0), y = n.output(0);
  auto node = [&](const std::string& type, const std::vector<std::string>& ins, const std::string& out_name) {
    onnx::NodeProto* p = out->Add();
    p->set_op_type(type);
    p->set_name(out_name == y ? n.name() : out_name);
    for (const auto& i : ins) p->add_input(i);
    p->add_output(out_name);
    return p;
  };
  auto scalar = [&](const std::string& name, float v) {
    b.Floats(tag + "/" + name, {}, &v, 1);
    return tag + "/" + name;
  };
  if (!has_lo && !has_hi) {
    node("Identity", {x}, y);
  } else if (has_lo && !has_hi) {
    if (lo == 0) {
      node("Relu", {x}, y);
    } else {
      node("Sub", {x, scalar("lo", lo)}, tag + "/shifted");
      node("Relu", {tag + "/shifted"}, tag + "/relu");
      node("Add", {tag + "/relu", tag + "/lo"}, y);
    }
  } else if (!has_lo) {
    node("Sub", {scalar("hi", hi), x}, tag + "/below");
    node("Relu", {tag + "/below"}, tag + "/relu");
    node("Sub", {tag + "/hi", tag + "/relu"}, y);
  } else {
    if (!(hi > lo)) Throw(ErrorKind::kUnsupported, where + ": bounds min >= max");
    const float range = hi - lo;
    auto* sig = node("HardSigmoid", {x}, tag + "/unit");
    Builder::Float(sig, "alpha", 1.f / range);
    Builder::Float(sig, "beta", -lo / range);
    node("Mul", {tag + "/unit", scalar("range", range)}, lo == 0 ? y : tag + "/scaled");
    if (lo != 0) node("Add", {tag + "/scaled", scalar("lo", lo)}, y);
  }
}

// The backbone's nodes in their opset-13 form, appended to `out`; `b` receives new constants.
void UpgradeNodes(const onnx::GraphProto& g, int64_t opset, const std::string& origin, Builder& b,
                  google::protobuf::RepeatedPtrField<onnx::NodeProto>* out) {
  int serial = 0;
  const std::map<std::string, float> scalars = ScalarConstants(g);
  for (const auto& src : g.node()) {
    const std::string where = origin + ": node '" + (src.name().empty() ? src.output(0) : src.name()) + "' (" +
                              src.op_type() + ")";
    if (!src.domain().empty() && src.domain() != "ai.onnx")
      Throw(ErrorKind::kUnsupported, where + ": operator domain '" + src.domain() + "' cannot be exported");
    if (!IsSupportedOp(src.op_type()))
      Throw(ErrorKind::kUnsupported, where + ": operator " + src.op_type() + " is not one msaflow runs or exports");
    onnx::NodeProto n = src;
    DropAttrs(&n, {"consumed_inputs"});  // opset 1-5 only, meaningless since
    const std::string& op = n.op_type();
    const std::string tag = "msaflow.backbone/" + std::to_string(serial++);  // not msaflow/: see predict
    if (op == "Dropout") {  // inference: the identity (opset 12 moved ratio to an input)
      onnx::NodeProto id;
      id.set_name(n.name());
      id.set_op_type("Identity");
      id.add_input(n.input(0));
      id.add_output(n.output(0));
      *out->Add() = id;
      continue;
    }
    if (op == "HardSwish") {  // opset 14: x * HardSigmoid(x; 1/6, 1/2), its definition
      const std::string hs = tag + "/hardsigmoid";
      onnx::NodeProto sig;
      sig.set_name(hs);
      sig.set_op_type("HardSigmoid");
      sig.add_input(n.input(0));
      sig.add_output(hs);
      Builder::Float(&sig, "alpha", 1.f / 6.f);
      Builder::Float(&sig, "beta", 0.5f);
      *out->Add() = sig;
      onnx::NodeProto mul;
      mul.set_name(n.name());
      mul.set_op_type("Mul");
      mul.add_input(n.input(0));
      mul.add_input(hs);
      mul.add_output(n.output(0));
      *out->Add() = mul;
      continue;
    }
    if (op == "Clip") {
      RewriteClip(n, opset, scalars, tag, where, b, out);
      continue;
    }
    if (op == "BatchNormalization") {
      const auto* training = FindAttr(n, "training_mode");
      if (training && training->i() != 0) Throw(ErrorKind::kUnsupported, where + ": training_mode 1");
      DropAttrs(&n, {"spatial", "is_test", "training_mode"});
      while (n.output_size() > 1) n.mutable_output()->RemoveLast();  // the training outputs
    }
    // Lists that became inputs: axes (Squeeze, Unsqueeze, opset 13), split (Split, 13), pads and
    // value (Pad, 11), starts, ends and axes (Slice, 10). ReduceMean keeps its axes attribute
    // until opset 18.
    auto to_input = [&](const std::string& attr, size_t slot, const std::string& stem) {
      const auto* at = FindAttr(n, attr);
      if (!at) return false;
      const std::string name = tag + "/" + stem;
      b.Ints(name, std::vector<int64_t>(at->ints().begin(), at->ints().end()));
      while (static_cast<size_t>(n.input_size()) < slot) n.add_input("");
      if (static_cast<size_t>(n.input_size()) == slot) {
        n.add_input(name);
      } else {
        n.set_input(static_cast<int>(slot), name);
      }
      DropAttrs(&n, {attr});
      return true;
    };
    if ((op == "Squeeze" || op == "Unsqueeze") && opset < 13) to_input("axes", 1, "axes");
    if (op == "Split" && opset < 13) to_input("split", 1, "split");
    if (op == "Slice" && opset < 10) {
      to_input("starts", 1, "starts");
      to_input("ends", 2, "ends");
      to_input("axes", 3, "axes");
    }
    if (op == "Pad" && opset < 11) {
      const auto* v = FindAttr(n, "value");
      const float value = v ? v->f() : 0.f;
      to_input("pads", 1, "pads");
      if (value != 0.f) {
        b.Floats(tag + "/value", {}, &value, 1);
        n.add_input(tag + "/value");
      }
      DropAttrs(&n, {"value"});
    }
    if (op == "AveragePool" || op == "MaxPool") {
      if (const auto* d = FindAttr(n, "dilations")) {
        for (int64_t v : d->ints())
          if (v != 1 && op == "AveragePool") Throw(ErrorKind::kUnsupported, where + ": dilated average pooling");
        if (op == "AveragePool") DropAttrs(&n, {"dilations"});  // opset 19
      }
    }
    *out->Add() = n;
  }
}

// Raw 8-bit images [N, rows, cols, channels] -> what PrepareBatch writes, [N, C, H, W].
std::string Preprocessing(Builder& b, const ClassifierExport& e) {
  const InputSpec& in = e.input;
  const int64_t cin = e.image_channels, cout = in.channels;
  Builder::Int(b.Node("Cast", {kExportInput}, "msaflow/raw_float"), "to", onnx::TensorProto::FLOAT);
  Builder::IntList(b.Node("Transpose", {"msaflow/raw_float"}, "msaflow/raw_nchw"), "perm", {0, 3, 1, 2});
  if (e.uniform_images) {
    // Constant scales: out / in, nudged up to the next float where in * scale would fall short
    // of out (ONNX sizes the output floor(in * scale)).
    auto scale = [](int64_t from, int64_t to) {
      float s = static_cast<float>(to) / static_cast<float>(from);
      while (std::floor(static_cast<float>(from) * s) < static_cast<float>(to))
        s = std::nextafter(s, std::numeric_limits<float>::max());
      return s;
    };
    const float scales[4] = {1.f, 1.f, scale(e.image_rows, in.height), scale(e.image_cols, in.width)};
    b.Floats("msaflow/scales", {4}, scales, 4);
    auto* resize = b.Node("Resize", {"msaflow/raw_nchw", "", "msaflow/scales"}, "msaflow/resized");
    Builder::Str(resize, "mode", "linear");
    Builder::Str(resize, "coordinate_transformation_mode", "half_pixel");
  } else {
    // Resize's sizes: the batch and channels of the images, the model's height and width.
    b.Node("Shape", {"msaflow/raw_nchw"}, "msaflow/raw_shape");
    b.Ints("msaflow/0", {0});
    b.Ints("msaflow/2", {2});
    b.Ints("msaflow/hw", {in.height, in.width});
    b.Node("Slice", {"msaflow/raw_shape", "msaflow/0", "msaflow/2"}, "msaflow/nc");
    Builder::Int(b.Node("Concat", {"msaflow/nc", "msaflow/hw"}, "msaflow/sizes"), "axis", 0);
    auto* resize = b.Node("Resize", {"msaflow/raw_nchw", "", "", "msaflow/sizes"}, "msaflow/resized");
    Builder::Str(resize, "mode", "linear");
    Builder::Str(resize, "coordinate_transformation_mode", "half_pixel");
  }
  std::string v = "msaflow/resized";
  std::set<int64_t> sliced;
  auto channel = [&](int64_t c) {
    std::string name = "msaflow/channel" + std::to_string(c);
    if (!sliced.insert(c).second) return name;  // one slice a channel, however often it is used
    b.Ints(name + "/from", {c});
    b.Ints(name + "/to", {c + 1});
    b.Ints(name + "/axis", {1});
    b.Node("Slice", {v, name + "/from", name + "/to", name + "/axis"}, name);
    return name;
  };
  if (cin == 3 && cout == 1) {  // luma, in prepare's order: (0.299 r + 0.587 g) + 0.114 b
    const float luma[3] = {0.299f, 0.587f, 0.114f};
    std::string part[3];
    for (int64_t c = 0; c < 3; ++c) {
      const std::string k = "msaflow/luma" + std::to_string(c);
      b.Floats(k, {}, &luma[c], 1);
      part[c] = k + "/v";
      b.Node("Mul", {k, channel(c)}, part[c]);
    }
    b.Node("Add", {part[0], part[1]}, "msaflow/luma01");
    b.Node("Add", {"msaflow/luma01", part[2]}, "msaflow/gray");
    v = "msaflow/gray";
  } else if (cin != cout) {  // channel c takes the image's channel min(c, cin - 1)
    std::vector<std::string> parts;
    for (int64_t c = 0; c < cout; ++c) parts.push_back(channel(std::min(c, cin - 1)));
    Builder::Int(b.Node("Concat", parts, "msaflow/channels"), "axis", 1);
    v = "msaflow/channels";
  }
  const PrepareConstants k = MakeConstants(in);
  const auto c = static_cast<size_t>(cout);
  b.Floats("msaflow/k255", {}, &k.k255, 1);
  b.Floats("msaflow/mean", {cout, 1, 1}, k.mean.data(), c);
  b.Floats("msaflow/inv_std", {cout, 1, 1}, k.inv_std.data(), c);
  b.Node("Mul", {v, "msaflow/k255"}, "msaflow/unit");
  b.Node("Sub", {"msaflow/unit", "msaflow/mean"}, "msaflow/centred");
  b.Node("Mul", {"msaflow/centred", "msaflow/inv_std"}, "msaflow/prepared");
  return "msaflow/prepared";
}

// Opset 13, IR 7, msaflow as the producer, the metadata_props given.
void Stamp(onnx::ModelProto& m, const std::map<std::string, std::string>& metadata) {
  m.clear_opset_import();
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(kOpset);
  m.set_ir_version(kIrVersion);
  m.set_producer_name("msaflow");
  m.set_producer_version(kVersion);
  m.clear_metadata_props();
  for (const auto& [k, v] : metadata) {
    auto* p = m.add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
}

// The head on `features` ([N, C, 1, 1]): (x - mean) * inv_std per feature, then its layers
// (kernels/head.h's ParamLayout) up to the logits, "msaflow/head/logits".
void AddHead(Builder& b, const Head& h, const std::string& features) {
  const int64_t in = h.in_dim, classes = h.classes;
  if (in < 1 || classes < 1 || static_cast<int64_t>(h.mean.size()) != in || static_cast<int64_t>(h.inv_std.size()) != in)
    Throw(ErrorKind::kInvalidInput, "export: the head's shape does not match its statistics");
  b.Floats("msaflow/head/mean", {in, 1, 1}, h.mean);  // [C, 1, 1]: what OpenCV's dnn takes per channel
  b.Floats("msaflow/head/inv_std", {in, 1, 1}, h.inv_std);
  b.Node("Sub", {features, "msaflow/head/mean"}, "msaflow/head/centred");
  b.Node("Mul", {"msaflow/head/centred", "msaflow/head/inv_std"}, "msaflow/head/scaled");
  Builder::Int(b.Node("Flatten", {"msaflow/head/scaled"}, "msaflow/head/standardised"), "axis", 1);
  const auto layout = ParamLayout(h.config, in, classes);
  auto block = [&](size_t i) { return h.params.data() + layout[i].offset; };
  if (h.config.type == "mlp") {
    const int64_t hid = h.config.hidden;
    b.Floats("msaflow/head/w1t", {hid, in}, block(0), layout[0].size);
    b.Floats("msaflow/head/b1", {hid}, block(1), layout[1].size);
    // Stored [classes, hidden] for Gemm's transB = 1, the form OpenCV's dnn reads.
    std::vector<float> w2t(layout[2].size);
    for (int64_t r = 0; r < hid; ++r)
      for (int64_t c = 0; c < classes; ++c) w2t[static_cast<size_t>(c * hid + r)] = block(2)[r * classes + c];
    b.Floats("msaflow/head/w2t", {classes, hid}, w2t);
    b.Floats("msaflow/head/b2", {classes}, block(3), layout[3].size);
    Builder::Int(b.Node("Gemm", {"msaflow/head/standardised", "msaflow/head/w1t", "msaflow/head/b1"}, "msaflow/head/z1"),
                 "transB", 1);
    b.Node("Relu", {"msaflow/head/z1"}, "msaflow/head/hidden");
    Builder::Int(b.Node("Gemm", {"msaflow/head/hidden", "msaflow/head/w2t", "msaflow/head/b2"}, "msaflow/head/logits"),
                 "transB", 1);
  } else {
    b.Floats("msaflow/head/wt", {classes, in}, block(0), layout[0].size);
    b.Floats("msaflow/head/b", {classes}, block(1), layout[1].size);
    Builder::Int(b.Node("Gemm", {"msaflow/head/standardised", "msaflow/head/wt", "msaflow/head/b"}, "msaflow/head/logits"),
                 "transB", 1);
  }
}

// The backbone's nodes, moved to opset 13 and reading `feed`, after the graph's nodes so far.
void AddBackbone(onnx::GraphProto* g, const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes,
                 const std::string& backbone_input, const std::string& feed, int64_t opset, const std::string& origin,
                 Builder& b) {
  google::protobuf::RepeatedPtrField<onnx::NodeProto> up;
  onnx::GraphProto renamed;
  *renamed.mutable_node() = nodes;
  *renamed.mutable_initializer() = g->initializer();
  for (auto& n : *renamed.mutable_node())
    for (auto& input : *n.mutable_input())
      if (input == backbone_input) input = feed;
  UpgradeNodes(renamed, opset, origin, b, &up);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> all;
  for (const auto& n : g->node()) *all.Add() = n;
  for (const auto& n : up) *all.Add() = n;
  g->mutable_node()->Swap(&all);
}

}  // namespace

std::string ExportClassifierOnnx(const ClassifierExport& e) {
  const Head& h = e.head;
  const bool pixels = e.backbone_onnx.empty();
  onnx::ModelProto m;
  int64_t opset = kOpset;
  if (!pixels) {
    if (!m.ParseFromString(e.backbone_onnx) || !m.has_graph())
      Throw(ErrorKind::kInvalidInput, e.origin + ": not a valid ONNX model");
    opset = 0;
    for (const auto& op : m.opset_import())
      if (op.domain().empty() || op.domain() == "ai.onnx") opset = op.version();
    if (opset < 7)
      Throw(ErrorKind::kUnsupported, e.origin + ": opset " + std::to_string(opset) +
                                         "; the export carries models of opset 7 or later (numpy broadcasting)");
  }
  Stamp(m, e.metadata);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("msaflow-classifier");
  g->clear_value_info();
  g->clear_output();
  std::set<std::string> inits;
  for (const auto& t : g->initializer()) inits.insert(t.name());
  std::string backbone_input;
  for (const auto& vi : g->input())
    if (!inits.count(vi.name())) backbone_input = vi.name();
  if (!pixels && backbone_input.empty()) Throw(ErrorKind::kInvalidInput, e.origin + ": the model has no input");
  google::protobuf::RepeatedPtrField<onnx::NodeProto> old;
  old.Swap(g->mutable_node());
  g->clear_input();
  Builder b(g);
  const int64_t batch = e.input.batch > 0 ? e.input.batch : kBatchDim;
  const int64_t rows = e.image_rows, cols = e.image_cols, ch = e.image_channels;
  if (e.with_preprocessing && (((pixels || e.uniform_images) && (rows < 1 || cols < 1)) || (ch != 1 && ch != 3)))
    Throw(ErrorKind::kInvalidInput, "export with preprocessing: images of " + std::to_string(rows) + " x " +
                                        std::to_string(cols) + " x " + std::to_string(ch) +
                                        "; expected a size and 1 or 3 channels");
  // Raw pixels resized to the input's size are prepared as a backbone's input is (and are the
  // features then); raw pixels as read are the features as they come.
  const bool resized = pixels && e.input.height > 0;
  const bool as_read = pixels && !resized;
  if (e.with_preprocessing) {
    SetType(g->add_input(), kExportInput, onnx::TensorProto::UINT8,
            {batch, as_read ? rows : kHeightDim, as_read ? cols : kWidthDim, ch});
  } else if (as_read) {
    SetType(g->add_input(), kExportInput, onnx::TensorProto::FLOAT, {batch, rows, cols, ch});
  } else {  // prepared images; resized pixels are of exactly the input's size
    SetType(g->add_input(), kExportInput, onnx::TensorProto::FLOAT,
            {batch, e.input.channels, resized ? e.input.height : kHeightDim, resized ? e.input.width : kWidthDim});
  }
  // The features as [N, C, 1, 1] until they are standardised: per-channel constants are what
  // every runtime broadcasts over a batch (OpenCV's dnn 4.6 does not broadcast [1, C] over N).
  std::string features;
  if (resized) {
    const std::string x = e.with_preprocessing ? Preprocessing(b, e) : kExportInput;
    b.Ints("msaflow/features_shape", {0, h.in_dim, 1, 1});
    b.Node("Reshape", {x, "msaflow/features_shape"}, "msaflow/features");
  } else if (pixels) {
    std::string x = kExportInput;
    if (e.with_preprocessing) {  // prepare: v / 255 in float
      const float k = 255.f;
      b.Floats("msaflow/255", {}, &k, 1);
      Builder::Int(b.Node("Cast", {kExportInput}, "msaflow/raw_float"), "to", onnx::TensorProto::FLOAT);
      b.Node("Div", {"msaflow/raw_float", "msaflow/255"}, "msaflow/unit");
      x = "msaflow/unit";
    }
    b.Ints("msaflow/features_shape", {0, h.in_dim, 1, 1});
    b.Node("Reshape", {x, "msaflow/features_shape"}, "msaflow/features");
  } else {
    const std::string feed = e.with_preprocessing ? Preprocessing(b, e) : kExportInput;
    AddBackbone(g, old, backbone_input, feed, opset, e.origin, b);  // after the preprocessing that feeds it
    b.Node("GlobalAveragePool", {e.cut_tensor}, "msaflow/features");
  }
  features = "msaflow/features";
  if (e.half_features) {  // as the NAM held them: float16, round to nearest even
    Builder::Int(b.Node("Cast", {features}, "msaflow/features_f16"), "to", onnx::TensorProto::FLOAT16);
    Builder::Int(b.Node("Cast", {"msaflow/features_f16"}, "msaflow/features_stored"), "to", onnx::TensorProto::FLOAT);
    features = "msaflow/features_stored";
  }
  AddHead(b, h, features);
  Builder::Int(b.Node("Softmax", {"msaflow/head/logits"}, kExportOutput), "axis", 1);
  SetType(g->add_output(), kExportOutput, onnx::TensorProto::FLOAT, {batch, h.classes});
  std::string out;
  if (!m.SerializeToString(&out)) Throw(ErrorKind::kIo, "export: the model could not be serialised");
  return out;
}

}  // namespace msaflow::kernels
